//! The local cloud as a whole: the daemon that owns moto, the bridge, the relay, the mirror and
//! the machines (`keelson-local daemon`, started by `up`), and the commands that talk to it
//! through the state directory (`up`, `ps`, `kill`, `down`, `selfheal`).
//!
//! - [`state`]: the cluster state file both sides share;
//! - [`assets`]: the rootfs, the asset mirror and the registry every local cloud serves;
//! - [`daemon`]: the daemon and its reconcile loop (AWS, on moto);
//! - [`fleet`]: the machines, their volumes and hosts files, whatever cloud plays the control plane;
//! - [`commands`]: `up`, `ps`, `kill`, `down`, `kubectl`, `env`, `service-url` and the sweep of leftovers;
//! - [`prepare`]: `prepare VERSION`, another Kubernetes version in the mirror and registry;
//! - [`health`]: what `up` waits for and `ps` shows;
//! - [`diagnostics`]: what went wrong, when it did;
//! - [`iam`]: the IAM oracle over every call the machines made to moto;
//! - [`selfheal`]: the control-plane failover test.

pub mod assets;
pub mod boot_times;
pub mod bundled;
pub mod chaos;
pub mod commands;
pub mod cpu;
pub mod daemon;
pub mod diagnostics;
pub mod fleet;
pub mod health;
pub mod iam;
pub mod leadership;
pub mod partition;
pub mod prepare;
pub mod selfheal;
pub mod state;

pub use bundled::Boot;
pub use commands::{down, env_exports, kill, kubectl, ps, service_urls, sweep, up, up_with};
pub use daemon::{run_daemon, ClusterVersions, ADDON_RECORD, BOOTSTRAP_ADDON, TICK};
pub use diagnostics::{blocker, diagnose, diagnose_nodes};
pub use fleet::{replace_block, write_in_place, HOSTS_BEGIN, HOSTS_END, POWEROFF_GRACE};
pub use health::{control_plane_pods, group_label_problems, health, kube_problems, Health};
pub use prepare::{prepare, Prepared};
pub use selfheal::{median, selfheal, SelfhealReport, KEY_PREFIX, OBJECT_NAMESPACE, OBJECT_PREFIX, PHASES};
pub use state::ClusterState;
