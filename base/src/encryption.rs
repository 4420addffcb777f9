//! Encryption at rest (`spec.encryptionConfig: true`), the kOps way: the kube-apiserver's
//! `EncryptionConfiguration` (`apiserver.config.k8s.io/v1`) is the secret `encryptionconfig` of the
//! state store (`secrets/encryptionconfig`, kOps secret JSON `{"Data": "<base64 of the YAML>"}`),
//! readable by the control planes only. nodeup writes it, 0600, to the file the API server's
//! `--encryption-provider-config` names.
//!
//! [`ensure`] creates it once — a `secretbox` key of 32 random bytes for Secrets, then `identity`
//! so data written before encryption was on stays readable — and never replaces it: the key
//! decrypts every Secret in etcd and in every backup. Rotation is the operator's (README).
//! Nothing here logs or formats key material: [`Key`]'s `Debug` is redacted.

use std::path::Path;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::pki::{self, PkiError};

/// The secret's name (kOps: `kops create secret encryptionconfig`).
pub const SECRET: &str = "encryptionconfig";

/// The secret's key under `ConfigBase`.
pub const SECRET_PATH: &str = "secrets/encryptionconfig";

const API_VERSION: &str = "apiserver.config.k8s.io/v1";
const KIND: &str = "EncryptionConfiguration";

/// Why an encryption configuration could not be made, read or stored. Never carries key material.
#[derive(Debug, thiserror::Error)]
pub enum EncryptionError {
    #[error("{what}: not a usable EncryptionConfiguration: {message}")]
    Invalid { what: String, message: String },
    #[error("generating the encryption key: {0}")]
    Random(#[source] std::io::Error),
    #[error("rendering the EncryptionConfiguration: {0}")]
    Render(#[source] serde_yaml_ng::Error),
    #[error(transparent)]
    Pki(#[from] PkiError),
}

/// `apiserver.config.k8s.io/v1` `EncryptionConfiguration`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EncryptionConfiguration {
    #[serde(rename = "apiVersion")]
    pub api_version: String,
    pub kind: String,
    pub resources: Vec<ResourceConfiguration>,
}

/// Which resources are encrypted and with what, first provider writes, every provider reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResourceConfiguration {
    pub resources: Vec<String>,
    pub providers: Vec<Provider>,
}

/// One provider: exactly one of the fields is set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Provider {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aescbc: Option<Keys>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aesgcm: Option<Keys>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secretbox: Option<Keys>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<Empty>,
    /// Passed through as written (a KMS plugin's settings are the plugin's business).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kms: Option<serde_yaml_ng::Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Empty {}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Keys {
    pub keys: Vec<Key>,
}

/// A named key, base64 of its bytes.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct Key {
    pub name: String,
    pub secret: String,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key").field("name", &self.name).field("secret", &"<redacted>").finish()
    }
}

/// The configuration [`ensure`] creates: Secrets written with a new 32-byte `secretbox` key
/// named `key_name`, read with it or as clear data (`identity`, last).
pub fn generate(key_name: &str) -> Result<EncryptionConfiguration, EncryptionError> {
    let mut key = [0u8; 32];
    pki::rand_core_shim::fill(&mut key).map_err(EncryptionError::Random)?;
    let secret = base64::engine::general_purpose::STANDARD.encode(key);
    Ok(EncryptionConfiguration {
        api_version: API_VERSION.into(),
        kind: KIND.into(),
        resources: vec![ResourceConfiguration {
            resources: vec!["secrets".into()],
            providers: vec![
                Provider { secretbox: Some(Keys { keys: vec![Key { name: key_name.into(), secret }] }), ..Default::default() },
                Provider { identity: Some(Empty {}), ..Default::default() },
            ],
        }],
    })
}

/// The YAML of a configuration, as the API server reads it.
pub fn to_yaml(config: &EncryptionConfiguration) -> Result<String, EncryptionError> {
    serde_yaml_ng::to_string(config).map_err(EncryptionError::Render)
}

/// Parse and check a configuration (`what` names it in errors): the kind and version the API
/// server reads, at least one resource entry, every provider exactly one kind, every key base64 of
/// a length its cipher takes (aescbc/aesgcm 16, 24 or 32 bytes; secretbox 32). A configuration
/// that fails here would stop every API server reading it.
pub fn parse(what: &str, yaml: &str) -> Result<EncryptionConfiguration, EncryptionError> {
    let invalid = |message: String| EncryptionError::Invalid { what: what.to_string(), message };
    let config: EncryptionConfiguration = serde_yaml_ng::from_str(yaml).map_err(|e| invalid(e.to_string()))?;
    if config.api_version != API_VERSION || config.kind != KIND {
        return Err(invalid(format!("apiVersion/kind {}/{}, want {API_VERSION}/{KIND}", config.api_version, config.kind)));
    }
    if config.resources.is_empty() {
        return Err(invalid("resources: empty".into()));
    }
    for (i, r) in config.resources.iter().enumerate() {
        if r.resources.is_empty() || r.providers.is_empty() {
            return Err(invalid(format!("resources[{i}]: needs resources and providers")));
        }
        for (j, p) in r.providers.iter().enumerate() {
            let at = format!("resources[{i}].providers[{j}]");
            let kinds = [p.aescbc.is_some(), p.aesgcm.is_some(), p.secretbox.is_some(), p.identity.is_some(), p.kms.is_some()];
            if kinds.iter().filter(|k| **k).count() != 1 {
                return Err(invalid(format!("{at}: exactly one of aescbc, aesgcm, secretbox, identity, kms")));
            }
            let ciphers: [(&str, &Option<Keys>, &[usize]); 3] =
                [("aescbc", &p.aescbc, &[16, 24, 32]), ("aesgcm", &p.aesgcm, &[16, 24, 32]), ("secretbox", &p.secretbox, &[32])];
            for (cipher, keys, lengths) in ciphers {
                let Some(keys) = keys else { continue };
                if keys.keys.is_empty() {
                    return Err(invalid(format!("{at}.{cipher}: no keys")));
                }
                for k in &keys.keys {
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(k.secret.trim())
                        .map_err(|_| invalid(format!("{at}.{cipher}: key {}: secret is not base64", k.name)))?;
                    if k.name.is_empty() || !lengths.contains(&bytes.len()) {
                        return Err(invalid(format!("{at}.{cipher}: key {:?}: {} bytes (needs a name and {lengths:?} bytes)", k.name, bytes.len())));
                    }
                }
            }
        }
    }
    Ok(config)
}

/// Decode the state store's secret (`bytes` of `secrets/encryptionconfig`) to the YAML to write,
/// checked by [`parse`].
pub fn from_secret(bytes: &[u8]) -> Result<String, EncryptionError> {
    let yaml = pki::parse_secret(SECRET, bytes)?;
    parse(SECRET_PATH, &yaml)?;
    Ok(yaml)
}

/// Create `secrets/encryptionconfig` in a file state store (`state_dir` is the `ConfigBase`
/// directory), 0600, unless it exists: an existing configuration is never replaced (even by two
/// runs racing). True if created.
pub fn ensure(state_dir: &Path) -> Result<bool, EncryptionError> {
    let path = state_dir.join(SECRET_PATH);
    if path.exists() {
        return Ok(false);
    }
    let yaml = to_yaml(&generate("key1")?)?;
    Ok(pki::create_new(&path, pki::secret_json(&yaml).as_bytes(), 0o600)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of(config: &EncryptionConfiguration) -> Vec<u8> {
        let keys = config.resources[0].providers[0].secretbox.as_ref().expect("secretbox first");
        base64::engine::general_purpose::STANDARD.decode(&keys.keys[0].secret).expect("base64")
    }

    #[test]
    fn generated_config_encrypts_secrets_with_a_random_32_byte_key_and_reads_clear_data_last() {
        let a = generate("key1").expect("generate");
        let yaml = to_yaml(&a).expect("yaml");
        let back = parse("generated", &yaml).expect("the API server's kind and a valid key");
        assert_eq!(back, a);
        assert_eq!(a.resources.len(), 1);
        assert_eq!(a.resources[0].resources, vec!["secrets".to_string()]);
        let providers = &a.resources[0].providers;
        assert_eq!(providers.len(), 2);
        assert_eq!(providers[0].secretbox.as_ref().map(|k| k.keys[0].name.as_str()), Some("key1"));
        assert_eq!(providers[1], Provider { identity: Some(Empty {}), ..Default::default() }, "identity last");
        assert_eq!(key_of(&a).len(), 32);
        assert_ne!(key_of(&a), key_of(&generate("key1").expect("again")), "a fresh key every time");
        assert!(yaml.contains("apiVersion: apiserver.config.k8s.io/v1") && yaml.contains("kind: EncryptionConfiguration"), "{yaml}");
        assert!(!format!("{a:?}").contains(&providers[0].secretbox.as_ref().expect("sb").keys[0].secret), "Debug hides the key");
    }

    #[test]
    fn parse_refuses_what_would_stop_the_api_server() {
        let good = to_yaml(&generate("key1").expect("generate")).expect("yaml");
        let secret = {
            let c = parse("g", &good).expect("good");
            c.resources[0].providers[0].secretbox.as_ref().expect("sb").keys[0].secret.clone()
        };
        let short = base64::engine::general_purpose::STANDARD.encode([7u8; 16]);
        let cases = [
            ("wrong kind", good.replace("kind: EncryptionConfiguration", "kind: EncryptionConfig")),
            ("wrong version", good.replace("apiserver.config.k8s.io/v1", "v1")),
            ("short secretbox key", good.replace(&secret, &short)),
            ("not base64", good.replace(&secret, "not base64!")),
            ("no resources", "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources: []\n".into()),
            (
                "two kinds in one provider",
                "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  providers:\n  - identity: {}\n    secretbox: {keys: []}\n".into(),
            ),
            ("not YAML", "{{".into()),
        ];
        for (name, text) in cases {
            let err = parse("secrets/encryptionconfig", &text).expect_err(name).to_string();
            assert!(err.starts_with("secrets/encryptionconfig: "), "{name}: {err}");
            assert!(!err.contains(&secret), "{name}: the error shows the key: {err}");
        }
        // An aescbc key of 32 bytes next to the generated one (a rotation in progress) is fine.
        let rotated = good.replace("  - identity: {}", &format!("  - aescbc:\n      keys:\n      - name: old\n        secret: {secret}\n  - identity: {{}}"));
        assert_eq!(parse("rotated", &rotated).expect("rotated").resources[0].providers.len(), 3, "{rotated}");
    }

    #[test]
    fn ensure_creates_the_secret_once_0600_and_never_regenerates_it() {
        let d = tempfile::tempdir().expect("tempdir");
        assert!(ensure(d.path()).expect("create"));
        let path = d.path().join(SECRET_PATH);
        assert_eq!(crate::fs::mode_of(&path), Some(0o600));
        let before = std::fs::read(&path).expect("read");
        let yaml = from_secret(&before).expect("a kOps secret holding a valid configuration");
        assert!(yaml.contains("secretbox"));
        assert!(!ensure(d.path()).expect("again"), "an existing configuration is kept");
        assert_eq!(std::fs::read(&path).expect("read"), before, "never regenerated");
        // An operator's configuration (say, mid-rotation) is kept too.
        std::fs::write(&path, b"{\"Data\":\"b3BlcmF0b3I=\"}").expect("write");
        assert!(!ensure(d.path()).expect("again"));
        assert_eq!(std::fs::read(&path).expect("read"), b"{\"Data\":\"b3BlcmF0b3I=\"}");
    }
}
