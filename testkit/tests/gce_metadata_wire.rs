//! The GCE metadata server of the harness against Google's own Go client
//! (`cloud.google.com/go/compute/metadata`, from the Go module proxy) and against Keelson's client
//! (`base::gce_metadata`): both read the same facts over the same wire. Needs Go.

use std::collections::BTreeMap;
use std::process::Command;

use testkit::gce_metadata::{self, InstanceFacts};

fn facts() -> InstanceFacts {
    InstanceFacts::example()
}

#[test]
fn googles_go_client_reads_the_harness_metadata_server() {
    let go = which("go").unwrap_or_else(|| panic!("this test needs Go (the official metadata client is Go); go not found on PATH"));
    let server = gce_metadata::start(&facts());
    let dir = tempfile::tempdir().expect("tmp");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/gce_metadata_wire");
    std::fs::copy(format!("{src}/main.go"), dir.path().join("main.go")).expect("main.go");
    std::fs::copy(format!("{src}/go.mod.in"), dir.path().join("go.mod")).expect("go.mod");
    let tidy = Command::new(&go).arg("mod").arg("tidy").current_dir(dir.path()).output().expect("go mod tidy");
    assert!(tidy.status.success(), "go mod tidy: {}", String::from_utf8_lossy(&tidy.stderr));
    let out = Command::new(&go).args(["run", "."]).current_dir(dir.path()).env("GCE_METADATA_HOST", server.addr().to_string()).output().expect("go run");
    assert!(out.status.success(), "go run: {}", String::from_utf8_lossy(&out.stderr));
    let got: BTreeMap<String, String> = serde_json::from_slice(&out.stdout).expect("JSON from the Go client");
    let f = facts();
    assert_eq!(got["project"], f.project);
    assert_eq!(got["zone"], f.zone, "the client takes the zone's last path segment");
    assert_eq!(got["name"], f.name);
    assert_eq!(got["id"], f.id);
    assert_eq!(got["internal_ip"], f.internal_ip);
    assert_eq!(got["hostname"], f.hostname);
    assert_eq!(got["cluster_name"], "gce.k8s.example.com");
    assert_eq!(got["missing_is_not_defined"], "true", "a missing attribute is the client's NotDefinedError (404)");
    assert_eq!(got["attributes"], "[cluster-name kops-k8s-io-instance-group-name]");
}

#[tokio::test]
async fn keelsons_client_reads_the_same_facts_and_refuses_an_impostor() {
    let server = gce_metadata::start(&facts());
    let client = base::gce_metadata::GceMetadata::new(Some(&server.addr().to_string()), std::time::Duration::from_secs(5)).expect("client");
    let i = client.instance().await.expect("instance");
    let f = facts();
    assert_eq!(
        (i.project.as_str(), i.zone.as_str(), i.name.as_str(), i.id.as_str(), i.internal_ip.as_str(), i.hostname.as_str()),
        (f.project.as_str(), f.zone.as_str(), f.name.as_str(), f.id.as_str(), f.internal_ip.as_str(), f.hostname.as_str())
    );
    assert_eq!(client.attribute("cluster-name").await.expect("attribute").as_deref(), Some("gce.k8s.example.com"));
    assert_eq!(client.attribute("no-such-attribute").await.expect("attribute"), None);
    // Something on that address that does not answer as the metadata server does is not believed.
    let impostor = testkit::httpd::Server::start(std::sync::Arc::new(|_: &testkit::httpd::Request| testkit::httpd::Response::text(200, "evil")));
    let c = base::gce_metadata::GceMetadata::new(Some(&impostor.addr().to_string()), std::time::Duration::from_secs(5)).expect("client");
    let e = c.get("project/project-id").await.expect_err("no Metadata-Flavor answer");
    assert!(e.to_string().contains("not the metadata server"), "{e}");
}

fn which(name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).map(|d| d.join(name)).find(|p| p.is_file()))
}
