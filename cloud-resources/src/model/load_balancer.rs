//! The load-balancer builder: the API's network load balancer of `spec.api.loadBalancer` (class
//! Network, kOps' NLB layout) with its TCP 443 listener and target group.

use std::collections::{BTreeMap, BTreeSet};

use keelson_api::generated::LoadBalancerAccessSpec;
use keelson_api::Role;

use super::security_groups::Names;
use super::{truncate_name, CloudKind, Context, ModelError, SpecSubnet};
use crate::aws::{self, Listener, LoadBalancer, Subnet, TargetGroup, DEREGISTRATION_DELAY, HEALTH_CHECK};
use crate::tasks::Link;

/// What the other builders need of the API load balancer.
#[derive(Debug, Clone)]
pub struct ApiLoadBalancer {
    /// `api.<cluster>` (the alias records point at it).
    pub link: Link<LoadBalancer>,
    /// `useForInternalApi`: `api.internal.<cluster>` is an alias to it too.
    pub use_for_internal_api: bool,
}

/// `spec.api.loadBalancer` (AWS only).
pub fn spec<'a>(cx: &Context<'a>) -> Option<&'a LoadBalancerAccessSpec> {
    cx.spec.api.as_ref().and_then(|a| a.load_balancer.as_ref()).filter(|_| cx.cloud == CloudKind::Aws)
}

pub use keelson_api::names::api_target_group_name as target_group_name;

/// The load balancer and its target group (the control-plane groups link to it).
pub fn build(cx: &Context<'_>, lb: &LoadBalancerAccessSpec, names: &Names, tasks: &mut aws::Tasks) -> Result<ApiLoadBalancer, ModelError> {
    let cluster = cx.cluster;
    let field =
        |f: &str, message: &str| ModelError::Field { cluster: cluster.to_string(), field: format!("spec.api.loadBalancer.{f}"), message: message.to_string() };
    match lb.class.as_deref() {
        Some("Network") => {}
        Some("Classic") | None => {
            return Err(field("class", "Classic: AWS Classic Load Balancers are no longer supported for the API (as in kOps); set class: Network"))
        }
        Some(other) => return Err(field("class", &format!("{other:?}: expected Network"))),
    }
    if lb.ssl_certificate.is_some() {
        return Err(field("sslCertificate", "a TLS listener is not supported by keelson apply yet; remove it"));
    }
    let internal = match lb.type_.as_deref() {
        Some("Public") | None => false,
        Some("Internal") => true,
        Some(other) => return Err(field("type", &format!("{other:?}: expected Public or Internal"))),
    };
    if internal && lb.use_for_internal_api == Some(true) {
        return Err(field("useForInternalApi", "cannot be used with an internal network load balancer (no hairpinning), as in kOps"));
    }
    let subnets: Vec<Link<Subnet>> = match &lb.subnets {
        Some(list) if !list.is_empty() => list
            .iter()
            .map(|s| {
                let n = s.name.clone().unwrap_or_default();
                cx.subnet(&n).map(SpecSubnet::link).ok_or_else(|| field("subnets", &format!("no subnet named {n:?} in spec.subnets")))
            })
            .collect::<Result<_, _>>()?,
        _ => {
            // One subnet per zone: Public/Utility for a public balancer, Private/DualStack for an
            // internal one; Utility first, then subnets the control plane uses, then by name.
            let cp_subnets: Vec<String> =
                cx.instance_groups.iter().filter(|g| g.role() == Some(Role::ControlPlane)).flat_map(|g| g.spec.subnets.clone().unwrap_or_default()).collect();
            let mut best: BTreeMap<String, (i32, &SpecSubnet)> = BTreeMap::new();
            for s in &cx.subnets {
                let score = match (internal, s.kind.as_str()) {
                    (false, "Utility") => 3,
                    (false, "Public") => 0,
                    (true, "DualStack") => 2,
                    (true, "Private") => 0,
                    _ => continue,
                } + i32::from(cp_subnets.contains(&s.spec_name));
                let zone = s.zone.clone().unwrap_or_default();
                let better = match best.get(&zone) {
                    None => true,
                    Some((b, cur)) => score > *b || (score == *b && s.spec_name < cur.spec_name),
                };
                if better {
                    best.insert(zone, (score, s));
                }
            }
            best.values().map(|(_, s)| s.link()).collect()
        }
    };
    if subnets.is_empty() {
        return Err(field("type", &format!("no {} subnet for the load balancer", if internal { "Private" } else { "Public or Utility" })));
    }
    let mut security_groups = vec![lb.security_group_override.clone().unwrap_or_else(|| format!("api-elb.{cluster}"))];
    security_groups.extend(lb.additional_security_groups.clone().unwrap_or_default());
    let name = format!("api.{cluster}");
    let target_group = target_group_name(cluster);
    tasks.push(TargetGroup {
        name: target_group.clone(),
        protocol: "TCP".into(),
        port: keelson_api::ports::KUBE_API.into(),
        vpc: cx.vpc.clone(),
        health_check: HEALTH_CHECK.into(),
        deregistration_delay: DEREGISTRATION_DELAY.into(),
        tags: cx.tags(&target_group),
    });
    tasks.push(LoadBalancer {
        name: name.clone(),
        aws_name: truncate_name(&format!("api-{}", cluster.replace('.', "-")), 32, true),
        lb_type: "network".into(),
        scheme: if internal { "internal" } else { "internet-facing" }.into(),
        subnets,
        security_groups: security_groups.iter().map(|s| names.link(s)).collect(),
        cross_zone: lb.cross_zone_load_balancing.unwrap_or(false),
        listeners: BTreeSet::from([Listener { port: keelson_api::ports::KUBE_API.into(), protocol: "TCP".into(), target_group: Link::to(target_group) }]),
        tags: cx.tags(&name),
    });
    Ok(ApiLoadBalancer { link: Link::to(name), use_for_internal_api: lb.use_for_internal_api == Some(true) })
}
