//! The API's network load balancer: its TCP 443 target group (which the control-plane autoscaling
//! groups register with) and the balancer with its listener (the alias records `api.<cluster>` are
//! [`super::dns_record`]'s).
//!
//! Load balancers and target groups are found through their tags (DescribeTags, 20 ARNs a call).

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_elasticloadbalancingv2::types as elb_t;
use serde_json::json;

use super::network::{Subnet, Vpc};
use super::security_group::SecurityGroup;
use super::task::{AwsFuture, AwsTask, Exec, Typed};
use super::terraform::{tags_value, AwsTerraform};
use super::{api, name_of, required, resolve_all, AwsError, AwsLinked, AwsTarget, Discovered, Ids, Resolved};
use crate::model::ClusterModel;
use crate::plan::{Action, Change, Kind};
use crate::tasks::{joined_links, Fields, Link, Linked};

/// kOps' target-group settings: TCP health checks every 10 s, 2 to flip, 30 s deregistration delay.
pub const HEALTH_CHECK: &str = "TCP interval=10 healthy=2 unhealthy=2";
pub const DEREGISTRATION_DELAY: &str = "30";

fn missing(kind: &'static str, name: &str, message: String) -> AwsError {
    AwsError::Missing { kind, name: name.to_string(), message }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetGroup {
    pub name: String,
    pub protocol: String,
    pub port: i32,
    pub vpc: Link<Vpc>,
    /// `TCP interval=10 healthy=2 unhealthy=2`.
    pub health_check: String,
    /// Seconds, as the API's attribute says it.
    pub deregistration_delay: String,
    pub tags: BTreeMap<String, String>,
}

impl Linked for TargetGroup {
    const TF_TYPE: &'static str = "aws_lb_target_group";
    const TF_ATTR: &'static str = "arn";
}

impl AwsLinked for TargetGroup {
    const KIND: Kind = Kind::TargetGroup;
    fn lookup(ids: &Ids, name: &str) -> Option<String> {
        ids.target_groups.get(name).cloned()
    }
}

/// A listener: port and protocol, forwarding to a target group.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Listener {
    pub port: i32,
    pub protocol: String,
    pub target_group: Link<TargetGroup>,
}

impl std::fmt::Display for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}->{}", self.port, self.protocol, self.target_group)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadBalancer {
    /// The `Name` tag: `api.<cluster>`.
    pub name: String,
    pub aws_name: String,
    pub lb_type: String,
    pub scheme: String,
    /// Its subnets (in the spec's order).
    pub subnets: Vec<Link<Subnet>>,
    /// Its security groups (ours, or ids the spec gives).
    pub security_groups: Vec<Link<SecurityGroup>>,
    pub cross_zone: bool,
    pub listeners: BTreeSet<Listener>,
    pub tags: BTreeMap<String, String>,
}

impl Linked for LoadBalancer {
    const TF_TYPE: &'static str = "aws_lb";
    const TF_ATTR: &'static str = "arn";
}

/// Fields an update changes that cannot change in place: an error naming them.
fn immutable(c: &Typed<'_, impl crate::tasks::Member<super::Task>>, list: &[&str]) -> Result<(), AwsError> {
    let hit: Vec<&str> = list.iter().copied().filter(|f| c.changed(f)).collect();
    if hit.is_empty() {
        Ok(())
    } else {
        Err(missing(c.kind.as_str(), c.name, format!("{} cannot change in place; delete the {} and apply again", hit.join(", "), c.kind.as_str())))
    }
}

impl AwsTask for TargetGroup {
    fn kind(&self) -> Kind {
        Kind::TargetGroup
    }
    fn name(&self) -> String {
        self.name.clone()
    }
    fn tags(&self) -> BTreeMap<String, String> {
        self.tags.clone()
    }
    fn fields(&self, f: &mut Fields) {
        f.set("protocol", &self.protocol)
            .set("port", self.port)
            .set("vpc", &self.vpc)
            .set("health_check", &self.health_check)
            .set("deregistration_delay", &self.deregistration_delay);
    }
    fn find<'a>(t: &'a AwsTarget, model: &'a ClusterModel, _resolved: &'a Resolved, d: &'a mut Discovered) -> AwsFuture<'a> {
        Box::pin(discover_target_groups(t, model, d))
    }
    fn render_terraform(&self, t: &mut AwsTerraform) {
        t.blocks.add(
            "aws_lb_target_group",
            &self.name,
            json!({
                "name": self.name,
                "port": self.port,
                "protocol": self.protocol,
                "vpc_id": self.vpc.tf(),
                "deregistration_delay": self.deregistration_delay,
                "connection_termination": true,
                "health_check": {"protocol": "TCP", "interval": 10, "healthy_threshold": 2, "unhealthy_threshold": 2},
                "tags": tags_value(&self.tags),
            }),
        );
    }
    fn render_aws<'a>(&'a self, cx: Exec<'a>, c: &'a Change) -> AwsFuture<'a> {
        Box::pin(async move {
            let c = Typed::<TargetGroup>::of(c);
            let (t, name) = (cx.target, c.name);
            match c.action {
                Action::Create => {
                    let want = c.want()?;
                    let vpc = cx.ids.vpc.clone().ok_or_else(|| missing("VPC", &cx.model.network.name, format!("needed by target group {name}")))?;
                    let resp = t
                        .elb
                        .create_target_group()
                        .name(name)
                        .protocol(elb_t::ProtocolEnum::Tcp)
                        .port(want.port)
                        .vpc_id(vpc)
                        .target_type(elb_t::TargetTypeEnum::Instance)
                        .health_check_protocol(elb_t::ProtocolEnum::Tcp)
                        .health_check_interval_seconds(10)
                        .healthy_threshold_count(2)
                        .unhealthy_threshold_count(2)
                        .set_tags(Some(elb_tags(&want.tags)))
                        .send()
                        .await
                        .map_err(|e| api("CreateTargetGroup", name, e))?;
                    let arn = required(resp.target_groups().first().and_then(|g| g.target_group_arn()), "TargetGroup", name, "TargetGroupArn")?.to_string();
                    cx.ids.target_groups.insert(name.to_string(), arn.clone());
                    t.target_group_attributes(&arn, name).await?;
                }
                Action::Update(_) => {
                    let want = c.want()?;
                    let actual_id = c.id()?;
                    immutable(&c, &["protocol", "port", "vpc"])?;
                    if c.changed("health_check") {
                        t.elb
                            .modify_target_group()
                            .target_group_arn(&actual_id)
                            .health_check_protocol(elb_t::ProtocolEnum::Tcp)
                            .health_check_interval_seconds(10)
                            .healthy_threshold_count(2)
                            .unhealthy_threshold_count(2)
                            .send()
                            .await
                            .map_err(|e| api("ModifyTargetGroup", name, e))?;
                    }
                    if c.changed("deregistration_delay") {
                        t.target_group_attributes(&actual_id, name).await?;
                    }
                    if c.tags_changed() {
                        t.elb.add_tags().resource_arns(&actual_id).set_tags(Some(elb_tags(&want.tags))).send().await.map_err(|e| api("AddTags", name, e))?;
                    }
                }
                Action::Delete => {
                    let actual_id = c.id()?;
                    t.delete_with_retry(name, || async {
                        t.elb.delete_target_group().target_group_arn(&actual_id).send().await.map(|_| ()).map_err(|e| api("DeleteTargetGroup", name, e))
                    })
                    .await?;
                }
            }
            Ok(())
        })
    }
}

impl AwsTask for LoadBalancer {
    fn kind(&self) -> Kind {
        Kind::LoadBalancer
    }
    fn name(&self) -> String {
        self.name.clone()
    }
    fn tags(&self) -> BTreeMap<String, String> {
        self.tags.clone()
    }
    fn fields(&self, f: &mut Fields) {
        let listeners: Vec<String> = self.listeners.iter().map(Listener::to_string).collect();
        f.set("aws_name", &self.aws_name)
            .set("type", &self.lb_type)
            .set("scheme", &self.scheme)
            .set("subnets", joined_links(&self.subnets))
            .set("security_groups", joined_links(&self.security_groups))
            .set("cross_zone", self.cross_zone)
            .set("listeners", listeners.join(","));
    }
    fn find<'a>(t: &'a AwsTarget, model: &'a ClusterModel, _resolved: &'a Resolved, d: &'a mut Discovered) -> AwsFuture<'a> {
        Box::pin(discover_load_balancers(t, model, d))
    }
    fn render_terraform(&self, t: &mut AwsTerraform) {
        let balancer = t.blocks.add(
            "aws_lb",
            &self.name,
            json!({
                "name": self.aws_name,
                "internal": self.scheme == "internal",
                "load_balancer_type": self.lb_type,
                "subnets": self.subnets.iter().map(|s| s.tf()).collect::<Vec<_>>(),
                "security_groups": self.security_groups.iter().map(|s| s.tf()).collect::<Vec<_>>(),
                "enable_cross_zone_load_balancing": self.cross_zone,
                "tags": tags_value(&self.tags),
            }),
        );
        for l in &self.listeners {
            t.blocks.add(
                "aws_lb_listener",
                &format!("{}-{}", self.name, l.port),
                json!({
                    "load_balancer_arn": crate::terraform_json::r(&balancer, "arn"),
                    "port": l.port,
                    "protocol": l.protocol,
                    "default_action": [{"type": "forward", "target_group_arn": l.target_group.tf()}],
                }),
            );
        }
    }
    fn render_aws<'a>(&'a self, cx: Exec<'a>, c: &'a Change) -> AwsFuture<'a> {
        Box::pin(async move {
            let c = Typed::<LoadBalancer>::of(c);
            let (t, name) = (cx.target, c.name);
            match c.action {
                Action::Create => {
                    let want = c.want()?;
                    let subnets = resolve_all(&want.subnets, cx.ids, name)?;
                    let sgs = resolve_all(&want.security_groups, cx.ids, name)?;
                    let resp = t
                        .elb
                        .create_load_balancer()
                        .name(&want.aws_name)
                        .r#type(elb_t::LoadBalancerTypeEnum::Network)
                        .scheme(elb_t::LoadBalancerSchemeEnum::from(want.scheme.as_str()))
                        .set_subnets(Some(subnets))
                        .set_security_groups(Some(sgs))
                        .set_tags(Some(elb_tags(&want.tags)))
                        .send()
                        .await
                        .map_err(|e| api("CreateLoadBalancer", name, e))?;
                    let lb = resp.load_balancers().first().ok_or_else(|| missing("LoadBalancer", name, "CreateLoadBalancer returned nothing".into()))?;
                    let arn = required(lb.load_balancer_arn(), "LoadBalancer", name, "LoadBalancerArn")?.to_string();
                    cx.ids.load_balancers.insert(
                        name.to_string(),
                        (
                            arn.clone(),
                            required(lb.dns_name(), "LoadBalancer", name, "DNSName")?.to_string(),
                            required(lb.canonical_hosted_zone_id(), "LoadBalancer", name, "CanonicalHostedZoneId")?.to_string(),
                        ),
                    );
                    t.cross_zone(&arn, name, want.cross_zone).await?;
                    t.create_listeners(&arn, name, &want.listeners, cx.ids).await?;
                }
                Action::Update(_) => {
                    let want = c.want()?;
                    let actual_id = c.id()?;
                    immutable(&c, &["aws_name", "type", "scheme"])?;
                    if c.changed("subnets") {
                        let subnets = resolve_all(&want.subnets, cx.ids, name)?;
                        t.elb.set_subnets().load_balancer_arn(&actual_id).set_subnets(Some(subnets)).send().await.map_err(|e| api("SetSubnets", name, e))?;
                    }
                    if c.changed("security_groups") {
                        let sgs = resolve_all(&want.security_groups, cx.ids, name)?;
                        t.elb
                            .set_security_groups()
                            .load_balancer_arn(&actual_id)
                            .set_security_groups(Some(sgs))
                            .send()
                            .await
                            .map_err(|e| api("SetSecurityGroups", name, e))?;
                    }
                    if c.changed("cross_zone") {
                        t.cross_zone(&actual_id, name, want.cross_zone).await?;
                    }
                    if c.changed("listeners") {
                        let listeners = t.elb.describe_listeners().load_balancer_arn(&actual_id).send().await.map_err(|e| api("DescribeListeners", name, e))?;
                        for l in listeners.listeners() {
                            if let Some(arn) = l.listener_arn() {
                                t.elb.delete_listener().listener_arn(arn).send().await.map_err(|e| api("DeleteListener", name, e))?;
                            }
                        }
                        t.create_listeners(&actual_id, name, &want.listeners, cx.ids).await?;
                    }
                    if c.tags_changed() {
                        t.elb.add_tags().resource_arns(&actual_id).set_tags(Some(elb_tags(&want.tags))).send().await.map_err(|e| api("AddTags", name, e))?;
                    }
                }
                Action::Delete => {
                    let actual_id = c.id()?;
                    t.elb.delete_load_balancer().load_balancer_arn(&actual_id).send().await.map_err(|e| api("DeleteLoadBalancer", name, e))?;
                    cx.ids.load_balancers.remove(name);
                }
            }
            Ok(())
        })
    }
}

fn elb_tags(tags: &BTreeMap<String, String>) -> Vec<elb_t::Tag> {
    tags.iter().map(|(k, v)| elb_t::Tag::builder().key(k).value(v).build()).collect()
}

/// ARNs (of one listing) whose tags say they belong to the cluster, with their tags.
async fn tagged(t: &AwsTarget, cluster: &str, arns: Vec<String>) -> Result<BTreeMap<String, BTreeMap<String, String>>, AwsError> {
    let mut out = BTreeMap::new();
    for chunk in arns.chunks(20) {
        let resp = t.elb.describe_tags().set_resource_arns(Some(chunk.to_vec())).send().await.map_err(|e| api("DescribeTags", cluster, e))?;
        for d in resp.tag_descriptions() {
            let tags: BTreeMap<String, String> = d.tags().iter().filter_map(|t| Some((t.key()?.to_string(), t.value().unwrap_or("").to_string()))).collect();
            if tags.get("KubernetesCluster").map(String::as_str) == Some(cluster) {
                out.insert(d.resource_arn().unwrap_or_default().to_string(), tags);
            }
        }
    }
    Ok(out)
}

/// Target groups tagged for the cluster.
async fn discover_target_groups(t: &AwsTarget, model: &ClusterModel, d: &mut Discovered) -> Result<(), AwsError> {
    let cluster = &model.cluster;
    let vpc_link = |ids: &Ids, id: &str| -> Link<Vpc> {
        if ids.vpc.as_deref() == Some(id) && model.network.vpc.id().is_none() {
            Link::to(model.network.name.clone())
        } else {
            Link::to(id)
        }
    };

    let groups = t.elb.describe_target_groups().into_paginator().items().send().try_collect().await.map_err(|e| api("DescribeTargetGroups", cluster, e))?;
    let ours = tagged(t, cluster, groups.iter().filter_map(|g| g.target_group_arn().map(str::to_string)).collect()).await?;
    for g in groups {
        let Some(arn) = g.target_group_arn().map(str::to_string) else { continue };
        let Some(tags) = ours.get(&arn) else { continue };
        let name = required(g.target_group_name(), "TargetGroup", &arn, "TargetGroupName")?.to_string();
        let attrs = t.elb.describe_target_group_attributes().target_group_arn(&arn).send().await.map_err(|e| api("DescribeTargetGroupAttributes", &name, e))?;
        let delay =
            attrs.attributes().iter().find(|a| a.key() == Some("deregistration_delay.timeout_seconds")).and_then(|a| a.value()).unwrap_or("300").to_string();
        let health = format!(
            "{} interval={} healthy={} unhealthy={}",
            g.health_check_protocol().map(|p| p.as_str()).unwrap_or(""),
            g.health_check_interval_seconds().unwrap_or_default(),
            g.healthy_threshold_count().unwrap_or_default(),
            g.unhealthy_threshold_count().unwrap_or_default()
        );
        d.ids.target_groups.insert(name.clone(), arn.clone());
        let tg = TargetGroup {
            protocol: g.protocol().map(|p| p.as_str()).unwrap_or("").to_string(),
            port: g.port().ok_or_else(|| missing("TargetGroup", &name, "the API returned no Port".into()))?,
            vpc: vpc_link(&d.ids, required(g.vpc_id(), "TargetGroup", &name, "VpcId")?),
            health_check: health,
            deregistration_delay: delay,
            tags: tags.clone(),
            name,
        };
        d.found(tg, arn);
    }
    Ok(())
}

/// Load balancers tagged for the cluster. Needs subnet, security-group and target-group ids.
async fn discover_load_balancers(t: &AwsTarget, model: &ClusterModel, d: &mut Discovered) -> Result<(), AwsError> {
    let cluster = &model.cluster;
    let lbs = t.elb.describe_load_balancers().into_paginator().items().send().try_collect().await.map_err(|e| api("DescribeLoadBalancers", cluster, e))?;
    let ours = tagged(t, cluster, lbs.iter().filter_map(|l| l.load_balancer_arn().map(str::to_string)).collect()).await?;
    for lb in lbs {
        let Some(arn) = lb.load_balancer_arn().map(str::to_string) else { continue };
        let Some(tags) = ours.get(&arn) else { continue };
        let aws_name = required(lb.load_balancer_name(), "LoadBalancer", &arn, "LoadBalancerName")?.to_string();
        let name = tags.get("Name").cloned().unwrap_or_else(|| aws_name.clone());
        let attrs =
            t.elb.describe_load_balancer_attributes().load_balancer_arn(&arn).send().await.map_err(|e| api("DescribeLoadBalancerAttributes", &name, e))?;
        let cross_zone = match attrs.attributes().iter().find(|a| a.key() == Some("load_balancing.cross_zone.enabled")).and_then(|a| a.value()) {
            None | Some("false") => false,
            Some("true") => true,
            Some(other) => return Err(missing("LoadBalancer", &name, format!("load_balancing.cross_zone.enabled is {other:?}, not true or false"))),
        };
        let listeners = t.elb.describe_listeners().load_balancer_arn(&arn).send().await.map_err(|e| api("DescribeListeners", &name, e))?;
        let mut listener_set = BTreeSet::new();
        for l in listeners.listeners() {
            let target_group =
                l.default_actions().iter().find_map(|a| a.target_group_arn()).map(|arn| Link::to(name_of(&d.ids.target_groups, arn))).unwrap_or_default();
            let port = l.port().ok_or_else(|| missing("LoadBalancer", &name, "a listener has no Port".into()))?;
            listener_set.insert(Listener { port, protocol: l.protocol().map(|p| p.as_str()).unwrap_or("").to_string(), target_group });
        }
        d.ids.load_balancers.insert(
            name.clone(),
            (
                arn.clone(),
                required(lb.dns_name(), "LoadBalancer", &name, "DNSName")?.to_string(),
                required(lb.canonical_hosted_zone_id(), "LoadBalancer", &name, "CanonicalHostedZoneId")?.to_string(),
            ),
        );
        let balancer = LoadBalancer {
            aws_name,
            lb_type: lb.r#type().map(|t| t.as_str()).unwrap_or("").to_string(),
            scheme: lb.scheme().map(|s| s.as_str()).unwrap_or("").to_string(),
            subnets: lb.availability_zones().iter().filter_map(|z| z.subnet_id()).map(|s| Link::to(d.ids.subnet_name(s))).collect(),
            security_groups: lb.security_groups().iter().map(|s| Link::to(d.ids.sg_name(s))).collect(),
            cross_zone,
            listeners: listener_set,
            tags: tags.clone(),
            name,
        };
        d.found(balancer, arn);
    }
    Ok(())
}

impl AwsTarget {
    async fn target_group_attributes(&self, arn: &str, name: &str) -> Result<(), AwsError> {
        self.elb
            .modify_target_group_attributes()
            .target_group_arn(arn)
            .attributes(elb_t::TargetGroupAttribute::builder().key("deregistration_delay.timeout_seconds").value(DEREGISTRATION_DELAY).build())
            .attributes(elb_t::TargetGroupAttribute::builder().key("deregistration_delay.connection_termination.enabled").value("true").build())
            .send()
            .await
            .map_err(|e| api("ModifyTargetGroupAttributes", name, e))?;
        Ok(())
    }

    async fn cross_zone(&self, arn: &str, name: &str, enabled: bool) -> Result<(), AwsError> {
        self.elb
            .modify_load_balancer_attributes()
            .load_balancer_arn(arn)
            .attributes(elb_t::LoadBalancerAttribute::builder().key("load_balancing.cross_zone.enabled").value(enabled.to_string()).build())
            .send()
            .await
            .map_err(|e| api("ModifyLoadBalancerAttributes", name, e))?;
        Ok(())
    }

    /// TCP listeners forwarding to target groups.
    async fn create_listeners(&self, arn: &str, name: &str, listeners: &BTreeSet<Listener>, ids: &Ids) -> Result<(), AwsError> {
        for l in listeners {
            let tg_arn = l.target_group.resolve(ids, &format!("listener of {name}"))?;
            self.elb
                .create_listener()
                .load_balancer_arn(arn)
                .protocol(elb_t::ProtocolEnum::from(l.protocol.as_str()))
                .port(l.port)
                .default_actions(elb_t::Action::builder().r#type(elb_t::ActionTypeEnum::Forward).target_group_arn(tg_arn).build())
                .send()
                .await
                .map_err(|e| api("CreateListener", name, e))?;
        }
        Ok(())
    }
}
