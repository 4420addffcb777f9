//! Invariants of compilation: deterministic output, user values always survive, and no input
//! (arbitrary bytes, or a mutated valid spec) makes the compiler panic.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use proptest::prelude::*;
use spec_compiler::load::load_bytes;
use spec_compiler::CompileOptions;

fn offline() -> CompileOptions {
    CompileOptions::default()
}

/// Leaves of a JSON value: `a.b[0].c` → value.
fn leaves(prefix: &str, v: &serde_json::Value, out: &mut BTreeMap<String, serde_json::Value>) {
    match v {
        serde_json::Value::Object(m) if !m.is_empty() => {
            for (k, x) in m {
                leaves(&format!("{prefix}.{k}"), x, out);
            }
        }
        serde_json::Value::Array(a) if !a.is_empty() => {
            for (i, x) in a.iter().enumerate() {
                leaves(&format!("{prefix}[{i}]"), x, out);
            }
        }
        other => {
            out.insert(prefix.to_string(), other.clone());
        }
    }
}

/// Fields kOps itself drops from an etcd cluster (they belong on members); documented in the api crate.
fn dropped_by_design(path: &str) -> bool {
    path.trim_start_matches('.').starts_with("spec.etcdClusters[")
        && ["volumeIops", "volumeSize", "volumeThroughput", "type"].iter().any(|f| path.ends_with(&format!("].{f}")))
}

fn assert_user_values_survive(label: &str, bytes: &[u8]) {
    let docs = load_bytes(Path::new(label), bytes).unwrap_or_else(|e| panic!("{label}: {:?}", e.lines()));
    let completed = spec_compiler::complete::complete(&docs, &offline()).unwrap_or_else(|e| panic!("{label}: {e}"));
    let mut before = BTreeMap::new();
    leaves("", &serde_json::to_value(&docs.cluster).expect("json"), &mut before);
    let mut after = BTreeMap::new();
    leaves("", &serde_json::to_value(&completed).expect("json"), &mut after);
    for (path, value) in before {
        if dropped_by_design(&path) {
            continue;
        }
        let empty_collection = value.as_object().is_some_and(|m| m.is_empty()) || value.as_array().is_some_and(|a| a.is_empty());
        if empty_collection && after.get(&path) != Some(&value) {
            // An empty section the user wrote may be filled in; it must still be there.
            let filled = after.keys().any(|k| k.starts_with(&format!("{path}.")) || k.starts_with(&format!("{path}[")));
            assert!(filled, "{label}: user section {path} disappeared during completion");
            continue;
        }
        assert_eq!(after.get(&path), Some(&value), "{label}: user value at {path} did not survive completion");
    }
}

#[test]
fn compile_is_deterministic() {
    for example in ["minimal.yaml", "ha.yaml", "gce.yaml"] {
        let a = common::compile(&common::example(example));
        let b = common::compile(&common::example(example));
        let (ta, tb) = (common::read_tree(a.path()), common::read_tree(b.path()));
        assert!(!ta.is_empty());
        assert_eq!(ta, tb, "{example}: two compiles differ");
    }
}

#[test]
fn user_values_survive_in_every_conformance_input_and_example() {
    let mut n = 0;
    for entry in std::fs::read_dir(common::conformance_cases()).expect("cases") {
        let input = entry.expect("entry").path().join("input.yaml");
        if let Ok(bytes) = std::fs::read(&input) {
            assert_user_values_survive(&input.display().to_string(), &bytes);
            n += 1;
        }
    }
    for example in ["minimal.yaml", "ha.yaml", "gce.yaml"] {
        let path = common::example(example);
        assert_user_values_survive(example, &std::fs::read(&path).expect("example"));
    }
    assert!(n >= 46, "only {n} conformance inputs (46 today)");
}

#[test]
fn every_conformance_input_compiles_offline() {
    let mut n = 0;
    for entry in std::fs::read_dir(common::conformance_cases()).expect("cases") {
        let case = entry.expect("entry").path();
        let Ok(bytes) = std::fs::read(case.join("input.yaml")) else { continue };
        let docs = load_bytes(&case, &bytes).unwrap_or_else(|e| panic!("{}: {:?}", case.display(), e.lines()));
        let compiled = spec_compiler::compile(&docs, &offline()).unwrap_or_else(|e| panic!("{}: {e}", case.display()));
        assert!(compiled.tree.files.contains_key("cluster-completed.yaml"));
        n += 1;
    }
    // Guard: a moved or emptied cases directory must not pass by compiling nothing (46 inputs today).
    assert!(n >= 46, "only {n} conformance inputs under {}", common::conformance_cases().display());
}

fn minimal() -> String {
    std::fs::read_to_string(common::example("minimal.yaml")).expect("example")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Values a user sets in any component section come out unchanged, whatever they are.
    #[test]
    fn user_set_component_values_win(
        log_level in 0i64..10,
        max_pods in 1i64..500,
        proxy_millis in 1u32..4000,
        gate in "[A-Z][a-zA-Z]{2,20}",
        etcd in prop_oneof![Just("3.5.31"), Just("3.6.12")],
        containerd_log in prop_oneof![Just("debug"), Just("warn"), Just("error")],
        dns_ip_octet in 11u8..250,
    ) {
        let spec = minimal().replace(
            "  kubelet:\n    anonymousAuth: false\n",
            &format!(
                "  kubelet:\n    anonymousAuth: false\n    maxPods: {max_pods}\n    featureGates:\n      {gate}: \"false\"\n  kubeAPIServer:\n    logLevel: {log_level}\n  kubeProxy:\n    cpuRequest: {proxy_millis}m\n  containerd:\n    logLevel: {containerd_log}\n  kubeDNS:\n    serverIP: 100.64.0.{dns_ip_octet}\n"
            ),
        ).replacen("  - name: main\n", &format!("  - name: main\n    version: {etcd}\n"), 1);
        // Guard: `replace` is a silent no-op when examples/minimal.yaml's layout moves away from the
        // anchors, and the test would then check the example's own values only.
        assert!(spec.contains(&format!("    maxPods: {max_pods}\n")), "the kubelet anchor is gone from examples/minimal.yaml: nothing was set");
        assert!(spec.contains(&format!("  - name: main\n    version: {etcd}\n")), "the etcd `- name: main` anchor is gone from examples/minimal.yaml: no version was set");
        assert_user_values_survive("generated", spec.as_bytes());
    }

    /// Arbitrary bytes never panic the loader or the compiler.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        if let Ok(docs) = load_bytes(Path::new("fuzz.yaml"), &bytes) {
            let _ = spec_compiler::compile(&docs, &offline());
        }
    }

    /// Mutations of a valid spec (byte flips, deleted or duplicated lines, swapped values) never panic.
    #[test]
    fn mutated_specs_never_panic(
        edits in proptest::collection::vec((0usize..4, any::<prop::sample::Index>(), any::<u8>()), 1..6),
    ) {
        let mut lines: Vec<String> = minimal().lines().map(String::from).collect();
        for (kind, at, byte) in edits {
            if lines.is_empty() { break; }
            let i = at.index(lines.len());
            match kind {
                0 => { lines.remove(i); }
                1 => { let l = lines[i].clone(); lines.insert(i, l); }
                2 => {
                    let mut b = lines[i].clone().into_bytes();
                    if !b.is_empty() { let j = at.index(b.len()); b[j] = byte; }
                    lines[i] = String::from_utf8_lossy(&b).to_string();
                }
                _ => {
                    let j = (i + byte as usize) % lines.len();
                    if let (Some((k1, v1)), Some((k2, v2))) = (lines[i].split_once(": "), lines[j].split_once(": ")) {
                        let (a, b) = (format!("{k1}: {v2}"), format!("{k2}: {v1}"));
                        lines[i] = a;
                        lines[j] = b;
                    }
                }
            }
        }
        let text = lines.join("\n");
        if let Ok(docs) = load_bytes(Path::new("mutated.yaml"), text.as_bytes()) {
            let _ = spec_compiler::compile(&docs, &offline());
        }
    }
}

proptest! {
    // Enough cases that a field which matters (a zone: 2 of ~60 strings) is hit many times.
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Every string field of the example specs, replaced by arbitrary Unicode (multi-byte
    /// characters, control characters, empty), goes through validate and compile without a panic.
    #[test]
    fn unicode_in_any_string_field_never_panics(
        example in prop_oneof![Just("minimal.yaml"), Just("ha.yaml"), Just("gce.yaml")],
        at in any::<prop::sample::Index>(),
        text in "\\PC{0,24}",
        suffix in prop_oneof![Just(""), Just("é"), Just("a"), Just("\u{1F600}")],
    ) {
        let source = std::fs::read_to_string(common::example(example)).expect("example");
        let mut docs: Vec<serde_yaml_ng::Value> = Vec::new();
        for d in serde_yaml_ng::Deserializer::from_str(&source) {
            docs.push(serde::Deserialize::deserialize(d).expect("example YAML"));
        }
        fn strings<'a>(v: &'a mut serde_yaml_ng::Value, out: &mut Vec<&'a mut String>) {
            match v {
                serde_yaml_ng::Value::String(s) => out.push(s),
                serde_yaml_ng::Value::Sequence(x) => x.iter_mut().for_each(|e| strings(e, out)),
                serde_yaml_ng::Value::Mapping(m) => m.iter_mut().for_each(|(_, e)| strings(e, out)),
                _ => {}
            }
        }
        let mut fields = Vec::new();
        for d in docs.iter_mut() {
            strings(d, &mut fields);
        }
        let n = fields.len();
        let target = at.index(n);
        *fields[target] = format!("{text}{suffix}");
        let mut out = String::new();
        for d in &docs {
            out.push_str("---\n");
            out.push_str(&serde_yaml_ng::to_string(d).expect("yaml"));
        }
        if let Ok(docs) = load_bytes(Path::new("unicode.yaml"), out.as_bytes()) {
            let _ = keelson_api::validate(&docs);
            let _ = spec_compiler::compile(&docs, &offline());
        }
    }
}

#[test]
fn air_gapped_mirrors_rewrite_assets_and_images_including_pause() {
    let spec = minimal().replace(
        "  cloudProvider: aws\n",
        "  cloudProvider: aws\n  assets:\n    containerRegistry: registry.corp.example\n    fileRepository: https://files.corp.example/k8s\n",
    );
    assert!(spec.contains("containerRegistry: registry.corp.example"), "the `cloudProvider: aws` anchor is gone from examples/minimal.yaml: no mirror was set");
    let docs = load_bytes(Path::new("mirrored.yaml"), spec.as_bytes()).expect("valid");
    let compiled = spec_compiler::compile(&docs, &offline()).expect("compiles");
    let completed = String::from_utf8(compiled.tree.files["cluster-completed.yaml"].clone()).expect("utf-8");
    assert!(completed.contains("sandboxImage: registry.corp.example/pause:3.10.1"), "{completed}");
    assert!(completed.contains("image: registry.corp.example/kube-apiserver:v1.34.4"), "{completed}");
    assert!(!completed.contains("registry.k8s.io/kube-"), "an image escaped the mirror:\n{completed}");
    let nodeup = String::from_utf8(compiled.tree.files["nodeup/nodes-us-east-1a.yaml"].clone()).expect("utf-8");
    let urls: Vec<&str> = nodeup.lines().filter_map(|l| l.split_once('@').map(|(_, u)| u)).collect();
    assert!(!urls.is_empty());
    for u in urls {
        assert!(u.starts_with("https://files.corp.example/k8s/"), "asset not mirrored: {u}");
    }
    assert!(nodeup.contains("sandboxImage: registry.corp.example/pause:3.10.1"));
    // The hosts' packages come from the same file repository's apt archive.
    assert!(nodeup.contains("aptRepository: https://files.corp.example/k8s/apt\n"), "{nodeup}");
    let online = spec_compiler::compile(&load_bytes(Path::new("minimal.yaml"), minimal().as_bytes()).expect("valid"), &offline()).expect("compiles");
    let plain = String::from_utf8(online.tree.files["nodeup/nodes-us-east-1a.yaml"].clone()).expect("utf-8");
    assert!(!plain.contains("aptRepository"), "no file repository, no apt archive: the image's sources\n{plain}");
}

#[test]
fn packages_of_the_cluster_then_the_group_reach_nodeup() {
    let spec = minimal().replacen("  cloudProvider: aws\n", "  cloudProvider: aws\n  packages:\n  - jq\n", 1);
    let spec = spec.replace("  role: Node\n", "  role: Node\n  packages:\n  - nfs-common\n");
    let docs = load_bytes(Path::new("packages.yaml"), spec.as_bytes()).expect("packages are accepted");
    let compiled = spec_compiler::compile(&docs, &offline()).expect("compiles");
    let nodeup = String::from_utf8(compiled.tree.files["nodeup/nodes-us-east-1a.yaml"].clone()).expect("utf-8");
    assert!(nodeup.contains("packages:\n- jq\n- nfs-common\n"), "{nodeup}");
}
