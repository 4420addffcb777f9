//! End to end, a mixed-architecture cluster: `keelson-local up -f examples/arm64.yaml` (one control
//! plane and two amd64 workers, and a Graviton group, `m7g.large`, whose instance is an arm64 machine:
//! Debian's arm64 root filesystem, every program in it run through qemu-user). The product does what
//! it does on EC2: the user-data starts the arm64 nodeup build, nodeup installs the arm64 assets
//! (kubelet, containerd, CNI plugins, cross-compiled from the same modules), and containerd pulls the
//! arm64 images of the multi-platform tags (kube-proxy, pause, the tests' echo). Checked: the arm64
//! machine's kubelet and containerd are aarch64 programs (run by qemu-aarch64), its Node is Ready with
//! `kubernetes.io/arch=arm64` and the group's taint, a pod runs on it and reaches a pod on the amd64
//! worker by pod IP and back, and `keelson validate cluster` is green. Then down; times printed.
//!
//! What the emulation cannot do, and the harness therefore does natively (docs/local-cluster.md,
//! "Mixed architectures"): qemu-user refuses runc's clone into new namespaces and the shim's
//! `PR_SET_CHILD_SUBREAPER`, so the arm64 machine's runc (a static host build with seccomp,
//! `tests/kubernetes/build-runc.sh`) and containerd's runc shim are the host's; it hides seccomp
//! from containerd and has no netfilter netlink, so the arm64 containerd is built with two small
//! patches (`tests/kubernetes/build-containerd.sh`) and the arm64 kube-proxy image carries the
//! host's iptables (`images.sh build-node`). The kubelet, containerd, kube-proxy, the CNI plugins,
//! pause and the test's pods are the arm64 builds.
//!
//! Opt-in: the first run cross-compiles Kubernetes, containerd and the node images for arm64 and
//! debootstraps two arm64 roots (about 30 minutes on 2 cores), and needs `scripts/build-arm64`'s
//! nodeup first:
//!   scripts/build-arm64 && cargo test -p keelson-local --features tier-cluster --test arm64 -- --ignored --nocapture

mod support;

use std::time::Instant;

use keelson_local::cluster::ClusterState;
use keelson_local::machine;
use keelson_local::paths::{self, State};

#[test]
#[ignore = "opt-in (arm64 cross builds and roots, ~30 min cold on 2 cores; needs scripts/build-arm64 and qemu-user-static): cargo test -p keelson-local --features tier-cluster --test arm64 -- --ignored --nocapture"]
fn an_arm64_worker_under_qemu_joins_and_runs_pods() {
    support::require_root();
    let t0 = Instant::now();
    let down = support::Down;
    let spec_path = support::repo().join("examples/arm64.yaml");
    let out = support::run(&["up", "-f", &spec_path.to_string_lossy(), "--timeout", "1200"]);
    assert!(out.status.success(), "keelson-local up failed (output above)");
    let up = t0.elapsed();

    let st = State::new(paths::state_dir());
    let cs = ClusterState::load(&st).expect("cluster.json");
    assert_eq!(cs.machines.len(), 4, "{:?}", cs.machines);
    let arm = cs.machines.iter().find(|m| m.group.starts_with("nodes-arm64")).unwrap_or_else(|| panic!("no machine of nodes-arm64: {:?}", cs.machines));
    let amd = cs.machines.iter().find(|m| m.role == "node" && m.instance_id != arm.instance_id).expect("an amd64 worker");
    let pid = arm.init_pid.expect("a running machine");

    // 1. The arm64 machine runs aarch64 programs: uname says so (qemu-user's), and its kubelet and
    //    containerd are run by qemu-aarch64 (binfmt_misc hands every aarch64 ELF to it).
    let uname = machine::exec_in(pid, &["uname", "-m"]).expect("uname");
    assert_eq!(uname.trim(), "aarch64", "{}: uname -m", arm.instance_id);
    let ps = machine::exec_in(pid, &["ps", "-eo", "args"]).expect("ps");
    for program in ["kubelet", "containerd"] {
        assert!(
            ps.lines().any(|l| l.contains("qemu-aarch64") && l.split_whitespace().any(|w| w.ends_with(&format!("/{program}")))),
            "{}: no {program} run by qemu-aarch64:\n{ps}",
            arm.instance_id
        );
    }
    // The amd64 worker's are native.
    let ps_amd = machine::exec_in(amd.init_pid.expect("running"), &["ps", "-eo", "args"]).expect("ps");
    assert!(!ps_amd.contains("qemu-aarch64"), "{}: an amd64 machine runs qemu:\n{ps_amd}", amd.instance_id);

    // 2. Its Node: Ready, arm64 by the kubelet's own account, with the group's taint.
    let node_of = |m: &machine::MachineInfo| -> String {
        let o = support::run(&[
            "kubectl",
            "get",
            "nodes",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.status.addresses[?(@.type==\"InternalIP\")].address}{\"\\n\"}{end}",
        ]);
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(m.ip.as_str()))
            .and_then(|l| l.split_whitespace().next())
            .unwrap_or_else(|| panic!("no Node with the address {}", m.ip))
            .to_string()
    };
    let (arm_node, amd_node) = (node_of(arm), node_of(amd));
    support::wait(&format!("{arm_node} Ready"), 300, || {
        let o = support::run(&["kubectl", "get", "node", &arm_node, "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}"]);
        String::from_utf8_lossy(&o.stdout).trim() == "True"
    });
    let o = support::run(&["kubectl", "get", "node", &arm_node, "-o", "jsonpath={.status.nodeInfo.architecture} {.metadata.labels.kubernetes\\.io/arch}"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "arm64 arm64", "{arm_node}: the kubelet's architecture and its label");
    // The group's taint, and nothing else once the cloud controller manager has initialised the
    // Node (its `uninitialized` taint goes then).
    let taints = || {
        let o = support::run(&["kubectl", "get", "node", &arm_node, "-o", "jsonpath={range .spec.taints[*]}{.key}={.value}:{.effect}{\"\\n\"}{end}"]);
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    support::wait(&format!("{arm_node} initialised by the CCM"), 120, || !taints().contains("uninitialized"));
    assert_eq!(taints(), "kubernetes.io/arch=arm64:NoSchedule", "{arm_node}: the group's taint");

    // 3. A pod runs on it (its image the arm64 one of the multi-platform tag) and the pod network
    //    joins the two architectures both ways.
    support::pod_to_pod(&cs.registry, &arm_node, &amd_node);
    support::pod_to_pod(&cs.registry, &amd_node, &arm_node);

    // 4. `keelson validate cluster` is green with all four Nodes.
    support::validate_green("5m", 4);

    let checks = t0.elapsed() - up;
    drop(down);
    support::assert_nothing_left();
    eprintln!("arm64 cluster: up {:.0} s, checks {:.0} s, total with down {:.0} s", up.as_secs_f64(), checks.as_secs_f64(), t0.elapsed().as_secs_f64());
}
