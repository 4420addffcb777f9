//! `keelson reconcile cluster -f SPEC [--yes]` (kOps' `reconcile cluster`): apply and roll the
//! cluster in phases ([`ops::reconcile`]) — the control planes, API servers and bastions first, the
//! workers after them, then the prune, then the new addons — under one state-store lock. Without
//! `--yes` each phase's plan is printed and nothing changes.

use std::process::ExitCode;

use anyhow::Context as _;

use cloud_resources::{model, state};
use ops::reconcile::{self, Phase, ReconcileOptions};

use crate::commands::{aws_target, color, load_for_cloud, open_store, runtime, with_lock, with_pinned_cas, Common, Located, RollArgs};

/// `keelson reconcile cluster`.
#[derive(Debug, clap::Args)]
pub struct ReconcileArgs {
    #[command(flatten)]
    pub common: Common,
    /// Run the phases (without it, only each phase's plan is printed).
    #[arg(short = 'y', long)]
    pub yes: bool,
    #[command(flatten)]
    pub roll: RollArgs,
}

pub fn run(args: ReconcileArgs) -> anyhow::Result<ExitCode> {
    let Located { docs, options, at, file } = match load_for_cloud(&args.common)? {
        Ok(l) => l,
        Err(code) => return Ok(code),
    };
    if at.cloud != model::CloudKind::Aws {
        anyhow::bail!("{file}: reconcile supports AWS clusters only (it applies through the AWS SDK and rolls autoscaling groups)");
    }
    let mut rolling = args.roll.options(&docs);
    runtime()?.block_on(async {
        let target = aws_target(&args.common, &at.region).await;
        let store = open_store(&at.config_base, Some(target.s3.clone()))?;
        if !args.yes {
            let (model, _) = with_pinned_cas(&docs, &options, &store, &file, false).await?;
            let phases = reconcile::plan(&target, &model, &store, &rolling).await?;
            print!("{}", reconcile::render_plan(&phases, color()));
            if !reconcile::plan_is_empty(&phases) {
                println!("Run with --yes to run these phases in this order.");
            }
            return Ok(ExitCode::SUCCESS);
        }
        rolling.validate = args.roll.validation(&at.cluster, "reconcile").await?;
        with_lock(&store, "reconcile", args.common.force_unlock, async {
            // The CA first, pinned into the NodeupConfigs (and so into the user-data), as apply does.
            state::ensure_pki(&store, &at.etcd_clusters, at.encryption_config)
                .await
                .with_context(|| format!("{}: the cluster's PKI", Phase::ControlPlaneApply))?;
            let (model, _) = with_pinned_cas(&docs, &options, &store, &file, false).await?;
            let opts = ReconcileOptions { rolling, color: color() };
            let report = reconcile::reconcile(&target, &model, &store, &opts, &mut |line| println!("{line}")).await?;
            let applied: usize = report.values().map(|p| p.applied.len()).sum();
            let replaced: usize = report.values().map(|p| p.replaced.len()).sum();
            println!("reconcile of cluster {} done: {applied} change(s) applied, {replaced} instance(s) replaced", model.cluster);
            Ok(())
        })
        .await?;
        Ok(ExitCode::SUCCESS)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: ReconcileArgs,
    }

    #[test]
    fn reconcile_takes_the_rolling_update_flags() {
        let parse = |args: &[&str]| Cli::try_parse_from(std::iter::once("reconcile").chain(args.iter().copied())).map(|c| c.args);
        let a = parse(&["-f", "c.yaml"]).expect("plan");
        assert!(!a.yes && !a.roll.cloudonly);
        assert_eq!((a.roll.validate_count, a.roll.drain_timeout), (2, std::time::Duration::from_secs(900)), "rolling-update's defaults");
        let a = parse(&["-f", "c.yaml", "-y", "--validate-count", "3", "--drain-timeout", "5m", "--node-interval", "1s", "--fail-on-drain-error=false"])
            .expect("the shared flags");
        assert!(a.yes && !a.roll.fail_on_drain_error);
        assert_eq!(
            (a.roll.validate_count, a.roll.drain_timeout, a.roll.node_interval),
            (3, std::time::Duration::from_secs(300), std::time::Duration::from_secs(1))
        );
        assert!(parse(&["-f", "c.yaml", "--cloudonly", "--validate-command", "true"]).is_err(), "as in rolling-update");
        assert!(parse(&["-f", "c.yaml", "--instance-group", "nodes"]).is_err(), "reconcile's phases choose the groups");
    }
}
