//! The cloud model: every task a compiled cluster needs, with stable kOps names and tags, made by
//! one builder per concern from the compiler's typed results (completed spec, user-data, state
//! files) and the instance groups: the network (VPC, subnets, routing), security groups, IAM, the API load
//! balancer, the instance groups (launch templates and autoscaling groups, or GCE instance
//! templates and managed instance groups), the etcd volumes and DNS. No I/O; the direct target and
//! Terraform both render these tasks.

use std::collections::BTreeMap;

use keelson_api::{Documents, InstanceGroup, Role};
use spec_compiler::Compiled;

use crate::aws::{self, Subnet as AwsSubnet, Vpc};
use crate::gce;
use crate::iam_policy::PolicyInputs;
use crate::tasks::Link;

mod dns;
mod gce_firewall;
mod gce_identity;
mod groups;
mod iam;
mod load_balancer;
mod network;
mod security_groups;
mod volumes;

pub use network::SpecSubnet;

/// Default etcd volume: 20 GiB gp3 (kOps' default).
pub const DEFAULT_ETCD_VOLUME_SIZE_GIB: i64 = 20;
pub const DEFAULT_ETCD_VOLUME_TYPE: &str = "gp3";
/// Default root volume (kOps: 64 GiB gp3 for every role since 1.27).
pub const DEFAULT_ROOT_VOLUME_SIZE_GIB: i64 = 64;
pub const DEFAULT_ROOT_VOLUME_TYPE: &str = "gp3";
/// Route53 TTL and the placeholder address protokube replaces with the real one (DESIGN.md).
pub const DNS_TTL: i64 = 60;
pub const PLACEHOLDER_IP: &str = "203.0.113.123";

/// Why a model could not be built from a spec.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("Cluster/{cluster}: spec.cloudProvider {cloud:?}: keelson apply supports {}", keelson_api::CloudProvider::served_names().join(" and "))]
    UnsupportedCloud { cluster: String, cloud: String },
    #[error("Cluster/{cluster}: {field}: required for apply")]
    Missing { cluster: String, field: String },
    #[error("Cluster/{cluster}: {field}: {message}")]
    Field { cluster: String, field: String, message: String },
    #[error("InstanceGroup/{group}: {field}: {message}")]
    Group { group: String, field: String, message: String },
    #[error("InstanceGroup/{group}: no user-data was compiled (give --nodeup-asset ARCH=SHA256@URL for the nodeup build instances boot)")]
    NoUserData { group: String },
}

/// The cloud of a model (AWS or GCE; validated when the model is built).
pub use keelson_api::CloudProvider as CloudKind;

/// The network's identity, as the targets find it: the cluster's name for it, the VPC and every
/// subnet of the spec (with the ids the spec gives for existing ones).
#[derive(Debug, Clone, PartialEq)]
pub struct Network {
    /// `Name` tag / Terraform name of the VPC (the cluster name).
    pub name: String,
    pub vpc: Link<Vpc>,
    pub subnets: Vec<Link<AwsSubnet>>,
}

/// The cluster's DNS (`None` for gossip clusters and `topology.dns.type: None`); its records are
/// [`aws::DnsRecord`] tasks.
#[derive(Debug, Clone, PartialEq)]
pub struct Dns {
    /// `spec.dnsZone` (id or name); `None` = the zone whose name is the longest suffix of the cluster name.
    pub zone: Option<String>,
    pub private: bool,
}

/// Everything apply manages for one cluster: the cluster's facts and the tasks the builders made
/// (AWS or GCE, by the cluster's cloud).
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterModel {
    pub cluster: String,
    pub cloud: CloudKind,
    pub region: String,
    pub project: Option<String>,
    pub config_base: String,
    pub network: Network,
    /// The AWS tasks (empty for GCE).
    pub tasks: aws::Tasks,
    /// The GCE tasks (empty for AWS).
    pub gce: gce::Tasks,
    pub dns: Option<Dns>,
    /// What the IAM policies are generated from (the hosted zone's id is only known to the target).
    pub policy_inputs: PolicyInputs,
    /// etcd cluster names (for the CA keysets).
    pub etcd_clusters: Vec<String>,
    /// `spec.encryptionConfig: true`: the state store holds `secrets/encryptionconfig` (created on
    /// first apply, with the CAs).
    pub encryption_config: bool,
    /// The `state/` subtree of the compiled output, keys relative to ConfigBase.
    pub state: BTreeMap<String, Vec<u8>>,
}

/// What every builder reads.
pub(crate) struct Context<'a> {
    pub cluster: &'a str,
    pub cloud: CloudKind,
    pub region: &'a str,
    pub spec: &'a keelson_api::generated::ClusterSpec,
    pub instance_groups: &'a [InstanceGroup],
    pub cloud_labels: BTreeMap<String, String>,
    pub subnets: Vec<SpecSubnet>,
    /// The VPC every AWS task links to.
    pub vpc: Link<Vpc>,
}

impl Context<'_> {
    pub fn missing(&self, field: &str) -> ModelError {
        ModelError::Missing { cluster: self.cluster.to_string(), field: field.to_string() }
    }
    /// `cloudLabels` then the cluster tags of `name`.
    pub fn tags(&self, name: &str) -> BTreeMap<String, String> {
        let mut tags = self.cloud_labels.clone();
        tags.extend(cluster_tags(self.cluster, name));
        tags
    }
    /// The spec's subnet of that name.
    pub fn subnet(&self, spec_name: &str) -> Option<&SpecSubnet> {
        self.subnets.iter().find(|s| s.spec_name == spec_name)
    }
}

pub use keelson_api::names::{role_plural, truncate_name};

/// The tags every resource of the cluster carries (kOps contract): how apply and delete find them.
pub fn cluster_tags(cluster: &str, name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("KubernetesCluster".to_string(), cluster.to_string()),
        (format!("kubernetes.io/cluster/{cluster}"), "owned".to_string()),
        ("Name".to_string(), name.to_string()),
    ])
}

/// The tags of a role's resources (instances inherit them from their group).
pub fn role_tags(role: Role) -> Vec<(String, String)> {
    match role {
        Role::ControlPlane => vec![
            ("k8s.io/role/master".into(), "1".into()),
            ("k8s.io/role/control-plane".into(), "1".into()),
            ("kops.k8s.io/instancegroup-role".into(), "ControlPlane".into()),
        ],
        Role::Node => vec![("k8s.io/role/node".into(), "1".into()), ("kops.k8s.io/instancegroup-role".into(), "Node".into())],
        Role::ApiServer => {
            vec![("k8s.io/role/apiserver".into(), "1".into()), ("kops.k8s.io/instancegroup-role".into(), "APIServer".into())]
        }
        Role::Bastion => {
            vec![("k8s.io/role/bastion".into(), "1".into()), ("kops.k8s.io/instancegroup-role".into(), "Bastion".into())]
        }
    }
}

/// Where a cluster lives and what its state store must hold: what a command needs before it
/// compiles (the cloud target, the state store, the keysets to create, then the CAs to pin),
/// read from the spec the one way [`build_with`] reads it. Compiling does not change any of it,
/// so the user's spec gives the same answer as the completed one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub cluster: String,
    pub cloud: CloudKind,
    pub region: String,
    pub project: Option<String>,
    pub config_base: String,
    /// etcd cluster names, in the spec's order (their CA keysets).
    pub etcd_clusters: Vec<String>,
    /// `spec.encryptionConfig: true` (the state store's `secrets/encryptionconfig`).
    pub encryption_config: bool,
}

/// The [`Location`] of a (validated) cluster.
pub fn locate(cluster: &keelson_api::Cluster) -> Result<Location, ModelError> {
    let name = cluster.name().to_string();
    let spec = &cluster.spec;
    let missing = |field: &str| ModelError::Missing { cluster: name.clone(), field: field.to_string() };
    // The one rule, shared with `keelson validate` (keelson_api::support: spec.cloudProvider).
    let cloud = match spec.cloud_provider.as_deref().and_then(CloudKind::parse) {
        Some(c) if c.served() => c,
        _ => return Err(ModelError::UnsupportedCloud { cluster: name, cloud: spec.cloud_provider.clone().unwrap_or_default() }),
    };
    Ok(Location {
        cloud,
        config_base: spec.config_base.clone().ok_or_else(|| missing("spec.configBase"))?,
        region: keelson_api::plan::region(spec).ok_or_else(|| missing("spec.subnets[].zone"))?,
        project: spec.project.clone(),
        etcd_clusters: spec.etcd_clusters.iter().flatten().filter_map(|e| e.name.clone()).collect(),
        encryption_config: spec.encryption_config == Some(true),
        cluster: name,
    })
}

impl ClusterModel {
    /// The model's [`Location`] (the facts it was built from).
    pub fn location(&self) -> Location {
        Location {
            cluster: self.cluster.clone(),
            cloud: self.cloud,
            region: self.region.clone(),
            project: self.project.clone(),
            config_base: self.config_base.clone(),
            etcd_clusters: self.etcd_clusters.clone(),
            encryption_config: self.encryption_config,
        }
    }
}

/// Build the model of a compiled cluster.
pub fn build(docs: &Documents, compiled: &Compiled) -> Result<ClusterModel, ModelError> {
    build_with(docs, compiled, true)
}

/// [`build`], optionally tolerating missing user-data (delete needs names and tags, not boot scripts).
/// Runs one builder per concern, each making its tasks.
pub fn build_with(docs: &Documents, compiled: &Compiled, require_user_data: bool) -> Result<ClusterModel, ModelError> {
    let completed = &compiled.completed;
    let cluster = completed.name().to_string();
    let spec = &completed.spec;
    let Location { cloud, config_base, region, encryption_config, .. } = locate(completed)?;
    let subnets = network::spec_subnets(&cluster, spec, cloud)?;
    let vpc = match &spec.network_id {
        Some(id) => Link::existing(id.clone(), id.clone()),
        None => Link::to(cluster.clone()),
    };
    let cx = Context {
        cluster: &cluster,
        cloud,
        region: &region,
        spec,
        instance_groups: &docs.instance_groups,
        cloud_labels: spec.cloud_labels.clone().unwrap_or_default(),
        subnets,
        vpc,
    };
    let mut tasks = aws::Tasks::default();
    let mut gce_tasks = gce::Tasks::default();
    match cloud {
        CloudKind::Aws => network::build(&cx, &mut tasks)?,
        _ => {
            network::build_gce(&cx, &mut gce_tasks);
            gce_firewall::build_gce(&cx, &mut gce_tasks);
        }
    }
    let lb_spec = load_balancer::spec(&cx);
    let target_group = lb_spec.map(|_| Link::to(load_balancer::target_group_name(&cluster)));
    let security_groups = security_groups::names(&cx, lb_spec);
    let instance_profiles = iam::role_names(&cx);
    if cloud == CloudKind::Aws {
        security_groups::build(&cx, lb_spec, &mut tasks);
    }
    let user_data = |group: &str| compiled.groups.get(group).and_then(|g| g.user_data.clone());
    let gce_accounts = if cloud == CloudKind::Gce { gce_identity::accounts(&cx)? } else { BTreeMap::new() };
    for g in groups::groups(&cx, &user_data, require_user_data)? {
        match cloud {
            CloudKind::Aws => g.build(&cx, &security_groups, &instance_profiles, target_group.as_ref(), &mut tasks),
            _ => {
                let account = gce_accounts.get(&g.role).cloned().ok_or_else(|| cx.missing("spec.project"))?;
                g.build_gce(&cx, &account, &mut gce_tasks)
            }
        }
    }
    let etcd_clusters = match cloud {
        CloudKind::Aws => volumes::build(&cx, &mut tasks)?,
        _ => volumes::build_gce(&cx, &mut gce_tasks)?,
    };
    let lb = match lb_spec {
        Some(lb) => Some(load_balancer::build(&cx, lb, &security_groups, &mut tasks)?),
        None => None,
    };
    let bootstrap = keelson_api::nodeup::node_bootstrap_method(completed.metadata.annotations.as_ref(), true);
    let bootstrap_token = bootstrap.as_ref().is_ok_and(|m| *m == keelson_api::nodeup::NodeBootstrapMethod::Token);
    let mut policy_inputs = PolicyInputs::new(&cluster, &region, &config_base, spec, &docs.instance_groups, bootstrap_token);
    policy_inputs.addon_roles = compiled.addons.service_accounts.iter().map(|a| a.permissions).collect();
    if cloud == CloudKind::Gce {
        gce_identity::build_gce(&cx, &config_base, bootstrap_token, &mut gce_tasks)?;
    }
    // IAM is validated for every cloud; its tasks are AWS's.
    let mut iam_tasks = aws::Tasks::default();
    iam::build(&cx, &policy_inputs, &compiled.addons.service_accounts, if cloud == CloudKind::Aws { &mut tasks } else { &mut iam_tasks })?;
    bootstrap.map_err(|e| ModelError::Field { cluster: cluster.clone(), field: e.field(), message: e.to_string() })?;
    let dns = dns::build(&cx, lb.as_ref(), if cloud == CloudKind::Aws { Some(&mut tasks) } else { None });

    let state = compiled.state_files().map(|(rel, v)| (rel.to_string(), v.clone())).collect();
    let network = Network { name: cluster.clone(), vpc: cx.vpc.clone(), subnets: cx.subnets.iter().map(SpecSubnet::link).collect() };
    Ok(ClusterModel {
        region: region.clone(),
        project: spec.project.clone(),
        config_base,
        network,
        tasks,
        gce: gce_tasks,
        dns,
        policy_inputs,
        etcd_clusters,
        encryption_config,
        state,
        cloud,
        cluster,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws::RecordTarget;

    const CLUSTER: &str = "apiVersion: kops.k8s.io/v1alpha2
kind: Cluster
metadata: {name: c.example.com}
spec:
  cloudProvider: aws
  configBase: s3://b/c.example.com
  networkCIDR: 10.0.0.0/16
  api: {loadBalancer: {class: Network, type: Public}}
  subnets:
  - {name: a, zone: eu-west-1a, cidr: 10.0.1.0/24, type: Public}
  etcdClusters:
  - {name: main, etcdMembers: [{name: a, instanceGroup: cp}]}
";

    fn group(name: &str, spec: &str) -> InstanceGroup {
        serde_yaml_ng::from_str(&format!("apiVersion: kops.k8s.io/v1alpha2\nkind: InstanceGroup\nmetadata: {{name: {name}}}\nspec: {spec}\n"))
            .expect("instance group")
    }

    fn model() -> ClusterModel {
        let cluster: keelson_api::Cluster = serde_yaml_ng::from_str(CLUSTER).expect("cluster");
        let instance_groups = vec![
            group("cp", "{role: ControlPlane, image: ami-1, machineType: t3.medium, subnets: [a]}"),
            group("nodes", "{role: Node, image: ami-1, machineType: t3.medium, subnets: [a], iam: {profile: custom}, additionalSecurityGroups: [sg-0abc]}"),
        ];
        let docs = Documents { cluster: cluster.clone(), instance_groups, additional_objects: Vec::new() };
        let compiled = Compiled { completed: cluster, groups: Default::default(), addons: Default::default(), tree: Default::default(), warnings: Vec::new() };
        build_with(&docs, &compiled, false).expect("model")
    }

    /// The builders make the tasks and link them: no task holds a copy of another's fields.
    #[test]
    fn builders_link_the_tasks_they_make() {
        let m = model();
        let lt = |group: &str| m.tasks.launch_templates.iter().find(|l| l.group == group).expect("launch template");
        let (cp, nodes) = (lt("cp"), lt("nodes"));
        assert_eq!(
            crate::terraform_json::terraform_string(&cp.instance_profile.tf()),
            "${aws_iam_instance_profile.masters-c-example-com.id}",
            "ours: a reference"
        );
        assert_eq!(nodes.instance_profile.tf(), "custom", "the spec's: as named");
        let sgs: Vec<String> = nodes.security_groups.iter().map(|s| crate::terraform_json::terraform_string(&s.tf())).collect();
        assert_eq!(sgs, ["${aws_security_group.nodes-c-example-com.id}", "sg-0abc"]);
        let asg = m.tasks.groups.iter().find(|g| g.group == "cp").expect("control-plane group");
        assert_eq!(asg.launch_template.name(), cp.name);
        assert_eq!(asg.target_groups.iter().map(|t| t.to_string()).collect::<Vec<_>>(), [m.tasks.target_groups[0].name.clone()]);
        assert!(m.tasks.groups.iter().find(|g| g.group == "nodes").is_some_and(|g| g.target_groups.is_empty()));
        assert_eq!(crate::terraform_json::terraform_string(&asg.subnets[0].tf()), "${aws_subnet.a-c-example-com.id}");
        let api = m.tasks.dns_records.iter().find(|r| r.name == "api.c.example.com").expect("api record");
        assert!(matches!(&api.target, RecordTarget::Alias(lb) if lb.name() == m.tasks.load_balancers[0].name), "{api:?}");
        assert_eq!(m.tasks.volumes[0].zone, "eu-west-1a");
        assert_eq!(crate::terraform_json::terraform_string(&m.network.vpc.tf()), "${aws_vpc.c-example-com.id}");
    }

    /// kOps' `CloudTagsForInstanceGroup`: the cluster-autoscaler's node template of each group, every
    /// node label (the kubelet's, the group's, the role's) and each taint with an effect.
    #[test]
    fn groups_carry_the_autoscalers_node_template() {
        let mut cluster: keelson_api::Cluster = serde_yaml_ng::from_str(CLUSTER).expect("cluster");
        cluster.spec.kubelet =
            Some(keelson_api::KubeletConfigSpec { node_labels: Some([("tier".to_string(), "web".to_string())].into()), ..Default::default() });
        let instance_groups = vec![
            group("cp", "{role: ControlPlane, image: ami-1, machineType: t3.medium, subnets: [a]}"),
            group(
                "gpu",
                "{role: Node, image: ami-1, machineType: t3.medium, subnets: [a], nodeLabels: {accel: nvidia}, taints: ['dedicated=gpu:NoSchedule', 'spot:PreferNoSchedule', 'noeffect']}",
            ),
        ];
        let docs = Documents { cluster: cluster.clone(), instance_groups, additional_objects: Vec::new() };
        let compiled = Compiled { completed: cluster, groups: Default::default(), addons: Default::default(), tree: Default::default(), warnings: Vec::new() };
        let m = build_with(&docs, &compiled, false).expect("model");
        let tags = |g: &str| m.tasks.groups.iter().find(|x| x.group == g).expect("group").tags.clone();
        let prefixed =
            |g: &str, p: &str| -> Vec<(String, String)> { tags(g).into_iter().filter_map(|(k, v)| k.strip_prefix(p).map(|k| (k.to_string(), v))).collect() };
        const LABEL: &str = "k8s.io/cluster-autoscaler/node-template/label/";
        const TAINT: &str = "k8s.io/cluster-autoscaler/node-template/taint/";
        let s = |a: &str, b: &str| (a.to_string(), b.to_string());
        assert_eq!(prefixed("gpu", LABEL), [s("accel", "nvidia"), s("node-role.kubernetes.io/node", ""), s("tier", "web")]);
        assert_eq!(prefixed("gpu", TAINT), [s("dedicated", "gpu:NoSchedule"), s("spot", ":PreferNoSchedule")]);
        let cp = prefixed("cp", LABEL);
        assert!(
            cp.contains(&s("node-role.kubernetes.io/control-plane", "")) && !cp.iter().any(|(k, _)| k == "tier"),
            "the control planes' kubelet is masterKubelet: {cp:?}"
        );
    }

    #[test]
    fn names_are_truncated_with_kops_hash() {
        assert_eq!(truncate_name("foo", 64, false), "foo");
        assert_eq!(truncate_name("this_string_is_33_characters_long", 64, true), "this_string_is_33_characters_long-t4mk8d");
        assert_eq!(truncate_name("this_string_is_longer_it_is_46_characters_long", 32, false), "this_string_is_longer_it_-ha2gug");
        assert_eq!(
            truncate_name("this_string_is_even_longer_due_to_extreme_verbosity_it_is_in_fact_84_characters_long", 64, false),
            "this_string_is_even_longer_due_to_extreme_verbosity_it_is-7mc0g6"
        );
    }
}
