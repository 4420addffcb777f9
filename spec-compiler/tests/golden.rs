//! Golden files for everything `keelson compile` renders from the bundled examples.
//! Re-bless with `KEELSON_BLESS=1 cargo test --workspace --all-targets --test golden`.

mod common;

use std::path::Path;

fn check(example_file: &str) {
    let name = example_file.trim_end_matches(".yaml");
    let out = common::compile(&common::example(example_file));
    let actual = common::read_tree(out.path());
    testkit::golden::check_tree(example_file, &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name), &actual);
}

#[test]
fn minimal_example() {
    check("minimal.yaml");
}

#[test]
fn ha_example() {
    check("ha.yaml");
}

#[test]
fn gce_example() {
    check("gce.yaml");
}

/// Private topology with flannel: its addon is upstream's manifest with kOps' settings.
#[test]
fn private_example() {
    check("private.yaml");
}

#[test]
fn user_data_is_valid_bash_and_passes_shellcheck() {
    for example in ["minimal.yaml", "ha.yaml", "gce.yaml", "private.yaml"] {
        let out = common::compile(&common::example(example));
        for entry in std::fs::read_dir(out.path().join("userdata")).expect("userdata dir") {
            let path = entry.expect("entry").path();
            let size = std::fs::metadata(&path).expect("stat").len();
            assert!(size < 16 * 1024, "{}: {size} bytes", path.display());
            let bash = std::process::Command::new("bash").arg("-n").arg(&path).output().expect("bash is needed");
            assert!(bash.status.success(), "bash -n {}: {}", path.display(), String::from_utf8_lossy(&bash.stderr));
            let sc = std::process::Command::new("shellcheck")
                .arg(&path)
                .output()
                .unwrap_or_else(|e| panic!("this test needs shellcheck (apt-get install shellcheck; scripts/test installs it): {e}"));
            assert!(sc.status.success(), "shellcheck {}:\n{}", path.display(), String::from_utf8_lossy(&sc.stdout));
            let text = std::fs::read_to_string(&path).expect("read");
            for secret in ["BEGIN RSA PRIVATE KEY", "BEGIN PRIVATE KEY", "BEGIN EC PRIVATE KEY", "token:"] {
                assert!(!text.contains(secret), "{} carries a secret ({secret})", path.display());
            }
        }
    }
}

#[test]
fn user_data_pins_its_own_nodeup_config() {
    let out = common::compile(&common::example("ha.yaml"));
    for entry in std::fs::read_dir(out.path().join("bootconfig")).expect("bootconfig dir") {
        let path = entry.expect("entry").path();
        let group = path.file_stem().expect("stem").to_string_lossy().to_string();
        let boot: keelson_api::nodeup::BootConfig = serde_yaml_ng::from_slice(&std::fs::read(&path).expect("read")).expect("BootConfig parses");
        assert_eq!(boot.instance_group_name, group);
        let dir = if group.starts_with("control-plane") { "control-plane" } else { "node" };
        let nodeup = std::fs::read(out.path().join(format!("state/igconfig/{dir}/{group}/nodeupconfig.yaml"))).expect("nodeup config");
        assert_eq!(boot.nodeup_config_hash, spec_compiler::nodeup_config_hash(&nodeup));
        let script = std::fs::read_to_string(out.path().join(format!("userdata/{group}.sh"))).expect("user-data");
        assert!(script.contains(&format!("NodeupConfigHash: {}", boot.nodeup_config_hash)), "{group}");
    }
}

/// Every control plane's protokube has its own config beside its nodeup config, for its group and
/// cluster, which protokube accepts as it is; no other group has one.
#[test]
fn every_control_plane_gets_a_protokube_config_protokube_accepts() {
    for example in ["minimal.yaml", "ha.yaml", "gce.yaml", "private.yaml"] {
        let out = common::compile(&common::example(example));
        let mut control_planes = 0;
        for entry in std::fs::read_dir(out.path().join("bootconfig")).expect("bootconfig dir") {
            let path = entry.expect("entry").path();
            let boot: keelson_api::nodeup::BootConfig = serde_yaml_ng::from_slice(&std::fs::read(&path).expect("read")).expect("BootConfig parses");
            let rel = keelson_api::protokube::state_key(&boot.instance_group_name);
            let file = out.path().join("state").join(&rel);
            if boot.instance_group_role != keelson_api::Role::ControlPlane {
                assert!(!file.exists(), "{example}: {rel}");
                continue;
            }
            control_planes += 1;
            let config = keelson_api::protokube::ProtokubeConfig::parse(&std::fs::read(&file).expect("protokube config")).expect("protokube accepts it");
            assert_eq!(
                (config.cluster_name.as_str(), config.instance_group.as_str()),
                (boot.cluster_name.as_str(), boot.instance_group_name.as_str()),
                "{example}"
            );
            assert!(config.etcd_clusters.iter().any(|ec| !config.my_members(ec).is_empty()), "{example}: {rel} runs no etcd member");
        }
        assert!(control_planes > 0, "{example}");
    }
}

/// What `kops create cluster` writes on AWS, and what keeps the instances' credentials off the pod
/// network: every AWS example encrypts its etcd volumes, and every instance group asks for IMDSv2
/// with hop limit 1 (the cloud-controller-manager and the EBS CSI controller run on the host
/// network, so nothing in a pod needs the metadata service).
#[test]
fn aws_examples_encrypt_etcd_and_keep_metadata_on_the_host() {
    for example in ["minimal.yaml", "ha.yaml"] {
        let text = std::fs::read(common::example(example)).expect("example");
        let docs = keelson_api::parse_documents(&text).expect("parse");
        assert_eq!(docs.cluster.spec.cloud_provider.as_deref(), Some("aws"), "{example}");
        for etcd in docs.cluster.spec.etcd_clusters.iter().flatten() {
            for m in etcd.etcd_members.iter().flatten() {
                assert_eq!(m.encrypted_volume, Some(true), "{example}: etcd {:?} member {:?}", etcd.name, m.name);
            }
        }
        assert!(!docs.instance_groups.is_empty());
        for ig in &docs.instance_groups {
            let md = ig.spec.instance_metadata.as_ref().unwrap_or_else(|| panic!("{example}: {}: no instanceMetadata", ig.name()));
            assert_eq!(md.http_put_response_hop_limit, Some(1), "{example}: {}", ig.name());
            assert_eq!(md.http_tokens.as_deref(), Some("required"), "{example}: {}", ig.name());
        }
    }
}
