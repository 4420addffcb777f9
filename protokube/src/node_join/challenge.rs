//! The join server's call back to a joining node (see [`base::node_join`], step 5): TLS 1.3 to the
//! instance's private IP, accepting only a certificate for the public key of the node's kubelet
//! CSR, then one challenge line and one answer. A TLS 1.3 handshake makes the node sign the
//! transcript (which holds our fresh random) with that key: proof, live, that whoever answers on
//! the instance's address holds the key the certificates will be issued for.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use base::node_join;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// How long the whole call back may take.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// Accepts exactly one public key, whatever the certificate's issuer, names or dates.
#[derive(Debug)]
struct PinnedKey {
    spki: Vec<u8>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for PinnedKey {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let spki = base::pki::cert_public_key_der(end_entity.as_ref()).map_err(|e| rustls::Error::General(e.to_string()))?;
        if spki != self.spki {
            return Err(rustls::Error::General("the node's certificate is not for the key of its kubelet CSR".into()));
        }
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(&self, _: &[u8], _: &CertificateDer<'_>, _: &DigitallySignedStruct) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::General("TLS 1.2 is not accepted for the join challenge".into()))
    }
    fn verify_tls13_signature(&self, message: &[u8], cert: &CertificateDer<'_>, dss: &DigitallySignedStruct) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// Why the call back failed (said to the refused node, so nothing secret).
#[derive(Debug, thiserror::Error)]
pub enum ChallengeError {
    #[error("calling the node back at {addr}: {message}")]
    Failed { addr: SocketAddr, message: String },
}

/// Call the node back at `addr`; it must hold the private key of `spki` and be waiting for the join
/// request whose body hashes to `body_sha256`.
pub async fn call_back(addr: SocketAddr, spki: Vec<u8>, body_sha256: &str) -> Result<(), ChallengeError> {
    let fail = |message: String| ChallengeError::Failed { addr, message };
    let nonce = hex::encode(base::pki::random_bytes(32).map_err(|e| fail(e.to_string()))?);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| fail(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(PinnedKey { spki, provider }))
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let exchange = async {
        let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| fail(e.to_string()))?;
        let tls = connector.connect(ServerName::IpAddress(addr.ip().into()), tcp).await.map_err(|e| fail(format!("TLS: {e}")))?;
        let mut tls = BufReader::new(tls);
        tls.get_mut().write_all(node_join::challenge_line(&nonce).as_bytes()).await.map_err(|e| fail(e.to_string()))?;
        tls.get_mut().flush().await.map_err(|e| fail(e.to_string()))?;
        let mut answer = String::new();
        let mut limited = (&mut tls).take(node_join::CHALLENGE_MAX_LINE as u64);
        limited.read_line(&mut answer).await.map_err(|e| fail(e.to_string()))?;
        node_join::check_challenge_answer(&answer, &nonce, body_sha256).map_err(|e| fail(e.to_string()))
    };
    tokio::time::timeout(TIMEOUT, exchange).await.map_err(|_| fail(format!("no answer within {} s", TIMEOUT.as_secs())))?
}
