//! Helpers shared by the `keelson` command's integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Output;

#[allow(unused_imports)]
pub use testkit::golden::read_tree;

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn example(name: &str) -> PathBuf {
    repo_root().join("examples").join(name)
}

/// Run the real `keelson` binary.
pub fn keelson(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_keelson")).args(args).env_remove("KOPS_FEATURE_FLAGS").output().expect("run keelson")
}

/// A fixed nodeup build for tests that need user-data.
pub const NODEUP_AMD64: &str =
    "amd64=8b1a9953c4611296a827abf8c47804d7e6c49c6b8f0b8c1f4ee3a5e6a1b1c2d3@https://nodeup.mirror.test/amd64/nodeup,https://backup.mirror.test/amd64/nodeup";
pub const NODEUP_ARM64: &str = "arm64=0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0@https://nodeup.mirror.test/arm64/nodeup";
/// A fixed protokube build for the control planes those boot.
pub const PROTOKUBE_AMD64: &str = "amd64=5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8@https://nodeup.mirror.test/amd64/protokube";
pub const PROTOKUBE_ARM64: &str = "arm64=6b86b273ff34fce19d6b804eff5a3f5747ada4eaa22f1d49c01e52ddb7875b4b@https://nodeup.mirror.test/arm64/protokube";
