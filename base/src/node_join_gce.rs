//! Node join by GCE identity: the token half. A GCE instance asks its metadata server for an identity
//! token (`instance/service-accounts/default/identity?audience=…&format=full`): a JWT signed RS256
//! by Google, naming the instance's project, zone, numeric id and name. The node asks for the
//! audience [`audience`] of its join request's body, so a token seen once cannot carry another
//! request. The join server checks it with [`verify`] — signature against Google's keys (a JWK set,
//! configurable for tests), issuer, audience, freshness — and then asks Compute about the instance.

use base64::Engine as _;
use sha2::Digest as _;

/// Issuers Google signs instance identity tokens as.
pub const ISSUERS: [&str; 2] = ["https://accounts.google.com", "accounts.google.com"];
/// The audience prefix of a join request's token; the rest is the body's sha256.
pub const AUDIENCE_PREFIX: &str = "keelson-node-join:";
/// Clock skew allowed on `iat`/`exp`.
pub const SKEW_SECS: u64 = 60;
/// `Authorization: <scheme> <token>` of a join by GCE identity (next to the AWS one,
/// [`crate::node_join::AUTH_SCHEME`]).
pub const AUTH_SCHEME: &str = "x-gce-identity";
/// The metadata path a node asks its identity token from (under `/computeMetadata/v1/`).
pub const IDENTITY_PATH: &str = "instance/service-accounts/default/identity";
/// Where Google publishes the keys it signs identity tokens with (a JWK set).
pub const GOOGLE_JWKS_URL: &str = "https://www.googleapis.com/oauth2/v3/certs";
/// The variable that names another key set than Google's (the join server's `--gce-jwks-url`).
pub const JWKS_URL_ENV: &str = "KEELSON_GCE_JWKS_URL";
/// How old a token the join server accepts (the node asks for a fresh one per request).
pub const MAX_AGE_SECS: u64 = 300;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdentityError {
    #[error("identity token: {0}")]
    Malformed(String),
    #[error("identity token: algorithm {0:?} (only RS256 is accepted)")]
    Algorithm(String),
    #[error("identity token: key {0:?} is not one of Google's")]
    UnknownKey(String),
    #[error("identity token: the signature does not verify")]
    Signature,
    #[error("identity token: issuer {0:?} is not Google")]
    Issuer(String),
    #[error("identity token: audience {got:?} is not this request's ({want:?})")]
    Audience { got: String, want: String },
    #[error("identity token: {0}")]
    Time(String),
    #[error("identity token: no compute_engine claims (ask with format=full)")]
    NotAnInstance,
}

/// One of Google's signing keys (a JWK, RSA): `n` and `e` base64url without padding.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub struct Jwk {
    pub kid: String,
    pub n: String,
    pub e: String,
}

/// A JWK set (`{"keys": […]}`), as Google publishes it at `https://www.googleapis.com/oauth2/v3/certs`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub struct JwkSet {
    pub keys: Vec<Jwk>,
}

/// What a verified token says about the instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceIdentity {
    pub project_id: String,
    pub project_number: String,
    pub zone: String,
    /// The numeric id: a recreated instance keeps its name, never its id.
    pub instance_id: String,
    pub instance_name: String,
    pub issued_at: u64,
}

#[derive(serde::Deserialize)]
struct Header {
    alg: String,
    #[serde(default)]
    kid: String,
}

#[derive(serde::Deserialize)]
struct Claims {
    iss: String,
    aud: String,
    iat: u64,
    exp: u64,
    #[serde(default)]
    google: Option<Google>,
}

#[derive(serde::Deserialize)]
struct Google {
    compute_engine: Option<ComputeEngine>,
}

#[derive(serde::Deserialize)]
struct ComputeEngine {
    project_id: String,
    #[serde(default, deserialize_with = "number_or_string")]
    project_number: String,
    zone: String,
    instance_id: String,
    instance_name: String,
}

fn number_or_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let v = <serde_json::Value as serde::Deserialize>::deserialize(d)?;
    Ok(match v {
        serde_json::Value::String(s) => s,
        other => other.to_string(),
    })
}

/// The audience a join request's token must carry: bound to the request body.
pub fn audience(body: &[u8]) -> String {
    format!("{AUDIENCE_PREFIX}{}", hex::encode(sha2::Sha256::digest(body)))
}

/// The metadata request (relative to `/computeMetadata/v1/`) for the token of a join request whose
/// body is `body`: `format=full`, so the token names the instance.
pub fn identity_request(body: &[u8]) -> String {
    format!("{IDENTITY_PATH}?audience={}&format=full", audience(body).replace(':', "%3A"))
}

/// The `Authorization` header value carrying `token`.
pub fn authorization(token: &str) -> String {
    format!("{AUTH_SCHEME} {}", token.trim())
}

/// The token of an `Authorization` header value of scheme [`AUTH_SCHEME`]; `None` for another scheme.
pub fn parse_authorization(value: &str) -> Option<&str> {
    value.strip_prefix(AUTH_SCHEME).and_then(|t| t.strip_prefix(' ')).map(str::trim).filter(|t| !t.is_empty())
}

fn b64(part: &str, what: &str) -> Result<Vec<u8>, IdentityError> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(part.trim_end_matches('=')).map_err(|e| IdentityError::Malformed(format!("{what}: {e}")))
}

/// Verify `token` for a request whose body is `body`, at `now` (unix seconds), accepting tokens at
/// most `max_age` seconds old.
pub fn verify(token: &str, keys: &JwkSet, body: &[u8], now: u64, max_age: u64) -> Result<InstanceIdentity, IdentityError> {
    let mut parts = token.trim().split('.');
    let (Some(h), Some(p), Some(s), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err(IdentityError::Malformed("not a JWT (three dot-separated parts)".into()));
    };
    let header: Header = serde_json::from_slice(&b64(h, "header")?).map_err(|e| IdentityError::Malformed(format!("header: {e}")))?;
    if header.alg != "RS256" {
        return Err(IdentityError::Algorithm(header.alg));
    }
    let key = keys.keys.iter().find(|k| k.kid == header.kid).ok_or_else(|| IdentityError::UnknownKey(header.kid.clone()))?;
    let public = ring::signature::RsaPublicKeyComponents { n: b64(&key.n, "key n")?, e: b64(&key.e, "key e")? };
    public.verify(&ring::signature::RSA_PKCS1_2048_8192_SHA256, format!("{h}.{p}").as_bytes(), &b64(s, "signature")?).map_err(|_| IdentityError::Signature)?;
    // Only a token whose signature verifies is read any further.
    let claims: Claims = serde_json::from_slice(&b64(p, "payload")?).map_err(|e| IdentityError::Malformed(format!("payload: {e}")))?;
    if !ISSUERS.contains(&claims.iss.as_str()) {
        return Err(IdentityError::Issuer(claims.iss));
    }
    let want = audience(body);
    if claims.aud != want {
        return Err(IdentityError::Audience { got: claims.aud, want });
    }
    // Claims are numbers anyone signing may choose: no arithmetic on them may overflow.
    if claims.exp.saturating_add(SKEW_SECS) <= now {
        return Err(IdentityError::Time(format!("expired at {} (now {now})", claims.exp)));
    }
    if claims.iat > now.saturating_add(SKEW_SECS) {
        return Err(IdentityError::Time(format!("issued in the future ({} > {now})", claims.iat)));
    }
    if now.saturating_sub(claims.iat) > max_age {
        return Err(IdentityError::Time(format!("issued {} s ago; at most {max_age} s old is accepted", now - claims.iat)));
    }
    let ce = claims.google.and_then(|g| g.compute_engine).ok_or(IdentityError::NotAnInstance)?;
    Ok(InstanceIdentity {
        project_id: ce.project_id,
        project_number: ce.project_number,
        zone: ce.zone,
        instance_id: ce.instance_id,
        instance_name: ce.instance_name,
        issued_at: claims.iat,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_carries_the_token_under_its_own_scheme_and_the_request_binds_the_body() {
        assert_eq!(parse_authorization(&authorization("a.b.c")), Some("a.b.c"));
        assert_eq!(parse_authorization("x-aws-sts abc"), None);
        assert_eq!(parse_authorization("x-gce-identity "), None);
        let r = identity_request(b"{}");
        assert!(r.starts_with("instance/service-accounts/default/identity?audience=keelson-node-join%3A"), "{r}");
        assert!(r.ends_with(&format!("{}&format=full", &audience(b"{}")[AUDIENCE_PREFIX.len()..])), "{r}");
    }
}
