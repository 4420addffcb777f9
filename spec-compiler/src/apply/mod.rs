//! `keelson apply` / `keelson delete`: turn a compiled cluster into cloud resources.
//!
//! * [`model`] — the resources a cluster needs (stable kOps names and tags), no I/O.
//! * [`plan`] — generic desired-vs-actual diff and its rendering.
//! * [`state_store`] — `ConfigBase` (`file://`, `s3://`) and the CAs created on first apply.
//! * [`aws`] — the direct target (aws-sdk-ec2 / autoscaling / route53).
//! * [`terraform`] / [`gce`] — Terraform JSON for AWS and GCE.

pub mod aws;
pub mod cli;
pub mod gce;
pub mod iam_policy;
pub mod kubeconfig;
pub mod model;
pub mod plan;
pub mod rolling;
pub mod state_store;
pub mod terraform;

use keelson_api::Documents;

use crate::{CompileError, CompileOptions, Compiled};
use model::ClusterModel;
use plan::{Plan, Scope};
use state_store::{CaCreator, StateStore};

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(transparent)]
    Compile(#[from] CompileError),
    #[error(transparent)]
    Model(#[from] model::ModelError),
    #[error(transparent)]
    Aws(#[from] aws::AwsError),
    #[error("state store: {0}")]
    Store(#[from] state_store::StoreError),
    #[error("the direct target supports AWS only (this cluster is on {0}); use --target terraform")]
    DirectUnsupported(String),
}

/// Compile the spec and build its cloud model.
pub fn prepare(docs: &Documents, options: &CompileOptions) -> Result<(ClusterModel, Compiled), ApplyError> {
    prepare_with(docs, options, true)
}

/// [`prepare`] for delete: user-data is not needed.
pub fn prepare_with(docs: &Documents, options: &CompileOptions, require_user_data: bool) -> Result<(ClusterModel, Compiled), ApplyError> {
    let compiled = crate::compile(docs, options)?;
    let completed = model::completed_cluster(&compiled.tree)?;
    let m = model::build_with(docs, &completed, &compiled.tree, require_user_data)?;
    Ok((m, compiled))
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
        return Err(ApplyError::DirectUnsupported("gce".into()));
    }
    Ok(())
}

/// Plan an apply: reads only.
pub async fn plan_apply(target: &aws::AwsTarget, model: &ClusterModel, store: &StateStore) -> Result<AwsPlan, ApplyError> {
    ensure_aws(model)?;
    let resolved = target.resolve(model).await?;
    let discovered = target.discover(model, &resolved).await?;
    let mut desired = state_store::desired(&model.state);
    desired.extend(aws::desired(model, &resolved));
    let mut actual = state_store::discover(store, &model.state, &model.etcd_clusters).await?;
    actual.extend(discovered.resources.iter().cloned());
    aws::pin_versions(&mut desired, &actual, &discovered.ids);
    let mut plan = plan::diff(&desired, &actual, Scope::Apply);
    plan.rolling = target.rolling(&plan, &discovered);
    plan.notes.extend(resolved.notes.iter().cloned());
    Ok(AwsPlan { plan, resolved, discovered })
}

/// Plan a delete: reads only.
pub async fn plan_delete(
    target: &aws::AwsTarget,
    model: &ClusterModel,
    store: &StateStore,
    volumes: bool,
) -> Result<AwsPlan, ApplyError> {
    ensure_aws(model)?;
    let mut resolved = target.resolve_for_delete(model).await?;
    let discovered = target.discover(model, &resolved).await?;
    let mut actual = state_store::discover_for_delete(store).await?;
    actual.extend(discovered.resources.iter().cloned());
    let mut plan = plan::diff(&[], &actual, Scope::Delete { volumes });
    if !volumes && discovered.resources.iter().any(|r| r.kind() == plan::Kind::Volume) {
        plan.notes.push("etcd volumes are kept (give --delete-volumes to delete them)".into());
    }
    plan.notes.append(&mut resolved.notes);
    Ok(AwsPlan { plan, resolved, discovered })
}

/// Execute a plan computed by [`plan_apply`] or [`plan_delete`].
pub async fn execute(
    target: &aws::AwsTarget,
    model: &ClusterModel,
    store: &StateStore,
    planned: &mut AwsPlan,
    ca: &dyn CaCreator,
) -> Result<usize, ApplyError> {
    Ok(target.execute(model, &planned.resolved, &planned.plan, &mut planned.discovered, store, ca).await?)
}
