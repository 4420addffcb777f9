//! The node labeller against a real moto (EC2, Auto Scaling: instances of a worker group and a
//! control-plane group, as `keelson apply` tags them) and an in-process fake Kubernetes API (plain
//! HTTP: list, watch, patch of Nodes): each Node gets its group's labels as the group's NodeupConfig
//! in the state store says, from the list and from a watch event; a Node that claims another
//! instance, or whose instance was retagged into the control-plane group, gets nothing.
//! Needs moto (scripts/test installs it); fails loudly without it.

#[path = "support/iam.rs"]
mod iam;
#[path = "../../cloud/tests/support/moto.rs"]
mod moto;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use serde_json::{json, Value};

use protokube::metrics::Metrics;
use protokube::node_labels::aws::AwsNodes;
use protokube::node_labels::{self, Labeller, NodeCloud, NodeFacts, INSTANCE_GROUP_LABEL};

const CLUSTER: &str = "labels.example.com";
const CP_LABELS: &[&str] =
    &["node-role.kubernetes.io/control-plane", "kops.k8s.io/kops-controller-pki", "node.kubernetes.io/exclude-from-external-load-balancers"];

/// The tests hold the moto lock (a std mutex) on the test thread and run their body on this runtime.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

/// One instance of the autoscaling group `<group>.<CLUSTER>` (tags as `keelson apply` sets them):
/// (instance id, private DNS name).
async fn group_instance(conf: &cloud::aws::SdkConfig, group: &str, n: u8) -> (String, String) {
    let ec2 = aws_sdk_ec2::Client::new(conf);
    let asg = aws_sdk_autoscaling::Client::new(conf);
    let vpc = ec2.create_vpc().cidr_block("172.20.0.0/16").send().await.expect("vpc");
    let vpc_id = vpc.vpc().and_then(|v| v.vpc_id()).expect("vpc id").to_string();
    // A subnet of its own: instances of different groups get different addresses (and names).
    let subnet = ec2.create_subnet().vpc_id(&vpc_id).cidr_block(format!("172.20.{n}.0/24")).availability_zone("us-east-1a").send().await.expect("subnet");
    let subnet_id = subnet.subnet().and_then(|s| s.subnet_id()).expect("subnet id").to_string();
    ec2.create_launch_template()
        .launch_template_name(group)
        .launch_template_data(
            aws_sdk_ec2::types::RequestLaunchTemplateData::builder().image_id("ami-12c6146b").instance_type(aws_sdk_ec2::types::InstanceType::T3Medium).build(),
        )
        .send()
        .await
        .expect("launch template");
    let tag = |k: &str, v: &str| aws_sdk_autoscaling::types::Tag::builder().key(k).value(v).propagate_at_launch(true).build();
    let name = format!("{group}.{CLUSTER}");
    asg.create_auto_scaling_group()
        .auto_scaling_group_name(&name)
        .launch_template(aws_sdk_autoscaling::types::LaunchTemplateSpecification::builder().launch_template_name(group).build())
        .min_size(1)
        .max_size(1)
        .vpc_zone_identifier(&subnet_id)
        .tags(tag("KubernetesCluster", CLUSTER))
        .tags(tag(INSTANCE_GROUP_LABEL, group))
        .send()
        .await
        .expect("autoscaling group");
    let out = asg.describe_auto_scaling_groups().auto_scaling_group_names(&name).send().await.expect("describe asg");
    let id = out.auto_scaling_groups().first().and_then(|g| g.instances().first()).and_then(|i| i.instance_id()).expect("instance").to_string();
    let out = ec2.describe_instances().instance_ids(&id).send().await.expect("describe");
    let dns = out.reservations().iter().flat_map(|r| r.instances()).next().and_then(|i| i.private_dns_name()).expect("dns").to_string();
    (id, dns)
}

/// A group of the state store: name, role, the node labels of its NodeupConfig.
type Group<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)]);

/// The state store as `keelson apply` leaves it: each group and its NodeupConfig.
async fn store_with(dir: &std::path::Path, groups: &[Group<'_>]) -> base::StateStore {
    let store = base::StateStore::dir(dir);
    for (name, role, labels) in groups {
        let ig =
            format!("apiVersion: kops.k8s.io/v1alpha2\nkind: InstanceGroup\nmetadata:\n  name: {name}\nspec:\n  role: {role}\n  minSize: 1\n  maxSize: 1\n");
        store.put(&format!("instancegroup/{name}"), ig.as_bytes()).await.expect("ig");
        let dir = if *role == "Node" { "node" } else { "control-plane" };
        let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
        let nodeup = json!({"ClusterName": CLUSTER, "KubernetesVersion": "1.34.4", "KubeletConfig": {"nodeLabels": labels}, "Networking": {},
            "UpdatePolicy": "automatic", "containerdConfig": {}, "usesNoneDNS": false});
        store
            .put(&format!("igconfig/{dir}/{name}/nodeupconfig.yaml"), serde_yaml_ng::to_string(&nodeup).expect("yaml").as_bytes())
            .await
            .expect("nodeup config");
    }
    store
}

struct World {
    conf: cloud::aws::SdkConfig,
    _dir: tempfile::TempDir,
    store: base::StateStore,
    worker: (String, String),
    worker2: (String, String),
    /// A worker of `nodes-b` whose kubelet will claim to be the control plane's instance.
    impostor: (String, String),
    cp: (String, String),
    url: String,
    /// The labeller's EC2 calls (as the control plane) are held against its policy on drop.
    iam: iam::Mark,
}

impl Drop for World {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let spec = format!(
                "apiVersion: kops.k8s.io/v1alpha2\nkind: Cluster\nmetadata:\n  name: {CLUSTER}\nspec:\n  cloudProvider: aws\n  configBase: file://{}\n",
                self._dir.path().display()
            );
            self.iam.assert_allowed(&self.url, &spec, moto::REGION);
        }
    }
}

async fn world(url: &str) -> World {
    let conf = moto::sdk(url).await;
    let worker = group_instance(&conf, "nodes", 1).await;
    let worker2 = group_instance(&conf, "spot-nodes", 2).await;
    let cp = group_instance(&conf, "control-plane-a", 3).await;
    let impostor = group_instance(&conf, "nodes-b", 4).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cp_labels: Vec<(&str, &str)> = CP_LABELS.iter().map(|k| (*k, "")).collect();
    let store = store_with(
        dir.path(),
        &[
            ("nodes", "Node", &[("node-role.kubernetes.io/node", ""), ("team", "blue")]),
            ("spot-nodes", "Node", &[("node-role.kubernetes.io/node", ""), ("node-role.kubernetes.io/spot-worker", "true")]),
            ("control-plane-a", "ControlPlane", &cp_labels),
            ("nodes-b", "Node", &[("node-role.kubernetes.io/node", "")]),
        ],
    )
    .await;
    World { conf, _dir: dir, store, worker, worker2, impostor, cp, url: url.to_string(), iam: iam::Mark::now() }
}

fn facts(name: &str, provider_id: Option<String>) -> NodeFacts {
    NodeFacts { name: name.into(), uid: format!("uid-{name}"), provider_id, ..Default::default() }
}

fn pid(id: &str) -> Option<String> {
    Some(format!("aws:///us-east-1a/{id}"))
}

#[test]
fn ec2_vouches_for_the_group_of_the_instance_of_the_nodes_name() {
    let (_guard, local) = moto::lock();
    runtime().block_on(async {
        let w = world(&local.url).await;
        let aws = AwsNodes::new(aws_sdk_ec2::Client::new(&iam::as_control_plane(&w.conf)), CLUSTER);
        let nodes = [
            facts(&w.worker.1, pid(&w.worker.0)),
            facts(&w.cp.1, pid(&w.cp.0)),
            // A worker's Node whose providerID names the control plane's instance.
            facts(&w.worker.1, pid(&w.cp.0)),
            facts("ip-10-99-99-99.ec2.internal", None),
        ];
        let refs: Vec<&NodeFacts> = nodes.iter().collect();
        let got = aws.identify(&refs).await;
        assert_eq!(got[0].as_ref().map(|i| (i.group.as_str(), i.instance.as_str())), Ok(("nodes", w.worker.0.as_str())));
        assert_eq!(got[1].as_ref().map(|i| i.group.as_str()), Ok("control-plane-a"));
        assert_eq!(got[2].as_ref().map_err(|u| u.reason), Err("provider-id"), "{:?}", got[2]);
        assert_eq!(got[3].as_ref().map_err(|u| u.reason), Err("no-instance"), "{:?}", got[3]);

        // The worker's instance retagged into the control-plane group (by whoever may tag it): its
        // autoscaling group still says `nodes`, so no group is vouched for.
        let ec2 = aws_sdk_ec2::Client::new(&w.conf);
        ec2.create_tags()
            .resources(&w.worker.0)
            .tags(aws_sdk_ec2::types::Tag::builder().key(INSTANCE_GROUP_LABEL).value("control-plane-a").build())
            .send()
            .await
            .expect("retag");
        let got = aws.identify(&[&facts(&w.worker.1, pid(&w.worker.0))]).await;
        assert_eq!(got[0].as_ref().map_err(|u| u.reason), Err("group"), "{:?}", got[0]);
    });
}

/// The fake API: the Nodes it lists, the events its first watch sends, the patches it received.
#[derive(Default)]
struct Api {
    nodes: Vec<Value>,
    watch_events: Vec<Value>,
    watches: usize,
    patches: Vec<(String, Value)>,
}

type Shared = Arc<Mutex<Api>>;

fn answer(code: u16, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = hyper::StatusCode::from_u16(code).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    r
}

async fn handle(api: Shared, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let watch = req.uri().query().is_some_and(|q| q.split('&').any(|p| p == "watch=true"));
    let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let mut api = api.lock().unwrap_or_else(|p| p.into_inner());
    Ok(match (method.as_str(), path.as_str()) {
        ("GET", "/api/v1/nodes") if watch => {
            api.watches += 1;
            // The first watch delivers the events, later ones end at once (as a timed-out watch does).
            let events = if api.watches == 1 { std::mem::take(&mut api.watch_events) } else { Vec::new() };
            answer(200, events.iter().map(|e| format!("{e}\n")).collect())
        }
        ("GET", "/api/v1/nodes") => {
            let list = json!({"apiVersion": "v1", "kind": "NodeList", "metadata": {"resourceVersion": "10"}, "items": api.nodes});
            answer(200, list.to_string())
        }
        ("PATCH", p) if p.starts_with("/api/v1/nodes/") => {
            let name = p.trim_start_matches("/api/v1/nodes/").to_string();
            let patch: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            api.patches.push((name.clone(), patch));
            answer(200, node(&name, "u", None, json!({})).to_string())
        }
        _ => answer(404, json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404, "reason": "NotFound"}).to_string()),
    })
}

async fn serve(api: Shared) -> kube::Client {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the fake API");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let api = api.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| handle(api.clone(), req));
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(hyper_util::rt::TokioIo::new(stream), service).await;
            });
        }
    });
    kube::Client::try_from(kube::Config::new(format!("http://{addr}").parse().expect("url"))).expect("client")
}

fn node(name: &str, uid: &str, provider_id: Option<String>, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "uid": uid, "resourceVersion": "11", "labels": labels},
        "spec": {"providerID": provider_id.unwrap_or_default()}})
}

fn labels(pairs: &[(&str, &str)]) -> Value {
    Value::Object(pairs.iter().map(|(k, v)| (k.to_string(), Value::String(v.to_string()))).collect())
}

#[test]
fn nodes_listed_and_watched_get_their_groups_labels_and_only_those() {
    let (_guard, local) = moto::lock();
    runtime().block_on(async {
        let w = world(&local.url).await;
        let api: Shared = Default::default();
        {
            let mut a = api.lock().expect("lock");
            a.nodes = vec![
                // A fresh worker: only what its kubelet set.
                node(&w.worker.1, "u1", pid(&w.worker.0), labels(&[("kubernetes.io/hostname", w.worker.1.as_str())])),
                // The control plane, its role label already there (protokube's own), and an admin's label.
                node(&w.cp.1, "u2", pid(&w.cp.0), labels(&[(CP_LABELS[0], ""), ("owner", "ops")])),
                // A worker's Node claiming the control plane's instance (its kubelet chose the providerID).
                node(&w.impostor.1, "u3", pid(&w.cp.0), labels(&[])),
            ];
            // A worker registering after the list.
            a.watch_events = vec![json!({"type": "ADDED", "object": node(&w.worker2.1, "u4", pid(&w.worker2.0), labels(&[]))})];
        }
        let client = serve(api.clone()).await;
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client);
        let metrics = Metrics::default();
        let labeller = Labeller::new(w.store.clone(), NodeCloud::Aws(AwsNodes::new(aws_sdk_ec2::Client::new(&iam::as_control_plane(&w.conf)), CLUSTER)));
        let started = Instant::now();
        let task = tokio::spawn({
            let (nodes, metrics) = (nodes.clone(), metrics.clone());
            async move {
                let mut labeller = labeller;
                let _ = node_labels::follow(&mut labeller, &nodes, &metrics).await;
            }
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        while !api.lock().expect("lock").patches.iter().any(|(n, _)| n == &w.worker2.1) {
            assert!(Instant::now() < deadline, "the watched worker was not labelled within 20 s: {:?}", api.lock().expect("lock").patches);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let watched_in = started.elapsed();
        task.abort();

        let patches: BTreeMap<String, Value> = api.lock().expect("lock").patches.iter().cloned().collect();
        assert_eq!(patches.len(), 3, "one patch per identified Node, none for the impostor: {patches:?}");
        assert_eq!(
            patches[&w.worker.1],
            json!({"metadata": {"labels": {"node-role.kubernetes.io/node": "", "team": "blue", INSTANCE_GROUP_LABEL: "nodes"}}})
        );
        // Only what the control plane lacked: its role label and the admin's label are not named.
        let mut cp_want = labels(&CP_LABELS[1..].iter().map(|k| (*k, "")).collect::<Vec<_>>());
        cp_want[INSTANCE_GROUP_LABEL] = json!("control-plane-a");
        assert_eq!(patches[&w.cp.1], json!({"metadata": {"labels": cp_want}}));
        assert_eq!(
            patches[&w.worker2.1],
            json!({"metadata": {"labels": {"node-role.kubernetes.io/node": "", "node-role.kubernetes.io/spot-worker": "true", INSTANCE_GROUP_LABEL: "spot-nodes"}}})
        );
        let s = metrics.snapshot();
        assert_eq!(s.nodes_labelled, 3);
        assert_eq!(s.node_label_failures.get("provider-id"), Some(&1), "{:?}", s.node_label_failures);
        let text = metrics.render();
        assert!(text.contains("protokube_nodes_labelled_total 3"), "{text}");
        assert!(text.contains("protokube_node_label_failures_total{reason=\"provider-id\"} 1"), "{text}");
        eprintln!("node labels: list + watch of 4 Nodes against moto, the watched Node labelled {:.0} ms after the start", watched_in.as_secs_f64() * 1000.0);
    });
}

/// Labelling the same Nodes again, as the watch's Modified events and every relist do, patches
/// nothing once they carry their labels; cloud answers are cached.
#[test]
fn labelled_nodes_are_left_alone() {
    let (_guard, local) = moto::lock();
    runtime().block_on(async {
        let w = world(&local.url).await;
        let api: Shared = Default::default();
        let client = serve(api.clone()).await;
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client);
        let mut labeller = Labeller::new(w.store.clone(), NodeCloud::Aws(AwsNodes::new(aws_sdk_ec2::Client::new(&iam::as_control_plane(&w.conf)), CLUSTER)));
        let fresh: k8s_openapi::api::core::v1::Node = serde_json::from_value(node(&w.worker.1, "u1", pid(&w.worker.0), labels(&[]))).expect("node");
        let first = labeller.label(&nodes, std::slice::from_ref(&fresh)).await;
        assert_eq!(first.labelled.len(), 1, "{first:?}");
        let done: k8s_openapi::api::core::v1::Node = serde_json::from_value(node(
            &w.worker.1,
            "u1",
            pid(&w.worker.0),
            labels(&[("node-role.kubernetes.io/node", ""), ("team", "blue"), (INSTANCE_GROUP_LABEL, "nodes"), ("someone-elses", "x")]),
        ))
        .expect("node");
        // The instance is gone from EC2 now: the cached answer holds, and nothing is patched.
        local.reset();
        let again = labeller.label(&nodes, std::slice::from_ref(&done)).await;
        assert_eq!(again, node_labels::LabelReport::default());
        assert_eq!(api.lock().expect("lock").patches.len(), 1);
    });
}
