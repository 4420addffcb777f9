//! One nodeup run: BootConfig → NodeupConfig (hash-pinned) → tasks → report.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::api_hosts::ApiHostsTask;
use crate::assets::{FetchOptions, Fetcher};
use crate::config::{self, StateStore};
use base::instance::{resolve, Source};

use crate::facts::Facts;
use crate::host::Host;
use crate::model::{self, Inputs};
use crate::nodetasks::Ctx;
use crate::tasks::{self, Report, Target};

/// Options of a run (the command line, parsed).
#[derive(Debug, Clone)]
pub struct Options {
    pub conf: PathBuf,
    pub root: PathBuf,
    pub target: Target,
    pub cache_dir: Option<PathBuf>,
    pub arch: Option<String>,
    pub hostname: Option<String>,
    pub internal_ip: Option<IpAddr>,
    pub instance_id: Option<String>,
    pub zone: Option<String>,
    pub region: Option<String>,
    pub http_timeout: Duration,
    pub retry_rounds: u32,
    pub retry_backoff: Duration,
    /// IMDS base URL; by default IMDS is asked only on a live AWS host (root `/`).
    pub imds_url: Option<String>,
    /// GCE metadata server (`host[:port]`); by default asked only on a live GCE host.
    pub gce_metadata: Option<String>,
    /// How often a worker runs nodeup again to renew its certificates ([`RENEWAL_INTERVAL`]).
    pub renewal_interval: Duration,
    /// Token mode: how long a worker waits for the control planes to publish a valid bootstrap
    /// token ([`BOOTSTRAP_TOKEN_WAIT`]).
    pub bootstrap_token_wait: Duration,
}

/// How long a worker of a token-mode cluster waits for a bootstrap token: the control planes
/// publish the first within a minute of their API servers coming up, which on a new cluster can
/// take a while after the workers boot.
pub const BOOTSTRAP_TOKEN_WAIT: Duration = Duration::from_secs(20 * 60);

/// How often workers run nodeup again (certificate renewal): hourly; a year-long certificate is
/// renewed with four months to spare, so an hour's delay (or a day of failed runs) is nothing.
pub const RENEWAL_INTERVAL: Duration = Duration::from_secs(3600);

/// What happened.
pub struct Outcome {
    pub report: Report,
    pub warnings: Vec<String>,
    pub recorded_commands: Vec<String>,
}

fn hostname(root: &Path) -> String {
    let from = |p: &Path| std::fs::read_to_string(p).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
    if root == Path::new("/") {
        from(Path::new("/proc/sys/kernel/hostname")).unwrap_or_else(|| "localhost".into())
    } else {
        from(&root.join("etc/hostname")).unwrap_or_else(|| "localhost".into())
    }
}

/// What every run starts from: the BootConfig, the instance's facts and the state store.
struct Prepared {
    boot_bytes: Vec<u8>,
    boot: keelson_api::nodeup::BootConfig,
    role: keelson_api::Role,
    host: Host,
    facts: Facts,
    store: Arc<StateStore>,
}

/// Read the BootConfig, the instance's facts (flags, then the metadata service) and open the
/// state store; nothing on the host is touched.
fn prepare(opts: &Options) -> anyhow::Result<Prepared> {
    use anyhow::Context as _;
    let boot_bytes = std::fs::read(&opts.conf).with_context(|| format!("reading BootConfig {}", opts.conf.display()))?;
    let boot = config::load_boot_config(&opts.conf)?;
    let role = config::boot_role(&boot, &opts.conf)?;
    let host = Host::new(&opts.root);
    let flags = base::instance::Overrides {
        instance_id: opts.instance_id.clone(),
        zone: opts.zone.clone(),
        region: opts.region.clone(),
        internal_ip: opts.internal_ip.map(|ip| ip.to_string()),
        hostname: opts.hostname.clone().filter(|h| !h.is_empty()),
        instance_name: None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the I/O runtime")?;
    // Instance facts: flags win; then IMDSv2 on a live AWS host (or when --imds-url is given).
    // On GCE: the metadata server (flags still win).
    let gce_metadata = opts
        .gce_metadata
        .clone()
        .or_else(|| (host.is_live() && boot.cloud_provider == keelson_api::CloudProvider::Gce).then(|| base::gce_metadata::DEFAULT_HOST.to_string()));
    let imds_url = opts
        .imds_url
        .clone()
        .or_else(|| (host.is_live() && boot.cloud_provider == keelson_api::CloudProvider::Aws).then(|| base::imds::DEFAULT_BASE_URL.to_string()));
    let instance = if let Some(host) = &gce_metadata {
        let md = base::gce_metadata::GceMetadata::new(Some(host), opts.http_timeout)?;
        runtime
            .block_on(resolve::<base::imds::Imds>(&flags, Source::Gce(&md)))
            .context("reading instance facts from the GCE metadata server (override with --hostname, --internal-ip, --zone)")?
    } else if let Some(url) = &imds_url {
        let imds = base::imds::Imds::new(Some(url))?;
        runtime
            .block_on(resolve(&flags, Source::Aws(&imds)))
            .context("reading instance facts from IMDS (override with --hostname, --internal-ip, --instance-id, --zone, --region)")?
    } else {
        base::instance::InstanceFacts::from_flags(&flags)
    };
    let arch = opts.arch.clone().unwrap_or_else(|| crate::assets::host_arch().to_string());
    let mut facts = Facts { imds_url: imds_url.clone(), gce_metadata, ..Facts::from_instance(arch, instance) };
    let config_base = &boot.config_base;
    let store = match config_base {
        base::ConfigBase::S3 { .. } => {
            let region = facts.region.clone().or_else(|| facts.zone.as_deref().and_then(keelson_api::plan::region_of_zone).map(str::to_string));
            let aws_opts = base::aws::AwsOptions { region, imds_endpoint: imds_url.clone(), ..Default::default() };
            let s3 = runtime.block_on(async {
                let conf = base::aws::sdk_config(&aws_opts).await;
                aws_sdk_s3::Client::from_conf(base::aws::s3_config(&conf, false).build())
            });
            base::StateStore::open_with_s3(config_base, Some(s3), opts.http_timeout)?
        }
        _ => base::StateStore::open(config_base, opts.http_timeout)?,
    };
    let store = Arc::new(StateStore::with_runtime(store, runtime));
    if facts.hostname.is_empty() {
        facts.hostname = hostname(&opts.root);
    }
    Ok(Prepared { boot_bytes, boot, role, host, facts, store })
}

/// Everything up to (not including) running the tasks; errors here mean nothing was touched.
pub fn run(opts: &Options) -> anyhow::Result<Outcome> {
    let Prepared { boot_bytes, boot, role, host, facts, store } = prepare(opts)?;
    let cache = opts.cache_dir.clone().unwrap_or_else(|| host.path(crate::paths::CACHE_DIR));
    let fetcher = Fetcher::new(
        FetchOptions {
            connect_timeout: opts.http_timeout,
            read_timeout: opts.http_timeout,
            rounds: opts.retry_rounds,
            backoff: opts.retry_backoff,
            ..Default::default()
        },
        cache,
    )?;
    let cfg = config::fetch_nodeup_config(&boot, role, &store)?;
    let model = model::build(&Inputs {
        boot: &boot,
        boot_bytes: &boot_bytes,
        role,
        config: &cfg,
        facts: &facts,
        store: &store,
        renewal_interval: opts.renewal_interval,
        bootstrap_token_wait: opts.bootstrap_token_wait,
    })?;
    if opts.target == Target::Direct {
        // A killed earlier run may have left temp files next to its targets.
        let mut dirs = BTreeSet::new();
        for t in &model.tasks {
            for p in t.paths() {
                if let Some(d) = Path::new(&p).parent() {
                    dirs.insert(host.path(d));
                }
            }
        }
        dirs.insert(fetcher.cache_dir().join("sha256"));
        for d in dirs {
            base::fs::clean_temp_files(&d);
        }
    }
    let report = tasks::run(&model.tasks, &Ctx { host: &host, assets: &fetcher }, opts.target)?;
    Ok(Outcome { report, warnings: model.warnings, recorded_commands: host.recorded() })
}

/// `nodeup api-hosts`: only the worker's hosts entries for the control plane
/// ([`crate::api_hosts`]), asked once: what `keelson-api-hosts.timer` runs between full runs.
pub fn api_hosts(opts: &Options) -> anyhow::Result<Outcome> {
    let Prepared { boot, role, host, store, .. } = prepare(opts)?;
    if role != keelson_api::Role::Node {
        anyhow::bail!("{}: api-hosts is for workers (this BootConfig is for role {})", opts.conf.display(), boot.instance_group_role);
    }
    let fetcher = Fetcher::new(FetchOptions::default(), opts.cache_dir.clone().unwrap_or_else(|| host.path(crate::paths::CACHE_DIR)))?;
    let task: Box<crate::nodetasks::NodeTask> = Box::new(ApiHostsTask { store, cluster: boot.cluster_name.clone(), wait: Duration::ZERO });
    let report = tasks::run(&[task], &Ctx { host: &host, assets: &fetcher }, opts.target)?;
    Ok(Outcome { report, warnings: Vec::new(), recorded_commands: host.recorded() })
}
