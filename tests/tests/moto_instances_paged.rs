//! The harness sees every instance however many are listed: EC2 pages `DescribeInstances` (moto at
//! 100 reservations), and the daemon boots a machine only for an instance its listing shows. With a
//! single call, the 100-cycle selfheal soak's 97th replacement (the 102nd instance, behind 96
//! terminated ones) was launched by its group and never booted.

mod support;

use aws_sdk_ec2::types::InstanceType;

#[test]
fn the_instance_listing_follows_every_page() {
    let log = tempfile::NamedTempFile::new().unwrap();
    let moto = keelson_local::moto::Moto::start(log.path()).expect("moto (scripts/test creates the venv; or set KEELSON_PYTHON)");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let region = "eu-west-1";
    let (launched, terminated) = rt.block_on(async {
        let conf = support::moto_sdk(&moto.endpoint()).await;
        let ec2 = aws_sdk_ec2::Client::new(&conf);
        let image = ec2.describe_images().send().await.unwrap().images()[0].image_id().unwrap().to_string();
        // One reservation per instance, as an Auto Scaling group launches them; most terminated, as
        // a soak leaves them.
        let mut ids = Vec::new();
        for _ in 0..103 {
            let out = ec2.run_instances().image_id(&image).instance_type(InstanceType::T3Micro).min_count(1).max_count(1).send().await.unwrap();
            ids.push(out.instances()[0].instance_id().unwrap().to_string());
        }
        let gone: Vec<String> = ids[..100].to_vec();
        ec2.terminate_instances().set_instance_ids(Some(gone.clone())).send().await.unwrap();
        let one_page = ec2.describe_instances().send().await.unwrap();
        assert!(one_page.next_token().is_some(), "moto no longer pages DescribeInstances: this test needs more instances to mean anything");
        (ids, gone)
    });
    let cloud = keelson_local::cloud::Cloud::new(&moto.endpoint(), region);
    let listed = cloud.instances().expect("DescribeInstances");
    let mut ids: Vec<&str> = listed.iter().map(|i| i.id.as_str()).collect();
    ids.sort();
    let mut want: Vec<&str> = launched.iter().map(String::as_str).collect();
    want.sort();
    assert_eq!(ids, want, "every instance, on every page");
    let running: Vec<&str> = listed.iter().filter(|i| i.state == "running").map(|i| i.id.as_str()).collect();
    assert_eq!(running.len(), 3, "the three still running (the newest, listed last): {running:?}");
    assert!(listed.iter().filter(|i| terminated.contains(&i.id)).all(|i| i.state == "terminated"));
}
