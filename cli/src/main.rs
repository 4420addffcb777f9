//! `keelson`: validate and compile Keelson (kOps-format) cluster specs and, with the `cloud` feature
//! (on by default), apply, delete, roll and validate clusters, export credentials and run etcd
//! backups. Flags and documented environment variables become library calls here; errors get their
//! context at this edge.

use std::path::PathBuf;
use std::process::ExitCode;

mod args;
mod bundle_cmd;
#[cfg(feature = "cloud")]
mod cloud_target;
#[cfg(feature = "cloud")]
mod commands;
mod create_cluster;
#[cfg(feature = "cloud")]
mod delete_instance;
#[cfg(feature = "cloud")]
mod discovery;
#[cfg(feature = "cloud")]
mod etcd_backup;
mod get_assets;
#[cfg(feature = "cloud")]
mod get_instances;
#[cfg(feature = "cloud")]
mod keypair_cmd;
#[cfg(feature = "cloud")]
mod kubeconfig;
mod pki_cmd;
#[cfg(feature = "cloud")]
mod prepare;
#[cfg(feature = "cloud")]
mod reconcile;
mod table;
#[cfg(feature = "cloud")]
mod toolbox;
mod upgrade;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use spec_compiler::load::{load_spec, LoadError};

#[derive(Parser)]
#[command(name = "keelson", version, about = "Compile kOps-format cluster specs into complete configuration, node configs and user-data")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check a spec file (`-f SPEC`): print every problem, one per line; exit 0 valid, 1 invalid, 2
    /// unreadable. `keelson validate cluster -f SPEC` checks the running cluster instead.
    #[command(args_conflicts_with_subcommands = true)]
    Validate {
        /// The spec file (multi-document YAML: one Cluster and its InstanceGroups).
        #[arg(short = 'f', long = "file", required = true)]
        file: Option<PathBuf>,
        #[command(subcommand)]
        what: Option<ValidateWhat>,
    },
    /// Complete a spec and write the configuration tree to DIR.
    Compile {
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        /// Output directory (created if missing).
        #[arg(long = "out")]
        out: PathBuf,
        #[command(flatten)]
        compile: args::CompileFlags,
        /// A local state store (a directory or `file://` URL, as `keelson pki init --state` made it)
        /// whose cluster CA is pinned into every NodeupConfig, as `keelson apply` pins the real
        /// store's; without it the NodeupConfigs pin no CA and nodeup refuses them.
        #[arg(long = "state", value_name = "DIR")]
        state: Option<String>,
    },
    /// kOps' `create cluster`: a new cluster's spec from kOps' flags (`keelson create cluster NAME
    /// --zones Z1,Z2 --state s3://BUCKET`), written to NAME.yaml for git, or printed with
    /// `--dry-run -o yaml`. `keelson create keypair kubernetes-ca -f SPEC` starts a CA rotation.
    #[command(subcommand)]
    Create(Create),
    /// kOps' `get`: `keelson get assets -f SPEC` lists every file and image the cluster uses, `keelson
    /// get instances -f SPEC` every instance of its groups, `keelson get keypairs -f SPEC` the keys of
    /// every keyset.
    #[command(subcommand)]
    Get(Get),
    /// kOps' `promote keypair`: make a key of the cluster CA the one that signs (CA rotation,
    /// docs/operations.md).
    #[cfg(feature = "cloud")]
    #[command(subcommand)]
    Promote(Promote),
    /// kOps' `distrust keypair`: stop trusting the cluster CA's older keys (CA rotation,
    /// docs/operations.md).
    #[cfg(feature = "cloud")]
    #[command(subcommand)]
    Distrust(Distrust),
    #[cfg(feature = "cloud")]
    /// Plan the cloud resources of a spec (state store, launch templates, autoscaling groups, etcd
    /// volumes, DNS); `--yes` applies them; `--target terraform --out DIR` writes Terraform JSON.
    Apply(commands::ApplyArgs),
    #[cfg(feature = "cloud")]
    /// kOps' `rolling-update cluster`: replace the instances not on their group's launch-template
    /// version (bastions, control planes one at a time, API servers, nodes), validating before each
    /// group and after each replacement, draining each node first; `--yes` replaces, otherwise the
    /// groups and what needs replacing are shown.
    RollingUpdate(commands::RollingUpdateArgs),
    #[cfg(feature = "cloud")]
    /// kOps' `reconcile cluster -f SPEC`: apply and roll in phases so that no kubelet is newer than
    /// an API server — control planes (API servers, bastions) applied and rolled first, then the
    /// workers, then the prune, then the new addons; `--yes` runs them, otherwise each phase's plan
    /// is shown.
    #[command(subcommand)]
    Reconcile(Reconcile),
    #[cfg(feature = "cloud")]
    /// `keelson delete [cluster] -f SPEC`: plan deleting what apply created (found by the cluster
    /// tag); `--yes` deletes; etcd volumes are kept unless `--delete-volumes`. `keelson delete
    /// instance ID|NODE -f SPEC` (kOps' `delete instance`): drain that one instance and replace it.
    Delete(commands::DeleteArgs),
    /// Air-gapped bundles: `keelson bundle create -f SPEC -o FILE`, `keelson bundle push FILE
    /// --file-repository URL --registry HOST[:PORT]` (docs/bundles.md).
    #[command(subcommand)]
    Bundle(bundle_cmd::BundleCommand),
    /// Cluster PKI in a file state store: `keelson pki init --state DIR`.
    Pki(pki_cmd::PkiArgs),
    /// Upgrades: `keelson upgrade cluster -f SPEC [--to VERSION] [--yes]` moves the spec's Kubernetes
    /// version to the next release the versions table recommends, one minor at a time.
    #[command(subcommand)]
    Upgrade(Upgrade),
    /// Export credentials: `keelson export kubeconfig -f SPEC --admin [--ttl 18h]`.
    #[cfg(feature = "cloud")]
    #[command(subcommand)]
    Export(Export),
    /// etcd operations: `keelson etcd backup list|create|restore -f SPEC --etcd-cluster main`.
    #[cfg(feature = "cloud")]
    #[command(subcommand)]
    Etcd(Etcd),
    /// kOps' `toolbox`: `keelson toolbox dump -f SPEC [-o yaml|json]` prints every instance with its
    /// zone, configurations, volumes and Node readiness.
    #[cfg(feature = "cloud")]
    #[command(subcommand)]
    Toolbox(Toolbox),
}

#[cfg(feature = "cloud")]
#[derive(Subcommand)]
enum Toolbox {
    /// Every instance of the cluster (as `get instances`) with its zone, the configuration it was
    /// launched from and its group's, its volumes and its Node's readiness.
    Dump(toolbox::ToolboxDumpArgs),
}

#[cfg(feature = "cloud")]
#[derive(Subcommand)]
enum Etcd {
    /// Backups of an etcd cluster in its backup store, and restoring one.
    #[command(subcommand)]
    Backup(etcd_backup::BackupAction),
}

#[cfg(feature = "cloud")]
#[derive(Subcommand)]
enum Reconcile {
    /// Apply and roll the cluster phase by phase (takes the `rolling-update` flags for its rolls).
    Cluster(reconcile::ReconcileArgs),
}

#[derive(Subcommand)]
enum Create {
    /// Write a new cluster's spec: the Cluster and its InstanceGroups as kOps' `create cluster`
    /// makes them, checked as `keelson validate` checks a spec.
    Cluster(Box<create_cluster::CreateClusterArgs>),
    /// Add a new key to the cluster CA's keyset in the state store, trusted but not the primary
    /// (`--primary` makes it the primary at once): the first step of a CA rotation.
    #[cfg(feature = "cloud")]
    Keypair(Box<keypair_cmd::CreateKeypairArgs>),
}

#[cfg(feature = "cloud")]
#[derive(Subcommand)]
enum Promote {
    /// Make key ID (default: the newest trusted key) the primary of the keyset.
    Keypair(keypair_cmd::PromoteKeypairArgs),
}

#[cfg(feature = "cloud")]
#[derive(Subcommand)]
enum Distrust {
    /// Distrust keys ID… (default: every trusted key older than the primary).
    Keypair(keypair_cmd::DistrustKeypairArgs),
}

#[derive(Subcommand)]
enum Get {
    /// Every file (URL, sha256, architecture) and container image the compiled spec uses: the
    /// NodeupConfigs' assets, the nodeup build, every image of every addon and node config.
    Assets(get_assets::GetAssetsArgs),
    /// kOps' `get instances`: every instance of the cluster's groups (ID, Node name, UpToDate or
    /// NeedsUpdate, role, addresses, group, machine type, state).
    #[cfg(feature = "cloud")]
    Instances(get_instances::GetInstancesArgs),
    /// kOps' `get keypairs [KEYSET…]`: the keys of every keyset (id, primary, distrusted, subject,
    /// expiry; `-o yaml|json` adds each certificate).
    #[cfg(feature = "cloud")]
    Keypairs(keypair_cmd::GetKeypairsArgs),
}

#[derive(Subcommand)]
enum Upgrade {
    /// The newest patch of the current minor, else of the next minor; `--yes` rewrites the spec's
    /// `kubernetesVersion:` (then apply and roll).
    Cluster(upgrade::UpgradeArgs),
}

#[derive(Subcommand)]
enum ValidateWhat {
    /// Validate the running cluster (kOps semantics): every instance group has its Ready nodes, every
    /// node is Ready, every kube-system pod (control plane, kube-proxy, addons) is Ready. Exit 0 valid.
    #[cfg(feature = "cloud")]
    Cluster(commands::ValidateClusterArgs),
}

#[cfg(feature = "cloud")]
#[derive(Subcommand)]
enum Export {
    /// Write a kubeconfig context for the cluster with a short-lived admin certificate signed by
    /// the cluster CA in the state store (merged into ~/.kube/config or --kubeconfig).
    Kubeconfig(commands::ExportKubeconfigArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // `bundle create | push` are long: their progress (each file and image) shows by default.
    let default_filter = if matches!(cli.command, Command::Bundle(_)) { "warn,bundle=info" } else { "warn" };
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("KEELSON_LOG").unwrap_or_else(|_| default_filter.into()))
        .with_writer(std::io::stderr)
        .init();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("keelson: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Print load errors; exit 2 for unreadable/unparseable input, 1 for invalid input.
fn report(errors: &LoadError) -> ExitCode {
    for line in errors.lines() {
        eprintln!("{line}");
    }
    ExitCode::from(if errors.is_unreadable() { 2 } else { 1 })
}

/// The spec's keys kOps drops unread (and so Keelson too), on stderr: every command that reads a
/// spec says so ([`keelson_api::support::dropped`]).
pub(crate) fn print_dropped(file: &std::path::Path, docs: &keelson_api::Documents) {
    for w in keelson_api::support::dropped(docs) {
        eprintln!("keelson: warning: {}: {w}", file.display());
    }
}

/// What a compile of `file` warns about, on stderr.
fn print_warnings(file: &std::path::Path, docs: &keelson_api::Documents, compiled: &spec_compiler::Compiled) {
    print_dropped(file, docs);
    for w in keelson_api::support::not_rendered(docs) {
        eprintln!("keelson: warning: {}: {w} (`keelson validate` and `apply` refuse it)", file.display());
    }
    for w in &compiled.warnings {
        eprintln!("keelson: warning: {}: {w}", file.display());
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Pki(args) => pki_cmd::run(args),
        Command::Bundle(command) => bundle_cmd::run(command),
        Command::Upgrade(Upgrade::Cluster(args)) => upgrade::run(args),
        Command::Create(Create::Cluster(args)) => create_cluster::run(*args),
        Command::Validate { what: Some(what), .. } => match what {
            #[cfg(feature = "cloud")]
            ValidateWhat::Cluster(args) => commands::run_validate_cluster(args),
        },
        Command::Validate { file, what: None } => {
            let file = file.context("keelson validate: give -f SPEC (or `validate cluster -f SPEC`)")?;
            match load_spec(&file) {
                Ok(docs) => {
                    print_dropped(&file, &docs);
                    // What Keelson would not run: refused here (`compile` only warns).
                    let refused = keelson_api::support::not_rendered(&docs);
                    for e in &refused {
                        eprintln!("{}: {e}", file.display());
                    }
                    if !refused.is_empty() {
                        return Ok(ExitCode::from(1));
                    }
                    println!("{}: valid ({} instance groups)", file.display(), docs.instance_groups.len());
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => Ok(report(&e)),
            }
        }
        Command::Compile { file, out, compile, state } => {
            let cas = match &state {
                Some(s) => args::local_pinned_cas(s)?,
                None => Default::default(),
            };
            let options = compile.options(cas)?;
            let docs = match load_spec(&file) {
                Ok(d) => d,
                Err(e) => return Ok(report(&e)),
            };
            let compiled = spec_compiler::compile(&docs, &options).with_context(|| format!("compiling {}", file.display()))?;
            print_warnings(&file, &docs, &compiled);
            let written = compiled.tree.write_to(&out).with_context(|| format!("writing {}", out.display()))?;
            let unchanged = compiled.tree.files.len() - written;
            let unchanged = if unchanged > 0 { format!(" ({unchanged} more unchanged)") } else { String::new() };
            println!("{}: wrote {written} files to {}{unchanged}", file.display(), out.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Get(Get::Assets(args)) => match load_spec(&args.file) {
            Ok(docs) => get_assets::run(&args, &docs),
            Err(e) => Ok(report(&e)),
        },
        #[cfg(feature = "cloud")]
        Command::Get(Get::Instances(args)) => get_instances::run(args),
        #[cfg(feature = "cloud")]
        Command::Get(Get::Keypairs(args)) => keypair_cmd::run_get(args),
        #[cfg(feature = "cloud")]
        Command::Create(Create::Keypair(a)) => keypair_cmd::run_change(
            &a.common,
            &a.keyset,
            keypair_cmd::Change::Create { primary: a.primary, import: a.cert.clone().zip(a.key.clone()) },
            "create keypair",
        ),
        #[cfg(feature = "cloud")]
        Command::Promote(Promote::Keypair(a)) => keypair_cmd::run_change(&a.common, &a.keyset, keypair_cmd::Change::Promote { id: a.id }, "promote keypair"),
        #[cfg(feature = "cloud")]
        Command::Distrust(Distrust::Keypair(a)) => {
            keypair_cmd::run_change(&a.common, &a.keyset, keypair_cmd::Change::Distrust { ids: a.ids }, "distrust keypair")
        }
        #[cfg(feature = "cloud")]
        Command::Apply(args) => commands::run_apply(args),
        #[cfg(feature = "cloud")]
        Command::RollingUpdate(args) => commands::run_rolling_update(args),
        #[cfg(feature = "cloud")]
        Command::Reconcile(Reconcile::Cluster(args)) => reconcile::run(args),
        #[cfg(feature = "cloud")]
        Command::Delete(args) => commands::run_delete(args),
        #[cfg(feature = "cloud")]
        Command::Export(Export::Kubeconfig(args)) => commands::run_export_kubeconfig(args),
        #[cfg(feature = "cloud")]
        Command::Etcd(Etcd::Backup(action)) => etcd_backup::run(action),
        #[cfg(feature = "cloud")]
        Command::Toolbox(Toolbox::Dump(args)) => toolbox::run(args),
    }
}
