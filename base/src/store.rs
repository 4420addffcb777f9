//! The state store at `ConfigBase`: `file://` (or a plain absolute path), `http(s)://` (read-only)
//! and `s3://bucket/prefix` (feature `aws`, through `aws-sdk-s3`). Keys are relative to the base
//! (`igconfig/node/nodes/nodeupconfig.yaml`, `pki/private/kubernetes-ca/keyset.yaml`).
//!
//! Reads return `Ok(None)` for a key that does not exist; every other failure is an error that names
//! the object. Writes to `file://` are atomic ([`crate::fs::write_atomic`]); the cluster lock is an
//! exclusive create (`O_EXCL`, or a conditional PUT on S3).

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a state-store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("ConfigBase {base:?}: unsupported scheme (file://, http://, https://, s3://)")]
    Scheme { base: String },
    #[error("ConfigBase {base}: s3:// needs the AWS SDK (this build has no S3 client)")]
    NoS3 { base: String },
    #[error("ConfigBase {base}: {op} is not possible on a read-only http(s) store")]
    ReadOnly { base: String, op: &'static str },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{url}: {source}")]
    Http {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{url}: HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("s3://{bucket}/{key}: {op}: {message}")]
    S3 {
        op: &'static str,
        bucket: String,
        key: String,
        message: String,
        #[source]
        source: BoxError,
    },
    #[error("{url}: not found in the state store")]
    Missing { url: String },
    #[error(
        "{store}/{LOCK_FILE}: the cluster is locked by another run ({holder}); wait for it to finish, \
         or, if that run is gone, give --force-unlock"
    )]
    Locked { store: String, holder: String },
}

/// Where a cluster's state lives (`spec.configBase`), parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigBase {
    File(PathBuf),
    /// `http://…` or `https://…`, without a trailing slash.
    Http(String),
    S3 {
        bucket: String,
        prefix: String,
    },
}

impl FromStr for ConfigBase {
    type Err = StoreError;

    fn from_str(text: &str) -> Result<ConfigBase, StoreError> {
        let base = text.trim_end_matches('/');
        if let Some(p) = base.strip_prefix("file://") {
            return Ok(ConfigBase::File(PathBuf::from(if p.is_empty() { "/" } else { p })));
        }
        if base.starts_with('/') {
            return Ok(ConfigBase::File(PathBuf::from(base)));
        }
        if base.starts_with("http://") || base.starts_with("https://") {
            return Ok(ConfigBase::Http(base.to_string()));
        }
        if let Some(rest) = base.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if !bucket.is_empty() {
                return Ok(ConfigBase::S3 { bucket: bucket.to_string(), prefix: prefix.trim_matches('/').to_string() });
            }
        }
        Err(StoreError::Scheme { base: text.to_string() })
    }
}

impl fmt::Display for ConfigBase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigBase::File(p) => write!(f, "file://{}", p.display()),
            ConfigBase::Http(u) => f.write_str(u),
            ConfigBase::S3 { bucket, prefix } if prefix.is_empty() => write!(f, "s3://{bucket}"),
            ConfigBase::S3 { bucket, prefix } => write!(f, "s3://{bucket}/{prefix}"),
        }
    }
}

impl ConfigBase {
    /// The URL of one key (for messages).
    pub fn url(&self, rel: &str) -> String {
        format!("{self}/{}", rel.trim_start_matches('/'))
    }

    /// The object key of `rel` under an S3 prefix.
    #[cfg_attr(not(feature = "aws"), allow(dead_code))]
    fn s3_key(prefix: &str, rel: &str) -> String {
        let rel = rel.trim_start_matches('/');
        if prefix.is_empty() {
            rel.to_string()
        } else {
            format!("{prefix}/{rel}")
        }
    }
}

/// Copy `src` to `dst` through a temp file beside it (fsync, rename): readers see the whole file or nothing.
fn copy_atomic(src: &Path, dst: &Path) -> std::io::Result<()> {
    if let Some(parent) = dst.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let temp = crate::fs::temp_path_for(dst);
    let result = (|| {
        std::fs::copy(src, &temp)?;
        std::fs::File::open(&temp)?.sync_all()?;
        std::fs::rename(&temp, dst)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

/// The lock object under ConfigBase that keeps two apply / delete / rolling-update runs apart.
pub const LOCK_FILE: &str = "keelson.lock";

/// Attempts of one http(s) read (transport errors and 5xx are retried with doubling backoff).
const HTTP_ATTEMPTS: u32 = 5;

#[derive(Debug, Clone)]
enum Backend {
    File(PathBuf),
    Http(reqwest::Client),
    #[cfg(feature = "aws")]
    S3(aws_sdk_s3::Client),
}

/// The part size of S3 uploads from files: a file larger than one part goes up as a multipart
/// upload (S3 takes at most 5 GiB in one PutObject; etcd snapshots may be 8 GiB).
pub const DEFAULT_PART_SIZE: u64 = 64 << 20;

/// An open state store.
#[derive(Debug, Clone)]
pub struct StateStore {
    base: ConfigBase,
    backend: Backend,
    part_size: u64,
}

impl StateStore {
    /// Open a `file://` or `http(s)://` store (`s3://` needs [`StateStore::open_with_s3`]).
    /// `timeout` bounds each http(s) request.
    pub fn open(base: &ConfigBase, timeout: Duration) -> Result<StateStore, StoreError> {
        let backend = match base {
            ConfigBase::File(p) => Backend::File(p.clone()),
            ConfigBase::Http(url) => Backend::Http(
                reqwest::Client::builder().connect_timeout(timeout).timeout(timeout).build().map_err(|source| StoreError::Http { url: url.clone(), source })?,
            ),
            ConfigBase::S3 { .. } => return Err(StoreError::NoS3 { base: base.to_string() }),
        };
        Ok(StateStore { base: base.clone(), backend, part_size: DEFAULT_PART_SIZE })
    }

    /// Open any store; `s3` is the client for an `s3://` base (ignored for the others).
    #[cfg(feature = "aws")]
    pub fn open_with_s3(base: &ConfigBase, s3: Option<aws_sdk_s3::Client>, timeout: Duration) -> Result<StateStore, StoreError> {
        match (base, s3) {
            (ConfigBase::S3 { .. }, Some(client)) => Ok(StateStore { base: base.clone(), backend: Backend::S3(client), part_size: DEFAULT_PART_SIZE }),
            _ => StateStore::open(base, timeout),
        }
    }

    /// A local directory as a store.
    pub fn dir(path: &Path) -> StateStore {
        StateStore { base: ConfigBase::File(path.to_path_buf()), backend: Backend::File(path.to_path_buf()), part_size: DEFAULT_PART_SIZE }
    }

    /// Upload files larger than `bytes` to S3 in parts of `bytes` (at least S3's 5 MiB minimum;
    /// more when 10,000 parts would not hold the file).
    pub fn with_part_size(mut self, bytes: u64) -> StateStore {
        self.part_size = bytes.max(s3_parts::MIN_PART_SIZE);
        self
    }

    pub fn base(&self) -> &ConfigBase {
        &self.base
    }

    /// The local directory of a `file://` store.
    pub fn local_dir(&self) -> Option<&Path> {
        match &self.backend {
            Backend::File(p) => Some(p),
            _ => None,
        }
    }

    pub fn url(&self, rel: &str) -> String {
        self.base.url(rel)
    }

    /// Read one object; `Ok(None)` when it does not exist.
    pub async fn get(&self, rel: &str) -> Result<Option<Vec<u8>>, StoreError> {
        match &self.backend {
            Backend::File(dir) => {
                let path = dir.join(rel.trim_start_matches('/'));
                match tokio::fs::read(&path).await {
                    Ok(b) => Ok(Some(b)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(source) => Err(StoreError::Io { path, source }),
                }
            }
            Backend::Http(client) => http_get(client, &self.url(rel)).await,
            #[cfg(feature = "aws")]
            Backend::S3(client) => {
                let ConfigBase::S3 { bucket, prefix } = &self.base else { return Err(StoreError::NoS3 { base: self.base.to_string() }) };
                s3::get(client, bucket, &ConfigBase::s3_key(prefix, rel)).await
            }
        }
    }

    /// Read one object that must exist.
    pub async fn get_required(&self, rel: &str) -> Result<Vec<u8>, StoreError> {
        self.get(rel).await?.ok_or_else(|| StoreError::Missing { url: self.url(rel) })
    }

    /// Write one object (atomically on `file://`).
    pub async fn put(&self, rel: &str, bytes: &[u8]) -> Result<(), StoreError> {
        match &self.backend {
            Backend::File(dir) => {
                let path = dir.join(rel.trim_start_matches('/'));
                crate::fs::write_atomic(&path, bytes, 0o644, None).map_err(|e| StoreError::Io { path: e.path, source: e.source })
            }
            Backend::Http(_) => Err(StoreError::ReadOnly { base: self.base.to_string(), op: "write" }),
            #[cfg(feature = "aws")]
            Backend::S3(client) => {
                let ConfigBase::S3 { bucket, prefix } = &self.base else { return Err(StoreError::NoS3 { base: self.base.to_string() }) };
                s3::put(client, bucket, &ConfigBase::s3_key(prefix, rel), bytes.to_vec(), false).await
            }
        }
    }

    /// Delete one object; deleting what is not there is not an error.
    pub async fn delete(&self, rel: &str) -> Result<(), StoreError> {
        match &self.backend {
            Backend::File(dir) => {
                let path = dir.join(rel.trim_start_matches('/'));
                match std::fs::remove_file(&path) {
                    Ok(()) => Ok(()),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                    Err(source) => Err(StoreError::Io { path, source }),
                }
            }
            Backend::Http(_) => Err(StoreError::ReadOnly { base: self.base.to_string(), op: "delete" }),
            #[cfg(feature = "aws")]
            Backend::S3(client) => {
                let ConfigBase::S3 { bucket, prefix } = &self.base else { return Err(StoreError::NoS3 { base: self.base.to_string() }) };
                s3::delete(client, bucket, &ConfigBase::s3_key(prefix, rel)).await
            }
        }
    }

    /// Write one object from a local file, streamed (never read whole into memory); atomic on
    /// `file://` (temp file + rename); in parts on S3 when larger than the part size.
    pub async fn put_file(&self, rel: &str, source: &Path) -> Result<(), StoreError> {
        match &self.backend {
            Backend::File(dir) => {
                let path = dir.join(rel.trim_start_matches('/'));
                let (src, dst) = (source.to_path_buf(), path.clone());
                tokio::task::spawn_blocking(move || copy_atomic(&src, &dst))
                    .await
                    .map_err(|e| StoreError::Io { path: path.clone(), source: std::io::Error::other(e) })?
                    .map_err(|source| StoreError::Io { path, source })
            }
            Backend::Http(_) => Err(StoreError::ReadOnly { base: self.base.to_string(), op: "write" }),
            #[cfg(feature = "aws")]
            Backend::S3(client) => {
                let ConfigBase::S3 { bucket, prefix } = &self.base else { return Err(StoreError::NoS3 { base: self.base.to_string() }) };
                s3::put_file(client, bucket, &ConfigBase::s3_key(prefix, rel), source, self.part_size).await
            }
        }
    }

    /// Read one object in chunks, handing each to `sink` (never whole in memory); `Ok(None)` when
    /// it does not exist, else the number of bytes read.
    pub async fn read_chunks(&self, rel: &str, mut sink: impl FnMut(&[u8]) -> std::io::Result<()> + Send) -> Result<Option<u64>, StoreError> {
        let sink_err = |path: String| move |source| StoreError::Io { path: PathBuf::from(path), source };
        match &self.backend {
            Backend::File(dir) => {
                use tokio::io::AsyncReadExt as _;
                let path = dir.join(rel.trim_start_matches('/'));
                let mut f = match tokio::fs::File::open(&path).await {
                    Ok(f) => f,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                    Err(source) => return Err(StoreError::Io { path, source }),
                };
                let mut buf = vec![0u8; 1 << 16];
                let mut total = 0u64;
                loop {
                    let n = f.read(&mut buf).await.map_err(|source| StoreError::Io { path: path.clone(), source })?;
                    if n == 0 {
                        return Ok(Some(total));
                    }
                    total += n as u64;
                    sink(&buf[..n]).map_err(sink_err(self.url(rel)))?;
                }
            }
            Backend::Http(client) => {
                let url = self.url(rel);
                let mut resp = client.get(&url).send().await.map_err(|source| StoreError::Http { url: url.clone(), source })?;
                if resp.status() == reqwest::StatusCode::NOT_FOUND {
                    return Ok(None);
                }
                if !resp.status().is_success() {
                    return Err(StoreError::Status { url, status: resp.status().as_u16() });
                }
                let mut total = 0u64;
                while let Some(chunk) = resp.chunk().await.map_err(|source| StoreError::Http { url: url.clone(), source })? {
                    total += chunk.len() as u64;
                    sink(&chunk).map_err(sink_err(url.clone()))?;
                }
                Ok(Some(total))
            }
            #[cfg(feature = "aws")]
            Backend::S3(client) => {
                let ConfigBase::S3 { bucket, prefix } = &self.base else { return Err(StoreError::NoS3 { base: self.base.to_string() }) };
                s3::read_chunks(client, bucket, &ConfigBase::s3_key(prefix, rel), &mut sink).await
            }
        }
    }

    /// Size and lower-case hex sha256 of one object, read streamed; `Ok(None)` when it does not exist.
    pub async fn digest(&self, rel: &str) -> Result<Option<(u64, String)>, StoreError> {
        use sha2::Digest as _;
        let mut hasher = sha2::Sha256::new();
        let size = self
            .read_chunks(rel, |chunk| {
                hasher.update(chunk);
                Ok(())
            })
            .await?;
        Ok(size.map(|n| (n, hex::encode(hasher.finalize()))))
    }

    /// Copy one object to a local file (streamed, written to a temp file and renamed into place);
    /// returns its size and sha256, or `Ok(None)` when it does not exist. The file is private
    /// (0600), and so are the directories this creates for it (0700): downloads are etcd snapshots.
    pub async fn download(&self, rel: &str, dest: &Path) -> Result<Option<(u64, String)>, StoreError> {
        use sha2::Digest as _;
        use std::io::Write as _;
        let io = |source| StoreError::Io { path: dest.to_path_buf(), source };
        if let Some(parent) = dest.parent().filter(|p| !p.as_os_str().is_empty() && !p.is_dir()) {
            crate::fs::ensure_private_dir(parent).map_err(|e| StoreError::Io { path: e.path, source: e.source })?;
        }
        let temp = crate::fs::temp_path_for(dest);
        let mut file = std::io::BufWriter::new(crate::fs::create_private(&temp).map_err(io)?);
        let mut hasher = sha2::Sha256::new();
        let read = self
            .read_chunks(rel, |chunk| {
                hasher.update(chunk);
                file.write_all(chunk)
            })
            .await;
        let finish = |file: std::io::BufWriter<std::fs::File>| -> std::io::Result<()> {
            let f = file.into_inner().map_err(|e| e.into_error())?;
            f.sync_all()?;
            std::fs::rename(&temp, dest)
        };
        match read {
            Ok(Some(n)) => {
                finish(file).map_err(io)?;
                Ok(Some((n, hex::encode(hasher.finalize()))))
            }
            missing_or_failed => {
                drop(file);
                let _ = std::fs::remove_file(&temp);
                missing_or_failed.map(|_| None)
            }
        }
    }

    /// Every object under `rel_prefix` (keys relative to the base), sorted.
    pub async fn list(&self, rel_prefix: &str) -> Result<Vec<String>, StoreError> {
        Ok(self.list_modified(rel_prefix).await?.into_iter().map(|(k, _)| k).collect())
    }

    /// Every object under `rel_prefix` with the time the store says it was last written (a file's
    /// mtime, an S3 object's `LastModified`; `None` when S3 did not say), sorted by key.
    pub async fn list_modified(&self, rel_prefix: &str) -> Result<Vec<(String, Option<time::OffsetDateTime>)>, StoreError> {
        match &self.backend {
            Backend::File(dir) => {
                let mut out = Vec::new();
                let mut stack = vec![dir.join(rel_prefix)];
                while let Some(d) = stack.pop() {
                    let entries = match std::fs::read_dir(&d) {
                        Ok(e) => e,
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound || e.kind() == std::io::ErrorKind::NotADirectory => continue,
                        Err(source) => return Err(StoreError::Io { path: d, source }),
                    };
                    for e in entries.flatten() {
                        let p = e.path();
                        if e.file_name().to_string_lossy().starts_with(crate::fs::TEMP_PREFIX) {
                            continue;
                        }
                        let meta = match std::fs::metadata(&p) {
                            Ok(m) => m,
                            // Deleted since it was listed.
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                            Err(source) => return Err(StoreError::Io { path: p, source }),
                        };
                        if meta.is_dir() {
                            stack.push(p);
                        } else if let Ok(rel) = p.strip_prefix(dir) {
                            out.push((rel.to_string_lossy().into_owned(), meta.modified().ok().map(time::OffsetDateTime::from)));
                        }
                    }
                }
                out.sort();
                Ok(out)
            }
            Backend::Http(_) => Err(StoreError::ReadOnly { base: self.base.to_string(), op: "list" }),
            #[cfg(feature = "aws")]
            Backend::S3(client) => {
                let ConfigBase::S3 { bucket, prefix } = &self.base else { return Err(StoreError::NoS3 { base: self.base.to_string() }) };
                s3::list_modified(client, bucket, prefix, rel_prefix).await
            }
        }
    }

    /// Take the cluster lock for `operation`, or fail naming who holds it. Creation is atomic:
    /// `O_EXCL` for `file://`, a conditional PUT (`If-None-Match: *`) for `s3://`.
    pub async fn lock(&self, operation: &str) -> Result<StoreLock, StoreError> {
        let content = lock_content(operation);
        let locked = |holder: Vec<u8>| StoreError::Locked { store: self.base.to_string(), holder: describe_holder(&holder) };
        match &self.backend {
            Backend::File(dir) => {
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
            Backend::Http(_) => return Err(StoreError::ReadOnly { base: self.base.to_string(), op: "lock" }),
            #[cfg(feature = "aws")]
            Backend::S3(client) => {
                let ConfigBase::S3 { bucket, prefix } = &self.base else { return Err(StoreError::NoS3 { base: self.base.to_string() }) };
                let key = ConfigBase::s3_key(prefix, LOCK_FILE);
                match s3::put(client, bucket, &key, content.clone(), true).await {
                    Ok(()) => {}
                    Err(StoreError::S3 { message, .. }) if s3::is_precondition_failure(&message) => {
                        return Err(locked(self.get(LOCK_FILE).await?.unwrap_or_default()));
                    }
                    Err(e) => return Err(e),
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
}

async fn http_get(client: &reqwest::Client, url: &str) -> Result<Option<Vec<u8>>, StoreError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let err = match client.get(url).send().await {
            Ok(resp) if resp.status().as_u16() == 404 => return Ok(None),
            Ok(resp) if resp.status().is_success() => match resp.bytes().await {
                Ok(b) => return Ok(Some(b.to_vec())),
                Err(source) => StoreError::Http { url: url.to_string(), source },
            },
            Ok(resp) => {
                let status = resp.status().as_u16();
                let e = StoreError::Status { url: url.to_string(), status };
                if status < 500 && status != 429 {
                    return Err(e);
                }
                e
            }
            Err(source) => StoreError::Http { url: url.to_string(), source },
        };
        if attempt >= HTTP_ATTEMPTS {
            return Err(err);
        }
        let wait = crate::imds::jittered(Duration::from_millis(250), attempt - 1, Duration::from_secs(4));
        tracing::warn!(%url, attempt, error = %err, ?wait, "state store read failed; retrying");
        tokio::time::sleep(wait).await;
    }
}

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

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn lock_content(operation: &str) -> Vec<u8> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".into());
    let nonce = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("operation: {operation}\nhost: {host}\npid: {}\nsince: {}\nnonce: {nonce:x}\n", std::process::id(), unix_now()).into_bytes()
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

/// How a file is cut into the parts of an S3 multipart upload.
mod s3_parts {
    /// S3's smallest part (all but the last).
    pub const MIN_PART_SIZE: u64 = 5 << 20;
    /// S3's most parts in one upload.
    pub const MAX_PARTS: u64 = 10_000;

    /// `(offset, length)` of every part of a `size`-byte file in parts of `part_size` (grown when
    /// 10,000 parts would not hold the file). One part (or none, for an empty file) means: no
    /// multipart upload.
    #[cfg_attr(not(feature = "aws"), allow(dead_code))]
    pub fn plan(size: u64, part_size: u64) -> Vec<(u64, u64)> {
        let part = part_size.max(MIN_PART_SIZE).max(size.div_ceil(MAX_PARTS));
        (0..size.div_ceil(part)).map(|i| (i * part, part.min(size - i * part))).collect()
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn parts_cover_the_file_within_s3_limits() {
            const MIB: u64 = 1 << 20;
            assert!(plan(0, 64 * MIB).is_empty());
            assert_eq!(plan(64 * MIB, 64 * MIB), vec![(0, 64 * MIB)]);
            assert_eq!(plan(12 * MIB + 3, 5 * MIB), vec![(0, 5 * MIB), (5 * MIB, 5 * MIB), (10 * MIB, 2 * MIB + 3)]);
            // Below S3's minimum the parts are 5 MiB anyway.
            assert_eq!(plan(6 * MIB, MIB).len(), 2);
            // An 8 GiB snapshot in 64 MiB parts, and a file too big for 10,000 of them.
            for (size, part) in [(8 << 30, 64 * MIB), (MAX_PARTS * 64 * MIB + 1, 64 * MIB)] {
                let p = plan(size, part);
                assert!(p.len() as u64 <= MAX_PARTS, "{} parts", p.len());
                assert_eq!(p.iter().map(|(_, l)| l).sum::<u64>(), size);
                assert!(p.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0 && w[0].1 >= part));
            }
        }
    }
}

#[cfg(feature = "aws")]
mod s3 {
    use aws_sdk_s3::error::ProvideErrorMetadata;
    use aws_sdk_s3::operation::get_object::GetObjectOutput;
    use aws_sdk_s3::primitives::ByteStream;

    use super::StoreError;

    fn err<E>(op: &'static str, bucket: &str, key: &str, e: E) -> StoreError
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let message = match (e.code(), e.message()) {
            (Some(c), Some(m)) => format!("{c}: {m}"),
            (Some(c), None) => c.to_string(),
            _ => innermost(&e),
        };
        StoreError::S3 { op, bucket: bucket.into(), key: key.into(), message, source: Box::new(e) }
    }

    /// A failure outside the service's answer (reading a body, a local file).
    fn other<E: std::error::Error + Send + Sync + 'static>(op: &'static str, bucket: &str, key: &str, message: String, e: E) -> StoreError {
        StoreError::S3 { op, bucket: bucket.into(), key: key.into(), message, source: Box::new(e) }
    }

    /// The local file being uploaded could not be read.
    fn unreadable<E: std::error::Error + Send + Sync + 'static>(op: &'static str, bucket: &str, key: &str, file: &std::path::Path, e: E) -> StoreError {
        other(op, bucket, key, format!("reading {}: {e}", file.display()), e)
    }

    /// The innermost cause (SDK errors say little at the top level: "dispatch failure").
    fn innermost(e: &(dyn std::error::Error + 'static)) -> String {
        let mut cur = e;
        while let Some(s) = cur.source() {
            cur = s;
        }
        cur.to_string()
    }

    pub fn is_precondition_failure(message: &str) -> bool {
        message.starts_with("PreconditionFailed") || message.starts_with("ConditionalRequestConflict")
    }

    /// GetObject, following a bucket that lives in another region; `Ok(None)` when the key does not exist.
    async fn get_object(client: &aws_sdk_s3::Client, bucket: &str, key: &str) -> Result<Option<GetObjectOutput>, StoreError> {
        match client.get_object().bucket(bucket).key(key).send().await {
            Ok(r) => Ok(Some(r)),
            Err(e) if e.as_service_error().is_some_and(|s| s.is_no_such_key()) => Ok(None),
            Err(e) if matches!(e.code(), Some("PermanentRedirect") | Some("AuthorizationHeaderMalformed")) => {
                // The bucket lives in another region: ask where, then read from there.
                let loc = client.get_bucket_location().bucket(bucket).send().await.map_err(|e| err("GetBucketLocation", bucket, key, e))?;
                let region = loc.location_constraint().map(|c| c.as_str().to_string()).filter(|r| !r.is_empty()).unwrap_or_else(|| "us-east-1".into());
                let conf = client.config().to_builder().region(aws_sdk_s3::config::Region::new(region)).build();
                match aws_sdk_s3::Client::from_conf(conf).get_object().bucket(bucket).key(key).send().await {
                    Ok(r) => Ok(Some(r)),
                    Err(e) if e.as_service_error().is_some_and(|s| s.is_no_such_key()) => Ok(None),
                    Err(e) => Err(err("GetObject", bucket, key, e)),
                }
            }
            Err(e) => Err(err("GetObject", bucket, key, e)),
        }
    }

    pub async fn get(client: &aws_sdk_s3::Client, bucket: &str, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let Some(resp) = get_object(client, bucket, key).await? else { return Ok(None) };
        let body = resp.body.collect().await.map_err(|e| other("GetObject", bucket, key, e.to_string(), e))?;
        Ok(Some(body.into_bytes().to_vec()))
    }

    pub async fn put(client: &aws_sdk_s3::Client, bucket: &str, key: &str, bytes: Vec<u8>, if_absent: bool) -> Result<(), StoreError> {
        let mut req = client.put_object().bucket(bucket).key(key).body(ByteStream::from(bytes));
        if if_absent {
            req = req.if_none_match("*");
        }
        req.send().await.map_err(|e| err("PutObject", bucket, key, e.into_service_error()))?;
        Ok(())
    }

    /// One PutObject when the file fits in one part, else a multipart upload: parts read from the
    /// file one at a time (streamed), the upload aborted if any step fails (no orphaned parts).
    pub async fn put_file(client: &aws_sdk_s3::Client, bucket: &str, key: &str, source: &std::path::Path, part_size: u64) -> Result<(), StoreError> {
        let size = tokio::fs::metadata(source).await.map_err(|e| unreadable("PutObject", bucket, key, source, e))?.len();
        let parts = super::s3_parts::plan(size, part_size);
        if parts.len() <= 1 {
            let body = ByteStream::from_path(source).await.map_err(|e| unreadable("PutObject", bucket, key, source, e))?;
            client.put_object().bucket(bucket).key(key).body(body).send().await.map_err(|e| err("PutObject", bucket, key, e.into_service_error()))?;
            return Ok(());
        }
        let created = client
            .create_multipart_upload()
            .bucket(bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| err("CreateMultipartUpload", bucket, key, e.into_service_error()))?;
        let upload_id = created.upload_id().unwrap_or_default().to_string();
        let result = async {
            let mut done = Vec::with_capacity(parts.len());
            for (i, (offset, length)) in parts.iter().enumerate() {
                let number = i as i32 + 1;
                let body = ByteStream::read_from()
                    .path(source)
                    .offset(*offset)
                    .length(aws_sdk_s3::primitives::Length::Exact(*length))
                    .build()
                    .await
                    .map_err(|e| unreadable("UploadPart", bucket, key, source, e))?;
                let part = client
                    .upload_part()
                    .bucket(bucket)
                    .key(key)
                    .upload_id(&upload_id)
                    .part_number(number)
                    .body(body)
                    .send()
                    .await
                    .map_err(|e| err("UploadPart", bucket, key, e.into_service_error()))?;
                done.push(aws_sdk_s3::types::CompletedPart::builder().part_number(number).set_e_tag(part.e_tag().map(str::to_string)).build());
            }
            let completed = aws_sdk_s3::types::CompletedMultipartUpload::builder().set_parts(Some(done)).build();
            client
                .complete_multipart_upload()
                .bucket(bucket)
                .key(key)
                .upload_id(&upload_id)
                .multipart_upload(completed)
                .send()
                .await
                .map_err(|e| err("CompleteMultipartUpload", bucket, key, e.into_service_error()))?;
            Ok(())
        }
        .await;
        if result.is_err() {
            let _ = client.abort_multipart_upload().bucket(bucket).key(key).upload_id(&upload_id).send().await;
        }
        result
    }

    pub async fn read_chunks(
        client: &aws_sdk_s3::Client,
        bucket: &str,
        key: &str,
        sink: &mut (dyn FnMut(&[u8]) -> std::io::Result<()> + Send),
    ) -> Result<Option<u64>, StoreError> {
        let Some(resp) = get_object(client, bucket, key).await? else { return Ok(None) };
        let mut body = resp.body;
        let mut total = 0u64;
        loop {
            let next = body.try_next().await.map_err(|e| other("GetObject", bucket, key, e.to_string(), e))?;
            let Some(chunk) = next else { return Ok(Some(total)) };
            total += chunk.len() as u64;
            sink(&chunk).map_err(|e| other("GetObject", bucket, key, format!("writing what was read: {e}"), e))?;
        }
    }

    pub async fn delete(client: &aws_sdk_s3::Client, bucket: &str, key: &str) -> Result<(), StoreError> {
        client.delete_object().bucket(bucket).key(key).send().await.map_err(|e| err("DeleteObject", bucket, key, e.into_service_error()))?;
        Ok(())
    }

    pub async fn list_modified(
        client: &aws_sdk_s3::Client,
        bucket: &str,
        prefix: &str,
        rel_prefix: &str,
    ) -> Result<Vec<(String, Option<time::OffsetDateTime>)>, StoreError> {
        let full = super::ConfigBase::s3_key(prefix, rel_prefix);
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        // Bounded: 1000 pages of 1000 keys.
        for _ in 0..1000 {
            let resp = client
                .list_objects_v2()
                .bucket(bucket)
                .prefix(&full)
                .set_continuation_token(token.clone())
                .send()
                .await
                .map_err(|e| err("ListObjectsV2", bucket, &full, e.into_service_error()))?;
            for o in resp.contents() {
                if let Some(k) = o.key() {
                    let rel = if prefix.is_empty() { k } else { k.strip_prefix(&format!("{prefix}/")).unwrap_or(k) };
                    let modified = o.last_modified().and_then(|t| time::OffsetDateTime::from_unix_timestamp(t.secs()).ok());
                    out.push((rel.to_string(), modified));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_bases_parse_and_print() {
        let cases = [
            ("s3://b/x/y/", ConfigBase::S3 { bucket: "b".into(), prefix: "x/y".into() }, "s3://b/x/y"),
            ("s3://b", ConfigBase::S3 { bucket: "b".into(), prefix: String::new() }, "s3://b"),
            ("file:///srv/state/", ConfigBase::File("/srv/state".into()), "file:///srv/state"),
            ("/srv/state", ConfigBase::File("/srv/state".into()), "file:///srv/state"),
            ("https://h/c/", ConfigBase::Http("https://h/c".into()), "https://h/c"),
        ];
        for (text, want, shown) in cases {
            let got: ConfigBase = text.parse().expect(text);
            assert_eq!(got, want, "{text}");
            assert_eq!(got.to_string(), shown);
        }
        for bad in ["gs://b/x", "s3://", "relative/dir", ""] {
            assert!(matches!(bad.parse::<ConfigBase>(), Err(StoreError::Scheme { .. })), "{bad}");
        }
        assert_eq!(ConfigBase::s3_key("p", "/a/b"), "p/a/b");
        assert_eq!(ConfigBase::s3_key("", "a"), "a");
    }

    #[tokio::test]
    async fn file_store_round_trip() {
        let d = tempfile::tempdir().expect("tempdir");
        let store = StateStore::open(&format!("file://{}", d.path().display()).parse().expect("base"), Duration::from_secs(1)).expect("open");
        assert_eq!(store.get("a/b").await.expect("get"), None);
        assert!(matches!(store.get_required("a/b").await, Err(StoreError::Missing { .. })));
        store.put("a/b", b"x").await.expect("put");
        assert_eq!(store.get("a/b").await.expect("get"), Some(b"x".to_vec()));
        assert_eq!(store.list("a/").await.expect("list"), vec!["a/b".to_string()]);
        store.delete("a/b").await.expect("delete");
        store.delete("a/b").await.expect("delete again is fine");
        assert!(store.list("a/").await.expect("list").is_empty());
    }

    #[tokio::test]
    async fn http_store_is_read_only_and_404_is_none() {
        let store = StateStore::open(&"http://127.0.0.1:9/c".parse().expect("base"), Duration::from_millis(200)).expect("open");
        assert!(matches!(store.put("x", b"y").await, Err(StoreError::ReadOnly { op: "write", .. })));
        assert!(matches!(store.lock("apply").await, Err(StoreError::ReadOnly { .. })));
        assert!(matches!(StateStore::open(&"s3://b/p".parse().expect("base"), Duration::from_secs(1)), Err(StoreError::NoS3 { .. })));
    }

    #[tokio::test]
    async fn the_lock_keeps_a_second_run_out_and_names_the_holder() {
        let d = tempfile::tempdir().expect("tempdir");
        let store = StateStore::dir(&d.path().join("c"));
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
}
