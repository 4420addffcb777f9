//! End to end, a cluster without a DNS zone: `keelson-local selfheal -f examples/gossip.yaml
//! --cycles 1` (a `.k8s.local` name with `topology.dns.type: None`; 3 control planes, 2 workers;
//! no Route53 zone exists and the harness writes no hosts entry for the cluster's names). The
//! workers must join by cloud identity through `kops-controller.internal.<cluster>` and run with
//! `api.internal.<cluster>`, both from the product alone (protokube publishes the live API
//! servers in the state store, nodeup keeps them in each worker's hosts file); after a control
//! plane is killed and replaced, every worker must resolve both names to exactly the live control
//! planes (hosts file, kube-proxy's copy, `getent`), every machine be a Ready Node, etcd keep every
//! key and `keelson validate cluster` pass. Keelson's addons run on roles of their own (IRSA): the
//! IAM oracle judges every credential moto's STS issued for a service-account token as real STS
//! would and checks the CCM's calls (kubenet's routes, nodes' addresses) against its own role.
//! The control planes boot Debian 12 and the workers Debian 13, from roots without the packages
//! the kubelet and containerd need (iptables & co.): nodeup installs them from the mirror.
//! Then, on the same cluster, `keelson-local chaos --scenario two-control-planes` and
//! `--scenario all-control-planes` (quorum lost; every control plane lost): each heals by itself
//! with the same etcd members, every key and ConfigMap, and `keelson validate cluster` valid; and
//! `--scenario lost-volume` (a control plane and its etcd volumes lost; `keelson apply` makes new
//! ones): its member is removed and added again, filled from its peers, nothing lost; and
//! `--scenario partition` (a control plane cut off from the other two): etcd's leader and the
//! Leases stay with or move to the majority, the cut-off API server leaves the load balancer and
//! refuses a write, the majority takes writes, and after the cut heals it catches up.
//! The test's wall time is printed.

mod support;

#[test]
fn gossip_cluster_workers_follow_the_control_planes() {
    support::require_root();
    let _down = support::Down;
    let t0 = std::time::Instant::now();
    let spec = support::repo().join("examples/gossip.yaml");
    let out = support::run(&["selfheal", "-f", &spec.to_string_lossy(), "--cycles", "1", "--cycle-timeout", "240", "--keep-up"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let has = |prefix: &str| stdout.lines().any(|l| l.starts_with(prefix));
    assert!(has("selfheal: 2 of 2 workers joined by cloud identity"), "both workers joined through the join server's name (output above)");
    let last = stdout.lines().last().unwrap_or("");
    assert!(
        last.starts_with("selfheal: 1 cycles, 1000/1000 keys intact, 1000/1000 ConfigMaps intact, median failover ") && last.ends_with(" s"),
        "unexpected summary {last:?} (output above)"
    );
    assert!(out.status.success(), "selfheal exited {:?}", out.status);
    let resolve = "selfheal: 2/2 workers resolve api.internal.gossip.k8s.local and kops-controller.internal.gossip.k8s.local to the 3 live control planes";
    assert!(has(resolve), "workers follow the replaced control plane through the product's hosts entries (output above)");
    assert!(!stdout.contains("(0 host-network pods' copies"), "kube-proxy's copy of the hosts file checked on every worker (output above)");
    let ready = stdout.lines().find(|l| l.ends_with("machines are Ready Nodes")).expect("a Ready-Nodes line");
    assert_eq!(ready, "selfheal: 5/5 machines are Ready Nodes");
    // Debian 12 control planes, Debian 13 workers, neither root with iptables & co. pre-installed:
    // nodeup installed them from the mirror's Debian archive subset.
    let oses = "selfheal: Nodes' OS images: 3 Debian GNU/Linux 12 (bookworm), 2 Debian GNU/Linux 13 (trixie)";
    assert!(has(oses), "expected {oses:?} (output above)");
    assert!(stdout.lines().any(|l| l == "selfheal: keelson validate cluster after the replacements: valid"), "validate cluster (output above)");
    // The worst day on the same cluster (`keelson-local chaos`, docs/local-cluster.md): quorum lost,
    // then every control plane lost, each healed by itself with nothing lost; then a member's
    // volumes lost, rebuilt from its peers; then one cut off from the others and let back.
    for scenario in ["two-control-planes", "all-control-planes", "lost-volume", "partition"] {
        let out = support::run(&["chaos", "-f", &spec.to_string_lossy(), "--scenario", scenario, "--timeout", "600"]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        // The verdict is the scenario's last line (the first says what it terminated).
        let line = stdout.lines().rfind(|l| l.starts_with(&format!("chaos {scenario}: "))).unwrap_or_default();
        // partition also writes 100 keys and ConfigMaps while the cut lasts.
        let n = if scenario == "partition" { 1100 } else { 1000 };
        assert!(
            line.starts_with(&format!("chaos {scenario}: healed in "))
                && line.ends_with(&format!(" s, {n}/{n} keys intact, {n}/{n} ConfigMaps intact, validate valid")),
            "{scenario}: {line:?} (output above)"
        );
        if scenario == "partition" {
            let isolated = stdout.lines().find(|l| l.starts_with("chaos partition: isolated in ")).unwrap_or_default();
            assert!(isolated.contains("a write straight to it refused ("), "the cut-off API server refused a write: {isolated:?}");
        }
        assert!(out.status.success(), "{scenario}: keelson-local chaos exited {:?}", out.status);
    }
    // The IAM oracle over everything above (`keelson-local iam-check`; selfheal with --keep-up
    // leaves it to the caller).
    let iam_out = support::run(&["iam-check"]);
    let stdout = String::from_utf8_lossy(&iam_out.stdout).to_string();
    support::assert_iam_clean(&stdout);
    // IRSA (the spec's useServiceAccountExternalPermissions): the CCM's calls were made with its own
    // role's credentials, issued for tokens STS would accept (the oracle judges each), not the
    // control planes' role — which no longer holds them.
    let iam = stdout.lines().find(|l| l.contains("IAM oracle: ")).unwrap_or_default();
    assert!(
        iam.contains("aws-cloud-controller-manager.kube-system.sa.gossip.k8s.local="),
        "the CCM's calls were not made with its service account's role: {iam}"
    );
    assert!(!iam.contains(" 0 web-identity credentials"), "no service account assumed its role: {iam}");
    assert!(iam_out.status.success(), "keelson-local iam-check exited {:?}", iam_out.status);
    eprintln!("gossip cluster: up, 1 control-plane replacement, 4 chaos scenarios, checks and down in {:.0} s", t0.elapsed().as_secs_f64());
    drop(_down);
    support::assert_nothing_left();
}
