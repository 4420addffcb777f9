//! `keelson get instances` (kOps' `get instances`): every instance of the cluster's groups as the
//! rolling update sees it ([`crate::rolling::status`]), with its Node's name when the Kubernetes
//! API answers. Pure: the groups and Nodes in, the rows out.

pub use k8s_openapi::api::core::v1::Node;
use serde::Serialize;

use crate::drain;
use crate::groups::{GroupStatus, DETACHED};

/// kOps' `CloudInstanceStatusUpToDate`.
pub const UP_TO_DATE: &str = "UpToDate";
/// kOps' `CloudInstanceStatusNeedsUpdate`.
pub const NEEDS_UPDATE: &str = "NeedsUpdate";

/// One instance, with kOps' JSON/YAML field names (`renderableCloudInstance`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceRow {
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// `UpToDate`, `NeedsUpdate`, or `Detached` (a surge took it out of its group; its replacement runs).
    pub status: String,
    /// kOps' role words: `control-plane`, `node`, `apiserver`, `bastion`.
    pub roles: Vec<String>,
    #[serde(rename = "internalIP")]
    pub internal_ip: String,
    #[serde(rename = "externalIP")]
    pub external_ip: String,
    pub instance_group: String,
    pub machine_type: String,
    /// The cloud's lifecycle word (`InService`, `Pending`, `Terminating`, …; GCE: the instance's status).
    pub state: String,
}

/// The rows of `groups` in their order, each instance's Node found by its private IP (as `validate
/// cluster` and the rolling update match them); a Node annotated for update makes its instance
/// `NeedsUpdate` (kOps' `AdjustNeedUpdate`).
pub fn rows(groups: &[GroupStatus], nodes: &[Node]) -> Vec<InstanceRow> {
    let mut groups = groups.to_vec();
    drain::adjust_need_update(&mut groups, nodes);
    let by_ip = drain::nodes_by_ip(nodes);
    groups
        .iter()
        .flat_map(|g| {
            let by_ip = &by_ip;
            g.instances.iter().map(move |i| {
                let status = if i.lifecycle == DETACHED {
                    DETACHED
                } else if i.outdated {
                    NEEDS_UPDATE
                } else {
                    UP_TO_DATE
                };
                InstanceRow {
                    id: i.id.clone(),
                    node_name: i.private_ip.as_ref().and_then(|ip| by_ip.get(ip)).and_then(|n| n.metadata.name.clone()),
                    status: status.to_string(),
                    roles: vec![g.role.state_dir().to_string()],
                    internal_ip: i.private_ip.clone().unwrap_or_default(),
                    external_ip: i.external_ip.clone().unwrap_or_default(),
                    instance_group: g.group.clone(),
                    machine_type: i.machine_type.clone().unwrap_or_default(),
                    state: i.lifecycle.clone(),
                }
            })
        })
        .collect()
}

/// One instance as `keelson toolbox dump` shows it: its `get instances` row and what an operator
/// debugging the cluster asks next.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DumpInstance {
    #[serde(flatten)]
    pub instance: InstanceRow,
    pub zone: String,
    /// The configuration it was launched from (AWS: the launch-template version; GCE: the
    /// instance template), and the one its group launches now.
    pub launched_from: String,
    pub group_launches: String,
    /// Its volumes (root included): AWS volume IDs, GCE disk names.
    pub volumes: Vec<String>,
    /// Its Node's `Ready` condition (`True`, `False`, `Unknown`); absent without a Node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_ready: Option<String>,
}

/// [`rows`] with each instance's zone, configurations, volumes and Node readiness.
pub fn dump(groups: &[GroupStatus], nodes: &[Node]) -> Vec<DumpInstance> {
    let ready = |name: &str| {
        let node = nodes.iter().find(|n| n.metadata.name.as_deref() == Some(name))?;
        let conditions = node.status.as_ref()?.conditions.as_ref()?;
        Some(conditions.iter().find(|c| c.type_ == "Ready").map_or_else(|| "Unknown".to_string(), |c| c.status.clone()))
    };
    let instances = groups.iter().flat_map(|g| g.instances.iter().map(move |i| (g, i)));
    rows(groups, nodes)
        .into_iter()
        .zip(instances)
        .map(|(row, (g, i))| DumpInstance {
            node_ready: row.node_name.as_deref().and_then(ready),
            instance: row,
            zone: i.zone.clone().unwrap_or_default(),
            launched_from: i.version.clone().unwrap_or_default(),
            group_launches: g.target_version.clone(),
            volumes: i.volumes.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::groups::InstanceStatus;
    use k8s_openapi::api::core::v1::{NodeAddress, NodeStatus};
    use keelson_api::Role;

    fn node(name: &str, ip: &str, needs_update: bool) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        if needs_update {
            n.metadata.annotations = Some([(drain::NEEDS_UPDATE.to_string(), String::new())].into());
        }
        n.status = Some(NodeStatus { addresses: Some(vec![NodeAddress { type_: "InternalIP".into(), address: ip.into() }]), ..Default::default() });
        n
    }

    fn inst(id: &str, ip: Option<&str>, lifecycle: &str, outdated: bool) -> InstanceStatus {
        InstanceStatus {
            private_ip: ip.map(Into::into),
            machine_type: Some("t3.medium".into()),
            zone: Some("us-east-1a".into()),
            volumes: vec!["vol-1".into()],
            ..InstanceStatus::for_test(id, lifecycle, outdated)
        }
    }

    fn group(group: &str, role: Role, instances: Vec<InstanceStatus>) -> GroupStatus {
        GroupStatus { name: format!("{group}.c"), group: group.into(), role, target_version: "1".into(), min: 1, max: 1, desired: 1, instances }
    }

    #[test]
    fn status_node_name_and_roles_as_kops_shows_them() {
        let groups = [
            group("control-plane-a", Role::ControlPlane, vec![inst("i-cp", Some("10.0.0.1"), "InService", false)]),
            group(
                "nodes",
                Role::Node,
                vec![
                    inst("i-new", Some("10.0.0.2"), "InService", false),
                    inst("i-old", Some("10.0.0.3"), "InService", true),
                    inst("i-marked", Some("10.0.0.4"), "InService", false),
                    inst("i-gone", Some("10.0.0.5"), DETACHED, true),
                    inst("i-booting", None, "Pending", false),
                ],
            ),
        ];
        let nodes = [node("cp", "10.0.0.1", false), node("new", "10.0.0.2", false), node("marked", "10.0.0.4", true)];
        let got = rows(&groups, &nodes);
        let brief: Vec<(&str, Option<&str>, &str, &str, &str)> =
            got.iter().map(|r| (r.id.as_str(), r.node_name.as_deref(), r.status.as_str(), r.roles[0].as_str(), r.instance_group.as_str())).collect();
        assert_eq!(
            brief,
            [
                ("i-cp", Some("cp"), UP_TO_DATE, "control-plane", "control-plane-a"),
                ("i-new", Some("new"), UP_TO_DATE, "node", "nodes"),
                ("i-old", None, NEEDS_UPDATE, "node", "nodes"),
                ("i-marked", Some("marked"), NEEDS_UPDATE, "node", "nodes"),
                ("i-gone", None, DETACHED, "node", "nodes"),
                ("i-booting", None, UP_TO_DATE, "node", "nodes"),
            ]
        );
        assert_eq!(got[5].state, "Pending");
        assert_eq!(got[5].internal_ip, "");
    }

    #[test]
    fn without_nodes_no_names_and_the_cloud_decides() {
        let groups = [group("nodes", Role::Node, vec![inst("i-1", Some("10.0.0.2"), "InService", true)])];
        let got = rows(&groups, &[]);
        assert_eq!((got[0].node_name.as_deref(), got[0].status.as_str()), (None, NEEDS_UPDATE));
    }

    #[test]
    fn dump_adds_zone_configurations_volumes_and_readiness() {
        let groups = [group("nodes", Role::Node, vec![inst("i-1", Some("10.0.0.2"), "InService", true), inst("i-2", Some("10.0.0.3"), "InService", false)])];
        let mut ready = node("n1", "10.0.0.2", false);
        ready.status.as_mut().unwrap().conditions =
            Some(vec![k8s_openapi::api::core::v1::NodeCondition { type_: "Ready".into(), status: "False".into(), ..Default::default() }]);
        let d = dump(&groups, &[ready]);
        assert_eq!(d.len(), 2);
        assert_eq!((d[0].instance.id.as_str(), d[0].node_ready.as_deref(), d[0].zone.as_str()), ("i-1", Some("False"), "us-east-1a"));
        assert_eq!((d[0].launched_from.as_str(), d[0].group_launches.as_str(), d[0].volumes.clone()), ("1", "1", vec!["vol-1".to_string()]));
        assert_eq!((d[1].instance.id.as_str(), d[1].node_ready.as_deref()), ("i-2", None), "no Node, no readiness");
        let v = serde_json::to_value(&d[0]).unwrap();
        assert!(v["id"] == "i-1" && v["nodeReady"] == "False" && v["launchedFrom"] == "1", "flattened with camelCase names: {v}");
    }

    #[test]
    fn json_has_kops_field_names() {
        let groups = [group("nodes", Role::Node, vec![inst("i-1", Some("10.0.0.2"), "InService", false)])];
        let v = serde_json::to_value(rows(&groups, &[node("n1", "10.0.0.2", false)])).unwrap();
        let keys: Vec<&str> = v[0].as_object().unwrap().keys().map(String::as_str).collect();
        for k in ["id", "nodeName", "status", "roles", "internalIP", "externalIP", "instanceGroup", "machineType", "state"] {
            assert!(keys.contains(&k), "{k} missing from {keys:?}");
        }
        assert_eq!(keys.len(), 9);
    }
}
