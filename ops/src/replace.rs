//! One instance's replacement during a rolling update, as its own task so that a group replaces up
//! to its `maxUnavailable` (plus surge) instances at once ([`crate::rolling`] bounds how many run):
//! out of the group's load-balancer target groups, drain its node, pause, terminate (inside its
//! autoscaling group, or outside it when a surge detached it), wait (bounded) for the replacement,
//! pause the role's interval. Everything it needs is owned, and its log lines go back to the run
//! through a channel.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cloud_resources::aws::AwsTarget;
use keelson_api::Role;

use crate::drain::{self, DrainOptions};
use crate::instances::{group_status, GroupStatus, InstanceStatus};
use crate::rolling::{api, ClusterHealth, RollingError, RollingOptions};

/// How the instance's node is drained before it goes.
#[derive(Clone)]
pub enum Drainer {
    /// Not drained (`--cloudonly`, `--validate-command`, bastions).
    None,
    /// Through the Kubernetes API (the node, when the instance has joined the cluster).
    Kube(kube::Client, Option<String>),
    /// By the run's own health check ([`ClusterHealth::drain`]: tests).
    Custom(Arc<dyn ClusterHealth>),
}

/// One instance to replace and everything its replacement needs.
#[derive(Clone)]
pub struct Replacement {
    pub target: AwsTarget,
    pub group: GroupStatus,
    pub instance: InstanceStatus,
    /// The group's launch-template name.
    pub launch_template: String,
    /// Detached from its group by a surge: its replacement already runs.
    pub detached: bool,
    /// Leave the group's target groups first (see [`deregister_allowed`]).
    pub deregister: bool,
    pub drainer: Drainer,
    pub opts: RollingOptions,
    /// The group's new instances already reported as some other instance's replacement.
    pub claimed: Arc<Mutex<BTreeSet<String>>>,
}

/// What a finished replacement reports: (group, terminated instance, its replacement — empty for
/// a detached instance).
pub type Replaced = (String, String, String);

impl Replacement {
    /// Replace the instance; `log` gets one line per step.
    pub async fn run(self, log: &mut (dyn FnMut(&str) + Send)) -> Result<Replaced, RollingError> {
        let (t, g, inst, opts) = (&self.target, &self.group, &self.instance, &self.opts);
        if self.deregister {
            Box::pin(deregister(t, &g.name, &inst.id, opts, log)).await?;
        }
        match &self.drainer {
            Drainer::None => {}
            Drainer::Kube(_, None) => log(&format!("{}: {} has not joined the cluster as a node; not draining", g.group, inst.id)),
            Drainer::Kube(kube, Some(node)) => {
                log(&format!("{}: draining node {node}", g.group));
                let drained = Box::pin(drain::drain(kube, node, &DrainOptions { timeout: opts.drain_timeout, retry: opts.eviction_retry }, log)).await;
                self.after_drain(drained.map_err(RollingError::from), log).await?;
            }
            Drainer::Custom(h) => {
                let drained = h.drain(g, inst).await.map_err(|message| RollingError::Drained { group: g.group.clone(), instance: inst.id.clone(), message });
                self.after_drain(drained, log).await?;
            }
        }
        if self.detached {
            // Its replacement is already in service: terminate it outside the group.
            Box::pin(t.ec2.terminate_instances().instance_ids(&inst.id).send()).await.map_err(|e| api("TerminateInstances", &inst.id, e))?;
            log(&format!("{}: terminated detached {}", g.group, inst.id));
            tokio::time::sleep(opts.interval(g.role)).await;
            return Ok((g.group.clone(), inst.id.clone(), String::new()));
        }
        let before: Vec<String> = g.instances.iter().map(|i| i.id.clone()).collect();
        Box::pin(t.asg.terminate_instance_in_auto_scaling_group().instance_id(&inst.id).should_decrement_desired_capacity(false).send())
            .await
            .map_err(|e| api("TerminateInstanceInAutoScalingGroup", &inst.id, e))?;
        let replacement = Box::pin(wait_for_replacement(t, g, &self.launch_template, &inst.id, &before, &self.claimed, opts)).await?;
        log(&format!("{}: {} is InService", g.group, replacement));
        tokio::time::sleep(opts.interval(g.role)).await;
        Ok((g.group.clone(), inst.id.clone(), replacement))
    }

    /// A failed drain stops the replacement unless `--fail-on-drain-error=false`; then the pause
    /// for pods to settle.
    async fn after_drain(&self, drained: Result<(), RollingError>, log: &mut (dyn FnMut(&str) + Send)) -> Result<(), RollingError> {
        match drained {
            Ok(()) => {}
            Err(e) if self.opts.fail_on_drain_error => return Err(e),
            Err(e) => log(&format!("{}: ignoring drain failure (--fail-on-drain-error=false): {e}", self.group.group)),
        }
        if !self.opts.post_drain_delay.is_zero() {
            log(&format!("{}: waiting {:?} for pods to settle after the drain", self.group.group, self.opts.post_drain_delay));
            tokio::time::sleep(self.opts.post_drain_delay).await;
        }
        Ok(())
    }
}

/// Whether an instance of a group of `role` leaves its load balancers before its drain: always,
/// except the only API server of a cluster (`api_members`: the control-plane and API-server groups'
/// minimum sizes together), whose drain needs it.
pub fn deregister_allowed(role: Role, api_members: i64) -> bool {
    !matches!(role, Role::ControlPlane | Role::ApiServer) || api_members > 1
}

/// Whether a target in this state may still get traffic (everything but `unused`: not registered).
pub fn still_serving(state: Option<&str>) -> bool {
    !matches!(state, None | Some("unused"))
}

/// Deregister the instance from every target group of its autoscaling group and wait until each
/// says it is unused (the deregistration delay served), bounded by `--drain-timeout`.
async fn deregister(t: &AwsTarget, asg: &str, instance: &str, opts: &RollingOptions, log: &mut (dyn FnMut(&str) + Send)) -> Result<(), RollingError> {
    let groups =
        Box::pin(t.asg.describe_auto_scaling_groups().auto_scaling_group_names(asg).send()).await.map_err(|e| api("DescribeAutoScalingGroups", asg, e))?;
    let arns: Vec<String> = groups.auto_scaling_groups().iter().flat_map(|g| g.target_group_arns().iter().cloned()).collect();
    let deadline = Instant::now() + opts.drain_timeout;
    let target = || aws_sdk_elasticloadbalancingv2::types::TargetDescription::builder().id(instance).build();
    for arn in arns {
        loop {
            let health = Box::pin(t.elb.describe_target_health().target_group_arn(&arn).targets(target()).send())
                .await
                .map_err(|e| api("DescribeTargetHealth", &arn, e))?;
            let state = health.target_health_descriptions().first().and_then(|d| d.target_health()).and_then(|h| h.state()).map(|s| s.as_str().to_string());
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
                Box::pin(t.elb.deregister_targets().target_group_arn(&arn).targets(target()).send()).await.map_err(|e| api("DeregisterTargets", &arn, e))?;
            }
            tokio::time::sleep(opts.eviction_retry).await;
        }
    }
    Ok(())
}

/// The new instance to report as a replacement: in service, healthy, current, not in the group
/// before the roll, and not already reported for another instance.
pub fn pick_replacement<'a>(now: &'a GroupStatus, before: &[String], claimed: &BTreeSet<String>) -> Option<&'a str> {
    now.instances
        .iter()
        .find(|i| !before.contains(&i.id) && !claimed.contains(&i.id) && i.lifecycle == "InService" && i.healthy && !i.outdated)
        .map(|i| i.id.as_str())
}

/// Wait until the terminated instance is out of service and the group has its desired number of
/// InService, healthy instances, one of them new and not yet claimed. Returns (and claims) it.
async fn wait_for_replacement(
    t: &AwsTarget,
    g: &GroupStatus,
    launch_template: &str,
    terminated: &str,
    before: &[String],
    claimed: &Mutex<BTreeSet<String>>,
    opts: &RollingOptions,
) -> Result<String, RollingError> {
    let deadline = Instant::now() + opts.validation_timeout;
    loop {
        if let Some(now) = group_status(t, &g.name, &g.group, g.role, launch_template, false).await? {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_new_instance_is_reported_for_one_replacement_only() {
        let inst = |id: &str, lifecycle: &str, outdated: bool| InstanceStatus {
            id: id.into(),
            version: Some("2".into()),
            lifecycle: lifecycle.into(),
            healthy: true,
            private_ip: None,
            outdated,
        };
        let now = GroupStatus {
            name: "nodes.c".into(),
            group: "nodes".into(),
            role: Role::Node,
            target_version: "2".into(),
            min: 3,
            max: 3,
            desired: 3,
            instances: vec![
                inst("i-old", "InService", true),
                inst("i-kept", "InService", false),
                inst("i-new1", "Pending", false),
                inst("i-new2", "InService", false),
            ],
        };
        let before = vec!["i-old".to_string(), "i-kept".to_string()];
        let mut claimed = BTreeSet::new();
        assert_eq!(pick_replacement(&now, &before, &claimed), Some("i-new2"), "in service, new, current");
        claimed.insert("i-new2".to_string());
        assert_eq!(pick_replacement(&now, &before, &claimed), None, "i-new1 is not in service yet, i-new2 is taken");
    }
}
