//! A GCE machine's metadata server: what it serves (`GceMachine`, persisted in the machine's
//! directory) and the server itself (`keelson-local gce-metadata`, run in the machine's namespace on
//! 169.254.169.254:80, the address `metadata.google.internal` has on GCE). The answers are testkit's
//! documented-behaviour server ([`testkit::gce_metadata`]); identity tokens are signed by the local
//! cloud's one key, whose JWK set the daemon serves where the join server is told to fetch
//! Google's keys.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use testkit::gce_metadata::{self, InstanceFacts, Signer};

/// The key id the local cloud's identity tokens carry.
pub const KEY_ID: &str = "keelson-local-1";

#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a GCE machine's metadata: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// What one machine's metadata server serves, and the environment its services get.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct GceMachine {
    /// The instance as Compute has it: project, zone, name, numeric id, internal IP, hostname, the
    /// template's metadata items as attributes (`user-data`, `cluster-name`,
    /// `kops-k8s-io-instance-group-name`), its service account and scopes.
    pub facts: InstanceFacts,
    /// The identity tokens' signing key (the local cloud's, PKCS#1 DER, 0600).
    pub signing_key: PathBuf,
    /// `DefaultEnvironment` of the machine's systemd: where the local cloud's Google endpoints are
    /// (`STORAGE_EMULATOR_HOST`, the Compute/Cloud DNS base URL).
    pub env: Vec<(String, String)>,
}

impl GceMachine {
    pub fn read(path: &Path) -> Result<GceMachine, MetadataError> {
        let text = std::fs::read_to_string(path).map_err(|source| MetadataError::Io { path: path.to_path_buf(), source })?;
        serde_json::from_str(&text).map_err(|source| MetadataError::Json { path: path.to_path_buf(), source })
    }
}

/// Serve `m` on `listen` until the process is killed.
pub fn serve(m: &GceMachine, listen: &str) -> anyhow::Result<()> {
    let signer = Arc::new(Signer::load(&m.signing_key, KEY_ID)?);
    let addr: std::net::SocketAddr = listen.parse()?;
    let _server = gce_metadata::start_on(addr, &m.facts, signer)?;
    println!("gce-metadata: listening on {listen} for {} ({})", m.facts.name, m.facts.id);
    loop {
        std::thread::park();
    }
}
