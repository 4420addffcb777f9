//! Stopping protokube (SIGTERM or SIGINT, loop mode): leave the API target group, hand etcd and
//! the controllers' leadership over, and at poweroff end kube-apiserver and etcd
//! ([`crate::poweroff`]), each step bounded.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::reconcile::Agent;

/// The API target group task: its stop switch and its handle.
pub type ApiTargetTask = (tokio::sync::watch::Sender<bool>, tokio::task::JoinHandle<()>);

/// What asks protokube to stop: SIGTERM (systemd, at poweroff or `systemctl stop`) or SIGINT.
pub struct StopSignals {
    terminate: tokio::signal::unix::Signal,
}

impl StopSignals {
    /// Listen for SIGTERM (SIGINT needs no set-up).
    pub fn listen() -> std::io::Result<StopSignals> {
        Ok(StopSignals { terminate: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())? })
    }

    /// The next stop request: `"interrupted"` or `"terminated"`.
    pub async fn requested(&mut self) -> &'static str {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => "interrupted",
            _ = self.terminate.recv() => "terminated",
        }
    }
}

/// How long [`leave`] may take over each of its steps.
#[derive(Clone, Copy)]
pub struct Bounds {
    pub handover: Duration,
    pub api_drain: Duration,
}

/// The upper bound on handing the controllers' leadership over at poweroff
/// ([`crate::leadership`]); it runs alongside the drain and the etcd hand-over.
const LEADERSHIP_BOUND: Duration = Duration::from_secs(3);

/// Where the local API server is, the state store that holds the CA to talk to it, and the
/// client the controllers' leadership is handed over with, made ahead.
pub struct LocalApi {
    pub store: base::StateStore,
    pub server: String,
    pub leadership: std::sync::Arc<crate::leadership::Prepared>,
}

impl LocalApi {
    /// The local API server of `plan`; on a live host the leadership client is kept ready from now
    /// on (at poweroff there is no time to make it).
    pub fn new(store: base::StateStore, plan: &crate::config::Plan, keep_ready: bool) -> LocalApi {
        let local = LocalApi { store, server: plan.local_api_server(), leadership: std::sync::Arc::new(crate::leadership::Prepared::default()) };
        if keep_ready {
            let (prepared, store, server) = (local.leadership.clone(), local.store.clone(), local.server.clone());
            tokio::spawn(async move { prepared.keep_ready(&store, &server, Duration::from_secs(5)).await });
        }
        local
    }
}

/// At poweroff: freeze the controllers that lead from this host and release their Leases, while the
/// local API server still serves ([`crate::leadership`]). Bounded by [`LEADERSHIP_BOUND`].
async fn hand_leadership_over(local: &LocalApi) {
    let t = Instant::now();
    let work = async {
        let client = local.leadership.get(&local.store, &local.server).await?;
        Ok::<_, String>(crate::leadership::release_here(&client, Path::new("/proc"), &crate::leadership::hostname()).await)
    };
    match tokio::time::timeout(LEADERSHIP_BOUND, work).await {
        Ok(Ok(outcomes)) => {
            for (lease, outcome) in outcomes {
                match outcome {
                    crate::leadership::Outcome::NotHere => {}
                    crate::leadership::Outcome::Failed { holder, error } => {
                        tracing::warn!(lease, ?holder, %error, "controller leadership not released; it expires by itself")
                    }
                    other => tracing::info!(lease, outcome = ?other, elapsed_ms = t.elapsed().as_millis() as u64, "controller leadership handed over"),
                }
            }
        }
        Ok(Err(e)) => tracing::warn!(error = %e, "controller leadership: no API client; the Leases held here expire by themselves"),
        Err(_) => {
            tracing::warn!(bound_s = LEADERSHIP_BOUND.as_secs_f64(), "controller leadership: not done in time; the Leases held here expire by themselves")
        }
    }
}

/// Stop gracefully: leave the API target group, hand etcd leadership over (bounded), then exit.
/// The manifests, volumes and records are left as they are. On a live host (`live`: root `/`)
/// that is powering off, the API server keeps serving for `api_drain` after leaving the target
/// group (while leadership moves), and then kube-apiserver and etcd are ended
/// ([`crate::poweroff`]); the containers' scopes stop only after protokube (nodeup's drop-in).
pub async fn leave<C, D>(agent: &Agent<C, D>, api_target: Option<ApiTargetTask>, why: &str, bounds: Bounds, live: bool, local: &LocalApi)
where
    C: cloud::volumes::Volumes + cloud::volumes::Instances + Sync,
    D: cloud::dns::Dns + Sync,
{
    let t = Instant::now();
    let powering_off = live && crate::poweroff::system_stopping().await;
    // Behind the API load balancer: whoever takes this instance out of its target group (protokube
    // here, or the cloud, which deregisters a terminated instance itself), the balancer takes a
    // moment to stop sending it new connections, and the API server serves them meanwhile.
    let behind_balancer = api_target.is_some();
    let drain = if powering_off && behind_balancer { bounds.api_drain } else { Duration::ZERO };
    tracing::info!(signal = why, bound_s = bounds.handover.as_secs_f64(), api_drain_s = drain.as_secs_f64(), "stopping: handing etcd leadership over first");
    // Leaving the target group and then the drain, alongside both hand-overs: the drain counts from
    // the deregistration, the hand-overs need not wait for it.
    let drained = async {
        if let Some((stop, task)) = api_target {
            // The task leaves the target group itself (bounded by 5 s) once told to stop.
            let _ = stop.send(true);
            let _ = tokio::time::timeout(Duration::from_secs(6), task).await;
        }
        tokio::time::sleep(drain).await
    };
    let leadership = async {
        if powering_off {
            hand_leadership_over(local).await
        }
    };
    let (reports, (), ()) = tokio::join!(agent.leave(bounds.handover), drained, leadership);
    let moved = reports.iter().filter(|r| matches!(r.result, Ok(crate::handover::Outcome::Moved { .. }))).count();
    // At poweroff, end what would only hold the machine (and its etcd volumes) up.
    if powering_off {
        let ended = crate::poweroff::end(Path::new("/proc")).await;
        tracing::info!(api_servers = ?ended.api_servers, etcd = ?ended.etcds, killed = ?ended.killed, "system stopping: ended kube-apiserver and etcd (leadership handed over)");
    }
    tracing::info!(elapsed_ms = t.elapsed().as_millis() as u64, clusters = reports.len(), moved, "stopped");
}
