//! The emulator's whole world: the resources of one project, their links, and the passage of time
//! (operations finish, instances boot, disks become ready, MIGs heal) in [`State::advance`].

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::Config;
use crate::google_api::ApiError;

/// Where an operation or resource lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    Zone(String),
    Region(String),
    Global,
}

impl Scope {
    /// `zones/z`, `regions/r` or `global`.
    pub fn path(&self) -> String {
        match self {
            Scope::Zone(z) => format!("zones/{z}"),
            Scope::Region(r) => format!("regions/{r}"),
            Scope::Global => "global".into(),
        }
    }
}

/// A VM. `body` is the resource as served except `status` (kept here, moved by time and the harness).
#[derive(Debug, Clone)]
pub struct Instance {
    pub body: Value,
    pub status: String,
    /// PROVISIONING becomes RUNNING then (`None`: only the harness moves it).
    pub boots_at: Option<Instant>,
    /// The MIG (same zone) that owns it.
    pub mig: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Disk {
    /// The resource as served except `status` and `users` (derived from the instances' disks).
    pub body: Value,
    pub ready_at: Instant,
}

/// One member slot of a MIG: the instance name it keeps alive.
#[derive(Debug, Clone)]
pub struct Member {
    pub name: String,
    /// CREATING / RECREATING until the instance runs, then NONE.
    pub action: String,
    /// Why the last creation failed (retried on every [`State::advance`]).
    pub last_error: Option<ApiError>,
}

#[derive(Debug, Clone)]
pub struct Mig {
    /// The resource as served except `currentActions`, `status` (derived from the members).
    pub body: Value,
    pub members: Vec<Member>,
}

#[derive(Debug, Clone)]
pub struct Operation {
    /// The operation as served except `status`, `progress`, `endTime` and `error`.
    pub body: Value,
    pub scope: Scope,
    pub created: Instant,
    pub done_at: Instant,
    pub error: Option<ApiError>,
}

pub struct State {
    pub cfg: Config,
    /// `http://127.0.0.1:PORT/compute/v1/` once served; self links start with it.
    pub base_url: String,
    pub networks: BTreeMap<String, Value>,
    /// (region, name)
    pub subnetworks: BTreeMap<(String, String), Value>,
    pub firewalls: BTreeMap<String, Value>,
    pub routes: BTreeMap<String, Value>,
    pub templates: BTreeMap<String, Value>,
    /// (zone, name)
    pub instances: BTreeMap<(String, String), Instance>,
    pub disks: BTreeMap<(String, String), Disk>,
    pub migs: BTreeMap<(String, String), Mig>,
    pub operations: BTreeMap<String, Operation>,
    /// When the emulator started: the creation time of the project, zones and regions.
    pub started: String,
    op_counter: u64,
}

impl State {
    pub fn new(cfg: Config) -> State {
        State {
            cfg,
            base_url: "https://www.googleapis.com/compute/v1/".into(),
            networks: BTreeMap::new(),
            subnetworks: BTreeMap::new(),
            firewalls: BTreeMap::new(),
            routes: BTreeMap::new(),
            templates: BTreeMap::new(),
            instances: BTreeMap::new(),
            disks: BTreeMap::new(),
            migs: BTreeMap::new(),
            operations: BTreeMap::new(),
            started: crate::google_api::now_rfc3339(),
            op_counter: 0,
        }
    }

    /// `projects/<project>/<rel>` (what error messages name).
    pub fn rel(&self, rel: &str) -> String {
        format!("projects/{}/{rel}", self.cfg.project)
    }

    /// The self link of `projects/<project>/<rel>`.
    pub fn link(&self, rel: &str) -> String {
        format!("{}{}", self.base_url, self.rel(rel))
    }

    pub fn zone_region(&self, zone: &str) -> Option<&str> {
        self.cfg.regions.iter().find(|(_, zones)| zones.iter().any(|z| z == zone)).map(|(r, _)| r.as_str())
    }

    pub fn check_zone(&self, zone: &str) -> Result<(), ApiError> {
        self.zone_region(zone).map(|_| ()).ok_or_else(|| ApiError::not_found(&self.rel(&format!("zones/{zone}"))))
    }

    pub fn check_region(&self, region: &str) -> Result<(), ApiError> {
        if self.cfg.regions.contains_key(region) {
            Ok(())
        } else {
            Err(ApiError::not_found(&self.rel(&format!("regions/{region}"))))
        }
    }

    /// Record an operation on `target_rel` (relative to the project) and return it as served.
    pub fn operation(&mut self, scope: Scope, op_type: &str, target_rel: &str, target_id: Option<&str>, error: Option<ApiError>) -> Value {
        self.op_counter += 1;
        let now = Instant::now();
        let name = format!("operation-{}-{}", self.op_counter, crate::google_api::random_suffix(12));
        let mut body = json!({
            "kind": "compute#operation",
            "id": crate::google_api::random_id().to_string(),
            "name": name,
            "operationType": op_type,
            "targetLink": self.link(target_rel),
            "user": "keelson-emulator@example.iam.gserviceaccount.com",
            "insertTime": crate::google_api::now_rfc3339(),
            "startTime": crate::google_api::now_rfc3339(),
            "selfLink": self.link(&format!("{}/operations/{name}", scope.path())),
        });
        if let Some(id) = target_id {
            body["targetId"] = json!(id);
        }
        match &scope {
            Scope::Zone(z) => body["zone"] = json!(self.link(&format!("zones/{z}"))),
            Scope::Region(r) => body["region"] = json!(self.link(&format!("regions/{r}"))),
            Scope::Global => {}
        }
        let op = Operation { body, scope, created: now, done_at: now + self.cfg.operation_delay, error };
        let served = render_operation(&op, now);
        self.operations.insert(name, op);
        served
    }

    /// Move time forward to `now`: instances boot, disks become ready, MIG members are (re)created.
    pub fn advance(&mut self, now: Instant) {
        for inst in self.instances.values_mut() {
            if inst.status == "PROVISIONING" && inst.boots_at.is_some_and(|t| t <= now) {
                inst.status = "RUNNING".into();
            }
        }
        for d in self.disks.values_mut() {
            if d.ready_at <= now {
                d.body["status"] = json!("READY");
            }
        }
        super::migs::reconcile(self);
    }

    /// When a PROVISIONING instance made now boots by itself (`None`: the harness boots it).
    pub fn boot_time(&self) -> Option<Instant> {
        self.cfg.boot_delay.map(|d| Instant::now() + d)
    }

    pub fn disk_ready_time(&self) -> Instant {
        Instant::now() + self.cfg.operation_delay
    }
}

/// An operation as served at `now`: PENDING for the first quarter of its delay, RUNNING until its
/// end, then DONE (with `error` if it failed).
pub fn render_operation(op: &Operation, now: Instant) -> Value {
    let mut v = op.body.clone();
    let total = op.done_at.saturating_duration_since(op.created);
    let elapsed = now.saturating_duration_since(op.created);
    let (status, progress) = if now >= op.done_at {
        ("DONE", 100)
    } else if elapsed >= total / 4 {
        ("RUNNING", (elapsed.as_millis() * 100 / total.as_millis().max(1)).min(99) as u64)
    } else {
        ("PENDING", 0)
    };
    v["status"] = json!(status);
    v["progress"] = json!(progress);
    if status == "DONE" {
        v["endTime"] = json!(crate::google_api::rfc3339(std::time::SystemTime::now() - now.saturating_duration_since(op.done_at)));
        if let Some(e) = &op.error {
            v["error"] = json!({"errors": [{"code": operation_error_code(e), "message": e.message}]});
            v["httpErrorStatusCode"] = json!(e.code);
            v["httpErrorMessage"] = json!(http_error_message(e.code));
        }
    }
    v
}

/// An operation's error code: Google's upper-case form of the reason.
fn operation_error_code(e: &ApiError) -> String {
    match e.reason {
        "resourceInUseByAnotherResource" => "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE".into(),
        "notFound" => "RESOURCE_NOT_FOUND".into(),
        "alreadyExists" => "RESOURCE_ALREADY_EXISTS".into(),
        "conditionNotMet" => "CONDITION_NOT_MET".into(),
        other => {
            let mut s = String::new();
            for c in other.chars() {
                if c.is_ascii_uppercase() {
                    s.push('_');
                }
                s.push(c.to_ascii_uppercase());
            }
            s
        }
    }
}

fn http_error_message(code: u16) -> &'static str {
    match code {
        400 => "BAD REQUEST",
        404 => "NOT FOUND",
        409 => "CONFLICT",
        412 => "PRECONDITION FAILED",
        _ => "ERROR",
    }
}

/// How long until `op` is done (zero if it is).
pub fn remaining(op: &Operation, now: Instant) -> Duration {
    op.done_at.saturating_duration_since(now)
}

/// The last path segment of a link or partial URL (`…/instanceTemplates/t` → `t`).
pub fn last_segment(link: &str) -> &str {
    link.trim_end_matches('/').rsplit('/').next().unwrap_or(link)
}

/// The segment after `collection` in a link (`…/zones/z/disks/d`, `zones` → `z`).
pub fn segment_after<'a>(link: &'a str, collection: &str) -> Option<&'a str> {
    let mut it = link.split('/');
    while let Some(s) = it.next() {
        if s == collection {
            return it.next();
        }
    }
    None
}

/// A resource name must be RFC 1035: `[a-z]([-a-z0-9]{0,61}[a-z0-9])?`.
pub fn check_name(name: &str) -> Result<(), ApiError> {
    let b = name.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase()
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[b.len() - 1] != b'-';
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(format!("Invalid value for field 'resource.name': '{name}'. Must be a match of regex '(?:[a-z](?:[-a-z0-9]{{0,61}}[a-z0-9])?)'")))
    }
}

/// Labels as GCE accepts them: keys `[a-z][a-z0-9_-]{0,62}`, values `[a-z0-9_-]{0,63}`, at most 64.
pub fn check_labels(labels: &Value) -> Result<(), ApiError> {
    let Some(m) = labels.as_object() else {
        return if labels.is_null() { Ok(()) } else { Err(ApiError::invalid("Invalid value for field 'labels': must be a map")) };
    };
    if m.len() > 64 {
        return Err(ApiError::invalid("Invalid value for field 'labels': at most 64 labels"));
    }
    let chars = |s: &str| s.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_' || c == b'-');
    for (k, v) in m {
        let Some(v) = v.as_str() else {
            return Err(ApiError::invalid(format!("Invalid value for field 'labels.{k}': not a string")));
        };
        if k.is_empty() || k.len() > 63 || !k.as_bytes()[0].is_ascii_lowercase() || !chars(k) {
            return Err(ApiError::invalid(format!("Invalid value for field 'labels': '{k}'. Label keys must start with a lowercase letter and contain only lowercase letters, digits, '_' and '-' (at most 63)")));
        }
        if v.len() > 63 || !chars(v) {
            return Err(ApiError::invalid(format!(
                "Invalid value for field 'labels.{k}': '{v}'. Label values contain only lowercase letters, digits, '_' and '-' (at most 63)"
            )));
        }
    }
    Ok(())
}

/// A string field of a JSON object, or "".
pub fn str_of<'a>(v: &'a Value, field: &str) -> &'a str {
    v.get(field).and_then(Value::as_str).unwrap_or("")
}
