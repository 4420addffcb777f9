//! Taking a node out of the cluster before its instance is terminated, as kOps' rolling update does:
//! every node to be replaced is annotated `kops.k8s.io/needs-update` and tainted
//! `kops.k8s.io/scheduled-for-update:PreferNoSchedule` up front (so evicted pods prefer nodes that
//! stay); then, one node at a time, it is cordoned, labelled
//! `node.kubernetes.io/exclude-from-external-load-balancers` (service load balancers stop sending it
//! traffic) and drained through the Eviction API, which honours PodDisruptionBudgets: a refused
//! eviction (429) is retried until the drain timeout. DaemonSet pods and mirror (static) pods stay;
//! pods with emptyDir volumes and pods of no controller are evicted.
//!
//! The decisions (which pods, what to do after an eviction answer, the taint list) are pure functions
//! with table tests; the Kubernetes calls are thin around them.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use kube::api::{EvictParams, ListParams, Patch, PatchParams};

use crate::groups::GroupStatus;

/// The taint kOps puts on every node a rolling update will replace.
pub const TAINT_KEY: &str = "kops.k8s.io/scheduled-for-update";
/// A Node with this annotation needs replacing, whatever its launch-template version (kOps).
pub const NEEDS_UPDATE: &str = "kops.k8s.io/needs-update";
/// Service load balancers leave out nodes with this label.
pub const EXCLUDE_LB: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    #[error("node {node}: {what}: {source}")]
    Kube {
        node: String,
        what: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("node {node}: {message}")]
    Evict { node: String, message: String },
    #[error("node {node}: pods still running after the drain timeout ({timeout:?}): {pods}")]
    Timeout { node: String, timeout: Duration, pods: String },
}

/// What a drain does with a pod on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodAction {
    Evict,
    /// Left on the node, with the reason.
    Leave(&'static str),
}

/// kubectl drain's selection with kOps' options (`--ignore-daemonsets --delete-emptydir-data --force`).
pub fn pod_action(p: &Pod) -> PodAction {
    if p.metadata.annotations.as_ref().is_some_and(|a| a.contains_key("kubernetes.io/config.mirror")) {
        return PodAction::Leave("mirror pod");
    }
    if p.metadata.owner_references.iter().flatten().any(|o| o.controller == Some(true) && o.kind == "DaemonSet") {
        return PodAction::Leave("DaemonSet");
    }
    match p.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Succeeded") | Some("Failed") => PodAction::Leave("finished"),
        _ => PodAction::Evict,
    }
}

/// What to do after the Eviction API answered for one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictStep {
    /// Accepted: wait for the pod to go.
    Evicted,
    /// The pod is already gone.
    Gone,
    /// Refused for now (a PodDisruptionBudget): try again after the delay.
    Retry(Duration),
    /// Give up on the drain.
    Fail(String),
}

/// `answer`: `Ok` for an accepted eviction, else the HTTP status and message. Refusals (429, a
/// PodDisruptionBudget that allows no disruption now) are retried every `retry` while the next try
/// still falls before `deadline`.
pub fn after_eviction(answer: Result<(), (u16, String)>, now: Instant, deadline: Instant, retry: Duration) -> EvictStep {
    match answer {
        Ok(()) => EvictStep::Evicted,
        Err((404, _)) => EvictStep::Gone,
        Err((429, _)) if now + retry < deadline => EvictStep::Retry(retry),
        Err((429, message)) => EvictStep::Fail(format!("eviction still refused at the drain timeout (a PodDisruptionBudget allows no disruption): {message}")),
        Err((code, message)) => EvictStep::Fail(format!("eviction failed (HTTP {code}): {message}")),
    }
}

/// The node's taints with the rolling-update taint added; `None` when it is already there.
pub fn with_update_taint(taints: &[Taint]) -> Option<Vec<Taint>> {
    if taints.iter().any(|t| t.key == TAINT_KEY) {
        return None;
    }
    let mut out = taints.to_vec();
    out.push(Taint { key: TAINT_KEY.into(), effect: "PreferNoSchedule".into(), ..Default::default() });
    Some(out)
}

fn internal_ips(n: &Node) -> impl Iterator<Item = &str> {
    n.status.iter().flat_map(|s| s.addresses.iter().flatten()).filter(|a| a.type_ == "InternalIP").map(|a| a.address.as_str())
}

/// Node names by private IP (instances are matched to Nodes by the Node's `InternalIP`, as
/// `validate cluster` does).
pub fn nodes_by_ip(nodes: &[Node]) -> BTreeMap<String, &Node> {
    nodes.iter().flat_map(|n| internal_ips(n).map(move |ip| (ip.to_string(), n))).collect()
}

/// Mark as outdated every instance whose Node carries [`NEEDS_UPDATE`] (kOps' `AdjustNeedUpdate`).
pub fn adjust_need_update(groups: &mut [GroupStatus], nodes: &[Node]) {
    let by_ip = nodes_by_ip(nodes);
    for g in groups {
        for i in &mut g.instances {
            let marked = i
                .private_ip
                .as_ref()
                .and_then(|ip| by_ip.get(ip))
                .is_some_and(|n| n.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(NEEDS_UPDATE)));
            if marked && !i.lifecycle.starts_with("Terminat") {
                i.outdated = true;
            }
        }
    }
}

pub async fn list_nodes(kube: &kube::Client) -> Result<Vec<Node>, DrainError> {
    let nodes = kube::Api::<Node>::all(kube.clone()).list(&ListParams::default()).await.map_err(|source| DrainError::Kube {
        node: "*".into(),
        what: "list nodes",
        source,
    })?;
    Ok(nodes.items)
}

fn not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

async fn patch_node(kube: &kube::Client, node: &str, what: &'static str, body: serde_json::Value) -> Result<(), DrainError> {
    match kube::Api::<Node>::all(kube.clone()).patch(node, &PatchParams::default(), &Patch::Merge(&body)).await {
        Ok(_) => Ok(()),
        Err(e) if not_found(&e) => Ok(()),
        Err(source) => Err(DrainError::Kube { node: node.into(), what, source }),
    }
}

/// Annotate the node [`NEEDS_UPDATE`] and taint it [`TAINT_KEY`]`:PreferNoSchedule` (a missing node is
/// no error: it is already gone).
pub async fn mark_for_update(kube: &kube::Client, node: &str) -> Result<(), DrainError> {
    patch_node(kube, node, "annotate", serde_json::json!({"metadata": {"annotations": {NEEDS_UPDATE: ""}}})).await?;
    let api = kube::Api::<Node>::all(kube.clone());
    // Taints are a list: read, add, write back conditioned on the version read (retried on conflict).
    for _ in 0..5 {
        let n = match api.get(node).await {
            Ok(n) => n,
            Err(e) if not_found(&e) => return Ok(()),
            Err(source) => return Err(DrainError::Kube { node: node.into(), what: "get", source }),
        };
        let Some(taints) = with_update_taint(n.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or_default()) else { return Ok(()) };
        let body = serde_json::json!({"metadata": {"resourceVersion": n.metadata.resource_version}, "spec": {"taints": taints}});
        match api.patch(node, &PatchParams::default(), &Patch::Merge(&body)).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) if not_found(&e) => return Ok(()),
            Err(source) => return Err(DrainError::Kube { node: node.into(), what: "taint", source }),
        }
    }
    Err(DrainError::Evict { node: node.into(), message: "the node kept changing while tainting it".into() })
}

/// How a drain runs.
#[derive(Debug, Clone)]
pub struct DrainOptions {
    /// `--drain-timeout` (kOps: 15 min).
    pub timeout: Duration,
    /// Pause between eviction retries and while waiting for evicted pods to go (kOps: 5 s).
    pub retry: Duration,
}

/// The client must not retry 429s itself (kube's `default_retry`, off in
/// [`crate::validate::kube_client`]): a refused eviction is this function's to retry, within the
/// drain timeout.
///
/// Cordon, exclude from service load balancers, evict every pod [`pod_action`] selects (retrying
/// refusals until the timeout) and wait until they are gone.
pub async fn drain(kube: &kube::Client, node: &str, opts: &DrainOptions, log: &mut (dyn FnMut(&str) + Send)) -> Result<(), DrainError> {
    patch_node(kube, node, "cordon", serde_json::json!({"spec": {"unschedulable": true}})).await?;
    patch_node(kube, node, "label", serde_json::json!({"metadata": {"labels": {EXCLUDE_LB: ""}}})).await?;
    let deadline = Instant::now() + opts.timeout;
    let pods_api = kube::Api::<Pod>::all(kube.clone());
    let on_node = ListParams::default().fields(&format!("spec.nodeName={node}"));
    let list = pods_api.list(&on_node).await.map_err(|source| DrainError::Kube { node: node.into(), what: "list pods", source })?;
    let mut pending: Vec<(String, String, String)> = Vec::new();
    for p in &list.items {
        let (ns, name) = (p.metadata.namespace.clone().unwrap_or_default(), p.metadata.name.clone().unwrap_or_default());
        match pod_action(p) {
            PodAction::Evict => pending.push((ns, name, p.metadata.uid.clone().unwrap_or_default())),
            PodAction::Leave(why) => log(&format!("node {node}: leaving {ns}/{name} ({why})")),
        }
    }
    let mut evicted = Vec::new();
    while !pending.is_empty() {
        let mut refused = Vec::new();
        for (ns, name, uid) in pending {
            // Bounded by the drain's deadline even when the client retries 429s itself.
            let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_secs(1));
            let (api, params) = (kube::Api::<Pod>::namespaced(kube.clone(), &ns), EvictParams::default());
            let answer = match tokio::time::timeout(left, api.evict(&name, &params)).await {
                Err(_) => return Err(DrainError::Timeout { node: node.into(), timeout: opts.timeout, pods: format!("{ns}/{name} (eviction not accepted)") }),
                Ok(Ok(_)) => Ok(()),
                Ok(Err(kube::Error::Api(s))) => Err((s.code, s.message.clone())),
                Ok(Err(source)) => return Err(DrainError::Kube { node: node.into(), what: "evict", source }),
            };
            match after_eviction(answer, Instant::now(), deadline, opts.retry) {
                EvictStep::Evicted => {
                    log(&format!("node {node}: evicted {ns}/{name}"));
                    evicted.push((ns, name, uid));
                }
                EvictStep::Gone => {}
                EvictStep::Retry(_) => refused.push((ns, name, uid)),
                EvictStep::Fail(message) => return Err(DrainError::Evict { node: node.into(), message: format!("{ns}/{name}: {message}") }),
            }
        }
        if !refused.is_empty() {
            log(&format!("node {node}: {} eviction(s) refused by a PodDisruptionBudget, retrying in {:?}", refused.len(), opts.retry));
            tokio::time::sleep(opts.retry).await;
        }
        pending = refused;
    }
    // Evicted pods terminate gracefully; the drain ends when none of them is left on the node.
    loop {
        let now = pods_api.list(&on_node).await.map_err(|source| DrainError::Kube { node: node.into(), what: "list pods", source })?;
        let left: Vec<String> = evicted
            .iter()
            .filter(|(ns, name, uid)| {
                now.items
                    .iter()
                    .any(|p| p.metadata.namespace.as_deref() == Some(ns) && p.metadata.name.as_deref() == Some(name) && p.metadata.uid.as_deref() == Some(uid))
            })
            .map(|(ns, name, _)| format!("{ns}/{name}"))
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(DrainError::Timeout { node: node.into(), timeout: opts.timeout, pods: left.join(", ") });
        }
        tokio::time::sleep(opts.retry).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn pod(owner: Option<&str>, mirror: bool, phase: &str, empty_dir: bool) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("p".into());
        if let Some(kind) = owner {
            p.metadata.owner_references = Some(vec![OwnerReference {
                kind: kind.into(),
                name: "o".into(),
                controller: Some(true),
                api_version: "apps/v1".into(),
                uid: "u".into(),
                ..Default::default()
            }]);
        }
        if mirror {
            p.metadata.annotations = Some([("kubernetes.io/config.mirror".to_string(), "x".to_string())].into());
        }
        if empty_dir {
            let spec = p.spec.get_or_insert_with(Default::default);
            spec.volumes = Some(vec![k8s_openapi::api::core::v1::Volume { name: "scratch".into(), empty_dir: Some(Default::default()), ..Default::default() }]);
        }
        p.status = Some(PodStatus { phase: Some(phase.into()), ..Default::default() });
        p
    }

    #[test]
    fn a_drain_evicts_workloads_and_leaves_daemonsets_and_static_pods() {
        let cases = [
            (pod(Some("ReplicaSet"), false, "Running", false), PodAction::Evict),
            (pod(Some("StatefulSet"), false, "Pending", false), PodAction::Evict),
            // emptyDir data is allowed to go (kOps: DeleteEmptyDirData).
            (pod(Some("ReplicaSet"), false, "Running", true), PodAction::Evict),
            // A pod of no controller is evicted too (kOps: Force).
            (pod(None, false, "Running", false), PodAction::Evict),
            (pod(Some("DaemonSet"), false, "Running", false), PodAction::Leave("DaemonSet")),
            (pod(Some("Node"), true, "Running", false), PodAction::Leave("mirror pod")),
            (pod(Some("Job"), false, "Succeeded", false), PodAction::Leave("finished")),
            (pod(Some("ReplicaSet"), false, "Failed", false), PodAction::Leave("finished")),
        ];
        for (i, (p, want)) in cases.iter().enumerate() {
            assert_eq!(pod_action(p), *want, "case {i}");
        }
    }

    #[test]
    fn refused_evictions_are_retried_until_the_drain_timeout() {
        let t0 = Instant::now();
        let retry = Duration::from_secs(5);
        let deadline = t0 + Duration::from_secs(60);
        let pdb = || Err((429, "Cannot evict pod as it would violate the pod's disruption budget.".to_string()));
        assert_eq!(after_eviction(Ok(()), t0, deadline, retry), EvictStep::Evicted);
        assert_eq!(after_eviction(Err((404, "not found".into())), t0, deadline, retry), EvictStep::Gone);
        assert_eq!(after_eviction(pdb(), t0, deadline, retry), EvictStep::Retry(retry));
        assert_eq!(after_eviction(pdb(), t0 + Duration::from_secs(54), deadline, retry), EvictStep::Retry(retry));
        let EvictStep::Fail(m) = after_eviction(pdb(), t0 + Duration::from_secs(55), deadline, retry) else { panic!("the timeout ends the retries") };
        assert!(m.contains("PodDisruptionBudget") && m.contains("disruption budget"), "{m}");
        let EvictStep::Fail(m) = after_eviction(Err((500, "boom".into())), t0, deadline, retry) else { panic!("other errors fail at once") };
        assert!(m.contains("HTTP 500"), "{m}");
        assert!(matches!(after_eviction(Err((403, "forbidden".into())), t0, deadline, retry), EvictStep::Fail(_)));
    }

    #[test]
    fn the_update_taint_is_added_once() {
        let other = Taint { key: "dedicated".into(), effect: "NoSchedule".into(), value: Some("x".into()), ..Default::default() };
        let added = with_update_taint(std::slice::from_ref(&other)).expect("added");
        assert_eq!(added.len(), 2);
        assert_eq!(added[0], other);
        assert_eq!((added[1].key.as_str(), added[1].effect.as_str()), (TAINT_KEY, "PreferNoSchedule"));
        assert_eq!(with_update_taint(&added), None);
        assert_eq!(with_update_taint(&[]).expect("added").len(), 1);
    }

    #[test]
    fn annotated_nodes_need_update_whatever_their_version() {
        use crate::groups::InstanceStatus;
        use k8s_openapi::api::core::v1::{NodeAddress, NodeStatus};
        let node = |name: &str, ip: &str, annotated: bool| {
            let mut n = Node::default();
            n.metadata.name = Some(name.into());
            if annotated {
                n.metadata.annotations = Some([(NEEDS_UPDATE.to_string(), String::new())].into());
            }
            n.status = Some(NodeStatus { addresses: Some(vec![NodeAddress { type_: "InternalIP".into(), address: ip.into() }]), ..Default::default() });
            n
        };
        let inst =
            |id: &str, ip: &str| InstanceStatus { version: Some("2".into()), private_ip: Some(ip.into()), ..InstanceStatus::for_test(id, "InService", false) };
        let mut groups = vec![GroupStatus {
            name: "nodes.c".into(),
            group: "nodes".into(),
            role: keelson_api::Role::Node,
            target_version: "2".into(),
            min: 2,
            max: 2,
            desired: 2,
            instances: vec![inst("i-1", "10.0.0.1"), inst("i-2", "10.0.0.2")],
        }];
        adjust_need_update(&mut groups, &[node("a", "10.0.0.1", true), node("b", "10.0.0.2", false)]);
        assert_eq!(groups[0].outdated().iter().map(|i| i.id.as_str()).collect::<Vec<_>>(), ["i-1"]);
    }
}
