//! Instance templates (global) and instances (zonal): an instance is made from a template by its
//! MIG, or by `instances.insert` (from its body or a `sourceInstanceTemplate`); get/list/delete, setLabels and setMetadata with fingerprints, attachDisk/detachDisk with
//! GCE's refusal of a second writer.

use serde_json::{json, Map, Value};

use super::disks::{self, apply_labels, label_fingerprint};
use super::network::{allocate_ip, resolve_subnetwork, strip_base};
use super::state::{check_labels, check_name, last_segment, str_of, Instance, Scope, State};
use crate::google_api::{fingerprint, now_rfc3339, random_id, ApiError};

// ---- templates

pub fn template_insert(st: &mut State, body: Map<String, Value>) -> Result<Value, ApiError> {
    let name = body.get("name").and_then(Value::as_str).ok_or_else(|| ApiError::required("resource.name"))?.to_string();
    check_name(&name)?;
    let rel = format!("global/instanceTemplates/{name}");
    if st.templates.contains_key(&name) {
        return Err(ApiError::already_exists(&st.rel(&rel)));
    }
    let props = body.get("properties").ok_or_else(|| ApiError::required("resource.properties"))?;
    if str_of(props, "machineType").is_empty() {
        return Err(ApiError::required("resource.properties.machineType"));
    }
    check_labels(&props["labels"])?;
    let disks = props["disks"].as_array().cloned().unwrap_or_default();
    if !disks.iter().any(|d| d["boot"].as_bool() == Some(true)) {
        return Err(ApiError::invalid("Invalid value for field 'resource.properties.disks': ''. Boot disk must be specified."));
    }
    let mut v = Value::Object(body);
    v["kind"] = json!("compute#instanceTemplate");
    v["id"] = json!(random_id().to_string());
    v["creationTimestamp"] = json!(now_rfc3339());
    v["selfLink"] = json!(st.link(&rel));
    if let Some(items) = v["properties"]["metadata"].get("items").cloned() {
        v["properties"]["metadata"]["fingerprint"] = json!(fingerprint(&items));
        v["properties"]["metadata"]["kind"] = json!("compute#metadata");
    }
    let id = str_of(&v, "id").to_string();
    st.templates.insert(name, v);
    Ok(st.operation(Scope::Global, "insert", &rel, Some(&id), None))
}

pub fn template_get(st: &State, name: &str) -> Result<Value, ApiError> {
    st.templates.get(name).cloned().ok_or_else(|| ApiError::not_found(&st.rel(&format!("global/instanceTemplates/{name}"))))
}

pub fn template_delete(st: &mut State, name: &str) -> Result<Value, ApiError> {
    let v = template_get(st, name)?;
    let rel = format!("global/instanceTemplates/{name}");
    let id = str_of(&v, "id").to_string();
    if let Some(m) = st.migs.values().find(|m| last_segment(str_of(&m.body, "instanceTemplate")) == name) {
        let e = super::network::in_use("instance_template", &st.rel(&rel), str_of(&m.body, "selfLink"));
        return Ok(st.operation(Scope::Global, "delete", &rel, Some(&id), Some(e)));
    }
    st.templates.remove(name);
    Ok(st.operation(Scope::Global, "delete", &rel, Some(&id), None))
}

// ---- instances

/// Build an instance `name` in `zone` from `template` (its boot and data disks created, an address
/// taken from its subnetwork) and add it. `mig`: the owning MIG's name, recorded in the metadata
/// items `created-by` and `instance-template` as GCE does.
pub fn create_from_template(st: &mut State, zone: &str, name: &str, template: &Value, mig: Option<&str>) -> Result<(), ApiError> {
    check_name(name)?;
    let rel = format!("zones/{zone}/instances/{name}");
    if st.instances.contains_key(&(zone.to_string(), name.to_string())) {
        return Err(ApiError::already_exists(&st.rel(&rel)));
    }
    let props = &template["properties"];
    // Resolve the network first: nothing is made if it fails.
    let mut nics = Vec::new();
    let mut taken: Vec<String> = Vec::new();
    for (i, nic) in props["networkInterfaces"].as_array().cloned().unwrap_or_else(|| vec![json!({})]).into_iter().enumerate() {
        let (subnet, network) = resolve_subnetwork(st, zone, &nic)?;
        let mut ip = allocate_ip(st, &subnet)?;
        // Two interfaces in one subnetwork: take the next free address.
        while taken.contains(&ip) {
            let n: std::net::Ipv4Addr = ip.parse().map_err(|_| ApiError::invalid("bad address"))?;
            ip = std::net::Ipv4Addr::from(u32::from(n) + 1).to_string();
        }
        taken.push(ip.clone());
        let mut n = nic.clone();
        n["kind"] = json!("compute#networkInterface");
        n["name"] = json!(format!("nic{i}"));
        n["network"] = json!(network);
        n["subnetwork"] = json!(subnet);
        n["networkIP"] = json!(ip);
        n["stackType"] = n.get("stackType").cloned().unwrap_or(json!("IPV4_ONLY"));
        if let Some(acs) = n["accessConfigs"].as_array_mut() {
            for ac in acs {
                ac["kind"] = json!("compute#accessConfig");
                ac["type"] = ac.get("type").cloned().unwrap_or(json!("ONE_TO_ONE_NAT"));
                ac["name"] = ac.get("name").cloned().unwrap_or(json!("External NAT"));
                ac["networkTier"] = ac.get("networkTier").cloned().unwrap_or(json!("PREMIUM"));
            }
        }
        n["fingerprint"] = json!(fingerprint(&n));
        nics.push(n);
    }
    let mut attached = Vec::new();
    let mut made: Vec<String> = Vec::new();
    for (i, d) in props["disks"].as_array().cloned().unwrap_or_default().into_iter().enumerate() {
        let boot = d["boot"].as_bool() == Some(true);
        let source = if let Some(p) = d.get("initializeParams") {
            let disk_name = match str_of(p, "diskName") {
                "" if boot => name.to_string(),
                "" => format!("{name}-{i}"),
                n => n.to_string(),
            };
            let mut body = Map::new();
            body.insert("name".into(), json!(disk_name));
            body.insert("sizeGb".into(), p.get("diskSizeGb").cloned().unwrap_or(json!("10")));
            body.insert("type".into(), json!(str_of(p, "diskType")));
            for k in ["sourceImage", "labels", "description"] {
                if let Some(x) = p.get(k) {
                    body.insert(k.into(), x.clone());
                }
            }
            match disks::create(st, zone, body) {
                Ok(created) => {
                    made.push(disk_name);
                    str_of(&created, "selfLink").to_string()
                }
                Err(e) => {
                    for m in &made {
                        st.disks.remove(&(zone.to_string(), m.clone()));
                    }
                    return Err(e);
                }
            }
        } else {
            let (z, n) = disks::resolve(st, zone, str_of(&d, "source"))?;
            st.link(&format!("zones/{z}/disks/{n}"))
        };
        let mut a = d.clone();
        if let Some(o) = a.as_object_mut() {
            o.remove("initializeParams");
        }
        a["kind"] = json!("compute#attachedDisk");
        a["type"] = a.get("type").cloned().unwrap_or(json!("PERSISTENT"));
        a["mode"] = a.get("mode").cloned().unwrap_or(json!("READ_WRITE"));
        a["source"] = json!(source);
        a["deviceName"] = a.get("deviceName").cloned().unwrap_or(json!(format!("persistent-disk-{i}")));
        a["index"] = json!(i);
        a["boot"] = json!(boot);
        a["autoDelete"] = a.get("autoDelete").cloned().unwrap_or(json!(false));
        a["interface"] = a.get("interface").cloned().unwrap_or(json!("SCSI"));
        attached.push(a);
    }
    let mut items = props["metadata"]["items"].as_array().cloned().unwrap_or_default();
    if let Some(m) = mig {
        let number = &st.cfg.project_number;
        items.retain(|i| !matches!(str_of(i, "key"), "created-by" | "instance-template"));
        items.push(json!({"key": "instance-template", "value": format!("projects/{number}/global/instanceTemplates/{}", str_of(template, "name"))}));
        items.push(json!({"key": "created-by", "value": format!("projects/{number}/zones/{zone}/instanceGroupManagers/{m}")}));
    }
    let labels = props.get("labels").cloned().unwrap_or(json!({}));
    let mut v = json!({
        "kind": "compute#instance",
        "id": random_id().to_string(),
        "name": name,
        "zone": st.link(&format!("zones/{zone}")),
        "selfLink": st.link(&rel),
        "creationTimestamp": now_rfc3339(),
        "machineType": st.link(&format!("zones/{zone}/machineTypes/{}", last_segment(str_of(props, "machineType")))),
        "canIpForward": props.get("canIpForward").cloned().unwrap_or(json!(false)),
        "networkInterfaces": nics,
        "disks": attached,
        "metadata": {"kind": "compute#metadata", "fingerprint": fingerprint(&json!(items)), "items": items},
        "labels": labels,
        "labelFingerprint": label_fingerprint(Some(&labels)),
        "cpuPlatform": "Unknown CPU Platform",
        "deletionProtection": false,
    });
    for k in ["serviceAccounts", "scheduling", "description", "minCpuPlatform"] {
        if let Some(x) = props.get(k) {
            v[k] = x.clone();
        }
    }
    let mut tags = props.get("tags").cloned().unwrap_or(json!({}));
    tags["fingerprint"] = json!(fingerprint(&tags["items"]));
    v["tags"] = tags;
    v["fingerprint"] = json!(fingerprint(&v));
    let boots_at = st.boot_time();
    st.instances.insert((zone.to_string(), name.to_string()), Instance { body: v, status: "PROVISIONING".into(), boots_at, mig: mig.map(str::to_string) });
    Ok(())
}

/// `instances.insert`: an instance of no MIG, made from the request body (an Instance resource) or,
/// with `sourceInstanceTemplate`, from that template's properties with the body's fields over them.
pub fn insert(st: &mut State, zone: &str, body: Map<String, Value>, source_template: Option<&str>) -> Result<Value, ApiError> {
    st.check_zone(zone)?;
    let name = body.get("name").and_then(Value::as_str).ok_or_else(|| ApiError::required("resource.name"))?.to_string();
    let (template_name, mut props) = match source_template.filter(|t| !t.is_empty()) {
        Some(t) => {
            let t = template_get(st, last_segment(t))?;
            (str_of(&t, "name").to_string(), t["properties"].clone())
        }
        None => (String::new(), json!({})),
    };
    for (k, v) in body.iter().filter(|(k, _)| k.as_str() != "name") {
        props[k.as_str()] = v.clone();
    }
    if str_of(&props, "machineType").is_empty() {
        return Err(ApiError::required("resource.machineType"));
    }
    if !props["disks"].as_array().into_iter().flatten().any(|d| d["boot"].as_bool() == Some(true)) {
        return Err(ApiError::invalid("Invalid value for field 'resource.disks': ''. Boot disk must be specified."));
    }
    check_labels(&props["labels"])?;
    create_from_template(st, zone, &name, &json!({"name": template_name, "properties": props}), None)?;
    let id = st.instances.get(&(zone.to_string(), name.clone())).map(|i| str_of(&i.body, "id").to_string());
    Ok(st.operation(Scope::Zone(zone.into()), "insert", &format!("zones/{zone}/instances/{name}"), id.as_deref(), None))
}

pub fn render(i: &Instance) -> Value {
    let mut v = i.body.clone();
    v["status"] = json!(i.status);
    v
}

fn instance_mut<'a>(st: &'a mut State, zone: &str, name: &str) -> Result<&'a mut Instance, ApiError> {
    st.check_zone(zone)?;
    let e = ApiError::not_found(&st.rel(&format!("zones/{zone}/instances/{name}")));
    st.instances.get_mut(&(zone.to_string(), name.to_string())).ok_or(e)
}

pub fn get(st: &State, zone: &str, name: &str) -> Result<Value, ApiError> {
    st.check_zone(zone)?;
    st.instances.get(&(zone.to_string(), name.to_string())).map(render).ok_or_else(|| ApiError::not_found(&st.rel(&format!("zones/{zone}/instances/{name}"))))
}

pub fn list(st: &State, zone: &str) -> Result<Vec<Value>, ApiError> {
    st.check_zone(zone)?;
    Ok(st.instances.iter().filter(|((z, _), _)| z == zone).map(|(_, i)| render(i)).collect())
}

/// Remove an instance now, with the disks it would take along (`autoDelete`). Its MIG, if any,
/// notices on the next [`State::advance`] and makes it again.
pub fn remove(st: &mut State, zone: &str, name: &str) -> Option<Instance> {
    let inst = st.instances.remove(&(zone.to_string(), name.to_string()))?;
    for d in inst.body["disks"].as_array().into_iter().flatten() {
        if d["autoDelete"].as_bool() == Some(true) {
            let src = str_of(d, "source");
            let key = (super::state::segment_after(src, "zones").unwrap_or(zone).to_string(), last_segment(src).to_string());
            if disks::users(st, src).is_empty() {
                st.disks.remove(&key);
            }
        }
    }
    Some(inst)
}

pub fn delete(st: &mut State, zone: &str, name: &str) -> Result<Value, ApiError> {
    let id = str_of(&get(st, zone, name)?, "id").to_string();
    remove(st, zone, name);
    Ok(st.operation(Scope::Zone(zone.into()), "delete", &format!("zones/{zone}/instances/{name}"), Some(&id), None))
}

pub fn set_labels(st: &mut State, zone: &str, name: &str, body: Map<String, Value>) -> Result<Value, ApiError> {
    let i = instance_mut(st, zone, name)?;
    apply_labels(&mut i.body, &body)?;
    let id = str_of(&i.body, "id").to_string();
    Ok(st.operation(Scope::Zone(zone.into()), "setLabels", &format!("zones/{zone}/instances/{name}"), Some(&id), None))
}

pub fn set_metadata(st: &mut State, zone: &str, name: &str, body: Map<String, Value>) -> Result<Value, ApiError> {
    let i = instance_mut(st, zone, name)?;
    let sent = body.get("fingerprint").and_then(Value::as_str).unwrap_or("");
    let current = str_of(&i.body["metadata"], "fingerprint").to_string();
    if sent != current {
        return Err(ApiError::condition_not_met(format!(
            "Supplied fingerprint does not match current metadata fingerprint (sent '{sent}', current '{current}')."
        )));
    }
    let items = body.get("items").cloned().unwrap_or(json!([]));
    let mut keys = std::collections::BTreeSet::new();
    for it in items.as_array().into_iter().flatten() {
        let k = str_of(it, "key");
        if k.is_empty() || !keys.insert(k.to_string()) {
            return Err(ApiError::invalid(format!("Invalid value for field 'resource.items': metadata key '{k}' is empty or repeated.")));
        }
    }
    i.body["metadata"] = json!({"kind": "compute#metadata", "fingerprint": fingerprint(&items), "items": items});
    let id = str_of(&i.body, "id").to_string();
    Ok(st.operation(Scope::Zone(zone.into()), "setMetadata", &format!("zones/{zone}/instances/{name}"), Some(&id), None))
}

/// Attach a disk. A disk that another instance (or this one) writes, or a READ_WRITE attach of a
/// disk that has any user, is refused with 400 `resourceInUseByAnotherResource`.
pub fn attach_disk(st: &mut State, zone: &str, name: &str, body: Map<String, Value>) -> Result<Value, ApiError> {
    get(st, zone, name)?;
    let (dz, dn) = disks::resolve(st, zone, body.get("source").and_then(Value::as_str).unwrap_or(""))?;
    let link = st.link(&format!("zones/{dz}/disks/{dn}"));
    let mode = body.get("mode").and_then(Value::as_str).unwrap_or("READ_WRITE").to_string();
    if !matches!(mode.as_str(), "READ_WRITE" | "READ_ONLY") {
        return Err(ApiError::invalid(format!("Invalid value for field 'resource.mode': '{mode}'.")));
    }
    let users = disks::users(st, &link);
    if let Some((user, _)) = users.iter().find(|(_, m)| mode == "READ_WRITE" || m == "READ_WRITE") {
        return Err(ApiError::new(
            400,
            "resourceInUseByAnotherResource",
            format!("The disk resource '{}' is already being used by '{}'", st.rel(&format!("zones/{dz}/disks/{dn}")), strip_base(user)),
        ));
    }
    let i = instance_mut(st, zone, name)?;
    let list = i.body["disks"].as_array().cloned().unwrap_or_default();
    let index = list.iter().filter_map(|d| d["index"].as_u64()).max().map_or(0, |m| m + 1);
    let device = body.get("deviceName").and_then(Value::as_str).map(str::to_string).unwrap_or_else(|| format!("persistent-disk-{index}"));
    if list.iter().any(|d| str_of(d, "deviceName") == device) {
        return Err(ApiError::invalid(format!(
            "Invalid value for field 'resource.deviceName': '{device}'. The device name is already in use on this instance."
        )));
    }
    let mut a = Value::Object(body);
    a["kind"] = json!("compute#attachedDisk");
    a["type"] = a.get("type").cloned().unwrap_or(json!("PERSISTENT"));
    a["mode"] = json!(mode);
    a["source"] = json!(link);
    a["deviceName"] = json!(device);
    a["index"] = json!(index);
    a["boot"] = json!(false);
    a["autoDelete"] = a.get("autoDelete").cloned().unwrap_or(json!(false));
    a["interface"] = a.get("interface").cloned().unwrap_or(json!("SCSI"));
    let mut list = list;
    list.push(a);
    i.body["disks"] = json!(list);
    let id = str_of(&i.body, "id").to_string();
    if let Some(d) = st.disks.get_mut(&(dz, dn)) {
        d.body["lastAttachTimestamp"] = json!(now_rfc3339());
    }
    Ok(st.operation(Scope::Zone(zone.into()), "attachDisk", &format!("zones/{zone}/instances/{name}"), Some(&id), None))
}

pub fn detach_disk(st: &mut State, zone: &str, name: &str, device: &str) -> Result<Value, ApiError> {
    if device.is_empty() {
        return Err(ApiError::required("deviceName"));
    }
    let i = instance_mut(st, zone, name)?;
    let mut list = i.body["disks"].as_array().cloned().unwrap_or_default();
    let Some(pos) = list.iter().position(|d| str_of(d, "deviceName") == device) else {
        return Err(ApiError::invalid(format!("Invalid value for field 'deviceName': '{device}'. No attached disk found with device name '{device}'.")));
    };
    let gone = list.remove(pos);
    i.body["disks"] = json!(list);
    let id = str_of(&i.body, "id").to_string();
    let src = str_of(&gone, "source");
    if let Some(d) = st.disks.get_mut(&(zone.to_string(), last_segment(src).to_string())) {
        d.body["lastDetachTimestamp"] = json!(now_rfc3339());
    }
    Ok(st.operation(Scope::Zone(zone.into()), "detachDisk", &format!("zones/{zone}/instances/{name}"), Some(&id), None))
}
