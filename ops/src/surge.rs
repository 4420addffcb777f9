//! Surge (`spec.rollingUpdate`, kOps' settings): how many extra instances a group may run during a
//! roll (`maxSurge`) and how many may be missing (`maxUnavailable`), the cluster's values as the
//! default and each instance group's winning.
//!
//! A surged instance is *detached* from its autoscaling group without lowering the desired
//! capacity (the group launches its replacement at once) and tagged [`DETACHED_TAG`], so a run that
//! is interrupted finds it again: detached instances of a group are found by that tag and the
//! group's `kops.k8s.io/instancegroup` tag, always count as outdated, go last, and are never
//! detached twice.

use std::collections::BTreeMap;

use keelson_api::generated::RollingUpdate;
use keelson_api::types::IntOrString;
use keelson_api::Role;

/// The tag on an instance detached from its group by a surge (kOps).
pub const DETACHED_TAG: &str = "kops.k8s.io/detached-from-asg";

/// A group's resolved rolling-update settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub max_surge: usize,
    pub max_unavailable: usize,
    /// `false`: detach (surge) only, nothing is drained or terminated.
    pub drain_and_terminate: bool,
}

impl Default for Settings {
    /// No surge, one at a time.
    fn default() -> Self {
        Settings { max_surge: 0, max_unavailable: 1, drain_and_terminate: true }
    }
}

/// The spec's `rollingUpdate` blocks: the cluster's and each instance group's.
#[derive(Debug, Clone, Default)]
pub struct SurgeSpec {
    pub cluster: Option<RollingUpdate>,
    /// By instance-group name.
    pub groups: BTreeMap<String, RollingUpdate>,
    /// `maxSurge` when neither sets it: kOps' 1 on AWS, 0 elsewhere (GCE).
    pub default_surge: usize,
}

impl SurgeSpec {
    pub fn from_documents(docs: &keelson_api::documents::Documents) -> SurgeSpec {
        SurgeSpec {
            cluster: docs.cluster.spec.rolling_update.clone(),
            groups: docs.instance_groups.iter().filter_map(|g| Some((g.metadata.name.clone()?, g.spec.rolling_update.clone()?))).collect(),
            default_surge: usize::from(docs.cluster.spec.cloud_provider.as_deref() == Some("aws")),
        }
    }

    /// The settings of instance group `group` with `instances` instances.
    pub fn settings(&self, group: &str, role: Role, instances: usize) -> Result<Settings, String> {
        resolve(self.cluster.as_ref(), self.groups.get(group), role, instances, self.default_surge)
    }
}

/// An absolute number or a percentage of `total` (`round_up` for surge, down for unavailability).
fn scaled(v: &IntOrString, total: usize, round_up: bool) -> Result<usize, String> {
    match v {
        IntOrString::Int(n) => usize::try_from(*n).map_err(|_| format!("{n} must not be negative")),
        IntOrString::String(s) => {
            let pct: usize = s.strip_suffix('%').and_then(|p| p.trim().parse().ok()).ok_or_else(|| format!("{s:?} is neither a number nor a percentage"))?;
            let n = pct * total;
            Ok(if round_up { n.div_ceil(100) } else { n / 100 })
        }
    }
}

/// kOps' `resolveSettings`: the group's values win over the cluster's; `maxSurge` defaults to
/// `default_surge` (kOps: 1 on AWS, 0 elsewhere), and `maxUnavailable` to 1 when there is no surge,
/// else 0 (a percentage never resolves below 1). Control planes never surge (a new member can only join through its own etcd): their
/// `maxSurge` is 0 and `maxUnavailable` at least 1. `instances`: the group's instance count.
pub fn resolve(cluster: Option<&RollingUpdate>, group: Option<&RollingUpdate>, role: Role, instances: usize, default_surge: usize) -> Result<Settings, String> {
    let pick = |f: fn(&RollingUpdate) -> Option<IntOrString>| group.and_then(f).or_else(|| cluster.and_then(f));
    let drain_and_terminate = group.and_then(|g| g.drain_and_terminate).or_else(|| cluster.and_then(|c| c.drain_and_terminate)).unwrap_or(true);
    let max_surge = match pick(|r| r.max_surge.clone()) {
        Some(v) => scaled(&v, instances, true).map_err(|e| format!("maxSurge: {e}"))?,
        None => default_surge,
    };
    let max_unavailable = match pick(|r| r.max_unavailable.clone()) {
        Some(v @ IntOrString::String(_)) => scaled(&v, instances, false).map_err(|e| format!("maxUnavailable: {e}"))?.max(1),
        Some(v) => scaled(&v, instances, false).map_err(|e| format!("maxUnavailable: {e}"))?,
        None => usize::from(max_surge == 0),
    };
    if role == Role::ControlPlane {
        return Ok(Settings { max_surge: 0, max_unavailable: max_unavailable.max(1), drain_and_terminate });
    }
    Ok(Settings { max_surge, max_unavailable, drain_and_terminate })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ru(surge: Option<IntOrString>, unavailable: Option<IntOrString>, drain: Option<bool>) -> RollingUpdate {
        RollingUpdate { max_surge: surge, max_unavailable: unavailable, drain_and_terminate: drain }
    }
    use IntOrString::{Int, String as Str};

    #[test]
    fn settings_resolve_as_kops_does() {
        let s = |surge, unavailable| Settings { max_surge: surge, max_unavailable: unavailable, drain_and_terminate: true };
        let pct = |p: &str| Some(Str(p.to_string()));
        // (cluster's, group's, role, instances, resolved)
        type Case = (Option<RollingUpdate>, Option<RollingUpdate>, Role, usize, Settings);
        let cases: Vec<Case> = vec![
            // AWS defaults: surge 1, nothing unavailable.
            (None, None, Role::Node, 3, s(1, 0)),
            (None, Some(ru(Some(Int(0)), None, None)), Role::Node, 3, s(0, 1)),
            // The group wins over the cluster, field by field.
            (Some(ru(Some(Int(2)), Some(Int(1)), None)), Some(ru(Some(Int(3)), None, None)), Role::Node, 9, s(3, 1)),
            (Some(ru(Some(Int(2)), None, None)), None, Role::Node, 9, s(2, 0)),
            // Percentages: surge rounds up, unavailability down but at least 1.
            (None, Some(ru(pct("25%"), pct("10%"), None)), Role::Node, 9, s(3, 1)),
            (None, Some(ru(pct("50%"), pct("50%"), None)), Role::Node, 5, s(3, 2)),
            (None, Some(ru(pct("0%"), None, None)), Role::Node, 5, s(0, 1)),
            // Control planes never surge.
            (None, None, Role::ControlPlane, 1, s(0, 1)),
            (Some(ru(Some(Int(2)), Some(Int(0)), None)), None, Role::ControlPlane, 3, s(0, 1)),
        ];
        for (i, (cluster, group, role, n, want)) in cases.iter().enumerate() {
            assert_eq!(resolve(cluster.as_ref(), group.as_ref(), *role, *n, 1), Ok(*want), "case {i}");
        }
        let off = resolve(Some(&ru(None, None, Some(false))), None, Role::Node, 2, 1).expect("settings");
        // Elsewhere than AWS nothing surges unless asked to: one at a time.
        assert_eq!(resolve(None, None, Role::Node, 3, 0), Ok(s(0, 1)));
        assert_eq!(resolve(None, Some(&ru(Some(Int(2)), None, None)), Role::Node, 3, 0), Ok(s(2, 0)));
        assert!(!off.drain_and_terminate);
        assert!(resolve(None, Some(&ru(pct("lots"), None, None)), Role::Node, 2, 1).expect_err("bad").contains("maxSurge"));
        assert!(resolve(None, Some(&ru(None, Some(Int(-1)), None)), Role::Node, 2, 1).expect_err("bad").contains("maxUnavailable"));
    }
}
