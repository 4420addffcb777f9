//! `keelson pki init --state DIR`: create the cluster CAs and service-account key in a file state
//! store — and, when the compiled spec there has
//! `encryptionConfig: true`, the API servers' `secrets/encryptionconfig` — once (an existing
//! keyset or secret is never replaced). The layout is documented in `base::pki`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;

/// `keelson pki …`
#[derive(clap::Args)]
pub struct PkiArgs {
    #[command(subcommand)]
    command: PkiCommand,
}

#[derive(clap::Subcommand)]
enum PkiCommand {
    /// Create the CAs (kubernetes-ca, apiserver-aggregator-ca, etcd-*) and the service-account key
    /// under DIR/pki; idempotent. (Bootstrap tokens, in token mode, are minted by protokube.)
    Init {
        /// The state-store directory (the `ConfigBase` of the cluster, e.g. `OUT/state`).
        #[arg(long)]
        state: PathBuf,
        /// etcd cluster names (default: from DIR/cluster-completed.spec, else `main,events`).
        #[arg(long = "etcd-cluster", value_delimiter = ',')]
        etcd_clusters: Vec<String>,
    },
}

fn completed_spec(state: &std::path::Path) -> Option<serde_yaml_ng::Value> {
    let text = std::fs::read_to_string(state.join("cluster-completed.spec")).ok()?;
    serde_yaml_ng::from_str(&text).ok()
}

/// `spec.encryptionConfig` of the compiled spec in the store.
fn encryption_from_spec(state: &std::path::Path) -> bool {
    completed_spec(state).and_then(|d| d.get("spec")?.get("encryptionConfig")?.as_bool()).unwrap_or(false)
}

fn etcd_from_spec(state: &std::path::Path) -> Option<Vec<String>> {
    let doc = completed_spec(state)?;
    let names: Vec<String> =
        doc.get("spec")?.get("etcdClusters")?.as_sequence()?.iter().filter_map(|e| e.get("name").and_then(|n| n.as_str()).map(str::to_string)).collect();
    (!names.is_empty()).then_some(names)
}

pub fn run(args: PkiArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        PkiCommand::Init { state, etcd_clusters } => {
            let etcd = if etcd_clusters.is_empty() { etcd_from_spec(&state).unwrap_or_else(|| vec!["main".into(), "events".into()]) } else { etcd_clusters };
            let mut created = base::pki::init_pki(&state, &etcd).with_context(|| format!("initialising PKI in {}", state.display()))?;
            if encryption_from_spec(&state)
                && base::encryption::ensure(&state).with_context(|| format!("creating the encryption configuration in {}", state.display()))?
            {
                created.push(base::encryption::SECRET_PATH.to_string());
            }
            for name in &created {
                println!("created {name}");
            }
            println!("{}: {} created, existing keys kept", state.display(), created.len());
            Ok(ExitCode::SUCCESS)
        }
    }
}
