//! One client for Google's JSON REST APIs (Compute v1, Cloud DNS v1): bearer tokens from
//! [`TokenSource`], Google's error format parsed (`error.errors[0].reason`), a 401 answered by one
//! fresh token, reads retried a bounded number of times on 429 and 5xx.

use std::time::Duration;

use reqwest::Method;
use serde_json::Value;

use super::auth::{TokenError, TokenSource};
use crate::calls::CallCounter;

/// Attempts of a read (GET) that meets 429 or 5xx.
const READ_ATTEMPTS: u32 = 4;

#[derive(Debug, thiserror::Error)]
pub enum GoogleApiError {
    #[error("{method} {url}: HTTP {status} {reason}: {message}")]
    Status { method: Method, url: String, status: u16, reason: String, message: String },
    #[error("{method} {url}: {message}")]
    Transport { method: Method, url: String, message: String, timed_out: bool },
    #[error("{method} {url}: the answer is not JSON: {message}")]
    Decode { method: Method, url: String, message: String },
    #[error(transparent)]
    Token(#[from] TokenError),
    /// The call would send the access token over plain `http://` off loopback.
    #[error(transparent)]
    PlainHttp(#[from] base::plain_http::PlainHttpRefused),
}

impl GoogleApiError {
    /// Google's reason (`notFound`, `resourceInUseByAnotherResource`, `conditionNotMet`, …).
    pub fn reason(&self) -> Option<&str> {
        match self {
            GoogleApiError::Status { reason, .. } => Some(reason),
            _ => None,
        }
    }
    pub fn status(&self) -> Option<u16> {
        match self {
            GoogleApiError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
    pub fn is_not_found(&self) -> bool {
        self.status() == Some(404)
    }
    /// A short code for messages: the reason, else what failed.
    pub fn code(&self) -> String {
        match self {
            GoogleApiError::Status { reason, status, .. } if reason.is_empty() => format!("HTTP {status}"),
            GoogleApiError::Status { reason, .. } => reason.clone(),
            GoogleApiError::Transport { timed_out: true, .. } => "timeout".into(),
            GoogleApiError::Transport { .. } => "transport".into(),
            GoogleApiError::Decode { .. } => "decode".into(),
            GoogleApiError::Token(_) => "token".into(),
            GoogleApiError::PlainHttp(_) => "plain-http".into(),
        }
    }
}

/// (reason, message) of a Google JSON error body; the raw text when it is not one.
pub fn parse_error(body: &str) -> (String, String) {
    match serde_json::from_str::<Value>(body) {
        Ok(v) if v["error"].is_object() => {
            let e = &v["error"];
            let reason = e["errors"][0]["reason"].as_str().or(e["status"].as_str()).unwrap_or_default().to_string();
            (reason, e["message"].as_str().unwrap_or_default().to_string())
        }
        _ => (String::new(), body.chars().take(300).collect()),
    }
}

#[derive(Debug, Clone)]
pub struct GoogleApi {
    client: reqwest::Client,
    tokens: TokenSource,
    counter: Option<CallCounter>,
}

/// The operation a request is, for counting: `compute/disks.list`, `compute/instances.attachDisk`,
/// `compute/operations.wait`, `dns/managedZones.changes`, … (the scope — zone, region, global —
/// left out).
pub fn op_key(method: &Method, url: &str) -> String {
    let path = url.split('?').next().unwrap_or(url);
    let service = if path.contains("/dns/v1/") { "dns" } else { "compute" };
    let mut segs: Vec<&str> = path.split("/projects/").nth(1).unwrap_or("").split('/').skip(1).filter(|s| !s.is_empty()).collect();
    if segs.len() > 2 && matches!(segs[0], "zones" | "regions") {
        segs.drain(..2);
    } else if segs.first() == Some(&"global") {
        segs.remove(0);
    }
    let op = match (segs.as_slice(), method.as_str()) {
        ([c], "GET") => format!("{c}.list"),
        ([c], _) => format!("{c}.insert"),
        ([c, _], "GET") => format!("{c}.get"),
        ([c, _], "DELETE") => format!("{c}.delete"),
        ([c, _], _) => format!("{c}.update"),
        ([c, _, action, ..], _) => format!("{c}.{action}"),
        _ => "unknown".to_string(),
    };
    format!("{service}/{op}")
}

impl GoogleApi {
    /// `timeout`: the longest one request may take unless a call gives its own.
    pub fn new(tokens: TokenSource, timeout: Duration) -> Result<GoogleApi, GoogleApiError> {
        let client = reqwest::Client::builder()
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .timeout(timeout)
            .build()
            .map_err(|e| GoogleApiError::Transport { method: Method::GET, url: String::new(), message: e.to_string(), timed_out: false })?;
        Ok(GoogleApi { client, tokens, counter: None })
    }

    /// Count every call (and its attempts) in `counter`.
    pub fn with_counter(mut self, counter: CallCounter) -> GoogleApi {
        self.counter = Some(counter);
        self
    }

    pub async fn get(&self, url: &str) -> Result<Value, GoogleApiError> {
        self.call(Method::GET, url, None, None).await
    }

    pub async fn post(&self, url: &str, body: &Value) -> Result<Value, GoogleApiError> {
        self.call(Method::POST, url, Some(body), None).await
    }

    /// One call; `timeout` overrides the client's for this request.
    pub async fn call(&self, method: Method, url: &str, body: Option<&Value>, timeout: Option<Duration>) -> Result<Value, GoogleApiError> {
        let mut attempts = 0;
        let result = self.attempt(method.clone(), url, body, timeout, &mut attempts).await;
        if let Some(c) = &self.counter {
            c.record(&op_key(&method, url), attempts);
        }
        result
    }

    async fn attempt(&self, method: Method, url: &str, body: Option<&Value>, timeout: Option<Duration>, attempts: &mut u64) -> Result<Value, GoogleApiError> {
        // Every call carries the service account's token: never in clear off loopback.
        base::plain_http::check("Google API", url)?;
        let mut attempt = 0;
        let mut refreshed = false;
        loop {
            attempt += 1;
            *attempts += 1;
            let token = self.tokens.token().await?;
            let mut req = self.client.request(method.clone(), url).bearer_auth(token);
            if let Some(b) = body {
                req = req.header("content-type", "application/json").body(b.to_string());
            }
            if let Some(t) = timeout {
                req = req.timeout(t);
            }
            let transport = |e: reqwest::Error| GoogleApiError::Transport {
                method: method.clone(),
                url: url.to_string(),
                timed_out: e.is_timeout(),
                message: e.to_string(),
            };
            let resp = match req.send().await {
                Ok(r) => r,
                Err(e) if method == Method::GET && attempt < READ_ATTEMPTS && !e.is_timeout() => {
                    tracing::warn!(%url, attempt, error = %e, "Google API read failed; retrying");
                    tokio::time::sleep(backoff(attempt)).await;
                    continue;
                }
                Err(e) => return Err(transport(e)),
            };
            let status = resp.status().as_u16();
            let text = resp.text().await.map_err(transport)?;
            if (200..300).contains(&status) {
                if text.trim().is_empty() {
                    return Ok(Value::Null);
                }
                return serde_json::from_str(&text).map_err(|e| GoogleApiError::Decode {
                    method: method.clone(),
                    url: url.to_string(),
                    message: e.to_string(),
                });
            }
            if status == 401 && !refreshed {
                // The token was revoked or expired early: one fresh token, once.
                refreshed = true;
                self.tokens.invalidate().await;
                continue;
            }
            let retryable = status == 429 || (status >= 500 && method == Method::GET);
            if retryable && attempt < READ_ATTEMPTS {
                tracing::warn!(%url, attempt, status, "Google API busy; retrying");
                tokio::time::sleep(backoff(attempt)).await;
                continue;
            }
            let (reason, message) = parse_error(&text);
            return Err(GoogleApiError::Status { method, url: url.to_string(), status, reason, message });
        }
    }

    /// Every item of a paginated list (`items_key`: `items`, `managedZones`, `rrsets`), following
    /// `nextPageToken` (at most `max_pages` pages: a server that never ends is an error).
    pub async fn list_all(&self, url: &str, items_key: &str, max_pages: usize) -> Result<Vec<Value>, GoogleApiError> {
        self.pages(Method::GET, url, items_key, max_pages).await
    }

    /// [`GoogleApi::list_all`] for a list read with `method`: Compute's
    /// `instanceGroupManagers.listManagedInstances` is a POST (an empty body) that pages the same way.
    pub async fn pages(&self, method: Method, url: &str, items_key: &str, max_pages: usize) -> Result<Vec<Value>, GoogleApiError> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        for _ in 0..max_pages {
            let page_url = match &token {
                Some(t) => format!("{url}{}pageToken={}", if url.contains('?') { '&' } else { '?' }, enc(t)),
                None => url.to_string(),
            };
            let v = if method == Method::GET {
                self.get(&page_url).await?
            } else {
                self.call(method.clone(), &page_url, Some(&serde_json::json!({})), None).await?
            };
            out.extend(v[items_key].as_array().cloned().unwrap_or_default());
            match v["nextPageToken"].as_str() {
                Some(t) if !t.is_empty() => token = Some(t.to_string()),
                _ => return Ok(out),
            }
        }
        Err(GoogleApiError::Decode { method, url: url.to_string(), message: format!("more than {max_pages} pages") })
    }
}

fn backoff(attempt: u32) -> Duration {
    base::imds::jittered(Duration::from_millis(200), attempt.saturating_sub(1), Duration::from_secs(3))
}

/// Everything but RFC 3986's unreserved characters is escaped.
const ESCAPED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');

/// Percent-encode a path segment or query value.
pub fn enc(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, ESCAPED).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn google_errors_parse_to_reason_and_message() {
        let body = r#"{"error":{"code":400,"message":"The disk resource 'x' is already being used by 'y'","errors":[{"message":"m","domain":"global","reason":"resourceInUseByAnotherResource"}],"status":"INVALID_ARGUMENT"}}"#;
        assert_eq!(parse_error(body), ("resourceInUseByAnotherResource".into(), "The disk resource 'x' is already being used by 'y'".into()));
        assert_eq!(parse_error(r#"{"error":{"code":403,"message":"no","status":"PERMISSION_DENIED"}}"#).0, "PERMISSION_DENIED");
        assert_eq!(parse_error("<html>bad gateway</html>"), (String::new(), "<html>bad gateway</html>".into()));
    }

    #[test]
    fn requests_are_counted_by_operation() {
        let c = "https://compute.googleapis.com/compute/v1/projects/p";
        assert_eq!(op_key(&Method::GET, &format!("{c}/zones/z/disks?filter=x")), "compute/disks.list");
        assert_eq!(op_key(&Method::GET, &format!("{c}/zones/z/disks/d")), "compute/disks.get");
        assert_eq!(op_key(&Method::POST, &format!("{c}/zones/z/instances/i/attachDisk")), "compute/instances.attachDisk");
        assert_eq!(op_key(&Method::POST, &format!("{c}/zones/z/operations/o/wait")), "compute/operations.wait");
        assert_eq!(op_key(&Method::GET, &format!("{c}/regions/r")), "compute/regions.get");
        let d = "https://dns.googleapis.com/dns/v1/projects/p";
        assert_eq!(op_key(&Method::GET, &format!("{d}/managedZones")), "dns/managedZones.list");
        assert_eq!(op_key(&Method::POST, &format!("{d}/managedZones/z/changes")), "dns/managedZones.changes");
    }

    /// Every call carries the service account's token: to a plain-http endpoint off loopback it is
    /// refused before a token is asked for or a byte is sent (the metadata server here is a closed
    /// loopback port, and `0.0.0.0` is this host to the kernel: an open hole only meets refused
    /// connections, and the test sees the wrong error).
    #[tokio::test]
    async fn no_token_goes_over_plain_http_off_loopback() {
        let md = base::gce_metadata::GceMetadata::new(Some("127.0.0.1:9"), Duration::from_secs(2)).expect("metadata");
        let api = GoogleApi::new(TokenSource::new(md), Duration::from_secs(2)).expect("client");
        let err = api.get("http://0.0.0.0:9/compute/v1/projects/p/zones").await.expect_err("refused");
        assert!(matches!(err, GoogleApiError::PlainHttp(_)), "{err}");
        assert!(err.to_string().contains(base::plain_http::ALLOW_ENV), "{err}");
    }
}
