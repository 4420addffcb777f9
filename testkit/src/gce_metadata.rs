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
#[derive(Debug, Clone, Default)]
pub struct InstanceFacts {
    pub project: String,
    pub numeric_project: String,
    pub zone: String,
    pub name: String,
    pub id: String,
    pub internal_ip: String,
    pub hostname: String,
    pub attributes: BTreeMap<String, String>,
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
            hostname: "nodes-europe-west1-b-x7k2.europe-west1-b.c.acme-prod.internal".into(),
            attributes: BTreeMap::from([
                ("cluster-name".to_string(), "gce.k8s.example.com".to_string()),
                ("kops-k8s-io-instance-group-name".to_string(), "nodes-europe-west1-b".to_string()),
            ]),
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
        for (k, val) in &self.attributes {
            v.insert(format!("instance/attributes/{k}"), val.clone());
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

/// Serve `facts` on 127.0.0.1 (what `GCE_METADATA_HOST` takes: [`Server::addr`]).
pub fn start(facts: &InstanceFacts) -> Server {
    let values = facts.values();
    Server::start(Arc::new(move |req: &Request| answer(&values, req)))
}

/// Serve `facts` and identity tokens signed by `signer` (what Google signs on GCE).
pub fn start_with_identity(facts: &InstanceFacts, signer: Arc<Signer>) -> Server {
    let values = facts.values();
    let facts = facts.clone();
    let jwks = serde_json::json!({"keys": [signer.jwk_json()]}).to_string();
    Server::start(Arc::new(move |req: &Request| {
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
    }))
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
        let der = dir.path().join("key.der");
        let out = std::process::Command::new("openssl")
            .args(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-outform", "DER", "-out"])
            .arg(&der)
            .output()
            .map_err(|e| std::io::Error::other(format!("openssl (needed to make a test RSA key): {e}")))?;
        if !out.status.success() {
            return Err(std::io::Error::other(format!("openssl genpkey: {}", String::from_utf8_lossy(&out.stderr))));
        }
        // `genpkey -outform DER` writes an RSAPrivateKey (PKCS#1).
        let key = ring::signature::RsaKeyPair::from_der(&std::fs::read(&der)?).map_err(|e| std::io::Error::other(format!("RSA key: {e}")))?;
        Ok(Signer { key, kid: kid.to_string() })
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
}
