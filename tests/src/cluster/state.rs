//! The cluster state file (`cluster.json`) the daemon writes and the commands read.

use std::collections::BTreeMap;
use std::fs;

use crate::machine::MachineInfo;
use crate::paths::State;

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
    /// The machines' S3 relay (AWS): moto, through the store-outage gate.
    #[serde(default)]
    pub s3_relay_port: u16,
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
    /// The machines boot from a baked image (`--baked`): the bundle's files in nodeup's cache and
    /// its images in containerd's store ([`super::baked`]).
    #[serde(default)]
    pub baked: bool,
    /// The mirror and the registry hold only what `keelson bundle push` put there (`--air-gapped`).
    #[serde(default)]
    pub air_gapped: bool,
    /// The API load balancer: 127.0.0.1:<api_port> plays the cluster's network load balancer
    /// (its target group's members, health-checked; [`crate::balancer`]).
    #[serde(default)]
    pub api_port: u16,
    /// Services of `type: LoadBalancer` (`namespace/name`) → the host URLs of their load
    /// balancers' listeners (`keelson-local service-url`).
    #[serde(default)]
    pub services: BTreeMap<String, Vec<String>>,
    /// Admin kubeconfig (server https://127.0.0.1:<api_port>), written after apply.
    #[serde(default)]
    pub kubeconfig: String,
    /// The nodeup binary `keelson apply` gave user-data (`ARCH=SHA256@URL`, the local build in the
    /// mirror): `keelson-local env` exports it as `KEELSON_NODEUP_ASSET`.
    #[serde(default)]
    pub nodeup_asset: String,
    /// The kubectl built for the cluster's version.
    #[serde(default)]
    pub kubectl: String,
    /// GCE: the local Compute/Cloud DNS base URL (`http://<bridge>:<port>`) and the project.
    #[serde(default)]
    pub gce_api: String,
    #[serde(default)]
    pub gce_project: String,
    /// GCE: `STORAGE_EMULATOR_HOST` and `GCE_METADATA_HOST` for `keelson` on the host.
    #[serde(default)]
    pub gce_storage: String,
    #[serde(default)]
    pub gce_metadata_host: String,
}

impl ClusterState {
    /// How the machines get what they run.
    pub fn boot(&self) -> super::Boot {
        super::Boot { baked: self.baked, air_gapped: self.air_gapped }
    }

    pub fn load(state: &State) -> Option<ClusterState> {
        let text = fs::read_to_string(state.cluster_file()).ok()?;
        serde_json::from_str(&text).ok()
    }
    pub(crate) fn save(&self, state: &State) {
        if let Ok(text) = serde_json::to_string_pretty(self) {
            if let Err(e) = base::fs::write_atomic(&state.cluster_file(), text.as_bytes(), 0o600, None) {
                eprintln!("keelson-local: saving the cluster state: {e}");
            }
        }
    }
    /// Whether the local cloud plays GCE (else AWS, on moto).
    pub fn is_gce(&self) -> bool {
        !self.gce_api.is_empty()
    }
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.moto_port)
    }
}
