//! End to end, opt-in: `keelson-local conformance -f examples/ha.yaml` — the HA example (3 control
//! planes, 3 workers) brought up, the upstream e2e suite's focused set of `[Conformance]` tests run
//! against it (docs/conformance.md), the cluster taken down. Every focused test must pass (0 failed,
//! more than 0 passed) and every focused name must exist in the suite.
//!
//! Ignored by default even in the cluster tier: the first run builds e2e.test from the Kubernetes
//! module (tens of minutes on 2 cores) and the suite itself takes tens of minutes. Run it with
//!
//! ```sh
//! cargo test -p keelson-local --features tier-cluster --test conformance -- --ignored --nocapture
//! ```
//!
//! as root, with the tools `scripts/test` installs, and no other local cluster up.

mod support;

#[test]
#[ignore = "opt-in: builds the e2e suite and runs ~30 conformance tests (tens of minutes); see the module docs"]
fn the_ha_example_passes_the_focused_conformance_tests() {
    support::require_root();
    let _down = support::Down;
    let t0 = std::time::Instant::now();
    let spec = support::repo().join("examples/ha.yaml");
    let out = support::run(&["conformance", "-f", &spec.to_string_lossy()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let (passed, failed) = support::conformance_counts(&stdout);
    let line = stdout.lines().find(|l| l.starts_with("conformance: ")).unwrap_or_default();
    assert_eq!(failed, 0, "conformance tests failed (names and first error lines above): {line}");
    assert!(passed > 0, "no conformance test passed: {line}");
    assert!(!stdout.contains("is not in this suite"), "a focused test name is not in the suite (output above)");
    assert!(out.status.success(), "keelson-local conformance exited {:?}", out.status);
    eprintln!("conformance on examples/ha.yaml: up, suite and down in {:.0} s", t0.elapsed().as_secs_f64());
    drop(_down);
    support::assert_nothing_left();
}
