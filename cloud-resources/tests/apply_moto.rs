//! Apply and delete (the AWS direct target) against a real moto server started by each test
//! (127.0.0.1 only); the `keelson apply` command itself is tested in keelson-cli's `apply_cli`.
//! Needs moto (`$KEELSON_PYTHON`, default `.venv/bin/python`); fails with a message saying so.

mod moto;

use std::collections::BTreeMap;

use aws_sdk_ec2::types::Filter;
use aws_smithy_runtime_api::client::interceptors::SharedInterceptor;
use base::StateStore;
use base64::Engine as _;
use cloud_resources::aws::{write_calls, AwsTarget};
use cloud_resources::model::ClusterModel;
use cloud_resources::plan::{Action, Kind};
use moto::{apply_once, store, Moto, BUCKET, CLUSTER};

fn cluster_filter() -> Filter {
    Filter::builder().name("tag:KubernetesCluster").values(CLUSTER).build()
}

fn model_of(docs: &keelson_api::Documents) -> (ClusterModel, spec_compiler::Compiled) {
    moto::prepare(docs, &moto::compile_options(), true)
}

/// The model as `keelson apply --yes` builds it: the PKI first, the cluster CA pinned into every
/// NodeupConfig.
async fn model_with_pinned_ca(docs: &keelson_api::Documents, s: &StateStore, m: &ClusterModel) -> (ClusterModel, spec_compiler::Compiled) {
    cloud_resources::state::ensure_pki(s, &m.etcd_clusters, m.encryption_config).await.expect("pki");
    let issued = s.get("pki/issued/kubernetes-ca/keyset.yaml").await.expect("read CA").expect("CA");
    let mut options = moto::compile_options();
    options.cas.insert("kubernetes-ca".into(), base::pki::parse_keyset_cert("kubernetes-ca", &issued).expect("CA certificate"));
    moto::prepare(docs, &options, true)
}

/// Counts of what is tagged for the cluster: (vpcs, subnets, sgs, lts, asgs, volumes).
async fn inventory(t: &AwsTarget) -> BTreeMap<&'static str, usize> {
    let e = &t.ec2;
    let vpcs = e.describe_vpcs().filters(cluster_filter()).send().await.expect("vpcs").vpcs().len();
    let subnets = e.describe_subnets().filters(cluster_filter()).send().await.expect("subnets").subnets().len();
    let sgs = e.describe_security_groups().filters(cluster_filter()).send().await.expect("sgs").security_groups().len();
    let lts = e.describe_launch_templates().filters(cluster_filter()).send().await.expect("lts").launch_templates().len();
    let asgs = t
        .asg
        .describe_auto_scaling_groups()
        .send()
        .await
        .expect("asgs")
        .auto_scaling_groups()
        .iter()
        .filter(|g| g.tags().iter().any(|t| t.key() == Some("KubernetesCluster") && t.value() == Some(CLUSTER)))
        .count();
    let vols = e
        .describe_volumes()
        .filters(cluster_filter())
        .filters(Filter::builder().name("tag-key").values("k8s.io/etcd/main").build())
        .send()
        .await
        .expect("volumes")
        .volumes()
        .len()
        + e.describe_volumes()
            .filters(cluster_filter())
            .filters(Filter::builder().name("tag-key").values("k8s.io/etcd/events").build())
            .send()
            .await
            .expect("volumes")
            .volumes()
            .len();
    let running = e
        .describe_instances()
        .filters(cluster_filter())
        .filters(Filter::builder().name("instance-state-name").values("pending").values("running").build())
        .send()
        .await
        .expect("instances")
        .reservations()
        .iter()
        .map(|r| r.instances().len())
        .sum();
    BTreeMap::from([
        ("vpcs", vpcs),
        ("subnets", subnets),
        ("security_groups", sgs),
        ("launch_templates", lts),
        ("autoscaling_groups", asgs),
        ("etcd_volumes", vols),
        ("running_instances", running),
    ])
}

fn expected_inventory() -> BTreeMap<&'static str, usize> {
    BTreeMap::from([
        ("vpcs", 1),
        ("subnets", 1),
        ("security_groups", 2),
        ("launch_templates", 2),
        ("autoscaling_groups", 2),
        ("etcd_volumes", 2),
        ("running_instances", 3),
    ])
}

/// An object of the test bucket (panics when missing).
async fn s3_object(t: &AwsTarget, key: &str) -> Vec<u8> {
    t.s3.get_object().bucket(BUCKET).key(key).send().await.unwrap_or_else(|e| panic!("{key}: {e:?}")).body.collect().await.expect("body").into_bytes().to_vec()
}

/// The data of a launch template's latest version.
async fn latest_lt_data(t: &AwsTarget, name: &str) -> aws_sdk_ec2::types::ResponseLaunchTemplateData {
    let v = t.ec2.describe_launch_template_versions().launch_template_name(name).versions("$Latest").send().await.expect("versions");
    v.launch_template_versions()[0].launch_template_data().expect("data").clone()
}

async fn dns_records(t: &AwsTarget) -> BTreeMap<String, Vec<String>> {
    use cloud::Dns as _;
    let zone = t.dns.find_zone(Some(moto::ZONE), CLUSTER).await.expect("zone");
    t.dns.list_records(&zone, CLUSTER).await.expect("records").into_iter().filter(|r| r.rtype == "A").map(|r| (r.name, r.values)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_from_nothing_creates_what_the_spec_needs_and_reapply_changes_nothing() {
    let moto = Moto::start();
    let ami = moto.fixtures().await;
    let docs = moto::spec(&ami, |t| t);
    let (m, _) = model_of(&docs);
    let t = moto.target(&[]).await;

    // Plan only: reads, no writes.
    let s = store(&t, &m);
    let planned = cloud_resources::plan_apply(&t, &m, &s).await.expect("plan");
    assert!(write_calls(&t.counter).is_empty(), "planning wrote: {:?}", write_calls(&t.counter));
    let (create, change, delete) = planned.plan.counts();
    assert_eq!((change, delete), (0, 0));
    let text = planned.plan.render(false);
    assert!(text.contains("+ LaunchTemplate nodes-us-east-1a.minimal.k8s.example.com"), "{text}");
    assert!(text.contains(&format!("Plan: {create} to create, 0 to change, 0 to delete.")), "{text}");
    assert_eq!(inventory(&t).await.values().sum::<usize>(), 0, "plan changed nothing");

    let (m, compiled) = model_with_pinned_ca(&docs, &s, &m).await;
    apply_once(&t, &m).await.expect("apply");
    assert_eq!(inventory(&t).await, expected_inventory());

    // Launch templates: IMDSv2 with the spec's hop limit, root volume, SG, profile, user-data.
    for lt in &m.tasks.launch_templates {
        let v = t.ec2.describe_launch_template_versions().launch_template_name(&lt.name).versions("$Latest").send().await.expect("lt versions");
        let data = v.launch_template_versions()[0].launch_template_data().expect("data");
        assert_eq!(data.image_id(), Some(ami.as_str()));
        let md = data.metadata_options().expect("metadata options");
        assert_eq!(md.http_tokens().map(|t| t.as_str()), Some("required"));
        // Hop limit 1 everywhere: the instance's credentials reach the host network only, never a pod.
        assert_eq!(md.http_put_response_hop_limit(), Some(1), "{}", lt.name);
        assert_eq!(data.iam_instance_profile().and_then(|p| p.name()), Some(lt.instance_profile.as_str()));
        assert_eq!(data.security_group_ids().len(), 1);
        let ebs = data.block_device_mappings()[0].ebs().expect("root ebs");
        assert_eq!((ebs.volume_size(), ebs.volume_type().map(|t| t.as_str())), (Some(64), Some("gp3")));
        // User-data: < 16 KB, the compiled script, booting this group's own nodeup config.
        let ud = base64::engine::general_purpose::STANDARD.decode(data.user_data().expect("user data")).expect("base64");
        assert!(ud.len() < 16 * 1024, "{}: user-data {} bytes", lt.name, ud.len());
        assert_eq!(ud, compiled.tree.files[&format!("userdata/{}.sh", lt.group)]);
        let script = String::from_utf8(ud).expect("utf8");
        let boot_yaml = script
            .split("<< '__KEELSON_BOOTCONFIG_EOF__'\n")
            .nth(1)
            .and_then(|rest| rest.split("__KEELSON_BOOTCONFIG_EOF__").next())
            .expect("boot config heredoc");
        let boot: keelson_api::nodeup::BootConfig = serde_yaml_ng::from_str(boot_yaml).expect("BootConfig parses");
        assert_eq!(boot.instance_group_name, lt.group);
        assert_eq!(boot.cluster_name, CLUSTER);
        assert_eq!(boot.config_base.to_string(), m.config_base);
        let role_dir = if lt.group.starts_with("control-plane") { "control-plane" } else { "node" };
        let nodeup =
            t.s3.get_object()
                .bucket(BUCKET)
                .key(format!("{CLUSTER}/igconfig/{role_dir}/{}/nodeupconfig.yaml", lt.group))
                .send()
                .await
                .expect("nodeup config in the state store")
                .body
                .collect()
                .await
                .expect("body")
                .into_bytes();
        assert_eq!(boot.nodeup_config_hash, spec_compiler::nodeup_config_hash(&nodeup), "{}: pinned hash", lt.group);
    }

    // Autoscaling groups: sizes, subnets and propagated tags.
    let asgs = t.asg.describe_auto_scaling_groups().send().await.expect("asgs");
    for g in asgs.auto_scaling_groups() {
        let name = g.auto_scaling_group_name().unwrap_or_default();
        let tags: BTreeMap<&str, (&str, bool)> =
            g.tags().iter().map(|t| (t.key().unwrap_or(""), (t.value().unwrap_or(""), t.propagate_at_launch().unwrap_or(false)))).collect();
        assert_eq!(tags["KubernetesCluster"], (CLUSTER, true), "{name}");
        assert_eq!(tags[format!("kubernetes.io/cluster/{CLUSTER}").as_str()], ("owned", true));
        if name.starts_with("nodes") {
            assert_eq!((g.min_size(), g.max_size()), (Some(2), Some(4)));
            assert_eq!(tags["k8s.io/role/node"], ("1", true));
            assert_eq!(tags["kops.k8s.io/instancegroup"], ("nodes-us-east-1a", true));
            assert_eq!(tags["k8s.io/cluster-autoscaler/node-template/label/workload"], ("general", true));
        } else {
            assert_eq!((g.min_size(), g.max_size()), (Some(1), Some(1)));
            assert_eq!(tags["k8s.io/role/control-plane"], ("1", true));
        }
    }

    // etcd volumes: docs/design.md tags, 20 GiB gp3, encrypted as the spec says, in the member's zone.
    let vols = t.ec2.describe_volumes().filters(cluster_filter()).send().await.expect("volumes");
    let etcd: Vec<_> = vols.volumes().iter().filter(|v| v.tags().iter().any(|t| t.key().unwrap_or("").starts_with("k8s.io/etcd/"))).collect();
    assert_eq!(etcd.len(), 2);
    for v in etcd {
        let tags: BTreeMap<&str, &str> = v.tags().iter().map(|t| (t.key().unwrap_or(""), t.value().unwrap_or(""))).collect();
        let name = tags["Name"];
        let etcd_cluster = if name.contains("etcd-events") { "events" } else { "main" };
        assert_eq!(name, format!("a.etcd-{etcd_cluster}.{CLUSTER}"));
        assert_eq!(tags[format!("k8s.io/etcd/{etcd_cluster}").as_str()], "a/a");
        assert_eq!(tags["k8s.io/role/master"], "1");
        assert_eq!(tags["k8s.io/role/control-plane"], "1");
        assert_eq!(tags["KubernetesCluster"], CLUSTER);
        assert_eq!(v.size(), Some(20));
        assert_eq!(v.volume_type().map(|t| t.as_str()), Some("gp3"));
        assert_eq!(v.encrypted(), Some(true));
        assert_eq!(v.availability_zone(), Some("us-east-1a"));
    }

    // Security groups: intra-cluster traffic, SSH, and the API on the control plane.
    let sgs = t.ec2.describe_security_groups().filters(cluster_filter()).send().await.expect("sgs");
    let masters = sgs.security_groups().iter().find(|g| g.group_name() == Some("masters.minimal.k8s.example.com")).expect("masters sg");
    let ports: Vec<(Option<i32>, usize)> =
        masters.ip_permissions().iter().map(|p| (p.from_port(), p.ip_ranges().len() + p.user_id_group_pairs().len())).collect();
    assert!(ports.iter().any(|(p, _)| *p == Some(443)), "{ports:?}");
    assert!(ports.iter().any(|(p, _)| *p == Some(22)), "{ports:?}");

    // DNS with the placeholder address.
    let records = dns_records(&t).await;
    for name in [format!("api.{CLUSTER}"), format!("api.internal.{CLUSTER}"), format!("etcd-a.internal.{CLUSTER}"), format!("etcd-events-a.internal.{CLUSTER}")]
    {
        assert_eq!(records.get(&name), Some(&vec!["203.0.113.123".to_string()]), "{name}: {records:?}");
    }

    // State store: completed spec, node configs, CAs.
    for key in ["cluster-completed.spec", "pki/private/kubernetes-ca/keyset.yaml"] {
        t.s3.head_object().bucket(BUCKET).key(format!("{CLUSTER}/{key}")).send().await.unwrap_or_else(|e| panic!("{key}: {e:?}"));
    }

    // Re-apply: no changes, no write calls.
    let t2 = moto.target(&[]).await;
    let s2 = store(&t2, &m);
    let mut again = cloud_resources::plan_apply(&t2, &m, &s2).await.expect("plan again");
    assert!(again.plan.is_empty(), "second plan:\n{}", again.plan.render(false));
    assert!(again.plan.render(false).contains("No changes."));
    cloud_resources::execute(&t2, &m, &s2, &mut again).await.expect("apply again");
    assert!(write_calls(&t2.counter).is_empty(), "re-apply wrote: {:?}", write_calls(&t2.counter));
    assert!(t2.counter.total_calls() > 0);
}

/// Every ingress rule of the cluster's security groups as AWS reports it, one line per rule:
/// `<group>: <protocol> <from>-<to> from <cidr or group name>` (`-1` protocol is `all`).
async fn ingress_rules(t: &AwsTarget) -> Vec<String> {
    let sgs = t.ec2.describe_security_groups().filters(cluster_filter()).send().await.expect("sgs");
    let names: BTreeMap<&str, &str> = sgs.security_groups().iter().filter_map(|g| Some((g.group_id()?, g.group_name()?))).collect();
    let mut out = Vec::new();
    for g in sgs.security_groups() {
        let group = g.group_name().unwrap_or_default();
        for p in g.ip_permissions() {
            let proto = match p.ip_protocol().unwrap_or_default() {
                "-1" => "all".to_string(),
                other => other.to_string(),
            };
            let ports = match (proto.as_str(), p.from_port(), p.to_port()) {
                ("tcp" | "udp", Some(a), Some(b)) => format!(" {a}-{b}"),
                _ => String::new(),
            };
            for r in p.ip_ranges() {
                out.push(format!("{group}: {proto}{ports} from {}", r.cidr_ip().unwrap_or_default()));
            }
            for u in p.user_id_group_pairs() {
                let source = u.group_id().and_then(|id| names.get(id).copied()).unwrap_or("?");
                out.push(format!("{group}: {proto}{ports} from {source}"));
            }
        }
    }
    out.sort();
    out
}

/// kOps' firewall on AWS, rule by rule: control planes take everything from control planes, nodes
/// from nodes and control planes; nodes reach control planes on every port but etcd's (TCP in three
/// ranges, UDP, IP-in-IP for Calico); the bastion reaches the others on SSH only and is the only
/// group sshAccess reaches; the API is open to kubernetesApiAccess on the control plane only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_groups_admit_only_what_each_role_needs() {
    let moto = Moto::start();
    let ami = moto.fixtures().await;
    let bastion = format!(
        "---\napiVersion: kops.k8s.io/v1alpha2\nkind: InstanceGroup\nmetadata:\n  name: bastions\n  labels:\n    kops.k8s.io/cluster: {CLUSTER}\n\
         spec:\n  role: Bastion\n  image: {ami}\n  machineType: t3.micro\n  minSize: 1\n  maxSize: 1\n  subnets:\n  - us-east-1a\n"
    );
    let docs = moto::spec(&ami, |t| {
        let t = t.replace("  networking:\n    cni: {}\n", "  networking:\n    calico: {}\n");
        let t = t.replace("  sshAccess:\n  - 0.0.0.0/0\n", "  sshAccess:\n  - 192.0.2.0/24\n");
        let t = t.replace("  kubernetesApiAccess:\n  - 0.0.0.0/0\n", "  kubernetesApiAccess:\n  - 198.51.100.0/24\n");
        format!("{t}{bastion}")
    });
    let (m, _) = model_of(&docs);
    let t = moto.target(&[]).await;
    apply_once(&t, &m).await.expect("apply");

    let (cp, nodes, bastions) = (format!("masters.{CLUSTER}"), format!("nodes.{CLUSTER}"), format!("bastions.{CLUSTER}"));
    let mut want = vec![
        format!("{cp}: all from {cp}"),
        format!("{cp}: tcp 1-2379 from {nodes}"),
        format!("{cp}: tcp 2382-4000 from {nodes}"),
        format!("{cp}: tcp 4003-65535 from {nodes}"),
        format!("{cp}: udp 1-65535 from {nodes}"),
        format!("{cp}: 4 from {nodes}"),
        format!("{cp}: tcp 22-22 from {bastions}"),
        format!("{cp}: tcp 443-443 from 198.51.100.0/24"),
        format!("{nodes}: all from {cp}"),
        format!("{nodes}: all from {nodes}"),
        format!("{nodes}: tcp 22-22 from {bastions}"),
        format!("{bastions}: tcp 22-22 from 192.0.2.0/24"),
    ];
    want.sort();
    assert_eq!(ingress_rules(&t).await, want);

    // What AWS reports reads back as the model's rules: a second apply changes nothing.
    let t2 = moto.target(&[]).await;
    let s2 = store(&t2, &m);
    let again = cloud_resources::plan_apply(&t2, &m, &s2).await.expect("plan again");
    assert!(again.plan.is_empty(), "second plan:\n{}", again.plan.render(false));

    // A rule someone added by hand (all traffic from the bastion) is taken away again.
    let sgs = t.ec2.describe_security_groups().filters(cluster_filter()).send().await.expect("sgs");
    let id = |name: &str| sgs.security_groups().iter().find(|g| g.group_name() == Some(name)).and_then(|g| g.group_id()).expect("sg").to_string();
    t.ec2
        .authorize_security_group_ingress()
        .group_id(id(&cp))
        .ip_permissions(
            aws_sdk_ec2::types::IpPermission::builder()
                .ip_protocol("-1")
                .user_id_group_pairs(aws_sdk_ec2::types::UserIdGroupPair::builder().group_id(id(&bastions)).build())
                .build(),
        )
        .send()
        .await
        .expect("authorize by hand");
    assert!(ingress_rules(&t).await.contains(&format!("{cp}: all from {bastions}")));
    // So is an SSH rule the spec no longer names (kOps' RemoveExtraRules "port=22"); but the rules
    // the cloud-controller-manager adds for a Service's network load balancer (its NodePort and
    // path-MTU ICMP from the clients) are not Keelson's, and an apply must leave them alone: taking
    // them away cuts the Service off.
    let cidr_rule = |protocol: &str, from: i32, to: i32, cidr: &str| {
        aws_sdk_ec2::types::IpPermission::builder()
            .ip_protocol(protocol)
            .from_port(from)
            .to_port(to)
            .ip_ranges(aws_sdk_ec2::types::IpRange::builder().cidr_ip(cidr).build())
            .build()
    };
    for perm in [cidr_rule("tcp", 22, 22, "203.0.113.0/24"), cidr_rule("tcp", 31487, 31487, "0.0.0.0/0"), cidr_rule("icmp", 3, 4, "0.0.0.0/0")] {
        t.ec2.authorize_security_group_ingress().group_id(id(&nodes)).ip_permissions(perm).send().await.expect("authorize by hand");
    }
    let (create, change, delete) = apply_once(&t2, &m).await.expect("re-apply");
    assert_eq!((create, change, delete), (0, 0, 2), "the bastion's rule and the stale SSH rule go, nothing else");
    let mut with_foreign = want.clone();
    with_foreign.extend([format!("{nodes}: tcp 31487-31487 from 0.0.0.0/0"), format!("{nodes}: icmp from 0.0.0.0/0")]);
    with_foreign.sort();
    assert_eq!(ingress_rules(&t).await, with_foreign);
    let again = cloud_resources::plan_apply(&t2, &m, &s2).await.expect("plan again");
    assert!(again.plan.is_empty(), "the foreign rules are not in the plan:\n{}", again.plan.render(false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_spec_changes_only_what_it_must_and_names_instances_to_replace() {
    let moto = Moto::start();
    let ami = moto.fixtures().await;
    let (m, _) = model_of(&moto::spec(&ami, |t| t));
    let t = moto.target(&[]).await;
    apply_once(&t, &m).await.expect("apply");
    let ca_before = s3_object(&t, &format!("{CLUSTER}/pki/private/kubernetes-ca/keyset.yaml")).await;

    // Bigger machines, a larger maximum and a kubelet flag for the nodes group only.
    let changed = moto::spec(&ami, |t| {
        t.replace(
            "  machineType: t3.medium\n  minSize: 2\n  maxSize: 4\n",
            "  machineType: t3.large\n  minSize: 2\n  maxSize: 6\n  kubelet:\n    maxPods: 50\n",
        )
    });
    let (m2, _) = model_of(&changed);
    let t2 = moto.target(&[]).await;
    let s2 = store(&t2, &m2);
    let mut p = cloud_resources::plan_apply(&t2, &m2, &s2).await.expect("plan");
    let text = p.plan.render(false);
    let changed_names: Vec<(Kind, String)> = p.plan.changes.iter().map(|c| (c.kind, c.name.clone())).collect();
    assert!(p.plan.changes.iter().all(|c| matches!(c.action, Action::Update(_))), "{text}");
    let nodes = "nodes-us-east-1a.minimal.k8s.example.com".to_string();
    assert!(changed_names.contains(&(Kind::LaunchTemplate, nodes.clone())), "{text}");
    assert!(changed_names.contains(&(Kind::AutoscalingGroup, nodes.clone())), "{text}");
    assert!(changed_names.contains(&(Kind::StateFile, "igconfig/node/nodes-us-east-1a/nodeupconfig.yaml".into())), "{text}");
    let cloud_changes: Vec<_> = changed_names.iter().filter(|(k, _)| *k != Kind::StateFile).collect();
    assert_eq!(cloud_changes.len(), 2, "only the nodes template and group change: {text}");
    assert!(text.contains("instance_type: t3.medium → t3.large"), "{text}");
    assert!(text.contains("max_size: 4 → 6"), "{text}");
    assert!(text.contains("user_data.sha256"), "kubelet flag → new nodeup config hash → new user-data: {text}");
    assert_eq!(p.plan.rolling.len(), 1, "{text}");
    assert_eq!(p.plan.rolling[0].group, nodes);
    assert_eq!(p.plan.rolling[0].instances.len(), 2, "{text}");
    assert!(text.contains("rolling replacement needed: nodes-us-east-1a.minimal.k8s.example.com (2 instances"), "{text}");

    cloud_resources::execute(&t2, &m2, &s2, &mut p).await.expect("apply change");
    let writes = write_calls(&t2.counter);
    let ops: Vec<&str> = writes.keys().map(|k| k.rsplit('/').next().unwrap_or("")).collect();
    for op in &ops {
        assert!(
            ["CreateLaunchTemplateVersion", "ModifyLaunchTemplate", "UpdateAutoScalingGroup", "PutObject"].contains(op),
            "unexpected write {op}: {writes:?}"
        );
    }
    assert_eq!(writes.get("EC2/CreateLaunchTemplateVersion").or(writes.get("ec2/CreateLaunchTemplateVersion")), Some(&1), "{writes:?}");
    let lt = t2.ec2.describe_launch_template_versions().launch_template_name(&nodes).versions("$Latest").send().await.expect("versions");
    let v = &lt.launch_template_versions()[0];
    assert_eq!(v.version_number(), Some(2));
    assert_eq!(v.launch_template_data().and_then(|d| d.instance_type()).map(|t| t.as_str()), Some("t3.large"));

    let t3 = moto.target(&[]).await;
    let again = cloud_resources::plan_apply(&t3, &m2, &store(&t3, &m2)).await.expect("plan again");
    assert!(again.plan.is_empty(), "{}", again.plan.render(false));
    let ca_after = s3_object(&t3, &format!("{CLUSTER}/pki/private/kubernetes-ca/keyset.yaml")).await;
    assert_eq!(ca_before, ca_after, "CAs are never regenerated");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_leaves_nothing_tagged_but_the_etcd_volumes() {
    let moto = Moto::start();
    let ami = moto.fixtures().await;
    let docs = moto::spec(&ami, |t| t);
    let (m, _) = model_of(&docs);
    let t = moto.target(&[]).await;
    apply_once(&t, &m).await.expect("apply");
    assert_eq!(inventory(&t).await, expected_inventory());

    // Delete without --delete-volumes (model built without user-data, as `keelson delete` does).
    let (md, _) = moto::prepare(&docs, &spec_compiler::CompileOptions::default(), false);
    let s = store(&t, &md);
    let mut p = cloud_resources::plan_delete(&t, &md, &s, false).await.expect("plan delete");
    assert!(p.plan.changes.iter().all(|c| c.action == Action::Delete));
    assert!(p.plan.changes.iter().all(|c| c.kind != Kind::Volume));
    assert!(p.plan.render(false).contains("etcd volumes are kept"));
    cloud_resources::execute(&t, &md, &s, &mut p).await.expect("delete");
    let mut left = inventory(&t).await;
    assert_eq!(left.remove("etcd_volumes"), Some(2));
    assert!(left.values().all(|n| *n == 0), "left behind: {left:?}");
    let records = dns_records(&t).await;
    assert!(records.keys().all(|k| !k.ends_with(CLUSTER)), "{records:?}");
    let objects = t.s3.list_objects_v2().bucket(BUCKET).prefix(format!("{CLUSTER}/")).send().await.expect("list");
    let keys: Vec<&str> = objects.contents().iter().filter_map(|o| o.key()).collect();
    assert!(keys.iter().all(|k| k.contains("/pki/") || k.contains("/secrets/")), "state left: {keys:?}");

    // And with --delete-volumes nothing is left.
    let mut p = cloud_resources::plan_delete(&t, &md, &s, true).await.expect("plan delete volumes");
    assert_eq!(p.plan.counts(), (0, 0, 2), "{}", p.plan.render(false));
    cloud_resources::execute(&t, &md, &s, &mut p).await.expect("delete volumes");
    assert_eq!(inventory(&t).await.values().sum::<usize>(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_is_retried() {
    let moto = Moto::start();
    let ami = moto.fixtures().await;
    let (m, _) = model_of(&moto::spec(&ami, |t| t));
    let throttle = cloud::fault::Throttle::new(cloud::fault::ThrottleKind::Ec2RequestLimitExceeded, 3);
    let t = moto.target(&[SharedInterceptor::new(throttle.clone())]).await;
    apply_once(&t, &m).await.expect("apply despite throttling");
    assert_eq!(throttle.injected(), 3);
    let snap = t.counter.snapshot();
    let (calls, attempts) = snap.values().fold((0, 0), |a, c| (a.0 + c.calls, a.1 + c.attempts));
    assert_eq!(attempts, calls + 3, "each throttled response was retried once: {snap:?}");
    assert_eq!(inventory(&t).await, expected_inventory());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_half_way_then_rerun_converges_without_duplicates() {
    let moto = Moto::start();
    let ami = moto.fixtures().await;
    let (m, _) = model_of(&moto::spec(&ami, |t| t));
    // How many writes a clean apply makes.
    let t = moto.target(&[]).await;
    apply_once(&t, &m).await.expect("clean apply");
    let total: u64 = write_calls(&t.counter).values().sum();
    assert!(total > 10, "{:?}", write_calls(&t.counter));

    let cut_points: Vec<u64> = [1, total / 4, total / 2, total * 3 / 4, total - 1].into_iter().filter(|n| *n >= 1).collect();
    for n in cut_points {
        moto.reset();
        let ami = moto.fixtures().await;
        let (m, _) = model_of(&moto::spec(&ami, |t| t));
        let fault = moto::FailNthWrite::new(n);
        let broken = moto.target(&[SharedInterceptor::new(fault)]).await;
        let err = apply_once(&broken, &m).await.expect_err("the injected failure stops the run");
        assert!(err.to_string().contains("injected failure") || format!("{err:?}").contains("injected failure"), "{err}");
        let rerun = moto.target(&[]).await;
        let (create, change, delete) = apply_once(&rerun, &m).await.unwrap_or_else(|e| panic!("rerun after failing write #{n}: {e}"));
        assert_eq!(delete, 0);
        assert!(create + change > 0, "write #{n}: the rerun had work left");
        assert_eq!(inventory(&rerun).await, expected_inventory(), "after failing write #{n} of {total}");
        let check = moto.target(&[]).await;
        let p = cloud_resources::plan_apply(&check, &m, &store(&check, &m)).await.expect("plan");
        assert!(p.plan.is_empty(), "write #{n}: not converged:\n{}", p.plan.render(false));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_runs_are_kept_apart_by_the_state_store_lock() {
    let moto = Moto::start();
    let ami = moto.fixtures().await;
    let (m, _) = model_of(&moto::spec(&ami, |t| t));
    let t = moto.target(&[]).await;
    let s = store(&t, &m);
    // The S3 lock is a conditional PUT: only one of two racing runs gets it.
    let (a, b) = tokio::join!(s.lock("apply"), s.lock("apply"));
    assert!(a.is_ok() != b.is_ok(), "exactly one run holds the lock");
    let held = a.or(b).expect("one lock");

    held.release().await.expect("release");
    assert!(s.get(base::store::LOCK_FILE).await.expect("get").is_none(), "released");
    let (a, b) = tokio::join!(s.lock("apply"), s.lock("apply"));
    assert!(a.is_ok() != b.is_ok(), "once released, again exactly one run gets it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_associate_public_ip_puts_groups_on_the_interface_and_converges() {
    let moto = Moto::start();
    let ami = moto.fixtures().await;
    let docs = moto::spec(&ami, |t| t.replace("  machineType: t3.medium\n", "  machineType: t3.medium\n  associatePublicIp: false\n"));
    let (m, _) = model_of(&docs);
    let t = moto.target(&[]).await;
    apply_once(&t, &m).await.expect("apply");
    assert_eq!(inventory(&t).await, expected_inventory(), "instances launch from the template");
    let data = latest_lt_data(&t, "nodes-us-east-1a.minimal.k8s.example.com").await;
    assert!(data.security_group_ids().is_empty(), "groups move onto the interface");
    let nic = &data.network_interfaces()[0];
    assert_eq!((nic.device_index(), nic.associate_public_ip_address()), (Some(0), Some(false)));
    assert_eq!(nic.groups().len(), 1);
    let t2 = moto.target(&[]).await;
    let p = cloud_resources::plan_apply(&t2, &m, &store(&t2, &m)).await.expect("plan");
    assert!(p.plan.is_empty(), "{}", p.plan.render(false));
    // Back to the subnet's default: a new version without the interface.
    let (m2, _) = model_of(&moto::spec(&ami, |t| t));
    let p = cloud_resources::plan_apply(&t2, &m2, &store(&t2, &m2)).await.expect("plan");
    let text = p.plan.render(false);
    assert!(text.contains("associate_public_ip: false → (none)"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spot_and_mixed_instance_groups_are_created_and_converge() {
    let moto = Moto::start();
    let ami = moto.fixtures().await;
    let docs = moto::spec(&ami, |t| {
        t.replace(
            "  machineType: t3.medium\n",
            "  machineType: t3.medium\n  maxPrice: \"0.05\"\n  cpuCredits: standard\n  mixedInstancesPolicy:\n    instances: [t3.medium, t3a.medium]\n    onDemandBase: 1\n    onDemandAboveBase: 20\n    spotAllocationStrategy: capacity-optimized\n",
        )
    });
    let (m, _) = model_of(&docs);
    let t = moto.target(&[]).await;
    apply_once(&t, &m).await.expect("apply");
    let g = t.asg.describe_auto_scaling_groups().auto_scaling_group_names("nodes-us-east-1a.minimal.k8s.example.com").send().await.expect("asg");
    let g = &g.auto_scaling_groups()[0];
    let policy = g.mixed_instances_policy().expect("mixed instances policy");
    let types: Vec<&str> = policy.launch_template().expect("lt").overrides().iter().filter_map(|o| o.instance_type()).collect();
    assert_eq!(types, ["t3.medium", "t3a.medium"]);
    let d = policy.instances_distribution().expect("distribution");
    assert_eq!((d.on_demand_base_capacity(), d.on_demand_percentage_above_base_capacity()), (Some(1), Some(20)));
    assert_eq!(d.spot_allocation_strategy(), Some("capacity-optimized"));
    assert_eq!(d.spot_max_price(), Some("0.05"));
    assert!(g.launch_template().is_none());
    let data = latest_lt_data(&t, "nodes-us-east-1a.minimal.k8s.example.com").await;
    assert!(data.instance_market_options().is_none(), "with a mixed policy the price is on the group");
    assert_eq!(data.credit_specification().and_then(|c| c.cpu_credits()), Some("standard"));
    let t2 = moto.target(&[]).await;
    let p = cloud_resources::plan_apply(&t2, &m, &store(&t2, &m)).await.expect("plan");
    assert!(p.plan.is_empty(), "{}", p.plan.render(false));

    // maxPrice alone: a spot request on the template (on a fresh cluster).
    moto.reset();
    let ami = moto.fixtures().await;
    let (m2, _) = model_of(&moto::spec(&ami, |t| t.replace("  machineType: t3.medium\n", "  machineType: t3.medium\n  maxPrice: \"0.04\"\n")));
    let t2 = moto.target(&[]).await;
    apply_once(&t2, &m2).await.expect("apply spot");
    let data = latest_lt_data(&t2, "nodes-us-east-1a.minimal.k8s.example.com").await;
    let spot = data.instance_market_options().and_then(|o| o.spot_options()).expect("spot options");
    assert_eq!(spot.max_price(), Some("0.04"));
    let g = t2.asg.describe_auto_scaling_groups().auto_scaling_group_names("nodes-us-east-1a.minimal.k8s.example.com").send().await.expect("asg");
    assert!(g.auto_scaling_groups()[0].mixed_instances_policy().is_none(), "a plain launch template");
    let t3 = moto.target(&[]).await;
    let p = cloud_resources::plan_apply(&t3, &m2, &store(&t3, &m2)).await.expect("plan");
    assert!(p.plan.is_empty(), "{}", p.plan.render(false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn additional_and_compressed_user_data_reach_the_launch_templates() {
    let moto = Moto::start();
    let ami = moto.fixtures().await;
    let docs = moto::spec(&ami, |t| {
        t.replace(
            "  machineType: t3.medium\n",
            "  machineType: t3.medium\n  additionalUserData:\n  - name: extra.cfg\n    type: text/cloud-config\n    content: |\n      packages: [jq]\n",
        )
        .replacen("spec:\n  role: Master\n", "spec:\n  role: Master\n  compressUserData: true\n", 1)
    });
    let (m, compiled) = model_of(&docs);
    let t = moto.target(&[]).await;
    apply_once(&t, &m).await.expect("apply");
    for lt in &m.tasks.launch_templates {
        let v = t.ec2.describe_launch_template_versions().launch_template_name(&lt.name).versions("$Latest").send().await.expect("versions");
        let b64 = v.launch_template_versions()[0].launch_template_data().and_then(|d| d.user_data()).expect("user data").to_string();
        let ud = base64::engine::general_purpose::STANDARD.decode(b64).expect("base64");
        assert!(ud.len() < 16 * 1024);
        assert_eq!(ud, compiled.tree.files[&format!("userdata/{}.sh", lt.group)]);
        let text = if lt.group.starts_with("control-plane") {
            assert_eq!(&ud[..2], &[0x1f, 0x8b], "compressUserData: gzip");
            let mut s = String::new();
            std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(ud.as_slice()), &mut s).expect("gunzip");
            assert!(s.starts_with("#!/bin/bash"));
            s
        } else {
            let s = String::from_utf8(ud).expect("utf8");
            assert!(s.starts_with("Content-Type: multipart/mixed"), "{s}");
            assert!(s.find("nodeup.sh").expect("boot part") < s.find("extra.cfg").expect("extra part"));
            assert!(s.contains("packages: [jq]"));
            s
        };
        assert!(text.contains(&format!("InstanceGroupName: {}", lt.group)), "the boot config of its own group");
    }
    let t2 = moto.target(&[]).await;
    assert!(cloud_resources::plan_apply(&t2, &m, &store(&t2, &m)).await.expect("plan").plan.is_empty());
}

/// The cloud-controller-manager writes a route per node's pod CIDR into the cluster's route table
/// (kubenet). apply manages only the routes its model declares: a re-apply neither plans nor makes a
/// change to them (it used to replace the table's routes with its own, cutting the pod network on
/// every `apply`/`reconcile` until the route controller wrote them again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_leaves_routes_it_does_not_declare() {
    let moto = Moto::start();
    let ami = moto.fixtures().await;
    let (m, _) = model_of(&moto::spec(&ami, |t| t));
    let t = moto.target(&[]).await;
    apply_once(&t, &m).await.expect("apply");
    let tables = t.ec2.describe_route_tables().filters(cluster_filter()).send().await.expect("route tables");
    let table = tables.route_tables().first().expect("the cluster's route table");
    let table_id = table.route_table_id().expect("id").to_string();
    let subnets = t.ec2.describe_subnets().filters(cluster_filter()).send().await.expect("subnets");
    let subnet = subnets.subnets()[0].subnet_id().expect("subnet").to_string();
    let run = t.ec2.run_instances().image_id(&ami).min_count(1).max_count(1).subnet_id(&subnet).send().await.expect("an instance");
    let node = run.instances()[0].instance_id().expect("id").to_string();
    t.ec2.create_route().route_table_id(&table_id).destination_cidr_block("100.96.7.0/24").instance_id(&node).send().await.expect("the CCM's route");

    let s = store(&t, &m);
    let plan = cloud_resources::plan_apply(&t, &m, &s).await.expect("plan");
    assert!(plan.plan.changes.iter().all(|c| c.kind != Kind::RouteTable), "the pod-CIDR route is not in the plan:\n{}", plan.plan.render(false));
    apply_once(&t, &m).await.expect("re-apply");
    let after = t.ec2.describe_route_tables().route_table_ids(&table_id).send().await.expect("route table");
    let routes: Vec<(String, String)> = after.route_tables()[0]
        .routes()
        .iter()
        .filter_map(|r| Some((r.destination_cidr_block()?.to_string(), r.instance_id().or(r.gateway_id())?.to_string())))
        .collect();
    assert!(routes.contains(&("100.96.7.0/24".to_string(), node.clone())), "the route survives a re-apply: {routes:?}");
    assert!(routes.iter().any(|(cidr, _)| cidr == "0.0.0.0/0"), "apply's own route is there: {routes:?}");
}

/// A group's egress (AWS' default all-traffic rule to 0.0.0.0/0, which Terraform's
/// `aws_security_group` deletes) is part of the plan: a group without it is planned `~ egress`,
/// and apply restores it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_restores_a_groups_egress_rule() {
    let moto = Moto::start();
    let ami = moto.fixtures().await;
    let (m, _) = model_of(&moto::spec(&ami, |t| t));
    let t = moto.target(&[]).await;
    apply_once(&t, &m).await.expect("apply");
    let name = format!("nodes.{CLUSTER}");
    let groups = t.ec2.describe_security_groups().filters(Filter::builder().name("group-name").values(&name).build()).send().await.expect("groups");
    let id = groups.security_groups()[0].group_id().expect("id").to_string();
    let all =
        aws_sdk_ec2::types::IpPermission::builder().ip_protocol("-1").ip_ranges(aws_sdk_ec2::types::IpRange::builder().cidr_ip("0.0.0.0/0").build()).build();
    t.ec2.revoke_security_group_egress().group_id(&id).ip_permissions(all).send().await.expect("revoke the default egress");

    let s = store(&t, &m);
    let plan = cloud_resources::plan_apply(&t, &m, &s).await.expect("plan");
    let text = plan.plan.render(false);
    assert!(text.contains(&format!("~ SecurityGroup {name}\n    egress: none → 0.0.0.0/0")), "{text}");
    assert_eq!(plan.plan.counts(), (0, 1, 0), "{text}");
    apply_once(&t, &m).await.expect("re-apply");
    let after = t.ec2.describe_security_groups().group_ids(&id).send().await.expect("group");
    let egress = after.security_groups()[0].ip_permissions_egress();
    assert!(egress.iter().any(|p| p.ip_protocol() == Some("-1") && p.ip_ranges().iter().any(|r| r.cidr_ip() == Some("0.0.0.0/0"))), "{egress:?}");
    assert_eq!(apply_once(&t, &m).await.expect("third apply"), (0, 0, 0));
}

/// A classic load balancer made with boto3 from moto's own Python (the workspace has no SDK crate
/// for classic ELB: Keelson only attaches existing ones).
fn classic_load_balancer(moto: &Moto, name: &str) {
    let script = format!(
        "import boto3\nboto3.client('elb', region_name='us-east-1', endpoint_url='{}').create_load_balancer(LoadBalancerName='{name}', Listeners=[{{'Protocol': 'TCP', 'LoadBalancerPort': 80, 'InstancePort': 80}}], AvailabilityZones=['us-east-1a'])\n",
        moto.url
    );
    let out = std::process::Command::new(testkit::moto::python()).args(["-c", &script]).output().expect("run moto's python");
    assert!(out.status.success(), "create classic load balancer {name}: {}", String::from_utf8_lossy(&out.stderr));
}

/// kOps' `sshKeyName` (an existing key pair), `rootVolumeEncryptionKey`, `externalLoadBalancers`
/// (a target group by ARN, a classic load balancer by name) and `instanceProtection` reach the
/// launch template and the autoscaling group, a re-apply changes nothing, and dropping the
/// external load balancers detaches them in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_pair_kms_key_external_load_balancers_and_protection_reach_the_group() {
    let moto = Moto::start();
    let ami = moto.fixtures().await;
    let t = moto.target(&[]).await;
    t.ec2.create_key_pair().key_name("ops-key").send().await.expect("key pair");
    let vpc = t.ec2.describe_vpcs().send().await.expect("vpcs").vpcs()[0].vpc_id().expect("vpc id").to_string();
    let tg = t.elb.create_target_group().name("web").protocol(aws_sdk_elasticloadbalancingv2::types::ProtocolEnum::Tcp).port(80).vpc_id(vpc).send().await;
    let tg_arn = tg.expect("target group").target_groups()[0].target_group_arn().expect("arn").to_string();
    classic_load_balancer(&moto, "legacy-web");
    let key = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab";
    let nodes = |lbs: &str| {
        let lbs = lbs.to_string();
        moto::spec(&ami, move |t| {
            t.replace("  cloudProvider: aws\n", "  cloudProvider: aws\n  sshKeyName: ops-key\n").replace(
                "  machineType: t3.medium\n",
                &format!("  machineType: t3.medium\n  rootVolumeEncryption: true\n  rootVolumeEncryptionKey: {key}\n  instanceProtection: true\n{lbs}"),
            )
        })
    };
    let with_lbs = format!("  externalLoadBalancers:\n  - targetGroupArn: {tg_arn}\n  - loadBalancerName: legacy-web\n");
    let (m, _) = model_of(&nodes(&with_lbs));
    apply_once(&t, &m).await.expect("apply");
    let name = "nodes-us-east-1a.minimal.k8s.example.com";
    let data = latest_lt_data(&t, name).await;
    assert_eq!(data.key_name(), Some("ops-key"));
    let ebs = data.block_device_mappings()[0].ebs().expect("ebs");
    assert_eq!((ebs.encrypted(), ebs.kms_key_id()), (Some(true), Some(key)));
    let cp = latest_lt_data(&t, "control-plane-us-east-1a.minimal.k8s.example.com").await;
    assert_eq!(cp.key_name(), Some("ops-key"), "the key pair is the cluster's");
    assert_eq!(cp.block_device_mappings()[0].ebs().and_then(|e| e.kms_key_id()), None, "the key is the group's");
    let asg = |t: &AwsTarget| {
        let asg = t.asg.clone();
        async move {
            let g = asg.describe_auto_scaling_groups().auto_scaling_group_names(name).send().await.expect("asg");
            g.auto_scaling_groups()[0].clone()
        }
    };
    let g = asg(&t).await;
    assert_eq!(g.target_group_arns(), std::slice::from_ref(&tg_arn));
    assert_eq!(g.load_balancer_names(), ["legacy-web".to_string()]);
    assert_eq!(g.new_instances_protected_from_scale_in(), Some(true));
    let t2 = moto.target(&[]).await;
    let p = cloud_resources::plan_apply(&t2, &m, &store(&t2, &m)).await.expect("plan");
    assert!(p.plan.is_empty(), "{}", p.plan.render(false));

    // Without them: detached, the group kept.
    let (m2, _) = model_of(&nodes(""));
    apply_once(&t2, &m2).await.expect("apply without the load balancers");
    let g = asg(&t2).await;
    assert!(g.target_group_arns().is_empty() && g.load_balancer_names().is_empty(), "{g:?}");
    let t3 = moto.target(&[]).await;
    let p = cloud_resources::plan_apply(&t3, &m2, &store(&t3, &m2)).await.expect("plan");
    assert!(p.plan.is_empty(), "{}", p.plan.render(false));
}
