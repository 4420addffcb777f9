//! What a cluster keeps in its state store, as plan resources: the compiled files (compared by
//! sha256), the cluster's CAs and (with `spec.encryptionConfig: true`) the API servers' encryption
//! configuration `secrets/encryptionconfig`, created on first apply and never regenerated.

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
    #[error("creating the encryption configuration: {0}")]
    Encryption(#[from] base::encryption::EncryptionError),
    #[error("StateFile {0}: not in the compiled state")]
    NotCompiled(String),
}

/// Execute one change of the state store (a compiled file, the PKI); `Ok(false)` when `c` is a
/// cloud resource's change (the target's to execute).
pub async fn execute_change(
    store: &StateStore,
    state: &BTreeMap<String, Vec<u8>>,
    etcd_clusters: &[String],
    encryption: bool,
    c: &super::plan::Change,
) -> Result<bool, StateError> {
    use super::plan::Action;
    match (c.kind, &c.action) {
        (Kind::StateFile, Action::Create | Action::Update(_)) => {
            let bytes = state.get(&c.name).ok_or_else(|| StateError::NotCompiled(c.name.clone()))?;
            store.put(&c.name, bytes).await?;
        }
        (Kind::StateFile, Action::Delete) => store.delete(&c.name).await?,
        (Kind::Keyset, Action::Create) => {
            ensure_pki(store, etcd_clusters, encryption).await?;
        }
        (Kind::Keyset, _) => {}
        _ => return Ok(false),
    }
    Ok(true)
}

/// The keysets whose presence marks "the cluster's PKI exists".
pub const CA_MARKER: &str = "pki/private/kubernetes-ca/keyset.yaml";

/// The plan resource of the CA keysets, service-account key and bootstrap token.
pub const PKI_RESOURCE: &str = "pki (cluster CAs, service-account key, bootstrap token)";

/// The plan resource of the encryption configuration (`spec.encryptionConfig: true`).
pub const ENCRYPTION_RESOURCE: &str = "secrets/encryptionconfig (encryption at rest key)";

/// The state files the compiled tree wants, as plan resources (compared by sha256), plus the CA
/// keysets as one resource that exists once created, and the encryption configuration when
/// `encryption` (never compared: its content is the operator's once created).
pub fn desired(state: &BTreeMap<String, Vec<u8>>, encryption: bool) -> Vec<Resource> {
    let mut out: Vec<Resource> = state.iter().map(|(rel, bytes)| Resource::new(Kind::StateFile, rel.clone()).attr("sha256", base::sha256_hex(bytes))).collect();
    out.push(Resource::new(Kind::Keyset, PKI_RESOURCE));
    if encryption {
        out.push(Resource::new(Kind::Keyset, ENCRYPTION_RESOURCE));
    }
    out
}

/// What the store holds for the desired files (reads only).
pub async fn discover(store: &StateStore, state: &BTreeMap<String, Vec<u8>>, etcd_clusters: &[String], encryption: bool) -> Result<Vec<Resource>, StateError> {
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
        out.push(Resource::new(Kind::Keyset, PKI_RESOURCE));
    }
    if encryption && have.contains(base::encryption::SECRET_PATH) {
        out.push(Resource::new(Kind::Keyset, ENCRYPTION_RESOURCE));
    }
    Ok(out)
}

/// Every file the PKI consists of.
pub fn pki_files(etcd_clusters: &[String]) -> Vec<String> {
    let mut names = base::pki::ca_names(etcd_clusters);
    names.push("service-account".into());
    names.iter().flat_map(|n| [format!("pki/private/{n}/keyset.yaml"), format!("pki/issued/{n}/keyset.yaml")]).collect()
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

/// Create what the PKI lacks, and `secrets/encryptionconfig` when `encryption` and it is not
/// there (first apply, or the first apply with `spec.encryptionConfig: true`). For `s3://` the
/// existing PKI files are copied into a temporary directory, the creators fill in what is missing,
/// and only new files are uploaded; nothing that exists is ever overwritten. Returns the names
/// created (never their contents).
pub async fn ensure_pki(store: &StateStore, etcd_clusters: &[String], encryption: bool) -> Result<Vec<String>, StateError> {
    let create = |dir: &std::path::Path| -> Result<Vec<String>, StateError> {
        let mut created = base::pki::init_pki(dir, etcd_clusters)?;
        if encryption && base::encryption::ensure(dir)? {
            created.push(base::encryption::SECRET_PATH.to_string());
        }
        Ok(created)
    };
    if let Some(dir) = store.local_dir() {
        std::fs::create_dir_all(dir).map_err(|source| StateError::Io { path: dir.to_path_buf(), source })?;
        return create(dir);
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
    let created = create(tmp.path())?;
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
        let created = ensure_pki(&store, &["main".into()], false).await.expect("pki");
        assert!(created.contains(&"kubernetes-ca".to_string()));
        assert!(store.get(base::encryption::SECRET_PATH).await.expect("get").is_none(), "no encryption configuration unless asked");
        let before = store.get(CA_MARKER).await.expect("get").expect("ca exists");
        assert!(ensure_pki(&store, &["main".into()], false).await.expect("pki again").is_empty());
        assert_eq!(store.get(CA_MARKER).await.expect("get").expect("ca"), before, "never regenerated");
        let have: std::collections::BTreeSet<String> =
            [store.list("pki/").await.expect("list"), store.list("secrets/").await.expect("list")].concat().into_iter().collect();
        for f in pki_files(&["main".into()]) {
            assert!(have.contains(&f), "{f} missing");
        }
    }

    /// Turning `spec.encryptionConfig` on for a cluster whose PKI exists: the plan wants the
    /// configuration, apply creates it once, and a later apply neither plans nor writes it again.
    #[tokio::test]
    async fn encryption_config_is_planned_created_once_and_never_regenerated() {
        let d = tempfile::tempdir().expect("tempdir");
        let store = StateStore::dir(d.path());
        let etcd = ["main".to_string()];
        ensure_pki(&store, &etcd, false).await.expect("pki");
        let state = BTreeMap::new();
        let missing = |actual: &[Resource]| !actual.iter().any(|r| r.name == ENCRYPTION_RESOURCE);
        assert!(desired(&state, true).iter().any(|r| r.name == ENCRYPTION_RESOURCE));
        assert!(!desired(&state, false).iter().any(|r| r.name == ENCRYPTION_RESOURCE));
        assert!(missing(&discover(&store, &state, &etcd, true).await.expect("discover")), "not there yet: planned");

        let created = ensure_pki(&store, &etcd, true).await.expect("encryption on");
        assert_eq!(created, vec![base::encryption::SECRET_PATH.to_string()], "only the configuration is new");
        assert_eq!(base::fs::mode_of(&d.path().join(base::encryption::SECRET_PATH)), Some(0o600));
        let before = store.get(base::encryption::SECRET_PATH).await.expect("get").expect("created");
        base::encryption::from_secret(&before).expect("a valid configuration");
        assert!(!missing(&discover(&store, &state, &etcd, true).await.expect("discover")), "there: nothing to plan");

        assert!(ensure_pki(&store, &etcd, true).await.expect("again").is_empty());
        assert_eq!(store.get(base::encryption::SECRET_PATH).await.expect("get").expect("kept"), before, "never regenerated");
    }
}
