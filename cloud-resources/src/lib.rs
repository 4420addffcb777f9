//! The cloud resources of a cluster: what `keelson apply`, `keelson delete` and `keelson
//! rolling-update` create, change and remove.
//!
//! Owns: the cloud tasks of a compiled cluster ([`model`]: one builder per concern making the tasks,
//! stable kOps names and tags, no I/O), what every task shares ([`tasks`]: links, fields, the one
//! list of task types that generates every dispatch), the desired-vs-actual diff and its rendering
//! ([`plan`]), the AWS tasks ([`aws`]: one typed task per resource kind that renders itself to the
//! direct target — discovery, field-by-field comparison, create/update/delete through the SDK — and
//! to Terraform), the GCE tasks ([`gce`]: Terraform, and the direct target on the Compute API), the Terraform document ([`terraform`],
//! [`terraform_json`]), the IAM policies ([`iam_policy`]), the state a
//! cluster keeps in its store ([`state`]). Must not: compile specs (it takes the compiler's typed
//! output), operate a running cluster (rolling updates and validation are `keelson-ops`), talk to
//! Kubernetes, parse command lines, or guess — a missing id or an unparsable attribute is an error
//! naming the resource.

pub mod aws;
pub mod firewall;
pub mod gce;
pub mod iam_policy;
pub mod model;
pub mod plan;
pub mod state;
pub mod tasks;
pub mod terraform;
pub mod terraform_json;

use base::StateStore;
use model::ClusterModel;
use plan::{Plan, Scope};

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(transparent)]
    Model(#[from] model::ModelError),
    #[error(transparent)]
    Aws(#[from] aws::AwsError),
    #[error(transparent)]
    Gce(#[from] gce::GceError),
    #[error("state store: {0}")]
    Store(#[from] state::StateError),
    #[error("this target is for {want} clusters; this cluster is on {have}")]
    WrongCloud { want: &'static str, have: String },
}

/// A computed plan and what it needs to be executed.
#[derive(Debug)]
pub struct AwsPlan {
    pub plan: Plan,
    pub resolved: aws::Resolved,
    pub discovered: aws::Discovered,
}

fn ensure_aws(model: &ClusterModel) -> Result<(), ApplyError> {
    if model.cloud != model::CloudKind::Aws {
        return Err(ApplyError::WrongCloud { want: "AWS", have: format!("{:?}", model.cloud).to_lowercase() });
    }
    Ok(())
}

fn ensure_gce(model: &ClusterModel) -> Result<(), ApplyError> {
    if model.cloud != model::CloudKind::Gce {
        return Err(ApplyError::WrongCloud { want: "GCE", have: format!("{:?}", model.cloud).to_lowercase() });
    }
    Ok(())
}

/// A computed GCE plan and what it needs to be executed.
#[derive(Debug)]
pub struct GcePlan {
    pub plan: Plan,
    pub names: gce::views::Names,
    pub discovered: gce::GceDiscovered,
}

/// Plan an apply on GCE: reads only.
pub async fn plan_apply_gce(target: &gce::GceTarget, model: &ClusterModel, store: &StateStore) -> Result<GcePlan, ApplyError> {
    ensure_gce(model)?;
    let names = target.names(model);
    let discovered = target.discover(model, &names).await?;
    let mut desired = state::desired(&model.state, model.encryption_config);
    desired.extend(gce::direct::desired(model, &names));
    let mut actual = state::discover(store, &model.state, &model.etcd_clusters, model.encryption_config).await?;
    actual.extend(discovered.resources.iter().cloned());
    let mut plan = plan::diff(&desired, &actual, Scope::Apply);
    plan.rolling = target.rolling(&plan).await?;
    Ok(GcePlan { plan, names, discovered })
}

/// Plan a delete on GCE: reads only.
pub async fn plan_delete_gce(target: &gce::GceTarget, model: &ClusterModel, store: &StateStore, volumes: bool) -> Result<GcePlan, ApplyError> {
    ensure_gce(model)?;
    let names = target.names(model);
    let discovered = target.discover(model, &names).await?;
    let mut actual = state::discover_for_delete(store).await?;
    actual.extend(discovered.resources.iter().cloned());
    let mut plan = plan::diff(&[], &actual, Scope::Delete { volumes });
    if !volumes && discovered.resources.iter().any(|r| r.kind() == plan::Kind::GceDisk) {
        plan.notes.push("etcd disks are kept (give --delete-volumes to delete them)".into());
    }
    Ok(GcePlan { plan, names, discovered })
}

/// Execute a plan computed by [`plan_apply_gce`] or [`plan_delete_gce`].
pub async fn execute_gce(target: &gce::GceTarget, model: &ClusterModel, store: &StateStore, planned: &GcePlan) -> Result<usize, ApplyError> {
    Ok(target.execute(model, &planned.names, &planned.plan, store).await?)
}

/// Plan an apply: reads only.
pub async fn plan_apply(target: &aws::AwsTarget, model: &ClusterModel, store: &StateStore) -> Result<AwsPlan, ApplyError> {
    ensure_aws(model)?;
    let resolved = target.resolve(model).await?;
    let discovered = target.discover(model, &resolved).await?;
    let mut desired = state::desired(&model.state, model.encryption_config);
    desired.extend(aws::desired(model, &resolved));
    let mut actual = state::discover(store, &model.state, &model.etcd_clusters, model.encryption_config).await?;
    actual.extend(discovered.resources.iter().cloned());
    aws::pin_versions(&mut desired, &actual, &discovered.ids);
    let mut plan = plan::diff(&desired, &actual, Scope::Apply);
    plan.rolling = target.rolling(&plan, &discovered);
    plan.notes.extend(resolved.notes.iter().cloned());
    Ok(AwsPlan { plan, resolved, discovered })
}

/// Plan a delete: reads only.
pub async fn plan_delete(target: &aws::AwsTarget, model: &ClusterModel, store: &StateStore, volumes: bool) -> Result<AwsPlan, ApplyError> {
    ensure_aws(model)?;
    let mut resolved = target.resolve_for_delete(model).await?;
    let discovered = target.discover(model, &resolved).await?;
    let mut actual = state::discover_for_delete(store).await?;
    actual.extend(discovered.resources.iter().cloned());
    let mut plan = plan::diff(&[], &actual, Scope::Delete { volumes });
    if !volumes && discovered.resources.iter().any(|r| r.kind() == plan::Kind::Volume) {
        plan.notes.push("etcd volumes are kept (give --delete-volumes to delete them)".into());
    }
    plan.notes.append(&mut resolved.notes);
    Ok(AwsPlan { plan, resolved, discovered })
}

/// Execute a plan computed by [`plan_apply`] or [`plan_delete`].
pub async fn execute(target: &aws::AwsTarget, model: &ClusterModel, store: &StateStore, planned: &mut AwsPlan) -> Result<usize, ApplyError> {
    Ok(target.execute(model, &planned.resolved, &planned.plan, &mut planned.discovered, store).await?)
}
