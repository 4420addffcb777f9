//! Workers that join by token (`keelson.io/node-bootstrap: token`): Kubernetes bootstrap tokens that
//! expire and rotate ([`token`]), and the approval of a worker's first client certificate, refused
//! for control planes' and existing Nodes' names ([`csr`]).
//!
//! Runs on every control plane as its own task ([`run`]), as the user [`USER`], whose RBAC
//! ([`cluster_role`], [`secrets_role`]) allows reading CSRs and Nodes, deciding kubelet client CSRs,
//! and reading and creating Secrets in `kube-system`. Both halves are idempotent: no leader.

pub mod csr;
pub mod token;

use std::collections::BTreeSet;
use std::time::{Duration, Instant, SystemTime};

use base::StateStore;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role as RbacRole, RoleBinding, RoleRef, Subject};
use keelson_api::Role;
use kube::api::{ListParams, Patch, PatchParams};

use crate::metrics::Metrics;
use crate::node_labels::{NodeCloud, NodeFacts};
use csr::{CloudAnswer, CsrFacts, Known, Refusal};

/// The identity the approver and the token rotation talk to the API as.
pub const USER: &str = "keelson:node-bootstrap";
const FIELD_MANAGER: &str = "keelson-node-bootstrap";
/// How often pending CSRs are looked for.
pub const CSR_POLL: Duration = Duration::from_secs(2);
/// Longest time between two looks at the token.
pub const TOKEN_RECHECK: Duration = Duration::from_secs(300);
/// The wait after a failure.
const RETRY: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum NodeBootstrapError {
    #[error(transparent)]
    Store(#[from] base::StoreError),
    #[error(transparent)]
    Token(#[from] base::bootstrap_token::BootstrapTokenError),
    #[error("Kubernetes API: {what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("API client: {0}")]
    Client(#[from] crate::addons::AddonError),
}

pub(crate) fn kube_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> NodeBootstrapError {
    let what = what.into();
    move |source| NodeBootstrapError::Kube { what, source }
}

fn rule(group: &str, resources: &[&str], verbs: &[&str], names: Option<&[&str]>) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.to_string()]),
        resources: Some(resources.iter().map(|r| r.to_string()).collect()),
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        resource_names: names.map(|n| n.iter().map(|r| r.to_string()).collect()),
        ..Default::default()
    }
}

fn subject() -> Vec<Subject> {
    vec![Subject { api_group: Some("rbac.authorization.k8s.io".into()), kind: "User".into(), name: USER.into(), namespace: None }]
}

/// The ClusterRole of [`USER`]: read CSRs and Nodes, decide kubelet client CSRs; nothing else.
pub fn cluster_role() -> ClusterRole {
    ClusterRole {
        metadata: kube::api::ObjectMeta { name: Some(USER.into()), ..Default::default() },
        rules: Some(vec![
            rule("certificates.k8s.io", &["certificatesigningrequests"], &["get", "list", "watch"], None),
            rule("certificates.k8s.io", &["certificatesigningrequests/approval"], &["update", "patch"], None),
            rule("certificates.k8s.io", &["signers"], &["approve"], Some(&[csr::KUBELET_CLIENT_SIGNER][..])),
            rule("", &["nodes"], &["get", "list"], None),
        ]),
        ..Default::default()
    }
}

/// The Role of [`USER`] in `kube-system`: read and create Secrets (the bootstrap tokens).
pub fn secrets_role() -> RbacRole {
    RbacRole {
        metadata: kube::api::ObjectMeta { name: Some(USER.into()), namespace: Some(token::NAMESPACE.into()), ..Default::default() },
        rules: Some(vec![rule("", &["secrets"], &["get", "create"], None)]),
    }
}

/// A client as [`USER`] (no group): its roles and bindings are applied first, through the addon
/// controller's `system:masters` client, which is then dropped.
pub async fn client(store: &StateStore, server: &str) -> Result<kube::Client, NodeBootstrapError> {
    let admin = crate::addons::client(store, server).await?;
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    let role_ref = |kind: &str| RoleRef { api_group: "rbac.authorization.k8s.io".into(), kind: kind.into(), name: USER.into() };
    kube::Api::<ClusterRole>::all(admin.clone())
        .patch(USER, &apply, &Patch::Apply(&cluster_role()))
        .await
        .map_err(kube_err(format!("apply ClusterRole {USER}")))?;
    let binding = ClusterRoleBinding {
        metadata: kube::api::ObjectMeta { name: Some(USER.into()), ..Default::default() },
        role_ref: role_ref("ClusterRole"),
        subjects: Some(subject()),
    };
    kube::Api::<ClusterRoleBinding>::all(admin.clone())
        .patch(USER, &apply, &Patch::Apply(&binding))
        .await
        .map_err(kube_err(format!("apply ClusterRoleBinding {USER}")))?;
    kube::Api::<RbacRole>::namespaced(admin.clone(), token::NAMESPACE)
        .patch(USER, &apply, &Patch::Apply(&secrets_role()))
        .await
        .map_err(kube_err(format!("apply Role {}/{USER}", token::NAMESPACE)))?;
    let binding = RoleBinding {
        metadata: kube::api::ObjectMeta { name: Some(USER.into()), namespace: Some(token::NAMESPACE.into()), ..Default::default() },
        role_ref: role_ref("Role"),
        subjects: Some(subject()),
    };
    kube::Api::<RoleBinding>::namespaced(admin, token::NAMESPACE)
        .patch(USER, &apply, &Patch::Apply(&binding))
        .await
        .map_err(kube_err(format!("apply RoleBinding {}/{USER}", token::NAMESPACE)))?;
    Ok(crate::addons::client_as(store, server, USER, &[]).await?)
}

/// The zones the cluster's instance groups run in (`instancegroup/*`, `spec.zones`), sorted: where
/// to look an instance name up on GCE, which addresses instances by zone (a CSR names no zone).
pub async fn group_zones(store: &StateStore) -> Result<Vec<String>, NodeBootstrapError> {
    let mut zones = BTreeSet::new();
    for rel in store.list("instancegroup/").await? {
        let Some(bytes) = store.get(&rel).await? else { continue };
        match serde_yaml_ng::from_slice::<keelson_api::InstanceGroup>(&bytes) {
            Ok(ig) => zones.extend(ig.spec.zones.unwrap_or_default()),
            Err(e) => tracing::warn!(key = %store.url(&rel), error = %e, "node bootstrap: not an instance group"),
        }
    }
    Ok(zones.into_iter().collect())
}

/// What the cloud says of `name`: the group of the instance of that name, and that group's role.
/// On GCE the name is looked up in each of the groups' zones ([`group_zones`]).
pub async fn ask_cloud(cloud: &NodeCloud, store: &StateStore, name: &str) -> CloudAnswer {
    let hints: Vec<Option<String>> = match cloud {
        NodeCloud::Aws(_) => vec![None],
        NodeCloud::Gce(_) => match group_zones(store).await {
            Ok(zones) => zones.into_iter().map(Some).collect(),
            Err(e) => return CloudAnswer::Unknown { message: format!("the groups' zones: {e}") },
        },
    };
    let mut last = "the cluster's groups name no zone".to_string();
    for zone in hints {
        let facts = NodeFacts { name: name.to_string(), zone, ..Default::default() };
        match cloud.identify(&[&facts]).await.into_iter().next() {
            Some(Ok(id)) => {
                return match crate::node_labels::read_group_role(store, &id.group).await {
                    Ok(Role::Node) => CloudAnswer::Worker { group: id.group },
                    Ok(_) => CloudAnswer::ControlPlane { group: id.group },
                    Err(e) => CloudAnswer::Unknown { message: format!("group {}: {e}", id.group) },
                }
            }
            Some(Err(u)) => last = u.message,
            None => last = "the cloud gave no answer".into(),
        }
    }
    CloudAnswer::Unknown { message: last }
}

/// What one approval pass did.
#[derive(Debug, Default)]
pub struct ApprovalReport {
    /// (CSR, Node name).
    pub approved: Vec<(String, String)>,
    pub denied: Vec<(String, Refusal)>,
    /// (CSR, error): the decision could not be written (another control plane's came first).
    pub failed: Vec<(String, String)>,
}

/// The names of the control planes the API knows: Nodes with a control-plane label.
pub fn control_plane_nodes(nodes: &[Node]) -> BTreeSet<String> {
    nodes
        .iter()
        .filter(|n| n.metadata.labels.as_ref().is_some_and(|l| csr::CONTROL_PLANE_LABELS.iter().any(|k| l.contains_key(*k))))
        .filter_map(|n| n.metadata.name.clone())
        .collect()
}

/// Decide every pending bootstrap CSR ([`csr`]). `own_name`: this control plane's Node name
/// (known before its Node registers).
pub async fn approve_pass(
    client: &kube::Client,
    cloud: Option<&NodeCloud>,
    store: &StateStore,
    own_name: Option<&str>,
) -> Result<ApprovalReport, NodeBootstrapError> {
    let csrs: kube::Api<CertificateSigningRequest> = kube::Api::all(client.clone());
    let pending: Vec<CsrFacts> = csrs
        .list(&ListParams::default())
        .await
        .map_err(kube_err("list CertificateSigningRequests"))?
        .items
        .iter()
        .map(CsrFacts::of)
        .filter(CsrFacts::is_bootstrap_request)
        .collect();
    let mut report = ApprovalReport::default();
    if pending.is_empty() {
        return Ok(report);
    }
    let nodes = kube::Api::<Node>::all(client.clone()).list(&ListParams::default()).await.map_err(kube_err("list Nodes"))?.items;
    let mut known = Known { nodes: nodes.iter().filter_map(|n| n.metadata.name.clone()).collect(), control_planes: control_plane_nodes(&nodes) };
    known.control_planes.extend(own_name.map(str::to_string));
    let now = base::bootstrap_token::rfc3339(SystemTime::now());
    for facts in pending {
        let subject = base::pki::csr_subject(&facts.request).map_err(|e| e.to_string());
        let verdict = match csr::requested_node(&facts, subject.as_ref().map_err(Clone::clone)) {
            Ok(name) => {
                let answer = match cloud {
                    Some(c) => Some(ask_cloud(c, store, &name).await),
                    None => None,
                };
                csr::judge_name(&name, &known, answer.as_ref()).map(|()| name)
            }
            Err(r) => Err(r),
        };
        let (approve, message) = match &verdict {
            Ok(name) => (true, format!("Keelson: first client certificate for worker {name} (requested by {})", facts.username)),
            Err(r) => (false, format!("Keelson: {} (requested by {})", r.message, facts.username)),
        };
        let patch = csr::decision_patch(facts.resource_version.as_deref(), approve, &message, &now);
        match csrs.patch_approval(&facts.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => match verdict {
                Ok(name) => report.approved.push((facts.name, name)),
                Err(r) => report.denied.push((facts.name, r)),
            },
            Err(e) => report.failed.push((facts.name.clone(), kube_err(format!("decide CertificateSigningRequest {}", facts.name))(e).to_string())),
        }
    }
    Ok(report)
}

fn record(report: &ApprovalReport, metrics: &Metrics) {
    for (csr, node) in &report.approved {
        tracing::info!(csr = %csr, node = %node, "node bootstrap: approved a worker's first client certificate");
    }
    for (csr, r) in &report.denied {
        tracing::warn!(csr = %csr, reason = r.reason, "node bootstrap: denied: {}", r.message);
    }
    for (csr, e) in &report.failed {
        tracing::info!(csr = %csr, "node bootstrap: decision not written: {e}");
    }
    metrics.update(|s| {
        s.bootstrap_csrs_approved += report.approved.len() as u64;
        for (_, r) in &report.denied {
            *s.bootstrap_csrs_denied.entry(r.reason.to_string()).or_default() += 1;
        }
    });
}

/// Run until the process ends: keep a current bootstrap token ([`token::pass`]) and decide pending
/// bootstrap CSRs every [`CSR_POLL`].
pub async fn run(store: StateStore, server: String, cloud: Option<NodeCloud>, own_name: Option<String>, metrics: Metrics) {
    // The client's certificate lives 24 h: a new one well before.
    const RENEW_AFTER: Duration = Duration::from_secs(12 * 3600);
    let mut client: Option<(kube::Client, Instant)> = None;
    let mut token_due = Instant::now();
    loop {
        if client.as_ref().is_none_or(|(_, issued)| issued.elapsed() >= RENEW_AFTER) {
            match self::client(&store, &server).await {
                Ok(c) => client = Some((c, Instant::now())),
                Err(e) => {
                    tracing::warn!(error = %e, "node bootstrap: no API client yet");
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            }
        }
        let Some((c, _)) = &client else { continue };
        if Instant::now() >= token_due {
            let now = SystemTime::now();
            let secrets: kube::Api<Secret> = kube::Api::namespaced(c.clone(), token::NAMESPACE);
            match token::pass(&store, &secrets, now, token::TTL).await {
                Ok(outcome) => {
                    if let token::Outcome::Minted { id, expires, reason } = &outcome {
                        tracing::info!(id = %id, expires = %base::bootstrap_token::rfc3339(*expires), "node bootstrap: minted and published a bootstrap token ({reason})");
                        metrics.update(|s| s.bootstrap_token_rotations += 1);
                    }
                    let expires = outcome.expires().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_secs_f64();
                    metrics.update(|s| s.bootstrap_token_expiry_unix = expires);
                    token_due = Instant::now() + outcome.next_check(now, TOKEN_RECHECK);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "node bootstrap: the token pass failed");
                    metrics.update(|s| s.bootstrap_token_failures += 1);
                    token_due = Instant::now() + RETRY;
                }
            }
        }
        match approve_pass(c, cloud.as_ref(), &store, own_name.as_deref()).await {
            Ok(report) => record(&report, &metrics),
            Err(e) => {
                tracing::warn!(error = %e, "node bootstrap: looking at CSRs failed");
                client = None;
                tokio::time::sleep(RETRY).await;
                continue;
            }
        }
        tokio::time::sleep(CSR_POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_approver_may_decide_only_kubelet_client_csrs_and_touch_only_kube_system_secrets() {
        let rules = cluster_role().rules.expect("rules");
        let signers = rules.iter().find(|r| r.resources.as_deref() == Some(&["signers".to_string()][..])).expect("signers rule");
        assert_eq!(signers.resource_names.as_deref(), Some(&[csr::KUBELET_CLIENT_SIGNER.to_string()][..]));
        assert_eq!(signers.verbs, vec!["approve".to_string()]);
        for r in &rules {
            assert!(!r.verbs.iter().any(|v| v == "*" || v == "delete" || v == "create"), "{r:?}");
            assert!(!r.resources.iter().flatten().any(|x| x == "secrets" || x == "*"), "{r:?}");
        }
        let role = secrets_role();
        assert_eq!(role.metadata.namespace.as_deref(), Some("kube-system"));
        let rules = role.rules.expect("rules");
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].verbs, vec!["get".to_string(), "create".to_string()], "no list, no delete: tokencleaner deletes");
    }

    #[test]
    fn control_planes_are_known_by_their_labels() {
        let node = |name: &str, label: Option<&str>| -> Node {
            let labels: serde_json::Map<String, serde_json::Value> = label.map(|l| (l.to_string(), serde_json::Value::from(""))).into_iter().collect();
            serde_json::from_value(serde_json::json!({"metadata": {"name": name, "labels": labels}})).expect("node")
        };
        let nodes = [
            node("cp-a", Some("node-role.kubernetes.io/control-plane")),
            node("cp-old", Some("node-role.kubernetes.io/master")),
            node("w", Some("node-role.kubernetes.io/node")),
            node("bare", None),
        ];
        assert_eq!(control_plane_nodes(&nodes), ["cp-a", "cp-old"].map(String::from).into());
    }
}
