//! Step 7c' of the cluster test: kOps' metrics-server addon (`metricsServer` in the local spec, its
//! image built from the Go module `sigs.k8s.io/metrics-server`) serves the resource metrics API through
//! the API servers' aggregation layer (front-proxy client certificate, requestheader flags): the
//! `v1beta1.metrics.k8s.io` APIService becomes Available, the API returns usage for every Node (each
//! scraped at its kubelet by the node's Hostname address, which the VPC resolver answers), and
//! `kubectl top nodes` lists them all. Prints the time from the addon being applied (the APIService's
//! creation) to the APIService Available and to the metrics first seen answering.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use keelson_local::kubeapi;

const API_SERVICE: &str = "v1beta1.metrics.k8s.io";
/// How long metrics-server may take: pods scheduled and started, two scrapes 15 s apart.
const WAIT: Duration = Duration::from_secs(300);

fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or_default()
}

/// `nodes`: every Node's name.
pub fn check(kubeconfig: &Path, nodes: &[String]) {
    let deadline = Instant::now() + WAIT;
    let state = loop {
        let s = kubeapi::api_service(kubeconfig, API_SERVICE);
        if let Ok(Some(s)) = &s {
            if s.available {
                break s.clone();
            }
        }
        assert!(Instant::now() < deadline, "APIService {API_SERVICE} not Available within {WAIT:?}: {s:?}");
        std::thread::sleep(Duration::from_secs(1));
    };
    let (usage, answered) = loop {
        let m = kubeapi::node_metrics(kubeconfig);
        if let Ok(m) = &m {
            if nodes.iter().all(|n| m.get(n).is_some_and(|(cpu, mem)| !cpu.is_empty() && !mem.is_empty())) {
                break (m.clone(), unix_now());
            }
        }
        assert!(Instant::now() < deadline, "metrics.k8s.io does not have every node's usage within {WAIT:?}: want {nodes:?}, got {m:?}");
        std::thread::sleep(Duration::from_secs(1));
    };
    let created = state.created_unix.expect("the APIService has a creationTimestamp");
    eprintln!(
        "METRICS-SERVER: addon applied (APIService created) → Available {} s → every node's metrics answering (first seen) {} s; {usage:?}",
        state.available_since_unix.map(|t| (t - created).to_string()).unwrap_or_else(|| "?".into()),
        answered - created,
    );
    let top = super::support::run(&["kubectl", "top", "nodes", "--no-headers"]);
    let text = String::from_utf8_lossy(&top.stdout).to_string();
    assert!(top.status.success(), "kubectl top nodes failed: {}", String::from_utf8_lossy(&top.stderr));
    let listed: Vec<&str> = text.lines().filter_map(|l| l.split_whitespace().next()).collect();
    for n in nodes {
        assert!(listed.contains(&n.as_str()), "kubectl top nodes does not list {n}:\n{text}");
    }
    assert_eq!(listed.len(), nodes.len(), "kubectl top nodes:\n{text}");
}
