//! A tree of files: relative path → bytes, sorted so output order is deterministic. The compiler's
//! output, the Terraform a target renders, the state a cluster keeps in its store.

use std::collections::BTreeMap;
use std::path::Path;

use crate::fs::{write_atomic_unsynced, FsError};

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Tree {
    pub files: BTreeMap<String, Vec<u8>>,
}

impl Tree {
    pub fn insert(&mut self, path: impl Into<String>, bytes: impl Into<Vec<u8>>) {
        self.files.insert(path.into(), bytes.into());
    }

    /// Write every file under `dir` atomically (a reader never sees half a file), mode 0600: the
    /// tree may hold user-data and state that are not for other users. The tree is output that is
    /// rebuilt on demand (compile again after a crash), so nothing is synced: two fsyncs per file
    /// made 2,000 instance groups take half a minute on disks that honour them.
    pub fn write_to(&self, dir: &Path) -> Result<(), FsError> {
        for (rel, bytes) in &self.files {
            write_atomic_unsynced(&dir.join(rel), bytes, 0o600)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn a_tree_replaces_what_is_there_file_by_file_private_and_without_leftovers() {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::create_dir_all(dir.path().join("a")).expect("mkdir");
        std::fs::write(dir.path().join("a/x"), "old").expect("old file");
        let mut t = Tree::default();
        t.insert("a/x", "new");
        t.insert("b/c/y", "y");
        t.write_to(dir.path()).expect("write");
        assert_eq!(std::fs::read_to_string(dir.path().join("a/x")).expect("x"), "new");
        assert_eq!(std::fs::read_to_string(dir.path().join("b/c/y")).expect("y"), "y");
        for f in ["a/x", "b/c/y"] {
            assert_eq!(std::fs::metadata(dir.path().join(f)).expect("stat").permissions().mode() & 0o777, 0o600, "{f}");
        }
        let names: Vec<String> =
            std::fs::read_dir(dir.path().join("a")).expect("ls").map(|e| e.expect("entry").file_name().to_string_lossy().into_owned()).collect();
        assert_eq!(names, ["x"], "no temporary file left behind");
    }
}
