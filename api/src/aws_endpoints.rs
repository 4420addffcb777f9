//! AWS service endpoint overrides for the cluster's in-cluster AWS clients (the cloud-controller-
//! manager), from the Cluster annotation [`ANNOTATION`]: VPC interface endpoints, GovCloud/partition
//! endpoints, or an AWS-compatible local cloud. kOps' API has no such field, so it is an annotation
//! (kOps keeps unknown annotations), not a new spec field.
//!
//! ```yaml
//! metadata:
//!   annotations:
//!     keelson.io/aws-service-endpoints: ec2=https://vpce-0a1b.ec2.eu-west-1.vpce.amazonaws.com,kms=https://kms.eu-west-1.amazonaws.com
//! ```
//!
//! Keys are AWS endpoint prefixes (also the SigV4 signing names): [`SERVICES`].

use std::collections::BTreeMap;

use crate::documents::Cluster;

/// The Cluster annotation naming the endpoint overrides.
pub const ANNOTATION: &str = "keelson.io/aws-service-endpoints";

/// Endpoint prefix (= SigV4 signing name) → the service ids the AWS cloud-controller-manager's
/// cloud config names in its `[ServiceOverride]` sections (aws-sdk-go-v2 `ServiceID`s). The
/// cluster-autoscaler's cloud config names the prefixes themselves (aws-sdk-go v1 endpoint ids) of
/// `autoscaling` and `ec2`; the CCM does not call Auto Scaling (no ids). `sts` is where an addon on
/// a role of its own exchanges its service-account token (`AWS_ENDPOINT_URL_STS`,
/// [`crate::addon_roles`]).
pub const SERVICES: &[(&str, &[&str])] = &[
    ("autoscaling", &[]),
    ("ec2", &["EC2"]),
    ("elasticloadbalancing", &["Elastic Load Balancing", "Elastic Load Balancing v2"]),
    ("kms", &["KMS"]),
    ("sts", &[]),
];

/// One override: the endpoint prefix and its URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceEndpoint {
    pub service: String,
    pub url: String,
}

/// The overrides the annotation names, by endpoint prefix; empty without the annotation. The error
/// says what is wrong with the value (the caller names the field).
pub fn service_endpoints(cluster: &Cluster) -> Result<BTreeMap<String, String>, String> {
    let Some(value) = cluster.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION)) else {
        return Ok(BTreeMap::new());
    };
    parse(value)
}

/// Parse `service=url[,service=url…]`.
pub fn parse(value: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((service, url)) = item.split_once('=') else {
            return Err(format!("{item:?}: expected service=url"));
        };
        let (service, url) = (service.trim(), url.trim());
        if !SERVICES.iter().any(|(s, _)| *s == service) {
            let known: Vec<&str> = SERVICES.iter().map(|(s, _)| *s).collect();
            return Err(format!("{service:?}: unknown service (expected one of {})", known.join(", ")));
        }
        let rest = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://"));
        if rest.is_none_or(|r| r.is_empty() || r.contains(char::is_whitespace)) {
            return Err(format!("{service}: {url:?} is not an http(s) URL"));
        }
        if out.insert(service.to_string(), url.to_string()).is_some() {
            return Err(format!("{service}: named twice"));
        }
    }
    if out.is_empty() {
        return Err("empty: name at least one service=url".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_and_bad_values() {
        let m = parse("ec2=http://172.20.255.254:4566, kms=https://kms.example,autoscaling=http://a").expect("valid");
        assert_eq!(m["autoscaling"], "http://a");
        assert_eq!(m["ec2"], "http://172.20.255.254:4566");
        assert_eq!(m["kms"], "https://kms.example");
        for bad in ["", "ec2", "s3=https://x", "ec2=ftp://x", "ec2=https://", "ec2=https://a,ec2=https://b"] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
