//! `protokube --conf BOOTCONFIG [--root DIR] [--once] …`: read the BootConfig and this group's
//! protokube config (the compiler's plan), connect to the cloud, and start the controllers. Each
//! controller owns its loop and its metrics in the library; this file only wires them.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;

use keelson_api::nodeup::NodeBootstrapMethod;
use keelson_api::CloudProvider;
use protokube::args::{secs, Args};
use protokube::config::{self, DnsMode};
use protokube::metrics::Metrics;
use protokube::node_join::start::Common;
use protokube::reconcile::run::{self as agent_loop, Ended, Settings};
use protokube::reconcile::{Agent, Options};
use protokube::shutdown::{self, Bounds, LocalApi, StopSignals};

async fn run(args: Args) -> anyhow::Result<()> {
    let started = Instant::now();
    test_only_certificate_validity()?;
    let boot = config::read_boot_config(&args.conf)?;
    let mut clients = protokube::clients::connect(&args, &boot).await?;
    let store = clients.store.clone();
    let plan = config::read_plan(&store, &boot).await?;
    let me = clients.me.clone();
    tracing::info!(?me, cluster = %plan.cluster_name, group = %plan.instance_group, "starting");
    let (once, live) = (args.once, args.live());
    let metrics = Metrics::default();

    let opts = Options {
        root: args.root.clone(),
        store: store.clone(),
        by_id_dir: args.by_id_dir.clone(),
        hosts_file: args.hosts_file(),
        attach_timeout: secs(args.attach_timeout),
        device_timeout: secs(args.device_timeout),
        etcd_timeout: Duration::from_secs(2),
        // Backup stores may be on S3 whatever the state store is.
        s3: Some(clients.s3.clone()),
        restore_tool: args.etcd_restore_tool.clone(),
        stop_timeout: secs(args.stop_timeout),
        quorum_loss_wait: secs(args.quorum_loss_wait),
        pass_timeout: secs(args.pass_timeout),
        clock: protokube::backup::Clock::from_env(),
    };
    match &opts.restore_tool {
        Some(t) => tracing::info!(tool = %t.display(), "etcd restores use"),
        None => tracing::info!(
            "etcd restores use the etcd image's etcdutl through ctr, else etcdutl on PATH, else etcdctl (etcd before 3.6), looked up when a restore runs"
        ),
    }
    // The sandbox image, then the etcd images, while the volumes are still being claimed.
    if live && !once {
        protokube::images::prepull_at_start(&plan);
    }
    // The plan, re-read in loop mode: the etcd and backup controllers follow its changes.
    let mut plans = match once {
        true => tokio::sync::watch::channel(plan.clone()).1,
        false => config::watch(store.clone(), boot.clone(), plan.clone(), secs(args.spec_interval)),
    };
    if !once && !args.no_backups {
        let backups = protokube::backup::BackupLoop::new(
            args.root.clone(),
            me.internal_ip.clone(),
            plan.cluster_name.clone(),
            opts.s3.clone(),
            metrics.clone(),
            opts.clock,
        );
        tokio::spawn(backups.run(plans.clone(), secs(args.backup_poll)));
    }
    if !once {
        let renewer = protokube::certs::Renewer::for_control_plane(&plan, args.root.clone(), store.clone(), &me);
        tokio::spawn(protokube::certs::run(renewer, metrics.clone(), secs(args.cert_check_interval)));
    }
    // This control plane behind the API load balancer only while its API server is ready.
    let api_target = (!once && boot.cloud_provider == CloudProvider::Aws && plan.api_load_balancer)
        .then(|| protokube::api_target::start(clients.elbv2(), &plan, &me.instance_id, store.clone()));

    let route53 = matches!(plan.dns, DnsMode::Zone { .. }).then(|| clients.route53());
    let gce_compute = clients.gce_compute();
    let (volumes, dns) = protokube::gce::providers(clients.gce.take(), cloud::Ec2::new(clients.ec2.clone()), route53);
    let mut agent = Agent::new(plan.clone(), me.clone(), opts, volumes, dns);
    // How protokube leaves when it is stopped ([`shutdown::leave`]).
    let bounds = Bounds { handover: secs(args.handover_timeout), api_drain: secs(args.api_drain_seconds) };
    let local_api = LocalApi::new(store.clone(), &plan, !once && live);

    if !once && args.metrics_addr != "off" {
        let listener = tokio::net::TcpListener::bind(&args.metrics_addr).await.with_context(|| format!("metrics address {}", args.metrics_addr))?;
        tracing::info!(addr = %args.metrics_addr, "serving /metrics and /healthz");
        tokio::spawn(protokube::metrics::serve(listener, metrics.clone(), secs(args.interval * 3.0 + args.attach_timeout)));
    }
    if !once {
        start_cluster_controllers(&args, &boot, &clients, &plan, gce_compute, &metrics).await?;
    }

    let mut stop = StopSignals::listen().context("SIGTERM handler")?;
    let settings = Settings { once, interval: secs(args.interval), max_backoff: secs(args.max_backoff), started };
    match agent_loop::run(&mut agent, &mut plans, settings, &metrics, &clients.calls, &mut stop).await? {
        Ended::Once(r) if !r.refused.is_empty() => anyhow::bail!("{} volume(s) refused (see above); nothing was formatted", r.refused.len()),
        Ended::Once(_) => Ok(()),
        Ended::Stopped(why) => {
            shutdown::leave(&agent, api_target, why, bounds, live, &local_api).await;
            Ok(())
        }
    }
}

/// The controllers that act for the whole cluster from every control plane (loop mode): addons,
/// bootstrap tokens (token mode), node labels and the node join server.
async fn start_cluster_controllers(
    args: &Args,
    boot: &keelson_api::nodeup::BootConfig,
    clients: &protokube::clients::Clients,
    plan: &config::Plan,
    gce_compute: Option<(cloud::gce::ComputeReader, String)>,
    metrics: &Metrics,
) -> anyhow::Result<()> {
    let (store, server) = (&clients.store, plan.local_api_server());
    // This control plane's Node name (the kubelet's), known before its Node registers.
    let own_node = clients.own_node_name(args.node_name.clone()).await;
    if !args.no_addons {
        tokio::spawn(protokube::addons::run(store.clone(), server.clone(), secs(args.addons_interval), metrics.clone(), own_node.clone()));
    }
    // The cloud that says which group an instance name belongs to (AWS and GCE).
    let node_cloud = || protokube::node_labels::node_cloud(gce_compute.clone(), boot.cloud_provider, &clients.ec2, &plan.cluster_name, store);
    // Token mode: bootstrap tokens that expire and rotate, and each worker's first certificate
    // approved by name ([`protokube::node_bootstrap`]), on every control plane.
    if plan.node_bootstrap == NodeBootstrapMethod::Token {
        let cloud = node_cloud();
        tracing::info!(cloud_lookup = cloud.is_some(), "workers join by bootstrap token: rotating tokens and approving first certificates");
        tokio::spawn(protokube::node_bootstrap::run(store.clone(), server.clone(), cloud, own_node, metrics.clone()));
    }
    // The node labeller: each Node gets its instance group's labels, the group found from the cloud.
    if !args.no_node_labels {
        match node_cloud() {
            Some(cloud) => {
                tokio::spawn(protokube::node_labels::run(store.clone(), server, cloud, metrics.clone()));
            }
            None => {
                tracing::warn!(cloud = %boot.cloud_provider, "node labels: no instance lookup on this cloud; Nodes are not labelled with their groups' labels")
            }
        }
    }
    // The node join server: needs the cluster CA's key (control planes only) and AWS or GCE.
    if args.join_listen != "off" {
        let common = Common { plan, store: store.clone(), listen: &args.join_listen, metrics: metrics.clone() };
        match (gce_compute, boot.cloud_provider) {
            (Some((compute, project)), _) => {
                protokube::node_join::start::start_gce(common, compute, project, clients.me.region.clone(), args.gce_jwks_url.clone()).await?
            }
            (None, CloudProvider::Aws) => protokube::node_join::start::start_aws(common, &clients.aws, clients.ec2.clone(), &clients.me.region).await?,
            (None, _) => {}
        }
    }
    Ok(())
}

/// Test clusters only: short-lived certificates, so renewal is seen within minutes.
fn test_only_certificate_validity() -> anyhow::Result<()> {
    if let Ok(v) = std::env::var(base::pki::TEST_VALIDITY_ENV) {
        let max = base::pki::parse_test_validity(&v).map_err(anyhow::Error::msg)?;
        base::pki::set_test_max_validity(max);
        tracing::warn!(seconds = max.as_secs(), "TEST ONLY: leaf certificates issued here live at most this long");
    }
    Ok(())
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("PROTOKUBE_LOG").unwrap_or_else(|_| "info".into()))
        .init();
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("protokube: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("protokube: {e:#}");
            ExitCode::FAILURE
        }
    }
}
