//! The BootConfig (from user-data) and the NodeupConfig it pins by hash, fetched from the
//! state store under `ConfigBase` (`file://` or a plain path, `http(s)://`, `s3://`).

use std::path::{Path, PathBuf};

use keelson_api::nodeup::{BootConfig, NodeupConfig};
use keelson_api::Role;

/// Why the node configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Parse {
        what: String,
        #[source]
        source: serde_yaml_ng::Error,
    },
    #[error("{path}: InstanceGroupRole {role:?} is not a role nodeup serves (ControlPlane, Node, APIServer)")]
    Role { path: PathBuf, role: String },
    #[error("state store: {0}")]
    Store(#[from] base::StoreError),
    #[error("{url}: NodeupConfig hash mismatch: BootConfig pins {expected}, file has {actual}; refusing it")]
    HashMismatch { url: String, expected: String, actual: String },
}

/// Read and parse a BootConfig file ([`parse_boot_config`]).
pub fn load_boot_config(path: &Path) -> Result<BootConfig, ConfigError> {
    let bytes = std::fs::read(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
    parse_boot_config(&path.display().to_string(), &bytes)
}

/// Parse a BootConfig; `what` (its file) names it in errors.
pub fn parse_boot_config(what: &str, bytes: &[u8]) -> Result<BootConfig, ConfigError> {
    serde_yaml_ng::from_slice(bytes).map_err(|source| ConfigError::Parse { what: what.to_string(), source })
}

/// Accept a NodeupConfig only if its sha256 is `pinned` (the BootConfig's `NodeupConfigHash`), then
/// parse it; `url` names it in errors.
pub fn parse_nodeup_config(url: &str, pinned: &str, bytes: &[u8]) -> Result<NodeupConfig, ConfigError> {
    let actual = base::nodeup_config_hash(bytes);
    if actual != pinned {
        return Err(ConfigError::HashMismatch { url: url.to_string(), expected: pinned.to_string(), actual });
    }
    serde_yaml_ng::from_slice(bytes).map_err(|source| ConfigError::Parse { what: url.to_string(), source })
}

/// Role of the group a BootConfig is for.
pub fn boot_role(boot: &BootConfig, path: &Path) -> Result<Role, ConfigError> {
    match boot.instance_group_role {
        Role::Bastion => Err(ConfigError::Role { path: path.to_path_buf(), role: boot.instance_group_role.to_string() }),
        r => Ok(r),
    }
}

/// Read access to the state store rooted at `ConfigBase` ([`base::StateStore`]), for nodeup's
/// synchronous tasks: each read runs on a small runtime this store owns.
pub struct StateStore {
    store: base::StateStore,
    runtime: tokio::runtime::Runtime,
}

impl StateStore {
    /// A store whose client was built on `runtime` (an S3 client must be used on the runtime it
    /// was built on).
    pub fn with_runtime(store: base::StateStore, runtime: tokio::runtime::Runtime) -> StateStore {
        StateStore { store, runtime }
    }

    pub fn url(&self, rel: &str) -> String {
        self.store.url(rel)
    }

    /// Read one object; `Ok(None)` when it does not exist.
    pub fn read(&self, rel: &str) -> Result<Option<Vec<u8>>, ConfigError> {
        Ok(self.runtime.block_on(self.store.get(rel))?)
    }

    /// Read one object that must exist.
    pub fn read_required(&self, rel: &str) -> Result<Vec<u8>, ConfigError> {
        Ok(self.runtime.block_on(self.store.get_required(rel))?)
    }
}

/// Fetch `igconfig/<role>/<ig>/nodeupconfig.yaml` and accept it only if its hash is pinned.
pub fn fetch_nodeup_config(boot: &BootConfig, role: Role, store: &StateStore) -> Result<NodeupConfig, ConfigError> {
    let rel = format!("igconfig/{}/{}/nodeupconfig.yaml", role.state_dir(), boot.instance_group_name);
    let bytes = store.read_required(&rel)?;
    parse_nodeup_config(&store.url(&rel), &boot.nodeup_config_hash, &bytes)
}
