//! What a cluster keeps in its state store, as plan resources: the compiled files (compared by
//! sha256) and the cluster's CAs, created on first apply and never regenerated.

use std::collections::BTreeMap;
use std::path::PathBuf;

use base::StateStore;

use super::plan::{Kind, Resource};

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error(transparent)]
    Store(#[from] base::StoreError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("creating the cluster CAs: {0}")]
    Pki(#[from] base::pki::PkiError),
}

/// The keysets whose presence marks "the cluster's PKI exists".
pub const CA_MARKER: &str = "pki/private/kubernetes-ca/keyset.yaml";

/// The state files the compiled tree wants, as plan resources (compared by sha256), plus the CA
/// keysets as one resource that exists once created.
pub fn desired(state: &BTreeMap<String, Vec<u8>>) -> Vec<Resource> {
    let mut out: Vec<Resource> =
        state.iter().map(|(rel, bytes)| Resource::new(Kind::StateFile, rel.clone()).attr("sha256", base::sha256_hex(bytes))).collect();
    out.push(Resource::new(Kind::Keyset, "pki (cluster CAs, service-account key, bootstrap token)"));
    out
}

/// What the store holds for the desired files (reads only).
pub async fn discover(
    store: &StateStore,
    state: &BTreeMap<String, Vec<u8>>,
    etcd_clusters: &[String],
) -> Result<Vec<Resource>, StateError> {
    let mut out = Vec::new();
    for rel in state.keys() {
        if let Some(bytes) = store.get(rel).await? {
            out.push(Resource::new(Kind::StateFile, rel.clone()).attr("sha256", base::sha256_hex(&bytes)));
        }
    }
    // Complete only when every keyset (both halves) and the bootstrap token exist, so a run that
    // stopped half-way through uploading the PKI finishes it next time.
    let mut have: std::collections::BTreeSet<String> = store.list("pki/").await?.into_iter().collect();
    have.extend(store.list("secrets/").await?);
    if pki_files(etcd_clusters).iter().all(|f| have.contains(f)) {
        out.push(Resource::new(Kind::Keyset, "pki (cluster CAs, service-account key, bootstrap token)"));
    }
    Ok(out)
}

/// Every file the PKI consists of.
pub fn pki_files(etcd_clusters: &[String]) -> Vec<String> {
    let mut names = base::pki::ca_names(etcd_clusters);
    names.push("service-account".into());
    let mut out: Vec<String> = names
        .iter()
        .flat_map(|n| [format!("pki/private/{n}/keyset.yaml"), format!("pki/issued/{n}/keyset.yaml")])
        .collect();
    out.push("secrets/node-bootstrap-token".into());
    out
}

/// Everything apply wrote (for `keelson delete`): the compiled files, not the PKI.
pub async fn discover_for_delete(store: &StateStore) -> Result<Vec<Resource>, StateError> {
    let mut out = Vec::new();
    for prefix in ["cluster-completed.spec", "igconfig/", "instancegroup/", "addons/"] {
        for rel in store.list(prefix).await? {
            out.push(Resource::new(Kind::StateFile, rel));
        }
    }
    Ok(out)
}

/// Create the CAs on first apply. For `s3://` the existing PKI files are copied into a temporary
/// directory, the creator fills in what is missing, and only new files are uploaded; nothing that
/// exists is ever overwritten.
pub async fn ensure_pki(store: &StateStore, etcd_clusters: &[String]) -> Result<Vec<String>, StateError> {
    if let Some(dir) = store.local_dir() {
        std::fs::create_dir_all(dir).map_err(|source| StateError::Io { path: dir.to_path_buf(), source })?;
        return Ok(base::pki::init_pki(dir, etcd_clusters)?);
    }
    let tmp = tempfile::tempdir().map_err(|source| StateError::Io { path: std::env::temp_dir(), source })?;
    let local = StateStore::dir(tmp.path());
    let mut existing = Vec::new();
    for prefix in ["pki/", "secrets/"] {
        for rel in store.list(prefix).await? {
            if let Some(bytes) = store.get(&rel).await? {
                local.put(&rel, &bytes).await?;
                existing.push(rel);
            }
        }
    }
    let created = base::pki::init_pki(tmp.path(), etcd_clusters)?;
    for prefix in ["pki/", "secrets/"] {
        for rel in local.list(prefix).await? {
            if existing.contains(&rel) {
                continue;
            }
            if let Some(bytes) = local.get(&rel).await? {
                store.put(&rel, &bytes).await?;
            }
        }
    }
    Ok(created)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn file_store_pki_is_created_once() {
        let d = tempfile::tempdir().expect("tempdir");
        let store = StateStore::dir(d.path());
        let created = ensure_pki(&store, &["main".into()]).await.expect("pki");
        assert!(created.contains(&"kubernetes-ca".to_string()));
        let before = store.get(CA_MARKER).await.expect("get").expect("ca exists");
        assert!(ensure_pki(&store, &["main".into()]).await.expect("pki again").is_empty());
        assert_eq!(store.get(CA_MARKER).await.expect("get").expect("ca"), before, "never regenerated");
        let have: std::collections::BTreeSet<String> =
            [store.list("pki/").await.expect("list"), store.list("secrets/").await.expect("list")].concat().into_iter().collect();
        for f in pki_files(&["main".into()]) {
            assert!(have.contains(&f), "{f} missing");
        }
    }
}
