//! Fuzz targets of `keelson apply`'s inputs short of the cloud (docs/fuzzing.md): the Terraform
//! target rendered from a fuzzed spec (whatever compiles must render structurally sound Terraform),
//! and the plan's diff of desired against discovered resources (anything the cloud answers:
//! names, attributes and tags as it has them). Each runs `KEELSON_FUZZ_CASES` inputs (a small
//! default, so `cargo test` stays fast); a panic fails the test with the shrunk input.

mod support;

use std::collections::BTreeMap;
use std::path::Path;

use cloud_resources::plan::{self, Action, Kind, Resource, Scope};
use cloud_resources::terraform::{self, structural_problems};
use serde_json::Value;
use testkit::fuzz;

const CI_CASES: u32 = 150;

fn spec_seeds() -> Vec<Vec<u8>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut seeds = fuzz::files(&root.join("examples"), ".yaml");
    let cases = std::env::var_os("KEELSON_CONFORMANCE_CASES").map(std::path::PathBuf::from).unwrap_or_else(|| root.join("../shared/conformance/cases"));
    let mut inputs: Vec<_> = std::fs::read_dir(&cases).into_iter().flatten().filter_map(Result::ok).map(|e| e.path().join("input.yaml")).collect();
    inputs.sort();
    seeds.extend(inputs.iter().filter_map(|p| std::fs::read(p).ok()));
    seeds
}

/// A spec through compile, the cluster model and the Terraform target: what renders must pass the
/// structural check (valid JSON, every reference resolves, valid names).
#[test]
fn terraform_from_spec() {
    let options = support::options();
    fuzz::run("terraform", spec_seeds(), fuzz::cases(CI_CASES), |b| {
        let Ok(docs) = spec_compiler::load::load_bytes(Path::new("fuzz.yaml"), b) else { return "not a valid spec" };
        let Ok(compiled) = spec_compiler::compile(&docs, &options) else { return "compile refused" };
        let Ok(model) = cloud_resources::model::build(&docs, &compiled) else { return "model refused" };
        match terraform::render(&model) {
            Err(_) => "render refused",
            Ok(tree) => {
                let problems = structural_problems(&tree);
                assert!(problems.is_empty(), "rendered Terraform is unsound: {problems:#?}");
                "rendered"
            }
        }
    });
}

const KINDS: [Kind; 27] = [
    Kind::StateFile,
    Kind::Keyset,
    Kind::IamRole,
    Kind::IamInstanceProfile,
    Kind::Vpc,
    Kind::InternetGateway,
    Kind::Subnet,
    Kind::ElasticIp,
    Kind::NatGateway,
    Kind::RouteTable,
    Kind::SecurityGroup,
    Kind::SecurityGroupRule,
    Kind::TargetGroup,
    Kind::LoadBalancer,
    Kind::LaunchTemplate,
    Kind::AutoscalingGroup,
    Kind::Volume,
    Kind::DnsRecord,
    Kind::GceNetwork,
    Kind::GceSubnetwork,
    Kind::GceFirewall,
    Kind::GceServiceAccount,
    Kind::GceProjectIamMember,
    Kind::GceBucketIamMember,
    Kind::GceInstanceTemplate,
    Kind::GceInstanceGroupManager,
    Kind::GceDisk,
];

fn strings(v: Option<&Value>) -> BTreeMap<String, String> {
    v.and_then(Value::as_object)
        .map(|o| o.iter().map(|(k, v)| (k.clone(), v.as_str().map_or_else(|| v.to_string(), str::to_string))).collect())
        .unwrap_or_default()
}

/// `[{"kind": "VPC", "name": …, "attrs": {…}, "tags": {…}}, …]` → resources (an unknown kind
/// is the plan's default, as a view without one is).
fn resources(v: Option<&Value>) -> Vec<Resource> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|r| Resource {
                    kind: r.get("kind").and_then(Value::as_str).and_then(|k| KINDS.iter().copied().find(|x| x.as_str() == k)),
                    name: r.get("name").map(|n| n.as_str().map_or_else(|| n.to_string(), str::to_string)).unwrap_or_default(),
                    attrs: strings(r.get("attrs")),
                    tags: strings(r.get("tags")),
                    ..Default::default()
                })
                .collect()
        })
        .unwrap_or_default()
}

fn plan_seed() -> Vec<u8> {
    let tags = serde_json::json!({"KubernetesCluster": "minimal.example.com", "kubernetes.io/cluster/minimal.example.com": "owned"});
    let r = |kind: Kind, name: &str, attrs: Value| serde_json::json!({"kind": kind.as_str(), "name": name, "attrs": attrs, "tags": tags});
    let desired = vec![
        r(Kind::Vpc, "minimal.example.com", serde_json::json!({"cidr": "172.20.0.0/16"})),
        r(Kind::Subnet, "eu-west-1a.minimal.example.com", serde_json::json!({"cidr": "172.20.32.0/19", "zone": "eu-west-1a"})),
        r(Kind::LaunchTemplate, "nodes-eu-west-1a.minimal.example.com", serde_json::json!({"instance_type": "t3.medium", "user_data_sha256": "ab"})),
        r(Kind::AutoscalingGroup, "nodes-eu-west-1a.minimal.example.com", serde_json::json!({"min": "1", "max": "3"})),
        r(Kind::Volume, "a.etcd-main.minimal.example.com", serde_json::json!({"size": "20", "zone": "eu-west-1a"})),
        r(Kind::DnsRecord, "api.minimal.example.com", serde_json::json!({"value": "203.0.113.1"})),
        r(Kind::GceInstanceTemplate, "nodes-a-0123", serde_json::json!({"machine_type": "e2-medium"})),
    ];
    let mut actual = desired.clone();
    actual[2]["attrs"]["instance_type"] = "t3.large".into();
    actual.push(r(Kind::SecurityGroupRule, "old-rule", serde_json::json!({"port": "22"})));
    actual.push(r(Kind::Keyset, "kubernetes-ca", serde_json::json!({})));
    serde_json::to_vec_pretty(&serde_json::json!({"desired": desired, "actual": actual})).expect("json")
}

/// The plan's diff and rendering of anything: every change is for a resource given, deletes are
/// of actual resources only, creates of desired ones only; a set diffed against itself is empty.
#[test]
fn plan_diff() {
    fuzz::run("plan-diff", vec![plan_seed()], fuzz::cases(CI_CASES * 10), |b| {
        let Ok(v) = serde_json::from_slice::<Value>(b) else { return "not JSON" };
        let (desired, actual) = (resources(v.get("desired")), resources(v.get("actual")));
        for scope in [Scope::Apply, Scope::Delete { volumes: false }, Scope::Delete { volumes: true }] {
            let p = plan::diff(&desired, &actual, scope);
            let _ = (p.render(true), p.render(false), p.counts());
            for c in &p.changes {
                match c.action {
                    Action::Delete => assert!(actual.iter().any(|a| a.kind() == c.kind && a.name == c.name), "deletes what is not there: {c:?}"),
                    _ => assert!(desired.iter().any(|d| d.kind() == c.kind && d.name == c.name), "creates or updates what is not desired: {c:?}"),
                }
            }
        }
        let unique: std::collections::BTreeSet<_> = desired.iter().map(Resource::key).collect();
        if unique.len() == desired.len() {
            let same = plan::diff(&desired, &desired, Scope::Apply);
            assert!(same.is_empty(), "desired diffed against itself is not empty: {:?}", same.changes);
        }
        if desired.is_empty() && actual.is_empty() {
            "empty"
        } else {
            "diffed"
        }
    });
}
