//! `bundle.json`: what a bundle holds, written by `create` and checked by `push` before anything
//! is pushed. Deterministic: sorted lists, no timestamps.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The manifest's name at the top of the archive.
pub const MANIFEST_FILE: &str = "bundle.json";
/// The directory of the OCI image layout inside the archive.
pub const IMAGES_DIR: &str = "images";
/// The directory of the files inside the archive.
pub const FILES_DIR: &str = "files";
/// The format this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// Why a manifest was refused.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{MANIFEST_FILE}: not JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{MANIFEST_FILE}: format version {found}, this keelson reads {FORMAT_VERSION}")]
    Version { found: u32 },
    #[error("{MANIFEST_FILE}: file {url} ({arch}): sha256 {sha256:?} is not 64 lower-case hex digits")]
    FileHash { url: String, arch: String, sha256: String },
    #[error("{MANIFEST_FILE}: file {url}: path {path:?} is not under {FILES_DIR}/ (or climbs out with ..)")]
    FilePath { url: String, path: String },
    #[error("{MANIFEST_FILE}: image {reference}: digest {digest:?} is not sha256:<64 hex>; an image without a known digest is never pushed by its tag alone")]
    ImageDigest { reference: String, digest: String },
}

/// Why a bundle's manifest could not be read from a file.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: neither a bundle archive with a {MANIFEST_FILE} entry (`keelson bundle create`) nor a {MANIFEST_FILE}")]
    NoManifest { path: PathBuf },
    #[error("{path}: {source}")]
    Manifest {
        path: PathBuf,
        #[source]
        source: ManifestError,
    },
}

/// Everything in a bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BundleManifest {
    pub format_version: u32,
    /// The keelson that wrote it.
    pub keelson_version: String,
    /// The spec's `kubernetesVersion`.
    pub kubernetes_version: String,
    /// The component versions the versions table gave this spec (`containerd`, `etcd`, `runc`,
    /// `cniPlugins`, `kubernetes`).
    pub versions: BTreeMap<String, String>,
    /// sha256 of the versions table's built-in hash rows (`<url>\t<sha256>\n` each): two bundles
    /// from the same table carry the same value.
    pub versions_table_sha256: String,
    /// The architectures whose files and image manifests it holds.
    pub arches: Vec<String>,
    pub files: Vec<BundleFile>,
    pub images: Vec<BundleImage>,
}

/// One file asset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BundleFile {
    /// The canonical (upstream) URL, before any `assets.fileRepository` rewriting.
    pub url: String,
    pub sha256: String,
    pub arch: String,
    pub size: u64,
    /// Where it is in the archive (`files/<host>/<path>`).
    pub path: String,
}

/// One image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BundleImage {
    /// As the spec names it, before `assets.containerRegistry` rewriting.
    pub reference: String,
    /// The digest of the manifest or index the bundle holds for it (`sha256:…`).
    pub digest: String,
    /// Its media type.
    pub media_type: String,
    /// The digest the source registry served, when the bundle holds a narrower index (only the
    /// bundle's architectures).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_digest: Option<String>,
    /// The image manifest of each architecture.
    pub manifests: Vec<ArchManifest>,
}

/// One architecture's image manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArchManifest {
    pub arch: String,
    pub digest: String,
}

pub(crate) fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `sha256:<64 hex>`.
pub fn is_digest(s: &str) -> bool {
    s.strip_prefix("sha256:").is_some_and(is_sha256_hex)
}

impl BundleManifest {
    /// A manifest written by this keelson, from this versions table.
    pub fn new(
        kubernetes_version: &str,
        versions: BTreeMap<String, String>,
        arches: Vec<String>,
        files: Vec<BundleFile>,
        images: Vec<BundleImage>,
    ) -> BundleManifest {
        BundleManifest {
            format_version: FORMAT_VERSION,
            keelson_version: env!("CARGO_PKG_VERSION").to_string(),
            kubernetes_version: kubernetes_version.to_string(),
            versions,
            versions_table_sha256: versions_table_sha256(),
            arches,
            files,
            images,
        }
    }

    /// Sorted, pretty JSON with a final newline.
    pub fn to_json(&self) -> Vec<u8> {
        let mut m = self.clone();
        m.files.sort_by(|a, b| (&a.url, &a.arch).cmp(&(&b.url, &b.arch)));
        m.images.sort_by(|a, b| a.reference.cmp(&b.reference));
        let mut out = serde_json::to_vec_pretty(&m).unwrap_or_default();
        out.push(b'\n');
        out
    }

    /// Parse and check a manifest: its version, every file's sha256 and path, every image's digest.
    pub fn parse(bytes: &[u8]) -> Result<BundleManifest, ManifestError> {
        let m: BundleManifest = serde_json::from_slice(bytes)?;
        if m.format_version != FORMAT_VERSION {
            return Err(ManifestError::Version { found: m.format_version });
        }
        for f in &m.files {
            if !is_sha256_hex(&f.sha256) {
                return Err(ManifestError::FileHash { url: f.url.clone(), arch: f.arch.clone(), sha256: f.sha256.clone() });
            }
            if !crate::paths::is_bundle_file_path(&f.path) {
                return Err(ManifestError::FilePath { url: f.url.clone(), path: f.path.clone() });
            }
        }
        for i in &m.images {
            for d in std::iter::once(&i.digest).chain(i.manifests.iter().map(|m| &m.digest)) {
                if !is_digest(d) {
                    return Err(ManifestError::ImageDigest { reference: i.reference.clone(), digest: d.clone() });
                }
            }
        }
        Ok(m)
    }
}

impl BundleManifest {
    /// The manifest of a bundle archive (its [`MANIFEST_FILE`] entry, read without unpacking the
    /// rest) or of a `bundle.json` file (JSON: its first non-blank byte is `{`), checked as
    /// [`BundleManifest::parse`] checks it.
    pub fn read(path: &Path) -> Result<BundleManifest, ReadError> {
        let io = |source| ReadError::Io { path: path.to_path_buf(), source };
        let mut file = std::io::BufReader::new(std::fs::File::open(path).map_err(io)?);
        let mut head = Vec::new();
        (&mut file).take(512).read_to_end(&mut head).map_err(io)?;
        let bytes = if head.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{') {
            std::fs::read(path).map_err(io)?
        } else {
            let file = std::fs::File::open(path).map_err(io)?;
            let mut archive = tar::Archive::new(std::io::BufReader::new(file));
            let mut found = None;
            for entry in archive.entries().map_err(|_| ReadError::NoManifest { path: path.to_path_buf() })? {
                let mut entry = entry.map_err(|_| ReadError::NoManifest { path: path.to_path_buf() })?;
                if entry.path().is_ok_and(|p| p.as_ref() == Path::new(MANIFEST_FILE)) {
                    let mut bytes = Vec::new();
                    entry.read_to_end(&mut bytes).map_err(io)?;
                    found = Some(bytes);
                    break;
                }
            }
            found.ok_or_else(|| ReadError::NoManifest { path: path.to_path_buf() })?
        };
        BundleManifest::parse(&bytes).map_err(|source| ReadError::Manifest { path: path.to_path_buf(), source })
    }

    /// Each image's digest by the reference the spec names it with, before registry rewriting
    /// (what `keelson compile --image-digests` pins: `spec_compiler::digests`).
    pub fn image_digests(&self) -> BTreeMap<String, String> {
        self.images.iter().map(|i| (i.reference.clone(), i.digest.clone())).collect()
    }
}

/// sha256 of the built-in hash table (see [`BundleManifest::versions_table_sha256`]).
pub fn versions_table_sha256() -> String {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    for row in spec_compiler::versions::hash_table_rows() {
        h.update(row.url.as_bytes());
        h.update(b"\t");
        h.update(row.sha256.as_bytes());
        h.update(b"\n");
    }
    hex::encode(h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> BundleManifest {
        BundleManifest {
            format_version: FORMAT_VERSION,
            keelson_version: "0.1.0".into(),
            kubernetes_version: "1.34.4".into(),
            versions: BTreeMap::from([("containerd".into(), "2.3.4".into())]),
            versions_table_sha256: versions_table_sha256(),
            arches: vec!["amd64".into()],
            files: vec![
                BundleFile { url: "https://b/x".into(), sha256: "b".repeat(64), arch: "amd64".into(), size: 1, path: "files/b/x".into() },
                BundleFile { url: "https://a/x".into(), sha256: "a".repeat(64), arch: "amd64".into(), size: 1, path: "files/a/x".into() },
            ],
            images: vec![BundleImage {
                reference: "registry.k8s.io/pause:3.10.1".into(),
                digest: format!("sha256:{}", "c".repeat(64)),
                media_type: "application/vnd.oci.image.index.v1+json".into(),
                source_digest: None,
                manifests: vec![ArchManifest { arch: "amd64".into(), digest: format!("sha256:{}", "d".repeat(64)) }],
            }],
        }
    }

    #[test]
    fn round_trips_sorted_and_deterministic() {
        let m = sample();
        let json = m.to_json();
        assert_eq!(json, m.to_json());
        let back = BundleManifest::parse(&json).expect("parse");
        assert_eq!(back.files[0].url, "https://a/x", "files sorted by URL");
        assert_eq!(back.to_json(), json);
        let text = String::from_utf8(json).expect("utf-8");
        assert!(text.contains("\"kubernetesVersion\": \"1.34.4\"") && text.contains("\"versionsTableSha256\""), "{text}");
        assert!(!text.contains("sourceDigest"), "absent when the source's own digest is kept");
    }

    #[test]
    fn the_manifest_is_read_from_an_archive_or_a_bundle_json_and_gives_the_image_digests() {
        let m = sample();
        let dir = tempfile::tempdir().expect("tempdir");
        let json = dir.path().join(MANIFEST_FILE);
        std::fs::write(&json, m.to_json()).expect("write");
        let archive = dir.path().join("b.tar");
        let mut tar = tar::Builder::new(std::fs::File::create(&archive).expect("create"));
        for (name, bytes) in [(MANIFEST_FILE, m.to_json()), ("files/x", b"x".to_vec())] {
            let mut header = tar::Header::new_gnu();
            header.set_size(bytes.len() as u64);
            header.set_mode(0o644);
            tar.append_data(&mut header, name, bytes.as_slice()).expect("append");
        }
        tar.finish().expect("finish");
        drop(tar);
        for path in [&json, &archive] {
            let read = BundleManifest::read(path).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(read.image_digests(), BTreeMap::from([("registry.k8s.io/pause:3.10.1".to_string(), format!("sha256:{}", "c".repeat(64)))]));
        }
        let not_a_bundle = dir.path().join("x.txt");
        std::fs::write(&not_a_bundle, "registry.k8s.io/pause:3.10.1 sha256:abc\n").expect("write");
        let e = BundleManifest::read(&not_a_bundle).expect_err("not a bundle").to_string();
        assert!(e.contains("x.txt") && e.contains("neither a bundle archive"), "{e}");
        let mut bad = m.clone();
        bad.images[0].digest = "latest".into();
        std::fs::write(&json, bad.to_json()).expect("write");
        let e = BundleManifest::read(&json).expect_err("no digest").to_string();
        assert!(e.contains("bundle.json") && e.contains("registry.k8s.io/pause:3.10.1"), "{e}");
        let e = BundleManifest::read(&dir.path().join("missing.tar")).expect_err("missing").to_string();
        assert!(e.contains("missing.tar"), "{e}");
    }

    #[test]
    fn refuses_bad_hashes_paths_digests_and_versions() {
        let mut m = sample();
        m.files[0].sha256 = "ABC".into();
        assert!(matches!(BundleManifest::parse(&m.to_json()), Err(ManifestError::FileHash { .. })));
        let mut m = sample();
        m.files[0].path = "files/../../etc/passwd".into();
        let e = BundleManifest::parse(&m.to_json()).expect_err("climbs out");
        assert!(e.to_string().contains("https://b/x"), "{e}");
        let mut m = sample();
        m.images[0].digest = String::new();
        let e = BundleManifest::parse(&m.to_json()).expect_err("no digest");
        assert!(matches!(e, ManifestError::ImageDigest { .. }) && e.to_string().contains("registry.k8s.io/pause:3.10.1"), "{e}");
        let mut m = sample();
        m.format_version = 9;
        assert!(matches!(BundleManifest::parse(&m.to_json()), Err(ManifestError::Version { found: 9 })));
    }
}
