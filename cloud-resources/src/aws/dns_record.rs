//! Route53 A records of the control plane: placeholders protokube replaces with the live members'
//! addresses (kOps' contract; apply never corrects their value), and alias records pointing at
//! the API load balancer.

use aws_sdk_route53::types as r53_t;
use cloud::dns::{Dns as _, Record, RecordChange};
use serde_json::json;

use super::load_balancer::LoadBalancer;
use super::task::{AwsFuture, AwsTask, Exec, Task, Typed};
use super::terraform::AwsTerraform;
use super::{api, AwsError, AwsTarget, Discovered, Ids, Resolved};
use crate::model::{ClusterModel, DNS_TTL, PLACEHOLDER_IP};
use crate::plan::{Action, Change, Kind, Resource};
use crate::tasks::{Fields, Link};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsRecord {
    pub name: String,
    pub target: RecordTarget,
}

/// What an A record answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordTarget {
    /// Its values, comma-joined (the placeholder when desired).
    Values(String),
    /// An alias to a load balancer (its model name, or the DNS name it points at when that is not ours).
    Alias(Link<LoadBalancer>),
}

impl DnsRecord {
    /// A record created with [`PLACEHOLDER_IP`] (protokube owns the value afterwards).
    pub fn placeholder(name: impl Into<String>) -> DnsRecord {
        DnsRecord { name: name.into(), target: RecordTarget::Values(PLACEHOLDER_IP.into()) }
    }
    pub fn is_alias(&self) -> bool {
        matches!(self.target, RecordTarget::Alias(_))
    }
}

impl AwsTask for DnsRecord {
    fn kind(&self) -> Kind {
        Kind::DnsRecord
    }
    fn name(&self) -> String {
        self.name.clone()
    }
    fn fields(&self, f: &mut Fields) {
        match &self.target {
            RecordTarget::Values(v) => f.set("type", "A").set("value", v),
            RecordTarget::Alias(lb) => f.set("type", "A").set("alias", lb),
        };
    }
    /// Records are managed only in a hosted zone.
    fn resolve(&mut self, resolved: &Resolved) -> bool {
        resolved.zone.is_some()
    }
    fn find<'a>(t: &'a AwsTarget, model: &'a ClusterModel, resolved: &'a Resolved, d: &'a mut Discovered) -> AwsFuture<'a> {
        Box::pin(async move {
            if let Some(zone) = &resolved.zone {
                discover(t, model, zone, d).await?;
                discover_aliases(t, model, zone, d).await?;
            }
            Ok(())
        })
    }
    fn render_terraform(&self, t: &mut AwsTerraform) {
        let Some(zone_id) = t.zone_id() else { return };
        let body = match &self.target {
            RecordTarget::Values(v) => json!({
                "zone_id": zone_id,
                "name": self.name,
                "type": "A",
                "ttl": DNS_TTL,
                "records": [v],
                "allow_overwrite": false,
                "lifecycle": {"ignore_changes": ["records"]},
            }),
            RecordTarget::Alias(lb) => json!({
                "zone_id": zone_id,
                "name": self.name,
                "type": "A",
                "alias": {"name": lb.tf_attr("dns_name"), "zone_id": lb.tf_attr("zone_id"), "evaluate_target_health": false},
            }),
        };
        t.blocks.add("aws_route53_record", &self.name, body);
    }
    fn render_aws<'a>(&'a self, cx: Exec<'a>, c: &'a Change) -> AwsFuture<'a> {
        Box::pin(async move {
            let name = c.name.as_str();
            let zone = cx.resolved.zone.clone().ok_or_else(|| AwsError::Missing {
                kind: "DNSRecord",
                name: name.into(),
                message: "no hosted zone was resolved".into(),
            })?;
            let wanted_alias = cx.model.tasks.dns_records.iter().any(|r| r.name == name && r.is_alias());
            if alias(c.desired.as_ref()) || alias(c.actual.as_ref()) || wanted_alias {
                return cx.target.execute_alias(&zone, c, cx.ids).await;
            }
            let c = Typed::<DnsRecord>::of(c);
            match c.action {
                Action::Create => {
                    let rec = Record { name: name.to_string(), rtype: "A".into(), ttl: DNS_TTL, values: vec![PLACEHOLDER_IP.into()] };
                    cx.target.dns.apply_changes(&zone, &[RecordChange::Upsert(rec)]).await?;
                }
                // protokube owns the value.
                Action::Update(_) => {}
                Action::Delete => {
                    let rec = record_of_id(name, &c.id()?)?;
                    cx.target.dns.apply_changes(&zone, &[RecordChange::Delete(rec)]).await?;
                }
            }
            Ok(())
        })
    }
}

/// The side is an alias record (typed, or by the id it was found with).
fn alias(r: Option<&Resource>) -> bool {
    r.is_some_and(|r| matches!(r.task.as_deref(), Some(Task::DnsRecord(x)) if x.is_alias()) || r.id.as_deref().is_some_and(|id| id.starts_with("alias|")))
}

/// The record as the id of an actual resource: `ttl|type|values` (what a delete must send back).
fn record_id(rec: &Record) -> String {
    format!("{}|{}|{}", rec.ttl, rec.rtype, rec.values.join(","))
}

fn record_of_id(name: &str, id: &str) -> Result<Record, AwsError> {
    let bad = || AwsError::Missing { kind: "DNSRecord", name: name.into(), message: format!("unreadable record id {id:?}") };
    let mut parts = id.splitn(3, '|');
    let ttl = parts.next().and_then(|t| t.parse().ok()).ok_or_else(bad)?;
    let rtype = parts.next().ok_or_else(bad)?.to_string();
    let values = parts.next().ok_or_else(bad)?.split(',').map(str::to_string).collect();
    Ok(Record { name: name.to_string(), rtype, ttl, values })
}

/// The placeholder records as they exist.
async fn discover(t: &AwsTarget, model: &ClusterModel, zone: &str, d: &mut Discovered) -> Result<(), AwsError> {
    if model.dns.is_none() {
        return Ok(());
    }
    let records = &model.tasks.dns_records;
    for rec in t.dns.list_records(zone, &model.cluster).await? {
        if rec.rtype == "A" && records.iter().any(|r| !r.is_alias() && r.name == rec.name) {
            let task = DnsRecord { name: rec.name.clone(), target: RecordTarget::Values(rec.values.join(",")) };
            d.found(task, record_id(&rec));
        }
    }
    Ok(())
}

/// The alias records of the model as they exist (`alias` = the load balancer's model name). The
/// API names are checked even when the spec does not alias them: an alias left from a load balancer
/// (or `useForInternalApi`) the spec dropped is replaced by a placeholder record.
async fn discover_aliases(t: &AwsTarget, model: &ClusterModel, zone: &str, d: &mut Discovered) -> Result<(), AwsError> {
    if model.dns.is_none() {
        return Ok(());
    }
    let records = &model.tasks.dns_records;
    let aliases = records.iter().filter(|r| r.is_alias());
    let public_api = records.iter().filter(|r| !r.is_alias() && r.name.starts_with("api."));
    for name in aliases.chain(public_api).map(|r| &r.name) {
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
                Task::from(DnsRecord { name: name.clone(), target: RecordTarget::Alias(Link::to(lb)) }).view(Some(format!(
                    "alias|{}|{}",
                    a.hosted_zone_id(),
                    a.dns_name()
                )))
            }
            None => {
                let values: Vec<String> = rs.resource_records().iter().map(|v| v.value().to_string()).collect();
                let id = format!("{}|A|{}", rs.ttl().unwrap_or(crate::model::DNS_TTL), values.join(","));
                Task::from(DnsRecord { name: name.clone(), target: RecordTarget::Values(values.join(",")) }).view(Some(id))
            }
        };
        // A plain record was already discovered with the zone's listing; an alias replaces it.
        match d.resources.iter_mut().find(|x| x.kind() == Kind::DnsRecord && &x.name == name) {
            Some(existing) if matches!(r.task.as_deref(), Some(Task::DnsRecord(x)) if x.is_alias()) => *existing = r,
            Some(_) => {}
            None => d.resources.push(r),
        }
    }
    Ok(())
}

impl AwsTarget {
    /// Point an alias record at the load balancer (UPSERT), or delete the record as it exists.
    async fn execute_alias(&self, zone: &str, c: &Change, ids: &Ids) -> Result<(), AwsError> {
        let name = c.name.as_str();
        let missing = |kind: &'static str, name: &str, message: String| AwsError::Missing { kind, name: name.to_string(), message };
        let change = match &c.action {
            Action::Delete => {
                let id = Typed::<DnsRecord>::of(c).id()?;
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
            _ if !alias(c.desired.as_ref()) => {
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
                let target = match Typed::<DnsRecord>::of(c).want()?.target {
                    RecordTarget::Alias(ref lb) => lb,
                    RecordTarget::Values(_) => return Err(missing("DNSRecord", name, "not an alias".into())),
                };
                let (_, dns, zone_id) =
                    ids.load_balancers.get(target.name()).cloned().ok_or_else(|| missing("LoadBalancer", target, format!("target of {name}")))?;
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
