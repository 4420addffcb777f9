//! `spec.encryptionConfig`: compile turns it into the API servers' `--encryption-provider-config`
//! (completed spec) and the control planes' `APIServerConfig.EncryptionConfig` (NodeupConfig),
//! exactly when it is true — and, being offline, never into a key: the key is `keelson apply`'s.

mod common;

use std::collections::BTreeMap;

const PATH: &str = "/srv/kubernetes/kube-apiserver/encryptionconfig.yaml";

fn compile_text(spec: &str) -> BTreeMap<String, Vec<u8>> {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("spec.yaml");
    std::fs::write(&file, spec).expect("write spec");
    let out = common::compile(&file);
    common::read_tree(out.path())
}

fn yaml(tree: &BTreeMap<String, Vec<u8>>, rel: &str) -> serde_yaml_ng::Value {
    serde_yaml_ng::from_slice(tree.get(rel).unwrap_or_else(|| panic!("{rel} not written"))).expect("yaml")
}

fn provider_config(tree: &BTreeMap<String, Vec<u8>>) -> Option<String> {
    yaml(tree, "cluster-completed.yaml")["spec"]["kubeAPIServer"]["encryptionProviderConfig"].as_str().map(str::to_string)
}

/// `EncryptionConfig` of every NodeupConfig, by file.
fn nodeup_switches(tree: &BTreeMap<String, Vec<u8>>) -> BTreeMap<String, Option<bool>> {
    tree.keys().filter(|k| k.starts_with("nodeup/")).map(|k| (k.clone(), yaml(tree, k)["APIServerConfig"]["EncryptionConfig"].as_bool())).collect()
}

#[test]
fn the_flag_and_the_node_switch_appear_exactly_when_encryption_config_is_true() {
    let ha = std::fs::read_to_string(common::example("ha.yaml")).expect("ha.yaml");
    assert!(ha.contains("\n  encryptionConfig: true\n"), "examples/ha.yaml turns encryption at rest on");
    let on = compile_text(&ha);
    assert_eq!(provider_config(&on).as_deref(), Some(PATH));
    let switches = nodeup_switches(&on);
    assert_eq!(switches.len(), 4, "{switches:?}");
    for (file, on) in &switches {
        let want = file.starts_with("nodeup/control-plane-").then_some(true);
        assert_eq!(*on, want, "{file}");
    }

    for off in [ha.replace("\n  encryptionConfig: true\n", "\n"), ha.replace("\n  encryptionConfig: true\n", "\n  encryptionConfig: false\n")] {
        let tree = compile_text(&off);
        assert_eq!(provider_config(&tree), None);
        assert!(nodeup_switches(&tree).values().all(Option::is_none), "{:?}", nodeup_switches(&tree));
        for needle in ["encryptionProviderConfig", "encryption-provider-config", "EncryptionConfig: true"] {
            assert!(!tree.values().any(|b| String::from_utf8_lossy(b).contains(needle)), "{needle} in the output while off");
        }
    }

    // The user's path wins, and nodeup is told to write there.
    assert!(!ha.contains("kubeAPIServer:"));
    let custom =
        ha.replace("\n  encryptionConfig: true\n", "\n  encryptionConfig: true\n  kubeAPIServer:\n    encryptionProviderConfig: /etc/kubernetes/enc.yaml\n");
    let tree = compile_text(&custom);
    assert_eq!(provider_config(&tree).as_deref(), Some("/etc/kubernetes/enc.yaml"));
}

#[test]
fn compile_output_holds_no_encryption_key_and_stays_deterministic() {
    let a = common::compile(&common::example("ha.yaml"));
    let b = common::compile(&common::example("ha.yaml"));
    let (a, b) = (common::read_tree(a.path()), common::read_tree(b.path()));
    assert_eq!(a, b, "same input, byte-identical output");
    assert!(!a.keys().any(|k| k.contains("secrets/") || k.contains("encryptionconfig")), "{:?}", a.keys().collect::<Vec<_>>());
    for (rel, bytes) in &a {
        let text = String::from_utf8_lossy(bytes);
        for needle in ["EncryptionConfiguration", "secretbox", "aescbc"] {
            assert!(!text.contains(needle), "{rel} contains {needle}");
        }
    }
}
