//! `protokube --conf BOOTCONFIG [--root DIR] [--once] …`

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;

use cloud::calls::CallCounter;
use cloud::Elbv2;
use cloud::{AwsOptions, Ec2, Identity, Imds, Route53Dns};
use protokube::api_target::{ApiTarget, LocalReadyz};
use protokube::config::{self, DnsMode};
use protokube::metrics::{self, Metrics};
use protokube::paths;
use protokube::reconcile::{Agent, Options, Report};

#[derive(Debug, Parser)]
#[command(name = "protokube", args_override_self = true, about = "Claim and mount etcd volumes, write etcd manifests, keep control-plane DNS true")]
struct Args {
    /// BootConfig written by user-data (names the ConfigBase, cluster and instance group).
    #[arg(long)]
    conf: PathBuf,
    /// Every host path is taken relative to this directory.
    #[arg(long, default_value = "/")]
    root: PathBuf,
    /// One reconcile pass, then exit.
    #[arg(long)]
    once: bool,
    /// Identity overrides (default: IMDSv2).
    #[arg(long)]
    instance_id: Option<String>,
    #[arg(long)]
    zone: Option<String>,
    #[arg(long)]
    region: Option<String>,
    #[arg(long)]
    internal_ip: Option<String>,
    /// This control plane's Node name (default: IMDS `local-hostname`, the kubelet's name).
    #[arg(long)]
    node_name: Option<String>,
    /// IMDS base URL (default http://169.254.169.254 or AWS_EC2_METADATA_SERVICE_ENDPOINT); on GCE
    /// the metadata server (default GCE_METADATA_HOST, else metadata.google.internal).
    #[arg(long)]
    imds_url: Option<String>,
    /// AWS endpoint (e.g. a local moto server); AWS_ENDPOINT_URL is honoured too. On GCE the base
    /// URL of Compute (`<url>/compute/v1`) and Cloud DNS (`<url>/dns/v1`), e.g. the emulators'.
    #[arg(long)]
    endpoint_url: Option<String>,
    /// Where volume device links appear (NVMe names).
    #[arg(long, default_value = paths::DEFAULT_BY_ID_DIR)]
    by_id_dir: PathBuf,
    /// Hosts file for the hosts-file DNS provider (default: <root>/etc/hosts).
    #[arg(long)]
    hosts_file: Option<PathBuf>,
    /// Seconds between passes when converged.
    #[arg(long, default_value_t = 5.0)]
    interval: f64,
    /// Longest wait after repeated failures, in seconds.
    #[arg(long, default_value_t = 60.0)]
    max_backoff: f64,
    /// Seconds one pass waits for an attachment.
    #[arg(long, default_value_t = 60.0)]
    attach_timeout: f64,
    /// Seconds one pass waits for the device node.
    #[arg(long, default_value_t = 30.0)]
    device_timeout: f64,
    /// Seconds between re-reads of the completed spec in loop mode.
    #[arg(long, default_value_t = 60.0)]
    spec_interval: f64,
    /// Metrics and health address (loop mode); `off` disables.
    #[arg(long, default_value_t = format!("127.0.0.1:{}", keelson_api::ports::PROTOKUBE_METRICS))]
    metrics_addr: String,
    /// Seconds between addon-controller passes (loop mode).
    #[arg(long, default_value_t = 20.0)]
    addons_interval: f64,
    /// Do not run the addon controller.
    #[arg(long)]
    no_addons: bool,
    /// Do not label Nodes with their instance group's labels (loop mode; AWS and GCE).
    #[arg(long)]
    no_node_labels: bool,
    /// Where the node join server listens (workers prove their instance identity and get their
    /// kubelet and kube-proxy certificates); `off` disables it.
    #[arg(long, default_value_t = format!("0.0.0.0:{}", keelson_api::ports::NODE_JOIN))]
    join_listen: String,
    /// GCE: where the join server reads Google's token-signing keys (a JWK set, cached); `$KEELSON_GCE_JWKS_URL`
    /// names another (an emulator's).
    #[arg(long, env = base::node_join_gce::JWKS_URL_ENV, default_value = base::node_join_gce::GOOGLE_JWKS_URL)]
    gce_jwks_url: String,
    /// Seconds between checks of the etcd backup schedule and of backup requests (loop mode).
    #[arg(long, default_value_t = 10.0)]
    backup_poll: f64,
    /// Take no etcd backups on this instance.
    #[arg(long)]
    no_backups: bool,
    /// The tool that restores etcd snapshots: an `etcdutl` or `etcdctl` binary, or `ctr` to run
    /// `etcdutl` from the member's etcd image (default: `etcdutl`, `ctr`, `etcdctl`, on PATH).
    #[arg(long)]
    etcd_restore_tool: Option<PathBuf>,
    /// Seconds one pass waits for an etcd member to stop before a restore moves its data aside.
    #[arg(long, default_value_t = 60.0)]
    stop_timeout: f64,
    /// Seconds a member on a blank volume waits for a peer before it reports lost quorum (and
    /// points at `keelson etcd backup restore`).
    #[arg(long, default_value_t = 300.0)]
    quorum_loss_wait: f64,
    /// Seconds one reconcile pass may take before it is abandoned (it is level-triggered: the next
    /// pass continues from what is there).
    #[arg(long, default_value_t = 600.0)]
    pass_timeout: f64,
    /// Longest wait, in seconds, between checks of this host's certificates (loop mode); the next
    /// check comes sooner when a renewal falls due sooner.
    #[arg(long, default_value_t = 300.0)]
    cert_check_interval: f64,
    /// Longest time, in seconds, protokube spends handing etcd leadership over when it is stopped
    /// (SIGTERM or SIGINT, loop mode) before it exits; protokube.service's TimeoutStopSec is above
    /// the default.
    #[arg(long, default_value_t = protokube::handover::DEFAULT_BOUND.as_secs_f64())]
    handover_timeout: f64,
    /// Seconds the API server keeps serving at poweroff after this control plane left the API
    /// target group, for the load balancer to stop sending it new connections (overlaps the etcd
    /// hand-over; see protokube's README).
    #[arg(long, default_value_t = protokube::poweroff::API_DRAIN.as_secs_f64())]
    api_drain_seconds: f64,
}

/// The GCE side of the flags: `--imds-url` names the metadata server, `--endpoint-url` the base of
/// Compute and Cloud DNS.
fn gce_flags(args: &Args) -> protokube::gce::GceFlags {
    protokube::gce::GceFlags {
        metadata: args.imds_url.clone(),
        endpoint: args.endpoint_url.clone(),
        instance_name: args.instance_id.clone(),
        zone: args.zone.clone(),
        region: args.region.clone(),
        internal_ip: args.internal_ip.clone(),
        node_name: args.node_name.clone(),
        operation_bound: secs(args.attach_timeout),
    }
}

/// The cluster CA (its key) and the bound listener of the node join server.
async fn join_ca_and_listener(store: &base::StateStore, listen: &str) -> anyhow::Result<(base::pki::Keypair, std::net::TcpListener)> {
    let keyset = store.get_required("pki/private/kubernetes-ca/keyset.yaml").await.context("node join server: the cluster CA")?;
    let ca = base::pki::parse_private_keyset("kubernetes-ca", &keyset).context("node join server: the cluster CA")?;
    let listener = std::net::TcpListener::bind(listen).with_context(|| format!("node join address {listen}"))?;
    Ok((ca, listener))
}

/// The join server's admission: its default limits, the cluster's pod network held to the slots
/// not reserved for instances.
fn join_admission(cluster: &keelson_api::Cluster) -> protokube::node_join::limits::Admission {
    let spec = &cluster.spec;
    let (pod, non_masq) = (spec.pod_cidr.as_ref().map(|c| c.to_string()), spec.non_masquerade_cidr.as_ref().map(|c| c.to_string()));
    let nets = keelson_api::nodeup::pod_network(pod.as_deref(), non_masq.as_deref()).and_then(|n| n.parse().ok()).into_iter().collect();
    protokube::node_join::limits::Admission::with_pod_networks(Default::default(), nets)
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s.max(0.0))
}

fn summary(r: &Report) -> String {
    format!("protokube: {} volumes mounted, {} manifests written, {} dns records", r.volumes_mounted, r.manifests_written, r.dns_records)
}

async fn run(args: Args) -> anyhow::Result<()> {
    let started = Instant::now();
    // Test clusters only: short-lived certificates, so renewal is seen within minutes.
    if let Ok(v) = std::env::var(base::pki::TEST_VALIDITY_ENV) {
        let max = base::pki::parse_test_validity(&v).map_err(anyhow::Error::msg)?;
        base::pki::set_test_max_validity(max);
        tracing::warn!(seconds = max.as_secs(), "TEST ONLY: leaf certificates issued here live at most this long");
    }
    let boot = config::read_boot_config(&args.conf)?;
    let imds = Imds::new(args.imds_url.as_deref())?;
    // GCE: identity from its metadata server (--imds-url points at it), disks and Cloud DNS.
    let gce = match boot.cloud_provider.as_str() {
        "gce" => Some(protokube::gce::connect(gce_flags(&args)).await?),
        _ => None,
    };
    let me = match &gce {
        Some(g) => g.identity.clone(),
        None => Identity::resolve(&imds, args.instance_id, args.zone, args.region, args.internal_ip)
            .await
            .context("instance identity (pass --instance-id --zone --region --internal-ip off AWS)")?,
    };
    let gce_node_name = gce.as_ref().map(|g| g.node_name.clone());
    let aws = cloud::sdk_config(&AwsOptions {
        region: Some(me.region.clone()),
        endpoint_url: args.endpoint_url.clone(),
        imds_endpoint: args.imds_url.clone(),
        ..Default::default()
    })
    .await;
    let counter = gce.as_ref().map(|g| g.calls.clone()).unwrap_or_else(CallCounter::default);
    let config_base: base::ConfigBase = boot.config_base.parse()?;
    let s3_client = aws_sdk_s3::Client::from_conf(base::aws::s3_config(&aws, args.endpoint_url.is_some()).interceptor(counter.clone()).build());
    let s3 = matches!(config_base, base::ConfigBase::S3 { .. }).then(|| s3_client.clone());
    let store = base::StateStore::open_with_s3(&config_base, s3, std::time::Duration::from_secs(20))?;
    let cluster = config::read_completed_spec(&store).await?;
    let plan = config::plan(&boot, &cluster)?;
    // Backup stores may be on S3 whatever the state store is.
    let backup_s3 = Some(s3_client);
    let clock = test_clock();
    tracing::info!(?me, cluster = %plan.cluster_name, group = %plan.instance_group, "starting");

    let ec2_conf = aws_sdk_ec2::config::Builder::from(&aws).interceptor(counter.clone());
    // Test hook (feature `test-hooks` only): answer the first N EC2 calls with RequestLimitExceeded
    // (the real retry policy must absorb them).
    #[cfg(feature = "test-hooks")]
    let ec2_conf = match std::env::var("PROTOKUBE_INJECT_EC2_THROTTLES").ok().and_then(|v| v.parse::<u32>().ok()) {
        Some(n) => {
            tracing::warn!(count = n, "injecting EC2 throttling responses");
            ec2_conf.interceptor(cloud::fault::Throttle::new(cloud::fault::ThrottleKind::Ec2RequestLimitExceeded, n))
        }
        None => ec2_conf,
    };
    let ec2 = aws_sdk_ec2::Client::from_conf(ec2_conf.build());
    let dns = match plan.dns {
        DnsMode::Route53 { .. } => {
            Some(Route53Dns::new(aws_sdk_route53::Client::from_conf(aws_sdk_route53::config::Builder::from(&aws).interceptor(counter.clone()).build())))
        }
        DnsMode::Hosts => None,
    };
    let hosts_file = args.hosts_file.clone().unwrap_or_else(|| paths::under(&args.root, &format!("/{}", paths::HOSTS_FILE)));
    let opts = Options {
        root: args.root.clone(),
        store,
        by_id_dir: args.by_id_dir.clone(),
        hosts_file,
        attach_timeout: secs(args.attach_timeout),
        device_timeout: secs(args.device_timeout),
        etcd_timeout: Duration::from_secs(2),
        s3: backup_s3.clone(),
        restore_tool: args.etcd_restore_tool.clone(),
        stop_timeout: secs(args.stop_timeout),
        quorum_loss_wait: secs(args.quorum_loss_wait),
        pass_timeout: secs(args.pass_timeout),
        clock,
    };
    match &opts.restore_tool {
        Some(t) => tracing::info!(tool = %t.display(), "etcd restores use"),
        None => tracing::info!(
            "etcd restores use the etcd image's etcdutl through ctr, else etcdutl on PATH, else etcdctl (etcd before 3.6), looked up when a restore runs"
        ),
    }
    // The sandbox image, then the etcd images, while the volumes are still being claimed
    // ([`protokube::images`]).
    if args.root == Path::new("/") && !args.once {
        match protokube::images::on_path("ctr") {
            Some(ctr) => {
                let mine = plan.etcd_clusters.iter().filter(|ec| !plan.my_members(ec).is_empty());
                let etcd = protokube::images::distinct_images(mine.map(|ec| ec.image.as_str()));
                let manifest = Path::new(&plan.static_pod_dir).join("kube-apiserver.manifest");
                tokio::spawn(async move {
                    let containerd_config = Path::new("/").join(paths::CONTAINERD_CONFIG);
                    if let Some(sandbox) = protokube::images::configured_sandbox_image(&containerd_config, Duration::from_secs(5)).await {
                        protokube::images::prepull(&ctr, &[sandbox]).await;
                    }
                    protokube::images::prepull(&ctr, &etcd).await;
                    if let Some(image) = protokube::images::api_server_image(&manifest, Duration::from_secs(5)).await {
                        protokube::images::prepull(&ctr, &[image]).await;
                    }
                });
            }
            None => tracing::warn!("no ctr on PATH: the kubelet pulls the etcd images when it starts etcd"),
        }
    }
    let spec_store = opts.store.clone();
    let (join_cluster, join_ec2, region) = (plan.cluster_name.clone(), ec2.clone(), me.region.clone());
    let label_ec2 = ec2.clone();
    let bootstrap_ec2 = ec2.clone();
    let (plan_tx, plan_rx) = tokio::sync::watch::channel(plan.clone());
    let metrics = Metrics::default();
    if !args.once && !args.no_backups {
        let mut backup_loop =
            protokube::backup::BackupLoop::new(args.root.clone(), me.internal_ip.clone(), plan.cluster_name.clone(), backup_s3, metrics.clone(), clock);
        let poll = secs(args.backup_poll);
        tokio::spawn(async move {
            loop {
                let plan = plan_rx.borrow().clone();
                backup_loop.tick(&plan).await;
                tokio::time::sleep(poll).await;
            }
        });
    }
    let api_port = cluster.spec.kube_api_server.as_ref().and_then(|a| a.secure_port).unwrap_or(443);
    if !args.once {
        // API server restarts for new certificates take turns in etcd main (one at a time).
        let api_server_restart = plan.etcd_clusters.iter().find(|c| c.name == "main").and_then(|main| {
            let member = plan.my_members(main).first()?.name.clone();
            Some(protokube::apiserver_turn::Coordinator {
                root: args.root.clone(),
                cluster_name: plan.cluster_name.clone(),
                internal_ip: me.internal_ip.clone(),
                etcd: main.clone(),
                member,
                host: me.instance_id.clone(),
                readyz: tokio::sync::Mutex::new(LocalReadyz::new(spec_store.clone(), format!("https://127.0.0.1:{api_port}"))),
            })
        });
        let renewer = protokube::certs::Renewer {
            root: args.root.clone(),
            store: spec_store.clone(),
            host: me.instance_id.clone(),
            bundles: protokube::certs::control_plane_bundles(
                &plan.etcd_clusters.iter().map(|c| c.name.clone()).collect::<Vec<_>>(),
                protokube::certs::kubelet_reloads_serving_cert(&cluster.spec),
            ),
            manifests_dir: plan.static_pod_dir.clone(),
            api_server_restart,
        };
        tokio::spawn(certificate_loop(renewer, metrics.clone(), secs(args.cert_check_interval)));
    }
    // This control plane behind the API load balancer only while its API server is ready.
    let api_lb = cluster.spec.api.as_ref().is_some_and(|a| a.load_balancer.is_some());
    let api_target = (!args.once && boot.cloud_provider == "aws" && api_lb).then(|| {
        let elb =
            aws_sdk_elasticloadbalancingv2::Client::from_conf(aws_sdk_elasticloadbalancingv2::config::Builder::from(&aws).interceptor(counter.clone()).build());
        let target = ApiTarget::new(Elbv2::new(elb), keelson_api::names::api_target_group_name(&plan.cluster_name), me.instance_id.clone());
        let readyz = LocalReadyz::new(spec_store.clone(), format!("https://127.0.0.1:{api_port}"));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        (stop, tokio::spawn(target.run(readyz, stopped)))
    });
    let gce_join = gce.as_ref().map(|g| (g.compute.clone(), g.project.clone()));
    let (volumes, dns) = protokube::gce::providers(gce, Ec2::new(ec2), dns);
    let mut agent = Agent::new(plan, me, opts, volumes, dns);
    let mut spec_read_at = Instant::now();
    // How protokube leaves when it is stopped ([`leave`]).
    let bounds = Bounds { handover: secs(args.handover_timeout), api_drain: secs(args.api_drain_seconds) };
    let live = args.root == Path::new("/");
    let local_api = LocalApi {
        store: spec_store.clone(),
        server: format!("https://127.0.0.1:{api_port}"),
        leadership: std::sync::Arc::new(protokube::leadership::Prepared::default()),
    };
    if !args.once && live {
        let (prepared, store, server) = (local_api.leadership.clone(), local_api.store.clone(), local_api.server.clone());
        tokio::spawn(async move { prepared.keep_ready(&store, &server, Duration::from_secs(5)).await });
    }

    if !args.once && args.metrics_addr != "off" {
        let listener = tokio::net::TcpListener::bind(&args.metrics_addr).await.with_context(|| format!("metrics address {}", args.metrics_addr))?;
        tracing::info!(addr = %args.metrics_addr, "serving /metrics and /healthz");
        tokio::spawn(metrics::serve(listener, metrics.clone(), secs(args.interval * 3.0 + args.attach_timeout)));
    }

    // This control plane's Node name (the kubelet's), known before its Node registers.
    let own_node = match (args.once, args.node_name.clone().or(gce_node_name)) {
        (true, _) => None,
        (false, Some(n)) => Some(n),
        (false, None) => match base::imds::InstanceMetadata::get(&imds, "local-hostname").await {
            Ok(n) => n.filter(|n| !n.is_empty()),
            Err(e) => {
                tracing::warn!(error = %e, "no local-hostname from IMDS: this node will not be labelled as a control plane");
                None
            }
        },
    };
    // The addon controller (its own loop): the local API server, on the spec's secure port.
    if !args.once && !args.no_addons {
        let server = format!("https://127.0.0.1:{api_port}");
        tokio::spawn(protokube::addons::run(spec_store.clone(), server, secs(args.addons_interval), metrics.clone(), own_node.clone()));
    }

    // Token mode (`keelson.io/node-bootstrap: token`): bootstrap tokens that expire and rotate, and
    // each worker's first certificate approved by name ([`protokube::node_bootstrap`]), on every
    // control plane. On AWS and GCE the cloud says which group an instance name belongs to.
    let identity_cloud = keelson_api::nodeup::joins_by_cloud_identity(Some(boot.cloud_provider.as_str()));
    let token_mode = keelson_api::nodeup::node_bootstrap_method(cluster.metadata.annotations.as_ref(), identity_cloud)
        == Ok(keelson_api::nodeup::NodeBootstrapMethod::Token);
    if !args.once && token_mode {
        use protokube::node_labels::{aws::AwsNodes, gce::GceNodes, NodeCloud};
        let cloud = match (&gce_join, boot.cloud_provider.as_str()) {
            (Some((compute, project)), _) => {
                Some(NodeCloud::Gce(Box::new(GceNodes::new(compute.clone(), project.clone(), join_cluster.clone(), spec_store.clone()))))
            }
            (None, "aws") => Some(NodeCloud::Aws(AwsNodes::new(bootstrap_ec2, join_cluster.clone()))),
            (None, _) => None,
        };
        let server = format!("https://127.0.0.1:{api_port}");
        tracing::info!(cloud_lookup = cloud.is_some(), "workers join by bootstrap token: rotating tokens and approving first certificates");
        tokio::spawn(protokube::node_bootstrap::run(spec_store.clone(), server, cloud, own_node.clone(), metrics.clone()));
    }

    // The node labeller (its own task, following the Nodes): each Node gets its instance group's
    // labels, the group found from the cloud by the Node's name.
    if !args.once && !args.no_node_labels {
        use protokube::node_labels::{aws::AwsNodes, gce::GceNodes, NodeCloud};
        let cloud = match (&gce_join, boot.cloud_provider.as_str()) {
            (Some((compute, project)), _) => {
                Some(NodeCloud::Gce(Box::new(GceNodes::new(compute.clone(), project.clone(), join_cluster.clone(), spec_store.clone()))))
            }
            (None, "aws") => Some(NodeCloud::Aws(AwsNodes::new(label_ec2, join_cluster.clone()))),
            (None, other) => {
                tracing::warn!(cloud = other, "node labels: no instance lookup on this cloud; Nodes are not labelled with their groups' labels");
                None
            }
        };
        if let Some(cloud) = cloud {
            tokio::spawn(protokube::node_labels::run(spec_store.clone(), format!("https://127.0.0.1:{api_port}"), cloud, metrics.clone()));
        }
    }

    // The node join server: needs the cluster CA's key (control planes only) and AWS or GCE.
    if !args.once && args.join_listen != "off" && boot.cloud_provider == "aws" {
        let (ca, listener) = join_ca_and_listener(&spec_store, &args.join_listen).await?;
        let config = protokube::node_join::AuthorityConfig {
            cluster: join_cluster.clone(),
            ca,
            sts_url: base::node_join::sts_endpoint(&region),
            sts: aws_sdk_sts::Client::new(&aws),
            ec2: join_ec2,
            iam: aws_sdk_iam::Client::new(&aws),
            store: spec_store.clone(),
            nodes: protokube::node_join::NodeNames::local(spec_store.clone(), format!("https://127.0.0.1:{api_port}")),
            challenge_addr: protokube::node_join::challenge_at_instance(),
        };
        // The server learns its own account before it admits anyone; until STS answers, workers
        // wait (they retry) while etcd, backups and DNS go on.
        let (join_metrics, join_admission) = (metrics.clone(), join_admission(&cluster));
        tokio::spawn(async move {
            use backon::{ExponentialBuilder, Retryable as _};
            let policy =
                ExponentialBuilder::default().with_min_delay(Duration::from_secs(1)).with_max_delay(Duration::from_secs(60)).without_max_times().with_jitter();
            let authority = (|| protokube::node_join::Authority::new(config.clone()))
                .retry(policy)
                .notify(|e, wait| tracing::warn!(error = %e, retry_in = ?wait, "node join server not started yet"))
                .await;
            let Ok(authority) = authority else { return };
            tracing::info!(sts = %authority.sts_url, "serving node joins");
            if let Err(e) = protokube::node_join::spawn(listener, authority, join_metrics, join_admission) {
                tracing::error!(error = %e, "node join server did not start");
            }
        });
    }

    if let (false, false, Some((compute, project))) = (args.once, args.join_listen == "off", gce_join) {
        let (ca, listener) = join_ca_and_listener(&spec_store, &args.join_listen).await?;
        let authority = protokube::node_join::gce::GceAuthority::new(protokube::node_join::gce::GceAuthorityConfig {
            cluster: join_cluster,
            ca,
            project,
            region,
            compute,
            store: spec_store.clone(),
            jwks_url: args.gce_jwks_url.clone(),
            nodes: protokube::node_join::NodeNames::local(spec_store.clone(), format!("https://127.0.0.1:{api_port}")),
            challenge_addr: protokube::node_join::challenge_at_instance(),
        })?;
        tracing::info!(jwks = %authority.jwks_url(), "serving node joins (GCE identity)");
        protokube::node_join::spawn(listener, authority, metrics.clone(), join_admission(&cluster))?;
    }

    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).context("SIGTERM handler")?;
    let interval = secs(args.interval);
    let max_backoff = secs(args.max_backoff);
    let mut backoff = interval;
    let mut first = true;
    // Not settled (a restore in flight: every phase waits on this member's next pass; or a member
    // here whose volume is not mounted yet): passes follow each other at EAGER_PASS_INTERVAL and
    // failures do not back off past it until it is settled.
    let mut eager = false;
    loop {
        if !args.once && spec_read_at.elapsed() >= secs(args.spec_interval) {
            // Level-triggered on the spec too: membership or DNS changes apply without a restart.
            spec_read_at = Instant::now();
            match config::read_completed_spec(&spec_store).await.and_then(|c| config::plan(&boot, &c)) {
                Ok(p) => {
                    let _ = plan_tx.send(p.clone());
                    agent.set_plan(p)
                }
                Err(e) => tracing::warn!(error = %e, "re-reading the spec failed; keeping the previous one"),
            }
        }
        let t = Instant::now();
        let calls_before = counter.total_calls();
        let attempts_before: u64 = counter.snapshot().values().map(|c| c.attempts).sum();
        // A stop request does not wait for the pass to finish (it is level-triggered: the next
        // pass, on this host or its replacement, continues from what is there).
        let result = if args.once {
            agent.reconcile().await
        } else {
            match tokio::select! { r = agent.reconcile() => Ok(r), why = stop_requested(&mut terminate) => Err(why) } {
                Ok(r) => r,
                Err(why) => return leave(&agent, api_target, why, bounds, live, &local_api).await,
            }
        };
        let calls = counter.total_calls() - calls_before;
        let attempts: u64 = counter.snapshot().values().map(|c| c.attempts).sum::<u64>() - attempts_before;
        let snapshot: Vec<(String, u64, u64)> = counter.snapshot().into_iter().map(|(k, c)| (k, c.calls, c.attempts)).collect();
        match &result {
            Ok(r) => {
                for w in &r.waiting {
                    eprintln!("protokube: waiting: {w}");
                }
                for w in &r.refused {
                    eprintln!("protokube: refused: {w}");
                }
                tracing::info!(
                    peak_rss_kib = peak_rss_kib(),
                    elapsed_ms = t.elapsed().as_millis() as u64,
                    since_start_ms = started.elapsed().as_millis() as u64,
                    cloud_calls = calls,
                    cloud_attempts = attempts,
                    mounted = r.mounted.len(),
                    "{}",
                    summary(r)
                );
                metrics.update(|s| {
                    s.passes_ok += 1;
                    s.last_duration = t.elapsed();
                    s.last_success_unix = metrics::now_unix();
                    s.last_error = None;
                    s.waiting = r.waiting.clone();
                    s.unmounted = r.unmounted;
                    s.volumes_mounted += r.volumes_mounted as u64;
                    s.volumes_formatted += r.volumes_formatted as u64;
                    s.manifests_written += r.manifests_written as u64;
                    s.dns_changes += r.dns_records as u64;
                    s.mounted_now = r.mounted.len() as u64;
                    s.cloud_calls = snapshot;
                });
                backoff = interval;
                eager = r.restoring || r.unmounted;
                if !args.once && (first || r.volumes_mounted + r.manifests_written + r.dns_records > 0) {
                    println!("{}", summary(r));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "reconcile failed");
                metrics.update(|s| {
                    s.passes_failed += 1;
                    s.last_duration = t.elapsed();
                    s.last_error = Some(e.to_string());
                    s.cloud_calls = snapshot;
                });
                backoff = (backoff * 2).min(max_backoff);
            }
        }
        first = false;
        if args.once {
            let r = result?;
            tracing::info!(peak_rss_kib = peak_rss_kib(), since_start_ms = started.elapsed().as_millis() as u64, "done");
            println!("{}", summary(&r));
            if !r.refused.is_empty() {
                anyhow::bail!("{} volume(s) refused (see above); nothing was formatted", r.refused.len());
            }
            return Ok(());
        }
        let wait = pass_wait(result.is_ok(), eager, interval, backoff);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            why = stop_requested(&mut terminate) => return leave(&agent, api_target, why, bounds, live, &local_api).await,
        }
    }
}

/// How soon protokube passes again while it is not settled: a restore in flight (each of its
/// phases waits on a pass), or an etcd member here whose volume is not mounted yet (a replacement
/// control plane waiting for the old instance to let go of it: every second counts).
const EAGER_PASS_INTERVAL: Duration = Duration::from_secs(1);

/// The wait before the next pass: the converged interval, or the failure backoff; while not
/// settled (`eager`), never more than [`EAGER_PASS_INTERVAL`].
fn pass_wait(ok: bool, eager: bool, interval: Duration, backoff: Duration) -> Duration {
    let wait = if ok { interval } else { backoff };
    if eager {
        wait.min(EAGER_PASS_INTERVAL)
    } else {
        wait
    }
}

/// The API target group task: its stop switch and its handle.
type ApiTargetTask = (tokio::sync::watch::Sender<bool>, tokio::task::JoinHandle<()>);

/// Resolves when protokube is asked to stop: SIGTERM (systemd, at poweroff or `systemctl stop`) or
/// SIGINT.
async fn stop_requested(terminate: &mut tokio::signal::unix::Signal) -> &'static str {
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "interrupted",
        _ = terminate.recv() => "terminated",
    }
}

/// How long [`leave`] may take over each of its steps.
#[derive(Clone, Copy)]
struct Bounds {
    handover: Duration,
    api_drain: Duration,
}

/// The upper bound on handing the controllers' leadership over at poweroff
/// ([`protokube::leadership`]); it runs alongside the drain and the etcd hand-over.
const LEADERSHIP_BOUND: Duration = Duration::from_secs(3);

/// Where the local API server is, the state store that holds the CA to talk to it, and the
/// client the controllers' leadership is handed over with, made ahead.
struct LocalApi {
    store: base::StateStore,
    server: String,
    leadership: std::sync::Arc<protokube::leadership::Prepared>,
}

/// At poweroff: freeze the controllers that lead from this host and release their Leases, while the
/// local API server still serves ([`protokube::leadership`]). Bounded by [`LEADERSHIP_BOUND`].
async fn hand_leadership_over(local: &LocalApi) {
    let t = Instant::now();
    let work = async {
        let client = local.leadership.get(&local.store, &local.server).await?;
        Ok::<_, String>(protokube::leadership::release_here(&client, Path::new("/proc"), &protokube::leadership::hostname()).await)
    };
    match tokio::time::timeout(LEADERSHIP_BOUND, work).await {
        Ok(Ok(outcomes)) => {
            for (lease, outcome) in outcomes {
                match outcome {
                    protokube::leadership::Outcome::NotHere => {}
                    protokube::leadership::Outcome::Failed { holder, error } => {
                        tracing::warn!(lease, ?holder, %error, "controller leadership not released; it expires by itself")
                    }
                    other => tracing::info!(lease, outcome = ?other, elapsed_ms = t.elapsed().as_millis() as u64, "controller leadership handed over"),
                }
            }
        }
        Ok(Err(e)) => tracing::warn!(error = %e, "controller leadership: no API client; the Leases held here expire by themselves"),
        Err(_) => {
            tracing::warn!(bound_s = LEADERSHIP_BOUND.as_secs_f64(), "controller leadership: not done in time; the Leases held here expire by themselves")
        }
    }
}

/// Stop gracefully: leave the API target group, hand etcd leadership over (bounded), then exit.
/// The manifests, volumes and records are left as they are. On a live host (`live`: root `/`)
/// that is powering off, the API server keeps serving for `api_drain` after leaving the target
/// group (while leadership moves), and then kube-apiserver and etcd are ended
/// ([`protokube::poweroff`]); the containers' scopes stop only after protokube (nodeup's drop-in).
async fn leave<C, D>(agent: &Agent<C, D>, api_target: Option<ApiTargetTask>, why: &str, bounds: Bounds, live: bool, local: &LocalApi) -> anyhow::Result<()>
where
    C: cloud::volumes::Volumes + cloud::volumes::Instances + Sync,
    D: cloud::dns::Dns + Sync,
{
    let t = Instant::now();
    let powering_off = live && protokube::poweroff::system_stopping().await;
    // Behind the API load balancer: whoever takes this instance out of its target group (protokube
    // here, or the cloud, which deregisters a terminated instance itself), the balancer takes a
    // moment to stop sending it new connections, and the API server serves them meanwhile.
    let behind_balancer = api_target.is_some();
    let drain = if powering_off && behind_balancer { bounds.api_drain } else { Duration::ZERO };
    tracing::info!(signal = why, bound_s = bounds.handover.as_secs_f64(), api_drain_s = drain.as_secs_f64(), "stopping: handing etcd leadership over first");
    // Leaving the target group and then the drain, alongside both hand-overs: the drain counts from
    // the deregistration, the hand-overs need not wait for it.
    let drained = async {
        if let Some((stop, task)) = api_target {
            // The task leaves the target group itself (bounded by 5 s) once told to stop.
            let _ = stop.send(true);
            let _ = tokio::time::timeout(Duration::from_secs(6), task).await;
        }
        tokio::time::sleep(drain).await
    };
    let leadership = async {
        if powering_off {
            hand_leadership_over(local).await
        }
    };
    let (reports, (), ()) = tokio::join!(agent.leave(bounds.handover), drained, leadership);
    let moved = reports.iter().filter(|r| matches!(r.result, Ok(protokube::handover::Outcome::Moved { .. }))).count();
    // At poweroff, end what would only hold the machine (and its etcd volumes) up.
    if powering_off {
        let ended = protokube::poweroff::end(Path::new("/proc")).await;
        tracing::info!(api_servers = ?ended.api_servers, etcd = ?ended.etcds, killed = ?ended.killed, "system stopping: ended kube-apiserver and etcd (leadership handed over)");
    }
    tracing::info!(elapsed_ms = t.elapsed().as_millis() as u64, clusters = reports.len(), moved, "stopped");
    Ok(())
}

/// The certificate renewal pass, at start and then whenever a renewal falls due (at most `max_wait`
/// apart; a minute after a failure).
async fn certificate_loop(renewer: protokube::certs::Renewer, metrics: Metrics, max_wait: Duration) {
    loop {
        let report = renewer.pass(std::time::SystemTime::now()).await;
        for r in &report.recorded {
            tracing::info!(command = %r, "not run (not a live root)");
        }
        let failed = report.failed.len() as u64;
        metrics.update(|s| {
            s.certificates = report.certs.iter().map(|(k, c)| (k.clone(), c.not_after)).collect();
            s.certificate_renewals += report.renewed.len() as u64;
            s.certificate_renewal_failures += failed;
        });
        let until_due = report.next_due().and_then(|t| t.duration_since(std::time::SystemTime::now()).ok()).unwrap_or_default();
        let wait =
            if failed > 0 { max_wait.min(Duration::from_secs(60)) } else { until_due.clamp(Duration::from_secs(5), max_wait.max(Duration::from_secs(5))) };
        tokio::time::sleep(wait).await;
    }
}

/// The clock for backup ids: real, or (feature `test-hooks`) starting at `PROTOKUBE_TEST_NOW`
/// (RFC 3339), so tests see schedules and retention without waiting for them.
fn test_clock() -> protokube::backup::Clock {
    #[cfg(feature = "test-hooks")]
    if let Some(start) = std::env::var("PROTOKUBE_TEST_NOW").ok().and_then(|v| base::etcd_backup::parse_rfc3339(&v)) {
        tracing::warn!(now = %base::etcd_backup::rfc3339(start), "test clock");
        return protokube::backup::Clock::starting_at(start);
    }
    protokube::backup::Clock::real()
}

/// Peak resident set size of this process (VmHWM), in KiB.
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unsettled_host_passes_every_second_even_after_failures() {
        let (interval, backoff) = (Duration::from_secs(5), Duration::from_secs(40));
        assert_eq!(pass_wait(true, false, interval, backoff), interval);
        assert_eq!(pass_wait(false, false, interval, backoff), backoff);
        assert_eq!(pass_wait(true, true, interval, backoff), EAGER_PASS_INTERVAL);
        assert_eq!(pass_wait(false, true, interval, backoff), EAGER_PASS_INTERVAL);
        // A faster configured interval stays.
        assert_eq!(pass_wait(true, true, Duration::from_millis(200), backoff), Duration::from_millis(200));
    }
}
