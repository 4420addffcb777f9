//! End to end on GCE: `keelson-local selfheal -f examples/gce.yaml --cycles N` (N =
//! $KEELSON_GCE_SELFHEAL_CYCLES, default 1). The local GCE (Compute and Cloud DNS emulators,
//! fake-gcs-server for the `gs://` store) takes `keelson apply --yes`; its MIGs make the three
//! control planes (one per zone) and the workers, each a machine booted from its template's
//! `user-data` with its own metadata server. Every machine must become a Ready Node, both workers
//! must have joined by their GCE identity token (the join servers' admissions), and each cycle
//! deletes a random control-plane instance: its MIG makes it again under the same name with a new
//! id, the new machine claims that zone's persistent disks, and etcd must be healthy on it with all
//! 1,000 keys and the same members, and the 1,000 ConfigMaps must read back.
//!
//! After the cycles, with the cluster kept up: `keelson validate cluster` is green (the GCE
//! cloud-controller-manager initialised every Node, so CoreDNS runs), every Node's pod CIDR is
//! routed to it (the CCM's route controller wrote a Compute route per Node, the replaced control
//! plane's included, and the harness plays the VPC's routing), and a pod on one worker reaches a
//! pod on the other by its pod IP.
//!
//! Then the attack of issue 40 (a pod on a worker reads the node's token from the metadata server
//! and the cluster CA's key from the state store) fails twice over: a pod gets no answer from the
//! metadata server (a host-network pod on the same worker does: the server is there), and with the
//! node's own token the CA key is 403 while the node's NodeupConfig reads (the local Cloud Storage
//! enforces the bucket's conditional grants on the node's service account).

mod support;

use std::time::{Duration, Instant};

use keelson_local::cluster::ClusterState;
use keelson_local::paths::{self, State};

#[test]
fn gce_cluster_up_joins_by_identity_and_heals_from_its_migs() {
    support::require_root();
    assert!(
        testkit::fake_gcs::binary().is_file(),
        "fake-gcs-server is needed for the gs:// state store: {} is missing (scripts/test installs it; or set KEELSON_FAKE_GCS_SERVER)",
        testkit::fake_gcs::binary().display()
    );
    let _down = support::Down;
    let cycles: u32 = std::env::var("KEELSON_GCE_SELFHEAL_CYCLES").ok().and_then(|c| c.parse().ok()).unwrap_or(1);
    let spec = support::repo().join("examples/gce.yaml");
    let out = support::run(&[
        "selfheal",
        "-f",
        &spec.to_string_lossy(),
        "--cycles",
        &cycles.to_string(),
        "--cycle-timeout",
        "240",
        "--validate-wait",
        "180",
        "--keep-up",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let boots = stdout.lines().find(|l| l.starts_with("keelson-local: worker boot")).map(str::to_string);
    assert!(boots.as_deref().is_some_and(|l| !l.contains("not measured") && l.matches(" s,").count() == 1), "one boot time per worker: {boots:?}");
    let joined = stdout.lines().find(|l| l.contains("workers joined by cloud identity")).expect("a joins line (output above)");
    assert!(joined.starts_with("selfheal: 2 of 2 workers"), "both workers join by their GCE identity: {joined}");
    let healed = stdout.lines().filter(|l| l.starts_with("cycle ") && l.contains("healthy with 1000/1000 keys and 1000/1000 ConfigMaps, same members")).count();
    assert_eq!(healed, cycles as usize, "every cycle heals with every key, ConfigMap and member (output above)");
    assert!(stdout.lines().any(|l| l.starts_with("selfheal: median phase times")), "no phase breakdown");
    let prefix = format!("selfheal: {cycles} cycles, 1000/1000 keys intact, 1000/1000 ConfigMaps intact, median failover ");
    assert!(stdout.lines().any(|l| l.starts_with(&prefix)), "summary (output above)");
    let ready = stdout.lines().find(|l| l.ends_with("machines are Ready Nodes")).expect("a Ready-Nodes line");
    assert_eq!(ready, "selfheal: 5/5 machines are Ready Nodes");
    assert!(
        stdout.lines().any(|l| l == "selfheal: keelson validate cluster after the replacements: valid"),
        "keelson validate cluster is green after the cycles (output above)"
    );
    let nodes = routed_nodes();
    let workers: Vec<&str> = nodes.iter().filter(|n| !n.control_plane).map(|n| n.name.as_str()).collect();
    assert_eq!(workers.len(), 2, "{nodes:?}");
    let cs = ClusterState::load(&State::new(paths::state_dir())).expect("cluster state");
    support::pod_to_pod(&cs.registry, workers[0], workers[1]);
    pods_cannot_become_the_control_plane(&cs, workers[0]);
    drop(_down);
    support::assert_nothing_left();
}

const TOKEN_URL: &str = "http://169.254.169.254/computeMetadata/v1/instance/service-accounts/default/token";

/// `echo ARGS` in a pod on `node` (its pod network, or the host's); its phase and output.
fn pod(registry: &str, name: &str, node: &str, host_network: bool, args: &[&str]) -> (String, String) {
    let overrides = format!("--overrides={{\"apiVersion\":\"v1\",\"spec\":{{\"nodeName\":\"{node}\",\"hostNetwork\":{host_network}}}}}");
    let mut cmd = vec!["kubectl", "run", name, "--restart=Never", &overrides];
    let image = format!("--image={registry}/keelson-test/echo:1");
    cmd.push(&image);
    cmd.push("--");
    cmd.extend_from_slice(args);
    assert!(support::run(&cmd).status.success(), "kubectl run {name}");
    let deadline = Instant::now() + Duration::from_secs(120);
    let phase = loop {
        let o = support::run(&["kubectl", "get", "pod", name, "-o", "jsonpath={.status.phase}"]);
        let phase = String::from_utf8_lossy(&o.stdout).trim().to_string();
        if phase == "Succeeded" || phase == "Failed" {
            break phase;
        }
        assert!(Instant::now() < deadline, "{name} did not finish within 120 s: {phase}");
        std::thread::sleep(Duration::from_secs(2));
    };
    let logs = support::run(&["kubectl", "logs", name]);
    let _ = support::run(&["kubectl", "delete", "pod", name, "--wait=false"]);
    (phase, String::from_utf8_lossy(&logs.stdout).to_string() + &String::from_utf8_lossy(&logs.stderr))
}

fn pods_cannot_become_the_control_plane(cs: &ClusterState, worker: &str) {
    let object = |rel: &str| {
        let name: String = format!("gce.k8s.example.com/{rel}").replace('/', "%2F");
        format!("{}/storage/v1/b/acme-keelson-state/o/{name}?alt=media", cs.gce_storage.trim_end_matches('/'))
    };
    // The metadata server: there for the host, not for pods.
    let (phase, out) = pod(&cs.registry, "metadata-host", worker, true, &["get", TOKEN_URL, "Metadata-Flavor:Google"]);
    assert_eq!(phase, "Succeeded", "a host-network pod reads the node's token (the test's control): {out}");
    let (phase, out) = pod(&cs.registry, "metadata-pod", worker, false, &["get", TOKEN_URL, "Metadata-Flavor:Google"]);
    assert_eq!(phase, "Failed", "a pod on {worker} read the metadata server's token: {out}");
    // The node's own token (what a worker's root, or a host-network pod, holds).
    let (phase, out) =
        pod(&cs.registry, "store-config", worker, true, &["token-get", TOKEN_URL, &object("igconfig/node/nodes-europe-west1-b/nodeupconfig.yaml")]);
    assert_eq!(phase, "Succeeded", "the node reads its NodeupConfig (the test's control): {out}");
    let (phase, out) = pod(&cs.registry, "store-ca-key", worker, true, &["token-get", TOKEN_URL, &object("pki/private/kubernetes-ca/keyset.yaml")]);
    assert!(phase == "Failed" && out.contains("403"), "the node's token read the CA key: {phase}: {out}");
    println!("gce_cluster: a pod gets no metadata token; the node's token reads its config and is refused the CA key (403)");
}

#[derive(Debug)]
struct RoutedNode {
    name: String,
    control_plane: bool,
}

/// Every Node, once each one's pod CIDR has a host route via its internal IP (the harness's copy of
/// the Compute routes the CCM wrote); bounded at 120 s.
fn routed_nodes() -> Vec<RoutedNode> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let o = support::run(&[
            "kubectl",
            "get",
            "nodes",
            "-o",
            r#"jsonpath={range .items[*]}{.metadata.name} {.spec.podCIDR} {.status.addresses[?(@.type=="InternalIP")].address}{"\n"}{end}"#,
        ]);
        let text = String::from_utf8_lossy(&o.stdout).to_string();
        let cp = support::run(&["kubectl", "get", "nodes", "-l", "node-role.kubernetes.io/control-plane", "-o", "jsonpath={.items[*].metadata.name}"]);
        let cp = String::from_utf8_lossy(&cp.stdout).to_string();
        let routes = std::process::Command::new("ip").args(["-4", "-o", "route", "show", "proto", "static"]).output().expect("ip route");
        let routes = String::from_utf8_lossy(&routes.stdout).to_string();
        let mut nodes = Vec::new();
        let mut missing = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [name, cidr, ip] = f[..] else {
                missing.push(format!("{line:?}: no pod CIDR or address yet"));
                continue;
            };
            if !routes.lines().any(|r| r.starts_with(&format!("{cidr} via {ip} "))) {
                missing.push(format!("{name}: {cidr} via {ip}"));
            }
            nodes.push(RoutedNode { name: name.to_string(), control_plane: cp.split_whitespace().any(|n| n == name) });
        }
        if missing.is_empty() && nodes.len() == 5 {
            return nodes;
        }
        assert!(Instant::now() < deadline, "pod-CIDR routes missing within 120 s: {missing:?}\nnodes:\n{text}\nhost routes:\n{routes}");
        std::thread::sleep(Duration::from_secs(2));
    }
}
