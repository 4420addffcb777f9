//! The direct AWS target: resolve (images, DNS zone), discover what exists by the cluster tag,
//! turn the model into comparable resources, and execute a plan through aws-sdk-ec2,
//! aws-sdk-autoscaling and aws-sdk-route53. Every create call tags the resource in the same call,
//! so a run that fails half-way leaves only discoverable resources and the rerun adopts them.

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_autoscaling::types as asg_t;
use aws_sdk_ec2::types as ec2_t;
use aws_smithy_runtime_api::client::interceptors::SharedInterceptor;
use aws_smithy_types::error::display::DisplayErrorContext;
use base64::Engine as _;
use cloud::calls::CallCounter;
use cloud::dns::{Dns as _, Record, RecordChange, Route53Dns};
use cloud::AwsOptions;

use super::model::{cluster_tags, ClusterModel, IngressRule, RuleSource, DNS_TTL, PLACEHOLDER_IP};
use super::plan::{Action, Change, Kind, Plan, Resource, Rolling};
use base::{sha256_hex, StateStore};
use super::state::StateError;

mod iam;
mod load_balancer;
mod routing;

/// At most this many pages are read from any listing (1000 items a page at most).
const MAX_PAGES: usize = 200;

#[derive(Debug, thiserror::Error)]
pub enum AwsError {
    #[error("{op} {target}: {message}")]
    Api { op: &'static str, target: String, message: String },
    #[error("image {image:?}: {message}")]
    Image { image: String, message: String },
    #[error("DNS: {0}")]
    Dns(#[from] cloud::DnsError),
    #[error("state store: {0}")]
    Store(#[from] StateError),
    #[error("{kind} {name}: {message}")]
    Missing { kind: &'static str, name: String, message: String },
}

fn api<E: std::error::Error>(op: &'static str, target: &str, e: E) -> AwsError {
    AwsError::Api { op, target: target.to_string(), message: DisplayErrorContext(&e).to_string() }
}

/// Operation names that change something (the rest only read).
pub fn is_write(operation: &str) -> bool {
    !["Describe", "List", "Get", "Head"].iter().any(|p| operation.starts_with(p))
}

/// Write calls made so far, per `service/operation`.
pub fn write_calls(counter: &CallCounter) -> BTreeMap<String, u64> {
    counter
        .snapshot()
        .into_iter()
        .filter(|(k, _)| is_write(k.rsplit('/').next().unwrap_or("")))
        .map(|(k, c)| (k, c.calls))
        .collect()
}

/// Clients for one region, sharing the options and interceptors (call counter always first).
#[derive(Debug, Clone)]
pub struct AwsTarget {
    pub ec2: aws_sdk_ec2::Client,
    pub asg: aws_sdk_autoscaling::Client,
    pub dns: Route53Dns,
    pub s3: aws_sdk_s3::Client,
    pub iam: aws_sdk_iam::Client,
    pub elb: aws_sdk_elasticloadbalancingv2::Client,
    pub counter: CallCounter,
    /// How long to keep retrying deletes that wait on dependents (instances terminating).
    pub dependency_retries: u32,
    pub dependency_delay: Duration,
}

impl AwsTarget {
    pub async fn new(opts: &AwsOptions, interceptors: &[SharedInterceptor]) -> AwsTarget {
        let conf = cloud::sdk_config(opts).await;
        let counter = CallCounter::default();
        let mut all = vec![SharedInterceptor::new(counter.clone())];
        all.extend(interceptors.iter().cloned());
        let mut ec2 = aws_sdk_ec2::config::Builder::from(&conf);
        let mut asg = aws_sdk_autoscaling::config::Builder::from(&conf);
        let mut r53 = aws_sdk_route53::config::Builder::from(&conf);
        let mut iam = aws_sdk_iam::config::Builder::from(&conf);
        let mut elb = aws_sdk_elasticloadbalancingv2::config::Builder::from(&conf);
        let endpoint_override = opts.endpoint_url.is_some() || std::env::var_os("AWS_ENDPOINT_URL").is_some();
        let mut s3 = aws_sdk_s3::config::Builder::from(&conf)
            .force_path_style(endpoint_override)
            .request_checksum_calculation(aws_sdk_s3::config::RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(aws_sdk_s3::config::ResponseChecksumValidation::WhenRequired);
        for i in &all {
            ec2.push_interceptor(i.clone());
            asg.push_interceptor(i.clone());
            r53.push_interceptor(i.clone());
            s3.push_interceptor(i.clone());
            iam.push_interceptor(i.clone());
            elb.push_interceptor(i.clone());
        }
        AwsTarget {
            ec2: aws_sdk_ec2::Client::from_conf(ec2.build()),
            asg: aws_sdk_autoscaling::Client::from_conf(asg.build()),
            dns: Route53Dns::new(aws_sdk_route53::Client::from_conf(r53.build())),
            s3: aws_sdk_s3::Client::from_conf(s3.build()),
            iam: aws_sdk_iam::Client::from_conf(iam.build()),
            elb: aws_sdk_elasticloadbalancingv2::Client::from_conf(elb.build()),
            counter,
            dependency_retries: 60,
            dependency_delay: Duration::from_secs(5),
        }
    }
}

/// Values found by read-only lookups before planning.
#[derive(Debug, Clone, Default)]
pub struct Resolved {
    /// spec image → (AMI id, root device name).
    pub images: BTreeMap<String, (String, String)>,
    /// Hosted zone id, when the cluster uses Route53.
    pub zone: Option<String>,
    pub notes: Vec<String>,
}

/// Cloud ids known so far (discovered, from the spec, or created during this run).
#[derive(Debug, Clone, Default)]
pub struct Ids {
    pub vpc: Option<String>,
    pub subnets: BTreeMap<String, String>,
    pub security_groups: BTreeMap<String, String>,
    pub launch_templates: BTreeMap<String, String>,
    pub volumes: BTreeMap<String, String>,
    pub internet_gateways: BTreeMap<String, String>,
    /// Elastic IP name → allocation id.
    pub elastic_ips: BTreeMap<String, String>,
    pub nat_gateways: BTreeMap<String, String>,
    pub route_tables: BTreeMap<String, String>,
    /// Subnet (cloud name) → its explicit route-table association id.
    pub route_associations: BTreeMap<String, String>,
    /// Target group name → ARN.
    pub target_groups: BTreeMap<String, String>,
    /// Launch template → its latest version number.
    pub lt_versions: BTreeMap<String, i64>,
    /// Load balancer (model name) → (ARN, DNS name, canonical hosted zone id).
    pub load_balancers: BTreeMap<String, (String, String, String)>,
}

/// The name an id is known by in `map` (name → id), or the id itself when it is not ours.
pub(crate) fn name_of(map: &BTreeMap<String, String>, id: &str) -> String {
    map.iter().find(|(_, v)| v.as_str() == id).map(|(k, _)| k.clone()).unwrap_or_else(|| id.to_string())
}

/// Cloud ids for a comma-separated list of names; a value that is already an id given in the
/// spec (`sg-<hex>`, `subnet-<hex>`, `arn:…`) is kept (cloud names always carry the cluster name).
pub(crate) fn ids_for(map: &BTreeMap<String, String>, names: &str, kind: &'static str, user: &str) -> Result<Vec<String>, AwsError> {
    names
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|n| {
            let aws_id = |p: &str| n.strip_prefix(p).is_some_and(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_hexdigit()));
            if aws_id("sg-") || aws_id("subnet-") || n.starts_with("arn:") {
                return Ok(n.to_string());
            }
            map.get(n).cloned().ok_or_else(|| AwsError::Missing { kind, name: n.to_string(), message: format!("needed by {user}") })
        })
        .collect()
}

impl Ids {
    pub(crate) fn subnet_name(&self, id: &str) -> String {
        name_of(&self.subnets, id)
    }
    pub(crate) fn sg_name(&self, id: &str) -> String {
        name_of(&self.security_groups, id)
    }
}

/// What exists.
#[derive(Debug, Clone, Default)]
pub struct Discovered {
    pub resources: Vec<Resource>,
    pub ids: Ids,
    /// ASG name → its instance ids.
    pub instances: BTreeMap<String, Vec<String>>,
}

fn rule_resource(rule: &IngressRule) -> Resource {
    let r = Resource::new(Kind::SecurityGroupRule, rule.name())
        .attr("group", &rule.group)
        .attr("protocol", &rule.protocol)
        .attr("from_port", rule.from_port)
        .attr("to_port", rule.to_port);
    match &rule.source {
        RuleSource::Cidr(c) => r.attr("source_cidr", c),
        RuleSource::Group(g) => r.attr("source_group", g),
    }
}

/// The IpPermission for a rule resource (desired or discovered), with group names resolved to ids.
fn ip_permission(r: &Resource, ids: &Ids) -> Result<ec2_t::IpPermission, AwsError> {
    let get = |k: &str| r.attrs.get(k).cloned().unwrap_or_default();
    let protocol = get("protocol");
    let mut p = ec2_t::IpPermission::builder().ip_protocol(if protocol == "all" { "-1".to_string() } else { protocol.clone() });
    if protocol != "all" {
        p = p.from_port(get("from_port").parse().unwrap_or(0)).to_port(get("to_port").parse().unwrap_or(0));
    }
    if let Some(c) = r.attrs.get("source_cidr") {
        p = p.ip_ranges(ec2_t::IpRange::builder().cidr_ip(c).build());
    }
    if let Some(g) = r.attrs.get("source_group") {
        let id = ids.security_groups.get(g).cloned().ok_or_else(|| AwsError::Missing {
            kind: "SecurityGroup",
            name: g.clone(),
            message: format!("source of rule {}", r.name),
        })?;
        p = p.user_id_group_pairs(ec2_t::UserIdGroupPair::builder().group_id(id).build());
    }
    Ok(p.build())
}

fn ec2_tags(tags: &BTreeMap<String, String>) -> Vec<ec2_t::Tag> {
    tags.iter().map(|(k, v)| ec2_t::Tag::builder().key(k).value(v).build()).collect()
}

fn tag_spec(rt: ec2_t::ResourceType, tags: &BTreeMap<String, String>) -> ec2_t::TagSpecification {
    ec2_t::TagSpecification::builder().resource_type(rt).set_tags(Some(ec2_tags(tags))).build()
}

fn tags_of(tags: &[ec2_t::Tag]) -> BTreeMap<String, String> {
    tags.iter().filter_map(|t| Some((t.key()?.to_string(), t.value().unwrap_or("").to_string()))).collect()
}

fn cluster_filter(cluster: &str) -> ec2_t::Filter {
    ec2_t::Filter::builder().name("tag:KubernetesCluster").values(cluster).build()
}

fn join_sorted(items: impl IntoIterator<Item = String>) -> String {
    let mut v: Vec<String> = items.into_iter().collect();
    v.sort();
    v.join(",")
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

/// Autoscaling groups pin an explicit launch-template version (as kOps does), so instances say
/// which version they run: the current one, or the next when the plan changes the template.
pub fn pin_versions(desired: &mut [Resource], actual: &[Resource], ids: &Ids) {
    let next: BTreeMap<String, i64> = desired
        .iter()
        .filter(|d| d.kind() == Kind::LaunchTemplate)
        .map(|d| {
            let current = ids.lt_versions.get(&d.name).copied();
            let changes = actual.iter().find(|a| a.key() == d.key()).is_none_or(|a| super::plan::attributes_differ(d, a));
            let v = match (current, changes) {
                (Some(v), false) => v,
                (Some(v), true) => v + 1,
                (None, _) => 1,
            };
            (d.name.clone(), v)
        })
        .collect();
    for r in desired.iter_mut().filter(|r| r.kind() == Kind::AutoscalingGroup) {
        if let Some(v) = r.attrs.get("launch_template").and_then(|lt| next.get(lt)) {
            r.attrs.insert("launch_template_version".into(), v.to_string());
        }
    }
}

/// The model as comparable resources (AWS flavour). Needs resolved image ids.
pub fn desired(model: &ClusterModel, resolved: &Resolved) -> Vec<Resource> {
    let mut out = Vec::new();
    iam::desired(model, resolved, &mut out);
    let net = &model.network;
    let vpc_name = net.existing_id.clone().unwrap_or_else(|| net.name.clone());
    if net.existing_id.is_none() {
        out.push(
            Resource::new(Kind::Vpc, &net.name)
                .attr("cidr", net.cidr.clone().unwrap_or_default())
                .attr("dns_hostnames", true)
                .tags(&cluster_tags(&model.cluster, &net.name)),
        );
    }
    for s in net.subnets.iter().filter(|s| s.existing_id.is_none()) {
        out.push(
            Resource::new(Kind::Subnet, &s.cloud_name)
                .attr("cidr", s.cidr.clone().unwrap_or_default())
                .attr("zone", s.zone.clone().unwrap_or_default())
                .attr("vpc", &vpc_name)
                .attr("map_public_ip", matches!(s.kind.as_str(), "Public" | "Utility"))
                .tags(&subnet_tags(model, &s.cloud_name, &s.kind)),
        );
    }
    routing::desired(model, &mut out);
    for sg in &model.security_groups {
        out.push(Resource::new(Kind::SecurityGroup, &sg.name).attr("vpc", &vpc_name).tags(&sg.tags));
        for rule in &sg.ingress {
            out.push(rule_resource(rule));
        }
    }
    load_balancer::desired(model, &mut out);
    for lt in &model.launch_templates {
        let image = resolved.images.get(&lt.image).map(|(id, _)| id.clone()).unwrap_or_else(|| lt.image.clone());
        let mut sgs = lt.security_groups.clone();
        sgs.extend(lt.additional_security_groups.iter().cloned());
        let mut r = Resource::new(Kind::LaunchTemplate, &lt.name)
            .attr("image", image)
            .attr("instance_type", &lt.machine_type)
            .attr("metadata.http_tokens", &lt.http_tokens)
            .attr("metadata.hop_limit", lt.hop_limit)
            .attr("root_volume.size", lt.root_volume_size)
            .attr("root_volume.type", &lt.root_volume_type)
            .attr("root_volume.encrypted", lt.root_volume_encrypted)
            .attr("security_groups", join_sorted(sgs))
            .attr("instance_profile", &lt.instance_profile)
            .attr("user_data.sha256", sha256_hex(&lt.user_data))
            .tags(&lt.tags);
        if let Some(i) = lt.root_volume_iops {
            r = r.attr("root_volume.iops", i);
        }
        if let Some(t) = lt.root_volume_throughput {
            r = r.attr("root_volume.throughput", t);
        }
        if lt.associate_public_ip_explicit {
            r = r.attr("associate_public_ip", lt.associate_public_ip);
        }
        if let Some(spot) = &lt.spot {
            r = r.attr("spot.max_price", spot.max_price.clone().unwrap_or_default()).attr("spot.interruption", &spot.interruption_behavior);
        }
        if let Some(c) = &lt.cpu_credits {
            r = r.attr("cpu_credits", c);
        }
        out.push(r);
    }
    for g in &model.groups {
        let mut r = Resource::new(Kind::AutoscalingGroup, &g.name)
            .attr("min_size", g.min_size)
            .attr("max_size", g.max_size)
            .attr("launch_template", &g.launch_template)
            .attr("subnets", join_sorted(g.subnets.iter().cloned()))
            .tags(&g.tags);
        if !g.target_groups.is_empty() {
            r = r.attr("target_groups", join_sorted(g.target_groups.iter().cloned()));
        }
        if let Some(m) = &g.mixed {
            r = r
                .attr("mixed.instance_types", m.instance_types.join(","))
                .attr("mixed.on_demand_allocation_strategy", &m.on_demand_allocation_strategy)
                .attr("mixed.on_demand_base", m.on_demand_base)
                .attr("mixed.on_demand_above_base", m.on_demand_above_base)
                .attr("mixed.spot_allocation_strategy", &m.spot_allocation_strategy);
            if let Some(p) = m.spot_instance_pools {
                r = r.attr("mixed.spot_instance_pools", p);
            }
            if let Some(p) = &m.spot_max_price {
                r = r.attr("mixed.spot_max_price", p);
            }
        }
        out.push(r);
    }
    for v in &model.volumes {
        let mut r = Resource::new(Kind::Volume, &v.name)
            .attr("zone", &v.zone)
            .attr("size", v.size_gib)
            .attr("type", &v.volume_type)
            .attr("encrypted", v.encrypted)
            .tags(&v.tags);
        if let Some(i) = v.iops {
            r = r.attr("iops", i);
        }
        if let Some(t) = v.throughput {
            r = r.attr("throughput", t);
        }
        out.push(r);
    }
    if let (Some(dns), Some(_)) = (&model.dns, &resolved.zone) {
        for name in &dns.records {
            out.push(Resource::new(Kind::DnsRecord, name).attr("type", "A").attr("value", PLACEHOLDER_IP));
        }
        if let Some(lb) = &model.load_balancer {
            for name in &dns.alias_records {
                out.push(Resource::new(Kind::DnsRecord, name).attr("type", "A").attr("alias", &lb.name));
            }
        }
    }
    out
}

impl AwsTarget {
    /// Read-only lookups: AMI ids for the images, and the hosted zone.
    pub async fn resolve(&self, model: &ClusterModel) -> Result<Resolved, AwsError> {
        let mut r = Resolved::default();
        let mut images: Vec<&String> = model.launch_templates.iter().map(|l| &l.image).collect();
        images.sort();
        images.dedup();
        for image in images {
            let req = self.ec2.describe_images();
            let req = if image.starts_with("ami-") {
                req.image_ids(image)
            } else {
                let (owner, name) = image.split_once('/').ok_or_else(|| AwsError::Image {
                    image: image.clone(),
                    message: "expected an AMI id (ami-…) or OWNER/NAME".into(),
                })?;
                req.owners(owner).filters(ec2_t::Filter::builder().name("name").values(name).build())
            };
            let resp = req.send().await.map_err(|e| api("DescribeImages", image, e))?;
            let best = resp
                .images()
                .iter()
                .max_by(|a, b| a.creation_date().unwrap_or("").cmp(b.creation_date().unwrap_or("")))
                .ok_or_else(|| AwsError::Image { image: image.clone(), message: "no such image in this region".into() })?;
            r.images.insert(
                image.clone(),
                (best.image_id().unwrap_or_default().to_string(), best.root_device_name().unwrap_or("/dev/sda1").to_string()),
            );
        }
        self.resolve_zone(model, &mut r).await?;
        Ok(r)
    }

    /// What delete needs resolved: only the hosted zone (images may be long gone).
    pub async fn resolve_for_delete(&self, model: &ClusterModel) -> Result<Resolved, AwsError> {
        let mut r = Resolved::default();
        self.resolve_zone(model, &mut r).await?;
        Ok(r)
    }

    async fn resolve_zone(&self, model: &ClusterModel, r: &mut Resolved) -> Result<(), AwsError> {
        if let Some(dns) = &model.dns {
            match self.dns.find_zone(dns.zone.as_deref(), &model.cluster).await {
                Ok(z) => r.zone = Some(z),
                Err(cloud::DnsError::NoZone(z)) if dns.zone.is_none() => r.notes.push(format!(
                    "no Route53 hosted zone found for {z}; DNS records are not managed (set spec.dnsZone)"
                )),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Everything tagged for the cluster, as comparable resources (reads only).
    pub async fn discover(&self, model: &ClusterModel, resolved: &Resolved) -> Result<Discovered, AwsError> {
        let cluster = &model.cluster;
        let mut d = Discovered::default();
        // Ids the spec gives (existing network).
        d.ids.vpc = model.network.existing_id.clone();
        for s in &model.network.subnets {
            if let Some(id) = &s.existing_id {
                d.ids.subnets.insert(s.cloud_name.clone(), id.clone());
            }
        }

        iam::discover(self, model, &mut d).await?;
        let vpcs = self.ec2.describe_vpcs().filters(cluster_filter(cluster)).send().await.map_err(|e| api("DescribeVpcs", cluster, e))?;
        for v in vpcs.vpcs() {
            let tags = tags_of(v.tags());
            let name = tags.get("Name").cloned().unwrap_or_default();
            let id = v.vpc_id().unwrap_or_default().to_string();
            if model.network.existing_id.is_none() {
                d.ids.vpc = Some(id.clone());
            }
            let hostnames = self
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
            d.resources.push(Resource {
                id: Some(id),
                ..Resource::new(Kind::Vpc, name)
                    .attr("cidr", v.cidr_block().unwrap_or_default())
                    .attr("dns_hostnames", hostnames)
                    .tags(&tags)
            });
        }
        let vpc_name_of = |id: &str| -> String {
            if model.network.existing_id.as_deref() == Some(id) {
                id.to_string()
            } else {
                model.network.name.clone()
            }
        };
        let subnets =
            self.ec2.describe_subnets().filters(cluster_filter(cluster)).send().await.map_err(|e| api("DescribeSubnets", cluster, e))?;
        for s in subnets.subnets() {
            let tags = tags_of(s.tags());
            let name = tags.get("Name").cloned().unwrap_or_default();
            let id = s.subnet_id().unwrap_or_default().to_string();
            d.ids.subnets.insert(name.clone(), id.clone());
            d.resources.push(Resource {
                id: Some(id),
                ..Resource::new(Kind::Subnet, name)
                    .attr("cidr", s.cidr_block().unwrap_or_default())
                    .attr("zone", s.availability_zone().unwrap_or_default())
                    .attr("vpc", vpc_name_of(s.vpc_id().unwrap_or_default()))
                    .attr("map_public_ip", s.map_public_ip_on_launch().unwrap_or(false))
                    .tags(&tags)
            });
        }
        routing::discover(self, model, &mut d).await?;
        let sgs = self
            .ec2
            .describe_security_groups()
            .filters(cluster_filter(cluster))
            .send()
            .await
            .map_err(|e| api("DescribeSecurityGroups", cluster, e))?;
        for g in sgs.security_groups() {
            let tags = tags_of(g.tags());
            let name = g.group_name().unwrap_or_default().to_string();
            let id = g.group_id().unwrap_or_default().to_string();
            d.ids.security_groups.insert(name.clone(), id.clone());
            d.resources.push(Resource {
                id: Some(id),
                ..Resource::new(Kind::SecurityGroup, name).attr("vpc", vpc_name_of(g.vpc_id().unwrap_or_default())).tags(&tags)
            });
        }
        // Ingress rules, one resource per (protocol, ports, source), once every group's name is known.
        for g in sgs.security_groups() {
            let group = g.group_name().unwrap_or_default().to_string();
            for p in g.ip_permissions() {
                let protocol = match p.ip_protocol().unwrap_or("-1") {
                    "-1" => "all".to_string(),
                    other => other.to_string(),
                };
                let (from_port, to_port) =
                    if protocol == "all" { (-1, -1) } else { (p.from_port().unwrap_or(0), p.to_port().unwrap_or(0)) };
                let mut sources: Vec<RuleSource> =
                    p.ip_ranges().iter().filter_map(|r| r.cidr_ip().map(|c| RuleSource::Cidr(c.to_string()))).collect();
                sources.extend(
                    p.user_id_group_pairs().iter().filter_map(|u| u.group_id().map(|id| RuleSource::Group(d.ids.sg_name(id)))),
                );
                for source in sources {
                    let rule = IngressRule { group: group.clone(), protocol: protocol.clone(), from_port, to_port, source };
                    d.resources.push(rule_resource(&rule));
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

        load_balancer::discover(self, model, &mut d).await?;
        let lts = self
            .ec2
            .describe_launch_templates()
            .filters(cluster_filter(cluster))
            .send()
            .await
            .map_err(|e| api("DescribeLaunchTemplates", cluster, e))?;
        for lt in lts.launch_templates() {
            let name = lt.launch_template_name().unwrap_or_default().to_string();
            let id = lt.launch_template_id().unwrap_or_default().to_string();
            d.ids.launch_templates.insert(name.clone(), id.clone());
            let versions = self
                .ec2
                .describe_launch_template_versions()
                .launch_template_id(&id)
                .versions("$Latest")
                .send()
                .await
                .map_err(|e| api("DescribeLaunchTemplateVersions", &name, e))?;
            if let Some(v) = lt.latest_version_number() {
                d.ids.lt_versions.insert(name.clone(), v);
            }
            let mut r = Resource::new(Kind::LaunchTemplate, &name).tags(&tags_of(lt.tags()));
            r.id = Some(id);
            if let Some(data) = versions.launch_template_versions().first().and_then(|v| v.launch_template_data()) {
                r = r
                    .attr("image", data.image_id().unwrap_or_default())
                    .attr("instance_type", data.instance_type().map(|t| t.as_str()).unwrap_or_default())
                    .attr("instance_profile", data.iam_instance_profile().and_then(|p| p.name()).unwrap_or_default())
                    .attr(
                        "security_groups",
                        join_sorted(
                            data.security_group_ids()
                                .iter()
                                .chain(data.network_interfaces().iter().flat_map(|n| n.groups()))
                                .map(|id| d.ids.sg_name(id)),
                        ),
                    );
                if let Some(public) = data.network_interfaces().first().and_then(|n| n.associate_public_ip_address()) {
                    r = r.attr("associate_public_ip", public);
                }
                if let Some(spot) = data.instance_market_options().and_then(|m| m.spot_options()) {
                    r = r.attr("spot.max_price", spot.max_price().unwrap_or_default()).attr(
                        "spot.interruption",
                        spot.instance_interruption_behavior().map(|b| b.as_str()).unwrap_or("terminate"),
                    );
                }
                if let Some(c) = data.credit_specification().and_then(|c| c.cpu_credits()) {
                    r = r.attr("cpu_credits", c);
                }
                if let Some(m) = data.metadata_options() {
                    r = r
                        .attr("metadata.http_tokens", m.http_tokens().map(|t| t.as_str()).unwrap_or_default())
                        .attr("metadata.hop_limit", m.http_put_response_hop_limit().unwrap_or(1));
                }
                if let Some(ebs) = data.block_device_mappings().first().and_then(|b| b.ebs()) {
                    r = r
                        .attr("root_volume.size", ebs.volume_size().unwrap_or_default())
                        .attr("root_volume.type", ebs.volume_type().map(|t| t.as_str()).unwrap_or_default())
                        .attr("root_volume.encrypted", ebs.encrypted().unwrap_or(false));
                    if let Some(i) = ebs.iops() {
                        r = r.attr("root_volume.iops", i);
                    }
                    if let Some(t) = ebs.throughput() {
                        r = r.attr("root_volume.throughput", t);
                    }
                }
                let ud = data
                    .user_data()
                    .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
                    .unwrap_or_default();
                r = r.attr("user_data.sha256", sha256_hex(&ud));
            }
            d.resources.push(r);
        }

        let mut token: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let resp = self
                .asg
                .describe_auto_scaling_groups()
                .set_next_token(token.clone())
                .send()
                .await
                .map_err(|e| api("DescribeAutoScalingGroups", cluster, e))?;
            for g in resp.auto_scaling_groups() {
                let tags: BTreeMap<String, String> = g
                    .tags()
                    .iter()
                    .filter_map(|t| Some((t.key()?.to_string(), t.value().unwrap_or("").to_string())))
                    .collect();
                if tags.get("KubernetesCluster") != Some(cluster) {
                    continue;
                }
                let name = g.auto_scaling_group_name().unwrap_or_default().to_string();
                let subnets = g
                    .vpc_zone_identifier()
                    .unwrap_or_default()
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(|id| d.ids.subnet_name(id));
                let mixed = g.mixed_instances_policy();
                let spec = g.launch_template().or_else(|| {
                    mixed.and_then(|m| m.launch_template()).and_then(|l| l.launch_template_specification())
                });
                let lt = spec.and_then(|l| l.launch_template_name()).unwrap_or_default();
                let lt_version = spec.and_then(|l| l.version()).unwrap_or_default().to_string();
                d.instances.insert(name.clone(), g.instances().iter().filter_map(|i| i.instance_id().map(str::to_string)).collect());
                let target_groups: Vec<String> = g
                    .target_group_arns()
                    .iter()
                    .map(|arn| name_of(&d.ids.target_groups, arn))
                    .collect();
                let mut r = Resource::new(Kind::AutoscalingGroup, &name)
                    .attr("min_size", g.min_size().unwrap_or_default())
                    .attr("max_size", g.max_size().unwrap_or_default())
                    .attr("launch_template", lt)
                    .attr("launch_template_version", lt_version)
                    .attr("subnets", join_sorted(subnets))
                    .tags(&tags);
                if !target_groups.is_empty() {
                    r = r.attr("target_groups", join_sorted(target_groups));
                }
                if let Some(m) = mixed {
                    let types: Vec<String> = m
                        .launch_template()
                        .map(|l| l.overrides().iter().filter_map(|o| o.instance_type().map(str::to_string)).collect())
                        .unwrap_or_default();
                    r = r.attr("mixed.instance_types", types.join(","));
                    if let Some(d) = m.instances_distribution() {
                        r = r
                            .attr("mixed.on_demand_allocation_strategy", d.on_demand_allocation_strategy().unwrap_or("prioritized"))
                            .attr("mixed.on_demand_base", d.on_demand_base_capacity().unwrap_or(0))
                            .attr("mixed.on_demand_above_base", d.on_demand_percentage_above_base_capacity().unwrap_or(100))
                            .attr("mixed.spot_allocation_strategy", d.spot_allocation_strategy().unwrap_or("lowest-price"));
                        if let Some(p) = d.spot_instance_pools() {
                            r = r.attr("mixed.spot_instance_pools", p);
                        }
                        if let Some(p) = d.spot_max_price().filter(|p| !p.is_empty()) {
                            r = r.attr("mixed.spot_max_price", p);
                        }
                    }
                }
                r.id = Some(name.clone());
                d.resources.push(r);
            }
            token = resp.next_token().map(str::to_string);
            if token.is_none() {
                break;
            }
        }

        let mut token: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let resp = self
                .ec2
                .describe_volumes()
                .filters(cluster_filter(cluster))
                .set_next_token(token.clone())
                .send()
                .await
                .map_err(|e| api("DescribeVolumes", cluster, e))?;
            for v in resp.volumes() {
                let tags = tags_of(v.tags());
                // Only etcd volumes are ours (root volumes of instances carry the cluster tag too).
                if !tags.keys().any(|k| k.starts_with("k8s.io/etcd/")) {
                    continue;
                }
                let name = tags.get("Name").cloned().unwrap_or_default();
                let id = v.volume_id().unwrap_or_default().to_string();
                d.ids.volumes.insert(name.clone(), id.clone());
                let mut r = Resource::new(Kind::Volume, name)
                    .attr("zone", v.availability_zone().unwrap_or_default())
                    .attr("size", v.size().unwrap_or_default())
                    .attr("type", v.volume_type().map(|t| t.as_str()).unwrap_or_default())
                    .attr("encrypted", v.encrypted().unwrap_or(false))
                    .tags(&tags);
                r.id = Some(id);
                let want = model.volumes.iter().find(|w| w.name == r.name);
                if let (Some(i), Some(true)) = (v.iops(), want.map(|w| w.iops.is_some())) {
                    r = r.attr("iops", i);
                }
                if let (Some(t), Some(true)) = (v.throughput(), want.map(|w| w.throughput.is_some())) {
                    r = r.attr("throughput", t);
                }
                d.resources.push(r);
            }
            token = resp.next_token().map(str::to_string);
            if token.is_none() {
                break;
            }
        }

        if let (Some(dns), Some(zone)) = (&model.dns, &resolved.zone) {
            for rec in self.dns.list_records(zone, cluster).await? {
                if rec.rtype == "A" && dns.records.contains(&rec.name) {
                    let mut r = Resource::new(Kind::DnsRecord, &rec.name).attr("type", "A").attr("value", rec.values.join(","));
                    r.id = Some(format!("{}|{}|{}", rec.ttl, rec.rtype, rec.values.join(",")));
                    d.resources.push(r);
                }
            }
            load_balancer::discover_aliases(self, model, zone, &mut d).await?;
        }
        Ok(d)
    }

    /// Instances that run an outdated launch template once `plan` is applied.
    pub fn rolling(&self, plan: &Plan, discovered: &Discovered) -> Vec<Rolling> {
        let mut out = Vec::new();
        for c in &plan.changes {
            let Action::Update(fields) = &c.action else { continue };
            if c.kind != Kind::LaunchTemplate || fields.iter().all(|f| f.field.starts_with("tags[")) {
                continue;
            }
            let instances = discovered.instances.get(&c.name).cloned().unwrap_or_default();
            if !instances.is_empty() {
                let what: Vec<&str> = fields.iter().filter(|f| !f.field.starts_with("tags[")).map(|f| f.field.as_str()).collect();
                out.push(Rolling {
                    group: c.name.clone(),
                    instances,
                    reason: format!("new launch template version ({})", what.join(", ")),
                });
            }
        }
        out
    }

    fn launch_template_data(
        &self,
        model: &ClusterModel,
        resolved: &Resolved,
        ids: &Ids,
        name: &str,
    ) -> Result<ec2_t::RequestLaunchTemplateData, AwsError> {
        let lt = model.launch_templates.iter().find(|l| l.name == name).ok_or_else(|| AwsError::Missing {
            kind: "LaunchTemplate",
            name: name.into(),
            message: "not in the model".into(),
        })?;
        let (image, root_device) = resolved
            .images
            .get(&lt.image)
            .cloned()
            .ok_or_else(|| AwsError::Image { image: lt.image.clone(), message: "not resolved".into() })?;
        let mut sg_ids = Vec::new();
        for sg in lt.security_groups.iter().chain(lt.additional_security_groups.iter()) {
            let id = ids.security_groups.get(sg).cloned().ok_or_else(|| AwsError::Missing {
                kind: "SecurityGroup",
                name: sg.clone(),
                message: format!("needed by launch template {name}"),
            })?;
            sg_ids.push(id);
        }
        let mut ebs = ec2_t::LaunchTemplateEbsBlockDeviceRequest::builder()
            .volume_size(lt.root_volume_size as i32)
            .volume_type(ec2_t::VolumeType::from(lt.root_volume_type.as_str()))
            .encrypted(lt.root_volume_encrypted)
            .delete_on_termination(true);
        if let Some(i) = lt.root_volume_iops {
            ebs = ebs.iops(i as i32);
        }
        if let Some(t) = lt.root_volume_throughput {
            ebs = ebs.throughput(t as i32);
        }
        let instance_tags: Vec<ec2_t::Tag> = ec2_tags(&lt.tags);
        // An explicit associatePublicIp needs the interface spelled out (its groups move onto it).
        let (sg_ids, interfaces) = if lt.associate_public_ip_explicit {
            let nic = ec2_t::LaunchTemplateInstanceNetworkInterfaceSpecificationRequest::builder()
                .device_index(0)
                .associate_public_ip_address(lt.associate_public_ip)
                .delete_on_termination(true)
                .set_groups(Some(sg_ids))
                .build();
            (None, Some(vec![nic]))
        } else {
            (Some(sg_ids), None)
        };
        Ok(ec2_t::RequestLaunchTemplateData::builder()
            .image_id(image)
            .instance_type(ec2_t::InstanceType::from(lt.machine_type.as_str()))
            .metadata_options(
                ec2_t::LaunchTemplateInstanceMetadataOptionsRequest::builder()
                    .http_tokens(ec2_t::LaunchTemplateHttpTokensState::from(lt.http_tokens.as_str()))
                    .http_put_response_hop_limit(lt.hop_limit as i32)
                    .http_endpoint(ec2_t::LaunchTemplateInstanceMetadataEndpointState::Enabled)
                    .build(),
            )
            .block_device_mappings(ec2_t::LaunchTemplateBlockDeviceMappingRequest::builder().device_name(root_device).ebs(ebs.build()).build())
            .set_security_group_ids(sg_ids)
            .set_network_interfaces(interfaces)
            .set_instance_market_options(lt.spot.as_ref().map(|spot| {
                ec2_t::LaunchTemplateInstanceMarketOptionsRequest::builder()
                    .market_type(ec2_t::MarketType::Spot)
                    .spot_options(
                        ec2_t::LaunchTemplateSpotMarketOptionsRequest::builder()
                            .set_max_price(spot.max_price.clone())
                            .instance_interruption_behavior(ec2_t::InstanceInterruptionBehavior::from(spot.interruption_behavior.as_str()))
                            .build(),
                    )
                    .build()
            }))
            .set_credit_specification(
                lt.cpu_credits.as_ref().map(|c| ec2_t::CreditSpecificationRequest::builder().cpu_credits(c).build()),
            )
            .iam_instance_profile(ec2_t::LaunchTemplateIamInstanceProfileSpecificationRequest::builder().name(&lt.instance_profile).build())
            .user_data(base64::engine::general_purpose::STANDARD.encode(&lt.user_data))
            .tag_specifications(
                ec2_t::LaunchTemplateTagSpecificationRequest::builder()
                    .resource_type(ec2_t::ResourceType::Instance)
                    .set_tags(Some(instance_tags.clone()))
                    .build(),
            )
            .tag_specifications(
                ec2_t::LaunchTemplateTagSpecificationRequest::builder()
                    .resource_type(ec2_t::ResourceType::Volume)
                    .set_tags(Some(instance_tags))
                    .build(),
            )
            .build())
    }

    async fn create_tags(&self, id: &str, tags: &BTreeMap<String, String>) -> Result<(), AwsError> {
        self.ec2
            .create_tags()
            .resources(id)
            .set_tags(Some(ec2_tags(tags)))
            .send()
            .await
            .map_err(|e| api("CreateTags", id, e))?;
        Ok(())
    }

    /// Retry a delete while the resource still has dependents (bounded).
    async fn delete_with_retry<F, Fut>(&self, what: &str, mut f: F) -> Result<(), AwsError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<(), AwsError>>,
    {
        let mut last = None;
        for attempt in 0..self.dependency_retries.max(1) {
            match f().await {
                Ok(()) => return Ok(()),
                Err(e) => {
                    let text = e.to_string();
                    if !(text.contains("DependencyViolation") || text.contains("InUse") || text.contains("ResourceInUse")) {
                        return Err(e);
                    }
                    tracing::info!(what, attempt, "waiting for dependents to go away");
                    last = Some(e);
                    tokio::time::sleep(self.dependency_delay).await;
                }
            }
        }
        Err(last.unwrap_or_else(|| AwsError::Missing { kind: "delete", name: what.into(), message: "gave up".into() }))
    }

    /// Execute the cloud changes of a plan in order. Returns the number of changes applied.
    pub async fn execute(
        &self,
        model: &ClusterModel,
        resolved: &Resolved,
        plan: &Plan,
        discovered: &mut Discovered,
        store: &StateStore,
    ) -> Result<usize, AwsError> {
        let mut applied = 0;
        for c in &plan.changes {
            self.execute_one(model, resolved, c, discovered, store).await?;
            applied += 1;
        }
        Ok(applied)
    }

    async fn execute_one(
        &self,
        model: &ClusterModel,
        resolved: &Resolved,
        c: &Change,
        discovered: &mut Discovered,
        store: &StateStore,
    ) -> Result<(), AwsError> {
        let ids = &mut discovered.ids;
        let name = c.name.as_str();
        let desired = c.desired.as_ref();
        let attr = |k: &str| desired.and_then(|d| d.attrs.get(k)).cloned().unwrap_or_default();
        let tags = desired.map(|d| d.tags.clone()).unwrap_or_default();
        let actual_id = c.actual.as_ref().and_then(|a| a.id.clone());
        let only_tags = matches!(&c.action, Action::Update(f) if f.iter().all(|f| f.field.starts_with("tags[")));
        match (c.kind, &c.action) {
            (Kind::IamRole | Kind::IamInstanceProfile, _) => self.execute_iam(model, resolved, c).await?,
            (Kind::TargetGroup | Kind::LoadBalancer, _) => self.execute_load_balancer(model, c, ids).await?,
            (Kind::DnsRecord, _) if c.desired.as_ref().or(c.actual.as_ref()).is_some_and(|r| r.attrs.contains_key("alias"))
                || c.actual.as_ref().and_then(|a| a.id.as_deref()).is_some_and(|id| id.starts_with("alias|"))
                || model.dns.as_ref().is_some_and(|d| d.alias_records.contains(&c.name)) =>
            {
                self.execute_alias(&resolved.zone.clone().unwrap_or_default(), c, ids).await?;
            }
            (Kind::InternetGateway | Kind::ElasticIp | Kind::NatGateway | Kind::RouteTable, _) => {
                self.execute_routing(model, c, ids).await?;
            }
            (Kind::StateFile, Action::Create | Action::Update(_)) => {
                let bytes = model.state.get(name).cloned().unwrap_or_default();
                store.put(name, &bytes).await.map_err(StateError::from)?;
            }
            (Kind::StateFile, Action::Delete) => store.delete(name).await.map_err(StateError::from)?,
            (Kind::Keyset, Action::Create) => {
                super::state::ensure_pki(store, &model.etcd_clusters).await?;
            }
            (Kind::Keyset, _) => {}

            (Kind::Vpc, Action::Create) => {
                let resp = self
                    .ec2
                    .create_vpc()
                    .cidr_block(attr("cidr"))
                    .tag_specifications(tag_spec(ec2_t::ResourceType::Vpc, &tags))
                    .send()
                    .await
                    .map_err(|e| api("CreateVpc", name, e))?;
                let id = resp.vpc().and_then(|v| v.vpc_id()).unwrap_or_default().to_string();
                ids.vpc = Some(id.clone());
                self.enable_dns_hostnames(&id, name).await?;
            }
            (Kind::Subnet, Action::Create) => {
                let vpc = ids.vpc.clone().ok_or_else(|| AwsError::Missing {
                    kind: "VPC",
                    name: model.network.name.clone(),
                    message: format!("needed by subnet {name}"),
                })?;
                let resp = self
                    .ec2
                    .create_subnet()
                    .vpc_id(vpc)
                    .cidr_block(attr("cidr"))
                    .availability_zone(attr("zone"))
                    .tag_specifications(tag_spec(ec2_t::ResourceType::Subnet, &tags))
                    .send()
                    .await
                    .map_err(|e| api("CreateSubnet", name, e))?;
                let id = resp.subnet().and_then(|s| s.subnet_id()).unwrap_or_default().to_string();
                if attr("map_public_ip") == "true" {
                    self.ec2
                        .modify_subnet_attribute()
                        .subnet_id(&id)
                        .map_public_ip_on_launch(ec2_t::AttributeBooleanValue::builder().value(true).build())
                        .send()
                        .await
                        .map_err(|e| api("ModifySubnetAttribute", name, e))?;
                }
                ids.subnets.insert(name.to_string(), id);
            }
            (Kind::Subnet, Action::Update(fields)) => {
                let id = actual_id.unwrap_or_default();
                for f in fields {
                    if f.field == "map_public_ip" {
                        self.ec2
                            .modify_subnet_attribute()
                            .subnet_id(&id)
                            .map_public_ip_on_launch(ec2_t::AttributeBooleanValue::builder().value(attr("map_public_ip") == "true").build())
                            .send()
                            .await
                            .map_err(|e| api("ModifySubnetAttribute", name, e))?;
                    }
                }
                if fields.iter().any(|f| f.field.starts_with("tags[")) {
                    self.create_tags(&id, &tags).await?;
                }
            }
            (Kind::SecurityGroup, Action::Create) => {
                let vpc = ids.vpc.clone().ok_or_else(|| AwsError::Missing {
                    kind: "VPC",
                    name: model.network.name.clone(),
                    message: format!("needed by security group {name}"),
                })?;
                let sg = model.security_groups.iter().find(|s| s.name == name);
                let resp = self
                    .ec2
                    .create_security_group()
                    .group_name(name)
                    .description(sg.map(|s| s.description.clone()).unwrap_or_else(|| name.to_string()))
                    .vpc_id(vpc)
                    .tag_specifications(tag_spec(ec2_t::ResourceType::SecurityGroup, &tags))
                    .send()
                    .await
                    .map_err(|e| api("CreateSecurityGroup", name, e))?;
                ids.security_groups.insert(name.to_string(), resp.group_id().unwrap_or_default().to_string());
            }
            (Kind::SecurityGroupRule, Action::Create) => {
                let r = desired.ok_or_else(|| AwsError::Missing { kind: "SecurityGroupRule", name: name.into(), message: "no desired state".into() })?;
                let group = r.attrs.get("group").cloned().unwrap_or_default();
                let id = ids.security_groups.get(&group).cloned().ok_or_else(|| AwsError::Missing {
                    kind: "SecurityGroup",
                    name: group.clone(),
                    message: format!("needed by rule {name}"),
                })?;
                self.ec2
                    .authorize_security_group_ingress()
                    .group_id(id)
                    .ip_permissions(ip_permission(r, ids)?)
                    .send()
                    .await
                    .map_err(|e| api("AuthorizeSecurityGroupIngress", name, e))?;
            }
            (Kind::SecurityGroupRule, Action::Delete) => {
                let r = c.actual.as_ref().ok_or_else(|| AwsError::Missing { kind: "SecurityGroupRule", name: name.into(), message: "no actual state".into() })?;
                let group = r.attrs.get("group").cloned().unwrap_or_default();
                if let Some(id) = ids.security_groups.get(&group).cloned() {
                    self.ec2
                        .revoke_security_group_ingress()
                        .group_id(id)
                        .ip_permissions(ip_permission(r, ids)?)
                        .send()
                        .await
                        .map_err(|e| api("RevokeSecurityGroupIngress", name, e))?;
                }
            }
            (Kind::SecurityGroupRule, Action::Update(_)) => {}
            (Kind::LaunchTemplate, Action::Create) => {
                let data = self.launch_template_data(model, resolved, ids, name)?;
                let resp = self
                    .ec2
                    .create_launch_template()
                    .launch_template_name(name)
                    .launch_template_data(data)
                    .tag_specifications(tag_spec(ec2_t::ResourceType::LaunchTemplate, &tags))
                    .send()
                    .await
                    .map_err(|e| api("CreateLaunchTemplate", name, e))?;
                let id = resp.launch_template().and_then(|l| l.launch_template_id()).unwrap_or_default().to_string();
                ids.launch_templates.insert(name.to_string(), id);
                ids.lt_versions.insert(name.to_string(), resp.launch_template().and_then(|l| l.latest_version_number()).unwrap_or(1));
            }
            (Kind::LaunchTemplate, Action::Update(_)) => {
                let id = actual_id.unwrap_or_default();
                if !only_tags {
                    let data = self.launch_template_data(model, resolved, ids, name)?;
                    let resp = self
                        .ec2
                        .create_launch_template_version()
                        .launch_template_id(&id)
                        .launch_template_data(data)
                        .send()
                        .await
                        .map_err(|e| api("CreateLaunchTemplateVersion", name, e))?;
                    let version = resp.launch_template_version().and_then(|v| v.version_number()).unwrap_or_default();
                    ids.lt_versions.insert(name.to_string(), version);
                    self.ec2
                        .modify_launch_template()
                        .launch_template_id(&id)
                        .default_version(version.to_string())
                        .send()
                        .await
                        .map_err(|e| api("ModifyLaunchTemplate", name, e))?;
                }
                if let Action::Update(f) = &c.action {
                    if f.iter().any(|f| f.field.starts_with("tags[")) {
                        self.create_tags(&id, &tags).await?;
                    }
                }
            }
            (Kind::AutoscalingGroup, Action::Create) => {
                let subnets = self.subnet_ids(ids, &attr("subnets"), name)?;
                let launch = self.launch_spec(model, ids, name, &attr("launch_template"), &attr("launch_template_version"));
                self.asg
                    .create_auto_scaling_group()
                    .auto_scaling_group_name(name)
                    .min_size(attr("min_size").parse().unwrap_or(0))
                    .max_size(attr("max_size").parse().unwrap_or(0))
                    .set_launch_template(launch.0)
                    .set_mixed_instances_policy(launch.1)
                    .vpc_zone_identifier(subnets)
                    .set_target_group_arns(Some(self.target_group_arns(ids, &attr("target_groups"), name)?))
                    .set_tags(Some(asg_tags(name, &tags)))
                    .send()
                    .await
                    .map_err(|e| api("CreateAutoScalingGroup", name, e))?;
            }
            (Kind::AutoscalingGroup, Action::Update(fields)) => {
                if fields.iter().any(|f| f.field == "target_groups") {
                    let want = self.target_group_arns(ids, &attr("target_groups"), name)?;
                    let have = self.target_group_arns(
                        ids,
                        &c.actual.as_ref().and_then(|a| a.attrs.get("target_groups")).cloned().unwrap_or_default(),
                        name,
                    )?;
                    let attach: Vec<String> = want.iter().filter(|a| !have.contains(a)).cloned().collect();
                    let detach: Vec<String> = have.iter().filter(|a| !want.contains(a)).cloned().collect();
                    if !attach.is_empty() {
                        self.asg
                            .attach_load_balancer_target_groups()
                            .auto_scaling_group_name(name)
                            .set_target_group_arns(Some(attach))
                            .send()
                            .await
                            .map_err(|e| api("AttachLoadBalancerTargetGroups", name, e))?;
                    }
                    if !detach.is_empty() {
                        self.asg
                            .detach_load_balancer_target_groups()
                            .auto_scaling_group_name(name)
                            .set_target_group_arns(Some(detach))
                            .send()
                            .await
                            .map_err(|e| api("DetachLoadBalancerTargetGroups", name, e))?;
                    }
                }
                let only_tags = fields.iter().all(|f| f.field.starts_with("tags[") || f.field == "target_groups");
                if !only_tags {
                    let subnets = self.subnet_ids(ids, &attr("subnets"), name)?;
                    let launch = self.launch_spec(model, ids, name, &attr("launch_template"), &attr("launch_template_version"));
                    self.asg
                        .update_auto_scaling_group()
                        .auto_scaling_group_name(name)
                        .min_size(attr("min_size").parse().unwrap_or(0))
                        .max_size(attr("max_size").parse().unwrap_or(0))
                        .set_launch_template(launch.0)
                        .set_mixed_instances_policy(launch.1)
                        .vpc_zone_identifier(subnets)
                        .send()
                        .await
                        .map_err(|e| api("UpdateAutoScalingGroup", name, e))?;
                }
                if fields.iter().any(|f| f.field.starts_with("tags[")) {
                    self.asg
                        .create_or_update_tags()
                        .set_tags(Some(asg_tags(name, &tags)))
                        .send()
                        .await
                        .map_err(|e| api("CreateOrUpdateTags", name, e))?;
                }
            }
            (Kind::Volume, Action::Create) => {
                let v = model.volumes.iter().find(|v| v.name == name).ok_or_else(|| AwsError::Missing {
                    kind: "Volume",
                    name: name.into(),
                    message: "not in the model".into(),
                })?;
                let resp = self
                    .ec2
                    .create_volume()
                    .availability_zone(&v.zone)
                    .size(v.size_gib as i32)
                    .volume_type(ec2_t::VolumeType::from(v.volume_type.as_str()))
                    .set_iops(v.iops.map(|i| i as i32))
                    .set_throughput(v.throughput.map(|i| i as i32))
                    .encrypted(v.encrypted)
                    .set_kms_key_id(v.kms_key_id.clone())
                    .tag_specifications(tag_spec(ec2_t::ResourceType::Volume, &tags))
                    .send()
                    .await
                    .map_err(|e| api("CreateVolume", name, e))?;
                ids.volumes.insert(name.to_string(), resp.volume_id().unwrap_or_default().to_string());
            }
            (Kind::Volume, Action::Update(fields)) => {
                let id = actual_id.unwrap_or_default();
                if fields.iter().any(|f| !f.field.starts_with("tags[")) {
                    self.ec2
                        .modify_volume()
                        .volume_id(&id)
                        .size(attr("size").parse().unwrap_or(0))
                        .volume_type(ec2_t::VolumeType::from(attr("type").as_str()))
                        .set_iops(attr("iops").parse().ok())
                        .set_throughput(attr("throughput").parse().ok())
                        .send()
                        .await
                        .map_err(|e| api("ModifyVolume", name, e))?;
                }
                if fields.iter().any(|f| f.field.starts_with("tags[")) {
                    self.create_tags(&id, &tags).await?;
                }
            }
            (Kind::Vpc, Action::Update(fields)) => {
                let id = actual_id.unwrap_or_default();
                if fields.iter().any(|f| f.field == "dns_hostnames") {
                    self.enable_dns_hostnames(&id, name).await?;
                }
                if fields.iter().any(|f| f.field.starts_with("tags[")) {
                    self.create_tags(&id, &tags).await?;
                }
            }
            (Kind::SecurityGroup, Action::Update(_)) => {
                // Only tags can drift here.
                self.create_tags(&actual_id.unwrap_or_default(), &tags).await?;
            }
            (Kind::DnsRecord, Action::Create) => {
                let zone = resolved.zone.clone().unwrap_or_default();
                let rec = Record { name: name.to_string(), rtype: "A".into(), ttl: DNS_TTL, values: vec![PLACEHOLDER_IP.into()] };
                self.dns.apply_changes(&zone, &[RecordChange::Upsert(rec)]).await?;
            }
            (Kind::DnsRecord, Action::Update(_)) => {}
            (Kind::DnsRecord, Action::Delete) => {
                let zone = resolved.zone.clone().unwrap_or_default();
                let id = actual_id.unwrap_or_default();
                let mut parts = id.splitn(3, '|');
                let ttl = parts.next().and_then(|t| t.parse().ok()).unwrap_or(DNS_TTL);
                let rtype = parts.next().unwrap_or("A").to_string();
                let values = parts.next().unwrap_or_default().split(',').map(str::to_string).collect();
                let rec = Record { name: name.to_string(), rtype, ttl, values };
                self.dns.apply_changes(&zone, &[RecordChange::Delete(rec)]).await?;
            }
            (Kind::AutoscalingGroup, Action::Delete) => {
                self.asg
                    .delete_auto_scaling_group()
                    .auto_scaling_group_name(name)
                    .force_delete(true)
                    .send()
                    .await
                    .map_err(|e| api("DeleteAutoScalingGroup", name, e))?;
                self.wait_asg_gone(name).await?;
            }
            (Kind::LaunchTemplate, Action::Delete) => {
                self.ec2
                    .delete_launch_template()
                    .launch_template_id(actual_id.unwrap_or_default())
                    .send()
                    .await
                    .map_err(|e| api("DeleteLaunchTemplate", name, e))?;
            }
            (Kind::Volume, Action::Delete) => {
                let id = actual_id.unwrap_or_default();
                self.delete_with_retry(name, || async {
                    self.ec2.delete_volume().volume_id(&id).send().await.map(|_| ()).map_err(|e| api("DeleteVolume", name, e))
                })
                .await?;
            }
            (Kind::SecurityGroup, Action::Delete) => {
                let id = actual_id.unwrap_or_default();
                self.delete_with_retry(name, || async {
                    self.ec2
                        .delete_security_group()
                        .group_id(&id)
                        .send()
                        .await
                        .map(|_| ())
                        .map_err(|e| api("DeleteSecurityGroup", name, e))
                })
                .await?;
            }
            (Kind::Subnet, Action::Delete) => {
                let id = actual_id.unwrap_or_default();
                self.delete_with_retry(name, || async {
                    self.ec2.delete_subnet().subnet_id(&id).send().await.map(|_| ()).map_err(|e| api("DeleteSubnet", name, e))
                })
                .await?;
            }
            (Kind::Vpc, Action::Delete) => {
                let id = actual_id.unwrap_or_default();
                self.delete_with_retry(name, || async {
                    self.ec2.delete_vpc().vpc_id(&id).send().await.map(|_| ()).map_err(|e| api("DeleteVpc", name, e))
                })
                .await?;
            }
        }
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

    /// How a group launches: its launch template, or a mixed-instances policy around it.
    fn launch_spec(
        &self,
        model: &ClusterModel,
        ids: &Ids,
        group: &str,
        lt: &str,
        planned_version: &str,
    ) -> (Option<asg_t::LaunchTemplateSpecification>, Option<asg_t::MixedInstancesPolicy>) {
        let spec = asg_t::LaunchTemplateSpecification::builder()
            .launch_template_name(lt)
            .version(self.lt_version(ids, lt, planned_version))
            .build();
        match model.groups.iter().find(|g| g.name == group).and_then(|g| g.mixed.as_ref()) {
            None => (Some(spec), None),
            Some(m) => {
                let overrides: Vec<asg_t::LaunchTemplateOverrides> =
                    m.instance_types.iter().map(|t| asg_t::LaunchTemplateOverrides::builder().instance_type(t).build()).collect();
                let policy = asg_t::MixedInstancesPolicy::builder()
                    .launch_template(asg_t::LaunchTemplate::builder().launch_template_specification(spec).set_overrides(Some(overrides)).build())
                    .instances_distribution(
                        asg_t::InstancesDistribution::builder()
                            .on_demand_allocation_strategy(&m.on_demand_allocation_strategy)
                            .on_demand_base_capacity(m.on_demand_base as i32)
                            .on_demand_percentage_above_base_capacity(m.on_demand_above_base as i32)
                            .spot_allocation_strategy(&m.spot_allocation_strategy)
                            .set_spot_instance_pools(m.spot_instance_pools.map(|p| p as i32))
                            .set_spot_max_price(m.spot_max_price.clone())
                            .build(),
                    )
                    .build();
                (None, Some(policy))
            }
        }
    }

    /// The launch-template version an autoscaling group pins: the one this run created or found,
    /// else the planned one.
    fn lt_version(&self, ids: &Ids, lt: &str, planned: &str) -> String {
        ids.lt_versions.get(lt).map(|v| v.to_string()).unwrap_or_else(|| planned.to_string())
    }

    /// Target-group ARNs for names (an ARN given directly is kept).
    fn target_group_arns(&self, ids: &Ids, names: &str, asg: &str) -> Result<Vec<String>, AwsError> {
        ids_for(&ids.target_groups, names, "TargetGroup", &format!("autoscaling group {asg}"))
    }

    fn subnet_ids(&self, ids: &Ids, names: &str, asg: &str) -> Result<String, AwsError> {
        Ok(ids_for(&ids.subnets, names, "Subnet", &format!("autoscaling group {asg}"))?.join(","))
    }

    /// After a force delete, wait (bounded) until the group is gone so dependents can be deleted.
    async fn wait_asg_gone(&self, name: &str) -> Result<(), AwsError> {
        for _ in 0..self.dependency_retries.max(1) {
            let resp = self
                .asg
                .describe_auto_scaling_groups()
                .auto_scaling_group_names(name)
                .send()
                .await
                .map_err(|e| api("DescribeAutoScalingGroups", name, e))?;
            if resp.auto_scaling_groups().is_empty() {
                return Ok(());
            }
            tokio::time::sleep(self.dependency_delay).await;
        }
        Err(AwsError::Missing { kind: "AutoscalingGroup", name: name.into(), message: "still deleting; rerun delete later".into() })
    }
}

fn asg_tags(name: &str, tags: &BTreeMap<String, String>) -> Vec<asg_t::Tag> {
    tags.iter()
        .map(|(k, v)| {
            asg_t::Tag::builder()
                .resource_id(name)
                .resource_type("auto-scaling-group")
                .key(k)
                .value(v)
                .propagate_at_launch(true)
                .build()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_not_writes() {
        assert!(!is_write("DescribeVolumes"));
        assert!(!is_write("ListResourceRecordSets"));
        assert!(!is_write("GetObject"));
        assert!(is_write("CreateVolume"));
        assert!(is_write("PutObject"));
        assert!(is_write("ChangeResourceRecordSets"));
    }
}
