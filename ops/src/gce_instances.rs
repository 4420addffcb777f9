//! GCE's managed instance groups: their instances as `validate cluster` sees them ([`groups`]: per
//! instance group — its template's group — the MIGs of its zones, each MIG's
//! `listManagedInstances`, the RUNNING ones with their addresses from `instances.list`), and
//! [`GceGroups`], the GCE implementation of [`InstanceGroups`] a rolling update drives.
//!
//! An instance is outdated when it does not run its MIG's current instance template (the
//! `instance-template` metadata GCE gives a MIG's instance). It is replaced by its MIG
//! (`recreateInstances`: same name, the current template), waited for (bounded) until RUNNING on
//! that template with nothing left to do. GCE has no load balancer in front of a group here:
//! nothing is deregistered.
//!
//! Surge (`spec.rollingUpdate.maxSurge`; 0 by default on GCE, as in kOps, and never for control
//! planes): kOps cannot surge on GCE (its detach is not implemented); here the MIG is resized up by
//! the surge first, so that many instances on the current template start at once, and then that
//! many outdated instances are *deleted* (`deleteInstances`, which lowers the target size back)
//! instead of recreated: the group never runs below its size for them. The surge is read from the
//! MIG's live target size against the spec's, so a run interrupted after the resize picks up where
//! it stopped.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cloud_resources::gce::{name_of_link, ComputeError, GceTarget, InstanceGroupManager};
use cloud_resources::model::ClusterModel;
use keelson_api::Role;
use serde_json::Value;

use crate::groups::{select, BoxFuture, GroupStatus, InstanceGroups, InstanceStatus, Log, RollingTarget, Selection};
use crate::rolling::{RollingError, RollingOptions};

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

/// An instance as `instances.list` shows it.
#[derive(Debug, Clone, Default)]
struct Seen {
    status: String,
    ip: Option<String>,
    /// Its instance template's name.
    template: String,
    /// The first interface's first access config's address.
    external_ip: Option<String>,
    /// The machine type's name (the last segment of its link).
    machine_type: Option<String>,
    /// Its attached disks' names (the last segments of their links).
    disks: Vec<String>,
}

async fn seen_in(t: &GceTarget, zone: &str) -> Result<BTreeMap<String, Seen>, ComputeError> {
    let mut out = BTreeMap::new();
    for i in t.compute.instances(zone).await? {
        let template = i["metadata"]["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["key"].as_str() == Some("instance-template"))
            .and_then(|m| m["value"].as_str())
            .map(|v| name_of_link(v).to_string())
            .unwrap_or_default();
        let nic = &i["networkInterfaces"][0];
        let seen = Seen {
            status: str_of(&i, "status").to_string(),
            ip: nic["networkIP"].as_str().map(str::to_string),
            template,
            external_ip: nic["accessConfigs"][0]["natIP"].as_str().map(str::to_string),
            machine_type: i["machineType"].as_str().map(|m| name_of_link(m).to_string()),
            disks: i["disks"].as_array().into_iter().flatten().filter_map(|d| d["source"].as_str()).map(|s| name_of_link(s).to_string()).collect(),
        };
        out.insert(str_of(&i, "name").to_string(), seen);
    }
    Ok(out)
}

fn str_of<'a>(v: &'a Value, k: &str) -> &'a str {
    v[k].as_str().unwrap_or_default()
}

/// One MIG as the rolling update sees it (`None` when it does not exist); `name` is the MIG's,
/// `target_version` its current template. An instance is in service when RUNNING, healthy when its
/// MIG has nothing left to do on it.
async fn mig_status(t: &GceTarget, m: &InstanceGroupManager, group: &str, role: Role, force: bool) -> Result<Option<GroupStatus>, ComputeError> {
    let Some(live) = t.compute.instance_group_managers(&m.zone).await?.into_iter().find(|x| str_of(x, "name") == m.gce_name) else { return Ok(None) };
    let current = name_of_link(str_of(&live, "instanceTemplate")).to_string();
    let seen = seen_in(t, &m.zone).await?;
    let mut list = Vec::new();
    for mi in t.compute.list_managed_instances(&m.zone, &m.gce_name).await? {
        let name = name_of_link(str_of(&mi, "instance")).to_string();
        if name.is_empty() {
            continue;
        }
        let Seen { status, ip, template, external_ip, machine_type, disks } = seen.get(&name).cloned().unwrap_or_default();
        list.push(InstanceStatus {
            outdated: force || template != current,
            version: Some(template).filter(|v| !v.is_empty()),
            lifecycle: if status == "RUNNING" { "InService".into() } else { status },
            healthy: str_of(&mi, "instanceStatus") == "RUNNING" && str_of(&mi, "currentAction") == "NONE",
            private_ip: ip,
            external_ip,
            machine_type,
            zone: Some(m.zone.clone()),
            volumes: disks,
            id: name,
        });
    }
    let size = i32::try_from(live["targetSize"].as_i64().unwrap_or_default()).unwrap_or(i32::MAX);
    Ok(Some(GroupStatus {
        name: m.gce_name.clone(),
        group: group.to_string(),
        role,
        target_version: current,
        min: size,
        max: size,
        desired: size,
        instances: list,
    }))
}

/// The MIGs of the selected groups (replacement order) with their instances.
pub async fn status(t: &GceTarget, model: &ClusterModel, sel: &Selection) -> Result<Vec<GroupStatus>, RollingError> {
    let migs = &model.gce.instance_group_managers;
    let of = |m: &InstanceGroupManager| model.gce.instance_templates.iter().find(|x| x.name == m.template.name());
    let wanted = select(migs.iter().filter_map(|m| of(m).map(|tpl| (m.gce_name.as_str(), tpl.group.as_str(), tpl.role))), sel)?;
    let mut out = Vec::new();
    for (mig_name, group, role) in wanted {
        let Some(m) = migs.iter().find(|m| m.gce_name == mig_name) else { continue };
        if let Some(s) = mig_status(t, m, group, role, sel.force).await? {
            out.push(s);
        }
    }
    Ok(out)
}

/// The GCE implementation of [`InstanceGroups`]: the model's MIGs on this target.
#[derive(Clone)]
pub struct GceGroups {
    pub target: GceTarget,
    pub model: Arc<ClusterModel>,
}

impl RollingTarget for GceTarget {
    fn instance_groups(&self, model: &ClusterModel) -> Arc<dyn InstanceGroups> {
        Arc::new(GceGroups { target: self.clone(), model: Arc::new(model.clone()) })
    }
}

impl GceGroups {
    /// The model's MIG behind a status.
    fn mig(&self, g: &GroupStatus) -> Result<&InstanceGroupManager, RollingError> {
        self.model
            .gce
            .instance_group_managers
            .iter()
            .find(|m| m.gce_name == g.name)
            .ok_or_else(|| RollingError::Timeout { group: g.name.clone(), message: "no such managed instance group in the spec".into() })
    }

    /// Poll the MIG until `done` says so; at most `--validation-timeout`, then `what` names the wait.
    async fn wait_until(
        &self,
        g: &GroupStatus,
        opts: &RollingOptions,
        done: impl Fn(&GroupStatus) -> bool,
        what: impl Fn(&GroupStatus) -> String,
    ) -> Result<(), RollingError> {
        let m = self.mig(g)?;
        let deadline = Instant::now() + opts.validation_timeout;
        loop {
            let now = mig_status(&self.target, m, &g.group, g.role, false).await?;
            if now.as_ref().is_some_and(&done) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let seen = now.as_ref().map(&what).unwrap_or_else(|| "the group is gone".into());
                return Err(RollingError::Timeout { group: g.name.clone(), message: format!("{seen} after {:?}", opts.validation_timeout) });
            }
            tokio::time::sleep(opts.poll).await;
        }
    }
}

impl InstanceGroups for GceGroups {
    fn status<'a>(&'a self, sel: &'a Selection) -> BoxFuture<'a, Result<Vec<GroupStatus>, RollingError>> {
        Box::pin(status(&self.target, &self.model, sel))
    }

    fn validate<'a>(&'a self, kube: &'a kube::Client) -> BoxFuture<'a, Result<crate::validate::Report, crate::validate::ValidateError>> {
        Box::pin(crate::validate::validate_gce(&self.target, &self.model, kube))
    }

    fn api_members(&self) -> i64 {
        let serves = |m: &&InstanceGroupManager| {
            self.model.gce.instance_templates.iter().any(|t| t.name == m.template.name() && matches!(t.role, Role::ControlPlane | Role::ApiServer))
        };
        self.model.gce.instance_group_managers.iter().filter(serves).map(|m| m.target_size).sum()
    }

    /// The MIG's live target size above the spec's (an interrupted run's resize).
    fn surged(&self, g: &GroupStatus) -> usize {
        let spec = self.mig(g).map(|m| m.target_size).unwrap_or(i64::from(g.desired));
        usize::try_from(i64::from(g.desired) - spec).unwrap_or(0)
    }

    /// Resize the MIG up by as many instances, and wait until all of its instances run with nothing
    /// left to do.
    fn surge<'a>(&'a self, g: &'a GroupStatus, instances: &'a [String], opts: &'a RollingOptions, log: Log<'a>) -> BoxFuture<'a, Result<(), RollingError>> {
        Box::pin(async move {
            let m = self.mig(g)?;
            let size = i64::from(g.desired) + i64::try_from(instances.len()).unwrap_or(0);
            log(&format!("{}: surge: resizing {} from {} to {size} ({} to go without a replacement)", g.group, g.name, g.desired, instances.join(", ")));
            self.target.compute.resize_instance_group_manager(&m.zone, &g.name, size).await?;
            let want = |now: &GroupStatus| now.desired == i32::try_from(size).unwrap_or(i32::MAX) && now.ready() as i64 >= size;
            self.wait_until(g, opts, want, |now| format!("{} of {size} instances RUNNING (surge)", now.ready())).await
        })
    }

    fn deregister<'a>(
        &'a self,
        _g: &'a GroupStatus,
        _instance: &'a InstanceStatus,
        _opts: &'a RollingOptions,
        _log: Log<'a>,
    ) -> BoxFuture<'a, Result<(), RollingError>> {
        Box::pin(async { Ok(()) })
    }

    /// A surplus instance is deleted from its MIG (the target size lowered with it), waited for
    /// until the MIG no longer lists it; any other recreated from the current template (same name)
    /// and waited for until it runs it.
    fn replace<'a>(
        &'a self,
        g: &'a GroupStatus,
        inst: &'a InstanceStatus,
        surplus: bool,
        claimed: &'a Mutex<BTreeSet<String>>,
        opts: &'a RollingOptions,
        log: Log<'a>,
    ) -> BoxFuture<'a, Result<String, RollingError>> {
        Box::pin(async move {
            let m = self.mig(g)?;
            let (c, name) = (&self.target.compute, inst.id.as_str());
            let link = [c.zone_link(&m.zone, "instances", name)];
            if surplus {
                log(&format!("{}: deleting instance {name} (surged: its replacement already runs template {})", g.group, g.target_version));
                c.delete_managed_instances(&m.zone, &g.name, &link).await?;
                let gone = |now: &GroupStatus| !now.instances.iter().any(|i| i.id == name);
                self.wait_until(g, opts, gone, |_| format!("instance {name} still in the group")).await?;
                return Ok(String::new());
            }
            log(&format!("{}: recreating instance {name} from template {}", g.group, g.target_version));
            c.recreate_instances(&m.zone, &g.name, &link).await?;
            let current = |now: &GroupStatus| now.instances.iter().any(|i| i.id == name && i.lifecycle == "InService" && i.healthy && !i.outdated);
            self.wait_until(g, opts, current, |_| format!("instance {name} not RUNNING on template {}", g.target_version)).await?;
            log(&format!("{}: instance {name} runs template {}", g.group, g.target_version));
            // Recreated under its own name: the replacement is the instance itself.
            if let Ok(mut claimed) = claimed.lock() {
                claimed.insert(name.to_string());
            }
            Ok(name.to_string())
        })
    }
}
