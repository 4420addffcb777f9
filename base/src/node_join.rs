//! Node join by cloud identity: how a worker proves which instance it is, with nothing but what its
//! cloud already vouches for, and receives its kubelet and kube-proxy client certificates.
//!
//! The protocol (kOps' kops-controller bootstrap idea, our own wire format):
//! 1. The node makes one CSR per certificate it needs (`kubelet`, `kube-proxy`); its keys never leave it.
//! 2. It signs — but does not send — an `sts:GetCallerIdentity` request with its instance-role
//!    credentials. The request carries [`BODY_HASH_HEADER`], the sha256 of the join request's body, and
//!    that header is part of the signature: the signed request is good for this one body only.
//! 3. It POSTs the [`JoinRequest`] to the join server with `Authorization: x-aws-sts <base64 JSON of the
//!    signed request>`.
//! 4. The server checks the signed request (method, URL = its own STS endpoint, body, signed headers,
//!    body hash, age), forwards it to STS, and reads back who signed: `assumed-role/<role>/<instance-id>`.
//!    It then checks the role, that the instance runs, and that it belongs to one of the cluster's node
//!    groups, and signs the CSRs for that instance's node name only ([`JoinResponse`]).
//!
//! 5. Before it signs anything, the server calls the node back on the instance's private IP, port
//!    [`CHALLENGE_PORT`], over TLS 1.3: the node must present a certificate for the very key of its
//!    kubelet CSR (so it proves, live, that it holds that key) and echo the server's fresh nonce with
//!    the sha256 of the join request body ([`challenge_line`], [`answer_challenge`],
//!    [`check_challenge_answer`]). Instance-role credentials lifted from IMDS and replayed from another
//!    host fail here: the attacker does not answer on the instance's address.
//!
//! This module holds the types, the signing (client side) and the checks that need no cloud call
//! (server side). The server is protokube's `node_join`, the client nodeup's join task.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use serde::{Deserialize, Serialize};

/// Where the join server listens on every control plane.
pub const PORT: u16 = keelson_api::nodeup::NODE_JOIN_PORT;
/// The join endpoint's path.
pub const PATH: &str = "/bootstrap";
/// `Authorization: <scheme> <token>`.
pub const AUTH_SCHEME: &str = "x-aws-sts";
/// Signed into the STS request: sha256 (hex) of the join request body.
pub const BODY_HASH_HEADER: &str = "x-keelson-request-sha256";
/// The only STS request the server forwards.
pub const STS_BODY: &str = "Action=GetCallerIdentity&Version=2011-06-15";
/// How old a signed request may be (STS itself allows 15 minutes of skew).
pub const MAX_AGE: Duration = Duration::from_secs(15 * 60);
/// Where a joining node answers the server's challenge while it joins (kOps' nodeup challenge port).
pub const CHALLENGE_PORT: u16 = keelson_api::ports::NODEUP_CHALLENGE;
/// The first word of the server's challenge line.
pub const CHALLENGE_GREETING: &str = "KEELSON-JOIN-CHALLENGE";
/// Longest line either side of the challenge reads.
pub const CHALLENGE_MAX_LINE: usize = 256;
/// The certificates a node asks for.
pub const CERT_KUBELET: &str = "kubelet";
pub const CERT_KUBE_PROXY: &str = "kube-proxy";

/// What the node sends (the body; its sha256 is signed into the STS request).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JoinRequest {
    /// The node name the node will register as (its private DNS name).
    pub node_name: String,
    /// The instance the node believes it is (from its IMDS).
    pub instance_id: String,
    /// Certificate name (`kubelet`, `kube-proxy`) → PEM CSR.
    pub csrs: BTreeMap<String, String>,
}

/// What the server answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JoinResponse {
    /// The node name the certificates are issued for.
    pub node_name: String,
    /// Certificate name → PEM certificate.
    pub certs: BTreeMap<String, String>,
}

/// A signed HTTP request, carried to the server in the `Authorization` header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedRequest {
    pub method: String,
    pub url: String,
    /// In order, names lower-case.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

/// Why a join was refused or could not be made.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error("Authorization header: {0}")]
    Authorization(String),
    #[error("signed STS request: {0}")]
    Signed(String),
    #[error("signing the STS request: {0}")]
    Sign(String),
    #[error("STS answer: {0}")]
    Sts(String),
    #[error("join challenge: {0}")]
    Challenge(String),
    #[error("join request: {0}")]
    Request(String),
}

/// The STS endpoint both sides use: `AWS_ENDPOINT_URL_STS`, then `AWS_ENDPOINT_URL` (the variables the
/// AWS SDKs read), then the regional endpoint. Always ends in `/`.
pub fn sts_endpoint(region: &str) -> String {
    sts_endpoint_with(region, |k| std::env::var(k).ok())
}

fn sts_endpoint_with(region: &str, env: impl Fn(&str) -> Option<String>) -> String {
    let over = |k: &str| env(k).filter(|v| !v.trim().is_empty());
    let url = over("AWS_ENDPOINT_URL_STS").or_else(|| over("AWS_ENDPOINT_URL")).unwrap_or_else(|| {
        let suffix = if region.starts_with("cn-") { "amazonaws.com.cn" } else { "amazonaws.com" };
        format!("https://sts.{region}.{suffix}")
    });
    if url.ends_with('/') {
        url
    } else {
        format!("{url}/")
    }
}

/// Sign `GetCallerIdentity` for `body` (the join request's bytes) with `credentials`.
pub fn sign(credentials: &Credentials, region: &str, sts_url: &str, body: &[u8], now: SystemTime) -> Result<SignedRequest, JoinError> {
    use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
    let host = url_host(sts_url).ok_or_else(|| JoinError::Sign(format!("{sts_url}: no host")))?;
    let mut headers = vec![
        ("host".to_string(), host),
        ("content-type".to_string(), "application/x-www-form-urlencoded; charset=utf-8".to_string()),
        (BODY_HASH_HEADER.to_string(), crate::sha256_hex(body)),
    ];
    let identity = credentials.clone().into();
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name("sts")
        .time(now)
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| JoinError::Sign(e.to_string()))?
        .into();
    let signable = SignableRequest::new("POST", sts_url, headers.iter().map(|(k, v)| (k.as_str(), v.as_str())), SignableBody::Bytes(STS_BODY.as_bytes()))
        .map_err(|e| JoinError::Sign(e.to_string()))?;
    let (instructions, _) = sign(signable, &params).map_err(|e| JoinError::Sign(e.to_string()))?.into_parts();
    for (name, value) in instructions.headers() {
        headers.push((name.to_ascii_lowercase(), value.to_string()));
    }
    Ok(SignedRequest { method: "POST".into(), url: sts_url.to_string(), headers, body: STS_BODY.into() })
}

/// `Authorization` header value for a signed request.
pub fn authorization(signed: &SignedRequest) -> Result<String, JoinError> {
    use base64::Engine as _;
    let json = serde_json::to_vec(signed).map_err(|e| JoinError::Signed(e.to_string()))?;
    Ok(format!("{AUTH_SCHEME} {}", base64::engine::general_purpose::STANDARD.encode(json)))
}

/// Decode an `Authorization` header value.
pub fn parse_authorization(value: &str) -> Result<SignedRequest, JoinError> {
    use base64::Engine as _;
    let token =
        value.strip_prefix(AUTH_SCHEME).and_then(|t| t.strip_prefix(' ')).ok_or_else(|| JoinError::Authorization(format!("expected scheme {AUTH_SCHEME}")))?;
    let json = base64::engine::general_purpose::STANDARD.decode(token.trim()).map_err(|e| JoinError::Authorization(format!("not base64: {e}")))?;
    serde_json::from_slice(&json).map_err(|e| JoinError::Authorization(format!("not a signed request: {e}")))
}

/// Server side, before any cloud call: the join request in `body` — only kubelet and kube-proxy
/// CSRs, the kubelet's required — with the kubelet key (DER SPKI) the node must answer the join
/// challenge with. Every refusal names the field.
pub fn parse_join_request(body: &[u8]) -> Result<(JoinRequest, Vec<u8>), JoinError> {
    let request: JoinRequest = serde_json::from_slice(body).map_err(|e| JoinError::Request(format!("the body is not a join request: {e}")))?;
    if let Some(name) = request.csrs.keys().find(|n| *n != CERT_KUBELET && *n != CERT_KUBE_PROXY) {
        return Err(JoinError::Request(format!("csrs.{name}: only {CERT_KUBELET} and {CERT_KUBE_PROXY} are issued")));
    }
    let kubelet_csr = request
        .csrs
        .get(CERT_KUBELET)
        .ok_or_else(|| JoinError::Request(format!("csrs.{CERT_KUBELET}: required (the join challenge is answered with its key)")))?;
    let kubelet_key = crate::pki::csr_public_key(kubelet_csr).map_err(|e| JoinError::Request(format!("csrs.{CERT_KUBELET}: {e}")))?;
    Ok((request, kubelet_key))
}

impl SignedRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// Server side, before any cloud call: the signed request must be exactly a `GetCallerIdentity` to
/// `sts_url`, signed over [`BODY_HASH_HEADER`] = sha256(`body`), and not older than [`MAX_AGE`].
pub fn check_signed(signed: &SignedRequest, sts_url: &str, body: &[u8], now: SystemTime) -> Result<(), JoinError> {
    let bad = |m: String| Err(JoinError::Signed(m));
    if signed.method != "POST" {
        return bad(format!("method {} (expected POST)", signed.method));
    }
    if signed.url != sts_url {
        return bad(format!("URL {} is not this cluster's STS endpoint {sts_url}", signed.url));
    }
    if signed.body != STS_BODY {
        return bad("body is not GetCallerIdentity".into());
    }
    let auth = signed.header("authorization").ok_or_else(|| JoinError::Signed("not signed (no authorization header)".into()))?;
    let signed_headers = auth
        .split(',')
        .find_map(|p| p.trim().strip_prefix("SignedHeaders="))
        .ok_or_else(|| JoinError::Signed("authorization names no SignedHeaders".into()))?;
    for required in ["host", BODY_HASH_HEADER] {
        if !signed_headers.split(';').any(|h| h == required) {
            return bad(format!("header {required} is not signed"));
        }
    }
    if signed.header("host") != url_host(sts_url).as_deref() {
        return bad(format!("host {:?} does not match {sts_url}", signed.header("host")));
    }
    let want = crate::sha256_hex(body);
    if signed.header(BODY_HASH_HEADER) != Some(want.as_str()) {
        return bad(format!("{BODY_HASH_HEADER} does not match the request body (sha256 {want})"));
    }
    let date = signed.header("x-amz-date").ok_or_else(|| JoinError::Signed("no x-amz-date".into()))?;
    let signed_at = parse_amz_date(date).ok_or_else(|| JoinError::Signed(format!("x-amz-date {date:?} is not YYYYMMDDTHHMMSSZ")))?;
    let age = now.duration_since(signed_at).unwrap_or_else(|e| e.duration());
    if age > MAX_AGE {
        return bad(format!("signed at {date}, more than {} s from now", MAX_AGE.as_secs()));
    }
    Ok(())
}

/// Who STS says signed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallerIdentity {
    pub arn: String,
    pub account: String,
}

/// An `assumed-role` identity: how an instance role's session looks to STS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssumedRole {
    /// `aws`, `aws-cn`, `aws-us-gov`.
    pub partition: String,
    pub account: String,
    pub role: String,
    /// For an EC2 instance role, the instance id.
    pub session: String,
}

impl CallerIdentity {
    /// The partition of the ARN (`arn:<partition>:…`), if it is an ARN.
    pub fn partition(&self) -> Option<&str> {
        let mut parts = self.arn.splitn(3, ':');
        (parts.next()? == "arn").then(|| parts.next()).flatten().filter(|p| !p.is_empty())
    }

    /// `arn:<partition>:sts::<account>:assumed-role/<role>/<session>`, or `None` for other identities.
    pub fn assumed_role(&self) -> Option<AssumedRole> {
        let mut parts = self.arn.splitn(6, ':');
        let (arn, partition, service, _region, account, resource) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if arn != "arn" || service != "sts" || account != self.account {
            return None;
        }
        let mut r = resource.splitn(3, '/');
        if r.next()? != "assumed-role" {
            return None;
        }
        let (role, session) = (r.next()?, r.next()?);
        (!role.is_empty() && !session.is_empty()).then(|| AssumedRole {
            partition: partition.into(),
            account: account.into(),
            role: role.into(),
            session: session.into(),
        })
    }
}

/// Parse STS's `GetCallerIdentityResponse` XML.
pub fn parse_caller_identity(xml: &str) -> Result<CallerIdentity, JoinError> {
    #[derive(Deserialize)]
    struct Response {
        #[serde(rename = "GetCallerIdentityResult")]
        result: Result_,
    }
    #[derive(Deserialize)]
    struct Result_ {
        #[serde(rename = "Arn")]
        arn: String,
        #[serde(rename = "Account")]
        account: String,
    }
    let r: Response = quick_xml::de::from_str(xml).map_err(|e| JoinError::Sts(format!("not a GetCallerIdentityResponse: {e}")))?;
    Ok(CallerIdentity { arn: r.result.arn, account: r.result.account })
}

/// The server's challenge: `KEELSON-JOIN-CHALLENGE <nonce>\n` (nonce: 64 hex digits, fresh per join).
pub fn challenge_line(nonce_hex: &str) -> String {
    format!("{CHALLENGE_GREETING} {nonce_hex}\n")
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

/// The node's answer to a challenge `line` while its join request with body sha256 `body_sha256`
/// is pending: `<nonce> <body sha256>\n`.
pub fn answer_challenge(line: &str, body_sha256: &str) -> Result<String, JoinError> {
    let nonce = line
        .trim_end_matches(['\r', '\n'])
        .strip_prefix(CHALLENGE_GREETING)
        .and_then(|r| r.strip_prefix(' '))
        .filter(|n| is_hex64(n))
        .ok_or_else(|| JoinError::Challenge(format!("not a challenge line (expected `{CHALLENGE_GREETING} <64 hex digits>`)")))?;
    Ok(format!("{nonce} {body_sha256}\n"))
}

/// Server side: the node's `answer` must echo `nonce` and name the body it signed.
pub fn check_challenge_answer(answer: &str, nonce_hex: &str, body_sha256: &str) -> Result<(), JoinError> {
    let answer = answer.trim_end_matches(['\r', '\n']);
    let (echo, body) = answer.split_once(' ').ok_or_else(|| JoinError::Challenge("the answer is not `<nonce> <body sha256>`".into()))?;
    if echo != nonce_hex {
        return Err(JoinError::Challenge("the answer does not echo this challenge's nonce".into()));
    }
    if body != body_sha256 {
        return Err(JoinError::Challenge("the node answering on the instance's address is not waiting for this join request".into()));
    }
    Ok(())
}

fn url_host(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let host = rest.split(['/', '?']).next()?;
    (!host.is_empty()).then(|| host.to_string())
}

fn parse_amz_date(s: &str) -> Option<SystemTime> {
    let fmt = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    let t = time::PrimitiveDateTime::parse(s, &fmt).ok()?.assume_utc();
    let secs = u64::try_from(t.unix_timestamp()).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds() -> Credentials {
        Credentials::new("AKIDEXAMPLE", "secret", Some("token".into()), None, "test")
    }

    #[test]
    fn a_signed_request_checks_only_for_its_own_body_url_and_time() {
        let url = "https://sts.eu-west-1.amazonaws.com/";
        let body = br#"{"nodeName":"a"}"#;
        let now = SystemTime::now();
        let s = sign(&creds(), "eu-west-1", url, body, now).expect("sign");
        assert!(s.header("authorization").is_some_and(|a| a.contains(BODY_HASH_HEADER)), "{s:?}");
        assert_eq!(s.header("x-amz-security-token"), Some("token"));
        check_signed(&s, url, body, now).expect("good request");
        // Round trip through the header.
        assert_eq!(parse_authorization(&authorization(&s).expect("encode")).expect("parse"), s);
        // Another body, another URL, too old, unsigned hash header: refused.
        assert!(check_signed(&s, url, br#"{"nodeName":"b"}"#, now).is_err());
        assert!(check_signed(&s, "https://evil.example.com/", body, now).is_err());
        assert!(check_signed(&s, url, body, now + MAX_AGE + Duration::from_secs(60)).is_err());
        let mut forged = s.clone();
        let auth = forged.header("authorization").unwrap_or_default().replace(&format!(";{BODY_HASH_HEADER}"), "");
        forged.headers.retain(|(k, _)| k != "authorization");
        forged.headers.push(("authorization".into(), auth));
        assert!(check_signed(&forged, url, body, now).is_err());
        let mut other = s;
        other.body = "Action=AssumeRole".into();
        assert!(check_signed(&other, url, body, now).is_err());
        assert!(parse_authorization("Bearer abc").is_err());
    }

    #[test]
    fn caller_identities_parse_and_only_assumed_roles_name_a_session() {
        let xml = r#"<GetCallerIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><GetCallerIdentityResult><Arn>arn:aws:sts::123456789012:assumed-role/nodes.c.example.com/i-0abc</Arn><UserId>AROA:i-0abc</UserId><Account>123456789012</Account></GetCallerIdentityResult><ResponseMetadata><RequestId>x</RequestId></ResponseMetadata></GetCallerIdentityResponse>"#;
        let id = parse_caller_identity(xml).expect("parse");
        let r = id.assumed_role().expect("assumed role");
        assert_eq!((r.role.as_str(), r.session.as_str(), r.account.as_str()), ("nodes.c.example.com", "i-0abc", "123456789012"));
        let user = CallerIdentity { arn: "arn:aws:iam::123456789012:user/bob".into(), account: "123456789012".into() };
        assert!(user.assumed_role().is_none());
        let other_account = CallerIdentity { arn: "arn:aws:sts::999:assumed-role/r/i-1".into(), account: "123".into() };
        assert!(other_account.assumed_role().is_none());
        assert!(parse_caller_identity("<Error/>").is_err());
    }

    #[test]
    fn a_challenge_is_answered_only_with_its_nonce_and_the_pending_body() {
        let nonce = "ab".repeat(32);
        let body = crate::sha256_hex(b"{}");
        let line = challenge_line(&nonce);
        let answer = answer_challenge(&line, &body).expect("answer");
        check_challenge_answer(&answer, &nonce, &body).expect("the right answer");
        assert!(check_challenge_answer(&answer, &"cd".repeat(32), &body).is_err(), "another nonce");
        assert!(check_challenge_answer(&answer, &nonce, &crate::sha256_hex(b"other")).is_err(), "another body");
        assert!(check_challenge_answer("garbage", &nonce, &body).is_err());
        for bad in ["HELLO abc\n", "KEELSON-JOIN-CHALLENGE short\n", &format!("{CHALLENGE_GREETING} {}\n", "AB".repeat(32))] {
            assert!(answer_challenge(bad, &body).is_err(), "{bad}");
        }
    }

    #[test]
    fn partitions_come_from_the_arn() {
        let id = CallerIdentity { arn: "arn:aws-cn:sts::123:assumed-role/r/i-1".into(), account: "123".into() };
        assert_eq!(id.partition(), Some("aws-cn"));
        assert_eq!(id.assumed_role().map(|r| r.partition), Some("aws-cn".to_string()));
        assert_eq!(CallerIdentity { arn: "nonsense".into(), account: "1".into() }.partition(), None);
    }

    #[test]
    fn sts_endpoints_default_to_the_region() {
        let none = |_: &str| None;
        assert_eq!(sts_endpoint_with("eu-west-1", none), "https://sts.eu-west-1.amazonaws.com/");
        assert_eq!(sts_endpoint_with("cn-north-1", none), "https://sts.cn-north-1.amazonaws.com.cn/");
        let env = |k: &str| (k == "AWS_ENDPOINT_URL").then(|| "http://127.0.0.1:5000".to_string());
        assert_eq!(sts_endpoint_with("eu-west-1", env), "http://127.0.0.1:5000/");
        let both = |k: &str| Some(if k == "AWS_ENDPOINT_URL_STS" { "http://sts.local/" } else { "http://all.local" }.to_string());
        assert_eq!(sts_endpoint_with("eu-west-1", both), "http://sts.local/");
    }
}
