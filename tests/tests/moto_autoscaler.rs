//! The local cloud's moto answers what cluster-autoscaler's AWS provider asks
//! (`cloudprovider/aws/aws_wrapper.go`, `auto_scaling_groups.go` of cluster-autoscaler 1.34), as AWS
//! does: the groups by name (kOps' `--nodes`) and by tag filters (auto-discovery), the launch
//! template version a group launches (its instance type), the instance types, a raised desired
//! capacity that launches an instance (which keelson-local's daemon boots a machine for), a
//! termination that shrinks the group (the daemon powers that machine off), and the scaling
//! activities it reads after a scale-up. Fixes 5 and 6 of `testkit/src/moto_server.py` (the
//! group's size limits; the activities) are what this test fails on without them.

mod support;

use aws_sdk_autoscaling::types::{Filter, LaunchTemplateSpecification, Tag};
use aws_sdk_ec2::types::{InstanceType, RequestLaunchTemplateData};

const GROUP: &str = "nodes.ca.example.com";
const CLUSTER_TAG: &str = "KubernetesCluster";

fn tag(key: &str, value: &str) -> Tag {
    Tag::builder().key(key).value(value).propagate_at_launch(true).resource_id(GROUP).resource_type("auto-scaling-group").build()
}

fn code<E: aws_sdk_autoscaling::error::ProvideErrorMetadata>(e: &E) -> String {
    format!("{}: {}", e.code().unwrap_or("?"), e.message().unwrap_or(""))
}

#[test]
fn moto_answers_the_calls_cluster_autoscaler_makes() {
    let log = tempfile::NamedTempFile::new().unwrap();
    let moto = keelson_local::moto::Moto::start(log.path()).expect("moto (scripts/test creates the venv; or set KEELSON_PYTHON)");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let conf = support::moto_sdk(&moto.endpoint()).await;
        let (ec2, asg) = (aws_sdk_ec2::Client::new(&conf), aws_sdk_autoscaling::Client::new(&conf));
        let vpc = ec2.create_vpc().cidr_block("10.0.0.0/16").send().await.unwrap().vpc.unwrap().vpc_id.unwrap();
        let subnet =
            ec2.create_subnet().vpc_id(&vpc).cidr_block("10.0.1.0/24").availability_zone("eu-west-1a").send().await.unwrap().subnet.unwrap().subnet_id.unwrap();
        let image = ec2.describe_images().send().await.unwrap().images()[0].image_id().unwrap().to_string();
        // Keelson's launch templates: a new version per change, the group pinned to one.
        let data = |t: InstanceType| RequestLaunchTemplateData::builder().image_id(&image).instance_type(t).user_data("IyEvYmluL3NoCg==").build();
        ec2.create_launch_template().launch_template_name(GROUP).launch_template_data(data(InstanceType::T3Small)).send().await.unwrap();
        ec2.create_launch_template_version().launch_template_name(GROUP).launch_template_data(data(InstanceType::T3Medium)).send().await.unwrap();
        let template = LaunchTemplateSpecification::builder().launch_template_name(GROUP).version("2").build();
        asg.create_auto_scaling_group()
            .auto_scaling_group_name(GROUP)
            .launch_template(template)
            .min_size(1)
            .max_size(3)
            .desired_capacity(1)
            .vpc_zone_identifier(&subnet)
            .tags(tag(CLUSTER_TAG, "ca.example.com"))
            .tags(tag("k8s.io/cluster-autoscaler/node-template/label/node-role.kubernetes.io/node", ""))
            .send()
            .await
            .unwrap();
        let other = LaunchTemplateSpecification::builder().launch_template_name(GROUP).version("1").build();
        asg.create_auto_scaling_group()
            .auto_scaling_group_name("other")
            .launch_template(other)
            .min_size(0)
            .max_size(1)
            .vpc_zone_identifier(&subnet)
            .send()
            .await
            .unwrap();

        // getAutoscalingGroupsByNames (kOps' --nodes) and getAutoscalingGroupsByTags (auto-discovery).
        let by_name = asg.describe_auto_scaling_groups().auto_scaling_group_names(GROUP).max_records(100).send().await.unwrap();
        let g = &by_name.auto_scaling_groups()[0];
        assert_eq!((g.min_size(), g.max_size(), g.desired_capacity(), g.instances().len()), (Some(1), Some(3), Some(1), 1));
        let lt = g.launch_template().expect("the group's launch template");
        assert_eq!((lt.launch_template_name(), lt.version()), (Some(GROUP), Some("2")));
        for filter in [
            Filter::builder().name("tag-key").values(CLUSTER_TAG).build(),
            Filter::builder().name(format!("tag:{CLUSTER_TAG}")).values("ca.example.com").build(),
        ] {
            let found = asg.describe_auto_scaling_groups().filters(filter.clone()).max_records(100).send().await.unwrap();
            let names: Vec<&str> = found.auto_scaling_groups().iter().filter_map(|g| g.auto_scaling_group_name()).collect();
            assert_eq!(names, [GROUP], "{filter:?}");
        }

        // getLaunchTemplateData: the group's version, then its instance type's capacity.
        let versions = ec2.describe_launch_template_versions().launch_template_name(GROUP).versions("2").send().await.unwrap();
        let v = &versions.launch_template_versions()[0];
        assert_eq!(v.launch_template_data().and_then(|d| d.instance_type()), Some(&InstanceType::T3Medium));
        let types = ec2.describe_instance_types().instance_types(InstanceType::T3Medium).send().await.unwrap();
        let t = &types.instance_types()[0];
        assert_eq!((t.v_cpu_info().and_then(|c| c.default_v_cpus()), t.memory_info().and_then(|m| m.size_in_mib())), (Some(2), Some(4096)));

        // Scale up: one more instance, running, of the group's type, and a launch activity.
        asg.set_desired_capacity().auto_scaling_group_name(GROUP).desired_capacity(2).honor_cooldown(false).send().await.unwrap();
        let g = asg.describe_auto_scaling_groups().auto_scaling_group_names(GROUP).send().await.unwrap().auto_scaling_groups()[0].clone();
        let ids: Vec<String> = g.instances().iter().filter_map(|i| i.instance_id().map(str::to_string)).collect();
        assert_eq!((g.desired_capacity(), ids.len()), (Some(2), 2));
        let described = ec2.describe_instances().set_instance_ids(Some(ids.clone())).send().await.unwrap();
        for i in described.reservations().iter().flat_map(|r| r.instances()) {
            assert_eq!(i.state().and_then(|s| s.name()).map(|s| s.as_str()), Some("running"), "{i:?}");
            assert_eq!(i.instance_type(), Some(&InstanceType::T3Medium));
        }
        let activities = asg.describe_scaling_activities().auto_scaling_group_name(GROUP).send().await.unwrap();
        let newest = activities.activities().first().expect("moto lists the group's scaling activities (fix 6)");
        let launched =
            newest.description().and_then(|d| d.strip_prefix("Launching a new EC2 instance: ")).expect("the newest activity is the launch").to_string();
        assert!(ids.contains(&launched), "{launched} not in {ids:?}");
        assert_eq!(newest.status_code().map(|s| s.as_str()), Some("Successful"));
        assert!(newest.start_time().is_some());

        // Above the group's maximum: refused, as AWS does (fix 5); nothing launched.
        let above = asg.set_desired_capacity().auto_scaling_group_name(GROUP).desired_capacity(4).honor_cooldown(false).send().await;
        let e = above.expect_err("a desired capacity above the maximum is refused (fix 5)");
        assert!(code(&e).starts_with("ValidationError: New SetDesiredCapacity value 4 is above max value 3"), "{}", code(&e));

        // Scale down: the instance is terminated and not replaced, the group shrinks.
        let out = asg.terminate_instance_in_auto_scaling_group().instance_id(&launched).should_decrement_desired_capacity(true).send().await.unwrap();
        assert_eq!(out.activity().and_then(|a| a.description()), Some(format!("Terminating EC2 instance: {launched}").as_str()));
        let g = asg.describe_auto_scaling_groups().auto_scaling_group_names(GROUP).send().await.unwrap().auto_scaling_groups()[0].clone();
        let left: Vec<&str> = g.instances().iter().filter_map(|i| i.instance_id()).collect();
        assert_eq!((g.desired_capacity(), left.len()), (Some(1), 1));
        assert!(!left.contains(&launched.as_str()));
        let gone = ec2.describe_instances().instance_ids(&launched).send().await.unwrap();
        let state = gone.reservations()[0].instances()[0].state().and_then(|s| s.name()).map(|s| s.as_str().to_string());
        assert_eq!(state.as_deref(), Some("terminated"), "keelson-local's daemon powers off the machine of an instance no longer running");
        let activities = asg.describe_scaling_activities().auto_scaling_group_name(GROUP).send().await.unwrap();
        let descriptions: Vec<&str> = activities.activities().iter().filter_map(|a| a.description()).collect();
        assert_eq!(descriptions.first().copied(), Some(format!("Terminating EC2 instance: {launched}").as_str()), "newest first: {descriptions:?}");

        // At the minimum, a termination that would shrink the group is refused (fix 5).
        let at_min = asg.terminate_instance_in_auto_scaling_group().instance_id(left[0]).should_decrement_desired_capacity(true).send().await;
        let e = at_min.expect_err("a termination below the minimum is refused (fix 5)");
        assert!(code(&e).starts_with("ValidationError: Currently, desiredSize equals minSize (1)"), "{}", code(&e));
        let other = asg.describe_scaling_activities().auto_scaling_group_name("other").send().await.unwrap();
        assert!(other.activities().is_empty(), "activities are per group: {:?}", other.activities());
    });
}
