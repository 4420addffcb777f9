//! `keelson bundle bake`: a bundle's files and images installed into a machine image's root
//! filesystem, the way EKS' AMI build pre-caches images, so a machine booted from it downloads and
//! unpacks nothing:
//!
//! * every file of the architecture goes through nodeup's own fetcher into nodeup's hash-keyed
//!   cache under the root ([`nodeup::paths::CACHE_DIR`]): verified by sha256 and unpacked exactly as
//!   at boot, where nodeup then finds it by hash and downloads nothing; the nodeup build itself also
//!   goes where the user-data script looks before downloading it (`INSTALL_DIR/bin/nodeup`, kept when
//!   its sha256 matches);
//! * every image is imported into containerd's store under the root (`--containerd-root`, default
//!   containerd's `/var/lib/containerd`) by the bundle's own containerd (the version the nodes run,
//!   so the store's format is theirs), unpacked into the overlayfs snapshotter, named as the nodes
//!   ask for it — the `assets.containerRegistry` rewrite of `--registry` (the one `bundle push` uses),
//!   by tag and by digest — and labelled pinned, so the kubelet's image GC keeps it and the kubelet
//!   finds it present instead of pulling.
//!
//! The temporary containerd runs with its own state directory and socket beside the bundle and
//! without its CRI plugins; it needs root (the snapshotter mounts), as an image build does.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nodeup::assets::{Asset, AssetError, FetchOptions, Fetcher};

use crate::manifest::{BundleManifest, ManifestError, IMAGES_DIR, MANIFEST_FILE};
use crate::paths;

/// containerd's own default root, where nodes keep images unless the spec sets `containerd.root`.
pub const DEFAULT_CONTAINERD_ROOT: &str = keelson_api::host_paths::CONTAINERD_ROOT;
/// The snapshotter nodes' containerd unpacks into (containerd's default; nodeup does not change it).
pub const SNAPSHOTTER: &str = "overlayfs";
/// The containerd namespace the CRI (the kubelet) uses.
pub const CRI_NAMESPACE: &str = "k8s.io";
/// Labels of a baked image: the CRI treats it as its own and the kubelet's image GC never removes it.
pub const PINNED_LABELS: [&str; 2] = ["io.cri-containerd.image=managed", "io.cri-containerd.pinned=pinned"];
/// How long the temporary containerd may take to open its socket.
const CONTAINERD_START: Duration = Duration::from_secs(30);
/// How long it gets to exit after SIGTERM before it is killed.
const CONTAINERD_STOP: Duration = Duration::from_secs(10);

/// Why a bake failed.
#[derive(Debug, thiserror::Error)]
pub enum BakeError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{bundle}: {source}")]
    Manifest {
        bundle: PathBuf,
        #[source]
        source: ManifestError,
    },
    #[error("{bundle}: holds no {arch} files (its architectures: {arches}); bake one of those or make a bundle with --arch {arch}")]
    Arch { bundle: PathBuf, arch: String, arches: String },
    #[error("file {url} ({arch}): {source}")]
    File {
        url: String,
        arch: String,
        #[source]
        source: Box<AssetError>,
    },
    #[error("{bundle}: no containerd archive for {arch}: the images cannot be imported without the nodes' containerd")]
    NoContainerd { bundle: PathBuf, arch: String },
    #[error("{what}: {program}: {message}")]
    Command { what: String, program: String, message: String },
    #[error("the temporary containerd did not open {socket} within {secs} s; its log ({log}):\n{tail}")]
    ContainerdStart { socket: PathBuf, secs: u64, log: PathBuf, tail: String },
    #[error("image {reference}: {message}")]
    Image { reference: String, message: String },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> BakeError + '_ {
    move |source| BakeError::Io { path: path.to_path_buf(), source }
}

/// Where a bake goes and what it names things.
#[derive(Debug, Clone)]
pub struct BakeOptions {
    /// The machine image's root filesystem.
    pub root: PathBuf,
    /// The cluster's `assets.containerRegistry`, if it has one: images are named as nodes ask for them.
    pub registry: Option<String>,
    /// The architecture to bake (`amd64`, `arm64`); default: this machine's.
    pub arch: Option<String>,
    /// containerd's root inside `root` ([`DEFAULT_CONTAINERD_ROOT`], or the spec's `containerd.root`).
    pub containerd_root: String,
}

/// What a bake did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BakeReport {
    pub arch: String,
    /// Files verified into the cache.
    pub files_added: usize,
    /// Files the cache already had (by sha256).
    pub files_present: usize,
    /// The names images were given, each by tag (or as given) and by digest.
    pub images: Vec<String>,
}

impl std::fmt::Display for BakeReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "baked {}: {} files ({} added, {} already there), {} images",
            self.arch,
            self.files_added + self.files_present,
            self.files_added,
            self.files_present,
            self.images.len()
        )
    }
}

/// `/a/b` under `root` (`root/a/b`).
pub fn under(root: &Path, abs: &str) -> PathBuf {
    root.join(abs.trim_start_matches('/'))
}

/// The names a baked image gets: what the nodes' manifests say (`reference` after the registry
/// rewrite) and the same repository by `digest` (a reference pinned by digest resolves to this one),
/// both normalised as the CRI normalises the kubelet's references (`docker.io/library/…`).
pub fn node_names(reference: &str, digest: &str, registry: Option<&str>) -> Result<Vec<String>, String> {
    let named = match registry {
        Some(r) => paths::registry_reference(reference, r),
        None => reference.to_string(),
    };
    let parsed: oci_client::Reference = named.parse().map_err(|e: oci_client::ParseError| format!("{named:?}: {e}"))?;
    let by_digest = oci_client::Reference::with_digest(parsed.registry().to_string(), parsed.repository().to_string(), digest.to_string()).whole();
    let mut names = Vec::new();
    // A reference with a tag (or neither tag nor digest: `latest`) is asked for by that tag too.
    if parsed.digest().is_none() || parsed.tag().is_some() {
        let tag = parsed.tag().unwrap_or("latest");
        names.push(oci_client::Reference::with_tag(parsed.registry().to_string(), parsed.repository().to_string(), tag.to_string()).whole());
    }
    names.push(by_digest);
    names.dedup();
    Ok(names)
}

/// Bake `bundle` into `opts.root` (see the module documentation).
pub fn bake(bundle: &Path, opts: &BakeOptions) -> Result<BakeReport, BakeError> {
    let dir = crate::push::unpack_bundle(bundle).map_err(|(path, source)| BakeError::Io { path, source })?;
    let manifest_path = dir.path().join(MANIFEST_FILE);
    let bytes = std::fs::read(&manifest_path).map_err(io_err(&manifest_path))?;
    let manifest = BundleManifest::parse(&bytes).map_err(|source| BakeError::Manifest { bundle: bundle.to_path_buf(), source })?;
    let arch = opts.arch.clone().unwrap_or_else(|| nodeup::assets::host_arch().to_string());
    if !manifest.arches.contains(&arch) {
        return Err(BakeError::Arch { bundle: bundle.to_path_buf(), arch, arches: manifest.arches.join(", ") });
    }
    let mut report = BakeReport { arch: arch.clone(), ..Default::default() };

    // Files: nodeup's fetcher, from the unpacked bundle, into nodeup's cache under the root.
    let fetcher = Fetcher::new(FetchOptions::default(), under(&opts.root, nodeup::paths::CACHE_DIR)).map_err(|e| BakeError::File {
        url: String::new(),
        arch: arch.clone(),
        source: Box::new(e),
    })?;
    let mut containerd_bin = None;
    let files: Vec<_> = manifest.files.iter().filter(|f| f.arch == arch).collect();
    for (i, f) in files.iter().enumerate() {
        let local = dir.path().join(&f.path);
        let file_err = |e: AssetError| BakeError::File { url: f.url.clone(), arch: f.arch.clone(), source: Box::new(e) };
        let asset = Asset::parse(&format!("{}@file://{}", f.sha256, local.display())).map_err(file_err)?;
        if fetcher.is_cached(&asset) {
            report.files_present += 1;
            tracing::info!(target: "bundle", "file {}/{} {}: already baked", i + 1, files.len(), f.url);
        } else {
            fetcher.fetch(&asset).map_err(file_err)?;
            report.files_added += 1;
            tracing::info!(target: "bundle", "file {}/{} {}: baked ({} bytes)", i + 1, files.len(), f.url, f.size);
        }
        if asset.file_name == "nodeup" {
            let dest = under(&opts.root, &format!("{}/bin/nodeup", keelson_api::host_paths::INSTALL_DIR));
            install_executable(&fetcher.cached_file(&f.sha256), &dest)?;
        }
        if asset.is_archive() && asset.file_name.starts_with("containerd-") {
            containerd_bin = Some(fetcher.cached_dir(&f.sha256));
        }
    }
    if manifest.images.is_empty() {
        return Ok(report);
    }

    // Images: the bundle's containerd, on the root's store.
    let bin = containerd_bin.ok_or_else(|| BakeError::NoContainerd { bundle: bundle.to_path_buf(), arch: arch.clone() })?;
    let archive = dir.path().join("images.oci.tar");
    write_oci_archive(&dir.path().join(IMAGES_DIR), &archive)?;
    let containerd = TempContainerd::start(&bin, &under(&opts.root, &opts.containerd_root), dir.path())?;
    let platform = format!("linux/{arch}");
    containerd.ctr("importing the bundle's images", &["images", "import", "--platform", &platform, "--snapshotter", SNAPSHOTTER, &path_str(&archive)])?;
    let total = manifest.images.len();
    for (i, image) in manifest.images.iter().enumerate() {
        let names = node_names(&image.reference, &image.digest, opts.registry.as_deref())
            .map_err(|message| BakeError::Image { reference: image.reference.clone(), message })?;
        for name in &names {
            if name != &image.reference {
                containerd.ctr(&format!("image {}", image.reference), &["images", "tag", "--force", &image.reference, name])?;
            }
            let mut label = vec!["images", "label", name.as_str()];
            label.extend(PINNED_LABELS);
            containerd.ctr(&format!("image {name}"), &label)?;
        }
        if !names.contains(&image.reference) {
            // Only the names nodes ask for stay (the content stays with them).
            containerd.ctr(&format!("image {}", image.reference), &["images", "rm", &image.reference])?;
        }
        tracing::info!(target: "bundle", "image {}/{total} {}: baked as {}", i + 1, image.reference, names.join(", "));
        report.images.extend(names);
    }
    containerd.stop();
    Ok(report)
}

fn path_str(p: &Path) -> String {
    p.display().to_string()
}

/// Put `src` at `dest` (mode 0755), replacing what is there atomically.
fn install_executable(src: &Path, dest: &Path) -> Result<(), BakeError> {
    // A hard link within the root (user-data replaces the file by rename, never in place), a copy
    // across file systems; atomic either way.
    base::fs::link_atomic(src, dest, 0o755).map_err(|e| BakeError::Io { path: e.path, source: e.source })
}

/// The bundle's OCI image layout as one `oci-archive` tar (what `ctr images import` reads).
fn write_oci_archive(layout: &Path, archive: &Path) -> Result<(), BakeError> {
    let file = std::fs::File::create(archive).map_err(io_err(archive))?;
    let mut tar = tar::Builder::new(std::io::BufWriter::new(file));
    tar.follow_symlinks(false);
    tar.append_dir_all(".", layout).map_err(io_err(layout))?;
    tar.into_inner().and_then(|w| w.into_inner().map_err(|e| e.into_error())).map_err(io_err(archive))?;
    Ok(())
}

/// A containerd of the bundle's, on a root's store, with its own state and socket; stopped when dropped.
struct TempContainerd {
    child: Option<Child>,
    ctr: PathBuf,
    socket: PathBuf,
}

impl TempContainerd {
    fn start(bin: &Path, store: &Path, work: &Path) -> Result<TempContainerd, BakeError> {
        std::fs::create_dir_all(store).map_err(io_err(store))?;
        let state = work.join("containerd-state");
        std::fs::create_dir_all(&state).map_err(io_err(&state))?;
        let socket = work.join("containerd.sock");
        let config = work.join("containerd.toml");
        let text = containerd_config(store, &state, &socket);
        std::fs::write(&config, text).map_err(io_err(&config))?;
        let log = work.join("containerd.log");
        let log_file = std::fs::File::create(&log).map_err(io_err(&log))?;
        let containerd = bin.join("containerd");
        let child = Command::new(&containerd)
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().map_err(io_err(&log))?)
            .stderr(log_file)
            .spawn()
            .map_err(|e| BakeError::Command { what: "starting the temporary containerd".into(), program: path_str(&containerd), message: e.to_string() })?;
        let mut c = TempContainerd { child: Some(child), ctr: bin.join("ctr"), socket };
        let start = Instant::now();
        while !c.socket.exists() {
            let exited = c.child.as_mut().and_then(|ch| ch.try_wait().ok().flatten());
            if exited.is_some() || start.elapsed() > CONTAINERD_START {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(20).collect();
                let tail = tail.into_iter().rev().collect::<Vec<_>>().join("\n");
                return Err(BakeError::ContainerdStart { socket: c.socket.clone(), secs: CONTAINERD_START.as_secs(), log, tail });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(c)
    }

    fn ctr(&self, what: &str, args: &[&str]) -> Result<(), BakeError> {
        let out = Command::new(&self.ctr)
            .arg("--address")
            .arg(&self.socket)
            .args(["--namespace", CRI_NAMESPACE])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| BakeError::Command { what: what.to_string(), program: path_str(&self.ctr), message: e.to_string() })?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let message = stderr.lines().filter(|l| !l.contains("level=warning")).collect::<Vec<_>>().join("; ");
            return Err(BakeError::Command { what: what.to_string(), program: format!("ctr {}", args.join(" ")), message });
        }
        Ok(())
    }

    /// SIGTERM, then SIGKILL after [`CONTAINERD_STOP`].
    fn stop(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).output();
        let start = Instant::now();
        while start.elapsed() < CONTAINERD_STOP {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for TempContainerd {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// The temporary containerd's configuration: the root's store, its own state and socket, no CRI.
pub fn containerd_config(store: &Path, state: &Path, socket: &Path) -> String {
    let path = |p: &Path| toml::Value::String(p.display().to_string());
    let address = |a: String| toml::Table::from_iter([("address".to_string(), toml::Value::String(a))]);
    let disabled = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images", "io.containerd.nri.v1.nri"];
    let mut t = toml::Table::new();
    t.insert("version".into(), toml::Value::Integer(3));
    t.insert("root".into(), path(store));
    t.insert("state".into(), path(state));
    t.insert("disabled_plugins".into(), toml::Value::Array(disabled.iter().map(|p| toml::Value::String(p.to_string())).collect()));
    t.insert("grpc".into(), toml::Value::Table(address(socket.display().to_string())));
    t.insert("ttrpc".into(), toml::Value::Table(address(format!("{}.ttrpc", socket.display()))));
    t.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:f0a5910a34f08c92f2af4d62392c5e9aab192a7807579b5a23dd165929e9a9e7";

    #[test]
    fn images_are_named_as_nodes_ask_for_them() {
        assert_eq!(
            node_names("registry.k8s.io/etcd:v3.6.12", D, Some("10.0.0.1:5000")).expect("names"),
            vec!["10.0.0.1:5000/etcd:v3.6.12".to_string(), format!("10.0.0.1:5000/etcd@{D}")]
        );
        assert_eq!(
            node_names("registry.k8s.io/provider-aws/cloud-controller-manager:v1.34.4", D, Some("10.0.0.1:5000")).expect("names"),
            vec!["10.0.0.1:5000/provider-aws-cloud-controller-manager:v1.34.4".to_string(), format!("10.0.0.1:5000/provider-aws-cloud-controller-manager@{D}")]
        );
        // No registry: upstream names, Docker Hub's normalised as the CRI normalises them.
        assert_eq!(
            node_names("busybox", D, None).expect("names"),
            vec!["docker.io/library/busybox:latest".to_string(), format!("docker.io/library/busybox@{D}")]
        );
        // A reference pinned by digest only: named by that digest alone.
        assert_eq!(node_names(&format!("quay.io/cilium/cilium@{D}"), D, None).expect("names"), vec![format!("quay.io/cilium/cilium@{D}")]);
        assert!(node_names("Not A Reference", D, None).is_err());
    }

    #[test]
    fn the_temporary_containerd_has_no_cri_and_its_own_socket() {
        let c = containerd_config(Path::new("/r/var/lib/containerd"), Path::new("/w/state"), Path::new("/w/c\"d.sock"));
        let v: toml::Table = c.parse().expect("TOML");
        assert_eq!(v.get("root").and_then(|r| r.as_str()), Some("/r/var/lib/containerd"));
        assert_eq!(v.get("grpc").and_then(|g| g.get("address")).and_then(|a| a.as_str()), Some("/w/c\"d.sock"));
        let disabled = v.get("disabled_plugins").and_then(|d| d.as_array()).expect("disabled_plugins");
        assert!(disabled.iter().any(|p| p.as_str() == Some("io.containerd.grpc.v1.cri")), "{c}");
    }

    /// A bundle archive of `files` (`(canonical URL, arch, content)`) and no image.
    fn bundle_of(dir: &Path, files: &[(&str, &str, &[u8])], tamper: bool) -> PathBuf {
        use sha2::Digest as _;
        let mut listed = Vec::new();
        let path = dir.join("b.tar");
        let mut tar = tar::Builder::new(std::fs::File::create(&path).expect("create"));
        let mut add = |name: &str, bytes: &[u8]| {
            let mut h = tar::Header::new_gnu();
            h.set_size(bytes.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            tar.append_data(&mut h, name, bytes).expect("append");
        };
        let mut contents = Vec::new();
        for (url, arch, bytes) in files {
            let at = crate::paths::bundle_path(url).expect("path");
            listed.push(crate::manifest::BundleFile {
                url: url.to_string(),
                sha256: hex::encode(sha2::Sha256::digest(bytes)),
                arch: arch.to_string(),
                size: bytes.len() as u64,
                path: at.clone(),
            });
            contents.push((at, if tamper { b"tampered".to_vec() } else { bytes.to_vec() }));
        }
        let manifest = BundleManifest::new("1.34.4", Default::default(), vec!["amd64".into()], listed, vec![]);
        add(MANIFEST_FILE, &manifest.to_json());
        for (at, bytes) in &contents {
            add(at, bytes);
        }
        tar.finish().expect("finish");
        path
    }

    #[test]
    fn files_go_into_nodeups_cache_by_hash_and_a_tampered_one_is_refused() {
        use sha2::Digest as _;
        let d = tempfile::tempdir().expect("tempdir");
        let runc: &[u8] = b"a runc build";
        let nodeup_bin: &[u8] = b"a nodeup build";
        let files = [
            ("https://github.com/opencontainers/runc/releases/download/v1.3.3/runc.amd64", "amd64", runc),
            ("https://artifacts.example.com/keelson/nodeup", "amd64", nodeup_bin),
        ];
        let bundle = bundle_of(d.path(), &files, false);
        let root = d.path().join("root");
        let opts = BakeOptions { root: root.clone(), registry: None, arch: Some("amd64".into()), containerd_root: DEFAULT_CONTAINERD_ROOT.into() };
        let report = bake(&bundle, &opts).expect("bake");
        assert_eq!((report.files_added, report.files_present, report.images.len()), (2, 0, 0));
        let cached = under(&root, nodeup::paths::CACHE_DIR).join("sha256").join(hex::encode(sha2::Sha256::digest(runc)));
        assert_eq!(std::fs::read(&cached).expect("in nodeup's cache"), runc);
        let installed = under(&root, &format!("{}/bin/nodeup", keelson_api::host_paths::INSTALL_DIR));
        assert_eq!(std::fs::read(&installed).expect("where user-data looks"), nodeup_bin);
        // Again: everything is already there.
        let again = bake(&bundle, &opts).expect("bake again");
        assert_eq!((again.files_added, again.files_present), (0, 2));

        // Another architecture than the bundle's: refused, naming what it holds.
        let e = bake(&bundle, &BakeOptions { arch: Some("arm64".into()), ..opts.clone() }).expect_err("arm64").to_string();
        assert!(e.contains("no arm64 files") && e.contains("amd64"), "{e}");

        // A file whose bytes are not the ones bundle.json names: refused, naming it; nothing cached.
        let t = tempfile::tempdir().expect("tempdir");
        let tampered = bundle_of(t.path(), &files[..1], true);
        let root2 = t.path().join("root");
        let e = bake(&tampered, &BakeOptions { root: root2.clone(), ..opts.clone() }).expect_err("tampered");
        assert!(e.to_string().contains("runc.amd64") && e.to_string().contains("sha256"), "{e}");
        let cache2 = under(&root2, nodeup::paths::CACHE_DIR).join("sha256");
        assert!(std::fs::read_dir(&cache2).map(|mut r| r.next().is_none()).unwrap_or(true), "nothing cached from a tampered bundle");
    }

    #[test]
    fn paths_under_a_root() {
        assert_eq!(under(Path::new("/mnt/img"), "/var/cache/nodeup"), PathBuf::from("/mnt/img/var/cache/nodeup"));
    }
}
