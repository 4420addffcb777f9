//! Test machines for real etcd members: a bridge and network namespaces (addresses that exist only
//! there), etcd started from the manifests protokube writes, and a stand-in for the kubelet that
//! keeps each member running as its manifest says.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use protokube::manifest::Pod;

use crate::host::{self, Host};

/// The client certificate directory etcdctl uses (TLS variant), set by the running scenario.
pub static TLS_DIR: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

pub fn need_tools() {
    for tool in ["ip", "etcd", "etcdctl"] {
        let ok = Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().map(|o| o.status.success()).unwrap_or(false);
        assert!(ok, "this test needs `{tool}` (Debian packages iproute2, etcd-server, etcd-client; scripts/test installs them)");
    }
}

/// Everything this test creates on the host; removed on drop, also when the test fails.
pub struct Net {
    pub id: String,
    pub subnet: String,
    pub bridge: String,
    pub namespaces: Vec<String>,
    pub etcds: Vec<(String, Child)>,
}

impl Net {
    /// `variant` keeps names and addresses of scenarios in one process apart (a deleted namespace's
    /// veth goes away asynchronously).
    pub fn new(variant: u8) -> Net {
        let pid = std::process::id();
        let id = format!("{:x}{variant}", pid % 0xfffff);
        let subnet = format!("10.231.{}", (pid % 100) * 2 + u32::from(variant) + 20);
        let bridge = format!("kpb{id}");
        let n = Net { id, subnet, bridge, namespaces: Vec::new(), etcds: Vec::new() };
        host::sh(&format!("ip link add {0} type bridge && ip addr add {1}.1/24 dev {0} && ip link set {0} up", n.bridge, n.subnet));
        n
    }

    /// A namespace with one veth on the bridge and address `<subnet>.<host>`.
    pub fn namespace(&mut self, tag: &str, host: u8) -> (String, String) {
        let ns = format!("kp{}{tag}", self.id);
        let veth = format!("kv{}{tag}", self.id);
        let ip = format!("{}.{host}", self.subnet);
        self.namespaces.push(ns.clone());
        std::fs::create_dir_all(format!("/etc/netns/{ns}")).expect("/etc/netns dir");
        std::fs::write(format!("/etc/netns/{ns}/hosts"), "127.0.0.1\tlocalhost\n").expect("hosts");
        host::sh(&format!(
            "ip netns add {ns} && ip link add {veth} type veth peer name eth0 netns {ns} && ip link set {veth} master {br} up \
             && ip -n {ns} addr add {ip}/24 dev eth0 && ip -n {ns} link set eth0 up && ip -n {ns} link set lo up",
            br = self.bridge
        ));
        (ns, ip)
    }

    pub fn hosts_file(ns: &str) -> String {
        format!("/etc/netns/{ns}/hosts")
    }

    /// Start etcd in `ns` from the manifest's command and args (host paths re-rooted under `root`).
    pub fn start_etcd(&mut self, ns: &str, h: &Host, log: &std::path::Path) {
        let text = h.manifest("main").expect("main manifest");
        let child = spawn_etcd(ns, h.root.path(), &text, log, "etcd");
        self.etcds.push((ns.to_string(), child));
    }

    pub fn stop_etcd(&mut self, ns: &str) {
        for (n, c) in self.etcds.iter_mut() {
            if n == ns {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        self.etcds.retain(|(n, _)| n != ns);
    }

    pub fn delete_namespace(&mut self, ns: &str) {
        self.stop_etcd(ns);
        let _ = Command::new("ip").args(["netns", "del", ns]).status();
        let _ = std::fs::remove_dir_all(format!("/etc/netns/{ns}"));
        self.namespaces.retain(|n| n != ns);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for (_, c) in self.etcds.iter_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in self.namespaces.clone() {
            let _ = Command::new("ip").args(["netns", "del", &ns]).status();
            let _ = std::fs::remove_dir_all(format!("/etc/netns/{ns}"));
        }
        let _ = Command::new("ip").args(["link", "del", &self.bridge]).status();
    }
}

/// Run etcdctl inside `ns` against `endpoint`, retrying (bounded) until it succeeds.
pub fn etcdctl(ns: &str, endpoint: &str, args: &[&str], within: Duration) -> String {
    let deadline = Instant::now() + within;
    let tls: Vec<String> = match TLS_DIR.lock().ok().and_then(|d| d.clone()) {
        Some(d) => vec![format!("--cacert={d}/ca.crt"), format!("--cert={d}/client.crt"), format!("--key={d}/client.key")],
        None => Vec::new(),
    };
    loop {
        let out = Command::new("ip")
            .args(["netns", "exec", ns, "etcdctl", "--dial-timeout=2s", "--command-timeout=3s", &format!("--endpoints={endpoint}")])
            .args(&tls)
            .args(args)
            .env("ETCDCTL_API", "3")
            .output()
            .expect("etcdctl");
        if out.status.success() {
            // (etcdctl 3.4 prints `endpoint health` on stderr)
            return format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        }
        assert!(Instant::now() < deadline, "etcdctl {args:?} at {endpoint} in {ns} kept failing for {within:?}: {}", String::from_utf8_lossy(&out.stderr));
        std::thread::sleep(Duration::from_millis(300));
    }
}

pub fn logs(dir: &std::path::Path) -> String {
    let mut s = String::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(15).collect();
        s.push_str(&format!("--- {}\n{}\n", e.path().display(), tail.into_iter().rev().collect::<Vec<_>>().join("\n")));
    }
    s
}

/// Start etcd in `ns` from a manifest's command and args (host paths re-rooted under `root`), with
/// `binary` standing in for the image's `/usr/local/bin/etcd`.
pub fn spawn_etcd(ns: &str, root: &Path, manifest: &str, log: &Path, binary: &str) -> Child {
    let pod: Pod = serde_yaml_ng::from_str(manifest).expect("manifest parses as a Pod");
    let c = &pod.spec.containers[0];
    assert_eq!(c.command, vec!["/usr/local/bin/etcd".to_string()]);
    let root_text = root.display().to_string();
    let args: Vec<String> = c
        .args
        .iter()
        .map(|a| a.replace("=/mnt/", &format!("={root_text}/mnt/")).replace("=/etc/kubernetes/", &format!("={root_text}/etc/kubernetes/")))
        .collect();
    let out = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("etcd log");
    // `ip netns exec` gives etcd a private copy of every mount, including the other simulated
    // instances' volumes; drop those (on real machines they are on other hosts) so a dead
    // member's device is free for its replacement.
    let own = root.join("mnt").display().to_string();
    let script = format!(
        "awk '{{print $5}}' /proc/self/mountinfo | grep '/mnt/master-' | grep -v '^{own}/' | while read m; do umount -l \"$m\"; done; exec {binary} \"$@\""
    );
    Command::new("ip")
        .args(["netns", "exec", ns, "sh", "-c", &script, "etcd"])
        .args(&args)
        .stdout(out.try_clone().expect("log"))
        .stderr(out)
        .stdin(Stdio::null())
        .spawn()
        .expect("start etcd")
}

/// What the kubelet does for the etcd static pod: run etcd as the manifest says, restart it when
/// the manifest changes or the process exits, stop it when the manifest goes away. Polls every
/// 200 ms; stops (and kills etcd) on drop. The image's etcd is `etcd` on PATH, or the binary
/// `binaries` names for the image tag's version (`3.5.21` for `…/etcd:v3.5.21`).
pub struct Kubelet {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Kubelet {
    pub fn start(ns: &str, root: &Path, log: &Path) -> Kubelet {
        Kubelet::with_binaries(ns, root, log, std::collections::BTreeMap::new())
    }

    pub fn with_binaries(ns: &str, root: &Path, log: &Path, binaries: std::collections::BTreeMap<String, PathBuf>) -> Kubelet {
        let stop = Arc::new(AtomicBool::new(false));
        let (ns, root, log) = (ns.to_string(), root.to_path_buf(), log.to_path_buf());
        let manifest: PathBuf = root.join("etc/kubernetes/manifests/etcd-main.manifest");
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut running: Option<(String, Child)> = None;
            let kill = |r: &mut Option<(String, Child)>| {
                if let Some((_, mut c)) = r.take() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
            };
            while !flag.load(Ordering::Relaxed) {
                let want = std::fs::read_to_string(&manifest).ok();
                let exited = running.as_mut().is_some_and(|(_, c)| c.try_wait().ok().flatten().is_some());
                if want.as_ref() != running.as_ref().map(|(t, _)| t) || exited {
                    kill(&mut running);
                    if exited {
                        // (the kubelet backs off before restarting a crashed container)
                        std::thread::sleep(Duration::from_millis(500));
                    }
                    if let Some(text) = want {
                        let pod: Pod = serde_yaml_ng::from_str(&text).expect("manifest parses as a Pod");
                        let tag = pod.spec.containers[0].image.rsplit(':').next().unwrap_or("").trim_start_matches('v').to_string();
                        let binary = binaries.get(&tag).map(|p| p.display().to_string()).unwrap_or_else(|| "etcd".into());
                        let child = spawn_etcd(&ns, &root, &text, &log, &binary);
                        running = Some((text, child));
                    }
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            kill(&mut running);
        });
        Kubelet { stop, thread: Some(thread) }
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
