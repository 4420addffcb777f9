//! A 3-member etcd cluster run the way a control plane runs it: each member in its own network
//! namespace with a stand-in kubelet ([`Kubelet`]) starting etcd from the manifest protokube
//! writes, protokube in loop mode for each, moto for EC2 and S3 (the backup store), plain HTTP
//! (kOps' Legacy provider) so the test reaches every member's JSON gateway from the host — or TLS
//! ([`Fixture::start_tls`]: certificates protokube issues, reached with [`Fixture::client`]).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use base::etcd_backup::BackupStore;
use base64::Engine as _;

use crate::etcd_net::{etcdctl, logs, Kubelet, Net, TLS_DIR};
use crate::host::{self, create_volume, etcd_tags, Cluster, Host, LoopDev};
use crate::moto;

pub const BUCKET: &str = "keelson-etcd-backups";

pub struct Member {
    /// `a`, `b`, `c`: the etcd member is `etcd-<tag>`.
    pub tag: String,
    pub ns: String,
    pub ip: String,
    pub host: Host,
    pub kubelet: Option<Kubelet>,
    pub protokube: Option<Child>,
}

impl Drop for Member {
    fn drop(&mut self) {
        if let Some(mut p) = self.protokube.take() {
            let _ = p.kill();
            let _ = p.wait();
        }
        self.kubelet.take();
    }
}

pub fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// The etcd v3 JSON gateway of one member (plain HTTP: the Legacy provider), from the host.
pub fn gateway(ip: &str, path: &str, body: serde_json::Value) -> serde_json::Value {
    let http = reqwest::blocking::Client::builder().timeout(Duration::from_secs(10)).no_proxy().build().expect("client");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match http.post(format!("http://{ip}:4001{path}")).body(body.to_string()).send().and_then(|r| r.error_for_status()).and_then(|r| r.text()) {
            Ok(v) => return serde_json::from_str(&v).expect("etcd answers JSON"),
            Err(e) if Instant::now() < deadline => {
                eprintln!("etcd {ip}{path}: {e}; retrying");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => panic!("etcd {ip}{path}: {e}"),
        }
    }
}

/// How many keys start with `key/`.
pub fn count_keys(ip: &str) -> i64 {
    let v = gateway(ip, "/v3/kv/range", serde_json::json!({ "key": b64("key/"), "range_end": b64("key0"), "count_only": true }));
    v["count"].as_str().and_then(|c| c.parse().ok()).or_else(|| v["count"].as_i64()).unwrap_or(0)
}

pub fn status(ip: &str) -> serde_json::Value {
    gateway(ip, "/v3/maintenance/status", serde_json::json!({}))
}

pub fn keelson_binary() -> PathBuf {
    let p = Path::new(env!("CARGO_BIN_EXE_protokube")).with_file_name("keelson");
    assert!(p.exists(), "this test needs the keelson binary at {} (build the workspace: cargo build --workspace)", p.display());
    p
}

pub fn wait_for<T>(what: &str, within: Duration, mut f: impl FnMut() -> Option<T>, diag: impl Fn() -> String) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {within:?}\n{}", diag());
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The running cluster; everything is stopped and removed on drop.
pub struct Fixture {
    pub rt: tokio::runtime::Runtime,
    pub moto_url: String,
    pub ec2: aws_sdk_ec2::Client,
    pub s3: aws_sdk_s3::Client,
    pub backup_url: String,
    pub store: BackupStore,
    pub c: Cluster,
    pub logdir: tempfile::TempDir,
    pub members: Vec<Member>,
    pub vols: Vec<String>,
    etcdctl_path: String,
    devs: Vec<LoopDev>,
    tls: bool,
    // (last: the namespaces go after the processes in them)
    pub net: Net,
}

impl Fixture {
    /// `name` is the cluster, `etcd_spec` lines added to etcd cluster main (indented 4 spaces),
    /// `binaries` the etcd builds by version ([`Kubelet::with_binaries`]), `env` test hooks for
    /// every protokube.
    pub fn start(moto_url: &str, variant: u8, name: &str, etcd_spec: &str, binaries: BTreeMap<String, PathBuf>, env: &[(&str, String)]) -> Fixture {
        Fixture::launch(moto_url, variant, name, etcd_spec, binaries, env, false)
    }

    /// The same with TLS (kOps' default Manager provider): protokube issues every certificate
    /// from the state store's CAs; reach a member with [`Fixture::client`].
    pub fn start_tls(moto_url: &str, variant: u8, name: &str, env: &[(&str, String)]) -> Fixture {
        Fixture::launch(moto_url, variant, name, "", BTreeMap::new(), env, true)
    }

    fn launch(moto_url: &str, variant: u8, name: &str, etcd_spec: &str, binaries: BTreeMap<String, PathBuf>, env: &[(&str, String)], tls: bool) -> Fixture {
        let logdir = tempfile::tempdir().expect("log dir");
        let net = Net::new(variant);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let conf = rt.block_on(moto::sdk(moto_url));
        let ec2 = aws_sdk_ec2::Client::new(&conf);
        let s3 = aws_sdk_s3::Client::from_conf(aws_sdk_s3::config::Builder::from(&conf).force_path_style(true).build());
        rt.block_on(s3.create_bucket().bucket(BUCKET).send()).expect("CreateBucket");
        let backup_url = format!("s3://{BUCKET}/{name}/backups/etcd/main");
        let store =
            BackupStore::new(base::StateStore::open_with_s3(&backup_url.parse().expect("url"), Some(s3.clone()), Duration::from_secs(10)).expect("store"));
        let c = Cluster::new(moto_url, name, &[("main", &[("a", "cp-a"), ("b", "cp-b"), ("c", "cp-c")])], "");
        c.edit_spec(|text| {
            text.replace(
                "  - name: main\n",
                &format!("  - name: main\n{}    backups:\n      backupStore: {backup_url}\n{etcd_spec}", if tls { "" } else { "    provider: Legacy\n" }),
            )
        });
        *TLS_DIR.lock().unwrap_or_else(|p| p.into_inner()) = None;
        let all = ["a", "b", "c"];
        let subnet_id = rt.block_on(async {
            let vpc = ec2.create_vpc().cidr_block("10.231.0.0/16").send().await.expect("CreateVpc");
            let vpc = vpc.vpc().and_then(|v| v.vpc_id()).expect("vpc id").to_string();
            let sn =
                ec2.create_subnet().vpc_id(vpc).cidr_block(format!("{}.0/24", net.subnet)).availability_zone("us-east-1a").send().await.expect("CreateSubnet");
            sn.subnet().and_then(|s| s.subnet_id()).expect("subnet id").to_string()
        });
        // (room for the data moved aside and the restored data: etcd preallocates 64 MB WAL files)
        let devs: Vec<LoopDev> = (0..3).map(|_| LoopDev::new(512)).collect();
        let vols: Vec<String> = all.iter().map(|mbr| rt.block_on(create_volume(&ec2, "us-east-1a", &etcd_tags(name, "main", mbr, &all)))).collect();
        let etcdctl_path = String::from_utf8_lossy(&host::sh("command -v etcdctl").stdout).trim().to_string();
        let mut f =
            Fixture { rt, moto_url: moto_url.to_string(), ec2, s3, backup_url, store, c, logdir, members: Vec::new(), vols, etcdctl_path, devs, net, tls };
        for (i, (tag, group)) in [("a", "cp-a"), ("b", "cp-b"), ("c", "cp-c")].into_iter().enumerate() {
            let (ns, ip) = f.net.namespace(tag, 21 + i as u8);
            let (instance_id, got) = f.rt.block_on(host::run_instance(&f.ec2, "us-east-1a", Some(&subnet_id), Some(&ip)));
            assert_eq!(got, ip);
            let h = Host {
                root: host::shared_root(),
                by_id: tempfile::tempdir().expect("by-id"),
                instance_id,
                zone: "us-east-1a".into(),
                ip: ip.clone(),
                public_ip: String::new(),
                group: group.into(),
            };
            for (v, d) in f.vols.iter().zip(&f.devs) {
                h.link(v, &d.dev);
            }
            let kubelet = Kubelet::with_binaries(&ns, h.root.path(), &f.logdir.path().join(format!("etcd-{tag}.log")), binaries.clone());
            f.members.push(Member { tag: tag.to_string(), ns, ip, host: h, kubelet: Some(kubelet), protokube: None });
            f.members[i].protokube = Some(f.protokube(i, tag, env));
        }
        let scheme = if tls { "https" } else { "http" };
        // (etcdctl authenticates with the client certificate protokube issues on member a)
        *TLS_DIR.lock().unwrap_or_else(|p| p.into_inner()) = tls.then(|| f.pki_dir(0).display().to_string());
        let health = etcdctl(&f.members[0].ns, &format!("{scheme}://{}:4001", f.members[0].ip), &["endpoint", "health"], Duration::from_secs(90));
        assert!(health.contains("is healthy"), "{health}\n{}", f.diag());
        f
    }

    /// Member `i`'s etcd TLS material (`ca.crt`, `client.crt`, `client.key`, written by protokube).
    pub fn pki_dir(&self, i: usize) -> PathBuf {
        self.members[i].host.root.path().join("etc/kubernetes/pki/etcd/main")
    }

    /// A client for member `i`'s etcd (its name pinned to its address; with TLS, protokube's client
    /// certificate on that member), each request bounded by `timeout`.
    pub fn client(&self, i: usize, timeout: Duration) -> protokube::etcd::Client {
        let mb = &self.members[i];
        let host = format!("etcd-{}.internal.{}", mb.tag, self.c.name);
        let addr = std::net::SocketAddr::new(mb.ip.parse().expect("member ip"), 4001);
        let (scheme, pki) = if self.tls { ("https", Some(self.pki_dir(i))) } else { ("http", None) };
        protokube::etcd::Client::new(scheme, &host, addr, pki.as_deref(), timeout).expect("etcd client")
    }

    /// Start protokube in loop mode (1 s passes) for member `i`; `env` adds test hooks.
    pub fn protokube(&self, i: usize, tag: &str, env: &[(&str, String)]) -> Child {
        let mb = &self.members[i];
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.logdir.path().join(format!("protokube-{tag}.log"))).expect("log");
        let hosts = Net::hosts_file(&mb.ns);
        let mut cmd = self.c.command(
            &mb.host,
            &[
                "--hosts-file",
                &hosts,
                "--interval",
                "1",
                "--backup-poll",
                "1",
                "--spec-interval",
                "1",
                "--metrics-addr",
                "off",
                "--no-addons",
                "--join-listen",
                "off",
                "--etcd-restore-tool",
                &self.etcdctl_path,
                "--stop-timeout",
                "20",
            ],
        );
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.stdout(log.try_clone().expect("log")).stderr(log).stdin(Stdio::null()).spawn().expect("start protokube")
    }

    /// Stop member `i`'s protokube and start it again (as `tag`, with `env`).
    pub fn restart_protokube(&mut self, i: usize, tag: &str, env: &[(&str, String)]) {
        if let Some(mut p) = self.members[i].protokube.take() {
            let _ = p.kill();
            let _ = p.wait();
        }
        self.members[i].protokube = Some(self.protokube(i, tag, env));
    }

    /// Edit the completed spec and compile it into the protokube configs in the state store again
    /// (protokube re-reads them every second).
    pub fn edit_spec(&self, f: impl FnOnce(String) -> String) {
        self.c.edit_spec(f);
    }

    /// The last lines of every etcd and protokube log.
    pub fn diag(&self) -> String {
        logs(self.logdir.path())
    }

    /// Everything every protokube logged.
    pub fn protokube_logs(&self) -> String {
        let mut out = String::new();
        for e in std::fs::read_dir(self.logdir.path()).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().starts_with("protokube-") {
                out.push_str(&std::fs::read_to_string(e.path()).unwrap_or_default());
            }
        }
        out
    }

    pub fn ips(&self) -> Vec<String> {
        self.members.iter().map(|m| m.ip.clone()).collect()
    }

    /// A copy of examples/ha.yaml whose state store is this cluster's, for `keelson -f`.
    pub fn spec_file(&self) -> PathBuf {
        let file = self.logdir.path().join("cluster.yaml");
        let example = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/ha.yaml")).expect("examples/ha.yaml");
        std::fs::write(
            &file,
            example.replace("configBase: s3://acme-keelson-state/ha.k8s.example.com", &format!("configBase: file://{}", self.c.state.path().display())),
        )
        .expect("spec file");
        file
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.members.clear();
    }
}
