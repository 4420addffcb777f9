//! The addon controller: applies the cluster's bootstrap addons (rendered by `keelson compile`
//! into the state store, `addons/bootstrap-channel.yaml` + one manifest per addon version) to the
//! API with server-side apply, in the index's order, only when an addon's manifest hash differs
//! from the one recorded in the `kube-system/keelson-addons` ConfigMap; objects a newer version
//! dropped are deleted. Every control plane runs it; server-side apply makes concurrent runs
//! converge on the same objects.
//!
//! It talks to the local API server (`https://127.0.0.1:<securePort>`) with a short-lived
//! `system:masters` client certificate it issues itself from the cluster CA in the state store
//! (control planes may read the CA's key; workers may not).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use base::pki::{self, CertSpec};
use base::StateStore;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiCapabilities;

use keelson_api::addons::{AddonChannel, ADDON_CHANNEL as CHANNEL};

/// Where applied hashes and object lists are recorded.
pub const RECORD: &str = "keelson-addons";
const FIELD_MANAGER: &str = "keelson-addons";
/// Label on every object an addon applied (how its objects are found for pruning).
pub const ADDON_LABEL: &str = "addon.keelson.io/name";

#[derive(Debug, thiserror::Error)]
pub enum AddonError {
    #[error(transparent)]
    Store(#[from] base::StoreError),
    #[error("{what}: {source}")]
    Yaml {
        what: String,
        #[source]
        source: serde_yaml_ng::Error,
    },
    #[error("{manifest}: sha256 {actual} but the index pins {expected}; refusing it")]
    Hash { manifest: String, expected: String, actual: String },
    #[error("client certificate: {0}")]
    Pki(#[from] pki::PkiError),
    #[error("kubeconfig: {0}")]
    Config(String),
    #[error("Kubernetes API: {what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("{manifest}: document {index}: {message}")]
    Object { manifest: String, index: usize, message: String },
}

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SyncReport {
    /// Addons (re)applied.
    pub applied: Vec<String>,
    /// Objects server-side applied.
    pub objects: usize,
    /// Objects pruned.
    pub pruned: usize,
}

fn kube_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> AddonError {
    let what = what.into();
    move |source| AddonError::Kube { what, source }
}

/// A client for the local API server as `keelson:addons` in `system:masters`.
pub async fn client(store: &StateStore, server: &str) -> Result<kube::Client, AddonError> {
    let ca_name = "kubernetes-ca";
    let keyset = store.get_required(&format!("pki/private/{ca_name}/keyset.yaml")).await?;
    let ca = pki::parse_private_keyset(ca_name, &keyset)?;
    let leaf = pki::issue_for(ca_name, &ca, &CertSpec::client("keelson:addons", &["system:masters"]), Duration::from_secs(24 * 3600))?;
    let b64 = |s: &str| base64::Engine::encode(&base64::engine::general_purpose::STANDARD, s.as_bytes());
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: {server}\n    certificate-authority-data: {}\nusers:\n- name: addons\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\ncontexts:\n- name: local\n  context: {{cluster: local, user: addons}}\ncurrent-context: local\n",
        b64(&ca.cert_pem),
        b64(&leaf.cert_pem),
        b64(&leaf.key_pem)
    );
    let kc = kube::config::Kubeconfig::from_yaml(&kubeconfig).map_err(|e| AddonError::Config(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.map_err(|e| AddonError::Config(e.to_string()))?;
    kube::Client::try_from(config).map_err(kube_err("client"))
}

/// `apiVersion/kind/namespace/name` of an object (its identity in the record).
fn identity(o: &DynamicObject) -> String {
    let t = o.types.as_ref();
    format!(
        "{}/{}/{}/{}",
        t.map(|t| t.api_version.as_str()).unwrap_or(""),
        t.map(|t| t.kind.as_str()).unwrap_or(""),
        o.metadata.namespace.as_deref().unwrap_or(""),
        o.metadata.name.as_deref().unwrap_or("")
    )
}

async fn api_for(client: &kube::Client, api_version: &str, kind: &str, namespace: Option<&str>) -> Result<(kube::Api<DynamicObject>, ApiCapabilities), AddonError> {
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    };
    let gvk = kube::api::GroupVersionKind::gvk(group, version, kind);
    let (resource, caps) = kube::discovery::pinned_kind(client, &gvk).await.map_err(kube_err(format!("discover {api_version} {kind}")))?;
    let api = match (caps.scope.clone(), namespace) {
        (kube::discovery::Scope::Namespaced, Some(ns)) => kube::Api::namespaced_with(client.clone(), ns, &resource),
        (kube::discovery::Scope::Namespaced, None) => kube::Api::default_namespaced_with(client.clone(), &resource),
        (kube::discovery::Scope::Cluster, _) => kube::Api::all_with(client.clone(), &resource),
    };
    Ok((api, caps))
}

/// The objects of a multi-document manifest (empty documents skipped).
pub fn parse_objects(rel: &str, bytes: &[u8]) -> Result<Vec<DynamicObject>, AddonError> {
    let mut out = Vec::new();
    for (index, doc) in serde_yaml_ng::Deserializer::from_slice(bytes).enumerate() {
        let yaml = |source| AddonError::Yaml { what: format!("{rel} document {index}"), source };
        let value = <serde_yaml_ng::Value as serde::Deserialize>::deserialize(doc).map_err(yaml)?;
        if value.is_null() {
            continue;
        }
        out.push(serde_yaml_ng::from_value(value).map_err(yaml)?);
    }
    Ok(out)
}

/// One pass: apply what changed, prune what a new version dropped, record the result.
pub async fn sync(client: &kube::Client, store: &StateStore) -> Result<SyncReport, AddonError> {
    let mut report = SyncReport::default();
    let Some(index) = store.get(CHANNEL).await? else { return Ok(report) };
    let channel: AddonChannel = serde_yaml_ng::from_slice(&index).map_err(|source| AddonError::Yaml { what: store.url(CHANNEL), source })?;
    let records: kube::Api<ConfigMap> = kube::Api::namespaced(client.clone(), "kube-system");
    let record = records.get_opt(RECORD).await.map_err(kube_err(format!("get configmap kube-system/{RECORD}")))?;
    let mut data: BTreeMap<String, String> = record.and_then(|c| c.data).unwrap_or_default();
    for entry in &channel.addons {
        if data.get(&format!("{}.hash", entry.name)) == Some(&entry.manifest_hash) {
            continue;
        }
        let rel = format!("addons/{}", entry.manifest);
        let bytes = store.get_required(&rel).await?;
        let actual = base::sha256_hex(&bytes);
        if actual != entry.manifest_hash {
            return Err(AddonError::Hash { manifest: store.url(&rel), expected: entry.manifest_hash.clone(), actual });
        }
        let mut applied = BTreeSet::new();
        for (index, mut obj) in parse_objects(&rel, &bytes)?.into_iter().enumerate() {
            let types = obj.types.clone().ok_or_else(|| AddonError::Object { manifest: rel.clone(), index, message: "no apiVersion/kind".into() })?;
            let name = obj.metadata.name.clone().ok_or_else(|| AddonError::Object { manifest: rel.clone(), index, message: "no metadata.name".into() })?;
            obj.metadata.labels.get_or_insert_with(Default::default).insert(ADDON_LABEL.into(), entry.name.clone());
            let (api, _) = api_for(client, &types.api_version, &types.kind, obj.metadata.namespace.as_deref()).await?;
            api.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&obj))
                .await
                .map_err(kube_err(format!("apply {} {name}", types.kind)))?;
            applied.insert(identity(&obj));
            report.objects += 1;
        }
        // Prune what the previous version applied and this one does not.
        let before: BTreeSet<String> =
            data.get(&format!("{}.objects", entry.name)).map(|s| s.lines().map(str::to_string).collect()).unwrap_or_default();
        for gone in before.difference(&applied) {
            let parts: Vec<&str> = gone.rsplitn(4, '/').collect();
            // identity = apiVersion/kind/namespace/name, apiVersion may hold a '/'.
            if let [name, namespace, kind, api_version] = parts.as_slice() {
                let ns = (!namespace.is_empty()).then_some(*namespace);
                let (api, _) = api_for(client, api_version, kind, ns).await?;
                match api.delete(name, &DeleteParams::default()).await {
                    Ok(_) => report.pruned += 1,
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => return Err(kube_err(format!("prune {kind} {name}"))(e)),
                }
            }
        }
        data.insert(format!("{}.hash", entry.name), entry.manifest_hash.clone());
        data.insert(format!("{}.objects", entry.name), applied.into_iter().collect::<Vec<_>>().join("\n"));
        let cm = ConfigMap {
            metadata: kube::api::ObjectMeta { name: Some(RECORD.into()), namespace: Some("kube-system".into()), ..Default::default() },
            data: Some(data.clone()),
            ..Default::default()
        };
        let mut value = serde_json::to_value(&cm).map_err(|e| AddonError::Config(e.to_string()))?;
        value["apiVersion"] = "v1".into();
        value["kind"] = "ConfigMap".into();
        records
            .patch(RECORD, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&value))
            .await
            .map_err(kube_err(format!("record configmap kube-system/{RECORD}")))?;
        tracing::info!(addon = %entry.name, hash = %entry.manifest_hash, "addon applied");
        report.applied.push(entry.name.clone());
    }
    Ok(report)
}

/// The role label of control-plane nodes. The kubelet may not set `node-role.kubernetes.io/*` on its
/// own Node (NodeRestriction; nodeup leaves it out of `--node-labels`), so protokube, which runs only
/// on control planes, sets it on its own node, as kOps' kops-controller does; workloads that must
/// run on control planes (the AWS cloud-controller-manager) select on it.
pub const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";

/// Put [`CONTROL_PLANE_LABEL`] on the Node `name` if it lacks it. `Ok(true)` when it was added,
/// `Ok(false)` when already there or the Node is not registered yet.
pub async fn label_control_plane(client: &kube::Client, name: &str) -> Result<bool, AddonError> {
    let nodes: kube::Api<Node> = kube::Api::all(client.clone());
    let Some(node) = nodes.get_opt(name).await.map_err(kube_err(format!("get Node {name}")))? else {
        return Ok(false);
    };
    if node.metadata.labels.as_ref().is_some_and(|l| l.contains_key(CONTROL_PLANE_LABEL)) {
        return Ok(false);
    }
    let patch = serde_json::json!({"metadata": {"labels": {CONTROL_PLANE_LABEL: ""}}});
    nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(kube_err(format!("label Node {name} {CONTROL_PLANE_LABEL}")))?;
    Ok(true)
}

/// Run the controller until the process ends: a pass every `interval` (the first as soon as the
/// API answers); failures are logged and retried.
/// `node` is this control plane's Node name (the kubelet's, IMDS `local-hostname`), labelled with
/// [`CONTROL_PLANE_LABEL`] on every pass until it carries it.
pub async fn run(store: StateStore, server: String, interval: Duration, metrics: crate::metrics::Metrics, node: Option<String>) {
    // The client's certificate lives 24 h: issue a new one well before, and after any failed pass.
    const RENEW_AFTER: Duration = Duration::from_secs(12 * 3600);
    let mut client: Option<(kube::Client, std::time::Instant)> = None;
    loop {
        if client.as_ref().is_none_or(|(_, issued)| issued.elapsed() >= RENEW_AFTER) {
            match self::client(&store, &server).await {
                Ok(c) => client = Some((c, std::time::Instant::now())),
                Err(e) => tracing::warn!(error = %e, "addons: no API client yet"),
            }
        }
        if let (Some((c, _)), Some(node)) = (&client, &node) {
            match label_control_plane(c, node).await {
                Ok(true) => tracing::info!(node = %node, label = CONTROL_PLANE_LABEL, "labelled this control-plane node"),
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "labelling this control-plane node failed"),
            }
        }
        if let Some((c, _)) = &client {
            match sync(c, &store).await {
                Ok(r) => metrics.update(|s| {
                    s.addon_passes += 1;
                    s.addon_applies += r.applied.len() as u64;
                    s.addon_objects_applied += r.objects as u64;
                    s.addon_objects_pruned += r.pruned as u64;
                }),
                Err(e) => {
                    tracing::warn!(error = %e, "addons: pass failed");
                    metrics.update(|s| s.addon_failures += 1);
                    client = None;
                }
            }
        }
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_parse_into_objects_with_their_identity() {
        let text = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: a\n---\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: b\n  namespace: kube-system\n";
        let objs = parse_objects("x.yaml", text.as_bytes()).expect("parse");
        let ids: Vec<String> = objs.iter().map(identity).collect();
        assert_eq!(ids, ["rbac.authorization.k8s.io/v1/ClusterRoleBinding//a", "v1/ConfigMap/kube-system/b"]);
        assert!(parse_objects("x.yaml", b"kind: [").is_err());
    }
}
