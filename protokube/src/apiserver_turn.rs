//! One API server restarts at a time.
//!
//! A certificate renewal restarts this control plane's kube-apiserver (its static pod, see
//! [`crate::certs`]). Every control plane renews on its own schedule, spread by a per-host skew of
//! up to a tenth of the lifetime — with a year's certificates days apart, but nothing stops two or
//! three restarts from overlapping (short lifetimes, clocks, a pass delayed by a busy host), and
//! then no API server answers behind the load balancer.
//!
//! So before it restarts its API server, protokube takes the cluster's restart **turn**: a
//! compare-and-swap key in etcd main ([`TURN_KEY`], value `<host>@<unix seconds>`), the same
//! mechanism that gives each backup slot one writer. It holds the turn until its old API server
//! process is gone and the new one answers `/readyz` [`READY_AFTER`] times in a row (at most
//! [`RESTART_TIMEOUT`]), then gives it back. A holder that dies leaves a turn that anyone may take
//! once it is [`TURN_TTL`] old.
//!
//! The old kube-apiserver stops listening at once on SIGTERM but its process does not exit until
//! the kubelet kills it after the pod's 30-s grace period (kubernetes/kubernetes#131052); the new
//! one starts only after that. Meanwhile this host's kubelet, which reaches its own API server,
//! renews no lease: on a loaded host the whole restart took 45–50 s, against the node controller's
//! 50-s grace, and the control plane's Node went NotReady. So once the old process has stopped
//! answering for [`LINGER`] (its in-flight requests done), the holder ends it (SIGKILL), as the
//! kubelet would 25 s later.
//!
//! Waiting never puts expiry at risk: a restart waits for the turn at most [`MAX_WAIT`], and never
//! more than half of what is left of the certificate the API server still serves
//! ([`wait_bound`]); then it restarts without the turn and says so. An API server that is not
//! ready before the restart is not serving anyway: it restarts at once, without a turn. etcd not
//! answering is the same: the restart goes ahead (logged).
//!
//! [`turn_free`] and [`wait_bound`] are the decisions (pure); [`take_turn_and_restart`] is the
//! sequence around any [`Readiness`] (tests drive it with a fake); [`Coordinator`] is the
//! production wiring (the local member of etcd main, the local `/readyz`, `/proc`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use crate::api_target::{LocalReadyz, Readiness};
use crate::config::EtcdCluster;
use crate::etcd;

/// The etcd key (in etcd main) whose holder may restart its API server.
pub const TURN_KEY: &str = "/keelson.io/apiserver-restart/turn";
/// A turn older than this is free again (its holder died or hung). Longer than a restart may take.
pub const TURN_TTL: Duration = Duration::from_secs(180);
/// Longest a restart waits for the turn (less when the old certificate has less than twice this left).
pub const MAX_WAIT: Duration = Duration::from_secs(300);
/// Longest the holder waits for its new API server to be ready before it gives the turn back.
pub const RESTART_TIMEOUT: Duration = Duration::from_secs(150);
/// `/readyz` answers in a row that make the restarted API server ready.
pub const READY_AFTER: u32 = 2;
/// Time between tries for a taken turn, and between checks of the restarting API server.
pub const POLL: Duration = Duration::from_secs(1);
/// How long an old API server that no longer answers `/readyz` may linger before it is ended.
pub const LINGER: Duration = Duration::from_secs(5);

/// The value a holder writes: `<host>@<unix seconds>`.
pub fn turn_value(host: &str, now_unix: i64) -> String {
    format!("{host}@{now_unix}")
}

/// Whether `me` may take the turn at `now_unix` over the current value: nobody holds it (no key, an
/// empty value, or not a turn at all), `me` already holds it (a restarted protokube), or the
/// holder's turn is [`TURN_TTL`] old.
pub fn turn_free(current: Option<&str>, me: &str, now_unix: i64) -> bool {
    let Some((holder, at)) = current.and_then(|c| c.rsplit_once('@')) else { return true };
    if holder == me {
        return true;
    }
    let Ok(at) = at.parse::<i64>() else { return true };
    now_unix.saturating_sub(at) >= TURN_TTL.as_secs() as i64
}

/// How long a restart may wait for the turn when the certificate it replaces has `left` before it
/// expires: [`MAX_WAIT`], or half of `left` when that is shorter.
pub fn wait_bound(left: Duration) -> Duration {
    MAX_WAIT.min(left / 2)
}

/// The cluster-wide turn, in one etcd.
pub trait Turn {
    /// Try once; `Ok(false)`: someone else holds it (their value is logged by the caller).
    fn try_take(&self, me: &str, now_unix: i64) -> impl std::future::Future<Output = Result<bool, String>> + Send;
    /// Give it back if `me` holds it.
    fn give_back(&self, me: &str) -> impl std::future::Future<Output = Result<(), String>> + Send;
    /// Who holds it now (for the log).
    fn holder(&self) -> impl std::future::Future<Output = Option<String>> + Send;
}

/// The turn in an etcd cluster reached through `client`.
pub struct EtcdTurn {
    pub client: etcd::Client,
}

impl Turn for EtcdTurn {
    async fn try_take(&self, me: &str, now_unix: i64) -> Result<bool, String> {
        self.client.claim(TURN_KEY, &turn_value(me, now_unix), |cur| turn_free(cur, me, now_unix)).await.map_err(|e| e.to_string())
    }

    async fn give_back(&self, me: &str) -> Result<(), String> {
        let mine = format!("{me}@");
        self.client.claim(TURN_KEY, "", |cur| cur.is_some_and(|c| c.starts_with(&mine))).await.map(|_| ()).map_err(|e| e.to_string())
    }

    async fn holder(&self) -> Option<String> {
        self.client.get(TURN_KEY).await.ok().flatten().map(|(v, _)| v).filter(|v| !v.is_empty())
    }
}

/// How one restart went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Restarted in turn; the new API server was ready after `ready_after`.
    InTurn { waited: Duration, ready_after: Duration },
    /// Restarted in turn, but the new API server was not ready within [`RESTART_TIMEOUT`].
    NotReadyInTime { waited: Duration },
    /// Restarted without the turn, and why.
    WithoutTurn(&'static str),
}

fn unix_now() -> i64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

/// Whether any of `pids` is still a `kube-apiserver` under `proc_root`.
fn any_alive(proc_root: &Path, pids: &[u32]) -> bool {
    pids.iter().any(|p| std::fs::read_to_string(proc_root.join(p.to_string()).join("comm")).is_ok_and(|c| c.trim_end() == crate::poweroff::API_SERVER))
}

/// Restart this host's API server (`restart`: annotate its static pod) in turn: take the turn
/// (waiting at most `max_wait`), restart, wait until the old process under `proc_root` is gone (or,
/// when none was seen, `/readyz` failed once) and `/readyz` answers [`READY_AFTER`] times in a row,
/// give the turn back. An old process that has not answered for [`LINGER`] but is still there is
/// ended with `end_lingering` (its pids). See the module documentation for when it goes ahead
/// without the turn.
#[allow(clippy::too_many_arguments)]
pub async fn take_turn_and_restart<T: Turn, R: Readiness, E>(
    turn: Option<&T>,
    readyz: &mut R,
    proc_root: &Path,
    me: &str,
    max_wait: Duration,
    restart: impl FnOnce() -> Result<(), E>,
    end_lingering: impl Fn(&[u32]),
) -> Result<Outcome, E> {
    let Some(turn) = turn else {
        restart()?;
        return Ok(Outcome::WithoutTurn("no etcd client for the turn"));
    };
    if !readyz.ready().await {
        restart()?;
        return Ok(Outcome::WithoutTurn("the API server was not ready: nothing to keep serving"));
    }
    let start = Instant::now();
    let mut logged_holder = None;
    let taken = loop {
        match turn.try_take(me, unix_now()).await {
            Ok(true) => break true,
            Ok(false) => {
                let holder = turn.holder().await;
                if holder != logged_holder {
                    tracing::info!(holder = ?holder, "API server restart: another control plane's API server is restarting; waiting for the turn");
                    logged_holder = holder;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "API server restart: the turn could not be read in etcd; restarting without it");
                restart()?;
                return Ok(Outcome::WithoutTurn("etcd did not answer"));
            }
        }
        if start.elapsed() >= max_wait {
            break false;
        }
        tokio::time::sleep(POLL).await;
    };
    let waited = start.elapsed();
    if !taken {
        tracing::warn!(waited_s = waited.as_secs_f64(), "API server restart: the turn was not free in time; restarting without it");
        restart()?;
        return Ok(Outcome::WithoutTurn("the turn was not free in time"));
    }
    tracing::info!(waited_s = waited.as_secs_f64(), "API server restart: turn taken");
    let old = crate::poweroff::processes_named(proc_root, &[crate::poweroff::API_SERVER]);
    if let Err(e) = restart() {
        give_back(turn, me).await;
        return Err(e);
    }
    let restarted = Instant::now();
    let (mut saw_not_ready, mut in_a_row) = (false, 0u32);
    let (mut silent_since, mut ended) = (None::<Instant>, false);
    let outcome = loop {
        tokio::time::sleep(POLL).await;
        let ready = readyz.ready().await;
        saw_not_ready |= !ready;
        silent_since = if ready { None } else { silent_since.or(Some(Instant::now())) };
        let old_gone = if old.is_empty() { saw_not_ready } else { !any_alive(proc_root, &old) };
        if !ended && !old_gone && silent_since.is_some_and(|t| t.elapsed() >= LINGER) {
            tracing::info!(pids = ?old, "API server restart: the old kube-apiserver stopped serving but has not exited; ending it");
            end_lingering(&old);
            ended = true;
        }
        in_a_row = if ready && old_gone { in_a_row + 1 } else { 0 };
        if in_a_row >= READY_AFTER {
            break Outcome::InTurn { waited, ready_after: restarted.elapsed() };
        }
        if restarted.elapsed() >= RESTART_TIMEOUT {
            tracing::warn!("API server restart: not ready again within {RESTART_TIMEOUT:?}; giving the turn back");
            break Outcome::NotReadyInTime { waited };
        }
    };
    give_back(turn, me).await;
    Ok(outcome)
}

async fn give_back<T: Turn>(turn: &T, me: &str) {
    match turn.give_back(me).await {
        Ok(()) => tracing::info!("API server restart: turn given back"),
        Err(e) => tracing::warn!(error = %e, "API server restart: giving the turn back failed; it frees itself after {TURN_TTL:?}"),
    }
}

/// The production wiring: the turn in this host's member of etcd main, the local API server's
/// `/readyz`, the host's `/proc`.
pub struct Coordinator {
    pub root: PathBuf,
    pub cluster_name: String,
    pub internal_ip: String,
    /// etcd main, and this host's member of it.
    pub etcd: EtcdCluster,
    pub member: String,
    /// The host (instance id): the holder's name.
    pub host: String,
    pub readyz: tokio::sync::Mutex<LocalReadyz>,
}

impl Coordinator {
    /// API server restarts for new certificates take turns in etcd main (one at a time): the
    /// coordinator of this host's member of etcd main, `None` without one (restarts at once).
    pub fn for_plan(plan: &crate::config::Plan, root: PathBuf, store: base::StateStore, me: &cloud::Identity) -> Option<Coordinator> {
        let main = plan.etcd_clusters.iter().find(|c| c.name == "main")?;
        let member = plan.my_members(main).first()?.name.clone();
        Some(Coordinator {
            root,
            cluster_name: plan.cluster_name.clone(),
            internal_ip: me.internal_ip.clone(),
            etcd: main.clone(),
            member,
            host: me.instance_id.clone(),
            readyz: tokio::sync::Mutex::new(LocalReadyz::new(store, plan.local_api_server())),
        })
    }

    /// Restart in turn; `left` is what the served certificate has before it expires.
    pub async fn restart<E>(&self, left: Duration, restart: impl FnOnce() -> Result<(), E>) -> Result<Outcome, E> {
        let client = crate::backup::local_client(&self.root, &self.cluster_name, &self.internal_ip, &self.etcd, &self.member, Duration::from_secs(5));
        let turn = client.map(|client| EtcdTurn { client });
        let mut readyz = self.readyz.lock().await;
        let proc_root = crate::paths::under(&self.root, "/proc");
        let live = proc_root == Path::new("/proc");
        let end_lingering = |pids: &[u32]| {
            // Only this host's own processes: never pids read from another root.
            if live {
                crate::poweroff::kill_now(pids);
            }
        };
        let outcome = take_turn_and_restart(turn.as_ref(), &mut *readyz, &proc_root, &self.host, wait_bound(left), restart, end_lingering).await?;
        tracing::info!(outcome = ?outcome, "API server restarted for its new certificates");
        Ok(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_is_free_when_unheld_mine_or_stale() {
        let ttl = TURN_TTL.as_secs() as i64;
        let now = 1_800_000_000;
        // (current, free for "i-a"?)
        let table: [(Option<String>, bool); 8] = [
            (None, true),
            (Some(String::new()), true),
            (Some("garbage".into()), true),
            (Some(turn_value("i-a", now - 5)), true),
            (Some(turn_value("i-b", now - 5)), false),
            (Some(turn_value("i-b", now - ttl + 1)), false),
            (Some(turn_value("i-b", now - ttl)), true),
            (Some("i-b@not-a-time".into()), true),
        ];
        for (i, (cur, free)) in table.iter().enumerate() {
            assert_eq!(turn_free(cur.as_deref(), "i-a", now), *free, "case {i}: {cur:?}");
        }
        // A host name with '@' in it still parses by the last '@'.
        assert!(!turn_free(Some(&turn_value("a@b", now)), "i-a", now));
    }

    #[test]
    fn waiting_never_takes_more_than_half_of_what_is_left() {
        assert_eq!(wait_bound(Duration::from_secs(365 * 86400)), MAX_WAIT);
        assert_eq!(wait_bound(Duration::from_secs(200)), Duration::from_secs(100));
        assert_eq!(wait_bound(Duration::ZERO), Duration::ZERO);
    }
}
