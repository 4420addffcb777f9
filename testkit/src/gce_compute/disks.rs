//! Persistent disks (zonal): insert/get/delete/list, setLabels with the label fingerprint, and
//! `users[]` derived from the instances they are attached to.

use serde_json::{json, Map, Value};

use super::network::{in_use, strip_base};
use super::state::{check_labels, check_name, last_segment, str_of, Disk, Scope, State};
use crate::google_api::{fingerprint, now_rfc3339, random_id, ApiError};

/// The label fingerprint of a label map (`{}` when there are none).
pub fn label_fingerprint(labels: Option<&Value>) -> String {
    fingerprint(labels.filter(|l| !l.is_null()).unwrap_or(&json!({})))
}

/// A disk type reference as a full link (`pd-ssd`, `zones/z/diskTypes/pd-ssd` or a URL).
fn disk_type_link(st: &State, zone: &str, t: &str) -> String {
    let t = if t.is_empty() { "pd-standard" } else { last_segment(t) };
    st.link(&format!("zones/{zone}/diskTypes/{t}"))
}

/// Make a disk (what `disks.insert` and instance boot disks share). Fails 409 if the name is taken.
pub fn create(st: &mut State, zone: &str, body: Map<String, Value>) -> Result<Value, ApiError> {
    st.check_zone(zone)?;
    let name = body.get("name").and_then(Value::as_str).ok_or_else(|| ApiError::required("resource.name"))?.to_string();
    check_name(&name)?;
    let rel = format!("zones/{zone}/disks/{name}");
    if st.disks.contains_key(&(zone.to_string(), name.clone())) {
        return Err(ApiError::already_exists(&st.rel(&rel)));
    }
    let mut v = Value::Object(body);
    check_labels(&v["labels"])?;
    let size = match &v["sizeGb"] {
        Value::String(s) => s.parse::<u64>().map_err(|_| ApiError::invalid(format!("Invalid value for field 'resource.sizeGb': '{s}'.")))?,
        Value::Number(n) => n.as_u64().unwrap_or(0),
        _ => 10,
    };
    if size == 0 {
        return Err(ApiError::invalid("Invalid value for field 'resource.sizeGb': '0'. Disk size must be at least 1 GB."));
    }
    v["sizeGb"] = json!(size.to_string());
    v["type"] = json!(disk_type_link(st, zone, str_of(&v, "type")));
    v["kind"] = json!("compute#disk");
    v["id"] = json!(random_id().to_string());
    v["creationTimestamp"] = json!(now_rfc3339());
    v["zone"] = json!(st.link(&format!("zones/{zone}")));
    v["selfLink"] = json!(st.link(&rel));
    v["status"] = json!("CREATING");
    v["physicalBlockSizeBytes"] = v.get("physicalBlockSizeBytes").cloned().unwrap_or(json!("4096"));
    v["labelFingerprint"] = json!(label_fingerprint(v.get("labels")));
    let served = v.clone();
    st.disks.insert((zone.to_string(), name), Disk { body: v, ready_at: st.disk_ready_time() });
    Ok(served)
}

pub fn insert(st: &mut State, zone: &str, body: Map<String, Value>) -> Result<Value, ApiError> {
    let d = create(st, zone, body)?;
    let rel = format!("zones/{zone}/disks/{}", str_of(&d, "name"));
    Ok(st.operation(Scope::Zone(zone.into()), "insert", &rel, d["id"].as_str(), None))
}

/// The instances (self links) that have the disk `link` attached, with their modes.
pub fn users(st: &State, link: &str) -> Vec<(String, String)> {
    st.instances
        .values()
        .flat_map(|i| {
            i.body["disks"].as_array().into_iter().flatten().filter(|d| str_of(d, "source") == link).map(|d| {
                let mode = if str_of(d, "mode").is_empty() { "READ_WRITE" } else { str_of(d, "mode") };
                (str_of(&i.body, "selfLink").to_string(), mode.to_string())
            })
        })
        .collect()
}

pub fn render(st: &State, d: &Disk) -> Value {
    let mut v = d.body.clone();
    let users: Vec<String> = users(st, str_of(&v, "selfLink")).into_iter().map(|(u, _)| u).collect();
    if !users.is_empty() {
        v["users"] = json!(users);
    }
    v
}

pub fn get(st: &State, zone: &str, name: &str) -> Result<Value, ApiError> {
    st.check_zone(zone)?;
    st.disks
        .get(&(zone.to_string(), name.to_string()))
        .map(|d| render(st, d))
        .ok_or_else(|| ApiError::not_found(&st.rel(&format!("zones/{zone}/disks/{name}"))))
}

pub fn list(st: &State, zone: &str) -> Result<Vec<Value>, ApiError> {
    st.check_zone(zone)?;
    Ok(st.disks.iter().filter(|((z, _), _)| z == zone).map(|(_, d)| render(st, d)).collect())
}

/// Delete a disk; one still attached is refused in the operation, as GCE does.
pub fn delete(st: &mut State, zone: &str, name: &str) -> Result<Value, ApiError> {
    let v = get(st, zone, name)?;
    let rel = format!("zones/{zone}/disks/{name}");
    let id = str_of(&v, "id").to_string();
    if let Some(user) = v["users"].as_array().and_then(|u| u.first()).and_then(Value::as_str) {
        let e = in_use("disk", &st.rel(&rel), user);
        return Ok(st.operation(Scope::Zone(zone.into()), "delete", &rel, Some(&id), Some(e)));
    }
    st.disks.remove(&(zone.to_string(), name.to_string()));
    Ok(st.operation(Scope::Zone(zone.into()), "delete", &rel, Some(&id), None))
}

/// Check a label change against the current fingerprint and apply it to `resource`.
pub fn apply_labels(resource: &mut Value, body: &Map<String, Value>) -> Result<(), ApiError> {
    let sent = body.get("labelFingerprint").and_then(Value::as_str).unwrap_or("");
    let current = label_fingerprint(resource.get("labels"));
    if sent != current {
        return Err(ApiError::condition_not_met(format!("Labels fingerprint either invalid or resource labels have changed (sent '{sent}')")));
    }
    let labels = body.get("labels").cloned().unwrap_or(json!({}));
    check_labels(&labels)?;
    resource["labels"] = labels;
    resource["labelFingerprint"] = json!(label_fingerprint(resource.get("labels")));
    Ok(())
}

pub fn set_labels(st: &mut State, zone: &str, name: &str, body: Map<String, Value>) -> Result<Value, ApiError> {
    st.check_zone(zone)?;
    let rel = format!("zones/{zone}/disks/{name}");
    let not_found = ApiError::not_found(&st.rel(&rel));
    let d = st.disks.get_mut(&(zone.to_string(), name.to_string())).ok_or(not_found)?;
    apply_labels(&mut d.body, &body)?;
    let id = str_of(&d.body, "id").to_string();
    Ok(st.operation(Scope::Zone(zone.into()), "setLabels", &rel, Some(&id), None))
}

/// The (zone, name) of the disk a `source` reference names, which must exist in `zone`.
pub fn resolve(st: &State, zone: &str, source: &str) -> Result<(String, String), ApiError> {
    let z = super::state::segment_after(source, "zones").unwrap_or(zone);
    let name = last_segment(source);
    if source.is_empty() {
        return Err(ApiError::required("resource.source"));
    }
    if !st.disks.contains_key(&(z.to_string(), name.to_string())) {
        return Err(ApiError::not_found(&st.rel(&format!("zones/{z}/disks/{name}"))));
    }
    if z != zone {
        return Err(ApiError::invalid(format!(
            "Invalid value for field 'resource.source': '{}'. Disk must be in the instance's zone '{zone}'.",
            strip_base(source)
        )));
    }
    Ok((z.to_string(), name.to_string()))
}
