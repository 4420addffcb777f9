//! nodeup end to end: the real binary, `--root` into a temp dir, assets from a local mirror on
//! 127.0.0.1, a file:// state store.

mod common;

use std::time::{Duration, Instant};

use common::*;
use testkit::mirror::{sha256_hex, Behaviour};

const PAD: usize = 64 * 1024;

fn direct(m: &testkit::mirror::Mirror, a: &testkit::mirror::FakeAsset) -> Vec<String> {
    vec![m.url(&a.path)]
}

#[test]
fn worker_converges_then_reruns_with_no_change() {
    let s = Scenario::new(Group::Worker, PAD, direct);
    let o = s.run(&[]);
    assert_ok(&o);
    let last = last_line(&o);
    assert!(last.starts_with("nodeup: ") && last.ends_with(" changed") && !last.ends_with(" 0 changed"), "{last}");

    // Binaries, from the assets, executable.
    let kubelet = s.assets.iter().find(|a| a.path.ends_with("/kubelet")).expect("kubelet");
    assert_eq!(std::fs::read(s.path("/usr/local/bin/kubelet")).expect("kubelet"), kubelet.bytes);
    for bin in [
        "/usr/local/bin/kubelet",
        "/usr/local/bin/kubectl",
        "/usr/local/bin/ecr-credential-provider",
        "/usr/local/bin/containerd",
        "/usr/local/bin/containerd-shim-runc-v2",
        "/usr/local/bin/ctr",
        "/usr/local/sbin/runc",
        "/opt/cni/bin/bridge",
        "/opt/cni/bin/host-local",
        "/opt/cni/bin/loopback",
        "/opt/cni/bin/portmap",
    ] {
        assert_eq!(mode(&s.path(bin)), 0o755, "{bin}");
        assert!(std::fs::read(s.path(bin)).expect(bin).starts_with(b"#!/bin/sh\n# fake "), "{bin}");
    }
    assert!(!s.path("/opt/cni/bin/LICENSE").exists() || mode(&s.path("/opt/cni/bin/LICENSE")) == 0o755);

    // Configuration files.
    let containerd = std::fs::read_to_string(s.path("/etc/containerd/config.toml")).expect("containerd config");
    assert!(containerd.contains("SystemdCgroup = true"), "{containerd}");
    assert!(containerd.contains("sandbox = \"registry.k8s.io/pause:3.10.1\""), "{containerd}");
    let kubelet_conf = std::fs::read_to_string(s.path("/var/lib/kubelet/kubelet.conf")).expect("kubelet.conf");
    assert!(kubelet_conf.contains("kind: KubeletConfiguration"), "{kubelet_conf}");
    assert!(kubelet_conf.contains("cgroupDriver: systemd"), "{kubelet_conf}");
    let sysconfig = std::fs::read_to_string(s.path("/etc/sysconfig/kubelet")).expect("sysconfig");
    assert!(sysconfig.starts_with("DAEMON_ARGS=\""), "{sysconfig}");
    for f in ["--bootstrap-kubeconfig=/var/lib/kubelet/bootstrap-kubeconfig", "--node-ip=172.20.33.10", "--config=/var/lib/kubelet/kubelet.conf"] {
        assert!(sysconfig.contains(f), "{f} missing: {sysconfig}");
    }
    // The kubelet refuses to start with a role label it may not set on itself.
    assert!(!sysconfig.contains("node-role.kubernetes.io"), "{sysconfig}");
    let boot_kc = s.path("/var/lib/kubelet/bootstrap-kubeconfig");
    assert_eq!(mode(&boot_kc), 0o400);
    let kc = std::fs::read_to_string(&boot_kc).expect("bootstrap kubeconfig");
    let token_secret = std::fs::read(s.dir.path().join("state/secrets/node-bootstrap-token")).expect("token");
    let token = base::pki::parse_secret("t", &token_secret).expect("token");
    assert!(kc.contains(&format!("token: {token}")) && kc.contains("server: https://api.internal.ha.k8s.example.com"), "{kc}");
    assert!(!std::fs::read_to_string(&s.boot).expect("boot").contains(&token), "the token is never in the BootConfig");
    let sysctl = std::fs::read_to_string(s.path("/etc/sysctl.d/99-k8s-general.conf")).expect("sysctl");
    assert!(sysctl.contains("net.ipv4.ip_forward=1") && sysctl.contains("net.ipv4.ip_local_reserved_ports = 30000-32767"));
    assert_eq!(std::fs::read_to_string(s.path("/etc/modules-load.d/k8s.conf")).expect("modules"), "br_netfilter\noverlay\n");
    assert_eq!(mode(&s.path("/etc/kubernetes/manifests")), 0o755);

    // Units enabled offline (the .wants symlinks), not started (recorded).
    for unit in ["containerd.service", "kubelet.service"] {
        let link = s.path(&format!("/etc/systemd/system/multi-user.target.wants/{unit}"));
        assert_eq!(std::fs::read_link(&link).expect("wants link"), std::path::Path::new(&format!("/etc/systemd/system/{unit}")));
        assert!(s.path(&format!("/etc/systemd/system/{unit}")).is_file());
    }
    assert!(!s.path("/etc/systemd/system/protokube.service").exists(), "protokube only on control-plane hosts");
    assert!(!s.path("/etc/systemd/system/cri-containerd-.scope.d").exists(), "containers wait for protokube only on control-plane hosts");
    assert!(stdout(&o).contains("not run (root"), "systemctl recorded, not run: {}", stdout(&o));

    // No temp files left anywhere.
    let files = tree(&s.root);
    assert!(
        files.keys().all(|k| !k.contains(".keelson-tmp-")),
        "temp files left: {:?}",
        files.keys().filter(|k| k.contains(".keelson-tmp-")).collect::<Vec<_>>()
    );

    // Second run: nothing to do, nothing downloaded.
    let before = s.mirror.requests();
    let o = s.run(&[]);
    assert_ok(&o);
    assert!(last_line(&o).ends_with(" 0 changed"), "second run: {}", stdout(&o));
    assert_eq!(s.mirror.requests(), before, "a rerun downloads nothing");
    assert_eq!(tree(&s.root), files, "a rerun changes no file");

    // Dry run on the converged root: nothing would change.
    let o = s.run(&["--target", "dryrun"]);
    assert_ok(&o);
    assert!(last_line(&o).ends_with(" 0 would change"), "{}", stdout(&o));

    // A changed file is put back, and only the services that depend on it restart.
    std::fs::write(s.path("/etc/containerd/config.toml"), "tampered").expect("tamper");
    let o = s.run(&[]);
    assert_ok(&o);
    let out = stdout(&o);
    assert!(out.contains("file:/etc/containerd/config.toml: update contents"), "{out}");
    assert!(out.contains("service:containerd.service: restart"), "{out}");
    assert!(out.contains("service:kubelet.service: restart"), "kubelet depends on containerd: {out}");
    assert!(!out.contains("download:"), "{out}");
    assert_eq!(std::fs::read_to_string(s.path("/etc/containerd/config.toml")).expect("config"), containerd);
}

#[test]
fn dryrun_on_fresh_root_changes_nothing() {
    let s = Scenario::new(Group::Worker, PAD, direct);
    let o = s.run(&["--target", "dryrun"]);
    assert_ok(&o);
    let last = last_line(&o);
    assert!(last.ends_with(" would change") && !last.ends_with(" 0 would change"), "{last}");
    assert!(stdout(&o).contains("would: download:kubelet: download"), "{}", stdout(&o));
    assert!(tree(&s.root).is_empty(), "dry run wrote {:?}", tree(&s.root).keys().collect::<Vec<_>>());
    assert!(std::fs::read_dir(&s.root).expect("root").next().is_none(), "dry run created directories");
    assert_eq!(s.mirror.requests(), 0, "dry run downloads nothing");
}

#[test]
fn a_failed_run_is_run_again_as_often_as_retries_says() {
    // The state store has no encryption secret the config asks for: each run fails the same way.
    let on = |c: String| c.replacen("APIServerConfig:\n", "APIServerConfig:\n  EncryptionConfig: true\n", 1);
    let s = Scenario::edited(Group::ControlPlane, PAD, direct, on);
    // The later flag wins (`args_override_self`): one rerun, 5 s after the first failure.
    let o = s.run(&["--retries", "1"]);
    assert!(!o.status.success(), "converged without the secret: {}", stdout(&o));
    let err = stderr(&o);
    assert_eq!(err.matches("nodeup: run 1 failed; running again in 5 s").count(), 1, "{err}");
    assert!(!err.contains("run 2 failed"), "--retries 1 reruns once: {err}");
    assert_eq!(err.matches("secrets/encryptionconfig").count(), 2, "both runs failed on the missing secret: {err}");
}

#[test]
fn corrupted_mirror_file_is_refused_and_nothing_installed() {
    let s = Scenario::new(Group::Worker, PAD, direct);
    let kubelet = s.assets.iter().find(|a| a.path.ends_with("/kubelet")).expect("kubelet");
    s.mirror.set(&kubelet.path, Behaviour::Corrupt);
    let containerd = s.assets.iter().find(|a| a.path.contains("containerd-")).expect("containerd");
    s.mirror.set(&containerd.path, Behaviour::Corrupt);
    let o = s.run(&["--retry-rounds", "2"]);
    assert!(!o.status.success(), "must fail: {}", stdout(&o));
    let err = stderr(&o);
    assert!(err.contains("sha256 mismatch") && err.contains(&sha256_hex(&kubelet.bytes)), "{err}");
    assert!(err.contains("download:kubelet"), "{err}");
    assert!(!s.path("/usr/local/bin/kubelet").exists(), "corrupt kubelet installed");
    assert!(!s.path("/usr/local/bin/containerd").exists(), "corrupt containerd installed");
    let cache = tree(&s.path("/var/cache/nodeup"));
    assert!(cache.keys().all(|k| !k.contains(&sha256_hex(&kubelet.bytes)) && !k.contains(".keelson-tmp-")), "{:?}", cache.keys());
    assert_eq!(s.mirror.hits(&kubelet.path), 2, "bounded retries: one per round");
    assert!(!s.path("/etc/systemd/system/multi-user.target.wants/kubelet.service").exists(), "kubelet enabled without its binary");
    // Fixed mirror → converges.
    s.mirror.set(&kubelet.path, Behaviour::Serve);
    s.mirror.set(&containerd.path, Behaviour::Serve);
    assert_ok(&s.run(&[]));
    assert!(last_line(&s.run(&[])).ends_with(" 0 changed"));
}

#[test]
fn wrong_nodeup_config_hash_is_refused() {
    let s = Scenario::new(Group::Worker, PAD, direct);
    let boot = std::fs::read_to_string(&s.boot).expect("boot");
    let mut doc: keelson_api::nodeup::BootConfig = serde_yaml_ng::from_str(&boot).expect("yaml");
    doc.nodeup_config_hash = base::nodeup_config_hash(b"something else");
    std::fs::write(&s.boot, serde_yaml_ng::to_string(&doc).expect("yaml")).expect("write");
    let o = s.run(&[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("NodeupConfig hash mismatch"), "{}", stderr(&o));
    assert!(std::fs::read_dir(&s.root).expect("root").next().is_none(), "nothing touched");
    assert_eq!(s.mirror.requests(), 0);
}

#[test]
fn mirror_failover_on_404() {
    let s = Scenario::new(Group::Worker, PAD, |m, a| vec![m.url(&format!("missing/{}", a.path)), m.url(&a.path)]);
    let o = s.run(&[]);
    assert_ok(&o);
    let kubelet = s.assets.iter().find(|a| a.path.ends_with("/kubelet")).expect("kubelet");
    assert_eq!(s.mirror.hits(&format!("missing/{}", kubelet.path)), 1);
    assert_eq!(std::fs::read(s.path("/usr/local/bin/kubelet")).expect("kubelet"), kubelet.bytes);
}

#[test]
fn mirror_failover_when_first_hangs_is_bounded() {
    let s = Scenario::new(Group::Worker, PAD, |m, a| vec![m.url(&format!("hang/{}", a.path)), m.url(&a.path)]);
    for a in &s.assets {
        s.mirror.set(&format!("hang/{}", a.path), Behaviour::Hang);
    }
    let t = Instant::now();
    let o = s.run(&["--http-timeout", "1"]);
    assert_ok(&o);
    // Downloads run concurrently: all hang at once, then fail over.
    assert!(t.elapsed() < Duration::from_secs(8), "took {:?}", t.elapsed());
    let kubelet = s.assets.iter().find(|a| a.path.ends_with("/kubelet")).expect("kubelet");
    assert_eq!(std::fs::read(s.path("/usr/local/bin/kubelet")).expect("kubelet"), kubelet.bytes);
}

/// A worker trusts the CA pinned in its (hash-pinned) NodeupConfig: a CA swapped in the state store
/// by whoever can write it is not the one the node trusts.
#[test]
fn workers_trust_only_the_pinned_cluster_ca() {
    let s = Scenario::new(Group::Worker, PAD, direct);
    let issued = s.dir.path().join("state/pki/issued/kubernetes-ca/keyset.yaml");
    let pinned = base::pki::parse_keyset_cert("kubernetes-ca", &std::fs::read(&issued).expect("issued")).expect("pinned CA");
    let evil = tempfile::tempdir().expect("tempdir");
    base::pki::init_pki(evil.path(), &[]).expect("another PKI");
    std::fs::copy(evil.path().join("pki/issued/kubernetes-ca/keyset.yaml"), &issued).expect("swap the CA in the store");
    assert_ok(&s.run(&[]));
    assert_eq!(std::fs::read_to_string(s.path("/srv/kubernetes/ca.crt")).expect("ca.crt"), pinned);
}

/// Mid CA rotation (`keelson create keypair kubernetes-ca`): a control plane trusts both keys of the
/// keyset — `ca.crt` (client CA of the API server and kubelet, the controller manager's root CA) and
/// every local kubeconfig hold the trust bundle, the primary's certificate first — while everything it
/// issues, and the controller manager's signing CA, is the primary's alone.
#[test]
fn control_planes_mid_rotation_trust_every_key_and_sign_with_the_primary() {
    use base64::Engine as _;
    let s = Scenario::new(Group::ControlPlane, PAD, direct);
    let private = s.dir.path().join("state/pki/private/kubernetes-ca/keyset.yaml");
    let mut keyset = base::keyset::Keyset::parse("kubernetes-ca", &std::fs::read(&private).expect("private keyset")).expect("keyset");
    let primary = keyset.primary().cert_pem.clone();
    let new = base::pki::create_ca("kubernetes-ca").expect("new CA key");
    let id = format!("{}9", keyset.primary_id);
    keyset.add(base::keyset::KeysetKey { id, cert_pem: new.cert_pem.clone(), key_pem: Some(new.key_pem), distrust_timestamp: None }, false).expect("add");
    std::fs::write(&private, keyset.to_yaml(true).expect("yaml")).expect("write keyset");
    assert_ok(&s.run(&[]));
    let bundle = format!("{}\n{}\n", primary.trim_end(), new.cert_pem.trim_end());
    assert_eq!(std::fs::read_to_string(s.path("/srv/kubernetes/ca.crt")).expect("ca.crt"), bundle, "both keys, the primary first");
    for kc in
        ["/var/lib/kubelet/kubeconfig", "/var/lib/kube-controller-manager/kubeconfig", "/var/lib/kube-scheduler/kubeconfig", "/var/lib/kube-proxy/kubeconfig"]
    {
        let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(s.path(kc)).expect(kc)).expect("yaml");
        let data = doc["clusters"][0]["cluster"]["certificate-authority-data"].as_str().expect("certificate-authority-data");
        let pem = String::from_utf8(base64::engine::general_purpose::STANDARD.decode(data).expect("base64")).expect("utf-8");
        assert_eq!(pem, bundle, "{kc} trusts both keys");
    }
    assert_eq!(
        std::fs::read_to_string(s.path("/srv/kubernetes/kube-controller-manager/ca.crt")).expect("kcm ca"),
        primary,
        "the controller manager signs with the primary"
    );
    // The serving certificate chains to the primary (and not to the new key).
    let server = s.path("/srv/kubernetes/kube-apiserver/server.crt");
    let only = |pem: &str| {
        let f = s.dir.path().join("one-ca.crt");
        std::fs::write(&f, pem).expect("write");
        std::process::Command::new("openssl")
            .args(["verify", "-CAfile"])
            .arg(&f)
            .arg(&server)
            .output()
            .expect("openssl (scripts/test installs it)")
            .status
            .success()
    };
    assert!(only(&primary), "the API server's certificate is the primary's");
    assert!(!only(&new.cert_pem), "the new key signed nothing yet");
}

/// Workers joining by cloud identity: the API servers accept no bootstrap token at all.
#[test]
fn control_planes_of_a_cloud_identity_cluster_accept_no_bootstrap_token() {
    let s = Scenario::edited(Group::ControlPlane, PAD, direct, |c| {
        assert!(!c.contains("NodeBootstrap:"), "the fixture already says how workers join");
        format!("{c}NodeBootstrap:\n  Method: CloudIdentity\n  Server: https://kops-controller.internal.ha.k8s.example.com:3988\n")
    });
    assert_ok(&s.run(&[]));
    let api = std::fs::read_to_string(s.path("/etc/kubernetes/manifests/kube-apiserver.manifest")).expect("apiserver");
    assert!(!api.contains("--enable-bootstrap-token-auth"), "{api}");
    assert!(!api.contains("--token-auth-file"), "{api}");
    assert!(!s.path("/srv/kubernetes/kube-apiserver/known_tokens.csv").exists());
}

/// Token mode: a worker takes only a bootstrap token the control planes minted (it carries its
/// expiration) and still valid; before one is published it waits, within a bound, then fails
/// saying why and where to look.
#[test]
fn workers_wait_for_a_valid_bootstrap_token_then_fail_clearly() {
    let s = Scenario::new(Group::Worker, PAD, direct);
    let key = s.dir.path().join("state/secrets/node-bootstrap-token");
    let token = "abcdef.0123456789abcdef";
    let expired =
        base::bootstrap_token::Published { token: token.parse().expect("token"), expires: std::time::SystemTime::now() - std::time::Duration::from_secs(60) };
    for (what, doc, why) in [
        ("an older release's static token", Some(base::pki::secret_json(token)), "no Expiration"),
        ("an expired token", Some(expired.to_json()), "expires at"),
        ("no token yet", None, "none published yet"),
    ] {
        match &doc {
            Some(d) => std::fs::write(&key, d).expect("write token"),
            None => std::fs::remove_file(&key).expect("remove token"),
        }
        let t = std::time::Instant::now();
        let o = s.run(&["--bootstrap-token-wait", "2"]);
        assert!(!o.status.success(), "{what}: nodeup succeeded");
        let err = stderr(&o);
        assert!(err.contains("no valid bootstrap token after waiting 2s") && err.contains(why) && err.contains("protokube"), "{what}: {err}");
        assert!(t.elapsed() >= std::time::Duration::from_secs(2) && t.elapsed() < std::time::Duration::from_secs(60), "{what}: waited {:?}", t.elapsed());
        assert!(!s.path("/var/lib/kubelet/bootstrap-kubeconfig").exists(), "{what}: a bootstrap kubeconfig was written");
    }
    // Published while the worker waits: it takes it.
    let valid = base::bootstrap_token::Published {
        token: token.parse().expect("token"),
        expires: std::time::SystemTime::now() + std::time::Duration::from_secs(24 * 3600),
    };
    let child = s.command(&["--bootstrap-token-wait", "60"]).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().expect("spawn");
    std::thread::sleep(std::time::Duration::from_secs(2));
    std::fs::write(&key, valid.to_json()).expect("publish");
    let o = child.wait_with_output().expect("nodeup");
    assert_ok(&o);
    let kc = std::fs::read_to_string(s.path("/var/lib/kubelet/bootstrap-kubeconfig")).expect("bootstrap kubeconfig");
    assert!(kc.contains(&format!("token: {token}")), "{kc}");
}

#[test]
fn control_plane_host() {
    let s = Scenario::new(Group::ControlPlane, PAD, direct);
    let o = s.run(&[]);
    assert_ok(&o);
    for m in ["kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy"] {
        let p = s.path(&format!("/etc/kubernetes/manifests/{m}.manifest"));
        let body = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{m}: {e}"));
        assert!(body.contains("kind: Pod") && body.contains(&format!("name: {m}")), "{body}");
    }
    let api = std::fs::read_to_string(s.path("/etc/kubernetes/manifests/kube-apiserver.manifest")).expect("apiserver");
    for f in [
        "--etcd-servers=https://127.0.0.1:4001",
        "--etcd-servers-overrides=/events#https://127.0.0.1:4002",
        "--enable-admission-plugins=DefaultStorageClass,DefaultTolerationSeconds,LimitRanger",
        "--service-account-issuer=https://api.internal.ha.k8s.example.com",
        "--client-ca-file=/srv/kubernetes/ca.crt",
        "--tls-cert-file=/srv/kubernetes/kube-apiserver/server.crt",
        "--etcd-cafile=/srv/kubernetes/kube-apiserver/etcd-ca.crt",
        "--service-account-key-file=/srv/kubernetes/kube-apiserver/service-account.pub",
        "--advertise-address=172.20.33.10",
        "--secure-port=443",
        "--enable-bootstrap-token-auth=true",
        "--v=2",
    ] {
        assert!(api.contains(f), "{f} missing from kube-apiserver manifest");
    }
    for key in [
        "/srv/kubernetes/kube-apiserver/server.key",
        "/srv/kubernetes/kube-apiserver/etcd-client.key",
        "/srv/kubernetes/kube-apiserver/kubelet-api.key",
        "/srv/kubernetes/kube-apiserver/apiserver-aggregator.key",
        "/srv/kubernetes/kube-apiserver/service-account.key",
        "/srv/kubernetes/kube-controller-manager/ca.key",
        "/srv/kubernetes/kubelet-server.key",
        "/var/lib/kubelet/kubelet-client.pem",
    ] {
        assert_eq!(mode(&s.path(key)), 0o600, "{key}");
        assert!(std::fs::read_to_string(s.path(key)).expect(key).contains("PRIVATE KEY"), "{key}");
    }
    // Token mode: bootstrap tokens are Secrets that expire (protokube rotates them), never a
    // static token file; kube-controller-manager deletes the expired ones.
    assert!(!api.contains("--token-auth-file"), "{api}");
    assert!(!s.path("/srv/kubernetes/kube-apiserver/known_tokens.csv").exists());
    let kcm = std::fs::read_to_string(s.path("/etc/kubernetes/manifests/kube-controller-manager.manifest")).expect("kcm");
    assert!(kcm.contains("--controllers=*,tokencleaner"), "{kcm}");
    for kc in
        ["/var/lib/kubelet/kubeconfig", "/var/lib/kube-controller-manager/kubeconfig", "/var/lib/kube-scheduler/kubeconfig", "/var/lib/kube-proxy/kubeconfig"]
    {
        assert_eq!(mode(&s.path(kc)), 0o400, "{kc}");
    }
    // The kubelet's kubeconfig names its certificate file (which the kubelet reads again by
    // itself: a renewal needs no restart); the file holds the node's certificate, then its key.
    let kubelet_kc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(s.path("/var/lib/kubelet/kubeconfig")).expect("kc")).expect("yaml");
    assert_eq!(kubelet_kc["users"][0]["user"]["client-certificate"].as_str(), Some("/var/lib/kubelet/kubelet-client.pem"));
    assert_eq!(kubelet_kc["users"][0]["user"]["client-key"].as_str(), Some("/var/lib/kubelet/kubelet-client.pem"));
    assert!(kubelet_kc["users"][0]["user"].get("client-certificate-data").is_none());
    let client = std::fs::read_to_string(s.path("/var/lib/kubelet/kubelet-client.pem")).expect("pem");
    assert!(client.starts_with("-----BEGIN CERTIFICATE-----"), "{}", &client[..40]);
    assert!(base::pki::describe_cert(&client).expect("cert").cn.starts_with("system:node:"));
    assert!(std::fs::read_to_string(s.path("/var/lib/kube-scheduler/config.yaml")).expect("scheduler config").contains("KubeSchedulerConfiguration"));
    for unit in ["containerd.service", "kubelet.service", "protokube.service"] {
        assert!(s.path(&format!("/etc/systemd/system/multi-user.target.wants/{unit}")).is_symlink(), "{unit}");
    }
    // At shutdown the containers (etcd, kube-apiserver) stop after protokube, which ends them in order.
    let drop_in = std::fs::read_to_string(s.path("/etc/systemd/system/cri-containerd-.scope.d/50-keelson-stop-after-protokube.conf")).expect("scope drop-in");
    assert!(drop_in.contains("\n[Unit]\nBefore=protokube.service\n"), "{drop_in}");
    // No key material in the output.
    assert!(!stdout(&o).contains("PRIVATE KEY") && !stderr(&o).contains("PRIVATE KEY"));
    // Certificates verify against the CAs in the state store (openssl is installed by scripts/test).
    let ca = s.path("/srv/kubernetes/ca.crt");
    let server = s.path("/srv/kubernetes/kube-apiserver/server.crt");
    let v = std::process::Command::new("openssl")
        .args(["verify", "-CAfile"])
        .arg(&ca)
        .arg(&server)
        .output()
        .expect("openssl is required for this test (scripts/test installs it)");
    assert!(v.status.success(), "openssl verify: {}{}", String::from_utf8_lossy(&v.stdout), String::from_utf8_lossy(&v.stderr));
    let text = std::process::Command::new("openssl").args(["x509", "-noout", "-text", "-in"]).arg(&server).output().expect("openssl");
    let text = String::from_utf8_lossy(&text.stdout);
    for san in ["DNS:api.internal.ha.k8s.example.com", "DNS:kubernetes.default.svc.cluster.local", "IP Address:100.64.0.1", "IP Address:172.20.33.10"] {
        assert!(text.contains(san), "{san} missing: {text}");
    }
    // Rerun: converged, certificates not reissued.
    let cert_before = std::fs::read(&server).expect("cert");
    let o = s.run(&[]);
    assert_ok(&o);
    assert!(last_line(&o).ends_with(" 0 changed"), "{}", stdout(&o));
    assert_eq!(std::fs::read(&server).expect("cert"), cert_before);
}

#[test]
fn facts_come_from_imds_when_no_flag_gives_them() {
    let s = Scenario::new(Group::Worker, PAD, direct);
    let imds = testkit::imds::ImdsServer::start(&[
        ("instance-id", "i-0123"),
        ("placement/availability-zone", "eu-west-1b"),
        ("placement/region", "eu-west-1"),
        ("local-ipv4", "172.20.70.7"),
        ("local-hostname", "ip-172-20-70-7.eu-west-1.compute.internal"),
    ]);
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_nodeup"))
        .arg("--conf")
        .arg(&s.boot)
        .arg("--root")
        .arg(&s.root)
        .args(["--arch", "amd64", "--imds-url", &imds.url, "--retries", "0"])
        .output()
        .expect("run");
    assert_ok(&o);
    let sysconfig = std::fs::read_to_string(s.path("/etc/sysconfig/kubelet")).expect("sysconfig");
    assert!(sysconfig.contains("--node-ip=172.20.70.7"), "{sysconfig}");
    assert!(sysconfig.contains("--hostname-override=ip-172-20-70-7.eu-west-1.compute.internal"), "{sysconfig}");
    assert!(imds.faults().tokens_issued >= 1, "IMDSv2: a session token was used");
}

#[test]
fn apiserver_healthcheck_manifest_from_state_store_enables_the_probe() {
    let s = Scenario::new(Group::ControlPlane, PAD, direct);
    let sidecar = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: kube-apiserver-healthcheck\n";
    let p = s.dir.path().join("state/manifests/static/kube-apiserver-healthcheck.yaml");
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(&p, sidecar).expect("write");
    assert_ok(&s.run(&[]));
    assert_eq!(std::fs::read_to_string(s.path("/etc/kubernetes/manifests/kube-apiserver-healthcheck.manifest")).expect("sidecar"), sidecar);
    let api = std::fs::read_to_string(s.path("/etc/kubernetes/manifests/kube-apiserver.manifest")).expect("apiserver");
    assert!(api.contains("livenessProbe:") && api.contains("port: 3990"), "{api}");
}

#[test]
fn hooks_become_enabled_units_run_once_and_disabled_ones_are_switched_off() {
    let hooks = concat!(
        "Hooks:\n",
        "- - name: ig-tune\n",
        "    manifest: |\n",
        "      Type=oneshot\n",
        "      ExecStart=/bin/sh -c 'echo tuned'\n",
        "- - execContainer:\n",
        "      image: busybox:1.36\n",
        "      command: [sh, -c, \"true\"]\n",
        "  - name: ig-tune\n",
        "    manifest: \"ExecStart=/bin/false\"\n",
        "  - name: old-hook\n",
        "    disabled: true\n",
    );
    let s = Scenario::edited(Group::Worker, PAD, direct, |c| c.replace("Hooks:\n- null\n- null\n", hooks));
    // A unit a previous version of the spec enabled.
    let wants = s.path("/etc/systemd/system/multi-user.target.wants");
    std::fs::create_dir_all(&wants).expect("mkdir");
    std::os::unix::fs::symlink("/etc/systemd/system/old-hook.service", wants.join("old-hook.service")).expect("old link");

    let o = s.run(&[]);
    assert_ok(&o);
    let ig = std::fs::read_to_string(s.path("/etc/systemd/system/ig-tune.service")).expect("group hook unit");
    assert_eq!(ig, "[Unit]\nDescription=Kops Hook ig-tune\n\n[Service]\nType=oneshot\nExecStart=/bin/sh -c 'echo tuned'\n");
    let exec = std::fs::read_to_string(s.path("/etc/systemd/system/kops-hook-0.service")).expect("cluster hook unit");
    assert!(exec.contains("ExecStartPre=/usr/bin/ctr --namespace k8s.io image pull docker.io/library/busybox:1.36"), "{exec}");
    assert!(exec.contains("Requires=containerd.service"), "{exec}");
    for unit in ["ig-tune.service", "kops-hook-0.service"] {
        assert_eq!(std::fs::read_link(wants.join(unit)).expect("enabled"), std::path::Path::new(&format!("/etc/systemd/system/{unit}")));
    }
    assert!(std::fs::symlink_metadata(wants.join("old-hook.service")).is_err(), "disabled hook switched off");
    let out = stdout(&o);
    assert!(out.contains("service:kops-hook-0.service"), "{out}");

    // Hooks run once: a rerun (their oneshot units now inactive) changes nothing.
    let o = s.run(&[]);
    assert_ok(&o);
    assert!(last_line(&o).ends_with(" 0 changed"), "{}", stdout(&o));
}

/// `APIServerConfig.EncryptionConfig` (compiled from `spec.encryptionConfig: true`): the state
/// store's `secrets/encryptionconfig` lands 0600 at the flag's path inside the API server's
/// read-only mount, with automatic reload; without the switch, neither flag nor file. A missing
/// secret is refused by name; a user's path outside that mount gets its own read-only mount.
#[test]
fn encryption_config_from_the_state_store_0600_and_the_flag_exactly_when_on() {
    const PATH: &str = "/srv/kubernetes/kube-apiserver/encryptionconfig.yaml";
    let manifest = |s: &Scenario| std::fs::read_to_string(s.path("/etc/kubernetes/manifests/kube-apiserver.manifest")).expect("apiserver");
    // Read-only mounts of the manifest: (host path, mount path).
    let read_only_mounts = |body: &str| -> Vec<(String, String)> {
        let pod: serde_yaml_ng::Value = serde_yaml_ng::from_str(body).expect("manifest yaml");
        let host: std::collections::BTreeMap<String, String> = pod["spec"]["volumes"]
            .as_sequence()
            .expect("volumes")
            .iter()
            .filter_map(|v| Some((v["name"].as_str()?.to_string(), v["hostPath"]["path"].as_str()?.to_string())))
            .collect();
        pod["spec"]["containers"][0]["volumeMounts"]
            .as_sequence()
            .expect("mounts")
            .iter()
            .filter(|m| m["readOnly"].as_bool() == Some(true))
            .filter_map(|m| Some((host.get(m["name"].as_str()?)?.clone(), m["mountPath"].as_str()?.to_string())))
            .collect()
    };
    let covered = |mounts: &[(String, String)], path: &str| {
        mounts.iter().any(|(h, m)| h == m && (path == h || path.starts_with(&format!("{}/", h.trim_end_matches('/')))))
    };

    // Off (the fixture): no flag, no file.
    let off = Scenario::new(Group::ControlPlane, PAD, direct);
    assert_ok(&off.run(&[]));
    assert!(!manifest(&off).contains("--encryption-provider-config"), "{}", manifest(&off));
    assert!(!off.path(PATH).exists());

    // On, but the state store has no secret: refused, naming it.
    let on = |c: String| c.replacen("APIServerConfig:\n", "APIServerConfig:\n  EncryptionConfig: true\n", 1);
    let s = Scenario::edited(Group::ControlPlane, PAD, direct, on);
    let o = s.run(&[]);
    assert!(!o.status.success(), "converged without the secret: {}", stdout(&o));
    assert!(stderr(&o).contains("secrets/encryptionconfig") && stderr(&o).contains("missing"), "{}", stderr(&o));
    assert!(!s.path("/etc/kubernetes/manifests/kube-apiserver.manifest").exists());

    // On, with the secret apply creates: the file is the secret's configuration, 0600.
    let state = s.dir.path().join("state");
    assert!(base::encryption::ensure(&state).expect("create the secret"));
    let secret = std::fs::read(state.join("secrets/encryptionconfig")).expect("secret");
    let want = base::encryption::from_secret(&secret).expect("valid");
    let key = base::encryption::parse("t", &want).expect("parse").resources[0].providers[0].secretbox.clone().expect("secretbox").keys[0].secret.clone();
    let o = s.run(&[]);
    assert_ok(&o);
    assert_eq!(std::fs::read_to_string(s.path(PATH)).expect("encryption config"), want);
    assert_eq!(mode(&s.path(PATH)), 0o600);
    let api = manifest(&s);
    assert!(api.contains(&format!("--encryption-provider-config={PATH}")), "{api}");
    assert!(api.contains("--encryption-provider-config-automatic-reload=true"), "{api}");
    assert!(covered(&read_only_mounts(&api), PATH), "{PATH} is not in a read-only hostPath mount: {api}");
    for out in [stdout(&o), stderr(&o)] {
        assert!(!out.contains(&key), "the key is in nodeup's output");
    }
    let o = s.run(&[]);
    assert_ok(&o);
    assert!(last_line(&o).ends_with(" 0 changed"), "{}", stdout(&o));

    // The user's own path (spec.kubeAPIServer.encryptionProviderConfig) wins and is mounted.
    let custom = "/etc/kubernetes/encryption/config.yaml";
    let s = Scenario::edited(Group::ControlPlane, PAD, direct, |c| {
        on(c).replacen("  KubeAPIServer:\n", &format!("  KubeAPIServer:\n    encryptionProviderConfig: {custom}\n"), 1)
    });
    assert!(base::encryption::ensure(&s.dir.path().join("state")).expect("create the secret"));
    assert_ok(&s.run(&[]));
    assert_eq!(mode(&s.path(custom)), 0o600);
    assert!(!s.path(PATH).exists());
    let api = manifest(&s);
    assert!(api.contains(&format!("--encryption-provider-config={custom}")), "{api}");
    assert!(covered(&read_only_mounts(&api), custom), "{custom} is not mounted read-only: {api}");
}
