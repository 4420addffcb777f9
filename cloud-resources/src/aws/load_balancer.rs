//! The API's network load balancer: its TCP 443 target group (which the control-plane autoscaling
//! groups register with), the balancer with its listener, and the alias record `api.<cluster>`.
//!
//! Load balancers and target groups are found through their tags (DescribeTags, 20 ARNs a call).

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_elasticloadbalancingv2::types as elb_t;
use aws_sdk_route53::types as r53_t;

use super::task::{actual_id, joined, typed, Fields, Task};
use super::{api, ids_for, name_of, required, AwsError, AwsTarget, Discovered, Ids, MAX_PAGES};
use crate::model::ClusterModel;
use crate::plan::{Action, Change, Kind, Resource};

/// kOps' target-group settings: TCP health checks every 10 s, 2 to flip, 30 s deregistration delay.
const HEALTH_CHECK: &str = "TCP interval=10 healthy=2 unhealthy=2";
const DEREGISTRATION_DELAY: &str = "30";

fn missing(kind: &'static str, name: &str, message: String) -> AwsError {
    AwsError::Missing { kind, name: name.to_string(), message }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetGroup {
    pub name: String,
    pub protocol: String,
    pub port: i32,
    pub vpc: String,
    /// `TCP interval=10 healthy=2 unhealthy=2`.
    pub health_check: String,
    /// Seconds, as the API's attribute says it.
    pub deregistration_delay: String,
    pub tags: BTreeMap<String, String>,
}

impl TargetGroup {
    pub fn fields(&self, f: &mut Fields) {
        f.set("protocol", &self.protocol)
            .set("port", self.port)
            .set("vpc", &self.vpc)
            .set("health_check", &self.health_check)
            .set("deregistration_delay", &self.deregistration_delay);
    }
}

/// A listener: port and protocol, forwarding to a target group (by name).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Listener {
    pub port: i32,
    pub protocol: String,
    pub target_group: String,
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
    pub subnets: BTreeSet<String>,
    pub security_groups: BTreeSet<String>,
    pub cross_zone: bool,
    pub listeners: BTreeSet<Listener>,
    pub tags: BTreeMap<String, String>,
}

impl LoadBalancer {
    pub fn fields(&self, f: &mut Fields) {
        let listeners: Vec<String> = self.listeners.iter().map(Listener::to_string).collect();
        f.set("aws_name", &self.aws_name)
            .set("type", &self.lb_type)
            .set("scheme", &self.scheme)
            .set("subnets", joined(&self.subnets))
            .set("security_groups", joined(&self.security_groups))
            .set("cross_zone", self.cross_zone)
            .set("listeners", listeners.join(","));
    }
}

/// An alias A record pointing at a load balancer (its model name, or the DNS name it points at when
/// that is not ours).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AliasRecord {
    pub name: String,
    pub target: String,
}

impl AliasRecord {
    pub fn fields(&self, f: &mut Fields) {
        f.set("type", "A").set("alias", &self.target);
    }
}

pub(super) fn desired(model: &ClusterModel, out: &mut Vec<Resource>) {
    let Some(lb) = &model.load_balancer else { return };
    let vpc = model.network.existing_id.clone().unwrap_or_else(|| model.network.name.clone());
    let tg = TargetGroup {
        name: lb.target_group.clone(),
        protocol: "TCP".into(),
        port: 443,
        vpc,
        health_check: HEALTH_CHECK.into(),
        deregistration_delay: DEREGISTRATION_DELAY.into(),
        tags: lb.target_group_tags.clone(),
    };
    out.push(Task::TargetGroup(tg).view(None));
    let balancer = LoadBalancer {
        name: lb.name.clone(),
        aws_name: lb.aws_name.clone(),
        lb_type: "network".into(),
        scheme: if lb.internal { "internal" } else { "internet-facing" }.into(),
        subnets: lb.subnets.iter().cloned().collect(),
        security_groups: lb.security_groups.iter().cloned().collect(),
        cross_zone: lb.cross_zone,
        listeners: BTreeSet::from([Listener { port: 443, protocol: "TCP".into(), target_group: lb.target_group.clone() }]),
        tags: lb.tags.clone(),
    };
    out.push(Task::LoadBalancer(balancer).view(None));
}

/// The alias records the spec wants (when the cluster has a hosted zone and a load balancer).
pub(super) fn desired_aliases(model: &ClusterModel, resolved: &super::Resolved, out: &mut Vec<Resource>) {
    if let (Some(dns), Some(_), Some(lb)) = (&model.dns, &resolved.zone, &model.load_balancer) {
        for name in &dns.alias_records {
            out.push(Task::AliasRecord(AliasRecord { name: name.clone(), target: lb.name.clone() }).view(None));
        }
    }
}

super::task::picker!(pick_tg, TargetGroup, TargetGroup);

super::task::picker!(pick_lb, LoadBalancer, LoadBalancer);

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

/// Target groups and load balancers tagged for the cluster. Needs subnet and security-group ids.
pub(super) async fn discover(t: &AwsTarget, model: &ClusterModel, d: &mut Discovered) -> Result<(), AwsError> {
    let cluster = &model.cluster;
    let vpc_name =
        |ids: &Ids, id: &str| if ids.vpc.as_deref() == Some(id) && model.network.existing_id.is_none() { model.network.name.clone() } else { id.to_string() };

    let mut groups = Vec::new();
    let mut marker: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let resp = t.elb.describe_target_groups().set_marker(marker.clone()).send().await.map_err(|e| api("DescribeTargetGroups", cluster, e))?;
        groups.extend(resp.target_groups().iter().cloned());
        marker = resp.next_marker().map(str::to_string);
        if marker.is_none() {
            break;
        }
    }
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
            vpc: vpc_name(&d.ids, required(g.vpc_id(), "TargetGroup", &name, "VpcId")?),
            health_check: health,
            deregistration_delay: delay,
            tags: tags.clone(),
            name,
        };
        d.resources.push(Task::TargetGroup(tg).view(Some(arn)));
    }

    let mut lbs = Vec::new();
    let mut marker: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let resp = t.elb.describe_load_balancers().set_marker(marker.clone()).send().await.map_err(|e| api("DescribeLoadBalancers", cluster, e))?;
        lbs.extend(resp.load_balancers().iter().cloned());
        marker = resp.next_marker().map(str::to_string);
        if marker.is_none() {
            break;
        }
    }
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
            let target_group = l.default_actions().iter().find_map(|a| a.target_group_arn()).map(|arn| name_of(&d.ids.target_groups, arn)).unwrap_or_default();
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
            subnets: lb.availability_zones().iter().filter_map(|z| z.subnet_id()).map(|s| d.ids.subnet_name(s)).collect(),
            security_groups: lb.security_groups().iter().map(|s| d.ids.sg_name(s)).collect(),
            cross_zone,
            listeners: listener_set,
            tags: tags.clone(),
            name,
        };
        d.resources.push(Task::LoadBalancer(balancer).view(Some(arn)));
    }
    Ok(())
}

/// The alias records of the model as they exist (`alias` = the load balancer's model name). The
/// API names are checked even when the spec does not alias them: an alias left from a load balancer
/// (or `useForInternalApi`) the spec dropped is replaced by a placeholder record.
pub(super) async fn discover_aliases(t: &AwsTarget, model: &ClusterModel, zone: &str, d: &mut Discovered) -> Result<(), AwsError> {
    let Some(dns) = &model.dns else { return Ok(()) };
    let public_api: Vec<&String> = dns.records.iter().filter(|r| r.starts_with("api.")).collect();
    for name in dns.alias_records.iter().chain(public_api) {
        let resp = t
            .dns
            .client()
            .list_resource_record_sets()
            .hosted_zone_id(zone)
            .start_record_name(name)
            .start_record_type(r53_t::RrType::A)
            .max_items(1)
            .send()
            .await
            .map_err(|e| api("ListResourceRecordSets", name, e))?;
        let Some(rs) = resp.resource_record_sets().first() else { continue };
        if cloud::dns::normalize_name(rs.name()) != *name || rs.r#type() != &r53_t::RrType::A {
            continue;
        }
        let r = match rs.alias_target() {
            Some(a) => {
                let target = a.dns_name().trim_end_matches('.').to_ascii_lowercase();
                let lb = d
                    .ids
                    .load_balancers
                    .iter()
                    .find(|(_, (_, dns, _))| target.ends_with(&dns.trim_end_matches('.').to_ascii_lowercase()))
                    .map(|(k, _)| k.clone())
                    .unwrap_or_else(|| target.clone());
                Task::AliasRecord(AliasRecord { name: name.clone(), target: lb }).view(Some(format!("alias|{}|{}", a.hosted_zone_id(), a.dns_name())))
            }
            None => {
                let values: Vec<String> = rs.resource_records().iter().map(|v| v.value().to_string()).collect();
                let id = format!("{}|A|{}", rs.ttl().unwrap_or(crate::model::DNS_TTL), values.join(","));
                Task::DnsRecord(super::DnsRecord { name: name.clone(), value: values.join(",") }).view(Some(id))
            }
        };
        // A plain record was already discovered with the zone's listing; an alias replaces it.
        match d.resources.iter_mut().find(|x| x.kind() == Kind::DnsRecord && &x.name == name) {
            Some(existing) if matches!(r.task.as_deref(), Some(Task::AliasRecord(_))) => *existing = r,
            Some(_) => {}
            None => d.resources.push(r),
        }
    }
    Ok(())
}

impl AwsTarget {
    /// Create, update or delete the target group or the load balancer.
    pub(super) async fn execute_load_balancer(&self, model: &ClusterModel, c: &Change, ids: &mut Ids) -> Result<(), AwsError> {
        let name = c.name.as_str();
        let (kind, desired, actual) = (c.kind, c.desired.as_ref(), c.actual.as_ref());
        let fields: Vec<String> = match &c.action {
            Action::Update(f) => f.iter().map(|f| f.field.clone()).collect(),
            _ => Vec::new(),
        };
        let changed = |f: &str| fields.iter().any(|x| x == f);
        let immutable = |list: &[&str]| -> Result<(), AwsError> {
            let hit: Vec<&str> = list.iter().copied().filter(|f| changed(f)).collect();
            if hit.is_empty() {
                Ok(())
            } else {
                Err(missing(c.kind.as_str(), name, format!("{} cannot change in place; delete the {} and apply again", hit.join(", "), c.kind.as_str())))
            }
        };
        match (c.kind, &c.action) {
            (Kind::TargetGroup, Action::Create) => {
                let want = typed(desired, kind, name, "desired", pick_tg)?;
                let vpc = ids.vpc.clone().ok_or_else(|| missing("VPC", &model.network.name, format!("needed by target group {name}")))?;
                let resp = self
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
                ids.target_groups.insert(name.to_string(), arn.clone());
                self.target_group_attributes(&arn, name).await?;
            }
            (Kind::TargetGroup, Action::Update(_)) => {
                let want = typed(desired, kind, name, "desired", pick_tg)?;
                let actual_id = actual_id(actual, kind, name)?;
                immutable(&["protocol", "port", "vpc"])?;
                if changed("health_check") {
                    self.elb
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
                if changed("deregistration_delay") {
                    self.target_group_attributes(&actual_id, name).await?;
                }
                if fields.iter().any(|f| f.starts_with("tags[")) {
                    self.elb.add_tags().resource_arns(&actual_id).set_tags(Some(elb_tags(&want.tags))).send().await.map_err(|e| api("AddTags", name, e))?;
                }
            }
            (Kind::TargetGroup, Action::Delete) => {
                let actual_id = actual_id(actual, kind, name)?;
                self.delete_with_retry(name, || async {
                    self.elb.delete_target_group().target_group_arn(&actual_id).send().await.map(|_| ()).map_err(|e| api("DeleteTargetGroup", name, e))
                })
                .await?;
            }
            (Kind::LoadBalancer, Action::Create) => {
                let want = typed(desired, kind, name, "desired", pick_lb)?;
                let subnets = ids_for(&ids.subnets, &want.subnets, "Subnet", name)?;
                let sgs = ids_for(&ids.security_groups, &want.security_groups, "SecurityGroup", name)?;
                let resp = self
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
                ids.load_balancers.insert(
                    name.to_string(),
                    (
                        arn.clone(),
                        required(lb.dns_name(), "LoadBalancer", name, "DNSName")?.to_string(),
                        required(lb.canonical_hosted_zone_id(), "LoadBalancer", name, "CanonicalHostedZoneId")?.to_string(),
                    ),
                );
                self.cross_zone(&arn, name, want.cross_zone).await?;
                self.create_listeners(&arn, name, &want.listeners, ids).await?;
            }
            (Kind::LoadBalancer, Action::Update(_)) => {
                let want = typed(desired, kind, name, "desired", pick_lb)?;
                let actual_id = actual_id(actual, kind, name)?;
                immutable(&["aws_name", "type", "scheme"])?;
                if changed("subnets") {
                    let subnets = ids_for(&ids.subnets, &want.subnets, "Subnet", name)?;
                    self.elb.set_subnets().load_balancer_arn(&actual_id).set_subnets(Some(subnets)).send().await.map_err(|e| api("SetSubnets", name, e))?;
                }
                if changed("security_groups") {
                    let sgs = ids_for(&ids.security_groups, &want.security_groups, "SecurityGroup", name)?;
                    self.elb
                        .set_security_groups()
                        .load_balancer_arn(&actual_id)
                        .set_security_groups(Some(sgs))
                        .send()
                        .await
                        .map_err(|e| api("SetSecurityGroups", name, e))?;
                }
                if changed("cross_zone") {
                    self.cross_zone(&actual_id, name, want.cross_zone).await?;
                }
                if changed("listeners") {
                    let listeners = self.elb.describe_listeners().load_balancer_arn(&actual_id).send().await.map_err(|e| api("DescribeListeners", name, e))?;
                    for l in listeners.listeners() {
                        if let Some(arn) = l.listener_arn() {
                            self.elb.delete_listener().listener_arn(arn).send().await.map_err(|e| api("DeleteListener", name, e))?;
                        }
                    }
                    self.create_listeners(&actual_id, name, &want.listeners, ids).await?;
                }
                if fields.iter().any(|f| f.starts_with("tags[")) {
                    self.elb.add_tags().resource_arns(&actual_id).set_tags(Some(elb_tags(&want.tags))).send().await.map_err(|e| api("AddTags", name, e))?;
                }
            }
            (Kind::LoadBalancer, Action::Delete) => {
                let actual_id = actual_id(actual, kind, name)?;
                self.elb.delete_load_balancer().load_balancer_arn(&actual_id).send().await.map_err(|e| api("DeleteLoadBalancer", name, e))?;
                ids.load_balancers.remove(name);
            }
            (kind, _) => return Err(missing("LoadBalancer", name, format!("{} is not a load-balancer resource", kind.as_str()))),
        }
        Ok(())
    }

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
            let tg_arn =
                ids.target_groups.get(&l.target_group).cloned().ok_or_else(|| missing("TargetGroup", &l.target_group, format!("listener of {name}")))?;
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

    /// Point an alias record at the load balancer (UPSERT), or delete the record as it exists.
    pub(super) async fn execute_alias(&self, zone: &str, c: &Change, ids: &Ids) -> Result<(), AwsError> {
        let name = c.name.as_str();
        let change = match &c.action {
            Action::Delete => {
                let id = actual_id(c.actual.as_ref(), c.kind, name)?;
                let mut parts = id.splitn(3, '|');
                let bad = || missing("DNSRecord", name, format!("unreadable record id {id:?}"));
                let (first, second, third) = (parts.next().ok_or_else(bad)?, parts.next().ok_or_else(bad)?, parts.next().ok_or_else(bad)?);
                let rs = if first == "alias" {
                    r53_t::ResourceRecordSet::builder()
                        .name(name)
                        .r#type(r53_t::RrType::A)
                        .alias_target(
                            r53_t::AliasTarget::builder()
                                .hosted_zone_id(second)
                                .dns_name(third)
                                .evaluate_target_health(false)
                                .build()
                                .map_err(|e| api("AliasTarget", name, e))?,
                        )
                        .build()
                } else {
                    r53_t::ResourceRecordSet::builder()
                        .name(name)
                        .r#type(r53_t::RrType::A)
                        .ttl(first.parse().map_err(|_| bad())?)
                        .set_resource_records(Some(third.split(',').filter_map(|v| r53_t::ResourceRecord::builder().value(v).build().ok()).collect()))
                        .build()
                }
                .map_err(|e| api("ResourceRecordSet", name, e))?;
                r53_t::Change::builder().action(r53_t::ChangeAction::Delete).resource_record_set(rs).build()
            }
            _ if !matches!(c.desired.as_ref().and_then(|d| d.task.as_deref()), Some(Task::AliasRecord(_))) => {
                // The load balancer is gone from the spec: back to a placeholder A record protokube keeps.
                let rs = r53_t::ResourceRecordSet::builder()
                    .name(name)
                    .r#type(r53_t::RrType::A)
                    .ttl(crate::model::DNS_TTL)
                    .resource_records(r53_t::ResourceRecord::builder().value(crate::model::PLACEHOLDER_IP).build().map_err(|e| api("ResourceRecord", name, e))?)
                    .build()
                    .map_err(|e| api("ResourceRecordSet", name, e))?;
                r53_t::Change::builder().action(r53_t::ChangeAction::Upsert).resource_record_set(rs).build()
            }
            _ => {
                let want = typed(c.desired.as_ref(), c.kind, name, "desired", |t| if let Task::AliasRecord(a) = t { Some(a) } else { None })?;
                let (_, dns, zone_id) =
                    ids.load_balancers.get(&want.target).cloned().ok_or_else(|| missing("LoadBalancer", &want.target, format!("target of {name}")))?;
                let rs = r53_t::ResourceRecordSet::builder()
                    .name(name)
                    .r#type(r53_t::RrType::A)
                    .alias_target(
                        r53_t::AliasTarget::builder()
                            .hosted_zone_id(zone_id)
                            .dns_name(dns)
                            .evaluate_target_health(false)
                            .build()
                            .map_err(|e| api("AliasTarget", name, e))?,
                    )
                    .build()
                    .map_err(|e| api("ResourceRecordSet", name, e))?;
                r53_t::Change::builder().action(r53_t::ChangeAction::Upsert).resource_record_set(rs).build()
            }
        }
        .map_err(|e| api("Change", name, e))?;
        self.dns
            .client()
            .change_resource_record_sets()
            .hosted_zone_id(zone)
            .change_batch(r53_t::ChangeBatch::builder().changes(change).build().map_err(|e| api("ChangeBatch", name, e))?)
            .send()
            .await
            .map_err(|e| api("ChangeResourceRecordSets", name, e))?;
        Ok(())
    }
}
