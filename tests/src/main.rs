//! `keelson-local`: run a Keelson cluster on this machine. See the crate docs and README.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "keelson-local", about = "Run a Keelson cluster on your machine (moto or a local GCE + systemd-nspawn machines)")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start moto, the asset mirror and the machines, `keelson apply --yes` the spec, and return
    /// when the control plane is healthy.
    Up {
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        /// Seconds to wait for a healthy control plane.
        #[arg(long, default_value_t = 900)]
        timeout: u64,
        /// Boot the machines from a baked image (`keelson bundle create` of the mirror and the
        /// registry, then `keelson bundle bake`): nothing downloaded or unpacked at boot.
        #[arg(long)]
        baked: bool,
        /// Serve the machines only what `keelson bundle push` of that bundle put into an empty
        /// mirror and a fresh registry (the harness's own builds stopped).
        #[arg(long)]
        air_gapped: bool,
        /// How the machines share the host's cores: `shared` (every machine the same CPU weight)
        /// or `boot-priority` (a machine launched later weighs as much as its running neighbours
        /// together until its Node is Ready: half the host, as if a core were its own). See the
        /// README, "Control-plane failover".
        #[arg(long, value_enum, default_value_t = keelson_local::cpu_model::CpuModel::Shared)]
        cpu_model: keelson_local::cpu_model::CpuModel,
    },
    /// Machines, IPs, roles, volumes, containerd and etcd health.
    Ps,
    /// Terminate an instance (AWS: in moto, its autoscaling group replaces it; GCE: `instances.delete`
    /// by name or numeric id, its MIG recreates it under the same name).
    Kill { instance: String },
    /// up, write keys, N cycles of "terminate a random control plane, wait until healed", down.
    Selfheal {
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        #[arg(long, default_value_t = 10)]
        cycles: u32,
        #[arg(long, default_value_t = 1000)]
        keys: u64,
        /// Seconds one cycle may take before it counts as not healed.
        #[arg(long, default_value_t = 300)]
        cycle_timeout: u64,
        #[arg(long, default_value_t = 900)]
        up_timeout: u64,
        /// Seconds `keelson validate cluster` may wait for the cluster to be valid after the last cycle.
        #[arg(long, default_value_t = 300)]
        validate_wait: u64,
        /// Leave the cluster up after the cycles (for further checks); `keelson-local down` removes it.
        #[arg(long)]
        keep_up: bool,
        /// Boot every machine, replacements included, from a baked image (see `up --baked`).
        #[arg(long)]
        baked: bool,
        /// See `up --air-gapped`.
        #[arg(long)]
        air_gapped: bool,
        /// The replacements' CPU model (see `up --cpu-model`); `both`: odd cycles `shared`, even
        /// ones `boot-priority`, with a distribution for each.
        #[arg(long, value_enum, default_value_t = keelson_local::cluster::selfheal::SoakCpu::Shared)]
        cpu_model: keelson_local::cluster::selfheal::SoakCpu,
    },
    /// A fault beyond one control plane (brings the cluster up when none runs), then wait for the
    /// cluster to heal by itself: `chaos NAME: healed in X s, K/K keys intact, C/C ConfigMaps
    /// intact, validate valid`. Exits 1 when it did not.
    Chaos {
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        #[arg(long, value_enum)]
        scenario: keelson_local::cluster::chaos::Scenario,
        #[arg(long, default_value_t = 1000)]
        keys: u64,
        /// Seconds the cluster may take to heal.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
        #[arg(long, default_value_t = 900)]
        up_timeout: u64,
        /// Seconds `keelson validate cluster` may wait once healed.
        #[arg(long, default_value_t = 300)]
        validate_wait: u64,
        /// Leave a cluster this command brought up running at the end.
        #[arg(long)]
        keep_up: bool,
        #[arg(long)]
        baked: bool,
        /// zone-down: seconds the zone stays down.
        #[arg(long, default_value_t = 60)]
        outage: u64,
        /// zone-down: the zone to take down (a control plane's); default: one at random.
        #[arg(long)]
        zone: Option<String>,
        /// store-outage: the store refuses connections (`refuse`) or accepts and never answers (`hang`).
        #[arg(long, default_value = "hang", value_parser = ["hang", "refuse"])]
        store_failure: String,
    },
    /// Run the upstream Kubernetes e2e suite's [Conformance] tests against the local cluster
    /// (docs/conformance.md): by default a focused set of what Keelson sets up; `--full` runs all.
    /// Builds the suite and its images on first use (cached). Exits 1 when a test failed.
    Conformance {
        /// Bring this spec up first (and down afterwards unless --keep-up); else the running cluster.
        #[arg(short = 'f', long = "file")]
        file: Option<PathBuf>,
        /// Ginkgo focus regex instead of the focused set.
        #[arg(long, conflicts_with = "full")]
        focus: Option<String>,
        /// Ginkgo skip regex (added to the default skip of [Disruptive], [Flaky] and [Feature:…]).
        #[arg(long)]
        skip: Option<String>,
        /// Every [Conformance] test (hours on a small machine).
        #[arg(long)]
        full: bool,
        /// Parallel ginkgo processes ([Serial] tests still run alone, at the end).
        #[arg(long, default_value_t = 2)]
        nodes: u32,
        /// Seconds the suite may take (ginkgo's --timeout).
        #[arg(long, default_value_t = keelson_local::conformance::DEFAULT_TIMEOUT_SECS)]
        timeout: u64,
        /// Seconds `up` may take with -f.
        #[arg(long, default_value_t = 900)]
        up_timeout: u64,
        /// Where the JUnit report and ginkgo's log go (default: the state directory's conformance/).
        #[arg(long)]
        report_dir: Option<PathBuf>,
        /// With -f: leave the cluster up afterwards.
        #[arg(long)]
        keep_up: bool,
        /// Run [Disruptive] tests too (they taint nodes and evict pods: use a cluster made for the run).
        #[arg(long)]
        disruptive: bool,
    },
    /// The IAM oracle (AWS): check every request moto has served against the policies of the
    /// instance role whose credentials signed it; exits 1 on a denied or unmappable call.
    IamCheck {
        /// Also write what it decided from (`calls.jsonl`, `evidence.json`) to this directory.
        #[arg(long)]
        save: Option<PathBuf>,
    },
    /// Stop everything and remove every trace (mounts, loop devices, namespaces, processes).
    Down,
    /// Run the cluster's kubectl with the admin kubeconfig: `keelson-local kubectl get nodes`.
    Kubectl {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Make another Kubernetes version available to the running local cloud (built from source,
    /// cached; images in the registry; assets in the mirror; hashes in `$KEELSON_ASSET_HASHES`),
    /// so `keelson upgrade cluster` / `keelson reconcile cluster` work against it.
    Prepare { version: String },
    /// The URLs of a `type: LoadBalancer` Service's load balancer on this host (one per listener),
    /// as the cloud-controller-manager made it in the local cloud: `keelson-local service-url default/echo`.
    ServiceUrl {
        /// `NAMESPACE/NAME`
        service: String,
    },
    /// Print `export` lines so that `keelson …` and `kubectl …` work against the local cluster as
    /// they would against AWS: `eval "$(keelson-local env)"`.
    Env,
    /// The process `up` starts: owns moto, the mirror and the machines.
    #[command(hide = true)]
    Daemon {
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        #[arg(long)]
        baked: bool,
        #[arg(long)]
        air_gapped: bool,
    },
    /// Build (or find) the cached Debian rootfs and print its path.
    Rootfs,
    /// Serve the GCE metadata server for one instance on 169.254.169.254:80 (run inside its namespace).
    #[command(hide = true)]
    GceMetadata {
        #[arg(long)]
        data: PathBuf,
        #[arg(long, default_value = "169.254.169.254:80")]
        listen: String,
    },
    /// Serve IMDSv2 for one instance on 169.254.169.254:80 (run inside its namespace).
    #[command(hide = true)]
    Imds {
        #[arg(long)]
        data: PathBuf,
        #[arg(long, default_value = "169.254.169.254:80")]
        listen: String,
    },
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        eprintln!("keelson-local: {e}");
        let mut src = e.source();
        while let Some(s) = src {
            eprintln!("  caused by: {s}");
            src = s.source();
        }
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    use keelson_local::cluster;
    use std::time::Duration;
    match cli.command {
        Cmd::Up { file, timeout, baked, air_gapped, cpu_model } => {
            cluster::commands::up_cpu(&file, Duration::from_secs(timeout), cluster::Boot { baked, air_gapped }, cpu_model)?
        }
        Cmd::Ps => cluster::ps()?,
        Cmd::Kill { instance } => cluster::kill(&instance)?,
        Cmd::Selfheal { file, cycles, keys, cycle_timeout, up_timeout, validate_wait, keep_up, baked, air_gapped, cpu_model } => {
            let opts = cluster::selfheal::SelfhealOptions {
                boot: cluster::Boot { baked, air_gapped },
                cycles,
                keys,
                cycle_timeout: Duration::from_secs(cycle_timeout),
                up_timeout: Duration::from_secs(up_timeout),
                validate_wait: Duration::from_secs(validate_wait),
                keep_up,
                cpu: cpu_model,
            };
            let r = cluster::selfheal(&file, &opts)?;
            if r.healed < cycles || r.intact != r.keys || r.objects_intact != r.objects || !r.validated || r.iam.as_ref().is_some_and(|c| !c) {
                std::process::exit(1);
            }
        }
        Cmd::Chaos { file, scenario, keys, timeout, up_timeout, validate_wait, keep_up, baked, outage, zone, store_failure } => {
            let opts = cluster::chaos::ChaosOptions {
                boot: cluster::Boot { baked, air_gapped: false },
                keys,
                timeout: Duration::from_secs(timeout),
                up_timeout: Duration::from_secs(up_timeout),
                validate_wait: Duration::from_secs(validate_wait),
                keep_up,
                outage: Duration::from_secs(outage),
                zone,
                store_failure: keelson_local::relay::Outage::parse(&store_failure),
            };
            if !cluster::chaos::chaos(&file, scenario, &opts)?.ok() {
                std::process::exit(1);
            }
        }
        Cmd::Conformance { file, focus, skip, full, nodes, timeout, up_timeout, report_dir, keep_up, disruptive } => {
            use keelson_local::conformance;
            let opts = conformance::Options {
                spec: file,
                focus,
                skip,
                full,
                nodes,
                timeout: Duration::from_secs(timeout),
                up_timeout: Duration::from_secs(up_timeout),
                report_dir,
                keep_up,
                disruptive,
            };
            let outcome = conformance::run(&opts)?;
            print!("{}", conformance::render(&outcome));
            if !outcome.summary.ok() {
                std::process::exit(1);
            }
        }
        Cmd::IamCheck { save } => {
            let evidence = cluster::iam::Evidence::gather()?;
            if let Some(dir) = save {
                evidence.save(&dir)?;
            }
            let report = evidence.check();
            print!("{report}");
            if !report.clean() {
                std::process::exit(1);
            }
        }
        Cmd::Down => {
            let left = cluster::down()?;
            for l in &left {
                println!("removed leftover: {l}");
            }
            println!("keelson-local: down");
        }
        Cmd::Kubectl { args } => {
            let status = cluster::kubectl(&args)?;
            std::process::exit(status.code().unwrap_or(1));
        }
        Cmd::Prepare { version } => {
            let p = cluster::prepare(&version)?;
            println!("keelson-local: Kubernetes v{} prepared ({} new asset(s) in the mirror)", p.version, p.assets.len());
        }
        Cmd::ServiceUrl { service } => {
            for u in cluster::service_urls(&service)? {
                println!("{u}");
            }
        }
        Cmd::Env => print!("{}", cluster::env_exports()?),
        Cmd::Daemon { file, baked, air_gapped } => cluster::run_daemon(&file, cluster::Boot { baked, air_gapped })?,
        Cmd::Rootfs => {
            let p = keelson_local::rootfs::ensure(&keelson_local::paths::cache_dir())?;
            println!("{}", p.display());
        }
        Cmd::GceMetadata { data, listen } => keelson_local::gce::metadata::serve(&keelson_local::gce::metadata::GceMachine::read(&data)?, &listen)?,
        Cmd::Imds { data, listen } => {
            let text = std::fs::read_to_string(&data)?;
            let d: keelson_local::imds::InstanceData = serde_json::from_str(&text)?;
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(async move {
                let l = tokio::net::TcpListener::bind(&listen).await?;
                println!("imds: listening on {listen} for {}", d.instance_id);
                let imds = keelson_local::imds::Imds::new(d);
                keelson_local::httpd::serve(l, std::sync::Arc::new(move |r: &keelson_local::httpd::Request| imds.handle(r))).await;
                Ok::<(), anyhow::Error>(())
            })?;
        }
    }
    Ok(())
}
