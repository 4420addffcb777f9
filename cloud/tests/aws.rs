//! cloud against real servers: moto (EC2, Route53) and a local IMDS server.

#[path = "support/moto.rs"]
mod moto;

use std::time::{Duration, Instant};

use cloud::calls::CallCounter;
use cloud::dns::{batches, Dns, Record, RecordChange, Route53Dns};
use cloud::fault::{Throttle, ThrottleKind};
use cloud::imds::{Imds, InstanceMetadata};
use cloud::volumes::{Ec2, VolumeFilter, Volumes};
use cloud::{Identity, ImdsError, VolumeError};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

#[test]
fn ec2_throttling_is_retried_then_succeeds() {
    let (_g, m) = moto::lock();
    rt().block_on(async {
        let conf = moto::sdk(&m.url).await;
        aws_sdk_ec2::Client::new(&conf).create_volume().availability_zone("us-east-1a").size(1).send().await.expect("CreateVolume");
        let throttle = Throttle::new(ThrottleKind::Ec2RequestLimitExceeded, 3);
        let counter = CallCounter::default();
        let client =
            aws_sdk_ec2::Client::from_conf(aws_sdk_ec2::config::Builder::from(&conf).interceptor(throttle.clone()).interceptor(counter.clone()).build());
        let vols = Ec2::new(client).find_volumes(&VolumeFilter::default()).await.expect("DescribeVolumes");
        assert_eq!(vols.len(), 1);
        assert_eq!(throttle.injected(), 3);
        let snap = counter.snapshot();
        let dv = snap.get("ec2/DescribeVolumes").copied().unwrap_or_default();
        assert_eq!((dv.calls, dv.attempts), (1, 4), "3 throttled attempts + 1 good one: {snap:?}");
    });
}

#[test]
fn ec2_throttling_gives_up_after_max_attempts() {
    let (_g, m) = moto::lock();
    rt().block_on(async {
        let conf = moto::sdk(&m.url).await;
        let throttle = Throttle::new(ThrottleKind::Ec2RequestLimitExceeded, 100);
        let counter = CallCounter::default();
        let client = aws_sdk_ec2::Client::from_conf(
            aws_sdk_ec2::config::Builder::from(&conf)
                .retry_config(cloud::aws::retry_config(&cloud::AwsOptions {
                    max_attempts: 4,
                    initial_backoff: Duration::from_millis(20),
                    ..Default::default()
                }))
                .interceptor(throttle.clone())
                .interceptor(counter.clone())
                .build(),
        );
        let t = Instant::now();
        let err = Ec2::new(client).find_volumes(&VolumeFilter::default()).await.expect_err("always throttled");
        match err {
            VolumeError::Api { code, .. } => assert_eq!(code, "RequestLimitExceeded"),
            other => panic!("unexpected {other}"),
        }
        assert_eq!(throttle.injected(), 4);
        let snap = counter.snapshot();
        assert_eq!(snap.get("ec2/DescribeVolumes").map(|c| c.attempts), Some(4), "{snap:?}");
        assert!(t.elapsed() < Duration::from_secs(10), "bounded: {:?}", t.elapsed());
    });
}

async fn zone(conf: &cloud::aws::SdkConfig, name: &str) -> String {
    let r53 = aws_sdk_route53::Client::new(conf);
    let z = r53.create_hosted_zone().name(name).caller_reference(format!("t-{name}")).send().await.expect("CreateHostedZone");
    z.hosted_zone().expect("zone").id().trim_start_matches("/hostedzone/").to_string()
}

#[test]
fn route53_changes_are_batched_and_ttld() {
    let (_g, m) = moto::lock();
    rt().block_on(async {
        let conf = moto::sdk(&m.url).await;
        let zid = zone(&conf, "batch.example.com").await;
        let counter = CallCounter::default();
        let throttle = Throttle::new(ThrottleKind::Route53Throttling, 2);
        let dns = Route53Dns::new(aws_sdk_route53::Client::from_conf(
            aws_sdk_route53::config::Builder::from(&conf).interceptor(counter.clone()).interceptor(throttle.clone()).build(),
        ));
        assert_eq!(dns.find_zone(None, "x.cl.batch.example.com").await.expect("zone by suffix"), zid);
        assert_eq!(dns.find_zone(Some("batch.example.com"), "").await.expect("zone by name"), zid);
        assert_eq!(dns.find_zone(Some(&zid), "").await.expect("zone by id"), zid);
        let n = 1201;
        let changes: Vec<RecordChange> = (0..n)
            .map(|i| {
                RecordChange::Upsert(Record {
                    name: format!("r{i}.cl.batch.example.com"),
                    rtype: "A".into(),
                    ttl: 60,
                    values: vec![format!("10.1.{}.{}", i / 250, i % 250 + 1)],
                })
            })
            .collect();
        let calls = dns.apply_changes(&zid, &changes).await.expect("apply");
        assert_eq!(batches(&changes).len(), 3);
        assert_eq!(calls, 3, "{n} single-value UPSERTs → 500 + 500 + 201 (UPSERT counts twice toward 1000)");
        assert_eq!(throttle.injected(), 2, "Route53 throttling injected and retried");
        let recs = dns.list_records(&zid, "cl.batch.example.com").await.expect("list");
        assert_eq!(recs.len(), n);
        assert!(recs.iter().all(|r| r.ttl == 60 && r.rtype == "A" && r.values.len() == 1));
        let snap = counter.snapshot();
        assert_eq!(snap.get("route53/ChangeResourceRecordSets").map(|c| c.calls), Some(3), "{snap:?}");
    });
}

#[test]
fn imds_identity_with_tokens() {
    let srv = testkit::imds::ImdsServer::start(&[
        ("instance-id", "i-0abc"),
        ("placement/availability-zone", "eu-west-1b"),
        ("placement/region", "eu-west-1"),
        ("local-ipv4", "172.20.64.10"),
    ]);
    rt().block_on(async {
        let imds = Imds::new(Some(&srv.url)).expect("client");
        let resolve = |flags: base::instance::Overrides| {
            let imds = &imds;
            async move { base::instance::resolve(&flags, base::instance::Source::Aws(imds)).await.expect("facts").identity().expect("identity") }
        };
        let id = resolve(Default::default()).await;
        assert_eq!(id, Identity { instance_id: "i-0abc".into(), zone: "eu-west-1b".into(), region: "eu-west-1".into(), internal_ip: "172.20.64.10".into() });
        assert_eq!(srv.faults().tokens_issued, 1, "token reused");
        // Overrides are not fetched.
        let id = resolve(base::instance::Overrides { instance_id: Some("i-x".into()), internal_ip: Some("10.0.0.1".into()), ..Default::default() }).await;
        assert_eq!(id.instance_id, "i-x");
        assert_eq!(id.internal_ip, "10.0.0.1");
        assert_eq!(imds.get("no/such/path").await.expect("404 is not an error"), None);
    });
}

#[test]
fn imds_refreshes_token_on_401_and_retries_5xx() {
    let srv = testkit::imds::ImdsServer::start(&[("instance-id", "i-1"), ("local-ipv4", "10.0.0.5")]);
    srv.faults().revoke_after = Some(1);
    rt().block_on(async {
        let imds = Imds::new(Some(&srv.url)).expect("client");
        assert_eq!(imds.get("instance-id").await.expect("get").as_deref(), Some("i-1"));
        // The token was revoked: the next GET sees 401, refreshes, and succeeds.
        assert_eq!(imds.get("local-ipv4").await.expect("get").as_deref(), Some("10.0.0.5"));
        assert_eq!(srv.faults().tokens_issued, 2);
        srv.faults().fail_next = vec![500, 503];
        assert_eq!(imds.get("instance-id").await.expect("get after 5xx").as_deref(), Some("i-1"));
    });
}

#[test]
fn imds_gives_up_within_deadline() {
    let srv = testkit::imds::ImdsServer::start(&[("instance-id", "i-1")]);
    srv.faults().fail_next = vec![500; 1000];
    rt().block_on(async {
        let mut imds = Imds::new(Some(&srv.url)).expect("client");
        imds.deadline = Duration::from_secs(2);
        imds.max_attempts = 50;
        let t = Instant::now();
        match imds.get("instance-id").await {
            Err(ImdsError::Exhausted { attempts, .. }) => assert!(attempts >= 2, "retried: {attempts}"),
            other => panic!("expected Exhausted, got {other:?}"),
        }
        assert!(t.elapsed() < Duration::from_secs(4), "bounded by the deadline: {:?}", t.elapsed());
        // Nothing listening: transport errors are retried and bounded too.
        let mut dead = Imds::new(Some("http://127.0.0.1:9")).expect("client");
        dead.deadline = Duration::from_secs(1);
        assert!(dead.get("instance-id").await.is_err());
    });
}

#[test]
fn attach_of_a_volume_in_use_is_a_lost_race() {
    let (_g, m) = moto::lock();
    rt().block_on(async {
        let conf = moto::sdk(&m.url).await;
        let plain = aws_sdk_ec2::Client::new(&conf);
        let v = plain.create_volume().availability_zone("us-east-1a").size(1).send().await.expect("CreateVolume");
        let vid = v.volume_id().expect("id").to_string();
        let r = plain.run_instances().image_id("ami-12345678").min_count(1).max_count(1).send().await.expect("RunInstances");
        let iid = r.instances()[0].instance_id().expect("id").to_string();
        // moto accepts AttachVolume of an in-use volume; AWS answers VolumeInUse: inject it.
        let fault = Throttle::new(ThrottleKind::Ec2Error("VolumeInUse"), 1);
        let ec2 = Ec2::new(aws_sdk_ec2::Client::from_conf(aws_sdk_ec2::config::Builder::from(&conf).interceptor(fault.clone()).build()));
        match ec2.attach_volume(&vid, &iid, "/dev/xvdu").await {
            Err(VolumeError::InUse { volume }) => assert_eq!(volume, vid),
            other => panic!("expected InUse, got {other:?}"),
        }
        assert_eq!(fault.injected(), 1, "not retried: a lost race is not transient");
        // Unknown instance ids are absent, not an error; a terminated one is reported as such.
        use cloud::volumes::Instances;
        assert!(ec2.describe_instances(&["i-00000000000000000".to_string()]).await.expect("describe").is_empty());
        plain.terminate_instances().instance_ids(&iid).send().await.expect("terminate");
        let got = ec2.describe_instances(std::slice::from_ref(&iid)).await.expect("describe");
        assert_eq!(got.len(), 1);
        assert!(!got[0].state.is_alive());
    });
}

#[test]
fn route53_prefers_the_zone_kind_asked_for() {
    let (_g, m) = moto::lock();
    rt().block_on(async {
        let conf = moto::sdk(&m.url).await;
        let public = zone(&conf, "split.example.com").await;
        let ec2 = aws_sdk_ec2::Client::new(&conf);
        let vpc = ec2.create_vpc().cidr_block("10.9.0.0/16").send().await.expect("CreateVpc");
        let vpc_id = vpc.vpc().and_then(|v| v.vpc_id()).expect("vpc").to_string();
        let r53 = aws_sdk_route53::Client::new(&conf);
        let p = r53
            .create_hosted_zone()
            .name("split.example.com")
            .caller_reference("private-split")
            .hosted_zone_config(aws_sdk_route53::types::HostedZoneConfig::builder().private_zone(true).build())
            .vpc(aws_sdk_route53::types::Vpc::builder().vpc_id(vpc_id).vpc_region(aws_sdk_route53::types::VpcRegion::UsEast1).build())
            .send()
            .await
            .expect("private zone");
        let private = p.hosted_zone().expect("zone").id().trim_start_matches("/hostedzone/").to_string();
        assert_ne!(public, private);
        let dns = Route53Dns::new(r53);
        assert_eq!(dns.find_zone_with(None, "c.split.example.com", Some(true)).await.expect("private"), private);
        assert_eq!(dns.find_zone_with(None, "c.split.example.com", Some(false)).await.expect("public"), public);
        assert!(matches!(dns.find_zone(None, "c.nowhere.invalid").await, Err(cloud::DnsError::NoZone(_))));
    });
}
