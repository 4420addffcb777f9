//! Helpers shared by the spec-compiler integration tests (the library, as `keelson compile` calls it).
#![allow(dead_code, unused_imports)]

use std::path::{Path, PathBuf};

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn example(name: &str) -> PathBuf {
    repo_root().join("examples").join(name)
}

pub fn conformance_cases() -> PathBuf {
    let dir = std::env::var_os("KEELSON_CONFORMANCE_CASES").map(PathBuf::from).unwrap_or_else(|| repo_root().join("../shared/conformance/cases"));
    assert!(dir.is_dir(), "these tests need the shared conformance cases at {} (set KEELSON_CONFORMANCE_CASES)", dir.display());
    dir
}

/// A fixed nodeup build for tests that need user-data.
pub const NODEUP_AMD64: &str =
    "amd64=8b1a9953c4611296a827abf8c47804d7e6c49c6b8f0b8c1f4ee3a5e6a1b1c2d3@https://nodeup.mirror.test/amd64/nodeup,https://backup.mirror.test/amd64/nodeup";
pub const NODEUP_ARM64: &str = "arm64=0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0@https://nodeup.mirror.test/arm64/nodeup";
/// A fixed protokube build for the control planes those boot.
pub const PROTOKUBE_AMD64: &str = "amd64=5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8@https://nodeup.mirror.test/amd64/protokube";
pub const PROTOKUBE_ARM64: &str = "arm64=6b86b273ff34fce19d6b804eff5a3f5747ada4eaa22f1d49c01e52ddb7875b4b@https://nodeup.mirror.test/arm64/protokube";

/// The options `keelson compile --offline` gets with the test nodeup and protokube builds.
pub fn options() -> spec_compiler::CompileOptions {
    let assets = |items: &[&str]| {
        items
            .iter()
            .map(|i| {
                let (arch, asset) = i.split_once('=').expect("ARCH=ASSET");
                (spec_compiler::versions::Arch::parse(arch).expect("arch"), spec_compiler::userdata::NodeupAsset::parse(asset).expect("asset"))
            })
            .collect()
    };
    spec_compiler::CompileOptions {
        nodeup_assets: assets(&[NODEUP_AMD64, NODEUP_ARM64]),
        protokube_assets: assets(&[PROTOKUBE_AMD64, PROTOKUBE_ARM64]),
        // The account a spec with `useServiceAccountExternalPermissions` names its addons' roles in.
        aws_account: Some("123456789012".into()),
        ..Default::default()
    }
}

/// Compile a spec file (as `keelson compile --offline` with the test builds) into a fresh temp dir.
pub fn compile(spec: &Path) -> tempfile::TempDir {
    let docs = spec_compiler::load::load_spec(spec).unwrap_or_else(|e| panic!("{}: {e}", spec.display()));
    let compiled = spec_compiler::compile(&docs, &options()).unwrap_or_else(|e| panic!("{}: {e}", spec.display()));
    let out = tempfile::tempdir().expect("tempdir");
    compiled.tree.write_to(out.path()).expect("write the tree");
    out
}

pub use testkit::golden::read_tree;
