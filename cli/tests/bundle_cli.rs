//! The air-gapped procedure of docs/bundles.md through the `keelson` binary: `bundle create` from a
//! local mirror and a `docker-registry`, `bundle push` into an empty directory and a second
//! `docker-registry` (then again: everything skipped), and `keelson get assets` of the spec pointed
//! at them (`assets.fileRepository`, `assets.containerRegistry`) finding every file and image
//! where push put it, and by the digests of the bundle (`--image-digests`); and `bundle push` into
//! an `s3://` file repository (moto).

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

    // With the bundle's digests: every image by the digest push put there, which the registry serves.
    let manifest = bundle::BundleManifest::read(&output).expect("bundle.json");
    let listed =
        keelson(&["get", "assets", "-f", spec.to_str().expect("utf-8"), "-o", "json", "--asset-hashes", hashes_arg, "--offline", "--image-digests", out]);
    let list: serde_json::Value = serde_json::from_slice(&listed.stdout).expect("json");
    let mut want: Vec<String> =
        manifest.images.iter().map(|i| format!("{}@{}", bundle::paths::registry_reference(&i.reference, &target.host()), i.digest)).collect();
    want.sort();
    let got: Vec<&str> = list["images"].as_array().expect("images").iter().map(|i| i["reference"].as_str().expect("reference")).collect();
    assert_eq!(got, want);
    for i in &manifest.images {
        // skopeo takes a name and a digest without the tag (nodes' containerd takes both).
        let name = bundle::paths::registry_reference(&i.reference, &target.host());
        let name = name.rsplit_once(':').map_or(name.as_str(), |(n, _)| n);
        skopeo(&["inspect", "--raw", "--tls-verify=false", &format!("docker://{name}@{}", i.digest)]);
    }
}

/// `bundle push --file-repository s3://…` against moto: the files go under the prefix, a second push
/// skips each file whose sha256 is there, and a file that differs is pushed again.
#[test]
fn push_into_an_s3_file_repository_then_again_skipping_what_is_there() {
    let log = tempfile::NamedTempFile::new().expect("moto log");
    let moto = testkit::moto::Moto::start(log.path()).unwrap_or_else(|e| panic!("this test needs moto: {e}"));
    let (status, body) = testkit::moto::http(moto.port, "PUT", "/keelson-assets", "").expect("create the bucket");
    assert_eq!(status, 200, "{body}");

    // A bundle of two files and no image.
    let work = tempfile::tempdir().expect("tempdir");
    let urls = ["https://dl.k8s.io/release/v1.34.4/bin/linux/amd64/kubectl", "https://dl.k8s.io/release/v1.34.4/bin/linux/amd64/kubelet"];
    let contents = |url: &str| format!("fake {url}\n").into_bytes();
    let files: Vec<bundle::BundleFile> = urls
        .iter()
        .map(|u| bundle::BundleFile {
            url: u.to_string(),
            sha256: sha256(&contents(u)),
            arch: "amd64".into(),
            size: contents(u).len() as u64,
            path: bundle::paths::bundle_path(u).expect("path"),
        })
        .collect();
    let manifest = bundle::BundleManifest::new("1.34.4", Default::default(), vec!["amd64".into()], files.clone(), vec![]);
    let archive = work.path().join("b.tar");
    let mut tar = tar::Builder::new(std::fs::File::create(&archive).expect("archive"));
    let entries =
        std::iter::once((bundle::manifest::MANIFEST_FILE.to_string(), manifest.to_json())).chain(files.iter().map(|f| (f.path.clone(), contents(&f.url))));
    for (name, bytes) in entries {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        tar.append_data(&mut header, name, bytes.as_slice()).expect("append");
    }
    tar.into_inner().expect("finish");

    let repo = "s3://keelson-assets/mirror";
    let push = |endpoint_flag: bool| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_keelson"));
        c.args(["bundle", "push", archive.to_str().expect("utf-8"), "--file-repository", repo, "--registry", "127.0.0.1:1"])
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("AWS_REGION", "us-east-1")
            .env_remove("AWS_ENDPOINT_URL_S3")
            .env_remove("AWS_PROFILE")
            .env_remove("KEELSON_LOG");
        if endpoint_flag {
            c.args(["--endpoint-url", &moto.endpoint()]).env_remove("AWS_ENDPOINT_URL");
        } else {
            c.env("AWS_ENDPOINT_URL", moto.endpoint());
        }
        let out = c.output().expect("keelson");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).expect("utf-8")
    };
    // The repository as the test reads it: signed, through the state store's S3 backend.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let store = rt.block_on(async {
        let opts = base::aws::AwsOptions { region: Some("us-east-1".into()), endpoint_url: Some(moto.endpoint()), ..Default::default() };
        let conf = base::aws::sdk_config(&opts).await;
        let credentials = aws_sdk_s3::config::Credentials::new("testing", "testing", None, None, "test");
        let s3 = aws_sdk_s3::Client::from_conf(base::aws::s3_config(&conf, true).credentials_provider(credentials).build());
        base::StateStore::open_with_s3(&repo.parse().expect("s3 URL"), Some(s3), std::time::Duration::from_secs(30)).expect("store")
    });
    let key = |url: &str| bundle::paths::repository_key(url, repo).expect("key");
    let read = |url: &str| rt.block_on(store.get(&key(url))).expect("get").unwrap_or_else(|| panic!("{url}: not in {repo}"));

    let first = push(false);
    assert!(first.contains("files: 2 pushed, 0 already there"), "{first}");
    for u in urls {
        assert_eq!(read(u), contents(u), "{u}");
        assert!(key(u).starts_with("release/v1.34.4/bin/linux/amd64/"), "{}", key(u));
    }
    let again = push(true);
    assert!(again.contains("files: 0 pushed, 2 already there"), "{again}");
    // A file that is there with other content is pushed again.
    rt.block_on(store.put(&key(urls[0]), b"stale")).expect("put");
    let third = push(false);
    assert!(third.contains("files: 1 pushed, 1 already there") && third.contains(&format!("pushed   {repo}/{}", key(urls[0]))), "{third}");
    assert_eq!(read(urls[0]), contents(urls[0]));
}
