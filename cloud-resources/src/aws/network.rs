//! The VPC and its subnets (only those apply creates: an existing `networkID` / subnet `id` is
//! used, never changed).

use std::collections::BTreeMap;

use aws_sdk_ec2::types as ec2_t;

use super::task::{actual_id, typed, Fields, Task};
use super::{api, cluster_filter, required, tag_spec, tags_of, AwsError, AwsTarget, Discovered, Ids};
use crate::model::{cluster_tags, ClusterModel};
use crate::plan::{Action, Change, Kind, Resource};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vpc {
    pub name: String,
    pub cidr: String,
    pub dns_hostnames: bool,
    pub tags: BTreeMap<String, String>,
}

impl Vpc {
    pub fn fields(&self, f: &mut Fields) {
        f.set("cidr", &self.cidr).set("dns_hostnames", self.dns_hostnames);
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subnet {
    /// The cloud name (`us-east-1a.<cluster>`).
    pub name: String,
    pub cidr: String,
    pub zone: String,
    /// The VPC's name (or its id when the spec gives one).
    pub vpc: String,
    pub map_public_ip: bool,
    pub tags: BTreeMap<String, String>,
}

impl Subnet {
    pub fn fields(&self, f: &mut Fields) {
        f.set("cidr", &self.cidr).set("zone", &self.zone).set("vpc", &self.vpc).set("map_public_ip", self.map_public_ip);
    }
}

/// The name the VPC goes by in the plan: its id when the spec names an existing one.
pub fn vpc_name(model: &ClusterModel) -> String {
    model.network.existing_id.clone().unwrap_or_else(|| model.network.name.clone())
}

fn subnet_tags(model: &ClusterModel, name: &str, kind: &str) -> BTreeMap<String, String> {
    let mut t = cluster_tags(&model.cluster, name);
    t.insert("SubnetType".into(), kind.into());
    match kind {
        "Private" => t.insert("kubernetes.io/role/internal-elb".into(), "1".into()),
        _ => t.insert("kubernetes.io/role/elb".into(), "1".into()),
    };
    t
}

pub fn desired(model: &ClusterModel, out: &mut Vec<Resource>) {
    let net = &model.network;
    if net.existing_id.is_none() {
        let vpc =
            Vpc { name: net.name.clone(), cidr: net.cidr.clone().unwrap_or_default(), dns_hostnames: true, tags: cluster_tags(&model.cluster, &net.name) };
        out.push(Task::Vpc(vpc).view(None));
    }
    for s in net.subnets.iter().filter(|s| s.existing_id.is_none()) {
        let subnet = Subnet {
            name: s.cloud_name.clone(),
            cidr: s.cidr.clone().unwrap_or_default(),
            zone: s.zone.clone().unwrap_or_default(),
            vpc: vpc_name(model),
            map_public_ip: matches!(s.kind.as_str(), "Public" | "Utility"),
            tags: subnet_tags(model, &s.cloud_name, &s.kind),
        };
        out.push(Task::Subnet(subnet).view(None));
    }
}

/// Discover the cluster's VPC and subnets (and the ids the spec gives).
pub async fn discover(t: &AwsTarget, model: &ClusterModel, d: &mut Discovered) -> Result<(), AwsError> {
    let cluster = &model.cluster;
    d.ids.vpc = model.network.existing_id.clone();
    for s in &model.network.subnets {
        if let Some(id) = &s.existing_id {
            d.ids.subnets.insert(s.cloud_name.clone(), id.clone());
        }
    }
    let vpcs = t.ec2.describe_vpcs().filters(cluster_filter(cluster)).send().await.map_err(|e| api("DescribeVpcs", cluster, e))?;
    for v in vpcs.vpcs() {
        let id = required(v.vpc_id(), "VPC", cluster, "VpcId")?.to_string();
        let tags = tags_of(v.tags());
        let name = tags.get("Name").cloned().unwrap_or_else(|| id.clone());
        if model.network.existing_id.is_none() {
            d.ids.vpc = Some(id.clone());
        }
        let dns_hostnames = t
            .ec2
            .describe_vpc_attribute()
            .vpc_id(&id)
            .attribute(ec2_t::VpcAttributeName::EnableDnsHostnames)
            .send()
            .await
            .map_err(|e| api("DescribeVpcAttribute", &id, e))?
            .enable_dns_hostnames()
            .and_then(|a| a.value())
            .unwrap_or(false);
        let cidr = required(v.cidr_block(), "VPC", &name, "CidrBlock")?.to_string();
        d.resources.push(Task::Vpc(Vpc { name, cidr, dns_hostnames, tags }).view(Some(id)));
    }
    let subnets = t.ec2.describe_subnets().filters(cluster_filter(cluster)).send().await.map_err(|e| api("DescribeSubnets", cluster, e))?;
    for s in subnets.subnets() {
        let id = required(s.subnet_id(), "Subnet", cluster, "SubnetId")?.to_string();
        let tags = tags_of(s.tags());
        let name = tags.get("Name").cloned().unwrap_or_else(|| id.clone());
        d.ids.subnets.insert(name.clone(), id.clone());
        let vpc_id = required(s.vpc_id(), "Subnet", &name, "VpcId")?;
        let subnet = Subnet {
            cidr: required(s.cidr_block(), "Subnet", &name, "CidrBlock")?.to_string(),
            zone: required(s.availability_zone(), "Subnet", &name, "AvailabilityZone")?.to_string(),
            vpc: vpc_name_of(model, vpc_id),
            map_public_ip: s.map_public_ip_on_launch().unwrap_or(false),
            name,
            tags,
        };
        d.resources.push(Task::Subnet(subnet).view(Some(id)));
    }
    Ok(())
}

/// The plan's name of a VPC id: the spec's id stays an id, the cluster's VPC is its name.
pub fn vpc_name_of(model: &ClusterModel, id: &str) -> String {
    if model.network.existing_id.as_deref() == Some(id) {
        id.to_string()
    } else {
        model.network.name.clone()
    }
}

fn the_vpc(ids: &Ids, model: &ClusterModel, user: &str) -> Result<String, AwsError> {
    ids.vpc.clone().ok_or_else(|| AwsError::Missing { kind: "VPC", name: model.network.name.clone(), message: format!("needed by {user}") })
}

impl AwsTarget {
    pub(super) async fn execute_network(&self, model: &ClusterModel, c: &Change, ids: &mut Ids) -> Result<(), AwsError> {
        let name = c.name.as_str();
        match (c.kind, &c.action) {
            (Kind::Vpc, Action::Create) => {
                let want = typed(c.desired.as_ref(), c.kind, name, "desired", |t| if let Task::Vpc(v) = t { Some(v) } else { None })?;
                let resp = self
                    .ec2
                    .create_vpc()
                    .cidr_block(&want.cidr)
                    .tag_specifications(tag_spec(ec2_t::ResourceType::Vpc, &want.tags))
                    .send()
                    .await
                    .map_err(|e| api("CreateVpc", name, e))?;
                let id = required(resp.vpc().and_then(|v| v.vpc_id()), "VPC", name, "VpcId")?.to_string();
                ids.vpc = Some(id.clone());
                self.enable_dns_hostnames(&id, name).await?;
            }
            (Kind::Vpc, Action::Update(fields)) => {
                let want = typed(c.desired.as_ref(), c.kind, name, "desired", |t| if let Task::Vpc(v) = t { Some(v) } else { None })?;
                let id = actual_id(c.actual.as_ref(), c.kind, name)?;
                if fields.iter().any(|f| f.field == "dns_hostnames") {
                    self.enable_dns_hostnames(&id, name).await?;
                }
                if fields.iter().any(|f| f.field.starts_with("tags[")) {
                    self.create_tags(&id, &want.tags).await?;
                }
            }
            (Kind::Vpc, Action::Delete) => {
                let id = actual_id(c.actual.as_ref(), c.kind, name)?;
                self.delete_with_retry(name, || async { self.ec2.delete_vpc().vpc_id(&id).send().await.map(|_| ()).map_err(|e| api("DeleteVpc", name, e)) })
                    .await?;
            }
            (Kind::Subnet, Action::Create) => {
                let want = typed(c.desired.as_ref(), c.kind, name, "desired", |t| if let Task::Subnet(s) = t { Some(s) } else { None })?;
                let vpc = the_vpc(ids, model, &format!("subnet {name}"))?;
                let resp = self
                    .ec2
                    .create_subnet()
                    .vpc_id(vpc)
                    .cidr_block(&want.cidr)
                    .availability_zone(&want.zone)
                    .tag_specifications(tag_spec(ec2_t::ResourceType::Subnet, &want.tags))
                    .send()
                    .await
                    .map_err(|e| api("CreateSubnet", name, e))?;
                let id = required(resp.subnet().and_then(|s| s.subnet_id()), "Subnet", name, "SubnetId")?.to_string();
                if want.map_public_ip {
                    self.map_public_ip(&id, name, true).await?;
                }
                ids.subnets.insert(name.to_string(), id);
            }
            (Kind::Subnet, Action::Update(fields)) => {
                let want = typed(c.desired.as_ref(), c.kind, name, "desired", |t| if let Task::Subnet(s) = t { Some(s) } else { None })?;
                let id = actual_id(c.actual.as_ref(), c.kind, name)?;
                if fields.iter().any(|f| f.field == "map_public_ip") {
                    self.map_public_ip(&id, name, want.map_public_ip).await?;
                }
                if fields.iter().any(|f| f.field.starts_with("tags[")) {
                    self.create_tags(&id, &want.tags).await?;
                }
            }
            (Kind::Subnet, Action::Delete) => {
                let id = actual_id(c.actual.as_ref(), c.kind, name)?;
                self.delete_with_retry(name, || async {
                    self.ec2.delete_subnet().subnet_id(&id).send().await.map(|_| ()).map_err(|e| api("DeleteSubnet", name, e))
                })
                .await?;
            }
            (kind, _) => return Err(AwsError::Missing { kind: kind.as_str(), name: name.into(), message: "not a network resource".into() }),
        }
        Ok(())
    }

    async fn map_public_ip(&self, id: &str, name: &str, on: bool) -> Result<(), AwsError> {
        self.ec2
            .modify_subnet_attribute()
            .subnet_id(id)
            .map_public_ip_on_launch(ec2_t::AttributeBooleanValue::builder().value(on).build())
            .send()
            .await
            .map_err(|e| api("ModifySubnetAttribute", name, e))?;
        Ok(())
    }

    async fn enable_dns_hostnames(&self, id: &str, name: &str) -> Result<(), AwsError> {
        self.ec2
            .modify_vpc_attribute()
            .vpc_id(id)
            .enable_dns_hostnames(ec2_t::AttributeBooleanValue::builder().value(true).build())
            .send()
            .await
            .map_err(|e| api("ModifyVpcAttribute", name, e))?;
        Ok(())
    }
}
