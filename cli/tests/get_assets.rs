//! `keelson get assets`: the library's list (`spec_compiler::assets::list`) printed as asked, with the
//! flags of `keelson compile`; the command the docs show runs as written.

mod common;

fn run_in_repo(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_keelson"))
        .args(args)
        .current_dir(common::repo_root())
        .env_remove("KOPS_FEATURE_FLAGS")
        .env_remove("KOPS_BASE_URL")
        .env_remove("KEELSON_NODEUP_ASSET")
        .env_remove("KEELSON_ASSET_HASHES")
        .output()
        .expect("run keelson")
}

fn library_list(example: &str, options: &spec_compiler::CompileOptions) -> spec_compiler::assets::AssetList {
    let docs = spec_compiler::load::load_spec(&common::example(example)).expect("load");
    let compiled = spec_compiler::compile(&docs, options).expect("compile");
    spec_compiler::assets::list(&compiled, options).expect("list")
}

#[test]
fn json_and_yaml_are_the_librarys_list_and_arch_filters_files() {
    let spec = common::example("ha.yaml");
    let spec = spec.to_str().expect("path");
    let builds = [
        "--nodeup-asset",
        common::NODEUP_AMD64,
        "--nodeup-asset",
        common::NODEUP_ARM64,
        "--protokube-asset",
        common::PROTOKUBE_AMD64,
        "--protokube-asset",
        common::PROTOKUBE_ARM64,
    ];
    let out = run_in_repo(&[&["get", "assets", "-f", spec, "--offline", "-o", "json"][..], &builds].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let arch_asset = |item: &str| {
        let (arch, asset) = item.split_once('=').expect("ARCH=");
        (spec_compiler::versions::Arch::parse(arch).expect("arch"), spec_compiler::userdata::NodeupAsset::parse(asset).expect("asset"))
    };
    let options = spec_compiler::CompileOptions {
        nodeup_assets: [common::NODEUP_AMD64, common::NODEUP_ARM64].map(arch_asset).into_iter().collect(),
        protokube_assets: [common::PROTOKUBE_AMD64, common::PROTOKUBE_ARM64].map(arch_asset).into_iter().collect(),
        ..Default::default()
    };
    let list = library_list("ha.yaml", &options);
    assert_eq!(got, serde_json::to_value(&list).expect("value"));
    let nodeup = &got["files"].as_array().expect("files").iter().find(|f| f["url"] == "https://nodeup.mirror.test/amd64/nodeup").expect("the nodeup build");
    assert_eq!(nodeup["mirrors"], serde_json::json!(["https://backup.mirror.test/amd64/nodeup"]));

    let out = run_in_repo(&[&["get", "assets", "-f", spec, "--offline", "-o", "yaml", "--arch", "arm64"][..], &builds].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got: serde_json::Value = serde_yaml_ng::from_slice(&out.stdout).expect("YAML");
    assert_eq!(got, serde_json::to_value(list.clone().for_arches(&[spec_compiler::versions::Arch::Arm64])).expect("value"));
    assert!(got["files"].as_array().expect("files").iter().all(|f| f["arch"] == "arm64"));
    assert_eq!(got["images"], serde_json::to_value(&list.images).expect("value"), "every architecture pulls the images");
}

#[test]
fn bad_input_is_named() {
    let spec = common::example("minimal.yaml");
    let spec = spec.to_str().expect("path");
    let out = run_in_repo(&["get", "assets", "-f", spec, "--offline", "--arch", "amd64,sparc"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--arch \"sparc\": unknown architecture"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = run_in_repo(&["get", "assets", "-f", spec, "--offline", "-o", "xml"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("xml"));
    let out = run_in_repo(&["get", "assets", "-f", "/nonexistent/spec.yaml", "--offline"]);
    assert_eq!(out.status.code(), Some(2), "an unreadable spec exits 2 as `compile` does");
}

/// The command docs/compiler.md shows, run as written from the repository root.
#[test]
fn the_documented_command_runs_as_written() {
    let doc = std::fs::read_to_string(common::repo_root().join("docs/compiler.md")).expect("docs/compiler.md");
    let line = doc.lines().find(|l| l.starts_with("keelson get assets -f examples/minimal.yaml")).expect("the documented command");
    let args: Vec<&str> = line.split_whitespace().skip(1).collect();
    let out = run_in_repo(&args);
    assert!(out.status.success(), "{line}: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let table_line = |prefix: &str| text.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no {prefix:?} in\n{text}")).to_string();
    assert!(table_line("IMAGE ").contains("DIGEST") && table_line("FILE ").contains("SHA256"), "{text}");
    // Each line the docs show (but the elisions) is a line of the real output.
    let shown = doc.split(line).nth(1).and_then(|rest| rest.split("```\n").nth(2)).expect("the sample output block");
    for l in shown.lines().filter(|l| !l.starts_with('…')) {
        assert!(text.lines().any(|t| t.trim_end() == l.trim_end() || squeeze(t) == squeeze(l)), "docs show {l:?}, the command prints\n{text}");
    }
}

fn squeeze(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `--image-digests` with a bundle's `bundle.json` (or the bundle itself): every image `get assets`
/// lists carries the bundle's digest; one the bundle lacks is an error naming it.
#[test]
fn image_digests_from_a_bundle_pin_every_image() {
    let spec = common::example("minimal.yaml");
    let spec = spec.to_str().expect("path");
    let out = run_in_repo(&["get", "assets", "-f", spec, "--offline", "-o", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let references: Vec<String> =
        listed["images"].as_array().expect("images").iter().map(|i| i["reference"].as_str().expect("reference").to_string()).collect();
    let digest = |r: &str| format!("sha256:{}", hex::encode(<sha2::Sha256 as sha2::Digest>::digest(r.as_bytes())));
    let manifest = |references: &[String]| {
        let images = references
            .iter()
            .map(|r| bundle::BundleImage {
                reference: r.clone(),
                digest: digest(r),
                media_type: "application/vnd.oci.image.index.v1+json".into(),
                source_digest: None,
                manifests: vec![],
            })
            .collect();
        bundle::BundleManifest::new("1.34.4", Default::default(), vec!["amd64".into()], vec![], images)
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("bundle.json");
    std::fs::write(&file, manifest(&references).to_json()).expect("write bundle.json");

    let out = run_in_repo(&["get", "assets", "-f", spec, "--offline", "-o", "json", "--image-digests", file.to_str().expect("path")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let pinned: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let images = pinned["images"].as_array().expect("images");
    assert_eq!(images.len(), references.len());
    for (i, r) in images.iter().zip(&references) {
        assert_eq!((i["reference"].as_str(), i["digest"].as_str()), (Some(format!("{r}@{}", digest(r)).as_str()), Some(digest(r).as_str())));
    }

    let pause = references.iter().find(|r| r.starts_with("registry.k8s.io/pause:")).expect("the sandbox image").clone();
    let without: Vec<String> = references.iter().filter(|r| **r != pause).cloned().collect();
    std::fs::write(&file, manifest(&without).to_json()).expect("write bundle.json");
    let out_dir = dir.path().join("out");
    let compile_with = |digests: &str| run_in_repo(&["compile", "-f", spec, "--offline", "--out", out_dir.to_str().expect("path"), "--image-digests", digests]);
    let out = compile_with(file.to_str().expect("path"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains(&format!("sandboxImage: image {pause} has no digest")), "{stderr}");
    let out = compile_with("/nonexistent/bundle.tar");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("--image-digests") && stderr.contains("/nonexistent/bundle.tar"), "{stderr}");
}
