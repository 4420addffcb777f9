//! Backup uploads on a real moto server: a snapshot larger than one part goes up as an S3 multipart
//! upload (S3 takes at most 5 GiB in one PutObject, and an etcd database may reach 8 GiB); the
//! upload's read-back check passes, the object downloads whole, and no upload is left open.
//! Needs moto; fails with a message saying so.

#[path = "support/iam.rs"]
mod iam;
#[path = "../../cloud/tests/support/moto.rs"]
mod moto;

use std::time::Duration;

use base::etcd_backup::{BackupMeta, BackupStore, Retention};
use sha2::Digest as _;

const MIB: u64 = 1 << 20;

/// The cluster whose backup store these tests use: protokube's calls on it are held against the
/// control-plane policy rendered for it ([`iam`]).
const SPEC: &str = "apiVersion: kops.k8s.io/v1alpha2\nkind: Cluster\nmetadata:\n  name: c.example.com\nspec:\n  cloudProvider: aws\n  configBase: s3://keelson-state/c.example.com\n  etcdClusters:\n  - name: main\n    backups:\n      backupStore: s3://keelson-backups/c.example.com/backups/etcd/main\n";

/// An S3 client signing as the control plane (protokube's), path style as moto serves.
fn protokube_s3(conf: &cloud::aws::SdkConfig) -> aws_sdk_s3::Client {
    aws_sdk_s3::Client::from_conf(aws_sdk_s3::config::Builder::from(&iam::as_control_plane(conf)).force_path_style(true).build())
}

#[test]
fn a_snapshot_larger_than_a_part_goes_up_in_parts() {
    let (_guard, m) = moto::lock();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let conf = rt.block_on(moto::sdk(&m.url));
    let s3 = aws_sdk_s3::Client::from_conf(aws_sdk_s3::config::Builder::from(&conf).force_path_style(true).build());
    rt.block_on(s3.create_bucket().bucket("keelson-backups").send()).expect("CreateBucket");
    let mark = iam::Mark::now();
    let url = "s3://keelson-backups/c.example.com/backups/etcd/main";
    let cp = protokube_s3(&conf);
    let open = |part: u64| {
        BackupStore::new(
            base::StateStore::open_with_s3(&url.parse().expect("url"), Some(cp.clone()), Duration::from_secs(10)).expect("store").with_part_size(part),
        )
    };

    // 12 MiB and 3 bytes that differ everywhere (a part put in the wrong place would show).
    let d = tempfile::tempdir().expect("tempdir");
    let snap = d.path().join("snapshot.db");
    let bytes: Vec<u8> = (0..12 * MIB + 3).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(&snap, &bytes).expect("write snapshot");
    let sha = hex::encode(sha2::Sha256::digest(&bytes));

    for (part, want_parts) in [(5 * MIB, Some(3)), (64 * MIB, None)] {
        let store = open(part);
        let now = time::OffsetDateTime::now_utc();
        let id = rt.block_on(store.next_id(now)).expect("id");
        let meta = BackupMeta {
            id: id.to_string(),
            etcd_cluster: "main".into(),
            taken_at: base::etcd_backup::rfc3339(now),
            reason: "requested".into(),
            taken_from: "etcd-a".into(),
            etcd_version: "3.6.12".into(),
            cluster_id: "1".into(),
            members: vec!["etcd-a".into()],
            revision: 1,
            size: bytes.len() as u64,
            sha256: sha.clone(),
        };
        rt.block_on(store.upload(&id, &snap, &meta)).unwrap_or_else(|e| panic!("upload in parts of {part} bytes: {e}"));

        // The object's ETag says how it went up: `<md5 of the part md5s>-<parts>` for a multipart upload.
        let key = format!("c.example.com/backups/etcd/main/{id}/snapshot.db");
        let head = rt.block_on(s3.head_object().bucket("keelson-backups").key(&key).send()).expect("HeadObject");
        let etag = head.e_tag().unwrap_or_default().trim_matches('"').to_string();
        let parts = etag.split_once('-').map(|(_, n)| n.parse::<u32>().expect("part count"));
        assert_eq!(parts, want_parts, "ETag {etag} for parts of {part} bytes");
        assert_eq!(head.content_length(), Some(bytes.len() as i64));

        let back = d.path().join(format!("back-{part}.db"));
        let fetched = rt.block_on(store.fetch(&id, &back)).expect("fetch");
        assert_eq!(fetched.sha256, sha);
        assert!(std::fs::read(&back).expect("read back") == bytes, "the downloaded snapshot differs");
    }
    let open_uploads = rt.block_on(s3.list_multipart_uploads().bucket("keelson-backups").send()).expect("ListMultipartUploads");
    assert!(open_uploads.uploads().is_empty(), "uploads left open: {:?}", open_uploads.uploads());
    mark.assert_allowed(&m.url, SPEC, moto::REGION);
}

/// Retention on S3 trusts a backup's name-time only while the object's `LastModified` agrees: with
/// every name honest, a prune far ahead deletes what the policy drops but never the newest
/// `MIN_KEPT`; once one backup is named 100 days before S3 wrote it (a control plane's clock was
/// wrong), a prune deletes nothing, although the policy would drop that one.
#[test]
fn prune_on_s3_keeps_the_newest_and_stops_at_a_clock_jump() {
    let (_guard, m) = moto::lock();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let conf = rt.block_on(moto::sdk(&m.url));
    let s3 = aws_sdk_s3::Client::from_conf(aws_sdk_s3::config::Builder::from(&conf).force_path_style(true).build());
    rt.block_on(s3.create_bucket().bucket("keelson-backups").send()).expect("CreateBucket");
    let mark = iam::Mark::now();
    let url = "s3://keelson-backups/c.example.com/backups/etcd/main";
    let store =
        BackupStore::new(base::StateStore::open_with_s3(&url.parse().expect("url"), Some(protokube_s3(&conf)), Duration::from_secs(10)).expect("store"));
    let d = tempfile::tempdir().expect("tempdir");
    let snap = d.path().join("snapshot.db");
    std::fs::write(&snap, b"snapshot bytes").expect("write snapshot");
    let upload = |at: time::OffsetDateTime| {
        let id = rt.block_on(store.next_id(at)).expect("id");
        let meta = BackupMeta {
            id: id.to_string(),
            etcd_cluster: "main".into(),
            taken_at: base::etcd_backup::rfc3339(at),
            reason: "scheduled".into(),
            taken_from: "etcd-a".into(),
            etcd_version: "3.6.12".into(),
            cluster_id: "1".into(),
            members: vec!["etcd-a".into()],
            revision: 1,
            size: 14,
            sha256: base::sha256_hex(b"snapshot bytes"),
        };
        rt.block_on(store.upload(&id, &snap, &meta)).expect("upload");
        id
    };
    let now = time::OffsetDateTime::now_utc();
    // Five honest backups of the last few minutes, pruned 200 days later: only the newest three stay.
    let honest: Vec<_> = (0..5).map(|i| upload(now - time::Duration::minutes(5 - i))).collect();
    let gone = rt.block_on(store.prune(now + time::Duration::days(200), &Retention::default())).expect("prune");
    assert_eq!(gone, honest[..2].to_vec());
    assert_eq!(base::etcd_backup::MIN_KEPT, 3);
    assert_eq!(rt.block_on(store.ids()).expect("ids"), honest[2..].to_vec());

    // One named 100 days ago but written now: nothing is deleted, not even that one.
    let jumped = upload(now - time::Duration::days(100));
    let before = rt.block_on(store.ids()).expect("ids");
    assert!(Retention::default().expired(&before, now).contains(&jumped), "the policy alone would drop it");
    let gone = rt.block_on(store.prune(now, &Retention::default())).expect("prune");
    assert_eq!(gone, vec![], "a clock jumped: nothing deleted");
    assert_eq!(rt.block_on(store.ids()).expect("ids"), before);
    mark.assert_allowed(&m.url, SPEC, moto::REGION);
}
