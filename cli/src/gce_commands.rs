//! The GCE halves of `keelson apply`, `delete` and `rolling-update` (the Compute API target, its
//! plan and execution; the argument types are `commands`').

use std::process::ExitCode;

use cloud_resources::{model, state};
use ops::rolling;
use spec_compiler::complete::CompileOptions;

use crate::commands::{color, open_store, with_lock, with_pinned_cas, ApplyArgs, Common, DeleteArgs, RollingUpdateArgs};

/// The GCE target of a cluster: the Compute API at `--endpoint-url`, `$KEELSON_GCE_ENDPOINT` or
/// Google's, with tokens from Application Default Credentials (`$GOOGLE_APPLICATION_CREDENTIALS`,
/// gcloud's `application_default_credentials.json`) or else the metadata server (`$GCE_METADATA_HOST`).
pub(crate) fn target(common: &Common, model: &model::ClusterModel) -> anyhow::Result<cloud_resources::gce::GceTarget> {
    let endpoints = cloud::gce::GceEndpoints::resolve(common.endpoint_url.as_deref());
    let project = model.project.clone().ok_or_else(|| anyhow::anyhow!("Cluster/{}: spec.project: required on GCE", model.cluster))?;
    let tokens = match cloud::gce::adc::from_environment()? {
        Some((file, creds)) => {
            tracing::info!(file = %file.display(), token_uri = creds.token_uri(), "Google credentials: application default credentials");
            cloud::gce::TokenSource::from_credentials(creds, std::time::Duration::from_secs(30))?
        }
        None => cloud::gce::TokenSource::new(base::gce_metadata::GceMetadata::new(None, std::time::Duration::from_secs(10))?),
    };
    // Bucket policies are Cloud Storage's: where the state store is (`$STORAGE_EMULATOR_HOST` or Google's).
    let storage = base::store::GcsEndpoints::from_env().storage;
    Ok(cloud_resources::gce::GceTarget::new(&endpoints, &storage, &project, tokens, std::time::Duration::from_secs(600))?)
}

pub(crate) async fn apply(
    args: &ApplyArgs,
    docs: &keelson_api::Documents,
    options: &CompileOptions,
    model: &model::ClusterModel,
    file: &str,
) -> anyhow::Result<ExitCode> {
    let target = target(&args.common, model)?;
    let store = open_store(&model.config_base, None)?;
    if !args.yes {
        let (model, _) = with_pinned_cas(docs, options, &store, file, false).await?;
        let planned = cloud_resources::plan_apply_gce(&target, &model, &store).await?;
        print!("{}", planned.plan.render(color()));
        if !planned.plan.is_empty() {
            println!("Run with --yes to apply.");
        }
        return Ok(ExitCode::SUCCESS);
    }
    with_lock(&store, "apply", args.common.force_unlock, async {
        state::ensure_pki(&store, &model.etcd_clusters, model.encryption_config).await?;
        let (model, _) = with_pinned_cas(docs, options, &store, file, false).await?;
        let planned = cloud_resources::plan_apply_gce(&target, &model, &store).await?;
        print!("{}", planned.plan.render(color()));
        if planned.plan.is_empty() {
            return Ok(());
        }
        let n = cloud_resources::execute_gce(&target, &model, &store, &planned).await?;
        println!("applied {n} changes to cluster {}", model.cluster);
        Ok(())
    })
    .await?;
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn delete(args: &DeleteArgs, model: &model::ClusterModel) -> anyhow::Result<ExitCode> {
    let target = target(&args.common, model)?;
    let store = open_store(&model.config_base, None)?;
    if !args.yes {
        let planned = cloud_resources::plan_delete_gce(&target, model, &store, args.delete_volumes).await?;
        print!("{}", planned.plan.render(color()));
        if !planned.plan.is_empty() {
            println!("Run with --yes to delete.");
        }
        return Ok(ExitCode::SUCCESS);
    }
    with_lock(&store, "delete", args.common.force_unlock, async {
        let planned = cloud_resources::plan_delete_gce(&target, model, &store, args.delete_volumes).await?;
        print!("{}", planned.plan.render(color()));
        let n = cloud_resources::execute_gce(&target, model, &store, &planned).await?;
        println!("deleted {n} resources of cluster {}", model.cluster);
        Ok(())
    })
    .await?;
    Ok(ExitCode::SUCCESS)
}

/// `keelson rolling-update` on GCE: the MIGs' instances on an old template, recreated one at a time.
pub(crate) async fn rolling_update(args: &RollingUpdateArgs, model: &model::ClusterModel, mut opts: rolling::RollingOptions) -> anyhow::Result<ExitCode> {
    let target = target(&args.common, model)?;
    opts.validate = args.roll.validation(&model.cluster, "rolling-update").await?;
    let groups = ops::gce_rolling::status(&target, model, &opts.selection()).await?;
    print!("{}", ops::instances::render(&groups));
    let pending: usize = groups.iter().map(|g| g.outdated().len()).sum();
    if pending == 0 {
        println!("No rolling update required.");
        return Ok(ExitCode::SUCCESS);
    }
    if !args.yes {
        println!("{pending} instance(s) need replacing. Run with --yes to replace them.");
        return Ok(ExitCode::SUCCESS);
    }
    let store = open_store(&model.config_base, None)?;
    let report = with_lock(&store, "rolling-update", args.common.force_unlock, async {
        Ok(ops::gce_rolling::roll(&target, model, &opts, &mut |line| println!("{line}")).await?)
    })
    .await?;
    println!("rolling update of cluster {} done: {} instance(s) replaced", model.cluster, report.replaced.len());
    Ok(ExitCode::SUCCESS)
}
