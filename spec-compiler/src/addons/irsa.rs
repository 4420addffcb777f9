//! Keelson's addons on roles of their own (`spec.iam.useServiceAccountExternalPermissions`, AWS):
//! kOps' `addServiceAccountRole` remap. Every Deployment and DaemonSet of an addon that calls the
//! cloud whose pods run as the addon's service account gets the projected token (audience
//! `amazonaws.com`, a day), `AWS_ROLE_ARN` and `AWS_WEB_IDENTITY_TOKEN_FILE` in each container —
//! so the AWS SDK's credential chain assumes the addon's role with the token before it would
//! ever ask the instance's metadata — and an `fsGroup` when the pod sets none.
//!
//! Which addons, and their service accounts: [`keelson_api::addon_roles`]. The role names:
//! [`keelson_api::names::service_account_role_name`]; the roles themselves are apply's
//! (`cloud_resources::model::iam`), made from the list this records.

use serde_json::{json, Value};

use keelson_api::addon_roles::{self, AddonPermissions, AddonServiceAccount};
use keelson_api::Cluster;

/// Why an addon could not be put on its role.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IrsaError {
    #[error("spec.iam.useServiceAccountExternalPermissions: addon {addon} runs no Deployment or DaemonSet as its service account {namespace}/{name}")]
    NoPod { addon: String, namespace: String, name: String },
}

/// The permissions of a rendered addon, when the spec puts Keelson's addons on their own roles
/// and the addon calls the cloud.
pub fn permissions_of(cluster: &Cluster, addon: &str) -> Option<AddonPermissions> {
    if !addon_roles::on_own_roles(&cluster.spec) {
        return None;
    }
    match addon {
        super::aws_ccm::NAME => Some(AddonPermissions::CloudControllerManager),
        super::aws_ebs_csi::NAME => Some(AddonPermissions::EbsCsiDriver),
        super::cluster_autoscaler::NAME => Some(AddonPermissions::ClusterAutoscaler),
        super::external_dns::NAME => Some(AddonPermissions::ExternalDns),
        // Without hosted zones cert-manager calls no cloud API.
        super::cert_manager::NAME if cluster.spec.cert_manager.as_ref().and_then(|c| c.hosted_zone_ids.as_ref()).is_some_and(|z| !z.is_empty()) => {
            Some(AddonPermissions::CertManager)
        }
        _ => None,
    }
}

/// Put the pods of `addon` on its service account's role in the account `aws_account`. Without
/// the account: `Ok(Err(warning))`, and the addon must not be written (its role's ARN names the
/// account).
pub fn put_on_role(
    cluster: &Cluster,
    addon: &str,
    docs: &mut [Value],
    account: &AddonServiceAccount,
    aws_account: Option<&str>,
) -> Result<Result<(), String>, IrsaError> {
    let role = keelson_api::names::service_account_role_name(&account.name, &account.namespace, cluster.name());
    let Some(id) = aws_account else {
        return Ok(Err(format!(
            "spec.iam.useServiceAccountExternalPermissions: addon {addon} is not written: the ARN of its role ({role}) needs the AWS account id (`keelson compile --aws-account-id`; apply and the other commands that change the cloud ask STS)"
        )));
    };
    let partition = keelson_api::plan::partition_of(&keelson_api::plan::region(&cluster.spec).unwrap_or_default());
    // Validation reported a bad annotation already; a spec that got here has none or a good one.
    let endpoints = keelson_api::aws_endpoints::service_endpoints(cluster).unwrap_or_default();
    remap(addon, docs, account, &addon_roles::role_arn(partition, id, &role), endpoints.get("sts").map(String::as_str)).map(Ok)
}

/// Put the pods of `addon` that run as `account`'s service account on the role `role_arn`;
/// `sts_endpoint` is the cluster's STS endpoint override (the service-endpoints annotation), which
/// the token exchange must use. An addon with no such pod is an error (its service account and
/// the table's have drifted apart).
pub fn remap(addon: &str, docs: &mut [Value], account: &AddonServiceAccount, role_arn: &str, sts_endpoint: Option<&str>) -> Result<(), IrsaError> {
    let mut found = false;
    for doc in docs.iter_mut() {
        // Read before writing: indexing a JSON object mutably inserts what is missing.
        let is_workload = doc["apiVersion"] == "apps/v1" && (doc["kind"] == "Deployment" || doc["kind"] == "DaemonSet");
        let namespace = doc["metadata"]["namespace"].as_str().unwrap_or("default") == account.namespace;
        let runs_as = doc.pointer("/spec/template/spec/serviceAccountName").and_then(Value::as_str) == Some(account.name.as_str());
        if !(is_workload && namespace && runs_as) {
            continue;
        }
        let Some(pod) = doc.pointer_mut("/spec/template/spec") else { continue };
        found = true;
        add_role(pod, role_arn, sts_endpoint);
    }
    if !found {
        return Err(IrsaError::NoPod { addon: addon.to_string(), namespace: account.namespace.clone(), name: account.name.clone() });
    }
    Ok(())
}

fn push(list: &mut Value, item: Value) {
    match list.as_array_mut() {
        Some(items) => items.push(item),
        None => *list = json!([item]),
    }
}

fn add_role(pod: &mut Value, role_arn: &str, sts_endpoint: Option<&str>) {
    push(
        &mut pod["volumes"],
        json!({
            "name": addon_roles::TOKEN_VOLUME,
            "projected": {
                "defaultMode": 0o644,
                "sources": [{"serviceAccountToken": {
                    "audience": addon_roles::TOKEN_AUDIENCE,
                    "expirationSeconds": addon_roles::TOKEN_EXPIRATION_SECONDS,
                    "path": addon_roles::TOKEN_FILE,
                }}],
            },
        }),
    );
    if let Some(containers) = pod["containers"].as_array_mut() {
        for c in containers {
            push(&mut c["volumeMounts"], json!({"mountPath": addon_roles::TOKEN_DIR, "name": addon_roles::TOKEN_VOLUME, "readOnly": true}));
            push(&mut c["env"], json!({"name": "AWS_ROLE_ARN", "value": role_arn}));
            push(&mut c["env"], json!({"name": "AWS_WEB_IDENTITY_TOKEN_FILE", "value": format!("{}{}", addon_roles::TOKEN_DIR, addon_roles::TOKEN_FILE)}));
            if let Some(url) = sts_endpoint {
                // The SDKs' service-specific endpoint variable: the token exchange goes where the
                // cluster's other AWS calls go.
                push(&mut c["env"], json!({"name": "AWS_ENDPOINT_URL_STS", "value": url}));
            }
        }
    }
    if pod["securityContext"]["fsGroup"].is_null() {
        pod["securityContext"]["fsGroup"] = json!(addon_roles::TOKEN_FS_GROUP);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(sa: &str, security: Value) -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "x", "namespace": "kube-system"},
            "spec": {"template": {"spec": {
                "serviceAccountName": sa,
                "securityContext": security,
                "containers": [{"name": "a", "env": [{"name": "K", "value": "v"}]}, {"name": "b"}],
                "volumes": [{"name": "v", "emptyDir": {}}],
            }}},
        })
    }

    #[test]
    fn the_addons_pods_get_the_token_the_role_and_a_group_that_reads_it() {
        let sa = AddonServiceAccount::from(AddonPermissions::ClusterAutoscaler);
        let account = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "cluster-autoscaler", "namespace": "kube-system"}});
        let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "cluster-autoscaler"}, "rules": []});
        let mut docs = vec![deployment("cluster-autoscaler", json!({})), deployment("other", json!({})), account.clone(), role.clone()];
        let arn = "arn:aws:iam::123456789012:role/cluster-autoscaler.kube-system.sa.c";
        remap("ca", &mut docs, &sa, arn, Some("http://127.0.0.1:5000")).unwrap();
        let pod = &docs[0]["spec"]["template"]["spec"];
        assert_eq!(pod["volumes"][1]["name"], "token-amazonaws-com");
        let token = &pod["volumes"][1]["projected"]["sources"][0]["serviceAccountToken"];
        assert_eq!(
            (token["audience"].as_str(), token["expirationSeconds"].as_i64(), token["path"].as_str()),
            (Some("amazonaws.com"), Some(86400), Some("token"))
        );
        assert_eq!(pod["volumes"][1]["projected"]["defaultMode"], 0o644);
        for c in pod["containers"].as_array().unwrap() {
            let env: Vec<(&str, &str)> = c["env"].as_array().unwrap().iter().map(|e| (e["name"].as_str().unwrap(), e["value"].as_str().unwrap())).collect();
            assert!(env.contains(&("AWS_ROLE_ARN", arn)), "{env:?}");
            assert!(env.contains(&("AWS_WEB_IDENTITY_TOKEN_FILE", "/var/run/secrets/amazonaws.com/token")), "{env:?}");
            assert!(env.contains(&("AWS_ENDPOINT_URL_STS", "http://127.0.0.1:5000")), "{env:?}");
            assert_eq!(c["volumeMounts"][0], json!({"mountPath": "/var/run/secrets/amazonaws.com/", "name": "token-amazonaws-com", "readOnly": true}));
        }
        assert_eq!(docs[0]["spec"]["template"]["spec"]["containers"][0]["env"][0]["name"], "K", "the addon's own variables stay first");
        assert_eq!(pod["securityContext"]["fsGroup"], 10001);
        assert_eq!(docs[1], deployment("other", json!({})), "another service account's pods are left alone");
        assert_eq!((&docs[2], &docs[3]), (&account, &role), "objects without pods are left exactly as they were");
    }

    #[test]
    fn a_pods_own_group_is_kept_and_a_missing_pod_is_an_error() {
        let sa = AddonServiceAccount::from(AddonPermissions::EbsCsiDriver);
        let mut docs = vec![deployment("ebs-csi-controller-sa", json!({"fsGroup": 1000}))];
        remap("ebs", &mut docs, &sa, "arn", None).unwrap();
        assert_eq!(docs[0]["spec"]["template"]["spec"]["securityContext"]["fsGroup"], 1000);
        let env = docs[0]["spec"]["template"]["spec"]["containers"][1]["env"].as_array().unwrap();
        assert!(!env.iter().any(|e| e["name"] == "AWS_ENDPOINT_URL_STS"));
        let mut none = vec![deployment("someone-else", json!({}))];
        assert!(matches!(remap("ebs", &mut none, &sa, "arn", None), Err(IrsaError::NoPod { .. })));
    }
}
