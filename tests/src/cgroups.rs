//! Each machine's own cgroup in every cgroup v1 hierarchy, as each cloud instance has its own
//! cgroup tree.
//!
//! `systemd-nspawn --keep-unit` leaves a machine in the cgroup of the process that started it, and
//! its cgroup namespace is rooted there. Machines started by one daemon therefore shared one root:
//! every kubelet made the same `kubepods.slice`, saw the other machines' pod cgroups as orphans of
//! its own and tried to remove them (measured on 2026-12-03: ~500 "Failed to delete cgroup paths"
//! per kubelet per minute, each waiting on its systemd), every kubelet's node-allocatable
//! limits applied to all machines' pods together, and every machine's systemd kept its units in
//! the one `payload/` cgroup nspawn made beside the starter's. A machine now starts in
//! `<the starter's cgroup>/keelson-local/<instance>` of each hierarchy, so its namespace's root is
//! its own; [`remove`] takes the tree away when the machine is off.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The directory (under the starter's cgroup) holding every machine's cgroup.
const PARENT: &str = "keelson-local";

/// A machine's cgroup directory in each cgroup v1 hierarchy mounted on this host: for each v1
/// mount of `mountinfo` (`/proc/self/mountinfo`), the starter's path in that hierarchy (from
/// `self_cgroup`, `/proc/self/cgroup`) joined with `keelson-local/<instance>` — and the same in
/// the cgroup v2 (unified) hierarchy of a hybrid host: it carries no controller there, but
/// `systemd-nspawn` places its payload (`payload/`, `supervisor/`) by its path in it, and the
/// machine's systemd tracks its units there.
pub fn machine_dirs(mountinfo: &str, self_cgroup: &str, instance: &str) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for line in mountinfo.lines() {
        // `ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL…] - FSTYPE SOURCE SUPER_OPTS`
        let Some((left, right)) = line.split_once(" - ") else { continue };
        let mut r = right.split_whitespace();
        let v2 = match r.next() {
            Some("cgroup") => false,
            Some("cgroup2") => true,
            _ => continue,
        };
        let super_opts: Vec<&str> = r.nth(1).unwrap_or_default().split(',').collect();
        let Some(mount_point) = left.split_whitespace().nth(4) else { continue };
        // The hierarchy's controllers (or `name=…`; none: cgroup2) as /proc/self/cgroup lists them.
        let own = self_cgroup.lines().find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, names, path) = (parts.next()?, parts.next()?, parts.next()?);
            let names: Vec<&str> = names.split(',').filter(|n| !n.is_empty()).collect();
            let matches = if v2 { names.is_empty() } else { !names.is_empty() && names.iter().all(|n| super_opts.contains(n)) };
            matches.then_some(path)
        });
        let Some(own) = own else { continue };
        dirs.push(Path::new(mount_point).join(own.trim_start_matches('/')).join(PARENT).join(instance));
    }
    dirs.sort();
    dirs.dedup();
    dirs
}

/// This process's [`machine_dirs`] for `instance`.
pub fn dirs_for(instance: &str) -> std::io::Result<Vec<PathBuf>> {
    Ok(machine_dirs(&fs::read_to_string("/proc/self/mountinfo")?, &fs::read_to_string("/proc/self/cgroup")?, instance))
}

/// Make each directory (and its `keelson-local` parent). A new cpuset cgroup has no CPUs and no
/// memory nodes until given some: each level gets its parent's.
pub fn create(dirs: &[PathBuf]) -> std::io::Result<()> {
    for dir in dirs {
        for level in [dir.parent().unwrap_or(dir), dir.as_path()] {
            if level.is_dir() {
                continue;
            }
            fs::create_dir(level).map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", level.display())))?;
            if let Some(parent) = level.parent().filter(|_| level.join("cpuset.cpus").exists()) {
                for f in ["cpuset.cpus", "cpuset.mems"] {
                    let v = fs::read_to_string(parent.join(f))?;
                    fs::write(level.join(f), v.trim()).map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", level.join(f).display())))?;
                }
            }
        }
    }
    Ok(())
}

/// The CPU weight of a cgroup nobody set (cgroup v1 `cpu.shares`).
pub const DEFAULT_CPU_SHARES: u64 = 1024;

/// cgroup v2's `cpu.weight` for a v1 `cpu.shares` value (the mapping runc and systemd use:
/// 2..262144 onto 1..10000; 1024 is 39, not v2's default 100, so a v2 host's weights are
/// relative to each other only, as v1's are).
pub fn shares_to_weight(shares: u64) -> u64 {
    let shares = shares.clamp(2, 262_144);
    1 + (shares - 2) * 9999 / 262_142
}

/// Give a machine's cgroups the CPU weight `shares`: `cpu.shares` where a v1 hierarchy has the
/// cpu controller, `cpu.weight` (by [`shares_to_weight`]) where a v2 one does. Returns the files
/// written: none on a host whose machines' cgroups have no cpu controller.
pub fn set_cpu_shares(dirs: &[PathBuf], shares: u64) -> std::io::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    for dir in dirs {
        let (file, value) = if dir.join("cpu.shares").exists() {
            (dir.join("cpu.shares"), shares)
        } else if dir.join("cpu.weight").exists() {
            (dir.join("cpu.weight"), shares_to_weight(shares))
        } else {
            continue;
        };
        fs::write(&file, value.to_string()).map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", file.display())))?;
        written.push(file);
    }
    Ok(written)
}

/// The shell that moves itself into each directory's `cgroup.procs` (named by the environment
/// variable [`PROCS_ENV`]) and then execs its arguments: the machine's `systemd-nspawn` starts in
/// its own cgroups, with the same PID.
pub const ENTER_AND_EXEC: &str = r#"for f in $KEELSON_CGROUP_PROCS; do echo $$ > "$f" || exit 1; done; exec "$@""#;

/// The variable [`ENTER_AND_EXEC`] reads: the `cgroup.procs` files, space-separated.
pub const PROCS_ENV: &str = "KEELSON_CGROUP_PROCS";

/// [`PROCS_ENV`]'s value for `dirs`.
pub fn procs_value(dirs: &[PathBuf]) -> String {
    dirs.iter().map(|d| d.join("cgroup.procs").display().to_string()).collect::<Vec<_>>().join(" ")
}

/// Remove each directory's tree, deepest first. A process still in it (the machine is off, so
/// only a straggler of its power-off) is killed first. Bounded: gives up after 10 s and returns
/// what is left.
pub fn remove(dirs: &[PathBuf]) -> Vec<PathBuf> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut left = Vec::new();
        for dir in dirs.iter().filter(|d| d.is_dir()) {
            let mut tree = Vec::new();
            collect_tree(dir, &mut tree);
            // Deepest first: a cgroup with children cannot be removed.
            tree.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
            for d in tree {
                for pid in fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default().split_whitespace().filter_map(|p| p.parse::<i64>().ok()) {
                    if pid > 0 {
                        crate::cmd::kill(pid, "KILL");
                    }
                }
                if fs::remove_dir(&d).is_err() {
                    left.push(d);
                }
            }
        }
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn collect_tree(dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.to_path_buf());
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                collect_tree(&e.path(), out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // This host's shape (2026-12-03): hybrid cgroups, the starter in a memory cgroup of its own
    // and at the root of the others, `cpu` a symlink to the `cpu,cpuacct` mount.
    const MOUNTINFO: &str = "\
30 25 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw,nsdelegate
32 30 0:28 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,xattr,name=systemd
35 30 0:31 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,cpu,cpuacct
36 30 0:32 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,memory
37 30 0:33 / /sys/fs/cgroup/cpuset rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,cpuset
38 30 0:34 / /sys/fs/cgroup/net_cls,net_prio rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,net_cls,net_prio
40 25 0:36 / /proc rw - proc proc rw
";
    const SELF_CGROUP: &str = "\
9:name=systemd:/
5:net_cls,net_prio:/
4:memory:/process_api/e52d
3:cpuset:/
1:cpu,cpuacct:/
0::/
";

    #[test]
    fn one_dir_per_v1_hierarchy_under_the_starters_cgroup() {
        let dirs = machine_dirs(MOUNTINFO, SELF_CGROUP, "i-1");
        let want: Vec<PathBuf> = [
            "/sys/fs/cgroup/cpu,cpuacct/keelson-local/i-1",
            "/sys/fs/cgroup/cpuset/keelson-local/i-1",
            "/sys/fs/cgroup/memory/process_api/e52d/keelson-local/i-1",
            "/sys/fs/cgroup/net_cls,net_prio/keelson-local/i-1",
            "/sys/fs/cgroup/systemd/keelson-local/i-1",
            "/sys/fs/cgroup/unified/keelson-local/i-1",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        assert_eq!(dirs, want);
    }

    #[test]
    fn a_hierarchy_the_starter_is_not_listed_in_is_left_out() {
        let dirs = machine_dirs(MOUNTINFO, "4:memory:/\n", "i-2");
        assert_eq!(dirs, vec![PathBuf::from("/sys/fs/cgroup/memory/keelson-local/i-2")]);
    }

    #[test]
    fn the_wrapper_names_each_procs_file() {
        let dirs = vec![PathBuf::from("/c/memory/keelson-local/i-1"), PathBuf::from("/c/pids/keelson-local/i-1")];
        assert_eq!(procs_value(&dirs), "/c/memory/keelson-local/i-1/cgroup.procs /c/pids/keelson-local/i-1/cgroup.procs");
        assert!(ENTER_AND_EXEC.contains(&format!("${PROCS_ENV}")));
    }

    #[test]
    fn cpu_weights_go_where_the_cpu_controller_is() {
        let t = tempfile::tempdir().unwrap();
        let (v1, v2, none) = (t.path().join("cpu/i-1"), t.path().join("unified/i-1"), t.path().join("memory/i-1"));
        for d in [&v1, &v2, &none] {
            fs::create_dir_all(d).unwrap();
        }
        fs::write(v1.join("cpu.shares"), "1024").unwrap();
        fs::write(v2.join("cpu.weight"), "100").unwrap();
        let written = set_cpu_shares(&[v1.clone(), v2.clone(), none.clone()], 16384).unwrap();
        assert_eq!(written, vec![v1.join("cpu.shares"), v2.join("cpu.weight")]);
        assert_eq!(fs::read_to_string(v1.join("cpu.shares")).unwrap(), "16384");
        assert_eq!(fs::read_to_string(v2.join("cpu.weight")).unwrap(), "625");
        assert!(!none.join("cpu.shares").exists());
        assert_eq!((shares_to_weight(2), shares_to_weight(1024), shares_to_weight(262_144), shares_to_weight(0)), (1, 39, 10000, 1));
    }

    #[test]
    fn remove_takes_a_tree_deepest_first() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("keelson-local/i-1");
        fs::create_dir_all(dir.join("kubepods.slice/kubepods-burstable.slice")).unwrap();
        // Plain directories stand in for cgroups (whose files vanish with them): only empty ones go.
        assert!(remove(std::slice::from_ref(&dir)).is_empty());
        assert!(!dir.exists());
    }
}
