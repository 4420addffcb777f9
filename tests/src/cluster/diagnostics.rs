//! What went wrong: known blockers in the machines' boot logs, failed units and journal tails,
//! and what decides whether Nodes come and go.

use std::fs;
use std::path::{Path, PathBuf};

use crate::cmd;
use crate::machine;

use super::health::control_planes;
use super::state::ClusterState;

/// The last `n` lines of a log file.
pub(super) fn tail(path: &Path, n: usize) -> String {
    let t = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = t.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Known failures of the product that no amount of waiting fixes, found in a machine's boot log.
pub fn blocker(cs: &ClusterState) -> Option<String> {
    const KNOWN: &[(&str, &str)] = &[
        ("s3:// is not built in", "this nodeup build cannot read an s3:// ConfigBase (the spec's state store is in S3)"),
        ("ConfigBase s3://", "this protokube build cannot read an s3:// ConfigBase"),
    ];
    for m in &cs.machines {
        let Some(pid) = m.init_pid.filter(|p| cmd::alive(*p)) else { continue };
        let log = machine::exec_in(pid, &["journalctl", "-b", "--no-pager", "-o", "cat", "-u", "keelson-user-data", "-u", "protokube"]).unwrap_or_default();
        for (needle, what) in KNOWN {
            if let Some(line) = log.lines().find(|l| l.contains(needle)) {
                return Some(format!("{what}\n  {}: {}", m.instance_id, line.trim()));
            }
        }
    }
    None
}

/// What went wrong inside the machines: failed units and the tail of the boot journal.
pub fn diagnose(cs: &ClusterState) -> String {
    let mut s = format!("{}\n", crate::disk::report(&crate::paths::state_dir()));
    for m in &cs.machines {
        let Some(pid) = m.init_pid.filter(|p| cmd::alive(*p)) else { continue };
        let failed = machine::exec_in(pid, &["systemctl", "--failed", "--no-legend", "--plain"]).unwrap_or_default();
        let ud = machine::exec_in(
            pid,
            &["journalctl", "-b", "--no-pager", "-n", "15", "-o", "cat", "-u", "keelson-user-data", "-u", "protokube", "-u", "kubelet", "-u", "containerd"],
        )
        .unwrap_or_default();
        s.push_str(&format!("--- {} ({} {}): failed units: {}\n{}\n", m.instance_id, m.role, m.ip, failed.trim(), ud.trim()));
        // Each failed unit's own last lines: in the journal above they drown among the
        // agents' retries.
        for unit in failed_units(&failed) {
            let own = machine::exec_in(pid, &["journalctl", "-b", "--no-pager", "-n", "25", "-o", "cat", "-u", unit]).unwrap_or_default();
            s.push_str(&format!("--- {} {unit}, its last lines:\n{}\n", m.instance_id, own.trim()));
        }
    }
    for (id, e) in &cs.failed {
        s.push_str(&format!("--- {id}: machine failed to start: {e}\n"));
    }
    s
}

/// The unit names of `systemctl --failed --no-legend --plain`'s lines.
fn failed_units(listing: &str) -> impl Iterator<Item = &str> {
    listing.lines().filter_map(|l| l.split_whitespace().next()).filter(|u| u.contains('.'))
}

/// What decides whether Nodes come and go: every Node the API holds (ready, provider id, taints)
/// and, from the cloud-controller-manager's and kube-controller-manager's logs on every live
/// control plane (the kubelet's pod log files in the machine's root), the last 60 errors, warnings,
/// leadership lines and lines about a Node that is not ready.
pub fn diagnose_nodes(cs: &ClusterState, kubeconfig: &Path) -> String {
    let mut s = String::new();
    let mut not_ready = Vec::new();
    match crate::kubeapi::nodes(kubeconfig) {
        Ok(nodes) => {
            for (name, n) in nodes {
                s.push_str(&format!("node {name}: ready {} ip {:?} provider {:?} taints {:?}\n", n.ready, n.internal_ip, n.provider_id, n.taints));
                if !n.ready {
                    not_ready.push(name);
                }
            }
        }
        Err(e) => s.push_str(&format!("nodes: {e}\n")),
    }
    for m in control_planes(cs) {
        let pods = m.root.join("var/log/pods");
        let Ok(dirs) = std::fs::read_dir(&pods) else { continue };
        for d in dirs.flatten() {
            let name = d.file_name().to_string_lossy().to_string();
            if !(name.contains("cloud-controller-manager") || name.contains("kube-controller-manager")) {
                continue;
            }
            let Ok(containers) = std::fs::read_dir(d.path()) else { continue };
            for c in containers.flatten() {
                let Ok(logs) = std::fs::read_dir(c.path()) else { continue };
                let mut logs: Vec<PathBuf> = logs.flatten().map(|l| l.path()).collect();
                logs.sort();
                let Some(last) = logs.last() else { continue };
                let text = std::fs::read_to_string(last).unwrap_or_default();
                // Errors, warnings, leadership and anything about a Node that is not ready.
                let lines: Vec<&str> = text
                    .lines()
                    .filter(|l| {
                        let msg = l.splitn(4, ' ').nth(3).unwrap_or("");
                        msg.starts_with('E') || msg.starts_with('W') || l.contains("leader") || not_ready.iter().any(|n| l.contains(n.as_str()))
                    })
                    .collect();
                s.push_str(&format!("--- {} {}: errors, warnings, leadership and not-ready nodes in {}\n", m.instance_id, m.ip, last.display()));
                for l in &lines[lines.len().saturating_sub(60)..] {
                    s.push_str(l);
                    s.push('\n');
                }
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_units_are_the_first_column() {
        let listing = "keelson-user-data.service loaded failed failed Run the instance user-data\nkubelet.service loaded failed failed kubelet\n\n";
        assert_eq!(failed_units(listing).collect::<Vec<_>>(), ["keelson-user-data.service", "kubelet.service"]);
    }
}
