//! `docs/nodeup-by-hand.md` runs as written: its shell block, with the doc's `/tmp/` moved into a
//! temporary directory and `target/debug/` into this build's directory (the `cargo build` line
//! is this test's own build: the binaries it names must be there already — `cargo test --workspace`
//! builds them). A flow a newcomer pastes must not fail.

mod common;

use std::path::Path;

/// The doc's first `sh` block, continuation lines joined.
fn shell_block(doc: &str) -> Vec<String> {
    let block = doc.split("```sh\n").nth(1).and_then(|b| b.split("\n```").next()).expect("docs/nodeup-by-hand.md has a ```sh block");
    block.replace("\\\n", " ").lines().map(str::to_string).filter(|l| !l.trim().is_empty()).collect()
}

#[test]
fn the_documented_flow_runs_verbatim() {
    let doc = std::fs::read_to_string(common::repo_root().join("docs/nodeup-by-hand.md")).expect("the doc");
    let lines = shell_block(&doc);
    assert!(lines.len() >= 4, "the block lost its commands: {lines:#?}");
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_keelson")).parent().expect("target dir").to_path_buf();
    let (build, rest) = lines.split_first().expect("lines");
    assert!(build.starts_with("cargo build"), "the flow starts by building: {build}");
    for bin in ["keelson", "nodeup"] {
        assert!(rest.iter().any(|l| l.starts_with(&format!("target/debug/{bin} "))), "the flow runs {bin}");
        assert!(build.contains(&format!("keelson-{}", if bin == "keelson" { "cli" } else { bin })), "{build} builds {bin}");
        assert!(bin_dir.join(bin).exists(), "{} is not built: cargo build -p keelson-cli -p keelson-nodeup", bin_dir.join(bin).display());
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let script = rest.join("\n").replace("/tmp/", &format!("{}/", tmp.path().display())).replace("target/debug/", &format!("{}/", bin_dir.display()));
    let out = std::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .current_dir(common::repo_root())
        .env_remove("KOPS_FEATURE_FLAGS")
        .env_remove("KOPS_BASE_URL")
        .env_remove("KEELSON_ASSET_HASHES")
        .output()
        .expect("bash");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the documented flow failed:\n{script}\n--- stdout\n{stdout}\n--- stderr\n{stderr}");
    // The plan is nodeup's dry run: it names the join and the kubelet, and wrote nothing.
    assert!(stdout.contains("kubelet"), "{stdout}");
    assert!(!tmp.path().join("node/etc/kubernetes").exists(), "a dry run writes nothing");
}
