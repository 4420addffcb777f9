//! Bootstrap tokens that expire and rotate.
//!
//! The current token is the one published in the state store ([`base::bootstrap_token`]) **whose
//! Secret `bootstrap-token-<id>` in `kube-system` says the same** (same secret, authentication
//! usage, same expiration, not being deleted) and has at least half its life left. Anything else —
//! nothing published, an older release's static token, a Secret gone (expired and deleted by
//! kube-controller-manager's `tokencleaner`), edited, or with an expiration further away than the
//! TTL — and a new token is minted: its Secret is created first, then it is published, so a
//! published token is always one the API server accepts. Minting happens when the current token
//! has less than half of [`TTL`] left, so a worker that reads it has at least 12 hours to use it.
//!
//! Every control plane runs this (no leader): two that mint at once each create a Secret and
//! publish; the last publish wins, the other token is valid until it expires and is then deleted.
//! The next pass on either sees the published token current and keeps it.

use std::time::{Duration, SystemTime};

use base::bootstrap_token::{self, BootstrapToken, Published};
use base::StateStore;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::PostParams;

use super::NodeBootstrapError;

/// How long a bootstrap token lives.
pub const TTL: Duration = Duration::from_secs(24 * 3600);
/// Where bootstrap token Secrets live (the API server reads them only there).
pub const NAMESPACE: &str = "kube-system";
/// The Secret type the API server's bootstrap authenticator reads.
pub const SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
/// How far a Secret's expiration may lie beyond now + TTL (clock skew between control planes).
const SKEW: Duration = Duration::from_secs(300);

/// The Secret of the token `id`.
pub fn secret_name(id: &str) -> String {
    format!("bootstrap-token-{id}")
}

/// What the API server reads of a bootstrap token Secret.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenSecret {
    pub type_: Option<String>,
    pub token_id: Option<String>,
    pub token_secret: Option<String>,
    pub expiration: Option<SystemTime>,
    /// `usage-bootstrap-authentication: "true"`.
    pub authentication: bool,
    /// Being deleted.
    pub deleting: bool,
}

impl TokenSecret {
    pub fn of(secret: &Secret) -> TokenSecret {
        let data = secret.data.clone().unwrap_or_default();
        let field = |k: &str| data.get(k).and_then(|v| String::from_utf8(v.0.clone()).ok());
        TokenSecret {
            type_: secret.type_.clone(),
            token_id: field("token-id"),
            token_secret: field("token-secret"),
            expiration: field("expiration").as_deref().and_then(bootstrap_token::parse_rfc3339),
            authentication: field("usage-bootstrap-authentication").as_deref() == Some("true"),
            deleting: secret.metadata.deletion_timestamp.is_some(),
        }
    }
}

/// What to do about the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The published token is current; look again at `rotate_at` (half its life left).
    Keep { expires: SystemTime, rotate_at: SystemTime },
    /// Mint and publish a new token.
    Mint { reason: &'static str },
}

/// Whether the published token is current ([module docs](self)), given its Secret, at `now`.
pub fn decide(published: Option<&Published>, secret: Option<&TokenSecret>, now: SystemTime, ttl: Duration) -> Decision {
    let Some(p) = published else { return Decision::Mint { reason: "no bootstrap token published" } };
    let Some(s) = secret else { return Decision::Mint { reason: "the published token has no Secret (expired and deleted, or never created)" } };
    if s.deleting {
        return Decision::Mint { reason: "the published token's Secret is being deleted" };
    }
    let same = s.type_.as_deref() == Some(SECRET_TYPE)
        && s.token_id.as_deref() == Some(p.token.id())
        && s.token_secret.as_deref() == Some(p.token.secret())
        && s.authentication;
    if !same {
        return Decision::Mint { reason: "the published token's Secret does not hold it" };
    }
    let Some(expires) = s.expiration else { return Decision::Mint { reason: "the published token's Secret never expires" } };
    if expires != p.expires {
        return Decision::Mint { reason: "the published expiration is not the Secret's" };
    }
    if expires.duration_since(now).is_ok_and(|left| left > ttl + SKEW) {
        return Decision::Mint { reason: "the published token lives longer than the TTL" };
    }
    let rotate_at = expires - ttl / 2;
    if now >= rotate_at {
        return Decision::Mint { reason: "the published token has less than half its life left" };
    }
    Decision::Keep { expires, rotate_at }
}

/// The Secret of `token`, expiring at `expires`: authentication only (no signing of
/// `cluster-info`), no extra groups (its user is `system:bootstrap:<id>` in `system:bootstrappers`).
pub fn token_secret(token: &BootstrapToken, expires: SystemTime) -> Secret {
    let bytes = |s: &str| ByteString(s.as_bytes().to_vec());
    let expiration = bootstrap_token::rfc3339(expires);
    let data = [
        ("description", "Keelson worker TLS bootstrap (protokube rotates it)"),
        ("token-id", token.id()),
        ("token-secret", token.secret()),
        ("expiration", expiration.as_str()),
        ("usage-bootstrap-authentication", "true"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), bytes(v)))
    .collect();
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(secret_name(token.id())),
            namespace: Some(NAMESPACE.into()),
            labels: Some([("app.kubernetes.io/managed-by".to_string(), "keelson-protokube".to_string())].into()),
            ..Default::default()
        },
        type_: Some(SECRET_TYPE.into()),
        data: Some(data),
        ..Default::default()
    }
}

/// What one pass did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Kept { id: String, expires: SystemTime, rotate_at: SystemTime },
    Minted { id: String, expires: SystemTime, reason: &'static str },
}

impl Outcome {
    pub fn expires(&self) -> SystemTime {
        match self {
            Outcome::Kept { expires, .. } | Outcome::Minted { expires, .. } => *expires,
        }
    }

    /// When to look again: at the rotation time, at most `max` from `now`.
    pub fn next_check(&self, now: SystemTime, max: Duration) -> Duration {
        match self {
            Outcome::Kept { rotate_at, .. } => rotate_at.duration_since(now).unwrap_or_default().min(max),
            Outcome::Minted { .. } => max,
        }
    }
}

/// Read the published token (a missing, unreadable or older release's document is none).
pub async fn published(store: &StateStore) -> Result<Option<Published>, NodeBootstrapError> {
    let Some(bytes) = store.get(&bootstrap_token::state_key()).await? else { return Ok(None) };
    match Published::parse(&bytes) {
        Ok(p) => Ok(Some(p)),
        Err(e) => {
            tracing::warn!(error = %e, "bootstrap token: the published document is not a current token; minting one");
            Ok(None)
        }
    }
}

/// One pass at `now`: keep the current token, or mint, create its Secret and publish it.
pub async fn pass(store: &StateStore, secrets: &kube::Api<Secret>, now: SystemTime, ttl: Duration) -> Result<Outcome, NodeBootstrapError> {
    let published = published(store).await?;
    let secret = match &published {
        Some(p) => {
            let name = secret_name(p.token.id());
            secrets.get_opt(&name).await.map_err(super::kube_err(format!("get Secret {NAMESPACE}/{name}")))?.as_ref().map(TokenSecret::of)
        }
        None => None,
    };
    match decide(published.as_ref(), secret.as_ref(), now, ttl) {
        Decision::Keep { expires, rotate_at } => Ok(Outcome::Kept { id: published.map(|p| p.token.id().to_string()).unwrap_or_default(), expires, rotate_at }),
        Decision::Mint { reason } => {
            let token = BootstrapToken::generate()?;
            // Whole seconds: the Secret's RFC 3339 expiration is read back as the same instant.
            let expires = bootstrap_token::parse_rfc3339(&bootstrap_token::rfc3339(now + ttl)).unwrap_or(now + ttl);
            let name = secret_name(token.id());
            secrets
                .create(&PostParams::default(), &token_secret(&token, expires))
                .await
                .map_err(super::kube_err(format!("create Secret {NAMESPACE}/{name}")))?;
            store.put(&bootstrap_token::state_key(), Published { token: token.clone(), expires }.to_json().as_bytes()).await?;
            Ok(Outcome::Minted { id: token.id().to_string(), expires, reason })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: Duration = Duration::from_secs(3600);

    fn at(text: &str) -> SystemTime {
        bootstrap_token::parse_rfc3339(text).expect("time")
    }

    fn fixture() -> (Published, TokenSecret) {
        let token: BootstrapToken = "abcdef.0123456789abcdef".parse().expect("token");
        let expires = at("2026-12-03T00:00:00Z");
        let secret = TokenSecret::of(&token_secret(&token, expires));
        (Published { token, expires }, secret)
    }

    #[test]
    fn the_published_token_is_kept_until_half_its_life_is_gone() {
        let (p, s) = fixture();
        let minted = p.expires - TTL;
        // The clock is the caller's: a table over time.
        for (now, keep) in [
            (minted, true),
            (minted + 6 * H, true),
            (minted + 12 * H - Duration::from_secs(1), true),
            (minted + 12 * H, false),
            (minted + 23 * H, false),
            (p.expires, false),
            (p.expires + H, false),
        ] {
            let d = decide(Some(&p), Some(&s), now, TTL);
            match d {
                Decision::Keep { expires, rotate_at } => {
                    assert!(keep, "{now:?}: {d:?}");
                    assert_eq!((expires, rotate_at), (p.expires, minted + 12 * H));
                }
                Decision::Mint { reason } => {
                    assert!(!keep, "{now:?}: {reason}");
                    assert!(reason.contains("half"), "{reason}");
                }
            }
        }
    }

    #[test]
    fn anything_but_a_published_token_its_secret_agrees_with_is_replaced() {
        let (p, s) = fixture();
        let now = p.expires - 20 * H;
        assert!(matches!(decide(Some(&p), Some(&s), now, TTL), Decision::Keep { .. }));
        let mint = |published: Option<&Published>, secret: Option<&TokenSecret>| match decide(published, secret, now, TTL) {
            Decision::Mint { reason } => reason,
            keep => panic!("kept: {keep:?}"),
        };
        assert!(mint(None, Some(&s)).contains("no bootstrap token"));
        assert!(mint(Some(&p), None).contains("no Secret"));
        let other = |f: &dyn Fn(&mut TokenSecret)| {
            let mut s = s.clone();
            f(&mut s);
            s
        };
        for (what, secret) in [
            ("other secret", other(&|s| s.token_secret = Some("ffffffffffffffff".into()))),
            ("other id", other(&|s| s.token_id = Some("zzzzzz".into()))),
            ("no authentication", other(&|s| s.authentication = false)),
            ("opaque", other(&|s| s.type_ = Some("Opaque".into()))),
        ] {
            assert!(mint(Some(&p), Some(&secret)).contains("does not hold"), "{what}");
        }
        assert!(mint(Some(&p), Some(&other(&|s| s.deleting = true))).contains("deleted"));
        assert!(mint(Some(&p), Some(&other(&|s| s.expiration = None))).contains("never expires"));
        assert!(mint(Some(&p), Some(&other(&|s| s.expiration = Some(p.expires + H)))).contains("not the Secret's"));
        // Someone stretched both: a token that would outlive the TTL is not kept.
        let far = Published { expires: p.expires + 30 * 24 * H, ..p.clone() };
        assert!(mint(Some(&far), Some(&other(&|s| s.expiration = Some(far.expires)))).contains("longer than the TTL"));
    }

    #[test]
    fn the_secret_is_what_the_api_servers_bootstrap_authenticator_reads() {
        let (p, _) = fixture();
        let s = token_secret(&p.token, p.expires);
        assert_eq!(s.metadata.name.as_deref(), Some("bootstrap-token-abcdef"));
        assert_eq!(s.metadata.namespace.as_deref(), Some("kube-system"));
        assert_eq!(s.type_.as_deref(), Some("bootstrap.kubernetes.io/token"));
        let data = s.data.expect("data");
        let get = |k: &str| String::from_utf8(data[k].0.clone()).expect("utf-8");
        assert_eq!(get("expiration"), "2026-12-03T00:00:00Z");
        assert_eq!((get("token-id").as_str(), get("token-secret").as_str()), ("abcdef", "0123456789abcdef"));
        assert_eq!(get("usage-bootstrap-authentication"), "true");
        assert!(!data.contains_key("usage-bootstrap-signing") && !data.contains_key("auth-extra-groups"), "{:?}", data.keys());
    }

    #[test]
    fn the_next_look_is_at_rotation_time_within_a_bound() {
        let now = at("2026-12-02T00:00:00Z");
        let kept = Outcome::Kept { id: "a".into(), expires: now + 20 * H, rotate_at: now + 8 * H };
        assert_eq!(kept.next_check(now, Duration::from_secs(300)), Duration::from_secs(300));
        assert_eq!(kept.next_check(now + 8 * H - Duration::from_secs(10), Duration::from_secs(300)), Duration::from_secs(10));
        assert_eq!(kept.next_check(now + 9 * H, Duration::from_secs(300)), Duration::ZERO);
    }
}
