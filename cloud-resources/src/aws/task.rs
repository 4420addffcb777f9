//! The typed tasks of the AWS target: one type per resource kind, used for the desired state (built
//! by the model's builders) and the actual state (read from the SDK). Each type renders itself to
//! the direct target ([`AwsTask::render_aws`]) and to Terraform ([`AwsTask::render_terraform`]); the
//! plan compares their [`Task::view`]s field by field. [`crate::tasks!`] below is the one list of
//! the types: it generates [`Task`], [`Tasks`] and every dispatch.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use crate::model::ClusterModel;
use crate::plan::{Action, Change, Kind, Resource};
use crate::tasks::{Fields, Member};

use super::autoscaling::AutoscalingGroup;
use super::dns_record::DnsRecord;
use super::iam::{IamRole, InstanceProfile};
use super::launch_template::LaunchTemplate;
use super::load_balancer::{LoadBalancer, TargetGroup};
use super::network::{Subnet, Vpc};
use super::oidc_provider::OidcProvider;
use super::routing::{ElasticIp, InternetGateway, NatGateway, RouteTable};
use super::security_group::{SecurityGroup, SecurityGroupRule};
use super::terraform::AwsTerraform;
use super::volume::Volume;
use super::{AwsError, AwsTarget, Discovered, Ids, Resolved};

crate::tasks! {
    /// A typed resource of the AWS target.
    pub enum Task, pub struct Tasks, dyn AwsTask, visit TaskTypes {
        oidc_providers: OidcProvider(OidcProvider),
        iam_roles: IamRole(IamRole),
        instance_profiles: InstanceProfile(InstanceProfile),
        vpcs: Vpc(Vpc),
        subnets: Subnet(Subnet),
        internet_gateways: InternetGateway(InternetGateway),
        elastic_ips: ElasticIp(ElasticIp),
        nat_gateways: NatGateway(NatGateway),
        route_tables: RouteTable(RouteTable),
        security_groups: SecurityGroup(SecurityGroup),
        security_group_rules: SecurityGroupRule(SecurityGroupRule),
        target_groups: TargetGroup(TargetGroup),
        load_balancers: LoadBalancer(LoadBalancer),
        launch_templates: LaunchTemplate(LaunchTemplate),
        groups: AutoscalingGroup(AutoscalingGroup),
        volumes: Volume(Volume),
        dns_records: DnsRecord(DnsRecord),
    }
}

/// What a task's direct rendering returns.
pub type AwsFuture<'a> = Pin<Box<dyn Future<Output = Result<(), AwsError>> + Send + 'a>>;

/// What a task renders with on the direct target.
pub struct Exec<'a> {
    pub target: &'a AwsTarget,
    pub model: &'a ClusterModel,
    pub resolved: &'a Resolved,
    /// Cloud ids known so far; a create adds the new id.
    pub ids: &'a mut Ids,
}

/// One task type of the AWS target (kOps' `fi.Task` with `RenderAWS` and `RenderTerraform`).
pub trait AwsTask: std::fmt::Debug + Send + Sync {
    fn kind(&self) -> Kind;
    /// The plan's name (the `Name` tag, or the cloud's name).
    fn name(&self) -> String;
    fn tags(&self) -> BTreeMap<String, String> {
        BTreeMap::new()
    }
    /// The comparable attributes.
    fn fields(&self, f: &mut Fields);
    /// Fill in what the direct target resolved (image ids, the hosted zone); `false` when the task
    /// has nothing to do on this target (DNS records without a hosted zone).
    fn resolve(&mut self, _resolved: &Resolved) -> bool {
        true
    }
    /// Terraform blocks for the task.
    fn render_terraform(&self, t: &mut AwsTerraform);
    /// Create, update or delete the resource for one change of the plan (the change's typed sides
    /// are this type: read them with [`Typed::of`]).
    fn render_aws<'a>(&'a self, cx: Exec<'a>, c: &'a Change) -> AwsFuture<'a>;
    /// Find what exists of this type (tagged for the cluster, or named by the model), with the ids
    /// of the types before it in the task list (reads only).
    fn find<'a>(t: &'a AwsTarget, model: &'a ClusterModel, resolved: &'a Resolved, d: &'a mut Discovered) -> AwsFuture<'a>
    where
        Self: Sized;
}

/// A task type's [`AwsTask::find`].
pub type FindFn = for<'a> fn(&'a AwsTarget, &'a ClusterModel, &'a Resolved, &'a mut Discovered) -> AwsFuture<'a>;

/// Something done once per task type ([`Tasks::each_type`]).
pub trait TaskTypes {
    fn visit<T: AwsTask + 'static>(&mut self);
}

/// Every type's [`AwsTask::find`], in the order of the task list (later types read the ids
/// earlier ones found).
pub fn finders() -> Vec<FindFn> {
    struct Finders(Vec<FindFn>);
    impl TaskTypes for Finders {
        fn visit<T: AwsTask + 'static>(&mut self) {
            self.0.push(T::find);
        }
    }
    let mut f = Finders(Vec::new());
    Tasks::each_type(&mut f);
    f.0
}

/// A type found with another (its [`AwsTask::find`] does nothing).
pub fn found_with_another<'a>() -> AwsFuture<'a> {
    Box::pin(async { Ok(()) })
}

impl Task {
    pub fn kind(&self) -> Kind {
        self.task().kind()
    }

    /// The plan's view of this task; `id` is the cloud id of an actual resource.
    pub fn view(self, id: Option<String>) -> Resource {
        let t = self.task();
        let mut f = Fields::default();
        t.fields(&mut f);
        Resource { kind: Some(t.kind()), name: t.name(), attrs: f.0, tags: t.tags(), id, task: Some(Box::new(self)), gce: None }
    }
}

/// One change with its sides as the task type `T`.
pub struct Typed<'a, T> {
    pub name: &'a str,
    pub kind: Kind,
    pub action: &'a Action,
    desired: Option<&'a Resource>,
    actual: Option<&'a Resource>,
    _t: std::marker::PhantomData<T>,
}

impl<'a, T: Member<Task>> Typed<'a, T> {
    pub fn of(c: &'a Change) -> Typed<'a, T> {
        Typed { name: &c.name, kind: c.kind, action: &c.action, desired: c.desired.as_ref(), actual: c.actual.as_ref(), _t: std::marker::PhantomData }
    }
    fn side(&self, r: Option<&'a Resource>, side: &str) -> Result<&'a T, AwsError> {
        r.and_then(|r| r.task.as_deref()).and_then(T::of).ok_or_else(|| AwsError::Missing {
            kind: self.kind.as_str(),
            name: self.name.to_string(),
            message: format!("the plan holds no typed {side} state for it"),
        })
    }
    /// The desired state, or an error naming the resource.
    pub fn want(&self) -> Result<&'a T, AwsError> {
        self.side(self.desired, "desired")
    }
    /// The actual state, or an error naming the resource.
    pub fn have(&self) -> Result<&'a T, AwsError> {
        self.side(self.actual, "actual")
    }
    /// The actual state when the resource exists.
    pub fn have_opt(&self) -> Result<Option<&'a T>, AwsError> {
        self.actual.map(|_| self.have()).transpose()
    }
    /// The cloud id of the actual side.
    pub fn id(&self) -> Result<String, AwsError> {
        actual_id(self.actual, self.kind, self.name)
    }
    /// The fields an update changes (none for create and delete).
    pub fn changed(&self, field: &str) -> bool {
        matches!(self.action, Action::Update(f) if f.iter().any(|f| f.field == field))
    }
    /// An update changes tags.
    pub fn tags_changed(&self) -> bool {
        matches!(self.action, Action::Update(f) if f.iter().any(|f| f.field.starts_with("tags[")))
    }
    /// An update changes anything but tags.
    pub fn attributes_changed(&self) -> bool {
        matches!(self.action, Action::Update(f) if f.iter().any(|f| !f.field.starts_with("tags[")))
    }
}

/// The cloud id of the actual side of a change.
pub fn actual_id(r: Option<&Resource>, kind: Kind, name: &str) -> Result<String, AwsError> {
    r.and_then(|r| r.id.clone()).ok_or_else(|| AwsError::Missing {
        kind: kind.as_str(),
        name: name.to_string(),
        message: "no cloud id was discovered for it".into(),
    })
}

/// The desired views of the model's tasks on the direct target (resolved; tasks with nothing to do
/// here left out).
pub fn desired(tasks: &Tasks, resolved: &Resolved) -> Vec<Resource> {
    tasks.to_vec().into_iter().filter_map(|mut t| if t.task_mut().resolve(resolved) { Some(t.view(None)) } else { None }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws::Volume;

    fn volume() -> Volume {
        Volume {
            name: "a.etcd-main.c".into(),
            zone: "eu-west-1a".into(),
            size_gib: 20,
            volume_type: "gp3".into(),
            encrypted: true,
            iops: None,
            throughput: Some(125),
            kms_key_id: None,
            tags: BTreeMap::from([("Name".to_string(), "a.etcd-main.c".to_string())]),
        }
    }

    #[test]
    fn a_view_shows_the_typed_fields_and_keeps_the_task() {
        let r = Task::Volume(volume()).view(Some("vol-1".into()));
        assert_eq!(r.kind(), Kind::Volume);
        assert_eq!(r.name, "a.etcd-main.c");
        let attrs: Vec<(&str, &str)> = r.attrs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(attrs, [("encrypted", "true"), ("size", "20"), ("throughput", "125"), ("type", "gp3"), ("zone", "eu-west-1a")]);
        assert_eq!(r.tags.get("Name").map(String::as_str), Some("a.etcd-main.c"));
        assert!(matches!(r.task.as_deref(), Some(Task::Volume(v)) if *v == volume()));
    }

    #[test]
    fn missing_typed_state_or_id_is_an_error_naming_the_resource() {
        let untyped = Resource::new(Kind::Volume, "a.etcd-main.c");
        let c = Change { kind: Kind::Volume, name: "a.etcd-main.c".into(), action: Action::Create, desired: Some(untyped), actual: None };
        let e = Typed::<Volume>::of(&c).want().expect_err("no task");
        assert!(e.to_string().contains("Volume a.etcd-main.c"), "{e}");
        let e = actual_id(Some(&Task::Volume(volume()).view(None)), Kind::Volume, "a.etcd-main.c").expect_err("no id");
        assert!(e.to_string().contains("Volume a.etcd-main.c") && e.to_string().contains("no cloud id"), "{e}");
    }

    #[test]
    fn the_task_list_is_the_one_dispatch() {
        let mut set = Tasks::default();
        set.push(volume());
        assert_eq!(set.volumes.len(), 1);
        let all: Vec<Kind> = set.iter().map(|t| t.kind()).collect();
        assert_eq!(all, [Kind::Volume]);
        assert!(<Volume as Member<Task>>::of(&set.to_vec()[0]).is_some());
    }
}
