//! The Compute API endpoint for the cluster's in-cluster GCE clients (the cloud-controller-manager),
//! from the Cluster annotation [`ANNOTATION`]: a Private Service Connect endpoint, a restricted VIP,
//! or a Compute-compatible local cloud. kOps' API has no such field (its CCM reads `api-endpoint`
//! from the cloud config only), so it is an annotation, as for AWS ([`crate::aws_endpoints`]).
//!
//! ```yaml
//! metadata:
//!   annotations:
//!     keelson.io/gce-api-endpoint: https://compute-myendpoint.p.googleapis.com
//! ```
//!
//! The value is the base the Compute API's paths hang from: `<base>/compute/v1/projects/…`, the
//! same base the CLI takes as `--endpoint-url`.

use crate::documents::Cluster;

/// The Cluster annotation naming the Compute endpoint.
pub const ANNOTATION: &str = "keelson.io/gce-api-endpoint";

/// The annotation's base URL (no trailing `/`), `None` without the annotation. The error says what is
/// wrong with the value (the caller names the field).
pub fn compute_base(cluster: &Cluster) -> Result<Option<String>, String> {
    match cluster.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION)) {
        None => Ok(None),
        Some(v) => parse(v).map(Some),
    }
}

/// Check one base URL: `http(s)://host[:port][/path]`, no query or fragment.
pub fn parse(value: &str) -> Result<String, String> {
    let v = value.trim();
    let rest = v.strip_prefix("https://").or_else(|| v.strip_prefix("http://"));
    match rest {
        Some(r) if !r.is_empty() && !r.starts_with('/') && !r.contains(|c: char| c.is_whitespace() || c == '?' || c == '#') => {
            Ok(v.trim_end_matches('/').to_string())
        }
        _ => Err(format!("{value:?} is not an http(s) base URL (expected e.g. https://compute.example.com, without a query)")),
    }
}

/// The cloud config's `api-endpoint` for a base: the v1 API's root, with the trailing `/` the
/// Google client library joins paths onto.
pub fn compute_v1(base: &str) -> String {
    format!("{base}/compute/v1/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_and_bad_values() {
        assert_eq!(parse("http://10.0.0.1:8080/").expect("valid"), "http://10.0.0.1:8080");
        assert_eq!(parse("https://compute.example.com").expect("valid"), "https://compute.example.com");
        assert_eq!(compute_v1("http://10.0.0.1:8080"), "http://10.0.0.1:8080/compute/v1/");
        for bad in ["", "compute.example.com", "ftp://x", "https://", "https:///x", "https://x?y=1", "https://a b"] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
