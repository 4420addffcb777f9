//! Assets: `<sha256-hex>@<url>[,<mirror-url>…]` entries of a NodeupConfig.
//!
//! Downloads stream through sha256 straight into the cache (one write per byte); archives are
//! decompressed and unpacked in the same pass into a temp directory. Nothing is renamed into
//! the cache until the hash matches, so a corrupted mirror leaves no trace. The cache is keyed
//! by hash (`<cache>/sha256/<hex>` for files, `<hex>.d/` for unpacked archives); installed files
//! are hard links to cache entries, so a rerun checks inodes and downloads nothing.

use std::fs::{self, File, OpenOptions};
use std::io::{self, IsTerminal as _, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};

use base::fs::{fs_err, FsError};

/// Why an asset could not be fetched or installed.
#[derive(Debug, thiserror::Error)]
pub enum AssetError {
    #[error(transparent)]
    Parse(#[from] base::AssetRefError),
    #[error("{url}: sha256 mismatch: expected {expected}, got {actual}")]
    HashMismatch { url: String, expected: String, actual: String },
    #[error("{url}: {message}")]
    Http { url: String, message: String },
    #[error("{url}: {source}")]
    Io {
        url: String,
        #[source]
        source: io::Error,
    },
    #[error("{url}")]
    Request {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// The server answered with a non-success status (a value, so callers can tell 404 apart).
    #[error("{url}: HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("{url}: archive: {message}")]
    Archive { url: String, message: String },
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error("asset {name}: every source failed ({attempts} attempts): {errors}")]
    Exhausted { name: String, attempts: usize, errors: String },
}

/// What an asset is, recognised by its file name as kOps does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AssetKind {
    /// A single executable installed at an absolute host path.
    Binary { dest: String },
    /// A tar.gz whose selected files (`prefix` filter, flattened) go into `dest_dir`.
    Archive { prefix: Option<String>, only: Option<String>, dest_dir: String },
    /// Unknown to nodeup: downloaded into the cache only.
    Other,
}

/// One asset entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Asset {
    pub sha256: String,
    pub urls: Vec<String>,
    /// The file name of the first URL.
    pub file_name: String,
    pub kind: AssetKind,
}

impl Asset {
    /// Parse `<sha256-hex>@<url>[,<url>…]` ([`base::AssetRef`]) and recognise what it is.
    pub fn parse(spec: &str) -> Result<Asset, AssetError> {
        let asset: base::AssetRef = spec.parse()?;
        let file_name = asset.file_name().to_string();
        let kind = classify(&file_name);
        Ok(Asset { sha256: asset.sha256, urls: asset.urls, file_name, kind })
    }

    /// A short name for messages (`kubelet`, `containerd-2.3.4-linux-amd64.tar.gz`).
    pub fn name(&self) -> &str {
        &self.file_name
    }

    pub fn is_archive(&self) -> bool {
        matches!(self.kind, AssetKind::Archive { .. })
    }
}

/// Recognise an asset by its file name (kOps `nodeup/pkg/model` conventions).
pub fn classify(file_name: &str) -> AssetKind {
    let bin = |dest: &str| AssetKind::Binary { dest: dest.to_string() };
    let tgz = file_name.ends_with(".tar.gz") || file_name.ends_with(".tgz");
    match file_name {
        "kubelet" => bin(crate::paths::KUBELET_BIN),
        "kubectl" => bin(crate::paths::KUBECTL_BIN),
        "protokube" => bin(crate::paths::PROTOKUBE_BIN),
        n if n.starts_with("protokube-linux-") => bin(crate::paths::PROTOKUBE_BIN),
        n if n.starts_with("runc.") => bin(crate::paths::RUNC_BIN),
        n if n.starts_with("ecr-credential-provider") => bin(crate::paths::ECR_CREDENTIAL_PROVIDER_BIN),
        n if tgz && n.starts_with("containerd-") => {
            AssetKind::Archive { prefix: Some("bin/".into()), only: None, dest_dir: crate::paths::BIN_DIR.into() }
        }
        n if tgz && n.starts_with("cni-plugins-") => {
            AssetKind::Archive { prefix: None, only: None, dest_dir: crate::paths::CNI_BIN_DIR.into() }
        }
        n if tgz && n.starts_with("nerdctl-") => {
            AssetKind::Archive { prefix: None, only: Some("nerdctl".into()), dest_dir: crate::paths::BIN_DIR.into() }
        }
        n if tgz && n.starts_with("crictl-") => {
            AssetKind::Archive { prefix: None, only: Some("crictl".into()), dest_dir: crate::paths::BIN_DIR.into() }
        }
        _ => AssetKind::Other,
    }
}

/// The NodeupConfig architecture name of this machine.
pub fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "aarch64" => "arm64",
        _ => "amd64",
    }
}

/// Download behaviour (bounded everywhere).
#[derive(Debug, Clone)]
pub struct FetchOptions {
    /// Connect timeout per request.
    pub connect_timeout: Duration,
    /// Inactivity timeout per read (a hung mirror fails after this).
    pub read_timeout: Duration,
    /// Rounds over the URL list before giving up.
    pub rounds: u32,
    /// Backoff before the second round; doubles each round.
    pub backoff: Duration,
}

impl Default for FetchOptions {
    fn default() -> Self {
        FetchOptions {
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(30),
            rounds: 3,
            backoff: Duration::from_millis(500),
        }
    }
}

/// Fetches assets and small documents; owns the hash-keyed cache.
pub struct Fetcher {
    opts: FetchOptions,
    cache_dir: PathBuf,
    client: OnceLock<Result<reqwest::blocking::Client, String>>,
}

impl Fetcher {
    pub fn new(opts: FetchOptions, cache_dir: PathBuf) -> Result<Fetcher, AssetError> {
        Ok(Fetcher { opts, cache_dir, client: OnceLock::new() })
    }

    pub fn cache_dir(&self) -> &Path {
        &self.cache_dir
    }

    fn client(&self, url: &str) -> Result<&reqwest::blocking::Client, AssetError> {
        self.client
            .get_or_init(|| {
                reqwest::blocking::Client::builder()
                    .connect_timeout(self.opts.connect_timeout)
                    .timeout(self.opts.read_timeout)
                    .build()
                    .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|m| AssetError::Http { url: url.to_string(), message: format!("HTTP client: {m}") })
    }

    /// Where a verified file asset lives in the cache.
    pub fn cached_file(&self, sha256: &str) -> PathBuf {
        self.cache_dir.join("sha256").join(sha256)
    }

    /// Where a verified, unpacked archive lives in the cache.
    pub fn cached_dir(&self, sha256: &str) -> PathBuf {
        self.cache_dir.join("sha256").join(format!("{sha256}.d"))
    }

    /// Whether the asset is already in the cache (entries exist only once verified).
    pub fn is_cached(&self, asset: &Asset) -> bool {
        if asset.is_archive() {
            self.cached_dir(&asset.sha256).is_dir()
        } else {
            self.cached_file(&asset.sha256).is_file()
        }
    }

    /// Download (with failover and bounded retries) into the cache, unless already there.
    pub fn fetch(&self, asset: &Asset) -> Result<(), AssetError> {
        if self.is_cached(asset) {
            return Ok(());
        }
        let dir = self.cache_dir.join("sha256");
        base::fs::ensure_dir(&dir)?;
        let mut errors = Vec::new();
        let mut attempts = 0;
        let mut backoff = self.opts.backoff;
        for round in 0..self.opts.rounds.max(1) {
            if round > 0 {
                std::thread::sleep(backoff);
                backoff = backoff.saturating_mul(2);
            }
            for url in &asset.urls {
                attempts += 1;
                match self.fetch_once(asset, url, &dir) {
                    Ok(()) => return Ok(()),
                    Err(e) => {
                        tracing::warn!("asset {}: {}", asset.name(), crate::tasks::error_chain(&e));
                        errors.push(crate::tasks::error_chain(&e));
                    }
                }
            }
        }
        errors.dedup();
        Err(AssetError::Exhausted { name: asset.name().to_string(), attempts, errors: errors.join("; ") })
    }

    /// Open a URL for streaming (`http(s)://` or `file://`).
    pub fn open(&self, url: &str) -> Result<(Box<dyn Read + Send>, Option<u64>), AssetError> {
        if let Some(path) = url.strip_prefix("file://") {
            let f = File::open(path).map_err(|source| AssetError::Io { url: url.to_string(), source })?;
            let len = f.metadata().ok().map(|m| m.len());
            return Ok((Box::new(f), len));
        }
        let resp = self
            .client(url)?
            .get(url)
            .send()
            .map_err(|source| AssetError::Request { url: url.to_string(), source })?;
        if !resp.status().is_success() {
            return Err(AssetError::Status { url: url.to_string(), status: resp.status().as_u16() });
        }
        let len = resp.content_length();
        Ok((Box::new(resp), len))
    }

    /// Read a whole (small) document.
    pub fn get_bytes(&self, url: &str) -> Result<Vec<u8>, AssetError> {
        let (mut r, _) = self.open(url)?;
        let mut buf = Vec::new();
        r.read_to_end(&mut buf).map_err(|source| AssetError::Io { url: url.to_string(), source })?;
        Ok(buf)
    }

    fn fetch_once(&self, asset: &Asset, url: &str, dir: &Path) -> Result<(), AssetError> {
        let (body, len) = self.open(url)?;
        let mut reader = HashingReader::new(body, Progress::new(asset.name(), len));
        let io_err = |source: io::Error| AssetError::Io { url: url.to_string(), source };
        match &asset.kind {
            AssetKind::Archive { prefix, only, .. } => {
                let final_dir = self.cached_dir(&asset.sha256);
                let tmp = base::fs::temp_path_for(&final_dir);
                let unpacked = unpack(&mut reader, &tmp, prefix.as_deref(), only.as_deref());
                // Hash the whole stream even when unpacking stopped early (a corrupt archive is
                // reported as the hash mismatch it is).
                let drained = io::copy(&mut reader, &mut io::sink());
                let actual = reader.finish();
                if actual != asset.sha256 {
                    let _ = fs::remove_dir_all(&tmp);
                    return Err(AssetError::HashMismatch { url: url.to_string(), expected: asset.sha256.clone(), actual });
                }
                let finish = (|| {
                    drained.map_err(io_err)?;
                    unpacked.map_err(|message| AssetError::Archive { url: url.to_string(), message })?;
                    fs::rename(&tmp, &final_dir).map_err(fs_err(&final_dir))?;
                    base::fs::sync_dir(dir)?;
                    Ok(())
                })();
                if finish.is_err() {
                    let _ = fs::remove_dir_all(&tmp);
                }
                finish
            }
            _ => {
                let final_path = self.cached_file(&asset.sha256);
                let tmp = base::fs::temp_path_for(&final_path);
                let result = (|| {
                    let mut f = OpenOptions::new().write(true).create_new(true).mode(0o755).open(&tmp).map_err(fs_err(&tmp))?;
                    let mut buf = vec![0u8; 256 * 1024];
                    loop {
                        let n = reader.read(&mut buf).map_err(io_err)?;
                        if n == 0 {
                            break;
                        }
                        f.write_all(&buf[..n]).map_err(fs_err(&tmp))?;
                    }
                    let actual = reader.finish();
                    if actual != asset.sha256 {
                        return Err(AssetError::HashMismatch { url: url.to_string(), expected: asset.sha256.clone(), actual });
                    }
                    f.set_permissions(fs::Permissions::from_mode(0o755)).map_err(fs_err(&tmp))?;
                    f.sync_all().map_err(fs_err(&tmp))?;
                    fs::rename(&tmp, &final_path).map_err(fs_err(&final_path))?;
                    base::fs::sync_dir(dir)?;
                    Ok(())
                })();
                if result.is_err() {
                    let _ = fs::remove_file(&tmp);
                }
                result
            }
        }
    }
}

/// Unpack the selected regular files of a tar.gz stream, flattened, into a new directory `dir`.
fn unpack(reader: &mut dyn Read, dir: &Path, prefix: Option<&str>, only: Option<&str>) -> Result<(), String> {
    fs::DirBuilder::new().mode(0o755).create(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let gz = flate2::read::GzDecoder::new(reader);
    let mut archive = tar::Archive::new(gz);
    let entries = archive.entries().map_err(|e| e.to_string())?;
    for entry in entries {
        let mut entry = entry.map_err(|e| e.to_string())?;
        if entry.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
        let path = entry.path().map_err(|e| e.to_string())?.into_owned();
        let rel = path.to_string_lossy().trim_start_matches("./").to_string();
        if let Some(p) = prefix {
            if !rel.starts_with(p) {
                continue;
            }
        }
        let Some(base) = Path::new(&rel).file_name().map(|b| b.to_string_lossy().into_owned()) else { continue };
        if base.starts_with('.') || only.is_some_and(|o| o != base) {
            continue;
        }
        let mode = entry.header().mode().unwrap_or(0o755) & 0o777;
        let target = dir.join(&base);
        let mut out = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&target)
            .map_err(|e| format!("{}: {e}", target.display()))?;
        io::copy(&mut entry, &mut out).map_err(|e| format!("{rel}: {e}"))?;
        out.set_permissions(fs::Permissions::from_mode(mode)).map_err(|e| e.to_string())?;
        out.sync_all().map_err(|e| e.to_string())?;
    }
    base::fs::sync_dir(dir).map_err(|e| e.to_string())
}

/// Passes bytes through while hashing them (and reporting progress on a terminal).
struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    progress: Progress,
}

impl<R: Read> HashingReader<R> {
    fn new(inner: R, progress: Progress) -> Self {
        HashingReader { inner, hasher: Sha256::new(), progress }
    }
    fn finish(&mut self) -> String {
        self.progress.done();
        hex::encode(std::mem::take(&mut self.hasher).finalize())
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.progress.add(n as u64);
        Ok(n)
    }
}

/// A progress line on stderr for long downloads, only when stderr is a terminal.
struct Progress {
    name: String,
    total: Option<u64>,
    seen: u64,
    last: Instant,
    enabled: bool,
    shown: bool,
}

impl Progress {
    fn new(name: &str, total: Option<u64>) -> Progress {
        Progress { name: name.to_string(), total, seen: 0, last: Instant::now(), enabled: io::stderr().is_terminal(), shown: false }
    }
    fn add(&mut self, n: u64) {
        self.seen += n;
        if self.enabled && self.last.elapsed() >= Duration::from_secs(1) {
            self.last = Instant::now();
            self.shown = true;
            match self.total {
                Some(t) if t > 0 => eprint!("\r{}: {}% of {} MiB ", self.name, self.seen * 100 / t, t >> 20),
                _ => eprint!("\r{}: {} MiB ", self.name, self.seen >> 20),
            }
        }
    }
    fn done(&mut self) {
        if self.shown {
            eprintln!("\r{}: done ({} MiB)   ", self.name, self.seen >> 20);
            self.shown = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: &str = "e48cbb9c62351aa95f455bdae3c9a9e9d7d644027c231ade7a67b868b2be3258";

    #[test]
    fn parse_and_classify() {
        let a = Asset::parse(&format!("{H}@https://dl.k8s.io/v1/bin/linux/amd64/kubelet,http://mirror/kubelet")).expect("parse");
        assert_eq!(a.urls.len(), 2);
        assert_eq!(a.kind, AssetKind::Binary { dest: "/usr/local/bin/kubelet".into() });
        for (name, archive) in [
            ("containerd-2.3.4-linux-amd64.tar.gz", true),
            ("cni-plugins-linux-amd64-v1.8.0.tgz", true),
            ("runc.amd64", false),
            ("ecr-credential-provider-linux-amd64", false),
        ] {
            let k = classify(name);
            assert_eq!(matches!(k, AssetKind::Archive { .. }), archive, "{name}");
            assert_ne!(k, AssetKind::Other, "{name}");
        }
        assert_eq!(classify("README.md"), AssetKind::Other);
        for bad in ["nohash", "abc@http://x/y", &format!("{H}@ftp://x/y"), &format!("{H}@"), &format!("{H}@http://x/")] {
            assert!(Asset::parse(bad).is_err(), "{bad}");
        }
    }
}
