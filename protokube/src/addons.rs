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
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, Preconditions};
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
    client_as(store, server, "keelson:addons", &["system:masters"]).await
}

/// A client for the local API server as `user` in `groups`, with a 24 h certificate issued from the
/// cluster CA in the state store.
pub async fn client_as(store: &StateStore, server: &str, user: &str, groups: &[&str]) -> Result<kube::Client, AddonError> {
    let ca_name = "kubernetes-ca";
    let keyset = store.get_required(&format!("pki/private/{ca_name}/keyset.yaml")).await?;
    let keyset = base::keyset::Keyset::parse(ca_name, &keyset)?;
    let ca = keyset.primary_keypair()?;
    let leaf = pki::issue_for(ca_name, &ca, &CertSpec::client(user, groups), Duration::from_secs(24 * 3600))?;
    let b64 = |s: &str| base64::Engine::encode(&base64::engine::general_purpose::STANDARD, s.as_bytes());
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: {server}\n    certificate-authority-data: {}\nusers:\n- name: addons\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\ncontexts:\n- name: local\n  context: {{cluster: local, user: addons}}\ncurrent-context: local\n",
        b64(&keyset.trust_bundle()),
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

/// An identity of the record, split: `apiVersion/kind/namespace/name` (`apiVersion` may hold a `/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ObjectId<'a> {
    api_version: &'a str,
    kind: &'a str,
    namespace: Option<&'a str>,
    name: &'a str,
}

impl<'a> ObjectId<'a> {
    fn parse(identity: &'a str) -> Option<ObjectId<'a>> {
        let mut parts = identity.rsplitn(4, '/');
        let (name, namespace, kind, api_version) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if name.is_empty() || kind.is_empty() || api_version.is_empty() {
            return None;
        }
        Some(ObjectId { api_version, kind, namespace: (!namespace.is_empty()).then_some(namespace), name })
    }
}

/// What one addon's prune does.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PrunePlan {
    /// Identities to delete.
    pub delete: Vec<String>,
    /// Identities the record names that exist but do not carry `ADDON_LABEL=<addon>`, with the
    /// value of the label they do carry: never deleted.
    pub refused: Vec<(String, Option<String>)>,
}

/// Decide what addon `addon` prunes: the objects the record says it applied before (`recorded`)
/// that this version did not apply (`applied`), which still exist (`live`: identity → the live
/// object's labels) and carry [`ADDON_LABEL`]`=addon`. An object without that label — another
/// addon's, or one a hostile record names (`kube-system/coredns`) — is refused, whatever the
/// record says.
pub fn prune_plan(addon: &str, recorded: &BTreeSet<String>, applied: &BTreeSet<String>, live: &BTreeMap<String, BTreeMap<String, String>>) -> PrunePlan {
    let mut plan = PrunePlan::default();
    for candidate in recorded.difference(applied) {
        if ObjectId::parse(candidate).is_none() {
            continue;
        }
        let Some(labels) = live.get(candidate) else { continue };
        match labels.get(ADDON_LABEL) {
            Some(owner) if owner == addon => plan.delete.push(candidate.clone()),
            other => plan.refused.push((candidate.clone(), other.cloned())),
        }
    }
    plan
}

async fn api_for(
    client: &kube::Client,
    api_version: &str,
    kind: &str,
    namespace: Option<&str>,
) -> Result<(kube::Api<DynamicObject>, ApiCapabilities), AddonError> {
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
        // Prune what the previous version applied and this one does not — but only objects that
        // carry this addon's label: the record is a ConfigMap anyone with write access to
        // kube-system can edit, so it names candidates, never what may be deleted.
        let before: BTreeSet<String> = data.get(&format!("{}.objects", entry.name)).map(|s| s.lines().map(str::to_string).collect()).unwrap_or_default();
        let mut live = BTreeMap::new();
        for candidate in before.difference(&applied) {
            let Some(id) = ObjectId::parse(candidate) else {
                tracing::warn!(addon = %entry.name, object = %candidate, "addons: the record names something that is not an object; not pruning it");
                continue;
            };
            let (api, _) = api_for(client, id.api_version, id.kind, id.namespace).await?;
            if let Some(obj) = api.get_opt(id.name).await.map_err(kube_err(format!("get {} {}", id.kind, id.name)))? {
                live.insert(candidate.clone(), obj);
            }
        }
        let labels: BTreeMap<String, BTreeMap<String, String>> = live.iter().map(|(k, o)| (k.clone(), o.metadata.labels.clone().unwrap_or_default())).collect();
        let plan = prune_plan(&entry.name, &before, &applied, &labels);
        for (candidate, label) in &plan.refused {
            tracing::warn!(
                addon = %entry.name,
                object = %candidate,
                label = %label.as_deref().unwrap_or("<none>"),
                "addons: the record names an object without label {ADDON_LABEL}={}; not deleting it",
                entry.name
            );
        }
        for gone in &plan.delete {
            let (Some(id), Some(obj)) = (ObjectId::parse(gone), live.get(gone)) else { continue };
            let (api, _) = api_for(client, id.api_version, id.kind, id.namespace).await?;
            // Only the object whose labels were checked: not one recreated under the same name since.
            let dp = DeleteParams {
                preconditions: Some(Preconditions { uid: obj.metadata.uid.clone(), resource_version: obj.metadata.resource_version.clone() }),
                ..Default::default()
            };
            match api.delete(id.name, &dp).await {
                Ok(_) => report.pruned += 1,
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {
                    tracing::warn!(addon = %entry.name, object = %gone, code = e.code, "addons: object gone or changed since checked; not pruned");
                }
                Err(e) => return Err(kube_err(format!("prune {} {}", id.kind, id.name))(e)),
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
    nodes.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.map_err(kube_err(format!("label Node {name} {CONTROL_PLANE_LABEL}")))?;
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

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn object_identities_split_back_into_their_parts() {
        let id = ObjectId::parse("rbac.authorization.k8s.io/v1/ClusterRoleBinding//a").expect("cluster-scoped");
        assert_eq!(id, ObjectId { api_version: "rbac.authorization.k8s.io/v1", kind: "ClusterRoleBinding", namespace: None, name: "a" });
        let id = ObjectId::parse("apps/v1/Deployment/kube-system/coredns").expect("namespaced");
        assert_eq!((id.api_version, id.kind, id.namespace, id.name), ("apps/v1", "Deployment", Some("kube-system"), "coredns"));
        for bad in ["", "coredns", "Deployment/kube-system/coredns", "apps/v1/Deployment/kube-system/", "//kube-system/x"] {
            assert_eq!(ObjectId::parse(bad), None, "{bad:?}");
        }
    }

    /// Pruning deletes only objects that carry the addon's own label, whatever the record names.
    #[test]
    fn prune_deletes_only_objects_labelled_for_the_addon() {
        const OLD_CM: &str = "v1/ConfigMap/kube-system/cilium-old";
        const COREDNS: &str = "apps/v1/Deployment/kube-system/coredns";
        const OTHER: &str = "v1/ServiceAccount/kube-system/ebs-csi-controller-sa";
        const KEPT: &str = "apps/v1/DaemonSet/kube-system/cilium";
        const GONE: &str = "v1/Secret/kube-system/cilium-ca";
        let ours = labels(&[(ADDON_LABEL, "cilium"), ("app", "cilium")]);
        struct Case {
            what: &'static str,
            recorded: &'static [&'static str],
            applied: &'static [&'static str],
            live: Vec<(&'static str, BTreeMap<String, String>)>,
            delete: &'static [&'static str],
            refused: Vec<(&'static str, Option<&'static str>)>,
        }
        let cases = [
            Case {
                what: "an object the previous version applied, labelled, dropped by this one",
                recorded: &[OLD_CM, KEPT],
                applied: &[KEPT],
                live: vec![(OLD_CM, ours.clone()), (KEPT, ours.clone())],
                delete: &[OLD_CM],
                refused: vec![],
            },
            Case {
                what: "a hostile record naming kube-system/coredns (not labelled for the addon)",
                recorded: &[COREDNS, KEPT],
                applied: &[KEPT],
                live: vec![(COREDNS, labels(&[("k8s-app", "kube-dns")])), (KEPT, ours.clone())],
                delete: &[],
                refused: vec![(COREDNS, None)],
            },
            Case {
                what: "a hostile record naming another addon's object",
                recorded: &[OTHER],
                applied: &[],
                live: vec![(OTHER, labels(&[(ADDON_LABEL, "aws-ebs-csi-driver")]))],
                delete: &[],
                refused: vec![(OTHER, Some("aws-ebs-csi-driver"))],
            },
            Case {
                what: "a label that is only similar (empty value, other key) is not ours",
                recorded: &[OLD_CM, COREDNS],
                applied: &[],
                live: vec![(OLD_CM, labels(&[(ADDON_LABEL, "")])), (COREDNS, labels(&[("addon.keelson.io/name-x", "cilium")]))],
                delete: &[],
                refused: vec![(COREDNS, None), (OLD_CM, Some(""))],
            },
            Case {
                what: "what this version applies is never pruned, what is gone needs nothing, garbage is skipped",
                recorded: &[KEPT, GONE, "not-an-object", "apps/v1/Deployment/kube-system/"],
                applied: &[KEPT],
                live: vec![(KEPT, ours.clone())],
                delete: &[],
                refused: vec![],
            },
            Case {
                what: "no record: nothing to prune",
                recorded: &[],
                applied: &[KEPT],
                live: vec![(KEPT, ours.clone()), (COREDNS, labels(&[]))],
                delete: &[],
                refused: vec![],
            },
        ];
        for c in cases {
            let live: BTreeMap<String, BTreeMap<String, String>> = c.live.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
            let plan = prune_plan("cilium", &set(c.recorded), &set(c.applied), &live);
            let delete: Vec<&str> = plan.delete.iter().map(String::as_str).collect();
            assert_eq!(delete, c.delete, "{}", c.what);
            let refused: Vec<(&str, Option<&str>)> = plan.refused.iter().map(|(k, v)| (k.as_str(), v.as_deref())).collect();
            assert_eq!(refused, c.refused, "{}", c.what);
        }
    }
}
