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

    /// Write every file under `dir` (temp file + rename, so a reader never sees half a file).
    pub fn write_to(&self, dir: &Path) -> Result<(), OutputError> {
        for (rel, bytes) in &self.files {
            let path = dir.join(rel);
            let io = |source| OutputError::Io { path: path.clone(), source };
            let parent = path.parent().unwrap_or(dir);
            std::fs::create_dir_all(parent).map_err(io)?;
            let mut tmp = tempfile::NamedTempFile::new_in(parent).map_err(io)?;
            tmp.write_all(bytes).map_err(io)?;
            tmp.persist(&path).map_err(|e| io(e.error))?;
        }
        Ok(())
    }
}

/// Serialise as YAML with map keys sorted (the layout kOps writes), no timestamps added.
pub fn to_yaml<T: serde::Serialize>(what: &str, value: &T) -> Result<String, OutputError> {
    let err = |message: String| OutputError::Serialize { what: what.to_string(), message };
    let json = serde_json::to_value(value).map_err(|e| err(e.to_string()))?;
    serde_yaml_ng::to_string(&json).map_err(|e| err(e.to_string()))
}
