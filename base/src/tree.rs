//! A tree of files: relative path → bytes, sorted so output order is deterministic. The compiler's
//! output, the Terraform a target renders, the state a cluster keeps in its store.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::fs::{ensure_dir, write_atomic_unsynced_in_dir, FsError};

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
    /// made 2,000 instance groups take half a minute on disks that honour them. A file already
    /// there with the same bytes and mode is left alone (a recompile of an unchanged spec writes
    /// nothing, and tools that watch mtimes see only what changed). Returns how many were written.
    ///
    /// Each directory is made once, not checked again for every file.
    pub fn write_to(&self, dir: &Path) -> Result<usize, FsError> {
        let dirs: BTreeSet<PathBuf> = self.files.keys().filter_map(|rel| dir.join(rel).parent().map(Path::to_path_buf)).collect();
        for d in &dirs {
            ensure_dir(d)?;
        }
        let mut written = 0;
        for (rel, bytes) in &self.files {
            let path = dir.join(rel);
            if !already(&path, bytes) {
                write_atomic_unsynced_in_dir(&path, bytes, 0o600)?;
                written += 1;
            }
        }
        Ok(written)
    }
}

/// Whether `path` is a regular file, mode 0600, holding exactly `bytes`.
fn already(path: &Path, bytes: &[u8]) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    let Ok(meta) = std::fs::symlink_metadata(path) else { return false };
    meta.is_file() && meta.permissions().mode() & 0o7777 == 0o600 && meta.len() == bytes.len() as u64 && std::fs::read(path).is_ok_and(|b| b == bytes)
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

    #[test]
    fn an_unchanged_file_is_not_rewritten_a_changed_or_loose_one_is() {
        let dir = tempfile::tempdir().expect("tmp");
        let mut t = Tree::default();
        t.insert("a", "1");
        t.insert("b", "2");
        t.insert("c", "3");
        assert_eq!(t.write_to(dir.path()).expect("write"), 3);
        let inode = |f: &str| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(dir.path().join(f)).expect("stat"));
        let before = (inode("a"), inode("b"), inode("c"));
        // b's mode loosened by hand, c's bytes changed in the tree: both rewritten; a left alone.
        std::fs::set_permissions(dir.path().join("b"), std::fs::Permissions::from_mode(0o644)).expect("chmod");
        t.insert("c", "33");
        assert_eq!(t.write_to(dir.path()).expect("rewrite"), 2);
        assert_eq!(inode("a"), before.0);
        assert_ne!((inode("b"), inode("c")), (before.1, before.2));
        assert_eq!(std::fs::metadata(dir.path().join("b")).expect("stat").permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read_to_string(dir.path().join("c")).expect("c"), "33");
        assert_eq!(t.write_to(dir.path()).expect("again"), 0);
    }
}
