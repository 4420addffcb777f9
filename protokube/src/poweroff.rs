//! Ending the control plane quickly and cleanly when the machine powers off, so that clients of
//! the API load balancer see no refused connection and the etcd volumes are free for the
//! replacement soon.
//!
//! A cloud keeps a terminated instance's volumes attached until its operating system has shut
//! down, and the replacement control plane cannot mount its etcd volumes before that: every second
//! the old machine takes to power off is a second of failover. Left to systemd, every container
//! gets SIGTERM at the moment protokube does: kube-apiserver stopped listening while the load
//! balancer still sent it new connections (refused: measured 1–4 failed `/readyz` probes through
//! the load balancer, outages up to 4.5 s per unplanned loss), etcd stopped serving while
//! kube-apiserver drained (its shutdown hooks and in-flight requests then waited on an etcd that
//! was gone: still running 20 s into a poweroff), and protokube handed leadership over from a
//! member already stopping.
//!
//! So the containers stop only after protokube (nodeup's drop-in for every container scope), and
//! protokube, only when the whole system is stopping (never on a plain `systemctl stop protokube`
//! or restart), does it in order:
//!
//! 1. it leaves the API target group (see [`crate::api_target`]; the cloud may have taken a
//!    terminated instance out already);
//! 2. for [`API_DRAIN`] it lets the load balancer stop sending new connections — the API server
//!    keeps serving meanwhile — while etcd leadership is handed over ([`crate::handover`]);
//! 3. it ends kube-apiserver (SIGTERM, SIGKILL after [`API_SERVER_GRACE`]), then etcd (SIGTERM,
//!    SIGKILL after [`ETCD_GRACE`]: its data is durable by design, every committed entry is in
//!    its fsynced WAL, and leadership has moved, so even the SIGKILL is the power loss etcd is
//!    built for).
//!
//! [`processes_named`] is pure over a `/proc`-like directory; [`system_stopping`] and [`end`] are
//! the thin I/O around it.

use std::path::Path;
use std::time::{Duration, Instant};

/// How long the API server keeps serving after this control plane left the API target group (or
/// the cloud took it out, as it does for a terminated instance), for the load balancer to stop
/// sending it new connections: the local cloud's balancer follows the target group every second.
/// It overlaps the etcd hand-over, and it lengthens the poweroff, which holds the etcd volumes
/// from the replacement: raise it (protokube's `--api-drain-seconds`) where the load balancer
/// takes longer to apply a deregistration.
pub const API_DRAIN: Duration = Duration::from_secs(2);
/// How long kube-apiserver gets after SIGTERM (its in-flight requests; HTTP/2 clients are told to
/// go away) before SIGKILL. Measured on keelson-local: it had not exited 2 s after SIGTERM.
pub const API_SERVER_GRACE: Duration = Duration::from_secs(1);
/// How long etcd gets after SIGTERM, its leadership handed over, before SIGKILL.
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
    /// Those still there when their grace ran out (SIGKILLed).
    pub killed: Vec<u32>,
}

/// SIGKILL `pids` now (failures are logged).
pub fn kill_now(pids: &[u32]) {
    signal("KILL", pids);
}

/// SIGSTOP `pids` now: they stay (their container keeps running, so the kubelet does not start
/// them again) but do nothing more; systemd's SIGTERM at poweroff comes with a SIGCONT.
pub fn freeze(pids: &[u32]) {
    signal("STOP", pids);
}

/// Send `sig` to `pids` with `kill` (a blocking call of a few milliseconds; failures are logged).
fn signal(sig: &str, pids: &[u32]) {
    if pids.is_empty() {
        return;
    }
    if let Err(e) = std::process::Command::new("kill").arg(format!("-{sig}")).args(pids.iter().map(u32::to_string)).output() {
        tracing::warn!(error = %e, ?pids, signal = sig, "kill failed");
    }
}

/// Whether `pid` under `proc_root` is a process that has not exited (an exited one waiting for its
/// parent to reap it is state `Z`).
pub fn running(proc_root: &Path, pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")) else { return false };
    // `pid (comm) state …`: the state follows the last ')' (comm may hold one).
    stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()).is_some_and(|state| state != "Z" && state != "X")
}

/// SIGTERM `pids`, wait up to `grace` for them to exit, SIGKILL those left; returns those.
pub async fn terminate(proc_root: &Path, pids: &[u32], grace: Duration) -> Vec<u32> {
    signal("TERM", pids);
    let deadline = Instant::now() + grace;
    let mut left: Vec<u32> = pids.to_vec();
    loop {
        left.retain(|p| running(proc_root, *p));
        if left.is_empty() || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    signal("KILL", &left);
    left
}

/// End kube-apiserver (SIGTERM; SIGKILL after [`API_SERVER_GRACE`]), then etcd (the same, after
/// [`ETCD_GRACE`]). Call only when [`system_stopping`] says so, after the hand-over.
pub async fn end(proc_root: &Path) -> Ended {
    let api_servers = processes_named(proc_root, &[API_SERVER]);
    let mut killed = terminate(proc_root, &api_servers, API_SERVER_GRACE).await;
    let etcds = processes_named(proc_root, &[ETCD]);
    killed.extend(terminate(proc_root, &etcds, ETCD_GRACE).await);
    Ended { api_servers, etcds, killed }
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
    async fn terminate_waits_for_an_exit_and_kills_what_ignores_sigterm() {
        let proc_root = Path::new("/proc");
        // One child exits on SIGTERM; the other ignores it and is SIGKILLed after the grace.
        let mut polite = std::process::Command::new("sleep").arg("30").spawn().expect("spawn sleep");
        let mut stubborn = std::process::Command::new("sh").args(["-c", "trap '' TERM; while :; do sleep 1; done"]).spawn().expect("spawn sh");
        std::thread::sleep(Duration::from_millis(200));
        let (a, b) = (polite.id(), stubborn.id());
        assert!(running(proc_root, a) && running(proc_root, b));
        let t = Instant::now();
        assert_eq!(terminate(proc_root, &[a], Duration::from_secs(5)).await, Vec::<u32>::new(), "exited on SIGTERM: not killed");
        assert!(t.elapsed() < Duration::from_secs(4), "returned as soon as it exited, not after the grace: {:?}", t.elapsed());
        let t = Instant::now();
        assert_eq!(terminate(proc_root, &[b], Duration::from_millis(600)).await, vec![b], "ignored SIGTERM: killed");
        assert!(t.elapsed() >= Duration::from_millis(600), "waited its grace first");
        let status = stubborn.wait().expect("wait");
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(9), "SIGKILLed: {status:?}");
        let status = polite.wait().expect("wait");
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(15), "ended by SIGTERM: {status:?}");
        assert!(!running(proc_root, a) && !running(proc_root, b));
    }

    #[tokio::test]
    async fn end_touches_nothing_but_the_api_server_and_etcd() {
        let d = proc_dir(&[("5", "go-runner"), ("9", "kubelet")]);
        assert_eq!(end(d.path()).await, Ended::default());
    }
}
