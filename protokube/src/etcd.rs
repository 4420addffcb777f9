//! The etcd members API (v3 JSON gateway), used to add a fresh member to an existing cluster.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use serde_json::json;

/// Membership changes go through raft: allow them longer than a read.
const MUTATION_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("etcd {url}: {message}")]
    Http { url: String, message: String },
    #[error("{url}: {source}")]
    Request {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("etcd TLS material {path}: {message}")]
    Tls { path: String, message: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Member {
    /// uint64 as a decimal string (grpc-gateway JSON).
    #[serde(rename = "ID", default, deserialize_with = "id_string")]
    pub id: String,
    /// Empty until the member has started.
    #[serde(default)]
    pub name: String,
    #[serde(rename = "peerURLs", default)]
    pub peer_urls: Vec<String>,
    #[serde(rename = "clientURLs", default)]
    pub client_urls: Vec<String>,
    #[serde(rename = "isLearner", default)]
    pub is_learner: bool,
}

fn id_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let v = serde_json::Value::deserialize(d)?;
    Ok(match v {
        serde_json::Value::String(s) => s,
        other => other.to_string(),
    })
}

#[derive(Debug, Deserialize)]
struct MemberList {
    #[serde(default)]
    members: Vec<Member>,
}

/// A client for one etcd endpoint reached at a known address (DNS may not be ready yet, so the
/// member's DNS name is pinned to the address; TLS still verifies that name).
pub struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    /// `host` is the member's DNS name, `addr` where to reach it; `pki` holds `ca.crt`, `client.crt`,
    /// `client.key` when TLS is on.
    pub fn new(scheme: &str, host: &str, addr: SocketAddr, pki: Option<&Path>, timeout: Duration) -> Result<Client, EtcdError> {
        let mut b = reqwest::Client::builder().timeout(timeout).connect_timeout(timeout).no_proxy().resolve(host, addr);
        if let Some(dir) = pki {
            let read = |f: &str| {
                let p = dir.join(f);
                std::fs::read(&p).map_err(|e| EtcdError::Tls { path: p.display().to_string(), message: e.to_string() })
            };
            let ca = reqwest::Certificate::from_pem(&read("ca.crt")?)
                .map_err(|e| EtcdError::Tls { path: dir.join("ca.crt").display().to_string(), message: e.to_string() })?;
            let mut ident = read("client.crt")?;
            ident.extend(read("client.key")?);
            let id = reqwest::Identity::from_pem(&ident)
                .map_err(|e| EtcdError::Tls { path: dir.join("client.crt").display().to_string(), message: e.to_string() })?;
            b = b.tls_built_in_root_certs(false).add_root_certificate(ca).identity(id);
        }
        let http = b.build().map_err(|e| EtcdError::Http { url: host.to_string(), message: e.to_string() })?;
        Ok(Client { http, base: format!("{scheme}://{host}:{}", addr.port()) })
    }

    async fn post(&self, path: &str, body: serde_json::Value, timeout: Option<Duration>) -> Result<serde_json::Value, EtcdError> {
        let url = format!("{}{path}", self.base);
        let mut req = self.http.post(&url);
        if let Some(t) = timeout {
            req = req.timeout(t);
        }
        let resp = req
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| EtcdError::Http { url: url.clone(), message: e.to_string() })?;
        let status = resp.status();
        let text = resp.text().await.map_err(|e| EtcdError::Http { url: url.clone(), message: e.to_string() })?;
        if !status.is_success() {
            return Err(EtcdError::Http { url, message: format!("HTTP {status}: {text}") });
        }
        serde_json::from_str(&text).map_err(|e| EtcdError::Http { url, message: format!("bad JSON: {e}") })
    }

    pub async fn members(&self) -> Result<Vec<Member>, EtcdError> {
        let v = self.post("/v3/cluster/member/list", json!({}), None).await?;
        let list: MemberList =
            serde_json::from_value(v).map_err(|e| EtcdError::Http { url: self.base.clone(), message: e.to_string() })?;
        Ok(list.members)
    }

    pub async fn add(&self, peer_url: &str) -> Result<Vec<Member>, EtcdError> {
        let v = self.post("/v3/cluster/member/add", json!({ "peerURLs": [peer_url] }), Some(MUTATION_TIMEOUT)).await?;
        let list: MemberList =
            serde_json::from_value(v).map_err(|e| EtcdError::Http { url: self.base.clone(), message: e.to_string() })?;
        Ok(list.members)
    }

    pub async fn remove(&self, id: &str) -> Result<(), EtcdError> {
        self.post("/v3/cluster/member/remove", json!({ "ID": id }), Some(MUTATION_TIMEOUT)).await.map(|_| ())
    }
}
