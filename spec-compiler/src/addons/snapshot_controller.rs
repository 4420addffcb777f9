//! The CSI snapshot controller addon (`snapshot-controller.addons.k8s.io`), rendered when
//! `spec.snapshotController.enabled` is true: upstream's kustomize bases of external-snapshotter
//! v8.4.0 (the CRDs from `client/config/crd`, the controller from
//! `deploy/kubernetes/snapshot-controller`), kept verbatim as data files (see
//! `snapshot_controller/SOURCE.md`), with kOps' settings laid over them. Facts from kOps'
//! `snapshot-controller.addons.k8s.io/k8s-1.20.yaml.template`. What the overlay sets, as kOps: the
//! two controller replicas spread over zones (preferred) and hosts (required); with
//! `installDefaultClass`, a default `VolumeSnapshotClass` for the EBS CSI driver (kOps' name for
//! it, `csi-hostpath-snapclass`, so manifests written for kOps find it).
//!
//! One difference from kOps, on purpose: kOps renders external-snapshotter v6 with its validation
//! webhook, whose serving certificate needs cert-manager, and so refuses the addon without
//! cert-manager. Upstream removed that webhook in v8 (its rules are CEL validations in these CRDs),
//! so Keelson needs no cert-manager for it.

use serde_json::{json, Value};

use keelson_api::{Cluster, SnapshotControllerConfig};

use super::upstream::{Upstream, UpstreamError};

/// The addon's name (kOps' name for it).
pub const NAME: &str = "snapshot-controller.addons.k8s.io";

macro_rules! upstream {
    ($dir:literal, $file:literal) => {
        Upstream { file: concat!("addons/snapshot_controller/", $dir, "/", $file), text: include_str!(concat!("snapshot_controller/", $dir, "/", $file)) }
    };
}

const CRD_KUSTOMIZATION: Upstream = upstream!("crd", "kustomization.yaml");
const CRDS: [Upstream; 6] = [
    upstream!("crd", "snapshot.storage.k8s.io_volumesnapshotclasses.yaml"),
    upstream!("crd", "snapshot.storage.k8s.io_volumesnapshotcontents.yaml"),
    upstream!("crd", "snapshot.storage.k8s.io_volumesnapshots.yaml"),
    upstream!("crd", "groupsnapshot.storage.k8s.io_volumegroupsnapshotclasses.yaml"),
    upstream!("crd", "groupsnapshot.storage.k8s.io_volumegroupsnapshotcontents.yaml"),
    upstream!("crd", "groupsnapshot.storage.k8s.io_volumegroupsnapshots.yaml"),
];
const CONTROLLER_KUSTOMIZATION: Upstream = upstream!("controller", "kustomization.yaml");
const CONTROLLER: [Upstream; 2] = [upstream!("controller", "rbac-snapshot-controller.yaml"), upstream!("controller", "setup-snapshot-controller.yaml")];
const APP: &str = "snapshot-controller";
/// The EBS CSI driver, the one CSI driver Keelson renders that takes snapshots.
const EBS_DRIVER: &str = "ebs.csi.aws.com";
/// kOps' name for the default class.
const DEFAULT_CLASS: &str = "csi-hostpath-snapclass";

/// Why the addon cannot be rendered.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotControllerError {
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    #[error("spec.snapshotController.installDefaultClass: the default snapshot class is for the EBS CSI driver, which Keelson renders only on AWS (cloud provider {0})")]
    DefaultClassOffAws(String),
}

/// What the overlay sets, read from the completed spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub install_default_class: bool,
}

impl Settings {
    /// `None` unless `spec.snapshotController.enabled` is true.
    pub fn new(cluster: &Cluster) -> Result<Option<Settings>, SnapshotControllerError> {
        let Some(cfg) = cluster.spec.snapshot_controller.as_ref().filter(|s| s.enabled == Some(true)) else { return Ok(None) };
        let SnapshotControllerConfig { enabled: _, install_default_class } = cfg;
        let install_default_class = install_default_class == &Some(true);
        let cloud = cluster.spec.cloud_provider.clone().unwrap_or_default();
        if install_default_class && cloud != "aws" {
            return Err(SnapshotControllerError::DefaultClassOffAws(cloud));
        }
        Ok(Some(Settings { install_default_class }))
    }
}

/// The addon's objects for `s`: the CRDs, the controller, and the default class if asked for.
pub fn render(s: &Settings) -> Result<Vec<Value>, UpstreamError> {
    let mut docs = CRD_KUSTOMIZATION.kustomize(&CRDS)?;
    let mut controller = CONTROLLER_KUSTOMIZATION.kustomize(&CONTROLLER)?;
    let setup = CONTROLLER[1];
    let d = setup.find(&mut controller, "Deployment", APP)?;
    let selector = d["spec"]["selector"].clone();
    if selector["matchLabels"].as_object().is_none_or(|m| m.is_empty()) {
        return Err(setup.error("the Deployment has no matchLabels selector"));
    }
    d["spec"]["replicas"] = json!(2);
    let pod = d["spec"]["template"]["spec"].as_object_mut().ok_or_else(|| setup.error("the Deployment has no pod spec"))?;
    pod.insert("topologySpreadConstraints".into(), super::spread_over_zones_and_hosts(&selector));
    docs.extend(controller);
    if s.install_default_class {
        docs.push(json!({
            "apiVersion": "snapshot.storage.k8s.io/v1",
            "kind": "VolumeSnapshotClass",
            "metadata": {"name": DEFAULT_CLASS, "annotations": {"snapshot.storage.kubernetes.io/is-default-class": "true"}},
            "driver": EBS_DRIVER,
            "deletionPolicy": "Delete",
        }));
    }
    Ok(docs)
}

/// The addon's objects, or `None` when `spec.snapshotController.enabled` is not true.
pub fn docs(cluster: &Cluster) -> Result<Option<Vec<Value>>, SnapshotControllerError> {
    Ok(Settings::new(cluster)?.map(|s| render(&s)).transpose()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addons::tests::{case, ha, kind};

    /// The sha256 of each upstream file, as `snapshot_controller/SOURCE.md` records it.
    const SHA256: [(Upstream, &str); 10] = [
        (CONTROLLER_KUSTOMIZATION, "0c1d872282a997d6c842ef0ae6d94159986d76c1f72710535e1ba4efe4e611fd"),
        (CONTROLLER[0], "99c4ac480b6c9563be0d85599e29cc7b68b25a82d250b0e789726727551e8d38"),
        (CONTROLLER[1], "7a0b228f8570917dae9556f9540b9ba0fd0267f365ffc486826184fc5832488f"),
        (CRDS[3], "47603a282fba86da60a455685f6367754477785068e0a376a05252a7bb42612f"),
        (CRDS[4], "5bcb90038d39eb7cb43fd2868c3c9cb0a62855dfd27f5c2f0f3715b0164aabdf"),
        (CRDS[5], "fe20266b088a778ad05015a92a519be71d16db118ed6ffd5705b7306c3be4df3"),
        (CRD_KUSTOMIZATION, "de6201f9eb9b962d8bc05d65cf2eb9ae2c49eb7810ea3f339a42b3b3aff58e81"),
        (CRDS[0], "75e6565aac2c0f2949ed13ea884bbaa388cb7be576b558b709cf1168e011828d"),
        (CRDS[1], "895a3c1e73b60f06a0deb566dd123d01bdf1b2efc5d5ff5231ff8bbcf42dafc7"),
        (CRDS[2], "b032116e987fb1d7d93cec7d942833adeb9d95c9bdc7e00c10b280c2fe4a6c33"),
    ];

    #[test]
    fn the_upstream_files_are_the_recorded_ones() {
        let source = include_str!("snapshot_controller/SOURCE.md");
        for (u, sha) in SHA256 {
            assert_eq!(base::sha256_hex(u.text.as_bytes()), sha, "{} changed: update snapshot_controller/SOURCE.md", u.file);
            assert!(source.contains(sha), "{}: {sha} not in SOURCE.md", u.file);
        }
    }

    #[test]
    fn the_overlay_is_kops_settings_over_upstream() {
        let d = render(&Settings { install_default_class: false }).unwrap();
        let kinds: Vec<&str> = d.iter().filter_map(|x| x["kind"].as_str()).collect();
        assert_eq!(
            kinds,
            [
                "CustomResourceDefinition",
                "CustomResourceDefinition",
                "CustomResourceDefinition",
                "CustomResourceDefinition",
                "CustomResourceDefinition",
                "CustomResourceDefinition",
                "ServiceAccount",
                "ClusterRole",
                "ClusterRoleBinding",
                "Role",
                "RoleBinding",
                "Deployment"
            ]
        );
        // The CRDs carry upstream's full schemas and CEL rules (the webhook's replacement).
        let snapshots = d.iter().find(|x| x["metadata"]["name"] == "volumesnapshots.snapshot.storage.k8s.io").unwrap();
        assert!(serde_json::to_string(snapshots).unwrap().contains("x-kubernetes-validations"), "no CEL rules");
        let dep = kind(&d, "Deployment");
        assert_eq!(dep["spec"]["replicas"], 2);
        let spread = &dep["spec"]["template"]["spec"]["topologySpreadConstraints"];
        assert_eq!(spread[1]["labelSelector"], json!({"matchLabels": {"app.kubernetes.io/name": "snapshot-controller"}}));
        assert_eq!(spread[1]["whenUnsatisfiable"], "DoNotSchedule");
        assert_eq!(dep["spec"]["template"]["spec"]["containers"][0]["args"], json!(["--v=5", "--leader-election=true"]));
        assert!(!d.iter().any(|x| x["kind"] == "VolumeSnapshotClass" || x["kind"] == "ValidatingWebhookConfiguration"));
        let with_class = render(&Settings { install_default_class: true }).unwrap();
        let class = kind(&with_class, "VolumeSnapshotClass");
        assert_eq!((class["driver"].as_str(), class["metadata"]["name"].as_str()), (Some("ebs.csi.aws.com"), Some("csi-hostpath-snapclass")));
        assert_eq!(class["metadata"]["annotations"]["snapshot.storage.kubernetes.io/is-default-class"], "true");
    }

    #[test]
    fn on_when_enabled_and_the_default_class_only_on_aws() {
        let (cluster, _) = ha();
        assert!(docs(&cluster).unwrap().is_none());
        // kOps' many-addons case enables it (with cert-manager, which Keelson does not need for it).
        let (mut cluster, _) = case("many-addons");
        assert!(docs(&cluster).unwrap().is_some());
        cluster.spec.snapshot_controller.as_mut().unwrap().install_default_class = Some(true);
        assert!(Settings::new(&cluster).unwrap().unwrap().install_default_class);
        cluster.spec.cloud_provider = Some("gce".into());
        let e = Settings::new(&cluster).unwrap_err().to_string();
        assert!(e.starts_with("spec.snapshotController.installDefaultClass:") && e.contains("gce"), "{e}");
    }
}
