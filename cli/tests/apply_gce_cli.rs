//! `keelson apply` / `keelson delete` (the commands) on GCE, against the harness's Compute emulator
//! and a metadata server handing out the token (127.0.0.1 only): `--endpoint-url` (or
//! `$KEELSON_GCE_ENDPOINT`) points them at the emulator and `$GCE_METADATA_HOST` at the metadata
//! server; the plan is printed by default, `--yes` applies, a second run has no changes,
//! `rolling-update` recreates the instances a changed template left behind, and delete removes the
//! cluster. The direct target itself is tested in keelson-cloud-resources' `apply_gce`.

use std::sync::Arc;

use serde_json::json;
use testkit::gce_compute::{Config, GceCompute};
use testkit::httpd::{Request, Server};

const NODEUP_AMD64: &str = "amd64=8b1a9953c4611296a827abf8c47804d7e6c49c6b8f0b8c1f4ee3a5e6a1b1c2d3@https://nodeup.mirror.test/amd64/nodeup";
const PROTOKUBE_AMD64: &str = "amd64=5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8@https://nodeup.mirror.test/amd64/protokube";

struct World {
    compute: GceCompute,
    server: Server,
    meta: Server,
    state: tempfile::TempDir,
    spec: tempfile::NamedTempFile,
}

fn world() -> World {
    let compute = GceCompute::new(Config { project: "acme-platform".into(), operation_delay: std::time::Duration::from_millis(20), ..Config::example() });
    let server = compute.start();
    let mut values = testkit::gce_metadata::InstanceFacts::example().values();
    values.insert("instance/service-accounts/default/token".into(), json!({"access_token": "tok", "expires_in": 3599, "token_type": "Bearer"}).to_string());
    let meta = Server::start(Arc::new(move |req: &Request| testkit::gce_metadata::answer(&values, req)));
    let state = tempfile::tempdir().expect("tmp");
    let spec = tempfile::NamedTempFile::new().expect("tmp");
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/gce.yaml")).expect("example");
    let text = text.replace("gs://acme-keelson-state/gce.k8s.example.com", &format!("file://{}", state.path().display()));
    std::fs::write(spec.path(), text).expect("write spec");
    World { compute, server, meta, state, spec }
}

impl World {
    /// `keelson CMD -f SPEC …`; `endpoint_flag`: the emulator by `--endpoint-url`, else by
    /// `$KEELSON_GCE_ENDPOINT`.
    fn run(&self, cmd: &str, endpoint_flag: bool, extra: &[&str]) -> (bool, String) {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_keelson"));
        c.args(cmd.split(' ')).args(["-f", &self.spec.path().display().to_string(), "--offline"]);
        if cmd != "delete" {
            c.args(["--nodeup-asset", NODEUP_AMD64, "--protokube-asset", PROTOKUBE_AMD64]);
        }
        let base = self.server.url("");
        if endpoint_flag {
            c.args(["--endpoint-url", &base]).env_remove("KEELSON_GCE_ENDPOINT");
        } else {
            c.env("KEELSON_GCE_ENDPOINT", &base);
        }
        let out = c.args(extra).env("GCE_METADATA_HOST", self.meta.url("")).env_remove("KOPS_FEATURE_FLAGS").output().expect("run keelson");
        let text = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text)
    }
}

#[test]
fn apply_plans_applies_with_yes_has_no_changes_then_and_delete_removes_it() {
    let w = world();
    let (ok, out) = w.run("apply", true, &[]);
    assert!(ok, "{out}");
    assert!(out.contains("+ Network gce-k8s-example-com") && out.contains("+ InstanceGroupManager") && out.contains("Run with --yes to apply."), "{out}");
    assert!(w.compute.instances().is_empty() && w.compute.disks().is_empty(), "a plan creates nothing");

    let (ok, out) = w.run("apply", true, &["--yes"]);
    assert!(ok, "{out}");
    assert!(out.contains("applied"), "{out}");
    assert_eq!(w.compute.instances().len(), 5, "3 control planes and 2 nodes: {out}");
    assert!(w.state.path().join("pki/private/kubernetes-ca/keyset.yaml").exists(), "the PKI is in the state store");

    let (ok, out) = w.run("apply", false, &[]);
    assert!(ok, "{out}");
    assert!(out.contains("No changes."), "{out}");

    // A changed machine type: apply moves the MIG to a new template, rolling-update recreates the
    // nodes on it (--cloudonly: no Kubernetes API here).
    let text = std::fs::read_to_string(w.spec.path()).expect("spec");
    std::fs::write(w.spec.path(), text.replacen("machineType: e2-standard-4", "machineType: e2-standard-8", 1)).expect("write spec");
    let (ok, out) = w.run("apply", true, &["--yes"]);
    assert!(ok && out.contains("rolling replacement needed"), "{out}");
    let roll = ["--cloudonly", "--node-interval", "0s", "--control-plane-interval", "0s", "--poll-interval", "100ms"];
    let (ok, out) = w.run("rolling-update", true, &roll);
    assert!(ok && out.contains("2 instance(s) need replacing"), "{out}");
    // `get instances` agrees, from the same status (no Kubernetes API here: no Node names).
    let listed = |w: &World| -> Vec<(String, String, String, String)> {
        let (ok, out) = w.run("get instances", true, &["-o", "json", "--kubeconfig", "/nonexistent/kubeconfig"]);
        assert!(ok, "{out}");
        let json = &out[out.find('[').unwrap_or_else(|| panic!("no JSON in {out}"))..out.rfind(']').expect("JSON end") + 1];
        let rows: Vec<serde_json::Value> = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {out}"));
        let mut v: Vec<_> = rows
            .iter()
            .map(|r| {
                let s = |k: &str| r[k].as_str().unwrap_or_else(|| panic!("{k} in {r}")).to_string();
                (s("instanceGroup"), r["roles"][0].as_str().unwrap_or_default().to_string(), s("machineType"), s("status"))
            })
            .collect();
        v.sort();
        v
    };
    let row = |g: &str, role: &str, m: &str, st: &str| (g.to_string(), role.to_string(), m.to_string(), st.to_string());
    let before = listed(&w);
    assert_eq!(before.len(), 5, "{before:?}");
    assert_eq!(before.iter().filter(|r| r.3 == "NeedsUpdate").count(), 2, "{before:?}");
    assert!(
        before.iter().filter(|r| r.0.starts_with("nodes")).all(|r| *r == row("nodes-europe-west1-b", "node", "e2-standard-4", "NeedsUpdate")),
        "{before:?}"
    );
    let (ok, out) = w.run("rolling-update", true, &[&roll[..], &["--yes"]].concat());
    assert!(ok && out.contains("2 instance(s) replaced"), "{out}");
    let nodes: Vec<_> = w.compute.instances().into_iter().filter(|i| i.name.starts_with("nodes-")).collect();
    assert!(nodes.len() == 2 && nodes.iter().all(|i| i.machine_type == "e2-standard-8"), "{nodes:?}");
    let (ok, out) = w.run("rolling-update", false, &roll);
    assert!(ok && out.contains("No rolling update required."), "{out}");
    let after = listed(&w);
    assert!(after.iter().all(|r| r.3 == "UpToDate"), "{after:?}");
    assert_eq!(after.iter().filter(|r| **r == row("nodes-europe-west1-b", "node", "e2-standard-8", "UpToDate")).count(), 2, "{after:?}");

    let (ok, out) = w.run("delete", false, &["--yes", "--delete-volumes"]);
    assert!(ok, "{out}");
    assert!(out.contains("- Network gce-k8s-example-com"), "{out}");
    assert!(w.compute.instances().is_empty() && w.compute.disks().is_empty(), "{out}");
}
