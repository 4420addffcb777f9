//! `spec_compiler::assets::list` names every image and file the compiled tree names, for every
//! example: found here independently of the lister, by reading every file of the tree (as
//! `keelson compile --out` writes it) for image fields, strings that look like image references and
//! hash-pinned assets, and the user-data scripts for the URLs they download.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use keelson_api::image::ImageReference;

/// Files of the tree that restate the input instead of saying what runs: the completed spec (whose
/// default for a feature that is off, e.g. `kubeDNS.nodeLocalDNS.image`, reaches no node) in its two
/// copies, and the instance groups (`spec.image` is the machine image).
fn restates_input(rel: &str) -> bool {
    rel == "cluster-completed.yaml" || rel == "state/cluster-completed.spec" || rel.starts_with("state/instancegroup/")
}

/// What a string names that a node would pull: an image reference with a registry path and a tag or
/// digest (`registry.k8s.io/pause:3.10.1`), possibly inside a longer string (`--image=…`).
fn image_like(token: &str) -> bool {
    let last = token.rsplit('/').next().unwrap_or("");
    token.contains('/') && (last.contains(':') || token.contains('@')) && !token.contains("://") && token.parse::<ImageReference>().is_ok()
}

#[derive(Default)]
struct Named {
    images: BTreeSet<String>,
    /// Every URL of every `<sha256>@<url>[,…]` asset and every URL the user-data downloads.
    urls: BTreeSet<String>,
}

fn collect(value: &serde_yaml_ng::Value, key: Option<&str>, named: &mut Named) {
    use serde_yaml_ng::Value;
    match value {
        Value::Mapping(m) => m.iter().for_each(|(k, v)| collect(v, k.as_str(), named)),
        Value::Sequence(s) => s.iter().for_each(|v| collect(v, None, named)),
        Value::Tagged(t) => collect(&t.value, key, named),
        Value::String(s) => {
            if key.is_some_and(|k| k == "image" || k.ends_with("Image")) {
                named.images.insert(s.clone());
            }
            for token in s.split(|c: char| c.is_whitespace() || matches!(c, '=' | '"' | '\'')) {
                if image_like(token) {
                    named.images.insert(token.to_string());
                }
            }
            if let Ok(asset) = s.parse::<base::AssetRef>() {
                named.urls.extend(asset.urls);
            }
        }
        _ => {}
    }
}

/// Everything the written tree names.
fn named_in_tree(dir: &Path) -> Named {
    use serde::Deserialize as _;
    let mut named = Named::default();
    for (rel, bytes) in common::read_tree(dir) {
        if restates_input(&rel) {
            continue;
        }
        if rel.starts_with("userdata/") {
            let text = String::from_utf8(bytes).expect("user-data is text");
            for token in text.split(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | ',' | '=')) {
                if token.starts_with("https://") || token.starts_with("http://") {
                    named.urls.insert(token.to_string());
                }
            }
            continue;
        }
        for doc in serde_yaml_ng::Deserializer::from_slice(&bytes) {
            let value = serde_yaml_ng::Value::deserialize(doc).unwrap_or_else(|e| panic!("{rel}: every file of the tree but user-data is YAML: {e}"));
            collect(&value, None, &mut named);
        }
    }
    named
}

/// What the tree names that the list does not, and what the list names that the tree does not.
fn differences(named: &Named, list: &spec_compiler::assets::AssetList) -> Vec<String> {
    let images: BTreeSet<String> = list.images.iter().map(|i| i.reference.clone()).collect();
    let urls: BTreeSet<String> = list.files.iter().flat_map(|f| std::iter::once(f.url.clone()).chain(f.mirrors.iter().cloned())).collect();
    let mut out = Vec::new();
    out.extend(named.images.difference(&images).map(|i| format!("image not listed: {i}")));
    out.extend(images.difference(&named.images).map(|i| format!("image listed but in no document: {i}")));
    out.extend(named.urls.difference(&urls).map(|u| format!("file not listed: {u}")));
    out.extend(urls.difference(&named.urls).map(|u| format!("file listed but in no document: {u}")));
    out
}

fn examples() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(common::repo_root().join("examples"))
        .expect("examples/")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    names.sort();
    assert!(names.len() >= 5, "{names:?}");
    names
}

#[test]
fn the_list_names_exactly_what_the_compiled_tree_names_for_every_example() {
    for example in examples() {
        let spec = common::example(&example);
        let docs = spec_compiler::load::load_spec(&spec).expect("load");
        let options = common::options();
        let compiled = spec_compiler::compile(&docs, &options).expect("compile");
        let list = spec_compiler::assets::list(&compiled, &options).expect("asset list");
        let dir = tempfile::tempdir().expect("tmp");
        compiled.tree.write_to(dir.path()).expect("write");
        let named = named_in_tree(dir.path());
        assert_eq!(differences(&named, &list), Vec::<String>::new(), "{example}");

        // The check sees a dropped image and a dropped file.
        assert!(!list.images.is_empty() && !list.files.is_empty(), "{example}");
        for i in 0..list.images.len() {
            let mut short = list.clone();
            let dropped = short.images.remove(i);
            assert_eq!(differences(&named, &short), [format!("image not listed: {}", dropped.reference)], "{example}");
        }
        let mut short = list.clone();
        let dropped = short.files.remove(0);
        assert!(differences(&named, &short).contains(&format!("file not listed: {}", dropped.url)), "{example}");

        // What each example runs, by kind (the versions table decides the tags).
        let has = |part: &str| list.images.iter().any(|i| i.reference.contains(part));
        for part in ["/kube-apiserver:", "/kube-controller-manager:", "/kube-scheduler:", "/kube-proxy:", "/pause:", "/coredns:", "/cloud-controller-manager:"]
        {
            assert!(has(part), "{example}: no {part} image in {:#?}", list.images);
        }
        for file in ["/kubelet", "/kubectl", "/nodeup", "/protokube"] {
            for arch in ["amd64", "arm64"] {
                assert!(list.files.iter().any(|f| f.url.ends_with(file) && f.arch == arch), "{example}: no {arch} {file}");
            }
        }
        assert!(list.files.iter().any(|f| f.url.contains("containerd-")), "{example}: no containerd");
    }
}

#[test]
fn images_follow_the_registry_mirror() {
    let text = std::fs::read_to_string(common::example("minimal.yaml")).expect("read").replacen(
        "spec:\n",
        "spec:\n  assets:\n    containerRegistry: registry.mirror.test:5000\n",
        1,
    );
    let file = tempfile::NamedTempFile::new().expect("tmp");
    std::fs::write(file.path(), text).expect("write");
    let docs = spec_compiler::load::load_spec(file.path()).expect("load");
    let options = common::options();
    let compiled = spec_compiler::compile(&docs, &options).expect("compile");
    let list = spec_compiler::assets::list(&compiled, &options).expect("list");
    let elsewhere: Vec<_> = list.images.iter().filter(|i| !i.reference.starts_with("registry.mirror.test:5000/")).collect();
    assert!(elsewhere.is_empty(), "pulled from outside the mirror: {elsewhere:#?}");
}

/// Without the AWS account an addon on a role of its own is not written, so no asset list is made
/// from such a compile: a bundle made from it could not run the addon.
#[test]
fn no_list_without_the_addons_withheld_for_want_of_the_account() {
    let docs = spec_compiler::load::load_spec(&common::example("gossip.yaml")).expect("load");
    let options = spec_compiler::CompileOptions { aws_account: None, ..common::options() };
    let compiled = spec_compiler::compile(&docs, &options).expect("compile");
    assert!(compiled.warnings.iter().any(|w| w.contains("aws-cloud-controller.addons.k8s.io is not written")), "{:?}", compiled.warnings);
    let e = spec_compiler::assets::list(&compiled, &options).expect_err("no list");
    assert!(e.to_string().contains("give --aws-account-id"), "{e}");
}
