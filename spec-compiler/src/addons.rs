//! The cluster's bootstrap addons, rendered into the state store (kOps' channel idea): one
//! manifest per addon version under `addons/<name>/v<version>.yaml` and an index,
//! `addons/bootstrap-channel.yaml`, naming each addon in apply order with its manifest's sha256.
//! protokube's addon controller applies them with server-side apply when a hash changes.
//!
//! Rendered today: the RBAC a joining node needs (`bootstrap-rbac.keelson.io`): TLS bootstrapping
//! for the `system:bootstrappers` group, automatic approval of node client certificates and their
//! rotation, and the API server's kubelet client (`kubelet-api`); the CNI the spec names
//! ([`cilium`], `networking.cilium.io`, [`calico`], `networking.projectcalico.org`, or [`flannel`], `networking.flannel`,
//! upstream's manifest with kOps' settings over it); on AWS the cloud-controller-manager
//! ([`aws_ccm`], `aws-cloud-controller.addons.k8s.io`), on GCE its own ([`gce_ccm`],
//! `gcp-cloud-controller.addons.k8s.io`); the cluster DNS ([`coredns`],
//! `coredns.addons.k8s.io`), whose pods need initialised nodes; NodeLocal DNSCache when enabled
//! ([`node_local_dns`], `nodelocaldns.addons.k8s.io`, upstream's manifest with kOps' edits); the EBS CSI driver on AWS
//! ([`aws_ebs_csi`]); metrics-server when enabled ([`metrics_server`], `metrics-server.addons.k8s.io`,
//! upstream's release manifest with kOps' settings over it); node-problem-detector when enabled
//! ([`node_problem_detector`]); external-dns with `externalDns.provider: external-dns`
//! ([`external_dns`]); cert-manager when enabled and managed ([`cert_manager`]); the CSI snapshot
//! controller when enabled ([`snapshot_controller`]); the cluster-autoscaler when enabled
//! ([`cluster_autoscaler`], `cluster-autoscaler.addons.k8s.io`, upstream's AWS example with kOps'
//! settings over it; it reads the instance groups); and
//! the spec file's additional
//! objects (`additional-objects.keelson.io`), except component configurations, which are merged
//! into their component's configuration file instead.

use serde_json::json;

mod aws_ccm;
mod aws_ebs_csi;
mod calico;
mod ccm;
mod cert_manager;
mod cilium;
mod cluster_autoscaler;
mod coredns;
mod external_dns;
mod flannel;
mod gce_ccm;
pub mod irsa;
mod metrics_server;
mod node_local_dns;
mod node_problem_detector;
mod snapshot_controller;
mod upstream;

pub use calico::CalicoError;
pub use cert_manager::CertManagerError;
pub use cilium::CiliumError;
pub use cluster_autoscaler::ClusterAutoscalerError;
pub use coredns::CoreDnsError;
pub use external_dns::ExternalDnsError;
pub use flannel::FlannelError;
pub use metrics_server::MetricsServerError;
pub use node_local_dns::NodeLocalDnsError;
pub use node_problem_detector::NodeProblemDetectorError;
pub use snapshot_controller::SnapshotControllerError;

use keelson_api::Cluster;

use crate::output::{self, OutputError, Tree};
use crate::versions::Versions;

use keelson_api::addons::{AddonChannel, AddonEntry, ADDON_CHANNEL as CHANNEL};

fn crb(name: &str, role: &str, subject_kind: &str, subject: &str) -> serde_json::Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": subject_kind, "name": subject}],
    })
}

/// The bootstrap RBAC. With bootstrap tokens, `system:bootstrappers` may create CSRs
/// (`system:node-bootstrapper`) and nothing more: none is approved automatically. protokube's
/// approver on the control planes approves a worker's first client certificate only for a name that
/// is neither a control plane's nor an existing Node's (`protokube::node_bootstrap`). Joining by
/// cloud identity, no bootstrap token is accepted and the group is bound to nothing. A kubelet
/// renews its own certificate (`selfnodeclient`) either way.
fn bootstrap_rbac(token: bool) -> Vec<serde_json::Value> {
    let mut docs = Vec::new();
    if token {
        docs.push(crb("keelson:node-bootstrapper", "system:node-bootstrapper", "Group", "system:bootstrappers"));
    }
    docs.extend([
        crb("keelson:node-autoapprove-certificate-rotation", "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient", "Group", "system:nodes"),
        crb("keelson:kubelet-api-admin", "system:kubelet-api-admin", "User", "kubelet-api"),
    ]);
    docs
}

/// kOps' spread for an addon's replicas: over zones where it can (`ScheduleAnyway`), over hosts
/// always (`DoNotSchedule`), counting the pods `selector` matches.
pub(crate) fn spread_over_zones_and_hosts(selector: &serde_json::Value) -> serde_json::Value {
    json!([
        {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": selector},
        {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule", "labelSelector": selector},
    ])
}

/// The region ([`keelson_api::plan::region`], the one rule).
pub(crate) fn aws_region(spec: &keelson_api::ClusterSpec) -> Option<String> {
    keelson_api::plan::region(spec)
}

/// A multi-document manifest (documents as kOps writes them: keys sorted).
fn manifest(name: &str, docs: &[serde_json::Value]) -> Result<String, OutputError> {
    let mut out = String::new();
    for (i, d) in docs.iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        out.push_str(&output::to_yaml(name, d)?);
    }
    Ok(out)
}

/// Why the addons could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum AddonError {
    #[error(transparent)]
    Output(#[from] OutputError),
    #[error("addon coredns.addons.k8s.io: {0}")]
    CoreDns(#[from] CoreDnsError),
    #[error("addon networking.projectcalico.org: {0}")]
    Calico(#[from] CalicoError),
    #[error("addon networking.cilium.io: {0}")]
    Cilium(#[from] CiliumError),
    #[error("addon aws-ebs-csi-driver.addons.k8s.io: {0}")]
    AwsEbsCsi(#[from] aws_ebs_csi::AwsEbsCsiError),
    #[error("addon networking.flannel: {0}")]
    Flannel(#[from] FlannelError),
    #[error("addon metrics-server.addons.k8s.io: {0}")]
    MetricsServer(#[from] MetricsServerError),
    #[error("addon external-dns.addons.k8s.io: {0}")]
    ExternalDns(#[from] ExternalDnsError),
    #[error("addon nodelocaldns.addons.k8s.io: {0}")]
    NodeLocalDns(#[from] NodeLocalDnsError),
    #[error("addon certmanager.io: {0}")]
    CertManager(#[from] CertManagerError),
    #[error("addon snapshot-controller.addons.k8s.io: {0}")]
    SnapshotController(#[from] SnapshotControllerError),
    #[error("addon node-problem-detector.addons.k8s.io: {0}")]
    NodeProblemDetector(#[from] NodeProblemDetectorError),
    #[error("addon cluster-autoscaler.addons.k8s.io: {0}")]
    ClusterAutoscaler(#[from] ClusterAutoscalerError),
    #[error(transparent)]
    Irsa(#[from] irsa::IrsaError),
}

/// One addon: its name, version and documents, in apply order.
pub struct Addon {
    pub name: &'static str,
    pub version: &'static str,
    pub docs: Vec<serde_json::Value>,
}

/// The addons the completed spec asks for, in apply order (the additional objects come last).
pub fn addons(cluster: &Cluster, versions: &Versions) -> Result<Vec<Addon>, AddonError> {
    let token = crate::nodeup_config::node_bootstrap(cluster).is_ok_and(|b| b.method == keelson_api::nodeup::NodeBootstrapMethod::Token);
    let mut addons = vec![Addon { name: "bootstrap-rbac.keelson.io", version: "1.0.0", docs: bootstrap_rbac(token) }];
    if let Some(docs) = cilium::docs(cluster, versions)? {
        addons.push(Addon { name: cilium::NAME, version: "1.0.0", docs });
    }
    if let Some(docs) = calico::docs(cluster, versions)? {
        addons.push(Addon { name: calico::NAME, version: "1.0.0", docs });
    }
    if let Some(docs) = flannel::docs(cluster, versions)? {
        addons.push(Addon { name: flannel::NAME, version: "1.0.0", docs });
    }
    if let Some(docs) = aws_ccm::docs(cluster) {
        addons.push(Addon { name: aws_ccm::NAME, version: "1.0.0", docs });
    }
    if let Some(docs) = gce_ccm::docs(cluster) {
        addons.push(Addon { name: gce_ccm::NAME, version: "1.0.0", docs });
    }
    if let Some(docs) = coredns::docs(cluster, versions)? {
        addons.push(Addon { name: coredns::NAME, version: "1.0.0", docs });
    }
    if let Some(docs) = node_local_dns::docs(cluster)? {
        addons.push(Addon { name: node_local_dns::NAME, version: "1.0.0", docs });
    }
    if let Some(docs) = aws_ebs_csi::docs(cluster, versions)? {
        addons.push(Addon { name: aws_ebs_csi::NAME, version: "1.0.0", docs });
    }
    if let Some(docs) = metrics_server::docs(cluster, versions)? {
        addons.push(Addon { name: metrics_server::NAME, version: "1.0.0", docs });
    }
    if let Some(docs) = cert_manager::docs(cluster)? {
        addons.push(Addon { name: cert_manager::NAME, version: "1.0.0", docs });
    }
    if let Some(docs) = snapshot_controller::docs(cluster)? {
        addons.push(Addon { name: snapshot_controller::NAME, version: "1.0.0", docs });
    }
    if let Some(docs) = external_dns::docs(cluster)? {
        addons.push(Addon { name: external_dns::NAME, version: "1.0.0", docs });
    }
    if let Some(docs) = node_problem_detector::docs(cluster)? {
        addons.push(Addon { name: node_problem_detector::NAME, version: "1.0.0", docs });
    }
    Ok(addons)
}

/// One addon as compiled: where its manifest goes under the state store's `addons/` and the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedAddon {
    pub name: String,
    pub version: String,
    /// Relative to `addons/`: `<name>/v<version>.yaml`.
    pub manifest_path: String,
    pub manifest: String,
}

/// The addons (in apply order, additional objects last) and their channel index (`addons/bootstrap-channel.yaml`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RenderedAddons {
    pub addons: Vec<RenderedAddon>,
    pub channel: String,
    /// The rendered addons on roles of their own (`useServiceAccountExternalPermissions`), each with
    /// its service account: apply makes a role per entry ([`irsa`]).
    pub service_accounts: Vec<keelson_api::addon_roles::AddonServiceAccount>,
    /// What the operator should know (an addon not written).
    pub warnings: Vec<String>,
    /// The addons not written for want of the AWS account (their roles' ARNs name it).
    pub withheld: Vec<String>,
}

impl RenderedAddons {
    /// Their files in the compiled tree, under `state/`.
    pub fn insert_into(&self, tree: &mut Tree) {
        for a in &self.addons {
            tree.insert(format!("state/addons/{}", a.manifest_path), a.manifest.clone());
        }
        tree.insert(format!("state/{CHANNEL}"), self.channel.clone());
    }
}

/// Render the addons and their index; `aws_account` names the roles of the addons that
/// `useServiceAccountExternalPermissions` puts on roles of their own ([`irsa`]).
pub fn render(
    cluster: &Cluster,
    groups: &[keelson_api::InstanceGroup],
    versions: &Versions,
    additional_objects: &[serde_json::Value],
    aws_account: Option<&str>,
) -> Result<RenderedAddons, AddonError> {
    let mut addons = addons(cluster, versions)?;
    // The addons that read the instance groups.
    if let Some(docs) = cluster_autoscaler::docs(cluster, groups, versions)? {
        addons.push(Addon { name: cluster_autoscaler::NAME, version: "1.0.0", docs });
    }
    let objects: Vec<serde_json::Value> =
        additional_objects.iter().filter(|o| !o.get("kind").and_then(|k| k.as_str()).is_some_and(|k| k.ends_with("Configuration"))).cloned().collect();
    if !objects.is_empty() {
        addons.push(Addon { name: "additional-objects.keelson.io", version: "1.0.0", docs: objects });
    }
    let mut channel = AddonChannel { kind: "Addons".into(), addons: Vec::new() };
    let mut out = RenderedAddons::default();
    for Addon { name, version, mut docs } in addons {
        if let Some(account) = irsa::permissions_of(cluster, name).map(keelson_api::addon_roles::AddonServiceAccount::from) {
            out.service_accounts.push(account.clone());
            if let Err(warning) = irsa::put_on_role(cluster, name, &mut docs, &account, aws_account)? {
                out.warnings.push(warning);
                out.withheld.push(name.to_string());
                continue;
            }
        }
        // Images kept as given (upstream manifests, the user's objects) are pinned here; the
        // versions table's came pinned ([`crate::digests`]).
        if !versions.options().image_digests.is_empty() {
            docs.iter_mut().for_each(|d| crate::digests::pin_given(d, versions));
        }
        let text = manifest(name, &docs)?;
        let rel = format!("{name}/v{version}.yaml");
        channel.addons.push(AddonEntry {
            name: name.to_string(),
            version: version.to_string(),
            manifest: rel.clone(),
            manifest_hash: base::sha256_hex(text.as_bytes()),
        });
        out.addons.push(RenderedAddon { name: name.to_string(), version: version.to_string(), manifest_path: rel, manifest: text });
    }
    out.channel = output::to_yaml(CHANNEL, &channel)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A spec file completed by our compiler, and its versions.
    fn completed(path: &str) -> (Cluster, Versions) {
        let docs = crate::load::load_spec(std::path::Path::new(path)).unwrap_or_else(|e| panic!("load {path}: {e:?}"));
        let options = crate::CompileOptions::default();
        let completed = crate::complete::complete(&docs, &options).expect("complete");
        let versions = crate::complete::versions_for(&completed.spec, &options).expect("versions");
        (completed, versions)
    }

    /// The completed `examples/ha.yaml` and its versions.
    pub(crate) fn ha() -> (Cluster, Versions) {
        completed(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/ha.yaml"))
    }

    /// A kOps conformance case (kOps' own input) completed by our compiler.
    pub(crate) fn case(name: &str) -> (Cluster, Versions) {
        completed(&format!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/conformance/cases/{}/input.yaml"), name))
    }

    /// The first document of `kind`.
    pub(crate) fn kind<'a>(docs: &'a [serde_json::Value], kind: &str) -> &'a serde_json::Value {
        docs.iter().find(|d| d["kind"] == kind).unwrap_or_else(|| panic!("no {kind} in {docs:#?}"))
    }

    #[test]
    fn the_index_pins_every_manifest_by_hash() {
        let mut tree = Tree::default();
        let extra = [
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "default"}, "data": {"a": "1"}}),
            json!({"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration", "percentageOfNodesToScore": 50}),
        ];
        let (cluster, versions) = ha();
        render(&cluster, &[], &versions, &extra, None).expect("render").insert_into(&mut tree);
        let objects = String::from_utf8_lossy(&tree.files["state/addons/additional-objects.keelson.io/v1.0.0.yaml"]).to_string();
        assert!(objects.contains("kind: ConfigMap") && !objects.contains("KubeSchedulerConfiguration"), "{objects}");
        let index = String::from_utf8(tree.files[&format!("state/{CHANNEL}")].clone()).expect("utf-8");
        let manifest = &tree.files["state/addons/bootstrap-rbac.keelson.io/v1.0.0.yaml"];
        assert!(index.contains(&base::sha256_hex(manifest)), "{index}");
        let text = String::from_utf8_lossy(manifest);
        // Joining by cloud identity (AWS): nothing for system:bootstrappers.
        assert_eq!(text.matches("kind: ClusterRoleBinding").count(), 2, "{text}");
        assert!(!text.contains("system:bootstrappers") && text.contains("kubelet-api"), "{text}");
    }

    #[test]
    fn only_token_clusters_bind_the_bootstrappers() {
        let (mut cluster, versions) = ha();
        let annotations = cluster.metadata.annotations.get_or_insert_with(Default::default);
        annotations.insert(keelson_api::nodeup::NODE_BOOTSTRAP_ANNOTATION.into(), "token".into());
        annotations.insert(keelson_api::nodeup::ALLOW_BOOTSTRAP_TOKEN_ANNOTATION.into(), "true".into());
        let mut tree = Tree::default();
        render(&cluster, &[], &versions, &[], None).expect("render").insert_into(&mut tree);
        let text = String::from_utf8_lossy(&tree.files["state/addons/bootstrap-rbac.keelson.io/v1.0.0.yaml"]).to_string();
        assert_eq!(text.matches("kind: ClusterRoleBinding").count(), 3, "{text}");
        // Bootstrappers may ask; nothing approves them automatically (protokube decides per name).
        assert!(text.contains("system:node-bootstrapper") && text.contains("system:bootstrappers"), "{text}");
        assert!(!text.contains("certificatesigningrequests:nodeclient"), "a bootstrap token must not get any node's certificate approved: {text}");
    }
}
