//! `compile` reads no environment: the same input gives byte-identical output whatever the shell
//! exports (the binary turns `$KOPS_BASE_URL`, `$HOME`, `$XDG_CACHE_HOME` into options, and explicit
//! options win); and a control plane whose protokube is not known fails the compile instead of
//! booting a dead unit.

mod common;

fn compile_with_env(example: &str, env: &[(&str, &str)], extra: &[&str]) -> (std::process::Output, tempfile::TempDir) {
    let out = tempfile::tempdir().expect("tmp");
    let spec = common::example(example);
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_keelson"));
    cmd.args(["compile", "-f", spec.to_str().expect("path"), "--out", out.path().to_str().expect("path"), "--offline"])
        .args(extra)
        .env_remove("KOPS_FEATURE_FLAGS")
        .env_remove("KOPS_BASE_URL")
        .env_remove("KEELSON_ASSET_HASHES");
    for (k, v) in env {
        cmd.env(k, v);
    }
    (cmd.output().expect("run keelson"), out)
}

#[test]
fn hostile_environment_changes_nothing() {
    let assets = [
        "--nodeup-asset",
        common::NODEUP_AMD64,
        "--nodeup-asset",
        common::NODEUP_ARM64,
        "--protokube-asset",
        common::PROTOKUBE_AMD64,
        "--protokube-asset",
        common::PROTOKUBE_ARM64,
    ];
    let hostile = [("KOPS_BASE_URL", "http://junk.invalid/kops"), ("HOME", "/nonexistent/home"), ("XDG_CACHE_HOME", "/nonexistent/cache")];
    for example in ["minimal.yaml", "ha.yaml", "gce.yaml"] {
        let (clean, a) = compile_with_env(example, &[], &assets);
        let (dirty, b) = compile_with_env(example, &hostile, &assets);
        assert!(clean.status.success() && dirty.status.success(), "{example}: {}", String::from_utf8_lossy(&dirty.stderr));
        assert_eq!(common::read_tree(a.path()), common::read_tree(b.path()), "{example}: the environment changed the output");
    }
}

#[test]
fn control_plane_without_protokube_is_a_compile_error() {
    let (out, _dir) = compile_with_env("minimal.yaml", &[], &["--nodeup-asset", common::NODEUP_AMD64]);
    assert!(!out.status.success(), "compiled a control plane without protokube");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("InstanceGroup/control-plane-us-east-1a") && err.contains("--protokube-asset amd64="), "{err}");
    // The kOps-style base URL names it too (flag or $KOPS_BASE_URL); its hash must then be known.
    let hashes = tempfile::NamedTempFile::new().expect("tmp");
    let lines = ["amd64", "arm64"].map(|a| format!("https://kops.mirror.test/linux/{a}/protokube {}\n", "ab".repeat(32))).concat();
    std::fs::write(hashes.path(), lines).expect("write");
    let (out, dir) = compile_with_env(
        "minimal.yaml",
        &[("KOPS_BASE_URL", "https://kops.mirror.test")],
        &["--nodeup-asset", common::NODEUP_AMD64, "--asset-hashes", hashes.path().to_str().expect("path")],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let nodeup = std::fs::read_to_string(dir.path().join("nodeup/control-plane-us-east-1a.yaml")).expect("nodeup config");
    assert!(nodeup.contains(&format!("{}@https://kops.mirror.test/linux/amd64/protokube", "ab".repeat(32))), "{nodeup}");
    // Without user-data nothing boots, so nothing is required.
    let (out, _dir) = compile_with_env("minimal.yaml", &[], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
