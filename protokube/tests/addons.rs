//! The addon controller's `sync` against an in-process fake Kubernetes API (plain HTTP, discovery,
//! get, server-side apply, delete): what it prunes when the `kube-system/keelson-addons` record is
//! hostile. Needs nothing outside the test process.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use serde_json::{json, Value};

use keelson_api::addons::{AddonChannel, AddonEntry, ADDON_CHANNEL};
use protokube::addons::{self, ADDON_LABEL, RECORD};

const RECORD_PATH: &str = "/api/v1/namespaces/kube-system/configmaps/keelson-addons";
const COREDNS: &str = "/apis/apps/v1/namespaces/kube-system/deployments/coredns";
const EBS_SA: &str = "/api/v1/namespaces/kube-system/serviceaccounts/ebs-csi-controller-sa";
const OLD_CM: &str = "/api/v1/namespaces/kube-system/configmaps/cilium-old";
const NEW_CM: &str = "/api/v1/namespaces/kube-system/configmaps/cilium-config";

/// The objects the fake API holds (by URL path) and every request it answered.
#[derive(Default)]
struct Api {
    objects: BTreeMap<String, Value>,
    log: Vec<String>,
    next_uid: u64,
}

type Shared = Arc<Mutex<Api>>;

fn resource_list(group_version: &str, resources: &[(&str, &str)]) -> Value {
    let verbs = ["get", "list", "create", "update", "patch", "delete"];
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources.iter().map(|(plural, kind)| json!({
            "name": plural, "singularName": "", "namespaced": true, "kind": kind, "verbs": verbs,
        })).collect::<Vec<_>>(),
    })
}

fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": if code < 300 { "Success" } else { "Failure" }, "reason": reason, "code": code})
}

fn answer(code: u16, body: &Value) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = hyper::StatusCode::from_u16(code).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    r
}

async fn handle(api: Shared, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let mut api = api.lock().unwrap_or_else(|p| p.into_inner());
    api.log.push(format!("{method} {path}"));
    let (code, value) = match (method.as_str(), path.as_str()) {
        ("GET", "/api/v1") => (200, resource_list("v1", &[("configmaps", "ConfigMap"), ("serviceaccounts", "ServiceAccount")])),
        ("GET", "/apis/apps/v1") => (200, resource_list("apps/v1", &[("deployments", "Deployment")])),
        ("GET", p) => match api.objects.get(p) {
            Some(o) => (200, o.clone()),
            None => (404, status(404, "NotFound")),
        },
        ("PATCH", p) => {
            let mut obj: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            api.next_uid += 1;
            obj["metadata"]["uid"] = json!(format!("uid-{}", api.next_uid));
            obj["metadata"]["resourceVersion"] = json!(api.next_uid.to_string());
            api.objects.insert(p.to_string(), obj.clone());
            (200, obj)
        }
        ("DELETE", p) => match api.objects.remove(p) {
            Some(_) => (200, status(200, "")),
            None => (404, status(404, "NotFound")),
        },
        _ => (405, status(405, "MethodNotAllowed")),
    };
    Ok(answer(code, &value))
}

async fn serve(api: Shared) -> String {
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
    format!("http://{addr}")
}

fn object(api_version: &str, kind: &str, name: &str, labels: Value) -> Value {
    json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "namespace": "kube-system", "labels": labels, "uid": format!("uid-{name}"), "resourceVersion": "1"}})
}

/// The world every case starts from: a `cilium` addon (manifest: one ConfigMap) not yet applied at
/// this hash, a record that claims it applied `recorded` before, and in the API the coredns
/// Deployment (kube-system's, not an addon's), another addon's ServiceAccount, and an old
/// ConfigMap of cilium's own (labelled for it).
async fn world(recorded: &[&str]) -> (Shared, kube::Client, base::StateStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = base::StateStore::dir(dir.path());
    let manifest = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cilium-config\n  namespace: kube-system\ndata:\n  a: b\n";
    store.put("addons/cilium/v1.yaml", manifest.as_bytes()).await.expect("manifest");
    let channel = AddonChannel {
        kind: "Addons".into(),
        addons: vec![AddonEntry {
            name: "cilium".into(),
            version: "v1".into(),
            manifest: "cilium/v1.yaml".into(),
            manifest_hash: base::sha256_hex(manifest.as_bytes()),
        }],
    };
    store.put(ADDON_CHANNEL, serde_yaml_ng::to_string(&channel).expect("channel").as_bytes()).await.expect("channel");

    let api: Shared = Default::default();
    {
        let mut a = api.lock().expect("lock");
        a.objects.insert(COREDNS.into(), object("apps/v1", "Deployment", "coredns", json!({"k8s-app": "kube-dns"})));
        a.objects.insert(EBS_SA.into(), object("v1", "ServiceAccount", "ebs-csi-controller-sa", json!({ADDON_LABEL: "aws-ebs-csi-driver"})));
        a.objects.insert(OLD_CM.into(), object("v1", "ConfigMap", "cilium-old", json!({ADDON_LABEL: "cilium"})));
        let record = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": RECORD, "namespace": "kube-system"},
            "data": {"cilium.hash": "an older hash", "cilium.objects": recorded.join("\n")},
        });
        a.objects.insert(RECORD_PATH.into(), record);
    }
    let url = serve(api.clone()).await;
    let config = kube::Config::new(url.parse().expect("url"));
    let client = kube::Client::try_from(config).expect("client");
    (api, client, store, dir)
}

fn deletes(api: &Shared) -> Vec<String> {
    api.lock().expect("lock").log.iter().filter(|l| l.starts_with("DELETE ")).cloned().collect()
}

/// A hostile record naming kube-system/coredns and another addon's ServiceAccount as cilium's
/// objects: the pass applies cilium and deletes nothing.
#[tokio::test]
async fn a_hostile_record_deletes_nothing_that_is_not_the_addons() {
    let (api, client, store, _dir) = world(&["apps/v1/Deployment/kube-system/coredns", "v1/ServiceAccount/kube-system/ebs-csi-controller-sa"]).await;
    let report = addons::sync(&client, &store).await.expect("sync");
    assert_eq!(report.applied, ["cilium"]);
    assert_eq!(report.pruned, 0);
    assert_eq!(deletes(&api), Vec::<String>::new());
    let a = api.lock().expect("lock");
    assert!(a.objects.contains_key(COREDNS) && a.objects.contains_key(EBS_SA), "both still there");
    assert!(a.objects.contains_key(NEW_CM), "cilium's manifest applied");
    // The record now names only what cilium applied.
    assert_eq!(a.objects[RECORD_PATH]["data"]["cilium.objects"], json!("v1/ConfigMap/kube-system/cilium-config"));
}

/// The honest case still prunes: an object cilium applied before (carrying its label) and the new
/// version dropped is deleted.
#[tokio::test]
async fn an_object_the_addon_dropped_is_pruned() {
    let (api, client, store, _dir) = world(&["v1/ConfigMap/kube-system/cilium-old", "apps/v1/Deployment/kube-system/coredns"]).await;
    let report = addons::sync(&client, &store).await.expect("sync");
    assert_eq!(report.pruned, 1);
    assert_eq!(deletes(&api), [format!("DELETE {OLD_CM}")]);
    assert!(api.lock().expect("lock").objects.contains_key(COREDNS));
}
