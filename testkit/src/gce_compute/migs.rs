//! Zonal managed instance groups: they keep `targetSize` instances named
//! `<baseInstanceName>-<4 random [a-z0-9]>` made from their template, remake one that is deleted or
//! dies (same name, new id), and resize, recreate, delete and list their instances.

use serde_json::{json, Map, Value};

use super::instances;
use super::state::{check_name, last_segment, str_of, Member, Mig, Scope, State};
use crate::google_api::{fingerprint, now_rfc3339, random_id, random_suffix, ApiError};

fn key(zone: &str, name: &str) -> (String, String) {
    (zone.to_string(), name.to_string())
}

fn not_found(st: &State, zone: &str, name: &str) -> ApiError {
    ApiError::not_found(&st.rel(&format!("zones/{zone}/instanceGroupManagers/{name}")))
}

/// The template a reference names, which must exist.
fn template_ref(st: &State, reference: &str) -> Result<String, ApiError> {
    if reference.is_empty() {
        return Err(ApiError::required("resource.instanceTemplate"));
    }
    let name = last_segment(reference);
    instances::template_get(st, name)?;
    Ok(name.to_string())
}

pub fn insert(st: &mut State, zone: &str, body: Map<String, Value>) -> Result<Value, ApiError> {
    st.check_zone(zone)?;
    let name = body.get("name").and_then(Value::as_str).ok_or_else(|| ApiError::required("resource.name"))?.to_string();
    check_name(&name)?;
    let rel = format!("zones/{zone}/instanceGroupManagers/{name}");
    if st.migs.contains_key(&key(zone, &name)) {
        return Err(ApiError::already_exists(&st.rel(&rel)));
    }
    let base = body.get("baseInstanceName").and_then(Value::as_str).ok_or_else(|| ApiError::required("resource.baseInstanceName"))?.to_string();
    if base.is_empty() || base.len() > 58 {
        return Err(ApiError::invalid(format!("Invalid value for field 'resource.baseInstanceName': '{base}'.")));
    }
    let tref = body
        .get("instanceTemplate")
        .and_then(Value::as_str)
        .or_else(|| body.get("versions").and_then(|v| v[0].get("instanceTemplate")).and_then(Value::as_str))
        .unwrap_or("")
        .to_string();
    let template = template_ref(st, &tref)?;
    let size = body.get("targetSize").and_then(Value::as_i64).ok_or_else(|| ApiError::required("resource.targetSize"))?;
    if size < 0 {
        return Err(ApiError::invalid(format!("Invalid value for field 'resource.targetSize': '{size}'. Must be non-negative.")));
    }
    let tlink = st.link(&format!("global/instanceTemplates/{template}"));
    let mut v = Value::Object(body);
    v["kind"] = json!("compute#instanceGroupManager");
    v["id"] = json!(random_id().to_string());
    v["creationTimestamp"] = json!(now_rfc3339());
    v["zone"] = json!(st.link(&format!("zones/{zone}")));
    v["selfLink"] = json!(st.link(&rel));
    v["instanceGroup"] = json!(st.link(&format!("zones/{zone}/instanceGroups/{name}")));
    v["instanceTemplate"] = json!(tlink);
    v["versions"] = json!([{"instanceTemplate": tlink}]);
    v["targetSize"] = json!(size);
    v["fingerprint"] = json!(fingerprint(&v));
    let id = str_of(&v, "id").to_string();
    let members = (0..size).map(|_| Member { name: String::new(), action: "CREATING".into(), last_error: None }).collect();
    st.migs.insert(key(zone, &name), Mig { body: v, members });
    reconcile(st);
    Ok(st.operation(Scope::Zone(zone.into()), "insert", &rel, Some(&id), None))
}

/// Give every member slot a live instance: name the new ones, (re)make missing or dead ones from
/// the current template, and mark those that run as done.
pub fn reconcile(st: &mut State) {
    let keys: Vec<(String, String)> = st.migs.keys().cloned().collect();
    for (zone, name) in keys {
        let Some(mig) = st.migs.get(&key(&zone, &name)).cloned() else { continue };
        let base = str_of(&mig.body, "baseInstanceName").to_string();
        let template = st.templates.get(last_segment(str_of(&mig.body, "instanceTemplate"))).cloned();
        let mut members = mig.members.clone();
        for m in &mut members {
            if m.name.is_empty() {
                m.name = loop {
                    let candidate = format!("{base}-{}", random_suffix(4));
                    if !st.instances.contains_key(&key(&zone, &candidate)) && !mig.members.iter().any(|o| o.name == candidate) {
                        break candidate;
                    }
                };
            }
            let current = st.instances.get(&key(&zone, &m.name)).map(|i| i.status.clone());
            match current.as_deref() {
                Some("RUNNING") => {
                    m.action = "NONE".into();
                    continue;
                }
                Some("TERMINATED") => {
                    // It died: the group remakes it.
                    instances::remove(st, &zone, &m.name);
                    m.action = "RECREATING".into();
                }
                Some(_) => continue,
                None => {
                    if m.action == "NONE" {
                        m.action = "RECREATING".into();
                    }
                }
            }
            let Some(t) = &template else {
                m.last_error = Some(ApiError::not_found(str_of(&mig.body, "instanceTemplate")));
                continue;
            };
            m.last_error = instances::create_from_template(st, &zone, &m.name, t, Some(&name)).err();
        }
        if let Some(g) = st.migs.get_mut(&key(&zone, &name)) {
            g.members = members;
        }
    }
}

fn managed(st: &State, zone: &str, mig: &Mig) -> Vec<Value> {
    mig.members
        .iter()
        .map(|m| {
            let mut v = json!({"name": m.name, "currentAction": m.action, "version": {"instanceTemplate": str_of(&mig.body, "instanceTemplate")}});
            if let Some(i) = st.instances.get(&key(zone, &m.name)) {
                v["instance"] = json!(str_of(&i.body, "selfLink"));
                v["id"] = json!(str_of(&i.body, "id"));
                v["instanceStatus"] = json!(i.status);
            }
            if let Some(e) = &m.last_error {
                v["lastAttempt"] = json!({"errors": {"errors": [{"code": e.reason, "message": e.message}]}});
            }
            v
        })
        .collect()
}

fn render(mig: &Mig) -> Value {
    let mut v = mig.body.clone();
    let count = |a: &str| mig.members.iter().filter(|m| m.action == a).count();
    v["currentActions"] = json!({
        "none": count("NONE"), "creating": count("CREATING"), "recreating": count("RECREATING"), "deleting": 0,
        "abandoning": 0, "creatingWithoutRetries": 0, "refreshing": 0, "restarting": 0, "verifying": 0,
        "resuming": 0, "starting": 0, "stopping": 0, "suspending": 0,
    });
    v["status"] = json!({"isStable": mig.members.iter().all(|m| m.action == "NONE"), "versionTarget": {"isReached": true}});
    v
}

pub fn get(st: &State, zone: &str, name: &str) -> Result<Value, ApiError> {
    st.check_zone(zone)?;
    st.migs.get(&key(zone, name)).map(render).ok_or_else(|| not_found(st, zone, name))
}

pub fn list(st: &State, zone: &str) -> Result<Vec<Value>, ApiError> {
    st.check_zone(zone)?;
    Ok(st.migs.iter().filter(|((z, _), _)| z == zone).map(|(_, m)| render(m)).collect())
}

pub fn list_managed(st: &State, zone: &str, name: &str) -> Result<Vec<Value>, ApiError> {
    st.check_zone(zone)?;
    let mig = st.migs.get(&key(zone, name)).ok_or_else(|| not_found(st, zone, name))?;
    Ok(managed(st, zone, mig))
}

fn op(st: &mut State, zone: &str, name: &str, op_type: &str) -> Value {
    let id = st.migs.get(&key(zone, name)).map(|m| str_of(&m.body, "id").to_string());
    st.operation(Scope::Zone(zone.into()), op_type, &format!("zones/{zone}/instanceGroupManagers/{name}"), id.as_deref(), None)
}

pub fn delete(st: &mut State, zone: &str, name: &str) -> Result<Value, ApiError> {
    get(st, zone, name)?;
    let operation = op(st, zone, name, "delete");
    if let Some(mig) = st.migs.remove(&key(zone, name)) {
        for m in mig.members {
            instances::remove(st, zone, &m.name);
        }
    }
    Ok(operation)
}

pub fn resize(st: &mut State, zone: &str, name: &str, size: &str) -> Result<Value, ApiError> {
    get(st, zone, name)?;
    let size: usize = size.parse().map_err(|_| ApiError::invalid(format!("Invalid value for field 'size': '{size}'. Must be a non-negative integer.")))?;
    let mut gone = Vec::new();
    if let Some(mig) = st.migs.get_mut(&key(zone, name)) {
        while mig.members.len() > size {
            // The newest members go first.
            if let Some(m) = mig.members.pop() {
                gone.push(m.name);
            }
        }
        while mig.members.len() < size {
            mig.members.push(Member { name: String::new(), action: "CREATING".into(), last_error: None });
        }
        mig.body["targetSize"] = json!(size);
    }
    for g in gone {
        instances::remove(st, zone, &g);
    }
    reconcile(st);
    Ok(op(st, zone, name, "compute.instanceGroupManagers.resize"))
}

/// The member names that `instances` (links) name; one that is not a member is 400.
fn members_named(st: &State, zone: &str, name: &str, body: &Map<String, Value>) -> Result<Vec<String>, ApiError> {
    let mig = st.migs.get(&key(zone, name)).ok_or_else(|| not_found(st, zone, name))?;
    let refs = body.get("instances").and_then(Value::as_array).ok_or_else(|| ApiError::required("instances"))?;
    refs.iter()
        .map(|r| {
            let r = r.as_str().unwrap_or("");
            let n = last_segment(r);
            if mig.members.iter().any(|m| m.name == n) && super::state::segment_after(r, "zones").is_none_or(|z| z == zone) {
                Ok(n.to_string())
            } else {
                Err(ApiError::invalid(format!("Invalid value for field 'instances': '{r}'. The instance is not a member of the instance group '{name}'.")))
            }
        })
        .collect()
}

/// Recreate: each named instance is deleted and made again from the current template, same name,
/// new id.
pub fn recreate(st: &mut State, zone: &str, name: &str, body: Map<String, Value>) -> Result<Value, ApiError> {
    get(st, zone, name)?;
    let names = members_named(st, zone, name, &body)?;
    for n in &names {
        instances::remove(st, zone, n);
    }
    if let Some(mig) = st.migs.get_mut(&key(zone, name)) {
        for m in mig.members.iter_mut().filter(|m| names.contains(&m.name)) {
            m.action = "RECREATING".into();
        }
    }
    reconcile(st);
    Ok(op(st, zone, name, "compute.instanceGroupManagers.recreateInstances"))
}

/// Delete the named instances and shrink the group by as many.
pub fn delete_instances(st: &mut State, zone: &str, name: &str, body: Map<String, Value>) -> Result<Value, ApiError> {
    get(st, zone, name)?;
    let names = members_named(st, zone, name, &body)?;
    if let Some(mig) = st.migs.get_mut(&key(zone, name)) {
        mig.members.retain(|m| !names.contains(&m.name));
        mig.body["targetSize"] = json!(mig.members.len());
    }
    for n in &names {
        instances::remove(st, zone, n);
    }
    Ok(op(st, zone, name, "compute.instanceGroupManagers.deleteInstances"))
}

/// New instances (and recreated ones) come from this template; running ones are left alone.
pub fn set_template(st: &mut State, zone: &str, name: &str, body: Map<String, Value>) -> Result<Value, ApiError> {
    get(st, zone, name)?;
    let t = template_ref(st, body.get("instanceTemplate").and_then(Value::as_str).unwrap_or(""))?;
    let link = st.link(&format!("global/instanceTemplates/{t}"));
    if let Some(mig) = st.migs.get_mut(&key(zone, name)) {
        mig.body["instanceTemplate"] = json!(link);
        mig.body["versions"] = json!([{"instanceTemplate": link}]);
        mig.body["fingerprint"] = json!(fingerprint(&mig.body));
    }
    Ok(op(st, zone, name, "compute.instanceGroupManagers.setInstanceTemplate"))
}
