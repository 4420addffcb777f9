//! Shared helpers for nodeup's integration tests: run the real binary against a root dir.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use testkit::mirror::{standard_assets, write_state, FakeAsset, Mirror};

pub const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/ha");

pub fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!("{FIXTURES}/{name}")).expect("fixture")
}

/// A prepared scenario: mirror with assets, state store, BootConfig, empty root.
pub struct Scenario {
    pub dir: tempfile::TempDir,
    pub mirror: Mirror,
    pub assets: Vec<FakeAsset>,
    pub boot: PathBuf,
    pub root: PathBuf,
}

pub enum Group {
    Worker,
    ControlPlane,
}

impl Scenario {
    /// `urls(asset) -> list of URLs` lets a test add failing mirrors in front.
    pub fn new(group: Group, pad: usize, urls: impl Fn(&Mirror, &FakeAsset) -> Vec<String>) -> Scenario {
        Scenario::edited(group, pad, urls, |c| c)
    }

    /// [`Scenario::new`] with the fixture NodeupConfig's text edited first.
    pub fn edited(group: Group, pad: usize, urls: impl Fn(&Mirror, &FakeAsset) -> Vec<String>, edit: impl Fn(String) -> String) -> Scenario {
        let dir = tempfile::tempdir().expect("tempdir");
        let mirror = Mirror::start();
        let assets = standard_assets(pad);
        for a in &assets {
            mirror.put(&a.path, a.bytes.clone());
        }
        let specs = assets.iter().map(|a| a.spec(&urls(&mirror, a))).collect();
        let (cfg, boot, role) = match group {
            Group::Worker => ("nodes.yaml", "boot-nodes.yaml", "node"),
            Group::ControlPlane => ("control-plane-eu-west-1a.yaml", "boot-control-plane-eu-west-1a.yaml", "control-plane"),
        };
        let boot = write_state(dir.path(), &edit(fixture(cfg)), &fixture(boot), specs, role);
        let root = dir.path().join("root");
        std::fs::create_dir(&root).expect("mkdir root");
        Scenario { dir, mirror, assets, boot, root }
    }

    pub fn command(&self, extra: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_nodeup"));
        c.arg("--conf")
            .arg(&self.boot)
            .arg("--root")
            .arg(&self.root)
            .args(["--hostname", "ip-172-20-33-10.eu-west-1.compute.internal", "--internal-ip", "172.20.33.10", "--arch", "amd64"])
            // One run: a failure is the test's to judge (nodeup reruns forever by default, as kOps').
            .args(["--http-timeout", "2", "--retry-backoff-ms", "50", "--retries", "0"])
            .args(extra)
            .env("NODEUP_LOG", "warn")
            .env_remove("http_proxy")
            .env_remove("https_proxy")
            .env_remove("HTTP_PROXY")
            .env_remove("HTTPS_PROXY")
            .env_remove("ALL_PROXY");
        c
    }

    pub fn run(&self, extra: &[&str]) -> Output {
        self.command(extra).output().expect("run nodeup")
    }

    pub fn path(&self, abs: &str) -> PathBuf {
        self.root.join(abs.trim_start_matches('/'))
    }
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn last_line(o: &Output) -> String {
    stdout(o).lines().last().unwrap_or_default().to_string()
}

#[track_caller]
pub fn assert_ok(o: &Output) {
    assert!(o.status.success(), "nodeup failed ({}):\nstdout:\n{}\nstderr:\n{}", o.status, stdout(o), stderr(o));
}

pub fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).permissions().mode() & 0o7777
}

/// Every file (not dir) under `root`, relative path → bytes (symlinks → "-> target").
pub fn tree(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    let mut guard = 0;
    while let Some(d) = stack.pop() {
        guard += 1;
        assert!(guard < 100_000, "tree walk bounded");
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            let rel = p.strip_prefix(root).expect("under root").to_string_lossy().into_owned();
            let ft = e.file_type().expect("file type");
            if ft.is_symlink() {
                out.insert(rel, format!("-> {}", std::fs::read_link(&p).expect("readlink").display()).into_bytes());
            } else if ft.is_dir() {
                stack.push(p);
            } else {
                out.insert(rel, std::fs::read(&p).unwrap_or_default());
            }
        }
    }
    out
}
