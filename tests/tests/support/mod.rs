//! Shared by the end-to-end tests: root check, running the `keelson-local` binary, and a guard
//! that runs `keelson-local down` whatever happens.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

pub fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_keelson-local"))
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// This process's real user id, as `/proc/self/status` says.
fn uid() -> String {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
        .unwrap_or_default()
}

pub fn require_root() {
    let uid = uid();
    assert_eq!(uid, "0", "the local cloud needs root (network namespaces, loop devices, systemd-nspawn); run scripts/test as root");
    let py = keelson_local::moto::python();
    assert!(py.exists(), "moto is needed: {} is missing (scripts/test creates the venv; or set KEELSON_PYTHON)", py.display());
}

/// Runs `keelson-local down` on drop and checks nothing is left behind.
pub struct Down;

impl Drop for Down {
    fn drop(&mut self) {
        let out = Command::new(exe()).arg("down").output();
        if let Ok(o) = out {
            eprintln!("keelson-local down: {}", String::from_utf8_lossy(&o.stdout).trim());
        }
    }
}

/// [`run`] with extra environment variables (the machines inherit the test-only ones).
pub fn run_with_env(env: &[(&str, &str)], args: &[&str]) -> Output {
    let out = Command::new(exe()).args(args).envs(env.iter().copied()).current_dir(repo()).output().expect("run keelson-local");
    eprintln!(
        "$ {} keelson-local {}\n{}{}",
        env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" "),
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr).lines().filter(|l| !l.contains("Failed to kill control group")).collect::<Vec<_>>().join("\n")
    );
    out
}

/// `keelson-local ARGS` started in the background, its output going to `log` (read it once it
/// has exited: [`Background::finish`]).
pub struct Background {
    child: std::process::Child,
    log: PathBuf,
    args: String,
}

impl Background {
    pub fn start(args: &[&str], log: PathBuf) -> Background {
        let f = std::fs::File::create(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        let f2 = f.try_clone().expect("log file");
        let child = Command::new(exe()).args(args).current_dir(repo()).stdout(f).stderr(f2).spawn().expect("run keelson-local");
        Background { child, log, args: args.join(" ") }
    }

    /// Wait (at most `limit`; killed after) and return its exit status's success and its output,
    /// echoed.
    pub fn finish(&mut self, limit: std::time::Duration) -> (bool, String) {
        let deadline = std::time::Instant::now() + limit;
        let status = loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                break Some(st);
            }
            if std::time::Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break None;
            }
            std::thread::sleep(std::time::Duration::from_secs(2));
        };
        let out = std::fs::read_to_string(&self.log).unwrap_or_default();
        eprintln!("$ keelson-local {} (in the background; {status:?})\n{out}", self.args);
        assert!(status.is_some(), "keelson-local {} still running after {limit:?}: killed", self.args);
        (status.is_some_and(|s| s.success()), out)
    }
}

impl Drop for Background {
    /// A test that fails before [`Background::finish`] leaves nothing running.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `(passed, failed, the line)` from `keelson-local conformance`'s summary line in `output`
/// (`conformance: P passed, F failed, S skipped of T [Conformance] tests (…)`).
pub fn conformance_counts(output: &str) -> (usize, usize, &str) {
    let line = output
        .lines()
        .find(|l| l.starts_with("conformance: ") && l.contains(" [Conformance] tests ("))
        .unwrap_or_else(|| panic!("no conformance summary line (output above)"));
    let counts: Vec<usize> = line
        .trim_start_matches("conformance: ")
        .split(", ")
        .take(3)
        .map(|part| part.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("unexpected summary {line:?}")))
        .collect();
    (counts[0], counts[1], line)
}

/// Run `keelson-local ARGS`, echoing its output (so a failing test shows why).
pub fn run(args: &[&str]) -> Output {
    let out = Command::new(exe()).args(args).current_dir(repo()).output().expect("run keelson-local");
    eprintln!(
        "$ keelson-local {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr).lines().filter(|l| !l.contains("Failed to kill control group")).collect::<Vec<_>>().join("\n")
    );
    out
}

/// The IAM oracle's verdict in `output` (`keelson-local iam-check`, or selfheal's `selfheal: IAM
/// oracle: …` lines): it checked requests signed by the control planes' and the nodes' roles and
/// every one was allowed by the policies IAM holds for them.
pub fn assert_iam_clean(output: &str) {
    let line = output.lines().find(|l| l.contains("IAM oracle: ")).unwrap_or_else(|| panic!("no IAM oracle line in the output (above)"));
    // `…, D denied, U unmapped, C cut off before their body arrived` (cut-off requests were never
    // served: reported, not failed).
    assert!(line.contains(" 0 denied, 0 unmapped, "), "the IAM oracle found calls the instance roles' policies do not allow (output above): {line}");
    assert!(line.contains("(0 STS would refuse)"), "a service account got credentials real STS would have refused (output above): {line}");
    assert!(!line.contains("IAM oracle: 0 of"), "the IAM oracle checked no request of an instance role: {line}");
    // The checked roles, in the parentheses: `role=count` each.
    let roles: Vec<&str> = line.split_once(" roles (").and_then(|(_, r)| r.split_once(')')).map(|(r, _)| r.split(' ').collect()).unwrap_or_default();
    assert!(
        roles.iter().any(|r| r.starts_with("masters.")) && roles.iter().any(|r| r.starts_with("nodes.")),
        "requests of the control-plane and node roles checked: {line}"
    );
}

/// After `down`: no namespaces, links, loop devices, mounts or processes of the local cloud.
pub fn assert_nothing_left() {
    let ns = keelson_local::net::our_namespaces();
    assert!(ns.is_empty(), "namespaces left behind: {ns:?}");
    let links = keelson_local::net::our_links();
    assert!(links.iter().all(|l| !l.starts_with("klv") && l != "klbr0"), "links left behind: {links:?}");
    let state = keelson_local::paths::state_dir();
    let loops = keelson_local::volumes::loops_under(&state);
    assert!(loops.is_empty(), "loop devices left behind: {loops:?}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    assert!(!mounts.contains(&state.to_string_lossy().to_string()), "mounts left under {}", state.display());
    assert!(!state.exists(), "state directory {} left behind", state.display());
}

/// Run the product's `keelson ARGS` in the environment `keelson-local env` prints (as an operator
/// would after `eval "$(keelson-local env)"`), echoing its output.
pub fn keelson_in_local_env(args: &[&str]) -> Output {
    let env = Command::new(exe()).arg("env").output().expect("keelson-local env");
    assert!(env.status.success(), "keelson-local env failed");
    let keelson = keelson_local::mirror::bin_dir().join("keelson");
    let out = Command::new("sh")
        .arg("-c")
        .arg(r#"eval "$1"; shift; exec "$@""#)
        .arg("sh")
        .arg(String::from_utf8_lossy(&env.stdout).to_string())
        .arg(&keelson)
        .args(args)
        .current_dir(repo())
        .output()
        .expect("run keelson");
    eprintln!("$ keelson {}\n{}{}", args.join(" "), String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    out
}

/// [`keelson_in_local_env`] that must succeed; its standard output.
pub fn keelson_ok(args: &[&str]) -> String {
    let out = keelson_in_local_env(args);
    assert!(out.status.success(), "keelson {} failed (output above)", args.join(" "));
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// SDK configuration for a moto server at `endpoint` (region eu-west-1, static test credentials).
pub async fn moto_sdk(endpoint: &str) -> aws_config::SdkConfig {
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        .http_client(aws_smithy_http_client::Builder::new().build_http())
        .region(aws_config::Region::new("eu-west-1"))
        .endpoint_url(endpoint)
        .credentials_provider(aws_sdk_ec2::config::Credentials::new("k", "s", None, None, "test"))
        .load()
        .await
}

/// What a machine test needs: root, and systemd-nspawn.
pub fn require_machine_root() {
    let uid = uid();
    assert_eq!(uid, "0", "this test needs root (network namespaces, loop devices, systemd-nspawn); run scripts/test as root");
    assert!(keelson_local::cmd::which("systemd-nspawn").is_some(), "systemd-nspawn is missing: apt-get install systemd-container (scripts/test does)");
}

/// What a test that runs a process in its own namespaces and chroot needs: root, and `unshare`.
pub fn require_namespace_root() {
    assert_eq!(uid(), "0", "this test needs root (mount, PID and network namespaces, chroot); run scripts/test as root");
    assert!(keelson_local::cmd::which("unshare").is_some(), "unshare is missing: apt-get install util-linux (scripts/test does)");
}

/// A machine test's leftovers, torn down even when an assertion fails: the machine, a volume's
/// backing file, the bridge and the test's directory.
pub struct MachineGuard {
    pub machine: Option<keelson_local::machine::Machine>,
    pub dir: PathBuf,
    pub backing: Option<PathBuf>,
    pub bridge: &'static str,
}

impl Drop for MachineGuard {
    fn drop(&mut self) {
        if let Some(m) = self.machine.as_mut() {
            m.stop();
        }
        if let Some(b) = &self.backing {
            keelson_local::volumes::destroy_backing(b);
        }
        keelson_local::net::delete_bridge(self.bridge);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Poll `f` every 200 ms until it holds; fail after `secs`.
pub fn wait(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while !f() {
        assert!(std::time::Instant::now() < deadline, "timed out after {secs} s waiting for {what}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// Why a pod is where it is, for a failure message: its conditions, its containers' states and the
/// events about it (`kubectl describe`'s tail, where the scheduler, the kubelet and the CNI say why).
pub fn pod_story(pod: &str) -> String {
    let o = run(&["kubectl", "describe", "pod", pod]);
    let text = String::from_utf8_lossy(&o.stdout);
    let from = text.find("Conditions:").unwrap_or(0);
    format!("kubectl describe pod {pod} (from its conditions):\n{}", &text[from..])
}

/// A pod on `client_node` reaches a pod on `server_node` by its pod IP (the pod network across
/// nodes: the CNI, and on routed networking the cloud's routes). Both pods are deleted after.
pub fn pod_to_pod(registry: &str, server_node: &str, client_node: &str) {
    use std::time::{Duration, Instant};
    let echo = format!("{registry}/keelson-test/echo:1");
    let on = |node: &str| format!("--overrides={{\"apiVersion\":\"v1\",\"spec\":{{\"nodeName\":\"{node}\"}}}}");
    // A previous call's pods are deleted without waiting: their names are free again first.
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let o = run(&["kubectl", "get", "pod", "echo-server", "echo-client", "--ignore-not-found", "-o", "name"]);
        if o.status.success() && o.stdout.iter().all(u8::is_ascii_whitespace) {
            break;
        }
        assert!(Instant::now() < deadline, "the previous echo-server and echo-client pods are still there after 180 s");
        std::thread::sleep(Duration::from_secs(2));
    }
    let server = run(&["kubectl", "run", "echo-server", &format!("--image={echo}"), "--restart=Never", &on(server_node), "--", "serve", ":8080"]);
    assert!(server.status.success());
    let deadline = Instant::now() + Duration::from_secs(120);
    let server_ip = loop {
        let o = run(&["kubectl", "get", "pod", "echo-server", "-o", "jsonpath={.status.phase} {.status.podIP}"]);
        let text = String::from_utf8_lossy(&o.stdout).to_string();
        if let Some(ip) = text.strip_prefix("Running ").filter(|ip| !ip.trim().is_empty()) {
            break ip.trim().to_string();
        }
        if text.starts_with("Failed") {
            let why = run(&["kubectl", "get", "pod", "echo-server", "-o", "jsonpath={.status.message}"]);
            panic!("echo-server failed: {} ({})", String::from_utf8_lossy(&why.stdout).trim(), keelson_local::disk::report(&keelson_local::paths::state_dir()));
        }
        if Instant::now() >= deadline {
            panic!("echo-server not Running within 120 s: {text}\n{}", pod_story("echo-server"));
        }
        std::thread::sleep(Duration::from_secs(2));
    };
    let client = run(&[
        "kubectl",
        "run",
        "echo-client",
        &format!("--image={echo}"),
        "--restart=Never",
        &on(client_node),
        "--",
        "get",
        &format!("http://{server_ip}:8080/"),
    ]);
    assert!(client.status.success());
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let o = run(&["kubectl", "get", "pod", "echo-client", "-o", "jsonpath={.status.phase}"]);
        let phase = String::from_utf8_lossy(&o.stdout).trim().to_string();
        if phase == "Succeeded" || phase == "Failed" {
            let logs = run(&["kubectl", "logs", "echo-client"]);
            let text = String::from_utf8_lossy(&logs.stdout).to_string();
            assert!(
                phase == "Succeeded" && text.contains("echo-server"),
                "pod on {} could not reach the pod on {} ({server_ip}): {phase}: {text}",
                client_node,
                server_node
            );
            break;
        }
        if Instant::now() >= deadline {
            panic!("echo-client did not finish within 120 s: {phase}\n{}", pod_story("echo-client"));
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    for p in ["echo-client", "echo-server"] {
        let _ = run(&["kubectl", "delete", "pod", p, "--wait=false"]);
    }
}

/// `keelson validate cluster` (the product's, against the local cloud and the real API) on the local
/// spec, waiting up to `wait`: it succeeds with no failure and `nodes` Nodes.
pub fn validate_green(wait: &str, nodes: usize) {
    let local_spec = keelson_local::paths::State::new(keelson_local::paths::state_dir()).root.join("spec.yaml");
    let v = keelson_in_local_env(&["validate", "cluster", "-f", &local_spec.to_string_lossy(), "--wait", wait, "-o", "json"]);
    assert!(v.status.success(), "keelson validate cluster failed (output above)");
    let report: serde_json::Value = serde_json::from_slice(&v.stdout).expect("validate -o json prints JSON");
    assert_eq!(report["failures"].as_array().map(Vec::len), Some(0), "{report}");
    assert_eq!(report["nodes"].as_array().map(Vec::len), Some(nodes), "{report}");
}
