//! The node labeller's GCE lookup against the harness's Compute emulator over 127.0.0.1: a Node
//! named for a MIG instance is of the group its MIG's template names; a Node pointing at another
//! project, a zone without its instance, a bare instance claiming a MIG, and a stopped instance are
//! refused, each with its reason. No root, no cloud.

use std::sync::Arc;
use std::time::{Duration, Instant};

use keelson_api::names::gce_instance_group_manager_name;
use protokube::node_labels::gce::GceNodes;
use protokube::node_labels::{Identity, NodeFacts, Unidentified};
use serde_json::{json, Value};
use testkit::gce_compute::{Config, GceCompute, InstanceView};
use testkit::gce_metadata::{self, InstanceFacts};
use testkit::httpd::{Body, Request, Server};

const PROJECT: &str = "acme-prod";
const ZB: &str = "europe-west1-b";
const CLUSTER: &str = "gce.k8s.example.com";

fn call(c: &GceCompute, method: &str, path: &str, body: Value) -> Value {
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    let req = Request {
        method: method.into(),
        path: format!("/compute/v1/projects/{PROJECT}{path}"),
        query: query.into(),
        headers: vec![("authorization".into(), "Bearer setup".into())],
        peer: "127.0.0.1:1".into(),
        body: body.to_string().into_bytes(),
    };
    let r = c.answer(&req);
    let Body::Bytes(b) = r.body else { panic!("not bytes") };
    let v: Value = serde_json::from_slice(&b).expect("JSON");
    assert_eq!(r.status, 200, "{method} {path}: {v}");
    v
}

struct World {
    c: GceCompute,
    _compute: Server,
    _meta: Server,
    _state: tempfile::TempDir,
    nodes: GceNodes,
}

impl World {
    fn new() -> World {
        let c = GceCompute::new(Config { operation_delay: Duration::from_millis(20), boot_delay: Some(Duration::from_millis(10)), ..Config::example() });
        let compute = c.start();
        call(&c, "POST", "/global/networks", json!({"name": "net", "autoCreateSubnetworks": false}));
        call(&c, "POST", "/regions/europe-west1/subnetworks", json!({"name": "sub", "network": "global/networks/net", "ipCidrRange": "10.0.16.0/20"}));
        for (template, group) in [("nodes-t", "nodes"), ("cp-b-t", "control-plane-b")] {
            call(
                &c,
                "POST",
                "/global/instanceTemplates",
                json!({"name": template, "properties": {"machineType": "e2-medium",
                    "disks": [{"boot": true, "autoDelete": true, "initializeParams": {"diskSizeGb": "20"}}],
                    "networkInterfaces": [{"network": "global/networks/net", "subnetwork": "regions/europe-west1/subnetworks/sub"}],
                    "metadata": {"items": [{"key": "cluster-name", "value": CLUSTER}, {"key": "kops-k8s-io-instance-group-name", "value": group}]}}}),
            );
            call(
                &c,
                "POST",
                &format!("/zones/{ZB}/instanceGroupManagers"),
                json!({"name": gce_instance_group_manager_name(ZB, group, CLUSTER), "baseInstanceName": group,
                    "instanceTemplate": format!("global/instanceTemplates/{template}"), "targetSize": 1}),
            );
        }
        let mut own = InstanceFacts::example().values();
        own.insert("instance/service-accounts/default/token".into(), json!({"access_token": "tok", "expires_in": 3599, "token_type": "Bearer"}).to_string());
        let meta = Server::start(Arc::new(move |req: &Request| gce_metadata::answer(&own, req)));
        let state = tempfile::tempdir().expect("state");
        for (name, role) in [("nodes", "Node"), ("control-plane-b", "ControlPlane")] {
            let path = state.path().join(format!("instancegroup/{name}"));
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(path, format!("apiVersion: kops.k8s.io/v1alpha2\nkind: InstanceGroup\nmetadata:\n  name: {name}\nspec:\n  role: {role}\n"))
                .expect("ig");
        }
        let store = base::StateStore::dir(state.path());
        let md = base::gce_metadata::GceMetadata::new(Some(&meta.addr().to_string()), Duration::from_secs(5)).expect("metadata client");
        let api = cloud::gce::GoogleApi::new(cloud::gce::TokenSource::new(md), Duration::from_secs(20)).expect("api");
        let reader = cloud::gce::ComputeReader::new(api, &compute.url("compute/v1"), PROJECT);
        World { nodes: GceNodes::new(reader, PROJECT, CLUSTER, store), c, _compute: compute, _meta: meta, _state: state }
    }

    fn mig_instance(&self, group: &str) -> InstanceView {
        let mig = gce_instance_group_manager_name(ZB, group, CLUSTER);
        self.wait(|i| i.mig.as_deref() == Some(mig.as_str()))
    }

    fn wait(&self, pick: impl Fn(&InstanceView) -> bool) -> InstanceView {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(i) = self.c.instances().into_iter().find(|i| pick(i) && i.status == "RUNNING") {
                return i;
            }
            assert!(Instant::now() < deadline, "no such running instance: {:?}", self.c.instances());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    async fn one(&self, node: NodeFacts) -> Result<Identity, Unidentified> {
        self.nodes.identify(&[&node]).await.into_iter().next().expect("one answer")
    }
}

fn node(name: &str, provider_id: Option<String>, zone: Option<&str>) -> NodeFacts {
    NodeFacts { name: name.into(), uid: "u".into(), provider_id, zone: zone.map(str::to_string), ..Default::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_group_is_its_mig_templates_whatever_the_node_says() {
    let w = World::new();
    let worker = w.mig_instance("nodes");
    let cp = w.mig_instance("control-plane-b");
    let got = w.one(node(&worker.name, Some(format!("gce://{PROJECT}/{ZB}/{}", worker.name)), Some("europe-west1-c"))).await.expect("the worker");
    assert_eq!((got.group.as_str(), got.instance.as_str()), ("nodes", worker.name.as_str()));
    // Without a providerID the zone label says where to look.
    let got = w.one(node(&cp.name, None, Some(ZB))).await.expect("the control plane");
    assert_eq!(got.group, "control-plane-b");

    let reason = |r: Result<Identity, Unidentified>| r.err().map(|u| u.reason);
    // Another project's providerID, or one naming the control plane's instance.
    assert_eq!(reason(w.one(node(&worker.name, Some(format!("gce://evil/{ZB}/{}", worker.name)), None)).await), Some("project"));
    assert_eq!(reason(w.one(node(&worker.name, Some(format!("gce://{PROJECT}/{ZB}/{}", cp.name)), None)).await), Some("provider-id"));
    // A zone where no instance has the Node's name.
    assert_eq!(reason(w.one(node(&worker.name, None, Some("europe-west1-c"))).await), Some("no-instance"));

    // A bare instance from the node template that writes itself a `created-by` naming the node MIG:
    // the MIG does not list it.
    call(&w.c, "POST", &format!("/zones/{ZB}/instances?sourceInstanceTemplate=global/instanceTemplates/cp-b-t"), json!({"name": "bare-1"}));
    w.wait(|i| i.name == "bare-1");
    assert_eq!(reason(w.one(node("bare-1", None, Some(ZB))).await), Some("mig"));
    let mig = gce_instance_group_manager_name(ZB, "control-plane-b", CLUSTER);
    let current = call(&w.c, "GET", &format!("/zones/{ZB}/instances/bare-1"), json!({}));
    let mut items = current["metadata"]["items"].as_array().cloned().unwrap_or_default();
    items.push(json!({"key": "created-by", "value": format!("projects/123456789012/zones/{ZB}/instanceGroupManagers/{mig}")}));
    call(&w.c, "POST", &format!("/zones/{ZB}/instances/bare-1/setMetadata"), json!({"fingerprint": current["metadata"]["fingerprint"], "items": items}));
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(reason(w.one(node("bare-1", None, Some(ZB))).await), Some("managed"));

    // A stopped instance.
    w.c.set_instance_status(ZB, &worker.name, "STOPPED").expect("stop");
    assert_eq!(reason(w.one(node(&worker.name, None, Some(ZB))).await), Some("not-running"));
}
