//! OAuth access tokens for Google's APIs, cached until shortly before they expire: from the
//! metadata server (`instance/service-accounts/default/token`) on GCE, or from Application Default
//! Credentials ([`super::adc`]) off it.

use std::time::{Duration, Instant};

use base::gce_metadata::GceMetadata;

/// A token is refreshed this long before the expiry the metadata server gave.
pub const REFRESH_MARGIN: Duration = Duration::from_secs(60);
/// The metadata path of the default service account's access token.
pub const TOKEN_PATH: &str = "instance/service-accounts/default/token";

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("service-account token: {0}")]
    Metadata(#[from] base::gce_metadata::GceMetadataError),
    #[error("service-account token: the metadata server has no {TOKEN_PATH} (no service account on this instance?)")]
    Missing,
    #[error("service-account token: {TOKEN_PATH}: not a token answer: {0}")]
    Parse(String),
    #[error("application default credentials: {0}")]
    Adc(#[from] super::adc::AdcError),
}

#[derive(serde::Deserialize)]
struct Answer {
    access_token: String,
    expires_in: u64,
}

/// Until when a token that expires in `expires_in` seconds (from `now`) is used.
pub fn use_until(now: Instant, expires_in: u64) -> Instant {
    now + Duration::from_secs(expires_in).saturating_sub(REFRESH_MARGIN)
}

#[derive(Debug, Clone)]
enum Source {
    Metadata(GceMetadata),
    Credentials { creds: super::adc::Credentials, http: reqwest::Client },
}

/// The token source: where tokens come from, one cached token (shared by clones).
#[derive(Debug, Clone)]
pub struct TokenSource {
    source: Source,
    cached: std::sync::Arc<tokio::sync::Mutex<Option<(String, Instant)>>>,
}

impl TokenSource {
    /// Tokens of the instance's service account, from the metadata server.
    pub fn new(metadata: GceMetadata) -> TokenSource {
        TokenSource { source: Source::Metadata(metadata), cached: Default::default() }
    }

    /// Tokens traded for Application Default Credentials at their token endpoint.
    pub fn from_credentials(creds: super::adc::Credentials, timeout: Duration) -> Result<TokenSource, TokenError> {
        let http = reqwest::Client::builder()
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .timeout(timeout)
            .build()
            .map_err(|e| super::adc::AdcError::Token { url: creds.token_uri().to_string(), message: e.to_string() })?;
        Ok(TokenSource { source: Source::Credentials { creds, http }, cached: Default::default() })
    }

    /// A valid access token (from the cache while it has more than [`REFRESH_MARGIN`] left).
    pub async fn token(&self) -> Result<String, TokenError> {
        let mut cached = self.cached.lock().await;
        if let Some((t, _)) = cached.as_ref().filter(|(_, until)| *until > Instant::now()) {
            return Ok(t.clone());
        }
        let (token, expires_in) = match &self.source {
            Source::Metadata(metadata) => {
                let body = metadata.get(TOKEN_PATH).await?.ok_or(TokenError::Missing)?;
                let a: Answer = serde_json::from_str(&body).map_err(|e| TokenError::Parse(e.to_string()))?;
                if a.access_token.is_empty() {
                    return Err(TokenError::Parse("empty access_token".into()));
                }
                (a.access_token, a.expires_in)
            }
            Source::Credentials { creds, http } => super::adc::fetch(http, creds).await?,
        };
        *cached = Some((token.clone(), use_until(Instant::now(), expires_in)));
        Ok(token)
    }

    /// Forget the cached token (after a 401).
    pub async fn invalidate(&self) {
        *self.cached.lock().await = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_used_until_a_minute_before_expiry() {
        let now = Instant::now();
        assert_eq!(use_until(now, 3599), now + Duration::from_secs(3539));
        assert_eq!(use_until(now, 30), now, "a token about to expire is not cached");
    }
}
