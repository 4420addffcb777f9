//! `keelson rolling-update`: replace the instances that run another configuration than their group
//! launches now (AWS: launch-template version; GCE: instance template) or whose Node is annotated
//! `kops.k8s.io/needs-update`, as kOps' `rolling-update cluster` does: bastions first, then the
//! control planes one at a time, API servers, nodes. One algorithm ([`roll_groups`]) over any
//! cloud's [`InstanceGroups`] (kOps' `pkg/instancegroups` over its `CloudInstanceGroup`).
//!
//! For each group with something to replace: validate the cluster first (a rerun after a failed
//! control-plane replacement stops here instead of taking a second member down); mark every node
//! to be replaced (annotation, `PreferNoSchedule` taint); with a surge ([`crate::surge`]) first
//! start the replacements of up to `maxSurge` instances ([`InstanceGroups::surge`]: AWS detaches
//! them, GCE resizes the group up; they go last, without a replacement). Then the instances are
//! replaced ([`crate::replace`]: out of the load balancers, drain, wait `--post-drain-delay`,
//! remove through the cloud and wait (bounded) for the replacement, pause the role's interval), up
//! to [`batch_size`] at once — `maxUnavailable` plus the surge's slots, control planes one at a
//! time, and only one until an instance runs the new configuration — as kOps does: whenever no slot
//! is free, wait for one replacement to finish, validate `--validate-count` times in a row, and
//! collect the others that finished meanwhile; the last ones are validated together. A failed
//! validation stops the run unless `--fail-on-validate-error=false` (never for control planes); any
//! other failure stops it (after the replacements still running have finished) with the group and
//! instance named; a rerun continues with what is still outdated (and what an interrupted surge
//! left).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cloud_resources::model::ClusterModel;
use keelson_api::Role;

use crate::drain;
pub use crate::groups::BoxFuture;
use crate::groups::{prioritize, surplus, GroupStatus, InstanceGroups, InstanceStatus, RollingTarget, Selection};
use crate::instances;
pub use crate::instances::still_serving;
pub use crate::replace::deregister_allowed;
use crate::replace::{Drainer, Replaced, Replacement};
use crate::surge::SurgeSpec;

#[derive(Debug, thiserror::Error)]
pub enum RollingError {
    #[error(transparent)]
    Instances(#[from] instances::InstancesError),
    #[error(transparent)]
    Aws(#[from] cloud_resources::aws::AwsError),
    #[error(transparent)]
    Drain(#[from] drain::DrainError),
    #[error("Compute: {0}")]
    Gce(Box<cloud_resources::gce::ComputeError>),
    #[error("autoscaling group {group}: {message}")]
    Timeout { group: String, message: String },
    #[error("validation after replacing {instance} in {group} failed: {message}")]
    Validation { group: String, instance: String, message: String },
    #[error("instance group {group}: spec.rollingUpdate: {message}")]
    Settings { group: String, message: String },
    #[error("the cluster does not validate, so {group} is left untouched: {message} (fix the cluster, or give --cloudonly)")]
    NotValidBefore { group: String, message: String },
    #[error("instance group {group}: draining {instance}: {message}")]
    Drained { group: String, instance: String, message: String },
    #[error("instance group {group}: the replacement of {instance} stopped: {message}")]
    Task { group: String, instance: String, message: String },
}

impl From<cloud_resources::gce::ComputeError> for RollingError {
    fn from(e: cloud_resources::gce::ComputeError) -> Self {
        RollingError::Gce(Box::new(e))
    }
}

/// The cluster's health as a rolling update needs it: the problems that matter to a roll of
/// `group` (kOps: of that group, of a control plane, or of the cluster as a whole). Empty = valid;
/// `Err` = it could not be checked (counts as not valid).
pub trait ClusterHealth: Send + Sync {
    fn problems<'a>(&'a self, group: &'a GroupStatus) -> BoxFuture<'a, Result<Vec<String>, String>>;

    /// Drain the node of `instance` before it goes, for a check of [`Validation::Custom`] (the
    /// Kubernetes drain belongs to [`Validation::Cluster`]); by default there is nothing to drain.
    fn drain<'a>(&'a self, _group: &'a GroupStatus, _instance: &'a InstanceStatus) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }
}

/// How a rolling update decides the cluster is healthy.
#[derive(Clone, Default)]
pub enum Validation {
    /// Only the cloud's word (InService); no drain: `--cloudonly`.
    #[default]
    CloudOnly,
    /// A command that must exit 0 (`--validate-command`); no drain.
    Command(Vec<String>),
    /// `keelson validate cluster` through this Kubernetes client, which also drains (the default
    /// of the CLI).
    Cluster(kube::Client),
    /// Any other check (tests); no drain.
    Custom(Arc<dyn ClusterHealth>),
}

impl std::fmt::Debug for Validation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Validation::CloudOnly => f.write_str("CloudOnly"),
            Validation::Command(c) => f.debug_tuple("Command").field(c).finish(),
            Validation::Cluster(_) => f.write_str("Cluster"),
            Validation::Custom(_) => f.write_str("Custom"),
        }
    }
}

/// How a rolling update runs; defaults are kOps'.
#[derive(Debug, Clone)]
pub struct RollingOptions {
    /// Only these instance groups (spec names); empty = all.
    pub groups: Vec<String>,
    /// Only groups of these roles; empty = all.
    pub roles: Vec<Role>,
    /// Replace every instance, outdated or not.
    pub force: bool,
    /// Only these instances (cloud IDs), each replaced whether outdated or not, every other one
    /// left alone (kOps' `delete instance`); empty = every outdated instance.
    pub instances: Vec<String>,
    /// Pause after each control-plane termination (15 s).
    pub control_plane_interval: Duration,
    /// Pause after each node / API server termination (15 s).
    pub node_interval: Duration,
    /// Pause after each bastion termination (15 s).
    pub bastion_interval: Duration,
    /// Longest drain of one node (15 min).
    pub drain_timeout: Duration,
    /// Pause after each drain (5 s).
    pub post_drain_delay: Duration,
    /// Longest wait for the cluster to validate, and for a replacement to be InService (15 min).
    pub validation_timeout: Duration,
    /// Consecutive validations needed after each replacement (2).
    pub validate_count: u32,
    /// A failed drain stops the run (true); otherwise the instance is terminated anyway.
    pub fail_on_drain_error: bool,
    /// A failed validation stops the run (true); otherwise it is logged and the run goes on.
    /// Control planes always stop: a second member is never taken down while the cluster does not
    /// validate.
    pub fail_on_validate_error: bool,
    /// Poll period while waiting on the cloud (10 s).
    pub poll: Duration,
    /// Pause between failed validations (kOps: 30 s).
    pub validate_tick: Duration,
    /// Pause between consecutive successful validations (kOps: 10 s).
    pub validate_success_pause: Duration,
    /// Pause between refused evictions (kOps: 5 s).
    pub eviction_retry: Duration,
    /// The spec's `rollingUpdate` (surge); `None`: no surge, one instance at a time.
    pub surge: Option<SurgeSpec>,
    pub validate: Validation,
}

impl Default for RollingOptions {
    fn default() -> Self {
        RollingOptions {
            groups: Vec::new(),
            roles: Vec::new(),
            force: false,
            instances: Vec::new(),
            control_plane_interval: Duration::from_secs(15),
            node_interval: Duration::from_secs(15),
            bastion_interval: Duration::from_secs(15),
            drain_timeout: Duration::from_secs(15 * 60),
            post_drain_delay: Duration::from_secs(5),
            validation_timeout: Duration::from_secs(15 * 60),
            validate_count: 2,
            fail_on_drain_error: true,
            fail_on_validate_error: true,
            poll: Duration::from_secs(10),
            validate_tick: Duration::from_secs(30),
            validate_success_pause: Duration::from_secs(10),
            eviction_retry: Duration::from_secs(5),
            surge: None,
            validate: Validation::CloudOnly,
        }
    }
}

impl RollingOptions {
    /// The groups this run looks at.
    pub fn selection(&self) -> Selection {
        Selection { groups: self.groups.clone(), roles: self.roles.clone(), force: self.force }
    }

    /// The pause after a termination in a group of `role`.
    pub fn interval(&self, role: Role) -> Duration {
        match role {
            Role::ControlPlane => self.control_plane_interval,
            Role::Bastion => self.bastion_interval,
            Role::Node | Role::ApiServer => self.node_interval,
        }
    }
}

/// What a rolling update did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RollReport {
    /// (group, terminated instance, its replacement).
    pub replaced: Vec<(String, String, String)>,
}

/// What a failed validation means for the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Proceed,
    /// Not valid, but `--fail-on-validate-error=false`: log it and go on.
    Warn(String),
    Stop(String),
}

/// The decision after a validation of a group of `role`: a control plane never proceeds on a
/// failed validation (etcd keeps quorum only if one member at a time is out), other roles follow
/// `--fail-on-validate-error`.
pub fn verdict(role: Role, outcome: Result<(), String>, fail_on_validate_error: bool) -> Verdict {
    match outcome {
        Ok(()) => Verdict::Proceed,
        Err(problem) if fail_on_validate_error || role == Role::ControlPlane => Verdict::Stop(problem),
        Err(problem) => Verdict::Warn(problem),
    }
}

/// kOps' validation: `count` consecutive passes (pausing `success_pause` between them), failures
/// retried every `tick` until `timeout` (always at least one try). `count == 0` skips it.
pub async fn validate_until(
    health: &dyn ClusterHealth,
    group: &GroupStatus,
    count: u32,
    opts: &RollingOptions,
    log: &mut (dyn FnMut(&str) + Send),
) -> Result<(), String> {
    if count == 0 {
        log(&format!("{}: not validating (--validate-count 0)", group.group));
        return Ok(());
    }
    let deadline = Instant::now() + opts.validation_timeout;
    let mut passes = 0;
    loop {
        let problem = match health.problems(group).await {
            Ok(p) if p.is_empty() => {
                passes += 1;
                if passes >= count {
                    log(&format!("{}: cluster validation passed", group.group));
                    return Ok(());
                }
                log(&format!("{}: cluster validated; validating again in {:?} to make sure it does not flap", group.group, opts.validate_success_pause));
                tokio::time::sleep(opts.validate_success_pause).await;
                continue;
            }
            Ok(p) => p.join("; "),
            Err(e) => e,
        };
        passes = 0;
        if Instant::now() + opts.validate_tick > deadline {
            return Err(format!("the cluster did not validate within {:?}: {problem}", opts.validation_timeout));
        }
        log(&format!("{}: waiting for the cluster to validate: {problem}", group.group));
        tokio::time::sleep(opts.validate_tick).await;
    }
}

/// `keelson validate cluster` through the cloud's groups, the failures relevant to the group.
struct KubeHealth<'a> {
    groups: &'a dyn InstanceGroups,
    kube: &'a kube::Client,
}

impl ClusterHealth for KubeHealth<'_> {
    fn problems<'a>(&'a self, group: &'a GroupStatus) -> BoxFuture<'a, Result<Vec<String>, String>> {
        Box::pin(async move {
            let report = self.groups.validate(self.kube).await.map_err(|e| e.to_string())?;
            Ok(report.failures.iter().filter(|f| f.relevant_to(&group.group)).map(|f| format!("{} {}: {}", f.kind, f.name, f.message)).collect())
        })
    }
}

/// A command that must exit 0.
pub(crate) struct CommandHealth<'a>(pub(crate) &'a [String]);

impl ClusterHealth for CommandHealth<'_> {
    fn problems<'a>(&'a self, _group: &'a GroupStatus) -> BoxFuture<'a, Result<Vec<String>, String>> {
        Box::pin(async move {
            let (program, args) = self.0.split_first().ok_or_else(|| "empty --validate-command".to_string())?;
            let out = tokio::process::Command::new(program).args(args).output().await.map_err(|e| format!("cannot run {program}: {e}"))?;
            if out.status.success() {
                return Ok(Vec::new());
            }
            Ok(vec![format!("`{}` failed ({}): {}", self.0.join(" "), out.status, String::from_utf8_lossy(&out.stderr).trim())])
        })
    }
}

/// Replace the outdated instances of the model's groups on `target` (AWS or GCE). `log` receives
/// one line per step.
pub async fn roll(
    target: &impl RollingTarget,
    model: &ClusterModel,
    opts: &RollingOptions,
    log: &mut (dyn FnMut(&str) + Send),
) -> Result<RollReport, RollingError> {
    Box::pin(roll_groups(target.instance_groups(model), opts, log)).await
}

/// The groups to roll as a run sees them before it starts: the cloud's view, and — with a
/// Kubernetes API — every instance whose Node is annotated `kops.k8s.io/needs-update` outdated too
/// (kOps' `AdjustNeedUpdate`).
pub async fn status(groups: &dyn InstanceGroups, opts: &RollingOptions) -> Result<Vec<GroupStatus>, RollingError> {
    let mut status = Box::pin(groups.status(&opts.selection())).await?;
    if let Validation::Cluster(kube) = &opts.validate {
        drain::adjust_need_update(&mut status, &Box::pin(drain::list_nodes(kube)).await?);
    }
    if !opts.instances.is_empty() {
        only_instances(&mut status, &opts.instances);
    }
    Ok(status)
}

/// Keep `ids` outdated (unless already terminating) and nothing else, and only the groups that
/// hold one of them: a run that replaces exactly these instances.
pub fn only_instances(status: &mut Vec<GroupStatus>, ids: &[String]) {
    for g in status.iter_mut() {
        for i in &mut g.instances {
            i.outdated = ids.contains(&i.id) && !i.lifecycle.starts_with("Terminat");
        }
    }
    status.retain(|g| g.instances.iter().any(|i| i.outdated));
}

/// The one rolling-update algorithm, over any cloud's [`InstanceGroups`].
pub async fn roll_groups(groups: Arc<dyn InstanceGroups>, opts: &RollingOptions, log: &mut (dyn FnMut(&str) + Send)) -> Result<RollReport, RollingError> {
    let kube_health;
    let command_health;
    let (health, kube): (Option<&dyn ClusterHealth>, Option<&kube::Client>) = match &opts.validate {
        Validation::CloudOnly => (None, None),
        Validation::Command(cmd) => {
            command_health = CommandHealth(cmd);
            (Some(&command_health), None)
        }
        Validation::Cluster(kube) => {
            kube_health = KubeHealth { groups: groups.as_ref(), kube };
            (Some(&kube_health), Some(kube))
        }
        Validation::Custom(h) => (Some(h.as_ref()), None),
    };
    let status = Box::pin(status(groups.as_ref(), opts)).await?;
    // Members that serve the API (kOps: with only one, it is not taken out of the load balancer
    // before its drain, or the drain could not reach the API).
    let api_members = groups.api_members();
    let mut report = RollReport::default();
    for g in &status {
        let mut update: Vec<&InstanceStatus> = g.outdated();
        if update.is_empty() {
            continue;
        }
        prioritize(&mut update);
        // Validate before touching the group (bastions are not part of the cluster).
        if let (Some(h), false) = (health, g.role == Role::Bastion) {
            match verdict(g.role, Box::pin(validate_until(h, g, 1, opts, log)).await, opts.fail_on_validate_error) {
                Verdict::Proceed => {}
                Verdict::Warn(p) => log(&format!("{}: the cluster does not validate, going on (--fail-on-validate-error=false): {p}", g.group)),
                Verdict::Stop(message) => return Err(RollingError::NotValidBefore { group: g.group.clone(), message }),
            }
        }
        // Every node to be replaced: annotated and tainted PreferNoSchedule up front.
        let mut node_of: BTreeMap<String, String> = BTreeMap::new();
        if let (Some(kube), false) = (kube, g.role == Role::Bastion) {
            let nodes = Box::pin(drain::list_nodes(kube)).await?;
            let by_ip = drain::nodes_by_ip(&nodes);
            for i in &update {
                if let Some(name) = i.private_ip.as_ref().and_then(|ip| by_ip.get(ip)).and_then(|n| n.metadata.name.clone()) {
                    node_of.insert(i.id.clone(), name);
                }
            }
            if !node_of.is_empty() {
                log(&format!("{}: tainting {} node(s) {}:PreferNoSchedule", g.group, node_of.len(), drain::TAINT_KEY));
            }
            for node in node_of.values() {
                if let Err(e) = Box::pin(drain::mark_for_update(kube, node)).await {
                    if opts.fail_on_drain_error {
                        return Err(e.into());
                    }
                    log(&format!("{}: ignoring: {e}", g.group));
                }
            }
        }
        // Surge: up to maxSurge outdated instances get their replacements first (the cloud starts
        // them at once), and go last without one; an interrupted run's surge counts.
        let settings = match &opts.surge {
            Some(spec) => spec.settings(&g.group, g.role, g.instances.len()).map_err(|message| RollingError::Settings { group: g.group.clone(), message })?,
            None => Default::default(),
        };
        let surge = settings.max_surge.min(update.len());
        let (mut surplus, fresh) = surplus(&update, groups.surged(g), settings.max_surge);
        // kOps: no surge without a way to validate it (`--cloudonly`).
        if !fresh.is_empty() && health.is_some() {
            Box::pin(groups.surge(g, &fresh, opts, log)).await?;
            tokio::time::sleep(opts.interval(g.role)).await;
            Box::pin(validate_after(health, g, &fresh.join(","), opts, log)).await?;
            surplus.extend(fresh);
        }
        if !settings.drain_and_terminate {
            log(&format!("{}: rollingUpdate.drainAndTerminate is false: nothing drained or terminated", g.group));
            continue;
        }
        // Up to maxUnavailable plus the surge's slots at once (kOps); control planes one at a time.
        let concurrency = batch_size(g.role, settings, if health.is_some() { surge } else { 0 });
        // With no instance on the new configuration yet, the first replacement must validate before
        // any other starts (kOps: the new spec may not make working nodes).
        let proven = !surplus.is_empty() || g.instances.iter().any(|i| !i.outdated);
        let claimed = Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));
        let replacement = |inst: &InstanceStatus| Replacement {
            groups: groups.clone(),
            group: g.clone(),
            instance: inst.clone(),
            surplus: surplus.contains(&inst.id),
            // Out of the group's load balancers first (the API's, for control planes), waiting out
            // the deregistration delay: a failure here always stops the run (kOps).
            deregister: health.is_some() && g.role != Role::Bastion && deregister_allowed(g.role, api_members),
            drainer: match (&opts.validate, g.role) {
                (_, Role::Bastion) => Drainer::None,
                (Validation::Cluster(kube), _) => Drainer::Kube(kube.clone(), node_of.get(&inst.id).cloned()),
                (Validation::Custom(h), _) => Drainer::Custom(h.clone()),
                _ => Drainer::None,
            },
            opts: opts.clone(),
            claimed: claimed.clone(),
        };
        let mut batch = Batch::new(log);
        let mut unvalidated: Vec<String> = Vec::new();
        for (n, inst) in update.iter().enumerate() {
            batch.log(&format!("{}: replacing {} ({} → {})", g.group, inst.id, inst.version.as_deref().unwrap_or("?"), g.target_version));
            batch.spawn(replacement(inst));
            if batch.running() < concurrency && (proven || n > 0) {
                continue;
            }
            // A slot is needed (or the first must prove the new configuration): wait for one, validate.
            let done = batch.next().await?;
            report.replaced.push(done.clone());
            unvalidated.push(done.1);
            if let Err(e) = Box::pin(validate_after(health, g, &unvalidated.join(","), opts, batch.logger())).await {
                return Err(batch.drain_then(e).await);
            }
            unvalidated.clear();
            // Validation fails from the start of a drain until its replacement is ready: sweep up
            // what finished meanwhile before starting the next.
            while let Some(done) = batch.try_next().await {
                let done = done?;
                report.replaced.push(done.clone());
                unvalidated.push(done.1);
            }
        }
        while batch.running() > 0 {
            let done = batch.next().await?;
            report.replaced.push(done.clone());
            unvalidated.push(done.1);
        }
        if !unvalidated.is_empty() {
            Box::pin(validate_after(health, g, &unvalidated.join(","), opts, batch.logger())).await?;
        }
    }
    Ok(report)
}

/// How many instances of a group are replaced at once: control planes one at a time (etcd keeps
/// quorum only with one member out); other groups `maxUnavailable` plus the slots of the surge this
/// run made (each detached instance's replacement already runs), at least one.
pub fn batch_size(role: Role, settings: crate::surge::Settings, surge_slots: usize) -> usize {
    if role == Role::ControlPlane {
        return 1;
    }
    (settings.max_unavailable + surge_slots).max(1)
}

/// The replacements of one group that run at once, each its own task; their log lines reach the
/// run's log as they come. A failure waits for the others before it is returned (each is bounded
/// by its own timeouts), so a run never stops with an instance half-replaced behind its back.
struct Batch<'l> {
    tasks: tokio::task::JoinSet<Result<Replaced, RollingError>>,
    /// Which instance each task replaces (to name one that panicked).
    instances: BTreeMap<tokio::task::Id, (String, String)>,
    lines_tx: tokio::sync::mpsc::UnboundedSender<String>,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
    log: &'l mut (dyn FnMut(&str) + Send),
}

impl<'l> Batch<'l> {
    fn new(log: &'l mut (dyn FnMut(&str) + Send)) -> Batch<'l> {
        let (lines_tx, lines) = tokio::sync::mpsc::unbounded_channel();
        Batch { tasks: tokio::task::JoinSet::new(), instances: BTreeMap::new(), lines_tx, lines, log }
    }

    /// Forward what the tasks logged so far.
    fn flush(&mut self) {
        while let Ok(line) = self.lines.try_recv() {
            (self.log)(&line);
        }
    }

    fn log(&mut self, line: &str) {
        self.flush();
        (self.log)(line);
    }

    /// The run's log, for a step between replacements.
    fn logger(&mut self) -> &mut (dyn FnMut(&str) + Send) {
        self.flush();
        &mut *self.log
    }

    fn spawn(&mut self, r: Replacement) {
        let tx = self.lines_tx.clone();
        let who = (r.group.group.clone(), r.instance.id.clone());
        let handle = self.tasks.spawn(async move {
            let mut say = move |line: &str| {
                let _ = tx.send(line.to_string());
            };
            r.run(&mut say).await
        });
        self.instances.insert(handle.id(), who);
    }

    fn running(&self) -> usize {
        self.tasks.len()
    }

    fn joined(&mut self, done: Result<(tokio::task::Id, Result<Replaced, RollingError>), tokio::task::JoinError>) -> Result<Replaced, RollingError> {
        match done {
            Ok((id, result)) => {
                self.instances.remove(&id);
                result
            }
            Err(e) => {
                let (group, instance) = self.instances.remove(&e.id()).unwrap_or_default();
                Err(RollingError::Task { group, instance, message: e.to_string() })
            }
        }
    }

    /// The next replacement to finish (forwarding log lines meanwhile); a failure after the others.
    async fn next(&mut self) -> Result<Replaced, RollingError> {
        let done = loop {
            tokio::select! {
                Some(line) = self.lines.recv() => (self.log)(&line),
                done = self.tasks.join_next_with_id() => break done,
            }
        };
        self.flush();
        let Some(done) = done else {
            return Err(RollingError::Task { group: String::new(), instance: String::new(), message: "no replacement was running".into() });
        };
        match self.joined(done) {
            Ok(r) => Ok(r),
            Err(e) => Err(self.drain_then(e).await),
        }
    }

    /// A replacement that has already finished, if any (a failure after the others).
    async fn try_next(&mut self) -> Option<Result<Replaced, RollingError>> {
        self.flush();
        let done = self.tasks.try_join_next_with_id()?;
        Some(match self.joined(done) {
            Ok(r) => Ok(r),
            Err(e) => Err(self.drain_then(e).await),
        })
    }

    /// Wait for every replacement still running, then give `e` back (later failures are logged).
    async fn drain_then(&mut self, e: RollingError) -> RollingError {
        while let Some(done) = self.tasks.join_next_with_id().await {
            if let Err(other) = self.joined(done) {
                self.flush();
                (self.log)(&format!("also failed: {other}"));
            }
        }
        self.flush();
        e
    }
}

/// After a change to `g` (`instance` detached or replaced): validate `--validate-count` times and
/// decide (bastions are not part of the cluster and are not validated).
async fn validate_after(
    health: Option<&dyn ClusterHealth>,
    g: &GroupStatus,
    instance: &str,
    opts: &RollingOptions,
    log: &mut (dyn FnMut(&str) + Send),
) -> Result<(), RollingError> {
    let Some(h) = health.filter(|_| g.role != Role::Bastion) else { return Ok(()) };
    match verdict(g.role, validate_until(h, g, opts.validate_count, opts, log).await, opts.fail_on_validate_error) {
        Verdict::Proceed => Ok(()),
        Verdict::Warn(p) => {
            log(&format!("{}: the cluster does not validate, going on (--fail-on-validate-error=false): {p}", g.group));
            Ok(())
        }
        Verdict::Stop(message) => Err(RollingError::Validation { group: g.group.clone(), instance: instance.to_string(), message }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A cluster whose health follows a script: one answer per call, the last repeated.
    struct Scripted {
        answers: Vec<Result<Vec<String>, String>>,
        calls: Mutex<usize>,
    }

    impl Scripted {
        fn new(answers: Vec<Result<Vec<String>, String>>) -> Scripted {
            Scripted { answers, calls: Mutex::new(0) }
        }
        fn calls(&self) -> usize {
            *self.calls.lock().expect("lock")
        }
    }

    impl ClusterHealth for Scripted {
        fn problems<'a>(&'a self, _group: &'a GroupStatus) -> BoxFuture<'a, Result<Vec<String>, String>> {
            let mut n = self.calls.lock().expect("lock");
            let answer = self.answers[(*n).min(self.answers.len() - 1)].clone();
            *n += 1;
            Box::pin(async move { answer })
        }
    }

    fn group(role: Role) -> GroupStatus {
        GroupStatus { name: "g.c".into(), group: "g".into(), role, target_version: "2".into(), min: 1, max: 1, desired: 1, instances: Vec::new() }
    }

    fn fast() -> RollingOptions {
        RollingOptions {
            validation_timeout: Duration::from_millis(200),
            validate_tick: Duration::from_millis(20),
            validate_success_pause: Duration::ZERO,
            ..Default::default()
        }
    }

    fn ok() -> Result<Vec<String>, String> {
        Ok(Vec::new())
    }
    fn bad(p: &str) -> Result<Vec<String>, String> {
        Ok(vec![p.to_string()])
    }

    #[test]
    fn the_only_api_server_stays_in_its_load_balancer() {
        let cases = [
            (Role::ControlPlane, 3, true),
            (Role::ControlPlane, 1, false),
            (Role::ApiServer, 1, false),
            (Role::ApiServer, 2, true),
            (Role::Node, 1, true),
            (Role::Bastion, 1, true),
        ];
        for (role, members, want) in cases {
            assert_eq!(deregister_allowed(role, members), want, "{role:?} with {members} API members");
        }
        assert!(still_serving(Some("healthy")) && still_serving(Some("draining")) && still_serving(Some("initial")));
        assert!(!still_serving(Some("unused")) && !still_serving(None));
    }

    #[test]
    fn only_the_named_instances_are_replaced_outdated_or_not() {
        let inst = |id: &str, lifecycle: &str, outdated: bool| InstanceStatus::for_test(id, lifecycle, outdated);
        let mut nodes = group(Role::Node);
        nodes.instances = vec![inst("i-a", "InService", true), inst("i-b", "InService", false), inst("i-dying", "Terminating", false)];
        let mut cps = group(Role::ControlPlane);
        cps.group = "cp".into();
        cps.instances = vec![inst("i-cp", "InService", true)];
        let mut status = vec![cps, nodes];
        only_instances(&mut status, &["i-b".to_string(), "i-dying".to_string()]);
        assert_eq!(status.len(), 1, "the control-plane group holds none of them");
        let outdated: Vec<&str> = status[0].outdated().iter().map(|i| i.id.as_str()).collect();
        assert_eq!(outdated, ["i-b"], "up to date i-b is named; outdated i-a is not; a terminating instance is not replaced");
    }

    #[test]
    fn a_batch_is_max_unavailable_plus_the_surge_and_control_planes_go_alone() {
        use crate::surge::Settings;
        let s = |surge, unavailable| Settings { max_surge: surge, max_unavailable: unavailable, drain_and_terminate: true };
        // (role, settings, surge slots used, batch)
        let cases = [
            (Role::Node, s(0, 1), 0, 1),
            (Role::Node, s(0, 2), 0, 2),
            (Role::Node, s(1, 0), 1, 1),
            (Role::Node, s(2, 1), 2, 3),
            // A surge not made (--cloudonly) gives no slot; nothing at all still means one.
            (Role::Node, s(1, 0), 0, 1),
            (Role::Node, s(0, 0), 0, 1),
            (Role::ApiServer, s(0, 3), 0, 3),
            (Role::Bastion, s(0, 2), 0, 2),
            (Role::ControlPlane, s(0, 3), 0, 1),
        ];
        for (role, settings, slots, want) in cases {
            assert_eq!(batch_size(role, settings, slots), want, "{role:?} {settings:?} surge slots {slots}");
        }
    }

    #[test]
    fn a_control_plane_never_proceeds_on_a_failed_validation() {
        let no = || Err("Node ip-1: node of control-plane-a is not ready".to_string());
        let cases = [
            (Role::ControlPlane, Ok(()), true, Verdict::Proceed),
            (Role::ControlPlane, no(), true, Verdict::Stop(no().unwrap_err())),
            (Role::ControlPlane, no(), false, Verdict::Stop(no().unwrap_err())),
            (Role::Node, no(), true, Verdict::Stop(no().unwrap_err())),
            (Role::Node, no(), false, Verdict::Warn(no().unwrap_err())),
            (Role::ApiServer, no(), false, Verdict::Warn(no().unwrap_err())),
            (Role::Node, Ok(()), false, Verdict::Proceed),
        ];
        for (role, outcome, fail_on_validate, want) in cases {
            assert_eq!(verdict(role, outcome.clone(), fail_on_validate), want, "{role:?} {outcome:?} fail-on-validate-error={fail_on_validate}");
        }
    }

    #[tokio::test]
    async fn validation_needs_count_passes_in_a_row() {
        let mut log = Vec::new();
        let h = Scripted::new(vec![ok(), bad("flap"), ok(), ok()]);
        validate_until(&h, &group(Role::Node), 2, &fast(), &mut |l| log.push(l.to_string())).await.expect("valid");
        assert_eq!(h.calls(), 4, "a failure in between restarts the count: {log:?}");
        let h = Scripted::new(vec![ok()]);
        validate_until(&h, &group(Role::Node), 0, &fast(), &mut |_| {}).await.expect("skipped");
        assert_eq!(h.calls(), 0, "--validate-count 0 does not validate");
        let h = Scripted::new(vec![Err("connection refused".into())]);
        let err = validate_until(&h, &group(Role::Node), 1, &fast(), &mut |_| {}).await.expect_err("times out");
        assert!(err.contains("did not validate within") && err.contains("connection refused"), "{err}");
        // At least one try even with no time at all.
        let h = Scripted::new(vec![ok()]);
        validate_until(&h, &group(Role::Node), 1, &RollingOptions { validation_timeout: Duration::ZERO, ..fast() }, &mut |_| {}).await.expect("valid");
    }

    /// The rerun after a failed control-plane replacement: the replaced member has not come back, so
    /// the validation before the next control-plane group fails and that group is not touched, even
    /// with `--fail-on-validate-error=false`.
    #[tokio::test]
    async fn a_rerun_after_a_failed_control_plane_replacement_touches_no_second_member() {
        let down = Scripted::new(vec![bad("InstanceGroup control-plane-a: did not have enough ready nodes: 0 of at least 1")]);
        for fail_on_validate_error in [true, false] {
            let opts = RollingOptions { fail_on_validate_error, ..fast() };
            let outcome = validate_until(&down, &group(Role::ControlPlane), 1, &opts, &mut |_| {}).await;
            assert!(matches!(verdict(Role::ControlPlane, outcome, opts.fail_on_validate_error), Verdict::Stop(ref p) if p.contains("control-plane-a")));
        }
    }
}
