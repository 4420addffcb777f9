//! Images by digest (`CompileOptions::image_digests`, `keelson compile --image-digests FILE`): given
//! a digest for every image `keelson get assets` lists, every image of the output names it —
//! containerd's sandbox image, the static pods, protokube's etcd, the addons — also behind a
//! `containerRegistry`; an image the digests do not name is an error naming it.

mod common;

use std::collections::BTreeMap;

use spec_compiler::assets::{list, AssetList};
use spec_compiler::CompileOptions;

/// `examples/minimal.yaml` with `extra` added under `spec:`.
fn minimal_with(extra: &str) -> keelson_api::Documents {
    let path = common::example("minimal.yaml");
    let text = std::fs::read_to_string(&path).expect("examples/minimal.yaml");
    let text = text.replacen("\nspec:\n", &format!("\nspec:\n{extra}"), 1);
    spec_compiler::load::load_bytes(&path, text.as_bytes()).unwrap_or_else(|e| panic!("{e}"))
}

fn assets(docs: &keelson_api::Documents, options: &CompileOptions) -> AssetList {
    let compiled = spec_compiler::compile(docs, options).unwrap_or_else(|e| panic!("compile: {e}"));
    list(&compiled, options).expect("list")
}

/// A digest for each image of `list` (as a bundle of the spec without mirrors lists them).
fn digests_of(list: &AssetList) -> BTreeMap<String, String> {
    list.images
        .iter()
        .map(|i| {
            assert_eq!(i.digest, None, "without digests, images are written by tag: {}", i.reference);
            (i.reference.clone(), format!("sha256:{}", base::sha256_hex(i.reference.as_bytes())))
        })
        .collect()
}

/// `NAME:TAG@DIGEST` → `(NAME:TAG, DIGEST)`.
fn split(pinned: &str) -> (&str, &str) {
    pinned.rsplit_once('@').unwrap_or_else(|| panic!("{pinned} pins no digest"))
}

/// `text` with every `@sha256:<64 hex>` removed.
fn without_digests(text: &str) -> String {
    const AT: &str = "@sha256:";
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(AT) {
        out.push_str(&rest[..at]);
        let after = &rest[at + AT.len()..];
        if after.as_bytes().get(..64).is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
            rest = &after[64..];
        } else {
            out.push_str(AT);
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

fn with_digests(digests: &BTreeMap<String, String>) -> CompileOptions {
    CompileOptions { image_digests: digests.clone(), ..common::options() }
}

#[test]
fn every_image_of_minimal_is_pinned_to_its_digest_also_behind_a_registry() {
    let docs = minimal_with("");
    let digests = digests_of(&assets(&docs, &common::options()));
    // What a node runs, from every kind of document: containerd's sandbox, a static pod, etcd, an addon.
    for upstream in ["registry.k8s.io/pause:", "registry.k8s.io/kube-apiserver:", "registry.k8s.io/etcd:", "registry.k8s.io/coredns/coredns:"] {
        assert!(digests.keys().any(|r| r.starts_with(upstream)), "{upstream}… is not among {digests:?}");
    }

    let pinned = assets(&docs, &with_digests(&digests));
    let want: Vec<String> = digests.iter().map(|(r, d)| format!("{r}@{d}")).collect();
    assert_eq!(pinned.images.iter().map(|i| i.reference.clone()).collect::<Vec<_>>(), want);
    assert!(pinned.images.iter().all(|i| i.digest.as_deref() == Some(split(&i.reference).1)));
    let files: std::collections::BTreeSet<&str> = pinned.images.iter().flat_map(|i| i.used_by.iter().map(String::as_str)).collect();
    for file in [
        "igconfig/control-plane/control-plane-us-east-1a/nodeupconfig.yaml",
        "igconfig/node/nodes-us-east-1a/nodeupconfig.yaml",
        "igconfig/control-plane/control-plane-us-east-1a/protokube.yaml",
        "addons/coredns.addons.k8s.io/v1.0.0.yaml",
    ] {
        assert!(files.contains(file), "{file} names no image: {files:?}");
    }

    // An addon kept from an upstream manifest (cert-manager's images are written as it gives them).
    let docs = minimal_with("  certManager:\n    enabled: true\n");
    let digests_cm = digests_of(&assets(&docs, &common::options()));
    assert!(digests_cm.keys().any(|r| r.starts_with("quay.io/jetstack/cert-manager-webhook:")), "{digests_cm:?}");
    for i in assets(&docs, &with_digests(&digests_cm)).images {
        let (upstream, digest) = split(&i.reference);
        assert_eq!((digest, i.digest.as_deref()), (digests_cm[upstream].as_str(), Some(digest)), "{}", i.reference);
    }

    // Behind a registry: each image under its rewritten name, pinned to its upstream's digest.
    let registry = "10.0.0.1:5000";
    let mirrored = assets(&minimal_with(&format!("  assets:\n    containerRegistry: {registry}\n")), &with_digests(&digests));
    let mut want: Vec<String> = digests.iter().map(|(r, d)| format!("{}@{d}", spec_compiler::versions::remap_image(r, Some(registry), None))).collect();
    want.sort();
    assert_eq!(mirrored.images.iter().map(|i| i.reference.clone()).collect::<Vec<_>>(), want);
}

#[test]
fn an_image_the_digests_do_not_name_is_an_error_naming_it() {
    let docs = minimal_with("");
    let mut digests = digests_of(&assets(&docs, &common::options()));
    let pause = digests.keys().find(|r| r.starts_with("registry.k8s.io/pause:")).expect("the sandbox image").clone();
    let etcd = digests.keys().find(|r| r.starts_with("registry.k8s.io/etcd:")).expect("the etcd image").clone();
    digests.remove(&pause);
    digests.remove(&etcd);
    let docs = minimal_with("");
    let e = spec_compiler::compile(&docs, &with_digests(&digests)).expect_err("unpinned images").to_string();
    assert!(e.contains(&format!("igconfig/node/nodes-us-east-1a/nodeupconfig.yaml: [0].containerdConfig.sandboxImage: image {pause} has no digest")), "{e}");
    assert!(
        e.contains(&format!("igconfig/control-plane/control-plane-us-east-1a/protokube.yaml: [0].etcdClusters[0].image: image {etcd} has no digest")),
        "{e}"
    );
    assert!(e.contains("--image-digests"), "{e}");
}

#[test]
fn an_image_the_spec_sets_is_pinned_when_its_digest_is_known() {
    let custom = "registry.example.com/custom/kube-apiserver:v1.34.4";
    let docs = minimal_with(&format!("  kubeAPIServer:\n    image: {custom}\n"));
    let digests = digests_of(&assets(&docs, &common::options()));
    assert!(digests.contains_key(custom), "{digests:?}");
    let pinned = assets(&docs, &with_digests(&digests));
    let apiserver = pinned.images.iter().find(|i| i.reference.starts_with(custom)).expect("the spec's image");
    assert_eq!(apiserver.reference, format!("{custom}@{}", digests[custom]));
    assert!(pinned.images.iter().all(|i| i.digest.is_some()));
    // An image the spec already pins is kept as written.
    let own = format!("{custom}@sha256:{}", "e".repeat(64));
    let docs = minimal_with(&format!("  kubeAPIServer:\n    image: {own}\n"));
    let pinned = assets(&docs, &with_digests(&digests));
    assert!(pinned.images.iter().any(|i| i.reference == own), "{:?}", pinned.images);
}

/// The bundle's way for every example and every conformance case that compiles: the digests of
/// the images the spec lists compiled without its mirrors (as `bundle create` lists them), then the
/// spec as it is (mirrors and all) compiled with them — every image of the output is pinned.
#[test]
fn every_example_and_case_compiles_pinned_with_the_digests_of_its_bundle() {
    let mut specs: Vec<std::path::PathBuf> =
        ["minimal.yaml", "ha.yaml", "private.yaml", "gossip.yaml", "gce.yaml"].iter().map(|e| common::example(e)).collect();
    let cases = common::conformance_cases();
    let mut names: Vec<_> = std::fs::read_dir(&cases).expect("cases").map(|e| e.expect("entry").path().join("input.yaml")).filter(|p| p.is_file()).collect();
    names.sort();
    specs.extend(names);
    let mut pinned_specs = 0;
    for spec in &specs {
        let Ok(docs) = spec_compiler::load::load_spec(spec) else { continue };
        let mut canonical = docs.clone();
        canonical.cluster.spec.assets = None;
        let Ok(compiled) = spec_compiler::compile(&canonical, &common::options()) else { continue };
        let digests = digests_of(&list(&compiled, &common::options()).expect("list"));
        let options = with_digests(&digests);
        let pinned = spec_compiler::compile(&docs, &options).unwrap_or_else(|e| panic!("{}: {e}", spec.display()));
        for i in &list(&pinned, &options).expect("list").images {
            assert!(i.digest.is_some(), "{}: {} has no digest", spec.display(), i.reference);
        }
        // Only the images changed: the completed spec, digests left out, is the one compiled without them.
        let plain = spec_compiler::compile(&docs, &common::options()).expect("compile");
        let completed = |c: &spec_compiler::Compiled| String::from_utf8(c.tree.files["cluster-completed.yaml"].clone()).expect("utf-8");
        assert_eq!(without_digests(&completed(&pinned)), completed(&plain), "{}", spec.display());
        pinned_specs += 1;
    }
    assert!(pinned_specs >= 40, "only {pinned_specs} of {} specs compiled", specs.len());
}
