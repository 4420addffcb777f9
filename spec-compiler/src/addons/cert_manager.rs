//! The cert-manager addon (`certmanager.io`), rendered when `spec.certManager.enabled` is true and
//! `managed` is not false: upstream's static release manifest of v1.19.5 (the version kOps pins),
//! kept as a data file (see `cert_manager/SOURCE.md`: upstream's own `helm template` release
//! command, run on the chart of the Go module, for the `kube-system` namespace kOps installs it
//! in), with kOps' settings laid over it. Facts from kOps' `certmanager.io/helm-values.yaml`,
//! `k8s-1.16.yaml.template`, `bootstrapchannelbuilder.go` and `addonmanifests/certmanager/iam.go`
//! (the DNS-01 permissions, which the cloud model gives the control planes). What the overlay
//! sets, as kOps:
//! * the controller, the CA injector and the webhook run on control planes at
//!   `system-cluster-critical` priority;
//! * the controller's image is `spec.certManager.image` when set; `defaultIssuer` makes it the
//!   default `ClusterIssuer` for ingress-shim; `featureGates` become `--feature-gates`;
//!   `nameservers` replace the pod's resolvers (DNS-01 self-checks against them); on AWS the
//!   region is in its environment (the Route53 solver needs it).
//!
//! `managed: false` renders nothing: the user runs cert-manager, and addons that need it may rely
//! on it.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use keelson_api::{CertManagerConfig, Cluster};

use super::upstream::{Upstream, UpstreamError};

/// The addon's name (kOps' name for it).
pub const NAME: &str = "certmanager.io";
/// The release manifest, relative to `spec-compiler/src/`.
pub const RELEASE_FILE: &str = "addons/cert_manager/cert-manager-v1.19.5.yaml";
const RELEASE: Upstream = Upstream { file: RELEASE_FILE, text: include_str!("cert_manager/cert-manager-v1.19.5.yaml") };
const NAMESPACE: &str = "kube-system";
const CONTROLLER: &str = "cert-manager";
const DEPLOYMENTS: [&str; 3] = ["cert-manager", "cert-manager-cainjector", "cert-manager-webhook"];

/// Why the addon cannot be rendered.
#[derive(Debug, thiserror::Error)]
pub enum CertManagerError {
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
}

/// What the overlay sets, read from the completed spec.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Settings {
    pub image: Option<String>,
    pub default_issuer: Option<String>,
    pub nameservers: Vec<String>,
    pub feature_gates: BTreeMap<String, bool>,
    /// The AWS region, on AWS.
    pub aws_region: Option<String>,
}

impl Settings {
    /// `None` unless `spec.certManager.enabled` is true and `managed` is not false.
    pub fn new(cluster: &Cluster) -> Option<Settings> {
        let cfg = cluster.spec.cert_manager.as_ref().filter(|c| c.enabled == Some(true) && c.managed != Some(false))?;
        // Every field is placed: the zones go to the control planes' IAM policy (cloud-resources).
        let CertManagerConfig { enabled: _, managed: _, image, default_issuer, nameservers, hosted_zone_ids: _, feature_gates } = cfg;
        let aws = cluster.spec.cloud_provider.as_deref() == Some("aws");
        Some(Settings {
            image: image.clone().filter(|i| !i.is_empty()),
            default_issuer: default_issuer.clone().filter(|i| !i.is_empty()),
            nameservers: nameservers.clone().unwrap_or_default(),
            feature_gates: feature_gates.clone().unwrap_or_default(),
            aws_region: aws.then(|| super::aws_region(&cluster.spec)).flatten(),
        })
    }
}

fn on_control_planes() -> serde_json::Map<String, Value> {
    let placement = json!({
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]},
        ]}}},
        "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}],
        "priorityClassName": "system-cluster-critical",
    });
    placement.as_object().cloned().unwrap_or_default()
}

fn controller(d: &mut Value, s: &Settings) -> Result<(), UpstreamError> {
    if !s.nameservers.is_empty() {
        let pod = d["spec"]["template"]["spec"].as_object_mut().ok_or_else(|| RELEASE.error("the controller has no pod spec"))?;
        pod.insert("dnsConfig".into(), json!({"nameservers": s.nameservers}));
        pod.insert("dnsPolicy".into(), json!("None"));
    }
    let c = RELEASE.container(d, "cert-manager-controller")?;
    if let Some(image) = &s.image {
        c["image"] = json!(image);
    }
    let args = c["args"].as_array_mut().ok_or_else(|| RELEASE.error("the controller container has no args"))?;
    if let Some(issuer) = &s.default_issuer {
        args.extend([
            json!(format!("--default-issuer-name={issuer}")),
            json!("--default-issuer-kind=ClusterIssuer"),
            json!("--default-issuer-group=cert-manager.io"),
        ]);
    }
    for (gate, on) in &s.feature_gates {
        args.push(json!(format!("--feature-gates={gate}={on}")));
    }
    if let Some(region) = &s.aws_region {
        let env = c["env"].as_array_mut().ok_or_else(|| RELEASE.error("the controller container has no env"))?;
        env.push(json!({"name": "AWS_REGION", "value": region}));
    }
    Ok(())
}

/// The addon's objects for `s`: the release's, overlaid.
pub fn render(s: &Settings) -> Result<Vec<Value>, UpstreamError> {
    let mut docs = RELEASE.docs()?;
    if let Some(d) = docs.iter().find(|d| d["metadata"]["namespace"].as_str().is_some_and(|n| n != NAMESPACE)) {
        return Err(RELEASE.error(format!("{} {} is not in {NAMESPACE}", d["kind"], d["metadata"]["name"])));
    }
    for name in DEPLOYMENTS {
        let d = RELEASE.find(&mut docs, "Deployment", name)?;
        let pod = d["spec"]["template"]["spec"].as_object_mut().ok_or_else(|| RELEASE.error(format!("Deployment {name} has no pod spec")))?;
        pod.extend(on_control_planes());
    }
    controller(RELEASE.find(&mut docs, "Deployment", CONTROLLER)?, s)?;
    Ok(docs)
}

/// The addon's objects, or `None` when Keelson does not run cert-manager.
pub fn docs(cluster: &Cluster) -> Result<Option<Vec<Value>>, CertManagerError> {
    Ok(Settings::new(cluster).map(|s| render(&s)).transpose()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addons::tests::{case, ha, kind};

    fn deployment<'a>(docs: &'a [Value], name: &str) -> &'a Value {
        docs.iter().find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == name).unwrap_or_else(|| panic!("no Deployment {name}"))
    }

    #[test]
    fn the_release_file_is_the_recorded_one() {
        let source = include_str!("cert_manager/SOURCE.md");
        assert!(source.contains(&base::sha256_hex(RELEASE.text.as_bytes())), "{RELEASE_FILE} changed: update cert_manager/SOURCE.md");
        let docs = RELEASE.docs().unwrap();
        let crds: Vec<&str> = docs.iter().filter(|d| d["kind"] == "CustomResourceDefinition").filter_map(|d| d["metadata"]["name"].as_str()).collect();
        assert_eq!(crds.len(), 6, "{crds:?}");
        assert!(crds.contains(&"certificates.cert-manager.io") && crds.contains(&"clusterissuers.cert-manager.io"), "{crds:?}");
        let image = &deployment(&docs, "cert-manager")["spec"]["template"]["spec"]["containers"][0]["image"];
        assert_eq!(image, "quay.io/jetstack/cert-manager-controller:v1.19.5");
        assert!(!docs.iter().any(|d| d["kind"] == "Namespace" || d["kind"] == "Job"), "no namespace, no startupapicheck");
    }

    #[test]
    fn every_deployment_runs_on_control_planes() {
        let d = render(&Settings::default()).unwrap();
        for name in DEPLOYMENTS {
            let pod = &deployment(&d, name)["spec"]["template"]["spec"];
            assert_eq!(pod["priorityClassName"], "system-cluster-critical", "{name}");
            assert_eq!(pod["tolerations"][0]["key"], "node-role.kubernetes.io/control-plane", "{name}");
            assert_eq!(
                pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"][0]["key"],
                "node-role.kubernetes.io/control-plane"
            );
        }
        let c = &deployment(&d, "cert-manager")["spec"]["template"]["spec"]["containers"][0];
        let args: Vec<&str> = c["args"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
        assert!(args.contains(&"--leader-election-namespace=kube-system"), "{args:?}");
        assert!(!args.iter().any(|a| a.starts_with("--default-issuer") || a.starts_with("--feature-gates")), "{args:?}");
        // The webhook stays upstream's, and the API server reaches it through its Service.
        assert_eq!(kind(&d, "ValidatingWebhookConfiguration")["webhooks"][0]["clientConfig"]["service"]["namespace"], "kube-system");
    }

    #[test]
    fn the_spec_sets_the_controller() {
        let s = Settings {
            image: Some("registry.example/cm:v1".into()),
            default_issuer: Some("letsencrypt".into()),
            nameservers: vec!["1.1.1.1:53".into()],
            feature_gates: BTreeMap::from([("ExperimentalGatewayAPISupport".to_string(), true)]),
            aws_region: Some("eu-west-1".into()),
        };
        let d = render(&s).unwrap();
        let pod = &deployment(&d, "cert-manager")["spec"]["template"]["spec"];
        assert_eq!((pod["dnsPolicy"].as_str(), &pod["dnsConfig"]), (Some("None"), &json!({"nameservers": ["1.1.1.1:53"]})));
        let c = &pod["containers"][0];
        assert_eq!(c["image"], "registry.example/cm:v1");
        let args: Vec<&str> = c["args"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
        for want in ["--default-issuer-name=letsencrypt", "--default-issuer-kind=ClusterIssuer", "--feature-gates=ExperimentalGatewayAPISupport=true"] {
            assert!(args.contains(&want), "{want}: {args:?}");
        }
        assert!(c["env"].as_array().unwrap().contains(&json!({"name": "AWS_REGION", "value": "eu-west-1"})));
    }

    #[test]
    fn on_when_enabled_and_managed() {
        let (cluster, _) = ha();
        assert!(docs(&cluster).unwrap().is_none());
        let (mut cluster, _) = case("many-addons");
        let s = Settings::new(&cluster).expect("many-addons enables cert-manager");
        assert!(s.aws_region.is_some());
        assert!(docs(&cluster).unwrap().is_some());
        cluster.spec.cert_manager.as_mut().unwrap().managed = Some(false);
        assert!(docs(&cluster).unwrap().is_none());
    }
}
