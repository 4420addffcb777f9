//! The kubelet's files: `KubeletConfiguration` (`/var/lib/kubelet/kubelet.conf`), the flags
//! file (`/etc/sysconfig/kubelet`), kubeconfigs and the image credential provider config.

use keelson_api::KubeletConfigSpec;
use serde::Serialize;

use crate::flag_table::KUBELET_CONFIG_SPEC;
use crate::paths;

pub use super::kubelet_config::{parse_taint, KubeletConfiguration, KubeletFieldError, NodeSettings, Taint};

/// The `KubeletConfiguration` for a kubelet spec ([`super::kubelet_config::split`]), with the
/// node's cloud provider id when it is known. `control_plane`: the host runs the API server (its
/// kubelet gets a serving certificate and pulls images in parallel by default).
pub fn configuration(
    spec: &KubeletConfigSpec,
    containerd_address: Option<&str>,
    control_plane: bool,
    provider_id: Option<String>,
) -> Result<KubeletConfiguration, KubeletFieldError> {
    Ok(super::kubelet_config::split(spec, &NodeSettings { containerd_address, serving_cert: control_plane, control_plane, provider_id })?.config)
}

/// The provider id of an AWS instance, as the cloud-controller-manager writes it:
/// `aws:///<availability zone>/<instance id>`.
pub fn aws_provider_id(zone: &str, instance_id: &str) -> String {
    format!("aws:///{zone}/{instance_id}")
}

/// Labels in the `kubernetes.io` / `k8s.io` namespaces a kubelet may set on its own Node: the
/// kubelet refuses to start with any other (and the NodeRestriction admission plugin would reject
/// them). The rest (`node-role.kubernetes.io/…`, `kops.k8s.io/…`) are applied by protokube's node
/// labeller on the control planes (`protokube/src/node_labels/`, as kOps' kops-controller does),
/// from the group's completed labels in this same NodeupConfig, with the group found from the cloud
/// by the Node's name.
const SELF_LABELS: &[&str] = &[
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/instance-type",
    "beta.kubernetes.io/os",
    "failure-domain.beta.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "kubernetes.io/arch",
    "kubernetes.io/hostname",
    "kubernetes.io/os",
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
];

/// Whether the kubelet may set the node label `key` itself (`--node-labels`).
pub fn kubelet_may_set_label(key: &str) -> bool {
    let Some((namespace, _)) = key.split_once('/') else { return true };
    let under = |domain: &str| namespace == domain || namespace.ends_with(&format!(".{domain}"));
    if !under("kubernetes.io") && !under("k8s.io") {
        return true;
    }
    under("kubelet.kubernetes.io") || under("node.kubernetes.io") || SELF_LABELS.contains(&key)
}

/// Whether the kubelet of `version` reads a drop-in configuration directory (`--config-dir`): the
/// `KubeletConfigDropInDir` feature, alpha in 1.28 (behind a gate), beta and on by default from 1.30.
pub fn has_config_dir(version: &keelson_api::KubernetesVersion) -> bool {
    version.at_least(1, 30)
}

/// `/etc/sysconfig/kubelet`: the flags kOps still passes on the command line, and `--config-dir`
/// when given ([`has_config_dir`]). Only the node labels the kubelet may set itself are passed
/// ([`kubelet_may_set_label`]).
pub fn sysconfig(spec: &KubeletConfigSpec, node_ip: Option<&str>, credential_provider: bool, config_dir: Option<&str>) -> Result<String, KubeletFieldError> {
    let mut spec = super::kubelet_config::split(spec, &NodeSettings::default())?.flags;
    if let Some(labels) = spec.node_labels.as_mut() {
        labels.retain(|k, _| kubelet_may_set_label(k));
    }
    let mut flags = crate::flags::build(&spec, KUBELET_CONFIG_SPEC);
    if let Some(ip) = node_ip {
        flags.push(format!("--node-ip={ip}"));
    }
    flags.push(format!("--config={}", paths::KUBELET_CONFIG));
    if let Some(dir) = config_dir {
        flags.push(format!("--config-dir={dir}"));
    }
    if credential_provider {
        flags.push(format!("--image-credential-provider-config={}", paths::KUBELET_CREDENTIAL_PROVIDER_CONFIG));
        flags.push(format!("--image-credential-provider-bin-dir={}", paths::BIN_DIR));
    }
    Ok(format!("DAEMON_ARGS=\"{}\"\nHOME=\"/root\"\n", flags.join(" ")))
}

/// `CredentialProviderConfig` for the ECR credential provider.
pub fn ecr_credential_provider_config() -> Result<String, serde_yaml_ng::Error> {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Provider {
        name: &'static str,
        match_images: Vec<&'static str>,
        default_cache_duration: &'static str,
        api_version: &'static str,
    }
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Config {
        api_version: &'static str,
        kind: &'static str,
        providers: Vec<Provider>,
    }
    let c = Config {
        api_version: "kubelet.config.k8s.io/v1",
        kind: "CredentialProviderConfig",
        providers: vec![Provider {
            name: "ecr-credential-provider",
            match_images: vec!["*.dkr.ecr.*.amazonaws.com", "*.dkr.ecr.*.amazonaws.com.cn"],
            default_cache_duration: "12h",
            api_version: "credentialprovider.kubelet.k8s.io/v1",
        }],
    };
    serde_yaml_ng::to_string(&c)
}

/// A kubeconfig (`kind: Config`) with one cluster, user and context.
#[derive(Debug, Serialize)]
pub struct Kubeconfig {
    #[serde(rename = "apiVersion")]
    pub api_version: &'static str,
    pub kind: &'static str,
    pub clusters: Vec<NamedCluster>,
    pub users: Vec<NamedUser>,
    pub contexts: Vec<NamedContext>,
    #[serde(rename = "current-context")]
    pub current_context: String,
}

#[derive(Debug, Serialize)]
pub struct NamedCluster {
    pub name: String,
    pub cluster: ClusterEntry,
}

#[derive(Debug, Serialize)]
pub struct ClusterEntry {
    #[serde(rename = "certificate-authority-data")]
    pub certificate_authority_data: String,
    pub server: String,
}

#[derive(Debug, Serialize)]
pub struct NamedUser {
    pub name: String,
    pub user: UserEntry,
}

#[derive(Debug, Default, Serialize)]
pub struct UserEntry {
    #[serde(rename = "client-certificate-data", skip_serializing_if = "Option::is_none")]
    pub client_certificate_data: Option<String>,
    #[serde(rename = "client-key-data", skip_serializing_if = "Option::is_none")]
    pub client_key_data: Option<String>,
    /// A file with the client certificate (client-go reads it again, and on every new connection).
    #[serde(rename = "client-certificate", skip_serializing_if = "Option::is_none")]
    pub client_certificate: Option<String>,
    /// A file with the client key (may be the certificate's file: one PEM with both).
    #[serde(rename = "client-key", skip_serializing_if = "Option::is_none")]
    pub client_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

impl UserEntry {
    /// A user whose certificate and key are in one PEM file on the host.
    pub fn from_pem_file(path: &str) -> UserEntry {
        UserEntry { client_certificate: Some(path.into()), client_key: Some(path.into()), ..Default::default() }
    }
}

#[derive(Debug, Serialize)]
pub struct NamedContext {
    pub name: String,
    pub context: ContextEntry,
}

#[derive(Debug, Serialize)]
pub struct ContextEntry {
    pub cluster: String,
    pub user: String,
}

/// Render a kubeconfig for `user` against `server`, trusting `ca_pem`.
pub fn kubeconfig(server: &str, ca_pem: &str, user_name: &str, user: UserEntry) -> Result<String, serde_yaml_ng::Error> {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    let k = Kubeconfig {
        api_version: "v1",
        kind: "Config",
        clusters: vec![NamedCluster { name: "local".into(), cluster: ClusterEntry { certificate_authority_data: b64(ca_pem), server: server.into() } }],
        users: vec![NamedUser {
            name: user_name.into(),
            user: UserEntry {
                client_certificate_data: user.client_certificate_data.as_deref().map(b64),
                client_key_data: user.client_key_data.as_deref().map(b64),
                client_certificate: user.client_certificate,
                client_key: user.client_key,
                token: user.token,
            },
        }],
        contexts: vec![NamedContext { name: "service-account-context".into(), context: ContextEntry { cluster: "local".into(), user: user_name.into() } }],
        current_context: "service-account-context".into(),
    };
    serde_yaml_ng::to_string(&k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysconfig_flags() {
        let spec: KubeletConfigSpec = serde_yaml_ng::from_str(
            "logLevel: 2\nkubeconfigPath: /var/lib/kubelet/kubeconfig\ncloudProvider: external\nnodeLabels:\n  b: ''\n  a: x\n  node-role.kubernetes.io/control-plane: ''\n  kops.k8s.io/kops-controller-pki: ''\nanonymousAuth: false\n",
        )
        .expect("yaml");
        let s = sysconfig(&spec, Some("10.0.0.5"), true, None).expect("sysconfig");
        assert!(!s.contains("--config-dir"), "{s}");
        let with_dir = sysconfig(&spec, Some("10.0.0.5"), true, Some("/etc/kubernetes/kubelet.conf.d")).expect("sysconfig");
        assert!(with_dir.contains(" --config=/var/lib/kubelet/kubelet.conf --config-dir=/etc/kubernetes/kubelet.conf.d "), "{with_dir}");
        let v = |s: &str| s.parse::<keelson_api::KubernetesVersion>().expect("version");
        assert!(!has_config_dir(&v("1.29.9")) && has_config_dir(&v("1.30.0-alpha.1")) && has_config_dir(&v("1.35.7")));
        assert!(kubelet_may_set_label("node.kubernetes.io/exclude-from-external-load-balancers") && kubelet_may_set_label("example.com/x"));
        assert!(!kubelet_may_set_label("node-role.kubernetes.io/node") && !kubelet_may_set_label("kops.k8s.io/instancegroup"));
        assert!(kubelet_may_set_label("topology.kubernetes.io/zone") && !kubelet_may_set_label("kubernetes.io/role"));
        assert!(s.starts_with("DAEMON_ARGS=\"--cloud-provider=external --kubeconfig=/var/lib/kubelet/kubeconfig --node-labels=a=x,b= --v=2 --node-ip=10.0.0.5 --config=/var/lib/kubelet/kubelet.conf"), "{s}");
        assert!(!s.contains("anonymous"), "config-file fields are not flags: {s}");
    }
}
