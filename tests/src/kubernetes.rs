//! Real Kubernetes for the local cloud, from source: the binaries (`tests/kubernetes/build.sh`),
//! containerd (`tests/kubernetes/build-containerd.sh`), the OCI images of the control plane, etcd,
//! kube-proxy, pause and the test echo server (`tests/kubernetes/images.sh`), and the image
//! registry the machines pull from (Debian's `docker-registry`, the CNCF distribution registry).
//!
//! Every build is cached under the local cloud's cache directory, keyed by version (and, for the
//! images, by the binaries' hashes): the first run compiles Kubernetes from the Go module proxy,
//! later runs reuse it. Nothing prebuilt is downloaded.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::arch::Arch;
use crate::cmd::{self, CmdError};

/// Port of the registry on the bridge address.
pub const REGISTRY_PORT: u16 = 5000;

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("{script}: {source}")]
    Script {
        script: String,
        #[source]
        source: CmdError,
    },
    #[error("{script} printed no usable path ({output:?})")]
    NoOutput { script: String, output: String },
    #[error("registry: {0}")]
    Registry(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// `tests/kubernetes/` of this checkout (the scripts).
pub fn scripts_dir() -> PathBuf {
    std::env::var_os("KEELSON_LOCAL_SCRIPTS")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("kubernetes"))
}

fn run_script(name: &str, args: &[&str]) -> Result<PathBuf, BuildError> {
    run_script_for(name, args, crate::arch::host())
}

/// A build script for `arch` (`GOARCH`, which the scripts read through `go env GOARCH`).
fn run_script_for(name: &str, args: &[&str], arch: Arch) -> Result<PathBuf, BuildError> {
    let script = scripts_dir().join(name);
    let started = Instant::now();
    // Progress goes to our stderr (a cold build takes many minutes); the path comes on stdout.
    let out = Command::new(&script)
        .args(args)
        .env("KEELSON_LOCAL_CACHE", crate::paths::cache_dir())
        .env("GOARCH", arch.as_str())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|source| BuildError::Script {
            script: script.display().to_string(),
            source: CmdError::Spawn { program: script.display().to_string(), source },
        })?;
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    if !out.status.success() {
        return Err(BuildError::Script {
            script: format!("{} {}", script.display(), args.join(" ")),
            source: CmdError::Failed { command: name.to_string(), status: out.status.to_string(), stderr: "see its output above".to_string() },
        });
    }
    let path = stdout.lines().rev().find(|l| !l.trim().is_empty()).map(|l| PathBuf::from(l.trim()));
    match path {
        Some(p) if p.exists() => {
            let secs = started.elapsed().as_secs_f64();
            if secs > 5.0 {
                eprintln!("keelson-local: {name} {} took {secs:.0} s", args.join(" "));
            }
            Ok(p)
        }
        _ => Err(BuildError::NoOutput { script: name.to_string(), output: stdout }),
    }
}

/// The directory holding `kube-apiserver`, …, `kubelet`, `kubectl` for `version` (built once).
pub fn kubernetes_binaries(version: &str) -> Result<PathBuf, BuildError> {
    run_script("build.sh", &[version])
}

/// The upstream-layout containerd archive (`bin/containerd`, …) for `version` (built once).
pub fn containerd_archive(version: &str) -> Result<PathBuf, BuildError> {
    run_script("build-containerd.sh", &[version])
}

/// What a worker of another architecture needs built from source: `kubelet`, `kubectl` and
/// `kube-proxy` of `version` (the directory; cross-compiled once).
pub fn kubernetes_binaries_for(version: &str, arch: Arch) -> Result<PathBuf, BuildError> {
    run_script_for("build.sh", &[version], arch)
}

/// containerd's upstream-layout archive for `arch` (`containerd-V-linux-ARCH.tar.gz`).
pub fn containerd_archive_for(version: &str, arch: Arch) -> Result<PathBuf, BuildError> {
    run_script_for("build-containerd.sh", &[version], arch)
}

/// A static runc of this host's architecture (`build-runc.sh`), which machines of another
/// architecture run natively ([`crate::arch`]: qemu-user cannot emulate runc's clone into new
/// namespaces).
pub fn native_runc(version: &str) -> Result<PathBuf, BuildError> {
    run_script("build-runc.sh", &[version])
}

/// The OCI layout of what a worker of `arch` pulls from the registry: kube-proxy, pause and the
/// tests' echo image (`images.sh build-node`).
pub fn node_images(kubernetes: &str, pause: &str, arch: Arch) -> Result<PathBuf, BuildError> {
    run_script_for("images.sh", &["build-node", kubernetes, pause], arch)
}

/// An OCI layout in which every tag `first` shares with one of `others` is a multi-platform
/// index (`images.sh index`); push it after `first`.
pub fn multi_platform(first: &Path, others: &[PathBuf]) -> Result<PathBuf, BuildError> {
    let mut args = vec!["index".to_string(), first.display().to_string()];
    args.extend(others.iter().map(|p| p.display().to_string()));
    run_script("images.sh", &args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// The OCI layout holding every image the cluster runs (built once per input).
pub fn images(kubernetes: &str, etcd: &str, pause: &str) -> Result<PathBuf, BuildError> {
    run_script("images.sh", &["build", kubernetes, etcd, pause])
}

/// The directory holding the upstream e2e suite of `version` (`e2e.test`, `ginkgo`, `agnhost`,
/// `conformance.yaml`; built once by `build-e2e.sh`).
pub fn e2e_suite(version: &str) -> Result<PathBuf, BuildError> {
    run_script("build-e2e.sh", &[version])
}

/// Build (once) the images the e2e suite of `version` runs and push them to `registry`; the OCI
/// layout holding them.
pub fn conformance_images(version: &str, registry: &str) -> Result<PathBuf, BuildError> {
    run_script("images.sh", &["conformance-images", version, registry])
}

/// Write `file`, the suite's `KUBE_TEST_REPO_LIST` naming `registry` for every image it pulls.
pub fn conformance_repo_list(registry: &str, file: &Path) -> Result<PathBuf, BuildError> {
    run_script("images.sh", &["conformance-repo-list", registry, &file.to_string_lossy()])
}

/// The AWS cloud-controller-manager the local cloud runs: cloud-provider-aws releases follow
/// Kubernetes minors, and this one is built for (and tested against) Kubernetes 1.34 — the versions
/// table's default image (v1.36.1, kOps' choice for every minor) is newer than the 1.34 API server the
/// version-skew policy allows it to talk to. The harness sets it as `spec.cloudControllerManager.image`.
pub const AWS_CCM_VERSION: &str = "1.34.4";

/// The OCI layout holding `provider-aws-cloud-controller-manager:v<version>` (built once).
pub fn ccm_image(version: &str) -> Result<PathBuf, BuildError> {
    run_script("images.sh", &["build-ccm", version])
}

/// The GCE cloud-controller-manager the local cloud runs on GCE clusters: k8s.io/cloud-provider's
/// generic command with the GCE provider of `k8s.io/cloud-provider-gcp/providers` at this version
/// (tests/kubernetes/gce-ccm/main.go; the module with cloud-provider-gcp's own command is not on the
/// Go module proxy), built against k8s.io/cloud-provider at [`GCE_CCM_CLOUD_PROVIDER_VERSION`] (the
/// Kubernetes 1.34 libraries, like the API server it talks to). Set as `spec.cloudControllerManager.image`.
pub const GCE_CCM_PROVIDERS_VERSION: &str = "0.28.2";
pub const GCE_CCM_CLOUD_PROVIDER_VERSION: &str = "0.34.4";

/// The cloud-controller-manager image a local cluster runs, by cloud.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ccm {
    Aws,
    Gce,
}

impl Ccm {
    /// The OCI layout holding the image (built once).
    pub fn layout(self) -> Result<PathBuf, BuildError> {
        match self {
            Ccm::Aws => ccm_image(AWS_CCM_VERSION),
            Ccm::Gce => run_script("images.sh", &["build-gce-ccm", GCE_CCM_PROVIDERS_VERSION, GCE_CCM_CLOUD_PROVIDER_VERSION]),
        }
    }

    /// Its name in `registry` once pushed.
    pub fn reference(self, registry: &str) -> String {
        match self {
            Ccm::Aws => format!("{registry}/provider-aws-cloud-controller-manager:v{AWS_CCM_VERSION}"),
            Ccm::Gce => format!("{registry}/gcp-cloud-controller-manager:v{GCE_CCM_PROVIDERS_VERSION}"),
        }
    }
}

/// The CoreDNS the local cloud runs: the versions table's (kOps') pin, `registry.k8s.io/coredns/coredns:v1.14.2`,
/// built from its Go module by `images.sh build-coredns` under the name the compiler remaps it to
/// (`coredns-coredns`). The harness sets it as `spec.kubeDNS.coreDNSImage`, as it does the CCM's, so the
/// image it serves and the one the addon names cannot drift apart when the table moves on.
pub const COREDNS_VERSION: &str = "1.14.2";

/// The OCI layout holding `coredns-coredns:v<version>` (built once).
pub fn coredns_image(version: &str) -> Result<PathBuf, BuildError> {
    run_script("images.sh", &["build-coredns", version])
}

/// The metrics-server the local cloud runs when the spec enables it: the versions table's (kOps')
/// pin, `registry.k8s.io/metrics-server/metrics-server:v0.8.0`, built from its Go module by
/// `images.sh build-metrics-server` under the name the compiler remaps it to (`metrics-server-metrics-server`).
pub const METRICS_SERVER_VERSION: &str = "0.8.0";

/// `metrics-server-metrics-server:v<version>` in `registry` (what the local spec sets as
/// `spec.metricsServer.image`).
pub fn metrics_server_ref(registry: &str) -> String {
    format!("{registry}/metrics-server-metrics-server:v{METRICS_SERVER_VERSION}")
}

/// The OCI layout holding `metrics-server-metrics-server:v<version>` (built once).
pub fn metrics_server_image(version: &str) -> Result<PathBuf, BuildError> {
    run_script("images.sh", &["build-metrics-server", version])
}

/// The flannel the local cloud runs when the spec sets `networking.flannel`: the compiler's base
/// manifest's release (the versions table's `FLANNEL_VERSION`), its flanneld and CNI plugin built
/// from Go modules by `images.sh build-flannel` under the names the compiler remaps upstream's
/// `ghcr.io/flannel-io/...` images to. [`flannel_refs`] names them so the harness can check the
/// compiled addon asks for exactly these.
pub const FLANNEL_VERSION: &str = "0.28.4";
/// The tag of upstream's `flannel-cni-plugin` image in that release's manifest.
pub const FLANNEL_CNI_PLUGIN_TAG: &str = "1.9.1-flannel1";

/// flanneld's and the CNI plugin's images in `registry`.
pub fn flannel_refs(registry: &str) -> [String; 2] {
    [format!("{registry}/ghcr.io-flannel-io-flannel:v{FLANNEL_VERSION}"), format!("{registry}/ghcr.io-flannel-io-flannel-cni-plugin:v{FLANNEL_CNI_PLUGIN_TAG}")]
}

/// The OCI layout holding both flannel images (built once).
pub fn flannel_images() -> Result<PathBuf, BuildError> {
    run_script("images.sh", &["build-flannel", FLANNEL_VERSION, FLANNEL_CNI_PLUGIN_TAG])
}

/// Copy every image of `layout` to `registry` (`host:port`); blobs already there are skipped.
pub fn push(layout: &Path, registry: &str) -> Result<(), BuildError> {
    let script = scripts_dir().join("images.sh");
    cmd::run(Command::new(&script).arg("push").arg(layout).arg(registry).env("KEELSON_LOCAL_CACHE", crate::paths::cache_dir()))
        .map(|_| ())
        .map_err(|source| BuildError::Script { script: format!("{} push", script.display()), source })
}

/// The tests' workload image in the cluster layout ([`images`]): an app of the tests', not the cluster's.
pub const ECHO_IMAGE: &str = "keelson-test/echo:1";

/// Copy one image (`reference`, as named in `layout`'s index) to `registry` with skopeo.
pub fn push_one(layout: &Path, reference: &str, registry: &str) -> Result<(), BuildError> {
    cmd::run(
        Command::new("skopeo")
            .args(["copy", "--quiet", "--dest-tls-verify=false"])
            .arg(format!("oci:{}:{reference}", layout.display()))
            .arg(format!("docker://{registry}/{reference}")),
    )
    .map(|_| ())
    .map_err(|source| BuildError::Script { script: format!("skopeo copy of {reference} to {registry}"), source })
}

/// A running `docker-registry` (killed on drop).
pub struct Registry {
    child: Child,
}

impl Registry {
    /// Serve a registry on `addr:port`, storing blobs under `storage` (kept between runs, so images
    /// are pushed once).
    pub fn start(addr: &str, port: u16, storage: &Path, log: &Path) -> Result<Registry, BuildError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| BuildError::Io { path, source }
        };
        fs::create_dir_all(storage).map_err(io(storage))?;
        let config = storage.with_extension("yml");
        let text = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: false\nhttp:\n  addr: {addr}:{port}\n",
            storage.display()
        );
        fs::write(&config, text).map_err(io(&config))?;
        let logf = fs::File::create(log).map_err(io(log))?;
        let logf2 = logf.try_clone().map_err(io(log))?;
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(logf)
            .stderr(logf2)
            .spawn()
            .map_err(|e| BuildError::Registry(format!("starting docker-registry (apt-get install docker-registry; scripts/test installs it): {e}")))?;
        let mut r = Registry { child };
        let socket: std::net::SocketAddr = format!("{addr}:{port}").parse().map_err(|e| BuildError::Registry(format!("{addr}:{port}: {e}")))?;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if std::net::TcpStream::connect_timeout(&socket, Duration::from_millis(200)).is_ok() {
                return Ok(r);
            }
            if let Ok(Some(st)) = r.child.try_wait() {
                let tail = fs::read_to_string(log).unwrap_or_default();
                return Err(BuildError::Registry(format!("docker-registry exited ({st}): {}", tail.lines().rev().take(5).collect::<Vec<_>>().join(" | "))));
            }
            if Instant::now() > deadline {
                let _ = r.child.kill();
                return Err(BuildError::Registry(format!("docker-registry did not listen on {addr}:{port} within 20 s (see {})", log.display())));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
