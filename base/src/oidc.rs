//! The service-account issuer's OpenID discovery documents (IRSA): what a cluster whose
//! `serviceAccountIssuerDiscovery.discoveryStore` is set publishes there, so that a relying party
//! (AWS STS through the IAM OIDC provider) can check the API server's service-account tokens
//! without reaching the cluster (kOps `pkg/model/issuerdiscovery.go`).
//!
//! Two documents under the issuer URL: `.well-known/openid-configuration` (issuer, JWKS URI, what
//! the tokens carry) and `openid/v1/jwks` (the public keys of the `service-account` keyset that is
//! not distrusted, each with the key id the API server puts in its tokens' `kid`: the unpadded
//! base64url of the SHA-256 of the key's DER SubjectPublicKeyInfo).

use base64::Engine as _;
use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};
use x509_parser::prelude::FromDer as _;
use x509_parser::public_key::PublicKey;

use crate::keyset::Keyset;
use crate::pki::PkiError;

/// Where the discovery document lives under the issuer (and the discovery store).
pub const OPENID_CONFIGURATION_PATH: &str = ".well-known/openid-configuration";
/// Where the key set lives under the issuer (and the discovery store).
pub const JWKS_PATH: &str = "openid/v1/jwks";

/// The JWKS URI of an issuer: the API server's `--service-account-jwks-uri` and the discovery
/// document's `jwks_uri`.
pub fn jwks_uri(issuer: &str) -> String {
    format!("{issuer}/{JWKS_PATH}")
}

/// The documents to publish, by their path under the discovery store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryDocuments {
    pub openid_configuration: Vec<u8>,
    pub jwks: Vec<u8>,
}

impl DiscoveryDocuments {
    /// `(path under the store, bytes)`, the discovery document first.
    pub fn files(&self) -> [(&'static str, &[u8]); 2] {
        [(OPENID_CONFIGURATION_PATH, &self.openid_configuration), (JWKS_PATH, &self.jwks)]
    }
}

fn bad(name: &str, message: String) -> PkiError {
    PkiError::Keyset { name: name.to_string(), message }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// One certificate's public key as a JWK (EC P-256/P-384 or RSA), with its key id.
fn jwk(keyset: &str, id: &str, cert_pem: &str) -> Result<Value, PkiError> {
    let block = ::pem::parse(cert_pem).map_err(|e| bad(keyset, format!("key {id}: certificate is not PEM: {e}")))?;
    let (_, cert) =
        x509_parser::certificate::X509Certificate::from_der(block.contents()).map_err(|e| bad(keyset, format!("key {id}: not an X.509 certificate: {e}")))?;
    let spki = cert.public_key();
    let kid = b64(&Sha256::digest(spki.raw));
    let parsed = spki.parsed().map_err(|e| bad(keyset, format!("key {id}: public key: {e}")))?;
    match parsed {
        PublicKey::EC(point) => {
            let curve = spki.algorithm.parameters.as_ref().and_then(|p| p.as_oid().ok()).map(|o| o.to_id_string());
            let (crv, alg, len) = match curve.as_deref() {
                Some("1.2.840.10045.3.1.7") => ("P-256", "ES256", 32),
                Some("1.3.132.0.34") => ("P-384", "ES384", 48),
                other => return Err(bad(keyset, format!("key {id}: EC curve {other:?} (expected P-256 or P-384)"))),
            };
            let data = point.data();
            if data.len() != 1 + 2 * len || data[0] != 4 {
                return Err(bad(keyset, format!("key {id}: expected an uncompressed {crv} point")));
            }
            Ok(json!({"use": "sig", "kty": "EC", "kid": kid, "crv": crv, "alg": alg, "x": b64(&data[1..=len]), "y": b64(&data[1 + len..])}))
        }
        PublicKey::RSA(rsa) => {
            let strip = |b: &[u8]| b.iter().position(|&x| x != 0).map_or_else(Vec::new, |i| b[i..].to_vec());
            Ok(json!({"use": "sig", "kty": "RSA", "kid": kid, "alg": "RS256", "n": b64(&strip(rsa.modulus)), "e": b64(&strip(rsa.exponent))}))
        }
        _ => Err(bad(keyset, format!("key {id}: expected an EC or RSA public key"))),
    }
}

/// The discovery documents of `issuer` for the keys of the `service-account` keyset that are
/// not distrusted (sorted by key id, as kOps does).
pub fn discovery_documents(issuer: &str, keyset: &Keyset) -> Result<DiscoveryDocuments, PkiError> {
    let mut keys = Vec::new();
    for k in keyset.keys.iter().filter(|k| k.distrust_timestamp.is_none()) {
        keys.push(jwk(&keyset.name, &k.id, &k.cert_pem)?);
    }
    if keys.is_empty() {
        return Err(bad(&keyset.name, "no trusted key to publish".into()));
    }
    keys.sort_by(|a, b| a["kid"].as_str().cmp(&b["kid"].as_str()));
    let mut algs: Vec<&str> = keys.iter().filter_map(|k| k["alg"].as_str()).collect();
    algs.sort_unstable();
    algs.dedup();
    let config = json!({
        "issuer": issuer,
        "jwks_uri": jwks_uri(issuer),
        "authorization_endpoint": "urn:kubernetes:programmatic_authorization",
        "response_types_supported": ["id_token"],
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": algs,
        "claims_supported": ["sub", "iss"],
    });
    let pretty = |v: &Value| serde_json::to_vec_pretty(v).unwrap_or_else(|_| unreachable!("a JSON value always serialises"));
    Ok(DiscoveryDocuments { openid_configuration: pretty(&config), jwks: pretty(&json!({"keys": keys})) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyset::KeysetKey;

    fn self_signed(alg: &'static rcgen::SignatureAlgorithm) -> (String, rcgen::KeyPair) {
        let key = rcgen::KeyPair::generate_for(alg).expect("key");
        let cert = rcgen::CertificateParams::new(vec![]).expect("params").self_signed(&key).expect("cert");
        (cert.pem(), key)
    }

    fn keyset(keys: Vec<(&str, String, Option<&str>)>) -> Keyset {
        Keyset {
            name: "service-account".into(),
            primary_id: keys[0].0.into(),
            keys: keys
                .into_iter()
                .map(|(id, cert_pem, distrust)| KeysetKey { id: id.into(), cert_pem, key_pem: None, distrust_timestamp: distrust.map(str::to_string) })
                .collect(),
        }
    }

    #[test]
    fn the_jwks_holds_every_trusted_key_with_the_api_servers_key_id() {
        let (a, ka) = self_signed(&rcgen::PKCS_ECDSA_P256_SHA256);
        let (b, _) = self_signed(&rcgen::PKCS_ECDSA_P256_SHA256);
        let (c, _) = self_signed(&rcgen::PKCS_ECDSA_P256_SHA256);
        let ks = keyset(vec![("1", a, None), ("2", b, None), ("3", c, Some("2026-01-01T00:00:00Z"))]);
        let docs = discovery_documents("https://d.example.com/c", &ks).expect("documents");
        let jwks: Value = serde_json::from_slice(&docs.jwks).expect("json");
        let keys = jwks["keys"].as_array().expect("keys");
        assert_eq!(keys.len(), 2, "the distrusted key is not published: {jwks}");
        // The kid is SHA-256 of the DER SPKI, the API server's rule: computed here from the key pair.
        let want = b64(&Sha256::digest(ka.public_key_der()));
        assert!(keys.iter().any(|k| k["kid"] == want), "{jwks}");
        let mut kids: Vec<&str> = keys.iter().map(|k| k["kid"].as_str().unwrap_or("")).collect();
        let sorted = {
            let mut s = kids.clone();
            s.sort_unstable();
            s
        };
        assert_eq!(kids, sorted);
        kids.dedup();
        assert_eq!(kids.len(), 2);
        let k = &keys[0];
        assert_eq!((k["kty"].as_str(), k["crv"].as_str(), k["alg"].as_str(), k["use"].as_str()), (Some("EC"), Some("P-256"), Some("ES256"), Some("sig")));
        // x and y are the point's coordinates: 32 bytes each.
        for c in ["x", "y"] {
            let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(k[c].as_str().unwrap_or("")).expect("base64url");
            assert_eq!(raw.len(), 32, "{c}");
        }
    }

    #[test]
    fn the_discovery_document_names_the_issuer_and_its_jwks() {
        let (a, _) = self_signed(&rcgen::PKCS_ECDSA_P256_SHA256);
        let docs = discovery_documents("https://bucket.s3.eu-west-1.amazonaws.com/c", &keyset(vec![("1", a, None)])).expect("documents");
        let d: Value = serde_json::from_slice(&docs.openid_configuration).expect("json");
        assert_eq!(d["issuer"], "https://bucket.s3.eu-west-1.amazonaws.com/c");
        assert_eq!(d["jwks_uri"], "https://bucket.s3.eu-west-1.amazonaws.com/c/openid/v1/jwks");
        assert_eq!(d["id_token_signing_alg_values_supported"], json!(["ES256"]));
        assert_eq!(d["response_types_supported"], json!(["id_token"]));
        assert_eq!(docs.files()[0].0, ".well-known/openid-configuration");
        assert_eq!(docs.files()[1].0, "openid/v1/jwks");
    }

    #[test]
    fn rsa_keys_and_bad_keysets() {
        let (a, _) = self_signed(&rcgen::PKCS_ECDSA_P384_SHA384);
        let docs = discovery_documents("https://i", &keyset(vec![("1", a, None)])).expect("P-384");
        let jwks: Value = serde_json::from_slice(&docs.jwks).expect("json");
        assert_eq!(jwks["keys"][0]["crv"], "P-384");
        let all_distrusted = keyset(vec![("1", self_signed(&rcgen::PKCS_ECDSA_P256_SHA256).0, Some("t"))]);
        assert!(discovery_documents("https://i", &all_distrusted).unwrap_err().to_string().contains("no trusted key"));
        let not_pem = keyset(vec![("7", "garbage".into(), None)]);
        let e = discovery_documents("https://i", &not_pem).unwrap_err().to_string();
        assert!(e.contains("service-account") && e.contains("key 7"), "{e}");
    }
}
