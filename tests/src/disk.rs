//! Free space on the one host disk every local machine's root, containerd store and volume file
//! lives on. The kubelets report DiskPressure and reject pods when it falls below
//! [`EVICTION_FREE_GIB`], so `up` refuses to start a cluster without room for one, and a failure
//! report says how much was left.

use std::path::Path;

/// The kubelets' hard eviction threshold for node and image filesystems in keelson-local, GiB free.
pub const EVICTION_FREE_GIB: u64 = 2;

/// Free space `up` asks for before it starts a cluster. Measured on 2026-12-03: `examples/ha.yaml`
/// (3 control planes, 3 workers) after the focused conformance run held 11 GiB in the state
/// directory (`du`: 9.6 GiB of machines' overlay upper layers, 1.4–1.8 GiB each, 0.8 GiB of etcd
/// volumes, 0.3 GiB of mirror); plus the eviction threshold and one replacement machine of a
/// rolling update or self-heal cycle.
pub const UP_FREE_GIB: u64 = 16;

const GIB: u64 = 1 << 30;

/// The kubelets' `evictionHard` in keelson-local: absolute free space, because every machine's root
/// is on the one host disk and a percentage of it says nothing about one machine.
pub fn eviction_hard() -> String {
    format!("memory.available<100Mi,nodefs.available<{EVICTION_FREE_GIB}Gi,nodefs.inodesFree<5%,imagefs.available<{EVICTION_FREE_GIB}Gi,imagefs.inodesFree<5%")
}

/// The kubelets' `imageGCHighThresholdPercent` in keelson-local: never by percentage. Image GC
/// measures the host disk's usage, which a build beside the cluster pushes past kOps' 85 % default
/// (measured on 2026-12-03: 89 % with 31 GiB free of 252) — every kubelet then deletes every
/// image no running container uses, including one a pod is about to start from (the likely cause
/// of a CI run's `echo-server` left Pending for 120 s). kind sets the same for the same reason.
/// Disk is still guarded: below [`EVICTION_FREE_GIB`] the kubelets evict, and `up` asks for
/// [`UP_FREE_GIB`] first.
pub const IMAGE_GC_HIGH_PERCENT: u8 = 100;

/// Bytes an unprivileged writer may still use on the filesystem holding `path` (or its nearest
/// existing ancestor, so a state directory that does not exist yet can be checked).
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    let existing = path.ancestors().find(|p| p.exists()).unwrap_or(Path::new("/"));
    let s = rustix::fs::statvfs(existing)?;
    Ok(s.f_bavail.saturating_mul(s.f_frsize))
}

/// Why `free` bytes on `path` are not enough for `need_gib`, or `None` when they are.
pub fn shortfall(path: &Path, free: u64, need_gib: u64) -> Option<String> {
    (free < need_gib * GIB).then(|| {
        format!(
            "{} has {:.1} GiB free; a local cluster needs at least {need_gib} GiB there (its kubelets report DiskPressure and \
             reject pods below {EVICTION_FREE_GIB} GiB): remove stale `target/` directories or other large files first",
            path.display(),
            free as f64 / GIB as f64
        )
    })
}

/// `up`'s check: refuse to start when the state directory's disk has less than [`UP_FREE_GIB`].
pub fn require_room_for_cluster(state_root: &Path) -> anyhow::Result<()> {
    let free = free_bytes(state_root).map_err(|e| anyhow::anyhow!("free space on {}: {e}", state_root.display()))?;
    match shortfall(state_root, free, UP_FREE_GIB) {
        Some(why) => anyhow::bail!("not enough disk: {why}"),
        None => Ok(()),
    }
}

/// One line for failure reports: free space on the state directory's disk.
pub fn report(state_root: &Path) -> String {
    match free_bytes(state_root) {
        Ok(free) => format!("host disk: {:.1} GiB free on {} (kubelets evict below {EVICTION_FREE_GIB} GiB)", free as f64 / GIB as f64, state_root.display()),
        Err(e) => format!("host disk: free space on {} unknown: {e}", state_root.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shortfall_names_the_path_the_need_and_the_threshold() {
        let p = Path::new("/var/lib/keelson-local");
        assert_eq!(shortfall(p, UP_FREE_GIB * GIB, UP_FREE_GIB), None);
        let why = shortfall(p, 3 * GIB / 2, UP_FREE_GIB).expect("1.5 GiB is short");
        assert!(why.starts_with(&format!("/var/lib/keelson-local has 1.5 GiB free; a local cluster needs at least {UP_FREE_GIB} GiB")), "{why}");
        assert!(why.contains("below 2 GiB"), "{why}");
    }

    #[test]
    fn eviction_hard_uses_the_threshold() {
        assert!(eviction_hard().contains(&format!("nodefs.available<{EVICTION_FREE_GIB}Gi")));
        assert!(eviction_hard().contains(&format!("imagefs.available<{EVICTION_FREE_GIB}Gi")));
    }

    #[test]
    fn free_bytes_of_a_path_not_yet_created_is_its_ancestors() {
        let d = tempfile::tempdir().expect("tempdir");
        let missing = d.path().join("a/b/c");
        assert_eq!(free_bytes(&missing).expect("statvfs").min(1), 1);
    }
}
