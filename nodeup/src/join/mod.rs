//! Node join by cloud identity, the worker's side ([`base::node_join`] has the protocol): make a key
//! and CSR per certificate, sign `sts:GetCallerIdentity` with the instance role's credentials from
//! IMDS (AWS) or ask the metadata server for an identity token bound to the request body (GCE),
//! ask the join server on the control planes, and write the certificates it returns: the kubelet's
//! (with its key, one PEM file, 0600, which the kubelet's kubeconfig names and the kubelet reads
//! again by itself) and kube-proxy's (a kubeconfig, 0600). No shared secret ever reaches the worker.
//!
//! Converged while both hold a certificate for the right name, from the cluster CA (kube-proxy's
//! for the right API server), with more than a third of its life left — the kubelet's with
//! enough left for the kubelet to read the next one in time ([`base::renewal::KUBELET_CLIENT_LEAD`]).

use std::time::{Duration, SystemTime};

use base::node_join::{self, JoinRequest, JoinResponse, CERT_KUBELET, CERT_KUBE_PROXY};
use base::pki;

use crate::paths;

pub mod challenge;
use crate::nodetasks::Ctx;
use crate::render::kubelet;
use crate::tasks::{Task, TaskError};

/// The task's name (dependencies refer to it).
pub const TASK_NAME: &str = "node-join";

/// Why a join failed.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error("node join at {server}: {message}")]
    Server { server: String, message: String },
    #[error("node join: {0}")]
    Identity(String),
    #[error(transparent)]
    Protocol(#[from] node_join::JoinError),
}

impl From<JoinError> for TaskError {
    fn from(e: JoinError) -> TaskError {
        TaskError::failed(e)
    }
}

/// How the node proves which instance it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JoinCloud {
    /// A signed `sts:GetCallerIdentity` with the instance role's credentials (IMDS).
    Aws,
    /// A metadata identity token whose audience binds the request body
    /// ([`base::node_join_gce`]); `metadata`: the metadata server (`host[:port]`; `None`:
    /// `$GCE_METADATA_HOST`, else GCE's own).
    Gce { metadata: Option<String> },
}

pub struct JoinTask {
    /// `https://kops-controller.internal.<cluster>:3988`.
    pub server: String,
    /// The API server the kubeconfigs point at (`https://api.internal.<cluster>`).
    pub api_server: String,
    /// The cluster CA (PEM): the only trust for the join server and the API server.
    pub ca_pem: String,
    pub node_name: String,
    pub instance_id: String,
    /// The cloud identity the node joins with.
    pub cloud: JoinCloud,
    /// AWS: the region of the STS endpoint.
    pub region: String,
    /// The STS endpoint the identity is signed for ([`node_join::sts_endpoint`]).
    pub sts_url: String,
    /// IMDS base URL for the instance role's credentials (`None`: the SDK default).
    pub imds_url: Option<String>,
    /// How long to keep asking while the control plane is not up yet, or refuses.
    pub wait: Duration,
    /// Where this node answers the join server's call back while it joins
    /// (`0.0.0.0:`[`node_join::CHALLENGE_PORT`]).
    pub challenge_listen: std::net::SocketAddr,
    pub deps: Vec<String>,
}

impl JoinTask {
    fn wanted(&self) -> [(&'static str, &'static str, String); 2] {
        [
            (CERT_KUBELET, paths::KUBELET_CLIENT_PEM, format!("system:node:{}", self.node_name)),
            (CERT_KUBE_PROXY, paths::KUBE_PROXY_KUBECONFIG, "system:kube-proxy".to_string()),
        ]
    }

    /// What is wrong with one kubeconfig (or the kubelet's certificate file), if anything.
    fn problem(&self, ctx: &Ctx, path: &str, cn: &str) -> Option<String> {
        let p = ctx.host.path(path);
        let Ok(text) = std::fs::read_to_string(&p) else { return Some(format!("{path}: missing")) };
        if base::fs::mode_of(&p) != Some(0o600) {
            return Some(format!("{path}: mode is not 0600"));
        }
        if path == paths::KUBELET_CLIENT_PEM {
            return match pki::describe_cert(&text) {
                Ok(c) if c.cn != cn => Some(format!("{path}: certificate is for {}, not {cn}", c.cn)),
                Ok(c) if c.issuer_cn != "kubernetes-ca" => Some(format!("{path}: certificate is from {}", c.issuer_cn)),
                Ok(_) => crate::cert_tasks::kubelet_client_due(&text).map(|why| format!("{path}: {why}")),
                Err(e) => Some(format!("{path}: {e}")),
            };
        }
        let value: serde_yaml_ng::Value = match serde_yaml_ng::from_str(&text) {
            Ok(v) => v,
            Err(e) => return Some(format!("{path}: unreadable: {e}")),
        };
        let field = |path: &[&str]| -> Option<String> {
            let mut v = &value;
            for k in path {
                v = match k.parse::<usize>() {
                    Ok(i) => v.get(i)?,
                    Err(_) => v.get(*k)?,
                };
            }
            v.as_str().map(str::to_string)
        };
        use base64::Engine as _;
        let decode = |s: Option<String>| s.and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok()).and_then(|b| String::from_utf8(b).ok());
        if field(&["clusters", "0", "cluster", "server"]).as_deref() != Some(self.api_server.as_str()) {
            return Some(format!("{path}: not for {}", self.api_server));
        }
        if decode(field(&["clusters", "0", "cluster", "certificate-authority-data"])).as_deref() != Some(self.ca_pem.as_str()) {
            return Some(format!("{path}: another cluster CA"));
        }
        let Some(cert) = decode(field(&["users", "0", "user", "client-certificate-data"])) else {
            return Some(format!("{path}: no client certificate"));
        };
        match pki::describe_cert(&cert) {
            Ok(c) if c.cn != cn => Some(format!("{path}: certificate is for {}, not {cn}", c.cn)),
            Ok(c) if c.issuer_cn != "kubernetes-ca" => Some(format!("{path}: certificate is from {}", c.issuer_cn)),
            Ok(c) => {
                let now = SystemTime::now();
                let life = c.not_after.duration_since(c.not_before).unwrap_or_default();
                let left = c.not_after.duration_since(now).unwrap_or_default();
                (left < life / 3).then(|| format!("{path}: certificate expires in {} h", left.as_secs() / 3600))
            }
            Err(e) => Some(format!("{path}: {e}")),
        }
    }

    /// One join: keys, CSRs, the signed identity, the request.
    fn join(&self) -> Result<Vec<(&'static str, String, String)>, JoinError> {
        let wanted = self.wanted();
        let mut keys = Vec::new();
        let mut csrs = std::collections::BTreeMap::new();
        for (name, _, cn) in &wanted {
            let (key, csr) = pki::csr(cn).map_err(|e| JoinError::Identity(e.to_string()))?;
            keys.push((*name, key));
            csrs.insert(name.to_string(), csr);
        }
        let body = serde_json::to_vec(&JoinRequest { node_name: self.node_name.clone(), instance_id: self.instance_id.clone(), csrs })
            .map_err(|e| JoinError::Identity(e.to_string()))?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| JoinError::Identity(format!("runtime: {e}")))?;
        let authorization = match &self.cloud {
            JoinCloud::Aws => {
                let creds = runtime.block_on(base::aws::instance_role_credentials(self.imds_url.as_deref())).map_err(JoinError::Identity)?;
                node_join::authorization(&node_join::sign(&creds, &self.region, &self.sts_url, &body, SystemTime::now())?)?
            }
            JoinCloud::Gce { metadata } => {
                let md = base::gce_metadata::GceMetadata::new(metadata.as_deref(), Duration::from_secs(10)).map_err(|e| JoinError::Identity(e.to_string()))?;
                let token = runtime
                    .block_on(md.get(&base::node_join_gce::identity_request(&body)))
                    .map_err(|e| JoinError::Identity(e.to_string()))?
                    .filter(|t| !t.trim().is_empty())
                    .ok_or_else(|| JoinError::Identity(format!("the metadata server has no {} (no service account?)", base::node_join_gce::IDENTITY_PATH)))?;
                base::node_join_gce::authorization(&token)
            }
        };
        let server_err = |message: String| JoinError::Server { server: self.server.clone(), message };
        // Answer the server's call back for as long as this request is pending.
        let kubelet_key = keys.iter().find(|(n, _)| *n == CERT_KUBELET).map(|(_, k)| k.as_str()).unwrap_or_default();
        let _responder = challenge::Responder::start(self.challenge_listen, kubelet_key, &self.node_name, base::sha256_hex(&body))?;
        // Every trusted key of the cluster CA: mid-rotation the join server may serve from either.
        let mut builder = reqwest::blocking::Client::builder().tls_built_in_root_certs(false);
        for cert in reqwest::Certificate::from_pem_bundle(self.ca_pem.as_bytes()).map_err(|e| server_err(format!("cluster CA: {e}")))? {
            builder = builder.add_root_certificate(cert);
        }
        let client =
            builder.connect_timeout(Duration::from_secs(5)).timeout(Duration::from_secs(30)).build().map_err(|e| server_err(format!("HTTP client: {e}")))?;
        let url = format!("{}{}", self.server.trim_end_matches('/'), node_join::PATH);
        let answer = client.post(&url).header("authorization", authorization).body(body).send().map_err(|e| server_err(e.to_string()))?;
        let status = answer.status();
        let text = answer.text().map_err(|e| server_err(e.to_string()))?;
        if !status.is_success() {
            return Err(server_err(format!("{status}: {}", text.trim())));
        }
        let r: JoinResponse = serde_json::from_str(&text).map_err(|e| server_err(format!("not a join response: {e}")))?;
        if r.node_name != self.node_name {
            return Err(server_err(format!("issued for node {}, but this host registers as {}", r.node_name, self.node_name)));
        }
        let mut out = Vec::new();
        for (name, key) in keys {
            let cert = r.certs.get(name).ok_or_else(|| server_err(format!("no {name} certificate in the answer")))?;
            out.push((name, cert.clone(), key));
        }
        Ok(out)
    }
}

impl Task<Ctx<'_>> for JoinTask {
    /// The join talks to the join server: a render only reports it.
    fn renders(&self) -> bool {
        false
    }
    fn name(&self) -> String {
        TASK_NAME.into()
    }
    fn deps(&self) -> Vec<String> {
        self.deps.clone()
    }
    fn paths(&self) -> Vec<String> {
        vec![paths::KUBELET_CLIENT_PEM.into(), paths::KUBE_PROXY_KUBECONFIG.into()]
    }
    fn check(&self, ctx: &Ctx, deps_changed: bool) -> Result<Vec<String>, TaskError> {
        let problems: Vec<String> = self.wanted().iter().filter_map(|(_, path, cn)| self.problem(ctx, path, cn)).collect();
        if problems.is_empty() {
            return Ok(if deps_changed { vec![format!("join the cluster at {} (cluster CA changed)", self.server)] } else { vec![] });
        }
        Ok(vec![format!("join the cluster at {} as {} ({})", self.server, self.node_name, problems.join("; "))])
    }
    fn apply(&self, ctx: &Ctx, _: bool) -> Result<(), TaskError> {
        use backon::{BlockingRetryable as _, ExponentialBuilder};
        let policy = ExponentialBuilder::default()
            .with_min_delay(Duration::from_secs(2))
            .with_max_delay(Duration::from_secs(20))
            .with_total_delay(Some(self.wait))
            .without_max_times()
            .with_jitter();
        let issued = (|| self.join()).retry(policy).notify(|e, wait| tracing::warn!(error = %e, retry_in = ?wait, "node join failed; retrying")).call()?;
        let wanted = self.wanted();
        let old_left = crate::cert_tasks::left_in_file(&ctx.host.path(paths::KUBELET_CLIENT_PEM));
        for (name, cert, key) in issued {
            let Some((_, path, _)) = wanted.iter().find(|(n, _, _)| *n == name) else { continue };
            let body = if *path == paths::KUBELET_CLIENT_PEM {
                pki::Keypair { cert_pem: cert, key_pem: key }.combined_pem()
            } else {
                let user = kubelet::UserEntry { client_certificate_data: Some(cert), client_key_data: Some(key), ..Default::default() };
                kubelet::kubeconfig(&self.api_server, &self.ca_pem, name, user).map_err(TaskError::failed)?
            };
            base::fs::write_atomic(&ctx.host.path(path), body.as_bytes(), 0o600, None)?;
        }
        tracing::info!(node = %self.node_name, server = %self.server, "joined by cloud identity");
        crate::cert_tasks::restart_kubelet_if_late(ctx, old_left)
    }
}
