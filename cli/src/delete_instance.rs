//! `keelson delete instance ID|NODE -f SPEC [--yes] [--surge[=false]] [rolling-update flags]` (kOps'
//! `delete instance`): one instance, found by its cloud ID or its Node's name, replaced by the
//! rolling update's own algorithm run over that instance alone (validated before, its replacement
//! surged first where the group's `maxSurge` allows, out of its load balancers, drained, removed,
//! validated after).

use std::process::ExitCode;

use anyhow::Context as _;
use ops::listing::InstanceRow;
use ops::rolling;

use crate::cloud_target::CloudTarget;
use crate::commands::{load, runtime, with_lock, DeleteArgs};
use crate::prepare::prepare_with;

pub fn run(args: &DeleteArgs, name: &str) -> anyhow::Result<ExitCode> {
    if args.delete_volumes {
        anyhow::bail!("--delete-volumes deletes the cluster's etcd volumes: `keelson delete cluster` takes it, `delete instance` does not");
    }
    let (docs, options) = match load(&args.common)? {
        Ok(x) => x,
        Err(code) => return Ok(code),
    };
    let file = args.common.file.display().to_string();
    let (model, _) = prepare_with(&docs, &options, false).with_context(|| format!("{file}: building the cloud model"))?;
    let mut opts = args.roll.options(&docs);
    if !args.surge {
        opts.surge = None;
    }
    runtime()?.block_on(async {
        let target = CloudTarget::of(&args.common, &model.location(), "delete instance").await.with_context(|| file.clone())?;
        let groups = target.instance_groups(&model);
        opts.validate = args.roll.validation(&model.cluster, "delete instance").await?;
        let status = rolling::status(groups.as_ref(), &opts).await?;
        let nodes = match &opts.validate {
            rolling::Validation::Cluster(kube) => ops::drain::list_nodes(kube).await?,
            _ => Vec::new(),
        };
        let rows = ops::listing::rows(&status, &nodes);
        let row = find(&rows, name).map_err(|e| anyhow::anyhow!("cluster {}: {e}", model.cluster))?;
        let node = row.node_name.as_deref().map(|n| format!(" (node {n})")).unwrap_or_default();
        println!("instance {}{node} of instance group {} ({}, {})", row.id, row.instance_group, row.roles.join(", "), row.status);
        if !args.yes {
            println!("Run with --yes to drain it and replace it.");
            return Ok(ExitCode::SUCCESS);
        }
        opts.instances = vec![row.id.clone()];
        let store = target.store(&model.config_base)?;
        let report = with_lock(&store, "delete instance", args.common.force_unlock, async {
            Ok(rolling::roll_groups(groups.clone(), &opts, &mut |line| println!("{line}")).await?)
        })
        .await?;
        match report.replaced.iter().find(|(_, gone, _)| *gone == row.id) {
            Some((_, _, new)) if !new.is_empty() => println!("instance {} deleted; its replacement is {new}", row.id),
            Some(_) => println!("instance {} deleted; its replacement was started first (surge)", row.id),
            None => anyhow::bail!("instance {} was not replaced (rollingUpdate.drainAndTerminate is false for its group?)", row.id),
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// The instance named by its cloud ID or by its Node's name.
pub fn find<'a>(rows: &'a [InstanceRow], name: &str) -> Result<&'a InstanceRow, String> {
    rows.iter().find(|r| r.id == name || r.node_name.as_deref() == Some(name)).ok_or_else(|| {
        let known: Vec<String> = rows.iter().map(|r| r.node_name.as_ref().map_or_else(|| r.id.clone(), |n| format!("{} ({n})", r.id))).collect();
        format!(
            "no instance or node named {name:?} in its instance groups; they have: {}",
            if known.is_empty() { "none".to_string() } else { known.join(", ") }
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, node: Option<&str>) -> InstanceRow {
        InstanceRow {
            id: id.into(),
            node_name: node.map(Into::into),
            status: "UpToDate".into(),
            roles: vec!["node".into()],
            internal_ip: String::new(),
            external_ip: String::new(),
            instance_group: "nodes".into(),
            machine_type: String::new(),
            state: "InService".into(),
        }
    }

    #[test]
    fn found_by_id_or_node_name_and_a_miss_lists_what_exists() {
        let rows = [row("i-1", Some("ip-10-0-0-1")), row("i-2", None)];
        assert_eq!(find(&rows, "i-2").unwrap().id, "i-2");
        assert_eq!(find(&rows, "ip-10-0-0-1").unwrap().id, "i-1");
        let e = find(&rows, "i-3").unwrap_err();
        assert!(e.contains("\"i-3\"") && e.contains("i-1 (ip-10-0-0-1), i-2"), "{e}");
    }
}
