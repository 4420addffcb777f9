//! Fetching hashes the table does not know: `<download url>.sha256` (then `.sha256sum`) over HTTP(S)
//! or from `file://`, remembered in memory and in an on-disk cache. The `keelson` binary gives a
//! [`HttpFetcher`] to the compile unless `--offline`; the compiler itself never fetches.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::hashes::is_sha256_hex;
use super::VersionsError;

/// Timeout for fetching a published `.sha256` file.
pub const HASH_FETCH_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a hash the table does not know comes from.
pub trait HashFetcher: Send + Sync {
    /// The sha256 (lower-case hex) of the file at `download_url`; `name` and `version` name it in errors.
    fn fetch_sha256(&self, name: &str, version: &str, download_url: &str) -> Result<String, VersionsError>;
}

/// The published `.sha256` files, cached in memory and (with `cache_dir`) on disk.
#[derive(Debug, Clone, Default)]
pub struct HttpFetcher {
    /// Where fetched hashes are cached; see [`default_cache_dir`].
    pub cache_dir: Option<PathBuf>,
}

impl HashFetcher for HttpFetcher {
    fn fetch_sha256(&self, name: &str, version: &str, download_url: &str) -> Result<String, VersionsError> {
        if let Ok(mem) = memory_cache().lock() {
            if let Some(h) = mem.get(download_url) {
                return Ok(h.clone());
            }
        }
        if let Some(dir) = &self.cache_dir {
            if let Ok(text) = std::fs::read_to_string(cache_file(dir, download_url)) {
                let h = text.split_whitespace().next().unwrap_or("").to_ascii_lowercase();
                if is_sha256_hex(&h) {
                    remember(download_url, &h);
                    return Ok(h);
                }
                tracing::warn!("ignoring corrupt sha256 cache entry for {download_url}");
            }
        }
        let h = fetch_sha256(name, version, download_url)?;
        remember(download_url, &h);
        if let Some(dir) = &self.cache_dir {
            if let Err(e) = write_cache(dir, download_url, &h) {
                tracing::warn!("cannot write sha256 cache in {}: {e}", dir.display());
            }
        }
        Ok(h)
    }
}

fn memory_cache() -> &'static Mutex<HashMap<String, String>> {
    static CACHE: OnceLock<Mutex<HashMap<String, String>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Default on-disk cache directory for fetched hashes (`$XDG_CACHE_HOME/keelson/sha256`, else
/// `$HOME/.cache/keelson/sha256`), for the `keelson` binary to give [`HttpFetcher`].
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(x).join("keelson").join("sha256"));
    }
    std::env::var_os("HOME").filter(|v| !v.is_empty()).map(|h| PathBuf::from(h).join(".cache").join("keelson").join("sha256"))
}

pub(super) fn cache_file(dir: &Path, download_url: &str) -> PathBuf {
    let key = hex::encode(Sha256::digest(download_url.as_bytes()));
    dir.join(format!("{key}.sha256"))
}

fn remember(download_url: &str, h: &str) {
    if let Ok(mut mem) = memory_cache().lock() {
        mem.insert(download_url.to_string(), h.to_string());
    }
}

fn write_cache(dir: &Path, download_url: &str, h: &str) -> Result<(), base::fs::FsError> {
    base::fs::write_atomic(&cache_file(dir, download_url), format!("{h}  {download_url}\n").as_bytes(), 0o644, None)
}

fn fetch_sha256(name: &str, version: &str, download_url: &str) -> Result<String, VersionsError> {
    let fetch_err = |reason: String| VersionsError::HashFetch { file: name.to_string(), version: version.to_string(), url: download_url.to_string(), reason };
    let mut failures = Vec::new();
    let client = if download_url.starts_with("https://") || download_url.starts_with("http://") {
        Some(
            reqwest::blocking::Client::builder()
                .timeout(HASH_FETCH_TIMEOUT)
                .connect_timeout(Duration::from_secs(10))
                .user_agent(concat!("keelson/", env!("CARGO_PKG_VERSION")))
                .build()
                .map_err(|e| fetch_err(format!("building HTTP client: {e}")))?,
        )
    } else {
        None
    };
    for ext in [".sha256", ".sha256sum"] {
        let hash_url = format!("{download_url}{ext}");
        let body = if let Some(local) = hash_url.strip_prefix("file://") {
            std::fs::read_to_string(local).map_err(|e| e.to_string())
        } else if let Some(client) = &client {
            fetch_text(client, &hash_url)
        } else {
            Err("only http(s):// and file:// URLs can be fetched".to_string())
        };
        match body {
            Ok(text) => {
                let Some(first) = text.split_whitespace().next() else {
                    failures.push(format!("{hash_url}: empty hash file"));
                    continue;
                };
                let h = first.to_ascii_lowercase();
                if !is_sha256_hex(&h) {
                    return Err(VersionsError::InvalidHash {
                        file: name.to_string(),
                        version: version.to_string(),
                        url: download_url.to_string(),
                        value: first.chars().take(80).collect(),
                        source_desc: hash_url,
                    });
                }
                tracing::debug!("fetched sha256 {h} for {download_url} from {hash_url}");
                return Ok(h);
            }
            Err(e) => failures.push(format!("{hash_url}: {e}")),
        }
    }
    Err(fetch_err(failures.join("; ")))
}

fn fetch_text(client: &reqwest::blocking::Client, url: &str) -> Result<String, String> {
    let mut last = String::new();
    for attempt in 0..2u32 {
        if attempt > 0 {
            std::thread::sleep(Duration::from_millis(500));
        }
        match client.get(url).send() {
            Ok(resp) if resp.status().is_success() => {
                return resp.text().map_err(|e| format!("reading body: {e}"));
            }
            Ok(resp) if resp.status().is_client_error() => {
                return Err(format!("HTTP {}", resp.status()));
            }
            Ok(resp) => last = format!("HTTP {}", resp.status()),
            Err(e) => last = e.to_string(),
        }
    }
    Err(last)
}
