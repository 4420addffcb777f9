//! A stand-in for the kubelet's static-pod runner.
//!
//! The real kubelet cannot be obtained offline (it is downloaded from dl.k8s.io and it needs
//! container images from registry.k8s.io to run any pod). The local cloud installs this program
//! in its place (served by the asset mirror under the kubelet's name, so nodeup installs and
//! starts it through the real kubelet unit). It watches the static-pod directory and runs, for
//! every container whose command is a binary present on the host (etcd from Debian's
//! `etcd-server`), that command with the manifest's args, env and hostPath mounts (bind-mounted
//! in a private mount namespace) — restarting it when it exits (restartPolicy Always) and
//! restarting it when the manifest changes. Containers that need an image (kube-apiserver, …)
//! are reported as not runnable; nothing else of the kubelet is imitated.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

pub const DEFAULT_MANIFEST_DIR: &str = "/etc/kubernetes/manifests";
pub const STATUS_FILE: &str = "/run/kubelet-standin/pods.json";
pub const LOG_DIR: &str = "/var/log/pods";
const STOP_GRACE: Duration = Duration::from_secs(10);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    pub host: String,
    pub container: String,
    pub read_only: bool,
    /// `hostPath.type` (`DirectoryOrCreate`, `FileOrCreate`, …).
    pub kind: String,
}

/// One container of a static pod, resolved for running on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    pub pod: String,
    pub container: String,
    /// Resolved argv (command + args, `$(VAR)` expanded from env as the kubelet does).
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub binds: Vec<Bind>,
    pub image: String,
}

/// Why a container is not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub pod: String,
    pub container: String,
    pub reason: String,
}

fn strs(v: Option<&serde_yaml_ng::Value>) -> Vec<String> {
    v.and_then(|v| v.as_sequence())
        .map(|s| {
            s.iter()
                .filter_map(|x| match x {
                    serde_yaml_ng::Value::String(s) => Some(s.clone()),
                    serde_yaml_ng::Value::Number(n) => Some(n.to_string()),
                    serde_yaml_ng::Value::Bool(b) => Some(b.to_string()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default()
}

fn expand(s: &str, env: &[(String, String)]) -> String {
    let mut out = s.to_string();
    for (k, v) in env {
        out = out.replace(&format!("$({k})"), v);
    }
    out
}

/// Find a binary: the manifest's path if it exists on this host, otherwise its base name on PATH
/// (a manifest written for an image's `/usr/local/bin/etcd` runs Debian's `/usr/bin/etcd`).
pub fn resolve_binary(cmd0: &str, path_env: &str) -> Option<String> {
    let p = Path::new(cmd0);
    if p.is_absolute() && p.is_file() {
        return Some(cmd0.to_string());
    }
    let base = p.file_name()?.to_str()?;
    std::env::split_paths(path_env)
        .map(|d| d.join(base))
        .find(|c| c.is_file())
        .map(|c| c.to_string_lossy().into_owned())
}

/// Parse a static pod manifest (YAML or JSON) into runnable processes and skipped containers.
pub fn parse_pod(text: &str, path_env: &str) -> Result<(Vec<Process>, Vec<Skipped>), String> {
    let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
    let kind = v.get("kind").and_then(|k| k.as_str()).unwrap_or("");
    if kind != "Pod" {
        return Err(format!("kind {kind:?} is not Pod"));
    }
    let pod = v
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(|n| n.as_str())
        .ok_or("metadata.name missing")?
        .to_string();
    let spec = v.get("spec").ok_or("spec missing")?;
    let mut volumes: HashMap<String, (String, String)> = HashMap::new();
    for vol in spec.get("volumes").and_then(|x| x.as_sequence()).into_iter().flatten() {
        let name = vol.get("name").and_then(|n| n.as_str()).unwrap_or("");
        if let Some(hp) = vol.get("hostPath") {
            let path = hp.get("path").and_then(|p| p.as_str()).unwrap_or("");
            let ty = hp.get("type").and_then(|p| p.as_str()).unwrap_or("");
            volumes.insert(name.to_string(), (path.to_string(), ty.to_string()));
        }
    }
    let mut procs = Vec::new();
    let mut skipped = Vec::new();
    let containers = spec
        .get("containers")
        .and_then(|c| c.as_sequence())
        .ok_or("spec.containers missing")?;
    for c in containers {
        let container = c.get("name").and_then(|n| n.as_str()).unwrap_or("").to_string();
        let image = c.get("image").and_then(|n| n.as_str()).unwrap_or("").to_string();
        let env: Vec<(String, String)> = c
            .get("env")
            .and_then(|e| e.as_sequence())
            .into_iter()
            .flatten()
            .filter_map(|e| {
                Some((
                    e.get("name")?.as_str()?.to_string(),
                    e.get("value").and_then(|v| v.as_str()).unwrap_or("").to_string(),
                ))
            })
            .collect();
        let mut argv = strs(c.get("command"));
        argv.extend(strs(c.get("args")));
        let argv: Vec<String> = argv.iter().map(|a| expand(a, &env)).collect();
        let Some(first) = argv.first() else {
            skipped.push(Skipped {
                pod: pod.clone(),
                container,
                reason: format!("no command: the image's entrypoint ({image}) is needed, and images cannot be pulled offline"),
            });
            continue;
        };
        let Some(bin) = resolve_binary(first, path_env) else {
            skipped.push(Skipped {
                pod: pod.clone(),
                container,
                reason: format!("{first} is not on this host (it lives in image {image}, which cannot be pulled offline)"),
            });
            continue;
        };
        let mut binds = Vec::new();
        for m in c.get("volumeMounts").and_then(|x| x.as_sequence()).into_iter().flatten() {
            let name = m.get("name").and_then(|n| n.as_str()).unwrap_or("");
            let Some(mount_path) = m.get("mountPath").and_then(|n| n.as_str()) else {
                continue;
            };
            let Some((host, kind)) = volumes.get(name) else {
                continue;
            };
            binds.push(Bind {
                host: host.clone(),
                container: mount_path.to_string(),
                read_only: m.get("readOnly").and_then(|r| r.as_bool()).unwrap_or(false),
                kind: kind.clone(),
            });
        }
        let mut argv = argv;
        argv[0] = bin;
        procs.push(Process {
            pod: pod.clone(),
            container,
            argv,
            env,
            binds,
            image,
        });
    }
    Ok((procs, skipped))
}

/// Inside the private mount namespace: perform the binds, then exec the command.
/// Called as `kubelet-standin __exec-pod --bind HOST:CONTAINER:ro|rw:KIND … -- ARGV…`.
pub fn exec_pod(args: &[String]) -> std::io::Error {
    let sep = args.iter().position(|a| a == "--").unwrap_or(args.len());
    let (opts, argv) = (&args[..sep], args.get(sep + 1..).unwrap_or(&[]));
    let mut it = opts.iter();
    while let Some(o) = it.next() {
        if o != "--bind" {
            continue;
        }
        let Some(spec) = it.next() else { break };
        let parts: Vec<&str> = spec.splitn(4, ':').collect();
        let [host, container, mode, kind] = parts[..] else {
            continue;
        };
        let hp = Path::new(host);
        if !hp.exists() {
            if kind.starts_with("File") {
                if let Some(d) = hp.parent() {
                    let _ = fs::create_dir_all(d);
                }
                let _ = fs::write(hp, "");
            } else {
                let _ = fs::create_dir_all(hp);
            }
        }
        if host == container {
            continue;
        }
        let cp = Path::new(container);
        if hp.is_dir() {
            let _ = fs::create_dir_all(cp);
        } else if !cp.exists() {
            if let Some(d) = cp.parent() {
                let _ = fs::create_dir_all(d);
            }
            let _ = fs::write(cp, "");
        }
        let st = Command::new("mount").args(["--bind", host, container]).status();
        if !matches!(st, Ok(s) if s.success()) {
            eprintln!("kubelet-standin: cannot bind {host} to {container}");
        }
        if mode == "ro" {
            let _ = Command::new("mount")
                .args(["-o", "remount,bind,ro", container])
                .status();
        }
    }
    let Some((prog, rest)) = argv.split_first() else {
        return std::io::Error::other("no command");
    };
    Command::new(prog).args(rest).exec()
}

struct Running {
    proc_: Process,
    file_hash: String,
    child: Option<Child>,
    started: Instant,
    restarts: u32,
    next_start: Instant,
    backoff: Duration,
}

#[derive(serde::Serialize)]
struct StatusEntry {
    pod: String,
    container: String,
    manifest: String,
    state: String,
    pid: Option<u32>,
    restarts: u32,
    argv: Vec<String>,
}

/// The runner: owns the processes it started.
pub struct Runner {
    pub manifest_dir: PathBuf,
    pub self_exe: PathBuf,
    pub log_dir: PathBuf,
    pub status_file: PathBuf,
    running: BTreeMap<(String, String), Running>,
    skipped: BTreeMap<(String, String), Skipped>,
}

fn hash(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

impl Runner {
    pub fn new(manifest_dir: PathBuf, self_exe: PathBuf) -> Runner {
        Runner {
            manifest_dir,
            self_exe,
            log_dir: PathBuf::from(LOG_DIR),
            status_file: PathBuf::from(STATUS_FILE),
            running: BTreeMap::new(),
            skipped: BTreeMap::new(),
        }
    }

    fn start(&self, p: &Process) -> std::io::Result<Child> {
        fs::create_dir_all(&self.log_dir)?;
        let log_path = self.log_dir.join(format!("{}_{}.log", p.pod, p.container));
        let log = fs::OpenOptions::new().create(true).append(true).open(&log_path)?;
        let log2 = log.try_clone()?;
        let mut c = Command::new("unshare");
        c.args(["--mount", "--propagation", "private", "--"]).arg(&self.self_exe).arg("__exec-pod");
        for b in &p.binds {
            c.arg("--bind").arg(format!(
                "{}:{}:{}:{}",
                b.host,
                b.container,
                if b.read_only { "ro" } else { "rw" },
                b.kind
            ));
        }
        c.arg("--").args(&p.argv);
        for (k, v) in &p.env {
            c.env(k, v);
        }
        c.stdin(Stdio::null()).stdout(log).stderr(log2).process_group(0);
        c.spawn()
    }

    fn stop(r: &mut Running) {
        if let Some(mut child) = r.child.take() {
            let pgid = child.id() as i64;
            crate::cmd::kill(-pgid, "TERM");
            let deadline = Instant::now() + STOP_GRACE;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            crate::cmd::kill(-pgid, "KILL");
            let _ = child.wait();
        }
    }

    /// One pass: read the manifests, stop what changed or vanished, (re)start what should run.
    pub fn sync(&mut self) {
        let path_env = std::env::var("PATH").unwrap_or_else(|_| "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
        let mut desired: BTreeMap<(String, String), (Process, String)> = BTreeMap::new();
        let mut skipped = BTreeMap::new();
        let mut files: Vec<PathBuf> = fs::read_dir(&self.manifest_dir)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        files.sort();
        for f in files {
            let name = f.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.starts_with('.') || !(name.ends_with(".manifest") || name.ends_with(".yaml") || name.ends_with(".yml") || name.ends_with(".json")) {
                continue;
            }
            let Ok(text) = fs::read_to_string(&f) else { continue };
            let h = hash(&text);
            match parse_pod(&text, &path_env) {
                Ok((procs, skips)) => {
                    for p in procs {
                        desired.insert((name.to_string(), p.container.clone()), (p, h.clone()));
                    }
                    for s in skips {
                        skipped.insert((name.to_string(), s.container.clone()), s);
                    }
                }
                Err(e) => {
                    skipped.insert(
                        (name.to_string(), String::new()),
                        Skipped { pod: name.to_string(), container: String::new(), reason: format!("unreadable manifest: {e}") },
                    );
                }
            }
        }
        for (k, s) in &skipped {
            if !self.skipped.contains_key(k) {
                eprintln!("kubelet-standin: {} / {}: not run: {}", s.pod, s.container, s.reason);
            }
        }
        self.skipped = skipped;
        // Stop what vanished or changed.
        let keys: Vec<_> = self.running.keys().cloned().collect();
        for k in keys {
            let changed = match desired.get(&k) {
                None => true,
                Some((p, h)) => {
                    let r = &self.running[&k];
                    *h != r.file_hash || *p != r.proc_
                }
            };
            if changed {
                if let Some(mut r) = self.running.remove(&k) {
                    eprintln!("kubelet-standin: {} / {}: manifest changed or removed; stopping", r.proc_.pod, r.proc_.container);
                    Self::stop(&mut r);
                }
            }
        }
        // Start what should run; restart what exited (with backoff).
        let now = Instant::now();
        let mut to_start = Vec::new();
        for (k, (p, h)) in desired {
            let r = self.running.entry(k).or_insert_with(|| Running {
                proc_: p.clone(),
                file_hash: h.clone(),
                child: None,
                started: now,
                restarts: 0,
                next_start: now,
                backoff: Duration::from_secs(1),
            });
            if let Some(c) = r.child.as_mut() {
                match c.try_wait() {
                    Ok(None) => {
                        if r.started.elapsed() > Duration::from_secs(30) {
                            r.backoff = Duration::from_secs(1);
                        }
                        continue;
                    }
                    Ok(Some(st)) => {
                        eprintln!("kubelet-standin: {} / {}: exited ({st}); restarting in {:?}", r.proc_.pod, r.proc_.container, r.backoff);
                        r.child = None;
                        r.next_start = Instant::now() + r.backoff;
                        r.backoff = (r.backoff * 2).min(MAX_BACKOFF);
                        r.restarts += 1;
                    }
                    Err(_) => r.child = None,
                }
            }
            if r.child.is_none() && Instant::now() >= r.next_start {
                to_start.push(r.proc_.clone());
            }
        }
        for proc_ in to_start {
            match self.start(&proc_) {
                Ok(c) => {
                    eprintln!("kubelet-standin: {} / {}: started pid {}: {}", proc_.pod, proc_.container, c.id(), proc_.argv.join(" "));
                    self.set_child(&proc_, c);
                }
                Err(e) => {
                    eprintln!("kubelet-standin: {} / {}: cannot start: {e}", proc_.pod, proc_.container);
                    if let Some(r) = self.find_mut(&proc_) {
                        r.next_start = Instant::now() + r.backoff;
                        r.backoff = (r.backoff * 2).min(MAX_BACKOFF);
                    }
                }
            }
        }
        self.write_status();
    }

    fn find_mut(&mut self, p: &Process) -> Option<&mut Running> {
        self.running.values_mut().find(|r| r.proc_.pod == p.pod && r.proc_.container == p.container)
    }

    fn set_child(&mut self, p: &Process, c: Child) {
        if let Some(r) = self.find_mut(p) {
            r.child = Some(c);
            r.started = Instant::now();
        }
    }

    fn write_status(&self) {
        let mut entries: Vec<StatusEntry> = self
            .running
            .iter()
            .map(|((file, _), r)| StatusEntry {
                pod: r.proc_.pod.clone(),
                container: r.proc_.container.clone(),
                manifest: file.clone(),
                state: if r.child.is_some() { "running".into() } else { "backoff".into() },
                pid: r.child.as_ref().map(|c| c.id()),
                restarts: r.restarts,
                argv: r.proc_.argv.clone(),
            })
            .collect();
        entries.extend(self.skipped.iter().map(|((file, _), s)| StatusEntry {
            pod: s.pod.clone(),
            container: s.container.clone(),
            manifest: file.clone(),
            state: format!("not run: {}", s.reason),
            pid: None,
            restarts: 0,
            argv: vec![],
        }));
        if let Some(d) = self.status_file.parent() {
            let _ = fs::create_dir_all(d);
        }
        let tmp = self.status_file.with_extension("tmp");
        if fs::write(&tmp, serde_json::to_string_pretty(&entries).unwrap_or_default()).is_ok() {
            let _ = fs::rename(&tmp, &self.status_file);
        }
    }

    /// Stop everything (on SIGTERM of the stand-in the process group goes too; this is for tests).
    pub fn shutdown(&mut self) {
        for r in self.running.values_mut() {
            Self::stop(r);
        }
        self.running.clear();
    }
}

/// The manifest directory from kubelet-style flags: `--pod-manifest-path`, else `staticPodPath`
/// of `--config`, else the default.
pub fn manifest_dir_from_args(args: &[String]) -> PathBuf {
    let mut config = None;
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        let (k, v) = match a.split_once('=') {
            Some((k, v)) => (k.to_string(), Some(v.to_string())),
            None => (a.clone(), args.get(i + 1).cloned()),
        };
        match k.as_str() {
            "--pod-manifest-path" => {
                if let Some(v) = v {
                    return PathBuf::from(v);
                }
            }
            "--config" => config = v,
            _ => {}
        }
        i += 1;
    }
    if let Some(c) = config {
        if let Ok(text) = fs::read_to_string(&c) {
            if let Ok(v) = serde_yaml_ng::from_str::<serde_yaml_ng::Value>(&text) {
                if let Some(p) = v.get("staticPodPath").and_then(|p| p.as_str()) {
                    return PathBuf::from(p);
                }
            }
        }
    }
    PathBuf::from(DEFAULT_MANIFEST_DIR)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ETCD: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: etcd-manager-main
  namespace: kube-system
spec:
  hostNetwork: true
  containers:
  - name: etcd
    image: registry.k8s.io/etcd:v3.5.21
    command:
    - /usr/local/bin/sh
    - --name=$(NAME)
    args: ["--data-dir=/var/etcd/data"]
    env:
    - name: NAME
      value: a
    volumeMounts:
    - name: data
      mountPath: /var/etcd/data
    - name: pki
      mountPath: /etc/kubernetes/pki
      readOnly: true
  - name: sidecar
    image: registry.k8s.io/kube-apiserver:v1.35.7
    command: [/usr/local/bin/kube-apiserver]
  volumes:
  - name: data
    hostPath:
      path: /mnt/master-vol-1/data
      type: DirectoryOrCreate
  - name: pki
    hostPath:
      path: /etc/kubernetes/pki/etcd
"#;

    #[test]
    fn parses_runnable_and_skipped() {
        let (procs, skipped) = parse_pod(ETCD, "/bin:/usr/bin").unwrap();
        assert_eq!(procs.len(), 1);
        let p = &procs[0];
        assert_eq!(p.pod, "etcd-manager-main");
        assert!(p.argv[0].ends_with("/sh"), "{:?}", p.argv);
        assert_eq!(p.argv[1..], ["--name=a".to_string(), "--data-dir=/var/etcd/data".to_string()]);
        assert_eq!(p.binds.len(), 2);
        assert_eq!(p.binds[0].host, "/mnt/master-vol-1/data");
        assert_eq!(p.binds[0].container, "/var/etcd/data");
        assert!(p.binds[1].read_only);
        assert_eq!(skipped.len(), 1);
        assert!(skipped[0].reason.contains("cannot be pulled offline"));
    }

    #[test]
    fn rejects_non_pods() {
        assert!(parse_pod("kind: Deployment\n", "/bin").is_err());
        assert!(parse_pod(": : :", "/bin").is_err());
    }

    #[test]
    fn manifest_dir_flags() {
        let a = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(manifest_dir_from_args(&a(&["--pod-manifest-path=/x"])), PathBuf::from("/x"));
        assert_eq!(manifest_dir_from_args(&a(&["--v=2", "--pod-manifest-path", "/y"])), PathBuf::from("/y"));
        assert_eq!(manifest_dir_from_args(&a(&["--config=/nonexistent"])), PathBuf::from(DEFAULT_MANIFEST_DIR));
    }
}
