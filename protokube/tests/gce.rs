//! protokube on GCE, one `--once` pass of the real binary against the harness's Compute and Cloud
//! DNS emulators and a metadata server (over 127.0.0.1; no root): it finds its member's disk by
//! kOps' labels, claims it (attached READ_WRITE under the disk's name), finds the device at
//! `google-<disk>` in `--by-id-dir`, refuses to format what is not a blank block device, and keeps
//! the control plane's Cloud DNS records.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use testkit::cloud_dns::{CloudDns, DnsConfig};
use testkit::gce_compute::{Config, GceCompute};
use testkit::gce_metadata::InstanceFacts;
use testkit::httpd::{Body, Request, Server};

const PROJECT: &str = "acme-prod";
const ZB: &str = "europe-west1-b";
const ZC: &str = "europe-west1-c";
const CLUSTER: &str = "gce.k8s.example.com";

fn call(answer: impl Fn(&Request) -> testkit::httpd::Response, method: &str, path: &str, body: Value) -> Value {
    let req = Request {
        method: method.into(),
        path: path.into(),
        query: String::new(),
        headers: vec![("authorization".into(), "Bearer setup".into())],
        peer: "127.0.0.1:1".into(),
        body: body.to_string().into_bytes(),
    };
    let r = answer(&req);
    let Body::Bytes(b) = r.body else { panic!("not bytes") };
    let v: Value = serde_json::from_slice(&b).expect("JSON");
    assert_eq!(r.status, 200, "{method} {path}: {v}");
    v
}

fn compute(c: &GceCompute, method: &str, path: &str, body: Value) -> Value {
    call(|r| c.answer(r), method, &format!("/compute/v1/projects/{PROJECT}{path}"), body)
}

/// The etcd disk of member `member` (of b, c), labelled as kOps labels it.
fn etcd_disk(c: &GceCompute, zone: &str, member: &str) -> String {
    let name = format!("{member}-etcd-main-gce-k8s-example-com");
    let members = cloud::gce::labels::encode_label(&format!("{member}/b,c")).expect("label");
    compute(
        c,
        "POST",
        &format!("/zones/{zone}/disks"),
        json!({"name": name, "sizeGb": "20", "type": "pd-ssd",
               "labels": {"k8s-io-cluster-name": "gce-k8s-example-com", "k8s-io-role-master": "master", "k8s-io-etcd-main": members}}),
    );
    name
}

#[test]
fn one_pass_claims_its_disk_by_labels_never_formats_a_non_block_device_and_keeps_cloud_dns() {
    let c = GceCompute::new(Config { operation_delay: Duration::from_millis(50), boot_delay: Some(Duration::from_millis(10)), ..Config::example() });
    let dns = CloudDns::new(DnsConfig { change_delay: Duration::from_millis(10), ..DnsConfig::example() });
    let server = c.start_with(Some(dns.clone()));
    // The control plane of group cp-b: one instance of its MIG in zone b.
    compute(&c, "POST", "/global/networks", json!({"name": "net", "autoCreateSubnetworks": false}));
    compute(&c, "POST", "/regions/europe-west1/subnetworks", json!({"name": "sub", "network": "global/networks/net", "ipCidrRange": "10.0.16.0/20"}));
    compute(
        &c,
        "POST",
        "/global/instanceTemplates",
        json!({"name": "cp-b", "properties": {"machineType": "e2-medium",
            "disks": [{"boot": true, "autoDelete": true, "initializeParams": {"diskSizeGb": "20"}}],
            "networkInterfaces": [{"network": "global/networks/net", "subnetwork": "regions/europe-west1/subnetworks/sub"}]}}),
    );
    compute(
        &c,
        "POST",
        &format!("/zones/{ZB}/instanceGroupManagers"),
        json!({"name": "cp-b", "baseInstanceName": "cp-b", "instanceTemplate": "global/instanceTemplates/cp-b", "targetSize": 1}),
    );
    let me = c.instances().into_iter().next().expect("the MIG's instance");
    let disk_b = etcd_disk(&c, ZB, "b");
    let disk_c = etcd_disk(&c, ZC, "c");
    call(
        |r| dns.answer(r),
        "POST",
        &format!("/dns/v1/projects/{PROJECT}/managedZones"),
        json!({"name": "k8s-example-com", "dnsName": "k8s.example.com.", "description": ""}),
    );

    // The instance's metadata server, with the service account's token.
    let facts = InstanceFacts {
        zone: ZB.into(),
        name: me.name.clone(),
        id: me.id.clone(),
        internal_ip: me.network_ip.clone(),
        hostname: format!("{}.{ZB}.c.{PROJECT}.internal", me.name),
        ..InstanceFacts::example()
    };
    let mut values = facts.values();
    values.insert("instance/service-accounts/default/token".into(), json!({"access_token": "tok", "expires_in": 3599, "token_type": "Bearer"}).to_string());
    let meta = Server::start(Arc::new(move |req: &Request| testkit::gce_metadata::answer(&values, req)));

    // The state store: the completed spec and the cluster CAs.
    let state = tempfile::tempdir().expect("state");
    let spec = format!(
        "apiVersion: kops.k8s.io/v1alpha2\nkind: Cluster\nmetadata:\n  name: {CLUSTER}\nspec:\n  cloudProvider: gce\n  configBase: file://{0}\n  dnsZone: k8s.example.com\n  etcdClusters:\n  - name: main\n    version: 3.5.21\n    etcdMembers:\n    - name: b\n      instanceGroup: cp-b\n    - name: c\n      instanceGroup: cp-c\n",
        state.path().display()
    );
    std::fs::write(state.path().join("cluster-completed.spec"), spec).expect("spec");
    base::pki::init_pki(state.path(), &["main".to_string()]).expect("CAs");
    let boot = state.path().join("bootconfig.yaml");
    std::fs::write(
        &boot,
        format!("CloudProvider: gce\nConfigBase: file://{}\nClusterName: {CLUSTER}\nInstanceGroupName: cp-b\nInstanceGroupRole: ControlPlane\nNodeupConfigHash: x\n", state.path().display()),
    )
    .expect("boot config");

    // The device link GCE's udev rules make, to something that is not a block device.
    let root = tempfile::tempdir().expect("root");
    let by_id = tempfile::tempdir().expect("by-id");
    let fake = by_id.path().join("fake-device");
    std::fs::write(&fake, vec![0u8; 4096]).expect("fake device");
    std::os::unix::fs::symlink(&fake, by_id.path().join(format!("google-{disk_b}"))).expect("link");

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_protokube"))
        .args(["--conf", &boot.display().to_string(), "--root", &root.path().display().to_string(), "--by-id-dir", &by_id.path().display().to_string()])
        .args(["--once", "--imds-url", &meta.url(""), "--endpoint-url", &server.url(""), "--attach-timeout", "10", "--device-timeout", "5"])
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env_remove("GCE_METADATA_HOST")
        .env("PROTOKUBE_LOG", "info")
        .output()
        .expect("run protokube");
    let stderr = String::from_utf8_lossy(&out.stderr);

    // Claimed: b's disk attached to this instance READ_WRITE under its own name; c's untouched.
    assert_eq!(c.disk(ZB, &disk_b).expect("disk b").users, vec![me.name.clone()], "{stderr}");
    let attached = c.instance(ZB, &me.name).expect("instance").disks.into_iter().find(|d| d.disk == disk_b).expect("attached");
    assert_eq!((attached.device_name.as_str(), attached.mode.as_str()), (disk_b.as_str(), "READ_WRITE"));
    assert!(c.disk(ZC, &disk_c).expect("disk c").users.is_empty(), "another group's member's disk is not touched");

    // Found at google-<disk>, refused (not a block device): never formatted, never labelled so.
    assert!(!out.status.success(), "a refused device fails the pass:\n{stderr}");
    assert!(stderr.contains("refused") && stderr.contains(&format!("google-{disk_b}")) && stderr.contains("not a block device"), "{stderr}");
    assert!(std::fs::read(&fake).expect("fake").iter().all(|b| *b == 0), "the device was not written");
    assert!(!c.disk(ZB, &disk_b).expect("disk b").labels.contains_key("keelson-io-etcd-formatted"));

    // Cloud DNS: b's member name and the API names at this instance, c's a placeholder.
    let a = dns.a_records();
    let ip = vec![me.network_ip.clone()];
    assert_eq!(a.get(&format!("etcd-b.internal.{CLUSTER}.")), Some(&ip), "{a:?}\n{stderr}");
    assert_eq!(a.get(&format!("api.internal.{CLUSTER}.")), Some(&ip));
    assert_eq!(a.get(&format!("etcd-c.internal.{CLUSTER}.")), Some(&vec!["203.0.113.123".to_string()]));

    // A second pass keeps the claim (no second attach) and has no DNS change to make.
    let again = std::process::Command::new(env!("CARGO_BIN_EXE_protokube"))
        .args(["--conf", &boot.display().to_string(), "--root", &root.path().display().to_string(), "--by-id-dir", &by_id.path().display().to_string()])
        .args(["--once", "--imds-url", &meta.url(""), "--endpoint-url", &server.url(""), "--attach-timeout", "10", "--device-timeout", "5"])
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env_remove("GCE_METADATA_HOST")
        .output()
        .expect("run protokube again");
    let stderr2 = String::from_utf8_lossy(&again.stderr);
    assert!(!stderr2.contains("attaching"), "held already: no attach\n{stderr2}");
    assert_eq!(c.disk(ZB, &disk_b).expect("disk b").users, vec![me.name.clone()]);
    assert!(stderr2.contains(" 0 dns records"), "converged DNS\n{stderr2}");
}
