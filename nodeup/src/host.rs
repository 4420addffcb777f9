//! The host nodeup configures: a root directory (`/` or `--root DIR`) and how side effects
//! outside the file tree (systemctl, sysctl, modprobe, swapoff) are carried out.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

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
        Host { root: root.into(), recorded: Mutex::new(Vec::new()) }
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

    /// Commands recorded instead of run, in order.
    pub fn recorded(&self) -> Vec<String> {
        self.recorded.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
