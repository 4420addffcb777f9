//! Which instance group a Node is of, on AWS.
//!
//! A Node's name is its instance's private DNS name: the join server issued the worker's kubelet
//! certificate for exactly that name after STS and EC2 vouched for the instance, and a control
//! plane's kubelet is named by IMDS `local-hostname`, the same name. So the instance is looked up
//! **by that name** (`DescribeInstances`, filter `private-dns-name`, pending or running), not by the
//! Node's `spec.providerID`, which the kubelet writes. Of the instances of that name, the one tagged
//! `KubernetesCluster=<cluster>` must be the only one (two VPCs may hold the same private address);
//! its group is its `kops.k8s.io/instancegroup` tag, accepted only when the instance is also in that
//! group's autoscaling group `<group>.<cluster>` — the `aws:autoscaling:groupName` tag, which only
//! Auto Scaling can write (the `aws:` prefix is reserved), so a retagged instance is refused.
//! The providerID, when set, must name that same instance: a Node that outlived its instance (the
//! private address reused by a new instance, the old Node not yet deleted) is left alone until the
//! cloud-controller-manager deletes it. A spot instance adds [`SPOT_LABEL`] (kOps' label).

use std::collections::BTreeMap;

use keelson_api::names;

use super::{unidentified, Identity, NodeFacts, Unidentified, INSTANCE_GROUP_LABEL};

/// kOps' label on Nodes of spot instances (`node-role.kubernetes.io/<lifecycle>-worker=true`).
pub const SPOT_LABEL: &str = "node-role.kubernetes.io/spot-worker";
const CLUSTER_TAG: &str = "KubernetesCluster";
use cloud::volumes::ASG_TAG;
/// Private DNS names per `DescribeInstances` call (a filter takes at most 200 values).
const NAMES_PER_CALL: usize = 100;

/// An instance as `DescribeInstances` describes it (what the decision needs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ec2Instance {
    pub id: String,
    /// `pending`, `running`, …
    pub state: String,
    pub private_dns_name: String,
    pub tags: BTreeMap<String, String>,
    /// `spot`, `capacity-block`, or `None` (on demand).
    pub lifecycle: Option<String>,
}

impl Ec2Instance {
    pub fn of(i: &aws_sdk_ec2::types::Instance) -> Ec2Instance {
        Ec2Instance {
            id: i.instance_id().unwrap_or_default().to_string(),
            state: i.state().and_then(|s| s.name()).map(|n| n.as_str().to_string()).unwrap_or_default(),
            private_dns_name: i.private_dns_name().unwrap_or_default().to_string(),
            tags: i.tags().iter().filter_map(|t| Some((t.key()?.to_string(), t.value().unwrap_or_default().to_string()))).collect(),
            lifecycle: i.instance_lifecycle().map(|l| l.as_str().to_string()),
        }
    }
}

/// The instance id of an AWS provider id (`aws:///<zone>/<id>`, `aws:///<id>`).
pub fn provider_instance_id(provider_id: &str) -> Option<&str> {
    let rest = provider_id.strip_prefix("aws://")?;
    rest.rsplit('/').next().filter(|id| id.starts_with("i-") && id.len() > 2)
}

/// Decide which group the Node is of from the instances EC2 listed (any; those not named as the
/// Node or not pending/running are ignored).
pub fn identify(node: &NodeFacts, cluster: &str, instances: &[Ec2Instance]) -> Result<Identity, Unidentified> {
    let name = &node.name;
    let named: Vec<&Ec2Instance> = instances.iter().filter(|i| &i.private_dns_name == name && matches!(i.state.as_str(), "pending" | "running")).collect();
    let ours: Vec<&Ec2Instance> = named.iter().copied().filter(|i| i.tags.get(CLUSTER_TAG).map(String::as_str) == Some(cluster)).collect();
    let instance = match (named.len(), ours.as_slice()) {
        (0, _) => return Err(unidentified("no-instance", format!("no pending or running instance has the private DNS name {name}"))),
        (_, []) => {
            let ids: Vec<&str> = named.iter().map(|i| i.id.as_str()).collect();
            return Err(unidentified("cluster", format!("the instances named {name} ({}) are not tagged {CLUSTER_TAG}={cluster}", ids.join(", "))));
        }
        (_, [one]) => *one,
        (_, many) => {
            let ids: Vec<&str> = many.iter().map(|i| i.id.as_str()).collect();
            return Err(unidentified("ambiguous", format!("several instances of cluster {cluster} are named {name}: {}", ids.join(", "))));
        }
    };
    let id = &instance.id;
    let group = instance.tags.get(INSTANCE_GROUP_LABEL).map(String::as_str).unwrap_or_default();
    if !super::valid_group_name(group) {
        return Err(unidentified("group", format!("instance {id} has no valid {INSTANCE_GROUP_LABEL} tag ({group:?})")));
    }
    let asg = instance.tags.get(ASG_TAG).map(String::as_str).unwrap_or_default();
    let want = names::autoscaling_group_name(group, cluster);
    if asg != want {
        return Err(unidentified("group", format!("instance {id} is tagged for group {group} but is in autoscaling group {asg:?}, not {want}")));
    }
    if let Some(p) = &node.provider_id {
        match provider_instance_id(p) {
            Some(pid) if pid == id => {}
            Some(pid) => {
                return Err(unidentified("provider-id", format!("Node {name} says it is instance {pid} (providerID {p}) but instance {id} holds that name")))
            }
            None => return Err(unidentified("provider-id", format!("Node {name} has providerID {p:?}, not an AWS instance's"))),
        }
    }
    let mut labels = BTreeMap::new();
    if instance.lifecycle.as_deref() == Some("spot") {
        labels.insert(SPOT_LABEL.to_string(), "true".to_string());
    }
    Ok(Identity { group: group.to_string(), instance: id.clone(), labels })
}

/// EC2 for the labeller.
#[derive(Debug, Clone)]
pub struct AwsNodes {
    ec2: aws_sdk_ec2::Client,
    cluster: String,
}

impl AwsNodes {
    pub fn new(ec2: aws_sdk_ec2::Client, cluster: impl Into<String>) -> AwsNodes {
        AwsNodes { ec2, cluster: cluster.into() }
    }

    /// The pending and running instances with one of these private DNS names.
    pub async fn describe(&self, names: &[&str]) -> Result<Vec<Ec2Instance>, String> {
        let mut out = Vec::new();
        for chunk in names.chunks(NAMES_PER_CALL) {
            let filter = |name: &str, values: &[&str]| {
                aws_sdk_ec2::types::Filter::builder().name(name).set_values(Some(values.iter().map(|v| v.to_string()).collect())).build()
            };
            let reservations = self
                .ec2
                .describe_instances()
                .filters(filter("private-dns-name", chunk))
                .filters(filter("instance-state-name", &["pending", "running"]))
                .into_paginator()
                .items()
                .send()
                .try_collect()
                .await
                .map_err(|e| format!("ec2:DescribeInstances (private-dns-name {}): {}", chunk.join(","), aws_sdk_ec2::error::DisplayErrorContext(e)))?;
            out.extend(reservations.iter().flat_map(|r| r.instances()).map(Ec2Instance::of));
        }
        Ok(out)
    }

    /// What EC2 vouches for, per Node (one `DescribeInstances` per [`NAMES_PER_CALL`] Nodes).
    pub async fn identify(&self, nodes: &[&NodeFacts]) -> Vec<Result<Identity, Unidentified>> {
        let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
        match self.describe(&names).await {
            Ok(instances) => nodes.iter().map(|n| identify(n, &self.cluster, &instances)).collect(),
            Err(e) => nodes.iter().map(|_| Err(unidentified("cloud", e.clone()))).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLUSTER: &str = "ha.example.com";
    const NAME: &str = "ip-10-0-1-5.ec2.internal";

    fn instance(id: &str, group: &str) -> Ec2Instance {
        Ec2Instance {
            id: id.into(),
            state: "running".into(),
            private_dns_name: NAME.into(),
            tags: BTreeMap::from([
                (CLUSTER_TAG.to_string(), CLUSTER.to_string()),
                (INSTANCE_GROUP_LABEL.to_string(), group.to_string()),
                (ASG_TAG.to_string(), format!("{group}.{CLUSTER}")),
            ]),
            lifecycle: None,
        }
    }

    fn node(provider_id: Option<&str>) -> NodeFacts {
        NodeFacts { name: NAME.into(), uid: "u".into(), provider_id: provider_id.map(str::to_string), ..Default::default() }
    }

    fn reason(r: Result<Identity, Unidentified>) -> &'static str {
        r.err().map(|u| u.reason).unwrap_or("ok")
    }

    #[test]
    fn the_group_is_that_of_the_only_cluster_instance_of_the_nodes_name() {
        let id = identify(&node(Some("aws:///us-east-1a/i-1")), CLUSTER, &[instance("i-1", "nodes")]).expect("identified");
        assert_eq!((id.group.as_str(), id.instance.as_str()), ("nodes", "i-1"));
        assert!(id.labels.is_empty());
        // A Node without a providerID is identified by its name alone.
        assert_eq!(identify(&node(None), CLUSTER, &[instance("i-1", "nodes")]).map(|i| i.group), Ok("nodes".to_string()));
        // Another VPC's instance of the same name (no cluster tag) does not count.
        let mut foreign = instance("i-9", "control-plane-a");
        foreign.tags.clear();
        assert_eq!(identify(&node(None), CLUSTER, &[foreign.clone(), instance("i-1", "nodes")]).map(|i| i.instance), Ok("i-1".to_string()));
        assert_eq!(reason(identify(&node(None), CLUSTER, &[foreign])), "cluster");
    }

    #[test]
    fn a_worker_cannot_borrow_another_groups_labels() {
        // Its own group tag rewritten to the control plane's: the autoscaling group says otherwise.
        let mut retagged = instance("i-1", "nodes");
        retagged.tags.insert(INSTANCE_GROUP_LABEL.into(), "control-plane-a".into());
        assert_eq!(reason(identify(&node(None), CLUSTER, &[retagged])), "group");
        // Its providerID naming a control plane's instance: refused, not looked up.
        assert_eq!(reason(identify(&node(Some("aws:///us-east-1a/i-cp")), CLUSTER, &[instance("i-1", "nodes")])), "provider-id");
        assert_eq!(reason(identify(&node(Some("gce://p/z/n")), CLUSTER, &[instance("i-1", "nodes")])), "provider-id");
        // A name no running instance has (a terminated one is ignored).
        let mut gone = instance("i-1", "nodes");
        gone.state = "terminated".into();
        assert_eq!(reason(identify(&node(None), CLUSTER, &[gone])), "no-instance");
        assert_eq!(reason(identify(&node(None), CLUSTER, &[])), "no-instance");
        // Two cluster instances of one name: nothing is decided.
        assert_eq!(reason(identify(&node(None), CLUSTER, &[instance("i-1", "nodes"), instance("i-2", "control-plane-a")])), "ambiguous");
        // No group tag, or one that would leave the state store's prefix.
        for group in ["", "../pki"] {
            let mut i = instance("i-1", "nodes");
            i.tags.insert(INSTANCE_GROUP_LABEL.into(), group.into());
            assert_eq!(reason(identify(&node(None), CLUSTER, &[i])), "group", "{group:?}");
        }
        // Another cluster's autoscaling group of the same group name.
        let mut other = instance("i-1", "nodes");
        other.tags.insert(ASG_TAG.into(), "nodes.other.example.com".into());
        assert_eq!(reason(identify(&node(None), CLUSTER, &[other])), "group");
    }

    #[test]
    fn spot_instances_get_the_spot_worker_label() {
        let mut spot = instance("i-1", "nodes");
        spot.lifecycle = Some("spot".into());
        let id = identify(&node(None), CLUSTER, &[spot]).expect("identified");
        assert_eq!(id.labels, BTreeMap::from([(SPOT_LABEL.to_string(), "true".to_string())]));
    }

    #[test]
    fn provider_ids_name_their_instance() {
        assert_eq!(provider_instance_id("aws:///us-east-1a/i-0abc"), Some("i-0abc"));
        assert_eq!(provider_instance_id("aws:///i-0abc"), Some("i-0abc"));
        assert_eq!(provider_instance_id("aws:///us-east-1a/"), None);
        assert_eq!(provider_instance_id("gce://p/z/i-0abc"), None);
        assert_eq!(provider_instance_id("aws:///us-east-1a/vol-1"), None);
    }
}
