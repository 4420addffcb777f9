//! The cloud model: every resource a compiled cluster needs, with stable kOps names and tags,
//! derived from the compiler's typed results (completed spec, user-data, state files) and the
//! instance groups.
//! No I/O; the AWS and Terraform targets both render from this.

use std::collections::BTreeMap;

use keelson_api::{Documents, InstanceGroup, Role};
use spec_compiler::Compiled;

/// Default etcd volume: 20 GiB gp3 (kOps' default).
pub const DEFAULT_ETCD_VOLUME_SIZE_GIB: i64 = 20;
pub const DEFAULT_ETCD_VOLUME_TYPE: &str = "gp3";
/// Default root volume (kOps: 64 GiB gp3 for every role since 1.27).
pub const DEFAULT_ROOT_VOLUME_SIZE_GIB: i64 = 64;
pub const DEFAULT_ROOT_VOLUME_TYPE: &str = "gp3";
/// Route53 TTL and the placeholder address protokube replaces with the real one (docs/design.md).
pub const DNS_TTL: i64 = 60;
pub const PLACEHOLDER_IP: &str = "203.0.113.123";

/// Why a model could not be built from a spec.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("Cluster/{cluster}: spec.cloudProvider {cloud:?}: keelson apply supports aws and gce")]
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

/// The network: either existing (ids from the spec) or created by apply.
#[derive(Debug, Clone, PartialEq)]
pub struct Network {
    /// `Name` tag / Terraform name of the VPC.
    pub name: String,
    pub cidr: Option<String>,
    /// `spec.networkID`: use this VPC, never create or delete it.
    pub existing_id: Option<String>,
    pub subnets: Vec<Subnet>,
    /// Internet gateway, NAT gateways and route tables: only for a VPC apply creates (an existing
    /// VPC keeps its own routing).
    pub routing: Option<Routing>,
}

/// Egress for a VPC apply creates (kOps' layout): one internet gateway and one public route table
/// for the Public/Utility subnets; per zone with Private subnets a NAT gateway (with its elastic IP)
/// in that zone's Utility subnet and a private route table sending 0.0.0.0/0 to it.
#[derive(Debug, Clone, PartialEq)]
pub struct Routing {
    pub internet_gateway: String,
    pub nat_gateways: Vec<NatGateway>,
    pub route_tables: Vec<RouteTable>,
    pub tags: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct NatGateway {
    /// `<zone>.<cluster>`; its elastic IP has the same name.
    pub name: String,
    pub zone: String,
    /// Cloud name of the Utility subnet it sits in.
    pub subnet: String,
    pub tags: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RouteTable {
    pub name: String,
    pub routes: Vec<Route>,
    /// Cloud names of the subnets associated with it.
    pub subnets: Vec<String>,
    pub tags: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Route {
    pub cidr: String,
    pub target: RouteTarget,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum RouteTarget {
    /// The cluster's internet gateway (by name).
    InternetGateway(String),
    /// A NAT gateway apply creates (by name).
    NatGateway(String),
    /// `egress: nat-…` — an existing NAT gateway id.
    ExistingNatGateway(String),
    /// `egress: i-…` — an existing NAT instance id.
    Instance(String),
}

impl RouteTarget {
    /// The comparable form used in plans: `igw:<name>`, `nat:<name>`, `nat-id:<id>`, `instance:<id>`.
    pub fn label(&self) -> String {
        match self {
            RouteTarget::InternetGateway(n) => format!("igw:{n}"),
            RouteTarget::NatGateway(n) => format!("nat:{n}"),
            RouteTarget::ExistingNatGateway(id) => format!("nat-id:{id}"),
            RouteTarget::Instance(id) => format!("instance:{id}"),
        }
    }
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
    /// `egress`: `nat-…`, `i-…` or `External` (routing left to the user).
    pub egress: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SecurityGroup {
    pub name: String,
    /// The instance-group role it protects (`None` for the API load balancer's group).
    pub role: Option<Role>,
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
    /// A stable name: `masters.c: tcp/443 from 0.0.0.0/0`, `nodes.c: all from masters.c`,
    /// `masters.c: 4/all from nodes.c` (a protocol without ports).
    pub fn name(&self) -> String {
        let ports = if self.protocol == "all" {
            "all".to_string()
        } else if !self.has_ports() {
            format!("{}/all", self.protocol)
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

    /// Whether the protocol has ports (TCP, UDP, ICMP types): for `all` and the others (IP-in-IP
    /// is `4`) AWS admits every port and the rule carries -1.
    pub fn has_ports(&self) -> bool {
        protocol_has_ports(&self.protocol)
    }
}

/// TCP, UDP and ICMP (by name or number) have ports; other protocols do not.
pub fn protocol_has_ports(protocol: &str) -> bool {
    matches!(protocol, "tcp" | "udp" | "icmp" | "icmpv6" | "6" | "17" | "1" | "58")
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
    /// Public address on the primary interface: the spec's `associatePublicIp`, else whether the
    /// group's subnets are public.
    pub associate_public_ip: bool,
    /// `associatePublicIp` was set in the spec: AWS then gets an explicit network interface
    /// (otherwise the subnet's own setting applies).
    pub associate_public_ip_explicit: bool,
    /// Exactly the bytes the instance gets (script, MIME message, or gzip of either).
    pub user_data: Vec<u8>,
    /// Spot request on the template (`maxPrice` without a mixed-instances policy).
    pub spot: Option<SpotOptions>,
    /// `cpuCredits` for burstable types (`standard` / `unlimited`).
    pub cpu_credits: Option<String>,
    pub tags: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SpotOptions {
    /// Empty: up to the on-demand price.
    pub max_price: Option<String>,
    /// `terminate` (AWS default), `stop` or `hibernate`.
    pub interruption_behavior: String,
}

/// `mixedInstancesPolicy`: several instance types, on-demand base and percentage, spot strategy.
/// AWS defaults are filled in so what exists compares equal to what is wanted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MixedInstances {
    pub instance_types: Vec<String>,
    pub on_demand_allocation_strategy: String,
    pub on_demand_base: i64,
    pub on_demand_above_base: i64,
    pub spot_allocation_strategy: String,
    /// Only for `lowest-price`.
    pub spot_instance_pools: Option<i64>,
    pub spot_max_price: Option<String>,
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
    /// Target groups (names) the group's instances register with: the API load balancer's for
    /// control-plane groups.
    pub target_groups: Vec<String>,
    pub mixed: Option<MixedInstances>,
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
    /// Alias records pointing at the API load balancer.
    pub alias_records: Vec<String>,
}

/// An IAM role with its inline policy, and the instance profile of the same name.
#[derive(Debug, Clone, PartialEq)]
pub struct IamRole {
    /// `masters.<cluster>` / `nodes.<cluster>` (64 characters at most, kOps' truncation).
    pub name: String,
    pub role: Role,
    /// Managed policies attached (`spec.externalPolicies`).
    pub managed_policies: Vec<String>,
    /// `spec.additionalPolicies` statements for this role, appended to the generated policy.
    pub additional_statements: Vec<serde_json::Value>,
    pub permissions_boundary: Option<String>,
    pub tags: BTreeMap<String, String>,
}

/// The API's network load balancer (`spec.api.loadBalancer`, class Network).
#[derive(Debug, Clone, PartialEq)]
pub struct ApiLoadBalancer {
    /// The `Name` tag: `api.<cluster>`.
    pub name: String,
    /// The AWS name: `api-<cluster with dashes>`, 32 characters with kOps' hash suffix.
    pub aws_name: String,
    pub internal: bool,
    /// Cloud names of its subnets (one per zone).
    pub subnets: Vec<String>,
    /// Its security groups (names, or ids given in the spec).
    pub security_groups: Vec<String>,
    pub cross_zone: bool,
    /// The TCP 443 target group the control-plane groups register with.
    pub target_group: String,
    pub tags: BTreeMap<String, String>,
    pub target_group_tags: BTreeMap<String, String>,
    /// `useForInternalApi`: `api.internal.<cluster>` is an alias to it too.
    pub use_for_internal_api: bool,
}

pub use keelson_api::names::{role_plural, truncate_name};

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
    pub iam_roles: Vec<IamRole>,
    pub load_balancer: Option<ApiLoadBalancer>,
    /// The hosted zone's id is only known to the target; the policies that name it are built there.
    pub policy_inputs: super::iam_policy::PolicyInputs,
    /// etcd cluster names (for the CA keysets).
    pub etcd_clusters: Vec<String>,
    /// `spec.encryptionConfig: true`: the state store holds `secrets/encryptionconfig` (created on
    /// first apply, with the CAs).
    pub encryption_config: bool,
    /// The `state/` subtree of the compiled output, keys relative to ConfigBase.
    pub state: BTreeMap<String, Vec<u8>>,
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

/// The region of an AWS zone (`us-east-1a` → `us-east-1`): [`keelson_api::aws_region_of_zone`];
/// validation has refused zones it does not understand.
pub fn region_of_zone(zone: &str) -> String {
    keelson_api::aws_region_of_zone(zone).unwrap_or(zone).to_string()
}

/// Build the model of a compiled cluster.
pub fn build(docs: &Documents, compiled: &Compiled) -> Result<ClusterModel, ModelError> {
    build_with(docs, compiled, true)
}

/// [`build`], optionally tolerating missing user-data (delete needs names and tags, not boot scripts).
pub fn build_with(docs: &Documents, compiled: &Compiled, require_user_data: bool) -> Result<ClusterModel, ModelError> {
    let completed = &compiled.completed;
    let cluster = completed.name().to_string();
    let spec = &completed.spec;
    let missing = |field: &str| ModelError::Missing { cluster: cluster.clone(), field: field.to_string() };
    let cloud = match spec.cloud_provider.as_deref().map(CloudKind::parse) {
        Some(c @ (CloudKind::Aws | CloudKind::Gce)) => c,
        _ => return Err(ModelError::UnsupportedCloud { cluster, cloud: spec.cloud_provider.clone().unwrap_or_default() }),
    };
    let config_base = spec.config_base.clone().ok_or_else(|| missing("spec.configBase"))?;
    let spec_subnets = spec.subnets.clone().unwrap_or_default();
    let region =
        spec_subnets.iter().find_map(|s| s.region.clone().or_else(|| s.zone.as_deref().map(region_of_zone))).ok_or_else(|| missing("spec.subnets[].zone"))?;

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
                egress: s.egress.clone(),
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
    let routing = match (cloud, &spec.network_id) {
        (CloudKind::Aws, None) => Some(routing(&cluster, &subnets)?),
        _ => None,
    };
    let network = Network { name: cluster.clone(), cidr: spec.network_cidr.map(|c| c.to_string()), existing_id: spec.network_id.clone(), subnets, routing };

    let cloud_labels = spec.cloud_labels.clone().unwrap_or_default();
    let mut roles: Vec<Role> = docs.instance_groups.iter().filter_map(InstanceGroup::role).collect();
    roles.sort();
    roles.dedup();
    let api = spec.kubernetes_api_access.clone().unwrap_or_default();
    let lb_spec = spec.api.as_ref().and_then(|a| a.load_balancer.clone()).filter(|_| cloud == CloudKind::Aws);
    let lb_sg_name = format!("api-elb.{cluster}");
    let api_access = match &lb_spec {
        // Behind a load balancer the API is reached through it (kOps: https-elb-to-master).
        Some(lb) => super::firewall::ApiAccess::LoadBalancer { group: lb.security_group_override.is_none().then(|| lb_sg_name.clone()) },
        None => super::firewall::ApiAccess::Direct,
    };
    let mut ingress = super::firewall::role_ingress(&cluster, spec, &roles, &api_access);
    let mut security_groups: Vec<SecurityGroup> = roles
        .iter()
        .map(|&role| {
            let name = super::firewall::group_name(role, &cluster);
            let mut tags = cloud_labels.clone();
            tags.extend(cluster_tags(&cluster, &name));
            SecurityGroup {
                description: format!("Security group for {}", role_plural(role)),
                name,
                role: Some(role),
                tags,
                ingress: ingress.remove(&role).unwrap_or_default(),
            }
        })
        .collect();

    let mut launch_templates = Vec::new();
    let mut groups = Vec::new();
    for ig in &docs.instance_groups {
        let group = ig.name().to_string();
        let g = &ig.spec;
        let gerr = |field: &str, message: &str| ModelError::Group { group: group.clone(), field: field.to_string(), message: message.to_string() };
        let role = ig.role().ok_or_else(|| gerr("spec.role", "unknown role"))?;
        let name = keelson_api::names::autoscaling_group_name(&group, &cluster);
        let image = g.image.clone().ok_or_else(|| gerr("spec.image", "required for apply"))?;
        let machine_type = g.machine_type.clone().ok_or_else(|| gerr("spec.machineType", "required for apply"))?;
        let user_data = match compiled.groups.get(&group).and_then(|g| g.user_data.as_ref()) {
            Some(b) => b.clone(),
            None if role == Role::Bastion || !require_user_data => Vec::new(),
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
            let found =
                network.subnets.iter().find(|n| &n.spec_name == s).ok_or_else(|| gerr("spec.subnets", &format!("no subnet named {s:?} in the Cluster")))?;
            subnet_names.push(found.cloud_name.clone());
            if g.zones.is_none() {
                zones.extend(found.zone.clone());
            }
        }
        if subnet_names.is_empty() {
            return Err(gerr("spec.subnets", "at least one subnet is required for apply"));
        }
        if g.warm_pool.is_some() {
            return Err(gerr("spec.warmPool", "warm pools are not supported by keelson apply yet; remove it"));
        }
        if g.spot_duration_in_minutes.is_some() {
            return Err(gerr("spec.spotDurationInMinutes", "spot blocks no longer exist on AWS; remove it"));
        }
        let mixed = match &g.mixed_instances_policy {
            None => None,
            Some(p) => {
                if p.instance_requirements.is_some() {
                    return Err(gerr(
                        "spec.mixedInstancesPolicy.instanceRequirements",
                        "not supported by keelson apply yet; list spec.mixedInstancesPolicy.instances instead",
                    ));
                }
                let instance_types = p.instances.clone().unwrap_or_default();
                if instance_types.is_empty() {
                    return Err(gerr("spec.mixedInstancesPolicy.instances", "at least one instance type is required"));
                }
                let spot_allocation_strategy = p.spot_allocation_strategy.clone().unwrap_or_else(|| "lowest-price".into());
                Some(MixedInstances {
                    instance_types,
                    on_demand_allocation_strategy: p.on_demand_allocation_strategy.clone().unwrap_or_else(|| "prioritized".into()),
                    on_demand_base: p.on_demand_base.unwrap_or(0),
                    on_demand_above_base: p.on_demand_above_base.unwrap_or(100),
                    spot_instance_pools: (spot_allocation_strategy == "lowest-price").then(|| p.spot_instance_pools.unwrap_or(2)),
                    spot_allocation_strategy,
                    spot_max_price: g.max_price.clone().filter(|p| !p.is_empty()),
                })
            }
        };
        let public = group_subnets.iter().any(|s| network.subnets.iter().any(|n| &n.spec_name == s && matches!(n.kind.as_str(), "Public" | "Utility")));
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
            security_groups: vec![g.security_group_override.clone().unwrap_or_else(|| format!("{}.{cluster}", role_plural(role)))],
            additional_security_groups: g.additional_security_groups.clone().unwrap_or_default(),
            instance_profile: g.iam.as_ref().and_then(|i| i.profile.clone()).unwrap_or_else(|| format!("{}.{cluster}", role_plural(role))),
            associate_public_ip: g.associate_public_ip.unwrap_or(public),
            associate_public_ip_explicit: g.associate_public_ip.is_some(),
            spot: match (&mixed, &g.max_price) {
                (None, Some(price)) => Some(SpotOptions {
                    max_price: Some(price.clone()).filter(|p| !p.is_empty()),
                    interruption_behavior: g.instance_interruption_behavior.clone().unwrap_or_else(|| "terminate".into()),
                }),
                _ => None,
            },
            cpu_credits: g.cpu_credits.clone(),
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
            target_groups: Vec::new(),
            mixed,
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

    let load_balancer = match &lb_spec {
        Some(lb) => Some(api_load_balancer(&cluster, lb, &network, &docs.instance_groups, &cloud_labels)?),
        None => None,
    };
    if let (Some(_), Some(spec_lb)) = (&load_balancer, &lb_spec) {
        if spec_lb.security_group_override.is_none() {
            let mut tags = cloud_labels.clone();
            tags.extend(cluster_tags(&cluster, &lb_sg_name));
            let mut ingress: Vec<IngressRule> = api
                .iter()
                .map(|c| IngressRule { group: lb_sg_name.clone(), protocol: "tcp".into(), from_port: 443, to_port: 443, source: RuleSource::Cidr(c.clone()) })
                .collect();
            ingress.sort();
            ingress.dedup();
            security_groups.push(SecurityGroup { name: lb_sg_name.clone(), role: None, description: "Security group for api ELB".into(), tags, ingress });
        }
    }
    if let Some(lb) = &load_balancer {
        for g in groups.iter_mut().filter(|g| matches!(g.role, Role::ControlPlane | Role::ApiServer)) {
            g.target_groups.push(lb.target_group.clone());
        }
    }
    let iam_roles = iam_roles(&cluster, spec, &docs.instance_groups, &cloud_labels)?;
    let bootstrap_token = keelson_api::nodeup::node_bootstrap_method(completed.metadata.annotations.as_ref(), true).map_err(|v| ModelError::Field {
        cluster: cluster.clone(),
        field: format!("metadata.annotations[{}]", keelson_api::nodeup::NODE_BOOTSTRAP_ANNOTATION),
        message: format!("{v:?}: expected \"token\" or \"cloud-identity\""),
    })? == keelson_api::nodeup::NodeBootstrapMethod::Token;
    let policy_inputs = super::iam_policy::PolicyInputs::new(&cluster, &region, &config_base, spec, &docs.instance_groups, bootstrap_token);

    let dns_type = spec.topology.as_ref().and_then(|t| t.dns.as_ref()).and_then(|d| d.type_.clone());
    let dns = if dns_type.as_deref() == Some("None") || cluster.ends_with(".k8s.local") {
        None
    } else {
        // kops-controller.internal: where workers join (protokube keeps it at the control planes'
        // addresses, even when api.internal is an alias to the load balancer).
        let mut records = vec![format!("api.{cluster}"), format!("api.internal.{cluster}"), format!("kops-controller.internal.{cluster}")];
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
        // With a load balancer the public API name is an alias to it (protokube leaves it alone).
        let mut alias_records = Vec::new();
        if let Some(lb) = &load_balancer {
            let public = spec.master_public_name.clone().unwrap_or_else(|| format!("api.{cluster}"));
            records.retain(|r| r != &public);
            alias_records.push(public);
            if lb.use_for_internal_api {
                let internal = format!("api.internal.{cluster}");
                records.retain(|r| r != &internal);
                alias_records.push(internal);
            }
        }
        Some(Dns { zone: spec.dns_zone.clone(), private: dns_type.as_deref() == Some("Private"), records, alias_records })
    };

    let state = compiled.state_files().map(|(rel, v)| (rel.to_string(), v.clone())).collect();

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
        iam_roles,
        load_balancer,
        policy_inputs,
        etcd_clusters,
        encryption_config: spec.encryption_config == Some(true),
        state,
    })
}

/// One role (and instance profile) per instance-group role whose groups use the managed profile.
fn iam_roles(
    cluster: &str,
    spec: &keelson_api::generated::ClusterSpec,
    groups: &[InstanceGroup],
    cloud_labels: &BTreeMap<String, String>,
) -> Result<Vec<IamRole>, ModelError> {
    let mut roles: Vec<Role> =
        groups.iter().filter(|g| g.spec.iam.as_ref().and_then(|i| i.profile.as_ref()).is_none()).filter_map(InstanceGroup::role).collect();
    roles.sort();
    roles.dedup();
    let key = |r: Role| match r {
        Role::ControlPlane => ["control-plane", "master"],
        Role::Node => ["node", "node"],
        Role::ApiServer => ["apiserver", "apiserver"],
        Role::Bastion => ["bastion", "bastion"],
    };
    let mut out = Vec::new();
    for role in roles {
        let name = keelson_api::names::iam_role_name(role, cluster);
        let mut tags = cloud_labels.clone();
        tags.extend(cluster_tags(cluster, &name));
        let mut additional_statements = Vec::new();
        for k in key(role) {
            if let Some(text) = spec.additional_policies.as_ref().and_then(|m| m.get(k)) {
                let parsed: Vec<serde_json::Value> = serde_json::from_str(text).map_err(|e| ModelError::Field {
                    cluster: cluster.to_string(),
                    field: format!("spec.additionalPolicies.{k}"),
                    message: format!("expected a JSON list of IAM policy statements: {e}"),
                })?;
                additional_statements.extend(parsed);
            }
        }
        let mut managed_policies: Vec<String> =
            key(role).iter().filter_map(|k| spec.external_policies.as_ref().and_then(|m| m.get(*k))).flatten().cloned().collect();
        managed_policies.sort();
        managed_policies.dedup();
        out.push(IamRole {
            name,
            role,
            managed_policies,
            additional_statements,
            permissions_boundary: spec.iam.as_ref().and_then(|i| i.permissions_boundary.clone()),
            tags,
        });
    }
    Ok(out)
}

/// The API load balancer of `spec.api.loadBalancer` (kOps' NLB layout).
fn api_load_balancer(
    cluster: &str,
    lb: &keelson_api::generated::LoadBalancerAccessSpec,
    network: &Network,
    groups: &[InstanceGroup],
    cloud_labels: &BTreeMap<String, String>,
) -> Result<ApiLoadBalancer, ModelError> {
    let field =
        |f: &str, message: &str| ModelError::Field { cluster: cluster.to_string(), field: format!("spec.api.loadBalancer.{f}"), message: message.to_string() };
    match lb.class.as_deref() {
        Some("Network") => {}
        Some("Classic") | None => {
            return Err(field("class", "Classic: AWS Classic Load Balancers are no longer supported for the API (as in kOps); set class: Network"))
        }
        Some(other) => return Err(field("class", &format!("{other:?}: expected Network"))),
    }
    if lb.ssl_certificate.is_some() {
        return Err(field("sslCertificate", "a TLS listener is not supported by keelson apply yet; remove it"));
    }
    let internal = match lb.type_.as_deref() {
        Some("Public") | None => false,
        Some("Internal") => true,
        Some(other) => return Err(field("type", &format!("{other:?}: expected Public or Internal"))),
    };
    if internal && lb.use_for_internal_api == Some(true) {
        return Err(field("useForInternalApi", "cannot be used with an internal network load balancer (no hairpinning), as in kOps"));
    }
    let subnets: Vec<String> = match &lb.subnets {
        Some(list) if !list.is_empty() => list
            .iter()
            .map(|s| {
                let n = s.name.clone().unwrap_or_default();
                network
                    .subnets
                    .iter()
                    .find(|x| x.spec_name == n)
                    .map(|x| x.cloud_name.clone())
                    .ok_or_else(|| field("subnets", &format!("no subnet named {n:?} in spec.subnets")))
            })
            .collect::<Result<_, _>>()?,
        _ => {
            // One subnet per zone: Public/Utility for a public balancer, Private/DualStack for an
            // internal one; Utility first, then subnets the control plane uses, then by name.
            let cp_subnets: Vec<String> =
                groups.iter().filter(|g| g.role() == Some(Role::ControlPlane)).flat_map(|g| g.spec.subnets.clone().unwrap_or_default()).collect();
            let mut best: BTreeMap<String, (i32, &Subnet)> = BTreeMap::new();
            for s in &network.subnets {
                let score = match (internal, s.kind.as_str()) {
                    (false, "Utility") => 3,
                    (false, "Public") => 0,
                    (true, "DualStack") => 2,
                    (true, "Private") => 0,
                    _ => continue,
                } + i32::from(cp_subnets.contains(&s.spec_name));
                let zone = s.zone.clone().unwrap_or_default();
                let better = match best.get(&zone) {
                    None => true,
                    Some((b, cur)) => score > *b || (score == *b && s.spec_name < cur.spec_name),
                };
                if better {
                    best.insert(zone, (score, s));
                }
            }
            best.values().map(|(_, s)| s.cloud_name.clone()).collect()
        }
    };
    if subnets.is_empty() {
        return Err(field("type", &format!("no {} subnet for the load balancer", if internal { "Private" } else { "Public or Utility" })));
    }
    let mut security_groups = vec![lb.security_group_override.clone().unwrap_or_else(|| format!("api-elb.{cluster}"))];
    security_groups.extend(lb.additional_security_groups.clone().unwrap_or_default());
    let name = format!("api.{cluster}");
    let dashed = cluster.replace('.', "-");
    let target_group = truncate_name(&format!("tcp-{dashed}"), 32, true);
    let mut tags = cloud_labels.clone();
    tags.extend(cluster_tags(cluster, &name));
    let mut target_group_tags = cloud_labels.clone();
    target_group_tags.extend(cluster_tags(cluster, &target_group));
    Ok(ApiLoadBalancer {
        name,
        aws_name: truncate_name(&format!("api-{dashed}"), 32, true),
        internal,
        subnets,
        security_groups,
        cross_zone: lb.cross_zone_load_balancing.unwrap_or(false),
        target_group,
        tags,
        target_group_tags,
        use_for_internal_api: lb.use_for_internal_api == Some(true),
    })
}

/// The routing of a VPC apply creates (see [`Routing`]).
fn routing(cluster: &str, subnets: &[Subnet]) -> Result<Routing, ModelError> {
    let tags = |name: &str, role: &str| {
        let mut t = cluster_tags(cluster, name);
        t.insert("kubernetes.io/kops/role".into(), role.into());
        t
    };
    let internet_gateway = cluster.to_string();
    let is_public = |s: &Subnet| matches!(s.kind.as_str(), "Public" | "Utility");
    let mut route_tables = vec![RouteTable {
        name: cluster.to_string(),
        routes: vec![Route { cidr: "0.0.0.0/0".into(), target: RouteTarget::InternetGateway(internet_gateway.clone()) }],
        subnets: subnets.iter().filter(|s| is_public(s)).map(|s| s.cloud_name.clone()).collect(),
        tags: tags(cluster, "public"),
    }];
    let mut nat_gateways: Vec<NatGateway> = Vec::new();
    let mut private_zones: BTreeMap<String, Vec<&Subnet>> = BTreeMap::new();
    for s in subnets.iter().filter(|s| matches!(s.kind.as_str(), "Private" | "DualStack")) {
        if s.egress.as_deref() == Some("External") {
            continue;
        }
        private_zones.entry(s.zone.clone().unwrap_or_default()).or_default().push(s);
    }
    for (zone, private) in private_zones {
        let name = format!("private-{zone}.{cluster}");
        // One egress per zone: the first subnet that names one wins, else a NAT gateway we create.
        let target = match private.iter().find_map(|s| s.egress.clone()) {
            Some(e) if e.starts_with("nat-") => RouteTarget::ExistingNatGateway(e),
            Some(e) if e.starts_with("i-") => RouteTarget::Instance(e),
            Some(e) => {
                return Err(ModelError::Field {
                    cluster: cluster.to_string(),
                    field: format!("spec.subnets[{}].egress", private[0].spec_name),
                    message: format!("{e:?}: keelson apply supports nat-… (existing NAT gateway), i-… (NAT instance) or External"),
                })
            }
            None => {
                let utility = subnets.iter().find(|u| is_public(u) && u.zone.as_deref() == Some(zone.as_str())).ok_or_else(|| ModelError::Missing {
                    cluster: cluster.to_string(),
                    field: format!(
                        "spec.subnets: a Utility subnet in {zone} for the NAT gateway of private subnet {} (or set its egress)",
                        private[0].spec_name
                    ),
                })?;
                let nat = format!("{zone}.{cluster}");
                nat_gateways.push(NatGateway { name: nat.clone(), zone: zone.clone(), subnet: utility.cloud_name.clone(), tags: cluster_tags(cluster, &nat) });
                RouteTarget::NatGateway(nat)
            }
        };
        route_tables.push(RouteTable {
            name: name.clone(),
            routes: vec![Route { cidr: "0.0.0.0/0".into(), target }],
            subnets: private.iter().map(|s| s.cloud_name.clone()).collect(),
            tags: tags(&name, &format!("private-{zone}")),
        });
    }
    Ok(Routing { tags: cluster_tags(cluster, &internet_gateway), internet_gateway, nat_gateways, route_tables })
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn subnet(name: &str, zone: &str, kind: &str, egress: Option<&str>) -> Subnet {
        Subnet {
            spec_name: name.into(),
            cloud_name: format!("{name}.c"),
            zone: Some(zone.into()),
            region: None,
            cidr: Some("10.0.0.0/24".into()),
            kind: kind.into(),
            existing_id: None,
            egress: egress.map(str::to_string),
        }
    }

    #[test]
    fn private_zones_get_a_nat_in_their_utility_subnet_or_the_egress_they_name() {
        let r = routing(
            "c",
            &[
                subnet("a", "z-1a", "Private", None),
                subnet("ua", "z-1a", "Utility", None),
                subnet("b", "z-1b", "Private", Some("nat-0123")),
                subnet("c", "z-1c", "Private", Some("i-0456")),
                subnet("d", "z-1d", "Private", Some("External")),
            ],
        )
        .expect("routing");
        assert_eq!(r.nat_gateways.len(), 1);
        assert_eq!(r.nat_gateways[0].subnet, "ua.c");
        assert_eq!(r.route_tables[0].subnets, vec!["ua.c".to_string()]);
        let targets: Vec<String> = r.route_tables.iter().map(|t| t.routes[0].target.label()).collect();
        assert_eq!(targets, ["igw:c", "nat:z-1a.c", "nat-id:nat-0123", "instance:i-0456"]);
        assert!(r.route_tables.iter().all(|t| !t.subnets.contains(&"d.c".to_string())), "External is left alone");
    }

    #[test]
    fn a_private_zone_without_utility_subnet_or_egress_is_an_error_naming_it() {
        let e = routing("c", &[subnet("a", "z-1a", "Private", None)]).expect_err("no NAT home");
        assert!(e.to_string().contains("Utility subnet in z-1a"), "{e}");
        let e = routing("c", &[subnet("a", "z-1a", "Private", Some("tgw-1"))]).expect_err("unsupported egress");
        assert!(e.to_string().contains("spec.subnets[a].egress"), "{e}");
    }
}
