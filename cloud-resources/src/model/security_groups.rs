//! The security-group builder: one group per instance-group role with the ingress rules of
//! [`crate::firewall`], and the API load balancer's group (unless the spec overrides it).

use std::collections::BTreeSet;

use keelson_api::generated::LoadBalancerAccessSpec;
use keelson_api::{InstanceGroup, Role};

use super::{role_plural, Context};
use crate::aws::{self, IngressRule, RuleSource, SecurityGroup, SecurityGroupRule};
use crate::firewall::{self, ApiAccess};
use crate::tasks::Link;

/// The instance-group roles, once each, sorted.
fn roles(cx: &Context<'_>) -> Vec<Role> {
    let mut roles: Vec<Role> = cx.instance_groups.iter().filter_map(InstanceGroup::role).collect();
    roles.sort();
    roles.dedup();
    roles
}

fn lb_group(cx: &Context<'_>) -> String {
    format!("api-elb.{}", cx.cluster)
}

/// The security groups the builder makes (links to others hold their ids).
pub struct Names(BTreeSet<String>);

impl Names {
    /// A link to a group by name: ours, or one the spec names (by id).
    pub fn link(&self, name: &str) -> Link<SecurityGroup> {
        if self.0.contains(name) {
            Link::to(name)
        } else {
            Link::existing(name, name)
        }
    }
}

/// The names of the groups [`build`] makes.
pub fn names(cx: &Context<'_>, lb: Option<&LoadBalancerAccessSpec>) -> Names {
    let mut names: BTreeSet<String> = roles(cx).into_iter().map(|r| firewall::group_name(r, cx.cluster)).collect();
    if lb.is_some_and(|lb| lb.security_group_override.is_none()) {
        names.insert(lb_group(cx));
    }
    Names(names)
}

pub fn build(cx: &Context<'_>, lb: Option<&LoadBalancerAccessSpec>, tasks: &mut aws::Tasks) {
    let cluster = cx.cluster;
    let lb_name = lb_group(cx);
    let api_access = match lb {
        // Behind a load balancer the API is reached through it (kOps: https-elb-to-master).
        Some(lb) => ApiAccess::LoadBalancer { group: lb.security_group_override.is_none().then(|| lb_name.clone()) },
        None => ApiAccess::Direct,
    };
    let roles = roles(cx);
    let mut ingress = firewall::role_ingress(cluster, cx.spec, &roles, &api_access);
    let mut push = |name: String, description: String, rules: Vec<IngressRule>| {
        tasks.push(SecurityGroup { tags: cx.tags(&name), name, vpc: cx.vpc.clone(), description, egress: vec![aws::EGRESS_ALL.to_string()] });
        for rule in rules {
            tasks.push(SecurityGroupRule { rule });
        }
    };
    for role in roles {
        push(firewall::group_name(role, cluster), format!("Security group for {}", role_plural(role)), ingress.remove(&role).unwrap_or_default());
    }
    if lb.is_some_and(|lb| lb.security_group_override.is_none()) {
        let mut rules: Vec<IngressRule> = cx
            .spec
            .kubernetes_api_access
            .iter()
            .flatten()
            .map(|c| IngressRule {
                group: Link::to(lb_name.clone()),
                protocol: "tcp".into(),
                from_port: crate::firewall::API_PORT,
                to_port: crate::firewall::API_PORT,
                source: RuleSource::Cidr(c.clone()),
            })
            .collect();
        rules.sort();
        rules.dedup();
        push(lb_name.clone(), "Security group for api ELB".into(), rules);
    }
}
