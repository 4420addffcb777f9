//! This control plane's place behind the API load balancer: in its target group only while the local
//! API server answers `/readyz`.
//!
//! The control-plane autoscaling groups register their instances in the API target group when they
//! enter service, as kOps' do. A target group checks its targets with TCP, so a new control plane
//! would get clients as soon as its API server listens — seconds before it is ready (its etcd member
//! still joining: refused connections, `/readyz` 500). protokube closes that window:
//!
//! - until the local API server has answered `/readyz` [`READY_AFTER`] times in a row, the instance
//!   is taken out of the target group (whoever put it there);
//! - once it is ready, protokube puts it in;
//! - an API server that was ready and fails [`FAIL_AFTER`] checks in a row is taken out — but only
//!   while another target is healthy (with none, the load balancer's fail-open is the better answer);
//! - someone else taking it out (the rolling update, before it drains and terminates the instance)
//!   is final: protokube never puts back what it did not take out;
//! - when protokube stops (SIGTERM at poweroff), the instance leaves first.
//!
//! [`Gate`] is the decision, a pure state machine; [`ApiTarget`] is the thin I/O around it.

use std::future::Future;
use std::time::{Duration, Instant};

use base::StateStore;
use cloud::targets::{TargetGroups, TargetState, TargetsError};

/// Checks in a row that make the API server ready.
pub const READY_AFTER: u32 = 2;
/// Checks in a row that make a ready API server not ready.
pub const FAIL_AFTER: u32 = 3;
/// Time between checks while the membership is not settled (not ready, or not registered yet):
/// the autoscaling group may register the instance at any moment then.
pub const FAST: Duration = Duration::from_secs(1);
/// Time between checks once ready and registered; the membership is read every [`MEMBERSHIP_EVERY`]
/// checks then.
pub const SETTLED: Duration = Duration::from_secs(2);
pub const MEMBERSHIP_EVERY: u32 = 15;

/// What the load balancer says of this instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Membership {
    /// Registered (any state but draining).
    Registered,
    /// Deregistered, still draining its connections.
    Draining,
    /// Not in the target group.
    Absent,
}

impl Membership {
    /// This instance's membership among `targets`, and whether some other target is healthy.
    pub fn of(instance: &str, targets: &[TargetState]) -> (Membership, bool) {
        let me = match targets.iter().find(|t| t.id == instance).map(|t| t.state.as_str()) {
            None | Some("unused") => Membership::Absent,
            Some("draining") => Membership::Draining,
            Some(_) => Membership::Registered,
        };
        let others_healthy = targets.iter().any(|t| t.id != instance && t.state == "healthy");
        (me, others_healthy)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Register,
    Deregister,
    Nothing,
}

/// The decision (see the module's rules).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Gate {
    ready_streak: u32,
    fail_streak: u32,
    /// Ready at some point since protokube started.
    was_ready: bool,
    /// What protokube last made the membership (`None`: it never acted, nor saw it settled).
    believed_in: Option<bool>,
    /// Someone else took the instance out: protokube no longer touches its membership.
    pub released: bool,
}

impl Gate {
    /// Whether the API server counts as ready now.
    pub fn ready(&self) -> bool {
        self.ready_streak >= READY_AFTER || (self.was_ready && self.fail_streak < FAIL_AFTER)
    }

    /// Whether the membership is what it should stay (check slowly). Not while the last answer
    /// was a failure: a server that starts failing (its etcd member cut off from the others) is
    /// checked every [`FAST`], so it leaves the load balancer after [`FAIL_AFTER`] quick checks
    /// rather than slow ones.
    pub fn settled(&self) -> bool {
        self.released || (self.ready() && self.fail_streak == 0 && self.believed_in == Some(true))
    }

    /// Record one `/readyz` result.
    pub fn observe(&mut self, ready: bool) {
        if ready {
            self.ready_streak = self.ready_streak.saturating_add(1);
            self.fail_streak = 0;
            if self.ready_streak >= READY_AFTER {
                self.was_ready = true;
            }
        } else {
            self.fail_streak = self.fail_streak.saturating_add(1);
            self.ready_streak = 0;
        }
    }

    /// What to do, given the membership the load balancer reports now.
    pub fn decide(&mut self, membership: Membership, others_healthy: bool) -> Action {
        if self.released {
            return Action::Nothing;
        }
        let ready = self.ready();
        match membership {
            Membership::Registered if ready => {
                self.believed_in = Some(true);
                Action::Nothing
            }
            // Never ready yet and the last answer a failure (a protokube restarted on a serving
            // control plane waits for its second answer); or ready once, failing now, and
            // another target can take the clients.
            Membership::Registered if (!self.was_ready && self.fail_streak > 0) || (self.fail_streak >= FAIL_AFTER && others_healthy) => {
                self.believed_in = Some(false);
                Action::Deregister
            }
            Membership::Registered => Action::Nothing,
            Membership::Draining | Membership::Absent if self.believed_in == Some(true) => {
                self.released = true;
                Action::Nothing
            }
            Membership::Draining | Membership::Absent if ready => {
                self.believed_in = Some(true);
                Action::Register
            }
            Membership::Draining | Membership::Absent => Action::Nothing,
        }
    }

    /// Record that the action failed: the next pass decides again.
    pub fn failed(&mut self) {
        self.believed_in = None;
    }
}

/// This instance in the API target group `name`.
pub struct ApiTarget<T> {
    pub targets: T,
    pub name: String,
    pub instance: String,
    pub gate: Gate,
    arn: Option<String>,
    checks: u32,
}

/// What one pass did (for logs and tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pass {
    /// No target group of that name (yet).
    NoTargetGroup,
    /// Membership not read this pass (settled).
    Skipped,
    Did(Action, Membership),
}

impl<T: TargetGroups + Sync> ApiTarget<T> {
    pub fn new(targets: T, name: String, instance: String) -> Self {
        ApiTarget { targets, name, instance, gate: Gate::default(), arn: None, checks: 0 }
    }

    async fn arn(&mut self) -> Result<Option<String>, TargetsError> {
        if self.arn.is_none() {
            self.arn = self.targets.find(&self.name).await?;
        }
        Ok(self.arn.clone())
    }

    /// One check: record `ready`, read the membership (every check until settled, then every
    /// [`MEMBERSHIP_EVERY`]) and act.
    pub async fn pass(&mut self, ready: bool) -> Result<Pass, TargetsError> {
        self.gate.observe(ready);
        self.checks = self.checks.wrapping_add(1);
        if self.gate.released || (self.gate.settled() && !self.checks.is_multiple_of(MEMBERSHIP_EVERY)) {
            return Ok(Pass::Skipped);
        }
        let Some(arn) = self.arn().await? else { return Ok(Pass::NoTargetGroup) };
        let (membership, others_healthy) = Membership::of(&self.instance, &self.targets.targets(&arn).await?);
        let action = self.gate.decide(membership, others_healthy);
        let done = match action {
            Action::Register => self.targets.register(&arn, &self.instance).await,
            Action::Deregister => self.targets.deregister(&arn, &self.instance).await,
            Action::Nothing => Ok(()),
        };
        if let Err(e) = done {
            self.gate.failed();
            return Err(e);
        }
        match action {
            Action::Register => tracing::info!(target_group = %self.name, instance = %self.instance, "API server ready: registered in the API target group"),
            Action::Deregister => {
                tracing::info!(target_group = %self.name, instance = %self.instance, "API server not ready: taken out of the API target group")
            }
            Action::Nothing if self.gate.released => {
                tracing::info!(target_group = %self.name, instance = %self.instance, "taken out of the API target group by someone else: left out")
            }
            Action::Nothing => {}
        }
        Ok(Pass::Did(action, membership))
    }

    /// Leave the target group (protokube is stopping): whatever the gate says.
    pub async fn leave(&mut self) -> Result<bool, TargetsError> {
        let Some(arn) = self.arn().await? else { return Ok(false) };
        let (membership, _) = Membership::of(&self.instance, &self.targets.targets(&arn).await?);
        if membership != Membership::Registered {
            return Ok(false);
        }
        self.targets.deregister(&arn, &self.instance).await?;
        self.gate.released = true;
        tracing::info!(target_group = %self.name, instance = %self.instance, "stopping: left the API target group");
        Ok(true)
    }

    /// Check readiness and act until `stop` turns true, then leave: every [`FAST`] until settled,
    /// then every [`SETTLED`].
    pub async fn run(mut self, mut readiness: impl Readiness, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut logged_missing = false;
        loop {
            if *stop.borrow() {
                break;
            }
            let ready = readiness.ready().await;
            match self.pass(ready).await {
                Ok(Pass::NoTargetGroup) if !logged_missing => {
                    logged_missing = true;
                    tracing::warn!(target_group = %self.name, "no API target group of that name yet; this control plane is not put behind the API load balancer");
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "API target group membership"),
            }
            let wait = if self.gate.settled() { SETTLED } else { FAST };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.changed() => break,
            }
        }
        match tokio::time::timeout(Duration::from_secs(5), self.leave()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "leaving the API target group failed"),
            Err(_) => tracing::warn!("leaving the API target group took over 5 s; gone without it"),
        }
    }
}

/// Whether the API server is ready now.
pub trait Readiness {
    fn ready(&mut self) -> impl Future<Output = bool> + Send;
}

/// Keep this instance in the API target group of `plan`'s cluster while its local API server is
/// ready, on a task of its own; the returned switch tells it to leave and end
/// ([`crate::shutdown::leave`]).
pub fn start<T: TargetGroups + Sync + Send + 'static>(
    targets: T,
    plan: &crate::config::Plan,
    instance: &str,
    store: StateStore,
) -> crate::shutdown::ApiTargetTask {
    let target = ApiTarget::new(targets, keelson_api::names::api_target_group_name(&plan.cluster_name), instance.to_string());
    let readyz = LocalReadyz::new(store, plan.local_api_server());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    (stop, tokio::spawn(target.run(readyz, stopped)))
}

/// The local API server's `/readyz`, asked as `keelson:addons` (see [`crate::addons::client`]),
/// bounded by [`READYZ_TIMEOUT`].
pub struct LocalReadyz {
    store: StateStore,
    server: String,
    client: Option<(kube::Client, Instant)>,
}

pub const READYZ_TIMEOUT: Duration = Duration::from_secs(2);

impl LocalReadyz {
    pub fn new(store: StateStore, server: String) -> Self {
        LocalReadyz { store, server, client: None }
    }
}

impl Readiness for LocalReadyz {
    async fn ready(&mut self) -> bool {
        // The client certificate lives 24 h: a new one every 12 h.
        if self.client.as_ref().is_none_or(|(_, at)| at.elapsed() >= Duration::from_secs(12 * 3600)) {
            match crate::addons::client(&self.store, &self.server).await {
                Ok(c) => self.client = Some((c, Instant::now())),
                Err(e) => {
                    tracing::debug!(error = %e, "readyz: no client yet");
                    return false;
                }
            }
        }
        let Some((client, _)) = &self.client else { return false };
        let Ok(request) = http::Request::get("/readyz").body(Vec::new()) else { return false };
        matches!(tokio::time::timeout(READYZ_TIMEOUT, client.request_text(request)).await, Ok(Ok(body)) if body.trim() == "ok")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate_after(results: &[bool]) -> Gate {
        let mut g = Gate::default();
        for r in results {
            g.observe(*r);
        }
        g
    }

    #[test]
    fn a_new_control_plane_registered_by_its_group_is_taken_out_until_ready() {
        let mut g = gate_after(&[false]);
        assert_eq!(g.decide(Membership::Registered, false), Action::Deregister, "registered before its first ready answer");
        let mut g = gate_after(&[false, true]);
        assert_eq!(g.decide(Membership::Draining, true), Action::Nothing, "one ready answer is not enough");
        g.observe(true);
        assert_eq!(g.decide(Membership::Draining, true), Action::Register);
        assert_eq!(g.decide(Membership::Registered, true), Action::Nothing);
        assert!(g.settled());
    }

    #[test]
    fn a_restarted_protokube_on_a_serving_control_plane_leaves_it_in() {
        let mut g = gate_after(&[true]);
        assert_eq!(g.decide(Membership::Registered, true), Action::Nothing);
        g.observe(true);
        assert_eq!(g.decide(Membership::Registered, true), Action::Nothing);
        assert!(g.settled());
    }

    #[test]
    fn a_failing_answer_unsettles_so_the_next_checks_come_fast() {
        let mut g = gate_after(&[true, true]);
        assert_eq!(g.decide(Membership::Registered, true), Action::Nothing);
        assert!(g.settled());
        g.observe(false);
        assert!(g.ready(), "one failure is not yet not-ready");
        assert!(!g.settled(), "but the next check comes fast");
        g.observe(true);
        assert!(g.settled());
    }

    #[test]
    fn not_ready_and_absent_waits() {
        let mut g = gate_after(&[false, false, true]);
        assert_eq!(g.decide(Membership::Absent, true), Action::Nothing);
        assert!(!g.settled());
    }

    #[test]
    fn a_ready_server_that_fails_leaves_only_while_another_target_is_healthy() {
        let mut g = gate_after(&[true, true]);
        assert_eq!(g.decide(Membership::Registered, true), Action::Nothing);
        g.observe(false);
        g.observe(false);
        assert_eq!(g.decide(Membership::Registered, true), Action::Nothing, "two failures are not {FAIL_AFTER}");
        g.observe(false);
        assert_eq!(g.decide(Membership::Registered, false), Action::Nothing, "no other healthy target: fail open");
        assert_eq!(g.decide(Membership::Registered, true), Action::Deregister);
        // Ready again: back in (protokube took it out itself).
        g.observe(true);
        g.observe(true);
        assert_eq!(g.decide(Membership::Draining, true), Action::Register);
    }

    #[test]
    fn taken_out_by_someone_else_stays_out() {
        let mut g = gate_after(&[true, true]);
        assert_eq!(g.decide(Membership::Absent, true), Action::Register);
        assert_eq!(g.decide(Membership::Registered, true), Action::Nothing);
        // The rolling update deregisters it before draining the node.
        assert_eq!(g.decide(Membership::Draining, true), Action::Nothing);
        assert!(g.released);
        assert_eq!(g.decide(Membership::Absent, true), Action::Nothing);
        assert_eq!(g.decide(Membership::Registered, false), Action::Nothing);
    }

    #[test]
    fn a_failed_action_is_decided_again() {
        let mut g = gate_after(&[true, true]);
        assert_eq!(g.decide(Membership::Absent, true), Action::Register);
        g.failed();
        assert_eq!(g.decide(Membership::Absent, true), Action::Register, "a failed RegisterTargets is not someone else's deregistration");
    }

    #[test]
    fn membership_reads_the_load_balancers_states() {
        let t = |id: &str, state: &str| TargetState { id: id.into(), state: state.into() };
        assert_eq!(Membership::of("i-1", &[t("i-2", "healthy")]), (Membership::Absent, true));
        assert_eq!(Membership::of("i-1", &[t("i-1", "initial"), t("i-2", "unhealthy")]), (Membership::Registered, false));
        assert_eq!(Membership::of("i-1", &[t("i-1", "draining")]), (Membership::Draining, false));
        assert_eq!(Membership::of("i-1", &[t("i-1", "unused")]), (Membership::Absent, false));
    }
}
