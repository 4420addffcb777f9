//! `chaos`: the faults beyond one control plane at a time. A scenario brings the cluster up when
//! none is running, writes the data (etcd keys and ConfigMaps, as `selfheal` does), runs its fault,
//! waits for the cluster to heal by itself — no step of anyone's — and ends with one line:
//! `chaos NAME: healed in X s, K/K keys intact, C/C ConfigMaps intact, validate valid` (or what
//! failed).
//!
//! Scenarios so far: `two-control-planes` (etcd's quorum lost: two of three control planes
//! terminated at once) and `all-control-planes` (every control plane at once): each replacement
//! must claim its member's surviving volumes and etcd come back with its data and the same
//! members (by name and id: never re-bootstrapped), the API serve every object again.
//! `lost-volume` (AWS): one control plane terminated and its etcd volumes deleted before anything
//! could claim them; the other two keep quorum, `keelson apply` (the operator's one step, as with
//! kOps, whose etcd-manager creates no volumes either) creates the missing volumes, and protokube on
//! the replacement finds an empty volume, removes its member from the cluster and adds it again
//! (a new member id, the same name and cluster id), and etcd fills it from its peers.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};

use crate::etcd;
use crate::machine::MachineInfo;

use super::commands::{env_exports, state};
use super::health::control_planes;
use super::selfheal::{member_sets, random_index, validate_cluster};
use super::state::ClusterState;

/// A fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// Two of three control planes terminated at once: etcd loses its quorum.
    TwoControlPlanes,
    /// Every control plane terminated at once.
    AllControlPlanes,
    /// One control plane terminated and its etcd volumes deleted (AWS).
    LostVolume,
    /// One control plane cut off from the other two for a while, then let back (AWS).
    Partition,
    /// Every instance of one control plane's zone terminated, and no launch there completing for
    /// `--outage` seconds (AWS).
    ZoneDown,
    /// The state store (S3) unreachable from every machine for `--outage` seconds, a worker
    /// replaced meanwhile (AWS).
    StoreOutage,
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Scenario::TwoControlPlanes => "two-control-planes",
            Scenario::AllControlPlanes => "all-control-planes",
            Scenario::LostVolume => "lost-volume",
            Scenario::Partition => "partition",
            Scenario::ZoneDown => "zone-down",
            Scenario::StoreOutage => "store-outage",
        }
    }

    /// How many of `n` control planes the scenario terminates (None: it needs more).
    pub fn victims(self, n: usize) -> Option<usize> {
        match self {
            Scenario::TwoControlPlanes => (n >= 3).then_some(2),
            Scenario::AllControlPlanes => (n >= 1).then_some(n),
            // Quorum must hold while the member is rebuilt.
            // zone-down: one control plane's zone (and whatever else runs there).
            Scenario::LostVolume | Scenario::Partition | Scenario::ZoneDown => (n >= 3).then_some(1),
            // No control plane: a worker is replaced while the store is out.
            Scenario::StoreOutage => Some(0),
        }
    }
}

/// Per etcd cluster: member name → member id.
type Members = BTreeMap<String, BTreeMap<String, String>>;

/// [`member_sets`]' `name/id` lists as [`Members`].
fn by_name(sets: &BTreeMap<String, Vec<String>>) -> Members {
    sets.iter()
        .map(|(c, l)| (c.clone(), l.iter().map(|m| m.split_once('/').map_or((m.clone(), String::new()), |(n, i)| (n.to_string(), i.to_string()))).collect()))
        .collect()
}

/// What is wrong with the members `now` against those before the fault: the same names in every
/// etcd cluster; the same id for each, except the members in `rebuilt` (cluster → member name),
/// which must have been removed and added again (another id). `None`: as it should be.
fn membership_problem(before: &Members, now: &Members, rebuilt: &BTreeMap<String, String>) -> Option<String> {
    for (cluster, members) in before {
        let Some(have) = now.get(cluster) else { return Some(format!("etcd {cluster}: no members listed")) };
        let (want_names, have_names): (Vec<&String>, Vec<&String>) = (members.keys().collect(), have.keys().collect());
        if want_names != have_names {
            return Some(format!("etcd {cluster}: members {have_names:?}, want {want_names:?}"));
        }
        for (name, id) in members {
            let again = rebuilt.get(cluster) == Some(name);
            match (again, have.get(name) == Some(id)) {
                (true, true) => return Some(format!("etcd {cluster}: member {name} not re-added yet (id {id})")),
                (false, false) => return Some(format!("etcd {cluster}: member {name} has id {:?}, was {id}", have.get(name))),
                _ => {}
            }
        }
    }
    None
}

pub struct ChaosOptions {
    pub boot: super::Boot,
    /// etcd keys and ConfigMaps written before the fault.
    pub keys: u64,
    /// How long the cluster may take to heal.
    pub timeout: Duration,
    pub up_timeout: Duration,
    /// How long `keelson validate cluster` may wait once healed.
    pub validate_wait: Duration,
    /// Leave a cluster this command brought up running at the end.
    pub keep_up: bool,
    /// zone-down: how long the zone stays down.
    pub outage: Duration,
    /// zone-down: the zone (a control plane's); else one picked at random.
    pub zone: Option<String>,
    /// store-outage: how the store fails.
    pub store_failure: crate::relay::Outage,
}

pub struct ChaosReport {
    pub scenario: Scenario,
    /// Seconds from the fault to healed, when it healed.
    pub healed: Option<f64>,
    pub keys: u64,
    /// ConfigMaps written (before the fault, and during it when the cluster still takes writes).
    pub objects: u64,
    /// The fewest keys any member holds afterwards.
    pub intact: u64,
    pub objects_intact: u64,
    pub validated: bool,
}

impl ChaosReport {
    pub fn ok(&self) -> bool {
        self.healed.is_some() && self.intact == self.keys && self.objects_intact == self.objects && self.validated
    }

    /// The scenario's one line.
    pub fn line(&self, failure: &str) -> String {
        let (name, k, c) = (self.scenario.name(), self.keys, self.objects);
        match self.healed {
            Some(s) => format!(
                "chaos {name}: healed in {s:.1} s, {}/{k} keys intact, {}/{c} ConfigMaps intact, validate {}",
                self.intact,
                self.objects_intact,
                if self.validated { "valid" } else { "NOT valid" }
            ),
            None => format!("chaos {name}: NOT healed: {failure}; {}/{k} keys, {}/{c} ConfigMaps readable", self.intact, self.objects_intact),
        }
    }
}

/// Where the scenario's data goes: its own key prefix and ConfigMap name prefix.
fn prefixes(s: Scenario) -> (String, String) {
    (format!("/keelson-local/chaos/{}/", s.name()), format!("keelson-chaos-{}", s.name()))
}

pub fn chaos(spec_path: &std::path::Path, scenario: Scenario, opts: &ChaosOptions) -> anyhow::Result<ChaosReport> {
    struct Down;
    impl Drop for Down {
        fn drop(&mut self) {
            if let Err(e) = super::commands::down() {
                eprintln!("keelson-local: down failed: {e:#}");
            }
        }
    }
    let st = state();
    let load = || ClusterState::load(&st).ok_or_else(|| anyhow!("cluster state vanished"));
    let _down = if ClusterState::load(&st).is_some() {
        println!("chaos: using the running cluster");
        None
    } else {
        super::commands::up_with(spec_path, opts.up_timeout, opts.boot)?;
        // Not `then_some(Down)`: that would make the guard, and drop it (running `down`), either way.
        if opts.keep_up {
            None
        } else {
            Some(Down)
        }
    };
    let cs = load()?;
    let kubeconfig = std::path::PathBuf::from(&cs.kubeconfig);
    let mut cps = control_planes(&cs);
    let Some(kills) = scenario.victims(cps.len()) else {
        bail!("chaos {}: the cluster has {} control planes, too few for it", scenario.name(), cps.len());
    };
    let main = cs.etcd_clusters.first().cloned().ok_or_else(|| anyhow!("the spec has no etcd clusters"))?;
    let first = cps.first().ok_or_else(|| anyhow!("no control plane"))?.clone();
    let (key_prefix, object_prefix) = prefixes(scenario);
    let keys = opts.keys;
    let ep = etcd::endpoint(&first.root, &main).ok_or_else(|| anyhow!("no etcd-{main} manifest on {}", first.instance_id))?;
    etcd::write_keys(first.init_pid.unwrap_or(0), &first.root, &ep, &key_prefix, keys).map_err(|e| anyhow!("writing {keys} keys: {e}"))?;
    let namespace = super::selfheal::OBJECT_NAMESPACE;
    if crate::kubeapi::count_configmaps(&kubeconfig, namespace, &object_prefix, keys).unwrap_or(0) != keys {
        crate::kubeapi::create_configmaps(&kubeconfig, namespace, &object_prefix, keys).map_err(|e| anyhow!("creating {keys} ConfigMaps: {e}"))?;
    }
    let baseline = member_sets(&cs, &first).ok_or_else(|| anyhow!("cannot list etcd members"))?;
    let cluster_ids = cluster_ids(&cs, &first).ok_or_else(|| anyhow!("cannot read the etcd cluster ids"))?;
    println!("chaos: wrote {keys} keys to etcd {main} and {keys} ConfigMaps; members {baseline:?}, cluster ids {cluster_ids:?}");
    let baseline = by_name(&baseline);
    if matches!(scenario, Scenario::LostVolume | Scenario::Partition | Scenario::ZoneDown | Scenario::StoreOutage) && cs.is_gce() {
        bail!("chaos {} runs on AWS only (its GCE form is not written)", scenario.name());
    }

    // The fault: `kills` control planes, picked at random, terminated back to back.
    let mut victims: Vec<MachineInfo> = Vec::new();
    for _ in 0..kills {
        let pick = match (&opts.zone, scenario) {
            (Some(z), Scenario::ZoneDown) => cps.iter().position(|m| &m.zone == z).ok_or_else(|| anyhow!("zone-down: no control plane in {z}"))?,
            _ => random_index(cps.len()),
        };
        victims.push(cps.remove(pick));
    }
    // lost-volume: the victim's etcd volumes and its members, before the fault.
    let cloud = (!cs.is_gce()).then(|| crate::cloud::Cloud::new(&cs.endpoint(), &cs.region));
    let (mut lost, mut rebuilt) = (Vec::new(), BTreeMap::new());
    if scenario == Scenario::LostVolume {
        let (Some(cloud), Some(v)) = (&cloud, victims.first()) else { bail!("lost-volume: no victim") };
        lost = cloud
            .volumes()?
            .into_iter()
            .filter(|vol| vol.attachments.iter().any(|a| a.instance_id == v.instance_id) && vol.tags.iter().any(|(k, _)| k.starts_with(ETCD_VOLUME_TAG)))
            .map(|vol| vol.id)
            .collect();
        for c in &cs.etcd_clusters {
            let ep = etcd::endpoint(&v.root, c).ok_or_else(|| anyhow!("no etcd-{c} manifest on {}", v.instance_id))?;
            rebuilt.insert(c.clone(), ep.member);
        }
        if lost.len() != cs.etcd_clusters.len() {
            bail!("lost-volume: {} holds etcd volumes {lost:?}, want one per etcd cluster ({:?})", v.instance_id, cs.etcd_clusters);
        }
    }
    // partition: the victim is cut off, not replaced; the writes that go on meanwhile are checked too.
    let (mut during, mut cut_off, mut backup) = (0, None, None);
    if scenario == Scenario::Partition {
        let (Some(cloud), Some(v)) = (&cloud, victims.pop()) else { bail!("partition: no victim") };
        during = cut_off_a_while(&kubeconfig, cloud, &v, &cps, &main, &key_prefix, &object_prefix, opts.timeout)?;
        cut_off = Some(v);
    }
    // store-outage: S3 goes away for every machine; a worker is replaced meanwhile.
    if scenario == Scenario::StoreOutage {
        let t = Instant::now();
        let pending;
        (during, pending) = store_out_a_while(&st, &cs, &kubeconfig, &cps, &main, &key_prefix, &object_prefix, opts)?;
        backup = Some(pending);
        println!("chaos store-outage: the store is back after {:.1} s", t.elapsed().as_secs_f64());
    }
    // zone-down: the zone goes down first (no launch there completes), then everything in it dies.
    let mut zone_down = None;
    if scenario == Scenario::ZoneDown {
        let zone = victims.first().map(|v| v.zone.clone()).unwrap_or_default();
        let first = victims.first().map(|v| v.instance_id.clone()).unwrap_or_default();
        victims.extend(cs.machines.iter().filter(|m| m.zone == zone && m.instance_id != first).cloned());
        let held_before = held_launches(&st, &zone);
        zone_down = Some((FileFlag::set(st.zones_down_file(), &zone)?, zone, held_before));
    }
    let mut t0 = Instant::now();
    for v in &victims {
        super::commands::kill(&v.instance_id)?;
    }
    if !victims.is_empty() {
        let names: Vec<String> = victims.iter().map(|v| format!("{} ({})", v.instance_id, v.group)).collect();
        println!("chaos {}: terminated {} at once", scenario.name(), names.join(", "));
    }
    if let Some((mut down, zone, held_before)) = zone_down {
        // The other zones keep serving writes while it is down.
        let m = cps.first().ok_or_else(|| anyhow!("no control plane outside {zone}"))?;
        during = write_during(&kubeconfig, m, &main, &key_prefix, &object_prefix, Duration::from_secs(120))?;
        let wrote = t0.elapsed().as_secs_f64();
        let until = t0 + opts.outage;
        while Instant::now() < until {
            std::thread::sleep(Duration::from_millis(500));
        }
        let held = held_launches(&st, &zone).saturating_sub(held_before);
        down.clear()?;
        println!(
            "chaos zone-down: {zone} down for {:.0} s: the other zones took {during} keys and {during} ConfigMaps ({wrote:.1} s after the terminations); launches held there: {held}",
            t0.elapsed().as_secs_f64()
        );
        // Healing is timed from the zone's return.
        t0 = Instant::now();
    }
    if let (Some(cloud), false) = (&cloud, lost.is_empty()) {
        delete_volumes(cloud, &victims[0].instance_id, &lost)?;
        println!("chaos lost-volume: deleted its etcd volumes {} ({:.1} s after the termination)", lost.join(", "), t0.elapsed().as_secs_f64());
        let t = Instant::now();
        let created = apply()?;
        println!("chaos lost-volume: keelson apply --yes in {:.1} s: {}", t.elapsed().as_secs_f64(), created.join("; "));
    }

    let want = cs.machines.iter().filter(|m| m.role == "control-plane").count();
    let deadline = t0 + opts.timeout;
    let mut status = String::from("no replacement yet");
    let mut last_said = Instant::now();
    let healed = loop {
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(500));
        if last_said.elapsed() > Duration::from_secs(30) {
            eprintln!("keelson-local: chaos: {:.0} s: {status}", t0.elapsed().as_secs_f64());
            last_said = Instant::now();
        }
        let Ok(cs) = load() else { continue };
        // A replacement is a machine the victims were not: on GCE the group makes it again under
        // the victim's name, so it is told apart by its machine (init process), not its name.
        let live: Vec<MachineInfo> =
            control_planes(&cs).into_iter().filter(|m| !victims.iter().any(|v| v.instance_id == m.instance_id && v.init_pid == m.init_pid)).collect();
        if live.len() < want {
            status = format!("{}/{want} control planes running", live.len());
            continue;
        }
        let mut short = None;
        for m in &live {
            let count = etcd::endpoint(&m.root, &main).and_then(|ep| etcd::count(m.init_pid.unwrap_or(0), &ep, &key_prefix)).unwrap_or(0);
            if count != keys + during {
                short = Some(format!("{}: {count}/{} keys", m.instance_id, keys + during));
                break;
            }
        }
        if let Some(s) = short {
            status = s;
            continue;
        }
        match live.iter().find_map(|m| member_sets(&cs, m)) {
            Some(m) => {
                if let Some(problem) = membership_problem(&baseline, &by_name(&m), &rebuilt) {
                    status = problem;
                    continue;
                }
            }
            None => {
                status = "cannot list members".into();
                continue;
            }
        }
        match live.iter().find_map(|m| self::cluster_ids(&cs, m)) {
            Some(ids) if ids == cluster_ids => {}
            Some(ids) => {
                // Not a state to wait out: etcd was bootstrapped anew.
                status = format!("etcd cluster ids {ids:?}, were {cluster_ids:?}: bootstrapped anew");
                continue;
            }
            None => {
                status = "cannot read the cluster ids".into();
                continue;
            }
        }
        let objects = count_objects(&kubeconfig, &object_prefix, keys, during);
        if objects != keys + during {
            status = format!("{objects}/{} ConfigMaps readable", keys + during);
            continue;
        }
        if scenario == Scenario::StoreOutage {
            // The worker that booted during the outage must have joined.
            let machines = cs.machines.iter().filter(|m| m.init_pid.is_some_and(crate::cmd::alive)).count();
            match crate::kubeapi::nodes(&kubeconfig) {
                Ok(n) if n.values().filter(|n| n.ready).count() >= machines => {}
                Ok(n) => {
                    status = format!("{}/{machines} Nodes Ready", n.values().filter(|n| n.ready).count());
                    continue;
                }
                Err(e) => {
                    status = format!("listing Nodes: {e}");
                    continue;
                }
            }
        }
        if let (Some(v), Some(cloud)) = (&cut_off, &cloud) {
            if let Err(e) = super::partition::rejoined(&kubeconfig, cloud, v) {
                status = e;
                continue;
            }
        }
        break Some(t0.elapsed().as_secs_f64());
    };
    // store-outage: the backup asked for during the outage must be written once the store is back.
    let healed = match (healed, backup) {
        (Some(h), Some(b)) => match b.finish() {
            Ok(line) => {
                println!("chaos store-outage: backups resume: {line}");
                Some(h)
            }
            Err(e) => {
                status = format!("backups did not resume: {e}");
                None
            }
        },
        (h, _) => h,
    };
    // What every member holds now, and the API.
    let cs = load()?;
    let mut intact = u64::MAX;
    for m in control_planes(&cs) {
        if let Some(ep) = etcd::endpoint(&m.root, &main) {
            intact = intact.min(etcd::count(m.init_pid.unwrap_or(0), &ep, &key_prefix).unwrap_or(0));
        }
    }
    let objects_intact = count_objects(&kubeconfig, &object_prefix, keys, during);
    if cut_off.is_some() {
        super::partition::refused_write_absent(&kubeconfig)?;
    }
    let (validated, verdict) = if healed.is_some() { validate_cluster(opts.validate_wait)? } else { (false, "not run".into()) };
    if !validated && healed.is_some() {
        println!("chaos: keelson validate cluster: {verdict}");
    }
    if healed.is_none() {
        eprint!("{}", super::diagnose(&cs));
    }
    let report = ChaosReport {
        scenario,
        healed,
        keys: keys + during,
        objects: keys + during,
        intact: if intact == u64::MAX { 0 } else { intact },
        objects_intact,
        validated,
    };
    println!("{}", report.line(&status));
    Ok(report)
}

/// Keys and ConfigMaps written while the fault lasts (partition, zone-down).
const WRITTEN_DURING: u64 = 100;

/// Write [`WRITTEN_DURING`] keys under `<key_prefix>during/` through `m`'s etcd member and as many
/// ConfigMaps `<object_prefix>-during-<i>` through the load balancer, retrying (both are
/// idempotent) for at most `limit`: the surviving majority may be electing a leader, and the load
/// balancer may still send a connection to a dead API server, for a few seconds.
fn write_during(kubeconfig: &std::path::Path, m: &MachineInfo, main: &str, key_prefix: &str, object_prefix: &str, limit: Duration) -> anyhow::Result<u64> {
    let n = WRITTEN_DURING;
    let deadline = Instant::now() + limit;
    let ep = etcd::endpoint(&m.root, main).ok_or_else(|| anyhow!("no etcd-{main} manifest on {}", m.instance_id))?;
    loop {
        match etcd::write_keys(m.init_pid.unwrap_or(0), &m.root, &ep, &format!("{key_prefix}during/"), n) {
            Ok(()) => break,
            Err(e) if Instant::now() > deadline => bail!("writing {n} keys through {} during the fault: {e}", m.instance_id),
            Err(_) => std::thread::sleep(Duration::from_secs(1)),
        }
    }
    loop {
        match crate::kubeapi::create_configmaps(kubeconfig, super::selfheal::OBJECT_NAMESPACE, &format!("{object_prefix}-during"), n) {
            Ok(()) => break,
            Err(e) if Instant::now() > deadline => bail!("creating {n} ConfigMaps through the load balancer during the fault: {e}"),
            Err(_) => std::thread::sleep(Duration::from_secs(1)),
        }
    }
    Ok(n)
}

/// store-outage: close the machines' S3 relay ([`crate::relay`]) for `opts.outage`, terminate a
/// worker right after (its replacement boots with no store: nodeup must wait and then join),
/// write through the cluster meanwhile, and check that no agent (protokube, the kubelet,
/// containerd) on a machine that lived through it restarted or spun (more than half a core of
/// CPU over the outage), and ask for an etcd backup as an operator does meanwhile (`keelson etcd
/// backup create`, which writes its request to the store and waits): protokube can take it only
/// once the store is back. Returns the keys and ConfigMaps written during it, and the backup.
#[allow(clippy::too_many_arguments)]
fn store_out_a_while(
    st: &crate::paths::State,
    cs: &ClusterState,
    kubeconfig: &std::path::Path,
    cps: &[MachineInfo],
    main: &str,
    key_prefix: &str,
    object_prefix: &str,
    opts: &ChaosOptions,
) -> anyhow::Result<(u64, PendingBackup)> {
    let survivors: Vec<MachineInfo> = cs.machines.iter().filter(|m| m.init_pid.is_some_and(crate::cmd::alive)).cloned().collect();
    let worker = survivors.iter().find(|m| m.role == "node").cloned();
    let before: Vec<AgentState> = survivors.iter().map(agent_state).collect();
    let mode = if opts.store_failure == crate::relay::Outage::Refuse { "refuse" } else { "hang" };
    let mut gate = FileFlag::set(st.store_outage_file(), mode)?;
    // The relay polls its gate file every 200 ms.
    std::thread::sleep(Duration::from_millis(500));
    let t = Instant::now();
    println!("chaos store-outage: S3 {} for every machine for {} s", if mode == "refuse" { "refusing connections" } else { "hanging" }, opts.outage.as_secs());
    if let Some(w) = &worker {
        super::commands::kill(&w.instance_id)?;
        println!("chaos store-outage: terminated worker {} ({}); its replacement boots without the store", w.instance_id, w.group);
    }
    let m = cps.first().ok_or_else(|| anyhow!("no control plane"))?;
    let n = write_during(kubeconfig, m, main, key_prefix, object_prefix, Duration::from_secs(120))?;
    println!("chaos store-outage: the cluster took {n} keys and {n} ConfigMaps {:.1} s into the outage", t.elapsed().as_secs_f64());
    let backup = PendingBackup::ask(main, opts.outage + Duration::from_secs(300))?;
    println!("chaos store-outage: keelson etcd backup create --etcd-cluster {main}: asked {:.1} s into the outage", t.elapsed().as_secs_f64());
    while t.elapsed() < opts.outage {
        std::thread::sleep(Duration::from_millis(500));
    }
    let after: Vec<AgentState> = survivors.iter().filter(|m| Some(&m.instance_id) != worker.as_ref().map(|w| &w.instance_id)).map(agent_state).collect();
    let window = t.elapsed().as_secs_f64();
    gate.clear()?;
    let backup = PendingBackup { back_at: Some(Instant::now()), ..backup };
    let (mut problems, mut cpu) = (Vec::new(), Vec::new());
    for a in &after {
        let Some(b) = before.iter().find(|b| b.instance_id == a.instance_id) else { continue };
        if a.restarts != b.restarts {
            problems.push(format!("{}: restarts {:?} → {:?}", a.instance_id, b.restarts, a.restarts));
        }
        if let (Some(x), Some(y)) = (b.protokube_cpu_s, a.protokube_cpu_s) {
            if y - x > window / 2.0 {
                problems.push(format!("{}: protokube used {:.1} CPU-s in {window:.0} s (spinning)", a.instance_id, y - x));
            }
            cpu.push(format!("{:.1}", y - x));
        }
    }
    if !problems.is_empty() {
        bail!("chaos store-outage: agents misbehaved during the outage: {}", problems.join("; "));
    }
    println!(
        "chaos store-outage: no agent restarted on the {} machines that lived through it; protokube's CPU-s over the {window:.0} s: {}",
        after.len(),
        cpu.join(", ")
    );
    Ok((n, backup))
}

/// `keelson etcd backup create` running on a thread of its own: its output and when it ended.
struct PendingBackup {
    waiting: std::thread::JoinHandle<(std::io::Result<std::process::Output>, Instant)>,
    /// When the store came back.
    back_at: Option<Instant>,
}

impl PendingBackup {
    fn ask(etcd_cluster: &str, timeout: Duration) -> anyhow::Result<PendingBackup> {
        let child = super::selfheal::operator_keelson(&["etcd", "backup", "create"])?
            .args(["--etcd-cluster", etcd_cluster, "--timeout", &format!("{}s", timeout.as_secs())])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| anyhow!("keelson etcd backup create: {e}"))?;
        let waiting = std::thread::spawn(move || {
            let out = child.wait_with_output();
            (out, Instant::now())
        });
        Ok(PendingBackup { waiting, back_at: None })
    }

    /// Wait for the command (bounded by its `--timeout`): what it wrote, and how long after the
    /// store came back it ended — or why it failed.
    fn finish(self) -> Result<String, String> {
        let (out, ended) = self.waiting.join().map_err(|_| "the waiting thread panicked".to_string())?;
        let out = out.map_err(|e| format!("keelson etcd backup create: {e}"))?;
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        if !out.status.success() {
            return Err(format!("keelson etcd backup create failed: {}", text.trim()));
        }
        let after = match self.back_at {
            Some(back) if ended >= back => format!("{:.1} s after the store came back", (ended - back).as_secs_f64()),
            _ => "before the store came back (it should not have been able to)".into(),
        };
        let created = String::from_utf8_lossy(&out.stdout).lines().find(|l| l.starts_with("created backup")).unwrap_or_default().to_string();
        if self.back_at.is_none_or(|back| ended < back) {
            return Err(format!("the backup was written {after}: {created}"));
        }
        Ok(format!("the backup asked for during the outage was written {after}: {created}"))
    }
}

/// An agent's restarts (systemd's `NRestarts` of protokube, the kubelet and containerd) and
/// protokube's CPU time.
#[derive(Debug)]
struct AgentState {
    instance_id: String,
    restarts: Vec<String>,
    protokube_cpu_s: Option<f64>,
}

fn agent_state(m: &MachineInfo) -> AgentState {
    let pid = m.init_pid.unwrap_or(0);
    let show = |unit: &str, prop: &str| {
        crate::machine::exec_in(pid, &["systemctl", "show", "-p", prop, "--value", unit]).map(|s| s.trim().to_string()).unwrap_or_default()
    };
    let restarts = ["protokube", "kubelet", "containerd"].iter().map(|u| format!("{u}={}", show(u, "NRestarts"))).collect();
    // CPUUsageNSec needs CPU accounting; the main process's /proc times do not.
    let main_pid = show("protokube", "MainPID");
    let protokube_cpu_s = main_pid.parse::<u32>().ok().filter(|p| *p > 0).and_then(|p| {
        let stat = crate::machine::exec_in(pid, &["cat", &format!("/proc/{p}/stat")]).ok()?;
        let rest = stat.rsplit_once(')')?.1;
        let f: Vec<&str> = rest.split_whitespace().collect();
        // Fields 14 and 15 (utime, stime) are the 12th and 13th after the command.
        let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
        Some(ticks / 100.0)
    });
    AgentState { instance_id: m.instance_id.clone(), restarts, protokube_cpu_s }
}

/// A flag file of the harness's, removed on [`FileFlag::clear`] or drop.
struct FileFlag {
    file: std::path::PathBuf,
    cleared: bool,
}

impl FileFlag {
    fn set(file: std::path::PathBuf, text: &str) -> anyhow::Result<FileFlag> {
        std::fs::write(&file, format!("{text}\n"))?;
        Ok(FileFlag { file, cleared: false })
    }

    fn clear(&mut self) -> anyhow::Result<()> {
        if !self.cleared {
            match std::fs::remove_file(&self.file) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
            self.cleared = true;
        }
        Ok(())
    }
}

impl Drop for FileFlag {
    fn drop(&mut self) {
        if let Err(e) = self.clear() {
            eprintln!("keelson-local: chaos: {e:#}");
        }
    }
}

/// How many launches the daemon held in `zone` (from its events).
fn held_launches(st: &crate::paths::State, zone: &str) -> usize {
    let held = "held: the zone is down";
    ClusterState::load(st).map(|cs| cs.events.iter().filter(|e| e.contains(&format!("launch in {zone} ")) && e.contains(held)).count()).unwrap_or(0)
}

/// The ConfigMaps written before the fault (`<prefix>-<i>`, `keys`) and during it
/// (`<prefix>-during-<i>`, `during`) that read back.
fn count_objects(kubeconfig: &std::path::Path, prefix: &str, keys: u64, during: u64) -> u64 {
    let ns = super::selfheal::OBJECT_NAMESPACE;
    let before = crate::kubeapi::count_configmaps(kubeconfig, ns, prefix, keys).unwrap_or(0);
    let cut = if during > 0 { crate::kubeapi::count_configmaps(kubeconfig, ns, &format!("{prefix}-during"), during).unwrap_or(0) } else { 0 };
    before + cut
}

/// partition: cut `victim` off from the other control planes, wait until the cluster has isolated
/// it ([`super::partition::watch_isolation`], at most `limit`), write ([`write_during`]) to the
/// majority's etcd and through the load balancer, then heal the cut.
/// Returns how many of each were written.
#[allow(clippy::too_many_arguments)]
fn cut_off_a_while(
    kubeconfig: &std::path::Path,
    cloud: &crate::cloud::Cloud,
    victim: &MachineInfo,
    majority: &[MachineInfo],
    main: &str,
    key_prefix: &str,
    object_prefix: &str,
    limit: Duration,
) -> anyhow::Result<u64> {
    use super::partition::{watch_isolation, Cut};
    let peers: Vec<&MachineInfo> = majority.iter().collect();
    let mut cut = Cut::new(victim, &peers)?;
    let t = Instant::now();
    println!("chaos partition: cut {} ({}) off from {}", victim.instance_id, victim.ip, peers.iter().map(|p| p.ip.as_str()).collect::<Vec<_>>().join(", "));
    let iso = watch_isolation(kubeconfig, cloud, victim, &peers, main, limit);
    println!("{}", iso.line(t.elapsed().as_secs_f64()));
    if !iso.done() {
        cut.heal()?;
        bail!("chaos partition: NOT isolated within {} s: {}", limit.as_secs(), iso.last_status);
    }
    let m = peers.first().ok_or_else(|| anyhow!("no majority"))?;
    let n = write_during(kubeconfig, m, main, key_prefix, object_prefix, Duration::from_secs(60))?;
    let reads = super::partition::stale_reads_refused(kubeconfig, victim, main, &format!("{key_prefix}during/"), n, &format!("{object_prefix}-during-0"));
    cut.heal()?;
    match reads {
        Ok(line) => println!("chaos partition: {line}"),
        Err(e) => bail!("chaos partition: {e}"),
    }
    println!("chaos partition: the majority took {n} keys and {n} ConfigMaps; cut healed after {:.1} s", t.elapsed().as_secs_f64());
    Ok(n)
}

/// The tag prefix of a kOps etcd volume (`k8s.io/etcd/<cluster>`).
const ETCD_VOLUME_TAG: &str = "k8s.io/etcd/";

/// Each etcd cluster's id, as one machine's member sees it.
fn cluster_ids(cs: &ClusterState, m: &MachineInfo) -> Option<BTreeMap<String, String>> {
    let pid = m.init_pid?;
    cs.etcd_clusters.iter().map(|c| Some((c.clone(), etcd::cluster_id(pid, &etcd::endpoint(&m.root, c)?)?))).collect()
}

/// Delete `volumes`, each as soon as EC2 lets it go (it detaches a terminated instance's volumes);
/// an error if the replacement claimed one first or it is not free within a minute.
fn delete_volumes(cloud: &crate::cloud::Cloud, victim: &str, volumes: &[String]) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut left: Vec<&String> = volumes.iter().collect();
    while !left.is_empty() {
        let listed = cloud.volumes()?;
        let mut still = Vec::new();
        for id in left {
            match listed.iter().find(|v| &v.id == id) {
                None => {}
                Some(v) if v.attached_to().is_some() => {
                    let holder = v.attached_to().map(|a| a.instance_id.clone()).unwrap_or_default();
                    if holder != victim {
                        bail!("lost-volume: the replacement {holder} claimed {id} before it could be deleted");
                    }
                    if Instant::now() > deadline {
                        bail!("lost-volume: {id} still attached to {holder} a minute after its termination");
                    }
                    still.push(id);
                }
                Some(_) => match cloud.delete_volume(id) {
                    Ok(()) => {}
                    Err(e) if Instant::now() > deadline => bail!("lost-volume: deleting {id}: {e}"),
                    Err(_) => still.push(id),
                },
            }
        }
        left = still;
        if !left.is_empty() {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    Ok(())
}

/// `keelson apply --yes` against the local cloud (the spec as applied, the harness's
/// environment): what an operator runs once a volume is lost. Returns the lines of its output
/// that name a created resource.
fn apply() -> anyhow::Result<Vec<String>> {
    use anyhow::Context as _;
    let exports = env_exports()?;
    let keelson = crate::mirror::bin_dir().join("keelson");
    let spec_file = state().root.join("spec.yaml");
    let out = std::process::Command::new("sh")
        .args(["-c", r#"eval "$1"; shift; exec "$@""#, "sh", &exports])
        .arg(&keelson)
        .args(["apply", "--yes", "--offline", "-f"])
        .arg(&spec_file)
        .output()
        .with_context(|| format!("running {}", keelson.display()))?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    std::fs::write(state().root.join("chaos-apply.log"), &text)?;
    if !out.status.success() {
        bail!("keelson apply --yes failed:\n{text}");
    }
    Ok(text.lines().filter(|l| l.to_lowercase().contains("volume")).map(|l| l.trim().to_string()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn victims_and_lines() {
        assert_eq!(Scenario::TwoControlPlanes.victims(3), Some(2));
        assert_eq!(Scenario::TwoControlPlanes.victims(1), None);
        assert_eq!(Scenario::AllControlPlanes.victims(3), Some(3));
        assert_eq!(Scenario::LostVolume.victims(3), Some(1));
        assert_eq!(Scenario::LostVolume.victims(1), None, "one member of one cannot be rebuilt from peers");
        assert_eq!(Scenario::Partition.victims(3), Some(1));
        assert_eq!(Scenario::ZoneDown.victims(3), Some(1), "one control plane's zone");
        let r = ChaosReport {
            scenario: Scenario::TwoControlPlanes,
            healed: Some(41.25),
            keys: 1000,
            objects: 1000,
            intact: 1000,
            objects_intact: 1000,
            validated: true,
        };
        assert!(r.ok());
        assert_eq!(r.line(""), "chaos two-control-planes: healed in 41.2 s, 1000/1000 keys intact, 1000/1000 ConfigMaps intact, validate valid");
        let r = ChaosReport { healed: None, intact: 0, objects_intact: 3, validated: false, ..r };
        assert!(!r.ok());
        assert_eq!(
            r.line("1/3 control planes running"),
            "chaos two-control-planes: NOT healed: 1/3 control planes running; 0/1000 keys, 3/1000 ConfigMaps readable"
        );
    }

    #[test]
    fn members_kept_or_rebuilt() {
        let sets = |a: &str, b: &str| -> BTreeMap<String, Vec<String>> {
            [
                ("main".to_string(), vec![format!("a/{a}"), format!("b/{b}"), "c/3".to_string()]),
                ("events".to_string(), vec!["a/9".to_string(), "b/8".to_string(), "c/7".to_string()]),
            ]
            .into()
        };
        let before = by_name(&sets("1", "2"));
        assert_eq!(before["main"]["b"], "2");
        let none = BTreeMap::new();
        assert_eq!(membership_problem(&before, &before, &none), None);
        // A member re-added where none should be.
        assert!(membership_problem(&before, &by_name(&sets("1", "5")), &none).unwrap().contains("member b has id"));
        let rebuilt: BTreeMap<String, String> = [("main".to_string(), "b".to_string())].into();
        assert!(membership_problem(&before, &before, &rebuilt).unwrap().contains("not re-added yet"));
        assert_eq!(membership_problem(&before, &by_name(&sets("1", "5")), &rebuilt), None);
        // A missing member, a foreign one.
        let mut short = by_name(&sets("1", "5"));
        short.get_mut("main").unwrap().remove("b");
        assert!(membership_problem(&before, &short, &rebuilt).unwrap().contains("members"));
        short.get_mut("main").unwrap().insert("x".into(), "4".into());
        assert!(membership_problem(&before, &short, &rebuilt).unwrap().contains("want"));
    }
}
