//! A Cloud DNS v1 emulator for the harness (`/dns/v1/projects/{project}/managedZones…`, in
//! process). It follows the REST reference (`dns/v1/dns-api.json`): managed zones are made with
//! their apex SOA and NS record sets; `changes.create` applies its deletions then additions
//! atomically (all or nothing): a deletion must match the existing record set exactly (TTL and
//! data) or the change is refused with 412 `conditionNotMet`, a deletion of a missing record set is
//! 404 `notFound`, and an addition of a name/type that exists is 409 `alreadyExists`; a change is
//! `pending` for [`DnsConfig::change_delay`], then `done`. Checked with Google's Go client
//! (`google.golang.org/api/dns/v1`) by this crate's `gce_api_wire` test. Serve it beside Compute
//! with [`crate::gce_compute::GceCompute::start_with`], or alone with [`CloudDns::start`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use crate::google_api::{body_object, now_rfc3339, paginate, query, random_id, require_bearer, ApiError};
use crate::httpd::{Request, Response, Server};

const PREFIX: &str = "/dns/v1/projects/";

#[derive(Debug, Clone)]
pub struct DnsConfig {
    pub project: String,
    /// How long a change stays `pending`.
    pub change_delay: Duration,
}

impl DnsConfig {
    pub fn example() -> DnsConfig {
        DnsConfig { project: "acme-prod".into(), change_delay: Duration::from_millis(100) }
    }
}

/// A record set as the harness reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordSet {
    pub name: String,
    pub kind: String,
    pub ttl: i64,
    pub rrdatas: Vec<String>,
}

struct Change {
    body: Value,
    done_at: Instant,
}

struct Zone {
    body: Value,
    /// (name, type) → the record set as served.
    rrsets: BTreeMap<(String, String), Value>,
    changes: Vec<Change>,
}

struct DnsState {
    cfg: DnsConfig,
    zones: BTreeMap<String, Zone>,
}

#[derive(Clone)]
pub struct CloudDns {
    state: Arc<Mutex<DnsState>>,
}

impl CloudDns {
    pub fn new(cfg: DnsConfig) -> CloudDns {
        CloudDns { state: Arc::new(Mutex::new(DnsState { cfg, zones: BTreeMap::new() })) }
    }

    fn lock(&self) -> MutexGuard<'_, DnsState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Serve on 127.0.0.1; point Google's client at `server.url("")`.
    pub fn start(&self) -> Server {
        let me = self.clone();
        Server::start(Arc::new(move |req: &Request| me.answer(req)))
    }

    pub fn answer(&self, req: &Request) -> Response {
        let r = require_bearer(req).and_then(|_| route(&mut self.lock(), req));
        match r {
            Ok(v) => crate::google_api::json_response(200, &v),
            Err(e) => e.response(),
        }
    }

    /// The record sets of a zone (by its name), or `None` if there is no such zone.
    pub fn record_sets(&self, zone: &str) -> Option<Vec<RecordSet>> {
        let st = self.lock();
        let z = st.zones.get(zone)?;
        Some(z.rrsets.values().map(record_set).collect())
    }

    /// Every A record of every zone: name → addresses.
    pub fn a_records(&self) -> BTreeMap<String, Vec<String>> {
        let st = self.lock();
        st.zones.values().flat_map(|z| z.rrsets.values()).map(record_set).filter(|r| r.kind == "A").map(|r| (r.name, r.rrdatas)).collect()
    }
}

fn record_set(v: &Value) -> RecordSet {
    RecordSet {
        name: v["name"].as_str().unwrap_or_default().into(),
        kind: v["type"].as_str().unwrap_or_default().into(),
        ttl: v["ttl"].as_i64().unwrap_or(0),
        rrdatas: v["rrdatas"].as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_string).collect(),
    }
}

fn route(st: &mut DnsState, req: &Request) -> Result<Value, ApiError> {
    let q = query(&req.query);
    let rest = req.path.strip_prefix(PREFIX).ok_or_else(|| ApiError::not_found(&req.path))?;
    let segs: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    let Some((&project, segs)) = segs.split_first() else {
        return Err(ApiError::not_found(&req.path));
    };
    if project != st.cfg.project {
        return Err(ApiError::new(403, "forbidden", format!("The caller does not have permission (project '{project}')")));
    }
    match (req.method.as_str(), segs) {
        ("POST", ["managedZones"]) => zone_create(st, body_object(req)?),
        ("GET", ["managedZones"]) => {
            let dns_name = q.get("dnsName").cloned().unwrap_or_default();
            let zones: Vec<Value> = st.zones.values().map(|z| z.body.clone()).filter(|z| dns_name.is_empty() || z["dnsName"] == dns_name.as_str()).collect();
            let (page, next) = paginate(zones, &q, 1000)?;
            Ok(with_token(json!({"kind": "dns#managedZonesListResponse", "managedZones": page}), next))
        }
        ("GET", ["managedZones", z]) => Ok(zone(st, z)?.body.clone()),
        ("DELETE", ["managedZones", z]) => {
            let only_apex = zone(st, z)?.rrsets.values().all(|r| matches!(r["type"].as_str(), Some("SOA" | "NS")));
            if !only_apex {
                return Err(ApiError::new(400, "containerNotEmpty", format!("The resource named '{z}' cannot be deleted because it is not empty")));
            }
            st.zones.remove(*z);
            Ok(json!({}))
        }
        ("GET", ["managedZones", z, "rrsets"]) => {
            let zone = zone(st, z)?;
            let name = q.get("name").filter(|n| !n.is_empty());
            let kind = q.get("type").filter(|t| !t.is_empty());
            if kind.is_some() && name.is_none() {
                return Err(ApiError::invalid("Invalid value for 'parameters.type': a type filter needs a name filter"));
            }
            let sets: Vec<Value> = zone
                .rrsets
                .values()
                .filter(|r| name.is_none_or(|n| r["name"] == n.as_str()) && kind.is_none_or(|t| r["type"] == t.as_str()))
                .cloned()
                .collect();
            let (page, next) = paginate(sets, &q, 1000)?;
            Ok(with_token(json!({"kind": "dns#resourceRecordSetsListResponse", "rrsets": page}), next))
        }
        ("POST", ["managedZones", z, "changes"]) => change_create(st, z, body_object(req)?),
        ("GET", ["managedZones", z, "changes"]) => {
            let zone = zone(st, z)?;
            let changes: Vec<Value> = zone.changes.iter().map(render_change).collect();
            let (page, next) = paginate(changes, &q, 1000)?;
            Ok(with_token(json!({"kind": "dns#changesListResponse", "changes": page}), next))
        }
        ("GET", ["managedZones", z, "changes", id]) => {
            let zone = zone(st, z)?;
            zone.changes.iter().find(|c| c.body["id"] == *id).map(render_change).ok_or_else(|| not_found_named("parameters.changeId", id))
        }
        _ => Err(ApiError::not_found(&req.path)),
    }
}

/// Cloud DNS's not-found: "The 'entity' resource named 'name' does not exist."
fn not_found_named(entity: &str, name: &str) -> ApiError {
    ApiError::new(404, "notFound", format!("The '{entity}' resource named '{name}' does not exist."))
}

fn with_token(mut v: Value, next: Option<String>) -> Value {
    if let Some(t) = next {
        v["nextPageToken"] = json!(t);
    }
    v
}

fn zone<'a>(st: &'a DnsState, name: &str) -> Result<&'a Zone, ApiError> {
    st.zones.get(name).ok_or_else(|| not_found_named("parameters.managedZone", name))
}

fn render_change(c: &Change) -> Value {
    let mut v = c.body.clone();
    v["status"] = json!(if Instant::now() >= c.done_at { "done" } else { "pending" });
    v
}

fn zone_create(st: &mut DnsState, body: Map<String, Value>) -> Result<Value, ApiError> {
    let name = body.get("name").and_then(Value::as_str).ok_or_else(|| ApiError::required("entity.managedZone.name"))?.to_string();
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.as_bytes()[0].is_ascii_alphabetic()
        && name.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-');
    if !ok {
        return Err(ApiError::invalid(format!("Invalid value for 'entity.managedZone.name': '{name}'")));
    }
    let dns_name = body.get("dnsName").and_then(Value::as_str).ok_or_else(|| ApiError::required("entity.managedZone.dnsName"))?.to_string();
    if !dns_name.ends_with('.') || dns_name.len() < 2 {
        return Err(ApiError::invalid(format!("Invalid value for 'entity.managedZone.dnsName': '{dns_name}'")));
    }
    if st.zones.contains_key(&name) {
        return Err(ApiError::new(409, "alreadyExists", format!("The resource 'entity.managedZone' named '{name}' already exists")));
    }
    let ns: Vec<String> = ["a", "b", "c", "d"].iter().map(|x| format!("ns-cloud-{x}1.googledomains.com.")).collect();
    let mut v = Value::Object(body);
    v["kind"] = json!("dns#managedZone");
    v["id"] = json!(random_id().to_string());
    v["creationTime"] = json!(now_rfc3339());
    v["nameServers"] = json!(ns);
    v["visibility"] = v.get("visibility").cloned().unwrap_or(json!("public"));
    if v.get("description").is_none() {
        v["description"] = json!("");
    }
    let soa = rrset(&dns_name, "SOA", 21600, vec![format!("{} cloud-dns-hostmaster.google.com. 1 21600 3600 259200 300", ns[0])]);
    let nsr = rrset(&dns_name, "NS", 21600, ns);
    let rrsets = BTreeMap::from([((dns_name.clone(), "NS".to_string()), nsr.clone()), ((dns_name, "SOA".to_string()), soa.clone())]);
    let change0 = Change {
        body: json!({"kind": "dns#change", "id": "0", "startTime": now_rfc3339(), "additions": [nsr, soa], "deletions": []}),
        done_at: Instant::now(),
    };
    st.zones.insert(name, Zone { body: v.clone(), rrsets, changes: vec![change0] });
    Ok(v)
}

fn rrset(name: &str, kind: &str, ttl: i64, rrdatas: Vec<String>) -> Value {
    json!({"kind": "dns#resourceRecordSet", "name": name, "type": kind, "ttl": ttl, "rrdatas": rrdatas})
}

/// A record set of a change, checked against the zone and normalised (kind, TTL default).
fn checked_rrset(field: &str, zone_name: &str, v: &Value) -> Result<Value, ApiError> {
    let bad = |what: &str, val: &str| ApiError::invalid(format!("Invalid value for '{field}.{what}': '{val}'"));
    let name = v["name"].as_str().unwrap_or("");
    if !name.ends_with('.') || !(name == zone_name || name.ends_with(&format!(".{zone_name}"))) {
        return Err(bad("name", name));
    }
    let kind = v["type"].as_str().unwrap_or("");
    const TYPES: [&str; 14] = ["A", "AAAA", "CAA", "CNAME", "DNSKEY", "DS", "MX", "NAPTR", "NS", "PTR", "SOA", "SPF", "SRV", "TXT"];
    if !TYPES.contains(&kind) {
        return Err(bad("type", kind));
    }
    let rrdatas: Vec<String> = v["rrdatas"].as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_string).collect();
    if rrdatas.is_empty() {
        return Err(ApiError::required(&format!("{field}.rrdata")));
    }
    if kind == "A" {
        if let Some(d) = rrdatas.iter().find(|d| d.parse::<std::net::Ipv4Addr>().is_err()) {
            return Err(bad("rrdata[0]", d));
        }
    }
    let ttl = v["ttl"].as_i64().unwrap_or(300);
    if ttl < 0 {
        return Err(bad("ttl", &ttl.to_string()));
    }
    Ok(rrset(name, kind, ttl, rrdatas))
}

fn change_create(st: &mut DnsState, zone_name: &str, body: Map<String, Value>) -> Result<Value, ApiError> {
    let delay = st.cfg.change_delay;
    let zone = st.zones.get_mut(zone_name).ok_or_else(|| not_found_named("parameters.managedZone", zone_name))?;
    let dns_name = zone.body["dnsName"].as_str().unwrap_or_default().to_string();
    let list = |k: &str| body.get(k).and_then(Value::as_array).cloned().unwrap_or_default();
    let (additions, deletions) = (list("additions"), list("deletions"));
    if additions.is_empty() && deletions.is_empty() {
        return Err(ApiError::required("entity.change"));
    }
    // All or nothing: work on a copy, keep it only if every step holds.
    let mut sets = zone.rrsets.clone();
    let mut dels = Vec::new();
    for (i, d) in deletions.iter().enumerate() {
        let field = format!("entity.change.deletions[{i}]");
        let d = checked_rrset(&field, &dns_name, d)?;
        let key = (d["name"].as_str().unwrap_or_default().to_string(), d["type"].as_str().unwrap_or_default().to_string());
        let Some(existing) = sets.get(&key) else {
            return Err(not_found_named(&field, &format!("{} ({})", key.0, key.1)));
        };
        if existing["ttl"] != d["ttl"] || existing["rrdatas"] != d["rrdatas"] {
            return Err(ApiError::condition_not_met(format!("Precondition not met for '{field}'")));
        }
        if key.0 == dns_name && key.1 == "SOA" {
            return Err(ApiError::invalid(format!("Invalid value for '{field}': the SOA record of the zone cannot be deleted")));
        }
        sets.remove(&key);
        dels.push(d);
    }
    let mut adds = Vec::new();
    for (i, a) in additions.iter().enumerate() {
        let field = format!("entity.change.additions[{i}]");
        let a = checked_rrset(&field, &dns_name, a)?;
        let key = (a["name"].as_str().unwrap_or_default().to_string(), a["type"].as_str().unwrap_or_default().to_string());
        if sets.contains_key(&key) {
            return Err(ApiError::new(409, "alreadyExists", format!("The resource '{field}' named '{} ({})' already exists", key.0, key.1)));
        }
        let cname_clash = sets.keys().any(|(n, t)| *n == key.0 && (t == "CNAME" || key.1 == "CNAME"));
        if cname_clash {
            return Err(ApiError::new(409, "alreadyExists", format!("The resource '{field}' named '{} (CNAME)' conflicts with an existing record set", key.0)));
        }
        sets.insert(key, a.clone());
        adds.push(a);
    }
    zone.rrsets = sets;
    let id = zone.changes.len().to_string();
    let change = Change {
        body: json!({"kind": "dns#change", "id": id, "startTime": now_rfc3339(), "additions": adds, "deletions": dels}),
        done_at: Instant::now() + delay,
    };
    let served = render_change(&change);
    zone.changes.push(change);
    Ok(served)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(d: &CloudDns, method: &str, path: &str, body: Value) -> (u16, Value) {
        let r = d.answer(&crate::google_api::bearer_request(method, path, &body));
        let v = match r.body {
            crate::httpd::Body::Bytes(b) => serde_json::from_slice(&b).unwrap_or(Value::Null),
            _ => Value::Null,
        };
        (r.status, v)
    }

    #[test]
    fn changes_are_atomic_and_deletions_must_match_exactly() {
        let d = CloudDns::new(DnsConfig { project: "p".into(), change_delay: Duration::ZERO });
        let base = "/dns/v1/projects/p/managedZones";
        assert_eq!(call(&d, "POST", base, json!({"name": "z", "dnsName": "example.com.", "description": ""})).0, 200);
        let a = |name: &str, ip: &str, ttl: i64| json!({"name": name, "type": "A", "ttl": ttl, "rrdatas": [ip]});
        let changes = format!("{base}/z/changes");
        let (s, c) = call(&d, "POST", &changes, json!({"additions": [a("api.example.com.", "10.0.0.1", 60)]}));
        assert_eq!((s, c["status"].as_str()), (200, Some("done")), "{c}");
        // A deletion that does not match exactly (another TTL) is refused, and nothing else happens.
        let (s, e) =
            call(&d, "POST", &changes, json!({"deletions": [a("api.example.com.", "10.0.0.1", 300)], "additions": [a("etcd.example.com.", "10.0.0.2", 60)]}));
        assert_eq!((s, e["error"]["errors"][0]["reason"].as_str()), (412, Some("conditionNotMet")), "{e}");
        assert_eq!(d.a_records(), BTreeMap::from([("api.example.com.".to_string(), vec!["10.0.0.1".to_string()])]));
        // An addition that exists is 409, and the deletion before it in the same change is undone.
        let (s, e) = call(
            &d,
            "POST",
            &changes,
            json!({"deletions": [a("api.example.com.", "10.0.0.1", 60)], "additions": [a("api.example.com.", "10.0.0.3", 60), a("api.example.com.", "10.0.0.4", 60)]}),
        );
        assert_eq!((s, e["error"]["errors"][0]["reason"].as_str()), (409, Some("alreadyExists")), "{e}");
        assert_eq!(d.a_records()["api.example.com."], vec!["10.0.0.1"]);
        // A deletion of nothing is 404.
        let (s, _) = call(&d, "POST", &changes, json!({"deletions": [a("nope.example.com.", "10.0.0.1", 60)]}));
        assert_eq!(s, 404);
        // Replace: exact deletion plus addition in one change.
        let (s, _) =
            call(&d, "POST", &changes, json!({"deletions": [a("api.example.com.", "10.0.0.1", 60)], "additions": [a("api.example.com.", "10.0.0.9", 60)]}));
        assert_eq!(s, 200);
        assert_eq!(d.a_records()["api.example.com."], vec!["10.0.0.9"]);
        // Outside the zone, or not a name with a final dot: 400.
        assert_eq!(call(&d, "POST", &changes, json!({"additions": [a("api.other.com.", "10.0.0.1", 60)]})).0, 400);
        assert_eq!(call(&d, "POST", &changes, json!({"additions": [a("x.example.com", "10.0.0.1", 60)]})).0, 400);
        // The zone came with SOA and NS; filters by name and type.
        let (_, l) = call(&d, "GET", &format!("{base}/z/rrsets"), Value::Null);
        let types: Vec<&str> = l["rrsets"].as_array().unwrap().iter().filter_map(|r| r["type"].as_str()).collect();
        assert_eq!(types, ["A", "NS", "SOA"]);
        let mut r = crate::google_api::bearer_request("GET", &format!("{base}/z/rrsets"), &Value::Null);
        r.query = "name=api.example.com.&type=A".into();
        let filtered: Value = match d.answer(&r).body {
            crate::httpd::Body::Bytes(b) => serde_json::from_slice(&b).unwrap(),
            _ => Value::Null,
        };
        assert_eq!(filtered["rrsets"].as_array().unwrap().len(), 1);
        // changes.get: ids in order, 0 being the zone's creation.
        let (s, c) = call(&d, "GET", &format!("{base}/z/changes/1"), Value::Null);
        assert_eq!((s, c["additions"][0]["name"].as_str()), (200, Some("api.example.com.")));
        assert_eq!(call(&d, "GET", &format!("{base}/z/changes/99"), Value::Null).0, 404);
    }

    #[test]
    fn changes_are_pending_then_done_and_auth_is_required() {
        let d = CloudDns::new(DnsConfig { project: "p".into(), change_delay: Duration::from_millis(150) });
        call(&d, "POST", "/dns/v1/projects/p/managedZones", json!({"name": "z", "dnsName": "example.com."}));
        let (_, c) = call(
            &d,
            "POST",
            "/dns/v1/projects/p/managedZones/z/changes",
            json!({"additions": [{"name": "a.example.com.", "type": "A", "ttl": 1, "rrdatas": ["10.1.1.1"]}]}),
        );
        assert_eq!(c["status"], "pending");
        std::thread::sleep(Duration::from_millis(200));
        let (_, c) = call(&d, "GET", &format!("/dns/v1/projects/p/managedZones/z/changes/{}", c["id"].as_str().unwrap()), Value::Null);
        assert_eq!(c["status"], "done");
        let mut r = crate::google_api::bearer_request("GET", "/dns/v1/projects/p/managedZones", &Value::Null);
        r.headers.clear();
        assert_eq!(d.answer(&r).status, 401);
    }
}
