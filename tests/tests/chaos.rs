//! The worst day, first scenarios: `keelson-local chaos -f examples/gossip.yaml --scenario
//! two-control-planes`, then `--scenario all-control-planes` on the same cluster (docs/local-cluster.md,
//! "Chaos"). Two of the three control planes are terminated at once — etcd loses its quorum — and
//! then all three: the groups replace them, each replacement claims its member's volumes, etcd
//! comes back with the same members (name and id) and every key, the API serves every ConfigMap,
//! and `keelson validate cluster` passes, with no step of anyone's. Each scenario's one line and
//! time to healed are printed.

mod support;

#[test]
fn quorum_lost_and_every_control_plane_lost_heal_with_nothing_lost() {
    support::require_root();
    let _down = support::Down;
    let spec = support::repo().join("examples/gossip.yaml");
    let spec = spec.to_string_lossy();
    for (scenario, extra) in [("two-control-planes", vec!["--keep-up"]), ("all-control-planes", vec![])] {
        let mut args = vec!["chaos", "-f", &spec, "--scenario", scenario, "--timeout", "600"];
        args.extend(extra);
        let out = support::run(&args);
        let stdout = String::from_utf8_lossy(&out.stdout);
        // The verdict is the scenario's last line (the first says what it terminated).
        let line = stdout.lines().filter(|l| l.starts_with(&format!("chaos {scenario}: "))).last().unwrap_or_default();
        let healed = line.starts_with(&format!("chaos {scenario}: healed in "))
            && line.ends_with(" s, 1000/1000 keys intact, 1000/1000 ConfigMaps intact, validate valid");
        assert!(healed, "{scenario}: {line:?} (output above)");
        assert!(out.status.success(), "{scenario}: keelson-local chaos exited {:?}", out.status);
    }
    drop(_down);
    support::assert_nothing_left();
}
