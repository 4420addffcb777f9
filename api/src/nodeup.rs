//! Node-side documents: the per-instance-group `NodeupConfig` (state store
//! `igconfig/<role>/<ig>/nodeupconfig.yaml`) and the small `BootConfig` carried in user-data.
//! Key names follow kOps (`pkg/apis/nodeup`), so kOps tooling reads them too.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{CloudProvider, ConfigBase, Role};

use crate::generated::{
    APISpec, ContainerdConfig, FileAssetSpec, HookSpec, KubeAPIServerConfig, KubeControllerManagerConfig, KubeProxyConfig, KubeSchedulerConfig,
    KubeletConfigSpec, NetworkingSpec, NvidiaGPUConfig,
};

/// Everything nodeup needs to configure one instance of an instance group.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeupConfig {
    /// Per architecture (`amd64`, `arm64`): `<sha256-hex>@<url>[,<mirror-url>…]`.
    #[serde(rename = "Assets", default)]
    pub assets: BTreeMap<String, Vec<String>>,
    #[serde(rename = "CAs", default)]
    pub cas: BTreeMap<String, String>,
    #[serde(rename = "ClusterName")]
    pub cluster_name: String,
    #[serde(rename = "KubernetesVersion")]
    pub kubernetes_version: String,
    #[serde(rename = "KeypairIDs", default)]
    pub keypair_ids: BTreeMap<String, String>,
    #[serde(rename = "KubeletConfig")]
    pub kubelet_config: KubeletConfigSpec,
    /// `null` when kube-proxy does not run on this group (disabled, or an isolated control plane).
    #[serde(rename = "KubeProxy", default)]
    pub kube_proxy: Option<KubeProxyConfig>,
    #[serde(rename = "Networking")]
    pub networking: NodeupNetworking,
    #[serde(rename = "UpdatePolicy")]
    pub update_policy: String,
    /// Hooks of the cluster and of the instance group (kOps writes a list per source).
    #[serde(rename = "Hooks", default)]
    pub hooks: Vec<Option<Vec<HookSpec>>>,
    #[serde(rename = "EtcdClusterNames", default, skip_serializing_if = "Vec::is_empty")]
    pub etcd_cluster_names: Vec<String>,
    #[serde(rename = "FileAssets", default, skip_serializing_if = "Vec::is_empty")]
    pub file_assets: Vec<FileAssetSpec>,
    #[serde(rename = "InstallCNIAssets", default, skip_serializing_if = "is_false")]
    pub install_cni_assets: bool,
    #[serde(rename = "UseCiliumEtcd", default, skip_serializing_if = "is_false")]
    pub use_cilium_etcd: bool,
    #[serde(rename = "ServiceNodePortRange", default, skip_serializing_if = "Option::is_none")]
    pub service_node_port_range: Option<String>,
    /// Lines nodeup appends to its sysctl file: the group's `sysctlParameters`, then the cluster's,
    /// each under kOps' heading ([`sysctl_parameters`]).
    #[serde(rename = "SysctlParameters", default, skip_serializing_if = "Vec::is_empty")]
    pub sysctl_parameters: Vec<String>,
    #[serde(rename = "DNSZone", default, skip_serializing_if = "Option::is_none")]
    pub dns_zone: Option<String>,
    #[serde(rename = "containerdConfig")]
    pub containerd_config: ContainerdConfig,
    #[serde(rename = "APIServerConfig", default, skip_serializing_if = "Option::is_none")]
    pub api_server_config: Option<ApiServerNodeConfig>,
    #[serde(rename = "ControlPlaneConfig", default, skip_serializing_if = "Option::is_none")]
    pub control_plane_config: Option<ControlPlaneNodeConfig>,
    #[serde(rename = "staticManifests", default, skip_serializing_if = "Vec::is_empty")]
    pub static_manifests: Vec<StaticManifest>,
    #[serde(rename = "nodeIPFamilies", default, skip_serializing_if = "Vec::is_empty")]
    pub node_ip_families: Vec<String>,
    #[serde(rename = "multizone", default, skip_serializing_if = "Option::is_none")]
    pub multizone: Option<bool>,
    #[serde(rename = "nodeTags", default, skip_serializing_if = "Option::is_none")]
    pub node_tags: Option<String>,
    #[serde(rename = "DefaultMachineType", default, skip_serializing_if = "Option::is_none")]
    pub default_machine_type: Option<String>,
    #[serde(rename = "NvidiaGPU", default, skip_serializing_if = "Option::is_none")]
    pub nvidia_gpu: Option<NvidiaGPUConfig>,
    /// `<ConfigBase>/manifests/channels/kops-channels.yaml` on control-plane groups.
    #[serde(rename = "channelsManifest", default, skip_serializing_if = "Option::is_none")]
    pub channels_manifest: Option<String>,
    #[serde(rename = "configStore", default, skip_serializing_if = "Option::is_none")]
    pub config_store: Option<ConfigStore>,
    /// State-store paths of the etcd manifests this group's members run.
    #[serde(rename = "etcdManifests", default, skip_serializing_if = "Vec::is_empty")]
    pub etcd_manifests: Vec<String>,
    /// Extra OS packages (cluster's then group's).
    #[serde(rename = "packages", default, skip_serializing_if = "Vec::is_empty")]
    pub packages: Vec<String>,
    /// Keelson: the apt archive base in the cluster's file repository
    /// ([`crate::host_packages::apt_repository`]) nodeup installs the host's packages from, before
    /// the image's own sources; absent without `assets.fileRepository`.
    #[serde(rename = "aptRepository", default, skip_serializing_if = "Option::is_none")]
    pub apt_repository: Option<String>,
    #[serde(rename = "usesNoneDNS")]
    pub uses_none_dns: bool,
    /// How workers get their kubelet and kube-proxy credentials; absent: a bootstrap token.
    #[serde(rename = "NodeBootstrap", default, skip_serializing_if = "Option::is_none")]
    pub node_bootstrap: Option<NodeBootstrap>,
}

/// Cluster annotation that chooses how workers join: `cloud-identity` (the join server, AWS and
/// GCE only) or `token` (Kubernetes bootstrap tokens, rotated by protokube on the control planes).
pub const NODE_BOOTSTRAP_ANNOTATION: &str = "keelson.io/node-bootstrap";

/// Cluster annotation, `"true"`, without which [`NODE_BOOTSTRAP_ANNOTATION`]`: token` is refused
/// on AWS and GCE, where workers can join by their instance identity instead.
pub const ALLOW_BOOTSTRAP_TOKEN_ANNOTATION: &str = "keelson.io/allow-bootstrap-token";

/// Why the cluster's annotations name no way for workers to join; [`NodeBootstrapError::field`]
/// names the annotation at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeBootstrapError {
    #[error("{0:?}: expected \"token\" or \"cloud-identity\"")]
    Method(String),
    #[error("cloud-identity: only on AWS and GCE")]
    NoCloudIdentity,
    #[error(
        "token: refused on AWS and GCE unless metadata.annotations[{ALLOW_BOOTSTRAP_TOKEN_ANNOTATION}] is \"true\". \
         Here workers join by their instance identity: the join server checks which instance asks and issues a certificate for that instance's name only, \
         with no secret to steal. A bootstrap token is a bearer secret: whoever reads it from the state store (any node) can register a new node while it lives (24 h). \
         Remove the annotation, or set both annotations to keep tokens anyway"
    )]
    TokenNotAllowed,
    #[error("{0:?}: expected \"true\" or \"false\"")]
    Allow(String),
}

impl NodeBootstrapError {
    /// The field at fault: `metadata.annotations[<annotation>]`.
    pub fn field(&self) -> String {
        let annotation = match self {
            NodeBootstrapError::Allow(_) => ALLOW_BOOTSTRAP_TOKEN_ANNOTATION,
            _ => NODE_BOOTSTRAP_ANNOTATION,
        };
        format!("metadata.annotations[{annotation}]")
    }
}

/// Where the join server listens on every control plane.
pub const NODE_JOIN_PORT: u16 = crate::ports::NODE_JOIN;

/// The clouds whose instances can prove who they are to the join server: AWS (a signed
/// `sts:GetCallerIdentity`) and GCE (a metadata identity token).
pub fn joins_by_cloud_identity(cloud_provider: Option<&str>) -> bool {
    matches!(cloud_provider, Some("aws") | Some("gce"))
}

/// How a cluster's workers join: by cloud identity on AWS and GCE (`identity_cloud`, see
/// [`joins_by_cloud_identity`]) unless the annotation [`NODE_BOOTSTRAP_ANNOTATION`] says `token` and
/// [`ALLOW_BOOTSTRAP_TOKEN_ANNOTATION`] opts in to it; by token elsewhere. The one rule every command
/// that builds a cluster (validate, compile, apply) goes through.
pub fn node_bootstrap_method(annotations: Option<&BTreeMap<String, String>>, identity_cloud: bool) -> Result<NodeBootstrapMethod, NodeBootstrapError> {
    let get = |key: &str| annotations.and_then(|a| a.get(key)).map(String::as_str);
    let allowed = match get(ALLOW_BOOTSTRAP_TOKEN_ANNOTATION) {
        None | Some("false") => false,
        Some("true") => true,
        Some(v) => return Err(NodeBootstrapError::Allow(v.to_string())),
    };
    match get(NODE_BOOTSTRAP_ANNOTATION) {
        None if identity_cloud => Ok(NodeBootstrapMethod::CloudIdentity),
        Some("token") if identity_cloud && !allowed => Err(NodeBootstrapError::TokenNotAllowed),
        None | Some("token") => Ok(NodeBootstrapMethod::Token),
        Some("cloud-identity") if identity_cloud => Ok(NodeBootstrapMethod::CloudIdentity),
        Some("cloud-identity") => Err(NodeBootstrapError::NoCloudIdentity),
        Some(v) => Err(NodeBootstrapError::Method(v.to_string())),
    }
}

/// Whether a cluster has no DNS records for its own names (`topology.dns.type: None`, or a gossip
/// `.k8s.local` name): the control planes' names (`api.internal.<cluster>`, the join server's
/// `kops-controller.internal.<cluster>`, the etcd members) then live in hosts files.
pub fn uses_hosts_dns(cluster_name: &str, dns_type: Option<&str>) -> bool {
    dns_type == Some("None") || crate::plan::is_gossip_name(cluster_name)
}

/// Where, in a hosts-DNS cluster ([`uses_hosts_dns`]), the control planes publish the private
/// addresses of the live API servers for the workers (relative to `ConfigBase`). Under
/// `igconfig/node/`, which every worker may already read (its own NodeupConfig is there); the `_`
/// keeps it clear of instance-group names, which cannot contain one.
pub const API_SERVERS_KEY: &str = "igconfig/node/_api-servers.yaml";

/// What of the state store (relative to `ConfigBase`) a worker reads, on every cloud: its
/// NodeupConfig and the live API servers under `igconfig/node/`, and the cluster CA's certificate.
/// A prefix ends in `/`. In token mode a worker also reads the bootstrap token (`secrets/` +
/// `keelson_base::pki::BOOTSTRAP_TOKEN_SECRET`), that one object and nothing else of `secrets/`.
pub const NODE_READABLE_PREFIXES: &[&str] = &["igconfig/node/", "pki/issued/kubernetes-ca/"];

/// The document at [`API_SERVERS_KEY`]: protokube on every control plane keeps it at the private
/// addresses of the instances that hold a `main` etcd member's volume (the live control planes);
/// workers put them in their hosts file as `api.internal.<cluster>` and
/// `kops-controller.internal.<cluster>`. Integrity needs no signature: a worker trusts the API and
/// join servers only through the cluster CA and their names, never through these addresses.
/// Each address is an IP address (parsed when the document is read: anything else, such as a
/// line break and another name for the hosts file, refuses the whole document).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiServers {
    /// Sorted, each once.
    pub addresses: Vec<std::net::IpAddr>,
}

/// The names a worker of a hosts-DNS cluster resolves to [`ApiServers::addresses`]: the API
/// server's internal name and the join server's.
pub fn api_server_names(cluster_name: &str) -> [String; 2] {
    [crate::names::api_internal_dns(cluster_name), crate::names::kops_controller_internal_dns(cluster_name)]
}

/// The pod network of a cluster: `podCIDR`, else `nonMasqueradeCIDR` (the range pods' addresses
/// come from when the CNI gives pods their own). What nodeup keeps from the metadata server and
/// what the join server holds to a share of its capacity.
pub fn pod_network<'a>(pod_cidr: Option<&'a str>, non_masquerade_cidr: Option<&'a str>) -> Option<&'a str> {
    pod_cidr.filter(|c| !c.is_empty()).or(non_masquerade_cidr.filter(|c| !c.is_empty()))
}

/// How workers join.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeBootstrap {
    #[serde(rename = "Method")]
    pub method: NodeBootstrapMethod,
    /// The join server workers ask (method `CloudIdentity`): `https://kops-controller.internal.<cluster>:3988`.
    #[serde(rename = "Server", default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeBootstrapMethod {
    /// The worker proves its instance identity (AWS: a signed `sts:GetCallerIdentity`) to the join
    /// server on the control planes, which signs its kubelet and kube-proxy CSRs. No shared secret.
    CloudIdentity,
    /// A Kubernetes bootstrap token from the state store (TLS bootstrapping), which protokube
    /// mints, expires and rotates; on AWS and GCE an explicit opt-in only.
    Token,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// The networking block nodeup sees: cluster-wide ranges plus the plugin section.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeupNetworking {
    #[serde(rename = "networkCIDR", default, skip_serializing_if = "Option::is_none")]
    pub network_cidr: Option<String>,
    #[serde(rename = "nonMasqueradeCIDR", default, skip_serializing_if = "Option::is_none")]
    pub non_masquerade_cidr: Option<String>,
    #[serde(rename = "podCIDR", default, skip_serializing_if = "Option::is_none")]
    pub pod_cidr: Option<String>,
    #[serde(rename = "serviceClusterIPRange", default, skip_serializing_if = "Option::is_none")]
    pub service_cluster_ip_range: Option<String>,
    #[serde(flatten)]
    pub plugin: NetworkingSpec,
}

/// API-server settings for control-plane and API-server instance groups.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ApiServerNodeConfig {
    #[serde(rename = "ClusterDNSDomain")]
    pub cluster_dns_domain: String,
    #[serde(rename = "KubeAPIServer")]
    pub kube_api_server: KubeAPIServerConfig,
    #[serde(rename = "API")]
    pub api: NodeApi,
    /// PEM public keys that verify service-account tokens (filled from the state store's keys).
    #[serde(rename = "ServiceAccountPublicKeys", default, skip_serializing_if = "Option::is_none")]
    pub service_account_public_keys: Option<String>,
    /// `spec.encryptionConfig: true`: nodeup writes the state store's secret `encryptionconfig`
    /// (0600) to the file `KubeAPIServer.encryptionProviderConfig` names (default
    /// [`crate::host_paths::ENCRYPTION_CONFIG_PATH`]). kOps carries the secret's hash here instead; the compiler is
    /// offline and never sees the secret, so only the switch is carried.
    #[serde(rename = "EncryptionConfig", default, skip_serializing_if = "is_false")]
    pub encryption_config: bool,
}

/// The `api` block with the public name folded in, as nodeup reads it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeApi {
    #[serde(rename = "publicName", default, skip_serializing_if = "Option::is_none")]
    pub public_name: Option<String>,
    #[serde(rename = "additionalSANs", default, skip_serializing_if = "Option::is_none")]
    pub additional_sans: Option<Vec<String>>,
    #[serde(flatten)]
    pub spec: APISpec,
}

/// Controller-manager and scheduler settings for control-plane instance groups.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ControlPlaneNodeConfig {
    #[serde(rename = "KubeControllerManager")]
    pub kube_controller_manager: KubeControllerManagerConfig,
    #[serde(rename = "KubeScheduler")]
    pub kube_scheduler: KubeSchedulerConfig,
}

/// Where the keys and secrets of the cluster live.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigStore {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keypairs: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets: Option<String>,
}

/// A static manifest the node installs from the state store.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StaticManifest {
    pub key: String,
    pub path: String,
}

/// The boot configuration written by user-data; pins the NodeupConfig by hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootConfig {
    #[serde(rename = "CloudProvider", deserialize_with = "boot_field::cloud_provider")]
    pub cloud_provider: CloudProvider,
    #[serde(rename = "ConfigBase", deserialize_with = "boot_field::config_base")]
    pub config_base: ConfigBase,
    #[serde(rename = "ClusterName")]
    pub cluster_name: String,
    #[serde(rename = "InstanceGroupName")]
    pub instance_group_name: String,
    /// `ControlPlane`, `Node`, `APIServer` or `Bastion` (kOps' legacy `Master` reads as `ControlPlane`).
    #[serde(rename = "InstanceGroupRole", deserialize_with = "boot_field::role")]
    pub instance_group_role: Role,
    /// Base64 (standard alphabet) of the sha256 of the NodeupConfig file's bytes.
    #[serde(rename = "NodeupConfigHash")]
    pub nodeup_config_hash: String,
}

/// The BootConfig's typed fields, read so that a bad value names its field and what it accepts.
mod boot_field {
    use std::fmt::Display;
    use std::str::FromStr;

    use serde::{de::Error as _, Deserialize, Deserializer};

    use crate::{CloudProvider, ConfigBase, Role};

    fn named<'de, D: Deserializer<'de>, T: FromStr>(d: D, field: &str) -> Result<T, D::Error>
    where
        T::Err: Display,
    {
        let text = String::deserialize(d).map_err(|e| D::Error::custom(format!("{field}: {e}")))?;
        // `ConfigBase "…": …` already names its field.
        text.parse().map_err(|e: T::Err| {
            let e = e.to_string();
            D::Error::custom(if e.starts_with(field) { e } else { format!("{field}: {e}") })
        })
    }

    pub fn cloud_provider<'de, D: Deserializer<'de>>(d: D) -> Result<CloudProvider, D::Error> {
        named(d, "CloudProvider")
    }
    pub fn config_base<'de, D: Deserializer<'de>>(d: D) -> Result<ConfigBase, D::Error> {
        named(d, "ConfigBase")
    }
    pub fn role<'de, D: Deserializer<'de>>(d: D) -> Result<Role, D::Error> {
        named(d, "InstanceGroupRole")
    }
}

/// kOps' `SysctlParameters` of a NodeupConfig: the instance group's lines, then the cluster's, each
/// list under its heading comment and a blank line (a later line wins in sysctl(8), so the
/// cluster's settings win, as in kOps).
pub fn sysctl_parameters(group: &[String], cluster: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for (heading, lines) in [("# Custom sysctl parameters from instance group spec", group), ("# Custom sysctl parameters from cluster spec", cluster)] {
        if !lines.is_empty() {
            out.push(heading.to_string());
            out.push(String::new());
            out.extend(lines.iter().cloned());
        }
    }
    out
}

/// A `containerd.configAdditions` key as kOps reads it: a path of TOML keys separated by `.`, a
/// segment in double quotes keeping its dots (`plugins."io.containerd.cri.v1.runtime".enable_cdi`).
/// An error says what is wrong with it.
pub fn config_addition_path(key: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut seg = String::new();
    let (mut quoted, mut was_quoted) = (false, false);
    for c in key.chars() {
        match c {
            '"' if quoted => quoted = false,
            '"' if seg.is_empty() && !was_quoted => (quoted, was_quoted) = (true, true),
            '"' => return Err(format!("{key:?}: a '\"' inside an unquoted key")),
            '.' if !quoted => {
                if seg.is_empty() && !was_quoted {
                    return Err(format!("{key:?}: an empty key between dots"));
                }
                out.push(std::mem::take(&mut seg));
                was_quoted = false;
            }
            c if c.is_control() => return Err(format!("{key:?}: a control character")),
            c => seg.push(c),
        }
    }
    if quoted {
        return Err(format!("{key:?}: an unclosed '\"'"));
    }
    if seg.is_empty() && !was_quoted {
        return Err(format!("{key:?}: expected a dotted path of TOML keys (e.g. plugins.\"io.containerd.cri.v1.runtime\".enable_cdi)"));
    }
    out.push(seg);
    Ok(out)
}

/// Why a `sysctlParameters` entry is refused: one `key = value` line (or a comment), no line breaks
/// that would add lines of their own, a key sysctl(8) could name.
pub fn sysctl_parameter_error(line: &str) -> Option<String> {
    if line.contains(['\n', '\r']) {
        return Some("holds a line break: one sysctl setting per entry".into());
    }
    let t = line.trim();
    if t.is_empty() || t.starts_with('#') || t.starts_with(';') {
        return None;
    }
    let Some((key, value)) = t.split_once('=') else {
        return Some(format!("{line:?}: expected key = value (e.g. net.ipv4.tcp_keepalive_time = 600)"));
    };
    let key = key.trim().trim_start_matches('-');
    if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || "._/-*".contains(c)) || value.trim().is_empty() {
        return Some(format!(
            "{line:?}: expected key = value with a sysctl key of letters, digits, '.', '_', '/', '-' (e.g. net.ipv4.tcp_keepalive_time = 600)"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_addition_keys_split_on_dots_outside_quotes() {
        assert_eq!(
            config_addition_path("plugins.\"io.containerd.cri.v1.runtime\".enable_cdi"),
            Ok(vec!["plugins".to_string(), "io.containerd.cri.v1.runtime".into(), "enable_cdi".into()])
        );
        assert_eq!(config_addition_path("version"), Ok(vec!["version".to_string()]));
        for bad in ["", "a..b", "a.", ".a", "a.\"b", "a\"b\".c", "a.b\nc"] {
            assert!(config_addition_path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sysctl_parameters_are_the_groups_then_the_clusters_under_kops_headings() {
        let (g, c) = (vec!["net.ipv4.tcp_keepalive_time = 600".to_string()], vec!["fs.inotify.max_user_watches = 524288".to_string()]);
        assert_eq!(
            sysctl_parameters(&g, &c),
            [
                "# Custom sysctl parameters from instance group spec",
                "",
                "net.ipv4.tcp_keepalive_time = 600",
                "# Custom sysctl parameters from cluster spec",
                "",
                "fs.inotify.max_user_watches = 524288"
            ]
        );
        assert!(sysctl_parameters(&[], &[]).is_empty());
        assert_eq!(sysctl_parameters(&[], &c).len(), 3, "no heading for an empty list");
        for ok in ["net.ipv4.ip_forward=1", " kernel.pid_max = 4194304 ", "# a comment", "", "-net.ipv6.conf.all.disable_ipv6 = 1"] {
            assert_eq!(sysctl_parameter_error(ok), None, "{ok:?}");
        }
        for bad in ["net.ipv4.ip_forward", "net.ipv4.ip_forward=1\nkernel.panic=0", "= 1", "net ipv4 = 1", "kernel.panic ="] {
            assert!(sysctl_parameter_error(bad).is_some(), "{bad:?}");
        }
    }

    const BOOT: &str = "CloudProvider: aws\nConfigBase: s3://b/c.example.com\nClusterName: c.example.com\nInstanceGroupName: cp-a\nInstanceGroupRole: ControlPlane\nNodeupConfigHash: x\n";

    #[test]
    fn a_boot_config_round_trips_in_kops_spelling() {
        let boot: BootConfig = serde_yaml_ng::from_str(BOOT).expect("boot");
        assert_eq!(boot.cloud_provider, CloudProvider::Aws);
        assert_eq!(boot.config_base, ConfigBase::S3 { bucket: "b".into(), prefix: "c.example.com".into() });
        assert_eq!(boot.instance_group_role, Role::ControlPlane);
        assert_eq!(serde_yaml_ng::to_string(&boot).expect("yaml"), BOOT);
        let legacy: BootConfig = serde_yaml_ng::from_str(&BOOT.replace("ControlPlane", "Master")).expect("legacy role");
        assert_eq!(legacy.instance_group_role, Role::ControlPlane);
        for (role, want) in [("Node", Role::Node), ("APIServer", Role::ApiServer), ("Bastion", Role::Bastion)] {
            let b: BootConfig = serde_yaml_ng::from_str(&BOOT.replace("ControlPlane", role)).expect(role);
            assert_eq!(b.instance_group_role, want);
        }
        let gce: BootConfig = serde_yaml_ng::from_str(&BOOT.replace("aws", "gce").replace("s3://", "gs://")).expect("gce");
        assert_eq!((gce.cloud_provider, gce.config_base.to_string()), (CloudProvider::Gce, "gs://b/c.example.com".to_string()));
    }

    #[test]
    fn a_bad_boot_config_value_names_its_field_and_the_accepted_values() {
        let cases = [
            (BOOT.replace("aws", "ec2"), &["CloudProvider", "\"ec2\"", "aws, gce, hetzner"][..]),
            (BOOT.replace("aws", "AWS"), &["CloudProvider", "expected one of aws"][..]),
            (BOOT.replace("s3://b/c.example.com", "ftp://b/c"), &["ConfigBase", "\"ftp://b/c\"", "file://, http://, https://, s3://, gs://"][..]),
            (BOOT.replace("s3://b/c.example.com", "relative/dir"), &["ConfigBase", "unsupported scheme"][..]),
            (BOOT.replace("ControlPlane", "Worker"), &["InstanceGroupRole", "\"Worker\"", "ControlPlane, Node, APIServer, Bastion"][..]),
            (BOOT.replace("ControlPlane", "controlplane"), &["InstanceGroupRole", "Master"][..]),
        ];
        for (text, wants) in cases {
            let e = serde_yaml_ng::from_str::<BootConfig>(&text).expect_err(&text).to_string();
            for want in wants {
                assert!(e.contains(want), "{text}: {e} lacks {want}");
            }
        }
    }

    #[test]
    fn token_mode_needs_an_explicit_opt_in_where_cloud_identity_exists() {
        use NodeBootstrapError as E;
        use NodeBootstrapMethod::{CloudIdentity, Token};
        let ann = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>();
        let (method, allow) = (NODE_BOOTSTRAP_ANNOTATION, ALLOW_BOOTSTRAP_TOKEN_ANNOTATION);
        type Case<'a> = (&'a [(&'a str, &'a str)], bool, Result<NodeBootstrapMethod, E>);
        let cases: &[Case] = &[
            (&[], true, Ok(CloudIdentity)),
            (&[], false, Ok(Token)),
            (&[(method, "token")], true, Err(E::TokenNotAllowed)),
            (&[(method, "token"), (allow, "false")], true, Err(E::TokenNotAllowed)),
            (&[(method, "token"), (allow, "true")], true, Ok(Token)),
            (&[(method, "token"), (allow, "yes")], true, Err(E::Allow("yes".into()))),
            (&[(method, "token")], false, Ok(Token)),
            (&[(method, "cloud-identity")], true, Ok(CloudIdentity)),
            (&[(method, "cloud-identity"), (allow, "true")], true, Ok(CloudIdentity)),
            (&[(method, "cloud-identity")], false, Err(E::NoCloudIdentity)),
            (&[(method, "static")], true, Err(E::Method("static".into()))),
        ];
        for (pairs, identity_cloud, want) in cases {
            let a = ann(pairs);
            assert_eq!(&node_bootstrap_method(Some(&a), *identity_cloud), want, "{pairs:?} identity_cloud={identity_cloud}");
        }
        assert_eq!(node_bootstrap_method(None, true), Ok(CloudIdentity));
        // The refusal names both annotations and says why cloud identity is better.
        let text = format!("{}: {}", E::TokenNotAllowed.field(), E::TokenNotAllowed);
        for part in [method, allow, "\"true\"", "instance identity", "bearer secret"] {
            assert!(text.contains(part), "{part}: {text}");
        }
    }

    #[test]
    fn hosts_dns_for_gossip_names_and_dns_none() {
        assert!(uses_hosts_dns("x.k8s.local", None));
        assert!(uses_hosts_dns("x.k8s.local.", Some("Public")), "a gossip name never has a zone");
        assert!(uses_hosts_dns("x.example.com", Some("None")));
        assert!(!uses_hosts_dns("x.example.com", Some("none")), "not a kOps value: validation refuses it");
        assert!(!uses_hosts_dns("x.example.com", None));
        assert!(!uses_hosts_dns("x.example.com", Some("Private")));
        assert!(!uses_hosts_dns("k8s.local.example.com", None));
    }

    #[test]
    fn api_servers_document_round_trips() {
        let doc = ApiServers { addresses: vec!["172.20.32.10".parse().expect("ip"), "172.20.64.11".parse().expect("ip")] };
        let text = serde_yaml_ng::to_string(&doc).expect("yaml");
        assert_eq!(text, "addresses:\n- 172.20.32.10\n- 172.20.64.11\n");
        assert_eq!(serde_yaml_ng::from_str::<ApiServers>(&text).expect("parse"), doc);
        let v6: ApiServers = serde_yaml_ng::from_str("addresses:\n- fd00::a\n").expect("an IPv6 address");
        assert_eq!(v6.addresses, vec!["fd00::a".parse::<std::net::IpAddr>().expect("ip")]);
        // What anyone who may write the object could put into every worker's hosts file.
        for bad in ["\"10.0.0.1\\n10.6.6.6 kubernetes.default\"", "evil.example.com", "10.0.0.1 x", "\"\"", "10.0.0.256"] {
            let text = format!("addresses:\n- 172.20.32.10\n- {bad}\n");
            assert!(serde_yaml_ng::from_str::<ApiServers>(&text).is_err(), "{text}");
        }
        assert!(API_SERVERS_KEY.starts_with("igconfig/node/"), "workers may read igconfig/node/*");
        assert_eq!(api_server_names("c.k8s.local"), ["api.internal.c.k8s.local".to_string(), "kops-controller.internal.c.k8s.local".to_string()]);
    }
}
