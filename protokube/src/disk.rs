//! Safe format and mount of a block device.
//!
//! The rules: a device is formatted only when a low-level probe (`blkid -p`, which reads superblocks and
//! partition tables itself rather than trusting a cache) finds nothing *and* its first and last MiB
//! are all zero bytes — so an unknown signature is refused, never overwritten; a failed probe refuses;
//! an existing mount at the target must be the same device.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("{device}: probe failed ({tool} exit {code:?}): {stderr}; refusing to format or mount")]
    Probe { device: String, tool: &'static str, code: Option<i32>, stderr: String },
    #[error("{device}: holds {what}; refusing to mount it as an etcd volume (never formatted)")]
    Foreign { device: String, what: String },
    #[error("{device}: no known signature but not blank ({where_}); unknown data, refusing to format")]
    UnknownData { device: String, where_: String },
    #[error("{device}: probes blank but volume {volume} is tagged as formatted; refusing to format again")]
    BlankButFormatted { device: String, volume: String },
    #[error("{device}: {tool} failed (exit {code:?}): {stderr}")]
    Tool { device: String, tool: &'static str, code: Option<i32>, stderr: String },
    #[error("{path}: mounted device {found} is not {device} ({expected})")]
    WrongMount { path: String, found: String, device: String, expected: String },
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{tool}: not found or not runnable ({source}); install util-linux / e2fsprogs")]
    Missing { tool: &'static str, source: std::io::Error },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DiskError + '_ {
    move |source| DiskError::Io { path: path.display().to_string(), source }
}

/// What a probe found on a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// No signature and all-zero head and tail.
    Blank,
    /// A filesystem (`TYPE`).
    Filesystem(String),
    /// A partition table (`PTTYPE`).
    PartitionTable(String),
}

fn run(tool: &'static str, args: &[&str]) -> Result<std::process::Output, DiskError> {
    Command::new(tool).args(args).output().map_err(|source| DiskError::Missing { tool, source })
}

const EDGE: u64 = 1 << 20;

fn blank_edges(device: &Path) -> Result<Option<String>, DiskError> {
    let mut f = std::fs::File::open(device).map_err(io(device))?;
    let size = f.seek(SeekFrom::End(0)).map_err(io(device))?;
    let mut buf = vec![0u8; EDGE.min(size) as usize];
    for (label, off) in [("head", 0u64), ("tail", size.saturating_sub(EDGE))] {
        f.seek(SeekFrom::Start(off)).map_err(io(device))?;
        f.read_exact(&mut buf).map_err(io(device))?;
        if let Some(pos) = buf.iter().position(|b| *b != 0) {
            return Ok(Some(format!("non-zero byte at offset {} ({label})", off + pos as u64)));
        }
    }
    Ok(None)
}

/// Probe a device with blkid semantics; any probe failure is an error (so the caller never formats).
pub fn probe(device: &Path) -> Result<Probe, DiskError> {
    let dev = device.display().to_string();
    // -p: low-level superblock/partition-table probing, bypassing the cache; exit 2 = nothing found.
    let out = run("blkid", &["-p", "-o", "export", &dev])?;
    match out.status.code() {
        Some(0) => {
            let kv: BTreeMap<String, String> =
                String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_string(), v.to_string()))).collect();
            if let Some(t) = kv.get("PTTYPE") {
                return Ok(Probe::PartitionTable(t.clone()));
            }
            if let Some(t) = kv.get("TYPE") {
                return Ok(Probe::Filesystem(t.clone()));
            }
            // Something was found (USAGE=raid/crypto/other without TYPE): treat as foreign data.
            Err(DiskError::Foreign { device: dev, what: format!("a signature blkid reports as {kv:?}") })
        }
        Some(2) => {
            // Cross-check with wipefs, which lists every signature it knows (also ones blkid skips).
            let w = run("wipefs", &["-n", "-p", &dev])?;
            if !w.status.success() {
                return Err(DiskError::Probe {
                    device: dev,
                    tool: "wipefs",
                    code: w.status.code(),
                    stderr: String::from_utf8_lossy(&w.stderr).trim().to_string(),
                });
            }
            let listed = String::from_utf8_lossy(&w.stdout);
            if let Some(line) = listed.lines().find(|l| !l.starts_with('#') && !l.trim().is_empty()) {
                return Err(DiskError::Foreign { device: dev, what: format!("a signature wipefs reports: {line}") });
            }
            match blank_edges(device)? {
                None => Ok(Probe::Blank),
                Some(where_) => Err(DiskError::UnknownData { device: dev, where_ }),
            }
        }
        code => Err(DiskError::Probe { device: dev, tool: "blkid", code, stderr: String::from_utf8_lossy(&out.stderr).trim().to_string() }),
    }
}

pub fn mkfs_ext4(device: &Path) -> Result<(), DiskError> {
    let dev = device.display().to_string();
    // No -F: mkfs itself refuses a device that is mounted or in use.
    let out = run("mkfs.ext4", &["-q", "-m", "0", &dev])?;
    if !out.status.success() {
        return Err(DiskError::Tool {
            device: dev,
            tool: "mkfs.ext4",
            code: out.status.code(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// `e2fsck -p`: exit 0 (clean) and 1 (errors corrected) are fine; anything else refuses the mount.
pub fn fsck(device: &Path, fstype: &str) -> Result<(), DiskError> {
    if !fstype.starts_with("ext") {
        return Ok(());
    }
    let dev = device.display().to_string();
    let out = run("e2fsck", &["-p", &dev])?;
    match out.status.code() {
        Some(0) | Some(1) => Ok(()),
        code => Err(DiskError::Tool {
            device: dev,
            tool: "e2fsck",
            code,
            stderr: format!("{} {}", String::from_utf8_lossy(&out.stdout).trim(), String::from_utf8_lossy(&out.stderr).trim()),
        }),
    }
}

/// `major:minor` of a block device (symlinks followed).
pub fn dev_numbers(device: &Path) -> Result<(u64, u64), DiskError> {
    let meta = std::fs::metadata(device).map_err(io(device))?;
    if !meta.file_type().is_block_device() {
        return Err(DiskError::Io { path: device.display().to_string(), source: std::io::Error::other("not a block device") });
    }
    let rdev = meta.rdev();
    // Linux encoding of dev_t.
    let major = ((rdev >> 32) & 0xffff_f000) | ((rdev >> 8) & 0xfff);
    let minor = ((rdev >> 12) & 0xffff_ff00) | (rdev & 0xff);
    Ok((major, minor))
}

fn unescape_mountinfo(s: &str) -> String {
    let mut out = String::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                out.push(v as char);
                i += 4;
                continue;
            }
        }
        out.push(b[i] as char);
        i += 1;
    }
    out
}

/// The `major:minor` mounted at `path`, if any (last mount wins, as the kernel shows it).
pub fn mounted_at(path: &Path) -> Result<Option<(u64, u64)>, DiskError> {
    let info = Path::new("/proc/self/mountinfo");
    let text = std::fs::read_to_string(info).map_err(io(info))?;
    let want = path.display().to_string();
    let mut found = None;
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() > 4 && unescape_mountinfo(f[4]) == want {
            if let Some((ma, mi)) = f[2].split_once(':') {
                if let (Ok(ma), Ok(mi)) = (ma.parse(), mi.parse()) {
                    found = Some((ma, mi));
                }
            }
        }
    }
    Ok(found)
}

pub fn mount(device: &Path, target: &Path, fstype: &str) -> Result<(), DiskError> {
    std::fs::create_dir_all(target).map_err(io(target))?;
    let dev = device.display().to_string();
    let out = run("mount", &["-t", fstype, "-o", "defaults,noatime", &dev, &target.display().to_string()])?;
    if !out.status.success() {
        return Err(DiskError::Tool { device: dev, tool: "mount", code: out.status.code(), stderr: String::from_utf8_lossy(&out.stderr).trim().to_string() });
    }
    Ok(())
}

/// Canonical device path (symlinks resolved) for messages.
pub fn canonical(device: &Path) -> PathBuf {
    std::fs::canonicalize(device).unwrap_or_else(|_| device.to_path_buf())
}
