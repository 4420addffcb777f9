//! `keelson toolbox dump -f SPEC [-o yaml|json]` (kOps' `toolbox dump`): every instance of the
//! cluster as `get instances` lists it, with its zone, the configuration it was launched from and
//! the one its group launches now, its volumes and its Node's readiness — what an operator asks
//! first when a cluster misbehaves, in one document.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::commands::Common;
use anyhow::Context as _;

/// `-o` of `toolbox dump` (kOps' default: YAML).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DumpOutput {
    Yaml,
    Json,
}

#[derive(Debug, clap::Args)]
pub struct ToolboxDumpArgs {
    #[command(flatten)]
    pub common: Common,
    #[arg(short = 'o', long = "output", value_enum, default_value = "yaml")]
    pub output: DumpOutput,
    /// The kubeconfig whose context named as the cluster gives the Nodes (default $KUBECONFIG,
    /// then ~/.kube/config).
    #[arg(long = "kubeconfig")]
    pub kubeconfig: Option<PathBuf>,
}

pub fn run(args: ToolboxDumpArgs) -> anyhow::Result<ExitCode> {
    let (status, nodes) = match crate::get_instances::gather(&args.common, args.kubeconfig.as_deref(), "toolbox dump")? {
        Ok(x) => x,
        Err(code) => return Ok(code),
    };
    let dump = serde_json::json!({ "instances": ops::listing::dump(&status, &nodes) });
    let text = match args.output {
        DumpOutput::Yaml => serde_yaml_ng::to_string(&dump).context("rendering YAML")?,
        DumpOutput::Json => serde_json::to_string_pretty(&dump).context("rendering JSON")? + "\n",
    };
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}
