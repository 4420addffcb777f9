//! `nodeup --conf BOOTCONFIG [--root DIR] [--target direct|dryrun] [--cache-dir DIR]`

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use nodeup::run::{run, Options};
use nodeup::tasks::Target;

#[derive(Clone, Copy, ValueEnum)]
enum TargetArg {
    Direct,
    Dryrun,
}

#[derive(Parser)]
#[command(name = "nodeup", version, args_override_self = true, about = "Configure this host as a Kubernetes node from its BootConfig")]
struct Cli {
    /// The BootConfig (from user-data).
    #[arg(long)]
    conf: PathBuf,
    /// Make every path relative to DIR; services are then enabled but not started.
    #[arg(long, default_value = "/")]
    root: PathBuf,
    /// `direct` applies changes; `dryrun` prints what would change and changes nothing.
    #[arg(long, value_enum, default_value = "direct")]
    target: TargetArg,
    /// Download cache, keyed by sha256 (default: ROOT/var/cache/nodeup).
    #[arg(long = "cache-dir")]
    cache_dir: Option<PathBuf>,
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
    /// Per-request connect and read-inactivity timeout, seconds.
    #[arg(long = "http-timeout", default_value_t = 30.0)]
    http_timeout: f64,
    /// Rounds over an asset's URLs before giving up.
    #[arg(long = "retry-rounds", default_value_t = 3)]
    retry_rounds: u32,
    /// Backoff before the second round, milliseconds (doubles each round).
    #[arg(long = "retry-backoff-ms", default_value_t = 500)]
    retry_backoff_ms: u64,
    /// Instance metadata (IMDSv2) base URL; default: asked only on a live AWS host
    /// (http://169.254.169.254), for the facts no flag gave.
    #[arg(long = "imds-url")]
    imds_url: Option<String>,
    /// GCE metadata server (`host[:port]`); default: asked only on a live GCE host
    /// (metadata.google.internal, or $GCE_METADATA_HOST), for the facts no flag gave.
    #[arg(long = "gce-metadata")]
    gce_metadata: Option<String>,
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
    let target = match cli.target {
        TargetArg::Direct => Target::Direct,
        TargetArg::Dryrun => Target::DryRun,
    };
    let opts = Options {
        conf: cli.conf,
        root: cli.root,
        target,
        cache_dir: cli.cache_dir,
        arch: cli.arch,
        hostname: cli.hostname,
        internal_ip: cli.internal_ip,
        instance_id: cli.instance_id,
        zone: cli.zone,
        region: cli.region,
        http_timeout: Duration::from_secs_f64(cli.http_timeout.clamp(0.1, 600.0)),
        retry_rounds: cli.retry_rounds.clamp(1, 20),
        retry_backoff: Duration::from_millis(cli.retry_backoff_ms.min(60_000)),
        imds_url: cli.imds_url,
        gce_metadata: cli.gce_metadata,
        renewal_interval,
    };
    let outcome = match run(&opts) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("nodeup: error: {e:#}");
            return ExitCode::from(1);
        }
    };
    for w in &outcome.warnings {
        eprintln!("nodeup: warning: {w}");
    }
    let dry = target == Target::DryRun;
    for r in &outcome.report.results {
        for c in &r.changes {
            println!("{}{}: {c}", if dry { "would: " } else { "" }, r.name);
        }
    }
    for c in &outcome.recorded_commands {
        println!("not run (root {}): {c}", opts.root.display());
    }
    let failed = outcome.report.failed();
    for f in &failed {
        eprintln!("nodeup: error: {}: {}", f.name, f.error.as_deref().unwrap_or(""));
    }
    let n = outcome.report.results.len();
    let m = outcome.report.changed();
    println!("nodeup: {n} tasks, {m} {}", if dry { "would change" } else { "changed" });
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
