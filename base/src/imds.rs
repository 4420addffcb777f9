//! IMDSv2 client: session tokens only (never falls back to v1), `404 → None`, `401 → refresh the token
//! and retry`, other failures retried with jittered exponential backoff under an overall deadline.
//! The base URL is injectable (tests serve IMDS from a small local HTTP server).

use std::time::{Duration, Instant};

use tokio::sync::Mutex;

/// Default IMDS base URL (IPv4 link-local).
pub const DEFAULT_BASE_URL: &str = "http://169.254.169.254";
const TOKEN_PATH: &str = "/latest/api/token";
const TOKEN_TTL_HEADER: &str = "x-aws-ec2-metadata-token-ttl-seconds";
const TOKEN_HEADER: &str = "x-aws-ec2-metadata-token";
const TOKEN_TTL_SECS: u64 = 21_600;

#[derive(Debug, thiserror::Error)]
pub enum ImdsError {
    #[error("IMDS {url}: HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("IMDS {url}: {source}")]
    Transport { url: String, source: reqwest::Error },
    #[error("IMDS {url}: gave up after {attempts} attempts in {elapsed:?}: {last}")]
    Exhausted { url: String, attempts: u32, elapsed: Duration, last: String },
    #[error("IMDS {url}: required value is missing (404)")]
    Missing { url: String },
    #[error("IMDS {url}: building client: {source}")]
    Client { url: String, source: reqwest::Error },
}

/// Read access to instance metadata (`path` is relative to `/latest/meta-data/`).
pub trait InstanceMetadata {
    /// `Ok(None)` when the path does not exist (404).
    fn get(&self, path: &str) -> impl std::future::Future<Output = Result<Option<String>, ImdsError>> + Send;
}

/// The identity facts protokube needs (all known): [`crate::instance::InstanceFacts::identity`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub instance_id: String,
    pub zone: String,
    pub region: String,
    pub internal_ip: String,
}

/// IMDSv2 over HTTP.
#[derive(Debug)]
pub struct Imds {
    base: String,
    http: reqwest::Client,
    token: Mutex<Option<(String, Instant)>>,
    /// Overall deadline of one `get` including retries.
    pub deadline: Duration,
    /// Attempts of one `get` (token fetches included).
    pub max_attempts: u32,
    pub initial_backoff: Duration,
}

impl Imds {
    /// `base_url` such as `http://169.254.169.254`; `None` uses `AWS_EC2_METADATA_SERVICE_ENDPOINT` or the
    /// default.
    pub fn new(base_url: Option<&str>) -> Result<Imds, ImdsError> {
        let base = base_url
            .map(str::to_string)
            .or_else(|| std::env::var("AWS_EC2_METADATA_SERVICE_ENDPOINT").ok())
            .unwrap_or_else(|| DEFAULT_BASE_URL.to_string())
            .trim_end_matches('/')
            .to_string();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(1))
            .timeout(Duration::from_secs(2))
            .no_proxy()
            .build()
            .map_err(|source| ImdsError::Client { url: base.clone(), source })?;
        Ok(Imds { base, http, token: Mutex::new(None), deadline: Duration::from_secs(30), max_attempts: 10, initial_backoff: Duration::from_millis(100) })
    }

    async fn token(&self, refresh: bool) -> Result<String, ImdsError> {
        let mut guard = self.token.lock().await;
        if !refresh {
            if let Some((t, expires)) = guard.as_ref() {
                if Instant::now() < *expires {
                    return Ok(t.clone());
                }
            }
        }
        let url = format!("{}{}", self.base, TOKEN_PATH);
        let resp = self
            .http
            .put(&url)
            .header(TOKEN_TTL_HEADER, TOKEN_TTL_SECS.to_string())
            .send()
            .await
            .map_err(|source| ImdsError::Transport { url: url.clone(), source })?;
        let status = resp.status().as_u16();
        if status != 200 {
            return Err(ImdsError::Status { url, status });
        }
        let t = resp.text().await.map_err(|source| ImdsError::Transport { url, source })?;
        // Renew well before expiry.
        *guard = Some((t.clone(), Instant::now() + Duration::from_secs(TOKEN_TTL_SECS - 60)));
        Ok(t)
    }

    async fn attempt(&self, url: &str, refresh: bool) -> Result<Option<String>, ImdsError> {
        let token = self.token(refresh).await?;
        let resp = self.http.get(url).header(TOKEN_HEADER, token).send().await.map_err(|source| ImdsError::Transport { url: url.to_string(), source })?;
        match resp.status().as_u16() {
            200 => resp.text().await.map(Some).map_err(|source| ImdsError::Transport { url: url.to_string(), source }),
            404 => Ok(None),
            status => Err(ImdsError::Status { url: url.to_string(), status }),
        }
    }
}

/// Full-jitter backoff: uniform in `[0, min(cap, base·2^attempt)]`, never below 10 ms.
pub fn jittered(base: Duration, attempt: u32, cap: Duration) -> Duration {
    let exp = base.saturating_mul(1u32 << attempt.min(16)).min(cap);
    let r = jitter_fraction();
    exp.mul_f64(r).max(Duration::from_millis(10))
}

fn jitter_fraction() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0));
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

impl InstanceMetadata for Imds {
    async fn get(&self, path: &str) -> Result<Option<String>, ImdsError> {
        let url = format!("{}/latest/meta-data/{}", self.base, path.trim_start_matches('/'));
        let start = Instant::now();
        let mut refresh = false;
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let err = match self.attempt(&url, refresh).await {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            // 401: the token expired or was revoked; fetch a new one and retry at once.
            let unauthorized = matches!(err, ImdsError::Status { status: 401, .. });
            refresh = unauthorized;
            let retryable =
                unauthorized || matches!(err, ImdsError::Transport { .. }) || matches!(err, ImdsError::Status { status, .. } if status == 429 || status >= 500);
            if !retryable {
                return Err(err);
            }
            let elapsed = start.elapsed();
            let wait = if unauthorized && attempts == 1 { Duration::ZERO } else { jittered(self.initial_backoff, attempts - 1, Duration::from_secs(2)) };
            if attempts >= self.max_attempts || elapsed + wait >= self.deadline {
                return Err(ImdsError::Exhausted { url, attempts, elapsed, last: err.to_string() });
            }
            tracing::debug!(%url, attempts, ?wait, error = %err, "IMDS retry");
            tokio::time::sleep(wait).await;
        }
    }
}
