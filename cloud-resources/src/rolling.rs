//! `keelson rolling-update`: replace the instances that run an outdated launch-template version,
//! one at a time per group, control plane first (etcd keeps quorum: the next member goes only once
//! the previous one's replacement is InService and, when given, the validation command passes).
//!
//! An instance is replaced with TerminateInstanceInAutoScalingGroup without decrementing the
//! desired capacity, so the group launches its replacement from the current version. Every wait is
//! bounded; a timeout stops the run with the group and instance named, and a rerun continues from
//! what is still outdated.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use keelson_api::Role;

use super::aws::AwsTarget;
use super::model::ClusterModel;

#[derive(Debug, thiserror::Error)]
pub enum RollingError {
    #[error(transparent)]
    Aws(#[from] crate::aws::AwsError),
    #[error("autoscaling group {group}: {message}")]
    Timeout { group: String, message: String },
    #[error("validation after replacing {instance} in {group} failed: {message}")]
    Validation { group: String, instance: String, message: String },
    #[error("--instance-group {0:?}: no such instance group in the spec")]
    UnknownGroup(String),
}

fn api<E: std::error::Error + Send + Sync + 'static>(op: &'static str, target: &str, e: E) -> RollingError {
    crate::aws::api(op, target, e).into()
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
    fn ready(&self) -> usize {
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

/// How a rolling update runs.
#[derive(Debug, Clone)]
pub struct RollingOptions {
    /// Only these instance groups (spec names); empty = all.
    pub groups: Vec<String>,
    /// Replace every instance, outdated or not.
    pub force: bool,
    /// Pause after each replacement is ready (kOps: 15 s).
    pub interval: Duration,
    /// Longest wait for one replacement to be InService (kOps: 15 min).
    pub timeout: Duration,
    /// Poll period while waiting.
    pub poll: Duration,
    /// How each replacement is validated before the next (retried every `poll` until `timeout`).
    pub validate: Validation,
}

/// How a rolling update decides a replacement is healthy.
#[derive(Clone, Default)]
pub enum Validation {
    /// Only the cloud's word (InService): `--cloudonly`.
    #[default]
    CloudOnly,
    /// A command that must exit 0 (`--validate-command`).
    Command(Vec<String>),
    /// `keelson validate cluster` through this Kubernetes client (the default of the CLI).
    Cluster(kube::Client),
}

impl std::fmt::Debug for Validation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Validation::CloudOnly => f.write_str("CloudOnly"),
            Validation::Command(c) => f.debug_tuple("Command").field(c).finish(),
            Validation::Cluster(_) => f.write_str("Cluster"),
        }
    }
}

impl Default for RollingOptions {
    fn default() -> Self {
        RollingOptions {
            groups: Vec::new(),
            force: false,
            interval: Duration::from_secs(15),
            timeout: Duration::from_secs(15 * 60),
            poll: Duration::from_secs(10),
            validate: Validation::CloudOnly,
        }
    }
}

/// The cluster's groups (those in the spec, in replacement order) with their instances.
pub async fn status(t: &AwsTarget, model: &ClusterModel, opts: &RollingOptions) -> Result<Vec<GroupStatus>, RollingError> {
    for g in &opts.groups {
        if !model.groups.iter().any(|m| &m.group == g) {
            return Err(RollingError::UnknownGroup(g.clone()));
        }
    }
    let mut wanted: Vec<_> = model.groups.iter().filter(|g| opts.groups.is_empty() || opts.groups.contains(&g.group)).collect();
    wanted.sort_by_key(|g| (role_rank(g.role), g.name.clone()));
    let mut out = Vec::new();
    for g in wanted {
        if let Some(s) = group_status(t, &g.name, &g.group, g.role, &g.launch_template, opts.force).await? {
            out.push(s);
        }
    }
    Ok(out)
}

async fn group_status(t: &AwsTarget, name: &str, group: &str, role: Role, launch_template: &str, force: bool) -> Result<Option<GroupStatus>, RollingError> {
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

/// What a rolling update did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RollReport {
    /// (group, terminated instance, its replacement).
    pub replaced: Vec<(String, String, String)>,
}

/// Replace the outdated instances. `log` receives one line per step.
pub async fn roll(t: &AwsTarget, model: &ClusterModel, opts: &RollingOptions, log: &mut dyn FnMut(&str)) -> Result<RollReport, RollingError> {
    let mut report = RollReport::default();
    for g in status(t, model, opts).await? {
        let lt = model.groups.iter().find(|m| m.name == g.name).map(|m| m.launch_template.clone()).unwrap_or_default();
        for inst in g.outdated() {
            log(&format!("{}: replacing {} (launch template version {} → {})", g.group, inst.id, inst.version.as_deref().unwrap_or("?"), g.latest_version));
            let before: Vec<String> = g.instances.iter().map(|i| i.id.clone()).collect();
            t.asg
                .terminate_instance_in_auto_scaling_group()
                .instance_id(&inst.id)
                .should_decrement_desired_capacity(false)
                .send()
                .await
                .map_err(|e| api("TerminateInstanceInAutoScalingGroup", &inst.id, e))?;
            let replacement = wait_for_replacement(t, &g, &lt, &inst.id, &before, opts).await?;
            log(&format!("{}: {} is InService", g.group, replacement));
            match &opts.validate {
                Validation::CloudOnly => {}
                Validation::Command(cmd) => validate(cmd, &g.name, &inst.id, opts, log).await?,
                Validation::Cluster(kube) => validate_cluster(t, model, kube, &g.name, &inst.id, opts, log).await?,
            }
            report.replaced.push((g.group.clone(), inst.id.clone(), replacement));
            tokio::time::sleep(opts.interval).await;
        }
    }
    Ok(report)
}

/// Wait until the terminated instance is out of service and the group has its desired number of
/// InService, healthy instances, one of them new. Returns the new instance.
async fn wait_for_replacement(
    t: &AwsTarget,
    g: &GroupStatus,
    launch_template: &str,
    terminated: &str,
    before: &[String],
    opts: &RollingOptions,
) -> Result<String, RollingError> {
    let deadline = Instant::now() + opts.timeout;
    loop {
        if let Some(now) = group_status(t, &g.name, &g.group, g.role, launch_template, false).await? {
            let live: BTreeMap<&str, &InstanceStatus> = now.instances.iter().map(|i| (i.id.as_str(), i)).collect();
            let gone = live.get(terminated).is_none_or(|i| i.lifecycle.starts_with("Terminat"));
            let ready = now.ready() as i32 >= now.desired;
            let new = now.instances.iter().find(|i| !before.contains(&i.id) && i.lifecycle == "InService" && i.healthy && !i.outdated).map(|i| i.id.clone());
            if let (true, true, Some(new)) = (gone, ready, new) {
                return Ok(new);
            }
        }
        if Instant::now() >= deadline {
            return Err(RollingError::Timeout {
                group: g.name.clone(),
                message: format!(
                    "the replacement of {terminated} was not InService within {:?}; investigate, then rerun rolling-update (it continues with what is still outdated)",
                    opts.timeout
                ),
            });
        }
        tokio::time::sleep(opts.poll).await;
    }
}

/// Wait (bounded by `timeout`) until the cluster validates ([`crate::validate`]).
async fn validate_cluster(
    t: &AwsTarget,
    model: &ClusterModel,
    kube: &kube::Client,
    group: &str,
    instance: &str,
    opts: &RollingOptions,
    log: &mut dyn FnMut(&str),
) -> Result<(), RollingError> {
    let deadline = Instant::now() + opts.timeout;
    loop {
        let problem = match crate::validate::validate(t, model, kube).await {
            Ok(r) if r.valid() => {
                log(&format!("{group}: cluster validation passed"));
                return Ok(());
            }
            Ok(r) => r.failures.iter().map(|f| format!("{} {}: {}", f.kind, f.name, f.message)).collect::<Vec<_>>().join("; "),
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            return Err(RollingError::Validation {
                group: group.to_string(),
                instance: instance.to_string(),
                message: format!("the cluster did not validate within {:?}: {problem}", opts.timeout),
            });
        }
        log(&format!("{group}: waiting for the cluster to validate: {problem}"));
        tokio::time::sleep(opts.poll).await;
    }
}

async fn validate(cmd: &[String], group: &str, instance: &str, opts: &RollingOptions, log: &mut dyn FnMut(&str)) -> Result<(), RollingError> {
    let deadline = Instant::now() + opts.timeout;
    let fail = |message: String| RollingError::Validation { group: group.to_string(), instance: instance.to_string(), message };
    let (program, args) = cmd.split_first().ok_or_else(|| fail("empty --validate-command".into()))?;
    loop {
        let out = tokio::process::Command::new(program).args(args).output().await.map_err(|e| fail(format!("cannot run {program}: {e}")))?;
        if out.status.success() {
            log(&format!("{group}: validation passed"));
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if Instant::now() >= deadline {
            return Err(fail(format!("`{}` still failing after {:?} ({}): {stderr}", cmd.join(" "), opts.timeout, out.status)));
        }
        log(&format!("{group}: validation not passing yet ({}), retrying", out.status));
        tokio::time::sleep(opts.poll).await;
    }
}
