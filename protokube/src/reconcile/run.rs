//! The controller of this host's etcd volumes, manifests and DNS records: the [`Agent`]'s pass, once
//! (`--once`) or in a loop with backoff, each pass logged and counted in the metrics, the plan
//! taken anew whenever the compiler's config changed ([`crate::config::watch`]).

use std::time::{Duration, Instant};

use cloud::calls::CallCounter;
use cloud::dns::Dns;
use cloud::volumes::{Instances, Volumes};

use super::{Agent, ReconcileError, Report};
use crate::config::Plan;
use crate::metrics::{self, Metrics};
use crate::shutdown::StopSignals;

/// How soon protokube passes again while it is not settled: a restore in flight (each of its
/// phases waits on a pass), or an etcd member here whose volume is not mounted yet (a replacement
/// control plane waiting for the old instance to let go of it: every second counts).
pub const EAGER_PASS_INTERVAL: Duration = Duration::from_secs(1);

/// The wait before the next pass: the converged interval, or the failure backoff; while not
/// settled (`eager`), never more than [`EAGER_PASS_INTERVAL`].
pub fn pass_wait(ok: bool, eager: bool, interval: Duration, backoff: Duration) -> Duration {
    let wait = if ok { interval } else { backoff };
    if eager {
        wait.min(EAGER_PASS_INTERVAL)
    } else {
        wait
    }
}

/// The pass's one-line summary (stdout).
pub fn summary(r: &Report) -> String {
    format!("protokube: {} volumes mounted, {} manifests written, {} dns records", r.volumes_mounted, r.manifests_written, r.dns_records)
}

/// How the loop runs.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// One pass, then return its report.
    pub once: bool,
    /// Between passes when converged.
    pub interval: Duration,
    /// The longest wait after repeated failures.
    pub max_backoff: Duration,
    /// When protokube started (logged with each pass).
    pub started: Instant,
}

/// Why [`run`] returned.
#[derive(Debug)]
pub enum Ended {
    /// `--once`: the pass's report.
    Once(Report),
    /// Asked to stop (`"terminated"`, `"interrupted"`); the caller leaves ([`crate::shutdown::leave`]).
    Stopped(&'static str),
}

/// Run the pass (once, or until a stop request), taking each new plan from `plans` before a pass.
pub async fn run<C, D>(
    agent: &mut Agent<C, D>,
    plans: &mut tokio::sync::watch::Receiver<Plan>,
    settings: Settings,
    metrics: &Metrics,
    calls: &CallCounter,
    stop: &mut StopSignals,
) -> Result<Ended, ReconcileError>
where
    C: Volumes + Instances + Sync,
    D: Dns + Sync,
{
    let mut backoff = settings.interval;
    let mut first = true;
    // Not settled (a restore in flight: every phase waits on this member's next pass; or a member
    // here whose volume is not mounted yet): passes follow each other at EAGER_PASS_INTERVAL and
    // failures do not back off past it until it is settled.
    let mut eager = false;
    loop {
        // Level-triggered on the plan too: membership or DNS changes apply without a restart.
        if plans.has_changed().unwrap_or(false) {
            agent.set_plan(plans.borrow_and_update().clone());
        }
        let t = Instant::now();
        let calls_before = calls.total_calls();
        let attempts_before: u64 = calls.snapshot().values().map(|c| c.attempts).sum();
        // A stop request does not wait for the pass to finish (it is level-triggered: the next
        // pass, on this host or its replacement, continues from what is there).
        let result = if settings.once {
            agent.reconcile().await
        } else {
            tokio::select! {
                r = agent.reconcile() => r,
                why = stop.requested() => return Ok(Ended::Stopped(why)),
            }
        };
        let snapshot: Vec<(String, u64, u64)> = calls.snapshot().into_iter().map(|(k, c)| (k, c.calls, c.attempts)).collect();
        let attempts = snapshot.iter().map(|(_, _, a)| a).sum::<u64>() - attempts_before;
        let pass_calls = calls.total_calls() - calls_before;
        match &result {
            Ok(r) => {
                for w in &r.waiting {
                    eprintln!("protokube: waiting: {w}");
                }
                for w in &r.refused {
                    eprintln!("protokube: refused: {w}");
                }
                tracing::info!(
                    peak_rss_kib = metrics::peak_rss_kib(),
                    elapsed_ms = t.elapsed().as_millis() as u64,
                    since_start_ms = settings.started.elapsed().as_millis() as u64,
                    cloud_calls = pass_calls,
                    cloud_attempts = attempts,
                    mounted = r.mounted.len(),
                    "{}",
                    summary(r)
                );
                metrics.update(|s| {
                    s.passes_ok += 1;
                    s.last_duration = t.elapsed();
                    s.last_success_unix = metrics::now_unix();
                    s.last_error = None;
                    s.waiting = r.waiting.clone();
                    s.unmounted = r.unmounted;
                    s.volumes_mounted += r.volumes_mounted as u64;
                    s.volumes_formatted += r.volumes_formatted as u64;
                    s.manifests_written += r.manifests_written as u64;
                    s.dns_changes += r.dns_records as u64;
                    s.mounted_now = r.mounted.len() as u64;
                    s.cloud_calls = snapshot;
                });
                backoff = settings.interval;
                eager = r.restoring || r.unmounted;
                if !settings.once && (first || r.volumes_mounted + r.manifests_written + r.dns_records > 0) {
                    println!("{}", summary(r));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "reconcile failed");
                metrics.update(|s| {
                    s.passes_failed += 1;
                    s.last_duration = t.elapsed();
                    s.last_error = Some(e.to_string());
                    s.cloud_calls = snapshot;
                });
                backoff = (backoff * 2).min(settings.max_backoff);
            }
        }
        first = false;
        if settings.once {
            let r = result?;
            tracing::info!(peak_rss_kib = metrics::peak_rss_kib(), since_start_ms = settings.started.elapsed().as_millis() as u64, "done");
            println!("{}", summary(&r));
            return Ok(Ended::Once(r));
        }
        let wait = pass_wait(result.is_ok(), eager, settings.interval, backoff);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            why = stop.requested() => return Ok(Ended::Stopped(why)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unsettled_host_passes_every_second_even_after_failures() {
        let (interval, backoff) = (Duration::from_secs(5), Duration::from_secs(40));
        assert_eq!(pass_wait(true, false, interval, backoff), interval);
        assert_eq!(pass_wait(false, false, interval, backoff), backoff);
        assert_eq!(pass_wait(true, true, interval, backoff), EAGER_PASS_INTERVAL);
        assert_eq!(pass_wait(false, true, interval, backoff), EAGER_PASS_INTERVAL);
        // A faster configured interval stays.
        assert_eq!(pass_wait(true, true, Duration::from_millis(200), backoff), Duration::from_millis(200));
    }
}
