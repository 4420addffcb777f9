//! An OCI registry for tests: Debian's `docker-registry` (the CNCF distribution registry) on
//! 127.0.0.1 with filesystem storage in a temp directory, a small three-architecture image written
//! as an OCI layout, and `skopeo` to move images between them. Fixtures: they panic, saying what is
//! missing (`scripts/test` installs both tools).

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use sha2::Digest as _;

/// Panic unless `tool` is on `PATH`, naming the tier and where it comes from.
pub fn need(tool: &str) {
    let found = Command::new("sh").arg("-c").arg(format!("command -v {tool}")).stdout(Stdio::null()).status().is_ok_and(|s| s.success());
    assert!(found, "{tool} is not installed: this tier-tools test needs it; scripts/test installs it (APT_PACKAGES), or `apt-get install {tool}`");
}

/// A running `docker-registry` (killed on drop).
pub struct Registry {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Registry {
    /// Start one on a free port of 127.0.0.1, storing under a fresh temp directory.
    pub fn start() -> Registry {
        need("docker-registry");
        let dir = tempfile::tempdir().expect("tempdir");
        let port = TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
        let config = dir.path().join("config.yml");
        let text = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: false\nhttp:\n  addr: 127.0.0.1:{port}\n",
            dir.path().join("storage").display()
        );
        std::fs::write(&config, text).expect("registry config");
        let log = std::fs::File::create(dir.path().join("log")).expect("registry log");
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("starting docker-registry (scripts/test installs it)");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "docker-registry did not listen on 127.0.0.1:{port} within 20 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        Registry { child, port, _dir: dir }
    }

    /// `127.0.0.1:<port>`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(bytes))
}

fn blob(dir: &Path, media_type: &str, bytes: &[u8]) -> serde_json::Value {
    let hex = sha256(bytes);
    std::fs::write(dir.join("blobs/sha256").join(&hex), bytes).expect("blob");
    json!({"mediaType": media_type, "digest": format!("sha256:{hex}"), "size": bytes.len()})
}

/// Write an OCI layout at `dir` holding `<dir>:v1`: an index of linux amd64, arm64 and s390x
/// manifests sharing one uncompressed layer (`/hello.txt`). Copy it with
/// `skopeo copy --all oci:<dir>:v1 docker://…`.
pub fn tiny_image(dir: &Path) {
    std::fs::create_dir_all(dir.join("blobs/sha256")).expect("layout");
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).expect("oci-layout");
    let mut tar = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    let content = b"hello from a bundle\n";
    header.set_size(content.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    tar.append_data(&mut header, "hello.txt", &content[..]).expect("tar");
    let layer = blob(dir, "application/vnd.oci.image.layer.v1.tar", &tar.into_inner().expect("tar"));
    let mut manifests = Vec::new();
    for arch in ["amd64", "arm64", "s390x"] {
        let config =
            json!({"architecture": arch, "os": "linux", "config": {"Cmd": ["/hello.txt"]}, "rootfs": {"type": "layers", "diff_ids": [layer["digest"]]}});
        let config = blob(dir, "application/vnd.oci.image.config.v1+json", config.to_string().as_bytes());
        let manifest = json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", "config": config, "layers": [layer]});
        let mut d = blob(dir, "application/vnd.oci.image.manifest.v1+json", manifest.to_string().as_bytes());
        d["platform"] = json!({"architecture": arch, "os": "linux"});
        manifests.push(d);
    }
    let index = json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": manifests});
    let mut top = blob(dir, "application/vnd.oci.image.index.v1+json", index.to_string().as_bytes());
    top["annotations"] = json!({"org.opencontainers.image.ref.name": "v1"});
    std::fs::write(dir.join("index.json"), json!({"schemaVersion": 2, "manifests": [top]}).to_string()).expect("index.json");
}

/// Run skopeo; its stdout. Panics with its stderr when it fails.
pub fn skopeo(args: &[&str]) -> Vec<u8> {
    need("skopeo");
    let out = Command::new("skopeo").args(args).output().expect("skopeo (scripts/test installs it)");
    assert!(out.status.success(), "skopeo {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    out.stdout
}
