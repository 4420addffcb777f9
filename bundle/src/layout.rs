//! The bundle's OCI image layout (`images/`): `oci-layout`, `index.json` naming each image by its
//! original reference (`org.opencontainers.image.ref.name`), and every blob — manifests, indexes,
//! configs, layers — under `blobs/sha256/<hex>`. A blob is written to a temp file and renamed into
//! place only once its digest is verified, so a blob that is there is whole; [`Layout::has_blob`]
//! still re-hashes it (a resumed run trusts nothing it did not check).

use std::collections::HashMap;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};

use oci_spec::image::{Descriptor, ImageIndex, ImageIndexBuilder, MediaType, OciLayoutBuilder, ANNOTATION_REF_NAME};

use crate::manifest::is_digest;

/// Why the layout could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{digest:?}: not a sha256 digest")]
    Digest { digest: String },
    #[error("{path}: blob {digest} has sha256:{actual}")]
    Corrupt { path: PathBuf, digest: String, actual: String },
    #[error("{path}: {message}")]
    Oci { path: PathBuf, message: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> LayoutError + '_ {
    move |source| LayoutError::Io { path: path.to_path_buf(), source }
}

/// Lower-case hex sha256 of a file, read in chunks, and its size.
pub fn sha256_file(path: &Path) -> std::io::Result<(u64, String)> {
    use sha2::Digest as _;
    let mut f = std::fs::File::open(path)?;
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut n = 0u64;
    loop {
        let r = f.read(&mut buf)?;
        if r == 0 {
            break;
        }
        h.update(&buf[..r]);
        n += r as u64;
    }
    Ok((n, hex::encode(h.finalize())))
}

/// `sha256:<hex>` of bytes.
pub fn digest_of(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

/// An OCI image layout directory.
#[derive(Debug, Clone)]
pub struct Layout {
    root: PathBuf,
}

impl Layout {
    /// Open `root`, creating the directory, `oci-layout` and `blobs/sha256/` if missing.
    pub fn create(root: &Path) -> Result<Layout, LayoutError> {
        let blobs = root.join("blobs/sha256");
        std::fs::create_dir_all(&blobs).map_err(io(&blobs))?;
        let marker = root.join("oci-layout");
        if !marker.is_file() {
            let layout = OciLayoutBuilder::default()
                .image_layout_version("1.0.0")
                .build()
                .map_err(|e| LayoutError::Oci { path: marker.clone(), message: e.to_string() })?;
            let text = serde_json::to_vec(&layout).map_err(|e| LayoutError::Oci { path: marker.clone(), message: e.to_string() })?;
            std::fs::write(&marker, text).map_err(io(&marker))?;
        }
        Ok(Layout { root: root.to_path_buf() })
    }

    /// An existing layout (nothing is created).
    pub fn open(root: &Path) -> Layout {
        Layout { root: root.to_path_buf() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `blobs/sha256/<hex>` of a digest.
    pub fn blob_path(&self, digest: &str) -> Result<PathBuf, LayoutError> {
        if !is_digest(digest) {
            return Err(LayoutError::Digest { digest: digest.to_string() });
        }
        Ok(self.root.join("blobs/sha256").join(&digest["sha256:".len()..]))
    }

    /// Whether the blob is there with the right content; a blob with other content is removed
    /// (and `false` returned), so it is fetched again.
    pub fn has_blob(&self, digest: &str) -> Result<bool, LayoutError> {
        let path = self.blob_path(digest)?;
        if !path.is_file() {
            return Ok(false);
        }
        let (_, hex) = sha256_file(&path).map_err(io(&path))?;
        if format!("sha256:{hex}") == digest {
            return Ok(true);
        }
        tracing::warn!("{}: not blob {digest}: fetching it again", path.display());
        std::fs::remove_file(&path).map_err(io(&path))?;
        Ok(false)
    }

    /// Store bytes as a blob; returns its digest.
    pub fn put_blob(&self, bytes: &[u8]) -> Result<String, LayoutError> {
        let digest = digest_of(bytes);
        let path = self.blob_path(&digest)?;
        let temp = self.temp_path(&digest)?;
        let mut f = std::fs::File::create(&temp).map_err(io(&temp))?;
        f.write_all(bytes).and_then(|_| f.sync_all()).map_err(io(&temp))?;
        std::fs::rename(&temp, &path).map_err(io(&path))?;
        Ok(digest)
    }

    /// A temp file name beside the blob (renamed into place once verified).
    pub fn temp_path(&self, digest: &str) -> Result<PathBuf, LayoutError> {
        Ok(self.blob_path(digest)?.with_extension("part"))
    }

    /// Move a verified temp file into place as the blob `digest`.
    pub fn commit(&self, temp: &Path, digest: &str) -> Result<(), LayoutError> {
        let (_, hex) = sha256_file(temp).map_err(io(temp))?;
        if format!("sha256:{hex}") != digest {
            let _ = std::fs::remove_file(temp);
            return Err(LayoutError::Corrupt { path: temp.to_path_buf(), digest: digest.to_string(), actual: hex });
        }
        let path = self.blob_path(digest)?;
        std::fs::rename(temp, &path).map_err(io(&path))
    }

    /// A blob's bytes, verified against its digest.
    pub fn read_blob(&self, digest: &str) -> Result<Vec<u8>, LayoutError> {
        let path = self.blob_path(digest)?;
        let bytes = std::fs::read(&path).map_err(io(&path))?;
        let actual = digest_of(&bytes);
        if actual != digest {
            return Err(LayoutError::Corrupt { path, digest: digest.to_string(), actual });
        }
        Ok(bytes)
    }

    /// Write `index.json`: one entry per (reference, descriptor), sorted by reference, each named
    /// by its reference.
    pub fn write_index(&self, entries: &[(String, Descriptor)]) -> Result<(), LayoutError> {
        let path = self.root.join("index.json");
        let oci = |e: oci_spec::OciSpecError| LayoutError::Oci { path: path.clone(), message: e.to_string() };
        let mut sorted: Vec<&(String, Descriptor)> = entries.iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        let manifests: Vec<Descriptor> = sorted
            .into_iter()
            .map(|(reference, d)| {
                let mut d = d.clone();
                d.set_annotations(Some(HashMap::from([(ANNOTATION_REF_NAME.to_string(), reference.clone())])));
                d
            })
            .collect();
        let index = ImageIndexBuilder::default().schema_version(2u32).media_type(MediaType::ImageIndex).manifests(manifests).build().map_err(oci)?;
        let text = serde_json::to_vec_pretty(&index).map_err(|e| LayoutError::Oci { path: path.clone(), message: e.to_string() })?;
        std::fs::write(&path, text).map_err(io(&path))
    }

    /// `index.json`.
    pub fn read_index(&self) -> Result<ImageIndex, LayoutError> {
        let path = self.root.join("index.json");
        let bytes = std::fs::read(&path).map_err(io(&path))?;
        serde_json::from_slice(&bytes).map_err(|e| LayoutError::Oci { path, message: e.to_string() })
    }
}

/// The reference an `index.json` entry is named by.
pub fn ref_name(d: &Descriptor) -> Option<&str> {
    d.annotations().as_ref().and_then(|a| a.get(ANNOTATION_REF_NAME)).map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_are_verified_and_a_bad_one_is_dropped() {
        let d = tempfile::tempdir().expect("tempdir");
        let layout = Layout::create(d.path()).expect("layout");
        assert!(d.path().join("oci-layout").is_file());
        let digest = layout.put_blob(b"hello").expect("put");
        assert!(layout.has_blob(&digest).expect("has"));
        assert_eq!(layout.read_blob(&digest).expect("read"), b"hello");
        std::fs::write(layout.blob_path(&digest).expect("path"), b"tampered").expect("write");
        assert!(matches!(layout.read_blob(&digest), Err(LayoutError::Corrupt { .. })));
        assert!(!layout.has_blob(&digest).expect("has"), "a corrupt blob is not reused");
        assert!(!layout.blob_path(&digest).expect("path").exists(), "and is removed");
        assert!(matches!(layout.blob_path("sha256:../x"), Err(LayoutError::Digest { .. })));
        let temp = layout.temp_path(&digest).expect("temp");
        std::fs::write(&temp, b"other").expect("write");
        assert!(matches!(layout.commit(&temp, &digest), Err(LayoutError::Corrupt { .. })));
        assert!(!temp.exists());
    }

    #[test]
    fn index_names_each_image_by_its_reference_sorted() {
        let d = tempfile::tempdir().expect("tempdir");
        let layout = Layout::create(d.path()).expect("layout");
        let a = layout.put_blob(b"{}").expect("put");
        let desc = |s: &str| Descriptor::new(MediaType::ImageManifest, 2, s.parse::<oci_spec::image::Digest>().expect("digest"));
        layout.write_index(&[("z.io/b:1".into(), desc(&a)), ("a.io/a:1".into(), desc(&a))]).expect("index");
        let index = layout.read_index().expect("read");
        let names: Vec<_> = index.manifests().iter().filter_map(ref_name).collect();
        assert_eq!(names, ["a.io/a:1", "z.io/b:1"]);
    }
}
