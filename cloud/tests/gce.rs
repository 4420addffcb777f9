//! The GCE implementations of the cloud traits against the harness's Compute and Cloud DNS
//! emulators (wire-checked against Google's Go client) and a metadata server, over 127.0.0.1:
//! disks found by kOps' labels, attach READ_WRITE and GCE's refusal of a second writer, detach,
//! labels with the fingerprint (a stale one retried), the bound on operation waits, Cloud DNS
//! upserts and exact-match deletes, and the service-account token cached.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cloud::dns::{Dns, Record, RecordChange};
use cloud::gce::labels::encode_label;
use cloud::gce::{CloudDns, GceVolumes, GoogleApi, TokenSource};
use cloud::volumes::{AttachmentState, Instances, VolumeError, VolumeFilter, Volumes};
use serde_json::{json, Value};
use testkit::cloud_dns::{CloudDns as DnsEmulator, DnsConfig};
use testkit::gce_compute::{Config, GceCompute};
use testkit::httpd::{Body, Request, Response, Server};

const PROJECT: &str = "acme-prod";
const ZB: &str = "europe-west1-b";
const ZC: &str = "europe-west1-c";
const CLUSTER: &str = "gce.k8s.example.com";

fn request(method: &str, path: &str, query: &str, body: Value) -> Request {
    Request {
        method: method.into(),
        path: path.into(),
        query: query.into(),
        headers: vec![("authorization".into(), "Bearer setup".into())],
        peer: "127.0.0.1:1".into(),
        body: if body.is_null() { vec![] } else { body.to_string().into_bytes() },
    }
}

fn json_of(r: Response) -> (u16, Value) {
    let Body::Bytes(b) = r.body else { panic!("not bytes") };
    (r.status, serde_json::from_slice(&b).unwrap_or(Value::Null))
}

/// A Compute call made in process (the test's own setup, as an operator would).
fn compute_ok(c: &GceCompute, method: &str, path: &str, body: Value) -> Value {
    let (s, v) = json_of(c.answer(&request(method, &format!("/compute/v1/projects/{PROJECT}{path}"), "", body)));
    assert_eq!(s, 200, "{method} {path}: {v}");
    v
}

fn dns_ok(d: &DnsEmulator, method: &str, path: &str, body: Value) -> Value {
    let (s, v) = json_of(d.answer(&request(method, &format!("/dns/v1/projects/{PROJECT}{path}"), "", body)));
    assert_eq!(s, 200, "{method} {path}: {v}");
    v
}

/// Two instances of MIG `cp` in zone b; returns their names.
fn instances(c: &GceCompute) -> Vec<String> {
    compute_ok(c, "POST", "/global/networks", json!({"name": "net", "autoCreateSubnetworks": false}));
    compute_ok(c, "POST", "/regions/europe-west1/subnetworks", json!({"name": "sub", "network": "global/networks/net", "ipCidrRange": "10.0.16.0/20"}));
    compute_ok(
        c,
        "POST",
        "/global/instanceTemplates",
        json!({"name": "cp", "properties": {
            "machineType": "e2-medium",
            "disks": [{"boot": true, "autoDelete": true, "initializeParams": {"diskSizeGb": "20"}}],
            "networkInterfaces": [{"network": "global/networks/net", "subnetwork": "regions/europe-west1/subnetworks/sub"}],
        }}),
    );
    compute_ok(
        c,
        "POST",
        &format!("/zones/{ZB}/instanceGroupManagers"),
        json!({"name": "cp", "baseInstanceName": "cp", "instanceTemplate": "global/instanceTemplates/cp", "targetSize": 2}),
    );
    let names: Vec<String> = c.instances().into_iter().map(|i| i.name).collect();
    assert_eq!(names.len(), 2, "the MIG made its instances");
    names
}

/// A disk labelled the kOps way for member `member` of etcd `main` (members b, c, d).
fn etcd_disk(c: &GceCompute, zone: &str, name: &str, cluster_label: &str, member: &str) {
    compute_ok(
        c,
        "POST",
        &format!("/zones/{zone}/disks"),
        json!({"name": name, "sizeGb": "20", "type": "pd-ssd", "labels": {
            "k8s-io-cluster-name": cluster_label,
            "k8s-io-role-master": "master",
            "k8s-io-etcd-main": encode_label(&format!("{member}/b,c,d")).expect("label fits"),
        }}),
    );
}

/// A metadata server that hands out `token` (valid `expires_in` s) and counts token requests.
fn metadata(token: &str, expires_in: u64) -> (Server, Arc<AtomicUsize>) {
    let facts = testkit::gce_metadata::InstanceFacts { zone: ZB.into(), ..testkit::gce_metadata::InstanceFacts::example() };
    let mut values = facts.values();
    values
        .insert("instance/service-accounts/default/token".into(), json!({"access_token": token, "expires_in": expires_in, "token_type": "Bearer"}).to_string());
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    let server = Server::start(Arc::new(move |req: &Request| {
        if req.path.ends_with("/service-accounts/default/token") {
            seen.fetch_add(1, Ordering::SeqCst);
        }
        testkit::gce_metadata::answer(&values, req)
    }));
    (server, count)
}

/// Answers a request before the emulators do (`None`: let them), to play another writer.
type Intercept = Arc<dyn Fn(&GceCompute, &Request) -> Option<Response> + Send + Sync>;

struct World {
    compute: GceCompute,
    dns: DnsEmulator,
    server: Server,
    /// Where the emulator's self links point.
    _links: Server,
    _meta: Server,
    token_requests: Arc<AtomicUsize>,
    /// Authorization headers the Google API server saw.
    auth: Arc<Mutex<Vec<String>>>,
    api: GoogleApi,
}

/// The emulators behind one address; `intercept` may answer a request first (to play another
/// writer).
fn world_with(op_delay: Duration, intercept: Option<Intercept>) -> World {
    world_full(op_delay, Duration::from_millis(10), intercept)
}

fn world_full(op_delay: Duration, change_delay: Duration, intercept: Option<Intercept>) -> World {
    let compute = GceCompute::new(Config { operation_delay: op_delay, boot_delay: Some(Duration::from_millis(10)), ..Config::example() });
    let dns = DnsEmulator::new(DnsConfig { change_delay, ..DnsConfig::example() });
    let auth = Arc::new(Mutex::new(Vec::new()));
    let (c, d, a) = (compute.clone(), dns.clone(), auth.clone());
    let server = Server::start(Arc::new(move |req: &Request| {
        a.lock().expect("auth log").push(req.header("authorization").unwrap_or_default().to_string());
        if let Some(r) = intercept.as_ref().and_then(|f| f(&c, req)) {
            return r;
        }
        if req.path.starts_with("/dns/") {
            d.answer(req)
        } else {
            c.answer(req)
        }
    }));
    // Self links name a server that serves them.
    let links = compute.start_with(None);
    let (meta, token_requests) = metadata("tok-1", 3599);
    let md = base::gce_metadata::GceMetadata::new(Some(&meta.url("")), Duration::from_secs(5)).expect("metadata client");
    let api = GoogleApi::new(TokenSource::new(md), Duration::from_secs(30)).expect("API client");
    World { compute, dns, server, _links: links, _meta: meta, token_requests, auth, api }
}

fn world(op_delay: Duration) -> World {
    world_with(op_delay, None)
}

impl World {
    fn volumes(&self, bound: Duration) -> GceVolumes {
        GceVolumes::new(self.api.clone(), &self.server.url("compute/v1"), PROJECT, ZB, bound)
    }
    fn cloud_dns(&self) -> CloudDns {
        CloudDns::new(self.api.clone(), &self.server.url("dns/v1"), PROJECT)
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

/// What the reconcile loop asks for: the cluster's etcd volumes.
fn cluster_filter() -> VolumeFilter {
    VolumeFilter { tags: vec![("KubernetesCluster".into(), CLUSTER.into())], tag_keys: vec!["k8s.io/role/master".into()], ..Default::default() }
}

#[test]
fn disks_are_found_by_kops_labels_in_every_zone_of_the_region() {
    let w = world(Duration::from_millis(20));
    etcd_disk(&w.compute, ZB, "b-etcd-main-gce", "gce-k8s-example-com", "b");
    etcd_disk(&w.compute, ZC, "c-etcd-main-gce", "gce-k8s-example-com", "c");
    etcd_disk(&w.compute, ZB, "b-etcd-main-other", "other-k8s-example-com", "b");
    compute_ok(
        &w.compute,
        "POST",
        &format!("/zones/{ZB}/disks"),
        json!({"name": "scratch", "sizeGb": "10", "labels": {"k8s-io-cluster-name": "gce-k8s-example-com"}}),
    );
    let v = w.volumes(Duration::from_secs(10));
    rt().block_on(async {
        let found = v.find_volumes(&cluster_filter()).await.expect("find");
        let names: Vec<(&str, &str)> = found.iter().map(|v| (v.id.as_str(), v.zone.as_str())).collect();
        assert_eq!(
            names,
            vec![("b-etcd-main-gce", ZB), ("c-etcd-main-gce", ZC)],
            "this cluster's etcd disks, both zones; not another cluster's, not unlabelled ones"
        );
        assert_eq!(found[0].tags.get("k8s.io/etcd/main").map(String::as_str), Some("b/b,c,d"), "the member label decoded as kOps encodes it");
        assert!(found.iter().all(|v| v.attachments.is_empty()));
        let zone_c = v.find_volumes(&VolumeFilter { zone: Some(ZC.into()), ..cluster_filter() }).await.expect("find in c");
        assert_eq!(zone_c.iter().map(|v| v.id.as_str()).collect::<Vec<_>>(), vec!["c-etcd-main-gce"]);
    });
}

#[test]
fn attach_read_write_a_second_writer_is_refused_detach_frees_it() {
    let w = world(Duration::from_millis(30));
    let names = instances(&w.compute);
    let (me, other) = (&names[0], &names[1]);
    etcd_disk(&w.compute, ZB, "b-etcd-main-gce", "gce-k8s-example-com", "b");
    let v = w.volumes(Duration::from_secs(10));
    rt().block_on(async {
        v.find_volumes(&cluster_filter()).await.expect("find");
        v.attach_volume("b-etcd-main-gce", me, "/dev/xvdu").await.expect("attach");
        let inst = w.compute.instance(ZB, me).expect("instance");
        let d = inst.disks.iter().find(|d| d.disk == "b-etcd-main-gce").expect("attached disk");
        assert_eq!((d.device_name.as_str(), d.mode.as_str()), ("b-etcd-main-gce", "READ_WRITE"), "device named by the disk, so /dev/disk/by-id/google-<name>");
        assert_eq!(w.compute.disk(ZB, "b-etcd-main-gce").expect("disk").users, vec![me.clone()]);

        let seen = v.find_volumes(&cluster_filter()).await.expect("find");
        assert_eq!(seen[0].attachments.len(), 1);
        assert_eq!((seen[0].attachments[0].instance_id.as_str(), seen[0].attachments[0].state), (me.as_str(), AttachmentState::Attached));
        let paths = v.device_paths(Path::new("/by-id"), "b-etcd-main-gce", &seen[0].attachments[0].device);
        assert_eq!(paths[0], Path::new("/by-id/google-b-etcd-main-gce"));

        match v.attach_volume("b-etcd-main-gce", other, "/dev/xvdu").await {
            Err(VolumeError::InUse { volume }) => assert_eq!(volume, "b-etcd-main-gce"),
            r => panic!("a second READ_WRITE attachment must be refused as InUse, got {r:?}"),
        }
        assert_eq!(w.compute.disk(ZB, "b-etcd-main-gce").expect("disk").users, vec![me.clone()], "the holder keeps it");

        let found = v.describe_instances(&[me.clone(), "gone-instance".to_string()]).await.expect("describe");
        assert_eq!(found.len(), 1, "an instance Compute does not know is absent");
        assert_eq!(found[0].private_ip.as_deref(), Some(inst.network_ip.as_str()));
        assert!(found[0].devices.contains(&"b-etcd-main-gce".to_string()));

        v.detach_volume("b-etcd-main-gce", me).await.expect("detach");
        assert!(w.compute.disk(ZB, "b-etcd-main-gce").expect("disk").users.is_empty());
        v.detach_volume("b-etcd-main-gce", me).await.expect("detaching a detached disk is done already");
        v.attach_volume("b-etcd-main-gce", other, "/dev/xvdu").await.expect("free again: the other instance claims it");
        assert_eq!(w.compute.disk(ZB, "b-etcd-main-gce").expect("disk").users, vec![other.clone()]);
    });
}

#[test]
fn labels_are_set_with_the_fingerprint_and_a_stale_one_is_read_again() {
    // Another writer labels the disk just before our first setLabels lands: GCE answers 412.
    let raced = Arc::new(AtomicUsize::new(0));
    let sets = Arc::new(AtomicUsize::new(0));
    let (r, s) = (raced.clone(), sets.clone());
    let intercept: Intercept = Arc::new(move |c: &GceCompute, req: &Request| {
        if req.method == "POST" && req.path.ends_with("/setLabels") {
            s.fetch_add(1, Ordering::SeqCst);
            if r.fetch_add(1, Ordering::SeqCst) == 0 {
                let path = req.path.trim_end_matches("/setLabels").to_string();
                let (_, d) = json_of(c.answer(&request("GET", &path, "", Value::Null)));
                let mut labels = d["labels"].clone();
                labels["backup-owner"] = json!("ops");
                let (st, v) = json_of(c.answer(&request("POST", &req.path, "", json!({"labels": labels, "labelFingerprint": d["labelFingerprint"]}))));
                assert_eq!(st, 200, "{v}");
            }
        }
        None
    });
    let w = world_with(Duration::from_millis(20), Some(intercept));
    etcd_disk(&w.compute, ZB, "b-etcd-main-gce", "gce-k8s-example-com", "b");
    let v = w.volumes(Duration::from_secs(10));
    rt().block_on(async {
        v.tag_volume("b-etcd-main-gce", &[("keelson.io/etcd-formatted".into(), "ext4".into())]).await.expect("label");
        let labels = w.compute.disk(ZB, "b-etcd-main-gce").expect("disk").labels;
        assert_eq!(labels.get("keelson-io-etcd-formatted").map(String::as_str), Some("ext4"));
        assert_eq!(labels.get("backup-owner").map(String::as_str), Some("ops"), "the other writer's label is kept (read again, merged)");
        assert_eq!(labels.get("k8s-io-etcd-main").map(String::as_str), Some("b-2fb-2cc-2cd"));
        assert_eq!(sets.load(Ordering::SeqCst), 2, "one refused with 412, one accepted");
        let back = v.find_volumes(&cluster_filter()).await.expect("find");
        assert_eq!(back[0].tags.get("keelson.io/etcd-formatted").map(String::as_str), Some("ext4"), "reads back under the tag the agent wrote");
        // Already labelled: no call at all.
        v.tag_volume("b-etcd-main-gce", &[("keelson.io/etcd-formatted".into(), "ext4".into())]).await.expect("label again");
        assert_eq!(sets.load(Ordering::SeqCst), 2);
    });
}

#[test]
fn an_operation_that_does_not_finish_is_given_up_at_the_bound() {
    // Every operation takes 5 s; the client gives each 400 ms.
    let w = world(Duration::from_secs(5));
    let names = instances(&w.compute);
    etcd_disk(&w.compute, ZB, "b-etcd-main-gce", "gce-k8s-example-com", "b");
    let v = w.volumes(Duration::from_millis(400));
    rt().block_on(async {
        let t = Instant::now();
        let e = v.attach_volume("b-etcd-main-gce", &names[0], "/dev/xvdu").await.expect_err("not DONE within the bound");
        let waited = t.elapsed();
        assert!(waited < Duration::from_secs(2), "gave up after {waited:?}, not when the operation finished");
        match &e {
            VolumeError::Api { code, message, .. } => {
                assert_eq!(code, "operationTimeout", "{e}");
                assert!(message.contains("attachDisk") && message.contains("not DONE"), "{message}");
            }
            other => panic!("want a timeout, got {other:?}"),
        }
    });
}

#[test]
fn cloud_dns_upserts_replace_exactly_what_is_there_and_deletes_match_exactly() {
    let w = world(Duration::from_millis(20));
    dns_ok(&w.dns, "POST", "/managedZones", json!({"name": "example-com", "dnsName": "example.com.", "description": ""}));
    dns_ok(&w.dns, "POST", "/managedZones", json!({"name": "k8s-example-com", "dnsName": "k8s.example.com.", "description": ""}));
    // A record set someone wrote with another TTL and its data in an order of their own.
    dns_ok(
        &w.dns,
        "POST",
        "/managedZones/k8s-example-com/changes",
        json!({"additions": [{"name": "api.gce.k8s.example.com.", "type": "A", "ttl": 300, "rrdatas": ["10.0.0.9", "10.0.0.1"]}]}),
    );
    let d = w.cloud_dns();
    let rec = |name: &str, values: &[&str]| Record { name: name.into(), rtype: "A".into(), ttl: 60, values: values.iter().map(|s| s.to_string()).collect() };
    rt().block_on(async {
        let zone = d.find_zone(None, CLUSTER).await.expect("zone");
        assert_eq!(zone, "k8s-example-com", "the longest suffix of the cluster name");
        assert_eq!(d.find_zone(Some("example.com"), CLUSTER).await.expect("by DNS name"), "example-com");

        let calls = d
            .apply_changes(
                &zone,
                &[
                    RecordChange::Upsert(rec("api.gce.k8s.example.com", &["10.0.16.3"])),
                    RecordChange::Upsert(rec("etcd-b.internal.gce.k8s.example.com", &["10.0.16.3"])),
                ],
            )
            .await
            .expect("upsert");
        assert_eq!(calls, 1, "one atomic change");
        let sets: BTreeMap<String, (i64, Vec<String>)> =
            w.dns.record_sets("k8s-example-com").expect("zone").into_iter().filter(|r| r.kind == "A").map(|r| (r.name, (r.ttl, r.rrdatas))).collect();
        assert_eq!(sets.get("api.gce.k8s.example.com."), Some(&(60, vec!["10.0.16.3".to_string()])));
        assert_eq!(sets.get("etcd-b.internal.gce.k8s.example.com."), Some(&(60, vec!["10.0.16.3".to_string()])));
        let listed = d.list_records(&zone, CLUSTER).await.expect("list");
        assert_eq!(listed.iter().filter(|r| r.rtype == "A").count(), 2);

        // Converged: nothing to send.
        assert_eq!(d.apply_changes(&zone, &[RecordChange::Upsert(rec("api.gce.k8s.example.com", &["10.0.16.3"]))]).await.expect("noop"), 0);
        // A delete of what is no longer there exactly is refused, and the record stays.
        assert!(d.apply_changes(&zone, &[RecordChange::Delete(rec("api.gce.k8s.example.com", &["10.0.0.1"]))]).await.is_err());
        assert!(w.dns.a_records().contains_key("api.gce.k8s.example.com."));
        // The exact record set: deleted.
        d.apply_changes(&zone, &[RecordChange::Delete(rec("api.gce.k8s.example.com", &["10.0.16.3"]))]).await.expect("delete");
        assert!(!w.dns.a_records().contains_key("api.gce.k8s.example.com."));
        assert!(w.dns.a_records().contains_key("etcd-b.internal.gce.k8s.example.com."), "only that one");
    });
}

#[test]
fn a_cloud_dns_write_returns_once_its_change_is_done_and_gives_up_at_the_bound() {
    let w = world_full(Duration::from_millis(20), Duration::from_millis(600), None);
    dns_ok(&w.dns, "POST", "/managedZones", json!({"name": "k8s-example-com", "dnsName": "k8s.example.com.", "description": ""}));
    let rec = |ip: &str| Record { name: "api.gce.k8s.example.com".into(), rtype: "A".into(), ttl: 60, values: vec![ip.to_string()] };
    rt().block_on(async {
        let d = w.cloud_dns();
        let start = std::time::Instant::now();
        d.apply_changes("k8s-example-com", &[RecordChange::Upsert(rec("10.0.16.3"))]).await.expect("upsert");
        assert!(start.elapsed() >= Duration::from_millis(600), "returned after {:?}, before the change was done", start.elapsed());
        let changes = dns_ok(&w.dns, "GET", "/managedZones/k8s-example-com/changes", json!({}));
        assert!(changes["changes"].as_array().expect("changes").iter().all(|c| c["status"] == "done"), "{changes}");
        // The next write reads back what the first one made, and replaces it exactly.
        d.apply_changes("k8s-example-com", &[RecordChange::Upsert(rec("10.0.16.4"))]).await.expect("second upsert");
        assert_eq!(w.dns.a_records().get("api.gce.k8s.example.com."), Some(&vec!["10.0.16.4".to_string()]));
        // A change that stays pending longer than the bound is an error naming it.
        let impatient = w.cloud_dns().with_change_bound(Duration::from_millis(200));
        let err = impatient.apply_changes("k8s-example-com", &[RecordChange::Upsert(rec("10.0.16.5"))]).await.expect_err("pending past the bound");
        assert!(err.to_string().contains("still pending"), "{err}");
    });
}

#[test]
fn the_service_account_token_comes_from_the_metadata_server_once() {
    let w = world(Duration::from_millis(20));
    etcd_disk(&w.compute, ZB, "b-etcd-main-gce", "gce-k8s-example-com", "b");
    let v = w.volumes(Duration::from_secs(10));
    rt().block_on(async {
        for _ in 0..3 {
            v.find_volumes(&cluster_filter()).await.expect("find");
        }
    });
    let auth = w.auth.lock().expect("auth log").clone();
    assert!(auth.len() >= 3 * 3, "three zones, three times: {auth:?}");
    assert!(auth.iter().all(|a| a == "Bearer tok-1"), "{auth:?}");
    assert_eq!(w.token_requests.load(Ordering::SeqCst), 1, "cached until shortly before it expires");
}
