//! The typed tasks nodeup uses: files, directories, asset downloads and installs, services,
//! swap. Each compares actual against desired and applies only the difference.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::assets::{Asset, AssetError, AssetKind, Fetcher};
use crate::host::{CommandError, Host};
use crate::paths;
use crate::tasks::{Task, TaskError};
use base::fs::{fs_err, FsError, Owner};
use base::pki::PkiError;

/// Everything one of nodeup's tasks may use.
pub struct Ctx<'a> {
    pub host: &'a Host,
    pub assets: &'a Fetcher,
}

/// One of nodeup's tasks: the engine's [`Task`] over nodeup's [`Ctx`].
pub type NodeTask = dyn for<'a> Task<Ctx<'a>>;

// How each error of a task becomes a task failure (the join's is with it, in `join`).
impl From<AssetError> for TaskError {
    fn from(e: AssetError) -> TaskError {
        TaskError::failed(e)
    }
}

impl From<CommandError> for TaskError {
    fn from(e: CommandError) -> TaskError {
        TaskError::failed(e)
    }
}

impl From<FsError> for TaskError {
    fn from(e: FsError) -> TaskError {
        TaskError::failed(e)
    }
}

impl From<PkiError> for TaskError {
    fn from(e: PkiError) -> TaskError {
        TaskError::failed(e)
    }
}

/// Task name of a file (others depend on it by this name).
pub fn file_task_name(path: &str) -> String {
    format!("file:{path}")
}

/// A file with exact contents and mode; optional commands when it changed.
pub struct FileTask {
    pub path: String,
    pub contents: Vec<u8>,
    pub mode: u32,
    pub owner: Owner,
    pub deps: Vec<String>,
    /// Commands run (or recorded, off a live host) after the file changed.
    pub on_change: Vec<Vec<String>>,
}

impl FileTask {
    pub fn new(path: &str, contents: impl Into<Vec<u8>>, mode: u32) -> FileTask {
        FileTask { path: path.to_string(), contents: contents.into(), mode, owner: None, deps: Vec::new(), on_change: Vec::new() }
    }
}

impl Task<Ctx<'_>> for FileTask {
    fn name(&self) -> String {
        file_task_name(&self.path)
    }
    fn paths(&self) -> Vec<String> {
        vec![self.path.clone()]
    }
    fn deps(&self) -> Vec<String> {
        self.deps.clone()
    }
    fn check(&self, ctx: &Ctx, _: bool) -> Result<Vec<String>, TaskError> {
        let p = ctx.host.path(&self.path);
        let mut changes = Vec::new();
        match fs::symlink_metadata(&p) {
            Err(_) => changes.push(format!("create ({} bytes, mode {:04o})", self.contents.len(), self.mode)),
            Ok(m) if !m.is_file() => changes.push("replace non-file".to_string()),
            Ok(m) => {
                let same = m.len() == self.contents.len() as u64 && fs::read(&p).map_err(fs_err(&p))? == self.contents;
                if !same {
                    changes.push(format!("update contents ({} bytes)", self.contents.len()));
                } else if base::fs::mode_of(&p) != Some(self.mode) {
                    changes.push(format!("mode {:04o} -> {:04o}", base::fs::mode_of(&p).unwrap_or(0), self.mode));
                }
            }
        }
        Ok(changes)
    }
    fn apply(&self, ctx: &Ctx, _: bool) -> Result<(), TaskError> {
        base::fs::write_atomic(&ctx.host.path(&self.path), &self.contents, self.mode, self.owner)?;
        for argv in &self.on_change {
            let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
            ctx.host.run(&argv)?;
        }
        Ok(())
    }
}

/// A directory that must exist with a mode.
pub struct DirTask {
    pub path: String,
    pub mode: u32,
}

impl Task<Ctx<'_>> for DirTask {
    fn name(&self) -> String {
        format!("dir:{}", self.path)
    }
    fn check(&self, ctx: &Ctx, _: bool) -> Result<Vec<String>, TaskError> {
        let p = ctx.host.path(&self.path);
        Ok(match base::fs::mode_of(&p) {
            None => vec![format!("create directory (mode {:04o})", self.mode)],
            Some(_) if !p.is_dir() => vec!["replace non-directory".into()],
            Some(m) if m != self.mode => vec![format!("mode {m:04o} -> {:04o}", self.mode)],
            Some(_) => vec![],
        })
    }
    fn apply(&self, ctx: &Ctx, _: bool) -> Result<(), TaskError> {
        let p = ctx.host.path(&self.path);
        if p.exists() && !p.is_dir() {
            fs::remove_file(&p).map_err(fs_err(&p))?;
        }
        base::fs::ensure_dir(&p)?;
        fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(self.mode)).map_err(fs_err(&p))?;
        if let Some(parent) = p.parent() {
            base::fs::sync_dir(parent)?;
        }
        Ok(())
    }
}

pub fn download_task_name(asset: &Asset) -> String {
    format!("download:{}", asset.name())
}

/// Fetch an asset into the hash-keyed cache.
pub struct DownloadTask {
    pub asset: Arc<Asset>,
    /// Downloads that go first (the boot's critical path: see `model::boot_critical`); empty for
    /// those.
    pub after: Vec<String>,
}

impl Task<Ctx<'_>> for DownloadTask {
    fn renders(&self) -> bool {
        false
    }
    fn name(&self) -> String {
        download_task_name(&self.asset)
    }
    fn deps(&self) -> Vec<String> {
        self.after.clone()
    }
    fn check(&self, ctx: &Ctx, _: bool) -> Result<Vec<String>, TaskError> {
        Ok(if ctx.assets.is_cached(&self.asset) { vec![] } else { vec![format!("download {} (sha256 {})", self.asset.urls[0], &self.asset.sha256[..12])] })
    }
    fn apply(&self, ctx: &Ctx, _: bool) -> Result<(), TaskError> {
        Ok(ctx.assets.fetch(&self.asset)?)
    }
}

/// Install one file from the cache as a hard link (copy across filesystems).
pub struct InstallTask {
    pub asset: Arc<Asset>,
    /// Cache file (relative to the cache: `None` = the asset itself; `Some(name)` = a file of
    /// the unpacked archive).
    pub member: Option<String>,
    pub dest: String,
    pub mode: u32,
}

impl InstallTask {
    fn source(&self, ctx: &Ctx) -> PathBuf {
        match &self.member {
            None => ctx.assets.cached_file(&self.asset.sha256),
            Some(m) => ctx.assets.cached_dir(&self.asset.sha256).join(m),
        }
    }
}

impl Task<Ctx<'_>> for InstallTask {
    fn renders(&self) -> bool {
        false
    }
    fn name(&self) -> String {
        format!("install:{}", self.dest)
    }
    fn paths(&self) -> Vec<String> {
        vec![self.dest.clone()]
    }
    fn deps(&self) -> Vec<String> {
        vec![download_task_name(&self.asset)]
    }
    fn check(&self, ctx: &Ctx, _: bool) -> Result<Vec<String>, TaskError> {
        let dest = ctx.host.path(&self.dest);
        let src = self.source(ctx);
        if !dest.exists() {
            return Ok(vec![format!("install from {}", self.asset.name())]);
        }
        if !base::fs::same_file(&src, &dest) && !same_contents(&src, &dest) {
            return Ok(vec![format!("replace with {}", self.asset.name())]);
        }
        if base::fs::mode_of(&dest) != Some(self.mode) {
            return Ok(vec![format!("mode -> {:04o}", self.mode)]);
        }
        Ok(vec![])
    }
    fn apply(&self, ctx: &Ctx, _: bool) -> Result<(), TaskError> {
        Ok(base::fs::link_atomic(&self.source(ctx), &ctx.host.path(&self.dest), self.mode)?)
    }
}

fn same_contents(a: &Path, b: &Path) -> bool {
    match (fs::metadata(a), fs::metadata(b)) {
        (Ok(x), Ok(y)) if x.len() == y.len() => matches!((fs::read(a), fs::read(b)), (Ok(p), Ok(q)) if p == q),
        _ => false,
    }
}

/// Install every file of an unpacked archive into a directory (the member list is only known
/// once the archive is in the cache, so this is one task per archive).
pub struct InstallArchiveTask {
    pub asset: Arc<Asset>,
}

impl InstallArchiveTask {
    fn members(&self, ctx: &Ctx) -> Result<Vec<(String, u32)>, TaskError> {
        let dir = ctx.assets.cached_dir(&self.asset.sha256);
        let mut out = Vec::new();
        if !dir.is_dir() {
            return Ok(out);
        }
        for e in fs::read_dir(&dir).map_err(fs_err(&dir))?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let mode = base::fs::mode_of(&e.path()).unwrap_or(0o755) | 0o555;
            out.push((name, mode & 0o755));
        }
        out.sort();
        Ok(out)
    }
    fn dest_dir(&self) -> &str {
        match &self.asset.kind {
            AssetKind::Archive { dest_dir, .. } => dest_dir,
            _ => paths::BIN_DIR,
        }
    }
}

impl Task<Ctx<'_>> for InstallArchiveTask {
    fn renders(&self) -> bool {
        false
    }
    fn name(&self) -> String {
        format!("install:{}", self.asset.name())
    }
    fn paths(&self) -> Vec<String> {
        vec![format!("{}/x", self.dest_dir())]
    }
    fn deps(&self) -> Vec<String> {
        vec![download_task_name(&self.asset)]
    }
    fn check(&self, ctx: &Ctx, deps_changed: bool) -> Result<Vec<String>, TaskError> {
        let members = self.members(ctx)?;
        if members.is_empty() {
            return Ok(vec![format!("unpack {} into {}", self.asset.name(), self.dest_dir())]);
        }
        let _ = deps_changed;
        let mut changes = Vec::new();
        for (m, mode) in members {
            let t = InstallTask { asset: self.asset.clone(), member: Some(m.clone()), dest: format!("{}/{m}", self.dest_dir()), mode };
            changes.extend(t.check(ctx, false)?.into_iter().map(|c| format!("{}: {c}", t.dest)));
        }
        Ok(changes)
    }
    fn apply(&self, ctx: &Ctx, _: bool) -> Result<(), TaskError> {
        for (m, mode) in self.members(ctx)? {
            let t = InstallTask { asset: self.asset.clone(), member: Some(m.clone()), dest: format!("{}/{m}", self.dest_dir()), mode };
            if !t.check(ctx, false)?.is_empty() {
                t.apply(ctx, false)?;
            }
        }
        Ok(())
    }
}

/// One dependency of a [`ServiceTask`], and what of it goes into the service's input hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceInput {
    /// A file the service reads (unit file, drop-in, environment file, configuration, certificate,
    /// kubeconfig), written by the task `task`: its contents.
    File { task: String, path: String },
    /// An installed asset (a binary, or an archive's files): the sha256 it is installed from (the
    /// install task makes the installed files that asset's).
    Installed { task: String, sha256: String },
    /// Another service, restarted with it (the kubelet with containerd): the input hash that
    /// service last (re)started with.
    Service { task: String, unit: String },
    /// Only ordering: `task` runs first, and a change it makes in the same run restarts the service,
    /// but it is no part of the hash (the hosts entries the kubelet resolves; the kubelet a timer
    /// starts after).
    After { task: String },
}

impl ServiceInput {
    /// A file written by its own [`FileTask`].
    pub fn file(path: &str) -> ServiceInput {
        ServiceInput::File { task: file_task_name(path), path: path.to_string() }
    }
    /// A file written by the task `task` (a certificate, a kubeconfig with its key).
    pub fn file_of(task: impl Into<String>, path: &str) -> ServiceInput {
        ServiceInput::File { task: task.into(), path: path.to_string() }
    }
    pub fn installed(task: impl Into<String>, asset: &Asset) -> ServiceInput {
        ServiceInput::Installed { task: task.into(), sha256: asset.sha256.clone() }
    }
    pub fn service(s: &ServiceTask) -> ServiceInput {
        ServiceInput::Service { task: s.name(), unit: s.unit.clone() }
    }
    pub fn after(task: impl Into<String>) -> ServiceInput {
        ServiceInput::After { task: task.into() }
    }
    fn task(&self) -> &str {
        match self {
            ServiceInput::File { task, .. } | ServiceInput::Installed { task, .. } | ServiceInput::Service { task, .. } | ServiceInput::After { task } => task,
        }
    }
}

/// Where the input hash a unit last (re)started with is kept (see [`ServiceTask`]).
pub fn service_hash_path(unit: &str) -> String {
    format!("{}/{unit}.hash", paths::SERVICE_HASH_DIR)
}

/// The input hash a unit last (re)started with; `None` when none is recorded.
fn stored_hash(ctx: &Ctx, unit: &str) -> Result<Option<String>, TaskError> {
    let p = ctx.host.path(service_hash_path(unit));
    match fs::read_to_string(&p) {
        Ok(text) => Ok(Some(text.trim().to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(fs_err(&p)(e).into()),
    }
}

/// A systemd unit enabled in `multi-user.target.wants` and restarted when its inputs differ from
/// those it last (re)started with.
///
/// The task hashes its inputs (each file's contents, each installed asset's sha256, each service
/// input's own recorded hash: [`ServiceInput`]) and keeps the hash it restarted the unit with under
/// [`paths::SERVICE_HASH_DIR`], written only once the restart succeeded. It restarts the unit when
/// the hash differs from the recorded one (or none is recorded), or when an input changed in this
/// run (a dry run reports the restart a change would cause). So a run killed between writing the
/// kubelet's configuration and restarting it, or whose restart failed, restarts it on the next run,
/// which finds the files already right. On a live host a long-running unit found down is started.
pub struct ServiceTask {
    /// `kubelet.service`
    pub unit: String,
    /// Its dependencies (unit file, configuration, environment files, binaries, services).
    pub inputs: Vec<ServiceInput>,
    /// Runs to completion (hooks): started when its inputs change, not kept running.
    pub once: bool,
}

impl ServiceTask {
    /// A long-running service, restarted when an input changes and started when found down.
    pub fn daemon(unit: &str, inputs: Vec<ServiceInput>) -> ServiceTask {
        ServiceTask { unit: unit.to_string(), inputs, once: false }
    }

    fn link(&self) -> String {
        format!("{}/{}", paths::MULTI_USER_WANTS, self.unit)
    }
    fn unit_path(&self) -> String {
        format!("{}/{}", paths::SYSTEMD_DIR, self.unit)
    }

    /// The sha256 (hex) of what the unit runs with now, as found on the host.
    pub fn input_hash(&self, ctx: &Ctx) -> Result<String, TaskError> {
        use sha2::Digest as _;
        let mut h = sha2::Sha256::new();
        for input in &self.inputs {
            let line = match input {
                ServiceInput::File { path, .. } => {
                    let p = ctx.host.path(path);
                    match fs::read(&p) {
                        Ok(bytes) => format!("file {path} {}\n", hex::encode(sha2::Sha256::digest(&bytes))),
                        // Not written yet (a dry run): hashed as missing.
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => format!("file {path} missing\n"),
                        Err(e) => return Err(fs_err(&p)(e).into()),
                    }
                }
                ServiceInput::Installed { task, sha256 } => format!("asset {task} {sha256}\n"),
                ServiceInput::Service { unit, .. } => format!("service {unit} {}\n", stored_hash(ctx, unit)?.unwrap_or_else(|| "none".into())),
                ServiceInput::After { .. } => continue,
            };
            h.update(line.as_bytes());
        }
        Ok(hex::encode(h.finalize()))
    }

    /// Whether the unit is to be restarted, and why.
    fn restart_reason(&self, ctx: &Ctx, deps_changed: bool) -> Result<Option<&'static str>, TaskError> {
        let stored = stored_hash(ctx, &self.unit)?;
        Ok(if deps_changed {
            Some("an input changed")
        } else if stored.is_none() {
            Some("no input hash recorded")
        } else if stored.as_deref() != Some(self.input_hash(ctx)?.as_str()) {
            Some("its inputs differ from those it last started with")
        } else {
            None
        })
    }

    fn record_hash(&self, ctx: &Ctx) -> Result<(), TaskError> {
        let hash = self.input_hash(ctx)?;
        base::fs::write_atomic(&ctx.host.path(service_hash_path(&self.unit)), format!("{hash}\n").as_bytes(), 0o644, None)?;
        Ok(())
    }
}

impl Task<Ctx<'_>> for ServiceTask {
    fn name(&self) -> String {
        format!("service:{}", self.unit)
    }
    fn paths(&self) -> Vec<String> {
        vec![self.link(), service_hash_path(&self.unit)]
    }
    fn deps(&self) -> Vec<String> {
        self.inputs.iter().map(|i| i.task().to_string()).collect()
    }
    fn check(&self, ctx: &Ctx, deps_changed: bool) -> Result<Vec<String>, TaskError> {
        let mut changes = Vec::new();
        let link = ctx.host.path(self.link());
        if fs::read_link(&link).ok().as_deref() != Some(Path::new(&self.unit_path())) {
            changes.push("enable (multi-user.target.wants)".to_string());
        }
        if let Some(why) = self.restart_reason(ctx, deps_changed)? {
            changes.push(if ctx.host.is_live() { format!("restart ({why})") } else { format!("restart ({why}; recorded: not a live root)") });
        } else if !self.once && ctx.host.query(&["systemctl", "is-active", "--quiet", &self.unit]) == Some(false) {
            changes.push("start (not running)".to_string());
        }
        Ok(changes)
    }
    fn apply(&self, ctx: &Ctx, deps_changed: bool) -> Result<(), TaskError> {
        let link = ctx.host.path(self.link());
        if fs::read_link(&link).ok().as_deref() != Some(Path::new(&self.unit_path())) {
            base::fs::symlink_atomic(Path::new(&self.unit_path()), &link)?;
        }
        if self.restart_reason(ctx, deps_changed)?.is_some() {
            ctx.host.reload_units()?;
            with_unit_retries(&self.unit, unit_retries(), || ctx.host.run(&["systemctl", "restart", &self.unit]))?;
            // Only now: a failed or interrupted restart leaves the old hash, and the next run restarts.
            self.record_hash(ctx)?;
        } else if ctx.host.is_live() {
            ctx.host.reload_units()?;
            with_unit_retries(&self.unit, unit_retries(), || ctx.host.run(&["systemctl", "start", &self.unit]))?;
        }
        Ok(())
    }
}

/// How a unit's start or restart is retried before its task fails: a unit can fail once for a
/// reason outside it and start the next time (seen in keelson-local: systemd could not set up the
/// unit's cgroup, `status=219/CGROUP`, and the whole boot failed on it); kOps' nodeup retries its
/// tasks too. Three more tries, 1 s, 2 s, 4 s apart.
fn unit_retries() -> backon::ExponentialBuilder {
    backon::ExponentialBuilder::default().with_min_delay(std::time::Duration::from_secs(1)).with_max_delay(std::time::Duration::from_secs(4)).with_max_times(3)
}

/// `start` (a `systemctl start|restart`) under `policy`, each failure logged with the unit's name.
fn with_unit_retries(
    unit: &str,
    policy: backon::ExponentialBuilder,
    start: impl FnMut() -> Result<(), crate::host::CommandError>,
) -> Result<(), crate::host::CommandError> {
    use backon::BlockingRetryable as _;
    start.retry(policy).notify(|e, wait| tracing::warn!(unit, error = %e, retry_in = ?wait, "starting the unit failed; retrying")).call()
}

/// A unit switched off (a disabled hook): not enabled, and stopped on a live host.
pub struct ServiceOffTask {
    pub unit: String,
}

impl ServiceOffTask {
    fn link(&self) -> String {
        format!("{}/{}", paths::MULTI_USER_WANTS, self.unit)
    }
}

impl Task<Ctx<'_>> for ServiceOffTask {
    fn name(&self) -> String {
        format!("service-off:{}", self.unit)
    }
    fn paths(&self) -> Vec<String> {
        vec![self.link()]
    }
    fn check(&self, ctx: &Ctx, _: bool) -> Result<Vec<String>, TaskError> {
        let mut changes = Vec::new();
        if fs::symlink_metadata(ctx.host.path(self.link())).is_ok() {
            changes.push("disable (multi-user.target.wants)".to_string());
        }
        if ctx.host.query(&["systemctl", "is-active", "--quiet", &self.unit]) == Some(true) {
            changes.push("stop".to_string());
        }
        Ok(changes)
    }
    fn apply(&self, ctx: &Ctx, _: bool) -> Result<(), TaskError> {
        let link = ctx.host.path(self.link());
        match fs::remove_file(&link) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(base::fs::fs_err(&link)(e).into()),
        }
        if ctx.host.query(&["systemctl", "is-active", "--quiet", &self.unit]) == Some(true) {
            ctx.host.run(&["systemctl", "stop", &self.unit])?;
        }
        Ok(())
    }
}

/// Swap off: swap entries in fstab commented out; `swapoff -a` on a live host.
pub struct SwapOffTask;

fn swap_lines(fstab: &str) -> Vec<usize> {
    fstab
        .lines()
        .enumerate()
        .filter(|(_, l)| {
            let t = l.trim_start();
            !t.starts_with('#') && t.split_whitespace().nth(2) == Some("swap")
        })
        .map(|(i, _)| i)
        .collect()
}

impl Task<Ctx<'_>> for SwapOffTask {
    fn name(&self) -> String {
        "swap:off".into()
    }
    fn check(&self, ctx: &Ctx, _: bool) -> Result<Vec<String>, TaskError> {
        let mut changes = Vec::new();
        let fstab = fs::read_to_string(ctx.host.path(paths::FSTAB)).unwrap_or_default();
        if !swap_lines(&fstab).is_empty() {
            changes.push(format!("comment out {} swap entries in {}", swap_lines(&fstab).len(), paths::FSTAB));
        }
        if ctx.host.is_live() {
            let active = fs::read_to_string("/proc/swaps").unwrap_or_default().lines().skip(1).filter(|l| !l.trim().is_empty()).count();
            if active > 0 {
                changes.push(format!("swapoff -a ({active} active)"));
            }
        }
        Ok(changes)
    }
    fn apply(&self, ctx: &Ctx, _: bool) -> Result<(), TaskError> {
        let path = ctx.host.path(paths::FSTAB);
        if let Ok(fstab) = fs::read_to_string(&path) {
            let lines = swap_lines(&fstab);
            if !lines.is_empty() {
                let out: Vec<String> = fstab
                    .lines()
                    .enumerate()
                    .map(|(i, l)| if lines.contains(&i) { format!("# disabled by nodeup (kubelet needs swap off): {l}") } else { l.to_string() })
                    .collect();
                let mode = base::fs::mode_of(&path).unwrap_or(0o644);
                base::fs::write_atomic(&path, (out.join("\n") + "\n").as_bytes(), mode, None)?;
            }
        }
        if ctx.host.is_live() {
            ctx.host.run(&["swapoff", "-a"])?;
        }
        Ok(())
    }
}

/// The annotation on a static pod that names the sha256 of the files it reads at start only (a
/// kubeconfig with an embedded certificate): when one changes, the manifest changes and the
/// kubelet restarts the pod.
pub const INPUTS_ANNOTATION: &str = "keelson.io/inputs-sha256";

/// A static pod manifest stamped with the sha256 of `inputs` (host files read when the task runs,
/// after its dependencies wrote them): a new certificate in a kubeconfig restarts the pod; the same
/// files leave the manifest as it is.
pub struct PodManifestTask {
    pub file: FileTask,
    /// Host paths the pod reads only at start.
    pub inputs: Vec<String>,
}

impl PodManifestTask {
    fn desired(&self, ctx: &Ctx) -> Result<FileTask, TaskError> {
        use sha2::Digest as _;
        let mut h = sha2::Sha256::new();
        for p in &self.inputs {
            let path = ctx.host.path(p);
            match fs::read(&path) {
                Ok(bytes) => h.update(sha2::Sha256::digest(&bytes)),
                // Not written yet (a dry run before the dependency): stamped as missing.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => h.update(b"missing"),
                Err(e) => return Err(fs_err(&path)(e).into()),
            }
        }
        let stamp = hex::encode(h.finalize());
        let bad = |e: String| base::fs::FsError { path: PathBuf::from(&self.file.path), source: std::io::Error::new(std::io::ErrorKind::InvalidData, e) };
        let mut doc: serde_yaml_ng::Value = serde_yaml_ng::from_slice(&self.file.contents).map_err(|e| bad(e.to_string()))?;
        let meta = doc.get_mut("metadata").and_then(|m| m.as_mapping_mut()).ok_or_else(|| bad("no metadata".into()))?;
        let annotations = meta.entry("annotations".into()).or_insert_with(|| serde_yaml_ng::Value::Mapping(Default::default()));
        annotations.as_mapping_mut().ok_or_else(|| bad("metadata.annotations is not a map".into()))?.insert(INPUTS_ANNOTATION.into(), stamp.into());
        let body = serde_yaml_ng::to_string(&doc).map_err(|e| bad(e.to_string()))?;
        let mut f = FileTask::new(&self.file.path, body, self.file.mode);
        f.deps = self.file.deps.clone();
        Ok(f)
    }
}

impl Task<Ctx<'_>> for PodManifestTask {
    fn name(&self) -> String {
        self.file.name()
    }
    fn paths(&self) -> Vec<String> {
        self.file.paths()
    }
    fn deps(&self) -> Vec<String> {
        self.file.deps.clone()
    }
    fn check(&self, ctx: &Ctx, deps_changed: bool) -> Result<Vec<String>, TaskError> {
        self.desired(ctx)?.check(ctx, deps_changed)
    }
    fn apply(&self, ctx: &Ctx, deps_changed: bool) -> Result<(), TaskError> {
        self.desired(ctx)?.apply(ctx, deps_changed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unit_that_fails_once_is_started_again_and_one_that_keeps_failing_fails_its_task() {
        let quick = || unit_retries().with_min_delay(std::time::Duration::ZERO).with_max_delay(std::time::Duration::ZERO);
        let fail = || Err(crate::host::CommandError { argv: "systemctl start x.service".into(), message: "exit status: 1".into() });
        let mut calls = 0;
        let once = with_unit_retries("x.service", quick(), || {
            calls += 1;
            if calls == 1 {
                fail()
            } else {
                Ok(())
            }
        });
        assert!(once.is_ok() && calls == 2, "{once:?} after {calls} calls");
        let mut calls = 0;
        let always = with_unit_retries("x.service", quick(), || {
            calls += 1;
            fail()
        });
        assert!(always.is_err() && calls == 4, "{always:?} after {calls} calls: one try and three retries");
    }

    #[test]
    fn finds_swap_entries() {
        let fstab = "UUID=1 / ext4 defaults 0 1\n/swap.img none swap sw 0 0\n# /old none swap sw 0 0\n";
        assert_eq!(swap_lines(fstab), vec![1]);
    }

    #[test]
    fn a_pod_manifest_changes_with_its_inputs_only() {
        let root = tempfile::tempdir().expect("root");
        let host = crate::host::Host::new(root.path());
        let opts = crate::assets::FetchOptions {
            connect_timeout: std::time::Duration::from_secs(1),
            read_timeout: std::time::Duration::from_secs(1),
            rounds: 1,
            backoff: std::time::Duration::ZERO,
            ..Default::default()
        };
        let assets = crate::assets::Fetcher::new(opts, root.path().join("cache")).expect("fetcher");
        let ctx = Ctx { host: &host, assets: &assets };
        let kubeconfig = "/var/lib/kube-proxy/kubeconfig";
        base::fs::write_atomic(&host.path(kubeconfig), b"users: [one]", 0o600, None).expect("write");
        let pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: kube-proxy\n  namespace: kube-system\nspec:\n  hostNetwork: true\n";
        let task = PodManifestTask { file: FileTask::new("/etc/kubernetes/manifests/kube-proxy.manifest", pod, 0o644), inputs: vec![kubeconfig.into()] };
        assert!(!task.check(&ctx, false).expect("check").is_empty(), "not written yet");
        task.apply(&ctx, false).expect("apply");
        assert!(task.check(&ctx, false).expect("check").is_empty(), "converged");
        let read = || -> serde_yaml_ng::Value {
            serde_yaml_ng::from_str(&fs::read_to_string(host.path("/etc/kubernetes/manifests/kube-proxy.manifest")).expect("read")).expect("yaml")
        };
        let first = read()["metadata"]["annotations"][INPUTS_ANNOTATION].as_str().map(str::to_string).expect("stamped");
        assert_eq!(read()["spec"]["hostNetwork"].as_bool(), Some(true), "the pod is kept");
        // A new certificate in the kubeconfig: the manifest must change (the kubelet restarts the pod).
        base::fs::write_atomic(&host.path(kubeconfig), b"users: [two]", 0o600, None).expect("write");
        assert!(!task.check(&ctx, false).expect("check").is_empty(), "a changed input changes the manifest");
        task.apply(&ctx, false).expect("apply");
        let second = read()["metadata"]["annotations"][INPUTS_ANNOTATION].as_str().map(str::to_string).expect("stamped");
        assert_ne!(first, second);
        assert!(task.check(&ctx, false).expect("check").is_empty());
    }
}
