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
//! Lease held by this host (its holder identity is `<hostname>_<uuid>`): freezes the local process
//! (SIGSTOP) so it cannot renew, then releases the Lease the way client-go does
//! (`holderIdentity` empty, `leaseDurationSeconds` 1), with the Lease's `resourceVersion`, so a
//! Lease another host took meanwhile is left alone. The others take it on their next retry (every
//! 2 s by default).
//!
//! Frozen, not ended: an ended controller's container exits, the kubelet (still running until the
//! containers stop) starts it again at once, and the new process can take the Lease just released
//! and hold it into the poweroff — the Lease then expires as if nothing had been done. A frozen
//! process stays in its running container; systemd's SIGTERM at poweroff comes with a SIGCONT.
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
    /// Held here, and no longer by the time its process was frozen (it released it, or another
    /// host took it).
    NoLongerHeld { holder: String },
    /// Held here; protokube released it once its process was frozen.
    Released { holder: String, frozen: Vec<u32> },
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

/// How long a client made by [`client`] is used: half its certificate's 24-h life.
pub const CLIENT_REUSE: Duration = Duration::from_secs(12 * 3600);

/// A client as [`USER`] made ahead of the poweroff, so that the hand-over at poweroff is the Lease
/// calls alone: making one reads the CA from the state store, issues a certificate and applies the
/// Role, and the hand-over has a few seconds while the local API server still serves.
#[derive(Default)]
pub struct Prepared {
    made: tokio::sync::Mutex<Option<(std::time::Instant, kube::Client)>>,
}

impl Prepared {
    /// The prepared client if it is younger than [`CLIENT_REUSE`], else a new one (kept).
    pub async fn get(&self, store: &StateStore, server: &str) -> Result<kube::Client, String> {
        let mut made = self.made.lock().await;
        if let Some((at, c)) = made.as_ref().filter(|(at, _)| at.elapsed() < CLIENT_REUSE) {
            tracing::debug!(age_s = at.elapsed().as_secs(), "controller leadership: the prepared client");
            return Ok(c.clone());
        }
        let c = client(store, server).await?;
        *made = Some((std::time::Instant::now(), c.clone()));
        Ok(c)
    }

    /// Keep a client ready: make one as soon as the local API server takes it (every `retry` until
    /// then; nothing is read or issued while its port is closed), and a new one every
    /// [`CLIENT_REUSE`]. Runs until dropped.
    pub async fn keep_ready(&self, store: &StateStore, server: &str, retry: Duration) {
        let addr = server.trim_start_matches("https://").trim_end_matches('/').to_string();
        loop {
            if tokio::net::TcpStream::connect(&addr).await.is_err() {
                tokio::time::sleep(retry).await;
                continue;
            }
            let wait = match self.get(store, server).await {
                Ok(_) => CLIENT_REUSE,
                Err(e) => {
                    tracing::debug!(error = %e, "controller leadership: no client yet");
                    retry
                }
            };
            tokio::time::sleep(wait).await;
        }
    }
}

/// For every [`ELECTED`] component at once: if this host holds its Lease, freeze its local
/// processes (SIGSTOP) and release the Lease.
pub async fn release_here(client: &kube::Client, proc_root: &Path, hostname: &str) -> Vec<(&'static str, Outcome)> {
    let leases = kube::Api::<Lease>::namespaced(client.clone(), NAMESPACE);
    let one = |e: &'static Elected| {
        let leases = leases.clone();
        async move { (e.lease, release_one(&leases, e, proc_root, hostname).await) }
    };
    futures_util::future::join_all(ELECTED.iter().map(one)).await
}

async fn release_one(leases: &kube::Api<Lease>, e: &Elected, proc_root: &Path, hostname: &str) -> Outcome {
    use backon::{ExponentialBuilder, Retryable as _};
    // Every call is retried on what passes (see [`retryable`]): the etcd hand-over, which runs
    // alongside, makes etcd drop proposals for a moment (measured: "raft proposal dropped", a 500,
    // 80 ms into the poweroff). The caller bounds the whole.
    let policy = ExponentialBuilder::default().with_min_delay(Duration::from_millis(50)).with_max_delay(Duration::from_millis(400)).with_max_times(10);
    let holder_of = |l: &Lease| l.spec.as_ref().and_then(|s| s.holder_identity.clone());
    let lease = match (|| leases.get_opt(e.lease)).retry(policy).when(retryable).await {
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
    crate::poweroff::freeze(&pids);
    // Read it again (for the version its holder last renewed) and release it; a Lease that changed
    // hands since is not this host's to release. A renewal in flight as the holder froze is a
    // conflict: retried too.
    let once = || release_if_held(leases, e.lease, &holder);
    match once.retry(policy).when(retryable).await {
        Ok(true) => Outcome::Released { holder, frozen: pids },
        Ok(false) => Outcome::NoLongerHeld { holder },
        Err(err) => Outcome::Failed { holder: Some(holder), error: format!("release Lease {NAMESPACE}/{}: {err}", e.lease) },
    }
}

/// Release the Lease `name` if `holder` still holds it; whether it did.
async fn release_if_held(leases: &kube::Api<Lease>, name: &str, holder: &str) -> Result<bool, kube::Error> {
    let Some(lease) = leases.get_opt(name).await? else { return Ok(false) };
    if lease.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) != Some(holder) {
        return Ok(false);
    }
    leases.replace(name, &PostParams::default(), &released(&lease, k8s_openapi::jiff::Timestamp::now())).await?;
    Ok(true)
}

/// Whether a failed Lease call is worth another try: the API server or etcd failing for a moment
/// (5xx, 429), a conflict with a write in flight (409: read again), or no answer at all. Not a
/// refusal (401, 403) or a bad request.
pub fn retryable(err: &kube::Error) -> bool {
    match err {
        kube::Error::Api(status) => status.code >= 500 || status.code == 409 || status.code == 429,
        _ => true,
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
    fn passing_failures_are_retried_refusals_are_not() {
        let api = |code: u16, message: &str| kube::Error::Api(Box::new(kube::core::Status { code, message: message.into(), ..Default::default() }));
        assert!(retryable(&api(500, "rpc error: code = Unknown desc = raft proposal dropped")), "etcd mid-hand-over");
        assert!(retryable(&api(409, "the object has been modified")), "a renewal in flight");
        assert!(retryable(&api(429, "too many requests")));
        assert!(retryable(&api(503, "unavailable")));
        assert!(!retryable(&api(403, "forbidden")));
        assert!(!retryable(&api(404, "not found")));
        assert!(!retryable(&api(422, "invalid")));
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
