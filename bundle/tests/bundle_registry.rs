//! `bundle create` then `bundle push` against real registries (Debian's `docker-registry`, the CNCF
//! distribution registry) and a local file mirror: the minimal example's every file (fake contents,
//! their hashes given as `--asset-hashes` gives them) and every image (one small three-architecture
//! image pushed with skopeo under each name the compiler's `containerRegistry` rewrite gives) into a
//! bundle; a tampered file refused naming it, the interrupted run resumed; the bundle pushed into an
//! empty directory and a fresh registry, each file checked by sha256 and each image by digest, the
//! image copied back out with skopeo; a second push skips everything.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use sha2::Digest as _;
use spec_compiler::complete::CompileOptions;
use spec_compiler::versions::Arch;
use testkit::mirror::{Behaviour, Mirror};
use testkit::registry::{need, skopeo, tiny_image, Registry};

fn sha256(bytes: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(bytes))
}

fn minimal() -> keelson_api::Documents {
    spec_compiler::load::load_spec(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/minimal.yaml"))).expect("load")
}

#[test]
fn create_then_push_into_an_empty_repository_and_registry_then_again() {
    need("docker-registry");
    need("skopeo");
    let docs = minimal();
    let arches = [Arch::Amd64, Arch::Arm64];
    let first = bundle::plan(&docs, &CompileOptions::default(), &arches).expect("plan");

    // The mirror serves a fake file for every asset, where `--from-mirror` looks for it; its hashes
    // win over the versions table, as `--asset-hashes FILE` makes them.
    let mirror = Mirror::start();
    let base = mirror.url("/");
    let mut hashes = BTreeMap::new();
    let mut mirror_paths = BTreeMap::new();
    for f in &first.files {
        let bytes = format!("fake {} for {}\n", f.url, f.arch).repeat(50).into_bytes();
        let at = bundle::paths::source_url(&f.url, Some(&base)).expect("mirror URL");
        let path = at.strip_prefix(base.trim_end_matches('/')).expect("under the mirror").to_string();
        mirror.put(&path, bytes.clone());
        hashes.insert(f.url.clone(), sha256(&bytes));
        mirror_paths.insert(f.url.clone(), path);
    }
    let options = CompileOptions { asset_hashes: hashes.clone(), ..Default::default() };
    let plan = bundle::plan(&docs, &options, &arches).expect("plan");
    assert!(plan.files.len() >= 8, "{:?}", plan.files);
    assert!(plan.files.iter().all(|f| hashes[&f.url] == f.sha256));

    // The source registry holds the tiny image under every name the spec's images map to.
    let source = Registry::start();
    let oci = tempfile::tempdir().expect("tempdir");
    tiny_image(oci.path());
    let layout_ref = format!("oci:{}:v1", oci.path().display());
    for image in &plan.images {
        assert!(image.digest.is_none(), "{}: pinned by digest; the tiny image cannot stand in for it", image.reference);
        let name = bundle::paths::registry_reference(&image.reference, &source.host());
        skopeo(&["copy", "--all", "--quiet", "--dest-tls-verify=false", &layout_ref, &format!("docker://{name}")]);
    }

    let work = tempfile::tempdir().expect("tempdir");
    let output = work.path().join("bundle.tar");
    let opts = bundle::CreateOptions { output: output.clone(), from_mirror: Some(base.clone()), from_registry: Some(source.host()) };

    // A tampered file (the last one downloaded) is refused, naming it; what was fetched before it stays.
    let last = plan.files.last().expect("files");
    mirror.set(&mirror_paths[&last.url], Behaviour::Corrupt);
    let e = bundle::create(&plan, &opts).expect_err("tampered file refused").to_string();
    assert!(e.contains(&last.url) && e.contains("refused"), "{e}");
    assert!(!output.exists(), "no archive from a refused run");
    let first_path = &mirror_paths[&plan.files[0].url];
    assert_eq!(mirror.hits(first_path), 1);

    // Run again: resumed, the verified files reused.
    mirror.set(&mirror_paths[&last.url], Behaviour::Serve);
    let started = Instant::now();
    let report = bundle::create(&plan, &opts).expect("create");
    let create_time = started.elapsed();
    assert_eq!(mirror.hits(first_path), 1, "a verified file of the interrupted run is not fetched again");
    assert!(report.reused_bytes > 0, "{report:?}");
    assert_eq!((report.files, report.images), (plan.files.len(), plan.images.len()));
    assert!(!bundle::create::work_dir(&output).exists(), "the work directory is removed once the archive is in place");
    let manifest = report.manifest.expect("manifest");
    assert_eq!(manifest.kubernetes_version, "1.34.4");
    assert_eq!(manifest.arches, ["amd64", "arm64"]);
    for image in &manifest.images {
        let arches: Vec<&str> = image.manifests.iter().map(|m| m.arch.as_str()).collect();
        assert_eq!(arches, ["amd64", "arm64"], "{}: only the bundle's architectures", image.reference);
        assert!(image.source_digest.is_some(), "{}: the s390x manifest was left out, so the index is a narrower one", image.reference);
    }

    // Push into an empty directory and a fresh registry.
    let target = Registry::start();
    let repo_dir = tempfile::tempdir().expect("tempdir");
    let repo = format!("file://{}", repo_dir.path().display());
    let store = bundle::open_repository(&repo, None).expect("repository");
    let push_opts = bundle::PushOptions { file_repository: repo.clone(), registry: target.host(), plain_http: false };
    let started = Instant::now();
    let pushed = bundle::push(&output, &store, &push_opts).expect("push");
    let push_time = started.elapsed();
    assert_eq!((pushed.files_pushed.len(), pushed.files_skipped.len()), (plan.files.len(), 0));
    assert_eq!((pushed.images_pushed.len(), pushed.images_skipped.len()), (plan.images.len(), 0));
    for f in &manifest.files {
        let at = spec_compiler::versions::remap_file_url(&f.url, Some(&repo)).expect("rewrite");
        let path = PathBuf::from(at.strip_prefix("file://").expect("file URL"));
        assert_eq!(sha256(&std::fs::read(&path).expect("pushed file")), f.sha256, "{}", path.display());
    }
    for image in &manifest.images {
        let name = spec_compiler::versions::remap_image(&image.reference, Some(&target.host()), None);
        let raw = skopeo(&["inspect", "--raw", "--tls-verify=false", &format!("docker://{name}")]);
        assert_eq!(format!("sha256:{}", sha256(&raw)), image.digest, "{name}");
        let text = String::from_utf8_lossy(&raw);
        for m in &image.manifests {
            assert!(text.contains(&m.digest), "{name}: {} manifest {}", m.arch, m.digest);
        }
        assert!(!text.contains("s390x"), "{name}");
    }
    let first_image = spec_compiler::versions::remap_image(&manifest.images[0].reference, Some(&target.host()), None);
    let back = tempfile::tempdir().expect("tempdir");
    skopeo(&["copy", "--all", "--quiet", "--src-tls-verify=false", &format!("docker://{first_image}"), &format!("oci:{}:x", back.path().display())]);

    // Again: nothing to do.
    let again = bundle::push(&output, &store, &push_opts).expect("push again");
    assert_eq!((again.files_pushed.len(), again.files_skipped.len()), (0, plan.files.len()), "{again:?}");
    assert_eq!((again.images_pushed.len(), again.images_skipped.len()), (0, plan.images.len()), "{again:?}");
    assert_eq!((again.blobs_pushed, again.bytes_pushed), (0, 0));

    eprintln!(
        "bundle: {} files, {} images, {} blobs, {} bytes; create (resumed) {:.2} s; push {:.2} s ({} blobs, {} bytes)",
        report.files,
        report.images,
        report.blobs,
        report.archive_bytes,
        create_time.as_secs_f64(),
        push_time.as_secs_f64(),
        pushed.blobs_pushed,
        pushed.bytes_pushed
    );
}
