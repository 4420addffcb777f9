//! The Compute emulator's behaviour, request by request (no network: `GceCompute::answer`):
//! fingerprints, disk users and the second writer refused, MIGs that remake instances with the
//! same name and a new id, listManagedInstances, label filters, operations that progress,
//! pagination, errors in Google's format, instances.insert outside any MIG, and the data plane's
//! side (status, kill, addresses).

use std::time::Duration;

use serde_json::{json, Value};
use testkit::gce_compute::{Config, GceCompute};
use testkit::httpd::{Body, Request};

const P: &str = "/compute/v1/projects/acme-prod";
const Z: &str = "europe-west1-b";

struct Api(GceCompute);

impl Api {
    fn new(op_delay: Duration, boot_delay: Option<Duration>) -> Api {
        Api(GceCompute::new(Config { operation_delay: op_delay, boot_delay, ..Config::example() }))
    }

    fn call(&self, method: &str, path_query: &str, body: Value) -> (u16, Value) {
        let (path, query) = path_query.split_once('?').unwrap_or((path_query, ""));
        let req = Request {
            method: method.into(),
            path: format!("{P}{path}"),
            query: query.into(),
            headers: vec![("authorization".into(), "Bearer test".into())],
            peer: "127.0.0.1:1".into(),
            body: if body.is_null() { vec![] } else { body.to_string().into_bytes() },
        };
        let r = self.0.answer(&req);
        let Body::Bytes(b) = r.body else { panic!("not bytes") };
        (r.status, serde_json::from_slice(&b).expect("JSON"))
    }

    /// A call that must succeed.
    fn ok(&self, method: &str, path: &str, body: Value) -> Value {
        let (s, v) = self.call(method, path, body);
        assert_eq!(s, 200, "{method} {path}: {v}");
        v
    }

    /// A call that must fail with `code` and `reason`.
    fn err(&self, method: &str, path: &str, body: Value, code: u16, reason: &str) -> Value {
        let (s, v) = self.call(method, path, body);
        assert_eq!((s, v["error"]["errors"][0]["reason"].as_str()), (code, Some(reason)), "{method} {path}: {v}");
        assert_eq!(v["error"]["code"], code);
        v
    }

    fn network(&self) {
        self.ok("POST", "/global/networks", json!({"name": "net", "autoCreateSubnetworks": false}));
        self.ok("POST", "/regions/europe-west1/subnetworks", json!({"name": "sub", "network": "global/networks/net", "ipCidrRange": "10.0.16.0/20"}));
    }

    fn template(&self, name: &str) {
        self.ok(
            "POST",
            "/global/instanceTemplates",
            json!({"name": name, "properties": {
                "machineType": "e2-medium",
                "disks": [{"boot": true, "autoDelete": true, "initializeParams": {"diskSizeGb": "20", "diskType": "pd-standard"}}],
                "networkInterfaces": [{"network": "global/networks/net", "subnetwork": "regions/europe-west1/subnetworks/sub"}],
                "metadata": {"items": [{"key": "user-data", "value": "#!/bin/sh\necho hi\n"}]},
                "labels": {"k8s-io-instance-group": "nodes"},
                "serviceAccounts": [{"email": "default", "scopes": ["https://www.googleapis.com/auth/compute"]}],
                "tags": {"items": ["node"]},
            }}),
        );
    }

    fn mig(&self, size: u32) {
        self.network();
        self.template("t1");
        self.ok(
            "POST",
            &format!("/zones/{Z}/instanceGroupManagers"),
            json!({"name": "nodes", "baseInstanceName": "nodes", "instanceTemplate": "global/instanceTemplates/t1", "targetSize": size}),
        );
    }

    fn managed(&self) -> Vec<Value> {
        let v = self.ok("POST", &format!("/zones/{Z}/instanceGroupManagers/nodes/listManagedInstances"), Value::Null);
        v["managedInstances"].as_array().cloned().unwrap_or_default()
    }
}

fn last(link: &str) -> &str {
    link.rsplit('/').next().unwrap_or(link)
}

#[test]
fn a_mig_makes_named_instances_from_its_template() {
    let api = Api::new(Duration::ZERO, Some(Duration::ZERO));
    api.mig(2);
    let m = api.managed();
    assert_eq!(m.len(), 2);
    for mi in &m {
        let name = last(mi["instance"].as_str().unwrap());
        let suffix = name.strip_prefix("nodes-").expect("named after the base");
        assert!(suffix.len() == 4 && suffix.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()), "{name}");
        assert!(mi["id"].as_str().unwrap().parse::<u64>().unwrap() > 0);
        assert!(mi["instanceStatus"].is_string() && mi["currentAction"].is_string(), "{mi}");
    }
    let name = last(m[0]["instance"].as_str().unwrap());
    let i = api.ok("GET", &format!("/zones/{Z}/instances/{name}"), Value::Null);
    let items: Vec<(&str, &str)> =
        i["metadata"]["items"].as_array().unwrap().iter().map(|x| (x["key"].as_str().unwrap(), x["value"].as_str().unwrap())).collect();
    assert!(items.contains(&("user-data", "#!/bin/sh\necho hi\n")), "{items:?}");
    assert!(items.contains(&("created-by", "projects/123456789012/zones/europe-west1-b/instanceGroupManagers/nodes")), "{items:?}");
    assert_eq!(i["labels"]["k8s-io-instance-group"], "nodes");
    assert_eq!(i["disks"][0]["boot"], true);
    assert_eq!(last(i["machineType"].as_str().unwrap()), "e2-medium");
    // The boot disk exists, named after the instance, and is in use by it.
    let d = api.ok("GET", &format!("/zones/{Z}/disks/{name}"), Value::Null);
    assert_eq!(d["sizeGb"], "20");
    assert_eq!(last(d["users"][0].as_str().unwrap()), name);
    // The data plane sees the same, with addresses from the subnetwork (not .0, .1).
    let views = api.0.instances();
    assert_eq!(views.len(), 2);
    let mut ips: Vec<&str> = views.iter().map(|v| v.network_ip.as_str()).collect();
    ips.sort();
    assert_eq!(ips, ["10.0.16.2", "10.0.16.3"]);
    assert_eq!(views[0].user_data(), Some("#!/bin/sh\necho hi\n"));
    assert_eq!(views[0].mig.as_deref(), Some("nodes"));
}

#[test]
fn recreate_and_kill_keep_the_name_and_change_the_id() {
    let api = Api::new(Duration::ZERO, None);
    api.mig(2);
    let m = api.managed();
    let (link, old_id) = (m[0]["instance"].as_str().unwrap().to_string(), m[0]["id"].as_str().unwrap().to_string());
    let name = last(&link).to_string();
    assert_eq!(m[0]["currentAction"], "CREATING", "PROVISIONING until the data plane boots it");
    api.0.set_instance_status(Z, &name, "RUNNING").unwrap();
    assert_eq!(api.managed().iter().find(|x| x["instance"] == link.as_str()).unwrap()["currentAction"], "NONE");

    api.ok("POST", &format!("/zones/{Z}/instanceGroupManagers/nodes/recreateInstances"), json!({"instances": [link]}));
    let again = api.managed().into_iter().find(|x| x["instance"] == link.as_str()).expect("same name");
    assert_ne!(again["id"].as_str().unwrap(), old_id);
    assert_eq!(again["currentAction"], "RECREATING");
    assert_eq!(again["instanceStatus"], "PROVISIONING");

    let id2 = again["id"].as_str().unwrap().to_string();
    api.0.kill_instance(Z, &name).unwrap();
    let v = api.0.instance(Z, &name).expect("made again by its group");
    assert_ne!(v.id, id2);
    assert_eq!(v.status, "PROVISIONING");
    // Deleting a member through instances.delete: the group makes it again too.
    api.ok("DELETE", &format!("/zones/{Z}/instances/{name}"), Value::Null);
    assert!(api.0.instance(Z, &name).is_some());
    // A member that dies (TERMINATED) is remade.
    let id3 = api.0.instance(Z, &name).unwrap().id;
    api.0.set_instance_status(Z, &name, "TERMINATED").unwrap();
    let v = api.0.instance(Z, &name).unwrap();
    assert_ne!(v.id, id3);
    assert_eq!(v.status, "PROVISIONING");
    assert!(api.0.set_instance_status(Z, &name, "DANCING").is_err());
    assert!(api.0.kill_instance(Z, "nope").is_err());
}

#[test]
fn resize_delete_instances_and_set_template() {
    let api = Api::new(Duration::ZERO, Some(Duration::ZERO));
    api.mig(1);
    api.ok("POST", &format!("/zones/{Z}/instanceGroupManagers/nodes/resize?size=3"), Value::Null);
    let m = api.managed();
    assert_eq!(m.len(), 3);
    api.ok("POST", &format!("/zones/{Z}/instanceGroupManagers/nodes/deleteInstances"), json!({"instances": [m[2]["instance"]]}));
    let g = api.ok("GET", &format!("/zones/{Z}/instanceGroupManagers/nodes"), Value::Null);
    assert_eq!(g["targetSize"], 2);
    assert_eq!(api.0.instances().len(), 2);
    api.err(
        "POST",
        &format!("/zones/{Z}/instanceGroupManagers/nodes/deleteInstances"),
        json!({"instances": ["zones/europe-west1-b/instances/stranger"]}),
        400,
        "invalid",
    );
    api.template("t2");
    api.ok("POST", &format!("/zones/{Z}/instanceGroupManagers/nodes/setInstanceTemplate"), json!({"instanceTemplate": "global/instanceTemplates/t2"}));
    assert_eq!(last(api.ok("GET", &format!("/zones/{Z}/instanceGroupManagers/nodes"), Value::Null)["instanceTemplate"].as_str().unwrap()), "t2");
    // The old template is free now; the new one is in use.
    let op = api.ok("DELETE", "/global/instanceTemplates/t2", Value::Null);
    assert_eq!(op["error"]["errors"][0]["code"], "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE", "{op}");
    assert!(api.ok("DELETE", "/global/instanceTemplates/t1", Value::Null).get("error").is_none());
    api.ok("POST", &format!("/zones/{Z}/instanceGroupManagers/nodes/resize?size=0"), Value::Null);
    assert!(api.0.instances().is_empty());
    // Their boot disks went with them (autoDelete).
    assert!(api.0.disks().is_empty());
    api.ok("DELETE", &format!("/zones/{Z}/instanceGroupManagers/nodes"), Value::Null);
    api.err("GET", &format!("/zones/{Z}/instanceGroupManagers/nodes"), Value::Null, 404, "notFound");
}

#[test]
fn disks_have_users_and_refuse_a_second_writer() {
    let api = Api::new(Duration::ZERO, Some(Duration::ZERO));
    api.mig(2);
    let m = api.managed();
    let (a, b) = (last(m[0]["instance"].as_str().unwrap()).to_string(), last(m[1]["instance"].as_str().unwrap()).to_string());
    api.ok("POST", &format!("/zones/{Z}/disks"), json!({"name": "etcd-a", "sizeGb": "20", "type": "pd-ssd", "labels": {"k8s-io-cluster-name": "c"}}));
    api.ok("POST", &format!("/zones/{Z}/instances/{a}/attachDisk"), json!({"source": format!("zones/{Z}/disks/etcd-a"), "deviceName": "etcd"}));
    let d = api.0.disk(Z, "etcd-a").unwrap();
    assert_eq!(d.users, vec![a.clone()]);
    let e = api.err(
        "POST",
        &format!("/zones/{Z}/instances/{b}/attachDisk"),
        json!({"source": format!("projects/acme-prod/zones/{Z}/disks/etcd-a")}),
        400,
        "resourceInUseByAnotherResource",
    );
    assert!(e["error"]["message"].as_str().unwrap().contains("is already being used by"), "{e}");
    api.err(
        "POST",
        &format!("/zones/{Z}/instances/{b}/attachDisk"),
        json!({"source": format!("zones/{Z}/disks/etcd-a"), "mode": "READ_ONLY"}),
        400,
        "resourceInUseByAnotherResource",
    );
    api.err(
        "POST",
        &format!("/zones/{Z}/instances/{a}/attachDisk"),
        json!({"source": format!("zones/{Z}/disks/etcd-a")}),
        400,
        "resourceInUseByAnotherResource",
    );
    api.err("POST", &format!("/zones/{Z}/instances/{b}/attachDisk"), json!({"source": format!("zones/{Z}/disks/nope")}), 404, "notFound");
    // Deleting an attached disk fails in its operation.
    let op = api.ok("DELETE", &format!("/zones/{Z}/disks/etcd-a"), Value::Null);
    assert_eq!(op["error"]["errors"][0]["code"], "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE");
    api.err("POST", &format!("/zones/{Z}/instances/{a}/detachDisk?deviceName=other"), Value::Null, 400, "invalid");
    api.ok("POST", &format!("/zones/{Z}/instances/{a}/detachDisk?deviceName=etcd"), Value::Null);
    assert!(api.0.disk(Z, "etcd-a").unwrap().users.is_empty());
    api.ok("POST", &format!("/zones/{Z}/instances/{b}/attachDisk"), json!({"source": format!("zones/{Z}/disks/etcd-a")}));
    assert_eq!(api.0.disk(Z, "etcd-a").unwrap().users, vec![b.clone()]);
    let dev = api.0.instance(Z, &b).unwrap().disks;
    assert_eq!((dev[1].disk.as_str(), dev[1].device_name.as_str(), dev[1].mode.as_str()), ("etcd-a", "persistent-disk-1", "READ_WRITE"));
    // Killing the writer frees the disk (it is not auto-deleted).
    api.0.kill_instance(Z, &b).unwrap();
    assert!(api.0.disk(Z, "etcd-a").unwrap().users.is_empty());
}

#[test]
fn label_and_metadata_fingerprints() {
    let api = Api::new(Duration::ZERO, Some(Duration::ZERO));
    api.ok("POST", &format!("/zones/{Z}/disks"), json!({"name": "d", "sizeGb": "10", "labels": {"a": "1"}}));
    let d = api.ok("GET", &format!("/zones/{Z}/disks/d"), Value::Null);
    let fp = d["labelFingerprint"].as_str().unwrap().to_string();
    api.err("POST", &format!("/zones/{Z}/disks/d/setLabels"), json!({"labelFingerprint": "AAAAAAAAAAA=", "labels": {"a": "2"}}), 412, "conditionNotMet");
    api.err("POST", &format!("/zones/{Z}/disks/d/setLabels"), json!({"labels": {"a": "2"}}), 412, "conditionNotMet");
    api.ok("POST", &format!("/zones/{Z}/disks/d/setLabels"), json!({"labelFingerprint": fp, "labels": {"a": "2"}}));
    // The old fingerprint is stale now.
    api.err("POST", &format!("/zones/{Z}/disks/d/setLabels"), json!({"labelFingerprint": fp, "labels": {"a": "3"}}), 412, "conditionNotMet");
    api.err(
        "POST",
        &format!("/zones/{Z}/disks/d/setLabels"),
        json!({"labelFingerprint": api.ok("GET", &format!("/zones/{Z}/disks/d"), Value::Null)["labelFingerprint"], "labels": {"Bad": "x"}}),
        400,
        "invalid",
    );
    assert_eq!(api.0.disk(Z, "d").unwrap().labels["a"], "2");

    api.mig(1);
    let name = api.0.instances()[0].name.clone();
    let i = api.ok("GET", &format!("/zones/{Z}/instances/{name}"), Value::Null);
    let mut md = i["metadata"].clone();
    md["items"].as_array_mut().unwrap().push(json!({"key": "k", "value": "v"}));
    api.ok("POST", &format!("/zones/{Z}/instances/{name}/setMetadata"), md.clone());
    assert_eq!(api.0.instance(Z, &name).unwrap().metadata["k"], "v");
    api.err("POST", &format!("/zones/{Z}/instances/{name}/setMetadata"), md, 412, "conditionNotMet");
    let lf = i["labelFingerprint"].clone();
    api.ok("POST", &format!("/zones/{Z}/instances/{name}/setLabels"), json!({"labelFingerprint": lf, "labels": {"x": "y"}}));
    api.err("POST", &format!("/zones/{Z}/instances/{name}/setLabels"), json!({"labelFingerprint": lf, "labels": {"x": "z"}}), 412, "conditionNotMet");
}

#[test]
fn disk_lists_filter_on_labels_and_paginate() {
    let api = Api::new(Duration::ZERO, Some(Duration::ZERO));
    for (n, labels) in [
        ("a-etcd-main", json!({"k8s-io-cluster-name": "c1", "k8s-io-etcd-main": "a-2fa"})),
        ("a-etcd-events", json!({"k8s-io-cluster-name": "c1", "k8s-io-etcd-events": "a-2fa"})),
        ("b-etcd-main", json!({"k8s-io-cluster-name": "c1", "k8s-io-etcd-main": "b-2fa"})),
        ("other", json!({"k8s-io-cluster-name": "c2", "k8s-io-etcd-main": "a"})),
    ] {
        api.ok("POST", &format!("/zones/{Z}/disks"), json!({"name": n, "sizeGb": "10", "labels": labels}));
    }
    let names = |q: &str| -> Vec<String> {
        let v = api.ok("GET", &format!("/zones/{Z}/disks?filter={}", percent(q)), Value::Null);
        v["items"].as_array().into_iter().flatten().map(|d| d["name"].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(names("labels.k8s-io-cluster-name=c1 AND labels.k8s-io-etcd-main:*"), ["a-etcd-main", "b-etcd-main"]);
    assert_eq!(names("(labels.k8s-io-cluster-name = \"c1\") (labels.k8s-io-etcd-events:*)"), ["a-etcd-events"]);
    assert_eq!(names("labels.k8s-io-cluster-name=c3"), Vec::<String>::new());
    api.err("GET", &format!("/zones/{Z}/disks?filter={}", percent("labels.a=b OR labels.c=d")), Value::Null, 400, "invalid");
    // Pages of two: a token to the next, none after the last.
    let p1 = api.ok("GET", &format!("/zones/{Z}/disks?maxResults=2"), Value::Null);
    assert_eq!(p1["items"].as_array().unwrap().len(), 2);
    let tok = p1["nextPageToken"].as_str().unwrap();
    let p2 = api.ok("GET", &format!("/zones/{Z}/disks?maxResults=2&pageToken={tok}"), Value::Null);
    assert_eq!(p2["items"].as_array().unwrap().len(), 2);
    assert!(p2.get("nextPageToken").is_none());
    assert_ne!(p1["items"][0]["name"], p2["items"][0]["name"]);
    api.err("GET", &format!("/zones/{Z}/disks?pageToken=garbage"), Value::Null, 400, "invalid");
}

fn percent(s: &str) -> String {
    s.bytes().map(|b| if b.is_ascii_alphanumeric() || b"-._~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") }).collect()
}

#[test]
fn operations_go_pending_running_done_and_wait_returns_done() {
    let api = Api::new(Duration::from_millis(400), Some(Duration::ZERO));
    let op = api.ok("POST", "/global/networks", json!({"name": "net"}));
    assert_eq!(op["status"], "PENDING", "{op}");
    assert_eq!(op["kind"], "compute#operation");
    assert_eq!(last(op["targetLink"].as_str().unwrap()), "net");
    assert!(op["selfLink"].as_str().unwrap().ends_with(&format!("/global/operations/{}", op["name"].as_str().unwrap())));
    let name = op["name"].as_str().unwrap().to_string();
    std::thread::sleep(Duration::from_millis(150));
    assert_eq!(api.ok("GET", &format!("/global/operations/{name}"), Value::Null)["status"], "RUNNING");
    let done = api.ok("POST", &format!("/global/operations/{name}/wait"), Value::Null);
    assert_eq!((done["status"].as_str(), done["progress"].as_u64()), (Some("DONE"), Some(100)));
    // A global operation is not a zonal one.
    api.err("GET", &format!("/zones/{Z}/operations/{name}"), Value::Null, 404, "notFound");
    // A zonal one carries its zone; a regional one its region.
    let d = api.ok("POST", &format!("/zones/{Z}/disks"), json!({"name": "d", "sizeGb": "1"}));
    assert_eq!(last(d["zone"].as_str().unwrap()), Z);
    assert_eq!(api.ok("GET", &format!("/zones/{Z}/disks/d"), Value::Null)["status"], "CREATING");
    let dn = d["name"].as_str().unwrap();
    api.ok("POST", &format!("/zones/{Z}/operations/{dn}/wait"), Value::Null);
    assert_eq!(api.ok("GET", &format!("/zones/{Z}/disks/d"), Value::Null)["status"], "READY");
    let s = api.ok("POST", "/regions/europe-west1/subnetworks", json!({"name": "s", "network": "global/networks/net", "ipCidrRange": "10.1.0.0/24"}));
    assert_eq!(last(s["region"].as_str().unwrap()), "europe-west1");
    // Network in use: the delete operation fails when done.
    let del = api.ok("DELETE", "/global/networks/net", Value::Null);
    let del = api.ok("POST", &format!("/global/operations/{}/wait", del["name"].as_str().unwrap()), Value::Null);
    assert_eq!(del["error"]["errors"][0]["code"], "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE", "{del}");
    assert_eq!(del["httpErrorStatusCode"], 400);
    assert!(api.ok("GET", "/global/networks/net", Value::Null)["subnetworks"].is_array());
}

#[test]
fn errors_auth_and_validation() {
    let api = Api::new(Duration::ZERO, Some(Duration::ZERO));
    api.network();
    api.err("POST", "/global/networks", json!({"name": "net"}), 409, "alreadyExists");
    api.err("POST", "/global/networks", json!({"name": "Net_1"}), 400, "invalid");
    api.err("GET", "/global/networks/nope", Value::Null, 404, "notFound");
    api.err("GET", "/zones/mars-1a", Value::Null, 404, "notFound");
    api.err(
        "POST",
        "/regions/europe-west1/subnetworks",
        json!({"name": "sub2", "network": "global/networks/net", "ipCidrRange": "10.0.17.0/24"}),
        400,
        "invalid",
    );
    api.err(
        "POST",
        "/regions/europe-west1/subnetworks",
        json!({"name": "sub3", "network": "global/networks/nope", "ipCidrRange": "10.9.0.0/24"}),
        404,
        "notFound",
    );
    api.err("POST", "/global/instanceTemplates", json!({"name": "t", "properties": {"machineType": "e2-medium", "disks": []}}), 400, "invalid");
    api.err(
        "POST",
        &format!("/zones/{Z}/instanceGroupManagers"),
        json!({"name": "g", "baseInstanceName": "g", "instanceTemplate": "global/instanceTemplates/none", "targetSize": 1}),
        404,
        "notFound",
    );
    // Firewalls: insert, patch replaces the fields sent, list.
    api.ok(
        "POST",
        "/global/firewalls",
        json!({"name": "fw", "network": "global/networks/net", "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}], "sourceRanges": ["0.0.0.0/0"]}),
    );
    api.ok("PATCH", "/global/firewalls/fw", json!({"sourceRanges": ["192.0.2.0/24"]}));
    let fw = api.ok("GET", "/global/firewalls/fw", Value::Null);
    assert_eq!((fw["sourceRanges"][0].as_str(), fw["allowed"][0]["ports"][0].as_str()), (Some("192.0.2.0/24"), Some("22")));
    assert_eq!(api.ok("GET", "/global/firewalls", Value::Null)["items"].as_array().unwrap().len(), 1);
    // Without a bearer token: 401 in Google's format.
    let r = api.0.answer(&Request { method: "GET".into(), path: P.into(), query: String::new(), headers: vec![], peer: "x".into(), body: vec![] });
    assert_eq!(r.status, 401);
    let Body::Bytes(b) = r.body else { panic!() };
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(v["error"]["code"], 401);
    assert_eq!(api.ok("GET", "", Value::Null)["name"], "acme-prod");
    assert_eq!(api.ok("GET", "/zones", Value::Null)["items"].as_array().unwrap().len(), 3);
}

#[test]
fn a_mig_retries_an_instance_it_cannot_make_yet() {
    let api = Api::new(Duration::ZERO, Some(Duration::ZERO));
    // A network without a subnetwork in the zone's region: the group is made, its instance is not.
    api.ok("POST", "/global/networks", json!({"name": "net"}));
    api.template("t1");
    api.ok(
        "POST",
        &format!("/zones/{Z}/instanceGroupManagers"),
        json!({"name": "nodes", "baseInstanceName": "nodes", "instanceTemplate": "global/instanceTemplates/t1", "targetSize": 1}),
    );
    let m = api.managed();
    assert_eq!(m.len(), 1);
    assert!(m[0].get("instance").is_none(), "{}", m[0]);
    assert_eq!(m[0]["currentAction"], "CREATING");
    assert!(m[0]["lastAttempt"]["errors"]["errors"][0]["message"].as_str().unwrap().contains("subnetwork"), "{}", m[0]);
    assert_eq!(api.ok("GET", &format!("/zones/{Z}/instanceGroupManagers/nodes"), Value::Null)["status"]["isStable"], false);
    // Once the subnetwork exists, the next look finds the instance made, under the name it was given.
    api.ok("POST", "/regions/europe-west1/subnetworks", json!({"name": "sub", "network": "global/networks/net", "ipCidrRange": "10.0.16.0/20"}));
    let m2 = api.managed();
    assert_eq!(last(m2[0]["instance"].as_str().unwrap()), m[0]["name"].as_str().unwrap());
    assert!(m2[0].get("lastAttempt").is_none());
    assert_eq!(api.ok("GET", &format!("/zones/{Z}/instanceGroupManagers/nodes"), Value::Null)["status"]["isStable"], true);
}

#[test]
fn instances_insert_makes_an_instance_of_no_mig_from_its_body_or_a_template() {
    let api = Api::new(Duration::from_millis(10), Some(Duration::from_millis(10)));
    api.mig(1);
    // From a template, the body's fields over the template's properties.
    let op = api.ok(
        "POST",
        &format!("/zones/{Z}/instances?sourceInstanceTemplate=global/instanceTemplates/t1"),
        json!({"name": "bare-1", "labels": {"k8s-io-instance-group": "other"}}),
    );
    assert_eq!((op["kind"].as_str(), op["operationType"].as_str()), (Some("compute#operation"), Some("insert")));
    assert!(op["targetLink"].as_str().is_some_and(|l| l.ends_with(&format!("/zones/{Z}/instances/bare-1"))), "{op}");
    let i = api.ok("GET", &format!("/zones/{Z}/instances/bare-1"), Value::Null);
    assert_eq!(op["targetId"], i["id"]);
    let items: Vec<&str> = i["metadata"]["items"].as_array().into_iter().flatten().filter_map(|it| it["key"].as_str()).collect();
    assert_eq!(items, vec!["user-data"], "the template's metadata, and no created-by: {i}");
    assert_eq!(i["labels"]["k8s-io-instance-group"], "other");
    assert_eq!(last(i["disks"][0]["source"].as_str().expect("boot disk")), "bare-1");
    assert!(i["networkInterfaces"][0]["networkIP"].as_str().is_some_and(|ip| ip.starts_with("10.0.16.")), "{i}");
    // The MIG does not list it, and does not touch it.
    assert!(api.managed().iter().all(|m| last(m["instance"].as_str().unwrap_or_default()) != "bare-1"));
    let view = api.0.instance(Z, "bare-1").expect("seen by the data plane");
    assert_eq!(view.mig, None);
    // From its body alone.
    api.ok(
        "POST",
        &format!("/zones/{Z}/instances"),
        json!({"name": "bare-2", "machineType": format!("zones/{Z}/machineTypes/e2-small"),
               "disks": [{"boot": true, "autoDelete": true, "initializeParams": {"diskSizeGb": "10"}}],
               "networkInterfaces": [{"network": "global/networks/net", "subnetwork": "regions/europe-west1/subnetworks/sub"}]}),
    );
    assert_eq!(api.0.instance(Z, "bare-2").expect("bare-2").machine_type, "e2-small");
    // Google's refusals: the name taken, no machine type, no boot disk, an unknown template.
    api.err("POST", &format!("/zones/{Z}/instances?sourceInstanceTemplate=global/instanceTemplates/t1"), json!({"name": "bare-1"}), 409, "alreadyExists");
    api.err("POST", &format!("/zones/{Z}/instances"), json!({"name": "bare-3", "disks": [{"boot": true}]}), 400, "required");
    api.err("POST", &format!("/zones/{Z}/instances"), json!({"name": "bare-3", "machineType": "zones/z/machineTypes/e2-small"}), 400, "invalid");
    api.err("POST", &format!("/zones/{Z}/instances?sourceInstanceTemplate=global/instanceTemplates/nope"), json!({"name": "bare-3"}), 404, "notFound");
}
