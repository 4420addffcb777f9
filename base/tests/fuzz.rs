//! Fuzz targets of what the control planes and nodes read from the network and the disk
//! (docs/fuzzing.md): the join server's request (Authorization header, signed STS request, body,
//! STS's answer, the challenge), GCE identity tokens, the etcd restore request, the hosts file.
//! Each runs `KEELSON_FUZZ_CASES` inputs (a few hundred by default, so `cargo test` stays fast);
//! a panic fails the test with the shrunk input. Crashes found are regression tests in `fuzz_regressions`
//! below.

use std::path::Path;

use base::etcd_backup::{parse_rfc3339, BackupId, MemberStatus, RestoreId, RestoreRequest};
use testkit::fuzz;

/// The default count of a plain `cargo test`: enough to catch a regression of a parser's
/// obvious paths in seconds on a debug build.
const CI_CASES: u32 = 300;

fn text(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(bytes)
}

#[cfg(feature = "aws")]
mod join {
    use super::*;
    use base::node_join::{self, JoinRequest};
    use std::time::{Duration, SystemTime};

    const STS_URL: &str = "https://sts.eu-west-1.amazonaws.com/";

    fn request_body() -> Vec<u8> {
        let (_, kubelet) = base::pki::csr("system:node:ip-10-0-1-5.eu-west-1.compute.internal").expect("csr");
        let (_, proxy) = base::pki::csr("system:kube-proxy").expect("csr");
        let r = JoinRequest {
            node_name: "ip-10-0-1-5.eu-west-1.compute.internal".into(),
            instance_id: "i-0123456789abcdef0".into(),
            csrs: [("kubelet".to_string(), kubelet), ("kube-proxy".to_string(), proxy)].into(),
        };
        serde_json::to_vec(&r).expect("json")
    }

    /// The join request body: JSON, the CSR names, the kubelet CSR's PEM and DER.
    #[test]
    fn join_request_body() {
        let seeds = vec![
            request_body(),
            br#"{"nodeName":"n","instanceId":"i-1","csrs":{"kubelet":"-----BEGIN CERTIFICATE REQUEST-----\nMA==\n-----END CERTIFICATE REQUEST-----\n"}}"#
                .to_vec(),
        ];
        fuzz::run("join-request", seeds, fuzz::cases(CI_CASES), |b| match node_join::parse_join_request(b) {
            Ok(_) => "accepted",
            Err(_) => "refused",
        });
    }

    /// The Authorization header, then the signed request's checks against one body at one time.
    #[test]
    fn join_authorization() {
        let body = request_body();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_790_000_000);
        let creds = aws_credential_types::Credentials::new("AKIDEXAMPLE", "secret", Some("token".into()), None, "fuzz");
        let signed = node_join::sign(&creds, "eu-west-1", STS_URL, &body, now).expect("sign");
        let header = node_join::authorization(&signed).expect("header");
        // The header, and the signed request's JSON inside it (re-encoded by the target), as seeds.
        let seeds = vec![header.into_bytes(), serde_json::to_vec(&signed).expect("json")];
        fuzz::run("join-authorization", seeds, fuzz::cases(CI_CASES), |b| {
            let value = text(b);
            let parsed = match value.strip_prefix('{') {
                // A mutated signed request: carried as the server receives it.
                Some(_) => {
                    use base64::Engine as _;
                    node_join::parse_authorization(&format!("{} {}", node_join::AUTH_SCHEME, base64::engine::general_purpose::STANDARD.encode(b)))
                }
                None => node_join::parse_authorization(&value),
            };
            match parsed {
                Err(_) => "refused header",
                Ok(signed) => match node_join::check_signed(&signed, STS_URL, &body, now) {
                    Ok(()) => "signed request accepted",
                    Err(_) => "signed request refused",
                },
            }
        });
    }

    /// STS's GetCallerIdentity answer (XML), then the identity checks the server makes on it.
    #[test]
    fn sts_caller_identity() {
        let seeds = vec![br#"<GetCallerIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <GetCallerIdentityResult>
    <Arn>arn:aws:sts::123456789012:assumed-role/nodes.example.com/i-0123456789abcdef0</Arn>
    <UserId>AROAEXAMPLE:i-0123456789abcdef0</UserId>
    <Account>123456789012</Account>
  </GetCallerIdentityResult>
  <ResponseMetadata><RequestId>01234567-89ab-cdef-0123-456789abcdef</RequestId></ResponseMetadata>
</GetCallerIdentityResponse>
"#
        .to_vec()];
        fuzz::run("sts-caller-identity", seeds, fuzz::cases(CI_CASES), |b| match node_join::parse_caller_identity(&text(b)) {
            Err(_) => "refused",
            Ok(c) => {
                let _ = c.partition();
                match c.assumed_role() {
                    Some(_) => "instance role",
                    None => "other identity",
                }
            }
        });
    }

    /// Both sides of the join challenge: the node reads the server's line, the server the answer.
    #[test]
    fn join_challenge() {
        let nonce = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let body = base::sha256_hex(b"{}");
        let seeds = vec![node_join::challenge_line(nonce).into_bytes(), format!("{nonce} {body}\n").into_bytes()];
        fuzz::run("join-challenge", seeds, fuzz::cases(CI_CASES), |b| {
            let line = text(b);
            let answered = node_join::answer_challenge(&line, &body).is_ok();
            match (answered, node_join::check_challenge_answer(&line, nonce, &body).is_ok()) {
                (true, _) => "challenge read",
                (_, true) => "answer accepted",
                _ => "refused",
            }
        });
    }
}

/// A GCE identity token in the Authorization header, verified against a key set: as sent (the
/// signature refuses every mutation, so this reaches the header, the encoding and the key lookup).
#[test]
fn gce_identity_token() {
    let signer = testkit::gce_metadata::Signer::generate("fuzz-key").expect("test RSA key (openssl)");
    let keys = base::node_join_gce::JwkSet { keys: vec![signer.jwk()] };
    let facts = testkit::gce_metadata::InstanceFacts::example();
    let body = b"{}";
    let now = 1_790_000_000;
    let token = signer.identity_token(&facts, &base::node_join_gce::audience(body), true, now);
    let seeds = vec![base::node_join_gce::authorization(&token).into_bytes()];
    fuzz::run("gce-identity-token", seeds, fuzz::cases(CI_CASES), |b| {
        let value = text(b);
        let Some(token) = base::node_join_gce::parse_authorization(&value) else { return "refused header" };
        match base::node_join_gce::verify(token, &keys, body, now, base::node_join_gce::MAX_AGE_SECS) {
            Ok(_) => "verified",
            Err(_) => "refused token",
        }
    });
}

/// A GCE identity token's claims, mutated and then signed with the key the verifier trusts: what
/// only Google could send, read past the signature (each input costs an RSA signature, so this
/// target runs a twentieth of the others' count).
#[test]
fn gce_identity_claims() {
    let signer = testkit::gce_metadata::Signer::generate("fuzz-key").expect("test RSA key (openssl)");
    let keys = base::node_join_gce::JwkSet { keys: vec![signer.jwk()] };
    let body = b"{}";
    let now = 1_790_000_000u64;
    let claims = serde_json::json!({
        "iss": "https://accounts.google.com", "aud": base::node_join_gce::audience(body), "azp": "1", "sub": "1", "iat": now, "exp": now + 3600,
        "google": {"compute_engine": {"instance_creation_timestamp": now - 600, "instance_id": "4567", "instance_name": "nodes-a-x1",
            "project_id": "p", "project_number": 1234, "zone": "europe-west1-b"}}
    });
    let seeds = vec![serde_json::to_vec(&claims).expect("json")];
    fuzz::run("gce-identity-claims", seeds, (fuzz::cases(CI_CASES) / 20).max(20), |b| {
        let Ok(claims) = serde_json::from_slice::<serde_json::Value>(b) else { return "not JSON" };
        let token = signer.sign(&claims);
        match base::node_join_gce::verify(&token, &keys, body, now, base::node_join_gce::MAX_AGE_SECS) {
            Ok(_) => "verified",
            Err(_) => "refused claims",
        }
    });
}

/// `control/restore.json` (anyone who can write the state store chooses it) and the members'
/// status files, then what a member derives from the request.
#[test]
fn restore_request() {
    let req = RestoreRequest {
        id: RestoreId::parse("1790000000-4242").expect("id"),
        backup: "2026-11-30T10:00:00Z".into(),
        phase: base::etcd_backup::RestorePhase::Stop,
        members: vec!["a".into(), "b".into(), "c".into()],
        requested_at: "2026-12-01T09:00:00Z".into(),
        requested_by: "keelson etcd backup restore".into(),
    };
    let status = MemberStatus {
        request: "1790000000-4242".into(),
        member: "a".into(),
        state: base::etcd_backup::MemberState::Restored,
        at: "2026-12-01T09:01:00Z".into(),
        detail: String::new(),
        revision: Some(42),
        cluster_id: Some("cdf818194e3a8c32".into()),
        started_members: Some(3),
    };
    let seeds = vec![serde_json::to_vec_pretty(&req).expect("json"), serde_json::to_vec_pretty(&status).expect("json")];
    fuzz::run("restore-request", seeds, fuzz::cases(CI_CASES), |b| {
        if let Ok(r) = serde_json::from_slice::<RestoreRequest>(b) {
            let _ = r.cluster_token("main", "example.com");
            let _ = BackupId::parse(&r.backup);
            let _ = parse_rfc3339(&r.requested_at);
            return "restore request";
        }
        if let Ok(s) = serde_json::from_slice::<MemberStatus>(b) {
            let _ = RestoreId::parse(&s.request);
            let _ = parse_rfc3339(&s.at);
            return "member status";
        }
        "refused"
    });
}

/// The node's `/etc/hosts` and the pods' copies (writable by the pods): the managed block read,
/// and the text an update would write.
#[test]
fn hosts_file() {
    let block = format!(
        "{}\n10.0.1.5\tapi.internal.example.com kops-controller.internal.example.com\n10.0.2.6\tapi.internal.example.com\n{}\n",
        base::hosts::BEGIN,
        base::hosts::END
    );
    let seeds = vec![
        format!("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n\n{block}# after\n").into_bytes(),
        format!("{}\n127.0.0.1 localhost\n{block}", base::hosts::KUBELET_HOST_NETWORK_HEADER).into_bytes(),
    ];
    let path = Path::new("/etc/hosts");
    let want: base::hosts::Entries = [("api.internal.example.com".to_string(), vec!["10.0.1.7".to_string()])].into();
    fuzz::run("hosts-file", seeds, fuzz::cases(CI_CASES), |b| {
        let Ok(t) = std::str::from_utf8(b) else { return "not UTF-8" };
        match base::hosts::parse(t, path) {
            Err(_) => "refused",
            Ok(entries) => {
                // The rewrite keeps what is outside the block and reads back as exactly `want`.
                if let Ok(Some((new, _))) = base::hosts::rewrite(t, &want, path) {
                    assert_eq!(base::hosts::parse(&new, path).ok().as_ref(), Some(&want), "the rewritten block does not read back:\n{new}");
                }
                if entries.is_empty() {
                    "no block"
                } else {
                    "block read"
                }
            }
        }
    });
}

/// A keyset document from the state store (what control planes, protokube and `keelson` read;
/// whoever can write the store writes it): parsed, then every operation a rotation runs on it. What
/// parses round-trips through its own document, its trust bundle starts with the primary, and
/// promote and distrust keep the primary trusted.
#[test]
fn keyset_document() {
    use base::keyset::Keyset;
    let one = base::pki::create_ca("kubernetes-ca").expect("ca");
    let two = base::pki::create_ca("kubernetes-ca").expect("ca");
    let mut set = Keyset::single("kubernetes-ca", "100", &one);
    set.add(base::keyset::KeysetKey { id: "200".into(), cert_pem: two.cert_pem, key_pem: Some(two.key_pem), distrust_timestamp: None }, false).expect("add");
    let seeds = vec![set.to_yaml(true).expect("yaml").into_bytes(), set.to_yaml(false).expect("yaml").into_bytes()];
    fuzz::run("keyset", seeds, fuzz::cases(CI_CASES), |b| {
        let Ok(mut k) = Keyset::parse("kubernetes-ca", b) else { return "refused" };
        let again = Keyset::parse("kubernetes-ca", k.to_yaml(true).expect("a parsed keyset renders").as_bytes()).expect("a rendered keyset parses");
        assert_eq!(again, k, "the document does not round-trip");
        assert!(k.trust_bundle().starts_with(k.primary().cert_pem.trim_end()), "the bundle does not start with the primary");
        let _ = k.primary_keypair();
        if k.promote(None).is_ok() {
            assert!(k.primary().trusted(), "promoted a distrusted key");
        }
        let _ = k.distrust(&[], "2026-12-04T00:00:00Z");
        assert!(k.keys.iter().any(|x| x.id == k.primary_id && x.trusted()) || !k.primary().trusted(), "distrust took the primary");
        "parsed"
    });
}
