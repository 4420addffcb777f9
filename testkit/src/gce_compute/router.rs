//! Which method a request calls: `/compute/v1/projects/{project}/…` as the discovery document
//! lays out the paths and verbs.

use std::collections::BTreeMap;
use std::time::Instant;

use serde_json::{json, Value};

use super::filter::Filter;
use super::state::{render_operation, Scope, State};
use super::{disks, instances, migs, network};
use crate::google_api::{body_object, paginate, ApiError};
use crate::httpd::Request;

pub const PREFIX: &str = "/compute/v1/projects/";
const MAX_RESULTS: usize = 500;

pub enum Reply {
    Json(Value),
    /// `operations/{name}/wait`: the caller waits outside the lock, then serves it.
    Wait(Scope, String),
}

/// A list response: the filter applied, one page of it.
fn list(st: &State, kind: &str, rel: &str, items: Vec<Value>, q: &BTreeMap<String, String>) -> Result<Reply, ApiError> {
    let (page, next) = filtered_page(items, q)?;
    let mut v = json!({"kind": kind, "id": st.rel(rel), "selfLink": st.link(rel)});
    if !page.is_empty() {
        v["items"] = json!(page);
    }
    if let Some(t) = next {
        v["nextPageToken"] = json!(t);
    }
    Ok(Reply::Json(v))
}

fn filtered_page(items: Vec<Value>, q: &BTreeMap<String, String>) -> Result<(Vec<Value>, Option<String>), ApiError> {
    let f = Filter::parse(q.get("filter").map(String::as_str).unwrap_or(""))?;
    paginate(items.into_iter().filter(|i| f.matches(i)).collect(), q, MAX_RESULTS)
}

pub fn route(st: &mut State, req: &Request, q: &BTreeMap<String, String>) -> Result<Reply, ApiError> {
    let rest = req.path.strip_prefix(PREFIX).unwrap_or("");
    let segs: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    let Some((&project, segs)) = segs.split_first() else {
        return Err(ApiError::not_found(&req.path));
    };
    if project != st.cfg.project && project != st.cfg.project_number {
        return Err(ApiError::not_found(&format!("projects/{project}")));
    }
    st.advance(Instant::now());
    let m = req.method.as_str();
    let body = || body_object(req);
    let j = |r: Result<Value, ApiError>| r.map(Reply::Json);
    match (m, segs) {
        ("GET", []) => Ok(Reply::Json(network::project(st))),
        ("GET", ["zones"]) => {
            let z = network::zones(st);
            list(st, "compute#zoneList", "zones", z, q)
        }
        ("GET", ["zones", z]) => j(network::zone(st, z)),
        ("GET", ["regions", r]) => j(network::region(st, r)),
        // networks
        ("POST", ["global", "networks"]) => j(network::network_insert(st, body()?)),
        ("GET", ["global", "networks"]) => {
            let n = network::networks(st);
            list(st, "compute#networkList", "global/networks", n, q)
        }
        ("GET", ["global", "networks", n]) => j(network::network_get(st, n)),
        ("DELETE", ["global", "networks", n]) => j(network::network_delete(st, n)),
        // subnetworks
        ("POST", ["regions", r, "subnetworks"]) => j(network::subnetwork_insert(st, r, body()?)),
        ("GET", ["regions", r, "subnetworks"]) => {
            let s = network::subnetworks(st, r)?;
            list(st, "compute#subnetworkList", &format!("regions/{r}/subnetworks"), s, q)
        }
        ("GET", ["regions", r, "subnetworks", n]) => j(network::subnetwork_get(st, r, n)),
        ("DELETE", ["regions", r, "subnetworks", n]) => j(network::subnetwork_delete(st, r, n)),
        // firewalls
        ("POST", ["global", "firewalls"]) => j(network::firewall_insert(st, body()?)),
        ("GET", ["global", "firewalls"]) => {
            let f: Vec<Value> = st.firewalls.values().cloned().collect();
            list(st, "compute#firewallList", "global/firewalls", f, q)
        }
        ("GET", ["global", "firewalls", n]) => j(network::firewall_get(st, n)),
        ("PATCH", ["global", "firewalls", n]) => j(network::firewall_patch(st, n, body()?)),
        ("DELETE", ["global", "firewalls", n]) => j(network::firewall_delete(st, n)),
        // routes
        ("POST", ["global", "routes"]) => j(network::route_insert(st, body()?)),
        ("GET", ["global", "routes"]) => {
            let r: Vec<Value> = st.routes.values().cloned().collect();
            list(st, "compute#routeList", "global/routes", r, q)
        }
        ("GET", ["global", "routes", n]) => j(network::route_get(st, n)),
        ("DELETE", ["global", "routes", n]) => j(network::route_delete(st, n)),
        // instance templates
        ("POST", ["global", "instanceTemplates"]) => j(instances::template_insert(st, body()?)),
        ("GET", ["global", "instanceTemplates"]) => {
            let t: Vec<Value> = st.templates.values().cloned().collect();
            list(st, "compute#instanceTemplateList", "global/instanceTemplates", t, q)
        }
        ("GET", ["global", "instanceTemplates", n]) => j(instances::template_get(st, n)),
        ("DELETE", ["global", "instanceTemplates", n]) => j(instances::template_delete(st, n)),
        // managed instance groups
        ("POST", ["zones", z, "instanceGroupManagers"]) => j(migs::insert(st, z, body()?)),
        ("GET", ["zones", z, "instanceGroupManagers"]) => {
            let l = migs::list(st, z)?;
            list(st, "compute#instanceGroupManagerList", &format!("zones/{z}/instanceGroupManagers"), l, q)
        }
        ("GET", ["zones", z, "instanceGroupManagers", n]) => j(migs::get(st, z, n)),
        ("DELETE", ["zones", z, "instanceGroupManagers", n]) => j(migs::delete(st, z, n)),
        ("POST", ["zones", z, "instanceGroupManagers", n, "resize"]) => {
            let size = q.get("size").ok_or_else(|| ApiError::required("size"))?;
            j(migs::resize(st, z, n, size))
        }
        ("POST", ["zones", z, "instanceGroupManagers", n, "recreateInstances"]) => j(migs::recreate(st, z, n, body()?)),
        ("POST", ["zones", z, "instanceGroupManagers", n, "deleteInstances"]) => j(migs::delete_instances(st, z, n, body()?)),
        ("POST", ["zones", z, "instanceGroupManagers", n, "setInstanceTemplate"]) => j(migs::set_template(st, z, n, body()?)),
        ("POST", ["zones", z, "instanceGroupManagers", n, "listManagedInstances"]) => {
            let (page, next) = filtered_page(migs::list_managed(st, z, n)?, q)?;
            let mut v = json!({});
            if !page.is_empty() {
                v["managedInstances"] = json!(page);
            }
            if let Some(t) = next {
                v["nextPageToken"] = json!(t);
            }
            Ok(Reply::Json(v))
        }
        // instances
        ("GET", ["zones", z, "instances"]) => {
            let l = instances::list(st, z)?;
            list(st, "compute#instanceList", &format!("zones/{z}/instances"), l, q)
        }
        ("POST", ["zones", z, "instances"]) => j(instances::insert(st, z, body()?, q.get("sourceInstanceTemplate").map(String::as_str))),
        ("GET", ["zones", z, "instances", n]) => j(instances::get(st, z, n)),
        ("DELETE", ["zones", z, "instances", n]) => j(instances::delete(st, z, n)),
        ("POST", ["zones", z, "instances", n, "setLabels"]) => j(instances::set_labels(st, z, n, body()?)),
        ("POST", ["zones", z, "instances", n, "setMetadata"]) => j(instances::set_metadata(st, z, n, body()?)),
        ("POST", ["zones", z, "instances", n, "attachDisk"]) => j(instances::attach_disk(st, z, n, body()?)),
        ("POST", ["zones", z, "instances", n, "detachDisk"]) => j(instances::detach_disk(st, z, n, q.get("deviceName").map(String::as_str).unwrap_or(""))),
        // disks
        ("POST", ["zones", z, "disks"]) => j(disks::insert(st, z, body()?)),
        ("GET", ["zones", z, "disks"]) => {
            let l = disks::list(st, z)?;
            list(st, "compute#diskList", &format!("zones/{z}/disks"), l, q)
        }
        ("GET", ["zones", z, "disks", n]) => j(disks::get(st, z, n)),
        ("DELETE", ["zones", z, "disks", n]) => j(disks::delete(st, z, n)),
        ("POST", ["zones", z, "disks", n, "setLabels"]) => j(disks::set_labels(st, z, n, body()?)),
        // operations
        ("GET", ["zones", z, "operations", o]) => j(operation(st, Scope::Zone(z.to_string()), o)),
        ("GET", ["regions", r, "operations", o]) => j(operation(st, Scope::Region(r.to_string()), o)),
        ("GET", ["global", "operations", o]) => j(operation(st, Scope::Global, o)),
        ("POST", ["zones", z, "operations", o, "wait"]) => wait(st, Scope::Zone(z.to_string()), o.to_string()),
        ("POST", ["regions", r, "operations", o, "wait"]) => wait(st, Scope::Region(r.to_string()), o.to_string()),
        ("POST", ["global", "operations", o, "wait"]) => wait(st, Scope::Global, o.to_string()),
        _ => Err(ApiError::not_found(&req.path)),
    }
}

fn check_scope(st: &State, scope: &Scope) -> Result<(), ApiError> {
    match scope {
        Scope::Zone(z) => st.check_zone(z),
        Scope::Region(r) => st.check_region(r),
        Scope::Global => Ok(()),
    }
}

/// An operation, looked up in the scope the path names (a zonal one is not found globally).
pub fn operation(st: &State, scope: Scope, name: &str) -> Result<Value, ApiError> {
    check_scope(st, &scope)?;
    st.operations
        .get(name)
        .filter(|o| o.scope == scope)
        .map(|o| render_operation(o, Instant::now()))
        .ok_or_else(|| ApiError::not_found(&st.rel(&format!("{}/operations/{name}", scope.path()))))
}

fn wait(st: &State, scope: Scope, name: String) -> Result<Reply, ApiError> {
    operation(st, scope.clone(), &name)?;
    Ok(Reply::Wait(scope, name))
}
