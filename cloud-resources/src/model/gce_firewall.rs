//! GCE firewall rules, as kOps' GCE model makes them (`pkg/model/gcemodel/firewall.go`,
//! `external_access.go`): instances are reached by their role's network tag.
//!
//! * nodes ↔ nodes, control planes ↔ control planes and control planes → nodes: everything
//!   (tcp, udp, icmp, esp, ah, sctp);
//! * nodes → control planes: the API (tcp 443) and kops-controller (tcp 3988) only;
//! * the pod network (`spec.podCIDR`, else `nonMasqueradeCIDR`) → nodes: everything; → control
//!   planes: everything but etcd's TCP ports (the ports nodes may not reach either,
//!   [`crate::firewall::etcd_blocked_ports`]): a pod reaches the API and the join server, never etcd;
//! * `spec.sshAccess` → control planes and nodes on tcp 22; `spec.kubernetesApiAccess` → control
//!   planes on tcp 443. IPv6 sources get their own rule (`…-ipv6`), as GCE wants one family a rule.
//!
//! Names are `<rule>-<cluster>` in GCE's alphabet. Pure: no I/O.

use keelson_api::Role;

use super::Context;
use crate::gce::{self, gce_name, role_tag, Allowed, Firewall};
use crate::tasks::Link;

const ALL: [&str; 6] = ["tcp", "udp", "icmp", "esp", "ah", "sctp"];

fn all() -> Vec<Allowed> {
    ALL.iter().map(|p| Allowed::new(p, &[])).collect()
}

/// Every protocol, TCP only in the ranges around etcd's ports (the one list of them AWS's
/// security groups cut out too).
fn all_but_etcd(cx: &Context<'_>) -> Vec<Allowed> {
    let tcp: Vec<String> = crate::firewall::open_ranges(&crate::firewall::etcd_blocked_ports(cx.spec))
        .into_iter()
        .map(|(from, to)| if from == to { from.to_string() } else { format!("{from}-{to}") })
        .collect();
    let tcp: Vec<&str> = tcp.iter().map(String::as_str).collect();
    ALL.iter().map(|p| if *p == "tcp" { Allowed::new(p, &tcp) } else { Allowed::new(p, &[]) }).collect()
}

/// The firewall rules of the cluster's network.
pub fn build_gce(cx: &Context<'_>, tasks: &mut gce::Tasks) {
    let cluster = cx.cluster;
    let network: Link<gce::Network> = match cx.vpc.id() {
        Some(id) => Link::existing(id, id),
        None => Link::to(cluster),
    };
    let (master, node) = (role_tag(cluster, Role::ControlPlane), role_tag(cluster, Role::Node));
    let rule = |name: &str, ranges: Vec<String>, sources: Vec<String>, targets: Vec<String>, allowed: Vec<Allowed>| Firewall {
        name: gce_name(&format!("{name}-{cluster}")),
        network: network.clone(),
        source_ranges: ranges,
        source_tags: sources,
        target_tags: targets,
        allowed,
    };
    let mut rules = vec![
        rule("node-to-node", vec![], vec![node.clone()], vec![node.clone()], all()),
        rule("master-to-master", vec![], vec![master.clone()], vec![master.clone()], all()),
        rule("master-to-node", vec![], vec![master.clone()], vec![node.clone()], all()),
        rule(
            "node-to-master",
            vec![],
            vec![node.clone()],
            vec![master.clone()],
            vec![Allowed::new("tcp", &[&keelson_api::ports::KUBE_API.to_string(), &keelson_api::ports::NODE_JOIN.to_string()])],
        ),
    ];
    let pods = cx.spec.pod_cidr.as_ref().or(cx.spec.non_masquerade_cidr.as_ref()).map(|c| c.to_string());
    if let Some(pods) = pods {
        rules.push(rule("pod-cidrs-to-node", vec![pods.clone()], vec![], vec![node.clone()], all()));
        rules.push(rule("pod-cidrs-to-master", vec![pods], vec![], vec![master.clone()], all_but_etcd(cx)));
    }
    // External access: one rule per address family.
    let mut external = |name: &str, cidrs: &[String], targets: Vec<String>, port: &str| {
        let (v6, v4): (Vec<String>, Vec<String>) = cidrs.iter().cloned().partition(|c| c.contains(':'));
        if !v4.is_empty() {
            rules.push(rule(name, v4, vec![], targets.clone(), vec![Allowed::new("tcp", &[port])]));
        }
        if !v6.is_empty() {
            rules.push(rule(&format!("{name}-ipv6"), v6, vec![], targets, vec![Allowed::new("tcp", &[port])]));
        }
    };
    let ssh = cx.spec.ssh_access.clone().unwrap_or_default();
    let (ssh_port, api_port) = (keelson_api::ports::SSH.to_string(), keelson_api::ports::KUBE_API.to_string());
    external("ssh-external-to-master", &ssh, vec![master.clone()], &ssh_port);
    external("ssh-external-to-node", &ssh, vec![node.clone()], &ssh_port);
    external("kubernetes-master-https", &cx.spec.kubernetes_api_access.clone().unwrap_or_default(), vec![master], &api_port);
    for r in rules {
        tasks.push(r);
    }
}
