//! The API's network load balancer: its TCP 443 target group (which the control-plane autoscaling
//! groups register with), the balancer with its listener, and the alias record `api.<cluster>`.
//!
//! Load balancers and target groups are found through their tags (DescribeTags, 20 ARNs a call).

use std::collections::BTreeMap;

use aws_sdk_elasticloadbalancingv2::types as elb_t;
use aws_sdk_route53::types as r53_t;

use super::{api, ids_for, name_of, AwsError, AwsTarget, Discovered, Ids, MAX_PAGES};
use crate::model::ClusterModel;
use crate::plan::{Action, Change, Kind, Resource};

/// kOps' target-group settings: TCP health checks every 10 s, 2 to flip, 30 s deregistration delay.
const HEALTH_CHECK: &str = "TCP interval=10 healthy=2 unhealthy=2";
const DEREGISTRATION_DELAY: &str = "30";

fn missing(kind: &'static str, name: &str, message: String) -> AwsError {
    AwsError::Missing { kind, name: name.to_string(), message }
}

pub(super) fn desired(model: &ClusterModel, out: &mut Vec<Resource>) {
    let Some(lb) = &model.load_balancer else { return };
    let vpc = model.network.existing_id.clone().unwrap_or_else(|| model.network.name.clone());
    out.push(
        Resource::new(Kind::TargetGroup, &lb.target_group)
            .attr("protocol", "TCP")
            .attr("port", 443)
            .attr("vpc", &vpc)
            .attr("health_check", HEALTH_CHECK)
            .attr("deregistration_delay", DEREGISTRATION_DELAY)
            .tags(&lb.target_group_tags),
    );
    let mut sgs = lb.security_groups.clone();
    sgs.sort();
    let mut subnets = lb.subnets.clone();
    subnets.sort();
    out.push(
        Resource::new(Kind::LoadBalancer, &lb.name)
            .attr("aws_name", &lb.aws_name)
            .attr("type", "network")
            .attr("scheme", if lb.internal { "internal" } else { "internet-facing" })
            .attr("subnets", subnets.join(","))
            .attr("security_groups", sgs.join(","))
            .attr("cross_zone", lb.cross_zone)
            .attr("listeners", format!("443/TCP->{}", lb.target_group))
            .tags(&lb.tags),
    );
}

/// ARNs (of one listing) whose tags say they belong to the cluster, with their tags.
async fn tagged(t: &AwsTarget, cluster: &str, arns: Vec<String>) -> Result<BTreeMap<String, BTreeMap<String, String>>, AwsError> {
    let mut out = BTreeMap::new();
    for chunk in arns.chunks(20) {
        let resp = t.elb.describe_tags().set_resource_arns(Some(chunk.to_vec())).send().await.map_err(|e| api("DescribeTags", cluster, e))?;
        for d in resp.tag_descriptions() {
            let tags: BTreeMap<String, String> =
                d.tags().iter().filter_map(|t| Some((t.key()?.to_string(), t.value().unwrap_or("").to_string()))).collect();
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
    let vpc_name = |ids: &Ids, id: &str| if ids.vpc.as_deref() == Some(id) && model.network.existing_id.is_none() { model.network.name.clone() } else { id.to_string() };

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
        let arn = g.target_group_arn().unwrap_or_default().to_string();
        let Some(tags) = ours.get(&arn) else { continue };
        let name = g.target_group_name().unwrap_or_default().to_string();
        let attrs = t
            .elb
            .describe_target_group_attributes()
            .target_group_arn(&arn)
            .send()
            .await
            .map_err(|e| api("DescribeTargetGroupAttributes", &name, e))?;
        let delay = attrs
            .attributes()
            .iter()
            .find(|a| a.key() == Some("deregistration_delay.timeout_seconds"))
            .and_then(|a| a.value())
            .unwrap_or("300")
            .to_string();
        let health = format!(
            "{} interval={} healthy={} unhealthy={}",
            g.health_check_protocol().map(|p| p.as_str()).unwrap_or(""),
            g.health_check_interval_seconds().unwrap_or_default(),
            g.healthy_threshold_count().unwrap_or_default(),
            g.unhealthy_threshold_count().unwrap_or_default()
        );
        d.ids.target_groups.insert(name.clone(), arn.clone());
        d.resources.push(Resource {
            id: Some(arn),
            ..Resource::new(Kind::TargetGroup, name)
                .attr("protocol", g.protocol().map(|p| p.as_str()).unwrap_or(""))
                .attr("port", g.port().unwrap_or_default())
                .attr("vpc", vpc_name(&d.ids, g.vpc_id().unwrap_or_default()))
                .attr("health_check", health)
                .attr("deregistration_delay", delay)
                .tags(tags)
        });
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
        let arn = lb.load_balancer_arn().unwrap_or_default().to_string();
        let Some(tags) = ours.get(&arn) else { continue };
        let name = tags.get("Name").cloned().unwrap_or_else(|| lb.load_balancer_name().unwrap_or_default().to_string());
        let attrs = t
            .elb
            .describe_load_balancer_attributes()
            .load_balancer_arn(&arn)
            .send()
            .await
            .map_err(|e| api("DescribeLoadBalancerAttributes", &name, e))?;
        let cross_zone = attrs
            .attributes()
            .iter()
            .find(|a| a.key() == Some("load_balancing.cross_zone.enabled"))
            .and_then(|a| a.value())
            .unwrap_or("false")
            .to_string();
        let listeners = t.elb.describe_listeners().load_balancer_arn(&arn).send().await.map_err(|e| api("DescribeListeners", &name, e))?;
        let mut listener_list: Vec<String> = listeners
            .listeners()
            .iter()
            .map(|l| {
                let tg = l
                    .default_actions()
                    .iter()
                    .find_map(|a| a.target_group_arn())
                    .map(|arn| name_of(&d.ids.target_groups, arn))
                    .unwrap_or_default();
                format!("{}/{}->{tg}", l.port().unwrap_or_default(), l.protocol().map(|p| p.as_str()).unwrap_or(""))
            })
            .collect();
        listener_list.sort();
        let mut subnets: Vec<String> = lb.availability_zones().iter().filter_map(|z| z.subnet_id()).map(|s| d.ids.subnet_name(s)).collect();
        subnets.sort();
        let mut sgs: Vec<String> = lb.security_groups().iter().map(|s| d.ids.sg_name(s)).collect();
        sgs.sort();
        d.ids.load_balancers.insert(
            name.clone(),
            (arn.clone(), lb.dns_name().unwrap_or_default().to_string(), lb.canonical_hosted_zone_id().unwrap_or_default().to_string()),
        );
        d.resources.push(Resource {
            id: Some(arn),
            ..Resource::new(Kind::LoadBalancer, name)
                .attr("aws_name", lb.load_balancer_name().unwrap_or_default())
                .attr("type", lb.r#type().map(|t| t.as_str()).unwrap_or(""))
                .attr("scheme", lb.scheme().map(|s| s.as_str()).unwrap_or(""))
                .attr("subnets", subnets.join(","))
                .attr("security_groups", sgs.join(","))
                .attr("cross_zone", cross_zone)
                .attr("listeners", listener_list.join(","))
                .tags(tags)
        });
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
        let mut r = Resource::new(Kind::DnsRecord, name).attr("type", "A");
        match rs.alias_target() {
            Some(a) => {
                let target = a.dns_name().trim_end_matches('.').to_ascii_lowercase();
                let lb = d
                    .ids
                    .load_balancers
                    .iter()
                    .find(|(_, (_, dns, _))| target.ends_with(&dns.trim_end_matches('.').to_ascii_lowercase()))
                    .map(|(k, _)| k.clone())
                    .unwrap_or_else(|| target.clone());
                r = r.attr("alias", lb);
                r.id = Some(format!("alias|{}|{}", a.hosted_zone_id(), a.dns_name()));
            }
            None => {
                let values: Vec<String> = rs.resource_records().iter().map(|v| v.value().to_string()).collect();
                r = r.attr("value", values.join(","));
                r.id = Some(format!("{}|A|{}", rs.ttl().unwrap_or(60), values.join(",")));
            }
        }
        // A plain record was already discovered with the zone's listing; an alias replaces it.
        match d.resources.iter_mut().find(|x| x.kind() == Kind::DnsRecord && &x.name == name) {
            Some(existing) if r.attrs.contains_key("alias") => *existing = r,
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
        let desired = c.desired.as_ref();
        let attr = |k: &str| desired.and_then(|d| d.attrs.get(k)).cloned().unwrap_or_default();
        let tags: Vec<elb_t::Tag> =
            desired.map(|d| d.tags.iter().map(|(k, v)| elb_t::Tag::builder().key(k).value(v).build()).collect()).unwrap_or_default();
        let actual_id = c.actual.as_ref().and_then(|a| a.id.clone()).unwrap_or_default();
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
                Err(missing(
                    c.kind.as_str(),
                    name,
                    format!("{} cannot change in place; delete the {} and apply again", hit.join(", "), c.kind.as_str()),
                ))
            }
        };
        match (c.kind, &c.action) {
            (Kind::TargetGroup, Action::Create) => {
                let vpc = ids.vpc.clone().ok_or_else(|| missing("VPC", &model.network.name, format!("needed by target group {name}")))?;
                let resp = self
                    .elb
                    .create_target_group()
                    .name(name)
                    .protocol(elb_t::ProtocolEnum::Tcp)
                    .port(443)
                    .vpc_id(vpc)
                    .target_type(elb_t::TargetTypeEnum::Instance)
                    .health_check_protocol(elb_t::ProtocolEnum::Tcp)
                    .health_check_interval_seconds(10)
                    .healthy_threshold_count(2)
                    .unhealthy_threshold_count(2)
                    .set_tags(Some(tags))
                    .send()
                    .await
                    .map_err(|e| api("CreateTargetGroup", name, e))?;
                let arn = resp.target_groups().first().and_then(|g| g.target_group_arn()).unwrap_or_default().to_string();
                ids.target_groups.insert(name.to_string(), arn.clone());
                self.target_group_attributes(&arn, name).await?;
            }
            (Kind::TargetGroup, Action::Update(_)) => {
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
                    self.elb.add_tags().resource_arns(&actual_id).set_tags(Some(tags)).send().await.map_err(|e| api("AddTags", name, e))?;
                }
            }
            (Kind::TargetGroup, Action::Delete) => {
                self.delete_with_retry(name, || async {
                    self.elb.delete_target_group().target_group_arn(&actual_id).send().await.map(|_| ()).map_err(|e| api("DeleteTargetGroup", name, e))
                })
                .await?;
            }
            (Kind::LoadBalancer, Action::Create) => {
                let subnets = ids_for(&ids.subnets, attr("subnets").split(','), "Subnet", name)?;
                let sgs = ids_for(&ids.security_groups, attr("security_groups").split(','), "SecurityGroup", name)?;
                let resp = self
                    .elb
                    .create_load_balancer()
                    .name(attr("aws_name"))
                    .r#type(elb_t::LoadBalancerTypeEnum::Network)
                    .scheme(elb_t::LoadBalancerSchemeEnum::from(attr("scheme").as_str()))
                    .set_subnets(Some(subnets))
                    .set_security_groups(Some(sgs))
                    .set_tags(Some(tags))
                    .send()
                    .await
                    .map_err(|e| api("CreateLoadBalancer", name, e))?;
                let lb = resp.load_balancers().first().ok_or_else(|| missing("LoadBalancer", name, "CreateLoadBalancer returned nothing".into()))?;
                let arn = lb.load_balancer_arn().unwrap_or_default().to_string();
                ids.load_balancers.insert(
                    name.to_string(),
                    (arn.clone(), lb.dns_name().unwrap_or_default().to_string(), lb.canonical_hosted_zone_id().unwrap_or_default().to_string()),
                );
                self.cross_zone(&arn, name, attr("cross_zone") == "true").await?;
                self.create_listener(&arn, name, &attr("listeners"), ids).await?;
            }
            (Kind::LoadBalancer, Action::Update(_)) => {
                immutable(&["aws_name", "type", "scheme"])?;
                if changed("subnets") {
                    let subnets = ids_for(&ids.subnets, attr("subnets").split(','), "Subnet", name)?;
                    self.elb
                        .set_subnets()
                        .load_balancer_arn(&actual_id)
                        .set_subnets(Some(subnets))
                        .send()
                        .await
                        .map_err(|e| api("SetSubnets", name, e))?;
                }
                if changed("security_groups") {
                    let sgs = ids_for(&ids.security_groups, attr("security_groups").split(','), "SecurityGroup", name)?;
                    self.elb
                        .set_security_groups()
                        .load_balancer_arn(&actual_id)
                        .set_security_groups(Some(sgs))
                        .send()
                        .await
                        .map_err(|e| api("SetSecurityGroups", name, e))?;
                }
                if changed("cross_zone") {
                    self.cross_zone(&actual_id, name, attr("cross_zone") == "true").await?;
                }
                if changed("listeners") {
                    let listeners =
                        self.elb.describe_listeners().load_balancer_arn(&actual_id).send().await.map_err(|e| api("DescribeListeners", name, e))?;
                    for l in listeners.listeners() {
                        if let Some(arn) = l.listener_arn() {
                            self.elb.delete_listener().listener_arn(arn).send().await.map_err(|e| api("DeleteListener", name, e))?;
                        }
                    }
                    self.create_listener(&actual_id, name, &attr("listeners"), ids).await?;
                }
                if fields.iter().any(|f| f.starts_with("tags[")) {
                    self.elb.add_tags().resource_arns(&actual_id).set_tags(Some(tags)).send().await.map_err(|e| api("AddTags", name, e))?;
                }
            }
            (Kind::LoadBalancer, Action::Delete) => {
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

    /// `443/TCP->tg` listeners forwarding to target groups.
    async fn create_listener(&self, arn: &str, name: &str, listeners: &str, ids: &Ids) -> Result<(), AwsError> {
        for l in listeners.split(',').filter(|s| !s.is_empty()) {
            let (port_proto, tg) = l.split_once("->").unwrap_or((l, ""));
            let (port, _) = port_proto.split_once('/').unwrap_or((port_proto, "TCP"));
            let tg_arn = ids.target_groups.get(tg).cloned().ok_or_else(|| missing("TargetGroup", tg, format!("listener of {name}")))?;
            self.elb
                .create_listener()
                .load_balancer_arn(arn)
                .protocol(elb_t::ProtocolEnum::Tcp)
                .port(port.parse().unwrap_or(443))
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
                let id = c.actual.as_ref().and_then(|a| a.id.clone()).unwrap_or_default();
                let mut parts = id.splitn(3, '|');
                let (first, second, third) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
                let rs = if first == "alias" {
                    r53_t::ResourceRecordSet::builder()
                        .name(name)
                        .r#type(r53_t::RrType::A)
                        .alias_target(r53_t::AliasTarget::builder().hosted_zone_id(second).dns_name(third).evaluate_target_health(false).build().map_err(|e| api("AliasTarget", name, e))?)
                        .build()
                } else {
                    r53_t::ResourceRecordSet::builder()
                        .name(name)
                        .r#type(r53_t::RrType::A)
                        .ttl(first.parse().unwrap_or(60))
                        .set_resource_records(Some(
                            third.split(',').filter_map(|v| r53_t::ResourceRecord::builder().value(v).build().ok()).collect(),
                        ))
                        .build()
                }
                .map_err(|e| api("ResourceRecordSet", name, e))?;
                r53_t::Change::builder().action(r53_t::ChangeAction::Delete).resource_record_set(rs).build()
            }
            _ if c.desired.as_ref().is_some_and(|d| !d.attrs.contains_key("alias")) => {
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
                let lb = c.desired.as_ref().and_then(|d| d.attrs.get("alias")).cloned().unwrap_or_default();
                let (_, dns, zone_id) = ids.load_balancers.get(&lb).cloned().ok_or_else(|| missing("LoadBalancer", &lb, format!("target of {name}")))?;
                let rs = r53_t::ResourceRecordSet::builder()
                    .name(name)
                    .r#type(r53_t::RrType::A)
                    .alias_target(r53_t::AliasTarget::builder().hosted_zone_id(zone_id).dns_name(dns).evaluate_target_health(false).build().map_err(|e| api("AliasTarget", name, e))?)
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
