//! The cloud-neutral group of instances a rolling update drives (kOps' `CloudInstanceGroup` and
//! the cloud's `DetachInstance` / `DeleteInstance` on it): the groups with their instances and
//! which of them need replacing ([`GroupStatus`]), and [`InstanceGroups`], what a cloud does to
//! them. [`crate::rolling::roll`] is the one algorithm over it; AWS's autoscaling groups
//! ([`crate::instances::AwsGroups`]) and GCE's managed instance groups
//! ([`crate::gce_instances::GceGroups`]) are its two implementations.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use cloud_resources::model::ClusterModel;
use keelson_api::Role;

use crate::instances::InstancesError;
use crate::rolling::{RollingError, RollingOptions};
use crate::validate::{Report, ValidateError};

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where a step's log lines go.
pub type Log<'a> = &'a mut (dyn FnMut(&str) + Send);

/// Which groups to look at, and whether every instance counts as outdated.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Only these instance groups (spec names); empty = all.
    pub groups: Vec<String>,
    /// Only groups of these roles; empty = all.
    pub roles: Vec<Role>,
    /// Every instance is outdated (`--force`).
    pub force: bool,
}

/// The lifecycle of an instance a surge took out of its group (on AWS: detached from its
/// autoscaling group); its replacement already runs.
pub const DETACHED: &str = "Detached";

/// One instance of a group as the rolling update sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceStatus {
    pub id: String,
    /// The configuration the instance was launched from (AWS: the launch-template version; GCE:
    /// the instance template; `None`: unknown / another template).
    pub version: Option<String>,
    /// `InService` when it serves (GCE: RUNNING), [`DETACHED`], or the cloud's own word.
    pub lifecycle: String,
    pub healthy: bool,
    /// The private IP (how the instance is matched to its Node, as `validate cluster` does).
    pub private_ip: Option<String>,
    /// The public IP, when it has one.
    pub external_ip: Option<String>,
    /// The machine type it runs as (AWS instance type, GCE machine type), as the cloud reports it.
    pub machine_type: Option<String>,
    /// Its zone.
    pub zone: Option<String>,
    /// The volumes attached to it (AWS volume IDs, GCE disk names), root included.
    pub volumes: Vec<String>,
    /// Needs replacing (kOps' NeedUpdate).
    pub outdated: bool,
}

#[cfg(test)]
impl InstanceStatus {
    /// The tests' instance: healthy, launched from version `1`, nothing else known (change the
    /// rest with struct update syntax).
    pub(crate) fn for_test(id: &str, lifecycle: &str, outdated: bool) -> InstanceStatus {
        InstanceStatus {
            id: id.into(),
            version: Some("1".into()),
            lifecycle: lifecycle.into(),
            healthy: true,
            private_ip: None,
            external_ip: None,
            machine_type: None,
            zone: None,
            volumes: Vec::new(),
            outdated,
        }
    }
}

/// One cloud group (an autoscaling group, a zone's managed instance group) of an instance group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupStatus {
    /// The cloud's name of the group.
    pub name: String,
    /// The spec's instance-group name.
    pub group: String,
    pub role: Role,
    /// The configuration the group launches now (resolved; empty when unknown).
    pub target_version: String,
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

/// Replacement order (kOps'): bastions first (if they go down nothing can be seen), then the
/// control planes one at a time, API servers, nodes; by name within a role.
pub fn role_rank(r: Role) -> u8 {
    match r {
        Role::Bastion => 0,
        Role::ControlPlane => 1,
        Role::ApiServer => 2,
        Role::Node => 3,
    }
}

/// The spec's groups a run looks at, in replacement order: `(cloud name, spec name, role)`.
pub fn select<'a>(groups: impl IntoIterator<Item = (&'a str, &'a str, Role)>, opts: &Selection) -> Result<Vec<(&'a str, &'a str, Role)>, InstancesError> {
    let all: Vec<_> = groups.into_iter().collect();
    for g in &opts.groups {
        if !all.iter().any(|(_, name, _)| name == g) {
            return Err(InstancesError::UnknownGroup(g.clone()));
        }
    }
    let mut wanted: Vec<_> = all
        .into_iter()
        .filter(|(_, name, role)| (opts.groups.is_empty() || opts.groups.iter().any(|g| g == name)) && (opts.roles.is_empty() || opts.roles.contains(role)))
        .collect();
    wanted.sort_by_key(|(cloud, _, role)| (role_rank(*role), cloud.to_string()));
    Ok(wanted)
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

/// kOps' `prioritizeUpdate`: the instances to replace with those a surge already took out of their
/// group (their replacements run) last, the order otherwise kept.
pub fn prioritize(update: &mut [&InstanceStatus]) {
    update.sort_by_key(|i| i.lifecycle == DETACHED);
}

/// What a surge leaves to go without a replacement: the last `surged` of `update` (those an
/// earlier run surged), and the new surge's instances, taken from the end (kOps) up to `max_surge`
/// in all. Returns (already surged, to surge now).
pub fn surplus(update: &[&InstanceStatus], surged: usize, max_surge: usize) -> (Vec<String>, Vec<String>) {
    let n = update.len();
    let surged = surged.min(n);
    let already = update[n - surged..].iter().map(|i| i.id.clone()).collect();
    let want = max_surge.min(n);
    let fresh = if want > surged { update[n - want..n - surged].iter().rev().map(|i| i.id.clone()).collect() } else { Vec::new() };
    (already, fresh)
}

/// The new instance to report as a replacement: in service, healthy, current, not in the group
/// before the roll, and not already reported for another instance.
pub fn pick_replacement<'a>(now: &'a GroupStatus, before: &[String], claimed: &BTreeSet<String>) -> Option<&'a str> {
    now.instances
        .iter()
        .find(|i| !before.contains(&i.id) && !claimed.contains(&i.id) && i.lifecycle == "InService" && i.healthy && !i.outdated)
        .map(|i| i.id.as_str())
}

/// What one cloud does to its groups during a rolling update; the algorithm
/// ([`crate::rolling::roll`]) is the same for every cloud.
pub trait InstanceGroups: Send + Sync {
    /// The selected groups in replacement order with their instances; `outdated` by the cloud's
    /// measure (another configuration than the group's, or `--force`).
    fn status<'a>(&'a self, sel: &'a Selection) -> BoxFuture<'a, Result<Vec<GroupStatus>, RollingError>>;

    /// `keelson validate cluster` once, through this Kubernetes client.
    fn validate<'a>(&'a self, kube: &'a kube::Client) -> BoxFuture<'a, Result<Report, ValidateError>>;

    /// The members that serve the API (control planes and API servers, by the spec's sizes).
    fn api_members(&self) -> i64;

    /// How many of `g`'s outdated instances already have their replacements running (a surge an
    /// interrupted run made).
    fn surged(&self, g: &GroupStatus) -> usize;

    /// Surge: start the replacements of `instances` (outdated ones of `g`) before any goes, and
    /// wait (bounded) until they serve; those instances then go without a replacement.
    fn surge<'a>(&'a self, g: &'a GroupStatus, instances: &'a [String], opts: &'a RollingOptions, log: Log<'a>) -> BoxFuture<'a, Result<(), RollingError>>;

    /// Take the instance out of the group's load balancers and wait out the deregistration
    /// (bounded by `--drain-timeout`).
    fn deregister<'a>(
        &'a self,
        g: &'a GroupStatus,
        instance: &'a InstanceStatus,
        opts: &'a RollingOptions,
        log: Log<'a>,
    ) -> BoxFuture<'a, Result<(), RollingError>>;

    /// Remove the (drained) instance. `surplus`: its replacement already runs, it goes for good;
    /// otherwise the group replaces it, waited for (bounded): returns the replacement (one not in
    /// `claimed`, which it joins), empty for a surplus instance.
    fn replace<'a>(
        &'a self,
        g: &'a GroupStatus,
        instance: &'a InstanceStatus,
        surplus: bool,
        claimed: &'a Mutex<BTreeSet<String>>,
        opts: &'a RollingOptions,
        log: Log<'a>,
    ) -> BoxFuture<'a, Result<String, RollingError>>;
}

/// A cloud target whose groups a rolling update can drive.
pub trait RollingTarget {
    fn instance_groups(&self, model: &ClusterModel) -> Arc<dyn InstanceGroups>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inst(id: &str, lifecycle: &str) -> InstanceStatus {
        InstanceStatus::for_test(id, lifecycle, true)
    }

    #[test]
    fn groups_roll_bastions_first_then_control_planes_api_servers_nodes() {
        let groups = [
            ("nodes-b.c", "nodes-b", Role::Node),
            ("nodes-a.c", "nodes-a", Role::Node),
            ("apiserver.c", "apiserver", Role::ApiServer),
            ("control-plane-b.c", "control-plane-b", Role::ControlPlane),
            ("bastions.c", "bastions", Role::Bastion),
            ("control-plane-a.c", "control-plane-a", Role::ControlPlane),
        ];
        let names = |opts: &Selection| select(groups, opts).expect("select").into_iter().map(|(_, n, _)| n).collect::<Vec<_>>();
        assert_eq!(names(&Selection::default()), ["bastions", "control-plane-a", "control-plane-b", "apiserver", "nodes-a", "nodes-b"]);
        let only = Selection { groups: vec!["nodes-b".into(), "control-plane-b".into()], ..Default::default() };
        assert_eq!(names(&only), ["control-plane-b", "nodes-b"], "--instance-group keeps the order");
        let roles = Selection { roles: vec![Role::Node, Role::Bastion], ..Default::default() };
        assert_eq!(names(&roles), ["bastions", "nodes-a", "nodes-b"]);
        let both = Selection { groups: vec!["nodes-a".into(), "control-plane-a".into()], roles: vec![Role::Node], ..Default::default() };
        assert_eq!(names(&both), ["nodes-a"]);
        let err = select(groups, &Selection { groups: vec!["nope".into()], ..Default::default() }).expect_err("unknown");
        assert!(err.to_string().contains("\"nope\""), "{err}");
    }

    #[test]
    fn surged_instances_go_last_and_a_surge_takes_from_the_end() {
        let (a, b, c, d) = (inst("a", DETACHED), inst("b", "InService"), inst("c", "InService"), inst("d", "InService"));
        let mut update = vec![&a, &b, &c, &d];
        prioritize(&mut update);
        let ids = |v: &[&InstanceStatus]| v.iter().map(|i| i.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&update), ["b", "c", "d", "a"], "attached before detached, order kept");
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        // (already surged, maxSurge) → (already, fresh)
        assert_eq!(surplus(&update, 1, 1), (s(&["a"]), s(&[])), "an interrupted run's surge counts");
        assert_eq!(surplus(&update, 1, 3), (s(&["a"]), s(&["d", "c"])));
        let attached = &update[..3];
        assert_eq!(surplus(attached, 0, 2), (s(&[]), s(&["d", "c"])));
        assert_eq!(surplus(attached, 0, 9), (s(&[]), s(&["d", "c", "b"])), "never more than there is to replace");
        assert_eq!(surplus(&update, 7, 0), (s(&["b", "c", "d", "a"]), s(&[])));
        assert_eq!(surplus(&[], 1, 1), (s(&[]), s(&[])));
    }

    #[test]
    fn each_new_instance_is_reported_for_one_replacement_only() {
        let inst = |id: &str, lifecycle: &str, outdated: bool| InstanceStatus { outdated, ..inst(id, lifecycle) };
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
