//! A control plane is behind the API load balancer only while its API server is ready, on a real
//! moto: the membership protokube reads and writes is Elastic Load Balancing's own (DescribeTargetHealth,
//! RegisterTargets, DeregisterTargets). Needs moto; fails with a message saying so.

#[path = "support/iam.rs"]
mod iam;
#[path = "../../cloud/tests/support/moto.rs"]
mod moto;

use aws_sdk_ec2::types::InstanceType;
use aws_sdk_elasticloadbalancingv2::types::{ProtocolEnum, TargetDescription};
use cloud::{Elbv2, TargetGroups};
use protokube::api_target::{Action, ApiTarget, Membership, Pass};

const CLUSTER: &str = "c.example.com";

#[test]
fn a_control_plane_serves_behind_the_load_balancer_only_while_ready() {
    let (_guard, m) = moto::lock();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let conf = moto::sdk(&m.url).await;
        let mark = iam::Mark::now();
        // protokube's client signs as the control plane: its calls are held against that policy.
        let protokube_elb = aws_sdk_elasticloadbalancingv2::Client::new(&iam::as_control_plane(&conf));
        let (ec2, elb) = (aws_sdk_ec2::Client::new(&conf), aws_sdk_elasticloadbalancingv2::Client::new(&conf));
        let vpc = ec2.create_vpc().cidr_block("10.0.0.0/16").send().await.unwrap().vpc.unwrap().vpc_id.unwrap();
        let subnet = ec2.create_subnet().vpc_id(&vpc).cidr_block("10.0.1.0/24").send().await.unwrap().subnet.unwrap().subnet_id.unwrap();
        let image = ec2.describe_images().send().await.unwrap().images()[0].image_id().unwrap().to_string();
        let mut ids = Vec::new();
        for _ in 0..2 {
            let out =
                ec2.run_instances().image_id(&image).instance_type(InstanceType::T3Medium).subnet_id(&subnet).min_count(1).max_count(1).send().await.unwrap();
            ids.push(out.instances()[0].instance_id().unwrap().to_string());
        }
        let (me, peer) = (ids[0].clone(), ids[1].clone());
        let name = keelson_api::names::api_target_group_name(CLUSTER);
        // Tagged for the cluster, as `keelson apply` makes it (the policy's condition).
        let tg = elb
            .create_target_group()
            .name(&name)
            .protocol(ProtocolEnum::Tcp)
            .port(443)
            .vpc_id(&vpc)
            .tags(aws_sdk_elasticloadbalancingv2::types::Tag::builder().key("KubernetesCluster").value(CLUSTER).build())
            .send()
            .await
            .unwrap();
        let arn = tg.target_groups()[0].target_group_arn().unwrap().to_string();
        let register = |id: &str| elb.register_targets().target_group_arn(&arn).targets(TargetDescription::builder().id(id).build()).send();
        let members = || async {
            let mut v: Vec<String> = Elbv2::new(elb.clone()).targets(&arn).await.unwrap().into_iter().filter(|t| t.state != "unused").map(|t| t.id).collect();
            v.sort();
            v
        };
        // Its group registered it when it entered service; the peer serves.
        register(&me).await.unwrap();
        register(&peer).await.unwrap();

        let mut t = ApiTarget::new(Elbv2::new(protokube_elb.clone()), name.clone(), me.clone());
        assert_eq!(t.pass(false).await.unwrap(), Pass::Did(Action::Deregister, Membership::Registered), "not ready: out");
        assert_eq!(members().await, vec![peer.clone()]);
        assert_eq!(t.pass(false).await.unwrap(), Pass::Did(Action::Nothing, Membership::Absent));
        assert_eq!(t.pass(true).await.unwrap(), Pass::Did(Action::Nothing, Membership::Absent), "one ready answer is not enough");
        assert_eq!(t.pass(true).await.unwrap(), Pass::Did(Action::Register, Membership::Absent));
        let mut both = vec![me.clone(), peer.clone()];
        both.sort();
        assert_eq!(members().await, both);
        assert_eq!(t.pass(true).await.unwrap(), Pass::Skipped, "settled: the membership is read less often");

        // The rolling update takes it out before draining the node: protokube leaves it out.
        elb.deregister_targets().target_group_arn(&arn).targets(TargetDescription::builder().id(&me).build()).send().await.unwrap();
        let mut seen_release = false;
        for _ in 0..protokube::api_target::MEMBERSHIP_EVERY + 1 {
            if let Pass::Did(a, _) = t.pass(true).await.unwrap() {
                assert_eq!(a, Action::Nothing);
                seen_release = true;
            }
        }
        assert!(seen_release && t.gate.released, "the external deregistration is noticed");
        assert_eq!(members().await, vec![peer.clone()], "and not undone");

        // Stopping: a registered instance leaves; one that is not is left alone (no error).
        let mut t = ApiTarget::new(Elbv2::new(protokube_elb.clone()), name.clone(), peer.clone());
        assert!(t.leave().await.unwrap());
        assert!(members().await.is_empty());
        assert!(!t.leave().await.unwrap());
        // No target group of that name: nothing to do.
        let mut t = ApiTarget::new(Elbv2::new(protokube_elb.clone()), "tcp-other".into(), me.clone());
        assert_eq!(t.pass(true).await.unwrap(), Pass::NoTargetGroup);

        let spec = format!("apiVersion: kops.k8s.io/v1alpha2\nkind: Cluster\nmetadata:\n  name: {CLUSTER}\nspec:\n  cloudProvider: aws\n");
        mark.assert_allowed(&m.url, &spec, moto::REGION);
    });
}
