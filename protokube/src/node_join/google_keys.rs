//! Google's token-signing keys (a JWK set, [`base::node_join_gce::GOOGLE_JWKS_URL`] in production),
//! fetched and cached: used for [`TTL`] after a fetch; fetched again before that only when a token
//! names a key the cached set lacks (Google rotated its keys), and then at most once per
//! [`MIN_REFETCH`], so tokens under made-up key ids cannot make the server fetch on every request.

use std::time::{Duration, Instant};

use base::node_join_gce::JwkSet;

/// How long a fetched key set is used.
pub const TTL: Duration = Duration::from_secs(3600);
/// The shortest time between two fetches (unknown key ids do not force more).
pub const MIN_REFETCH: Duration = Duration::from_secs(30);
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest key set read.
const MAX_BYTES: usize = 256 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    #[error("Google's keys at {url}: {message}")]
    Fetch { url: String, message: String },
    #[error("Google's keys at {url}: HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("Google's keys at {url}: not a JWK set: {message}")]
    Parse { url: String, message: String },
}

/// The cached key set of one URL (shared by the join server's requests).
#[derive(Debug)]
pub struct GoogleKeys {
    url: String,
    http: reqwest::Client,
    cached: tokio::sync::Mutex<Option<(JwkSet, Instant)>>,
}

/// What to do with a cached set fetched `age` ago when a token names key `kid`.
pub fn needs_fetch(cached: Option<(&JwkSet, Duration)>, kid: Option<&str>) -> bool {
    match cached {
        None => true,
        Some((_, age)) if age >= TTL => true,
        Some((set, age)) => kid.is_some_and(|k| !set.keys.iter().any(|j| j.kid == k)) && age >= MIN_REFETCH,
    }
}

impl GoogleKeys {
    pub fn new(url: &str) -> Result<GoogleKeys, KeysError> {
        let http = reqwest::Client::builder().timeout(FETCH_TIMEOUT).build().map_err(|e| KeysError::Fetch { url: url.to_string(), message: e.to_string() })?;
        Ok(GoogleKeys { url: url.to_string(), http, cached: tokio::sync::Mutex::new(None) })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The key set to verify a token signed with key `kid` (its header's), fetched if the cache is
    /// empty, old, or lacks `kid` (see [`needs_fetch`]).
    pub async fn keys(&self, kid: Option<&str>) -> Result<JwkSet, KeysError> {
        let mut cached = self.cached.lock().await;
        if !needs_fetch(cached.as_ref().map(|(s, at)| (s, at.elapsed())), kid) {
            if let Some((set, _)) = cached.as_ref() {
                return Ok(set.clone());
            }
        }
        match self.fetch().await {
            Ok(set) => {
                tracing::info!(url = %self.url, keys = set.keys.len(), "fetched Google's token-signing keys");
                *cached = Some((set.clone(), Instant::now()));
                Ok(set)
            }
            // A failed refresh keeps a set that is not too old to use.
            Err(e) => match cached.as_ref().filter(|(_, at)| at.elapsed() < TTL) {
                Some((set, _)) => {
                    tracing::warn!(error = %e, "Google's keys: refresh failed; using the cached set");
                    Ok(set.clone())
                }
                None => Err(e),
            },
        }
    }

    async fn fetch(&self) -> Result<JwkSet, KeysError> {
        let fetch = |message: String| KeysError::Fetch { url: self.url.clone(), message };
        let resp = self.http.get(&self.url).send().await.map_err(|e| fetch(e.to_string()))?;
        let status = resp.status().as_u16();
        if status != 200 {
            return Err(KeysError::Status { url: self.url.clone(), status });
        }
        let bytes = resp.bytes().await.map_err(|e| fetch(e.to_string()))?;
        if bytes.len() > MAX_BYTES {
            return Err(fetch(format!("{} bytes; at most {MAX_BYTES} are read", bytes.len())));
        }
        let set: JwkSet = serde_json::from_slice(&bytes).map_err(|e| KeysError::Parse { url: self.url.clone(), message: e.to_string() })?;
        if set.keys.is_empty() {
            return Err(KeysError::Parse { url: self.url.clone(), message: "no keys".into() });
        }
        Ok(set)
    }
}

/// The `kid` of a JWT's header, if it has one that can be read (the signature is checked later).
pub fn token_kid(token: &str) -> Option<String> {
    use base64::Engine as _;
    let header = token.split('.').next()?;
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(header.trim_end_matches('=')).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&json).ok()?;
    v["kid"].as_str().map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;
    use base::node_join_gce::Jwk;

    #[test]
    fn the_cache_is_fetched_when_empty_old_or_missing_a_key_but_not_more_often_than_allowed() {
        let set = JwkSet { keys: vec![Jwk { kid: "a".into(), n: "n".into(), e: "AQAB".into() }] };
        assert!(needs_fetch(None, Some("a")));
        assert!(!needs_fetch(Some((&set, Duration::from_secs(5))), Some("a")));
        assert!(needs_fetch(Some((&set, TTL)), Some("a")), "too old");
        assert!(!needs_fetch(Some((&set, Duration::from_secs(5))), Some("rotated")), "just fetched: unknown ids wait");
        assert!(needs_fetch(Some((&set, MIN_REFETCH)), Some("rotated")), "a rotated key is fetched");
        assert!(!needs_fetch(Some((&set, MIN_REFETCH)), None));
    }

    #[test]
    fn the_kid_comes_from_the_header() {
        use base64::Engine as _;
        let b = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let t = format!("{}.{}.sig", b.encode(r#"{"alg":"RS256","kid":"k1"}"#), b.encode("{}"));
        assert_eq!(token_kid(&t).as_deref(), Some("k1"));
        assert_eq!(token_kid("garbage"), None);
    }
}
