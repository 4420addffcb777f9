//! The `gs://` state store against fake-gcs-server (the Cloud Storage emulator, started by the test
//! on 127.0.0.1): objects round-trip under the prefix, lists strip it, the lock is a create with
//! `ifGenerationMatch=0`, large files go up in resumable chunks, and the service-account token comes
//! from the metadata server. Needs fake-gcs-server (scripts/test installs it).

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base::store::{StoreError, LOCK_FILE};
use base::{ConfigBase, StateStore};

fn emulator() -> (tempfile::NamedTempFile, testkit::fake_gcs::FakeGcs) {
    let log = tempfile::NamedTempFile::new().expect("log");
    let gcs = testkit::fake_gcs::FakeGcs::start(log.path()).unwrap_or_else(|e| panic!("these tests need fake-gcs-server: {e}"));
    gcs.create_bucket("state").expect("bucket");
    (log, gcs)
}

/// A metadata server that answers the token request (only with `Metadata-Flavor: Google`) and counts.
fn metadata_server() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut head = Vec::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                head.push(line.to_ascii_lowercase());
            }
            let ok = head.first().is_some_and(|l| l.contains("/computemetadata/v1/instance/service-accounts/default/token"))
                && head.iter().any(|l| l.trim() == "metadata-flavor: google");
            let (status, body) = if ok { ("200 OK", r#"{"access_token":"tok-1","expires_in":3599,"token_type":"Bearer"}"#) } else { ("403 Forbidden", "{}") };
            counted.fetch_add(usize::from(ok), Ordering::SeqCst);
            let mut s = stream;
            let _ = write!(
                s,
                "HTTP/1.1 {status}\r\nMetadata-Flavor: Google\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (format!("127.0.0.1:{}", addr.port()), hits)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gs_store_round_trips_lists_locks_and_streams_large_files() {
    let (_log, gcs) = emulator();
    let (metadata, token_requests) = metadata_server();
    // The variables Google's client libraries read; set before the store is opened.
    std::env::set_var("STORAGE_EMULATOR_HOST", gcs.endpoint());
    std::env::set_var("GCE_METADATA_HOST", &metadata);
    let base: ConfigBase = "gs://state/c.example.com".parse().expect("base");
    let store = StateStore::open(&base, Duration::from_secs(10)).expect("open").with_part_size(0);

    assert_eq!(store.get("pki/issued/ca/keyset.yaml").await.expect("get"), None);
    store.put("pki/issued/ca/keyset.yaml", b"ca").await.expect("put");
    store.put("igconfig/node/nodes/nodeupconfig.yaml", b"n").await.expect("put");
    assert_eq!(store.get("pki/issued/ca/keyset.yaml").await.expect("get").as_deref(), Some(&b"ca"[..]));
    let listed = store.list_modified("").await.expect("list");
    assert_eq!(listed.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["igconfig/node/nodes/nodeupconfig.yaml", "pki/issued/ca/keyset.yaml"]);
    assert!(listed.iter().all(|(_, t)| t.is_some()), "the service says when each was written: {listed:?}");
    assert_eq!(store.list("pki/").await.expect("list"), ["pki/issued/ca/keyset.yaml"]);

    // The lock: a second run is kept out and told who holds it; release removes it.
    let held = store.lock("apply").await.expect("lock");
    match store.lock("delete").await {
        Err(StoreError::Locked { holder, .. }) => assert!(holder.contains("keelson apply"), "{holder}"),
        other => panic!("second lock: {other:?}"),
    }
    held.release().await.expect("release");
    assert_eq!(store.get(LOCK_FILE).await.expect("get"), None);

    // A file larger than one chunk goes up resumably and arrives whole.
    let big = tempfile::NamedTempFile::new().expect("tmp");
    // 12 MiB: three chunks of the 5 MiB minimum part size (rounded to 256 KiB), the last one short.
    let bytes: Vec<u8> = (0..12u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(big.path(), &bytes).expect("write");
    store.put_file("backups/etcd/main/snap", big.path()).await.expect("put_file");
    assert_eq!(store.get("backups/etcd/main/snap").await.expect("get"), Some(bytes.clone()));
    let (size, _sha) = store.digest("backups/etcd/main/snap").await.expect("digest").expect("exists");
    assert_eq!(size, bytes.len() as u64);

    store.delete("pki/issued/ca/keyset.yaml").await.expect("delete");
    store.delete("pki/issued/ca/keyset.yaml").await.expect("deleting what is gone is fine");
    assert_eq!(store.get("pki/issued/ca/keyset.yaml").await.expect("get"), None);

    // One token from the metadata server served every call (cached until it nears expiry).
    assert_eq!(token_requests.load(Ordering::SeqCst), 1);
}
