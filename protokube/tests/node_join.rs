//! The node join server against a real moto (STS, IAM, EC2, Auto Scaling): a worker of the cluster's
//! node group, signing with its own instance-role session, gets certificates for its own node name
//! only; every other claim is refused. One request goes through the real HTTPS server.
//! Needs moto (scripts/test installs it); fails loudly without it.

#[path = "support/iam.rs"]
mod iam;
#[path = "../../cloud/tests/support/moto.rs"]
mod moto;

use std::collections::BTreeMap;
use std::time::SystemTime;

use aws_credential_types::Credentials;
use base::node_join::{self, JoinRequest, JoinResponse};
use base::pki;
use nodeup::join::challenge::Responder;
use protokube::node_join::{Authority, AuthorityConfig};

const CLUSTER: &str = "join.example.com";

struct World {
    url: String,
    conf: cloud::aws::SdkConfig,
    ca: pki::Keypair,
    _store_dir: tempfile::TempDir,
    store: base::StateStore,
    node_role_arn: String,
    master_role_arn: String,
    custom_role_arn: String,
    /// Where the authority calls every instance back (the test's stand-in for `<private IP>:3987`).
    challenge_port: u16,
    /// The Nodes the stand-in Kubernetes API has (name → Node), which the authority reads.
    nodes: Nodes,
    nodes_api: testkit::httpd::Server,
    /// The cluster and its instance groups as the state store holds them: the control-plane policy
    /// the authority's calls are held against is rendered from them ([`iam`], on drop).
    spec: String,
    iam: iam::Mark,
    /// An authority was made (so the oracle must have seen the control plane's calls).
    authority_made: std::sync::atomic::AtomicBool,
}

impl Drop for World {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        if self.authority_made.load(std::sync::atomic::Ordering::SeqCst) {
            self.iam.assert_allowed(&self.url, &self.spec, moto::REGION);
        } else {
            let report = self.iam.check(&self.url, &self.spec, moto::REGION);
            assert!(report.clean(), "{report}");
        }
    }
}

type Nodes = std::sync::Arc<std::sync::Mutex<BTreeMap<String, serde_json::Value>>>;

/// The Kubernetes API's `GET /api/v1/nodes/<name>` over `nodes` (404 for any other Node).
fn nodes_api(nodes: Nodes) -> testkit::httpd::Server {
    testkit::httpd::Server::start(std::sync::Arc::new(move |req: &testkit::httpd::Request| {
        let json = |status: u16, v: serde_json::Value| testkit::httpd::Response::text(status, v.to_string()).header("Content-Type", "application/json");
        let name = req.path.strip_prefix("/api/v1/nodes/").filter(|_| req.method == "GET").unwrap_or_default();
        match nodes.lock().unwrap_or_else(|p| p.into_inner()).get(name) {
            Some(node) => json(200, node.clone()),
            None => json(
                404,
                serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
                    "message": format!("nodes \"{name}\" not found")}),
            ),
        }
    }))
}

/// A Node as the API holds it, with `labels`.
fn node(name: &str, labels: &[(&str, &str)]) -> serde_json::Value {
    let labels: serde_json::Map<String, serde_json::Value> = labels.iter().map(|(k, v)| (k.to_string(), serde_json::Value::from(*v))).collect();
    serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}})
}

/// A free port on 127.0.0.1.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

async fn world(url: &str) -> World {
    let conf = moto::sdk(url).await;
    let iam = aws_sdk_iam::Client::new(&conf);
    let trust = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"ec2.amazonaws.com"},"Action":"sts:AssumeRole"}]}"#;
    let mut arns = Vec::new();
    // Roles and their instance profiles of the same name, as `keelson apply` makes them; and a
    // custom profile holding a role of another name (an instance group's `iam.profile`).
    for (profile, role) in [
        (format!("nodes.{CLUSTER}"), format!("nodes.{CLUSTER}")),
        (format!("masters.{CLUSTER}"), format!("masters.{CLUSTER}")),
        ("custom-nodes".into(), "custom-node-role".into()),
    ] {
        let r = iam.create_role().role_name(&role).assume_role_policy_document(trust).send().await.expect("create role");
        arns.push(r.role().map(|r| r.arn().to_string()).expect("role arn"));
        iam.create_instance_profile().instance_profile_name(&profile).send().await.expect("instance profile");
        iam.add_role_to_instance_profile().instance_profile_name(&profile).role_name(&role).send().await.expect("add role");
    }
    // The state store holds the instance groups (what `keelson apply` writes).
    let dir = tempfile::tempdir().expect("tempdir");
    let mut spec = format!(
        "apiVersion: kops.k8s.io/v1alpha2\nkind: Cluster\nmetadata:\n  name: {CLUSTER}\nspec:\n  cloudProvider: aws\n  configBase: file://{}\n",
        dir.path().display()
    );
    for (name, role, extra) in [
        ("nodes", "Node", ""),
        ("control-plane-a", "ControlPlane", ""),
        ("nodes-odd", "Node", ""),
        ("custom", "Node", "  iam:\n    profile: arn:aws:iam::123456789012:instance-profile/custom-nodes\n"),
    ] {
        let path = dir.path().join(format!("instancegroup/{name}"));
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        let ig = format!("apiVersion: kops.k8s.io/v1alpha2\nkind: InstanceGroup\nmetadata:\n  name: {name}\n  labels:\n    kops.k8s.io/cluster: {CLUSTER}\nspec:\n  role: {role}\n  minSize: 1\n  maxSize: 1\n  machineType: t3.medium\n  image: ami-12c6146b\n  subnets: [a]\n{extra}");
        std::fs::write(path, &ig).expect("write ig");
        spec.push_str(&format!("---\n{ig}"));
    }
    let nodes = Nodes::default();
    let base: base::ConfigBase = format!("file://{}", dir.path().display()).parse().expect("config base");
    let store = base::StateStore::open(&base, std::time::Duration::from_secs(10)).expect("store");
    World {
        url: url.to_string(),
        conf,
        ca: pki::create_ca("kubernetes-ca").expect("ca"),
        _store_dir: dir,
        store,
        node_role_arn: arns[0].clone(),
        master_role_arn: arns[1].clone(),
        custom_role_arn: arns[2].clone(),
        challenge_port: free_port(),
        nodes_api: nodes_api(nodes.clone()),
        nodes,
        spec,
        iam: iam::Mark::now(),
        authority_made: Default::default(),
    }
}

impl World {
    async fn authority(&self) -> Authority {
        self.authority_made.store(true, std::sync::atomic::Ordering::SeqCst);
        let port = self.challenge_port;
        Authority::new(AuthorityConfig {
            cluster: CLUSTER.into(),
            ca: self.ca.clone(),
            sts_url: format!("{}/", self.url),
            // protokube's clients sign as the control plane (checked by the IAM oracle on drop).
            sts: aws_sdk_sts::Client::new(&iam::as_control_plane(&self.conf)),
            ec2: aws_sdk_ec2::Client::new(&iam::as_control_plane(&self.conf)),
            iam: aws_sdk_iam::Client::new(&iam::as_control_plane(&self.conf)),
            store: self.store.clone(),
            nodes: self.node_names(),
            challenge_addr: std::sync::Arc::new(move |_ip| std::net::SocketAddr::from(([127, 0, 0, 1], port))),
        })
        .await
        .expect("the authority learns its own account")
    }

    /// The authority's view of the Nodes: the stand-in API.
    fn node_names(&self) -> protokube::node_join::NodeNames {
        let config = kube::Config::new(format!("http://{}", self.nodes_api.addr()).parse().expect("url"));
        protokube::node_join::NodeNames::with_client(kube::Client::try_from(config).expect("client"))
    }

    /// The node's side of the call back, for a request made with `keys` and `body`, at the address
    /// the authority calls every instance back on.
    fn answering(&self, keys: &BTreeMap<String, String>, body: &[u8]) -> Responder {
        self.answering_with(&keys[node_join::CERT_KUBELET], body)
    }

    fn answering_with(&self, kubelet_key: &str, body: &[u8]) -> Responder {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.challenge_port));
        Responder::start(addr, kubelet_key, "node", base::sha256_hex(body)).expect("challenge responder")
    }

    /// An autoscaling group `<group>.<cluster>` (tags as `keelson apply` sets them) with one instance
    /// of the cluster's node instance profile: (instance id, private DNS name).
    async fn group_instance(&self, group: &str, cluster_tag: &str) -> (String, String) {
        self.group_instance_with_profile(group, cluster_tag, &format!("nodes.{CLUSTER}")).await
    }

    async fn group_instance_with_profile(&self, group: &str, cluster_tag: &str, profile: &str) -> (String, String) {
        let ec2 = aws_sdk_ec2::Client::new(&self.conf);
        let asg = aws_sdk_autoscaling::Client::new(&self.conf);
        let vpc = ec2.create_vpc().cidr_block("172.20.0.0/16").send().await.expect("vpc");
        let vpc_id = vpc.vpc().and_then(|v| v.vpc_id()).expect("vpc id").to_string();
        // A subnet of its own: instances of different groups get different addresses (and names).
        static NEXT: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(1);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let subnet = ec2.create_subnet().vpc_id(&vpc_id).cidr_block(format!("172.20.{n}.0/24")).availability_zone("us-east-1a").send().await.expect("subnet");
        let subnet_id = subnet.subnet().and_then(|s| s.subnet_id()).expect("subnet id").to_string();
        let lt = format!("{group}-{cluster_tag}").replace('.', "-");
        ec2.create_launch_template()
            .launch_template_name(&lt)
            .launch_template_data(
                aws_sdk_ec2::types::RequestLaunchTemplateData::builder()
                    .image_id("ami-12c6146b")
                    .instance_type(aws_sdk_ec2::types::InstanceType::T3Medium)
                    .iam_instance_profile(aws_sdk_ec2::types::LaunchTemplateIamInstanceProfileSpecificationRequest::builder().name(profile).build())
                    .build(),
            )
            .send()
            .await
            .expect("launch template");
        let tag = |k: &str, v: &str| aws_sdk_autoscaling::types::Tag::builder().key(k).value(v).propagate_at_launch(true).build();
        asg.create_auto_scaling_group()
            .auto_scaling_group_name(format!("{group}.{cluster_tag}"))
            .launch_template(aws_sdk_autoscaling::types::LaunchTemplateSpecification::builder().launch_template_name(&lt).build())
            .min_size(1)
            .max_size(1)
            .vpc_zone_identifier(&subnet_id)
            .tags(tag("KubernetesCluster", cluster_tag))
            .tags(tag("kops.k8s.io/instancegroup", group))
            .send()
            .await
            .expect("autoscaling group");
        let out = asg.describe_auto_scaling_groups().auto_scaling_group_names(format!("{group}.{cluster_tag}")).send().await.expect("describe asg");
        let id = out.auto_scaling_groups().first().and_then(|g| g.instances().first()).and_then(|i| i.instance_id()).expect("instance").to_string();
        (id.clone(), self.private_dns(&id).await)
    }

    async fn private_dns(&self, id: &str) -> String {
        let ec2 = aws_sdk_ec2::Client::new(&self.conf);
        let out = ec2.describe_instances().instance_ids(id).send().await.expect("describe");
        out.reservations().iter().flat_map(|r| r.instances()).next().and_then(|i| i.private_dns_name()).expect("dns").to_string()
    }

    /// The credentials EC2 gives an instance of `role_arn`: an assumed-role session named for it
    /// (or, with another account's ARN, what an attacker makes in their own account).
    async fn session(&self, role_arn: &str, instance: &str) -> Credentials {
        let sts = aws_sdk_sts::Client::new(&self.conf);
        let out = sts.assume_role().role_arn(role_arn).role_session_name(instance).send().await.expect("assume role");
        let c = out.credentials().expect("credentials");
        Credentials::new(c.access_key_id(), c.secret_access_key(), Some(c.session_token().to_string()), None, "instance-role")
    }

    /// A join request body and its Authorization header, signed with `creds`.
    fn request(&self, creds: &Credentials, node_name: &str, instance_id: &str) -> (Vec<u8>, String, BTreeMap<String, String>) {
        let mut keys = BTreeMap::new();
        let mut csrs = BTreeMap::new();
        for name in [node_join::CERT_KUBELET, node_join::CERT_KUBE_PROXY] {
            let (key, csr) = pki::csr(name).expect("csr");
            keys.insert(name.to_string(), key);
            csrs.insert(name.to_string(), csr);
        }
        let body = serde_json::to_vec(&JoinRequest { node_name: node_name.into(), instance_id: instance_id.into(), csrs }).expect("json");
        let signed = node_join::sign(creds, moto::REGION, &format!("{}/", self.url), &body, SystemTime::now()).expect("sign");
        (body, node_join::authorization(&signed).expect("authorization"), keys)
    }
}

/// The tests hold the moto lock (a std mutex) on the test thread and run their body on this runtime.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

fn subject_of(cert_pem: &str) -> String {
    let der = pem::parse(cert_pem).expect("pem");
    let (_, cert) = x509_parser::parse_x509_certificate(der.contents()).expect("x509");
    assert_eq!(cert.issuer().to_string(), "CN=kubernetes-ca");
    cert.subject().to_string()
}

#[test]
fn only_a_running_worker_of_the_cluster_gets_certificates_for_its_own_name() {
    let (_guard, local) = moto::lock();
    runtime().block_on(only_a_running_worker_of_the_cluster_gets_certificates_for_its_own_name_on(local.url.clone()));
}

async fn only_a_running_worker_of_the_cluster_gets_certificates_for_its_own_name_on(url: String) {
    let w = world(&url).await;
    let authority = w.authority().await;
    let (id, dns) = w.group_instance("nodes", CLUSTER).await;
    let creds = w.session(&w.node_role_arn, &id).await;

    // Admitted: both certificates, for this instance's name only.
    let (body, auth, keys) = w.request(&creds, &dns, &id);
    let answering = w.answering(&keys, &body);
    let r = authority.admit(&auth, &body).await.expect("a worker of the node group is admitted");
    drop(answering);
    assert_eq!(r.node_name, dns);
    assert_eq!(subject_of(&r.certs["kubelet"]), format!("O=system:nodes, CN=system:node:{dns}"));
    assert_eq!(subject_of(&r.certs["kube-proxy"]), "CN=system:kube-proxy");

    // Tampered body (the signature covers the original): refused.
    let mut other = body.clone();
    let text = String::from_utf8(other.clone()).expect("utf-8").replace(&dns, "ip-10-9-9-9.ec2.internal");
    other = text.into_bytes();
    let e = authority.admit(&auth, &other).await.expect_err("body changed after signing");
    assert!(e.message.contains(node_join::BODY_HASH_HEADER), "{e}");

    // Claiming another instance's identity with one's own credentials: refused.
    let (other_id, other_dns) = w.group_instance("nodes", "other.example.com").await;
    let (body, auth, _) = w.request(&creds, &other_dns, &other_id);
    let e = authority.admit(&auth, &body).await.expect_err("claims another instance");
    assert_eq!(e.status, 403);
    assert!(e.message.contains("belong to"), "{e}");
    // Its own identity but another node's name: refused.
    let (body, auth, _) = w.request(&creds, &other_dns, &id);
    let e = authority.admit(&auth, &body).await.expect_err("claims another node name");
    assert!(e.message.contains("claims node name"), "{e}");

    // An instance of another cluster's group, with a node-role session: refused.
    let creds_other = w.session(&w.node_role_arn, &other_id).await;
    let (body, auth, _) = w.request(&creds_other, &other_dns, &other_id);
    let e = authority.admit(&auth, &body).await.expect_err("another cluster's instance");
    assert!(e.message.contains("KubernetesCluster"), "{e}");

    // An instance outside every group (launched by hand): refused.
    let ec2 = aws_sdk_ec2::Client::new(&w.conf);
    let run = ec2
        .run_instances()
        .image_id("ami-12c6146b")
        .min_count(1)
        .max_count(1)
        .tag_specifications(
            aws_sdk_ec2::types::TagSpecification::builder()
                .resource_type(aws_sdk_ec2::types::ResourceType::Instance)
                .tags(aws_sdk_ec2::types::Tag::builder().key("KubernetesCluster").value(CLUSTER).build())
                .tags(aws_sdk_ec2::types::Tag::builder().key("kops.k8s.io/instancegroup").value("nodes").build())
                .build(),
        )
        .send()
        .await
        .expect("run instance");
    let loose = run.instances().first().and_then(|i| i.instance_id()).expect("id").to_string();
    let loose_dns = w.private_dns(&loose).await;
    let (body, auth, _) = w.request(&w.session(&w.node_role_arn, &loose).await, &loose_dns, &loose);
    let e = authority.admit(&auth, &body).await.expect_err("outside the cluster's groups");
    assert!(e.message.contains("autoscaling group"), "{e}");

    // A control-plane group's instance, even with the node role: refused (only workers join so).
    let (cp, cp_dns) = w.group_instance("control-plane-a", CLUSTER).await;
    let (body, auth, _) = w.request(&w.session(&w.node_role_arn, &cp).await, &cp_dns, &cp);
    let e = authority.admit(&auth, &body).await.expect_err("control-plane group");
    assert!(e.message.contains("not a Node group"), "{e}");

    // The right instance with another role's session: refused.
    let (body, auth, _) = w.request(&w.session(&w.master_role_arn, &id).await, &dns, &id);
    let e = authority.admit(&auth, &body).await.expect_err("wrong role");
    assert_eq!(e.reason, "role", "{e}");

    // Not signed with AWS at all / garbage: refused with 401.
    assert_eq!(authority.admit("Bearer x", &body).await.expect_err("no sts").status, 401);

    // A terminated instance: refused.
    ec2.terminate_instances().instance_ids(&id).send().await.expect("terminate");
    let (body, auth, _) = w.request(&creds, &dns, &id);
    let e = authority.admit(&auth, &body).await.expect_err("terminated");
    assert!(e.message.contains("not running"), "{e}");
}

/// A control plane's Node that outlived its instance keeps its name (the instance's private DNS
/// name): a worker given that address gets no certificate for it — its kubelet would take over a
/// Node with the control-plane labels. A worker's Node of the name, or none, is no obstacle.
/// The join server forwards each node's signed request to STS and believes its answer: an STS
/// endpoint over plain http:// off loopback (anyone on the path could answer) stops it at start,
/// before it asks anything. (`0.0.0.0` is this host to the kernel: an open hole only meets a
/// refused connection, and the test sees the wrong error.)
#[test]
fn a_plain_http_sts_endpoint_off_loopback_is_refused() {
    let (_guard, local) = moto::lock();
    runtime().block_on(async {
        let w = world(&local.url).await;
        let port = w.challenge_port;
        let refused = Authority::new(AuthorityConfig {
            cluster: CLUSTER.into(),
            ca: w.ca.clone(),
            sts_url: "http://0.0.0.0:9/".into(),
            sts: aws_sdk_sts::Client::new(&w.conf),
            ec2: aws_sdk_ec2::Client::new(&w.conf),
            iam: aws_sdk_iam::Client::new(&w.conf),
            store: w.store.clone(),
            nodes: w.node_names(),
            challenge_addr: std::sync::Arc::new(move |_ip| std::net::SocketAddr::from(([127, 0, 0, 1], port))),
        })
        .await;
        let err = refused.err().expect("refused").to_string();
        assert!(err.contains("STS endpoint") && err.contains(base::plain_http::ALLOW_ENV), "{err}");
    });
}

#[test]
fn a_name_a_stale_control_plane_node_holds_is_refused() {
    let (_g, m) = moto::lock();
    runtime().block_on(a_name_a_stale_control_plane_node_holds_is_refused_on(m.url.clone()));
}

async fn a_name_a_stale_control_plane_node_holds_is_refused_on(url: String) {
    let w = world(&url).await;
    let authority = w.authority().await;
    let (id, dns) = w.group_instance("nodes", CLUSTER).await;
    let creds = w.session(&w.node_role_arn, &id).await;
    for label in [protokube::addons::CONTROL_PLANE_LABEL, protokube::node_join::node_names::LEGACY_CONTROL_PLANE_LABEL] {
        w.nodes.lock().expect("nodes").insert(dns.clone(), node(&dns, &[(label, ""), ("kops.k8s.io/instancegroup", "control-plane-a")]));
        let (body, auth, keys) = w.request(&creds, &dns, &id);
        let answering = w.answering(&keys, &body);
        let e = authority.admit(&auth, &body).await.expect_err("the name of a control plane's Node");
        drop(answering);
        assert_eq!((e.status.as_u16(), e.reason), (403, "stale-node"), "{label}: {e}");
        assert!(e.message.contains(&dns), "{e}");
    }
    // Once the stale Node is deleted, or when the Node of the name is a worker's, the worker joins.
    for have in [None, Some(node(&dns, &[("node-role.kubernetes.io/node", "")]))] {
        {
            let mut nodes = w.nodes.lock().expect("nodes");
            nodes.remove(&dns);
            nodes.extend(have.map(|n| (dns.clone(), n)));
        }
        let (body, auth, keys) = w.request(&creds, &dns, &id);
        let answering = w.answering(&keys, &body);
        let r = authority.admit(&auth, &body).await.expect("no control plane's Node of the name");
        drop(answering);
        assert_eq!(r.node_name, dns);
    }
}

#[test]
fn the_https_server_answers_a_join_and_refuses_a_forgery() {
    let (_guard, local) = moto::lock();
    runtime().block_on(the_https_server_answers_a_join_and_refuses_a_forgery_on(local.url.clone()));
}

async fn the_https_server_answers_a_join_and_refuses_a_forgery_on(url: String) {
    let w = world(&url).await;
    let (id, dns) = w.group_instance("nodes", CLUSTER).await;
    let creds = w.session(&w.node_role_arn, &id).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let metrics = protokube::metrics::Metrics::default();
    let server = tokio::spawn(protokube::node_join::serve(listener, w.authority().await, metrics.clone(), Default::default()));

    // The node trusts only the cluster CA and reaches the server by the name kOps gives it.
    let host = format!("kops-controller.internal.{CLUSTER}");
    let client = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(w.ca.cert_pem.as_bytes()).expect("ca"))
        .resolve(&host, std::net::SocketAddr::from(([127, 0, 0, 1], port)))
        .build()
        .expect("client");
    let url = format!("https://{host}:{port}{}", node_join::PATH);
    let (body, auth, keys) = w.request(&creds, &dns, &id);
    let answering = w.answering(&keys, &body);
    let answer = client.post(&url).header("authorization", &auth).body(body.clone()).send().await.expect("join");
    assert_eq!(answer.status(), 200);
    drop(answering);
    let r: JoinResponse = serde_json::from_str(&answer.text().await.expect("body")).expect("json");
    // The certificate is for the node's own key (which never left it).
    let der = pem::parse(&r.certs["kubelet"]).expect("pem");
    let (_, cert) = x509_parser::parse_x509_certificate(der.contents()).expect("x509");
    let public = rcgen::KeyPair::from_pem(&keys["kubelet"]).expect("key").public_key_der();
    assert_eq!(cert.public_key().raw, public.as_slice());

    let mut forged = body;
    forged.extend_from_slice(b" ");
    let answer = client.post(&url).header("authorization", &auth).body(forged).send().await.expect("forged join");
    assert_eq!(answer.status(), 403);
    let s = metrics.snapshot();
    assert_eq!((s.node_joins_admitted, s.node_joins_refused), (1, 1));
    assert_eq!(s.node_join_refusals.get("signature"), Some(&1), "{:?}", s.node_join_refusals);
    assert!(metrics.render().contains("protokube_node_join_refusals_total{reason=\"signature\"} 1"));
    server.abort();
}

/// nodeup's join task (the worker's side, as nodeup runs it) against this server: instance-role
/// credentials from a metadata service, kubeconfigs written 0600, converged afterwards; a host
/// whose name is not its instance's is refused and writes nothing.
#[test]
fn nodeup_joins_through_the_server_with_its_instance_role() {
    let (_guard, local) = moto::lock();
    runtime().block_on(nodeup_joins_through_the_server_with_its_instance_role_on(local.url.clone()));
}

async fn nodeup_joins_through_the_server_with_its_instance_role_on(url: String) {
    let w = world(&url).await;
    let (id, dns) = w.group_instance("nodes", CLUSTER).await;
    let creds = w.session(&w.node_role_arn, &id).await;
    let mut data = testkit::imds::InstanceData { instance_id: id.clone(), region: moto::REGION.into(), zone: "us-east-1a".into(), ..Default::default() };
    data.iam = Some(testkit::imds::RoleCredentials {
        instance_profile_arn: format!("arn:aws:iam::123456789012:instance-profile/nodes.{CLUSTER}"),
        instance_profile_id: "AIPAEXAMPLE".into(),
        role_name: format!("nodes.{CLUSTER}"),
        access_key_id: creds.access_key_id().into(),
        secret_access_key: creds.secret_access_key().into(),
        token: creds.session_token().expect("token").into(),
        expiration: "2099-01-01T00:00:00Z".into(),
        last_updated: "2026-01-01T00:00:00Z".into(),
    });
    let imds = testkit::imds::ImdsServer::start_for(data);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let server = tokio::spawn(protokube::node_join::serve(listener, w.authority().await, protokube::metrics::Metrics::default(), Default::default()));

    let root = tempfile::tempdir().expect("root");
    let (ca_pem, id2, sts_url, imds_url, challenge_port) = (w.ca.cert_pem.clone(), id.clone(), format!("{}/", w.url), imds.url.clone(), w.challenge_port);
    let task = move |node_name: &str| nodeup::join::JoinTask {
        server: format!("https://127.0.0.1:{port}"),
        api_server: format!("https://api.internal.{CLUSTER}"),
        ca_pem: ca_pem.clone(),
        node_name: node_name.into(),
        instance_id: id2.clone(),
        cloud: nodeup::join::JoinCloud::Aws,
        region: moto::REGION.into(),
        sts_url: sts_url.clone(),
        imds_url: Some(imds_url.clone()),
        wait: std::time::Duration::from_secs(3),
        challenge_listen: std::net::SocketAddr::from(([127, 0, 0, 1], challenge_port)),
        deps: vec![],
    };
    let (root_path, dns2) = (root.path().to_path_buf(), dns.clone());
    let (first, applied, converged, liar) = tokio::task::spawn_blocking(move || {
        use nodeup::tasks::Task as _;
        let host = nodeup::host::Host::new(&root_path);
        let fetcher = nodeup::assets::Fetcher::new(Default::default(), root_path.join("cache")).expect("fetcher");
        let ctx = nodeup::nodetasks::Ctx { host: &host, assets: &fetcher };
        let good = task(&dns2);
        let first = good.check(&ctx, false).expect("check");
        let applied = good.apply(&ctx, false).map_err(|e| e.to_string());
        let converged = good.check(&ctx, false).expect("check");
        let liar = task("ip-10-9-9-9.ec2.internal").apply(&ctx, false).map_err(|e| e.to_string());
        (first, applied, converged, liar)
    })
    .await
    .expect("join task");
    assert_eq!(first.len(), 1, "{first:?}");
    assert!(first[0].contains("missing"), "{first:?}");
    applied.expect("nodeup joins");
    assert!(converged.is_empty(), "a second run changes nothing: {converged:?}");
    // The kubelet's certificate and key in the file its kubeconfig names; kube-proxy's kubeconfig.
    for (path, cn) in [("var/lib/kubelet/kubelet-client.pem", format!("system:node:{dns}")), ("var/lib/kube-proxy/kubeconfig", "system:kube-proxy".to_string())]
    {
        let p = root.path().join(path);
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&p).expect("kubeconfig").permissions()) & 0o777;
        assert_eq!(mode, 0o600, "{path}");
        let text = std::fs::read_to_string(&p).expect("read");
        let cert = if path.ends_with(".pem") {
            assert!(text.contains("PRIVATE KEY"), "{path}: no key");
            text
        } else {
            let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("yaml");
            let cert_b64 = v["users"][0]["user"]["client-certificate-data"].as_str().expect("cert");
            String::from_utf8(base64::Engine::decode(&base64::engine::general_purpose::STANDARD, cert_b64).expect("b64")).expect("pem")
        };
        assert_eq!(pki::describe_cert(&cert).expect("cert").cn, cn, "{path}");
    }
    let liar = liar.expect_err("a host claiming another node name");
    assert!(liar.contains("claims node name"), "{liar}");
    server.abort();
}

/// The critical hole: a role of the cluster's node-role name in *another* account, its session named
/// for a victim instance, is refused (whatever else it could answer); so is an instance of a node
/// group that carries another instance profile. A group with a custom `iam.profile` is admitted
/// through that profile's role (IAM says which), and only through it.
#[test]
fn identities_of_another_account_or_instance_profile_are_refused() {
    let (_guard, local) = moto::lock();
    runtime().block_on(identities_of_another_account_or_instance_profile_are_refused_on(local.url.clone()));
}

async fn identities_of_another_account_or_instance_profile_are_refused_on(url: String) {
    let w = world(&url).await;
    let authority = w.authority().await;
    assert_eq!((authority.own.account.as_str(), authority.own.partition.as_str()), ("123456789012", "aws"));
    let (id, dns) = w.group_instance("nodes", CLUSTER).await;

    // An attacker's own account, a role of the same name, a session named for the victim; even with
    // someone answering the call back with the attacker's key.
    let foreign = w.session(&format!("arn:aws:iam::210987654321:role/nodes.{CLUSTER}"), &id).await;
    let (body, auth, keys) = w.request(&foreign, &dns, &id);
    let answering = w.answering(&keys, &body);
    let e = authority.admit(&auth, &body).await.expect_err("another account's identity");
    drop(answering);
    assert_eq!((e.status.as_u16(), e.reason), (403, "account"), "{e}");
    assert!(e.message.contains("210987654321") && e.message.contains("123456789012"), "{e}");

    // The right account and role, but the instance was launched with another instance profile.
    let (odd, odd_dns) = w.group_instance_with_profile("nodes-odd", CLUSTER, &format!("masters.{CLUSTER}")).await;
    let creds = w.session(&w.node_role_arn, &odd).await;
    let (body, auth, keys) = w.request(&creds, &odd_dns, &odd);
    let answering = w.answering(&keys, &body);
    let e = authority.admit(&auth, &body).await.expect_err("another instance profile");
    drop(answering);
    assert_eq!(e.reason, "profile", "{e}");
    assert!(e.message.contains(&format!("instance-profile/masters.{CLUSTER}")), "{e}");

    // A group with its own instance profile: admitted through that profile's role…
    let (custom, custom_dns) = w.group_instance_with_profile("custom", CLUSTER, "custom-nodes").await;
    let creds = w.session(&w.custom_role_arn, &custom).await;
    let (body, auth, keys) = w.request(&creds, &custom_dns, &custom);
    let answering = w.answering(&keys, &body);
    let r = authority.admit(&auth, &body).await.expect("a custom-profile group's worker");
    drop(answering);
    assert_eq!(r.node_name, custom_dns);
    // …and not through the cluster's node role.
    let creds = w.session(&w.node_role_arn, &custom).await;
    let (body, auth, keys) = w.request(&creds, &custom_dns, &custom);
    let answering = w.answering(&keys, &body);
    let e = authority.admit(&auth, &body).await.expect_err("the node role on a custom-profile instance");
    drop(answering);
    assert_eq!(e.reason, "role", "{e}");
}

/// Credentials lifted from a node's IMDS and used from another host: the request is genuine in
/// every cloud respect, but nobody on the instance's address holds the key of its CSR.
#[test]
fn stolen_credentials_used_from_another_host_are_refused() {
    let (_guard, local) = moto::lock();
    runtime().block_on(stolen_credentials_used_from_another_host_are_refused_on(local.url.clone()));
}

async fn stolen_credentials_used_from_another_host_are_refused_on(url: String) {
    let w = world(&url).await;
    let authority = w.authority().await;
    let (id, dns) = w.group_instance("nodes", CLUSTER).await;
    let stolen = w.session(&w.node_role_arn, &id).await;

    // The attacker's request (their own keys); the node is not joining: nothing answers.
    let (body, auth, _attacker_keys) = w.request(&stolen, &dns, &id);
    let e = authority.admit(&auth, &body).await.expect_err("nobody answers on the instance's address");
    assert_eq!(e.reason, "challenge", "{e}");

    // The genuine node is joining at this moment (its own keys and request): still refused, the
    // node's certificate is not for the attacker's key.
    let (node_body, _, node_keys) = w.request(&stolen, &dns, &id);
    let answering = w.answering(&node_keys, &node_body);
    let e = authority.admit(&auth, &body).await.expect_err("the node answers with its own key");
    assert_eq!(e.reason, "challenge", "{e}");
    drop(answering);

    // A captured request replayed as is: the node that made it is no longer waiting for it.
    let answering = w.answering(&node_keys, b"{\"another\":\"request\"}");
    let e = authority.admit(&auth, &body).await.expect_err("not waiting for this request");
    assert_eq!(e.reason, "challenge", "{e}");
    drop(answering);

    // The node itself, answering for its own pending request: admitted.
    let (body, auth, keys) = w.request(&stolen, &dns, &id);
    let answering = w.answering(&keys, &body);
    authority.admit(&auth, &body).await.expect("the node itself");
    drop(answering);
}

/// 2,000 slow connections (TCP open, nothing sent) from one address while a real node joins from
/// another: the flood is turned away at accept time and counted, the node gets its certificates,
/// and the runtime the server does not run on (protokube's reconcile, backups, DNS) keeps ticking.
#[test]
fn a_flood_of_slow_connections_neither_stops_a_join_nor_stalls_protokube() {
    let (_guard, local) = moto::lock();
    runtime().block_on(a_flood_of_slow_connections_neither_stops_a_join_nor_stalls_protokube_on(local.url.clone()));
}

async fn a_flood_of_slow_connections_neither_stops_a_join_nor_stalls_protokube_on(url: String) {
    use std::time::{Duration, Instant};
    const FLOOD: usize = 2_000;
    let w = world(&url).await;
    let (id, dns) = w.group_instance("nodes", CLUSTER).await;
    let creds = w.session(&w.node_role_arn, &id).await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let metrics = protokube::metrics::Metrics::default();
    let limits = protokube::node_join::limits::Limits::default();
    protokube::node_join::spawn(listener, w.authority().await, metrics.clone(), protokube::node_join::limits::Admission::new(limits))
        .expect("join server thread");

    // "Reconcile": a 100 ms ticker on this runtime, its largest gap recorded.
    let ticking = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let ticker = {
        let ticking = ticking.clone();
        tokio::spawn(async move {
            let mut last = Instant::now();
            let mut worst = Duration::ZERO;
            let mut ticks = 0u32;
            while ticking.load(std::sync::atomic::Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(100)).await;
                worst = worst.max(last.elapsed());
                last = Instant::now();
                ticks += 1;
            }
            (ticks, worst)
        })
    };

    // The flood, from 127.0.0.2, on a runtime of its own: connect and hold, send nothing.
    let flood = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("flood runtime");
        rt.block_on(async move {
            let mut held = Vec::with_capacity(FLOOD);
            for _ in 0..FLOOD {
                let socket = tokio::net::TcpSocket::new_v4().expect("socket");
                socket.bind(std::net::SocketAddr::from(([127, 0, 0, 2], 0))).expect("bind 127.0.0.2");
                if let Ok(Ok(s)) = tokio::time::timeout(Duration::from_secs(2), socket.connect(std::net::SocketAddr::from(([127, 0, 0, 1], port)))).await {
                    held.push(s);
                }
            }
            let opened = held.len();
            tokio::time::sleep(Duration::from_secs(2)).await;
            drop(held);
            opened
        })
    });

    // Meanwhile the real node joins from 127.0.0.1.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let host = format!("kops-controller.internal.{CLUSTER}");
    let client = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(w.ca.cert_pem.as_bytes()).expect("ca"))
        .resolve(&host, std::net::SocketAddr::from(([127, 0, 0, 1], port)))
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    let (body, auth, keys) = w.request(&creds, &dns, &id);
    let answering = w.answering(&keys, &body);
    let started = Instant::now();
    let answer =
        client.post(format!("https://{host}:{port}{}", node_join::PATH)).header("authorization", &auth).body(body).send().await.expect("join during the flood");
    let join_took = started.elapsed();
    assert_eq!(answer.status(), 200, "{:?}", answer.text().await);
    drop(answering);

    let opened = tokio::task::spawn_blocking(move || flood.join().expect("flood thread")).await.expect("join flood");
    ticking.store(false, std::sync::atomic::Ordering::Relaxed);
    let (ticks, worst) = ticker.await.expect("ticker");
    let s = metrics.snapshot();
    let turned_away: u64 = ["source-busy", "rate-limited", "overloaded"].iter().filter_map(|r| s.node_join_refusals.get(*r)).sum();
    println!(
        "flood: {opened} connections opened, {turned_away} turned away ({:?}); join took {join_took:?}; reconcile ticker: {ticks} ticks, worst gap {worst:?}",
        s.node_join_refusals
    );
    assert_eq!(s.node_joins_admitted, 1);
    assert!(opened >= FLOOD * 9 / 10, "the flood opened only {opened} connections");
    assert!(
        turned_away as usize >= opened - limits.per_source_connections - limits.per_source_burst as usize,
        "turned away {turned_away} of {opened}: {:?}",
        s.node_join_refusals
    );
    // Ten intervals: a runtime the flood shared would stall far longer under 2,000 handshakes.
    assert!(worst < Duration::from_secs(1), "the reconcile runtime stalled for {worst:?}");
}

/// The harness's moto fix (testkit/src/moto_server.py): an Auto Scaling instance of a launch template
/// carries the template's instance profile, as on AWS. Plain moto shows none.
#[test]
fn moto_instances_of_a_launch_template_carry_its_instance_profile() {
    let (_guard, local) = moto::lock();
    runtime().block_on(async {
        let w = world(&local.url).await;
        let (id, _) = w.group_instance("nodes", CLUSTER).await;
        let out = aws_sdk_ec2::Client::new(&w.conf).describe_instances().instance_ids(&id).send().await.expect("describe");
        let profile =
            out.reservations().iter().flat_map(|r| r.instances()).next().and_then(|i| i.iam_instance_profile()).and_then(|p| p.arn()).map(str::to_string);
        assert_eq!(profile.as_deref(), Some(format!("arn:aws:iam::123456789012:instance-profile/nodes.{CLUSTER}").as_str()));
    });
}
