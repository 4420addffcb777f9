//! Node join by GCE identity, the token half: tokens as the (harness's) metadata server issues
//! them, signed RS256 like Google's, verified by `base::node_join_gce::verify`. Each check is shown
//! refusing the token that would get past it if it were missing.

use std::sync::Arc;

use base::node_join_gce::{audience, verify, IdentityError, JwkSet};
use testkit::gce_metadata::{self, InstanceFacts, Signer};

fn facts() -> InstanceFacts {
    InstanceFacts::example()
}

const BODY: &[u8] = br#"{"csr":"-----BEGIN CERTIFICATE REQUEST-----"}"#;
const MAX_AGE: u64 = 300;

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs()
}

#[test]
fn a_fresh_token_for_this_body_names_the_instance_and_every_check_refuses_its_forgery() {
    let google = Signer::generate("google-1").expect("key");
    let keys = JwkSet { keys: vec![google.jwk()] };
    let t = now();
    let good = google.identity_token(&facts(), &audience(BODY), true, t);
    let id = verify(&good, &keys, BODY, t, MAX_AGE).expect("verifies");
    assert_eq!(
        (id.project_id.as_str(), id.project_number.as_str(), id.zone.as_str(), id.instance_id.as_str(), id.instance_name.as_str()),
        ("acme-prod", "123456789012", "europe-west1-b", "4471938521837465123", "nodes-europe-west1-b-x7k2")
    );

    // Another request's body: the token was bound to the first.
    assert!(matches!(verify(&good, &keys, br#"{"csr":"other"}"#, t, MAX_AGE), Err(IdentityError::Audience { .. })));
    // A key that is not Google's, under Google's key id: the signature does not verify.
    let attacker = Signer::generate("google-1").expect("key");
    let forged = attacker.identity_token(&facts(), &audience(BODY), true, t);
    assert_eq!(verify(&forged, &keys, BODY, t, MAX_AGE), Err(IdentityError::Signature));
    // Under its own key id: not one of Google's keys.
    let own = Signer::generate("attacker").expect("key").identity_token(&facts(), &audience(BODY), true, t);
    assert_eq!(verify(&own, &keys, BODY, t, MAX_AGE), Err(IdentityError::UnknownKey("attacker".into())));
    // A genuine token whose claims were edited (another instance's name): the signature breaks.
    let mut parts: Vec<String> = good.split('.').map(str::to_string).collect();
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let payload = String::from_utf8(b64.decode(&parts[1]).expect("payload")).expect("utf-8").replace("nodes-europe-west1-b-x7k2", "control-plane-a");
    parts[1] = b64.encode(payload);
    assert_eq!(verify(&parts.join("."), &keys, BODY, t, MAX_AGE), Err(IdentityError::Signature));
    // `alg: none` is not accepted, signature or not.
    let none = format!("{}.{}.", b64.encode(r#"{"alg":"none","kid":"google-1"}"#), good.split('.').nth(1).expect("payload"));
    assert_eq!(verify(&none, &keys, BODY, t, MAX_AGE), Err(IdentityError::Algorithm("none".into())));
    // Old tokens: expired, or older than the server accepts; and one from the future.
    let old = google.identity_token(&facts(), &audience(BODY), true, t - 7200);
    assert!(matches!(verify(&old, &keys, BODY, t, MAX_AGE), Err(IdentityError::Time(m)) if m.contains("expired")));
    let stale = google.identity_token(&facts(), &audience(BODY), true, t - 600);
    assert!(matches!(verify(&stale, &keys, BODY, t, MAX_AGE), Err(IdentityError::Time(m)) if m.contains("at most 300")));
    let future = google.identity_token(&facts(), &audience(BODY), true, t + 600);
    assert!(matches!(verify(&future, &keys, BODY, t, MAX_AGE), Err(IdentityError::Time(m)) if m.contains("future")));
    // A token without the instance claims (format=standard) names no instance.
    let standard = google.identity_token(&facts(), &audience(BODY), false, t);
    assert_eq!(verify(&standard, &keys, BODY, t, MAX_AGE), Err(IdentityError::NotAnInstance));
    // Signed by Google's key but issued by someone else.
    let claims = serde_json::json!({"iss": "https://evil.example", "aud": audience(BODY), "iat": t, "exp": t + 3600});
    assert_eq!(verify(&google.sign(&claims), &keys, BODY, t, MAX_AGE), Err(IdentityError::Issuer("https://evil.example".into())));
}

#[tokio::test]
async fn the_node_gets_its_token_from_the_metadata_server_for_its_own_body() {
    let google = Arc::new(Signer::generate("google-1").expect("key"));
    let keys = JwkSet { keys: vec![google.jwk()] };
    let server = gce_metadata::start_with_identity(&facts(), google);
    let md = base::gce_metadata::GceMetadata::new(Some(&server.addr().to_string()), std::time::Duration::from_secs(5)).expect("client");
    let aud = audience(BODY);
    let token = md.get(&format!("{}?audience={aud}&format=full", gce_metadata::IDENTITY_PATH)).await.expect("identity").expect("a token");
    let id = verify(&token, &keys, BODY, now(), MAX_AGE).expect("verifies");
    assert_eq!(id.instance_id, "4471938521837465123");
}
