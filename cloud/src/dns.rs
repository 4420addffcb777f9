//! DNS records (Route53 implementation on `aws-sdk-route53`).

use aws_sdk_route53::error::ProvideErrorMetadata;
use aws_sdk_route53::types::{Change, ChangeAction, ChangeBatch, ResourceRecord, ResourceRecordSet, RrType};

/// At most this many changes go into one ChangeResourceRecordSets call (Route53 allows 1000).
pub const MAX_CHANGES_PER_CALL: usize = 900;

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
    Api { op: &'static str, target: String, code: String, message: String },
    #[error("no hosted zone found for {0}")]
    NoZone(String),
    #[error("record {name}: {message}")]
    Invalid { name: String, message: String },
}

fn api_err<E: ProvideErrorMetadata + std::fmt::Debug>(op: &'static str, target: &str, e: E) -> DnsError {
    DnsError::Api {
        op,
        target: target.to_string(),
        code: e.code().unwrap_or("unknown").to_string(),
        message: e.message().map(str::to_string).unwrap_or_else(|| format!("{e:?}")),
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
    fn find_zone(&self, id_or_name: Option<&str>, fqdn: &str) -> impl std::future::Future<Output = Result<String, DnsError>> + Send;
    /// Every record in the zone whose name is `suffix` or ends in `.suffix`.
    fn list_records(&self, zone: &str, suffix: &str) -> impl std::future::Future<Output = Result<Vec<Record>, DnsError>> + Send;
    /// Apply changes in batches of at most [`MAX_CHANGES_PER_CALL`]; returns the number of calls made.
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

fn looks_like_zone_id(s: &str) -> bool {
    let s = s.trim_start_matches("/hostedzone/");
    !s.contains('.') && s.starts_with('Z') && s.chars().all(|c| c.is_ascii_alphanumeric())
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
    async fn find_zone(&self, id_or_name: Option<&str>, fqdn: &str) -> Result<String, DnsError> {
        if let Some(id) = id_or_name.filter(|s| looks_like_zone_id(s)) {
            let resp = self
                .client
                .get_hosted_zone()
                .id(id.trim_start_matches("/hostedzone/"))
                .send()
                .await
                .map_err(|e| api_err("GetHostedZone", id, e))?;
            return resp
                .hosted_zone()
                .map(|z| z.id().trim_start_matches("/hostedzone/").to_string())
                .ok_or_else(|| DnsError::NoZone(id.to_string()));
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
            if let Some(z) = resp.hosted_zones().iter().find(|z| normalize_name(z.name()) == *name) {
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
        for chunk in changes.chunks(MAX_CHANGES_PER_CALL) {
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

    #[test]
    fn zone_ids_are_recognised() {
        assert!(looks_like_zone_id("Z1234ABCDEF"));
        assert!(looks_like_zone_id("/hostedzone/Z1234ABCDEF"));
        assert!(!looks_like_zone_id("example.com"));
        assert!(!looks_like_zone_id("zone"));
    }
}
