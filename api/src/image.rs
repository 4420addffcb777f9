//! Container image references, `[HOST[:PORT]/]PATH[:TAG][@DIGEST]`, checked against the grammar of
//! the distribution reference (the one containerd and the kubelet parse an image name with):
//! lower-case path components of letters and digits joined by `.`, `_`, `__` or dashes; a tag of
//! up to 128 word characters, `.` and `-` not starting with either; a digest `ALGORITHM:HEX` of at
//! least 32 hex digits; a name of at most 255 characters. The first component is the registry
//! host when it contains `.` or `:`, is `localhost`, or has an upper-case letter.

use std::fmt;
use std::str::FromStr;

/// A well-formed image reference (the text as given).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageReference(String);

/// Why a text is not an image reference.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not an image reference ([HOST[:PORT]/]PATH[:TAG][@sha256:DIGEST]): {reason}")]
pub struct ImageReferenceError {
    pub value: String,
    pub reason: &'static str,
}

impl ImageReference {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The digest the reference pins (`sha256:…` after `@`), if any: the one part of a reference
    /// that says exactly which content is pulled.
    pub fn digest(&self) -> Option<&str> {
        self.0.split_once('@').map(|(_, d)| d)
    }
}

impl fmt::Display for ImageReference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn alnum_lower(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
}

/// `[a-z0-9]+ (( "." | "_" | "__" | "-"+ ) [a-z0-9]+)*`
fn path_component(s: &str) -> bool {
    let mut rest = s;
    let mut first = true;
    loop {
        if !first {
            let sep = if rest.starts_with("__") {
                2
            } else if rest.starts_with(['.', '_']) {
                1
            } else {
                rest.len() - rest.trim_start_matches('-').len()
            };
            if sep == 0 {
                return false;
            }
            rest = &rest[sep..];
        }
        first = false;
        let end = rest.find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit())).unwrap_or(rest.len());
        if end == 0 {
            return false;
        }
        rest = &rest[end..];
        if rest.is_empty() {
            return true;
        }
    }
}

/// A registry host: DNS labels of letters, digits and inner dashes, an IPv4 address, or `[IPv6]`;
/// then an optional `:PORT`.
fn domain(s: &str) -> bool {
    let port = |p: &str| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit());
    if let Some(rest) = s.strip_prefix('[') {
        let Some((ip, after)) = rest.split_once(']') else { return false };
        return ip.parse::<std::net::Ipv6Addr>().is_ok() && (after.is_empty() || after.strip_prefix(':').is_some_and(port));
    }
    let host = match s.split_once(':') {
        Some((h, p)) if port(p) => h,
        Some(_) => return false,
        None => s,
    };
    !host.is_empty()
        && host.split('.').all(|l| !l.is_empty() && !l.starts_with('-') && !l.ends_with('-') && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
}

fn tag(s: &str) -> bool {
    !s.is_empty() && s.len() <= 128 && !s.starts_with(['.', '-']) && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// `ALGORITHM:HEX`: algorithm components of `[a-z0-9]` joined by `+ . _ -`, at least 32 hex digits.
fn digest(s: &str) -> bool {
    let Some((algorithm, hex)) = s.split_once(':') else { return false };
    algorithm.split(['+', '.', '_', '-']).all(alnum_lower) && hex.len() >= 32 && hex.chars().all(|c| c.is_ascii_hexdigit())
}

impl FromStr for ImageReference {
    type Err = ImageReferenceError;

    fn from_str(value: &str) -> Result<ImageReference, ImageReferenceError> {
        let bad = |reason| Err(ImageReferenceError { value: value.to_string(), reason });
        if value.is_empty() {
            return bad("empty");
        }
        let (name_tag, digest_part) = match value.split_once('@') {
            Some((n, d)) => (n, Some(d)),
            None => (value, None),
        };
        if digest_part.is_some_and(|d| !digest(d)) {
            return bad("the digest is not ALGORITHM:HEX with at least 32 hex digits");
        }
        // A tag is what follows the last ':' when no '/' comes after it (else it is a port).
        let (name, tag_part) = match name_tag.rsplit_once(':') {
            Some((n, t)) if !t.contains('/') => (n, Some(t)),
            _ => (name_tag, None),
        };
        if tag_part.is_some_and(|t| !tag(t)) {
            return bad("the tag is not 1-128 letters, digits, '_', '.' or '-' (not starting with '.' or '-')");
        }
        if name.len() > 255 {
            return bad("the name is longer than 255 characters");
        }
        let (host, path) = match name.split_once('/') {
            Some((first, rest)) if first.contains(['.', ':']) || first == "localhost" || first.chars().any(|c| c.is_ascii_uppercase()) => (Some(first), rest),
            _ => (None, name),
        };
        if host.is_some_and(|h| !domain(h)) {
            return bad("the registry is not HOST[:PORT]");
        }
        if path.is_empty() || !path.split('/').all(path_component) {
            return bad("the repository path is not lower-case letters and digits separated by '/', '.', '_' or '-'");
        }
        Ok(ImageReference(value.to_string()))
    }
}

/// The etcd image of an etcd version (`3.6.12` or `v3.6.12`), before registry rewriting.
pub fn etcd_image(etcd_version: &str) -> String {
    let v = etcd_version.trim();
    format!("registry.k8s.io/etcd:v{}", v.strip_prefix('v').unwrap_or(v))
}

/// Rewrite an image for `assets.containerProxy` then `assets.containerRegistry`
/// (kOps `NormalizeImage`):
/// * proxy: a Docker-Hub style name (`foo` or `org/foo` without a registry host) gets
///   `<proxy>/` prepended; otherwise the registry host is replaced by the proxy.
/// * registry: strip `registry.k8s.io/`, replace remaining `/` with `-`, prepend `<registry>/`
///   (unless already prefixed by it). E.g. `registry.k8s.io/provider-aws/cloud-controller-manager:v1`
///   → `<registry>/provider-aws-cloud-controller-manager:v1`.
pub fn remap_image(image: &str, container_registry: Option<&str>, container_proxy: Option<&str>) -> String {
    let mut image = image.to_string();
    if let Some(proxy) = container_proxy {
        let proxy = proxy.strip_suffix('/').unwrap_or(proxy);
        let first = image.split('/').next().unwrap_or("");
        if image.matches('/').count() <= 1 && !first.contains(['.', ':']) {
            image = format!("{proxy}/{image}");
        } else {
            let rest = image.find('/').map(|i| &image[i..]).unwrap_or("");
            image = format!("{proxy}{rest}");
        }
    }
    if let Some(registry) = container_registry {
        let normalized = image.strip_prefix("registry.k8s.io/").unwrap_or(&image);
        if !normalized.starts_with(&format!("{registry}/")) {
            image = format!("{registry}/{}", normalized.replace('/', "-"));
        } else {
            image = normalized.to_string();
        }
    }
    image
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_references() {
        for r in [
            "registry.k8s.io/metrics-server/metrics-server:v0.8.0",
            "metrics-server",
            "library/busybox:1.36",
            "172.20.255.254:5000/metrics-server-metrics-server:v0.8.0",
            "localhost/x",
            "localhost:5000/a/b__c/d-e.f:latest",
            "[fd00::1]:5000/img:1",
            "quay.io/cilium/cilium:v1.18.12@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "img@sha256:0123456789abcdef0123456789abcdef",
            "a--b/c:_tag",
        ] {
            assert_eq!(r.parse::<ImageReference>().map(|i| i.to_string()), Ok(r.to_string()), "{r}");
        }
        let pinned: ImageReference = "quay.io/cilium/cilium:v1.18.12@sha256:0123456789abcdef0123456789abcdef".parse().expect("valid");
        assert_eq!(pinned.digest(), Some("sha256:0123456789abcdef0123456789abcdef"));
        assert_eq!("localhost:5000/x:1".parse::<ImageReference>().expect("valid").digest(), None, "a port is no digest");
    }

    #[test]
    fn bad_references() {
        for (r, why) in [
            ("", "empty"),
            ("Registry.k8s.io", "repository path"),
            ("registry.k8s.io/Metrics-Server:v1", "repository path"),
            ("metrics server:v1", "repository path"),
            ("registry.k8s.io/ms:", "tag"),
            ("registry.k8s.io/ms:-v1", "tag"),
            ("registry.k8s.io/ms:v1 latest", "tag"),
            ("registry.k8s.io//ms", "repository path"),
            ("registry.k8s.io/ms/", "repository path"),
            ("-registry.k8s.io/ms", "registry"),
            ("registry-.k8s.io/ms", "registry"),
            ("host:port/ms", "registry"),
            ("ms@sha256:abc", "digest"),
            ("ms@sha256", "digest"),
            ("a/.b", "repository path"),
        ] {
            let e = r.parse::<ImageReference>().expect_err(r);
            assert!(e.reason.contains(why), "{r}: {e}");
            assert!(e.to_string().contains(&format!("{r:?}")), "{e}");
        }
        let long = format!("registry.k8s.io/{}", "a".repeat(250));
        assert!(long.parse::<ImageReference>().unwrap_err().reason.contains("255"));
    }
}
