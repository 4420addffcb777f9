//! Google's OAuth 2.0 token endpoint (`https://oauth2.googleapis.com/token`) as Application Default
//! Credentials use it, for tests: a `POST` of an `application/x-www-form-urlencoded` body with
//! - `grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer&assertion=<JWT>`: a service account's
//!   RS256 JWT, checked as Google does — the signature against the account's public key, `iss` the
//!   account, `aud` this endpoint, a `scope`, `iat` within five minutes of now and `exp - iat` at most
//!   an hour;
//! - `grant_type=refresh_token` with `client_id`, `client_secret` and `refresh_token` (gcloud's user
//!   login).
//!
//! A good request gets `{"access_token", "expires_in": 3599, "token_type": "Bearer"}`; a bad one 400
//! `invalid_grant` (or `unsupported_grant_type`, `invalid_request`), or 401 `invalid_client`, with an
//! `error_description`, as Google answers. Every token issued is recorded.

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use serde_json::{json, Value};

use crate::httpd::{Request, Response, Server};

/// What the endpoint accepts.
#[derive(Debug, Clone, Default)]
pub struct Accepts {
    /// A service account: its email and its public key (PKCS#1 `RSAPublicKey` DER).
    pub service_account: Option<(String, Vec<u8>)>,
    /// A user login: client id, client secret, refresh token.
    pub user: Option<(String, String, String)>,
}

/// A running token endpoint.
pub struct TokenEndpoint {
    pub server: Server,
    accepts: Arc<Mutex<Accepts>>,
    issued: Arc<Mutex<Vec<String>>>,
}

impl TokenEndpoint {
    /// Serve on 127.0.0.1; the endpoint is [`TokenEndpoint::url`].
    pub fn start(accepts: Accepts) -> TokenEndpoint {
        let issued = Arc::new(Mutex::new(Vec::new()));
        let accepts = Arc::new(Mutex::new(accepts));
        let own_url = Arc::new(Mutex::new(String::new()));
        let (i, a, u) = (issued.clone(), accepts.clone(), own_url.clone());
        let server = Server::start(Arc::new(move |req: &Request| {
            let url = u.lock().map(|s| s.clone()).unwrap_or_default();
            let accepts = a.lock().map(|a| a.clone()).unwrap_or_default();
            answer(&accepts, &url, &i, req)
        }));
        if let Ok(mut u) = own_url.lock() {
            *u = server.url("token");
        }
        TokenEndpoint { server, accepts, issued }
    }

    /// Accept these credentials from now on (a key file names the endpoint, so it is made after).
    pub fn accept(&self, accepts: Accepts) {
        if let Ok(mut a) = self.accepts.lock() {
            *a = accepts;
        }
    }

    /// The token URI (what a credentials file's `token_uri` names).
    pub fn url(&self) -> String {
        self.server.url("token")
    }

    /// The tokens issued so far.
    pub fn issued(&self) -> Vec<String> {
        self.issued.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

fn error(status: u16, code: &str, description: impl Into<String>) -> Response {
    json_response(status, json!({"error": code, "error_description": description.into()}))
}

fn json_response(status: u16, v: Value) -> Response {
    let mut r = Response::bytes(status, v.to_string().into_bytes());
    r.headers = vec![("Content-Type".into(), "application/json; charset=utf-8".into())];
    r
}

/// `a=b&c=d` (`+` a space, `%XX` escapes).
pub fn form(body: &[u8]) -> Vec<(String, String)> {
    let text = String::from_utf8_lossy(body);
    let dec = |s: &str| percent_encoding::percent_decode_str(&s.replace('+', " ")).decode_utf8_lossy().into_owned();
    text.split('&').filter(|p| !p.is_empty()).map(|p| p.split_once('=').map(|(k, v)| (dec(k), dec(v))).unwrap_or_else(|| (dec(p), String::new()))).collect()
}

fn answer(accepts: &Accepts, own_url: &str, issued: &Mutex<Vec<String>>, req: &Request) -> Response {
    if req.method != "POST" || req.path != "/token" {
        return error(404, "not_found", format!("{} {}", req.method, req.path));
    }
    if !req.header("content-type").is_some_and(|c| c.starts_with("application/x-www-form-urlencoded")) {
        return error(400, "invalid_request", "the body must be application/x-www-form-urlencoded");
    }
    let f = form(&req.body);
    let get = |k: &str| f.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let verdict = match get("grant_type") {
        Some("urn:ietf:params:oauth:grant-type:jwt-bearer") => match (&accepts.service_account, get("assertion")) {
            (Some((email, key)), Some(jwt)) => check_assertion(jwt, email, key, own_url).map_err(|d| error(400, "invalid_grant", d)),
            (None, _) => Err(error(400, "invalid_grant", "no service account here")),
            (_, None) => Err(error(400, "invalid_request", "assertion is missing")),
        },
        Some("refresh_token") => match &accepts.user {
            Some((id, secret, token)) => {
                if get("client_id") != Some(id) || get("client_secret") != Some(secret) {
                    Err(error(401, "invalid_client", "The OAuth client was not found."))
                } else if get("refresh_token") != Some(token) {
                    Err(error(400, "invalid_grant", "Token has been expired or revoked."))
                } else {
                    Ok(())
                }
            }
            None => Err(error(401, "invalid_client", "The OAuth client was not found.")),
        },
        Some(other) => Err(error(400, "unsupported_grant_type", format!("Invalid grant_type: {other}"))),
        None => Err(error(400, "invalid_request", "grant_type is missing")),
    };
    if let Err(r) = verdict {
        return r;
    }
    let mut issued = match issued.lock() {
        Ok(i) => i,
        Err(_) => return error(500, "internal", "lock"),
    };
    let token = format!("ya29.local-{}", issued.len() + 1);
    issued.push(token.clone());
    json_response(200, json!({"access_token": token, "expires_in": 3599, "token_type": "Bearer"}))
}

fn b64(s: &str) -> Result<Vec<u8>, String> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(s).map_err(|e| format!("not base64url: {e}"))
}

/// Google's checks of a service-account assertion.
pub fn check_assertion(jwt: &str, email: &str, public_key_der: &[u8], own_url: &str) -> Result<(), String> {
    let parts: Vec<&str> = jwt.split('.').collect();
    let [h, c, s] = parts[..] else { return Err("Invalid JWT: not three parts".into()) };
    let header: Value = serde_json::from_slice(&b64(h)?).map_err(|e| format!("Invalid JWT header: {e}"))?;
    if header["alg"] != "RS256" {
        return Err(format!("Invalid JWT: alg {} (RS256 expected)", header["alg"]));
    }
    let key = ring::signature::UnparsedPublicKey::new(&ring::signature::RSA_PKCS1_2048_8192_SHA256, public_key_der);
    key.verify(format!("{h}.{c}").as_bytes(), &b64(s)?).map_err(|_| "Invalid JWT Signature.".to_string())?;
    let claims: Value = serde_json::from_slice(&b64(c)?).map_err(|e| format!("Invalid JWT claims: {e}"))?;
    if claims["iss"] != email {
        return Err(format!("Invalid JWT: iss {}", claims["iss"]));
    }
    if claims["aud"] != own_url {
        return Err(format!("Invalid JWT: Failed audience check ({} is not {own_url})", claims["aud"]));
    }
    if claims["scope"].as_str().is_none_or(|s| s.trim().is_empty()) {
        return Err("Invalid JWT: no scope".into());
    }
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    let (iat, exp) = (claims["iat"].as_i64().unwrap_or(0), claims["exp"].as_i64().unwrap_or(0));
    if (iat - now).abs() > 300 {
        return Err("Invalid JWT: Token must be a short-lived token (iat not within 5 minutes of now)".into());
    }
    if exp <= iat || exp - iat > 3600 {
        return Err("Invalid JWT: Token must be a short-lived token (60 minutes)".into());
    }
    Ok(())
}

/// A service-account key file as Google issues it (`type`, `project_id`, `private_key_id`,
/// `private_key` — a fresh 2048-bit RSA key from `openssl genpkey`, PKCS#8 PEM —, `client_email`,
/// `token_uri`), mode 0600, at `dir/<name>`.
pub fn service_account_file(dir: &std::path::Path, name: &str, email: &str, token_uri: &str) -> std::io::Result<std::path::PathBuf> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let out = std::process::Command::new("openssl")
        .args(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"])
        .output()
        .map_err(|e| std::io::Error::other(format!("openssl (needed to make a test RSA key): {e}")))?;
    if !out.status.success() {
        return Err(std::io::Error::other(format!("openssl genpkey: {}", String::from_utf8_lossy(&out.stderr))));
    }
    let file = json!({
        "type": "service_account",
        "project_id": "acme-prod",
        "private_key_id": "0123456789abcdef",
        "private_key": String::from_utf8_lossy(&out.stdout),
        "client_email": email,
        "client_id": "100000000000000000001",
        "token_uri": token_uri,
    });
    let path = dir.join(name);
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&path)?;
    std::io::Write::write_all(&mut f, file.to_string().as_bytes())?;
    Ok(path)
}

/// gcloud's `application_default_credentials.json` after `gcloud auth application-default login`.
pub fn user_file(dir: &std::path::Path, client_id: &str, client_secret: &str, refresh_token: &str, token_uri: &str) -> std::io::Result<std::path::PathBuf> {
    let path = dir.join("application_default_credentials.json");
    let file =
        json!({"type": "authorized_user", "client_id": client_id, "client_secret": client_secret, "refresh_token": refresh_token, "token_uri": token_uri});
    std::fs::write(&path, file.to_string())?;
    Ok(path)
}
