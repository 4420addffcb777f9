//! Mirror rewriting: `assets.fileRepository` for file URLs, `assets.containerRegistry` and
//! `assets.containerProxy` for images (kOps `pkg/assets/builder.go`).

use std::fmt;

use super::VersionsError;

/// Rewrite an asset URL for `assets.fileRepository` (kOps `AssetBuilder.RemapFile`):
/// the repository URL keeps its scheme/host/query and its path becomes
/// `path.Join(repo.path, canonical.path)`; commas are escaped as `%2C`. When the rewritten
/// URL has the same host as the canonical one the canonical URL is kept (kOps behaviour).
pub fn remap_file_url(canonical_url: &str, file_repository: Option<&str>) -> Result<String, VersionsError> {
    let Some(repo) = file_repository else {
        return Ok(canonical_url.to_string());
    };
    if repo.is_empty() {
        return Err(VersionsError::InvalidFileRepository {
            file_repository: repo.to_string(),
            url: canonical_url.to_string(),
            reason: "assets.fileRepository must be set to remap assets".to_string(),
        });
    }
    let canonical = SimpleUrl::parse(canonical_url);
    let repo_url = SimpleUrl::parse(repo);
    if repo_url.host.contains(' ') || repo_url.scheme.as_deref().is_some_and(|s| s.is_empty()) {
        return Err(VersionsError::InvalidFileRepository {
            file_repository: repo.to_string(),
            url: canonical_url.to_string(),
            reason: "not a valid URL".to_string(),
        });
    }
    let joined = path_join(&repo_url.path, &canonical.path).replace(',', "%2C");
    let remapped = SimpleUrl { path: joined, ..repo_url };
    if remapped.host == canonical.host {
        return Ok(canonical_url.to_string());
    }
    Ok(remapped.to_string())
}

pub use keelson_api::image::remap_image;

#[derive(Debug, Clone, PartialEq, Eq)]
struct SimpleUrl {
    /// `None` for scheme-less (relative) references.
    scheme: Option<String>,
    host: String,
    path: String,
    /// Including the leading `?`/`#`, or empty.
    suffix: String,
}

impl SimpleUrl {
    fn parse(s: &str) -> SimpleUrl {
        let (before_suffix, suffix) = match s.find(['?', '#']) {
            Some(i) => (&s[..i], s[i..].to_string()),
            None => (s, String::new()),
        };
        match before_suffix.split_once("://") {
            Some((scheme, rest)) => {
                let (host, path) = match rest.find('/') {
                    Some(i) => (&rest[..i], &rest[i..]),
                    None => (rest, ""),
                };
                SimpleUrl { scheme: Some(scheme.to_string()), host: host.to_string(), path: path.to_string(), suffix }
            }
            None => SimpleUrl { scheme: None, host: String::new(), path: before_suffix.to_string(), suffix },
        }
    }
}

impl fmt::Display for SimpleUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(scheme) = &self.scheme {
            write!(f, "{scheme}://{}", self.host)?;
        }
        write!(f, "{}{}", self.path, self.suffix)
    }
}

/// Go `path.Join(a, b)`: join non-empty elements with `/` and `path.Clean` the result.
pub(super) fn path_join(a: &str, b: &str) -> String {
    let parts: Vec<&str> = [a, b].into_iter().filter(|p| !p.is_empty()).collect();
    if parts.is_empty() {
        return String::new();
    }
    path_clean(&parts.join("/"))
}

/// Go `path.Clean`.
pub(super) fn path_clean(p: &str) -> String {
    if p.is_empty() {
        return ".".to_string();
    }
    let rooted = p.starts_with('/');
    let mut out: Vec<&str> = Vec::new();
    for seg in p.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                if out.last().is_some_and(|l| *l != "..") {
                    out.pop();
                } else if !rooted {
                    out.push("..");
                }
            }
            s => out.push(s),
        }
    }
    let joined = out.join("/");
    match (rooted, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".to_string(),
        (false, false) => joined,
    }
}
