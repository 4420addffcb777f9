//! The daemon on GCE (`keelson-local daemon` when the spec says `cloudProvider: gce`): Google's
//! side ([`super::cloud`]), the mirror and registry ([`crate::cluster::assets`]), `keelson apply
//! --yes` against them, then every [`TICK`](crate::cluster::TICK):
//! - **the MIG controller's data plane**: every instance a MIG made (PROVISIONING, STAGING or
//!   RUNNING) gets a machine with its own metadata server; the instance is RUNNING once the
//!   machine is up. The machine is named by the instance's numeric id, so an instance the MIG
//!   recreates (same name, new id) is a new machine, its user-data run again, as cloud-init runs
//!   once per instance id; a machine whose instance is gone is powered off.
//! - **the persistent-disk data plane**: a disk in an instance's `disks[]` (not its boot disk,
//!   which is the machine's root) is a loop device in that machine as `/dev/sd<x>` with GCE's
//!   by-id names for its `deviceName`;
//! - **the VPC resolver**: Cloud DNS A records in every machine's hosts file;
//! - the API load balancer's stand-in on 127.0.0.1 (the spec's API is DNS-only on GCE).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use testkit::gce_compute::InstanceView;
use testkit::gce_metadata::InstanceFacts;

use super::cloud::{LocalGce, PROJECT_NUMBER};
use super::metadata::GceMachine;
use crate::balancer::{self, Balancers};
use crate::cluster::assets;
use crate::cluster::daemon::{run_until_stopped, watch_bootstrap_addons};
use crate::cluster::fleet::{event, Fleet, Place, StepTimer, Volume};
use crate::cluster::ClusterState;
use crate::machine::{Environment, MachineData};
use crate::net::{self, Segment};
use crate::paths::State;
use crate::spec::{LocalCloud, Spec};
use crate::volumes::Bus;
use crate::{cmd, kubernetes, mirror};

/// The variable that points the product's Compute and Cloud DNS clients at another base URL
/// (`<url>/compute/v1/`, `<url>/dns/v1/`): the machines get the local one.
pub const GCE_ENDPOINT_ENV: &str = cloud::gce::ENDPOINT_ENV;
/// The variable that points the join server at another JWK set than Google's.
pub const GCE_JWKS_ENV: &str = base::node_join_gce::JWKS_URL_ENV;

/// The CIDR `keelson compile` gives the spec's first subnet (GCE subnets are regional; kOps
/// allocates a /20 of 10.0.0.0/8 when the spec names none): the machines' segment.
fn compiled_subnet_cidr(keelson: &Path, spec: &Path, out: &Path) -> anyhow::Result<String> {
    let _ = std::fs::remove_dir_all(out);
    cmd::run(Command::new(keelson).args(["compile", "--offline", "-f"]).arg(spec).arg("--out").arg(out))
        .context("keelson compile (to learn the subnet's CIDR)")?;
    let completed = out.join("cluster-completed.yaml");
    let text = std::fs::read_to_string(&completed).with_context(|| completed.display().to_string())?;
    for d in serde_yaml_ng::Deserializer::from_str(&text) {
        let v = <serde_yaml_ng::Value as serde::Deserialize>::deserialize(d)?;
        if let Some(cidr) = v.get("spec").and_then(|s| s.get("subnets")).and_then(|s| s.get(0)).and_then(|s| s.get("cidr")).and_then(|c| c.as_str()) {
            return Ok(cidr.to_string());
        }
    }
    Err(anyhow!("{}: no spec.subnets[0].cidr", completed.display()))
}

struct GceDaemon {
    state: State,
    gce: LocalGce,
    fleet: Fleet,
    control_plane_groups: BTreeSet<String>,
    /// What every machine's services see (the local endpoints).
    machine_env: Vec<(String, String)>,
    balancers: Balancers,
    balancers_synced: Option<Instant>,
    routes_synced: Option<Instant>,
    cs: ClusterState,
}

/// Run the GCE local cloud until told to stop (the stop file, SIGTERM); tears it down.
pub fn run(state: &State, spec: &Spec, project: &str, cs: &mut ClusterState, stop: &AtomicBool) -> anyhow::Result<()> {
    let keelson = mirror::bin_dir().join("keelson");
    let cidr = compiled_subnet_cidr(&keelson, Path::new(&spec.path), &state.root.join("precompiled"))?;
    let seg = Segment::from_cidr(&cidr).ok_or_else(|| anyhow!("spec.subnets[0]: {cidr:?} is not an IPv4 CIDR /8../30"))?;
    let gw = seg.gateway;
    cs.gateway = gw.to_string();
    net::ensure_bridge(&cs.bridge, &seg)?;
    net::ensure_vpc_router(&cs.bridge)?;
    let mirror_l = std::net::TcpListener::bind((gw, 0))?;
    let gcs_l = std::net::TcpListener::bind((gw, 0))?;
    let api_l = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    cs.mirror_port = mirror_l.local_addr()?.port();
    cs.api_port = api_l.local_addr()?.port();
    let gcs_port = gcs_l.local_addr()?.port();
    mirror_l.set_nonblocking(true)?;
    gcs_l.set_nonblocking(true)?;
    let mirror_root = state.mirror_dir();
    std::fs::create_dir_all(&mirror_root)?;

    cs.phase = "starting the local GCE (Compute, Cloud DNS, Cloud Storage)".into();
    cs.save(state);
    let mut zones = spec.group_zones();
    if zones.is_empty() {
        zones = ["b", "c", "d"].iter().map(|z| format!("{}-{z}", spec.region)).collect();
    }
    let gce = LocalGce::start(&state.root, gw, project, &spec.region, &zones, gcs_port)?;
    cs.gce_api = gce.api_url.clone();
    cs.gce_project = project.to_string();
    cs.gce_storage = gce.gcs_url.clone();
    cs.gce_metadata_host = gce.host_metadata.clone();
    // The mirror, the Cloud Storage relay and the load balancers run on one runtime that lives as
    // long as the daemon.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    {
        let _guard = rt.enter();
        rt.spawn(mirror::serve(tokio::net::TcpListener::from_std(mirror_l)?, mirror_root));
        // Cloud Storage with its access control: the caller of a token is the instance's service
        // account and scopes (the host's token is the project's default account's).
        rt.spawn(testkit::gcs_gate::serve(tokio::net::TcpListener::from_std(gcs_l)?, gce.gcs_target(), gce.compute.iam(), gce.callers()));
    }
    let events: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    let balancers = {
        let events = events.clone();
        Balancers::new(rt.handle().clone(), api_l, Arc::new(move |m| event(&events, m)))?
    };
    if let Some(bucket) = spec.bucket() {
        gce.create_bucket(&bucket)?;
    }
    if let Some(zone) = spec.zone_name() {
        gce.ensure_dns_zone(&zone)?;
    }

    let assets = assets::build(state, cs, gw, kubernetes::Ccm::Gce, &[crate::rootfs::Suite::Bookworm].into(), &|mirror_url, registry| {
        spec.local_text(&LocalCloud {
            file_repository: mirror_url.to_string(),
            registry: registry.to_string(),
            // The emulator keeps a template's image as a name: the spec's stays (machines boot Debian 12).
            images: Default::default(),
            ccm_image: kubernetes::Ccm::Gce.reference(registry),
            gce_endpoint: gce.api_url.clone(),
            coredns_image: format!("{registry}/coredns-coredns:v{}", kubernetes::COREDNS_VERSION),
            aws_endpoint: String::new(),
            // Nothing answers DNS there: names outside the cluster fail fast, as they do on the machines.
            dns_upstream: gw.to_string(),
        })
    })?;

    cs.phase = "keelson apply --yes".into();
    cs.save(state);
    // `keelson <args> -f SPEC` against the local GCE, as against Google's.
    let keelson_on_cloud = |args: &[&str]| {
        let mut c = Command::new(&assets.keelson);
        c.args(args)
            .args(["--offline", "-f"])
            .arg(&assets.local_spec)
            .arg("--endpoint-url")
            .arg(&gce.api_url)
            .arg("--asset-hashes")
            .arg(&assets.overrides)
            .env("KOPS_BASE_URL", &assets.kops_base)
            .env("STORAGE_EMULATOR_HOST", &gce.gcs_url)
            // The local cloud serves plain HTTP on the bridge: allowed explicitly.
            .env(base::plain_http::ALLOW_ENV, gw.to_string())
            .env("GCE_METADATA_HOST", &gce.host_metadata)
            .env(GCE_ENDPOINT_ENV, &gce.api_url);
        if let Some(bundle) = &assets.image_digests {
            c.env("KEELSON_IMAGE_DIGESTS", bundle);
        }
        c
    };
    let applied =
        cmd::run(keelson_on_cloud(&["apply", "--yes"]).arg("--nodeup-asset").arg(&assets.nodeup_asset)).context("keelson apply --yes against the local GCE")?;
    std::fs::write(state.root.join("apply.log"), &applied)?;
    let kubeconfig = state.root.join("kubeconfig");
    let api_url = format!("https://127.0.0.1:{}", cs.api_port);
    cmd::run(keelson_on_cloud(&["export", "kubeconfig", "--admin", "--ttl", "72h"]).arg("--kubeconfig").arg(&kubeconfig).arg("--server").arg(&api_url))
        .context("keelson export kubeconfig --admin")?;
    cs.kubeconfig = kubeconfig.display().to_string();
    cs.nodeup_asset = assets.nodeup_asset.clone();
    cs.kubectl = assets.kubernetes_bin.join("kubectl").display().to_string();
    watch_bootstrap_addons(kubeconfig.clone(), events.clone());

    cs.phase = "running".into();
    cs.save(state);
    let env = Environment {
        aws_endpoint: String::new(),
        s3_endpoint: None,
        region: spec.region.clone(),
        hosts: vec![],
        test_cert_validity_seconds: std::env::var(base::pki::TEST_VALIDITY_ENV).ok().and_then(|v| base::pki::parse_test_validity(&v).ok()).map(|d| d.as_secs()),
    };
    let machine_env = vec![
        ("STORAGE_EMULATOR_HOST".to_string(), gce.gcs_url.clone()),
        // Cloud Storage (the state store) over plain HTTP on the bridge: allowed explicitly.
        (base::plain_http::ALLOW_ENV.to_string(), gw.to_string()),
        // With an emulator host, Cloud Storage clients send a token only from a metadata server
        // named to them: the machine's own, so the storage gate sees the instance's identity.
        ("GCE_METADATA_HOST".to_string(), "169.254.169.254".to_string()),
        (GCE_ENDPOINT_ENV.to_string(), gce.api_url.clone()),
        (GCE_JWKS_ENV.to_string(), gce.jwks_url.clone()),
    ];
    let place = Place {
        state: state.clone(),
        seg,
        bridge: cs.bridge.clone(),
        lower: assets.lower.clone(),
        foreign: assets.foreign.clone(),
        releases: BTreeMap::new(),
        self_exe: std::env::current_exe()?,
        env,
    };
    let mut d = GceDaemon {
        state: state.clone(),
        gce,
        fleet: Fleet::new(place, events),
        control_plane_groups: spec.control_plane_groups().into_iter().collect(),
        machine_env,
        balancers,
        balancers_synced: None,
        routes_synced: None,
        cs: cs.clone(),
    };
    let nudge = d.fleet.nudge.clone();
    d.fleet.watch_boot_priority(kubeconfig);
    run_until_stopped(state, stop, &nudge, |d: &mut GceDaemon, m| d.fleet.event(m), |d: &mut GceDaemon| d.reconcile(), &mut d);
    d.cs.phase = "stopping".into();
    d.cs.save(&d.state);
    d.fleet.shutdown();
    d.cs.phase = "stopped".into();
    d.cs.machines.clear();
    d.cs.save(&d.state);
    *cs = d.cs.clone();
    drop(assets);
    Ok(())
}

/// Whether Compute would call the instance's VM up (or coming up).
fn live(i: &InstanceView) -> bool {
    matches!(i.status.as_str(), "PROVISIONING" | "STAGING" | "RUNNING")
}

impl GceDaemon {
    fn reconcile(&mut self) -> anyhow::Result<()> {
        let mut step = StepTimer::start(&self.fleet.events);
        let instances = self.gce.compute.instances();
        let live: BTreeMap<&str, &InstanceView> = instances.iter().filter(|i| live(i)).map(|i| (i.id.as_str(), i)).collect();
        step.done("listing instances");
        self.fleet.stop_gone(|id| live.contains_key(id))?;
        step.done("stopping machines of instances that are gone");
        for (id, inst) in &live {
            if self.fleet.knows(id)? {
                continue;
            }
            let data = self.machine_data(inst);
            let group = inst.metadata.get("kops-k8s-io-instance-group-name").cloned().unwrap_or_default();
            let role = if self.control_plane_groups.contains(&group) { "control-plane" } else { "node" };
            let (compute, zone, name, id) = (self.gce.compute.clone(), inst.zone.clone(), inst.name.clone(), id.to_string());
            // The VM is up: Compute says RUNNING (this incarnation only: a recreated one is another id).
            let running = Box::new(move || {
                if compute.instance(&zone, &name).is_some_and(|i| i.id == id) {
                    let _ = compute.set_instance_status(&zone, &name, "RUNNING");
                }
            });
            self.fleet.boot(MachineData::Gce(Box::new(data)), role.to_string(), inst.mig.clone().unwrap_or(group), running)?;
        }
        step.done("starting machines");
        self.sync_disks(&instances)?;
        step.done("disks");
        self.sync_routes(&instances);
        step.done("routes");
        let records = self.gce.a_records();
        self.fleet.sync_hosts(&records);
        step.done("DNS");
        self.publish(&instances);
        step.done("load balancers and state");
        Ok(())
    }

    /// What the instance's metadata server serves: the instance as Compute has it.
    fn machine_data(&self, inst: &InstanceView) -> GceMachine {
        let project = self.gce.project.clone();
        let (service_account, scopes) = inst.service_accounts.first().cloned().map(|(e, s)| (Some(e), s)).unwrap_or((None, Vec::new()));
        GceMachine {
            facts: InstanceFacts {
                numeric_project: PROJECT_NUMBER.to_string(),
                zone: inst.zone.clone(),
                name: inst.name.clone(),
                id: inst.id.clone(),
                internal_ip: inst.network_ip.clone(),
                network: inst.network.clone(),
                machine_type: inst.machine_type.clone(),
                hostname: format!("{}.{}.c.{project}.internal", inst.name, inst.zone),
                attributes: inst.metadata.clone(),
                service_account,
                scopes,
                project,
            },
            signing_key: self.gce.signing_key.clone(),
            env: self.machine_env.clone(),
        }
    }

    /// Every persistent disk but the boot disks: in the machine of the instance whose `disks[]`
    /// holds it (by the `deviceName` it was attached with), or in none.
    fn sync_disks(&mut self, instances: &[InstanceView]) -> anyhow::Result<()> {
        let mut vols = Vec::new();
        for d in self.gce.compute.disks() {
            let holder = instances.iter().filter(|i| i.zone == d.zone && live(i)).find_map(|i| i.disks.iter().find(|a| a.disk == d.name).map(|a| (i, a)));
            if holder.is_some_and(|(_, a)| a.boot) {
                continue;
            }
            vols.push(Volume {
                id: format!("{}/{}", d.zone, d.name),
                name: d.name.clone(),
                size_gib: d.size_gb,
                attached_to: holder.map(|(i, _)| i.id.clone()),
                bus: Bus::GcePd { device_name: holder.map(|(_, a)| a.device_name.clone()).unwrap_or_else(|| d.name.clone()) },
            });
        }
        self.fleet.sync_volumes(&vols)
    }

    /// Play the VPC's routing: every route whose next hop is an instance (the cloud-controller-
    /// manager's route controller writes one per Node's pod CIDR) becomes a host route on the bridge
    /// via that instance's address, while the instance runs and may forward (`canIpForward`: GCE
    /// drops packets for other addresses otherwise). Every second.
    fn sync_routes(&mut self, instances: &[InstanceView]) {
        if self.routes_synced.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            return;
        }
        self.routes_synced = Some(Instant::now());
        let mut want = BTreeMap::new();
        for r in self.gce.compute.instance_routes() {
            let (zone, name) = &r.next_hop_instance;
            if let Some(i) = instances.iter().find(|i| &i.zone == zone && &i.name == name && i.status == "RUNNING" && i.can_ip_forward) {
                want.insert(r.dest_range.clone(), i.network_ip.clone());
            }
        }
        self.fleet.sync_routes(&want, "VPC routes");
    }

    fn publish(&mut self, instances: &[InstanceView]) {
        let machines = self.fleet.infos();
        if self.balancers_synced.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
            self.balancers_synced = Some(Instant::now());
            self.cs.services = self.balancers.sync(vec![balancer::api_stand_in(&machines)]);
        }
        self.cs.machines = machines;
        self.cs.exposed = self.fleet.exposed.clone();
        self.cs.failed = self.fleet.failed.lock().map(|f| f.clone()).unwrap_or_default();
        self.cs.events = self.fleet.events.lock().map(|e| e.clone()).unwrap_or_default();
        self.cs.groups = self.gce.compute.migs().into_iter().map(|(_, name, size)| (name, size as i32)).collect();
        self.cs.instances = instances.iter().filter(|i| i.status == "RUNNING").count();
        self.cs.save(&self.state);
    }
}

/// Where `keelson-local kill` finds an instance: by name, or by the numeric id its machine has.
pub fn instance_path(cs: &ClusterState, instance: &str) -> Option<String> {
    let m = cs.machines.iter().find(|m| m.name == instance || m.instance_id == instance)?;
    Some(format!("/compute/v1/projects/{}/zones/{}/instances/{}", cs.gce_project, m.zone, m.name))
}
