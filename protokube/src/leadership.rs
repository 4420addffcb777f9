//! Handing the controllers' leadership over when the machine powers off.
//!
//! kube-controller-manager, kube-scheduler and the cloud controller manager run on every control
//! plane, and one of each leads through a Lease in `kube-system`. A leader that goes away without
//! releasing its Lease leaves the others waiting for it to expire: 15 s (the default
//! `leaseDuration`) after its last renewal, plus up to a retry period. While nobody leads, no
//! controller runs: a replacement control plane's Node gets no pod CIDR (so it is not Ready), no
//! Pod is scheduled, no Node is initialised. Measured on keelson-local (release, 2026-11-27): when
//! the control plane killed held the controller manager's Lease, its replacement's Node was Ready
//! 6.1 s after its API server, waiting for the new leader (which took the Lease 18.2 s after the
//! kill) to give it a pod CIDR.
//!
//! The scheduler releases its Lease on SIGTERM, the controller managers do not, and at poweroff
//! neither can: the API server on 127.0.0.1 they talk to is gone by the time systemd stops them.
//! So protokube, at poweroff and while the local API server still serves (the drain), for each
//! Lease held by this host (its holder identity is `<hostname>_<uuid>`): ends the local process
//! (SIGTERM, SIGKILL after [`GRACE`]) so it cannot renew, then releases the Lease the way client-go
//! does (`holderIdentity` empty, `leaseDurationSeconds` 1), with the Lease's `resourceVersion`,
//! so a Lease another host took meanwhile is left alone. The others take it on their next retry
//! (every 2 s by default).
//!
//! It talks to the API as [`USER`], whose Role allows `get` and `update` of these Leases only.
//! [`released`], [`held_by_host`] (in `base::leader_election`), [`role`] and [`role_binding`] are pure; [`release_here`] is the
//! thin I/O around them.

use std::path::Path;
use std::time::Duration;

use base::StateStore;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Patch, PatchParams, PostParams};

pub use base::leader_election::{held_by_host, NAMESPACE};
use base::leader_election::{CLOUD_CONTROLLER_MANAGER, CONTROLLER_MANAGER, SCHEDULER};
/// The identity protokube releases Leases as, and the name of its Role and RoleBinding.
pub const USER: &str = "keelson:leadership";
/// How long a leader gets after SIGTERM before SIGKILL.
pub const GRACE: Duration = Duration::from_secs(1);

/// A component that elects a leader through a Lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elected {
    /// The Lease's name in [`NAMESPACE`].
    pub lease: &'static str,
    /// The `comm` of its processes (the first 15 bytes of the program's name).
    pub processes: &'static [&'static str],
}

/// The control plane's elected components.
pub const ELECTED: &[Elected] = &[
    Elected { lease: CONTROLLER_MANAGER, processes: &["kube-controller"] },
    Elected { lease: SCHEDULER, processes: &["kube-scheduler"] },
    // The AWS and the GCE cloud controller managers.
    Elected { lease: CLOUD_CONTROLLER_MANAGER, processes: &["aws-cloud-contr", "cloud-controlle"] },
];

/// What happened to one Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Not held by this host (or no such Lease).
    NotHere,
    /// Held here; its process released it when it ended.
    ReleasedByItself { holder: String },
    /// Held here; protokube released it once its process had ended.
    Released { holder: String, ended: Vec<u32> },
    /// Held here, and not released (the error says why); the Lease expires by itself.
    Failed { holder: Option<String>, error: String },
}

/// `lease` released as client-go releases it: no holder, a 1-s duration renewed and acquired
/// `now`, its transitions and `resourceVersion` kept (the update fails if it changed meanwhile).
pub fn released(lease: &Lease, now: k8s_openapi::jiff::Timestamp) -> Lease {
    let mut out = lease.clone();
    let spec = out.spec.get_or_insert_with(Default::default);
    spec.holder_identity = Some(String::new());
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(MicroTime(now));
    spec.acquire_time = Some(MicroTime(now));
    out
}

/// The Role of [`USER`]: `get` and `update` of the [`ELECTED`] Leases, nothing else.
pub fn role() -> Role {
    Role {
        metadata: kube::api::ObjectMeta { name: Some(USER.into()), namespace: Some(NAMESPACE.into()), ..Default::default() },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["coordination.k8s.io".into()]),
            resources: Some(vec!["leases".into()]),
            resource_names: Some(ELECTED.iter().map(|e| e.lease.to_string()).collect()),
            verbs: ["get", "update"].map(String::from).to_vec(),
            ..Default::default()
        }]),
    }
}

/// The binding of [`role`] to the user [`USER`].
pub fn role_binding() -> RoleBinding {
    RoleBinding {
        metadata: kube::api::ObjectMeta { name: Some(USER.into()), namespace: Some(NAMESPACE.into()), ..Default::default() },
        role_ref: RoleRef { api_group: "rbac.authorization.k8s.io".into(), kind: "Role".into(), name: USER.into() },
        subjects: Some(vec![Subject { api_group: Some("rbac.authorization.k8s.io".into()), kind: "User".into(), name: USER.into(), namespace: None }]),
    }
}

/// This host's name (the UTS namespace's, which the host-network control-plane components share).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or_default()
}

/// A client as [`USER`]: its Role and binding are applied first through the addon controller's
/// `system:masters` client, which is then dropped.
pub async fn client(store: &StateStore, server: &str) -> Result<kube::Client, String> {
    let admin = crate::addons::client(store, server).await.map_err(|e| e.to_string())?;
    let apply = PatchParams::apply("keelson-protokube").force();
    kube::Api::<Role>::namespaced(admin.clone(), NAMESPACE)
        .patch(USER, &apply, &Patch::Apply(&role()))
        .await
        .map_err(|e| format!("apply Role {NAMESPACE}/{USER}: {e}"))?;
    kube::Api::<RoleBinding>::namespaced(admin, NAMESPACE)
        .patch(USER, &apply, &Patch::Apply(&role_binding()))
        .await
        .map_err(|e| format!("apply RoleBinding {NAMESPACE}/{USER}: {e}"))?;
    crate::addons::client_as(store, server, USER, &[]).await.map_err(|e| e.to_string())
}

/// For every [`ELECTED`] component at once: if this host holds its Lease, end its local processes
/// (SIGTERM, SIGKILL after [`GRACE`]) and release the Lease unless the process did.
pub async fn release_here(client: &kube::Client, proc_root: &Path, hostname: &str) -> Vec<(&'static str, Outcome)> {
    let leases = kube::Api::<Lease>::namespaced(client.clone(), NAMESPACE);
    let one = |e: &'static Elected| {
        let leases = leases.clone();
        async move { (e.lease, release_one(&leases, e, proc_root, hostname).await) }
    };
    futures_util::future::join_all(ELECTED.iter().map(one)).await
}

async fn release_one(leases: &kube::Api<Lease>, e: &Elected, proc_root: &Path, hostname: &str) -> Outcome {
    let holder_of = |l: &Lease| l.spec.as_ref().and_then(|s| s.holder_identity.clone());
    let lease = match leases.get_opt(e.lease).await {
        Ok(Some(l)) => l,
        Ok(None) => return Outcome::NotHere,
        Err(err) => return Outcome::Failed { holder: None, error: format!("get Lease {NAMESPACE}/{}: {err}", e.lease) },
    };
    let holder = holder_of(&lease);
    if !held_by_host(holder.as_deref(), hostname) {
        return Outcome::NotHere;
    }
    let holder = holder.unwrap_or_default();
    let pids = crate::poweroff::processes_named(proc_root, e.processes);
    crate::poweroff::terminate(proc_root, &pids, GRACE).await;
    // Read it again: a component that releases on exit (the scheduler) has, and a Lease changed
    // since is not this host's to release.
    let lease = match leases.get_opt(e.lease).await {
        Ok(Some(l)) => l,
        Ok(None) => return Outcome::NotHere,
        Err(err) => return Outcome::Failed { holder: Some(holder), error: format!("get Lease {NAMESPACE}/{}: {err}", e.lease) },
    };
    if holder_of(&lease).as_deref() != Some(holder.as_str()) {
        return Outcome::ReleasedByItself { holder };
    }
    match leases.replace(e.lease, &PostParams::default(), &released(&lease, k8s_openapi::jiff::Timestamp::now())).await {
        Ok(_) => Outcome::Released { holder, ended: pids },
        Err(err) => Outcome::Failed { holder: Some(holder), error: format!("update Lease {NAMESPACE}/{}: {err}", e.lease) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;

    #[test]
    fn a_released_lease_has_no_holder_a_one_second_duration_and_keeps_its_version_and_transitions() {
        let before = k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).expect("time");
        let now = k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).expect("time");
        let lease = Lease {
            metadata: kube::api::ObjectMeta {
                name: Some("kube-controller-manager".into()),
                namespace: Some(NAMESPACE.into()),
                resource_version: Some("4711".into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("ip-172-20-32-4_x".into()),
                lease_duration_seconds: Some(15),
                lease_transitions: Some(7),
                renew_time: Some(MicroTime(before)),
                acquire_time: Some(MicroTime(before)),
                ..Default::default()
            }),
        };
        let r = released(&lease, now);
        let spec = r.spec.as_ref().expect("spec");
        assert_eq!(spec.holder_identity.as_deref(), Some(""));
        assert_eq!(spec.lease_duration_seconds, Some(1));
        assert_eq!(spec.lease_transitions, Some(7));
        assert_eq!(spec.renew_time, Some(MicroTime(now)));
        assert_eq!(spec.acquire_time, Some(MicroTime(now)));
        assert_eq!(r.metadata.resource_version.as_deref(), Some("4711"), "the update is conditional on the version read");
    }

    #[test]
    fn the_role_allows_get_and_update_of_the_elected_leases_only() {
        let role = role();
        assert_eq!(role.metadata.namespace.as_deref(), Some(NAMESPACE));
        let rules = role.rules.expect("rules");
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].verbs, vec!["get", "update"]);
        assert_eq!(rules[0].resources.as_deref(), Some(&["leases".to_string()][..]));
        assert_eq!(rules[0].resource_names.as_ref().map(Vec::len), Some(ELECTED.len()));
        let binding = role_binding();
        assert_eq!(binding.role_ref.kind, "Role");
        assert_eq!(binding.subjects.expect("subjects")[0].name, USER);
    }

    #[test]
    fn process_names_are_what_proc_comm_shows() {
        // `comm` is the program name cut to 15 bytes.
        for e in ELECTED {
            for p in e.processes {
                assert!(p.len() <= 15, "{p}");
            }
        }
        assert_eq!(&"kube-controller-manager"[..15], ELECTED[0].processes[0]);
        assert_eq!(&"aws-cloud-controller-manager"[..15], ELECTED[2].processes[0]);
    }
}
