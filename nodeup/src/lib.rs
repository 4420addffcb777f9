//! nodeup: turn a bare Linux host into a Kubernetes node (or control-plane host) from the
//! NodeupConfig its BootConfig pins. See the crate README for the design and how to run it.
//!
//! Owns: the host — assets (verified by sha256 before use), files (written atomically), units,
//! kernel settings, certificates and static pods. The PKI, atomic writes, the state store and IMDS come
//! from `keelson-base`. Must not:
//! decide anything the compiler decides (versions, flags, defaults come from the NodeupConfig), branch
//! on the environment it runs in, or leave a half-written file behind when killed.

pub mod api_hosts;
pub mod assets;
pub mod cert_tasks;
pub mod config;
pub mod facts;
pub use keelson_api::flag_table;
pub mod flags;
pub mod host;
pub mod join;
pub mod model;
pub mod nodetasks;
pub mod packages;
pub mod paths;
pub mod render;
pub mod run;
pub mod tasks;
