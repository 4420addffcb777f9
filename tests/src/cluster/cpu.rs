//! Where a failover's CPU goes: how busy the host's cores were, and how many CPU-seconds one
//! machine's processes used. On this host every machine shares the cores, so a phase that needs
//! more CPU than the cores can give it in the time it has cannot be made faster by ordering alone.
//!
//! Both figures are read from `/proc` (the parsers are pure and unit-tested): the host's from the
//! `cpu` line of `/proc/stat`, a machine's from `/proc/<pid>/stat` of every process under its init
//! (its own time and that of the children it reaped).

use std::collections::HashMap;
use std::fs;

/// Clock ticks per second of `/proc` times (`USER_HZ`: 100 on every Linux architecture this runs on).
const TICKS_PER_S: f64 = 100.0;

/// The host's CPU counters at one moment (`/proc/stat`, in ticks).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostTimes {
    pub busy: u64,
    pub total: u64,
    pub cores: usize,
}

/// Parse `/proc/stat`: the `cpu` line's busy (all but idle and iowait) and total ticks, and the
/// number of `cpuN` lines.
pub fn parse_host(stat: &str) -> Option<HostTimes> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line.split_whitespace().skip(1).filter_map(|f| f.parse().ok()).collect();
    if v.len() < 5 {
        return None;
    }
    // user nice system idle iowait irq softirq steal (guest times are inside user and nice).
    let total: u64 = v.iter().take(8).sum();
    let idle = v[3] + v[4];
    let cores = stat.lines().filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit)).count();
    Some(HostTimes { busy: total - idle, total, cores: cores.max(1) })
}

pub fn host_now() -> Option<HostTimes> {
    parse_host(&fs::read_to_string("/proc/stat").ok()?)
}

/// The share of the host's cores that was busy between two readings (0.0–1.0).
pub fn busy_between(a: &HostTimes, b: &HostTimes) -> Option<f64> {
    let total = b.total.checked_sub(a.total)?;
    (total > 0).then(|| b.busy.saturating_sub(a.busy) as f64 / total as f64)
}

/// One process of `/proc/<pid>/stat`.
#[derive(Debug, Clone, PartialEq)]
pub struct Proc {
    pub pid: i64,
    pub ppid: i64,
    /// Its command name (`comm`).
    pub name: String,
    /// Ticks of its own and of its reaped children: utime + stime + cutime + cstime.
    pub ticks: u64,
}

/// Parse one process's line of `/proc/<pid>/stat`.
pub fn parse_proc_stat(line: &str) -> Option<Proc> {
    let pid = line.split_whitespace().next()?.parse().ok()?;
    let name = line[line.find('(')? + 1..line.rfind(')')?].to_string();
    // The command name may hold spaces and parentheses: the fields go on after the last ')'.
    let rest = &line[line.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // f[0] = state (field 3), so field N is f[N - 3].
    let ppid = f.get(1)?.parse().ok()?;
    let ticks = [11, 12, 13, 14].iter().map(|i| f.get(*i).and_then(|v| v.parse::<u64>().ok())).sum::<Option<u64>>()?;
    Some(Proc { pid, ppid, name, ticks })
}

/// CPU-seconds of `root` and every process under it, in total and by command name (largest
/// first).
pub fn tree_seconds(procs: &[Proc], root: i64) -> (f64, Vec<(String, f64)>) {
    let mut children: HashMap<i64, Vec<usize>> = HashMap::new();
    for (i, p) in procs.iter().enumerate() {
        children.entry(p.ppid).or_default().push(i);
    }
    let Some(start) = procs.iter().position(|p| p.pid == root) else { return (0.0, vec![]) };
    let (mut stack, mut ticks, mut by_name) = (vec![start], 0u64, HashMap::<&str, u64>::new());
    while let Some(i) = stack.pop() {
        ticks += procs[i].ticks;
        *by_name.entry(procs[i].name.as_str()).or_default() += procs[i].ticks;
        stack.extend(children.get(&procs[i].pid).into_iter().flatten().copied());
    }
    let mut names: Vec<(String, f64)> = by_name.into_iter().map(|(n, t)| (n.to_string(), t as f64 / TICKS_PER_S)).collect();
    names.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    (ticks as f64 / TICKS_PER_S, names)
}

/// CPU-seconds the machine whose init is `init` has used since it booted (its processes alive now
/// and the children they reaped), in total and by command name.
pub fn machine_seconds(init: i64) -> (f64, Vec<(String, f64)>) {
    let procs: Vec<Proc> = fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()))
        .filter_map(|e| fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|l| parse_proc_stat(&l))
        .collect();
    tree_seconds(&procs, init)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_counters_and_busy_share() {
        let a = parse_host("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 50 0 25 400 25 0 0 0 0 0\ncpu1 50 0 25 400 25 0 0 0 0 0\nintr 1\n").unwrap();
        assert_eq!(a, HostTimes { busy: 150, total: 1000, cores: 2 });
        let b = parse_host("cpu  250 0 100 850 50 0 0 0 0 0\n").unwrap();
        // 200 of the 250 ticks between them were busy.
        assert_eq!(busy_between(&a, &b), Some(0.8));
        assert_eq!(busy_between(&b, &a), None);
        assert!(parse_host("intr 1\n").is_none());
    }

    #[test]
    fn a_process_line_with_spaces_and_parentheses_in_its_name() {
        let line = "4242 (kube (api) server) S 4200 4242 4242 0 -1 4194560 100 0 0 0 1500 300 20 10 20 0 12 0 5000 1000 100";
        let want = Proc { pid: 4242, ppid: 4200, name: "kube (api) server".into(), ticks: 1500 + 300 + 20 + 10 };
        assert_eq!(parse_proc_stat(line), Some(want));
        assert_eq!(parse_proc_stat("garbage"), None);
    }

    #[test]
    fn a_tree_counts_its_descendants_only() {
        let p = |pid, ppid, name: &str, ticks| Proc { pid, ppid, name: name.into(), ticks };
        let procs = [p(1, 0, "init", 1000), p(10, 1, "etcd", 100), p(11, 10, "sh", 50), p(12, 11, "etcd", 25), p(20, 1, "sh", 7), p(30, 2, "other", 999)];
        let (total, names) = tree_seconds(&procs, 10);
        assert_eq!(total, 1.75);
        assert_eq!(names, vec![("etcd".to_string(), 1.25), ("sh".to_string(), 0.5)]);
        assert_eq!(tree_seconds(&procs, 1).0, 11.82);
        assert_eq!(tree_seconds(&procs, 99), (0.0, vec![]));
    }
}
