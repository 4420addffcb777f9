//! Cloud DNS v1 behind [`Dns`]: `managedZones.list` to find the zone, `resourceRecordSets.list`
//! to read, and `changes.create` to write. Cloud DNS has no UPSERT: a change deletes the record set
//! exactly as it is (TTL and data, or the change is refused with 412) and adds the new one, both
//! in one atomic change.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::api::{enc, GoogleApi, GoogleApiError};
use crate::dns::{normalize_name, Dns, DnsError, Record, RecordChange};

/// At most this many record changes go into one `changes.create` (each is up to a deletion and an
/// addition; Cloud DNS takes at most 1000 of each per change).
pub const MAX_CHANGES_PER_CALL: usize = 500;
const MAX_PAGES: usize = 200;
/// How long a change may stay `pending` before the write counts as failed (Cloud DNS applies a
/// change in seconds; the next write reads the record sets back, so it must wait for `done`).
pub const CHANGE_DONE_BOUND: Duration = Duration::from_secs(120);

fn api_err(op: &'static str, target: &str, e: GoogleApiError) -> DnsError {
    DnsError::Api { op, target: target.to_string(), code: e.code(), message: e.to_string(), source: Box::new(e) }
}

/// A record set resource as a [`Record`] (name normalised, data sorted).
pub fn record_from(v: &Value) -> Record {
    let mut values: Vec<String> = v["rrdatas"].as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_string).collect();
    values.sort();
    Record {
        name: normalize_name(v["name"].as_str().unwrap_or_default()),
        rtype: v["type"].as_str().unwrap_or_default().to_string(),
        ttl: v["ttl"].as_i64().unwrap_or(0),
        values,
    }
}

/// A [`Record`] as a record set resource (absolute name).
pub fn rrset(r: &Record) -> Value {
    json!({"kind": "dns#resourceRecordSet", "name": format!("{}.", r.name), "type": r.rtype, "ttl": r.ttl, "rrdatas": r.values})
}

/// The deletions and additions of one atomic change that make `changes` true, given the record
/// sets there now (`current`, by (name, type), as served). An upsert deletes what is there exactly
/// as served (unless it is already right) and adds the new set; a delete removes the set only
/// if it is exactly the one given (else it is an error: the set changed since it was read).
pub fn change_body(changes: &[RecordChange], current: &BTreeMap<(String, String), Value>) -> Result<Value, DnsError> {
    let (mut deletions, mut additions) = (Vec::new(), Vec::new());
    for c in changes {
        match c {
            RecordChange::Upsert(r) => {
                let key = (r.name.clone(), r.rtype.clone());
                match current.get(&key) {
                    Some(have) if record_from(have) == *r => {}
                    Some(have) => {
                        deletions.push(have.clone());
                        additions.push(rrset(r));
                    }
                    None => additions.push(rrset(r)),
                }
            }
            RecordChange::Delete(r) => match current.get(&(r.name.clone(), r.rtype.clone())) {
                Some(have) if record_from(have) == *r => deletions.push(have.clone()),
                Some(have) => {
                    return Err(DnsError::Invalid {
                        name: r.name.clone(),
                        message: format!("not deleted: the record set is now {:?}, not the {:?} asked for", record_from(have), r),
                    })
                }
                None => {}
            },
        }
    }
    Ok(json!({"kind": "dns#change", "deletions": deletions, "additions": additions}))
}

/// Cloud DNS for one project.
#[derive(Debug, Clone)]
pub struct CloudDns {
    api: GoogleApi,
    /// `…/dns/v1/projects/<project>`.
    project_url: String,
    /// How long a change may stay `pending` ([`CHANGE_DONE_BOUND`] unless set).
    change_bound: Duration,
}

impl CloudDns {
    /// `dns`: the Cloud DNS v1 base (`https://dns.googleapis.com/dns/v1`, or an emulator's).
    pub fn new(api: GoogleApi, dns: &str, project: &str) -> CloudDns {
        CloudDns { api, project_url: format!("{}/projects/{project}", dns.trim_end_matches('/')), change_bound: CHANGE_DONE_BOUND }
    }

    /// Another bound for a change to be `done`.
    pub fn with_change_bound(mut self, bound: Duration) -> CloudDns {
        self.change_bound = bound;
        self
    }

    fn zone_url(&self, zone: &str) -> String {
        format!("{}/managedZones/{}", self.project_url, enc(zone))
    }

    /// Poll `changes.get` until the change is `done` (bounded): the zone's record sets show it only
    /// then, and the next change must delete exactly what is there.
    async fn wait_done(&self, zone: &str, change: &Value) -> Result<(), DnsError> {
        let bound = self.change_bound;
        let id = change["id"].as_str().unwrap_or_default().to_string();
        let start = Instant::now();
        let mut status = change["status"].as_str().unwrap_or("done").to_string();
        let mut delay = Duration::from_millis(100);
        while status != "done" {
            if start.elapsed() + delay > bound {
                return Err(DnsError::NotDone { op: "changes.get", target: format!("{zone}/{id}"), status, waited: start.elapsed() });
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(1));
            let url = format!("{}/changes/{}", self.zone_url(zone), enc(&id));
            let v = self.api.get(&url).await.map_err(|e| api_err("changes.get", &id, e))?;
            status = v["status"].as_str().unwrap_or_default().to_string();
        }
        Ok(())
    }

    /// The record set `name`/`rtype` as served, if there is one.
    async fn current(&self, zone: &str, name: &str, rtype: &str) -> Result<Option<Value>, DnsError> {
        let url = format!("{}/rrsets?name={}&type={}", self.zone_url(zone), enc(&format!("{name}.")), enc(rtype));
        let sets = self.api.list_all(&url, "rrsets", MAX_PAGES).await.map_err(|e| api_err("resourceRecordSets.list", name, e))?;
        Ok(sets.into_iter().find(|s| normalize_name(s["name"].as_str().unwrap_or_default()) == name && s["type"].as_str() == Some(rtype)))
    }
}

impl Dns for CloudDns {
    /// `id_or_name`: a managed zone's name or id, or a DNS name (`example.com`); `None`: the zone
    /// whose DNS name is the longest suffix of `fqdn`. The answer is the managed zone's name.
    async fn find_zone_with(&self, id_or_name: Option<&str>, fqdn: &str, private: Option<bool>) -> Result<String, DnsError> {
        let zones = self
            .api
            .list_all(&format!("{}/managedZones", self.project_url), "managedZones", MAX_PAGES)
            .await
            .map_err(|e| api_err("managedZones.list", fqdn, e))?;
        let is_private = |z: &Value| z["visibility"].as_str() == Some("private");
        let prefer = |matching: Vec<&Value>| -> Option<String> {
            let pick = match private {
                Some(p) => matching.iter().find(|z| is_private(z) == p).or(matching.first()),
                None => matching.first(),
            };
            pick.and_then(|z| z["name"].as_str()).map(str::to_string)
        };
        if let Some(want) = id_or_name {
            let by_handle: Vec<&Value> = zones.iter().filter(|z| z["name"].as_str() == Some(want) || z["id"].as_str() == Some(want)).collect();
            if let Some(z) = prefer(by_handle) {
                return Ok(z);
            }
            let n = normalize_name(want);
            let by_dns: Vec<&Value> = zones.iter().filter(|z| normalize_name(z["dnsName"].as_str().unwrap_or_default()) == n).collect();
            return prefer(by_dns).ok_or_else(|| DnsError::NoZone(want.to_string()));
        }
        let n = normalize_name(fqdn);
        let labels: Vec<&str> = n.split('.').collect();
        // Longest suffix first: the most specific zone wins.
        for i in 0..labels.len() {
            let suffix = labels[i..].join(".");
            let matching: Vec<&Value> = zones.iter().filter(|z| normalize_name(z["dnsName"].as_str().unwrap_or_default()) == suffix).collect();
            if let Some(z) = prefer(matching) {
                return Ok(z);
            }
        }
        Err(DnsError::NoZone(fqdn.to_string()))
    }

    async fn list_records(&self, zone: &str, suffix: &str) -> Result<Vec<Record>, DnsError> {
        let suffix = normalize_name(suffix);
        let dotted = format!(".{suffix}");
        let sets = self
            .api
            .list_all(&format!("{}/rrsets", self.zone_url(zone)), "rrsets", MAX_PAGES)
            .await
            .map_err(|e| api_err("resourceRecordSets.list", zone, e))?;
        let mut out: Vec<Record> = sets.iter().map(record_from).filter(|r| r.name == suffix || r.name.ends_with(&dotted)).collect();
        out.sort();
        Ok(out)
    }

    async fn apply_changes(&self, zone: &str, changes: &[RecordChange]) -> Result<usize, DnsError> {
        let mut calls = 0;
        for chunk in changes.chunks(MAX_CHANGES_PER_CALL) {
            let mut current = BTreeMap::new();
            for c in chunk {
                let r = match c {
                    RecordChange::Upsert(r) | RecordChange::Delete(r) => r,
                };
                let key = (r.name.clone(), r.rtype.clone());
                if let std::collections::btree_map::Entry::Vacant(slot) = current.entry(key) {
                    if let Some(have) = self.current(zone, &r.name, &r.rtype).await? {
                        slot.insert(have);
                    }
                }
            }
            let body = change_body(chunk, &current)?;
            if body["deletions"].as_array().is_some_and(Vec::is_empty) && body["additions"].as_array().is_some_and(Vec::is_empty) {
                continue;
            }
            let change = self.api.post(&format!("{}/changes", self.zone_url(zone)), &body).await.map_err(|e| api_err("changes.create", zone, e))?;
            self.wait_done(zone, &change).await?;
            calls += 1;
        }
        Ok(calls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(name: &str, ttl: i64, values: &[&str]) -> Record {
        Record { name: name.into(), rtype: "A".into(), ttl, values: values.iter().map(|v| v.to_string()).collect() }
    }

    #[test]
    fn an_upsert_deletes_what_is_there_exactly_and_adds_the_new_set() {
        // As served: data in the server's order, which the deletion must repeat.
        let served = json!({"kind": "dns#resourceRecordSet", "name": "api.x.example.com.", "type": "A", "ttl": 300, "rrdatas": ["10.0.0.9", "10.0.0.1"]});
        let current = BTreeMap::from([(("api.x.example.com".to_string(), "A".to_string()), served.clone())]);
        let body = change_body(&[RecordChange::Upsert(rec("api.x.example.com", 60, &["10.0.0.2"]))], &current).unwrap();
        assert_eq!(body["deletions"], json!([served]));
        assert_eq!(body["additions"], json!([rrset(&rec("api.x.example.com", 60, &["10.0.0.2"]))]));
        // Already right: nothing.
        let same = change_body(&[RecordChange::Upsert(rec("api.x.example.com", 300, &["10.0.0.1", "10.0.0.9"]))], &current).unwrap();
        assert_eq!((same["deletions"].as_array().unwrap().len(), same["additions"].as_array().unwrap().len()), (0, 0));
        // New name: an addition only.
        let new = change_body(&[RecordChange::Upsert(rec("etcd-a.internal.x.example.com", 60, &["10.0.0.3"]))], &current).unwrap();
        assert_eq!((new["deletions"].as_array().unwrap().len(), new["additions"].as_array().unwrap().len()), (0, 1));
    }

    #[test]
    fn a_delete_removes_only_the_exact_set() {
        let served = json!({"name": "api.x.example.com.", "type": "A", "ttl": 60, "rrdatas": ["10.0.0.1"]});
        let current = BTreeMap::from([(("api.x.example.com".to_string(), "A".to_string()), served.clone())]);
        let body = change_body(&[RecordChange::Delete(rec("api.x.example.com", 60, &["10.0.0.1"]))], &current).unwrap();
        assert_eq!(body["deletions"], json!([served]));
        assert!(change_body(&[RecordChange::Delete(rec("api.x.example.com", 60, &["10.0.0.7"]))], &current).is_err(), "changed since read");
        let gone = change_body(&[RecordChange::Delete(rec("nope.x.example.com", 60, &["10.0.0.1"]))], &current).unwrap();
        assert!(gone["deletions"].as_array().unwrap().is_empty());
    }
}
