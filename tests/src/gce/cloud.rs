//! Google's side of the local cloud, as the daemon runs it: Compute v1 and Cloud DNS (testkit's
//! emulators, in this process, on the bridge address where both the machines and the host reach
//! them), Cloud Storage (`fake-gcs-server`, relayed onto the bridge, its resumable-upload sessions
//! naming the relay), the JWK set the machines' identity tokens verify against, and a metadata
//! server on the host for `keelson` itself (the project's token, as on a GCE workstation VM).

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use testkit::cloud_dns::{CloudDns, DnsConfig};
use testkit::fake_gcs::FakeGcs;
use testkit::gce_compute::{Config, GceCompute};
use testkit::gce_metadata::{self, InstanceFacts, Signer};
use testkit::httpd::{Request, Response, Server};

use super::metadata::KEY_ID;

/// The project number the local project has (Compute names it in `created-by`).
pub const PROJECT_NUMBER: &str = "123456789012";
/// Where the JWK set is served (Google's is `https://www.googleapis.com/oauth2/v3/certs`).
pub const JWKS_PATH: &str = "/oauth2/v3/certs";
const CLOUD_PLATFORM: &str = "https://www.googleapis.com/auth/cloud-platform";

#[derive(Debug, thiserror::Error)]
pub enum GceLocalError {
    #[error("the local GCE: {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the local GCE: {0}")]
    Gcs(#[from] testkit::fake_gcs::FakeGcsError),
    #[error("the local GCE: {call}: HTTP {status}: {body}")]
    Api { call: String, status: u16, body: String },
}

fn io(what: &str) -> impl FnOnce(std::io::Error) -> GceLocalError + '_ {
    move |source| GceLocalError::Io { what: what.to_string(), source }
}

pub struct LocalGce {
    pub project: String,
    pub compute: GceCompute,
    pub dns: CloudDns,
    _api: Server,
    /// `http://<bridge>:<port>`: Compute under `/compute/v1/`, Cloud DNS under `/dns/v1/`.
    pub api_url: String,
    gcs: FakeGcs,
    /// `http://<bridge>:<port>`: what `STORAGE_EMULATOR_HOST` takes.
    pub gcs_url: String,
    _jwks: Server,
    /// Where the machines' identity tokens' keys are (the join server fetches them there).
    pub jwks_url: String,
    /// The identity tokens' signing key (PKCS#1 DER, 0600, in the state directory).
    pub signing_key: PathBuf,
    _host_metadata: Server,
    /// `GCE_METADATA_HOST` for `keelson` on the host.
    pub host_metadata: String,
}

impl LocalGce {
    /// Start Google's side for `project` in `region` (its `zones`) on the bridge address `gw`.
    /// `gcs_relay` is a listener on the bridge the caller relays to Cloud Storage
    /// ([`LocalGce::gcs_target`]).
    pub fn start(state_dir: &Path, gw: Ipv4Addr, project: &str, region: &str, zones: &[String], gcs_relay: u16) -> Result<LocalGce, GceLocalError> {
        let compute = GceCompute::new(Config {
            project: project.to_string(),
            project_number: PROJECT_NUMBER.to_string(),
            regions: BTreeMap::from([(region.to_string(), zones.to_vec())]),
            operation_delay: Duration::from_millis(200),
            // An instance is RUNNING when its machine is up: the daemon says so.
            boot_delay: None,
        });
        let dns = CloudDns::new(DnsConfig { project: project.to_string(), change_delay: Duration::from_millis(200) });
        let api = compute.start_on(SocketAddr::new(gw.into(), 0), Some(dns.clone())).map_err(io("serving Compute and Cloud DNS on the bridge"))?;
        let gcs_url = format!("http://{gw}:{gcs_relay}");
        let gcs = FakeGcs::start_with(&state_dir.join("fake-gcs.log"), Some(&gcs_url))?;
        let signing_key = state_dir.join("identity-signing-key.der");
        let signer = Signer::generate_to(&signing_key, KEY_ID).map_err(io("making the identity tokens' signing key"))?;
        let jwks_json = signer.jwks_json();
        let jwks = Server::start_on(
            SocketAddr::new(gw.into(), 0),
            Arc::new(move |req: &Request| {
                if req.method == "GET" && req.path == JWKS_PATH {
                    Response::text(200, jwks_json.clone()).header("Content-Type", "application/json")
                } else {
                    Response::text(404, "Not Found")
                }
            }),
        )
        .map_err(io("serving the JWK set"))?;
        let jwks_url = jwks.url(JWKS_PATH);
        // keelson on the host: the project's facts and a token, no instance of its own.
        let host = InstanceFacts {
            project: project.to_string(),
            numeric_project: PROJECT_NUMBER.to_string(),
            service_account: Some(format!("{PROJECT_NUMBER}-compute@developer.gserviceaccount.com")),
            scopes: vec![CLOUD_PLATFORM.into()],
            id: "0".into(),
            ..Default::default()
        };
        let host_metadata = gce_metadata::start(&host);
        Ok(LocalGce {
            project: project.to_string(),
            api_url: format!("http://{}", api.addr()),
            compute,
            dns,
            _api: api,
            gcs,
            gcs_url,
            _jwks: jwks,
            jwks_url,
            signing_key,
            host_metadata: host_metadata.addr().to_string(),
            _host_metadata: host_metadata,
        })
    }

    /// Who holds a token of the local cloud: `local-<instance id>` is that instance's service
    /// account with its scopes (as its metadata server hands it out); the host's (`local-0`) is
    /// the project's default Compute account with `cloud-platform`.
    pub fn callers(&self) -> testkit::gcs_gate::Callers {
        let compute = self.compute.clone();
        let default = testkit::gce_iam::compute_default_account(PROJECT_NUMBER);
        std::sync::Arc::new(move |token: &str| {
            let id = token.strip_prefix("local-")?;
            let member = |email: &str| format!("serviceAccount:{}", if email == "default" { default.as_str() } else { email });
            if id == "0" {
                return Some(testkit::gce_iam::Caller { member: member("default"), scopes: vec![CLOUD_PLATFORM.to_string()] });
            }
            let inst = compute.instances().into_iter().find(|i| i.id == id)?;
            let (email, scopes) = inst.service_accounts.first()?.clone();
            Some(testkit::gce_iam::Caller { member: member(&email), scopes })
        })
    }

    /// Where the Cloud Storage relay forwards to.
    pub fn gcs_target(&self) -> String {
        format!("127.0.0.1:{}", self.gcs.port)
    }

    pub fn create_bucket(&self, bucket: &str) -> Result<(), GceLocalError> {
        Ok(self.gcs.create_bucket(bucket)?)
    }

    /// Make the Cloud DNS managed zone `dns_name` (the account's existing public zone, as the
    /// user has it before kOps or Keelson runs) unless it exists.
    pub fn ensure_dns_zone(&self, dns_name: &str) -> Result<(), GceLocalError> {
        let fqdn = format!("{}.", dns_name.trim_end_matches('.'));
        let name = dns_name.trim_end_matches('.').replace('.', "-");
        let path = format!("/dns/v1/projects/{}/managedZones", self.project);
        let (status, body) = self.call_dns("POST", &path, &json!({"name": name, "dnsName": fqdn, "description": "keelson-local"}));
        match status {
            200 | 409 => Ok(()),
            _ => Err(GceLocalError::Api { call: format!("managedZones.create {fqdn}"), status, body: body.to_string() }),
        }
    }

    /// A Cloud DNS call in process (as any client would make it: with a bearer token).
    fn call_dns(&self, method: &str, path: &str, body: &Value) -> (u16, Value) {
        let req = Request {
            method: method.into(),
            path: path.into(),
            query: String::new(),
            headers: vec![("authorization".into(), "Bearer keelson-local".into()), ("content-type".into(), "application/json".into())],
            peer: "127.0.0.1:0".into(),
            body: body.to_string().into_bytes(),
        };
        let r = self.dns.answer(&req);
        let text = match r.body {
            testkit::httpd::Body::Bytes(b) => String::from_utf8_lossy(&b).into_owned(),
            _ => String::new(),
        };
        (r.status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    /// Every A record of the local Cloud DNS zones: (name without the final dot, first address).
    pub fn a_records(&self) -> Vec<(String, String)> {
        self.dns.a_records().into_iter().filter_map(|(name, ips)| Some((name.trim_end_matches('.').to_string(), ips.first()?.clone()))).collect()
    }
}

/// One REST call to the local Compute API from another process (`keelson-local kill`): plain
/// HTTP/1.1 to `api` (`http://host:port`), a bearer token as any client sends.
pub fn rest(api: &str, method: &str, path: &str) -> Result<(u16, String), GceLocalError> {
    let addr = api.trim_start_matches("http://").trim_end_matches('/').to_string();
    let what = format!("{method} {api}{path}");
    let mut s = TcpStream::connect(&addr).map_err(|source| GceLocalError::Io { what: what.clone(), source })?;
    s.set_read_timeout(Some(Duration::from_secs(30))).map_err(|source| GceLocalError::Io { what: what.clone(), source })?;
    write!(s, "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer keelson-local\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        .map_err(|source| GceLocalError::Io { what: what.clone(), source })?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).map_err(|source| GceLocalError::Io { what, source })?;
    let status = buf.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = buf.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Ok((status, body))
}
