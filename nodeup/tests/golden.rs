//! Golden files for everything nodeup renders, for a worker and a control-plane host of
//! `examples/ha.yaml` (NodeupConfigs in `tests/fixtures/ha`, compiled by `keelson compile`).
//! Re-bless with `NODEUP_BLESS=1 cargo test -p keelson-nodeup --test golden`.

mod common;

use std::path::PathBuf;

use common::*;

const RENDERED: &[&str] = &[
    "etc/containerd/config.toml",
    "etc/systemd/system/containerd.service",
    "etc/systemd/system/kubelet.service",
    "etc/systemd/system/protokube.service",
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
    let bless = std::env::var_os("NODEUP_BLESS").is_some();
    let mut compared = 0;
    let mut mismatches = Vec::new();
    for rel in RENDERED {
        let actual = s.root.join(rel);
        let expected = dir.join(rel);
        if bless {
            if actual.exists() {
                std::fs::create_dir_all(expected.parent().expect("parent")).expect("mkdir");
                std::fs::write(&expected, std::fs::read(&actual).expect("read")).expect("bless");
            } else {
                let _ = std::fs::remove_file(&expected);
            }
            continue;
        }
        match (actual.exists(), expected.exists()) {
            (false, false) => {}
            (true, true) => {
                compared += 1;
                let (a, e) = (std::fs::read_to_string(&actual).expect("actual"), std::fs::read_to_string(&expected).expect("expected"));
                if a != e {
                    mismatches.push(format!("{rel}: differs from {}\n--- expected\n{e}\n--- actual\n{a}", expected.display()));
                }
            }
            (true, false) => mismatches.push(format!("{rel}: rendered but no golden file (NODEUP_BLESS=1 to create)")),
            (false, true) => mismatches.push(format!("{rel}: golden file exists but nodeup did not render it")),
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    assert!(bless || compared >= 8, "only {compared} golden files compared");
}

#[test]
fn golden_worker_nodes() {
    golden(Group::Worker, "nodes");
}

#[test]
fn golden_control_plane_eu_west_1a() {
    golden(Group::ControlPlane, "control-plane-eu-west-1a");
}
