//! `keelson export kubeconfig --admin`: a short-lived cluster-admin client certificate signed by the
//! cluster CA in the state store, written as a kubeconfig context named after the cluster (merged
//! into an existing kubeconfig: other clusters, users and contexts are kept).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_yaml_ng::{Mapping, Value};

/// The CA keyset kube-apiserver trusts for client certificates.
pub const CLIENT_CA: &str = "kubernetes-ca";
/// Group of the admin certificate: bound to `cluster-admin` by Kubernetes itself.
pub const ADMIN_GROUP: &str = "system:masters";

#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    #[error("state store has no {0} (run `keelson apply --yes` first; it creates the cluster CAs)")]
    NoCa(String),
    #[error("cluster CA {name}: {source}")]
    Pki {
        name: String,
        #[source]
        source: base::pki::PkiError,
    },
    #[error("kubeconfig {path}: {reason}")]
    Existing { path: PathBuf, reason: String },
    #[error("kubeconfig {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--ttl {0}: must be between 1 minute and 455 days")]
    Ttl(String),
}

/// A freshly issued admin credential.
#[derive(Debug, Clone)]
pub struct AdminCredential {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

/// Issue an admin client certificate valid for `ttl`, from the CA keyset bytes of the state store
/// (`pki/private/kubernetes-ca/keyset.yaml`).
pub fn issue_admin(private_keyset: &[u8], user: &str, ttl: Duration) -> Result<AdminCredential, KubeconfigError> {
    if ttl < Duration::from_secs(60) || ttl > Duration::from_secs(455 * 86400) {
        return Err(KubeconfigError::Ttl(format!("{}s", ttl.as_secs())));
    }
    let pki_err = |source| KubeconfigError::Pki { name: CLIENT_CA.into(), source };
    let keyset = base::keyset::Keyset::parse(CLIENT_CA, private_keyset).map_err(pki_err)?;
    let ca = keyset.primary_keypair().map_err(pki_err)?;
    let spec = base::pki::CertSpec::client(user, &[ADMIN_GROUP]);
    let leaf = base::pki::issue_for(CLIENT_CA, &ca, &spec, ttl).map_err(pki_err)?;
    // Every trusted key: mid-rotation the API servers may serve from either.
    Ok(AdminCredential { ca_pem: keyset.trust_bundle(), cert_pem: leaf.cert_pem, key_pem: leaf.key_pem })
}

fn b64(s: &str) -> Value {
    use base64::Engine as _;
    Value::from(base64::engine::general_purpose::STANDARD.encode(s.as_bytes()))
}

fn named(name: &str, key: &str, body: Mapping) -> Value {
    let mut m = Mapping::new();
    m.insert("name".into(), name.into());
    m.insert(key.into(), Value::Mapping(body));
    Value::Mapping(m)
}

/// Replace (or append) the entry called `name` in the list `list` of `doc`.
fn upsert(doc: &mut Mapping, list: &str, entry: Value, name: &str) -> Result<(), String> {
    let v = doc.entry(list.into()).or_insert_with(|| Value::Sequence(vec![]));
    if v.is_null() {
        *v = Value::Sequence(vec![]);
    }
    let seq = v.as_sequence_mut().ok_or_else(|| format!("{list}: expected a list"))?;
    match seq.iter_mut().find(|e| e.get("name").and_then(Value::as_str) == Some(name)) {
        Some(slot) => *slot = entry,
        None => seq.push(entry),
    }
    Ok(())
}

/// Merge a context `cluster` (cluster, user and context all named so) into the kubeconfig text
/// `existing` (empty: a new file) and make it the current context.
pub fn merge(existing: &str, cluster: &str, server: &str, cred: &AdminCredential) -> Result<String, String> {
    let mut doc: Mapping = if existing.trim().is_empty() {
        Mapping::new()
    } else {
        match serde_yaml_ng::from_str::<Value>(existing).map_err(|e| format!("not YAML: {e}"))? {
            Value::Mapping(m) => m,
            Value::Null => Mapping::new(),
            _ => return Err("expected a mapping at the top".into()),
        }
    };
    doc.insert("apiVersion".into(), "v1".into());
    doc.insert("kind".into(), "Config".into());
    let mut c = Mapping::new();
    c.insert("certificate-authority-data".into(), b64(&cred.ca_pem));
    c.insert("server".into(), server.into());
    upsert(&mut doc, "clusters", named(cluster, "cluster", c), cluster)?;
    let mut u = Mapping::new();
    u.insert("client-certificate-data".into(), b64(&cred.cert_pem));
    u.insert("client-key-data".into(), b64(&cred.key_pem));
    upsert(&mut doc, "users", named(cluster, "user", u), cluster)?;
    let mut x = Mapping::new();
    x.insert("cluster".into(), cluster.into());
    x.insert("user".into(), cluster.into());
    upsert(&mut doc, "contexts", named(cluster, "context", x), cluster)?;
    doc.insert("current-context".into(), cluster.into());
    serde_yaml_ng::to_string(&Value::Mapping(doc)).map_err(|e| e.to_string())
}

/// Merge into the file at `path` (created if missing), atomically, mode 0600 (it holds a key).
pub fn write_merged(path: &Path, cluster: &str, server: &str, cred: &AdminCredential) -> Result<(), KubeconfigError> {
    let io = |source| KubeconfigError::Io { path: path.to_path_buf(), source };
    let existing = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(io(e)),
    };
    let text = merge(&existing, cluster, server, cred).map_err(|reason| KubeconfigError::Existing { path: path.to_path_buf(), reason })?;
    base::fs::write_atomic(path, text.as_bytes(), 0o600, None).map_err(|e| io(e.source))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cred() -> AdminCredential {
        let dir = tempfile::tempdir().expect("tmp");
        base::pki::init_pki(dir.path(), &[]).expect("pki");
        let keyset = std::fs::read(dir.path().join(format!("pki/private/{CLIENT_CA}/keyset.yaml"))).expect("keyset");
        issue_admin(&keyset, "admin", Duration::from_secs(3600)).expect("issue")
    }

    #[test]
    fn merge_keeps_other_contexts_and_replaces_ours() {
        let c = cred();
        let other = "apiVersion: v1\nkind: Config\nclusters:\n- name: other\n  cluster: {server: 'https://o'}\ncontexts:\n- name: other\n  context: {cluster: other, user: other}\nusers:\n- name: other\n  user: {token: t}\ncurrent-context: other\n";
        let once = merge(other, "c.example.com", "https://api.c.example.com", &c).unwrap();
        let twice = merge(&once, "c.example.com", "https://10.0.0.1", &c).unwrap();
        let v: Value = serde_yaml_ng::from_str(&twice).unwrap();
        assert_eq!(v["current-context"].as_str(), Some("c.example.com"));
        let clusters = v["clusters"].as_sequence().unwrap();
        assert_eq!(clusters.len(), 2, "{twice}");
        assert_eq!(clusters[1]["cluster"]["server"].as_str(), Some("https://10.0.0.1"));
        assert_eq!(v["users"].as_sequence().unwrap().len(), 2);
        assert!(merge("- a\n", "c", "s", &c).is_err());
    }

    #[test]
    fn admin_certificate_is_signed_by_the_ca_for_masters() {
        let c = cred();
        let dir = tempfile::tempdir().expect("tmp");
        let (cert, ca) = (dir.path().join("cert.pem"), dir.path().join("ca.pem"));
        std::fs::write(&cert, &c.cert_pem).unwrap();
        std::fs::write(&ca, &c.ca_pem).unwrap();
        let openssl = |args: &[&str]| {
            let out = std::process::Command::new("openssl").args(args).output().expect("openssl (apt-get install openssl)");
            assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
            String::from_utf8_lossy(&out.stdout).to_string()
        };
        let (cert_s, ca_s) = (cert.to_str().unwrap(), ca.to_str().unwrap());
        let subject = openssl(&["x509", "-in", cert_s, "-noout", "-subject", "-nameopt", "compat"]);
        assert!(subject.contains("CN=admin") && subject.contains("O=system:masters"), "{subject}");
        openssl(&["verify", "-CAfile", ca_s, cert_s]);
        // Valid now, expired in two hours (TTL 1 h, back-dated 1 h against skew).
        openssl(&["x509", "-in", cert_s, "-noout", "-checkend", "60"]);
        let later = std::process::Command::new("openssl").args(["x509", "-in", cert_s, "-noout", "-checkend", "7200"]).output().unwrap();
        assert!(!later.status.success(), "the certificate outlives its TTL");
        assert!(issue_admin(b"x", "a", Duration::from_secs(10)).is_err());
    }
}
