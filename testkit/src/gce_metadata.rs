//! A GCE metadata server for tests and the local cloud. No emulator exists to install, so this one
//! follows the server's documented behaviour (cloud.google.com/compute/docs/metadata): values under
//! `/computeMetadata/v1/` as `text/plain`; every answer carries `Metadata-Flavor: Google`; a request
//! without `Metadata-Flavor: Google`, or with `X-Forwarded-For` (a proxied request), is refused with
//! 403; a directory (a path ending in `/`) lists its entries one per line, sub-directories with a
//! trailing `/`; anything else is 404. Its wire format is checked against Google's own Go client
//! (`cloud.google.com/go/compute/metadata`) by this crate's `gce_metadata_wire` test.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use base64::Engine as _;

use crate::httpd::{Request, Response, Server};

const PREFIX: &str = "/computeMetadata/v1/";

/// The instance a server describes.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct InstanceFacts {
    pub project: String,
    pub numeric_project: String,
    pub zone: String,
    pub name: String,
    pub id: String,
    pub internal_ip: String,
    /// The first interface's network (its name; none: not served).
    pub network: String,
    /// The machine type (its name; none: not served).
    pub machine_type: String,
    pub hostname: String,
    pub attributes: BTreeMap<String, String>,
    /// The default service account's email (none: the instance has no service account, and no
    /// `instance/service-accounts/` entries).
    pub service_account: Option<String>,
    /// The OAuth scopes the instance was given.
    pub scopes: Vec<String>,
}

impl InstanceFacts {
    /// A worker of `examples/gce.yaml` as tests describe it.
    pub fn example() -> InstanceFacts {
        InstanceFacts {
            project: "acme-prod".into(),
            numeric_project: "123456789012".into(),
            zone: "europe-west1-b".into(),
            name: "nodes-europe-west1-b-x7k2".into(),
            id: "4471938521837465123".into(),
            internal_ip: "10.0.16.7".into(),
            network: "default".into(),
            machine_type: "e2-standard-2".into(),
            hostname: "nodes-europe-west1-b-x7k2.europe-west1-b.c.acme-prod.internal".into(),
            attributes: BTreeMap::from([
                ("cluster-name".to_string(), "gce.k8s.example.com".to_string()),
                ("kops-k8s-io-instance-group-name".to_string(), "nodes-europe-west1-b".to_string()),
            ]),
            service_account: Some("123456789012-compute@developer.gserviceaccount.com".into()),
            scopes: vec!["https://www.googleapis.com/auth/cloud-platform".into()],
        }
    }

    /// Every value as the server holds it, by path under `/computeMetadata/v1/`.
    pub fn values(&self) -> BTreeMap<String, String> {
        let mut v = BTreeMap::from([
            ("project/project-id".to_string(), self.project.clone()),
            ("project/numeric-project-id".to_string(), self.numeric_project.clone()),
            ("instance/zone".to_string(), format!("projects/{}/zones/{}", self.numeric_project, self.zone)),
            ("instance/name".to_string(), self.name.clone()),
            ("instance/id".to_string(), self.id.clone()),
            ("instance/hostname".to_string(), self.hostname.clone()),
            ("instance/network-interfaces/0/ip".to_string(), self.internal_ip.clone()),
        ]);
        if !self.network.is_empty() {
            v.insert("instance/network-interfaces/0/network".into(), format!("projects/{}/networks/{}", self.numeric_project, self.network));
        }
        if !self.machine_type.is_empty() {
            v.insert("instance/machine-type".into(), format!("projects/{}/machineTypes/{}", self.numeric_project, self.machine_type));
        }
        for (k, val) in &self.attributes {
            v.insert(format!("instance/attributes/{k}"), val.clone());
        }
        if let Some(email) = &self.service_account {
            for account in ["default", email.as_str()] {
                let dir = format!("instance/service-accounts/{account}");
                v.insert(format!("{dir}/email"), email.clone());
                v.insert(format!("{dir}/aliases"), "default".into());
                v.insert(format!("{dir}/scopes"), self.scopes.iter().map(|s| format!("{s}\n")).collect());
                // Any bearer token passes the local cloud's emulators; the shape is the server's.
                v.insert(
                    format!("{dir}/token"),
                    serde_json::json!({"access_token": format!("local-{}", self.id), "expires_in": 3599, "token_type": "Bearer"}).to_string(),
                );
            }
        }
        v
    }
}

/// The answer to one request (pure: the server is a thin wrapper around this).
pub fn answer(values: &BTreeMap<String, String>, req: &Request) -> Response {
    let flavored = |r: Response| r.header("Metadata-Flavor", "Google");
    if req.header("x-forwarded-for").is_some() {
        return flavored(Response::text(403, "Request had X-Forwarded-For header: not allowed."));
    }
    if req.header("metadata-flavor") != Some("Google") {
        return flavored(Response::text(403, "Missing Metadata-Flavor:Google header."));
    }
    if req.method != "GET" {
        return flavored(Response::text(405, "Method not allowed."));
    }
    let Some(path) = req.path.strip_prefix(PREFIX) else {
        return flavored(Response::text(404, "Not found."));
    };
    if let Some(v) = values.get(path) {
        return flavored(Response::text(200, v.clone()));
    }
    if query_has(&req.query, "recursive", "true") {
        let dir = if path.is_empty() || path.ends_with('/') { path.to_string() } else { format!("{path}/") };
        return match recursive(values, &dir) {
            Some(tree) => flavored(Response::text(200, tree.to_string()).header("Content-Type", "application/json")),
            None => flavored(Response::text(404, "Not found.")),
        };
    }
    // A directory: its direct entries.
    let dir = if path.is_empty() || path.ends_with('/') { path.to_string() } else { format!("{path}/") };
    let entries: BTreeSet<String> = values
        .keys()
        .filter_map(|k| k.strip_prefix(&dir))
        .map(|rest| match rest.split_once('/') {
            Some((d, _)) => format!("{d}/"),
            None => rest.to_string(),
        })
        .collect();
    if entries.is_empty() {
        return flavored(Response::text(404, "Not found."));
    }
    flavored(Response::text(200, entries.into_iter().map(|e| e + "\n").collect::<String>()))
}

fn query_has(q: &str, key: &str, value: &str) -> bool {
    q.split('&').filter_map(|kv| kv.split_once('=')).any(|(k, v)| k == key && v == value)
}

/// `?recursive=true` of the directory `dir` (ending in `/`, or empty for the root): a JSON object of
/// its tree. As the server does, directory names are camelCased (`network-interfaces` →
/// `networkInterfaces`), numbered entries (`network-interfaces/0/`) become arrays, and the keys of
/// `attributes/` (the user's own) are kept as written.
fn recursive(values: &BTreeMap<String, String>, dir: &str) -> Option<serde_json::Value> {
    use serde_json::{Map, Value};
    let mut root = Map::new();
    let mut any = false;
    for (k, v) in values.iter().filter_map(|(k, v)| k.strip_prefix(dir).map(|r| (r, v))) {
        any = true;
        let parts: Vec<&str> = k.split('/').collect();
        let mut cur = &mut root;
        let mut in_attributes = dir.ends_with("attributes/");
        for (i, p) in parts.iter().enumerate() {
            let key = if in_attributes { p.to_string() } else { camel(p) };
            if i + 1 == parts.len() {
                cur.insert(key, Value::String(v.clone()));
            } else {
                in_attributes = *p == "attributes";
                cur = cur.entry(key).or_insert_with(|| Value::Object(Map::new())).as_object_mut()?;
            }
        }
    }
    fn arrays(v: Value) -> Value {
        match v {
            Value::Object(m) if !m.is_empty() && m.keys().all(|k| k.parse::<usize>().is_ok()) => {
                let mut items: Vec<(usize, Value)> = m.into_iter().filter_map(|(k, v)| k.parse().ok().map(|i| (i, arrays(v)))).collect();
                items.sort_by_key(|(i, _)| *i);
                Value::Array(items.into_iter().map(|(_, v)| v).collect())
            }
            Value::Object(m) => Value::Object(m.into_iter().map(|(k, v)| (k, arrays(v))).collect()),
            other => other,
        }
    }
    any.then(|| arrays(Value::Object(root)))
}

/// `network-interfaces` → `networkInterfaces`.
fn camel(s: &str) -> String {
    let mut out = String::new();
    let mut up = false;
    for c in s.chars() {
        if c == '-' {
            up = true;
        } else if up {
            out.extend(c.to_uppercase());
            up = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// Serve `facts` on 127.0.0.1 (what `GCE_METADATA_HOST` takes: [`Server::addr`]).
pub fn start(facts: &InstanceFacts) -> Server {
    let values = facts.values();
    Server::start(Arc::new(move |req: &Request| answer(&values, req)))
}

/// Serve `facts` and identity tokens signed by `signer` (what Google signs on GCE).
pub fn start_with_identity(facts: &InstanceFacts, signer: Arc<Signer>) -> Server {
    start_on("127.0.0.1:0".parse().expect("loopback address"), facts, signer).expect("bind 127.0.0.1")
}

/// [`start_with_identity`] on `addr` (a machine's 169.254.169.254:80 in the local cloud).
pub fn start_on(addr: std::net::SocketAddr, facts: &InstanceFacts, signer: Arc<Signer>) -> std::io::Result<Server> {
    let values = facts.values();
    let facts = facts.clone();
    let jwks = signer.jwks_json();
    Server::start_on(
        addr,
        Arc::new(move |req: &Request| {
            if req.path == JWKS_PATH && req.method == "GET" {
                // Google's key set is public: no flavor header needed (it is not a metadata value).
                return Response::text(200, jwks.clone()).header("Content-Type", "application/json");
            }
            if req.path == format!("{PREFIX}{IDENTITY_PATH}") && req.header("metadata-flavor") == Some("Google") && req.header("x-forwarded-for").is_none() {
                let q = query(&req.query);
                let Some(audience) = q.get("audience").filter(|a| !a.is_empty()) else {
                    return Response::text(400, "non-empty audience parameter required").header("Metadata-Flavor", "Google");
                };
                let full = q.get("format").map(String::as_str) == Some("full");
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
                return Response::text(200, signer.identity_token(&facts, audience, full, now)).header("Metadata-Flavor", "Google");
            }
            answer(&values, req)
        }),
    )
}

/// Where [`start_with_identity`]'s server publishes its signer's key set, as Google publishes its
/// own at `https://www.googleapis.com/oauth2/v3/certs` (the join server's JWKS URL in tests).
pub const JWKS_PATH: &str = "/oauth2/v3/certs";

/// The identity endpoint under `/computeMetadata/v1/`.
pub const IDENTITY_PATH: &str = "instance/service-accounts/default/identity";

fn query(q: &str) -> BTreeMap<String, String> {
    q.split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), percent_encoding::percent_decode_str(v).decode_utf8_lossy().into_owned()))
        .collect()
}

/// An RSA key that signs identity tokens as Google does (RS256), with its JWK for the verifier.
/// The key is made by `openssl genpkey` (ring verifies and signs RSA but does not generate it).
pub struct Signer {
    key: ring::signature::RsaKeyPair,
    pub kid: String,
}

impl Signer {
    pub fn generate(kid: &str) -> std::io::Result<Signer> {
        let dir = tempfile::tempdir()?;
        Signer::generate_to(&dir.path().join("key.der"), kid)
    }

    /// Make a key and keep it (PKCS#1 DER, mode 0600) at `der`, for [`Signer::load`] elsewhere: the
    /// local cloud's metadata servers, one per machine, all sign with the one key whose JWKS it serves.
    pub fn generate_to(der: &std::path::Path, kid: &str) -> std::io::Result<Signer> {
        use std::os::unix::fs::OpenOptionsExt as _;
        // The file exists with mode 0600 before openssl writes the key into it.
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(der)?;
        let out = std::process::Command::new("openssl")
            .args(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-outform", "DER", "-out"])
            .arg(der)
            .output()
            .map_err(|e| std::io::Error::other(format!("openssl (needed to make a test RSA key): {e}")))?;
        if !out.status.success() {
            return Err(std::io::Error::other(format!("openssl genpkey: {}", String::from_utf8_lossy(&out.stderr))));
        }
        Signer::load(der, kid)
    }

    /// The key [`Signer::generate_to`] kept.
    pub fn load(der: &std::path::Path, kid: &str) -> std::io::Result<Signer> {
        // `genpkey -outform DER` writes an RSAPrivateKey (PKCS#1).
        let key = ring::signature::RsaKeyPair::from_der(&std::fs::read(der)?).map_err(|e| std::io::Error::other(format!("RSA key {}: {e}", der.display())))?;
        Ok(Signer { key, kid: kid.to_string() })
    }

    /// The JWK set with this key (what `https://www.googleapis.com/oauth2/v3/certs` serves).
    pub fn jwks_json(&self) -> String {
        serde_json::json!({"keys": [self.jwk_json()]}).to_string()
    }

    /// This key as a JWK (what Google publishes for its keys).
    pub fn jwk(&self) -> base::node_join_gce::Jwk {
        let c: ring::rsa::PublicKeyComponents<Vec<u8>> = self.key.public().into();
        let b = |v: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        base::node_join_gce::Jwk { kid: self.kid.clone(), n: b(&c.n), e: b(&c.e) }
    }

    /// This key as Google lists it in its key set (`kty`, `alg`, `use` with `kid`, `n`, `e`).
    pub fn jwk_json(&self) -> serde_json::Value {
        let k = self.jwk();
        serde_json::json!({"kty": "RSA", "alg": "RS256", "use": "sig", "kid": k.kid, "n": k.n, "e": k.e})
    }

    /// A JWT for `claims` signed with this key.
    pub fn sign(&self, claims: &serde_json::Value) -> String {
        let b = |v: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        let header = serde_json::json!({"alg": "RS256", "kid": self.kid, "typ": "JWT"});
        let signing_input = format!("{}.{}", b(header.to_string().as_bytes()), b(claims.to_string().as_bytes()));
        let mut sig = vec![0u8; self.key.public().modulus_len()];
        let rng = ring::rand::SystemRandom::new();
        if self.key.sign(&ring::signature::RSA_PKCS1_SHA256, &rng, signing_input.as_bytes(), &mut sig).is_err() {
            return String::new();
        }
        format!("{signing_input}.{}", b(&sig))
    }

    /// The identity token of `facts` for `audience` issued at `now` (`full`: with the instance claims).
    pub fn identity_token(&self, facts: &InstanceFacts, audience: &str, full: bool, now: u64) -> String {
        let mut claims = serde_json::json!({
            "iss": "https://accounts.google.com",
            "aud": audience,
            "azp": "1234567890",
            "sub": "1234567890",
            "iat": now,
            "exp": now + 3600,
        });
        if full {
            claims["google"] = serde_json::json!({"compute_engine": {
                "instance_creation_timestamp": now.saturating_sub(600),
                "instance_id": facts.id,
                "instance_name": facts.name,
                "project_id": facts.project,
                "project_number": facts.numeric_project.parse::<u64>().unwrap_or(0),
                "zone": facts.zone,
            }});
        }
        self.sign(&claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(path: &str, headers: &[(&str, &str)]) -> Request {
        Request {
            method: "GET".into(),
            path: path.into(),
            query: String::new(),
            headers: headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            peer: "127.0.0.1:1".into(),
            body: Vec::new(),
        }
    }

    #[test]
    fn values_need_the_flavor_header_and_refuse_proxied_requests() {
        let facts = InstanceFacts { project: "p".into(), numeric_project: "12".into(), zone: "z-1".into(), name: "n".into(), ..Default::default() };
        let v = facts.values();
        let google = [("metadata-flavor", "Google")];
        let r = answer(&v, &req("/computeMetadata/v1/instance/zone", &google));
        assert_eq!(r.status, 200);
        assert!(r.headers.iter().any(|(k, v)| k == "Metadata-Flavor" && v == "Google"));
        assert_eq!(answer(&v, &req("/computeMetadata/v1/instance/zone", &[])).status, 403);
        assert_eq!(answer(&v, &req("/computeMetadata/v1/instance/zone", &[("metadata-flavor", "Google"), ("x-forwarded-for", "1.2.3.4")])).status, 403);
        assert_eq!(answer(&v, &req("/computeMetadata/v1/instance/nope", &google)).status, 404);
        let dir = answer(&v, &req("/computeMetadata/v1/instance/", &google));
        match dir.body {
            crate::httpd::Body::Bytes(b) => assert!(String::from_utf8_lossy(&b).contains("network-interfaces/\n"), "{b:?}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn service_account_token_and_recursive_directories_as_the_server_answers() {
        let v = InstanceFacts::example().values();
        let google = [("metadata-flavor", "Google")];
        let body = |r: Response| match r.body {
            crate::httpd::Body::Bytes(b) => String::from_utf8_lossy(&b).into_owned(),
            other => panic!("{other:?}"),
        };
        let token: serde_json::Value =
            serde_json::from_str(&body(answer(&v, &req("/computeMetadata/v1/instance/service-accounts/default/token", &google)))).expect("token JSON");
        assert_eq!(token["token_type"], "Bearer");
        assert!(token["expires_in"].as_u64().is_some_and(|s| s > 60), "{token}");
        let mut r = req("/computeMetadata/v1/instance/", &google);
        r.query = "recursive=true".into();
        let tree: serde_json::Value = serde_json::from_str(&body(answer(&v, &r))).expect("recursive JSON");
        assert_eq!(tree["networkInterfaces"][0]["ip"], "10.0.16.7", "camelCased directories, numbered entries as arrays: {tree}");
        assert_eq!(tree["attributes"]["kops-k8s-io-instance-group-name"], "nodes-europe-west1-b", "attribute keys as written: {tree}");
        assert_eq!(tree["serviceAccounts"]["default"]["email"], "123456789012-compute@developer.gserviceaccount.com");
        let none = InstanceFacts { service_account: None, ..InstanceFacts::example() }.values();
        assert_eq!(answer(&none, &req("/computeMetadata/v1/instance/service-accounts/default/token", &google)).status, 404, "no service account, no token");
    }
}
