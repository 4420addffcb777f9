//! The local cloud's moto behaves as EC2 where the cluster depends on it: a route to an instance
//! that has terminated is a blackhole (fix 3 of `testkit/src/moto_server.py`; without it the AWS
//! cloud-controller-manager's route controller stops writing routes once a node is replaced).

mod support;

use aws_sdk_ec2::types::{InstanceType, RouteState};

#[test]
fn a_route_to_a_terminated_instance_is_a_blackhole() {
    let log = tempfile::NamedTempFile::new().unwrap();
    let moto = keelson_local::moto::Moto::start(log.path()).expect("moto (scripts/test creates the venv; or set KEELSON_PYTHON)");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let conf = support::moto_sdk(&moto.endpoint()).await;
        let ec2 = aws_sdk_ec2::Client::new(&conf);
        let vpc = ec2.create_vpc().cidr_block("10.0.0.0/16").send().await.unwrap().vpc.unwrap().vpc_id.unwrap();
        let subnet = ec2.create_subnet().vpc_id(&vpc).cidr_block("10.0.1.0/24").send().await.unwrap().subnet.unwrap().subnet_id.unwrap();
        let table = ec2.create_route_table().vpc_id(&vpc).send().await.unwrap().route_table.unwrap().route_table_id.unwrap();
        let image = ec2.describe_images().send().await.unwrap().images()[0].image_id().unwrap().to_string();
        let run = |_: ()| ec2.run_instances().image_id(&image).instance_type(InstanceType::T3Medium).subnet_id(&subnet).min_count(1).max_count(1).send();
        let live = run(()).await.unwrap().instances()[0].instance_id().unwrap().to_string();
        let dead = run(()).await.unwrap().instances()[0].instance_id().unwrap().to_string();
        for (cidr, instance) in [("100.96.1.0/24", &live), ("100.96.2.0/24", &dead)] {
            ec2.create_route().route_table_id(&table).destination_cidr_block(cidr).instance_id(instance).send().await.unwrap();
        }
        ec2.terminate_instances().instance_ids(&dead).send().await.unwrap();
        let out = ec2.describe_route_tables().route_table_ids(&table).send().await.unwrap();
        let routes = out.route_tables()[0].routes();
        let state = |cidr: &str| routes.iter().find(|r| r.destination_cidr_block() == Some(cidr)).and_then(|r| r.state().cloned());
        assert_eq!(state("100.96.1.0/24"), Some(RouteState::Active), "the route to the running instance");
        assert_eq!(state("100.96.2.0/24"), Some(RouteState::Blackhole), "the route to the terminated instance: {routes:?}");
    });
}
