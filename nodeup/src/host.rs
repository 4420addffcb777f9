//! The host nodeup configures: a root directory (`/` or `--root DIR`) and how side effects
//! outside the file tree (systemctl, sysctl, modprobe, swapoff) are carried out.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use crate::paths;

/// True when nodeup runs inside a container (systemd's `/run/systemd/container` marker, or
/// `container=` in init's environment), where kernel modules and global sysctls belong to the host.
fn in_container() -> bool {
    if Path::new("/run/systemd/container").exists() {
        return true;
    }
    std::fs::read("/proc/1/environ").map(|env| env.split(|b| *b == 0).any(|kv| kv.starts_with(b"container="))).unwrap_or(false)
}

/// The host being configured.
#[derive(Debug)]
pub struct Host {
    root: PathBuf,
    /// Commands that were recorded rather than run (root other than `/`).
    recorded: Mutex<Vec<String>>,
    /// The unit files' [`unit_files_fingerprint`] when this run last had systemd reload them.
    units_loaded: Mutex<Option<u64>>,
}

/// A host command failed.
#[derive(Debug, thiserror::Error)]
#[error("running `{argv}`: {message}")]
pub struct CommandError {
    pub argv: String,
    pub message: String,
}

impl Host {
    pub fn new(root: impl Into<PathBuf>) -> Host {
        Host { root: root.into(), recorded: Mutex::new(Vec::new()), units_loaded: Mutex::new(None) }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// True when nodeup configures the running system (root `/`): services are started.
    pub fn is_live(&self) -> bool {
        self.root == Path::new("/")
    }

    /// Map an absolute host path under the root.
    pub fn path(&self, abs: impl AsRef<Path>) -> PathBuf {
        let abs = abs.as_ref();
        self.root.join(abs.strip_prefix("/").unwrap_or(abs))
    }

    /// Run a command on a live host; under another root record it instead (offline semantics).
    pub fn run(&self, argv: &[&str]) -> Result<(), CommandError> {
        let line = argv.join(" ");
        if !self.is_live() {
            tracing::info!("not running (root {}): {line}", self.root.display());
            self.recorded.lock().unwrap_or_else(|e| e.into_inner()).push(line);
            return Ok(());
        }
        let (prog, args) = argv.split_first().ok_or_else(|| CommandError { argv: line.clone(), message: "empty".into() })?;
        if *prog == "modprobe" && args.len() == 1 && Path::new("/sys/module").join(args[0]).exists() {
            tracing::debug!("kernel module {} already loaded", args[0]);
            return Ok(());
        }
        let out = Command::new(prog).args(args).output().map_err(|e| CommandError { argv: line.clone(), message: e.to_string() })?;
        if !out.status.success() && matches!(*prog, "sysctl" | "modprobe") && in_container() {
            // In a container the host kernel owns modules and non-namespaced sysctls; the
            // namespaced ones were applied, the rest are the host's to set.
            tracing::warn!("`{line}` failed inside a container ({}): leaving it to the host kernel", String::from_utf8_lossy(&out.stderr).trim());
            return Ok(());
        }
        if !out.status.success() {
            return Err(CommandError { argv: line, message: format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim()) });
        }
        Ok(())
    }

    /// Ask the live host a yes/no question (`systemctl is-active --quiet X`); `None` off a live
    /// host or when the command cannot run.
    pub fn query(&self, argv: &[&str]) -> Option<bool> {
        if !self.is_live() {
            return None;
        }
        let (prog, args) = argv.split_first()?;
        Command::new(prog).args(args).status().ok().map(|s| s.success())
    }

    /// Have systemd load the unit files (`systemctl daemon-reload`) before a unit is started, unless
    /// this run already did and no file under [`paths::SYSTEMD_DIR`] changed since. Returns whether
    /// it reloaded. Concurrent callers wait for one another, so services started together share one
    /// reload. Each reload re-runs systemd's generators and reloads every unit: measured 0.6–1.6 s
    /// on a booting control plane of keelson-local, where nodeup used to reload once per service.
    pub fn reload_units(&self) -> Result<bool, CommandError> {
        let mut loaded = self.units_loaded.lock().unwrap_or_else(|e| e.into_inner());
        let now = unit_files_fingerprint(&self.path(paths::SYSTEMD_DIR));
        if *loaded == Some(now) {
            tracing::debug!("unit files unchanged since this run's daemon-reload: not reloading");
            return Ok(false);
        }
        self.run(&["systemctl", "daemon-reload"])?;
        *loaded = Some(now);
        Ok(true)
    }

    /// Commands recorded instead of run, in order.
    pub fn recorded(&self) -> Vec<String> {
        self.recorded.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// A fingerprint of the unit files under `dir` (recursively, drop-in directories included): every
/// entry's path, type, inode, size and modification time, and a link's target. A file rewritten
/// (nodeup writes through a rename: a new inode) or added changes it. The `*.wants` and
/// `*.requires` directories are left out: their links say what starts at boot, which a running
/// systemd needs no reload for when the unit is started by name, and nodeup enables each service
/// just before starting it. Entries that cannot be read count as absent.
pub fn unit_files_fingerprint(dir: &Path) -> u64 {
    use std::hash::{Hash, Hasher};
    use std::os::unix::fs::MetadataExt;
    fn walk(dir: &Path, base: &Path, h: &mut std::collections::hash_map::DefaultHasher) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        let mut entries: Vec<_> = entries.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let path = e.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
            let name = e.file_name();
            let name = name.to_string_lossy();
            if meta.is_dir() && (name.ends_with(".wants") || name.ends_with(".requires")) {
                continue;
            }
            path.strip_prefix(base).unwrap_or(&path).hash(h);
            (meta.file_type().is_dir(), meta.file_type().is_symlink(), meta.ino(), meta.len(), meta.mtime(), meta.mtime_nsec()).hash(h);
            if meta.file_type().is_symlink() {
                std::fs::read_link(&path).ok().hash(h);
            } else if meta.is_dir() {
                walk(&path, base, h);
            }
        }
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    walk(dir, dir, &mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reloads(host: &Host) -> usize {
        host.recorded().iter().filter(|c| *c == "systemctl daemon-reload").count()
    }

    #[test]
    fn systemd_reloads_once_for_services_started_together_and_again_when_a_unit_file_changes() {
        let root = tempfile::tempdir().expect("root");
        let host = Host::new(root.path());
        let dir = host.path(paths::SYSTEMD_DIR);
        let write = |rel: &str, text: &str| {
            let p = dir.join(rel);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            base::fs::write_atomic(&p, text.as_bytes(), 0o644, None).expect("write");
        };
        write("containerd.service", "[Service]\n");
        write("kubelet.service", "[Service]\n");
        assert!(host.reload_units().expect("reload"), "the run's first start reloads");
        assert!(!host.reload_units().expect("reload"), "nothing changed: no second reload");
        assert_eq!(reloads(&host), 1);
        // Enabling a service (its boot-time link) needs no reload.
        std::fs::create_dir_all(dir.join("multi-user.target.wants")).expect("mkdir");
        std::os::unix::fs::symlink("/etc/systemd/system/kubelet.service", dir.join("multi-user.target.wants/kubelet.service")).expect("link");
        assert!(!host.reload_units().expect("reload"));
        // A new unit, a rewritten one (same size), a new drop-in: each is loaded.
        write("protokube.service", "[Service]\n");
        assert!(host.reload_units().expect("reload"));
        write("kubelet.service", "[Unit]\n\n");
        assert!(host.reload_units().expect("reload"));
        write("cri-containerd-.scope.d/50-stop.conf", "[Unit]\nBefore=protokube.service\n");
        assert!(host.reload_units().expect("reload"));
        assert!(!host.reload_units().expect("reload"));
        std::fs::remove_file(dir.join("protokube.service")).expect("rm");
        assert!(host.reload_units().expect("reload"), "a removed unit is unloaded");
        assert_eq!(reloads(&host), 5);
    }

    #[test]
    fn concurrent_starts_share_one_reload() {
        let root = tempfile::tempdir().expect("root");
        let host = Host::new(root.path());
        std::fs::create_dir_all(host.path(paths::SYSTEMD_DIR)).expect("mkdir");
        std::fs::write(host.path(paths::SYSTEMD_DIR).join("a.service"), "[Service]\n").expect("write");
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| host.reload_units().expect("reload"));
            }
        });
        assert_eq!(reloads(&host), 1);
    }
}
