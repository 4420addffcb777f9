//! The Terraform target (`keelson apply --target terraform`): golden files for the bundled examples plus structural checks
//! (valid JSON, every resource/data/local/file reference resolves, valid names).
//! Re-bless with `KEELSON_BLESS=1 cargo test --workspace --all-targets --test apply_terraform`.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use support::options;

use base::Tree;
use cloud_resources::terraform::{structural_problems, MAIN_FILE};
use serde_json::Value;

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples").join(name)
}

/// What `keelson apply --target terraform` renders for a spec (before the state store holds a CA),
/// or the error it stops with.
fn try_render(spec: &Path) -> Result<Tree, String> {
    let docs = spec_compiler::load::load_spec(spec).map_err(|e| e.to_string())?;
    let compiled = spec_compiler::compile(&docs, &options()).map_err(|e| e.to_string())?;
    let model = cloud_resources::model::build(&docs, &compiled).map_err(|e| e.to_string())?;
    cloud_resources::terraform::render(&model).map_err(|e| e.to_string())
}

fn render(spec: &Path) -> Tree {
    try_render(spec).unwrap_or_else(|e| panic!("{}: {e}", spec.display()))
}

fn resources<'a>(root: &'a Value, ty: &str) -> BTreeMap<&'a str, &'a Value> {
    root["resource"][ty].as_object().map(|o| o.iter().map(|(k, v)| (k.as_str(), v)).collect()).unwrap_or_default()
}

fn check(example_file: &str) -> Value {
    let name = example_file.trim_end_matches(".yaml");
    let tree = render(&example(example_file));
    let problems = structural_problems(&tree);
    assert!(problems.is_empty(), "{example_file}: {problems:#?}");
    testkit::golden::check_tree(example_file, &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden-terraform").join(name), &tree.files);
    // User-data files are the compiled boot scripts, each under 16 KB.
    for (rel, bytes) in &tree.files {
        if rel.starts_with("data/") {
            assert!(bytes.len() < 16 * 1024, "{rel}: {} bytes", bytes.len());
            assert!(bytes.starts_with(b"#!/bin/bash"), "{rel}");
        }
    }
    serde_json::from_slice(&tree.files[MAIN_FILE]).expect("json")
}

#[test]
fn minimal_terraform() {
    let root = check("minimal.yaml");
    assert_eq!(resources(&root, "aws_launch_template").len(), 2);
    assert_eq!(resources(&root, "aws_autoscaling_group").len(), 2);
    assert_eq!(resources(&root, "aws_ebs_volume").len(), 2);
    let lt = resources(&root, "aws_launch_template")["nodes-us-east-1a-minimal-k8s-example-com"];
    assert_eq!(lt["metadata_options"]["http_tokens"], "required");
    assert_eq!(lt["metadata_options"]["http_put_response_hop_limit"], 1);
    let vol = resources(&root, "aws_ebs_volume")["a-etcd-main-minimal-k8s-example-com"];
    assert_eq!(vol["size"], 20);
    assert_eq!(vol["type"], "gp3");
    assert_eq!(vol["tags"]["k8s.io/etcd/main"], "a/a");
}

#[test]
fn ha_terraform() {
    let root = check("ha.yaml");
    assert_eq!(resources(&root, "aws_subnet").len(), 3);
    assert_eq!(resources(&root, "aws_autoscaling_group").len(), 4);
    let vols = resources(&root, "aws_ebs_volume");
    assert_eq!(vols.len(), 6, "3 members × main/events");
    assert_eq!(vols["b-etcd-events-ha-k8s-example-com"]["availability_zone"], "eu-west-1b");
    assert_eq!(vols["b-etcd-events-ha-k8s-example-com"]["tags"]["k8s.io/etcd/events"], "b/a,b,c");
    let nodes = resources(&root, "aws_autoscaling_group")["nodes-ha-k8s-example-com"];
    assert_eq!(nodes["vpc_zone_identifier"].as_array().map(Vec::len), Some(3));
    assert!(nodes.get("target_group_arns").is_none());
    // Public topology (kubenet's routes need one route table): no NAT gateways, the public table
    // routes to the internet gateway and serves the three subnets.
    assert!(resources(&root, "aws_nat_gateway").is_empty());
    let routes = resources(&root, "aws_route");
    assert_eq!(routes["ha-k8s-example-com-0-0-0-0-0"]["gateway_id"], "${aws_internet_gateway.ha-k8s-example-com.id}");
    assert_eq!(resources(&root, "aws_route_table").len(), 1);
    assert_eq!(resources(&root, "aws_route_table_association").len(), 3);
    // The API load balancer and the control plane registered with it.
    let lb = resources(&root, "aws_lb")["api-ha-k8s-example-com"];
    assert_eq!(lb["load_balancer_type"], "network");
    assert!(lb["name"].as_str().is_some_and(|n| n.len() <= 32));
    let cp = resources(&root, "aws_autoscaling_group")["control-plane-eu-west-1a-ha-k8s-example-com"];
    assert_eq!(cp["target_group_arns"][0], "${aws_lb_target_group.tcp-ha-k8s-example-com-d9eogn.arn}");
    // Firewall: nodes reach the control plane on every port but etcd's, never on everything; the
    // control plane reaches nodes on everything.
    let masters = "${aws_security_group.masters-ha-k8s-example-com.id}";
    let nodes = "${aws_security_group.nodes-ha-k8s-example-com.id}";
    let rules = resources(&root, "aws_security_group_rule");
    let between = |dest: &str, src: &str| -> Vec<(String, i64, i64)> {
        let mut v: Vec<(String, i64, i64)> = rules
            .values()
            .filter(|r| r["security_group_id"] == dest && r["source_security_group_id"] == src)
            .map(|r| (r["protocol"].as_str().unwrap_or_default().to_string(), r["from_port"].as_i64().unwrap_or(0), r["to_port"].as_i64().unwrap_or(0)))
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        between(masters, nodes),
        [("tcp".to_string(), 1, 2379), ("tcp".to_string(), 2382, 4000), ("tcp".to_string(), 4003, 65535), ("udp".to_string(), 1, 65535)]
    );
    assert_eq!(between(nodes, masters), [("-1".to_string(), 0, 0)]);
    assert_eq!(between(masters, masters), [("-1".to_string(), 0, 0)]);
    // IAM: the launch templates use the profiles Terraform creates.
    assert_eq!(resources(&root, "aws_iam_role").len(), 2);
    let lt = resources(&root, "aws_launch_template")["nodes-ha-k8s-example-com"];
    assert_eq!(lt["iam_instance_profile"]["name"], "${aws_iam_instance_profile.nodes-ha-k8s-example-com.id}");
}

/// Private topology: the machines' subnets route out through a NAT gateway in their zone's Utility
/// subnet, the Utility subnets through the internet gateway, and the API load balancer sits in the
/// Utility subnets.
#[test]
fn private_terraform() {
    let root = check("private.yaml");
    let subnets = resources(&root, "aws_subnet");
    assert_eq!(subnets.len(), 4, "{:?}", subnets.keys());
    let nats = resources(&root, "aws_nat_gateway");
    assert_eq!(nats.len(), 2, "one NAT gateway per zone: {:?}", nats.keys());
    for nat in nats.values() {
        let subnet = nat["subnet_id"].as_str().unwrap_or_default();
        assert!(subnet.contains("utility-eu-west-1"), "a NAT gateway lives in a Utility subnet: {subnet}");
    }
    let lb = resources(&root, "aws_lb")["api-private-k8s-example-com"];
    let lb_subnets: Vec<&str> = lb["subnets"].as_array().map(|m| m.iter().filter_map(|s| s.as_str()).collect()).unwrap_or_default();
    assert_eq!(lb_subnets.len(), 2, "{lb}");
    assert!(lb_subnets.iter().all(|s| s.contains("utility-eu-west-1")), "{lb_subnets:?}");
    let nodes = resources(&root, "aws_autoscaling_group")["nodes-private-k8s-example-com"];
    let zones: Vec<&str> = nodes["vpc_zone_identifier"].as_array().map(|z| z.iter().filter_map(|s| s.as_str()).collect()).unwrap_or_default();
    assert_eq!(zones.len(), 2, "{nodes}");
    assert!(zones.iter().all(|s| !s.contains("utility")), "workers in the Private subnets: {zones:?}");
}

#[test]
fn gce_terraform() {
    let root = check("gce.yaml");
    // Three control planes in three zones, one worker group: a template and a MIG each.
    assert_eq!(resources(&root, "google_compute_instance_template").len(), 4);
    let migs = resources(&root, "google_compute_instance_group_manager");
    assert_eq!(migs.len(), 4);
    let nodes = migs["b-nodes-europe-west1-b-gce-k8s-example-com"];
    assert_eq!(nodes["zone"], "europe-west1-b");
    assert_eq!(nodes["target_size"], 2);
    assert_eq!(migs["c-control-plane-europe-west1-c-gce-k8s-example-com"]["zone"], "europe-west1-c");
    // One disk per member of each etcd cluster, in its member's zone, labelled as kOps labels it.
    let disks = resources(&root, "google_compute_disk");
    assert_eq!(disks.len(), 6);
    let c = disks["c-etcd-main-gce-k8s-example-com"];
    assert_eq!(c["zone"], "europe-west1-c");
    assert_eq!(c["labels"]["k8s-io-etcd-main"], "c-2fb-2cc-2cd");
    assert!(resources(&root, "aws_vpc").is_empty());
    // Pods reach nodes on everything, control planes on everything but etcd's ports (as nodes do).
    let fw = resources(&root, "google_compute_firewall");
    let (master, node) = ("gce-k8s-example-com-k8s-io-role-master", "gce-k8s-example-com-k8s-io-role-node");
    let from_pods: Vec<&Value> = fw.values().copied().filter(|r| r["source_ranges"] == serde_json::json!(["100.96.0.0/11"])).collect();
    assert_eq!(from_pods.len(), 2, "{from_pods:#?}");
    for r in &from_pods {
        let targets = r["target_tags"].as_array().cloned().unwrap_or_default();
        assert_eq!(targets.len(), 1, "one role a rule: {r:#}");
        let tcp = r["allow"].as_array().into_iter().flatten().find(|a| a["protocol"] == "tcp").expect("tcp");
        let ports: Vec<&str> = tcp["ports"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        if targets[0] == master {
            assert_eq!(ports, ["1-2379", "2382-4000", "4003-65535"], "{r:#}");
        } else {
            assert_eq!(targets[0], node);
            assert!(ports.is_empty(), "every port of a node: {r:#}");
        }
        let protocols: Vec<&str> = r["allow"].as_array().into_iter().flatten().filter_map(|a| a["protocol"].as_str()).collect();
        assert_eq!(protocols, ["tcp", "udp", "icmp", "esp", "ah", "sctp"]);
    }
    for r in fw.values() {
        let to_master = r["target_tags"].as_array().is_some_and(|t| t.iter().any(|t| t == master));
        let unrestricted_tcp =
            r["allow"].as_array().into_iter().flatten().any(|a| a["protocol"] == "tcp" && a["ports"].as_array().is_none_or(|p| p.is_empty()));
        if to_master && unrestricted_tcp {
            assert_eq!(r["source_tags"], serde_json::json!([master]), "only control planes reach a control plane's etcd: {r:#}");
        }
    }
}

#[test]
fn dns_zone_renders_records_with_the_placeholder_that_resolve() {
    let text = std::fs::read_to_string(example("minimal.yaml")).expect("example");
    let text = text.replace("  cloudProvider: aws\n", "  cloudProvider: aws\n  dnsZone: example.com\n");
    let spec = tempfile::NamedTempFile::new().expect("tmp");
    std::fs::write(spec.path(), text).expect("write");
    let tree = render(spec.path());
    assert!(structural_problems(&tree).is_empty(), "{:?}", structural_problems(&tree));
    let root: Value = serde_json::from_slice(&tree.files[MAIN_FILE]).expect("json");
    let records = resources(&root, "aws_route53_record");
    // api, api.internal, kops-controller.internal (where workers join) and the one etcd member.
    assert_eq!(records.len(), 4 + 1, "{records:?}");
    assert!(records.values().any(|r| r["name"] == "kops-controller.internal.minimal.k8s.example.com"), "{records:?}");
    for r in records.values() {
        assert_eq!(r["records"][0], "203.0.113.123");
        assert_eq!(r["ttl"], 60);
    }
    assert_eq!(root["data"]["aws_route53_zone"]["dns-zone"]["name"], "example.com");
}

#[test]
fn load_balancer_aliases_the_api_names_it_serves() {
    let text = std::fs::read_to_string(example("ha.yaml")).expect("example");
    let text = text.replace("  cloudProvider: aws\n", "  cloudProvider: aws\n  dnsZone: example.com\n");
    let with_internal = text.replace("      class: Network\n", "      class: Network\n      useForInternalApi: true\n");
    for (spec_text, internal_alias) in [(text, false), (with_internal, true)] {
        let spec = tempfile::NamedTempFile::new().expect("tmp");
        std::fs::write(spec.path(), spec_text).expect("write");
        let tree = render(spec.path());
        assert!(structural_problems(&tree).is_empty(), "{:?}", structural_problems(&tree));
        let root: Value = serde_json::from_slice(&tree.files[MAIN_FILE]).expect("json");
        let records = resources(&root, "aws_route53_record");
        let api = records["api-ha-k8s-example-com"];
        assert_eq!(api["alias"]["name"], "${aws_lb.api-ha-k8s-example-com.dns_name}");
        assert!(api.get("records").is_none());
        let internal = records["api-internal-ha-k8s-example-com"];
        assert_eq!(internal.get("alias").is_some(), internal_alias, "{internal}");
        assert_eq!(internal.get("records").is_some(), !internal_alias, "{internal}");
    }
    // An internal balancer cannot serve the internal name (no hairpinning), as in kOps.
    let text = std::fs::read_to_string(example("ha.yaml")).expect("example");
    let bad = text.replace("      type: Public\n      class: Network\n", "      type: Internal\n      class: Network\n      useForInternalApi: true\n");
    let spec = tempfile::NamedTempFile::new().expect("tmp");
    std::fs::write(spec.path(), bad).expect("write");
    let stderr = try_render(spec.path()).expect_err("an internal balancer cannot serve api.internal");
    assert!(stderr.contains("spec.api.loadBalancer.useForInternalApi"), "{stderr}");
}

#[test]
fn gce_etcd_labels_are_kops_encoded_and_a_label_too_long_is_refused_not_cut() {
    let text = std::fs::read_to_string(example("gce.yaml")).expect("example");
    // A member name with a dash: kOps escapes it (`-2d`), or its decoder would read an escape there.
    let dashed = text.replace("    etcdMembers:\n    - name: b\n", "    etcdMembers:\n    - name: a-1\n");
    let spec = tempfile::NamedTempFile::new().expect("tmp");
    std::fs::write(spec.path(), &dashed).expect("write");
    let root: Value = serde_json::from_slice(&render(spec.path()).files[MAIN_FILE]).expect("json");
    let disks = resources(&root, "google_compute_disk");
    assert!(disks.values().any(|d| d["labels"]["k8s-io-etcd-main"] == "a-2d1-2fa-2d1-2cc-2cd"), "{disks:?}");
    // `<member>/<members>` encoded: 26 + 3 + 26 + 8 (`-2cc-2cd`) characters fit exactly; one more
    // does not, and is an error naming the field, not a label cut short.
    for (len, fits) in [(26, true), (27, false)] {
        let long = text.replace("    etcdMembers:\n    - name: b\n", &format!("    etcdMembers:\n    - name: {}\n", "m".repeat(len)));
        std::fs::write(spec.path(), long).expect("write");
        assert_eq!(try_render(spec.path()).is_ok(), fits, "member name of {len} characters");
    }
    let e = try_render(spec.path()).map(|_| ()).expect_err("too long for a label");
    assert!(e.contains("spec.etcdClusters[main].etcdMembers") && e.contains("63"), "{e}");
}

#[test]
fn an_additional_security_group_must_be_an_id_and_the_error_names_the_field() {
    let text = std::fs::read_to_string(example("minimal.yaml")).expect("example");
    let bad = text.replacen("  machineType: t3.medium\n", "  machineType: t3.medium\n  additionalSecurityGroups: [sg-0123456789abcdef0, web]\n", 1);
    assert_ne!(bad, text, "the example has a t3.medium group");
    let spec = tempfile::NamedTempFile::new().expect("tmp");
    std::fs::write(spec.path(), bad).expect("write");
    let e = try_render(spec.path()).map(|_| ()).expect_err("a name is not an id");
    assert!(e.contains("spec.additionalSecurityGroups[1]") && e.contains("\"web\""), "{e}");
}

/// The model of a spec (as `try_render` builds it).
fn model_of(spec: &Path) -> cloud_resources::model::ClusterModel {
    let docs = spec_compiler::load::load_spec(spec).expect("spec");
    let compiled = spec_compiler::compile(&docs, &options()).expect("compile");
    cloud_resources::model::build(&docs, &compiled).expect("model")
}

/// Every IAM role's inline policy as Terraform puts it (the data source's zone id replaced by
/// `zone`, as Terraform evaluates it) and as the direct target puts it once it resolved `zone`:
/// the same documents, so `keelson apply` after a Terraform apply changes no policy.
fn terraform_and_direct_policies(spec: &Path, zone: &str) -> Vec<(String, Value, Value)> {
    use cloud_resources::aws::AwsTask;
    let model = model_of(spec);
    let root: Value = serde_json::from_slice(&render(spec).files[MAIN_FILE]).expect("json");
    let terraform = resources(&root, "aws_iam_role_policy");
    let mut out = Vec::new();
    for role in &model.tasks.iam_roles {
        let mut direct = role.clone();
        direct.resolve(&cloud_resources::aws::Resolved { zone: Some(zone.to_string()), ..Default::default() });
        let direct = direct.policy.resolved().unwrap_or(Value::Null);
        let tf = terraform
            .iter()
            .find(|(_, b)| b["name"] == role.name.as_str())
            .map(|(_, b)| {
                let text = b["policy"].as_str().expect("policy string").replace("${data.aws_route53_zone.dns-zone.zone_id}", zone);
                serde_json::from_str(&text).expect("policy JSON")
            })
            .unwrap_or(Value::Null);
        out.push((role.name.clone(), tf, direct));
    }
    out
}

#[test]
fn terraform_and_direct_put_the_same_policies() {
    let dir = tempfile::tempdir().expect("tempdir");
    let named = dir.path().join("named-zone.yaml");
    let text = std::fs::read_to_string(example("minimal.yaml")).expect("example");
    assert!(text.contains("  configBase:"), "examples/minimal.yaml changed shape: update this test");
    std::fs::write(&named, text.replacen("  configBase:", "  dnsZone: example.com\n  configBase:", 1)).expect("write");
    let by_id = dir.path().join("zone-id.yaml");
    std::fs::write(&by_id, text.replacen("  configBase:", "  dnsZone: Z0RESOLVED0ZONE\n  configBase:", 1)).expect("write");
    for spec in [example("minimal.yaml"), example("ha.yaml"), example("gossip.yaml"), named, by_id] {
        let policies = terraform_and_direct_policies(&spec, "Z0RESOLVED0ZONE");
        assert!(policies.len() >= 2, "{}: {policies:?}", spec.display());
        for (role, tf, direct) in policies {
            assert_eq!(tf, direct, "{}: {role}: Terraform's policy is not the direct target's", spec.display());
            let text = direct.to_string();
            if role.starts_with("masters.") {
                let gossip = spec.ends_with("gossip.yaml");
                assert_eq!(text.contains("route53:ChangeResourceRecordSets"), !gossip, "{}: {text}", spec.display());
                assert_eq!(text.contains("route53:ListHostedZonesByName"), !gossip && !spec.ends_with("zone-id.yaml"), "{}: {text}", spec.display());
                assert!(text.contains("s3:AbortMultipartUpload"), "{}: {text}", spec.display());
            }
        }
    }
}

/// `sshKeyName`, `rootVolumeEncryptionKey`, `externalLoadBalancers` and `instanceProtection` render
/// to the same task fields Terraform and the direct target read: the launch template's `key_name`
/// and root volume `kms_key_id`, the group's `target_group_arns` (the API's own and the given
/// ARN), `load_balancers` and `protect_from_scale_in`. An empty `sshKeyName` is no key pair.
#[test]
fn key_pair_kms_key_external_load_balancers_and_protection_render() {
    let text = std::fs::read_to_string(example("minimal.yaml")).expect("example");
    let arn = "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/web/0123456789abcdef";
    let key = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab";
    let edited = |ssh: &str| {
        text.replace("  cloudProvider: aws\n", &format!("  cloudProvider: aws\n  sshKeyName: {ssh}\n")).replacen(
            "  machineType: t3.medium\n",
            &format!("  machineType: t3.medium\n  rootVolumeEncryptionKey: {key}\n  instanceProtection: true\n  externalLoadBalancers:\n  - targetGroupArn: {arn}\n  - loadBalancerName: legacy-web\n"),
            1,
        )
    };
    let spec = tempfile::NamedTempFile::new().expect("tmp");
    std::fs::write(spec.path(), edited("ops-key")).expect("write");
    let tree = render(spec.path());
    assert!(structural_problems(&tree).is_empty(), "{:#?}", structural_problems(&tree));
    let root: Value = serde_json::from_slice(&tree.files[MAIN_FILE]).expect("json");
    let lts = resources(&root, "aws_launch_template");
    let nodes = lts.iter().find(|(k, _)| k.starts_with("nodes")).map(|(_, v)| *v).expect("nodes' template");
    assert_eq!(nodes["key_name"], "ops-key");
    assert_eq!(nodes["block_device_mappings"][0]["ebs"]["kms_key_id"], key);
    assert_eq!(nodes["block_device_mappings"][0]["ebs"]["encrypted"], true);
    let cp = lts.iter().find(|(k, _)| k.starts_with("control")).map(|(_, v)| *v).expect("control plane's template");
    assert_eq!(cp["key_name"], "ops-key");
    assert!(cp["block_device_mappings"][0]["ebs"].get("kms_key_id").is_none());
    let asgs = resources(&root, "aws_autoscaling_group");
    let g = asgs.iter().find(|(k, _)| k.starts_with("nodes")).map(|(_, v)| *v).expect("nodes' group");
    assert_eq!(g["target_group_arns"], serde_json::json!([arn]));
    assert_eq!(g["load_balancers"], serde_json::json!(["legacy-web"]));
    assert_eq!(g["protect_from_scale_in"], true);
    let cp = asgs.iter().find(|(k, _)| k.starts_with("control")).map(|(_, v)| *v).expect("control plane's group");
    assert!(cp.get("load_balancers").is_none() && cp.get("protect_from_scale_in").is_none());

    std::fs::write(spec.path(), edited("\"\"")).expect("write");
    let root: Value = serde_json::from_slice(&render(spec.path()).files[MAIN_FILE]).expect("json");
    assert!(resources(&root, "aws_launch_template").values().all(|lt| lt.get("key_name").is_none()), "an empty sshKeyName is no key pair");
}
