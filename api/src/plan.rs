//! Facts of a cluster that several parts act on, each derived from the spec in one place: the
//! compiler, apply's cloud model, the NodeupConfig, CoreDNS and protokube all ask here instead of
//! reading the spec's strings themselves (issue 41's `ClusterPlan` grows from this module).

use crate::ClusterSpec;

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

#[cfg(test)]
mod tests {
    use super::*;
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
