//! The machines of the local cloud, whatever cloud plays the control plane: one machine per running
//! instance (booted on a thread of its own, powered off when its instance is gone), the instances'
//! data volumes as loop devices inside the machine they are attached to, and the cloud's DNS
//! records in every machine's hosts file. The AWS daemon ([`super::daemon`]) and the GCE one
//! ([`crate::gce::daemon`]) tell it what their cloud says; it does the rest the same way.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::anyhow;

use crate::cpu_model::CpuModel;
use crate::machine::{Environment, Machine, MachineData, MachineInfo};
use crate::net::{self, Segment};
use crate::paths::State;
use crate::volumes::{self, Bus};

/// Longest an instance's machine may take to shut down after its termination (then it is powered
/// off hard). Units stop in order well within it (protokube, the kubelet, containerd, the
/// containers); what it cuts short is an artefact of this host: on cgroup v1 inside a container,
/// systemd never learns that a container scope's cgroup emptied, so it would wait out each
/// scope's 90-s stop timeout, which a cloud guest does not.
pub const POWEROFF_GRACE: Duration = Duration::from_secs(30);

pub const HOSTS_BEGIN: &str = "# Begin keelson-local VPC resolver (Route53 records of the local cloud)";
pub const HOSTS_END: &str = "# End keelson-local VPC resolver";

fn now_s() -> f64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// A reconcile step slower than this is reported: the local cloud's data planes (disks, routes,
/// hosts files) must keep up with the machines, or they inflate every measured failover.
pub const SLOW_STEP: Duration = Duration::from_secs(2);

/// Times the steps of one reconcile pass; a step over [`SLOW_STEP`] becomes an event naming it.
pub struct StepTimer {
    events: Arc<Mutex<Vec<String>>>,
    last: Instant,
}

impl StepTimer {
    pub fn start(events: &Arc<Mutex<Vec<String>>>) -> StepTimer {
        StepTimer { events: events.clone(), last: Instant::now() }
    }

    /// `step` just finished.
    pub fn done(&mut self, step: &str) {
        let took = self.last.elapsed();
        if took > SLOW_STEP {
            event(&self.events, format!("slow reconcile step: {step} took {:.1} s", took.as_secs_f64()));
        }
        self.last = Instant::now();
    }
}

/// Log `msg` and keep it (the last 200) for `ps` and `up`.
pub fn event(events: &Mutex<Vec<String>>, msg: String) {
    eprintln!("keelson-local: {msg}");
    if let Ok(mut e) = events.lock() {
        e.push(format!("{:.1} {msg}", now_s()));
        let n = e.len();
        if n > 200 {
            e.drain(..n - 200);
        }
    }
}

/// One data volume as the cloud has it.
#[derive(Debug, Clone)]
pub struct Volume {
    /// The cloud's id (EBS) or `zone/name` (a persistent disk): the backing file's name.
    pub id: String,
    /// For events.
    pub name: String,
    pub size_gib: u64,
    /// The machine (its key) the cloud says it is attached to, if any.
    pub attached_to: Option<String>,
    /// How it appears in the machine.
    pub bus: Bus,
}

/// Where the machines live and what they are booted from.
pub struct Place {
    pub state: State,
    pub seg: Segment,
    pub bridge: String,
    pub lower: crate::rootfs::Lower,
    /// What instances of other architectures boot from (an arm64 group's: `crate::arch`).
    pub foreign: BTreeMap<crate::arch::Arch, crate::rootfs::Lower>,
    /// What this architecture's instances of an image other than Debian 12's boot from, by image
    /// (AMI) id: the Debian release the group's image asked for (`crate::rootfs::Suite`).
    pub releases: BTreeMap<String, (crate::rootfs::Suite, crate::rootfs::Lower)>,
    pub self_exe: PathBuf,
    pub env: Environment,
}

/// Machine → (its boot priority's start, its cgroups).
type Boosted = Arc<Mutex<BTreeMap<String, (SystemTime, Vec<PathBuf>)>>>;

pub struct Fleet {
    pub place: Place,
    pub machines: Arc<Mutex<BTreeMap<String, Machine>>>,
    starting: Arc<Mutex<BTreeSet<String>>>,
    /// Terminated instances whose machines are still shutting down: they keep their volumes until
    /// they are gone, as a cloud keeps them attached to an instance that is stopping.
    stopping: Arc<Mutex<BTreeSet<String>>>,
    pub failed: Arc<Mutex<BTreeMap<String, String>>>,
    pub events: Arc<Mutex<Vec<String>>>,
    backings: HashMap<String, volumes::Backing>,
    /// volume id → (machine, slot) currently exposed.
    pub exposed: BTreeMap<String, (String, u32)>,
    hosts_written: HashMap<String, String>,
    /// Wakes the reconcile loop before its next tick (a machine went off and freed its volumes).
    pub nudge: Nudge,
    /// Machines booting with priority ([`crate::cpu_model::CpuModel::BootPriority`]): since when,
    /// and their cgroups.
    boosted: Boosted,
}

/// Wakes a loop that sleeps between passes before its sleep is over.
#[derive(Clone, Default)]
pub struct Nudge(Arc<(Mutex<bool>, Condvar)>);

impl Nudge {
    pub fn nudge(&self) {
        let (flag, cv) = &*self.0;
        if let Ok(mut f) = flag.lock() {
            *f = true;
            cv.notify_all();
        }
    }

    /// Sleep for `d`, or until nudged if that comes first (a nudge since the last wait counts).
    pub fn wait(&self, d: Duration) {
        let (flag, cv) = &*self.0;
        if let Ok(f) = flag.lock() {
            if let Ok((mut f, _)) = cv.wait_timeout_while(f, d, |nudged| !*nudged) {
                *f = false;
            }
        }
    }
}

impl Fleet {
    pub fn new(place: Place, events: Arc<Mutex<Vec<String>>>) -> Fleet {
        Fleet {
            place,
            machines: Arc::new(Mutex::new(BTreeMap::new())),
            starting: Arc::new(Mutex::new(BTreeSet::new())),
            stopping: Arc::new(Mutex::new(BTreeSet::new())),
            failed: Arc::new(Mutex::new(BTreeMap::new())),
            events,
            backings: HashMap::new(),
            exposed: BTreeMap::new(),
            hosts_written: HashMap::new(),
            nudge: Nudge::default(),
            boosted: Default::default(),
        }
    }

    pub fn event(&self, msg: String) {
        event(&self.events, msg);
    }

    /// Whether the machine `key` runs, boots, or failed to (then it is not tried again).
    pub fn knows(&self, key: &str) -> anyhow::Result<bool> {
        Ok(self.machines.lock().map_err(|_| anyhow!("lock"))?.contains_key(key)
            || self.starting.lock().map_err(|_| anyhow!("lock"))?.contains(key)
            || self.failed.lock().map_err(|_| anyhow!("lock"))?.contains_key(key))
    }

    /// Power off (on threads of their own) the machines whose instance is no longer live.
    pub fn stop_gone(&mut self, live: impl Fn(&str) -> bool) -> anyhow::Result<()> {
        let gone: Vec<String> = {
            let m = self.machines.lock().map_err(|_| anyhow!("lock"))?;
            m.keys().filter(|id| !live(id)).cloned().collect()
        };
        for id in gone {
            let m = self.machines.lock().map_err(|_| anyhow!("lock"))?.remove(&id);
            if let Some(mut m) = m {
                self.event(format!("{id}: instance terminated; shutting its machine down (ACPI poweroff)"));
                self.hosts_written.remove(&id);
                self.stopping.lock().map_err(|_| anyhow!("lock"))?.insert(id.clone());
                let (stopping, events, nudge) = (self.stopping.clone(), self.events.clone(), self.nudge.clone());
                std::thread::spawn(move || {
                    let t0 = Instant::now();
                    // Off: its volumes are free; the reconcile loop hands them on at once.
                    let off = || {
                        event(&events, format!("{id}: machine off after {:.1} s; its volumes are free", t0.elapsed().as_secs_f64()));
                        if let Ok(mut s) = stopping.lock() {
                            s.remove(&id);
                        }
                        nudge.nudge();
                    };
                    let (took, clean) = m.poweroff(POWEROFF_GRACE, off);
                    let how = if clean { "powered off" } else { "did not power off in time; killed" };
                    event(&events, format!("{id}: machine {how}; torn down after {:.1} s", took.as_secs_f64()));
                });
            }
        }
        Ok(())
    }

    /// Boot a machine for `data` on a thread of its own; `on_up` runs once it is up (the cloud's
    /// instance becomes RUNNING, where the cloud waits for that).
    pub fn boot(&self, data: MachineData, role: String, group: String, on_up: Box<dyn FnOnce() + Send>) -> anyhow::Result<()> {
        let id = data.key().to_string();
        self.starting.lock().map_err(|_| anyhow!("lock"))?.insert(id.clone());
        let (machines, starting, failed, events) = (self.machines.clone(), self.starting.clone(), self.failed.clone(), self.events.clone());
        let p = &self.place;
        let arch = data.arch();
        let release = data.image_id().and_then(|i| p.releases.get(i)).filter(|_| arch == crate::arch::host());
        let lower = match release {
            Some((_, lower)) => Some(lower.clone()),
            None if arch == crate::arch::host() => Some(p.lower.clone()),
            None => p.foreign.get(&arch).cloned(),
        };
        let Some(lower) = lower else {
            let e = format!("no {arch} root filesystem: keelson-local builds one for each architecture the spec's groups run at `up`");
            self.event(format!("{id}: machine failed to start: {e}"));
            self.starting.lock().map_err(|_| anyhow!("lock"))?.remove(&id);
            self.failed.lock().map_err(|_| anyhow!("lock"))?.insert(id, e);
            return Ok(());
        };
        let (exe, dir, bridge, seg, env) = (p.self_exe.clone(), p.state.machine_dir(&id), p.bridge.clone(), p.seg, p.env.clone());
        let suite = release.map(|(s, _)| *s).unwrap_or(crate::rootfs::Suite::Bookworm);
        let arch_note = if arch == crate::arch::host() { format!(", {suite}") } else { format!(", {arch} under qemu-user, {suite}") };
        self.event(format!("{id}: instance running ({} {group} in {}{arch_note}); booting its machine", data.private_ip(), data.zone()));
        let cpu_model = CpuModel::read(&p.state.cpu_model_file()).unwrap_or_else(|e| {
            self.event(format!("{id}: CPU model: {e}; booting it with shared CPU"));
            CpuModel::Shared
        });
        let boosted = self.boosted.clone();
        // Its running neighbours, for the boot-priority weight (machines still starting count too:
        // they want CPU as much).
        let neighbours = self.machines.lock().map(|m| m.len()).unwrap_or(0) + self.starting.lock().map(|s| s.len().saturating_sub(1)).unwrap_or(0);
        let shares = cpu_model.launch_shares(neighbours);
        std::thread::spawn(move || {
            let t0 = Instant::now();
            if cpu_model == CpuModel::BootPriority {
                // Before nspawn starts: the whole boot runs with the priority (Machine::start finds
                // the cgroups made and moves its systemd-nspawn into them).
                let boost = crate::cgroups::dirs_for(&id).and_then(|dirs| {
                    crate::cgroups::create(&dirs)?;
                    crate::cgroups::set_cpu_shares(&dirs, shares)?;
                    Ok(dirs)
                });
                match boost {
                    Ok(dirs) => {
                        event(&events, format!("{id}: CPU model {cpu_model}: CPU weight {shares} ({neighbours} neighbours) until its Node is Ready"));
                        if let Ok(mut b) = boosted.lock() {
                            b.insert(id.clone(), (SystemTime::now(), dirs));
                        }
                    }
                    Err(e) => event(&events, format!("{id}: CPU model {cpu_model} not applied: {e}")),
                }
            }
            match Machine::start(&exe, &lower, dir, &bridge, &seg, &env, &data, &role, &group) {
                Ok(m) => {
                    event(&events, format!("{id}: machine up in {:.1} s (init pid {})", t0.elapsed().as_secs_f64(), m.info.init_pid.unwrap_or(0)));
                    if let Ok(mut ms) = machines.lock() {
                        ms.insert(id.clone(), m);
                    }
                    on_up();
                }
                Err(e) => {
                    event(&events, format!("{id}: machine failed to start: {e}"));
                    if let Ok(mut f) = failed.lock() {
                        f.insert(id.clone(), e.to_string());
                    }
                }
            }
            if let Ok(mut s) = starting.lock() {
                s.remove(&id);
            }
        });
        Ok(())
    }

    /// Watch the machines booting with priority, on a thread of its own (the API may not answer
    /// for a while, and the reconcile loop must not wait for it): every 2 s, while one has it, read
    /// the Nodes from the API at `kubeconfig` and end the priority of each machine whose Node is
    /// Ready (by its IP, posted by a kubelet since the priority began: a replacement may take over
    /// its predecessor's IP and Node, still Ready for a while), whose priority is older than its
    /// limit, or which is gone: its cgroups get the default CPU weight again. Ends with the fleet.
    pub fn watch_boot_priority(&self, kubeconfig: PathBuf) {
        let (boosted, machines, starting, events) = (Arc::downgrade(&self.boosted), self.machines.clone(), self.starting.clone(), self.events.clone());
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_secs(2));
            let Some(boosted) = boosted.upgrade() else { return };
            if boosted.lock().map(|b| b.is_empty()).unwrap_or(true) {
                continue;
            }
            // Ready Nodes: IP → when their kubelet last posted it.
            let ready: BTreeMap<String, i64> = crate::kubeapi::nodes(&kubeconfig)
                .map(|n| n.into_values().filter(|n| n.ready).filter_map(|n| Some((n.internal_ip?, n.ready_heartbeat.unwrap_or(0)))).collect())
                .unwrap_or_default();
            let ips: BTreeMap<String, String> = machines.lock().map(|m| m.iter().map(|(id, m)| (id.clone(), m.info.ip.clone())).collect()).unwrap_or_default();
            let starting = starting.lock().map(|s| s.clone()).unwrap_or_default();
            let Ok(mut boosted) = boosted.lock() else { return };
            boosted.retain(|id, (since, dirs)| {
                let alive = ips.contains_key(id) || starting.contains(id);
                let since_unix = since.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
                let ready = ips.get(id).and_then(|ip| ready.get(ip)).is_some_and(|posted| *posted >= since_unix);
                let age = since.elapsed().unwrap_or_default();
                let Some(why) = crate::cpu_model::priority_ends(ready, age, alive) else { return true };
                if alive {
                    if let Err(e) = crate::cgroups::set_cpu_shares(dirs, crate::cgroups::DEFAULT_CPU_SHARES) {
                        event(&events, format!("{id}: CPU weight not reset: {e}"));
                    }
                }
                event(&events, format!("{id}: boot priority ended after {:.1} s ({why})", age.as_secs_f64()));
                false
            });
        });
    }

    /// Follow the cloud's attachments: a volume attached to a running machine appears in it (a
    /// loop device under the names the cloud gives it); one detached, or whose machine is gone,
    /// disappears. A volume stays with a machine that is shutting down until it is gone.
    pub fn sync_volumes(&mut self, vols: &[Volume]) -> anyhow::Result<()> {
        let machines = self.machines.lock().map_err(|_| anyhow!("lock"))?;
        let stopping = self.stopping.lock().map_err(|_| anyhow!("lock"))?.clone();
        // Volumes of machines that have finished shutting down are free again.
        self.exposed.retain(|_, (inst, _)| machines.contains_key(inst) || stopping.contains(inst));
        for v in vols {
            if v.attached_to.is_some() && !self.backings.contains_key(&v.id) {
                let b = volumes::ensure_backing(&self.place.state.volumes_dir(), &v.id.replace('/', "_"), v.size_gib)?;
                self.backings.insert(v.id.clone(), b);
            }
            let want = v.attached_to.clone().filter(|i| machines.get(i).is_some_and(|m| m.running()));
            let have = self.exposed.get(&v.id).cloned();
            if have.as_ref().map(|(i, _)| i) == want.as_ref() {
                continue;
            }
            if have.as_ref().is_some_and(|(i, _)| stopping.contains(i)) {
                // Still attached to a machine that is shutting down: not attachable elsewhere yet.
                continue;
            }
            // Freed by a machine that went off a moment ago: the kernel may still be dropping its
            // namespace's mount of the volume. Attach it on a later pass.
            if want.is_some() && have.is_none() && self.backings.get(&v.id).is_some_and(|b| volumes::mounted_anywhere(&b.device)) {
                continue;
            }
            if let Some((inst, slot)) = have {
                if let Some(m) = machines.get(&inst) {
                    if let Some(p) = m.init_pid() {
                        volumes::unexpose_as(p, &v.bus, slot);
                    }
                }
                self.exposed.remove(&v.id);
                event(&self.events, format!("{}: detached from {inst}", v.id));
            }
            if let Some(inst) = want {
                let used: BTreeSet<u32> = self.exposed.values().filter(|(i, _)| *i == inst).map(|(_, s)| *s).collect();
                let slot = (1..).find(|s| !used.contains(s)).unwrap_or(1);
                if let (Some(m), Some(b)) = (machines.get(&inst), self.backings.get(&v.id)) {
                    if let Some(p) = m.init_pid() {
                        volumes::expose_as(p, b, &v.bus, slot)?;
                        self.exposed.insert(v.id.clone(), (inst.clone(), slot));
                        event(&self.events, format!("{} ({}): attached to {inst} as /dev/{}", v.id, v.name, v.bus.node(slot)));
                    }
                }
            }
        }
        // A volume deleted in the cloud, and no longer in any machine: its storage is gone, as EBS's.
        let listed: BTreeSet<&str> = vols.iter().map(|v| v.id.as_str()).collect();
        let gone: Vec<String> = self.backings.keys().filter(|id| !listed.contains(id.as_str()) && !self.exposed.contains_key(*id)).cloned().collect();
        for id in gone {
            if let Some(b) = self.backings.get(&id) {
                if volumes::mounted_anywhere(&b.device) {
                    continue;
                }
                volumes::destroy_backing(&b.file);
            }
            self.backings.remove(&id);
            event(&self.events, format!("{id}: deleted, its storage freed"));
        }
        Ok(())
    }

    /// Play the VPC resolver: every A record (name, address) goes into a guarded block of every
    /// machine's /etc/hosts (and of the kubelet's per-pod copies of it), rewritten in place when it
    /// changes.
    pub fn sync_hosts(&mut self, records: &[(String, String)]) {
        let mut block = format!("{HOSTS_BEGIN}\n");
        for (name, ip) in records {
            block.push_str(&format!("{ip}\t{name}\n"));
        }
        block.push_str(HOSTS_END);
        block.push('\n');
        let Ok(machines) = self.machines.lock() else { return };
        for (id, m) in machines.iter() {
            if self.hosts_written.get(id) == Some(&block) {
                continue;
            }
            let path = crate::paths::in_root(&m.info.root, keelson_api::host_paths::HOSTS_FILE);
            let text = fs::read_to_string(&path).unwrap_or_default();
            let new = replace_block(&text, &block);
            if new != text && write_in_place(&path, &new).is_err() {
                continue;
            }
            // The kubelet gives each host-network pod (etcd, the API server) a copy of /etc/hosts
            // taken when the pod starts; a resolver answers with live records, so the copies follow.
            let pods = crate::paths::in_root(&m.info.root, keelson_api::host_paths::KUBELET_PODS_DIR);
            for pod in fs::read_dir(&pods).into_iter().flatten().flatten() {
                let copy = pod.path().join(base::hosts::KUBELET_POD_HOSTS_FILE);
                if let Ok(text) = fs::read_to_string(&copy) {
                    let new = replace_block(&text, &block);
                    if new != text {
                        let _ = write_in_place(&copy, &new);
                    }
                }
            }
            self.hosts_written.insert(id.clone(), block.clone());
        }
    }

    /// Play the network's router: every wanted route (destination → the private address of the
    /// instance it goes through) becomes a host route on the bridge, and host routes no longer
    /// wanted go. `source` names the cloud's route table in the events.
    pub fn sync_routes(&self, want: &BTreeMap<String, String>, source: &str) {
        let have = match net::bridge_routes(&self.place.bridge) {
            Ok(h) => h,
            Err(e) => {
                self.event(format!("routes: {e}"));
                return;
            }
        };
        for (dest, via) in want {
            if have.get(dest) != Some(via) {
                match net::set_bridge_route(&self.place.bridge, dest, via) {
                    Ok(()) => self.event(format!("route {dest} via {via} ({source})")),
                    Err(e) => self.event(format!("routes: {e}")),
                }
            }
        }
        for dest in have.keys().filter(|d| !want.contains_key(*d)) {
            net::delete_bridge_route(&self.place.bridge, dest);
            self.event(format!("route {dest} removed (gone from the {source})"));
        }
    }

    pub fn infos(&self) -> Vec<MachineInfo> {
        self.machines.lock().map(|m| m.values().map(|m| m.info.clone()).collect()).unwrap_or_default()
    }

    /// Stop every machine (in parallel, after the ones booting have finished, bounded), free the
    /// volumes and remove the bridge.
    pub fn shutdown(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.starting.lock().map(|s| !s.is_empty()).unwrap_or(false) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let all: Vec<Machine> = self.machines.lock().map(|mut m| std::mem::take(&mut *m).into_values().collect()).unwrap_or_default();
        let handles: Vec<_> = all.into_iter().map(|mut m| std::thread::spawn(move || m.stop())).collect();
        for h in handles {
            let _ = h.join();
        }
        for b in self.backings.values() {
            volumes::destroy_backing(&b.file);
        }
        net::delete_vpc_router(&self.place.bridge);
        net::delete_bridge(&self.place.bridge);
    }
}

/// Replace (or append) the guarded block.
pub fn replace_block(text: &str, block: &str) -> String {
    if let (Some(b), Some(e)) = (text.find(HOSTS_BEGIN), text.find(HOSTS_END)) {
        if e > b {
            let after = text[e + HOSTS_END.len()..].trim_start_matches('\n');
            return format!("{}{}{}", &text[..b], block, after);
        }
    }
    let mut t = text.to_string();
    if !t.is_empty() && !t.ends_with('\n') {
        t.push('\n');
    }
    t.push_str(block);
    t
}

/// Rewrite a file without replacing its inode (it may be bind-mounted elsewhere).
pub fn write_in_place(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = fs::OpenOptions::new().write(true).truncate(true).open(path)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nudge_ends_the_wait_and_counts_once() {
        let nudge = Nudge::default();
        let long = Duration::from_secs(60);
        // A nudge that came before the wait still ends it (it is not lost between passes).
        nudge.nudge();
        let t = Instant::now();
        nudge.wait(long);
        assert!(t.elapsed() < long / 2);
        // From another thread while waiting.
        let other = nudge.clone();
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            other.nudge();
        });
        let t = Instant::now();
        nudge.wait(long);
        assert!(t.elapsed() < long / 2);
        h.join().unwrap();
        // Used up: the next wait sleeps its full time.
        let t = Instant::now();
        nudge.wait(Duration::from_millis(200));
        assert!(t.elapsed() >= Duration::from_millis(200));
    }

    #[test]
    fn hosts_block_replaced_in_place() {
        let block = format!("{HOSTS_BEGIN}\n1.2.3.4\tapi.c\n{HOSTS_END}\n");
        let t = replace_block("127.0.0.1 localhost\n", &block);
        assert_eq!(t, format!("127.0.0.1 localhost\n{block}"));
        let block2 = format!("{HOSTS_BEGIN}\n5.6.7.8\tapi.c\n{HOSTS_END}\n");
        let t2 = replace_block(&format!("{t}# other\n"), &block2);
        assert_eq!(t2, format!("127.0.0.1 localhost\n{block2}# other\n"));
    }
}
