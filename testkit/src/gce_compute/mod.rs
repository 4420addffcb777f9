//! A Compute Engine v1 emulator for the harness (`/compute/v1/projects/{project}/…`, in process,
//! on [`crate::httpd`]). No emulator of Compute exists to install, so this one follows the REST
//! reference and the discovery document (`compute/v1/compute-api.json`) for the subset a kOps-style
//! tool uses: project, zones, regions; networks, subnetworks, firewalls; instance templates;
//! zonal managed instance groups and the instances they make; disks with label filters and
//! `users[]`; operations that go PENDING → RUNNING → DONE over [`Config::operation_delay`]; Google's
//! JSON errors; pagination; bearer-token auth. Its wire format is checked with Google's own Go
//! client (`google.golang.org/api/compute/v1`) by this crate's `gce_api_wire` test.
//!
//! The harness plays the data plane through [`GceCompute`]: it lists the instances to run (their
//! metadata, `user-data` included, and their address), sets their status, kills them (their MIG
//! makes them again: same name, new id) and sees which disks are attached where.
//!
//! Self links point at the emulator itself (`http://127.0.0.1:PORT/compute/v1/…`) so a client that
//! follows one stays on this machine.

mod disks;
mod filter;
mod instances;
mod migs;
mod network;
mod router;
mod state;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;

pub use filter::Filter;

use crate::google_api::{query, require_bearer, ApiError};
use crate::httpd::{Request, Response, Server};
use state::{str_of, State};

/// The longest an `operations/…/wait` call waits, as GCE (about two minutes).
const MAX_WAIT: Duration = Duration::from_secs(120);

/// What the emulated project looks like.
#[derive(Debug, Clone)]
pub struct Config {
    pub project: String,
    pub project_number: String,
    /// Region → its zones.
    pub regions: BTreeMap<String, Vec<String>>,
    /// How long an operation takes to be DONE (PENDING for its first quarter, then RUNNING); also
    /// how long a new disk stays CREATING.
    pub operation_delay: Duration,
    /// How long a new instance stays PROVISIONING before it is RUNNING by itself; `None`: until
    /// the harness says ([`GceCompute::set_instance_status`]).
    pub boot_delay: Option<Duration>,
}

impl Config {
    /// The project of `examples/gce.yaml`: `acme-prod` in `europe-west1` (zones b, c, d).
    pub fn example() -> Config {
        Config {
            project: "acme-prod".into(),
            project_number: "123456789012".into(),
            regions: BTreeMap::from([("europe-west1".to_string(), vec!["europe-west1-b".into(), "europe-west1-c".into(), "europe-west1-d".into()])]),
            operation_delay: Duration::from_millis(200),
            boot_delay: Some(Duration::from_millis(300)),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ComputeError {
    #[error("no instance {name} in zone {zone}")]
    NoInstance { zone: String, name: String },
    #[error("no disk {name} in zone {zone}")]
    NoDisk { zone: String, name: String },
    #[error("{status:?} is not an instance status (PROVISIONING, STAGING, RUNNING, STOPPING, STOPPED, SUSPENDING, SUSPENDED, REPAIRING, TERMINATED)")]
    BadStatus { status: String },
}

/// An instance as the data plane sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceView {
    pub zone: String,
    pub name: String,
    /// The numeric id (a new one each time a MIG remakes the instance).
    pub id: String,
    pub self_link: String,
    pub status: String,
    /// The MIG that owns it.
    pub mig: Option<String>,
    /// The first interface's address, from its subnetwork's range.
    pub network_ip: String,
    /// The first interface's network (its name).
    pub network: String,
    /// Whether the VM may send and receive packets for addresses not its own (routes through it).
    pub can_ip_forward: bool,
    pub machine_type: String,
    /// Metadata items (`user-data`, `created-by`, …).
    pub metadata: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
    pub disks: Vec<AttachedDiskView>,
    /// The service accounts the instance runs as (from its template): email → scopes.
    pub service_accounts: Vec<(String, Vec<String>)>,
}

impl InstanceView {
    pub fn user_data(&self) -> Option<&str> {
        self.metadata.get("user-data").map(String::as_str)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachedDiskView {
    pub device_name: String,
    /// The disk's name (same zone).
    pub disk: String,
    pub mode: String,
    pub boot: bool,
}

/// A route whose next hop is an instance (what the cloud-controller-manager writes per Node).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteView {
    pub name: String,
    pub dest_range: String,
    /// (zone, instance name)
    pub next_hop_instance: (String, String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskView {
    pub zone: String,
    pub name: String,
    pub id: String,
    pub status: String,
    pub size_gb: u64,
    pub labels: BTreeMap<String, String>,
    /// Names of the instances it is attached to.
    pub users: Vec<String>,
}

/// The emulator: cheap to clone (one shared state); serve it with [`GceCompute::start`].
#[derive(Clone)]
pub struct GceCompute {
    state: Arc<Mutex<State>>,
    /// IAM, Resource Manager and bucket policies, served on the same address.
    iam: crate::gce_iam::GceIam,
}

impl GceCompute {
    pub fn new(cfg: Config) -> GceCompute {
        let iam = crate::gce_iam::GceIam::new(&cfg.project, &cfg.project_number);
        GceCompute { state: Arc::new(Mutex::new(State::new(cfg))), iam }
    }

    /// The project's identities and policies (served under `/iam/v1/`, `/cloudresourcemanager/v1/`
    /// and `/storage/v1/b/{bucket}/iam`).
    pub fn iam(&self) -> crate::gce_iam::GceIam {
        self.iam.clone()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind: keep serving it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Serve on 127.0.0.1 (self links then name that address). Point Google's clients at
    /// `server.url("compute/v1/")`.
    pub fn start(&self) -> Server {
        self.start_with(None)
    }

    /// Serve Compute and, on the same address, Cloud DNS (`/dns/v1/…`).
    pub fn start_with(&self, dns: Option<crate::cloud_dns::CloudDns>) -> Server {
        self.start_on("127.0.0.1:0".parse().expect("loopback address"), dns).expect("bind 127.0.0.1")
    }

    /// Serve Compute (and Cloud DNS) on `addr` (port 0: a free one): the local cloud serves it on
    /// its bridge address, where the machines reach it; self links name that address.
    pub fn start_on(&self, addr: std::net::SocketAddr, dns: Option<crate::cloud_dns::CloudDns>) -> std::io::Result<Server> {
        let me = self.clone();
        let server = Server::start_on(
            addr,
            Arc::new(move |req: &Request| {
                if req.path.starts_with("/dns/") {
                    if let Some(d) = &dns {
                        return d.answer(req);
                    }
                }
                if crate::gce_iam::GceIam::serves(&req.path) {
                    return me.iam.answer(req);
                }
                me.answer(req)
            }),
        )?;
        self.lock().base_url = server.url("compute/v1/");
        Ok(server)
    }

    /// The answer to one request.
    pub fn answer(&self, req: &Request) -> Response {
        match self.try_answer(req) {
            Ok(v) => crate::google_api::json_response(200, &v),
            Err(e) => e.response(),
        }
    }

    fn try_answer(&self, req: &Request) -> Result<Value, ApiError> {
        require_bearer(req)?;
        if !req.path.starts_with(router::PREFIX) {
            return Err(ApiError::not_found(&req.path));
        }
        let q = query(&req.query);
        let reply = router::route(&mut self.lock(), req, &q)?;
        match reply {
            router::Reply::Json(v) => Ok(v),
            router::Reply::Wait(scope, name) => {
                let left = {
                    let st = self.lock();
                    st.operations.get(&name).map(|o| state::remaining(o, Instant::now())).unwrap_or_default()
                };
                // Bounded: an operation is done after its delay; GCE answers after ~2 min at most.
                std::thread::sleep(left.min(MAX_WAIT));
                let mut st = self.lock();
                st.advance(Instant::now());
                router::operation(&st, scope, &name)
            }
        }
    }

    // ---- the data plane's side

    /// Every instance, by zone then name.
    pub fn instances(&self) -> Vec<InstanceView> {
        let mut st = self.lock();
        st.advance(Instant::now());
        st.instances.values().map(instance_view).collect()
    }

    pub fn instance(&self, zone: &str, name: &str) -> Option<InstanceView> {
        self.instances().into_iter().find(|i| i.zone == zone && i.name == name)
    }

    /// Set an instance's status (the VM booted, stopped, …). TERMINATED in a MIG: the group makes it
    /// again, as GCE does for a VM that stops outside its control.
    pub fn set_instance_status(&self, zone: &str, name: &str, status: &str) -> Result<(), ComputeError> {
        const STATUSES: [&str; 9] = ["PROVISIONING", "STAGING", "RUNNING", "STOPPING", "STOPPED", "SUSPENDING", "SUSPENDED", "REPAIRING", "TERMINATED"];
        if !STATUSES.contains(&status) {
            return Err(ComputeError::BadStatus { status: status.into() });
        }
        let mut st = self.lock();
        let i = st.instances.get_mut(&(zone.to_string(), name.to_string())).ok_or_else(|| ComputeError::NoInstance { zone: zone.into(), name: name.into() })?;
        i.status = status.to_string();
        i.boots_at = None;
        st.advance(Instant::now());
        Ok(())
    }

    /// The instance dies and is gone (with its auto-delete disks); a MIG makes it again at once:
    /// same name, new id, PROVISIONING.
    pub fn kill_instance(&self, zone: &str, name: &str) -> Result<(), ComputeError> {
        let mut st = self.lock();
        instances::remove(&mut st, zone, name).ok_or_else(|| ComputeError::NoInstance { zone: zone.into(), name: name.into() })?;
        st.advance(Instant::now());
        Ok(())
    }

    /// Every zonal MIG: (zone, name, target size).
    pub fn migs(&self) -> Vec<(String, String, u64)> {
        let st = self.lock();
        st.migs.iter().map(|((zone, name), m)| (zone.clone(), name.clone(), m.body["targetSize"].as_u64().unwrap_or(0))).collect()
    }

    /// The routes through an instance, by name.
    pub fn instance_routes(&self) -> Vec<RouteView> {
        let st = self.lock();
        st.routes
            .values()
            .filter_map(|r| {
                let hop = r["nextHopInstance"].as_str()?;
                let mut it = hop.rsplit('/');
                let (name, _, zone) = (it.next()?, it.next()?, it.next()?);
                Some(RouteView { name: str_of(r, "name").into(), dest_range: str_of(r, "destRange").into(), next_hop_instance: (zone.into(), name.into()) })
            })
            .collect()
    }

    pub fn disks(&self) -> Vec<DiskView> {
        let mut st = self.lock();
        st.advance(Instant::now());
        st.disks.iter().map(|((zone, name), d)| disk_view(&st, zone, name, d)).collect()
    }

    pub fn disk(&self, zone: &str, name: &str) -> Result<DiskView, ComputeError> {
        self.disks().into_iter().find(|d| d.zone == zone && d.name == name).ok_or_else(|| ComputeError::NoDisk { zone: zone.into(), name: name.into() })
    }
}

fn string_map(v: &Value) -> BTreeMap<String, String> {
    v.as_object().map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string())).collect()).unwrap_or_default()
}

fn instance_view(i: &state::Instance) -> InstanceView {
    let b = &i.body;
    let metadata = b["metadata"]["items"].as_array().into_iter().flatten().map(|it| (str_of(it, "key").to_string(), str_of(it, "value").to_string())).collect();
    let disks = b["disks"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| AttachedDiskView {
            device_name: str_of(d, "deviceName").into(),
            disk: state::last_segment(str_of(d, "source")).into(),
            mode: str_of(d, "mode").into(),
            boot: d["boot"].as_bool() == Some(true),
        })
        .collect();
    InstanceView {
        zone: state::last_segment(str_of(b, "zone")).into(),
        name: str_of(b, "name").into(),
        id: str_of(b, "id").into(),
        self_link: str_of(b, "selfLink").into(),
        status: i.status.clone(),
        mig: i.mig.clone(),
        network_ip: str_of(&b["networkInterfaces"][0], "networkIP").into(),
        network: state::last_segment(str_of(&b["networkInterfaces"][0], "network")).into(),
        can_ip_forward: b["canIpForward"].as_bool() == Some(true),
        machine_type: state::last_segment(str_of(b, "machineType")).into(),
        metadata,
        labels: string_map(&b["labels"]),
        disks,
        service_accounts: b["serviceAccounts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| (str_of(a, "email").to_string(), a["scopes"].as_array().into_iter().flatten().filter_map(|s| s.as_str().map(str::to_string)).collect()))
            .collect(),
    }
}

fn disk_view(st: &State, zone: &str, name: &str, d: &state::Disk) -> DiskView {
    let v = disks::render(st, d);
    DiskView {
        zone: zone.into(),
        name: name.into(),
        id: str_of(&v, "id").into(),
        status: str_of(&v, "status").into(),
        size_gb: str_of(&v, "sizeGb").parse().unwrap_or(0),
        labels: string_map(&v["labels"]),
        users: v["users"].as_array().into_iter().flatten().filter_map(Value::as_str).map(|u| state::last_segment(u).to_string()).collect(),
    }
}
