//! etcd backups and the one-command restore, end to end: three real etcd members in network
//! namespaces (started and stopped from protokube's manifests by a stand-in kubelet), protokube
//! running in loop mode for each, backups in moto S3, and the real `keelson etcd backup` command.
//!
//! 1. Scheduled backups appear (every 3 s here) while all three members try to take every one of
//!    them (test hook): the slot claim in etcd leaves exactly one backup per slot, each with
//!    metadata that matches what is in S3.
//! 2. Retention with injected time: one protokube restarted 100 days in the future prunes what the
//!    policy drops (seeded backups of known ages, and everything of step 1) and keeps the rest.
//! 3. Every key deleted; `keelson etcd backup restore --latest --yes` killed (-9) after it wrote its
//!    request and again after every member stopped, one protokube killed mid-restore; each rerun
//!    continues, and the last one ends with every key back, the deleted state gone, a new cluster
//!    identity and a writable cluster; the data moved aside is removed once it is healthy.
//!
//! Needs root, iproute2, etcd-server/etcd-client (etcd, etcdctl 3.4) and moto; fails loudly without
//! them. Needs the `keelson` binary of this workspace (cargo test --workspace builds it).

#[path = "../../cloud/tests/support/moto.rs"]
mod moto;
#[path = "support/host.rs"]
mod host;
#[path = "support/etcd_net.rs"]
mod etcd_net;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base::etcd_backup::{BackupId, BackupMeta, BackupStore, RestorePhase, Retention};
use base64::Engine as _;
use etcd_net::{etcdctl, logs, need_tools, Kubelet, Net, TLS_DIR};
use host::{create_volume, etcd_tags, need_root, Cluster, Host, LoopDev};

const NAME: &str = "backup.k8s.local";
const BUCKET: &str = "keelson-etcd-backups";
const KEYS: usize = 300;

struct Member {
    ns: String,
    ip: String,
    host: Host,
    kubelet: Option<Kubelet>,
    protokube: Option<Child>,
}

impl Drop for Member {
    fn drop(&mut self) {
        if let Some(mut p) = self.protokube.take() {
            let _ = p.kill();
            let _ = p.wait();
        }
        self.kubelet.take();
    }
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// The etcd v3 JSON gateway of one member (plain HTTP: the Legacy provider), from the host.
fn gateway(ip: &str, path: &str, body: serde_json::Value) -> serde_json::Value {
    let http = reqwest::blocking::Client::builder().timeout(Duration::from_secs(10)).no_proxy().build().expect("client");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match http.post(format!("http://{ip}:4001{path}")).body(body.to_string()).send().and_then(|r| r.error_for_status()).and_then(|r| r.text()) {
            Ok(v) => return serde_json::from_str(&v).expect("etcd answers JSON"),
            Err(e) if Instant::now() < deadline => {
                eprintln!("etcd {ip}{path}: {e}; retrying");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => panic!("etcd {ip}{path}: {e}"),
        }
    }
}

/// How many keys start with `key/`.
fn count_keys(ip: &str) -> i64 {
    let v = gateway(ip, "/v3/kv/range", serde_json::json!({ "key": b64("key/"), "range_end": b64("key0"), "count_only": true }));
    v["count"].as_str().and_then(|c| c.parse().ok()).or_else(|| v["count"].as_i64()).unwrap_or(0)
}

fn status(ip: &str) -> serde_json::Value {
    gateway(ip, "/v3/maintenance/status", serde_json::json!({}))
}

fn keelson_binary() -> PathBuf {
    let p = Path::new(env!("CARGO_BIN_EXE_protokube")).with_file_name("keelson");
    assert!(p.exists(), "this test needs the keelson binary at {} (build the workspace: cargo build --workspace)", p.display());
    p
}

fn wait_for<T>(what: &str, within: Duration, mut f: impl FnMut() -> Option<T>, diag: impl Fn() -> String) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {within:?}\n{}", diag());
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn backups_one_writer_retention_and_restore_after_kills() {
    need_root();
    need_tools();
    let keelson = keelson_binary();
    let (_g, m) = moto::lock();
    let logdir = tempfile::tempdir().expect("log dir");
    let mut net = Net::new(0);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let conf = rt.block_on(moto::sdk(&m.url));
    let ec2 = aws_sdk_ec2::Client::new(&conf);
    let s3 = aws_sdk_s3::Client::from_conf(aws_sdk_s3::config::Builder::from(&conf).force_path_style(true).build());
    rt.block_on(s3.create_bucket().bucket(BUCKET).send()).expect("CreateBucket");
    let backup_url = format!("s3://{BUCKET}/{NAME}/backups/etcd/main");
    let store = BackupStore::new(base::StateStore::open_with_s3(&backup_url.parse().expect("url"), Some(s3.clone()), Duration::from_secs(10)).expect("store"));

    let c = Cluster::new(&m.url, NAME, &[("main", &[("a", "cp-a"), ("b", "cp-b"), ("c", "cp-c")])], "");
    let spec = c.state.path().join("cluster-completed.spec");
    let text = std::fs::read_to_string(&spec).expect("spec");
    std::fs::write(
        &spec,
        text.replace(
            "  - name: main\n",
            &format!("  - name: main\n    provider: Legacy\n    backups:\n      backupStore: {backup_url}\n    manager:\n      backupInterval: 3s\n"),
        ),
    )
    .expect("spec");
    *TLS_DIR.lock().unwrap_or_else(|p| p.into_inner()) = None;

    let all = ["a", "b", "c"];
    let subnet_id = rt.block_on(async {
        let vpc = ec2.create_vpc().cidr_block("10.231.0.0/16").send().await.expect("CreateVpc");
        let vpc = vpc.vpc().and_then(|v| v.vpc_id()).expect("vpc id").to_string();
        let sn = ec2.create_subnet().vpc_id(vpc).cidr_block(format!("{}.0/24", net.subnet)).availability_zone("us-east-1a").send().await.expect("CreateSubnet");
        sn.subnet().and_then(|s| s.subnet_id()).expect("subnet id").to_string()
    });
    // (room for the data moved aside and the restored data: etcd preallocates 64 MB WAL files)
    let devs: Vec<LoopDev> = (0..3).map(|_| LoopDev::new(512)).collect();
    let vols: Vec<String> = all.iter().map(|mbr| rt.block_on(create_volume(&ec2, "us-east-1a", &etcd_tags(NAME, "main", mbr, &all)))).collect();
    let etcdctl_path = String::from_utf8_lossy(&host::sh("command -v etcdctl").stdout).trim().to_string();

    let start_protokube = |mb: &Member, tag: &str, env: &[(&str, String)]| -> Child {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(logdir.path().join(format!("protokube-{tag}.log"))).expect("log");
        let mut cmd = c.command(
            &mb.host,
            &[
                "--hosts-file",
                &Net::hosts_file(&mb.ns),
                "--interval",
                "1",
                "--backup-poll",
                "1",
                "--metrics-addr",
                "off",
                "--no-addons",
                "--join-listen",
                "off",
                "--etcd-restore-tool",
                &etcdctl_path,
                "--stop-timeout",
                "20",
            ],
        );
        cmd.env("PROTOKUBE_TEST_EVERY_MEMBER_BACKS_UP", "1");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.stdout(log.try_clone().expect("log")).stderr(log).stdin(Stdio::null()).spawn().expect("start protokube")
    };

    let mut members: Vec<Member> = Vec::new();
    for (i, (tag, group)) in [("a", "cp-a"), ("b", "cp-b"), ("c", "cp-c")].into_iter().enumerate() {
        let (ns, ip) = net.namespace(tag, 21 + i as u8);
        let (instance_id, got) = rt.block_on(host::run_instance(&ec2, "us-east-1a", Some(&subnet_id), Some(&ip)));
        assert_eq!(got, ip);
        let h = Host { root: host::shared_root(), by_id: tempfile::tempdir().expect("by-id"), instance_id, zone: "us-east-1a".into(), ip: ip.clone(), public_ip: String::new(), group: group.into() };
        for (v, d) in vols.iter().zip(&devs) {
            h.link(v, &d.dev);
        }
        let kubelet = Kubelet::start(&ns, h.root.path(), &logdir.path().join(format!("etcd-{tag}.log")));
        let mut mb = Member { ns, ip, host: h, kubelet: Some(kubelet), protokube: None };
        mb.protokube = Some(start_protokube(&mb, tag, &[]));
        members.push(mb);
    }
    let diag = || logs(logdir.path());
    let health = etcdctl(&members[0].ns, &format!("http://{}:4001", members[0].ip), &["endpoint", "health"], Duration::from_secs(90));
    assert!(health.contains("is healthy"), "{health}\n{}", diag());
    for i in 0..KEYS {
        gateway(&members[i % 3].ip, "/v3/kv/put", serde_json::json!({ "key": b64(&format!("key/{i:04}")), "value": b64(&format!("value {i}")) }));
    }
    assert_eq!(count_keys(&members[0].ip), KEYS as i64);

    // 1. Scheduled backups, one writer per slot although every member tries.
    let scheduled = |list: &[BackupMeta]| -> Vec<BackupMeta> { list.iter().filter(|b| b.reason == "scheduled").cloned().collect() };
    let taken = wait_for(
        "4 scheduled backups holding every key",
        Duration::from_secs(90),
        || {
            let list = rt.block_on(store.list()).ok()?;
            let s: Vec<BackupMeta> = scheduled(&list).into_iter().filter(|b| b.revision > KEYS as i64).collect();
            (s.len() >= 4).then_some(s)
        },
        diag,
    );
    let all_scheduled = scheduled(&rt.block_on(store.list()).expect("list"));
    let slots: Vec<i64> = all_scheduled
        .iter()
        .map(|b| base::etcd_backup::parse_rfc3339(&b.taken_at).expect("taken_at").unix_timestamp().div_euclid(3))
        .collect();
    let distinct: BTreeSet<i64> = slots.iter().copied().collect();
    assert_eq!(distinct.len(), slots.len(), "two writers took the same slot: {all_scheduled:#?}");
    let writers: BTreeSet<&str> = all_scheduled.iter().map(|b| b.taken_from.as_str()).collect();
    eprintln!("{} scheduled backups in {} slots, taken from {writers:?}", slots.len(), distinct.len());
    for b in &taken {
        assert_eq!(b.members, vec!["etcd-a", "etcd-b", "etcd-c"]);
        assert!(b.etcd_version.starts_with("3."), "{b:?}");
        let id = BackupId::parse(&b.id).expect("id");
        let (size, sha) = rt.block_on(base::StateStore::open_with_s3(&backup_url.parse().expect("url"), Some(s3.clone()), Duration::from_secs(10)).expect("store").digest(&format!("{id}/snapshot.db"))).expect("digest").expect("snapshot object");
        assert_eq!((size, sha.as_str()), (b.size, b.sha256.as_str()), "metadata matches the object");
    }

    // 2. Retention, with member a's protokube restarted 100 days ahead.
    let future = time::OffsetDateTime::now_utc() + time::Duration::days(100);
    let fake = logdir.path().join("fake.db");
    std::fs::write(&fake, b"not a snapshot").expect("fake");
    // Ages chosen on UTC hour and day boundaries (the policy keeps the first of each).
    let hour = |t: time::OffsetDateTime| t - time::Duration::seconds(t.unix_timestamp().rem_euclid(3600));
    let day = |t: time::OffsetDateTime| t - time::Duration::seconds(t.unix_timestamp().rem_euclid(86400));
    let h3 = hour(future - time::Duration::hours(3));
    let d30 = day(future - time::Duration::days(30));
    let seeds = [
        ("kept: this hour", future - time::Duration::minutes(20)),
        ("kept: first of an hour 3 h ago", h3 + time::Duration::minutes(5)),
        ("dropped: second of that hour", h3 + time::Duration::minutes(40)),
        ("kept: first of a day 30 days ago", d30 + time::Duration::hours(1)),
        ("dropped: later that day", d30 + time::Duration::hours(5)),
        ("dropped: 95 days old", future - time::Duration::days(95)),
    ];
    let mut seeded = Vec::new();
    for (what, at) in seeds {
        let id = rt.block_on(store.next_id(at)).expect("id");
        let meta = BackupMeta {
            id: id.to_string(),
            etcd_cluster: "main".into(),
            taken_at: base::etcd_backup::rfc3339(at),
            reason: format!("seeded ({what})"),
            taken_from: "test".into(),
            etcd_version: "3.4.23".into(),
            cluster_id: "0".into(),
            members: vec![],
            revision: 1,
            size: 14,
            sha256: base::sha256_hex(b"not a snapshot"),
        };
        rt.block_on(store.upload(&id, &fake, &meta)).expect("seed");
        seeded.push((what, id));
    }
    let mut a = members.remove(0);
    if let Some(mut p) = a.protokube.take() {
        let _ = p.kill();
        let _ = p.wait();
    }
    a.protokube = Some(start_protokube(&a, "a-future", &[("PROTOKUBE_TEST_NOW", base::etcd_backup::rfc3339(future))]));
    members.insert(0, a);
    let ids = wait_for(
        "a backup 100 days ahead, and pruning",
        Duration::from_secs(60),
        || {
            let ids = rt.block_on(store.ids()).ok()?;
            let newest = ids.last()?;
            (newest.taken_at > future - time::Duration::hours(1) && !ids.contains(&seeded[5].1)).then_some(ids)
        },
        diag,
    );
    for (what, id) in &seeded {
        assert_eq!(ids.contains(id), what.starts_with("kept"), "{what}: {id} in {ids:?}");
    }
    for b in &all_scheduled {
        assert!(!ids.iter().any(|i| i.to_string() == b.id), "100-day-old scheduled backup {} kept", b.id);
    }
    assert!(Retention::default().expired(&ids, future).is_empty(), "what is left is what the policy keeps");

    // 3. Delete every key; restore the newest backup (the one taken 100 days ahead, of every key).
    gateway(&members[1].ip, "/v3/kv/deleterange", serde_json::json!({ "key": b64("key/"), "range_end": b64("key0") }));
    gateway(&members[1].ip, "/v3/kv/put", serde_json::json!({ "key": b64("key/written-after-the-backup"), "value": b64("x") }));
    assert_eq!(count_keys(&members[0].ip), 1);
    let cluster_before = status(&members[0].ip)["header"]["cluster_id"].clone();

    let spec_file = logdir.path().join("cluster.yaml");
    let example = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/ha.yaml")).expect("examples/ha.yaml");
    std::fs::write(&spec_file, example.replace("configBase: s3://acme-keelson-state/ha.k8s.example.com", &format!("configBase: file://{}", c.state.path().display())))
        .expect("spec file");
    let restore = || -> Child {
        Command::new(&keelson)
            .args(["etcd", "backup", "restore", "-f"])
            .arg(&spec_file)
            .args(["--offline", "--endpoint-url", &m.url, "--etcd-cluster", "main", "--latest", "--yes", "--timeout", "4m"])
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("keelson etcd backup restore")
    };
    let request = || rt.block_on(store.restore_request()).ok().flatten();
    let t = Instant::now();
    // Killed right after it asked for the restore.
    let mut run = restore();
    let first = wait_for("the restore request", Duration::from_secs(60), || request(), diag);
    let _ = run.kill();
    let _ = run.wait();
    eprintln!("killed the restore at phase {:?}", first.phase);
    // protokube of member b killed while it stops its member, then started again.
    wait_for("member b stopped", Duration::from_secs(60), || rt.block_on(store.member_status("b")).ok().flatten().filter(|s| s.request == first.id), diag);
    if let Some(mut p) = members[1].protokube.take() {
        let _ = p.kill();
        let _ = p.wait();
    }
    members[1].protokube = Some(start_protokube(&members[1], "b-restarted", &[]));
    // Rerun, killed once every member stopped and the restore began.
    let mut run = restore();
    wait_for("the restore phase", Duration::from_secs(90), || request().filter(|r| r.phase == RestorePhase::Restore), diag);
    let _ = run.kill();
    let _ = run.wait();
    eprintln!("killed the restore at phase Restore after {:.1}s", t.elapsed().as_secs_f64());
    // The last rerun finishes it.
    let out = restore().wait_with_output().expect("restore");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "restore failed:\n{stdout}\n{}\n{}", String::from_utf8_lossy(&out.stderr), diag());
    eprintln!("{stdout}restore took {:.1}s in all (3 runs, 2 killed)", t.elapsed().as_secs_f64());
    assert!(stdout.contains(&format!("continuing restore {}", first.id)), "{stdout}");
    assert!(stdout.contains("restored etcd main in") && stdout.contains("3/3 members healthy"), "{stdout}");
    assert_eq!(request().map(|r| r.phase), Some(RestorePhase::Complete));

    // Every key is back, the deleted state is gone, the cluster is new and writable.
    for mb in &members {
        assert_eq!(count_keys(&mb.ip), KEYS as i64, "keys on {}\n{}", mb.ns, diag());
    }
    let v = gateway(&members[2].ip, "/v3/kv/range", serde_json::json!({ "key": b64("key/0123") }));
    assert_eq!(v["kvs"][0]["value"].as_str(), Some(b64("value 123").as_str()));
    let after = gateway(&members[2].ip, "/v3/kv/range", serde_json::json!({ "key": b64("key/written-after-the-backup") }));
    assert!(after["kvs"].as_array().is_none_or(|a| a.is_empty()), "{after}");
    gateway(&members[0].ip, "/v3/kv/put", serde_json::json!({ "key": b64("key/after-restore"), "value": b64("ok") }));
    assert_eq!(count_keys(&members[1].ip), KEYS as i64 + 1);
    let ids: BTreeSet<String> = members.iter().map(|mb| status(&mb.ip)["header"]["cluster_id"].to_string()).collect();
    assert_eq!(ids.len(), 1, "one cluster: {ids:?}");
    assert!(!ids.contains(&cluster_before.to_string()), "a new cluster identity: {ids:?} vs {cluster_before}");
    let list = etcdctl(&members[0].ns, &format!("http://{}:4001", members[0].ip), &["member", "list"], Duration::from_secs(30));
    assert_eq!(list.lines().filter(|l| l.contains("started")).count(), 3, "{list}");
    // The data moved aside goes once the restored cluster is healthy.
    for (mb, v) in members.iter().zip(&vols) {
        let aside = mb.host.mount_point(v).join(format!("data-before-restore-{}", first.id));
        wait_for(&format!("{} removed", aside.display()), Duration::from_secs(30), || (!aside.exists()).then_some(()), diag);
    }
    drop(members);
    drop(net);
}
