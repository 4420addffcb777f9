//! `keelson reconcile cluster` against a real moto server started by the test (127.0.0.1 only): an
//! upgrade (1.34.4 → 1.35.0, a new additional object, a narrower sshAccess) goes through the
//! phases in order — the control plane's launch template first while the workers' stays on its
//! version, the workers only after the control plane is replaced, the prune, the addons last — a
//! failed phase is named and a rerun continues, and a rerun after success changes nothing.

#[path = "../../cloud-resources/tests/moto/mod.rs"]
mod moto;
mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use base::StateStore;
use cloud_resources::aws::AwsTarget;
use keelson_api::addons::ADDON_CHANNEL;
use moto::{apply_once, store, Moto};
use ops::instances::{self, GroupStatus};
use ops::reconcile::{self, Phase, PhasePlan, ReconcileError, ReconcileOptions};
use ops::rolling::{self, BoxFuture, ClusterHealth, RollingOptions};
use support::fast;

const CP: &str = "control-plane-us-east-1a";
const NODES: &str = "nodes-us-east-1a";
const WORKER_CONFIG: &str = "igconfig/node/nodes-us-east-1a/nodeupconfig.yaml";
const CP_CONFIG: &str = "igconfig/control-plane/control-plane-us-east-1a/nodeupconfig.yaml";

/// What the cloud and the state store looked like at one validation of the rolling update.
#[derive(Debug, Clone)]
struct Seen {
    group: String,
    /// The workers' launch-template default version.
    workers_template: i64,
    /// The addon channel is still the one before the reconcile.
    old_channel: bool,
}

/// A cluster that validates (after `fail_at` calls, never again until reset), and records at each
/// validation what the workers' template and the addon channel are.
struct Witness {
    t: AwsTarget,
    store: StateStore,
    workers_template: String,
    channel_before: Vec<u8>,
    seen: Mutex<Vec<Seen>>,
    fail_at: Mutex<Option<usize>>,
}

impl Witness {
    async fn template_version(&self) -> i64 {
        let lt = self.t.ec2.describe_launch_templates().launch_template_names(&self.workers_template).send().await.expect("describe template");
        lt.launch_templates()[0].default_version_number().expect("default version")
    }
}

impl ClusterHealth for Witness {
    fn problems<'a>(&'a self, group: &'a GroupStatus) -> BoxFuture<'a, Result<Vec<String>, String>> {
        Box::pin(async move {
            let workers_template = self.template_version().await;
            let channel = self.store.get(ADDON_CHANNEL).await.expect("read channel").expect("channel");
            let mut seen = self.seen.lock().expect("lock");
            seen.push(Seen { group: group.group.clone(), workers_template, old_channel: channel == self.channel_before });
            if self.fail_at.lock().expect("lock").is_some_and(|n| seen.len() >= n) {
                return Ok(vec![format!("InstanceGroup {}: did not have enough ready nodes", group.group)]);
            }
            Ok(Vec::new())
        })
    }
}

async fn template_version(t: &AwsTarget, name: &str) -> i64 {
    let lt = t.ec2.describe_launch_templates().launch_template_names(name).send().await.expect("describe template");
    lt.launch_templates()[0].default_version_number().expect("default version")
}

fn ids(groups: &[GroupStatus], group: &str) -> Vec<String> {
    groups.iter().find(|g| g.group == group).map(|g| g.instances.iter().map(|i| i.id.clone()).collect()).unwrap_or_default()
}

#[test]
fn reconcile_rolls_control_planes_before_workers_and_publishes_addons_last() {
    moto::run_with_big_stack(scenario)
}

async fn scenario() {
    let moto = Moto::start();
    let ami = moto.fixtures().await;
    let t = moto.target(&[]).await;
    let old = moto::spec(&ami, |t| t);
    let (m1, _) = moto::prepare(&old, &moto::compile_options(), true);
    apply_once(&t, &m1).await.expect("apply");
    let s = store(&t, &m1);
    let get = |rel: &'static str| {
        let s = s.clone();
        async move { s.get(rel).await.expect("read store").unwrap_or_else(|| panic!("{rel} missing")) }
    };
    let (channel_before, worker_config_before, cp_config_before) = (get(ADDON_CHANNEL).await, get(WORKER_CONFIG).await, get(CP_CONFIG).await);
    let lt_of = |group: &str| m1.tasks.groups.iter().find(|g| g.group == group).expect("group").launch_template.name().to_string();
    let (cp_lt, nodes_lt) = (lt_of(CP), lt_of(NODES));
    let before = instances::status(&t, &m1, &Default::default()).await.expect("status");

    // The upgrade: a new Kubernetes minor (new nodeup configs and user-data for every group), an
    // additional object (a new addon and channel), sshAccess narrowed (a rule to prune).
    let new = moto::spec(&ami, |t| {
        t.replace("kubernetesVersion: 1.34.4", "kubernetesVersion: 1.35.0").replace("  sshAccess:\n  - 0.0.0.0/0\n", "  sshAccess:\n  - 10.0.0.0/8\n")
            + "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: reconciled\n  namespace: default\ndata:\n  version: \"1.35.0\"\n"
    });
    let (m2, _) = moto::prepare(&new, &moto::compile_options(), true);
    let witness = Arc::new(Witness {
        t: t.clone(),
        store: s.clone(),
        workers_template: nodes_lt.clone(),
        channel_before: channel_before.clone(),
        seen: Mutex::new(Vec::new()),
        fail_at: Mutex::new(None),
    });
    let opts = ReconcileOptions { rolling: RollingOptions { validate: rolling::Validation::Custom(witness.clone()), ..fast() }, color: false };

    // Without --yes: every phase's plan, and not one write.
    let writes = || cloud_resources::aws::write_calls(&t.counter).values().sum::<u64>();
    let writes_before = writes();
    let phases = reconcile::plan(&t, &m2, &s, &opts.rolling).await.expect("plan");
    assert_eq!(writes(), writes_before, "the plan writes nothing");
    let text = reconcile::render_plan(&phases, false);
    let apply_of = |p: Phase| match &phases.iter().find(|(q, _)| *q == p).expect("phase").1 {
        PhasePlan::Apply(plan) => plan.changes.iter().map(|c| c.name.clone()).collect::<Vec<_>>(),
        PhasePlan::Roll(_) => panic!("{p} applies nothing"),
    };
    assert!(apply_of(Phase::ControlPlaneApply).contains(&cp_lt) && !apply_of(Phase::ControlPlaneApply).contains(&nodes_lt), "{text}");
    assert!(apply_of(Phase::ControlPlaneApply).contains(&CP_CONFIG.to_string()), "{text}");
    assert!(apply_of(Phase::NodesApply).contains(&nodes_lt) && apply_of(Phase::NodesApply).contains(&WORKER_CONFIG.to_string()), "{text}");
    assert_eq!(apply_of(Phase::Addons).last().map(String::as_str), Some(ADDON_CHANNEL), "{text}");
    assert!(!apply_of(Phase::Prune).is_empty(), "the 0.0.0.0/0 SSH rule goes: {text}");
    assert!(text.contains("== phase 2/6 (control plane: rolling update)") && text.contains("== phase 4/6 (nodes: rolling update)"), "{text}");
    assert!(text.contains("1 instance(s) to replace.") && text.contains("2 instance(s) to replace."), "{text}");

    // Phase 1: the control plane's template has a new version, the workers' has not; the worker
    // nodeup config (pinned by hash in the workers' user-data) and the addons are untouched.
    let mut log: Vec<String> = Vec::new();
    let report = reconcile::run_phase(&t, &m2, &s, Phase::ControlPlaneApply, &opts, &mut |l| log.push(l.to_string())).await.expect("phase 1");
    assert!(report.applied.iter().any(|c| c.ends_with(&cp_lt)), "{log:?}");
    assert_eq!((template_version(&t, &cp_lt).await, template_version(&t, &nodes_lt).await), (2, 1), "{log:?}");
    assert_ne!(get(CP_CONFIG).await, cp_config_before, "the control plane's new config");
    assert_eq!(get(WORKER_CONFIG).await, worker_config_before, "the workers' config waits for their phase");
    assert_eq!(get(ADDON_CHANNEL).await, channel_before, "addons wait for the end");
    let status = instances::status(&t, &m2, &Default::default()).await.expect("status");
    let outdated: Vec<usize> = status.iter().map(|g| g.outdated().len()).collect();
    assert_eq!(outdated, [1, 0], "only the control plane is outdated: {}", instances::render(&status));

    // Phase 2 fails after the control plane's replacement does not validate: the run stops naming the
    // phase, and nothing of the workers has been touched.
    *witness.fail_at.lock().expect("lock") = Some(2);
    let failing = ReconcileOptions { rolling: RollingOptions { validation_timeout: Duration::from_secs(1), ..opts.rolling.clone() }, ..opts.clone() };
    let err = reconcile::reconcile(&t, &m2, &s, &failing, &mut |_| {}).await.expect_err("validation fails");
    assert!(matches!(err, ReconcileError::Phase { phase: Phase::ControlPlaneRoll, .. }), "{err}");
    assert!(err.to_string().starts_with("phase 2/6 (control plane: rolling update) failed: validation after replacing"), "{err}");
    assert_eq!(template_version(&t, &nodes_lt).await, 1);
    let mid = instances::status(&t, &m2, &Default::default()).await.expect("status");
    assert_ne!(ids(&mid, CP), ids(&before, CP), "the control plane was replaced");
    assert_eq!(ids(&mid, NODES), ids(&before, NODES), "the workers were not");
    assert_eq!(get(WORKER_CONFIG).await, worker_config_before);

    // The rerun continues: every phase, the workers only after the control plane, addons last.
    *witness.fail_at.lock().expect("lock") = None;
    witness.seen.lock().expect("lock").clear();
    let mut log: Vec<String> = Vec::new();
    let report = reconcile::reconcile(&t, &m2, &s, &opts, &mut |l| log.push(l.to_string())).await.expect("reconcile");
    let phase_lines: Vec<&str> = log.iter().filter(|l| l.starts_with("== ")).map(String::as_str).collect();
    assert_eq!(phase_lines.len(), 6, "{log:?}");
    assert!(report[&Phase::ControlPlaneApply].applied.is_empty() && report[&Phase::ControlPlaneRoll].replaced.is_empty(), "{report:?}");
    let nodes_applied = &report[&Phase::NodesApply].applied;
    assert!(nodes_applied.iter().any(|c| c.ends_with(&nodes_lt)) && nodes_applied.iter().any(|c| c.ends_with(WORKER_CONFIG)), "{report:?}");
    assert_eq!(report[&Phase::NodesRoll].replaced.len(), 2, "{log:?}");
    assert!(report[&Phase::Prune].applied.iter().all(|c| c.starts_with("SecurityGroupRule")) && !report[&Phase::Prune].applied.is_empty(), "{report:?}");
    let addons = &report[&Phase::Addons].applied;
    assert_eq!(addons.last().map(String::as_str), Some(format!("StateFile {ADDON_CHANNEL}").as_str()), "{report:?}");
    assert!(addons.iter().any(|c| c.contains("additional-objects")), "{report:?}");
    for (phase, r) in &report {
        if *phase != Phase::Addons {
            assert!(r.applied.iter().all(|c| !c.contains("addons/")), "{phase} published an addon: {report:?}");
        }
    }
    // While the workers rolled, their template was the new one and the channel still the old one.
    let seen = witness.seen.lock().expect("lock").clone();
    assert!(!seen.is_empty() && seen.iter().all(|w| w.group == NODES && w.workers_template == 2 && w.old_channel), "{seen:?}");
    assert_ne!(get(ADDON_CHANNEL).await, channel_before, "published at the end");
    assert_ne!(get(WORKER_CONFIG).await, worker_config_before);
    let after = instances::status(&t, &m2, &Default::default()).await.expect("status");
    assert!(after.iter().all(|g| g.outdated().is_empty()), "{}", instances::render(&after));
    assert!(ids(&after, NODES).iter().all(|i| !ids(&before, NODES).contains(i)), "{}", instances::render(&after));

    // A rerun after success changes nothing, and neither would apply.
    let writes_before = writes();
    let again = reconcile::reconcile(&t, &m2, &s, &opts, &mut |_| {}).await.expect("rerun");
    assert!(again.values().all(|r| r.applied.is_empty() && r.replaced.is_empty()), "{again:?}");
    assert_eq!(writes(), writes_before, "the rerun wrote nothing");
    assert!(cloud_resources::plan_apply(&t, &m2, &s).await.expect("plan").plan.is_empty());
    assert!(reconcile::plan_is_empty(&reconcile::plan(&t, &m2, &s, &opts.rolling).await.expect("plan")));
}

/// The witness sees what the control plane's rolling update saw: run phase by phase, the workers'
/// template stays on version 1 through every control-plane validation.
#[test]
fn control_planes_roll_while_the_workers_template_is_old() {
    moto::run_with_big_stack(control_plane_phase)
}

async fn control_plane_phase() {
    let moto = Moto::start();
    let ami = moto.fixtures().await;
    let t = moto.target(&[]).await;
    let (m1, _) = moto::prepare(&moto::spec(&ami, |t| t), &moto::compile_options(), true);
    apply_once(&t, &m1).await.expect("apply");
    let s = store(&t, &m1);
    let nodes_lt = m1.tasks.groups.iter().find(|g| g.group == NODES).expect("nodes").launch_template.name().to_string();
    let (m2, _) = moto::prepare(&moto::spec(&ami, |t| t.replace("kubernetesVersion: 1.34.4", "kubernetesVersion: 1.35.0")), &moto::compile_options(), true);
    let witness = Arc::new(Witness {
        t: t.clone(),
        store: s.clone(),
        workers_template: nodes_lt.clone(),
        channel_before: s.get(ADDON_CHANNEL).await.expect("read").expect("channel"),
        seen: Mutex::new(Vec::new()),
        fail_at: Mutex::new(None),
    });
    let opts = ReconcileOptions { rolling: RollingOptions { validate: rolling::Validation::Custom(witness.clone()), ..fast() }, color: false };
    let mut log = Vec::new();
    let report = reconcile::reconcile(&t, &m2, &s, &opts, &mut |l: &str| log.push(l.to_string())).await.expect("reconcile");
    assert_eq!(report[&Phase::ControlPlaneRoll].replaced.len(), 1, "{log:?}");
    assert_eq!(report[&Phase::NodesRoll].replaced.len(), 2, "{log:?}");
    let seen = witness.seen.lock().expect("lock").clone();
    let (cp, nodes): (Vec<Seen>, Vec<Seen>) = seen.into_iter().partition(|w| w.group == CP);
    assert!(!cp.is_empty() && cp.iter().all(|w| w.workers_template == 1), "the workers' template is untouched while control planes roll: {cp:?}");
    assert!(!nodes.is_empty() && nodes.iter().all(|w| w.workers_template == 2), "{nodes:?}");
    // The control plane's replacement came before any worker's.
    let replaced: Vec<&str> = log.iter().filter(|l| l.contains(": replacing ")).map(String::as_str).collect();
    assert_eq!(replaced.len(), 3, "{log:?}");
    assert!(replaced[0].starts_with(CP) && replaced[1..].iter().all(|l| l.starts_with(NODES)), "{replaced:?}");
}
