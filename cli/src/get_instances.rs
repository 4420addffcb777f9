//! `keelson get instances -f SPEC [-o table|yaml|json]` (kOps' `get instances`): every instance of
//! the cluster's groups on its cloud, as the rolling update sees it, with its Node's name from the
//! Kubernetes API when that answers (a warning otherwise, as kOps).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use ops::groups::GroupStatus;
use ops::listing::InstanceRow;

use crate::cloud_target::CloudTarget;
use crate::commands::{load, runtime, Common};
use crate::prepare::prepare_with;
use crate::table::Output;

#[derive(Debug, clap::Args)]
pub struct GetInstancesArgs {
    #[command(flatten)]
    pub common: Common,
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    pub output: Output,
    /// The kubeconfig whose context named as the cluster gives the Node names (default $KUBECONFIG,
    /// then ~/.kube/config).
    #[arg(long = "kubeconfig")]
    pub kubeconfig: Option<PathBuf>,
}

pub fn run(args: GetInstancesArgs) -> anyhow::Result<ExitCode> {
    let (status, nodes) = match gather(&args.common, args.kubeconfig.as_deref(), "get instances")? {
        Ok(x) => x,
        Err(code) => return Ok(code),
    };
    let rows = ops::listing::rows(&status, &nodes);
    let text = crate::table::render(args.output, rows.as_slice(), table)?;
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}

/// The cluster's groups with their instances, and its Nodes.
pub(crate) type Gathered = (Vec<GroupStatus>, Vec<ops::listing::Node>);

/// The cluster's groups with their instances, as the rolling update sees them, and its Nodes
/// (none, with a warning, when the Kubernetes API does not answer).
pub(crate) fn gather(common: &Common, kubeconfig: Option<&std::path::Path>, command: &str) -> anyhow::Result<Result<Gathered, ExitCode>> {
    let (docs, options) = match load(common)? {
        Ok(x) => x,
        Err(code) => return Ok(Err(code)),
    };
    let file = common.file.display().to_string();
    let (model, _) = prepare_with(&docs, &options, false).with_context(|| format!("{file}: building the cloud model"))?;
    runtime()?.block_on(async {
        let target = CloudTarget::of(common, &model.location(), command).await.with_context(|| file.clone())?;
        let groups = target.instance_groups(&model);
        let status = groups.status(&Default::default()).await.with_context(|| format!("listing the instances of cluster {}", model.cluster))?;
        let nodes = match nodes(kubeconfig, &model.cluster).await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!("cannot list node names, the Kubernetes API is unavailable: {e:#}");
                Vec::new()
            }
        };
        Ok(Ok((status, nodes)))
    })
}

/// The cluster's Nodes, the API asked once with a bound (an unreachable API must not hang a listing).
async fn nodes(kubeconfig: Option<&std::path::Path>, cluster: &str) -> anyhow::Result<Vec<ops::listing::Node>> {
    let ask = async {
        let kube = ops::validate::kube_client(kubeconfig, cluster).await?;
        anyhow::Ok(ops::drain::list_nodes(&kube).await?)
    };
    tokio::time::timeout(std::time::Duration::from_secs(20), ask).await.map_err(|_| anyhow::anyhow!("no answer in 20 s"))?
}

/// kOps' columns: ID NODE-NAME STATUS ROLES INTERNAL-IP EXTERNAL-IP INSTANCE-GROUP MACHINE-TYPE STATE.
pub fn table(rows: &[InstanceRow]) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.id.clone(),
                r.node_name.clone().unwrap_or_default(),
                r.status.clone(),
                r.roles.join(", "),
                r.internal_ip.clone(),
                r.external_ip.clone(),
                r.instance_group.clone(),
                r.machine_type.clone(),
                r.state.clone(),
            ]
        })
        .collect();
    crate::table::columns(&["ID", "NODE-NAME", "STATUS", "ROLES", "INTERNAL-IP", "EXTERNAL-IP", "INSTANCE-GROUP", "MACHINE-TYPE", "STATE"], &cells)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_kops_columns_and_empty_cells_for_what_is_unknown() {
        let row = InstanceRow {
            id: "i-1".into(),
            node_name: None,
            status: "UpToDate".into(),
            roles: vec!["node".into()],
            internal_ip: "10.0.0.2".into(),
            external_ip: String::new(),
            instance_group: "nodes".into(),
            machine_type: "t3.medium".into(),
            state: "InService".into(),
        };
        let t = table(&[row]);
        let mut lines = t.lines();
        assert_eq!(
            lines.next().unwrap().split_whitespace().collect::<Vec<_>>(),
            ["ID", "NODE-NAME", "STATUS", "ROLES", "INTERNAL-IP", "EXTERNAL-IP", "INSTANCE-GROUP", "MACHINE-TYPE", "STATE"]
        );
        assert_eq!(lines.next().unwrap().split_whitespace().collect::<Vec<_>>(), ["i-1", "UpToDate", "node", "10.0.0.2", "nodes", "t3.medium", "InService"]);
    }
}
