//! The control plane's A records, created with a placeholder address that protokube replaces with
//! the live members' (kOps' contract); apply never corrects their value. Alias records of the API
//! load balancer are in [`super::load_balancer`].

use cloud::dns::{Dns as _, Record, RecordChange};

use super::task::{actual_id, Fields, Task};
use super::{AwsError, AwsTarget, Discovered, Resolved};
use crate::model::{ClusterModel, DNS_TTL, PLACEHOLDER_IP};
use crate::plan::{Action, Change, Resource};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsRecord {
    pub name: String,
    /// The record's values, comma-joined (the placeholder when desired).
    pub value: String,
}

impl DnsRecord {
    pub fn fields(&self, f: &mut Fields) {
        f.set("type", "A").set("value", &self.value);
    }
}

pub fn desired(model: &ClusterModel, resolved: &Resolved, out: &mut Vec<Resource>) {
    if let (Some(dns), Some(_)) = (&model.dns, &resolved.zone) {
        for name in &dns.records {
            out.push(Task::DnsRecord(DnsRecord { name: name.clone(), value: PLACEHOLDER_IP.into() }).view(None));
        }
    }
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

pub async fn discover(t: &AwsTarget, model: &ClusterModel, zone: &str, d: &mut Discovered) -> Result<(), AwsError> {
    let Some(dns) = &model.dns else { return Ok(()) };
    for rec in t.dns.list_records(zone, &model.cluster).await? {
        if rec.rtype == "A" && dns.records.contains(&rec.name) {
            let task = DnsRecord { name: rec.name.clone(), value: rec.values.join(",") };
            d.resources.push(Task::DnsRecord(task).view(Some(record_id(&rec))));
        }
    }
    Ok(())
}

impl AwsTarget {
    pub(super) async fn execute_dns_record(&self, resolved: &Resolved, c: &Change) -> Result<(), AwsError> {
        let name = c.name.as_str();
        let zone =
            resolved.zone.clone().ok_or_else(|| AwsError::Missing { kind: "DNSRecord", name: name.into(), message: "no hosted zone was resolved".into() })?;
        match &c.action {
            Action::Create => {
                let rec = Record { name: name.to_string(), rtype: "A".into(), ttl: DNS_TTL, values: vec![PLACEHOLDER_IP.into()] };
                self.dns.apply_changes(&zone, &[RecordChange::Upsert(rec)]).await?;
            }
            // protokube owns the value.
            Action::Update(_) => {}
            Action::Delete => {
                let rec = record_of_id(name, &actual_id(c.actual.as_ref(), c.kind, name)?)?;
                self.dns.apply_changes(&zone, &[RecordChange::Delete(rec)]).await?;
            }
        }
        Ok(())
    }
}
