//! The commands that talk to the daemon through the state directory: `up`, `ps`, `kill`, `down`,
//! `kubectl`, `env`, and the sweep of whatever a crashed run left behind.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};

use crate::cloud::Cloud;
use crate::cpu_model::CpuModel;
use crate::machine::{self, MachineInfo};
use crate::net;
use crate::paths::{self, MachinePaths, State};
use crate::spec::Spec;
use crate::{cmd, volumes};

use super::diagnostics::{blocker, diagnose, tail};
use super::health::health;
use super::state::ClusterState;

pub(crate) fn state() -> State {
    State::new(paths::state_dir())
}

fn daemon_alive(cs: &ClusterState) -> bool {
    cs.daemon_pid > 0 && cmd::alive(cs.daemon_pid)
}

fn require_root() -> anyhow::Result<()> {
    let uid = fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
        .unwrap_or_default();
    if uid != "0" {
        bail!("keelson-local needs root (network namespaces, loop devices, systemd-nspawn)");
    }
    for (tool, pkg) in [
        ("systemd-nspawn", "systemd-container"),
        ("debootstrap", "debootstrap"),
        ("losetup", "mount"),
        ("ip", "iproute2"),
        ("apt-get", "apt"),
        ("dpkg-deb", "dpkg"),
    ] {
        if cmd::which(tool).is_none() && !Path::new("/usr/sbin").join(tool).exists() {
            bail!("{tool} is missing: apt-get install {pkg} (scripts/test installs it)");
        }
    }
    Ok(())
}

pub(crate) fn running_cluster() -> anyhow::Result<ClusterState> {
    let cs = ClusterState::load(&state()).ok_or_else(|| anyhow!("no local cluster (keelson-local up -f SPEC)"))?;
    if !daemon_alive(&cs) {
        bail!("the local cluster's daemon is not running (keelson-local down, then up)");
    }
    if cs.kubeconfig.is_empty() || cs.kubectl.is_empty() {
        bail!("the local cluster has no API yet (phase: {})", cs.phase);
    }
    Ok(cs)
}

/// `keelson-local kubectl ARGS…`: the cluster's kubectl with its admin kubeconfig.
pub fn kubectl(args: &[String]) -> anyhow::Result<std::process::ExitStatus> {
    let cs = running_cluster()?;
    Command::new(&cs.kubectl).arg("--kubeconfig").arg(&cs.kubeconfig).args(args).status().with_context(|| format!("running {}", cs.kubectl))
}

/// `keelson-local service-url NAMESPACE/NAME`: the host URLs of the Service's load balancer.
pub fn service_urls(service: &str) -> anyhow::Result<Vec<String>> {
    let Some((ns, name)) = service.split_once('/').filter(|(n, s)| !n.is_empty() && !s.is_empty() && !s.contains('/')) else {
        bail!("service {service:?}: expected NAMESPACE/NAME");
    };
    let cs = running_cluster()?;
    match cs.services.get(&format!("{ns}/{name}")) {
        Some(urls) if !urls.is_empty() => Ok(urls.clone()),
        _ => {
            let known: Vec<&String> = cs.services.keys().collect();
            bail!(
                "service {ns}/{name} has no network load balancer in the local cloud (yet): the cloud-controller-manager makes one for a Service of type LoadBalancer annotated service.beta.kubernetes.io/aws-load-balancer-type: nlb (Classic ELBs are not played); load balancers of Services now: {known:?}"
            )
        }
    }
}

/// Quote a value for a POSIX shell.
fn sh_quote(v: &str) -> String {
    format!("'{}'", v.replace('\'', r"'\''"))
}

/// `keelson-local env`: the environment of the local cloud, as `export` lines.
pub fn env_exports() -> anyhow::Result<String> {
    let cs = running_cluster()?;
    let st = state();
    let kubectl_dir = Path::new(&cs.kubectl).parent().map(|p| p.display().to_string()).unwrap_or_default();
    let cloud = if cs.is_gce() {
        vec![
            (crate::gce::daemon::GCE_ENDPOINT_ENV, cs.gce_api.clone()),
            ("STORAGE_EMULATOR_HOST", cs.gce_storage.clone()),
            // The local Cloud Storage answers plain HTTP on the bridge: allowed explicitly.
            (base::plain_http::ALLOW_ENV, cs.gateway.to_string()),
            ("GCE_METADATA_HOST", cs.gce_metadata_host.clone()),
        ]
    } else {
        vec![
            ("AWS_ENDPOINT_URL", cs.endpoint()),
            // The spec's endpoint annotations name the local cloud's gateway, plain http://.
            (base::plain_http::ALLOW_ENV, cs.gateway.to_string()),
            ("AWS_ACCESS_KEY_ID", "keelson-local".to_string()),
            ("AWS_SECRET_ACCESS_KEY", "keelson-local".to_string()),
            ("AWS_REGION", cs.region.clone()),
            ("AWS_DEFAULT_REGION", cs.region.clone()),
        ]
    };
    let vars = [
        ("KUBECONFIG", cs.kubeconfig.clone()),
        ("KEELSON_LOCAL_REGISTRY", cs.registry.clone()),
        // The spec as applied (local mirror, registry and image): `keelson … -f "$KEELSON_LOCAL_SPEC"`.
        ("KEELSON_LOCAL_SPEC", st.root.join("spec.yaml").display().to_string()),
        ("KEELSON_ASSET_HASHES", st.root.join("asset-hashes.tsv").display().to_string()),
        // `--baked`: images pinned to the digests of the bundle the machines were baked from.
        ("KEELSON_IMAGE_DIGESTS", if cs.baked || cs.air_gapped { super::bundled::bundle_path(&st.root).display().to_string() } else { String::new() }),
        ("KEELSON_NODEUP_ASSET", cs.nodeup_asset.clone()),
        ("KOPS_BASE_URL", format!("http://{}:{}/kops", cs.gateway, cs.mirror_port)),
        ("PATH", format!("{kubectl_dir}:{}", std::env::var("PATH").unwrap_or_default())),
    ];
    // An unknown value is left out rather than exported empty.
    Ok(cloud.iter().chain(vars.iter()).filter(|(_, v)| !v.is_empty()).map(|(k, v)| format!("export {k}={}\n", sh_quote(v))).collect())
}

/// `up`: start the daemon and wait until the control plane is healthy.
pub fn up(spec_path: &Path, timeout: Duration) -> anyhow::Result<()> {
    up_with(spec_path, timeout, super::Boot::PLAIN)
}

/// `up`, the machines booted as `boot` says.
pub fn up_with(spec_path: &Path, timeout: Duration, boot: super::Boot) -> anyhow::Result<()> {
    up_cpu(spec_path, timeout, boot, CpuModel::Shared)
}

/// `up_with`, the machines sharing the host's cores as `cpu` says ([`crate::cpu_model`]).
pub fn up_cpu(spec_path: &Path, timeout: Duration, boot: super::Boot, cpu: CpuModel) -> anyhow::Result<()> {
    require_root()?;
    let st = state();
    if let Some(cs) = ClusterState::load(&st) {
        if daemon_alive(&cs) {
            bail!("a local cluster ({}) is already up (daemon pid {}); run `keelson-local down` first", cs.name, cs.daemon_pid);
        }
    }
    // Leftovers of a crashed run go first.
    down_quiet();
    fs::create_dir_all(&st.root)?;
    cpu.write(&st.cpu_model_file()).with_context(|| st.cpu_model_file().display().to_string())?;
    crate::disk::require_room_for_cluster(&st.root)?;
    let spec_abs = fs::canonicalize(spec_path).with_context(|| format!("{}", spec_path.display()))?;
    Spec::load(&spec_abs)?;
    let log = fs::File::create(st.daemon_log())?;
    let exe = std::env::current_exe()?;
    let mut daemon = Command::new(&exe);
    daemon.arg("daemon").arg("-f").arg(&spec_abs);
    daemon.args(boot.flags());
    let child = daemon.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log).process_group(0).spawn()?;
    let pid = child.id();
    // The daemon outlives us; a thread reaps it if it exits while we wait.
    std::thread::spawn(move || {
        let mut child = child;
        let _ = child.wait();
    });
    eprintln!("keelson-local: daemon pid {pid}; log {}", st.daemon_log().display());
    /// How much longer than `--timeout` the first run's builds may take.
    const COLD_BUILD_BOUND: Duration = Duration::from_secs(3600);
    let t0 = Instant::now();
    let mut deadline = t0 + timeout;
    let mut last_phase = String::new();
    let mut seen_events = 0usize;
    let mut last_problems = String::new();
    let mut last_health = Instant::now() - Duration::from_secs(10);
    loop {
        if let Some(cs) = ClusterState::load(&st) {
            if cs.phase != last_phase {
                eprintln!("keelson-local: [{:>5.1} s] {}", t0.elapsed().as_secs_f64(), cs.phase);
                last_phase = cs.phase.clone();
            }
            // The one-time builds (Kubernetes, containerd, etcd and the images from their Go modules,
            // cached after the first run) do not count against the cluster's own timeout: on a cold
            // machine they alone can take longer. They have a bound of their own.
            if cs.phase.starts_with("building") {
                deadline = deadline.max(Instant::now() + timeout).min(t0 + timeout + COLD_BUILD_BOUND);
            }
            for e in cs.events.iter().skip(seen_events) {
                eprintln!("keelson-local: [{:>5.1} s]   {}", t0.elapsed().as_secs_f64(), e.split_once(' ').map(|x| x.1).unwrap_or(e));
            }
            seen_events = cs.events.len();
            if cs.phase == "failed" {
                bail!(
                    "the local cloud failed to come up: {}\n(daemon log: {}; run `keelson-local down` to clean up)",
                    cs.error.unwrap_or_default(),
                    st.daemon_log().display()
                );
            }
            if !cmd::alive(pid as i64) {
                bail!("the daemon exited (log: {}):\n{}", st.daemon_log().display(), tail(&st.daemon_log(), 30));
            }
            if cs.phase == "running" && last_health.elapsed() > Duration::from_secs(2) {
                last_health = Instant::now();
                let h = health(&cs);
                if h.problems.is_empty() {
                    for l in &h.lines {
                        println!("{l}");
                    }
                    println!(
                        "keelson-local: {} is up: {} machines, control plane healthy, every node Ready ({:.0} s)",
                        cs.name,
                        cs.machines.len(),
                        t0.elapsed().as_secs_f64()
                    );
                    println!("keelson-local: {}", super::boot_times::report(&cs));
                    return Ok(());
                }
                if let Some(blocker) = blocker(&cs) {
                    bail!("blocked by a missing piece: {blocker}\n(cluster left up for inspection: `keelson-local ps`, then `keelson-local down`)");
                }
                let p = h.problems.join("; ");
                if p != last_problems && t0.elapsed() > Duration::from_secs(5) {
                    eprintln!("keelson-local: [{:>5.1} s] waiting: {p}", t0.elapsed().as_secs_f64());
                    last_problems = p;
                }
            }
        }
        if Instant::now() > deadline {
            let diag = ClusterState::load(&st).map(|cs| diagnose(&cs)).unwrap_or_default();
            bail!("the control plane was not healthy within {} s: {last_problems}\n{diag}(cluster left up for inspection: `keelson-local ps`, then `keelson-local down`)", timeout.as_secs());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

pub fn ps() -> anyhow::Result<()> {
    let st = state();
    let cs = ClusterState::load(&st).ok_or_else(|| anyhow!("no local cluster (state {} has no cluster.json)", st.root.display()))?;
    println!(
        "cluster {} — phase {}{} — moto http://127.0.0.1:{} — daemon {}",
        cs.name,
        cs.phase,
        cs.error.as_deref().map(|e| format!(" ({e})")).unwrap_or_default(),
        cs.moto_port,
        if daemon_alive(&cs) { "running" } else { "NOT RUNNING" }
    );
    println!("{:<21} {:<14} {:<26} {:<15} {:<11} status", "INSTANCE", "ROLE", "GROUP", "IP", "ZONE");
    let h = health(&cs);
    for l in &h.lines {
        println!("{l}");
    }
    for p in &h.problems {
        println!("problem: {p}");
    }
    Ok(())
}

pub fn kill(instance: &str) -> anyhow::Result<()> {
    let cs = ClusterState::load(&state()).ok_or_else(|| anyhow!("no local cluster is up"))?;
    if !cs.gce_api.is_empty() {
        let path = crate::gce::daemon::instance_path(&cs, instance).ok_or_else(|| anyhow!("no machine named {instance} (by name or numeric id)"))?;
        let (status, body) = crate::gce::cloud::rest(&cs.gce_api, "DELETE", &path)?;
        if status != 200 {
            bail!("instances.delete {path}: HTTP {status}: {body}");
        }
        println!("keelson-local: deleted {instance} in the local Compute (its MIG recreates it)");
        return Ok(());
    }
    let cloud = Cloud::new(&cs.endpoint(), &cs.region);
    cloud.terminate(instance)?;
    println!("keelson-local: terminated {instance} in moto");
    Ok(())
}

/// `down`: stop the daemon (it tears down what it built), then sweep anything left behind.
pub fn down() -> anyhow::Result<Vec<String>> {
    let st = state();
    if let Some(cs) = ClusterState::load(&st) {
        if daemon_alive(&cs) {
            let _ = fs::write(st.stop_file(), "");
            cmd::kill(cs.daemon_pid, "TERM");
            let deadline = Instant::now() + Duration::from_secs(90);
            while cmd::alive(cs.daemon_pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            if cmd::alive(cs.daemon_pid) {
                cmd::kill(cs.daemon_pid, "KILL");
            }
        }
        if cs.moto_pid > 0 && cmd::alive(cs.moto_pid) {
            cmd::kill(-cs.moto_pid, "KILL");
            cmd::kill(cs.moto_pid, "KILL");
        }
    }
    let swept = sweep(&st);
    let _ = fs::remove_dir_all(&st.root);
    Ok(swept)
}

fn down_quiet() {
    let _ = down();
}

/// Remove every leftover the local cloud can leave: machines (from their machine.json), their
/// namespaces and veths, the bridge, loop devices backed under the state dir, mounts under it,
/// nspawn's run-dir entries, processes started from it.
pub fn sweep(st: &State) -> Vec<String> {
    let mut found = Vec::new();
    // The registry is the daemon's child; a daemon killed hard leaves it behind.
    if let Some(cs) = ClusterState::load(st) {
        let is_registry = |pid: i64| fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "docker-registry");
        if cs.registry_pid > 0 && cmd::alive(cs.registry_pid) && is_registry(cs.registry_pid) {
            found.push(format!("registry pid {}", cs.registry_pid));
            cmd::kill(cs.registry_pid, "KILL");
        }
    }
    if let Ok(entries) = fs::read_dir(st.machines_dir()) {
        for e in entries.flatten() {
            let mp = MachinePaths { dir: e.path() };
            if let Ok(text) = fs::read_to_string(mp.info_file()) {
                if let Ok(info) = serde_json::from_str::<MachineInfo>(&text) {
                    if info.init_pid.is_some_and(cmd::alive) || machine::is_mountpoint(&info.root) {
                        found.push(format!("machine {}", info.instance_id));
                    }
                    machine::teardown(&info, &mp);
                }
            }
            let root = mp.root();
            if machine::is_mountpoint(&root) {
                found.push(format!("mount {}", root.display()));
                cmd::sh_quiet(&["umount", "-l", &root.to_string_lossy()]);
            }
        }
    }
    // Any mount under the state dir.
    let prefix = st.root.to_string_lossy().to_string();
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut mps: Vec<String> = mounts.lines().filter_map(|l| l.split_whitespace().nth(4)).filter(|m| m.starts_with(&prefix)).map(str::to_string).collect();
    mps.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in mps {
        found.push(format!("mount {m}"));
        cmd::sh_quiet(&["umount", "-l", &m]);
    }
    for ns in net::our_namespaces() {
        found.push(format!("netns {ns}"));
        for pid in machine::pids_in_netns(&ns) {
            cmd::kill(pid, "KILL");
        }
        cmd::sh_quiet(&["ip", "netns", "del", &ns]);
    }
    for l in net::our_links() {
        if l.starts_with(paths::VETH_PREFIX) || l == paths::DEFAULT_BRIDGE {
            found.push(format!("link {l}"));
            cmd::sh_quiet(&["ip", "link", "del", &l]);
        }
    }
    for (dev, file) in volumes::loops_under(&st.root) {
        found.push(format!("loop {dev} ({})", file.display()));
        cmd::sh_quiet(&["losetup", "-d", &dev]);
    }
    // Processes whose command line names the state dir (IMDS servers, nspawn).
    if let Ok(entries) = fs::read_dir("/proc") {
        let me = std::process::id() as i64;
        for e in entries.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i64>().ok()) else { continue };
            if pid == me {
                continue;
            }
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let c = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if c.contains(&prefix) && (c.contains("systemd-nspawn") || c.contains(" imds ") || c.contains("moto.server")) {
                found.push(format!("process {pid}"));
                cmd::kill(pid, "KILL");
            }
        }
    }
    if let Ok(entries) = fs::read_dir(Path::new(paths::NSPAWN_RUN_DIR).join("propagate")) {
        for e in entries.flatten() {
            let n = e.file_name().to_string_lossy().to_string();
            if n.starts_with("i-") {
                found.push(format!("nspawn leftover {n}"));
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }
    found
}
