//! Inputs the fuzz targets (`tests/fuzz.rs`, docs/fuzzing.md) found crashing, kept as they were found.

use base::node_join_gce::{audience, verify, IdentityError, JwkSet, MAX_AGE_SECS};

/// gce-identity-claims, 2026-12-02: a validly signed token with `exp` = u64::MAX overflowed the
/// expiry check (`exp + skew`), a panic in the join server on a debug build and a wrap in a
/// release one. The claims are what whoever signs chooses; the check saturates now.
#[test]
fn a_token_expiring_at_u64_max_is_judged_not_overflowed() {
    let signer = testkit::gce_metadata::Signer::generate("fuzz-key").expect("test RSA key (openssl)");
    let keys = JwkSet { keys: vec![signer.jwk()] };
    let now = 1_790_000_000u64;
    let claims = |exp: u64, iat: u64| {
        serde_json::json!({
            "aud": audience(b"{}"), "azp": "1", "exp": exp, "iat": iat, "iss": "https://accounts.google.com", "sub": "1",
            "google": {"compute_engine": {"instance_creation_timestamp": 1789999400u64, "instance_id": "4567", "instance_name": "nodes-a-x1",
                "project_id": "p", "project_number": 1234, "zone": "europe-west1-b"}}
        })
    };
    // As found: a fresh token (iat now) that never expires is read, by its age.
    let id = verify(&signer.sign(&claims(u64::MAX, now)), &keys, b"{}", now, MAX_AGE_SECS).expect("a fresh token");
    assert_eq!(id.instance_id, "4567");
    // Issued at the end of time: in the future, refused, without overflowing either.
    let err = verify(&signer.sign(&claims(u64::MAX, u64::MAX)), &keys, b"{}", now, MAX_AGE_SECS).expect_err("from the future");
    assert!(matches!(err, IdentityError::Time(_)), "{err}");
}
