//! End to end, opt-in (not in CI's run: three rolls of an HA cluster): `cargo test --workspace
//! --features tier-cluster --test ca_rotation -- --ignored --nocapture` (as root, after scripts/test
//! has installed what the local cloud needs; `--release` with release binaries halves it).
//!
//! A cluster CA rotation as kOps documents it (`docs/operations.md`, "Rotating the cluster CA"),
//! on `examples/ha.yaml` with two workers (3 control planes: the API must stay up throughout):
//! `keelson create keypair kubernetes-ca` → apply → roll → `keelson promote keypair
//! kubernetes-ca` → apply → roll → `keelson distrust keypair kubernetes-ca` → apply → roll, the
//! admin kubeconfig exported again after each step, as the operator does. Checked all along:
//! `/readyz` through the API load balancer twice a second (no failure), and after each roll:
//! every instance replaced, `keelson validate cluster` green, `kubectl exec` into a pod on the
//! worker (API server → kubelet), the `kube-root-ca.crt` ConfigMap that pods trust holding exactly
//! the keys the keyset trusts, 200 ConfigMaps written before the rotation all there. At the end
//! every API server answers a client that trusts only the new key. Times printed: 1,670 s in all on
//! debug builds (2026-12-04; each step's apply and roll 455–534 s; readyz 2,931 ok, 0 failed).

mod support;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use keelson_local::cluster::ClusterState;
use keelson_local::kubeapi::{self, Target};
use keelson_local::paths::{self, State};

const CONFIGMAPS: u64 = 200;
const WORKERS: usize = 2;

/// `examples/ha.yaml` with two workers (the fewest its metrics-server, two replicas spread over
/// hosts, runs on), in `dir`.
fn spec(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(support::repo().join("examples/ha.yaml")).expect("examples/ha.yaml");
    let out = text.replacen("  minSize: 3\n", &format!("  minSize: {WORKERS}\n"), 1);
    assert_ne!(out, text, "examples/ha.yaml has no worker group of 3");
    let path = dir.join("ha.yaml");
    std::fs::write(&path, out).expect("writing the spec");
    path
}

/// The certificates of a PEM bundle, trimmed.
fn certs(pem: &str) -> Vec<String> {
    pem.split_inclusive("-----END CERTIFICATE-----").map(|c| c.trim().to_string()).filter(|c| c.contains("BEGIN CERTIFICATE")).collect()
}

/// The cluster CA's trusted certificates, the primary's first, as `keelson get keypairs` shows them.
fn trusted(local_spec: &str) -> Vec<String> {
    let rows: Vec<serde_json::Value> =
        serde_json::from_str(&support::keelson_ok(&["get", "keypairs", "kubernetes-ca", "-f", local_spec, "--offline", "-o", "json"]))
            .expect("get keypairs -o json");
    let mut out: Vec<(bool, String)> = rows
        .iter()
        .filter(|r| r["distrustTimestamp"].is_null())
        .map(|r| (r["primary"] != true, r["certificate"].as_str().expect("certificate").trim().to_string()))
        .collect();
    out.sort_by_key(|(not_primary, _)| *not_primary);
    out.into_iter().map(|(_, c)| c).collect()
}

/// The server URL of the harness's admin kubeconfig.
fn server_of(kubeconfig: &Path) -> String {
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(kubeconfig).expect("kubeconfig")).expect("kubeconfig YAML");
    doc["clusters"][0]["cluster"]["server"].as_str().expect("clusters[0].cluster.server").to_string()
}

/// One step of the rotation: the keypair command, apply, the roll; returns the roll's output.
fn step(local_spec: &str, command: &[&str], kubeconfig: &Path, server: &str, workers: usize) -> (String, f64) {
    let t = Instant::now();
    let mut args = command.to_vec();
    args.extend(["-f", local_spec, "--offline"]);
    support::keelson_ok(&args);
    // What the operator does next: a kubeconfig that trusts the keyset's keys now.
    support::keelson_ok(&[
        "export",
        "kubeconfig",
        "-f",
        local_spec,
        "--offline",
        "--admin",
        "--ttl",
        "72h",
        "--kubeconfig",
        &kubeconfig.to_string_lossy(),
        "--server",
        server,
    ]);
    support::keelson_ok(&["apply", "-f", local_spec, "--offline", "--yes"]);
    let rolled = support::keelson_ok(&["rolling-update", "cluster", "-f", local_spec, "--offline", "--yes"]);
    let replaced = rolled.lines().filter(|l| l.contains(": replacing i-")).count();
    assert_eq!(replaced, 3 + workers, "`{}` then the roll replaced {replaced} instances, want every one:\n{rolled}", command.join(" "));
    (rolled, t.elapsed().as_secs_f64())
}

/// After a roll: the cluster is valid, the API server reaches the worker's kubelet, and pods trust
/// exactly the keys the keyset trusts.
fn check(label: &str, kc: &Path, local_spec: &str, nodes: usize) {
    support::validate_green("10m", nodes);
    let want = trusted(local_spec);
    // The controller-manager publishes its root CA file (the control planes' trust bundle) to every
    // namespace: wait for the new content, bounded.
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let data = kubeapi::configmap_data(kc, "default", "kube-root-ca.crt").ok().flatten().unwrap_or_default();
        let have = certs(data.get("ca.crt").map(String::as_str).unwrap_or_default());
        if have.len() == want.len() && want.iter().all(|c| have.contains(c)) {
            break;
        }
        assert!(Instant::now() < deadline, "{label}: kube-root-ca.crt holds {} certificate(s), not the {} the keyset trusts", have.len(), want.len());
        std::thread::sleep(Duration::from_secs(3));
    }
    let name = format!("rotation-{}", label.split_whitespace().next().unwrap_or("x"));
    let registry = ClusterState::load(&State::new(paths::state_dir())).expect("cluster.json").registry;
    let image = format!("{registry}/keelson-test/echo:1");
    assert!(support::run(&["kubectl", "run", &name, "--image", &image, "--restart=Never"]).status.success(), "{label}: kubectl run");
    support::wait(&format!("{label}: pod {name} running"), 180, || {
        let o = support::run(&["kubectl", "get", "pod", &name, "-o", "jsonpath={.status.phase}"]);
        String::from_utf8_lossy(&o.stdout).trim() == "Running"
    });
    // The echo image is one static binary: it asks itself over the pod's loopback.
    let exec = support::run(&["kubectl", "exec", &name, "--", "/echo", "get", "http://127.0.0.1:8080/"]);
    assert!(
        exec.status.success() && String::from_utf8_lossy(&exec.stdout).contains(&name),
        "{label}: kubectl exec (the API server to the worker's kubelet) failed\n{}",
        support::pod_story(&name)
    );
    let _ = support::run(&["kubectl", "delete", "pod", &name, "--wait=false"]);
}

#[test]
#[ignore = "opt-in (three rolls of an HA cluster, over CI's budget): cargo test --workspace --features tier-cluster --test ca_rotation -- --ignored --nocapture"]
fn ca_rotation_keeps_every_node_working() {
    support::require_root();
    let tmp = tempfile::tempdir().expect("tmp");
    let spec_path = spec(tmp.path());
    let _down = support::Down;
    let t_up = Instant::now();
    let out = support::run(&["up", "-f", &spec_path.to_string_lossy(), "--timeout", "900"]);
    assert!(out.status.success(), "keelson-local up failed (output above)");
    let up_s = t_up.elapsed().as_secs_f64();
    let state_root = State::new(paths::state_dir()).root;
    let local_spec = state_root.join("spec.yaml").to_string_lossy().to_string();
    let cs = ClusterState::load(&State::new(paths::state_dir())).expect("cluster.json");
    let kc = PathBuf::from(&cs.kubeconfig);
    let server = server_of(&kc);
    let first = trusted(&local_spec);
    assert_eq!(first.len(), 1);
    kubeapi::create_configmaps(&kc, "default", "rotation", CONFIGMAPS).expect("ConfigMaps");
    check("before the rotation", &kc, &local_spec, 3 + WORKERS);

    // readyz through the API load balancer, all along (the kubeconfig file is read at each call,
    // so each re-export takes effect).
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(std::sync::Mutex::new(Vec::<String>::new())));
    let probe = {
        let (kc, stop, ok, failed) = (kc.clone(), stop.clone(), ok.clone(), failed.clone());
        let t0 = Instant::now();
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(3 * 3600);
            while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                match kubeapi::readyz(&kc, &Target::default()) {
                    Ok(_) => {
                        ok.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(e) => failed.lock().expect("lock").push(format!("at {:.1} s: {e}", t0.elapsed().as_secs_f64())),
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        })
    };

    let (_, create_s) = step(&local_spec, &["create", "keypair", "kubernetes-ca"], &kc, &server, WORKERS);
    let overlap = trusted(&local_spec);
    assert_eq!(overlap.len(), 2, "both keys trusted after create");
    assert_eq!(overlap[0], first[0], "the old key is still the primary");
    check("create", &kc, &local_spec, 3 + WORKERS);

    let (_, promote_s) = step(&local_spec, &["promote", "keypair", "kubernetes-ca"], &kc, &server, WORKERS);
    let promoted = trusted(&local_spec);
    assert_eq!(promoted[0], overlap[1], "the new key is the primary");
    check("promote", &kc, &local_spec, 3 + WORKERS);

    let (_, distrust_s) = step(&local_spec, &["distrust", "keypair", "kubernetes-ca"], &kc, &server, WORKERS);
    let last = trusted(&local_spec);
    assert_eq!(last, vec![overlap[1].clone()], "only the new key is trusted at the end");
    check("distrust", &kc, &local_spec, 3 + WORKERS);

    stop.store(true, Ordering::SeqCst);
    let _ = probe.join();
    let failures = failed.lock().expect("lock").clone();

    // Every API server answers a client that trusts only the new key (the exported kubeconfig
    // does now); the data is intact.
    assert_eq!(kubeconfig_trust(&kc), last, "the exported kubeconfig trusts exactly the new key");
    let cs = ClusterState::load(&State::new(paths::state_dir())).expect("cluster.json");
    for m in cs.machines.iter().filter(|m| m.role == "control-plane") {
        let target = Target { server: Some(format!("https://{}:443", m.ip)), tls_server_name: Some("kubernetes.default".into()) };
        kubeapi::server_version(&kc, &target).unwrap_or_else(|e| panic!("API server on {} with only the new key trusted: {e}", m.instance_id));
    }
    assert_eq!(kubeapi::count_configmaps(&kc, "default", "rotation", CONFIGMAPS).expect("count"), CONFIGMAPS);
    eprintln!(
        "CA rotation: up {up_s:.0} s; create+apply+roll {create_s:.0} s, promote+apply+roll {promote_s:.0} s, distrust+apply+roll {distrust_s:.0} s; readyz via the load balancer: {} ok, {} failed",
        ok.load(Ordering::SeqCst),
        failures.len()
    );
    assert!(failures.is_empty(), "readyz through the API load balancer failed during the rotation:\n{}", failures.join("\n"));
}

/// The certificates the admin kubeconfig trusts.
fn kubeconfig_trust(kubeconfig: &Path) -> Vec<String> {
    use base64::Engine as _;
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(kubeconfig).expect("kubeconfig")).expect("kubeconfig YAML");
    let data = doc["clusters"][0]["cluster"]["certificate-authority-data"].as_str().expect("certificate-authority-data");
    let pem = base64::engine::general_purpose::STANDARD.decode(data.trim()).expect("base64");
    certs(&String::from_utf8(pem).expect("PEM text"))
}
