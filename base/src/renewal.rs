//! When a certificate is renewed: once less than a third of its life is left, less a per-host,
//! per-certificate skew (up to a tenth of its life), so the certificates of one cluster, issued
//! together at its birth, are not all reissued — and never all expire — at the same moment.
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
    let Ok(left) = not_after.duration_since(now) else { return true };
    if left.is_zero() {
        return true;
    }
    let Ok(lifetime) = not_after.duration_since(not_before) else { return false };
    if now < not_before {
        return false;
    }
    left < (lifetime / 3).saturating_sub(skew)
}

/// When, at the earliest, [`needs_renewal`] turns true: the instant a periodic check should not
/// sleep past.
pub fn renewal_due_at(not_before: SystemTime, not_after: SystemTime, skew: Duration) -> SystemTime {
    let lifetime = not_after.duration_since(not_before).unwrap_or_default();
    not_after.checked_sub((lifetime / 3).saturating_sub(skew)).unwrap_or(not_before)
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
