//! Every host path and name the local cloud uses, in one place.
//!
//! Two roots: the cache (`$KEELSON_LOCAL_CACHE`, default `/var/cache/keelson-local`) holds what is
//! expensive to rebuild and safe to share (the Debian rootfs, repackaged Debian assets); the state
//! directory (`$KEELSON_LOCAL_STATE`, default `/var/lib/keelson-local`) holds one running cluster
//! and is removed by `down`.

use std::path::{Path, PathBuf};

/// A machine's host path (absolute, as [`keelson_api::host_paths`] names it) under its root directory.
pub fn in_root(root: &Path, host_path: &str) -> PathBuf {
    root.join(host_path.trim_start_matches('/'))
}

/// Kernel names created on the host are prefixed with this, so `down` can find every leftover.
pub const NAME_PREFIX: &str = "kl";
/// Network namespaces: `kl-<instance id>`.
pub const NETNS_PREFIX: &str = "kl-";
/// Host end of each machine's veth: `klv<last 8 hex digits of the instance id>`.
pub const VETH_PREFIX: &str = "klv";
/// Bridge that connects the machines (and nothing else).
pub const DEFAULT_BRIDGE: &str = "klbr0";
/// Instance metadata address inside every namespace.
pub const IMDS_ADDR: &str = "169.254.169.254";
/// NVMe by-id name of an EBS volume, as AWS Nitro instances expose it.
pub const EBS_BY_ID_PREFIX: &str = "nvme-Amazon_Elastic_Block_Store_";
/// Where nspawn keeps per-machine state on a host without systemd (cleaned by `down`).
pub const NSPAWN_RUN_DIR: &str = "/run/systemd/nspawn";

pub fn cache_dir() -> PathBuf {
    std::env::var_os("KEELSON_LOCAL_CACHE").filter(|v| !v.is_empty()).map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/var/cache/keelson-local"))
}

pub fn state_dir() -> PathBuf {
    std::env::var_os("KEELSON_LOCAL_STATE").filter(|v| !v.is_empty()).map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/var/lib/keelson-local"))
}

/// Layout of the state directory.
#[derive(Debug, Clone)]
pub struct State {
    pub root: PathBuf,
}

impl State {
    pub fn new(root: PathBuf) -> State {
        State { root }
    }
    pub fn cluster_file(&self) -> PathBuf {
        self.root.join("cluster.json")
    }
    /// The local registry's access log: every request with the client's address first.
    pub fn registry_log(&self) -> PathBuf {
        self.root.join("registry.log")
    }

    pub fn daemon_log(&self) -> PathBuf {
        self.root.join("daemon.log")
    }
    pub fn moto_log(&self) -> PathBuf {
        self.root.join("moto.log")
    }
    /// Every request moto served (`testkit::moto_calls`), for the IAM oracle.
    pub fn moto_calls(&self) -> PathBuf {
        self.root.join("moto-calls.jsonl")
    }
    /// Every instance-role credential the daemon handed to a machine's IMDS: one
    /// [`crate::cluster::iam::Issued`] a line.
    pub fn issued_credentials(&self) -> PathBuf {
        self.root.join("issued-credentials.jsonl")
    }
    pub fn mirror_dir(&self) -> PathBuf {
        self.root.join("mirror")
    }
    pub fn machines_dir(&self) -> PathBuf {
        self.root.join("machines")
    }
    pub fn machine_dir(&self, instance_id: &str) -> PathBuf {
        self.machines_dir().join(instance_id)
    }
    pub fn volumes_dir(&self) -> PathBuf {
        self.root.join("volumes")
    }
    pub fn volume_file(&self, volume_id: &str) -> PathBuf {
        self.volumes_dir().join(format!("{volume_id}.img"))
    }
    pub fn compiled_dir(&self) -> PathBuf {
        self.root.join("compiled")
    }
    pub fn stop_file(&self) -> PathBuf {
        self.root.join("stop")
    }
    /// Zones that are down (one name a line; `keelson-local chaos --scenario zone-down`): the
    /// daemon boots no machine for an instance launched there until the zone is off the list.
    pub fn zones_down_file(&self) -> PathBuf {
        self.root.join("zones-down")
    }
    /// The state store's outage (`refuse` or `hang`; `keelson-local chaos --scenario
    /// store-outage`): the machines' S3 relay follows it ([`crate::relay::follow_file`]).
    pub fn store_outage_file(&self) -> PathBuf {
        self.root.join("store-outage")
    }
    /// The CPU model of the machines launched from now on ([`crate::cpu_model`]); absent: shared.
    pub fn cpu_model_file(&self) -> PathBuf {
        self.root.join("cpu-model")
    }
    /// The zones [`Self::zones_down_file`] lists (none when it is absent).
    pub fn zones_down(&self) -> Vec<String> {
        std::fs::read_to_string(self.zones_down_file())
            .map(|t| t.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect())
            .unwrap_or_default()
    }
}

/// Per-machine layout (under the state directory).
#[derive(Debug, Clone)]
pub struct MachinePaths {
    pub dir: PathBuf,
}

impl MachinePaths {
    pub fn upper(&self) -> PathBuf {
        self.dir.join("upper")
    }
    pub fn work(&self) -> PathBuf {
        self.dir.join("work")
    }
    pub fn root(&self) -> PathBuf {
        self.dir.join("root")
    }
    /// The machine's `/var/lib/containerd`: a host directory, because containerd's overlayfs
    /// snapshotter cannot put its upper directories on the machine's own overlay root.
    pub fn containerd_dir(&self) -> PathBuf {
        self.dir.join("containerd")
    }
    pub fn console_log(&self) -> PathBuf {
        self.dir.join("console.log")
    }
    /// The machine's journal as it was when it powered off (its journal is in memory and goes
    /// with it): read it with `journalctl -D`.
    pub fn poweroff_journal(&self) -> PathBuf {
        self.dir.join("journal-at-poweroff")
    }
    pub fn imds_file(&self) -> PathBuf {
        self.dir.join("imds.json")
    }
    pub fn imds_log(&self) -> PathBuf {
        self.dir.join("imds.log")
    }
    pub fn info_file(&self) -> PathBuf {
        self.dir.join("machine.json")
    }
}

pub fn netns_name(instance_id: &str) -> String {
    format!("{NETNS_PREFIX}{instance_id}")
}

/// Interface names are limited to 15 bytes: `klv` + the last 8 characters of the instance id.
pub fn veth_name(instance_id: &str) -> String {
    let tail: String = instance_id.chars().rev().take(8).collect::<Vec<_>>().into_iter().rev().collect();
    format!("{VETH_PREFIX}{tail}")
}

/// `vol-0abc…` → `nvme-Amazon_Elastic_Block_Store_vol0abc…` (AWS drops the dash).
pub fn ebs_by_id_name(volume_id: &str) -> String {
    format!("{EBS_BY_ID_PREFIX}{}", volume_id.replace('-', ""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(veth_name("i-0123456789abcdef0"), "klv9abcdef0");
        assert!(veth_name("i-0123456789abcdef0").len() <= 15);
        assert_eq!(netns_name("i-1"), "kl-i-1");
        assert_eq!(ebs_by_id_name("vol-0a1b2c"), "nvme-Amazon_Elastic_Block_Store_vol0a1b2c");
    }
}
