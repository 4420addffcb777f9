//! `chaos --scenario partition`: one control plane cut off from the other two, then let back.
//!
//! The cut: in the victim's network namespace, every packet to or from the other control planes
//! is dropped — its own traffic (INPUT, OUTPUT) and its pods' (FORWARD) — by one iptables chain of
//! the harness's, removed when the cut heals (also when the scenario fails halfway). The victim
//! still reaches the local cloud, the load balancer and the workers: a partition between control
//! planes.
//!
//! While it lasts, [`watch_isolation`] waits (bounded) until the cluster has done what it must:
//! etcd's majority has a leader of its own; no leader-election Lease is held by the victim; the
//! victim's API server fails `/readyz` and protokube has taken it out of the API target group; and
//! a write straight to the victim's API server is refused (it cannot reach a quorum: no
//! split-brained write), while writes through the load balancer and to the majority's etcd go on.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};

use crate::cloud::Cloud;
use crate::etcd;
use crate::kubeapi::{self, Target};
use crate::machine::MachineInfo;

/// The harness's chain in the victim's namespace.
const CHAIN: &str = "KEELSON-CHAOS-CUT";
/// The built-in chains the cut hooks into.
const HOOKS: [&str; 3] = ["INPUT", "OUTPUT", "FORWARD"];

/// A cut in force; healed on drop.
pub struct Cut {
    init_pid: i64,
    healed: bool,
}

fn iptables(init_pid: i64, args: &[&str]) -> Result<String, crate::cmd::CmdError> {
    let pid = init_pid.to_string();
    crate::cmd::sh(&[&["nsenter", "-t", &pid, "-n", "iptables", "-w", "5"], args].concat())
}

impl Cut {
    /// Drop everything between `victim` and `peers` (their addresses), in the victim's namespace.
    pub fn new(victim: &MachineInfo, peers: &[&MachineInfo]) -> anyhow::Result<Cut> {
        let init_pid = victim.init_pid.ok_or_else(|| anyhow!("{}: no machine", victim.instance_id))?;
        let cut = Cut { init_pid, healed: false };
        iptables(init_pid, &["-N", CHAIN])?;
        for p in peers {
            iptables(init_pid, &["-A", CHAIN, "-s", &p.ip, "-j", "DROP"])?;
            iptables(init_pid, &["-A", CHAIN, "-d", &p.ip, "-j", "DROP"])?;
        }
        for hook in HOOKS {
            iptables(init_pid, &["-I", hook, "1", "-j", CHAIN])?;
        }
        Ok(cut)
    }

    /// Remove the cut (idempotent).
    pub fn heal(&mut self) -> anyhow::Result<()> {
        if self.healed {
            return Ok(());
        }
        for hook in HOOKS {
            // Absent when `new` failed halfway: not an error.
            let _ = iptables(self.init_pid, &["-D", hook, "-j", CHAIN]);
        }
        let _ = iptables(self.init_pid, &["-F", CHAIN]);
        iptables(self.init_pid, &["-X", CHAIN]).map_err(|e| anyhow!("removing the cut: {e}"))?;
        self.healed = true;
        Ok(())
    }
}

impl Drop for Cut {
    fn drop(&mut self) {
        if let Err(e) = self.heal() {
            eprintln!("keelson-local: chaos partition: {e:#}");
        }
    }
}

/// What the cluster did about the cut, and when (seconds after it).
#[derive(Debug, Default)]
pub struct Isolation {
    /// The majority's etcd main leader (member id) and when every majority member knew it.
    pub leader: Option<(String, f64)>,
    /// When no Lease of [`crate::cluster::leadership::LEASES`] was held by the victim any more.
    pub leases_moved: Option<f64>,
    /// When the victim's `/readyz` first failed.
    pub readyz_failed: Option<f64>,
    /// When moto's API target group first did not hold the victim.
    pub out_of_target_group: Option<f64>,
    /// A write straight to the victim's API server was refused (`Some(error)`), after all the above.
    pub direct_write_refused: Option<String>,
    pub last_status: String,
}

impl Isolation {
    pub fn done(&self) -> bool {
        self.leader.is_some()
            && self.leases_moved.is_some()
            && self.readyz_failed.is_some()
            && self.out_of_target_group.is_some()
            && self.direct_write_refused.is_some()
    }

    pub fn line(&self, t: f64) -> String {
        let at = |x: Option<f64>| x.map(|s| format!("{s:.1} s")).unwrap_or_else(|| "never".into());
        format!(
            "chaos partition: isolated in {t:.1} s: etcd leader {} in the majority at {}, Leases off it at {}, its /readyz failing at {}, out of the API target group at {}, a write straight to it refused ({})",
            self.leader.as_ref().map(|(id, _)| id.as_str()).unwrap_or("none"),
            at(self.leader.as_ref().map(|(_, s)| *s)),
            at(self.leases_moved),
            at(self.readyz_failed),
            at(self.out_of_target_group),
            self.direct_write_refused.as_deref().unwrap_or("not refused")
        )
    }
}

/// The instance ids moto's API target group holds (port 443 of the API load balancer).
pub fn api_targets(cloud: &Cloud) -> anyhow::Result<Vec<String>> {
    let listeners = cloud.nlb_listeners()?;
    let l = listeners
        .iter()
        .find(|l| l.load_balancer.starts_with("api") && l.port == i32::from(keelson_api::ports::KUBE_API))
        .ok_or_else(|| anyhow!("no API load balancer listener in moto"))?;
    Ok(l.targets.iter().map(|(id, _)| id.clone()).collect())
}

/// The ConfigMap written straight to the victim while it is cut off: it must never exist.
pub const REFUSED_WRITE: &str = "keelson-chaos-partition-split-brain";

/// Wait, at most `limit`, until the cluster has isolated `victim` (see the module's docs).
pub fn watch_isolation(kubeconfig: &Path, cloud: &Cloud, victim: &MachineInfo, majority: &[&MachineInfo], main: &str, limit: Duration) -> Isolation {
    let t0 = Instant::now();
    let since = || t0.elapsed().as_secs_f64();
    let hostname = std::fs::read_to_string(victim.root.join("etc/hostname")).map(|h| h.trim().to_string()).unwrap_or_default();
    let direct = Target { server: Some(format!("https://{}", victim.ip)), tls_server_name: None };
    let victim_id = victim.init_pid.and_then(|p| etcd::endpoint(&victim.root, main).and_then(|ep| etcd::leader(p, &ep))).map(|(me, _)| me);
    let mut iso = Isolation::default();
    while t0.elapsed() < limit && !iso.done() {
        if iso.leader.is_none() {
            let seen: Vec<Option<(String, String)>> =
                majority.iter().map(|m| m.init_pid.and_then(|p| etcd::endpoint(&m.root, main).and_then(|ep| etcd::leader(p, &ep)))).collect();
            let leaders: Vec<&String> = seen.iter().flatten().map(|(_, l)| l).collect();
            let ids: Vec<&String> = seen.iter().flatten().map(|(me, _)| me).collect();
            match leaders.first() {
                Some(l) if leaders.len() == majority.len() && leaders.iter().all(|x| x == l) && ids.contains(l) && Some(*l) != victim_id.as_ref() => {
                    iso.leader = Some(((*l).clone(), since()));
                }
                _ => iso.last_status = format!("majority's etcd leaders {seen:?}"),
            }
        }
        if iso.leases_moved.is_none() {
            match kubeapi::leases(kubeconfig, super::leadership::NAMESPACE, super::leadership::LEASES) {
                Ok(l) if !l.values().any(|s| base::leader_election::held_by_host(Some(&s.holder), &hostname)) => iso.leases_moved = Some(since()),
                Ok(l) => {
                    iso.last_status = format!(
                        "Leases held by {hostname}: {:?}",
                        l.iter().filter(|(_, s)| s.holder.starts_with(&hostname)).map(|(n, _)| n).collect::<Vec<_>>()
                    )
                }
                Err(e) => iso.last_status = format!("reading the Leases: {e}"),
            }
        }
        if iso.readyz_failed.is_none() && kubeapi::readyz_within(kubeconfig, &direct, Duration::from_secs(5)).is_err() {
            iso.readyz_failed = Some(since());
        }
        if iso.out_of_target_group.is_none() {
            match api_targets(cloud) {
                Ok(t) if !t.contains(&victim.instance_id) => iso.out_of_target_group = Some(since()),
                Ok(_) => iso.last_status = format!("{} still in the API target group", victim.instance_id),
                Err(e) => iso.last_status = format!("{e:#}"),
            }
        }
        // Last, once the rest is so: a write straight to the cut-off API server.
        if iso.leader.is_some() && iso.leases_moved.is_some() && iso.readyz_failed.is_some() && iso.out_of_target_group.is_some() {
            let data = BTreeMap::from([("written".to_string(), "to the cut-off API server".to_string())]);
            match kubeapi::write_configmap_via(kubeconfig, &direct, super::selfheal::OBJECT_NAMESPACE, REFUSED_WRITE, data) {
                Err(e) => iso.direct_write_refused = Some(first_line(&e.to_string())),
                Ok(()) => {
                    iso.last_status = "a write straight to the cut-off API server was ACCEPTED (split brain)".into();
                    break;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    iso
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or_default().chars().take(160).collect()
}

/// No stale read while the cut lasts: `keys` keys under `keys_prefix` and the ConfigMap `object`
/// were written through the majority during the cut. Read straight from the cut-off member, a
/// linearizable etcd read and a plain API `GET` (what clients send) must fail or see them, never
/// answer from its old copy. Its serializable read shows what that old copy holds (what a stale
/// read would have served; it must differ for the check to mean anything). Returns the line to
/// print, or what was stale.
pub fn stale_reads_refused(kubeconfig: &Path, victim: &MachineInfo, main: &str, keys_prefix: &str, keys: u64, object: &str) -> Result<String, String> {
    let pid = victim.init_pid.ok_or_else(|| format!("{}: no machine", victim.instance_id))?;
    let ep = etcd::endpoint(&victim.root, main).ok_or_else(|| format!("no etcd-{main} manifest on {}", victim.instance_id))?;
    let local = etcd::count(pid, &ep, keys_prefix);
    let etcd_read = match etcd::count_linearizable(pid, &ep, keys_prefix) {
        Ok(n) if n == keys => format!("its linearizable etcd read saw all {n} keys"),
        Ok(n) => return Err(format!("STALE READ: a linearizable etcd read on the cut-off member answered {n}/{keys} keys")),
        // etcdctl's own words are its error's last line (the command comes first).
        Err(e) => format!("its linearizable etcd read refused ({})", first_line(e.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default())),
    };
    let direct = Target { server: Some(format!("https://{}", victim.ip)), tls_server_name: None };
    let api_read = match kubeapi::configmap_data_via(kubeconfig, &direct, super::selfheal::OBJECT_NAMESPACE, object) {
        Ok(Some(_)) => format!("a GET of {object} straight to its API server saw it"),
        Ok(None) => return Err(format!("STALE READ: the cut-off API server answered that {object} (written through the majority) does not exist")),
        Err(e) => format!("a GET of {object} straight to its API server refused ({})", first_line(&e.to_string())),
    };
    let own = local.map(|n| format!("{n}/{keys}")).unwrap_or_else(|| "unreadable".into());
    Ok(format!("no stale read: {etcd_read}; {api_read} (its own copy holds {own} of the keys: what a stale read would serve)"))
}

/// The victim is back: in the API target group and ready.
pub fn rejoined(kubeconfig: &Path, cloud: &Cloud, victim: &MachineInfo) -> Result<(), String> {
    let direct = Target { server: Some(format!("https://{}", victim.ip)), tls_server_name: None };
    kubeapi::readyz_within(kubeconfig, &direct, Duration::from_secs(5))
        .map_err(|e| format!("{}: /readyz: {}", victim.instance_id, first_line(&e.to_string())))?;
    match api_targets(cloud) {
        Ok(t) if t.contains(&victim.instance_id) => {}
        Ok(_) => return Err(format!("{} not back in the API target group", victim.instance_id)),
        Err(e) => return Err(format!("{e:#}")),
    }
    Ok(())
}

/// An error unless the refused write is nowhere.
pub fn refused_write_absent(kubeconfig: &Path) -> anyhow::Result<()> {
    if kubeapi::configmap_data(kubeconfig, super::selfheal::OBJECT_NAMESPACE, REFUSED_WRITE)?.is_some() {
        bail!("the write refused by the cut-off API server exists after all ({REFUSED_WRITE})");
    }
    Ok(())
}
