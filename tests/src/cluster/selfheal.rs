//! `selfheal`: kill a random control plane, time its replacement phase by phase, and check that
//! no etcd key, API object or addon record was lost.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};

use crate::cloud::Cloud;
use crate::cpu_model::CpuModel;
use crate::machine::{self, MachineInfo};
use crate::{cmd, etcd, mirror};

use super::commands::{down, env_exports, state};
use super::cpu;
use super::diagnostics::{diagnose, diagnose_nodes};
use super::health::control_planes;
use super::leadership;
use super::state::ClusterState;

pub const KEY_PREFIX: &str = "/keelson-local/selfheal/";

pub(super) fn random_index(n: usize) -> usize {
    use std::io::Read;
    let mut b = [0u8; 8];
    if let Ok(mut f) = fs::File::open("/dev/urandom") {
        let _ = f.read_exact(&mut b);
    }
    (u64::from_le_bytes(b) % n.max(1) as u64) as usize
}

/// `keelson SUBCOMMAND… -f <the local spec>` as an operator runs it, in `keelson-local env`'s
/// environment; the caller adds the rest of the arguments.
pub(super) fn operator_keelson(subcommand: &[&str]) -> anyhow::Result<Command> {
    let exports = env_exports()?;
    let keelson = mirror::bin_dir().join("keelson");
    let mut c = Command::new("sh");
    c.args(["-c", r#"eval "$1"; shift; exec "$@""#, "sh", &exports]).arg(&keelson).args(subcommand).arg("-f").arg(state().root.join("spec.yaml"));
    Ok(c)
}

/// `keelson validate cluster --wait WAIT` on the local spec, as an operator runs it (in
/// `keelson-local env`): whether it passed, and `valid` or its output.
pub(super) fn validate_cluster(wait: Duration) -> anyhow::Result<(bool, String)> {
    let v = operator_keelson(&["validate", "cluster"])?
        .args(["--wait", &format!("{}s", wait.as_secs())])
        .output()
        .with_context(|| format!("running {}", mirror::bin_dir().join("keelson").display()))?;
    let ok = v.status.success();
    let verdict = if ok { "valid".to_string() } else { format!("NOT valid:\n{}{}", String::from_utf8_lossy(&v.stdout), String::from_utf8_lossy(&v.stderr)) };
    Ok((ok, verdict))
}

/// Member names per etcd cluster, as seen from one machine.
pub(super) fn member_sets(cs: &ClusterState, m: &MachineInfo) -> Option<BTreeMap<String, Vec<String>>> {
    let pid = m.init_pid?;
    let mut out = BTreeMap::new();
    for c in &cs.etcd_clusters {
        let ep = etcd::endpoint(&m.root, c)?;
        // Name and member id: a member that was removed and re-added would keep its name only.
        out.insert(c.clone(), etcd::members(pid, &ep)?.into_iter().map(|(n, id)| format!("{n}/{id}")).collect());
    }
    Some(out)
}

pub struct SelfhealReport {
    pub cycles: u32,
    pub healed: u32,
    pub keys: u64,
    pub intact: u64,
    /// ConfigMaps created through the API before the first kill, and how many read back at the end.
    pub objects: u64,
    pub objects_intact: u64,
    pub failovers: Vec<f64>,
    /// Per healed cycle: seconds from the kill to each of [`PHASES`].
    pub phases: Vec<Vec<f64>>,
    /// `keelson validate cluster` passed after the last cycle.
    pub validated: bool,
    /// Per healed cycle: what its failover cost in CPU.
    pub cpu: Vec<FailoverCpu>,
    /// Per healed cycle: the CPU model the replacement booted under.
    pub models: Vec<CpuModel>,
    /// Per healed cycle: the longest the API was unanswered through its load balancer (s).
    pub outages: Vec<f64>,
    /// Per healed cycle: the image manifests and blobs the new machine fetched from the registry.
    pub fetched: Vec<RegistryFetches>,
    /// AWS: whether the IAM oracle found every call the machines made allowed (checked at the end,
    /// before `down`; `None` on GCE or with `--keep-up`, where `keelson-local iam-check` does it).
    pub iam: Option<bool>,
}

/// What one failover cost in CPU (see [`cpu`]).
pub struct FailoverCpu {
    /// CPU-seconds the new control plane's machine used from its boot to its Node Ready: the
    /// failover's critical path, what it needs whatever the host.
    pub critical_s: f64,
    /// The same by command name, largest first.
    pub critical_by_name: Vec<(String, f64)>,
    /// CPU-seconds the new machine had used when each of [`PHASES`] was seen.
    pub by_phase: Vec<f64>,
    /// CPU-seconds the new control plane's machine used from its boot to the failover's end.
    pub new_machine_s: f64,
    /// The CPU model it booted under.
    pub model: CpuModel,
    /// The share of the host's cores that was busy from the kill to the failover's end.
    pub host_busy: f64,
    pub cores: usize,
}

/// What one machine fetched from the registry (image pulls), read from its access log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegistryFetches {
    pub manifests: usize,
    pub blobs: usize,
}

/// The manifests and blobs the client `ip` fetched, in the registry's access log `log` (one
/// request per line, the client's address first, as the CNCF registry writes it).
pub fn registry_fetches(log: &str, ip: &str) -> RegistryFetches {
    let mut f = RegistryFetches::default();
    for line in log.lines().filter(|l| l.split_whitespace().next() == Some(ip)) {
        let Some(request) = line.split('"').nth(1) else { continue };
        let mut parts = request.split_whitespace();
        let (Some("GET"), Some(path)) = (parts.next(), parts.next()) else { continue };
        if path.starts_with("/v2/") && path.contains("/manifests/") {
            f.manifests += 1;
        } else if path.starts_with("/v2/") && path.contains("/blobs/") {
            f.blobs += 1;
        }
    }
    f
}

/// (min, median, max) of `v`; zeros when empty.
pub fn spread(v: &[f64]) -> (f64, f64, f64) {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if v.is_empty() {
        (0.0, 0.0, 0.0)
    } else {
        (lo, median(v), hi)
    }
}

pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// The phases of a control-plane failover, in order; each is timed from the kill.
pub const PHASES: [&str; 7] = ["instance replaced", "machine up", "nodeup done", "volumes mounted", "etcd healthy", "kube-apiserver ready", "Node Ready"];

/// Namespace and name prefix of the ConfigMaps selfheal writes through the API.
pub const OBJECT_NAMESPACE: &str = "default";
pub const OBJECT_PREFIX: &str = "keelson-selfheal";

/// How far the replacement of `group`'s killed instance has come: the number of [`PHASES`] done.
/// Whether the cloud has made the victim's replacement: another running (or starting) instance
/// in its autoscaling group (AWS), or its instance made again under its name with a new id by
/// its MIG (GCE).
fn replaced(cloud: &Option<Cloud>, cs: &ClusterState, victim: &MachineInfo) -> bool {
    match cloud {
        Some(cloud) => cloud
            .instances()
            .map(|is| is.iter().any(|i| i.group() == victim.group && i.id != victim.instance_id && (i.state == "running" || i.state == "pending")))
            .unwrap_or(false),
        None => {
            let path = format!("/compute/v1/projects/{}/zones/{}/instances/{}", cs.gce_project, victim.zone, victim.name);
            let Ok((200, body)) = crate::gce::cloud::rest(&cs.gce_api, "GET", &path) else { return false };
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            v["id"].as_str().is_some_and(|id| id != victim.instance_id) && matches!(v["status"].as_str(), Some("PROVISIONING" | "STAGING" | "RUNNING"))
        }
    }
}

/// How many workers the control planes' join servers admitted (protokube's
/// `protokube_node_joins_admitted_total`, summed).
fn joins_admitted(cps: &[MachineInfo]) -> u64 {
    cps.iter()
        .filter_map(|m| {
            machine::exec_in(m.init_pid?, &["curl", "-fsS", "-m", "5", &format!("http://127.0.0.1:{}/metrics", keelson_api::ports::PROTOKUBE_METRICS)]).ok()
        })
        .flat_map(|text| {
            text.lines().filter_map(|l| l.strip_prefix("protokube_node_joins_admitted_total ").and_then(|v| v.trim().parse::<f64>().ok())).collect::<Vec<_>>()
        })
        .map(|v| v as u64)
        .sum()
}

/// How many of [`PHASES`] the replacement has done, checking only from phase `from` on: a poll
/// does not ask again what an earlier poll of the same cycle saw done (each check is a process or
/// two inside the machine, and on a busy host every one of them widens the gap between polls, the
/// phases' resolution). The cycle's end checks the new member's keys and members anyway.
fn failover_phase(cloud: &Option<Cloud>, cs: &ClusterState, victim: &MachineInfo, from: usize) -> (usize, Option<MachineInfo>) {
    if from < 1 && !replaced(cloud, cs, victim) {
        return (0, None);
    }
    let Some(new) = cs
        .machines
        .iter()
        .find(|m| m.group == victim.group && m.instance_id != victim.instance_id && m.role == "control-plane" && m.init_pid.is_some_and(cmd::alive))
        .cloned()
    else {
        return (1, None);
    };
    let pid = new.init_pid.unwrap_or(0);
    let done = from >= 3
        || machine::exec_in(pid, &["systemctl", "show", "-p", "ActiveState", "--value", crate::rootfs::USER_DATA_UNIT])
            .map(|s| s.trim() == "active")
            .unwrap_or(false);
    if !done {
        return (2, Some(new));
    }
    if from < 4 {
        let mounts = machine::exec_in(pid, &["findmnt", "-rn", "-o", "TARGET"]).unwrap_or_default();
        if mounts.lines().filter(|l| l.starts_with("/mnt/master-")).count() < cs.etcd_clusters.len() {
            return (3, Some(new));
        }
    }
    if from < 5 {
        for c in &cs.etcd_clusters {
            match etcd::endpoint(&new.root, c) {
                Some(ep) if etcd::healthy_quickly(pid, &ep) => {}
                _ => return (4, Some(new)),
            }
        }
    }
    let kc = Path::new(&cs.kubeconfig);
    let target = crate::kubeapi::Target { server: Some(format!("https://{}", new.ip)), tls_server_name: None };
    // A second at most: an API server still starting must not hold the poll up for 10 s.
    if from < 6 && crate::kubeapi::readyz_within(kc, &target, Duration::from_secs(1)).map(|b| b.trim() != "ok").unwrap_or(true) {
        return (5, Some(new));
    }
    let ready = crate::kubeapi::nodes(kc).map(|n| n.values().any(|n| n.ready && n.internal_ip.as_deref() == Some(new.ip.as_str()))).unwrap_or(false);
    if !ready {
        return (6, Some(new));
    }
    (7, Some(new))
}

/// `HH:MM:SS.mmm` UTC: the kill's moment, to line the phases up with the machines' journals.
fn utc_millis(t: std::time::SystemTime) -> String {
    let ms = t.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
    let day_ms = ms % 86_400_000;
    format!("{:02}:{:02}:{:02}.{:03} UTC", day_ms / 3_600_000, day_ms / 60_000 % 60, day_ms / 1000 % 60, day_ms % 1000)
}

/// Probes `/readyz` through the API load balancer every 250 ms while a cycle runs.
struct ApiProbe {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<(u64, u64, f64)>>,
}

impl ApiProbe {
    fn start(kubeconfig: PathBuf) -> ApiProbe {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let (mut ok, mut failed, mut worst, mut since) = (0u64, 0u64, 0f64, None::<Instant>);
            while !flag.load(Ordering::SeqCst) {
                let t = Instant::now();
                let good = crate::kubeapi::readyz(&kubeconfig, &crate::kubeapi::Target::default()).map(|b| b.trim() == "ok").unwrap_or(false);
                if good {
                    ok += 1;
                    if let Some(s) = since.take() {
                        worst = worst.max(s.elapsed().as_secs_f64());
                    }
                } else {
                    failed += 1;
                    since.get_or_insert(t);
                }
                std::thread::sleep(Duration::from_millis(250).saturating_sub(t.elapsed()));
            }
            if let Some(s) = since {
                worst = worst.max(s.elapsed().as_secs_f64());
            }
            (ok, failed, worst)
        });
        ApiProbe { stop, handle: Some(handle) }
    }

    /// (answered, failed, longest outage in seconds)
    fn finish(mut self) -> (u64, u64, f64) {
        self.stop.store(true, Ordering::SeqCst);
        self.handle.take().and_then(|h| h.join().ok()).unwrap_or((0, 0, 0.0))
    }
}

/// The machine `id` of the current cluster state.
fn cs_of(load: &dyn Fn() -> anyhow::Result<ClusterState>, id: &str) -> Option<MachineInfo> {
    load().ok()?.machines.into_iter().find(|m| m.instance_id == id)
}

/// Wait (bounded) until the machine's protokube completed an addon pass; then its count of addons
/// applied (`protokube_addon_applies_total`).
fn addon_applies_after_pass(m: &Option<MachineInfo>, timeout: Duration) -> Result<u64, String> {
    let m = m.as_ref().ok_or("machine gone")?;
    let deadline = Instant::now() + timeout;
    let metric = |text: &str, name: &str| text.lines().find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok());
    loop {
        let text = machine::exec_in(
            m.init_pid.unwrap_or(0),
            &["curl", "-fsS", "-m", "5", &format!("http://127.0.0.1:{}/metrics", keelson_api::ports::PROTOKUBE_METRICS)],
        )
        .unwrap_or_default();
        if metric(&text, "protokube_addon_passes_total ").unwrap_or(0) >= 1 {
            return metric(&text, "protokube_addon_applies_total ").ok_or_else(|| "no protokube_addon_applies_total".to_string());
        }
        if Instant::now() > deadline {
            return Err(format!("no completed addon pass within {} s", timeout.as_secs()));
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// What `keelson-local selfheal` runs.
#[derive(Debug, Clone, Copy)]
pub struct SelfhealOptions {
    /// How the machines boot (`--baked`, `--air-gapped`).
    pub boot: super::Boot,
    pub cycles: u32,
    /// etcd keys and ConfigMaps written before the first kill.
    pub keys: u64,
    /// How long one cycle may take before it counts as not healed.
    pub cycle_timeout: Duration,
    pub up_timeout: Duration,
    /// How long `keelson validate cluster` may wait after the last cycle.
    pub validate_wait: Duration,
    /// Leave the cluster up at the end.
    pub keep_up: bool,
    /// How the machines share the host's cores ([`crate::cpu_model`]), per cycle.
    pub cpu: SoakCpu,
}

/// `selfheal --cpu-model`: the CPU model of every cycle, or both in turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SoakCpu {
    Shared,
    BootPriority,
    /// Odd cycles shared, even ones boot-priority: both models in the same soak, on the same cluster.
    Both,
}

impl SoakCpu {
    /// The model cycle `n` (from 1) runs under.
    pub fn for_cycle(self, n: u32) -> CpuModel {
        match self {
            SoakCpu::Shared => CpuModel::Shared,
            SoakCpu::BootPriority => CpuModel::BootPriority,
            SoakCpu::Both if n % 2 == 1 => CpuModel::Shared,
            SoakCpu::Both => CpuModel::BootPriority,
        }
    }
}

pub fn selfheal(spec_path: &Path, opts: &SelfhealOptions) -> anyhow::Result<SelfhealReport> {
    let SelfhealOptions { boot, cycles, keys, cycle_timeout, up_timeout, validate_wait, keep_up, cpu: soak_cpu } = *opts;
    struct Down;
    impl Drop for Down {
        fn drop(&mut self) {
            match down() {
                Ok(_) => eprintln!("keelson-local: down: cleaned up"),
                Err(e) => eprintln!("keelson-local: down failed: {e:#}"),
            }
        }
    }
    // The first boot shares the cores plainly (every machine boots at once: a priority for all
    // would be a priority for none); each cycle sets its model before its kill.
    super::commands::up_with(spec_path, up_timeout, boot)?;
    // Not `then_some(Down)`: that makes the guard (and drops it, running `down`) either way.
    let _down = if keep_up { None } else { Some(Down) };
    let st = state();
    let load = || ClusterState::load(&st).ok_or_else(|| anyhow!("cluster state vanished"));
    let cs = load()?;
    let kubeconfig = PathBuf::from(&cs.kubeconfig);
    let cps = control_planes(&cs);
    let workers = cs.machines.iter().filter(|m| m.role == "node").count();
    println!("selfheal: {} of {workers} workers joined by cloud identity (the join servers' admissions)", joins_admitted(&cps));
    let first = cps.first().ok_or_else(|| anyhow!("no control-plane machine"))?;
    let main = cs.etcd_clusters.first().cloned().ok_or_else(|| anyhow!("the spec has no etcd clusters"))?;
    let ep = etcd::endpoint(&first.root, &main).ok_or_else(|| anyhow!("no etcd-{main} manifest on {}", first.instance_id))?;
    etcd::write_keys(first.init_pid.unwrap_or(0), &first.root, &ep, KEY_PREFIX, keys).map_err(|e| anyhow!("writing {keys} keys: {e}"))?;
    let t = Instant::now();
    crate::kubeapi::create_configmaps(&kubeconfig, OBJECT_NAMESPACE, OBJECT_PREFIX, keys).map_err(|e| anyhow!("creating {keys} ConfigMaps: {e}"))?;
    let baseline = member_sets(&cs, first).ok_or_else(|| anyhow!("cannot list etcd members"))?;
    println!(
        "selfheal: wrote {keys} keys to etcd {main} and {keys} ConfigMaps through the API ({:.1} s); members {}",
        t.elapsed().as_secs_f64(),
        baseline.iter().map(|(c, m)| format!("{c}=[{}]", m.join(","))).collect::<Vec<_>>().join(" ")
    );
    let cloud = (!cs.is_gce()).then(|| Cloud::new(&cs.endpoint(), &cs.region));
    let mut report = SelfhealReport {
        cycles: 0,
        healed: 0,
        keys,
        intact: 0,
        objects: keys,
        objects_intact: 0,
        failovers: vec![],
        phases: vec![],
        validated: false,
        cpu: vec![],
        models: vec![],
        outages: vec![],
        fetched: vec![],
        iam: None,
    };
    for n in 1..=cycles {
        report.cycles = n;
        let cs = load()?;
        let cps = control_planes(&cs);
        if cps.is_empty() {
            println!("cycle {n}/{cycles}: FAILED: no live control-plane machine to kill");
            break;
        }
        let victim = cps[random_index(cps.len())].clone();
        let model = soak_cpu.for_cycle(n);
        model.write(&st.cpu_model_file()).with_context(|| st.cpu_model_file().display().to_string())?;
        // The controllers' Leases and the victim's host name, to see how leadership leaves it.
        let victim_host = fs::read_to_string(victim.root.join("etc/hostname")).map(|h| h.trim().to_string()).unwrap_or_default();
        let leases_before = crate::kubeapi::leases(&kubeconfig, leadership::NAMESPACE, leadership::LEASES);
        let probe = ApiProbe::start(kubeconfig.clone());
        let t0 = Instant::now();
        let killed_at = std::time::SystemTime::now();
        let host_at_kill = cpu::host_now();
        super::commands::kill(&victim.instance_id)?;
        let deadline = t0 + cycle_timeout;
        let mut reached: Vec<Option<f64>> = vec![None; PHASES.len()];
        // The new machine's CPU-seconds when each phase was seen (from its boot), and by command
        // at Node Ready: its critical path's CPU.
        let mut cpu_at: Vec<Option<f64>> = vec![None; PHASES.len()];
        let mut critical: Option<(f64, Vec<(String, f64)>)> = None;
        let mut status = String::from("waiting for a replacement instance");
        // A phase is timed when a poll first sees it: the true moment lies up to one poll gap
        // earlier. The longest gap is printed with the cycle, as the phases' resolution.
        let (mut last_poll, mut widest_gap) = (t0, Duration::ZERO);
        let healed = loop {
            if Instant::now() > deadline {
                break None;
            }
            std::thread::sleep(Duration::from_millis(200));
            let Ok(cs) = load() else { continue };
            let seen = reached.iter().take_while(|r| r.is_some()).count();
            let (phase, new) = failover_phase(&cloud, &cs, &victim, seen);
            let polled = Instant::now();
            widest_gap = widest_gap.max(polled - last_poll);
            last_poll = polled;
            let now = t0.elapsed().as_secs_f64();
            for r in reached.iter_mut().take(phase) {
                r.get_or_insert(now);
            }
            if let Some(used) = new.as_ref().and_then(|m| m.init_pid).filter(|_| cpu_at.iter().take(phase).any(Option::is_none)).map(cpu::machine_seconds) {
                for c in cpu_at.iter_mut().take(phase) {
                    c.get_or_insert(used.0);
                }
                if phase == PHASES.len() && critical.is_none() {
                    critical = Some(used);
                }
            }
            let Some(new) = new.filter(|_| phase == PHASES.len()) else {
                status = format!("at \"{}\"", PHASES[phase.min(PHASES.len() - 1)]);
                continue;
            };
            let pid = new.init_pid.unwrap_or(0);
            let ep = etcd::endpoint(&new.root, &main).ok_or_else(|| anyhow!("no etcd-{main} manifest"))?;
            let count = etcd::count(pid, &ep, KEY_PREFIX).unwrap_or(0);
            if count != keys {
                status = format!("{}: {count}/{keys} keys on the new member", new.instance_id);
                continue;
            }
            let objects = crate::kubeapi::count_configmaps(&kubeconfig, OBJECT_NAMESPACE, OBJECT_PREFIX, keys).unwrap_or(0);
            if objects != keys {
                status = format!("{objects}/{keys} ConfigMaps readable");
                continue;
            }
            match member_sets(&cs, &new) {
                Some(m) if m == baseline => break Some((new.instance_id.clone(), count, objects)),
                Some(m) => status = format!("members changed: {m:?} (want {baseline:?})"),
                None => status = "cannot list members".into(),
            }
        };
        // The failover ends here; then the new control plane's addon controller must find every addon
        // recorded and apply nothing (its first pass may come a little later: not part of the failover).
        let healed_secs = t0.elapsed().as_secs_f64();
        // What the failover cost in CPU: the host's busy share since the kill, and the new
        // machine's CPU-seconds since it booted (read now, before the checks below add to it).
        let host_busy = host_at_kill.zip(cpu::host_now()).and_then(|(a, b)| cpu::busy_between(&a, &b).map(|busy| (busy, b.cores)));
        let new_machine = healed.as_ref().and_then(|(new, _, _)| cs_of(&load, new));
        let new_cpu = new_machine.as_ref().and_then(|m| m.init_pid).map(cpu::machine_seconds);
        let fetched = new_machine.as_ref().map(|m| registry_fetches(&std::fs::read_to_string(st.registry_log()).unwrap_or_default(), &m.ip));
        let addons = healed.as_ref().map(|_| addon_applies_after_pass(&new_machine, Duration::from_secs(90)));
        let healed = match (healed, &addons) {
            (Some(h), Some(Ok(0))) => Some(h),
            (Some(_), Some(Ok(n))) => {
                status = format!("the new control plane's addon controller re-applied {n} unchanged addons");
                None
            }
            (Some(_), Some(Err(e))) => {
                status = format!("addon controller on the new control plane: {e}");
                None
            }
            (h, _) => h,
        };
        // Every controller Lease the victim held must have been handed over (protokube releases
        // them at poweroff), not left to expire.
        let mut leadership_lines = Vec::new();
        let mut leadership_failed = false;
        let healed = match (healed, &leases_before) {
            (Some(h), Ok(before)) => {
                let killed_ms = killed_at.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0);
                let after = crate::kubeapi::leases(&kubeconfig, leadership::NAMESPACE, leadership::LEASES).unwrap_or_default();
                let mut failed = Vec::new();
                for (name, b) in before {
                    let a = after.get(name).cloned().unwrap_or_default();
                    match leadership::moved(b, &a, &victim_host, killed_ms) {
                        leadership::Moved::NotHeld => {}
                        leadership::Moved::HandedOver { to, after_kill_s } => {
                            leadership_lines.push(format!("{name}: handed over to {to} {after_kill_s:.1} s after the kill"))
                        }
                        other => failed.push(format!("{name} held by the killed {victim_host}: {other:?}")),
                    }
                }
                if failed.is_empty() {
                    Some(h)
                } else {
                    leadership_failed = true;
                    status = format!("controller leadership not handed over: {}", failed.join("; "));
                    None
                }
            }
            (h, Err(e)) => {
                leadership_lines.push(format!("Leases not read before the kill ({e}); not checked"));
                h
            }
            (None, _) => None,
        };
        let (answered, failed, outage) = probe.finish();
        let api = format!("API through the load balancer: {answered}/{} probes answered, longest outage {outage:.1} s", answered + failed);
        match healed {
            Some((new, count, objects)) => {
                let secs = healed_secs;
                report.failovers.push(secs);
                report.healed += 1;
                report.intact = count;
                report.objects_intact = objects;
                let phases: Vec<f64> = reached.iter().map(|r| r.unwrap_or(secs)).collect();
                let breakdown = PHASES.iter().zip(&phases).map(|(p, t)| format!("{p} {t:.1}")).collect::<Vec<_>>().join(" → ");
                report.phases.push(phases);
                println!("cycle {n}/{cycles}: killed {} ({}) -> {new} healthy with {count}/{keys} keys and {objects}/{keys} ConfigMaps, same members, failover {secs:.1} s", victim.instance_id, victim.group);
                println!("  phases (s after the kill at {}): {breakdown}", utc_millis(killed_at));
                println!("  each phase seen by a poll at most {:.1} s after it happened (the widest gap between polls)", widest_gap.as_secs_f64());
                report.models.push(model);
                report.outages.push(outage);
                println!("  CPU model: {model}");
                if let (Some((used, by_name)), Some((busy, cores)), Some((critical_s, critical_by_name))) = (new_cpu, host_busy, critical) {
                    let by_phase: Vec<f64> = cpu_at.iter().map(|c| c.unwrap_or(critical_s)).collect();
                    let top: Vec<String> = critical_by_name.iter().take(8).map(|(n, s)| format!("{n} {s:.1}")).collect();
                    println!("  critical path: the new machine used {critical_s:.1} CPU-s from its boot to its Node Ready: {}", top.join(", "));
                    let phases: Vec<String> = PHASES.iter().zip(&by_phase).skip(1).map(|(p, c)| format!("{p} {c:.1}")).collect();
                    println!("  its CPU-s when each phase was seen: {}", phases.join(" → "));
                    report.cpu.push(FailoverCpu { critical_s, critical_by_name, by_phase, new_machine_s: used, model, host_busy: busy, cores });
                    println!(
                        "  CPU: the host's {cores} cores were {:.0} % busy from the kill to here; the new machine used {used:.1} CPU-s (alone on every core: {:.1} s)",
                        busy * 100.0,
                        used / cores as f64
                    );
                    let top: Vec<String> = by_name.iter().take(8).map(|(n, s)| format!("{n} {s:.1}")).collect();
                    println!("  CPU-s by command on the new machine: {}", top.join(", "));
                }
                if let Some(f) = fetched {
                    report.fetched.push(f);
                    println!("  registry: the new machine fetched {} image manifests and {} blobs", f.manifests, f.blobs);
                }
                println!("  {api}");
                println!("  addons: the new control plane's controller passed and applied 0 (every hash recorded)");
                for l in &leadership_lines {
                    println!("  leadership: {l}");
                }
            }
            None if leadership_failed => {
                println!("cycle {n}/{cycles}: FAILED: killed {} ({}); {status}; {api}", victim.instance_id, victim.group);
                println!("  the killed machine's protokube at poweroff:");
                let journal = crate::paths::MachinePaths { dir: st.machine_dir(&victim.instance_id) }.poweroff_journal();
                for l in leadership::poweroff_log(&journal) {
                    println!("  {l}");
                }
                break;
            }
            None => {
                println!(
                    "cycle {n}/{cycles}: FAILED: killed {} ({}); not healed within {} s: {status}; {api}",
                    victim.instance_id,
                    victim.group,
                    cycle_timeout.as_secs()
                );
                if let Ok(cs) = load() {
                    eprint!("{}", diagnose(&cs));
                }
                break;
            }
        }
    }
    // Without DNS records, workers find the (replaced) control planes through the product alone:
    // each must resolve the API and join names to the live ones (bounded: a protokube pass and the
    // workers' 30-s refresh).
    if crate::spec::Spec::load(spec_path).is_ok_and(|s| s.gossip) && report.healed == report.cycles {
        let deadline = Instant::now() + Duration::from_secs(120);
        let verdict = loop {
            let Ok(cs) = load() else { break Err(vec!["cluster state vanished".to_string()]) };
            match super::health::workers_resolve_api(&cs) {
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_secs(2)),
                v => break v,
            }
        };
        match verdict {
            Ok(line) => println!("selfheal: {line}"),
            Err(wrong) => println!("selfheal: workers do NOT resolve the live control planes:\n  {}", wrong.join("\n  ")),
        }
    }
    // Final check: every member holds every key, and the API every object.
    if let Ok(cs) = load() {
        let mut min = u64::MAX;
        for m in control_planes(&cs) {
            if let Some(ep) = etcd::endpoint(&m.root, &main) {
                min = min.min(etcd::count(m.init_pid.unwrap_or(0), &ep, KEY_PREFIX).unwrap_or(0));
            }
        }
        report.intact = if min == u64::MAX { 0 } else { min };
        report.objects_intact = crate::kubeapi::count_configmaps(&kubeconfig, OBJECT_NAMESPACE, OBJECT_PREFIX, keys).unwrap_or(0);
    }
    // The product's own verdict after the replacements.
    let (validated, verdict) = validate_cluster(validate_wait)?;
    report.validated = validated;
    println!("selfheal: keelson validate cluster after the replacements: {verdict}");
    if !report.validated {
        if let Ok(cs) = load() {
            eprint!("{}", diagnose_nodes(&cs, &kubeconfig));
        }
    }
    // After the verdict, which waits for the cluster to settle: right after a replacement, a node
    // whose kubelet was connected to the killed API server may be NotReady for a while.
    if let (Ok(cs), Ok(nodes)) = (load(), crate::kubeapi::nodes(&kubeconfig)) {
        let live: BTreeSet<&str> = cs.machines.iter().map(|m| m.ip.as_str()).collect();
        let ready = nodes.values().filter(|n| n.ready && n.internal_ip.as_deref().is_some_and(|ip| live.contains(ip))).count();
        println!("selfheal: {ready}/{} machines are Ready Nodes", live.len());
        // The hosts' distributions, as the kubelets report them (their os-release).
        let mut oses: BTreeMap<&str, usize> = BTreeMap::new();
        for n in nodes.values().filter(|n| n.internal_ip.as_deref().is_some_and(|ip| live.contains(ip))) {
            *oses.entry(n.os_image.as_str()).or_default() += 1;
        }
        println!("selfheal: Nodes' OS images: {}", oses.iter().map(|(os, n)| format!("{n} {os}")).collect::<Vec<_>>().join(", "));
    }
    if !report.phases.is_empty() {
        let medians: Vec<String> =
            PHASES.iter().enumerate().map(|(i, p)| format!("{p} {:.1}", median(&report.phases.iter().map(|v| v[i]).collect::<Vec<_>>()))).collect();
        println!("selfheal: median phase times (s after the kill): {}", medians.join(" → "));
        let used: BTreeSet<&str> = report.models.iter().map(|m| m.name()).collect();
        let models: Vec<Option<CpuModel>> =
            if used.len() > 1 { vec![None, Some(CpuModel::Shared), Some(CpuModel::BootPriority)] } else { vec![report.models.first().copied()] };
        for model in models {
            print!("{}", distribution(&report, model));
        }
    }
    if !report.fetched.is_empty() {
        let blobs: usize = report.fetched.iter().map(|f| f.blobs).sum();
        let manifests: usize = report.fetched.iter().map(|f| f.manifests).sum();
        println!(
            "selfheal: the {} new control planes fetched {blobs} image blobs and {manifests} manifests from the registry ({})",
            report.fetched.len(),
            if boot.baked { "baked image" } else { "plain image" }
        );
    }
    if !keep_up && cloud.is_some() {
        let iam = super::iam::check().context("the IAM oracle")?;
        for line in iam.to_string().lines() {
            println!("selfheal: {line}");
        }
        report.iam = Some(iam.clean());
    }
    println!(
        "selfheal: {} cycles, {}/{} keys intact, {}/{} ConfigMaps intact, median failover {:.1} s",
        report.cycles,
        report.intact,
        report.keys,
        report.objects_intact,
        report.objects,
        median(&report.failovers)
    );
    Ok(report)
}

/// The phase, failover, CPU and API-outage distribution (min / median / max) of the healed
/// cycles run under `model` (all of them: `None`), as `selfheal` prints it at the end.
pub fn distribution(report: &SelfhealReport, model: Option<CpuModel>) -> String {
    use std::fmt::Write;
    let mine = |i: &usize| model.is_none_or(|m| report.models.get(*i) == Some(&m));
    let cycles: Vec<usize> = (0..report.phases.len()).filter(mine).collect();
    let cpu: Vec<&FailoverCpu> = report.cpu.iter().filter(|c| model.is_none_or(|m| c.model == m)).collect();
    let label = model.map(|m| format!("CPU model {m}")).unwrap_or_else(|| "every CPU model".into());
    let mut out = format!("selfheal: phase distribution over {} cycles, {label} (s after the kill: min / median / max):\n", cycles.len());
    let mut row = |name: &str, v: Vec<f64>, digits: usize| {
        let (lo, med, hi) = spread(&v);
        let _ = writeln!(out, "  {name:<26} {lo:>5.digits$} / {med:>5.digits$} / {hi:>5.digits$}");
    };
    for (i, p) in PHASES.iter().enumerate() {
        row(p, cycles.iter().map(|c| report.phases[*c][i]).collect(), 1);
    }
    row("failover (all checks)", cycles.iter().filter_map(|c| report.failovers.get(*c).copied()).collect(), 1);
    row("longest API outage", cycles.iter().filter_map(|c| report.outages.get(*c).copied()).collect(), 1);
    if let Some(cores) = cpu.first().map(|c| c.cores) {
        row("critical-path CPU-s", cpu.iter().map(|c| c.critical_s).collect(), 1);
        row("new machine's CPU-s", cpu.iter().map(|c| c.new_machine_s).collect(), 1);
        row(&format!("same, alone on {cores} cores"), cpu.iter().map(|c| c.new_machine_s / c.cores as f64).collect(), 1);
        row("host busy (%)", cpu.iter().map(|c| c.host_busy * 100.0).collect(), 0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_fetches_are_counted_per_client() {
        let log = "\
172.20.32.4 - - [03/Dec/2026:12:24:31 +0000] \"GET /v2/ HTTP/1.1\" 200 2 \"\" \"containerd/v2.3.4\"
172.20.32.4 - - [03/Dec/2026:12:24:31 +0000] \"GET /v2/kube-proxy/manifests/v1.34.4 HTTP/1.1\" 200 666 \"\" \"containerd/v2.3.4\"
172.20.32.4 - - [03/Dec/2026:12:24:31 +0000] \"GET /v2/kube-proxy/blobs/sha256:6003 HTTP/1.1\" 200 740 \"\" \"containerd/v2.3.4\"
172.20.32.4 - - [03/Dec/2026:12:24:31 +0000] \"HEAD /v2/kube-proxy/blobs/sha256:6004 HTTP/1.1\" 200 0 \"\" \"containerd/v2.3.4\"
172.20.32.40 - - [03/Dec/2026:12:24:31 +0000] \"GET /v2/pause/blobs/sha256:1 HTTP/1.1\" 200 440 \"\" \"containerd/v2.3.4\"
time=\"2026-12-03T12:24:31Z\" level=info msg=\"response completed\"
";
        assert_eq!(registry_fetches(log, "172.20.32.4"), RegistryFetches { manifests: 1, blobs: 1 });
        assert_eq!(registry_fetches(log, "172.20.32.40"), RegistryFetches { manifests: 0, blobs: 1 });
        assert_eq!(registry_fetches(log, "172.20.32.5"), RegistryFetches::default());
    }

    #[test]
    fn kill_times_print_as_utc_clock_times() {
        let t = std::time::UNIX_EPOCH + Duration::from_millis(1_795_710_701_637);
        assert_eq!(utc_millis(t), "16:31:41.637 UTC");
    }

    #[test]
    fn a_soak_of_both_models_alternates_and_reports_each() {
        assert_eq!(
            (1..=4).map(|n| SoakCpu::Both.for_cycle(n)).collect::<Vec<_>>(),
            [CpuModel::Shared, CpuModel::BootPriority, CpuModel::Shared, CpuModel::BootPriority]
        );
        assert_eq!(SoakCpu::BootPriority.for_cycle(1), CpuModel::BootPriority);
        let cpu = |model, critical_s| FailoverCpu {
            critical_s,
            critical_by_name: vec![],
            by_phase: vec![],
            new_machine_s: critical_s + 1.0,
            model,
            host_busy: 0.5,
            cores: 2,
        };
        let report = SelfhealReport {
            cycles: 3,
            healed: 3,
            keys: 1,
            intact: 1,
            objects: 1,
            objects_intact: 1,
            failovers: vec![30.0, 12.0, 32.0],
            phases: vec![vec![1.0; PHASES.len()], vec![2.0; PHASES.len()], vec![3.0; PHASES.len()]],
            validated: true,
            cpu: vec![cpu(CpuModel::Shared, 10.0), cpu(CpuModel::BootPriority, 9.0), cpu(CpuModel::Shared, 11.0)],
            models: vec![CpuModel::Shared, CpuModel::BootPriority, CpuModel::Shared],
            outages: vec![0.0, 0.5, 0.25],
            fetched: vec![],
            iam: None,
        };
        let shared = distribution(&report, Some(CpuModel::Shared));
        assert!(shared.contains("over 2 cycles, CPU model shared"), "{shared}");
        assert!(shared.contains("failover (all checks)       30.0 /  31.0 /  32.0"), "{shared}");
        assert!(shared.contains("critical-path CPU-s         10.0 /  10.5 /  11.0"), "{shared}");
        let boot = distribution(&report, Some(CpuModel::BootPriority));
        assert!(boot.contains("failover (all checks)       12.0 /  12.0 /  12.0"), "{boot}");
        assert!(boot.contains("longest API outage           0.5 /   0.5 /   0.5"), "{boot}");
        assert!(distribution(&report, None).contains("over 3 cycles, every CPU model"));
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(spread(&[]), (0.0, 0.0, 0.0));
        assert_eq!(spread(&[12.6, 27.4, 19.7]), (12.6, 19.7, 27.4));
    }
}
