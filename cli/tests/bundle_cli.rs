//! The air-gapped procedure of docs/bundles.md through the `keelson` binary: `bundle create` from a
//! local mirror and a `docker-registry`, `bundle push` into an empty directory and a second
//! `docker-registry` (then again: everything skipped), and `keelson get assets` of the spec pointed
//! at them (`assets.fileRepository`, `assets.containerRegistry`) finding every file and image
//! where push put it.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use sha2::Digest as _;
use spec_compiler::complete::CompileOptions;
use spec_compiler::versions::Arch;
use testkit::mirror::Mirror;
use testkit::registry::{need, skopeo, tiny_image, Registry};

const SPEC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/minimal.yaml");

fn sha256(bytes: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(bytes))
}

fn keelson(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_keelson")).args(args).env_remove("KEELSON_LOG").env_remove("KEELSON_ASSET_HASHES").output().expect("keelson");
    assert!(out.status.success(), "keelson {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    out
}

#[test]
fn create_push_push_again_then_the_mirrored_spec_finds_everything() {
    need("docker-registry");
    need("skopeo");
    let work = tempfile::tempdir().expect("tempdir");
    let docs = spec_compiler::load::load_spec(Path::new(SPEC)).expect("load");
    let plan = bundle::plan(&docs, &CompileOptions::default(), &[Arch::Amd64]).expect("plan");

    let mirror = Mirror::start();
    let base = mirror.url("/");
    let mut hashes = BTreeMap::new();
    for f in &plan.files {
        let bytes = format!("fake {}\n", f.url).into_bytes();
        let at = bundle::paths::source_url(&f.url, Some(&base)).expect("mirror URL");
        mirror.put(at.strip_prefix(base.trim_end_matches('/')).expect("under the mirror"), bytes.clone());
        hashes.insert(f.url.clone(), sha256(&bytes));
    }
    let hashes_file = work.path().join("hashes.tsv");
    std::fs::write(&hashes_file, hashes.iter().map(|(u, h)| format!("{u}\t{h}\n")).collect::<String>()).expect("hashes");
    let hashes_arg = hashes_file.to_str().expect("utf-8");

    let source = Registry::start();
    let oci = work.path().join("oci");
    tiny_image(&oci);
    for image in &plan.images {
        let name = bundle::paths::registry_reference(&image.reference, &source.host());
        skopeo(&["copy", "--all", "--quiet", "--dest-tls-verify=false", &format!("oci:{}:v1", oci.display()), &format!("docker://{name}")]);
    }

    let output = work.path().join("minimal-bundle.tar");
    let out = output.to_str().expect("utf-8");
    let created = keelson(&[
        "bundle",
        "create",
        "-f",
        SPEC,
        "--arch",
        "amd64",
        "-o",
        out,
        "--from-mirror",
        &base,
        "--from-registry",
        &source.host(),
        "--asset-hashes",
        hashes_arg,
        "--offline",
    ]);
    let progress = String::from_utf8_lossy(&created.stderr);
    let n_files = plan.files.len();
    assert!(progress.contains(&format!("file {n_files}/{n_files} ")) && progress.contains("image 1/"), "progress is shown by default: {progress}");
    assert!(String::from_utf8_lossy(&created.stdout).contains(&format!("{n_files} files, {} images", plan.images.len())));

    let target = Registry::start();
    let repo_dir = work.path().join("assets");
    let repo = format!("file://{}", repo_dir.display());
    let pushed = String::from_utf8(keelson(&["bundle", "push", out, "--file-repository", &repo, "--registry", &target.host()]).stdout).expect("utf-8");
    assert!(pushed.contains(&format!("files: {n_files} pushed, 0 already there; images: {} pushed, 0 already there", plan.images.len())), "{pushed}");
    let again = String::from_utf8(keelson(&["bundle", "push", out, "--file-repository", &repo, "--registry", &target.host()]).stdout).expect("utf-8");
    assert!(
        again.contains(&format!("files: 0 pushed, {n_files} already there; images: 0 pushed, {} already there; blobs: 0 pushed", plan.images.len())),
        "{again}"
    );

    // The spec pointed at the repository and the registry: every asset is where its nodes look.
    let text = std::fs::read_to_string(SPEC).expect("spec");
    let mirrored = text.replacen("\nspec:\n", &format!("\nspec:\n  assets:\n    fileRepository: {repo}\n    containerRegistry: {}\n", target.host()), 1);
    let spec = work.path().join("airgapped.yaml");
    std::fs::write(&spec, mirrored).expect("spec");
    let listed = keelson(&["get", "assets", "-f", spec.to_str().expect("utf-8"), "--arch", "amd64", "-o", "json", "--asset-hashes", hashes_arg, "--offline"]);
    let list: serde_json::Value = serde_json::from_slice(&listed.stdout).expect("json");
    let files = list["files"].as_array().expect("files");
    assert_eq!(files.len(), n_files);
    for f in files {
        let url = f["url"].as_str().expect("url");
        let path = url.strip_prefix("file://").unwrap_or_else(|| panic!("{url}: not in the file repository"));
        assert_eq!(sha256(&std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"))), f["sha256"].as_str().expect("sha256"), "{path}");
    }
    let images = list["images"].as_array().expect("images");
    assert_eq!(images.len(), plan.images.len());
    for i in images {
        let reference = i["reference"].as_str().expect("reference");
        assert!(reference.starts_with(&format!("{}/", target.host())), "{reference}");
        skopeo(&["inspect", "--raw", "--tls-verify=false", &format!("docker://{reference}")]);
    }
}
