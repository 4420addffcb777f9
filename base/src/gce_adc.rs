//! Application Default Credentials: how the CLI gets Google access tokens off GCE (a workstation,
//! a CI runner), as Google's client libraries do. In order:
//! 1. the file `$GOOGLE_APPLICATION_CREDENTIALS` names (an error if it cannot be used: never fall
//!    through to other credentials when the user named a file);
//! 2. gcloud's `application_default_credentials.json` (`gcloud auth application-default login`)
//!    in `$CLOUDSDK_CONFIG`, else `~/.config/gcloud`;
//! 3. otherwise the metadata server (on GCE).
//!
//! Used by the `gs://` state store ([`crate::store`]) and the Compute/Cloud DNS token source
//! (`cloud::gce::TokenSource`).
//!
//! Two kinds of file are understood, as Google documents them: `service_account` (a key: the CLI
//! signs an RS256 JWT assertion for the `cloud-platform` scope and trades it at the file's
//! `token_uri`, grant type `urn:ietf:params:oauth:grant-type:jwt-bearer`) and `authorized_user`
//! (gcloud's user login: its refresh token is traded at `token_uri`). The key and the refresh token
//! are never logged or shown in errors.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine as _;
use serde::Deserialize;

/// The variable naming a credentials file.
pub const ENV: &str = "GOOGLE_APPLICATION_CREDENTIALS";
/// gcloud's configuration directory, when not `~/.config/gcloud`.
pub const CLOUDSDK_CONFIG_ENV: &str = "CLOUDSDK_CONFIG";
/// The file `gcloud auth application-default login` writes.
pub const WELL_KNOWN_FILE: &str = "application_default_credentials.json";
/// The scope every token is asked for (Compute, Cloud DNS, Cloud Storage).
pub const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
/// Google's token endpoint, when a file names none.
pub const DEFAULT_TOKEN_URI: &str = "https://oauth2.googleapis.com/token";
/// The JWT grant type of a service-account assertion.
pub const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// How long an assertion is valid (Google's maximum).
pub const ASSERTION_LIFETIME_SECS: u64 = 3600;

#[derive(Debug, thiserror::Error)]
pub enum AdcError {
    #[error("{path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a Google credentials file: {message}")]
    Parse { path: String, message: String },
    #[error("{path}: credentials of type {kind:?} are not supported here (service_account and authorized_user are)")]
    Unsupported { path: String, kind: String },
    #[error("{path}: private_key: {message}")]
    Key { path: String, message: String },
    #[error("token endpoint {url}: {message}")]
    Token { url: String, message: String },
}

/// A service account's key.
#[derive(Clone)]
pub struct ServiceAccount {
    pub client_email: String,
    pub private_key_id: Option<String>,
    pub token_uri: String,
    key: Arc<ring::signature::RsaKeyPair>,
}

impl std::fmt::Debug for ServiceAccount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccount").field("client_email", &self.client_email).field("token_uri", &self.token_uri).finish_non_exhaustive()
    }
}

impl ServiceAccount {
    /// The key's public half (PKCS#1 `RSAPublicKey` DER): what verifies its assertions.
    pub fn public_key_der(&self) -> Vec<u8> {
        use ring::signature::KeyPair as _;
        self.key.public_key().as_ref().to_vec()
    }
}

/// gcloud's user login.
#[derive(Clone)]
pub struct AuthorizedUser {
    pub client_id: String,
    client_secret: String,
    refresh_token: String,
    pub token_uri: String,
}

impl std::fmt::Debug for AuthorizedUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthorizedUser").field("client_id", &self.client_id).field("token_uri", &self.token_uri).finish_non_exhaustive()
    }
}

#[derive(Debug, Clone)]
pub enum Credentials {
    ServiceAccount(ServiceAccount),
    AuthorizedUser(AuthorizedUser),
}

impl Credentials {
    pub fn token_uri(&self) -> &str {
        match self {
            Credentials::ServiceAccount(s) => &s.token_uri,
            Credentials::AuthorizedUser(u) => &u.token_uri,
        }
    }
}

#[derive(Deserialize)]
struct File {
    #[serde(rename = "type")]
    kind: Option<String>,
    client_email: Option<String>,
    private_key: Option<String>,
    private_key_id: Option<String>,
    client_id: Option<String>,
    client_secret: Option<String>,
    refresh_token: Option<String>,
    token_uri: Option<String>,
}

/// Parse a credentials file's text (`path` only names it in errors).
pub fn parse(path: &Path, text: &str) -> Result<Credentials, AdcError> {
    let p = path.display().to_string();
    let f: File = serde_json::from_str(text).map_err(|e| AdcError::Parse { path: p.clone(), message: e.to_string() })?;
    let need = |v: Option<String>, field: &str| -> Result<String, AdcError> {
        v.filter(|s| !s.is_empty()).ok_or_else(|| AdcError::Parse { path: p.clone(), message: format!("{field} is missing") })
    };
    let token_uri = f.token_uri.clone().filter(|u| !u.is_empty()).unwrap_or_else(|| DEFAULT_TOKEN_URI.to_string());
    if !(token_uri.starts_with("https://") || token_uri.starts_with("http://")) {
        return Err(AdcError::Parse { path: p, message: format!("token_uri {token_uri:?} is not an http(s) URL") });
    }
    // The key's signed assertion or the refresh token goes there.
    crate::plain_http::check("token_uri", &token_uri).map_err(|e| AdcError::Parse { path: p.clone(), message: e.to_string() })?;
    match f.kind.as_deref() {
        Some("service_account") => {
            let pem_text = need(f.private_key, "private_key")?;
            let der = pem::parse(pem_text.as_bytes()).map_err(|e| AdcError::Key { path: p.clone(), message: e.to_string() })?;
            if der.tag() != "PRIVATE KEY" {
                return Err(AdcError::Key { path: p, message: format!("a PEM {:?} block, expected PRIVATE KEY (PKCS#8)", der.tag()) });
            }
            let key = ring::signature::RsaKeyPair::from_pkcs8(der.contents()).map_err(|e| AdcError::Key { path: p.clone(), message: e.to_string() })?;
            Ok(Credentials::ServiceAccount(ServiceAccount {
                client_email: need(f.client_email, "client_email")?,
                private_key_id: f.private_key_id,
                token_uri,
                key: Arc::new(key),
            }))
        }
        Some("authorized_user") => Ok(Credentials::AuthorizedUser(AuthorizedUser {
            client_id: need(f.client_id, "client_id")?,
            client_secret: need(f.client_secret, "client_secret")?,
            refresh_token: need(f.refresh_token, "refresh_token")?,
            token_uri,
        })),
        other => Err(AdcError::Unsupported { path: p, kind: other.unwrap_or("").to_string() }),
    }
}

/// Which file to use: `explicit` (`$GOOGLE_APPLICATION_CREDENTIALS`, used even if it does not
/// exist, so the error says so), else gcloud's well-known file if it exists.
pub fn locate(explicit: Option<PathBuf>, cloudsdk_config: Option<PathBuf>, home: Option<PathBuf>) -> Option<PathBuf> {
    if let Some(p) = explicit.filter(|p| !p.as_os_str().is_empty()) {
        return Some(p);
    }
    let dir = cloudsdk_config.filter(|p| !p.as_os_str().is_empty()).or_else(|| home.map(|h| h.join(".config/gcloud")))?;
    Some(dir.join(WELL_KNOWN_FILE)).filter(|p| p.is_file())
}

/// The credentials this process's environment names, if any.
pub fn from_environment() -> Result<Option<(PathBuf, Credentials)>, AdcError> {
    let env = |k: &str| std::env::var_os(k).map(PathBuf::from);
    let Some(path) = locate(env(ENV), env(CLOUDSDK_CONFIG_ENV), env("HOME")) else { return Ok(None) };
    let text = std::fs::read_to_string(&path).map_err(|source| AdcError::Read { path: path.display().to_string(), source })?;
    let creds = parse(&path, &text)?;
    Ok(Some((path, creds)))
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// The signed JWT a service account trades for a token (RS256; `aud` the token endpoint; valid
/// from `now` for [`ASSERTION_LIFETIME_SECS`]).
pub fn assertion(sa: &ServiceAccount, now_unix: u64) -> Result<String, AdcError> {
    let mut header = serde_json::json!({"alg": "RS256", "typ": "JWT"});
    if let Some(kid) = &sa.private_key_id {
        header["kid"] = serde_json::json!(kid);
    }
    let claims = serde_json::json!({
        "iss": sa.client_email,
        "scope": SCOPE,
        "aud": sa.token_uri,
        "iat": now_unix,
        "exp": now_unix + ASSERTION_LIFETIME_SECS,
    });
    let signing_input = format!("{}.{}", b64(header.to_string().as_bytes()), b64(claims.to_string().as_bytes()));
    let mut sig = vec![0u8; sa.key.public().modulus_len()];
    sa.key
        .sign(&ring::signature::RSA_PKCS1_SHA256, &ring::rand::SystemRandom::new(), signing_input.as_bytes(), &mut sig)
        .map_err(|_| AdcError::Key { path: sa.client_email.clone(), message: "signing the assertion failed".into() })?;
    Ok(format!("{signing_input}.{}", b64(&sig)))
}

/// The form fields of the token request.
pub fn token_form(c: &Credentials, now_unix: u64) -> Result<Vec<(&'static str, String)>, AdcError> {
    Ok(match c {
        Credentials::ServiceAccount(sa) => vec![("grant_type", JWT_BEARER.to_string()), ("assertion", assertion(sa, now_unix)?)],
        Credentials::AuthorizedUser(u) => vec![
            ("grant_type", "refresh_token".to_string()),
            ("client_id", u.client_id.clone()),
            ("client_secret", u.client_secret.clone()),
            ("refresh_token", u.refresh_token.clone()),
        ],
    })
}

#[derive(Deserialize)]
struct TokenAnswer {
    access_token: Option<String>,
    expires_in: Option<u64>,
    error: Option<String>,
    error_description: Option<String>,
}

/// Trade the credentials for an access token: (token, seconds it is valid).
pub async fn fetch(http: &reqwest::Client, c: &Credentials) -> Result<(String, u64), AdcError> {
    let url = c.token_uri().to_string();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let form = token_form(c, now)?;
    let body: String =
        form.iter().map(|(k, v)| format!("{k}={}", percent_encoding::utf8_percent_encode(v, percent_encoding::NON_ALPHANUMERIC))).collect::<Vec<_>>().join("&");
    let terr = |message: String| AdcError::Token { url: url.clone(), message };
    let resp = http
        .post(&url)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body)
        .send()
        .await
        .map_err(|e| terr(format!("request failed: {e}")))?;
    let status = resp.status();
    let text = resp.text().await.map_err(|e| terr(format!("reading the answer: {e}")))?;
    let a: TokenAnswer = serde_json::from_str(&text).map_err(|_| terr(format!("HTTP {status}: not a token answer")))?;
    match (status.is_success(), a.access_token) {
        (true, Some(t)) if !t.is_empty() => Ok((t, a.expires_in.unwrap_or(0))),
        _ => Err(terr(format!(
            "HTTP {status}: {}{}",
            a.error.unwrap_or_else(|| "no access_token".into()),
            a.error_description.map(|d| format!(": {d}")).unwrap_or_default()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_found_in_googles_order() {
        let dir = tempfile_dir();
        let gcloud = dir.join(".config/gcloud");
        std::fs::create_dir_all(&gcloud).expect("mkdir");
        // Nothing there: the metadata server.
        assert_eq!(locate(None, None, Some(dir.clone())), None);
        std::fs::write(gcloud.join(WELL_KNOWN_FILE), "{}").expect("write");
        assert_eq!(locate(None, None, Some(dir.clone())), Some(gcloud.join(WELL_KNOWN_FILE)));
        // The variable wins, even naming a file that is not there (the error will say so).
        assert_eq!(locate(Some("/nonexistent/key.json".into()), None, Some(dir.clone())), Some(PathBuf::from("/nonexistent/key.json")));
        assert_eq!(locate(None, Some(dir.join("other")), Some(dir.clone())), None, "CLOUDSDK_CONFIG replaces ~/.config/gcloud");
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempfile_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("keelson-adc-{}-{:?}", std::process::id(), std::thread::current().id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("tmp");
        d
    }

    #[test]
    fn bad_files_are_refused_naming_the_file_and_never_the_secret() {
        let p = Path::new("/home/ops/sa.json");
        let e = parse(p, "not json").expect_err("garbage");
        assert!(e.to_string().starts_with("/home/ops/sa.json: not a Google credentials file"), "{e}");
        let e = parse(p, r#"{"type": "external_account"}"#).expect_err("unsupported");
        assert!(e.to_string().contains("\"external_account\" are not supported"), "{e}");
        let e =
            parse(p, r#"{"type": "service_account", "client_email": "a@b", "private_key": "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"}"#)
                .expect_err("bad key");
        assert!(e.to_string().starts_with("/home/ops/sa.json: private_key:"), "{e}");
        let e = parse(p, r#"{"type": "authorized_user", "client_id": "c", "client_secret": "s3cr3t", "refresh_token": ""}"#).expect_err("no token");
        assert!(e.to_string().contains("refresh_token is missing"), "{e}");
        let u = parse(p, r#"{"type": "authorized_user", "client_id": "c", "client_secret": "s3cr3t", "refresh_token": "r3fr3sh"}"#).expect("user");
        let shown = format!("{u:?}");
        assert!(!shown.contains("s3cr3t") && !shown.contains("r3fr3sh"), "{shown}");
        assert_eq!(u.token_uri(), DEFAULT_TOKEN_URI);
    }

    /// The refresh token (or a key's signed assertion) never goes over plain HTTP off loopback.
    #[test]
    fn a_plain_http_token_uri_off_loopback_is_refused() {
        let p = Path::new("/home/ops/user.json");
        let user = |uri: &str| format!(r#"{{"type": "authorized_user", "client_id": "c", "client_secret": "s", "refresh_token": "r", "token_uri": "{uri}"}}"#);
        let e = parse(p, &user("http://oauth2.example.com/token")).expect_err("plain http to another host");
        assert!(
            e.to_string().contains("/home/ops/user.json") && e.to_string().contains("token_uri") && e.to_string().contains(crate::plain_http::ALLOW_ENV),
            "{e}"
        );
        assert_eq!(parse(p, &user("http://127.0.0.1:8081/token")).expect("loopback").token_uri(), "http://127.0.0.1:8081/token");
        assert!(parse(p, &user("https://oauth2.example.com/token")).is_ok());
    }
}
