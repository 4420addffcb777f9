//! The cluster-autoscaler addon (`cluster-autoscaler.addons.k8s.io`), rendered when
//! `spec.clusterAutoscaler.enabled` is true, on AWS and GCE. Its base is upstream's AWS example
//! manifest, kept verbatim as a data file ([`BASE_FILE`]; tag, commit and sha256 in the sibling
//! `SOURCE`), with kOps' settings laid over it. Facts from kOps' `cluster-autoscaler.addons.k8s.io/
//! k8s-1.15.yaml.template`, `template_functions.go` (`GetClusterAutoscalerNodeGroups`,
//! `ClusterAutoscalerPriorities`, `ControlPlaneControllerReplicas`) and `bootstrapchannelbuilder.go`
//! (the addon exists only when enabled). What the overlay does, as kOps' template does:
//! * every object carries kOps' labels (`app.kubernetes.io/name`, `k8s-addon`, `k8s-app`);
//! * the ClusterRole gains what kOps grants beyond upstream's (DRA objects, jobs/cronjobs, configmaps
//!   read cluster-wide); the Role is kOps' narrower one (create configmaps; get/update/delete only
//!   the status ConfigMap); a Service (metrics port 8085) and a PodDisruptionBudget are added; with
//!   the `priority` expander and `createPriorityExpanderConfig`, the priority ConfigMap;
//! * the Deployment runs on the control planes (required node affinity, their taints tolerated, host
//!   network: it uses the control planes' instance role), two replicas with a highly available
//!   control plane, spread over zones and hosts, `maxSurge: 0`; upstream's CA-bundle host path,
//!   security contexts and limits are not kOps' and go; requests from the spec;
//! * the command is kOps' flag list from the completed spec: one `--nodes=min:max:<group>` per
//!   autoscaled `Node` instance group (by name: the ASG `<group>.<cluster>` on AWS, each zone's MIG
//!   on GCE with the sizes split over the zones), not upstream's tag auto-discovery.
//!
//! Keelson's one addition: when the cluster names AWS endpoint overrides
//! ([`keelson_api::aws_endpoints::ANNOTATION`]: VPC endpoints, a partition, a local cloud), a
//! ConfigMap holds a cloud config whose `[ServiceOverride]` sections send the autoscaler's
//! `autoscaling` and `ec2` calls there (`--cloud-config`), as the AWS CCM's does.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{json, Value};

use super::upstream::Upstream;

use keelson_api::{aws_endpoints, Cluster, ClusterAutoscalerConfig, InstanceGroup, Role};

use crate::versions::Versions;

/// The addon's name (kOps' name for it).
pub const NAME: &str = "cluster-autoscaler.addons.k8s.io";
/// The base manifest, relative to this module's directory.
pub const BASE_FILE: &str = "addons/cluster_autoscaler/cluster-autoscaler-autodiscover.yaml";
const BASE: &str = include_str!("cluster_autoscaler/cluster-autoscaler-autodiscover.yaml");
const UPSTREAM: Upstream = Upstream { file: BASE_FILE, text: BASE };
const NAMESPACE: &str = "kube-system";
const APP: &str = "cluster-autoscaler";
const PRIORITY_CONFIG_MAP: &str = "cluster-autoscaler-priority-expander";
const CLOUD_CONFIG_MAP: &str = "cluster-autoscaler-cloud-config";
/// Where the container reads the cloud config with the endpoint overrides.
pub const CLOUD_CONFIG_PATH: &str = "/etc/kubernetes/cluster-autoscaler/cloud.config";
/// The aws-sdk-go (v1) endpoint ids the autoscaler's AWS provider resolves (its `[ServiceOverride]`
/// `Service` values), each the endpoint prefix the annotation names.
const AWS_SERVICES: &[&str] = &["autoscaling", "ec2"];

/// The base manifest does not have what the overlay edits.
#[derive(Debug, thiserror::Error)]
pub enum ClusterAutoscalerError {
    #[error("{BASE_FILE}: {message}")]
    Base { message: String },
    #[error("InstanceGroup/{group}: {message}")]
    Group { group: String, message: String },
}

fn base_error(message: impl Into<String>) -> ClusterAutoscalerError {
    ClusterAutoscalerError::Base { message: message.into() }
}

/// The cloud the autoscaler drives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Provider {
    /// AWS, in this region.
    Aws {
        region: String,
    },
    Gce,
}

impl Provider {
    fn name(&self) -> &'static str {
        match self {
            Provider::Aws { .. } => "aws",
            Provider::Gce => "gce",
        }
    }
}

/// One `--nodes` node group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeGroup {
    pub min: i64,
    pub max: i64,
    /// The ASG name (AWS) or the zonal MIG's URL (GCE).
    pub name: String,
}

/// What the overlay sets, read from the completed spec and the instance groups.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub config: ClusterAutoscalerConfig,
    pub provider: Provider,
    pub image: String,
    /// By node-group key (kOps ranges over a map, so in key order).
    pub node_groups: BTreeMap<String, NodeGroup>,
    pub replicas: u32,
    /// The priority expander's ConfigMap data (`priorities`), when kOps writes it.
    pub priorities: Option<String>,
    /// The cloud config with endpoint overrides (AWS, when the cluster names some).
    pub cloud_config: Option<String>,
}

/// `count` spread over `n` zones as kOps' `SplitCountAcrossZones` does (the first zones get the rest).
fn split(count: i64, n: usize) -> Vec<i64> {
    let n = n.max(1) as i64;
    (0..n).map(|i| count / n + i64::from(i < count % n)).collect()
}

/// The zones of a group (kOps' `FindZonesForInstanceGroup`: its own and its subnets', sorted).
fn zones(cluster: &Cluster, ig: &InstanceGroup) -> Result<Vec<String>, ClusterAutoscalerError> {
    let mut zones: std::collections::BTreeSet<String> = ig.spec.zones.iter().flatten().cloned().collect();
    for s in ig.spec.subnets.iter().flatten() {
        let subnet = cluster.spec.subnets.iter().flatten().find(|c| c.name.as_deref() == Some(s.as_str())).ok_or_else(|| ClusterAutoscalerError::Group {
            group: ig.name().to_string(),
            message: format!("spec.subnets: no subnet named {s:?} in the Cluster"),
        })?;
        zones.extend(subnet.zone.clone().filter(|z| !z.is_empty()));
    }
    Ok(zones.into_iter().collect())
}

/// kOps' `GetClusterAutoscalerNodeGroups`: every `Node` group whose `autoscale` is not `false`.
fn node_groups(cluster: &Cluster, groups: &[InstanceGroup], provider: &Provider) -> Result<BTreeMap<String, NodeGroup>, ClusterAutoscalerError> {
    let mut out = BTreeMap::new();
    for ig in groups.iter().filter(|g| g.role() == Some(Role::Node) && g.spec.autoscale != Some(false)) {
        let (min, max) = (ig.spec.min_size.unwrap_or(0), ig.spec.max_size.unwrap_or(0));
        let name = ig.name();
        match provider {
            Provider::Aws { .. } => {
                out.insert(name.to_string(), NodeGroup { min, max, name: keelson_api::names::autoscaling_group_name(name, cluster.name()) });
            }
            Provider::Gce => {
                let zones = zones(cluster, ig)?;
                if zones.is_empty() {
                    return Err(ClusterAutoscalerError::Group { group: name.to_string(), message: "no zones found for the instance group".into() });
                }
                let project = cluster.spec.project.as_deref().unwrap_or_default();
                let (mins, maxes) = (split(min, zones.len()), split(max, zones.len()));
                for (i, zone) in zones.iter().enumerate() {
                    // A zone whose max size is zero can never hold an instance.
                    if zones.len() > 1 && maxes[i] == 0 {
                        continue;
                    }
                    let mig = keelson_api::names::gce_instance_group_manager_name(zone, name, cluster.name());
                    let key = if zones.len() > 1 { format!("{name}-{zone}") } else { name.to_string() };
                    let url = format!("https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}/instanceGroups/{mig}");
                    out.insert(key, NodeGroup { min: mins[i], max: maxes[i], name: url });
                }
            }
        }
    }
    Ok(out)
}

/// kOps' `ClusterAutoscalerPriorities`: the custom map, else each autoscale-set `Node` group's
/// `autoscalePriority` → its `<group>.<cluster>`; priorities in string order, as a YAML map.
fn priorities(cfg: &ClusterAutoscalerConfig, cluster: &Cluster, groups: &[InstanceGroup]) -> String {
    let map: BTreeMap<String, Vec<String>> = match &cfg.custom_priority_expander_config {
        Some(custom) => custom.clone(),
        None => {
            let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
            let mut nodes: Vec<&InstanceGroup> = groups.iter().filter(|g| g.role() == Some(Role::Node) && g.spec.autoscale.is_some()).collect();
            nodes.sort_by(|a, b| a.name().cmp(b.name()));
            for g in nodes {
                map.entry(g.spec.autoscale_priority.unwrap_or(0).to_string()).or_default().push(format!("{}.{}", g.name(), cluster.name()));
            }
            map
        }
    };
    let mut lines = Vec::new();
    for (prio, names) in &map {
        lines.push(format!("{prio}:"));
        lines.extend(names.iter().map(|n| format!("- {n}")));
    }
    lines.join("\n")
}

/// The `[ServiceOverride]` cloud config for the autoscaler's AWS calls, when the cluster overrides
/// `autoscaling` or `ec2` endpoints.
pub fn cloud_config(region: &str, endpoints: &BTreeMap<String, String>) -> Option<String> {
    let mut out = String::new();
    let mut n = 0;
    for service in AWS_SERVICES {
        let Some(url) = endpoints.get(*service) else { continue };
        n += 1;
        let _ = write!(
            out,
            "[ServiceOverride \"{n}\"]\nService = {service}\nRegion = {region}\nURL = {url}\nSigningRegion = {region}\nSigningName = {service}\n\n"
        );
    }
    (n > 0).then(|| out.trim_end().to_string() + "\n")
}

impl Settings {
    /// `None` unless `spec.clusterAutoscaler.enabled` is true on AWS or GCE.
    pub fn new(cluster: &Cluster, groups: &[InstanceGroup], versions: &Versions) -> Result<Option<Settings>, ClusterAutoscalerError> {
        let spec = &cluster.spec;
        let Some(cfg) = spec.cluster_autoscaler.as_ref().filter(|c| c.enabled == Some(true)) else { return Ok(None) };
        let provider = match spec.cloud_provider.as_deref() {
            Some("aws") => Provider::Aws { region: keelson_api::plan::region(spec).unwrap_or_default() },
            Some("gce") => Provider::Gce,
            _ => return Ok(None),
        };
        let cloud_config = match &provider {
            // Validation reported a bad annotation already; a spec that got here has none or a good one.
            Provider::Aws { region } => cloud_config(region, &aws_endpoints::service_endpoints(cluster).unwrap_or_default()),
            Provider::Gce => None,
        };
        let control_planes = groups.iter().filter(|g| g.role() == Some(Role::ControlPlane)).count();
        let with_priorities = cfg.expander.as_deref() == Some("priority") && cfg.create_priority_expander_config == Some(true);
        Ok(Some(Settings {
            image: versions.remap_image(cfg.image.as_deref().unwrap_or_default()),
            node_groups: node_groups(cluster, groups, &provider)?,
            replicas: if control_planes > 1 { 2 } else { 1 },
            priorities: with_priorities.then(|| priorities(cfg, cluster, groups)),
            cloud_config,
            provider,
            config: cfg.clone(),
        }))
    }

    /// The container's command, in kOps' order.
    pub fn command(&self) -> Vec<String> {
        let c = &self.config;
        let b = |v: Option<bool>| v.unwrap_or(false).to_string();
        let s = |v: &Option<String>| v.clone().unwrap_or_default();
        let mut out = vec![
            "./cluster-autoscaler".to_string(),
            format!("--balance-similar-node-groups={}", b(c.balance_similar_node_groups)),
            format!("--emit-per-nodegroup-metrics={}", b(c.emit_per_nodegroup_metrics)),
            format!("--cloud-provider={}", self.provider.name()),
        ];
        if matches!(self.provider, Provider::Aws { .. }) {
            out.push(format!("--aws-use-static-instance-list={}", b(c.aws_use_static_instance_list)));
        }
        out.push(format!("--expander={}", s(&c.expander)));
        for g in self.node_groups.values() {
            out.push(format!("--nodes={}:{}:{}", g.min, g.max, g.name));
        }
        out.extend([
            format!("--ignore-daemonsets-utilization={}", b(c.ignore_daemon_sets_utilization)),
            format!("--scale-down-utilization-threshold={}", s(&c.scale_down_utilization_threshold)),
            format!("--skip-nodes-with-custom-controller-pods={}", b(c.skip_nodes_with_custom_controller_pods)),
            format!("--skip-nodes-with-local-storage={}", b(c.skip_nodes_with_local_storage)),
            format!("--skip-nodes-with-system-pods={}", b(c.skip_nodes_with_system_pods)),
            format!("--scale-down-delay-after-add={}", s(&c.scale_down_delay_after_add)),
            format!("--scale-down-unneeded-time={}", s(&c.scale_down_unneeded_time)),
            format!("--scale-down-unready-time={}", s(&c.scale_down_unready_time)),
            format!("--new-pod-scale-up-delay={}", s(&c.new_pod_scale_up_delay)),
            format!("--max-node-provision-time={}", s(&c.max_node_provision_time)),
            // kOps' template: an unset cordonNodeBeforeTerminating is true.
            format!("--cordon-node-before-terminating={}", c.cordon_node_before_terminating.unwrap_or(true)),
            "--logtostderr=true".to_string(),
            "--stderrthreshold=info".to_string(),
            "--v=4".to_string(),
        ]);
        if self.cloud_config.is_some() {
            out.push(format!("--cloud-config={CLOUD_CONFIG_PATH}"));
        }
        out
    }
}

/// The base's objects, in its order.
fn base() -> Result<Vec<Value>, ClusterAutoscalerError> {
    UPSTREAM.docs().map_err(|e| base_error(e.message))
}

fn take(docs: &mut Vec<Value>, kind: &str) -> Result<Value, ClusterAutoscalerError> {
    let i = docs.iter().position(|d| d["kind"] == kind && d["metadata"]["name"] == APP).ok_or_else(|| base_error(format!("no {kind} {APP}")))?;
    Ok(docs.remove(i))
}

fn labels() -> Value {
    json!({"app.kubernetes.io/name": APP, "k8s-addon": NAME, "k8s-app": APP})
}

fn labelled(mut doc: Value) -> Value {
    doc["metadata"]["labels"] = labels();
    doc
}

fn rule(groups: &[&str], resources: &[&str], names: &[&str], verbs: &[&str]) -> Value {
    let mut r = json!({"apiGroups": groups, "resources": resources, "verbs": verbs});
    if !names.is_empty() {
        r["resourceNames"] = json!(names);
    }
    r
}

/// What kOps' ClusterRole grants beyond upstream's: dynamic resource allocation objects, jobs and
/// cronjobs, configmaps read cluster-wide.
fn kops_extra_rules() -> Vec<Value> {
    vec![
        rule(&["resource.k8s.io"], &["resourceslices", "deviceclasses", "resourceclaims"], &[], &["watch", "list", "get"]),
        rule(&["batch"], &["jobs", "cronjobs"], &[], &["watch", "list", "get"]),
        rule(&[""], &["configmaps"], &[], &["list", "watch", "get"]),
    ]
}

fn cluster_role(mut d: Value) -> Result<Value, ClusterAutoscalerError> {
    let rules = d["rules"].as_array_mut().ok_or_else(|| base_error("the ClusterRole has no rules"))?;
    rules.extend(kops_extra_rules());
    Ok(labelled(d))
}

/// kOps' Role: create configmaps; only the status ConfigMap may be read, updated, deleted.
fn role(mut d: Value) -> Value {
    d["rules"] =
        json!([rule(&[""], &["configmaps"], &[], &["create"]), rule(&[""], &["configmaps"], &["cluster-autoscaler-status"], &["delete", "get", "update"]),]);
    labelled(d)
}

fn config_map(name: &str, key: &str, text: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels()},
        "data": {key: text},
    })
}

fn deployment(mut d: Value, s: &Settings) -> Result<Value, ClusterAutoscalerError> {
    let selector = json!({"matchLabels": {"app": APP}});
    let spec = d["spec"].as_object_mut().ok_or_else(|| base_error("the Deployment has no spec"))?;
    spec.insert("replicas".into(), json!(s.replicas));
    spec.insert("strategy".into(), json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0}}));
    let template = &mut d["spec"]["template"];
    let mut annotations = template["metadata"]["annotations"].as_object().cloned().ok_or_else(|| base_error("the pod template has no annotations"))?;
    for (k, v) in s.config.pod_annotations.iter().flatten() {
        annotations.insert(k.clone(), json!(v));
    }
    template["metadata"]["annotations"] = Value::Object(annotations);
    template["metadata"]["labels"] = json!({"app": APP, "k8s-addon": NAME, "k8s-app": APP, "app.kubernetes.io/name": APP});
    let pod = template["spec"].as_object_mut().ok_or_else(|| base_error("the pod template has no spec"))?;
    // Upstream's CA bundle from a host path (an Amazon Linux path) and its security context are not kOps'.
    pod.remove("securityContext");
    pod.remove("volumes");
    let exists = |key: &str| json!({"matchExpressions": [{"key": key, "operator": "Exists"}]});
    pod.insert(
        "affinity".into(),
        json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            exists("node-role.kubernetes.io/control-plane"),
            exists("node-role.kubernetes.io/master"),
        ]}}}),
    );
    pod.insert("dnsPolicy".into(), json!("ClusterFirst"));
    pod.insert("hostNetwork".into(), json!(true));
    pod.insert(
        "tolerations".into(),
        json!([
            {"operator": "Exists", "key": "node-role.kubernetes.io/control-plane"},
            {"operator": "Exists", "key": "node-role.kubernetes.io/master"},
        ]),
    );
    pod.insert("topologySpreadConstraints".into(), super::spread_over_zones_and_hosts(&selector));
    if s.cloud_config.is_some() {
        pod.insert("volumes".into(), json!([{"name": "cloud-config", "configMap": {"name": CLOUD_CONFIG_MAP}}]));
    }
    let containers = pod.get_mut("containers").and_then(Value::as_array_mut).ok_or_else(|| base_error("the pod has no containers"))?;
    let c = containers.iter_mut().find(|c| c["name"] == APP).and_then(Value::as_object_mut).ok_or_else(|| base_error("no cluster-autoscaler container"))?;
    if !c.get("command").and_then(Value::as_array).is_some_and(|a| a.first() == Some(&json!("./cluster-autoscaler"))) {
        return Err(base_error("the container's command does not start with ./cluster-autoscaler"));
    }
    c.remove("securityContext");
    c.remove("volumeMounts");
    c.insert("image".into(), json!(s.image));
    c.insert("imagePullPolicy".into(), json!("IfNotPresent"));
    c.insert("command".into(), json!(s.command()));
    if let Provider::Aws { region } = &s.provider {
        c.insert("env".into(), json!([{"name": "AWS_REGION", "value": region}]));
    }
    if s.cloud_config.is_some() {
        c.insert(
            "volumeMounts".into(),
            json!([{"name": "cloud-config", "mountPath": CLOUD_CONFIG_PATH.rsplit_once('/').map_or("/", |(dir, _)| dir), "readOnly": true}]),
        );
    }
    c.insert(
        "livenessProbe".into(),
        json!({"failureThreshold": 3, "httpGet": {"path": "/health-check", "port": "http", "scheme": "HTTP"}, "periodSeconds": 10, "successThreshold": 1, "timeoutSeconds": 1}),
    );
    c.insert("ports".into(), json!([{"containerPort": 8085, "name": "http", "protocol": "TCP"}]));
    let cpu = s.config.cpu_request.as_ref().map_or_else(|| "100m".to_string(), |q| q.to_string());
    let memory = s.config.memory_request.as_ref().map_or_else(|| "300Mi".to_string(), |q| q.to_string());
    c.insert("resources".into(), json!({"requests": {"cpu": cpu, "memory": memory}}));
    d["metadata"]["labels"] = labels();
    Ok(d)
}

/// The addon's objects for `s`, in kOps' order.
pub fn render(s: &Settings) -> Result<Vec<Value>, ClusterAutoscalerError> {
    let mut docs = base()?;
    let sa = take(&mut docs, "ServiceAccount")?;
    let cr = take(&mut docs, "ClusterRole")?;
    let crb = take(&mut docs, "ClusterRoleBinding")?;
    let role_doc = take(&mut docs, "Role")?;
    let rb = take(&mut docs, "RoleBinding")?;
    let dep = take(&mut docs, "Deployment")?;
    if let Some(d) = docs.first() {
        return Err(base_error(format!("an object the overlay does not know: {} {}", d["kind"], d["metadata"]["name"])));
    }
    let mut sa = labelled(sa);
    sa["automountServiceAccountToken"] = json!(true);
    let mut out = vec![
        json!({
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": APP, "namespace": NAMESPACE, "labels": labels()},
            "spec": {"selector": {"matchLabels": {"k8s-app": APP}}, "maxUnavailable": 1},
        }),
        sa,
        cluster_role(cr)?,
        labelled(crb),
        role(role_doc),
        labelled(rb),
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": APP, "namespace": NAMESPACE, "labels": labels()},
            "spec": {
                "ports": [{"port": 8085, "protocol": "TCP", "targetPort": 8085, "name": "http"}],
                "selector": {"app.kubernetes.io/name": APP},
                "type": "ClusterIP",
            },
        }),
    ];
    if let Some(p) = &s.priorities {
        out.push(config_map(PRIORITY_CONFIG_MAP, "priorities", p));
    }
    if let Some(text) = &s.cloud_config {
        out.push(config_map(CLOUD_CONFIG_MAP, "cloud.config", text));
    }
    out.push(deployment(dep, s)?);
    Ok(out)
}

/// The addon's objects, or `None` when `spec.clusterAutoscaler.enabled` is not true (or the cloud
/// is neither AWS nor GCE).
pub fn docs(cluster: &Cluster, groups: &[InstanceGroup], versions: &Versions) -> Result<Option<Vec<Value>>, ClusterAutoscalerError> {
    Settings::new(cluster, groups, versions)?.map(|s| render(&s)).transpose()
}

#[cfg(test)]
#[path = "cluster_autoscaler_tests.rs"]
mod tests;
