//! Benchmark: compile a generated spec with 200 instance groups.
//! Run with `cargo bench -p keelson-spec-compiler --bench compile_200_groups`.
//!
//! Prints the median of several runs for the full compile (parse, validate, complete, render
//! every NodeupConfig, BootConfig and user-data) next to a lower bound measured in the same run:
//! parsing the input into generic YAML values and printing the same number of output bytes.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use spec_compiler::load::load_bytes;
use spec_compiler::userdata::NodeupAsset;
use spec_compiler::versions::Arch;
use spec_compiler::CompileOptions;

const GROUPS: usize = 200;
const RUNS: usize = 15;

fn generated_spec() -> String {
    let zones = ["us-east-1a", "us-east-1b", "us-east-1c"];
    let name = "bench.k8s.example.com";
    let mut s = format!(
        "apiVersion: kops.k8s.io/v1alpha2\nkind: Cluster\nmetadata:\n  name: {name}\nspec:\n  cloudProvider: aws\n  configBase: s3://bench-state/{name}\n  kubernetesVersion: 1.35.7\n  networkCIDR: 172.20.0.0/16\n  nonMasqueradeCIDR: 100.64.0.0/10\n  networking:\n    cni: {{}}\n  kubelet:\n    anonymousAuth: false\n  subnets:\n"
    );
    for (i, z) in zones.iter().enumerate() {
        s += &format!("  - name: {z}\n    zone: {z}\n    cidr: 172.20.{}.0/19\n    type: Public\n", 32 * (i + 1));
    }
    s += "  etcdClusters:\n";
    for cluster in ["main", "events"] {
        s += &format!("  - name: {cluster}\n    etcdMembers:\n");
        for z in zones {
            s += &format!("    - name: {}\n      instanceGroup: control-plane-{z}\n", &z[z.len() - 1..]);
        }
    }
    for i in 0..GROUPS {
        let z = zones[i % 3];
        let (name, role) = if i < 3 { (format!("control-plane-{z}"), "Master") } else { (format!("nodes-{i:03}"), "Node") };
        s += &format!(
            "---\napiVersion: kops.k8s.io/v1alpha2\nkind: InstanceGroup\nmetadata:\n  name: {name}\n  labels:\n    kops.k8s.io/cluster: bench.k8s.example.com\nspec:\n  role: {role}\n  machineType: m6i.large\n  minSize: 1\n  maxSize: 3\n  nodeLabels:\n    pool: p{i}\n  subnets:\n  - {z}\n"
        );
    }
    s
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let spec = generated_spec();
    let mut nodeup_assets = BTreeMap::new();
    nodeup_assets.insert(Arch::Amd64, NodeupAsset { sha256: "0".repeat(64), urls: vec!["https://mirror.example.com/nodeup".to_string()] });
    let protokube_assets =
        BTreeMap::from([(Arch::Amd64, NodeupAsset { sha256: "1".repeat(64), urls: vec!["https://mirror.example.com/protokube".to_string()] })]);
    let options = CompileOptions { nodeup_assets, protokube_assets, ..Default::default() };

    let mut full = Vec::new();
    let mut out_bytes = 0usize;
    for _ in 0..RUNS {
        let start = Instant::now();
        let docs = load_bytes(Path::new("bench.yaml"), spec.as_bytes()).expect("generated spec is valid");
        let compiled = spec_compiler::compile(&docs, &options).expect("compiles");
        out_bytes = compiled.tree.files.values().map(Vec::len).sum();
        full.push(start.elapsed());
        std::hint::black_box(compiled);
    }

    let mut bound = Vec::new();
    let filler = "x: y\n".repeat(out_bytes / 5);
    for _ in 0..RUNS {
        let start = Instant::now();
        let mut docs = Vec::new();
        for d in serde_yaml_ng::Deserializer::from_str(&spec) {
            let v: serde_yaml_ng::Value = serde::Deserialize::deserialize(d).expect("yaml");
            docs.push(v);
        }
        let text: String = std::hint::black_box(filler.clone());
        std::hint::black_box((docs, text));
        bound.push(start.elapsed());
    }

    let (f, b) = (median(full), median(bound));
    println!("compile_200_groups: {GROUPS} instance groups, {} input bytes, {out_bytes} output bytes", spec.len());
    println!("compile_200_groups: full compile median {:.2} ms over {RUNS} runs", f.as_secs_f64() * 1e3);
    println!("compile_200_groups: lower bound (YAML parse + output bytes) median {:.2} ms", b.as_secs_f64() * 1e3);
    println!("compile_200_groups: ratio {:.1}x", f.as_secs_f64() / b.as_secs_f64().max(1e-9));
}
