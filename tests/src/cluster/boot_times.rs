//! How long a worker takes to boot: from its user-data starting (the boot script that fetches and
//! runs nodeup, the join by cloud identity included) to its Node's Ready condition turning True.
//! Both ends are whole seconds (systemd's `--timestamp=unix`, the API's RFC 3339 times), so each
//! figure is ±1 s.

use std::collections::BTreeMap;

use crate::kubeapi::NodeState;
use crate::machine::{self, MachineInfo};

/// One worker's boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerBoot {
    pub node: String,
    pub seconds: i64,
}

/// `@1764140000` (systemctl's `--timestamp=unix`) → unix seconds; `None` for an unset timestamp.
pub fn parse_unix(value: &str) -> Option<i64> {
    value.trim().strip_prefix('@')?.parse().ok().filter(|s| *s > 0)
}

/// Pair each worker's user-data start with its Node (by internal IP) and that Node's Ready time;
/// a worker with no Ready Node at its address is named in the second list.
pub fn pair(starts: &[(String, i64)], nodes: &BTreeMap<String, NodeState>) -> (Vec<WorkerBoot>, Vec<String>) {
    let mut out = Vec::new();
    let mut unpaired = Vec::new();
    for (ip, start) in starts {
        let found = nodes.iter().find(|(_, n)| n.internal_ip.as_deref() == Some(ip.as_str()));
        match found.and_then(|(name, n)| Some((name, n.ready_since.filter(|_| n.ready)?))) {
            Some((name, ready)) => out.push(WorkerBoot { node: name.clone(), seconds: ready - start }),
            None => unpaired.push(match found {
                Some((name, _)) => format!("{ip}: Node {name} not Ready"),
                None => format!("{ip}: no Node with this InternalIP"),
            }),
        }
    }
    out.sort_by(|a, b| a.node.cmp(&b.node));
    (out, unpaired)
}

/// How the harness re-asks a loaded host before reporting a worker as not measured: its systemd
/// can be slow to answer on its bus, the API server to list Nodes. Five tries, one second apart.
fn retries() -> backon::ConstantBuilder {
    backon::ConstantBuilder::default().with_delay(std::time::Duration::from_secs(1)).with_max_times(4)
}

/// One worker's user-data start (unix seconds), or why it could not be read.
fn user_data_start(m: &MachineInfo) -> Result<i64, String> {
    use backon::BlockingRetryable as _;
    let init = m.init_pid.ok_or_else(|| format!("{}: not running", m.ip))?;
    let argv = ["systemctl", "show", "-p", "InactiveExitTimestamp", "--timestamp=unix", "--value", crate::rootfs::USER_DATA_UNIT];
    let read = || {
        let out = machine::exec_in(init, &argv).map_err(|e| e.to_string())?;
        parse_unix(&out).ok_or_else(|| format!("{} InactiveExitTimestamp is {:?}", crate::rootfs::USER_DATA_UNIT, out.trim()))
    };
    read.retry(retries()).call().map_err(|e| format!("{}: {e}", m.ip))
}

/// The workers' boots (machines of role `node` that run), and for each worker not measured, why.
pub fn worker_boots(machines: &[MachineInfo], nodes: &BTreeMap<String, NodeState>) -> (Vec<WorkerBoot>, Vec<String>) {
    let mut starts = Vec::new();
    let mut problems = Vec::new();
    for m in machines.iter().filter(|m| m.role == "node") {
        match user_data_start(m) {
            Ok(t) => starts.push((m.ip.clone(), t)),
            Err(e) => problems.push(e),
        }
    }
    let (boots, unpaired) = pair(&starts, nodes);
    problems.extend(unpaired);
    (boots, problems)
}

/// `worker boot (user-data start → Ready Node): a 14 s, b 15 s; median 14 s`, or `None` without workers.
pub fn summary(boots: &[WorkerBoot]) -> Option<String> {
    if boots.is_empty() {
        return None;
    }
    let mut secs: Vec<i64> = boots.iter().map(|b| b.seconds).collect();
    secs.sort();
    let each: Vec<String> = boots.iter().map(|b| format!("{} {} s", b.node, b.seconds)).collect();
    Some(format!("worker boot (user-data start → Ready Node, ±1 s): {}; median {} s", each.join(", "), secs[secs.len() / 2]))
}

/// The line `up` prints once the cluster is healthy: [`summary`] of every worker's boot, or why a
/// worker's boot was not measured (never silently nothing: the e2e tests check this line).
pub fn report(cs: &super::ClusterState) -> String {
    use backon::BlockingRetryable as _;
    let list = || crate::kubeapi::nodes(std::path::Path::new(&cs.kubeconfig));
    let nodes = match list.retry(retries()).call() {
        Ok(n) => n,
        Err(e) => return format!("worker boot not measured: listing the Nodes failed: {e}"),
    };
    let (boots, problems) = worker_boots(&cs.machines, &nodes);
    let line = summary(&boots);
    if problems.is_empty() {
        return line.unwrap_or_else(|| "worker boot not measured: no workers".into());
    }
    let measured = line.map(|l| format!("{l}; ")).unwrap_or_default();
    format!("{measured}worker boot not measured for {}", problems.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(ip: &str, ready: bool, since: Option<i64>) -> NodeState {
        NodeState {
            ready,
            internal_ip: Some(ip.into()),
            provider_id: None,
            pod_cidr: None,
            taints: vec![],
            labels: BTreeMap::new(),
            provider_id_managers: vec![],
            kubelet_version: String::new(),
            os_image: String::new(),
            ready_since: since,
            ready_heartbeat: None,
            ready_reason: String::new(),
        }
    }

    #[test]
    fn pairs_by_address_and_skips_what_is_not_ready() {
        assert_eq!(parse_unix("@1764140000\n"), Some(1_764_140_000));
        assert_eq!(parse_unix(""), None);
        assert_eq!(parse_unix("@0"), None);
        let nodes = BTreeMap::from([
            ("w-b".to_string(), node("10.0.0.3", true, Some(1_000_015))),
            ("w-a".to_string(), node("10.0.0.2", true, Some(1_000_012))),
            ("w-c".to_string(), node("10.0.0.4", false, Some(1_000_009))),
        ]);
        let starts = vec![("10.0.0.2".to_string(), 1_000_000), ("10.0.0.3".to_string(), 1_000_001), ("10.0.0.4".to_string(), 1_000_000)];
        let (boots, unpaired) = pair(&starts, &nodes);
        assert_eq!(unpaired, vec!["10.0.0.4: Node w-c not Ready".to_string()]);
        assert_eq!(pair(&[("10.0.0.9".to_string(), 1)], &nodes).1, vec!["10.0.0.9: no Node with this InternalIP".to_string()]);
        assert_eq!(boots, vec![WorkerBoot { node: "w-a".into(), seconds: 12 }, WorkerBoot { node: "w-b".into(), seconds: 14 }]);
        assert_eq!(summary(&boots).expect("line"), "worker boot (user-data start → Ready Node, ±1 s): w-a 12 s, w-b 14 s; median 14 s");
        assert_eq!(summary(&[]), None);
    }
}
