//! `keelson validate cluster`, with kOps' semantics: every instance group has its expected number
//! of Ready nodes (each cloud instance of a group has joined as a Node), every node is Ready, and
//! every system pod in `kube-system` (the control plane's static pods — etcd, API server,
//! controller manager, scheduler — kube-proxy and the addons' workloads) is Ready.
//!
//! Instances are matched to Nodes by their private IP (the Node's `InternalIP`), so it works before
//! a cloud controller manager has set provider IDs.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Node, Pod};
use keelson_api::Role;
use kube::api::ListParams;
use serde::Serialize;

use cloud_resources::aws::AwsTarget;
use cloud_resources::model::ClusterModel;

use crate::instances::{self, Selection};

#[derive(Debug, thiserror::Error)]
pub enum ValidateError {
    #[error(transparent)]
    Cloud(#[from] instances::InstancesError),
    #[error("DescribeInstances: {message}")]
    Instances {
        message: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("Compute: {0}")]
    Gce(Box<cloud_resources::gce::ComputeError>),
    #[error("kubeconfig: {message} (run `keelson export kubeconfig -f SPEC --admin`, or give --kubeconfig)")]
    Config { message: String },
    #[error("Kubernetes API: {what}: {source}")]
    Kube {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
}

impl From<cloud_resources::gce::ComputeError> for ValidateError {
    fn from(e: cloud_resources::gce::ComputeError) -> Self {
        ValidateError::Gce(Box::new(e))
    }
}

/// One instance group as the cloud sees it: its in-service instances (id, private address).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudGroup {
    pub group: String,
    pub role: Role,
    pub min: i32,
    pub max: i32,
    pub instances: Vec<(String, Option<String>)>,
}

/// One instance group as validation sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupReport {
    pub name: String,
    pub role: String,
    pub min: i32,
    pub max: i32,
    /// Cloud instances in service.
    pub instances: usize,
    /// Of them, joined as Ready nodes.
    pub ready: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeReport {
    pub name: String,
    pub group: String,
    pub role: String,
    pub ready: bool,
}

/// Why the cluster is not valid: `kind` (`InstanceGroup`, `Machine`, `Node`, `Pod`), the object, the reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Failure {
    pub kind: String,
    pub name: String,
    pub message: String,
    /// The instance group the failure is about (`None`: the cluster as a whole, e.g. a system pod).
    #[serde(skip)]
    pub group: Option<String>,
    /// The failure is about a control plane.
    #[serde(skip)]
    pub control_plane: bool,
}

impl Failure {
    /// Whether the failure stops a rolling update of `group` (kOps' `hasFailureRelevantToGroup`):
    /// failures of that group, of a control plane, or of the cluster as a whole; not, say, another
    /// worker group below its minimum.
    pub fn relevant_to(&self, group: &str) -> bool {
        self.control_plane || self.group.as_deref().is_none_or(|g| g == group)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub cluster: String,
    pub groups: Vec<GroupReport>,
    pub nodes: Vec<NodeReport>,
    pub failures: Vec<Failure>,
}

impl Report {
    pub fn valid(&self) -> bool {
        self.failures.is_empty()
    }

    /// The tables kOps prints: instance groups, node status, validation errors, verdict.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut table = |title: &str, head: &[&str], rows: Vec<Vec<String>>| {
            out.push_str(title);
            out.push('\n');
            let mut widths: Vec<usize> = head.iter().map(|h| h.len()).collect();
            for r in &rows {
                for (i, c) in r.iter().enumerate() {
                    widths[i] = widths[i].max(c.len());
                }
            }
            let line = |cells: Vec<String>| {
                let padded: Vec<String> = cells.iter().enumerate().map(|(i, c)| format!("{c:<w$}", w = widths[i])).collect();
                format!("{}\n", padded.join("  ").trim_end())
            };
            out.push_str(&line(head.iter().map(|h| h.to_string()).collect()));
            for r in rows {
                out.push_str(&line(r));
            }
            out.push('\n');
        };
        table(
            "INSTANCE GROUPS",
            &["NAME", "ROLE", "MIN", "MAX", "INSTANCES", "READY"],
            self.groups
                .iter()
                .map(|g| vec![g.name.clone(), g.role.clone(), g.min.to_string(), g.max.to_string(), g.instances.to_string(), g.ready.to_string()])
                .collect(),
        );
        table(
            "NODE STATUS",
            &["NAME", "GROUP", "ROLE", "READY"],
            self.nodes.iter().map(|n| vec![n.name.clone(), n.group.clone(), n.role.clone(), n.ready.to_string()]).collect(),
        );
        if self.failures.is_empty() {
            out.push_str(&format!("Your cluster {} is ready\n", self.cluster));
        } else {
            table(
                "VALIDATION ERRORS",
                &["KIND", "NAME", "MESSAGE"],
                self.failures.iter().map(|f| vec![f.kind.clone(), f.name.clone(), f.message.clone()]).collect(),
            );
            out.push_str(&format!("Validation Failed: {} problem(s) in cluster {}\n", self.failures.len(), self.cluster));
        }
        out
    }
}

fn role_name(r: Role) -> &'static str {
    match r {
        Role::ControlPlane => "ControlPlane",
        Role::Node => "Node",
        Role::ApiServer => "APIServer",
        Role::Bastion => "Bastion",
    }
}

fn node_ready(n: &Node) -> bool {
    n.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn node_ips(n: &Node) -> Vec<String> {
    n.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(|a| a.iter().filter(|a| a.type_ == "InternalIP").map(|a| a.address.clone()).collect())
        .unwrap_or_default()
}

/// Why a pod is not Ready (`None` when it is, or when it ran to completion).
fn pod_problem(p: &Pod) -> Option<String> {
    let status = p.status.as_ref()?;
    let phase = status.phase.clone().unwrap_or_default();
    if phase == "Succeeded" {
        return None;
    }
    let ready = status.conditions.as_ref().is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    if ready {
        return None;
    }
    let waiting: Vec<String> = status
        .container_statuses
        .iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone().map(|r| format!("{}: {r}", c.name)))
        .collect();
    Some(if waiting.is_empty() { format!("not ready (phase {phase})") } else { format!("not ready ({})", waiting.join(", ")) })
}

/// A Kubernetes client from a kubeconfig (`path`, else `$KUBECONFIG` or `~/.kube/config`), using the
/// context named `context` when the kubeconfig has one (what `keelson export kubeconfig` writes),
/// else its current context.
pub async fn kube_client(path: Option<&std::path::Path>, context: &str) -> Result<kube::Client, ValidateError> {
    let kubeconfig = match path {
        Some(p) => kube::config::Kubeconfig::read_from(p),
        None => kube::config::Kubeconfig::read(),
    }
    .map_err(|e| ValidateError::Config { message: e.to_string() })?;
    let has_context = kubeconfig.contexts.iter().any(|c| c.name == context);
    let options = kube::config::KubeConfigOptions { context: has_context.then(|| context.to_string()), ..Default::default() };
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &options).await.map_err(|e| ValidateError::Config { message: e.to_string() })?;
    // No hidden retries of 429s: an eviction refused by a PodDisruptionBudget answers 429, and the
    // default policy (15 tries, backoff up to 1000 s) would outlast `--drain-timeout`. Validation
    // and the drain retry on their own schedules.
    config.default_retry = false;
    kube::Client::try_from(config).map_err(|source| ValidateError::Kube { what: "client", source })
}

/// Validate once.
pub async fn validate(target: &AwsTarget, model: &ClusterModel, kube: &kube::Client) -> Result<Report, ValidateError> {
    let groups = instances::status(target, model, &Selection::default()).await?;
    // Private IP of every instance in service.
    let ids: Vec<String> = groups.iter().flat_map(|g| g.instances.iter().filter(|i| i.lifecycle == "InService").map(|i| i.id.clone())).collect();
    let mut ip_of: BTreeMap<String, String> = BTreeMap::new();
    if !ids.is_empty() {
        let resp =
            target.ec2.describe_instances().set_instance_ids(Some(ids)).send().await.map_err(|e| ValidateError::Instances {
                message: aws_smithy_types::error::display::DisplayErrorContext(&e).to_string(),
                source: Box::new(e),
            })?;
        for i in resp.reservations().iter().flat_map(|r| r.instances()) {
            if let (Some(id), Some(ip)) = (i.instance_id(), i.private_ip_address()) {
                ip_of.insert(id.to_string(), ip.to_string());
            }
        }
    }
    let cloud: Vec<CloudGroup> = groups
        .iter()
        .map(|g| CloudGroup {
            group: g.group.clone(),
            role: g.role,
            min: g.min,
            max: g.max,
            instances: g.instances.iter().filter(|i| i.lifecycle == "InService").map(|i| (i.id.clone(), ip_of.get(&i.id).cloned())).collect(),
        })
        .collect();
    judge(&model.cluster, &cloud, kube).await
}

/// Validate a GCE cluster once: each instance group's MIGs (`listManagedInstances`, RUNNING) against
/// the Nodes, and the system pods, as on AWS.
pub async fn validate_gce(target: &cloud_resources::gce::GceTarget, model: &ClusterModel, kube: &kube::Client) -> Result<Report, ValidateError> {
    let groups = crate::gce_instances::groups(target, model).await?;
    let cloud: Vec<CloudGroup> =
        groups.into_iter().map(|g| CloudGroup { group: g.group, role: g.role, min: g.target, max: g.target, instances: g.instances }).collect();
    judge(&model.cluster, &cloud, kube).await
}

/// The Nodes and system pods, judged against the cloud's groups.
async fn judge(cluster: &str, groups: &[CloudGroup], kube: &kube::Client) -> Result<Report, ValidateError> {
    let nodes = kube::Api::<Node>::all(kube.clone()).list(&ListParams::default()).await.map_err(|source| ValidateError::Kube { what: "list nodes", source })?;
    let pods = kube::Api::<Pod>::namespaced(kube.clone(), "kube-system")
        .list(&ListParams::default())
        .await
        .map_err(|source| ValidateError::Kube { what: "list kube-system pods", source })?;
    Ok(report(cluster, groups, &nodes.items, &pods.items))
}

/// The report (pure): every in-service instance joined as a Ready Node (matched by private
/// address), every group at its minimum, every Node Ready, every system pod Ready, every
/// control-plane Node running the control plane.
pub fn report(cluster: &str, groups: &[CloudGroup], nodes: &[Node], pods: &[Pod]) -> Report {
    let node_by_ip: BTreeMap<String, &Node> = nodes.iter().flat_map(|n| node_ips(n).into_iter().map(move |ip| (ip, n))).collect();
    let mut report = Report { cluster: cluster.to_string(), groups: Vec::new(), nodes: Vec::new(), failures: Vec::new() };
    let mut fail = |kind: &str, name: &str, message: String, of: Option<(&str, Role)>| {
        report.failures.push(Failure {
            kind: kind.into(),
            name: name.into(),
            message,
            group: of.map(|(g, _)| g.to_string()),
            control_plane: of.is_some_and(|(_, r)| r == Role::ControlPlane),
        })
    };
    let mut known_nodes = BTreeSet::new();
    let mut group_reports = Vec::new();
    let mut node_reports = Vec::new();
    for g in groups {
        let mut ready = 0;
        for (id, ip) in &g.instances {
            let node = ip.as_ref().and_then(|ip| node_by_ip.get(ip));
            match node {
                None => fail("Machine", id, format!("instance of {} has not yet joined the cluster", g.group), Some((&g.group, g.role))),
                Some(n) => {
                    let name = n.metadata.name.clone().unwrap_or_default();
                    known_nodes.insert(name.clone());
                    let is_ready = node_ready(n);
                    if is_ready {
                        ready += 1;
                    } else {
                        fail("Node", &name, format!("node of {} is not ready", g.group), Some((&g.group, g.role)));
                    }
                    node_reports.push(NodeReport { name, group: g.group.clone(), role: role_name(g.role).into(), ready: is_ready });
                }
            }
        }
        if (ready as i32) < g.min {
            fail("InstanceGroup", &g.group, format!("did not have enough ready nodes: {ready} of at least {}", g.min), Some((&g.group, g.role)));
        }
        group_reports.push(GroupReport { name: g.group.clone(), role: role_name(g.role).into(), min: g.min, max: g.max, instances: g.instances.len(), ready });
    }
    for n in nodes {
        let name = n.metadata.name.clone().unwrap_or_default();
        if !known_nodes.contains(&name) && !node_ready(n) {
            fail("Node", &name, "node (of no instance group) is not ready".into(), None);
        }
    }
    for p in pods {
        if let Some(problem) = pod_problem(p) {
            fail("Pod", &format!("kube-system/{}", p.metadata.name.clone().unwrap_or_default()), format!("system pod {problem}"), None);
        }
    }
    // Every control-plane node runs the control plane.
    for n in node_reports.iter().filter(|n| n.role == "ControlPlane") {
        for component in ["kube-apiserver", "kube-controller-manager", "kube-scheduler"] {
            let want = format!("{component}-{}", n.name);
            if !pods.iter().any(|p| p.metadata.name.as_deref() == Some(want.as_str())) {
                fail("Pod", &format!("kube-system/{want}"), format!("control-plane node {} runs no {component}", n.name), Some((&n.group, Role::ControlPlane)));
            }
        }
        if !pods.iter().any(|p| p.metadata.name.as_deref().is_some_and(|m| m.starts_with("etcd-") && m.ends_with(&n.name))) {
            fail(
                "Pod",
                &format!("kube-system/etcd-*-{}", n.name),
                format!("control-plane node {} runs no etcd member", n.name),
                Some((&n.group, Role::ControlPlane)),
            );
        }
    }
    report.groups = group_reports;
    report.nodes = node_reports;
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_says_ready_or_lists_every_failure() {
        let mut r = Report {
            cluster: "c.example.com".into(),
            groups: vec![GroupReport { name: "nodes".into(), role: "Node".into(), min: 2, max: 3, instances: 2, ready: 1 }],
            nodes: vec![NodeReport { name: "ip-1".into(), group: "nodes".into(), role: "Node".into(), ready: true }],
            failures: Vec::new(),
        };
        assert!(r.valid());
        assert!(r.render().ends_with("Your cluster c.example.com is ready\n"), "{}", r.render());
        r.failures.push(Failure {
            kind: "InstanceGroup".into(),
            name: "nodes".into(),
            message: "did not have enough ready nodes: 1 of at least 2".into(),
            group: Some("nodes".into()),
            control_plane: false,
        });
        assert!(!r.valid());
        let text = r.render();
        assert!(text.contains("VALIDATION ERRORS\nKIND           NAME   MESSAGE\nInstanceGroup  nodes  did not have enough"), "{text}");
        assert!(text.contains("Validation Failed: 1 problem(s)"), "{text}");
        let json = serde_json::to_value(&r).expect("json");
        assert_eq!(json["failures"][0]["kind"], "InstanceGroup");
        assert!(json["failures"][0].get("group").is_none(), "{json}");
    }

    #[test]
    fn a_roll_of_a_group_stops_on_its_own_control_plane_and_cluster_wide_failures() {
        let f = |group: Option<&str>, control_plane: bool| Failure {
            kind: "K".into(),
            name: "n".into(),
            message: "m".into(),
            group: group.map(str::to_string),
            control_plane,
        };
        let cases = [
            (f(Some("nodes-a"), false), "nodes-a", true),
            (f(Some("nodes-b"), false), "nodes-a", false),
            (f(Some("control-plane-a"), true), "nodes-a", true),
            (f(Some("control-plane-a"), true), "control-plane-b", true),
            (f(None, false), "nodes-a", true),
        ];
        for (failure, group, want) in cases {
            assert_eq!(failure.relevant_to(group), want, "{failure:?} for {group}");
        }
    }
}
