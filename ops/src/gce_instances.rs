//! The instances of a GCE cluster's managed instance groups as `validate cluster` sees them: per
//! instance group (its template's group), the MIGs of its zones, each MIG's `listManagedInstances`,
//! the RUNNING ones with their addresses (`instances.list` per zone).

use std::collections::BTreeMap;

use cloud_resources::gce::{name_of_link, ComputeError, GceTarget};
use cloud_resources::model::ClusterModel;
use keelson_api::Role;

/// One instance group on GCE: its MIGs' running instances (name, internal address).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GceGroup {
    pub group: String,
    pub role: Role,
    /// The sum of its MIGs' target sizes (the group's `minSize`, spread over its zones).
    pub target: i32,
    pub instances: Vec<(String, Option<String>)>,
}

/// Every instance group of the model with its MIGs' running instances (reads only). A MIG that
/// does not exist counts as none running.
pub async fn groups(target: &GceTarget, model: &ClusterModel) -> Result<Vec<GceGroup>, ComputeError> {
    let c = &target.compute;
    let mut ip_of: BTreeMap<(String, String), Option<String>> = BTreeMap::new();
    let zones: std::collections::BTreeSet<&str> = model.gce.instance_group_managers.iter().map(|m| m.zone.as_str()).collect();
    for zone in zones {
        for i in c.instances(zone).await? {
            let name = i["name"].as_str().unwrap_or_default().to_string();
            ip_of.insert((zone.to_string(), name), i["networkInterfaces"][0]["networkIP"].as_str().map(str::to_string));
        }
    }
    let mut out = Vec::new();
    for t in &model.gce.instance_templates {
        let mut g = GceGroup { group: t.group.clone(), role: t.role, target: 0, instances: Vec::new() };
        for m in model.gce.instance_group_managers.iter().filter(|m| m.template.name() == t.name) {
            g.target += i32::try_from(m.target_size).unwrap_or(i32::MAX);
            let managed = match c.list_managed_instances(&m.zone, &m.gce_name).await {
                Ok(v) => v,
                Err(e) if e.is_not_found() => Vec::new(),
                Err(e) => return Err(e),
            };
            for i in managed.iter().filter(|i| i["instanceStatus"].as_str() == Some("RUNNING")) {
                let name = name_of_link(i["instance"].as_str().unwrap_or_default()).to_string();
                let ip = ip_of.get(&(m.zone.clone(), name.clone())).cloned().flatten();
                g.instances.push((name, ip));
            }
        }
        out.push(g);
    }
    Ok(out)
}
