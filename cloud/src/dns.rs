//! DNS records (Route53 implementation on `aws-sdk-route53`).

use aws_sdk_route53::error::ProvideErrorMetadata;
use aws_sdk_route53::types::{Change, ChangeAction, ChangeBatch, ResourceRecord, ResourceRecordSet, RrType};

/// At most this many changes go into one ChangeResourceRecordSets call.
pub const MAX_CHANGES_PER_CALL: usize = 900;
/// Route53's limit of ResourceRecord elements per request (an UPSERT counts its values twice).
pub const MAX_RECORD_ELEMENTS_PER_CALL: usize = 1000;

fn elements(c: &RecordChange) -> usize {
    match c {
        RecordChange::Upsert(r) => 2 * r.values.len().max(1),
        RecordChange::Delete(r) => r.values.len().max(1),
    }
}

/// Split changes into the batches that are sent, one call each: at most [`MAX_CHANGES_PER_CALL`]
/// changes and [`MAX_RECORD_ELEMENTS_PER_CALL`] record elements per batch, order kept.
pub fn batches(changes: &[RecordChange]) -> Vec<&[RecordChange]> {
    let mut out = Vec::new();
    let (mut start, mut elems) = (0, 0);
    for (i, c) in changes.iter().enumerate() {
        let e = elements(c);
        if i > start && (i - start >= MAX_CHANGES_PER_CALL || elems + e > MAX_RECORD_ELEMENTS_PER_CALL) {
            out.push(&changes[start..i]);
            start = i;
            elems = 0;
        }
        elems += e;
    }
    if start < changes.len() {
        out.push(&changes[start..]);
    }
    out
}

/// One record set: lower-case name without the trailing dot, type, TTL, sorted values.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Record {
    pub name: String,
    pub rtype: String,
    pub ttl: i64,
    pub values: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordChange {
    Upsert(Record),
    Delete(Record),
}

#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    #[error("{op} {target}: {code}: {message}")]
    Api {
        op: &'static str,
        target: String,
        code: String,
        message: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("no hosted zone found for {0}")]
    NoZone(String),
    #[error("record {name}: {message}")]
    Invalid { name: String, message: String },
    #[error("{op} {target}: still {status} after {waited:?}")]
    NotDone { op: &'static str, target: String, status: String, waited: std::time::Duration },
}

fn api_err<E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static>(op: &'static str, target: &str, e: E) -> DnsError {
    DnsError::Api {
        op,
        target: target.to_string(),
        code: e.code().unwrap_or("unknown").to_string(),
        message: e.message().map(str::to_string).unwrap_or_else(|| format!("{e:?}")),
        source: Box::new(e),
    }
}

/// Normalise a DNS name: lower case, no trailing dot, Route53's `\052` escape for `*` undone.
pub fn normalize_name(name: &str) -> String {
    name.trim_end_matches('.').replace("\\052", "*").to_ascii_lowercase()
}

/// A DNS zone provider.
pub trait Dns {
    /// Resolve a zone given by id (`Z…`, `/hostedzone/Z…`) or by name; with `None`, the zone whose
    /// name is the longest suffix of `fqdn`.
    fn find_zone(&self, id_or_name: Option<&str>, fqdn: &str) -> impl std::future::Future<Output = Result<String, DnsError>> + Send {
        self.find_zone_with(id_or_name, fqdn, None)
    }
    /// As [`Dns::find_zone`], preferring a private (`Some(true)`) or public (`Some(false)`) zone when
    /// both exist under one name.
    fn find_zone_with(&self, id_or_name: Option<&str>, fqdn: &str, private: Option<bool>)
        -> impl std::future::Future<Output = Result<String, DnsError>> + Send;
    /// Every record in the zone whose name is `suffix` or ends in `.suffix`.
    fn list_records(&self, zone: &str, suffix: &str) -> impl std::future::Future<Output = Result<Vec<Record>, DnsError>> + Send;
    /// Apply changes in [`batches`]; returns the number of calls made.
    fn apply_changes(&self, zone: &str, changes: &[RecordChange]) -> impl std::future::Future<Output = Result<usize, DnsError>> + Send;
}

#[derive(Debug, Clone)]
pub struct Route53Dns {
    client: aws_sdk_route53::Client,
}

impl Route53Dns {
    pub fn new(client: aws_sdk_route53::Client) -> Self {
        Route53Dns { client }
    }
    pub fn client(&self) -> &aws_sdk_route53::Client {
        &self.client
    }
}

/// Whether `spec.dnsZone` names the zone by id (then [`Dns::find_zone`] reads it with
/// `GetHostedZone`) rather than by name (`ListHostedZonesByName`).
pub fn looks_like_zone_id(s: &str) -> bool {
    // Zone ids are upper-case alphanumerics (`Z0123…` on AWS); zone names have dots or lower case.
    let s = s.trim_start_matches("/hostedzone/");
    s.len() >= 8 && s.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
}

fn to_rrset(r: &Record) -> Result<ResourceRecordSet, DnsError> {
    let inv = |e: aws_sdk_route53::error::BuildError| DnsError::Invalid { name: r.name.clone(), message: e.to_string() };
    let mut b = ResourceRecordSet::builder().name(format!("{}.", r.name)).r#type(RrType::from(r.rtype.as_str())).ttl(r.ttl);
    for v in &r.values {
        b = b.resource_records(ResourceRecord::builder().value(v).build().map_err(inv)?);
    }
    b.build().map_err(inv)
}

impl Dns for Route53Dns {
    async fn find_zone_with(&self, id_or_name: Option<&str>, fqdn: &str, private: Option<bool>) -> Result<String, DnsError> {
        if let Some(id) = id_or_name.filter(|s| looks_like_zone_id(s)) {
            let resp = self.client.get_hosted_zone().id(id.trim_start_matches("/hostedzone/")).send().await.map_err(|e| api_err("GetHostedZone", id, e))?;
            return resp.hosted_zone().map(|z| z.id().trim_start_matches("/hostedzone/").to_string()).ok_or_else(|| DnsError::NoZone(id.to_string()));
        }
        let candidates: Vec<String> = match id_or_name {
            Some(name) => vec![normalize_name(name)],
            None => {
                let n = normalize_name(fqdn);
                let labels: Vec<&str> = n.split('.').collect();
                (0..labels.len().saturating_sub(1)).map(|i| labels[i..].join(".")).collect()
            }
        };
        // Candidates are longest first, so the first match is the most specific zone.
        for name in &candidates {
            let resp = self
                .client
                .list_hosted_zones_by_name()
                .dns_name(format!("{name}."))
                .max_items(10)
                .send()
                .await
                .map_err(|e| api_err("ListHostedZonesByName", name, e))?;
            let matching: Vec<_> = resp.hosted_zones().iter().filter(|z| normalize_name(z.name()) == *name).collect();
            let is_private = |z: &&aws_sdk_route53::types::HostedZone| z.config().map(|c| c.private_zone()).unwrap_or(false);
            let pick = match private {
                Some(p) => matching.iter().find(|z| is_private(z) == p).or(matching.first()),
                None => matching.first(),
            };
            if let Some(z) = pick {
                return Ok(z.id().trim_start_matches("/hostedzone/").to_string());
            }
        }
        Err(DnsError::NoZone(id_or_name.unwrap_or(fqdn).to_string()))
    }

    async fn list_records(&self, zone: &str, suffix: &str) -> Result<Vec<Record>, DnsError> {
        let suffix = normalize_name(suffix);
        let dotted = format!(".{suffix}");
        let mut out = Vec::new();
        let mut start: Option<(String, RrType)> = None;
        loop {
            let mut req = self.client.list_resource_record_sets().hosted_zone_id(zone);
            if let Some((name, t)) = start.take() {
                req = req.start_record_name(name).start_record_type(t);
            }
            let resp = req.send().await.map_err(|e| api_err("ListResourceRecordSets", zone, e))?;
            for rs in resp.resource_record_sets() {
                let name = normalize_name(rs.name());
                if name != suffix && !name.ends_with(&dotted) {
                    continue;
                }
                let mut values: Vec<String> = rs.resource_records().iter().map(|r| r.value().to_string()).collect();
                values.sort();
                out.push(Record { name, rtype: rs.r#type().as_str().to_string(), ttl: rs.ttl().unwrap_or(0), values });
            }
            match (resp.is_truncated(), resp.next_record_name(), resp.next_record_type()) {
                (true, Some(n), Some(t)) => start = Some((n.to_string(), t.clone())),
                _ => break,
            }
        }
        out.sort();
        Ok(out)
    }

    async fn apply_changes(&self, zone: &str, changes: &[RecordChange]) -> Result<usize, DnsError> {
        let mut calls = 0;
        for chunk in batches(changes) {
            let mut batch = ChangeBatch::builder().comment("keelson protokube");
            for c in chunk {
                let (action, r) = match c {
                    RecordChange::Upsert(r) => (ChangeAction::Upsert, r),
                    RecordChange::Delete(r) => (ChangeAction::Delete, r),
                };
                let change = Change::builder()
                    .action(action)
                    .resource_record_set(to_rrset(r)?)
                    .build()
                    .map_err(|e| DnsError::Invalid { name: r.name.clone(), message: e.to_string() })?;
                batch = batch.changes(change);
            }
            let batch = batch.build().map_err(|e| DnsError::Invalid { name: zone.to_string(), message: e.to_string() })?;
            self.client
                .change_resource_record_sets()
                .hosted_zone_id(zone)
                .change_batch(batch)
                .send()
                .await
                .map_err(|e| api_err("ChangeResourceRecordSets", zone, e))?;
            calls += 1;
        }
        Ok(calls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_normalise() {
        assert_eq!(normalize_name("Etcd-A.Internal.X.example.com."), "etcd-a.internal.x.example.com");
        assert_eq!(normalize_name("\\052.x."), "*.x");
    }

    fn upsert(i: usize, values: usize) -> RecordChange {
        RecordChange::Upsert(Record { name: format!("r{i}"), rtype: "A".into(), ttl: 60, values: vec!["1.2.3.4".into(); values] })
    }

    #[test]
    fn batches_respect_change_and_element_limits() {
        assert!(batches(&[]).is_empty());
        let one: Vec<_> = (0..1201).map(|i| upsert(i, 1)).collect();
        assert_eq!(batches(&one).iter().map(|b| b.len()).collect::<Vec<_>>(), vec![500, 500, 201]);
        let deletes: Vec<_> =
            (0..1000).map(|i| RecordChange::Delete(Record { name: format!("d{i}"), rtype: "A".into(), ttl: 60, values: vec!["1.1.1.1".into()] })).collect();
        assert_eq!(batches(&deletes).iter().map(|b| b.len()).collect::<Vec<_>>(), vec![900, 100]);
        let fat = vec![upsert(0, 3), upsert(1, 3)];
        assert_eq!(batches(&fat).len(), 1);
    }

    #[test]
    fn zone_ids_are_recognised() {
        assert!(looks_like_zone_id("Z1234ABCDEF"));
        assert!(looks_like_zone_id("/hostedzone/Z1234ABCDEF"));
        assert!(!looks_like_zone_id("example.com"));
        assert!(!looks_like_zone_id("zone"));
        assert!(looks_like_zone_id("OIU931YUX31EG92AP3EXJ8"));
    }
}
