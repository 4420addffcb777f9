//! Ending the control plane quickly when the machine powers off, so its etcd volumes are free for
//! the replacement sooner.
//!
//! A cloud keeps a terminated instance's volumes attached until its operating system has shut
//! down, and the replacement control plane cannot mount its etcd volumes before that: every second
//! the old machine takes to power off is a second of failover. At poweroff systemd sends SIGTERM to
//! every container at once, so the local etcd stops serving while kube-apiserver is still draining:
//! kube-apiserver's pre-shutdown hooks (removing its address from the `kubernetes` Service's
//! endpoints) and its in-flight requests then wait on an etcd that is gone, and it stays up for 20 s
//! or more (measured: still running 20 s into a poweroff, with its etcd client retrying
//! `127.0.0.1:4001`), and etcd itself took 8–12 s to exit. Nothing waits for that work: the
//! endpoint lease expires on its own, and clients retry through the load balancer.
//!
//! So once protokube has left the API target group and handed etcd leadership over (see
//! [`crate::handover`]), and only when the whole system is stopping (never on a plain `systemctl
//! stop protokube` or restart), it ends what is left: kube-apiserver at once (SIGKILL), and etcd
//! after [`ETCD_GRACE`] more (SIGKILL: etcd's data is durable by design, every committed entry is in
//! its fsynced WAL, and leadership has moved, so this is the power loss etcd is built for).
//!
//! [`processes_named`] is pure over a `/proc`-like directory; [`system_stopping`] and [`end`] are
//! the thin I/O around it.

use std::path::Path;
use std::time::{Duration, Instant};

/// How long etcd gets, after protokube's own hand-over, to finish its SIGTERM on its own.
pub const ETCD_GRACE: Duration = Duration::from_secs(2);
/// The API server's process name.
pub const API_SERVER: &str = "kube-apiserver";
/// etcd's process name.
pub const ETCD: &str = "etcd";

/// The pids under `proc_root` (a `/proc`) whose `comm` is one of `names`, in ascending order.
/// Entries that vanish or cannot be read are skipped.
pub fn processes_named(proc_root: &Path, names: &[&str]) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(proc_root) else { return Vec::new() };
    let mut pids: Vec<u32> = entries
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            names.contains(&comm.trim_end_matches('\n')).then_some(pid)
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// Whether systemd is taking the whole system down (`systemctl is-system-running` says
/// `stopping`), as opposed to stopping or restarting protokube alone.
pub async fn system_stopping() -> bool {
    match tokio::process::Command::new("systemctl").arg("is-system-running").output().await {
        Ok(out) => String::from_utf8_lossy(&out.stdout).trim() == "stopping",
        Err(e) => {
            tracing::warn!(error = %e, "cannot ask systemd whether the system is stopping; leaving the control plane to systemd");
            false
        }
    }
}

/// What [`end`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Ended {
    pub api_servers: Vec<u32>,
    pub etcds: Vec<u32>,
}

/// SIGKILL `pids` now (a blocking `kill -KILL`; failures are logged).
pub fn kill_now(pids: &[u32]) {
    if pids.is_empty() {
        return;
    }
    if let Err(e) = std::process::Command::new("kill").arg("-KILL").args(pids.iter().map(u32::to_string)).output() {
        tracing::warn!(error = %e, ?pids, "kill -KILL failed");
    }
}

async fn kill(pids: &[u32]) {
    if pids.is_empty() {
        return;
    }
    let mut cmd = tokio::process::Command::new("kill");
    cmd.arg("-KILL").args(pids.iter().map(u32::to_string));
    if let Err(e) = cmd.output().await {
        tracing::warn!(error = %e, ?pids, "kill -KILL failed");
    }
}

/// End kube-apiserver now and etcd after [`ETCD_GRACE`] (if it has not exited by then). Call only
/// when [`system_stopping`] says so.
pub async fn end(proc_root: &Path) -> Ended {
    let t = Instant::now();
    let api_servers = processes_named(proc_root, &[API_SERVER]);
    kill(&api_servers).await;
    let deadline = t + ETCD_GRACE;
    let mut etcds = processes_named(proc_root, &[ETCD]);
    while !etcds.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        etcds = processes_named(proc_root, &[ETCD]);
    }
    kill(&etcds).await;
    Ended { api_servers, etcds }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc_dir(entries: &[(&str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().expect("tempdir");
        for (pid, comm) in entries {
            std::fs::create_dir_all(d.path().join(pid)).expect("mkdir");
            std::fs::write(d.path().join(pid).join("comm"), format!("{comm}\n")).expect("write");
        }
        // Not processes: no comm, or not a number.
        std::fs::create_dir_all(d.path().join("sys")).expect("mkdir");
        std::fs::create_dir_all(d.path().join("77")).expect("mkdir");
        d
    }

    #[test]
    fn finds_processes_by_exact_name() {
        let d = proc_dir(&[("12", "kube-apiserver"), ("3", "etcd"), ("40", "etcd"), ("5", "go-runner"), ("6", "etcdctl"), ("8", "kube-apiserve")]);
        assert_eq!(processes_named(d.path(), &[API_SERVER]), vec![12]);
        assert_eq!(processes_named(d.path(), &[ETCD]), vec![3, 40]);
        assert_eq!(processes_named(d.path(), &[ETCD, API_SERVER]), vec![3, 12, 40]);
        assert!(processes_named(d.path(), &["kubelet"]).is_empty());
        assert!(processes_named(&d.path().join("missing"), &[ETCD]).is_empty());
    }

    #[tokio::test]
    async fn end_touches_nothing_but_the_api_server_and_etcd() {
        let d = proc_dir(&[("5", "go-runner"), ("9", "kubelet")]);
        assert_eq!(end(d.path()).await, Ended::default());
    }
}
