//! The AWS EBS CSI driver addon (`aws-ebs-csi-driver.addons.k8s.io`), rendered from the completed
//! `spec.cloudConfig.awsEBSCSIDriver` on AWS. Facts from kOps' `aws-ebs-csi-driver.addons.k8s.io/
//! k8s-1.17.yaml.template`, `storage-aws.addons.k8s.io/v1.15.0.yaml.template`,
//! `pkg/model/components/awsebscsidriver.go` and `bootstrapchannelbuilder.go`:
//! * the controller and node ServiceAccounts, the provisioner / attacher / resizer / snapshotter
//!   and node ClusterRoles with their bindings, and the leader-election Role;
//! * the `ebs-csi-controller` Deployment (driver plus csi-provisioner, csi-attacher, csi-resizer,
//!   liveness-probe, and csi-snapshotter when `spec.snapshotController` is enabled), its metrics
//!   Services and PodDisruptionBudget: on the control planes with the instances' credentials, or on
//!   workers when service accounts carry their own permissions;
//! * the `ebs-csi-node` DaemonSet on every node (privileged, `/var/lib/kubelet` with bidirectional
//!   propagation, `/dev`, the plugin registration directory);
//! * the `ebs.csi.aws.com` CSIDriver; and, when `spec.cloudConfig.manageStorageClasses` is true,
//!   kOps' default StorageClass `kops-csi-1-21` (encrypted gp3).
//!
//! Rendered unless `managed` is false (kOps' switch) or `enabled` is false (kOps' validation
//! forbids that; we read it as "off").
//!
//! Differences from kOps, on purpose:
//! * the EC2 endpoint override of the [`keelson_api::aws_endpoints::ANNOTATION`] annotation becomes
//!   the controller's `AWS_EC2_ENDPOINT` (kOps reads it from an optional `aws-meta` ConfigMap, which
//!   stays the fallback);
//! * the legacy StorageClasses of kOps' `storage-aws` addon (`default`, `gp2`, `kops-ssd-1-17`, all
//!   with the removed in-tree `kubernetes.io/aws-ebs` provisioner) are not rendered;
//! * no metrics Service for the volume modifier, which runs in no container of this addon.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use keelson_api::aws_endpoints;
use keelson_api::{Cluster, EBSCSIDriverSpec};

use crate::versions::{AwsEbsCsiImages, Versions, AWS_EBS_CSI_DRIVER_VERSION};

/// The addon's name (kOps' name for it).
pub const NAME: &str = "aws-ebs-csi-driver.addons.k8s.io";
/// The CSI driver's name, which StorageClasses name as their provisioner.
pub const DRIVER: &str = "ebs.csi.aws.com";
/// kOps' default StorageClass.
pub const DEFAULT_STORAGE_CLASS: &str = "kops-csi-1-21";
const NAMESPACE: &str = "kube-system";
const CONTROLLER: &str = "ebs-csi-controller";
const CONTROLLER_SA: &str = keelson_api::addon_roles::AddonPermissions::EbsCsiDriver.service_account().1;
const NODE: &str = "ebs-csi-node";
const NODE_SA: &str = "ebs-csi-node-sa";
const CONTROL_PLANE_LABELS: [&str; 2] = ["node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master"];
/// Where the controller's sidecars reach the driver.
const CONTROLLER_SOCKET_DIR: &str = "/var/lib/csi/sockets/pluginproxy/";
const CONTROLLER_SOCKET: &str = "/var/lib/csi/sockets/pluginproxy/csi.sock";
/// The node plugin's socket, as the kubelet sees it.
const NODE_PLUGIN_DIR: &str = "/var/lib/kubelet/plugins/ebs.csi.aws.com/";

/// A completed `spec.cloudConfig.awsEBSCSIDriver` (or what it reads besides) this addon cannot
/// render, naming the field.
#[derive(Debug, thiserror::Error)]
pub enum AwsEbsCsiError {
    #[error("spec.cloudConfig.awsEBSCSIDriver.version: {value:?} is not an image tag")]
    Version { value: String },
    #[error("spec.cloudConfig.awsEBSCSIDriver.kubeAPIBurst: {value} must be positive")]
    KubeApiBurst { value: i64 },
    #[error("spec.cloudConfig.awsEBSCSIDriver.volumeAttachLimit: {value} must be positive")]
    VolumeAttachLimit { value: i64 },
    #[error("spec.cloudLabels[{key}]: keys and values of the driver's --extra-tags may not contain ',' or '=' (value {value:?})")]
    CloudLabel { key: String, value: String },
    #[error("spec.subnets: no zone or region to take the AWS region from (the driver's AWS_REGION)")]
    NoRegion,
}

/// An image tag: 1–128 of `[A-Za-z0-9_.-]`, not starting with `.` or `-`.
fn image_tag(value: &str) -> Result<&str, AwsEbsCsiError> {
    let ok = !value.is_empty()
        && value.len() <= 128
        && !value.starts_with(['.', '-'])
        && value.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if ok {
        Ok(value)
    } else {
        Err(AwsEbsCsiError::Version { value: value.to_string() })
    }
}

/// What the manifests are made from, read from the completed spec.
struct Inputs<'a> {
    cfg: &'a EBSCSIDriverSpec,
    cluster_name: &'a str,
    /// The driver's version, its image tag and the `app.kubernetes.io/version` label.
    version: &'a str,
    region: String,
    /// kOps' `CloudLabels`: `KubernetesCluster=<name>` and the spec's cloud labels, sorted.
    extra_tags: String,
    /// Service accounts carry their own cloud permissions: the controller runs on workers.
    external_permissions: bool,
    /// Karpenter may leave the control planes as the only nodes (kOps' control-plane mode).
    control_plane_mode: bool,
    ha_control_plane: bool,
    ipv6_only: bool,
    snapshotter: bool,
    ec2_endpoint: Option<String>,
    kube_api_qps: String,
    kube_api_burst: i64,
    images: AwsEbsCsiImages,
}

impl<'a> Inputs<'a> {
    fn new(cluster: &'a Cluster, cfg: &'a EBSCSIDriverSpec, versions: &Versions) -> Result<Inputs<'a>, AwsEbsCsiError> {
        let spec = &cluster.spec;
        let version = image_tag(cfg.version.as_deref().unwrap_or(AWS_EBS_CSI_DRIVER_VERSION))?;
        if let Some(value) = cfg.kube_api_burst.filter(|b| *b <= 0) {
            return Err(AwsEbsCsiError::KubeApiBurst { value });
        }
        if let Some(value) = cfg.volume_attach_limit.filter(|l| *l <= 0) {
            return Err(AwsEbsCsiError::VolumeAttachLimit { value });
        }
        let mut tags = vec![format!("KubernetesCluster={}", cluster.name())];
        for (key, value) in spec.cloud_labels.iter().flatten() {
            if key.contains([',', '=']) || value.contains([',', '=']) {
                return Err(AwsEbsCsiError::CloudLabel { key: key.clone(), value: value.clone() });
            }
            tags.push(format!("{key}={value}"));
        }
        tags.sort();
        let region = super::aws_region(spec).ok_or(AwsEbsCsiError::NoRegion)?;
        // The control planes are the instance groups the main etcd cluster's members live on.
        let control_planes: std::collections::BTreeSet<&str> = spec
            .etcd_clusters
            .iter()
            .flatten()
            .filter(|e| e.name.as_deref() == Some("main"))
            .flat_map(|e| e.etcd_members.iter().flatten())
            .filter_map(|m| m.instance_group.as_deref())
            .collect();
        // Validation reported a bad annotation already; a spec that got here has none or a good one.
        let endpoints = aws_endpoints::service_endpoints(cluster).unwrap_or_default();
        Ok(Inputs {
            cfg,
            cluster_name: cluster.name(),
            version,
            region,
            extra_tags: tags.join(","),
            external_permissions: spec.iam.as_ref().and_then(|i| i.use_service_account_external_permissions) == Some(true),
            control_plane_mode: spec.karpenter.as_ref().and_then(|k| k.enabled) == Some(true),
            ha_control_plane: control_planes.len() > 1,
            ipv6_only: spec.non_masquerade_cidr.is_some_and(|c| c.is_ipv6()),
            snapshotter: spec.snapshot_controller.as_ref().and_then(|s| s.enabled) == Some(true),
            ec2_endpoint: endpoints.get("ec2").cloned(),
            kube_api_qps: cfg.kube_apiqps.as_ref().map(|q| q.to_string()).unwrap_or_else(|| "20".into()),
            kube_api_burst: cfg.kube_api_burst.unwrap_or(100),
            images: versions.aws_ebs_csi_images(version),
        })
    }

    /// The labels every object of the driver carries (the Helm chart's).
    fn labels(&self) -> Value {
        json!({
            "app.kubernetes.io/name": "aws-ebs-csi-driver",
            "app.kubernetes.io/instance": "aws-ebs-csi-driver",
            "app.kubernetes.io/version": self.version,
            "app.kubernetes.io/component": "csi-driver",
        })
    }

    fn meta(&self, name: &str, namespaced: bool) -> Value {
        let mut m = json!({"name": name, "labels": self.labels()});
        if namespaced {
            m["namespace"] = json!(NAMESPACE);
        }
        m
    }

    fn pod_meta(&self, app: &str) -> Value {
        let mut labels = self.labels();
        labels["app"] = json!(app);
        let mut m = json!({"labels": labels});
        if let Some(a) = self.cfg.pod_annotations.as_ref().filter(|a| !a.is_empty()) {
            m["annotations"] = json!(a);
        }
        m
    }
}

fn selector(app: &str) -> Value {
    json!({"app": app, "app.kubernetes.io/name": "aws-ebs-csi-driver", "app.kubernetes.io/instance": "aws-ebs-csi-driver"})
}

fn rule(group: &str, resources: &[&str], verbs: &[&str]) -> Value {
    json!({"apiGroups": [group], "resources": resources, "verbs": verbs})
}

fn rbac(i: &Inputs) -> Vec<Value> {
    const READ: &[&str] = &["get", "list", "watch"];
    const EVENTS: &[&str] = &["list", "watch", "create", "update", "patch"];
    let sa = |name: &str| {
        let mut d = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": i.meta(name, true)});
        d["automountServiceAccountToken"] = json!(true);
        d
    };
    let role = |name: &str, rules: Vec<Value>| json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": i.meta(name, false), "rules": rules});
    let binding = |name: &str, role: &str, account: &str| {
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": i.meta(name, false),
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}],
            "roleRef": {"kind": "ClusterRole", "name": role, "apiGroup": "rbac.authorization.k8s.io"},
        })
    };
    vec![
        sa(CONTROLLER_SA),
        sa(NODE_SA),
        role(
            "ebs-external-attacher-role",
            vec![
                rule("", &["persistentvolumes"], &["get", "list", "watch", "patch"]),
                rule("storage.k8s.io", &["csinodes"], READ),
                rule("storage.k8s.io", &["volumeattachments"], &["get", "list", "watch", "patch"]),
                rule("storage.k8s.io", &["volumeattachments/status"], &["patch"]),
            ],
        ),
        role(
            "ebs-csi-node-role",
            vec![
                rule("storage.k8s.io", &["volumeattachments"], READ),
                rule("", &["nodes"], &["get"]),
                rule("", &["nodes"], &["patch", "list", "watch"]),
                rule("storage.k8s.io", &["csinodes"], &["get"]),
            ],
        ),
        role(
            "ebs-external-provisioner-role",
            vec![
                rule("", &["persistentvolumes"], &["get", "list", "watch", "create", "patch", "delete"]),
                rule("", &["persistentvolumeclaims"], &["get", "list", "watch", "update"]),
                rule("storage.k8s.io", &["storageclasses"], READ),
                rule("", &["events"], EVENTS),
                rule("snapshot.storage.k8s.io", &["volumesnapshots"], &["get", "list", "watch", "update"]),
                rule("snapshot.storage.k8s.io", &["volumesnapshotcontents"], &["get", "list"]),
                rule("storage.k8s.io", &["csinodes"], READ),
                rule("", &["nodes"], READ),
                rule("storage.k8s.io", &["volumeattachments"], READ),
                rule("storage.k8s.io", &["volumeattributesclasses"], &["get"]),
            ],
        ),
        role(
            "ebs-external-resizer-role",
            vec![
                rule("", &["persistentvolumes"], &["get", "list", "watch", "patch"]),
                rule("", &["persistentvolumeclaims"], READ),
                rule("", &["pods"], READ),
                rule("", &["persistentvolumeclaims/status"], &["patch"]),
                rule("", &["events"], EVENTS),
                rule("storage.k8s.io", &["volumeattributesclasses"], READ),
            ],
        ),
        role(
            "ebs-external-snapshotter-role",
            vec![
                rule("", &["events"], EVENTS),
                rule("snapshot.storage.k8s.io", &["volumesnapshotclasses"], READ),
                rule("snapshot.storage.k8s.io", &["volumesnapshotcontents"], &["get", "list", "watch", "update", "patch"]),
                rule("snapshot.storage.k8s.io", &["volumesnapshotcontents/status"], &["update", "patch"]),
                rule("groupsnapshot.storage.k8s.io", &["volumegroupsnapshotclasses"], READ),
                rule("groupsnapshot.storage.k8s.io", &["volumegroupsnapshotcontents"], &["get", "list", "watch", "update", "patch"]),
                rule("groupsnapshot.storage.k8s.io", &["volumegroupsnapshotcontents/status"], &["update", "patch"]),
            ],
        ),
        binding("ebs-csi-attacher-binding", "ebs-external-attacher-role", CONTROLLER_SA),
        binding("ebs-csi-node-getter-binding", "ebs-csi-node-role", NODE_SA),
        binding("ebs-csi-provisioner-binding", "ebs-external-provisioner-role", CONTROLLER_SA),
        binding("ebs-csi-resizer-binding", "ebs-external-resizer-role", CONTROLLER_SA),
        binding("ebs-csi-snapshotter-binding", "ebs-external-snapshotter-role", CONTROLLER_SA),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": i.meta("ebs-csi-leases-role", true),
            "rules": [rule("coordination.k8s.io", &["leases"], &["get", "watch", "list", "delete", "update", "create"])],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": i.meta("ebs-csi-leases-rolebinding", true),
            "subjects": [{"kind": "ServiceAccount", "name": CONTROLLER_SA, "namespace": NAMESPACE}],
            "roleRef": {"kind": "Role", "name": "ebs-csi-leases-role", "apiGroup": "rbac.authorization.k8s.io"},
        }),
    ]
}

fn resources() -> Value {
    json!({"limits": {"memory": "256Mi"}, "requests": {"cpu": "10m", "memory": "40Mi"}})
}

/// The security context of the unprivileged containers; the controller's also pin seccomp.
fn restricted(seccomp: bool) -> Value {
    let mut s = json!({"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true});
    if seccomp {
        s["seccompProfile"] = json!({"type": "RuntimeDefault"});
    }
    s
}

fn env(name: &str, value: &str) -> Value {
    json!({"name": name, "value": value})
}

fn node_name_env() -> Value {
    json!({"name": "CSI_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
}

fn optional_ref(name: &str, source: &str, object: &str, key: &str) -> Value {
    json!({"name": name, "valueFrom": {source: {"name": object, "key": key, "optional": true}}})
}

/// The driver's common environment: IPv6 metadata endpoint when IPv6-only, region, endpoint, node.
fn driver_env(i: &Inputs, endpoint: &str) -> Vec<Value> {
    let mut out = Vec::new();
    if i.ipv6_only {
        out.push(env("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE", "IPv6"));
    }
    out.push(env("AWS_REGION", &i.region));
    out.push(env("CSI_ENDPOINT", endpoint));
    out.push(node_name_env());
    out
}

/// A controller sidecar talking to the driver over the shared socket.
fn sidecar(name: &str, image: &str, args: Vec<String>, port_name: &str, port: u16, vac_fallback: bool) -> Value {
    let mut envs = vec![env("ADDRESS", CONTROLLER_SOCKET)];
    if vac_fallback {
        envs.push(env("ENABLE_VAC_FALLBACK", "true"));
    }
    json!({
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "args": args,
        "env": envs,
        "volumeMounts": [{"name": "socket-dir", "mountPath": CONTROLLER_SOCKET_DIR}],
        "ports": [{"name": port_name, "containerPort": port, "protocol": "TCP"}],
        "resources": resources(),
        "securityContext": restricted(true),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    })
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn controller_containers(i: &Inputs) -> Vec<Value> {
    let mut plugin_env = driver_env(i, &format!("unix://{CONTROLLER_SOCKET}"));
    plugin_env.push(optional_ref("AWS_ACCESS_KEY_ID", "secretKeyRef", "aws-secret", "key_id"));
    plugin_env.push(optional_ref("AWS_SECRET_ACCESS_KEY", "secretKeyRef", "aws-secret", "access_key"));
    plugin_env.push(match &i.ec2_endpoint {
        Some(url) => env("AWS_EC2_ENDPOINT", url),
        None => optional_ref("AWS_EC2_ENDPOINT", "configMapKeyRef", "aws-meta", "endpoint"),
    });
    plugin_env.push(optional_ref("AWS_SAGEMAKER_ENDPOINT", "configMapKeyRef", "aws-meta", "sagemaker_endpoint"));
    let probe = |failures: u32| json!({"httpGet": {"path": "/healthz", "port": "healthz"}, "initialDelaySeconds": 10, "timeoutSeconds": 60, "periodSeconds": 10, "failureThreshold": failures});
    let mut out = vec![json!({
        "name": "ebs-plugin",
        "image": i.images.driver,
        "imagePullPolicy": "IfNotPresent",
        "args": [
            "controller",
            "--endpoint=$(CSI_ENDPOINT)",
            format!("--k8s-tag-cluster-id={}", i.cluster_name),
            format!("--extra-tags={}", i.extra_tags),
            "--http-endpoint=0.0.0.0:3301",
            "--batching=true",
            "--logging-format=text",
            "--v=5",
        ],
        "env": plugin_env,
        "volumeMounts": [{"name": "socket-dir", "mountPath": CONTROLLER_SOCKET_DIR}],
        "ports": [
            {"name": "healthz", "containerPort": 9808, "protocol": "TCP"},
            {"name": "metrics", "containerPort": 3301, "protocol": "TCP"},
        ],
        "livenessProbe": probe(10),
        "readinessProbe": probe(5),
        "resources": resources(),
        "securityContext": restricted(true),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    })];
    let mut provisioner = strings(&[
        "--timeout=60s",
        "--csi-address=$(ADDRESS)",
        "--v=5",
        "--feature-gates=Topology=true",
        "--extra-create-metadata",
        "--leader-election=true",
        "--default-fstype=ext4",
    ]);
    provisioner.push(format!("--kube-api-qps={}", i.kube_api_qps));
    provisioner.push(format!("--kube-api-burst={}", i.kube_api_burst));
    provisioner.extend(strings(&[
        "--worker-threads=100",
        "--retry-interval-max=30m",
        "--feature-gates=VolumeAttributesClass=false",
        "--http-endpoint=0.0.0.0:3302",
    ]));
    out.push(sidecar("csi-provisioner", &i.images.provisioner, provisioner, "metrics-prov", 3302, true));
    let attacher = strings(&[
        "--timeout=6m",
        "--csi-address=$(ADDRESS)",
        "--v=5",
        "--leader-election=true",
        "--kube-api-qps=20",
        "--kube-api-burst=100",
        "--worker-threads=100",
        "--retry-interval-max=5m",
        "--feature-gates=MutableCSINodeAllocatableCount=true",
        "--http-endpoint=0.0.0.0:3303",
    ]);
    out.push(sidecar("csi-attacher", &i.images.attacher, attacher, "metrics-attach", 3303, false));
    if i.snapshotter {
        let snapshotter = strings(&[
            "--csi-address=$(ADDRESS)",
            "--leader-election=true",
            "--v=5",
            "--extra-create-metadata",
            "--kube-api-qps=20",
            "--kube-api-burst=100",
            "--worker-threads=100",
            "--retry-interval-max=30m",
            "--http-endpoint=0.0.0.0:3306",
        ]);
        out.push(sidecar("csi-snapshotter", &i.images.snapshotter, snapshotter, "metrics-snap", 3306, false));
    }
    let resizer = strings(&[
        "--timeout=60s",
        "--extra-modify-metadata",
        "--csi-address=$(ADDRESS)",
        "--v=5",
        "--handle-volume-inuse-error=false",
        "--leader-election=true",
        "--kube-api-qps=20",
        "--kube-api-burst=100",
        "--workers=100",
        "--retry-interval-max=30m",
        "--feature-gates=VolumeAttributesClass=false",
        "--http-endpoint=0.0.0.0:3304",
    ]);
    out.push(sidecar("csi-resizer", &i.images.resizer, resizer, "metrics-resizer", 3304, true));
    out.push(json!({
        "name": "liveness-probe",
        "image": i.images.liveness_probe,
        "imagePullPolicy": "IfNotPresent",
        "args": ["--csi-address=/csi/csi.sock", "--probe-timeout=60s", "--metrics-address=0.0.0.0:3305"],
        "volumeMounts": [{"name": "socket-dir", "mountPath": "/csi"}],
        "ports": [{"name": "metrics-lp", "containerPort": 3305, "protocol": "TCP"}],
        "resources": resources(),
        "securityContext": restricted(false),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }));
    out
}

fn controller(i: &Inputs) -> Value {
    let linux = json!({"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]});
    let terms: Vec<Value> = CONTROL_PLANE_LABELS
        .iter()
        .map(|label| {
            let mut exprs = Vec::new();
            if !i.external_permissions {
                exprs.push(json!({"key": label, "operator": "Exists"}));
            }
            exprs.push(linux.clone());
            json!({"matchExpressions": exprs})
        })
        .collect();
    let spread =
        |key: &str, when: &str| json!({"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": when, "labelSelector": {"matchLabels": selector(CONTROLLER)}});
    let mut pod = json!({
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "serviceAccountName": CONTROLLER_SA,
        "priorityClassName": "system-cluster-critical",
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms},
                "preferredDuringSchedulingIgnoredDuringExecution": [{
                    "preference": {"matchExpressions": [{"key": "eks.amazonaws.com/compute-type", "operator": "NotIn", "values": ["fargate", "auto", "hybrid"]}]},
                    "weight": 1,
                }],
            },
            "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                "podAffinityTerm": {
                    "labelSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": [CONTROLLER]}]},
                    "topologyKey": "kubernetes.io/hostname",
                },
                "weight": 100,
            }]},
        },
        "topologySpreadConstraints": [
            spread("topology.kubernetes.io/zone", "ScheduleAnyway"),
            spread("kubernetes.io/hostname", "DoNotSchedule"),
        ],
        "securityContext": {"fsGroup": 1000, "runAsGroup": 1000, "runAsNonRoot": true, "runAsUser": 1000},
        "containers": controller_containers(i),
        "volumes": [{"name": "socket-dir", "emptyDir": {}}],
    });
    if i.external_permissions {
        let mut tolerations =
            vec![json!({"key": "CriticalAddonsOnly", "operator": "Exists"}), json!({"effect": "NoExecute", "operator": "Exists", "tolerationSeconds": 300})];
        if i.control_plane_mode {
            for label in CONTROL_PLANE_LABELS.iter().rev() {
                tolerations.push(json!({"key": label, "operator": "Exists"}));
            }
        }
        pod["tolerations"] = json!(tolerations);
    } else {
        // On the control planes with the instances' credentials, which the metadata service
        // hands out to the host network only (hop limit 1).
        pod["hostNetwork"] = json!(true);
        pod["tolerations"] = json!([{"operator": "Exists"}]);
    }
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": i.meta(CONTROLLER, true),
        "spec": {
            "replicas": if i.ha_control_plane { 2 } else { 1 },
            "revisionHistoryLimit": 10,
            "strategy": {"rollingUpdate": {"maxUnavailable": 1}, "type": "RollingUpdate"},
            "selector": {"matchLabels": selector(CONTROLLER)},
            "template": {"metadata": i.pod_meta(CONTROLLER), "spec": pod},
        },
    })
}

/// The metrics Services of the controller's containers (port → Service name suffix).
fn metrics_services(i: &Inputs) -> Vec<Value> {
    let mut ports: Vec<(String, u16)> = vec![
        (CONTROLLER.to_string(), 3301),
        (format!("{CONTROLLER}-provisioner"), 3302),
        (format!("{CONTROLLER}-attacher"), 3303),
        (format!("{CONTROLLER}-resizer"), 3304),
        (format!("{CONTROLLER}-liveness-probe"), 3305),
    ];
    if i.snapshotter {
        ports.push((format!("{CONTROLLER}-snapshotter"), 3306));
    }
    ports
        .into_iter()
        .map(|(name, port)| {
            json!({
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {
                    "name": name,
                    "namespace": NAMESPACE,
                    "labels": {"app": name},
                    "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": port.to_string()},
                },
                "spec": {
                    "selector": {"app": CONTROLLER},
                    "ports": [{"name": "metrics", "port": port, "targetPort": port}],
                    "type": "ClusterIP",
                },
            })
        })
        .collect()
}

fn node(i: &Inputs) -> Value {
    let host_network = i.cfg.host_network == Some(true);
    let mut required = Vec::new();
    if !host_network {
        required.push(json!({"key": "topology.kubernetes.io/zone", "operator": "Exists"}));
    }
    required.push(json!({"key": "eks.amazonaws.com/compute-type", "operator": "NotIn", "values": ["fargate", "auto", "hybrid"]}));
    // The a1 (first Graviton) instance types cannot run the driver.
    required.push(json!({
        "key": "node.kubernetes.io/instance-type",
        "operator": "NotIn",
        "values": ["a1.medium", "a1.large", "a1.xlarge", "a1.2xlarge", "a1.4xlarge"],
    }));
    let mut args = strings(&["node", "--endpoint=$(CSI_ENDPOINT)", &format!("--csi-mount-point-prefix=/var/lib/kubelet/plugins/kubernetes.io/csi/{DRIVER}/")]);
    if let Some(limit) = i.cfg.volume_attach_limit {
        args.push(format!("--volume-attach-limit={limit}"));
    }
    args.extend(strings(&["--logging-format=text", "--v=5"]));
    let plugin = json!({
        "name": "ebs-plugin",
        "image": i.images.driver,
        "imagePullPolicy": "IfNotPresent",
        "args": args,
        "env": driver_env(i, "unix:/csi/csi.sock"),
        "volumeMounts": [
            {"name": "kubelet-dir", "mountPath": "/var/lib/kubelet", "mountPropagation": "Bidirectional"},
            {"name": "plugin-dir", "mountPath": "/csi"},
            {"name": "device-dir", "mountPath": "/dev"},
        ],
        "ports": [{"name": "healthz", "containerPort": 9808, "protocol": "TCP"}],
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "healthz"}, "initialDelaySeconds": 10, "timeoutSeconds": 3, "periodSeconds": 10, "failureThreshold": 5},
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "healthz"}, "timeoutSeconds": 3, "periodSeconds": 5, "failureThreshold": 3},
        "resources": resources(),
        "securityContext": {"privileged": true, "readOnlyRootFilesystem": true},
        "lifecycle": {"preStop": {"exec": {"command": ["/bin/aws-ebs-csi-driver", "pre-stop-hook"]}}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    });
    let registrar = json!({
        "name": "node-driver-registrar",
        "image": i.images.node_driver_registrar,
        "imagePullPolicy": "IfNotPresent",
        "args": ["--csi-address=$(ADDRESS)", "--kubelet-registration-path=$(DRIVER_REG_SOCK_PATH)", "--http-endpoint=0.0.0.0:9809", "--v=5"],
        "env": [env("ADDRESS", "/csi/csi.sock"), env("DRIVER_REG_SOCK_PATH", &format!("{NODE_PLUGIN_DIR}csi.sock"))],
        "ports": [{"name": "healthz-ndr", "containerPort": 9809}],
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "healthz-ndr"}, "initialDelaySeconds": 30, "periodSeconds": 90, "timeoutSeconds": 15},
        "volumeMounts": [
            {"name": "plugin-dir", "mountPath": "/csi"},
            {"name": "registration-dir", "mountPath": "/registration"},
            {"name": "probe-dir", "mountPath": NODE_PLUGIN_DIR},
        ],
        "resources": resources(),
        "securityContext": restricted(false),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    });
    let liveness = json!({
        "name": "liveness-probe",
        "image": i.images.liveness_probe,
        "imagePullPolicy": "IfNotPresent",
        "args": ["--csi-address=/csi/csi.sock"],
        "volumeMounts": [{"name": "plugin-dir", "mountPath": "/csi"}],
        "resources": resources(),
        "securityContext": restricted(false),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    });
    let host_dir = |name: &str, path: &str, kind: &str| json!({"name": name, "hostPath": {"path": path, "type": kind}});
    json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": i.meta(NODE, true),
        "spec": {
            "revisionHistoryLimit": 10,
            "selector": {"matchLabels": selector(NODE)},
            "updateStrategy": {"rollingUpdate": {"maxUnavailable": "10%"}, "type": "RollingUpdate"},
            "template": {
                "metadata": i.pod_meta(NODE),
                "spec": {
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": required}]}}},
                    "nodeSelector": {"kubernetes.io/os": "linux"},
                    "serviceAccountName": NODE_SA,
                    "terminationGracePeriodSeconds": 30,
                    "priorityClassName": "system-node-critical",
                    "tolerations": [{"operator": "Exists"}],
                    "hostNetwork": host_network,
                    "securityContext": {"fsGroup": 0, "runAsGroup": 0, "runAsNonRoot": false, "runAsUser": 0},
                    "containers": [plugin, registrar, liveness],
                    "volumes": [
                        host_dir("kubelet-dir", "/var/lib/kubelet", "Directory"),
                        host_dir("plugin-dir", NODE_PLUGIN_DIR, "DirectoryOrCreate"),
                        host_dir("registration-dir", "/var/lib/kubelet/plugins_registry/", "Directory"),
                        host_dir("device-dir", "/dev", "Directory"),
                        {"name": "probe-dir", "emptyDir": {}},
                    ],
                },
            },
        },
    })
}

fn csi_driver(i: &Inputs, versions: &Versions) -> Value {
    let mut spec = Map::new();
    spec.insert("attachRequired".into(), json!(true));
    spec.insert("podInfoOnMount".into(), json!(false));
    if versions.kubernetes().at_least(1, 35) {
        spec.insert("nodeAllocatableUpdatePeriodSeconds".into(), json!(10));
    }
    json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": i.meta(DRIVER, false), "spec": spec})
}

fn storage_class() -> Value {
    let parameters: BTreeMap<&str, &str> = [("type", "gp3"), ("encrypted", "true")].into_iter().collect();
    json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": DEFAULT_STORAGE_CLASS,
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            "labels": {"k8s-addon": NAME},
        },
        "provisioner": DRIVER,
        "parameters": parameters,
        "allowVolumeExpansion": true,
        "volumeBindingMode": "WaitForFirstConsumer",
    })
}

/// The addon's documents, or `None` when the cluster is not on AWS or the driver is off.
pub fn docs(cluster: &Cluster, versions: &Versions) -> Result<Option<Vec<Value>>, AwsEbsCsiError> {
    let spec = &cluster.spec;
    if spec.cloud_provider.as_deref() != Some("aws") {
        return Ok(None);
    }
    let default = EBSCSIDriverSpec::default();
    let cloud_config = spec.cloud_config.as_ref();
    let cfg = cloud_config.and_then(|c| c.aws_ebscsi_driver.as_ref()).unwrap_or(&default);
    if cfg.enabled == Some(false) || cfg.managed == Some(false) {
        return Ok(None);
    }
    let i = Inputs::new(cluster, cfg, versions)?;
    let mut docs = rbac(&i);
    docs.push(csi_driver(&i, versions));
    docs.extend(metrics_services(&i));
    docs.push(controller(&i));
    docs.push(json!({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": i.meta(CONTROLLER, true),
        "spec": {"selector": {"matchLabels": selector(CONTROLLER)}, "maxUnavailable": 1},
    }));
    docs.push(node(&i));
    if cloud_config.and_then(|c| c.manage_storage_classes) != Some(false) {
        docs.push(storage_class());
    }
    Ok(Some(docs))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::addons::tests::kind;

    fn container<'a>(workload: &'a Value, name: &str) -> &'a Value {
        let containers = workload["spec"]["template"]["spec"]["containers"].as_array().expect("containers");
        containers.iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("no container {name}"))
    }

    fn args(c: &Value) -> Vec<&str> {
        c["args"].as_array().expect("args").iter().filter_map(|a| a.as_str()).collect()
    }

    fn ha_docs(edit: impl FnOnce(&mut Cluster)) -> Vec<Value> {
        let (mut cluster, versions) = crate::addons::tests::ha();
        edit(&mut cluster);
        docs(&cluster, &versions).expect("valid").expect("on by default on AWS")
    }

    fn ebs(cluster: &mut Cluster) -> &mut EBSCSIDriverSpec {
        cluster.spec.cloud_config.get_or_insert_with(Default::default).aws_ebscsi_driver.get_or_insert_with(Default::default)
    }

    #[test]
    fn completion_fills_the_version_as_kops_does() {
        let (cluster, _) = crate::addons::tests::ha();
        let cc = cluster.spec.cloud_config.as_ref().expect("cloudConfig");
        assert_eq!(cc.manage_storage_classes, Some(true));
        assert_eq!(cc.aws_ebscsi_driver, Some(EBSCSIDriverSpec { version: Some("v1.58.0".into()), ..Default::default() }));
    }

    #[test]
    fn ha_renders_the_driver_tagged_with_the_cluster() {
        let docs = ha_docs(|_| {});
        let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
        assert_eq!(kinds.iter().filter(|k| **k == "ClusterRole").count(), 5, "{kinds:?}");
        assert_eq!(kinds.iter().filter(|k| **k == "ClusterRoleBinding").count(), 5, "{kinds:?}");
        assert_eq!(&kinds[..2], ["ServiceAccount", "ServiceAccount"]);
        assert_eq!(kinds.last(), Some(&"StorageClass"));

        let d = kind(&docs, "Deployment");
        assert_eq!(d["spec"]["replicas"], 2, "three control planes");
        let pod = &d["spec"]["template"]["spec"];
        assert_eq!(pod["hostNetwork"], true);
        assert_eq!(pod["tolerations"], json!([{"operator": "Exists"}]));
        assert_eq!(
            pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"][0]["key"],
            "node-role.kubernetes.io/control-plane"
        );
        let names: Vec<&str> = pod["containers"].as_array().expect("containers").iter().filter_map(|c| c["name"].as_str()).collect();
        assert_eq!(names, ["ebs-plugin", "csi-provisioner", "csi-attacher", "csi-resizer", "liveness-probe"]);
        let plugin = container(d, "ebs-plugin");
        assert_eq!(plugin["image"], "registry.k8s.io/provider-aws/aws-ebs-csi-driver:v1.58.0");
        assert_eq!(
            args(plugin),
            [
                "controller",
                "--endpoint=$(CSI_ENDPOINT)",
                "--k8s-tag-cluster-id=ha.k8s.example.com",
                "--extra-tags=KubernetesCluster=ha.k8s.example.com",
                "--http-endpoint=0.0.0.0:3301",
                "--batching=true",
                "--logging-format=text",
                "--v=5",
            ]
        );
        assert_eq!(plugin["env"][0], json!({"name": "AWS_REGION", "value": "eu-west-1"}));
        assert!(args(container(d, "csi-provisioner")).contains(&"--kube-api-qps=20"));
        assert_eq!(container(d, "csi-attacher")["image"], "registry.k8s.io/sig-storage/csi-attacher:v4.11.0");

        let ds = kind(&docs, "DaemonSet");
        let pod = &ds["spec"]["template"]["spec"];
        assert_eq!(pod["tolerations"], json!([{"operator": "Exists"}]));
        assert_eq!(pod["hostNetwork"], false);
        let plugin = container(ds, "ebs-plugin");
        assert_eq!(plugin["securityContext"]["privileged"], true);
        assert_eq!(plugin["volumeMounts"][0], json!({"name": "kubelet-dir", "mountPath": "/var/lib/kubelet", "mountPropagation": "Bidirectional"}));
        assert_eq!(container(ds, "node-driver-registrar")["env"][1]["value"], "/var/lib/kubelet/plugins/ebs.csi.aws.com/csi.sock");
        assert_eq!(container(ds, "liveness-probe")["image"], "registry.k8s.io/sig-storage/livenessprobe:v2.18.0");

        assert_eq!(kind(&docs, "CSIDriver")["metadata"]["name"], "ebs.csi.aws.com");
        assert!(kind(&docs, "CSIDriver")["spec"].get("nodeAllocatableUpdatePeriodSeconds").is_none(), "1.34 has no such field");
        let sc = kind(&docs, "StorageClass");
        assert_eq!(sc["metadata"]["name"], "kops-csi-1-21");
        assert_eq!(sc["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"], "true");
        assert_eq!(sc["provisioner"], "ebs.csi.aws.com");
        assert_eq!(sc["parameters"], json!({"encrypted": "true", "type": "gp3"}));
        assert_eq!(sc["volumeBindingMode"], "WaitForFirstConsumer");
    }

    #[test]
    fn addons_put_the_driver_after_dns() {
        let (cluster, versions) = crate::addons::tests::ha();
        let names: Vec<&str> = crate::addons::addons(&cluster, &versions).expect("addons").iter().map(|a| a.name).collect();
        let dns = names.iter().position(|n| *n == "coredns.addons.k8s.io").expect("dns");
        assert_eq!(names.get(dns + 1), Some(&NAME), "{names:?}");
    }

    #[test]
    fn disabled_or_unmanaged_drivers_get_no_addon() {
        let (cluster, versions) = crate::addons::tests::ha();
        for edit in [|e: &mut EBSCSIDriverSpec| e.enabled = Some(false), |e: &mut EBSCSIDriverSpec| e.managed = Some(false)] {
            let mut c = cluster.clone();
            edit(ebs(&mut c));
            assert!(docs(&c, &versions).expect("valid").is_none());
            let names: Vec<&str> = crate::addons::addons(&c, &versions).expect("addons").iter().map(|a| a.name).collect();
            assert!(!names.contains(&NAME), "{names:?}");
        }
    }

    #[test]
    fn other_clouds_get_no_driver() {
        let path = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/gce.yaml"));
        let spec = crate::load::load_spec(path).expect("load examples/gce.yaml");
        let options = crate::CompileOptions::default();
        let cluster = crate::complete::complete(&spec, &options).expect("complete");
        let versions = crate::complete::versions_for(&cluster.spec, &options).expect("versions");
        assert!(cluster.spec.cloud_config.as_ref().and_then(|c| c.aws_ebscsi_driver.as_ref()).is_none());
        assert!(docs(&cluster, &versions).expect("valid").is_none());
    }

    #[test]
    fn the_container_registry_remaps_every_image() {
        let (cluster, _) = crate::addons::tests::ha();
        let opts = crate::versions::LookupOptions { container_registry: Some("10.0.0.1:5000".into()), ..Default::default() };
        let versions = Versions::for_kubernetes(&"1.34.4".parse().expect("version"), &opts).expect("versions");
        let docs = docs(&cluster, &versions).expect("valid").expect("driver");
        let mut images = Vec::new();
        for w in ["Deployment", "DaemonSet"] {
            for c in kind(&docs, w)["spec"]["template"]["spec"]["containers"].as_array().expect("containers") {
                images.push(c["image"].as_str().expect("image").to_string());
            }
        }
        assert!(images.iter().all(|i| i.starts_with("10.0.0.1:5000/")), "{images:?}");
        assert!(images.contains(&"10.0.0.1:5000/provider-aws-aws-ebs-csi-driver:v1.58.0".to_string()), "{images:?}");
        assert!(images.contains(&"10.0.0.1:5000/sig-storage-csi-node-driver-registrar:v2.16.0".to_string()), "{images:?}");
    }

    #[test]
    fn the_spec_version_overrides_the_driver_image() {
        let docs = ha_docs(|c| ebs(c).version = Some("v1.45.0".into()));
        for w in ["Deployment", "DaemonSet"] {
            let workload = kind(&docs, w);
            assert_eq!(container(workload, "ebs-plugin")["image"], "registry.k8s.io/provider-aws/aws-ebs-csi-driver:v1.45.0");
            assert_eq!(workload["metadata"]["labels"]["app.kubernetes.io/version"], "v1.45.0");
        }
        assert_eq!(container(kind(&docs, "Deployment"), "csi-provisioner")["image"], "registry.k8s.io/sig-storage/csi-provisioner:v6.2.0");
    }

    #[test]
    fn spec_settings_reach_the_manifests() {
        let docs = ha_docs(|c| {
            let e = ebs(c);
            e.kube_apiqps = Some("50".parse().expect("quantity"));
            e.kube_api_burst = Some(200);
            e.volume_attach_limit = Some(25);
            e.host_network = Some(true);
            e.pod_annotations = Some([("a".to_string(), "b".to_string())].into_iter().collect());
            c.spec.cloud_labels = Some([("team".to_string(), "storage".to_string()), ("Owner".to_string(), "ops".to_string())].into_iter().collect());
            c.spec.snapshot_controller.get_or_insert_with(Default::default).enabled = Some(true);
            c.spec.cloud_config.get_or_insert_with(Default::default).manage_storage_classes = Some(false);
            c.metadata.annotations.get_or_insert_with(Default::default).insert(aws_endpoints::ANNOTATION.into(), "ec2=http://10.0.0.1:5000".into());
        });
        let d = kind(&docs, "Deployment");
        assert!(args(container(d, "ebs-plugin")).contains(&"--extra-tags=KubernetesCluster=ha.k8s.example.com,Owner=ops,team=storage"));
        assert!(container(d, "ebs-plugin")["env"].as_array().expect("env").contains(&json!({"name": "AWS_EC2_ENDPOINT", "value": "http://10.0.0.1:5000"})));
        let prov = args(container(d, "csi-provisioner"));
        assert!(prov.contains(&"--kube-api-qps=50") && prov.contains(&"--kube-api-burst=200"), "{prov:?}");
        assert_eq!(container(d, "csi-snapshotter")["image"], "registry.k8s.io/sig-storage/csi-snapshotter:v8.5.0");
        assert!(docs.iter().any(|x| x["metadata"]["name"] == "ebs-csi-controller-snapshotter"));
        assert_eq!(d["spec"]["template"]["metadata"]["annotations"], json!({"a": "b"}));
        let ds = kind(&docs, "DaemonSet");
        assert!(args(container(ds, "ebs-plugin")).contains(&"--volume-attach-limit=25"));
        assert_eq!(ds["spec"]["template"]["spec"]["hostNetwork"], true);
        let required = &ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
            ["matchExpressions"];
        assert_ne!(required[0]["key"], "topology.kubernetes.io/zone");
        assert!(!docs.iter().any(|x| x["kind"] == "StorageClass"), "manageStorageClasses: false");
    }

    #[test]
    fn service_account_permissions_move_the_controller_to_workers() {
        let docs = ha_docs(|c| c.spec.iam.get_or_insert_with(Default::default).use_service_account_external_permissions = Some(true));
        let pod = &kind(&docs, "Deployment")["spec"]["template"]["spec"];
        assert!(pod.get("hostNetwork").is_none());
        assert_eq!(pod["tolerations"][0], json!({"key": "CriticalAddonsOnly", "operator": "Exists"}));
        let terms = &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
        assert_eq!(terms[0]["matchExpressions"], json!([{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]));
    }

    #[test]
    fn bad_values_name_their_field() {
        let (cluster, versions) = crate::addons::tests::ha();
        let err = |edit: &dyn Fn(&mut Cluster)| {
            let mut c = cluster.clone();
            edit(&mut c);
            docs(&c, &versions).expect_err("invalid").to_string()
        };
        assert_eq!(
            err(&|c| ebs(c).version = Some("v1.58.0 latest".into())),
            "spec.cloudConfig.awsEBSCSIDriver.version: \"v1.58.0 latest\" is not an image tag"
        );
        assert_eq!(err(&|c| ebs(c).volume_attach_limit = Some(0)), "spec.cloudConfig.awsEBSCSIDriver.volumeAttachLimit: 0 must be positive");
        assert_eq!(err(&|c| ebs(c).kube_api_burst = Some(-1)), "spec.cloudConfig.awsEBSCSIDriver.kubeAPIBurst: -1 must be positive");
        assert!(err(&|c| c.spec.cloud_labels = Some([("a,b".to_string(), "x".to_string())].into_iter().collect())).starts_with("spec.cloudLabels[a,b]: "));
    }

    #[test]
    fn output_is_deterministic() {
        let a = ha_docs(|_| {});
        let b = ha_docs(|_| {});
        assert_eq!(a, b);
    }
}
