//! Cluster PKI in the state store (kOps layout) and certificates issued on the node at boot.
//!
//! # State-store layout (under `ConfigBase`)
//! - `pki/private/<name>/keyset.yaml` — kOps `Keyset` (`kind: Keyset`, `spec.type: Keypair`,
//!   `spec.primaryId`, `spec.keys[].{id, publicMaterial, privateMaterial}`; the materials are
//!   base64 of PEM). Holds the private key: readable by control-plane hosts only.
//! - `pki/issued/<name>/keyset.yaml` — the same keyset without `privateMaterial` (CA
//!   certificates workers may read).
//! - `secrets/<name>` — kOps secret JSON `{"Data": "<base64>"}`; in token mode
//!   `secrets/node-bootstrap-token` holds the current bootstrap token, which protokube mints and
//!   rotates ([`crate::bootstrap_token`]).
//!
//! Keysets created by [`init_pki`]: `kubernetes-ca`, `apiserver-aggregator-ca`,
//! `etcd-clients-ca`, `etcd-manager-ca-<etcd>`, `etcd-peers-ca-<etcd>` (per etcd cluster) and
//! `service-account` (the token-signing key, a self-signed keypair). Keys are ECDSA P-256.
//!
//! # etcd client trust, one CA per etcd cluster
//! `etcd-clients-ca` is kOps' one root for every etcd cluster's client port. Under it Keelson keeps
//! intermediates ([`ETCD_CLIENT_INTERMEDIATES`]): `etcd-clients-ca-<etcd>` signs that cluster's
//! serving certificate and its own clients (protokube, etcd's gateway), and
//! `etcd-clients-ca-kube-apiserver` signs the API server's client certificate. A member trusts
//! only its own intermediate and the API server's as clients ([`etcd_client_trust`]), so a key of
//! one etcd cluster opens no other; clients still verify servers against the root. A leaf issued
//! from an intermediate carries it (the PEM holds leaf then intermediate), so members that trust
//! only the root (an older Keelson, mid-roll) accept it.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use rcgen::{BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType};
use serde::Deserialize;

/// Why a PKI operation failed. Never carries key material.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("keyset {name}: {message}")]
    Keyset { name: String, message: String },
    #[error("certificate {cn}: {source}")]
    Issue {
        cn: String,
        #[source]
        source: rcgen::Error,
    },
    #[error("state store: {0}")]
    Store(String),
}

/// A certificate and its private key, PEM.
#[derive(Clone)]
pub struct Keypair {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Keypair {
    /// The certificate and then its key, one PEM text: a file of it is replaced with one rename, so a
    /// reader never sees a certificate with another's key (the kubelet's client certificate file).
    pub fn combined_pem(&self) -> String {
        format!("{}\n{}", self.cert_pem.trim_end(), self.key_pem)
    }
}

impl std::fmt::Debug for Keypair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keypair").field("cert_pem", &self.cert_pem.len()).field("key_pem", &"<redacted>").finish()
    }
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s.as_bytes())
}

fn unb64(name: &str, s: &str) -> Result<String, PkiError> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(s.trim())
        .map_err(|e| PkiError::Keyset { name: name.into(), message: format!("material is not base64: {e}") })?;
    String::from_utf8(bytes).map_err(|_| PkiError::Keyset { name: name.into(), message: "material is not PEM text".into() })
}

fn keyset_yaml(name: &str, id: &str, kp: &Keypair, private: bool) -> Result<String, PkiError> {
    crate::keyset::Keyset::single(name, id, kp).to_yaml(private)
}

/// The CAs whose certificates are pinned into every NodeupConfig (by `keelson apply`, or
/// `keelson compile --state`): nodeup trusts the API and join servers through these only.
pub const PINNED_CAS: &[&str] = &["kubernetes-ca"];

/// Where a CA's certificate (no private material) is in the state store, relative to `ConfigBase`.
pub fn issued_keyset_key(name: &str) -> String {
    format!("pki/issued/{name}/keyset.yaml")
}

/// The primary key of a private keyset document: the certificate and key that sign.
pub fn parse_private_keyset(name: &str, bytes: &[u8]) -> Result<Keypair, PkiError> {
    crate::keyset::Keyset::parse(name, bytes)?.primary_keypair()
}

/// Parse a keyset document's primary certificate.
pub fn parse_keyset_cert(name: &str, bytes: &[u8]) -> Result<String, PkiError> {
    Ok(crate::keyset::Keyset::parse(name, bytes)?.primary().cert_pem.clone())
}

/// A keyset document's trusted certificates, the primary's first, as one PEM bundle: what verifies
/// a peer while the keyset is being rotated ([`crate::keyset`]).
pub fn parse_keyset_trust(name: &str, bytes: &[u8]) -> Result<String, PkiError> {
    Ok(crate::keyset::Keyset::parse(name, bytes)?.trust_bundle())
}

/// The root of every etcd cluster's client trust (kOps' name).
pub const ETCD_CLIENTS_CA: &str = "etcd-clients-ca";
/// The intermediate under [`ETCD_CLIENTS_CA`] that signs the API server's etcd client certificate.
pub const ETCD_APISERVER_CLIENTS_CA: &str = "etcd-clients-ca-kube-apiserver";

/// The intermediate under [`ETCD_CLIENTS_CA`] of one etcd cluster: its serving certificate and its
/// own clients.
pub fn etcd_clients_ca(etcd_cluster: &str) -> String {
    format!("{ETCD_CLIENTS_CA}-{etcd_cluster}")
}

/// The CAs a member of `etcd_cluster` accepts client certificates from: its own intermediate and
/// the API server's, never the root (which would accept every cluster's).
pub fn etcd_client_trust(etcd_cluster: &str) -> [String; 2] {
    [etcd_clients_ca(etcd_cluster), ETCD_APISERVER_CLIENTS_CA.to_string()]
}

/// The intermediates [`init_pki`] signs with their root: `(name, root)`.
pub fn intermediates(etcd_clusters: &[String]) -> Vec<(String, &'static str)> {
    std::iter::once(ETCD_APISERVER_CLIENTS_CA.to_string()).chain(etcd_clusters.iter().map(|e| etcd_clients_ca(e))).map(|n| (n, ETCD_CLIENTS_CA)).collect()
}

/// The CA keysets a cluster needs (roots before the intermediates they sign).
pub fn ca_names(etcd_clusters: &[String]) -> Vec<String> {
    let mut names = vec!["kubernetes-ca".to_string(), "apiserver-aggregator-ca".into(), ETCD_CLIENTS_CA.into()];
    for e in etcd_clusters {
        names.push(format!("etcd-manager-ca-{e}"));
        names.push(format!("etcd-peers-ca-{e}"));
    }
    names.extend(intermediates(etcd_clusters).into_iter().map(|(n, _)| n));
    names
}

fn now() -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc()
}

fn dn(cn: &str, orgs: &[String]) -> DistinguishedName {
    let mut d = DistinguishedName::new();
    for o in orgs {
        d.push(DnType::OrganizationName, o.as_str());
    }
    d.push(DnType::CommonName, cn);
    d
}

fn ca_params(name: &str) -> CertificateParams {
    let mut p = CertificateParams::default();
    p.distinguished_name = dn(name, &[]);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    p.not_before = now() - time::Duration::hours(1);
    p.not_after = now() + time::Duration::days(3650);
    p
}

/// Create a self-signed CA.
pub fn create_ca(name: &str) -> Result<Keypair, PkiError> {
    let err = |source: rcgen::Error| PkiError::Issue { cn: name.into(), source };
    let key = KeyPair::generate().map_err(err)?;
    let mut params = ca_params(name);
    params.serial_number = Some(random_serial()?);
    let cert = params.self_signed(&key).map_err(err)?;
    Ok(Keypair { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
}

/// Create a CA `name` signed by the CA `root_name` (an intermediate, no deeper CAs under it). Its
/// certificate is only its own; leaves [`issue`]d from it carry it.
pub fn create_intermediate(name: &str, root_name: &str, root: &Keypair) -> Result<Keypair, PkiError> {
    let err = |source: rcgen::Error| PkiError::Issue { cn: name.into(), source };
    let (root_cert, root_key) = issuer(root_name, root, name)?;
    let key = KeyPair::generate().map_err(err)?;
    let mut params = ca_params(name);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.use_authority_key_identifier_extension = true;
    params.serial_number = Some(random_serial()?);
    let cert = params.signed_by(&key, &root_cert, &root_key).map_err(err)?;
    Ok(Keypair { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
}

/// The PEM a leaf issued by `ca` is written as: the leaf, then `ca`'s certificate when `ca` is an
/// intermediate (so a peer that trusts only the root can build the chain).
fn with_chain(leaf_pem: String, ca_name: &str, ca: &Keypair) -> Result<String, PkiError> {
    let info = describe_cert(&ca.cert_pem).map_err(|e| PkiError::Keyset { name: ca_name.into(), message: e.to_string() })?;
    if info.issuer_cn == info.cn {
        return Ok(leaf_pem);
    }
    Ok(format!("{}\n{}", leaf_pem.trim_end(), ca.cert_pem))
}

/// What a leaf certificate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    Client,
    Server,
    ClientServer,
}

/// A leaf certificate to issue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertSpec {
    pub cn: String,
    pub orgs: Vec<String>,
    pub dns: Vec<String>,
    pub ips: Vec<IpAddr>,
    pub usage: Usage,
}

impl CertSpec {
    pub fn client(cn: &str, orgs: &[&str]) -> CertSpec {
        CertSpec { cn: cn.into(), orgs: orgs.iter().map(|s| s.to_string()).collect(), dns: vec![], ips: vec![], usage: Usage::Client }
    }
}

/// How long the leaf certificates nodeup issues are valid (kOps' 455 days).
pub const LEAF_VALIDITY: std::time::Duration = std::time::Duration::from_secs(455 * 86400);

/// The environment variable a binary reads (at its edge, never this library) to call
/// [`set_test_max_validity`]: test clusters only, so certificates roll over within minutes.
pub const TEST_VALIDITY_ENV: &str = "KEELSON_TEST_CERT_VALIDITY_SECONDS";

static TEST_MAX_VALIDITY: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();

/// **Test only.** Cap the lifetime of the long-lived leaf certificates this process issues
/// ([`issue`]'s [`LEAF_VALIDITY`] and [`sign_csr`]'s node certificates) at `max`. Certificates
/// with a chosen short life ([`issue_for`]: the join server's own, the addon controller's, admin
/// kubeconfigs) keep theirs: whoever chose it also renews them. Set once per process; false if it
/// was already set.
pub fn set_test_max_validity(max: std::time::Duration) -> bool {
    TEST_MAX_VALIDITY.set(max).is_ok()
}

/// Parse the value of [`TEST_VALIDITY_ENV`]: whole seconds, at least 60.
pub fn parse_test_validity(value: &str) -> Result<std::time::Duration, String> {
    match value.trim().parse::<u64>() {
        Ok(s) if s >= 60 => Ok(std::time::Duration::from_secs(s)),
        _ => Err(format!("{TEST_VALIDITY_ENV}={value:?}: want whole seconds, at least 60")),
    }
}

fn capped(valid_for: std::time::Duration) -> std::time::Duration {
    match TEST_MAX_VALIDITY.get() {
        Some(max) => valid_for.min(*max),
        None => valid_for,
    }
}

/// Issue a leaf certificate signed by the CA `ca_name` (whose subject is `CN=<ca_name>`), valid
/// for [`LEAF_VALIDITY`] (or the test cap, [`set_test_max_validity`]).
pub fn issue(ca_name: &str, ca: &Keypair, spec: &CertSpec) -> Result<Keypair, PkiError> {
    issue_for(ca_name, ca, spec, capped(LEAF_VALIDITY))
}

/// [`issue`] with a chosen validity (from an hour before now, against clock skew).
pub fn issue_for(ca_name: &str, ca: &Keypair, spec: &CertSpec, valid_for: std::time::Duration) -> Result<Keypair, PkiError> {
    let err = |source: rcgen::Error| PkiError::Issue { cn: spec.cn.clone(), source };
    let (issuer, ca_key) = issuer(ca_name, ca, &spec.cn)?;
    let key = KeyPair::generate().map_err(err)?;
    let cert = leaf_params(spec, valid_for)?.signed_by(&key, &issuer, &ca_key).map_err(err)?;
    Ok(Keypair { cert_pem: with_chain(cert.pem(), ca_name, ca)?, key_pem: key.serialize_pem() })
}

/// A new private key (PEM) and a certificate signing request (PEM) for it, subject `CN=<cn>`.
/// The key stays with the caller; whoever signs the request decides the certificate's contents.
pub fn csr(cn: &str) -> Result<(String, String), PkiError> {
    let err = |source: rcgen::Error| PkiError::Issue { cn: cn.into(), source };
    let key = KeyPair::generate().map_err(err)?;
    let mut p = CertificateParams::default();
    p.distinguished_name = dn(cn, &[]);
    let req = p.serialize_request(&key).map_err(err)?;
    Ok((key.serialize_pem(), req.pem().map_err(err)?))
}

/// A self-signed certificate (PEM) for the private key `key_pem`, subject `CN=<cn>`, valid one hour:
/// how a joining node proves over TLS that it holds the key of its CSR (see
/// [`crate::node_join`]'s challenge). Nobody trusts it for its issuer, only for its key.
pub fn self_signed(key_pem: &str, cn: &str) -> Result<String, PkiError> {
    let err = |source: rcgen::Error| PkiError::Issue { cn: cn.into(), source };
    let key = KeyPair::from_pem(key_pem).map_err(err)?;
    let mut p = CertificateParams::default();
    p.distinguished_name = dn(cn, &[]);
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    p.not_before = now() - time::Duration::minutes(5);
    p.not_after = now() + time::Duration::hours(1);
    p.serial_number = Some(random_serial()?);
    Ok(p.self_signed(&key).map_err(err)?.pem())
}

/// The SubjectPublicKeyInfo (DER) a PEM certificate signing request asks to be certified.
pub fn csr_public_key(csr_pem: &str) -> Result<Vec<u8>, PkiError> {
    let bad = |m: String| PkiError::Keyset { name: "certificate signing request".into(), message: m };
    let block = ::pem::parse(csr_pem).map_err(|e| bad(format!("not PEM: {e}")))?;
    use x509_parser::prelude::FromDer as _;
    let (_, req) =
        x509_parser::certification_request::X509CertificationRequest::from_der(block.contents()).map_err(|e| bad(format!("not a PKCS#10 request: {e}")))?;
    Ok(req.certification_request_info.subject_pki.raw.to_vec())
}

/// What a certificate signing request asks to be named: its subject's common names and
/// organisations, and whether it asks for any subject alternative name or other extension
/// Kubernetes' kubelet client signer would not issue.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CsrSubject {
    pub common_names: Vec<String>,
    pub organizations: Vec<String>,
    pub alt_names: bool,
}

/// The subject of a PEM certificate signing request (see [`CsrSubject`]).
pub fn csr_subject(csr_pem: &str) -> Result<CsrSubject, PkiError> {
    let bad = |m: String| PkiError::Keyset { name: "certificate signing request".into(), message: m };
    let block = ::pem::parse(csr_pem).map_err(|e| bad(format!("not PEM: {e}")))?;
    use x509_parser::prelude::FromDer as _;
    let (_, req) =
        x509_parser::certification_request::X509CertificationRequest::from_der(block.contents()).map_err(|e| bad(format!("not a PKCS#10 request: {e}")))?;
    let subject = &req.certification_request_info.subject;
    let text = |a: &x509_parser::x509::AttributeTypeAndValue| a.as_str().map(str::to_string).map_err(|e| bad(format!("subject: {e}")));
    let common_names = subject.iter_common_name().map(text).collect::<Result<Vec<_>, _>>()?;
    let organizations = subject.iter_organization().map(text).collect::<Result<Vec<_>, _>>()?;
    let alt_names = req
        .requested_extensions()
        .is_some_and(|mut e| e.any(|x| matches!(x, x509_parser::extensions::ParsedExtension::SubjectAlternativeName(san) if !san.general_names.is_empty())));
    Ok(CsrSubject { common_names, organizations, alt_names })
}

/// The SubjectPublicKeyInfo (DER) of a DER certificate.
pub fn cert_public_key_der(cert_der: &[u8]) -> Result<Vec<u8>, PkiError> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(cert_der).map_err(|e| PkiError::Keyset { name: "certificate".into(), message: format!("not X.509: {e}") })?;
    Ok(cert.public_key().raw.to_vec())
}

/// Check an imported CA key pair (`keelson create keypair --cert --key`): the certificate is X.509 and
/// a CA (basic constraints), valid now, and the private key is the certificate's.
pub fn check_ca_keypair(name: &str, cert_pem: &str, key_pem: &str) -> Result<(), PkiError> {
    let bad = |message: String| PkiError::Keyset { name: name.into(), message };
    let block = ::pem::parse(cert_pem).map_err(|e| bad(format!("certificate: not PEM: {e}")))?;
    let (_, cert) = x509_parser::parse_x509_certificate(block.contents()).map_err(|e| bad(format!("certificate: not X.509: {e}")))?;
    let is_ca = cert.basic_constraints().ok().flatten().is_some_and(|bc| bc.value.ca);
    if !is_ca {
        return Err(bad("certificate: not a CA (basic constraints CA:TRUE expected)".into()));
    }
    if !cert.validity().is_valid() {
        return Err(bad("certificate: not valid now (expired, or not yet valid)".into()));
    }
    let key = KeyPair::from_pem(key_pem).map_err(|e| bad(format!("private key: {e}")))?;
    if key.public_key_der() != cert.public_key().raw {
        return Err(bad("the private key is not the certificate's".into()));
    }
    Ok(())
}

/// `n` random bytes from the kernel.
pub fn random_bytes(n: usize) -> Result<Vec<u8>, PkiError> {
    let mut bytes = vec![0u8; n];
    rand_core_shim::fill(&mut bytes).map_err(|e| PkiError::Store(format!("random: {e}")))?;
    Ok(bytes)
}

/// Sign the public key of `csr_pem` (whose self-signature must verify: proof the requester holds
/// the key) as the leaf `spec`: the request's own subject and extensions are ignored.
pub fn sign_csr(ca_name: &str, ca: &Keypair, csr_pem: &str, spec: &CertSpec, valid_for: std::time::Duration) -> Result<String, PkiError> {
    let err = |source: rcgen::Error| PkiError::Issue { cn: spec.cn.clone(), source };
    let request = rcgen::CertificateSigningRequestParams::from_pem(csr_pem).map_err(err)?;
    let (issuer, ca_key) = issuer(ca_name, ca, &spec.cn)?;
    let signed = rcgen::CertificateSigningRequestParams { params: leaf_params(spec, capped(valid_for))?, public_key: request.public_key };
    Ok(signed.signed_by(&issuer, &ca_key).map_err(err)?.pem())
}

/// The CA as an rcgen issuer: rebuilt from its subject and key, so the leaf names the issuer by DN
/// and key id, both of which match the stored CA certificate.
fn issuer(ca_name: &str, ca: &Keypair, cn: &str) -> Result<(rcgen::Certificate, KeyPair), PkiError> {
    let ca_key = KeyPair::from_pem(&ca.key_pem).map_err(|e| PkiError::Keyset { name: ca_name.into(), message: format!("private key: {e}") })?;
    let issuer = ca_params(ca_name).self_signed(&ca_key).map_err(|source| PkiError::Issue { cn: cn.into(), source })?;
    Ok((issuer, ca_key))
}

fn leaf_params(spec: &CertSpec, valid_for: std::time::Duration) -> Result<CertificateParams, PkiError> {
    let err = |source: rcgen::Error| PkiError::Issue { cn: spec.cn.clone(), source };
    let mut p = CertificateParams::default();
    p.distinguished_name = dn(&spec.cn, &spec.orgs);
    for d in &spec.dns {
        let name = rcgen::Ia5String::try_from(d.as_str()).map_err(err)?;
        p.subject_alt_names.push(SanType::DnsName(name));
    }
    p.subject_alt_names.extend(spec.ips.iter().map(|ip| SanType::IpAddress(*ip)));
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    p.extended_key_usages = match spec.usage {
        Usage::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
        Usage::Server => vec![ExtendedKeyUsagePurpose::ServerAuth],
        Usage::ClientServer => vec![ExtendedKeyUsagePurpose::ClientAuth, ExtendedKeyUsagePurpose::ServerAuth],
    };
    p.use_authority_key_identifier_extension = true;
    p.serial_number = Some(random_serial().map_err(|e| PkiError::Store(format!("certificate {}: {e}", spec.cn)))?);
    p.not_before = now() - backdate(valid_for);
    p.not_after = now() + time::Duration::seconds(i64::try_from(valid_for.as_secs()).unwrap_or(i64::MAX / 2));
    Ok(p)
}

/// Length of a certificate serial number: 128 random bits (RFC 5280 allows up to 20 octets).
const SERIAL_LEN: usize = 16;

/// A fresh random serial number, positive. Never left to rcgen, which derives an unset serial from
/// the public key: two certificates of one key (a CSR signed again, a renewal that keeps its key)
/// would share it, and a serial must name one certificate of an issuer.
fn random_serial() -> Result<rcgen::SerialNumber, PkiError> {
    let mut bytes = random_bytes(SERIAL_LEN)?;
    // Positive (top bit clear) and of full length (second bit set).
    bytes[0] = (bytes[0] & 0x7f) | 0x40;
    Ok(rcgen::SerialNumber::from_slice(&bytes))
}

/// How far before now a leaf's validity starts (against clock skew between hosts): an hour, or a
/// tenth of a shorter life, so a short-lived certificate is not mostly spent at birth (renewal
/// decides on the whole `notBefore..notAfter` span).
fn backdate(valid_for: std::time::Duration) -> time::Duration {
    let secs = (valid_for.as_secs() / 10).min(3600);
    time::Duration::seconds(i64::try_from(secs).unwrap_or(3600))
}

/// What a certificate says of itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    pub cn: String,
    pub issuer_cn: String,
    pub not_before: std::time::SystemTime,
    pub not_after: std::time::SystemTime,
    /// The serial number, lower-case hex.
    pub serial: String,
}

/// Read the subject and issuer common names and the validity of a PEM certificate.
pub fn describe_cert(cert_pem: &str) -> Result<CertInfo, PkiError> {
    let bad = |m: String| PkiError::Keyset { name: "certificate".into(), message: m };
    let block = ::pem::parse(cert_pem).map_err(|e| bad(format!("not PEM: {e}")))?;
    let (_, cert) = x509_parser::parse_x509_certificate(block.contents()).map_err(|e| bad(format!("not X.509: {e}")))?;
    let cn = |name: &x509_parser::x509::X509Name| name.iter_common_name().next().and_then(|c| c.as_str().ok()).unwrap_or_default().to_string();
    let at = |t: x509_parser::time::ASN1Time| std::time::UNIX_EPOCH + std::time::Duration::from_secs(u64::try_from(t.timestamp()).unwrap_or(0));
    Ok(CertInfo {
        cn: cn(cert.subject()),
        issuer_cn: cn(cert.issuer()),
        not_before: at(cert.validity().not_before),
        not_after: at(cert.validity().not_after),
        serial: hex::encode(cert.raw_serial()),
    })
}

/// The [`CertSpec`] a certificate was issued for (subject CN and organisations, DNS and IP
/// names, client/server usage): what reissuing it the same needs.
pub fn spec_of(cert_pem: &str) -> Result<CertSpec, PkiError> {
    use x509_parser::extensions::GeneralName;
    let bad = |m: String| PkiError::Keyset { name: "certificate".into(), message: m };
    let block = ::pem::parse(cert_pem).map_err(|e| bad(format!("not PEM: {e}")))?;
    let (_, cert) = x509_parser::parse_x509_certificate(block.contents()).map_err(|e| bad(format!("not X.509: {e}")))?;
    let text = |a: &x509_parser::x509::AttributeTypeAndValue| a.as_str().map(str::to_string).map_err(|e| bad(format!("subject: {e}")));
    let cn = cert.subject().iter_common_name().next().map(text).transpose()?.unwrap_or_default();
    let orgs = cert.subject().iter_organization().map(text).collect::<Result<Vec<_>, _>>()?;
    let (mut dns, mut ips) = (Vec::new(), Vec::new());
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(d) => dns.push(d.to_string()),
                GeneralName::IPAddress(b) => match b.len() {
                    4 => ips.push(IpAddr::from(<[u8; 4]>::try_from(*b).map_err(|_| bad("IP SAN".into()))?)),
                    16 => ips.push(IpAddr::from(<[u8; 16]>::try_from(*b).map_err(|_| bad("IP SAN".into()))?)),
                    n => return Err(bad(format!("IP SAN of {n} bytes"))),
                },
                other => return Err(bad(format!("subject alternative name {other:?} is not one Keelson issues"))),
            }
        }
    }
    let eku = cert.extended_key_usage().map_err(|e| bad(format!("extended key usage: {e}")))?;
    let (client, server) = eku.map(|e| (e.value.client_auth, e.value.server_auth)).unwrap_or((false, false));
    let usage = match (client, server) {
        (true, true) => Usage::ClientServer,
        (true, false) => Usage::Client,
        (false, true) => Usage::Server,
        (false, false) => return Err(bad(format!("CN={cn}: neither client nor server usage"))),
    };
    Ok(CertSpec { cn, orgs, dns, ips, usage })
}

/// The public key (PEM) of a private key (PEM), e.g. the service-account verification key.
pub fn public_key_pem(key_pem: &str) -> Result<String, PkiError> {
    let key = KeyPair::from_pem(key_pem).map_err(|e| PkiError::Keyset { name: "service-account".into(), message: format!("private key: {e}") })?;
    Ok(key.public_key_pem())
}

/// Write `bytes` to `path` only if nothing is there (never overwrites); true if written.
pub(crate) fn create_new(path: &Path, bytes: &[u8], mode: u32) -> Result<bool, PkiError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let io = |source| PkiError::Io { path: path.to_path_buf(), source };
    if path.exists() {
        return Ok(false);
    }
    let dir = path.parent().unwrap_or(Path::new("/"));
    crate::fs::ensure_dir(dir).map_err(|e| PkiError::Io { path: e.path, source: e.source })?;
    let tmp = crate::fs::temp_path_for(path);
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp).map_err(io)?;
    let written = f.write_all(bytes).and_then(|_| f.sync_all());
    // A hard link fails if the target exists: the no-overwrite guarantee holds even if two
    // runs race.
    let linked = written.and_then(|_| std::fs::hard_link(&tmp, path));
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => {
            let _ = crate::fs::sync_dir(dir);
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(io(e)),
    }
}

/// Random bytes from the kernel (no extra dependency).
pub(crate) mod rand_core_shim {
    pub fn fill(buf: &mut [u8]) -> std::io::Result<()> {
        use std::io::Read as _;
        std::fs::File::open("/dev/urandom")?.read_exact(buf)
    }
}

/// Name of the secret holding the current node bootstrap token (token mode; see
/// [`crate::bootstrap_token`]).
pub const BOOTSTRAP_TOKEN_SECRET: &str = "node-bootstrap-token";

/// Encode a kOps secret document.
pub fn secret_json(data: &str) -> String {
    format!("{{\"Data\":\"{}\"}}\n", b64(data))
}

/// Decode a kOps secret document.
pub fn parse_secret(name: &str, bytes: &[u8]) -> Result<String, PkiError> {
    #[derive(Deserialize)]
    struct Secret {
        #[serde(rename = "Data")]
        data: String,
    }
    let s: Secret = serde_json::from_slice(bytes).map_err(|e| PkiError::Keyset { name: name.into(), message: e.to_string() })?;
    unb64(name, &s.data)
}

/// Create the cluster's CAs and service-account key in a file state store (`state_dir` is the
/// `ConfigBase` directory). Idempotent: an existing keyset is never replaced. Returns the names
/// created. (Bootstrap tokens are not made here: protokube mints them, [`crate::bootstrap_token`].)
pub fn init_pki(state_dir: &Path, etcd_clusters: &[String]) -> Result<Vec<String>, PkiError> {
    let mut created = Vec::new();
    let mut names = ca_names(etcd_clusters);
    names.push("service-account".into());
    let intermediates = intermediates(etcd_clusters);
    for name in names {
        let private = state_dir.join(format!("pki/private/{name}/keyset.yaml"));
        let issued = state_dir.join(format!("pki/issued/{name}/keyset.yaml"));
        if private.exists() {
            // Make sure the public half exists too (it is derived, so writing it is safe).
            if !issued.exists() {
                let bytes = std::fs::read(&private).map_err(|source| PkiError::Io { path: private.clone(), source })?;
                let kp = parse_private_keyset(&name, &bytes)?;
                let id = serial_id();
                create_new(&issued, keyset_yaml(&name, &id, &kp, false)?.as_bytes(), 0o644)?;
            }
            continue;
        }
        let kp = match intermediates.iter().find(|(n, _)| *n == name) {
            Some((_, root)) => {
                let rel = state_dir.join(format!("pki/private/{root}/keyset.yaml"));
                let bytes = std::fs::read(&rel).map_err(|source| PkiError::Io { path: rel.clone(), source })?;
                create_intermediate(&name, root, &parse_private_keyset(root, &bytes)?)?
            }
            None => create_ca(&name)?,
        };
        let id = serial_id();
        if create_new(&private, keyset_yaml(&name, &id, &kp, true)?.as_bytes(), 0o600)? {
            create_new(&issued, keyset_yaml(&name, &id, &kp, false)?.as_bytes(), 0o644)?;
            created.push(name);
        }
    }
    Ok(created)
}

/// A new key's id: kOps keyset ids are decimal serials that grow with time; the creation time in
/// nanoseconds is unique enough for one writer (the store lock keeps writers apart).
pub fn serial_id() -> String {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    format!("{}", t.as_nanos())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imported_ca_pairs_are_checked() {
        let ca = create_ca("kubernetes-ca").expect("ca");
        check_ca_keypair("kubernetes-ca", &ca.cert_pem, &ca.key_pem).expect("a CA and its key");
        let other = create_ca("kubernetes-ca").expect("ca");
        let e = check_ca_keypair("kubernetes-ca", &ca.cert_pem, &other.key_pem).expect_err("another key").to_string();
        assert!(e.contains("not the certificate's"), "{e}");
        let leaf = issue("kubernetes-ca", &ca, &CertSpec::client("admin", &[])).expect("leaf");
        let e = check_ca_keypair("kubernetes-ca", &leaf.cert_pem, &leaf.key_pem).expect_err("a leaf").to_string();
        assert!(e.contains("not a CA"), "{e}");
        let e = check_ca_keypair("kubernetes-ca", "junk", &ca.key_pem).expect_err("junk").to_string();
        assert!(e.contains("not PEM"), "{e}");
    }

    #[test]
    fn init_is_idempotent_and_never_overwrites() {
        let d = tempfile::tempdir().expect("tempdir");
        let created = init_pki(d.path(), &["main".into(), "events".into()]).expect("init");
        assert!(created.contains(&"kubernetes-ca".to_string()));
        assert!(created.contains(&"etcd-peers-ca-events".to_string()));
        let p = d.path().join("pki/private/kubernetes-ca/keyset.yaml");
        let before = std::fs::read(&p).expect("read");
        assert_eq!(crate::fs::mode_of(&p), Some(0o600));
        assert!(init_pki(d.path(), &["main".into(), "events".into()]).expect("again").is_empty());
        assert_eq!(std::fs::read(&p).expect("read"), before);
        let kp = parse_private_keyset("kubernetes-ca", &before).expect("parse");
        let issued = std::fs::read(d.path().join("pki/issued/kubernetes-ca/keyset.yaml")).expect("issued");
        assert_eq!(parse_keyset_cert("kubernetes-ca", &issued).expect("cert"), kp.cert_pem);
        assert!(!String::from_utf8_lossy(&issued).contains("privateMaterial"));
        assert!(!d.path().join("secrets/node-bootstrap-token").exists(), "no static bootstrap token");
    }

    #[test]
    fn each_etcd_cluster_has_its_own_client_intermediate_and_leaves_carry_it() {
        let d = tempfile::tempdir().expect("tempdir");
        let created = init_pki(d.path(), &["main".into(), "events".into()]).expect("init");
        for name in ["etcd-clients-ca-main", "etcd-clients-ca-events", ETCD_APISERVER_CLIENTS_CA] {
            assert!(created.contains(&name.to_string()), "{name} not created: {created:?}");
            let kp = parse_private_keyset(name, &std::fs::read(d.path().join(format!("pki/private/{name}/keyset.yaml"))).expect("read")).expect("parse");
            let info = describe_cert(&kp.cert_pem).expect("describe");
            assert_eq!((info.cn.as_str(), info.issuer_cn.as_str()), (name, ETCD_CLIENTS_CA));
        }
        let main = parse_private_keyset("etcd-clients-ca-main", &std::fs::read(d.path().join("pki/private/etcd-clients-ca-main/keyset.yaml")).expect("read"))
            .expect("parse");
        let leaf = issue("etcd-clients-ca-main", &main, &CertSpec::client("protokube", &[])).expect("leaf");
        let blocks = ::pem::parse_many(&leaf.cert_pem).expect("pem");
        assert_eq!(blocks.len(), 2, "leaf then its intermediate");
        assert_eq!(blocks[1].contents(), ::pem::parse(&main.cert_pem).expect("pem").contents());
        assert_eq!(describe_cert(&leaf.cert_pem).expect("leaf").issuer_cn, "etcd-clients-ca-main");
        // A root's leaves stay one certificate.
        let root = create_ca("kubernetes-ca").expect("root");
        assert_eq!(::pem::parse_many(&issue("kubernetes-ca", &root, &CertSpec::client("x", &[])).expect("leaf").cert_pem).expect("pem").len(), 1);
        assert_eq!(etcd_client_trust("events"), ["etcd-clients-ca-events".to_string(), ETCD_APISERVER_CLIENTS_CA.to_string()]);
    }

    #[test]
    fn a_csrs_subject_is_read_as_asked() {
        let key = KeyPair::generate().expect("key");
        let mut p = CertificateParams::default();
        p.distinguished_name = dn("system:node:ip-10-0-1-5", &["system:nodes".to_string()]);
        let pem = p.serialize_request(&key).expect("csr").pem().expect("pem");
        let s = csr_subject(&pem).expect("subject");
        assert_eq!(s, CsrSubject { common_names: vec!["system:node:ip-10-0-1-5".into()], organizations: vec!["system:nodes".into()], alt_names: false });
        p.subject_alt_names = vec![rcgen::SanType::DnsName("api.internal.c".try_into().expect("name"))];
        assert!(csr_subject(&p.serialize_request(&key).expect("csr").pem().expect("pem")).expect("subject").alt_names);
        assert!(csr_subject("not a csr").is_err());
    }

    #[test]
    fn issues_leaf_signed_by_ca() {
        let ca = create_ca("kubernetes-ca").expect("ca");
        let spec = CertSpec {
            cn: "kubernetes-master".into(),
            orgs: vec![],
            dns: vec!["kubernetes".into(), "api.internal.example.com".into()],
            ips: vec!["100.64.0.1".parse().expect("ip")],
            usage: Usage::Server,
        };
        let leaf = issue("kubernetes-ca", &ca, &spec).expect("issue");
        assert!(leaf.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(leaf.key_pem.contains("PRIVATE KEY"));
        assert!(!format!("{leaf:?}").contains("PRIVATE"), "Debug never shows the key");
        // Verified with openssl in the integration tests when available.
    }

    #[test]
    fn the_spec_of_an_issued_certificate_is_what_it_was_issued_for() {
        let ca = create_ca("etcd-peers-ca-main").expect("ca");
        let specs = [
            CertSpec {
                cn: "etcd-a".into(),
                orgs: vec![],
                dns: vec!["etcd-a.internal.example.com".into(), "localhost".into()],
                ips: vec!["127.0.0.1".parse().expect("ip"), "10.0.1.5".parse().expect("ip"), "fd00::5".parse().expect("ip")],
                usage: Usage::ClientServer,
            },
            CertSpec::client("system:node:ip-10-0-0-1.ec2.internal", &["system:nodes"]),
            CertSpec { cn: "kubernetes-master".into(), orgs: vec![], dns: vec!["kubernetes".into()], ips: vec![], usage: Usage::Server },
        ];
        for spec in specs {
            let leaf = issue("etcd-peers-ca-main", &ca, &spec).expect("issue");
            assert_eq!(spec_of(&leaf.cert_pem).expect("spec"), spec);
            let again = issue("etcd-peers-ca-main", &ca, &spec_of(&leaf.cert_pem).expect("spec")).expect("reissue");
            let (a, b) = (describe_cert(&leaf.cert_pem).expect("a"), describe_cert(&again.cert_pem).expect("b"));
            assert_ne!(a.serial, b.serial, "a reissued certificate has a new serial");
            assert_eq!((a.cn, a.issuer_cn), (b.cn, b.issuer_cn));
        }
        assert!(spec_of("not a certificate").is_err());
    }

    #[test]
    fn signs_a_csr_with_the_signers_subject_only_and_refuses_a_forged_one() {
        let ca = create_ca("kubernetes-ca").expect("ca");
        let (key_pem, csr_pem) = csr("system:node:anything-i-like").expect("csr");
        let spec = CertSpec::client("system:node:ip-10-0-0-1.ec2.internal", &["system:nodes"]);
        let cert_pem = sign_csr("kubernetes-ca", &ca, &csr_pem, &spec, std::time::Duration::from_secs(3600)).expect("sign");
        let der = ::pem::parse(&cert_pem).expect("pem");
        let (_, cert) = x509_parser::parse_x509_certificate(der.contents()).expect("x509");
        assert_eq!(cert.subject().to_string(), "O=system:nodes, CN=system:node:ip-10-0-0-1.ec2.internal");
        assert_eq!(cert.issuer().to_string(), "CN=kubernetes-ca");
        let info = describe_cert(&cert_pem).expect("describe");
        assert_eq!((info.cn.as_str(), info.issuer_cn.as_str()), ("system:node:ip-10-0-0-1.ec2.internal", "kubernetes-ca"));
        let life = info.not_after.duration_since(info.not_before).expect("ordered");
        assert_eq!(life.as_secs(), 3600 + 360, "valid from a tenth of its life before now, for an hour");
        // The certificate is for the requester's key.
        let public = KeyPair::from_pem(&key_pem).expect("key").public_key_der();
        assert_eq!(cert.public_key().raw, public.as_slice());
        // A CSR whose signature does not verify (one byte of the request body changed) is refused.
        let mut der = ::pem::parse(&csr_pem).expect("pem").into_contents();
        let n = der.len() / 2;
        der[n] ^= 1;
        let broken = ::pem::encode(&::pem::Pem::new("CERTIFICATE REQUEST", der));
        assert!(sign_csr("kubernetes-ca", &ca, &broken, &spec, std::time::Duration::from_secs(3600)).is_err());
    }

    /// A serial names one certificate of its issuer: two certificates of one key (a CSR signed
    /// again, the node join's kubelet certificate and its renewal) get two serials, random, positive.
    #[test]
    fn two_certificates_of_one_key_have_distinct_serials() {
        let ca = create_ca("kubernetes-ca").expect("ca");
        let (key_pem, csr_pem) = csr("n").expect("csr");
        let spec = CertSpec::client("system:node:n", &["system:nodes"]);
        let valid = std::time::Duration::from_secs(3600);
        let serials: Vec<String> = (0..3)
            .map(|_| describe_cert(&sign_csr("kubernetes-ca", &ca, &csr_pem, &spec, valid).expect("sign")).expect("describe").serial)
            .chain([self_signed(&key_pem, "n").expect("a"), self_signed(&key_pem, "n").expect("b")].iter().map(|c| describe_cert(c).expect("d").serial))
            .collect();
        let distinct: std::collections::BTreeSet<&String> = serials.iter().collect();
        assert_eq!(distinct.len(), serials.len(), "{serials:?}");
        for s in &serials {
            assert_eq!(s.len(), 2 * SERIAL_LEN, "{s}");
            assert!(u8::from_str_radix(&s[..2], 16).expect("hex") < 0x80, "positive: {s}");
        }
    }
}
