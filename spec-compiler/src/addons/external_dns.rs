//! The external-dns addon (`external-dns.addons.k8s.io`), rendered when `spec.externalDns.provider`
//! is `external-dns`: upstream's kustomize base (`sigs.k8s.io/external-dns@v0.23.0`, `kustomize/`),
//! kept verbatim as data files (see `external_dns/SOURCE.md`), built as kustomize would (its image
//! tag, the namespace) with kOps' settings laid over it. Facts from kOps'
//! `external-dns.addons.k8s.io/k8s-1.19.yaml.template` and `template_functions.go`
//! (`ExternalDNSArgv`, `DNSControllerPriorityClassName`). What the overlay sets, as kOps:
//! * the arguments: the cloud's provider (`aws`, or `google` with the project), `--events`,
//!   `--source=ingress` unless `watchIngress: false`, `--source=pod`, `--source=service`, kOps'
//!   dns-controller annotation semantics, the TXT registry owned by `kops-<cluster>`, only the
//!   cluster's zone (`--zone-id-filter`, or `--domain-filter` when `dnsZone` is a name; see
//!   [`Settings::zone`] when it is unset), and `--namespace` from `watchNamespace`;
//! * one replica on a control plane, on the host network, talking to the local API server: it
//!   writes records with the control planes' cloud credentials (their IAM policy already allows
//!   changes to the cluster's zone and nothing else), and runs before the cluster DNS does;
//! * non-root, read-only root filesystem, no capabilities; health probes on 7979; a Service for
//!   its metrics; `priorityClassName` from the spec (`system-cluster-critical` by default).
//!
//! Upstream's RBAC stays (it reads EndpointSlices, where kOps' older copy reads Endpoints).
//! Protokube keeps the API's own records either way.

use serde_json::{json, Value};

use keelson_api::{Cluster, ExternalDNSConfig};

use super::upstream::{Upstream, UpstreamError};

/// The addon's name (kOps' name for it).
pub const NAME: &str = "external-dns.addons.k8s.io";
const DEPLOYMENT: Upstream =
    Upstream { file: "addons/external_dns/external-dns-deployment.yaml", text: include_str!("external_dns/external-dns-deployment.yaml") };
const SERVICE_ACCOUNT: Upstream =
    Upstream { file: "addons/external_dns/external-dns-serviceaccount.yaml", text: include_str!("external_dns/external-dns-serviceaccount.yaml") };
const CLUSTER_ROLE: Upstream =
    Upstream { file: "addons/external_dns/external-dns-clusterrole.yaml", text: include_str!("external_dns/external-dns-clusterrole.yaml") };
const CLUSTER_ROLE_BINDING: Upstream =
    Upstream { file: "addons/external_dns/external-dns-clusterrolebinding.yaml", text: include_str!("external_dns/external-dns-clusterrolebinding.yaml") };
const KUSTOMIZATION: Upstream = Upstream { file: "addons/external_dns/kustomization.yaml", text: include_str!("external_dns/kustomization.yaml") };
const NAMESPACE: &str = "kube-system";
const APP: &str = "external-dns";
const PORT: u16 = 7979;

/// Why the addon cannot be rendered.
#[derive(Debug, thiserror::Error)]
pub enum ExternalDnsError {
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    /// The spec lacks what the addon needs.
    #[error("{path}: {message}")]
    Spec { path: &'static str, message: String },
}

/// What the overlay sets, read from the completed spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `--provider=…` and the provider's own flags.
    pub provider: Vec<String>,
    pub cluster_name: String,
    /// `spec.dnsZone`: a hosted zone's id or its name. Unset, kOps resolves it from the cloud when
    /// it applies; Keelson renders no filter then, and the control planes' IAM policy (scoped to
    /// the zone `apply` resolves) keeps external-dns' writes inside it.
    pub zone: Option<String>,
    pub watch_ingress: bool,
    pub watch_namespace: Option<String>,
    pub priority_class: String,
}

impl Settings {
    /// `None` unless `spec.externalDns.provider` is `external-dns`.
    pub fn new(cluster: &Cluster) -> Result<Option<Settings>, ExternalDnsError> {
        let spec = &cluster.spec;
        let Some(cfg) = spec.external_dns.as_ref().filter(|e| e.provider.as_deref() == Some("external-dns")) else { return Ok(None) };
        let ExternalDNSConfig { disable: _, watch_ingress, watch_namespace, provider: _, priority_class_name } = cfg;
        let provider = match spec.cloud_provider.as_deref() {
            Some("aws") => vec!["--provider=aws".to_string()],
            Some("gce") => {
                let project =
                    spec.project.clone().ok_or(ExternalDnsError::Spec { path: "spec.project", message: "external-dns on GCE needs the project".into() })?;
                vec!["--provider=google".to_string(), format!("--google-project={project}")]
            }
            other => {
                return Err(ExternalDnsError::Spec {
                    path: "spec.externalDns.provider",
                    message: format!("external-dns is rendered for AWS and GCE, not {}", other.unwrap_or("an unset cloud provider")),
                })
            }
        };
        Ok(Some(Settings {
            provider,
            cluster_name: cluster.metadata.name.clone().unwrap_or_default(),
            zone: spec.dns_zone.clone().filter(|z| !z.is_empty()),
            watch_ingress: watch_ingress.unwrap_or(true),
            watch_namespace: watch_namespace.clone().filter(|n| !n.is_empty()),
            priority_class: priority_class_name.clone().unwrap_or_else(|| "system-cluster-critical".into()),
        }))
    }

    /// kOps' `ExternalDNSArgv`.
    pub fn args(&self) -> Vec<String> {
        let mut out = self.provider.clone();
        out.push("--events".into());
        if self.watch_ingress {
            out.push("--source=ingress".into());
        }
        out.extend(["--source=pod".into(), "--source=service".into(), "--compatibility=kops-dns-controller".into(), "--registry=txt".into()]);
        out.push(format!("--txt-owner-id=kops-{}", self.cluster_name));
        match self.zone.as_deref() {
            // A zone name (it has a dot): the zones of that domain.
            Some(z) if z.trim_end_matches('.').contains('.') => out.push(format!("--domain-filter={}", z.trim_end_matches('.'))),
            Some(z) => out.push(format!("--zone-id-filter={}", z.trim_start_matches("/hostedzone/"))),
            None => {}
        }
        if let Some(ns) = &self.watch_namespace {
            out.push(format!("--namespace={ns}"));
        }
        out
    }
}

fn one(u: Upstream) -> Result<Value, UpstreamError> {
    let mut docs = u.docs()?;
    match docs.len() {
        1 => Ok(docs.remove(0)),
        n => Err(u.error(format!("{n} objects, expected one"))),
    }
}

/// The image the kustomization sets: `images[name].newTag` on the Deployment's image name.
fn image(deployment_image: &str) -> Result<String, UpstreamError> {
    let k = one(KUSTOMIZATION)?;
    let entry = k["images"].as_array().and_then(|i| i.iter().find(|e| e["name"] == deployment_image));
    let tag = entry.and_then(|e| e["newTag"].as_str()).ok_or_else(|| KUSTOMIZATION.error(format!("no newTag for {deployment_image}")))?;
    Ok(format!("{deployment_image}:{tag}"))
}

fn control_plane_placement() -> Value {
    json!({
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]},
        ]}}},
        "tolerations": [
            {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
        ],
    })
}

fn deployment(d: &mut Value, s: &Settings) -> Result<(), UpstreamError> {
    d["spec"]["replicas"] = json!(1);
    let pod = d["spec"]["template"]["spec"].as_object_mut().ok_or_else(|| DEPLOYMENT.error("no pod spec"))?;
    if let Some(placement) = control_plane_placement().as_object() {
        pod.extend(placement.clone());
    }
    pod.insert("priorityClassName".into(), json!(s.priority_class));
    pod.insert("hostNetwork".into(), json!(true));
    pod.insert("dnsPolicy".into(), json!("Default"));
    pod.insert("securityContext".into(), json!({"fsGroup": 65534}));
    let c = DEPLOYMENT.container(d, APP)?;
    let name = c["image"].as_str().ok_or_else(|| DEPLOYMENT.error("the container has no image"))?.to_string();
    c["image"] = json!(image(&name)?);
    c["args"] = json!(s.args());
    c["env"] = json!([{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"}, {"name": "KUBERNETES_SERVICE_PORT", "value": "443"}]);
    c["securityContext"] = json!({"runAsNonRoot": true, "runAsUser": 65534, "readOnlyRootFilesystem": true, "capabilities": {"drop": ["ALL"]}});
    c["ports"] = json!([{"name": "http", "protocol": "TCP", "containerPort": PORT}]);
    let probe = |failures: u32, delay: u32| json!({"httpGet": {"path": "/healthz", "port": "http"}, "initialDelaySeconds": delay, "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": failures, "successThreshold": 1});
    c["livenessProbe"] = probe(2, 10);
    c["readinessProbe"] = probe(6, 5);
    c["resources"] = json!({"requests": {"cpu": "50m", "memory": "50Mi"}});
    Ok(())
}

/// The addon's objects for `s`: upstream's, in the kustomization's order, in `kube-system`,
/// overlaid, then kOps' metrics Service.
pub fn render(s: &Settings) -> Result<Vec<Value>, UpstreamError> {
    let mut docs = KUSTOMIZATION.kustomize(&[DEPLOYMENT, SERVICE_ACCOUNT, CLUSTER_ROLE, CLUSTER_ROLE_BINDING])?;
    for d in &mut docs {
        if d["kind"] != "ClusterRole" && d["kind"] != "ClusterRoleBinding" {
            d["metadata"]["namespace"] = json!(NAMESPACE);
        }
    }
    let binding = CLUSTER_ROLE_BINDING.find(&mut docs, "ClusterRoleBinding", "external-dns-viewer")?;
    for subject in binding["subjects"].as_array_mut().into_iter().flatten() {
        subject["namespace"] = json!(NAMESPACE);
    }
    deployment(DEPLOYMENT.find(&mut docs, "Deployment", APP)?, s)?;
    docs.push(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": APP, "namespace": NAMESPACE},
        "spec": {"type": "ClusterIP", "selector": {"app": APP}, "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]},
    }));
    Ok(docs)
}

/// The addon's objects, or `None` unless `spec.externalDns.provider` is `external-dns`.
pub fn docs(cluster: &Cluster) -> Result<Option<Vec<Value>>, ExternalDnsError> {
    Ok(Settings::new(cluster)?.map(|s| render(&s)).transpose()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addons::tests::{case, ha, kind};

    /// The sha256 of each upstream file, as `external_dns/SOURCE.md` records it.
    const SHA256: [(Upstream, &str); 5] = [
        (CLUSTER_ROLE, "66bdbcb9e55501891b20633cb9c01d930e32e3df3823a98601a63bb4232224bb"),
        (CLUSTER_ROLE_BINDING, "9741c2cbb929c2048848493ae985dba064a78eeef92e7e6b9b033faa2c8361e7"),
        (DEPLOYMENT, "ad9f94d059478cf9b3ca945737323b14fb5288195062ab866d1ff8a9f394898a"),
        (SERVICE_ACCOUNT, "a0daf3d8a90132d50ad8151c98a9edb5811677481adf3dd28916aaf9581f0af7"),
        (KUSTOMIZATION, "27b6c3215cf755528d12d095fe256414a0a5d2b68a44ea4bb427903595734800"),
    ];

    fn settings() -> Settings {
        Settings {
            provider: vec!["--provider=aws".into()],
            cluster_name: "minimal.example.com".into(),
            zone: Some("Z1AFAKE1ZON3YO".into()),
            watch_ingress: true,
            watch_namespace: None,
            priority_class: "system-cluster-critical".into(),
        }
    }

    #[test]
    fn the_upstream_files_are_the_recorded_ones() {
        let source = include_str!("external_dns/SOURCE.md");
        for (u, sha) in SHA256 {
            assert_eq!(base::sha256_hex(u.text.as_bytes()), sha, "{} changed: update external_dns/SOURCE.md", u.file);
            assert!(source.contains(sha), "{}: {sha} not in SOURCE.md", u.file);
        }
    }

    #[test]
    fn the_overlay_is_kops_settings_over_upstream() {
        let d = render(&settings()).unwrap();
        let kinds: Vec<&str> = d.iter().filter_map(|x| x["kind"].as_str()).collect();
        assert_eq!(kinds, ["Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service"]);
        let dep = kind(&d, "Deployment");
        assert_eq!(dep["metadata"]["namespace"], "kube-system");
        assert_eq!(dep["spec"]["strategy"]["type"], "Recreate");
        let pod = &dep["spec"]["template"]["spec"];
        assert_eq!((pod["hostNetwork"].as_bool(), pod["dnsPolicy"].as_str()), (Some(true), Some("Default")));
        assert_eq!(pod["serviceAccountName"], "external-dns");
        assert_eq!(
            pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"][0]["key"],
            "node-role.kubernetes.io/control-plane"
        );
        let c = &pod["containers"][0];
        assert_eq!(c["image"], "registry.k8s.io/external-dns/external-dns:v0.22.0");
        assert_eq!(
            c["args"],
            json!([
                "--provider=aws",
                "--events",
                "--source=ingress",
                "--source=pod",
                "--source=service",
                "--compatibility=kops-dns-controller",
                "--registry=txt",
                "--txt-owner-id=kops-minimal.example.com",
                "--zone-id-filter=Z1AFAKE1ZON3YO"
            ])
        );
        assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
        assert_eq!(kind(&d, "ClusterRoleBinding")["subjects"][0]["namespace"], "kube-system");
        assert!(kind(&d, "ClusterRole").get("namespace").is_none());
        let rules = serde_json::to_string(&kind(&d, "ClusterRole")["rules"]).unwrap();
        assert!(rules.contains("endpointslices") && !rules.contains("\"create\"") && !rules.contains("secrets"), "{rules}");
        assert_eq!(kind(&d, "Service")["spec"]["selector"], json!({"app": "external-dns"}));
    }

    #[test]
    fn watch_settings_change_the_sources_and_namespace() {
        let s = Settings {
            watch_ingress: false,
            watch_namespace: Some("web".into()),
            provider: vec!["--provider=google".into(), "--google-project=p1".into()],
            ..settings()
        };
        let args = s.args();
        assert!(!args.contains(&"--source=ingress".to_string()), "{args:?}");
        assert_eq!(args.last().map(String::as_str), Some("--namespace=web"));
        assert_eq!(&args[..2], ["--provider=google", "--google-project=p1"]);
    }

    #[test]
    fn only_with_the_external_dns_provider() {
        let (cluster, _) = ha();
        assert!(docs(&cluster).unwrap().is_none());
        // kOps' external_dns case: provider external-dns, no zone in the spec.
        let (mut cluster, _) = case("external_dns");
        let s = Settings::new(&cluster).unwrap().expect("provider external-dns");
        assert_eq!((s.cluster_name.as_str(), s.watch_ingress, s.zone.as_deref()), ("minimal.example.com", true, None));
        assert!(!s.args().iter().any(|a| a.contains("-filter=")), "{:?}", s.args());
        cluster.spec.dns_zone = Some("example.com".into());
        assert!(Settings::new(&cluster).unwrap().unwrap().args().contains(&"--domain-filter=example.com".to_string()));
        cluster.spec.cloud_provider = Some("hetzner".into());
        let e = Settings::new(&cluster).unwrap_err().to_string();
        assert!(e.starts_with("spec.externalDns.provider:") && e.contains("hetzner"), "{e}");
    }
}
