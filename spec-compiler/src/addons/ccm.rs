//! What the clouds' cloud-controller-manager addons share: the flags kOps builds from
//! `spec.cloudControllerManager` (`CloudControllerConfigArgv`), and the RBAC of the CCM's own
//! service account (its controllers run as their own service accounts, `--use-service-account-credentials`,
//! whose roles the API server's bootstrap policy holds).

use serde_json::{json, Value};

use keelson_api::CloudControllerManagerConfig;

const NAMESPACE: &str = "kube-system";
/// The label the DaemonSets select control-plane nodes by. The kubelet may not set it itself
/// (NodeRestriction); protokube, which runs only on control planes, labels its own node.
pub const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";

/// The CCM's flags, as kOps' `CloudControllerConfigArgv` builds them: the spec's flags sorted, then
/// the defaults for what the spec leaves unset, then the cloud config.
pub fn args(c: &CloudControllerManagerConfig, cloud_provider: &str, cloud_config: &str) -> Vec<String> {
    let mut flags: Vec<String> = Vec::new();
    let mut flag = |name: &str, value: String| flags.push(format!("--{name}={value}"));
    if let Some(v) = &c.master {
        flag("master", v.clone());
    }
    if let Some(v) = c.log_level.filter(|l| *l != 0) {
        flag("v", v.to_string());
    }
    if let Some(v) = &c.cloud_provider {
        flag("cloud-provider", v.clone());
    }
    if let Some(v) = &c.cluster_name {
        flag("cluster-name", v.clone());
    }
    if let Some(v) = c.allow_untagged_cloud {
        flag("allow-untagged-cloud", v.to_string());
    }
    if let Some(v) = &c.cluster_cidr {
        flag("cluster-cidr", v.to_string());
    }
    if let Some(v) = c.allocate_node_cidrs {
        flag("allocate-node-cidrs", v.to_string());
    }
    if let Some(v) = c.configure_cloud_routes {
        flag("configure-cloud-routes", v.to_string());
    }
    if let Some(v) = c.controllers.as_ref().filter(|v| !v.is_empty()) {
        flag("controllers", v.join(","));
    }
    if let Some(v) = &c.cidr_allocator_type {
        flag("cidr-allocator-type", v.clone());
    }
    if let Some(le) = &c.leader_election {
        if let Some(v) = le.leader_elect {
            flag("leader-elect", v.to_string());
        }
        if let Some(v) = &le.leader_elect_lease_duration {
            flag("leader-elect-lease-duration", v.to_string());
        }
        if let Some(v) = &le.leader_elect_renew_deadline_duration {
            flag("leader-elect-renew-deadline", v.to_string());
        }
        if let Some(v) = &le.leader_elect_resource_lock {
            flag("leader-elect-resource-lock", v.clone());
        }
        if let Some(v) = &le.leader_elect_resource_name {
            flag("leader-elect-resource-name", v.clone());
        }
        if let Some(v) = &le.leader_elect_resource_namespace {
            flag("leader-elect-resource-namespace", v.clone());
        }
        if let Some(v) = &le.leader_elect_retry_period {
            flag("leader-elect-retry-period", v.to_string());
        }
    }
    if let Some(v) = c.use_service_account_credentials {
        flag("use-service-account-credentials", v.to_string());
    }
    if let Some(v) = c.enable_leader_migration {
        flag("enable-leader-migration", v.to_string());
    }
    if let Some(v) = &c.node_status_update_frequency {
        flag("node-status-update-frequency", v.to_string());
    }
    if let Some(v) = c.concurrent_node_syncs {
        flag("concurrent-node-syncs", v.to_string());
    }
    flags.sort();
    if c.log_level.unwrap_or(0) == 0 {
        flags.push("--v=2".into());
    }
    if c.cloud_provider.is_none() {
        flags.push(format!("--cloud-provider={cloud_provider}"));
    }
    if c.use_service_account_credentials.is_none() {
        flags.push("--use-service-account-credentials=true".into());
    }
    flags.push(format!("--cloud-config={cloud_config}"));
    flags
}

pub fn rbac(app: &str) -> Vec<Value> {
    let rule = |group: &str, resources: &[&str], verbs: &[&str]| json!({"apiGroups": [group], "resources": resources, "verbs": verbs});
    let sa_subject = json!([{"apiGroup": "", "kind": "ServiceAccount", "name": app, "namespace": NAMESPACE}]);
    let mut token_rule = rule("", &["serviceaccounts/token"], &["create"]);
    token_rule["resourceNames"] = json!(["node-controller", "service-controller", "route-controller"]);
    vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": app, "namespace": NAMESPACE}}),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "cloud-controller-manager:apiserver-authentication-reader", "namespace": NAMESPACE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "extension-apiserver-authentication-reader"},
            "subjects": sa_subject,
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "system:cloud-controller-manager"},
            "rules": [
                rule("", &["events"], &["create", "patch", "update"]),
                rule("", &["nodes"], &["*"]),
                rule("", &["nodes/status"], &["patch"]),
                rule("", &["services"], &["list", "patch", "update", "watch"]),
                rule("", &["services/status"], &["list", "patch", "update", "watch"]),
                rule("", &["serviceaccounts"], &["create", "get"]),
                rule("", &["persistentvolumes"], &["get", "list", "update", "watch"]),
                rule("", &["endpoints"], &["create", "get", "list", "watch", "update"]),
                rule("coordination.k8s.io", &["leases"], &["create", "get", "list", "watch", "update"]),
                rule("", &["secrets"], &["list", "watch"]),
                token_rule,
            ],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "system:cloud-controller-manager"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:cloud-controller-manager"},
            "subjects": sa_subject,
        }),
    ]
}

/// One cloud's CCM DaemonSet: what differs between the clouds' addons.
pub struct Pod<'a> {
    /// The DaemonSet's, container's, service account's and ConfigMap's name.
    pub app: &'a str,
    /// The DaemonSet's labels (and its selector).
    pub labels: Value,
    /// The pod template's labels (a superset of `labels`).
    pub pod_labels: Value,
    /// The cloud config (its sha256 goes on the pod template: a changed config rolls the pods).
    pub config: &'a str,
    /// Node labels that make a control plane, any one of them.
    pub control_plane_labels: &'a [&'a str],
    pub image: &'a str,
    pub args: Vec<String>,
    /// The CPU request (`None`: kOps' 200m).
    pub cpu: Option<String>,
    /// Where the container reads its cloud config (a ConfigMap key `cloud.config`).
    pub config_path: &'a str,
    pub liveness: Option<Value>,
}

/// The ConfigMap holding the cloud config under `cloud.config` (what [`daemonset`] mounts).
pub fn config_map(app: &str, config: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": app, "namespace": NAMESPACE}, "data": {"cloud.config": config}})
}

/// The DaemonSet: on the control planes (host network, every taint tolerated: it is what removes
/// `node.cloudprovider.kubernetes.io/uninitialized`), talking to the local API server.
pub fn daemonset(p: Pod) -> Value {
    let terms: Vec<Value> = p.control_plane_labels.iter().map(|k| json!({"matchExpressions": [{"key": k, "operator": "Exists"}]})).collect();
    let mut container = json!({
        "name": p.app,
        "image": p.image,
        "imagePullPolicy": "IfNotPresent",
        "args": p.args,
        // The local API server: the CCM is what makes the service network usable.
        "env": [{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"}],
        "resources": {"requests": {"cpu": p.cpu.unwrap_or_else(|| "200m".into())}},
        "volumeMounts": [{"name": "cloudconfig", "mountPath": p.config_path, "subPath": "cloud.config", "readOnly": true}],
    });
    if let Some(l) = p.liveness {
        container["livenessProbe"] = l;
    }
    json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": p.app, "namespace": NAMESPACE, "labels": p.labels},
        "spec": {
            "selector": {"matchLabels": p.labels},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {
                "metadata": {"labels": p.pod_labels, "annotations": {"keelson.io/cloud-config-sha256": base::sha256_hex(p.config.as_bytes())}},
                "spec": {
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}},
                    "tolerations": [{"operator": "Exists"}],
                    "serviceAccountName": p.app,
                    "hostNetwork": true,
                    "priorityClassName": "system-cluster-critical",
                    "containers": [container],
                    "volumes": [{"name": "cloudconfig", "configMap": {"name": p.app}}],
                },
            },
        },
    })
}
