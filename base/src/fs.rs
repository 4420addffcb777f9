//! The one way Keelson writes files: a temp file in the same directory, mode (and owner) set,
//! data synced, renamed over the target, then the directory synced. A reader (or a crash) sees
//! the old file or the new one, never half of one. Stale temp files from a killed run are
//! recognisable by [`TEMP_PREFIX`] and removed by [`clean_temp_files`].

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Prefix of every temp file/dir Keelson creates next to its targets.
pub const TEMP_PREFIX: &str = ".keelson-tmp-";

/// A write failed; carries the path it was about.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct FsError {
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

pub fn fs_err(path: &Path) -> impl FnOnce(io::Error) -> FsError + '_ {
    move |source| FsError { path: path.to_path_buf(), source }
}

/// Owner to set on a written file (uid, gid); `None` keeps the writer's.
pub type Owner = Option<(u32, u32)>;

/// The directory `path` is in (`.` for a bare relative name).
fn parent_of(path: &Path) -> &Path {
    path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// A unique temp path next to `target`.
pub fn temp_path_for(target: &Path) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    parent_of(target).join(format!("{TEMP_PREFIX}{}-{n}-{name}", std::process::id()))
}

/// Create `dir` and its parents (mode 0755 for new ones).
pub fn ensure_dir(dir: &Path) -> Result<(), FsError> {
    if dir.is_dir() {
        return Ok(());
    }
    fs::DirBuilder::new().recursive(true).mode(0o755).create(dir).map_err(fs_err(dir))
}

/// Mode of directories that hold secrets (etcd snapshots): only root may enter.
pub const PRIVATE_DIR_MODE: u32 = 0o700;
/// Mode of files that hold secrets (etcd snapshots): only root may read.
pub const PRIVATE_FILE_MODE: u32 = 0o600;

/// Create `dir` and its missing parents at [`PRIVATE_DIR_MODE`], and put `dir` itself at that mode
/// if it already existed (a staging directory an older version made 0755 is closed too).
pub fn ensure_private_dir(dir: &Path) -> Result<(), FsError> {
    fs::DirBuilder::new().recursive(true).mode(PRIVATE_DIR_MODE).create(dir).map_err(fs_err(dir))?;
    if mode_of(dir) != Some(PRIVATE_DIR_MODE) {
        fs::set_permissions(dir, fs::Permissions::from_mode(PRIVATE_DIR_MODE)).map_err(fs_err(dir))?;
    }
    Ok(())
}

/// Create (or truncate) `path` for writing at [`PRIVATE_FILE_MODE`], whatever the umask, and
/// whatever mode a file already there had.
pub fn create_private(path: &Path) -> io::Result<File> {
    let f = OpenOptions::new().write(true).create(true).truncate(true).mode(PRIVATE_FILE_MODE).open(path)?;
    f.set_permissions(fs::Permissions::from_mode(PRIVATE_FILE_MODE))?;
    Ok(f)
}

/// fsync a directory so a rename in it survives power loss.
pub fn sync_dir(dir: &Path) -> Result<(), FsError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(fs_err(dir))
}

/// Atomically replace `path` with `contents` at `mode`, durably: the file and its directory are
/// synced before this returns.
pub fn write_atomic(path: &Path, contents: &[u8], mode: u32, owner: Owner) -> Result<(), FsError> {
    ensure_dir(parent_of(path))?;
    replace(path, contents, mode, owner, true)?;
    sync_dir(parent_of(path))
}

/// Atomically replace `path` with `contents` at `mode` — a reader sees the old file or the new one,
/// never half of it — without syncing: for output that is rebuilt on demand, where the caller syncs
/// once at the end if at all ([`crate::Tree::write_to`]).
pub fn write_atomic_unsynced(path: &Path, contents: &[u8], mode: u32) -> Result<(), FsError> {
    ensure_dir(parent_of(path))?;
    replace(path, contents, mode, None, false)
}

/// [`write_atomic_unsynced`] into a directory the caller has made sure exists (no check per file).
pub fn write_atomic_unsynced_in_dir(path: &Path, contents: &[u8], mode: u32) -> Result<(), FsError> {
    replace(path, contents, mode, None, false)
}

fn replace(path: &Path, contents: &[u8], mode: u32, owner: Owner, sync: bool) -> Result<(), FsError> {
    let tmp = temp_path_for(path);
    let result = (|| {
        let mut f = OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp).map_err(fs_err(&tmp))?;
        f.write_all(contents).map_err(fs_err(&tmp))?;
        // create_new honours the umask; set the exact mode explicitly.
        f.set_permissions(fs::Permissions::from_mode(mode)).map_err(fs_err(&tmp))?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::fchown(&f, Some(uid), Some(gid)).map_err(fs_err(&tmp))?;
        }
        if sync {
            f.sync_all().map_err(fs_err(&tmp))?;
        }
        fs::rename(&tmp, path).map_err(fs_err(path))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Atomically make `path` a hard link to `source` (or a copy when they are on different
/// filesystems), at `mode`.
pub fn link_atomic(source: &Path, path: &Path, mode: u32) -> Result<(), FsError> {
    let dir = parent_of(path);
    ensure_dir(dir)?;
    let tmp = temp_path_for(path);
    let result = (|| {
        match fs::hard_link(source, &tmp) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(18) /* EXDEV */ || e.kind() == io::ErrorKind::PermissionDenied => {
                let mut src = File::open(source).map_err(fs_err(source))?;
                let mut dst = OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp).map_err(fs_err(&tmp))?;
                io::copy(&mut src, &mut dst).map_err(fs_err(&tmp))?;
                dst.sync_all().map_err(fs_err(&tmp))?;
            }
            Err(e) => return Err(FsError { path: tmp.clone(), source: e }),
        }
        fs::set_permissions(&tmp, fs::Permissions::from_mode(mode)).map_err(fs_err(&tmp))?;
        fs::rename(&tmp, path).map_err(fs_err(path))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result?;
    sync_dir(dir)
}

/// Atomically make `link` a symlink pointing at `target`.
pub fn symlink_atomic(target: &Path, link: &Path) -> Result<(), FsError> {
    let dir = parent_of(link);
    ensure_dir(dir)?;
    let tmp = temp_path_for(link);
    std::os::unix::fs::symlink(target, &tmp).map_err(fs_err(&tmp))?;
    if let Err(e) = fs::rename(&tmp, link) {
        let _ = fs::remove_file(&tmp);
        return Err(FsError { path: link.to_path_buf(), source: e });
    }
    sync_dir(dir)
}

/// Whether `a` and `b` are the same inode.
pub fn same_file(a: &Path, b: &Path) -> bool {
    match (fs::metadata(a), fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// Permission bits of `path`, if it exists.
pub fn mode_of(path: &Path) -> Option<u32> {
    fs::symlink_metadata(path).ok().map(|m| m.permissions().mode() & 0o7777)
}

/// Remove temp files/dirs a killed run left in `dir` (non-recursive). Returns how many.
pub fn clean_temp_files(dir: &Path) -> usize {
    let Ok(entries) = fs::read_dir(dir) else { return 0 };
    let mut n = 0;
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
            let p = e.path();
            let ok = if p.is_dir() && !p.is_symlink() { fs::remove_dir_all(&p) } else { fs::remove_file(&p) };
            if ok.is_ok() {
                n += 1;
            }
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_dirs_and_files_are_root_only() {
        let d = tempfile::tempdir().expect("tempdir");
        // New: the directory and its new parents 0700, the file 0600.
        let dir = d.path().join("var/lib/protokube/etcd-backups");
        ensure_private_dir(&dir).expect("create");
        assert_eq!(mode_of(&dir), Some(0o700));
        assert_eq!(mode_of(&d.path().join("var/lib")), Some(0o700));
        let file = dir.join("main.db");
        drop(create_private(&file).expect("file"));
        assert_eq!(mode_of(&file), Some(0o600));
        // Already there, open to all: closed.
        let old = d.path().join("old");
        fs::DirBuilder::new().mode(0o755).create(&old).expect("old dir");
        fs::set_permissions(&old, fs::Permissions::from_mode(0o755)).expect("chmod");
        ensure_private_dir(&old).expect("existing");
        assert_eq!(mode_of(&old), Some(0o700));
        let open = old.join("snap.db");
        fs::write(&open, b"old contents").expect("write");
        fs::set_permissions(&open, fs::Permissions::from_mode(0o644)).expect("chmod");
        drop(create_private(&open).expect("reopen"));
        assert_eq!(mode_of(&open), Some(0o600));
        assert_eq!(fs::read(&open).expect("read"), b"", "truncated");
    }

    #[test]
    fn write_replaces_and_sets_mode() {
        let d = tempfile::tempdir().expect("tempdir");
        let p = d.path().join("a/b/c.txt");
        write_atomic(&p, b"one", 0o600, None).expect("write");
        assert_eq!(fs::read(&p).expect("read"), b"one");
        assert_eq!(mode_of(&p), Some(0o600));
        write_atomic(&p, b"two", 0o644, None).expect("write");
        assert_eq!(fs::read(&p).expect("read"), b"two");
        assert_eq!(mode_of(&p), Some(0o644));
        let leftovers: Vec<_> =
            fs::read_dir(p.parent().expect("parent")).expect("ls").flatten().filter(|e| e.file_name().to_string_lossy().starts_with(TEMP_PREFIX)).collect();
        assert!(leftovers.is_empty());
    }

    #[test]
    fn link_and_symlink() {
        let d = tempfile::tempdir().expect("tempdir");
        let src = d.path().join("src");
        fs::write(&src, b"bin").expect("write");
        let dst = d.path().join("x/dst");
        link_atomic(&src, &dst, 0o755).expect("link");
        assert!(same_file(&src, &dst));
        assert_eq!(mode_of(&dst), Some(0o755));
        let l = d.path().join("y/l");
        symlink_atomic(Path::new("/etc/foo"), &l).expect("symlink");
        assert_eq!(fs::read_link(&l).expect("readlink"), Path::new("/etc/foo"));
        symlink_atomic(Path::new("/etc/bar"), &l).expect("symlink again");
        assert_eq!(fs::read_link(&l).expect("readlink"), Path::new("/etc/bar"));
    }

    #[test]
    fn cleans_stale_temps() {
        let d = tempfile::tempdir().expect("tempdir");
        fs::write(d.path().join(format!("{TEMP_PREFIX}1-x")), b"half").expect("write");
        fs::create_dir(d.path().join(format!("{TEMP_PREFIX}2-d"))).expect("mkdir");
        fs::write(d.path().join("keep"), b"k").expect("write");
        assert_eq!(clean_temp_files(d.path()), 2);
        assert!(d.path().join("keep").exists());
    }
}
