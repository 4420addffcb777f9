//! kOps' validation of the addon-bearing fields of the cluster spec (its `validation.go`), each
//! problem with its field path. [`crate::validate`] reports them for every command; what Keelson
//! renders but does not run is refused separately ([`crate::support`]).

use crate::generated::ClusterSpec;
use crate::image::ImageReference;

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

/// Every problem of the addon-bearing fields: (field path, message).
pub fn check(spec: &ClusterSpec) -> Vec<(String, String)> {
    let mut out = metrics_server(spec);
    out.extend(flannel(spec));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generated::{CertManagerConfig, MetricsServerConfig};

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
