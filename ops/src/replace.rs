//! One instance's replacement during a rolling update, as its own task so that a group replaces up
//! to its `maxUnavailable` (plus surge) instances at once ([`crate::rolling`] bounds how many run):
//! out of the group's load balancers, drain its node, pause, remove it through its cloud
//! ([`InstanceGroups::replace`]: replaced by its group and waited for, bounded, or — surged — gone
//! for good), pause the role's interval. Everything it needs is owned, and its log lines go back
//! to the run through a channel.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use keelson_api::Role;

use crate::drain::{self, DrainOptions};
use crate::groups::{GroupStatus, InstanceGroups, InstanceStatus};
use crate::rolling::{ClusterHealth, RollingError, RollingOptions};

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
    pub groups: Arc<dyn InstanceGroups>,
    pub group: GroupStatus,
    pub instance: InstanceStatus,
    /// Surged: its replacement already runs, it goes without one.
    pub surplus: bool,
    /// Leave the group's load balancers first (see [`deregister_allowed`]).
    pub deregister: bool,
    pub drainer: Drainer,
    pub opts: RollingOptions,
    /// The group's new instances already reported as some other instance's replacement.
    pub claimed: Arc<Mutex<BTreeSet<String>>>,
}

/// What a finished replacement reports: (group, removed instance, its replacement — empty for a
/// surged instance).
pub type Replaced = (String, String, String);

impl Replacement {
    /// Replace the instance; `log` gets one line per step.
    pub async fn run(self, log: &mut (dyn FnMut(&str) + Send)) -> Result<Replaced, RollingError> {
        let (g, inst, opts) = (&self.group, &self.instance, &self.opts);
        if self.deregister {
            Box::pin(self.groups.deregister(g, inst, opts, log)).await?;
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
        let replacement = Box::pin(self.groups.replace(g, inst, self.surplus, &self.claimed, opts, log)).await?;
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
