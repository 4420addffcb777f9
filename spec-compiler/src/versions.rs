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

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use sha2::{Digest, Sha256};

// ---------------------------------------------------------------------------------------------
// Constants (kOps defaults at the targeted commit)
// ---------------------------------------------------------------------------------------------

/// Default containerd version (kOps `ContainerdOptionsBuilder`).
pub const DEFAULT_CONTAINERD_VERSION: &str = "2.3.4";
/// Default runc version, set together with the default containerd version.
pub const DEFAULT_RUNC_VERSION: &str = "1.4.3";
/// Default sandbox (pause) image before registry rewriting.
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
pub const OLDEST_SUPPORTED_KUBERNETES_VERSION: &str = "1.32.0";
/// kOps warns (deprecated) for Kubernetes older than this.
pub const OLDEST_RECOMMENDED_KUBERNETES_VERSION: &str = "1.34.0";

/// Asset names understood by [`Versions::assets`].
pub const ASSET_NAMES: &[&str] =
    &["kubelet", "kubectl", "ecr-credential-provider", "auth-provider-gcp", "cni-plugins", "containerd", "runc", "crictl", "nerdctl"];

/// Timeout for fetching a published `.sha256` file.
pub const HASH_FETCH_TIMEOUT: Duration = Duration::from_secs(30);

/// The table of well-known hashes: `<canonical URL>\t<sha256>` lines, `#` comments.
const HASH_TABLE_TSV: &str = include_str!("versions/hashes.tsv");

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

#[derive(Debug, thiserror::Error)]
pub enum VersionsError {
    #[error("asset hashes file {path}{}: {reason}", if *line > 0 { format!(" line {line}") } else { String::new() })]
    AssetHashesFile { path: PathBuf, line: usize, reason: String },

    #[error("invalid Kubernetes version {version:?}: {reason}")]
    InvalidKubernetesVersion { version: String, reason: String },

    #[error("Kubernetes version {version:?} is a base URL; only semver Kubernetes versions are supported")]
    UnsupportedBaseUrl { version: String },

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
// Kubernetes release / semver helpers
// ---------------------------------------------------------------------------------------------

/// A Kubernetes version as kOps holds it after normalisation (spaces and one leading `v`
/// trimmed, otherwise verbatim), plus its tolerant-semver parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesRelease {
    /// E.g. `"1.34.0-alpha.1"`; no leading `v`. Used verbatim in image tags and URLs.
    pub version: String,
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
    /// Pre-release part (`alpha.1`), if any.
    pub pre: Option<String>,
}

impl KubernetesRelease {
    pub fn parse(version: &str) -> Result<KubernetesRelease, VersionsError> {
        let normalized = normalize_kubernetes_version(version);
        if normalized.contains("://") {
            return Err(VersionsError::UnsupportedBaseUrl { version: version.to_string() });
        }
        let sv = SemVer::parse_tolerant(&normalized).map_err(|reason| VersionsError::InvalidKubernetesVersion { version: version.to_string(), reason })?;
        Ok(KubernetesRelease { version: normalized, major: sv.major, minor: sv.minor, patch: sv.patch, pre: sv.pre })
    }

    /// `>=` ignoring pre-release and build (kOps `KubernetesVersion.IsGTE`).
    /// `other` is e.g. `"1.34"` or `"1.34.0"`; an unparsable `other` yields `false`.
    pub fn is_gte(&self, other: &str) -> bool {
        match SemVer::parse_tolerant(other) {
            Ok(o) => (self.major, self.minor, self.patch) >= (o.major, o.minor, o.patch),
            Err(_) => false,
        }
    }

    /// `<` ignoring pre-release and build (kOps `KubernetesVersion.IsLT`).
    pub fn is_lt(&self, other: &str) -> bool {
        !self.is_gte(other)
    }

    /// `"1.34"`.
    pub fn minor_version(&self) -> String {
        format!("{}.{}", self.major, self.minor)
    }

    /// Whether kOps would accept this version at all (>= 1.32.0).
    pub fn is_supported(&self) -> bool {
        self.is_gte(OLDEST_SUPPORTED_KUBERNETES_VERSION)
    }

    /// Whether kOps considers this version deprecated (< 1.34.0).
    pub fn is_deprecated(&self) -> bool {
        self.is_lt(OLDEST_RECOMMENDED_KUBERNETES_VERSION)
    }
}

impl fmt::Display for KubernetesRelease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.version)
    }
}

/// kOps `apply_cluster.go` normalisation: trim spaces, drop one leading `v`.
pub fn normalize_kubernetes_version(version: &str) -> String {
    let v = version.trim();
    v.strip_prefix('v').unwrap_or(v).to_string()
}

/// Minimal tolerant semver (like blang/semver `ParseTolerant`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct SemVer {
    major: u64,
    minor: u64,
    patch: u64,
    pre: Option<String>,
}

impl SemVer {
    fn parse_tolerant(s: &str) -> Result<SemVer, String> {
        let s = s.trim();
        let s = s.strip_prefix('v').unwrap_or(s);
        if s.is_empty() {
            return Err("empty version".to_string());
        }
        let (s, _build) = match s.split_once('+') {
            Some((a, b)) => (a, Some(b)),
            None => (s, None),
        };
        let (core, pre) = match s.split_once('-') {
            Some((a, b)) => (a, Some(b)),
            None => (s, None),
        };
        if let Some(p) = pre {
            if p.is_empty() {
                return Err("empty pre-release".to_string());
            }
        }
        let parts: Vec<&str> = core.split('.').collect();
        if parts.is_empty() || parts.len() > 3 {
            return Err(format!("expected MAJOR[.MINOR[.PATCH]], got {core:?}"));
        }
        let mut nums = [0u64; 3];
        for (i, p) in parts.iter().enumerate() {
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("invalid numeric component {p:?}"));
            }
            nums[i] = p.parse::<u64>().map_err(|e| format!("invalid number {p:?}: {e}"))?;
        }
        Ok(SemVer { major: nums[0], minor: nums[1], patch: nums[2], pre: pre.map(str::to_string) })
    }

    fn core_lt(&self, major: u64, minor: u64, patch: u64) -> bool {
        (self.major, self.minor, self.patch) < (major, minor, patch)
    }
}

/// Default etcd version for a control-plane Kubernetes version (kOps `EtcdOptionsBuilder`).
pub fn default_etcd_version(release: &KubernetesRelease) -> &'static str {
    if release.is_lt("1.34.0") {
        LATEST_ETCD_35_VERSION
    } else if release.is_lt("1.37.0") {
        LATEST_ETCD_36_VERSION
    } else {
        LATEST_ETCD_37_VERSION
    }
}

/// Whether etcd-manager bundles `version` (every patch up to the latest of 3.5/3.6/3.7).
pub fn etcd_version_is_supported(version: &str) -> bool {
    let v = version.trim();
    let v = v.strip_prefix('v').unwrap_or(v);
    let Ok(sv) = SemVer::parse_strict(v) else {
        return false;
    };
    [LATEST_ETCD_35_VERSION, LATEST_ETCD_36_VERSION, LATEST_ETCD_37_VERSION]
        .iter()
        .any(|latest| SemVer::parse_strict(latest).is_ok_and(|l| l.major == sv.major && l.minor == sv.minor && sv.patch <= l.patch && sv.pre.is_none()))
}

impl SemVer {
    fn parse_strict(s: &str) -> Result<SemVer, String> {
        if s.split(['-', '+']).next().map(|c| c.split('.').count()) != Some(3) {
            return Err(format!("{s:?} is not MAJOR.MINOR.PATCH"));
        }
        SemVer::parse_tolerant(s)
    }
}

/// The etcd image bundled for a (supported) etcd version, before registry rewriting.
pub fn etcd_image(etcd_version: &str) -> String {
    let v = etcd_version.trim();
    format!("registry.k8s.io/etcd:v{}", v.strip_prefix('v').unwrap_or(v))
}

/// Default CNI plugins version for a Kubernetes version (kOps `FindCNIAssets`);
/// `None` below 1.32, where kOps has no default.
pub fn default_cni_version(release: &KubernetesRelease) -> Option<&'static str> {
    if release.is_gte("1.36") {
        Some("1.9.1")
    } else if release.is_gte("1.35") {
        Some("1.8.0")
    } else if release.is_gte("1.34") {
        Some("1.7.1")
    } else if release.is_gte("1.32") {
        Some("1.6.2")
    } else {
        None
    }
}

// ---------------------------------------------------------------------------------------------
// URL / image rewriting (assets.fileRepository, assets.containerRegistry, assets.containerProxy)
// ---------------------------------------------------------------------------------------------

/// Rewrite an asset URL for `assets.fileRepository` (kOps `AssetBuilder.RemapFile`):
/// the repository URL keeps its scheme/host/query and its path becomes
/// `path.Join(repo.path, canonical.path)`; commas are escaped as `%2C`. When the rewritten
/// URL has the same host as the canonical one the canonical URL is kept (kOps behaviour).
pub fn remap_file_url(canonical_url: &str, file_repository: Option<&str>) -> Result<String, VersionsError> {
    let Some(repo) = file_repository else {
        return Ok(canonical_url.to_string());
    };
    if repo.is_empty() {
        return Err(VersionsError::InvalidFileRepository {
            file_repository: repo.to_string(),
            url: canonical_url.to_string(),
            reason: "assets.fileRepository must be set to remap assets".to_string(),
        });
    }
    let canonical = SimpleUrl::parse(canonical_url);
    let repo_url = SimpleUrl::parse(repo);
    if repo_url.host.contains(' ') || repo_url.scheme.as_deref().is_some_and(|s| s.is_empty()) {
        return Err(VersionsError::InvalidFileRepository {
            file_repository: repo.to_string(),
            url: canonical_url.to_string(),
            reason: "not a valid URL".to_string(),
        });
    }
    let joined = path_join(&repo_url.path, &canonical.path).replace(',', "%2C");
    let remapped = SimpleUrl { path: joined, ..repo_url };
    if remapped.host == canonical.host {
        return Ok(canonical_url.to_string());
    }
    Ok(remapped.to_string())
}

/// Rewrite an image for `assets.containerProxy` then `assets.containerRegistry`
/// (kOps `NormalizeImage`):
/// * proxy: a Docker-Hub style name (`foo` or `org/foo` without a registry host) gets
///   `<proxy>/` prepended; otherwise the registry host is replaced by the proxy.
/// * registry: strip `registry.k8s.io/`, replace remaining `/` with `-`, prepend `<registry>/`
///   (unless already prefixed by it). E.g. `registry.k8s.io/provider-aws/cloud-controller-manager:v1`
///   → `<registry>/provider-aws-cloud-controller-manager:v1`.
pub fn remap_image(image: &str, container_registry: Option<&str>, container_proxy: Option<&str>) -> String {
    let mut image = image.to_string();
    if let Some(proxy) = container_proxy {
        let proxy = proxy.strip_suffix('/').unwrap_or(proxy);
        let first = image.split('/').next().unwrap_or("");
        if image.matches('/').count() <= 1 && !first.contains(['.', ':']) {
            image = format!("{proxy}/{image}");
        } else {
            let rest = image.find('/').map(|i| &image[i..]).unwrap_or("");
            image = format!("{proxy}{rest}");
        }
    }
    if let Some(registry) = container_registry {
        let normalized = image.strip_prefix("registry.k8s.io/").unwrap_or(&image);
        if !normalized.starts_with(&format!("{registry}/")) {
            image = format!("{registry}/{}", normalized.replace('/', "-"));
        } else {
            image = normalized.to_string();
        }
    }
    image
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct SimpleUrl {
    /// `None` for scheme-less (relative) references.
    scheme: Option<String>,
    host: String,
    path: String,
    /// Including the leading `?`/`#`, or empty.
    suffix: String,
}

impl SimpleUrl {
    fn parse(s: &str) -> SimpleUrl {
        let (before_suffix, suffix) = match s.find(['?', '#']) {
            Some(i) => (&s[..i], s[i..].to_string()),
            None => (s, String::new()),
        };
        match before_suffix.split_once("://") {
            Some((scheme, rest)) => {
                let (host, path) = match rest.find('/') {
                    Some(i) => (&rest[..i], &rest[i..]),
                    None => (rest, ""),
                };
                SimpleUrl { scheme: Some(scheme.to_string()), host: host.to_string(), path: path.to_string(), suffix }
            }
            None => SimpleUrl { scheme: None, host: String::new(), path: before_suffix.to_string(), suffix },
        }
    }
}

impl fmt::Display for SimpleUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(scheme) = &self.scheme {
            write!(f, "{scheme}://{}", self.host)?;
        }
        write!(f, "{}{}", self.path, self.suffix)
    }
}

/// Go `path.Join(a, b)`: join non-empty elements with `/` and `path.Clean` the result.
fn path_join(a: &str, b: &str) -> String {
    let parts: Vec<&str> = [a, b].into_iter().filter(|p| !p.is_empty()).collect();
    if parts.is_empty() {
        return String::new();
    }
    path_clean(&parts.join("/"))
}

/// Go `path.Clean`.
fn path_clean(p: &str) -> String {
    if p.is_empty() {
        return ".".to_string();
    }
    let rooted = p.starts_with('/');
    let mut out: Vec<&str> = Vec::new();
    for seg in p.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                if out.last().is_some_and(|l| *l != "..") {
                    out.pop();
                } else if !rooted {
                    out.push("..");
                }
            }
            s => out.push(s),
        }
    }
    let joined = out.join("/");
    match (rooted, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".to_string(),
        (false, false) => joined,
    }
}

// ---------------------------------------------------------------------------------------------
// Hash table
// ---------------------------------------------------------------------------------------------

/// One row of the well-known hash table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashRow {
    pub url: &'static str,
    pub sha256: &'static str,
}

/// One line of a hash file (the built-in table or an `--asset-hashes` file): `<url><whitespace><sha256>`.
/// `Ok(None)` for blank lines and `#` comments.
fn parse_hash_line(line: &str) -> Result<Option<(&str, &str)>, String> {
    let trimmed = line.trim();
    if trimmed.is_empty() || trimmed.starts_with('#') {
        return Ok(None);
    }
    let mut fields = trimmed.split_whitespace();
    let (Some(url), Some(sha), None) = (fields.next(), fields.next(), fields.next()) else {
        return Err(format!("expected `<url> <sha256>`: {trimmed:?}"));
    };
    if !(url.starts_with("https://") || url.starts_with("http://")) {
        return Err(format!("not an http(s) URL: {url:?}"));
    }
    if !is_sha256_hex(&sha.to_ascii_lowercase()) {
        return Err(format!("invalid sha256 {sha:?} for {url}"));
    }
    Ok(Some((url, sha)))
}

/// Parse the TSV table. Never panics: malformed lines are returned as errors (`line: message`).
fn parse_hash_table(text: &'static str) -> (Vec<HashRow>, Vec<String>) {
    let mut rows = Vec::new();
    let mut errors = Vec::new();
    for (i, line) in text.lines().enumerate() {
        match parse_hash_line(line) {
            Ok(Some((url, sha256))) if is_sha256_hex(sha256) => rows.push(HashRow { url, sha256 }),
            Ok(Some((url, sha256))) => errors.push(format!("line {}: sha256 {sha256:?} for {url} is not lower-case", i + 1)),
            Ok(None) => {}
            Err(e) => errors.push(format!("line {}: {e}", i + 1)),
        }
    }
    (rows, errors)
}

struct HashTable {
    rows: Vec<HashRow>,
    by_url: HashMap<&'static str, &'static str>,
    errors: Vec<String>,
}

fn hash_table() -> &'static HashTable {
    static TABLE: OnceLock<HashTable> = OnceLock::new();
    TABLE.get_or_init(|| {
        let (rows, mut errors) = parse_hash_table(HASH_TABLE_TSV);
        let mut by_url = HashMap::with_capacity(rows.len());
        for r in &rows {
            if let Some(prev) = by_url.insert(r.url, r.sha256) {
                if prev != r.sha256 {
                    errors.push(format!("conflicting hashes for {}", r.url));
                }
            }
        }
        for e in &errors {
            tracing::warn!("versions table: {e}");
        }
        HashTable { rows, by_url, errors }
    })
}

/// All rows of the built-in table.
pub fn hash_table_rows() -> &'static [HashRow] {
    &hash_table().rows
}

/// Problems found while parsing the built-in table (empty when the table is well-formed).
pub fn hash_table_errors() -> &'static [String] {
    &hash_table().errors
}

/// The well-known sha256 for a canonical asset URL, if in the table.
pub fn known_sha256(canonical_url: &str) -> Option<&'static str> {
    hash_table().by_url.get(canonical_url).copied()
}

/// Kubernetes versions whose kubelet/kubectl hashes (amd64 and arm64) are all in the table,
/// sorted by semver core then string.
pub fn known_kubernetes_versions() -> Vec<String> {
    let mut versions: Vec<String> = hash_table()
        .rows
        .iter()
        .filter_map(|r| {
            let rest = r.url.strip_prefix("https://dl.k8s.io/release/v")?;
            let (ver, file) = rest.split_once('/')?;
            (file == "bin/linux/amd64/kubelet").then(|| ver.to_string())
        })
        .filter(|v| Arch::ALL.iter().all(|a| ["kubelet", "kubectl"].iter().all(|b| known_sha256(&kubernetes_binary_url(v, *a, b)).is_some())))
        .collect();
    versions.sort_by_key(|v| {
        let sv = SemVer::parse_tolerant(v).ok();
        (sv.as_ref().map(|s| (s.major, s.minor, s.patch)), sv.and_then(|s| s.pre).is_none(), v.clone())
    });
    versions.dedup();
    versions
}

fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn kubernetes_binary_url(version: &str, arch: Arch, binary: &str) -> String {
    format!("https://dl.k8s.io/release/v{version}/bin/linux/{}/{binary}", arch.as_str())
}

// ---------------------------------------------------------------------------------------------
// Lookup options, assets
// ---------------------------------------------------------------------------------------------

/// How to resolve versions and hashes. Construct with `..Default::default()` so new fields
/// do not break callers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LookupOptions {
    /// Never touch the network; unknown hashes are an error.
    pub offline: bool,
    /// Where fetched hashes are cached; default `$XDG_CACHE_HOME/keelson/sha256`
    /// (or `$HOME/.cache/keelson/sha256`).
    pub cache_dir: Option<PathBuf>,
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
    release: KubernetesRelease,
    etcd_version: &'static str,
    containerd_version: String,
    runc_version: String,
    cni_version: Option<&'static str>,
    opts: LookupOptions,
}

impl Versions {
    /// Resolve defaults for `version` (`"1.34.0"`, `"v1.32.0"`, `"1.34.0-alpha.1"`).
    ///
    /// containerd/runc follow kOps `ContainerdOptionsBuilder`: when no containerd version is
    /// set, both containerd and runc get the defaults (a runc override alone is then ignored,
    /// as kOps replaces the whole runc block); when containerd is set, runc must be set too.
    /// Versions older than 1.32 are resolved (see [`KubernetesRelease::is_supported`]) but
    /// have no default CNI plugins asset.
    pub fn for_kubernetes(version: &str, opts: &LookupOptions) -> Result<Versions, VersionsError> {
        let release = KubernetesRelease::parse(version)?;
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
            etcd_version: default_etcd_version(&release),
            cni_version: default_cni_version(&release),
            release,
            containerd_version,
            runc_version,
            opts: opts.clone(),
        })
    }

    pub fn release(&self) -> &KubernetesRelease {
        &self.release
    }

    /// Normalised Kubernetes version (no leading `v`).
    pub fn kubernetes_version(&self) -> &str {
        &self.release.version
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
        self.remap_image(&etcd_image(self.etcd_version))
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
        self.remap_image(&format!("registry.k8s.io/{component}:v{}", self.release.version))
    }

    pub fn cloud_controller_manager_image_aws(&self) -> String {
        self.remap_image(AWS_CLOUD_CONTROLLER_MANAGER_IMAGE)
    }

    /// The CoreDNS image after registry rewriting (`spec.kubeDNS.coreDNSImage` wins over it).
    pub fn coredns_image(&self) -> String {
        self.remap_image(COREDNS_IMAGE)
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

    /// Apply `containerProxy` / `containerRegistry` to any image.
    pub fn remap_image(&self, image: &str) -> String {
        remap_image(image, self.opts.container_registry.as_deref(), self.opts.container_proxy.as_deref())
    }

    /// Apply `fileRepository` to any canonical URL.
    pub fn remap_file_url(&self, canonical_url: &str) -> Result<String, VersionsError> {
        remap_file_url(canonical_url, self.opts.file_repository.as_deref())
    }

    /// Canonical (upstream) URL and component version of a named asset.
    pub fn canonical_asset_url(&self, arch: Arch, name: &str) -> Result<(String, String), VersionsError> {
        let a = arch.as_str();
        let k8s = &self.release.version;
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
    /// (then `.sha256sum`) over HTTPS unless offline.
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

/// `version` must be at least `min` (a pre-release of `min` counts as older, as in blang semver).
fn at_least(version: &str, min: (u64, u64, u64)) -> Result<bool, String> {
    let sv = SemVer::parse_tolerant(version).map_err(|reason| format!("unable to parse: {reason}"))?;
    let (a, b, c) = min;
    Ok(!(sv.core_lt(a, b, c) || ((sv.major, sv.minor, sv.patch) == min && sv.pre.is_some())))
}

fn check_containerd_version(version: &str) -> Result<(), VersionsError> {
    let err = |reason: String| VersionsError::UnsupportedContainerdVersion { version: version.to_string(), reason };
    match at_least(version, (2, 1, 0)) {
        Ok(true) => Ok(()),
        Ok(false) => Err(err("unsupported legacy containerd version (kOps requires >= 2.1.0)".to_string())),
        Err(reason) => Err(err(reason)),
    }
}

fn check_runc_version(version: &str) -> Result<(), VersionsError> {
    let err = |reason: String| VersionsError::UnsupportedRuncVersion { version: version.to_string(), reason };
    match at_least(version, (1, 1, 0)) {
        Ok(true) => Ok(()),
        Ok(false) => Err(err("kOps requires runc >= 1.1.0".to_string())),
        Err(reason) => Err(err(reason)),
    }
}

// ---------------------------------------------------------------------------------------------
// Hash lookup: table → memory → disk cache → network
// ---------------------------------------------------------------------------------------------

fn memory_cache() -> &'static Mutex<HashMap<String, String>> {
    static CACHE: OnceLock<Mutex<HashMap<String, String>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Default on-disk cache directory for fetched hashes (`$XDG_CACHE_HOME/keelson/sha256`, else
/// `$HOME/.cache/keelson/sha256`), for the `keelson` binary to pass as [`LookupOptions::cache_dir`].
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(x).join("keelson").join("sha256"));
    }
    std::env::var_os("HOME").filter(|v| !v.is_empty()).map(|h| PathBuf::from(h).join(".cache").join("keelson").join("sha256"))
}

fn cache_file(dir: &Path, download_url: &str) -> PathBuf {
    let key = hex::encode(Sha256::digest(download_url.as_bytes()));
    dir.join(format!("{key}.sha256"))
}

/// Read an asset-hashes file: `<url><whitespace><sha256>` lines (the format of
/// `versions/hashes.tsv`), `#` comments and blank lines ignored. Every other line is an error that
/// names the file and line.
pub fn read_asset_hashes(path: &Path) -> Result<std::collections::BTreeMap<String, String>, VersionsError> {
    let text = std::fs::read_to_string(path).map_err(|e| VersionsError::AssetHashesFile { path: path.to_path_buf(), line: 0, reason: e.to_string() })?;
    parse_asset_hashes(&text).map_err(|(line, reason)| VersionsError::AssetHashesFile { path: path.to_path_buf(), line, reason })
}

/// Parse the text of an asset-hashes file; `Err((line number, what is wrong))`.
pub fn parse_asset_hashes(text: &str) -> Result<std::collections::BTreeMap<String, String>, (usize, String)> {
    let mut out = std::collections::BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        if let Some((url, sha)) = parse_hash_line(line).map_err(|e| (i + 1, e))? {
            out.insert(url.to_string(), sha.to_ascii_lowercase());
        }
    }
    Ok(out)
}

/// The hash given for an asset in [`LookupOptions::asset_hashes`], by canonical or download URL.
pub fn hash_override(canonical_url: &str, download_url: &str, opts: &LookupOptions) -> Option<String> {
    opts.asset_hashes.get(download_url).or_else(|| opts.asset_hashes.get(canonical_url)).cloned()
}

/// Find the sha256 of an asset, kOps-style: [`hash_override`], then the well-known table keyed by
/// canonical URL, otherwise the published `<download url>.sha256` / `.sha256sum` (first whitespace field).
pub fn lookup_sha256(name: &str, version: &str, canonical_url: &str, download_url: &str, opts: &LookupOptions) -> Result<String, VersionsError> {
    if let Some(h) = hash_override(canonical_url, download_url, opts) {
        return Ok(h);
    }
    if let Some(h) = known_sha256(canonical_url) {
        return Ok(h.to_string());
    }
    if let Ok(mem) = memory_cache().lock() {
        if let Some(h) = mem.get(download_url) {
            return Ok(h.clone());
        }
    }
    // No default here: the binary chooses the cache (`default_cache_dir`), the library reads no environment.
    let cache_dir = opts.cache_dir.clone();
    if let Some(dir) = &cache_dir {
        if let Ok(text) = std::fs::read_to_string(cache_file(dir, download_url)) {
            let h = text.split_whitespace().next().unwrap_or("").to_ascii_lowercase();
            if is_sha256_hex(&h) {
                remember(download_url, &h);
                return Ok(h);
            }
            tracing::warn!("ignoring corrupt sha256 cache entry for {download_url}");
        }
    }
    if opts.offline {
        return Err(VersionsError::HashUnknownOffline { file: name.to_string(), version: version.to_string(), url: download_url.to_string() });
    }

    let h = fetch_sha256(name, version, download_url)?;
    remember(download_url, &h);
    if let Some(dir) = &cache_dir {
        if let Err(e) = write_cache(dir, download_url, &h) {
            tracing::warn!("cannot write sha256 cache in {}: {e}", dir.display());
        }
    }
    Ok(h)
}

fn remember(download_url: &str, h: &str) {
    if let Ok(mut mem) = memory_cache().lock() {
        mem.insert(download_url.to_string(), h.to_string());
    }
}

fn write_cache(dir: &Path, download_url: &str, h: &str) -> Result<(), base::fs::FsError> {
    base::fs::write_atomic(&cache_file(dir, download_url), format!("{h}  {download_url}\n").as_bytes(), 0o644, None)
}

fn fetch_sha256(name: &str, version: &str, download_url: &str) -> Result<String, VersionsError> {
    let fetch_err = |reason: String| VersionsError::HashFetch { file: name.to_string(), version: version.to_string(), url: download_url.to_string(), reason };
    let mut failures = Vec::new();
    let client = if download_url.starts_with("https://") || download_url.starts_with("http://") {
        Some(
            reqwest::blocking::Client::builder()
                .timeout(HASH_FETCH_TIMEOUT)
                .connect_timeout(Duration::from_secs(10))
                .user_agent(concat!("keelson/", env!("CARGO_PKG_VERSION")))
                .build()
                .map_err(|e| fetch_err(format!("building HTTP client: {e}")))?,
        )
    } else {
        None
    };
    for ext in [".sha256", ".sha256sum"] {
        let hash_url = format!("{download_url}{ext}");
        let body = if let Some(local) = hash_url.strip_prefix("file://") {
            std::fs::read_to_string(local).map_err(|e| e.to_string())
        } else if let Some(client) = &client {
            fetch_text(client, &hash_url)
        } else {
            Err("only http(s):// and file:// URLs can be fetched".to_string())
        };
        match body {
            Ok(text) => {
                let Some(first) = text.split_whitespace().next() else {
                    failures.push(format!("{hash_url}: empty hash file"));
                    continue;
                };
                let h = first.to_ascii_lowercase();
                if !is_sha256_hex(&h) {
                    return Err(VersionsError::InvalidHash {
                        file: name.to_string(),
                        version: version.to_string(),
                        url: download_url.to_string(),
                        value: first.chars().take(80).collect(),
                        source_desc: hash_url,
                    });
                }
                tracing::debug!("fetched sha256 {h} for {download_url} from {hash_url}");
                return Ok(h);
            }
            Err(e) => failures.push(format!("{hash_url}: {e}")),
        }
    }
    Err(fetch_err(failures.join("; ")))
}

fn fetch_text(client: &reqwest::blocking::Client, url: &str) -> Result<String, String> {
    let mut last = String::new();
    for attempt in 0..2u32 {
        if attempt > 0 {
            std::thread::sleep(Duration::from_millis(500));
        }
        match client.get(url).send() {
            Ok(resp) if resp.status().is_success() => {
                return resp.text().map_err(|e| format!("reading body: {e}"));
            }
            Ok(resp) if resp.status().is_client_error() => {
                return Err(format!("HTTP {}", resp.status()));
            }
            Ok(resp) => last = format!("HTTP {}", resp.status()),
            Err(e) => last = e.to_string(),
        }
    }
    Err(last)
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn offline() -> LookupOptions {
        LookupOptions {
            offline: true,
            cache_dir: Some(std::env::temp_dir().join(format!("keelson-versions-test-{}", std::process::id()))),
            ..Default::default()
        }
    }

    #[test]
    fn table_rows_all_parse() {
        let (rows, errors) = parse_hash_table(HASH_TABLE_TSV);
        assert!(errors.is_empty(), "{errors:?}");
        assert!(hash_table_errors().is_empty(), "{:?}", hash_table_errors());
        let data_lines = HASH_TABLE_TSV.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')).count();
        assert_eq!(rows.len(), data_lines);
        assert!(rows.len() > 300);
    }

    #[test]
    fn malformed_rows_do_not_panic() {
        let (rows, errors) = parse_hash_table("# c\n\nnot-a-row\nhttps://x/y\tzz\nhttps://x/y\t");
        assert!(rows.is_empty());
        assert_eq!(errors.len(), 3);
    }

    #[test]
    fn known_hash_1_32_0_kubelet_matches_conformance() {
        let v = Versions::for_kubernetes("v1.32.0", &offline()).unwrap();
        let a = v.assets(Arch::Amd64, &["kubelet"]).unwrap();
        assert_eq!(
            a[0].compact_string(),
            "5ad4965598773d56a37a8e8429c3dc3d86b4c5c26d8417ab333ae345c053dae2@https://dl.k8s.io/release/v1.32.0/bin/linux/amd64/kubelet"
        );
    }

    #[test]
    fn minimal_1_32_nodeup_assets_match_conformance() {
        let v = Versions::for_kubernetes("1.32.0", &offline()).unwrap();
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
        let v = Versions::for_kubernetes("1.32.0", &o).unwrap();
        assert_eq!((v.etcd_version(), v.cni_version()), ("3.5.31", "1.6.2"));
        assert_eq!((v.containerd_version(), v.runc_version()), ("2.3.4", "1.4.3"));
        assert_eq!(v.pause_image(), "registry.k8s.io/pause:3.10.1");
        assert_eq!(v.component_image("kube-apiserver"), "registry.k8s.io/kube-apiserver:v1.32.0");
        assert_eq!(v.cloud_controller_manager_image_aws(), "registry.k8s.io/provider-aws/cloud-controller-manager:v1.36.1");
        assert_eq!(v.coredns_image(), "registry.k8s.io/coredns/coredns:v1.14.2");
        let v = Versions::for_kubernetes("1.34.0-alpha.1", &o).unwrap();
        assert_eq!((v.etcd_version(), v.cni_version()), ("3.6.12", "1.7.1"));
        assert_eq!(v.component_image("kube-proxy"), "registry.k8s.io/kube-proxy:v1.34.0-alpha.1");
        let v = Versions::for_kubernetes("1.35.0-alpha.1", &o).unwrap();
        assert_eq!((v.etcd_version(), v.cni_version()), ("3.6.12", "1.8.0"));
        let v = Versions::for_kubernetes("1.36.3", &o).unwrap();
        assert_eq!((v.etcd_version(), v.cni_version()), ("3.6.12", "1.9.1"));
        assert_eq!(v.assets(Arch::Arm64, &["cni-plugins", "kubelet"]).unwrap().len(), 2);
        let v = Versions::for_kubernetes("1.37.0", &o).unwrap();
        assert_eq!(v.etcd_version(), "3.7.0");
        let v = Versions::for_kubernetes("1.31.4", &o).unwrap();
        assert!(!v.release().is_supported());
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
        for k in versions {
            let v = Versions::for_kubernetes(&k, &offline()).unwrap();
            for arch in Arch::ALL {
                let assets = v.assets(arch, &all).unwrap();
                assert_eq!(assets.len(), all.len());
            }
        }
    }

    #[test]
    fn unknown_version_offline_errors_with_version_and_url() {
        let v = Versions::for_kubernetes("1.99.7", &offline()).unwrap();
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
        write_cache(&dir, url, &"ab".repeat(32)).unwrap();
        let o = LookupOptions { offline: true, cache_dir: Some(dir.clone()), ..Default::default() };
        let v = Versions::for_kubernetes("1.98.1", &o).unwrap();
        let a = v.assets(Arch::Arm64, &["kubectl"]).unwrap();
        assert_eq!(a[0].sha256, "ab".repeat(32));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn file_url_fetch_and_mirror_hash() {
        // A file:// repository: hashes of unknown files are read next to the mirrored file.
        let dir = std::env::temp_dir().join(format!("keelson-versions-mirror-{}", std::process::id()));
        let f = dir.join("release/v1.97.0/bin/linux/amd64");
        std::fs::create_dir_all(&f).unwrap();
        std::fs::write(f.join("kubelet.sha256"), format!("{}  kubelet\n", "CD".repeat(32))).unwrap();
        let o = LookupOptions {
            offline: false,
            cache_dir: Some(dir.join("cache")),
            file_repository: Some(format!("file://{}", dir.display())),
            ..Default::default()
        };
        let v = Versions::for_kubernetes("1.97.0", &o).unwrap();
        let a = v.assets(Arch::Amd64, &["kubelet"]).unwrap();
        assert_eq!(a[0].sha256, "cd".repeat(32));
        assert_eq!(a[0].url, format!("file://{}/release/v1.97.0/bin/linux/amd64/kubelet", dir.display()));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn file_repository_rewrite() {
        let o = LookupOptions { file_repository: Some("https://mirror.example.com/files/".into()), ..offline() };
        let v = Versions::for_kubernetes("1.32.0", &o).unwrap();
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
        let v = Versions::for_kubernetes("1.32.0", &o).unwrap();
        assert_eq!(v.component_image("kube-apiserver"), "registry.example.com/kube-apiserver:v1.32.0");
        assert_eq!(v.pause_image(), "registry.example.com/pause:3.10.1");
        assert_eq!(v.cloud_controller_manager_image_aws(), "registry.example.com/provider-aws-cloud-controller-manager:v1.36.1");
        assert_eq!(v.coredns_image(), "registry.example.com/coredns-coredns:v1.14.2");
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
        let kubelet_url = Versions::for_kubernetes("1.34.4", &mirrored).unwrap().assets(Arch::Amd64, &["kubelet"]).unwrap()[0].url.clone();
        assert!(kubelet_url.starts_with("http://10.0.0.1:8080/"), "{kubelet_url}");
        let text = format!("# local mirror\n\n{kubelet_url}\t{}\n", h.to_uppercase());
        let map = parse_asset_hashes(&text).unwrap();
        let o = LookupOptions { asset_hashes: map, ..mirrored };
        let v = Versions::for_kubernetes("1.34.4", &o).unwrap();
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
        let v = Versions::for_kubernetes("1.33.2", &o).unwrap();
        let a = v.assets(Arch::Amd64, &["containerd", "runc"]).unwrap();
        assert!(a[0].url.ends_with("/v2.1.4/containerd-2.1.4-linux-amd64.tar.gz"));
        assert!(a[1].url.ends_with("/v1.3.0/runc.amd64"));
        // containerd without runc: kOps fails (runc config missing)
        let o2 = LookupOptions { containerd_version_override: Some("2.2.0".into()), ..offline() };
        assert!(matches!(Versions::for_kubernetes("1.33.2", &o2), Err(VersionsError::RuncVersionRequired { .. })));
        // runc alone is replaced by the defaults
        let o3 = LookupOptions { runc_version_override: Some("1.3.0".into()), ..offline() };
        assert_eq!(Versions::for_kubernetes("1.33.2", &o3).unwrap().runc_version(), "1.4.3");
        // legacy containerd rejected
        let o4 = LookupOptions { containerd_version_override: Some("1.7.22".into()), runc_version_override: Some("1.1.12".into()), ..offline() };
        let e = Versions::for_kubernetes("1.33.2", &o4).unwrap_err();
        assert!(e.to_string().contains("1.7.22"));
    }

    #[test]
    fn version_parsing() {
        let r = KubernetesRelease::parse(" v1.34.0-alpha.1 ").unwrap();
        assert_eq!((r.version.as_str(), r.major, r.minor, r.patch), ("1.34.0-alpha.1", 1, 34, 0));
        assert_eq!(r.pre.as_deref(), Some("alpha.1"));
        assert!(r.is_gte("1.34") && r.is_lt("1.35"));
        assert!(KubernetesRelease::parse("banana").is_err());
        assert!(KubernetesRelease::parse("").is_err());
        assert!(matches!(KubernetesRelease::parse("https://example.com/k8s/v1.32.0"), Err(VersionsError::UnsupportedBaseUrl { .. })));
        assert!(etcd_version_is_supported("3.5.0") && etcd_version_is_supported("v3.6.12"));
        assert!(!etcd_version_is_supported("3.6.13") && !etcd_version_is_supported("3.4.13"));
        assert_eq!(Arch::ALL.map(Arch::as_str), ["amd64", "arm64"]);
        assert_eq!(path_clean("/a//b/../c/"), "/a/c");
        assert_eq!(path_join("", "/x/y"), "/x/y");
    }

    #[test]
    fn unknown_asset_name() {
        let v = Versions::for_kubernetes("1.32.0", &offline()).unwrap();
        let e = v.assets(Arch::Amd64, &["kube-banana"]).unwrap_err();
        assert!(e.to_string().contains("kube-banana"));
    }
}
