//! Kubernetes bootstrap tokens (`<id>.<secret>`, `[a-z0-9]{6}.[a-z0-9]{16}`), the credential a
//! worker TLS-bootstraps with when the cluster joins by token
//! (`keelson.io/node-bootstrap: token`).
//!
//! protokube on the control planes mints them: each is a Secret `bootstrap-token-<id>` in
//! `kube-system` with an `expiration` (the API server refuses it after that; kube-controller-manager's
//! `tokencleaner` deletes it). The current one is published in the state store at
//! `secrets/`[`crate::pki::BOOTSTRAP_TOKEN_SECRET`] as a kOps secret document with its expiration
//! beside it ([`Published`]): nodeup on a worker reads it and takes only a token that is still valid.
//! A document without an expiration (the static token of older releases) is no bootstrap token.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
const ID_LEN: usize = 6;
const SECRET_LEN: usize = 16;

/// The state-store key of the published token (relative to `ConfigBase`).
pub fn state_key() -> String {
    format!("secrets/{}", crate::pki::BOOTSTRAP_TOKEN_SECRET)
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BootstrapTokenError {
    #[error("not a bootstrap token: expected <id>.<secret>, 6 and 16 characters of [a-z0-9]")]
    Format,
    #[error("{key}: {message}")]
    Document { key: String, message: String },
    #[error("random: {0}")]
    Random(String),
}

/// A bootstrap token. Its `Debug` shows the id only; `Display` is the credential itself.
#[derive(Clone, PartialEq, Eq)]
pub struct BootstrapToken {
    id: String,
    secret: String,
}

fn valid_part(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| ALPHABET.contains(&b))
}

impl BootstrapToken {
    /// A new random token (the kernel's randomness).
    pub fn generate() -> Result<BootstrapToken, BootstrapTokenError> {
        let bytes = crate::pki::random_bytes(ID_LEN + SECRET_LEN).map_err(|e| BootstrapTokenError::Random(e.to_string()))?;
        // 256 is a multiple of neither 36 nor a power of it: reject the biased top of the range.
        let mut chars = Vec::with_capacity(ID_LEN + SECRET_LEN);
        let mut pool = bytes;
        while chars.len() < ID_LEN + SECRET_LEN {
            for b in pool.iter().copied().filter(|b| (*b as usize) < 256 - 256 % ALPHABET.len()) {
                if chars.len() < ID_LEN + SECRET_LEN {
                    chars.push(ALPHABET[b as usize % ALPHABET.len()]);
                }
            }
            pool = crate::pki::random_bytes(16).map_err(|e| BootstrapTokenError::Random(e.to_string()))?;
        }
        let text = String::from_utf8(chars).map_err(|e| BootstrapTokenError::Random(e.to_string()))?;
        Ok(BootstrapToken { id: text[..ID_LEN].to_string(), secret: text[ID_LEN..].to_string() })
    }

    /// The public half: the Secret is `bootstrap-token-<id>`, the user `system:bootstrap:<id>`.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The private half.
    pub fn secret(&self) -> &str {
        &self.secret
    }
}

impl FromStr for BootstrapToken {
    type Err = BootstrapTokenError;

    fn from_str(s: &str) -> Result<BootstrapToken, BootstrapTokenError> {
        let (id, secret) = s.split_once('.').ok_or(BootstrapTokenError::Format)?;
        if !valid_part(id, ID_LEN) || !valid_part(secret, SECRET_LEN) {
            return Err(BootstrapTokenError::Format);
        }
        Ok(BootstrapToken { id: id.into(), secret: secret.into() })
    }
}

impl fmt::Display for BootstrapToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.id, self.secret)
    }
}

impl fmt::Debug for BootstrapToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BootstrapToken({}.<redacted>)", self.id)
    }
}

/// The token published in the state store and when the API server stops accepting it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    pub token: BootstrapToken,
    pub expires: SystemTime,
}

#[derive(Serialize, Deserialize)]
struct Document {
    /// kOps' secret field: base64 of the token.
    #[serde(rename = "Data")]
    data: String,
    /// RFC 3339.
    #[serde(rename = "Expiration", default, skip_serializing_if = "Option::is_none")]
    expiration: Option<String>,
}

/// RFC 3339 (UTC, whole seconds) of `t`: the form of a bootstrap token Secret's `expiration`.
pub fn rfc3339(t: SystemTime) -> String {
    crate::etcd_backup::rfc3339(time::OffsetDateTime::from(t))
}

/// Parse an RFC 3339 time.
pub fn parse_rfc3339(text: &str) -> Option<SystemTime> {
    crate::etcd_backup::parse_rfc3339(text).map(SystemTime::from)
}

impl Published {
    /// Whether the token is still good for `margin` after `now`.
    pub fn valid_for(&self, now: SystemTime, margin: Duration) -> bool {
        self.expires.duration_since(now).is_ok_and(|left| left >= margin)
    }

    /// The state-store document (kOps secret JSON plus `Expiration`).
    pub fn to_json(&self) -> String {
        use base64::Engine as _;
        let doc = Document { data: base64::engine::general_purpose::STANDARD.encode(self.token.to_string()), expiration: Some(rfc3339(self.expires)) };
        let mut text = serde_json::to_string(&doc).unwrap_or_default();
        text.push('\n');
        text
    }

    /// Parse the state-store document; a token without an expiration (an older release's static
    /// token) or not in the bootstrap-token form is refused.
    pub fn parse(bytes: &[u8]) -> Result<Published, BootstrapTokenError> {
        use base64::Engine as _;
        let bad = |message: String| BootstrapTokenError::Document { key: state_key(), message };
        let doc: Document = serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
        let raw = base64::engine::general_purpose::STANDARD.decode(doc.data.trim()).map_err(|e| bad(format!("Data: {e}")))?;
        let token: BootstrapToken = String::from_utf8(raw).map_err(|e| bad(format!("Data: {e}")))?.trim().parse().map_err(|e| bad(format!("Data: {e}")))?;
        let expiration =
            doc.expiration.ok_or_else(|| bad("no Expiration: a static token of an older release, not a bootstrap token protokube minted".into()))?;
        let expires = parse_rfc3339(&expiration).ok_or_else(|| bad(format!("Expiration: {expiration:?} is not an RFC 3339 time")))?;
        Ok(Published { token, expires })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_have_the_bootstrap_form_and_hide_their_secret() {
        let a = BootstrapToken::generate().expect("token");
        let b = BootstrapToken::generate().expect("token");
        assert_ne!(a, b);
        let text = a.to_string();
        assert_eq!(text.parse::<BootstrapToken>().expect("parse"), a);
        assert_eq!((a.id().len(), a.secret().len()), (6, 16));
        assert!(text.bytes().all(|c| c == b'.' || c.is_ascii_lowercase() || c.is_ascii_digit()), "{text}");
        assert!(!format!("{a:?}").contains(a.secret()));
        for bad in [
            "",
            "abcdef",
            "abcdef.",
            "abcdef.0123456789abcdef0",
            "ABCDEF.0123456789abcdef",
            "abcde.0123456789abcdef",
            "abcdef_0123456789abcdef",
            "abcdef.0123456789abcde!",
        ] {
            assert_eq!(bad.parse::<BootstrapToken>(), Err(BootstrapTokenError::Format), "{bad:?}");
        }
        assert!("abcdef.0123456789abcdef".parse::<BootstrapToken>().is_ok());
    }

    #[test]
    fn the_published_document_round_trips_and_a_static_token_is_refused() {
        let expires = parse_rfc3339("2026-12-03T04:00:00Z").expect("time");
        let p = Published { token: "abcdef.0123456789abcdef".parse().expect("token"), expires };
        let json = p.to_json();
        assert_eq!(Published::parse(json.as_bytes()).expect("parse"), p);
        // kOps' reader still sees the token.
        assert_eq!(crate::pki::parse_secret("t", json.as_bytes()).expect("kOps secret"), "abcdef.0123456789abcdef");
        // An older release's static token: same form, no expiration.
        let legacy = crate::pki::secret_json("abcdef.0123456789abcdef");
        let e = Published::parse(legacy.as_bytes()).expect_err("static token");
        assert!(e.to_string().contains("secrets/node-bootstrap-token") && e.to_string().contains("Expiration"), "{e}");
        assert!(Published::parse(b"{\"Data\":\"bm90IGEgdG9rZW4=\",\"Expiration\":\"2026-12-03T04:00:00Z\"}").is_err());
        assert!(Published::parse(b"{\"Data\":\"YWJjZGVmLjAxMjM0NTY3ODlhYmNkZWY=\",\"Expiration\":\"tomorrow\"}").is_err());
        let now = expires - Duration::from_secs(3600);
        assert!(p.valid_for(now, Duration::from_secs(3600)));
        assert!(!p.valid_for(now, Duration::from_secs(3601)));
        assert!(!p.valid_for(expires + Duration::from_secs(1), Duration::ZERO));
    }
}
