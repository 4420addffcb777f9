//! Autoscaling groups: one per instance group, pinned to an explicit launch-template version (as
//! kOps does), so instances say which version they run.

use std::collections::BTreeMap;

use aws_sdk_autoscaling::types as asg_t;
use keelson_api::Role;
use serde_json::{json, Value};

use super::launch_template::LaunchTemplate;
use super::load_balancer::TargetGroup;
use super::network::Subnet;
use super::task::{AwsFuture, AwsTask, Exec, Typed};
use super::terraform::AwsTerraform;
use super::{api, name_of, resolve_all, AwsError, AwsTarget, Discovered, Ids, Resolved};
use crate::model::ClusterModel;
use crate::plan::{Action, Change, Kind};
use crate::tasks::{joined_links, Fields, Link};

/// `mixedInstancesPolicy`: several instance types, on-demand base and percentage, spot strategy.
/// AWS defaults are filled in so what exists compares equal to what is wanted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mixed {
    pub instance_types: Vec<String>,
    pub on_demand_allocation_strategy: String,
    pub on_demand_base: i64,
    pub on_demand_above_base: i64,
    pub spot_allocation_strategy: String,
    /// Only for `lowest-price`.
    pub spot_instance_pools: Option<i64>,
    pub spot_max_price: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AutoscalingGroup {
    pub name: String,
    /// The instance group and its role (not compared; read from the tags when found).
    pub group: String,
    pub role: Role,
    pub min_size: i64,
    pub max_size: i64,
    pub launch_template: Link<LaunchTemplate>,
    /// The pinned version: the one that exists, or the next when the plan changes the template
    /// ([`super::pin_versions`]); unknown before planning.
    pub launch_template_version: Option<i64>,
    /// Its subnets (in the spec's order).
    pub subnets: Vec<Link<Subnet>>,
    /// Target groups the group's instances register with: the API load balancer's for
    /// control-plane groups, and the spec's `externalLoadBalancers[].targetGroupArn` (by ARN).
    pub target_groups: Vec<Link<TargetGroup>>,
    /// Classic load balancers the group's instances register with, by name (the spec's
    /// `externalLoadBalancers[].loadBalancerName`; Keelson makes none of its own).
    pub load_balancers: Vec<String>,
    /// `instanceProtection`: new instances are protected from scale-in.
    pub protect_from_scale_in: bool,
    pub mixed: Option<Mixed>,
    /// Tags propagated at launch.
    pub tags: BTreeMap<String, String>,
}

impl AwsTask for AutoscalingGroup {
    fn kind(&self) -> Kind {
        Kind::AutoscalingGroup
    }
    fn name(&self) -> String {
        self.name.clone()
    }
    fn tags(&self) -> BTreeMap<String, String> {
        self.tags.clone()
    }
    fn fields(&self, f: &mut Fields) {
        f.set("min_size", self.min_size)
            .set("max_size", self.max_size)
            .set("launch_template", &self.launch_template)
            .opt("launch_template_version", self.launch_template_version)
            .set("subnets", joined_links(&self.subnets));
        if !self.target_groups.is_empty() {
            f.set("target_groups", joined_links(&self.target_groups));
        }
        if !self.load_balancers.is_empty() {
            f.set("load_balancers", sorted_names(&self.load_balancers).join(","));
        }
        if self.protect_from_scale_in {
            f.set("protect_from_scale_in", true);
        }
        if let Some(m) = &self.mixed {
            f.set("mixed.instance_types", m.instance_types.join(","))
                .set("mixed.on_demand_allocation_strategy", &m.on_demand_allocation_strategy)
                .set("mixed.on_demand_base", m.on_demand_base)
                .set("mixed.on_demand_above_base", m.on_demand_above_base)
                .set("mixed.spot_allocation_strategy", &m.spot_allocation_strategy)
                .opt("mixed.spot_instance_pools", m.spot_instance_pools)
                .opt("mixed.spot_max_price", m.spot_max_price.as_ref());
        }
    }
    fn find<'a>(t: &'a AwsTarget, model: &'a ClusterModel, _resolved: &'a Resolved, d: &'a mut Discovered) -> AwsFuture<'a> {
        Box::pin(discover(t, model, d))
    }
    fn render_terraform(&self, t: &mut AwsTerraform) {
        let tags: Vec<Value> = self.tags.iter().map(|(k, v)| json!({"key": k, "value": v, "propagate_at_launch": true})).collect();
        let (lt_id, lt_version) = (self.launch_template.tf_attr("id"), self.launch_template.tf_attr("latest_version"));
        let mut body = json!({
            "name": self.name,
            "min_size": self.min_size,
            "max_size": self.max_size,
            "vpc_zone_identifier": self.subnets.iter().map(|s| s.tf()).collect::<Vec<_>>(),
            "launch_template": {"id": lt_id, "version": lt_version},
            "tag": tags,
        });
        if let Some(m) = &self.mixed {
            if let Some(o) = body.as_object_mut() {
                o.remove("launch_template");
            }
            let mut distribution = json!({
                "on_demand_allocation_strategy": m.on_demand_allocation_strategy,
                "on_demand_base_capacity": m.on_demand_base,
                "on_demand_percentage_above_base_capacity": m.on_demand_above_base,
                "spot_allocation_strategy": m.spot_allocation_strategy,
            });
            if let Some(p) = m.spot_instance_pools {
                distribution["spot_instance_pools"] = json!(p);
            }
            if let Some(p) = &m.spot_max_price {
                distribution["spot_max_price"] = json!(p);
            }
            body["mixed_instances_policy"] = json!({
                "launch_template": {
                    "launch_template_specification": {"launch_template_id": lt_id, "version": lt_version},
                    "override": m.instance_types.iter().map(|t| json!({"instance_type": t})).collect::<Vec<_>>(),
                },
                "instances_distribution": distribution,
            });
        }
        if !self.target_groups.is_empty() {
            body["target_group_arns"] = json!(self.target_groups.iter().map(|tg| tg.tf()).collect::<Vec<_>>());
        }
        if !self.load_balancers.is_empty() {
            body["load_balancers"] = json!(sorted_names(&self.load_balancers));
        }
        if self.protect_from_scale_in {
            body["protect_from_scale_in"] = json!(true);
        }
        t.blocks.add("aws_autoscaling_group", &self.name, body);
    }
    fn render_aws<'a>(&'a self, cx: Exec<'a>, c: &'a Change) -> AwsFuture<'a> {
        Box::pin(async move {
            let c = Typed::<AutoscalingGroup>::of(c);
            let (t, name, ids) = (cx.target, c.name, &*cx.ids);
            match c.action {
                Action::Create => {
                    let want = c.want()?;
                    let (lt, mixed) = t.launch_spec(ids, want)?;
                    t.asg
                        .create_auto_scaling_group()
                        .auto_scaling_group_name(name)
                        .min_size(super::i32_of(want.min_size, "AutoscalingGroup", name, "min size")?)
                        .max_size(super::i32_of(want.max_size, "AutoscalingGroup", name, "max size")?)
                        .set_launch_template(lt)
                        .set_mixed_instances_policy(mixed)
                        .new_instances_protected_from_scale_in(want.protect_from_scale_in)
                        .vpc_zone_identifier(t.subnet_ids(ids, want)?)
                        .set_target_group_arns(Some(target_group_arns(ids, &want.target_groups, name)?))
                        .set_load_balancer_names(Some(sorted_names(&want.load_balancers)))
                        .set_tags(Some(tags_for(name, &want.tags)))
                        .send()
                        .await
                        .map_err(|e| api("CreateAutoScalingGroup", name, e))?;
                }
                Action::Update(fields) => {
                    let want = c.want()?;
                    let have = c.have()?;
                    if c.changed("target_groups") {
                        let want_arns = target_group_arns(ids, &want.target_groups, name)?;
                        let have_arns = target_group_arns(ids, &have.target_groups, name)?;
                        let attach: Vec<String> = want_arns.iter().filter(|a| !have_arns.contains(a)).cloned().collect();
                        let detach: Vec<String> = have_arns.iter().filter(|a| !want_arns.contains(a)).cloned().collect();
                        if !attach.is_empty() {
                            t.asg
                                .attach_load_balancer_target_groups()
                                .auto_scaling_group_name(name)
                                .set_target_group_arns(Some(attach))
                                .send()
                                .await
                                .map_err(|e| api("AttachLoadBalancerTargetGroups", name, e))?;
                        }
                        if !detach.is_empty() {
                            t.asg
                                .detach_load_balancer_target_groups()
                                .auto_scaling_group_name(name)
                                .set_target_group_arns(Some(detach))
                                .send()
                                .await
                                .map_err(|e| api("DetachLoadBalancerTargetGroups", name, e))?;
                        }
                    }
                    if c.changed("load_balancers") {
                        let (want_lbs, have_lbs) = (sorted_names(&want.load_balancers), sorted_names(&have.load_balancers));
                        let attach: Vec<String> = want_lbs.iter().filter(|n| !have_lbs.contains(n)).cloned().collect();
                        let detach: Vec<String> = have_lbs.iter().filter(|n| !want_lbs.contains(n)).cloned().collect();
                        if !attach.is_empty() {
                            t.asg
                                .attach_load_balancers()
                                .auto_scaling_group_name(name)
                                .set_load_balancer_names(Some(attach))
                                .send()
                                .await
                                .map_err(|e| api("AttachLoadBalancers", name, e))?;
                        }
                        if !detach.is_empty() {
                            t.asg
                                .detach_load_balancers()
                                .auto_scaling_group_name(name)
                                .set_load_balancer_names(Some(detach))
                                .send()
                                .await
                                .map_err(|e| api("DetachLoadBalancers", name, e))?;
                        }
                    }
                    if !fields.iter().all(|f| f.field.starts_with("tags[") || f.field == "target_groups" || f.field == "load_balancers") {
                        let (lt, mixed) = t.launch_spec(ids, want)?;
                        t.asg
                            .update_auto_scaling_group()
                            .auto_scaling_group_name(name)
                            .min_size(super::i32_of(want.min_size, "AutoscalingGroup", name, "min size")?)
                            .max_size(super::i32_of(want.max_size, "AutoscalingGroup", name, "max size")?)
                            .set_launch_template(lt)
                            .set_mixed_instances_policy(mixed)
                            .new_instances_protected_from_scale_in(want.protect_from_scale_in)
                            .vpc_zone_identifier(t.subnet_ids(ids, want)?)
                            .send()
                            .await
                            .map_err(|e| api("UpdateAutoScalingGroup", name, e))?;
                    }
                    if c.tags_changed() {
                        t.asg
                            .create_or_update_tags()
                            .set_tags(Some(tags_for(name, &want.tags)))
                            .send()
                            .await
                            .map_err(|e| api("CreateOrUpdateTags", name, e))?;
                    }
                }
                Action::Delete => {
                    let name = c.id()?;
                    t.asg
                        .delete_auto_scaling_group()
                        .auto_scaling_group_name(&name)
                        .force_delete(true)
                        .send()
                        .await
                        .map_err(|e| api("DeleteAutoScalingGroup", &name, e))?;
                    t.wait_asg_gone(&name).await?;
                }
            }
            Ok(())
        })
    }
}

fn missing(name: &str, what: &str) -> AwsError {
    AwsError::Missing { kind: "AutoscalingGroup", name: name.to_string(), message: format!("the API returned no {what}") }
}

async fn discover(t: &AwsTarget, model: &ClusterModel, d: &mut Discovered) -> Result<(), AwsError> {
    let cluster = &model.cluster;
    let groups =
        t.asg.describe_auto_scaling_groups().into_paginator().items().send().try_collect().await.map_err(|e| api("DescribeAutoScalingGroups", cluster, e))?;
    for g in &groups {
        let tags: BTreeMap<String, String> = g.tags().iter().filter_map(|t| Some((t.key()?.to_string(), t.value().unwrap_or("").to_string()))).collect();
        if tags.get("KubernetesCluster") != Some(cluster) {
            continue;
        }
        let name = g.auto_scaling_group_name().ok_or_else(|| missing(cluster, "AutoScalingGroupName"))?.to_string();
        let mixed = g.mixed_instances_policy();
        let spec = g.launch_template().or_else(|| mixed.and_then(|m| m.launch_template()).and_then(|l| l.launch_template_specification()));
        let lt_version = match spec.and_then(|l| l.version()) {
            Some(v) => Some(v.parse::<i64>().map_err(|_| AwsError::Missing {
                kind: "AutoscalingGroup",
                name: name.clone(),
                message: format!("launch template version {v:?} is not a number (keelson pins explicit versions)"),
            })?),
            None => None,
        };
        d.instances.insert(name.clone(), g.instances().iter().filter_map(|i| i.instance_id().map(str::to_string)).collect());
        let task = AutoscalingGroup {
            min_size: g.min_size().map(i64::from).ok_or_else(|| missing(&name, "MinSize"))?,
            max_size: g.max_size().map(i64::from).ok_or_else(|| missing(&name, "MaxSize"))?,
            launch_template: Link::to(spec.and_then(|l| l.launch_template_name()).unwrap_or_default()),
            launch_template_version: lt_version,
            subnets: g
                .vpc_zone_identifier()
                .unwrap_or_default()
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|id| Link::to(d.ids.subnet_name(id)))
                .collect(),
            target_groups: g.target_group_arns().iter().map(|arn| Link::to(name_of(&d.ids.target_groups, arn))).collect(),
            load_balancers: g.load_balancer_names().to_vec(),
            protect_from_scale_in: g.new_instances_protected_from_scale_in().unwrap_or(false),
            mixed: mixed.map(|m| {
                let dist = m.instances_distribution();
                Mixed {
                    instance_types: m
                        .launch_template()
                        .map(|l| l.overrides().iter().filter_map(|o| o.instance_type().map(str::to_string)).collect())
                        .unwrap_or_default(),
                    on_demand_allocation_strategy: dist.and_then(|d| d.on_demand_allocation_strategy()).unwrap_or("prioritized").to_string(),
                    on_demand_base: dist.and_then(|d| d.on_demand_base_capacity()).map(i64::from).unwrap_or(0),
                    on_demand_above_base: dist.and_then(|d| d.on_demand_percentage_above_base_capacity()).map(i64::from).unwrap_or(100),
                    spot_allocation_strategy: dist.and_then(|d| d.spot_allocation_strategy()).unwrap_or("lowest-price").to_string(),
                    spot_instance_pools: dist.and_then(|d| d.spot_instance_pools()).map(i64::from),
                    spot_max_price: dist.and_then(|d| d.spot_max_price()).filter(|p| !p.is_empty()).map(str::to_string),
                }
            }),
            name: name.clone(),
            group: tags.get("kops.k8s.io/instancegroup").cloned().unwrap_or_default(),
            role: role_of_tags(&tags),
            tags,
        };
        d.found(task, name);
    }
    Ok(())
}

/// The role a found group's tags name (`kops.k8s.io/instancegroup-role`; Node when they name none).
fn role_of_tags(tags: &BTreeMap<String, String>) -> Role {
    match tags.get("kops.k8s.io/instancegroup-role").map(String::as_str) {
        Some("ControlPlane") => Role::ControlPlane,
        Some("APIServer") => Role::ApiServer,
        Some("Bastion") => Role::Bastion,
        _ => Role::Node,
    }
}

fn tags_for(name: &str, tags: &BTreeMap<String, String>) -> Vec<asg_t::Tag> {
    tags.iter()
        .map(|(k, v)| asg_t::Tag::builder().resource_id(name).resource_type("auto-scaling-group").key(k).value(v).propagate_at_launch(true).build())
        .collect()
}

impl AwsTarget {
    /// How a group launches: its launch template at the pinned version, or a mixed-instances
    /// policy around it.
    fn launch_spec(
        &self,
        ids: &Ids,
        g: &AutoscalingGroup,
    ) -> Result<(Option<asg_t::LaunchTemplateSpecification>, Option<asg_t::MixedInstancesPolicy>), AwsError> {
        // The version this run created or found wins over the planned one.
        let version = ids.lt_versions.get(g.launch_template.name()).copied().or(g.launch_template_version).ok_or_else(|| AwsError::Missing {
            kind: "LaunchTemplate",
            name: g.launch_template.to_string(),
            message: format!("no version known for autoscaling group {}", g.name),
        })?;
        let spec = asg_t::LaunchTemplateSpecification::builder().launch_template_name(g.launch_template.name()).version(version.to_string()).build();
        let Some(m) = &g.mixed else { return Ok((Some(spec), None)) };
        let overrides: Vec<asg_t::LaunchTemplateOverrides> =
            m.instance_types.iter().map(|t| asg_t::LaunchTemplateOverrides::builder().instance_type(t).build()).collect();
        let policy = asg_t::MixedInstancesPolicy::builder()
            .launch_template(asg_t::LaunchTemplate::builder().launch_template_specification(spec).set_overrides(Some(overrides)).build())
            .instances_distribution(
                asg_t::InstancesDistribution::builder()
                    .on_demand_allocation_strategy(&m.on_demand_allocation_strategy)
                    .on_demand_base_capacity(super::i32_of(m.on_demand_base, "AutoscalingGroup", &g.name, "on-demand base")?)
                    .on_demand_percentage_above_base_capacity(super::i32_of(m.on_demand_above_base, "AutoscalingGroup", &g.name, "on-demand percentage")?)
                    .spot_allocation_strategy(&m.spot_allocation_strategy)
                    .set_spot_instance_pools(m.spot_instance_pools.map(|p| super::i32_of(p, "AutoscalingGroup", &g.name, "spot instance pools")).transpose()?)
                    .set_spot_max_price(m.spot_max_price.clone())
                    .build(),
            )
            .build();
        Ok((None, Some(policy)))
    }

    fn subnet_ids(&self, ids: &Ids, g: &AutoscalingGroup) -> Result<String, AwsError> {
        Ok(resolve_all(&g.subnets, ids, &format!("autoscaling group {}", g.name))?.join(","))
    }

    /// After a force delete, wait (bounded) until the group is gone so dependents can be deleted.
    async fn wait_asg_gone(&self, name: &str) -> Result<(), AwsError> {
        for _ in 0..self.dependency_retries.max(1) {
            let resp =
                self.asg.describe_auto_scaling_groups().auto_scaling_group_names(name).send().await.map_err(|e| api("DescribeAutoScalingGroups", name, e))?;
            if resp.auto_scaling_groups().is_empty() {
                return Ok(());
            }
            tokio::time::sleep(self.dependency_delay).await;
        }
        Err(AwsError::Missing { kind: "AutoscalingGroup", name: name.into(), message: "still deleting; rerun delete later".into() })
    }
}

/// Classic load balancer names, sorted and once each (the API keeps no order).
fn sorted_names(names: &[String]) -> Vec<String> {
    let mut names = names.to_vec();
    names.sort();
    names.dedup();
    names
}

/// Target-group ARNs for links (an ARN given directly is kept).
fn target_group_arns(ids: &Ids, links: &[Link<TargetGroup>], asg: &str) -> Result<Vec<String>, AwsError> {
    resolve_all(links, ids, &format!("autoscaling group {asg}"))
}
