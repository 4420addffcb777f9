//! The instances of a cluster's autoscaling groups as `rolling-update` and `validate cluster` see
//! them: which launch-template version each runs, whether it is in service and healthy, and which
//! are outdated.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use cloud_resources::aws::AwsTarget;
use cloud_resources::model::ClusterModel;
use keelson_api::Role;

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

/// Which groups to look at, and whether every instance counts as outdated.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Only these instance groups (spec names); empty = all.
    pub groups: Vec<String>,
    /// Every instance is outdated (`--force`).
    pub force: bool,
}

/// One instance of a group as the rolling update sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceStatus {
    pub id: String,
    /// Launch-template version the instance was launched from (`None`: unknown / other template).
    pub version: Option<String>,
    pub lifecycle: String,
    pub healthy: bool,
    pub outdated: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupStatus {
    pub name: String,
    /// The spec's instance-group name.
    pub group: String,
    pub role: Role,
    pub latest_version: String,
    pub min: i32,
    pub max: i32,
    pub desired: i32,
    pub instances: Vec<InstanceStatus>,
}

impl GroupStatus {
    pub fn outdated(&self) -> Vec<&InstanceStatus> {
        self.instances.iter().filter(|i| i.outdated).collect()
    }
    pub fn ready(&self) -> usize {
        self.instances.iter().filter(|i| i.lifecycle == "InService" && i.healthy).count()
    }
}

/// Replacement order: control plane, API servers, nodes, bastions; by name within a role.
fn role_rank(r: Role) -> u8 {
    match r {
        Role::ControlPlane => 0,
        Role::ApiServer => 1,
        Role::Node => 2,
        Role::Bastion => 3,
    }
}

/// The cluster's groups (those in the spec, in replacement order) with their instances.
pub async fn status(t: &AwsTarget, model: &ClusterModel, opts: &Selection) -> Result<Vec<GroupStatus>, InstancesError> {
    for g in &opts.groups {
        if !model.tasks.groups.iter().any(|m| &m.group == g) {
            return Err(InstancesError::UnknownGroup(g.clone()));
        }
    }
    let mut wanted: Vec<_> = model.tasks.groups.iter().filter(|g| opts.groups.is_empty() || opts.groups.contains(&g.group)).collect();
    wanted.sort_by_key(|g| (role_rank(g.role), g.name.clone()));
    let mut out = Vec::new();
    for g in wanted {
        if let Some(s) = group_status(t, &g.name, &g.group, g.role, &g.launch_template, opts.force).await? {
            out.push(s);
        }
    }
    Ok(out)
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
    let lts = t
        .ec2
        .describe_launch_templates()
        .launch_template_names(launch_template)
        .send()
        .await
        .map_err(|e| api("DescribeLaunchTemplates", launch_template, e))?;
    let latest = lts.launch_templates().first().and_then(|l| l.latest_version_number()).map(|v| v.to_string()).unwrap_or_default();
    let template_id = lts.launch_templates().first().and_then(|l| l.launch_template_id()).unwrap_or_default().to_string();
    // EC2 tags every instance with the template id and version it was launched from; the group's
    // own view may only show what the group uses now.
    let ids: Vec<String> = g.instances().iter().filter_map(|i| i.instance_id().map(str::to_string)).collect();
    let mut launched_from: BTreeMap<String, (String, String)> = BTreeMap::new();
    for chunk in ids.chunks(500) {
        let resp = t.ec2.describe_instances().set_instance_ids(Some(chunk.to_vec())).send().await.map_err(|e| api("DescribeInstances", name, e))?;
        for i in resp.reservations().iter().flat_map(|r| r.instances()) {
            let tag = |k: &str| i.tags().iter().find(|t| t.key() == Some(k)).and_then(|t| t.value()).map(str::to_string);
            if let (Some(id), Some(tid), Some(v)) = (i.instance_id(), tag("aws:ec2launchtemplate:id"), tag("aws:ec2launchtemplate:version")) {
                launched_from.insert(id.to_string(), (tid, v));
            }
        }
    }
    let instances = g
        .instances()
        .iter()
        .map(|i| {
            let lt = i.launch_template();
            let (same_template, version) = match i.instance_id().and_then(|id| launched_from.get(id)) {
                Some((tid, v)) => (*tid == template_id, Some(v.clone())),
                None => (lt.and_then(|l| l.launch_template_name()) == Some(launch_template), lt.and_then(|l| l.version()).map(str::to_string)),
            };
            // Groups pin explicit versions; `$Latest`/`$Default` (groups made by hand) count as current.
            let current = same_template && (version.as_deref() == Some(latest.as_str()) || version.as_deref().is_some_and(|v| v.starts_with('$')));
            let lifecycle = i.lifecycle_state().map(|s| s.as_str().to_string()).unwrap_or_default();
            InstanceStatus {
                id: i.instance_id().unwrap_or_default().to_string(),
                version,
                healthy: i.health_status().unwrap_or("Healthy") == "Healthy",
                outdated: (force || !current) && !lifecycle.starts_with("Terminat"),
                lifecycle,
            }
        })
        .collect();
    Ok(Some(GroupStatus {
        name: name.to_string(),
        group: group.to_string(),
        role,
        latest_version: latest,
        min: g.min_size().unwrap_or_default(),
        max: g.max_size().unwrap_or_default(),
        desired: g.desired_capacity().unwrap_or_default(),
        instances,
    }))
}

/// kOps-style table: NAME STATUS NEEDUPDATE READY MIN TARGET MAX.
pub fn render(groups: &[GroupStatus]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{:<48} {:<12} {:>10} {:>5} {:>3} {:>6} {:>3}", "NAME", "STATUS", "NEEDUPDATE", "READY", "MIN", "TARGET", "MAX");
    for g in groups {
        let need = g.outdated().len();
        let status = if need > 0 { "NeedsUpdate" } else { "Ready" };
        let _ = writeln!(out, "{:<48} {:<12} {:>10} {:>5} {:>3} {:>6} {:>3}", g.group, status, need, g.ready(), g.min, g.desired, g.max);
    }
    out
}
