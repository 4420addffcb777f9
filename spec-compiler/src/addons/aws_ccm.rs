//! The AWS cloud-controller-manager addon (`aws-cloud-controller.addons.k8s.io`), rendered from the
//! completed `spec.cloudControllerManager` (facts from kOps' `aws-cloud-controller.addons.k8s.io`
//! template and `pkg/model/components/awscloudcontrollermanager.go`): its ServiceAccount, RBAC, the
//! cloud config, and a DaemonSet on the control-plane nodes (host network, every taint tolerated:
//! it is what removes `node.cloudprovider.kubernetes.io/uninitialized`).
//!
//! Differences from kOps, on purpose: the cloud config is a ConfigMap rendered here (kOps' nodeup
//! writes `/etc/kubernetes/cloud.config` on the host; ours does not), so it can carry the endpoint
//! overrides of the [`keelson_api::aws_endpoints::ANNOTATION`] annotation as `[ServiceOverride]`
//! sections; and the pod template carries that config's sha256, so a changed config rolls the pods.

use std::fmt::Write as _;

use serde_json::{json, Value};

use keelson_api::aws_endpoints::{self, SERVICES};
use keelson_api::Cluster;

use super::ccm;

/// The addon's name (kOps' name for it).
pub const NAME: &str = "aws-cloud-controller.addons.k8s.io";
/// Where the container reads its cloud config (kOps' path).
pub const CLOUD_CONFIG_PATH: &str = "/etc/kubernetes/cloud.config";
const APP: &str = "aws-cloud-controller-manager";

/// The cloud config (gcfg): the cluster id its resources are tagged with, and one
/// `[ServiceOverride]` per service id of each endpoint override.
pub fn cloud_config(cluster_id: &str, region: Option<&str>, endpoints: &std::collections::BTreeMap<String, String>) -> String {
    let mut out = format!("[Global]\nKubernetesClusterID = {cluster_id}\n");
    let mut n = 0;
    for (prefix, ids) in SERVICES {
        let (Some(url), Some(region)) = (endpoints.get(*prefix), region) else { continue };
        for id in *ids {
            n += 1;
            let _ =
                write!(out, "\n[ServiceOverride \"{n}\"]\nService = {id}\nRegion = {region}\nURL = {url}\nSigningRegion = {region}\nSigningName = {prefix}\n");
        }
    }
    out
}

/// The addon's documents, or `None` when the cluster does not run the AWS CCM (another cloud, or no
/// external cloud-controller-manager in the completed spec).
pub fn docs(cluster: &Cluster) -> Option<Vec<Value>> {
    let spec = &cluster.spec;
    if spec.cloud_provider.as_deref() != Some("aws") {
        return None;
    }
    let c = spec.cloud_controller_manager.as_ref()?;
    let image = c.image.as_deref()?;
    let cluster_id = c.cluster_name.clone().unwrap_or_else(|| cluster.name().to_string());
    let region = keelson_api::plan::region(spec);
    // Validation reported a bad annotation already; a spec that got here has none or a good one.
    let endpoints = aws_endpoints::service_endpoints(cluster).unwrap_or_default();
    let config = cloud_config(&cluster_id, region.as_deref(), &endpoints);
    let labels = json!({"k8s-app": APP});
    let mut docs = ccm::rbac(APP);
    docs.push(ccm::config_map(APP, &config));
    docs.push(ccm::daemonset(ccm::Pod {
        app: APP,
        labels: labels.clone(),
        pod_labels: labels,
        config: &config,
        control_plane_labels: &[ccm::CONTROL_PLANE_LABEL],
        image,
        args: ccm::args(c, "aws", CLOUD_CONFIG_PATH),
        cpu: c.cpu_request.as_ref().map(|q| q.to_string()),
        config_path: CLOUD_CONFIG_PATH,
        liveness: None,
    }));
    Some(docs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ha_renders_the_ccm_for_kubenet_with_cloud_routes() {
        let (cluster, _) = crate::addons::tests::ha();
        let docs = docs(&cluster).expect("aws + external CCM");
        let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").expect("daemonset");
        let args: Vec<&str> = ds["spec"]["template"]["spec"]["containers"][0]["args"].as_array().expect("args").iter().filter_map(|a| a.as_str()).collect();
        for want in [
            "--allocate-node-cidrs=true",
            "--cluster-cidr=100.96.0.0/11",
            "--cluster-name=ha.k8s.example.com",
            "--configure-cloud-routes=true",
            "--leader-elect=true",
            "--cloud-provider=aws",
            "--use-service-account-credentials=true",
            "--cloud-config=/etc/kubernetes/cloud.config",
        ] {
            assert!(args.contains(&want), "{want} missing from {args:?}");
        }
        assert_eq!(ds["spec"]["template"]["spec"]["tolerations"], json!([{"operator": "Exists"}]));
        assert_eq!(ds["spec"]["template"]["spec"]["hostNetwork"], json!(true));
        let cm = docs.iter().find(|d| d["kind"] == "ConfigMap").expect("config");
        assert_eq!(cm["data"]["cloud.config"], "[Global]\nKubernetesClusterID = ha.k8s.example.com\n");
    }

    #[test]
    fn endpoint_overrides_become_service_overrides() {
        let endpoints = aws_endpoints::parse("ec2=http://10.0.0.1:1,elasticloadbalancing=https://elb.example").expect("valid");
        let text = cloud_config("c.example.com", Some("eu-west-1"), &endpoints);
        assert_eq!(text.matches("[ServiceOverride").count(), 3, "{text}");
        assert!(text.contains("Service = EC2\nRegion = eu-west-1\nURL = http://10.0.0.1:1\nSigningRegion = eu-west-1\nSigningName = ec2\n"), "{text}");
        assert!(text.contains("Service = Elastic Load Balancing v2\n"), "{text}");
    }

    #[test]
    fn other_clouds_get_no_aws_ccm() {
        let (mut cluster, _) = crate::addons::tests::ha();
        cluster.spec.cloud_provider = Some("gce".into());
        assert!(docs(&cluster).is_none());
    }
}
