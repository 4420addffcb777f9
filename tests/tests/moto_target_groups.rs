//! The local cloud's moto registers an Auto Scaling group's instances in its target groups as AWS
//! does: once, when each instance enters service (fix 4 of `testkit/src/moto_server.py`). Without
//! it, a control plane whose protokube took it out of the API target group (its API server not yet
//! ready) is put back behind the load balancer whenever the group launches another instance.

mod support;

use aws_sdk_autoscaling::types::LaunchTemplateSpecification;
use aws_sdk_ec2::types::{InstanceType, RequestLaunchTemplateData};
use aws_sdk_elasticloadbalancingv2::types::{ProtocolEnum, TargetDescription};

#[test]
fn an_instance_out_of_its_target_group_stays_out() {
    let log = tempfile::NamedTempFile::new().unwrap();
    let moto = keelson_local::moto::Moto::start(log.path()).expect("moto (scripts/test creates the venv; or set KEELSON_PYTHON)");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let conf = support::moto_sdk(&moto.endpoint()).await;
        let (ec2, asg, elb) = (aws_sdk_ec2::Client::new(&conf), aws_sdk_autoscaling::Client::new(&conf), aws_sdk_elasticloadbalancingv2::Client::new(&conf));
        let vpc = ec2.create_vpc().cidr_block("10.0.0.0/16").send().await.unwrap().vpc.unwrap().vpc_id.unwrap();
        let subnet =
            ec2.create_subnet().vpc_id(&vpc).cidr_block("10.0.1.0/24").availability_zone("eu-west-1a").send().await.unwrap().subnet.unwrap().subnet_id.unwrap();
        let image = ec2.describe_images().send().await.unwrap().images()[0].image_id().unwrap().to_string();
        let data = RequestLaunchTemplateData::builder().image_id(&image).instance_type(InstanceType::T3Medium).build();
        ec2.create_launch_template().launch_template_name("cp").launch_template_data(data).send().await.unwrap();
        let tg = elb.create_target_group().name("tcp-api").protocol(ProtocolEnum::Tcp).port(443).vpc_id(&vpc).send().await.unwrap();
        let tg = tg.target_groups()[0].target_group_arn().unwrap().to_string();
        let template = LaunchTemplateSpecification::builder().launch_template_name("cp").version("$Latest").build();
        asg.create_auto_scaling_group()
            .auto_scaling_group_name("cp")
            .launch_template(template)
            .min_size(0)
            .max_size(3)
            .desired_capacity(1)
            .vpc_zone_identifier(&subnet)
            .target_group_arns(&tg)
            .send()
            .await
            .unwrap();
        let registered = || async {
            let out = elb.describe_target_health().target_group_arn(&tg).send().await.unwrap();
            let mut ids: Vec<String> = out.target_health_descriptions().iter().filter_map(|d| d.target()?.id().map(str::to_string)).collect();
            ids.sort();
            ids
        };
        let first = registered().await;
        assert_eq!(first.len(), 1, "the group's first instance is registered when it enters service");
        let out_of_service = first[0].clone();
        elb.deregister_targets().target_group_arn(&tg).targets(TargetDescription::builder().id(&out_of_service).build()).send().await.unwrap();

        asg.set_desired_capacity().auto_scaling_group_name("cp").desired_capacity(2).send().await.unwrap();
        let now = registered().await;
        assert_eq!(now.len(), 1, "only the new instance is registered: {now:?}");
        assert_ne!(now[0], out_of_service, "the instance that left its target group was put back by its neighbour's launch");

        // Detaching the target group deregisters what is still registered, and does not fail on the rest.
        asg.detach_load_balancer_target_groups().auto_scaling_group_name("cp").target_group_arns(&tg).send().await.unwrap();
        assert!(registered().await.is_empty());
        // Attaching it again registers every instance of the group, as AWS does.
        asg.attach_load_balancer_target_groups().auto_scaling_group_name("cp").target_group_arns(&tg).send().await.unwrap();
        assert_eq!(registered().await.len(), 2);
    });
}

/// The harness's load balancer takes a target out as soon as it leaves its target group in moto,
/// with no full sync (the daemon's reconcile pass, seconds apart on a busy host): a control plane
/// that deregisters itself at poweroff gets no new connection while its API server still serves.
#[test]
fn a_deregistration_is_followed_without_waiting_for_a_sync() {
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use keelson_local::balancer::{follow_deregistrations, Balancers, Desired, TargetGroupRef};

    let log = tempfile::NamedTempFile::new().unwrap();
    let moto = keelson_local::moto::Moto::start(log.path()).expect("moto (scripts/test creates the venv; or set KEELSON_PYTHON)");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let (tg, ids) = rt.block_on(async {
        let conf = support::moto_sdk(&moto.endpoint()).await;
        let (ec2, elb) = (aws_sdk_ec2::Client::new(&conf), aws_sdk_elasticloadbalancingv2::Client::new(&conf));
        let vpc = ec2.create_vpc().cidr_block("10.0.0.0/16").send().await.unwrap().vpc.unwrap().vpc_id.unwrap();
        let image = ec2.describe_images().send().await.unwrap().images()[0].image_id().unwrap().to_string();
        let run = ec2.run_instances().image_id(&image).instance_type(InstanceType::T3Medium).min_count(2).max_count(2).send().await.unwrap();
        let ids: Vec<String> = run.instances().iter().filter_map(|i| i.instance_id().map(str::to_string)).collect();
        let tg = elb.create_target_group().name("tcp-api").protocol(ProtocolEnum::Tcp).port(443).vpc_id(&vpc).send().await.unwrap();
        let tg = tg.target_groups()[0].target_group_arn().unwrap().to_string();
        let targets: Vec<TargetDescription> = ids.iter().map(|id| TargetDescription::builder().id(id).port(443).build()).collect();
        elb.register_targets().target_group_arn(&tg).set_targets(Some(targets)).send().await.unwrap();
        (tg, ids)
    });
    let (kept, leaving): (std::net::SocketAddr, std::net::SocketAddr) = ("10.0.1.10:443".parse().unwrap(), "10.0.1.11:443".parse().unwrap());
    let balancers = Arc::new(Balancers::new(rt.handle().clone(), std::net::TcpListener::bind("127.0.0.1:0").unwrap(), Arc::new(|_| {})).unwrap());
    balancers.sync(vec![Desired {
        key: "api:443".into(),
        name: "api".into(),
        service: None,
        api: true,
        targets: BTreeSet::from([kept, leaving]),
        health: keelson_local::cloud::HealthCheck::default(),
        deregistration_delay: Duration::from_secs(30),
        target_group: Some(TargetGroupRef { arn: tg.clone(), port: 443, ids: BTreeMap::from([(kept, ids[0].clone()), (leaving, ids[1].clone())]) }),
    }]);
    follow_deregistrations(Arc::downgrade(&balancers), moto.endpoint(), "eu-west-1".into());
    let followed = || balancers.target_groups()[0].1.ids.keys().copied().collect::<Vec<_>>();
    // Both members stay while both are registered.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(followed(), vec![kept, leaving]);
    rt.block_on(async {
        let conf = support::moto_sdk(&moto.endpoint()).await;
        let elb = aws_sdk_elasticloadbalancingv2::Client::new(&conf);
        elb.deregister_targets().target_group_arn(&tg).targets(TargetDescription::builder().id(&ids[1]).port(443).build()).send().await.unwrap();
    });
    let t = Instant::now();
    while followed().contains(&leaving) && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(followed(), vec![kept], "the deregistered target is still in the balancer, and no sync ran");
    println!("deregistration followed {:.2} s after DeregisterTargets returned (follower polls every 250 ms)", t.elapsed().as_secs_f64());
}
