//! Fuzz targets of the compiler's inputs (docs/fuzzing.md): the spec file through load, validate
//! and compile; the `--asset-hashes` file; the protokube config the compiler writes and protokube
//! reads back. Each runs `KEELSON_FUZZ_CASES` inputs (a small default, so `cargo test` stays fast);
//! a panic fails the test with the shrunk input. Crashes found are regression tests in
//! `tests/fuzz_regressions.rs`.

mod common;

use std::path::Path;

use keelson_api::protokube::ProtokubeConfig;
use spec_compiler::load::load_bytes;
use spec_compiler::versions::parse_asset_hashes;
use testkit::fuzz;

/// A plain `cargo test`'s count: seconds on a debug build (a spec that compiles takes ~10 ms).
const CI_CASES: u32 = 200;

/// Every example and conformance input: the seeds of the spec targets.
fn spec_seeds() -> Vec<Vec<u8>> {
    let mut seeds = fuzz::files(&common::repo_root().join("examples"), ".yaml");
    let mut cases: Vec<_> =
        std::fs::read_dir(common::conformance_cases()).expect("cases").filter_map(Result::ok).map(|e| e.path().join("input.yaml")).collect();
    cases.sort();
    seeds.extend(cases.iter().filter_map(|p| std::fs::read(p).ok()));
    assert!(seeds.len() >= 50, "only {} spec seeds (the examples and 46+ conformance inputs)", seeds.len());
    seeds
}

/// A spec, as `keelson compile` takes it: parse, validate, compile with nodeup and protokube
/// builds (so user-data is rendered too).
#[test]
fn spec_load_validate_compile() {
    let options = common::options();
    fuzz::run("spec", spec_seeds(), fuzz::cases(CI_CASES), |b| {
        let docs = match load_bytes(Path::new("fuzz.yaml"), b) {
            Ok(d) => d,
            Err(e) if e.is_unreadable() => return "not a spec",
            Err(_) => return "invalid",
        };
        match spec_compiler::compile(&docs, &options) {
            Ok(_) => "compiled",
            Err(_) => "compile refused",
        }
    });
}

/// An `--asset-hashes` file (`<url> <sha256>` lines).
#[test]
fn asset_hashes_file() {
    let seeds = vec![
        include_bytes!("../src/versions/hashes.tsv").to_vec(),
        b"# mirror\nhttps://files.example/k8s/kubelet 8b1a9953c4611296a827abf8c47804d7e6c49c6b8f0b8c1f4ee3a5e6a1b1c2d3\n".to_vec(),
    ];
    fuzz::run("asset-hashes", seeds, fuzz::cases(CI_CASES), |b| match parse_asset_hashes(&String::from_utf8_lossy(b)) {
        Ok(_) => "parsed",
        Err(_) => "refused",
    });
}

/// The protokube config of each control-plane group (`ProtokubeConfig::parse`, which protokube's
/// `parse_plan` runs on what it reads from the state store).
#[test]
fn protokube_config() {
    let mut seeds = Vec::new();
    for example in ["ha.yaml", "gce.yaml", "gossip.yaml"] {
        let docs = spec_compiler::load::load_spec(&common::example(example)).expect("example");
        let compiled = spec_compiler::compile(&docs, &common::options()).expect("compiles");
        for (group, g) in &compiled.groups {
            if g.protokube.is_some() {
                let rel = format!("state/{}", keelson_api::protokube::state_key(group));
                seeds.push(compiled.tree.files[&rel].clone());
            }
        }
    }
    assert!(!seeds.is_empty(), "no control plane in the examples");
    fuzz::run("protokube-config", seeds, fuzz::cases(CI_CASES), |b| match ProtokubeConfig::parse(b) {
        Ok(_) => "parsed",
        Err(_) => "refused",
    });
}
