//! One rule for `validate` and `apply`: every spec `keelson validate` accepts — the examples, kOps'
//! public cases, and what `keelson create cluster` writes — compiles, builds its cloud model (what
//! `apply` plans from) and renders structurally sound Terraform. A spec that passed `validate` and
//! then failed `apply` offline would be a second, hidden refusal table.

mod support;

use std::path::{Path, PathBuf};

use cloud_resources::terraform::{self, structural_problems};
use spec_compiler::new_cluster::{new_cluster, to_yaml, NewClusterOptions};

fn specs() -> Vec<(String, Vec<u8>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out = Vec::new();
    let mut examples: Vec<PathBuf> = std::fs::read_dir(root.join("examples")).expect("examples").filter_map(Result::ok).map(|e| e.path()).collect();
    examples.sort();
    for p in examples.into_iter().filter(|p| p.extension().is_some_and(|e| e == "yaml")) {
        out.push((p.display().to_string(), std::fs::read(&p).expect("example")));
    }
    let cases = std::env::var_os("KEELSON_CONFORMANCE_CASES").map(PathBuf::from).unwrap_or_else(|| root.join("../shared/conformance/cases"));
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&cases)
        .unwrap_or_else(|e| panic!("{}: {e} (set KEELSON_CONFORMANCE_CASES)", cases.display()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    dirs.sort();
    let n = dirs.len();
    assert!(n >= 46, "{}: {n} cases, expected at least kOps' 46 public ones", cases.display());
    for d in dirs {
        if let Ok(bytes) = std::fs::read(d.join("input.yaml")) {
            out.push((d.display().to_string(), bytes));
        }
    }
    for (cloud, zones, state) in [("aws", "us-east-1a,us-east-1b,us-east-1c", "s3://b"), ("gce", "europe-west1-b,europe-west1-c,europe-west1-d", "gs://b")] {
        for private in [false, true] {
            let o = NewClusterOptions {
                name: format!("{cloud}-{private}.example.com"),
                zones: zones.split(',').map(str::to_string).collect(),
                state: Some(state.into()),
                project: (cloud == "gce").then(|| "p".to_string()),
                topology: private.then(|| "private".to_string()),
                control_plane_count: Some(3),
                ..Default::default()
            };
            out.push((format!("create cluster {}", o.name), to_yaml(&new_cluster(&o).expect("new cluster")).into_bytes()));
        }
    }
    out
}

#[test]
fn what_validate_accepts_apply_can_build() {
    let options = support::options();
    let (mut accepted, mut failures) = (0, Vec::new());
    for (name, bytes) in specs() {
        let Ok(docs) = spec_compiler::load::load_bytes(Path::new(&name), &bytes) else { continue };
        if !keelson_api::support::not_rendered(&docs).is_empty() {
            continue;
        }
        accepted += 1;
        let compiled = match spec_compiler::compile(&docs, &options) {
            Ok(c) => c,
            Err(e) => {
                failures.push(format!("{name}: validate accepts it, compile fails: {e}"));
                continue;
            }
        };
        let model = match cloud_resources::model::build(&docs, &compiled) {
            Ok(m) => m,
            Err(e) => {
                failures.push(format!("{name}: validate accepts it, apply's model fails: {e}"));
                continue;
            }
        };
        match terraform::render(&model) {
            Ok(tree) => {
                let problems = structural_problems(&tree);
                if !problems.is_empty() {
                    failures.push(format!("{name}: Terraform unsound: {problems:?}"));
                }
            }
            Err(e) => failures.push(format!("{name}: validate accepts it, the Terraform target fails: {e}")),
        }
    }
    assert!(failures.is_empty(), "{} of {accepted} accepted specs fail later:\n{}", failures.len(), failures.join("\n"));
    assert!(accepted >= 30, "only {accepted} specs accepted: the inputs went missing?");
    eprintln!("{accepted} specs validate accepts all compile, build their cloud model and render Terraform");
}
