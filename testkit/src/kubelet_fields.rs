//! The all-fields kubelet configuration: every `KubeletConfigSpec` field Keelson supports
//! (`keelson_api::support::KUBELET`), each set to a non-default value in a NodeupConfig, with what it
//! must render to. Two tests share it: nodeup's `tests/render.rs` finds every value in the rendered
//! `kubelet.conf` or among the kubelet's flags, and keelson-local's `tests/tests/kubelet.rs` runs the
//! real kubelet on that render (so the key names and value shapes are the kubelet's own).
//!
//! The values are one configuration the kubelet accepts as a whole: its validation ties some fields
//! together (`cpuCFSQuotaPeriod` needs the `CustomCPUCFSQuotaPeriod` gate,
//! `crashLoopBackOffMaxContainerRestartPeriod` the `KubeletCrashLoopBackOffMax` gate, `systemCgroups`
//! a `cgroupRoot`, `enforceNodeAllocatable: system-reserved` a `systemReservedCgroup`,
//! `imageGCLowThresholdPercent` < `imageGCHighThresholdPercent`, `imageMaximumGCAge` >
//! `imageMinimumGCAge`, `maxParallelImagePulls` > 1 only with `serializeImagePulls: false`).

use keelson_api::support::{Use, KUBELET, VERSION_BOUND};

/// One field of `KubeletConfigSpec` in the all-fields configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KubeletField {
    /// The spec's json key.
    pub key: &'static str,
    /// Its value in the NodeupConfig (YAML).
    pub value: &'static str,
    /// What it renders to: the `kubelet.conf` value (YAML) or the flag's value.
    pub rendered: &'static str,
}

const fn k(key: &'static str, value: &'static str, rendered: &'static str) -> KubeletField {
    KubeletField { key, value, rendered }
}

/// Every supported field ([`unlisted`] says none is missing), none at its default.
pub const FIELDS: &[KubeletField] = &[
    k("anonymousAuth", "true", "true"),
    k("authorizationMode", "AlwaysAllow", "AlwaysAllow"),
    k("bootstrapKubeconfig", "/var/lib/kubelet/other-bootstrap", "/var/lib/kubelet/other-bootstrap"),
    k("clientCaFile", "/srv/kubernetes/other-ca.crt", "/srv/kubernetes/other-ca.crt"),
    k("tlsCipherSuites", "[TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]", "[TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]"),
    k("tlsMinVersion", "VersionTLS13", "VersionTLS13"),
    k("kubeconfigPath", "/var/lib/kubelet/kubeconfig2", "/var/lib/kubelet/kubeconfig2"),
    k("logFormat", "json", "json"),
    k("logLevel", "4", "4"),
    k("podManifestPath", "/etc/kubernetes/static", "/etc/kubernetes/static"),
    k("hostnameOverride", "node-x.example.com", "node-x.example.com"),
    k("seccompDefault", "true", "true"),
    k("enableDebuggingHandlers", "false", "false"),
    k("registerNode", "false", "false"),
    k("nodeStatusUpdateFrequency", "20s", "20s"),
    k("clusterDomain", "example.local", "example.local"),
    k("clusterDNS", "10.0.0.53", "[10.0.0.53]"),
    k("cloudProvider", "external", "external"),
    k("kubeletCgroups", "/kubelet.slice", "/kubelet.slice"),
    k("runtimeCgroups", "/system.slice/containerd.service", "/system.slice/containerd.service"),
    k("readOnlyPort", "10255", "10255"),
    k("systemCgroups", "/system.slice", "/system.slice"),
    k("cgroupRoot", "/pods", "/pods"),
    k("hairpinMode", "hairpin-veth", "hairpin-veth"),
    k("maxPods", "55", "55"),
    k("podCIDR", "10.200.0.0/24", "10.200.0.0/24"),
    k("resolvConf", "/run/systemd/resolve/resolv.conf", "/run/systemd/resolve/resolv.conf"),
    k("registerSchedulable", "false", "false"),
    k("serializeImagePulls", "false", "false"),
    k("nodeLabels", "{example.com/role: web}", "example.com/role=web"),
    k("imageMinimumGCAge", "3m", "3m0s"),
    k("imageMaximumGCAge", "168h", "168h0m0s"),
    k("maxParallelImagePulls", "3", "3"),
    k("imageGCHighThresholdPercent", "80", "80"),
    k("imageGCLowThresholdPercent", "70", "70"),
    k("evictionHard", "memory.available<200Mi,nodefs.available<5%", "{memory.available: 200Mi, nodefs.available: 5%}"),
    k("evictionSoft", "memory.available<300Mi", "{memory.available: 300Mi}"),
    k("evictionSoftGracePeriod", "memory.available=30s", "{memory.available: 30s}"),
    k("evictionPressureTransitionPeriod", "45s", "45s"),
    k("evictionMaxPodGracePeriod", "60", "60"),
    k("evictionMinimumReclaim", "memory.available=100Mi", "{memory.available: 100Mi}"),
    k("volumePluginDirectory", "/usr/libexec/kubernetes/plugins", "/usr/libexec/kubernetes/plugins"),
    k("taints", "['example.com/t=v:NoSchedule']", "[{key: example.com/t, value: v, effect: NoSchedule}]"),
    // The two gates the kubelet's validation asks for (cpuCFSQuotaPeriod, crashLoopBackOff).
    k(
        "featureGates",
        "{ImageVolume: 'false', CustomCPUCFSQuotaPeriod: 'true', KubeletCrashLoopBackOffMax: 'true'}",
        "{ImageVolume: false, CustomCPUCFSQuotaPeriod: true, KubeletCrashLoopBackOffMax: true}",
    ),
    k("kernelMemcgNotification", "true", "true"),
    k("kubeReserved", "{cpu: 100m}", "{cpu: 100m}"),
    k("kubeReservedCgroup", "/kube-reserved", "/kube-reserved"),
    k("systemReserved", "{memory: 100Mi}", "{memory: 100Mi}"),
    k("systemReservedCgroup", "/system-reserved", "/system-reserved"),
    k("enforceNodeAllocatable", "pods,system-reserved", "[pods, system-reserved]"),
    k("runtimeRequestTimeout", "3m", "3m0s"),
    k("volumeStatsAggPeriod", "2m", "2m0s"),
    k("failSwapOn", "false", "false"),
    k("experimentalAllowedUnsafeSysctls", "[net.core.a]", "[net.core.a, net.core.b]"),
    k("allowedUnsafeSysctls", "[net.core.b]", "[net.core.a, net.core.b]"),
    k("streamingConnectionIdleTimeout", "5m", "5m0s"),
    k("rootDir", "/var/lib/kubelet2", "/var/lib/kubelet2"),
    k("authenticationTokenWebhook", "true", "true"),
    k("authenticationTokenWebhookCacheTtl", "30s", "30s"),
    k("cpuCFSQuota", "false", "false"),
    k("cpuCFSQuotaPeriod", "50ms", "50ms"),
    k("cpuManagerPolicy", "static", "static"),
    k("registryPullQPS", "7", "7"),
    k("registryBurst", "20", "20"),
    k("topologyManagerPolicy", "best-effort", "best-effort"),
    k("rotateCertificates", "true", "true"),
    k("protectKernelDefaults", "false", "false"),
    k("cgroupDriver", "cgroupfs", "cgroupfs"),
    k("housekeepingInterval", "20s", "20s"),
    k("eventBurst", "30", "30"),
    k("containerLogMaxSize", "20Mi", "20Mi"),
    k("containerLogMaxFiles", "4", "4"),
    k("podPidsLimit", "1000", "1000"),
    k("experimentalAllocatableIgnoreEviction", "true", "true"),
    k("shutdownGracePeriod", "45s", "45s"),
    k("shutdownGracePeriodCriticalPods", "15s", "15s"),
    k("memorySwapBehavior", "LimitedSwap", "LimitedSwap"),
    k("crashLoopBackOffMaxContainerRestartPeriod", "1m", "1m0s"),
    k("kubeAPIQPS", "60", "60"),
    k("eventRecordQPS", "9", "9"),
    k("nodeLeaseDurationSeconds", "50", "50"),
];

/// Fields that map to the same place as another one and are checked in a second render:
/// kOps' `eventQPS` is the older name of `eventRecordQPS` and wins over it.
pub const SHADOWING: &[KubeletField] = &[k("eventQPS", "7", "7")];

/// Supported fields (placed in `kubelet.conf` or on the command line by [`KUBELET`]) that neither
/// [`FIELDS`] nor [`SHADOWING`] sets: empty, or a test is missing a field.
pub fn unlisted() -> Vec<&'static str> {
    KUBELET
        .iter()
        .filter(|f| matches!(f.used, Use::KubeletConfig(_) | Use::KubeletFlag(_)))
        .map(|f| f.key)
        .filter(|key| !FIELDS.iter().chain(SHADOWING).any(|x| x.key == *key))
        .collect()
}

/// [`FIELDS`] less those `keelson validate` refuses for Kubernetes `version` (`major.minor[.patch]`,
/// [`VERSION_BOUND`]): they never reach a node of that version.
pub fn for_version(version: &str) -> Vec<KubeletField> {
    let mut parts = version.trim_start_matches('v').split('.').map(|p| p.parse::<u64>().unwrap_or(0));
    let v = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    FIELDS.iter().copied().filter(|f| !VERSION_BOUND.iter().any(|(ty, key, gone, _)| *ty == "KubeletConfigSpec" && *key == f.key && v >= *gone)).collect()
}

/// A NodeupConfig's text with its `KubeletConfig` section replaced by `fields`.
pub fn with_kubelet(nodeup_config: &str, fields: &[KubeletField]) -> String {
    let mut out = String::new();
    let mut replacing = false;
    for line in nodeup_config.lines() {
        if line == "KubeletConfig:" {
            out.push_str("KubeletConfig:\n");
            for f in fields {
                out.push_str(&format!("  {}: {}\n", f.key, f.value));
            }
            replacing = true;
            continue;
        }
        if replacing && line.starts_with(' ') {
            continue;
        }
        replacing = false;
        out.push_str(line);
        out.push('\n');
    }
    assert!(fields.is_empty() || out.contains(&format!("  {}: ", fields[0].key)), "the NodeupConfig has a KubeletConfig section");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_supported_field_is_set_once() {
        assert!(unlisted().is_empty(), "supported, but not in FIELDS: {:?}", unlisted());
        let mut keys: Vec<&str> = FIELDS.iter().chain(SHADOWING).map(|f| f.key).collect();
        keys.sort_unstable();
        let n = keys.len();
        keys.dedup();
        assert_eq!(keys.len(), n, "a field is listed twice");
    }

    #[test]
    fn version_bound_fields_are_left_out_from_their_version_on() {
        assert!(for_version("1.33.5").iter().any(|f| f.key == "registerSchedulable"));
        assert!(!for_version("1.34.4").iter().any(|f| f.key == "registerSchedulable"));
        assert!(!for_version("v1.35").iter().any(|f| f.key == "registerSchedulable"));
        assert_eq!(for_version("1.34.4").len(), FIELDS.len() - 1);
    }

    #[test]
    fn the_kubelet_section_is_replaced_and_the_rest_kept() {
        let text = "A: 1\nKubeletConfig:\n  maxPods: 10\n  x: y\nKubernetesVersion: 1.34.4\n";
        let out = with_kubelet(text, &[k("logLevel", "4", "4")]);
        assert_eq!(out, "A: 1\nKubeletConfig:\n  logLevel: 4\nKubernetesVersion: 1.34.4\n");
    }
}
