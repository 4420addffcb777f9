//! Read-only `s3://bucket/prefix` state stores: a signed (AWS Signature V4) GET per object, over
//! the same HTTP client as everything else — no SDK, so nodeup stays small.
//!
//! Endpoint: `$AWS_ENDPOINT_URL_S3` or `$AWS_ENDPOINT_URL` (path-style, e.g. a local moto), else
//! `https://<bucket>.s3.<region>.amazonaws.com`. Region: `$AWS_REGION`, `$AWS_DEFAULT_REGION`,
//! else the instance's. Credentials: `$AWS_ACCESS_KEY_ID`/`$AWS_SECRET_ACCESS_KEY`
//! (`$AWS_SESSION_TOKEN`), else the instance role from IMDSv2.

use sha2::{Digest as _, Sha256};

/// Why an S3 read failed.
#[derive(Debug, thiserror::Error)]
pub enum S3Error {
    #[error("{url}: {message}")]
    Http { url: String, message: String },
    #[error("s3: no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or run on an instance with a role")]
    NoCredentials,
    #[error("{base:?}: not an s3://bucket[/prefix] URL")]
    Url { base: String },
}

/// AWS credentials.
#[derive(Clone)]
pub struct Credentials {
    pub access_key: String,
    pub secret_key: String,
    pub token: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").field("access_key", &self.access_key).field("secret_key", &"<redacted>").finish()
    }
}

impl Credentials {
    pub fn from_env() -> Option<Credentials> {
        let get = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Some(Credentials { access_key: get("AWS_ACCESS_KEY_ID")?, secret_key: get("AWS_SECRET_ACCESS_KEY")?, token: get("AWS_SESSION_TOKEN") })
    }
}

fn hmac(key: &[u8], msg: &[u8]) -> [u8; 32] {
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    inner.update(msg);
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// URI-encode a path (each byte except unreserved characters and `/`).
pub fn uri_encode_path(p: &str) -> String {
    let mut out = String::new();
    for b in p.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The `Authorization` header of a request with no query string. `headers` are
/// lower-case `(name, value)` pairs including `host`, `x-amz-date` and `x-amz-content-sha256`.
pub fn authorization(creds: &Credentials, region: &str, method: &str, path: &str, headers: &[(String, String)], payload_hash: &str) -> String {
    let mut hs: Vec<(String, String)> = headers.iter().map(|(k, v)| (k.to_ascii_lowercase(), v.trim().to_string())).collect();
    hs.sort();
    let amz_date = hs.iter().find(|(k, _)| k == "x-amz-date").map(|(_, v)| v.clone()).unwrap_or_default();
    let date = &amz_date[..amz_date.len().min(8)];
    let canonical_headers: String = hs.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
    let signed: Vec<&str> = hs.iter().map(|(k, _)| k.as_str()).collect();
    let signed = signed.join(";");
    let canonical = format!("{method}\n{}\n\n{canonical_headers}\n{signed}\n{payload_hash}", uri_encode_path(path));
    let scope = format!("{date}/{region}/s3/aws4_request");
    let to_sign = format!("AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}", hex::encode(Sha256::digest(canonical.as_bytes())));
    let k = hmac(format!("AWS4{}", creds.secret_key).as_bytes(), date.as_bytes());
    let k = hmac(&k, region.as_bytes());
    let k = hmac(&k, b"s3");
    let k = hmac(&k, b"aws4_request");
    let sig = hex::encode(hmac(&k, to_sign.as_bytes()));
    format!("AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed}, Signature={sig}", creds.access_key)
}

fn amz_now() -> String {
    let t = time::OffsetDateTime::now_utc();
    format!("{:04}{:02}{:02}T{:02}{:02}{:02}Z", t.year(), u8::from(t.month()), t.day(), t.hour(), t.minute(), t.second())
}

/// A read-only S3 location.
pub struct S3Store {
    bucket: String,
    prefix: String,
    endpoint: Option<String>,
    region: String,
    creds: Credentials,
    client: reqwest::blocking::Client,
}

impl S3Store {
    pub fn new(base: &str, region: Option<&str>, creds: Option<Credentials>, timeout: std::time::Duration) -> Result<S3Store, S3Error> {
        let rest = base.strip_prefix("s3://").ok_or_else(|| S3Error::Url { base: base.into() })?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(S3Error::Url { base: base.into() });
        }
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let region = env("AWS_REGION").or_else(|| env("AWS_DEFAULT_REGION")).or(region.map(str::to_string)).unwrap_or_else(|| "us-east-1".into());
        let client = reqwest::blocking::Client::builder()
            .connect_timeout(timeout)
            .timeout(timeout)
            .build()
            .map_err(|e| S3Error::Http { url: base.into(), message: e.to_string() })?;
        Ok(S3Store {
            bucket: bucket.into(),
            prefix: prefix.trim_matches('/').into(),
            endpoint: env("AWS_ENDPOINT_URL_S3").or_else(|| env("AWS_ENDPOINT_URL")).map(|e| e.trim_end_matches('/').to_string()),
            region,
            creds: creds.or_else(Credentials::from_env).ok_or(S3Error::NoCredentials)?,
            client,
        })
    }

    fn key(&self, rel: &str) -> String {
        let rel = rel.trim_start_matches('/');
        if self.prefix.is_empty() {
            rel.to_string()
        } else {
            format!("{}/{rel}", self.prefix)
        }
    }

    /// GET an object; `Ok(None)` when it does not exist.
    pub fn get(&self, rel: &str) -> Result<Option<Vec<u8>>, S3Error> {
        let key = self.key(rel);
        let (url, host, path) = match &self.endpoint {
            Some(e) => {
                let host = e.split("://").nth(1).unwrap_or(e).split('/').next().unwrap_or("").to_string();
                let path = format!("/{}/{key}", self.bucket);
                (format!("{e}{}", uri_encode_path(&path)), host, path)
            }
            None => {
                let host = format!("{}.s3.{}.amazonaws.com", self.bucket, self.region);
                let path = format!("/{key}");
                (format!("https://{host}{}", uri_encode_path(&path)), host, path)
            }
        };
        let payload = "UNSIGNED-PAYLOAD";
        let mut headers = vec![
            ("host".to_string(), host),
            ("x-amz-content-sha256".to_string(), payload.to_string()),
            ("x-amz-date".to_string(), amz_now()),
        ];
        if let Some(t) = &self.creds.token {
            headers.push(("x-amz-security-token".into(), t.clone()));
        }
        let auth = authorization(&self.creds, &self.region, "GET", &path, &headers, payload);
        let mut req = self.client.get(&url).header("authorization", auth);
        for (k, v) in headers.iter().filter(|(k, _)| k != "host") {
            req = req.header(k.as_str(), v.as_str());
        }
        let err = |message: String| S3Error::Http { url: format!("s3://{}/{key}", self.bucket), message };
        let resp = req.send().map_err(|e| err(crate::tasks::error_chain(&e)))?;
        match resp.status().as_u16() {
            200 => Ok(Some(resp.bytes().map_err(|e| err(e.to_string()))?.to_vec())),
            404 => Ok(None),
            s => {
                let body = resp.text().unwrap_or_default();
                Err(err(format!("HTTP {s}: {}", body.chars().take(300).collect::<String>())))
            }
        }
    }
}

/// Instance-role credentials from IMDSv2 (`iam/security-credentials/<role>`).
pub fn credentials_from_imds(imds: &mut crate::imds::Imds) -> Result<Option<Credentials>, crate::imds::ImdsError> {
    let Some(role) = imds.get("iam/security-credentials/")? else { return Ok(None) };
    let role = role.lines().next().unwrap_or("").trim().to_string();
    let Some(doc) = imds.get(&format!("iam/security-credentials/{role}"))? else { return Ok(None) };
    let v: serde_json::Value = serde_json::from_str(&doc).unwrap_or_default();
    let s = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_string);
    Ok(match (s("AccessKeyId"), s("SecretAccessKey")) {
        (Some(access_key), Some(secret_key)) => Some(Credentials { access_key, secret_key, token: s("Token") }),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AWS's documented example (Signature V4, "GET Object").
    #[test]
    fn sigv4_matches_aws_documentation_example() {
        let creds = Credentials {
            access_key: "AKIAIOSFODNN7EXAMPLE".into(),
            secret_key: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into(),
            token: None,
        };
        let empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        let headers = vec![
            ("host".to_string(), "examplebucket.s3.amazonaws.com".to_string()),
            ("range".to_string(), "bytes=0-9".to_string()),
            ("x-amz-content-sha256".to_string(), empty.to_string()),
            ("x-amz-date".to_string(), "20130524T000000Z".to_string()),
        ];
        let auth = authorization(&creds, "us-east-1", "GET", "/test.txt", &headers, empty);
        assert_eq!(
            auth,
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, \
             SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, \
             Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
    }

    #[test]
    fn hmac_rfc4231_case_2() {
        assert_eq!(
            hex::encode(hmac(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
