//! The BootConfig (from user-data) and the NodeupConfig it pins by hash, fetched from the
//! state store under `ConfigBase` (`file://` or a plain path, `http(s)://`).

use std::path::{Path, PathBuf};

use base64::Engine as _;
use keelson_api::nodeup::{BootConfig, NodeupConfig};
use keelson_api::Role;
use sha2::Digest as _;

use crate::assets::{AssetError, Fetcher};

/// Why the node configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{what}: {message}")]
    Parse { what: String, message: String },
    #[error("{path}: InstanceGroupRole {role:?} is not a role nodeup serves (ControlPlane, Node, APIServer)")]
    Role { path: PathBuf, role: String },
    #[error("ConfigBase {base:?}: unsupported scheme (file://, http://, https://, s3://)")]
    Scheme { base: String },
    #[error("state store: {0}")]
    Fetch(#[from] AssetError),
    #[error("state store: {0}")]
    S3(#[from] crate::s3::S3Error),
    #[error("{url}: NodeupConfig hash mismatch: BootConfig pins {expected}, file has {actual}; refusing it")]
    HashMismatch { url: String, expected: String, actual: String },
}

/// `base64(sha256(bytes))`, the way a BootConfig pins its NodeupConfig.
pub fn nodeup_config_hash(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(bytes))
}

/// Read and parse a BootConfig file.
pub fn load_boot_config(path: &Path) -> Result<BootConfig, ConfigError> {
    let bytes = std::fs::read(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
    serde_yaml_ng::from_slice(&bytes).map_err(|e| ConfigError::Parse { what: path.display().to_string(), message: e.to_string() })
}

/// Role of the group a BootConfig is for.
pub fn boot_role(boot: &BootConfig, path: &Path) -> Result<Role, ConfigError> {
    match Role::parse(&boot.instance_group_role) {
        Some(r) if r != Role::Bastion => Ok(r),
        _ => Err(ConfigError::Role { path: path.to_path_buf(), role: boot.instance_group_role.clone() }),
    }
}

/// Read access to the state store rooted at `ConfigBase`.
pub struct StateStore<'a> {
    base: String,
    fetcher: &'a Fetcher,
    s3: Option<crate::s3::S3Store>,
}

impl<'a> StateStore<'a> {
    /// A `file://` (or plain path) or `http(s)://` store.
    pub fn new(config_base: &str, fetcher: &'a Fetcher) -> Result<StateStore<'a>, ConfigError> {
        let base = config_base.trim_end_matches('/');
        let base = if base.starts_with('/') { format!("file://{base}") } else { base.to_string() };
        if !(base.starts_with("file://") || base.starts_with("http://") || base.starts_with("https://")) {
            return Err(ConfigError::Scheme { base: config_base.to_string() });
        }
        Ok(StateStore { base, fetcher, s3: None })
    }

    /// An `s3://bucket/prefix` store.
    pub fn s3(config_base: &str, fetcher: &'a Fetcher, store: crate::s3::S3Store) -> StateStore<'a> {
        StateStore { base: config_base.trim_end_matches('/').to_string(), fetcher, s3: Some(store) }
    }

    pub fn url(&self, rel: &str) -> String {
        format!("{}/{}", self.base, rel.trim_start_matches('/'))
    }

    /// Read one object; `Ok(None)` when it does not exist.
    pub fn read(&self, rel: &str) -> Result<Option<Vec<u8>>, ConfigError> {
        let url = self.url(rel);
        if let Some(s3) = &self.s3 {
            return Ok(s3.get(rel)?);
        }
        if let Some(p) = url.strip_prefix("file://") {
            return match std::fs::read(p) {
                Ok(b) => Ok(Some(b)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(source) => Err(ConfigError::Read { path: p.into(), source }),
            };
        }
        match self.fetcher.get_bytes(&url) {
            Ok(b) => Ok(Some(b)),
            Err(AssetError::Status { status: 404, .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Read one object that must exist.
    pub fn read_required(&self, rel: &str) -> Result<Vec<u8>, ConfigError> {
        let url = self.url(rel);
        self.read(rel)?.ok_or_else(|| ConfigError::Read {
            path: url.into(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "not found in the state store"),
        })
    }
}

/// Fetch `igconfig/<role>/<ig>/nodeupconfig.yaml` and accept it only if its hash is pinned.
pub fn fetch_nodeup_config(boot: &BootConfig, role: Role, store: &StateStore) -> Result<NodeupConfig, ConfigError> {
    let rel = format!("igconfig/{}/{}/nodeupconfig.yaml", role.state_dir(), boot.instance_group_name);
    let bytes = store.read_required(&rel)?;
    let actual = nodeup_config_hash(&bytes);
    if actual != boot.nodeup_config_hash {
        return Err(ConfigError::HashMismatch { url: store.url(&rel), expected: boot.nodeup_config_hash.clone(), actual });
    }
    serde_yaml_ng::from_slice(&bytes).map_err(|e| ConfigError::Parse { what: store.url(&rel), message: e.to_string() })
}
