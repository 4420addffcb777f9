//! `chaos`: the faults beyond one control plane at a time. A scenario brings the cluster up when
//! none is running, writes the data (etcd keys and ConfigMaps, as `selfheal` does), runs its fault,
//! waits for the cluster to heal by itself — no step of anyone's — and ends with one line:
//! `chaos NAME: healed in X s, K/K keys intact, C/C ConfigMaps intact, validate valid` (or what
//! failed).
//!
//! Scenarios so far: `two-control-planes` (etcd's quorum lost: two of three control planes
//! terminated at once) and `all-control-planes` (every control plane at once). Each replacement
//! must claim its member's surviving volumes and etcd come back with its data and the same
//! members (by name and id: never re-bootstrapped), the API serve every object again.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};

use crate::etcd;
use crate::machine::MachineInfo;

use super::commands::state;
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
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Scenario::TwoControlPlanes => "two-control-planes",
            Scenario::AllControlPlanes => "all-control-planes",
        }
    }

    /// How many of `n` control planes the scenario terminates (None: it needs more).
    pub fn victims(self, n: usize) -> Option<usize> {
        match self {
            Scenario::TwoControlPlanes => (n >= 3).then_some(2),
            Scenario::AllControlPlanes => (n >= 1).then_some(n),
        }
    }
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
}

pub struct ChaosReport {
    pub scenario: Scenario,
    /// Seconds from the fault to healed, when it healed.
    pub healed: Option<f64>,
    pub keys: u64,
    /// The fewest keys any member holds afterwards.
    pub intact: u64,
    pub objects_intact: u64,
    pub validated: bool,
}

impl ChaosReport {
    pub fn ok(&self) -> bool {
        self.healed.is_some() && self.intact == self.keys && self.objects_intact == self.keys && self.validated
    }

    /// The scenario's one line.
    pub fn line(&self, failure: &str) -> String {
        let (name, k) = (self.scenario.name(), self.keys);
        match self.healed {
            Some(s) => format!(
                "chaos {name}: healed in {s:.1} s, {}/{k} keys intact, {}/{k} ConfigMaps intact, validate {}",
                self.intact,
                self.objects_intact,
                if self.validated { "valid" } else { "NOT valid" }
            ),
            None => format!("chaos {name}: NOT healed: {failure}; {}/{k} keys, {}/{k} ConfigMaps readable", self.intact, self.objects_intact),
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
    println!("chaos: wrote {keys} keys to etcd {main} and {keys} ConfigMaps; members {baseline:?}");

    // The fault: `kills` control planes, picked at random, terminated back to back.
    let mut victims: Vec<MachineInfo> = Vec::new();
    for _ in 0..kills {
        victims.push(cps.remove(random_index(cps.len())));
    }
    let t0 = Instant::now();
    for v in &victims {
        super::commands::kill(&v.instance_id)?;
    }
    let names: Vec<String> = victims.iter().map(|v| format!("{} ({})", v.instance_id, v.group)).collect();
    println!("chaos {}: terminated {} at once", scenario.name(), names.join(", "));

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
            if count != keys {
                short = Some(format!("{}: {count}/{keys} keys", m.instance_id));
                break;
            }
        }
        if let Some(s) = short {
            status = s;
            continue;
        }
        match live.iter().find_map(|m| member_sets(&cs, m)) {
            Some(m) if m == baseline => {}
            Some(m) => {
                status = format!("members {m:?}, want {baseline:?}");
                continue;
            }
            None => {
                status = "cannot list members".into();
                continue;
            }
        }
        let objects = crate::kubeapi::count_configmaps(&kubeconfig, namespace, &object_prefix, keys).unwrap_or(0);
        if objects != keys {
            status = format!("{objects}/{keys} ConfigMaps readable");
            continue;
        }
        break Some(t0.elapsed().as_secs_f64());
    };
    // What every member holds now, and the API.
    let cs = load()?;
    let mut intact = u64::MAX;
    for m in control_planes(&cs) {
        if let Some(ep) = etcd::endpoint(&m.root, &main) {
            intact = intact.min(etcd::count(m.init_pid.unwrap_or(0), &ep, &key_prefix).unwrap_or(0));
        }
    }
    let objects_intact = crate::kubeapi::count_configmaps(&kubeconfig, namespace, &object_prefix, keys).unwrap_or(0);
    let (validated, verdict) = if healed.is_some() { validate_cluster(opts.validate_wait)? } else { (false, "not run".into()) };
    if !validated && healed.is_some() {
        println!("chaos: keelson validate cluster: {verdict}");
    }
    if healed.is_none() {
        eprint!("{}", super::diagnose(&cs));
    }
    let report = ChaosReport { scenario, healed, keys, intact: if intact == u64::MAX { 0 } else { intact }, objects_intact, validated };
    println!("{}", report.line(&status));
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn victims_and_lines() {
        assert_eq!(Scenario::TwoControlPlanes.victims(3), Some(2));
        assert_eq!(Scenario::TwoControlPlanes.victims(1), None);
        assert_eq!(Scenario::AllControlPlanes.victims(3), Some(3));
        let r = ChaosReport { scenario: Scenario::TwoControlPlanes, healed: Some(41.25), keys: 1000, intact: 1000, objects_intact: 1000, validated: true };
        assert!(r.ok());
        assert_eq!(r.line(""), "chaos two-control-planes: healed in 41.2 s, 1000/1000 keys intact, 1000/1000 ConfigMaps intact, validate valid");
        let r = ChaosReport { healed: None, intact: 0, objects_intact: 3, validated: false, ..r };
        assert!(!r.ok());
        assert_eq!(
            r.line("1/3 control planes running"),
            "chaos two-control-planes: NOT healed: 1/3 control planes running; 0/1000 keys, 3/1000 ConfigMaps readable"
        );
    }
}
