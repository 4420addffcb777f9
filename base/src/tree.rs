//! A tree of files: relative path → bytes, sorted so output order is deterministic. The compiler's
//! output, the Terraform a target renders, the state a cluster keeps in its store.

use std::collections::BTreeMap;
use std::path::Path;

use crate::fs::{write_atomic, FsError};

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Tree {
    pub files: BTreeMap<String, Vec<u8>>,
}

impl Tree {
    pub fn insert(&mut self, path: impl Into<String>, bytes: impl Into<Vec<u8>>) {
        self.files.insert(path.into(), bytes.into());
    }

    /// Write every file under `dir` atomically (a reader never sees half a file), mode 0600: the
    /// tree may hold user-data and state that are not for other users.
    pub fn write_to(&self, dir: &Path) -> Result<(), FsError> {
        for (rel, bytes) in &self.files {
            write_atomic(&dir.join(rel), bytes, 0o600, None)?;
        }
        Ok(())
    }
}
