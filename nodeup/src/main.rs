//! `nodeup --conf BOOTCONFIG [--root DIR] [--target direct|dryrun] [--cache-dir DIR]`,
//! `nodeup render --conf BOOTCONFIG --out DIR`, `nodeup api-hosts --conf BOOTCONFIG [--root DIR]`

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use nodeup::run::{run, Options};
use nodeup::tasks::Target;

#[derive(Clone, Copy, ValueEnum)]
enum TargetArg {
    Direct,
    Dryrun,
}

#[derive(Parser)]
#[command(
    name = "nodeup",
    version,
    args_override_self = true,
    args_conflicts_with_subcommands = true,
    about = "Configure this host as a Kubernetes node from its BootConfig"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Sub>,
    /// The BootConfig (from user-data).
    #[arg(long)]
    conf: Option<PathBuf>,
    /// Make every path relative to DIR; services are then enabled but not started.
    #[arg(long, default_value = "/")]
    root: PathBuf,
    /// `direct` applies changes; `dryrun` prints what would change and changes nothing.
    #[arg(long, value_enum, default_value = "direct")]
    target: TargetArg,
    /// Download cache, keyed by sha256 (default: ROOT/var/cache/nodeup).
    #[arg(long = "cache-dir")]
    cache_dir: Option<PathBuf>,
    #[command(flatten)]
    facts: FactArgs,
    /// Per-request connect and read-inactivity timeout, seconds.
    #[arg(long = "http-timeout", default_value_t = 30.0)]
    http_timeout: f64,
    /// Rounds over an asset's URLs before giving up.
    #[arg(long = "retry-rounds", default_value_t = 3)]
    retry_rounds: u32,
    /// Token mode: seconds a worker waits for the control planes to publish a valid bootstrap
    /// token before it fails.
    #[arg(long = "bootstrap-token-wait", default_value_t = nodeup::run::BOOTSTRAP_TOKEN_WAIT.as_secs_f64())]
    bootstrap_token_wait: f64,
    /// Backoff before the second round, milliseconds (doubles each round).
    #[arg(long = "retry-backoff-ms", default_value_t = 500)]
    retry_backoff_ms: u64,
    /// kOps' `--retries`: how many times a failed run (`--target direct`) is run again before
    /// nodeup gives up; -1 (the default, as kOps'): until it succeeds. The wait between runs
    /// starts at 5 s and doubles up to kOps' 30 s.
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    retries: i64,
}

/// The first wait between two runs of a failed nodeup, and the longest (kOps' `retryInterval`).
const RERUN_FIRST: Duration = Duration::from_secs(5);
const RERUN_MAX: Duration = Duration::from_secs(30);

/// The wait before run `n` (1 = the first rerun): [`RERUN_FIRST`] doubled each time, at most
/// [`RERUN_MAX`].
fn rerun_wait(n: u32) -> Duration {
    RERUN_FIRST.saturating_mul(1u32 << n.saturating_sub(1).min(8)).min(RERUN_MAX)
}

#[derive(Subcommand)]
enum Sub {
    /// Write what nodeup would write for this BootConfig — files, units, static pod manifests,
    /// kubelet.conf and the kubelet's flags, certificates — into an empty directory DIR, without
    /// downloading, installing or starting anything (those are listed instead).
    Render {
        /// The BootConfig (from user-data).
        #[arg(long)]
        conf: PathBuf,
        /// The directory to write into, as if it were the host's `/` (created; must be empty).
        #[arg(long)]
        out: PathBuf,
        #[command(flatten)]
        facts: FactArgs,
        /// State-store timeout, seconds.
        #[arg(long = "http-timeout", default_value_t = 30.0)]
        http_timeout: f64,
    },
    /// A worker of a cluster without DNS records: set `api.internal.<cluster>` and the join
    /// server's name in the hosts file (and in host-network pods' copies of it) to the API servers
    /// the control planes publish in the state store, once (`keelson-api-hosts.timer` runs it).
    ApiHosts {
        /// The BootConfig (from user-data).
        #[arg(long)]
        conf: PathBuf,
        /// Make every path relative to DIR.
        #[arg(long, default_value = "/")]
        root: PathBuf,
        #[command(flatten)]
        facts: FactArgs,
        /// State-store timeout, seconds.
        #[arg(long = "http-timeout", default_value_t = 30.0)]
        http_timeout: f64,
    },
}

/// The instance's facts: flags win over the metadata services.
#[derive(Args, Clone)]
struct FactArgs {
    /// Asset architecture (amd64, arm64); default: this machine's.
    #[arg(long)]
    arch: Option<String>,
    /// Node name (default: the host name).
    #[arg(long)]
    hostname: Option<String>,
    /// The instance's internal IP (kubelet --node-ip, API-server SAN and advertise address).
    #[arg(long = "internal-ip")]
    internal_ip: Option<IpAddr>,
    #[arg(long = "instance-id")]
    instance_id: Option<String>,
    #[arg(long)]
    zone: Option<String>,
    #[arg(long)]
    region: Option<String>,
    /// Instance metadata (IMDSv2) base URL; default: asked only on a live AWS host
    /// (http://169.254.169.254), for the facts no flag gave.
    #[arg(long = "imds-url")]
    imds_url: Option<String>,
    /// GCE metadata server (`host[:port]`); default: asked only on a live GCE host
    /// (metadata.google.internal, or $GCE_METADATA_HOST), for the facts no flag gave.
    #[arg(long = "gce-metadata")]
    gce_metadata: Option<String>,
}

/// The options of a one-shot subcommand (`render`, `api-hosts`): the host's facts from its flags,
/// one try per fetch.
fn one_shot(
    conf: PathBuf,
    root: PathBuf,
    cache_dir: Option<PathBuf>,
    target: Target,
    facts: FactArgs,
    http_timeout: f64,
    renewal_interval: Duration,
) -> Options {
    Options {
        conf,
        cache_dir,
        root,
        target,
        arch: facts.arch,
        hostname: facts.hostname,
        internal_ip: facts.internal_ip,
        instance_id: facts.instance_id,
        zone: facts.zone,
        region: facts.region,
        http_timeout: Duration::from_secs_f64(http_timeout.clamp(0.1, 600.0)),
        retry_rounds: 1,
        retry_backoff: Duration::ZERO,
        imds_url: facts.imds_url,
        gce_metadata: facts.gce_metadata,
        renewal_interval,
        // Rendering or setting hosts waits for nothing: no token yet is an error at once.
        bootstrap_token_wait: Duration::ZERO,
    }
}

/// `DIR` for `nodeup render`: never the live root, and empty (so it shows exactly one render).
fn render_dir(out: &Path) -> Result<PathBuf, String> {
    std::fs::create_dir_all(out).map_err(|e| format!("creating {}: {e}", out.display()))?;
    let dir = out.canonicalize().map_err(|e| format!("{}: {e}", out.display()))?;
    if dir == Path::new("/") {
        return Err("render --out /: refusing to write into the live root (use `nodeup --conf` to configure this host)".into());
    }
    if std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?.next().is_some() {
        return Err(format!("render --out {}: the directory is not empty", out.display()));
    }
    Ok(dir)
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("NODEUP_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    // Test clusters only: short-lived certificates, renewed within minutes (and checked often
    // enough to see it: a twentieth of the lifetime).
    let mut renewal_interval = nodeup::run::RENEWAL_INTERVAL;
    if let Ok(v) = std::env::var(base::pki::TEST_VALIDITY_ENV) {
        match base::pki::parse_test_validity(&v) {
            Ok(max) => {
                base::pki::set_test_max_validity(max);
                renewal_interval = renewal_interval.min(max / 20);
                tracing::warn!(seconds = max.as_secs(), "TEST ONLY: leaf certificates issued here live at most this long");
            }
            Err(e) => {
                eprintln!("nodeup: error: {e}");
                return ExitCode::from(1);
            }
        }
    }
    let mut only_api_hosts = false;
    // Only a run that configures the host is run again (kOps' `--retries`); a render, a dry run
    // and api-hosts fail at once.
    let mut retries = 0i64;
    let (opts, target) = match cli.command {
        Some(Sub::ApiHosts { conf, root, facts, http_timeout }) => {
            only_api_hosts = true;
            (one_shot(conf, root, None, Target::Direct, facts, http_timeout, renewal_interval), Target::Direct)
        }
        Some(Sub::Render { conf, out, facts, http_timeout }) => {
            let root = match render_dir(&out) {
                Ok(d) => d,
                Err(e) => {
                    eprintln!("nodeup: error: {e}");
                    return ExitCode::from(1);
                }
            };
            let cache = root.join(".nodeup-render-cache");
            (one_shot(conf, root, Some(cache), Target::Render, facts, http_timeout, renewal_interval), Target::Render)
        }
        None => {
            let Some(conf) = cli.conf else {
                eprintln!("nodeup: error: give --conf BOOTCONFIG (or `nodeup render --conf BOOTCONFIG --out DIR`)");
                return ExitCode::from(2);
            };
            let target = match cli.target {
                TargetArg::Direct => Target::Direct,
                TargetArg::Dryrun => Target::DryRun,
            };
            if target == Target::Direct {
                retries = cli.retries;
            }
            let opts = Options {
                conf,
                root: cli.root,
                target,
                cache_dir: cli.cache_dir,
                arch: cli.facts.arch,
                hostname: cli.facts.hostname,
                internal_ip: cli.facts.internal_ip,
                instance_id: cli.facts.instance_id,
                zone: cli.facts.zone,
                region: cli.facts.region,
                http_timeout: Duration::from_secs_f64(cli.http_timeout.clamp(0.1, 600.0)),
                retry_rounds: cli.retry_rounds.clamp(1, 20),
                retry_backoff: Duration::from_millis(cli.retry_backoff_ms.min(60_000)),
                imds_url: cli.facts.imds_url,
                gce_metadata: cli.facts.gce_metadata,
                renewal_interval,
                bootstrap_token_wait: Duration::from_secs_f64(cli.bootstrap_token_wait.clamp(0.0, 24.0 * 3600.0)),
            };
            (opts, target)
        }
    };
    let mut reruns = 0u32;
    loop {
        let code = run_once(&opts, target, only_api_hosts);
        if code == ExitCode::SUCCESS || retries == 0 {
            return code;
        }
        retries = retries.saturating_sub(if retries > 0 { 1 } else { 0 });
        reruns = reruns.saturating_add(1);
        let wait = rerun_wait(reruns);
        eprintln!("nodeup: run {reruns} failed; running again in {} s", wait.as_secs());
        std::thread::sleep(wait);
    }
}

/// One run of nodeup: its report printed, the exit code.
fn run_once(opts: &Options, target: Target, only_api_hosts: bool) -> ExitCode {
    let outcome = match if only_api_hosts { nodeup::run::api_hosts(opts) } else { run(opts) } {
        Ok(o) => o,
        Err(e) => {
            eprintln!("nodeup: error: {e:#}");
            return ExitCode::from(1);
        }
    };
    for w in &outcome.warnings {
        eprintln!("nodeup: warning: {w}");
    }
    if target == Target::Render {
        for r in outcome.report.results.iter().filter(|r| !r.applied) {
            for c in &r.changes {
                println!("not rendered: {}: {c}", r.name);
            }
        }
        for c in &outcome.recorded_commands {
            println!("not run: {c}");
        }
    } else {
        let dry = target == Target::DryRun;
        for r in &outcome.report.results {
            for c in &r.changes {
                println!("{}{}: {c}", if dry { "would: " } else { "" }, r.name);
            }
        }
        for c in &outcome.recorded_commands {
            println!("not run (root {}): {c}", opts.root.display());
        }
    }
    let failed = outcome.report.failed();
    for f in &failed {
        eprintln!("nodeup: error: {}: {}", f.name, f.error.as_deref().unwrap_or(""));
    }
    let n = outcome.report.results.len();
    let m = outcome.report.changed();
    match target {
        Target::Render => {
            let written = outcome.report.results.iter().filter(|r| r.applied).count();
            println!("nodeup: {n} tasks, {written} rendered into {}, {} not rendered", opts.root.display(), m - written);
        }
        Target::DryRun => println!("nodeup: {n} tasks, {m} would change"),
        Target::Direct => println!("nodeup: {n} tasks, {m} changed"),
    }
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reruns_wait_longer_up_to_kops_interval() {
        let waits: Vec<u64> = (1..=6).map(|n| rerun_wait(n).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 30, 30, 30]);
        assert_eq!(rerun_wait(u32::MAX), RERUN_MAX);
    }

    #[test]
    fn retries_is_kops_flag_and_takes_minus_one() {
        let cli = Cli::try_parse_from(["nodeup", "--conf", "/x", "--retries", "-1"]).expect("parses");
        assert_eq!(cli.retries, -1);
        let cli = Cli::try_parse_from(["nodeup", "--conf", "/x"]).expect("parses");
        assert_eq!(cli.retries, -1, "forever unless told otherwise, as kOps");
        let cli = Cli::try_parse_from(["nodeup", "--conf", "/x", "--retries", "0"]).expect("parses");
        assert_eq!(cli.retries, 0);
    }
}
