//! Asset hashes: the built-in table (`hashes.tsv`, kOps' `assetdata`), the `--asset-hashes` files
//! that win over it, and the lookup order. Fetching unknown hashes is behind
//! [`HashFetcher`](super::HashFetcher): the lookup itself does no I/O.

use std::collections::HashMap;
use std::path::Path;
use std::sync::OnceLock;

use keelson_api::KubernetesVersion;

use super::table::kubernetes_binary_url;
use super::{Arch, LookupOptions, VersionsError};

/// The table of well-known hashes: `<canonical URL>\t<sha256>` lines, `#` comments.
pub(super) const HASH_TABLE_TSV: &str = include_str!("hashes.tsv");

/// One row of the well-known hash table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashRow {
    pub url: &'static str,
    pub sha256: &'static str,
}

/// One line of a hash file (the built-in table or an `--asset-hashes` file): `<url><whitespace><sha256>`.
/// `Ok(None)` for blank lines and `#` comments.
fn parse_hash_line(line: &str) -> Result<Option<(&str, &str)>, String> {
    let trimmed = line.trim();
    if trimmed.is_empty() || trimmed.starts_with('#') {
        return Ok(None);
    }
    let mut fields = trimmed.split_whitespace();
    let (Some(url), Some(sha), None) = (fields.next(), fields.next(), fields.next()) else {
        return Err(format!("expected `<url> <sha256>`: {trimmed:?}"));
    };
    if !(url.starts_with("https://") || url.starts_with("http://")) {
        return Err(format!("not an http(s) URL: {url:?}"));
    }
    if !is_sha256_hex(&sha.to_ascii_lowercase()) {
        return Err(format!("invalid sha256 {sha:?} for {url}"));
    }
    Ok(Some((url, sha)))
}

/// Parse the TSV table. Never panics: malformed lines are returned as errors (`line: message`).
pub(super) fn parse_hash_table(text: &'static str) -> (Vec<HashRow>, Vec<String>) {
    let mut rows = Vec::new();
    let mut errors = Vec::new();
    for (i, line) in text.lines().enumerate() {
        match parse_hash_line(line) {
            Ok(Some((url, sha256))) if is_sha256_hex(sha256) => rows.push(HashRow { url, sha256 }),
            Ok(Some((url, sha256))) => errors.push(format!("line {}: sha256 {sha256:?} for {url} is not lower-case", i + 1)),
            Ok(None) => {}
            Err(e) => errors.push(format!("line {}: {e}", i + 1)),
        }
    }
    (rows, errors)
}

struct HashTable {
    rows: Vec<HashRow>,
    by_url: HashMap<&'static str, &'static str>,
    errors: Vec<String>,
}

fn hash_table() -> &'static HashTable {
    static TABLE: OnceLock<HashTable> = OnceLock::new();
    TABLE.get_or_init(|| {
        let (rows, mut errors) = parse_hash_table(HASH_TABLE_TSV);
        let mut by_url = HashMap::with_capacity(rows.len());
        for r in &rows {
            if let Some(prev) = by_url.insert(r.url, r.sha256) {
                if prev != r.sha256 {
                    errors.push(format!("conflicting hashes for {}", r.url));
                }
            }
        }
        for e in &errors {
            tracing::warn!("versions table: {e}");
        }
        HashTable { rows, by_url, errors }
    })
}

/// All rows of the built-in table.
pub fn hash_table_rows() -> &'static [HashRow] {
    &hash_table().rows
}

/// Problems found while parsing the built-in table (empty when the table is well-formed).
pub fn hash_table_errors() -> &'static [String] {
    &hash_table().errors
}

/// The well-known sha256 for a canonical asset URL, if in the table.
pub fn known_sha256(canonical_url: &str) -> Option<&'static str> {
    hash_table().by_url.get(canonical_url).copied()
}

/// Kubernetes versions whose kubelet/kubectl hashes (amd64 and arm64) are all in the table,
/// sorted by semver core then string.
pub fn known_kubernetes_versions() -> Vec<String> {
    let mut versions: Vec<String> = hash_table()
        .rows
        .iter()
        .filter_map(|r| {
            let rest = r.url.strip_prefix("https://dl.k8s.io/release/v")?;
            let (ver, file) = rest.split_once('/')?;
            (file == "bin/linux/amd64/kubelet").then(|| ver.to_string())
        })
        .filter(|v| Arch::ALL.iter().all(|a| ["kubelet", "kubectl"].iter().all(|b| known_sha256(&kubernetes_binary_url(v, *a, b)).is_some())))
        .collect();
    versions.sort_by_key(|v| {
        let parsed = v.parse::<KubernetesVersion>().ok();
        (parsed.as_ref().map(|s| (s.major, s.minor, s.patch)), parsed.and_then(|s| s.pre).is_none(), v.clone())
    });
    versions.dedup();
    versions
}

pub(super) fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Read an asset-hashes file: `<url><whitespace><sha256>` lines (the format of
/// `versions/hashes.tsv`), `#` comments and blank lines ignored. Every other line is an error that
/// names the file and line.
pub fn read_asset_hashes(path: &Path) -> Result<std::collections::BTreeMap<String, String>, VersionsError> {
    let text = std::fs::read_to_string(path).map_err(|e| VersionsError::AssetHashesFile { path: path.to_path_buf(), line: 0, reason: e.to_string() })?;
    parse_asset_hashes(&text).map_err(|(line, reason)| VersionsError::AssetHashesFile { path: path.to_path_buf(), line, reason })
}

/// Parse the text of an asset-hashes file; `Err((line number, what is wrong))`.
pub fn parse_asset_hashes(text: &str) -> Result<std::collections::BTreeMap<String, String>, (usize, String)> {
    let mut out = std::collections::BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        if let Some((url, sha)) = parse_hash_line(line).map_err(|e| (i + 1, e))? {
            out.insert(url.to_string(), sha.to_ascii_lowercase());
        }
    }
    Ok(out)
}

/// The hash given for an asset in [`LookupOptions::asset_hashes`], by canonical or download URL.
pub fn hash_override(canonical_url: &str, download_url: &str, opts: &LookupOptions) -> Option<String> {
    opts.asset_hashes.get(download_url).or_else(|| opts.asset_hashes.get(canonical_url)).cloned()
}

/// Find the sha256 of an asset, kOps-style: [`hash_override`], then the well-known table keyed by
/// canonical URL, otherwise the published `<canonical url>.sha256` / `.sha256sum` through the
/// options' [`Fetcher`](super::Fetcher) — none given, an unknown hash is an error and nothing is fetched.
/// Never from the file repository (`download_url`): a hash that comes from the mirror that serves
/// the file would only prove that the mirror agrees with itself. An air-gapped site gives the
/// hashes it trusts with `--asset-hashes`.
pub fn lookup_sha256(name: &str, version: &str, canonical_url: &str, download_url: &str, opts: &LookupOptions) -> Result<String, VersionsError> {
    if let Some(h) = hash_override(canonical_url, download_url, opts) {
        return Ok(h);
    }
    if let Some(h) = known_sha256(canonical_url) {
        return Ok(h.to_string());
    }
    match &opts.fetcher {
        Some(fetcher) => fetcher.0.fetch_sha256(name, version, canonical_url),
        None => Err(VersionsError::HashUnknownOffline { file: name.to_string(), version: version.to_string(), url: canonical_url.to_string() }),
    }
}
