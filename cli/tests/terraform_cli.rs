//! `keelson apply --target terraform`: writes the Terraform tree and, without `--yes`, leaves the
//! state store alone; a spec the model refuses is an error naming the field.

mod common;

/// `keelson apply --target terraform --out OUT` for `spec`, offline, with the test builds.
fn apply_terraform(spec: &std::path::Path, out: &std::path::Path) -> std::process::Output {
    common::keelson(&[
        "apply",
        "-f",
        &spec.display().to_string(),
        "--target",
        "terraform",
        "--out",
        &out.display().to_string(),
        "--offline",
        "--nodeup-asset",
        common::NODEUP_AMD64,
        "--protokube-asset",
        common::PROTOKUBE_AMD64,
    ])
}

#[test]
fn terraform_is_written_and_the_state_store_is_untouched_without_yes() {
    let out = tempfile::tempdir().expect("tmp");
    let example = common::example("minimal.yaml");
    let result = apply_terraform(&example, out.path());
    let stdout = String::from_utf8_lossy(&result.stdout);
    assert!(result.status.success(), "{}", String::from_utf8_lossy(&result.stderr));
    assert!(stdout.contains("state store not written"), "no --yes: the state store is untouched: {stdout}");
    let files = common::read_tree(out.path());
    assert!(files.contains_key("kubernetes.tf.json") || files.keys().any(|k| k.ends_with(".tf.json")), "{:?}", files.keys());
}

#[test]
fn an_internal_balancer_for_the_internal_api_is_refused_naming_the_field() {
    let text = std::fs::read_to_string(common::example("ha.yaml")).expect("example");
    let bad = text.replace("      type: Public\n      class: Network\n", "      type: Internal\n      class: Network\n      useForInternalApi: true\n");
    let spec = tempfile::NamedTempFile::new().expect("tmp");
    std::fs::write(spec.path(), bad).expect("write");
    let out = tempfile::tempdir().expect("tmp");
    let result = apply_terraform(spec.path(), out.path());
    assert!(!result.status.success());
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(stderr.contains("spec.api.loadBalancer.useForInternalApi"), "{stderr}");
}
