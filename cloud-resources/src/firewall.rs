//! Who may reach whom: the ingress rules of the instance-group roles' security groups (kOps'
//! firewall model, `pkg/model/awsmodel/firewall.go`, `external_access.go` and `bastion.go`).
//!
//! * Control planes and API servers (the "control plane side") admit everything from each other.
//! * Nodes admit everything from nodes and from the control plane side.
//! * The control plane side admits from nodes every port except etcd's (peer and client ports of
//!   each etcd cluster; for Cilium's etcd only the peer port): TCP in the ranges around them, all
//!   of UDP, and IP-in-IP (protocol 4) when Calico or kube-router may tunnel. AmazonVPC networking
//!   puts pods in the VPC itself, so there nodes are admitted on everything (as in kOps).
//! * Bastions reach control planes and nodes on SSH (TCP 22) only; nothing else reaches bastions
//!   but SSH from `spec.sshAccess`. With a bastion, `sshAccess` opens SSH on the bastions only
//!   (kOps: "we only access through the bastion"); without one, on control planes and nodes.
//! * The API (TCP 443) is admitted on the control plane side from `spec.kubernetesApiAccess`, or
//!   from the API load balancer's group when there is one (the load balancer admits the CIDRs).
//!
//! Pure: the model builder asks it, tests read its answer.

use std::collections::BTreeMap;

use keelson_api::{ClusterSpec, Role};

use crate::aws::{IngressRule, RuleSource};
use crate::tasks::Link;

/// How the API is reached: directly, or through the load balancer (whose group, when apply
/// manages it, is the only source admitted on 443; `None` with `securityGroupOverride`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiAccess {
    Direct,
    LoadBalancer { group: Option<String> },
}

/// The protocol of IP-in-IP, as AWS names it.
pub const PROTOCOL_IPIP: &str = "4";
pub const SSH_PORT: i32 = keelson_api::ports::SSH as i32;
pub const API_PORT: i32 = keelson_api::ports::KUBE_API as i32;

/// The security group of a role: `masters.<cluster>`, `nodes.<cluster>`, …
pub fn group_name(role: Role, cluster: &str) -> String {
    format!("{}.{cluster}", keelson_api::names::role_plural(role))
}

/// The ports of the ingress rules `apply` removes from a group of ours when the spec no longer wants
/// them (kOps' `RemoveExtraRules`: a rule whose from and to port are one of these). Any other rule
/// that is not ours (the cloud-controller-manager's NodePort and health-check rules for a Service's
/// load balancer, one an operator added) is left alone.
pub fn removable_extra_ports(group: &str, cluster: &str) -> &'static [i32] {
    if group == group_name(Role::ControlPlane, cluster) {
        use keelson_api::ports::{BGP, ETCD_EVENTS, ETCD_MAIN, KUBE_API, SSH, VXLAN};
        // SSH, the API, etcd main/events peer and client, VXLAN, Calico BGP.
        const PORTS: [i32; 8] = [
            SSH as i32,
            KUBE_API as i32,
            ETCD_MAIN.peer as i32,
            ETCD_EVENTS.peer as i32,
            ETCD_MAIN.client as i32,
            ETCD_EVENTS.client as i32,
            VXLAN as i32,
            BGP as i32,
        ];
        &PORTS
    } else if group == group_name(Role::Node, cluster) || group == group_name(Role::Bastion, cluster) {
        &[keelson_api::ports::SSH as i32]
    } else if group == format!("api-elb.{cluster}") {
        &[keelson_api::ports::KUBE_API as i32]
    } else {
        &[]
    }
}

/// Whether an ingress rule found on one of the cluster's groups is Keelson's to keep or remove: one
/// the model wants, one between the cluster's own groups, or one on a port [`removable_extra_ports`]
/// names. Everything else belongs to someone else and `apply` neither shows nor touches it.
pub fn found_rule_is_ours(rule: &IngressRule, cluster: &str, wanted: &[IngressRule], our_groups: &std::collections::BTreeSet<String>) -> bool {
    if wanted.contains(rule) {
        return true;
    }
    if let RuleSource::Group(g) = &rule.source {
        if our_groups.contains(&g.to_string()) {
            return true;
        }
    }
    rule.from_port == rule.to_port && removable_extra_ports(&rule.group.to_string(), cluster).contains(&rule.from_port)
}

/// Control planes and API servers: kOps puts both in the masters' group.
fn control_plane_side(role: Role) -> bool {
    matches!(role, Role::ControlPlane | Role::ApiServer)
}

/// The TCP ports nodes may not reach on the control plane side: every etcd cluster's peer and
/// client port (Cilium's etcd only its peer port: the agents on the nodes are its clients). main and
/// events are always closed, as in kOps, whatever the spec names.
pub fn etcd_blocked_ports(spec: &ClusterSpec) -> Vec<u16> {
    let mut names: Vec<String> = vec!["main".into(), "events".into()];
    names.extend(spec.etcd_clusters.iter().flatten().filter_map(|c| c.name.clone()));
    if spec.networking.as_ref().and_then(|n| n.cilium.as_ref()).and_then(|c| c.etcd_managed) == Some(true) {
        names.push("cilium".into());
    }
    let mut blocked = Vec::new();
    for name in names {
        if let Some(p) = keelson_api::ports::etcd_ports(&name) {
            blocked.push(p.peer);
            if name != "cilium" {
                blocked.push(p.client);
            }
        }
    }
    blocked.sort_unstable();
    blocked.dedup();
    blocked
}

/// The ranges of 1..=65535 left when `blocked` ports are taken out, in order.
pub fn open_ranges(blocked: &[u16]) -> Vec<(i32, i32)> {
    let mut out: Vec<(i32, i32)> = Vec::new();
    for port in 1..=65535i32 {
        if blocked.iter().any(|b| i32::from(*b) == port) {
            continue;
        }
        match out.last_mut() {
            Some((_, to)) if *to + 1 == port => *to = port,
            _ => out.push((port, port)),
        }
    }
    out
}

/// The ingress rules of each role's group, for the roles that have instance groups (`roles`).
pub fn role_ingress(cluster: &str, spec: &ClusterSpec, roles: &[Role], api: &ApiAccess) -> BTreeMap<Role, Vec<IngressRule>> {
    let group = |r: Role| group_name(r, cluster);
    let present = |pred: fn(Role) -> bool| -> Vec<String> { roles.iter().copied().filter(|r| pred(*r)).map(group).collect() };
    let control_planes = present(control_plane_side);
    let nodes = present(|r| r == Role::Node);
    let bastions = present(|r| r == Role::Bastion);
    let ssh = spec.ssh_access.clone().unwrap_or_default();
    let api_cidrs = spec.kubernetes_api_access.clone().unwrap_or_default();
    let networking = spec.networking.as_ref();
    let vpc_native = networking.is_some_and(|n| n.amazonvpc.is_some());
    let ipip = networking.is_some_and(|n| n.calico.is_some() || n.kuberouter.is_some());
    let tcp_open = open_ranges(&etcd_blocked_ports(spec));

    let mut out = BTreeMap::new();
    for &role in roles {
        let name = group(role);
        let rule = |protocol: &str, from_port: i32, to_port: i32, source: RuleSource| IngressRule {
            group: Link::to(name.clone()),
            protocol: protocol.into(),
            from_port,
            to_port,
            source,
        };
        let all_from = |g: &String| rule("all", -1, -1, RuleSource::Group(Link::to(g.clone())));
        let ssh_from = |source: RuleSource| rule("tcp", SSH_PORT, SSH_PORT, source);
        let mut ingress = Vec::new();
        match role {
            Role::ControlPlane | Role::ApiServer => {
                ingress.extend(control_planes.iter().map(all_from));
                for n in &nodes {
                    let from = RuleSource::Group(Link::to(n.clone()));
                    if vpc_native {
                        ingress.push(all_from(n));
                        continue;
                    }
                    ingress.extend(tcp_open.iter().map(|&(a, b)| rule("tcp", a, b, from.clone())));
                    ingress.push(rule("udp", 1, 65535, from.clone()));
                    if ipip {
                        ingress.push(rule(PROTOCOL_IPIP, -1, -1, from));
                    }
                }
                match api {
                    ApiAccess::Direct => ingress.extend(api_cidrs.iter().map(|c| rule("tcp", API_PORT, API_PORT, RuleSource::Cidr(c.clone())))),
                    ApiAccess::LoadBalancer { group: Some(lb) } => ingress.push(rule("tcp", API_PORT, API_PORT, RuleSource::Group(Link::to(lb.clone())))),
                    ApiAccess::LoadBalancer { group: None } => {}
                }
            }
            Role::Node => {
                ingress.extend(nodes.iter().chain(control_planes.iter()).map(all_from));
            }
            Role::Bastion => {
                ingress.extend(ssh.iter().map(|c| ssh_from(RuleSource::Cidr(c.clone()))));
            }
        }
        if role != Role::Bastion {
            ingress.extend(bastions.iter().map(|b| ssh_from(RuleSource::Group(Link::to(b.clone())))));
            if bastions.is_empty() {
                ingress.extend(ssh.iter().map(|c| ssh_from(RuleSource::Cidr(c.clone()))));
            }
        }
        ingress.sort();
        ingress.dedup();
        out.insert(role, ingress);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: &str = "c.example.com";

    fn spec(yaml: &str) -> ClusterSpec {
        serde_yaml_ng::from_str(yaml).expect("cluster spec")
    }

    /// `group: protocol from-to from source` lines, for tables.
    fn table(rules: &BTreeMap<Role, Vec<IngressRule>>) -> Vec<String> {
        rules.values().flatten().map(IngressRule::name).collect()
    }

    fn has(rules: &BTreeMap<Role, Vec<IngressRule>>, line: &str) -> bool {
        table(rules).iter().any(|l| l == line)
    }

    #[test]
    fn found_rules_on_our_groups_are_ours_only_when_kops_would_remove_them() {
        let c = "c.example.com";
        let rule = |group: &str, protocol: &str, from: i32, to: i32, source: RuleSource| IngressRule {
            group: Link::to(format!("{group}.{c}")),
            protocol: protocol.into(),
            from_port: from,
            to_port: to,
            source,
        };
        let cidr = |c: &str| RuleSource::Cidr(c.into());
        let ours: std::collections::BTreeSet<String> = ["masters", "nodes", "bastions", "api-elb"].iter().map(|g| format!("{g}.{c}")).collect();
        let wanted = vec![rule("nodes", "tcp", 22, 22, cidr("10.0.0.0/8"))];
        let is_ours = |r: &IngressRule| found_rule_is_ours(r, c, &wanted, &ours);
        assert!(is_ours(&wanted[0]), "a wanted rule");
        assert!(is_ours(&rule("nodes", "tcp", 22, 22, cidr("203.0.113.0/24"))), "a stale SSH rule (port=22)");
        assert!(is_ours(&rule("masters", "tcp", 443, 443, cidr("198.51.100.0/24"))), "a stale API rule (port=443)");
        assert!(is_ours(&rule("masters", "tcp", 4001, 4001, cidr("10.1.0.0/16"))), "etcd client (port=4001)");
        assert!(is_ours(&rule("api-elb", "tcp", 443, 443, cidr("0.0.0.0/0"))));
        assert!(is_ours(&rule("masters", "all", -1, -1, RuleSource::Group(Link::to(format!("bastions.{c}"))))), "between our own groups");
        // The cloud-controller-manager's rules for a Service's load balancer, and anyone else's.
        assert!(!is_ours(&rule("nodes", "tcp", 31487, 31487, cidr("0.0.0.0/0"))), "a NodePort rule");
        assert!(!is_ours(&rule("nodes", "icmp", 3, 4, cidr("0.0.0.0/0"))), "path-MTU ICMP");
        assert!(!is_ours(&rule("nodes", "tcp", 443, 443, cidr("0.0.0.0/0"))), "443 is only the control planes' and the API ELB's to remove");
        assert!(!is_ours(&rule("nodes", "tcp", 1, 65535, RuleSource::Group(Link::to("sg-0123abcd".to_string())))), "from a group not ours");
        assert!(!is_ours(&rule("masters", "tcp", 20, 30, cidr("10.0.0.0/8"))), "a range is never a port=N match");
    }

    #[test]
    fn etcd_ports_are_cut_out_of_node_to_control_plane_tcp() {
        let s = spec("etcdClusters: [{name: main}, {name: events}]\n");
        assert_eq!(etcd_blocked_ports(&s), [2380, 2381, 4001, 4002]);
        assert_eq!(open_ranges(&etcd_blocked_ports(&s)), [(1, 2379), (2382, 4000), (4003, 65535)]);
        let leases = spec("etcdClusters: [{name: main}, {name: leases}]\n");
        assert_eq!(etcd_blocked_ports(&leases), [2380, 2381, 2383, 4001, 4002, 4004]);
        let cilium = spec("networking: {cilium: {etcdManaged: true}}\n");
        assert_eq!(etcd_blocked_ports(&cilium), [2380, 2381, 2382, 4001, 4002], "cilium's client port stays open to its agents");
    }

    /// The whole rule set of a cluster with every role, no load balancer, Calico.
    #[test]
    fn every_role_admits_exactly_what_kops_allows() {
        let s = spec("sshAccess: [10.0.0.0/8]\nkubernetesApiAccess: [0.0.0.0/0]\nnetworking: {calico: {}}\n");
        let roles = [Role::ControlPlane, Role::Node, Role::ApiServer, Role::Bastion];
        let rules = role_ingress(C, &s, &roles, &ApiAccess::Direct);
        let mut want = Vec::new();
        for cp in ["masters", "apiservers"] {
            let g = format!("{cp}.{C}");
            want.extend([
                format!("{g}: all from apiservers.{C}"),
                format!("{g}: all from masters.{C}"),
                format!("{g}: tcp/1-2379 from nodes.{C}"),
                format!("{g}: tcp/2382-4000 from nodes.{C}"),
                format!("{g}: tcp/4003-65535 from nodes.{C}"),
                format!("{g}: udp/1-65535 from nodes.{C}"),
                format!("{g}: 4/all from nodes.{C}"),
                format!("{g}: tcp/443 from 0.0.0.0/0"),
                format!("{g}: tcp/22 from bastions.{C}"),
            ]);
        }
        want.extend([
            format!("nodes.{C}: all from apiservers.{C}"),
            format!("nodes.{C}: all from masters.{C}"),
            format!("nodes.{C}: all from nodes.{C}"),
            format!("nodes.{C}: tcp/22 from bastions.{C}"),
            format!("bastions.{C}: tcp/22 from 10.0.0.0/8"),
        ]);
        let mut got = table(&rules);
        got.sort();
        want.sort();
        assert_eq!(got, want);
    }

    #[test]
    fn without_a_bastion_ssh_access_reaches_control_planes_and_nodes() {
        let s = spec("sshAccess: [192.0.2.0/24]\nkubernetesApiAccess: [198.51.100.0/24]\nnetworking: {cni: {}}\n");
        let rules = role_ingress(C, &s, &[Role::ControlPlane, Role::Node], &ApiAccess::Direct);
        assert!(has(&rules, &format!("masters.{C}: tcp/22 from 192.0.2.0/24")));
        assert!(has(&rules, &format!("nodes.{C}: tcp/22 from 192.0.2.0/24")));
        assert!(has(&rules, &format!("masters.{C}: tcp/443 from 198.51.100.0/24")));
        assert!(!has(&rules, &format!("nodes.{C}: tcp/443 from 198.51.100.0/24")), "the API is on the control planes only");
        assert!(!has(&rules, &format!("masters.{C}: all from nodes.{C}")), "nodes never get everything on control planes");
        assert!(!table(&rules).iter().any(|l| l.contains(": 4/")), "no IP-in-IP without Calico or kube-router");
        let from_nodes: Vec<String> = table(&rules).into_iter().filter(|l| l.starts_with("masters.") && l.ends_with(&format!("from nodes.{C}"))).collect();
        for port in [2380, 2381, 4001, 4002] {
            for line in &from_nodes {
                let ports = line.split_whitespace().nth(1).unwrap_or_default();
                if let Some((from, to)) = ports.strip_prefix("tcp/").and_then(|p| p.split_once('-')) {
                    let (from, to): (i32, i32) = (from.parse().unwrap_or(0), to.parse().unwrap_or(0));
                    assert!(!(from..=to).contains(&port), "{line} opens etcd port {port}");
                }
            }
        }
    }

    #[test]
    fn the_load_balancer_is_the_only_way_to_the_api_when_there_is_one() {
        let s = spec("kubernetesApiAccess: [0.0.0.0/0]\n");
        let lb = ApiAccess::LoadBalancer { group: Some(format!("api-elb.{C}")) };
        let rules = role_ingress(C, &s, &[Role::ControlPlane, Role::Node], &lb);
        assert!(has(&rules, &format!("masters.{C}: tcp/443 from api-elb.{C}")));
        assert!(!has(&rules, &format!("masters.{C}: tcp/443 from 0.0.0.0/0")));
        let overridden = role_ingress(C, &s, &[Role::ControlPlane], &ApiAccess::LoadBalancer { group: None });
        assert!(!table(&overridden).iter().any(|l| l.contains("tcp/443")), "{:?}", table(&overridden));
    }

    #[test]
    fn amazon_vpc_pods_reach_control_planes_on_everything() {
        let s = spec("networking: {amazonvpc: {}}\n");
        let rules = role_ingress(C, &s, &[Role::ControlPlane, Role::Node], &ApiAccess::Direct);
        assert!(has(&rules, &format!("masters.{C}: all from nodes.{C}")));
        assert!(!table(&rules).iter().any(|l| l.contains("tcp/1-2379")));
    }
}
