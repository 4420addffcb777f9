//! The state store at `ConfigBase` (`file://` and `s3://`): read, write only what differs, and the
//! cluster's CAs created on first apply and never regenerated.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sha2::Digest as _;

use super::plan::{Kind, Resource};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("s3://{bucket}/{key}: {op}: {message}")]
    S3 { op: &'static str, bucket: String, key: String, message: String },
    #[error("configBase {0:?}: unsupported scheme for apply (file:// or s3://)")]
    Scheme(String),
    #[error("creating CAs: {0}")]
    Pki(String),
    #[error(
        "{store}/{LOCK_FILE}: the cluster is locked by another run ({holder}); wait for it to finish, \
         or, if that run is gone, give --force-unlock"
    )]
    Locked { store: String, holder: String },
}

/// The lock object under ConfigBase that keeps two apply / delete / rolling-update runs apart.
pub const LOCK_FILE: &str = "keelson.lock";

/// A held lock; [`StoreLock::release`] removes it if it is still ours.
#[derive(Debug)]
pub struct StoreLock {
    store: StateStore,
    content: Vec<u8>,
}

impl StoreLock {
    pub async fn release(self) -> Result<(), StoreError> {
        // Never remove a lock someone else took after a --force-unlock.
        if self.store.get(LOCK_FILE).await?.as_deref() == Some(self.content.as_slice()) {
            self.store.delete(LOCK_FILE).await?;
        }
        Ok(())
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown-host".into())
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// "keelson apply on host (pid 12), 3m ago" from a lock file's content.
fn describe_holder(content: &[u8]) -> String {
    let text = String::from_utf8_lossy(content);
    let field = |k: &str| text.lines().find_map(|l| l.strip_prefix(&format!("{k}: "))).unwrap_or("?").to_string();
    let age = field("since").parse::<u64>().ok().map(|t| unix_now().saturating_sub(t));
    let age = match age {
        Some(s) if s >= 3600 => format!("{}h{}m ago", s / 3600, (s % 3600) / 60),
        Some(s) if s >= 60 => format!("{}m ago", s / 60),
        Some(s) => format!("{s}s ago"),
        None => "at an unknown time".into(),
    };
    format!("keelson {} on {} (pid {}), {age}", field("operation"), field("host"), field("pid"))
}

/// A state store location.
#[derive(Debug, Clone)]
pub enum StateStore {
    File(PathBuf),
    S3 { client: aws_sdk_s3::Client, bucket: String, prefix: String },
}

/// Split `s3://bucket/some/prefix` into bucket and prefix (no trailing slash).
pub fn parse_s3(url: &str) -> Option<(String, String)> {
    let rest = url.strip_prefix("s3://")?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    (!bucket.is_empty()).then(|| (bucket.to_string(), prefix.trim_matches('/').to_string()))
}

fn s3_err<E: aws_sdk_s3::error::ProvideErrorMetadata + std::fmt::Debug>(
    op: &'static str,
    bucket: &str,
    key: &str,
    e: E,
) -> StoreError {
    StoreError::S3 {
        op,
        bucket: bucket.into(),
        key: key.into(),
        message: match (e.code(), e.message()) {
            (Some(c), Some(m)) => format!("{c}: {m}"),
            (Some(c), None) => c.to_string(),
            _ => format!("{e:?}"),
        },
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(bytes))
}

/// The keysets whose presence marks "the cluster's PKI exists".
pub const CA_MARKER: &str = "pki/private/kubernetes-ca/keyset.yaml";

impl StateStore {
    /// Open `config_base`; `s3` is the client to use for `s3://` (built by the AWS target).
    pub fn open(config_base: &str, s3: Option<aws_sdk_s3::Client>) -> Result<StateStore, StoreError> {
        if let Some(path) = config_base.strip_prefix("file://") {
            return Ok(StateStore::File(PathBuf::from(path)));
        }
        if let (Some((bucket, prefix)), Some(client)) = (parse_s3(config_base), s3) {
            return Ok(StateStore::S3 { client, bucket, prefix });
        }
        Err(StoreError::Scheme(config_base.to_string()))
    }

    fn s3_key(prefix: &str, rel: &str) -> String {
        if prefix.is_empty() {
            rel.to_string()
        } else {
            format!("{prefix}/{rel}")
        }
    }

    pub async fn get(&self, rel: &str) -> Result<Option<Vec<u8>>, StoreError> {
        match self {
            StateStore::File(dir) => {
                let path = dir.join(rel);
                match std::fs::read(&path) {
                    Ok(b) => Ok(Some(b)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(source) => Err(StoreError::Io { path, source }),
                }
            }
            StateStore::S3 { client, bucket, prefix } => {
                let key = Self::s3_key(prefix, rel);
                match client.get_object().bucket(bucket).key(&key).send().await {
                    Ok(out) => {
                        let body = out.body.collect().await.map_err(|e| StoreError::S3 {
                            op: "GetObject",
                            bucket: bucket.clone(),
                            key: key.clone(),
                            message: e.to_string(),
                        })?;
                        Ok(Some(body.into_bytes().to_vec()))
                    }
                    Err(e) => {
                        let svc = e.into_service_error();
                        if svc.is_no_such_key() {
                            Ok(None)
                        } else {
                            Err(s3_err("GetObject", bucket, &key, svc))
                        }
                    }
                }
            }
        }
    }

    pub async fn put(&self, rel: &str, bytes: &[u8]) -> Result<(), StoreError> {
        match self {
            StateStore::File(dir) => {
                let path = dir.join(rel);
                let io = |source| StoreError::Io { path: path.clone(), source };
                let parent = path.parent().unwrap_or(dir);
                std::fs::create_dir_all(parent).map_err(io)?;
                let mut tmp = tempfile::NamedTempFile::new_in(parent).map_err(io)?;
                std::io::Write::write_all(&mut tmp, bytes).map_err(io)?;
                tmp.persist(&path).map_err(|e| io(e.error))?;
                Ok(())
            }
            StateStore::S3 { client, bucket, prefix } => {
                let key = Self::s3_key(prefix, rel);
                client
                    .put_object()
                    .bucket(bucket)
                    .key(&key)
                    .body(aws_sdk_s3::primitives::ByteStream::from(bytes.to_vec()))
                    .send()
                    .await
                    .map_err(|e| s3_err("PutObject", bucket, &key, e.into_service_error()))?;
                Ok(())
            }
        }
    }

    pub async fn delete(&self, rel: &str) -> Result<(), StoreError> {
        match self {
            StateStore::File(dir) => {
                let path = dir.join(rel);
                match std::fs::remove_file(&path) {
                    Ok(()) => Ok(()),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                    Err(source) => Err(StoreError::Io { path, source }),
                }
            }
            StateStore::S3 { client, bucket, prefix } => {
                let key = Self::s3_key(prefix, rel);
                client
                    .delete_object()
                    .bucket(bucket)
                    .key(&key)
                    .send()
                    .await
                    .map_err(|e| s3_err("DeleteObject", bucket, &key, e.into_service_error()))?;
                Ok(())
            }
        }
    }

    /// Every file under `rel_prefix` (relative names), bounded by pagination.
    pub async fn list(&self, rel_prefix: &str) -> Result<Vec<String>, StoreError> {
        match self {
            StateStore::File(dir) => {
                let mut out = Vec::new();
                let mut stack = vec![dir.join(rel_prefix)];
                while let Some(d) = stack.pop() {
                    let entries = match std::fs::read_dir(&d) {
                        Ok(e) => e,
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                        Err(source) => return Err(StoreError::Io { path: d, source }),
                    };
                    for e in entries.flatten() {
                        let p = e.path();
                        if p.is_dir() {
                            stack.push(p);
                        } else if let Ok(rel) = p.strip_prefix(dir) {
                            out.push(rel.to_string_lossy().into_owned());
                        }
                    }
                }
                out.sort();
                Ok(out)
            }
            StateStore::S3 { client, bucket, prefix } => {
                let full = Self::s3_key(prefix, rel_prefix);
                let mut out = Vec::new();
                let mut token: Option<String> = None;
                for _ in 0..1000 {
                    let resp = client
                        .list_objects_v2()
                        .bucket(bucket)
                        .prefix(&full)
                        .set_continuation_token(token.clone())
                        .send()
                        .await
                        .map_err(|e| s3_err("ListObjectsV2", bucket, &full, e.into_service_error()))?;
                    for o in resp.contents() {
                        if let Some(k) = o.key() {
                            let rel = if prefix.is_empty() { k } else { k.strip_prefix(&format!("{prefix}/")).unwrap_or(k) };
                            out.push(rel.to_string());
                        }
                    }
                    token = resp.next_continuation_token().map(str::to_string);
                    if token.is_none() {
                        break;
                    }
                }
                out.sort();
                Ok(out)
            }
        }
    }

    /// Take the cluster lock for `operation`, or fail naming who holds it. Creation is atomic:
    /// `O_EXCL` for `file://`, a conditional PUT (`If-None-Match: *`) for `s3://`.
    pub async fn lock(&self, operation: &str) -> Result<StoreLock, StoreError> {
        let content = format!(
            "operation: {operation}\nhost: {}\npid: {}\nsince: {}\nnonce: {:x}\n",
            hostname(),
            std::process::id(),
            unix_now(),
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
        )
        .into_bytes();
        let locked = |holder: Vec<u8>| StoreError::Locked { store: self.describe(), holder: describe_holder(&holder) };
        match self {
            StateStore::File(dir) => {
                let path = dir.join(LOCK_FILE);
                let io = |source| StoreError::Io { path: path.clone(), source };
                std::fs::create_dir_all(dir).map_err(io)?;
                match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
                    Ok(mut f) => {
                        std::io::Write::write_all(&mut f, &content).map_err(io)?;
                        f.sync_all().map_err(io)?;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        return Err(locked(std::fs::read(&path).unwrap_or_default()));
                    }
                    Err(e) => return Err(io(e)),
                }
            }
            StateStore::S3 { client, bucket, prefix } => {
                let key = Self::s3_key(prefix, LOCK_FILE);
                let put = client
                    .put_object()
                    .bucket(bucket)
                    .key(&key)
                    .if_none_match("*")
                    .body(aws_sdk_s3::primitives::ByteStream::from(content.clone()))
                    .send()
                    .await;
                if let Err(e) = put {
                    let svc = e.into_service_error();
                    let code = aws_sdk_s3::error::ProvideErrorMetadata::code(&svc).unwrap_or("").to_string();
                    if code == "PreconditionFailed" || code == "ConditionalRequestConflict" {
                        return Err(locked(self.get(LOCK_FILE).await?.unwrap_or_default()));
                    }
                    return Err(s3_err("PutObject", bucket, &key, svc));
                }
            }
        }
        Ok(StoreLock { store: self.clone(), content })
    }

    /// Remove a lock left by a run that died; returns who held it.
    pub async fn force_unlock(&self) -> Result<Option<String>, StoreError> {
        let holder = self.get(LOCK_FILE).await?;
        if holder.is_some() {
            self.delete(LOCK_FILE).await?;
        }
        Ok(holder.map(|h| describe_holder(&h)))
    }

    pub fn describe(&self) -> String {
        match self {
            StateStore::File(d) => format!("file://{}", d.display()),
            StateStore::S3 { bucket, prefix, .. } => format!("s3://{bucket}/{prefix}"),
        }
    }
}

/// The state files the compiled tree wants, as plan resources (compared by sha256), plus the CA
/// keysets as one resource that exists once created.
pub fn desired(state: &BTreeMap<String, Vec<u8>>) -> Vec<Resource> {
    let mut out: Vec<Resource> =
        state.iter().map(|(rel, bytes)| Resource::new(Kind::StateFile, rel.clone()).attr("sha256", sha256_hex(bytes))).collect();
    out.push(Resource::new(Kind::Keyset, "pki (cluster CAs, service-account key, bootstrap token)"));
    out
}

/// What the store holds for the desired files (reads only).
pub async fn discover(
    store: &StateStore,
    state: &BTreeMap<String, Vec<u8>>,
    etcd_clusters: &[String],
) -> Result<Vec<Resource>, StoreError> {
    let mut out = Vec::new();
    for rel in state.keys() {
        if let Some(bytes) = store.get(rel).await? {
            out.push(Resource::new(Kind::StateFile, rel.clone()).attr("sha256", sha256_hex(&bytes)));
        }
    }
    // Complete only when every keyset (both halves) and the bootstrap token exist, so a run that
    // stopped half-way through uploading the PKI finishes it next time.
    let mut have: std::collections::BTreeSet<String> = store.list("pki/").await?.into_iter().collect();
    have.extend(store.list("secrets/").await?);
    if pki_files(etcd_clusters).iter().all(|f| have.contains(f)) {
        out.push(Resource::new(Kind::Keyset, "pki (cluster CAs, service-account key, bootstrap token)"));
    }
    Ok(out)
}

/// Every file the PKI consists of.
pub fn pki_files(etcd_clusters: &[String]) -> Vec<String> {
    let mut names = nodeup::pki::ca_names(etcd_clusters);
    names.push("service-account".into());
    let mut out: Vec<String> = names
        .iter()
        .flat_map(|n| [format!("pki/private/{n}/keyset.yaml"), format!("pki/issued/{n}/keyset.yaml")])
        .collect();
    out.push("secrets/node-bootstrap-token".into());
    out
}

/// Everything apply wrote (for `keelson delete`): the compiled files, not the PKI.
pub async fn discover_for_delete(store: &StateStore) -> Result<Vec<Resource>, StoreError> {
    let mut out = Vec::new();
    for prefix in ["cluster-completed.spec", "igconfig/", "instancegroup/"] {
        for rel in store.list(prefix).await? {
            out.push(Resource::new(Kind::StateFile, rel));
        }
    }
    Ok(out)
}

/// Creates the cluster's CAs. The nodeup crate owns the PKI format; this is the seam apply calls.
pub trait CaCreator {
    /// Create whatever is missing under `dir` (a `ConfigBase` directory); never replace anything.
    fn init(&self, dir: &Path, etcd_clusters: &[String]) -> Result<Vec<String>, StoreError>;
}

/// The nodeup crate's `init_pki`.
pub struct NodeupPki;

impl CaCreator for NodeupPki {
    fn init(&self, dir: &Path, etcd_clusters: &[String]) -> Result<Vec<String>, StoreError> {
        nodeup::pki::init_pki(dir, etcd_clusters).map_err(|e| StoreError::Pki(e.to_string()))
    }
}

/// Create the CAs on first apply. For `s3://` the existing PKI files are copied into a temporary
/// directory, the creator fills in what is missing, and only new files are uploaded; nothing that
/// exists is ever overwritten.
pub async fn ensure_pki(store: &StateStore, etcd_clusters: &[String], creator: &dyn CaCreator) -> Result<Vec<String>, StoreError> {
    match store {
        StateStore::File(dir) => {
            std::fs::create_dir_all(dir).map_err(|source| StoreError::Io { path: dir.clone(), source })?;
            creator.init(dir, etcd_clusters)
        }
        StateStore::S3 { .. } => {
            let tmp = tempfile::tempdir().map_err(|source| StoreError::Io { path: std::env::temp_dir(), source })?;
            let mut existing = Vec::new();
            for prefix in ["pki/", "secrets/"] {
                for rel in store.list(prefix).await? {
                    if let Some(bytes) = store.get(&rel).await? {
                        let p = tmp.path().join(&rel);
                        if let Some(parent) = p.parent() {
                            std::fs::create_dir_all(parent).map_err(|source| StoreError::Io { path: p.clone(), source })?;
                        }
                        std::fs::write(&p, bytes).map_err(|source| StoreError::Io { path: p.clone(), source })?;
                        existing.push(rel);
                    }
                }
            }
            let created = creator.init(tmp.path(), etcd_clusters)?;
            let local = StateStore::File(tmp.path().to_path_buf());
            for prefix in ["pki/", "secrets/"] {
                for rel in local.list(prefix).await? {
                    if existing.contains(&rel) {
                        continue;
                    }
                    if let Some(bytes) = local.get(&rel).await? {
                        store.put(&rel, &bytes).await?;
                    }
                }
            }
            Ok(created)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3_urls_split_into_bucket_and_prefix() {
        assert_eq!(parse_s3("s3://b/x/y/"), Some(("b".into(), "x/y".into())));
        assert_eq!(parse_s3("s3://b"), Some(("b".into(), String::new())));
        assert_eq!(parse_s3("gs://b/x"), None);
    }

    #[tokio::test]
    async fn the_lock_keeps_a_second_run_out_and_names_the_holder() {
        let d = tempfile::tempdir().expect("tempdir");
        let store = StateStore::File(d.path().join("c"));
        let first = store.lock("apply").await.expect("first lock");
        let err = store.lock("delete").await.expect_err("second run is kept out");
        let text = err.to_string();
        assert!(text.contains("keelson apply on") && text.contains(&format!("pid {}", std::process::id())), "{text}");
        assert!(text.contains("--force-unlock"), "{text}");
        first.release().await.expect("release");
        let second = store.lock("delete").await.expect("free again");
        // A lock taken over with --force-unlock is not removed by the run that lost it.
        let holder = store.force_unlock().await.expect("force").expect("held");
        assert!(holder.contains("keelson delete"), "{holder}");
        let third = store.lock("rolling-update").await.expect("taken over");
        second.release().await.expect("stale release is a no-op");
        assert!(store.lock("apply").await.is_err(), "the new holder still holds it");
        third.release().await.expect("release");
        assert_eq!(store.get(LOCK_FILE).await.expect("get"), None);
    }

    #[tokio::test]
    async fn file_store_round_trip_and_pki_is_created_once() {
        let d = tempfile::tempdir().expect("tempdir");
        let store = StateStore::open(&format!("file://{}", d.path().display()), None).expect("open");
        assert_eq!(store.get("a/b").await.expect("get"), None);
        store.put("a/b", b"x").await.expect("put");
        assert_eq!(store.get("a/b").await.expect("get"), Some(b"x".to_vec()));
        assert_eq!(store.list("a/").await.expect("list"), vec!["a/b".to_string()]);
        let created = ensure_pki(&store, &["main".into()], &NodeupPki).await.expect("pki");
        assert!(created.contains(&"kubernetes-ca".to_string()));
        let before = store.get(CA_MARKER).await.expect("get").expect("ca exists");
        assert!(ensure_pki(&store, &["main".into()], &NodeupPki).await.expect("pki again").is_empty());
        assert_eq!(store.get(CA_MARKER).await.expect("get").expect("ca"), before, "never regenerated");
    }
}
