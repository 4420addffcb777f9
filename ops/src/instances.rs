//! AWS's autoscaling groups as `rolling-update` and `validate cluster` see them — which
//! launch-template version each instance runs, whether it is in service and healthy, which are
//! outdated — and [`AwsGroups`], the AWS implementation of [`InstanceGroups`]: a surge detaches
//! instances (tagged [`DETACHED_TAG`], the desired capacity kept, so their replacements launch at
//! once), an instance leaves the group's load-balancer target groups before its drain, and goes by
//! `TerminateInstanceInAutoScalingGroup` without lowering the desired capacity (a detached one by
//! `TerminateInstances`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cloud_resources::aws::AwsTarget;
use cloud_resources::model::ClusterModel;
use keelson_api::Role;

use crate::groups::{pick_replacement, BoxFuture, InstanceGroups, Log, RollingTarget};
pub use crate::groups::{render, role_rank, select, GroupStatus, InstanceStatus, Selection, DETACHED};
use crate::rolling::{RollingError, RollingOptions};
use crate::surge::DETACHED_TAG;

#[derive(Debug, thiserror::Error)]
pub enum InstancesError {
    #[error(transparent)]
    Aws(#[from] cloud_resources::aws::AwsError),
    #[error("--instance-group {0:?}: no such instance group in the spec")]
    UnknownGroup(String),
}

fn api<E: std::error::Error + Send + Sync + 'static>(op: &'static str, target: &str, e: E) -> InstancesError {
    cloud_resources::aws::api(op, target, e).into()
}

/// The cluster's groups (those in the spec, in replacement order) with their instances.
pub async fn status(t: &AwsTarget, model: &ClusterModel, opts: &Selection) -> Result<Vec<GroupStatus>, InstancesError> {
    let wanted = select(model.tasks.groups.iter().map(|g| (g.name.as_str(), g.group.as_str(), g.role)), opts)?;
    let mut out = Vec::new();
    for (name, _, _) in wanted {
        let Some(g) = model.tasks.groups.iter().find(|g| g.name == name) else { continue };
        if let Some(s) = group_status(t, &g.name, &g.group, g.role, &g.launch_template, opts.force).await? {
            out.push(s);
        }
    }
    Ok(out)
}

/// A launch template and one of its version numbers: what an instance was launched from, or what
/// its group launches now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateVersion {
    pub template_id: String,
    pub version: String,
}

/// The version number a group's configured version means. AWS takes a missing version as
/// `$Default`; `$Latest` and `$Default` are resolved with the template's numbers
/// (DescribeLaunchTemplates); `None` when it cannot be resolved.
pub fn resolve_version(configured: Option<&str>, default: Option<i64>, latest: Option<i64>) -> Option<String> {
    match configured.unwrap_or("$Default") {
        "$Default" => default.map(|v| v.to_string()),
        "$Latest" => latest.map(|v| v.to_string()),
        v if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => Some(v.trim_start_matches('0').to_string()).filter(|v| !v.is_empty()),
        _ => None,
    }
}

/// An instance needs replacing when it was launched from another template or another version than
/// the one its group is configured with (not the template's latest: a version made by hand and not
/// pinned changes nothing). An instance whose origin is unknown is outdated; when the group's own
/// version is unknown nothing can be compared and nothing is outdated.
pub fn is_outdated(launched: Option<&TemplateVersion>, configured: Option<&TemplateVersion>) -> bool {
    match (launched, configured) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(l), Some(c)) => l != c,
    }
}

/// What DescribeInstances says of an instance beyond its group's view.
#[derive(Debug, Clone, Default)]
struct Described {
    external_ip: Option<String>,
    machine_type: Option<String>,
    zone: Option<String>,
    volumes: Vec<String>,
}

impl Described {
    fn of(i: &aws_sdk_ec2::types::Instance) -> Described {
        Described {
            external_ip: i.public_ip_address().map(str::to_string),
            machine_type: i.instance_type().map(|t| t.as_str().to_string()),
            zone: i.placement().and_then(|p| p.availability_zone()).map(str::to_string),
            volumes: i.block_device_mappings().iter().filter_map(|b| b.ebs().and_then(|e| e.volume_id())).map(str::to_string).collect(),
        }
    }
}

pub async fn group_status(
    t: &AwsTarget,
    name: &str,
    group: &str,
    role: Role,
    launch_template: &str,
    force: bool,
) -> Result<Option<GroupStatus>, InstancesError> {
    let resp = t.asg.describe_auto_scaling_groups().auto_scaling_group_names(name).send().await.map_err(|e| api("DescribeAutoScalingGroups", name, e))?;
    let Some(g) = resp.auto_scaling_groups().first() else { return Ok(None) };
    // What the group launches: its launch template, or its mixed-instances policy's.
    let spec = g
        .launch_template()
        .cloned()
        .or_else(|| g.mixed_instances_policy().and_then(|m| m.launch_template()).and_then(|l| l.launch_template_specification()).cloned());
    let by_id = spec.as_ref().and_then(|s| s.launch_template_id()).map(str::to_string);
    let by_name = spec.as_ref().and_then(|s| s.launch_template_name()).unwrap_or(launch_template).to_string();
    let describe = match &by_id {
        Some(id) => t.ec2.describe_launch_templates().launch_template_ids(id),
        None => t.ec2.describe_launch_templates().launch_template_names(&by_name),
    };
    let lts = describe.send().await.map_err(|e| api("DescribeLaunchTemplates", by_id.as_deref().unwrap_or(&by_name), e))?;
    let lt = lts.launch_templates().first();
    let (default, latest) = (lt.and_then(|l| l.default_version_number()), lt.and_then(|l| l.latest_version_number()));
    let template_id = lt.and_then(|l| l.launch_template_id()).map(str::to_string).or(by_id).unwrap_or_default();
    let configured =
        resolve_version(spec.as_ref().and_then(|s| s.version()), default, latest).map(|version| TemplateVersion { template_id: template_id.clone(), version });
    // EC2 tags every instance with the template id and version it was launched from; the group's
    // own view may only show what the group uses now.
    let ids: Vec<String> = g.instances().iter().filter_map(|i| i.instance_id().map(str::to_string)).collect();
    let mut launched_from: BTreeMap<String, TemplateVersion> = BTreeMap::new();
    let mut private_ip: BTreeMap<String, String> = BTreeMap::new();
    let mut described: BTreeMap<String, Described> = BTreeMap::new();
    for chunk in ids.chunks(500) {
        let resp = t.ec2.describe_instances().set_instance_ids(Some(chunk.to_vec())).send().await.map_err(|e| api("DescribeInstances", name, e))?;
        for i in resp.reservations().iter().flat_map(|r| r.instances()) {
            let tag = |k: &str| i.tags().iter().find(|t| t.key() == Some(k)).and_then(|t| t.value()).map(str::to_string);
            if let (Some(id), Some(ip)) = (i.instance_id(), i.private_ip_address()) {
                private_ip.insert(id.to_string(), ip.to_string());
            }
            if let Some(id) = i.instance_id() {
                described.insert(id.to_string(), Described::of(i));
            }
            if let (Some(id), Some(template_id), Some(version)) = (i.instance_id(), tag("aws:ec2launchtemplate:id"), tag("aws:ec2launchtemplate:version")) {
                launched_from.insert(id.to_string(), TemplateVersion { template_id, version });
            }
        }
    }
    let mut instances: Vec<InstanceStatus> = g
        .instances()
        .iter()
        .map(|i| {
            let id = i.instance_id().unwrap_or_default().to_string();
            let launched = launched_from.get(&id).cloned().or_else(|| {
                // Without EC2's tags: the group's record of the instance (same template by id or name).
                let lt = i.launch_template()?;
                let same = lt.launch_template_id() == Some(template_id.as_str()) || lt.launch_template_name() == Some(by_name.as_str());
                let version = resolve_version(lt.version(), default, latest)?;
                Some(TemplateVersion { template_id: if same { template_id.clone() } else { lt.launch_template_id().unwrap_or_default().to_string() }, version })
            });
            let lifecycle = i.lifecycle_state().map(|s| s.as_str().to_string()).unwrap_or_default();
            let Described { external_ip, machine_type, zone, volumes } = described.get(&id).cloned().unwrap_or_default();
            InstanceStatus {
                outdated: (force || is_outdated(launched.as_ref(), configured.as_ref())) && !lifecycle.starts_with("Terminat"),
                private_ip: private_ip.get(&id).cloned(),
                external_ip,
                machine_type: machine_type.or_else(|| i.instance_type().map(str::to_string)),
                zone: zone.or_else(|| i.availability_zone().map(str::to_string)),
                volumes,
                id,
                version: launched.map(|l| l.version),
                healthy: i.health_status().unwrap_or("Healthy") == "Healthy",
                lifecycle,
            }
        })
        .collect();
    // Instances a surge detached from the group (an interrupted run's): found by their tags, always
    // outdated, last.
    // Every page (the SDK's paginator): EC2 pages a filtered DescribeInstances too.
    let detached = t
        .ec2
        .describe_instances()
        .filters(aws_sdk_ec2::types::Filter::builder().name("tag-key").values(DETACHED_TAG).build())
        .filters(aws_sdk_ec2::types::Filter::builder().name("tag:kops.k8s.io/instancegroup").values(group).build())
        .filters(aws_sdk_ec2::types::Filter::builder().name("tag:Name").values(name).build())
        .filters(aws_sdk_ec2::types::Filter::builder().name("instance-state-name").values("pending").values("running").build())
        .into_paginator()
        .items()
        .send()
        .try_collect()
        .await
        .map_err(|e| api("DescribeInstances", name, e))?;
    for i in detached.iter().flat_map(|r| r.instances()) {
        let Some(id) = i.instance_id() else { continue };
        if instances.iter().any(|x| x.id == id) {
            continue;
        }
        let tag = |k: &str| i.tags().iter().find(|t| t.key() == Some(k)).and_then(|t| t.value()).map(str::to_string);
        instances.push(InstanceStatus {
            id: id.to_string(),
            version: tag("aws:ec2launchtemplate:version"),
            lifecycle: DETACHED.to_string(),
            healthy: true,
            private_ip: i.private_ip_address().map(str::to_string),
            external_ip: i.public_ip_address().map(str::to_string),
            machine_type: i.instance_type().map(|t| t.as_str().to_string()),
            zone: Described::of(i).zone,
            volumes: Described::of(i).volumes,
            outdated: true,
        });
    }
    Ok(Some(GroupStatus {
        name: name.to_string(),
        group: group.to_string(),
        role,
        target_version: configured.map(|c| c.version).unwrap_or_default(),
        min: g.min_size().unwrap_or_default(),
        max: g.max_size().unwrap_or_default(),
        desired: g.desired_capacity().unwrap_or_default(),
        instances,
    }))
}

/// The AWS implementation of [`InstanceGroups`]: the model's autoscaling groups on this target.
#[derive(Clone)]
pub struct AwsGroups {
    pub target: AwsTarget,
    pub model: Arc<ClusterModel>,
}

impl RollingTarget for AwsTarget {
    fn instance_groups(&self, model: &ClusterModel) -> Arc<dyn InstanceGroups> {
        Arc::new(AwsGroups { target: self.clone(), model: Arc::new(model.clone()) })
    }
}

fn rolling_api<E: std::error::Error + Send + Sync + 'static>(op: &'static str, target: &str, e: E) -> RollingError {
    cloud_resources::aws::api(op, target, e).into()
}

/// Whether a target in this state may still get traffic (everything but `unused`: not registered).
pub fn still_serving(state: Option<&str>) -> bool {
    !matches!(state, None | Some("unused"))
}

impl AwsGroups {
    /// The launch template of the autoscaling group `asg`.
    fn launch_template(&self, asg: &str) -> String {
        self.model.tasks.groups.iter().find(|m| m.name == asg).map(|m| m.launch_template.to_string()).unwrap_or_default()
    }

    /// The group as it is now.
    async fn now(&self, g: &GroupStatus) -> Result<Option<GroupStatus>, RollingError> {
        Ok(group_status(&self.target, &g.name, &g.group, g.role, &self.launch_template(&g.name), false).await?)
    }

    /// Wait (bounded) until the group has its desired number of InService, healthy instances.
    async fn wait_for_capacity(&self, g: &GroupStatus, opts: &RollingOptions) -> Result<(), RollingError> {
        let deadline = Instant::now() + opts.validation_timeout;
        loop {
            if let Some(now) = self.now(g).await? {
                if now.ready() as i32 >= now.desired {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                return Err(RollingError::Timeout {
                    group: g.name.clone(),
                    message: format!(
                        "the surge's instances were not InService within {:?}; rerun rolling-update (it finds the detached instances)",
                        opts.validation_timeout
                    ),
                });
            }
            tokio::time::sleep(opts.poll).await;
        }
    }

    /// Wait until the terminated instance is out of service and the group has its desired number
    /// of InService, healthy instances, one of them new and not yet claimed. Returns (and claims) it.
    async fn wait_for_replacement(
        &self,
        g: &GroupStatus,
        terminated: &str,
        before: &[String],
        claimed: &Mutex<BTreeSet<String>>,
        opts: &RollingOptions,
    ) -> Result<String, RollingError> {
        let deadline = Instant::now() + opts.validation_timeout;
        loop {
            if let Some(now) = self.now(g).await? {
                let live: BTreeMap<&str, &InstanceStatus> = now.instances.iter().map(|i| (i.id.as_str(), i)).collect();
                let gone = live.get(terminated).is_none_or(|i| i.lifecycle.starts_with("Terminat"));
                let ready = now.ready() as i32 >= now.desired;
                if gone && ready {
                    let mut claimed = claimed.lock().map_err(|_| RollingError::Timeout { group: g.name.clone(), message: "a replacement panicked".into() })?;
                    if let Some(new) = pick_replacement(&now, before, &claimed).map(str::to_string) {
                        claimed.insert(new.clone());
                        return Ok(new);
                    }
                }
            }
            if Instant::now() >= deadline {
                return Err(RollingError::Timeout {
                    group: g.name.clone(),
                    message: format!(
                        "the replacement of {terminated} was not InService within {:?}; investigate, then rerun rolling-update (it continues with what is still outdated)",
                        opts.validation_timeout
                    ),
                });
            }
            tokio::time::sleep(opts.poll).await;
        }
    }
}

impl InstanceGroups for AwsGroups {
    fn status<'a>(&'a self, sel: &'a Selection) -> BoxFuture<'a, Result<Vec<GroupStatus>, RollingError>> {
        Box::pin(async move { Ok(status(&self.target, &self.model, sel).await?) })
    }

    fn validate<'a>(&'a self, kube: &'a kube::Client) -> BoxFuture<'a, Result<crate::validate::Report, crate::validate::ValidateError>> {
        Box::pin(crate::validate::validate(&self.target, &self.model, kube))
    }

    fn api_members(&self) -> i64 {
        self.model.tasks.groups.iter().filter(|g| matches!(g.role, Role::ControlPlane | Role::ApiServer)).map(|g| g.min_size).sum()
    }

    /// The instances a surge detached (found by their tag, listed last).
    fn surged(&self, g: &GroupStatus) -> usize {
        g.instances.iter().filter(|i| i.lifecycle == DETACHED).count()
    }

    /// Tag the instances (so an interrupted run finds them), detach them keeping the desired
    /// capacity (the group launches their replacements at once), wait for the new capacity.
    fn surge<'a>(&'a self, g: &'a GroupStatus, instances: &'a [String], opts: &'a RollingOptions, log: Log<'a>) -> BoxFuture<'a, Result<(), RollingError>> {
        Box::pin(async move {
            let t = &self.target;
            for id in instances {
                log(&format!("{}: detaching {id} (surge; its replacement launches now)", g.group));
                Box::pin(t.ec2.create_tags().resources(id).tags(aws_sdk_ec2::types::Tag::builder().key(DETACHED_TAG).value("").build()).send())
                    .await
                    .map_err(|e| rolling_api("CreateTags", id, e))?;
            }
            Box::pin(
                t.asg
                    .detach_instances()
                    .auto_scaling_group_name(&g.name)
                    .set_instance_ids(Some(instances.to_vec()))
                    .should_decrement_desired_capacity(false)
                    .send(),
            )
            .await
            .map_err(|e| rolling_api("DetachInstances", &g.name, e))?;
            Box::pin(self.wait_for_capacity(g, opts)).await
        })
    }

    /// Deregister the instance from every target group of its autoscaling group and wait until
    /// each says it is unused (the deregistration delay served), bounded by `--drain-timeout`.
    fn deregister<'a>(
        &'a self,
        g: &'a GroupStatus,
        instance: &'a InstanceStatus,
        opts: &'a RollingOptions,
        log: Log<'a>,
    ) -> BoxFuture<'a, Result<(), RollingError>> {
        Box::pin(async move {
            let (t, asg, instance) = (&self.target, g.name.as_str(), instance.id.as_str());
            let groups = Box::pin(t.asg.describe_auto_scaling_groups().auto_scaling_group_names(asg).send())
                .await
                .map_err(|e| rolling_api("DescribeAutoScalingGroups", asg, e))?;
            let arns: Vec<String> = groups.auto_scaling_groups().iter().flat_map(|g| g.target_group_arns().iter().cloned()).collect();
            let deadline = Instant::now() + opts.drain_timeout;
            let target = || aws_sdk_elasticloadbalancingv2::types::TargetDescription::builder().id(instance).build();
            for arn in arns {
                loop {
                    let health = Box::pin(t.elb.describe_target_health().target_group_arn(&arn).targets(target()).send())
                        .await
                        .map_err(|e| rolling_api("DescribeTargetHealth", &arn, e))?;
                    let state =
                        health.target_health_descriptions().first().and_then(|d| d.target_health()).and_then(|h| h.state()).map(|s| s.as_str().to_string());
                    if !still_serving(state.as_deref()) {
                        break;
                    }
                    if Instant::now() >= deadline {
                        return Err(RollingError::Timeout {
                            group: asg.to_string(),
                            message: format!("{instance} still {} in target group {arn} after {:?}", state.unwrap_or_default(), opts.drain_timeout),
                        });
                    }
                    if state.as_deref() != Some("draining") {
                        log(&format!("{asg}: deregistering {instance} from target group {arn}"));
                        Box::pin(t.elb.deregister_targets().target_group_arn(&arn).targets(target()).send())
                            .await
                            .map_err(|e| rolling_api("DeregisterTargets", &arn, e))?;
                    }
                    tokio::time::sleep(opts.eviction_retry).await;
                }
            }
            Ok(())
        })
    }

    /// A detached instance is terminated outside the group (its replacement is already in
    /// service); any other inside it without lowering the desired capacity, and its replacement
    /// waited for.
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
            let t = &self.target;
            if surplus {
                Box::pin(t.ec2.terminate_instances().instance_ids(&inst.id).send()).await.map_err(|e| rolling_api("TerminateInstances", &inst.id, e))?;
                log(&format!("{}: terminated detached {}", g.group, inst.id));
                return Ok(String::new());
            }
            let before: Vec<String> = g.instances.iter().map(|i| i.id.clone()).collect();
            Box::pin(t.asg.terminate_instance_in_auto_scaling_group().instance_id(&inst.id).should_decrement_desired_capacity(false).send())
                .await
                .map_err(|e| rolling_api("TerminateInstanceInAutoScalingGroup", &inst.id, e))?;
            let replacement = Box::pin(self.wait_for_replacement(g, &inst.id, &before, claimed, opts)).await?;
            log(&format!("{}: {} is InService", g.group, replacement));
            Ok(replacement)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_groups_configured_version_resolves_latest_and_default() {
        // (configured, default, latest, resolved)
        type Case<'a> = (Option<&'a str>, Option<i64>, Option<i64>, Option<&'a str>);
        let cases: &[Case] = &[
            (Some("2"), Some(1), Some(3), Some("2")),
            (Some("$Latest"), Some(1), Some(3), Some("3")),
            (Some("$Default"), Some(1), Some(3), Some("1")),
            (None, Some(2), Some(3), Some("2")),
            (Some("$Latest"), Some(1), None, None),
            (Some("007"), None, None, Some("7")),
            (Some("latest"), Some(1), Some(3), None),
            (Some(""), Some(1), Some(3), None),
        ];
        for (configured, default, latest, want) in cases {
            assert_eq!(resolve_version(*configured, *default, *latest).as_deref(), *want, "{configured:?} default {default:?} latest {latest:?}");
        }
    }

    #[test]
    fn outdated_means_another_template_or_version_than_the_group_is_configured_with() {
        let tv = |t: &str, v: &str| Some(TemplateVersion { template_id: t.into(), version: v.into() });
        let cases = [
            // (launched, configured, outdated)
            (tv("lt-1", "2"), tv("lt-1", "2"), false),
            (tv("lt-1", "1"), tv("lt-1", "2"), true),
            // Pinned back to an older version (a rollback): the newer instances go.
            (tv("lt-1", "3"), tv("lt-1", "2"), true),
            (tv("lt-2", "2"), tv("lt-1", "2"), true),
            (None, tv("lt-1", "2"), true),
            (tv("lt-1", "1"), None, false),
            (None, None, false),
        ];
        for (launched, configured, want) in cases {
            assert_eq!(is_outdated(launched.as_ref(), configured.as_ref()), want, "{launched:?} vs {configured:?}");
        }
    }
}
