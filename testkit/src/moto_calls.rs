//! The IAM oracle at moto's door: every request moto served, as `moto_server.py` records it (fix 10,
//! `KEELSON_MOTO_CALLS`: one JSON object a line), whoever sent it — agents in other processes and
//! on other machines, in Rust or Go — checked against the policies of the role whose credentials
//! signed it.
//!
//! Pure: the request → (access key, service, operation) parse ([`signer`], [`call`]), then the one
//! call → authorisations mapping ([`crate::aws_calls::authorizations`]) and the one policy
//! evaluator ([`crate::iam_oracle::evaluate`]). The caller supplies what only the cloud knows: which
//! role each access key was issued for (credentials of no role — the operator's, the harness's —
//! are not checked), each role's policies as they are in IAM, and resources' tags for the
//! `aws:ResourceTag/…` condition keys.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::aws_calls::{authorizations, Account, Call};
use crate::iam_oracle::{evaluate, Denied, DenyReason};

/// The environment variable that makes `moto_server.py` record every request into a file.
pub const CALLS_ENV: &str = "KEELSON_MOTO_CALLS";

#[derive(Debug, thiserror::Error)]
pub enum MotoCallsError {
    #[error("reading moto's call record {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("moto's call record {path}, line {line}: {source}")]
    Parse {
        path: PathBuf,
        line: usize,
        #[source]
        source: serde_json::Error,
    },
}

/// One request moto served, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Recorded {
    pub method: String,
    /// The URL as sent (percent-encoded).
    pub url: String,
    /// Lower-case names: `authorization`, `x-amz-target`, `content-type`, `host`.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// A form or JSON body (else empty).
    #[serde(default)]
    pub body: String,
    /// A form or JSON body's Content-Length, as the client declared it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declared: Option<u64>,
    /// The bytes of that body moto read (absent when it kept none: empty, or over 1 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub received: Option<u64>,
}

impl Recorded {
    /// The client went away before its whole body arrived: AWS would never have served it (the
    /// signature covers the body), so it is no call to authorise. Why the oracle reports it apart.
    pub fn incomplete(&self) -> Option<String> {
        match (self.declared, self.received) {
            (Some(d), Some(r)) if r < d => Some(format!("{self}: {r} of the {d} bytes its Content-Length declared arrived")),
            _ => None,
        }
    }
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
    fn path_and_query(&self) -> (String, String) {
        let rest = self.url.split_once("://").map(|(_, r)| r).unwrap_or(&self.url);
        let target = rest.find('/').map(|i| &rest[i..]).unwrap_or("/");
        let (p, q) = target.split_once('?').unwrap_or((target, ""));
        (p.to_string(), q.to_string())
    }
}

impl fmt::Display for Recorded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.method, self.url)
    }
}

/// Every request of a record file (a missing file is an error: the record was not made).
pub fn read(path: &Path) -> Result<Vec<Recorded>, MotoCallsError> {
    let text = std::fs::read_to_string(path).map_err(|source| MotoCallsError::Read { path: path.to_path_buf(), source })?;
    parse(&text).map_err(|(line, source)| MotoCallsError::Parse { path: path.to_path_buf(), line, source })
}

/// Where a record ends now (its length; 0 when not yet written): [`read_since`] it later to get
/// the requests served in between.
pub fn mark(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// The requests recorded after `mark` ([`mark`]): whole lines only (moto may be writing one now).
pub fn read_since(path: &Path, mark: u64) -> Result<Vec<Recorded>, MotoCallsError> {
    let bytes = std::fs::read(path).map_err(|source| MotoCallsError::Read { path: path.to_path_buf(), source })?;
    let from = usize::try_from(mark).unwrap_or(usize::MAX).min(bytes.len());
    let tail = &bytes[from..];
    let whole = tail.iter().rposition(|b| *b == b'\n').map(|i| &tail[..=i]).unwrap_or(&[]);
    parse(&String::from_utf8_lossy(whole)).map_err(|(line, source)| MotoCallsError::Parse { path: path.to_path_buf(), line, source })
}

/// One line of a record: a request, or a credential STS issued for a web identity (fix 11).
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Line {
    WebIdentity { web_identity: crate::web_identity::Issued },
    Request(Recorded),
}

fn lines(text: &str) -> Result<Vec<Line>, (usize, serde_json::Error)> {
    text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()).map(|(i, l)| serde_json::from_str(l).map_err(|e| (i + 1, e))).collect()
}

/// The requests of a record (`Err`: the 1-based line that is not one).
pub fn parse(text: &str) -> Result<Vec<Recorded>, (usize, serde_json::Error)> {
    Ok(lines(text)?.into_iter().filter_map(|l| if let Line::Request(r) = l { Some(r) } else { None }).collect())
}

/// The credentials STS issued for web identities, as a record holds them.
pub fn parse_web_identities(text: &str) -> Result<Vec<crate::web_identity::Issued>, (usize, serde_json::Error)> {
    Ok(lines(text)?.into_iter().filter_map(|l| if let Line::WebIdentity { web_identity } = l { Some(web_identity) } else { None }).collect())
}

/// [`parse_web_identities`] of a record file.
pub fn read_web_identities(path: &Path) -> Result<Vec<crate::web_identity::Issued>, MotoCallsError> {
    let text = std::fs::read_to_string(path).map_err(|source| MotoCallsError::Read { path: path.to_path_buf(), source })?;
    parse_web_identities(&text).map_err(|(line, source)| MotoCallsError::Parse { path: path.to_path_buf(), line, source })
}

/// Who signed a request and for what (SigV4's credential scope).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signer {
    pub access_key: String,
    pub region: String,
    /// The signing name: `ec2`, `s3`, `route53`, `elasticloadbalancing`, `autoscaling`, `iam`, `sts`, …
    pub service: String,
}

fn query_pairs(q: &str) -> Vec<(String, String)> {
    let dec = |s: &str| percent_encoding::percent_decode_str(&s.replace('+', " ")).decode_utf8_lossy().into_owned();
    q.split('&').filter(|p| !p.is_empty()).map(|p| p.split_once('=').unwrap_or((p, ""))).map(|(k, v)| (dec(k), dec(v))).collect()
}

/// The SigV4 signer of a request: the `Authorization` header's `Credential=` or a presigned
/// URL's `X-Amz-Credential`; `None` for an unsigned request.
pub fn signer(r: &Recorded) -> Option<Signer> {
    let scope = match r.header("authorization") {
        Some(a) => a.split([' ', ',']).find_map(|p| p.trim().strip_prefix("Credential=")).map(str::to_string),
        None => query_pairs(&r.path_and_query().1).into_iter().find(|(k, _)| k == "X-Amz-Credential").map(|(_, v)| v),
    }?;
    let parts: Vec<&str> = scope.split('/').collect();
    match parts.as_slice() {
        [key, _date, region, service, "aws4_request"] if !key.is_empty() => {
            Some(Signer { access_key: key.to_string(), region: region.to_string(), service: service.to_string() })
        }
        _ => None,
    }
}

/// S3's REST operation from method, path (`/bucket[/key]`, path style) and query.
fn s3_operation(method: &str, path: &str, query: &str) -> Result<&'static str, String> {
    // `x-id` is the SDK's name of the operation (a hint to proxies), not a sub-resource.
    let q: Vec<String> = query_pairs(query).into_iter().map(|(k, _)| k).filter(|k| k != "x-id").collect();
    let has = |k: &str| q.iter().any(|x| x == k);
    let object = path.trim_start_matches('/').split_once('/').is_some_and(|(_, key)| !key.is_empty());
    let op = match (method, object) {
        ("GET", false) if has("list-type") => "ListObjectsV2",
        ("GET", false) if has("versions") => "ListObjectVersions",
        ("GET", false) if has("location") => "GetBucketLocation",
        ("GET", false) if has("encryption") => "GetBucketEncryption",
        ("GET", false) if has("uploads") => "ListMultipartUploads",
        ("GET", false) if has("versioning") => "GetBucketVersioning",
        ("GET", false) if has("policy") => "GetBucketPolicy",
        ("GET", false) if has("tagging") => "GetBucketTagging",
        ("GET", false) if q.iter().all(|k| matches!(k.as_str(), "prefix" | "delimiter" | "marker" | "max-keys" | "encoding-type")) => "ListObjects",
        ("HEAD", false) => "HeadBucket",
        ("PUT", false) if q.is_empty() => "CreateBucket",
        ("PUT", false) if has("versioning") => "PutBucketVersioning",
        ("PUT", false) if has("encryption") => "PutBucketEncryption",
        ("PUT", false) if has("policy") => "PutBucketPolicy",
        ("PUT", false) if has("tagging") => "PutBucketTagging",
        ("PUT", false) if has("publicAccessBlock") => "PutPublicAccessBlock",
        ("DELETE", false) if q.is_empty() => "DeleteBucket",
        ("POST", false) if has("delete") => "DeleteObjects",
        ("GET", true) if has("uploadId") => "ListParts",
        ("GET", true) if has("tagging") => "GetObjectTagging",
        ("GET", true) if !has("acl") => "GetObject",
        ("HEAD", true) => "HeadObject",
        ("PUT", true) if has("uploadId") => "UploadPart",
        ("PUT", true) if has("tagging") => "PutObjectTagging",
        ("PUT", true) if !has("acl") => "PutObject",
        ("POST", true) if has("uploads") => "CreateMultipartUpload",
        ("POST", true) if has("uploadId") => "CompleteMultipartUpload",
        ("DELETE", true) if has("uploadId") => "AbortMultipartUpload",
        ("DELETE", true) if q.is_empty() || has("versionId") => "DeleteObject",
        _ => return Err(format!("{method} {path}?{query}: an S3 request the oracle does not map")),
    };
    Ok(op)
}

/// Route53's REST operation from method and path (`/2013-04-01/...`).
fn route53_operation(method: &str, path: &str) -> Result<&'static str, String> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').skip(1).collect();
    let op = match (method, segs.as_slice()) {
        ("GET", ["hostedzone"]) => "ListHostedZones",
        ("POST", ["hostedzone"]) => "CreateHostedZone",
        ("GET", ["hostedzone", _]) => "GetHostedZone",
        ("POST", ["hostedzone", _]) => "UpdateHostedZoneComment",
        ("DELETE", ["hostedzone", _]) => "DeleteHostedZone",
        ("GET", ["hostedzone", _, "rrset"]) => "ListResourceRecordSets",
        ("POST", ["hostedzone", _, "rrset"]) => "ChangeResourceRecordSets",
        ("POST", ["hostedzone", _, "associatevpc"]) => "AssociateVPCWithHostedZone",
        ("POST", ["hostedzone", _, "disassociatevpc"]) => "DisassociateVPCFromHostedZone",
        ("GET", ["hostedzonesbyname"]) => "ListHostedZonesByName",
        ("GET", ["hostedzonecount"]) => "GetHostedZoneCount",
        ("GET", ["change", _]) => "GetChange",
        ("GET", ["tags", "hostedzone", _]) => "ListTagsForResource",
        ("POST", ["tags", "hostedzone", _]) => "ChangeTagsForResource",
        ("POST", ["tags", "hostedzone"]) => "ListTagsForResources",
        _ => return Err(format!("{method} {path}: a Route53 request the oracle does not map")),
    };
    Ok(op)
}

/// The call a signed request makes: the Query protocols' `Action=`, the JSON protocols'
/// `X-Amz-Target`, S3's and Route53's REST method and path. `Err` says why it cannot be mapped.
pub fn call(r: &Recorded, signer: &Signer) -> Result<Call, String> {
    let (path, query) = r.path_and_query();
    let form = r.header("content-type").is_some_and(|c| c.contains("x-www-form-urlencoded"));
    let action = if form { query_pairs(&r.body) } else { query_pairs(&query) }.into_iter().find(|(k, _)| k == "Action").map(|(_, v)| v);
    let operation = if let Some(a) = action {
        a
    } else if let Some(t) = r.header("x-amz-target") {
        t.rsplit('.').next().unwrap_or(t).to_string()
    } else {
        match signer.service.as_str() {
            "s3" => s3_operation(&r.method, &percent_encoding::percent_decode_str(&path).decode_utf8_lossy(), &query)?.to_string(),
            "route53" => route53_operation(&r.method, &path)?.to_string(),
            s => {
                return Err(format!(
                    "{r}: a {s} request with neither Action nor X-Amz-Target (Content-Type {:?}, body of {} bytes, declared {:?}, received {:?})",
                    r.header("content-type").unwrap_or(""),
                    r.body.len(),
                    r.declared,
                    r.received
                ))
            }
        }
    };
    Ok(Call {
        service: signer.service.clone(),
        operation,
        method: r.method.clone(),
        uri: r.url.clone(),
        body: if form { r.body.clone() } else { String::new() },
    })
}

/// What the oracle checks a record against.
pub struct Identities<'a> {
    /// Access key → the role it was issued for (keys of no role are not checked).
    pub roles: &'a BTreeMap<String, String>,
    /// Role → its policy documents as IAM has them (inline and attached), all of which apply.
    pub policies: &'a BTreeMap<String, Vec<Value>>,
    /// The account the roles are in (moto's: `123456789012`).
    pub account: &'a str,
    /// A resource's tags by ARN (the `aws:ResourceTag/…` condition keys).
    pub tags: &'a dyn Fn(&str) -> BTreeMap<String, String>,
}

/// Denials of one kind: the same identity, action, resource and reason, `count` times; `call` is
/// the first.
#[derive(Debug, Clone)]
pub struct Finding {
    pub call: Call,
    pub denied: Denied,
    pub count: usize,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x {}: {}", self.count, self.call, self.denied)
    }
}

/// What the oracle found in a record.
#[derive(Debug, Default)]
pub struct Report {
    /// Requests in the record.
    pub requests: usize,
    /// Requests signed by a role's credentials (the checked ones).
    pub by_roles: usize,
    /// Authorisations evaluated (a call acting on two resources is two).
    pub authorizations: usize,
    /// Checked requests per role.
    pub per_role: BTreeMap<String, usize>,
    /// Denied calls, grouped.
    pub denied: Vec<Finding>,
    /// Requests of a role the oracle could not map to an action: `(role, request, why)`.
    pub unmapped: Vec<(String, String, String)>,
    /// Requests of a role whose body never wholly arrived (never served): `(role, why)`.
    pub incomplete: Vec<(String, String)>,
    /// Credentials STS issued for service-account tokens ([`crate::web_identity`]).
    pub web_identities: usize,
    /// Those STS would have refused: `(access key, why)`.
    pub refused_web_identities: Vec<(String, String)>,
}

impl Report {
    /// Nothing denied, nothing left unmapped, no token STS would refuse.
    pub fn clean(&self) -> bool {
        self.denied.is_empty() && self.unmapped.is_empty() && self.refused_web_identities.is_empty()
    }
    /// One line: what was checked and what was found.
    pub fn summary(&self) -> String {
        let roles: Vec<String> = self.per_role.iter().map(|(r, n)| format!("{r}={n}")).collect();
        format!(
            "IAM oracle: {} of {} requests to moto signed by instance and service-account roles ({}), {} web-identity credentials ({} STS would refuse), {} authorisations, {} denied, {} unmapped, {} cut off before their body arrived",
            self.by_roles,
            self.requests,
            roles.join(" "),
            self.web_identities,
            self.refused_web_identities.len(),
            self.authorizations,
            self.denied.iter().map(|d| d.count).sum::<usize>(),
            self.unmapped.len(),
            self.incomplete.len()
        )
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.summary())?;
        for d in &self.denied {
            writeln!(f, "  DENIED {d}")?;
        }
        for (role, request, why) in &self.unmapped {
            writeln!(f, "  UNMAPPED request of {role}: {request}: {why}")?;
        }
        for (role, why) in &self.incomplete {
            writeln!(f, "  CUT OFF request of {role} (never served, not checked): {why}")?;
        }
        for (key, why) in &self.refused_web_identities {
            writeln!(f, "  REFUSED web identity {key}: {why}")?;
        }
        Ok(())
    }
}

/// The statements of every policy of a role, as one document (AWS allows what any of them allows
/// and denies what any of them denies).
pub fn merged(policies: &[Value]) -> Value {
    let all: Vec<Value> = policies.iter().flat_map(crate::iam_oracle::statements).collect();
    serde_json::json!({"Version": "2012-10-17", "Statement": all})
}

/// Check every request of a record signed by a role's credentials against that role's policies.
pub fn check(records: &[Recorded], ids: &Identities<'_>) -> Report {
    let mut report = Report { requests: records.len(), ..Default::default() };
    let docs: BTreeMap<&str, Value> = ids.policies.iter().map(|(role, p)| (role.as_str(), merged(p))).collect();
    let empty = serde_json::json!({"Statement": []});
    let mut groups: BTreeMap<(String, String, String, String), Finding> = BTreeMap::new();
    for r in records {
        let Some(s) = signer(r) else { continue };
        let Some(role) = ids.roles.get(&s.access_key) else { continue };
        report.by_roles += 1;
        *report.per_role.entry(role.clone()).or_default() += 1;
        if let Some(why) = r.incomplete() {
            report.incomplete.push((role.clone(), why));
            continue;
        }
        let c = match call(r, &s) {
            Ok(c) => c,
            Err(why) => {
                report.unmapped.push((role.clone(), r.to_string(), why));
                continue;
            }
        };
        let account = Account { partition: "aws".into(), region: s.region.clone(), account: ids.account.to_string() };
        let policy = docs.get(role.as_str()).unwrap_or(&empty);
        for a in authorizations(&c, &account, ids.tags) {
            report.authorizations += 1;
            if let Err(d) = evaluate(role, policy, &a) {
                let why = match &d.reason {
                    DenyReason::Explicit { index, .. } => format!("deny {index}"),
                    DenyReason::Implicit { nearest } => nearest.as_ref().map(|(i, _, w)| format!("{i} {w}")).unwrap_or_default(),
                };
                let key = (role.clone(), a.action.clone(), a.resource.clone(), why);
                groups.entry(key).and_modify(|g| g.count += 1).or_insert(Finding { call: c.clone(), denied: d, count: 1 });
            }
        }
    }
    report.denied = groups.into_values().collect();
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(method: &str, url: &str, service: &str, extra: &[(&str, &str)], body: &str) -> Recorded {
        let mut headers = BTreeMap::from([(
            "authorization".to_string(),
            format!("AWS4-HMAC-SHA256 Credential=ASIAROLE/20261202/eu-west-1/{service}/aws4_request, SignedHeaders=host;x-amz-date, Signature=00"),
        )]);
        for (k, v) in extra {
            headers.insert(k.to_string(), v.to_string());
        }
        Recorded { method: method.into(), url: url.into(), headers, body: body.into(), ..Default::default() }
    }

    #[test]
    fn signers() {
        let r = rec("GET", "http://h/b/k", "s3", &[], "");
        assert_eq!(signer(&r), Some(Signer { access_key: "ASIAROLE".into(), region: "eu-west-1".into(), service: "s3".into() }));
        let presigned = Recorded {
            method: "GET".into(),
            url: "http://h/b/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKID%2F20261202%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Signature=0".into(),
            ..Default::default()
        };
        assert_eq!(signer(&presigned).map(|s| (s.access_key, s.region)), Some(("AKID".into(), "us-east-1".into())));
        assert_eq!(signer(&Recorded { method: "PUT".into(), url: "http://h/bucket".into(), ..Default::default() }), None, "unsigned");
        let mut bad = rec("GET", "http://h/", "s3", &[], "");
        bad.headers.insert("authorization".into(), "AWS4-HMAC-SHA256 Credential=garbage".into());
        assert_eq!(signer(&bad), None, "a malformed scope is no signer, not a panic");
    }

    #[test]
    fn operations() {
        let op = |r: Recorded| {
            let s = signer(&r).expect("signed");
            call(&r, &s).map(|c| c.operation)
        };
        let form = [("content-type", "application/x-www-form-urlencoded; charset=utf-8")];
        let cases: Vec<(Recorded, &str)> = vec![
            (rec("POST", "http://h/", "ec2", &form, "Action=AttachVolume&Version=2016-11-15&VolumeId=vol-1"), "AttachVolume"),
            (rec("GET", "http://h/?Action=DescribeInstances&Version=2016-11-15", "ec2", &[], ""), "DescribeInstances"),
            (rec("POST", "http://h/", "kms", &[("x-amz-target", "TrentService.Decrypt"), ("content-type", "application/x-amz-json-1.1")], "{}"), "Decrypt"),
            (rec("GET", "http://h/bucket?list-type=2&prefix=c%2F", "s3", &[], ""), "ListObjectsV2"),
            (rec("GET", "http://h/bucket?prefix=c%2F&delimiter=%2F", "s3", &[], ""), "ListObjects"),
            (rec("GET", "http://h/bucket?versions&prefix=c", "s3", &[], ""), "ListObjectVersions"),
            (rec("HEAD", "http://h/bucket", "s3", &[], ""), "HeadBucket"),
            (rec("GET", "http://h/bucket/c/k%2Fx", "s3", &[], ""), "GetObject"),
            (rec("HEAD", "http://h/bucket/c/k", "s3", &[], ""), "HeadObject"),
            (rec("PUT", "http://h/bucket/c/k", "s3", &[], ""), "PutObject"),
            (rec("POST", "http://h/bucket/c/k?uploads", "s3", &[], ""), "CreateMultipartUpload"),
            (rec("PUT", "http://h/bucket/c/k?partNumber=1&uploadId=u", "s3", &[], ""), "UploadPart"),
            (rec("POST", "http://h/bucket/c/k?uploadId=u", "s3", &[], ""), "CompleteMultipartUpload"),
            (rec("DELETE", "http://h/bucket/c/k?uploadId=u", "s3", &[], ""), "AbortMultipartUpload"),
            (rec("DELETE", "http://h/bucket/c/k", "s3", &[], ""), "DeleteObject"),
            (rec("DELETE", "http://h/bucket/c/k?x-id=DeleteObject", "s3", &[], ""), "DeleteObject"),
            (rec("GET", "http://h/bucket/c/k?x-id=GetObject", "s3", &[], ""), "GetObject"),
            (rec("POST", "http://h/bucket?delete", "s3", &[], ""), "DeleteObjects"),
            (rec("GET", "http://h/2013-04-01/hostedzonesbyname?dnsname=x.", "route53", &[], ""), "ListHostedZonesByName"),
            (rec("GET", "http://h/2013-04-01/hostedzone/Z1", "route53", &[], ""), "GetHostedZone"),
            (rec("GET", "http://h/2013-04-01/hostedzone/Z1/rrset?name=a", "route53", &[], ""), "ListResourceRecordSets"),
            (rec("POST", "http://h/2013-04-01/hostedzone/Z1/rrset/", "route53", &[], ""), "ChangeResourceRecordSets"),
            (rec("GET", "http://h/2013-04-01/change/C1", "route53", &[], ""), "GetChange"),
            (rec("GET", "http://h/2013-04-01/tags/hostedzone/Z1", "route53", &[], ""), "ListTagsForResource"),
        ];
        for (r, want) in cases {
            assert_eq!(op(r.clone()).as_deref(), Ok(want), "{r}");
        }
        assert!(op(rec("PATCH", "http://h/bucket/k", "s3", &[], "")).is_err(), "an unknown S3 request is unmapped, not guessed");
        assert!(op(rec("GET", "http://h/2013-04-01/healthcheck", "route53", &[], "")).is_err());
        assert!(op(rec("POST", "http://h/", "ec2", &[], "")).is_err(), "a Query request without Action");
    }

    #[test]
    fn web_identity_lines_are_kept_apart_from_requests() {
        let text = "{\"method\":\"GET\",\"url\":\"http://x/\"}\n{\"web_identity\":{\"access_key_id\":\"AK\",\"role_arn\":\"arn:r\",\"token\":\"t\"}}\n";
        assert_eq!(parse(text).expect("parse").len(), 1);
        let issued = parse_web_identities(text).expect("parse");
        assert_eq!(issued.len(), 1);
        assert_eq!((issued[0].access_key_id.as_str(), issued[0].role_arn.as_str()), ("AK", "arn:r"));
    }

    #[test]
    fn record_lines() {
        assert_eq!(parse("\n{\"method\":\"GET\",\"url\":\"http://h/\"}\n").map(|v| v.len()).ok(), Some(1));
        assert_eq!(parse("{\"method\":\"GET\",\"url\":\"http://h/\"}\nnot json\n").err().map(|(l, _)| l), Some(2));
    }

    #[test]
    fn a_mark_reads_only_what_came_after_it_and_only_whole_lines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("calls.jsonl");
        assert_eq!(mark(&path), 0, "no record yet");
        let line = |u: &str| format!("{{\"method\":\"GET\",\"url\":\"http://h/{u}\"}}\n");
        std::fs::write(&path, line("before")).expect("write");
        let m = mark(&path);
        std::fs::write(&path, format!("{}{}{{\"method\":\"GE", line("before"), line("after"))).expect("write");
        let got: Vec<String> = read_since(&path, m).expect("read").into_iter().map(|r| r.url).collect();
        assert_eq!(got, ["http://h/after"], "the half-written last line waits for its end");
        assert_eq!(read_since(&path, 0).expect("read").len(), 2);
        assert!(read_since(&dir.path().join("none"), 0).is_err(), "a missing record is an error");
    }
}
