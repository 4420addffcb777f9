//! The certificate renewal pass on a temp root with a file state store: a certificate in the last
//! third of its life is reissued from its CA with the same subject, names and usage, a new key and
//! serial, the files' modes kept, and its component told; a fresh one is left alone.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::{Duration, SystemTime};

use base::pki::{self, CertSpec, Keypair, Usage};
use protokube::certs::{self, Material, Reload, Renewer};

const DAY: Duration = Duration::from_secs(86400);

fn write(root: &Path, host_path: &str, body: &str, mode: u32) {
    base::fs::write_atomic(&root.join(host_path.trim_start_matches('/')), body.as_bytes(), mode, None).expect("write");
}

fn ca(state: &Path, name: &str) -> Keypair {
    let bytes = std::fs::read(state.join(format!("pki/private/{name}/keyset.yaml"))).expect("keyset");
    pki::parse_private_keyset(name, &bytes).expect("parse")
}

fn mode(root: &Path, host_path: &str) -> u32 {
    std::fs::metadata(root.join(host_path.trim_start_matches('/'))).expect("stat").permissions().mode() & 0o777
}

fn read(root: &Path, host_path: &str) -> String {
    std::fs::read_to_string(root.join(host_path.trim_start_matches('/'))).expect("read")
}

/// The public key (DER) a certificate is for, and the one a private key has.
fn cert_key(cert_pem: &str) -> Vec<u8> {
    let der = pem::parse(cert_pem).expect("pem");
    let (_, cert) = x509_parser::parse_x509_certificate(der.contents()).expect("x509");
    cert.public_key().raw.to_vec()
}

fn private_key(key_pem: &str) -> Vec<u8> {
    rcgen::KeyPair::from_pem(key_pem).expect("key").public_key_der()
}

#[tokio::test]
async fn renews_what_is_due_keeps_what_is_fresh_and_tells_the_component() {
    let state = tempfile::tempdir().expect("state");
    let root = tempfile::tempdir().expect("root");
    let (state, root) = (state.path(), root.path());
    pki::init_pki(state, &["main".into()]).expect("pki");
    let peers = ca(state, "etcd-peers-ca-main");
    let clients = ca(state, "etcd-clients-ca");
    let kube = ca(state, "kubernetes-ca");

    // etcd's peer and client certificates, 455 days (due after ~303 days).
    let dir = "/etc/kubernetes/pki/etcd/main";
    let peer_spec = CertSpec {
        cn: "etcd-a".into(),
        orgs: vec![],
        dns: vec!["etcd-a.internal.example.com".into()],
        ips: vec!["10.0.1.5".parse().expect("ip")],
        usage: Usage::ClientServer,
    };
    let peer = pki::issue("etcd-peers-ca-main", &peers, &peer_spec).expect("peer");
    write(root, &format!("{dir}/peer.crt"), &peer.cert_pem, 0o644);
    write(root, &format!("{dir}/peer.key"), &peer.key_pem, 0o600);
    let client = pki::issue("etcd-clients-ca", &clients, &CertSpec::client("protokube", &[])).expect("client");
    write(root, &format!("{dir}/client.crt"), &client.cert_pem, 0o644);
    write(root, &format!("{dir}/client.key"), &client.key_pem, 0o600);
    // The scheduler's kubeconfig: ten years, fresh at the checked moment.
    let sched_spec = CertSpec::client("system:kube-scheduler", &[]);
    let sched = pki::issue_for("kubernetes-ca", &kube, &sched_spec, 3650 * DAY).expect("sched");
    let kc = nodeup::render::kubelet::kubeconfig(
        "https://127.0.0.1",
        &kube.cert_pem,
        "system:kube-scheduler",
        nodeup::render::kubelet::UserEntry {
            client_certificate_data: Some(sched.cert_pem.clone()),
            client_key_data: Some(sched.key_pem.clone()),
            ..Default::default()
        },
    )
    .expect("kubeconfig");
    write(root, "/var/lib/kube-scheduler/kubeconfig", &kc, 0o400);
    // The controller manager's kubeconfig: 455 days, due; its static pod is restarted.
    let kcm_spec = CertSpec::client("system:kube-controller-manager", &[]);
    let kcm = pki::issue("kubernetes-ca", &kube, &kcm_spec).expect("kcm");
    let kcm_kc = nodeup::render::kubelet::kubeconfig(
        "https://127.0.0.1",
        &kube.cert_pem,
        "system:kube-controller-manager",
        nodeup::render::kubelet::UserEntry {
            client_certificate_data: Some(kcm.cert_pem.clone()),
            client_key_data: Some(kcm.key_pem.clone()),
            ..Default::default()
        },
    )
    .expect("kubeconfig");
    write(root, "/var/lib/kube-controller-manager/kubeconfig", &kcm_kc, 0o400);
    let manifest = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: kube-controller-manager\n  namespace: kube-system\nspec:\n  hostNetwork: true\n";
    write(root, "/etc/kubernetes/manifests/kube-controller-manager.manifest", manifest, 0o644);
    let sched_manifest = manifest.replace("kube-controller-manager", "kube-scheduler");
    write(root, "/etc/kubernetes/manifests/kube-scheduler.manifest", &sched_manifest, 0o644);
    // The kubelet's serving certificate: due; this kubelet does not reload it (before 1.31), so it
    // is restarted — only recorded (not a live root).
    let kubelet_spec = CertSpec { cn: "system:node:ip-10-0-1-5".into(), orgs: vec![], dns: vec!["ip-10-0-1-5".into()], ips: vec![], usage: Usage::Server };
    let kubelet = pki::issue("kubernetes-ca", &kube, &kubelet_spec).expect("kubelet");
    write(root, "/srv/kubernetes/kubelet-server.crt", &kubelet.cert_pem, 0o644);
    write(root, "/srv/kubernetes/kubelet-server.key", &kubelet.key_pem, 0o600);

    let store = base::StateStore::open(&format!("file://{}", state.display()).parse().expect("base"), Duration::from_secs(5)).expect("store");
    let renewer = Renewer {
        root: root.to_path_buf(),
        store,
        host: "i-0123456789abcdef0".into(),
        bundles: certs::control_plane_bundles(&["main".into()], false),
        manifests_dir: "/etc/kubernetes/manifests".into(),
        api_server_restart: None,
    };

    // Now: everything fresh, nothing renewed, every present certificate reported.
    let now = renewer.pass(SystemTime::now()).await;
    assert!(now.renewed.is_empty() && now.failed.is_empty(), "{:?} {:?}", now.renewed, now.failed);
    let names: Vec<&str> = now.certs.keys().map(String::as_str).collect();
    assert_eq!(names, ["etcd-main/client", "etcd-main/peer", "kube-controller-manager/kubeconfig", "kube-scheduler/kubeconfig", "kubelet/server"]);
    assert_eq!(read(root, &format!("{dir}/peer.crt")), peer.cert_pem);
    // The earliest renewal is due within the last third of 455 days (less up to a tenth of skew).
    let due = now.next_due().expect("due").duration_since(SystemTime::now()).expect("future");
    assert!(due > 455 * DAY * 2 / 3 - DAY && due < 455 * DAY * 2 / 3 + 46 * DAY, "{due:?}");

    // 400 days on: the 455-day certificates are due, the ten-year one is not.
    let later = SystemTime::now() + 400 * DAY;
    let r = renewer.pass(later).await;
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    assert_eq!(r.renewed, ["etcd-main", "kube-controller-manager", "kubelet"]);
    assert_eq!(r.recorded, ["systemctl restart kubelet.service"]);

    // etcd peer: same spec, same issuer, a new key and serial, valid from now, modes kept.
    let new_peer = read(root, &format!("{dir}/peer.crt"));
    let new_peer_key = read(root, &format!("{dir}/peer.key"));
    assert_ne!(new_peer, peer.cert_pem);
    assert_eq!(pki::spec_of(&new_peer).expect("spec"), peer_spec);
    let (old, new) = (pki::describe_cert(&peer.cert_pem).expect("old"), pki::describe_cert(&new_peer).expect("new"));
    assert_eq!(new.issuer_cn, "etcd-peers-ca-main");
    assert_ne!(old.serial, new.serial);
    assert!(new.not_after >= old.not_after);
    assert_eq!(cert_key(&new_peer), private_key(&new_peer_key), "the key file is the certificate's key");
    assert_ne!(new_peer_key, peer.key_pem);
    assert_eq!((mode(root, &format!("{dir}/peer.crt")), mode(root, &format!("{dir}/peer.key"))), (0o644, 0o600));
    assert_eq!(pki::spec_of(&read(root, &format!("{dir}/client.crt"))).expect("client"), CertSpec::client("protokube", &[]));
    assert_eq!(r.certs["etcd-main/peer"].serial, new.serial);
    // The kubelet's serving certificate keeps its usage (server only).
    assert_eq!(pki::spec_of(&read(root, "/srv/kubernetes/kubelet-server.crt")).expect("kubelet"), kubelet_spec);

    // The controller manager's kubeconfig: new certificate for the same user, the rest as it was.
    let kc_now = read(root, "/var/lib/kube-controller-manager/kubeconfig");
    let cert = certs::kubeconfig_cert(&kc_now).expect("cert");
    assert_ne!(cert, kcm.cert_pem);
    assert_eq!(pki::spec_of(&cert).expect("spec"), kcm_spec);
    assert_eq!(mode(root, "/var/lib/kube-controller-manager/kubeconfig"), 0o400);
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&kc_now).expect("yaml");
    assert_eq!(doc["clusters"][0]["cluster"]["server"].as_str(), Some("https://127.0.0.1"));
    use base64::Engine as _;
    let key = base64::engine::general_purpose::STANDARD.decode(doc["users"][0]["user"]["client-key-data"].as_str().expect("key")).expect("b64");
    assert_eq!(cert_key(&cert), private_key(&String::from_utf8(key).expect("utf8")));
    // …and its static pod was annotated with the new serial; the scheduler's was not touched.
    let m: serde_yaml_ng::Value = serde_yaml_ng::from_str(&read(root, "/etc/kubernetes/manifests/kube-controller-manager.manifest")).expect("yaml");
    assert_eq!(m["metadata"]["annotations"][certs::RENEWED_ANNOTATION].as_str(), Some(pki::describe_cert(&cert).expect("d").serial.as_str()));
    assert_eq!(read(root, "/etc/kubernetes/manifests/kube-scheduler.manifest"), sched_manifest);
    assert_eq!(read(root, "/var/lib/kube-scheduler/kubeconfig"), kc);

    // Run again: the renewed certificates are fresh, nothing more happens.
    let again = renewer.pass(SystemTime::now()).await;
    assert!(again.renewed.is_empty(), "{:?}", again.renewed);
}

#[tokio::test]
async fn a_missing_ca_fails_its_bundle_only_and_changes_nothing() {
    let state = tempfile::tempdir().expect("state");
    let root = tempfile::tempdir().expect("root");
    let (state, root) = (state.path(), root.path());
    pki::init_pki(state, &["main".into()]).expect("pki");
    // A certificate from a CA the store does not have.
    let stranger = pki::create_ca("etcd-peers-ca-gone").expect("ca");
    let peer = pki::issue("etcd-peers-ca-gone", &stranger, &CertSpec::client("etcd-a", &[])).expect("peer");
    write(root, "/etc/kubernetes/pki/etcd/main/peer.crt", &peer.cert_pem, 0o644);
    write(root, "/etc/kubernetes/pki/etcd/main/peer.key", &peer.key_pem, 0o600);
    let kube = ca(state, "kubernetes-ca");
    let server = pki::issue(
        "kubernetes-ca",
        &kube,
        &CertSpec { cn: "kubernetes-master".into(), orgs: vec![], dns: vec!["kubernetes".into()], ips: vec![], usage: Usage::Server },
    )
    .expect("server");
    write(root, "/srv/kubernetes/kube-apiserver/server.crt", &server.cert_pem, 0o644);
    write(root, "/srv/kubernetes/kube-apiserver/server.key", &server.key_pem, 0o600);
    let store = base::StateStore::open(&format!("file://{}", state.display()).parse().expect("base"), Duration::from_secs(5)).expect("store");
    let renewer = Renewer {
        root: root.to_path_buf(),
        store,
        host: "i-1".into(),
        bundles: vec![
            certs::Bundle {
                name: "etcd-main".into(),
                certs: vec![("peer", Material::Pair("/etc/kubernetes/pki/etcd/main/peer".into()))],
                reload: Reload::Itself,
            },
            certs::Bundle {
                name: "kube-apiserver".into(),
                certs: vec![("server", Material::Pair("/srv/kubernetes/kube-apiserver/server".into()))],
                reload: Reload::StaticPod("kube-apiserver"),
            },
        ],
        manifests_dir: "/etc/kubernetes/manifests".into(),
        api_server_restart: None,
    };
    let r = renewer.pass(SystemTime::now() + 400 * DAY).await;
    assert_eq!(r.renewed, ["kube-apiserver"], "the other bundle still renews");
    assert_eq!(r.failed.len(), 1);
    let (bundle, err) = &r.failed[0];
    assert_eq!(bundle, "etcd-main");
    assert!(err.to_string().contains("etcd-peers-ca-gone") && err.to_string().contains("missing"), "{err}");
    assert_eq!(read(root, "/etc/kubernetes/pki/etcd/main/peer.crt"), peer.cert_pem, "nothing written for the failed bundle");
    assert_eq!(read(root, "/etc/kubernetes/pki/etcd/main/peer.key"), peer.key_pem);
}

/// The kubelet's certificates as nodeup writes them: the client certificate and key in one PEM
/// file that its kubeconfig names, and the serving pair. Returns the kubeconfig's text.
fn kubelet_files(root: &Path, kube: &Keypair, life: Duration) -> String {
    let client = pki::issue_for("kubernetes-ca", kube, &CertSpec::client("system:node:ip-10-0-1-5", &["system:nodes"]), life).expect("client");
    write(root, "/var/lib/kubelet/kubelet-client.pem", &client.combined_pem(), 0o600);
    let kc = nodeup::render::kubelet::kubeconfig(
        "https://127.0.0.1",
        &kube.cert_pem,
        "system:node:ip-10-0-1-5",
        nodeup::render::kubelet::UserEntry::from_pem_file("/var/lib/kubelet/kubelet-client.pem"),
    )
    .expect("kubeconfig");
    write(root, "/var/lib/kubelet/kubeconfig", &kc, 0o400);
    let spec = CertSpec { cn: "system:node:ip-10-0-1-5".into(), orgs: vec![], dns: vec!["ip-10-0-1-5".into()], ips: vec![], usage: Usage::Server };
    let server = pki::issue_for("kubernetes-ca", kube, &spec, life).expect("server");
    write(root, "/srv/kubernetes/kubelet-server.crt", &server.cert_pem, 0o644);
    write(root, "/srv/kubernetes/kubelet-server.key", &server.key_pem, 0o600);
    kc
}

fn kubelet_renewer(state: &Path, root: &Path, reloads_serving_cert: bool) -> Renewer {
    let store = base::StateStore::open(&format!("file://{}", state.display()).parse().expect("base"), Duration::from_secs(5)).expect("store");
    let bundles = certs::control_plane_bundles(&[], reloads_serving_cert).into_iter().filter(|b| b.name == "kubelet").collect();
    Renewer { root: root.to_path_buf(), store, host: "i-1".into(), bundles, manifests_dir: "/etc/kubernetes/manifests".into(), api_server_restart: None }
}

#[tokio::test]
async fn the_kubelet_reads_its_renewed_certificates_without_a_restart() {
    let state = tempfile::tempdir().expect("state");
    let root = tempfile::tempdir().expect("root");
    let (state, root) = (state.path(), root.path());
    pki::init_pki(state, &[]).expect("pki");
    let kube = ca(state, "kubernetes-ca");
    let kc = kubelet_files(root, &kube, 365 * DAY);
    let old = read(root, "/var/lib/kubelet/kubelet-client.pem");
    let renewer = kubelet_renewer(state, root, true);

    let fresh = renewer.pass(SystemTime::now()).await;
    assert!(fresh.renewed.is_empty() && fresh.failed.is_empty(), "{:?} {:?}", fresh.renewed, fresh.failed);
    let names: Vec<&str> = fresh.certs.keys().map(String::as_str).collect();
    assert_eq!(names, ["kubelet/client", "kubelet/server"], "a kubeconfig that names the file holds no certificate of its own");

    // 300 days on: both due and renewed; the kubelet reads them again by itself — no restart.
    let r = renewer.pass(SystemTime::now() + 300 * DAY).await;
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    assert_eq!(r.renewed, ["kubelet"]);
    assert!(r.recorded.is_empty(), "the kubelet was restarted: {:?}", r.recorded);
    let pem = read(root, "/var/lib/kubelet/kubelet-client.pem");
    assert_ne!(pem, old);
    let blocks = pem::parse_many(&pem).expect("pem");
    assert_eq!(blocks.iter().map(|b| b.tag()).collect::<Vec<_>>(), ["CERTIFICATE", "PRIVATE KEY"], "a certificate, then its key");
    let (cert_pem, key_pem) = (pem::encode(&blocks[0]), pem::encode(&blocks[1]));
    assert_eq!(pki::spec_of(&cert_pem).expect("spec"), CertSpec::client("system:node:ip-10-0-1-5", &["system:nodes"]));
    assert_eq!(cert_key(&cert_pem), private_key(&key_pem), "the file's key is its certificate's");
    assert_eq!(mode(root, "/var/lib/kubelet/kubelet-client.pem"), 0o600);
    assert_eq!(read(root, "/var/lib/kubelet/kubeconfig"), kc, "the kubeconfig is not rewritten");

    // A kubelet that does not reload its serving certificate is restarted for it.
    let r = kubelet_renewer(state, root, false).pass(SystemTime::now() + 600 * DAY).await;
    assert_eq!((r.renewed.as_slice(), r.recorded.as_slice()), (&["kubelet".to_string()][..], &["systemctl restart kubelet.service".to_string()][..]));
}

#[tokio::test]
async fn the_kubelet_is_restarted_only_when_it_could_not_pick_its_certificate_up_in_time() {
    let state = tempfile::tempdir().expect("state");
    let root = tempfile::tempdir().expect("root");
    let (state, root) = (state.path(), root.path());
    pki::init_pki(state, &[]).expect("pki");
    let kube = ca(state, "kubernetes-ca");

    // 13-minute certificates: renewed 6m30s before expiry, enough for the kubelet's 5-minute read.
    kubelet_files(root, &kube, Duration::from_secs(13 * 60));
    let renewer = kubelet_renewer(state, root, true);
    let early = renewer.pass(SystemTime::now() + Duration::from_secs(6 * 60)).await;
    assert!(early.renewed.is_empty(), "renewed with 7 minutes left: {:?}", early.renewed);
    let due = renewer.pass(SystemTime::now() + Duration::from_secs(7 * 60)).await;
    assert_eq!((due.renewed.as_slice(), due.recorded.len()), (&["kubelet".to_string()][..], 0), "{:?}", due.recorded);

    // 8-minute certificates: renewed at half their life, 4 minutes before expiry — the kubelet
    // might read the file too late, so it is restarted.
    kubelet_files(root, &kube, Duration::from_secs(8 * 60));
    let early = renewer.pass(SystemTime::now() + Duration::from_secs(3 * 60)).await;
    assert!(early.renewed.is_empty(), "renewed with 5 minutes left: {:?}", early.renewed);
    let late = renewer.pass(SystemTime::now() + Duration::from_secs(4 * 60 + 10)).await;
    assert_eq!(late.recorded, ["systemctl restart kubelet.service"]);

    // A kubeconfig that embeds the certificate (an older nodeup's): renewed in place, restarted.
    let client = pki::issue("kubernetes-ca", &kube, &CertSpec::client("system:node:ip-10-0-1-5", &["system:nodes"])).expect("client");
    let kc = nodeup::render::kubelet::kubeconfig(
        "https://127.0.0.1",
        &kube.cert_pem,
        "system:node:ip-10-0-1-5",
        nodeup::render::kubelet::UserEntry {
            client_certificate_data: Some(client.cert_pem.clone()),
            client_key_data: Some(client.key_pem),
            ..Default::default()
        },
    )
    .expect("kubeconfig");
    std::fs::remove_file(root.join("var/lib/kubelet/kubelet-client.pem")).expect("rm");
    write(root, "/var/lib/kubelet/kubeconfig", &kc, 0o400);
    kubelet_files_server_only(root, &kube);
    let r = renewer.pass(SystemTime::now() + 400 * DAY).await;
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    assert_eq!(r.recorded, ["systemctl restart kubelet.service"]);
    assert_ne!(certs::kubeconfig_cert(&read(root, "/var/lib/kubelet/kubeconfig")).expect("cert"), client.cert_pem);
}

fn kubelet_files_server_only(root: &Path, kube: &Keypair) {
    let spec = CertSpec { cn: "system:node:ip-10-0-1-5".into(), orgs: vec![], dns: vec!["ip-10-0-1-5".into()], ips: vec![], usage: Usage::Server };
    let server = pki::issue("kubernetes-ca", kube, &spec).expect("server");
    write(root, "/srv/kubernetes/kubelet-server.crt", &server.cert_pem, 0o644);
    write(root, "/srv/kubernetes/kubelet-server.key", &server.key_pem, 0o600);
}
