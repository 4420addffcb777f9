//! CA rotation through the real `keelson` binary on a file state store: `create keypair` adds a
//! trusted key, `promote keypair` makes it the one that signs, `distrust keypair` removes the old
//! one — and at each step the NodeupConfigs that `compile --state` pins carry exactly the keys the
//! hosts must trust (both during the overlap, only the new one at the end), the primary's first.

mod common;

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use common::{example, keelson};

fn run(args: &[&str]) -> String {
    let out = keelson(args);
    assert!(out.status.success(), "keelson {args:?}:\n{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The certificates a worker's NodeupConfig pins for the cluster CA.
fn pinned(spec: &Path, state: &Path) -> Vec<String> {
    let out = tempfile::tempdir().expect("out");
    run(&[
        "compile",
        "-f",
        spec.to_str().expect("utf-8"),
        "--out",
        out.path().to_str().expect("utf-8"),
        "--offline",
        "--state",
        state.to_str().expect("utf-8"),
    ]);
    let config = std::fs::read_to_string(out.path().join("state/igconfig/node/nodes-us-east-1a/nodeupconfig.yaml")).expect("nodeup config");
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&config).expect("yaml");
    let bundle = doc["CAs"]["kubernetes-ca"].as_str().expect("CAs.kubernetes-ca").to_string();
    bundle.split_inclusive("-----END CERTIFICATE-----").map(|c| c.trim().to_string()).filter(|c| !c.is_empty()).collect()
}

/// The keys of the cluster CA, as `get keypairs kubernetes-ca -o json` lists them.
fn rows(spec: &str) -> Vec<serde_json::Value> {
    serde_json::from_str::<Vec<serde_json::Value>>(&run(&["get", "keypairs", "kubernetes-ca", "-f", spec, "-o", "json"])).expect("json")
}

/// A file state store with the cluster's PKI, and the minimal example pointed at it.
fn cluster() -> (tempfile::TempDir, tempfile::NamedTempFile) {
    let state = tempfile::tempdir().expect("state");
    run(&["pki", "init", "--state", state.path().to_str().expect("utf-8")]);
    let text = std::fs::read_to_string(example("minimal.yaml")).expect("example");
    let base = text.lines().find(|l| l.trim_start().starts_with("configBase:")).expect("configBase").to_string();
    let spec_text = text.replacen(&base, &format!("  configBase: file://{}", state.path().display()), 1);
    let spec_file = tempfile::NamedTempFile::new().expect("spec");
    std::fs::write(spec_file.path(), spec_text).expect("write spec");
    (state, spec_file)
}

/// kOps' `create keypair --cert --key`: an operator's own CA is imported, checked first.
#[test]
fn an_imported_ca_is_checked_then_trusted() {
    let (_state, spec_file) = cluster();
    let spec = spec_file.path().to_str().expect("utf-8");
    let dir = tempfile::tempdir().expect("dir");
    let (ca, other) = (base::pki::create_ca("corp-ca").expect("ca"), base::pki::create_ca("corp-ca").expect("ca"));
    let write = |name: &str, body: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, body).expect("write");
        p.to_str().expect("utf-8").to_string()
    };
    let (cert, key, wrong) = (write("ca.crt", &ca.cert_pem), write("ca.key", &ca.key_pem), write("other.key", &other.key_pem));
    let out = keelson(&["create", "keypair", "kubernetes-ca", "-f", spec, "--cert", &cert, "--key", &wrong]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("not the certificate's"), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(rows(spec).len(), 1, "a refused import changes nothing");
    let out = keelson(&["create", "keypair", "kubernetes-ca", "-f", spec, "--cert", &cert]);
    assert!(!out.status.success(), "--cert without --key is refused");
    run(&["create", "keypair", "kubernetes-ca", "-f", spec, "--cert", &cert, "--key", &key]);
    let r = rows(spec);
    assert_eq!(r.len(), 2);
    assert_eq!(r[1]["certificate"].as_str().map(str::trim), Some(ca.cert_pem.trim()), "the imported certificate is the new key's");
    assert_eq!(r[1]["subject"], "corp-ca");
}

#[test]
fn a_rotation_changes_what_every_host_trusts_step_by_step() {
    let (state, spec_file) = cluster();
    let spec = spec_file.path().to_str().expect("utf-8");

    // Without names every keyset is listed (read-only), the CAs and the service-account key.
    let table = run(&["get", "keypairs", "-f", spec]);
    for name in ["kubernetes-ca", "etcd-clients-ca", "apiserver-aggregator-ca", "service-account"] {
        assert!(table.lines().any(|l| l.starts_with(&format!("{name} "))), "{name} not listed:\n{table}");
    }
    let before = pinned(spec_file.path(), state.path());
    assert_eq!(before.len(), 1, "one key before the rotation");
    let old_id = rows(spec)[0]["id"].as_str().expect("id").to_string();

    // 1. A new key: trusted beside the old, which still signs.
    let said = run(&["create", "keypair", "kubernetes-ca", "-f", spec]);
    assert!(said.contains("created key"), "{said}");
    let r = rows(spec);
    assert_eq!(r.len(), 2, "{r:?}");
    assert_eq!(r[0]["id"], old_id.as_str());
    assert_eq!(r[0]["primary"], true, "the old key is still the primary: {r:?}");
    let new_id = r[1]["id"].as_str().expect("id").to_string();
    let overlap = pinned(spec_file.path(), state.path());
    assert_eq!(overlap.len(), 2, "both keys are pinned during the overlap");
    assert_eq!(overlap[0], before[0], "the primary's certificate first");
    let private = state.path().join("pki/private/kubernetes-ca/keyset.yaml");
    let mode = std::fs::metadata(&private).expect("private keyset").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the rewritten private keyset is the owner's only");
    let issued = std::fs::read_to_string(state.path().join("pki/issued/kubernetes-ca/keyset.yaml")).expect("issued");
    assert!(!issued.contains("privateMaterial"), "no private key in the issued half");

    // Nothing older than the primary yet: distrust refuses rather than doing nothing.
    let out = keelson(&["distrust", "keypair", "kubernetes-ca", "-f", spec]);
    assert!(!out.status.success(), "distrust before promote must fail");
    assert!(String::from_utf8_lossy(&out.stderr).contains("older than the primary"), "{}", String::from_utf8_lossy(&out.stderr));
    // The primary cannot be distrusted by name either.
    let out = keelson(&["distrust", "keypair", "kubernetes-ca", "-f", spec, &old_id]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("is the primary"), "{}", String::from_utf8_lossy(&out.stderr));

    // 2. Promote: the new key signs; both still trusted, the new one first.
    let said = run(&["promote", "keypair", "kubernetes-ca", "-f", spec]);
    assert!(said.contains(&new_id), "{said}");
    let promoted = pinned(spec_file.path(), state.path());
    assert_eq!(promoted.len(), 2);
    assert_eq!(promoted[0], overlap[1], "the new primary's certificate first");
    assert_eq!(promoted[1], before[0]);

    // 3. Distrust the old key: only the new one is pinned.
    let said = run(&["distrust", "keypair", "kubernetes-ca", "-f", spec]);
    assert!(said.contains(&old_id), "{said}");
    let after = pinned(spec_file.path(), state.path());
    assert_eq!(after, vec![overlap[1].clone()], "only the new key is trusted at the end");
    let r = rows(spec);
    assert!(r[0]["distrustTimestamp"].as_str().is_some_and(|t| t.ends_with('Z')), "{r:?}");
    assert_eq!(r[1]["primary"], true);

    // Other keysets are refused by name; the lock was released after each change.
    let out = keelson(&["create", "keypair", "etcd-clients-ca", "-f", spec]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("rotates only kubernetes-ca"), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!state.path().join(base::store::LOCK_FILE).exists(), "the store lock is released");
}
