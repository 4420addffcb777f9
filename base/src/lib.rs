//! What every Keelson agent and the compiler share, written once.
//!
//! Owns: the state store at `ConfigBase` ([`store`]: `file://`, `http(s)://`, `s3://`), the pin that
//! ties a BootConfig to its NodeupConfig ([`nodeup_config_hash`]), the cluster PKI ([`pki`]) and when its certificates are renewed ([`renewal`]), the encryption-at-rest configuration ([`encryption`]), atomic
//! file writes ([`fs`]), the managed block of the hosts file ([`hosts`]) and file trees ([`Tree`]), the etcd backup store's layout, retention and
//! restore protocol ([`etcd_backup`]), asset references `sha256@url` ([`asset`]), the one IMDSv2 client ([`imds`]) and,
//! with feature `aws`, the one AWS SDK configuration ([`aws`]). Must not: know about instance groups,
//! Kubernetes components or cloud resources — those belong to the compiler, nodeup, protokube and
//! `keelson-cloud`; nor read the environment except the documented AWS variables the SDK reads.

pub mod asset;
#[cfg(feature = "aws")]
pub mod aws;
pub mod bootstrap_token;
pub mod encryption;
pub mod etcd_backup;
pub mod fs;
pub mod gce_adc;
pub mod gce_metadata;
pub mod hosts;
pub mod imds;
pub mod instance;
pub mod keyset;
pub mod leader_election;
#[cfg(feature = "aws")]
pub mod node_join;
pub mod node_join_gce;
pub mod oidc;
pub mod pki;
pub use keelson_api::plain_http;
pub mod renewal;
pub mod store;
pub mod tree;

pub use asset::{AssetRef, AssetRefError};
pub use store::{ConfigBase, StateStore, StoreError};
pub use tree::Tree;

use base64::Engine as _;
use sha2::Digest as _;

/// `base64(sha256(bytes))`: how a BootConfig pins its NodeupConfig (kOps' `NodeupConfigHash`).
pub fn nodeup_config_hash(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(bytes))
}

/// Lower-case hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(bytes))
}
