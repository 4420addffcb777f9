//! The harness's view of moto (EC2, Auto Scaling, Elastic Load Balancing v2, Route53) through the
//! real AWS SDK.

use std::collections::BTreeMap;
use std::time::Duration;

use aws_config::{BehaviorVersion, Region};
use aws_sdk_ec2::config::Credentials;

#[derive(Debug, thiserror::Error)]
pub enum CloudError {
    #[error("moto at {endpoint}: {op}: {message}")]
    Api { endpoint: String, op: &'static str, message: String },
}

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Instance {
    pub id: String,
    pub state: String,
    pub private_ip: Option<String>,
    pub public_ip: Option<String>,
    pub zone: String,
    pub subnet_id: String,
    pub vpc_id: String,
    pub instance_type: String,
    pub image_id: String,
    pub mac: String,
    pub security_groups: Vec<String>,
    pub tags: Vec<(String, String)>,
    /// ARN of the instance profile the instance was launched with.
    #[serde(default)]
    pub instance_profile_arn: Option<String>,
    /// The private DNS name EC2 gives it (what its IMDS `local-hostname` says).
    #[serde(default)]
    pub private_dns_name: Option<String>,
}

/// A route of a VPC route table whose target is an instance (what the cloud-controller-manager's
/// route controller writes: a node's pod CIDR via that node's instance).
/// One listener of a network load balancer in moto with its target group: what the local cloud's
/// load balancers play ([`crate::balancer`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NlbListener {
    pub load_balancer: String,
    pub load_balancer_arn: String,
    pub dns_name: String,
    /// The load balancer's tags (the cloud-controller-manager names a Service's with
    /// `kubernetes.io/service-name`).
    pub tags: Vec<(String, String)>,
    pub port: i32,
    pub target_group: String,
    pub target_group_arn: String,
    /// The target group's port (of a target registered without one).
    pub target_group_port: i32,
    pub health: HealthCheck,
    /// `deregistration_delay.timeout_seconds` of the target group.
    pub deregistration_delay: Duration,
    /// Registered targets: (instance id, port).
    pub targets: Vec<(String, i32)>,
}

impl NlbListener {
    pub fn tag(&self, k: &str) -> Option<&str> {
        self.tags.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }
}

/// A target group's health check, as the load balancer runs it (TCP connects).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthCheck {
    pub interval: Duration,
    pub healthy_threshold: u32,
    pub unhealthy_threshold: u32,
    /// `None` = the traffic port.
    pub port: Option<i32>,
}

impl Default for HealthCheck {
    /// The ELBv2 defaults of a TCP target group.
    fn default() -> Self {
        HealthCheck { interval: Duration::from_secs(30), healthy_threshold: 5, unhealthy_threshold: 2, port: None }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct InstanceRoute {
    pub route_table_id: String,
    pub destination: String,
    pub instance_id: String,
}

impl Instance {
    pub fn tag(&self, k: &str) -> Option<&str> {
        self.tags.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }
    pub fn group(&self) -> String {
        self.tag("aws:autoscaling:groupName").unwrap_or("").to_string()
    }
    /// `control-plane` or `node`, from the kOps role tags on the instance (propagated from the ASG).
    pub fn role(&self) -> String {
        let is_cp = self.tags.iter().any(|(k, _)| k == "k8s.io/role/control-plane" || k == "k8s.io/role/master")
            || self.tag("kops.k8s.io/instancegroup-role").is_some_and(|r| r.eq_ignore_ascii_case("master") || r.eq_ignore_ascii_case("controlplane"));
        if is_cp {
            "control-plane".into()
        } else {
            "node".into()
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Attachment {
    pub instance_id: String,
    pub device: String,
    pub state: String,
}

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Volume {
    pub id: String,
    pub size_gib: u64,
    pub zone: String,
    pub state: String,
    pub tags: Vec<(String, String)>,
    pub attachments: Vec<Attachment>,
}

impl Volume {
    pub fn name(&self) -> String {
        self.tags.iter().find(|(k, _)| k == "Name").map(|(_, v)| v.clone()).unwrap_or_default()
    }
    /// The instance this volume is attached to (attaching or attached), if any.
    pub fn attached_to(&self) -> Option<&Attachment> {
        self.attachments.iter().find(|a| a.state == "attached" || a.state == "attaching")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ARecord {
    pub zone: String,
    pub name: String,
    pub ips: Vec<String>,
}

pub struct Cloud {
    pub endpoint: String,
    pub region: String,
    rt: tokio::runtime::Runtime,
    ec2: aws_sdk_ec2::Client,
    asg: aws_sdk_autoscaling::Client,
    elb: aws_sdk_elasticloadbalancingv2::Client,
    r53: aws_sdk_route53::Client,
    iam: aws_sdk_iam::Client,
    sts: aws_sdk_sts::Client,
    s3: aws_sdk_s3::Client,
}

fn tags_of(t: Option<&[aws_sdk_ec2::types::Tag]>) -> Vec<(String, String)> {
    t.unwrap_or_default().iter().map(|t| (t.key().unwrap_or_default().to_string(), t.value().unwrap_or_default().to_string())).collect()
}

impl Cloud {
    pub fn new(endpoint: &str, region: &str) -> Cloud {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
        let conf = rt.block_on(async {
            let timeouts = aws_config::timeout::TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(3))
                .operation_attempt_timeout(Duration::from_secs(30))
                .operation_timeout(Duration::from_secs(60))
                .build();
            aws_config::defaults(BehaviorVersion::latest())
                .http_client(aws_smithy_http_client::Builder::new().build_http())
                .region(Region::new(region.to_string()))
                .endpoint_url(endpoint)
                .credentials_provider(Credentials::new("keelson-local", "keelson-local", None, None, "keelson-local"))
                .timeout_config(timeouts)
                .load()
                .await
        });
        Cloud {
            endpoint: endpoint.to_string(),
            region: region.to_string(),
            ec2: aws_sdk_ec2::Client::new(&conf),
            asg: aws_sdk_autoscaling::Client::new(&conf),
            elb: aws_sdk_elasticloadbalancingv2::Client::new(&conf),
            r53: aws_sdk_route53::Client::new(&conf),
            iam: aws_sdk_iam::Client::new(&conf),
            sts: aws_sdk_sts::Client::new(&conf),
            s3: aws_sdk_s3::Client::from_conf(aws_sdk_s3::config::Builder::from(&conf).force_path_style(true).build()),
            rt,
        }
    }

    fn err(&self, op: &'static str, e: impl std::fmt::Debug) -> CloudError {
        let message = format!("{e:?}");
        CloudError::Api { endpoint: self.endpoint.clone(), op, message: message.chars().take(400).collect() }
    }

    /// Every instance, all pages: EC2 (and moto, at 100 reservations) pages `DescribeInstances`, so
    /// one call stops seeing new instances once enough terminated ones are listed before them (the
    /// 100-cycle soak's 97th replacement was never booted).
    pub fn instances(&self) -> Result<Vec<Instance>, CloudError> {
        let reservations =
            self.rt.block_on(self.ec2.describe_instances().into_paginator().items().send().try_collect()).map_err(|e| self.err("DescribeInstances", e))?;
        let mut v = Vec::new();
        for r in &reservations {
            for i in r.instances() {
                let nic = i.network_interfaces().first();
                v.push(Instance {
                    id: i.instance_id().unwrap_or_default().to_string(),
                    state: i.state().and_then(|s| s.name()).map(|n| n.as_str().to_string()).unwrap_or_default(),
                    private_ip: i.private_ip_address().map(str::to_string),
                    public_ip: i.public_ip_address().map(str::to_string),
                    zone: i.placement().and_then(|p| p.availability_zone()).unwrap_or_default().to_string(),
                    subnet_id: i.subnet_id().unwrap_or_default().to_string(),
                    vpc_id: i.vpc_id().unwrap_or_default().to_string(),
                    instance_type: i.instance_type().map(|t| t.as_str().to_string()).unwrap_or_default(),
                    image_id: i.image_id().unwrap_or_default().to_string(),
                    mac: nic.and_then(|n| n.mac_address()).unwrap_or("0e:00:00:00:00:01").to_string(),
                    security_groups: i.security_groups().iter().filter_map(|g| g.group_name().map(str::to_string)).collect(),
                    tags: tags_of(Some(i.tags())),
                    instance_profile_arn: i.iam_instance_profile().and_then(|p| p.arn()).map(str::to_string),
                    private_dns_name: i.private_dns_name().filter(|n| !n.is_empty()).map(str::to_string),
                });
            }
        }
        v.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(v)
    }

    /// The instance role's temporary credentials, obtained as EC2 obtains them for IMDS: the
    /// instance profile's role assumed with `sts:AssumeRole`, RoleSessionName = the instance id, so
    /// `sts:GetCallerIdentity` with them answers
    /// `arn:aws:sts::<account>:assumed-role/<role>/<instance-id>` (what node join by cloud identity
    /// checks). `None` for an instance without an instance profile.
    pub fn instance_role_credentials(&self, instance: &Instance) -> Result<Option<crate::imds::RoleCredentials>, CloudError> {
        // moto leaves IamInstanceProfile empty on instances an Auto Scaling group launched; EC2 attaches
        // the launch template's profile, so take it from there.
        let from_template = match &instance.instance_profile_arn {
            Some(_) => None,
            None => self.launch_template_profile(instance)?,
        };
        let Some(profile_arn) = instance.instance_profile_arn.as_ref().or(from_template.as_ref()) else { return Ok(None) };
        let profile_name = profile_arn.rsplit('/').next().unwrap_or(profile_arn);
        let out =
            self.rt.block_on(self.iam.get_instance_profile().instance_profile_name(profile_name).send()).map_err(|e| self.err("GetInstanceProfile", e))?;
        let profile = out.instance_profile().ok_or_else(|| self.err("GetInstanceProfile", format!("{profile_name}: no instance profile in the answer")))?;
        let role = profile.roles().first().ok_or_else(|| self.err("GetInstanceProfile", format!("{profile_name}: the instance profile has no role")))?;
        // EC2 hands out credentials that last about 6 h and renews them well before they expire.
        let assumed = self
            .rt
            .block_on(self.sts.assume_role().role_arn(role.arn()).role_session_name(&instance.id).duration_seconds(21_600).send())
            .map_err(|e| self.err("AssumeRole", e))?;
        let c = assumed.credentials().ok_or_else(|| self.err("AssumeRole", format!("{}: no credentials in the answer", role.arn())))?;
        let rfc3339 = |t: &aws_sdk_sts::primitives::DateTime| t.fmt(aws_sdk_sts::primitives::DateTimeFormat::DateTime).unwrap_or_default();
        let now = aws_sdk_sts::primitives::DateTime::from(std::time::SystemTime::now());
        let now = aws_sdk_sts::primitives::DateTime::from_secs(now.secs());
        Ok(Some(crate::imds::RoleCredentials {
            instance_profile_arn: profile.arn().to_string(),
            instance_profile_id: profile.instance_profile_id().to_string(),
            role_name: role.role_name().to_string(),
            access_key_id: c.access_key_id().to_string(),
            secret_access_key: c.secret_access_key().to_string(),
            token: c.session_token().to_string(),
            expiration: rfc3339(c.expiration()),
            last_updated: rfc3339(&now),
        }))
    }

    /// The instance profile (ARN or name) of the launch template version an instance was launched
    /// from (its `aws:ec2launchtemplate:*` tags).
    fn launch_template_profile(&self, instance: &Instance) -> Result<Option<String>, CloudError> {
        let tag = |k: &str| instance.tags.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let (Some(id), Some(version)) = (tag("aws:ec2launchtemplate:id"), tag("aws:ec2launchtemplate:version")) else { return Ok(None) };
        let out = self
            .rt
            .block_on(self.ec2.describe_launch_template_versions().launch_template_id(&id).versions(&version).send())
            .map_err(|e| self.err("DescribeLaunchTemplateVersions", e))?;
        let profile = out
            .launch_template_versions()
            .first()
            .and_then(|v| v.launch_template_data())
            .and_then(|d| d.iam_instance_profile())
            .and_then(|p| p.arn().or(p.name()))
            .map(str::to_string);
        Ok(profile)
    }

    /// Every instance route (`destination → instance`) of the route tables of `vpc_id` tagged as
    /// the cluster's (`kubernetes.io/cluster/<cluster>`), sorted.
    pub fn instance_routes(&self, vpc_id: &str, cluster: &str) -> Result<Vec<InstanceRoute>, CloudError> {
        let filter = aws_sdk_ec2::types::Filter::builder().name("vpc-id").values(vpc_id).build();
        let out = self.rt.block_on(self.ec2.describe_route_tables().filters(filter).send()).map_err(|e| self.err("DescribeRouteTables", e))?;
        let tag = format!("kubernetes.io/cluster/{cluster}");
        let mut routes = Vec::new();
        for t in out.route_tables() {
            if !t.tags().iter().any(|x| x.key() == Some(tag.as_str())) {
                continue;
            }
            for r in t.routes() {
                if let (Some(dest), Some(instance)) = (r.destination_cidr_block(), r.instance_id()) {
                    routes.push(InstanceRoute {
                        route_table_id: t.route_table_id().unwrap_or_default().to_string(),
                        destination: dest.to_string(),
                        instance_id: instance.to_string(),
                    });
                }
            }
        }
        routes.sort();
        Ok(routes)
    }

    fn instance_attribute(
        &self,
        instance_id: &str,
        attribute: aws_sdk_ec2::types::InstanceAttributeName,
    ) -> Result<aws_sdk_ec2::operation::describe_instance_attribute::DescribeInstanceAttributeOutput, CloudError> {
        self.rt
            .block_on(self.ec2.describe_instance_attribute().instance_id(instance_id).attribute(attribute).send())
            .map_err(|e| self.err("DescribeInstanceAttribute", e))
    }

    /// Whether EC2 checks source/destination on the instance's traffic (`true` unless turned off,
    /// as a router instance needs).
    pub fn source_dest_check(&self, instance_id: &str) -> Result<bool, CloudError> {
        let out = self.instance_attribute(instance_id, aws_sdk_ec2::types::InstanceAttributeName::SourceDestCheck)?;
        Ok(out.source_dest_check().and_then(|v| v.value()).unwrap_or(true))
    }

    pub fn user_data(&self, instance_id: &str) -> Result<Option<String>, CloudError> {
        let out = self.instance_attribute(instance_id, aws_sdk_ec2::types::InstanceAttributeName::UserData)?;
        let Some(b64) = out.user_data().and_then(|u| u.value()) else {
            return Ok(None);
        };
        let bytes = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, b64.trim())
            .map_err(|e| self.err("DescribeInstanceAttribute (base64 user-data)", e))?;
        Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
    }

    pub fn volumes(&self) -> Result<Vec<Volume>, CloudError> {
        let out = self.rt.block_on(self.ec2.describe_volumes().send()).map_err(|e| self.err("DescribeVolumes", e))?;
        let mut v: Vec<Volume> = out
            .volumes()
            .iter()
            .map(|x| Volume {
                id: x.volume_id().unwrap_or_default().to_string(),
                size_gib: x.size().unwrap_or(1).max(1) as u64,
                zone: x.availability_zone().unwrap_or_default().to_string(),
                state: x.state().map(|s| s.as_str().to_string()).unwrap_or_default(),
                tags: tags_of(Some(x.tags())),
                attachments: x
                    .attachments()
                    .iter()
                    .map(|a| Attachment {
                        instance_id: a.instance_id().unwrap_or_default().to_string(),
                        device: a.device().unwrap_or_default().to_string(),
                        state: a.state().map(|s| s.as_str().to_string()).unwrap_or_default(),
                    })
                    .collect(),
            })
            .collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(v)
    }

    /// Delete a volume (EC2 refuses one that is attached).
    pub fn delete_volume(&self, volume_id: &str) -> Result<(), CloudError> {
        self.rt.block_on(self.ec2.delete_volume().volume_id(volume_id).send()).map_err(|e| self.err("DeleteVolume", e))?;
        Ok(())
    }

    /// Terminate an instance the way an instance dies: through EC2. Its autoscaling group notices
    /// and launches a replacement.
    pub fn terminate(&self, instance_id: &str) -> Result<(), CloudError> {
        self.rt.block_on(self.ec2.terminate_instances().instance_ids(instance_id).send()).map_err(|e| self.err("TerminateInstances", e))?;
        Ok(())
    }

    /// Every A record of every hosted zone.
    pub fn a_records(&self) -> Result<Vec<ARecord>, CloudError> {
        let zones = self.rt.block_on(self.r53.list_hosted_zones().send()).map_err(|e| self.err("ListHostedZones", e))?;
        let mut out = Vec::new();
        for z in zones.hosted_zones() {
            let id = z.id().to_string();
            let mut next: Option<(String, aws_sdk_route53::types::RrType)> = None;
            for _page in 0..100 {
                let mut req = self.r53.list_resource_record_sets().hosted_zone_id(&id);
                if let Some((n, t)) = &next {
                    req = req.start_record_name(n).start_record_type(t.clone());
                }
                let rs = self.rt.block_on(req.send()).map_err(|e| self.err("ListResourceRecordSets", e))?;
                for r in rs.resource_record_sets() {
                    if r.r#type() == &aws_sdk_route53::types::RrType::A {
                        out.push(ARecord {
                            zone: z.name().to_string(),
                            name: r.name().trim_end_matches('.').to_string(),
                            ips: r.resource_records().iter().map(|x| x.value().to_string()).collect(),
                        });
                    }
                }
                if !rs.is_truncated() {
                    break;
                }
                match (rs.next_record_name(), rs.next_record_type()) {
                    (Some(n), Some(t)) => next = Some((n.to_string(), t.clone())),
                    _ => break,
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Desired capacity and live instances per autoscaling group.
    pub fn groups(&self) -> Result<Vec<(String, i32, Vec<String>)>, CloudError> {
        let out = self.rt.block_on(self.asg.describe_auto_scaling_groups().send()).map_err(|e| self.err("DescribeAutoScalingGroups", e))?;
        Ok(out
            .auto_scaling_groups()
            .iter()
            .map(|g| {
                (
                    g.auto_scaling_group_name().unwrap_or_default().to_string(),
                    g.desired_capacity().unwrap_or(0),
                    g.instances().iter().filter_map(|i| i.instance_id().map(str::to_string)).collect(),
                )
            })
            .collect())
    }

    /// Every listener of every network load balancer, with its target group's registered targets
    /// and settings (TCP listeners forwarding to one target group; other kinds are left out).
    pub fn nlb_listeners(&self) -> Result<Vec<NlbListener>, CloudError> {
        let lbs = self.rt.block_on(self.elb.describe_load_balancers().send()).map_err(|e| self.err("DescribeLoadBalancers", e))?;
        let mut out = Vec::new();
        for lb in lbs.load_balancers() {
            if lb.r#type().map(|t| t.as_str()) != Some("network") {
                continue;
            }
            let (Some(arn), Some(name)) = (lb.load_balancer_arn(), lb.load_balancer_name()) else { continue };
            let tags = self.rt.block_on(self.elb.describe_tags().resource_arns(arn).send()).map_err(|e| self.err("DescribeTags", e))?;
            let tags: Vec<(String, String)> = tags
                .tag_descriptions()
                .iter()
                .flat_map(|d| d.tags())
                .map(|t| (t.key().unwrap_or_default().to_string(), t.value().unwrap_or_default().to_string()))
                .collect();
            let listeners = self.rt.block_on(self.elb.describe_listeners().load_balancer_arn(arn).send()).map_err(|e| self.err("DescribeListeners", e))?;
            for l in listeners.listeners() {
                let Some(port) = l.port() else { continue };
                let Some(tg_arn) = l.default_actions().iter().find_map(|a| a.target_group_arn()) else { continue };
                let tgs =
                    self.rt.block_on(self.elb.describe_target_groups().target_group_arns(tg_arn).send()).map_err(|e| self.err("DescribeTargetGroups", e))?;
                let Some(tg) = tgs.target_groups().first() else { continue };
                let attrs = self
                    .rt
                    .block_on(self.elb.describe_target_group_attributes().target_group_arn(tg_arn).send())
                    .map_err(|e| self.err("DescribeTargetGroupAttributes", e))?;
                let delay = attrs
                    .attributes()
                    .iter()
                    .find(|a| a.key() == Some("deregistration_delay.timeout_seconds"))
                    .and_then(|a| a.value())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(300);
                let defaults = HealthCheck::default();
                let health = HealthCheck {
                    interval: tg.health_check_interval_seconds().map(|s| Duration::from_secs(s.max(1) as u64)).unwrap_or(defaults.interval),
                    healthy_threshold: tg.healthy_threshold_count().map(|n| n.max(1) as u32).unwrap_or(defaults.healthy_threshold),
                    unhealthy_threshold: tg.unhealthy_threshold_count().map(|n| n.max(1) as u32).unwrap_or(defaults.unhealthy_threshold),
                    port: tg.health_check_port().and_then(|p| p.parse().ok()),
                };
                let tg_port = tg.port().unwrap_or(0);
                let targets = self.target_group_members(tg_arn, tg_port)?.into_iter().collect();
                out.push(NlbListener {
                    load_balancer: name.to_string(),
                    load_balancer_arn: arn.to_string(),
                    dns_name: lb.dns_name().unwrap_or_default().to_string(),
                    tags: tags.clone(),
                    port,
                    target_group: tg.target_group_name().unwrap_or_default().to_string(),
                    target_group_arn: tg_arn.to_string(),
                    target_group_port: tg_port,
                    health,
                    deregistration_delay: Duration::from_secs(delay),
                    targets,
                });
            }
        }
        out.sort_by(|a, b| (&a.load_balancer, a.port).cmp(&(&b.load_balancer, b.port)));
        Ok(out)
    }

    /// The registered targets of a target group (instance id, port; `port` for one registered
    /// without): what `DescribeTargetHealth` lists, less those draining (deregistered, as an NLB
    /// sends them no new connection).
    pub fn target_group_members(&self, tg_arn: &str, port: i32) -> Result<std::collections::BTreeSet<(String, i32)>, CloudError> {
        let out = self.rt.block_on(self.elb.describe_target_health().target_group_arn(tg_arn).send()).map_err(|e| self.err("DescribeTargetHealth", e))?;
        Ok(out
            .target_health_descriptions()
            .iter()
            .filter(|d| d.target_health().and_then(|h| h.state()) != Some(&aws_sdk_elasticloadbalancingv2::types::TargetHealthStateEnum::Draining))
            .filter_map(|d| d.target())
            .map(|t| (t.id().unwrap_or_default().to_string(), t.port().unwrap_or(port)))
            .collect())
    }

    /// Create a public hosted zone unless one with that name exists (the account's existing zone).
    pub fn ensure_zone(&self, name: &str) -> Result<String, CloudError> {
        let want = format!("{}.", name.trim_end_matches('.'));
        let zones = self.rt.block_on(self.r53.list_hosted_zones().send()).map_err(|e| self.err("ListHostedZones", e))?;
        if let Some(z) = zones.hosted_zones().iter().find(|z| z.name() == want) {
            return Ok(z.id().to_string());
        }
        let out = self
            .rt
            .block_on(self.r53.create_hosted_zone().name(name).caller_reference(format!("keelson-local-{name}")).send())
            .map_err(|e| self.err("CreateHostedZone", e))?;
        Ok(out.hosted_zone().map(|z| z.id().to_string()).unwrap_or_default())
    }

    /// Every policy document of an IAM role as IAM holds it: its inline policies, then the default
    /// version of each attached managed policy (all of them apply to the role's calls).
    /// The IAM OIDC providers, as STS judges tokens by them.
    pub fn oidc_providers(&self) -> Result<Vec<testkit::web_identity::Provider>, CloudError> {
        let list = self.rt.block_on(self.iam.list_open_id_connect_providers().send()).map_err(|e| self.err("ListOpenIDConnectProviders", e))?;
        let mut out = Vec::new();
        for arn in list.open_id_connect_provider_list().iter().filter_map(|p| p.arn()) {
            let p = self
                .rt
                .block_on(self.iam.get_open_id_connect_provider().open_id_connect_provider_arn(arn).send())
                .map_err(|e| self.err("GetOpenIDConnectProvider", e))?;
            let url = p.url().unwrap_or_default();
            let url = url.split_once("://").map(|(_, rest)| rest).unwrap_or(url).to_string();
            out.push(testkit::web_identity::Provider { arn: arn.to_string(), url, client_ids: p.client_id_list().to_vec() });
        }
        Ok(out)
    }

    /// The key set an issuer publishes, when the issuer is a bucket of this cloud's S3
    /// (`BUCKET.s3[.REGION].amazonaws.com/PATH`, the issuer a discovery store on S3 gets).
    pub fn issuer_key_set(&self, issuer: &str) -> Result<Option<serde_json::Value>, CloudError> {
        let Some((host, path)) = issuer.split_once('/') else { return Ok(None) };
        let Some((bucket, _)) = host.split_once(".s3.").filter(|(_, rest)| rest.ends_with("amazonaws.com")) else { return Ok(None) };
        let key = format!("{}/openid/v1/jwks", path.trim_end_matches('/'));
        let got = match self.rt.block_on(self.s3.get_object().bucket(bucket).key(&key).send()) {
            Ok(o) => o,
            Err(e) if e.as_service_error().is_some_and(|s| s.is_no_such_key()) => return Ok(None),
            Err(e) => return Err(self.err("GetObject", e)),
        };
        let bytes = self.rt.block_on(got.body.collect()).map_err(|e| self.err("GetObject", e))?.into_bytes();
        serde_json::from_slice(&bytes).map(Some).map_err(|e| self.err("GetObject", format!("{bucket}/{key}: {e}")))
    }

    /// A role's trust policy.
    pub fn role_trust(&self, role: &str) -> Result<serde_json::Value, CloudError> {
        let r = self.rt.block_on(self.iam.get_role().role_name(role).send()).map_err(|e| self.err("GetRole", e))?;
        let text = r.role().and_then(|r| r.assume_role_policy_document()).unwrap_or("{}");
        let decoded = percent_encoding::percent_decode_str(text).decode_utf8_lossy().into_owned();
        serde_json::from_str(text).or_else(|_| serde_json::from_str(&decoded)).map_err(|e| self.err("GetRole", format!("{role}: trust policy: {e}")))
    }

    pub fn role_policies(&self, role: &str) -> Result<Vec<serde_json::Value>, CloudError> {
        let doc = |op: &'static str, text: &str| -> Result<serde_json::Value, CloudError> {
            // IAM answers documents URL-encoded (moto as AWS does, or already decoded).
            let decoded = percent_encoding::percent_decode_str(text).decode_utf8_lossy().into_owned();
            serde_json::from_str(text).or_else(|_| serde_json::from_str(&decoded)).map_err(|e| self.err(op, format!("{role}: policy document: {e}")))
        };
        let mut out = Vec::new();
        let names = self.rt.block_on(self.iam.list_role_policies().role_name(role).send()).map_err(|e| self.err("ListRolePolicies", e))?;
        for name in names.policy_names() {
            let p = self.rt.block_on(self.iam.get_role_policy().role_name(role).policy_name(name).send()).map_err(|e| self.err("GetRolePolicy", e))?;
            out.push(doc("GetRolePolicy", p.policy_document())?);
        }
        let attached = self.rt.block_on(self.iam.list_attached_role_policies().role_name(role).send()).map_err(|e| self.err("ListAttachedRolePolicies", e))?;
        for arn in attached.attached_policies().iter().filter_map(|p| p.policy_arn()) {
            let p = self.rt.block_on(self.iam.get_policy().policy_arn(arn).send()).map_err(|e| self.err("GetPolicy", e))?;
            let version = p.policy().and_then(|p| p.default_version_id()).unwrap_or("v1").to_string();
            let v = self.rt.block_on(self.iam.get_policy_version().policy_arn(arn).version_id(&version).send()).map_err(|e| self.err("GetPolicyVersion", e))?;
            out.push(doc("GetPolicyVersion", v.policy_version().and_then(|v| v.document()).unwrap_or("{}"))?);
        }
        Ok(out)
    }

    /// The tags of every EC2 resource (by id) and of every ELBv2 load balancer and target group (by
    /// ARN), for the `aws:ResourceTag/…` condition keys.
    pub fn resource_tags(&self) -> Result<BTreeMap<String, BTreeMap<String, String>>, CloudError> {
        let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        let tags = self
            .rt
            .block_on(self.ec2.describe_tags().max_results(1000).into_paginator().items().send().try_collect())
            .map_err(|e| self.err("DescribeTags", e))?;
        for t in &tags {
            if let (Some(id), Some(k)) = (t.resource_id(), t.key()) {
                out.entry(id.to_string()).or_default().insert(k.to_string(), t.value().unwrap_or_default().to_string());
            }
        }
        let lbs = self.rt.block_on(self.elb.describe_load_balancers().send()).map_err(|e| self.err("DescribeLoadBalancers", e))?;
        let tgs = self.rt.block_on(self.elb.describe_target_groups().send()).map_err(|e| self.err("DescribeTargetGroups", e))?;
        let arns: Vec<String> = lbs
            .load_balancers()
            .iter()
            .filter_map(|l| l.load_balancer_arn())
            .chain(tgs.target_groups().iter().filter_map(|t| t.target_group_arn()))
            .map(str::to_string)
            .collect();
        for chunk in arns.chunks(20) {
            let d = self.rt.block_on(self.elb.describe_tags().set_resource_arns(Some(chunk.to_vec())).send()).map_err(|e| self.err("DescribeTags", e))?;
            for desc in d.tag_descriptions() {
                let Some(arn) = desc.resource_arn() else { continue };
                let tags = out.entry(arn.to_string()).or_default();
                for t in desc.tags() {
                    tags.insert(t.key().unwrap_or_default().to_string(), t.value().unwrap_or_default().to_string());
                }
            }
        }
        Ok(out)
    }

    /// An AMI moto knows per Debian release in `suites`, Debian 12's always: moto's own AMIs, in
    /// id order, stand for them (the machines boot the release's rootfs whatever the AMI is).
    pub fn images_for(
        &self,
        suites: &std::collections::BTreeSet<crate::rootfs::Suite>,
    ) -> Result<std::collections::BTreeMap<crate::rootfs::Suite, String>, CloudError> {
        let out = self.rt.block_on(self.ec2.describe_images().send()).map_err(|e| self.err("DescribeImages", e))?;
        let mut ids: Vec<String> = out.images().iter().filter_map(|i| i.image_id().map(str::to_string)).collect();
        ids.sort();
        let mut wanted: std::collections::BTreeSet<crate::rootfs::Suite> = suites.clone();
        wanted.insert(crate::rootfs::Suite::Bookworm);
        if ids.len() < wanted.len() {
            return Err(self.err("DescribeImages", format!("moto has {} AMIs, {} Debian releases are asked for", ids.len(), wanted.len())));
        }
        Ok(wanted.into_iter().zip(ids).collect())
    }
}
