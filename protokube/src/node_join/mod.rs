//! The node join server (kops-controller's bootstrap job): on every control plane, HTTPS on
//! [`PORT`](base::node_join::PORT), it admits a worker that proves with a signed
//! `sts:GetCallerIdentity` (AWS) or a metadata identity token ([`gce`], GCE) which instance it is,
//! and signs that node's kubelet and kube-proxy CSRs. What follows is the AWS side.
//! The protocol and its cloud-free checks live in [`base::node_join`]; this module adds what needs
//! the cloud and the CA:
//! - STS, through the node's own signed request (forwarded unchanged to this cluster's STS endpoint,
//!   no redirects followed), says who signed: the identity must be of this server's own account and
//!   partition (learned once at start from its own `GetCallerIdentity`), an assumed-role session of
//!   the instance group's instance-profile role, named for the instance claimed;
//! - EC2 says the instance is running, is tagged for this cluster, belongs to the autoscaling group
//!   of one of the cluster's `Node` instance groups (read from the state store) and carries that
//!   group's instance profile (the cluster's `nodes.<cluster>`, or the group's `iam.profile`, whose
//!   role IAM names);
//! - the node answers a call back on the instance's private IP with the key of its CSR
//!   ([`challenge`]): credentials lifted from IMDS and replayed from elsewhere fail;
//! - no control plane's Node holds the name ([`node_names`]: a stale one is never taken over);
//! - the certificates are for that instance's private DNS name only, whatever the request asks.
//!
//! The server ([`server`]) runs on a thread and runtime of its own, with bounded connections and a
//! token bucket per source ([`limits`]), so a flood never stalls etcd, backups or DNS.

pub mod challenge;
pub mod gce;
pub mod google_keys;
pub mod limits;
pub mod node_names;
pub mod server;
pub mod start;

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use base::node_join::{self, JoinRequest, JoinResponse, CERT_KUBELET};
use base::pki::{self, CertSpec, Keypair};
use base::StateStore;
use hyper::StatusCode;
use keelson_api::names;
use keelson_api::{InstanceGroup, Role};

pub use node_names::NodeNames;
pub use server::{serve, spawn};

/// How long the node certificates are valid (the kubelet renews its own through CSRs; nodeup asks
/// again when less than a third is left).
pub const NODE_CERT_VALIDITY: Duration = Duration::from_secs(365 * 86400);
const CA: &str = "kubernetes-ca";
/// How long a custom instance profile's role, as IAM names it, is trusted before asking again.
const PROFILE_ROLE_TTL: Duration = Duration::from_secs(300);

/// Why a join was refused: the HTTP status, a `reason` for the refusal counter, and a message for
/// the node (no secrets in it).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    pub status: StatusCode,
    pub reason: &'static str,
    pub message: String,
}

pub(crate) fn refuse(status: StatusCode, reason: &'static str, message: impl Into<String>) -> Refusal {
    Refusal { status, reason, message: message.into() }
}

pub(crate) fn forbidden(reason: &'static str, message: impl Into<String>) -> Refusal {
    refuse(StatusCode::FORBIDDEN, reason, message)
}

pub(crate) fn upstream(message: impl Into<String>) -> Refusal {
    refuse(StatusCode::BAD_GATEWAY, "upstream", message)
}

/// Where to call a joining node back, given its instance's private IP.
pub type ChallengeAddr = Arc<dyn Fn(IpAddr) -> SocketAddr + Send + Sync>;

/// The production call-back address: the instance's private IP, [`node_join::CHALLENGE_PORT`].
pub fn challenge_at_instance() -> ChallengeAddr {
    Arc::new(|ip| SocketAddr::new(ip, node_join::CHALLENGE_PORT))
}

/// The server's own AWS identity: only identities of this account and partition may join.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnAccount {
    pub account: String,
    pub partition: String,
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("node join server: sts:GetCallerIdentity (its own account): {0}")]
    OwnIdentity(String),
    #[error("node join server: HTTP client: {0}")]
    Http(String),
    #[error("node join server: {0}")]
    PlainHttp(#[from] base::plain_http::PlainHttpRefused),
}

/// What [`Authority::new`] needs.
#[derive(Clone)]
pub struct AuthorityConfig {
    pub cluster: String,
    pub ca: Keypair,
    /// This cluster's STS endpoint ([`node_join::sts_endpoint`]); the only URL requests go to.
    pub sts_url: String,
    pub sts: aws_sdk_sts::Client,
    pub ec2: aws_sdk_ec2::Client,
    pub iam: aws_sdk_iam::Client,
    pub store: StateStore,
    /// Node names a control plane's Node holds are refused ([`NodeNames::local`] in production).
    pub nodes: NodeNames,
    /// [`challenge_at_instance`] in production.
    pub challenge_addr: ChallengeAddr,
}

/// What the server needs to decide and to sign.
pub struct Authority {
    pub cluster: String,
    pub ca: Keypair,
    pub sts_url: String,
    pub own: OwnAccount,
    http: reqwest::Client,
    ec2: aws_sdk_ec2::Client,
    iam: aws_sdk_iam::Client,
    store: StateStore,
    nodes: NodeNames,
    challenge_addr: ChallengeAddr,
    profile_roles: Mutex<HashMap<String, (String, Instant)>>,
}

/// `arn:<partition>:iam::<account>:instance-profile/<path…/>name` → name.
fn instance_profile_name(arn: &str) -> Option<&str> {
    let resource = arn.splitn(6, ':').nth(5)?;
    let rest = resource.strip_prefix("instance-profile/")?;
    rest.rsplit('/').next().filter(|n| !n.is_empty())
}

/// The join request in `body`, checked before any cloud call ([`node_join::parse_join_request`]).
pub(crate) fn parse_request(body: &[u8]) -> Result<(JoinRequest, Vec<u8>), Refusal> {
    node_join::parse_join_request(body).map_err(|e| refuse(StatusCode::BAD_REQUEST, "bad-request", e.to_string()))
}

/// Sign the request's CSRs: the kubelet's for `node_name` only (whatever the CSR asks), kube-proxy's
/// as `system:kube-proxy`.
pub(crate) fn sign_node_certs(ca: &Keypair, request: &JoinRequest, node_name: &str) -> Result<BTreeMap<String, String>, Refusal> {
    let mut certs = BTreeMap::new();
    for (name, csr) in &request.csrs {
        let spec = match name.as_str() {
            CERT_KUBELET => CertSpec::client(&format!("system:node:{node_name}"), &["system:nodes"]),
            _ => CertSpec::client("system:kube-proxy", &[]),
        };
        let cert =
            pki::sign_csr(CA, ca, csr, &spec, NODE_CERT_VALIDITY).map_err(|e| refuse(StatusCode::BAD_REQUEST, "bad-request", format!("csrs.{name}: {e}")))?;
        certs.insert(name.clone(), cert);
    }
    Ok(certs)
}

/// The join server's authority on this cloud: AWS identities ([`Authority`]) or GCE identity tokens
/// ([`gce::GceAuthority`]); each admits its own cloud's proof only.
pub enum AnyAuthority {
    Aws(Box<Authority>),
    Gce(Box<gce::GceAuthority>),
}

impl From<Authority> for AnyAuthority {
    fn from(a: Authority) -> AnyAuthority {
        AnyAuthority::Aws(Box::new(a))
    }
}

impl From<gce::GceAuthority> for AnyAuthority {
    fn from(a: gce::GceAuthority) -> AnyAuthority {
        AnyAuthority::Gce(Box::new(a))
    }
}

impl AnyAuthority {
    pub fn cluster(&self) -> &str {
        match self {
            AnyAuthority::Aws(a) => &a.cluster,
            AnyAuthority::Gce(g) => &g.cluster,
        }
    }

    pub fn ca(&self) -> &Keypair {
        match self {
            AnyAuthority::Aws(a) => &a.ca,
            AnyAuthority::Gce(g) => &g.ca,
        }
    }

    /// Decide one join: `authorization` is the request's `Authorization` header, `body` its bytes.
    pub async fn admit(&self, authorization: &str, body: &[u8]) -> Result<JoinResponse, Refusal> {
        match self {
            AnyAuthority::Aws(a) => a.admit(authorization, body).await,
            AnyAuthority::Gce(g) => g.admit(authorization, body).await.map(|a| a.response),
        }
    }
}

impl Authority {
    /// Learn the server's own account and partition (its own `GetCallerIdentity`), once.
    pub async fn new(c: AuthorityConfig) -> Result<Authority, StartError> {
        // The nodes' signed requests are forwarded to STS, whose answer decides who a node is:
        // never over plain http:// off loopback, where anyone on the path could answer.
        base::plain_http::check("node join STS endpoint", &c.sts_url)?;
        let me = c.sts.get_caller_identity().send().await.map_err(|e| StartError::OwnIdentity(aws_sdk_sts::error::DisplayErrorContext(e).to_string()))?;
        let account = me.account().unwrap_or_default().to_string();
        let arn = me.arn().unwrap_or_default().to_string();
        let partition = node_join::CallerIdentity { arn: arn.clone(), account: account.clone() }.partition().unwrap_or_default().to_string();
        if account.is_empty() || partition.is_empty() {
            return Err(StartError::OwnIdentity(format!("no account or partition in the answer (arn {arn:?}, account {account:?})")));
        }
        // The signed request goes to STS only: never follow a redirect elsewhere.
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(20))
            .build()
            .map_err(|e| StartError::Http(e.to_string()))?;
        tracing::info!(%account, %partition, "node join server: admitting identities of this account only");
        Ok(Authority {
            cluster: c.cluster,
            ca: c.ca,
            sts_url: c.sts_url,
            own: OwnAccount { account, partition },
            http,
            ec2: c.ec2,
            iam: c.iam,
            store: c.store,
            nodes: c.nodes,
            challenge_addr: c.challenge_addr,
            profile_roles: Mutex::new(HashMap::new()),
        })
    }

    /// Decide one join: `authorization` is the request's `Authorization` header, `body` its bytes.
    pub async fn admit(&self, authorization: &str, body: &[u8]) -> Result<JoinResponse, Refusal> {
        let signed = node_join::parse_authorization(authorization).map_err(|e| refuse(StatusCode::UNAUTHORIZED, "unauthenticated", e.to_string()))?;
        node_join::check_signed(&signed, &self.sts_url, body, SystemTime::now()).map_err(|e| forbidden("signature", e.to_string()))?;
        let (request, kubelet_key) = parse_request(body)?;

        // Who signed, according to STS.
        let mut forward = self.http.post(&self.sts_url).body(signed.body.clone());
        for (k, v) in &signed.headers {
            if k != "host" && k != "content-length" {
                forward = forward.header(k, v);
            }
        }
        let answer = forward.send().await.map_err(|e| upstream(format!("STS at {}: {e}", self.sts_url)))?;
        let status = answer.status();
        let text = answer.text().await.map_err(|e| upstream(format!("STS at {}: {e}", self.sts_url)))?;
        if status.is_client_error() {
            return Err(forbidden("signature", format!("STS refused the signed request ({status})")));
        }
        if !status.is_success() {
            return Err(upstream(format!("STS at {} answered {status}", self.sts_url)));
        }
        let caller = node_join::parse_caller_identity(&text).map_err(|e| upstream(e.to_string()))?;
        if caller.partition() != Some(self.own.partition.as_str()) || caller.account != self.own.account {
            return Err(forbidden(
                "account",
                format!("{} is not of this cluster's account {} (partition {})", caller.arn, self.own.account, self.own.partition),
            ));
        }
        let session = caller.assumed_role().ok_or_else(|| forbidden("role", format!("{} is not an instance role session", caller.arn)))?;
        if session.session != request.instance_id {
            return Err(forbidden("instance", format!("claims instance {} but the credentials belong to {}", request.instance_id, session.session)));
        }

        // What EC2 says of that instance.
        let out = self
            .ec2
            .describe_instances()
            .instance_ids(&session.session)
            .send()
            .await
            .map_err(|e| upstream(format!("ec2:DescribeInstances {}: {}", session.session, aws_sdk_ec2::error::DisplayErrorContext(e))))?;
        let instance = out
            .reservations()
            .iter()
            .flat_map(|r| r.instances())
            .find(|i| i.instance_id() == Some(session.session.as_str()))
            .ok_or_else(|| forbidden("instance", format!("instance {} does not exist", session.session)))?;
        let state = instance.state().and_then(|s| s.name()).map(|n| n.as_str().to_string()).unwrap_or_default();
        if state != "running" {
            return Err(forbidden("instance", format!("instance {} is {state:?}, not running", session.session)));
        }
        let tags: BTreeMap<&str, &str> = instance.tags().iter().filter_map(|t| Some((t.key()?, t.value()?))).collect();
        if tags.get("KubernetesCluster") != Some(&self.cluster.as_str()) {
            return Err(forbidden("group", format!("instance {} is not tagged KubernetesCluster={}", session.session, self.cluster)));
        }
        let group = tags.get("kops.k8s.io/instancegroup").copied().unwrap_or_default();
        let asg = tags.get(cloud::volumes::ASG_TAG).copied().unwrap_or_default();
        if group.is_empty() || asg != names::autoscaling_group_name(group, &self.cluster) {
            return Err(forbidden("group", format!("instance {} is not in an autoscaling group of this cluster (group {asg:?})", session.session)));
        }
        let ig = self.node_group(group).await?;

        // The instance carries its group's instance profile, and the session is of that profile's role.
        let (profile_arn, role) = self.group_profile(&ig).await?;
        let actual_profile = instance.iam_instance_profile().and_then(|p| p.arn()).unwrap_or_default();
        if actual_profile != profile_arn {
            return Err(forbidden("profile", format!("instance {} has instance profile {actual_profile:?}, not its group's {profile_arn}", session.session)));
        }
        if session.role != role {
            return Err(forbidden("role", format!("{} is not a session of {role}, the role of instance profile {profile_arn}", caller.arn)));
        }

        let node_name = instance.private_dns_name().unwrap_or_default();
        if node_name.is_empty() {
            return Err(forbidden("instance", format!("instance {} has no private DNS name", session.session)));
        }
        if request.node_name != node_name {
            return Err(forbidden("instance", format!("claims node name {} but instance {} is {node_name}", request.node_name, session.session)));
        }

        // The node itself, on its own address, holds the key it asks a certificate for.
        let ip: IpAddr = instance
            .private_ip_address()
            .and_then(|ip| ip.parse().ok())
            .ok_or_else(|| forbidden("instance", format!("instance {} has no private IP to call back", session.session)))?;
        challenge::call_back((self.challenge_addr)(ip), kubelet_key, &base::sha256_hex(body)).await.map_err(|e| forbidden("challenge", e.to_string()))?;

        self.nodes.check(node_name).await?;
        let certs = sign_node_certs(&self.ca, &request, node_name)?;
        tracing::info!(instance = %session.session, node = %node_name, group, "node join admitted");
        Ok(JoinResponse { node_name: node_name.to_string(), certs })
    }

    /// The instance group must exist in the state store with role `Node`.
    async fn node_group(&self, group: &str) -> Result<InstanceGroup, Refusal> {
        let rel = format!("instancegroup/{group}");
        let bytes = self
            .store
            .get(&rel)
            .await
            .map_err(|e| upstream(e.to_string()))?
            .ok_or_else(|| forbidden("group", format!("instance group {group} is not in this cluster's state store")))?;
        let ig: InstanceGroup = serde_yaml_ng::from_slice(&bytes).map_err(|e| upstream(format!("{}: {e}", self.store.url(&rel))))?;
        if ig.role() != Some(Role::Node) {
            return Err(forbidden("group", format!("instance group {group} is not a Node group; only workers join this way")));
        }
        Ok(ig)
    }

    /// The instance profile (ARN) a group's instances carry and the role (name) their sessions are
    /// of: the group's `iam.profile` and the role IAM says it holds, or the cluster's own
    /// `nodes.<cluster>` profile and role (same name, as `keelson apply` creates them).
    async fn group_profile(&self, ig: &InstanceGroup) -> Result<(String, String), Refusal> {
        let custom = ig.spec.iam.as_ref().and_then(|i| i.profile.clone()).filter(|p| !p.is_empty());
        let Some(arn) = custom else {
            let name = names::iam_role_name(Role::Node, &self.cluster);
            return Ok((format!("arn:{}:iam::{}:instance-profile/{name}", self.own.partition, self.own.account), name));
        };
        if let Ok(cache) = self.profile_roles.lock() {
            if let Some((role, at)) = cache.get(&arn) {
                if at.elapsed() < PROFILE_ROLE_TTL {
                    return Ok((arn, role.clone()));
                }
            }
        }
        let name = instance_profile_name(&arn).ok_or_else(|| upstream(format!("instance group iam.profile {arn:?} is not an instance-profile ARN")))?;
        let out = self
            .iam
            .get_instance_profile()
            .instance_profile_name(name)
            .send()
            .await
            .map_err(|e| upstream(format!("iam:GetInstanceProfile {name}: {}", aws_sdk_iam::error::DisplayErrorContext(e))))?;
        let profile = out.instance_profile().ok_or_else(|| upstream(format!("iam:GetInstanceProfile {name}: no profile in the answer")))?;
        if profile.arn() != arn {
            return Err(upstream(format!("instance profile {name} is {}, not {arn}", profile.arn())));
        }
        let role =
            profile.roles().first().map(|r| r.role_name().to_string()).ok_or_else(|| forbidden("profile", format!("instance profile {arn} holds no role")))?;
        if let Ok(mut cache) = self.profile_roles.lock() {
            cache.insert(arn.clone(), (role.clone(), Instant::now()));
        }
        Ok((arn, role))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn instance_profile_names_come_from_their_arn() {
        assert_eq!(super::instance_profile_name("arn:aws:iam::123:instance-profile/custom"), Some("custom"));
        assert_eq!(super::instance_profile_name("arn:aws:iam::123:instance-profile/team/a/custom"), Some("custom"));
        assert_eq!(super::instance_profile_name("arn:aws:iam::123:role/custom"), None);
        assert_eq!(super::instance_profile_name("custom"), None);
    }
}
