//! `keelson bundle push`: a bundle's files into a file repository and its images into a registry,
//! each where a spec with that `assets.fileRepository` / `containerRegistry` makes nodes look
//! ([`crate::paths`]). Idempotent: a file whose sha256 is already there, an image whose tag (or, for
//! an image without a tag, digest) already resolves to the bundle's digest, a blob or manifest the
//! registry already has by digest — each is skipped. Everything is verified against `bundle.json`
//! before it is pushed: a tampered file or blob is refused, naming it.
//!
//! Repositories: `file://`, `gs://` and `s3://` through the state store's backends ([`base::store`];
//! `s3://` with the AWS SDK client every Keelson component builds, [`base::aws`], in a build with
//! the `s3` feature, which `keelson`'s `cloud` feature turns on); `http(s)://` is refused (a web
//! server's files are pushed to its directory).

use std::path::{Path, PathBuf};

use base::store::{ConfigBase, StateStore, StoreError};
use oci_client::{Client, Reference};
use oci_spec::image::{ImageIndex, ImageManifest};

use crate::layout::{sha256_file, Layout, LayoutError};
use crate::manifest::{BundleImage, BundleManifest, ManifestError, IMAGES_DIR, MANIFEST_FILE};
use crate::paths::{self, PathError};
use crate::registry;

/// Why a push failed.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error("--file-repository {url}: {reason}")]
    Scheme { url: String, reason: &'static str },
    #[error("--file-repository {url}: {source}")]
    Url {
        url: String,
        #[source]
        source: base::store::ConfigBaseError,
    },
    #[error(transparent)]
    Store(Box<StoreError>),
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
    #[error(transparent)]
    Path(#[from] PathError),
    #[error("file {url} ({arch}): {path} in the bundle has sha256 {actual}, bundle.json says {expected}: refused")]
    Tampered { url: String, arch: String, path: String, expected: String, actual: String },
    #[error("image {reference}: {source}")]
    Layout {
        reference: String,
        #[source]
        source: LayoutError,
    },
    #[error("image {reference}: {target:?} is not an image reference: {message}")]
    Reference { reference: String, target: String, message: String },
    #[error("image {reference}: {op} {target}: {source}")]
    Registry {
        reference: String,
        op: &'static str,
        target: String,
        #[source]
        source: Box<oci_client::errors::OciDistributionError>,
    },
    #[error("image {reference}: manifest {digest}: {message}")]
    BadManifest { reference: String, digest: String, message: String },
    #[error("starting the async runtime: {0}")]
    Runtime(std::io::Error),
}

impl From<StoreError> for PushError {
    fn from(e: StoreError) -> PushError {
        PushError::Store(Box::new(e))
    }
}

/// Where a bundle goes.
#[derive(Debug, Clone, Default)]
pub struct PushOptions {
    /// `assets.fileRepository` of the target spec (`file:///srv/assets`, `gs://bucket/prefix`).
    pub file_repository: String,
    /// `assets.containerRegistry` of the target spec (`HOST[:PORT]`).
    pub registry: String,
    /// Speak plain http to the registry even off loopback.
    pub plain_http: bool,
}

/// What a push did: each destination, pushed or already there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PushReport {
    pub files_pushed: Vec<String>,
    pub files_skipped: Vec<String>,
    pub images_pushed: Vec<String>,
    pub images_skipped: Vec<String>,
    pub blobs_pushed: usize,
    pub blobs_skipped: usize,
    pub bytes_pushed: u64,
}

/// How long one request to a `gs://` repository may take.
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// The store behind a `--file-repository` URL; `endpoint_url` is the S3 endpoint of an `s3://` one
/// (a local moto, an S3-compatible store; `None`: `$AWS_ENDPOINT_URL`, then AWS itself).
pub fn open_repository(url: &str, endpoint_url: Option<&str>) -> Result<StateStore, PushError> {
    let base: ConfigBase = url.parse().map_err(|source| PushError::Url { url: url.to_string(), source })?;
    match base {
        ConfigBase::Http(_) => Err(PushError::Scheme {
            url: url.to_string(),
            reason: "an http(s):// repository is read-only here: push to the directory its web server serves (file://DIR)",
        }),
        ConfigBase::S3 { .. } => open_s3(&base, endpoint_url),
        _ => Ok(StateStore::open(&base, REQUEST_TIMEOUT)?),
    }
}

/// An `s3://` repository through the client every component builds (credentials and region from the
/// standard AWS chain; path-style addressing when the endpoint is overridden).
#[cfg(feature = "s3")]
fn open_s3(base: &ConfigBase, endpoint_url: Option<&str>) -> Result<StateStore, PushError> {
    let opts = base::aws::AwsOptions { endpoint_url: endpoint_url.map(str::to_string), ..Default::default() };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(PushError::Runtime)?;
    let conf = rt.block_on(base::aws::sdk_config(&opts));
    let client = aws_sdk_s3::Client::from_conf(base::aws::s3_config(&conf, opts.endpoint_url.is_some()).build());
    Ok(StateStore::open_with_s3(base, Some(client), REQUEST_TIMEOUT)?)
}

#[cfg(not(feature = "s3"))]
fn open_s3(base: &ConfigBase, _endpoint_url: Option<&str>) -> Result<StateStore, PushError> {
    Err(PushError::Scheme {
        url: base.to_string(),
        reason: "this keelson was built without the AWS SDK (the `cloud` feature): push to file://DIR and copy the directory to the bucket",
    })
}

/// Push `bundle` (see the module documentation).
pub fn push(bundle: &Path, store: &StateStore, opts: &PushOptions) -> Result<PushReport, PushError> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(PushError::Runtime)?;
    rt.block_on(push_async(bundle, store, opts))
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> PushError + '_ {
    move |source| PushError::Io { path: path.to_path_buf(), source }
}

/// Unpack `bundle` into a temp directory beside it (removed when dropped); an error names the path
/// it is about.
pub(crate) fn unpack_bundle(bundle: &Path) -> Result<tempfile::TempDir, (PathBuf, std::io::Error)> {
    let parent = bundle.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let dir = tempfile::Builder::new().prefix(".keelson-bundle-").tempdir_in(parent).map_err(|e| (parent.to_path_buf(), e))?;
    let file = std::fs::File::open(bundle).map_err(|e| (bundle.to_path_buf(), e))?;
    tar::Archive::new(std::io::BufReader::new(file)).unpack(dir.path()).map_err(|e| (bundle.to_path_buf(), e))?;
    Ok(dir)
}

async fn push_async(bundle: &Path, store: &StateStore, opts: &PushOptions) -> Result<PushReport, PushError> {
    let dir = unpack_bundle(bundle).map_err(|(path, source)| PushError::Io { path, source })?;
    let manifest_path = dir.path().join(MANIFEST_FILE);
    let bytes = std::fs::read(&manifest_path).map_err(io_err(&manifest_path))?;
    let manifest = BundleManifest::parse(&bytes).map_err(|source| PushError::Manifest { bundle: bundle.to_path_buf(), source })?;
    let mut report = PushReport::default();

    let total = manifest.files.len();
    for (i, f) in manifest.files.iter().enumerate() {
        let local = dir.path().join(&f.path);
        let (size, actual) = sha256_file(&local).map_err(io_err(&local))?;
        if actual != f.sha256 {
            return Err(PushError::Tampered { url: f.url.clone(), arch: f.arch.clone(), path: f.path.clone(), expected: f.sha256.clone(), actual });
        }
        let key = paths::repository_key(&f.url, &opts.file_repository)?;
        let there = store.digest(&key).await?;
        let url = store.url(&key);
        if there.is_some_and(|(_, sha)| sha == f.sha256) {
            tracing::info!("file {}/{total} {url}: already there", i + 1);
            report.files_skipped.push(url);
        } else {
            store.put_file(&key, &local).await?;
            tracing::info!("file {}/{total} {url}: pushed {size} bytes", i + 1);
            report.bytes_pushed += size;
            report.files_pushed.push(url);
        }
    }

    let http = if registry::plain_http(&opts.registry, opts.plain_http) { vec![opts.registry.clone()] } else { Vec::new() };
    let client = registry::client(http);
    let layout = Layout::open(&dir.path().join(IMAGES_DIR));
    let total = manifest.images.len();
    for (i, image) in manifest.images.iter().enumerate() {
        let target = paths::registry_reference(&image.reference, &opts.registry);
        let pusher = ImagePusher { client: &client, layout: &layout, image, target: target.clone() };
        let (pushed, blobs_pushed, blobs_skipped, bytes) = pusher.push().await?;
        report.blobs_pushed += blobs_pushed;
        report.blobs_skipped += blobs_skipped;
        report.bytes_pushed += bytes;
        if pushed {
            tracing::info!(
                "image {}/{total} {target}: pushed {} ({blobs_pushed} blobs, {bytes} bytes; {blobs_skipped} blobs already there)",
                i + 1,
                image.digest
            );
            report.images_pushed.push(target);
        } else {
            tracing::info!("image {}/{total} {target}: already there ({})", i + 1, image.digest);
            report.images_skipped.push(target);
        }
    }
    Ok(report)
}

struct ImagePusher<'a> {
    client: &'a Client,
    layout: &'a Layout,
    image: &'a BundleImage,
    target: String,
}

impl ImagePusher<'_> {
    fn registry_err(&self, op: &'static str) -> impl FnOnce(oci_client::errors::OciDistributionError) -> PushError + '_ {
        move |source| PushError::Registry { reference: self.image.reference.clone(), op, target: self.target.clone(), source: Box::new(source) }
    }

    fn layout_err(&self) -> impl FnOnce(LayoutError) -> PushError + '_ {
        move |source| PushError::Layout { reference: self.image.reference.clone(), source }
    }

    fn bad(&self, digest: &str, message: String) -> PushError {
        PushError::BadManifest { reference: self.image.reference.clone(), digest: digest.to_string(), message }
    }

    /// `(pushed, blobs pushed, blobs skipped, bytes pushed)`.
    async fn push(&self) -> Result<(bool, usize, usize, u64), PushError> {
        let dest: Reference = self.target.parse().map_err(|e: oci_client::ParseError| PushError::Reference {
            reference: self.image.reference.clone(),
            target: self.target.clone(),
            message: e.to_string(),
        })?;
        let digest = &self.image.digest;
        let by_digest = registry::by_digest(&dest, digest);
        // A reference with neither tag nor digest means `latest`, as nodes resolve it.
        let tag = dest.tag().or(dest.digest().is_none().then_some("latest"));
        let tag = tag.map(|t| Reference::with_tag(dest.registry().to_string(), dest.repository().to_string(), t.to_string()));
        let check = tag.as_ref().unwrap_or(&by_digest);
        if registry::manifest_digest(self.client, check).await.map_err(self.registry_err("checking"))?.as_ref() == Some(digest) {
            return Ok((false, 0, 0, 0));
        }
        let top = self.layout.read_blob(digest).map_err(self.layout_err())?;
        let media_type = registry::media_type_of(&top);
        let mut children = Vec::new();
        if registry::is_index(&media_type) {
            let index: ImageIndex = serde_json::from_slice(&top).map_err(|e| self.bad(digest, e.to_string()))?;
            children.extend(index.manifests().iter().map(|d| (d.digest().to_string(), d.media_type().to_string())));
        }
        let (mut pushed, mut skipped, mut bytes) = (0, 0, 0u64);
        let manifests: Vec<(String, Vec<u8>, String)> = if children.is_empty() {
            vec![(digest.clone(), top.clone(), media_type.clone())]
        } else {
            let mut v = Vec::new();
            for (d, mt) in &children {
                v.push((d.clone(), self.layout.read_blob(d).map_err(self.layout_err())?, mt.clone()));
            }
            v
        };
        for (d, bytes_of_manifest, mt) in &manifests {
            let m: ImageManifest = serde_json::from_slice(bytes_of_manifest).map_err(|e| self.bad(d, e.to_string()))?;
            for blob in std::iter::once(m.config()).chain(m.layers()) {
                let blob = blob.digest().to_string();
                if registry::blob_exists(self.client, &dest, &blob).await.map_err(self.registry_err("checking a blob of"))? {
                    skipped += 1;
                    continue;
                }
                let data = self.layout.read_blob(&blob).map_err(self.layout_err())?;
                self.client.push_blob(&dest, &data, &blob).await.map_err(self.registry_err("pushing a blob to"))?;
                pushed += 1;
                bytes += data.len() as u64;
            }
            if children.is_empty() {
                break;
            }
            let child = registry::by_digest(&dest, d);
            if registry::manifest_digest(self.client, &child).await.map_err(self.registry_err("checking a manifest of"))?.as_deref() != Some(d.as_str()) {
                let header = mt.parse().map_err(|_| self.bad(d, format!("media type {mt:?}")))?;
                self.client.push_manifest_raw(&child, bytes_of_manifest.clone(), header).await.map_err(self.registry_err("pushing a manifest to"))?;
                bytes += bytes_of_manifest.len() as u64;
            }
        }
        let header = media_type.parse().map_err(|_| self.bad(digest, format!("media type {media_type:?}")))?;
        bytes += top.len() as u64;
        self.client.push_manifest_raw(&by_digest, top.clone(), header).await.map_err(self.registry_err("pushing the manifest to"))?;
        if let Some(tag) = &tag {
            let header = media_type.parse().map_err(|_| self.bad(digest, format!("media type {media_type:?}")))?;
            self.client.push_manifest_raw(tag, top, header).await.map_err(self.registry_err("tagging"))?;
        }
        Ok((true, pushed, skipped, bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_and_unknown_repositories_are_refused_saying_why() {
        let e = open_repository("https://assets.example.com/", None).expect_err("https");
        assert!(e.to_string().contains("read-only") && e.to_string().contains("https://assets.example.com/"), "{e}");
        assert!(open_repository("ftp://x", None).is_err());
        let d = tempfile::tempdir().expect("tempdir");
        let store = open_repository(&format!("file://{}", d.path().display()), None).expect("file");
        assert_eq!(store.local_dir(), Some(d.path()));
    }

    #[cfg(feature = "s3")]
    #[test]
    fn s3_repositories_open_an_s3_store() {
        let store = open_repository("s3://bucket/assets", Some("http://127.0.0.1:9")).expect("s3");
        assert_eq!((store.url("x/y"), store.local_dir()), ("s3://bucket/assets/x/y".to_string(), None));
    }

    #[cfg(not(feature = "s3"))]
    #[test]
    fn s3_repositories_need_the_aws_sdk() {
        let e = open_repository("s3://bucket/assets", None).expect_err("s3");
        assert!(e.to_string().contains("without the AWS SDK") && e.to_string().contains("s3://bucket/assets"), "{e}");
    }
}
