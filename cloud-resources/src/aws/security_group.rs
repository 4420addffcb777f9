//! Security groups and their ingress rules (one task per rule: protocol, ports, source).

use std::collections::BTreeMap;

use aws_sdk_ec2::types as ec2_t;

use super::task::{actual_id, typed, Fields, Task};
use super::{api, cluster_filter, required, tag_spec, tags_of, AwsError, AwsTarget, Discovered, Ids};
use crate::model::{ClusterModel, IngressRule, RuleSource};
use crate::plan::{Action, Change, Kind, Resource};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecurityGroup {
    pub name: String,
    pub vpc: String,
    /// Set at creation (not compared: AWS cannot change it).
    pub description: String,
    pub tags: BTreeMap<String, String>,
}

impl SecurityGroup {
    pub fn fields(&self, f: &mut Fields) {
        f.set("vpc", &self.vpc);
    }
}

/// One ingress rule of a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecurityGroupRule {
    pub rule: IngressRule,
}

impl SecurityGroupRule {
    pub fn fields(&self, f: &mut Fields) {
        let r = &self.rule;
        f.set("group", &r.group).set("protocol", &r.protocol).set("from_port", r.from_port).set("to_port", r.to_port);
        match &r.source {
            RuleSource::Cidr(c) => f.set("source_cidr", c),
            RuleSource::Group(g) => f.set("source_group", g),
        };
    }

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
                let id = ids.security_groups.get(g).cloned().ok_or_else(|| AwsError::Missing {
                    kind: "SecurityGroup",
                    name: g.clone(),
                    message: format!("source of rule {}", r.name()),
                })?;
                p = p.user_id_group_pairs(ec2_t::UserIdGroupPair::builder().group_id(id).build());
            }
        }
        Ok(p.build())
    }
}

pub fn desired(model: &ClusterModel, out: &mut Vec<Resource>) {
    let vpc = super::network::vpc_name(model);
    for sg in &model.security_groups {
        let group = SecurityGroup { name: sg.name.clone(), vpc: vpc.clone(), description: sg.description.clone(), tags: sg.tags.clone() };
        out.push(Task::SecurityGroup(group).view(None));
        for rule in &sg.ingress {
            out.push(Task::SecurityGroupRule(SecurityGroupRule { rule: rule.clone() }).view(None));
        }
    }
}

pub async fn discover(t: &AwsTarget, model: &ClusterModel, d: &mut Discovered) -> Result<(), AwsError> {
    let cluster = &model.cluster;
    let sgs = t.ec2.describe_security_groups().filters(cluster_filter(cluster)).send().await.map_err(|e| api("DescribeSecurityGroups", cluster, e))?;
    for g in sgs.security_groups() {
        let id = required(g.group_id(), "SecurityGroup", cluster, "GroupId")?.to_string();
        let name = required(g.group_name(), "SecurityGroup", &id, "GroupName")?.to_string();
        d.ids.security_groups.insert(name.clone(), id.clone());
        let group = SecurityGroup {
            vpc: super::network::vpc_name_of(model, required(g.vpc_id(), "SecurityGroup", &name, "VpcId")?),
            description: g.description().unwrap_or_default().to_string(),
            tags: tags_of(g.tags()),
            name,
        };
        d.resources.push(Task::SecurityGroup(group).view(Some(id)));
    }
    // Ingress rules, one task per (protocol, ports, source), once every group's name is known.
    for g in sgs.security_groups() {
        let group = g.group_name().unwrap_or_default().to_string();
        for p in g.ip_permissions() {
            let protocol = match p.ip_protocol().unwrap_or("-1") {
                "-1" => "all".to_string(),
                other => other.to_string(),
            };
            // Protocols without ports (all, IP-in-IP) carry -1 whatever the API echoes back.
            let (from_port, to_port) = if !crate::model::protocol_has_ports(&protocol) {
                (-1, -1)
            } else {
                let port = |v: Option<i32>, what: &str| {
                    v.ok_or_else(|| AwsError::Missing { kind: "SecurityGroupRule", name: group.clone(), message: format!("the API returned no {what}") })
                };
                (port(p.from_port(), "FromPort")?, port(p.to_port(), "ToPort")?)
            };
            let mut sources: Vec<RuleSource> = p.ip_ranges().iter().filter_map(|r| r.cidr_ip().map(|c| RuleSource::Cidr(c.to_string()))).collect();
            sources.extend(p.user_id_group_pairs().iter().filter_map(|u| u.group_id().map(|id| RuleSource::Group(d.ids.sg_name(id)))));
            for source in sources {
                let rule = IngressRule { group: group.clone(), protocol: protocol.clone(), from_port, to_port, source };
                d.resources.push(Task::SecurityGroupRule(SecurityGroupRule { rule }).view(None));
            }
        }
    }
    // Additional security groups named by id in the spec map to themselves.
    for lt in &model.launch_templates {
        for sg in lt.additional_security_groups.iter().chain(lt.security_groups.iter()) {
            if sg.starts_with("sg-") {
                d.ids.security_groups.entry(sg.clone()).or_insert_with(|| sg.clone());
            }
        }
    }
    Ok(())
}

impl AwsTarget {
    pub(super) async fn execute_security_group(&self, model: &ClusterModel, c: &Change, ids: &mut Ids) -> Result<(), AwsError> {
        let name = c.name.as_str();
        let group = |r| typed(r, c.kind, name, "", |t| if let Task::SecurityGroup(g) = t { Some(g) } else { None });
        let rule = |r| typed(r, c.kind, name, "", |t| if let Task::SecurityGroupRule(x) = t { Some(x) } else { None });
        match (c.kind, &c.action) {
            (Kind::SecurityGroup, Action::Create) => {
                let want = group(c.desired.as_ref())?;
                let vpc = ids.vpc.clone().ok_or_else(|| AwsError::Missing {
                    kind: "VPC",
                    name: model.network.name.clone(),
                    message: format!("needed by security group {name}"),
                })?;
                let resp = self
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
                ids.security_groups.insert(name.to_string(), id.to_string());
            }
            (Kind::SecurityGroup, Action::Update(_)) => {
                // Only tags can drift here.
                let want = group(c.desired.as_ref())?;
                self.create_tags(&actual_id(c.actual.as_ref(), c.kind, name)?, &want.tags).await?;
            }
            (Kind::SecurityGroup, Action::Delete) => {
                let id = actual_id(c.actual.as_ref(), c.kind, name)?;
                self.delete_with_retry(name, || async {
                    self.ec2.delete_security_group().group_id(&id).send().await.map(|_| ()).map_err(|e| api("DeleteSecurityGroup", name, e))
                })
                .await?;
            }
            (Kind::SecurityGroupRule, Action::Create) => {
                let want = rule(c.desired.as_ref())?;
                let id = ids.security_groups.get(&want.rule.group).cloned().ok_or_else(|| AwsError::Missing {
                    kind: "SecurityGroup",
                    name: want.rule.group.clone(),
                    message: format!("needed by rule {name}"),
                })?;
                self.ec2
                    .authorize_security_group_ingress()
                    .group_id(id)
                    .ip_permissions(want.ip_permission(ids)?)
                    .send()
                    .await
                    .map_err(|e| api("AuthorizeSecurityGroupIngress", name, e))?;
            }
            (Kind::SecurityGroupRule, Action::Delete) => {
                let have = rule(c.actual.as_ref())?;
                if let Some(id) = ids.security_groups.get(&have.rule.group).cloned() {
                    self.ec2
                        .revoke_security_group_ingress()
                        .group_id(id)
                        .ip_permissions(have.ip_permission(ids)?)
                        .send()
                        .await
                        .map_err(|e| api("RevokeSecurityGroupIngress", name, e))?;
                }
            }
            // A rule is its identity: any difference is another rule.
            (Kind::SecurityGroupRule, Action::Update(_)) => {}
            (kind, _) => return Err(AwsError::Missing { kind: kind.as_str(), name: name.into(), message: "not a security group resource".into() }),
        }
        Ok(())
    }
}
