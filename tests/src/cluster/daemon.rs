//! The daemon (`keelson-local daemon`, started by `up`): it owns moto, the bridge, the relay, the
//! mirror, the registry and the machines, and reconciles them against moto every [`TICK`] until it
//! is told to stop, then tears everything down.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{anyhow, bail, Context};

use crate::balancer::{Balancers, Desired};
use crate::cloud::{Cloud, HealthCheck};
use crate::imds::InstanceData;
use crate::machine::{Environment, Machine, MachineInfo};
use crate::net::{self, Segment};
use crate::paths::{self, State};
use crate::spec::Spec;
use crate::{cmd, kubernetes, mirror, moto, rootfs, volumes};

use super::state::ClusterState;

/// The ConfigMap protokube's addon controller records applied addons in, and the bootstrap addon
/// (the RBAC worker kubelets need to join) it must have applied.
pub const ADDON_RECORD: (&str, &str) = ("kube-system", "keelson-addons");
pub const BOOTSTRAP_ADDON: &str = "bootstrap-rbac.keelson.io";

/// Reconcile interval of the daemon.
pub const TICK: Duration = Duration::from_millis(300);
/// Longest an instance's machine may take to shut down after its termination (then it is powered
/// off hard). Units stop in order well within it (protokube, the kubelet, containerd, the
/// containers); what it cuts short is an artefact of this host: on cgroup v1 inside a container,
/// systemd never learns that a container scope's cgroup emptied, so it would wait out each
/// scope's 90-s stop timeout, which an EC2 guest does not.
pub const POWEROFF_GRACE: Duration = Duration::from_secs(30);
/// Device names of root volumes (moto attaches one per instance).
const ROOT_DEVICES: &[&str] = &["/dev/sda1", "/dev/sda", "/dev/xvda", "/dev/xvda1"];

pub const HOSTS_BEGIN: &str = "# Begin keelson-local VPC resolver (Route53 records of the local cloud)";
pub const HOSTS_END: &str = "# End keelson-local VPC resolver";

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

fn now_s() -> f64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

struct Daemon {
    state: State,
    spec: Spec,
    seg: Segment,
    bridge: String,
    lower: PathBuf,
    self_exe: PathBuf,
    env: Environment,
    cloud: Cloud,
    machines: Arc<Mutex<BTreeMap<String, Machine>>>,
    starting: Arc<Mutex<BTreeSet<String>>>,
    /// Terminated instances whose machines are still shutting down: they keep their volumes until
    /// they are gone, as EC2 keeps them attached to a `shutting-down` instance.
    stopping: Arc<Mutex<BTreeSet<String>>>,
    failed: Arc<Mutex<BTreeMap<String, String>>>,
    events: Arc<Mutex<Vec<String>>>,
    backings: HashMap<String, volumes::Backing>,
    exposed: BTreeMap<String, (String, u32)>,
    hosts_written: HashMap<String, String>,
    /// When the VPC route table was last mirrored into the host's routes ([`Daemon::sync_routes`]).
    routes_synced: Option<Instant>,
    /// The network load balancers (the API's and the Services'), on the host.
    balancers: Balancers,
    /// When the load balancers last followed moto ([`Daemon::sync_balancers`]).
    balancers_synced: Option<Instant>,
    cs: ClusterState,
}

fn event(events: &Mutex<Vec<String>>, msg: String) {
    eprintln!("keelson-local: {msg}");
    if let Ok(mut e) = events.lock() {
        e.push(format!("{:.1} {msg}", now_s()));
        let n = e.len();
        if n > 200 {
            e.drain(..n - 200);
        }
    }
}

/// Run the daemon in this process until SIGTERM/SIGINT or the stop file; tears everything down.
pub fn run_daemon(spec_path: &Path) -> anyhow::Result<()> {
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
        phase: "starting moto".into(),
        daemon_pid: std::process::id() as i64,
        bridge: paths::DEFAULT_BRIDGE.into(),
        etcd_clusters: spec.etcd_clusters.clone(),
        ..Default::default()
    };
    cs.save(&state);
    let mut moto = moto::Moto::start(&state.moto_log())?;
    cs.moto_port = moto.port;
    cs.moto_pid = moto.pid().unwrap_or(0) as i64;
    let result = daemon_body(&state, &spec, spec_path, &mut cs, &stop);
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
    moto.stop();
    Ok(())
}

fn daemon_body(state: &State, spec: &Spec, spec_path: &Path, cs: &mut ClusterState, stop: &AtomicBool) -> anyhow::Result<()> {
    let seg = Segment::from_cidr(&spec.network_cidr).ok_or_else(|| anyhow!("spec.networkCIDR {:?} is not an IPv4 CIDR /8../30", spec.network_cidr))?;
    cs.gateway = seg.gateway.to_string();
    net::ensure_bridge(&cs.bridge, &seg)?;
    net::ensure_vpc_router(&cs.bridge)?;
    // Relay (moto for the machines) and mirror, on the bridge address.
    let relay = std::net::TcpListener::bind((seg.gateway, 0))?;
    let mirror_l = std::net::TcpListener::bind((seg.gateway, 0))?;
    let api_l = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    cs.relay_port = relay.local_addr()?.port();
    cs.mirror_port = mirror_l.local_addr()?.port();
    cs.api_port = api_l.local_addr()?.port();
    relay.set_nonblocking(true)?;
    mirror_l.set_nonblocking(true)?;
    let mirror_root = state.mirror_dir();
    fs::create_dir_all(&mirror_root)?;
    let moto_target = format!("127.0.0.1:{}", cs.moto_port);
    // The relay, the mirror and the load balancers run on one runtime that lives as long as the daemon.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    {
        let _guard = rt.enter();
        let r = tokio::net::TcpListener::from_std(relay)?;
        let m = tokio::net::TcpListener::from_std(mirror_l)?;
        rt.spawn(crate::relay::relay(r, moto_target));
        rt.spawn(mirror::serve(m, mirror_root.clone()));
    }
    let events: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    let balancers = {
        let events = events.clone();
        Balancers::new(rt.handle().clone(), api_l, Arc::new(move |m| event(&events, m)))?
    };
    let gw = seg.gateway;
    let mirror_url = format!("http://{gw}:{}/", cs.mirror_port);
    cs.phase = "preparing the account (bucket, zone, image)".into();
    cs.save(state);
    let cloud = Cloud::new(&cs.endpoint(), &spec.region);
    if let Some(bucket) = spec.bucket() {
        let body = format!("<CreateBucketConfiguration><LocationConstraint>{}</LocationConstraint></CreateBucketConfiguration>", spec.region);
        let (code, text) = moto::http(cs.moto_port, "PUT", &format!("/{bucket}"), &body)?;
        if code != 200 && code != 409 {
            bail!("creating bucket {bucket} in moto: HTTP {code}: {text}");
        }
    }
    if let Some(zone) = spec.zone_name() {
        cloud.ensure_zone(&zone)?;
    }
    let image = cloud.some_image()?;

    cs.phase = "building the rootfs".into();
    cs.save(state);
    let lower = rootfs::ensure(&paths::cache_dir())?;

    cs.phase = "building the asset mirror".into();
    cs.save(state);
    let bins = mirror::bin_dir();
    for b in ["keelson", "nodeup", "protokube"] {
        if !bins.join(b).is_file() {
            bail!("{b} binary not found in {} (build the workspace first: cargo build --workspace; or set KEELSON_BIN_DIR)", bins.display());
        }
    }
    let registry_addr = format!("{gw}:{}", kubernetes::REGISTRY_PORT);
    let local_spec = state.root.join("spec.yaml");
    let local_cloud = crate::spec::LocalCloud {
        file_repository: mirror_url.clone(),
        registry: registry_addr.clone(),
        image: image.clone(),
        ccm_image: format!("{registry_addr}/provider-aws-cloud-controller-manager:v{}", kubernetes::AWS_CCM_VERSION),
        coredns_image: format!("{registry_addr}/coredns-coredns:v{}", kubernetes::COREDNS_VERSION),
        aws_endpoint: format!("http://{gw}:{}", cs.relay_port),
        // Nothing answers DNS there: names outside the cluster fail fast, as they do on the machines.
        dns_upstream: gw.to_string(),
    };
    fs::write(&local_spec, spec.local_text(&local_cloud))?;
    let kops_base = format!("http://{gw}:{}/kops", cs.mirror_port);
    let nodeup_url = format!("http://{gw}:{}/keelson/nodeup", cs.mirror_port);
    let protokube_urls = ["amd64", "arm64"].map(|a| format!("{kops_base}/linux/{a}/protokube"));
    let cache = paths::cache_dir();
    let mut first = vec![nodeup_url.clone()];
    first.extend(protokube_urls);
    let keelson = bins.join("keelson");
    let compiled = state.compiled_dir();
    let overrides = state.root.join("asset-hashes.tsv");
    // A first compile (nodeup and protokube from this workspace, the rest with the table's
    // hashes) names every asset and version the cluster needs; apply compiles again with them all.
    let mut hashes = mirror::build(&cache, &bins, None, &mirror_root, &first)?;
    mirror::write_overrides(&overrides, &hashes)?;
    let _ = fs::remove_dir_all(&compiled);
    cmd::run(
        Command::new(&keelson)
            .args(["compile", "--offline", "-f"])
            .arg(&local_spec)
            .arg("--out")
            .arg(&compiled)
            .arg("--asset-hashes")
            .arg(&overrides)
            .env("KOPS_BASE_URL", &kops_base),
    )
    .context("keelson compile of the local spec (to learn the asset URLs and versions)")?;
    let versions = ClusterVersions::read(&compiled.join("cluster-completed.yaml"))?;

    cs.phase = format!("building Kubernetes v{} from source (cached after the first run)", versions.kubernetes);
    cs.save(state);
    let local = mirror::LocalBuilds {
        kubernetes_bin: kubernetes::kubernetes_binaries(&versions.kubernetes)?,
        containerd_archive: kubernetes::containerd_archive(&versions.containerd)?,
    };
    cs.phase = "building the images".into();
    cs.save(state);
    let layout = kubernetes::images(&versions.kubernetes, &versions.etcd, &versions.pause)?;
    let ccm_layout = kubernetes::ccm_image(kubernetes::AWS_CCM_VERSION)?;
    let coredns_layout = kubernetes::coredns_image(kubernetes::COREDNS_VERSION)?;
    cs.phase = format!("pushing the images to the registry at {registry_addr}");
    cs.save(state);
    let registry = kubernetes::Registry::start(&gw.to_string(), kubernetes::REGISTRY_PORT, &cache.join("registry"), &state.root.join("registry.log"))?;
    cs.registry = registry_addr.clone();
    cs.registry_pid = registry.pid() as i64;
    kubernetes::push(&layout, &registry_addr)?;
    kubernetes::push(&ccm_layout, &registry_addr)?;
    kubernetes::push(&coredns_layout, &registry_addr)?;

    cs.phase = "building the asset mirror".into();
    cs.save(state);
    let urls = mirror::compiled_asset_urls(&compiled, &[&mirror_url, &kops_base])?;
    hashes.extend(mirror::build(&cache, &bins, Some(&local), &mirror_root, &urls)?);
    mirror::write_overrides(&overrides, &hashes)?;
    let nodeup_sha = hashes.get(&nodeup_url).cloned().unwrap_or_default();

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
            .env("AWS_ACCESS_KEY_ID", "keelson-local")
            .env("AWS_SECRET_ACCESS_KEY", "keelson-local")
            .env("AWS_REGION", &spec.region);
        c
    };
    let nodeup_asset = format!("amd64={nodeup_sha}@{nodeup_url}");
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
    cs.kubectl = local.kubernetes_bin.join("kubectl").display().to_string();
    {
        // The product applies the bootstrap addons (protokube's addon controller); report when
        // it has, as an event of `up`.
        let (kubeconfig, events) = (kubeconfig.clone(), events.clone());
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
    let _ = spec_path;

    cs.phase = "running".into();
    cs.save(state);
    let env = Environment {
        aws_endpoint: format!("http://{gw}:{}", cs.relay_port),
        region: spec.region.clone(),
        hosts: vec![],
        test_cert_validity_seconds: std::env::var(base::pki::TEST_VALIDITY_ENV).ok().and_then(|v| base::pki::parse_test_validity(&v).ok()).map(|d| d.as_secs()),
    };
    let mut d = Daemon {
        state: state.clone(),
        spec: spec.clone(),
        seg,
        bridge: cs.bridge.clone(),
        lower,
        self_exe: std::env::current_exe()?,
        env,
        cloud,
        machines: Arc::new(Mutex::new(BTreeMap::new())),
        starting: Arc::new(Mutex::new(BTreeSet::new())),
        stopping: Arc::new(Mutex::new(BTreeSet::new())),
        failed: Arc::new(Mutex::new(BTreeMap::new())),
        events,
        backings: HashMap::new(),
        exposed: BTreeMap::new(),
        hosts_written: HashMap::new(),
        routes_synced: None,
        balancers,
        balancers_synced: None,
        cs: cs.clone(),
    };
    let mut errors = 0u32;
    while !stop.load(Ordering::SeqCst) && !state.stop_file().exists() {
        match d.reconcile() {
            Ok(()) => errors = 0,
            Err(e) => {
                errors += 1;
                if errors % 20 == 1 {
                    event(&d.events, format!("reconcile error: {e:#}"));
                }
            }
        }
        std::thread::sleep(TICK);
    }
    d.shutdown();
    *cs = d.cs.clone();
    Ok(())
}

impl Daemon {
    fn reconcile(&mut self) -> anyhow::Result<()> {
        let instances = self.cloud.instances()?;
        let live: BTreeMap<String, &crate::cloud::Instance> =
            instances.iter().filter(|i| i.state == "running" || i.state == "pending").map(|i| (i.id.clone(), i)).collect();
        // Stop machines whose instance is gone.
        let gone: Vec<String> = {
            let m = self.machines.lock().map_err(|_| anyhow!("lock"))?;
            m.keys().filter(|id| !live.contains_key(*id)).cloned().collect()
        };
        for id in gone {
            let m = self.machines.lock().map_err(|_| anyhow!("lock"))?.remove(&id);
            if let Some(mut m) = m {
                event(&self.events, format!("{id}: instance terminated; shutting its machine down (ACPI poweroff)"));
                self.hosts_written.remove(&id);
                self.stopping.lock().map_err(|_| anyhow!("lock"))?.insert(id.clone());
                let (stopping, events) = (self.stopping.clone(), self.events.clone());
                std::thread::spawn(move || {
                    let (took, clean) = m.poweroff(POWEROFF_GRACE);
                    let how = if clean { "powered off" } else { "did not power off in time; killed" };
                    event(&events, format!("{id}: machine {how} after {:.1} s", took.as_secs_f64()));
                    if let Ok(mut s) = stopping.lock() {
                        s.remove(&id);
                    }
                });
            }
        }
        // Start machines for new instances.
        for (id, inst) in &live {
            let known = self.machines.lock().map_err(|_| anyhow!("lock"))?.contains_key(id)
                || self.starting.lock().map_err(|_| anyhow!("lock"))?.contains(id)
                || self.failed.lock().map_err(|_| anyhow!("lock"))?.contains_key(id);
            if known {
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
                iam: self.cloud.instance_role_credentials(inst)?,
                local_hostname: inst.private_dns_name.clone(),
                extra: Default::default(),
            };
            self.starting.lock().map_err(|_| anyhow!("lock"))?.insert(id.clone());
            let (machines, starting, failed, events) = (self.machines.clone(), self.starting.clone(), self.failed.clone(), self.events.clone());
            let (exe, lower, dir, bridge, seg, env) =
                (self.self_exe.clone(), self.lower.clone(), self.state.machine_dir(id), self.bridge.clone(), self.seg, self.env.clone());
            let (role, group) = (inst.role(), inst.group());
            let id = id.clone();
            event(&self.events, format!("{id}: instance running ({} {} in {}); booting its machine", data.private_ip, group, data.zone));
            std::thread::spawn(move || {
                let t0 = Instant::now();
                match Machine::start(&exe, &lower, dir, &bridge, &seg, &env, &data, &role, &group) {
                    Ok(m) => {
                        event(&events, format!("{id}: machine up in {:.1} s (init pid {})", t0.elapsed().as_secs_f64(), m.info.init_pid.unwrap_or(0)));
                        if let Ok(mut ms) = machines.lock() {
                            ms.insert(id.clone(), m);
                        }
                    }
                    Err(e) => {
                        event(&events, format!("{id}: machine failed to start: {e}"));
                        if let Ok(mut f) = failed.lock() {
                            f.insert(id.clone(), e.to_string());
                        }
                    }
                }
                if let Ok(mut s) = starting.lock() {
                    s.remove(&id);
                }
            });
        }
        self.sync_volumes()?;
        self.sync_dns();
        self.sync_routes(&instances);
        self.publish(&instances);
        Ok(())
    }

    fn sync_volumes(&mut self) -> anyhow::Result<()> {
        let vols = self.cloud.volumes()?;
        let machines = self.machines.lock().map_err(|_| anyhow!("lock"))?;
        let stopping = self.stopping.lock().map_err(|_| anyhow!("lock"))?.clone();
        // Volumes of machines that have finished shutting down are free again.
        self.exposed.retain(|_, (inst, _)| machines.contains_key(inst) || stopping.contains(inst));
        for v in &vols {
            // Root volumes are the machine's overlay root; only data volumes become loop devices.
            let attachment = v.attached_to().filter(|a| !ROOT_DEVICES.contains(&a.device.as_str()));
            if attachment.is_some() && !self.backings.contains_key(&v.id) {
                let b = volumes::ensure_backing(&self.state.volumes_dir(), &v.id, v.size_gib)?;
                self.backings.insert(v.id.clone(), b);
            }
            let want = attachment.map(|a| a.instance_id.clone()).filter(|i| machines.get(i).is_some_and(|m| m.running()));
            let have = self.exposed.get(&v.id).cloned();
            if have.as_ref().map(|(i, _)| i) == want.as_ref() {
                continue;
            }
            if have.as_ref().is_some_and(|(i, _)| stopping.contains(i)) {
                // Still attached to a machine that is shutting down: not attachable elsewhere yet.
                continue;
            }
            if let Some((inst, slot)) = have {
                if let Some(m) = machines.get(&inst) {
                    if let Some(p) = m.init_pid() {
                        volumes::unexpose(p, &v.id, slot);
                    }
                }
                self.exposed.remove(&v.id);
                event(&self.events, format!("{}: detached from {inst}", v.id));
            }
            if let Some(inst) = want {
                let used: BTreeSet<u32> = self.exposed.values().filter(|(i, _)| *i == inst).map(|(_, s)| *s).collect();
                let slot = (1..).find(|s| !used.contains(s)).unwrap_or(1);
                if let (Some(m), Some(b)) = (machines.get(&inst), self.backings.get(&v.id)) {
                    if let Some(p) = m.init_pid() {
                        volumes::expose(p, b, slot)?;
                        self.exposed.insert(v.id.clone(), (inst.clone(), slot));
                        event(&self.events, format!("{} ({}): attached to {inst} as /dev/{}", v.id, v.name(), volumes::nvme_name(slot)));
                    }
                }
            }
        }
        Ok(())
    }

    /// Play the VPC resolver: every A record of the local Route53 zones goes into a guarded block
    /// of every machine's /etc/hosts (and of the kubelet's per-pod copies of it), rewritten in place
    /// when it changes.
    fn sync_dns(&mut self) {
        let Ok(records) = self.cloud.a_records() else { return };
        let mut block = format!("{HOSTS_BEGIN}\n");
        for r in &records {
            if let Some(ip) = r.ips.first() {
                block.push_str(&format!("{ip}\t{}\n", r.name));
            }
        }
        block.push_str(HOSTS_END);
        block.push('\n');
        let Ok(machines) = self.machines.lock() else { return };
        for (id, m) in machines.iter() {
            if self.hosts_written.get(id) == Some(&block) {
                continue;
            }
            let path = m.info.root.join("etc/hosts");
            let text = fs::read_to_string(&path).unwrap_or_default();
            let new = replace_block(&text, &block);
            if new != text && write_in_place(&path, &new).is_err() {
                continue;
            }
            // The kubelet gives each host-network pod (etcd, the API server) a copy of /etc/hosts
            // taken when the pod starts; a resolver answers with live records, so the copies follow.
            let pods = m.info.root.join("var/lib/kubelet/pods");
            for pod in fs::read_dir(&pods).into_iter().flatten().flatten() {
                let copy = pod.path().join("etc-hosts");
                if let Ok(text) = fs::read_to_string(&copy) {
                    let new = replace_block(&text, &block);
                    if new != text {
                        let _ = write_in_place(&copy, &new);
                    }
                }
            }
            self.hosts_written.insert(id.clone(), block.clone());
        }
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
                event(&self.events, format!("routes: {e}"));
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
                    event(&self.events, format!("routes: {e}"));
                    return;
                }
            }
            // Several route tables (one per zone) carry the same route; one host route serves all.
            want.insert(r.destination.clone(), ip.clone());
        }
        let have = match net::bridge_routes(&self.bridge) {
            Ok(h) => h,
            Err(e) => {
                event(&self.events, format!("routes: {e}"));
                return;
            }
        };
        for (dest, via) in &want {
            if have.get(dest) != Some(via) {
                match net::set_bridge_route(&self.bridge, dest, via) {
                    Ok(()) => event(&self.events, format!("route {dest} via {via} (VPC route table)")),
                    Err(e) => event(&self.events, format!("routes: {e}")),
                }
            }
        }
        for dest in have.keys().filter(|d| !want.contains_key(*d)) {
            net::delete_bridge_route(&self.bridge, dest);
            event(&self.events, format!("route {dest} removed (gone from the VPC route table)"));
        }
    }

    fn publish(&mut self, instances: &[crate::cloud::Instance]) {
        let machines: Vec<MachineInfo> = match self.machines.lock() {
            Ok(m) => m.values().map(|m| m.info.clone()).collect(),
            Err(_) => return,
        };
        self.sync_balancers(instances, &machines);
        self.cs.machines = machines;
        self.cs.exposed = self.exposed.clone();
        self.cs.failed = self.failed.lock().map(|f| f.clone()).unwrap_or_default();
        self.cs.events = self.events.lock().map(|e| e.clone()).unwrap_or_default();
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
                event(&self.events, format!("load balancers: {e}"));
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
                Desired {
                    key: format!("{}:{}", l.load_balancer_arn, l.port),
                    name: format!("{}:{}", l.load_balancer, l.port),
                    service,
                    api,
                    targets: l
                        .targets
                        .iter()
                        .filter_map(|(id, port)| Some(std::net::SocketAddr::new(*ips.get(id.as_str())?, u16::try_from(*port).ok()?)))
                        .collect(),
                    health: l.health,
                    deregistration_delay: l.deregistration_delay,
                }
            })
            .collect();
        if !api_seen {
            desired.push(Desired {
                key: "keelson-local:api".into(),
                name: "api (no load balancer in the spec: every control plane)".into(),
                service: None,
                api: true,
                targets: machines.iter().filter(|m| m.role == "control-plane").filter_map(|m| format!("{}:443", m.ip).parse().ok()).collect(),
                health: HealthCheck { interval: Duration::from_secs(10), healthy_threshold: 2, unhealthy_threshold: 2, port: None },
                deregistration_delay: Duration::from_secs(30),
            });
        }
        self.cs.services = self.balancers.sync(desired);
    }

    fn shutdown(&mut self) {
        self.cs.phase = "stopping".into();
        self.cs.save(&self.state);
        // Let machines that are booting finish (bounded), then stop them all in parallel.
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.starting.lock().map(|s| !s.is_empty()).unwrap_or(false) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let all: Vec<Machine> = self.machines.lock().map(|mut m| std::mem::take(&mut *m).into_values().collect()).unwrap_or_default();
        let handles: Vec<_> = all.into_iter().map(|mut m| std::thread::spawn(move || m.stop())).collect();
        for h in handles {
            let _ = h.join();
        }
        for b in self.backings.values() {
            volumes::destroy_backing(&b.file);
        }
        net::delete_vpc_router(&self.bridge);
        net::delete_bridge(&self.bridge);
        self.cs.phase = "stopped".into();
        self.cs.machines.clear();
        self.cs.save(&self.state);
    }
}

/// Replace (or append) the guarded block.
pub fn replace_block(text: &str, block: &str) -> String {
    if let (Some(b), Some(e)) = (text.find(HOSTS_BEGIN), text.find(HOSTS_END)) {
        if e > b {
            let after = text[e + HOSTS_END.len()..].trim_start_matches('\n');
            return format!("{}{}{}", &text[..b], block, after);
        }
    }
    let mut t = text.to_string();
    if !t.is_empty() && !t.ends_with('\n') {
        t.push('\n');
    }
    t.push_str(block);
    t
}

/// Rewrite a file without replacing its inode (it may be bind-mounted elsewhere).
pub fn write_in_place(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = fs::OpenOptions::new().write(true).truncate(true).open(path)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_block_replaced_in_place() {
        let block = format!("{HOSTS_BEGIN}\n1.2.3.4\tapi.c\n{HOSTS_END}\n");
        let t = replace_block("127.0.0.1 localhost\n", &block);
        assert_eq!(t, format!("127.0.0.1 localhost\n{block}"));
        let block2 = format!("{HOSTS_BEGIN}\n5.6.7.8\tapi.c\n{HOSTS_END}\n");
        let t2 = replace_block(&format!("{t}# other\n"), &block2);
        assert_eq!(t2, format!("127.0.0.1 localhost\n{block2}# other\n"));
    }
}
