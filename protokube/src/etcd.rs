//! etcd's v3 JSON gateway: the members API (add a fresh member to an existing cluster), status
//! (version, leader, revision, raft index), leadership transfer, streamed snapshots, and one
//! compare-and-swap key (who takes a backup).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use serde::Deserialize;
use serde_json::json;
use sha2::Digest as _;

/// Membership changes go through raft: allow them longer than a read.
const MUTATION_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a snapshot stream may take.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(30 * 60);

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

/// `/v3/maintenance/status` of one member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub version: String,
    pub cluster_id: String,
    pub member_id: String,
    pub leader: String,
    pub revision: i64,
    pub db_size: i64,
    /// The member's raft log index: how far it has caught up.
    pub raft_index: u64,
    pub raft_term: u64,
    /// Alarms and errors the member reports (e.g. `NOSPACE`); empty when healthy.
    pub errors: Vec<String>,
    pub is_learner: bool,
}

impl Status {
    pub fn is_leader(&self) -> bool {
        !self.leader.is_empty() && self.leader != "0" && self.leader == self.member_id
    }
}

/// grpc-gateway writes int64 as a JSON string.
fn num(v: &serde_json::Value) -> i64 {
    match v {
        serde_json::Value::String(s) => s.parse().unwrap_or(0),
        other => other.as_i64().unwrap_or(0),
    }
}

/// grpc-gateway writes uint64 as a JSON string.
fn unum(v: &serde_json::Value) -> u64 {
    match v {
        serde_json::Value::String(s) => s.parse().unwrap_or(0),
        other => other.as_u64().unwrap_or(0),
    }
}

fn text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// A request error with its causes (reqwest's own message stops at "error sending request").
fn describe(e: &reqwest::Error) -> String {
    let mut out = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        out.push_str(&format!(": {s}"));
        source = s.source();
    }
    out
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[derive(Debug, Deserialize)]
struct MemberList {
    #[serde(default)]
    members: Vec<Member>,
}

/// A client for one etcd endpoint reached at a known address (DNS may not be ready yet, so the
/// member's DNS name is pinned to the address; TLS still verifies that name).
#[derive(Clone)]
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

    /// A client for `member` of `ec` at `ip` (its DNS name pinned to the address), with protokube's
    /// client certificate under `root` when the cluster runs TLS.
    pub fn for_member(
        root: &Path,
        cluster_name: &str,
        ec: &crate::config::EtcdCluster,
        member: &str,
        ip: std::net::IpAddr,
        timeout: Duration,
    ) -> Result<Client, EtcdError> {
        let pki = crate::paths::under(root, &crate::paths::etcd_pki_dir(&ec.name));
        let host = ec.member_dns(member, cluster_name);
        Client::new(ec.scheme(), &host, SocketAddr::new(ip, ec.ports.client), ec.tls.then_some(pki.as_path()), timeout)
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
            .map_err(|e| EtcdError::Http { url: url.clone(), message: describe(&e) })?;
        let status = resp.status();
        let text = resp.text().await.map_err(|e| EtcdError::Http { url: url.clone(), message: describe(&e) })?;
        if !status.is_success() {
            return Err(EtcdError::Http { url, message: format!("HTTP {status}: {text}") });
        }
        serde_json::from_str(&text).map_err(|e| EtcdError::Http { url, message: format!("bad JSON: {e}") })
    }

    pub async fn members(&self) -> Result<Vec<Member>, EtcdError> {
        let v = self.post("/v3/cluster/member/list", json!({}), None).await?;
        let list: MemberList = serde_json::from_value(v).map_err(|e| EtcdError::Http { url: self.base.clone(), message: e.to_string() })?;
        Ok(list.members)
    }

    pub async fn add(&self, peer_url: &str) -> Result<Vec<Member>, EtcdError> {
        let v = self.post("/v3/cluster/member/add", json!({ "peerURLs": [peer_url] }), Some(MUTATION_TIMEOUT)).await?;
        let list: MemberList = serde_json::from_value(v).map_err(|e| EtcdError::Http { url: self.base.clone(), message: e.to_string() })?;
        Ok(list.members)
    }

    pub async fn status(&self) -> Result<Status, EtcdError> {
        let v = self.post("/v3/maintenance/status", json!({}), None).await?;
        let h = &v["header"];
        Ok(Status {
            version: text(&v["version"]),
            cluster_id: text(&h["cluster_id"]),
            member_id: text(&h["member_id"]),
            leader: text(&v["leader"]),
            revision: num(&h["revision"]),
            db_size: num(&v["dbSize"]),
            raft_index: unum(&v["raftIndex"]),
            raft_term: unum(&v["raftTerm"]),
            errors: v["errors"].as_array().map(|a| a.iter().map(text).collect()).unwrap_or_default(),
            is_learner: v["isLearner"].as_bool().unwrap_or(false),
        })
    }

    /// Hand leadership to member `target_id` (etcd's MoveLeader). Only the leader accepts it; etcd
    /// answers once `target_id` leads (or fails when `timeout` runs out first).
    pub async fn move_leader(&self, target_id: &str, timeout: Duration) -> Result<(), EtcdError> {
        self.post("/v3/maintenance/transfer-leadership", json!({ "targetID": target_id }), Some(timeout)).await.map(|_| ())
    }

    /// Set `key` to `value` (through raft).
    pub async fn put(&self, key: &str, value: &str) -> Result<i64, EtcdError> {
        let v = self.post("/v3/kv/put", json!({ "key": b64(key.as_bytes()), "value": b64(value.as_bytes()) }), None).await?;
        Ok(num(&v["header"]["revision"]))
    }

    /// Stream a snapshot of this member's database to `dest` (never whole in memory): the bytes
    /// exactly as etcd sends them (the database and its sha256 trailer). Returns size and sha256.
    pub async fn snapshot_to(&self, dest: &Path) -> Result<(u64, String), EtcdError> {
        use std::io::Write as _;
        let url = format!("{}/v3/maintenance/snapshot", self.base);
        let fail = |message: String| EtcdError::Http { url: url.clone(), message };
        let mut resp = self
            .http
            .post(&url)
            .timeout(SNAPSHOT_TIMEOUT)
            .header("content-type", "application/json")
            .body("{}")
            .send()
            .await
            .map_err(|e| fail(e.to_string()))?;
        if !resp.status().is_success() {
            let status = resp.status();
            return Err(fail(format!("HTTP {status}: {}", resp.text().await.unwrap_or_default())));
        }
        // Private: a snapshot holds every secret of the cluster.
        let file = base::fs::create_private(dest).map_err(|e| fail(format!("{}: {e}", dest.display())))?;
        let mut out = std::io::BufWriter::new(file);
        let mut hasher = sha2::Sha256::new();
        let mut size = 0u64;
        // The gateway streams one JSON object per message: {"result":{"blob":"<base64>",…}} or
        // {"error":{…}}. Buffer only the message being received.
        let mut pending: Vec<u8> = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| fail(e.to_string()))? {
            pending.extend_from_slice(&chunk);
            let mut stream = serde_json::Deserializer::from_slice(&pending).into_iter::<serde_json::Value>();
            let mut consumed = 0;
            loop {
                match stream.next() {
                    Some(Ok(msg)) => {
                        consumed = stream.byte_offset();
                        if let Some(e) = msg.get("error") {
                            return Err(fail(format!("snapshot failed: {e}")));
                        }
                        let result = &msg["result"];
                        let blob = result["blob"].as_str().unwrap_or("");
                        let bytes = base64::engine::general_purpose::STANDARD.decode(blob).map_err(|e| fail(format!("snapshot chunk: {e}")))?;
                        hasher.update(&bytes);
                        size += bytes.len() as u64;
                        out.write_all(&bytes).map_err(|e| fail(format!("{}: {e}", dest.display())))?;
                    }
                    Some(Err(e)) if e.is_eof() => break,
                    Some(Err(e)) => return Err(fail(format!("snapshot stream: {e}"))),
                    None => break,
                }
            }
            pending.drain(..consumed);
        }
        if pending.iter().any(|b| !b.is_ascii_whitespace()) {
            return Err(fail("snapshot stream ended inside a message".into()));
        }
        if size == 0 {
            return Err(fail("empty snapshot".into()));
        }
        let file = out.into_inner().map_err(|e| fail(e.to_string()))?;
        file.sync_all().map_err(|e| fail(format!("{}: {e}", dest.display())))?;
        Ok((size, hex::encode(hasher.finalize())))
    }

    /// The value and mod revision of `key` (`None`: no such key).
    pub async fn get(&self, key: &str) -> Result<Option<(String, i64)>, EtcdError> {
        let v = self.post("/v3/kv/range", json!({ "key": b64(key.as_bytes()) }), None).await?;
        let Some(kv) = v["kvs"].as_array().and_then(|a| a.first()) else { return Ok(None) };
        let value = base64::engine::general_purpose::STANDARD.decode(kv["value"].as_str().unwrap_or("")).unwrap_or_default();
        Ok(Some((String::from_utf8_lossy(&value).into_owned(), num(&kv["mod_revision"]))))
    }

    /// Set `key` to `value` if `wanted(current value)` holds, atomically (compare-and-swap on the
    /// key's mod revision, through raft): of several callers racing for the same change, exactly
    /// one gets `true`.
    pub async fn claim(&self, key: &str, value: &str, wanted: impl Fn(Option<&str>) -> bool) -> Result<bool, EtcdError> {
        let current = self.get(key).await?;
        if !wanted(current.as_ref().map(|(v, _)| v.as_str())) {
            return Ok(false);
        }
        let mod_revision = current.map(|(_, r)| r).unwrap_or(0);
        let body = json!({
            "compare": [{ "key": b64(key.as_bytes()), "target": "MOD", "result": "EQUAL", "mod_revision": mod_revision.to_string() }],
            "success": [{ "request_put": { "key": b64(key.as_bytes()), "value": b64(value.as_bytes()) } }],
        });
        let v = self.post("/v3/kv/txn", body, Some(MUTATION_TIMEOUT)).await?;
        Ok(v["succeeded"].as_bool().unwrap_or(false))
    }

    pub async fn remove(&self, id: &str) -> Result<(), EtcdError> {
        self.post("/v3/cluster/member/remove", json!({ "ID": id }), Some(MUTATION_TIMEOUT)).await.map(|_| ())
    }
}
