//! End to end: `keelson-local selfheal -f examples/ha.yaml --cycles N` (N = $KEELSON_SELFHEAL_CYCLES,
//! default 10; 100 on demand). Every cycle terminates a random control-plane instance in moto;
//! the autoscaling group replaces it, the new machine claims the same volumes, and etcd must be
//! healthy on it with all 1,000 keys and the same members. The summary line is the contract.

mod support;

#[test]
fn selfheal_cycles_keep_every_key() {
    support::require_root();
    let _down = support::Down;
    let cycles: u32 = std::env::var("KEELSON_SELFHEAL_CYCLES").ok().and_then(|c| c.parse().ok()).unwrap_or(10);
    let spec = support::repo().join("examples/ha.yaml");
    let out = support::run(&["selfheal", "-f", &spec.to_string_lossy(), "--cycles", &cycles.to_string(), "--cycle-timeout", "180"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or("");
    let prefix = format!("selfheal: {cycles} cycles, 1000/1000 keys intact, median failover ");
    assert!(last.starts_with(&prefix) && last.ends_with(" s"), "unexpected summary {last:?} (output above)");
    let median: f64 = last[prefix.len()..last.len() - 2].parse().expect("median is a number");
    assert!(stdout.lines().filter(|l| l.starts_with("cycle ")).count() == cycles as usize);
    assert!(out.status.success(), "selfheal exited {:?}", out.status);
    eprintln!("median failover {median:.1} s over {cycles} cycles");
    drop(_down);
    support::assert_nothing_left();
}
