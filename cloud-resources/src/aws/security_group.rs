//! Security groups and their ingress rules (one task per rule: protocol, ports, source). A group's
//! egress is the every-protocol rule to `0.0.0.0/0` that AWS gives every new VPC group: the direct
//! target finds it and restores it if it is gone; Terraform, whose `aws_security_group` deletes that
//! default rule, writes it as an `egress` rule of its own.

use std::collections::BTreeMap;

use aws_sdk_ec2::types as ec2_t;
use serde_json::json;

use super::network::Vpc;
use super::task::{AwsFuture, AwsTask, Exec, Task, Typed};
use super::terraform::{tags_value, AwsTerraform};
use super::{api, cluster_filter, required, tag_spec, tags_of, AwsError, AwsLinked, AwsTarget, Discovered, Ids, Resolved};
use crate::model::ClusterModel;
use crate::plan::{Action, Change, Kind};
use crate::tasks::{Fields, Link, Linked};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecurityGroup {
    pub name: String,
    pub vpc: Link<Vpc>,
    /// Set at creation (not compared: AWS cannot change it).
    pub description: String,
    pub tags: BTreeMap<String, String>,
    /// CIDRs the group lets every protocol out to (kOps' `egress` rules; AWS' default for a new group
    /// is `0.0.0.0/0`). Found: those of them the group allows, other egress rules being left alone.
    pub egress: Vec<String>,
}

/// The egress every group of Keelson's allows: all traffic, anywhere (IPv4), as AWS' default.
pub const EGRESS_ALL: &str = "0.0.0.0/0";

impl Linked for SecurityGroup {
    const TF_TYPE: &'static str = "aws_security_group";
    const TF_ATTR: &'static str = "id";
}

impl AwsLinked for SecurityGroup {
    const KIND: Kind = Kind::SecurityGroup;
    fn lookup(ids: &Ids, name: &str) -> Option<String> {
        ids.security_groups.get(name).cloned()
    }
}

/// One ingress rule: `protocol` is `all` (every port) or `tcp`/`udp` with a port range.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct IngressRule {
    /// The group it admits traffic into.
    pub group: Link<SecurityGroup>,
    pub protocol: String,
    pub from_port: i32,
    pub to_port: i32,
    pub source: RuleSource,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum RuleSource {
    Cidr(String),
    Group(Link<SecurityGroup>),
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
            RuleSource::Group(g) => g.to_string(),
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

/// One ingress rule of a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecurityGroupRule {
    pub rule: IngressRule,
}

impl SecurityGroupRule {
    /// The IpPermission, with group names resolved to ids.
    fn ip_permission(&self, ids: &Ids) -> Result<ec2_t::IpPermission, AwsError> {
        let r = &self.rule;
        let all = r.protocol == "all";
        let mut p = ec2_t::IpPermission::builder().ip_protocol(if all { "-1" } else { r.protocol.as_str() });
        if r.has_ports() {
            p = p.from_port(r.from_port).to_port(r.to_port);
        } else if !all {
            // A protocol without ports (IP-in-IP): AWS ignores the range, -1 says "every port"
            // (and moto needs one).
            p = p.from_port(-1).to_port(-1);
        }
        match &r.source {
            RuleSource::Cidr(c) => p = p.ip_ranges(ec2_t::IpRange::builder().cidr_ip(c).build()),
            RuleSource::Group(g) => {
                let id = g.resolve(ids, &format!("source of rule {}", r.name()))?;
                p = p.user_id_group_pairs(ec2_t::UserIdGroupPair::builder().group_id(id).build());
            }
        }
        Ok(p.build())
    }
}

impl AwsTask for SecurityGroup {
    fn kind(&self) -> Kind {
        Kind::SecurityGroup
    }
    fn name(&self) -> String {
        self.name.clone()
    }
    fn tags(&self) -> BTreeMap<String, String> {
        self.tags.clone()
    }
    fn fields(&self, f: &mut Fields) {
        f.set("vpc", &self.vpc).set("egress", egress_field(&self.egress));
    }
    fn find<'a>(t: &'a AwsTarget, model: &'a ClusterModel, _resolved: &'a Resolved, d: &'a mut Discovered) -> AwsFuture<'a> {
        Box::pin(discover(t, model, d))
    }
    fn render_terraform(&self, t: &mut AwsTerraform) {
        t.blocks.add(
            "aws_security_group",
            &self.name,
            json!({"name": self.name, "description": self.description, "vpc_id": self.vpc.tf(), "tags": tags_value(&self.tags)}),
        );
        // Terraform removes the default egress rule from a group it creates: write it back.
        for cidr in &self.egress {
            t.blocks.add(
                "aws_security_group_rule",
                &format!("{}-all-to-{cidr}", self.name),
                json!({
                    "type": "egress",
                    "security_group_id": Link::<SecurityGroup>::to(self.name.clone()).tf(),
                    "protocol": "-1",
                    "from_port": 0,
                    "to_port": 0,
                    "cidr_blocks": [cidr],
                }),
            );
        }
    }
    fn render_aws<'a>(&'a self, cx: Exec<'a>, c: &'a Change) -> AwsFuture<'a> {
        Box::pin(async move {
            let c = Typed::<SecurityGroup>::of(c);
            let (t, name) = (cx.target, c.name);
            match c.action {
                Action::Create => {
                    let want = c.want()?;
                    let vpc = cx.ids.vpc.clone().ok_or_else(|| AwsError::Missing {
                        kind: "VPC",
                        name: cx.model.network.name.clone(),
                        message: format!("needed by security group {name}"),
                    })?;
                    let resp = t
                        .ec2
                        .create_security_group()
                        .group_name(name)
                        .description(if want.description.is_empty() { name } else { want.description.as_str() })
                        .vpc_id(vpc)
                        .tag_specifications(tag_spec(ec2_t::ResourceType::SecurityGroup, &want.tags))
                        .send()
                        .await
                        .map_err(|e| api("CreateSecurityGroup", name, e))?;
                    let id = required(resp.group_id(), "SecurityGroup", name, "GroupId")?;
                    cx.ids.security_groups.insert(name.to_string(), id.to_string());
                }
                Action::Update(_) => {
                    // Tags, and an egress rule gone (AWS' default removed by hand, or a group
                    // Terraform made without it).
                    let (want, have, id) = (c.want()?, c.have()?, c.id()?);
                    t.create_tags(&id, &want.tags).await?;
                    let missing: Vec<&String> = want.egress.iter().filter(|cidr| !have.egress.contains(cidr)).collect();
                    if !missing.is_empty() {
                        let mut all = ec2_t::IpPermission::builder().ip_protocol("-1");
                        for cidr in missing {
                            all = all.ip_ranges(ec2_t::IpRange::builder().cidr_ip(cidr).build());
                        }
                        t.ec2
                            .authorize_security_group_egress()
                            .group_id(&id)
                            .ip_permissions(all.build())
                            .send()
                            .await
                            .map_err(|e| api("AuthorizeSecurityGroupEgress", name, e))?;
                    }
                }
                Action::Delete => {
                    let id = c.id()?;
                    t.delete_with_retry(name, || async {
                        t.ec2.delete_security_group().group_id(&id).send().await.map(|_| ()).map_err(|e| api("DeleteSecurityGroup", name, e))
                    })
                    .await?;
                }
            }
            Ok(())
        })
    }
}

impl AwsTask for SecurityGroupRule {
    fn kind(&self) -> Kind {
        Kind::SecurityGroupRule
    }
    fn name(&self) -> String {
        self.rule.name()
    }
    fn fields(&self, f: &mut Fields) {
        let r = &self.rule;
        f.set("group", &r.group).set("protocol", &r.protocol).set("from_port", r.from_port).set("to_port", r.to_port);
        match &r.source {
            RuleSource::Cidr(c) => f.set("source_cidr", c),
            RuleSource::Group(g) => f.set("source_group", g),
        };
    }
    fn find<'a>(_t: &'a AwsTarget, _model: &'a ClusterModel, _resolved: &'a Resolved, _d: &'a mut Discovered) -> AwsFuture<'a> {
        // Found with its group (the same listing).
        super::task::found_with_another()
    }
    fn render_terraform(&self, t: &mut AwsTerraform) {
        let rule = &self.rule;
        let (protocol, from, to) = if rule.protocol == "all" {
            ("-1".to_string(), 0, 0)
        } else if !rule.has_ports() {
            (rule.protocol.clone(), 0, 0)
        } else {
            (rule.protocol.clone(), rule.from_port, rule.to_port)
        };
        let mut body = json!({
            "type": "ingress",
            "security_group_id": rule.group.tf(),
            "protocol": protocol,
            "from_port": from,
            "to_port": to,
        });
        match &rule.source {
            RuleSource::Cidr(c) => body["cidr_blocks"] = json!([c]),
            RuleSource::Group(g) => body["source_security_group_id"] = json!(g.tf()),
        }
        t.blocks.add("aws_security_group_rule", &rule.name().replace(": ", "-").replace(' ', "-"), body);
    }
    fn render_aws<'a>(&'a self, cx: Exec<'a>, c: &'a Change) -> AwsFuture<'a> {
        Box::pin(async move {
            let c = Typed::<SecurityGroupRule>::of(c);
            let (t, name) = (cx.target, c.name);
            match c.action {
                Action::Create => {
                    let want = c.want()?;
                    let id = want.rule.group.resolve(cx.ids, &format!("rule {name}"))?;
                    t.ec2
                        .authorize_security_group_ingress()
                        .group_id(id)
                        .ip_permissions(want.ip_permission(cx.ids)?)
                        .send()
                        .await
                        .map_err(|e| api("AuthorizeSecurityGroupIngress", name, e))?;
                }
                Action::Delete => {
                    let have = c.have()?;
                    if let Some(id) = cx.ids.security_groups.get(have.rule.group.name()).cloned() {
                        t.ec2
                            .revoke_security_group_ingress()
                            .group_id(id)
                            .ip_permissions(have.ip_permission(cx.ids)?)
                            .send()
                            .await
                            .map_err(|e| api("RevokeSecurityGroupIngress", name, e))?;
                    }
                }
                // A rule is its identity: any difference is another rule.
                Action::Update(_) => {}
            }
            Ok(())
        })
    }
}

async fn discover(t: &AwsTarget, model: &ClusterModel, d: &mut Discovered) -> Result<(), AwsError> {
    let cluster = &model.cluster;
    let sgs = t
        .ec2
        .describe_security_groups()
        .filters(cluster_filter(cluster))
        .into_paginator()
        .items()
        .send()
        .try_collect()
        .await
        .map_err(|e| api("DescribeSecurityGroups", cluster, e))?;
    for g in &sgs {
        let id = required(g.group_id(), "SecurityGroup", cluster, "GroupId")?.to_string();
        let name = required(g.group_name(), "SecurityGroup", &id, "GroupName")?.to_string();
        d.ids.security_groups.insert(name.clone(), id.clone());
        let wanted_egress = model.tasks.security_groups.iter().find(|w| w.name == name).map(|w| w.egress.as_slice()).unwrap_or_default();
        let group = SecurityGroup {
            vpc: super::network::vpc_link_of(model, required(g.vpc_id(), "SecurityGroup", &name, "VpcId")?),
            description: g.description().unwrap_or_default().to_string(),
            tags: tags_of(g.tags()),
            egress: found_egress(g.ip_permissions_egress(), wanted_egress),
            name,
        };
        d.found(group, id);
    }
    // Ingress rules, one task per (protocol, ports, source), once every group's name is known; only
    // Keelson's own (see `firewall::found_rule_is_ours`).
    let wanted: Vec<IngressRule> = model.tasks.security_group_rules.iter().map(|r| r.rule.clone()).collect();
    let ours: std::collections::BTreeSet<String> = model.tasks.security_groups.iter().map(|g| g.name.clone()).collect();
    for g in &sgs {
        let group = g.group_name().unwrap_or_default().to_string();
        for p in g.ip_permissions() {
            let protocol = match p.ip_protocol().unwrap_or("-1") {
                "-1" => "all".to_string(),
                other => other.to_string(),
            };
            // Protocols without ports (all, IP-in-IP) carry -1 whatever the API echoes back.
            let (from_port, to_port) = if !protocol_has_ports(&protocol) {
                (-1, -1)
            } else {
                let port = |v: Option<i32>, what: &str| {
                    v.ok_or_else(|| AwsError::Missing { kind: "SecurityGroupRule", name: group.clone(), message: format!("the API returned no {what}") })
                };
                (port(p.from_port(), "FromPort")?, port(p.to_port(), "ToPort")?)
            };
            let mut sources: Vec<RuleSource> = p.ip_ranges().iter().filter_map(|r| r.cidr_ip().map(|c| RuleSource::Cidr(c.to_string()))).collect();
            sources.extend(p.user_id_group_pairs().iter().filter_map(|u| u.group_id().map(|id| RuleSource::Group(Link::to(d.ids.sg_name(id))))));
            for source in sources {
                let rule = IngressRule { group: Link::to(group.clone()), protocol: protocol.clone(), from_port, to_port, source };
                if !crate::firewall::found_rule_is_ours(&rule, cluster, &wanted, &ours) {
                    tracing::debug!(group = %group, rule = %rule.name(), "left alone: not Keelson's rule");
                    continue;
                }
                d.resources.push(Task::SecurityGroupRule(SecurityGroupRule { rule }).view(None));
            }
        }
    }
    // Additional security groups named by id in the spec map to themselves.
    for lt in &model.tasks.launch_templates {
        for sg in &lt.security_groups {
            if sg.starts_with("sg-") {
                d.ids.security_groups.entry(sg.to_string()).or_insert_with(|| sg.to_string());
            }
        }
    }
    Ok(())
}

/// The `egress` field: the CIDRs, in order, or `none`.
fn egress_field(cidrs: &[String]) -> String {
    if cidrs.is_empty() {
        "none".into()
    } else {
        cidrs.join(",")
    }
}

/// Which of the `wanted` every-protocol egress CIDRs the group's egress permissions allow, in the
/// wanted order (other egress rules are not Keelson's and are left alone).
fn found_egress(permissions: &[ec2_t::IpPermission], wanted: &[String]) -> Vec<String> {
    let allowed: Vec<&str> =
        permissions.iter().filter(|p| p.ip_protocol() == Some("-1")).flat_map(|p| p.ip_ranges().iter().filter_map(|r| r.cidr_ip())).collect();
    wanted.iter().filter(|cidr| allowed.contains(&cidr.as_str())).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn found_egress_is_the_wanted_all_traffic_cidrs_the_group_allows() {
        let all = |cidrs: &[&str]| {
            let mut p = ec2_t::IpPermission::builder().ip_protocol("-1");
            for c in cidrs {
                p = p.ip_ranges(ec2_t::IpRange::builder().cidr_ip(*c).build());
            }
            p.build()
        };
        let https = ec2_t::IpPermission::builder()
            .ip_protocol("tcp")
            .from_port(443)
            .to_port(443)
            .ip_ranges(ec2_t::IpRange::builder().cidr_ip(EGRESS_ALL).build())
            .build();
        let wanted = vec![EGRESS_ALL.to_string()];
        assert_eq!(found_egress(&[all(&[EGRESS_ALL, "10.0.0.0/8"])], &wanted), wanted, "a user's extra rule is left out");
        assert!(found_egress(&[https], &wanted).is_empty(), "443 only is not all traffic");
        assert!(found_egress(&[], &wanted).is_empty(), "Terraform's group without its egress rule");
        assert_eq!(egress_field(&[]), "none");
    }
}
