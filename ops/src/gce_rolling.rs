//! `keelson rolling-update` on GCE: the instances of each MIG that do not run the MIG's current
//! instance template (the `instance-template` metadata GCE gives a MIG's instance) are replaced one
//! at a time, control planes first: the node drained (with the Kubernetes API), the instance
//! recreated by its MIG (`recreateInstances`: same name, the current template), waited for (bounded)
//! until RUNNING on the current template, then the cluster validated as on AWS
//! ([`crate::validate::validate_gce`]).
//!
//! Surge (`spec.rollingUpdate.maxSurge`, [`crate::surge`]; 0 by default on GCE, as in kOps, and never
//! for control planes): kOps cannot surge on GCE (its detach is not implemented); here the MIG is
//! resized up by the surge first, so that many instances on the current template start at once
//! and are validated, and then that many outdated instances are drained and *deleted*
//! (`deleteInstances`, which lowers the target size back) instead of recreated: the group never
//! runs below its size for them. The surge is read from the MIG's live target size against the
//! spec's, so a run that was interrupted after the resize picks up where it stopped.

use std::collections::BTreeMap;
use std::time::Instant;

use cloud_resources::gce::{name_of_link, GceTarget};
use cloud_resources::model::ClusterModel;
use serde_json::Value;

use crate::drain;
use crate::instances::{self, GroupStatus, InstanceStatus, Selection};
use crate::rolling::{validate_until, verdict, BoxFuture, ClusterHealth, CommandHealth, RollReport, RollingError, RollingOptions, Validation, Verdict};

/// An instance as `instances.list` shows it: (status, address, its template's name).
type Seen = (String, Option<String>, String);

async fn seen_in(t: &GceTarget, zone: &str) -> Result<BTreeMap<String, Seen>, RollingError> {
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
        let ip = i["networkInterfaces"][0]["networkIP"].as_str().map(str::to_string);
        out.insert(i["name"].as_str().unwrap_or_default().to_string(), (i["status"].as_str().unwrap_or_default().to_string(), ip, template));
    }
    Ok(out)
}

fn str_of<'a>(v: &'a Value, k: &str) -> &'a str {
    v[k].as_str().unwrap_or_default()
}

/// The MIGs of the selected groups (replacement order) with their instances; `name` is the MIG's,
/// `target_version` its current template.
pub async fn status(t: &GceTarget, model: &ClusterModel, sel: &Selection) -> Result<Vec<GroupStatus>, RollingError> {
    let migs = &model.gce.instance_group_managers;
    let of = |m: &cloud_resources::gce::InstanceGroupManager| model.gce.instance_templates.iter().find(|x| x.name == m.template.name());
    let wanted = instances::select(migs.iter().filter_map(|m| of(m).map(|tpl| (m.gce_name.as_str(), tpl.group.as_str(), tpl.role))), sel)?;
    let mut out = Vec::new();
    for (mig_name, group, role) in wanted {
        let Some(m) = migs.iter().find(|m| m.gce_name == mig_name) else { continue };
        let Some(live) = t.compute.instance_group_managers(&m.zone).await?.into_iter().find(|x| str_of(x, "name") == mig_name) else { continue };
        let current = name_of_link(str_of(&live, "instanceTemplate")).to_string();
        let seen = seen_in(t, &m.zone).await?;
        let mut list = Vec::new();
        for mi in t.compute.list_managed_instances(&m.zone, mig_name).await? {
            let name = name_of_link(str_of(&mi, "instance")).to_string();
            if name.is_empty() {
                continue;
            }
            let (status, ip, template) = seen.get(&name).cloned().unwrap_or_default();
            list.push(InstanceStatus {
                outdated: sel.force || template != current,
                version: Some(template).filter(|v| !v.is_empty()),
                lifecycle: if status == "RUNNING" { "InService".into() } else { status },
                healthy: str_of(&mi, "instanceStatus") == "RUNNING",
                private_ip: ip,
                id: name,
            });
        }
        let size = i32::try_from(live["targetSize"].as_i64().unwrap_or_default()).unwrap_or(i32::MAX);
        out.push(GroupStatus {
            name: mig_name.to_string(),
            group: group.to_string(),
            role,
            target_version: current,
            min: size,
            max: size,
            desired: size,
            instances: list,
        });
    }
    Ok(out)
}

/// `keelson validate cluster` on GCE, the failures relevant to the group.
struct GceKubeHealth<'a> {
    target: &'a GceTarget,
    model: &'a ClusterModel,
    kube: &'a kube::Client,
}

impl ClusterHealth for GceKubeHealth<'_> {
    fn problems<'a>(&'a self, group: &'a GroupStatus) -> BoxFuture<'a, Result<Vec<String>, String>> {
        Box::pin(async move {
            let report = crate::validate::validate_gce(self.target, self.model, self.kube).await.map_err(|e| e.to_string())?;
            Ok(report.failures.iter().filter(|f| f.relevant_to(&group.group)).map(|f| format!("{} {}: {}", f.kind, f.name, f.message)).collect())
        })
    }
}

/// Replace the outdated instances of the selected groups. `log` receives one line per step.
pub async fn roll(t: &GceTarget, model: &ClusterModel, opts: &RollingOptions, log: &mut (dyn FnMut(&str) + Send)) -> Result<RollReport, RollingError> {
    let kube_health;
    let command_health;
    let (health, kube): (Option<&dyn ClusterHealth>, Option<&kube::Client>) = match &opts.validate {
        Validation::CloudOnly => (None, None),
        Validation::Command(cmd) => {
            command_health = CommandHealth(cmd);
            (Some(&command_health), None)
        }
        Validation::Cluster(kube) => {
            kube_health = GceKubeHealth { target: t, model, kube };
            (Some(&kube_health), Some(kube))
        }
        Validation::Custom(h) => (Some(h.as_ref()), None),
    };
    let mut report = RollReport::default();
    for g in status(t, model, &opts.selection()).await? {
        let outdated: Vec<InstanceStatus> = g.outdated().into_iter().cloned().collect();
        if outdated.is_empty() {
            continue;
        }
        let Some(m) = model.gce.instance_group_managers.iter().find(|m| m.gce_name == g.name) else { continue };
        let zone = m.zone.clone();
        if let Some(h) = health {
            validate_until(h, &g, 1, opts, log).await.map_err(|message| RollingError::NotValidBefore { group: g.group.clone(), message })?;
        }
        let settings = match &opts.surge {
            Some(spec) => spec.settings(&g.group, g.role, g.instances.len()).map_err(|message| RollingError::Settings { group: g.group.clone(), message })?,
            None => Default::default(),
        };
        // The surge still in place (a resize an interrupted run made) counts toward this one.
        let live_size = i64::from(g.desired);
        let surge = i64::try_from(settings.max_surge.min(outdated.len())).unwrap_or(0);
        let surged = (live_size - m.target_size).max(0);
        if surge > surged {
            let size = m.target_size + surge;
            log(&format!("{}: surge: resizing {} from {live_size} to {size} (maxSurge {surge})", g.group, g.name));
            t.compute.resize_instance_group_manager(&zone, &g.name, size).await?;
            wait_current(t, &zone, &g, usize::try_from(size).unwrap_or(0).saturating_sub(outdated.len()), opts).await?;
            if let Some(h) = health {
                validate_after_surge(h, &g, opts, log).await?;
            }
        }
        if !settings.drain_and_terminate {
            log(&format!("{}: rollingUpdate.drainAndTerminate is false: nothing drained or replaced", g.group));
            continue;
        }
        let mut extra = surge.max(surged);
        for i in outdated {
            drain_instance(kube, &g, &i, opts, log).await?;
            if extra > 0 {
                log(&format!("{}: deleting instance {} (surged: its replacement already runs template {})", g.group, i.id, g.target_version));
                t.compute.delete_managed_instances(&zone, &g.name, &[t.compute.zone_link(&zone, "instances", &i.id)]).await?;
                wait_gone(t, &zone, &g, &i.id, opts).await?;
                extra -= 1;
            } else {
                log(&format!("{}: recreating instance {} from template {}", g.group, i.id, g.target_version));
                t.compute.recreate_instances(&zone, &g.name, &[t.compute.zone_link(&zone, "instances", &i.id)]).await?;
                wait_running(t, &zone, &g, &i.id, opts).await?;
                log(&format!("{}: instance {} runs template {}", g.group, i.id, g.target_version));
            }
            report.replaced.push((g.group.clone(), i.id.clone(), i.id.clone()));
            if let Some(h) = health {
                match verdict(g.role, validate_until(h, &g, opts.validate_count, opts, log).await, opts.fail_on_validate_error) {
                    Verdict::Proceed => {}
                    Verdict::Warn(problem) => log(&format!("{}: the cluster did not validate, going on (--fail-on-validate-error=false): {problem}", g.group)),
                    Verdict::Stop(message) => return Err(RollingError::Validation { group: g.group.clone(), instance: i.id.clone(), message }),
                }
            }
            tokio::time::sleep(opts.interval(g.role)).await;
        }
    }
    Ok(report)
}

/// Drain the instance's node (matched by address) when there is a Kubernetes API to drain with.
async fn drain_instance(
    kube: Option<&kube::Client>,
    g: &GroupStatus,
    i: &InstanceStatus,
    opts: &RollingOptions,
    log: &mut (dyn FnMut(&str) + Send),
) -> Result<(), RollingError> {
    let (Some(kube), Some(ip)) = (kube, i.private_ip.as_deref()) else { return Ok(()) };
    let nodes = drain::list_nodes(kube).await?;
    let Some(node) = drain::nodes_by_ip(&nodes).get(ip).and_then(|n| n.metadata.name.clone()) else { return Ok(()) };
    log(&format!("{}: draining node {node} (instance {})", g.group, i.id));
    let d = drain::DrainOptions { timeout: opts.drain_timeout, retry: opts.eviction_retry };
    match drain::drain(kube, &node, &d, log).await {
        Ok(()) => tokio::time::sleep(opts.post_drain_delay).await,
        Err(e) if opts.fail_on_drain_error => return Err(RollingError::Drained { group: g.group.clone(), instance: i.id.clone(), message: e.to_string() }),
        Err(e) => log(&format!("{}: draining {node} failed, replacing it anyway: {e}", g.group)),
    }
    Ok(())
}

/// After a surge: the cluster must validate before any outdated instance goes (a failure stops the
/// run: the new template may not make working nodes).
async fn validate_after_surge(h: &dyn ClusterHealth, g: &GroupStatus, opts: &RollingOptions, log: &mut (dyn FnMut(&str) + Send)) -> Result<(), RollingError> {
    validate_until(h, g, opts.validate_count, opts, log).await.map_err(|message| RollingError::Validation {
        group: g.group.clone(),
        instance: "(surge)".into(),
        message,
    })
}

/// Until at least `want` of the MIG's instances are RUNNING with nothing to do on the group's
/// current template; at most `--validation-timeout`.
async fn wait_current(t: &GceTarget, zone: &str, g: &GroupStatus, want: usize, opts: &RollingOptions) -> Result<(), RollingError> {
    let deadline = Instant::now() + opts.validation_timeout;
    loop {
        let managed = t.compute.list_managed_instances(zone, &g.name).await?;
        let seen = seen_in(t, zone).await?;
        let current = managed
            .iter()
            .filter(|mi| str_of(mi, "instanceStatus") == "RUNNING" && str_of(mi, "currentAction") == "NONE")
            .filter(|mi| seen.get(name_of_link(str_of(mi, "instance"))).is_some_and(|(_, _, tpl)| *tpl == g.target_version))
            .count();
        if current >= want {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(RollingError::Timeout {
                group: g.name.clone(),
                message: format!("{current} of {want} instances RUNNING on template {} after {:?} (surge)", g.target_version, opts.validation_timeout),
            });
        }
        tokio::time::sleep(opts.poll).await;
    }
}

/// Until the MIG no longer lists the instance; at most `--validation-timeout`.
async fn wait_gone(t: &GceTarget, zone: &str, g: &GroupStatus, name: &str, opts: &RollingOptions) -> Result<(), RollingError> {
    let deadline = Instant::now() + opts.validation_timeout;
    loop {
        let managed = t.compute.list_managed_instances(zone, &g.name).await?;
        if !managed.iter().any(|mi| name_of_link(str_of(mi, "instance")) == name) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(RollingError::Timeout {
                group: g.name.clone(),
                message: format!("instance {name} still in the group after {:?}", opts.validation_timeout),
            });
        }
        tokio::time::sleep(opts.poll).await;
    }
}

/// Until the MIG says the instance is RUNNING with nothing to do, on the group's template; at most
/// `--validation-timeout`.
async fn wait_running(t: &GceTarget, zone: &str, g: &GroupStatus, name: &str, opts: &RollingOptions) -> Result<(), RollingError> {
    let deadline = Instant::now() + opts.validation_timeout;
    loop {
        let managed = t.compute.list_managed_instances(zone, &g.name).await?;
        let settled = managed
            .iter()
            .any(|mi| name_of_link(str_of(mi, "instance")) == name && str_of(mi, "instanceStatus") == "RUNNING" && str_of(mi, "currentAction") == "NONE");
        if settled && seen_in(t, zone).await?.get(name).is_some_and(|(_, _, tpl)| *tpl == g.target_version) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(RollingError::Timeout {
                group: g.name.clone(),
                message: format!("instance {name} not RUNNING on template {} after {:?}", g.target_version, opts.validation_timeout),
            });
        }
        tokio::time::sleep(opts.poll).await;
    }
}
