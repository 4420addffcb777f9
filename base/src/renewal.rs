//! When a certificate is renewed: once less than a third of its life is left, less a per-host,
//! per-certificate skew (up to a tenth of its life), so the certificates of one cluster, issued
//! together at its birth, are not all reissued — and never all expire — at the same moment.
//! A certificate whose holder re-reads it by itself on a period (the kubelet's client certificate)
//! is renewed early enough for the holder to pick it up before the old one expires.
//! Pure: the caller reads the certificate and the clock.

use std::time::{Duration, SystemTime};

use sha2::Digest as _;

/// The largest skew, as a fraction of the lifetime (1/10).
pub const MAX_SKEW_DIVISOR: u32 = 10;

/// The skew of one certificate: a stable value in `[0, lifetime / 10)` derived from `seed`
/// (e.g. `<host>/<certificate>`), the same on every check, different between hosts and
/// certificates.
pub fn skew(seed: &str, lifetime: Duration) -> Duration {
    let digest = sha2::Sha256::digest(seed.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    let fraction = u64::from_be_bytes(first) as f64 / (u64::MAX as f64 + 1.0);
    (lifetime / MAX_SKEW_DIVISOR).mul_f64(fraction)
}

/// Whether a certificate valid `not_before..not_after` is due for renewal at `now`: when what is
/// left is less than a third of its lifetime minus `skew`. An expired certificate is due; one
/// that is not valid yet (a clock behind the issuer's) or has no lifetime at all is due only
/// once expired.
pub fn needs_renewal(not_before: SystemTime, not_after: SystemTime, now: SystemTime, skew: Duration) -> bool {
    needs_renewal_with_floor(not_before, not_after, now, skew, Duration::ZERO)
}

/// How long before its expiry a certificate of `lifetime` is renewed: a third of its life less
/// `skew`, but never less than `floor` — the time its holder needs to pick up a new certificate
/// by itself ([`KUBELET_CLIENT_LEAD`]) — unless that is more than half its life.
pub fn lead(lifetime: Duration, skew: Duration, floor: Duration) -> Duration {
    (lifetime / 3).saturating_sub(skew).max(floor.min(lifetime / 2))
}

/// [`needs_renewal`] for a certificate renewed at least `floor` before it expires ([`lead`]).
pub fn needs_renewal_with_floor(not_before: SystemTime, not_after: SystemTime, now: SystemTime, skew: Duration, floor: Duration) -> bool {
    let Ok(left) = not_after.duration_since(now) else { return true };
    if left.is_zero() {
        return true;
    }
    let Ok(lifetime) = not_after.duration_since(not_before) else { return false };
    if now < not_before {
        return false;
    }
    left < lead(lifetime, skew, floor)
}

/// When, at the earliest, [`needs_renewal`] turns true: the instant a periodic check should not
/// sleep past.
pub fn renewal_due_at(not_before: SystemTime, not_after: SystemTime, skew: Duration) -> SystemTime {
    renewal_due_at_with_floor(not_before, not_after, skew, Duration::ZERO)
}

/// [`renewal_due_at`] for a certificate renewed at least `floor` before it expires.
pub fn renewal_due_at_with_floor(not_before: SystemTime, not_after: SystemTime, skew: Duration, floor: Duration) -> SystemTime {
    let lifetime = not_after.duration_since(not_before).unwrap_or_default();
    not_after.checked_sub(lead(lifetime, skew, floor)).unwrap_or(not_before)
}

/// How often, at the longest, the kubelet reads again the client certificate its kubeconfig names
/// by file (`client-certificate`, `client-key`): client-go's `CertCallbackRefreshDuration`. It
/// also reads it on every new connection, and closes its connections once it has changed, so a
/// renewed certificate is in use within this long without restarting the kubelet.
pub const KUBELET_CLIENT_RELOAD: Duration = Duration::from_secs(300);

/// The kubelet's client certificate is renewed at least this long before it expires
/// ([`lead`]'s floor): [`KUBELET_CLIENT_RELOAD`], 15 s to spare, and 75 s for the interval of the
/// check that renews it.
pub const KUBELET_CLIENT_LEAD: Duration = Duration::from_secs(390);

/// Whether a kubelet whose client certificate was renewed while the old one had `left` to live
/// must be restarted to use the new one: when its next reload could come after the old one
/// expired (15 s to spare). Never, for a certificate of 13 minutes' life or more renewed at its
/// lead ([`KUBELET_CLIENT_LEAD`]) by a check at most 75 s late. Restarting is what this avoids: a
/// restarted kubelet can report its Node NotReady until it has checked its runtime and PLEG.
pub fn kubelet_must_restart(left: Duration) -> bool {
    left < KUBELET_CLIENT_RELOAD + Duration::from_secs(15)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: u64 = 86400;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
    }

    #[test]
    fn renews_in_the_last_third_less_the_skew() {
        let life = 300 * DAY; // a third: 100 days
        let (nb, na) = (at(0), at(life));
        let none = Duration::ZERO;
        let ten_days = Duration::from_secs(10 * DAY);
        // (now, skew, due?)
        let table = [
            (at(0), none, false),                 // fresh
            (at(199 * DAY), none, false),         // 101 days left
            (at(200 * DAY - 1), none, false),     // a second over a third left
            (at(200 * DAY + 1), none, true),      // a second under a third left
            (at(200 * DAY + 1), ten_days, false), // skewed: renews only under 90 days left
            (at(210 * DAY - 1), ten_days, false),
            (at(210 * DAY + 1), ten_days, true),
            (at(life), none, true),       // the last second
            (at(life + DAY), none, true), // expired
            (at(life + DAY), ten_days, true),
        ];
        for (i, (now, skew, due)) in table.into_iter().enumerate() {
            assert_eq!(needs_renewal(nb, na, now, skew), due, "case {i}");
        }
    }

    #[test]
    fn a_clock_behind_the_issuer_or_a_broken_certificate_renews_only_once_expired() {
        // now before notBefore: not yet valid here, nothing to renew.
        assert!(!needs_renewal(at(100), at(100 + 3 * DAY), at(0), Duration::ZERO));
        // notAfter before notBefore: no lifetime; only expiry counts.
        assert!(!needs_renewal(at(DAY), at(10), at(0), Duration::ZERO));
        assert!(needs_renewal(at(DAY), at(10), at(20), Duration::ZERO));
        // A skew larger than a third never pushes renewal past expiry.
        assert!(needs_renewal(at(0), at(30), at(30), Duration::from_secs(1000)));
    }

    #[test]
    fn short_test_lifetimes_follow_the_same_rule() {
        // A 10-minute certificate backdated a minute: 11 minutes of life, renewed under 3m40s left.
        let (nb, na) = (at(0), at(660));
        assert!(!needs_renewal(nb, na, at(60 + 5 * 60), Duration::ZERO));
        assert!(needs_renewal(nb, na, at(660 - 219), Duration::ZERO));
        assert_eq!(renewal_due_at(nb, na, Duration::ZERO), at(440));
        assert_eq!(renewal_due_at(nb, na, Duration::from_secs(40)), at(480));
    }

    #[test]
    fn a_floor_renews_early_enough_for_the_holder_to_pick_it_up() {
        let year = Duration::from_secs(365 * DAY);
        // Long lives: the third wins, the floor changes nothing.
        assert_eq!(lead(year, Duration::ZERO, KUBELET_CLIENT_LEAD), year / 3);
        // A 13-minute certificate: a third (4m20s) is less than the kubelet's 6m30s floor.
        let life = Duration::from_secs(13 * 60);
        assert_eq!(lead(life, Duration::ZERO, KUBELET_CLIENT_LEAD), KUBELET_CLIENT_LEAD);
        assert_eq!(lead(life, Duration::from_secs(60), Duration::ZERO), Duration::from_secs(200));
        let (nb, na) = (at(0), at(13 * 60));
        assert!(!needs_renewal_with_floor(nb, na, at(13 * 60 - 391), Duration::ZERO, KUBELET_CLIENT_LEAD));
        assert!(needs_renewal_with_floor(nb, na, at(13 * 60 - 389), Duration::ZERO, KUBELET_CLIENT_LEAD));
        assert_eq!(renewal_due_at_with_floor(nb, na, Duration::ZERO, KUBELET_CLIENT_LEAD), at(13 * 60 - 390));
        // Renewed at its floor by a check up to 75 s late, the kubelet has time to pick it up.
        assert!(!kubelet_must_restart(KUBELET_CLIENT_LEAD - Duration::from_secs(75)));
        assert!(kubelet_must_restart(KUBELET_CLIENT_LEAD - Duration::from_secs(76)));
        // A 10-minute certificate: the floor is capped at half its life (never renewed at once,
        // never in a loop), and the kubelet would have to be restarted.
        let ten = Duration::from_secs(600);
        assert_eq!(lead(ten, Duration::ZERO, KUBELET_CLIENT_LEAD), ten / 2);
        assert!(!needs_renewal_with_floor(at(0), at(600), at(1), Duration::ZERO, KUBELET_CLIENT_LEAD));
        assert!(kubelet_must_restart(ten / 2 - Duration::from_secs(30)));
        assert!(kubelet_must_restart(Duration::ZERO));
    }

    #[test]
    fn skew_is_stable_bounded_and_spread() {
        let life = Duration::from_secs(455 * DAY);
        assert_eq!(skew("ip-10-0-0-1/etcd-main/peer", life), skew("ip-10-0-0-1/etcd-main/peer", life));
        let skews: Vec<Duration> = (0..200).map(|i| skew(&format!("ip-10-0-0-{i}/etcd-main/peer"), life)).collect();
        assert!(skews.iter().all(|s| *s < life / 10), "within a tenth of the life");
        let distinct: std::collections::BTreeSet<_> = skews.iter().collect();
        assert!(distinct.len() > 190, "different hosts get different skews");
        // Spread over the range, not bunched: some in each quarter of [0, life/10).
        for q in 0..4u32 {
            let (lo, hi) = (life / 40 * q, life / 40 * (q + 1));
            assert!(skews.iter().any(|s| *s >= lo && *s < hi), "quarter {q} is empty");
        }
    }
}
