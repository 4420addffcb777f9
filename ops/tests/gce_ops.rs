//! `validate cluster` and `rolling-update` on GCE against the harness's Compute emulator (in process,
//! 127.0.0.1) with `examples/gce.yaml` applied: each instance group's MIGs read back
//! (`listManagedInstances`, RUNNING only, addresses from `instances.list`) and judged against Nodes
//! matched by InternalIP; after a changed machine type, the instances on the old template recreated
//! one at a time onto the new one, and nothing else.

use std::sync::Arc;
use std::time::Duration;

use base::StateStore;
use cloud::gce::{GceEndpoints, TokenSource};
use cloud_resources::gce::GceTarget;
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeCondition, NodeStatus, Pod, PodCondition, PodStatus};
use keelson_api::Role;
use ops::validate::{report, CloudGroup};
use serde_json::json;
use testkit::gce_compute::{Config, GceCompute};
use testkit::httpd::{Request, Server};

const PROJECT: &str = "acme-platform";

fn spec() -> String {
    std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/gce.yaml")).expect("example")
}

fn model(text: &str) -> cloud_resources::model::ClusterModel {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("cluster.yaml");
    std::fs::write(&path, text).expect("write spec");
    let docs = spec_compiler::load::load_spec(&path).unwrap_or_else(|e| panic!("{e}"));
    let asset = |a: &str| spec_compiler::userdata::NodeupAsset::parse(a).expect("asset");
    let amd64 = spec_compiler::versions::Arch::parse("amd64").expect("arch");
    let options = spec_compiler::CompileOptions {
        nodeup_assets: [(amd64, asset("8b1a9953c4611296a827abf8c47804d7e6c49c6b8f0b8c1f4ee3a5e6a1b1c2d3@https://nodeup.mirror.test/amd64/nodeup"))].into(),
        protokube_assets: [(amd64, asset("5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8@https://nodeup.mirror.test/amd64/protokube"))]
            .into(),
        ..Default::default()
    };
    let compiled = spec_compiler::compile(&docs, &options).unwrap_or_else(|e| panic!("{e}"));
    cloud_resources::model::build(&docs, &compiled).unwrap_or_else(|e| panic!("{e}"))
}

fn node(name: &str, ip: &str, ready: bool) -> Node {
    Node {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta { name: Some(name.into()), ..Default::default() },
        status: Some(NodeStatus {
            addresses: Some(vec![NodeAddress { type_: "InternalIP".into(), address: ip.into() }]),
            conditions: Some(vec![NodeCondition { type_: "Ready".into(), status: if ready { "True" } else { "False" }.into(), ..Default::default() }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn ready_pod(name: &str) -> Pod {
    Pod {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta { name: Some(name.into()), ..Default::default() },
        status: Some(PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![PodCondition { type_: "Ready".into(), status: "True".into(), ..Default::default() }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

struct World {
    compute: GceCompute,
    _server: Server,
    _meta: Server,
    target: GceTarget,
    _store_dir: tempfile::TempDir,
    store: StateStore,
}

fn world(boot_delay: Option<Duration>) -> World {
    let compute = GceCompute::new(Config { project: PROJECT.into(), operation_delay: Duration::from_millis(20), boot_delay, ..Config::example() });
    let server = compute.start();
    let mut values = testkit::gce_metadata::InstanceFacts::example().values();
    values.insert("instance/service-accounts/default/token".into(), json!({"access_token": "tok", "expires_in": 3599}).to_string());
    let meta = Server::start(Arc::new(move |req: &Request| testkit::gce_metadata::answer(&values, req)));
    let md = base::gce_metadata::GceMetadata::new(Some(&meta.url("")), Duration::from_secs(5)).expect("metadata");
    let target =
        GceTarget::new(&GceEndpoints::at(&server.url("")), server.url("").trim_end_matches('/'), PROJECT, TokenSource::new(md), Duration::from_secs(30))
            .expect("target");
    let store_dir = tempfile::tempdir().expect("tmp");
    let store = StateStore::dir(store_dir.path());
    World { compute, _server: server, _meta: meta, target, _store_dir: store_dir, store }
}

impl World {
    async fn apply(&self, model: &cloud_resources::model::ClusterModel) {
        let planned = cloud_resources::plan_apply_gce(&self.target, model, &self.store).await.expect("plan");
        cloud_resources::execute_gce(&self.target, model, &self.store, &planned).await.expect("apply");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_mig_instance_must_be_a_ready_node() {
    let w = world(None);
    let (compute, target) = (&w.compute, &w.target);
    let model = model(&spec());
    w.apply(&model).await;

    // Still PROVISIONING: no group has a running instance yet.
    let groups = ops::gce_instances::groups(target, &model).await.expect("groups");
    assert!(groups.iter().all(|g| g.instances.is_empty()), "{groups:?}");
    for i in compute.instances() {
        compute.set_instance_status(&i.zone, &i.name, "RUNNING").expect("boot");
    }
    let groups = ops::gce_instances::groups(target, &model).await.expect("groups");
    let by_group = |g: &str| groups.iter().find(|x| x.group == g).unwrap_or_else(|| panic!("group {g}: {groups:?}"));
    let (cp, nodes) = (by_group("control-plane-europe-west1-b"), by_group("nodes-europe-west1-b"));
    assert_eq!((cp.role, cp.target, cp.instances.len()), (Role::ControlPlane, 1, 1));
    assert_eq!((nodes.role, nodes.target, nodes.instances.len()), (Role::Node, 2, 2));
    for i in compute.instances() {
        let g = groups.iter().find(|g| g.instances.iter().any(|(n, _)| *n == i.name)).unwrap_or_else(|| panic!("{} in no group", i.name));
        assert_eq!(g.instances.iter().find(|(n, _)| *n == i.name).and_then(|(_, ip)| ip.clone()), Some(i.network_ip.clone()), "{}", i.name);
    }

    let cloud: Vec<CloudGroup> =
        groups.iter().map(|g| CloudGroup { group: g.group.clone(), role: g.role, min: g.target, max: g.target, instances: g.instances.clone() }).collect();
    // A Node per instance (named after it, at its address); the control plane's static pods on
    // every control-plane node.
    let all: Vec<Node> = groups.iter().flat_map(|g| g.instances.iter()).map(|(name, ip)| node(name, ip.as_deref().expect("address"), true)).collect();
    let pods: Vec<Pod> = groups
        .iter()
        .filter(|g| g.role == Role::ControlPlane)
        .flat_map(|g| g.instances.iter())
        .flat_map(|(n, _)| ["kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd-manager-main"].map(|c| ready_pod(&format!("{c}-{n}"))))
        .collect();
    // Every MIG instance a Ready node: valid.
    let r = report("gce.k8s.example.com", &cloud, &all, &pods);
    assert!(r.valid(), "{}", r.render());
    // One node has not joined: the machine and its group fail.
    let missing = nodes.instances[1].0.clone();
    let one_missing: Vec<Node> = all.iter().filter(|n| n.metadata.name.as_deref() != Some(missing.as_str())).cloned().collect();
    let r = report("gce.k8s.example.com", &cloud, &one_missing, &pods);
    let text = r.render();
    assert!(!r.valid(), "{text}");
    assert!(r.failures.iter().any(|f| f.kind == "Machine" && f.name == missing), "{text}");
    assert!(r.failures.iter().any(|f| f.kind == "InstanceGroup" && f.name == "nodes-europe-west1-b" && f.message.contains("1 of at least 2")), "{text}");
    assert_eq!(r.failures.len(), 2, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_update_recreates_the_instances_on_an_old_template_one_at_a_time() {
    let w = world(Some(Duration::from_millis(10)));
    let text = spec();
    w.apply(&model(&text)).await;
    let opts = ops::rolling::RollingOptions {
        poll: Duration::from_millis(20),
        control_plane_interval: Duration::ZERO,
        node_interval: Duration::ZERO,
        validation_timeout: Duration::from_secs(20),
        ..Default::default()
    };
    let sel = opts.selection();
    let model1 = model(&text);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let groups = ops::gce_instances::status(&w.target, &model1, &sel).await.expect("status");
    assert!(groups.iter().all(|g| g.outdated().is_empty()), "{groups:?}");

    let model2 = model(&text.replacen("machineType: e2-standard-4", "machineType: e2-standard-8", 1));
    w.apply(&model2).await;
    let before: Vec<_> = w.compute.instances();
    let groups = ops::gce_instances::status(&w.target, &model2, &sel).await.expect("status");
    let outdated: Vec<&str> = groups.iter().flat_map(|g| g.outdated()).map(|i| i.id.as_str()).collect();
    assert_eq!(outdated.len(), 2, "the two nodes run the old template: {groups:?}");
    assert!(ops::instances::render(&groups).contains("NeedsUpdate"));

    let mut lines = Vec::new();
    let report = ops::rolling::roll(&w.target, &model2, &opts, &mut |l| lines.push(l.to_string())).await.expect("roll");
    assert_eq!(report.replaced.len(), 2, "{lines:#?}");
    let after = w.compute.instances();
    for b in &before {
        let a = after.iter().find(|a| a.name == b.name).unwrap_or_else(|| panic!("{} is back", b.name));
        if outdated.contains(&b.name.as_str()) {
            assert_ne!(a.id, b.id, "{} recreated", b.name);
            assert_eq!(a.machine_type, "e2-standard-8", "{} on the new template", b.name);
        } else {
            assert_eq!(a.id, b.id, "{} (up to date) untouched", b.name);
        }
    }
    let groups = ops::gce_instances::status(&w.target, &model2, &sel).await.expect("status");
    assert!(groups.iter().all(|g| g.outdated().is_empty()), "nothing left to roll: {groups:?}");
}

/// With `rollingUpdate.maxSurge: 1` on the workers' group: the MIG is resized up first (a worker on
/// the new template starts before any old one goes), then one outdated worker is recreated and the
/// other drained and deleted — the group back at its size; kOps cannot surge on GCE. The
/// control planes, whose group sets nothing, do not surge (0 is GCE's default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_surge_starts_the_new_worker_first_and_deletes_an_old_one_instead_of_recreating_it() {
    let w = world(Some(Duration::from_millis(10)));
    let text = spec().replacen("  minSize: 2\n  maxSize: 4\n", "  minSize: 2\n  maxSize: 4\n  rollingUpdate:\n    maxSurge: 1\n", 1);
    assert!(text.contains("maxSurge: 1"), "the workers' group");
    w.apply(&model(&text)).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let changed = text.replacen("machineType: e2-standard-4", "machineType: e2-standard-8", 1);
    let model2 = model(&changed);
    w.apply(&model2).await;
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("cluster.yaml");
    std::fs::write(&path, &changed).expect("write spec");
    let docs = spec_compiler::load::load_spec(&path).unwrap_or_else(|e| panic!("{e}"));
    let opts = ops::rolling::RollingOptions {
        poll: Duration::from_millis(20),
        control_plane_interval: Duration::ZERO,
        node_interval: Duration::ZERO,
        validation_timeout: Duration::from_secs(20),
        surge: Some(ops::surge::SurgeSpec::from_documents(&docs)),
        // A surge is validated before anything goes (as on AWS; kOps: no surge with --cloudonly).
        validate: ops::rolling::Validation::Custom(Arc::new(Scripted(|_: &str| Vec::new()))),
        validate_success_pause: Duration::ZERO,
        ..Default::default()
    };
    let before = w.compute.instances();
    let groups = ops::gce_instances::status(&w.target, &model2, &opts.selection()).await.expect("status");
    let outdated: Vec<String> = groups.iter().flat_map(|g| g.outdated()).map(|i| i.id.clone()).collect();
    assert_eq!(outdated.len(), 2, "{groups:?}");

    let mut lines = Vec::new();
    let report = ops::rolling::roll(&w.target, &model2, &opts, &mut |l| lines.push(l.to_string())).await.expect("roll");
    assert_eq!(report.replaced.len(), 2, "{lines:#?}");
    let step = |needle: &str| lines.iter().position(|l| l.contains(needle)).unwrap_or_else(|| panic!("no {needle:?} in {lines:#?}"));
    assert!(lines[step("surge: resizing")].contains("from 2 to 3"), "{lines:#?}");
    // kOps' order: the attached instances first, the surged one (its replacement already runs) last.
    assert!(step("surge: resizing") < step("recreating instance") && step("recreating instance") < step("deleting instance"), "{lines:#?}");
    assert_eq!(lines.iter().filter(|l| l.contains("surge: resizing")).count(), 1, "only the workers surge: {lines:#?}");

    let after = w.compute.instances();
    let workers: Vec<_> = after.iter().filter(|i| i.mig.as_deref().is_some_and(|m| m.contains("nodes"))).collect();
    assert_eq!(workers.len(), 2, "back at the group's size: {workers:?}");
    assert!(workers.iter().all(|i| i.machine_type == "e2-standard-8"), "{workers:?}");
    let kept: Vec<&str> = outdated.iter().filter(|n| workers.iter().any(|i| &&i.name == n)).map(String::as_str).collect();
    assert_eq!(kept.len(), 1, "one old name recreated, one deleted for the surged instance: {kept:?} of {outdated:?}");
    let deleted = outdated.iter().find(|n| !kept.contains(&n.as_str())).expect("the deleted one");
    assert!(before.iter().any(|i| &i.name == deleted), "it was there before");
    let groups = ops::gce_instances::status(&w.target, &model2, &opts.selection()).await.expect("status");
    assert!(groups.iter().all(|g| g.outdated().is_empty()), "nothing left to roll: {groups:?}");
    let sizes: Vec<i32> = groups.iter().filter(|g| g.group.starts_with("nodes")).map(|g| g.desired).collect();
    assert_eq!(sizes, vec![2], "target size restored");
}

/// A cluster whose health is a function of the group rolled: its problems, none = valid.
struct Scripted<F>(F);

impl<F: Fn(&str) -> Vec<String> + Send + Sync> ops::rolling::ClusterHealth for Scripted<F> {
    fn problems<'a>(&'a self, group: &'a ops::groups::GroupStatus) -> ops::rolling::BoxFuture<'a, Result<Vec<String>, String>> {
        let problems = (self.0)(&group.group);
        Box::pin(async move { Ok(problems) })
    }
}

/// After a changed machine type, with the workers' group never validating:
/// `--fail-on-validate-error=false` logs it and replaces both workers (before the group and after
/// each replacement), as on AWS; the default stops before the group with nothing touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_validation_stops_the_roll_only_with_fail_on_validate_error() {
    let w = world(Some(Duration::from_millis(10)));
    let text = spec();
    w.apply(&model(&text)).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let model2 = model(&text.replacen("machineType: e2-standard-4", "machineType: e2-standard-8", 1));
    w.apply(&model2).await;
    let not_valid = |group: &str| vec![format!("InstanceGroup {group}: did not have enough ready nodes: 1 of at least 2")];
    let opts = ops::rolling::RollingOptions {
        poll: Duration::from_millis(20),
        control_plane_interval: Duration::ZERO,
        node_interval: Duration::ZERO,
        post_drain_delay: Duration::ZERO,
        validation_timeout: Duration::from_secs(20),
        validate: ops::rolling::Validation::Custom(Arc::new(Scripted(not_valid))),
        ..Default::default()
    };
    let before = w.compute.instances();

    let mut lines = Vec::new();
    let err = ops::rolling::roll(&w.target, &model2, &opts, &mut |l| lines.push(l.to_string())).await.expect_err("the default stops");
    assert!(matches!(&err, ops::rolling::RollingError::NotValidBefore { group, .. } if group == "nodes-europe-west1-b"), "{err}");
    let ids = |v: &[testkit::gce_compute::InstanceView]| v.iter().map(|i| (i.name.clone(), i.id.clone())).collect::<Vec<_>>();
    assert_eq!(ids(&w.compute.instances()), ids(&before), "nothing touched: {lines:#?}");

    let mut lines = Vec::new();
    let go_on = ops::rolling::RollingOptions { fail_on_validate_error: false, ..opts.clone() };
    let report = ops::rolling::roll(&w.target, &model2, &go_on, &mut |l| lines.push(l.to_string())).await.expect("goes on");
    assert_eq!(report.replaced.len(), 2, "{lines:#?}");
    let warned = lines.iter().filter(|l| l.contains("going on (--fail-on-validate-error=false)")).count();
    assert_eq!(warned, 3, "before the group and after each replacement: {lines:#?}");
    let workers: Vec<_> = w.compute.instances().into_iter().filter(|i| i.mig.as_deref().is_some_and(|m| m.contains("nodes"))).collect();
    assert!(workers.len() == 2 && workers.iter().all(|i| i.machine_type == "e2-standard-8"), "{workers:?}");
}

/// A Kubernetes API over the emulator's instances: every RUNNING instance is a Ready Node named
/// after it at its address (a new Node when the instance is recreated: metadata patches are kept
/// per instance id), each control-plane Node runs its static pods; no workload pods. Node patches
/// are recorded.
#[derive(Default)]
struct Kubelets {
    /// Instance id → the merge patches applied to its Node.
    patched: std::collections::BTreeMap<String, serde_json::Value>,
    /// (node, patch) in order.
    patches: Vec<(String, serde_json::Value)>,
}

fn merge(target: &mut serde_json::Value, patch: &serde_json::Value) {
    match patch {
        serde_json::Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().expect("object");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(serde_json::Value::Null), v);
                }
            }
        }
        _ => *target = patch.clone(),
    }
}

fn kube_api(compute: GceCompute, kubelets: Arc<std::sync::Mutex<Kubelets>>) -> Server {
    let reply = |status: u16, v: &serde_json::Value| {
        testkit::httpd::Response::bytes(status, serde_json::to_vec(v).expect("json")).header("Content-Type", "application/json")
    };
    Server::start(Arc::new(move |req: &Request| {
        let mut k = kubelets.lock().expect("lock");
        let running: Vec<_> = compute.instances().into_iter().filter(|i| i.status == "RUNNING").collect();
        let node_of = |i: &testkit::gce_compute::InstanceView, k: &Kubelets| {
            let mut n = json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": i.name, "resourceVersion": "1"},
                "status": {
                    "addresses": [{"type": "InternalIP", "address": i.network_ip}],
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            });
            if let Some(p) = k.patched.get(&i.id) {
                merge(&mut n, p);
            }
            n
        };
        let control_plane = |i: &&testkit::gce_compute::InstanceView| i.mig.as_deref().is_some_and(|m| m.contains("control-plane"));
        match (req.method.as_str(), req.path.as_str()) {
            ("GET", "/api/v1/nodes") => {
                let items: Vec<_> = running.iter().map(|i| node_of(i, &k)).collect();
                reply(200, &json!({"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": items}))
            }
            ("GET", "/api/v1/namespaces/kube-system/pods") => {
                let items: Vec<_> = running
                    .iter()
                    .filter(control_plane)
                    .flat_map(|i| ["kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd-manager-main"].map(|c| format!("{c}-{}", i.name)))
                    .map(|name| {
                        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "kube-system"},
                               "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})
                    })
                    .collect();
                reply(200, &json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}))
            }
            // The pods on a node being drained: none but the static ones (left alone anyway).
            ("GET", "/api/v1/pods") => reply(200, &json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": []})),
            (method, path) if path.starts_with("/api/v1/nodes/") => {
                let name = path.trim_start_matches("/api/v1/nodes/");
                let Some(i) = running.iter().find(|i| i.name == name) else {
                    return reply(404, &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "NotFound", "code": 404}));
                };
                if method == "PATCH" {
                    let patch: serde_json::Value = serde_json::from_slice(&req.body).expect("patch body");
                    k.patches.push((name.to_string(), patch.clone()));
                    merge(k.patched.entry(i.id.clone()).or_insert_with(|| json!({})), &patch);
                }
                reply(200, &node_of(i, &k))
            }
            (method, path) => reply(
                404,
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": format!("{method} {path}"), "code": 404}),
            ),
        }
    }))
}

/// kOps' `AdjustNeedUpdate` on GCE: no instance runs an old template, but one worker's Node is
/// annotated `kops.k8s.io/needs-update`; the roll (validating and draining through the Kubernetes
/// API) counts it outdated, taints and drains its Node, recreates exactly that instance, and leaves
/// nothing to roll afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_annotated_needs_update_is_replaced_though_its_template_is_current() {
    let w = world(Some(Duration::from_millis(10)));
    let m = model(&spec());
    w.apply(&m).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let kubelets = Arc::new(std::sync::Mutex::new(Kubelets::default()));
    let api = kube_api(w.compute.clone(), kubelets.clone());
    let mut config = kube::Config::new(api.url("").parse().expect("url"));
    config.default_retry = false;
    let kube = kube::Client::try_from(config).expect("client");
    let opts = ops::rolling::RollingOptions {
        poll: Duration::from_millis(20),
        control_plane_interval: Duration::ZERO,
        node_interval: Duration::ZERO,
        post_drain_delay: Duration::ZERO,
        validate_tick: Duration::from_millis(50),
        validate_success_pause: Duration::ZERO,
        validation_timeout: Duration::from_secs(20),
        eviction_retry: Duration::from_millis(20),
        validate: ops::rolling::Validation::Cluster(kube.clone()),
        ..Default::default()
    };
    let groups = ops::groups::RollingTarget::instance_groups(&w.target, &m);
    let status = ops::rolling::status(groups.as_ref(), &opts).await.expect("status");
    assert!(status.iter().all(|g| g.outdated().is_empty()), "every instance on its MIG's template: {}", ops::groups::render(&status));

    let before = w.compute.instances();
    let marked = before.iter().find(|i| i.mig.as_deref().is_some_and(|m| m.contains("nodes"))).expect("a worker").clone();
    kubelets.lock().expect("lock").patched.insert(marked.id.clone(), json!({"metadata": {"annotations": {ops::drain::NEEDS_UPDATE: ""}}}));
    let status = ops::rolling::status(groups.as_ref(), &opts).await.expect("status");
    let outdated: Vec<&str> = status.iter().flat_map(|g| g.outdated()).map(|i| i.id.as_str()).collect();
    assert_eq!(outdated, [marked.name.as_str()], "{}", ops::groups::render(&status));

    let mut lines = Vec::new();
    let report = ops::rolling::roll(&w.target, &m, &opts, &mut |l| lines.push(l.to_string())).await.expect("roll");
    assert_eq!(report.replaced, [("nodes-europe-west1-b".to_string(), marked.name.clone(), marked.name.clone())], "{lines:#?}");
    for b in &before {
        let a = w.compute.instance(&b.zone, &b.name).unwrap_or_else(|| panic!("{} is back", b.name));
        assert_eq!(a.id != b.id, b.name == marked.name, "only {} recreated ({})", marked.name, b.name);
    }
    let patches: Vec<String> = kubelets.lock().expect("lock").patches.iter().filter(|(n, _)| *n == marked.name).map(|(_, p)| p.to_string()).collect();
    assert!(patches.iter().any(|p| p.contains(ops::drain::TAINT_KEY)), "tainted: {patches:?}");
    assert!(patches.iter().any(|p| p.contains("\"unschedulable\":true")), "drained: {patches:?}");
    let status = ops::rolling::status(groups.as_ref(), &opts).await.expect("status");
    assert!(status.iter().all(|g| g.outdated().is_empty()), "the new Node is not annotated: {}", ops::groups::render(&status));
}
