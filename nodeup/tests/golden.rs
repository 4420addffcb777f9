//! Golden files for everything nodeup renders, for a worker and a control-plane host of
//! `examples/ha.yaml` (NodeupConfigs in `tests/fixtures/ha`, compiled by `keelson compile`).
//! Re-bless with `KEELSON_BLESS=1 cargo test --workspace --all-targets --test golden`.

mod common;

use std::path::PathBuf;

use common::*;

const RENDERED: &[&str] = &[
    "etc/containerd/config.toml",
    "etc/systemd/system/containerd.service",
    "etc/systemd/system/kubelet.service",
    "etc/systemd/system/kubelet.service.d/10-keelson.conf",
    "etc/systemd/system/protokube.service",
    "etc/systemd/system/cri-containerd-.scope.d/50-keelson-stop-after-protokube.conf",
    "var/lib/kubelet/kubelet.conf",
    "var/lib/kubelet/credential-provider.conf",
    "etc/sysconfig/kubelet",
    "etc/sysctl.d/99-k8s-general.conf",
    "etc/modules-load.d/k8s.conf",
    "etc/kubernetes/manifests/kube-apiserver.manifest",
    "etc/kubernetes/manifests/kube-controller-manager.manifest",
    "etc/kubernetes/manifests/kube-scheduler.manifest",
    "etc/kubernetes/manifests/kube-proxy.manifest",
    "var/lib/kube-scheduler/config.yaml",
];

fn golden(group: Group, name: &str) {
    let s = Scenario::new(group, 1024, |m, a| vec![m.url(&a.path)]);
    // The instance's identity, as IMDS would give it: the kubelet registers with its provider id.
    assert_ok(&s.run(&["--instance-id", "i-0a1b2c3d4e5f60718", "--zone", "eu-west-1a"]));
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name);
    let mut actual = std::collections::BTreeMap::new();
    for rel in RENDERED {
        if let Ok(bytes) = std::fs::read(s.root.join(rel)) {
            actual.insert(rel.to_string(), bytes);
        }
    }
    assert!(actual.len() >= 8, "only {} of the files compared were rendered", actual.len());
    testkit::golden::check_tree(name, &dir, &actual);
}

#[test]
fn golden_worker_nodes() {
    golden(Group::Worker, "nodes");
}

#[test]
fn golden_control_plane_eu_west_1a() {
    golden(Group::ControlPlane, "control-plane-eu-west-1a");
}
