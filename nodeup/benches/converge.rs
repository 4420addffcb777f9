//! nodeup benchmark against a local mirror on 127.0.0.1.
//!
//! `cargo bench -p keelson-nodeup --bench converge [-- --pad-mb N --runs N]`; under `cargo test` it
//! runs once with small assets (a smoke test of the benchmark itself).
//!
//! Measures (a) a full converge of a fresh root (worker of examples/ha.yaml), (b) the lower
//! bound `curl | sha256sum | tar -x` of the same assets, all concurrently, in the same run,
//! (c) a no-op rerun; plus nodeup's peak RSS and stripped binary size.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use testkit::mirror::{sha256_hex, standard_assets, write_state, Mirror};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Run nodeup; return wall time and peak RSS (VmHWM, sampled from /proc while it runs).
fn run_nodeup(bin: &Path, boot: &Path, root: &Path) -> (Duration, u64) {
    let t = Instant::now();
    let mut child = Command::new(bin)
        .arg("--conf")
        .arg(boot)
        .arg("--root")
        .arg(root)
        .args(["--arch", "amd64", "--hostname", "bench-node", "--internal-ip", "10.0.0.10", "--retries", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn nodeup");
    let status = format!("/proc/{}/status", child.id());
    let mut peak_kb = 0u64;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        if let Ok(s) = std::fs::read_to_string(&status) {
            if let Some(kb) = s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()) {
                peak_kb = peak_kb.max(kb);
            }
        }
        if child.try_wait().expect("wait").is_some() || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let out = child.wait_with_output().expect("nodeup output");
    let elapsed = t.elapsed();
    assert!(out.status.success(), "nodeup failed: {}", String::from_utf8_lossy(&out.stderr));
    (elapsed, peak_kb)
}

fn main() {
    let benchmarking = std::env::args().any(|a| a == "--bench");
    let pad = if benchmarking { arg("--pad-mb", 16) << 20 } else { 1 << 20 };
    let runs = if benchmarking { arg("--runs", 3).clamp(1, 20) } else { 1 };
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_nodeup"));

    let mirror = Mirror::start();
    let assets = standard_assets(pad);
    let total: usize = assets.iter().map(|a| a.bytes.len()).sum();
    for a in &assets {
        mirror.put(&a.path, a.bytes.clone());
    }
    let work = tempfile::tempdir().expect("tempdir");
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ha");
    let read = |n: &str| std::fs::read_to_string(fixtures.join(n)).expect("fixture");
    let specs = assets.iter().map(|a| a.spec(&[mirror.url(&a.path)])).collect();
    let boot = write_state(work.path(), &read("nodes.yaml"), &read("boot-nodes.yaml"), specs, "node");
    println!("assets: {} files, {:.1} MiB total, served from {}", assets.len(), total as f64 / 1048576.0, mirror.url(""));

    let mut full = Vec::new();
    let mut lower = Vec::new();
    let mut noop = Vec::new();
    let mut peak = 0;
    for i in 0..runs {
        // (b) lower bound: every asset at once, hashed while streaming, archives unpacked.
        let lb_dir = work.path().join(format!("lb-{i}"));
        std::fs::create_dir_all(&lb_dir).expect("mkdir");
        let mut script = String::from("set -e\n");
        for (n, a) in assets.iter().enumerate() {
            let url = mirror.url(&a.path);
            let d = lb_dir.join(n.to_string());
            std::fs::create_dir_all(&d).expect("mkdir");
            if a.path.ends_with(".tar.gz") || a.path.ends_with(".tgz") {
                script.push_str(&format!("(curl -sf {url} | tee >(sha256sum > {d}/sum) | tar -xz -C {d}) &\n", d = d.display()));
            } else {
                script.push_str(&format!("(curl -sf {url} | tee {d}/file | sha256sum > {d}/sum) &\n", d = d.display()));
            }
        }
        script.push_str("wait\n");
        let t = Instant::now();
        let st = Command::new("bash").arg("-c").arg(&script).status().expect("bash (curl, sha256sum and tar are required)");
        lower.push(t.elapsed());
        assert!(st.success(), "lower-bound pipeline failed");
        for (n, a) in assets.iter().enumerate() {
            let sum = std::fs::read_to_string(lb_dir.join(n.to_string()).join("sum")).unwrap_or_default();
            assert!(sum.starts_with(&sha256_hex(&a.bytes)), "lower bound: hash of {} differs", a.path);
        }

        // (a) full converge of a fresh root (fresh cache).
        let root = work.path().join(format!("root-{i}"));
        std::fs::create_dir_all(&root).expect("mkdir");
        let (t, kb) = run_nodeup(&bin, &boot, &root);
        full.push(t);
        peak = peak.max(kb);
        // (c) no-op rerun on the converged root.
        for _ in 0..3 {
            noop.push(run_nodeup(&bin, &boot, &root).0);
        }
        let _ = std::fs::remove_dir_all(&lb_dir);
    }
    let (a, b, c) = (median(full), median(lower), median(noop));
    let stripped = work.path().join("nodeup.stripped");
    let size = Command::new("strip")
        .arg("-o")
        .arg(&stripped)
        .arg(&bin)
        .status()
        .ok()
        .filter(|s| s.success())
        .and_then(|_| std::fs::metadata(&stripped).ok())
        .map(|m| m.len());
    println!("(a) full converge, fresh root:        {:>8.1} ms (median of {runs})", a.as_secs_f64() * 1e3);
    println!("(b) curl | sha256sum | tar -x bound:  {:>8.1} ms (median of {runs})", b.as_secs_f64() * 1e3);
    println!("    ratio a/b:                        {:>8.2}   (goal <= 1.15)", a.as_secs_f64() / b.as_secs_f64());
    println!("(c) no-op rerun:                      {:>8.1} ms (median of {}; goal <= 50 ms)", c.as_secs_f64() * 1e3, runs * 3);
    println!("peak RSS of nodeup:                   {:>8.1} MiB", peak as f64 / 1024.0);
    match size {
        Some(s) => println!("stripped binary size:                 {:>8.1} MiB ({})", s as f64 / 1048576.0, bin.display()),
        None => println!("stripped binary size:                 unknown (strip from binutils is required)"),
    }
}
