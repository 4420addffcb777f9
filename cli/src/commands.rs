//! The `keelson apply` and `keelson delete` subcommands (argument types and their runs), kept here so
//! `main.rs` only dispatches.

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;

use base::StateStore;
use cloud_resources::{aws, model, state, terraform};
use ops::rolling;

use crate::cloud_target::CloudTarget;
use crate::prepare::{prepare, prepare_with};
use spec_compiler::complete::CompileOptions;
use spec_compiler::load::load_spec;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Target {
    /// Call the cloud APIs (AWS through the SDK, GCE through the Compute API).
    Direct,
    /// Write Terraform JSON to --out.
    Terraform,
}

/// Options shared by apply and delete.
#[derive(Debug, clap::Args)]
pub struct Common {
    /// The spec file (one Cluster and its InstanceGroups).
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// AWS endpoint (e.g. a local moto server); defaults to $AWS_ENDPOINT_URL, then AWS itself.
    /// On GCE: one base for `<url>/compute/v1` (an emulator); defaults to $KEELSON_GCE_ENDPOINT,
    /// then Google.
    #[arg(long = "endpoint-url")]
    pub endpoint_url: Option<String>,
    /// What a compile makes of the spec (the same flags as `keelson compile`).
    #[command(flatten)]
    pub compile: crate::args::CompileFlags,
    /// Remove the state-store lock a dead run left behind before taking it.
    #[arg(long = "force-unlock")]
    pub force_unlock: bool,
}

/// Run `work` holding the state-store lock (`--yes` runs only). The lock is released when the work
/// ends, fails, or is interrupted with Ctrl-C.
pub(crate) async fn with_lock<T>(
    store: &StateStore,
    operation: &str,
    force_unlock: bool,
    work: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    if force_unlock {
        if let Some(holder) = store.force_unlock().await? {
            eprintln!("keelson: removed the lock held by {holder}");
        }
    }
    let lock = store.lock(operation).await?;
    let result = tokio::select! {
        r = work => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted; rerun to continue where this run stopped")),
    };
    let released = lock.release().await;
    let value = result?;
    released?;
    Ok(value)
}

/// `keelson apply`.
#[derive(Debug, clap::Args)]
pub struct ApplyArgs {
    #[command(flatten)]
    pub common: Common,
    /// Make the changes (without it, only the plan is printed).
    #[arg(long)]
    pub yes: bool,
    #[arg(long, value_enum, default_value = "direct")]
    pub target: Target,
    /// Output directory for --target terraform.
    #[arg(long = "out")]
    pub out: Option<PathBuf>,
}

/// `keelson delete`.
#[derive(Debug, clap::Args)]
pub struct DeleteArgs {
    /// `cluster` (the default: everything apply created) or `instance` (kOps' `delete instance`:
    /// one instance drained and replaced).
    #[arg(value_parser = ["cluster", "instance"])]
    pub what: Option<String>,
    /// With `instance`: the instance's cloud ID or its Node's name.
    #[arg(requires = "what")]
    pub name: Option<String>,
    #[command(flatten)]
    pub common: Common,
    /// Delete (without it, only the plan is printed).
    #[arg(short = 'y', long)]
    pub yes: bool,
    /// Also delete the etcd volumes (the cluster's data).
    #[arg(long = "delete-volumes")]
    pub delete_volumes: bool,
    /// `delete instance`: start the replacement before the instance goes, as the group's
    /// `rollingUpdate.maxSurge` allows (kOps' `--surge`, default true; control planes never surge).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub surge: bool,
    /// `delete instance`: how the instance is drained and replaced (the `rolling-update` flags).
    #[command(flatten)]
    pub roll: RollArgs,
}

/// `keelson rolling-update [cluster]` (kOps' `rolling-update cluster` flags and defaults).
#[derive(Debug, clap::Args)]
pub struct RollingUpdateArgs {
    /// `cluster` (kOps' spelling: `keelson rolling-update cluster -f SPEC`); optional.
    #[arg(value_parser = ["cluster"])]
    pub what: Option<String>,
    #[command(flatten)]
    pub common: Common,
    /// Replace (without it, only the groups and what needs replacing are shown).
    #[arg(short = 'y', long)]
    pub yes: bool,
    /// Only this instance group (repeatable, or comma-separated).
    #[arg(long = "instance-group", value_delimiter = ',')]
    pub instance_groups: Vec<String>,
    /// Only groups of these roles (ControlPlane (or Master), APIServer, Node, Bastion; comma-separated).
    #[arg(long = "instance-group-roles", value_delimiter = ',', value_parser = parse_role)]
    pub instance_group_roles: Vec<keelson_api::Role>,
    /// Replace every instance, outdated or not.
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub roll: RollArgs,
}

/// How instances are replaced: the flags `rolling-update` and `reconcile cluster` share (kOps'
/// names and defaults).
#[derive(Debug, Clone, clap::Args)]
pub struct RollArgs {
    /// Pause after each control-plane termination (Go duration).
    #[arg(long = "control-plane-interval", alias = "master-interval", default_value = "15s", value_parser = go_duration)]
    pub control_plane_interval: std::time::Duration,
    /// Pause after each node or API server termination.
    #[arg(long = "node-interval", default_value = "15s", value_parser = go_duration)]
    pub node_interval: std::time::Duration,
    /// Pause after each bastion termination.
    #[arg(long = "bastion-interval", default_value = "15s", value_parser = go_duration)]
    pub bastion_interval: std::time::Duration,
    /// Longest drain of one node.
    #[arg(long = "drain-timeout", default_value = "15m", value_parser = go_duration)]
    pub drain_timeout: std::time::Duration,
    /// Pause after each drain.
    #[arg(long = "post-drain-delay", default_value = "5s", value_parser = go_duration)]
    pub post_drain_delay: std::time::Duration,
    /// Longest wait for the cluster to validate (and for a replacement to be InService).
    #[arg(long = "validation-timeout", default_value = "15m", value_parser = go_duration)]
    pub validation_timeout: std::time::Duration,
    /// Consecutive validations needed after each replacement (0: none).
    #[arg(long = "validate-count", default_value_t = 2)]
    pub validate_count: u32,
    /// Stop when a node cannot be drained (`--fail-on-drain-error=false` terminates it anyway).
    #[arg(long = "fail-on-drain-error", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub fail_on_drain_error: bool,
    /// Stop when the cluster does not validate (`=false` logs and goes on; never for control planes).
    #[arg(long = "fail-on-validate-error", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub fail_on_validate_error: bool,
    /// Poll period while waiting on the cloud.
    #[arg(long = "poll-interval", default_value = "10s", value_parser = go_duration)]
    pub poll_interval: std::time::Duration,
    /// Instead of `keelson validate cluster` (the default), a command that must exit 0 before each
    /// group and after each replacement (e.g. a cluster health check); split on whitespace. Nodes
    /// are not drained.
    #[arg(long = "validate-command", conflicts_with = "cloudonly")]
    pub validate_command: Option<String>,
    /// Trust the cloud alone (InService): no validation and no drain (will cause downtime).
    #[arg(long)]
    pub cloudonly: bool,
    /// The kubeconfig used to validate and drain (default $KUBECONFIG, then ~/.kube/config; its
    /// context named after the cluster when there is one).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
}

/// kOps' role names, case-insensitive (`Master` is the older `ControlPlane`).
fn parse_role(s: &str) -> Result<keelson_api::Role, String> {
    let known = ["ControlPlane", "Master", "APIServer", "Node", "Bastion"];
    known
        .iter()
        .find(|k| k.eq_ignore_ascii_case(s.trim()))
        .and_then(|k| keelson_api::Role::parse(k))
        .ok_or_else(|| format!("invalid instance group role {s:?} (one of {})", known.join(", ")))
}

pub(crate) fn go_duration(s: &str) -> Result<std::time::Duration, String> {
    let d: keelson_api::Duration = s.parse().map_err(|e| format!("{s:?}: {e}"))?;
    u64::try_from(d.as_nanos()).map(std::time::Duration::from_nanos).map_err(|_| format!("{s:?}: must not be negative"))
}

pub(crate) fn load(common: &Common) -> anyhow::Result<Result<(keelson_api::Documents, CompileOptions), ExitCode>> {
    let options = common.compile.options(Default::default())?;
    let docs = match load_spec(&common.file) {
        Ok(d) => d,
        Err(e) => {
            for line in e.lines() {
                eprintln!("{line}");
            }
            return Ok(Err(ExitCode::from(if e.is_unreadable() { 2 } else { 1 })));
        }
    };
    Ok(Ok((docs, options)))
}

/// A spec loaded for a command that changes the cloud, not yet compiled: its documents and compile
/// options, and where the cluster lives (enough to open the state store and pin its CAs; the
/// command then compiles once, [`with_pinned_cas`]).
pub(crate) struct Located {
    pub docs: keelson_api::Documents,
    pub options: CompileOptions,
    pub at: model::Location,
    /// The spec file, as errors name it.
    pub file: String,
}

/// Load the spec and find where its cluster lives; `Err(code)` when the spec is unreadable,
/// invalid or names what Keelson does not build (its problems already printed).
pub(crate) fn load_for_cloud(common: &Common) -> anyhow::Result<Result<Located, ExitCode>> {
    let (docs, options) = match load(common)? {
        Ok(x) => x,
        Err(code) => return Ok(Err(code)),
    };
    let file = common.file.display().to_string();
    crate::print_dropped(&common.file, &docs);
    // A cluster is built only from what Keelson runs: no silently missing addon or CNI.
    let refused = keelson_api::support::not_rendered(&docs);
    for e in &refused {
        eprintln!("{file}: {e}");
    }
    if !refused.is_empty() {
        return Ok(Err(ExitCode::from(1)));
    }
    let at = model::locate(&docs.cluster).with_context(|| format!("{file}: where the cluster lives"))?;
    let mut options = options;
    if keelson_api::addon_roles::on_own_roles(&docs.cluster.spec) && options.aws_account.is_none() {
        // The ARNs of the addons' roles, in the addon manifests the state store gets, name it.
        let account = runtime()?.block_on(async {
            let t = aws_target(common, &at.region).await;
            let me = t.sts.get_caller_identity().send().await.context("STS GetCallerIdentity")?;
            me.account().map(str::to_string).ok_or_else(|| anyhow::anyhow!("STS GetCallerIdentity named no account"))
        });
        options.aws_account = Some(account.with_context(|| {
            format!(
                "{file}: spec.iam.useServiceAccountExternalPermissions: the AWS account the addons' roles are in (give --aws-account-id to skip the lookup)"
            )
        })?);
    }
    Ok(Ok(Located { docs, options, at, file }))
}

/// Compile the spec with `cas` pinned and build its cloud model, printing the compiler's warnings:
/// the one compile of a command that changes the cloud.
fn compile_model(
    docs: &keelson_api::Documents,
    options: &CompileOptions,
    cas: std::collections::BTreeMap<String, String>,
    file: &str,
) -> anyhow::Result<(model::ClusterModel, spec_compiler::Compiled)> {
    let options = CompileOptions { cas, ..options.clone() };
    let (model, compiled) = prepare(docs, &options).with_context(|| format!("{file}: building the cloud model"))?;
    for w in &compiled.warnings {
        eprintln!("keelson: warning: {file}: {w}");
    }
    Ok((model, compiled))
}

/// Load the spec and build its cloud model (user-data not needed); `Err(code)` when the spec is
/// unreadable or invalid (its problems already printed).
fn load_model(common: &Common) -> anyhow::Result<Result<model::ClusterModel, ExitCode>> {
    let (docs, options) = match load(common)? {
        Ok(x) => x,
        Err(code) => return Ok(Err(code)),
    };
    let file = common.file.display().to_string();
    let (model, _) = prepare_with(&docs, &options, false).with_context(|| format!("{file}: building the cloud model"))?;
    Ok(Ok(model))
}

/// The state store at `config_base`; `s3` is the client for an `s3://` base.
pub(crate) fn open_store(config_base: &str, s3: Option<aws_sdk_s3::Client>) -> anyhow::Result<StateStore> {
    let base: base::ConfigBase = config_base.parse()?;
    Ok(StateStore::open_with_s3(&base, s3, std::time::Duration::from_secs(30))?)
}

pub(crate) fn color() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}

pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the async runtime")
}

pub(crate) async fn aws_target(common: &Common, region: &str) -> aws::AwsTarget {
    let opts = cloud::AwsOptions { region: Some(region.to_string()), endpoint_url: common.endpoint_url.clone(), ..Default::default() };
    aws::AwsTarget::new(&opts, &[]).await
}

/// The cluster CAs' trusted certificates in the state store (name → PEM bundle, the primary's
/// first), to pin into the NodeupConfigs: during a CA rotation hosts trust every key not yet
/// distrusted, and a change of the trusted keys or the primary is a new launch configuration to roll.
async fn pinned_cas(store: &StateStore) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    let mut out = std::collections::BTreeMap::new();
    for name in base::pki::PINNED_CAS {
        let rel = base::pki::issued_keyset_key(name);
        if let Some(bytes) = store.get(&rel).await? {
            out.insert(name.to_string(), base::pki::parse_keyset_trust(name, &bytes).with_context(|| store.url(&rel))?);
        }
    }
    Ok(out)
}

/// The model again, compiled with the CAs `store` holds pinned into every NodeupConfig.
/// With `best_effort` (a plan that writes nothing), a store that cannot be read is a warning.
pub(crate) async fn with_pinned_cas(
    docs: &keelson_api::Documents,
    options: &CompileOptions,
    store: &StateStore,
    file: &str,
    best_effort: bool,
) -> anyhow::Result<(model::ClusterModel, spec_compiler::Compiled)> {
    let cas = match pinned_cas(store).await {
        Ok(cas) => cas,
        Err(e) if best_effort => {
            eprintln!("keelson: warning: {file}: reading the cluster CA from {}: {e:#}", store.base());
            Default::default()
        }
        Err(e) => return Err(e),
    };
    if cas.is_empty() {
        eprintln!(
            "keelson: warning: {file}: no cluster CA in {} yet: the plan shows user-data without it (`--yes` creates the CA first and pins it)",
            store.base()
        );
    }
    compile_model(docs, options, cas, file)
}

pub fn run_apply(args: ApplyArgs) -> anyhow::Result<ExitCode> {
    let Located { docs, options, at, file } = match load_for_cloud(&args.common)? {
        Ok(l) => l,
        Err(code) => return Ok(code),
    };
    let rt = runtime()?;
    match args.target {
        Target::Terraform => {
            let out = args.out.clone().ok_or_else(|| anyhow::anyhow!("--target terraform needs --out DIR"))?;
            let model = rt.block_on(async {
                let s3 = if at.config_base.starts_with("s3://") { Some(aws_target(&args.common, &at.region).await.s3) } else { None };
                let store = match open_store(&at.config_base, s3) {
                    Ok(store) => store,
                    Err(e) if !args.yes => {
                        eprintln!("keelson: warning: {file}: the state store {}: {e:#}: the user-data pins no cluster CA", at.config_base);
                        let (model, _) = compile_model(&docs, &options, Default::default(), &file)?;
                        println!("state store not written (give --yes to write {})", at.config_base);
                        return Ok(model);
                    }
                    Err(e) => return Err(e),
                };
                if !args.yes {
                    let (model, _) = with_pinned_cas(&docs, &options, &store, &file, true).await?;
                    println!("state store not written (give --yes to write {})", model.config_base);
                    return Ok::<_, anyhow::Error>(model);
                }
                // Terraform manages the cloud; the state store is written here, as kOps does: the CA
                // first, so that it is pinned into the NodeupConfigs the user-data boots.
                with_lock(&store, "apply --target terraform", args.common.force_unlock, async {
                    let created = state::ensure_pki(&store, &at.etcd_clusters, at.encryption_config).await?;
                    let (model, compiled) = with_pinned_cas(&docs, &options, &store, &file, false).await?;
                    for (rel, bytes) in &model.state {
                        if store.get(rel).await?.as_deref() != Some(bytes.as_slice()) {
                            store.put(rel, bytes).await?;
                        }
                    }
                    println!("state store {}: up to date ({} keysets created)", store.base(), created.len());
                    if let Some((url, issuer)) = crate::discovery::target(&compiled.completed) {
                        let s3 = if url.starts_with("s3://") { Some(aws_target(&args.common, &at.region).await.s3) } else { None };
                        let written = crate::discovery::publish(&store, &open_store(&url, s3)?, &issuer).await?;
                        println!("service-account issuer discovery {url}: up to date ({written} documents written)");
                    }
                    Ok(model)
                })
                .await
            })?;
            let tree = terraform::render(&model)?;
            tree.write_to(&out).with_context(|| format!("writing {}", out.display()))?;
            println!("{file}: wrote {} and {} data files to {}", terraform::MAIN_FILE, tree.files.len() - 1, out.display());
            Ok(ExitCode::SUCCESS)
        }
        Target::Direct => rt.block_on(direct_apply(&args, &docs, &options, &at, &file)),
    }
}

pub fn run_delete(args: DeleteArgs) -> anyhow::Result<ExitCode> {
    match (args.what.as_deref(), args.name.as_deref()) {
        (Some("instance"), Some(name)) => return crate::delete_instance::run(&args, name),
        (Some("instance"), None) => anyhow::bail!("keelson delete instance: name the instance (its ID or its Node's name)"),
        (_, Some(name)) => anyhow::bail!("keelson delete cluster takes no name ({name:?}): the cluster is the spec's (-f)"),
        _ => {}
    }
    let model = match load_model(&args.common)? {
        Ok(m) => m,
        Err(code) => return Ok(code),
    };
    let rt = runtime()?;
    rt.block_on(direct_delete(&args, &model))
}

async fn direct_apply(args: &ApplyArgs, docs: &keelson_api::Documents, options: &CompileOptions, at: &model::Location, file: &str) -> anyhow::Result<ExitCode> {
    let target = CloudTarget::of(&args.common, at, "apply").await?;
    let store = target.store(&at.config_base)?;
    if !args.yes {
        let (model, _) = with_pinned_cas(docs, options, &store, file, false).await?;
        let planned = target.plan_apply(&model, &store).await?;
        print!("{}", planned.plan().render(color()));
        if !planned.plan().is_empty() {
            println!("Run with --yes to apply.");
        }
        return Ok(ExitCode::SUCCESS);
    }
    // Plan under the lock, so the plan executed is the one computed against the current state;
    // the CA first, pinned into the NodeupConfigs (and so into the user-data's BootConfig hash).
    with_lock(&store, "apply", args.common.force_unlock, async {
        state::ensure_pki(&store, &at.etcd_clusters, at.encryption_config).await?;
        let (model, compiled) = with_pinned_cas(docs, options, &store, file, false).await?;
        // The issuer's documents before the OIDC provider and roles that trust it.
        if let Some((url, issuer)) = crate::discovery::target(&compiled.completed) {
            let written = crate::discovery::publish(&store, &target.store(&url)?, &issuer).await?;
            if written > 0 {
                println!("service-account issuer discovery {url}: {written} documents written");
            }
        }
        let mut planned = target.plan_apply(&model, &store).await?;
        print!("{}", planned.plan().render(color()));
        if planned.plan().is_empty() {
            return Ok(());
        }
        let n = target.execute(&model, &store, &mut planned).await?;
        println!("applied {n} changes to cluster {}", model.cluster);
        if !planned.plan().rolling.is_empty() {
            println!("Run `keelson rolling-update -f {} --yes` to replace the instances listed above.", args.common.file.display());
        }
        Ok(())
    })
    .await?;
    Ok(ExitCode::SUCCESS)
}

impl RollArgs {
    /// The rolling update's options from these flags and the spec's `rollingUpdate` blocks (surge);
    /// validation is the cloud's alone until [`RollArgs::validation`] is asked for.
    pub fn options(&self, docs: &keelson_api::Documents) -> rolling::RollingOptions {
        rolling::RollingOptions {
            control_plane_interval: self.control_plane_interval,
            node_interval: self.node_interval,
            bastion_interval: self.bastion_interval,
            drain_timeout: self.drain_timeout,
            post_drain_delay: self.post_drain_delay,
            validation_timeout: self.validation_timeout,
            validate_count: self.validate_count,
            fail_on_drain_error: self.fail_on_drain_error,
            fail_on_validate_error: self.fail_on_validate_error,
            poll: self.poll_interval,
            // kOps' surge: spec.rollingUpdate (on AWS maxSurge defaults to 1).
            surge: Some(ops::surge::SurgeSpec::from_documents(docs)),
            ..Default::default()
        }
    }

    /// How the cluster is validated: by default (as kOps) through the Kubernetes API, which also
    /// drains; `--validate-command`; or the cloud alone with `--cloudonly`.
    pub async fn validation(&self, cluster: &str, command: &str) -> anyhow::Result<rolling::Validation> {
        if let Some(c) = &self.validate_command {
            return Ok(rolling::Validation::Command(c.split_whitespace().map(str::to_string).collect()));
        }
        if self.cloudonly {
            return Ok(rolling::Validation::CloudOnly);
        }
        let kube = ops::validate::kube_client(self.kubeconfig.as_deref(), cluster)
            .await
            .with_context(|| format!("{command} validates and drains through the Kubernetes API (give --cloudonly to trust the cloud alone)"))?;
        Ok(rolling::Validation::Cluster(kube))
    }
}

pub fn run_rolling_update(args: RollingUpdateArgs) -> anyhow::Result<ExitCode> {
    let (docs, options) = match load(&args.common)? {
        Ok(x) => x,
        Err(code) => return Ok(code),
    };
    let file = args.common.file.display().to_string();
    let (model, _) = prepare_with(&docs, &options, false).with_context(|| format!("{file}: building the cloud model"))?;
    let mut opts = rolling::RollingOptions {
        groups: args.instance_groups.clone(),
        roles: args.instance_group_roles.clone(),
        force: args.force,
        ..args.roll.options(&docs)
    };
    runtime()?.block_on(async {
        let target = CloudTarget::of(&args.common, &model.location(), "rolling-update").await.with_context(|| file.clone())?;
        let groups = target.instance_groups(&model);
        // By default the cluster is validated and nodes drained through the Kubernetes API (as kOps,
        // which needs it even to show what would be replaced: annotated nodes count).
        opts.validate = args.roll.validation(&model.cluster, "rolling-update").await?;
        let status = rolling::status(groups.as_ref(), &opts).await.map_err(|e| match e {
            e @ rolling::RollingError::Drain(_) => {
                anyhow::Error::new(e).context("cannot reach the Kubernetes API; use --cloudonly to roll without confirming progress with it")
            }
            e => e.into(),
        })?;
        print!("{}", ops::groups::render(&status));
        let pending: usize = status.iter().map(|g| g.outdated().len()).sum();
        if pending == 0 {
            println!("No rolling update required.");
            return Ok(ExitCode::SUCCESS);
        }
        if !args.yes {
            println!("{pending} instance(s) need replacing. Run with --yes to replace them.");
            return Ok(ExitCode::SUCCESS);
        }
        let store = target.store(&model.config_base)?;
        let report = with_lock(&store, "rolling-update", args.common.force_unlock, async {
            Ok(rolling::roll_groups(groups.clone(), &opts, &mut |line| println!("{line}")).await?)
        })
        .await?;
        println!("rolling update of cluster {} done: {} instance(s) replaced", model.cluster, report.replaced.len());
        Ok(ExitCode::SUCCESS)
    })
}

async fn direct_delete(args: &DeleteArgs, model: &model::ClusterModel) -> anyhow::Result<ExitCode> {
    let target = CloudTarget::of(&args.common, &model.location(), "delete").await?;
    let store = target.store(&model.config_base)?;
    if !args.yes {
        let planned = target.plan_delete(model, &store, args.delete_volumes).await?;
        print!("{}", planned.plan().render(color()));
        if !planned.plan().is_empty() {
            println!("Run with --yes to delete.");
        }
        return Ok(ExitCode::SUCCESS);
    }
    with_lock(&store, "delete", args.common.force_unlock, async {
        let mut planned = target.plan_delete(model, &store, args.delete_volumes).await?;
        print!("{}", planned.plan().render(color()));
        let n = target.execute(model, &store, &mut planned).await?;
        println!("deleted {n} resources of cluster {}", model.cluster);
        Ok(())
    })
    .await?;
    Ok(ExitCode::SUCCESS)
}

/// `keelson export kubeconfig`.
#[derive(Debug, clap::Args)]
pub struct ExportKubeconfigArgs {
    #[command(flatten)]
    pub common: Common,
    /// Issue a cluster-admin client certificate (group system:masters) signed by the cluster CA.
    #[arg(long)]
    pub admin: bool,
    /// How long the admin certificate is valid (Go duration: 18h, 30m, 2h30m).
    #[arg(long, default_value = "18h")]
    pub ttl: String,
    /// The kubeconfig to merge into; defaults to the first path of $KUBECONFIG, then ~/.kube/config.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The API server URL; defaults to `https://<masterPublicName>` (`api.<cluster>`).
    #[arg(long)]
    pub server: Option<String>,
    /// The certificate's user name (CN).
    #[arg(long, default_value = "admin")]
    pub user: String,
}

fn default_kubeconfig() -> anyhow::Result<PathBuf> {
    if let Some(first) = std::env::var_os("KUBECONFIG").and_then(|v| std::env::split_paths(&v).find(|p| !p.as_os_str().is_empty())) {
        return Ok(first);
    }
    let home = std::env::var_os("HOME").filter(|h| !h.is_empty()).ok_or_else(|| anyhow::anyhow!("neither --kubeconfig, $KUBECONFIG nor $HOME is set"))?;
    Ok(PathBuf::from(home).join(".kube").join("config"))
}

pub fn run_export_kubeconfig(args: ExportKubeconfigArgs) -> anyhow::Result<ExitCode> {
    if !args.admin {
        anyhow::bail!("only `--admin` credentials can be exported (the cluster has no other authentication for users)");
    }
    let ttl: keelson_api::Duration = args.ttl.parse().map_err(|e| anyhow::anyhow!("--ttl: {e}"))?;
    let ttl = std::time::Duration::from_nanos(u64::try_from(ttl.as_nanos()).map_err(|_| anyhow::anyhow!("--ttl {}: must be positive", args.ttl))?);
    let (docs, options) = match load(&args.common)? {
        Ok(x) => x,
        Err(code) => return Ok(code),
    };
    let file = args.common.file.display().to_string();
    let (model, compiled) = prepare_with(&docs, &options, false).with_context(|| format!("{file}: completing the spec"))?;
    let completed = &compiled.completed;
    let server = match &args.server {
        Some(s) => s.clone(),
        None => {
            let name = completed.spec.master_public_name.clone().unwrap_or_else(|| format!("api.{}", model.cluster));
            format!("https://{name}")
        }
    };
    let rt = runtime()?;
    let keyset = rt.block_on(async {
        let s3 = if model.config_base.starts_with("s3://") { Some(aws_target(&args.common, &model.region).await.s3) } else { None };
        let store = open_store(&model.config_base, s3)?;
        let rel = format!("pki/private/{}/keyset.yaml", super::kubeconfig::CLIENT_CA);
        store.get(&rel).await?.ok_or(super::kubeconfig::KubeconfigError::NoCa(rel)).map_err(anyhow::Error::from)
    })?;
    let cred = super::kubeconfig::issue_admin(&keyset, &args.user, ttl)?;
    let path = match &args.kubeconfig {
        Some(p) => p.clone(),
        None => default_kubeconfig()?,
    };
    super::kubeconfig::write_merged(&path, &model.cluster, &server, &cred)?;
    println!(
        "kubeconfig {}: context {} (server {server}, user {} in {}, valid {})",
        path.display(),
        model.cluster,
        args.user,
        super::kubeconfig::ADMIN_GROUP,
        args.ttl
    );
    Ok(ExitCode::SUCCESS)
}

/// Output format of `keelson validate cluster`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ValidateOutput {
    Table,
    Json,
}

/// `keelson validate cluster`.
#[derive(Debug, clap::Args)]
pub struct ValidateClusterArgs {
    #[command(flatten)]
    pub common: Common,
    /// Keep validating until the cluster is valid or this much time has passed (Go duration).
    #[arg(long, value_parser = go_duration)]
    pub wait: Option<std::time::Duration>,
    /// Consecutive successful validations required (with --wait, 10 s apart).
    #[arg(long, default_value_t = 1)]
    pub count: u32,
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    pub output: ValidateOutput,
    /// The kubeconfig to use (default $KUBECONFIG, then ~/.kube/config; its context named after the
    /// cluster when there is one).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
}

/// `keelson validate cluster`: exit 0 when valid, 1 when not (or on error).
pub fn run_validate_cluster(args: ValidateClusterArgs) -> anyhow::Result<ExitCode> {
    let model = match load_model(&args.common)? {
        Ok(m) => m,
        Err(code) => return Ok(code),
    };
    runtime()?.block_on(async {
        let groups = CloudTarget::of(&args.common, &model.location(), "validate cluster").await?.instance_groups(&model);
        let kube = ops::validate::kube_client(args.kubeconfig.as_deref(), &model.cluster).await?;
        let deadline = args.wait.map(|w| std::time::Instant::now() + w);
        let mut passes = 0;
        loop {
            let result = groups.validate(&kube).await;
            let report = match result {
                Ok(r) => Some(r),
                // While waiting, an API that is not up yet is one more reason to wait.
                Err(e) if deadline.is_some() => {
                    eprintln!("keelson: validate: {e:#}");
                    None
                }
                Err(e) => return Err(e.into()),
            };
            let valid = report.as_ref().is_some_and(|r| r.valid());
            passes = if valid { passes + 1 } else { 0 };
            let done = passes >= args.count.max(1);
            let out_of_time = deadline.is_none_or(|d| std::time::Instant::now() >= d);
            if done || out_of_time {
                if let Some(r) = &report {
                    match args.output {
                        ValidateOutput::Table => print!("{}", r.render()),
                        ValidateOutput::Json => println!("{}", serde_json::to_string_pretty(r)?),
                    }
                }
                return Ok(if done { ExitCode::SUCCESS } else { ExitCode::from(1) });
            }
            if let Some(r) = report.as_ref().filter(|r| !r.valid()) {
                eprintln!(
                    "keelson: validate: {} problem(s), retrying (first: {} {}: {})",
                    r.failures.len(),
                    r.failures[0].kind,
                    r.failures[0].name,
                    r.failures[0].message
                );
            }
            tokio::time::sleep(std::time::Duration::from_secs(10)).await;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: RollingUpdateArgs,
    }

    fn parse(args: &[&str]) -> Result<RollingUpdateArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("rolling-update").chain(args.iter().copied())).map(|c| c.args)
    }

    #[test]
    fn rolling_update_takes_kops_flags_with_kops_defaults() {
        let a = parse(&["-f", "c.yaml"]).expect("today's form");
        assert_eq!(a.what, None);
        let secs = std::time::Duration::from_secs;
        assert_eq!((a.roll.control_plane_interval, a.roll.node_interval, a.roll.bastion_interval), (secs(15), secs(15), secs(15)));
        assert_eq!((a.roll.drain_timeout, a.roll.post_drain_delay, a.roll.validation_timeout), (secs(900), secs(5), secs(900)));
        assert_eq!(a.roll.validate_count, 2);
        assert!(a.roll.fail_on_drain_error && a.roll.fail_on_validate_error && !a.roll.cloudonly && !a.force && !a.yes);
        let a = parse(&[
            "cluster",
            "-f",
            "c.yaml",
            "--instance-group",
            "nodes-a",
            "--instance-group",
            "nodes-b,nodes-c",
            "--instance-group-roles",
            "master,Node",
            "--control-plane-interval",
            "1m",
            "--node-interval",
            "2s",
            "--bastion-interval",
            "0s",
            "--drain-timeout",
            "5m",
            "--post-drain-delay",
            "90s",
            "--validation-timeout",
            "10m",
            "--validate-count",
            "3",
            "--fail-on-drain-error=false",
            "--fail-on-validate-error=false",
            "--cloudonly",
            "--force",
            "--yes",
        ])
        .expect("kOps' form");
        assert_eq!(a.what.as_deref(), Some("cluster"));
        assert_eq!(a.instance_groups, ["nodes-a", "nodes-b", "nodes-c"]);
        assert_eq!(a.instance_group_roles, [keelson_api::Role::ControlPlane, keelson_api::Role::Node]);
        assert_eq!((a.roll.control_plane_interval, a.roll.node_interval, a.roll.bastion_interval), (secs(60), secs(2), secs(0)));
        assert_eq!((a.roll.drain_timeout, a.roll.post_drain_delay, a.roll.validation_timeout, a.roll.validate_count), (secs(300), secs(90), secs(600), 3));
        assert!(!a.roll.fail_on_drain_error && !a.roll.fail_on_validate_error && a.roll.cloudonly && a.force && a.yes);
        assert!(parse(&["-f", "c.yaml", "--fail-on-drain-error"]).expect("bare flag").roll.fail_on_drain_error);
        assert_eq!(parse(&["-f", "c.yaml", "--master-interval", "3s"]).expect("kOps' old name").roll.control_plane_interval, secs(3));
        let err = parse(&["-f", "c.yaml", "--instance-group-roles", "worker"]).expect_err("unknown role").to_string();
        assert!(err.contains("invalid instance group role \"worker\""), "{err}");
        assert!(parse(&["nodes", "-f", "c.yaml"]).is_err(), "only `cluster` may come first");
    }
}
