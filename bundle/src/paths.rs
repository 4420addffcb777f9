//! Where things go. A file's place in a mirror or a repository is never computed here: it is the
//! compiler's `assets.fileRepository` rewrite ([`remap_file_url`]) of its canonical URL, so `push`
//! writes each file exactly where a spec with that `fileRepository` makes nodes download it. An
//! image's place in a registry is likewise the compiler's `assets.containerRegistry` rewrite
//! ([`remap_image`]).

use spec_compiler::versions::{remap_file_url, remap_image};

use crate::manifest::FILES_DIR;

/// Why a place could not be worked out.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    #[error("{url}: not an absolute http(s) URL with a host and a path")]
    NotAUrl { url: String },
    #[error("{url}: {source}")]
    Rewrite {
        url: String,
        #[source]
        source: Box<spec_compiler::versions::VersionsError>,
    },
    #[error("{url}: the repository {repository} has the URL's own host, so the compiler keeps the URL unchanged: use a repository on another host")]
    SameHost { url: String, repository: String },
}

/// A file's path inside the bundle: `files/<host>/<path>` of its canonical URL.
pub fn bundle_path(canonical_url: &str) -> Result<String, PathError> {
    let bad = || PathError::NotAUrl { url: canonical_url.to_string() };
    let rest = canonical_url.strip_prefix("https://").or_else(|| canonical_url.strip_prefix("http://")).ok_or_else(bad)?;
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let (host, path) = rest.split_once('/').ok_or_else(bad)?;
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    if host.is_empty() || segments.is_empty() || segments.iter().any(|s| *s == "." || *s == "..") {
        return Err(bad());
    }
    let host = host.replace(':', "_");
    Ok(format!("{FILES_DIR}/{host}/{}", segments.join("/")))
}

/// Whether `path` is a plain relative path under `files/` (what [`bundle_path`] makes).
pub fn is_bundle_file_path(path: &str) -> bool {
    path.strip_prefix(FILES_DIR)
        .and_then(|p| p.strip_prefix('/'))
        .is_some_and(|p| !p.is_empty() && p.split('/').all(|s| !s.is_empty() && s != "." && s != ".."))
}

/// Where `create` downloads a file from: under `from_mirror` as the compiler's rewrite places it,
/// else its canonical URL.
pub fn source_url(canonical_url: &str, from_mirror: Option<&str>) -> Result<String, PathError> {
    remap_file_url(canonical_url, from_mirror).map_err(|source| PathError::Rewrite { url: canonical_url.to_string(), source: Box::new(source) })
}

/// The key of a file in the repository `repository` (`file:///srv/assets`, `gs://bucket/prefix`):
/// the compiler's rewrite of the canonical URL under it, relative to it.
pub fn repository_key(canonical_url: &str, repository: &str) -> Result<String, PathError> {
    let remapped =
        remap_file_url(canonical_url, Some(repository)).map_err(|source| PathError::Rewrite { url: canonical_url.to_string(), source: Box::new(source) })?;
    let base = repository.trim_end_matches('/');
    match remapped.strip_prefix(base) {
        Some(rest) if rest.starts_with('/') && rest.len() > 1 => Ok(rest.trim_start_matches('/').to_string()),
        _ => Err(PathError::SameHost { url: canonical_url.to_string(), repository: repository.to_string() }),
    }
}

/// Where an image is in `registry` (`HOST[:PORT]`): the compiler's `assets.containerRegistry`
/// rewrite of its reference.
pub fn registry_reference(reference: &str, registry: &str) -> String {
    remap_image(reference, Some(registry.trim_end_matches('/')), None)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBELET: &str = "https://dl.k8s.io/release/v1.34.4/bin/linux/amd64/kubelet";

    #[test]
    fn bundle_paths_keep_host_and_path() {
        assert_eq!(bundle_path(KUBELET).expect("path"), "files/dl.k8s.io/release/v1.34.4/bin/linux/amd64/kubelet");
        assert_eq!(bundle_path("http://127.0.0.1:8080/a//b?x=1").expect("path"), "files/127.0.0.1_8080/a/b");
        for bad in ["ftp://h/x", "https://h", "https://h/", "https:///x", "https://h/../x"] {
            assert!(bundle_path(bad).is_err(), "{bad}");
        }
        assert!(is_bundle_file_path("files/dl.k8s.io/x"));
        for bad in ["files/", "files", "other/x", "files/a/../../x", "files//x", "/files/x"] {
            assert!(!is_bundle_file_path(bad), "{bad}");
        }
    }

    #[test]
    fn mirror_and_repository_places_are_the_compilers_rewrite() {
        assert_eq!(source_url(KUBELET, None).expect("url"), KUBELET);
        let mirror = "http://10.0.0.1:8080/mirror/";
        let via_mirror = source_url(KUBELET, Some(mirror)).expect("url");
        assert_eq!(via_mirror, remap_file_url(KUBELET, Some(mirror)).expect("compiler"));
        assert_eq!(via_mirror, "http://10.0.0.1:8080/mirror/release/v1.34.4/bin/linux/amd64/kubelet");
        for repo in ["file:///srv/assets", "file:///srv/assets/", "gs://bucket/p", "s3://bucket"] {
            let key = repository_key(KUBELET, repo).expect("key");
            assert_eq!(key, "release/v1.34.4/bin/linux/amd64/kubelet", "{repo}");
            assert_eq!(remap_file_url(KUBELET, Some(repo)).expect("compiler"), format!("{}/{key}", repo.trim_end_matches('/')));
        }
        assert!(matches!(repository_key(KUBELET, "https://dl.k8s.io/mirror"), Err(PathError::SameHost { .. })));
    }

    #[test]
    fn registry_places_are_the_compilers_rewrite() {
        assert_eq!(registry_reference("registry.k8s.io/kube-apiserver:v1.34.4", "127.0.0.1:5000"), "127.0.0.1:5000/kube-apiserver:v1.34.4");
        assert_eq!(registry_reference("quay.io/cilium/cilium:v1.18.12", "10.0.0.1:5000/"), "10.0.0.1:5000/quay.io-cilium-cilium:v1.18.12");
    }
}
