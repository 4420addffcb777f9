//! protokube on GCE, `--once` passes of the real binary against the harness's Compute and Cloud
//! DNS emulators and a metadata server (over 127.0.0.1): it finds its member's disk by kOps'
//! labels, claims it (attached READ_WRITE under the disk's name), finds the device at
//! `google-<disk>` in `--by-id-dir`, keeps the control plane's Cloud DNS records, and holds to the
//! never-reformat rules: the first test needs no root (its "device" is not a block device and is
//! refused); the second formats and mounts a real loop device and needs root.

#[path = "support/state.rs"]
mod state;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use testkit::cloud_dns::{CloudDns, DnsConfig};
use testkit::gce_compute::{Config, GceCompute, InstanceView};
use testkit::gce_metadata::InstanceFacts;
use testkit::httpd::{Body, Request, Server};

const PROJECT: &str = "acme-prod";
const ZB: &str = "europe-west1-b";
const ZC: &str = "europe-west1-c";
const CLUSTER: &str = "gce.k8s.example.com";
const FORMATTED_LABEL: &str = "keelson-io-etcd-formatted";

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

/// Compute and Cloud DNS (one address), the control plane of group cp-b (one MIG instance in zone
/// b), the etcd disks of members b (zone b) and c (zone c), its metadata server, the state store.
struct Gce {
    c: GceCompute,
    dns: CloudDns,
    server: Server,
    _meta: Server,
    meta_url: String,
    me: InstanceView,
    disk_b: String,
    disk_c: String,
    _state: tempfile::TempDir,
    boot: PathBuf,
}

impl Gce {
    fn new() -> Gce {
        let c = GceCompute::new(Config { operation_delay: Duration::from_millis(50), boot_delay: Some(Duration::from_millis(10)), ..Config::example() });
        let dns = CloudDns::new(DnsConfig { change_delay: Duration::from_millis(10), ..DnsConfig::example() });
        let server = c.start_with(Some(dns.clone()));
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
            // Named as the compiler names group cp-b's MIG: protokube names in DNS only an
            // instance its member's group's MIG made.
            json!({"name": keelson_api::names::gce_instance_group_manager_name(ZB, "cp-b", CLUSTER), "baseInstanceName": "cp-b",
                "instanceTemplate": "global/instanceTemplates/cp-b", "targetSize": 1}),
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

        // The state store: the protokube configs compiled from the completed spec, and the cluster CAs.
        let state = tempfile::tempdir().expect("state");
        let spec = format!(
            "apiVersion: kops.k8s.io/v1alpha2\nkind: Cluster\nmetadata:\n  name: {CLUSTER}\nspec:\n  cloudProvider: gce\n  configBase: file://{0}\n  dnsZone: k8s.example.com\n  etcdClusters:\n  - name: main\n    version: 3.5.21\n    etcdMembers:\n    - name: b\n      instanceGroup: cp-b\n    - name: c\n      instanceGroup: cp-c\n",
            state.path().display()
        );
        state::write_protokube_configs(state.path(), &spec, &[]);
        base::pki::init_pki(state.path(), &["main".to_string()]).expect("CAs");
        let boot = state.path().join("bootconfig.yaml");
        std::fs::write(
            &boot,
            format!(
                "CloudProvider: gce\nConfigBase: file://{}\nClusterName: {CLUSTER}\nInstanceGroupName: cp-b\nInstanceGroupRole: ControlPlane\nNodeupConfigHash: x\n",
                state.path().display()
            ),
        )
        .expect("boot config");
        Gce { meta_url: meta.url(""), c, dns, server, _meta: meta, me, disk_b, disk_c, _state: state, boot }
    }

    /// One `--once` pass with this root and by-id directory.
    fn run(&self, root: &Path, by_id: &Path) -> Output {
        Command::new(env!("CARGO_BIN_EXE_protokube"))
            .args(["--conf", &self.boot.display().to_string(), "--root", &root.display().to_string(), "--by-id-dir", &by_id.display().to_string()])
            .args(["--once", "--imds-url", &self.meta_url, "--endpoint-url", &self.server.url(""), "--attach-timeout", "10", "--device-timeout", "5"])
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env_remove("GCE_METADATA_HOST")
            .env("PROTOKUBE_LOG", "info")
            .output()
            .expect("run protokube")
    }

    fn labels_b(&self) -> std::collections::BTreeMap<String, String> {
        self.c.disk(ZB, &self.disk_b).expect("disk b").labels
    }

    /// b's disk attached to this instance only, READ_WRITE, under its own name; c's untouched.
    fn assert_claimed(&self, stderr: &str) {
        assert_eq!(self.c.disk(ZB, &self.disk_b).expect("disk b").users, vec![self.me.name.clone()], "{stderr}");
        let attached = self.c.instance(ZB, &self.me.name).expect("instance").disks.into_iter().find(|d| d.disk == self.disk_b).expect("attached");
        assert_eq!((attached.device_name.as_str(), attached.mode.as_str()), (self.disk_b.as_str(), "READ_WRITE"));
        assert!(self.c.disk(ZC, &self.disk_c).expect("disk c").users.is_empty(), "another group's member's disk is not touched");
    }
}

#[test]
fn one_pass_claims_its_disk_by_labels_never_formats_a_non_block_device_and_keeps_cloud_dns() {
    let g = Gce::new();
    // The device link GCE's udev rules make, to something that is not a block device.
    let root = tempfile::tempdir().expect("root");
    let by_id = tempfile::tempdir().expect("by-id");
    let fake = by_id.path().join("fake-device");
    std::fs::write(&fake, vec![0u8; 4096]).expect("fake device");
    std::os::unix::fs::symlink(&fake, by_id.path().join(format!("google-{}", g.disk_b))).expect("link");

    let out = g.run(root.path(), by_id.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    g.assert_claimed(&stderr);
    // Found at google-<disk>, refused (not a block device): never formatted, never labelled so.
    assert!(!out.status.success(), "a refused device fails the pass:\n{stderr}");
    assert!(stderr.contains("refused") && stderr.contains(&format!("google-{}", g.disk_b)) && stderr.contains("not a block device"), "{stderr}");
    assert!(std::fs::read(&fake).expect("fake").iter().all(|b| *b == 0), "the device was not written");
    assert!(!g.labels_b().contains_key(FORMATTED_LABEL));

    // Cloud DNS: b's member name and the API names at this instance, c's a placeholder.
    let a = g.dns.a_records();
    let ip = vec![g.me.network_ip.clone()];
    assert_eq!(a.get(&format!("etcd-b.internal.{CLUSTER}.")), Some(&ip), "{a:?}\n{stderr}");
    assert_eq!(a.get(&format!("api.internal.{CLUSTER}.")), Some(&ip));
    assert_eq!(a.get(&format!("etcd-c.internal.{CLUSTER}.")), Some(&vec!["203.0.113.123".to_string()]));

    // A second pass keeps the claim (no second attach) and has no DNS change to make.
    let again = g.run(root.path(), by_id.path());
    let stderr2 = String::from_utf8_lossy(&again.stderr);
    assert!(!stderr2.contains("attaching"), "held already: no attach\n{stderr2}");
    g.assert_claimed(&stderr2);
    assert!(stderr2.contains(" 0 dns records"), "converged DNS\n{stderr2}");
    // Google API calls are counted like the AWS SDK's.
    let calls: u64 = stderr2.split("cloud_calls=").nth(1).and_then(|r| r.split_whitespace().next()).and_then(|n| n.parse().ok()).unwrap_or(0);
    assert!(calls > 0, "the pass reports its Compute and Cloud DNS calls\n{stderr2}");
    eprintln!("converged GCE pass: {calls} API calls");
}

fn sh(cmd: &str) -> String {
    let out = Command::new("sh").args(["-c", cmd]).output().expect("sh");
    assert!(out.status.success(), "`{cmd}` failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A blank sparse file on a loop device; unmounted and detached on drop.
struct Loop {
    dev: String,
    _file: tempfile::NamedTempFile,
}

impl Loop {
    fn new() -> Loop {
        let file = tempfile::NamedTempFile::new().expect("backing file");
        file.as_file().set_len(64 << 20).expect("size");
        let dev = sh(&format!("losetup --find --show {}", file.path().display()));
        Loop { dev, _file: file }
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("sh").args(["-c", &format!("umount {0} 2>/dev/null; losetup -d {0}", self.dev)]).status();
    }
}

#[test]
fn a_blank_disk_is_formatted_once_labelled_and_a_labelled_disk_that_reads_blank_is_refused() {
    let uid = sh("id -u");
    assert_eq!(uid, "0", "this test needs root (loop devices, mkfs, mount); run it as root (scripts/test in CI runs as root)");
    let g = Gce::new();
    let root = tempfile::tempdir().expect("root");
    let by_id = tempfile::tempdir().expect("by-id");
    let d = Loop::new();
    std::os::unix::fs::symlink(&d.dev, by_id.path().join(format!("google-{}", g.disk_b))).expect("link");

    let out = g.run(root.path(), by_id.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let mount = root.path().join(format!("mnt/master-{}", g.disk_b));
    let unmount = || {
        let _ = Command::new("umount").arg(&mount).status();
    };
    if !out.status.success() {
        unmount();
        panic!("first pass:\n{stderr}");
    }
    g.assert_claimed(&stderr);
    assert!(String::from_utf8_lossy(&out.stdout).contains("protokube: 1 volumes mounted, 1 manifests written"), "{stderr}");
    assert_eq!(sh(&format!("blkid -p -o value -s TYPE {}", d.dev)), "ext4");
    assert_eq!(g.labels_b().get(FORMATTED_LABEL).map(String::as_str), Some("ext4"), "the disk records that it was formatted");
    let manifest = std::fs::read_to_string(root.path().join("etc/kubernetes/manifests/etcd-main.manifest")).expect("manifest");
    assert!(manifest.contains(&format!("--data-dir=/mnt/master-{}/data", g.disk_b)) && manifest.contains("--name=etcd-b"), "{manifest}");
    unmount();

    // The same disk now reads all zeros (a wrong or wiped device): labelled as formatted, so refused.
    sh(&format!("dd if=/dev/zero of={} bs=1M count=64 conv=fsync status=none", d.dev));
    let out = g.run(root.path(), by_id.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    unmount();
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("probes blank but volume") && stderr.contains("refusing to format again"), "{stderr}");
    assert!(Command::new("blkid").args(["-p", &d.dev]).output().expect("blkid").status.code() == Some(2), "still blank: not formatted again");
}
