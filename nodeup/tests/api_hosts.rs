//! A worker of a cluster without DNS records (`usesNoneDNS`): nodeup puts `api.internal` and the
//! join server's name in the managed block of the hosts file at the addresses the control planes
//! published in the state store, installs the timer that follows them, and `nodeup api-hosts`
//! follows a replaced control plane, in the hosts file and in a host-network pod's copy of it.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::*;

const CLUSTER: &str = "ha.k8s.example.com";

fn publish(state: &Path, addresses: &[&str]) {
    let doc = keelson_api::nodeup::ApiServers { addresses: addresses.iter().map(|a| a.parse().expect("an IP")).collect() };
    let p = state.join(keelson_api::nodeup::API_SERVERS_KEY);
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(p, serde_yaml_ng::to_string(&doc).expect("yaml")).expect("write");
}

fn api_hosts(s: &Scenario) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nodeup"))
        .arg("api-hosts")
        .arg("--conf")
        .arg(&s.boot)
        .arg("--root")
        .arg(&s.root)
        .args(["--hostname", "ip-172-20-33-10.eu-west-1.compute.internal", "--internal-ip", "172.20.33.10", "--arch", "amd64", "--http-timeout", "2"])
        .env("NODEUP_LOG", "warn")
        .output()
        .expect("run nodeup api-hosts")
}

fn entries(p: &Path) -> base::hosts::Entries {
    base::hosts::read(p).expect("hosts")
}

#[test]
fn worker_without_dns_records_follows_the_published_api_servers() {
    let s = Scenario::edited(Group::Worker, 1024, |m, a| vec![m.url(&a.path)], |c| c.replace("usesNoneDNS: false", "usesNoneDNS: true"));
    let state = s.dir.path().join("state");
    let out = api_hosts(&s);
    assert!(!out.status.success(), "nothing published yet: {}", stdout(&out));
    assert!(stderr(&out).contains("no API server addresses yet"), "{}", stderr(&out));

    publish(&state, &["172.20.64.11", "172.20.32.10"]);
    std::fs::create_dir_all(s.path("/etc")).expect("mkdir");
    std::fs::write(s.path("/etc/hosts"), "127.0.0.1 localhost\n").expect("hosts");
    let o = s.run(&[]);
    assert_ok(&o);
    let hosts = s.path("/etc/hosts");
    let both = vec!["172.20.32.10".to_string(), "172.20.64.11".to_string()];
    let e = entries(&hosts);
    assert_eq!(e.get(&format!("api.internal.{CLUSTER}")), Some(&both), "{e:?}");
    assert_eq!(e.get(&format!("kops-controller.internal.{CLUSTER}")), Some(&both), "{e:?}");
    assert_eq!(e.len(), 2, "{e:?}");
    let service = std::fs::read_to_string(s.path("/etc/systemd/system/keelson-api-hosts.service")).expect("service");
    assert!(service.contains("ExecStart=/opt/keelson/bin/nodeup api-hosts --conf /etc/keelson/bootconfig.yaml"), "{service}");
    let timer = std::fs::read_to_string(s.path("/etc/systemd/system/keelson-api-hosts.timer")).expect("timer");
    assert!(timer.contains("OnUnitActiveSec=30s") && timer.contains("AccuracySec=1s"), "{timer}");
    assert!(std::fs::read_link(s.path("/etc/systemd/system/multi-user.target.wants/keelson-api-hosts.timer")).is_ok(), "the timer is enabled");

    // A control plane is replaced: the hosts file and kube-proxy's copy (a host-network pod's)
    // follow; a pod's own hosts file is left alone.
    let pods = s.path("/var/lib/kubelet/pods");
    let (kube_proxy, web) = (pods.join("uid-kube-proxy/etc-hosts"), pods.join("uid-web/etc-hosts"));
    for p in [&kube_proxy, &web] {
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    }
    let node_hosts = std::fs::read_to_string(&hosts).expect("hosts");
    std::fs::write(&kube_proxy, format!("{}\n{node_hosts}", base::hosts::KUBELET_HOST_NETWORK_HEADER)).expect("copy");
    let own = "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n100.96.1.4\tweb\n";
    std::fs::write(&web, own).expect("pod hosts");
    publish(&state, &["172.20.32.10", "172.20.96.12"]);
    let out = api_hosts(&s);
    assert_ok(&out);
    assert!(last_line(&out).ends_with("1 changed"), "{}", stdout(&out));
    let replaced = vec!["172.20.32.10".to_string(), "172.20.96.12".to_string()];
    for p in [&hosts, &kube_proxy] {
        let e = entries(p);
        assert_eq!(e.get(&format!("api.internal.{CLUSTER}")), Some(&replaced), "{}: {e:?}", p.display());
        assert_eq!(e.get(&format!("kops-controller.internal.{CLUSTER}")), Some(&replaced), "{}: {e:?}", p.display());
    }
    assert!(std::fs::read_to_string(&hosts).expect("hosts").starts_with("127.0.0.1"), "the rest of the file is kept");
    assert_eq!(std::fs::read_to_string(&web).expect("pod hosts"), own);
    let again = api_hosts(&s);
    assert_ok(&again);
    assert!(last_line(&again).ends_with(" 0 changed"), "{}", stdout(&again));
}

#[test]
fn workers_with_dns_records_get_no_hosts_entries() {
    let s = Scenario::new(Group::Worker, 1024, |m, a| vec![m.url(&a.path)]);
    publish(&s.dir.path().join("state"), &["172.20.32.10"]);
    assert_ok(&s.run(&[]));
    assert!(entries(&s.path("/etc/hosts")).is_empty(), "the names are in DNS");
    assert!(!s.path("/etc/systemd/system/keelson-api-hosts.timer").exists());
}

/// Whoever may write `igconfig/node/` could put a line break into an address: each address is
/// parsed as an IP before anything reaches the hosts file, and the managed block stays as it was.
#[test]
fn an_address_that_is_not_an_ip_never_reaches_the_hosts_file() {
    let s = Scenario::edited(Group::Worker, 1024, |m, a| vec![m.url(&a.path)], |c| c.replace("usesNoneDNS: false", "usesNoneDNS: true"));
    let state = s.dir.path().join("state");
    publish(&state, &["172.20.32.10"]);
    std::fs::create_dir_all(s.path("/etc")).expect("mkdir");
    std::fs::write(s.path("/etc/hosts"), "127.0.0.1 localhost\n").expect("hosts");
    assert_ok(&s.run(&[]));
    let before = std::fs::read_to_string(s.path("/etc/hosts")).expect("hosts");

    let p = state.join(keelson_api::nodeup::API_SERVERS_KEY);
    std::fs::write(&p, "addresses:\n- \"172.20.32.10\\n10.6.6.6 kubernetes.default.svc.cluster.local\"\n").expect("write");
    let out = api_hosts(&s);
    assert!(!out.status.success(), "refused: {}", stdout(&out));
    assert!(stderr(&out).contains(keelson_api::nodeup::API_SERVERS_KEY), "names the object: {}", stderr(&out));
    let after = std::fs::read_to_string(s.path("/etc/hosts")).expect("hosts");
    assert_eq!(after, before, "the hosts file is left as it was");
    assert!(!after.contains("10.6.6.6"), "{after}");
}
