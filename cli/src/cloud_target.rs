//! The cloud a command works on, picked from the compiled spec (`model.cloud`): AWS through the SDK
//! or GCE through the Compute API. `apply`, `delete`, `rolling-update` and `validate cluster` run
//! one path each over [`CloudTarget`]; what differs per cloud is only here.

use std::sync::Arc;

use base::StateStore;
use cloud_resources::plan::Plan;
use cloud_resources::{aws, gce, model, AwsPlan, GcePlan};
use ops::groups::{InstanceGroups, RollingTarget as _};

use crate::commands::{aws_target, open_store, Common};

/// A cluster's cloud target.
pub(crate) enum CloudTarget {
    Aws(aws::AwsTarget),
    Gce(Box<gce::GceTarget>),
}

/// A plan computed on a [`CloudTarget`], with what executing it needs.
pub(crate) enum Planned {
    Aws(Box<AwsPlan>),
    Gce(Box<GcePlan>),
}

impl Planned {
    pub(crate) fn plan(&self) -> &Plan {
        match self {
            Planned::Aws(p) => &p.plan,
            Planned::Gce(p) => &p.plan,
        }
    }
}

impl CloudTarget {
    /// The target of the cluster's cloud; `command` names what refuses another cloud.
    pub(crate) async fn of(common: &Common, at: &model::Location, command: &str) -> anyhow::Result<CloudTarget> {
        match at.cloud {
            model::CloudKind::Aws => Ok(CloudTarget::Aws(aws_target(common, &at.region).await)),
            model::CloudKind::Gce => Ok(CloudTarget::Gce(Box::new(gce_target(common, at)?))),
            other => anyhow::bail!("{command} supports AWS and GCE clusters (this one is on {other:?})"),
        }
    }

    /// The cluster's state store (an `s3://` one through this target's S3 client).
    pub(crate) fn store(&self, config_base: &str) -> anyhow::Result<StateStore> {
        match self {
            CloudTarget::Aws(t) => open_store(config_base, Some(t.s3.clone())),
            CloudTarget::Gce(_) => open_store(config_base, None),
        }
    }

    /// Plan an apply (reads only).
    pub(crate) async fn plan_apply(&self, model: &model::ClusterModel, store: &StateStore) -> anyhow::Result<Planned> {
        Ok(match self {
            CloudTarget::Aws(t) => Planned::Aws(Box::new(cloud_resources::plan_apply(t, model, store).await?)),
            CloudTarget::Gce(t) => Planned::Gce(Box::new(cloud_resources::plan_apply_gce(t, model, store).await?)),
        })
    }

    /// Plan a delete (reads only).
    pub(crate) async fn plan_delete(&self, model: &model::ClusterModel, store: &StateStore, volumes: bool) -> anyhow::Result<Planned> {
        Ok(match self {
            CloudTarget::Aws(t) => Planned::Aws(Box::new(cloud_resources::plan_delete(t, model, store, volumes).await?)),
            CloudTarget::Gce(t) => Planned::Gce(Box::new(cloud_resources::plan_delete_gce(t, model, store, volumes).await?)),
        })
    }

    /// Execute a plan this target computed; returns how many changes were made.
    pub(crate) async fn execute(&self, model: &model::ClusterModel, store: &StateStore, planned: &mut Planned) -> anyhow::Result<usize> {
        Ok(match (self, planned) {
            (CloudTarget::Aws(t), Planned::Aws(p)) => cloud_resources::execute(t, model, store, p).await?,
            (CloudTarget::Gce(t), Planned::Gce(p)) => cloud_resources::execute_gce(t, model, store, p).await?,
            _ => anyhow::bail!("a plan is executed by the target that computed it"),
        })
    }

    /// The cluster's groups as a rolling update drives them.
    pub(crate) fn instance_groups(&self, model: &model::ClusterModel) -> Arc<dyn InstanceGroups> {
        match self {
            CloudTarget::Aws(t) => t.instance_groups(model),
            CloudTarget::Gce(t) => t.instance_groups(model),
        }
    }
}

/// The GCE target of a cluster: the Compute API at `--endpoint-url`, `$KEELSON_GCE_ENDPOINT` or
/// Google's, with tokens from Application Default Credentials (`$GOOGLE_APPLICATION_CREDENTIALS`,
/// gcloud's `application_default_credentials.json`) or else the metadata server (`$GCE_METADATA_HOST`).
fn gce_target(common: &Common, at: &model::Location) -> anyhow::Result<gce::GceTarget> {
    let endpoints = cloud::gce::GceEndpoints::resolve(common.endpoint_url.as_deref());
    let project = at.project.clone().ok_or_else(|| anyhow::anyhow!("Cluster/{}: spec.project: required on GCE", at.cluster))?;
    let tokens = match cloud::gce::adc::from_environment()? {
        Some((file, creds)) => {
            tracing::info!(file = %file.display(), token_uri = creds.token_uri(), "Google credentials: application default credentials");
            cloud::gce::TokenSource::from_credentials(creds, std::time::Duration::from_secs(30))?
        }
        None => cloud::gce::TokenSource::new(base::gce_metadata::GceMetadata::new(None, std::time::Duration::from_secs(10))?),
    };
    // Bucket policies are Cloud Storage's: where the state store is (`$STORAGE_EMULATOR_HOST` or Google's).
    let storage = base::store::GcsEndpoints::from_env().storage;
    Ok(gce::GceTarget::new(&endpoints, &storage, &project, tokens, std::time::Duration::from_secs(600))?)
}
