//! The addon channel: the index `keelson compile` writes into the state store and protokube's addon
//! controller reads — each addon's name, version, manifest path (relative to `addons/`) and the
//! sha256 that pins the manifest.

use serde::{Deserialize, Serialize};

/// Where the index lives under `ConfigBase`.
pub const ADDON_CHANNEL: &str = "addons/bootstrap-channel.yaml";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddonChannel {
    /// `Addons`.
    pub kind: String,
    /// In apply order.
    pub addons: Vec<AddonEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AddonEntry {
    pub name: String,
    pub version: String,
    /// Relative to `addons/`.
    pub manifest: String,
    /// sha256 (hex) of the manifest bytes.
    pub manifest_hash: String,
}
