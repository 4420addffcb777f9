//! nodeup: turn a bare Linux host into a Kubernetes node (or control-plane host) from the
//! NodeupConfig its BootConfig pins. See the crate README for the design and how to run it.
//!
//! Owns: the host — assets (verified by sha256 before use), files (written atomically), units,
//! kernel settings, certificates and static pods — and the cluster PKI helpers ([`pki`]). Must not:
//! decide anything the compiler decides (versions, flags, defaults come from the NodeupConfig), branch
//! on the environment it runs in, or leave a half-written file behind when killed.

pub mod assets;
pub mod config;
pub mod flag_table;
pub mod flags;
pub mod fsutil;
pub mod host;
pub mod imds;
pub mod model;
pub mod nodetasks;
pub mod paths;
pub mod pki;
pub mod render;
pub mod run;
pub mod s3;
pub mod tasks;
pub mod testsupport;
