//! The `gs://bucket/prefix` backend: the Cloud Storage JSON API over HTTPS. Credentials are
//! Application Default Credentials when the environment names them ([`crate::gce_adc`]: a
//! service-account key or gcloud's user login, off GCE), else the instance's service-account token
//! from the GCE metadata server (`Metadata-Flavor: Google`), cached until shortly before it expires; every upload is checked against the MD5 the service reports;
//! the lock is a create with `ifGenerationMatch=0` (the service refuses it with 412 when the object
//! exists). `STORAGE_EMULATOR_HOST` points the store at an emulator (then no token is sent unless
//! `GCE_METADATA_HOST` is set too), `GCE_METADATA_HOST` at another metadata server — the variables
//! Google's own client libraries read.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use md5::Digest as _;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use tokio::io::AsyncReadExt as _;
use tokio::sync::Mutex;

use super::StoreError;
use crate::gce_metadata::GceMetadata;

/// Cloud Storage's endpoint.
pub const GCS_ENDPOINT: &str = "https://storage.googleapis.com";
/// Resumable uploads move in chunks that are a multiple of this (the service's rule).
const CHUNK_QUANTUM: u64 = 256 << 10;

/// What an object name may keep unescaped in a URL path segment or query value: RFC 3986's
/// unreserved characters.
const OBJECT_NAME: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// Where the store talks to and how it authenticates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcsEndpoints {
    /// `https://storage.googleapis.com` or an emulator's URL.
    pub storage: String,
    /// The metadata server to take tokens from (`http://host[:port]`), `None`: send no token.
    pub metadata: Option<String>,
    /// Application Default Credentials to take tokens from instead (Google's service only).
    pub credentials_file: Option<std::path::PathBuf>,
}

impl GcsEndpoints {
    /// From the variables Google's client libraries read (`STORAGE_EMULATOR_HOST`, `GCE_METADATA_HOST`).
    pub fn from_env() -> GcsEndpoints {
        GcsEndpoints::from_vars(|k| std::env::var(k).ok().filter(|v| !v.trim().is_empty()))
    }

    fn from_vars(var: impl Fn(&str) -> Option<String>) -> GcsEndpoints {
        let with_scheme = |h: String| if h.contains("://") { h.trim_end_matches('/').to_string() } else { format!("http://{}", h.trim_end_matches('/')) };
        let metadata_host = var("GCE_METADATA_HOST").map(with_scheme);
        match var("STORAGE_EMULATOR_HOST") {
            Some(emulator) => GcsEndpoints { storage: with_scheme(emulator), metadata: metadata_host, credentials_file: None },
            None => GcsEndpoints {
                storage: GCS_ENDPOINT.to_string(),
                metadata: Some(metadata_host.unwrap_or_else(|| format!("http://{}", crate::gce_metadata::DEFAULT_HOST))),
                credentials_file: crate::gce_adc::locate(
                    var(crate::gce_adc::ENV).map(Into::into),
                    var(crate::gce_adc::CLOUDSDK_CONFIG_ENV).map(Into::into),
                    var("HOME").map(Into::into),
                ),
            },
        }
    }
}

#[derive(Debug)]
struct Token {
    value: String,
    until: Instant,
}

/// A bucket and the prefix the store's keys live under.
#[derive(Debug, Clone)]
pub(super) struct GcsStore {
    client: reqwest::Client,
    endpoints: GcsEndpoints,
    bucket: String,
    prefix: String,
    /// Where tokens come from (the metadata client, which also refuses an answer that is not the
    /// metadata server's); `None`: send no token.
    metadata: Option<GceMetadata>,
    /// Application Default Credentials, which win over the metadata server.
    credentials: Option<crate::gce_adc::Credentials>,
    token: Arc<Mutex<Option<Token>>>,
}

#[derive(serde::Deserialize)]
struct TokenAnswer {
    access_token: String,
    expires_in: u64,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct ObjectResource {
    name: String,
    #[serde(default)]
    md5_hash: Option<String>,
    #[serde(default)]
    size: Option<String>,
    #[serde(default)]
    updated: Option<String>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct ObjectList {
    #[serde(default)]
    items: Vec<ObjectResource>,
    #[serde(default)]
    next_page_token: Option<String>,
}

/// Whether the service's report of an upload (its `md5Hash` and `size`) matches what was sent.
pub(super) fn upload_matches(md5_hash: Option<&str>, reported_size: Option<&str>, size: u64, md5: &[u8]) -> Result<(), String> {
    let want = base64::engine::general_purpose::STANDARD.encode(md5);
    match (md5_hash, reported_size) {
        (Some(h), _) if h != want => Err(format!("the service stored MD5 {h}, sent {want}")),
        (_, Some(s)) if s.parse::<u64>().ok() != Some(size) => Err(format!("the service stored {s} bytes, sent {size}")),
        (None, _) => Err("the service reported no MD5 for the upload".to_string()),
        _ => Ok(()),
    }
}

impl GcsStore {
    pub fn new(bucket: &str, prefix: &str, endpoints: GcsEndpoints, timeout: Duration) -> Result<GcsStore, StoreError> {
        let client = reqwest::Client::builder()
            .connect_timeout(timeout)
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|source| StoreError::Http { url: endpoints.storage.clone(), source })?;
        let metadata = match &endpoints.metadata {
            Some(host) => Some(GceMetadata::new(Some(host), timeout).map_err(|e| StoreError::Gcs {
                op: "token",
                bucket: bucket.to_string(),
                name: String::new(),
                message: e.to_string(),
            })?),
            None => None,
        };
        let credentials = match &endpoints.credentials_file {
            Some(path) => {
                let adc = |message: String| StoreError::Gcs { op: "token", bucket: bucket.to_string(), name: String::new(), message };
                let text = std::fs::read_to_string(path).map_err(|e| adc(format!("{}: {e}", path.display())))?;
                Some(crate::gce_adc::parse(path, &text).map_err(|e| adc(e.to_string()))?)
            }
            None => None,
        };
        Ok(GcsStore { client, endpoints, bucket: bucket.to_string(), prefix: prefix.to_string(), metadata, credentials, token: Arc::new(Mutex::new(None)) })
    }

    fn name(&self, rel: &str) -> String {
        super::config_base::s3_key(&self.prefix, rel)
    }

    fn err(&self, op: &'static str, name: &str, message: impl Into<String>) -> StoreError {
        StoreError::Gcs { op, bucket: self.bucket.clone(), name: name.to_string(), message: message.into() }
    }

    fn object_url(&self, name: &str) -> String {
        format!("{}/storage/v1/b/{}/o/{}", self.endpoints.storage, self.bucket, utf8_percent_encode(name, OBJECT_NAME))
    }

    fn upload_url(&self, name: &str, kind: &str, if_absent: bool) -> String {
        let mut url =
            format!("{}/upload/storage/v1/b/{}/o?uploadType={kind}&name={}", self.endpoints.storage, self.bucket, utf8_percent_encode(name, OBJECT_NAME));
        if if_absent {
            url.push_str("&ifGenerationMatch=0");
        }
        url
    }

    /// The service-account token, from the metadata server (cached until a minute before it expires).
    async fn auth(&self, req: reqwest::RequestBuilder) -> Result<reqwest::RequestBuilder, StoreError> {
        if self.metadata.is_none() && self.credentials.is_none() {
            return Ok(req);
        }
        let mut cached = self.token.lock().await;
        if let Some(t) = cached.as_ref().filter(|t| t.until > Instant::now()) {
            return Ok(req.bearer_auth(&t.value));
        }
        if let Some(creds) = &self.credentials {
            let (value, expires_in) = crate::gce_adc::fetch(&self.client, creds).await.map_err(|e| self.err("token", "", e.to_string()))?;
            let until = Instant::now() + Duration::from_secs(expires_in.saturating_sub(60));
            let req = req.bearer_auth(&value);
            *cached = Some(Token { value, until });
            return Ok(req);
        }
        let Some(metadata) = &self.metadata else { return Ok(req) };
        let path = "instance/service-accounts/default/token";
        let body = metadata
            .get(path)
            .await
            .map_err(|e| self.err("token", "", e.to_string()))?
            .ok_or_else(|| self.err("token", "", format!("the metadata server has no {path}")))?;
        let answer: TokenAnswer = serde_json::from_str(&body).map_err(|e| self.err("token", "", format!("{path}: not a token answer: {e}")))?;
        let until = Instant::now() + Duration::from_secs(answer.expires_in.saturating_sub(60));
        let req = req.bearer_auth(&answer.access_token);
        *cached = Some(Token { value: answer.access_token, until });
        Ok(req)
    }

    async fn send(&self, op: &'static str, name: &str, req: reqwest::RequestBuilder) -> Result<reqwest::Response, StoreError> {
        self.auth(req).await?.send().await.map_err(|e| self.err(op, name, e.to_string()))
    }

    async fn failure(&self, op: &'static str, name: &str, resp: reqwest::Response) -> StoreError {
        let status = resp.status().as_u16();
        let body = resp.text().await.unwrap_or_else(|e| format!("(body unreadable: {e})"));
        self.err(op, name, format!("HTTP {status}: {}", body.chars().take(300).collect::<String>()))
    }

    pub async fn get(&self, rel: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let mut out = Vec::new();
        let found = self
            .read_chunks(rel, &mut |chunk| {
                out.extend_from_slice(chunk);
                Ok(())
            })
            .await?;
        Ok(found.map(|_| out))
    }

    pub async fn read_chunks(&self, rel: &str, sink: &mut (dyn FnMut(&[u8]) -> std::io::Result<()> + Send)) -> Result<Option<u64>, StoreError> {
        let name = self.name(rel);
        let url = format!("{}?alt=media", self.object_url(&name));
        let mut resp = self.send("get", &name, self.client.get(&url)).await?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !resp.status().is_success() {
            return Err(self.failure("get", &name, resp).await);
        }
        let mut total = 0u64;
        while let Some(chunk) = resp.chunk().await.map_err(|e| self.err("get", &name, e.to_string()))? {
            total += chunk.len() as u64;
            sink(&chunk).map_err(|source| StoreError::Io { path: std::path::PathBuf::from(format!("gs://{}/{name}", self.bucket)), source })?;
        }
        Ok(Some(total))
    }

    /// Upload in one request; `if_absent`: only if no object has the name (`Ok(false)` when one has).
    async fn upload(&self, name: &str, bytes: &[u8], if_absent: bool) -> Result<bool, StoreError> {
        let url = self.upload_url(name, "media", if_absent);
        let req = self.client.post(&url).header("Content-Type", "application/octet-stream").body(bytes.to_vec());
        let resp = self.send("put", name, req).await?;
        if if_absent && resp.status() == reqwest::StatusCode::PRECONDITION_FAILED {
            return Ok(false);
        }
        if !resp.status().is_success() {
            return Err(self.failure("put", name, resp).await);
        }
        self.check_upload(name, resp, bytes.len() as u64, &md5::Md5::digest(bytes)).await?;
        Ok(true)
    }

    async fn check_upload(&self, name: &str, resp: reqwest::Response, size: u64, md5: &[u8]) -> Result<(), StoreError> {
        let body = resp.bytes().await.map_err(|e| self.err("put", name, e.to_string()))?;
        let object: ObjectResource =
            serde_json::from_slice(&body).map_err(|e| self.err("put", name, format!("the upload's answer is not an object resource: {e}")))?;
        upload_matches(object.md5_hash.as_deref(), object.size.as_deref(), size, md5).map_err(|m| self.err("put", name, format!("upload check failed: {m}")))
    }

    pub async fn put(&self, rel: &str, bytes: &[u8]) -> Result<(), StoreError> {
        self.upload(&self.name(rel), bytes, false).await.map(|_| ())
    }

    pub async fn delete(&self, rel: &str) -> Result<(), StoreError> {
        let name = self.name(rel);
        let resp = self.send("delete", &name, self.client.delete(self.object_url(&name))).await?;
        if resp.status().is_success() || resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(());
        }
        Err(self.failure("delete", &name, resp).await)
    }

    /// A resumable upload in chunks of `part_size` (rounded to the service's 256 KiB quantum) read
    /// from the file one at a time, so the file is never whole in memory; checked like every upload.
    pub async fn put_file(&self, rel: &str, source: &std::path::Path, part_size: u64) -> Result<(), StoreError> {
        let name = self.name(rel);
        let io = |e: std::io::Error| StoreError::Io { path: source.to_path_buf(), source: e };
        let mut file = tokio::fs::File::open(source).await.map_err(io)?;
        let size = file.metadata().await.map_err(io)?.len();
        let start = self.send("put", &name, self.client.post(self.upload_url(&name, "resumable", false)).header("Content-Length", "0")).await?;
        if !start.status().is_success() {
            return Err(self.failure("put", &name, start).await);
        }
        let session = start
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .ok_or_else(|| self.err("put", &name, "the resumable upload has no session (no Location header)"))?;
        let chunk = (part_size / CHUNK_QUANTUM).max(1) * CHUNK_QUANTUM;
        let mut md5 = md5::Md5::new();
        let mut sent = 0u64;
        loop {
            let want = chunk.min(size - sent);
            let mut buf = vec![0u8; usize::try_from(want).map_err(|_| self.err("put", &name, "chunk too large"))?];
            file.read_exact(&mut buf).await.map_err(io)?;
            md5.update(&buf);
            let last = sent + want == size;
            let range = match (want, last) {
                (0, _) => format!("bytes */{size}"),
                (_, true) => format!("bytes {sent}-{}/{size}", sent + want - 1),
                (_, false) => format!("bytes {sent}-{}/*", sent + want - 1),
            };
            let resp = self.send("put", &name, self.client.put(&session).header("Content-Range", range).body(buf)).await?;
            sent += want;
            if last {
                if !resp.status().is_success() {
                    return Err(self.failure("put", &name, resp).await);
                }
                return self.check_upload(&name, resp, size, &md5.finalize()).await;
            }
            // 308: the service has the chunk and wants the next one.
            if resp.status().as_u16() != 308 {
                return Err(self.failure("put", &name, resp).await);
            }
        }
    }

    pub async fn list_modified(&self, rel_prefix: &str) -> Result<Vec<(String, Option<time::OffsetDateTime>)>, StoreError> {
        let full = self.name(rel_prefix);
        let strip = if self.prefix.is_empty() { String::new() } else { format!("{}/", self.prefix) };
        let mut out = Vec::new();
        let mut page: Option<String> = None;
        loop {
            let mut url = format!("{}/storage/v1/b/{}/o?prefix={}", self.endpoints.storage, self.bucket, utf8_percent_encode(&full, OBJECT_NAME));
            if let Some(p) = &page {
                url.push_str(&format!("&pageToken={}", utf8_percent_encode(p, OBJECT_NAME)));
            }
            let resp = self.send("list", &full, self.client.get(&url)).await?;
            if !resp.status().is_success() {
                return Err(self.failure("list", &full, resp).await);
            }
            let body = resp.bytes().await.map_err(|e| self.err("list", &full, e.to_string()))?;
            let list: ObjectList = serde_json::from_slice(&body).map_err(|e| self.err("list", &full, format!("not an object list: {e}")))?;
            for o in list.items {
                let Some(rel) = o.name.strip_prefix(&strip) else { continue };
                let updated = o.updated.as_deref().and_then(|u| time::OffsetDateTime::parse(u, &time::format_description::well_known::Rfc3339).ok());
                out.push((rel.to_string(), updated));
            }
            match list.next_page_token {
                Some(p) if !p.is_empty() => page = Some(p),
                _ => break,
            }
        }
        out.sort();
        Ok(out)
    }

    /// Create `rel` holding `content` only if no object has its name (`ifGenerationMatch=0`):
    /// `Ok(None)` when created, `Ok(Some(what is there))` when it already exists.
    pub async fn create_exclusive(&self, rel: &str, content: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        if self.upload(&self.name(rel), content, true).await? {
            return Ok(None);
        }
        Ok(Some(self.get(rel).await?.unwrap_or_default()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_follow_the_variables_google_clients_read() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string());
        assert_eq!(
            GcsEndpoints::from_vars(vars(&[])),
            GcsEndpoints { storage: GCS_ENDPOINT.into(), metadata: Some("http://metadata.google.internal".into()), credentials_file: None }
        );
        assert_eq!(
            GcsEndpoints::from_vars(vars(&[("STORAGE_EMULATOR_HOST", "127.0.0.1:4443")])),
            GcsEndpoints { storage: "http://127.0.0.1:4443".into(), metadata: None, credentials_file: None }
        );
        assert_eq!(
            GcsEndpoints::from_vars(vars(&[("STORAGE_EMULATOR_HOST", "https://e:1/"), ("GCE_METADATA_HOST", "127.0.0.1:8080")])),
            GcsEndpoints { storage: "https://e:1".into(), metadata: Some("http://127.0.0.1:8080".into()), credentials_file: None }
        );
    }

    #[test]
    fn an_upload_is_accepted_only_when_size_and_md5_match() {
        let md5 = md5::Md5::digest(b"hello");
        let good = base64::engine::general_purpose::STANDARD.encode(md5);
        assert_eq!(upload_matches(Some(&good), Some("5"), 5, &md5), Ok(()));
        assert!(upload_matches(Some("AAAA"), Some("5"), 5, &md5).is_err_and(|e| e.contains("MD5")));
        assert!(upload_matches(Some(&good), Some("4"), 5, &md5).is_err_and(|e| e.contains("4 bytes")));
        assert!(upload_matches(None, Some("5"), 5, &md5).is_err());
    }

    #[test]
    fn object_names_are_escaped_in_paths_and_queries() {
        let s = GcsStore::new("b", "c/x", GcsEndpoints { storage: "http://e".into(), metadata: None, credentials_file: None }, Duration::from_secs(1))
            .expect("store");
        let name = s.name("pki/issued/a b+c");
        assert_eq!(name, "c/x/pki/issued/a b+c");
        assert_eq!(s.object_url(&name), "http://e/storage/v1/b/b/o/c%2Fx%2Fpki%2Fissued%2Fa%20b%2Bc");
        assert_eq!(
            s.upload_url(&name, "media", true),
            "http://e/upload/storage/v1/b/b/o?uploadType=media&name=c%2Fx%2Fpki%2Fissued%2Fa%20b%2Bc&ifGenerationMatch=0"
        );
    }
}
