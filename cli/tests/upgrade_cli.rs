//! `keelson upgrade cluster`: says where the cluster goes, writes only the version line with
//! `--yes`, and refuses to skip a minor, saying how to step through.

mod common;

fn spec_copy() -> tempfile::NamedTempFile {
    let f = tempfile::NamedTempFile::new().expect("tmp");
    std::fs::copy(common::example("minimal.yaml"), f.path()).expect("copy example");
    f
}

#[test]
fn upgrade_plans_then_writes_only_the_version_and_refuses_a_skipped_minor() {
    let spec = spec_copy();
    let path = spec.path().display().to_string();
    let before = std::fs::read_to_string(spec.path()).expect("read");
    assert!(before.contains("kubernetesVersion: 1.34.4"), "the example's version moved: update this test");

    let plan = common::keelson(&["upgrade", "cluster", "-f", &path]);
    assert!(plan.status.success(), "{}", String::from_utf8_lossy(&plan.stderr));
    let out = String::from_utf8_lossy(&plan.stdout);
    assert!(out.contains("Kubernetes 1.34.4 → 1.34.") && out.contains("--yes"), "{out}");
    assert_eq!(std::fs::read_to_string(spec.path()).expect("read"), before, "no --yes, no change");

    let skip = common::keelson(&["upgrade", "cluster", "-f", &path, "--to", "1.36.3", "--yes"]);
    assert!(!skip.status.success());
    let err = String::from_utf8_lossy(&skip.stderr);
    assert!(err.contains("skips a minor") && err.contains("first --to 1.35."), "{err}");
    assert_eq!(std::fs::read_to_string(spec.path()).expect("read"), before);

    let step = common::keelson(&["upgrade", "cluster", "-f", &path, "--to", "1.35.0", "--yes"]);
    assert!(step.status.success(), "{}", String::from_utf8_lossy(&step.stderr));
    let after = std::fs::read_to_string(spec.path()).expect("read");
    assert_eq!(after, before.replace("kubernetesVersion: 1.34.4", "kubernetesVersion: 1.35.0"), "only the version line changed");
    let valid = common::keelson(&["validate", "-f", &path]);
    assert!(valid.status.success(), "{}", String::from_utf8_lossy(&valid.stderr));
}
