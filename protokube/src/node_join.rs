//! The node join server (kops-controller's bootstrap job): on every control plane, HTTPS on
//! [`PORT`](base::node_join::PORT), it admits a worker that proves with a signed
//! `sts:GetCallerIdentity` which instance it is, and signs that node's kubelet and kube-proxy CSRs.
//! The protocol and its cloud-free checks live in [`base::node_join`]; this module adds what needs
//! the cloud and the CA:
//! - STS, through the node's own signed request (forwarded unchanged to this cluster's STS endpoint),
//!   says who signed: the session must be of the cluster's node role, named for the instance claimed;
//! - EC2 says the instance is running, is tagged for this cluster, and belongs to the autoscaling group
//!   of one of the cluster's `Node` instance groups (read from the state store);
//! - the certificates are for that instance's private DNS name only, whatever the request asks.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use base::node_join::{self, JoinRequest, JoinResponse, CERT_KUBELET, CERT_KUBE_PROXY};
use base::pki::{self, CertSpec, Keypair};
use base::StateStore;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use keelson_api::names;
use keelson_api::{InstanceGroup, Role};

/// How long the node certificates are valid (the kubelet renews its own through CSRs; nodeup asks
/// again when less than a third is left).
pub const NODE_CERT_VALIDITY: Duration = Duration::from_secs(365 * 86400);
/// The join server's own certificate: issued at start, reissued when half used.
const SERVER_CERT_VALIDITY: Duration = Duration::from_secs(30 * 86400);
const MAX_BODY: usize = 64 * 1024;
const CA: &str = "kubernetes-ca";

/// Why a join was refused: the HTTP status and a message for the node (no secrets in it).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    pub status: StatusCode,
    pub message: String,
}

fn refuse(status: StatusCode, message: impl Into<String>) -> Refusal {
    Refusal { status, message: message.into() }
}

fn forbidden(message: impl Into<String>) -> Refusal {
    refuse(StatusCode::FORBIDDEN, message)
}

/// What the server needs to decide and to sign.
pub struct Authority {
    pub cluster: String,
    pub ca: Keypair,
    /// This cluster's STS endpoint ([`node_join::sts_endpoint`]); the only URL requests go to.
    pub sts_url: String,
    pub http: reqwest::Client,
    pub ec2: aws_sdk_ec2::Client,
    pub store: StateStore,
}

impl Authority {
    /// Decide one join: `authorization` is the request's `Authorization` header, `body` its bytes.
    pub async fn admit(&self, authorization: &str, body: &[u8]) -> Result<JoinResponse, Refusal> {
        let signed = node_join::parse_authorization(authorization).map_err(|e| refuse(StatusCode::UNAUTHORIZED, e.to_string()))?;
        node_join::check_signed(&signed, &self.sts_url, body, SystemTime::now()).map_err(|e| forbidden(e.to_string()))?;
        let request: JoinRequest =
            serde_json::from_slice(body).map_err(|e| refuse(StatusCode::BAD_REQUEST, format!("request body is not a join request: {e}")))?;
        for name in request.csrs.keys() {
            if name != CERT_KUBELET && name != CERT_KUBE_PROXY {
                return Err(refuse(StatusCode::BAD_REQUEST, format!("csrs.{name}: only {CERT_KUBELET} and {CERT_KUBE_PROXY} are issued")));
            }
        }

        // Who signed, according to STS.
        let mut forward = self.http.post(&self.sts_url).body(signed.body.clone());
        for (k, v) in &signed.headers {
            if k != "host" && k != "content-length" {
                forward = forward.header(k, v);
            }
        }
        let answer = forward.send().await.map_err(|e| refuse(StatusCode::BAD_GATEWAY, format!("STS at {}: {e}", self.sts_url)))?;
        let status = answer.status();
        let text = answer.text().await.map_err(|e| refuse(StatusCode::BAD_GATEWAY, format!("STS at {}: {e}", self.sts_url)))?;
        if status.is_client_error() {
            return Err(forbidden(format!("STS refused the signed request ({status})")));
        }
        if !status.is_success() {
            return Err(refuse(StatusCode::BAD_GATEWAY, format!("STS at {} answered {status}", self.sts_url)));
        }
        let caller = node_join::parse_caller_identity(&text).map_err(|e| refuse(StatusCode::BAD_GATEWAY, e.to_string()))?;
        let session = caller.assumed_role().ok_or_else(|| forbidden(format!("{} is not an instance role session", caller.arn)))?;
        let node_role = names::iam_role_name(Role::Node, &self.cluster);
        if session.role != node_role {
            return Err(forbidden(format!("{} is not this cluster's node role {node_role}", caller.arn)));
        }
        if session.session != request.instance_id {
            return Err(forbidden(format!("claims instance {} but the credentials belong to {}", request.instance_id, session.session)));
        }

        // What EC2 says of that instance.
        let out = self
            .ec2
            .describe_instances()
            .instance_ids(&session.session)
            .send()
            .await
            .map_err(|e| refuse(StatusCode::BAD_GATEWAY, format!("ec2:DescribeInstances {}: {}", session.session, aws_sdk_ec2::error::DisplayErrorContext(e))))?;
        let instance = out
            .reservations()
            .iter()
            .flat_map(|r| r.instances())
            .find(|i| i.instance_id() == Some(session.session.as_str()))
            .ok_or_else(|| forbidden(format!("instance {} does not exist", session.session)))?;
        let state = instance.state().and_then(|s| s.name()).map(|n| n.as_str().to_string()).unwrap_or_default();
        if state != "running" {
            return Err(forbidden(format!("instance {} is {state:?}, not running", session.session)));
        }
        let tags: BTreeMap<&str, &str> = instance.tags().iter().filter_map(|t| Some((t.key()?, t.value()?))).collect();
        if tags.get("KubernetesCluster") != Some(&self.cluster.as_str()) {
            return Err(forbidden(format!("instance {} is not tagged KubernetesCluster={}", session.session, self.cluster)));
        }
        let group = tags.get("kops.k8s.io/instancegroup").copied().unwrap_or_default();
        let asg = tags.get("aws:autoscaling:groupName").copied().unwrap_or_default();
        if group.is_empty() || asg != names::autoscaling_group_name(group, &self.cluster) {
            return Err(forbidden(format!("instance {} is not in an autoscaling group of this cluster (group {asg:?})", session.session)));
        }
        self.node_group(group).await?;
        let node_name = instance.private_dns_name().unwrap_or_default();
        if node_name.is_empty() {
            return Err(forbidden(format!("instance {} has no private DNS name", session.session)));
        }
        if request.node_name != node_name {
            return Err(forbidden(format!("claims node name {} but instance {} is {node_name}", request.node_name, session.session)));
        }

        let mut certs = BTreeMap::new();
        for (name, csr) in &request.csrs {
            let spec = match name.as_str() {
                CERT_KUBELET => CertSpec::client(&format!("system:node:{node_name}"), &["system:nodes"]),
                _ => CertSpec::client("system:kube-proxy", &[]),
            };
            let cert = pki::sign_csr(CA, &self.ca, csr, &spec, NODE_CERT_VALIDITY).map_err(|e| refuse(StatusCode::BAD_REQUEST, format!("csrs.{name}: {e}")))?;
            certs.insert(name.clone(), cert);
        }
        tracing::info!(instance = %session.session, node = %node_name, group, "node join admitted");
        Ok(JoinResponse { node_name: node_name.to_string(), certs })
    }

    /// The instance group must exist in the state store with role `Node`.
    async fn node_group(&self, group: &str) -> Result<(), Refusal> {
        let rel = format!("instancegroup/{group}");
        let bytes = self
            .store
            .get(&rel)
            .await
            .map_err(|e| refuse(StatusCode::BAD_GATEWAY, e.to_string()))?
            .ok_or_else(|| forbidden(format!("instance group {group} is not in this cluster's state store")))?;
        let ig: InstanceGroup = serde_yaml_ng::from_slice(&bytes).map_err(|e| refuse(StatusCode::BAD_GATEWAY, format!("{}: {e}", self.store.url(&rel))))?;
        if ig.role() != Some(Role::Node) {
            return Err(forbidden(format!("instance group {group} is not a Node group; only workers join this way")));
        }
        Ok(())
    }
}

/// The TLS configuration of the server, reissued when its certificate is half used.
struct Tls {
    names: Vec<String>,
    ips: Vec<std::net::IpAddr>,
    ca: Keypair,
    current: Mutex<Option<(tokio_rustls::TlsAcceptor, Instant)>>,
}

impl Tls {
    fn acceptor(&self) -> Result<tokio_rustls::TlsAcceptor, String> {
        let mut cur = self.current.lock().map_err(|_| "TLS state poisoned".to_string())?;
        if let Some((a, at)) = cur.as_ref() {
            if at.elapsed() < SERVER_CERT_VALIDITY / 2 {
                return Ok(a.clone());
            }
        }
        let spec = CertSpec { cn: "keelson-node-join".into(), orgs: vec![], dns: self.names.clone(), ips: self.ips.clone(), usage: pki::Usage::Server };
        let leaf = pki::issue_for(CA, &self.ca, &spec, SERVER_CERT_VALIDITY).map_err(|e| e.to_string())?;
        use rustls::pki_types::pem::PemObject as _;
        let certs = vec![rustls::pki_types::CertificateDer::from_pem_slice(leaf.cert_pem.as_bytes()).map_err(|e| format!("server certificate: {e}"))?];
        let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).map_err(|e| format!("server key: {e}"))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| e.to_string())?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        *cur = Some((acceptor.clone(), Instant::now()));
        Ok(acceptor)
    }
}

/// The names the server's certificate carries: where nodes reach it.
pub fn server_names(cluster: &str) -> Vec<String> {
    vec![format!("api.internal.{cluster}"), format!("kops-controller.internal.{cluster}")]
}

fn response(status: StatusCode, body: String, json: bool) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    let ct = if json { "application/json" } else { "text/plain; charset=utf-8" };
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(ct));
    r
}

async fn handle(authority: Arc<Authority>, metrics: crate::metrics::Metrics, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.method() != hyper::Method::POST || req.uri().path() != node_join::PATH {
        return Ok(response(StatusCode::NOT_FOUND, format!("POST {} only\n", node_join::PATH), false));
    }
    let auth = req.headers().get(hyper::header::AUTHORIZATION).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return Ok(response(StatusCode::PAYLOAD_TOO_LARGE, format!("request body: {e}\n"), false)),
    };
    match authority.admit(&auth, &body).await {
        Ok(r) => {
            metrics.update(|s| s.node_joins_admitted += 1);
            Ok(response(StatusCode::OK, serde_json::to_string(&r).unwrap_or_default(), true))
        }
        Err(refusal) => {
            tracing::warn!(status = %refusal.status, reason = %refusal.message, "node join refused");
            metrics.update(|s| s.node_joins_refused += 1);
            Ok(response(refusal.status, format!("{}\n", refusal.message), false))
        }
    }
}

/// Serve joins on `listener` until the process ends. The certificate names
/// [`server_names`] and, when the listener is bound to one address, that address.
pub async fn serve(listener: tokio::net::TcpListener, authority: Authority, metrics: crate::metrics::Metrics) {
    let ips = listener.local_addr().map(|a| a.ip()).into_iter().filter(|ip| !ip.is_unspecified()).collect();
    let tls = Arc::new(Tls { names: server_names(&authority.cluster), ips, ca: authority.ca.clone(), current: Mutex::new(None) });
    let authority = Arc::new(authority);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "node join: accept failed");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let acceptor = match tls.acceptor() {
            Ok(a) => a,
            Err(e) => {
                tracing::error!(error = %e, "node join: no server certificate");
                continue;
            }
        };
        let (authority, metrics) = (authority.clone(), metrics.clone());
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "node join: TLS handshake failed"),
                Err(_) => return tracing::debug!(%peer, "node join: TLS handshake timed out"),
            };
            let service = hyper::service::service_fn(move |req| handle(authority.clone(), metrics.clone(), req));
            let conn = hyper::server::conn::http1::Builder::new().serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            if let Err(e) = tokio::time::timeout(Duration::from_secs(60), conn).await.unwrap_or(Ok(())) {
                tracing::debug!(%peer, error = %e, "node join: connection ended with an error");
            }
        });
    }
}
