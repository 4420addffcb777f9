//! Which instance group a Node is of, on GCE: the chain the node join server checks
//! ([`crate::node_join::gce`]), started from the Node's name.
//!
//! A Node's name is its instance's name (the join server issued the kubelet certificate for it
//! after verifying the instance's identity token; a control plane's kubelet is named by its
//! hostname, whose first label is the instance name). Compute addresses an instance by zone and
//! name, and the zone comes from the Node (its providerID `gce://<project>/<zone>/<name>`, else its
//! `topology.kubernetes.io/zone` label): a hint, node-chosen, so what it leads to is verified —
//! the instance of that name in that zone is RUNNING, was made by a managed instance group of one
//! of the cluster's groups (`created-by`), that MIG lists it (same id), and the MIG's instance
//! template names the group (`kops-k8s-io-instance-group-name`); the instance's own metadata, which
//! it may rewrite, decides nothing. A wrong zone can only lead to another instance of the same
//! name: MIGs name instances `<base>-<4 characters>` with base = the group's GCE name, so two
//! instances of one name are of groups with the same GCE name — and a group whose GCE name another
//! group of the cluster shares is refused.

use std::sync::Mutex;
use std::time::Instant;

use base::node_join_gce::InstanceIdentity;
use base::StateStore;
use cloud::gce::instances::InstanceFacts;
use cloud::gce::ComputeReader;
use keelson_api::names;

use super::{unidentified, Identity, NodeFacts, Unidentified, GROUP_TTL};
use crate::node_join::gce::{cluster_mig, listed_template, template_group, MigLookup};

/// `gce://<project>/<zone>/<name>` → (project, zone, name).
pub fn provider_place(provider_id: &str) -> Option<(&str, &str, &str)> {
    let mut parts = provider_id.strip_prefix("gce://")?.split('/');
    let (project, zone, name) = (parts.next()?, parts.next()?, parts.next()?);
    (parts.next().is_none() && !project.is_empty() && !zone.is_empty() && !name.is_empty()).then_some((project, zone, name))
}

/// The zone to look the Node's instance up in: its providerID's (which must be of this project and
/// name the Node's own name), else its zone label.
pub fn zone_of(node: &NodeFacts, project: &str) -> Result<String, Unidentified> {
    let name = &node.name;
    if let Some(p) = &node.provider_id {
        let (their_project, zone, instance) =
            provider_place(p).ok_or_else(|| unidentified("provider-id", format!("Node {name} has providerID {p:?}, not a GCE instance's")))?;
        if their_project != project {
            return Err(unidentified("project", format!("Node {name} has providerID {p}, not of this cluster's project {project}")));
        }
        if instance != name {
            return Err(unidentified("provider-id", format!("Node {name} has providerID {p}, naming another instance")));
        }
        return Ok(zone.to_string());
    }
    node.zone
        .clone()
        .filter(|z| !z.is_empty())
        .ok_or_else(|| unidentified("zone", format!("Node {name} names no zone (no providerID, no {} label)", super::ZONE_LABEL)))
}

/// The instance of the Node's name must run.
pub fn check_running(node: &NodeFacts, instance: &InstanceFacts) -> Result<(), Unidentified> {
    if instance.name != node.name {
        return Err(unidentified("no-instance", format!("Compute answered instance {} for Node {}", instance.name, node.name)));
    }
    if instance.status != "RUNNING" {
        return Err(unidentified("not-running", format!("instance {} in {} is {}, not RUNNING", instance.name, instance.zone, instance.status)));
    }
    Ok(())
}

/// `group` must be the only group of the cluster with its GCE name (the base of its instances' names).
pub fn unique_base_name(group: &str, groups: &[String]) -> Result<(), Unidentified> {
    let base = names::gce_name(group);
    let same: Vec<&str> = groups.iter().filter(|g| names::gce_name(g) == base).map(String::as_str).collect();
    if same.len() > 1 {
        return Err(unidentified("ambiguous", format!("instance groups {} share the instance name base {base}", same.join(", "))));
    }
    Ok(())
}

/// Compute for the labeller.
pub struct GceNodes {
    compute: ComputeReader,
    project: String,
    cluster: String,
    store: StateStore,
    groups: Mutex<Option<(Instant, Vec<String>)>>,
}

fn compute_err(call: &str) -> impl FnOnce(cloud::gce::GoogleApiError) -> Unidentified + '_ {
    move |e| unidentified("cloud", format!("compute {call}: {e}"))
}

impl GceNodes {
    pub fn new(compute: ComputeReader, project: impl Into<String>, cluster: impl Into<String>, store: StateStore) -> GceNodes {
        GceNodes { compute, project: project.into(), cluster: cluster.into(), store, groups: Mutex::new(None) }
    }

    /// The names of the cluster's instance groups (`instancegroup/<name>`), cached [`GROUP_TTL`].
    async fn group_names(&self) -> Result<Vec<String>, Unidentified> {
        if let Ok(cache) = self.groups.lock() {
            if let Some((_, names)) = cache.as_ref().filter(|(at, _)| at.elapsed() < GROUP_TTL) {
                return Ok(names.clone());
            }
        }
        let keys = self.store.list("instancegroup/").await.map_err(|e| unidentified("store", e.to_string()))?;
        let names: Vec<String> =
            keys.iter().filter_map(|k| k.strip_prefix("instancegroup/")).filter(|n| super::valid_group_name(n)).map(str::to_string).collect();
        if let Ok(mut cache) = self.groups.lock() {
            *cache = Some((Instant::now(), names.clone()));
        }
        Ok(names)
    }

    async fn identify_one(&self, node: &NodeFacts, groups: &[String]) -> Result<Identity, Unidentified> {
        let zone = zone_of(node, &self.project)?;
        let instance = self
            .compute
            .instance(&zone, &node.name)
            .await
            .map_err(compute_err("instances.get"))?
            .ok_or_else(|| unidentified("no-instance", format!("no instance {} in zone {zone}", node.name)))?;
        check_running(node, &instance)?;
        let id = InstanceIdentity {
            project_id: self.project.clone(),
            project_number: String::new(),
            zone: instance.zone.clone(),
            instance_id: instance.id.clone(),
            instance_name: instance.name.clone(),
            issued_at: 0,
        };
        let (zone, mig, group) = cluster_mig(&id, &instance, &self.cluster, groups)?;
        unique_base_name(group, groups)?;
        let template = listed_template(&self.compute, &zone, &mig, &instance).await.map_err(|e| match e {
            MigLookup::Compute(call, e) => compute_err(call)(e),
            MigLookup::NoMig(message) => unidentified("managed", message),
            MigLookup::Refused(r) => r.into(),
        })?;
        let template = self
            .compute
            .template(&template)
            .await
            .map_err(compute_err("instanceTemplates.get"))?
            .ok_or_else(|| unidentified("template", format!("the instance template {template} of {mig} does not exist")))?;
        template_group(&template, group)?;
        Ok(Identity { group: group.to_string(), instance: instance.name, labels: Default::default() })
    }

    /// What Compute vouches for, per Node.
    pub async fn identify(&self, nodes: &[&NodeFacts]) -> Vec<Result<Identity, Unidentified>> {
        let groups = match self.group_names().await {
            Ok(g) => g,
            Err(e) => return nodes.iter().map(|_| Err(e.clone())).collect(),
        };
        let mut out = Vec::with_capacity(nodes.len());
        for n in nodes {
            out.push(self.identify_one(n, &groups).await);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(provider_id: Option<&str>, zone: Option<&str>) -> NodeFacts {
        NodeFacts { name: "nodes-x7k2".into(), provider_id: provider_id.map(str::to_string), zone: zone.map(str::to_string), ..Default::default() }
    }

    #[test]
    fn the_zone_comes_from_the_nodes_provider_id_or_label_and_must_fit() {
        assert_eq!(zone_of(&node(Some("gce://acme/europe-west1-b/nodes-x7k2"), Some("europe-west1-c")), "acme"), Ok("europe-west1-b".into()));
        assert_eq!(zone_of(&node(None, Some("europe-west1-c")), "acme"), Ok("europe-west1-c".into()));
        let reason = |n: NodeFacts| zone_of(&n, "acme").err().map(|u| u.reason);
        assert_eq!(reason(node(None, None)), Some("zone"));
        assert_eq!(reason(node(Some("gce://other/europe-west1-b/nodes-x7k2"), None)), Some("project"));
        assert_eq!(reason(node(Some("gce://acme/europe-west1-b/control-plane-b-abcd"), None)), Some("provider-id"));
        assert_eq!(reason(node(Some("aws:///us-east-1a/i-1"), None)), Some("provider-id"));
        assert_eq!(provider_place("gce://acme/europe-west1-b/n/extra"), None);
    }

    #[test]
    fn only_a_running_instance_of_the_nodes_name_counts() {
        let i = InstanceFacts {
            name: "nodes-x7k2".into(),
            id: "42".into(),
            zone: "europe-west1-b".into(),
            status: "RUNNING".into(),
            network_ip: None,
            self_link: String::new(),
            metadata: Default::default(),
        };
        check_running(&node(None, None), &i).expect("running");
        assert_eq!(check_running(&node(None, None), &InstanceFacts { status: "STOPPING".into(), ..i.clone() }).map_err(|u| u.reason), Err("not-running"));
        assert_eq!(check_running(&node(None, None), &InstanceFacts { name: "other".into(), ..i }).map_err(|u| u.reason), Err("no-instance"));
    }

    #[test]
    fn groups_sharing_an_instance_name_base_are_refused() {
        let groups = vec!["nodes".to_string(), "Nodes".to_string(), "control-plane-b".to_string()];
        assert_eq!(unique_base_name("nodes", &groups).map_err(|u| u.reason), Err("ambiguous"));
        unique_base_name("control-plane-b", &groups).expect("unique");
    }
}
