//! End to end: `keelson-local selfheal -f examples/ha.yaml --cycles N` (N = $KEELSON_SELFHEAL_CYCLES,
//! default 3; more on demand). Every cycle terminates a random control-plane instance in moto;
//! the autoscaling group replaces it, the new machine claims the same volumes, and etcd must be
//! healthy on it with all 1,000 keys and the same members, the 1,000 ConfigMaps written through the
//! API before the first kill must all read back, and every machine must end as a Ready Node. The
//! summary line is the contract; each cycle prints its failover phases and the API's availability,
//! and the new control plane's addon controller must apply nothing (every addon hash is recorded);
//! after the last cycle `keelson validate cluster` must pass. The machines boot from a baked image
//! (`--baked`: `keelson bundle create` of the local mirror and registry, then `keelson bundle bake`),
//! and no new control plane may fetch a single image blob from the registry.

mod support;

#[test]
fn selfheal_cycles_keep_every_key() {
    support::require_root();
    let _down = support::Down;
    let cycles: u32 = std::env::var("KEELSON_SELFHEAL_CYCLES").ok().and_then(|c| c.parse().ok()).unwrap_or(3);
    let spec = support::repo().join("examples/ha.yaml");
    let out = support::run(&["selfheal", "-f", &spec.to_string_lossy(), "--cycles", &cycles.to_string(), "--cycle-timeout", "180", "--baked"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or("");
    let prefix = format!("selfheal: {cycles} cycles, 1000/1000 keys intact, 1000/1000 ConfigMaps intact, median failover ");
    assert!(last.starts_with(&prefix) && last.ends_with(" s"), "unexpected summary {last:?} (output above)");
    let median: f64 = last[prefix.len()..last.len() - 2].parse().expect("median is a number");
    assert!(stdout.lines().filter(|l| l.starts_with("cycle ")).count() == cycles as usize);
    support::assert_iam_clean(&stdout);
    assert!(out.status.success(), "selfheal exited {:?}", out.status);
    assert!(
        stdout.lines().any(|l| l == "selfheal: keelson validate cluster after the replacements: valid"),
        "validate cluster after the replacements (output above)"
    );
    assert_eq!(
        stdout.lines().filter(|l| l.contains("addons: the new control plane's controller passed and applied 0")).count(),
        cycles as usize,
        "every new control plane's addon controller applied nothing (output above)"
    );
    assert!(stdout.lines().any(|l| l.starts_with("selfheal: median phase times")), "no phase breakdown");
    let ready = stdout.lines().find(|l| l.ends_with("machines are Ready Nodes")).expect("a Ready-Nodes line");
    let (have, want) = ready.trim_start_matches("selfheal: ").split_once(' ').and_then(|(f, _)| f.split_once('/')).expect("n/m");
    assert_eq!(have, want, "{ready}");
    let fetched = format!("selfheal: the {cycles} new control planes fetched 0 image blobs and 0 manifests from the registry (baked image)");
    assert!(stdout.lines().any(|l| l == fetched), "expected {fetched:?}: a baked machine pulls nothing (output above)");
    eprintln!("median failover {median:.1} s over {cycles} cycles");
    drop(_down);
    support::assert_nothing_left();
}
