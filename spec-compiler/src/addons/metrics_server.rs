//! The metrics-server addon (`metrics-server.addons.k8s.io`), rendered when `spec.metricsServer.enabled`
//! is true: upstream's release manifest, kept as a data file ([`RELEASE_FILE`], the release kOps pins),
//! with kOps' settings laid over it. Facts from kOps' `metrics-server.addons.k8s.io/k8s-1.11.yaml.template`
//! (itself upstream's `components.yaml` of that release, edited), `bootstrapchannelbuilder.go` (the addon
//! exists only when enabled) and `validation.go` (checked in [`keelson_api::addon_rules`]). What kOps
//! changes, and so does this overlay:
//! * the Deployment runs two replicas spread over zones (preferred) and hosts (required), without
//!   upstream's `maxUnavailable: 0` rollout strategy, and a PodDisruptionBudget keeps one;
//! * the container's image is `spec.metricsServer.image`, else the versions table's;
//! * metrics-server reaches each kubelet by the node's `Hostname` address on AWS (the EC2 private DNS
//!   name, which the VPC resolves), by its `InternalIP` elsewhere and on IPv6-only clusters;
//! * `insecure` (kOps' default when unset): a self-signed serving certificate (`--cert-dir=/tmp`), the
//!   kubelets' certificates not verified (`--kubelet-insecure-tls`), and the API server told to skip
//!   verifying metrics-server's (`insecureSkipTLSVerify` on the APIService). `insecure: false`: the
//!   serving certificate comes from a cert-manager `Certificate` (`metrics-server-tls`, mounted at
//!   `/srv`) issued by kOps' per-addon issuer, and cert-manager injects its CA into the APIService.
//!   Keelson renders that form as kOps does but runs neither cert-manager nor the issuer, so
//!   `keelson validate` refuses it ([`keelson_api::support`]).

use serde_json::{json, Value};

use super::upstream::Upstream;

use keelson_api::{Cluster, MetricsServerConfig};

use crate::versions::{Versions, METRICS_SERVER_IMAGE, METRICS_SERVER_VERSION};

/// The addon's name (kOps' name for it).
pub const NAME: &str = "metrics-server.addons.k8s.io";
/// The base manifest, relative to this module's directory.
pub const RELEASE_FILE: &str = "addons/metrics_server/release-v0.8.0.yaml";
const RELEASE: &str = include_str!("metrics_server/release-v0.8.0.yaml");
const UPSTREAM: Upstream = Upstream { file: RELEASE_FILE, text: RELEASE };
const NAMESPACE: &str = "kube-system";
const APP: &str = "metrics-server";
/// Where the secure form mounts its certificate, and the Secret cert-manager writes it to.
const TLS_DIR: &str = "/srv";
const TLS_SECRET: &str = "metrics-server-tls";

/// The base manifest does not have what the overlay edits (a release with a different layout).
#[derive(Debug, thiserror::Error)]
pub enum MetricsServerError {
    #[error("{RELEASE_FILE}: {message}")]
    Release { message: String },
}

fn release_error(message: impl Into<String>) -> MetricsServerError {
    MetricsServerError::Release { message: message.into() }
}

/// What the overlay sets, read from the completed spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub image: String,
    /// kOps' `insecure`, `true` when unset.
    pub insecure: bool,
    /// The node address type metrics-server scrapes kubelets at.
    pub address_type: &'static str,
}

impl Settings {
    /// `None` unless `spec.metricsServer.enabled` is true.
    pub fn new(cluster: &Cluster, versions: &Versions) -> Option<Settings> {
        let spec = &cluster.spec;
        let cfg: &MetricsServerConfig = spec.metrics_server.as_ref().filter(|m| m.enabled == Some(true))?;
        let ipv6_only = spec.non_masquerade_cidr.is_some_and(|c| c.is_ipv6());
        let aws = spec.cloud_provider.as_deref() == Some("aws");
        Some(Settings {
            image: cfg.image.clone().unwrap_or_else(|| versions.metrics_server_image()),
            insecure: cfg.insecure.unwrap_or(true),
            address_type: if ipv6_only || !aws { "InternalIP" } else { "Hostname" },
        })
    }
}

/// The release's objects, in its order.
fn release() -> Result<Vec<Value>, MetricsServerError> {
    UPSTREAM.docs().map_err(|e| release_error(e.message))
}

fn find<'a>(docs: &'a mut [Value], kind: &str, name: &str) -> Result<&'a mut Value, MetricsServerError> {
    UPSTREAM.find(docs, kind, name).map_err(|e| release_error(e.message))
}

fn object<'a>(v: &'a mut Value, what: &str) -> Result<&'a mut serde_json::Map<String, Value>, MetricsServerError> {
    v.as_object_mut().ok_or_else(|| release_error(format!("{what} is not a mapping")))
}

fn array<'a>(v: &'a mut Value, what: &str) -> Result<&'a mut Vec<Value>, MetricsServerError> {
    if v.is_null() {
        *v = json!([]);
    }
    v.as_array_mut().ok_or_else(|| release_error(format!("{what} is not a list")))
}

fn selector() -> Value {
    json!({"matchLabels": {"k8s-app": APP}})
}

/// The metrics-server container's arguments, in kOps' order: upstream's other arguments, then the
/// address type, the serving certificate (self-signed in `/tmp`, or cert-manager's in `/srv`), and
/// `--kubelet-insecure-tls` when insecure.
fn args(upstream: &[Value], s: &Settings) -> Result<Vec<Value>, MetricsServerError> {
    let mut out = Vec::new();
    let (mut cert_dir, mut address_types) = (None, false);
    for a in upstream {
        let a = a.as_str().ok_or_else(|| release_error("the metrics-server container's args are not strings"))?;
        if a.starts_with("--cert-dir=") {
            cert_dir = Some(a);
        } else if a.starts_with("--kubelet-preferred-address-types=") {
            address_types = true;
        } else {
            out.push(json!(a));
        }
    }
    let Some(cert_dir) = cert_dir.filter(|_| address_types) else {
        return Err(release_error("the metrics-server container has no --cert-dir or no --kubelet-preferred-address-types argument"));
    };
    out.push(json!(format!("--kubelet-preferred-address-types={}", s.address_type)));
    if s.insecure {
        out.push(json!(cert_dir));
        out.push(json!("--kubelet-insecure-tls"));
    } else {
        out.push(json!(format!("--tls-cert-file={TLS_DIR}/tls.crt")));
        out.push(json!(format!("--tls-private-key-file={TLS_DIR}/tls.key")));
    }
    Ok(out)
}

fn deployment(d: &mut Value, s: &Settings) -> Result<(), MetricsServerError> {
    let spec = object(&mut d["spec"], "Deployment spec")?;
    spec.insert("replicas".into(), json!(2));
    spec.remove("strategy");
    let pod = object(&mut d["spec"]["template"]["spec"], "Deployment pod spec")?;
    pod.insert("topologySpreadConstraints".into(), super::spread_over_zones_and_hosts(&selector()));
    if !s.insecure {
        array(&mut d["spec"]["template"]["spec"]["volumes"], "the pod's volumes")?.insert(0, json!({"name": "certs", "secret": {"secretName": TLS_SECRET}}));
    }
    let containers = array(&mut d["spec"]["template"]["spec"]["containers"], "the pod's containers")?;
    let c = containers.iter_mut().find(|c| c["name"] == APP).ok_or_else(|| release_error("no metrics-server container"))?;
    let upstream = c["args"].as_array().cloned().unwrap_or_default();
    c["args"] = Value::Array(args(&upstream, s)?);
    c["image"] = json!(s.image);
    if !s.insecure {
        array(&mut c["volumeMounts"], "the container's volumeMounts")?.insert(0, json!({"name": "certs", "mountPath": TLS_DIR}));
    }
    Ok(())
}

fn api_service(d: &mut Value, s: &Settings) -> Result<(), MetricsServerError> {
    if s.insecure {
        d["spec"]["insecureSkipTLSVerify"] = json!(true);
    } else {
        object(&mut d["spec"], "APIService spec")?.remove("insecureSkipTLSVerify");
        d["metadata"]["annotations"] = json!({"cert-manager.io/inject-ca-from": format!("{NAMESPACE}/{APP}")});
    }
    Ok(())
}

/// The addon's objects for `s`: the release's, overlaid, then the PodDisruptionBudget (and, secure,
/// the Certificate).
pub fn render(s: &Settings) -> Result<Vec<Value>, MetricsServerError> {
    let mut docs = release()?;
    let image = find(&mut docs, "Deployment", APP)?["spec"]["template"]["spec"]["containers"][0]["image"].clone();
    if image != METRICS_SERVER_IMAGE {
        return Err(release_error(format!("its image {image} is not the versions table's {METRICS_SERVER_IMAGE} (v{METRICS_SERVER_VERSION})")));
    }
    deployment(find(&mut docs, "Deployment", APP)?, s)?;
    api_service(find(&mut docs, "APIService", "v1beta1.metrics.k8s.io")?, s)?;
    docs.push(json!({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": APP, "namespace": NAMESPACE, "labels": {"k8s-app": APP}},
        "spec": {"minAvailable": 1, "selector": selector()},
    }));
    if !s.insecure {
        docs.push(json!({
            "apiVersion": "cert-manager.io/v1",
            "kind": "Certificate",
            "metadata": {"name": APP, "namespace": NAMESPACE},
            "spec": {
                "secretName": TLS_SECRET,
                "duration": "2160h",
                "renewBefore": "360h",
                "usages": ["server auth"],
                "dnsNames": [format!("{APP}.{NAMESPACE}.svc")],
                "issuerRef": {"name": NAME, "kind": "Issuer"},
            },
        }));
    }
    Ok(docs)
}

/// The addon's objects, or `None` when `spec.metricsServer.enabled` is not true.
pub fn docs(cluster: &Cluster, versions: &Versions) -> Result<Option<Vec<Value>>, MetricsServerError> {
    Settings::new(cluster, versions).map(|s| render(&s)).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addons::tests::{ha, kind};

    fn settings(insecure: bool) -> Settings {
        Settings { image: METRICS_SERVER_IMAGE.into(), insecure, address_type: "Hostname" }
    }

    fn container(docs: &[Value]) -> &Value {
        &kind(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    }

    fn strings(v: &Value) -> Vec<&str> {
        v.as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default()
    }

    #[test]
    fn the_release_file_is_the_pinned_release() {
        let docs = release().expect("parse");
        let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
        assert_eq!(
            kinds,
            ["ServiceAccount", "ClusterRole", "ClusterRole", "RoleBinding", "ClusterRoleBinding", "ClusterRoleBinding", "Service", "Deployment", "APIService"]
        );
        assert!(RELEASE.contains(&format!("releases/download/v{METRICS_SERVER_VERSION}/components.yaml")));
        assert!(RELEASE_FILE.ends_with(&format!("release-v{METRICS_SERVER_VERSION}.yaml")));
        assert_eq!(container(&docs)["image"], METRICS_SERVER_IMAGE);
    }

    #[test]
    fn off_unless_enabled() {
        let (mut cluster, versions) = ha();
        assert!(docs(&cluster, &versions).unwrap().is_none());
        cluster.spec.metrics_server = Some(MetricsServerConfig { enabled: Some(false), insecure: Some(true), ..Default::default() });
        assert!(docs(&cluster, &versions).unwrap().is_none());
        cluster.spec.metrics_server = Some(MetricsServerConfig { enabled: Some(true), ..Default::default() });
        let d = docs(&cluster, &versions).unwrap().expect("enabled");
        // Unset `insecure` renders insecure (kOps' template default), on AWS by the Hostname address.
        assert_eq!(
            strings(&container(&d)["args"]),
            [
                "--secure-port=10250",
                "--kubelet-use-node-status-port",
                "--metric-resolution=15s",
                "--kubelet-preferred-address-types=Hostname",
                "--cert-dir=/tmp",
                "--kubelet-insecure-tls"
            ]
        );
        assert_eq!(container(&d)["image"], versions.metrics_server_image());
    }

    #[test]
    fn insecure_overlay_matches_kops() {
        let d = render(&settings(true)).unwrap();
        assert_eq!(d.len(), 10);
        let dep = kind(&d, "Deployment");
        assert_eq!(dep["spec"]["replicas"], 2);
        assert!(dep["spec"].get("strategy").is_none(), "{dep}");
        let pod = &dep["spec"]["template"]["spec"];
        let spread = pod["topologySpreadConstraints"].as_array().unwrap();
        assert_eq!(spread.len(), 2);
        assert_eq!((spread[0]["topologyKey"].as_str(), spread[0]["whenUnsatisfiable"].as_str()), (Some("topology.kubernetes.io/zone"), Some("ScheduleAnyway")));
        assert_eq!((spread[1]["topologyKey"].as_str(), spread[1]["whenUnsatisfiable"].as_str()), (Some("kubernetes.io/hostname"), Some("DoNotSchedule")));
        assert_eq!(pod["volumes"], json!([{"emptyDir": {}, "name": "tmp-dir"}]));
        assert_eq!(container(&d)["volumeMounts"], json!([{"mountPath": "/tmp", "name": "tmp-dir"}]));
        // Upstream's securityContext, probes and resources stay.
        assert_eq!(container(&d)["securityContext"]["runAsUser"], 1000);
        assert_eq!(container(&d)["resources"]["requests"], json!({"cpu": "100m", "memory": "200Mi"}));
        let api = kind(&d, "APIService");
        assert_eq!(api["spec"]["insecureSkipTLSVerify"], true);
        assert!(api["metadata"].get("annotations").is_none());
        let pdb = kind(&d, "PodDisruptionBudget");
        assert_eq!(pdb["apiVersion"], "policy/v1");
        assert_eq!(pdb["spec"]["minAvailable"], 1);
        assert!(!d.iter().any(|x| x["kind"] == "Certificate"));
    }

    #[test]
    fn secure_overlay_uses_the_cert_manager_certificate() {
        let d = render(&settings(false)).unwrap();
        let args = strings(&container(&d)["args"]);
        assert!(args.contains(&"--tls-cert-file=/srv/tls.crt") && args.contains(&"--tls-private-key-file=/srv/tls.key"), "{args:?}");
        assert!(!args.iter().any(|a| a.starts_with("--cert-dir") || *a == "--kubelet-insecure-tls"), "{args:?}");
        assert_eq!(container(&d)["volumeMounts"][0], json!({"name": "certs", "mountPath": "/srv"}));
        let pod = &kind(&d, "Deployment")["spec"]["template"]["spec"];
        assert_eq!(pod["volumes"][0], json!({"name": "certs", "secret": {"secretName": "metrics-server-tls"}}));
        let api = kind(&d, "APIService");
        assert!(api["spec"].get("insecureSkipTLSVerify").is_none(), "{api}");
        assert_eq!(api["metadata"]["annotations"]["cert-manager.io/inject-ca-from"], "kube-system/metrics-server");
        let cert = kind(&d, "Certificate");
        assert_eq!(cert["spec"]["dnsNames"], json!(["metrics-server.kube-system.svc"]));
        assert_eq!(cert["spec"]["issuerRef"], json!({"name": "metrics-server.addons.k8s.io", "kind": "Issuer"}));
    }

    #[test]
    fn address_type_and_image_come_from_the_spec() {
        let (mut cluster, versions) = ha();
        cluster.spec.metrics_server = Some(MetricsServerConfig { enabled: Some(true), insecure: Some(true), image: Some("r.example/ms:v9".into()) });
        let s = Settings::new(&cluster, &versions).unwrap();
        assert_eq!((s.image.as_str(), s.address_type, s.insecure), ("r.example/ms:v9", "Hostname", true));
        cluster.spec.non_masquerade_cidr = Some("fd00:10:96::/64".parse().unwrap());
        assert_eq!(Settings::new(&cluster, &versions).unwrap().address_type, "InternalIP");
        cluster.spec.non_masquerade_cidr = None;
        cluster.spec.cloud_provider = Some("gce".into());
        assert_eq!(Settings::new(&cluster, &versions).unwrap().address_type, "InternalIP");
    }

    #[test]
    fn a_conformance_case_with_metrics_server_renders_it_insecure() {
        // kOps' many-addons case: metricsServer enabled (insecure unset) with cert-manager on.
        let (cluster, versions) = crate::addons::tests::case("many-addons");
        let d = docs(&cluster, &versions).unwrap().expect("many-addons enables metrics-server");
        assert_eq!(kind(&d, "APIService")["spec"]["insecureSkipTLSVerify"], true);
        assert!(strings(&container(&d)["args"]).contains(&"--kubelet-insecure-tls"));
    }
}
