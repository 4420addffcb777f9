//! Whether the controllers' leadership left a killed control plane by hand-over or by expiry.
//!
//! At poweroff protokube releases the Leases its host holds (kube-controller-manager, kube-scheduler,
//! cloud-controller-manager; protokube's README, 10), so a survivor takes each within a retry period
//! instead of waiting out the lease. Judged by the Lease's own times, not a wall-clock limit: a Lease
//! the killed host held was handed over when a survivor acquired it before it could have expired
//! (before its last renewal seen before the kill plus its duration); a Lease that expired was
//! acquired later than that (client-go takes a held Lease only once it has gone unrenewed for its
//! whole duration, and the killed host renewed it at least once more after it was read).

use crate::kubeapi::LeaseState;

use base::leader_election::held_by_host;
pub use base::leader_election::{LEASES, NAMESPACE};

/// How a Lease moved off the killed host.
#[derive(Debug, Clone, PartialEq)]
pub enum Moved {
    /// The killed host did not hold it.
    NotHeld,
    /// A survivor acquired it `after_kill_s` after the kill, before it could have expired.
    HandedOver { to: String, after_kill_s: f64 },
    /// A survivor acquired it only after it could have expired.
    Expired { to: String, after_kill_s: f64 },
    /// Still held by the killed host, or by nobody.
    NotMoved { holder: String },
}

/// How the Lease read `before` the kill (at `killed_ms`) moved, read again `after` the failover.
pub fn moved(before: &LeaseState, after: &LeaseState, hostname: &str, killed_ms: i64) -> Moved {
    if !held_by_host(Some(&before.holder), hostname) {
        return Moved::NotHeld;
    }
    if after.holder.is_empty() || held_by_host(Some(&after.holder), hostname) {
        return Moved::NotMoved { holder: after.holder.clone() };
    }
    let acquired = after.acquired_ms.unwrap_or(i64::MAX);
    let after_kill_s = (acquired.saturating_sub(killed_ms)) as f64 / 1000.0;
    let expires = before.renewed_ms.unwrap_or(i64::MIN).saturating_add(i64::from(before.duration_s.unwrap_or(0)) * 1000);
    if acquired < expires {
        Moved::HandedOver { to: after.holder.clone(), after_kill_s }
    } else {
        Moved::Expired { to: after.holder.clone(), after_kill_s }
    }
}

/// What the killed machine's journal (kept at its poweroff in `journal`, a journal directory) says
/// about the hand-over: protokube's last 40 lines (its stop is at the end); a line saying why when
/// there are none.
pub fn poweroff_log(journal: &std::path::Path) -> Vec<String> {
    let out = std::process::Command::new("journalctl").arg("-D").arg(journal).args(["--no-pager", "-o", "short-precise", "-u", "protokube.service"]).output();
    let text = match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        Ok(o) => return vec![format!("journalctl -D {}: {}", journal.display(), String::from_utf8_lossy(&o.stderr).trim())],
        Err(e) => return vec![format!("journalctl -D {}: {e}", journal.display())],
    };
    let lines: Vec<String> = text.lines().map(str::to_string).collect();
    lines[lines.len().saturating_sub(40)..].to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: &str, renewed_ms: i64, acquired_ms: i64) -> LeaseState {
        LeaseState { holder: holder.into(), renewed_ms: Some(renewed_ms), acquired_ms: Some(acquired_ms), duration_s: Some(15) }
    }

    #[test]
    fn a_lease_taken_before_it_could_expire_was_handed_over() {
        let before = lease("ip-172-20-64-4_a", 100_000, 50_000);
        let kill = 101_000;
        let after = lease("ip-172-20-32-4_b", 103_000, 102_700);
        assert_eq!(moved(&before, &after, "ip-172-20-64-4", kill), Moved::HandedOver { to: "ip-172-20-32-4_b".into(), after_kill_s: 1.7 });
    }

    #[test]
    fn a_lease_taken_after_its_duration_expired() {
        let before = lease("ip-172-20-64-4_a", 100_000, 50_000);
        let after = lease("ip-172-20-32-4_b", 119_000, 118_200);
        assert!(matches!(moved(&before, &after, "ip-172-20-64-4", 101_000), Moved::Expired { after_kill_s, .. } if (after_kill_s - 17.2).abs() < 1e-9));
    }

    #[test]
    fn leases_of_other_hosts_and_leases_not_taken() {
        let other = lease("ip-172-20-96-8_c", 100_000, 50_000);
        assert_eq!(moved(&other, &other, "ip-172-20-64-4", 101_000), Moved::NotHeld);
        assert_eq!(moved(&lease("ip-172-20-64-40_c", 1, 1), &other, "ip-172-20-64-4", 101_000), Moved::NotHeld, "a longer name");
        let before = lease("ip-172-20-64-4_a", 100_000, 50_000);
        assert_eq!(moved(&before, &lease("", 101_500, 101_500), "ip-172-20-64-4", 101_000), Moved::NotMoved { holder: String::new() });
        assert_eq!(moved(&before, &before, "ip-172-20-64-4", 101_000), Moved::NotMoved { holder: "ip-172-20-64-4_a".into() });
    }
}
