//! protokube: claims and mounts this control-plane instance's etcd volumes, writes the etcd static-pod
//! manifests, and keeps the control plane's DNS names pointing at live members.
//!
//! Owns: this instance's etcd volumes (claim, attach, format only when blank, mount), the etcd
//! manifests and the control plane's DNS records. Must not: format a volume that holds a file system,
//! mount one attached elsewhere, or touch another instance's volume or records.
//!
//! The pass is level-triggered ([`reconcile::Agent::reconcile`]); [`run`] loops it with backoff and
//! serves Prometheus metrics and health on a local port.

pub mod config;
pub mod disk;
pub mod etcd;
pub mod hosts;
pub mod manifest;
pub mod metrics;
pub mod paths;
pub mod pki;
pub mod reconcile;

use std::io::Write;
use std::path::Path;

/// Write a file atomically: temp file in the same directory, fsync, rename, fsync the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().ok_or_else(|| std::io::Error::other("no parent directory"))?;
    std::fs::create_dir_all(dir)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}
