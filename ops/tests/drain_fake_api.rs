//! The drain's Kubernetes calls against a small fake API server (testkit's HTTP server on 127.0.0.1):
//! one Node and its pods, merge patches applied as the API server does, and an Eviction API that
//! refuses (429, a PodDisruptionBudget) as often as a test says.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ops::drain::{self, DrainError, DrainOptions};
use serde_json::{json, Value};
use testkit::httpd::{Response, Server};

#[derive(Default)]
struct Cluster {
    node: Value,
    /// Pods on the node, by `namespace/name`.
    pods: BTreeMap<String, Value>,
    /// Evictions still to refuse, by `namespace/name` (`u32::MAX`: always).
    refusals: BTreeMap<String, u32>,
    /// Pods that stay after an accepted eviction (a pod that never terminates).
    stuck: Vec<String>,
    evictions: Vec<String>,
    node_patches: usize,
}

/// RFC 7386 JSON merge patch.
fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().expect("object");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        _ => *target = patch.clone(),
    }
}

fn json_response(status: u16, v: &Value) -> Response {
    Response::bytes(status, serde_json::to_vec(v).expect("json")).header("Content-Type", "application/json")
}

fn status(code: u16, reason: &str, message: &str) -> Response {
    json_response(code, &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": reason, "message": message, "code": code}))
}

fn pod(ns: &str, name: &str, owner: Option<&str>, mirror: bool, empty_dir: bool) -> Value {
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": ns, "name": name, "uid": format!("uid-{name}")},
        "spec": {"nodeName": "ip-10-0-0-1", "containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Running"}
    });
    if let Some(kind) = owner {
        p["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": kind, "name": "o", "uid": "o", "controller": true}]);
    }
    if mirror {
        p["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "x"});
    }
    if empty_dir {
        p["spec"]["volumes"] = json!([{"name": "scratch", "emptyDir": {}}]);
    }
    p
}

fn fake(cluster: Arc<Mutex<Cluster>>) -> Server {
    Server::start(Arc::new(move |req| {
        let mut c = cluster.lock().expect("lock");
        let node_name = c.node["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let node_path = format!("/api/v1/nodes/{node_name}");
        match (req.method.as_str(), req.path.as_str()) {
            ("GET", "/api/v1/nodes") => json_response(200, &json!({"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": [c.node.clone()]})),
            ("GET", p) if p == node_path => json_response(200, &c.node),
            ("PATCH", p) if p == node_path => {
                let patch: Value = serde_json::from_slice(&req.body).expect("patch body");
                let want = patch["metadata"]["resourceVersion"].as_str().map(str::to_string);
                if want.is_some() && want.as_deref() != c.node["metadata"]["resourceVersion"].as_str() {
                    return status(409, "Conflict", "the object has been modified");
                }
                merge(&mut c.node, &patch);
                let rv = c.node_patches + 2;
                c.node["metadata"]["resourceVersion"] = json!(rv.to_string());
                c.node_patches += 1;
                json_response(200, &c.node)
            }
            ("PATCH", _) => status(404, "NotFound", "no such node"),
            ("GET", "/api/v1/pods") => {
                assert!(req.query.contains("fieldSelector=spec.nodeName%3Dip-10-0-0-1"), "{}", req.query);
                json_response(200, &json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": c.pods.values().cloned().collect::<Vec<_>>()}))
            }
            ("POST", p) if p.ends_with("/eviction") => {
                let parts: Vec<&str> = p.split('/').collect();
                let key = format!("{}/{}", parts[4], parts[6]);
                c.evictions.push(key.clone());
                if !c.pods.contains_key(&key) {
                    return status(404, "NotFound", "pod not found");
                }
                let refuse = c.refusals.get(&key).copied().unwrap_or(0);
                if refuse > 0 {
                    if refuse != u32::MAX {
                        c.refusals.insert(key, refuse - 1);
                    }
                    return status(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.");
                }
                if !c.stuck.contains(&key) {
                    c.pods.remove(&key);
                }
                json_response(201, &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}))
            }
            _ => status(404, "NotFound", &format!("{} {}", req.method, req.path)),
        }
    }))
}

fn cluster() -> Arc<Mutex<Cluster>> {
    let node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "ip-10-0-0-1", "resourceVersion": "1", "labels": {"kubernetes.io/hostname": "ip-10-0-0-1"}},
        "spec": {"taints": [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]},
        "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}
    });
    let pods = [
        pod("default", "web-1", Some("ReplicaSet"), false, false),
        pod("default", "cache-1", Some("ReplicaSet"), false, true),
        pod("default", "bare", None, false, false),
        pod("kube-system", "kube-proxy-x", Some("DaemonSet"), false, false),
        pod("kube-system", "kube-apiserver-ip-10-0-0-1", Some("Node"), true, false),
    ];
    let pods = pods
        .into_iter()
        .map(|p| (format!("{}/{}", p["metadata"]["namespace"].as_str().unwrap_or_default(), p["metadata"]["name"].as_str().unwrap_or_default()), p))
        .collect();
    Arc::new(Mutex::new(Cluster { node, pods, ..Default::default() }))
}

async fn client(server: &Server) -> kube::Client {
    let mut config = kube::Config::new(server.url("").parse().expect("url"));
    // As `validate::kube_client` makes it: refused evictions (429) reach the drain.
    config.default_retry = false;
    kube::Client::try_from(config).expect("client")
}

fn opts(timeout: Duration) -> DrainOptions {
    DrainOptions { timeout, retry: Duration::from_millis(20) }
}

#[tokio::test]
async fn marking_annotates_and_taints_once_and_the_drain_evicts_workloads_through_pdb_refusals() {
    let c = cluster();
    c.lock().expect("lock").refusals.insert("default/web-1".into(), 2);
    let server = fake(c.clone());
    let kube = client(&server).await;
    drain::mark_for_update(&kube, "ip-10-0-0-1").await.expect("mark");
    drain::mark_for_update(&kube, "ip-10-0-0-1").await.expect("mark again");
    {
        let c = c.lock().expect("lock");
        assert!(c.node["metadata"]["annotations"].get(drain::NEEDS_UPDATE).is_some(), "{}", c.node);
        let taints = c.node["spec"]["taints"].as_array().expect("taints");
        assert_eq!(taints.len(), 2, "the update taint once, the node's own kept: {}", c.node);
        assert_eq!(taints[1], json!({"key": drain::TAINT_KEY, "effect": "PreferNoSchedule"}));
    }
    let mut log = Vec::new();
    drain::drain(&kube, "ip-10-0-0-1", &opts(Duration::from_secs(10)), &mut |l| log.push(l.to_string())).await.expect("drained");
    let c = c.lock().expect("lock");
    assert_eq!(c.node["spec"]["unschedulable"], json!(true), "cordoned");
    assert_eq!(c.node["metadata"]["labels"][drain::EXCLUDE_LB], json!(""), "out of service load balancers");
    let left: Vec<&str> = c.pods.keys().map(String::as_str).collect();
    assert_eq!(left, ["kube-system/kube-apiserver-ip-10-0-0-1", "kube-system/kube-proxy-x"], "DaemonSet and mirror pods stay");
    assert_eq!(c.evictions.iter().filter(|e| *e == "default/web-1").count(), 3, "two refusals, then evicted: {:?}", c.evictions);
    assert!(!c.evictions.iter().any(|e| e.starts_with("kube-system/")), "{:?}", c.evictions);
    assert!(log.iter().any(|l| l.contains("refused by a PodDisruptionBudget")), "{log:?}");
    assert!(log.iter().any(|l| l.contains("leaving kube-system/kube-proxy-x (DaemonSet)")), "{log:?}");
}

#[tokio::test]
async fn a_pdb_that_never_allows_the_eviction_fails_the_drain_at_its_timeout() {
    let c = cluster();
    c.lock().expect("lock").refusals.insert("default/web-1".into(), u32::MAX);
    let server = fake(c.clone());
    let kube = client(&server).await;
    let started = std::time::Instant::now();
    let err = drain::drain(&kube, "ip-10-0-0-1", &opts(Duration::from_millis(300)), &mut |_| {}).await.expect_err("refused to the end");
    assert!(matches!(&err, DrainError::Evict { message, .. } if message.contains("default/web-1") && message.contains("PodDisruptionBudget")), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5), "bounded by the drain timeout");
    assert!(c.lock().expect("lock").pods.contains_key("default/web-1"));
}

#[tokio::test]
async fn a_pod_that_does_not_terminate_times_the_drain_out() {
    let c = cluster();
    c.lock().expect("lock").stuck.push("default/bare".into());
    let server = fake(c.clone());
    let kube = client(&server).await;
    let err = drain::drain(&kube, "ip-10-0-0-1", &opts(Duration::from_millis(300)), &mut |_| {}).await.expect_err("stuck pod");
    assert!(matches!(&err, DrainError::Timeout { pods, .. } if pods == "default/bare"), "{err}");
}

/// A client that retries 429s itself still ends the drain at its timeout.
#[tokio::test]
async fn a_client_retrying_refusals_itself_is_still_bounded_by_the_drain_timeout() {
    let c = cluster();
    c.lock().expect("lock").refusals.insert("default/web-1".into(), u32::MAX);
    let server = fake(c.clone());
    let kube = kube::Client::try_from(kube::Config::new(server.url("").parse().expect("url"))).expect("client");
    let started = std::time::Instant::now();
    let err = drain::drain(&kube, "ip-10-0-0-1", &opts(Duration::from_millis(300)), &mut |_| {}).await.expect_err("refused to the end");
    assert!(matches!(&err, DrainError::Timeout { pods, .. } if pods.contains("default/web-1")), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5), "bounded by the drain timeout: {:?}", started.elapsed());
}

#[tokio::test]
async fn a_node_already_gone_is_no_error() {
    let c = cluster();
    let server = fake(c.clone());
    let kube = client(&server).await;
    drain::mark_for_update(&kube, "ip-10-0-0-9").await.expect("gone");
    let nodes = drain::list_nodes(&kube).await.expect("nodes");
    assert_eq!(nodes.len(), 1);
    assert_eq!(drain::nodes_by_ip(&nodes).keys().collect::<Vec<_>>(), ["10.0.0.1"]);
}
