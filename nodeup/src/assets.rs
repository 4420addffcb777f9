//! Assets: `<sha256-hex>@<url>[,<mirror-url>…]` entries of a NodeupConfig.
//!
//! Downloads stream through sha256 straight into the cache (one write per byte, at most
//! [`MAX_DOWNLOAD_BYTES`]). An archive is hashed whole *before* anything of it is unpacked — a
//! hostile mirror's bytes are never decompressed — then unpacked into a temp directory, refusing
//! absolute or `..` entries and stopping at [`MAX_UNPACKED_BYTES`] / [`MAX_ARCHIVE_ENTRIES`] (a
//! decompression bomb cannot fill the disk). Nothing is renamed into the cache until the hash
//! matches, so a corrupted mirror leaves no trace. The cache is keyed
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
    #[error("{url}: archive: {source}")]
    Archive {
        url: String,
        #[source]
        source: ArchiveError,
    },
    /// The source sent more than an asset may be (a hostile or broken mirror).
    #[error("{url}: more than {limit} bytes; refusing it")]
    TooLarge { url: String, limit: u64 },
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error("asset {name}: every source failed ({attempts} attempts): {errors}")]
    Exhausted { name: String, attempts: usize, errors: String },
}

/// Why a (verified) archive was not unpacked.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("unpacks to more than {limit} bytes; refusing it")]
    TooLarge { limit: u64 },
    #[error("more than {limit} entries; refusing it")]
    TooManyEntries { limit: usize },
    #[error("entry {entry:?} is an absolute path or climbs out with `..`; refusing the archive")]
    UnsafePath { entry: String },
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
}

/// Most bytes one asset download may be (the largest, kubelet, is ~120 MB).
pub const MAX_DOWNLOAD_BYTES: u64 = 1 << 30;
/// Most bytes one archive may unpack to, every entry counted (containerd's is ~150 MB).
pub const MAX_UNPACKED_BYTES: u64 = 1 << 30;
/// Most entries one archive may hold (cni-plugins has ~25).
pub const MAX_ARCHIVE_ENTRIES: usize = 10_000;

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
        n if tgz && n.starts_with("containerd-") => AssetKind::Archive { prefix: Some("bin/".into()), only: None, dest_dir: crate::paths::BIN_DIR.into() },
        n if tgz && n.starts_with("cni-plugins-") => AssetKind::Archive { prefix: None, only: None, dest_dir: crate::paths::CNI_BIN_DIR.into() },
        n if tgz && n.starts_with("nerdctl-") => AssetKind::Archive { prefix: None, only: Some("nerdctl".into()), dest_dir: crate::paths::BIN_DIR.into() },
        n if tgz && n.starts_with("crictl-") => AssetKind::Archive { prefix: None, only: Some("crictl".into()), dest_dir: crate::paths::BIN_DIR.into() },
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
    /// Most bytes one download may be ([`MAX_DOWNLOAD_BYTES`]).
    pub max_download_bytes: u64,
    /// Most bytes one archive may unpack to ([`MAX_UNPACKED_BYTES`]).
    pub max_unpacked_bytes: u64,
}

impl Default for FetchOptions {
    fn default() -> Self {
        FetchOptions {
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(30),
            rounds: 3,
            backoff: Duration::from_millis(500),
            max_download_bytes: MAX_DOWNLOAD_BYTES,
            max_unpacked_bytes: MAX_UNPACKED_BYTES,
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
        let resp = self.client(url)?.get(url).send().map_err(|source| AssetError::Request { url: url.to_string(), source })?;
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
        let limit = self.opts.max_download_bytes;
        if len.is_some_and(|n| n > limit) {
            return Err(AssetError::TooLarge { url: url.to_string(), limit });
        }
        let mut reader = HashingReader::new(body.take(limit.saturating_add(1)), Progress::new(asset.name(), len));
        match &asset.kind {
            AssetKind::Archive { prefix, only, .. } => {
                // The whole archive lands (hashed) in a private temp file first; it is opened for
                // unpacking only once its sha256 matched.
                let archive = base::fs::temp_path_for(&self.cached_file(&asset.sha256));
                let final_dir = self.cached_dir(&asset.sha256);
                let tmp = base::fs::temp_path_for(&final_dir);
                let result = (|| {
                    self.download_verified(&mut reader, asset, url, &archive, 0o600)?;
                    let mut f = File::open(&archive).map_err(fs_err(&archive))?;
                    unpack(&mut f, &tmp, prefix.as_deref(), only.as_deref(), self.opts.max_unpacked_bytes)
                        .map_err(|source| AssetError::Archive { url: url.to_string(), source })?;
                    fs::rename(&tmp, &final_dir).map_err(fs_err(&final_dir))?;
                    base::fs::sync_dir(dir)?;
                    Ok(())
                })();
                let _ = fs::remove_file(&archive);
                if result.is_err() {
                    let _ = fs::remove_dir_all(&tmp);
                }
                result
            }
            _ => {
                let final_path = self.cached_file(&asset.sha256);
                let tmp = base::fs::temp_path_for(&final_path);
                let result = (|| {
                    self.download_verified(&mut reader, asset, url, &tmp, 0o755)?;
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

    /// Stream `reader` into the new file `path` (created `mode`), then check the sha256 of what
    /// came against the asset's and the size against the download limit. The caller removes
    /// `path` on error.
    fn download_verified<R: Read>(&self, reader: &mut HashingReader<R>, asset: &Asset, url: &str, path: &Path, mode: u32) -> Result<(), AssetError> {
        let io_err = |source: io::Error| AssetError::Io { url: url.to_string(), source };
        let mut f = OpenOptions::new().write(true).create_new(true).mode(mode).open(path).map_err(fs_err(path))?;
        let mut buf = vec![0u8; 256 * 1024];
        let mut total = 0u64;
        loop {
            let n = reader.read(&mut buf).map_err(io_err)?;
            if n == 0 {
                break;
            }
            total += n as u64;
            if total > self.opts.max_download_bytes {
                return Err(AssetError::TooLarge { url: url.to_string(), limit: self.opts.max_download_bytes });
            }
            f.write_all(&buf[..n]).map_err(fs_err(path))?;
        }
        let actual = reader.finish();
        if actual != asset.sha256 {
            return Err(AssetError::HashMismatch { url: url.to_string(), expected: asset.sha256.clone(), actual });
        }
        f.set_permissions(fs::Permissions::from_mode(mode)).map_err(fs_err(path))?;
        f.sync_all().map_err(fs_err(path))?;
        Ok(())
    }
}

/// Whether a tar entry's path stays inside the archive: relative, no `..`.
fn safe_entry_path(path: &Path) -> bool {
    use std::path::Component;
    path.components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}

/// Unpack the selected regular files of a (verified) tar.gz, flattened, into a new directory
/// `dir`. Every entry counts against `limit` bytes (by its header, before anything of it is
/// written) and against [`MAX_ARCHIVE_ENTRIES`]; an absolute or `..` entry refuses the archive.
fn unpack(reader: &mut dyn Read, dir: &Path, prefix: Option<&str>, only: Option<&str>, limit: u64) -> Result<(), ArchiveError> {
    let io_at = |path: &Path| {
        let path = path.display().to_string();
        move |source| ArchiveError::Io { path: path.clone(), source }
    };
    fs::DirBuilder::new().mode(0o755).create(dir).map_err(io_at(dir))?;
    let gz = flate2::read::GzDecoder::new(reader);
    let mut archive = tar::Archive::new(gz);
    let stream = Path::new("<archive>");
    let entries = archive.entries().map_err(io_at(stream))?;
    let mut total = 0u64;
    for (n, entry) in entries.enumerate() {
        if n >= MAX_ARCHIVE_ENTRIES {
            return Err(ArchiveError::TooManyEntries { limit: MAX_ARCHIVE_ENTRIES });
        }
        let mut entry = entry.map_err(io_at(stream))?;
        let path = entry.path().map_err(io_at(stream))?.into_owned();
        if !safe_entry_path(&path) {
            return Err(ArchiveError::UnsafePath { entry: path.to_string_lossy().into_owned() });
        }
        total = total.saturating_add(entry.header().entry_size().map_err(io_at(&path))?);
        if total > limit {
            return Err(ArchiveError::TooLarge { limit });
        }
        if entry.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
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
        let mut out = OpenOptions::new().write(true).create_new(true).mode(mode).open(&target).map_err(io_at(&target))?;
        // Never more than the header said (and counted).
        let size = entry.header().entry_size().map_err(io_at(&path))?;
        io::copy(&mut (&mut entry).take(size), &mut out).map_err(io_at(&path))?;
        out.set_permissions(fs::Permissions::from_mode(mode)).map_err(io_at(&target))?;
        out.sync_all().map_err(io_at(&target))?;
    }
    base::fs::sync_dir(dir).map_err(|e| ArchiveError::Io { path: e.path.display().to_string(), source: e.source })
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

    /// A tar.gz of `entries` (names written as they are: absolute and `..` too, as a hostile
    /// archive would).
    fn tgz(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        let mut b = tar::Builder::new(gz);
        for (name, data) in entries {
            let mut h = tar::Header::new_old();
            h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
            h.set_size(data.len() as u64);
            h.set_mode(0o755);
            h.set_entry_type(tar::EntryType::Regular);
            h.set_cksum();
            b.append(&h, *data).expect("append");
        }
        b.into_inner().expect("tar").finish().expect("gzip")
    }

    struct World {
        _dir: tempfile::TempDir,
        fetcher: Fetcher,
        src: PathBuf,
    }

    fn world(opts: FetchOptions) -> World {
        let dir = tempfile::tempdir().expect("tempdir");
        let fetcher = Fetcher::new(opts, dir.path().join("cache")).expect("fetcher");
        let src = dir.path().join("src");
        fs::create_dir(&src).expect("src");
        World { _dir: dir, fetcher, src }
    }

    impl World {
        /// Serve `bytes` as a containerd archive pinned at `sha256` (its own when `None`).
        fn archive(&self, bytes: &[u8], sha256: Option<&str>) -> Asset {
            let path = self.src.join("containerd-2.3.4-linux-amd64.tar.gz");
            fs::write(&path, bytes).expect("write");
            let sha = sha256.map(str::to_string).unwrap_or_else(|| base::sha256_hex(bytes));
            Asset::parse(&format!("{sha}@file://{}", path.display())).expect("asset")
        }
        fn fetch_once(&self, asset: &Asset) -> Result<(), AssetError> {
            let dir = self.fetcher.cache_dir().join("sha256");
            base::fs::ensure_dir(&dir).expect("cache dir");
            self.fetcher.fetch_once(asset, &asset.urls[0], &dir)
        }
        /// Every file and directory under the cache.
        fn cache_entries(&self) -> Vec<String> {
            let mut out = Vec::new();
            let mut stack = vec![self.fetcher.cache_dir().to_path_buf()];
            while let Some(d) = stack.pop() {
                for e in fs::read_dir(&d).into_iter().flatten().flatten() {
                    let p = e.path();
                    if p.is_dir() {
                        stack.push(p.clone());
                    }
                    out.push(p.strip_prefix(self.fetcher.cache_dir()).map(|r| r.display().to_string()).unwrap_or_default());
                }
            }
            out.sort();
            out
        }
    }

    #[test]
    fn a_verified_archive_unpacks_into_the_cache() {
        let w = world(FetchOptions::default());
        let asset = w.archive(&tgz(&[("bin/containerd", b"daemon"), ("./bin/ctr", b"client"), ("README", b"docs")]), None);
        w.fetch_once(&asset).expect("unpacks");
        let d = w.fetcher.cached_dir(&asset.sha256);
        assert_eq!(fs::read(d.join("containerd")).expect("containerd"), b"daemon");
        assert_eq!(fs::read(d.join("ctr")).expect("ctr"), b"client");
        assert!(!d.join("README").exists(), "outside the prefix");
        // Only the unpacked directory is left: the downloaded archive is gone.
        assert_eq!(
            w.cache_entries(),
            [
                "sha256".to_string(),
                format!("sha256/{}.d", asset.sha256),
                format!("sha256/{}.d/containerd", asset.sha256),
                format!("sha256/{}.d/ctr", asset.sha256)
            ]
        );
    }

    /// A mirror serving a wrong archive, watched while it is still sending: nothing of it is
    /// unpacked before the sha256 is known (a FIFO holds the stream open after the archive's end),
    /// and the mismatch leaves nothing behind.
    #[test]
    fn a_wrong_hash_archive_is_refused_before_anything_is_unpacked() {
        let w = world(FetchOptions { rounds: 1, ..Default::default() });
        let bytes = tgz(&[("bin/containerd", b"a hostile daemon")]);
        let fifo = w.src.join("containerd-2.3.4-linux-amd64.tar.gz");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
        assert!(made.success(), "mkfifo {}", fifo.display());
        let asset = Asset::parse(&format!("{H}@file://{}", fifo.display())).expect("asset");
        let (sent_tx, sent_rx) = std::sync::mpsc::channel();
        let (close_tx, close_rx) = std::sync::mpsc::channel::<()>();
        let writer = std::thread::spawn({
            let fifo = fifo.clone();
            move || {
                let mut f = OpenOptions::new().write(true).open(&fifo).expect("open fifo");
                f.write_all(&bytes).expect("write archive");
                f.flush().expect("flush");
                let _ = sent_tx.send(());
                let _ = close_rx.recv_timeout(Duration::from_secs(30));
            }
        });
        let fetching = std::thread::scope(|scope| {
            let fetch = scope.spawn(|| w.fetcher.fetch(&asset));
            sent_rx.recv_timeout(Duration::from_secs(30)).expect("archive sent");
            // The whole archive is in; give an unpacker every chance to show itself.
            let mut seen = Vec::new();
            for _ in 0..20 {
                std::thread::sleep(Duration::from_millis(50));
                seen = w.cache_entries().into_iter().filter(|e| e.ends_with("containerd")).collect();
                if !seen.is_empty() {
                    break;
                }
            }
            let _ = close_tx.send(());
            (seen, fetch.join().expect("fetch thread"))
        });
        writer.join().expect("writer");
        let (seen, result) = fetching;
        assert_eq!(seen, Vec::<String>::new(), "unpacked before the hash was checked");
        let err = result.expect_err("wrong hash");
        assert!(err.to_string().contains("sha256 mismatch"), "{err}");
        assert_eq!(w.cache_entries(), ["sha256"], "nothing left behind");
    }

    #[test]
    fn a_wrong_hash_archive_leaves_nothing() {
        let w = world(FetchOptions::default());
        let asset = w.archive(&tgz(&[("bin/containerd", b"a hostile daemon")]), Some(H));
        assert!(matches!(w.fetch_once(&asset), Err(AssetError::HashMismatch { .. })));
        assert_eq!(w.cache_entries(), ["sha256"]);
    }

    /// Archives that pass their hash but would fill the disk or climb out are refused, and leave
    /// nothing: over the unpacked-size cap in one entry or in several, absolute or `..` entries.
    #[test]
    fn bombs_and_escaping_entries_are_refused() {
        const CAP: u64 = 1 << 20;
        let zeros = vec![0u8; 4 << 20];
        let half = vec![7u8; 600 << 10];
        type Case<'a> = (&'a str, Vec<(&'a str, &'a [u8])>, fn(&AssetError) -> bool);
        let cases: [Case; 5] = [
            ("one entry of 4 MiB of zeros", vec![("bin/containerd", &zeros)], |e| {
                matches!(e, AssetError::Archive { source: ArchiveError::TooLarge { limit: CAP }, .. })
            }),
            ("entries that add up past the cap, outside the prefix too", vec![("README", &half), ("bin/ctr", &half)], |e| {
                matches!(e, AssetError::Archive { source: ArchiveError::TooLarge { .. }, .. })
            }),
            ("a .. entry", vec![("bin/../../etc/cron.d/x", b"* * * * * root sh")], |e| {
                matches!(e, AssetError::Archive { source: ArchiveError::UnsafePath { .. }, .. })
            }),
            ("a leading .. entry", vec![("../bin/containerd", b"x")], |e| matches!(e, AssetError::Archive { source: ArchiveError::UnsafePath { .. }, .. })),
            ("an absolute entry", vec![("/usr/local/bin/containerd", b"x")], |e| {
                matches!(e, AssetError::Archive { source: ArchiveError::UnsafePath { .. }, .. })
            }),
        ];
        for (what, entries, expected) in cases {
            let w = world(FetchOptions { max_unpacked_bytes: CAP, ..Default::default() });
            let bytes = tgz(&entries);
            assert!((bytes.len() as u64) < CAP, "{what}: the archive itself is small");
            let asset = w.archive(&bytes, None);
            let err = w.fetch_once(&asset).expect_err(what);
            assert!(expected(&err), "{what}: {err:?}");
            assert_eq!(w.cache_entries(), ["sha256"], "{what}: nothing left behind");
        }
    }

    #[test]
    fn a_download_over_the_limit_is_refused() {
        let w = world(FetchOptions { max_download_bytes: 1 << 20, ..Default::default() });
        let big = vec![1u8; (1 << 20) + 1];
        let path = w.src.join("kubelet");
        fs::write(&path, &big).expect("write");
        let asset = Asset::parse(&format!("{}@file://{}", base::sha256_hex(&big), path.display())).expect("asset");
        assert!(matches!(w.fetch_once(&asset), Err(AssetError::TooLarge { limit: 1_048_576, .. })));
        assert_eq!(w.cache_entries(), ["sha256"]);
    }
}
