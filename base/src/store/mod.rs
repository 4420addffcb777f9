//! The state store at `ConfigBase`: `file://` (or a plain absolute path), `http(s)://` (read-only),
//! `s3://bucket/prefix` (feature `aws`, through `aws-sdk-s3`) and `gs://bucket/prefix` (the Cloud
//! Storage JSON API). Keys are relative to the base
//! (`igconfig/node/nodes/nodeupconfig.yaml`, `pki/private/kubernetes-ca/keyset.yaml`).
//!
//! Reads return `Ok(None)` for a key that does not exist; every other failure is an error that names
//! the object. Writes to `file://` are atomic ([`crate::fs::write_atomic`]); the cluster lock is an
//! exclusive create (`O_EXCL`, or a conditional PUT on S3).
//!
//! One backend per module behind one enum ([`Backend`]): `file`, `http`, `s3`, `gcs`; [`StateStore`]
//! dispatches to them and keeps what is the same for all (`digest`, `download`, `list`, the lock).

mod config_base;
mod file;
mod gcs;
mod http;
mod lock;
#[cfg(feature = "aws")]
mod s3;
mod s3_parts;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use config_base::{ConfigBase, ConfigBaseError};
pub use gcs::GcsEndpoints;
pub use lock::StoreLock;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a state-store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("ConfigBase {base:?}: unsupported scheme (file://, http://, https://, s3://, gs://)")]
    Scheme { base: String },
    #[error(transparent)]
    PlainHttp(#[from] crate::plain_http::PlainHttpRefused),
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
    #[error("gs://{bucket}/{name}: {op}: {message}")]
    Gcs { op: &'static str, bucket: String, name: String, message: String },
    #[error("{url}: not found in the state store")]
    Missing { url: String },
    #[error(
        "{store}/{LOCK_FILE}: the cluster is locked by another run ({holder}); wait for it to finish, \
         or, if that run is gone, give --force-unlock"
    )]
    Locked { store: String, holder: String },
}

/// The lock object under ConfigBase that keeps two apply / delete / rolling-update runs apart.
pub const LOCK_FILE: &str = "keelson.lock";

/// One backend per scheme, each in its own module.
#[derive(Debug, Clone)]
enum Backend {
    File(file::FileStore),
    Http(http::HttpStore),
    #[cfg(feature = "aws")]
    S3(s3::S3Store),
    Gcs(Box<gcs::GcsStore>),
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
            ConfigBase::File(p) => Backend::File(file::FileStore::new(p.clone())),
            ConfigBase::Http(url) => {
                crate::plain_http::check("ConfigBase", url)?;
                Backend::Http(http::HttpStore::new(url, timeout)?)
            }
            ConfigBase::S3 { .. } => return Err(StoreError::NoS3 { base: base.to_string() }),
            ConfigBase::Vfs { .. } => return Err(StoreError::Scheme { base: base.to_string() }),
            ConfigBase::Gcs { bucket, prefix } => {
                let endpoints = GcsEndpoints::from_env();
                crate::plain_http::check(&format!("ConfigBase {base}: Cloud Storage endpoint (STORAGE_EMULATOR_HOST)"), &endpoints.storage)?;
                Backend::Gcs(Box::new(gcs::GcsStore::new(bucket, prefix, endpoints, timeout)?))
            }
        };
        Ok(StateStore { base: base.clone(), backend, part_size: DEFAULT_PART_SIZE })
    }

    /// Open any store; `s3` is the client for an `s3://` base (ignored for the others).
    #[cfg(feature = "aws")]
    pub fn open_with_s3(base: &ConfigBase, s3: Option<aws_sdk_s3::Client>, timeout: Duration) -> Result<StateStore, StoreError> {
        match (base, s3) {
            (ConfigBase::S3 { bucket, prefix }, Some(client)) => {
                Ok(StateStore { base: base.clone(), backend: Backend::S3(s3::S3Store::new(client, bucket, prefix)), part_size: DEFAULT_PART_SIZE })
            }
            _ => StateStore::open(base, timeout),
        }
    }

    /// A local directory as a store.
    pub fn dir(path: &Path) -> StateStore {
        StateStore {
            base: ConfigBase::File(path.to_path_buf()),
            backend: Backend::File(file::FileStore::new(path.to_path_buf())),
            part_size: DEFAULT_PART_SIZE,
        }
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
            Backend::File(f) => Some(f.dir()),
            _ => None,
        }
    }

    pub fn url(&self, rel: &str) -> String {
        self.base.url(rel)
    }

    fn read_only(&self, op: &'static str) -> StoreError {
        StoreError::ReadOnly { base: self.base.to_string(), op }
    }

    /// Read one object; `Ok(None)` when it does not exist.
    pub async fn get(&self, rel: &str) -> Result<Option<Vec<u8>>, StoreError> {
        match &self.backend {
            Backend::File(f) => f.get(rel).await,
            Backend::Http(h) => h.get(&self.url(rel)).await,
            #[cfg(feature = "aws")]
            Backend::S3(s3) => s3.get(rel).await,
            Backend::Gcs(g) => g.get(rel).await,
        }
    }

    /// Read one object that must exist.
    pub async fn get_required(&self, rel: &str) -> Result<Vec<u8>, StoreError> {
        self.get(rel).await?.ok_or_else(|| StoreError::Missing { url: self.url(rel) })
    }

    /// Write one object (atomically on `file://`).
    pub async fn put(&self, rel: &str, bytes: &[u8]) -> Result<(), StoreError> {
        match &self.backend {
            Backend::File(f) => f.put(rel, bytes),
            Backend::Http(_) => Err(self.read_only("write")),
            #[cfg(feature = "aws")]
            Backend::S3(s3) => s3.put(rel, bytes).await,
            Backend::Gcs(g) => g.put(rel, bytes).await,
        }
    }

    /// Delete one object; deleting what is not there is not an error.
    pub async fn delete(&self, rel: &str) -> Result<(), StoreError> {
        match &self.backend {
            Backend::File(f) => f.delete(rel),
            Backend::Http(_) => Err(self.read_only("delete")),
            #[cfg(feature = "aws")]
            Backend::S3(s3) => s3.delete(rel).await,
            Backend::Gcs(g) => g.delete(rel).await,
        }
    }

    /// Write one object from a local file, streamed (never read whole into memory); atomic on
    /// `file://` (temp file + rename); in parts on S3 when larger than the part size.
    pub async fn put_file(&self, rel: &str, source: &Path) -> Result<(), StoreError> {
        match &self.backend {
            Backend::File(f) => f.put_file(rel, source).await,
            Backend::Http(_) => Err(self.read_only("write")),
            #[cfg(feature = "aws")]
            Backend::S3(s3) => s3.put_file(rel, source, self.part_size).await,
            Backend::Gcs(g) => g.put_file(rel, source, self.part_size).await,
        }
    }

    /// Read one object in chunks, handing each to `sink` (never whole in memory); `Ok(None)` when
    /// it does not exist, else the number of bytes read.
    pub async fn read_chunks(&self, rel: &str, mut sink: impl FnMut(&[u8]) -> std::io::Result<()> + Send) -> Result<Option<u64>, StoreError> {
        match &self.backend {
            Backend::File(f) => f.read_chunks(rel, &self.url(rel), &mut sink).await,
            Backend::Http(h) => h.read_chunks(&self.url(rel), &mut sink).await,
            #[cfg(feature = "aws")]
            Backend::S3(s3) => s3.read_chunks(rel, &mut sink).await,
            Backend::Gcs(g) => g.read_chunks(rel, &mut sink).await,
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
            Backend::File(f) => f.list_modified(rel_prefix),
            Backend::Http(_) => Err(self.read_only("list")),
            #[cfg(feature = "aws")]
            Backend::S3(s3) => s3.list_modified(rel_prefix).await,
            Backend::Gcs(g) => g.list_modified(rel_prefix).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// The state store holds every CA key: it is read over plain HTTP only from loopback (or a
    /// host allowed in `KEELSON_ALLOW_PLAIN_HTTP`, which this test does not set).
    #[test]
    fn a_plain_http_store_off_loopback_is_refused() {
        let Err(e) = StateStore::open(&"http://state.example.com/c".parse().expect("base"), Duration::from_secs(1)) else {
            panic!("plain http to another host opened");
        };
        assert!(matches!(e, StoreError::PlainHttp(_)), "{e}");
        assert!(e.to_string().contains("ConfigBase http://state.example.com/c") && e.to_string().contains(crate::plain_http::ALLOW_ENV), "{e}");
        assert!(StateStore::open(&"https://state.example.com/c".parse().expect("base"), Duration::from_secs(1)).is_ok());
    }
}
