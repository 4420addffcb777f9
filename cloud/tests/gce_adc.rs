//! Application Default Credentials off GCE: Keelson's token source trades a service-account key
//! (an RS256 JWT assertion) and a gcloud user login (a refresh token) at the token endpoint a
//! credentials file names — testkit's endpoint checks them as Google does, and Google's own Go
//! client passes the same checks (testkit/tests/gce_api_wire.rs). Tokens are cached; a key the
//! endpoint does not know, or a revoked refresh token, is an error naming the endpoint and Google's
//! reason, never the secret. The token then authorises Compute calls.

use std::time::Duration;

use cloud::gce::adc::{self, Credentials};
use cloud::gce::{GoogleApi, TokenSource};
use testkit::google_oauth::{self, Accepts, TokenEndpoint};

const EMAIL: &str = "keelson-ci@acme-prod.iam.gserviceaccount.com";

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

fn read(path: &std::path::Path) -> Credentials {
    adc::parse(path, &std::fs::read_to_string(path).expect("read")).expect("parse")
}

fn public_key(c: &Credentials) -> Vec<u8> {
    match c {
        Credentials::ServiceAccount(sa) => sa.public_key_der(),
        Credentials::AuthorizedUser(_) => panic!("a service account"),
    }
}

#[test]
fn a_service_account_key_is_traded_for_a_cached_token_that_compute_accepts() {
    let dir = tempfile::tempdir().expect("tmp");
    let endpoint = TokenEndpoint::start(Accepts::default());
    let file = google_oauth::service_account_file(dir.path(), "sa.json", EMAIL, &endpoint.url()).expect("key file");
    let creds = read(&file);
    endpoint.accept(Accepts { service_account: Some((EMAIL.into(), public_key(&creds))), user: None });

    let compute = testkit::gce_compute::GceCompute::new(testkit::gce_compute::Config::example());
    let server = compute.start_with(None);
    let tokens = TokenSource::from_credentials(creds, Duration::from_secs(10)).expect("token source");
    rt().block_on(async {
        assert_eq!(tokens.token().await.expect("token"), "ya29.local-1");
        assert_eq!(tokens.token().await.expect("cached"), "ya29.local-1", "cached until shortly before it expires");
        let api = GoogleApi::new(tokens.clone(), Duration::from_secs(10)).expect("api");
        let project = api.get(&server.url("compute/v1/projects/acme-prod")).await.expect("projects.get with the ADC token");
        assert_eq!(project["name"], "acme-prod");
    });
    assert_eq!(endpoint.issued().len(), 1, "one token request");
}

#[test]
fn an_unknown_key_and_a_revoked_login_are_refused_naming_the_endpoint_not_the_secret() {
    let dir = tempfile::tempdir().expect("tmp");
    let endpoint = TokenEndpoint::start(Accepts::default());
    let known = google_oauth::service_account_file(dir.path(), "known.json", EMAIL, &endpoint.url()).expect("key file");
    let other = google_oauth::service_account_file(dir.path(), "other.json", EMAIL, &endpoint.url()).expect("another key, same account");
    endpoint
        .accept(Accepts { service_account: Some((EMAIL.into(), public_key(&read(&known)))), user: Some(("cid".into(), "s3cr3t".into(), "1//good".into())) });
    let revoked = google_oauth::user_file(dir.path(), "cid", "s3cr3t", "1//revoked", &endpoint.url()).expect("user file");
    rt().block_on(async {
        let e =
            TokenSource::from_credentials(read(&other), Duration::from_secs(10)).expect("source").token().await.expect_err("a key the account does not have");
        let text = e.to_string();
        assert!(text.contains(&endpoint.url()) && text.contains("invalid_grant") && text.contains("Invalid JWT Signature"), "{text}");
        assert!(!text.contains("PRIVATE KEY"), "{text}");
        let e = TokenSource::from_credentials(read(&revoked), Duration::from_secs(10)).expect("source").token().await.expect_err("revoked");
        let text = e.to_string();
        assert!(text.contains("invalid_grant") && !text.contains("1//revoked") && !text.contains("s3cr3t"), "{text}");
        let good = google_oauth::user_file(dir.path(), "cid", "s3cr3t", "1//good", &endpoint.url()).expect("user file");
        assert_eq!(TokenSource::from_credentials(read(&good), Duration::from_secs(10)).expect("source").token().await.expect("user token"), "ya29.local-1");
    });
    // The assertion checks themselves: an expired or foreign-audience JWT fails, so the good one
    // above passed for its claims, not for want of checking.
    let Credentials::ServiceAccount(sa) = read(&known) else { panic!("sa") };
    let old = adc::assertion(&sa, 1_000_000).expect("assertion");
    assert!(google_oauth::check_assertion(&old, EMAIL, &sa.public_key_der(), &endpoint.url()).expect_err("stale").contains("short-lived"));
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs();
    let fresh = adc::assertion(&sa, now).expect("assertion");
    assert!(google_oauth::check_assertion(&fresh, EMAIL, &sa.public_key_der(), "http://elsewhere/token").expect_err("audience").contains("audience"));
}
