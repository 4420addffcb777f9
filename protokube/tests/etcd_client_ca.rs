//! One client CA per etcd cluster, held against a real etcd (Debian's etcd-server on 127.0.0.1): a
//! member of `main` started with the files protokube issues accepts protokube's `main` client and
//! the API server's client certificate, and refuses every key of the `events` cluster (its client,
//! its serving certificate, which etcd's gateway also presents as a client) and a client the
//! shared root signed directly. A member of an older Keelson (which trusted the root) still
//! accepts the new `main` client, whose certificate carries its intermediate: a rolling update
//! from such a cluster can add members.
//! Needs `etcd` (Debian package etcd-server; scripts/test installs it); fails loudly without it.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base::pki::{self, CertSpec, Keypair};
use protokube::config::{EtcdCluster, EtcdMember, Ports};
use protokube::etcd;

const HOST: &str = "etcd-a.internal.example.com";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

fn cluster(name: &str) -> EtcdCluster {
    EtcdCluster {
        name: name.into(),
        members: vec![EtcdMember { name: "a".into(), instance_group: "cp-a".into() }],
        ports: Ports { peer: 2380, client: 4001 },
        image: "registry.k8s.io/etcd:3.5.21-0".into(),
        tls: true,
        client_cert_auth: true,
        cpu_request: None,
        memory_request: None,
        heartbeat_ms: None,
        election_ms: None,
        version: "3.5.21".into(),
        backup_store: format!("file:///b/{name}"),
        backup_interval: Duration::from_secs(900),
        backup_retention_days: 90,
        backup_hourly_retention: keelson_api::etcd_manager::DEFAULT_HOURLY_RETENTION,
    }
}

fn ca(state: &Path, name: &str) -> Keypair {
    let bytes = std::fs::read(state.join(format!("pki/private/{name}/keyset.yaml"))).expect("keyset");
    pki::parse_private_keyset(name, &bytes).expect("parse")
}

/// One TLS member on loopback serving `server.crt|key` from `pki` and trusting `trust` for
/// clients; killed on drop.
struct Etcd {
    child: Child,
    addr: std::net::SocketAddr,
    dir: tempfile::TempDir,
}

impl Etcd {
    fn start(pki: &Path, trust: &Path) -> Etcd {
        let ok = Command::new("sh").args(["-c", "command -v etcd"]).output().map(|o| o.status.success()).unwrap_or(false);
        assert!(ok, "this test needs `etcd` (Debian package etcd-server; scripts/test installs it)");
        let dir = tempfile::tempdir().expect("tempdir");
        let (client, peer) = (free_port(), free_port());
        let c = format!("https://127.0.0.1:{client}");
        let p = format!("http://127.0.0.1:{peer}");
        let child = Command::new("etcd")
            .args(["--name", "etcd-a", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &c, "--advertise-client-urls", &c, "--listen-peer-urls", &p, "--initial-advertise-peer-urls", &p])
            .args(["--initial-cluster", &format!("etcd-a={p}")])
            .arg(format!("--cert-file={}", pki.join("server.crt").display()))
            .arg(format!("--key-file={}", pki.join("server.key").display()))
            .arg(format!("--trusted-ca-file={}", trust.display()))
            .arg("--client-cert-auth=true")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("etcd.log")).expect("log"))
            .spawn()
            .expect("start etcd");
        Etcd { child, addr: ([127, 0, 0, 1], client).into(), dir }
    }

    /// Ask the member's status as the client whose `client.crt|key` and `ca.crt` are in `identity`.
    async fn status_as(&self, identity: &Path) -> Result<(), String> {
        let c = etcd::Client::new("https", HOST, self.addr, Some(identity), Duration::from_secs(5)).map_err(|e| e.to_string())?;
        c.status().await.map(|_| ()).map_err(|e| e.to_string())
    }

    /// Wait until the member serves `identity` (one that must be accepted).
    async fn wait_serving(&self, identity: &Path) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.status_as(identity).await {
                Ok(()) => return,
                Err(e) => {
                    let log = std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default();
                    let tail: Vec<&str> = log.lines().rev().take(15).collect();
                    assert!(Instant::now() < deadline, "etcd did not serve within 30 s: {e}\n{}", tail.join("\n"));
                }
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client directory as [`etcd::Client`] reads it: the root to verify the server, and `cert`.
fn identity(dir: &Path, root: &Path, cert: &Keypair) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).expect("mkdir");
    std::fs::copy(root, dir.join("ca.crt")).expect("ca");
    std::fs::write(dir.join("client.crt"), &cert.cert_pem).expect("crt");
    std::fs::write(dir.join("client.key"), &cert.key_pem).expect("key");
    dir.to_path_buf()
}

fn pair(dir: &Path, name: &str) -> Keypair {
    let read = |f: String| std::fs::read_to_string(dir.join(f)).expect("read");
    Keypair { cert_pem: read(format!("{name}.crt")), key_pem: read(format!("{name}.key")) }
}

#[tokio::test]
async fn a_member_accepts_its_own_clients_and_the_api_server_never_another_clusters() {
    let state = tempfile::tempdir().expect("state");
    let root = tempfile::tempdir().expect("root");
    let ids = tempfile::tempdir().expect("identities");
    pki::init_pki(state.path(), &["main".into(), "events".into()]).expect("pki");
    let store = base::StateStore::open(&format!("file://{}", state.path().display()).parse().expect("url"), Duration::from_secs(5)).expect("store");
    let (main_dir, _) = protokube::pki::ensure(root.path(), &store, &cluster("main"), "etcd-a", HOST, "127.0.0.1").await.expect("main");
    let (events_dir, _) = protokube::pki::ensure(root.path(), &store, &cluster("events"), "etcd-events-a", HOST, "127.0.0.1").await.expect("events");
    let root_ca = main_dir.join("ca.crt");

    // The API server's client certificate, as nodeup issues it.
    let apiserver = pki::issue(pki::ETCD_APISERVER_CLIENTS_CA, &ca(state.path(), pki::ETCD_APISERVER_CLIENTS_CA), &CertSpec::client("kube-apiserver", &[]))
        .expect("apiserver");
    // A client the root signed directly (what every client was before).
    let legacy = pki::issue(pki::ETCD_CLIENTS_CA, &ca(state.path(), pki::ETCD_CLIENTS_CA), &CertSpec::client("protokube", &[])).expect("legacy");

    let main_client = identity(&ids.path().join("main"), &root_ca, &pair(&main_dir, "client"));
    let member = Etcd::start(&main_dir, &main_dir.join("clients-ca.crt"));
    member.wait_serving(&main_client).await;
    member.status_as(&identity(&ids.path().join("apiserver"), &root_ca, &apiserver)).await.expect("the API server's client is accepted");
    for (who, cert) in [
        ("events' protokube client", pair(&events_dir, "client")),
        ("events' serving certificate", pair(&events_dir, "server")),
        ("a client the root signed", legacy.clone()),
    ] {
        let dir = identity(&ids.path().join(who.replace(' ', "-")), &root_ca, &cert);
        let refused = member.status_as(&dir).await;
        assert!(refused.is_err(), "main's member accepted {who}");
    }
    drop(member);

    // A member of an older Keelson: a serving certificate from the root, the root trusted for
    // clients. The new main client (leaf + intermediate) and the API server's are accepted.
    let old = ids.path().join("old-member");
    std::fs::create_dir_all(&old).expect("mkdir");
    let server = pki::issue(
        pki::ETCD_CLIENTS_CA,
        &ca(state.path(), pki::ETCD_CLIENTS_CA),
        &CertSpec { cn: "etcd-a".into(), orgs: vec![], dns: vec![HOST.into()], ips: vec!["127.0.0.1".parse().expect("ip")], usage: pki::Usage::ClientServer },
    )
    .expect("server");
    std::fs::write(old.join("server.crt"), &server.cert_pem).expect("crt");
    std::fs::write(old.join("server.key"), &server.key_pem).expect("key");
    let old_member = Etcd::start(&old, &root_ca);
    old_member.wait_serving(&main_client).await;
}
