//! The cluster lock: an object under ConfigBase that keeps two apply / delete / rolling-update runs
//! apart, created exclusively by each backend and naming who holds it.

use super::{Backend, StateStore, StoreError, LOCK_FILE};

impl StateStore {
    /// Take the cluster lock for `operation`, or fail naming who holds it. Creation is atomic:
    /// `O_EXCL` for `file://`, a conditional PUT (`If-None-Match: *`) for `s3://`, a create with
    /// `ifGenerationMatch=0` for `gs://`.
    pub async fn lock(&self, operation: &str) -> Result<StoreLock, StoreError> {
        let content = lock_content(operation);
        let held = match &self.backend {
            Backend::File(f) => f.create_exclusive(LOCK_FILE, &content)?,
            Backend::Http(_) => return Err(self.read_only("lock")),
            #[cfg(feature = "aws")]
            Backend::S3(s3) => s3.create_exclusive(LOCK_FILE, &content).await?,
            Backend::Gcs(g) => g.create_exclusive(LOCK_FILE, &content).await?,
        };
        if let Some(holder) = held {
            return Err(StoreError::Locked { store: self.base.to_string(), holder: describe_holder(&holder) });
        }
        Ok(StoreLock { store: self.clone(), content })
    }

    /// Remove a lock left by a run that died; returns who held it.
    pub async fn force_unlock(&self) -> Result<Option<String>, StoreError> {
        let holder = self.get(LOCK_FILE).await?;
        if holder.is_some() {
            self.delete(LOCK_FILE).await?;
        }
        Ok(holder.map(|h| describe_holder(&h)))
    }
}

/// A held lock; [`StoreLock::release`] removes it if it is still ours.
#[derive(Debug)]
pub struct StoreLock {
    store: StateStore,
    content: Vec<u8>,
}

impl StoreLock {
    pub async fn release(self) -> Result<(), StoreError> {
        // Never remove a lock someone else took after a --force-unlock.
        if self.store.get(LOCK_FILE).await?.as_deref() == Some(self.content.as_slice()) {
            self.store.delete(LOCK_FILE).await?;
        }
        Ok(())
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn lock_content(operation: &str) -> Vec<u8> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".into());
    let nonce = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("operation: {operation}\nhost: {host}\npid: {}\nsince: {}\nnonce: {nonce:x}\n", std::process::id(), unix_now()).into_bytes()
}

/// "keelson apply on host (pid 12), 3m ago" from a lock file's content.
fn describe_holder(content: &[u8]) -> String {
    let text = String::from_utf8_lossy(content);
    let field = |k: &str| text.lines().find_map(|l| l.strip_prefix(&format!("{k}: "))).unwrap_or("?").to_string();
    let age = field("since").parse::<u64>().ok().map(|t| unix_now().saturating_sub(t));
    let age = match age {
        Some(s) if s >= 3600 => format!("{}h{}m ago", s / 3600, (s % 3600) / 60),
        Some(s) if s >= 60 => format!("{}m ago", s / 60),
        Some(s) => format!("{s}s ago"),
        None => "at an unknown time".into(),
    };
    format!("keelson {} on {} (pid {}), {age}", field("operation"), field("host"), field("pid"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_lock_keeps_a_second_run_out_and_names_the_holder() {
        let d = tempfile::tempdir().expect("tempdir");
        let store = StateStore::dir(&d.path().join("c"));
        let first = store.lock("apply").await.expect("first lock");
        let err = store.lock("delete").await.expect_err("second run is kept out");
        let text = err.to_string();
        assert!(text.contains("keelson apply on") && text.contains(&format!("pid {}", std::process::id())), "{text}");
        assert!(text.contains("--force-unlock"), "{text}");
        first.release().await.expect("release");
        let second = store.lock("delete").await.expect("free again");
        // A lock taken over with --force-unlock is not removed by the run that lost it.
        let holder = store.force_unlock().await.expect("force").expect("held");
        assert!(holder.contains("keelson delete"), "{holder}");
        let third = store.lock("rolling-update").await.expect("taken over");
        second.release().await.expect("stale release is a no-op");
        assert!(store.lock("apply").await.is_err(), "the new holder still holds it");
        third.release().await.expect("release");
        assert_eq!(store.get(LOCK_FILE).await.expect("get"), None);
    }
}
