//! The GCE cloud-controller-manager addon (`gcp-cloud-controller.addons.k8s.io`), rendered from the
//! completed `spec.cloudControllerManager` (facts from kOps' `gcp-cloud-controller.addons.k8s.io`
//! template and `pkg/model/components/gcpcloudcontrollermanager.go`): a DaemonSet on the
//! control-plane nodes (host network, every taint tolerated: it is what removes
//! `node.cloudprovider.kubernetes.io/uninitialized`, gives Nodes their addresses, zone and
//! instance type, and on routed networking such as kubenet creates each Node's pod-CIDR route),
//! its service account, RBAC and cloud config.
//!
//! Differences from kOps, on purpose:
//! - the cloud config (gcfg, kOps' nodeup writes it to `/etc/kubernetes/cloud.config` with the
//!   same keys: `node-tags`, `node-instance-prefix`, `multizone` from `spec.cloudConfig`) is a
//!   ConfigMap rendered here, so it can carry the Compute endpoint of the
//!   [`keelson_api::gce_endpoints::ANNOTATION`] annotation as `api-endpoint`, and the pod template
//!   carries its sha256, so a changed config rolls the pods;
//! - least privilege: kOps' ClusterRole lets the CCM list and watch every resource, secrets
//!   included, and create and delete secrets; this one grants what the controllers use (the
//!   shared ClusterRole of [`super::ccm::rbac`]), plus, for the provider's own `cloud-provider`
//!   client, the kube-system ConfigMaps (its cluster id, `ingress-uid`) and events.

use serde_json::{json, Value};

use keelson_api::{gce_endpoints, Cluster};

use super::ccm;

/// The addon's name (kOps' name for it).
pub const NAME: &str = "gcp-cloud-controller.addons.k8s.io";
/// Where the container reads its cloud config (kOps' path).
pub const CLOUD_CONFIG_PATH: &str = "/etc/kubernetes/cloud.config";
/// kOps' names for the DaemonSet, its service account and its ConfigMap.
const APP: &str = "cloud-controller-manager";
const NAMESPACE: &str = "kube-system";
/// The service account the GCE provider's own client runs as (`ClientOrDie("cloud-provider")`).
const PROVIDER_SA: &str = "cloud-provider";
/// The CCM's secure port (its liveness probe's target, as kOps probes it).
const SECURE_PORT: u16 = keelson_api::ports::CLOUD_CONTROLLER_MANAGER;

/// The cloud config (gcfg) the GCE provider reads: kOps' keys from `spec.cloudConfig`, and the
/// Compute endpoint when the annotation names one. Project, zone and network come from the
/// metadata server, as with kOps.
pub fn cloud_config(cluster: &Cluster, endpoint_base: Option<&str>) -> String {
    let mut lines = vec!["[global]".to_string()];
    if let Some(c) = &cluster.spec.cloud_config {
        if let Some(t) = &c.node_tags {
            lines.push(format!("node-tags = {t}"));
        }
        if let Some(p) = &c.node_instance_prefix {
            lines.push(format!("node-instance-prefix = {p}"));
        }
        if let Some(m) = c.multizone {
            lines.push(format!("multizone = {m}"));
        }
    }
    if let Some(base) = endpoint_base {
        lines.push(format!("api-endpoint = {}", gce_endpoints::compute_v1(base)));
    }
    lines.join("\n") + "\n"
}

/// The GCE provider's own client: kube-system ConfigMaps (its cluster id) and events.
fn provider_rbac() -> Vec<Value> {
    let subject = json!([{"kind": "ServiceAccount", "name": PROVIDER_SA, "namespace": NAMESPACE}]);
    vec![
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "gce:cloud-provider", "namespace": NAMESPACE},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "get", "patch", "update", "list", "watch"]}],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "gce:cloud-provider", "namespace": NAMESPACE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "gce:cloud-provider"},
            "subjects": subject,
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "gce:cloud-provider"},
            "rules": [
                {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch", "update"]},
                {"apiGroups": [""], "resources": ["services/status"], "verbs": ["patch", "update"]},
            ],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "gce:cloud-provider"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gce:cloud-provider"},
            "subjects": subject,
        }),
    ]
}

/// The addon's documents, or `None` when the cluster does not run the GCE CCM (another cloud, or no
/// external cloud-controller-manager in the completed spec).
pub fn docs(cluster: &Cluster) -> Option<Vec<Value>> {
    let spec = &cluster.spec;
    if spec.cloud_provider.as_deref() != Some("gce") {
        return None;
    }
    let c = spec.cloud_controller_manager.as_ref()?;
    let image = c.image.as_deref()?;
    // Validation reported a bad annotation already; a spec that got here has none or a good one.
    let endpoint = gce_endpoints::compute_base(cluster).ok().flatten();
    let config = cloud_config(cluster, endpoint.as_deref());
    let labels = json!({"component": APP});
    let mut docs = ccm::rbac(APP);
    docs.extend(provider_rbac());
    docs.push(ccm::config_map(APP, &config));
    docs.push(ccm::daemonset(ccm::Pod {
        app: APP,
        labels,
        pod_labels: json!({"component": APP, "tier": "control-plane"}),
        config: &config,
        control_plane_labels: &[ccm::CONTROL_PLANE_LABEL, "node-role.kubernetes.io/master"],
        image,
        args: ccm::args(c, "gce", CLOUD_CONFIG_PATH),
        cpu: c.cpu_request.as_ref().map(|q| q.to_string()),
        config_path: CLOUD_CONFIG_PATH,
        liveness: Some(json!({
            "failureThreshold": 3,
            "httpGet": {"host": "127.0.0.1", "path": "/healthz", "port": SECURE_PORT, "scheme": "HTTPS"},
            "initialDelaySeconds": 15,
            "periodSeconds": 10,
            "successThreshold": 1,
            "timeoutSeconds": 15,
        })),
    }));
    Some(docs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn gce() -> Cluster {
        let (mut cluster, _) = crate::addons::tests::ha();
        cluster.spec.cloud_provider = Some("gce".into());
        let c = cluster.spec.cloud_controller_manager.get_or_insert_with(Default::default);
        c.cidr_allocator_type = Some("CloudAllocator".into());
        c.controllers = Some(vec!["*".into()]);
        c.image = Some("registry.k8s.io/cloud-provider-gcp/cloud-controller-manager:v35.0.0".into());
        let cc = cluster.spec.cloud_config.get_or_insert_with(Default::default);
        cc.multizone = Some(true);
        cc.node_tags = Some("gce-k8s-example-com-k8s-io-role-node".into());
        cluster
    }

    fn args(docs: &[Value]) -> Vec<String> {
        let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").expect("daemonset");
        ds["spec"]["template"]["spec"]["containers"][0]["args"].as_array().expect("args").iter().filter_map(|a| a.as_str().map(str::to_string)).collect()
    }

    #[test]
    fn renders_kops_flags_and_cloud_config() {
        let docs = docs(&gce()).expect("gce + external CCM");
        let args = args(&docs);
        for want in [
            "--cloud-provider=gce",
            "--cidr-allocator-type=CloudAllocator",
            "--controllers=*",
            "--leader-elect=true",
            "--cloud-config=/etc/kubernetes/cloud.config",
        ] {
            assert!(args.iter().any(|a| a == want), "{want} missing from {args:?}");
        }
        let cm = docs.iter().find(|d| d["kind"] == "ConfigMap").expect("config");
        assert_eq!(cm["data"]["cloud.config"], "[global]\nnode-tags = gce-k8s-example-com-k8s-io-role-node\nmultizone = true\n");
        let rb = docs.iter().find(|d| d["kind"] == "RoleBinding" && d["metadata"]["name"] == "gce:cloud-provider").expect("provider binding");
        assert_eq!(rb["subjects"][0]["name"], PROVIDER_SA);
    }

    #[test]
    fn the_annotation_names_the_compute_endpoint() {
        let mut cluster = gce();
        cluster.metadata.annotations = Some(BTreeMap::from([(gce_endpoints::ANNOTATION.to_string(), "http://10.123.0.1:8080/".to_string())]));
        let docs = docs(&cluster).expect("docs");
        let cm = docs.iter().find(|d| d["kind"] == "ConfigMap").expect("config");
        let text = cm["data"]["cloud.config"].as_str().expect("text");
        assert!(text.ends_with("api-endpoint = http://10.123.0.1:8080/compute/v1/\n"), "{text}");
        let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").expect("daemonset");
        assert_eq!(ds["spec"]["template"]["metadata"]["annotations"]["keelson.io/cloud-config-sha256"], base::sha256_hex(text.as_bytes()));
    }

    #[test]
    fn no_secrets_and_no_wildcard_reads() {
        let docs = docs(&gce()).expect("docs");
        for d in docs.iter().filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role") {
            for rule in d["rules"].as_array().expect("rules") {
                let resources: Vec<&str> = rule["resources"].as_array().expect("resources").iter().filter_map(|r| r.as_str()).collect();
                assert!(!resources.contains(&"*"), "{}: a wildcard resource: {rule}", d["metadata"]["name"]);
                let verbs: Vec<&str> = rule["verbs"].as_array().expect("verbs").iter().filter_map(|r| r.as_str()).collect();
                if resources.contains(&"secrets") {
                    assert!(
                        !verbs.iter().any(|v| matches!(*v, "create" | "delete" | "get" | "update")),
                        "{}: writes or reads secrets: {rule}",
                        d["metadata"]["name"]
                    );
                }
            }
        }
    }

    #[test]
    fn other_clouds_get_no_gce_ccm() {
        let (cluster, _) = crate::addons::tests::ha();
        assert!(docs(&cluster).is_none());
    }
}
