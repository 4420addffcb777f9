//! Node join by GCE identity, over 127.0.0.1 against the harness's Compute emulator and metadata
//! servers (identity tokens signed by a test key whose JWK set the server fetches): a worker of a
//! node MIG gets certificates for its instance name; every refusal is shown on the forgery it
//! exists for, with its own reason. No root, no cloud.

#[path = "support/state.rs"]
mod state;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base::node_join::{self, JoinRequest};
use base::node_join_gce::{audience, authorization};
use base::pki;
use keelson_api::names::gce_instance_group_manager_name;
use nodeup::join::challenge::Responder;
use protokube::node_join::gce::{Admitted, GceAuthority, GceAuthorityConfig};
use protokube::node_join::Refusal;
use serde_json::{json, Value};
use testkit::gce_compute::{Config, GceCompute, InstanceView};
use testkit::gce_metadata::{self, InstanceFacts, Signer};
use testkit::httpd::{Body, Request, Server};

const PROJECT: &str = "acme-prod";
const NUMBER: &str = "123456789012";
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

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

/// The project: node groups `nodes` and `nodes-other`, control plane `control-plane-b` (a MIG each
/// in zone b, named as the compiler names them), another cluster's node MIG, the state store with
/// this cluster's instance groups, Google's key (its JWK set served), the server's own metadata
/// server (its service-account token), the cluster CA.
struct World {
    c: GceCompute,
    _compute_server: Server,
    compute_url: String,
    google: Arc<Signer>,
    _jwks: Server,
    jwks_url: String,
    _own_meta: Server,
    own_meta: String,
    state: tempfile::TempDir,
    store: base::StateStore,
    ca: pki::Keypair,
    challenge_port: u16,
    nodes_api: Server,
}

fn template(c: &GceCompute, name: &str, group: &str) {
    call(
        c,
        "POST",
        "/global/instanceTemplates",
        json!({"name": name, "properties": {"machineType": "e2-medium",
            "disks": [{"boot": true, "autoDelete": true, "initializeParams": {"diskSizeGb": "20"}}],
            "networkInterfaces": [{"network": "global/networks/net", "subnetwork": "regions/europe-west1/subnetworks/sub"}],
            "metadata": {"items": [{"key": "cluster-name", "value": CLUSTER}, {"key": "kops-k8s-io-instance-group-name", "value": group}]}}}),
    );
}

fn mig(c: &GceCompute, name: &str, base: &str, template: &str) {
    call(
        c,
        "POST",
        &format!("/zones/{ZB}/instanceGroupManagers"),
        json!({"name": name, "baseInstanceName": base, "instanceTemplate": format!("global/instanceTemplates/{template}"), "targetSize": 1}),
    );
}

impl World {
    fn new() -> World {
        let c = GceCompute::new(Config { operation_delay: Duration::from_millis(20), boot_delay: Some(Duration::from_millis(10)), ..Config::example() });
        let compute_server = c.start();
        call(&c, "POST", "/global/networks", json!({"name": "net", "autoCreateSubnetworks": false}));
        call(&c, "POST", "/regions/europe-west1/subnetworks", json!({"name": "sub", "network": "global/networks/net", "ipCidrRange": "10.0.16.0/20"}));
        for (t, group) in [("nodes-t", "nodes"), ("nodes-other-t", "nodes-other"), ("cp-b-t", "control-plane-b")] {
            template(&c, t, group);
        }
        mig(&c, &gce_instance_group_manager_name(ZB, "nodes", CLUSTER), "nodes", "nodes-t");
        mig(&c, &gce_instance_group_manager_name(ZB, "nodes-other", CLUSTER), "nodes-other", "nodes-other-t");
        mig(&c, &gce_instance_group_manager_name(ZB, "control-plane-b", CLUSTER), "control-plane-b", "cp-b-t");
        // Another cluster's node MIG, from a template that even names a group of this cluster.
        mig(&c, &gce_instance_group_manager_name(ZB, "nodes", "other.example.com"), "nodes", "nodes-t");

        let google = Arc::new(Signer::generate("google-1").expect("key"));
        let jwks = gce_metadata::start_with_identity(&InstanceFacts::example(), google.clone());
        let mut own = InstanceFacts::example().values();
        own.insert("instance/service-accounts/default/token".into(), json!({"access_token": "tok", "expires_in": 3599, "token_type": "Bearer"}).to_string());
        let own_meta = Server::start(Arc::new(move |req: &Request| gce_metadata::answer(&own, req)));

        let state = tempfile::tempdir().expect("state");
        for (name, role) in [("nodes", "Node"), ("nodes-other", "Node"), ("control-plane-b", "ControlPlane")] {
            let path = state.path().join(format!("instancegroup/{name}"));
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            let ig = format!("apiVersion: kops.k8s.io/v1alpha2\nkind: InstanceGroup\nmetadata:\n  name: {name}\n  labels:\n    kops.k8s.io/cluster: {CLUSTER}\nspec:\n  role: {role}\n  minSize: 1\n  maxSize: 1\n  machineType: e2-medium\n  image: ubuntu\n  zones: [{ZB}]\n");
            std::fs::write(path, ig).expect("write ig");
        }
        let base: base::ConfigBase = format!("file://{}", state.path().display()).parse().expect("config base");
        let store = base::StateStore::open(&base, Duration::from_secs(10)).expect("store");
        World {
            compute_url: compute_server.url("compute/v1"),
            jwks_url: jwks.url(gce_metadata::JWKS_PATH),
            own_meta: own_meta.addr().to_string(),
            c,
            _compute_server: compute_server,
            google,
            _jwks: jwks,
            _own_meta: own_meta,
            state,
            store,
            ca: pki::create_ca("kubernetes-ca").expect("ca"),
            challenge_port: free_port(),
            // The Kubernetes API of a cluster with no Node of a joining worker's name.
            nodes_api: Server::start(Arc::new(|_: &Request| {
                testkit::httpd::Response::text(404, r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}"#)
                    .header("Content-Type", "application/json")
            })),
        }
    }

    fn authority(&self) -> GceAuthority {
        let md = base::gce_metadata::GceMetadata::new(Some(&self.own_meta), Duration::from_secs(5)).expect("metadata client");
        let api = cloud::gce::GoogleApi::new(cloud::gce::TokenSource::new(md), Duration::from_secs(20)).expect("api");
        let port = self.challenge_port;
        GceAuthority::new(GceAuthorityConfig {
            cluster: CLUSTER.into(),
            ca: self.ca.clone(),
            project: PROJECT.into(),
            region: "europe-west1".into(),
            compute: cloud::gce::ComputeReader::new(api, &self.compute_url, PROJECT),
            store: self.store.clone(),
            jwks_url: self.jwks_url.clone(),
            nodes: {
                let config = kube::Config::new(format!("http://{}", self.nodes_api.addr()).parse().expect("url"));
                protokube::node_join::NodeNames::with_client(kube::Client::try_from(config).expect("client"))
            },
            challenge_addr: Arc::new(move |_ip| std::net::SocketAddr::from(([127, 0, 0, 1], port))),
        })
        .expect("authority")
    }

    /// The running instance of the MIG of `group` of `cluster` (waits, bounded, for it to run).
    fn mig_instance(&self, group: &str, cluster: &str) -> InstanceView {
        let mig = gce_instance_group_manager_name(ZB, group, cluster);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(i) = self.c.instances().into_iter().find(|i| i.mig.as_deref() == Some(mig.as_str()) && i.status == "RUNNING") {
                return i;
            }
            assert!(Instant::now() < deadline, "no running instance of {mig}: {:?}", self.c.instances());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn running(&self, name: &str) -> InstanceView {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(i) = self.c.instance(ZB, name).filter(|i| i.status == "RUNNING") {
                return i;
            }
            assert!(Instant::now() < deadline, "{name} does not run");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What the instance's metadata server says of it (the claims its tokens carry).
    fn facts(&self, i: &InstanceView) -> InstanceFacts {
        InstanceFacts {
            project: PROJECT.into(),
            numeric_project: NUMBER.into(),
            zone: i.zone.clone(),
            name: i.name.clone(),
            id: i.id.clone(),
            internal_ip: i.network_ip.clone(),
            hostname: format!("{}.{}.c.{PROJECT}.internal", i.name, i.zone),
            attributes: BTreeMap::new(),
            ..InstanceFacts::example()
        }
    }

    /// A join request body of `facts`' instance asking for `node_name`, and its keys.
    fn request_for(&self, facts: &InstanceFacts, node_name: &str) -> (Vec<u8>, BTreeMap<String, String>) {
        let mut keys = BTreeMap::new();
        let mut csrs = BTreeMap::new();
        for name in [node_join::CERT_KUBELET, node_join::CERT_KUBE_PROXY] {
            let (key, csr) = pki::csr(name).expect("csr");
            keys.insert(name.to_string(), key);
            csrs.insert(name.to_string(), csr);
        }
        let body = serde_json::to_vec(&JoinRequest { node_name: node_name.into(), instance_id: facts.id.clone(), csrs }).expect("json");
        (body, keys)
    }

    fn token(&self, facts: &InstanceFacts, body: &[u8]) -> String {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs();
        authorization(&self.google.identity_token(facts, &audience(body), true, now))
    }

    fn answering(&self, keys: &BTreeMap<String, String>, body: &[u8]) -> Responder {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.challenge_port));
        Responder::start(addr, &keys[node_join::CERT_KUBELET], "node", base::sha256_hex(body)).expect("challenge responder")
    }

    /// One join of `facts`' instance, its token made for its own body.
    async fn join(&self, a: &GceAuthority, facts: &InstanceFacts) -> Result<Admitted, Refusal> {
        let (body, keys) = self.request_for(facts, &facts.name);
        let auth = self.token(facts, &body);
        let _answering = self.answering(&keys, &body);
        a.admit(&auth, &body).await
    }
}

fn subject_of(cert_pem: &str) -> String {
    let der = pem::parse(cert_pem).expect("pem");
    let (_, cert) = x509_parser::parse_x509_certificate(der.contents()).expect("x509");
    assert_eq!(cert.issuer().to_string(), "CN=kubernetes-ca");
    cert.subject().to_string()
}

fn reason(r: Result<Admitted, Refusal>) -> &'static str {
    match r {
        Ok(a) => panic!("admitted: {:?}", a.group),
        Err(e) => {
            assert_eq!(e.status, 403, "{e}");
            e.reason
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_mig_instance_gets_certificates_for_its_instance_name_whatever_it_asks() {
    let w = World::new();
    let a = w.authority();
    let node = w.mig_instance("nodes", CLUSTER);
    let facts = w.facts(&node);
    // It asks for another node's name: the certificates are for its own instance name.
    let (body, keys) = w.request_for(&facts, "control-plane-b-abcd");
    let auth = w.token(&facts, &body);
    let answering = w.answering(&keys, &body);
    let admitted = a.admit(&auth, &body).await.expect("a node MIG's running instance joins");
    drop(answering);
    assert_eq!((admitted.response.node_name.as_str(), admitted.group.as_str()), (node.name.as_str(), "nodes"));
    assert_eq!(subject_of(&admitted.response.certs[node_join::CERT_KUBELET]), format!("O=system:nodes, CN=system:node:{}", node.name));
    assert_eq!(subject_of(&admitted.response.certs[node_join::CERT_KUBE_PROXY]), "CN=system:kube-proxy");

    // Its token carries that body only: with another body (another key, another name) it fails.
    let (other, other_keys) = w.request_for(&facts, &node.name);
    let _answering = w.answering(&other_keys, &other);
    assert_eq!(reason(a.admit(&auth, &other).await), "audience");
    // An AWS proof is not what this server takes.
    let err = a.admit("x-aws-sts e30=", &body).await.expect_err("another scheme");
    assert_eq!((err.status.as_u16(), err.reason), (401, "unauthenticated"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_of_another_project_or_region_are_refused() {
    let w = World::new();
    let a = w.authority();
    let facts = w.facts(&w.mig_instance("nodes", CLUSTER));
    w.join(&a, &facts).await.expect("the genuine claims join");
    // Signed by Google, for an instance of the same name in another project, or in another region.
    assert_eq!(reason(w.join(&a, &InstanceFacts { project: "evil-prod".into(), ..facts.clone() }).await), "project");
    assert_eq!(reason(w.join(&a, &InstanceFacts { zone: "europe-west4-a".into(), ..facts.clone() }).await), "zone");
    // Signed by someone else under Google's key id.
    let attacker = Signer::generate("google-1").expect("key");
    let (body, _) = w.request_for(&facts, &facts.name);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs();
    let forged = authorization(&attacker.identity_token(&facts, &audience(&body), true, now));
    assert_eq!(reason(a.admit(&forged, &body).await), "token");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_instances_old_token_and_a_stopped_instance_are_refused() {
    let w = World::new();
    let a = w.authority();
    let node = w.mig_instance("nodes", CLUSTER);
    let old = w.facts(&node);
    // A token taken before the MIG recreates the instance (same name, new id).
    let (body, keys) = w.request_for(&old, &old.name);
    let stale_auth = w.token(&old, &body);
    let mig = gce_instance_group_manager_name(ZB, "nodes", CLUSTER);
    call(
        &w.c,
        "POST",
        &format!("/zones/{ZB}/instanceGroupManagers/{mig}/recreateInstances"),
        json!({"instances": [format!("zones/{ZB}/instances/{}", node.name)]}),
    );
    let new = w.running(&node.name);
    assert_ne!(new.id, node.id, "recreated under its name with a new id");
    let answering = w.answering(&keys, &body);
    assert_eq!(reason(a.admit(&stale_auth, &body).await), "instance-id");
    drop(answering);
    // The new instance's own token joins.
    w.join(&a, &w.facts(&new)).await.expect("the recreated instance joins with its own token");

    // Stopped: refused (the MIG leaves a STOPPED instance alone).
    w.c.set_instance_status(ZB, &new.name, "STOPPED").expect("stop");
    assert_eq!(reason(w.join(&a, &w.facts(&new)).await), "instance");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_instances_of_the_clusters_node_migs_join() {
    let w = World::new();
    let a = w.authority();
    // A bare instance made from the node template itself (its template names group `nodes`).
    call(&w.c, "POST", &format!("/zones/{ZB}/instances?sourceInstanceTemplate=global/instanceTemplates/nodes-t"), json!({"name": "bare-1"}));
    let bare = w.running("bare-1");
    assert_eq!(bare.metadata.get("kops-k8s-io-instance-group-name").map(String::as_str), Some("nodes"));
    assert_eq!(reason(w.join(&a, &w.facts(&bare)).await), "mig");
    // It writes itself a `created-by` naming the cluster's node MIG: the MIG does not list it.
    let mig = gce_instance_group_manager_name(ZB, "nodes", CLUSTER);
    let current = call(&w.c, "GET", &format!("/zones/{ZB}/instances/bare-1"), json!({}));
    let mut items = current["metadata"]["items"].as_array().cloned().unwrap_or_default();
    items.push(json!({"key": "created-by", "value": format!("projects/{NUMBER}/zones/{ZB}/instanceGroupManagers/{mig}")}));
    call(&w.c, "POST", &format!("/zones/{ZB}/instances/bare-1/setMetadata"), json!({"fingerprint": current["metadata"]["fingerprint"], "items": items}));
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(reason(w.join(&a, &w.facts(&bare)).await), "managed");

    // Another cluster's node MIG (same group name, same template).
    assert_eq!(reason(w.join(&a, &w.facts(&w.mig_instance("nodes", "other.example.com"))).await), "mig");
    // This cluster's control-plane MIG.
    assert_eq!(reason(w.join(&a, &w.facts(&w.mig_instance("control-plane-b", CLUSTER))).await), "control-plane");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_group_is_the_templates_not_what_the_instance_writes_of_itself() {
    let w = World::new();
    let a = w.authority();
    let node = w.mig_instance("nodes", CLUSTER);
    // The instance rewrites its own metadata to claim another group.
    let current = call(&w.c, "GET", &format!("/zones/{ZB}/instances/{}", node.name), json!({}));
    let items: Vec<Value> = current["metadata"]["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| if i["key"] == "kops-k8s-io-instance-group-name" { json!({"key": i["key"], "value": "nodes-other"}) } else { i.clone() })
        .collect();
    call(&w.c, "POST", &format!("/zones/{ZB}/instances/{}/setMetadata", node.name), json!({"fingerprint": current["metadata"]["fingerprint"], "items": items}));
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(w.c.instance(ZB, &node.name).expect("instance").metadata["kops-k8s-io-instance-group-name"], "nodes-other");
    let admitted = w.join(&a, &w.facts(&node)).await.expect("joins");
    assert_eq!(admitted.group, "nodes", "the template's group wins");

    // A MIG of group `nodes` whose template names another group is refused.
    let mig = gce_instance_group_manager_name(ZB, "nodes", CLUSTER);
    call(&w.c, "POST", &format!("/zones/{ZB}/instanceGroupManagers/{mig}/setInstanceTemplate"), json!({"instanceTemplate": "global/instanceTemplates/cp-b-t"}));
    call(
        &w.c,
        "POST",
        &format!("/zones/{ZB}/instanceGroupManagers/{mig}/recreateInstances"),
        json!({"instances": [format!("zones/{ZB}/instances/{}", node.name)]}),
    );
    let remade = w.running(&node.name);
    assert_eq!(reason(w.join(&a, &w.facts(&remade)).await), "template");
}

/// The HTTPS server with nodeup's join task on the node's side: the token from the node's own
/// metadata server, kubeconfigs written, refusals counted by reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodeup_joins_through_the_https_server_with_its_identity_token() {
    let w = World::new();
    let node = w.mig_instance("nodes", CLUSTER);
    let node_meta = gce_metadata::start_with_identity(&w.facts(&node), w.google.clone());
    let cp = w.mig_instance("control-plane-b", CLUSTER);
    let cp_meta = gce_metadata::start_with_identity(&w.facts(&cp), w.google.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let metrics = protokube::metrics::Metrics::default();
    let server = tokio::spawn(protokube::node_join::serve(listener, w.authority(), metrics.clone(), Default::default()));

    let root = tempfile::tempdir().expect("root");
    let (ca_pem, challenge_port) = (w.ca.cert_pem.clone(), w.challenge_port);
    let task = move |node_name: &str, id: &str, metadata: String| nodeup::join::JoinTask {
        server: format!("https://127.0.0.1:{port}"),
        api_server: format!("https://api.internal.{CLUSTER}"),
        ca_pem: ca_pem.clone(),
        node_name: node_name.into(),
        instance_id: id.into(),
        cloud: nodeup::join::JoinCloud::Gce { metadata: Some(metadata) },
        region: "europe-west1".into(),
        sts_url: String::new(),
        imds_url: None,
        wait: Duration::from_secs(2),
        challenge_listen: std::net::SocketAddr::from(([127, 0, 0, 1], challenge_port)),
        deps: vec![],
    };
    let (root_path, node2, cp2) = (root.path().to_path_buf(), node.clone(), cp.clone());
    let (node_addr, cp_addr) = (node_meta.addr().to_string(), cp_meta.addr().to_string());
    let (applied, converged, control_plane) = tokio::task::spawn_blocking(move || {
        use nodeup::tasks::Task as _;
        let host = nodeup::host::Host::new(&root_path);
        let fetcher = nodeup::assets::Fetcher::new(Default::default(), root_path.join("cache")).expect("fetcher");
        let ctx = nodeup::nodetasks::Ctx { host: &host, assets: &fetcher };
        let good = task(&node2.name, &node2.id, node_addr);
        let applied = good.apply(&ctx, false).map_err(|e| e.to_string());
        let converged = good.check(&ctx, false).expect("check");
        let other_root = root_path.join("cp");
        std::fs::create_dir_all(&other_root).expect("cp root");
        let cp_host = nodeup::host::Host::new(&other_root);
        let cp_ctx = nodeup::nodetasks::Ctx { host: &cp_host, assets: &fetcher };
        let control_plane = task(&cp2.name, &cp2.id, cp_addr).apply(&cp_ctx, false).map_err(|e| e.to_string());
        (applied, converged, control_plane)
    })
    .await
    .expect("join task");
    applied.expect("nodeup joins by GCE identity");
    assert!(converged.is_empty(), "a second run changes nothing: {converged:?}");
    let cert = std::fs::read_to_string(root.path().join("var/lib/kubelet/kubelet-client.pem")).expect("the kubelet's certificate");
    assert_eq!(pki::describe_cert(&cert).expect("cert").cn, format!("system:node:{}", node.name));
    let refused = control_plane.expect_err("a control-plane instance does not join this way");
    assert!(refused.contains("403") && refused.contains("control-plane"), "{refused}");
    let s = metrics.snapshot();
    assert_eq!(s.node_joins_admitted, 1);
    assert!(s.node_join_refusals.get("control-plane").is_some_and(|n| *n >= 1), "{:?}", s.node_join_refusals);
    server.abort();
}

/// The real binary on a GCE control plane (loop mode) serves GCE joins with what its flags and
/// BootConfig give it: Google's keys from `--gce-jwks-url`, Compute at `--endpoint-url`, its project
/// and region from its metadata server, the instance groups from the state store. Shown by
/// refusals that come after the token, Compute and state-store checks (a join that passes them all
/// would be called back on the instance's address, which is not on this machine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_protokube_binary_serves_gce_joins_from_its_flags() {
    let w = World::new();
    let state = w.state.path();
    let spec = format!(
            "apiVersion: kops.k8s.io/v1alpha2\nkind: Cluster\nmetadata:\n  name: {CLUSTER}\nspec:\n  cloudProvider: gce\n  configBase: file://{0}\n  dnsZone: k8s.example.com\n  etcdClusters:\n  - name: main\n    version: 3.5.21\n    etcdMembers:\n    - name: b\n      instanceGroup: control-plane-b\n",
            state.display()
        );
    state::write_protokube_configs(state, &spec, &[]);
    base::pki::init_pki(state, &["main".to_string()]).expect("CAs");
    let keyset = std::fs::read(state.join("pki/private/kubernetes-ca/keyset.yaml")).expect("CA keyset");
    let ca = pki::parse_private_keyset("kubernetes-ca", &keyset).expect("CA");
    let boot = state.join("bootconfig.yaml");
    std::fs::write(
        &boot,
        format!("CloudProvider: gce\nConfigBase: file://{}\nClusterName: {CLUSTER}\nInstanceGroupName: control-plane-b\nInstanceGroupRole: ControlPlane\nNodeupConfigHash: x\n", state.display()),
    )
    .expect("boot config");
    // The control plane's own metadata server (identity, service-account token).
    let cp = w.mig_instance("control-plane-b", CLUSTER);
    let mut values = w.facts(&cp).values();
    values.insert("instance/service-accounts/default/token".into(), json!({"access_token": "tok", "expires_in": 3599, "token_type": "Bearer"}).to_string());
    let meta = Server::start(Arc::new(move |req: &Request| gce_metadata::answer(&values, req)));

    let root = tempfile::tempdir().expect("root");
    let port = free_port();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_protokube"))
        .args(["--conf", &boot.display().to_string(), "--root", &root.path().display().to_string(), "--by-id-dir", &root.path().display().to_string()])
        .args(["--imds-url", &meta.url(""), "--endpoint-url", &w.compute_url.replace("/compute/v1", ""), "--gce-jwks-url", &w.jwks_url])
        .args(["--join-listen", &format!("127.0.0.1:{port}"), "--metrics-addr", "off", "--no-addons", "--no-backups", "--interval", "30"])
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env_remove("GCE_METADATA_HOST")
        .env("PROTOKUBE_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run protokube");

    let host = format!("kops-controller.internal.{CLUSTER}");
    let client = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca.cert_pem.as_bytes()).expect("ca"))
        .resolve(&host, std::net::SocketAddr::from(([127, 0, 0, 1], port)))
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client");
    let url = format!("https://{host}:{port}{}", node_join::PATH);
    let post = |facts: InstanceFacts| {
        let (client, url) = (client.clone(), url.clone());
        let (body, _) = w.request_for(&facts, &facts.name);
        let auth = w.token(&facts, &body);
        async move {
            let r = client.post(&url).header("authorization", auth).body(body).send().await?;
            Ok::<_, reqwest::Error>((r.status().as_u16(), r.text().await.unwrap_or_default()))
        }
    };
    // Bounded wait for the server to listen.
    let deadline = Instant::now() + Duration::from_secs(60);
    let first = loop {
        match post(w.facts(&cp)).await {
            Ok(answer) => break answer,
            Err(e) => {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!("protokube exited ({status}) before serving joins");
                }
                assert!(Instant::now() < deadline, "the join server does not answer: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    // The control plane's own token: refused for its group's role (the token verified against the
    // keys at --gce-jwks-url, the instance found RUNNING with its id through Compute, the group
    // read from the state store).
    assert_eq!(first.0, 403, "{first:?}");
    assert!(first.1.contains("control-plane instance group"), "{first:?}");
    // A node whose MIG now makes it from the control plane's template: refused on the template
    // (listManagedInstances and instanceTemplates.get answered).
    let mig = gce_instance_group_manager_name(ZB, "nodes", CLUSTER);
    let node = w.mig_instance("nodes", CLUSTER);
    call(&w.c, "POST", &format!("/zones/{ZB}/instanceGroupManagers/{mig}/setInstanceTemplate"), json!({"instanceTemplate": "global/instanceTemplates/cp-b-t"}));
    call(
        &w.c,
        "POST",
        &format!("/zones/{ZB}/instanceGroupManagers/{mig}/recreateInstances"),
        json!({"instances": [format!("zones/{ZB}/instances/{}", node.name)]}),
    );
    let remade = w.running(&node.name);
    let second = post(w.facts(&remade)).await.expect("answer");
    assert_eq!(second.0, 403, "{second:?}");
    assert!(second.1.contains("instance template cp-b-t is of instance group \"control-plane-b\", not nodes"), "{second:?}");
    // Another project's token: refused before any Compute call.
    let third = post(InstanceFacts { project: "evil-prod".into(), ..w.facts(&remade) }).await.expect("answer");
    assert!(third.0 == 403 && third.1.contains("not this cluster's acme-prod"), "{third:?}");

    child.kill().expect("stop protokube");
    let out = child.wait_with_output().expect("protokube output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("serving node joins (GCE identity)"), "{stderr}");
}
