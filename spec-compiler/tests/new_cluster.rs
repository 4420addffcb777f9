//! `create cluster` round trip: what `new_cluster` writes for AWS and GCE, public and private,
//! loads with the loader every command uses, is refused nothing by `validate`'s rule
//! (`support::not_rendered`), and compiles.

use std::path::Path;

use spec_compiler::load::load_bytes;
use spec_compiler::new_cluster::{new_cluster, to_yaml, NewClusterOptions};
use spec_compiler::CompileOptions;

fn options(cloud: &str, private: bool) -> NewClusterOptions {
    let (zones, state) = match cloud {
        "aws" => (vec!["eu-west-1a", "eu-west-1b", "eu-west-1c"], "s3://acme-state"),
        _ => (vec!["europe-west1-b", "europe-west1-c", "europe-west1-d"], "gs://acme-state"),
    };
    NewClusterOptions {
        name: format!("{cloud}-{}.k8s.example.com", if private { "private" } else { "public" }),
        zones: zones.into_iter().map(str::to_string).collect(),
        state: Some(state.into()),
        project: (cloud == "gce").then(|| "acme-platform".to_string()),
        topology: private.then(|| "private".to_string()),
        ..Default::default()
    }
}

fn round_trip(o: &NewClusterOptions) {
    let docs = new_cluster(o).unwrap_or_else(|e| panic!("{}: {e}", o.name));
    let yaml = to_yaml(&docs);
    let loaded = load_bytes(Path::new("created.yaml"), yaml.as_bytes()).unwrap_or_else(|e| panic!("{}: does not load: {e:?}\n{yaml}", o.name));
    let refused = keelson_api::support::not_rendered(&loaded);
    assert!(refused.is_empty(), "{}: validate refuses {refused:?}\n{yaml}", o.name);
    let compiled = spec_compiler::compile(&loaded, &CompileOptions::default()).unwrap_or_else(|e| panic!("{}: does not compile: {e}\n{yaml}", o.name));
    assert!(!compiled.tree.files.is_empty());
}

#[test]
fn aws_and_gce_public_and_private_validate_and_compile() {
    for cloud in ["aws", "gce"] {
        for private in [false, true] {
            round_trip(&options(cloud, private));
        }
    }
}

/// The flags a team reaches for beyond the defaults: three control planes, a bastion, a DNS zone,
/// sizes, volumes, labels, restricted access, another CNI, Graviton nodes.
#[test]
fn a_fully_flagged_cluster_validates_and_compiles() {
    for cloud in ["aws", "gce"] {
        let mut o = options(cloud, true);
        o.control_plane_count = Some(3);
        o.node_count = Some(5);
        o.bastion = true;
        o.dns_zone = Some("k8s.example.com".into());
        o.networking = Some("calico".into());
        o.admin_access = vec!["203.0.113.0/24".into()];
        o.cloud_labels = Some("Owner=Platform Team,CostCenter=42".into());
        o.control_plane_volume_size = Some(64);
        o.node_volume_size = Some(128);
        o.feature_gates = vec!["InPlacePodVerticalScaling".into()];
        if cloud == "aws" {
            o.node_sizes = vec!["m7g.large".into(), "m6g.large".into()];
            o.control_plane_sizes = vec!["m6i.large".into()];
        }
        round_trip(&o);
    }
}

/// One version: the examples (and so keelson-local, which builds the examples' version) run the
/// version `create cluster` writes by default.
#[test]
fn the_examples_run_the_recommended_version() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("examples") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        for line in text.lines().filter_map(|l| l.trim().strip_prefix("kubernetesVersion:")) {
            seen += 1;
            assert_eq!(line.trim(), spec_compiler::versions::RECOMMENDED_KUBERNETES_VERSION, "{}", path.display());
        }
    }
    assert!(seen >= 5, "found {seen} kubernetesVersion lines under {}", dir.display());
}
