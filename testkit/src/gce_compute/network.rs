//! The project, zones and regions; networks, subnetworks (regional) and firewalls (global).

use std::net::Ipv4Addr;

use serde_json::{json, Map, Value};

use super::state::{check_name, last_segment, segment_after, str_of, Scope, State};
use crate::google_api::{fingerprint, now_rfc3339, random_id, ApiError};

pub fn project(st: &State) -> Value {
    let items = json!([]);
    json!({
        "kind": "compute#project",
        "id": st.cfg.project_number,
        "name": st.cfg.project,
        "selfLink": st.link(""),
        "creationTimestamp": st.started,
        "commonInstanceMetadata": {"kind": "compute#metadata", "fingerprint": fingerprint(&items), "items": items},
        "defaultServiceAccount": format!("{}-compute@developer.gserviceaccount.com", st.cfg.project_number),
        "defaultNetworkTier": "PREMIUM",
        "xpnProjectStatus": "UNSPECIFIED_XPN_PROJECT_STATUS",
    })
}

/// A stable numeric id for a zone or region (its position in the configuration).
fn place_id(st: &State, name: &str) -> String {
    let mut i = 2000u64;
    for (r, zones) in &st.cfg.regions {
        i += 1;
        if r == name {
            return i.to_string();
        }
        for z in zones {
            i += 1;
            if z == name {
                return i.to_string();
            }
        }
    }
    "0".into()
}

pub fn zone(st: &State, zone: &str) -> Result<Value, ApiError> {
    st.check_zone(zone)?;
    let region = st.zone_region(zone).unwrap_or_default();
    Ok(json!({
        "kind": "compute#zone",
        "id": place_id(st, zone),
        "name": zone,
        "description": zone,
        "status": "UP",
        "region": st.link(&format!("regions/{region}")),
        "selfLink": st.link(&format!("zones/{zone}")),
        "creationTimestamp": st.started,
        "supportsPzs": false,
    }))
}

pub fn zones(st: &State) -> Vec<Value> {
    st.cfg.regions.values().flatten().filter_map(|z| zone(st, z).ok()).collect()
}

pub fn region(st: &State, region: &str) -> Result<Value, ApiError> {
    st.check_region(region)?;
    let zones: Vec<String> = st.cfg.regions[region].iter().map(|z| st.link(&format!("zones/{z}"))).collect();
    Ok(json!({
        "kind": "compute#region",
        "id": place_id(st, region),
        "name": region,
        "description": region,
        "status": "UP",
        "zones": zones,
        "selfLink": st.link(&format!("regions/{region}")),
        "creationTimestamp": st.started,
        "supportsPzs": false,
    }))
}

/// Stamp what the server owns on a resource the client sent.
fn stamp(body: Map<String, Value>, kind: &str, link: String) -> Value {
    let mut v = Value::Object(body);
    v["kind"] = json!(kind);
    v["id"] = json!(random_id().to_string());
    v["creationTimestamp"] = json!(now_rfc3339());
    v["selfLink"] = json!(link);
    v
}

fn name_of(body: &Map<String, Value>) -> Result<String, ApiError> {
    let name = body.get("name").and_then(Value::as_str).ok_or_else(|| ApiError::required("resource.name"))?;
    check_name(name)?;
    Ok(name.to_string())
}

// ---- networks

pub fn network_insert(st: &mut State, body: Map<String, Value>) -> Result<Value, ApiError> {
    let name = name_of(&body)?;
    let rel = format!("global/networks/{name}");
    if st.networks.contains_key(&name) {
        return Err(ApiError::already_exists(&st.rel(&rel)));
    }
    if body.contains_key("IPv4Range") {
        return Err(ApiError::invalid("Legacy networks (IPv4Range) are not supported by this emulator; use subnetworks"));
    }
    let mut v = stamp(body, "compute#network", st.link(&rel));
    if v.get("autoCreateSubnetworks").is_none() {
        v["autoCreateSubnetworks"] = json!(false);
    }
    if v.get("routingConfig").is_none() {
        v["routingConfig"] = json!({"routingMode": "REGIONAL"});
    }
    v["mtu"] = v.get("mtu").cloned().unwrap_or(json!(1460));
    let id = str_of(&v, "id").to_string();
    st.networks.insert(name, v);
    Ok(st.operation(Scope::Global, "insert", &rel, Some(&id), None))
}

pub fn network_get(st: &State, name: &str) -> Result<Value, ApiError> {
    let mut v = st.networks.get(name).cloned().ok_or_else(|| ApiError::not_found(&st.rel(&format!("global/networks/{name}"))))?;
    let subnets: Vec<String> =
        st.subnetworks.values().filter(|s| last_segment(str_of(s, "network")) == name).map(|s| str_of(s, "selfLink").to_string()).collect();
    if !subnets.is_empty() {
        v["subnetworks"] = json!(subnets);
    }
    Ok(v)
}

pub fn networks(st: &State) -> Vec<Value> {
    st.networks.keys().filter_map(|n| network_get(st, n).ok()).collect()
}

pub fn network_delete(st: &mut State, name: &str) -> Result<Value, ApiError> {
    let rel = format!("global/networks/{name}");
    let id = network_get(st, name)?["id"].as_str().unwrap_or_default().to_string();
    let user =
        st.subnetworks.values().chain(st.firewalls.values()).find(|r| last_segment(str_of(r, "network")) == name).map(|r| str_of(r, "selfLink").to_string());
    if let Some(user) = user {
        let e = in_use("network", &st.rel(&rel), &user);
        return Ok(st.operation(Scope::Global, "delete", &rel, Some(&id), Some(e)));
    }
    st.networks.remove(name);
    Ok(st.operation(Scope::Global, "delete", &rel, Some(&id), None))
}

/// The error GCE gives when a resource in use is deleted (in the operation, as GCE reports it).
pub fn in_use(kind: &str, what: &str, user: &str) -> ApiError {
    ApiError::new(400, "resourceInUseByAnotherResource", format!("The {kind} resource '{what}' is already being used by '{}'", strip_base(user)))
}

/// `projects/…` of a self link.
pub fn strip_base(link: &str) -> &str {
    link.find("projects/").map(|i| &link[i..]).unwrap_or(link)
}

/// The network a reference names, which must exist.
fn network_ref(st: &State, reference: &str) -> Result<String, ApiError> {
    let name = last_segment(reference);
    if !st.networks.contains_key(name) {
        return Err(ApiError::not_found(&st.rel(&format!("global/networks/{name}"))));
    }
    Ok(name.to_string())
}

// ---- subnetworks

/// `a.b.c.d/n` → (network address, prefix length).
pub fn parse_cidr(s: &str) -> Option<(Ipv4Addr, u8)> {
    let (ip, len) = s.split_once('/')?;
    let ip: Ipv4Addr = ip.parse().ok()?;
    let len: u8 = len.parse().ok().filter(|l| *l <= 32)?;
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    (u32::from(ip) & mask == u32::from(ip)).then_some((ip, len))
}

pub fn subnetwork_insert(st: &mut State, region: &str, body: Map<String, Value>) -> Result<Value, ApiError> {
    st.check_region(region)?;
    let name = name_of(&body)?;
    let rel = format!("regions/{region}/subnetworks/{name}");
    if st.subnetworks.contains_key(&(region.to_string(), name.clone())) {
        return Err(ApiError::already_exists(&st.rel(&rel)));
    }
    let network = network_ref(st, body.get("network").and_then(Value::as_str).ok_or_else(|| ApiError::required("resource.network"))?)?;
    let cidr = body.get("ipCidrRange").and_then(Value::as_str).ok_or_else(|| ApiError::required("resource.ipCidrRange"))?;
    let (net, len) =
        parse_cidr(cidr).ok_or_else(|| ApiError::invalid(format!("Invalid value for field 'resource.ipCidrRange': '{cidr}'. Invalid IPv4 CIDR range.")))?;
    if len > 29 {
        return Err(ApiError::invalid(format!("Invalid value for field 'resource.ipCidrRange': '{cidr}'. The prefix length must be at most 29.")));
    }
    if let Some(other) = st.subnetworks.values().find(|s| last_segment(str_of(s, "network")) == network && overlaps(str_of(s, "ipCidrRange"), (net, len))) {
        return Err(ApiError::invalid(format!(
            "Invalid IPCidrRange: {cidr} conflicts with existing subnetwork '{}' in region '{}'.",
            str_of(other, "name"),
            last_segment(str_of(other, "region"))
        )));
    }
    let mut v = stamp(body, "compute#subnetwork", st.link(&rel));
    v["network"] = json!(st.link(&format!("global/networks/{network}")));
    v["region"] = json!(st.link(&format!("regions/{region}")));
    v["gatewayAddress"] = json!(Ipv4Addr::from(u32::from(net) + 1).to_string());
    v["fingerprint"] = json!(fingerprint(&v));
    v["stackType"] = v.get("stackType").cloned().unwrap_or(json!("IPV4_ONLY"));
    v["privateIpGoogleAccess"] = v.get("privateIpGoogleAccess").cloned().unwrap_or(json!(false));
    let id = str_of(&v, "id").to_string();
    st.subnetworks.insert((region.to_string(), name), v);
    Ok(st.operation(Scope::Region(region.into()), "insert", &rel, Some(&id), None))
}

fn overlaps(existing: &str, (net, len): (Ipv4Addr, u8)) -> bool {
    let Some((e, elen)) = parse_cidr(existing) else { return false };
    let m = len.min(elen);
    let mask = if m == 0 { 0 } else { u32::MAX << (32 - m) };
    u32::from(e) & mask == u32::from(net) & mask
}

pub fn subnetwork_get(st: &State, region: &str, name: &str) -> Result<Value, ApiError> {
    st.check_region(region)?;
    st.subnetworks
        .get(&(region.to_string(), name.to_string()))
        .cloned()
        .ok_or_else(|| ApiError::not_found(&st.rel(&format!("regions/{region}/subnetworks/{name}"))))
}

pub fn subnetworks(st: &State, region: &str) -> Result<Vec<Value>, ApiError> {
    st.check_region(region)?;
    Ok(st.subnetworks.iter().filter(|((r, _), _)| r == region).map(|(_, v)| v.clone()).collect())
}

pub fn subnetwork_delete(st: &mut State, region: &str, name: &str) -> Result<Value, ApiError> {
    let v = subnetwork_get(st, region, name)?;
    let rel = format!("regions/{region}/subnetworks/{name}");
    let link = str_of(&v, "selfLink").to_string();
    let user = st.instances.values().find(|i| interfaces(&i.body).any(|n| str_of(n, "subnetwork") == link)).map(|i| str_of(&i.body, "selfLink").to_string());
    let id = str_of(&v, "id").to_string();
    if let Some(user) = user {
        let e = in_use("subnetwork", &st.rel(&rel), &user);
        return Ok(st.operation(Scope::Region(region.into()), "delete", &rel, Some(&id), Some(e)));
    }
    st.subnetworks.remove(&(region.to_string(), name.to_string()));
    Ok(st.operation(Scope::Region(region.into()), "delete", &rel, Some(&id), None))
}

fn interfaces(instance: &Value) -> impl Iterator<Item = &Value> {
    instance.get("networkInterfaces").and_then(Value::as_array).into_iter().flatten()
}

/// The subnetwork an instance's interface lands in: the one named, else the network's only
/// subnetwork in the zone's region. Returns (self link, network link).
pub fn resolve_subnetwork(st: &State, zone: &str, nic: &Value) -> Result<(String, String), ApiError> {
    let region = st.zone_region(zone).unwrap_or_default().to_string();
    let sub = str_of(nic, "subnetwork");
    let s =
        if !sub.is_empty() {
            let r = segment_after(sub, "regions").unwrap_or(&region);
            subnetwork_get(st, r, last_segment(sub))?
        } else {
            let network = network_ref(st, if str_of(nic, "network").is_empty() { "default" } else { str_of(nic, "network") })?;
            st.subnetworks.iter().find(|((r, _), s)| *r == region && last_segment(str_of(s, "network")) == network).map(|(_, s)| s.clone()).ok_or_else(
                || ApiError::invalid(format!("Network '{}' has no subnetwork in region '{region}'.", st.rel(&format!("global/networks/{network}")))),
            )?
        };
    Ok((str_of(&s, "selfLink").to_string(), str_of(&s, "network").to_string()))
}

/// The lowest free address of a subnetwork (GCE keeps the network, the gateway, the
/// second-to-last and the broadcast address).
pub fn allocate_ip(st: &State, subnet_link: &str) -> Result<String, ApiError> {
    let s = st.subnetworks.values().find(|s| str_of(s, "selfLink") == subnet_link).ok_or_else(|| ApiError::not_found(strip_base(subnet_link)))?;
    let (net, len) = parse_cidr(str_of(s, "ipCidrRange")).ok_or_else(|| ApiError::invalid("subnetwork without a valid ipCidrRange"))?;
    let size = 1u64 << (32 - u32::from(len));
    let used: std::collections::BTreeSet<String> =
        st.instances.values().flat_map(|i| interfaces(&i.body)).map(|n| str_of(n, "networkIP").to_string()).collect();
    (2..size.saturating_sub(2))
        .map(|i| Ipv4Addr::from(u32::from(net) + i as u32).to_string())
        .find(|ip| !used.contains(ip))
        .ok_or_else(|| ApiError::new(400, "ipSpaceExhausted", format!("IP space of '{}' is exhausted.", strip_base(subnet_link))))
}

// ---- firewalls

pub fn firewall_insert(st: &mut State, body: Map<String, Value>) -> Result<Value, ApiError> {
    let name = name_of(&body)?;
    let rel = format!("global/firewalls/{name}");
    if st.firewalls.contains_key(&name) {
        return Err(ApiError::already_exists(&st.rel(&rel)));
    }
    let network = network_ref(st, body.get("network").and_then(Value::as_str).unwrap_or("default"))?;
    let mut v = stamp(body, "compute#firewall", st.link(&rel));
    v["network"] = json!(st.link(&format!("global/networks/{network}")));
    v["direction"] = v.get("direction").cloned().unwrap_or(json!("INGRESS"));
    v["priority"] = v.get("priority").cloned().unwrap_or(json!(1000));
    v["disabled"] = v.get("disabled").cloned().unwrap_or(json!(false));
    let id = str_of(&v, "id").to_string();
    st.firewalls.insert(name, v);
    Ok(st.operation(Scope::Global, "insert", &rel, Some(&id), None))
}

pub fn firewall_get(st: &State, name: &str) -> Result<Value, ApiError> {
    st.firewalls.get(name).cloned().ok_or_else(|| ApiError::not_found(&st.rel(&format!("global/firewalls/{name}"))))
}

/// PATCH: the fields sent replace the stored ones (name, network and server fields excepted).
pub fn firewall_patch(st: &mut State, name: &str, body: Map<String, Value>) -> Result<Value, ApiError> {
    let mut v = firewall_get(st, name)?;
    if body.get("name").and_then(Value::as_str).is_some_and(|n| n != name) {
        return Err(ApiError::invalid(format!("Invalid value for field 'resource.name': '{}'. The name of a firewall cannot be changed.", body["name"])));
    }
    for (k, val) in body {
        if !matches!(k.as_str(), "name" | "id" | "selfLink" | "kind" | "creationTimestamp" | "network") {
            v[k.as_str()] = val;
        }
    }
    let id = str_of(&v, "id").to_string();
    st.firewalls.insert(name.to_string(), v);
    Ok(st.operation(Scope::Global, "patch", &format!("global/firewalls/{name}"), Some(&id), None))
}

pub fn firewall_delete(st: &mut State, name: &str) -> Result<Value, ApiError> {
    let id = str_of(&firewall_get(st, name)?, "id").to_string();
    st.firewalls.remove(name);
    Ok(st.operation(Scope::Global, "delete", &format!("global/firewalls/{name}"), Some(&id), None))
}

// ---- routes

/// `zones/Z/instances/N` out of a partial or full instance URL.
fn instance_key(reference: &str) -> Option<(String, String)> {
    let at = reference.rfind("zones/")?;
    let mut parts = reference[at..].split('/');
    match (parts.next(), parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some("zones"), Some(z), Some("instances"), Some(n), None) if !z.is_empty() && !n.is_empty() => Some((z.to_string(), n.to_string())),
        _ => None,
    }
}

/// routes.insert: a name, a network, a `destRange` CIDR and exactly one next hop; a
/// `nextHopInstance` must name an instance that exists, and is stored as its full URL (as Compute
/// returns it); `priority` defaults to 1000.
pub fn route_insert(st: &mut State, body: Map<String, Value>) -> Result<Value, ApiError> {
    let name = name_of(&body)?;
    let rel = format!("global/routes/{name}");
    if st.routes.contains_key(&name) {
        return Err(ApiError::already_exists(&st.rel(&rel)));
    }
    let network = body.get("network").and_then(Value::as_str).ok_or_else(|| ApiError::required("resource.network"))?;
    let network = network_ref(st, network)?;
    let dest = body.get("destRange").and_then(Value::as_str).ok_or_else(|| ApiError::required("resource.destRange"))?;
    if parse_cidr(dest).is_none() {
        return Err(ApiError::invalid(format!("Invalid value for field 'resource.destRange': '{dest}'. Must be a CIDR range.")));
    }
    const HOPS: [&str; 6] = ["nextHopInstance", "nextHopGateway", "nextHopIp", "nextHopIlb", "nextHopVpnTunnel", "nextHopNetwork"];
    let hops: Vec<&str> = HOPS.iter().copied().filter(|h| body.get(*h).and_then(Value::as_str).is_some_and(|v| !v.is_empty())).collect();
    if hops.len() != 1 {
        return Err(ApiError::invalid(format!("Invalid value for field 'resource': the route must have exactly one next hop, it has {}.", hops.len())));
    }
    let mut v = stamp(body, "compute#route", st.link(&rel));
    v["network"] = json!(st.link(&format!("global/networks/{network}")));
    v["priority"] = v.get("priority").cloned().unwrap_or(json!(1000));
    if let Some(hop) = v.get("nextHopInstance").and_then(Value::as_str).map(str::to_string) {
        let (zone, instance) = instance_key(&hop)
            .ok_or_else(|| ApiError::invalid(format!("Invalid value for field 'resource.nextHopInstance': '{hop}'. The URL is malformed.")))?;
        if !st.instances.contains_key(&(zone.clone(), instance.clone())) {
            return Err(ApiError::not_found(&st.rel(&format!("zones/{zone}/instances/{instance}"))));
        }
        v["nextHopInstance"] = json!(st.link(&format!("zones/{zone}/instances/{instance}")));
    }
    let id = str_of(&v, "id").to_string();
    st.routes.insert(name, v);
    Ok(st.operation(Scope::Global, "insert", &rel, Some(&id), None))
}

pub fn route_get(st: &State, name: &str) -> Result<Value, ApiError> {
    st.routes.get(name).cloned().ok_or_else(|| ApiError::not_found(&st.rel(&format!("global/routes/{name}"))))
}

pub fn route_delete(st: &mut State, name: &str) -> Result<Value, ApiError> {
    let id = str_of(&route_get(st, name)?, "id").to_string();
    st.routes.remove(name);
    Ok(st.operation(Scope::Global, "delete", &format!("global/routes/{name}"), Some(&id), None))
}
