//! etcd backups and the one-command restore, end to end: three real etcd members in network
//! namespaces (started and stopped from protokube's manifests by a stand-in kubelet), protokube
//! running in loop mode for each, backups in moto S3, and the real `keelson etcd backup` command.
//!
//! 1. Scheduled backups appear (every 3 s here) while all three members try to take every one of
//!    them (test hook): the slot claim in etcd leaves exactly one backup per slot, each with
//!    metadata that matches what is in S3.
//! 2. A clock jump: one protokube restarted 100 days in the future writes its backups 100 days
//!    ahead, and its prune deletes nothing — not the seeded backups named at every age (all written
//!    now, as S3's LastModified says), not step 1's — because names and LastModified disagree.
//! 3. Every key deleted; `keelson etcd backup restore --latest --yes` (which passes over the backups
//!    dated in the future and takes the newest of step 1) killed (-9) after it wrote its
//!    request and again after every member stopped, one protokube killed mid-restore; each rerun
//!    continues, and the last one ends with every key back, the deleted state gone, a new cluster
//!    identity and a writable cluster; the data moved aside is removed once it is healthy.
//!
//! Needs root, iproute2, etcd-server/etcd-client (etcd, etcdctl 3.4) and moto; fails loudly without
//! them. Needs the `keelson` binary of this workspace (cargo test --workspace builds it).

#[path = "support/etcd_loop.rs"]
mod etcd_loop;
#[path = "support/etcd_net.rs"]
mod etcd_net;
#[path = "support/host.rs"]
mod host;
#[path = "../../cloud/tests/support/moto.rs"]
mod moto;

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base::etcd_backup::{BackupId, BackupMeta, RestorePhase, Retention};
use etcd_loop::{b64, count_keys, gateway, keelson_binary, status, wait_for, Fixture};
use etcd_net::{etcdctl, need_tools};
use host::need_root;

const NAME: &str = "backup.k8s.local";
const KEYS: usize = 300;

#[test]
fn backups_one_writer_retention_and_restore_after_kills() {
    need_root();
    need_tools();
    let keelson = keelson_binary();
    let (_g, m) = moto::lock();
    let every_member = [("PROTOKUBE_TEST_EVERY_MEMBER_BACKS_UP", "1".to_string())];
    let mut f = Fixture::start(&m.url, 0, NAME, "    manager:\n      backupInterval: 3s\n", Default::default(), &every_member);
    let ips = f.ips();
    for i in 0..KEYS {
        gateway(&ips[i % 3], "/v3/kv/put", serde_json::json!({ "key": b64(&format!("key/{i:04}")), "value": b64(&format!("value {i}")) }));
    }
    assert_eq!(count_keys(&ips[0]), KEYS as i64);

    // 1. Scheduled backups, one writer per slot although every member tries.
    let scheduled = |list: &[BackupMeta]| -> Vec<BackupMeta> { list.iter().filter(|b| b.reason == "scheduled").cloned().collect() };
    let taken = wait_for(
        "4 scheduled backups holding every key",
        Duration::from_secs(90),
        || {
            let list = f.rt.block_on(f.store.list()).ok()?;
            let s: Vec<BackupMeta> = scheduled(&list).into_iter().filter(|b| b.revision > KEYS as i64).collect();
            (s.len() >= 4).then_some(s)
        },
        || f.diag(),
    );
    let all_scheduled = scheduled(&f.rt.block_on(f.store.list()).expect("list"));
    let slots: Vec<i64> =
        all_scheduled.iter().map(|b| base::etcd_backup::parse_rfc3339(&b.taken_at).expect("taken_at").unix_timestamp().div_euclid(3)).collect();
    let distinct: BTreeSet<i64> = slots.iter().copied().collect();
    assert_eq!(distinct.len(), slots.len(), "two writers took the same slot: {all_scheduled:#?}");
    let writers: BTreeSet<&str> = all_scheduled.iter().map(|b| b.taken_from.as_str()).collect();
    eprintln!("{} scheduled backups in {} slots, taken from {writers:?}", slots.len(), distinct.len());
    for b in &taken {
        assert_eq!(b.members, vec!["etcd-a", "etcd-b", "etcd-c"]);
        assert!(b.etcd_version.starts_with("3."), "{b:?}");
        let id = BackupId::parse(&b.id).expect("id");
        let (size, sha) =
            f.rt.block_on(
                base::StateStore::open_with_s3(&f.backup_url.parse().expect("url"), Some(f.s3.clone()), Duration::from_secs(10))
                    .expect("store")
                    .digest(&format!("{id}/snapshot.db")),
            )
            .expect("digest")
            .expect("snapshot object");
        assert_eq!((size, sha.as_str()), (b.size, b.sha256.as_str()), "metadata matches the object");
    }

    // 2. A clock jump: member a's protokube restarted 100 days ahead.
    let future = time::OffsetDateTime::now_utc() + time::Duration::days(100);
    let fake = f.logdir.path().join("fake.db");
    std::fs::write(&fake, b"not a snapshot").expect("fake");
    // Named at ages the policy, judged by name alone, would keep or drop (UTC hour and day
    // boundaries: it keeps the first of each); all written now.
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
        let id = f.rt.block_on(f.store.next_id(at)).expect("id");
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
        f.rt.block_on(f.store.upload(&id, &fake, &meta)).expect("seed");
        seeded.push((what, id));
    }
    f.restart_protokube(0, "a-future", &[("PROTOKUBE_TEST_NOW", base::etcd_backup::rfc3339(future)), every_member[0].clone()]);
    let ids = wait_for(
        "a backup 100 days ahead, and a prune that refused",
        Duration::from_secs(60),
        || {
            let ids = f.rt.block_on(f.store.ids()).ok()?;
            let newest = ids.last()?;
            (newest.taken_at > future - time::Duration::hours(1) && f.protokube_logs().contains("not pruning etcd backups")).then_some(ids)
        },
        || f.diag(),
    );
    assert!(!Retention::default().expired(&ids, future).is_empty(), "the policy alone would drop some: {ids:?}");
    for (what, id) in &seeded {
        assert!(ids.contains(id), "{what}: {id} deleted although a clock jumped: {ids:?}");
    }
    for b in &all_scheduled {
        assert!(ids.iter().any(|i| i.to_string() == b.id), "scheduled backup {} deleted although a clock jumped", b.id);
    }
    assert!(f.protokube_logs().contains("a clock jumped"), "{}", f.diag());

    // 3. Delete every key; restore the newest backup not from the future (of step 1, every key).
    gateway(&ips[1], "/v3/kv/deleterange", serde_json::json!({ "key": b64("key/"), "range_end": b64("key0") }));
    gateway(&ips[1], "/v3/kv/put", serde_json::json!({ "key": b64("key/written-after-the-backup"), "value": b64("x") }));
    assert_eq!(count_keys(&ips[0]), 1);
    let cluster_before = status(&ips[0])["header"]["cluster_id"].clone();

    let spec_file = f.spec_file();
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
    let request = |f: &Fixture| f.rt.block_on(f.store.restore_request()).ok().flatten();
    let t = Instant::now();
    // Killed right after it asked for the restore.
    let mut run = restore();
    let first = wait_for("the restore request", Duration::from_secs(60), || request(&f), || f.diag());
    let _ = run.kill();
    let _ = run.wait();
    eprintln!("killed the restore at phase {:?}", first.phase);
    // protokube of member b killed while it stops its member, then started again.
    wait_for(
        "member b stopped",
        Duration::from_secs(60),
        || f.rt.block_on(f.store.member_status("b")).ok().flatten().filter(|s| s.request == first.id),
        || f.diag(),
    );
    f.restart_protokube(1, "b-restarted", &every_member);
    // Rerun, killed once every member stopped and the restore began.
    let mut run = restore();
    wait_for("the restore phase", Duration::from_secs(90), || request(&f).filter(|r| r.phase == RestorePhase::Restore), || f.diag());
    let _ = run.kill();
    let _ = run.wait();
    eprintln!("killed the restore at phase Restore after {:.1}s", t.elapsed().as_secs_f64());
    // The last rerun finishes it.
    let out = restore().wait_with_output().expect("restore");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "restore failed:\n{stdout}\n{}\n{}", String::from_utf8_lossy(&out.stderr), f.diag());
    eprintln!("{stdout}restore took {:.1}s in all (3 runs, 2 killed)", t.elapsed().as_secs_f64());
    assert!(stdout.contains(&format!("continuing restore {}", first.id)), "{stdout}");
    assert!(stdout.contains("restored etcd main in") && stdout.contains("3/3 members healthy"), "{stdout}");
    assert_eq!(request(&f).map(|r| r.phase), Some(RestorePhase::Complete));
    // `list` shows what the store holds, the restored backup among them.
    let list = Command::new(&keelson)
        .args(["etcd", "backup", "list", "-f"])
        .arg(&spec_file)
        .args(["--offline", "--endpoint-url", &m.url, "--etcd-cluster", "main"])
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .output()
        .expect("keelson etcd backup list");
    let listed = String::from_utf8_lossy(&list.stdout);
    assert!(list.status.success() && listed.contains(&first.backup) && listed.contains(&format!("backups of etcd main in {}", f.backup_url)), "{listed}");

    // Every key is back, the deleted state is gone, the cluster is new and writable.
    for ip in &ips {
        assert_eq!(count_keys(ip), KEYS as i64, "keys on {ip}\n{}", f.diag());
    }
    let v = gateway(&ips[2], "/v3/kv/range", serde_json::json!({ "key": b64("key/0123") }));
    assert_eq!(v["kvs"][0]["value"].as_str(), Some(b64("value 123").as_str()));
    let after = gateway(&ips[2], "/v3/kv/range", serde_json::json!({ "key": b64("key/written-after-the-backup") }));
    assert!(after["kvs"].as_array().is_none_or(|a| a.is_empty()), "{after}");
    gateway(&ips[0], "/v3/kv/put", serde_json::json!({ "key": b64("key/after-restore"), "value": b64("ok") }));
    assert_eq!(count_keys(&ips[1]), KEYS as i64 + 1);
    let ids: BTreeSet<String> = ips.iter().map(|ip| status(ip)["header"]["cluster_id"].to_string()).collect();
    assert_eq!(ids.len(), 1, "one cluster: {ids:?}");
    assert!(!ids.contains(&cluster_before.to_string()), "a new cluster identity: {ids:?} vs {cluster_before}");
    let list = etcdctl(&f.members[0].ns, &format!("http://{}:4001", ips[0]), &["member", "list"], Duration::from_secs(30));
    assert_eq!(list.lines().filter(|l| l.contains("started")).count(), 3, "{list}");
    // The data moved aside goes once the restored cluster is healthy.
    for (mb, v) in f.members.iter().zip(&f.vols) {
        let aside = mb.host.mount_point(v).join(format!("data-before-restore-{}", first.id));
        wait_for(&format!("{} removed", aside.display()), Duration::from_secs(30), || (!aside.exists()).then_some(()), || f.diag());
    }
}
