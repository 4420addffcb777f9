//! `keelson apply` of a private-topology cluster behind a network load balancer (examples/ha.yaml)
//! against a real moto server: internet gateway, NAT gateways and route tables for the VPC it
//! creates, IAM roles and instance profiles, the API load balancer and its alias record — and
//! `keelson delete` removing all of it. Needs moto (`$KEELSON_PYTHON`, default `.venv/bin/python`).

mod moto;

use std::collections::{BTreeMap, BTreeSet};

use aws_smithy_runtime_api::client::interceptors::SharedInterceptor;

use aws_sdk_ec2::types::Filter;
use cloud_resources::aws::{write_calls, AwsTarget};
use cloud_resources::plan::{Action, Kind};
use moto::{apply_once, store, Moto, HA_CLUSTER, ZONE};

fn cluster_filter() -> Filter {
    Filter::builder().name("tag:KubernetesCluster").values(HA_CLUSTER).build()
}

fn tag<'a>(tags: &'a [aws_sdk_ec2::types::Tag], key: &str) -> Option<&'a str> {
    tags.iter().find(|t| t.key() == Some(key)).and_then(|t| t.value())
}

/// Everything of the cluster that is not an etcd volume, by kind (counts of live resources).
async fn inventory(t: &AwsTarget) -> BTreeMap<&'static str, usize> {
    let e = &t.ec2;
    let igws = e.describe_internet_gateways().filters(cluster_filter()).send().await.expect("igws").internet_gateways().len();
    let eips = e.describe_addresses().filters(cluster_filter()).send().await.expect("eips").addresses().len();
    let nats = e
        .describe_nat_gateways()
        .filter(cluster_filter())
        .send()
        .await
        .expect("nats")
        .nat_gateways()
        .iter()
        .filter(|n| n.state().map(|s| s.as_str()) != Some("deleted"))
        .count();
    let rts = e.describe_route_tables().filters(cluster_filter()).send().await.expect("rts").route_tables().len();
    let vpcs = e.describe_vpcs().filters(cluster_filter()).send().await.expect("vpcs").vpcs().len();
    let subnets = e.describe_subnets().filters(cluster_filter()).send().await.expect("subnets").subnets().len();
    let sgs = e.describe_security_groups().filters(cluster_filter()).send().await.expect("sgs").security_groups().len();
    let lbs = t.elb.describe_load_balancers().send().await.expect("lbs").load_balancers().len();
    let tgs = t.elb.describe_target_groups().send().await.expect("tgs").target_groups().len();
    let roles = t.iam.list_roles().send().await.expect("roles").roles().iter().filter(|r| r.role_name().ends_with(HA_CLUSTER)).count();
    let profiles = t
        .iam
        .list_instance_profiles()
        .send()
        .await
        .expect("profiles")
        .instance_profiles()
        .iter()
        .filter(|p| p.instance_profile_name().ends_with(HA_CLUSTER))
        .count();
    BTreeMap::from([
        ("internet_gateways", igws),
        ("elastic_ips", eips),
        ("nat_gateways", nats),
        ("route_tables", rts),
        ("vpcs", vpcs),
        ("subnets", subnets),
        ("security_groups", sgs),
        ("load_balancers", lbs),
        ("target_groups", tgs),
        ("iam_roles", roles),
        ("instance_profiles", profiles),
    ])
}

fn expected_inventory() -> BTreeMap<&'static str, usize> {
    BTreeMap::from([
        ("internet_gateways", 1),
        ("elastic_ips", 3),
        ("nat_gateways", 3),
        ("route_tables", 4),
        ("vpcs", 1),
        ("subnets", 6),
        ("security_groups", 3),
        ("load_balancers", 1),
        ("target_groups", 1),
        ("iam_roles", 2),
        ("instance_profiles", 2),
    ])
}

#[test]
fn private_topology_gets_egress_iam_and_a_load_balancer_and_delete_removes_them() {
    moto::run_with_big_stack(private_topology_scenario);
}

async fn private_topology_scenario() {
    let moto = Moto::start();
    let ami = moto.fixtures().await;
    let docs = moto::ha_spec(&ami, moto::private_topology);
    let (m, _) = moto::prepare(&docs, &moto::compile_options(), true);
    let t = moto.target(&[]).await;
    apply_once(&t, &m).await.expect("apply");

    assert_eq!(inventory(&t).await, expected_inventory());

    // Subnet ids by Name, zone by id.
    let subnets = t.ec2.describe_subnets().filters(cluster_filter()).send().await.expect("subnets");
    let subnet_name: BTreeMap<String, String> =
        subnets.subnets().iter().map(|s| (s.subnet_id().unwrap_or_default().to_string(), tag(s.tags(), "Name").unwrap_or_default().to_string())).collect();

    // The internet gateway is attached to the cluster's VPC.
    let vpc = t.ec2.describe_vpcs().filters(cluster_filter()).send().await.expect("vpc").vpcs()[0].vpc_id().unwrap_or_default().to_string();
    let igw = t.ec2.describe_internet_gateways().filters(cluster_filter()).send().await.expect("igw");
    let igw = &igw.internet_gateways()[0];
    assert_eq!(igw.attachments().first().and_then(|a| a.vpc_id()), Some(vpc.as_str()));
    let igw_id = igw.internet_gateway_id().unwrap_or_default();

    // One NAT gateway per zone, in that zone's utility subnet.
    let nats = t.ec2.describe_nat_gateways().filter(cluster_filter()).send().await.expect("nats");
    let mut nat_by_zone = BTreeMap::new();
    for n in nats.nat_gateways() {
        let name = tag(n.tags(), "Name").unwrap_or_default().to_string();
        let zone = name.split('.').next().unwrap_or_default().to_string();
        assert_eq!(subnet_name[n.subnet_id().unwrap_or_default()], format!("utility-{zone}.{HA_CLUSTER}"), "{name}");
        assert!(n.nat_gateway_addresses().first().and_then(|a| a.allocation_id()).is_some(), "{name} has its elastic IP");
        nat_by_zone.insert(zone, n.nat_gateway_id().unwrap_or_default().to_string());
    }
    assert_eq!(nat_by_zone.len(), 3);

    // Route tables: public (0/0 → IGW, the utility subnets) and one private table per zone (0/0 → its NAT).
    let rts = t.ec2.describe_route_tables().filters(cluster_filter()).send().await.expect("rts");
    for rt in rts.route_tables() {
        let name = tag(rt.tags(), "Name").unwrap_or_default().to_string();
        let role = tag(rt.tags(), "kubernetes.io/kops/role").unwrap_or_default().to_string();
        let default = rt.routes().iter().find(|r| r.destination_cidr_block() == Some("0.0.0.0/0")).expect("default route");
        let associated: BTreeSet<String> = rt.associations().iter().filter_map(|a| a.subnet_id()).map(|s| subnet_name[s].clone()).collect();
        if name == HA_CLUSTER {
            assert_eq!(role, "public");
            assert_eq!(default.gateway_id(), Some(igw_id));
            let want: BTreeSet<String> = ["a", "b", "c"].iter().map(|z| format!("utility-us-east-1{z}.{HA_CLUSTER}")).collect();
            assert_eq!(associated, want);
        } else {
            let zone = name.strip_prefix("private-").and_then(|n| n.strip_suffix(&format!(".{HA_CLUSTER}"))).expect("private table name");
            assert_eq!(role, format!("private-{zone}"));
            assert_eq!(default.nat_gateway_id(), Some(nat_by_zone[zone].as_str()), "{name}");
            assert_eq!(associated, BTreeSet::from([format!("{zone}.{HA_CLUSTER}")]));
        }
    }

    // IAM: a role and a profile per role; the control plane may change records in the zone only.
    let zone_id = t.dns.client().list_hosted_zones_by_name().dns_name(ZONE).send().await.expect("zones").hosted_zones()[0]
        .id()
        .trim_start_matches("/hostedzone/")
        .to_string();
    for (role, lt_prefix) in [("masters", "control-plane"), ("nodes", "nodes")] {
        let name = format!("{role}.{HA_CLUSTER}");
        let r = t.iam.get_role().role_name(&name).send().await.expect("role");
        let tags: BTreeMap<&str, &str> = r.role().expect("role").tags().iter().map(|t| (t.key(), t.value())).collect();
        assert_eq!(tags.get("KubernetesCluster"), Some(&HA_CLUSTER));
        let p = t.iam.get_instance_profile().instance_profile_name(&name).send().await.expect("profile");
        assert_eq!(p.instance_profile().expect("p").roles()[0].role_name(), name);
        let doc = t.iam.get_role_policy().role_name(&name).policy_name(&name).send().await.expect("inline policy");
        let doc = percent_encoding::percent_decode_str(doc.policy_document()).decode_utf8().expect("utf8").to_string();
        if role == "masters" {
            assert!(doc.contains(&format!("hostedzone/{zone_id}")), "{doc}");
            assert!(doc.contains("ec2:AttachVolume"), "{doc}");
        } else {
            assert!(doc.contains("igconfig/node/*") && !doc.contains("route53"), "{doc}");
        }
        for lt in m.tasks.launch_templates.iter().filter(|l| l.group.starts_with(lt_prefix)) {
            assert_eq!(lt.instance_profile, name);
        }
    }

    // The load balancer: internet-facing NLB in the utility subnets, 443 → the target group the
    // control-plane groups register with; api.<cluster> is an alias to it.
    let lbs = t.elb.describe_load_balancers().send().await.expect("lbs");
    let lb = &lbs.load_balancers()[0];
    assert_eq!(lb.scheme().map(|s| s.as_str()), Some("internet-facing"));
    assert_eq!(lb.r#type().map(|s| s.as_str()), Some("network"));
    assert!(lb.load_balancer_name().unwrap_or_default().len() <= 32);
    let lb_subnets: BTreeSet<String> = lb.availability_zones().iter().filter_map(|z| z.subnet_id()).map(|s| subnet_name[s].clone()).collect();
    assert!(lb_subnets.iter().all(|s| s.starts_with("utility-")), "{lb_subnets:?}");
    assert_eq!(lb_subnets.len(), 3);
    let listeners = t.elb.describe_listeners().load_balancer_arn(lb.load_balancer_arn().unwrap_or_default()).send().await.expect("listeners");
    assert_eq!(listeners.listeners().len(), 1);
    assert_eq!(listeners.listeners()[0].port(), Some(443));
    let tg = &t.elb.describe_target_groups().send().await.expect("tgs").target_groups()[0].clone();
    assert_eq!((tg.port(), tg.protocol().map(|p| p.as_str())), (Some(443), Some("TCP")));
    assert_eq!(listeners.listeners()[0].default_actions()[0].target_group_arn(), tg.target_group_arn());
    let asgs = t.asg.describe_auto_scaling_groups().send().await.expect("asgs");
    for g in asgs.auto_scaling_groups() {
        let name = g.auto_scaling_group_name().unwrap_or_default();
        let registered = g.target_group_arns().iter().any(|a| Some(a.as_str()) == tg.target_group_arn());
        assert_eq!(registered, name.starts_with("control-plane"), "{name}");
    }
    let records = t.dns.client().list_resource_record_sets().hosted_zone_id(&zone_id).send().await.expect("records");
    let api = records.resource_record_sets().iter().find(|r| r.name().trim_end_matches('.') == format!("api.{HA_CLUSTER}")).expect("api record");
    let alias = api.alias_target().expect("api.<cluster> is an alias");
    assert_eq!(alias.dns_name().trim_end_matches('.').to_ascii_lowercase(), lb.dns_name().unwrap_or_default().to_ascii_lowercase());
    let internal = records.resource_record_sets().iter().find(|r| r.name().trim_end_matches('.') == format!("api.internal.{HA_CLUSTER}")).expect("internal");
    assert_eq!(internal.resource_records()[0].value(), "203.0.113.123");

    // The control plane accepts 443 from the load balancer's group only; the balancer from anywhere.
    let sgs = t.ec2.describe_security_groups().filters(cluster_filter()).send().await.expect("sgs");
    let by_name: BTreeMap<&str, &aws_sdk_ec2::types::SecurityGroup> = sgs.security_groups().iter().map(|g| (g.group_name().unwrap_or(""), g)).collect();
    let elb_sg = by_name[format!("api-elb.{HA_CLUSTER}").as_str()];
    let masters = by_name[format!("masters.{HA_CLUSTER}").as_str()];
    let https: Vec<_> = masters.ip_permissions().iter().filter(|p| p.from_port() == Some(443)).collect();
    assert!(https.iter().all(|p| p.ip_ranges().is_empty()), "no direct 443 from CIDRs: {https:?}");
    assert!(https.iter().any(|p| p.user_id_group_pairs().iter().any(|u| u.group_id() == elb_sg.group_id())));
    assert!(elb_sg.ip_permissions().iter().any(|p| p.from_port() == Some(443) && p.ip_ranges().iter().any(|r| r.cidr_ip() == Some("0.0.0.0/0"))));
    assert_eq!(lb.security_groups(), [elb_sg.group_id().unwrap_or_default().to_string()]);

    // Re-apply: nothing to do, no writes.
    let t2 = moto.target(&[]).await;
    let mut again = cloud_resources::plan_apply(&t2, &m, &store(&t2, &m)).await.expect("plan again");
    assert!(again.plan.is_empty(), "second plan:\n{}", again.plan.render(false));
    cloud_resources::execute(&t2, &m, &store(&t2, &m), &mut again).await.expect("apply again");
    assert!(write_calls(&t2.counter).is_empty(), "re-apply wrote: {:?}", write_calls(&t2.counter));

    // Dropping the load balancer from the spec removes it, its target group and security group,
    // detaches the control plane, opens 443 on the control plane again and turns the alias back
    // into a placeholder record for protokube.
    let (no_lb, _) = moto::prepare(
        &moto::ha_spec(&ami, |t| {
            moto::private_topology(t).replace("  api:\n    loadBalancer:\n      type: Public\n      class: Network\n", "  api:\n    dns: {}\n")
        }),
        &moto::compile_options(),
        true,
    );
    let t4 = moto.target(&[]).await;
    let p = cloud_resources::plan_apply(&t4, &no_lb, &store(&t4, &no_lb)).await.expect("plan");
    let text = p.plan.render(false);
    for line in [
        "- LoadBalancer api.ha.k8s.example.com",
        "- TargetGroup tcp-ha-k8s-example-com-",
        "- SecurityGroup api-elb.ha.k8s.example.com",
        "~ DNSRecord api.ha.k8s.example.com",
    ] {
        assert!(text.contains(line), "{line}:\n{text}");
    }
    apply_once(&t4, &no_lb).await.expect("apply without load balancer");
    let after = inventory(&t4).await;
    assert_eq!((after["load_balancers"], after["target_groups"], after["security_groups"]), (0, 0, 2), "{after:?}");
    let asgs = t4.asg.describe_auto_scaling_groups().send().await.expect("asgs");
    assert!(asgs.auto_scaling_groups().iter().all(|g| g.target_group_arns().is_empty()));
    let records = t4.dns.client().list_resource_record_sets().hosted_zone_id(&zone_id).send().await.expect("records");
    let api = records.resource_record_sets().iter().find(|r| r.name().trim_end_matches('.') == format!("api.{HA_CLUSTER}")).expect("api");
    assert!(api.alias_target().is_none());
    assert_eq!(api.resource_records()[0].value(), "203.0.113.123");
    let t5 = moto.target(&[]).await;
    let again = cloud_resources::plan_apply(&t5, &no_lb, &store(&t5, &no_lb)).await.expect("plan");
    assert!(again.plan.is_empty(), "{}", again.plan.render(false));
    // And back: the balancer is created again and the alias restored.
    apply_once(&t5, &m).await.expect("apply with the load balancer again");
    assert_eq!(inventory(&t5).await, expected_inventory());

    // Delete with volumes: nothing of the cluster is left.
    let (md, _) = moto::prepare(&docs, &spec_compiler::CompileOptions::default(), false);
    let t3 = moto.target(&[]).await;
    let s3 = store(&t3, &md);
    let mut p = cloud_resources::plan_delete(&t3, &md, &s3, true).await.expect("plan delete");
    assert!(p.plan.changes.iter().all(|c| c.action == Action::Delete));
    for kind in [
        Kind::IamRole,
        Kind::IamInstanceProfile,
        Kind::NatGateway,
        Kind::ElasticIp,
        Kind::RouteTable,
        Kind::InternetGateway,
        Kind::LoadBalancer,
        Kind::TargetGroup,
    ] {
        assert!(p.plan.changes.iter().any(|c| c.kind == kind), "{kind:?} not deleted:\n{}", p.plan.render(false));
    }
    cloud_resources::execute(&t3, &md, &s3, &mut p).await.expect("delete");
    let left = inventory(&t3).await;
    assert!(left.values().all(|n| *n == 0), "left behind: {left:?}");
    let vols = t3.ec2.describe_volumes().filters(cluster_filter()).send().await.expect("volumes");
    assert!(vols.volumes().iter().all(|v| !v.tags().iter().any(|t| t.key().unwrap_or("").starts_with("k8s.io/etcd/"))));
    let records = t3.dns.client().list_resource_record_sets().hosted_zone_id(&zone_id).send().await.expect("records");
    assert!(records.resource_record_sets().iter().all(|r| !r.name().trim_end_matches('.').ends_with(HA_CLUSTER)), "records left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_iam_and_load_balancer_survive_a_failure_at_every_kind_of_write() {
    let moto = Moto::start();
    let ami = moto.fixtures().await;
    let (m, _) = moto::prepare(&moto::ha_spec(&ami, moto::private_topology), &moto::compile_options(), true);
    let rec = moto::RecordWrites::default();
    let t = moto.target(&[SharedInterceptor::new(rec.clone())]).await;
    apply_once(&t, &m).await.expect("clean apply");
    let writes = rec.0.lock().expect("lock").clone();
    // Cut right before the first write of every operation that builds the new resources (a
    // resource created but not yet attached, routed, associated, tagged or given its policy).
    let mut cut_points: Vec<(u64, String)> = Vec::new();
    for (i, op) in writes.iter().enumerate() {
        let interesting = [
            "AttachInternetGateway",
            "CreateNatGateway",
            "CreateRoute",
            "AssociateRouteTable",
            "PutRolePolicy",
            "AddRoleToInstanceProfile",
            "ModifyTargetGroupAttributes",
            "CreateListener",
            "ModifyLoadBalancerAttributes",
            "ChangeResourceRecordSets",
            "CreateAutoScalingGroup",
        ];
        if interesting.iter().any(|w| op.ends_with(&format!("/{w}"))) && !cut_points.iter().any(|(_, o)| o == op) {
            cut_points.push((i as u64 + 1, op.clone()));
        }
    }
    assert!(cut_points.len() >= 10, "{writes:?}");
    for (n, op) in cut_points {
        moto.reset();
        let ami = moto.fixtures().await;
        let (m, _) = moto::prepare(&moto::ha_spec(&ami, moto::private_topology), &moto::compile_options(), true);
        let broken = moto.target(&[SharedInterceptor::new(moto::FailNthWrite::new(n))]).await;
        let err = apply_once(&broken, &m).await.expect_err("the injected failure stops the run");
        assert!(format!("{err:?}").contains("injected failure"), "{err}");
        let rerun = moto.target(&[]).await;
        apply_once(&rerun, &m).await.unwrap_or_else(|e| panic!("rerun after failing write #{n} ({op}): {e}"));
        assert_eq!(inventory(&rerun).await, expected_inventory(), "after failing write #{n} ({op})");
        let check = moto.target(&[]).await;
        let p = cloud_resources::plan_apply(&check, &m, &store(&check, &m)).await.expect("plan");
        assert!(p.plan.is_empty(), "write #{n} ({op}): not converged:\n{}", p.plan.render(false));
    }
}
