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

/// Pair each worker's user-data start with its Node (by internal IP) and that Node's Ready time.
pub fn pair(starts: &[(String, i64)], nodes: &BTreeMap<String, NodeState>) -> Vec<WorkerBoot> {
    let mut out: Vec<WorkerBoot> = starts
        .iter()
        .filter_map(|(ip, start)| {
            let (name, n) = nodes.iter().find(|(_, n)| n.internal_ip.as_deref() == Some(ip.as_str()))?;
            let ready = n.ready_since.filter(|_| n.ready)?;
            Some(WorkerBoot { node: name.clone(), seconds: ready - start })
        })
        .collect();
    out.sort_by(|a, b| a.node.cmp(&b.node));
    out
}

/// The workers' boots (machines of role `node` that run).
pub fn worker_boots(machines: &[MachineInfo], nodes: &BTreeMap<String, NodeState>) -> Vec<WorkerBoot> {
    let starts: Vec<(String, i64)> = machines
        .iter()
        .filter(|m| m.role == "node")
        .filter_map(|m| {
            let out = machine::exec_in(
                m.init_pid?,
                &["systemctl", "show", "-p", "InactiveExitTimestamp", "--timestamp=unix", "--value", crate::rootfs::USER_DATA_UNIT],
            )
            .ok()?;
            Some((m.ip.clone(), parse_unix(&out)?))
        })
        .collect();
    pair(&starts, nodes)
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
            ready_since: since,
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
        let boots = pair(&starts, &nodes);
        assert_eq!(boots, vec![WorkerBoot { node: "w-a".into(), seconds: 12 }, WorkerBoot { node: "w-b".into(), seconds: 14 }]);
        assert_eq!(summary(&boots).expect("line"), "worker boot (user-data start → Ready Node, ±1 s): w-a 12 s, w-b 14 s; median 14 s");
        assert_eq!(summary(&[]), None);
    }
}
