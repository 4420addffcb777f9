//! The kubelet's last mile against the real kubelet (issue 23): the NodeupConfig that sets every
//! `KubeletConfigSpec` field Keelson supports to a non-default value (`testkit::kubelet_fields`, the
//! table nodeup's `tests/render.rs` checks the render against) is rendered with `nodeup render`, and
//! keelson-local's kubelet (built from source at the examples' Kubernetes version) is started on
//! the rendered `kubelet.conf` and `/etc/sysconfig/kubelet` flags. It must decode the file strictly,
//! take every flag and pass its own validation — which proves the `KubeletConfiguration` key names
//! and value shapes, and the flag names, are the kubelet's.
//!
//! How the kubelet (v1.34, `cmd/kubelet/app/server.go`) loads `--config`: the file is decoded
//! strictly (unknown or duplicate keys); a *strict* error is not fatal — it decodes again leniently
//! and only logs `"Using lenient decoding as strict decoding failed" err="strict decoding error:
//! unknown field …"` (klog, before logging is configured) and runs on without the key. A wrong type
//! (`maxPods: "55"`) fails the decode itself and the kubelet exits (`failed to decode: json: cannot
//! unmarshal …`), as does an unknown flag. Then the flags are re-applied over the file, logging is
//! configured (`logging.format`), `ValidateKubeletConfiguration` runs (exit on error), the TLS options
//! are parsed (cipher suite and TLS version names) and `Run` validates once more, builds the API
//! client from the (bootstrap) kubeconfig, loads the client CA and dials the container runtime
//! (`containerRuntimeEndpoint`). So [`problems`] counts the lenient-decoding line as a failure, and
//! the kubelet must get as far as dialing the runtime: the test listens on that socket, and a
//! connection there means every check above has passed. It then kills the kubelet — the eviction
//! thresholds, reserved resources, cgroups and CPU manager are parsed later, by the container
//! manager, which this test does not reach (on this cgroup-v1 host `memorySwapBehavior: LimitedSwap`
//! would fail there; it needs cgroup v2).
//!
//! Isolation: the kubelet runs in its own mount, PID and network namespaces (`unshare`, killed with
//! its parent), chrooted into a copy of the render with only a private `/proc` mounted and the
//! kubelet binary bound in: no `/sys` (so no cgroup), no `/dev`, no network (even its loopback is
//! down), and whatever it writes (its self-signed serving certificate, the kubeconfig it derives from the
//! bootstrap one) lands in the copy. No field value is changed for the environment; two files that
//! other parts of a node provide and the render does not are stood in: the client CA the spec names
//! (`clientCaFile`, a copy of the cluster CA the render wrote) and the bootstrap kubeconfig (an API
//! server on 127.0.0.1, which it cannot reach). Fields `keelson validate` refuses for this Kubernetes
//! version (`registerSchedulable` from 1.34) are left out, as they never reach such a node. The table
//! turns on the two feature gates the kubelet's validation requires for its values
//! (`CustomCPUCFSQuotaPeriod` for `cpuCFSQuotaPeriod`, `KubeletCrashLoopBackOffMax` for
//! `crashLoopBackOffMaxContainerRestartPeriod`): without them it exits.
//!
//! Negative controls in the same test, each on a fresh copy of the render: a renamed
//! `kubelet.conf` key, a value of the wrong type, a value its validation refuses and an unknown flag
//! must each be reported, so the check cannot pass vacuously.
//!
//! Needs root (namespaces, chroot, mounts), `unshare` (util-linux), Go (the first run builds the
//! Kubernetes binaries, later runs reuse the cache), and nodeup's binary in this target directory,
//! no older than its sources (`cargo test --workspace --all-targets` builds it; with `--test kubelet`
//! alone add `--test render`). Under 2 s once everything is built (measured on 2 busy cores: render
//! 0.2–0.4 s, the all-fields run 0.1–0.3 s, the four controls 0.4–1.1 s).

mod support;

use std::fs;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime};

use keelson_local::kubernetes;
use serde_yaml_ng::Value;
use testkit::kubelet_fields::{self, KubeletField};
use testkit::mirror::{standard_assets, write_state};

const NODEUP_FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../nodeup/tests/fixtures/ha");
/// How long the kubelet may take to reach the container runtime (it takes well under a second).
const DIAL_TIMEOUT: Duration = Duration::from_secs(30);
/// The kubelet's path in the chroot (the unit's `ExecStart`).
const KUBELET_IN_ROOT: &str = "/usr/local/bin/kubelet";

#[test]
fn the_real_kubelet_accepts_every_supported_field() {
    support::require_namespace_root();
    let started = Instant::now();
    let version = examples_kubernetes_version();
    let kubelet = kubernetes::kubernetes_binaries(&version).expect("building the Kubernetes binaries").join("kubelet");
    let nodeup = fresh_nodeup();
    let built = started.elapsed();

    let work = tempfile::tempdir().expect("tempdir");
    let fields = kubelet_fields::for_version(&version);
    let render = render(&nodeup, work.path(), &version, &fields);
    let rendered = started.elapsed();

    // The render as a node would run it.
    let run = probe(&render, work.path(), "all-fields", &kubelet, &|_| {});
    let found = problems(&run);
    assert!(found.is_empty(), "the kubelet v{version} refused what nodeup rendered:\n{}\n--- kubelet output ---\n{}", found.join("\n"), tail(&run.log, 40));
    // The version line comes after logging is configured: JSON here (`logFormat: json`).
    assert!(
        run.log.lines().any(|l| l.contains("Kubelet version") && l.contains(&format!("\"v{version}\""))),
        "not the v{version} kubelet:\n{}",
        tail(&run.log, 20)
    );
    let accepted = started.elapsed();

    // Negative controls: each must be reported, naming what is wrong.
    let key = renamed_key(&fields);
    let value = |key: &str| fields.iter().find(|f| f.key == key).map(|f| f.value).unwrap_or_else(|| panic!("{key} is in the table"));
    let (max_pods, low) = (value("maxPods"), value("imageGCLowThresholdPercent"));
    let high: u32 = value("imageGCHighThresholdPercent").parse().expect("a percentage");
    let controls = [
        Control {
            what: "a renamed key",
            file: CONF,
            from: format!("{key}:"),
            to: format!("{key}Renamed:"),
            expect: format!(r#"unknown field \"{key}Renamed\""#),
        },
        Control {
            what: "a wrong type",
            file: CONF,
            from: format!("maxPods: {max_pods}"),
            to: format!("maxPods: \"{max_pods}\""),
            expect: "cannot unmarshal string into Go struct field KubeletConfiguration.maxPods".into(),
        },
        // The low threshold above the high one.
        Control {
            what: "a value its validation refuses",
            file: CONF,
            from: format!("imageGCLowThresholdPercent: {low}"),
            to: format!("imageGCLowThresholdPercent: {}", high + 1),
            expect: format!("imageGCLowThresholdPercent (--image-gc-low-threshold) {} must be less than", high + 1),
        },
        Control {
            what: "an unknown flag",
            file: SYSCONFIG,
            from: "DAEMON_ARGS=\"".into(),
            to: "DAEMON_ARGS=\"--not-a-kubelet-flag=1 ".into(),
            expect: "unknown flag: --not-a-kubelet-flag".into(),
        },
    ];
    for c in &controls {
        let what = c.what;
        let run = probe(&render, work.path(), &what.replace(' ', "-"), &kubelet, &|root| edit_line(&root.join(c.file), &c.from, &c.to));
        let found = problems(&run);
        assert!(!found.is_empty(), "{what}: the check passed a config the kubelet should not accept\n{}", tail(&run.log, 20));
        assert!(found.iter().any(|p| p.contains(&c.expect)), "{what}: reported, but not as {:?}:\n{}", c.expect, found.join("\n"));
        eprintln!("control, {what}: {}", found[0]);
    }
    eprintln!(
        "kubelet v{version}: binaries {:.1} s, render {:.1} s, accepted in {:.1} s, 4 controls {:.1} s; {:.1} s in all",
        built.as_secs_f64(),
        (rendered - built).as_secs_f64(),
        (accepted - rendered).as_secs_f64(),
        (started.elapsed() - accepted).as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}

const CONF: &str = "var/lib/kubelet/kubelet.conf";
const SYSCONFIG: &str = "etc/sysconfig/kubelet";

/// A negative control: the line of `file` (in the render) starting with `from` starts with `to`
/// instead, and [`problems`] must say `expect`.
struct Control {
    what: &'static str,
    file: &'static str,
    from: String,
    to: String,
    expect: String,
}

/// What one kubelet run came to.
#[derive(Debug)]
enum Outcome {
    /// It dialed the container runtime: its configuration was decoded and validated.
    DialedRuntime,
    Exited(ExitStatus),
    TimedOut,
}

#[derive(Debug)]
struct Run {
    outcome: Outcome,
    /// Its stdout and stderr.
    log: String,
}

/// What the kubelet's run says is wrong with its configuration: empty when it decoded
/// `kubelet.conf` strictly, took every flag, passed validation and went on to dial the runtime.
fn problems(run: &Run) -> Vec<String> {
    let mut out = Vec::new();
    let lines: Vec<&str> = run.log.lines().collect();
    let continued = |l: &str| l.starts_with('\t') || l.starts_with(' ');
    for (i, line) in lines.iter().enumerate() {
        if !continued(line) && (line.contains("Using lenient decoding") || line.contains("strict decoding error")) {
            // A multi-line error continues on indented lines.
            let more: Vec<&str> = lines[i + 1..].iter().take_while(|l| continued(l)).map(|l| l.trim()).collect();
            out.push(format!("kubelet.conf is not strictly valid (the kubelet went on without the offending keys): {} {}", line.trim(), more.join(" ")));
        }
    }
    let errors = || {
        let e: Vec<&str> = lines.iter().filter(|l| l.contains("command failed") || l.starts_with('E') || l.starts_with("Error:")).map(|l| l.trim()).collect();
        if e.is_empty() {
            tail(&run.log, 5)
        } else {
            e.join("\n")
        }
    };
    match &run.outcome {
        Outcome::DialedRuntime => {}
        Outcome::Exited(status) => out.push(format!("the kubelet exited ({status}) before it dialed the container runtime: {}", errors())),
        Outcome::TimedOut => out.push(format!("the kubelet did not dial the container runtime within {} s: {}", DIAL_TIMEOUT.as_secs(), errors())),
    }
    out
}

/// Start the kubelet on a copy of `render` (edited by `edit`), in its own namespaces and chroot,
/// until it dials the container runtime, exits, or [`DIAL_TIMEOUT`] passes; then kill it.
fn probe(render: &Path, work: &Path, name: &str, kubelet: &Path, edit: &dyn Fn(&Path)) -> Run {
    let root = work.join(format!("run-{name}"));
    copy_tree(render, &root);
    edit(&root);
    stand_ins(&root);
    let conf: Value = serde_yaml_ng::from_str(&read(&root.join(CONF))).unwrap_or(Value::Null);
    let args = daemon_args(&read(&root.join(SYSCONFIG)));

    // The runtime's socket, as the kubelet sees it from its chroot.
    let endpoint = conf.get("containerRuntimeEndpoint").and_then(Value::as_str).unwrap_or("unix:///run/containerd/containerd.sock");
    let socket = root.join(endpoint.trim_start_matches("unix://").trim_start_matches('/'));
    fs::create_dir_all(socket.parent().expect("socket dir")).expect("mkdir socket dir");
    let listener = UnixListener::bind(&socket).unwrap_or_else(|e| panic!("listening on {}: {e}", socket.display()));
    listener.set_nonblocking(true).expect("nonblocking");

    for dir in ["proc", "tmp"] {
        fs::create_dir_all(root.join(dir)).expect("mkdir");
    }
    fs::create_dir_all(root.join(KUBELET_IN_ROOT.trim_start_matches('/')).parent().expect("bin dir")).expect("mkdir bin");
    fs::write(root.join(KUBELET_IN_ROOT.trim_start_matches('/')), "").expect("the kubelet's mount point");
    let log_path = work.join(format!("kubelet-{name}.log"));
    let log = fs::File::create(&log_path).expect("log file");
    // unshare forks the kubelet as PID 1 of a new PID namespace and SIGKILLs it when unshare dies.
    let child = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--pid", "--net", "--fork", "--kill-child", "--", "sh", "-c"])
        .arg(r#"root=$1 kubelet=$2 inside=$3; shift 3; mount --bind "$kubelet" "$root$inside" && mount -t proc proc "$root/proc" && exec chroot "$root" "$inside" "$@""#)
        .arg("sh")
        .arg(&root)
        .arg(kubelet)
        .arg(KUBELET_IN_ROOT)
        .args(&args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("HOME", "/root")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("starting unshare");
    let mut guard = Namespace { unshare: child, kubelet: None };
    let deadline = Instant::now() + DIAL_TIMEOUT;
    let outcome = loop {
        guard.kubelet = guard.kubelet.or_else(|| namespace_init(guard.unshare.id()));
        if listener.accept().is_ok() {
            break Outcome::DialedRuntime;
        }
        if let Some(status) = guard.unshare.try_wait().expect("wait") {
            break Outcome::Exited(status);
        }
        if Instant::now() > deadline {
            break Outcome::TimedOut;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(guard);
    let mounts = read(Path::new("/proc/self/mountinfo"));
    assert!(!mounts.contains(&root.to_string_lossy().to_string()), "a mount of the kubelet's namespace is visible outside it");
    Run { outcome, log: read(&log_path) }
}

/// The kubelet's namespaces: killed on drop (unshare, and with it the kubelet), also when a test
/// assertion fails half-way.
struct Namespace {
    unshare: Child,
    /// The kubelet's PID, as seen from here.
    kubelet: Option<u32>,
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
        if let Some(pid) = self.kubelet {
            support::wait("the kubelet to die with its namespace", 10, || !keelson_local::cmd::alive(i64::from(pid)));
        }
    }
}

/// The process unshare forked (the kubelet, once it has exec'd).
fn namespace_init(unshare: u32) -> Option<u32> {
    read(Path::new(&format!("/proc/{unshare}/task/{unshare}/children"))).split_whitespace().next()?.parse().ok()
}

/// Files a node's other parts provide and the render does not: the client CA the spec names (a copy
/// of the cluster CA the render wrote) and the bootstrap kubeconfig (an API server on the kubelet's
/// own loopback, which nothing answers).
fn stand_ins(root: &Path) {
    let conf: Value = serde_yaml_ng::from_str(&read(&root.join(CONF))).unwrap_or(Value::Null);
    if let Some(ca) = conf.get("authentication").and_then(|a| a.get("x509")).and_then(|x| x.get("clientCAFile")).and_then(Value::as_str) {
        let path = root.join(ca.trim_start_matches('/'));
        if !path.exists() {
            fs::create_dir_all(path.parent().expect("ca dir")).expect("mkdir");
            fs::copy(root.join("srv/kubernetes/ca.crt"), &path).expect("the render wrote the cluster CA (/srv/kubernetes/ca.crt)");
        }
    }
    let args = daemon_args(&read(&root.join(SYSCONFIG)));
    let flag = |name: &str| args.iter().find_map(|a| a.strip_prefix(&format!("--{name}=")).map(str::to_string));
    if let Some(path) = flag("bootstrap-kubeconfig").or_else(|| flag("kubeconfig")) {
        let path = root.join(path.trim_start_matches('/'));
        if !path.exists() {
            fs::create_dir_all(path.parent().expect("kubeconfig dir")).expect("mkdir");
            let ca = base64_file(&root.join("srv/kubernetes/ca.crt"));
            fs::write(
                &path,
                format!(
                    "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority-data: {ca}\nusers:\n- name: kubelet\n  user:\n    token: abcdef.0123456789abcdef\ncontexts:\n- name: local\n  context:\n    cluster: local\n    user: kubelet\ncurrent-context: local\n"
                ),
            )
            .expect("writing the bootstrap kubeconfig");
        }
    }
}

fn base64_file(path: &Path) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

/// The kubelet's arguments from `/etc/sysconfig/kubelet`, as systemd passes them (`$DAEMON_ARGS`
/// split at whitespace).
fn daemon_args(sysconfig: &str) -> Vec<String> {
    let line = sysconfig.lines().find_map(|l| l.strip_prefix("DAEMON_ARGS=")).expect("DAEMON_ARGS in /etc/sysconfig/kubelet");
    line.trim_matches('"').split_whitespace().map(str::to_string).collect()
}

/// The fixture control-plane NodeupConfig at Kubernetes `version` with `fields` as its kubelet
/// section, rendered by `nodeup render` into `work/render`.
fn render(nodeup: &Path, work: &Path, version: &str, fields: &[KubeletField]) -> PathBuf {
    let fixture = read(&Path::new(NODEUP_FIXTURES).join("control-plane-eu-west-1a.yaml"));
    let at_version: String =
        fixture.lines().map(|l| if l.starts_with("KubernetesVersion:") { format!("KubernetesVersion: {version}\n") } else { format!("{l}\n") }).collect();
    assert!(at_version.contains(&format!("KubernetesVersion: {version}\n")), "the fixture has a KubernetesVersion");
    let nodeup_config = kubelet_fields::with_kubelet(&at_version, fields);
    // Nothing is downloaded by a render: the assets only need names and hashes.
    let assets = standard_assets(64).iter().map(|a| a.spec(&[format!("http://127.0.0.1:9/{}", a.path)])).collect();
    let boot = write_state(
        &work.join("state"),
        &nodeup_config,
        &read(&Path::new(NODEUP_FIXTURES).join("boot-control-plane-eu-west-1a.yaml")),
        assets,
        "control-plane",
    );
    let out = work.join("render");
    let o = Command::new(nodeup)
        .args(["render", "--conf"])
        .arg(&boot)
        .arg("--out")
        .arg(&out)
        .args(["--hostname", "ip-172-20-33-10.eu-west-1.compute.internal", "--internal-ip", "172.20.33.10", "--arch", "amd64"])
        .args(["--instance-id", "i-0a1b2c3d4e5f60718", "--zone", "eu-west-1a"])
        .env("NODEUP_LOG", "warn")
        .output()
        .expect("running nodeup render");
    assert!(o.status.success(), "nodeup render failed:\n{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    out
}

/// nodeup from this target directory, refused when a source it is built from is newer (a stale
/// binary would test an old renderer).
fn fresh_nodeup() -> PathBuf {
    let bin = keelson_local::mirror::bin_dir().join("nodeup");
    let built = fs::metadata(&bin)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| panic!("{}: {e}: build it (cargo test --workspace --all-targets, or add --test render to this command)", bin.display()));
    for dir in ["nodeup/src", "api/src", "base/src"] {
        if let Some((path, changed)) = newest(&support::repo().join(dir)) {
            assert!(
                changed <= built,
                "{} is older than {} (build it: cargo test --workspace --all-targets, or add --test render)",
                bin.display(),
                path.display()
            );
        }
    }
    bin
}

/// The most recently modified `.rs` file under `dir`.
fn newest(dir: &Path) -> Option<(PathBuf, SystemTime)> {
    let mut best: Option<(PathBuf, SystemTime)> = None;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                if let Ok(t) = e.metadata().and_then(|m| m.modified()) {
                    if best.as_ref().is_none_or(|(_, b)| t > *b) {
                        best = Some((p, t));
                    }
                }
            }
        }
    }
    best
}

/// The Kubernetes version keelson-local builds and runs (`examples/ha.yaml`, as `scripts/test`).
fn examples_kubernetes_version() -> String {
    let text = read(&support::repo().join("examples/ha.yaml"));
    text.lines()
        .find_map(|l| l.trim_start().strip_prefix("kubernetesVersion:"))
        .map(|v| v.trim().to_string())
        .expect("examples/ha.yaml has a kubernetesVersion")
}

/// A top-level `kubelet.conf` key the render sets from the table (renamed by a control).
fn renamed_key(fields: &[KubeletField]) -> &'static str {
    fields
        .iter()
        .find_map(|f| match keelson_api::support::KUBELET.iter().find(|k| k.key == f.key).map(|k| k.used) {
            Some(keelson_api::support::Use::KubeletConfig(path)) if !path.contains('.') => Some(path),
            _ => None,
        })
        .expect("a top-level kubelet.conf key")
}

/// Replace the one line of `path` that starts with `from` (a control must change something).
fn edit_line(path: &Path, from: &str, to: &str) {
    let text = read(path);
    let n = text.lines().filter(|l| l.starts_with(from)).count();
    assert_eq!(n, 1, "{}: {n} lines start with {from:?}", path.display());
    let out: String = text.lines().map(|l| if let Some(rest) = l.strip_prefix(from) { format!("{to}{rest}\n") } else { format!("{l}\n") }).collect();
    fs::write(path, out).expect("edit");
}

fn copy_tree(from: &Path, to: &Path) {
    let o = Command::new("cp").arg("-a").arg(from).arg(to).output().expect("cp");
    assert!(o.status.success(), "cp -a {} {}: {}", from.display(), to.display(), String::from_utf8_lossy(&o.stderr));
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_default()
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.contains("FLAG: --")).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[test]
fn problems_reads_the_kubelets_own_words() {
    let ok = Run { outcome: Outcome::DialedRuntime, log: "I1126 server.go:529] \"Kubelet version\" kubeletVersion=\"v1.34.4\"\n".into() };
    assert!(problems(&ok).is_empty());
    let lenient = Run {
        outcome: Outcome::DialedRuntime,
        log: "I1126 codec.go:102] \"Using lenient decoding as strict decoding failed\" err=<\n\tstrict decoding error: yaml: unmarshal errors:\n\t  line 36: key \"maxPods\" already set in map\n >\n".into(),
    };
    let p = problems(&lenient);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(p[0].contains("key \"maxPods\" already set"), "{p:?}");
    let stalled = Run { outcome: Outcome::TimedOut, log: "E1126 run.go:72] \"command failed\" err=\"x\"\n".into() };
    assert!(problems(&stalled)[0].contains("command failed"));
}
