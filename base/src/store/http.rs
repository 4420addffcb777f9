//! The `http(s)://` backend: read-only (a web server or a public bucket's URL). Whole reads are
//! retried with backoff; chunked reads are not.

use std::time::Duration;

use super::StoreError;

/// Attempts of one http(s) read (transport errors and 5xx are retried with doubling backoff).
const HTTP_ATTEMPTS: u32 = 5;

#[derive(Debug, Clone)]
pub(super) struct HttpStore {
    client: reqwest::Client,
}

impl HttpStore {
    /// `timeout` bounds each request (and its connect); `url` is the base, for a failure's message.
    pub fn new(url: &str, timeout: Duration) -> Result<HttpStore, StoreError> {
        let client =
            reqwest::Client::builder().connect_timeout(timeout).timeout(timeout).build().map_err(|source| StoreError::Http { url: url.to_string(), source })?;
        Ok(HttpStore { client })
    }

    pub async fn get(&self, url: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let client = &self.client;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let err = match client.get(url).send().await {
                Ok(resp) if resp.status().as_u16() == 404 => return Ok(None),
                Ok(resp) if resp.status().is_success() => match resp.bytes().await {
                    Ok(b) => return Ok(Some(b.to_vec())),
                    Err(source) => StoreError::Http { url: url.to_string(), source },
                },
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let e = StoreError::Status { url: url.to_string(), status };
                    if status < 500 && status != 429 {
                        return Err(e);
                    }
                    e
                }
                Err(source) => StoreError::Http { url: url.to_string(), source },
            };
            if attempt >= HTTP_ATTEMPTS {
                return Err(err);
            }
            let wait = crate::imds::jittered(Duration::from_millis(250), attempt - 1, Duration::from_secs(4));
            tracing::warn!(%url, attempt, error = %err, ?wait, "state store read failed; retrying");
            tokio::time::sleep(wait).await;
        }
    }

    pub async fn read_chunks(&self, url: &str, sink: &mut (dyn FnMut(&[u8]) -> std::io::Result<()> + Send)) -> Result<Option<u64>, StoreError> {
        let url = url.to_string();
        let mut resp = self.client.get(&url).send().await.map_err(|source| StoreError::Http { url: url.clone(), source })?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !resp.status().is_success() {
            return Err(StoreError::Status { url, status: resp.status().as_u16() });
        }
        let mut total = 0u64;
        while let Some(chunk) = resp.chunk().await.map_err(|source| StoreError::Http { url: url.clone(), source })? {
            total += chunk.len() as u64;
            sink(&chunk).map_err(|source| StoreError::Io { path: std::path::PathBuf::from(url.clone()), source })?;
        }
        Ok(Some(total))
    }
}
