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
    out.extend(cluster_autoscaler(spec));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generated::{CertManagerConfig, ClusterAutoscalerConfig, MetricsServerConfig};

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
}
