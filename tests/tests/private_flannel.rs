//! End to end, private topology with an overlay CNI: `keelson-local up -f examples/private.yaml`
//! (one control plane and two workers in Private subnets, NAT gateways and a network load balancer
//! for the API in the Utility subnets, `networking.flannel` with the vxlan backend). flannel runs
//! from upstream's manifest with kOps' settings (the compiler's `networking.flannel` addon), its
//! flanneld and CNI plugin images built from Go modules. Checked: every machine is a Ready Node;
//! the flannel DaemonSet is ready on every node; each machine has the `flannel.1` VXLAN device
//! (VNI 1, UDP 8472) and flannel's subnet file for its Node's pod CIDR; no VPC route carries a pod
//! CIDR (the overlay, not the cloud, joins the nodes); a pod on one worker reaches a pod on the
//! other by its pod IP; `keelson validate cluster` is green. Then down. The wall time is printed.
//!
//! Air-gapped (`--air-gapped`): the harness's builds go into a staging mirror and registry, which
//! `keelson bundle create` packs; `keelson bundle push` fills an empty mirror and a fresh registry,
//! and only those serve the machines (the staging registry is stopped; the harness adds only the
//! tests' own workload image, as a user pushes an app). Checked: every machine pulled its images from
//! the fresh registry, and the served mirror holds exactly the bundle's files.

mod support;

use std::time::{Duration, Instant};

use keelson_local::cluster::ClusterState;
use keelson_local::machine;
use keelson_local::paths::{self, State};

#[test]
fn private_topology_with_flannel_vxlan() {
    support::require_root();
    let t0 = Instant::now();
    let down = support::Down;
    let spec_path = support::repo().join("examples/private.yaml");
    let out = support::run(&["up", "-f", &spec_path.to_string_lossy(), "--timeout", "600", "--air-gapped"]);
    assert!(out.status.success(), "keelson-local up failed (output above)");
    let up = t0.elapsed();

    let st = State::new(paths::state_dir());
    let cs = ClusterState::load(&st).expect("cluster.json");
    assert!(cs.air_gapped, "cluster.json says air-gapped");
    // 0. Air-gapped: each machine pulled from the fresh registry (its access log, by client).
    let log = std::fs::read_to_string(st.registry_log()).expect("registry log");
    for m in &cs.machines {
        let f = keelson_local::cluster::selfheal::registry_fetches(&log, &m.ip);
        assert!(f.blobs > 0 && f.manifests > 0, "{} ({}) fetched {f:?} from the pushed registry", m.instance_id, m.ip);
    }
    // The served mirror holds the bundle's files and nothing else.
    let bundle = keelson_local::cluster::bundled::bundle_path(&st.root);
    let mut archive = tar::Archive::new(std::fs::File::open(&bundle).expect("bundle"));
    let manifest: serde_json::Value = archive
        .entries()
        .expect("entries")
        .map(|e| e.expect("entry"))
        .find(|e| e.path().map(|p| p.to_string_lossy() == "bundle.json").unwrap_or(false))
        .map(|e| serde_json::from_reader(e).expect("bundle.json"))
        .expect("bundle.json in the bundle");
    let files = manifest["files"].as_array().expect("files").len();
    // The served mirror: the bundle's files, and beside them the Debian archive subset standing
    // for the site's own Debian mirror (nodeup installs the hosts' packages from it).
    let apt = st.mirror_dir().join(keelson_api::host_packages::APT_DIR);
    let debian = walk_files(&apt);
    assert!(debian > 0, "no Debian archive subset under {}", apt.display());
    let served = walk_files(&st.mirror_dir()) - debian;
    assert_eq!(served, files, "the served mirror holds {served} files besides the Debian archive, the bundle {files}");
    assert_eq!(cs.machines.iter().filter(|m| m.role == "control-plane").count(), 1, "{:?}", cs.machines);
    assert_eq!(cs.machines.iter().filter(|m| m.role == "node").count(), 2, "{:?}", cs.machines);

    // 1. The flannel DaemonSet is ready on every node (bounded; flanneld starts once each Node has
    //    its pod CIDR).
    wait_for("the kube-flannel-ds DaemonSet ready on 3 nodes", 180, || {
        let o = support::run(&[
            "kubectl",
            "-n",
            "kube-flannel",
            "get",
            "daemonset",
            "kube-flannel-ds",
            "-o",
            "jsonpath={.status.desiredNumberScheduled} {.status.numberReady}",
        ]);
        String::from_utf8_lossy(&o.stdout).trim() == "3 3"
    });

    // 2. Every machine is a Ready Node; its pod CIDR (from kube-controller-manager, inside the
    //    nonMasqueradeCIDR flannel's net-conf names) is what flanneld leased, and it has the VXLAN
    //    device.
    let o = support::run(&[
        "kubectl",
        "get",
        "nodes",
        "-o",
        r#"jsonpath={range .items[*]}{.metadata.name} {.spec.podCIDR} {.status.conditions[?(@.type=="Ready")].status} {.metadata.annotations.flannel\.alpha\.coreos\.com/backend-type}{"\n"}{end}"#,
    ]);
    let nodes: Vec<Vec<String>> =
        String::from_utf8_lossy(&o.stdout).lines().filter(|l| !l.trim().is_empty()).map(|l| l.split_whitespace().map(str::to_string).collect()).collect();
    assert_eq!(nodes.len(), 3, "{nodes:?}");
    for n in &nodes {
        assert_eq!(n.len(), 4, "name, pod CIDR, Ready, flannel backend: {n:?}");
        assert_eq!(n[2], "True", "{} is not Ready: {n:?}", n[0]);
        assert_eq!(n[3], "vxlan", "{}: flannel's backend-type annotation: {n:?}", n[0]);
    }
    for m in &cs.machines {
        let pid = m.init_pid.expect("a running machine");
        let link = machine::exec_in(pid, &["ip", "-d", "link", "show", "flannel.1"]).unwrap_or_else(|e| panic!("{}: no flannel.1: {e}", m.instance_id));
        assert!(link.contains("vxlan id 1 ") && link.contains("dstport 8472"), "{}: flannel.1 is not flannel's VXLAN device: {link}", m.instance_id);
        let env = machine::exec_in(pid, &["cat", "/run/flannel/subnet.env"]).unwrap_or_else(|e| panic!("{}: no /run/flannel/subnet.env: {e}", m.instance_id));
        assert!(env.contains("FLANNEL_NETWORK=100.64.0.0/10"), "{}: {env}", m.instance_id);
        let subnet = env.lines().find_map(|l| l.strip_prefix("FLANNEL_SUBNET=")).unwrap_or_else(|| panic!("{}: {env}", m.instance_id));
        // FLANNEL_SUBNET is the node's first pod address with the CIDR's prefix: 100.96.1.1/24 for 100.96.1.0/24.
        let (addr, prefix) = subnet.split_once('/').expect("address/prefix");
        let network = addr.rsplit_once('.').map(|(net, _)| format!("{net}.0/{prefix}")).expect("IPv4");
        assert!(nodes.iter().any(|n| n[1] == network), "{}: flannel leased {subnet}, no Node has the pod CIDR {network}: {nodes:?}", m.instance_id);
        let conflist = machine::exec_in(pid, &["cat", "/etc/cni/net.d/10-flannel.conflist"]).unwrap_or_else(|e| panic!("{}: {e}", m.instance_id));
        assert!(conflist.contains("\"type\": \"flannel\""), "{}: {conflist}", m.instance_id);
        assert!(m.root.join("opt/cni/bin/flannel").is_file(), "{}: the init container installed no /opt/cni/bin/flannel", m.instance_id);
    }

    // 3. No pod CIDR is routed by the host (the harness plays VPC routes as host routes on the
    //    bridge; with flannel there are none).
    let routes = std::process::Command::new("ip").args(["-4", "-o", "route", "show", "proto", "static"]).output().expect("ip route");
    let routes = String::from_utf8_lossy(&routes.stdout).to_string();
    for n in &nodes {
        assert!(!routes.lines().any(|r| r.starts_with(&format!("{} ", n[1]))), "{}'s pod CIDR {} is routed by the VPC: {routes}", n[0], n[1]);
    }

    // 4. A pod on one worker reaches a pod on the other, across the overlay.
    let workers: Vec<String> = {
        let o = support::run(&["kubectl", "get", "nodes", "-l", "!node-role.kubernetes.io/control-plane", "-o", "jsonpath={.items[*].metadata.name}"]);
        String::from_utf8_lossy(&o.stdout).split_whitespace().map(str::to_string).collect()
    };
    assert_eq!(workers.len(), 2, "{workers:?}");
    support::pod_to_pod(&cs.registry, &workers[0], &workers[1]);

    // 5. `keelson validate cluster` (the product's, against moto and the real API) is green.
    support::validate_green("3m", 3);

    let checks = t0.elapsed() - up;
    drop(down);
    support::assert_nothing_left();
    eprintln!(
        "private flannel cluster: up {:.0} s, checks {:.0} s, total with down {:.0} s",
        up.as_secs_f64(),
        checks.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
}

/// How many files are under `dir`.
fn walk_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).map(|rd| rd.flatten().map(|e| if e.path().is_dir() { walk_files(&e.path()) } else { 1 }).sum()).unwrap_or(0)
}

/// Poll `f` every 2 s until it holds; fail after `secs`.
fn wait_for(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out after {secs} s waiting for {what}");
        std::thread::sleep(Duration::from_secs(2));
    }
}
