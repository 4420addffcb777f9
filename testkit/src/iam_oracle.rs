//! The IAM oracle: AWS policy evaluation for the features Keelson's policies use, so tests against
//! moto (which enforces no IAM) can check every call an identity makes against the policy
//! rendered for it. Pure: no I/O.
//!
//! Implemented: `Effect` Allow/Deny (an explicit deny wins, no match is a deny), `Action` /
//! `NotAction` with `*` and `?` (action names case-insensitive), `Resource` / `NotResource` ARNs
//! with `*` and `?`, and the condition operators `StringEquals`, `StringNotEquals`,
//! `StringEqualsIgnoreCase`, `StringLike`, `StringNotLike`, `Bool`, `Null`, with the
//! `ForAllValues:` / `ForAnyValue:` prefixes and the `IfExists` suffix (condition key names
//! case-insensitive, values case-sensitive). Unknown operators never match (so a policy using one
//! fails loudly rather than allowing by accident).

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value;

/// One authorisation AWS makes: an action on a resource, with the request's condition keys.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Request {
    /// `service:Action`, e.g. `route53:ListHostedZonesByName`.
    pub action: String,
    /// The resource ARN, or `*` for actions that take no resource.
    pub resource: String,
    /// Condition keys (lower-cased) → values; a key that is absent is not in the request.
    pub context: BTreeMap<String, Vec<String>>,
}

impl Request {
    pub fn new(action: &str, resource: &str) -> Request {
        Request { action: action.to_string(), resource: resource.to_string(), context: BTreeMap::new() }
    }
    /// With a condition key (`aws:ResourceTag/KubernetesCluster`, …) set to `values`.
    pub fn with(mut self, key: &str, values: &[&str]) -> Request {
        self.context.insert(key.to_ascii_lowercase(), values.iter().map(|v| v.to_string()).collect());
        self
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on {}", self.action, self.resource)?;
        if !self.context.is_empty() {
            write!(f, " with {:?}", self.context)?;
        }
        Ok(())
    }
}

/// Why a request was denied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DenyReason {
    /// Statement `index` denies it.
    Explicit { index: usize, statement: String },
    /// No statement allows it; `nearest` is the statement that came closest, and why it missed.
    Implicit { nearest: Option<(usize, String, String)> },
}

/// A denied call: the call, the identity, the nearest statement.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Denied {
    pub identity: String,
    pub request: Request,
    pub reason: DenyReason,
}

impl fmt::Display for Denied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IAM denies {} to {}: ", self.request, self.identity)?;
        match &self.reason {
            DenyReason::Explicit { index, statement } => write!(f, "explicitly denied by Statement[{index}] {statement}"),
            DenyReason::Implicit { nearest: Some((index, statement, why)) } => {
                write!(f, "no statement allows it; nearest is Statement[{index}] {statement} ({why})")
            }
            DenyReason::Implicit { nearest: None } => write!(f, "no statement allows it (no statement is about this service)"),
        }
    }
}

/// `*` any run of characters, `?` one; `fold` compares case-insensitively.
pub fn glob(pattern: &str, text: &str, fold: bool) -> bool {
    let norm = |s: &str| if fold { s.to_ascii_lowercase() } else { s.to_string() };
    let (p, t): (Vec<char>, Vec<char>) = (norm(pattern).chars().collect(), norm(text).chars().collect());
    // Iterative wildcard match with backtracking to the last `*`.
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

fn strings(v: &Value) -> Vec<String> {
    match v {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a.iter().filter_map(|x| x.as_str().map(str::to_string).or_else(|| x.as_bool().map(|b| b.to_string()))).collect(),
        Value::Bool(b) => vec![b.to_string()],
        _ => Vec::new(),
    }
}

/// The statements of a policy document (one statement object or a list).
pub fn statements(policy: &Value) -> Vec<Value> {
    match &policy["Statement"] {
        Value::Array(a) => a.clone(),
        s @ Value::Object(_) => vec![s.clone()],
        _ => Vec::new(),
    }
}

/// Whether the statement's Action / NotAction covers `action`.
fn action_matches(s: &Value, action: &str) -> bool {
    if let Some(a) = s.get("Action") {
        strings(a).iter().any(|p| glob(p, action, true))
    } else if let Some(n) = s.get("NotAction") {
        !strings(n).iter().any(|p| glob(p, action, true))
    } else {
        false
    }
}

fn resource_matches(s: &Value, resource: &str) -> bool {
    if let Some(r) = s.get("Resource") {
        strings(r).iter().any(|p| glob(p, resource, false))
    } else if let Some(n) = s.get("NotResource") {
        !strings(n).iter().any(|p| glob(p, resource, false))
    } else {
        false
    }
}

/// One operator block of a Condition, e.g. `("StringEquals", {"aws:ResourceTag/K": "v"})`;
/// `Err` names the key that failed.
fn operator_holds(op: &str, block: &Value, context: &BTreeMap<String, Vec<String>>) -> Result<(), String> {
    let (set, base) = match op.split_once(':') {
        Some((q @ ("ForAllValues" | "ForAnyValue"), rest)) => (Some(q), rest),
        _ => (None, op),
    };
    let (base, if_exists) = match base.strip_suffix("IfExists") {
        Some(b) => (b, true),
        None => (base, false),
    };
    let Some(keys) = block.as_object() else { return Err(format!("{op}: not an object")) };
    for (key, wanted) in keys {
        let wanted = strings(wanted);
        let got = context.get(&key.to_ascii_lowercase());
        if base == "Null" {
            let want_absent = wanted.iter().any(|w| w.eq_ignore_ascii_case("true"));
            if want_absent != got.is_none() {
                return Err(format!("Null {key}: the request {} it", if got.is_none() { "lacks" } else { "has" }));
            }
            continue;
        }
        let one = |value: &str| -> Option<bool> {
            Some(match base {
                "StringEquals" => wanted.iter().any(|w| w == value),
                "StringNotEquals" => !wanted.iter().any(|w| w == value),
                "StringEqualsIgnoreCase" => wanted.iter().any(|w| w.eq_ignore_ascii_case(value)),
                "StringLike" => wanted.iter().any(|w| glob(w, value, false)),
                "StringNotLike" => !wanted.iter().any(|w| glob(w, value, false)),
                "Bool" => wanted.iter().any(|w| w.eq_ignore_ascii_case(value)),
                _ => return None,
            })
        };
        let holds = match (set, got) {
            // ForAllValues over no values holds; ForAnyValue over none does not.
            (Some("ForAllValues"), None) => true,
            (Some(_), None) => false,
            (_, None) => if_exists,
            (Some("ForAllValues"), Some(values)) => values.iter().all(|v| one(v) == Some(true)),
            (_, Some(values)) => values.iter().any(|v| one(v) == Some(true)),
        };
        if one("").is_none() && base != "Null" {
            return Err(format!("{op}: operator not implemented by the oracle"));
        }
        if !holds {
            return Err(match got {
                None => format!("{op} {key}: not in the request"),
                Some(v) => format!("{op} {key}: {v:?} is not {wanted:?}"),
            });
        }
    }
    Ok(())
}

fn condition_holds(s: &Value, context: &BTreeMap<String, Vec<String>>) -> Result<(), String> {
    match s.get("Condition").and_then(Value::as_object) {
        None => Ok(()),
        Some(ops) => ops.iter().try_for_each(|(op, block)| operator_holds(op, block, context)),
    }
}

/// How far a statement got with a request: 0 nothing, 1 same service, 2 action, 3 action and
/// resource (the condition failed), 4 all.
fn closeness(s: &Value, r: &Request) -> (u8, String) {
    if !action_matches(s, &r.action) {
        let service = r.action.split(':').next().unwrap_or_default().to_ascii_lowercase();
        let same = s.get("Action").map(strings).unwrap_or_default().iter().any(|a| a.to_ascii_lowercase().starts_with(&format!("{service}:")));
        return (u8::from(same), format!("its actions do not include {}", r.action));
    }
    if !resource_matches(s, &r.resource) {
        return (2, format!("the action matches, the resource {} does not", r.resource));
    }
    match condition_holds(s, &r.context) {
        Ok(()) => (4, String::new()),
        Err(why) => (3, format!("action and resource match, the condition does not: {why}")),
    }
}

/// Evaluate `request` against `policy` (an identity policy) for `identity`.
#[allow(clippy::result_large_err)] // a test oracle: the denial is the whole point, and rare
pub fn evaluate(identity: &str, policy: &Value, request: &Request) -> Result<(), Denied> {
    let all = statements(policy);
    let mut allowed = false;
    let mut nearest: Option<(u8, usize, String)> = None;
    for (i, s) in all.iter().enumerate() {
        let (score, why) = closeness(s, request);
        let effect = s["Effect"].as_str().unwrap_or_default();
        if score == 4 {
            if effect == "Deny" {
                return Err(Denied {
                    identity: identity.to_string(),
                    request: request.clone(),
                    reason: DenyReason::Explicit { index: i, statement: s.to_string() },
                });
            }
            allowed |= effect == "Allow";
        } else if effect == "Allow" && score > 0 && nearest.as_ref().is_none_or(|(best, _, _)| score > *best) {
            nearest = Some((score, i, why));
        }
    }
    if allowed {
        return Ok(());
    }
    Err(Denied {
        identity: identity.to_string(),
        request: request.clone(),
        reason: DenyReason::Implicit { nearest: nearest.map(|(_, i, why)| (i, all[i].to_string(), why)) },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy() -> Value {
        json!({"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Action": ["s3:Get*"], "Resource": "arn:aws:s3:::bucket/c/*"},
            {"Effect": "Allow", "Action": ["route53:ChangeResourceRecordSets", "route53:ListResourceRecordSets"], "Resource": ["arn:aws:route53:::hostedzone/Z1"]},
            {"Effect": "Allow", "Action": "ec2:AttachVolume", "Resource": "*",
             "Condition": {"StringEquals": {"aws:ResourceTag/KubernetesCluster": "c", "aws:ResourceTag/k8s.io/role/master": "1"}}},
            {"Effect": "Allow", "Action": ["ec2:CreateTags", "ec2:DeleteTags"], "Resource": ["arn:aws:ec2:*:*:volume/*"],
             "Condition": {"Null": {"aws:RequestTag/KubernetesCluster": "true"}, "StringEquals": {"aws:ResourceTag/KubernetesCluster": "c"}}},
            {"Effect": "Allow", "Action": ["kms:Decrypt"], "Resource": "*", "Condition": {"StringLike": {"kms:ViaService": ["ec2.eu-west-1.amazonaws.com", "s3.*.amazonaws.com"]}}},
            {"Effect": "Allow", "Action": ["kms:CreateGrant"], "Resource": "*", "Condition": {"Bool": {"kms:GrantIsForAWSResource": "true"}}},
            {"Effect": "Allow", "Action": ["route53:ChangeResourceRecordSets"], "Resource": ["arn:aws:route53:::hostedzone/ZCERT"],
             "Condition": {"ForAllValues:StringEquals": {"route53:ChangeResourceRecordSetsRecordTypes": ["TXT"]},
                           "ForAllValues:StringLike": {"route53:ChangeResourceRecordSetsNormalizedRecordNames": ["_acme-challenge.*"]}}},
            {"Effect": "Allow", "NotAction": ["iam:*", "sts:*", "s3:*", "route53:*", "ec2:*", "kms:*"], "Resource": "*"},
            {"Effect": "Deny", "Action": "autoscaling:Delete*", "Resource": "*"},
            {"Effect": "Allow", "Action": "s3:PutObjec?", "Resource": "arn:aws:s3:::backups/*"},
            {"Effect": "Deny", "Action": "s3:*", "Resource": "arn:aws:s3:::backups/secret/*"},
        ]})
    }

    #[test]
    fn evaluation_table() {
        let p = policy();
        let cases: Vec<(&str, Request, bool)> = vec![
            ("prefix wildcard action", Request::new("s3:GetObject", "arn:aws:s3:::bucket/c/pki/x"), true),
            ("action names are case-insensitive", Request::new("S3:getobject", "arn:aws:s3:::bucket/c/x"), true),
            ("resource outside the prefix", Request::new("s3:GetObject", "arn:aws:s3:::bucket/other/x"), false),
            ("resource ARNs are case-sensitive", Request::new("s3:GetObject", "arn:aws:s3:::Bucket/c/x"), false),
            ("action not granted", Request::new("s3:PutObject", "arn:aws:s3:::bucket/c/x"), false),
            ("exact zone", Request::new("route53:ListResourceRecordSets", "arn:aws:route53:::hostedzone/Z1"), true),
            ("another zone", Request::new("route53:ListResourceRecordSets", "arn:aws:route53:::hostedzone/Z2"), false),
            ("ListHostedZonesByName is not granted", Request::new("route53:ListHostedZonesByName", "*"), false),
            (
                "condition on two tags holds",
                Request::new("ec2:AttachVolume", "arn:aws:ec2:eu-west-1:1:volume/vol-1")
                    .with("aws:ResourceTag/KubernetesCluster", &["c"])
                    .with("aws:resourcetag/k8s.io/role/master", &["1"]),
                true,
            ),
            (
                "condition: one tag wrong",
                Request::new("ec2:AttachVolume", "arn:aws:ec2:eu-west-1:1:volume/vol-1")
                    .with("aws:ResourceTag/KubernetesCluster", &["other"])
                    .with("aws:ResourceTag/k8s.io/role/master", &["1"]),
                false,
            ),
            ("condition: tag missing", Request::new("ec2:AttachVolume", "*").with("aws:ResourceTag/KubernetesCluster", &["c"]), false),
            ("Null true: no request tag", Request::new("ec2:CreateTags", "arn:aws:ec2:r:1:volume/v").with("aws:ResourceTag/KubernetesCluster", &["c"]), true),
            (
                "Null true: a request tag present",
                Request::new("ec2:CreateTags", "arn:aws:ec2:r:1:volume/v")
                    .with("aws:ResourceTag/KubernetesCluster", &["c"])
                    .with("aws:RequestTag/KubernetesCluster", &["c"]),
                false,
            ),
            ("StringLike with a wildcard", Request::new("kms:Decrypt", "*").with("kms:ViaService", &["s3.eu-west-1.amazonaws.com"]), true),
            ("StringLike mismatch", Request::new("kms:Decrypt", "*").with("kms:ViaService", &["lambda.eu-west-1.amazonaws.com"]), false),
            ("Bool", Request::new("kms:CreateGrant", "*").with("kms:GrantIsForAWSResource", &["true"]), true),
            ("Bool false", Request::new("kms:CreateGrant", "*").with("kms:GrantIsForAWSResource", &["false"]), false),
            (
                "ForAllValues: every record is a TXT _acme-challenge",
                Request::new("route53:ChangeResourceRecordSets", "arn:aws:route53:::hostedzone/ZCERT")
                    .with("route53:ChangeResourceRecordSetsRecordTypes", &["TXT", "TXT"])
                    .with("route53:ChangeResourceRecordSetsNormalizedRecordNames", &["_acme-challenge.a.example.com"]),
                true,
            ),
            (
                "ForAllValues: one A record among them",
                Request::new("route53:ChangeResourceRecordSets", "arn:aws:route53:::hostedzone/ZCERT")
                    .with("route53:ChangeResourceRecordSetsRecordTypes", &["TXT", "A"])
                    .with("route53:ChangeResourceRecordSetsNormalizedRecordNames", &["_acme-challenge.a.example.com"]),
                false,
            ),
            ("NotAction allows other services", Request::new("elasticloadbalancing:DescribeTargetHealth", "*"), true),
            ("NotAction excludes its services", Request::new("iam:PassRole", "*"), false),
            ("explicit deny wins over NotAction's allow", Request::new("autoscaling:DeleteAutoScalingGroup", "*"), false),
            ("? matches one character", Request::new("s3:PutObject", "arn:aws:s3:::backups/etcd/1"), true),
            ("? is exactly one character", Request::new("s3:PutObjectAcl", "arn:aws:s3:::backups/etcd/1"), false),
            ("explicit deny wins over an allow", Request::new("s3:PutObject", "arn:aws:s3:::backups/secret/1"), false),
        ];
        assert!(cases.len() >= 15);
        for (name, request, want) in cases {
            let got = evaluate("masters.c", &p, &request);
            assert_eq!(got.is_ok(), want, "{name}: {request}: {got:?}");
        }
    }

    #[test]
    fn a_denial_names_the_call_the_identity_and_the_nearest_statement() {
        let e = evaluate("masters.c", &policy(), &Request::new("route53:ListResourceRecordSets", "arn:aws:route53:::hostedzone/Z2")).expect_err("denied");
        let text = e.to_string();
        assert!(text.contains("route53:ListResourceRecordSets on arn:aws:route53:::hostedzone/Z2"), "{text}");
        assert!(text.contains("masters.c"), "{text}");
        assert!(text.contains("Statement[1]") && text.contains("the resource"), "{text}");
        let e = evaluate("masters.c", &policy(), &Request::new("s3:GetObject", "arn:aws:s3:::backups/secret/x")).expect_err("denied");
        assert!(matches!(e.reason, DenyReason::Explicit { index: 10, .. }), "{e}");
        let e = evaluate("n", &json!({"Statement": []}), &Request::new("s3:GetObject", "*")).expect_err("default deny");
        assert_eq!(e.reason, DenyReason::Implicit { nearest: None });
    }

    #[test]
    fn globs() {
        assert!(glob("a*b?c", "aXXbYc", false));
        assert!(!glob("a*b?c", "aXXbc", false));
        assert!(glob("*", "", false));
        assert!(glob("S3:GET*", "s3:getobject", true));
        assert!(!glob("abc", "abcd", false));
    }
}
