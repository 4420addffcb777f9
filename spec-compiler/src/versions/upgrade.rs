//! Which Kubernetes version `keelson upgrade cluster` goes to: the releases the table knows, one
//! minor at a time — the newest patch of the current minor first, then the newest patch of the next
//! one — so no kubelet is ever more than one minor from its API servers during a roll.

use keelson_api::KubernetesVersion;

use super::hashes::known_kubernetes_versions;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpgradeError {
    #[error("--to {to}: not a release the versions table knows (known: {known})")]
    Unknown { to: String, known: String },
    #[error("--to {to}: older than the cluster's {from}; Keelson does not downgrade")]
    Downgrade { from: String, to: String },
    #[error("--to {to}: skips a minor from {from}; upgrade one minor at a time: first --to {step}, apply and roll, then --to {to}")]
    SkipsMinor { from: String, to: String, step: String },
}

/// The general-availability releases of the table, oldest first.
pub fn releases() -> Vec<KubernetesVersion> {
    known_kubernetes_versions().iter().filter_map(|v| v.parse::<KubernetesVersion>().ok()).filter(|v| v.pre.is_none()).collect()
}

fn core(v: &KubernetesVersion) -> (u64, u64, u64) {
    (v.major, v.minor, v.patch)
}

/// The newest release of `major.minor` in `releases`.
fn newest_of(releases: &[KubernetesVersion], major: u64, minor: u64) -> Option<&KubernetesVersion> {
    releases.iter().filter(|r| (r.major, r.minor) == (major, minor)).max_by_key(|r| core(r))
}

/// Where an upgrade from `current` goes: `to` when given (a known release, not older, at most the
/// next minor), else the next step; `Ok(None)` when the cluster runs the newest release the table knows.
pub fn upgrade_target(
    releases: &[KubernetesVersion],
    current: &KubernetesVersion,
    to: Option<&KubernetesVersion>,
) -> Result<Option<KubernetesVersion>, UpgradeError> {
    if let Some(to) = to {
        if !releases.contains(to) {
            let known = releases.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
            return Err(UpgradeError::Unknown { to: to.to_string(), known });
        }
        if core(to) < core(current) {
            return Err(UpgradeError::Downgrade { from: current.to_string(), to: to.to_string() });
        }
        if to.major != current.major || to.minor > current.minor + 1 {
            let step = newest_of(releases, current.major, current.minor + 1)
                .map(ToString::to_string)
                .unwrap_or_else(|| format!("{}.{}", current.major, current.minor + 1));
            return Err(UpgradeError::SkipsMinor { from: current.to_string(), to: to.to_string(), step });
        }
        return Ok((core(to) > core(current)).then(|| to.clone()));
    }
    if let Some(patch) = newest_of(releases, current.major, current.minor).filter(|p| core(p) > core(current)) {
        return Ok(Some(patch.clone()));
    }
    Ok(newest_of(releases, current.major, current.minor + 1).cloned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> KubernetesVersion {
        s.parse().expect("version")
    }

    #[test]
    fn one_minor_at_a_time_newest_patch_first() {
        let table: Vec<KubernetesVersion> = ["1.34.4", "1.34.10", "1.35.0", "1.35.7", "1.36.3"].into_iter().map(v).collect();
        assert_eq!(upgrade_target(&table, &v("1.34.4"), None), Ok(Some(v("1.34.10"))), "the current minor's newest patch first");
        assert_eq!(upgrade_target(&table, &v("1.34.10"), None), Ok(Some(v("1.35.7"))), "then the next minor's newest");
        assert_eq!(upgrade_target(&table, &v("1.36.3"), None), Ok(None), "nothing newer");
        assert_eq!(upgrade_target(&table, &v("1.34.4"), Some(&v("1.35.0"))), Ok(Some(v("1.35.0"))));
        assert_eq!(upgrade_target(&table, &v("1.35.0"), Some(&v("1.35.0"))), Ok(None), "already there");
        assert_eq!(
            upgrade_target(&table, &v("1.34.4"), Some(&v("1.36.3"))),
            Err(UpgradeError::SkipsMinor { from: "1.34.4".into(), to: "1.36.3".into(), step: "1.35.7".into() })
        );
        assert!(matches!(upgrade_target(&table, &v("1.35.7"), Some(&v("1.34.10"))), Err(UpgradeError::Downgrade { .. })));
        assert!(matches!(upgrade_target(&table, &v("1.34.4"), Some(&v("1.34.99"))), Err(UpgradeError::Unknown { .. })));
    }

    #[test]
    fn the_table_has_releases_and_no_pre_releases_among_them() {
        let r = releases();
        assert!(r.len() > 20 && r.iter().all(|v| v.pre.is_none()));
        assert!(r.windows(2).all(|w| core(&w[0]) < core(&w[1])), "sorted, no duplicates");
    }
}
