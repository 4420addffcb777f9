//! The VPC and its subnets (only those apply creates: an existing `networkID` / subnet `id` is
//! used, never changed).

use std::collections::BTreeMap;

use aws_sdk_ec2::types as ec2_t;
use serde_json::json;

use super::task::{AwsFuture, AwsTask, Exec, Typed};
use super::terraform::{tags_value, AwsTerraform};
use super::{api, cluster_filter, required, tag_spec, tags_of, AwsError, AwsLinked, AwsTarget, Discovered, Ids, Resolved};
use crate::model::ClusterModel;
use crate::plan::{Action, Change, Kind};
use crate::tasks::{Fields, Link, Linked};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vpc {
    pub name: String,
    pub cidr: String,
    pub dns_hostnames: bool,
    pub tags: BTreeMap<String, String>,
}

impl Linked for Vpc {
    const TF_TYPE: &'static str = "aws_vpc";
    const TF_ATTR: &'static str = "id";
}

impl AwsLinked for Vpc {
    const KIND: Kind = Kind::Vpc;
    fn lookup(ids: &Ids, _name: &str) -> Option<String> {
        ids.vpc.clone()
    }
}

impl AwsTask for Vpc {
    fn kind(&self) -> Kind {
        Kind::Vpc
    }
    fn name(&self) -> String {
        self.name.clone()
    }
    fn tags(&self) -> BTreeMap<String, String> {
        self.tags.clone()
    }
    fn fields(&self, f: &mut Fields) {
        f.set("cidr", &self.cidr).set("dns_hostnames", self.dns_hostnames);
    }
    fn find<'a>(t: &'a AwsTarget, model: &'a ClusterModel, _resolved: &'a Resolved, d: &'a mut Discovered) -> AwsFuture<'a> {
        Box::pin(discover_vpcs(t, model, d))
    }
    fn render_terraform(&self, t: &mut AwsTerraform) {
        t.blocks.add(
            "aws_vpc",
            &self.name,
            json!({
                "cidr_block": self.cidr,
                "enable_dns_hostnames": self.dns_hostnames,
                "enable_dns_support": true,
                "tags": tags_value(&self.tags),
            }),
        );
    }
    fn render_aws<'a>(&'a self, cx: Exec<'a>, c: &'a Change) -> AwsFuture<'a> {
        Box::pin(async move {
            let c = Typed::<Vpc>::of(c);
            let (t, name) = (cx.target, c.name);
            match c.action {
                Action::Create => {
                    let want = c.want()?;
                    let resp = t
                        .ec2
                        .create_vpc()
                        .cidr_block(&want.cidr)
                        .tag_specifications(tag_spec(ec2_t::ResourceType::Vpc, &want.tags))
                        .send()
                        .await
                        .map_err(|e| api("CreateVpc", name, e))?;
                    let id = required(resp.vpc().and_then(|v| v.vpc_id()), "VPC", name, "VpcId")?.to_string();
                    cx.ids.vpc = Some(id.clone());
                    t.enable_dns_hostnames(&id, name).await?;
                }
                Action::Update(_) => {
                    let want = c.want()?;
                    let id = c.id()?;
                    if c.changed("dns_hostnames") {
                        t.enable_dns_hostnames(&id, name).await?;
                    }
                    if c.tags_changed() {
                        t.create_tags(&id, &want.tags).await?;
                    }
                }
                Action::Delete => {
                    let id = c.id()?;
                    t.delete_with_retry(name, || async { t.ec2.delete_vpc().vpc_id(&id).send().await.map(|_| ()).map_err(|e| api("DeleteVpc", name, e)) })
                        .await?;
                }
            }
            Ok(())
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subnet {
    /// The cloud name (`us-east-1a.<cluster>`).
    pub name: String,
    pub cidr: String,
    pub zone: String,
    /// The VPC (named by its id when the spec gives one).
    pub vpc: Link<Vpc>,
    pub map_public_ip: bool,
    pub tags: BTreeMap<String, String>,
}

impl Linked for Subnet {
    const TF_TYPE: &'static str = "aws_subnet";
    const TF_ATTR: &'static str = "id";
}

impl AwsLinked for Subnet {
    const KIND: Kind = Kind::Subnet;
    fn lookup(ids: &Ids, name: &str) -> Option<String> {
        ids.subnets.get(name).cloned()
    }
}

impl AwsTask for Subnet {
    fn kind(&self) -> Kind {
        Kind::Subnet
    }
    fn name(&self) -> String {
        self.name.clone()
    }
    fn tags(&self) -> BTreeMap<String, String> {
        self.tags.clone()
    }
    fn fields(&self, f: &mut Fields) {
        f.set("cidr", &self.cidr).set("zone", &self.zone).set("vpc", &self.vpc).set("map_public_ip", self.map_public_ip);
    }
    fn find<'a>(t: &'a AwsTarget, model: &'a ClusterModel, _resolved: &'a Resolved, d: &'a mut Discovered) -> AwsFuture<'a> {
        Box::pin(discover_subnets(t, model, d))
    }
    fn render_terraform(&self, t: &mut AwsTerraform) {
        t.blocks.add(
            "aws_subnet",
            &self.name,
            json!({
                "vpc_id": self.vpc.tf(),
                "cidr_block": self.cidr,
                "availability_zone": self.zone,
                "map_public_ip_on_launch": self.map_public_ip,
                "tags": tags_value(&self.tags),
            }),
        );
    }
    fn render_aws<'a>(&'a self, cx: Exec<'a>, c: &'a Change) -> AwsFuture<'a> {
        Box::pin(async move {
            let c = Typed::<Subnet>::of(c);
            let (t, name) = (cx.target, c.name);
            match c.action {
                Action::Create => {
                    let want = c.want()?;
                    let vpc = want.vpc.resolve(cx.ids, &format!("subnet {name}"))?;
                    let resp = t
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
                        t.map_public_ip(&id, name, true).await?;
                    }
                    cx.ids.subnets.insert(name.to_string(), id);
                }
                Action::Update(_) => {
                    let want = c.want()?;
                    let id = c.id()?;
                    if c.changed("map_public_ip") {
                        t.map_public_ip(&id, name, want.map_public_ip).await?;
                    }
                    if c.tags_changed() {
                        t.create_tags(&id, &want.tags).await?;
                    }
                }
                Action::Delete => {
                    let id = c.id()?;
                    t.delete_with_retry(name, || async {
                        t.ec2.delete_subnet().subnet_id(&id).send().await.map(|_| ()).map_err(|e| api("DeleteSubnet", name, e))
                    })
                    .await?;
                }
            }
            Ok(())
        })
    }
}

/// Discover the cluster's VPC (or take the id the spec gives).
async fn discover_vpcs(t: &AwsTarget, model: &ClusterModel, d: &mut Discovered) -> Result<(), AwsError> {
    let cluster = &model.cluster;
    let net = &model.network;
    d.ids.vpc = net.vpc.id().map(str::to_string);
    let vpcs = t.ec2.describe_vpcs().filters(cluster_filter(cluster)).send().await.map_err(|e| api("DescribeVpcs", cluster, e))?;
    for v in vpcs.vpcs() {
        let id = required(v.vpc_id(), "VPC", cluster, "VpcId")?.to_string();
        let tags = tags_of(v.tags());
        let name = tags.get("Name").cloned().unwrap_or_else(|| id.clone());
        if net.vpc.id().is_none() {
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
        d.found(Vpc { name, cidr, dns_hostnames, tags }, id);
    }
    Ok(())
}

/// Discover the cluster's subnets (and the ids the spec gives).
async fn discover_subnets(t: &AwsTarget, model: &ClusterModel, d: &mut Discovered) -> Result<(), AwsError> {
    let cluster = &model.cluster;
    for s in &model.network.subnets {
        if let Some(id) = s.id() {
            d.ids.subnets.insert(s.name().to_string(), id.to_string());
        }
    }
    let subnets = t
        .ec2
        .describe_subnets()
        .filters(cluster_filter(cluster))
        .into_paginator()
        .items()
        .send()
        .try_collect()
        .await
        .map_err(|e| api("DescribeSubnets", cluster, e))?;
    for s in &subnets {
        let id = required(s.subnet_id(), "Subnet", cluster, "SubnetId")?.to_string();
        let tags = tags_of(s.tags());
        let name = tags.get("Name").cloned().unwrap_or_else(|| id.clone());
        d.ids.subnets.insert(name.clone(), id.clone());
        let vpc_id = required(s.vpc_id(), "Subnet", &name, "VpcId")?;
        let subnet = Subnet {
            cidr: required(s.cidr_block(), "Subnet", &name, "CidrBlock")?.to_string(),
            zone: required(s.availability_zone(), "Subnet", &name, "AvailabilityZone")?.to_string(),
            vpc: vpc_link_of(model, vpc_id),
            map_public_ip: s.map_public_ip_on_launch().unwrap_or(false),
            name,
            tags,
        };
        d.found(subnet, id);
    }
    Ok(())
}

/// The link to a VPC found by id: the spec's id stays an id, the cluster's VPC is its name.
pub fn vpc_link_of(model: &ClusterModel, id: &str) -> Link<Vpc> {
    if model.network.vpc.id() == Some(id) {
        model.network.vpc.clone()
    } else {
        Link::to(model.network.name.clone())
    }
}

impl AwsTarget {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws::task::Task;
    use crate::terraform_json::Blocks;

    /// One value, two targets: Terraform references the VPC by its link; the plan shows its name.
    #[test]
    fn a_subnet_renders_to_terraform_and_to_the_plan_from_the_same_value() {
        let subnet =
            |vpc: Link<Vpc>| Subnet { name: "a.c".into(), cidr: "10.0.0.0/24".into(), zone: "z-1a".into(), vpc, map_public_ip: true, tags: BTreeMap::new() };
        for (vpc, tf, plan) in [(Link::to("c"), "${aws_vpc.c.id}", "c"), (Link::existing("vpc-1", "vpc-1"), "vpc-1", "vpc-1")] {
            let s = subnet(vpc);
            let mut t = AwsTerraform { blocks: Blocks::default(), zone: None };
            s.render_terraform(&mut t);
            assert_eq!(crate::terraform_json::terraform_string(t.blocks.resource["aws_subnet"]["a-c"]["vpc_id"].as_str().unwrap_or_default()), tf);
            assert_eq!(Task::from(s).view(None).attrs["vpc"], plan);
        }
    }
}
