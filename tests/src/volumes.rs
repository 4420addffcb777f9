//! EBS volumes as loop devices: each moto volume gets a sparse backing file and a loop device;
//! while moto shows it attached to a running machine, the device appears inside that machine as
//! `/dev/nvme<N>n1` with the by-id symlink AWS Nitro gives it
//! (`/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol…`). Detach removes both.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cmd::{self, CmdError};
use crate::machine;
use crate::paths;

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("volume {volume}: {path}: {source}")]
    Io {
        volume: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("volume {volume}: {source}")]
    Cmd {
        volume: String,
        #[source]
        source: CmdError,
    },
    #[error("volume {volume}: loop device {device} has no major:minor")]
    NoDevNumbers { volume: String, device: String },
}

/// A volume's loop device on the host.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Backing {
    pub volume_id: String,
    pub file: PathBuf,
    pub device: String,
    pub major: u32,
    pub minor: u32,
}

/// The loop device already backed by `file`, if any (`losetup -j`).
pub fn find_loop(file: &Path) -> Option<String> {
    let out = cmd::run(Command::new("losetup").arg("-j").arg(file)).ok()?;
    out.lines().next().and_then(|l| l.split(':').next()).map(str::to_string).filter(|d| d.starts_with("/dev/loop"))
}

fn dev_numbers(volume: &str, device: &str) -> Result<(u32, u32), VolumeError> {
    let out = cmd::sh(&["stat", "-L", "-c", "%t:%T", device]).map_err(|source| VolumeError::Cmd { volume: volume.to_string(), source })?;
    let (ma, mi) = out.trim().split_once(':').ok_or_else(|| VolumeError::NoDevNumbers { volume: volume.to_string(), device: device.to_string() })?;
    let parse = |s: &str| u32::from_str_radix(s, 16).ok();
    match (parse(ma), parse(mi)) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => Err(VolumeError::NoDevNumbers { volume: volume.to_string(), device: device.to_string() }),
    }
}

/// Create (sparse, `size_gib`) the backing file and its loop device, or return the existing ones.
pub fn ensure_backing(dir: &Path, volume_id: &str, size_gib: u64) -> Result<Backing, VolumeError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        let volume = volume_id.to_string();
        move |source| VolumeError::Io { volume, path, source }
    };
    fs::create_dir_all(dir).map_err(io(dir))?;
    let file = dir.join(format!("{volume_id}.img"));
    if !file.exists() {
        let f = fs::File::create(&file).map_err(io(&file))?;
        f.set_len(size_gib.max(1) * 1024 * 1024 * 1024).map_err(io(&file))?;
    }
    let device = match find_loop(&file) {
        Some(d) => d,
        None => cmd::run(Command::new("losetup").args(["-f", "--show"]).arg(&file))
            .map_err(|source| VolumeError::Cmd { volume: volume_id.to_string(), source })?
            .trim()
            .to_string(),
    };
    let (major, minor) = dev_numbers(volume_id, &device)?;
    Ok(Backing { volume_id: volume_id.to_string(), file, device, major, minor })
}

/// Detach the loop device and delete the backing file.
pub fn destroy_backing(file: &Path) {
    while let Some(dev) = find_loop(file) {
        if cmd::sh(&["losetup", "-d", &dev]).is_err() {
            break;
        }
    }
    let _ = fs::remove_file(file);
}

/// NVMe namespace device name used inside the machine for attachment slot `n` (1 = first data
/// volume; the root disk would be nvme0).
pub fn nvme_name(n: u32) -> String {
    format!("nvme{n}n1")
}

/// How a cloud's volume appears in an instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bus {
    /// EBS on Nitro: `/dev/nvme<N>n1`, by-id `nvme-Amazon_Elastic_Block_Store_vol…`.
    Ebs { volume_id: String },
    /// A GCE persistent disk attached with `deviceName`: `/dev/sd<letter>` (SCSI; the boot disk is
    /// `sda`), by-id `google-<deviceName>` and `scsi-0Google_PersistentDisk_<deviceName>`, as GCE's
    /// udev rules name them.
    GcePd { device_name: String },
}

impl Bus {
    /// The device node's name for attachment slot `slot` (1 = the first data volume).
    pub fn node(&self, slot: u32) -> String {
        match self {
            Bus::Ebs { .. } => nvme_name(slot),
            Bus::GcePd { .. } => format!("sd{}", char::from(b'a' + (slot.min(25) as u8))),
        }
    }

    /// Its names under `/dev/disk/by-id/`.
    pub fn by_id(&self) -> Vec<String> {
        match self {
            Bus::Ebs { volume_id } => vec![paths::ebs_by_id_name(volume_id)],
            Bus::GcePd { device_name } => vec![format!("google-{device_name}"), format!("scsi-0Google_PersistentDisk_{device_name}")],
        }
    }
}

/// Make the EBS volume appear in the machine whose init is `init_pid`.
pub fn expose(init_pid: i64, b: &Backing, slot: u32) -> Result<(), VolumeError> {
    expose_as(init_pid, b, &Bus::Ebs { volume_id: b.volume_id.clone() }, slot)
}

/// Make the volume appear in the machine whose init is `init_pid`, as `bus` names it.
pub fn expose_as(init_pid: i64, b: &Backing, bus: &Bus, slot: u32) -> Result<(), VolumeError> {
    let name = bus.node(slot);
    let node = format!("/dev/{name}");
    let links: String = bus.by_id().iter().map(|l| format!("; ln -sfn ../../{name} /dev/disk/by-id/{l}")).collect();
    let script = format!("set -e; [ -b {node} ] || mknod {node} b {ma} {mi}; chmod 0660 {node}; mkdir -p /dev/disk/by-id{links}", ma = b.major, mi = b.minor);
    cmd::run(Command::new("nsenter").args(["-t", &init_pid.to_string(), "-m", "--", "sh", "-c", &script]))
        .map(|_| ())
        .map_err(|source| VolumeError::Cmd { volume: b.volume_id.clone(), source })
}

/// Remove the EBS volume's device from the machine (detach). A machine that is gone needs nothing.
pub fn unexpose(init_pid: i64, volume_id: &str, slot: u32) {
    unexpose_as(init_pid, &Bus::Ebs { volume_id: volume_id.to_string() }, slot)
}

/// Remove the device from the machine (detach), as `bus` named it.
pub fn unexpose_as(init_pid: i64, bus: &Bus, slot: u32) {
    if !cmd::alive(init_pid) {
        return;
    }
    let links: String = bus.by_id().iter().map(|l| format!(" /dev/disk/by-id/{l}")).collect();
    let script = format!("rm -f{links} /dev/{}", bus.node(slot));
    let _ = machine::exec_in(init_pid, &["sh", "-c", &script]);
}

/// Whether a filesystem on `device` (`/dev/loopN`) is mounted in any mount namespace of the host:
/// the kernel keeps `/sys/fs/<type>/<name>` while the filesystem's superblock is alive.
pub fn mounted_anywhere(device: &str) -> bool {
    mounted_under(Path::new("/sys/fs"), device)
}

fn mounted_under(sys_fs: &Path, device: &str) -> bool {
    let name = device.rsplit('/').next().unwrap_or(device);
    !name.is_empty() && ["ext4", "xfs"].iter().any(|t| sys_fs.join(t).join(name).exists())
}

/// Every loop device whose backing file lives under `dir` (for `down`).
pub fn loops_under(dir: &Path) -> Vec<(String, PathBuf)> {
    let out = cmd::sh(&["losetup", "-n", "-O", "NAME,BACK-FILE", "-l"]).unwrap_or_default();
    let d = dir.to_string_lossy();
    out.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let name = it.next()?.to_string();
            let file = it.next()?.to_string();
            file.starts_with(d.as_ref()).then(|| (name, PathBuf::from(file.trim_end_matches(" (deleted)"))))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_device_is_mounted_while_its_superblock_is_in_sysfs() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!super::mounted_under(dir.path(), "/dev/loop7"));
        std::fs::create_dir_all(dir.path().join("ext4/loop7")).unwrap();
        assert!(super::mounted_under(dir.path(), "/dev/loop7"));
        assert!(!super::mounted_under(dir.path(), "/dev/loop70"));
        std::fs::create_dir_all(dir.path().join("xfs/loop3")).unwrap();
        assert!(super::mounted_under(dir.path(), "/dev/loop3"));
        assert!(!super::mounted_under(dir.path(), ""));
    }

    #[test]
    fn nvme_names() {
        assert_eq!(super::nvme_name(1), "nvme1n1");
    }

    #[test]
    fn persistent_disks_as_gce_names_them() {
        let pd = super::Bus::GcePd { device_name: "a-etcd-main-gce-k8s-example-com".into() };
        assert_eq!(pd.node(1), "sdb", "sda is the boot disk");
        assert_eq!(pd.by_id(), ["google-a-etcd-main-gce-k8s-example-com", "scsi-0Google_PersistentDisk_a-etcd-main-gce-k8s-example-com"]);
        assert_eq!(super::Bus::Ebs { volume_id: "vol-0ab".into() }.by_id(), ["nvme-Amazon_Elastic_Block_Store_vol0ab"]);
    }
}
