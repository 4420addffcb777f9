//! Cluster-wide network, naming and store defaults (kOps `populate_cluster_spec.go`
//! `assignSubnets`, `cloudup/defaults.go` `PerformAssignments`, GCE `network.go`).

use std::net::{IpAddr, Ipv4Addr};

use keelson_api::{APISpec, Cidr, ClusterSpec, DNSAccessSpec, DNSSpec, ExternalDNSConfig, LoadBalancerAccessSpec, Role, TopologySpec};

use super::{default, Cloud, Context, Derived, Plugin};

/// Default pod + service supernet.
pub const DEFAULT_NON_MASQUERADE: &str = "100.64.0.0/10";
const DEFAULT_SERVICE_RANGE_V4: &str = "100.64.0.0/13";
const DEFAULT_SERVICE_RANGE_V6: &str = "fd00:5e4f:ce::/108";
pub const DEFAULT_AWS_NETWORK: &str = "172.20.0.0/16";
const DEFAULT_AZURE_NETWORK: &str = "10.0.0.0/16";

fn cidr(s: &str) -> Cidr {
    s.parse().unwrap_or_else(|_| unreachable!("built-in CIDR {s} is valid"))
}

/// The upper half of an IPv4 range: `100.64.0.0/10` → `100.96.0.0/11`.
pub fn upper_half(range: Cidr) -> Option<Cidr> {
    let ipnet::IpNet::V4(net) = range.net() else { return None };
    let len = net.prefix_len();
    if len >= 32 {
        return None;
    }
    let base = u32::from(net.network()) | (1u32 << (31 - len));
    ipnet::Ipv4Net::new(Ipv4Addr::from(base), len + 1).ok().map(|n| Cidr::from(ipnet::IpNet::V4(n)))
}

/// The n-th address of a range (kube-dns lives at the 10th address of the service range).
pub fn nth_address(range: Cidr, n: u128) -> IpAddr {
    match range.net() {
        ipnet::IpNet::V4(v4) => IpAddr::V4(Ipv4Addr::from(u32::from(v4.network()).wrapping_add(n as u32))),
        ipnet::IpNet::V6(v6) => IpAddr::V6(std::net::Ipv6Addr::from(u128::from(v6.network()).wrapping_add(n))),
    }
}

/// Join store paths the way kOps' vfs paths do (exactly one `/` between parts).
pub fn join_path(base: &str, parts: &[&str]) -> String {
    let mut out = base.to_string();
    for p in parts {
        if !out.ends_with('/') {
            out.push('/');
        }
        out.push_str(p);
    }
    out
}

pub fn build(ctx: &Context, d: &Derived, spec: &mut ClusterSpec) {
    // Topology: DNS type defaults to Public.
    let topology = spec.topology.get_or_insert_with(TopologySpec::default);
    let dns = topology.dns.get_or_insert_with(DNSSpec::default);
    default(&mut dns.type_, "Public".to_string());
    let dns_type = dns.type_.clone().unwrap_or_default();

    // GCE with IP aliases (gcp or kindnet networking): pods, services and nodes get ranges of the
    // VPC, allocated from 10.0.0.0/8 (kOps `gce/network.go`), unless the user fixed them all.
    if ctx.cloud == Cloud::Gce && matches!(d.plugin, Plugin::Gcp | Plugin::Kindnet) {
        assign_gce_ip_aliases(ctx, spec);
    }

    // podCIDR and the service range are carved from nonMasqueradeCIDR.
    if spec.non_masquerade_cidr.is_none() {
        if ctx.cloud == Cloud::Aws && spec.network_cidr.is_none() && d.plugin == Plugin::AmazonVpc {
            spec.non_masquerade_cidr = Some(cidr(DEFAULT_AWS_NETWORK));
        } else {
            spec.non_masquerade_cidr = Some(cidr(DEFAULT_NON_MASQUERADE));
        }
    }
    if let Some(nm) = spec.non_masquerade_cidr {
        if !nm.is_ipv6() {
            if let Some(pod) = upper_half(nm) {
                default(&mut spec.pod_cidr, pod);
            }
        }
        let svc = if nm.is_ipv6() { DEFAULT_SERVICE_RANGE_V6 } else { DEFAULT_SERVICE_RANGE_V4 };
        default(&mut spec.service_cluster_ip_range, cidr(svc));
    }
    match ctx.cloud {
        Cloud::Aws => {
            default(&mut spec.network_cidr, cidr(DEFAULT_AWS_NETWORK));
            if let (Some(network), Some(subnets)) = (spec.network_cidr, spec.subnets.as_mut()) {
                assign_aws_subnets(network, subnets);
            }
        }
        Cloud::Azure => default(&mut spec.network_cidr, cidr(DEFAULT_AZURE_NETWORK)),
        Cloud::Gce => assign_gce_subnets(spec),
        _ => {}
    }
    default(&mut spec.cluster_dns_domain, "cluster.local".to_string());

    // API access: DNS when the API servers sit in public subnets, a load balancer otherwise.
    if spec.cloud_provider.as_deref() != Some("openstack") {
        let api = spec.api.get_or_insert_with(APISpec::default);
        if api.dns.is_none() && api.load_balancer.is_none() {
            let subnet_type = |name: &str| spec.subnets.iter().flatten().find(|s| s.name.as_deref() == Some(name)).and_then(|s| s.type_.clone());
            let has_apiserver_group = ctx.groups.iter().any(|g| g.role() == Some(Role::ApiServer));
            let mut private = false;
            let mut public = false;
            for g in ctx.groups {
                let serves_api = match g.role() {
                    Some(Role::ApiServer) => true,
                    Some(Role::ControlPlane) => !has_apiserver_group,
                    _ => false,
                };
                if !serves_api {
                    continue;
                }
                for s in g.spec.subnets.iter().flatten() {
                    match subnet_type(s).as_deref() {
                        Some("Private") => private = true,
                        Some("Public") => public = true,
                        _ => {}
                    }
                }
            }
            if private {
                api.load_balancer = Some(LoadBalancerAccessSpec::default());
            } else if public {
                api.dns = Some(DNSAccessSpec::default());
            }
        }
        if let Some(lb) = api.load_balancer.as_mut() {
            default(&mut lb.type_, "Public".to_string());
            if ctx.cloud == Cloud::Aws {
                default(&mut lb.class, "Classic".to_string());
            }
        }
    }

    if dns_type != "None" {
        if dns_type == "Public" || spec.dns_zone.is_some() {
            default(&mut spec.master_public_name, format!("api.{}", ctx.name));
        }
        let ext = spec.external_dns.get_or_insert_with(ExternalDNSConfig::default);
        default(&mut ext.provider, "dns-controller".to_string());
    }

    if let Some(base) = spec.config_base.clone() {
        let base = base.trim_end_matches('/').to_string();
        default(&mut spec.key_store, format!("{base}/pki"));
        default(&mut spec.secret_store, format!("{base}/secrets"));
    }
}

/// Allocate the first free block of `/prefix` inside `within`, skipping the very first block
/// (kOps' `CIDRMap.Allocate` starts one block in), and mark it used.
fn allocate(used: &mut Vec<Cidr>, within: ipnet::Ipv4Net, prefix: u8) -> Option<Cidr> {
    let step = 1u64 << (32 - u32::from(prefix));
    let mut next = u64::from(u32::from(within.network())) + step;
    let end = u64::from(u32::from(within.broadcast()));
    while next <= end {
        let net = ipnet::Ipv4Net::new(Ipv4Addr::from(next as u32), prefix).ok()?;
        let c = Cidr::from(ipnet::IpNet::V4(net));
        if !used.iter().any(|u| u.overlaps(&c)) {
            used.push(c);
            return Some(c);
        }
        next += step;
    }
    None
}

/// AWS subnets without a CIDR (and without an existing subnet's id) get one from the network CIDR,
/// as kOps' `assignCIDRsToSubnets` does: the network is split into 1, 2, 4 or 8 equal blocks (one
/// per Public/Private/DualStack subnet, plus one shared by the Utility subnets), blocks that overlap
/// a subnet's given CIDR are skipped, each Utility subnet gets an eighth of the first free block and
/// the other subnets the following blocks, in zone order. Leaves a subnet without a CIDR when the
/// network has no room (validation then names it).
pub fn assign_aws_subnets(network: Cidr, subnets: &mut [keelson_api::ClusterSubnetSpec]) {
    let ipnet::IpNet::V4(network) = network.net() else { return };
    if subnets.iter().all(|s| s.cidr.is_some() || s.id.is_some()) {
        return;
    }
    let parsed = |s: &keelson_api::ClusterSubnetSpec| s.cidr.as_deref().and_then(|c| c.parse::<ipnet::Ipv4Net>().ok());
    let reserved: Vec<ipnet::Ipv4Net> = subnets.iter().filter_map(parsed).filter(|c| network.contains(&c.network())).collect();
    // A subnet whose given CIDR lies outside the network (an additional network CIDR) is left out.
    let mut order: Vec<usize> = (0..subnets.len()).filter(|&i| parsed(&subnets[i]).is_none_or(|c| network.contains(&c.network()))).collect();
    order.sort_by(|&a, &b| subnets[a].zone.cmp(&subnets[b].zone));
    let utility = |s: &keelson_api::ClusterSubnetSpec| s.type_.as_deref() == Some("Utility");
    let (little, big): (Vec<usize>, Vec<usize>) = order.into_iter().partition(|&i| utility(&subnets[i]));
    let count = big.len() + usize::from(!little.is_empty());
    let bits = match count {
        0 | 1 => 0,
        2 => 1,
        3 | 4 => 2,
        _ => 3,
    };
    let split =
        |parent: ipnet::Ipv4Net, bits: u8| -> Vec<ipnet::Ipv4Net> { parent.subnets(parent.prefix_len() + bits).map(|i| i.collect()).unwrap_or_default() };
    let mut blocks: Vec<ipnet::Ipv4Net> =
        split(network, bits).into_iter().filter(|b| !reserved.iter().any(|r| r.contains(&b.network()) || b.contains(&r.network()))).collect();
    if blocks.is_empty() {
        return;
    }
    if !little.is_empty() {
        let mut eighths = split(blocks.remove(0), 3).into_iter();
        for i in little {
            if subnets[i].cidr.is_some() {
                continue;
            }
            let Some(c) = eighths.next() else { break };
            subnets[i].cidr = Some(c.to_string());
        }
    }
    let mut blocks = blocks.into_iter();
    for i in big {
        if subnets[i].cidr.is_some() || subnets[i].id.is_some() {
            continue;
        }
        let Some(c) = blocks.next() else { break };
        subnets[i].cidr = Some(c.to_string());
    }
}

fn gce_network() -> ipnet::Ipv4Net {
    ipnet::Ipv4Net::new(Ipv4Addr::new(10, 0, 0, 0), 8).unwrap_or_default()
}

/// GCE subnets without a CIDR get /20s of 10.0.0.0/8 (kOps `gce/network.go`).
fn assign_gce_subnets(spec: &mut ClusterSpec) {
    let Some(subnets) = spec.subnets.as_mut() else { return };
    let mut used: Vec<Cidr> = subnets.iter().filter_map(|s| s.cidr.as_deref()?.parse().ok()).collect();
    for s in subnets.iter_mut().filter(|s| s.cidr.is_none() && s.id.is_none()) {
        match allocate(&mut used, gce_network(), 20) {
            Some(c) => s.cidr = Some(c.to_string()),
            None => return,
        }
    }
}

/// IP-alias networking on GCE: pod /14, service /16 and node /19 ranges from 10.0.0.0/8, and
/// the whole 10.0.0.0/8 as the non-masquerade range.
fn assign_gce_ip_aliases(ctx: &Context, spec: &mut ClusterSpec) {
    let user = ctx.user;
    let user_subnet_cidr = user.subnets.as_ref().filter(|s| s.len() == 1).and_then(|s| s[0].cidr.clone());
    if user.pod_cidr.is_some() && user.service_cluster_ip_range.is_some() && user_subnet_cidr.is_some() {
        return;
    }
    let Some(subnets) = spec.subnets.as_mut().filter(|s| s.len() == 1) else { return };
    if spec.pod_cidr.is_some() && spec.service_cluster_ip_range.is_some() && subnets[0].cidr.is_some() {
        return; // already assigned in an earlier pass
    }
    let mut used = Vec::new();
    let (Some(pod), Some(svc), Some(node)) =
        (allocate(&mut used, gce_network(), 14), allocate(&mut used, gce_network(), 16), allocate(&mut used, gce_network(), 19))
    else {
        return;
    };
    default(&mut subnets[0].cidr, node.to_string());
    default(&mut spec.pod_cidr, pod);
    default(&mut spec.service_cluster_ip_range, svc);
    spec.non_masquerade_cidr = Some(Cidr::from(ipnet::IpNet::V4(gce_network())));
}

/// `spec.networking.cilium` defaults (kOps `pkg/model/components/cilium.go`, `CiliumOptionsBuilder`).
pub fn cilium(_ctx: &Context, d: &Derived, spec: &mut ClusterSpec) {
    let Some(c) = spec.networking.as_mut().and_then(|n| n.cilium.as_mut()) else { return };
    default(&mut c.version, crate::versions::DEFAULT_CILIUM_VERSION.to_string());
    default(&mut c.enable_endpoint_health_checking, true);
    default(&mut c.enable_host_firewall, false);
    default(&mut c.identity_allocation_mode, "crd".to_string());
    default(&mut c.identity_change_grace_period, "5s".to_string());
    default(&mut c.bpf_ct_global_any_max, 262_144);
    default(&mut c.bpf_ct_global_tcp_max, 524_288);
    default(&mut c.bpf_lb_algorithm, "random".to_string());
    default(&mut c.bpf_lb_maglev_table_size, "16381".to_string());
    default(&mut c.bpf_nat_global_max, 524_288);
    default(&mut c.bpf_neigh_global_max, 524_288);
    default(&mut c.bpf_policy_map_max, 16_384);
    default(&mut c.bpf_lb_map_max, 65_536);
    default(&mut c.cluster_name, "default".to_string());
    default(&mut c.monitor_aggregation, "medium".to_string());
    default(&mut c.sidecar_istio_proxy_image, "cilium/istio_proxy".to_string());
    default(&mut c.to_fqdns_dns_reject_response_code, "refused".to_string());
    default(&mut c.agent_prometheus_port, 9090);
    default(&mut c.ipam, "kubernetes".to_string());
    // kOps' `masquerade` is v1alpha2's `disableMasquerade`, inverted.
    default(&mut c.disable_masquerade, d.ipv6);
    let eni = c.ipam.as_deref() == Some("eni");
    default(&mut c.tunnel, if eni || d.ipv6 { "disabled" } else { "vxlan" }.to_string());
    default(&mut c.enable_remote_node_identity, true);
    default(&mut c.enable_unreachable_routes, false);
    default(&mut c.enable_bpf_masquerade, eni);
    default(&mut c.enable_l7_proxy, true);
    default(&mut c.enable_local_redirect_policy, false);
    default(&mut c.disable_cnp_status_updates, true);
    if c.cpu_request.is_none() {
        c.cpu_request = "25m".parse().ok();
    }
    if c.memory_request.is_none() {
        c.memory_request = "128Mi".parse().ok();
    }
    if c.enable_encryption == Some(true) {
        default(&mut c.encryption_type, "ipsec".to_string());
    }
    default(&mut c.cni_exclusive, true);
    default(&mut c.hubble.get_or_insert_with(|| keelson_api::HubbleSpec { enabled: Some(false), ..Default::default() }).enabled, true);
    default(&mut c.ingress.get_or_insert_with(|| keelson_api::CiliumIngressSpec { enabled: Some(false), ..Default::default() }).enabled, true);
    default(&mut c.gateway_api.get_or_insert_with(|| keelson_api::CiliumGatewayAPISpec { enabled: Some(false), ..Default::default() }).enabled, true);
}

/// `spec.networking.calico` defaults (kOps `pkg/model/components/calico.go`, `CalicoOptionsBuilder`):
/// IP-in-IP encapsulation, none on IPv6-only clusters, VXLAN everywhere on Azure (whose fabric drops
/// IP-in-IP packets). kOps leaves `version` empty (its template falls back to the pinned version).
pub fn calico(_ctx: &Context, d: &Derived, spec: &mut ClusterSpec) {
    let azure = spec.cloud_provider.as_deref() == Some("azure");
    let Some(c) = spec.networking.as_mut().and_then(|n| n.calico.as_mut()) else { return };
    if azure {
        default(&mut c.encapsulation_mode, "vxlan".to_string());
        default(&mut c.vxlan_mode, "Always".to_string());
    } else {
        default(&mut c.encapsulation_mode, if d.ipv6 { "none" } else { "ipip" }.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_range_is_upper_half_of_non_masquerade() {
        assert_eq!(upper_half(cidr("100.64.0.0/10")).map(|c| c.to_string()), Some("100.96.0.0/11".into()));
        assert_eq!(upper_half(cidr("172.20.0.0/16")).map(|c| c.to_string()), Some("172.20.128.0/17".into()));
        assert_eq!(upper_half(cidr("::/0")), None);
    }

    #[test]
    fn allocation_skips_the_first_block_like_kops() {
        let mut used = Vec::new();
        assert_eq!(allocate(&mut used, gce_network(), 14).map(|c| c.to_string()), Some("10.4.0.0/14".into()));
        assert_eq!(allocate(&mut used, gce_network(), 16).map(|c| c.to_string()), Some("10.1.0.0/16".into()));
        assert_eq!(allocate(&mut used, gce_network(), 19).map(|c| c.to_string()), Some("10.0.32.0/19".into()));
        let mut fresh = Vec::new();
        assert_eq!(allocate(&mut fresh, gce_network(), 20).map(|c| c.to_string()), Some("10.0.16.0/20".into()));
    }

    /// kOps' split: three zones, private with utility subnets → a /18 each for the private subnets
    /// after the first /18, whose eighths (/21) go to the utility subnets; a given CIDR is kept and
    /// its block skipped; an existing subnet (id) is left alone.
    #[test]
    fn aws_subnets_get_kops_blocks() {
        let subnet = |name: &str, zone: &str, ty: &str| keelson_api::ClusterSubnetSpec {
            name: Some(name.into()),
            zone: Some(zone.into()),
            type_: Some(ty.into()),
            ..Default::default()
        };
        let mut s = vec![
            subnet("b", "z-1b", "Private"),
            subnet("a", "z-1a", "Private"),
            subnet("c", "z-1c", "Private"),
            subnet("utility-a", "z-1a", "Utility"),
            subnet("utility-b", "z-1b", "Utility"),
        ];
        assign_aws_subnets(cidr("172.20.0.0/16"), &mut s);
        let got: Vec<_> = s.iter().map(|s| s.cidr.clone().unwrap_or_default()).collect();
        assert_eq!(got, ["172.20.128.0/18", "172.20.64.0/18", "172.20.192.0/18", "172.20.0.0/21", "172.20.8.0/21"]);

        let mut s = vec![subnet("a", "z-1a", "Public"), subnet("b", "z-1b", "Public"), subnet("old", "z-1c", "Public")];
        s[2].cidr = Some("172.20.0.0/24".into());
        let mut existing = subnet("shared", "z-1a", "Public");
        existing.id = Some("subnet-1".into());
        s.push(existing);
        assign_aws_subnets(cidr("172.20.0.0/16"), &mut s);
        let got: Vec<_> = s.iter().map(|s| s.cidr.clone().unwrap_or_default()).collect();
        assert_eq!(got, ["172.20.64.0/18", "172.20.128.0/18", "172.20.0.0/24", ""]);
    }

    #[test]
    fn tenth_address() {
        assert_eq!(nth_address(cidr("100.64.0.0/13"), 10).to_string(), "100.64.0.10");
        assert_eq!(nth_address(cidr("fd00:5e4f:ce::/108"), 10).to_string(), "fd00:5e4f:ce::a");
    }
}
