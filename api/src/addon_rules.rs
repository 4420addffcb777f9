//! kOps' validation of the addon-bearing fields of the cluster spec (its `validation.go`), each
//! problem with its field path. [`crate::validate`] reports them for every command; what Keelson
//! renders but does not run is refused separately ([`crate::support`]).

use crate::generated::ClusterSpec;
use crate::image::ImageReference;
use crate::types::Duration;

/// Whether kOps counts cert-manager as on (its `IsCertManagerEnabled`): `spec.certManager.enabled`.
pub fn cert_manager_enabled(spec: &ClusterSpec) -> bool {
    spec.cert_manager.as_ref().and_then(|c| c.enabled) == Some(true)
}

/// `spec.metricsServer`: a set image must be an image reference; an enabled metrics-server whose
/// `insecure` is not `true` serves its API with a cert-manager certificate, so kOps requires
/// cert-manager (its rule reads an unset `insecure` as secure, although the template then renders
/// the insecure addon).
pub fn metrics_server(spec: &ClusterSpec) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let Some(ms) = spec.metrics_server.as_ref() else { return out };
    if let Some(image) = ms.image.as_deref() {
        if let Err(e) = image.parse::<ImageReference>() {
            out.push(("spec.metricsServer.image".to_string(), e.to_string()));
        }
    }
    if ms.enabled == Some(true) && ms.insecure != Some(true) && !cert_manager_enabled(spec) {
        out.push((
            "spec.metricsServer.insecure".to_string(),
            "a secure metrics-server (insecure unset or false) needs cert-manager (spec.certManager.enabled: true), as kOps requires; set insecure: true"
                .to_string(),
        ));
    }
    out
}

/// `spec.kubeDNS.nodeLocalDNS`: kOps' rules (a `localIP` that is an IP address; with IPVS
/// kube-proxy or Cilium, a `kubelet.clusterDNS` the user set must be that IP, since node-local-dns
/// sets up no iptables interception) and two of Keelson's: a set image must be an image reference,
/// and `additionalConfig` beside `externalCoreFile` is refused, because kOps' template drops it
/// without a word.
pub fn node_local_dns(spec: &ClusterSpec) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let Some(nl) = spec.kube_dns.as_ref().and_then(|k| k.node_local_dns.as_ref()) else { return out };
    let path = |leaf: &str| format!("spec.kubeDNS.nodeLocalDNS.{leaf}");
    if let Some(image) = nl.image.as_deref() {
        if let Err(e) = image.parse::<ImageReference>() {
            out.push((path("image"), e.to_string()));
        }
    }
    let local_ip = nl.local_ip.as_deref().filter(|ip| !ip.is_empty());
    if let Some(ip) = local_ip {
        if ip.parse::<std::net::IpAddr>().is_err() {
            out.push((path("localIP"), format!("{ip:?} is not an IP address (expected e.g. 169.254.20.10, a link-local address no node or pod uses)")));
        }
    }
    let has_external = nl.external_core_file.as_deref().is_some_and(|c| !c.trim().is_empty());
    if has_external && nl.additional_config.as_deref().is_some_and(|c| !c.trim().is_empty()) {
        out.push((
            path("additionalConfig"),
            "is ignored when externalCoreFile is set (the external Corefile replaces the whole Corefile): put it in externalCoreFile".to_string(),
        ));
    }
    let ipvs = spec.kube_proxy.as_ref().and_then(|k| k.proxy_mode.as_deref()) == Some("ipvs");
    let cilium = spec.networking.as_ref().is_some_and(|n| n.cilium.is_some());
    if nl.enabled == Some(true) && (ipvs || cilium) {
        for (field, kubelet) in [("kubelet", &spec.kubelet), ("controlPlaneKubelet", &spec.master_kubelet)] {
            let dns = kubelet.as_ref().and_then(|k| k.cluster_dns.as_deref()).filter(|d| !d.is_empty());
            if let Some(dns) = dns.filter(|d| Some(*d) != local_ip) {
                out.push((
                    format!("spec.{field}.clusterDNS"),
                    format!(
                        "is {dns}, but with node-local-dns under {} the kubelets must name its local IP {} (leave clusterDNS unset)",
                        if ipvs { "IPVS kube-proxy" } else { "Cilium" },
                        local_ip.unwrap_or("169.254.20.10")
                    ),
                ));
            }
        }
    }
    out
}

/// `spec.snapshotController`: the default snapshot class it installs is the EBS CSI driver's, which
/// runs only on AWS (kOps renders it on any cloud). kOps also requires cert-manager for its
/// validation webhook; the external-snapshotter release Keelson renders has none.
pub fn snapshot_controller(spec: &ClusterSpec) -> Vec<(String, String)> {
    let Some(sc) = spec.snapshot_controller.as_ref() else { return Vec::new() };
    let cloud = spec.cloud_provider.as_deref().unwrap_or("");
    if sc.enabled == Some(true) && sc.install_default_class == Some(true) && cloud != "aws" {
        return vec![(
            "spec.snapshotController.installDefaultClass".to_string(),
            format!("the default snapshot class is the EBS CSI driver's, which runs only on AWS, not on {cloud:?}: leave it unset"),
        )];
    }
    Vec::new()
}

/// `spec.networking.flannel` (kOps' `validateNetworkingFlannel`): no IPv6-only cluster, and a
/// backend, `udp` or `vxlan`, must be named (kOps' template would fall back to `udp`).
pub fn flannel(spec: &ClusterSpec) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let Some(f) = spec.networking.as_ref().and_then(|n| n.flannel.as_ref()) else { return out };
    if spec.non_masquerade_cidr.is_some_and(|c| c.is_ipv6()) {
        out.push(("spec.networking.flannel".to_string(), "Flannel does not support IPv6 (kOps refuses it too)".to_string()));
    }
    match f.backend.as_deref() {
        None | Some("") => out.push(("spec.networking.flannel.backend".to_string(), "Flannel backend must be specified (vxlan or udp)".to_string())),
        Some("udp" | "vxlan") => {}
        Some(other) => out.push(("spec.networking.flannel.backend".to_string(), format!("unsupported value {other:?}: supported values: \"udp\", \"vxlan\""))),
    }
    out
}

/// The expanders kOps accepts (`validateClusterAutoscaler`).
pub const CLUSTER_AUTOSCALER_EXPANDERS: &[&str] = &["least-waste", "random", "most-pods", "price", "priority"];

/// `spec.clusterAutoscaler`, kOps' rules (an expander it knows; `price` only on GCE; not on OpenStack)
/// and what cluster-autoscaler itself would exit on: a set image must be an image reference, the
/// times Go durations, the utilization threshold a number from 0 to 1, and the custom priorities'
/// keys integers (the priority expander's ConfigMap).
pub fn cluster_autoscaler(spec: &ClusterSpec) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let Some(ca) = spec.cluster_autoscaler.as_ref() else { return out };
    let path = |key: &str| format!("spec.clusterAutoscaler.{key}");
    if let Some(e) = ca.expander.as_deref().filter(|e| !e.is_empty()) {
        if !CLUSTER_AUTOSCALER_EXPANDERS.contains(&e) {
            out.push((path("expander"), format!("{e:?}: expected one of {}", CLUSTER_AUTOSCALER_EXPANDERS.join(", "))));
        } else if e == "price" && spec.cloud_provider.as_deref() != Some("gce") {
            out.push((path("expander"), "the price expander is only supported on GCE (kOps' rule)".to_string()));
        }
    }
    if ca.enabled == Some(true) && spec.cloud_provider.as_deref() == Some("openstack") {
        out.push(("spec.clusterAutoscaler".to_string(), "the cluster autoscaler is not supported on OpenStack (kOps' rule)".to_string()));
    }
    if let Some(image) = ca.image.as_deref() {
        if let Err(e) = image.parse::<ImageReference>() {
            out.push((path("image"), e.to_string()));
        }
    }
    let durations = [
        ("newPodScaleUpDelay", &ca.new_pod_scale_up_delay),
        ("scaleDownDelayAfterAdd", &ca.scale_down_delay_after_add),
        ("scaleDownUnneededTime", &ca.scale_down_unneeded_time),
        ("scaleDownUnreadyTime", &ca.scale_down_unready_time),
        ("maxNodeProvisionTime", &ca.max_node_provision_time),
    ];
    for (key, value) in durations {
        if let Some(v) = value.as_deref().filter(|v| !v.is_empty()) {
            if let Err(e) = v.parse::<Duration>() {
                out.push((path(key), e.to_string()));
            }
        }
    }
    if let Some(t) = ca.scale_down_utilization_threshold.as_deref() {
        if !t.trim().parse::<f64>().is_ok_and(|t| (0.0..=1.0).contains(&t)) {
            out.push((path("scaleDownUtilizationThreshold"), format!("{t:?}: expected a number from 0 to 1")));
        }
    }
    for key in ca.custom_priority_expander_config.iter().flat_map(|m| m.keys()) {
        if key.parse::<i64>().is_err() {
            out.push((format!("{}[{key}]", path("customPriorityExpanderConfig")), format!("{key:?}: a priority is an integer")));
        }
    }
    out
}

/// Every problem of the addon-bearing fields: (field path, message).
pub fn check(spec: &ClusterSpec) -> Vec<(String, String)> {
    let mut out = metrics_server(spec);
    out.extend(node_local_dns(spec));
    out.extend(snapshot_controller(spec));
    out.extend(flannel(spec));
    out.extend(cluster_autoscaler(spec));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generated::{
        CertManagerConfig, ClusterAutoscalerConfig, KubeDNSConfig, KubeProxyConfig, KubeletConfigSpec, MetricsServerConfig, NodeLocalDNSConfig,
        SnapshotControllerConfig,
    };

    fn spec(ms: MetricsServerConfig, cert_manager: bool) -> ClusterSpec {
        ClusterSpec {
            metrics_server: Some(ms),
            cert_manager: cert_manager.then(|| CertManagerConfig { enabled: Some(true), ..Default::default() }),
            ..Default::default()
        }
    }

    fn paths(spec: &ClusterSpec) -> Vec<String> {
        check(spec).into_iter().map(|(p, _)| p).collect::<Vec<_>>()
    }

    #[test]
    fn cluster_autoscaler_follows_kops_rules_and_its_flags_parse() {
        let ca =
            |c: ClusterAutoscalerConfig, cloud: &str| ClusterSpec { cluster_autoscaler: Some(c), cloud_provider: Some(cloud.into()), ..Default::default() };
        let on = ClusterAutoscalerConfig { enabled: Some(true), ..Default::default() };
        assert!(paths(&ca(on.clone(), "aws")).is_empty());
        for e in CLUSTER_AUTOSCALER_EXPANDERS.iter().filter(|e| **e != "price") {
            assert!(paths(&ca(ClusterAutoscalerConfig { expander: Some(e.to_string()), ..on.clone() }, "aws")).is_empty(), "{e}");
        }
        assert_eq!(paths(&ca(ClusterAutoscalerConfig { expander: Some("cheapest".into()), ..on.clone() }, "aws")), ["spec.clusterAutoscaler.expander"]);
        assert_eq!(paths(&ca(ClusterAutoscalerConfig { expander: Some("price".into()), ..on.clone() }, "aws")), ["spec.clusterAutoscaler.expander"]);
        assert!(paths(&ca(ClusterAutoscalerConfig { expander: Some("price".into()), ..on.clone() }, "gce")).is_empty());
        assert_eq!(paths(&ca(on.clone(), "openstack")), ["spec.clusterAutoscaler"]);
        let bad = ClusterAutoscalerConfig {
            image: Some("Bad Image".into()),
            scale_down_unneeded_time: Some("ten minutes".into()),
            max_node_provision_time: Some("15m0s".into()),
            scale_down_utilization_threshold: Some("1.5".into()),
            custom_priority_expander_config: Some([("high".to_string(), vec![".*".to_string()]), ("10".to_string(), vec![".*".to_string()])].into()),
            ..on.clone()
        };
        assert_eq!(
            paths(&ca(bad, "aws")),
            [
                "spec.clusterAutoscaler.image",
                "spec.clusterAutoscaler.scaleDownUnneededTime",
                "spec.clusterAutoscaler.scaleDownUtilizationThreshold",
                "spec.clusterAutoscaler.customPriorityExpanderConfig[high]"
            ]
        );
        // Checked also when off (the values are kept in the spec), as kOps validates them.
        let off = ClusterAutoscalerConfig { enabled: Some(false), scale_down_delay_after_add: Some("1x".into()), ..Default::default() };
        assert_eq!(paths(&ca(off, "aws")), ["spec.clusterAutoscaler.scaleDownDelayAfterAdd"]);
    }

    #[test]
    fn metrics_server_follows_kops_rules() {
        let on = |insecure: Option<bool>| MetricsServerConfig { enabled: Some(true), insecure, ..Default::default() };
        // kOps: an enabled metrics-server that is not insecure needs cert-manager.
        assert_eq!(paths(&spec(on(None), false)), ["spec.metricsServer.insecure"]);
        assert_eq!(paths(&spec(on(Some(false)), false)), ["spec.metricsServer.insecure"]);
        assert!(paths(&spec(on(Some(true)), false)).is_empty());
        assert!(paths(&spec(on(None), true)).is_empty());
        assert!(paths(&spec(on(Some(false)), true)).is_empty());
        // Off: nothing to check but the image.
        assert!(paths(&spec(MetricsServerConfig { enabled: Some(false), ..Default::default() }, false)).is_empty());
        assert!(paths(&spec(MetricsServerConfig::default(), false)).is_empty());
        let bad = MetricsServerConfig { enabled: Some(false), image: Some("Registry/ms:v 1".into()), ..Default::default() };
        let errors = check(&spec(bad, false));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].0, "spec.metricsServer.image");
        assert!(errors[0].1.contains("\"Registry/ms:v 1\" is not an image reference"), "{}", errors[0].1);
        let good = MetricsServerConfig { image: Some("172.20.255.254:5000/metrics-server-metrics-server:v0.8.0".into()), ..on(Some(true)) };
        assert!(check(&spec(good, false)).is_empty());
    }

    fn node_local(nl: NodeLocalDNSConfig) -> ClusterSpec {
        ClusterSpec { kube_dns: Some(KubeDNSConfig { node_local_dns: Some(nl), ..Default::default() }), ..Default::default() }
    }

    #[test]
    fn node_local_dns_follows_kops_rules() {
        let on = NodeLocalDNSConfig { enabled: Some(true), local_ip: Some("169.254.20.10".into()), ..Default::default() };
        assert!(check(&node_local(on.clone())).is_empty());
        let bad_ip = NodeLocalDNSConfig { local_ip: Some("169.254.20".into()), ..on.clone() };
        let errors = check(&node_local(bad_ip));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].0, "spec.kubeDNS.nodeLocalDNS.localIP");
        assert!(errors[0].1.contains("\"169.254.20\" is not an IP address"), "{}", errors[0].1);
        let both = NodeLocalDNSConfig { external_core_file: Some(".:53 {}".into()), additional_config: Some("x:53 {}".into()), ..on.clone() };
        assert_eq!(paths(&node_local(both)), ["spec.kubeDNS.nodeLocalDNS.additionalConfig"]);
        let image = NodeLocalDNSConfig { image: Some("Bad Image".into()), ..on.clone() };
        assert_eq!(paths(&node_local(image)), ["spec.kubeDNS.nodeLocalDNS.image"]);
        // IPVS: a cluster DNS server other than the local IP is refused; the local IP or unset is fine.
        let mut spec = node_local(on.clone());
        spec.kube_proxy = Some(KubeProxyConfig { proxy_mode: Some("ipvs".into()), ..Default::default() });
        spec.kubelet = Some(KubeletConfigSpec { cluster_dns: Some("100.64.0.10".into()), ..Default::default() });
        spec.master_kubelet = Some(KubeletConfigSpec { cluster_dns: Some("169.254.20.10".into()), ..Default::default() });
        assert_eq!(paths(&spec), ["spec.kubelet.clusterDNS"]);
        // iptables kube-proxy: kOps does not check it.
        spec.kube_proxy = None;
        assert!(paths(&spec).is_empty());
        // Off: only the shapes of the values are checked.
        spec.kube_dns.as_mut().unwrap().node_local_dns.as_mut().unwrap().enabled = Some(false);
        spec.kube_proxy = Some(KubeProxyConfig { proxy_mode: Some("ipvs".into()), ..Default::default() });
        assert!(paths(&spec).is_empty());
    }

    #[test]
    fn the_default_snapshot_class_only_on_aws() {
        let on = |cloud: &str| ClusterSpec {
            cloud_provider: Some(cloud.into()),
            snapshot_controller: Some(SnapshotControllerConfig { enabled: Some(true), install_default_class: Some(true) }),
            ..Default::default()
        };
        assert!(check(&on("aws")).is_empty());
        assert_eq!(paths(&on("gce")), ["spec.snapshotController.installDefaultClass"]);
    }

    #[test]
    fn flannel_follows_kops_rules() {
        use crate::generated::{FlannelNetworkingSpec, NetworkingSpec};
        let with = |backend: Option<&str>, cidr: &str| ClusterSpec {
            networking: Some(NetworkingSpec {
                flannel: Some(FlannelNetworkingSpec { backend: backend.map(str::to_string), ..Default::default() }),
                ..Default::default()
            }),
            non_masquerade_cidr: Some(cidr.parse().unwrap()),
            ..Default::default()
        };
        assert!(paths(&with(Some("vxlan"), "100.64.0.0/10")).is_empty());
        assert!(paths(&with(Some("udp"), "100.64.0.0/10")).is_empty());
        assert_eq!(paths(&with(None, "100.64.0.0/10")), ["spec.networking.flannel.backend"]);
        assert_eq!(paths(&with(Some("host-gw"), "100.64.0.0/10")), ["spec.networking.flannel.backend"]);
        assert_eq!(paths(&with(Some("vxlan"), "fd00:10:96::/64")), ["spec.networking.flannel"]);
        assert!(paths(&ClusterSpec::default()).is_empty());
    }
}
