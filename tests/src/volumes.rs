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

/// Make the volume appear in the machine whose init is `init_pid`.
pub fn expose(init_pid: i64, b: &Backing, slot: u32) -> Result<(), VolumeError> {
    let node = format!("/dev/{}", nvme_name(slot));
    let link = format!("/dev/disk/by-id/{}", paths::ebs_by_id_name(&b.volume_id));
    let script = format!(
        "set -e; [ -b {node} ] || mknod {node} b {ma} {mi}; chmod 0660 {node}; mkdir -p /dev/disk/by-id; ln -sfn ../../{name} {link}",
        ma = b.major,
        mi = b.minor,
        name = nvme_name(slot),
    );
    cmd::run(Command::new("nsenter").args(["-t", &init_pid.to_string(), "-m", "--", "sh", "-c", &script]))
        .map(|_| ())
        .map_err(|source| VolumeError::Cmd { volume: b.volume_id.clone(), source })
}

/// Remove the device from the machine (detach). A machine that is gone needs nothing.
pub fn unexpose(init_pid: i64, volume_id: &str, slot: u32) {
    if !cmd::alive(init_pid) {
        return;
    }
    let script = format!("rm -f /dev/disk/by-id/{} /dev/{}", paths::ebs_by_id_name(volume_id), nvme_name(slot));
    let _ = machine::exec_in(init_pid, &["sh", "-c", &script]);
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
    fn nvme_names() {
        assert_eq!(super::nvme_name(1), "nvme1n1");
    }
}
