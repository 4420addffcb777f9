//! The kubelet's files: `KubeletConfiguration` (`/var/lib/kubelet/kubelet.conf`), the flags
//! file (`/etc/sysconfig/kubelet`), kubeconfigs and the image credential provider config.

use std::collections::BTreeMap;

use keelson_api::KubeletConfigSpec;
use serde::Serialize;

use crate::flag_table::KUBELET_CONFIG_SPEC;
use crate::paths;

#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletConfiguration {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub authentication: Authentication,
    pub authorization: Authorization,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup_driver: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup_root: Option<String>,
    #[serde(rename = "clusterDNS", skip_serializing_if = "Vec::is_empty")]
    pub cluster_dns: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_domain: Option<String>,
    pub container_runtime_endpoint: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enable_debugging_handlers: Option<bool>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub eviction_hard: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub feature_gates: BTreeMap<String, bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fail_swap_on: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_pods: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_pids_limit: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protect_kernel_defaults: Option<bool>,
    /// `aws:///<zone>/<instance-id>` on AWS (as kOps writes it): the Node carries its instance from
    /// registration on, so the cloud-controller-manager can always tell whether the instance still
    /// exists (it cannot look a terminated instance up by name).
    #[serde(rename = "providerID", skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub register_with_taints: Vec<Taint>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rotate_certificates: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serialize_image_pulls: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shutdown_grace_period: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shutdown_grace_period_critical_pods: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub static_pod_path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_private_key_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kube_reserved: Option<BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_reserved: Option<BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_gc_high_threshold_percent: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_gc_low_threshold_percent: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_only_port: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_log_max_size: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_log_max_files: Option<i64>,
}

#[derive(Debug, Default, Serialize)]
pub struct Authentication {
    pub anonymous: Enabled,
    pub webhook: Enabled,
    pub x509: X509,
}

#[derive(Debug, Default, Serialize)]
pub struct Enabled {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

#[derive(Debug, Default, Serialize)]
pub struct X509 {
    #[serde(rename = "clientCAFile", skip_serializing_if = "Option::is_none")]
    pub client_ca_file: Option<String>,
}

#[derive(Debug, Default, Serialize)]
pub struct Authorization {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Taint {
    pub key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    pub effect: String,
}

/// `key=value:Effect` or `key:Effect` (kOps taint syntax).
pub fn parse_taint(t: &str) -> Result<Taint, String> {
    let (kv, effect) = t.rsplit_once(':').ok_or_else(|| format!("taint {t:?}: expected key[=value]:Effect"))?;
    let (key, value) = match kv.split_once('=') {
        Some((k, v)) => (k, (!v.is_empty()).then(|| v.to_string())),
        None => (kv, None),
    };
    Ok(Taint { key: key.into(), value, effect: effect.into() })
}

fn kv_list(s: &str, sep: char) -> BTreeMap<String, String> {
    s.split(',').filter(|p| !p.trim().is_empty()).filter_map(|p| p.split_once(sep).map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))).collect()
}

/// The `KubeletConfiguration` for a kubelet spec (kOps' mapping of its `flag:"-"` fields), with the
/// node's cloud provider id when it is known.
pub fn configuration(
    spec: &KubeletConfigSpec,
    containerd_address: Option<&str>,
    serving_cert: bool,
    provider_id: Option<String>,
) -> Result<KubeletConfiguration, String> {
    let taints = spec.taints.iter().flatten().map(|t| parse_taint(t)).collect::<Result<Vec<_>, _>>()?;
    let feature_gates = spec.feature_gates.iter().flatten().map(|(k, val)| (k.clone(), val.trim().eq_ignore_ascii_case("true"))).collect();
    Ok(KubeletConfiguration {
        api_version: "kubelet.config.k8s.io/v1beta1",
        kind: "KubeletConfiguration",
        authentication: Authentication {
            anonymous: Enabled { enabled: spec.anonymous_auth },
            webhook: Enabled { enabled: spec.authentication_token_webhook },
            // Always the cluster CA nodeup writes: the spec's `clientCaFile` has never been
            // carried into this file (the former key-based read looked for `clientCAFile`, a
            // key the v1alpha2 type does not have), and the output stays as it was.
            x509: X509 { client_ca_file: Some(paths::CA_CRT.into()) },
        },
        authorization: Authorization { mode: spec.authorization_mode.clone() },
        cgroup_driver: spec.cgroup_driver.clone(),
        cgroup_root: spec.cgroup_root.clone(),
        cluster_dns: spec.cluster_dns.iter().cloned().collect(),
        cluster_domain: spec.cluster_domain.clone(),
        container_runtime_endpoint: format!("unix://{}", containerd_address.unwrap_or(paths::CONTAINERD_SOCKET)),
        enable_debugging_handlers: spec.enable_debugging_handlers,
        eviction_hard: spec.eviction_hard.as_deref().map(|e| kv_list(e, '<')).unwrap_or_default(),
        feature_gates,
        fail_swap_on: spec.fail_swap_on,
        max_pods: spec.max_pods,
        pod_pids_limit: spec.pod_pids_limit,
        protect_kernel_defaults: spec.protect_kernel_defaults,
        provider_id,
        register_with_taints: taints,
        rotate_certificates: spec.rotate_certificates,
        serialize_image_pulls: spec.serialize_image_pulls,
        shutdown_grace_period: spec.shutdown_grace_period.map(|d| d.to_string()),
        shutdown_grace_period_critical_pods: spec.shutdown_grace_period_critical_pods.map(|d| d.to_string()),
        static_pod_path: spec.pod_manifest_path.clone(),
        tls_cert_file: serving_cert.then(|| format!("{}/kubelet-server.crt", paths::SRV_KUBERNETES)),
        tls_private_key_file: serving_cert.then(|| format!("{}/kubelet-server.key", paths::SRV_KUBERNETES)),
        kube_reserved: spec.kube_reserved.clone(),
        system_reserved: spec.system_reserved.clone(),
        image_gc_high_threshold_percent: spec.image_gc_high_threshold_percent,
        image_gc_low_threshold_percent: spec.image_gc_low_threshold_percent,
        read_only_port: spec.read_only_port,
        container_log_max_size: spec.container_log_max_size.clone(),
        container_log_max_files: spec.container_log_max_files,
    })
}

/// The provider id of an AWS instance, as the cloud-controller-manager writes it:
/// `aws:///<availability zone>/<instance id>`.
pub fn aws_provider_id(zone: &str, instance_id: &str) -> String {
    format!("aws:///{zone}/{instance_id}")
}

/// Labels in the `kubernetes.io` / `k8s.io` namespaces a kubelet may set on its own Node: the
/// kubelet refuses to start with any other (and the NodeRestriction admission plugin would reject
/// them). The rest (`node-role.kubernetes.io/…`, `kops.k8s.io/…`) are applied by a controller
/// on the control plane, as kOps' kops-controller does.
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

/// `/etc/sysconfig/kubelet`: the flags kOps still passes on the command line. Only the node labels
/// the kubelet may set itself are passed ([`kubelet_may_set_label`]).
pub fn sysconfig(spec: &KubeletConfigSpec, node_ip: Option<&str>, credential_provider: bool) -> String {
    let mut spec = spec.clone();
    if let Some(labels) = spec.node_labels.as_mut() {
        labels.retain(|k, _| kubelet_may_set_label(k));
    }
    let mut flags = crate::flags::build(&spec, KUBELET_CONFIG_SPEC);
    if let Some(ip) = node_ip {
        flags.push(format!("--node-ip={ip}"));
    }
    flags.push(format!("--config={}", paths::KUBELET_CONFIG));
    if credential_provider {
        flags.push(format!("--image-credential-provider-config={}", paths::KUBELET_CREDENTIAL_PROVIDER_CONFIG));
        flags.push(format!("--image-credential-provider-bin-dir={}", paths::BIN_DIR));
    }
    format!("DAEMON_ARGS=\"{}\"\nHOME=\"/root\"\n", flags.join(" "))
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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
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
    fn taints() {
        assert_eq!(
            parse_taint("node-role.kubernetes.io/control-plane=:NoSchedule").expect("taint"),
            Taint { key: "node-role.kubernetes.io/control-plane".into(), value: None, effect: "NoSchedule".into() }
        );
        assert_eq!(parse_taint("a=b:NoExecute").expect("taint").value.as_deref(), Some("b"));
        assert!(parse_taint("nocolon").is_err());
    }

    #[test]
    fn sysconfig_flags() {
        let spec: KubeletConfigSpec = serde_yaml_ng::from_str(
            "logLevel: 2\nkubeconfigPath: /var/lib/kubelet/kubeconfig\ncloudProvider: external\nnodeLabels:\n  b: ''\n  a: x\n  node-role.kubernetes.io/control-plane: ''\n  kops.k8s.io/kops-controller-pki: ''\nanonymousAuth: false\n",
        )
        .expect("yaml");
        let s = sysconfig(&spec, Some("10.0.0.5"), true);
        assert!(kubelet_may_set_label("node.kubernetes.io/exclude-from-external-load-balancers") && kubelet_may_set_label("example.com/x"));
        assert!(!kubelet_may_set_label("node-role.kubernetes.io/node") && !kubelet_may_set_label("kops.k8s.io/instancegroup"));
        assert!(kubelet_may_set_label("topology.kubernetes.io/zone") && !kubelet_may_set_label("kubernetes.io/role"));
        assert!(s.starts_with("DAEMON_ARGS=\"--cloud-provider=external --kubeconfig=/var/lib/kubelet/kubeconfig --node-labels=a=x,b= --v=2 --node-ip=10.0.0.5 --config=/var/lib/kubelet/kubelet.conf"), "{s}");
        assert!(!s.contains("anonymous"), "config-file fields are not flags: {s}");
    }
}
