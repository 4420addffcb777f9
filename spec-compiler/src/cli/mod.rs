//! The `keelson` cloud subcommands: argument types and their runs, so `main.rs` only dispatches.

pub mod commands;
pub mod etcd_backup;
pub mod kubeconfig;

pub use commands::*;
