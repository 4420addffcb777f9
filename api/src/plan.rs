//! Facts of a cluster that several parts act on, each derived from the spec in one place: the
//! compiler, apply's cloud model, the NodeupConfig, CoreDNS and protokube all ask here instead of
//! reading the spec's strings themselves (issue 41's `ClusterPlan` grows from this module).

use crate::ClusterSpec;

/// The cluster's region, the one rule every part uses: a subnet's `region` (GCE specs name it),
/// else the region of the first subnet zone ([`region_of_zone`]). `None` when no subnet says.
pub fn region(spec: &ClusterSpec) -> Option<String> {
    let subnets = spec.subnets.iter().flatten();
    subnets
        .clone()
        .find_map(|s| s.region.clone().filter(|r| !r.is_empty()))
        .or_else(|| subnets.clone().find_map(|s| s.zone.as_deref().and_then(region_of_zone)).map(str::to_string))
}

/// The region of a zone: AWS' rule (`us-east-1a` → `us-east-1`, [`crate::aws_region_of_zone`]), else
/// Google's (`europe-west1-b` → `europe-west1`: the region, a dash, one letter). `None` for neither.
pub fn region_of_zone(zone: &str) -> Option<&str> {
    crate::aws_region_of_zone(zone).or_else(|| {
        let (region, letter) = zone.rsplit_once('-')?;
        let one_letter = letter.len() == 1 && letter.chars().all(|c| c.is_ascii_lowercase());
        let well_formed = region.contains('-')
            && region.ends_with(|c: char| c.is_ascii_digit())
            && region.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        (one_letter && well_formed).then_some(region)
    })
}

/// The values of `spec.topology.dns.type`, spelt as kOps spells them (kOps' `DNSType`).
pub const DNS_TYPES: [&str; 3] = ["Public", "Private", "None"];

/// How a cluster's own names (`api.internal`, `kops-controller.internal`, the etcd members) are
/// served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterDns {
    /// No DNS records: hosts files kept by protokube and nodeup (`topology.dns.type: None`, or a
    /// gossip `.k8s.local` name, which never has a zone).
    Hosts,
    /// Records in the cluster's hosted zone (Route53 or Cloud DNS); `private` for
    /// `topology.dns.type: Private`.
    Zone { private: bool },
}

/// `spec.topology.dns.type`, as written (validation refuses anything outside [`DNS_TYPES`]).
pub fn dns_type(spec: &ClusterSpec) -> Option<&str> {
    spec.topology.as_ref().and_then(|t| t.dns.as_ref()).and_then(|d| d.type_.as_deref())
}

/// Whether the spec says `topology.dns.type: None` (kOps' `UsesNoneDNS`; a gossip name alone does
/// not: see [`cluster_dns`]).
pub fn uses_none_dns(spec: &ClusterSpec) -> bool {
    dns_type(spec) == Some("None")
}

/// Whether a cluster name is a gossip name (`.k8s.local`, trailing dot or not).
pub fn is_gossip_name(cluster_name: &str) -> bool {
    cluster_name.trim_end_matches('.').ends_with(".k8s.local")
}

/// How the cluster's names are served: [`ClusterDns::Hosts`] for `None` or a gossip name, else a
/// zone, private for `Private`.
pub fn cluster_dns(cluster_name: &str, spec: &ClusterSpec) -> ClusterDns {
    if uses_none_dns(spec) || is_gossip_name(cluster_name) {
        ClusterDns::Hosts
    } else {
        ClusterDns::Zone { private: dns_type(spec) == Some("Private") }
    }
}

/// The AWS partition of a region: `aws-cn`, `aws-us-gov` or `aws`.
pub fn partition_of(region: &str) -> &'static str {
    if region.starts_with("cn-") {
        "aws-cn"
    } else if region.starts_with("us-gov-") {
        "aws-us-gov"
    } else {
        "aws"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_region_rule_for_both_clouds() {
        for (zone, region) in [
            ("us-east-1a", Some("us-east-1")),
            ("us-west-2-lax-1b", Some("us-west-2-lax-1")),
            ("europe-west1-b", Some("europe-west1")),
            ("us-central1-a", Some("us-central1")),
            ("nowhere", None),
            ("us-east-1", None),
        ] {
            assert_eq!(region_of_zone(zone), region, "{zone}");
        }
        let spec = |yaml: &str| -> ClusterSpec { serde_yaml_ng::from_str(yaml).expect("spec") };
        assert_eq!(region(&spec("subnets: [{name: a, zone: eu-west-1b}]")).as_deref(), Some("eu-west-1"));
        assert_eq!(region(&spec("subnets: [{name: a, zone: us-central1-a}, {name: b, region: us-central1}]")).as_deref(), Some("us-central1"));
        assert_eq!(region(&spec("subnets: []")), None);
    }
    use crate::{DNSSpec, TopologySpec};

    fn spec(t: Option<&str>) -> ClusterSpec {
        ClusterSpec { topology: Some(TopologySpec { dns: Some(DNSSpec { type_: t.map(str::to_string) }), ..Default::default() }), ..Default::default() }
    }

    #[test]
    fn one_answer_for_every_part() {
        assert_eq!(cluster_dns("x.k8s.local", &spec(None)), ClusterDns::Hosts);
        assert_eq!(cluster_dns("x.k8s.local.", &spec(Some("Public"))), ClusterDns::Hosts, "a gossip name never has a zone");
        assert_eq!(cluster_dns("x.example.com", &spec(Some("None"))), ClusterDns::Hosts);
        assert_eq!(cluster_dns("x.example.com", &spec(None)), ClusterDns::Zone { private: false });
        assert_eq!(cluster_dns("x.example.com", &spec(Some("Private"))), ClusterDns::Zone { private: true });
        assert_eq!(cluster_dns("k8s.local.example.com", &spec(Some("Public"))), ClusterDns::Zone { private: false });
        assert!(uses_none_dns(&spec(Some("None"))) && !uses_none_dns(&spec(Some("none"))), "validation refuses the lower case");
    }
}
