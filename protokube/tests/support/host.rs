//! Test hosts: a root directory, a by-id directory with links to real loop devices, a moto-side
//! instance and etcd volumes tagged the kOps way, and a way to run the real `protokube` binary.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use aws_sdk_ec2::types::{ResourceType, Tag, TagSpecification};

#[path = "iam.rs"]
pub mod iam;
#[path = "state.rs"]
pub mod state;

pub const AMI: &str = "ami-12345678";

pub fn need_root() {
    let uid = Command::new("id").arg("-u").output().expect("id -u");
    assert_eq!(
        String::from_utf8_lossy(&uid.stdout).trim(),
        "0",
        "this test needs root (loop devices, mkfs, mount); run it as root (scripts/test in CI runs as root)"
    );
    for tool in ["losetup", "mkfs.ext4", "blkid", "wipefs", "e2fsck", "mount", "umount"] {
        let ok = Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().map(|o| o.status.success()).unwrap_or(false);
        assert!(ok, "this test needs `{tool}` (Debian packages util-linux, e2fsprogs, mount)");
    }
}

pub fn sh(cmd: &str) -> Output {
    let out = Command::new("sh").args(["-c", cmd]).output().expect("sh");
    assert!(out.status.success(), "`{cmd}` failed: {}", String::from_utf8_lossy(&out.stderr));
    out
}

/// A sparse file attached to a free loop device; detached on drop.
pub struct LoopDev {
    pub dev: PathBuf,
    _file: tempfile::NamedTempFile,
}

impl LoopDev {
    pub fn new(mib: u64) -> LoopDev {
        let file = tempfile::NamedTempFile::new().expect("backing file");
        file.as_file().set_len(mib << 20).expect("size backing file");
        let out = sh(&format!("losetup --find --show {}", file.path().display()));
        let dev = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        LoopDev { dev, _file: file }
    }
    pub fn sha256(&self) -> String {
        String::from_utf8_lossy(&sh(&format!("sha256sum {}", self.dev.display())).stdout).split_whitespace().next().unwrap_or("").to_string()
    }
}

impl Drop for LoopDev {
    fn drop(&mut self) {
        let _ = Command::new("sh").args(["-c", &format!("umount {0} 2>/dev/null; losetup -d {0}", self.dev.display())]).status();
    }
}

/// One simulated instance: its root, its by-id dir; unmounts everything under root on drop.
pub struct Host {
    pub root: tempfile::TempDir,
    pub by_id: tempfile::TempDir,
    pub instance_id: String,
    pub zone: String,
    pub ip: String,
    pub public_ip: String,
    pub group: String,
}

impl Host {
    pub fn link(&self, volume_id: &str, dev: &Path) {
        let name = format!("nvme-Amazon_Elastic_Block_Store_{}", volume_id.replace('-', ""));
        std::os::unix::fs::symlink(dev, self.by_id.path().join(name)).expect("symlink device");
    }
    pub fn mount_point(&self, volume_id: &str) -> PathBuf {
        self.root.path().join(format!("mnt/master-{volume_id}"))
    }
    pub fn manifest(&self, etcd: &str) -> Option<String> {
        std::fs::read_to_string(self.root.path().join(format!("etc/kubernetes/manifests/etcd-{etcd}.manifest"))).ok()
    }
    pub fn unmount_all(&self) {
        let root = self.root.path().display().to_string();
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut mps: Vec<String> = info.lines().filter_map(|l| l.split(' ').nth(4)).filter(|m| m.starts_with(&root)).map(str::to_string).collect();
        mps.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in mps {
            let _ = Command::new("umount").arg(&m).status();
        }
    }
    pub fn is_mounted(&self, volume_id: &str) -> bool {
        let mp = self.mount_point(volume_id).display().to_string();
        std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default().lines().any(|l| l.split(' ').nth(4) == Some(mp.as_str()))
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.unmount_all();
    }
}

/// What a protokube run printed.
pub struct Run {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Run {
    pub fn last_line(&self) -> &str {
        self.stdout.lines().last().unwrap_or("")
    }
    /// `cloud_calls=N` from the pass log line.
    pub fn cloud_calls(&self) -> Option<u64> {
        self.stderr.lines().rev().find_map(|l| l.split("cloud_calls=").nth(1)).and_then(|r| r.split_whitespace().next()).and_then(|n| n.parse().ok())
    }
}

pub struct Cluster {
    pub name: String,
    pub state: tempfile::TempDir,
    pub moto_url: String,
    /// The completed spec the protokube configs in the state store are compiled from.
    spec: std::sync::Mutex<String>,
    /// Every group with a protokube config in the state store.
    groups: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// Where moto's record stood when the cluster was made: protokube's calls since are held
    /// against the control-plane policy when the cluster goes away ([`iam`]).
    iam_mark: iam::Mark,
    /// protokube was run (so the oracle must have seen calls of its role).
    ran: std::sync::atomic::AtomicBool,
    /// The state store protokube was pointed at instead of the spec's ([`Cluster::stored_in`]).
    stored_in: std::sync::Mutex<Option<String>>,
}

impl Cluster {
    /// Compile the completed spec into the protokube configs of its control-plane groups in the
    /// state store; `extra` is appended under `spec:` (indented by two spaces).
    pub fn new(moto_url: &str, name: &str, etcd: &[(&str, &[(&str, &str)])], extra: &str) -> Cluster {
        let state = tempfile::tempdir().expect("state dir");
        let mut y = format!(
            "apiVersion: kops.k8s.io/v1alpha2\nkind: Cluster\nmetadata:\n  name: {name}\nspec:\n  cloudProvider: aws\n  configBase: file://{}\n  etcdClusters:\n",
            state.path().display()
        );
        for (ec, members) in etcd {
            y.push_str(&format!("  - name: {ec}\n    version: 3.5.21\n    cpuRequest: 100m\n    memoryRequest: 100Mi\n    etcdMembers:\n"));
            for (m, ig) in members.iter() {
                y.push_str(&format!("    - name: {m}\n      instanceGroup: {ig}\n"));
            }
        }
        y.push_str(extra);
        // The cluster CAs (as `keelson pki init` makes them): protokube issues etcd certificates from them.
        let names: Vec<String> = etcd.iter().map(|(e, _)| e.to_string()).collect();
        base::pki::init_pki(state.path(), &names).expect("init cluster CAs");
        let c = Cluster {
            name: name.to_string(),
            state,
            moto_url: moto_url.to_string(),
            spec: Default::default(),
            groups: Default::default(),
            iam_mark: iam::Mark::now(),
            ran: Default::default(),
            stored_in: Default::default(),
        };
        c.set_spec(y);
        c
    }

    /// The completed spec the configs are compiled from.
    pub fn spec(&self) -> String {
        self.spec.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Compile `spec` into the protokube configs in the state store (what `keelson update cluster`
    /// writes; a running protokube re-reads them every `--spec-interval`).
    pub fn set_spec(&self, spec: String) {
        let known: Vec<String> = self.groups.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned().collect();
        let written = state::write_protokube_configs(self.state.path(), &spec, &known);
        *self.groups.lock().unwrap_or_else(|p| p.into_inner()) = written;
        *self.spec.lock().unwrap_or_else(|p| p.into_inner()) = spec;
    }

    /// Edit the completed spec and compile it again.
    pub fn edit_spec(&self, f: impl FnOnce(String) -> String) {
        self.set_spec(f(self.spec()));
    }

    /// The file holding `group`'s protokube config.
    pub fn protokube_config(&self, group: &str) -> PathBuf {
        self.state.path().join(keelson_api::protokube::state_key(group))
    }

    pub fn boot_config(&self, group: &str) -> PathBuf {
        // A group without an etcd member has its config too (the compiler writes one for every
        // control-plane group).
        if !self.groups.lock().unwrap_or_else(|p| p.into_inner()).contains(group) {
            self.groups.lock().unwrap_or_else(|p| p.into_inner()).insert(group.to_string());
            self.set_spec(self.spec());
        }
        let p = self.state.path().join(format!("bootconfig-{group}.yaml"));
        std::fs::write(
            &p,
            format!(
                "CloudProvider: aws\nConfigBase: file://{}\nClusterName: {}\nInstanceGroupName: {group}\nInstanceGroupRole: ControlPlane\nNodeupConfigHash: x\n",
                self.state.path().display(),
                self.name
            ),
        )
        .expect("write boot config");
        p
    }

    pub fn command(&self, host: &Host, extra: &[&str]) -> Command {
        // What Auto Scaling would have written: protokube names in DNS only an instance made for
        // its member's control-plane group.
        tag_made_for_group(&self.moto_url, &host.instance_id, &self.name, &host.group);
        let mut c = Command::new(env!("CARGO_BIN_EXE_protokube"));
        c.arg("--conf")
            .arg(self.boot_config(&host.group))
            .arg("--root")
            .arg(host.root.path())
            .arg("--by-id-dir")
            .arg(host.by_id.path())
            .args(["--endpoint-url", &self.moto_url, "--attach-timeout", "10", "--device-timeout", "5"])
            // The control plane's role (its calls are checked against that role's policy on drop).
            .env("AWS_ACCESS_KEY_ID", iam::CONTROL_PLANE_KEY)
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env_remove("AWS_ENDPOINT_URL")
            .env("PROTOKUBE_LOG", "info");
        self.ran.store(true, std::sync::atomic::Ordering::SeqCst);
        if !extra.contains(&"--imds-url") {
            c.args(["--instance-id", &host.instance_id, "--zone", &host.zone, "--region", crate::moto::REGION, "--internal-ip", &host.ip]);
        }
        c.args(extra);
        c
    }

    /// The IAM oracle over every AWS call protokube made for this cluster so far.
    pub fn iam_report(&self) -> testkit::moto_calls::Report {
        let stored_in = self.stored_in.lock().unwrap_or_else(|p| p.into_inner()).clone();
        self.iam_mark.check_stored_in(&self.moto_url, &self.spec(), crate::moto::REGION, stored_in.as_deref())
    }

    /// Say that protokube runs with its state store at `config_base` (a copy of the file store the
    /// test made): the control-plane policy the oracle holds its calls against is rendered for it.
    pub fn stored_in(&self, config_base: &str) {
        *self.stored_in.lock().unwrap_or_else(|p| p.into_inner()) = Some(config_base.to_string());
    }

    pub fn run(&self, host: &Host, extra: &[&str]) -> Run {
        let t = Instant::now();
        let out = self.command(host, extra).output().expect("run protokube");
        Run {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).to_string(),
            elapsed: t.elapsed(),
        }
    }
}

/// The IAM oracle's verdict when the cluster goes away (unless the test already failed): every call
/// protokube made must be allowed by the control-plane policy, and a run must have made some.
impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        let report = self.iam_report();
        eprintln!("{}", report.summary());
        assert!(report.clean(), "{report}");
        if self.ran.load(std::sync::atomic::Ordering::SeqCst) {
            assert!(report.by_roles > 0, "protokube ran but moto recorded no request signed by its role: the IAM oracle checked nothing\n{report}");
        }
    }
}

/// The kOps tags of member `member` of etcd cluster `etcd`.
pub fn etcd_tags(cluster: &str, etcd: &str, member: &str, all: &[&str]) -> Vec<(String, String)> {
    vec![
        ("KubernetesCluster".into(), cluster.into()),
        (format!("kubernetes.io/cluster/{cluster}"), "owned".into()),
        ("k8s.io/role/master".into(), "1".into()),
        ("k8s.io/role/control-plane".into(), "1".into()),
        (format!("k8s.io/etcd/{etcd}"), format!("{member}/{}", all.join(","))),
        ("Name".into(), format!("{member}.etcd-{etcd}.{cluster}")),
    ]
}

pub async fn create_volume(ec2: &aws_sdk_ec2::Client, zone: &str, tags: &[(String, String)]) -> String {
    let spec = TagSpecification::builder()
        .resource_type(ResourceType::Volume)
        .set_tags(Some(tags.iter().map(|(k, v)| Tag::builder().key(k).value(v).build()).collect()))
        .build();
    let v = ec2.create_volume().availability_zone(zone).size(1).tag_specifications(spec).send().await.expect("CreateVolume");
    v.volume_id().expect("volume id").to_string()
}

pub async fn public_ip(ec2: &aws_sdk_ec2::Client, id: &str) -> String {
    let r = ec2.describe_instances().instance_ids(id).send().await.expect("DescribeInstances");
    r.reservations()[0].instances()[0].public_ip_address().unwrap_or_default().to_string()
}

/// Tag instance `id` as an instance of the control-plane group `group` of `cluster` is: Auto
/// Scaling's `aws:autoscaling:groupName` (which AWS lets only Auto Scaling write; moto lets the test)
/// and the tags `keelson apply` puts on the group and Auto Scaling propagates (the cluster's and the
/// role's, from the product's own lists). A plain blocking request: callers may be inside a runtime.
pub fn tag_made_for_group(moto_url: &str, id: &str, cluster: &str, group: &str) {
    use std::io::{Read as _, Write as _};
    let asg = keelson_api::names::autoscaling_group_name(group, cluster);
    let mut tags: Vec<(String, String)> = vec![(cloud::volumes::ASG_TAG.to_string(), asg.clone())];
    tags.extend(cloud_resources::model::cluster_tags(cluster, &asg));
    tags.extend(cloud_resources::model::role_tags(keelson_api::Role::ControlPlane));
    let addr = moto_url.trim_start_matches("http://").trim_end_matches('/');
    let enc = |v: &str| -> String {
        v.bytes().map(|b| if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") }).collect()
    };
    let mut body = format!("Action=CreateTags&Version=2016-11-15&ResourceId.1={}", enc(id));
    for (i, (k, v)) in tags.iter().enumerate() {
        body.push_str(&format!("&Tag.{n}.Key={}&Tag.{n}.Value={}", enc(k), enc(v), n = i + 1));
    }
    let mut s = std::net::TcpStream::connect(addr).expect("moto");
    write!(
        s,
        "POST / HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded; charset=utf-8\r\n\
         Authorization: AWS4-HMAC-SHA256 Credential=test/20260101/{}/ec2/aws4_request, SignedHeaders=host, Signature=0\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        crate::moto::REGION,
        body.len()
    )
    .expect("CreateTags request");
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("CreateTags answer");
    assert!(answer.starts_with("HTTP/1.1 200") && answer.contains("CreateTagsResponse"), "CreateTags {id} {asg}: {answer}");
}

/// Launch an instance in `zone` (optionally in `subnet` with a fixed private IP); returns (id, ip).
pub async fn run_instance(ec2: &aws_sdk_ec2::Client, zone: &str, subnet: Option<&str>, ip: Option<&str>) -> (String, String) {
    let mut req = ec2.run_instances().image_id(AMI).min_count(1).max_count(1);
    match subnet {
        Some(s) => req = req.subnet_id(s),
        None => req = req.placement(aws_sdk_ec2::types::Placement::builder().availability_zone(zone).build()),
    }
    if let Some(ip) = ip {
        req = req.private_ip_address(ip);
    }
    let r = req.send().await.expect("RunInstances");
    let i = &r.instances()[0];
    (i.instance_id().expect("id").to_string(), i.private_ip_address().unwrap_or_default().to_string())
}

/// A root directory that is its own shared mount: mounts made under it propagate their unmount to
/// copies in mount namespaces created meanwhile (by `ip netns exec`, or by anything else running on
/// the machine), so a "dead" instance's volume is really free for its replacement.
pub fn shared_root() -> tempfile::TempDir {
    let root = tempfile::tempdir().expect("root");
    sh(&format!("mount --bind {0} {0} && mount --make-rshared {0}", root.path().display()));
    root
}

pub async fn host(ec2: &aws_sdk_ec2::Client, zone: &str, group: &str) -> Host {
    let (instance_id, ip) = run_instance(ec2, zone, None, None).await;
    let public_ip = public_ip(ec2, &instance_id).await;
    Host { public_ip, root: shared_root(), by_id: tempfile::tempdir().expect("by-id"), instance_id, zone: zone.to_string(), ip, group: group.to_string() }
}

pub async fn volume(ec2: &aws_sdk_ec2::Client, id: &str) -> aws_sdk_ec2::types::Volume {
    ec2.describe_volumes().volume_ids(id).send().await.expect("DescribeVolumes").volumes()[0].clone()
}

pub fn tag<'a>(v: &'a aws_sdk_ec2::types::Volume, key: &str) -> Option<&'a str> {
    v.tags().iter().find(|t| t.key() == Some(key)).and_then(|t| t.value())
}
