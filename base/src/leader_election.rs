//! The control plane's leader-election Leases, as protokube hands them over at poweroff and the
//! harness checks that it did.

/// The namespace of the control plane's Leases.
pub const NAMESPACE: &str = "kube-system";
/// kube-controller-manager's Lease.
pub const CONTROLLER_MANAGER: &str = "kube-controller-manager";
/// kube-scheduler's Lease.
pub const SCHEDULER: &str = "kube-scheduler";
/// The cloud controller manager's Lease (AWS and GCE).
pub const CLOUD_CONTROLLER_MANAGER: &str = "cloud-controller-manager";
/// Every one of them.
pub const LEASES: &[&str] = &[CONTROLLER_MANAGER, SCHEDULER, CLOUD_CONTROLLER_MANAGER];

/// Whether a Lease holder identity is the host `hostname`: client-go's leader election uses
/// `<hostname>_<uuid>` (and some components the bare hostname).
pub fn held_by_host(holder: Option<&str>, hostname: &str) -> bool {
    let Some(holder) = holder else { return false };
    !hostname.is_empty() && (holder == hostname || holder.strip_prefix(hostname).is_some_and(|rest| rest.starts_with('_')))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_is_this_host_only_by_its_exact_name_before_the_underscore() {
        let host = "ip-172-20-32-4";
        assert!(held_by_host(Some("ip-172-20-32-4_a04812be-ac1a-4960-a000-000000000000"), host));
        assert!(held_by_host(Some("ip-172-20-32-4"), host));
        assert!(!held_by_host(Some("ip-172-20-32-40_a04812be"), host), "another host whose name starts with this one");
        assert!(!held_by_host(Some("ip-172-20-64-5_a04812be"), host));
        assert!(!held_by_host(Some(""), host), "released");
        assert!(!held_by_host(None, host));
        assert!(!held_by_host(Some("_a04812be"), ""), "no hostname: nothing is ours");
    }
}
