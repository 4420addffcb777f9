//! The network builder: the spec's subnets, and the tasks of a network apply creates — the VPC,
//! its subnets and their egress (kOps' layout: one internet gateway and one public route table for
//! the Public/Utility subnets; per zone with Private subnets a NAT gateway with its elastic IP in
//! that zone's Utility subnet and a private route table sending 0.0.0.0/0 to it). GCE: the network
//! and its subnetworks.

use std::collections::{BTreeMap, BTreeSet};

use super::{cluster_tags, CloudKind, Context, ModelError};
use crate::aws::{self, ElasticIp, InternetGateway, NatGateway, RouteTable, RouteTarget, Vpc};
use crate::gce::{self, gce_name};
use crate::tasks::Link;

/// A subnet of the spec, as the builders see it.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecSubnet {
    /// The spec's subnet name (`us-east-1a`).
    pub spec_name: String,
    /// `<spec name>.<cluster>`.
    pub cloud_name: String,
    pub zone: Option<String>,
    pub region: Option<String>,
    pub cidr: Option<String>,
    /// `Public`, `Private`, `Utility`, …
    pub kind: String,
    pub existing_id: Option<String>,
    /// `egress`: `nat-…`, `i-…` or `External` (routing left to the user).
    pub egress: Option<String>,
}

impl SpecSubnet {
    /// The link every task that sits in this subnet holds.
    pub fn link<T>(&self) -> Link<T> {
        match &self.existing_id {
            Some(id) => Link::existing(self.cloud_name.clone(), id.clone()),
            None => Link::to(self.cloud_name.clone()),
        }
    }
    pub fn is_public(&self) -> bool {
        matches!(self.kind.as_str(), "Public" | "Utility")
    }
}

/// The spec's subnets (AWS: each needs a CIDR and a zone unless the spec gives its id, and the
/// network a CIDR unless it gives the VPC's id).
pub fn spec_subnets(cluster: &str, spec: &keelson_api::generated::ClusterSpec, cloud: CloudKind) -> Result<Vec<SpecSubnet>, ModelError> {
    let missing = |field: String| ModelError::Missing { cluster: cluster.to_string(), field };
    let subnets: Vec<SpecSubnet> = spec
        .subnets
        .iter()
        .flatten()
        .map(|s| {
            let spec_name = s.name.clone().unwrap_or_default();
            SpecSubnet {
                cloud_name: format!("{spec_name}.{cluster}"),
                spec_name,
                zone: s.zone.clone(),
                region: s.region.clone(),
                cidr: s.cidr.clone(),
                kind: s.type_.clone().unwrap_or_else(|| "Public".into()),
                existing_id: s.id.clone(),
                egress: s.egress.clone(),
            }
        })
        .collect();
    if cloud == CloudKind::Aws {
        for s in &subnets {
            if s.existing_id.is_none() && (s.cidr.is_none() || s.zone.is_none()) {
                return Err(missing(format!("spec.subnets[{}].cidr and .zone (or .id)", s.spec_name)));
            }
        }
        if spec.network_id.is_none() && spec.network_cidr.is_none() {
            return Err(missing("spec.networkCIDR (or spec.networkID)".into()));
        }
    }
    Ok(subnets)
}

/// The VPC and subnets apply creates, and their routing (an existing VPC keeps its own).
pub fn build(cx: &Context<'_>, tasks: &mut aws::Tasks) -> Result<(), ModelError> {
    let cluster = cx.cluster;
    if cx.vpc.id().is_none() {
        tasks.push(Vpc {
            name: cluster.to_string(),
            cidr: cx.spec.network_cidr.map(|c| c.to_string()).unwrap_or_default(),
            dns_hostnames: true,
            tags: cluster_tags(cluster, cluster),
        });
    }
    for s in cx.subnets.iter().filter(|s| s.existing_id.is_none()) {
        let mut tags = cluster_tags(cluster, &s.cloud_name);
        tags.insert("SubnetType".into(), s.kind.clone());
        let role = if s.kind == "Private" { "kubernetes.io/role/internal-elb" } else { "kubernetes.io/role/elb" };
        tags.insert(role.into(), "1".into());
        tasks.push(aws::Subnet {
            name: s.cloud_name.clone(),
            cidr: s.cidr.clone().unwrap_or_default(),
            zone: s.zone.clone().unwrap_or_default(),
            vpc: cx.vpc.clone(),
            map_public_ip: s.is_public(),
            tags,
        });
    }
    if cx.vpc.id().is_none() {
        routing(cluster, &cx.vpc, &cx.subnets, tasks)?;
    }
    Ok(())
}

/// The egress of a VPC apply creates (see the module's documentation).
fn routing(cluster: &str, vpc: &Link<Vpc>, subnets: &[SpecSubnet], tasks: &mut aws::Tasks) -> Result<(), ModelError> {
    let tags = |name: &str, role: &str| {
        let mut t = cluster_tags(cluster, name);
        t.insert("kubernetes.io/kops/role".into(), role.into());
        t
    };
    tasks.push(InternetGateway { name: cluster.to_string(), vpc: Some(vpc.clone()), tags: cluster_tags(cluster, cluster) });
    let igw = Link::<InternetGateway>::to(cluster);
    let mut route_tables = vec![RouteTable {
        name: cluster.to_string(),
        vpc: vpc.clone(),
        routes: BTreeMap::from([("0.0.0.0/0".to_string(), RouteTarget::InternetGateway(igw))]),
        subnets: subnets.iter().filter(|s| s.is_public()).map(SpecSubnet::link).collect(),
        tags: tags(cluster, "public"),
    }];
    let mut private_zones: BTreeMap<String, Vec<&SpecSubnet>> = BTreeMap::new();
    for s in subnets.iter().filter(|s| matches!(s.kind.as_str(), "Private" | "DualStack")) {
        if s.egress.as_deref() == Some("External") {
            continue;
        }
        private_zones.entry(s.zone.clone().unwrap_or_default()).or_default().push(s);
    }
    for (zone, private) in private_zones {
        let name = format!("private-{zone}.{cluster}");
        // One egress per zone: the first subnet that names one wins, else a NAT gateway we create.
        let target = match private.iter().find_map(|s| s.egress.clone()) {
            Some(e) if e.starts_with("nat-") => RouteTarget::ExistingNatGateway(e),
            Some(e) if e.starts_with("i-") => RouteTarget::Instance(e),
            Some(e) => {
                return Err(ModelError::Field {
                    cluster: cluster.to_string(),
                    field: format!("spec.subnets[{}].egress", private[0].spec_name),
                    message: format!("{e:?}: keelson apply supports nat-… (existing NAT gateway), i-… (NAT instance) or External"),
                })
            }
            None => {
                let utility = subnets.iter().find(|u| u.is_public() && u.zone.as_deref() == Some(zone.as_str())).ok_or_else(|| ModelError::Missing {
                    cluster: cluster.to_string(),
                    field: format!(
                        "spec.subnets: a Utility subnet in {zone} for the NAT gateway of private subnet {} (or set its egress)",
                        private[0].spec_name
                    ),
                })?;
                let nat = format!("{zone}.{cluster}");
                tasks.push(ElasticIp { name: nat.clone(), domain: "vpc".into(), tags: cluster_tags(cluster, &nat) });
                tasks.push(NatGateway { name: nat.clone(), subnet: utility.link(), eip: Link::to(nat.clone()), tags: cluster_tags(cluster, &nat) });
                RouteTarget::NatGateway(Link::to(nat))
            }
        };
        route_tables.push(RouteTable {
            name: name.clone(),
            vpc: vpc.clone(),
            routes: BTreeMap::from([("0.0.0.0/0".to_string(), target)]),
            subnets: private.iter().map(|s| s.link()).collect::<BTreeSet<_>>(),
            tags: tags(&name, &format!("private-{zone}")),
        });
    }
    for t in route_tables {
        tasks.push(t);
    }
    Ok(())
}

/// GCE: the network (unless the spec names one) and the subnetworks apply creates.
pub fn build_gce(cx: &Context<'_>, tasks: &mut gce::Tasks) {
    let network: Link<gce::Network> = match cx.vpc.id() {
        Some(id) => Link::existing(id, id),
        None => {
            tasks.push(gce::Network { name: cx.cluster.to_string(), gce_name: gce_name(cx.cluster) });
            Link::to(cx.cluster)
        }
    };
    for s in cx.subnets.iter().filter(|s| s.existing_id.is_none()) {
        tasks.push(gce::Subnetwork {
            name: s.cloud_name.clone(),
            gce_name: gce_name(&format!("{}-{}", s.spec_name, cx.cluster)),
            network: network.clone(),
            region: s.region.clone().unwrap_or_else(|| cx.region.to_string()),
            cidr: s.cidr.clone().unwrap_or_default(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subnet(name: &str, zone: &str, kind: &str, egress: Option<&str>) -> SpecSubnet {
        SpecSubnet {
            spec_name: name.into(),
            cloud_name: format!("{name}.c"),
            zone: Some(zone.into()),
            region: None,
            cidr: Some("10.0.0.0/24".into()),
            kind: kind.into(),
            existing_id: None,
            egress: egress.map(str::to_string),
        }
    }

    fn routing_of(subnets: &[SpecSubnet]) -> Result<aws::Tasks, ModelError> {
        let mut tasks = aws::Tasks::default();
        routing("c", &Link::to("c"), subnets, &mut tasks)?;
        Ok(tasks)
    }

    #[test]
    fn private_zones_get_a_nat_in_their_utility_subnet_or_the_egress_they_name() {
        let r = routing_of(&[
            subnet("a", "z-1a", "Private", None),
            subnet("ua", "z-1a", "Utility", None),
            subnet("b", "z-1b", "Private", Some("nat-0123")),
            subnet("c", "z-1c", "Private", Some("i-0456")),
            subnet("d", "z-1d", "Private", Some("External")),
        ])
        .expect("routing");
        assert_eq!(r.nat_gateways.len(), 1);
        assert_eq!(r.nat_gateways[0].subnet, "ua.c".to_string());
        assert_eq!(r.route_tables[0].subnets.iter().map(|s| s.to_string()).collect::<Vec<_>>(), vec!["ua.c".to_string()]);
        let targets: Vec<String> = r.route_tables.iter().map(|t| t.routes["0.0.0.0/0"].label()).collect();
        assert_eq!(targets, ["igw:c", "nat:z-1a.c", "nat-id:nat-0123", "instance:i-0456"]);
        assert!(r.route_tables.iter().all(|t| !t.subnets.iter().any(|s| s.name() == "d.c")), "External is left alone");
    }

    #[test]
    fn a_private_zone_without_utility_subnet_or_egress_is_an_error_naming_it() {
        let e = routing_of(&[subnet("a", "z-1a", "Private", None)]).expect_err("no NAT home");
        assert!(e.to_string().contains("Utility subnet in z-1a"), "{e}");
        let e = routing_of(&[subnet("a", "z-1a", "Private", Some("tgw-1"))]).expect_err("unsupported egress");
        assert!(e.to_string().contains("spec.subnets[a].egress"), "{e}");
    }
}
