//! The compiled tree: every output file as bytes, written atomically to a directory.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Why writing failed.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("serialising {what}: {message}")]
    Serialize { what: String, message: String },
}

/// Relative path → contents, sorted so output order is deterministic.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Tree {
    pub files: BTreeMap<String, Vec<u8>>,
}

impl Tree {
    pub fn insert(&mut self, path: impl Into<String>, bytes: impl Into<Vec<u8>>) {
        self.files.insert(path.into(), bytes.into());
    }

    /// Write every file under `dir` ([`write_atomic`], so a reader never sees half a file).
    pub fn write_to(&self, dir: &Path) -> Result<(), OutputError> {
        for (rel, bytes) in &self.files {
            let path = dir.join(rel);
            write_atomic(&path, bytes, None).map_err(|source| OutputError::Io { path: path.clone(), source })?;
        }
        Ok(())
    }
}

/// Write `bytes` to `path` through a temp file in the same directory and a rename (parents
/// created); `mode` is set on the temp file before any byte is written (0600 for secrets).
pub fn write_atomic(path: &Path, bytes: &[u8], mode: Option<u32>) -> std::io::Result<()> {
    let parent = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)?;
    let mut tmp = tempfile::NamedTempFile::new_in(parent)?;
    if let Some(m) = mode {
        use std::os::unix::fs::PermissionsExt as _;
        tmp.as_file().set_permissions(std::fs::Permissions::from_mode(m))?;
    }
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Serialise as YAML with map keys sorted (the layout kOps writes), no timestamps added.
pub fn to_yaml<T: serde::Serialize>(what: &str, value: &T) -> Result<String, OutputError> {
    let err = |message: String| OutputError::Serialize { what: what.to_string(), message };
    let json = serde_json::to_value(value).map_err(|e| err(e.to_string()))?;
    serde_yaml_ng::to_string(&json).map_err(|e| err(e.to_string()))
}
