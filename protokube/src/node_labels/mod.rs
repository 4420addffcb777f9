//! The node labeller (kOps' kops-controller node controller): every Node gets the labels of its
//! instance group — the group's completed node labels, as `keelson compile` wrote them into the
//! group's NodeupConfig (`KubeletConfig.nodeLabels`: `node-role.kubernetes.io/node` on workers,
//! `node-role.kubernetes.io/control-plane` and the other control-plane labels, the group's own
//! `spec.nodeLabels`), `kops.k8s.io/instancegroup=<group>`, and on AWS
//! `node-role.kubernetes.io/spot-worker=true` for a spot instance. The kubelet may not set most of
//! them itself (`node-role.kubernetes.io/…`, `kops.k8s.io/…`: NodeRestriction), so nodeup leaves
//! them out of its `--node-labels` and this controller, on every control plane, puts them on.
//!
//! Labels are only added or corrected, never removed: a merge patch of the keys that are missing
//! or different ([`label_changes`]); labels someone else set stay.
//!
//! Which group a Node is of is decided from the cloud, never from the Node: its labels and
//! `spec.providerID` are written by its own kubelet. Only the Node's **name** is trusted: the join
//! server issued the kubelet's certificate for `system:node:<name>` after verifying the instance's
//! cloud identity, with `<name>` the instance's private DNS name (AWS) or its name (GCE), and
//! NodeRestriction lets a kubelet create and edit only the Node of its own name. So the group is
//! the group of the instance of that name, as the cloud says ([`aws`], [`gce`]); a worker cannot
//! get another group's labels (the control-plane label attracts the cloud-controller-manager and
//! its cloud credentials). The node-chosen `spec.providerID` is only used to refuse: when it names
//! another instance than the one of the Node's name, the Node is not labelled ([`aws::identify`]).
//!
//! Runs as its own task ([`run`]): a list of every Node, then a watch; each Added or Modified Node
//! is labelled as the event arrives (within a second of registering), and the list is repeated every
//! [`RELIST`] (nodes refused before are tried again). Cloud answers are cached per Node
//! ([`IDENTITY_TTL`]), group labels per group ([`GROUP_TTL`]).

pub mod aws;
pub mod gce;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use base::StateStore;
use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use keelson_api::nodeup::NodeupConfig;
use keelson_api::{InstanceGroup, Role};
use kube::api::{ListParams, Patch, PatchParams, WatchEvent, WatchParams};

use crate::metrics::Metrics;

/// The label naming a Node's instance group (kOps' `kops.k8s.io/instancegroup`).
pub const INSTANCE_GROUP_LABEL: &str = "kops.k8s.io/instancegroup";
/// The zone label the kubelet sets (a hint only: node-chosen).
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// The identity the labeller talks to the API as, and its ClusterRole and binding.
pub const USER: &str = "keelson:node-labels";
const FIELD_MANAGER: &str = "keelson-node-labels";
/// How long what the cloud said of a Node holds.
pub const IDENTITY_TTL: Duration = Duration::from_secs(600);
/// How soon a Node the cloud did not vouch for is asked about again.
pub const RETRY_UNIDENTIFIED: Duration = Duration::from_secs(20);
/// How long a group's labels, read from the state store, hold.
pub const GROUP_TTL: Duration = Duration::from_secs(60);
/// How often every Node is listed again.
pub const RELIST: Duration = Duration::from_secs(300);
/// How long one watch request lasts (server side).
const WATCH_TIMEOUT_SECS: u32 = 290;
/// The wait after a failed list or client, before trying again.
const RETRY: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum NodeLabelError {
    #[error(transparent)]
    Store(#[from] base::StoreError),
    #[error("{what}: {source}")]
    Yaml {
        what: String,
        #[source]
        source: serde_yaml_ng::Error,
    },
    #[error("instance group {group}: {message}")]
    Group { group: String, message: String },
    #[error("Kubernetes API: {what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("API client: {0}")]
    Client(#[from] crate::addons::AddonError),
}

fn kube_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> NodeLabelError {
    let what = what.into();
    move |source| NodeLabelError::Kube { what, source }
}

/// What the labeller reads of a Node. Everything but `name` is the kubelet's word.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFacts {
    pub name: String,
    pub uid: String,
    /// `spec.providerID` (node-chosen: only ever a reason to refuse).
    pub provider_id: Option<String>,
    /// The [`ZONE_LABEL`] (node-chosen: a hint where to look).
    pub zone: Option<String>,
    pub labels: BTreeMap<String, String>,
}

impl NodeFacts {
    pub fn of(node: &Node) -> NodeFacts {
        let labels = node.metadata.labels.clone().unwrap_or_default();
        NodeFacts {
            name: node.metadata.name.clone().unwrap_or_default(),
            uid: node.metadata.uid.clone().unwrap_or_default(),
            provider_id: node.spec.as_ref().and_then(|s| s.provider_id.clone()).filter(|p| !p.is_empty()),
            zone: labels.get(ZONE_LABEL).cloned(),
            labels,
        }
    }
}

/// What the cloud vouches for: the Node's instance and its group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub group: String,
    /// The instance id (AWS) or name (GCE).
    pub instance: String,
    /// Labels of the instance itself (AWS spot: [`aws::SPOT_LABEL`]).
    pub labels: BTreeMap<String, String>,
}

/// Why a Node is not labelled: a short `reason` (the failure metric's label) and what was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Unidentified {
    pub reason: &'static str,
    pub message: String,
}

pub(crate) fn unidentified(reason: &'static str, message: impl Into<String>) -> Unidentified {
    Unidentified { reason, message: message.into() }
}

impl From<crate::node_join::Refusal> for Unidentified {
    fn from(r: crate::node_join::Refusal) -> Unidentified {
        Unidentified { reason: r.reason, message: r.message }
    }
}

/// The labels a Node of `group` must carry: the group's completed node labels, the instance's own,
/// and [`INSTANCE_GROUP_LABEL`]`=group` (the cloud's group name wins over a `spec.nodeLabels` entry
/// of that key).
pub fn desired_labels(group: &str, group_labels: &BTreeMap<String, String>, instance_labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut want = group_labels.clone();
    want.extend(instance_labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    want.insert(INSTANCE_GROUP_LABEL.to_string(), group.to_string());
    want
}

/// The labels to set: those of `desired` that `current` lacks or holds with another value. Labels
/// only `current` has are not touched.
pub fn label_changes(current: &BTreeMap<String, String>, desired: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    desired.iter().filter(|(k, v)| current.get(*k) != Some(*v)).map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// The JSON merge patch that sets `changes` (and nothing else).
pub fn merge_patch(changes: &BTreeMap<String, String>) -> serde_json::Value {
    serde_json::json!({ "metadata": { "labels": changes } })
}

/// A group name that can name state-store keys (`instancegroup/<group>`): the cloud's tag or
/// template says it, so it is checked before it becomes a path.
pub fn valid_group_name(group: &str) -> bool {
    !group.is_empty() && group != "." && group != ".." && !group.contains('/') && !group.contains('\\')
}

/// A group's completed node labels: its NodeupConfig's `KubeletConfig.nodeLabels`.
pub fn group_labels(nodeup: &NodeupConfig) -> BTreeMap<String, String> {
    nodeup.kubelet_config.node_labels.clone().unwrap_or_default()
}

/// Read a group's role from the state store (`instancegroup/<group>`); a role that runs no kubelet
/// is refused.
pub async fn read_group_role(store: &StateStore, group: &str) -> Result<Role, NodeLabelError> {
    if !valid_group_name(group) {
        return Err(NodeLabelError::Group { group: group.into(), message: "not a valid instance group name".into() });
    }
    let rel = format!("instancegroup/{group}");
    let bytes = store.get(&rel).await?.ok_or_else(|| NodeLabelError::Group { group: group.into(), message: format!("{} does not exist", store.url(&rel)) })?;
    let ig: InstanceGroup = serde_yaml_ng::from_slice(&bytes).map_err(|source| NodeLabelError::Yaml { what: store.url(&rel), source })?;
    match ig.role() {
        None | Some(Role::Bastion) => {
            Err(NodeLabelError::Group { group: group.into(), message: format!("role {:?} runs no kubelet", ig.spec.role.as_deref().unwrap_or_default()) })
        }
        Some(r) => Ok(r),
    }
}

/// Read a group's completed node labels from the state store: `instancegroup/<group>` for its role,
/// then `igconfig/<role>/<group>/nodeupconfig.yaml`.
pub async fn read_group_labels(store: &StateStore, group: &str) -> Result<BTreeMap<String, String>, NodeLabelError> {
    let role = read_group_role(store, group).await?;
    let rel = format!("igconfig/{}/{group}/nodeupconfig.yaml", role.state_dir());
    let bytes = store.get_required(&rel).await?;
    let nodeup: NodeupConfig = serde_yaml_ng::from_slice(&bytes).map_err(|source| NodeLabelError::Yaml { what: store.url(&rel), source })?;
    Ok(group_labels(&nodeup))
}

/// The cloud that says which instance group an instance (by its Node's name) belongs to: Compute
/// on GCE (`gce`: its reader and project), EC2 on AWS; `None` on any other cloud.
pub fn node_cloud(
    gce: Option<(cloud::gce::ComputeReader, String)>,
    cloud_provider: keelson_api::CloudProvider,
    ec2: &aws_sdk_ec2::Client,
    cluster: &str,
    store: &StateStore,
) -> Option<NodeCloud> {
    match (gce, cloud_provider) {
        (Some((compute, project)), _) => Some(NodeCloud::Gce(Box::new(gce::GceNodes::new(compute, project, cluster, store.clone())))),
        (None, keelson_api::CloudProvider::Aws) => Some(NodeCloud::Aws(aws::AwsNodes::new(ec2.clone(), cluster))),
        (None, _) => None,
    }
}

/// The cloud the Nodes' instances live in.
pub enum NodeCloud {
    Aws(aws::AwsNodes),
    Gce(Box<gce::GceNodes>),
}

impl NodeCloud {
    /// What the cloud vouches for, per Node (same order).
    pub async fn identify(&self, nodes: &[&NodeFacts]) -> Vec<Result<Identity, Unidentified>> {
        match self {
            NodeCloud::Aws(a) => a.identify(nodes).await,
            NodeCloud::Gce(g) => g.identify(nodes).await,
        }
    }
}

/// What one labelling of some Nodes did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LabelReport {
    /// Nodes patched, with the labels set.
    pub labelled: Vec<(String, BTreeMap<String, String>)>,
    /// Nodes the cloud did not vouch for (newly decided; a cached refusal is not repeated).
    pub unidentified: Vec<(String, Unidentified)>,
    /// Nodes that could not be labelled: (node, reason, message).
    pub failed: Vec<(String, &'static str, String)>,
}

/// What a Node is cached by: its name, uid and providerID (a new registration, or a new providerID,
/// is asked about afresh).
type NodeKey = (String, String, Option<String>);

/// The labeller's caches around the cloud and the state store.
pub struct Labeller {
    store: StateStore,
    cloud: NodeCloud,
    /// (name, uid, providerID) → what the cloud said, and until when it holds.
    identities: HashMap<NodeKey, (Instant, Result<Identity, Unidentified>)>,
    groups: HashMap<String, (Instant, BTreeMap<String, String>)>,
}

impl Labeller {
    pub fn new(store: StateStore, cloud: NodeCloud) -> Labeller {
        Labeller { store, cloud, identities: HashMap::new(), groups: HashMap::new() }
    }

    fn key(n: &NodeFacts) -> NodeKey {
        (n.name.clone(), n.uid.clone(), n.provider_id.clone())
    }

    /// Forget what was learnt about a deleted Node.
    pub fn forget(&mut self, node: &Node) {
        let facts = NodeFacts::of(node);
        self.identities.remove(&Self::key(&facts));
    }

    async fn group_labels(&mut self, group: &str) -> Result<BTreeMap<String, String>, NodeLabelError> {
        if let Some((until, labels)) = self.groups.get(group) {
            if Instant::now() < *until {
                return Ok(labels.clone());
            }
        }
        let labels = read_group_labels(&self.store, group).await?;
        self.groups.insert(group.to_string(), (Instant::now() + GROUP_TTL, labels.clone()));
        Ok(labels)
    }

    /// Label `nodes` (those being deleted are skipped): ask the cloud about the ones not cached,
    /// then patch each identified Node with the labels it lacks.
    pub async fn label(&mut self, api: &kube::Api<Node>, nodes: &[Node]) -> LabelReport {
        let now = Instant::now();
        self.identities.retain(|_, (until, _)| *until > now);
        let facts: Vec<NodeFacts> =
            nodes.iter().filter(|n| n.metadata.deletion_timestamp.is_none()).map(NodeFacts::of).filter(|f| !f.name.is_empty()).collect();
        let mut report = LabelReport::default();
        let ask: Vec<&NodeFacts> = facts.iter().filter(|f| !self.identities.contains_key(&Self::key(f))).collect();
        if !ask.is_empty() {
            let answers = self.cloud.identify(&ask).await;
            for (f, answer) in ask.iter().zip(answers) {
                let ttl = if answer.is_ok() { IDENTITY_TTL } else { RETRY_UNIDENTIFIED };
                if let Err(u) = &answer {
                    report.unidentified.push((f.name.clone(), u.clone()));
                }
                self.identities.insert(Self::key(f), (now + ttl, answer));
            }
        }
        for f in &facts {
            let Some((_, Ok(id))) = self.identities.get(&Self::key(f)).cloned() else { continue };
            let group_labels = match self.group_labels(&id.group).await {
                Ok(l) => l,
                Err(e) => {
                    report.failed.push((f.name.clone(), "group-labels", e.to_string()));
                    continue;
                }
            };
            let changes = label_changes(&f.labels, &desired_labels(&id.group, &group_labels, &id.labels));
            if changes.is_empty() {
                continue;
            }
            match api.patch(&f.name, &PatchParams::default(), &Patch::Merge(&merge_patch(&changes))).await {
                Ok(_) => report.labelled.push((f.name.clone(), changes)),
                // Deleted since listed: nothing to label.
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => report.failed.push((f.name.clone(), "patch", kube_err(format!("patch Node {}", f.name))(e).to_string())),
            }
        }
        report
    }
}

/// Log and count what a labelling did.
fn record(report: &LabelReport, metrics: &Metrics) {
    for (node, changes) in &report.labelled {
        tracing::info!(node = %node, labels = ?changes, "node labels: labelled");
    }
    for (node, u) in &report.unidentified {
        tracing::warn!(node = %node, reason = u.reason, "node labels: not labelling: {}", u.message);
    }
    for (node, reason, message) in &report.failed {
        tracing::warn!(node = %node, reason, "node labels: {message}");
    }
    metrics.update(|s| {
        s.nodes_labelled += report.labelled.len() as u64;
        for reason in report.unidentified.iter().map(|(_, u)| u.reason).chain(report.failed.iter().map(|(_, r, _)| *r)) {
            *s.node_label_failures.entry(reason.to_string()).or_default() += 1;
        }
    });
}

/// The ClusterRole of [`USER`]: read, watch and patch Nodes, nothing else.
pub fn cluster_role() -> ClusterRole {
    ClusterRole {
        metadata: kube::api::ObjectMeta { name: Some(USER.into()), ..Default::default() },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["nodes".into()]),
            verbs: ["get", "list", "watch", "patch"].map(String::from).to_vec(),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

/// The binding of [`cluster_role`] to the user [`USER`].
pub fn cluster_role_binding() -> ClusterRoleBinding {
    ClusterRoleBinding {
        metadata: kube::api::ObjectMeta { name: Some(USER.into()), ..Default::default() },
        role_ref: RoleRef { api_group: "rbac.authorization.k8s.io".into(), kind: "ClusterRole".into(), name: USER.into() },
        subjects: Some(vec![Subject { api_group: Some("rbac.authorization.k8s.io".into()), kind: "User".into(), name: USER.into(), namespace: None }]),
    }
}

/// A client as [`USER`] (no group): its ClusterRole and binding are applied first, through the
/// addon controller's `system:masters` client, which is then dropped.
pub async fn client(store: &StateStore, server: &str) -> Result<kube::Client, NodeLabelError> {
    let admin = crate::addons::client(store, server).await?;
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    kube::Api::<ClusterRole>::all(admin.clone())
        .patch(USER, &apply, &Patch::Apply(&cluster_role()))
        .await
        .map_err(kube_err(format!("apply ClusterRole {USER}")))?;
    kube::Api::<ClusterRoleBinding>::all(admin)
        .patch(USER, &apply, &Patch::Apply(&cluster_role_binding()))
        .await
        .map_err(kube_err(format!("apply ClusterRoleBinding {USER}")))?;
    Ok(crate::addons::client_as(store, server, USER, &[]).await?)
}

/// Run the labeller until the process ends: list every Node and label it, then follow the watch,
/// labelling each Node added or changed; list again every [`RELIST`] and after any failure.
pub async fn run(store: StateStore, server: String, cloud: NodeCloud, metrics: Metrics) {
    // The client's certificate lives 24 h: a new one well before.
    const RENEW_AFTER: Duration = Duration::from_secs(12 * 3600);
    let mut labeller = Labeller::new(store.clone(), cloud);
    let mut client: Option<(kube::Client, Instant)> = None;
    loop {
        if client.as_ref().is_none_or(|(_, issued)| issued.elapsed() >= RENEW_AFTER) {
            match self::client(&store, &server).await {
                Ok(c) => client = Some((c, Instant::now())),
                Err(e) => {
                    tracing::warn!(error = %e, "node labels: no API client yet");
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            }
        }
        let Some((c, _)) = &client else { continue };
        let api: kube::Api<Node> = kube::Api::all(c.clone());
        if let Err(e) = follow(&mut labeller, &api, &metrics).await {
            tracing::warn!(error = %e, "node labels: listing or watching Nodes failed");
            metrics.update(|s| *s.node_label_failures.entry("api".into()).or_default() += 1);
            client = None;
            tokio::time::sleep(RETRY).await;
        }
    }
}

/// One list, then the watch from its resource version until [`RELIST`] has passed (`Ok`), the
/// version expired (`Ok`: list again) or the API failed (`Err`).
pub async fn follow(labeller: &mut Labeller, api: &kube::Api<Node>, metrics: &Metrics) -> Result<(), NodeLabelError> {
    let started = Instant::now();
    let list = api.list(&ListParams::default()).await.map_err(kube_err("list Nodes"))?;
    let mut version = list.metadata.resource_version.clone().unwrap_or_default();
    record(&labeller.label(api, &list.items).await, metrics);
    while started.elapsed() < RELIST {
        let params = WatchParams::default().timeout(WATCH_TIMEOUT_SECS);
        let watch_started = Instant::now();
        let stream = api.watch(&params, &version).await.map_err(kube_err("watch Nodes"))?;
        let mut stream = Box::pin(stream);
        while let Some(event) = stream.next().await {
            match event.map_err(kube_err("watch Nodes"))? {
                WatchEvent::Added(node) | WatchEvent::Modified(node) => {
                    version = node.metadata.resource_version.clone().unwrap_or(version);
                    record(&labeller.label(api, std::slice::from_ref(&node)).await, metrics);
                }
                WatchEvent::Deleted(node) => {
                    version = node.metadata.resource_version.clone().unwrap_or(version);
                    labeller.forget(&node);
                }
                WatchEvent::Bookmark(b) => version = b.metadata.resource_version,
                // 410 Gone: the version is too old to watch from; list again.
                WatchEvent::Error(status) if status.code == 410 => return Ok(()),
                WatchEvent::Error(status) => {
                    tracing::warn!(code = status.code, message = %status.message, "node labels: watch error; listing again");
                    return Ok(());
                }
            }
            if started.elapsed() >= RELIST {
                break;
            }
        }
        // A watch the server ends at once (a proxy, an overloaded API) is not retried in a spin.
        if watch_started.elapsed() < Duration::from_secs(1) {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn only_missing_or_different_labels_are_set_and_none_removed() {
        let current = map(&[("kubernetes.io/hostname", "ip-10-0-1-5"), ("team", "a"), ("node-role.kubernetes.io/node", ""), ("extra", "kept")]);
        let desired = map(&[("node-role.kubernetes.io/node", ""), ("team", "b"), (INSTANCE_GROUP_LABEL, "nodes")]);
        assert_eq!(label_changes(&current, &desired), map(&[("team", "b"), (INSTANCE_GROUP_LABEL, "nodes")]));
        // Already labelled: nothing to do.
        let mut done = current.clone();
        done.extend(desired.clone());
        assert!(label_changes(&done, &desired).is_empty());
        // The patch names only the changes (a merge patch never removes what it does not name).
        assert_eq!(merge_patch(&map(&[("a", "1")])), serde_json::json!({"metadata": {"labels": {"a": "1"}}}));
        // An empty value is a value: a missing key is set to "".
        assert_eq!(label_changes(&BTreeMap::new(), &map(&[("node-role.kubernetes.io/node", "")])), map(&[("node-role.kubernetes.io/node", "")]));
    }

    #[test]
    fn desired_labels_are_the_groups_the_instances_and_the_group_name() {
        let group = map(&[("node-role.kubernetes.io/node", ""), ("node-role.kubernetes.io/spot-worker", "false"), (INSTANCE_GROUP_LABEL, "spoofed")]);
        let instance = map(&[("node-role.kubernetes.io/spot-worker", "true")]);
        let want = desired_labels("nodes", &group, &instance);
        assert_eq!(want, map(&[("node-role.kubernetes.io/node", ""), ("node-role.kubernetes.io/spot-worker", "true"), (INSTANCE_GROUP_LABEL, "nodes")]));
    }

    #[test]
    fn group_names_that_would_leave_the_store_prefix_are_refused() {
        assert!(valid_group_name("nodes-us-east-1a"));
        for bad in ["", ".", "..", "../pki/private/kubernetes-ca", "a/b", "a\\b"] {
            assert!(!valid_group_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn node_facts_keep_the_name_and_mark_the_rest_as_hints() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "ip-10-0-1-5.ec2.internal", "uid": "u1", "labels": {ZONE_LABEL: "us-east-1a"}},
            "spec": {"providerID": "aws:///us-east-1a/i-0abc"}
        }))
        .expect("node");
        let f = NodeFacts::of(&node);
        assert_eq!(
            (f.name.as_str(), f.uid.as_str(), f.provider_id.as_deref(), f.zone.as_deref()),
            ("ip-10-0-1-5.ec2.internal", "u1", Some("aws:///us-east-1a/i-0abc"), Some("us-east-1a"))
        );
        let bare: Node = serde_json::from_value(serde_json::json!({"metadata": {"name": "n"}, "spec": {"providerID": ""}})).expect("node");
        assert_eq!(NodeFacts::of(&bare).provider_id, None);
    }

    #[test]
    fn the_labeller_may_only_touch_nodes() {
        let role = cluster_role();
        let rules = role.rules.expect("rules");
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].resources.as_deref(), Some(&["nodes".to_string()][..]));
        assert_eq!(rules[0].api_groups.as_deref(), Some(&[String::new()][..]));
        assert!(!rules[0].verbs.iter().any(|v| v == "delete" || v == "update" || v == "create" || v == "*"), "{:?}", rules[0].verbs);
        let b = cluster_role_binding();
        assert_eq!(b.role_ref.name, USER);
        assert_eq!(b.subjects.expect("subjects")[0].name, USER);
    }

    #[test]
    fn group_labels_come_from_the_nodeup_config() {
        let yaml = "ClusterName: c\nKubernetesVersion: 1.34.4\nKubeletConfig:\n  nodeLabels:\n    node-role.kubernetes.io/node: ''\n    team: a\nNetworking: {}\nUpdatePolicy: automatic\ncontainerdConfig: {}\nusesNoneDNS: false\n";
        let nodeup: NodeupConfig = serde_yaml_ng::from_str(yaml).expect("nodeup config");
        assert_eq!(group_labels(&nodeup), map(&[("node-role.kubernetes.io/node", ""), ("team", "a")]));
    }
}
