//! The table itself: which component versions and images a Kubernetes version implies, and the
//! checks on versions a spec overrides. Facts and their kOps sources are listed in [`super`].

use keelson_api::KubernetesVersion;

use super::{Arch, VersionsError};

/// Default containerd version (kOps `ContainerdOptionsBuilder`).
pub const DEFAULT_CONTAINERD_VERSION: &str = "2.3.4";
/// Default runc version, set together with the default containerd version.
pub const DEFAULT_RUNC_VERSION: &str = "1.4.3";
/// Default sandbox (pause) image before registry rewriting (containerd's `sandboxImage`; nodeup
/// takes it from the NodeupConfig and has no default of its own).
pub const DEFAULT_PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10.1";
/// Latest bundled etcd patch per minor (kOps `pkg/model/components/etcd.go`).
pub const LATEST_ETCD_35_VERSION: &str = "3.5.31";
pub const LATEST_ETCD_36_VERSION: &str = "3.6.12";
pub const LATEST_ETCD_37_VERSION: &str = "3.7.0";
/// etcd-manager image (kOps `pkg/model/components/etcdmanager/model.go`).
pub const ETCD_MANAGER_IMAGE: &str = "registry.k8s.io/etcd-manager/etcd-manager-slim:v3.0.20260707";
/// AWS cloud-controller-manager image; the same for every Kubernetes minor at this commit.
pub const AWS_CLOUD_CONTROLLER_MANAGER_IMAGE: &str = "registry.k8s.io/provider-aws/cloud-controller-manager:v1.36.1";
/// CoreDNS image (the cluster DNS addon); kOps pins one for every Kubernetes minor at this commit.
pub const COREDNS_IMAGE: &str = "registry.k8s.io/coredns/coredns:v1.14.2";
/// The metrics-server release kOps pins (`metrics-server.addons.k8s.io/k8s-1.11.yaml.template`);
/// the addon's base manifest, `addons/metrics_server/release-v<version>.yaml`, is that release's.
pub const METRICS_SERVER_VERSION: &str = "0.8.0";
/// The metrics-server image (`spec.metricsServer.image` wins over it).
pub const METRICS_SERVER_IMAGE: &str = "registry.k8s.io/metrics-server/metrics-server:v0.8.0";
/// The cluster-autoscaler image kOps completes `spec.clusterAutoscaler.image` with, per Kubernetes
/// minor (kOps `pkg/model/components/clusterautoscaler.go`; later minors get the newest).
pub const CLUSTER_AUTOSCALER_IMAGES: &[((u64, u64), &str)] = &[
    ((1, 32), "registry.k8s.io/autoscaling/cluster-autoscaler:v1.32.7"),
    ((1, 33), "registry.k8s.io/autoscaling/cluster-autoscaler:v1.33.5"),
    ((1, 34), "registry.k8s.io/autoscaling/cluster-autoscaler:v1.34.4"),
    ((1, 35), "registry.k8s.io/autoscaling/cluster-autoscaler:v1.35.1"),
];
/// The cluster-autoscaler image for a minor [`CLUSTER_AUTOSCALER_IMAGES`] does not list.
pub const CLUSTER_AUTOSCALER_NEWEST_IMAGE: &str = "registry.k8s.io/autoscaling/cluster-autoscaler:v1.36.0";
/// The cluster-autoscaler release whose example manifest is the addon's base
/// (`addons/cluster_autoscaler/cluster-autoscaler-autodiscover.yaml`; its sibling `SOURCE` names
/// the tag, commit and sha256).
pub const CLUSTER_AUTOSCALER_MANIFEST_RELEASE: &str = "cluster-autoscaler-1.34.4";
/// The flannel release the `networking.flannel` addon's base manifest is
/// (`addons/flannel/kube-flannel-v<version>.yml`, upstream's `Documentation/kube-flannel.yml`). kOps
/// pins v0.28.9, which the Go module proxy does not serve; keelson-local builds this one.
pub const FLANNEL_VERSION: &str = "0.28.4";
/// flanneld's image (the manifest's `install-cni` and `kube-flannel` containers).
pub const FLANNEL_IMAGE: &str = "ghcr.io/flannel-io/flannel:v0.28.4";
/// The image whose `/flannel` is the flannel CNI plugin (the manifest's `install-cni-plugin`).
pub const FLANNEL_CNI_PLUGIN_IMAGE: &str = "ghcr.io/flannel-io/flannel-cni-plugin:v1.9.1-flannel1";
/// Default `spec.networking.cilium.version` (kOps `CiliumOptionsBuilder`); kOps supports only 1.18.
pub const DEFAULT_CILIUM_VERSION: &str = "v1.18.12";
/// The only Cilium minor the networking.cilium.io manifest is written for.
pub const CILIUM_MINOR: (u64, u64) = (1, 18);
/// The Calico version kOps' `networking.projectcalico.org` template pins when
/// `spec.networking.calico.version` is unset (kOps leaves the field empty in the completed spec).
pub const DEFAULT_CALICO_VERSION: &str = "v3.31.6";
/// Where the Calico images live unless `spec.networking.calico.registry` says otherwise.
pub const DEFAULT_CALICO_REGISTRY: &str = "docker.io";
/// Where the Cilium images live unless `spec.networking.cilium.registry` says otherwise.
pub const DEFAULT_CILIUM_REGISTRY: &str = "quay.io";
/// Default AWS EBS CSI driver version (`spec.cloudConfig.awsEBSCSIDriver.version`), the image tag.
pub const AWS_EBS_CSI_DRIVER_VERSION: &str = "v1.58.0";
/// The AWS EBS CSI driver's image repository; the tag is the driver version.
pub const AWS_EBS_CSI_DRIVER_REPOSITORY: &str = "registry.k8s.io/provider-aws/aws-ebs-csi-driver";
/// The CSI sidecars kOps runs with the EBS CSI driver (the same for every driver version it allows).
pub const CSI_PROVISIONER_IMAGE: &str = "registry.k8s.io/sig-storage/csi-provisioner:v6.2.0";
pub const CSI_ATTACHER_IMAGE: &str = "registry.k8s.io/sig-storage/csi-attacher:v4.11.0";
pub const CSI_RESIZER_IMAGE: &str = "registry.k8s.io/sig-storage/csi-resizer:v2.1.0";
pub const CSI_SNAPSHOTTER_IMAGE: &str = "registry.k8s.io/sig-storage/csi-snapshotter:v8.5.0";
pub const CSI_LIVENESS_PROBE_IMAGE: &str = "registry.k8s.io/sig-storage/livenessprobe:v2.18.0";
pub const CSI_NODE_DRIVER_REGISTRAR_IMAGE: &str = "registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.16.0";
/// GCP cloud-controller-manager image (kOps `gcpcloudcontrollermanager.go`).
pub const GCP_CLOUD_CONTROLLER_MANAGER_IMAGE: &str = "registry.k8s.io/cloud-provider-gcp/cloud-controller-manager:v35.0.0";
/// Default `cloudProvider.aws.binariesLocation`: ecr-credential-provider v1.31.7 for every minor.
pub const ECR_CREDENTIAL_PROVIDER_VERSION: &str = "1.31.7";
pub const DEFAULT_AWS_BINARIES_LOCATION: &str = "https://artifacts.k8s.io/binaries/cloud-provider-aws/v1.31.7";
/// Default `cloudProvider.gce.binariesLocation`.
pub const AUTH_PROVIDER_GCP_VERSION: &str = "35.0.0";
pub const DEFAULT_GCE_BINARIES_LOCATION: &str = "https://artifacts.k8s.io/binaries/cloud-provider-gcp/v35.0.0";
/// crictl / nerdctl pinned versions (kOps `wellknownassets/{crictl,nerdctl}.go`).
pub const CRICTL_VERSION: &str = "1.29.0";
pub const NERDCTL_VERSION: &str = "1.7.4";
/// kOps refuses (`kubernetes upgrade is required`) Kubernetes older than this.
pub const OLDEST_SUPPORTED_KUBERNETES_VERSION: (u64, u64, u64) = (1, 32, 0);
/// kOps warns (deprecated) for Kubernetes older than this.
pub const OLDEST_RECOMMENDED_KUBERNETES_VERSION: (u64, u64, u64) = (1, 34, 0);

/// The Kubernetes version `keelson create cluster` writes when `--kubernetes-version` is not given:
/// the release Keelson's own clusters are built and tested with (keelson-local builds it; the
/// examples use it — a test holds them to it).
pub const RECOMMENDED_KUBERNETES_VERSION: &str = "1.34.4";

/// The machine images of kOps' stable channel for Kubernetes ≥ 1.32 (`channels/stable`, `images`),
/// per cloud and architecture: what `create cluster` writes when no `--image` is given.
pub const CHANNEL_IMAGES: &[(&str, Arch, &str)] = &[
    ("aws", Arch::Amd64, "099720109477/ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-20260714"),
    ("aws", Arch::Arm64, "099720109477/ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-arm64-server-20260714"),
    ("gce", Arch::Amd64, "ubuntu-os-cloud/ubuntu-2404-noble-amd64-v20260615"),
    ("gce", Arch::Arm64, "ubuntu-os-cloud/ubuntu-2404-noble-arm64-v20260615"),
];

/// The channel's image for a cloud and architecture ([`CHANNEL_IMAGES`]; empty for a cloud it
/// does not list).
pub fn default_image(cloud: &str, arch: Arch) -> &'static str {
    CHANNEL_IMAGES.iter().find(|(c, a, _)| *c == cloud && *a == arch).map_or("", |(_, _, image)| image)
}

/// Asset names understood by [`Versions::assets`].
pub const ASSET_NAMES: &[&str] =
    &["kubelet", "kubectl", "ecr-credential-provider", "auth-provider-gcp", "cni-plugins", "containerd", "runc", "crictl", "nerdctl"];

/// The NVIDIA driver package nodeup installs on GPU instances (`containerd.nvidiaGPU.enabled`) when
/// the spec names none (kOps `nvidia.DriverPackage` default).
pub const NVIDIA_DRIVER_PACKAGE: &str = "nvidia-driver-535-server";

/// `(major, minor, patch)`, pre-release ignored: kOps' version gates (`IsGTE`) compare these.
fn core(v: &KubernetesVersion) -> (u64, u64, u64) {
    (v.major, v.minor, v.patch)
}

/// Whether kOps accepts this Kubernetes version at all (>= 1.32.0).
pub fn is_supported(v: &KubernetesVersion) -> bool {
    core(v) >= OLDEST_SUPPORTED_KUBERNETES_VERSION
}

/// Whether kOps considers this Kubernetes version deprecated (< 1.34.0).
pub fn is_deprecated(v: &KubernetesVersion) -> bool {
    core(v) < OLDEST_RECOMMENDED_KUBERNETES_VERSION
}

/// Default etcd version for a control-plane Kubernetes version (kOps `EtcdOptionsBuilder`).
pub fn default_etcd_version(v: &KubernetesVersion) -> &'static str {
    if core(v) < (1, 34, 0) {
        LATEST_ETCD_35_VERSION
    } else if core(v) < (1, 37, 0) {
        LATEST_ETCD_36_VERSION
    } else {
        LATEST_ETCD_37_VERSION
    }
}

/// Parse a component version (`2.3.4`, `v3.6.12`, `1.4.3-rc.1`) with the one version type.
fn parse(version: &str) -> Result<KubernetesVersion, String> {
    version.trim().parse::<KubernetesVersion>().map_err(|e| e.to_string())
}

/// Whether etcd-manager bundles `version` (every release patch up to the latest of 3.5/3.6/3.7).
pub fn etcd_version_is_supported(version: &str) -> bool {
    let Ok(v) = parse(version) else {
        return false;
    };
    v.pre.is_none()
        && [LATEST_ETCD_35_VERSION, LATEST_ETCD_36_VERSION, LATEST_ETCD_37_VERSION]
            .iter()
            .filter_map(|latest| parse(latest).ok())
            .any(|l| l.major == v.major && l.minor == v.minor && v.patch <= l.patch)
}

pub use keelson_api::image::etcd_image;

/// Default CNI plugins version for a Kubernetes version (kOps `FindCNIAssets`);
/// `None` below 1.32, where kOps has no default.
pub fn default_cni_version(v: &KubernetesVersion) -> Option<&'static str> {
    match core(v) {
        c if c >= (1, 36, 0) => Some("1.9.1"),
        c if c >= (1, 35, 0) => Some("1.8.0"),
        c if c >= (1, 34, 0) => Some("1.7.1"),
        c if c >= (1, 32, 0) => Some("1.6.2"),
        _ => None,
    }
}

/// kOps' default `spec.clusterAutoscaler.image` for a Kubernetes version (before registry rewriting).
pub fn cluster_autoscaler_image(v: &KubernetesVersion) -> &'static str {
    CLUSTER_AUTOSCALER_IMAGES.iter().find(|((major, minor), _)| (v.major, v.minor) == (*major, *minor)).map_or(CLUSTER_AUTOSCALER_NEWEST_IMAGE, |(_, i)| *i)
}

/// The canonical URL of a Kubernetes release binary.
pub(super) fn kubernetes_binary_url(version: &str, arch: Arch, binary: &str) -> String {
    format!("https://dl.k8s.io/release/v{version}/bin/linux/{}/{binary}", arch.as_str())
}

/// `version` must be at least `min` (a pre-release of `min` counts as older, as in blang semver).
fn at_least(version: &str, min: (u64, u64, u64)) -> Result<bool, String> {
    let v = parse(version).map_err(|reason| format!("unable to parse: {reason}"))?;
    Ok(core(&v) > min || (core(&v) == min && v.pre.is_none()))
}

pub(super) fn check_containerd_version(version: &str) -> Result<(), VersionsError> {
    let err = |reason: String| VersionsError::UnsupportedContainerdVersion { version: version.to_string(), reason };
    match at_least(version, (2, 1, 0)) {
        Ok(true) => Ok(()),
        Ok(false) => Err(err("unsupported legacy containerd version (kOps requires >= 2.1.0)".to_string())),
        Err(reason) => Err(err(reason)),
    }
}

pub(super) fn check_runc_version(version: &str) -> Result<(), VersionsError> {
    let err = |reason: String| VersionsError::UnsupportedRuncVersion { version: version.to_string(), reason };
    match at_least(version, (1, 1, 0)) {
        Ok(true) => Ok(()),
        Ok(false) => Err(err("kOps requires runc >= 1.1.0".to_string())),
        Err(reason) => Err(err(reason)),
    }
}
