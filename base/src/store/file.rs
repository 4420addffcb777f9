//! The `file://` backend: a local directory. Writes are atomic ([`crate::fs::write_atomic`], or a
//! temp file and a rename); the lock is an exclusive create (`O_EXCL`).

use std::path::{Path, PathBuf};

use super::StoreError;

#[derive(Debug, Clone)]
pub(super) struct FileStore {
    dir: PathBuf,
}

/// The mode of a stored object: private keys and secrets (`pki/private/`, `secrets/`) are the owner's
/// alone (0600), everything else is readable (0644).
fn mode_of(rel: &str) -> u32 {
    let rel = rel.trim_start_matches('/');
    if rel.starts_with("pki/private/") || rel.starts_with("secrets/") {
        0o600
    } else {
        0o644
    }
}

impl FileStore {
    pub fn new(dir: PathBuf) -> FileStore {
        FileStore { dir }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel.trim_start_matches('/'))
    }

    pub async fn get(&self, rel: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let path = self.path(rel);
        match tokio::fs::read(&path).await {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(StoreError::Io { path, source }),
        }
    }

    pub fn put(&self, rel: &str, bytes: &[u8]) -> Result<(), StoreError> {
        let path = self.path(rel);
        crate::fs::write_atomic(&path, bytes, mode_of(rel), None).map_err(|e| StoreError::Io { path: e.path, source: e.source })
    }

    pub fn delete(&self, rel: &str) -> Result<(), StoreError> {
        let path = self.path(rel);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(StoreError::Io { path, source }),
        }
    }

    pub async fn put_file(&self, rel: &str, source: &Path) -> Result<(), StoreError> {
        let path = self.path(rel);
        let (src, dst) = (source.to_path_buf(), path.clone());
        tokio::task::spawn_blocking(move || copy_atomic(&src, &dst))
            .await
            .map_err(|e| StoreError::Io { path: path.clone(), source: std::io::Error::other(e) })?
            .map_err(|source| StoreError::Io { path, source })
    }

    /// `url` names the object in a failure of `sink`.
    pub async fn read_chunks(&self, rel: &str, url: &str, sink: &mut (dyn FnMut(&[u8]) -> std::io::Result<()> + Send)) -> Result<Option<u64>, StoreError> {
        use tokio::io::AsyncReadExt as _;
        let path = self.path(rel);
        let mut f = match tokio::fs::File::open(&path).await {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(StoreError::Io { path, source }),
        };
        let mut buf = vec![0u8; 1 << 16];
        let mut total = 0u64;
        loop {
            let n = f.read(&mut buf).await.map_err(|source| StoreError::Io { path: path.clone(), source })?;
            if n == 0 {
                return Ok(Some(total));
            }
            total += n as u64;
            sink(&buf[..n]).map_err(|source| StoreError::Io { path: PathBuf::from(url), source })?;
        }
    }

    pub fn list_modified(&self, rel_prefix: &str) -> Result<Vec<(String, Option<time::OffsetDateTime>)>, StoreError> {
        let dir = &self.dir;
        let mut out = Vec::new();
        let mut stack = vec![dir.join(rel_prefix)];
        while let Some(d) = stack.pop() {
            let entries = match std::fs::read_dir(&d) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound || e.kind() == std::io::ErrorKind::NotADirectory => continue,
                Err(source) => return Err(StoreError::Io { path: d, source }),
            };
            for e in entries.flatten() {
                let p = e.path();
                if e.file_name().to_string_lossy().starts_with(crate::fs::TEMP_PREFIX) {
                    continue;
                }
                let meta = match std::fs::metadata(&p) {
                    Ok(m) => m,
                    // Deleted since it was listed.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(source) => return Err(StoreError::Io { path: p, source }),
                };
                if meta.is_dir() {
                    stack.push(p);
                } else if let Ok(rel) = p.strip_prefix(dir) {
                    out.push((rel.to_string_lossy().into_owned(), meta.modified().ok().map(time::OffsetDateTime::from)));
                }
            }
        }
        out.sort();
        Ok(out)
    }

    /// Create `rel` holding `content` only if it does not exist (`O_EXCL`): `Ok(None)` when
    /// created, `Ok(Some(what is there))` when it already exists.
    pub fn create_exclusive(&self, rel: &str, content: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let path = self.dir.join(rel);
        let io = |source| StoreError::Io { path: path.clone(), source };
        std::fs::create_dir_all(&self.dir).map_err(io)?;
        match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(mut f) => {
                std::io::Write::write_all(&mut f, content).map_err(io)?;
                f.sync_all().map_err(io)?;
                Ok(None)
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(Some(std::fs::read(&path).unwrap_or_default())),
            Err(e) => Err(io(e)),
        }
    }
}

/// Copy `src` to `dst` through a temp file beside it (fsync, rename): readers see the whole file or nothing.
fn copy_atomic(src: &Path, dst: &Path) -> std::io::Result<()> {
    if let Some(parent) = dst.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let temp = crate::fs::temp_path_for(dst);
    let result = (|| {
        std::fs::copy(src, &temp)?;
        std::fs::File::open(&temp)?.sync_all()?;
        std::fs::rename(&temp, dst)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn private_keys_and_secrets_are_written_0600() {
        let d = tempfile::tempdir().expect("tempdir");
        let store = FileStore::new(d.path().to_path_buf());
        for (rel, want) in [
            ("pki/private/kubernetes-ca/keyset.yaml", 0o600),
            ("/secrets/dockerconfig", 0o600),
            ("pki/issued/kubernetes-ca/keyset.yaml", 0o644),
            ("cluster-completed.spec", 0o644),
        ] {
            store.put(rel, b"x").expect("put");
            let mode = std::fs::metadata(store.path(rel)).expect("stat").permissions().mode() & 0o777;
            assert_eq!(mode, want, "{rel}: mode {mode:o}");
        }
    }
}
