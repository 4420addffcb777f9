//! The IAM oracle's record of moto's requests (`moto_server.py` fix 10) and its parse, over real
//! recorded requests: `fixtures/moto_calls/boto3.jsonl` (botocore's S3, Route53, EC2 and STS
//! calls) and `fixtures/moto_calls/keelson_local/calls.jsonl` (calls of protokube, nodeup and the AWS
//! cloud-controller-manager on keelson-local machines, recorded by an e2e run; keys and
//! signatures are the run's). Needs moto for the recording test; fails with a message saying so.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;

use serde_json::json;
use testkit::moto_calls::{call, check, parse, read, signer, Identities, Recorded};

fn fixture(name: &str) -> Vec<Recorded> {
    read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/moto_calls").join(name)).expect("fixture")
}

fn operations(records: &[Recorded]) -> Vec<String> {
    records
        .iter()
        .filter_map(|r| signer(r).map(|s| (r, s)))
        .map(|(r, s)| call(r, &s).map(|c| format!("{}:{}", s.service, c.operation)).unwrap_or_else(|e| format!("unmapped: {e}")))
        .collect()
}

#[test]
fn boto3_requests_map_to_their_operations() {
    let records = fixture("boto3.jsonl");
    assert_eq!(
        operations(&records),
        [
            "s3:CreateBucket",
            "s3:PutObject",
            "s3:GetObject",
            "s3:CreateMultipartUpload",
            "s3:AbortMultipartUpload",
            "s3:ListObjectsV2",
            "route53:CreateHostedZone",
            "route53:ListHostedZonesByName",
            "route53:ListResourceRecordSets",
            "ec2:DescribeInstances",
            "sts:GetCallerIdentity",
        ]
    );
    assert!(records.iter().all(|r| signer(r).is_some_and(|s| s.access_key == "AKIDTEST" && s.region == "eu-west-1")));
}

/// A policy that grants the fixture's calls but `s3:AbortMultipartUpload` and
/// `route53:ListHostedZonesByName` (the two defects the oracle must catch).
#[test]
fn a_missing_grant_is_a_finding_naming_call_identity_and_nearest_statement() {
    let records = fixture("boto3.jsonl");
    let roles = BTreeMap::from([("AKIDTEST".to_string(), "masters.c".to_string())]);
    let full = json!({"Statement": [
        {"Effect": "Allow", "Action": ["s3:*"], "Resource": ["arn:aws:s3:::bucket-b", "arn:aws:s3:::bucket-b/*"]},
        {"Effect": "Allow", "Action": ["route53:*"], "Resource": "*"},
        {"Effect": "Allow", "Action": ["ec2:DescribeInstances"], "Resource": "*"},
    ]});
    let no_tags = |_: &str| BTreeMap::new();
    let policies = BTreeMap::from([("masters.c".to_string(), vec![full])]);
    let ids = Identities { roles: &roles, policies: &policies, account: "123456789012", tags: &no_tags };
    let r = check(&records, &ids);
    assert!(r.clean(), "{r}");
    assert_eq!((r.requests, r.by_roles, r.per_role.get("masters.c").copied()), (11, 11, Some(11)));

    let narrow = json!({"Statement": [
        {"Effect": "Allow", "Action": ["s3:CreateBucket", "s3:GetObject", "s3:PutObject", "s3:ListBucket"], "Resource": ["arn:aws:s3:::bucket-b", "arn:aws:s3:::bucket-b/*"]},
        {"Effect": "Allow", "Action": ["route53:CreateHostedZone", "route53:ListResourceRecordSets"], "Resource": "*"},
        {"Effect": "Allow", "Action": ["ec2:DescribeInstances"], "Resource": "*"},
    ]});
    let policies = BTreeMap::from([("masters.c".to_string(), vec![narrow])]);
    let r = check(&records, &Identities { policies: &policies, ..ids });
    let text = r.to_string();
    assert_eq!(r.denied.len(), 2, "{text}");
    assert!(text.contains("IAM denies s3:AbortMultipartUpload on arn:aws:s3:::bucket-b/c/backups/1 to masters.c"), "{text}");
    assert!(text.contains("IAM denies route53:ListHostedZonesByName on * to masters.c"), "{text}");
    assert!(text.contains("nearest is Statement[0]") && text.contains("nearest is Statement[1]"), "{text}");
    assert!(text.contains("s3/AbortMultipartUpload (DELETE http://127.0.0.1:5999/bucket-b/c/backups/1?uploadId="), "the call: {text}");

    // Requests signed by keys of no role (the operator's) are not checked.
    let r = check(&records, &Identities { roles: &BTreeMap::new(), ..ids });
    assert_eq!((r.by_roles, r.authorizations, r.denied.len()), (0, 0, 0));
}

#[test]
fn keelson_local_requests_map_to_their_operations() {
    let records = fixture("keelson_local/calls.jsonl");
    let ops = operations(&records);
    assert!(ops.iter().all(|o| !o.starts_with("unmapped")), "{ops:#?}");
    for want in [
        "route53:ListHostedZonesByName",
        "route53:ChangeResourceRecordSets",
        "ec2:AttachVolume",
        "ec2:CreateTags",
        "s3:GetObject",
        "s3:PutObject",
        "ec2:DescribeInstances",
        "elasticloadbalancing:RegisterTargets",
    ] {
        assert!(ops.iter().any(|o| o == want), "{want} in {ops:#?}");
    }
}

/// moto records a signed Query request with its form body, and an S3 upload without its object.
#[test]
fn moto_records_every_request_with_its_signer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let calls = dir.path().join("calls.jsonl");
    let moto = testkit::moto::Moto::start_recording(&dir.path().join("moto.log"), &calls).unwrap_or_else(|e| panic!("this test needs moto: {e}"));
    let send = |head: &str, body: &str| {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", moto.port)).expect("connect");
        write!(s, "{head}Host: 127.0.0.1:{}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", moto.port, body.len()).expect("send");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("answer");
        out
    };
    let auth = |service: &str| {
        format!("Authorization: AWS4-HMAC-SHA256 Credential=ASIAX/20261202/eu-west-1/{service}/aws4_request, SignedHeaders=host, Signature=0\r\n")
    };
    let out =
        send(&format!("POST / HTTP/1.1\r\n{}Content-Type: application/x-www-form-urlencoded\r\n", auth("ec2")), "Action=DescribeVolumes&Version=2016-11-15");
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    send(&format!("PUT /bucket-recorded HTTP/1.1\r\n{}", auth("s3")), "");
    let secret = "the object's bytes stay out of the record";
    send(&format!("PUT /bucket-recorded/k HTTP/1.1\r\n{}Content-Type: application/octet-stream\r\n", auth("s3")), secret);
    let records = read(&calls).expect("the record");
    let text = std::fs::read_to_string(&calls).expect("record");
    assert!(!text.contains(secret), "{text}");
    let ops = operations(&records);
    assert_eq!(ops, ["ec2:DescribeVolumes", "s3:CreateBucket", "s3:PutObject"], "the warm-up is unsigned and not an operation: {text}");
    assert_eq!(records.iter().filter(|r| signer(r).is_none()).count(), 1, "moto's own warm-up request, unsigned: {text}");
    assert!(parse(&text).is_ok());
}

/// A client that goes away after its headers (a machine killed mid-request) leaves moto a request
/// whose body never arrived: the record says how much did, and the oracle reports it as cut off —
/// not as an unmappable call, not as a call it allowed (AWS never serves a body its signature does
/// not cover). A whole request with no Action is still unmapped.
#[test]
fn a_request_cut_off_before_its_body_is_reported_apart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let calls = dir.path().join("calls.jsonl");
    let moto = testkit::moto::Moto::start_recording(&dir.path().join("moto.log"), &calls).unwrap_or_else(|e| panic!("this test needs moto: {e}"));
    let auth = "Authorization: AWS4-HMAC-SHA256 Credential=ASIAX/20261202/eu-west-1/ec2/aws4_request, SignedHeaders=host, Signature=0\r\n";
    let send = |declared: usize, body: &str| {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", moto.port)).expect("connect");
        write!(
            s,
            "POST / HTTP/1.1\r\n{auth}Content-Type: application/x-www-form-urlencoded\r\nHost: 127.0.0.1:{}\r\nContent-Length: {declared}\r\nConnection: close\r\n\r\n{body}",
            moto.port
        )
        .expect("send");
        s.shutdown(std::net::Shutdown::Write).expect("half-close");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
    };
    let body = "Action=DescribeVolumes&Version=2016-11-15";
    send(body.len(), "");
    send(body.len(), &body[..10]);
    send(12, "Version=2016");
    let records: Vec<Recorded> = read(&calls).expect("the record").into_iter().filter(|r| signer(r).is_some()).collect();
    assert_eq!(records.len(), 3, "{records:#?}");
    assert_eq!(records.iter().map(|r| (r.declared, r.received)).collect::<Vec<_>>(), [(Some(41), Some(0)), (Some(41), Some(10)), (Some(12), Some(12))]);
    let roles = BTreeMap::from([("ASIAX".to_string(), "masters.c".to_string())]);
    let policies = BTreeMap::from([("masters.c".to_string(), vec![json!({"Statement": [{"Effect": "Allow", "Action": "ec2:*", "Resource": "*"}]})])]);
    let no_tags = |_: &str| BTreeMap::new();
    let r = check(&records, &Identities { roles: &roles, policies: &policies, account: "123456789012", tags: &no_tags });
    let text = r.to_string();
    assert_eq!((r.incomplete.len(), r.unmapped.len(), r.authorizations), (2, 1, 0), "{text}");
    assert!(text.contains("0 of the 41 bytes") && text.contains("10 of the 41 bytes"), "{text}");
    assert!(text.contains("neither Action nor X-Amz-Target") && text.contains("declared Some(12), received Some(12)"), "{text}");
    assert!(!r.clean(), "the whole request with no Action still fails the oracle");
}
