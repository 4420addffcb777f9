//! The cloud model: every resource a compiled cluster needs, with stable kOps names and tags,
//! derived from the completed spec, the instance groups and the compiled tree (user-data, state).
//! No I/O; the AWS and Terraform targets both render from this.

use std::collections::BTreeMap;

use keelson_api::{Cluster, Documents, InstanceGroup, Role};

use crate::Tree;

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
    #[error("Cluster/{cluster}: spec.cloudProvider {cloud:?}: keelson apply supports aws and gce")]
    UnsupportedCloud { cluster: String, cloud: String },
    #[error("Cluster/{cluster}: {field}: required for apply")]
    Missing { cluster: String, field: String },
    #[error("InstanceGroup/{group}: {field}: {message}")]
    Group { group: String, field: String, message: String },
    #[error("InstanceGroup/{group}: no user-data was compiled (give --nodeup-asset ARCH=SHA256@URL for the nodeup build instances boot)")]
    NoUserData { group: String },
    #[error("cluster-completed.yaml: {0}")]
    Completed(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloudKind {
    Aws,
    Gce,
}

/// The network: either existing (ids from the spec) or created by apply.
#[derive(Debug, Clone, PartialEq)]
pub struct Network {
    /// `Name` tag / Terraform name of the VPC.
    pub name: String,
    pub cidr: Option<String>,
    /// `spec.networkID`: use this VPC, never create or delete it.
    pub existing_id: Option<String>,
    pub subnets: Vec<Subnet>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Subnet {
    /// The spec's subnet name (`us-east-1a`); the cloud name is [`Subnet::cloud_name`].
    pub spec_name: String,
    pub cloud_name: String,
    pub zone: Option<String>,
    pub region: Option<String>,
    pub cidr: Option<String>,
    /// `Public`, `Private`, `Utility`, …
    pub kind: String,
    pub existing_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SecurityGroup {
    pub name: String,
    pub role: Role,
    pub description: String,
    pub tags: BTreeMap<String, String>,
    pub ingress: Vec<IngressRule>,
}

/// One ingress rule: `protocol` is `all` (every port) or `tcp`/`udp` with a port range.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct IngressRule {
    pub group: String,
    pub protocol: String,
    pub from_port: i32,
    pub to_port: i32,
    pub source: RuleSource,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum RuleSource {
    Cidr(String),
    Group(String),
}

impl IngressRule {
    /// A stable name: `masters.c: tcp/443 from 0.0.0.0/0`, `nodes.c: all from masters.c`.
    pub fn name(&self) -> String {
        let ports = if self.protocol == "all" {
            "all".to_string()
        } else if self.from_port == self.to_port {
            format!("{}/{}", self.protocol, self.from_port)
        } else {
            format!("{}/{}-{}", self.protocol, self.from_port, self.to_port)
        };
        let src = match &self.source {
            RuleSource::Cidr(c) => c.clone(),
            RuleSource::Group(g) => g.clone(),
        };
        format!("{}: {ports} from {src}", self.group)
    }
}

/// An AWS launch template / GCE instance template for one instance group.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchTemplate {
    pub name: String,
    pub group: String,
    pub role: Role,
    pub image: String,
    pub machine_type: String,
    pub hop_limit: i64,
    pub http_tokens: String,
    pub root_volume_size: i64,
    pub root_volume_type: String,
    pub root_volume_iops: Option<i64>,
    pub root_volume_throughput: Option<i64>,
    pub root_volume_encrypted: bool,
    pub security_groups: Vec<String>,
    pub additional_security_groups: Vec<String>,
    pub instance_profile: String,
    pub associate_public_ip: bool,
    pub user_data: String,
    pub tags: BTreeMap<String, String>,
}

/// An AWS autoscaling group / GCE managed instance group.
#[derive(Debug, Clone, PartialEq)]
pub struct AutoscalingGroup {
    pub name: String,
    pub group: String,
    pub role: Role,
    pub launch_template: String,
    pub min_size: i64,
    pub max_size: i64,
    /// Cloud names of the subnets (AWS) / the zones (GCE).
    pub subnets: Vec<String>,
    pub zones: Vec<String>,
    /// Tags propagated at launch.
    pub tags: BTreeMap<String, String>,
}

/// One etcd data volume (etcd cluster × member).
#[derive(Debug, Clone, PartialEq)]
pub struct EtcdVolume {
    pub name: String,
    pub etcd_cluster: String,
    pub member: String,
    pub zone: String,
    pub size_gib: i64,
    pub volume_type: String,
    pub iops: Option<i64>,
    pub throughput: Option<i64>,
    pub encrypted: bool,
    pub kms_key_id: Option<String>,
    pub tags: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Dns {
    /// `spec.dnsZone` (id or name); `None` = the zone whose name is the longest suffix of the cluster name.
    pub zone: Option<String>,
    pub private: bool,
    /// A records created with [`PLACEHOLDER_IP`] (protokube owns the value afterwards).
    pub records: Vec<String>,
}

/// Everything apply manages for one cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterModel {
    pub cluster: String,
    pub cloud: CloudKind,
    pub region: String,
    pub project: Option<String>,
    pub config_base: String,
    pub network: Network,
    pub security_groups: Vec<SecurityGroup>,
    pub launch_templates: Vec<LaunchTemplate>,
    pub groups: Vec<AutoscalingGroup>,
    pub volumes: Vec<EtcdVolume>,
    pub dns: Option<Dns>,
    /// etcd cluster names (for the CA keysets).
    pub etcd_clusters: Vec<String>,
    /// The `state/` subtree of the compiled output, keys relative to ConfigBase.
    pub state: BTreeMap<String, Vec<u8>>,
}

/// `Name`-style plural kOps uses for role-scoped resources (`masters.<cluster>`).
pub fn role_plural(role: Role) -> &'static str {
    match role {
        Role::ControlPlane => "masters",
        Role::Node => "nodes",
        Role::ApiServer => "apiservers",
        Role::Bastion => "bastions",
    }
}

/// The tags every resource of the cluster carries (kOps contract): how apply and delete find them.
pub fn cluster_tags(cluster: &str, name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("KubernetesCluster".to_string(), cluster.to_string()),
        (format!("kubernetes.io/cluster/{cluster}"), "owned".to_string()),
        ("Name".to_string(), name.to_string()),
    ])
}

fn role_tags(role: Role) -> Vec<(String, String)> {
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

/// The region of an AWS zone (`us-east-1a` → `us-east-1`; local zones keep their prefix).
pub fn region_of_zone(zone: &str) -> String {
    zone.trim_end_matches(|c: char| c.is_ascii_lowercase()).to_string()
}

/// Build the model. `completed` is the completed Cluster (from `cluster-completed.yaml`).
pub fn build(docs: &Documents, completed: &Cluster, tree: &Tree) -> Result<ClusterModel, ModelError> {
    build_with(docs, completed, tree, true)
}

/// [`build`], optionally tolerating missing user-data (delete needs names and tags, not boot scripts).
pub fn build_with(docs: &Documents, completed: &Cluster, tree: &Tree, require_user_data: bool) -> Result<ClusterModel, ModelError> {
    let cluster = completed.name().to_string();
    let spec = &completed.spec;
    let missing = |field: &str| ModelError::Missing { cluster: cluster.clone(), field: field.to_string() };
    let cloud = match spec.cloud_provider.as_deref() {
        Some("aws") => CloudKind::Aws,
        Some("gce") => CloudKind::Gce,
        other => {
            return Err(ModelError::UnsupportedCloud { cluster, cloud: other.unwrap_or_default().to_string() })
        }
    };
    let config_base = spec.config_base.clone().ok_or_else(|| missing("spec.configBase"))?;
    let spec_subnets = spec.subnets.clone().unwrap_or_default();
    let region = spec_subnets
        .iter()
        .find_map(|s| s.region.clone().or_else(|| s.zone.as_deref().map(region_of_zone)))
        .ok_or_else(|| missing("spec.subnets[].zone"))?;

    let subnets: Vec<Subnet> = spec_subnets
        .iter()
        .map(|s| {
            let spec_name = s.name.clone().unwrap_or_default();
            Subnet {
                cloud_name: format!("{spec_name}.{cluster}"),
                spec_name,
                zone: s.zone.clone(),
                region: s.region.clone(),
                cidr: s.cidr.clone(),
                kind: s.type_.clone().unwrap_or_else(|| "Public".into()),
                existing_id: s.id.clone(),
            }
        })
        .collect();
    if cloud == CloudKind::Aws {
        for s in &subnets {
            if s.existing_id.is_none() && (s.cidr.is_none() || s.zone.is_none()) {
                return Err(missing(&format!("spec.subnets[{}].cidr and .zone (or .id)", s.spec_name)));
            }
        }
        if spec.network_id.is_none() && spec.network_cidr.is_none() {
            return Err(missing("spec.networkCIDR (or spec.networkID)"));
        }
    }
    let network = Network {
        name: cluster.clone(),
        cidr: spec.network_cidr.map(|c| c.to_string()),
        existing_id: spec.network_id.clone(),
        subnets,
    };

    let cloud_labels = spec.cloud_labels.clone().unwrap_or_default();
    let mut roles: Vec<Role> = docs.instance_groups.iter().filter_map(InstanceGroup::role).collect();
    roles.sort();
    roles.dedup();
    let group_names: Vec<String> = roles.iter().map(|&r| format!("{}.{cluster}", role_plural(r))).collect();
    let ssh = spec.ssh_access.clone().unwrap_or_default();
    let api = spec.kubernetes_api_access.clone().unwrap_or_default();
    let security_groups = roles
        .iter()
        .map(|&role| {
            let name = format!("{}.{cluster}", role_plural(role));
            let mut tags = cloud_labels.clone();
            tags.extend(cluster_tags(&cluster, &name));
            // kOps' defaults: all traffic inside the cluster, SSH from sshAccess, the API (443) on the
            // control plane from kubernetesApiAccess.
            let rule = |protocol: &str, from_port: i32, to_port: i32, source: RuleSource| IngressRule {
                group: name.clone(),
                protocol: protocol.into(),
                from_port,
                to_port,
                source,
            };
            let mut ingress: Vec<IngressRule> =
                group_names.iter().map(|g| rule("all", -1, -1, RuleSource::Group(g.clone()))).collect();
            ingress.extend(ssh.iter().map(|c| rule("tcp", 22, 22, RuleSource::Cidr(c.clone()))));
            if matches!(role, Role::ControlPlane | Role::ApiServer) {
                ingress.extend(api.iter().map(|c| rule("tcp", 443, 443, RuleSource::Cidr(c.clone()))));
            }
            ingress.sort();
            ingress.dedup();
            SecurityGroup { description: format!("Security group for {}", role_plural(role)), name, role, tags, ingress }
        })
        .collect();

    let mut launch_templates = Vec::new();
    let mut groups = Vec::new();
    for ig in &docs.instance_groups {
        let group = ig.name().to_string();
        let g = &ig.spec;
        let gerr = |field: &str, message: &str| ModelError::Group {
            group: group.clone(),
            field: field.to_string(),
            message: message.to_string(),
        };
        let role = ig.role().ok_or_else(|| gerr("spec.role", "unknown role"))?;
        let name = format!("{group}.{cluster}");
        let image = g.image.clone().ok_or_else(|| gerr("spec.image", "required for apply"))?;
        let machine_type = g.machine_type.clone().ok_or_else(|| gerr("spec.machineType", "required for apply"))?;
        let user_data = match tree.files.get(&format!("userdata/{group}.sh")) {
            Some(b) => String::from_utf8_lossy(b).into_owned(),
            None if role == Role::Bastion || !require_user_data => String::new(),
            None => return Err(ModelError::NoUserData { group }),
        };
        let metadata = g.instance_metadata.clone().unwrap_or_default();
        let mut tags = cloud_labels.clone();
        tags.extend(g.cloud_labels.clone().unwrap_or_default());
        tags.extend(cluster_tags(&cluster, &name));
        tags.extend(role_tags(role));
        tags.insert("kops.k8s.io/instancegroup".into(), group.clone());
        for (k, v) in g.node_labels.iter().flatten() {
            tags.insert(format!("k8s.io/cluster-autoscaler/node-template/label/{k}"), v.clone());
        }
        let group_subnets = g.subnets.clone().unwrap_or_default();
        let mut subnet_names = Vec::new();
        let mut zones: Vec<String> = g.zones.clone().unwrap_or_default();
        for s in &group_subnets {
            let found = network
                .subnets
                .iter()
                .find(|n| &n.spec_name == s)
                .ok_or_else(|| gerr("spec.subnets", &format!("no subnet named {s:?} in the Cluster")))?;
            subnet_names.push(found.cloud_name.clone());
            if g.zones.is_none() {
                zones.extend(found.zone.clone());
            }
        }
        if subnet_names.is_empty() {
            return Err(gerr("spec.subnets", "at least one subnet is required for apply"));
        }
        let public = group_subnets.iter().any(|s| {
            network.subnets.iter().any(|n| &n.spec_name == s && matches!(n.kind.as_str(), "Public" | "Utility"))
        });
        launch_templates.push(LaunchTemplate {
            name: name.clone(),
            group: group.clone(),
            role,
            image,
            machine_type,
            hop_limit: metadata.http_put_response_hop_limit.unwrap_or(1),
            http_tokens: metadata.http_tokens.unwrap_or_else(|| "required".into()),
            root_volume_size: g.root_volume_size.unwrap_or(DEFAULT_ROOT_VOLUME_SIZE_GIB),
            root_volume_type: g.root_volume_type.clone().unwrap_or_else(|| DEFAULT_ROOT_VOLUME_TYPE.into()),
            root_volume_iops: g.root_volume_iops,
            root_volume_throughput: g.root_volume_throughput,
            root_volume_encrypted: g.root_volume_encryption.unwrap_or(true),
            security_groups: vec![g
                .security_group_override
                .clone()
                .unwrap_or_else(|| format!("{}.{cluster}", role_plural(role)))],
            additional_security_groups: g.additional_security_groups.clone().unwrap_or_default(),
            instance_profile: g
                .iam
                .as_ref()
                .and_then(|i| i.profile.clone())
                .unwrap_or_else(|| format!("{}.{cluster}", role_plural(role))),
            associate_public_ip: g.associate_public_ip.unwrap_or(public),
            user_data,
            tags: tags.clone(),
        });
        let min_size = g.min_size.unwrap_or(if role == Role::ControlPlane { 1 } else { 2 });
        groups.push(AutoscalingGroup {
            name: name.clone(),
            group,
            role,
            launch_template: name,
            min_size,
            max_size: g.max_size.unwrap_or(min_size),
            subnets: subnet_names,
            zones,
            tags,
        });
    }

    let mut volumes = Vec::new();
    let mut etcd_clusters = Vec::new();
    for etcd in spec.etcd_clusters.iter().flatten() {
        let ename = etcd.name.clone().unwrap_or_default();
        etcd_clusters.push(ename.clone());
        let members: Vec<String> = etcd.etcd_members.iter().flatten().filter_map(|m| m.name.clone()).collect();
        for m in etcd.etcd_members.iter().flatten() {
            let member = m.name.clone().unwrap_or_default();
            let ig_name = m.instance_group.clone().unwrap_or_default();
            let ig = docs
                .instance_groups
                .iter()
                .find(|g| g.name() == ig_name)
                .ok_or_else(|| missing(&format!("spec.etcdClusters[{ename}].etcdMembers[{member}].instanceGroup")))?;
            let zone = ig
                .spec
                .zones
                .iter()
                .flatten()
                .next()
                .cloned()
                .or_else(|| {
                    let s = ig.spec.subnets.iter().flatten().next()?;
                    network.subnets.iter().find(|n| &n.spec_name == s)?.zone.clone()
                })
                .ok_or_else(|| ModelError::Group {
                    group: ig_name.clone(),
                    field: "spec.subnets".into(),
                    message: format!("no zone for etcd member {member} of {ename}"),
                })?;
            let name = format!("{member}.etcd-{ename}.{cluster}");
            let mut tags = cloud_labels.clone();
            tags.extend(cluster_tags(&cluster, &name));
            tags.insert("k8s.io/role/master".into(), "1".into());
            tags.insert("k8s.io/role/control-plane".into(), "1".into());
            tags.insert(format!("k8s.io/etcd/{ename}"), format!("{member}/{}", members.join(",")));
            volumes.push(EtcdVolume {
                name,
                etcd_cluster: ename.clone(),
                member,
                zone,
                size_gib: m.volume_size.unwrap_or(DEFAULT_ETCD_VOLUME_SIZE_GIB),
                volume_type: m.volume_type.clone().unwrap_or_else(|| DEFAULT_ETCD_VOLUME_TYPE.into()),
                iops: m.volume_iops,
                throughput: m.volume_throughput,
                encrypted: m.encrypted_volume.unwrap_or(false) || m.kms_key_id.is_some(),
                kms_key_id: m.kms_key_id.clone(),
                tags,
            });
        }
    }

    let dns_type = spec.topology.as_ref().and_then(|t| t.dns.as_ref()).and_then(|d| d.type_.clone());
    let dns = if dns_type.as_deref() == Some("None") || cluster.ends_with(".k8s.local") {
        None
    } else {
        let mut records = vec![format!("api.{cluster}"), format!("api.internal.{cluster}")];
        for etcd in spec.etcd_clusters.iter().flatten() {
            let ename = etcd.name.clone().unwrap_or_default();
            let prefix = if ename == "main" { "etcd".to_string() } else { format!("etcd-{ename}") };
            for m in etcd.etcd_members.iter().flatten() {
                records.push(format!("{prefix}-{}.internal.{cluster}", m.name.clone().unwrap_or_default()));
            }
        }
        if let Some(public) = &spec.master_public_name {
            if !records.contains(public) {
                records[0] = public.clone();
            }
        }
        records.sort();
        records.dedup();
        Some(Dns { zone: spec.dns_zone.clone(), private: dns_type.as_deref() == Some("Private"), records })
    };

    let state = tree
        .files
        .iter()
        .filter_map(|(k, v)| k.strip_prefix("state/").map(|rel| (rel.to_string(), v.clone())))
        .collect();

    Ok(ClusterModel {
        cluster,
        cloud,
        region,
        project: spec.project.clone(),
        config_base,
        network,
        security_groups,
        launch_templates,
        groups,
        volumes,
        dns,
        etcd_clusters,
        state,
    })
}

/// Parse the completed Cluster out of a compiled tree.
pub fn completed_cluster(tree: &Tree) -> Result<Cluster, ModelError> {
    let bytes = tree
        .files
        .get("cluster-completed.yaml")
        .ok_or_else(|| ModelError::Completed("missing from the compiled tree".into()))?;
    serde_yaml_ng::from_slice(bytes).map_err(|e| ModelError::Completed(e.to_string()))
}
