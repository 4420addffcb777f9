//! The AWS tasks and their two targets. The direct target resolves (images, DNS zone), discovers
//! what exists by the cluster tag, views the model's tasks as comparable resources, and executes a
//! plan through aws-sdk-ec2, aws-sdk-autoscaling and aws-sdk-route53 ([`AwsTask::render_aws`]);
//! [`terraform`] renders the same tasks as Terraform ([`AwsTask::render_terraform`]). Every create call tags the resource in the same call,
//! so a run that fails half-way leaves only discoverable resources and the rerun adopts them.

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_ec2::types as ec2_t;
use aws_smithy_runtime_api::client::interceptors::SharedInterceptor;
use aws_smithy_types::error::display::DisplayErrorContext;
use cloud::calls::CallCounter;
use cloud::dns::{Dns as _, Route53Dns};
use cloud::AwsOptions;

use super::model::ClusterModel;
use super::plan::{Action, Kind, Plan, Resource, Rolling};
use super::state::StateError;
use crate::tasks::{Link, Linked};
use base::StateStore;

mod autoscaling;
mod dns_record;
mod iam;
mod launch_template;
mod load_balancer;
mod network;
mod oidc_provider;
mod routing;
mod security_group;
pub mod task;
pub mod terraform;
mod volume;

pub use autoscaling::{AutoscalingGroup, Mixed};
pub use dns_record::{DnsRecord, RecordTarget};
pub use iam::{IamRole, InlinePolicy, InstanceProfile, Policy, ServiceAccountTrust};
pub use launch_template::{Image, LaunchTemplate, RootVolume, Spot};
pub use load_balancer::{Listener, LoadBalancer, TargetGroup, DEREGISTRATION_DELAY, HEALTH_CHECK};
pub use network::{Subnet, Vpc};
pub use oidc_provider::{OidcProvider, DEFAULT_AUDIENCE, S3_ROOT_THUMBPRINTS};
pub use routing::{ElasticIp, InternetGateway, NatGateway, RouteTable, RouteTarget};
pub use security_group::{protocol_has_ports, IngressRule, RuleSource, SecurityGroup, SecurityGroupRule, EGRESS_ALL};
pub use task::{AwsTask, Task, Tasks};
pub use volume::Volume;

#[derive(Debug, thiserror::Error)]
pub enum AwsError {
    #[error("{op} {target}: {message}")]
    Api {
        op: &'static str,
        target: String,
        message: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("image {image:?}: {message}")]
    Image { image: String, message: String },
    #[error("DNS: {0}")]
    Dns(#[from] cloud::DnsError),
    #[error("state store: {0}")]
    Store(#[from] StateError),
    #[error("{kind} {name}: {message}")]
    Missing { kind: &'static str, name: String, message: String },
}

pub fn api<E: std::error::Error + Send + Sync + 'static>(op: &'static str, target: &str, e: E) -> AwsError {
    AwsError::Api { op, target: target.to_string(), message: DisplayErrorContext(&e).to_string(), source: Box::new(e) }
}

/// Operation names that change something (the rest only read).
pub fn is_write(operation: &str) -> bool {
    !["Describe", "List", "Get", "Head"].iter().any(|p| operation.starts_with(p))
}

/// Write calls made so far, per `service/operation`.
pub fn write_calls(counter: &CallCounter) -> BTreeMap<String, u64> {
    counter.snapshot().into_iter().filter(|(k, _)| is_write(k.rsplit('/').next().unwrap_or(""))).map(|(k, c)| (k, c.calls)).collect()
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
    pub sts: aws_sdk_sts::Client,
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
        let mut sts = aws_sdk_sts::config::Builder::from(&conf);
        let mut s3 = base::aws::s3_config(&conf, opts.endpoint_url.is_some());
        for i in &all {
            ec2.push_interceptor(i.clone());
            asg.push_interceptor(i.clone());
            r53.push_interceptor(i.clone());
            s3.push_interceptor(i.clone());
            iam.push_interceptor(i.clone());
            elb.push_interceptor(i.clone());
            sts.push_interceptor(i.clone());
        }
        AwsTarget {
            ec2: aws_sdk_ec2::Client::from_conf(ec2.build()),
            asg: aws_sdk_autoscaling::Client::from_conf(asg.build()),
            dns: Route53Dns::new(aws_sdk_route53::Client::from_conf(r53.build())),
            s3: aws_sdk_s3::Client::from_conf(s3.build()),
            iam: aws_sdk_iam::Client::from_conf(iam.build()),
            elb: aws_sdk_elasticloadbalancingv2::Client::from_conf(elb.build()),
            sts: aws_sdk_sts::Client::from_conf(sts.build()),
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
    /// The account apply runs in (STS GetCallerIdentity), when a service account's role needs it
    /// for its trust policy's provider ARN.
    pub account: Option<String>,
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

/// A name that is already an AWS id or ARN (`sg-…`, `subnet-…`, `arn:…`): used as it is.
fn is_aws_id(n: &str) -> bool {
    let aws_id = |p: &str| n.strip_prefix(p).is_some_and(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_hexdigit()));
    aws_id("sg-") || aws_id("subnet-") || n.starts_with("arn:")
}

/// A task type the direct target resolves links to: where its cloud ids are kept.
pub trait AwsLinked: Linked {
    const KIND: Kind;
    fn lookup(ids: &Ids, name: &str) -> Option<String>;
}

impl<T: AwsLinked> Link<T> {
    /// The cloud id: the spec's, or the one the task was found or created with (a name that is
    /// already an id or ARN is kept); else an error naming the target and `user`.
    pub fn resolve(&self, ids: &Ids, user: &str) -> Result<String, AwsError> {
        if let Some(id) = self.id() {
            return Ok(id.to_string());
        }
        if is_aws_id(self.name()) {
            return Ok(self.name().to_string());
        }
        T::lookup(ids, self.name()).ok_or_else(|| AwsError::Missing {
            kind: T::KIND.as_str(),
            name: self.name().to_string(),
            message: format!("needed by {user}"),
        })
    }
}

/// The cloud ids of some links, in the order of their names (empty names skipped).
pub(crate) fn resolve_all<T: AwsLinked>(links: &[Link<T>], ids: &Ids, user: &str) -> Result<Vec<String>, AwsError> {
    let mut sorted: Vec<&Link<T>> = links.iter().filter(|l| !l.is_empty()).collect();
    sorted.sort();
    sorted.dedup();
    sorted.into_iter().map(|l| l.resolve(ids, user)).collect()
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

impl Discovered {
    /// A task found with its cloud id.
    fn found(&mut self, task: impl Into<Task>, id: String) {
        self.resources.push(task.into().view(Some(id)));
    }
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

/// A model number as the `i32` the API takes, or an error naming the resource and field.
pub(crate) fn i32_of(v: i64, kind: &'static str, name: &str, what: &str) -> Result<i32, AwsError> {
    i32::try_from(v).map_err(|_| AwsError::Missing { kind, name: name.into(), message: format!("{what} {v} is out of range") })
}

/// The value a required field of an API response has, or an error naming the resource.
pub(crate) fn required<'a>(v: Option<&'a str>, kind: &'static str, name: &str, what: &str) -> Result<&'a str, AwsError> {
    v.ok_or_else(|| AwsError::Missing { kind, name: name.to_string(), message: format!("the API returned no {what}") })
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
    for r in desired.iter_mut() {
        if let Some(Task::AutoscalingGroup(g)) = r.task.as_deref() {
            if let Some(v) = next.get(g.launch_template.name()) {
                let mut g = g.clone();
                g.launch_template_version = Some(*v);
                *r = Task::AutoscalingGroup(g).view(r.id.clone());
            }
        }
    }
}

/// The model's tasks in their plan views on the direct target. Needs resolved image ids.
pub fn desired(model: &ClusterModel, resolved: &Resolved) -> Vec<Resource> {
    task::desired(&model.tasks, resolved)
}

impl AwsTarget {
    /// Read-only lookups: AMI ids for the images, and the hosted zone.
    pub async fn resolve(&self, model: &ClusterModel) -> Result<Resolved, AwsError> {
        let mut r = Resolved::default();
        let mut images: Vec<&String> = model.tasks.launch_templates.iter().map(|l| &l.image.spec).collect();
        images.sort();
        images.dedup();
        for image in images {
            let req = self.ec2.describe_images();
            let req = if image.starts_with("ami-") {
                req.image_ids(image)
            } else {
                let (owner, name) = image
                    .split_once('/')
                    .ok_or_else(|| AwsError::Image { image: image.clone(), message: "expected an AMI id (ami-…) or OWNER/NAME".into() })?;
                req.owners(owner).filters(ec2_t::Filter::builder().name("name").values(name).build())
            };
            let resp = req.send().await.map_err(|e| api("DescribeImages", image, e))?;
            let best = resp
                .images()
                .iter()
                .max_by(|a, b| a.creation_date().unwrap_or("").cmp(b.creation_date().unwrap_or("")))
                .ok_or_else(|| AwsError::Image { image: image.clone(), message: "no such image in this region".into() })?;
            r.images.insert(image.clone(), (best.image_id().unwrap_or_default().to_string(), best.root_device_name().unwrap_or("/dev/sda1").to_string()));
        }
        self.resolve_zone(model, &mut r).await?;
        if model.tasks.iam_roles.iter().any(|role| matches!(role.assume_role, Policy::ServiceAccount { .. })) {
            let me = self.sts.get_caller_identity().send().await.map_err(|e| api("GetCallerIdentity", &model.cluster, e))?;
            r.account = Some(required(me.account(), "Account", &model.cluster, "account")?.to_string());
        }
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
                Err(cloud::DnsError::NoZone(z)) if dns.zone.is_none() => {
                    r.notes.push(format!("no Route53 hosted zone found for {z}; DNS records are not managed (set spec.dnsZone)"))
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Everything tagged for the cluster, as typed tasks in their plan views (reads only).
    pub async fn discover(&self, model: &ClusterModel, resolved: &Resolved) -> Result<Discovered, AwsError> {
        let mut d = Discovered::default();
        for find in task::finders() {
            find(self, model, resolved, &mut d).await?;
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
                out.push(Rolling { group: c.name.clone(), instances, reason: format!("new launch template version ({})", what.join(", ")) });
            }
        }
        out
    }

    async fn create_tags(&self, id: &str, tags: &BTreeMap<String, String>) -> Result<(), AwsError> {
        self.ec2.create_tags().resources(id).set_tags(Some(ec2_tags(tags))).send().await.map_err(|e| api("CreateTags", id, e))?;
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
        c: &super::plan::Change,
        discovered: &mut Discovered,
        store: &StateStore,
    ) -> Result<(), AwsError> {
        let name = c.name.as_str();
        match (c.kind, &c.action) {
            (Kind::StateFile, Action::Create | Action::Update(_)) => {
                let bytes = model.state.get(name).ok_or_else(|| AwsError::Missing {
                    kind: "StateFile",
                    name: name.into(),
                    message: "not in the compiled state".into(),
                })?;
                store.put(name, bytes).await.map_err(StateError::from)?;
            }
            (Kind::StateFile, Action::Delete) => store.delete(name).await.map_err(StateError::from)?,
            (Kind::Keyset, Action::Create) => {
                super::state::ensure_pki(store, &model.etcd_clusters, model.encryption_config).await?;
            }
            (Kind::Keyset, _) => {}
            // A cloud resource: its task renders the change (the desired side's type, else the actual's).
            _ => {
                let task = [&c.desired, &c.actual].into_iter().flatten().find_map(|r| r.task.as_deref()).ok_or_else(|| AwsError::Missing {
                    kind: c.kind.as_str(),
                    name: name.into(),
                    message: "the plan holds no typed state for it".into(),
                })?;
                let cx = task::Exec { target: self, model, resolved, ids: &mut discovered.ids };
                task.task().render_aws(cx, c).await?;
            }
        }
        Ok(())
    }
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
