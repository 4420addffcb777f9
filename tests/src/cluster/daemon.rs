//! The daemon (`keelson-local daemon`, started by `up`): it owns moto, the bridge, the relay, the
//! mirror, the registry and the machines, and reconciles them against moto every [`TICK`] until it
//! is told to stop, then tears everything down.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};

use crate::balancer::{Balancers, Desired, TargetGroupRef};
use crate::cloud::Cloud;
use crate::imds::InstanceData;
use crate::machine::{Environment, MachineData, MachineInfo};
use crate::net::{self, Segment};
use crate::paths::{self, State};
use crate::spec::{Provider, Spec};
use crate::volumes::Bus;
use crate::{cmd, kubernetes, mirror, moto};

use super::assets;
use super::fleet::{self, event, Fleet, Place};
use super::state::ClusterState;

/// The ConfigMap protokube's addon controller records applied addons in, and the bootstrap addon
/// (the RBAC worker kubelets need to join) it must have applied.
pub const ADDON_RECORD: (&str, &str) = ("kube-system", "keelson-addons");
pub const BOOTSTRAP_ADDON: &str = "bootstrap-rbac.keelson.io";

/// Reconcile interval of the daemon.
pub const TICK: Duration = Duration::from_millis(300);
/// Device names of root volumes (moto attaches one per instance).
const ROOT_DEVICES: &[&str] = &["/dev/sda1", "/dev/sda", "/dev/xvda", "/dev/xvda1"];

/// The versions a compiled cluster runs, read from `cluster-completed.yaml`: what to build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterVersions {
    pub kubernetes: String,
    pub etcd: String,
    pub containerd: String,
    pub pause: String,
}

impl ClusterVersions {
    pub fn read(path: &Path) -> anyhow::Result<ClusterVersions> {
        let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("{}", path.display()))
    }

    pub fn parse(text: &str) -> anyhow::Result<ClusterVersions> {
        let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(text)?;
        let spec = doc.get("spec").ok_or_else(|| anyhow!("no spec"))?;
        let field = |v: Option<&serde_yaml_ng::Value>, what: &str| -> anyhow::Result<String> {
            v.and_then(|v| v.as_str()).map(|s| s.trim_start_matches('v').to_string()).ok_or_else(|| anyhow!("{what}: missing"))
        };
        let kubernetes = field(spec.get("kubernetesVersion"), "spec.kubernetesVersion")?;
        let etcds: BTreeSet<String> = spec
            .get("etcdClusters")
            .and_then(|e| e.as_sequence())
            .into_iter()
            .flatten()
            .filter_map(|c| c.get("version").and_then(|v| v.as_str()).map(|v| v.trim_start_matches('v').to_string()))
            .collect();
        if etcds.len() != 1 {
            bail!("spec.etcdClusters[].version: the local cloud builds one etcd version, the spec has {etcds:?}");
        }
        let etcd = etcds.into_iter().next().unwrap_or_default();
        let containerd = field(spec.get("containerd").and_then(|c| c.get("version")), "spec.containerd.version")?;
        let sandbox = field(spec.get("containerd").and_then(|c| c.get("sandboxImage")), "spec.containerd.sandboxImage")?;
        let pause = sandbox.rsplit_once(':').map(|(_, t)| t.to_string()).ok_or_else(|| anyhow!("spec.containerd.sandboxImage {sandbox:?}: no tag"))?;
        Ok(ClusterVersions { kubernetes, etcd, containerd, pause })
    }
}

struct Daemon {
    state: State,
    spec: Spec,
    cloud: Cloud,
    fleet: Fleet,
    /// When the VPC route table was last mirrored into the host's routes ([`Daemon::sync_routes`]).
    routes_synced: Option<Instant>,
    /// The network load balancers (the API's and the Services'), on the host; their
    /// deregistrations are also followed at once by [`crate::balancer::follow_deregistrations`].
    balancers: Arc<Balancers>,
    /// When the load balancers last followed moto ([`Daemon::sync_balancers`]).
    balancers_synced: Option<Instant>,
    cs: ClusterState,
    /// Instances whose launch is held because their zone is down (said once each).
    held: std::collections::BTreeSet<String>,
}

/// Run the daemon in this process until SIGTERM/SIGINT or the stop file; tears everything down.
pub fn run_daemon(spec_path: &Path, boot: super::Boot) -> anyhow::Result<()> {
    let state = State::new(paths::state_dir());
    fs::create_dir_all(&state.root)?;
    let _ = fs::remove_file(state.stop_file());
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build();
            if let Ok(rt) = rt {
                rt.block_on(async {
                    use tokio::signal::unix::{signal, SignalKind};
                    if let (Ok(mut t), Ok(mut i)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
                        tokio::select! { _ = t.recv() => {}, _ = i.recv() => {} }
                        stop.store(true, Ordering::SeqCst);
                    }
                });
            }
        });
    }
    let spec = Spec::load(spec_path)?;
    let mut cs = ClusterState {
        name: spec.name.clone(),
        spec: spec_path.display().to_string(),
        region: spec.region.clone(),
        phase: "starting the cloud".into(),
        daemon_pid: std::process::id() as i64,
        bridge: paths::DEFAULT_BRIDGE.into(),
        etcd_clusters: spec.etcd_clusters.clone(),
        baked: boot.baked,
        air_gapped: boot.air_gapped,
        ..Default::default()
    };
    cs.save(&state);
    let mut moto = None;
    let result = match &spec.provider {
        Provider::Aws => {
            let m = moto::Moto::start_recording(&state.moto_log(), &state.moto_calls())?;
            cs.moto_port = m.port;
            cs.moto_pid = m.pid().unwrap_or(0) as i64;
            moto = Some(m);
            daemon_body(&state, &spec, &mut cs, &stop)
        }
        Provider::Gce { project } => crate::gce::daemon::run(&state, &spec, project, &mut cs, &stop),
    };
    if let Err(e) = &result {
        cs.phase = "failed".into();
        cs.error = Some(format!("{e:#}"));
        cs.save(&state);
        eprintln!("keelson-local: daemon failed: {e:#}");
        // Keep serving `ps`/`down` until asked to stop (bounded: one hour).
        let deadline = Instant::now() + Duration::from_secs(3600);
        while !stop.load(Ordering::SeqCst) && !state.stop_file().exists() && Instant::now() < deadline {
            std::thread::sleep(TICK);
        }
    }
    if let Some(mut m) = moto {
        m.stop();
    }
    Ok(())
}

fn daemon_body(state: &State, spec: &Spec, cs: &mut ClusterState, stop: &AtomicBool) -> anyhow::Result<()> {
    let seg = Segment::from_cidr(&spec.network_cidr).ok_or_else(|| anyhow!("spec.networkCIDR {:?} is not an IPv4 CIDR /8../30", spec.network_cidr))?;
    cs.gateway = seg.gateway.to_string();
    net::ensure_bridge(&cs.bridge, &seg)?;
    net::ensure_vpc_router(&cs.bridge)?;
    // Relay (moto for the machines) and mirror, on the bridge address.
    let relay = std::net::TcpListener::bind((seg.gateway, 0))?;
    let s3_relay = std::net::TcpListener::bind((seg.gateway, 0))?;
    let mirror_l = std::net::TcpListener::bind((seg.gateway, 0))?;
    let api_l = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    cs.relay_port = relay.local_addr()?.port();
    cs.s3_relay_port = s3_relay.local_addr()?.port();
    cs.mirror_port = mirror_l.local_addr()?.port();
    cs.api_port = api_l.local_addr()?.port();
    relay.set_nonblocking(true)?;
    s3_relay.set_nonblocking(true)?;
    mirror_l.set_nonblocking(true)?;
    // The VPC resolver for the EC2 private DNS names and the hosted zones, where the cluster's CoreDNS forwards.
    let vpc_dns = std::net::UdpSocket::bind((seg.gateway, 53)).with_context(|| format!("the VPC resolver on {}:53/udp", seg.gateway))?;
    vpc_dns.set_nonblocking(true)?;
    let mirror_root = state.mirror_dir();
    fs::create_dir_all(&mirror_root)?;
    let moto_target = format!("127.0.0.1:{}", cs.moto_port);
    // The relay, the mirror and the load balancers run on one runtime that lives as long as the daemon.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    {
        let _guard = rt.enter();
        let r = tokio::net::TcpListener::from_std(relay)?;
        let m = tokio::net::TcpListener::from_std(mirror_l)?;
        rt.spawn(crate::relay::relay(r, moto_target.clone()));
        let gate = crate::relay::follow_file(state.store_outage_file());
        rt.spawn(crate::relay::gated_relay(tokio::net::TcpListener::from_std(s3_relay)?, moto_target, gate));
        rt.spawn(mirror::serve(m, mirror_root.clone()));
        let zones = Arc::new(std::sync::RwLock::new(crate::vpcdns::ZoneRecords::new()));
        crate::vpcdns::follow_zones(cs.endpoint(), spec.region.clone(), Arc::downgrade(&zones))?;
        rt.spawn(crate::vpcdns::serve(tokio::net::UdpSocket::from_std(vpc_dns)?, zones));
    }
    let events: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    let balancers = {
        let events = events.clone();
        Arc::new(Balancers::new(rt.handle().clone(), api_l, Arc::new(move |m| event(&events, m)))?)
    };
    crate::balancer::follow_deregistrations(Arc::downgrade(&balancers), cs.endpoint(), spec.region.clone());
    let gw = seg.gateway;
    cs.phase = "preparing the account (bucket, zone, image)".into();
    cs.save(state);
    let cloud = Cloud::new(&cs.endpoint(), &spec.region);
    for bucket in spec.buckets() {
        let body = format!("<CreateBucketConfiguration><LocationConstraint>{}</LocationConstraint></CreateBucketConfiguration>", spec.region);
        let (code, text) = moto::http(cs.moto_port, "PUT", &format!("/{bucket}"), &body)?;
        if code != 200 && code != 409 {
            bail!("creating bucket {bucket} in moto: HTTP {code}: {text}");
        }
    }
    if let Some(zone) = spec.zone_name() {
        cloud.ensure_zone(&zone)?;
    }
    // An AMI per Debian release the groups ask for (moto's own AMIs stand for them).
    let suites = spec.suites();
    let images = cloud.images_for(&suites)?;

    let cs_relay_port = cs.relay_port;
    let assets = assets::build(state, cs, gw, kubernetes::Ccm::Aws, &suites, &|mirror_url, registry| {
        spec.local_text(&crate::spec::LocalCloud {
            file_repository: mirror_url.to_string(),
            registry: registry.to_string(),
            images: images.clone(),
            ccm_image: kubernetes::Ccm::Aws.reference(registry),
            gce_endpoint: String::new(),
            coredns_image: format!("{registry}/coredns-coredns:v{}", kubernetes::COREDNS_VERSION),
            aws_endpoint: format!("http://{gw}:{}", cs_relay_port),
            // The VPC resolver ([`crate::vpcdns`]): EC2 private names resolve, the rest fail fast.
            dns_upstream: gw.to_string(),
        })
    })?;
    let assets::Assets {
        lower,
        foreign,
        releases,
        keelson,
        overrides,
        kops_base,
        nodeup_asset,
        local_spec,
        kubernetes_bin,
        registry: _registry,
        image_digests,
        ..
    } = assets;

    cs.phase = "keelson apply --yes".into();
    cs.save(state);
    // `keelson <args> -f SPEC` against the local cloud, exactly as against AWS.
    let keelson_on_cloud = |args: &[&str]| {
        let mut c = Command::new(&keelson);
        c.args(args)
            .args(["--offline", "-f"])
            .arg(&local_spec)
            .arg("--endpoint-url")
            .arg(cs.endpoint())
            .arg("--asset-hashes")
            .arg(&overrides)
            .env("KOPS_BASE_URL", &kops_base)
            // The local cloud answers plain http:// on the gateway (the spec's endpoint annotations).
            .env(base::plain_http::ALLOW_ENV, gw.to_string())
            .env("AWS_ACCESS_KEY_ID", "keelson-local")
            .env("AWS_SECRET_ACCESS_KEY", "keelson-local")
            .env("AWS_REGION", &spec.region);
        if let Some(bundle) = &image_digests {
            c.env("KEELSON_IMAGE_DIGESTS", bundle);
        }
        c
    };
    let applied = cmd::run(keelson_on_cloud(&["apply", "--yes"]).arg("--nodeup-asset").arg(&nodeup_asset)).context("keelson apply --yes against moto")?;
    fs::write(state.root.join("apply.log"), &applied)?;

    // An admin kubeconfig through the local API load balancer, as `keelson export kubeconfig`
    // writes it for any cluster (the API server certificate names 127.0.0.1).
    let kubeconfig = state.root.join("kubeconfig");
    let api_url = format!("https://127.0.0.1:{}", cs.api_port);
    cmd::run(keelson_on_cloud(&["export", "kubeconfig", "--admin", "--ttl", "72h"]).arg("--kubeconfig").arg(&kubeconfig).arg("--server").arg(&api_url))
        .context("keelson export kubeconfig --admin")?;
    cs.kubeconfig = kubeconfig.display().to_string();
    cs.nodeup_asset = nodeup_asset;
    cs.kubectl = kubernetes_bin.join("kubectl").display().to_string();
    watch_bootstrap_addons(kubeconfig.clone(), events.clone());

    cs.phase = "running".into();
    cs.save(state);
    let env = Environment {
        aws_endpoint: format!("http://{gw}:{}", cs.relay_port),
        s3_endpoint: Some(format!("http://{gw}:{}", cs.s3_relay_port)),
        region: spec.region.clone(),
        hosts: vec![],
        test_cert_validity_seconds: std::env::var(base::pki::TEST_VALIDITY_ENV).ok().and_then(|v| base::pki::parse_test_validity(&v).ok()).map(|d| d.as_secs()),
    };
    let releases = releases.into_iter().filter_map(|(suite, lower)| images.get(&suite).map(|ami| (ami.clone(), (suite, lower)))).collect();
    let place = Place { state: state.clone(), seg, bridge: cs.bridge.clone(), lower, foreign, releases, self_exe: std::env::current_exe()?, env };
    let mut d = Daemon {
        state: state.clone(),
        spec: spec.clone(),
        cloud,
        fleet: Fleet::new(place, events),
        routes_synced: None,
        balancers,
        balancers_synced: None,
        cs: cs.clone(),
        held: Default::default(),
    };
    d.fleet.watch_boot_priority(kubeconfig);
    let nudge = d.fleet.nudge.clone();
    run_until_stopped(state, stop, &nudge, |d: &mut Daemon, m| d.fleet.event(m), |d: &mut Daemon| d.reconcile(), &mut d);
    d.shutdown();
    *cs = d.cs.clone();
    Ok(())
}

impl Daemon {
    fn reconcile(&mut self) -> anyhow::Result<()> {
        let mut step = fleet::StepTimer::start(&self.fleet.events);
        // Volumes before instances: EC2 keeps a terminated instance's volumes attached until it has
        // shut down, but moto detaches them at termination. Listed first, a volume shown detached
        // belongs to an instance the list below already shows gone, so its machine is powering off
        // (and keeps the volume until it is off) before the volumes are synced: a volume never shows
        // up in two machines at once.
        let volumes = self.volume_list()?;
        step.done("listing volumes");
        let instances = self.cloud.instances()?;
        step.done("listing instances");
        let live: BTreeMap<String, &crate::cloud::Instance> =
            instances.iter().filter(|i| i.state == "running" || i.state == "pending").map(|i| (i.id.clone(), i)).collect();
        self.fleet.stop_gone(|id| live.contains_key(id))?;
        step.done("stopping machines of instances that are gone");
        // Start machines for new instances — except in a zone that is down (chaos zone-down): the
        // group's launches there stay held, as launches into an impaired zone do not complete.
        let zones_down = self.state.zones_down();
        for (id, inst) in &live {
            if self.fleet.knows(id)? {
                continue;
            }
            if zones_down.contains(&inst.zone) {
                if self.held.insert(id.clone()) {
                    self.fleet.event(format!("{id}: launch in {} held: the zone is down", inst.zone));
                }
                continue;
            }
            let Some(ip) = inst.private_ip.clone() else { continue };
            let user_data = self.cloud.user_data(id)?;
            let data = InstanceData {
                instance_id: id.clone(),
                region: self.spec.region.clone(),
                zone: inst.zone.clone(),
                private_ip: ip,
                public_ip: inst.public_ip.clone(),
                instance_type: inst.instance_type.clone(),
                image_id: inst.image_id.clone(),
                mac: inst.mac.clone(),
                subnet_id: inst.subnet_id.clone(),
                vpc_id: inst.vpc_id.clone(),
                security_groups: inst.security_groups.clone(),
                user_data,
                tags: inst.tags.clone(),
                iam: super::iam::issued(&self.state, id, self.cloud.instance_role_credentials(inst)?)?,
                local_hostname: inst.private_dns_name.clone(),
                extra: Default::default(),
            };
            self.fleet.boot(MachineData::Aws(Box::new(data)), inst.role(), inst.group(), Box::new(|| {}))?;
        }
        step.done("starting machines");
        self.fleet.sync_volumes(&volumes)?;
        step.done("volumes");
        self.sync_dns();
        step.done("DNS");
        self.sync_routes(&instances);
        step.done("routes");
        self.publish(&instances);
        step.done("load balancers and state");
        Ok(())
    }

    /// The cloud's data volumes, and which instance each is attached to.
    fn volume_list(&self) -> anyhow::Result<Vec<fleet::Volume>> {
        Ok(self
            .cloud
            .volumes()?
            .into_iter()
            .map(|v| fleet::Volume {
                // Root volumes are the machine's overlay root; only data volumes become loop devices.
                attached_to: v.attached_to().filter(|a| !ROOT_DEVICES.contains(&a.device.as_str())).map(|a| a.instance_id.clone()),
                name: v.name(),
                size_gib: v.size_gib,
                bus: Bus::Ebs { volume_id: v.id.clone() },
                id: v.id,
            })
            .collect())
    }

    /// Play the VPC resolver: the A records of the local Route53 zones in every machine's hosts file.
    fn sync_dns(&mut self) {
        let Ok(records) = self.cloud.a_records() else { return };
        let records: Vec<(String, String)> = records.into_iter().filter_map(|r| Some((r.name, r.ips.first()?.clone()))).collect();
        self.fleet.sync_hosts(&records);
    }

    /// Play the VPC's routing: every instance route of the cluster's route tables in moto (the
    /// cloud-controller-manager's route controller writes one per node pod CIDR) becomes a host
    /// route on the bridge via that instance's private address, as long as the instance runs and
    /// its source/destination check is off (EC2 drops traffic for other addresses otherwise); host
    /// routes whose VPC route went away are removed. Every 3 s (it asks moto per routed instance).
    fn sync_routes(&mut self, instances: &[crate::cloud::Instance]) {
        if self.routes_synced.is_some_and(|t| t.elapsed() < Duration::from_secs(3)) {
            return;
        }
        self.routes_synced = Some(Instant::now());
        let Some(vpc) = instances.iter().map(|i| i.vpc_id.as_str()).find(|v| !v.is_empty()) else { return };
        let routes = match self.cloud.instance_routes(vpc, &self.spec.name) {
            Ok(r) => r,
            Err(e) => {
                self.fleet.event(format!("routes: {e}"));
                return;
            }
        };
        let mut want: BTreeMap<String, String> = BTreeMap::new();
        for r in &routes {
            let Some(inst) = instances.iter().find(|i| i.id == r.instance_id && i.state == "running") else { continue };
            let Some(ip) = &inst.private_ip else { continue };
            match self.cloud.source_dest_check(&inst.id) {
                Ok(false) => {}
                Ok(true) => continue,
                Err(e) => {
                    self.fleet.event(format!("routes: {e}"));
                    return;
                }
            }
            // Several route tables (one per zone) carry the same route; one host route serves all.
            want.insert(r.destination.clone(), ip.clone());
        }
        self.fleet.sync_routes(&want, "VPC route table");
    }

    fn publish(&mut self, instances: &[crate::cloud::Instance]) {
        let machines = self.fleet.infos();
        self.sync_balancers(instances, &machines);
        self.cs.machines = machines;
        self.cs.exposed = self.fleet.exposed.clone();
        self.cs.failed = self.fleet.failed.lock().map(|f| f.clone()).unwrap_or_default();
        self.cs.events = self.fleet.events.lock().map(|e| e.clone()).unwrap_or_default();
        if let Ok(g) = self.cloud.groups() {
            self.cs.groups = g.into_iter().map(|(n, d, _)| (n, d)).collect();
        }
        self.cs.instances = instances.iter().filter(|i| i.state == "running").count();
        self.cs.save(&self.state);
    }

    /// Play the network load balancers (every second): each NLB listener in moto follows its
    /// target group's registered, running instances ([`crate::balancer`]). The API load balancer is
    /// the one listener on 443 not made for a Service; a cluster without one (DNS-only API) gets a
    /// stand-in over every control-plane machine, health-checked like the real one.
    fn sync_balancers(&mut self, instances: &[crate::cloud::Instance], machines: &[MachineInfo]) {
        if self.balancers_synced.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            return;
        }
        self.balancers_synced = Some(Instant::now());
        let listeners = match self.cloud.nlb_listeners() {
            Ok(l) => l,
            Err(e) => {
                self.fleet.event(format!("load balancers: {e}"));
                return;
            }
        };
        let ips: BTreeMap<&str, std::net::IpAddr> =
            instances.iter().filter(|i| i.state == "running").filter_map(|i| Some((i.id.as_str(), i.private_ip.as_deref()?.parse().ok()?))).collect();
        let mut api_seen = false;
        let mut desired: Vec<Desired> = listeners
            .iter()
            .map(|l| {
                let service = l.tag("kubernetes.io/service-name").map(str::to_string);
                let api = service.is_none() && l.port == 443 && !api_seen;
                api_seen |= api;
                let ids: BTreeMap<std::net::SocketAddr, String> = l
                    .targets
                    .iter()
                    .filter_map(|(id, port)| Some((std::net::SocketAddr::new(*ips.get(id.as_str())?, u16::try_from(*port).ok()?), id.clone())))
                    .collect();
                Desired {
                    key: format!("{}:{}", l.load_balancer_arn, l.port),
                    name: format!("{}:{}", l.load_balancer, l.port),
                    service,
                    api,
                    targets: ids.keys().copied().collect(),
                    health: l.health,
                    deregistration_delay: l.deregistration_delay,
                    target_group: Some(TargetGroupRef { arn: l.target_group_arn.clone(), port: l.target_group_port, ids }),
                }
            })
            .collect();
        if !api_seen {
            desired.push(crate::balancer::api_stand_in(machines));
        }
        self.cs.services = self.balancers.sync(desired);
    }

    fn shutdown(&mut self) {
        self.cs.phase = "stopping".into();
        self.cs.save(&self.state);
        self.fleet.shutdown();
        self.cs.phase = "stopped".into();
        self.cs.machines.clear();
        self.cs.save(&self.state);
    }
}

/// The product applies the bootstrap addons (protokube's addon controller); report when it has, as
/// an event of `up` (bounded: 30 min).
pub(crate) fn watch_bootstrap_addons(kubeconfig: PathBuf, events: Arc<Mutex<Vec<String>>>) {
    std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(1800);
        let mut last = String::new();
        while Instant::now() < deadline {
            match crate::kubeapi::configmap_data(&kubeconfig, ADDON_RECORD.0, ADDON_RECORD.1) {
                Ok(Some(d)) if d.contains_key(&format!("{BOOTSTRAP_ADDON}.hash")) => {
                    event(&events, format!("bootstrap addons applied by protokube ({} recorded)", d.keys().filter(|k| k.ends_with(".hash")).count()));
                    return;
                }
                Ok(_) => last = "not recorded yet".into(),
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(Duration::from_secs(2));
        }
        event(&events, format!("bootstrap addons not applied within 30 min: {last}"));
    });
}

/// Reconcile every [`TICK`] (sooner when nudged) until the stop file appears or `stop` is set; a failing pass is
/// reported (the first of every 20 in a row) and the next one tried.
pub(crate) fn run_until_stopped<D>(
    state: &State,
    stop: &AtomicBool,
    nudge: &fleet::Nudge,
    report: impl Fn(&mut D, String),
    pass: impl Fn(&mut D) -> anyhow::Result<()>,
    d: &mut D,
) {
    let mut errors = 0u32;
    while !stop.load(Ordering::SeqCst) && !state.stop_file().exists() {
        match pass(d) {
            Ok(()) => errors = 0,
            Err(e) => {
                errors += 1;
                if errors % 20 == 1 {
                    report(d, format!("reconcile error: {e:#}"));
                }
            }
        }
        nudge.wait(TICK);
    }
}
