//! What every Google REST emulator of the harness shares ([`crate::gce_compute`],
//! [`crate::cloud_dns`]): Google's JSON error format, bearer-token auth, query strings, list
//! pagination, RFC 3339 timestamps, random ids and fingerprints. Pure functions only.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use serde_json::{json, Value};
use sha2::Digest as _;

use crate::httpd::{Request, Response};

/// An error as Google's JSON APIs answer it:
/// `{"error":{"code":404,"message":…,"errors":[{"message":…,"domain":"global","reason":"notFound"}]}}`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { code, reason, message: message.into() }
    }
    /// 404 `notFound`: "The resource '<what>' was not found".
    pub fn not_found(what: &str) -> ApiError {
        ApiError::new(404, "notFound", format!("The resource '{what}' was not found"))
    }
    /// 409 `alreadyExists`: "The resource '<what>' already exists".
    pub fn already_exists(what: &str) -> ApiError {
        ApiError::new(409, "alreadyExists", format!("The resource '{what}' already exists"))
    }
    /// 400 `invalid`.
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "invalid", message)
    }
    /// 400 `required`: a field the method needs is missing.
    pub fn required(field: &str) -> ApiError {
        ApiError::new(400, "required", format!("Required field '{field}' not specified"))
    }
    /// 412 `conditionNotMet` (a stale fingerprint, a precondition).
    pub fn condition_not_met(message: impl Into<String>) -> ApiError {
        ApiError::new(412, "conditionNotMet", message)
    }

    /// The canonical status name Google puts beside the code.
    fn status(&self) -> &'static str {
        match self.code {
            400 => "INVALID_ARGUMENT",
            401 => "UNAUTHENTICATED",
            403 => "PERMISSION_DENIED",
            404 => "NOT_FOUND",
            405 => "METHOD_NOT_ALLOWED",
            409 => "ALREADY_EXISTS",
            412 => "FAILED_PRECONDITION",
            _ => "UNKNOWN",
        }
    }

    pub fn to_json(&self) -> Value {
        json!({"error": {
            "code": self.code,
            "message": self.message,
            "errors": [{"message": self.message, "domain": "global", "reason": self.reason}],
            "status": self.status(),
        }})
    }

    pub fn response(&self) -> Response {
        json_response(self.code, &self.to_json())
    }
}

/// `application/json` with `status`.
pub fn json_response(status: u16, body: &Value) -> Response {
    Response {
        status,
        headers: vec![("Content-Type".into(), "application/json; charset=UTF-8".into())],
        body: crate::httpd::Body::Bytes(body.to_string().into_bytes()),
    }
}

/// A request as an authenticated client sends it (tests of the emulators): a bearer token and the
/// JSON body, if any.
pub fn bearer_request(method: &str, path: &str, body: &Value) -> Request {
    Request {
        method: method.into(),
        path: path.into(),
        query: String::new(),
        headers: vec![("authorization".into(), "Bearer t".into())],
        peer: "127.0.0.1:1".into(),
        body: if body.is_null() { vec![] } else { body.to_string().into_bytes() },
    }
}

/// Any non-empty `Authorization: Bearer <token>` passes (the emulator checks that a client
/// authenticates, not who it is); anything else is 401 as Google answers it.
pub fn require_bearer(req: &Request) -> Result<(), ApiError> {
    let token = req.header("authorization").and_then(|v| v.strip_prefix("Bearer ")).map(str::trim).unwrap_or("");
    if token.is_empty() {
        return Err(ApiError::new(
            401,
            "required",
            "Request is missing required authentication credential. Expected OAuth 2 access token, login cookie or other valid authentication credential.",
        ));
    }
    Ok(())
}

/// The query string, percent- and `+`-decoded (a repeated key keeps its last value).
pub fn query(q: &str) -> BTreeMap<String, String> {
    let dec = |s: &str| percent_encoding::percent_decode_str(&s.replace('+', " ")).decode_utf8_lossy().into_owned();
    q.split('&').filter(|kv| !kv.is_empty()).map(|kv| kv.split_once('=').unwrap_or((kv, ""))).map(|(k, v)| (dec(k), dec(v))).collect()
}

/// The request body as a JSON object (`{}` when empty); 400 `parseError` otherwise.
pub fn body_object(req: &Request) -> Result<serde_json::Map<String, Value>, ApiError> {
    if req.body.iter().all(u8::is_ascii_whitespace) {
        return Ok(serde_json::Map::new());
    }
    match serde_json::from_slice::<Value>(&req.body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::new(400, "parseError", "This API does not support parsing form-encoded input.")),
        Err(e) => Err(ApiError::new(400, "parseError", format!("Parse Error: {e}"))),
    }
}

/// One page of `items` after `pageToken`, at most `maxResults` (`default_max` when unset) long,
/// and the token of the next page if any. Tokens are opaque to clients; a token that is not one
/// of ours is 400 `invalid`.
pub fn paginate<T>(items: Vec<T>, q: &BTreeMap<String, String>, default_max: usize) -> Result<(Vec<T>, Option<String>), ApiError> {
    let max = match q.get("maxResults").filter(|v| !v.is_empty()) {
        None => default_max,
        Some(v) => match v.parse::<usize>() {
            Ok(n) if n > 0 => n.min(default_max),
            _ => return Err(ApiError::invalid(format!("Invalid value for field 'maxResults': '{v}'. Must be a positive integer."))),
        },
    };
    let start = match q.get("pageToken").filter(|v| !v.is_empty()) {
        None => 0,
        Some(t) => decode_page_token(t).ok_or_else(|| ApiError::invalid(format!("Invalid value for field 'pageToken': '{t}'.")))?,
    };
    let total = items.len();
    let page: Vec<T> = items.into_iter().skip(start).take(max).collect();
    let next = (start + page.len() < total).then(|| encode_page_token(start + page.len()));
    Ok((page, next))
}

fn encode_page_token(offset: usize) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("keelson-page:{offset}"))
}

fn decode_page_token(t: &str) -> Option<usize> {
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(t).ok()?;
    String::from_utf8(raw).ok()?.strip_prefix("keelson-page:")?.parse().ok()
}

/// A fingerprint of `v` as Google gives them: 8 bytes, base64 (changes whenever `v` does).
pub fn fingerprint(v: &Value) -> String {
    let digest = sha2::Sha256::digest(v.to_string().as_bytes());
    base64::engine::general_purpose::STANDARD.encode(&digest[..8])
}

/// A random non-zero id (numeric ids are uint64, sent as decimal strings).
pub fn random_id() -> u64 {
    let mut b = [0u8; 8];
    fill_random(&mut b);
    (u64::from_be_bytes(b) >> 1).max(1)
}

/// `n` random characters of `[a-z0-9]` (the suffix a MIG gives its instances).
pub fn random_suffix(n: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut b = vec![0u8; n];
    fill_random(&mut b);
    b.iter().map(|x| ALPHABET[usize::from(*x) % ALPHABET.len()] as char).collect()
}

fn fill_random(b: &mut [u8]) {
    use ring::rand::SecureRandom as _;
    if ring::rand::SystemRandom::new().fill(b).is_err() {
        // The system RNG is gone: fall back to the clock (ids only need to differ).
        let t = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        for (i, x) in b.iter_mut().enumerate() {
            *x = (t >> ((i % 16) * 8)) as u8;
        }
    }
}

/// Now as RFC 3339 with milliseconds and Google's `-07:00`-style offset (UTC: `+00:00`).
pub fn now_rfc3339() -> String {
    rfc3339(SystemTime::now())
}

/// `t` as `YYYY-MM-DDTHH:MM:SS.mmm+00:00`.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, day) = civil_from_days(days as i64);
    format!("{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}+00:00", rem / 3600, rem % 3600 / 60, rem % 60, d.subsec_millis())
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_follow_each_other_and_foreign_tokens_are_refused() {
        let items: Vec<u32> = (0..7).collect();
        let q = |max: &str, tok: Option<&str>| {
            let mut m = BTreeMap::from([("maxResults".to_string(), max.to_string())]);
            if let Some(t) = tok {
                m.insert("pageToken".into(), t.into());
            }
            m
        };
        let (p1, t1) = paginate(items.clone(), &q("3", None), 500).unwrap();
        assert_eq!(p1, vec![0, 1, 2]);
        let (p2, t2) = paginate(items.clone(), &q("3", t1.as_deref()), 500).unwrap();
        assert_eq!(p2, vec![3, 4, 5]);
        let (p3, t3) = paginate(items.clone(), &q("3", t2.as_deref()), 500).unwrap();
        assert_eq!((p3, t3), (vec![6], None));
        assert_eq!(paginate(items.clone(), &q("3", Some("bogus")), 500).unwrap_err().code, 400);
        assert_eq!(paginate(items, &q("0", None), 500).unwrap_err().code, 400);
    }

    #[test]
    fn timestamps_are_rfc3339() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000+00:00");
        assert_eq!(rfc3339(UNIX_EPOCH + std::time::Duration::from_millis(951_782_400_123)), "2000-02-29T00:00:00.123+00:00");
    }

    #[test]
    fn errors_have_googles_shape() {
        let e = ApiError::not_found("projects/p/zones/z/disks/d").to_json();
        assert_eq!(e["error"]["code"], 404);
        assert_eq!(e["error"]["errors"][0]["reason"], "notFound");
        assert_eq!(e["error"]["message"], "The resource 'projects/p/zones/z/disks/d' was not found");
    }

    #[test]
    fn queries_are_decoded() {
        let q = query("filter=labels.a%3Db+AND+labels.c%3A*&maxResults=2");
        assert_eq!(q["filter"], "labels.a=b AND labels.c:*");
        assert_eq!(q["maxResults"], "2");
    }
}
