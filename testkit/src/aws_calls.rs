//! Recording the AWS calls a client makes (an SDK interceptor, added to the clients of a moto
//! test) and turning each into the IAM authorisations AWS would make for it — action, resource
//! ARN from the request, condition keys — for the [`crate::iam_oracle`] to check against the
//! policy rendered for the identity that makes them.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::context::{BeforeTransmitInterceptorContextRef, FinalizerInterceptorContextRef};
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::{ConfigBag, Storable, StoreReplace};
use serde_json::Value;

use crate::iam_oracle::{evaluate, Denied, Request};

/// One SDK operation as it went out (its last attempt).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The SDK's service name, lower case without spaces (`route53`, `s3`, `ec2`, …).
    pub service: String,
    /// The operation (`ListHostedZonesByName`).
    pub operation: String,
    pub method: String,
    pub uri: String,
    /// The request body when it was in memory (query-protocol parameters), else empty.
    pub body: String,
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} ({} {})", self.service, self.operation, self.method, self.uri)
    }
}

/// The interceptor: cheap to clone, clones share the log.
#[derive(Debug, Default, Clone)]
pub struct CallLog {
    inner: Arc<Mutex<Vec<Call>>>,
}

impl CallLog {
    pub fn calls(&self) -> Vec<Call> {
        self.inner.lock().map(|c| c.clone()).unwrap_or_default()
    }
    pub fn clear(&self) {
        if let Ok(mut c) = self.inner.lock() {
            c.clear();
        }
    }
}

/// The last attempt's request, kept in the operation's config bag until it finishes (the
/// finaliser no longer has it).
#[derive(Debug, Clone)]
struct Sent {
    method: String,
    uri: String,
    body: String,
}

impl Storable for Sent {
    type Storer = StoreReplace<Self>;
}

impl Intercept for CallLog {
    fn name(&self) -> &'static str {
        "keelson.testkit.CallLog"
    }
    fn read_before_transmit(&self, ctx: &BeforeTransmitInterceptorContextRef<'_>, _rc: &RuntimeComponents, cfg: &mut ConfigBag) -> Result<(), BoxError> {
        let r = ctx.request();
        let body = r.body().bytes().map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default();
        cfg.interceptor_state().store_put(Sent { method: r.method().to_string(), uri: r.uri().to_string(), body });
        Ok(())
    }
    fn read_after_execution(&self, ctx: &FinalizerInterceptorContextRef<'_>, _rc: &RuntimeComponents, cfg: &mut ConfigBag) -> Result<(), BoxError> {
        let (service, operation) = match cfg.load::<Metadata>() {
            Some(m) => (m.service().to_ascii_lowercase().replace(' ', ""), m.name().to_string()),
            None => ("unknown".into(), "unknown".into()),
        };
        let (method, uri, body) = match ctx.request() {
            Some(r) => (r.method().to_string(), r.uri().to_string(), r.body().bytes().map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default()),
            None => cfg.load::<Sent>().map(|s| (s.method.clone(), s.uri.clone(), s.body.clone())).unwrap_or_default(),
        };
        if let Ok(mut c) = self.inner.lock() {
            c.push(Call { service, operation, method, uri, body });
        }
        Ok(())
    }
}

/// Where the calls are made: the parts of an ARN the request does not carry.
#[derive(Debug, Clone)]
pub struct Account {
    pub partition: String,
    pub region: String,
    pub account: String,
}

impl Default for Account {
    fn default() -> Self {
        Account { partition: "aws".into(), region: "us-east-1".into(), account: "123456789012".into() }
    }
}

fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(&s.replace('+', " ")).decode_utf8_lossy().into_owned()
}

/// `application/x-www-form-urlencoded` parameters (EC2, ELB, IAM, Auto Scaling queries).
fn form(body: &str) -> Vec<(String, String)> {
    body.split('&').filter(|p| !p.is_empty()).map(|p| p.split_once('=').unwrap_or((p, ""))).map(|(k, v)| (decode(k), decode(v))).collect()
}

/// The text of every `<tag>…</tag>` element of an XML body, in order, entities decoded (the
/// Route53 change batch has no nested elements of these names).
fn xml_texts(body: &str, tag: &str) -> Vec<String> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut out = Vec::new();
    let mut rest = body;
    while let Some(i) = rest.find(&open) {
        let after = &rest[i + open.len()..];
        let Some(j) = after.find(&close) else { break };
        let text = &after[..j];
        out.push(text.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&apos;", "'").replace("&amp;", "&"));
        rest = &after[j + close.len()..];
    }
    out
}

/// The URI's path (decoded) and query.
fn path_and_query(uri: &str) -> (String, String) {
    let rest = uri.split_once("://").map(|(_, r)| r).unwrap_or(uri);
    let path = rest.find('/').map(|i| &rest[i..]).unwrap_or("/");
    let (p, q) = path.split_once('?').unwrap_or((path, ""));
    (decode(p), q.to_string())
}

/// The IAM action of an SDK operation (`None`: AWS authorises nothing for it).
pub fn iam_action(service: &str, operation: &str) -> Option<String> {
    let prefix = match service {
        "elasticloadbalancingv2" | "elasticloadbalancing" => "elasticloadbalancing",
        "sts" if operation == "GetCallerIdentity" => return None,
        s => s,
    };
    let action = match (prefix, operation) {
        ("s3", "CreateMultipartUpload" | "UploadPart" | "CompleteMultipartUpload" | "PutObject" | "CopyObject") => "PutObject",
        ("s3", "HeadObject" | "GetObject") => "GetObject",
        ("s3", "ListObjectsV2" | "ListObjects") => "ListBucket",
        ("s3", "ListObjectVersions") => "ListBucketVersions",
        ("s3", "DeleteObjects") => "DeleteObject",
        ("s3", "HeadBucket") => "ListBucket",
        ("s3", "ListParts") => "ListMultipartUploadParts",
        ("s3", "GetBucketEncryption") => "GetEncryptionConfiguration",
        ("s3", "PutBucketEncryption") => "PutEncryptionConfiguration",
        ("s3", "ListMultipartUploads") => "ListBucketMultipartUploads",
        ("s3", "PutPublicAccessBlock") => "PutBucketPublicAccessBlock",
        (_, op) => op,
    };
    Some(format!("{prefix}:{action}"))
}

/// The tags a request puts on what it creates or tags: every `…Tag….N.Key` parameter with its
/// `….N.Value` (EC2's `Tag.N` and `TagSpecification.M.Tag.N`, ELB's `Tags.member.N`).
fn tags_in(params: &[(String, String)]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (k, v) in params {
        let Some(stem) = k.strip_suffix(".Key") else { continue };
        if !stem.contains("Tag") {
            continue;
        }
        let value = format!("{stem}.Value");
        out.insert(v.clone(), params.iter().find(|(k, _)| *k == value).map(|(_, v)| v.clone()).unwrap_or_default());
    }
    out
}

fn ec2_arn(a: &Account, id: &str) -> String {
    let kind = match id.split_once('-').map(|(k, _)| k) {
        Some("vol") => "volume",
        Some("i") => "instance",
        Some("sg") => "security-group",
        Some("snap") => "snapshot",
        Some("subnet") => "subnet",
        Some("vpc") => "vpc",
        Some("rtb") => "route-table",
        _ => "unknown",
    };
    format!("arn:{}:ec2:{}:{}:{kind}/{id}", a.partition, a.region, a.account)
}

/// The authorisations AWS makes for a call: one per resource it acts on, each with the condition
/// keys the request and the resource's tags (`tags(arn)`) give.
pub fn authorizations(call: &Call, a: &Account, tags: &dyn Fn(&str) -> BTreeMap<String, String>) -> Vec<Request> {
    let Some(action) = iam_action(&call.service, &call.operation) else { return Vec::new() };
    let params = form(&call.body);
    let param = |name: &str| params.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    let (path, query) = path_and_query(&call.uri);
    let mut resources: Vec<String> = Vec::new();
    let mut request_tags: BTreeMap<String, String> = BTreeMap::new();
    // Condition keys the request itself carries (beyond tags).
    let mut keys: Vec<(&str, Vec<String>)> = Vec::new();
    match call.service.as_str() {
        "s3" => {
            let mut parts = path.trim_start_matches('/').splitn(2, '/');
            let bucket = parts.next().unwrap_or_default();
            let key = parts.next().unwrap_or_default();
            let bucket_level = matches!(
                action.as_str(),
                "s3:ListBucket" | "s3:ListBucketVersions" | "s3:GetBucketLocation" | "s3:GetEncryptionConfiguration" | "s3:ListBucketMultipartUploads"
            );
            resources.push(if bucket_level || key.is_empty() {
                format!("arn:{}:s3:::{bucket}", a.partition)
            } else {
                format!("arn:{}:s3:::{bucket}/{key}", a.partition)
            });
            if matches!(action.as_str(), "s3:ListBucket" | "s3:ListBucketVersions") {
                // `s3:prefix`: the listing's `prefix` parameter (absent when it names none).
                if let Some((_, prefix)) = form(&query).into_iter().find(|(k, _)| k == "prefix") {
                    keys.push(("s3:prefix", vec![prefix]));
                }
            }
        }
        "route53" => {
            let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
            resources.push(match segs.as_slice() {
                [_, "hostedzone", id, ..] => format!("arn:{}:route53:::hostedzone/{id}", a.partition),
                [_, "change", id, ..] => format!("arn:{}:route53:::change/{id}", a.partition),
                [_, "tags", "hostedzone", id, ..] => format!("arn:{}:route53:::hostedzone/{id}", a.partition),
                _ => "*".to_string(),
            });
            if call.operation == "ChangeResourceRecordSets" {
                // The change batch's names (normalised as Route53 does: lower case, no trailing
                // dot), types and actions.
                let names = xml_texts(&call.body, "Name").into_iter().map(|n| n.trim_end_matches('.').to_ascii_lowercase()).collect();
                keys.push(("route53:ChangeResourceRecordSetsNormalizedRecordNames", names));
                keys.push(("route53:ChangeResourceRecordSetsRecordTypes", xml_texts(&call.body, "Type")));
                keys.push(("route53:ChangeResourceRecordSetsActions", xml_texts(&call.body, "Action")));
            }
        }
        "ec2" => {
            for (k, v) in &params {
                if k == "VolumeId" || k == "InstanceId" || k.starts_with("ResourceId.") || k == "GroupId" || k == "RouteTableId" {
                    resources.push(ec2_arn(a, v));
                }
            }
            request_tags = tags_in(&params);
            if call.operation.starts_with("Describe") {
                resources.clear();
            }
        }
        "elasticloadbalancingv2" | "elasticloadbalancing" => {
            if let Some(arn) = param("TargetGroupArn").or_else(|| param("LoadBalancerArn")) {
                resources.push(arn);
            }
            request_tags = tags_in(&params);
            if call.operation.starts_with("Describe") {
                resources.clear();
            }
        }
        "iam" => {
            if let Some(name) = param("InstanceProfileName") {
                resources.push(format!("arn:{}:iam::{}:instance-profile/{name}", a.partition, a.account));
            } else if let Some(name) = param("RoleName") {
                resources.push(format!("arn:{}:iam::{}:role/{name}", a.partition, a.account));
            }
        }
        _ => {}
    }
    if resources.is_empty() {
        resources.push("*".to_string());
    }
    resources
        .into_iter()
        .map(|resource| {
            let mut r = Request::new(&action, &resource);
            for (k, v) in tags(&resource) {
                r = r.with(&format!("aws:ResourceTag/{k}"), &[&v]);
                if call.service == "ec2" {
                    r = r.with(&format!("ec2:ResourceTag/{k}"), &[&v]);
                }
            }
            for (k, v) in &request_tags {
                r = r.with(&format!("aws:RequestTag/{k}"), &[v]);
            }
            if !request_tags.is_empty() {
                let keys: Vec<&str> = request_tags.keys().map(String::as_str).collect();
                r = r.with("aws:TagKeys", &keys);
            }
            for (k, values) in keys.iter().filter(|(_, v)| !v.is_empty()) {
                let values: Vec<&str> = values.iter().map(String::as_str).collect();
                r = r.with(k, &values);
            }
            r
        })
        .collect()
}

/// A call the identity's policy does not allow.
#[derive(Debug, thiserror::Error)]
#[error("{call}: {denied}")]
pub struct DeniedCall {
    pub call: Call,
    pub denied: Denied,
}

/// Check every call against the identity's policy (`None`: it has none, so every call that needs
/// authorisation is denied); returns the authorisations checked, or every denial.
pub fn check(
    identity: &str,
    policy: Option<&Value>,
    calls: &[Call],
    a: &Account,
    tags: &dyn Fn(&str) -> BTreeMap<String, String>,
) -> Result<usize, Vec<DeniedCall>> {
    let empty = serde_json::json!({"Statement": []});
    let policy = policy.unwrap_or(&empty);
    let mut checked = 0;
    let mut denied = Vec::new();
    for call in calls {
        for r in authorizations(call, a, tags) {
            checked += 1;
            if let Err(d) = evaluate(identity, policy, &r) {
                denied.push(DeniedCall { call: call.clone(), denied: d });
            }
        }
    }
    if denied.is_empty() {
        Ok(checked)
    } else {
        Err(denied)
    }
}

/// [`check`], panicking with every denial, one a line.
pub fn assert_allowed(identity: &str, policy: Option<&Value>, calls: &[Call], a: &Account, tags: &dyn Fn(&str) -> BTreeMap<String, String>) -> usize {
    match check(identity, policy, calls, a, tags) {
        Ok(n) => n,
        Err(denied) => {
            let lines: Vec<String> = denied.iter().map(|d| format!("  {d}")).collect();
            panic!("{} call(s) the IAM policy of {identity} does not allow:\n{}", denied.len(), lines.join("\n"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(service: &str, operation: &str, uri: &str, body: &str) -> Call {
        Call { service: service.into(), operation: operation.into(), method: "POST".into(), uri: uri.into(), body: body.into() }
    }

    #[test]
    fn calls_become_actions_on_resources() {
        let a = Account::default();
        let none = |_: &str| BTreeMap::new();
        let r = authorizations(&call("route53", "ListHostedZonesByName", "http://127.0.0.1:5000/2013-04-01/hostedzonesbyname?dnsname=x.", ""), &a, &none);
        assert_eq!(r, [Request::new("route53:ListHostedZonesByName", "*")]);
        let r = authorizations(&call("route53", "ChangeResourceRecordSets", "http://h/2013-04-01/hostedzone/Z1/rrset/", ""), &a, &none);
        assert_eq!(r, [Request::new("route53:ChangeResourceRecordSets", "arn:aws:route53:::hostedzone/Z1")]);
        let r = authorizations(&call("s3", "UploadPart", "http://h:1/bucket/c/backups/a%20b?partNumber=1&uploadId=u", ""), &a, &none);
        assert_eq!(r, [Request::new("s3:PutObject", "arn:aws:s3:::bucket/c/backups/a b")]);
        let r = authorizations(&call("s3", "ListObjectsV2", "http://h:1/bucket?list-type=2&prefix=c%2Figconfig%2F", ""), &a, &none);
        assert_eq!(r, [Request::new("s3:ListBucket", "arn:aws:s3:::bucket").with("s3:prefix", &["c/igconfig/"])]);
        let r = authorizations(&call("s3", "ListObjectsV2", "http://h:1/bucket?list-type=2", ""), &a, &none);
        assert_eq!(r, [Request::new("s3:ListBucket", "arn:aws:s3:::bucket")], "no prefix, no key");
        let batch = "<ChangeResourceRecordSetsRequest xmlns=\"https://route53.amazonaws.com/doc/2013-04-01/\"><ChangeBatch><Changes>\
            <Change><Action>UPSERT</Action><ResourceRecordSet><Name>API.internal.c.example.com.</Name><Type>A</Type><TTL>60</TTL>\
            <ResourceRecords><ResourceRecord><Value>10.0.0.1</Value></ResourceRecord></ResourceRecords></ResourceRecordSet></Change>\
            <Change><Action>DELETE</Action><ResourceRecordSet><Name>www.example.com</Name><Type>TXT</Type></ResourceRecordSet></Change>\
            </Changes></ChangeBatch></ChangeResourceRecordSetsRequest>";
        let r = authorizations(&call("route53", "ChangeResourceRecordSets", "http://h/2013-04-01/hostedzone/Z1/rrset/", batch), &a, &none);
        assert_eq!(
            r,
            [Request::new("route53:ChangeResourceRecordSets", "arn:aws:route53:::hostedzone/Z1")
                .with("route53:ChangeResourceRecordSetsNormalizedRecordNames", &["api.internal.c.example.com", "www.example.com"])
                .with("route53:ChangeResourceRecordSetsRecordTypes", &["A", "TXT"])
                .with("route53:ChangeResourceRecordSetsActions", &["UPSERT", "DELETE"])]
        );
        let tags = |arn: &str| if arn.ends_with("vol-1") { BTreeMap::from([("KubernetesCluster".to_string(), "c".to_string())]) } else { BTreeMap::new() };
        let r = authorizations(&call("ec2", "AttachVolume", "http://h/", "Action=AttachVolume&VolumeId=vol-1&InstanceId=i-2&Device=%2Fdev%2Fxvdu"), &a, &tags);
        assert_eq!(
            r,
            [
                Request::new("ec2:AttachVolume", "arn:aws:ec2:us-east-1:123456789012:volume/vol-1")
                    .with("aws:ResourceTag/KubernetesCluster", &["c"])
                    .with("ec2:ResourceTag/KubernetesCluster", &["c"]),
                Request::new("ec2:AttachVolume", "arn:aws:ec2:us-east-1:123456789012:instance/i-2"),
            ]
        );
        assert!(authorizations(&call("sts", "GetCallerIdentity", "http://h/", ""), &a, &none).is_empty());
    }
}
