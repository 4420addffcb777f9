//! The typed tasks of GCE: one type per resource kind, used for the desired state (built by the
//! model's builders) and the actual state (read back from the Compute and IAM APIs, [`super::views`]).
//! Each type says what it is to the plan ([`GceTask::kind`], [`GceTask::gce_name`],
//! [`GceTask::fields`], [`GceTask::labels`]), what Compute is sent to create it
//! ([`GceTask::body`]), and renders itself to the direct target ([`GceTask::render_gce`]) and to
//! Terraform ([`GceTask::render_terraform`]); the plan compares their [`Task::view`]s field by
//! field. [`crate::tasks!`] below is the one list of the types: it generates [`Task`], [`Tasks`]
//! and every dispatch, as for AWS ([`crate::aws::task`]).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use serde_json::Value;

use super::direct::{GceError, GceTarget};
use super::views::Names;
use super::{BucketIamMember, Disk, Firewall, InstanceGroupManager, InstanceTemplate, Network, ProjectIamMember, ServiceAccount, Subnetwork};
use crate::model::ClusterModel;
use crate::plan::{Action, Change, Kind, Resource};
use crate::tasks::{Fields, Member};
use crate::terraform_json::Blocks;

crate::tasks! {
    /// A typed resource of GCE.
    #[allow(clippy::large_enum_variant)]
    pub enum Task, pub struct Tasks, dyn GceTask {
        networks: Network(Network),
        subnetworks: Subnetwork(Subnetwork),
        firewalls: Firewall(Firewall),
        service_accounts: ServiceAccount(ServiceAccount),
        project_iam_members: ProjectIamMember(ProjectIamMember),
        bucket_iam_members: BucketIamMember(BucketIamMember),
        instance_templates: InstanceTemplate(InstanceTemplate),
        instance_group_managers: InstanceGroupManager(InstanceGroupManager),
        disks: Disk(Disk),
    }
}

/// What a task's direct rendering returns.
pub type GceFuture<'a> = Pin<Box<dyn Future<Output = Result<(), GceError>> + Send + 'a>>;

/// What a task renders with on the direct target.
#[derive(Clone, Copy)]
pub struct Exec<'a> {
    pub target: &'a GceTarget,
    /// The GCE names of the model's tasks (links become names and URLs with them).
    pub names: &'a Names,
}

/// One task type of GCE (kOps' `fi.Task` with `RenderGCE` and `RenderTerraform`).
pub trait GceTask: std::fmt::Debug + Send + Sync {
    fn kind(&self) -> Kind;
    /// The model's name (Terraform's resource name).
    fn name(&self) -> String;
    /// The plan's name: the GCE name (an email, a grant's `<role> <member>`, …).
    fn gce_name(&self, names: &Names) -> String;
    /// The comparable attributes (names, never URLs; a hash, never the boot script).
    fn fields(&self, f: &mut Fields, names: &Names);
    /// Labels, compared as the plan's tags.
    fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::new()
    }
    /// The API request body that creates it.
    fn body(&self, names: &Names) -> Value;
    /// Terraform blocks for the task.
    fn render_terraform(&self, b: &mut Blocks);
    /// Create, update or delete the resource for one change of the plan (the desired side for a
    /// create or an update, the actual side for a delete; read the other with [`Typed::of`]).
    fn render_gce<'a>(&'a self, cx: Exec<'a>, c: &'a Change) -> GceFuture<'a>;
}

impl Task {
    pub fn kind(&self) -> Kind {
        self.task().kind()
    }

    /// The API request body that creates the task.
    pub fn body(&self, names: &Names) -> Value {
        self.task().body(names)
    }

    /// The plan's view of this task; `id`: the partial URL of an actual resource.
    pub fn view(self, id: Option<String>, names: &Names) -> Resource {
        let t = self.task();
        let mut f = Fields::default();
        t.fields(&mut f, names);
        let (kind, name, tags) = (t.kind(), t.gce_name(names), t.labels());
        Resource { kind: Some(kind), name, attrs: f.0, tags, id, task: None, gce: Some(Box::new(self)) }
    }
}

/// The model's GCE tasks in their plan views.
pub fn desired(model: &ClusterModel, names: &Names) -> Vec<Resource> {
    model.gce.to_vec().into_iter().map(|t| t.view(None, names)).collect()
}

/// One change, its actual side as the task type `T` (the task rendering it is the desired side).
pub struct Typed<'a, T> {
    pub name: &'a str,
    pub kind: Kind,
    pub action: &'a Action,
    actual: Option<&'a Resource>,
    _t: std::marker::PhantomData<T>,
}

impl<'a, T: Member<Task>> Typed<'a, T> {
    pub fn of(c: &'a Change) -> Typed<'a, T> {
        Typed { name: &c.name, kind: c.kind, action: &c.action, actual: c.actual.as_ref(), _t: std::marker::PhantomData }
    }
    /// An error about this change's resource.
    pub fn error(&self, message: impl Into<String>) -> GceError {
        GceError::Resource { kind: self.kind.as_str(), name: self.name.to_string(), message: message.into() }
    }
    /// What GCE cannot change in place.
    pub fn refuse(&self, what: &str) -> GceError {
        self.error(format!("{what} cannot be changed in place on GCE (delete and re-create it)"))
    }
    fn side(&self, r: Option<&'a Resource>, side: &str) -> Result<&'a T, GceError> {
        r.and_then(|r| r.gce.as_deref()).and_then(T::of).ok_or_else(|| self.error(format!("the plan holds no typed {side} state for it")))
    }
    /// The actual state, or an error naming the resource.
    pub fn have(&self) -> Result<&'a T, GceError> {
        self.side(self.actual, "actual")
    }
    /// An update changes this field.
    pub fn changed(&self, field: &str) -> bool {
        matches!(self.action, Action::Update(f) if f.iter().any(|f| f.field == field))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk() -> Disk {
        Disk {
            name: "a-etcd-main-c".into(),
            gce_name: "a-etcd-main-c".into(),
            zone: "europe-west1-b".into(),
            size_gb: 20,
            disk_type: "pd-ssd".into(),
            labels: BTreeMap::from([("k8s-io-etcd-main".to_string(), "a-2fa".to_string())]),
        }
    }

    #[test]
    fn a_view_shows_the_typed_fields_and_keeps_the_task() {
        let names = Names { project: "p".into(), ..Default::default() };
        let r = Task::Disk(disk()).view(Some("projects/p/zones/europe-west1-b/disks/a-etcd-main-c".into()), &names);
        assert_eq!(r.kind(), Kind::GceDisk);
        assert_eq!(r.name, "a-etcd-main-c");
        let attrs: Vec<(&str, &str)> = r.attrs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(attrs, [("size", "20"), ("type", "pd-ssd"), ("zone", "europe-west1-b")]);
        assert_eq!(r.tags, disk().labels, "labels compare as tags");
        assert!(matches!(r.gce.as_deref(), Some(Task::Disk(d)) if *d == disk()));
        assert_eq!(Task::Disk(disk()).body(&names)["type"], "projects/p/zones/europe-west1-b/diskTypes/pd-ssd");
    }

    #[test]
    fn missing_typed_state_is_an_error_naming_the_resource() {
        let c = Change {
            kind: Kind::GceDisk,
            name: "a-etcd-main-c".into(),
            action: Action::Delete,
            desired: None,
            actual: Some(Resource::new(Kind::GceDisk, "x")),
        };
        let e = Typed::<Disk>::of(&c).have().expect_err("untyped");
        assert!(e.to_string().contains("Disk a-etcd-main-c") && e.to_string().contains("no typed actual state"), "{e}");
    }

    #[test]
    fn the_task_list_is_the_one_dispatch() {
        let mut set = Tasks::default();
        set.push(disk());
        let kinds: Vec<Kind> = set.iter().map(|t| t.kind()).collect();
        assert_eq!(kinds, [Kind::GceDisk]);
        assert!(<Disk as Member<Task>>::of(&set.to_vec()[0]).is_some());
    }
}
