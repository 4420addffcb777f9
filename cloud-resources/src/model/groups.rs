//! The instance-group builder: per instance group, what the spec asks for (image, machine type,
//! disks, subnets and zones, sizes, spot and mixed instances, user-data, tags), made into an AWS
//! launch template and autoscaling group, or a GCE instance template and one managed instance
//! group per zone.

use std::collections::{BTreeMap, BTreeSet};

use keelson_api::{InstanceGroup, Role};

use super::security_groups::Names;
use super::{cluster_tags, role_plural, role_tags, Context, ModelError, SpecSubnet, DEFAULT_ROOT_VOLUME_SIZE_GIB, DEFAULT_ROOT_VOLUME_TYPE};
use crate::aws::{self, AutoscalingGroup, Image, LaunchTemplate, Mixed, RootVolume, Spot, TargetGroup};
use crate::gce::{self, gce_name, role_label, safe_cluster_name, BOOT_DISK_TYPE};
use crate::tasks::Link;

/// One instance group, as the spec asks for it.
pub struct Group<'a> {
    ig: &'a InstanceGroup,
    /// The cloud name of its launch template and autoscaling group: `<group>.<cluster>`.
    name: String,
    group: String,
    pub(super) role: Role,
    image: String,
    machine_type: String,
    user_data: Vec<u8>,
    tags: BTreeMap<String, String>,
    subnets: Vec<&'a SpecSubnet>,
    zones: Vec<String>,
    mixed: Option<Mixed>,
}

/// The cluster-autoscaler's node template of a group (kOps' `CloudTagsForInstanceGroup`): each node
/// label its nodes get (`nodelabels.BuildNodeLabels`: the kubelet's and the group's labels and the
/// role's) as `k8s.io/cluster-autoscaler/node-template/label/<key>`, each taint with an effect as
/// `k8s.io/cluster-autoscaler/node-template/taint/<key>` = `<value>:<effect>`. The autoscaler reads
/// them to build a node it has not seen (a group scaled from zero). The `APIServerNodes` feature
/// flag's label is not known here (it is a compile option), as kOps' own note says of its code.
fn node_template_tags(cx: &Context<'_>, ig: &InstanceGroup, role: Role) -> BTreeMap<String, String> {
    let mut tags = BTreeMap::new();
    let labels = spec_compiler::nodeup_config::node_labels(cx.spec, ig, role, &Default::default());
    for (k, v) in labels.into_iter().flatten() {
        tags.insert(format!("k8s.io/cluster-autoscaler/node-template/label/{k}"), v);
    }
    for taint in ig.spec.taints.iter().flatten() {
        let (key_value, effect) = taint.rsplit_once(':').unwrap_or((taint.as_str(), ""));
        if effect.is_empty() {
            continue;
        }
        let (key, value) = key_value.split_once('=').unwrap_or((key_value, ""));
        tags.insert(format!("k8s.io/cluster-autoscaler/node-template/taint/{key}"), format!("{value}:{effect}"));
    }
    tags
}

/// The instance groups, in the spec's order (each checked: role, image, machine type, user-data,
/// subnets, and what apply does not support).
pub fn groups<'a>(cx: &'a Context<'a>, user_data: &dyn Fn(&str) -> Option<Vec<u8>>, require_user_data: bool) -> Result<Vec<Group<'a>>, ModelError> {
    let cluster = cx.cluster;
    let mut out = Vec::new();
    for ig in cx.instance_groups {
        let group = ig.name().to_string();
        let g = &ig.spec;
        let gerr = |field: &str, message: &str| ModelError::Group { group: group.clone(), field: field.to_string(), message: message.to_string() };
        let role = ig.role().ok_or_else(|| gerr("spec.role", "unknown role"))?;
        let name = keelson_api::names::autoscaling_group_name(&group, cluster);
        let image = g.image.clone().ok_or_else(|| gerr("spec.image", "required for apply"))?;
        let machine_type = g.machine_type.clone().ok_or_else(|| gerr("spec.machineType", "required for apply"))?;
        if cx.cloud == super::CloudKind::Aws {
            for (i, sg) in g.additional_security_groups.iter().flatten().enumerate() {
                if !sg.starts_with("sg-") {
                    return Err(gerr(&format!("spec.additionalSecurityGroups[{i}]"), &format!("{sg:?}: expected the id of an existing security group (sg-…)")));
                }
            }
        }
        let user_data = match user_data(&group) {
            Some(b) => b,
            None if role == Role::Bastion || !require_user_data => Vec::new(),
            None => return Err(ModelError::NoUserData { group }),
        };
        let mut tags = cx.cloud_labels.clone();
        tags.extend(g.cloud_labels.clone().unwrap_or_default());
        tags.extend(cluster_tags(cluster, &name));
        tags.extend(role_tags(role));
        tags.insert("kops.k8s.io/instancegroup".into(), group.clone());
        tags.extend(node_template_tags(cx, ig, role));
        let mut subnets = Vec::new();
        let mut zones: Vec<String> = g.zones.clone().unwrap_or_default();
        for s in g.subnets.iter().flatten() {
            let found = cx.subnet(s).ok_or_else(|| gerr("spec.subnets", &format!("no subnet named {s:?} in the Cluster")))?;
            subnets.push(found);
            if g.zones.is_none() {
                zones.extend(found.zone.clone());
            }
        }
        if subnets.is_empty() {
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
                Some(Mixed {
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
        out.push(Group { ig, name, group, role, image, machine_type, user_data, tags, subnets, zones, mixed });
    }
    Ok(out)
}

impl Group<'_> {
    /// Public address on the primary interface: the spec's `associatePublicIp`, else whether the
    /// group's subnets are public.
    fn public_ip(&self) -> bool {
        self.ig.spec.associate_public_ip.unwrap_or_else(|| self.subnets.iter().any(|s| s.is_public()))
    }
    fn root_volume_size(&self) -> i64 {
        self.ig.spec.root_volume_size.unwrap_or(DEFAULT_ROOT_VOLUME_SIZE_GIB)
    }
    fn root_volume_type(&self) -> String {
        self.ig.spec.root_volume_type.clone().unwrap_or_else(|| DEFAULT_ROOT_VOLUME_TYPE.into())
    }
    fn min_size(&self) -> i64 {
        self.ig.spec.min_size.unwrap_or(if self.role == Role::ControlPlane { 1 } else { 2 })
    }

    /// The launch template and the autoscaling group. Control planes and API servers register with
    /// the API load balancer's `target_group`.
    pub fn build(
        self,
        cx: &Context<'_>,
        security_groups: &Names,
        instance_profiles: &BTreeSet<String>,
        target_group: Option<&Link<TargetGroup>>,
        tasks: &mut aws::Tasks,
    ) {
        let g = &self.ig.spec;
        let cluster = cx.cluster;
        let metadata = g.instance_metadata.clone().unwrap_or_default();
        let mut sgs = vec![g.security_group_override.clone().unwrap_or_else(|| format!("{}.{cluster}", role_plural(self.role)))];
        sgs.extend(g.additional_security_groups.clone().unwrap_or_default());
        let encrypted = g.root_volume_encryption.unwrap_or(true);
        let profile = g.iam.as_ref().and_then(|i| i.profile.clone()).unwrap_or_else(|| format!("{}.{cluster}", role_plural(self.role)));
        tasks.push(LaunchTemplate {
            name: self.name.clone(),
            group: self.group.clone(),
            image: Image { spec: self.image.clone(), resolved: None },
            instance_type: self.machine_type.clone(),
            http_tokens: metadata.http_tokens.unwrap_or_else(|| "required".into()),
            hop_limit: metadata.http_put_response_hop_limit.unwrap_or(1),
            root_volume: RootVolume {
                size_gib: self.root_volume_size(),
                volume_type: self.root_volume_type(),
                encrypted,
                iops: g.root_volume_iops,
                throughput: g.root_volume_throughput,
                // kOps uses the key only for an encrypted volume.
                kms_key_id: g.root_volume_encryption_key.clone().filter(|k| encrypted && !k.is_empty()),
            },
            security_groups: sgs.iter().map(|s| security_groups.link(s)).collect(),
            instance_profile: super::iam::profile_link(instance_profiles, &profile),
            // An explicit associatePublicIp gets an explicit network interface (otherwise the subnet decides).
            associate_public_ip: g.associate_public_ip.map(|_| self.public_ip()),
            spot: match (&self.mixed, &g.max_price) {
                (None, Some(price)) => {
                    Some(Spot { max_price: price.clone(), interruption: g.instance_interruption_behavior.clone().unwrap_or_else(|| "terminate".into()) })
                }
                _ => None,
            },
            cpu_credits: g.cpu_credits.clone(),
            // kOps: an empty sshKeyName means no key pair. Unset, kOps would make one from the SSH
            // public key in its state store; Keelson keeps no SSH key there, so no key pair either.
            key_name: cx.spec.ssh_key_name.clone().filter(|k| !k.is_empty()),
            user_data: self.user_data.clone(),
            tags: self.tags.clone(),
        });
        let min_size = self.min_size();
        let mut target_groups = match (self.role, target_group) {
            (Role::ControlPlane | Role::ApiServer, Some(tg)) => vec![tg.clone()],
            _ => Vec::new(),
        };
        // The spec's external load balancers (kOps: each names one, checked by keelson_api::validate).
        let external = g.external_load_balancers.iter().flatten();
        target_groups.extend(external.clone().filter_map(|lb| lb.target_group_arn.clone()).map(|arn| Link::existing(arn.clone(), arn)));
        let load_balancers = external.filter_map(|lb| lb.load_balancer_name.clone()).collect();
        tasks.push(AutoscalingGroup {
            name: self.name.clone(),
            group: self.group,
            role: self.role,
            min_size,
            max_size: g.max_size.unwrap_or(min_size),
            launch_template: Link::to(self.name),
            launch_template_version: None,
            subnets: self.subnets.iter().map(|s| s.link()).collect(),
            target_groups,
            load_balancers,
            protect_from_scale_in: g.instance_protection == Some(true),
            mixed: self.mixed,
            tags: self.tags,
        });
    }

    /// GCE: the instance template, and a managed instance group per zone (kOps spreads the group's
    /// size over its zones, the first zones getting the remainder).
    pub fn build_gce(self, cx: &Context<'_>, account: &super::gce_identity::RoleAccount, tasks: &mut gce::Tasks) {
        let cluster = cx.cluster;
        let role = role_label(self.role);
        let network: Link<gce::Network> = match cx.vpc.id() {
            Some(id) => Link::existing(id, id),
            None => Link::to(cluster),
        };
        let g = &self.ig.spec;
        tasks.push(gce::InstanceTemplate {
            name: self.name.clone(),
            group: self.group.clone(),
            role: self.role,
            cluster: cluster.to_string(),
            name_prefix: format!("{}-", gce_name(&format!("{}-{cluster}", self.group)).chars().take(36).collect::<String>()),
            machine_type: self.machine_type.clone(),
            disk_size_gb: self.root_volume_size(),
            // GCE's disk types by their own names (validate refuses an EBS type on GCE), and the
            // provisioned IOPS and throughput of the types that take them (hyperdisk, pd-extreme).
            disk_type: g.root_volume_type.clone().unwrap_or_else(|| BOOT_DISK_TYPE.to_string()),
            disk_iops: g.root_volume_iops,
            disk_throughput: g.root_volume_throughput,
            image: self.image.clone(),
            network,
            subnetwork: self.subnets.first().map(|s| s.link()),
            public_ip: self.public_ip(),
            user_data: self.user_data.clone(),
            user_data_key: if cx.spec.cloud_config.as_ref().and_then(|c| c.gce_use_startup_script) == Some(true) {
                gce::STARTUP_SCRIPT_KEY.to_string()
            } else {
                gce::USER_DATA_KEY.to_string()
            },
            service_account: account.email.clone(),
            service_account_task: account.task.clone(),
            scopes: gce::scopes(self.role),
            labels: BTreeMap::from([
                // Checked when the disks are built (every cluster has them): a plain label, as kOps writes it.
                ("k8s-io-cluster-name".to_string(), safe_cluster_name(cluster)),
                ("k8s-io-instance-group".to_string(), self.group.clone()),
                (format!("k8s-io-role-{role}"), role.to_string()),
            ]),
            tags: vec![gce::role_tag(cluster, self.role)],
        });
        let zones = if self.zones.is_empty() { vec![format!("{}-b", cx.region)] } else { self.zones.clone() };
        let n = zones.len() as i64;
        let min_size = self.min_size();
        for (i, zone) in zones.iter().enumerate() {
            let letter = zone.rsplit('-').next().unwrap_or(zone);
            tasks.push(gce::InstanceGroupManager {
                name: format!("{letter}-{}", self.name),
                gce_name: keelson_api::names::gce_instance_group_manager_name(zone, &self.group, cluster),
                zone: zone.clone(),
                base_instance_name: gce_name(&self.group),
                target_size: min_size / n + i64::from((i as i64) < min_size % n),
                template: Link::to(self.name.clone()),
                max_surge: n,
            });
        }
    }
}
