//! protokube end to end: the real binary against a real moto server, with real loop devices as volumes.
//! Needs root (losetup, mkfs, mount) and moto (scripts/test installs both); fails loudly otherwise.

#[path = "support/host.rs"]
mod host;
#[path = "../../cloud/tests/support/moto.rs"]
mod moto;

use std::collections::BTreeMap;

use host::{create_volume, etcd_tags, need_root, tag, volume, Cluster, LoopDev};

const FORMATTED: &str = "keelson.io/etcd-formatted";

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

async fn clients(url: &str) -> (aws_sdk_ec2::Client, aws_sdk_route53::Client) {
    let conf = moto::sdk(url).await;
    (aws_sdk_ec2::Client::new(&conf), aws_sdk_route53::Client::new(&conf))
}

async fn zone(r53: &aws_sdk_route53::Client, name: &str) -> String {
    let z = r53.create_hosted_zone().name(name).caller_reference(name).send().await.expect("CreateHostedZone");
    z.hosted_zone().expect("zone").id().trim_start_matches("/hostedzone/").to_string()
}

/// name → (ttl, values) of the A records in the zone.
async fn records(r53: &aws_sdk_route53::Client, zone: &str) -> BTreeMap<String, (i64, Vec<String>)> {
    let r = r53.list_resource_record_sets().hosted_zone_id(zone).send().await.expect("ListResourceRecordSets");
    r.resource_record_sets()
        .iter()
        .filter(|s| s.r#type().as_str() == "A")
        .map(|s| {
            let mut v: Vec<String> = s.resource_records().iter().map(|r| r.value().to_string()).collect();
            v.sort();
            (s.name().trim_end_matches('.').to_string(), (s.ttl().unwrap_or(0), v))
        })
        .collect()
}

fn attached_to(v: &aws_sdk_ec2::types::Volume) -> Vec<String> {
    v.attachments().iter().filter_map(|a| a.instance_id().map(str::to_string)).collect()
}

const ROUTE53: &str = "  dnsZone: example.com\n  topology:\n    dns:\n      type: Public\n";

#[test]
fn blank_volumes_formatted_mounted_tagged_dns_then_second_pass_changes_nothing() {
    need_root();
    let (_g, m) = moto::lock();
    rt().block_on(async {
        let (ec2, r53) = clients(&m.url).await;
        let zid = zone(&r53, "example.com").await;
        let name = "t1.example.com";
        let c = Cluster::new(&m.url, name, &[("main", &[("a", "cp-a"), ("b", "cp-b")]), ("events", &[("a", "cp-a"), ("b", "cp-b")])], ROUTE53);
        let h = host::host(&ec2, "us-east-1a", "cp-a").await;
        let (d1, d2) = (LoopDev::new(64), LoopDev::new(64));
        let main_a = create_volume(&ec2, "us-east-1a", &etcd_tags(name, "main", "a", &["a", "b"])).await;
        let events_a = create_volume(&ec2, "us-east-1a", &etcd_tags(name, "events", "a", &["a", "b"])).await;
        // b's volumes exist in zone b; nobody holds them yet.
        let _main_b = create_volume(&ec2, "us-east-1b", &etcd_tags(name, "main", "b", &["a", "b"])).await;
        h.link(&main_a, &d1.dev);
        h.link(&events_a, &d2.dev);

        let r = c.run(&h, &["--once"]);
        assert!(r.ok, "protokube failed:\n{}", r.stderr);
        // etcd-a, etcd-events-a, api.internal, kops-controller.internal, api (no load balancer) with the IP;
        // etcd-b, etcd-events-b placeholders.
        assert_eq!(r.last_line(), "protokube: 2 volumes mounted, 2 manifests written, 7 dns records", "{}", r.stderr);
        for vid in [&main_a, &events_a] {
            assert!(h.is_mounted(vid), "{vid} mounted at /mnt/master-{vid}");
            let v = volume(&ec2, vid).await;
            assert_eq!(tag(&v, FORMATTED), Some("ext4"), "initialised volume is tagged");
            assert_eq!(attached_to(&v), vec![h.instance_id.clone()]);
        }
        let out = host::sh(&format!("blkid -p -o value -s TYPE {}", d1.dev.display()));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ext4");

        let main = h.manifest("main").expect("main manifest");
        for want in [
            "--name=etcd-a",
            &format!("--data-dir=/mnt/master-{main_a}/data"),
            "--listen-peer-urls=https://0.0.0.0:2380",
            "--listen-client-urls=https://0.0.0.0:4001",
            "--initial-advertise-peer-urls=https://etcd-a.internal.t1.example.com:2380",
            "--advertise-client-urls=https://etcd-a.internal.t1.example.com:4001",
            "--initial-cluster=etcd-a=https://etcd-a.internal.t1.example.com:2380,etcd-b=https://etcd-b.internal.t1.example.com:2380",
            "--initial-cluster-state=new",
            "cpu: 100m",
            "memory: 100Mi",
            "image: registry.k8s.io/etcd:v3.5.21",
            "--client-cert-auth=true",
            "--trusted-ca-file=/etc/kubernetes/pki/etcd/main/clients-ca.crt",
            "--peer-trusted-ca-file=/etc/kubernetes/pki/etcd/main/peer-ca.crt",
        ] {
            assert!(main.contains(want), "main manifest lacks {want}:\n{main}");
        }
        // Certificates issued from the state store's CAs, keys private, for this member's name and IP.
        let pki = h.root.path().join("etc/kubernetes/pki/etcd/main");
        let text = String::from_utf8_lossy(&host::sh(&format!("openssl x509 -noout -text -in {}/server.crt", pki.display())).stdout).to_string();
        assert!(text.contains("DNS:etcd-a.internal.t1.example.com") && text.contains(&format!("IP Address:{}", h.ip)), "{text}");
        host::sh(&format!(
            "openssl verify -CAfile {0}/ca.crt -untrusted {0}/server.crt {0}/server.crt && openssl verify -CAfile {0}/ca.crt -untrusted {0}/client.crt {0}/client.crt && openssl verify -CAfile {0}/peer-ca.crt {0}/peer.crt",
            pki.display()
        ));
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(pki.join("server.key")).expect("key").permissions());
        assert_eq!(mode & 0o777, 0o600);
        let events = h.manifest("events").expect("events manifest");
        assert!(events.contains("--name=etcd-events-a") && events.contains("0.0.0.0:2381") && events.contains("0.0.0.0:4002"), "{events}");
        assert!(events.contains("etcd-events-b=https://etcd-events-b.internal.t1.example.com:2381"), "{events}");

        let recs = records(&r53, &zid).await;
        let ip = vec![h.ip.clone()];
        let ph = vec!["203.0.113.123".to_string()];
        assert_eq!(recs.get("etcd-a.internal.t1.example.com"), Some(&(60, ip.clone())));
        assert_eq!(recs.get("etcd-events-a.internal.t1.example.com"), Some(&(60, ip.clone())));
        assert_eq!(recs.get("api.internal.t1.example.com"), Some(&(60, ip.clone())));
        assert_eq!(recs.get("api.t1.example.com"), Some(&(60, vec![h.public_ip.clone()])), "public name → public IP");
        assert_eq!(recs.get("etcd-b.internal.t1.example.com"), Some(&(60, ph.clone())), "placeholder until b is up");
        assert_eq!(recs.get("etcd-events-b.internal.t1.example.com"), Some(&(60, ph.clone())));

        // Second pass: nothing changes, only read calls (zone lookup + volumes + instances + records).
        let before = (d1.sha256(), h.manifest("main"));
        let r2 = c.run(&h, &["--once"]);
        assert!(r2.ok, "{}", r2.stderr);
        assert_eq!(r2.last_line(), "protokube: 0 volumes mounted, 0 manifests written, 0 dns records", "{}", r2.stderr);
        assert_eq!(r2.cloud_calls(), Some(4), "{}", r2.stderr);
        assert_eq!(before.1, h.manifest("main"));

        // b comes up in zone b: its records replace the placeholders; api.internal lists both.
        let hb = host::host(&ec2, "us-east-1b", "cp-b").await;
        let db = LoopDev::new(64);
        hb.link(&_main_b, &db.dev);
        let rb = c.run(&hb, &["--once"]);
        assert!(rb.ok, "{}", rb.stderr);
        assert!(rb.stderr.contains("no volume in zone us-east-1b tagged for members [\"b\"]"), "events b has no volume: {}", rb.stderr);
        let recs = records(&r53, &zid).await;
        assert_eq!(recs.get("etcd-b.internal.t1.example.com"), Some(&(60, vec![hb.ip.clone()])));
        let mut both = vec![h.ip.clone(), hb.ip.clone()];
        both.sort();
        assert_eq!(recs.get("api.internal.t1.example.com"), Some(&(60, both)));
        assert_eq!(recs.get("etcd-events-b.internal.t1.example.com"), Some(&(60, ph)), "still no owner");
    });
}

#[test]
fn volume_with_data_is_mounted_never_formatted() {
    need_root();
    let (_g, m) = moto::lock();
    rt().block_on(async {
        let (ec2, _) = clients(&m.url).await;
        let name = "data.k8s.local";
        let c = Cluster::new(&m.url, name, &[("main", &[("a", "cp-a")])], "");
        let h = host::host(&ec2, "us-east-1a", "cp-a").await;
        let d = LoopDev::new(64);
        host::sh(&format!("mkfs.ext4 -q {}", d.dev.display()));
        let tmp = tempfile::tempdir().expect("tmp");
        host::sh(&format!(
            "mount {} {} && echo precious > {}/data.txt && umount {}",
            d.dev.display(),
            tmp.path().display(),
            tmp.path().display(),
            tmp.path().display()
        ));
        let uuid = String::from_utf8_lossy(&host::sh(&format!("blkid -p -o value -s UUID {}", d.dev.display())).stdout).trim().to_string();
        let vid = create_volume(&ec2, "us-east-1a", &etcd_tags(name, "main", "a", &["a"])).await;
        h.link(&vid, &d.dev);

        let r = c.run(&h, &["--once"]);
        assert!(r.ok, "{}", r.stderr);
        assert!(r.last_line().starts_with("protokube: 1 volumes mounted, 1 manifests written"), "{}", r.last_line());
        assert!(!r.stderr.contains("formatting"), "{}", r.stderr);
        assert_eq!(std::fs::read_to_string(h.mount_point(&vid).join("data.txt")).expect("data survives"), "precious\n");
        let uuid2 = String::from_utf8_lossy(&host::sh(&format!("blkid -p -o value -s UUID {}", d.dev.display())).stdout).trim().to_string();
        assert_eq!(uuid, uuid2, "same filesystem");
        assert_eq!(tag(&volume(&ec2, &vid).await, FORMATTED), Some("ext4"), "an initialised volume gets the tag");
        // hosts-file DNS for a .k8s.local cluster
        let hosts = std::fs::read_to_string(h.root.path().join("etc/hosts")).expect("hosts");
        assert!(
            hosts.contains(&format!("{}\tapi.internal.data.k8s.local etcd-a.internal.data.k8s.local kops-controller.internal.data.k8s.local\n", h.ip)),
            "{hosts}"
        );
        assert!(!hosts.contains("api.data.k8s.local"), "{hosts}");
        // … and the live API servers published where the workers read them.
        let published = std::fs::read_to_string(c.state.path().join(keelson_api::nodeup::API_SERVERS_KEY)).expect("published for the workers");
        assert_eq!(published, format!("addresses:\n- {}\n", h.ip));
    });
}

#[test]
fn unknown_signature_and_partition_table_are_refused_not_formatted() {
    need_root();
    let (_g, m) = moto::lock();
    rt().block_on(async {
        let (ec2, _) = clients(&m.url).await;
        let name = "refuse.k8s.local";
        let c = Cluster::new(&m.url, name, &[("main", &[("a", "cp-a")]), ("events", &[("a", "cp-a")])], "");
        let h = host::host(&ec2, "us-east-1a", "cp-a").await;
        let (junk, pt) = (LoopDev::new(64), LoopDev::new(64));
        host::sh(&format!("head -c 4096 /dev/urandom | dd of={} conv=notrunc status=none", junk.dev.display()));
        // A DOS partition table: one Linux partition at LBA 2048 and the 0x55AA signature.
        host::sh(&format!(
            "printf '\\000\\000\\000\\000\\203\\000\\000\\000\\000\\010\\000\\000\\000\\200\\000\\000' | dd of={0} bs=1 seek=446 conv=notrunc status=none && printf '\\125\\252' | dd of={0} bs=1 seek=510 conv=notrunc status=none",
            pt.dev.display()
        ));
        let before = (junk.sha256(), pt.sha256());
        let v1 = create_volume(&ec2, "us-east-1a", &etcd_tags(name, "main", "a", &["a"])).await;
        let v2 = create_volume(&ec2, "us-east-1a", &etcd_tags(name, "events", "a", &["a"])).await;
        h.link(&v1, &junk.dev);
        h.link(&v2, &pt.dev);
        let r = c.run(&h, &["--once"]);
        assert!(!r.ok, "a refused volume makes --once fail:\n{}", r.stderr);
        assert!(r.stderr.contains("unknown data, refusing to format"), "{}", r.stderr);
        assert!(r.stderr.contains("holds a dos partition table"), "{}", r.stderr);
        assert_eq!((junk.sha256(), pt.sha256()), before, "devices untouched");
        assert!(!h.is_mounted(&v1) && !h.is_mounted(&v2));
        assert!(h.manifest("main").is_none() && h.manifest("events").is_none());
        assert_eq!(tag(&volume(&ec2, &v1).await, FORMATTED), None);
    });
}

#[test]
fn volume_in_other_zone_or_held_by_live_instance_is_left_alone() {
    need_root();
    let (_g, m) = moto::lock();
    rt().block_on(async {
        let (ec2, _) = clients(&m.url).await;
        let name = "alone.k8s.local";
        let c = Cluster::new(&m.url, name, &[("main", &[("a", "cp-a")]), ("events", &[("a", "cp-a")])], "");
        let h = host::host(&ec2, "us-east-1a", "cp-a").await;
        let d = LoopDev::new(64);
        let other_zone = create_volume(&ec2, "us-east-1b", &etcd_tags(name, "main", "a", &["a"])).await;
        let held = create_volume(&ec2, "us-east-1a", &etcd_tags(name, "events", "a", &["a"])).await;
        // Another control plane of the member's group (its autoscaling group made it).
        let (live, _) = host::run_instance(&ec2, "us-east-1a", None, None).await;
        host::tag_made_for_group(&m.url, &live, name, "cp-a");
        ec2.attach_volume().volume_id(&held).instance_id(&live).device("/dev/xvdu").send().await.expect("attach to live");
        h.link(&other_zone, &d.dev);
        h.link(&held, &d.dev);
        let before = d.sha256();
        let r = c.run(&h, &["--once"]);
        assert!(r.ok, "{}", r.stderr);
        // The live holder owns member a of events: its name points at that instance.
        assert_eq!(r.last_line(), "protokube: 0 volumes mounted, 0 manifests written, 1 dns records");
        assert!(r.stderr.contains("no volume in zone us-east-1a tagged for members [\"a\"]"), "{}", r.stderr);
        assert!(r.stderr.contains(&format!("attached to live instance {live}")), "{}", r.stderr);
        assert!(attached_to(&volume(&ec2, &other_zone).await).is_empty(), "other-zone volume not attached");
        assert_eq!(attached_to(&volume(&ec2, &held).await), vec![live], "live holder keeps its volume");
        assert_eq!(d.sha256(), before);
    });
}

#[test]
fn replacement_instance_claims_same_volume_data_survives_dns_follows() {
    need_root();
    let (_g, m) = moto::lock();
    rt().block_on(async {
        let (ec2, r53) = clients(&m.url).await;
        let zid = zone(&r53, "example.com").await;
        let name = "re.example.com";
        let c = Cluster::new(&m.url, name, &[("main", &[("a", "cp-a")])], ROUTE53);
        let h1 = host::host(&ec2, "us-east-1a", "cp-a").await;
        let d = LoopDev::new(64);
        let vid = create_volume(&ec2, "us-east-1a", &etcd_tags(name, "main", "a", &["a"])).await;
        h1.link(&vid, &d.dev);
        let r = c.run(&h1, &["--once"]);
        assert!(r.ok, "{}", r.stderr);
        std::fs::write(h1.mount_point(&vid).join("data/keep.txt"), "keep")
            .or_else(|_| {
                std::fs::create_dir_all(h1.mount_point(&vid).join("data"))?;
                std::fs::write(h1.mount_point(&vid).join("data/keep.txt"), "keep")
            })
            .expect("write data");
        let manifest1 = h1.manifest("main").expect("manifest");
        // The instance dies: its mounts go away and the ASG's replacement gets another IP.
        h1.unmount_all();
        ec2.terminate_instances().instance_ids(&h1.instance_id).send().await.expect("terminate");
        let h2 = host::host(&ec2, "us-east-1a", "cp-a").await;
        assert_ne!(h1.ip, h2.ip);
        h2.link(&vid, &d.dev);
        // Identity from IMDSv2 this time.
        let imds = testkit::imds::ImdsServer::start(&[
            ("instance-id", &h2.instance_id),
            ("placement/availability-zone", "us-east-1a"),
            ("placement/region", moto::REGION),
            ("local-ipv4", &h2.ip),
        ]);
        let r = c.run(&h2, &["--once", "--imds-url", &imds.url]);
        assert!(r.ok, "{}", r.stderr);
        assert_eq!(r.last_line(), "protokube: 1 volumes mounted, 1 manifests written, 4 dns records", "{}", r.stderr);
        assert!(!r.stderr.contains("formatting"));
        assert_eq!(std::fs::read_to_string(h2.mount_point(&vid).join("data/keep.txt")).expect("data survives"), "keep");
        assert_eq!(h2.manifest("main").expect("manifest"), manifest1, "same member, same manifest");
        assert_eq!(attached_to(&volume(&ec2, &vid).await), vec![h2.instance_id.clone()]);
        let recs = records(&r53, &zid).await;
        for n in ["etcd-a.internal.re.example.com", "api.internal.re.example.com"] {
            assert_eq!(recs.get(n), Some(&(60, vec![h2.ip.clone()])), "{n}");
        }
        assert_eq!(recs.get("api.re.example.com"), Some(&(60, vec![h2.public_ip.clone()])));
        assert!(imds.faults().tokens_issued >= 1);
    });
}

#[test]
fn two_control_planes_in_one_zone_get_their_own_members_volumes() {
    need_root();
    let (_g, m) = moto::lock();
    rt().block_on(async {
        let (ec2, _) = clients(&m.url).await;
        let name = "two.k8s.local";
        let c = Cluster::new(&m.url, name, &[("main", &[("a1", "cp-a1"), ("a2", "cp-a2"), ("b", "cp-b")])], "");
        let all = ["a1", "a2", "b"];
        let v_a1 = create_volume(&ec2, "us-east-1a", &etcd_tags(name, "main", "a1", &all)).await;
        let v_a2 = create_volume(&ec2, "us-east-1a", &etcd_tags(name, "main", "a2", &all)).await;
        let (d1, d2) = (LoopDev::new(64), LoopDev::new(64));
        // The second group's instance starts first: it must not take a1's volume.
        let h2 = host::host(&ec2, "us-east-1a", "cp-a2").await;
        h2.link(&v_a1, &d1.dev);
        h2.link(&v_a2, &d2.dev);
        let r = c.run(&h2, &["--once"]);
        assert!(r.ok, "{}", r.stderr);
        assert_eq!(attached_to(&volume(&ec2, &v_a2).await), vec![h2.instance_id.clone()]);
        assert!(attached_to(&volume(&ec2, &v_a1).await).is_empty());
        assert!(h2.manifest("main").expect("manifest").contains("--name=etcd-a2"));
        let h1 = host::host(&ec2, "us-east-1a", "cp-a1").await;
        h1.link(&v_a1, &d1.dev);
        h1.link(&v_a2, &d2.dev);
        let r = c.run(&h1, &["--once"]);
        assert!(r.ok, "{}", r.stderr);
        assert_eq!(attached_to(&volume(&ec2, &v_a1).await), vec![h1.instance_id.clone()]);
        assert!(h1.manifest("main").expect("manifest").contains("--name=etcd-a1"));
        let hosts = std::fs::read_to_string(h1.root.path().join("etc/hosts")).expect("hosts");
        assert!(
            hosts.contains(&format!("{}\tapi.internal.two.k8s.local etcd-a2.internal.two.k8s.local kops-controller.internal.two.k8s.local\n", h2.ip)),
            "{hosts}"
        );
        assert!(
            hosts.contains(&format!("{}\tapi.internal.two.k8s.local etcd-a1.internal.two.k8s.local kops-controller.internal.two.k8s.local\n", h1.ip)),
            "{hosts}"
        );
        // Whichever control plane passes last, the workers' document lists both.
        let published = std::fs::read_to_string(c.state.path().join(keelson_api::nodeup::API_SERVERS_KEY)).expect("published");
        let doc: keelson_api::nodeup::ApiServers = serde_yaml_ng::from_str(&published).expect("an API servers document");
        let mut both: Vec<std::net::IpAddr> = [&h1.ip, &h2.ip].iter().map(|ip| ip.parse().expect("an IP")).collect();
        both.sort();
        assert_eq!(doc.addresses, both);
    });
}

#[test]
fn missing_device_is_reported_then_the_attached_volume_is_kept() {
    need_root();
    let (_g, m) = moto::lock();
    rt().block_on(async {
        let (ec2, _) = clients(&m.url).await;
        let name = "wait.k8s.local";
        let c = Cluster::new(&m.url, name, &[("main", &[("a", "cp-a")])], "");
        let h = host::host(&ec2, "us-east-1a", "cp-a").await;
        let vid = create_volume(&ec2, "us-east-1a", &etcd_tags(name, "main", "a", &["a"])).await;
        let r = c.run(&h, &["--once", "--device-timeout", "0.5"]);
        assert!(r.ok, "{}", r.stderr);
        assert_eq!(r.last_line(), "protokube: 0 volumes mounted, 0 manifests written, 3 dns records");
        let want = format!("waiting: volume {vid}: attached as /dev/xvdu but no device at {}", h.by_id.path().display());
        assert!(r.stderr.contains(&want), "says what it waits for:\n{}", r.stderr);
        // The device shows up; the next pass keeps the attachment it already has and mounts.
        let d = LoopDev::new(64);
        h.link(&vid, &d.dev);
        let r = c.run(&h, &["--once"]);
        assert!(r.ok, "{}", r.stderr);
        assert_eq!(r.last_line(), "protokube: 1 volumes mounted, 1 manifests written, 0 dns records");
        assert!(!r.stderr.contains("attaching"), "no second attach: {}", r.stderr);
        let v = volume(&ec2, &vid).await;
        assert_eq!(v.attachments().len(), 1);
    });
}

#[test]
fn config_base_on_s3_is_read_config_and_cas() {
    need_root();
    let (_g, m) = moto::lock();
    rt().block_on(async {
        let (ec2, _) = clients(&m.url).await;
        let conf = moto::sdk(&m.url).await;
        let s3 = aws_sdk_s3::Client::from_conf(aws_sdk_s3::config::Builder::from(&conf).force_path_style(true).build());
        let name = "s3.k8s.local";
        let c = Cluster::new(&m.url, name, &[("main", &[("a", "cp-a")])], "");
        s3.create_bucket().bucket("state").send().await.expect("CreateBucket");
        // Upload the whole file state store under s3://state/clusters/<name>/.
        let root = c.state.path().to_path_buf();
        let mut stack = vec![root.clone()];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).expect("read_dir").flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                    continue;
                }
                let rel = p.strip_prefix(&root).expect("rel").display().to_string();
                let key = format!("clusters/{name}/{rel}");
                s3.put_object().bucket("state").key(key).body(std::fs::read(&p).expect("read").into()).send().await.expect("PutObject");
            }
        }
        let h = host::host(&ec2, "us-east-1a", "cp-a").await;
        let d = LoopDev::new(64);
        let vid = create_volume(&ec2, "us-east-1a", &etcd_tags(name, "main", "a", &["a"])).await;
        h.link(&vid, &d.dev);
        let boot = h.root.path().join("bootconfig.yaml");
        std::fs::write(
            &boot,
            format!("CloudProvider: aws\nConfigBase: s3://state/clusters/{name}\nClusterName: {name}\nInstanceGroupName: cp-a\nInstanceGroupRole: ControlPlane\nNodeupConfigHash: x\n"),
        )
        .expect("boot config");
        // The file state store is gone: everything must come from S3.
        std::fs::remove_file(c.protokube_config("cp-a")).expect("rm protokube config");
        c.stored_in(&format!("s3://state/clusters/{name}"));
        let out = c.command(&h, &["--once", "--conf", &boot.display().to_string()]).output().expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(stdout.lines().last(), Some("protokube: 1 volumes mounted, 1 manifests written, 3 dns records"), "{stderr}");
        assert!(h.root.path().join("etc/kubernetes/pki/etcd/main/server.crt").exists(), "certificates from the S3 CAs");
    });
}

/// Loop mode is level-triggered: a pass that waits for a device converges on a later pass once the
/// device appears, without a restart; health and metrics say so.
#[test]
fn loop_converges_when_the_device_appears() {
    need_root();
    let (_g, m) = moto::lock();
    rt().block_on(async {
        let (ec2, _) = clients(&m.url).await;
        let name = "loop.k8s.local";
        let c = Cluster::new(&m.url, name, &[("main", &[("a", "cp-a")])], "");
        let h = host::host(&ec2, "us-east-1a", "cp-a").await;
        let vid = create_volume(&ec2, "us-east-1a", &etcd_tags(name, "main", "a", &["a"])).await;
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("port");
        let addr = format!("127.0.0.1:{port}");
        struct Kill(std::process::Child);
        impl Drop for Kill {
            fn drop(&mut self) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
        let _child = Kill(
            c.command(&h, &["--interval", "0.2", "--device-timeout", "0.2", "--metrics-addr", &addr])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("start loop"),
        );
        let metrics = || -> String {
            use std::io::{Read, Write};
            let Ok(mut s) = std::net::TcpStream::connect(&addr) else { return String::new() };
            let _ = write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
            let mut b = String::new();
            let _ = s.read_to_string(&mut b);
            b
        };
        let wait_for = |what: &str, f: &dyn Fn(&str) -> bool| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            loop {
                let m = metrics();
                if f(&m) {
                    return m;
                }
                assert!(std::time::Instant::now() < deadline, "never saw {what}:\n{m}");
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        };
        wait_for("a pass waiting for the device", &|m| m.contains("\nprotokube_waiting 1\n") && m.contains("protokube_reconcile_total{result=\"ok\"}"));
        // A member here without its volume: the passes come every second until it is mounted.
        wait_for("the member reported unmounted", &|m| m.contains("\nprotokube_members_unmounted 1\n"));
        let d = LoopDev::new(64);
        h.link(&vid, &d.dev);
        let m = wait_for("the volume mounted", &|m| m.contains("\nprotokube_volumes_mounted 1\n"));
        assert!(m.contains("\nprotokube_waiting 0\n") && m.contains("\nprotokube_volume_formats_total 1\n"), "{m}");
        let m = wait_for("the member reported mounted", &|m| m.contains("\nprotokube_members_unmounted 0\n"));
        assert!(m.contains("\nprotokube_volumes_mounted 1\n"), "{m}");
        assert!(h.is_mounted(&vid));
        assert!(h.manifest("main").is_some());
    });
}

#[test]
fn injected_ec2_throttling_is_retried_by_the_binary() {
    need_root();
    let (_g, m) = moto::lock();
    rt().block_on(async {
        let (ec2, _) = clients(&m.url).await;
        let name = "throttle.k8s.local";
        let c = Cluster::new(&m.url, name, &[("main", &[("a", "cp-a")])], "");
        let h = host::host(&ec2, "us-east-1a", "cp-a").await;
        let d = LoopDev::new(64);
        let vid = create_volume(&ec2, "us-east-1a", &etcd_tags(name, "main", "a", &["a"])).await;
        h.link(&vid, &d.dev);
        let t = std::time::Instant::now();
        let out = c.command(&h, &["--once"]).env("PROTOKUBE_INJECT_EC2_THROTTLES", "4").output().expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert_eq!(String::from_utf8_lossy(&out.stdout).lines().last(), Some("protokube: 1 volumes mounted, 1 manifests written, 3 dns records"));
        let field = |k: &str| {
            stderr.lines().rev().find_map(|l| l.split(&format!("{k}=")).nth(1)).and_then(|r| r.split_whitespace().next()).and_then(|n| n.parse::<u64>().ok())
        };
        let (calls, attempts) = (field("cloud_calls").expect("calls"), field("cloud_attempts").expect("attempts"));
        assert_eq!(attempts, calls + 4, "4 throttled attempts retried: {stderr}");
        assert!(t.elapsed() < std::time::Duration::from_secs(30));
    });
}
