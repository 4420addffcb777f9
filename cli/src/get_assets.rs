//! `keelson get assets -f SPEC [--arch amd64,arm64] [-o table|yaml|json]` (kOps' `get assets`): the
//! spec compiled as `keelson compile` compiles it, and the files and images of the compiled output
//! (`spec_compiler::assets::list`) printed.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use spec_compiler::assets::AssetList;

use crate::table::Output;

#[derive(Debug, clap::Args)]
pub struct GetAssetsArgs {
    /// The spec file (one Cluster and its InstanceGroups).
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Only the files of these architectures (comma-separated; default: every one the NodeupConfigs
    /// name). Images are the same reference for every architecture.
    #[arg(long = "arch", value_delimiter = ',', value_name = "ARCH,…")]
    pub arch: Vec<String>,
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    pub output: Output,
    #[command(flatten)]
    pub compile: crate::args::CompileFlags,
}

pub fn run(args: &GetAssetsArgs, docs: &keelson_api::Documents) -> anyhow::Result<ExitCode> {
    let arches = crate::args::parse_arches(&args.arch)?;
    let options = args.compile.options(Default::default())?;
    let compiled = spec_compiler::compile(docs, &options).with_context(|| format!("compiling {}", args.file.display()))?;
    crate::print_warnings(&args.file, docs, &compiled);
    let mut list = spec_compiler::assets::list(&compiled, &options).with_context(|| format!("listing the assets of {}", args.file.display()))?;
    if !arches.is_empty() {
        list = list.for_arches(&arches);
    }
    let text = crate::table::render(args.output, &list, table)?;
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}

/// The images, then the files, each a table.
pub fn table(list: &AssetList) -> String {
    let images: Vec<Vec<String>> = list
        .images
        .iter()
        .map(|i| vec![i.reference.clone(), i.digest.clone().unwrap_or_else(|| "-".into()), i.arch.to_string(), i.used_by.join(",")])
        .collect();
    let files: Vec<Vec<String>> = list.files.iter().map(|f| vec![f.url.clone(), f.sha256.clone(), f.arch.to_string(), f.used_by.join(",")]).collect();
    crate::table::columns(&["IMAGE", "DIGEST", "ARCH", "USED BY"], &images) + "\n" + &crate::table::columns(&["FILE", "SHA256", "ARCH", "USED BY"], &files)
}
