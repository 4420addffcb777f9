//! `keelson reconcile cluster` (kOps 1.31's `kops reconcile cluster`): apply a spec and roll the
//! cluster so that no kubelet is ever newer than an API server and the new addons reach the
//! cluster only once every control plane runs the new version.
//!
//! One apply plan ([`cloud_resources::plan_apply`]) is cut into phases by [`phase_of`], a pure
//! function of a change and the cluster's instance groups; the run goes through [`Phase::ALL`] in
//! order, planning again at each apply phase (so every phase is idempotent and a rerun continues
//! where a failed run stopped):
//!
//! 1. control plane: apply — everything cluster-wide plus the control-plane, API-server and bastion
//!    groups (their launch templates, autoscaling groups, `igconfig/…` and `instancegroup/…`);
//! 2. control plane: rolling update of those roles ([`crate::rolling::roll`], the same machinery
//!    and options as `rolling-update`);
//! 3. nodes: apply — the worker groups' launch templates, autoscaling groups and state files;
//! 4. nodes: rolling update of the worker groups;
//! 5. prune — whatever apply deletes (a removed group, rules and groups no longer wanted);
//! 6. addons — the addon manifests, then `addons/bootstrap-channel.yaml` last.

use std::collections::BTreeMap;

use base::StateStore;
use cloud_resources::aws::AwsTarget;
use cloud_resources::model::ClusterModel;
use cloud_resources::plan::{Action, Change, Kind, Plan};
use cloud_resources::{ApplyError, AwsPlan};
use keelson_api::addons::ADDON_CHANNEL;
use keelson_api::Role;

use crate::instances::{self, GroupStatus};
use crate::rolling::{self, RollingError, RollingOptions};

/// The phases of a reconcile, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    ControlPlaneApply,
    ControlPlaneRoll,
    NodesApply,
    NodesRoll,
    Prune,
    Addons,
}

impl Phase {
    pub const ALL: [Phase; 6] = [Phase::ControlPlaneApply, Phase::ControlPlaneRoll, Phase::NodesApply, Phase::NodesRoll, Phase::Prune, Phase::Addons];

    /// 1-based position in [`Phase::ALL`].
    pub fn number(self) -> usize {
        Phase::ALL.iter().position(|p| *p == self).map_or(0, |i| i + 1)
    }

    pub fn title(self) -> &'static str {
        match self {
            Phase::ControlPlaneApply => "control plane: apply",
            Phase::ControlPlaneRoll => "control plane: rolling update",
            Phase::NodesApply => "nodes: apply",
            Phase::NodesRoll => "nodes: rolling update",
            Phase::Prune => "prune",
            Phase::Addons => "addons",
        }
    }

    /// The roles a rolling-update phase replaces (empty for the others).
    pub fn roles(self) -> &'static [Role] {
        match self {
            Phase::ControlPlaneRoll => &[Role::Bastion, Role::ControlPlane, Role::ApiServer],
            Phase::NodesRoll => &[Role::Node],
            _ => &[],
        }
    }

    pub fn is_roll(self) -> bool {
        !self.roles().is_empty()
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "phase {}/{} ({})", self.number(), Phase::ALL.len(), self.title())
    }
}

/// Whether a group of `role` goes with the control plane (phases 1–2) or with the workers (3–4).
/// API servers serve the API (they must be new before any kubelet is); bastions run no kubelet.
pub fn with_control_plane(role: Role) -> bool {
    role != Role::Node
}

/// One instance group as the phase planning sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupRef {
    /// Its autoscaling group's name (`<ig>.<cluster>`).
    pub cloud_name: String,
    /// Its launch template's name.
    pub launch_template: String,
    /// The spec's instance-group name.
    pub group: String,
    pub role: Role,
}

/// The model's instance groups.
pub fn groups_of(model: &ClusterModel) -> Vec<GroupRef> {
    model
        .tasks
        .groups
        .iter()
        .map(|g| GroupRef { cloud_name: g.name.clone(), launch_template: g.launch_template.name().to_string(), group: g.group.clone(), role: g.role })
        .collect()
}

/// The instance group a state file belongs to: `igconfig/<role>/<ig>/…` and `instancegroup/<ig>`.
fn state_file_group(rel: &str) -> Option<&str> {
    let mut parts = rel.split('/');
    match parts.next()? {
        "igconfig" => parts.nth(1),
        "instancegroup" => parts.next(),
        _ => None,
    }
}

/// The apply phase a change of the full apply plan belongs to. Deletes wait for the prune; the
/// addon files for the end; a worker group's launch template, autoscaling group and state files
/// for the nodes' phase; everything else (cluster-wide resources, the PKI, the completed spec,
/// the control-plane, API-server and bastion groups) goes first.
pub fn phase_of(change: &Change, groups: &[GroupRef]) -> Phase {
    let wave = |g: Option<&GroupRef>| match g {
        Some(g) if !with_control_plane(g.role) => Phase::NodesApply,
        _ => Phase::ControlPlaneApply,
    };
    let name = change.name.as_str();
    match (change.kind, &change.action) {
        (_, Action::Delete) => Phase::Prune,
        (Kind::StateFile, _) if name.starts_with("addons/") => Phase::Addons,
        (Kind::StateFile, _) => wave(state_file_group(name).and_then(|ig| groups.iter().find(|g| g.group == ig))),
        (Kind::LaunchTemplate, _) => wave(groups.iter().find(|g| g.launch_template == name)),
        (Kind::AutoscalingGroup, _) => wave(groups.iter().find(|g| g.cloud_name == name)),
        _ => Phase::ControlPlaneApply,
    }
}

/// The full apply plan cut into its apply phases (each phase's changes in the plan's order, except
/// that the addon channel comes after every addon manifest it points to); the rolling
/// replacements a phase's launch templates cause go with it, the notes with the first phase.
pub fn partition(plan: &Plan, groups: &[GroupRef]) -> BTreeMap<Phase, Plan> {
    let mut out: BTreeMap<Phase, Plan> = Phase::ALL.iter().filter(|p| !p.is_roll()).map(|p| (*p, Plan::default())).collect();
    for c in &plan.changes {
        out.entry(phase_of(c, groups)).or_default().changes.push(c.clone());
    }
    if let Some(addons) = out.get_mut(&Phase::Addons) {
        addons.changes.sort_by_key(|c| c.name == ADDON_CHANNEL);
    }
    for r in &plan.rolling {
        let phase = wave_of_template(&r.group, groups);
        out.entry(phase).or_default().rolling.push(r.clone());
    }
    out.entry(Phase::ControlPlaneApply).or_default().notes = plan.notes.clone();
    out
}

fn wave_of_template(launch_template: &str, groups: &[GroupRef]) -> Phase {
    match groups.iter().find(|g| g.launch_template == launch_template) {
        Some(g) if !with_control_plane(g.role) => Phase::NodesApply,
        _ => Phase::ControlPlaneApply,
    }
}

/// Why a phase failed.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error(transparent)]
    Apply(#[from] ApplyError),
    #[error(transparent)]
    Roll(#[from] RollingError),
    #[error(transparent)]
    Instances(#[from] instances::InstancesError),
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("{phase} failed: {source}; rerun reconcile to continue (every phase is idempotent)")]
    Phase {
        phase: Phase,
        #[source]
        source: StepError,
    },
}

/// What a phase did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PhaseReport {
    /// Apply phases: the changes made, `Kind name`, in order.
    pub applied: Vec<String>,
    /// Rolling-update phases: (group, terminated instance, its replacement).
    pub replaced: Vec<(String, String, String)>,
}

/// How a reconcile runs: the rolling update's options (its group and role selection are the
/// phases'), and whether plans are rendered in colour.
#[derive(Debug, Clone, Default)]
pub struct ReconcileOptions {
    pub rolling: RollingOptions,
    pub color: bool,
}

/// Run one phase against the cluster as it is now. `log` receives one line per step.
pub async fn run_phase(
    t: &AwsTarget,
    model: &ClusterModel,
    store: &StateStore,
    phase: Phase,
    opts: &ReconcileOptions,
    log: &mut (dyn FnMut(&str) + Send),
) -> Result<PhaseReport, ReconcileError> {
    let fail = |source: StepError| ReconcileError::Phase { phase, source };
    log(&format!("== {phase}"));
    if phase.is_roll() {
        let rolling = RollingOptions { groups: Vec::new(), roles: phase.roles().to_vec(), ..opts.rolling.clone() };
        let report = Box::pin(rolling::roll(t, model, &rolling, log)).await.map_err(|e| fail(e.into()))?;
        if report.replaced.is_empty() {
            log("No rolling update required.");
        }
        return Ok(PhaseReport { replaced: report.replaced, ..Default::default() });
    }
    let planned = Box::pin(cloud_resources::plan_apply(t, model, store)).await.map_err(|e| fail(e.into()))?;
    let plan = partition(&planned.plan, &groups_of(model)).remove(&phase).unwrap_or_default();
    for line in plan.render(opts.color).lines() {
        log(line);
    }
    let applied: Vec<String> = plan.changes.iter().map(|c| format!("{} {}", c.kind.as_str(), c.name)).collect();
    if !plan.is_empty() {
        let mut sub = AwsPlan { plan, resolved: planned.resolved, discovered: planned.discovered };
        Box::pin(cloud_resources::execute(t, model, store, &mut sub)).await.map_err(|e| fail(e.into()))?;
        log(&format!("applied {} change(s)", applied.len()));
    }
    Ok(PhaseReport { applied, ..Default::default() })
}

/// Run every phase in order; stops at the first failure, naming its phase.
pub async fn reconcile(
    t: &AwsTarget,
    model: &ClusterModel,
    store: &StateStore,
    opts: &ReconcileOptions,
    log: &mut (dyn FnMut(&str) + Send),
) -> Result<BTreeMap<Phase, PhaseReport>, ReconcileError> {
    let mut out = BTreeMap::new();
    for phase in Phase::ALL {
        let started = std::time::Instant::now();
        out.insert(phase, Box::pin(run_phase(t, model, store, phase, opts, log)).await?);
        log(&format!("{phase}: done in {:.1} s", started.elapsed().as_secs_f64()));
    }
    Ok(out)
}

/// What a phase would do, without `--yes`.
#[derive(Debug, Clone)]
pub enum PhasePlan {
    Apply(Plan),
    /// The groups of the phase's roles, their instances outdated as they will be once the earlier
    /// phases have applied their launch templates.
    Roll(Vec<GroupStatus>),
}

/// Mark as outdated the instances an apply will leave on an old launch-template version.
pub fn outdated_after_apply(groups: &mut [GroupStatus], plan: &Plan, refs: &[GroupRef]) {
    for r in &plan.rolling {
        let Some(cloud) = refs.iter().find(|g| g.launch_template == r.group).map(|g| g.cloud_name.as_str()) else { continue };
        for g in groups.iter_mut().filter(|g| g.name == cloud) {
            for i in g.instances.iter_mut().filter(|i| r.instances.contains(&i.id)) {
                i.outdated = true;
            }
        }
    }
}

/// Every phase's plan (reads only): the apply phases' changes and the groups each rolling update
/// would replace, as the cloud reports them (Nodes annotated `needs-update` are not counted).
pub async fn plan(t: &AwsTarget, model: &ClusterModel, store: &StateStore, opts: &RollingOptions) -> Result<Vec<(Phase, PhasePlan)>, ReconcileError> {
    let phase_err = |phase: Phase| move |source: StepError| ReconcileError::Phase { phase, source };
    let planned = Box::pin(cloud_resources::plan_apply(t, model, store)).await.map_err(|e| phase_err(Phase::ControlPlaneApply)(e.into()))?;
    let refs = groups_of(model);
    let mut parts = partition(&planned.plan, &refs);
    let mut out = Vec::new();
    for phase in Phase::ALL {
        if phase.is_roll() {
            let selection = instances::Selection { roles: phase.roles().to_vec(), force: opts.force, groups: Vec::new() };
            let mut groups = Box::pin(instances::status(t, model, &selection)).await.map_err(|e| phase_err(phase)(e.into()))?;
            outdated_after_apply(&mut groups, &planned.plan, &refs);
            out.push((phase, PhasePlan::Roll(groups)));
        } else {
            out.push((phase, PhasePlan::Apply(parts.remove(&phase).unwrap_or_default())));
        }
    }
    Ok(out)
}

/// A plan as text: per phase its title, then the apply plan or the rolling-update table.
pub fn render_plan(phases: &[(Phase, PhasePlan)], color: bool) -> String {
    let mut out = String::new();
    for (phase, p) in phases {
        out.push_str(&format!("== {phase}\n"));
        match p {
            PhasePlan::Apply(plan) => out.push_str(&plan.render(color)),
            PhasePlan::Roll(groups) if groups.is_empty() => out.push_str("No instance groups of these roles.\n"),
            PhasePlan::Roll(groups) => {
                out.push_str(&instances::render(groups));
                let n: usize = groups.iter().map(|g| g.outdated().len()).sum();
                out.push_str(&if n == 0 { "No rolling update required.\n".to_string() } else { format!("{n} instance(s) to replace.\n") });
            }
        }
    }
    out
}

/// Whether a plan has nothing to do.
pub fn plan_is_empty(phases: &[(Phase, PhasePlan)]) -> bool {
    phases.iter().all(|(_, p)| match p {
        PhasePlan::Apply(plan) => plan.is_empty(),
        PhasePlan::Roll(groups) => groups.iter().all(|g| g.outdated().is_empty()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cloud_resources::plan::{Resource, Rolling};

    fn refs() -> Vec<GroupRef> {
        let g = |group: &str, role| GroupRef { cloud_name: format!("{group}.c"), launch_template: format!("{group}.c"), group: group.into(), role };
        vec![g("cp-a", Role::ControlPlane), g("api", Role::ApiServer), g("bastions", Role::Bastion), g("nodes", Role::Node), g("gpu", Role::Node)]
    }

    fn change(kind: Kind, name: &str, action: Action) -> Change {
        Change { kind, name: name.into(), action, desired: Some(Resource::new(kind, name)), actual: None }
    }
    fn update(kind: Kind, name: &str) -> Change {
        change(kind, name, Action::Update(Vec::new()))
    }

    #[test]
    fn phases_run_in_kops_order_and_name_themselves() {
        let titles: Vec<String> = Phase::ALL.iter().map(|p| p.to_string()).collect();
        assert_eq!(
            titles,
            [
                "phase 1/6 (control plane: apply)",
                "phase 2/6 (control plane: rolling update)",
                "phase 3/6 (nodes: apply)",
                "phase 4/6 (nodes: rolling update)",
                "phase 5/6 (prune)",
                "phase 6/6 (addons)"
            ]
        );
        assert_eq!(Phase::ControlPlaneRoll.roles(), [Role::Bastion, Role::ControlPlane, Role::ApiServer]);
        assert_eq!(Phase::NodesRoll.roles(), [Role::Node]);
        assert!(Phase::ALL.iter().filter(|p| p.is_roll()).count() == 2 && !Phase::Prune.is_roll());
        // Every role rolls in exactly one phase.
        for role in [Role::Bastion, Role::ControlPlane, Role::ApiServer, Role::Node] {
            assert_eq!(Phase::ALL.iter().filter(|p| p.roles().contains(&role)).count(), 1, "{role:?}");
        }
    }

    #[test]
    fn each_change_goes_to_its_phase() {
        let refs = refs();
        let cases = [
            // Cluster-wide: first.
            (update(Kind::StateFile, "cluster-completed.spec"), Phase::ControlPlaneApply),
            (change(Kind::Keyset, "pki", Action::Create), Phase::ControlPlaneApply),
            (update(Kind::IamRole, "nodes.c"), Phase::ControlPlaneApply),
            (change(Kind::SecurityGroupRule, "from-nodes", Action::Create), Phase::ControlPlaneApply),
            (update(Kind::LoadBalancer, "api-c"), Phase::ControlPlaneApply),
            (update(Kind::DnsRecord, "api.c"), Phase::ControlPlaneApply),
            (update(Kind::Volume, "a.etcd-main.c"), Phase::ControlPlaneApply),
            // Control planes, API servers, bastions: first.
            (update(Kind::LaunchTemplate, "cp-a.c"), Phase::ControlPlaneApply),
            (update(Kind::AutoscalingGroup, "cp-a.c"), Phase::ControlPlaneApply),
            (update(Kind::StateFile, "igconfig/control-plane/cp-a/nodeupconfig.yaml"), Phase::ControlPlaneApply),
            (update(Kind::StateFile, "instancegroup/cp-a"), Phase::ControlPlaneApply),
            (update(Kind::LaunchTemplate, "api.c"), Phase::ControlPlaneApply),
            (update(Kind::StateFile, "igconfig/apiserver/api/nodeupconfig.yaml"), Phase::ControlPlaneApply),
            (update(Kind::LaunchTemplate, "bastions.c"), Phase::ControlPlaneApply),
            (update(Kind::StateFile, "instancegroup/bastions"), Phase::ControlPlaneApply),
            // Workers: their own phase, state files with their templates.
            (update(Kind::LaunchTemplate, "nodes.c"), Phase::NodesApply),
            (update(Kind::AutoscalingGroup, "nodes.c"), Phase::NodesApply),
            (change(Kind::LaunchTemplate, "gpu.c", Action::Create), Phase::NodesApply),
            (change(Kind::AutoscalingGroup, "gpu.c", Action::Create), Phase::NodesApply),
            (update(Kind::StateFile, "igconfig/node/nodes/nodeupconfig.yaml"), Phase::NodesApply),
            (change(Kind::StateFile, "instancegroup/gpu", Action::Create), Phase::NodesApply),
            // Deletes of any kind: the prune.
            (change(Kind::AutoscalingGroup, "old-nodes.c", Action::Delete), Phase::Prune),
            (change(Kind::LaunchTemplate, "cp-a.c", Action::Delete), Phase::Prune),
            (change(Kind::SecurityGroupRule, "gone", Action::Delete), Phase::Prune),
            (change(Kind::LoadBalancer, "api-c", Action::Delete), Phase::Prune),
            // Addons: last.
            (update(Kind::StateFile, "addons/bootstrap-channel.yaml"), Phase::Addons),
            (update(Kind::StateFile, "addons/aws-cloud-controller.addons.k8s.io/v1.0.0.yaml"), Phase::Addons),
            // A group the model does not know (not possible from one plan): with the control plane.
            (update(Kind::LaunchTemplate, "unknown.c"), Phase::ControlPlaneApply),
        ];
        for (c, want) in &cases {
            assert_eq!(phase_of(c, &refs), *want, "{:?} {} ({:?})", c.kind, c.name, c.action);
        }
    }

    #[test]
    fn a_plan_is_cut_without_losing_a_change_and_the_channel_lands_last() {
        let refs = refs();
        let plan = Plan {
            changes: vec![
                update(Kind::StateFile, "addons/a.keelson.io/v1.0.0.yaml"),
                update(Kind::StateFile, "addons/bootstrap-channel.yaml"),
                update(Kind::StateFile, "addons/bootstrap-rbac.keelson.io/v1.0.0.yaml"),
                update(Kind::StateFile, "cluster-completed.spec"),
                update(Kind::StateFile, "igconfig/node/nodes/nodeupconfig.yaml"),
                update(Kind::LaunchTemplate, "cp-a.c"),
                update(Kind::LaunchTemplate, "nodes.c"),
                update(Kind::AutoscalingGroup, "cp-a.c"),
                update(Kind::AutoscalingGroup, "nodes.c"),
                change(Kind::SecurityGroupRule, "gone", Action::Delete),
            ],
            rolling: vec![
                Rolling { group: "cp-a.c".into(), instances: vec!["i-cp".into()], reason: "new".into() },
                Rolling { group: "nodes.c".into(), instances: vec!["i-n1".into(), "i-n2".into()], reason: "new".into() },
            ],
            notes: vec!["a note".into()],
        };
        let parts = partition(&plan, &refs);
        let names = |p: Phase| parts[&p].changes.iter().map(|c| c.name.as_str()).collect::<Vec<_>>();
        assert_eq!(names(Phase::ControlPlaneApply), ["cluster-completed.spec", "cp-a.c", "cp-a.c"]);
        assert_eq!(names(Phase::NodesApply), ["igconfig/node/nodes/nodeupconfig.yaml", "nodes.c", "nodes.c"]);
        assert_eq!(names(Phase::Prune), ["gone"]);
        assert_eq!(
            names(Phase::Addons),
            ["addons/a.keelson.io/v1.0.0.yaml", "addons/bootstrap-rbac.keelson.io/v1.0.0.yaml", "addons/bootstrap-channel.yaml"],
            "the channel after every manifest it pins"
        );
        assert_eq!(parts.values().map(|p| p.changes.len()).sum::<usize>(), plan.changes.len(), "no change lost or doubled");
        assert!(!parts.contains_key(&Phase::ControlPlaneRoll) && !parts.contains_key(&Phase::NodesRoll), "rolling phases apply nothing");
        assert_eq!(parts[&Phase::ControlPlaneApply].rolling.len(), 1);
        assert_eq!(parts[&Phase::NodesApply].rolling[0].instances, ["i-n1", "i-n2"]);
        assert_eq!(parts[&Phase::ControlPlaneApply].notes, ["a note"]);
        assert!(parts[&Phase::Prune].notes.is_empty());

        // What the rolling phases show in a plan: the instances the templates leave behind.
        let inst = |id: &str| instances::InstanceStatus::for_test(id, "InService", false);
        let status = |g: &GroupRef, ids: &[&str]| GroupStatus {
            name: g.cloud_name.clone(),
            group: g.group.clone(),
            role: g.role,
            target_version: "1".into(),
            min: 1,
            max: 2,
            desired: ids.len() as i32,
            instances: ids.iter().map(|i| inst(i)).collect(),
        };
        let mut groups = vec![status(&refs[0], &["i-cp"]), status(&refs[3], &["i-n1", "i-n2", "i-n3"])];
        outdated_after_apply(&mut groups, &plan, &refs);
        assert_eq!(groups[0].outdated().len(), 1);
        assert_eq!(groups[1].outdated().iter().map(|i| i.id.as_str()).collect::<Vec<_>>(), ["i-n1", "i-n2"]);
        let text = render_plan(&[(Phase::NodesRoll, PhasePlan::Roll(groups.clone())), (Phase::Prune, PhasePlan::Apply(Plan::default()))], false);
        assert!(text.contains("== phase 4/6 (nodes: rolling update)") && text.contains("3 instance(s) to replace.") && text.contains("No changes."), "{text}");
        assert!(!plan_is_empty(&[(Phase::NodesRoll, PhasePlan::Roll(groups))]));
        assert!(plan_is_empty(&[(Phase::Prune, PhasePlan::Apply(Plan::default())), (Phase::NodesRoll, PhasePlan::Roll(Vec::new()))]));
    }
}
