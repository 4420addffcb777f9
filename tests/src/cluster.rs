//! The local cloud as a whole: the daemon that owns moto, the bridge, the relay, the mirror and
//! the machines (`keelson-local daemon`, started by `up`), and the commands that talk to it
//! through the state directory (`up`, `ps`, `kill`, `down`, `selfheal`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{anyhow, bail, Context};

use crate::cloud::Cloud;
use crate::imds::InstanceData;
use crate::machine::{self, Environment, Machine, MachineInfo};
use crate::net::{self, Segment};
use crate::paths::{self, MachinePaths, State};
use crate::spec::Spec;
use crate::{cmd, etcd, kubernetes, mirror, moto, rootfs, volumes};

/// The ConfigMap protokube's addon controller records applied addons in, and the bootstrap addon
/// (the RBAC worker kubelets need to join) it must have applied.
pub const ADDON_RECORD: (&str, &str) = ("kube-system", "keelson-addons");
pub const BOOTSTRAP_ADDON: &str = "bootstrap-rbac.keelson.io";

/// Reconcile interval of the daemon.
pub const TICK: Duration = Duration::from_millis(300);
/// Device names of root volumes (moto attaches one per instance).
const ROOT_DEVICES: &[&str] = &["/dev/sda1", "/dev/sda", "/dev/xvda", "/dev/xvda1"];

pub const HOSTS_BEGIN: &str = "# Begin keelson-local VPC resolver (Route53 records of the local cloud)";
pub const HOSTS_END: &str = "# End keelson-local VPC resolver";

/// Shared between the daemon and the commands (`cluster.json`).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct ClusterState {
    pub name: String,
    pub spec: String,
    pub region: String,
    pub phase: String,
    #[serde(default)]
    pub error: Option<String>,
    pub daemon_pid: i64,
    #[serde(default)]
    pub moto_pid: i64,
    pub moto_port: u16,
    pub relay_port: u16,
    pub mirror_port: u16,
    pub gateway: String,
    pub bridge: String,
    #[serde(default)]
    pub etcd_clusters: Vec<String>,
    #[serde(default)]
    pub machines: Vec<MachineInfo>,
    #[serde(default)]
    pub failed: BTreeMap<String, String>,
    /// volume id → (instance, slot) currently exposed.
    #[serde(default)]
    pub exposed: BTreeMap<String, (String, u32)>,
    /// Groups: name → desired capacity.
    #[serde(default)]
    pub groups: BTreeMap<String, i32>,
    #[serde(default)]
    pub events: Vec<String>,
    /// Running instances in moto.
    #[serde(default)]
    pub instances: usize,
    /// The image registry the machines pull from (`host:port` on the bridge).
    #[serde(default)]
    pub registry: String,
    #[serde(default)]
    pub registry_pid: i64,
    /// The API "load balancer": 127.0.0.1:<api_port> relays to a live control plane's :443.
    #[serde(default)]
    pub api_port: u16,
    /// Admin kubeconfig (server https://127.0.0.1:<api_port>), written after apply.
    #[serde(default)]
    pub kubeconfig: String,
    /// The kubectl built for the cluster's version.
    #[serde(default)]
    pub kubectl: String,
}

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

impl ClusterState {
    pub fn load(state: &State) -> Option<ClusterState> {
        let text = fs::read_to_string(state.cluster_file()).ok()?;
        serde_json::from_str(&text).ok()
    }
    fn save(&self, state: &State) {
        if let Ok(text) = serde_json::to_string_pretty(self) {
            if let Err(e) = base::fs::write_atomic(&state.cluster_file(), text.as_bytes(), 0o600, None) {
                eprintln!("keelson-local: saving the cluster state: {e}");
            }
        }
    }
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.moto_port)
    }
}

fn now_s() -> f64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

// ---------------------------------------------------------------------------------------------
// The daemon
// ---------------------------------------------------------------------------------------------

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
    failed: Arc<Mutex<BTreeMap<String, String>>>,
    events: Arc<Mutex<Vec<String>>>,
    backings: HashMap<String, volumes::Backing>,
    exposed: BTreeMap<String, (String, u32)>,
    hosts_written: HashMap<String, String>,
    /// When the VPC route table was last mirrored into the host's routes ([`Daemon::sync_routes`]).
    routes_synced: Option<Instant>,
    /// Where the API load balancer sends connections: every control plane's `ip:443`.
    api_targets: Arc<Mutex<Vec<String>>>,
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
    api_l.set_nonblocking(true)?;
    let api_targets: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    let mirror_root = state.mirror_dir();
    fs::create_dir_all(&mirror_root)?;
    let moto_target = format!("127.0.0.1:{}", cs.moto_port);
    {
        let mirror_root = mirror_root.clone();
        let api_targets = api_targets.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
            rt.block_on(async move {
                let r = tokio::net::TcpListener::from_std(relay).expect("relay listener");
                let m = tokio::net::TcpListener::from_std(mirror_l).expect("mirror listener");
                let a = tokio::net::TcpListener::from_std(api_l).expect("api listener");
                tokio::join!(crate::relay::relay(r, moto_target), mirror::serve(m, mirror_root), crate::relay::relay_to_any(a, api_targets));
            });
        });
    }
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
    let mut urls = BTreeSet::new();
    for e in fs::read_dir(compiled.join("nodeup"))?.flatten() {
        let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&fs::read_to_string(e.path())?)?;
        for a in v.get("Assets").and_then(|a| a.get("amd64")).and_then(|a| a.as_sequence()).into_iter().flatten() {
            if let Some((_, rest)) = a.as_str().and_then(|s| s.split_once('@')) {
                urls.insert(rest.split(',').next().unwrap_or(rest).to_string());
            }
        }
    }
    let urls: Vec<String> = urls.into_iter().filter(|u| u.starts_with(&mirror_url) || u.starts_with(&kops_base)).collect();
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
    let applied = cmd::run(keelson_on_cloud(&["apply", "--yes"]).arg("--nodeup-asset").arg(format!("amd64={nodeup_sha}@{nodeup_url}")))
        .context("keelson apply --yes against moto")?;
    fs::write(state.root.join("apply.log"), &applied)?;

    // An admin kubeconfig through the local API load balancer, as `keelson export kubeconfig`
    // writes it for any cluster (the API server certificate names 127.0.0.1).
    let kubeconfig = state.root.join("kubeconfig");
    let api_url = format!("https://127.0.0.1:{}", cs.api_port);
    cmd::run(keelson_on_cloud(&["export", "kubeconfig", "--admin", "--ttl", "72h"]).arg("--kubeconfig").arg(&kubeconfig).arg("--server").arg(&api_url))
        .context("keelson export kubeconfig --admin")?;
    cs.kubeconfig = kubeconfig.display().to_string();
    cs.kubectl = local.kubernetes_bin.join("kubectl").display().to_string();
    let events: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
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
        failed: Arc::new(Mutex::new(BTreeMap::new())),
        events,
        backings: HashMap::new(),
        exposed: BTreeMap::new(),
        hosts_written: HashMap::new(),
        routes_synced: None,
        api_targets,
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
                event(&self.events, format!("{id}: instance terminated; stopping its machine"));
                self.exposed.retain(|_, (inst, _)| inst != &id);
                self.hosts_written.remove(&id);
                std::thread::spawn(move || m.stop());
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
        let targets: Vec<String> = machines.iter().filter(|m: &&MachineInfo| m.role == "control-plane").map(|m| format!("{}:443", m.ip)).collect();
        if let Ok(mut t) = self.api_targets.lock() {
            *t = targets;
        }
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

// ---------------------------------------------------------------------------------------------
// Commands
// ---------------------------------------------------------------------------------------------

fn state() -> State {
    State::new(paths::state_dir())
}

fn daemon_alive(cs: &ClusterState) -> bool {
    cs.daemon_pid > 0 && cmd::alive(cs.daemon_pid)
}

fn require_root() -> anyhow::Result<()> {
    let uid = fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
        .unwrap_or_default();
    if uid != "0" {
        bail!("keelson-local needs root (network namespaces, loop devices, systemd-nspawn)");
    }
    for (tool, pkg) in [
        ("systemd-nspawn", "systemd-container"),
        ("debootstrap", "debootstrap"),
        ("losetup", "mount"),
        ("ip", "iproute2"),
        ("apt-get", "apt"),
        ("dpkg-deb", "dpkg"),
    ] {
        if cmd::which(tool).is_none() && !Path::new("/usr/sbin").join(tool).exists() {
            bail!("{tool} is missing: apt-get install {pkg} (scripts/test installs it)");
        }
    }
    Ok(())
}

/// Health of the whole cluster, as `up` waits for it and `ps` shows it.
#[derive(Debug, Default, Clone)]
pub struct Health {
    pub lines: Vec<String>,
    pub problems: Vec<String>,
}

/// Every group has its desired machines; every machine runs containerd; every control-plane
/// machine has a healthy member of every etcd cluster and each cluster has all members.
pub fn health(cs: &ClusterState) -> Health {
    let mut h = Health::default();
    for (g, want) in &cs.groups {
        let have = cs.machines.iter().filter(|m| &m.group == g && m.init_pid.is_some_and(cmd::alive)).count();
        if (have as i32) < *want {
            h.problems.push(format!("group {g}: {have}/{want} machines"));
        }
    }
    let cps = cs.machines.iter().filter(|m| m.role == "control-plane").count();
    for m in &cs.machines {
        let Some(pid) = m.init_pid.filter(|p| cmd::alive(*p)) else {
            h.problems.push(format!("{}: machine not running", m.instance_id));
            continue;
        };
        let ctr = machine::exec_in(pid, &["ctr", "version"]).is_ok();
        let vols: Vec<String> = cs.exposed.iter().filter(|(_, (i, _))| i == &m.instance_id).map(|(v, _)| v.clone()).collect();
        let mut line = format!(
            "{:<21} {:<14} {:<26} {:<15} {:<11} containerd={} volumes=[{}]",
            m.instance_id,
            m.role,
            m.group,
            m.ip,
            m.zone,
            if ctr { "running" } else { "DOWN" },
            vols.join(",")
        );
        if !ctr {
            h.problems.push(format!("{}: containerd not answering (ctr version)", m.instance_id));
        }
        if m.role == "control-plane" {
            for c in &cs.etcd_clusters {
                match etcd::endpoint(&m.root, c) {
                    None => {
                        line.push_str(&format!(" etcd-{c}=no-manifest"));
                        h.problems.push(format!("{}: no etcd-{c} manifest yet", m.instance_id));
                    }
                    Some(ep) => {
                        let ok = etcd::healthy(pid, &ep);
                        let members = etcd::members(pid, &ep).map(|m| m.len()).unwrap_or(0);
                        line.push_str(&format!(" etcd-{c}={}({}/{cps} members)", if ok { "healthy" } else { "UNHEALTHY" }, members));
                        if !ok {
                            h.problems.push(format!("{}: etcd {c} member {} unhealthy", m.instance_id, ep.member));
                        } else if members != cps {
                            h.problems.push(format!("{}: etcd {c} has {members} members, want {cps}", m.instance_id));
                        }
                    }
                }
            }
        }
        h.lines.push(line);
    }
    if cs.machines.is_empty() {
        h.problems.push("no machines yet".into());
    }
    if h.problems.is_empty() && !cs.kubeconfig.is_empty() {
        h.problems.extend(kube_problems(cs, &mut h.lines));
    }
    h
}

/// The static pods every control plane runs (etcd per etcd cluster; kube-proxy runs everywhere).
pub fn control_plane_pods(cs: &ClusterState) -> Vec<String> {
    let mut v: Vec<String> = cs.etcd_clusters.iter().map(|c| format!("etcd-{c}")).collect();
    v.extend(["kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy"].map(String::from));
    v
}

/// The failing checks of /readyz (`[-]name failed: …`) or the first 160 characters, on one line.
fn one_line(text: &str) -> String {
    let failed: Vec<&str> = text.split("\\n").flat_map(|l| l.lines()).filter(|l| l.trim_start().starts_with("[-]")).map(str::trim).collect();
    if !failed.is_empty() {
        return failed.join(" ");
    }
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    flat.chars().take(160).collect()
}

/// What the Kubernetes API says is not right yet: the API through every control plane, every
/// machine a Ready Node, every control-plane static pod and every kube-proxy running.
pub fn kube_problems(cs: &ClusterState, lines: &mut [String]) -> Vec<String> {
    use crate::kubeapi::{self, Target};
    let kc = Path::new(&cs.kubeconfig);
    let mut p = Vec::new();
    for m in cs.machines.iter().filter(|m| m.role == "control-plane") {
        let t = Target { server: Some(format!("https://{}", m.ip)), tls_server_name: None };
        match kubeapi::readyz(kc, &t) {
            Ok(body) if body.trim() == "ok" => {}
            Ok(body) => p.push(format!("{}: /readyz says {}", m.instance_id, one_line(&body))),
            Err(e) => p.push(format!("{}: /readyz: {}", m.instance_id, one_line(&e.to_string()))),
        }
    }
    if !p.is_empty() {
        return p;
    }
    let nodes = match kubeapi::nodes(kc) {
        Ok(n) => n,
        Err(e) => return vec![format!("listing nodes: {e}")],
    };
    let pods = match kubeapi::system_pods(kc) {
        Ok(x) => x,
        Err(e) => return vec![format!("listing kube-system pods: {e}")],
    };
    for m in &cs.machines {
        let Some((name, n)) = nodes.iter().find(|(_, n)| n.internal_ip.as_deref() == Some(m.ip.as_str())) else {
            p.push(format!("{}: no Node with InternalIP {}", m.instance_id, m.ip));
            continue;
        };
        if !n.ready {
            p.push(format!("{}: Node {name} not Ready", m.instance_id));
        }
        // nodeup runs kube-proxy as a static pod on control planes only (workers get it with the
        // kube-proxy addon, which does not exist yet).
        let want = if m.role == "control-plane" { control_plane_pods(cs) } else { vec![] };
        let mut running = 0;
        for w in &want {
            match pods.get(&format!("{w}-{name}")) {
                Some((_, true)) => running += 1,
                Some((_, false)) => p.push(format!("{}: pod {w} not running and ready", m.instance_id)),
                None => p.push(format!("{}: no pod {w}-{name}", m.instance_id)),
            }
        }
        if let Some(l) = lines.iter_mut().find(|l| l.starts_with(&m.instance_id)) {
            l.push_str(&format!(" node={} pods={running}/{}", if n.ready { "Ready" } else { "NotReady" }, want.len()));
        }
    }
    p
}

fn running_cluster() -> anyhow::Result<ClusterState> {
    let cs = ClusterState::load(&state()).ok_or_else(|| anyhow!("no local cluster (keelson-local up -f SPEC)"))?;
    if !daemon_alive(&cs) {
        bail!("the local cluster's daemon is not running (keelson-local down, then up)");
    }
    if cs.kubeconfig.is_empty() || cs.kubectl.is_empty() {
        bail!("the local cluster has no API yet (phase: {})", cs.phase);
    }
    Ok(cs)
}

/// `keelson-local kubectl ARGS…`: the cluster's kubectl with its admin kubeconfig.
pub fn kubectl(args: &[String]) -> anyhow::Result<std::process::ExitStatus> {
    let cs = running_cluster()?;
    Command::new(&cs.kubectl).arg("--kubeconfig").arg(&cs.kubeconfig).args(args).status().with_context(|| format!("running {}", cs.kubectl))
}

/// Quote a value for a POSIX shell.
fn sh_quote(v: &str) -> String {
    format!("'{}'", v.replace('\'', r"'\''"))
}

/// `keelson-local env`: the environment of the local cloud, as `export` lines.
pub fn env_exports() -> anyhow::Result<String> {
    let cs = running_cluster()?;
    let st = state();
    let kubectl_dir = Path::new(&cs.kubectl).parent().map(|p| p.display().to_string()).unwrap_or_default();
    let vars = [
        ("AWS_ENDPOINT_URL", cs.endpoint()),
        ("AWS_ACCESS_KEY_ID", "keelson-local".to_string()),
        ("AWS_SECRET_ACCESS_KEY", "keelson-local".to_string()),
        ("AWS_REGION", cs.region.clone()),
        ("AWS_DEFAULT_REGION", cs.region.clone()),
        ("KUBECONFIG", cs.kubeconfig.clone()),
        ("KEELSON_LOCAL_REGISTRY", cs.registry.clone()),
        // The spec as applied (local mirror, registry and image): `keelson … -f "$KEELSON_LOCAL_SPEC"`.
        ("KEELSON_LOCAL_SPEC", st.root.join("spec.yaml").display().to_string()),
        ("KEELSON_ASSET_HASHES", st.root.join("asset-hashes.tsv").display().to_string()),
        ("KOPS_BASE_URL", format!("http://{}:{}/kops", cs.gateway, cs.mirror_port)),
        ("PATH", format!("{kubectl_dir}:{}", std::env::var("PATH").unwrap_or_default())),
    ];
    Ok(vars.iter().map(|(k, v)| format!("export {k}={}\n", sh_quote(v))).collect())
}

/// `up`: start the daemon and wait until the control plane is healthy.
pub fn up(spec_path: &Path, timeout: Duration) -> anyhow::Result<()> {
    require_root()?;
    let st = state();
    if let Some(cs) = ClusterState::load(&st) {
        if daemon_alive(&cs) {
            bail!("a local cluster ({}) is already up (daemon pid {}); run `keelson-local down` first", cs.name, cs.daemon_pid);
        }
    }
    // Leftovers of a crashed run go first.
    down_quiet();
    fs::create_dir_all(&st.root)?;
    let spec_abs = fs::canonicalize(spec_path).with_context(|| format!("{}", spec_path.display()))?;
    Spec::load(&spec_abs)?;
    let log = fs::File::create(st.daemon_log())?;
    let exe = std::env::current_exe()?;
    let child = Command::new(&exe).arg("daemon").arg("-f").arg(&spec_abs).stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log).process_group(0).spawn()?;
    let pid = child.id();
    // The daemon outlives us; a thread reaps it if it exits while we wait.
    std::thread::spawn(move || {
        let mut child = child;
        let _ = child.wait();
    });
    eprintln!("keelson-local: daemon pid {pid}; log {}", st.daemon_log().display());
    let t0 = Instant::now();
    let deadline = t0 + timeout;
    let mut last_phase = String::new();
    let mut seen_events = 0usize;
    let mut last_problems = String::new();
    let mut last_health = Instant::now() - Duration::from_secs(10);
    loop {
        if let Some(cs) = ClusterState::load(&st) {
            if cs.phase != last_phase {
                eprintln!("keelson-local: [{:>5.1} s] {}", t0.elapsed().as_secs_f64(), cs.phase);
                last_phase = cs.phase.clone();
            }
            for e in cs.events.iter().skip(seen_events) {
                eprintln!("keelson-local: [{:>5.1} s]   {}", t0.elapsed().as_secs_f64(), e.split_once(' ').map(|x| x.1).unwrap_or(e));
            }
            seen_events = cs.events.len();
            if cs.phase == "failed" {
                bail!(
                    "the local cloud failed to come up: {}\n(daemon log: {}; run `keelson-local down` to clean up)",
                    cs.error.unwrap_or_default(),
                    st.daemon_log().display()
                );
            }
            if !cmd::alive(pid as i64) {
                bail!("the daemon exited (log: {}):\n{}", st.daemon_log().display(), tail(&st.daemon_log(), 30));
            }
            if cs.phase == "running" && last_health.elapsed() > Duration::from_secs(2) {
                last_health = Instant::now();
                let h = health(&cs);
                if h.problems.is_empty() {
                    for l in &h.lines {
                        println!("{l}");
                    }
                    println!(
                        "keelson-local: {} is up: {} machines, control plane healthy, every node Ready ({:.0} s)",
                        cs.name,
                        cs.machines.len(),
                        t0.elapsed().as_secs_f64()
                    );
                    return Ok(());
                }
                if let Some(blocker) = blocker(&cs) {
                    bail!("blocked by a missing piece: {blocker}\n(cluster left up for inspection: `keelson-local ps`, then `keelson-local down`)");
                }
                let p = h.problems.join("; ");
                if p != last_problems && t0.elapsed() > Duration::from_secs(5) {
                    eprintln!("keelson-local: [{:>5.1} s] waiting: {p}", t0.elapsed().as_secs_f64());
                    last_problems = p;
                }
            }
        }
        if Instant::now() > deadline {
            let diag = ClusterState::load(&st).map(|cs| diagnose(&cs)).unwrap_or_default();
            bail!("the control plane was not healthy within {} s: {last_problems}\n{diag}(cluster left up for inspection: `keelson-local ps`, then `keelson-local down`)", timeout.as_secs());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn tail(path: &Path, n: usize) -> String {
    let t = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = t.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Known failures of the product that no amount of waiting fixes, found in a machine's boot log.
pub fn blocker(cs: &ClusterState) -> Option<String> {
    const KNOWN: &[(&str, &str)] = &[
        ("s3:// is not built in", "this nodeup build cannot read an s3:// ConfigBase (the spec's state store is in S3)"),
        ("ConfigBase s3://", "this protokube build cannot read an s3:// ConfigBase"),
    ];
    for m in &cs.machines {
        let Some(pid) = m.init_pid.filter(|p| cmd::alive(*p)) else { continue };
        let log = machine::exec_in(pid, &["journalctl", "-b", "--no-pager", "-o", "cat", "-u", "keelson-user-data", "-u", "protokube"]).unwrap_or_default();
        for (needle, what) in KNOWN {
            if let Some(line) = log.lines().find(|l| l.contains(needle)) {
                return Some(format!("{what}\n  {}: {}", m.instance_id, line.trim()));
            }
        }
    }
    None
}

/// What went wrong inside the machines: failed units and the tail of the boot journal.
pub fn diagnose(cs: &ClusterState) -> String {
    let mut s = String::new();
    for m in &cs.machines {
        let Some(pid) = m.init_pid.filter(|p| cmd::alive(*p)) else { continue };
        let failed = machine::exec_in(pid, &["systemctl", "--failed", "--no-legend", "--plain"]).unwrap_or_default();
        let ud = machine::exec_in(
            pid,
            &["journalctl", "-b", "--no-pager", "-n", "15", "-o", "cat", "-u", "keelson-user-data", "-u", "protokube", "-u", "kubelet", "-u", "containerd"],
        )
        .unwrap_or_default();
        s.push_str(&format!("--- {} ({} {}): failed units: {}\n{}\n", m.instance_id, m.role, m.ip, failed.trim(), ud.trim()));
    }
    for (id, e) in &cs.failed {
        s.push_str(&format!("--- {id}: machine failed to start: {e}\n"));
    }
    s
}

/// What decides whether Nodes come and go: every Node the API holds (ready, provider id, taints)
/// and, from the cloud-controller-manager's and kube-controller-manager's logs on every live
/// control plane (the kubelet's pod log files in the machine's root), the last 60 errors, warnings,
/// leadership lines and lines about a Node that is not ready.
pub fn diagnose_nodes(cs: &ClusterState, kubeconfig: &Path) -> String {
    let mut s = String::new();
    let mut not_ready = Vec::new();
    match crate::kubeapi::nodes(kubeconfig) {
        Ok(nodes) => {
            for (name, n) in nodes {
                s.push_str(&format!("node {name}: ready {} ip {:?} provider {:?} taints {:?}\n", n.ready, n.internal_ip, n.provider_id, n.taints));
                if !n.ready {
                    not_ready.push(name);
                }
            }
        }
        Err(e) => s.push_str(&format!("nodes: {e}\n")),
    }
    for m in control_planes(cs) {
        let pods = m.root.join("var/log/pods");
        let Ok(dirs) = std::fs::read_dir(&pods) else { continue };
        for d in dirs.flatten() {
            let name = d.file_name().to_string_lossy().to_string();
            if !(name.contains("cloud-controller-manager") || name.contains("kube-controller-manager")) {
                continue;
            }
            let Ok(containers) = std::fs::read_dir(d.path()) else { continue };
            for c in containers.flatten() {
                let Ok(logs) = std::fs::read_dir(c.path()) else { continue };
                let mut logs: Vec<PathBuf> = logs.flatten().map(|l| l.path()).collect();
                logs.sort();
                let Some(last) = logs.last() else { continue };
                let text = std::fs::read_to_string(last).unwrap_or_default();
                // Errors, warnings, leadership and anything about a Node that is not ready.
                let lines: Vec<&str> = text
                    .lines()
                    .filter(|l| {
                        let msg = l.splitn(4, ' ').nth(3).unwrap_or("");
                        msg.starts_with('E') || msg.starts_with('W') || l.contains("leader") || not_ready.iter().any(|n| l.contains(n.as_str()))
                    })
                    .collect();
                s.push_str(&format!("--- {} {}: errors, warnings, leadership and not-ready nodes in {}\n", m.instance_id, m.ip, last.display()));
                for l in &lines[lines.len().saturating_sub(60)..] {
                    s.push_str(l);
                    s.push('\n');
                }
            }
        }
    }
    s
}

pub fn ps() -> anyhow::Result<()> {
    let st = state();
    let cs = ClusterState::load(&st).ok_or_else(|| anyhow!("no local cluster (state {} has no cluster.json)", st.root.display()))?;
    println!(
        "cluster {} — phase {}{} — moto http://127.0.0.1:{} — daemon {}",
        cs.name,
        cs.phase,
        cs.error.as_deref().map(|e| format!(" ({e})")).unwrap_or_default(),
        cs.moto_port,
        if daemon_alive(&cs) { "running" } else { "NOT RUNNING" }
    );
    println!("{:<21} {:<14} {:<26} {:<15} {:<11} status", "INSTANCE", "ROLE", "GROUP", "IP", "ZONE");
    let h = health(&cs);
    for l in &h.lines {
        println!("{l}");
    }
    for p in &h.problems {
        println!("problem: {p}");
    }
    Ok(())
}

pub fn kill(instance: &str) -> anyhow::Result<()> {
    let cs = ClusterState::load(&state()).ok_or_else(|| anyhow!("no local cluster is up"))?;
    let cloud = Cloud::new(&cs.endpoint(), &cs.region);
    cloud.terminate(instance)?;
    println!("keelson-local: terminated {instance} in moto");
    Ok(())
}

/// `down`: stop the daemon (it tears down what it built), then sweep anything left behind.
pub fn down() -> anyhow::Result<Vec<String>> {
    let st = state();
    if let Some(cs) = ClusterState::load(&st) {
        if daemon_alive(&cs) {
            let _ = fs::write(st.stop_file(), "");
            cmd::kill(cs.daemon_pid, "TERM");
            let deadline = Instant::now() + Duration::from_secs(90);
            while cmd::alive(cs.daemon_pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            if cmd::alive(cs.daemon_pid) {
                cmd::kill(cs.daemon_pid, "KILL");
            }
        }
        if cs.moto_pid > 0 && cmd::alive(cs.moto_pid) {
            cmd::kill(-cs.moto_pid, "KILL");
            cmd::kill(cs.moto_pid, "KILL");
        }
    }
    let swept = sweep(&st);
    let _ = fs::remove_dir_all(&st.root);
    Ok(swept)
}

fn down_quiet() {
    let _ = down();
}

/// Remove every leftover the local cloud can leave: machines (from their machine.json), their
/// namespaces and veths, the bridge, loop devices backed under the state dir, mounts under it,
/// nspawn's run-dir entries, processes started from it.
pub fn sweep(st: &State) -> Vec<String> {
    let mut found = Vec::new();
    // The registry is the daemon's child; a daemon killed hard leaves it behind.
    if let Some(cs) = ClusterState::load(st) {
        let is_registry = |pid: i64| fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "docker-registry");
        if cs.registry_pid > 0 && cmd::alive(cs.registry_pid) && is_registry(cs.registry_pid) {
            found.push(format!("registry pid {}", cs.registry_pid));
            cmd::kill(cs.registry_pid, "KILL");
        }
    }
    if let Ok(entries) = fs::read_dir(st.machines_dir()) {
        for e in entries.flatten() {
            let mp = MachinePaths { dir: e.path() };
            if let Ok(text) = fs::read_to_string(mp.info_file()) {
                if let Ok(info) = serde_json::from_str::<MachineInfo>(&text) {
                    if info.init_pid.is_some_and(cmd::alive) || machine::is_mountpoint(&info.root) {
                        found.push(format!("machine {}", info.instance_id));
                    }
                    machine::teardown(&info, &mp);
                }
            }
            let root = mp.root();
            if machine::is_mountpoint(&root) {
                found.push(format!("mount {}", root.display()));
                cmd::sh_quiet(&["umount", "-l", &root.to_string_lossy()]);
            }
        }
    }
    // Any mount under the state dir.
    let prefix = st.root.to_string_lossy().to_string();
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut mps: Vec<String> = mounts.lines().filter_map(|l| l.split_whitespace().nth(4)).filter(|m| m.starts_with(&prefix)).map(str::to_string).collect();
    mps.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in mps {
        found.push(format!("mount {m}"));
        cmd::sh_quiet(&["umount", "-l", &m]);
    }
    for ns in net::our_namespaces() {
        found.push(format!("netns {ns}"));
        for pid in machine::pids_in_netns(&ns) {
            cmd::kill(pid, "KILL");
        }
        cmd::sh_quiet(&["ip", "netns", "del", &ns]);
    }
    for l in net::our_links() {
        if l.starts_with(paths::VETH_PREFIX) || l == paths::DEFAULT_BRIDGE {
            found.push(format!("link {l}"));
            cmd::sh_quiet(&["ip", "link", "del", &l]);
        }
    }
    for (dev, file) in volumes::loops_under(&st.root) {
        found.push(format!("loop {dev} ({})", file.display()));
        cmd::sh_quiet(&["losetup", "-d", &dev]);
    }
    // Processes whose command line names the state dir (IMDS servers, nspawn).
    if let Ok(entries) = fs::read_dir("/proc") {
        let me = std::process::id() as i64;
        for e in entries.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i64>().ok()) else { continue };
            if pid == me {
                continue;
            }
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let c = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if c.contains(&prefix) && (c.contains("systemd-nspawn") || c.contains(" imds ") || c.contains("moto.server")) {
                found.push(format!("process {pid}"));
                cmd::kill(pid, "KILL");
            }
        }
    }
    if let Ok(entries) = fs::read_dir(Path::new(paths::NSPAWN_RUN_DIR).join("propagate")) {
        for e in entries.flatten() {
            let n = e.file_name().to_string_lossy().to_string();
            if n.starts_with("i-") {
                found.push(format!("nspawn leftover {n}"));
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }
    found
}

// ---------------------------------------------------------------------------------------------
// selfheal
// ---------------------------------------------------------------------------------------------

pub const KEY_PREFIX: &str = "/keelson-local/selfheal/";

fn random_index(n: usize) -> usize {
    use std::io::Read;
    let mut b = [0u8; 8];
    if let Ok(mut f) = fs::File::open("/dev/urandom") {
        let _ = f.read_exact(&mut b);
    }
    (u64::from_le_bytes(b) % n.max(1) as u64) as usize
}

fn control_planes(cs: &ClusterState) -> Vec<MachineInfo> {
    cs.machines.iter().filter(|m| m.role == "control-plane" && m.init_pid.is_some_and(cmd::alive)).cloned().collect()
}

/// Member names per etcd cluster, as seen from one machine.
fn member_sets(cs: &ClusterState, m: &MachineInfo) -> Option<BTreeMap<String, Vec<String>>> {
    let pid = m.init_pid?;
    let mut out = BTreeMap::new();
    for c in &cs.etcd_clusters {
        let ep = etcd::endpoint(&m.root, c)?;
        // Name and member id: a member that was removed and re-added would keep its name only.
        out.insert(c.clone(), etcd::members(pid, &ep)?.into_iter().map(|(n, id)| format!("{n}/{id}")).collect());
    }
    Some(out)
}

pub struct SelfhealReport {
    pub cycles: u32,
    pub healed: u32,
    pub keys: u64,
    pub intact: u64,
    /// ConfigMaps created through the API before the first kill, and how many read back at the end.
    pub objects: u64,
    pub objects_intact: u64,
    pub failovers: Vec<f64>,
    /// Per healed cycle: seconds from the kill to each of [`PHASES`].
    pub phases: Vec<Vec<f64>>,
    /// `keelson validate cluster` passed after the last cycle.
    pub validated: bool,
}

pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// The phases of a control-plane failover, in order; each is timed from the kill.
pub const PHASES: [&str; 7] = ["instance replaced", "machine up", "nodeup done", "volumes mounted", "etcd healthy", "kube-apiserver ready", "Node Ready"];

/// Namespace and name prefix of the ConfigMaps selfheal writes through the API.
pub const OBJECT_NAMESPACE: &str = "default";
pub const OBJECT_PREFIX: &str = "keelson-selfheal";

/// How far the replacement of `group`'s killed instance has come: the number of [`PHASES`] done.
fn failover_phase(cloud: &Cloud, cs: &ClusterState, victim: &MachineInfo) -> (usize, Option<MachineInfo>) {
    let replaced = cloud
        .instances()
        .map(|is| is.iter().any(|i| i.group() == victim.group && i.id != victim.instance_id && (i.state == "running" || i.state == "pending")))
        .unwrap_or(false);
    if !replaced {
        return (0, None);
    }
    let Some(new) = cs
        .machines
        .iter()
        .find(|m| m.group == victim.group && m.instance_id != victim.instance_id && m.role == "control-plane" && m.init_pid.is_some_and(cmd::alive))
        .cloned()
    else {
        return (1, None);
    };
    let pid = new.init_pid.unwrap_or(0);
    let done = machine::exec_in(pid, &["systemctl", "show", "-p", "ActiveState", "--value", crate::rootfs::USER_DATA_UNIT])
        .map(|s| s.trim() == "active")
        .unwrap_or(false);
    if !done {
        return (2, Some(new));
    }
    let mounts = machine::exec_in(pid, &["findmnt", "-rn", "-o", "TARGET"]).unwrap_or_default();
    if mounts.lines().filter(|l| l.starts_with("/mnt/master-")).count() < cs.etcd_clusters.len() {
        return (3, Some(new));
    }
    for c in &cs.etcd_clusters {
        match etcd::endpoint(&new.root, c) {
            Some(ep) if etcd::healthy(pid, &ep) => {}
            _ => return (4, Some(new)),
        }
    }
    let kc = Path::new(&cs.kubeconfig);
    let target = crate::kubeapi::Target { server: Some(format!("https://{}", new.ip)), tls_server_name: None };
    if crate::kubeapi::readyz(kc, &target).map(|b| b.trim() != "ok").unwrap_or(true) {
        return (5, Some(new));
    }
    let ready = crate::kubeapi::nodes(kc).map(|n| n.values().any(|n| n.ready && n.internal_ip.as_deref() == Some(new.ip.as_str()))).unwrap_or(false);
    if !ready {
        return (6, Some(new));
    }
    (7, Some(new))
}

/// Probes `/readyz` through the API load balancer every 250 ms while a cycle runs.
struct ApiProbe {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<(u64, u64, f64)>>,
}

impl ApiProbe {
    fn start(kubeconfig: PathBuf) -> ApiProbe {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let (mut ok, mut failed, mut worst, mut since) = (0u64, 0u64, 0f64, None::<Instant>);
            while !flag.load(Ordering::SeqCst) {
                let t = Instant::now();
                let good = crate::kubeapi::readyz(&kubeconfig, &crate::kubeapi::Target::default()).map(|b| b.trim() == "ok").unwrap_or(false);
                if good {
                    ok += 1;
                    if let Some(s) = since.take() {
                        worst = worst.max(s.elapsed().as_secs_f64());
                    }
                } else {
                    failed += 1;
                    since.get_or_insert(t);
                }
                std::thread::sleep(Duration::from_millis(250).saturating_sub(t.elapsed()));
            }
            if let Some(s) = since {
                worst = worst.max(s.elapsed().as_secs_f64());
            }
            (ok, failed, worst)
        });
        ApiProbe { stop, handle: Some(handle) }
    }

    /// (answered, failed, longest outage in seconds)
    fn finish(mut self) -> (u64, u64, f64) {
        self.stop.store(true, Ordering::SeqCst);
        self.handle.take().and_then(|h| h.join().ok()).unwrap_or((0, 0, 0.0))
    }
}

/// The machine `id` of the current cluster state.
fn cs_of(load: &dyn Fn() -> anyhow::Result<ClusterState>, id: &str) -> Option<MachineInfo> {
    load().ok()?.machines.into_iter().find(|m| m.instance_id == id)
}

/// Wait (bounded) until the machine's protokube completed an addon pass; then its count of addons
/// applied (`protokube_addon_applies_total`).
fn addon_applies_after_pass(m: &Option<MachineInfo>, timeout: Duration) -> Result<u64, String> {
    let m = m.as_ref().ok_or("machine gone")?;
    let deadline = Instant::now() + timeout;
    let metric = |text: &str, name: &str| text.lines().find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok());
    loop {
        let text = machine::exec_in(m.init_pid.unwrap_or(0), &["curl", "-fsS", "-m", "5", "http://127.0.0.1:3998/metrics"]).unwrap_or_default();
        if metric(&text, "protokube_addon_passes_total ").unwrap_or(0) >= 1 {
            return metric(&text, "protokube_addon_applies_total ").ok_or_else(|| "no protokube_addon_applies_total".to_string());
        }
        if Instant::now() > deadline {
            return Err(format!("no completed addon pass within {} s", timeout.as_secs()));
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

pub fn selfheal(spec_path: &Path, cycles: u32, keys: u64, cycle_timeout: Duration, up_timeout: Duration) -> anyhow::Result<SelfhealReport> {
    struct Down;
    impl Drop for Down {
        fn drop(&mut self) {
            match down() {
                Ok(_) => eprintln!("keelson-local: down: cleaned up"),
                Err(e) => eprintln!("keelson-local: down failed: {e:#}"),
            }
        }
    }
    up(spec_path, up_timeout)?;
    let _down = Down;
    let st = state();
    let load = || ClusterState::load(&st).ok_or_else(|| anyhow!("cluster state vanished"));
    let cs = load()?;
    let kubeconfig = PathBuf::from(&cs.kubeconfig);
    let cps = control_planes(&cs);
    let first = cps.first().ok_or_else(|| anyhow!("no control-plane machine"))?;
    let main = cs.etcd_clusters.first().cloned().ok_or_else(|| anyhow!("the spec has no etcd clusters"))?;
    let ep = etcd::endpoint(&first.root, &main).ok_or_else(|| anyhow!("no etcd-{main} manifest on {}", first.instance_id))?;
    etcd::write_keys(first.init_pid.unwrap_or(0), &first.root, &ep, KEY_PREFIX, keys).map_err(|e| anyhow!("writing {keys} keys: {e}"))?;
    let t = Instant::now();
    crate::kubeapi::create_configmaps(&kubeconfig, OBJECT_NAMESPACE, OBJECT_PREFIX, keys).map_err(|e| anyhow!("creating {keys} ConfigMaps: {e}"))?;
    let baseline = member_sets(&cs, first).ok_or_else(|| anyhow!("cannot list etcd members"))?;
    println!(
        "selfheal: wrote {keys} keys to etcd {main} and {keys} ConfigMaps through the API ({:.1} s); members {}",
        t.elapsed().as_secs_f64(),
        baseline.iter().map(|(c, m)| format!("{c}=[{}]", m.join(","))).collect::<Vec<_>>().join(" ")
    );
    let cloud = Cloud::new(&cs.endpoint(), &cs.region);
    let mut report =
        SelfhealReport { cycles: 0, healed: 0, keys, intact: 0, objects: keys, objects_intact: 0, failovers: vec![], phases: vec![], validated: false };
    for n in 1..=cycles {
        report.cycles = n;
        let cs = load()?;
        let cps = control_planes(&cs);
        if cps.is_empty() {
            println!("cycle {n}/{cycles}: FAILED: no live control-plane machine to kill");
            break;
        }
        let victim = cps[random_index(cps.len())].clone();
        let probe = ApiProbe::start(kubeconfig.clone());
        let t0 = Instant::now();
        cloud.terminate(&victim.instance_id)?;
        let deadline = t0 + cycle_timeout;
        let mut reached: Vec<Option<f64>> = vec![None; PHASES.len()];
        let mut status = String::from("waiting for a replacement instance");
        let healed = loop {
            if Instant::now() > deadline {
                break None;
            }
            std::thread::sleep(Duration::from_millis(200));
            let Ok(cs) = load() else { continue };
            let (phase, new) = failover_phase(&cloud, &cs, &victim);
            let now = t0.elapsed().as_secs_f64();
            for r in reached.iter_mut().take(phase) {
                r.get_or_insert(now);
            }
            let Some(new) = new.filter(|_| phase == PHASES.len()) else {
                status = format!("at \"{}\"", PHASES[phase.min(PHASES.len() - 1)]);
                continue;
            };
            let pid = new.init_pid.unwrap_or(0);
            let ep = etcd::endpoint(&new.root, &main).ok_or_else(|| anyhow!("no etcd-{main} manifest"))?;
            let count = etcd::count(pid, &ep, KEY_PREFIX).unwrap_or(0);
            if count != keys {
                status = format!("{}: {count}/{keys} keys on the new member", new.instance_id);
                continue;
            }
            let objects = crate::kubeapi::count_configmaps(&kubeconfig, OBJECT_NAMESPACE, OBJECT_PREFIX, keys).unwrap_or(0);
            if objects != keys {
                status = format!("{objects}/{keys} ConfigMaps readable");
                continue;
            }
            match member_sets(&cs, &new) {
                Some(m) if m == baseline => break Some((new.instance_id.clone(), count, objects)),
                Some(m) => status = format!("members changed: {m:?} (want {baseline:?})"),
                None => status = "cannot list members".into(),
            }
        };
        // The failover ends here; then the new control plane's addon controller must find every addon
        // recorded and apply nothing (its first pass may come a little later: not part of the failover).
        let healed_secs = t0.elapsed().as_secs_f64();
        let addons = healed.as_ref().map(|(new, _, _)| addon_applies_after_pass(&cs_of(&load, new), Duration::from_secs(90)));
        let healed = match (healed, &addons) {
            (Some(h), Some(Ok(0))) => Some(h),
            (Some(_), Some(Ok(n))) => {
                status = format!("the new control plane's addon controller re-applied {n} unchanged addons");
                None
            }
            (Some(_), Some(Err(e))) => {
                status = format!("addon controller on the new control plane: {e}");
                None
            }
            (h, _) => h,
        };
        let (answered, failed, outage) = probe.finish();
        let api = format!("API through the load balancer: {answered}/{} probes answered, longest outage {outage:.1} s", answered + failed);
        match healed {
            Some((new, count, objects)) => {
                let secs = healed_secs;
                report.failovers.push(secs);
                report.healed += 1;
                report.intact = count;
                report.objects_intact = objects;
                let phases: Vec<f64> = reached.iter().map(|r| r.unwrap_or(secs)).collect();
                let breakdown = PHASES.iter().zip(&phases).map(|(p, t)| format!("{p} {t:.1}")).collect::<Vec<_>>().join(" → ");
                report.phases.push(phases);
                println!("cycle {n}/{cycles}: killed {} ({}) -> {new} healthy with {count}/{keys} keys and {objects}/{keys} ConfigMaps, same members, failover {secs:.1} s", victim.instance_id, victim.group);
                println!("  phases (s after the kill): {breakdown}");
                println!("  {api}");
                println!("  addons: the new control plane's controller passed and applied 0 (every hash recorded)");
            }
            None => {
                println!(
                    "cycle {n}/{cycles}: FAILED: killed {} ({}); not healed within {} s: {status}; {api}",
                    victim.instance_id,
                    victim.group,
                    cycle_timeout.as_secs()
                );
                if let Ok(cs) = load() {
                    eprint!("{}", diagnose(&cs));
                }
                break;
            }
        }
    }
    // Final check: every member holds every key, and the API every object.
    if let Ok(cs) = load() {
        let mut min = u64::MAX;
        for m in control_planes(&cs) {
            if let Some(ep) = etcd::endpoint(&m.root, &main) {
                min = min.min(etcd::count(m.init_pid.unwrap_or(0), &ep, KEY_PREFIX).unwrap_or(0));
            }
        }
        report.intact = if min == u64::MAX { 0 } else { min };
        report.objects_intact = crate::kubeapi::count_configmaps(&kubeconfig, OBJECT_NAMESPACE, OBJECT_PREFIX, keys).unwrap_or(0);
        if let Ok(nodes) = crate::kubeapi::nodes(&kubeconfig) {
            let live: BTreeSet<&str> = cs.machines.iter().map(|m| m.ip.as_str()).collect();
            let ready = nodes.values().filter(|n| n.ready && n.internal_ip.as_deref().is_some_and(|ip| live.contains(ip))).count();
            println!("selfheal: {ready}/{} machines are Ready Nodes", live.len());
        }
    }
    // The product's own verdict after the replacements: `keelson validate cluster` as an operator
    // runs it (in `keelson-local env`).
    let exports = env_exports()?;
    let keelson = mirror::bin_dir().join("keelson");
    let spec_file = st.root.join("spec.yaml");
    let v = Command::new("sh")
        .args(["-c", r#"eval "$1"; shift; exec "$@""#, "sh", &exports])
        .arg(&keelson)
        .args(["validate", "cluster", "-f"])
        .arg(&spec_file)
        .args(["--wait", "5m"])
        .output()
        .with_context(|| format!("running {}", keelson.display()))?;
    report.validated = v.status.success();
    println!(
        "selfheal: keelson validate cluster after the replacements: {}",
        if report.validated {
            "valid".to_string()
        } else {
            format!("NOT valid:\n{}{}", String::from_utf8_lossy(&v.stdout), String::from_utf8_lossy(&v.stderr))
        }
    );
    if !report.validated {
        if let Ok(cs) = load() {
            eprint!("{}", diagnose_nodes(&cs, &kubeconfig));
        }
    }
    if !report.phases.is_empty() {
        let medians: Vec<String> =
            PHASES.iter().enumerate().map(|(i, p)| format!("{p} {:.1}", median(&report.phases.iter().map(|v| v[i]).collect::<Vec<_>>()))).collect();
        println!("selfheal: median phase times (s after the kill): {}", medians.join(" → "));
    }
    println!(
        "selfheal: {} cycles, {}/{} keys intact, {}/{} ConfigMaps intact, median failover {:.1} s",
        report.cycles,
        report.intact,
        report.keys,
        report.objects_intact,
        report.objects,
        median(&report.failovers)
    );
    Ok(report)
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

    #[test]
    fn medians() {
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
