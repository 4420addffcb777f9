//! The kubelet's last mile: every field of `KubeletConfigSpec` goes to exactly one place — a key of
//! `KubeletConfiguration` (`/var/lib/kubelet/kubelet.conf`), a command-line flag
//! (`/etc/sysconfig/kubelet`, through kOps' flag table), or an error for a field Keelson refuses
//! (`keelson_api::support::KUBELET` says which, and why). The spec is destructured without `..`,
//! so a field added to the api types does not compile until it is placed here.

use std::collections::BTreeMap;

use keelson_api::support::{self, Use};
use keelson_api::KubeletConfigSpec;
use serde::Serialize;

use crate::paths;

/// `kubelet.config.k8s.io/v1beta1` `KubeletConfiguration`: the keys Keelson writes, in
/// alphabetical order (after `apiVersion` and `kind`), with the upstream json names.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletConfiguration {
    pub api_version: &'static str,
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_unsafe_sysctls: Option<Vec<String>>,
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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_log_max_files: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_log_max_size: Option<String>,
    pub container_runtime_endpoint: String,
    #[serde(rename = "cpuCFSQuota", skip_serializing_if = "Option::is_none")]
    pub cpu_cfs_quota: Option<bool>,
    #[serde(rename = "cpuCFSQuotaPeriod", skip_serializing_if = "Option::is_none")]
    pub cpu_cfs_quota_period: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_manager_policy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub crash_loop_back_off: Option<CrashLoopBackOff>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enable_debugging_handlers: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enforce_node_allocatable: Option<Vec<String>>,
    #[serde(rename = "eventRecordQPS", skip_serializing_if = "Option::is_none")]
    pub event_record_qps: Option<i64>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub eviction_hard: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eviction_max_pod_grace_period: Option<i64>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub eviction_minimum_reclaim: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eviction_pressure_transition_period: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub eviction_soft: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub eviction_soft_grace_period: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fail_swap_on: Option<bool>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub feature_gates: BTreeMap<String, bool>,
    #[serde(rename = "hairpinMode", skip_serializing_if = "Option::is_none")]
    pub hairpin_mode: Option<String>,
    #[serde(rename = "imageGCHighThresholdPercent", skip_serializing_if = "Option::is_none")]
    pub image_gc_high_threshold_percent: Option<i64>,
    #[serde(rename = "imageGCLowThresholdPercent", skip_serializing_if = "Option::is_none")]
    pub image_gc_low_threshold_percent: Option<i64>,
    #[serde(rename = "imageMaximumGCAge", skip_serializing_if = "Option::is_none")]
    pub image_maximum_gc_age: Option<String>,
    #[serde(rename = "imageMinimumGCAge", skip_serializing_if = "Option::is_none")]
    pub image_minimum_gc_age: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_memcg_notification: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kube_reserved: Option<BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kube_reserved_cgroup: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubelet_cgroups: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logging: Option<Logging>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_parallel_image_pulls: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_pods: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_swap: Option<MemorySwap>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_lease_duration_seconds: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_status_update_frequency: Option<String>,
    #[serde(rename = "podCIDR", skip_serializing_if = "Option::is_none")]
    pub pod_cidr: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_pids_limit: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protect_kernel_defaults: Option<bool>,
    /// `aws:///<zone>/<instance-id>` on AWS (as kOps writes it): the Node carries its instance from
    /// registration on, so the cloud-controller-manager can always tell whether the instance still
    /// exists (it cannot look a terminated instance up by name).
    #[serde(rename = "providerID", skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_only_port: Option<i64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub register_with_taints: Vec<Taint>,
    #[serde(rename = "registryPullQPS", skip_serializing_if = "Option::is_none")]
    pub registry_pull_qps: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resolv_conf: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rotate_certificates: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seccomp_default: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serialize_image_pulls: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shutdown_grace_period: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shutdown_grace_period_critical_pods: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub static_pod_path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_cgroups: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_reserved: Option<BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_reserved_cgroup: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cipher_suites: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_min_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_private_key_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topology_manager_policy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_plugin_dir: Option<String>,
}

#[derive(Debug, Default, Serialize)]
pub struct Authentication {
    pub anonymous: Enabled,
    pub webhook: Webhook,
    pub x509: X509,
}

#[derive(Debug, Default, Serialize)]
pub struct Enabled {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Webhook {
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

#[derive(Debug, Serialize)]
pub struct Logging {
    pub format: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemorySwap {
    pub swap_behavior: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CrashLoopBackOff {
    pub max_container_restart_period: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Taint {
    pub key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    pub effect: String,
}

/// A kubelet field that cannot be rendered, named by its json key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("KubeletConfig.{field}: {message}")]
pub struct KubeletFieldError {
    pub field: &'static str,
    pub message: String,
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

/// kOps' comma-separated `key<sep>value` lists (`memory.available<100Mi`, `memory.available=30s`).
fn kv_list(field: &'static str, s: Option<&str>, sep: char) -> Result<BTreeMap<String, String>, KubeletFieldError> {
    let mut out = BTreeMap::new();
    for item in s.unwrap_or_default().split(',').filter(|p| !p.trim().is_empty()) {
        let (k, v) = item.split_once(sep).ok_or_else(|| KubeletFieldError { field, message: format!("{item:?}: expected key{sep}value") })?;
        out.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(out)
}

/// The kubelet's `serializeImagePulls`: the spec's when set; otherwise `false` on a control plane.
///
/// The kubelet's default (`true`) pulls one image at a time, in the order its pods ask. A
/// replacement control plane's static pods all ask at once as the kubelet starts, and kube-proxy's,
/// the scheduler's and the controller manager's pulls then stand before the API server's: measured
/// on keelson-local (release, 2026-11-27), the kubelet asked for the API server's image at once,
/// protokube had pulled it into containerd 7.7 s before the kubelet's serial queue reached it, and the
/// API server started 21.3 s after the kill. In parallel each static pod waits for its own image
/// only. Workers keep the kubelet's default (many images, pulled as pods are scheduled).
pub fn serialize_image_pulls(spec: Option<bool>, control_plane: bool) -> Option<bool> {
    spec.or(control_plane.then_some(false))
}

/// Go's `strconv.ParseBool`, as kOps parses feature-gate values.
fn go_bool(s: &str) -> Option<bool> {
    match s.trim() {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// Where the node's own settings come from (not the spec).
#[derive(Debug, Clone, Default)]
pub struct NodeSettings<'a> {
    /// containerd's socket (NodeupConfig `containerdConfig.address`).
    pub containerd_address: Option<&'a str>,
    /// This host issues the kubelet's serving certificate (control planes).
    pub serving_cert: bool,
    /// A control plane: its kubelet pulls images in parallel unless the spec sets
    /// `serializeImagePulls` (see [`serialize_image_pulls`]).
    pub control_plane: bool,
    pub provider_id: Option<String>,
}

/// The spec split in two: the configuration file, and a spec holding only the flag fields (for
/// the flag table, [`crate::flag_table::KUBELET_CONFIG_SPEC`]).
pub struct Split {
    pub config: KubeletConfiguration,
    pub flags: KubeletConfigSpec,
}

/// A refused field that is set: the error the support table gives.
fn refused(field: &'static str, set: bool) -> Result<(), KubeletFieldError> {
    if !set {
        return Ok(());
    }
    let message = match support::classify("KubeletConfigSpec", field) {
        Some(Use::Refused(why)) => why.to_string(),
        other => format!("not rendered ({other:?})"),
    };
    Err(KubeletFieldError { field, message })
}

/// Place every field of `spec`.
pub fn split(spec: &KubeletConfigSpec, node: &NodeSettings) -> Result<Split, KubeletFieldError> {
    let dur = |d: &Option<keelson_api::Duration>| d.as_ref().map(ToString::to_string);
    let KubeletConfigSpec {
        api_servers,
        anonymous_auth,
        authorization_mode,
        bootstrap_kubeconfig,
        client_ca_file,
        tls_cert_file,
        tls_private_key_file,
        tls_cipher_suites,
        tls_min_version,
        kubeconfig_path,
        require_kubeconfig,
        log_format,
        log_level,
        pod_manifest_path,
        hostname_override,
        pod_infra_container_image,
        seccomp_default,
        seccomp_profile_root,
        allow_privileged,
        enable_debugging_handlers,
        register_node,
        node_status_update_frequency,
        cluster_domain,
        cluster_dns,
        network_plugin_name,
        cloud_provider,
        kubelet_cgroups,
        runtime_cgroups,
        read_only_port,
        system_cgroups,
        cgroup_root,
        configure_cbr0,
        hairpin_mode,
        babysit_daemons,
        max_pods,
        nvidia_gpus,
        pod_cidr,
        resolv_conf,
        reconcile_cidr,
        register_schedulable,
        serialize_image_pulls: serialize_image_pulls_spec,
        node_labels,
        non_masquerade_cidr,
        enable_custom_metrics,
        network_plugin_mtu,
        image_minimum_gc_age,
        image_maximum_gc_age,
        max_parallel_image_pulls,
        image_gc_high_threshold_percent,
        image_gc_low_threshold_percent,
        image_pull_progress_deadline,
        eviction_hard,
        eviction_soft,
        eviction_soft_grace_period,
        eviction_pressure_transition_period,
        eviction_max_pod_grace_period,
        eviction_minimum_reclaim,
        volume_plugin_directory,
        taints,
        feature_gates,
        kernel_memcg_notification,
        kube_reserved,
        kube_reserved_cgroup,
        system_reserved,
        system_reserved_cgroup,
        enforce_node_allocatable,
        runtime_request_timeout,
        volume_stats_agg_period,
        fail_swap_on,
        experimental_allowed_unsafe_sysctls,
        allowed_unsafe_sysctls,
        streaming_connection_idle_timeout,
        docker_disable_shared_pid,
        root_dir,
        authentication_token_webhook,
        authentication_token_webhook_cache_ttl,
        cpu_cfs_quota,
        cpu_cfs_quota_period,
        cpu_manager_policy,
        registry_pull_qps,
        registry_burst,
        topology_manager_policy,
        rotate_certificates,
        protect_kernel_defaults,
        cgroup_driver,
        housekeeping_interval,
        event_qps,
        event_burst,
        container_log_max_size,
        container_log_max_files,
        enable_cadvisor_json_endpoints,
        pod_pids_limit,
        experimental_allocatable_ignore_eviction,
        shutdown_grace_period,
        shutdown_grace_period_critical_pods,
        memory_swap_behavior,
        crash_loop_back_off_max_container_restart_period,
        kube_apiqps,
        event_record_qps,
        node_lease_duration_seconds,
    } = spec.clone();

    // Refused: no kubelet of a supported version has them (validation names their spec path).
    refused("apiServers", api_servers.is_some())?;
    refused("tlsCertFile", tls_cert_file.is_some())?;
    refused("tlsPrivateKeyFile", tls_private_key_file.is_some())?;
    refused("requireKubeconfig", require_kubeconfig.is_some())?;
    refused("podInfraContainerImage", pod_infra_container_image.is_some())?;
    refused("seccompProfileRoot", seccomp_profile_root.is_some())?;
    refused("allowPrivileged", allow_privileged.is_some())?;
    refused("networkPluginName", network_plugin_name.is_some())?;
    refused("configureCbr0", configure_cbr0.is_some())?;
    refused("babysitDaemons", babysit_daemons.is_some())?;
    refused("nvidiaGPUs", nvidia_gpus.is_some())?;
    refused("reconcileCIDR", reconcile_cidr.is_some())?;
    refused("nonMasqueradeCIDR", non_masquerade_cidr.is_some())?;
    refused("enableCustomMetrics", enable_custom_metrics.is_some())?;
    refused("networkPluginMTU", network_plugin_mtu.is_some())?;
    refused("imagePullProgressDeadline", image_pull_progress_deadline.is_some())?;
    refused("dockerDisableSharedPID", docker_disable_shared_pid.is_some())?;
    refused("enableCadvisorJsonEndpoints", enable_cadvisor_json_endpoints.is_some())?;

    // Flags (kOps' `flag:` tags; the flag table renders them).
    let flags = KubeletConfigSpec {
        bootstrap_kubeconfig,
        kubeconfig_path,
        log_level,
        hostname_override,
        register_node,
        cloud_provider,
        runtime_cgroups,
        register_schedulable,
        node_labels,
        runtime_request_timeout,
        volume_stats_agg_period,
        streaming_connection_idle_timeout,
        root_dir,
        authentication_token_webhook_cache_ttl,
        registry_burst,
        housekeeping_interval,
        event_burst,
        experimental_allocatable_ignore_eviction,
        kube_apiqps,
        ..KubeletConfigSpec::default()
    };

    // The configuration file.
    let register_with_taints =
        taints.iter().flatten().map(|t| parse_taint(t)).collect::<Result<Vec<_>, _>>().map_err(|message| KubeletFieldError { field: "taints", message })?;
    let feature_gates = feature_gates
        .iter()
        .flatten()
        .map(|(k, v)| {
            go_bool(v).map(|b| (k.clone(), b)).ok_or_else(|| KubeletFieldError { field: "featureGates", message: format!("{k}={v:?}: not a boolean") })
        })
        .collect::<Result<BTreeMap<_, _>, _>>()?;
    let unsafe_sysctls: Vec<String> = experimental_allowed_unsafe_sysctls.into_iter().flatten().chain(allowed_unsafe_sysctls.into_iter().flatten()).collect();
    let config = KubeletConfiguration {
        api_version: "kubelet.config.k8s.io/v1beta1",
        kind: "KubeletConfiguration",
        allowed_unsafe_sysctls: (!unsafe_sysctls.is_empty()).then_some(unsafe_sysctls),
        authentication: Authentication {
            anonymous: Enabled { enabled: anonymous_auth },
            // Written out, not left to the configuration file's defaults: a kubelet whose API
            // authenticates bearer tokens with the API server and asks it to authorize every call.
            webhook: Webhook { enabled: Some(authentication_token_webhook.unwrap_or(true)) },
            // The cluster CA nodeup writes, unless the spec names another file.
            x509: X509 { client_ca_file: Some(client_ca_file.unwrap_or_else(|| paths::CA_CRT.into())) },
        },
        authorization: Authorization { mode: Some(authorization_mode.unwrap_or_else(|| "Webhook".into())) },
        cgroup_driver,
        cgroup_root,
        cluster_dns: cluster_dns.into_iter().collect(),
        cluster_domain,
        container_log_max_files,
        container_log_max_size,
        container_runtime_endpoint: format!("unix://{}", node.containerd_address.unwrap_or(paths::CONTAINERD_SOCKET)),
        cpu_cfs_quota,
        cpu_cfs_quota_period: dur(&cpu_cfs_quota_period),
        cpu_manager_policy,
        crash_loop_back_off: dur(&crash_loop_back_off_max_container_restart_period).map(|p| CrashLoopBackOff { max_container_restart_period: p }),
        enable_debugging_handlers,
        enforce_node_allocatable: enforce_node_allocatable.map(|e| e.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect()),
        // kOps: eventQPS, the older name, wins.
        event_record_qps: event_qps.or(event_record_qps),
        eviction_hard: kv_list("evictionHard", eviction_hard.as_deref(), '<')?,
        eviction_max_pod_grace_period,
        eviction_minimum_reclaim: kv_list("evictionMinimumReclaim", eviction_minimum_reclaim.as_deref(), '=')?,
        eviction_pressure_transition_period: dur(&eviction_pressure_transition_period),
        eviction_soft: kv_list("evictionSoft", eviction_soft.as_deref(), '<')?,
        eviction_soft_grace_period: kv_list("evictionSoftGracePeriod", eviction_soft_grace_period.as_deref(), '=')?,
        fail_swap_on,
        feature_gates,
        hairpin_mode,
        image_gc_high_threshold_percent,
        image_gc_low_threshold_percent,
        image_maximum_gc_age: dur(&image_maximum_gc_age),
        image_minimum_gc_age: dur(&image_minimum_gc_age),
        kernel_memcg_notification,
        kube_reserved,
        kube_reserved_cgroup,
        kubelet_cgroups,
        logging: log_format.map(|format| Logging { format }),
        max_parallel_image_pulls,
        max_pods,
        memory_swap: memory_swap_behavior.map(|swap_behavior| MemorySwap { swap_behavior }),
        node_lease_duration_seconds,
        node_status_update_frequency: dur(&node_status_update_frequency),
        pod_cidr: pod_cidr.map(|c| c.to_string()),
        pod_pids_limit,
        protect_kernel_defaults,
        provider_id: node.provider_id.clone(),
        read_only_port,
        register_with_taints,
        registry_pull_qps,
        resolv_conf,
        rotate_certificates,
        seccomp_default,
        serialize_image_pulls: serialize_image_pulls(serialize_image_pulls_spec, node.control_plane),
        shutdown_grace_period: dur(&shutdown_grace_period),
        shutdown_grace_period_critical_pods: dur(&shutdown_grace_period_critical_pods),
        static_pod_path: pod_manifest_path,
        system_cgroups,
        system_reserved,
        system_reserved_cgroup,
        tls_cert_file: node.serving_cert.then(|| format!("{}/kubelet-server.crt", paths::SRV_KUBERNETES)),
        tls_cipher_suites,
        tls_min_version,
        tls_private_key_file: node.serving_cert.then(|| format!("{}/kubelet-server.key", paths::SRV_KUBERNETES)),
        topology_manager_policy,
        volume_plugin_dir: volume_plugin_directory,
    };
    Ok(Split { config, flags })
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
    fn refused_and_malformed_fields_are_named() {
        let spec: KubeletConfigSpec = serde_yaml_ng::from_str("networkPluginName: cni\n").expect("yaml");
        let e = split(&spec, &NodeSettings::default()).err().expect("refused");
        assert_eq!(e.field, "networkPluginName");
        assert!(e.message.contains("dockershim"), "{e}");
        let spec: KubeletConfigSpec = serde_yaml_ng::from_str("featureGates: {A: maybe}\n").expect("yaml");
        assert_eq!(split(&spec, &NodeSettings::default()).err().map(|e| e.field), Some("featureGates"));
        let spec: KubeletConfigSpec = serde_yaml_ng::from_str("evictionSoft: memory.available=1Gi\n").expect("yaml");
        assert_eq!(split(&spec, &NodeSettings::default()).err().map(|e| e.field), Some("evictionSoft"));
    }

    #[test]
    fn event_qps_wins_and_unsafe_sysctls_merge() {
        let spec: KubeletConfigSpec = serde_yaml_ng::from_str(
            "eventQPS: 7\neventRecordQPS: 9\nexperimentalAllowedUnsafeSysctls: [net.a]\nallowedUnsafeSysctls: [net.b]\nimageMinimumGCAge: 3m\n",
        )
        .expect("yaml");
        let s = split(&spec, &NodeSettings::default()).expect("split");
        assert_eq!(s.config.event_record_qps, Some(7));
        assert_eq!(s.config.allowed_unsafe_sysctls, Some(vec!["net.a".to_string(), "net.b".to_string()]));
        assert_eq!(s.config.image_minimum_gc_age.as_deref(), Some("3m0s"));
        assert_eq!(s.flags, KubeletConfigSpec::default(), "config fields are not flags");
    }

    #[test]
    fn control_planes_pull_in_parallel_unless_the_spec_says_otherwise() {
        assert_eq!(serialize_image_pulls(None, true), Some(false));
        assert_eq!(serialize_image_pulls(None, false), None, "workers keep the kubelet's default");
        assert_eq!(serialize_image_pulls(Some(true), true), Some(true), "the spec wins");
        assert_eq!(serialize_image_pulls(Some(false), false), Some(false));
        let control_plane = NodeSettings { control_plane: true, ..Default::default() };
        assert_eq!(split(&KubeletConfigSpec::default(), &control_plane).expect("split").config.serialize_image_pulls, Some(false));
        assert_eq!(split(&KubeletConfigSpec::default(), &NodeSettings::default()).expect("split").config.serialize_image_pulls, None);
        let serial: KubeletConfigSpec = serde_yaml_ng::from_str("serializeImagePulls: true\n").expect("yaml");
        assert_eq!(split(&serial, &control_plane).expect("split").config.serialize_image_pulls, Some(true));
    }
}
