//! `keelson bundle create`: the spec compiled *without* its `assets.fileRepository`,
//! `containerRegistry` and `containerProxy` (so every file has its canonical URL and every image
//! its original reference, the names `push` rewrites for the target), then
//!
//! * each file downloaded from `--from-mirror` (where the compiler's `fileRepository` rewrite puts
//!   it under that base) or from its URL, hashed while streaming and refused on a sha256 other than
//!   the versions table's;
//! * each image copied from `--from-registry` (the compiler's `containerRegistry` rewrite of its
//!   reference) or its own registry: the manifest or index (only the bundle's architectures;
//!   a reference pinned by digest keeps its index whole, so the digest nodes ask for is the one
//!   pushed), each architecture's manifest, config and layers, every blob verified by digest;
//! * everything written into a work directory beside the output (`<output>.partial/`), then
//!   archived (a tar, entries sorted, no timestamps) and renamed into place; the work directory is
//!   removed only after that. A failed or interrupted run is resumed by running it again: files
//!   and blobs already in the work directory are re-hashed and reused.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use keelson_api::Documents;
use oci_client::{Client, Reference};
use oci_spec::image::{Descriptor, ImageIndex, ImageManifest, MediaType};
use spec_compiler::assets::{FileAsset, ImageAsset};
use spec_compiler::complete::CompileOptions;
use spec_compiler::versions::Arch;

use crate::layout::{sha256_file, Layout, LayoutError};
use crate::manifest::{ArchManifest, BundleFile, BundleImage, BundleManifest, IMAGES_DIR, MANIFEST_FILE};
use crate::paths::{self, PathError};
use crate::registry::{self, ANONYMOUS, MANIFEST_TYPES};

/// Why a bundle could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error("compiling the spec: {0}")]
    Compile(Box<spec_compiler::CompileError>),
    #[error("listing the spec's assets: {0}")]
    Assets(Box<spec_compiler::assets::AssetsError>),
    #[error("the spec's versions: {0}")]
    Versions(Box<spec_compiler::CompleteError>),
    #[error(transparent)]
    Path(#[from] PathError),
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error(transparent)]
    PlainHttp(#[from] keelson_api::plain_http::PlainHttpRefused),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("file {url} ({arch}): downloading {from}: {message}")]
    Download { url: String, arch: String, from: String, message: String },
    #[error("file {url} ({arch}): {from} has sha256 {actual}, the spec's versions table says {expected}: refused")]
    FileHash { url: String, arch: String, from: String, expected: String, actual: String },
    #[error("image {reference}: {source_reference:?} is not an image reference: {message}")]
    Reference { reference: String, source_reference: String, message: String },
    #[error("image {reference}: {op} {from}: {source}")]
    Registry {
        reference: String,
        op: &'static str,
        from: String,
        #[source]
        source: Box<oci_client::errors::OciDistributionError>,
    },
    #[error("image {reference}: {from} has digest {served}, the spec pins {pinned}: refused")]
    ImageDigest { reference: String, from: String, pinned: String, served: String },
    #[error("image {reference}: {from} has no linux manifest for {arches} (it has: {available})")]
    NoPlatform { reference: String, from: String, arches: String, available: String },
    #[error("image {reference}: manifest {digest}: {message}")]
    Manifest { reference: String, digest: String, message: String },
    #[error("starting the async runtime: {0}")]
    Runtime(std::io::Error),
}

impl From<spec_compiler::CompileError> for CreateError {
    fn from(e: spec_compiler::CompileError) -> CreateError {
        CreateError::Compile(Box::new(e))
    }
}

impl From<spec_compiler::assets::AssetsError> for CreateError {
    fn from(e: spec_compiler::assets::AssetsError) -> CreateError {
        CreateError::Assets(Box::new(e))
    }
}

impl From<spec_compiler::CompleteError> for CreateError {
    fn from(e: spec_compiler::CompleteError) -> CreateError {
        CreateError::Versions(Box::new(e))
    }
}

/// What a bundle of a spec holds: its canonical files (of the bundle's architectures) and images.
#[derive(Debug, Clone)]
pub struct Plan {
    pub files: Vec<FileAsset>,
    pub images: Vec<ImageAsset>,
    pub kubernetes_version: String,
    pub versions: BTreeMap<String, String>,
    pub arches: Vec<Arch>,
}

/// Compile `docs` without its mirrors (`assets.*` cleared) and list what a bundle of it holds for
/// `arches` (empty: every architecture).
///
/// A file's sha256 is the one the spec's own nodes verify: `options.asset_hashes` may name it by its
/// canonical URL or, as for a mirror serving local builds under upstream names, by the URL the spec's
/// `assets.fileRepository` rewrites it to (the key `keelson compile --asset-hashes` reads either way).
pub fn plan(docs: &Documents, options: &CompileOptions, arches: &[Arch]) -> Result<Plan, CreateError> {
    let arches = if arches.is_empty() { Arch::ALL.to_vec() } else { arches.to_vec() };
    let mut canonical = docs.clone();
    canonical.cluster.spec.assets = None;
    let compiled = spec_compiler::compile(&canonical, options)?;
    let mut list = spec_compiler::assets::list(&compiled, options)?.for_arches(&arches);
    let repository = docs.cluster.spec.assets.as_ref().and_then(|a| a.file_repository.as_deref());
    for f in list.files.iter_mut().filter(|f| !options.asset_hashes.contains_key(&f.url)) {
        let mirrored = repository.and_then(|r| spec_compiler::versions::remap_file_url(&f.url, Some(r)).ok());
        if let Some(sha) = mirrored.and_then(|m| options.asset_hashes.get(&m)) {
            f.sha256 = sha.clone();
        }
    }
    let v = spec_compiler::complete::versions_for(&compiled.completed.spec, options)?;
    let mut versions = BTreeMap::from([
        ("kubernetes".to_string(), v.kubernetes_version().to_string()),
        ("containerd".to_string(), v.containerd_version().to_string()),
        ("runc".to_string(), v.runc_version().to_string()),
        ("etcd".to_string(), v.etcd_version().to_string()),
    ]);
    if let Some(cni) = v.cni_version_opt() {
        versions.insert("cniPlugins".to_string(), cni.to_string());
    }
    Ok(Plan { files: list.files, images: list.images, kubernetes_version: v.kubernetes_version().to_string(), versions, arches })
}

/// Where `create` reads from and writes to.
#[derive(Debug, Clone, Default)]
pub struct CreateOptions {
    /// The archive to write.
    pub output: PathBuf,
    /// A file mirror laid out as `assets.fileRepository` expects (`http://…`, `https://…`, `file://…`).
    pub from_mirror: Option<String>,
    /// A registry (`HOST[:PORT]`) laid out as `assets.containerRegistry` expects.
    pub from_registry: Option<String>,
}

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CreateReport {
    pub files: usize,
    pub images: usize,
    pub blobs: usize,
    /// Bytes fetched in this run.
    pub downloaded_bytes: u64,
    /// Bytes found verified in the work directory (a resumed run).
    pub reused_bytes: u64,
    /// The archive's size.
    pub archive_bytes: u64,
    pub manifest: Option<BundleManifest>,
}

impl std::fmt::Display for CreateReport {
    /// The one-line summary (without the output's name).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} files, {} images ({} blobs), {} bytes ({} downloaded, {} reused)",
            self.files, self.images, self.blobs, self.archive_bytes, self.downloaded_bytes, self.reused_bytes
        )
    }
}

/// The work directory of an output: `<output>.partial`.
pub fn work_dir(output: &Path) -> PathBuf {
    let mut name = output.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".partial");
    output.with_file_name(name)
}

/// Make the bundle (see the module documentation).
pub fn create(plan: &Plan, opts: &CreateOptions) -> Result<CreateReport, CreateError> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(CreateError::Runtime)?;
    rt.block_on(create_async(plan, opts))
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> CreateError + '_ {
    move |source| CreateError::Io { path: path.to_path_buf(), source }
}

async fn create_async(plan: &Plan, opts: &CreateOptions) -> Result<CreateReport, CreateError> {
    let work = work_dir(&opts.output);
    std::fs::create_dir_all(&work).map_err(io_err(&work))?;
    let mut report = CreateReport::default();
    let http = reqwest::Client::builder().connect_timeout(std::time::Duration::from_secs(30)).build().map_err(|e| CreateError::Download {
        url: String::new(),
        arch: String::new(),
        from: "-".into(),
        message: e.to_string(),
    })?;
    let mut files = Vec::new();
    let total = plan.files.len();
    for (i, f) in plan.files.iter().enumerate() {
        let path = paths::bundle_path(&f.url)?;
        let from = paths::source_url(&f.url, opts.from_mirror.as_deref())?;
        let (size, reused) = fetch_file(&http, f, &from, &work.join(&path)).await?;
        if reused {
            report.reused_bytes += size;
        } else {
            report.downloaded_bytes += size;
        }
        tracing::info!("file {}/{total} {} ({}): {size} bytes {}", i + 1, f.url, f.arch, if reused { "reused" } else { "downloaded" });
        files.push(BundleFile { url: f.url.clone(), sha256: f.sha256.clone(), arch: f.arch.to_string(), size, path });
    }
    report.files = files.len();

    let layout = Layout::create(&work.join(IMAGES_DIR))?;
    let mut http_registries: Vec<String> = plan.images.iter().filter_map(|i| i.reference.split('/').next().map(str::to_string)).collect();
    http_registries.extend(opts.from_registry.clone());
    http_registries.retain(|r| registry::plain_http(r, false));
    let client = registry::client(http_registries);
    let mut images = Vec::new();
    let mut index = Vec::new();
    let total = plan.images.len();
    for (i, image) in plan.images.iter().enumerate() {
        let mut copier = ImageCopier { client: &client, layout: &layout, arches: &plan.arches, blobs: 0, fetched: 0, reused: 0 };
        let (entry, descriptor) = copier.copy(image, opts.from_registry.as_deref()).await?;
        tracing::info!(
            "image {}/{total} {}: {}, {} manifest(s), {} blobs, {} bytes fetched, {} reused",
            i + 1,
            image.reference,
            entry.digest,
            entry.manifests.len(),
            copier.blobs,
            copier.fetched,
            copier.reused
        );
        report.blobs += copier.blobs;
        report.downloaded_bytes += copier.fetched;
        report.reused_bytes += copier.reused;
        index.push((image.reference.clone(), descriptor));
        images.push(entry);
    }
    layout.write_index(&index)?;
    report.images = images.len();

    let arches = plan.arches.iter().map(|a| a.as_str().to_string()).collect();
    let manifest = BundleManifest::new(&plan.kubernetes_version, plan.versions.clone(), arches, files, images);
    let manifest_path = work.join(MANIFEST_FILE);
    std::fs::write(&manifest_path, manifest.to_json()).map_err(io_err(&manifest_path))?;
    report.archive_bytes = write_archive(&work, &opts.output)?;
    std::fs::remove_dir_all(&work).map_err(io_err(&work))?;
    tracing::info!("{}: {report}", opts.output.display());
    report.manifest = Some(manifest);
    Ok(report)
}

/// Put the file at `dest` from `from`, verified; `(size, reused)`. A file already at `dest` with
/// the right sha256 is reused; one with another is replaced.
async fn fetch_file(http: &reqwest::Client, f: &FileAsset, from: &str, dest: &Path) -> Result<(u64, bool), CreateError> {
    if dest.is_file() {
        let (size, hex) = sha256_file(dest).map_err(io_err(dest))?;
        if hex == f.sha256 {
            return Ok((size, true));
        }
        std::fs::remove_file(dest).map_err(io_err(dest))?;
    }
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent).map_err(io_err(parent))?;
    }
    let mut part_name = dest.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    part_name.push(".part");
    let part = dest.with_file_name(part_name);
    let download = |message: String| CreateError::Download { url: f.url.clone(), arch: f.arch.to_string(), from: from.to_string(), message };
    let mut out = std::io::BufWriter::new(std::fs::File::create(&part).map_err(io_err(&part))?);
    let mut hasher = <sha2::Sha256 as sha2::Digest>::new();
    let mut size = 0u64;
    if let Some(local) = from.strip_prefix("file://") {
        let mut input = std::fs::File::open(local).map_err(|e| download(e.to_string()))?;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = std::io::Read::read(&mut input, &mut buf).map_err(|e| download(e.to_string()))?;
            if n == 0 {
                break;
            }
            sha2::Digest::update(&mut hasher, &buf[..n]);
            out.write_all(&buf[..n]).map_err(io_err(&part))?;
            size += n as u64;
        }
    } else {
        keelson_api::plain_http::check("asset source", from)?;
        let mut resp = http.get(from).send().await.map_err(|e| download(e.to_string()))?;
        if !resp.status().is_success() {
            return Err(download(format!("HTTP {}", resp.status().as_u16())));
        }
        while let Some(chunk) = resp.chunk().await.map_err(|e| download(e.to_string()))? {
            sha2::Digest::update(&mut hasher, &chunk);
            out.write_all(&chunk).map_err(io_err(&part))?;
            size += chunk.len() as u64;
        }
    }
    let file = out.into_inner().map_err(|e| CreateError::Io { path: part.clone(), source: e.into_error() })?;
    file.sync_all().map_err(io_err(&part))?;
    let actual = hex::encode(sha2::Digest::finalize(hasher));
    if actual != f.sha256 {
        let _ = std::fs::remove_file(&part);
        return Err(CreateError::FileHash { url: f.url.clone(), arch: f.arch.to_string(), from: from.to_string(), expected: f.sha256.clone(), actual });
    }
    std::fs::rename(&part, dest).map_err(io_err(dest))?;
    Ok((size, false))
}

/// Copies one image into the layout.
struct ImageCopier<'a> {
    client: &'a Client,
    layout: &'a Layout,
    arches: &'a [Arch],
    blobs: usize,
    fetched: u64,
    reused: u64,
}

fn platform_of(d: &Descriptor) -> (String, String) {
    d.platform().as_ref().map(|p| (p.os().to_string(), p.architecture().to_string())).unwrap_or_default()
}

impl ImageCopier<'_> {
    /// Copy `image` (from `from_registry` when given); its manifest entry and its `index.json`
    /// descriptor.
    async fn copy(&mut self, image: &ImageAsset, from_registry: Option<&str>) -> Result<(BundleImage, Descriptor), CreateError> {
        let reference = image.reference.clone();
        let from = match from_registry {
            Some(r) => paths::registry_reference(&reference, r),
            None => reference.clone(),
        };
        let src: Reference = from.parse().map_err(|e: oci_client::ParseError| CreateError::Reference {
            reference: reference.clone(),
            source_reference: from.clone(),
            message: e.to_string(),
        })?;
        let registry_err = |op: &'static str| {
            let (reference, from) = (reference.clone(), from.clone());
            move |source| CreateError::Registry { reference, op, from, source: Box::new(source) }
        };
        let (bytes, served) = self.client.pull_manifest_raw(&src, &ANONYMOUS, MANIFEST_TYPES).await.map_err(registry_err("fetching the manifest of"))?;
        if let Some(pinned) = &image.digest {
            if *pinned != served {
                return Err(CreateError::ImageDigest { reference, from, pinned: pinned.clone(), served });
            }
        }
        let media_type = registry::media_type_of(&bytes);
        let manifest_err = |digest: &str, message: String| CreateError::Manifest { reference: reference.clone(), digest: digest.to_string(), message };
        let mut manifests = Vec::new();
        let (top, source_digest) = if registry::is_index(&media_type) {
            let index: ImageIndex = serde_json::from_slice(&bytes).map_err(|e| manifest_err(&served, e.to_string()))?;
            let wanted: Vec<Descriptor> = index
                .manifests()
                .iter()
                .filter(|d| {
                    let (os, arch) = platform_of(d);
                    os == "linux" && self.arches.iter().any(|a| a.as_str() == arch)
                })
                .cloned()
                .collect();
            if wanted.is_empty() {
                let available: Vec<String> = index.manifests().iter().map(platform_of).map(|(os, arch)| format!("{os}/{arch}")).collect();
                let arches: Vec<&str> = self.arches.iter().map(|a| a.as_str()).collect();
                return Err(CreateError::NoPlatform { reference, from, arches: arches.join(","), available: available.join(", ") });
            }
            // A pinned digest must stay the digest nodes ask for: keep the index whole.
            let (top, kept, source_digest) = if wanted.len() == index.manifests().len() || image.digest.is_some() {
                (bytes.clone(), index.manifests().clone(), None)
            } else {
                let mut narrow = index.clone();
                narrow.set_manifests(wanted.clone());
                let narrowed = serde_json::to_vec(&narrow).map_err(|e| manifest_err(&served, e.to_string()))?;
                (narrowed, wanted, Some(served.clone()))
            };
            for child in &kept {
                let digest = child.digest().to_string();
                let child_ref = registry::by_digest(&src, &digest);
                let child_bytes = if self.layout.has_blob(&digest)? {
                    self.layout.read_blob(&digest)?
                } else {
                    let (b, d) = self.client.pull_manifest_raw(&child_ref, &ANONYMOUS, MANIFEST_TYPES).await.map_err(registry_err("fetching a manifest of"))?;
                    if d != digest {
                        return Err(manifest_err(&digest, format!("the registry served {d}")));
                    }
                    self.layout.put_blob(&b)?;
                    b
                };
                self.copy_blobs(&src, &digest, &child_bytes, &reference).await?;
                let (_, arch) = platform_of(child);
                if self.arches.iter().any(|a| a.as_str() == arch) {
                    manifests.push(ArchManifest { arch, digest });
                }
            }
            (top, source_digest)
        } else {
            self.copy_blobs(&src, &served, &bytes, &reference).await?;
            let m: ImageManifest = serde_json::from_slice(&bytes).map_err(|e| manifest_err(&served, e.to_string()))?;
            let config = self.layout.read_blob(m.config().digest().as_ref())?;
            let arch = serde_json::from_slice::<serde_json::Value>(&config)
                .ok()
                .and_then(|c| c.get("architecture").and_then(|a| a.as_str()).map(str::to_string))
                .unwrap_or_default();
            if !self.arches.iter().any(|a| a.as_str() == arch) {
                tracing::warn!("image {reference}: a single-architecture image for {arch:?}, not one of the bundle's architectures");
            }
            manifests.push(ArchManifest { arch, digest: served.clone() });
            (bytes, None)
        };
        let digest = self.layout.put_blob(&top)?;
        let descriptor = Descriptor::new(
            MediaType::from(media_type.as_str()),
            top.len() as u64,
            digest.parse::<oci_spec::image::Digest>().map_err(|e| manifest_err(&digest, e.to_string()))?,
        );
        manifests.sort_by(|a, b| (&a.arch, &a.digest).cmp(&(&b.arch, &b.digest)));
        Ok((BundleImage { reference, digest, media_type, source_digest, manifests }, descriptor))
    }

    /// Store the config and layers of one image manifest (`bytes`, stored as `digest`).
    async fn copy_blobs(&mut self, src: &Reference, digest: &str, bytes: &[u8], reference: &str) -> Result<(), CreateError> {
        use tokio::io::AsyncWriteExt as _;
        if !self.layout.has_blob(digest)? {
            self.layout.put_blob(bytes)?;
        }
        let m: ImageManifest = serde_json::from_slice(bytes).map_err(|e| CreateError::Manifest {
            reference: reference.to_string(),
            digest: digest.to_string(),
            message: e.to_string(),
        })?;
        for d in std::iter::once(m.config()).chain(m.layers()) {
            let blob = d.digest().to_string();
            self.blobs += 1;
            if self.layout.has_blob(&blob)? {
                self.reused += d.size();
                continue;
            }
            let temp = self.layout.temp_path(&blob)?;
            let mut file = tokio::fs::File::create(&temp).await.map_err(io_err(&temp))?;
            self.client.pull_blob(src, blob.as_str(), &mut file).await.map_err(|source| CreateError::Registry {
                reference: reference.to_string(),
                op: "fetching blob of",
                from: format!("{}@{blob}", src.whole()),
                source: Box::new(source),
            })?;
            file.flush().await.map_err(io_err(&temp))?;
            file.sync_all().await.map_err(io_err(&temp))?;
            drop(file);
            self.layout.commit(&temp, &blob)?;
            self.fetched += d.size();
        }
        Ok(())
    }
}

/// Every file under `dir`, relative, sorted; `*.part` left out.
fn walk(dir: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name();
        let (path, rel) = (e.path(), rel.join(&name));
        if e.file_type()?.is_dir() {
            walk(&path, &rel, out)?;
        } else if !name.to_string_lossy().ends_with(".part") {
            out.push(rel);
        }
    }
    Ok(())
}

/// Archive the work directory (`bundle.json` first, the rest sorted, no timestamps or owners) into
/// `output` (a temp file renamed into place); its size.
fn write_archive(work: &Path, output: &Path) -> Result<u64, CreateError> {
    let mut entries = Vec::new();
    walk(work, Path::new(""), &mut entries).map_err(io_err(work))?;
    entries.retain(|p| p != Path::new(MANIFEST_FILE));
    entries.insert(0, PathBuf::from(MANIFEST_FILE));
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(output.file_name().unwrap_or_default());
    temp_name.push(".tmp");
    let temp = output.with_file_name(temp_name);
    let file = std::fs::File::create(&temp).map_err(io_err(&temp))?;
    let mut tar = tar::Builder::new(std::io::BufWriter::new(file));
    tar.mode(tar::HeaderMode::Deterministic);
    for rel in &entries {
        tar.append_path_with_name(work.join(rel), rel).map_err(io_err(&work.join(rel)))?;
    }
    let file = tar.into_inner().map_err(io_err(&temp))?.into_inner().map_err(|e| CreateError::Io { path: temp.clone(), source: e.into_error() })?;
    file.sync_all().map_err(io_err(&temp))?;
    let size = file.metadata().map_err(io_err(&temp))?.len();
    std::fs::rename(&temp, output).map_err(io_err(output))?;
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use testkit::mirror::{sha256_hex, Behaviour, Mirror};

    fn asset(mirror: &Mirror, path: &str, bytes: &[u8]) -> FileAsset {
        mirror.put(path, bytes.to_vec());
        FileAsset { url: mirror.url(path), mirrors: vec![], sha256: sha256_hex(bytes), arch: "amd64", used_by: vec![] }
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
    }

    #[test]
    fn a_verified_file_is_reused_and_a_bad_one_fetched_again() {
        let mirror = Mirror::start();
        let f = asset(&mirror, "/a/kubelet", b"kubelet bytes");
        let d = tempfile::tempdir().expect("tempdir");
        let dest = d.path().join("files/x/kubelet");
        let http = reqwest::Client::new();
        let rt = rt();
        assert_eq!(rt.block_on(fetch_file(&http, &f, &f.url, &dest)).expect("fetch"), (13, false));
        assert_eq!(mirror.hits("/a/kubelet"), 1);
        assert_eq!(rt.block_on(fetch_file(&http, &f, &f.url, &dest)).expect("fetch"), (13, true), "resumed: reused");
        assert_eq!(mirror.hits("/a/kubelet"), 1, "not downloaded again");
        std::fs::write(&dest, b"half").expect("write");
        assert_eq!(rt.block_on(fetch_file(&http, &f, &f.url, &dest)).expect("fetch"), (13, false), "a partial file is replaced");
        assert_eq!(std::fs::read(&dest).expect("read"), b"kubelet bytes");
    }

    #[test]
    fn a_file_with_another_sha256_is_refused_naming_it() {
        let mirror = Mirror::start();
        let f = asset(&mirror, "/a/runc.amd64", b"runc bytes");
        mirror.set("/a/runc.amd64", Behaviour::Corrupt);
        let d = tempfile::tempdir().expect("tempdir");
        let dest = d.path().join("runc");
        let e = rt().block_on(fetch_file(&reqwest::Client::new(), &f, &f.url, &dest)).expect_err("refused");
        assert!(matches!(e, CreateError::FileHash { .. }), "{e}");
        assert!(e.to_string().contains(&f.url) && e.to_string().contains(&f.sha256), "{e}");
        assert!(!dest.exists() && std::fs::read_dir(d.path()).expect("dir").next().is_none(), "nothing left behind");
    }

    #[test]
    fn work_dir_is_beside_the_output() {
        assert_eq!(work_dir(Path::new("/tmp/x/b.tar")), PathBuf::from("/tmp/x/b.tar.partial"));
    }

    #[test]
    fn the_plan_has_canonical_urls_and_references_whatever_the_spec_mirrors() {
        let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/minimal.yaml"));
        let mut docs = spec_compiler::load::load_spec(path).expect("load");
        let options = CompileOptions::default();
        let plain = plan(&docs, &options, &[Arch::Amd64]).expect("plan");
        docs.cluster.spec.assets = Some(keelson_api::generated::AssetsSpec {
            file_repository: Some("https://mirror.example.com/files".into()),
            container_registry: Some("10.0.0.1:5000".into()),
            container_proxy: None,
        });
        let mirrored = plan(&docs, &options, &[Arch::Amd64]).expect("plan");
        assert_eq!(plain.files, mirrored.files);
        assert_eq!(plain.images, mirrored.images);
        assert!(plain.files.iter().all(|f| f.arch == "amd64") && plain.files.iter().any(|f| f.url.starts_with("https://dl.k8s.io/")));
        assert!(plain.images.iter().any(|i| i.reference.starts_with("registry.k8s.io/kube-apiserver:")));
        assert_eq!(plain.versions["kubernetes"], "1.34.4");

        // A hash given for the spec's mirror URL (a mirror of local builds) is the one its nodes
        // verify, and so the bundle's; one given for the canonical URL wins over it.
        let kubelet = plain.files.iter().find(|f| f.url.ends_with("/kubelet")).expect("kubelet").url.clone();
        let crictl = plain.files.iter().find(|f| f.url.contains("crictl") || f.url.contains("runc")).expect("another file").url.clone();
        let at_mirror = |u: &str| spec_compiler::versions::remap_file_url(u, Some("https://mirror.example.com/files")).expect("remap");
        let (a, b, c) = ("a".repeat(64), "b".repeat(64), "c".repeat(64));
        let options = CompileOptions {
            asset_hashes: BTreeMap::from([(at_mirror(&kubelet), a.clone()), (at_mirror(&crictl), b), (crictl.clone(), c.clone())]),
            ..Default::default()
        };
        let local = plan(&docs, &options, &[Arch::Amd64]).expect("plan");
        let sha = |u: &str| local.files.iter().find(|f| f.url == u).expect("listed").sha256.clone();
        assert_eq!((sha(&kubelet), sha(&crictl)), (a, c));
    }
}
