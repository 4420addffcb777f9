//! The harness's Compute Engine and Cloud DNS emulators against Google's own Go clients
//! (`google.golang.org/api/compute/v1` and `dns/v1`, from the Go module proxy): a kOps-like
//! sequence — network, subnetwork, firewall, template, MIG, managed instances, an instance of no MIG
//! (`instances.insert` from the template), a labelled disk found by filter, attached, refused to a
//! second writer, labels and metadata by fingerprint, recreate, resize, operations waited on, a DNS
//! change and its record sets — must parse and check out on the
//! Go side, and what the Go program did must show on the emulators' Rust side. Needs Go.
//!
//! The Go program is built once per source (a hash of its files names the binary under
//! `CARGO_TARGET_TMPDIR`), so a second run only runs it.

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::Digest as _;
use testkit::cloud_dns::{CloudDns, DnsConfig};
use testkit::gce_compute::{Config, GceCompute};

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/gce_api_wire");

/// Build the Go program (or reuse the binary built from the same sources); once per process, as
/// the tests run in parallel.
fn go_binary() -> PathBuf {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(build_go_binary).clone()
}

fn build_go_binary() -> PathBuf {
    let go = which("go").unwrap_or_else(|| panic!("this test needs Go (Google's Compute and DNS clients are Go); go not found on PATH"));
    let files = ["main.go", "go.mod.in", "go.sum.in"];
    let mut h = sha2::Sha256::new();
    for f in files {
        h.update(std::fs::read(Path::new(SRC).join(f)).unwrap_or_else(|e| panic!("{SRC}/{f}: {e}")));
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("gce-api-wire-{}", &hex::encode(h.finalize())[..16]));
    let bin = dir.join("gce-api-wire");
    if bin.is_file() {
        return bin;
    }
    std::fs::create_dir_all(&dir).expect("build dir");
    std::fs::copy(Path::new(SRC).join("main.go"), dir.join("main.go")).expect("main.go");
    std::fs::copy(Path::new(SRC).join("go.mod.in"), dir.join("go.mod")).expect("go.mod");
    std::fs::copy(Path::new(SRC).join("go.sum.in"), dir.join("go.sum")).expect("go.sum");
    let build = Command::new(&go).args(["build", "-mod=mod", "-o", "gce-api-wire.tmp", "."]).current_dir(&dir).output().expect("go build");
    assert!(build.status.success(), "go build (modules from the Go module proxy): {}", String::from_utf8_lossy(&build.stderr));
    std::fs::rename(dir.join("gce-api-wire.tmp"), &bin).expect("binary in place");
    bin
}

#[test]
fn googles_go_clients_drive_the_compute_and_dns_emulators() {
    let bin = go_binary();
    let compute = GceCompute::new(Config::example());
    let dns = CloudDns::new(DnsConfig::example());
    let server = compute.start_with(Some(dns.clone()));
    let out = Command::new(&bin).arg(server.url("")).output().expect("run the Go client");
    assert!(out.status.success(), "Go client against the emulators:\n{}", String::from_utf8_lossy(&out.stderr));
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON from the Go program");

    // A new operation was seen before it was done.
    assert!(matches!(got["first_op_status"].as_str(), Some("PENDING" | "RUNNING")), "{got}");
    // What Google's client did is what the data plane sees.
    let recreated = got["recreated"].as_str().expect("recreated instance");
    let v = compute.instance("europe-west1-b", recreated).expect("the recreated instance, same name");
    assert_eq!(v.id, got["recreated_id"].as_str().unwrap(), "its new id");
    assert_eq!(v.user_data(), Some("#!/bin/bash\necho keelson\n"));
    assert_eq!(v.metadata.get("cluster-name").map(String::as_str), Some("gce-k8s"));
    assert!(v.network_ip.starts_with("10.0.1"), "{}", v.network_ip);
    assert_eq!(got["final_instances"], 2);
    assert_eq!(compute.instances().len(), 2);
    let disk = compute.disk("europe-west1-b", "a-etcd-main-gce-k8s").expect("the etcd disk");
    assert_eq!(disk.labels.get("k8s-io-role-master").map(String::as_str), Some("master"));
    assert!(disk.users.is_empty(), "detached: {:?}", disk.users);
    // DNS: the replaced A record, beside the zone's SOA and NS.
    assert_eq!(got["api_record"], "10.0.16.4");
    assert_eq!(got["rrset_count"], 3);
    assert_eq!(dns.a_records().get("api.internal.gce.k8s.example.com.").cloned(), Some(vec!["10.0.16.4".to_string()]));
}

/// Google's own OAuth client (`golang.org/x/oauth2/google`, `CredentialsFromJSON`) trades a
/// service-account key and a gcloud user login at the local token endpoint: what the endpoint
/// checks is what Google's client sends, so Keelson's ADC client is checked against the same
/// endpoint (cloud/tests/gce_adc.rs) and not against a dialect of our own.
#[test]
fn googles_go_oauth2_client_trades_credentials_at_the_local_token_endpoint() {
    use testkit::google_oauth::{self, Accepts, TokenEndpoint};
    let bin = go_binary();
    let dir = tempfile::tempdir().expect("tmp");
    let email = "keelson-ci@acme-prod.iam.gserviceaccount.com";
    let endpoint = TokenEndpoint::start(Accepts::default());
    let sa = google_oauth::service_account_file(dir.path(), "sa.json", email, &endpoint.url()).expect("key file");
    let base::gce_adc::Credentials::ServiceAccount(parsed) = base::gce_adc::parse(&sa, &std::fs::read_to_string(&sa).expect("read")).expect("parse") else {
        panic!("a service account")
    };
    endpoint.accept(Accepts {
        service_account: Some((email.to_string(), parsed.public_key_der())),
        user: Some(("client-1.apps.googleusercontent.com".into(), "s3cr3t".into(), "1//r3fr3sh".into())),
    });
    let user = google_oauth::user_file(dir.path(), "client-1.apps.googleusercontent.com", "s3cr3t", "1//r3fr3sh", &endpoint.url()).expect("user file");
    for (file, want) in [(&sa, "ya29.local-1"), (&user, "ya29.local-2")] {
        let out = Command::new(&bin).arg("oauth").arg(file).output().expect("run the Go client");
        assert!(out.status.success(), "Google's Go client against the token endpoint ({}):\n{}", file.display(), String::from_utf8_lossy(&out.stderr));
        let got: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON from the Go program");
        assert_eq!(got["access_token"], want, "{got}");
    }
    assert_eq!(endpoint.issued().len(), 2);
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).map(|d| d.join(name)).find(|p| p.is_file()))
}
