//! The join server's HTTPS front: TLS with a certificate from the cluster CA (reissued when half
//! used), admission limits at accept time ([`super::limits`]), one request per connection, and
//! refusals counted by reason. [`spawn`] runs it on a thread and runtime of its own.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base::node_join;
use base::pki::{self, CertSpec, Keypair};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};

use super::limits::Admission;
use super::AnyAuthority;
use crate::metrics::Metrics;

/// The join server's own certificate: issued at start, reissued when half used.
const SERVER_CERT_VALIDITY: Duration = Duration::from_secs(30 * 86400);
const MAX_BODY: usize = 64 * 1024;
const CA: &str = "kubernetes-ca";

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
    vec![format!("kops-controller.internal.{cluster}"), format!("api.internal.{cluster}")]
}

fn response(status: StatusCode, body: String, json: bool) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    let ct = if json { "application/json" } else { "text/plain; charset=utf-8" };
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(ct));
    r
}

fn count_refusal(metrics: &Metrics, reason: &str) {
    metrics.update(|s| {
        s.node_joins_refused += 1;
        *s.node_join_refusals.entry(reason.to_string()).or_default() += 1;
    });
}

async fn handle(authority: Arc<AnyAuthority>, metrics: Metrics, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.method() != hyper::Method::POST || req.uri().path() != node_join::PATH {
        count_refusal(&metrics, "not-found");
        return Ok(response(StatusCode::NOT_FOUND, format!("POST {} only\n", node_join::PATH), false));
    }
    let auth = req.headers().get(hyper::header::AUTHORIZATION).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            count_refusal(&metrics, "bad-request");
            return Ok(response(StatusCode::PAYLOAD_TOO_LARGE, format!("request body: {e}\n"), false));
        }
    };
    match authority.admit(&auth, &body).await {
        Ok(r) => {
            metrics.update(|s| s.node_joins_admitted += 1);
            match serde_json::to_string(&r) {
                Ok(json) => Ok(response(StatusCode::OK, json, true)),
                // Never an empty 200: the node would wait for certificates that are not there.
                Err(e) => {
                    tracing::error!(error = %e, "node join: encoding the response");
                    Ok(response(StatusCode::INTERNAL_SERVER_ERROR, "encoding the response failed\n".into(), false))
                }
            }
        }
        Err(refusal) => {
            tracing::warn!(status = %refusal.status, reason = refusal.reason, message = %refusal.message, "node join refused");
            count_refusal(&metrics, refusal.reason);
            Ok(response(refusal.status, format!("{}\n", refusal.message), false))
        }
    }
}

/// Serve joins on `listener` until the task is dropped. The certificate names [`server_names`]
/// and, when the listener is bound to one address, that address. Connections beyond `limits` are
/// closed at once, unread, and counted.
pub async fn serve(listener: tokio::net::TcpListener, authority: impl Into<AnyAuthority>, metrics: Metrics, admission: Admission) {
    let limits = admission.limits();
    let authority: AnyAuthority = authority.into();
    let ips = listener.local_addr().map(|a| a.ip()).into_iter().filter(|ip| !ip.is_unspecified()).collect();
    let tls = Arc::new(Tls { names: server_names(authority.cluster()), ips, ca: authority.ca().clone(), current: Mutex::new(None) });
    let authority = Arc::new(authority);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                // Out of descriptors, most likely: wait for connections to end.
                tracing::warn!(error = %e, "node join: accept failed");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let slot = match admission.admit(peer.ip(), Instant::now()) {
            Ok(slot) => slot,
            Err(turnaway) => {
                drop(stream);
                tracing::debug!(%peer, reason = turnaway.reason(), "node join: connection turned away");
                count_refusal(&metrics, turnaway.reason());
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
            let _slot = slot;
            let stream = match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(stream)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "node join: TLS handshake failed"),
                Err(_) => {
                    count_refusal(&metrics, "handshake-timeout");
                    return tracing::debug!(%peer, "node join: TLS handshake timed out");
                }
            };
            let service = hyper::service::service_fn(move |req| handle(authority.clone(), metrics.clone(), req));
            let conn = hyper::server::conn::http1::Builder::new()
                .keep_alive(false)
                .header_read_timeout(limits.handshake_timeout)
                .timer(hyper_util::rt::TokioTimer::new())
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            if let Err(e) = tokio::time::timeout(limits.request_timeout, conn).await.unwrap_or(Ok(())) {
                tracing::debug!(%peer, error = %e, "node join: connection ended with an error");
            }
        });
    }
}

/// Why the server thread could not start.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("node join server: {0}")]
    Io(#[from] std::io::Error),
}

/// Run [`serve`] on a thread with a runtime of its own (two workers): however busy the join server
/// is, the caller's runtime (etcd reconcile, backups, DNS) never waits for it. `listener` is a
/// std listener so that it is registered with the server's own runtime.
pub fn spawn(
    listener: std::net::TcpListener,
    authority: impl Into<AnyAuthority>,
    metrics: Metrics,
    admission: Admission,
) -> Result<std::thread::JoinHandle<()>, SpawnError> {
    let authority: AnyAuthority = authority.into();
    listener.set_nonblocking(true)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name("node-join").enable_all().build()?;
    let handle = std::thread::Builder::new().name("node-join".into()).spawn(move || {
        runtime.block_on(async move {
            match tokio::net::TcpListener::from_std(listener) {
                Ok(l) => serve(l, authority, metrics, admission).await,
                Err(e) => tracing::error!(error = %e, "node join: listener"),
            }
        })
    })?;
    Ok(handle)
}
