//! The versions table: the one place that knows which component versions,
//! images, asset URLs and asset hashes a given Kubernetes version implies.
//!
//! Facts (versions, URLs, hashes) mirror kOps at
//! `kubernetes/kops@268927e26409f861634e18f3632c9dd483c350cf`:
//!
//! * etcd default: `pkg/model/components/etcd.go` (`< 1.34` → 3.5.x, `< 1.37` → 3.6.x, else 3.7.x)
//! * containerd / runc / pause defaults: `pkg/model/components/containerd.go`
//! * CNI plugins per minor: `pkg/nodemodel/wellknownassets/cni.go`
//! * containerd / runc URL shapes and minimum versions: `pkg/nodemodel/wellknownassets/{containerd,runc}.go`
//! * ecr-credential-provider / auth-provider-gcp locations: `pkg/nodemodel/fileassets.go`
//! * AWS CCM image: `pkg/model/components/awscloudcontrollermanager.go`
//! * CoreDNS image: `upup/models/cloudup/resources/addons/coredns.addons.k8s.io/k8s-1.12.yaml.template`
//! * metrics-server version and image: `upup/models/cloudup/resources/addons/metrics-server.addons.k8s.io/k8s-1.11.yaml.template`
//! * cluster-autoscaler image per minor: `pkg/model/components/clusterautoscaler.go`
//! * Cilium default version: `pkg/model/components/cilium.go`; agent/operator image names:
//!   `upup/models/cloudup/resources/addons/networking.cilium.io/k8s-1.16-v1.15.yaml.template`
//! * Calico default version and image names (`calico/{node,cni,kube-controllers,typha}` under
//!   `docker.io`): `upup/models/cloudup/resources/addons/networking.projectcalico.org/k8s-1.25.yaml.template`
//! * AWS EBS CSI driver version: `pkg/model/components/awsebscsidriver.go`; its image repository and
//!   sidecar images: `upup/models/cloudup/resources/addons/aws-ebs-csi-driver.addons.k8s.io/k8s-1.17.yaml.template`
//! * hashes: `pkg/assets/assetdata/*.yaml` (copied into `versions/hashes.tsv`, keyed by canonical URL,
//!   exactly like kOps' `assetdata.GetHash`)
//! * mirror rewriting: `pkg/assets/builder.go` (`RemapFile`/`remapURL`, `RemapImage`/`NormalizeImage`)
//!
//! Version comparisons ignore pre-release/build suffixes, as kOps' `KubernetesVersion.IsGTE` does,
//! so `1.34.0-alpha.1` gets the 1.34 defaults.

//!
//! Modules: [`table`] (versions and images per Kubernetes version), [`mirror`] (file repository and
//! registry rewriting), [`hashes`] (the hash table and the lookup order), [`fetch`] (fetching an
//! unknown hash, for callers that allow it).

mod fetch;
mod hashes;
mod mirror;
mod table;
pub mod upgrade;

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use keelson_api::KubernetesVersion;

pub use fetch::{default_cache_dir, HashFetcher, HttpFetcher, HASH_FETCH_TIMEOUT};
pub use hashes::{
    hash_override, hash_table_errors, hash_table_rows, known_kubernetes_versions, known_sha256, lookup_sha256, parse_asset_hashes, read_asset_hashes, HashRow,
};
pub use mirror::{remap_file_url, remap_image};
pub use table::*;

/// A [`HashFetcher`] shared by the options that carry it (compared by identity).
#[derive(Clone)]
pub struct Fetcher(pub Arc<dyn HashFetcher>);

impl Fetcher {
    pub fn new(f: impl HashFetcher + 'static) -> Fetcher {
        Fetcher(Arc::new(f))
    }
}

impl fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Fetcher")
    }
}

impl PartialEq for Fetcher {
    fn eq(&self, other: &Fetcher) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}
impl Eq for Fetcher {}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

#[derive(Debug, thiserror::Error)]
pub enum VersionsError {
    #[error("asset hashes file {path}{}: {reason}", if *line > 0 { format!(" line {line}") } else { String::new() })]
    AssetHashesFile { path: PathBuf, line: usize, reason: String },

    #[error("unsupported containerd version {version:?}: {reason}")]
    UnsupportedContainerdVersion { version: String, reason: String },

    #[error("unsupported runc version {version:?}: {reason}")]
    UnsupportedRuncVersion { version: String, reason: String },

    #[error("containerd version {containerd_version:?} is set but runc version is not (kOps: unable to find runc config); set containerd.runc.version")]
    RuncVersionRequired { containerd_version: String },

    #[error("no default CNI plugins asset for Kubernetes {version} ({arch}); kOps knows CNI plugins for Kubernetes >= 1.32 only")]
    NoCniForKubernetes { version: String, arch: Arch },

    #[error("unknown asset {name:?} requested for Kubernetes {version}; known assets: {known}")]
    UnknownAsset { name: String, version: String, known: String },

    #[error("invalid assets.fileRepository {file_repository:?} (remapping {url}): {reason}")]
    InvalidFileRepository { file_repository: String, url: String, reason: String },

    #[error("sha256 of {file} {version} is not in the versions table and offline mode forbids fetching {url}.sha256")]
    HashUnknownOffline { file: String, version: String, url: String },

    #[error("cannot determine sha256 of {file} {version}: fetching {url}.sha256 failed: {reason}")]
    HashFetch { file: String, version: String, url: String, reason: String },

    #[error("invalid sha256 {value:?} for {file} {version} from {source_desc} ({url})")]
    InvalidHash { file: String, version: String, url: String, value: String, source_desc: String },
}

// ---------------------------------------------------------------------------------------------
// Arch
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Arch {
    Amd64,
    Arm64,
}

impl Arch {
    /// All supported architectures, in kOps order (`architectures.GetSupported()`).
    pub const ALL: [Arch; 2] = [Arch::Amd64, Arch::Arm64];

    pub const fn as_str(self) -> &'static str {
        match self {
            Arch::Amd64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    pub fn parse(s: &str) -> Option<Arch> {
        match s.trim() {
            "amd64" | "x86_64" => Some(Arch::Amd64),
            "arm64" | "aarch64" => Some(Arch::Arm64),
            _ => None,
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// ---------------------------------------------------------------------------------------------
// Lookup options, assets
// ---------------------------------------------------------------------------------------------

/// How to resolve versions and hashes. Construct with `..Default::default()` so new fields
/// do not break callers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LookupOptions {
    /// Where a hash neither `asset_hashes` nor the table knows comes from; `None` (offline): such a
    /// hash is an error.
    pub fetcher: Option<Fetcher>,
    /// `spec.assets.fileRepository`.
    pub file_repository: Option<String>,
    /// `spec.assets.containerRegistry`.
    pub container_registry: Option<String>,
    /// `spec.assets.containerProxy`.
    pub container_proxy: Option<String>,
    /// `spec.containerd.version`.
    pub containerd_version_override: Option<String>,
    /// `spec.containerd.runc.version`.
    pub runc_version_override: Option<String>,
    /// Known sha256 of assets, keyed by canonical *or* download URL, that win over the table and
    /// the published `.sha256` files: for a mirror that serves assets built locally under the
    /// upstream names (`keelson compile --asset-hashes FILE`, read by [`read_asset_hashes`]).
    pub asset_hashes: std::collections::BTreeMap<String, String>,
    /// Known image digests (`sha256:…`) keyed by the upstream reference, before any
    /// `containerRegistry` / `containerProxy` rewriting: the images of a bundle's `bundle.json`
    /// (`keelson compile --image-digests FILE`). Every image [`Versions::remap_image`] writes, and
    /// every image the spec writes as given ([`crate::digests`]), is pinned to its digest.
    pub image_digests: std::collections::BTreeMap<String, String>,
}

/// A file asset: where to download it (after `fileRepository` rewriting) and its sha256.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Asset {
    /// `"kubelet"`, `"kubectl"`, `"containerd"`, `"runc"`, `"cni-plugins"`,
    /// `"ecr-credential-provider"`, `"auth-provider-gcp"`, `"crictl"`, `"nerdctl"`, or a caller name.
    pub name: String,
    /// Download URL (rewritten when a file repository is set).
    pub url: String,
    /// Canonical (upstream) URL; the table key.
    pub canonical_url: String,
    /// Lower-case hex sha256.
    pub sha256: String,
}

impl Asset {
    /// nodeup `Assets:` entry form: `<sha256>@<url>`.
    pub fn compact_string(&self) -> String {
        format!("{}@{}", self.sha256, self.url)
    }
}

/// The Calico images (`calico-node` and its init containers, `calico-kube-controllers`, Typha).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CalicoImages {
    pub node: String,
    pub cni: String,
    pub kube_controllers: String,
    pub typha: String,
}

/// The images of the AWS EBS CSI driver addon, registry rewriting applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwsEbsCsiImages {
    pub driver: String,
    pub provisioner: String,
    pub attacher: String,
    pub resizer: String,
    pub snapshotter: String,
    pub liveness_probe: String,
    pub node_driver_registrar: String,
}

/// Resolved versions for one Kubernetes version.
#[derive(Debug, Clone)]
pub struct Versions {
    kubernetes: KubernetesVersion,
    /// `kubernetes` as written in image tags and URLs (no leading `v`).
    kubernetes_version: String,
    etcd_version: &'static str,
    containerd_version: String,
    runc_version: String,
    cni_version: Option<&'static str>,
    opts: LookupOptions,
}

impl Versions {
    /// Resolve defaults for a Kubernetes version (`1.34.0`, `1.34.0-alpha.1`).
    ///
    /// containerd/runc follow kOps `ContainerdOptionsBuilder`: when no containerd version is
    /// set, both containerd and runc get the defaults (a runc override alone is then ignored,
    /// as kOps replaces the whole runc block); when containerd is set, runc must be set too.
    /// Versions older than 1.32 are resolved (see [`is_supported`]) but have no default CNI plugins asset.
    pub fn for_kubernetes(version: &KubernetesVersion, opts: &LookupOptions) -> Result<Versions, VersionsError> {
        let (containerd_version, runc_version) = match opts.containerd_version_override.as_deref() {
            None | Some("") => (DEFAULT_CONTAINERD_VERSION.to_string(), DEFAULT_RUNC_VERSION.to_string()),
            Some(c) => {
                let runc = match opts.runc_version_override.as_deref() {
                    Some(r) if !r.is_empty() => r.to_string(),
                    _ => return Err(VersionsError::RuncVersionRequired { containerd_version: c.to_string() }),
                };
                (c.to_string(), runc)
            }
        };
        check_containerd_version(&containerd_version)?;
        check_runc_version(&runc_version)?;
        Ok(Versions {
            etcd_version: default_etcd_version(version),
            cni_version: default_cni_version(version),
            kubernetes: version.clone(),
            kubernetes_version: version.to_string(),
            containerd_version,
            runc_version,
            opts: opts.clone(),
        })
    }

    pub fn kubernetes(&self) -> &KubernetesVersion {
        &self.kubernetes
    }

    /// Normalised Kubernetes version (no leading `v`).
    pub fn kubernetes_version(&self) -> &str {
        &self.kubernetes_version
    }

    pub fn options(&self) -> &LookupOptions {
        &self.opts
    }

    /// Default etcd version for this control-plane version.
    pub fn etcd_version(&self) -> &str {
        self.etcd_version
    }

    /// `registry.k8s.io/etcd:v<etcd_version>` after registry rewriting.
    pub fn etcd_image(&self) -> String {
        self.etcd_image_of(self.etcd_version)
    }

    pub fn etcd_manager_image(&self) -> String {
        self.remap_image(ETCD_MANAGER_IMAGE)
    }

    pub fn containerd_version(&self) -> &str {
        &self.containerd_version
    }

    pub fn runc_version(&self) -> &str {
        &self.runc_version
    }

    /// CNI plugins version; empty string for Kubernetes < 1.32 (no kOps default).
    pub fn cni_version(&self) -> &str {
        self.cni_version.unwrap_or("")
    }

    pub fn cni_version_opt(&self) -> Option<&str> {
        self.cni_version
    }

    /// Sandbox image after registry rewriting.
    pub fn pause_image(&self) -> String {
        self.remap_image(DEFAULT_PAUSE_IMAGE)
    }

    /// `registry.k8s.io/<component>:v<version>` after rewriting (kOps `components.Image`).
    pub fn component_image(&self, component: &str) -> String {
        self.remap_image(&format!("registry.k8s.io/{component}:v{}", self.kubernetes_version))
    }

    pub fn cloud_controller_manager_image_aws(&self) -> String {
        self.remap_image(AWS_CLOUD_CONTROLLER_MANAGER_IMAGE)
    }

    /// The CoreDNS image after registry rewriting (`spec.kubeDNS.coreDNSImage` wins over it).
    pub fn coredns_image(&self) -> String {
        self.remap_image(COREDNS_IMAGE)
    }

    /// flanneld's image after registry rewriting.
    pub fn flannel_image(&self) -> String {
        self.remap_image(FLANNEL_IMAGE)
    }

    /// The flannel CNI plugin's image after registry rewriting.
    pub fn flannel_cni_plugin_image(&self) -> String {
        self.remap_image(FLANNEL_CNI_PLUGIN_IMAGE)
    }

    /// The metrics-server image after registry rewriting (`spec.metricsServer.image` wins over it).
    pub fn metrics_server_image(&self) -> String {
        self.remap_image(METRICS_SERVER_IMAGE)
    }

    /// The Cilium agent and operator images for `spec.networking.cilium.{registry,version}`
    /// (`<registry>/cilium/cilium:<version>`, `<registry>/cilium/operator:<version>`), after
    /// registry rewriting.
    pub fn cilium_images(&self, registry: Option<&str>, version: &str) -> (String, String) {
        let registry = registry.unwrap_or(DEFAULT_CILIUM_REGISTRY);
        (self.remap_image(&format!("{registry}/cilium/cilium:{version}")), self.remap_image(&format!("{registry}/cilium/operator:{version}")))
    }

    /// The Calico images for `spec.networking.calico.{registry,version}` (`<registry>/calico/<name>:<version>`,
    /// defaults [`DEFAULT_CALICO_REGISTRY`] and [`DEFAULT_CALICO_VERSION`]), after registry rewriting.
    pub fn calico_images(&self, registry: Option<&str>, version: Option<&str>) -> CalicoImages {
        let registry = registry.unwrap_or(DEFAULT_CALICO_REGISTRY);
        let version = version.unwrap_or(DEFAULT_CALICO_VERSION);
        let image = |name: &str| self.remap_image(&format!("{registry}/calico/{name}:{version}"));
        CalicoImages { node: image("node"), cni: image("cni"), kube_controllers: image("kube-controllers"), typha: image("typha") }
    }

    /// The AWS EBS CSI driver and its sidecars after registry rewriting; `driver_version` is the
    /// image tag (`spec.cloudConfig.awsEBSCSIDriver.version`, completed to
    /// [`AWS_EBS_CSI_DRIVER_VERSION`]).
    pub fn aws_ebs_csi_images(&self, driver_version: &str) -> AwsEbsCsiImages {
        AwsEbsCsiImages {
            driver: self.remap_image(&format!("{AWS_EBS_CSI_DRIVER_REPOSITORY}:{driver_version}")),
            provisioner: self.remap_image(CSI_PROVISIONER_IMAGE),
            attacher: self.remap_image(CSI_ATTACHER_IMAGE),
            resizer: self.remap_image(CSI_RESIZER_IMAGE),
            snapshotter: self.remap_image(CSI_SNAPSHOTTER_IMAGE),
            liveness_probe: self.remap_image(CSI_LIVENESS_PROBE_IMAGE),
            node_driver_registrar: self.remap_image(CSI_NODE_DRIVER_REGISTRAR_IMAGE),
        }
    }

    pub fn cloud_controller_manager_image_gcp(&self) -> String {
        self.remap_image(GCP_CLOUD_CONTROLLER_MANAGER_IMAGE)
    }

    /// The image reference nodes pull for the upstream `image`: `containerProxy` /
    /// `containerRegistry` applied, then pinned (`NAME:TAG@sha256:…`) when
    /// [`LookupOptions::image_digests`] knows `image` — the digest of what a bundle holds is the
    /// digest of what it pushed under the rewritten name. The one place an image reference is made.
    pub fn remap_image(&self, image: &str) -> String {
        self.pin_image(image, remap_image(image, self.opts.container_registry.as_deref(), self.opts.container_proxy.as_deref()))
    }

    /// `reference` (what `upstream` is written as) pinned to `upstream`'s known digest, if any; a
    /// reference that already pins a digest is kept.
    pub fn pin_image(&self, upstream: &str, reference: String) -> String {
        match self.opts.image_digests.get(upstream) {
            Some(digest) if !reference.contains('@') => format!("{reference}@{digest}"),
            _ => reference,
        }
    }

    /// The etcd image of an etcd version (`3.6.12`, `v3.6.12`), rewritten and pinned as
    /// [`Versions::remap_image`].
    pub fn etcd_image_of(&self, etcd_version: &str) -> String {
        self.remap_image(&etcd_image(etcd_version))
    }

    /// Apply `fileRepository` to any canonical URL.
    pub fn remap_file_url(&self, canonical_url: &str) -> Result<String, VersionsError> {
        remap_file_url(canonical_url, self.opts.file_repository.as_deref())
    }

    /// Canonical (upstream) URL and component version of a named asset.
    pub fn canonical_asset_url(&self, arch: Arch, name: &str) -> Result<(String, String), VersionsError> {
        let a = arch.as_str();
        let k8s = &self.kubernetes_version;
        Ok(match name {
            "kubelet" | "kubectl" => (kubernetes_binary_url(k8s, arch, name), k8s.clone()),
            "ecr-credential-provider" => {
                (format!("{DEFAULT_AWS_BINARIES_LOCATION}/linux/{a}/ecr-credential-provider-linux-{a}"), ECR_CREDENTIAL_PROVIDER_VERSION.to_string())
            }
            "auth-provider-gcp" => {
                (format!("{DEFAULT_GCE_BINARIES_LOCATION}/auth-provider-gcp/linux/{a}/auth-provider-gcp"), AUTH_PROVIDER_GCP_VERSION.to_string())
            }
            "cni-plugins" => {
                let v = self.cni_version.ok_or_else(|| VersionsError::NoCniForKubernetes { version: k8s.clone(), arch })?;
                (format!("https://github.com/containernetworking/plugins/releases/download/v{v}/cni-plugins-linux-{a}-v{v}.tgz"), v.to_string())
            }
            "containerd" => {
                let v = &self.containerd_version;
                (format!("https://github.com/containerd/containerd/releases/download/v{v}/containerd-{v}-linux-{a}.tar.gz"), v.clone())
            }
            "runc" => {
                let v = &self.runc_version;
                (format!("https://github.com/opencontainers/runc/releases/download/v{v}/runc.{a}"), v.clone())
            }
            "crictl" => {
                let v = CRICTL_VERSION;
                (format!("https://github.com/kubernetes-sigs/cri-tools/releases/download/v{v}/crictl-v{v}-linux-{a}.tar.gz"), v.to_string())
            }
            "nerdctl" => {
                let v = NERDCTL_VERSION;
                (format!("https://github.com/containerd/nerdctl/releases/download/v{v}/nerdctl-{v}-linux-{a}.tar.gz"), v.to_string())
            }
            other => return Err(VersionsError::UnknownAsset { name: other.to_string(), version: k8s.clone(), known: ASSET_NAMES.join(", ") }),
        })
    }

    /// Resolve the named assets for `arch`, in the given order, URLs rewritten for the file
    /// repository. Hashes come from the table, else the cache, else `<download url>.sha256`
    /// (then `.sha256sum`) through the options' fetcher, if any.
    pub fn assets(&self, arch: Arch, which: &[&str]) -> Result<Vec<Asset>, VersionsError> {
        which
            .iter()
            .map(|name| {
                let (canonical, version) = self.canonical_asset_url(arch, name)?;
                self.resolve_asset(name, &version, &canonical)
            })
            .collect()
    }

    /// Resolve an arbitrary asset (e.g. a custom `binariesLocation`): rewrite its URL and find
    /// its hash. `version` is only used in error messages.
    pub fn resolve_asset(&self, name: &str, version: &str, canonical_url: &str) -> Result<Asset, VersionsError> {
        let url = self.remap_file_url(canonical_url)?;
        let sha256 = lookup_sha256(name, version, canonical_url, &url, &self.opts)?;
        Ok(Asset { name: name.to_string(), url, canonical_url: canonical_url.to_string(), sha256 })
    }
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::path::Path;

    use super::hashes::{is_sha256_hex, HASH_TABLE_TSV};
    use super::*;

    fn offline() -> LookupOptions {
        LookupOptions::default()
    }

    fn k(v: &str) -> KubernetesVersion {
        v.parse().unwrap()
    }

    #[test]
    fn table_rows_all_parse() {
        let (rows, errors) = hashes::parse_hash_table(HASH_TABLE_TSV);
        assert!(errors.is_empty(), "{errors:?}");
        assert!(hash_table_errors().is_empty(), "{:?}", hash_table_errors());
        let data_lines = HASH_TABLE_TSV.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')).count();
        assert_eq!(rows.len(), data_lines);
        assert!(rows.len() > 300);
    }

    #[test]
    fn malformed_rows_do_not_panic() {
        let (rows, errors) = hashes::parse_hash_table("# c\n\nnot-a-row\nhttps://x/y\tzz\nhttps://x/y\t");
        assert!(rows.is_empty());
        assert_eq!(errors.len(), 3);
    }

    #[test]
    fn known_hash_1_32_0_kubelet_matches_conformance() {
        let v = Versions::for_kubernetes(&k("1.32.0"), &offline()).unwrap();
        let a = v.assets(Arch::Amd64, &["kubelet"]).unwrap();
        assert_eq!(
            a[0].compact_string(),
            "5ad4965598773d56a37a8e8429c3dc3d86b4c5c26d8417ab333ae345c053dae2@https://dl.k8s.io/release/v1.32.0/bin/linux/amd64/kubelet"
        );
    }

    #[test]
    fn minimal_1_32_nodeup_assets_match_conformance() {
        let v = Versions::for_kubernetes(&k("1.32.0"), &offline()).unwrap();
        let order = ["kubelet", "kubectl", "ecr-credential-provider", "cni-plugins", "containerd", "runc"];
        let amd: Vec<String> = v.assets(Arch::Amd64, &order).unwrap().iter().map(Asset::compact_string).collect();
        assert_eq!(amd, vec![
            "5ad4965598773d56a37a8e8429c3dc3d86b4c5c26d8417ab333ae345c053dae2@https://dl.k8s.io/release/v1.32.0/bin/linux/amd64/kubelet",
            "646d58f6d98ee670a71d9cdffbf6625aeea2849d567f214bc43a35f8ccb7bf70@https://dl.k8s.io/release/v1.32.0/bin/linux/amd64/kubectl",
            "7644623e4ec9ad443ab352a8a5800a5180ee28741288be805286ba72bb8e7164@https://artifacts.k8s.io/binaries/cloud-provider-aws/v1.31.7/linux/amd64/ecr-credential-provider-linux-amd64",
            "b8e811578fb66023f90d2e238d80cec3bdfca4b44049af74c374d4fae0f9c090@https://github.com/containernetworking/plugins/releases/download/v1.6.2/cni-plugins-linux-amd64-v1.6.2.tgz",
            "9d68969855fbf676cdb8ed758e420fb048d61f984f61de3e53eddfebe484d168@https://github.com/containerd/containerd/releases/download/v2.3.4/containerd-2.3.4-linux-amd64.tar.gz",
            "f6ae8efc0fa40079e1475e97cbe9d1bd3f106a28d6af78a11d9f1bd565515e60@https://github.com/opencontainers/runc/releases/download/v1.4.3/runc.amd64",
        ]);
        let arm = v.assets(Arch::Arm64, &order).unwrap();
        assert_eq!(arm[0].sha256, "bda9b2324c96693b38c41ecea051bab4c7c434be5683050b5e19025b50dbc0bf");
        assert_eq!(arm[5].url, "https://github.com/opencontainers/runc/releases/download/v1.4.3/runc.arm64");
    }

    #[test]
    fn every_conformance_asset_is_in_the_table() {
        let cases = std::env::var_os("KEELSON_CONFORMANCE_CASES")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/conformance/cases"));
        let dirs = std::fs::read_dir(&cases)
            .unwrap_or_else(|e| panic!("this test needs the shared conformance cases at {} (or $KEELSON_CONFORMANCE_CASES): {e}", cases.display()));
        let mut checked = 0;
        for d in dirs.flatten() {
            let Ok(files) = std::fs::read_dir(d.path()) else {
                continue;
            };
            for f in files.flatten() {
                let fname = f.file_name().to_string_lossy().to_string();
                if !(fname.starts_with("nodeup-") && fname.ends_with(".yaml")) {
                    continue;
                }
                let text = std::fs::read_to_string(f.path()).unwrap();
                for line in text.lines() {
                    let Some(entry) = line.trim().strip_prefix("- ") else {
                        continue;
                    };
                    let Some((h, url)) = entry.split_once('@') else {
                        continue;
                    };
                    if !is_sha256_hex(h) {
                        continue;
                    }
                    assert_eq!(known_sha256(url), Some(h), "{url} in {}", f.path().display());
                    checked += 1;
                }
            }
        }
        eprintln!("checked {checked} conformance asset hashes");
    }

    #[test]
    fn defaults_per_minor() {
        let o = offline();
        let v = Versions::for_kubernetes(&k("1.32.0"), &o).unwrap();
        assert_eq!((v.etcd_version(), v.cni_version()), ("3.5.31", "1.6.2"));
        assert_eq!((v.containerd_version(), v.runc_version()), ("2.3.4", "1.4.3"));
        assert_eq!(v.pause_image(), "registry.k8s.io/pause:3.10.1");
        assert_eq!(v.component_image("kube-apiserver"), "registry.k8s.io/kube-apiserver:v1.32.0");
        assert_eq!(v.cloud_controller_manager_image_aws(), "registry.k8s.io/provider-aws/cloud-controller-manager:v1.36.1");
        assert_eq!(v.coredns_image(), "registry.k8s.io/coredns/coredns:v1.14.2");
        let v = Versions::for_kubernetes(&k("1.34.0-alpha.1"), &o).unwrap();
        assert_eq!((v.etcd_version(), v.cni_version()), ("3.6.12", "1.7.1"));
        assert_eq!(v.component_image("kube-proxy"), "registry.k8s.io/kube-proxy:v1.34.0-alpha.1");
        let v = Versions::for_kubernetes(&k("1.35.0-alpha.1"), &o).unwrap();
        assert_eq!((v.etcd_version(), v.cni_version()), ("3.6.12", "1.8.0"));
        let v = Versions::for_kubernetes(&k("1.36.3"), &o).unwrap();
        assert_eq!((v.etcd_version(), v.cni_version()), ("3.6.12", "1.9.1"));
        assert_eq!(v.assets(Arch::Arm64, &["cni-plugins", "kubelet"]).unwrap().len(), 2);
        let v = Versions::for_kubernetes(&k("1.37.0"), &o).unwrap();
        assert_eq!(v.etcd_version(), "3.7.0");
        let v = Versions::for_kubernetes(&k("1.31.4"), &o).unwrap();
        assert!(!is_supported(v.kubernetes()));
        assert!(matches!(v.assets(Arch::Amd64, &["cni-plugins"]), Err(VersionsError::NoCniForKubernetes { .. })));
    }

    #[test]
    fn all_table_versions_resolve_offline() {
        let versions = known_kubernetes_versions();
        for minor in ["1.32.", "1.33.", "1.34.", "1.35.", "1.36."] {
            assert!(versions.iter().any(|v| v.starts_with(minor)), "{minor}");
        }
        assert!(versions.contains(&"1.34.0-alpha.1".to_string()));
        assert!(versions.contains(&"1.35.0-alpha.1".to_string()));
        let all = ["kubelet", "kubectl", "ecr-credential-provider", "auth-provider-gcp", "cni-plugins", "containerd", "runc", "crictl", "nerdctl"];
        for kv in versions {
            let v = Versions::for_kubernetes(&k(&kv), &offline()).unwrap();
            for arch in Arch::ALL {
                let assets = v.assets(arch, &all).unwrap();
                assert_eq!(assets.len(), all.len());
            }
        }
    }

    #[test]
    fn unknown_version_offline_errors_with_version_and_url() {
        let v = Versions::for_kubernetes(&k("1.99.7"), &offline()).unwrap();
        let err = v.assets(Arch::Amd64, &["kubelet"]).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, VersionsError::HashUnknownOffline { .. }));
        assert!(msg.contains("1.99.7"), "{msg}");
        assert!(msg.contains("kubelet"), "{msg}");
        assert!(msg.contains("https://dl.k8s.io/release/v1.99.7/bin/linux/amd64/kubelet"), "{msg}");
    }

    #[test]
    fn disk_cache_is_used_offline() {
        let dir = std::env::temp_dir().join(format!("keelson-versions-cache-{}", std::process::id()));
        let url = "https://dl.k8s.io/release/v1.98.1/bin/linux/arm64/kubectl";
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(fetch::cache_file(&dir, url), format!("{}  {url}\n", "ab".repeat(32))).unwrap();
        // A fetcher whose cache has the hash answers without the network.
        let o = LookupOptions { fetcher: Some(Fetcher::new(HttpFetcher { cache_dir: Some(dir.clone()) })), ..Default::default() };
        let v = Versions::for_kubernetes(&k("1.98.1"), &o).unwrap();
        let a = v.assets(Arch::Arm64, &["kubectl"]).unwrap();
        assert_eq!(a[0].sha256, "ab".repeat(32));
        let _ = std::fs::remove_dir_all(dir);
    }

    /// Answers every hash with `"cd" * 32` and remembers which URLs it was asked for.
    #[derive(Default)]
    struct Recording(std::sync::Mutex<Vec<String>>);

    impl HashFetcher for std::sync::Arc<Recording> {
        fn fetch_sha256(&self, _name: &str, _version: &str, url: &str) -> Result<String, VersionsError> {
            self.0.lock().unwrap().push(url.to_string());
            Ok("cd".repeat(32))
        }
    }

    #[test]
    fn unknown_hashes_come_from_the_canonical_url_never_from_the_mirror() {
        // A file:// repository that also serves a `.sha256` next to the file: whoever controls the
        // mirror controls that file too, so it is never read.
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("release/v1.97.0/bin/linux/amd64");
        std::fs::create_dir_all(&f).unwrap();
        std::fs::write(f.join("kubelet.sha256"), format!("{}  kubelet\n", "ee".repeat(32))).unwrap();
        let asked = std::sync::Arc::new(Recording::default());
        let o = LookupOptions {
            fetcher: Some(Fetcher::new(asked.clone())),
            file_repository: Some(format!("file://{}", dir.path().display())),
            ..Default::default()
        };
        let v = Versions::for_kubernetes(&k("1.97.0"), &o).unwrap();
        let a = v.assets(Arch::Amd64, &["kubelet"]).unwrap();
        assert_eq!(a[0].url, format!("file://{}/release/v1.97.0/bin/linux/amd64/kubelet", dir.path().display()));
        assert_eq!(*asked.0.lock().unwrap(), vec!["https://dl.k8s.io/release/v1.97.0/bin/linux/amd64/kubelet".to_string()]);
        assert_eq!(a[0].sha256, "cd".repeat(32));
        // Offline, the error names the canonical URL the hash would come from.
        let o = LookupOptions { file_repository: Some(format!("file://{}", dir.path().display())), ..offline() };
        let e = Versions::for_kubernetes(&k("1.97.0"), &o).unwrap().assets(Arch::Amd64, &["kubelet"]).unwrap_err().to_string();
        assert!(e.contains("https://dl.k8s.io/release/v1.97.0/bin/linux/amd64/kubelet.sha256") && !e.contains("file://"), "{e}");
    }

    #[test]
    fn file_repository_rewrite() {
        let o = LookupOptions { file_repository: Some("https://mirror.example.com/files/".into()), ..offline() };
        let v = Versions::for_kubernetes(&k("1.32.0"), &o).unwrap();
        let a = v.assets(Arch::Amd64, &["kubelet", "containerd"]).unwrap();
        assert_eq!(a[0].url, "https://mirror.example.com/files/release/v1.32.0/bin/linux/amd64/kubelet");
        assert_eq!(a[0].canonical_url, "https://dl.k8s.io/release/v1.32.0/bin/linux/amd64/kubelet");
        // the hash is still the well-known one for the canonical URL
        assert_eq!(a[0].sha256, "5ad4965598773d56a37a8e8429c3dc3d86b4c5c26d8417ab333ae345c053dae2");
        assert_eq!(a[1].url, "https://mirror.example.com/files/containerd/containerd/releases/download/v2.3.4/containerd-2.3.4-linux-amd64.tar.gz");
        assert_eq!(
            remap_file_url("https://dl.k8s.io/release/v1.32.0/bin/linux/amd64/kubectl", Some("https://m.example.com")).unwrap(),
            "https://m.example.com/release/v1.32.0/bin/linux/amd64/kubectl"
        );
        // same host: canonical kept
        assert_eq!(remap_file_url("https://dl.k8s.io/release/v1/x", Some("https://dl.k8s.io/other")).unwrap(), "https://dl.k8s.io/release/v1/x");
        assert_eq!(remap_file_url("https://a.b/c", None).unwrap(), "https://a.b/c");
        assert_eq!(remap_file_url("https://a.b/c,d", Some("s3://bucket/p")).unwrap(), "s3://bucket/p/c%2Cd");
    }

    #[test]
    fn container_registry_rewrite() {
        let o = LookupOptions { container_registry: Some("registry.example.com".into()), ..offline() };
        let v = Versions::for_kubernetes(&k("1.32.0"), &o).unwrap();
        assert_eq!(v.component_image("kube-apiserver"), "registry.example.com/kube-apiserver:v1.32.0");
        assert_eq!(v.pause_image(), "registry.example.com/pause:3.10.1");
        assert_eq!(v.cloud_controller_manager_image_aws(), "registry.example.com/provider-aws-cloud-controller-manager:v1.36.1");
        assert_eq!(v.coredns_image(), "registry.example.com/coredns-coredns:v1.14.2");
        // The name images.sh build-metrics-server gives the image keelson-local serves.
        assert_eq!(v.metrics_server_image(), "registry.example.com/metrics-server-metrics-server:v0.8.0");
        // The names images.sh build-flannel gives the images keelson-local serves.
        assert_eq!(v.flannel_image(), "registry.example.com/ghcr.io-flannel-io-flannel:v0.28.4");
        assert_eq!(v.flannel_cni_plugin_image(), "registry.example.com/ghcr.io-flannel-io-flannel-cni-plugin:v1.9.1-flannel1");
        assert_eq!(v.etcd_manager_image(), "registry.example.com/etcd-manager-etcd-manager-slim:v3.0.20260707");
        // idempotent
        assert_eq!(remap_image("registry.example.com/kube-apiserver:v1", Some("registry.example.com"), None), "registry.example.com/kube-apiserver:v1");
        assert_eq!(remap_image("docker.io/cilium/cilium:v1", Some("r.io/x"), None), "r.io/x/docker.io-cilium-cilium:v1");
    }

    #[test]
    fn container_proxy_rewrite() {
        assert_eq!(remap_image("registry.k8s.io/pause:3.10.1", None, Some("proxy.example.com/")), "proxy.example.com/pause:3.10.1");
        assert_eq!(remap_image("weaveworks/weave-kube:2", None, Some("proxy.example.com")), "proxy.example.com/weaveworks/weave-kube:2");
        assert_eq!(remap_image("nginx", None, Some("proxy.example.com")), "proxy.example.com/nginx");
        assert_eq!(remap_image("quay.io/cilium/cilium:v1", None, Some("proxy.example.com")), "proxy.example.com/cilium/cilium:v1");
    }

    #[test]
    fn asset_hashes_win_and_bad_lines_are_named() {
        let h = "a".repeat(64);
        let mirrored = LookupOptions { file_repository: Some("http://10.0.0.1:8080/".into()), ..offline() };
        let kubelet_url = Versions::for_kubernetes(&k("1.34.4"), &mirrored).unwrap().assets(Arch::Amd64, &["kubelet"]).unwrap()[0].url.clone();
        assert!(kubelet_url.starts_with("http://10.0.0.1:8080/"), "{kubelet_url}");
        let text = format!("# local mirror\n\n{kubelet_url}\t{}\n", h.to_uppercase());
        let map = parse_asset_hashes(&text).unwrap();
        let o = LookupOptions { asset_hashes: map, ..mirrored };
        let v = Versions::for_kubernetes(&k("1.34.4"), &o).unwrap();
        let a = v.assets(Arch::Amd64, &["kubelet", "kubectl"]).unwrap();
        assert_eq!(a[0].sha256, h, "the given hash wins over the table");
        assert_ne!(a[1].sha256, h, "other assets keep the table's hash");
        assert_eq!(parse_asset_hashes("http://x/y abc\n").unwrap_err().0, 1);
        let e = parse_asset_hashes(&format!("# c\nhttp://x/y {h} extra\n")).unwrap_err();
        assert_eq!(e.0, 2);
        assert!(parse_asset_hashes(&format!("ftp://x/y {h}\n")).unwrap_err().1.contains("http"));
        let missing = read_asset_hashes(Path::new("/nonexistent/hashes.tsv")).unwrap_err().to_string();
        assert!(missing.contains("/nonexistent/hashes.tsv"), "{missing}");
    }

    #[test]
    fn overrides() {
        let o = LookupOptions { containerd_version_override: Some("2.1.4".into()), runc_version_override: Some("1.3.0".into()), ..offline() };
        let v = Versions::for_kubernetes(&k("1.33.2"), &o).unwrap();
        let a = v.assets(Arch::Amd64, &["containerd", "runc"]).unwrap();
        assert!(a[0].url.ends_with("/v2.1.4/containerd-2.1.4-linux-amd64.tar.gz"));
        assert!(a[1].url.ends_with("/v1.3.0/runc.amd64"));
        // containerd without runc: kOps fails (runc config missing)
        let o2 = LookupOptions { containerd_version_override: Some("2.2.0".into()), ..offline() };
        assert!(matches!(Versions::for_kubernetes(&k("1.33.2"), &o2), Err(VersionsError::RuncVersionRequired { .. })));
        // runc alone is replaced by the defaults
        let o3 = LookupOptions { runc_version_override: Some("1.3.0".into()), ..offline() };
        assert_eq!(Versions::for_kubernetes(&k("1.33.2"), &o3).unwrap().runc_version(), "1.4.3");
        // legacy containerd rejected
        let o4 = LookupOptions { containerd_version_override: Some("1.7.22".into()), runc_version_override: Some("1.1.12".into()), ..offline() };
        let e = Versions::for_kubernetes(&k("1.33.2"), &o4).unwrap_err();
        assert!(e.to_string().contains("1.7.22"));
    }

    #[test]
    fn version_parsing() {
        // One version type (the spec's): pre-releases get their minor's defaults, as kOps' gates do.
        let r = k("1.34.0-alpha.1");
        assert_eq!(Versions::for_kubernetes(&r, &offline()).unwrap().kubernetes_version(), "1.34.0-alpha.1");
        assert_eq!(default_etcd_version(&r), LATEST_ETCD_36_VERSION);
        assert_eq!(default_cni_version(&r), Some("1.7.1"));
        assert!(!is_deprecated(&r) && is_deprecated(&k("1.33.9")) && !is_supported(&k("1.31.0")));
        assert!(etcd_version_is_supported("3.5.0") && etcd_version_is_supported("v3.6.12"));
        assert!(!etcd_version_is_supported("3.6.13") && !etcd_version_is_supported("3.4.13"));
        assert_eq!(Arch::ALL.map(Arch::as_str), ["amd64", "arm64"]);
        assert_eq!(mirror::path_clean("/a//b/../c/"), "/a/c");
        assert_eq!(mirror::path_join("", "/x/y"), "/x/y");
    }

    #[test]
    fn unknown_asset_name() {
        let v = Versions::for_kubernetes(&k("1.32.0"), &offline()).unwrap();
        let e = v.assets(Arch::Amd64, &["kube-banana"]).unwrap_err();
        assert!(e.to_string().contains("kube-banana"));
    }
}
