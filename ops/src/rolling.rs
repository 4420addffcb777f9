//! `keelson rolling-update`: replace the instances that run an outdated launch-template version,
//! one at a time per group, control plane first (etcd keeps quorum: the next member goes only once
//! the previous one's replacement is InService and, when given, the validation command passes).
//!
//! An instance is replaced with TerminateInstanceInAutoScalingGroup without decrementing the
//! desired capacity, so the group launches its replacement from the current version. Every wait is
//! bounded; a timeout stops the run with the group and instance named, and a rerun continues from
//! what is still outdated.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cloud_resources::aws::AwsTarget;
use cloud_resources::model::ClusterModel;

use crate::instances::{self, group_status, GroupStatus, InstanceStatus, Selection};

#[derive(Debug, thiserror::Error)]
pub enum RollingError {
    #[error(transparent)]
    Instances(#[from] instances::InstancesError),
    #[error(transparent)]
    Aws(#[from] cloud_resources::aws::AwsError),
    #[error("autoscaling group {group}: {message}")]
    Timeout { group: String, message: String },
    #[error("validation after replacing {instance} in {group} failed: {message}")]
    Validation { group: String, instance: String, message: String },
}

fn api<E: std::error::Error + Send + Sync + 'static>(op: &'static str, target: &str, e: E) -> RollingError {
    cloud_resources::aws::api(op, target, e).into()
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

impl RollingOptions {
    /// The groups this run looks at.
    pub fn selection(&self) -> Selection {
        Selection { groups: self.groups.clone(), force: self.force }
    }
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
    for g in instances::status(t, model, &opts.selection()).await? {
        let lt = model.groups.iter().find(|m| m.name == g.name).map(|m| m.launch_template.clone()).unwrap_or_default();
        for inst in g.outdated() {
            log(&format!("{}: replacing {} (launch template version {} → {})", g.group, inst.id, inst.version.as_deref().unwrap_or("?"), g.target_version));
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
