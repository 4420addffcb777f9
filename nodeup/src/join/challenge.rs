//! The node's answer to the join server's call back ([`base::node_join`], step 5): while a join
//! request is pending, listen on the challenge port with a certificate for the kubelet CSR's own
//! key, and answer each challenge line with its nonce and the pending body's sha256.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base::node_join;

use super::JoinError;

/// How long one challenger may take.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Challengers answered at once.
const MAX_CONCURRENT: usize = 16;
/// How often the accept loop looks whether it should stop.
const POLL: Duration = Duration::from_millis(50);

/// The listening responder; stops (and frees the port) when dropped.
pub struct Responder {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Responder {
    pub fn start(listen: SocketAddr, key_pem: &str, cn: &str, body_sha256: String) -> Result<Responder, JoinError> {
        let fail = |m: String| JoinError::Identity(format!("join challenge responder on {listen}: {m}"));
        let cert_pem = base::pki::self_signed(key_pem, cn).map_err(|e| fail(e.to_string()))?;
        use rustls::pki_types::pem::PemObject as _;
        let cert = rustls::pki_types::CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(|e| fail(e.to_string()))?;
        let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| fail(e.to_string()))?;
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| fail(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(vec![cert], key)
            .map_err(|e| fail(e.to_string()))?;
        let config = Arc::new(config);
        let listener = TcpListener::bind(listen).map_err(|e| fail(e.to_string()))?;
        listener.set_nonblocking(true).map_err(|e| fail(e.to_string()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let busy = Arc::new(AtomicUsize::new(0));
        let thread = std::thread::Builder::new()
            .name("join-challenge".into())
            .spawn(move || {
                while !stopped.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, peer)) => {
                            // A few challengers at once, each on its own thread: a slow one does not
                            // hold up the join server's call back.
                            if busy.fetch_add(1, Ordering::SeqCst) >= MAX_CONCURRENT {
                                busy.fetch_sub(1, Ordering::SeqCst);
                                continue;
                            }
                            let (config, body_sha256, done) = (config.clone(), body_sha256.clone(), busy.clone());
                            let spawned = std::thread::Builder::new().name("join-challenge-conn".into()).spawn(move || {
                                match answer(stream, config, &body_sha256) {
                                    Ok(()) => tracing::info!(%peer, "join challenge answered"),
                                    Err(e) => tracing::debug!(%peer, error = %e, "join challenge: not answered"),
                                }
                                done.fetch_sub(1, Ordering::SeqCst);
                            });
                            if spawned.is_err() {
                                busy.fetch_sub(1, Ordering::SeqCst);
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(POLL),
                        Err(e) => {
                            tracing::warn!(error = %e, "join challenge: accept failed");
                            std::thread::sleep(POLL);
                        }
                    }
                }
            })
            .map_err(|e| fail(e.to_string()))?;
        Ok(Responder { stop, thread: Some(thread) })
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One challenger: handshake, read the challenge line, answer.
fn answer(stream: TcpStream, config: Arc<rustls::ServerConfig>, body_sha256: &str) -> Result<(), String> {
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(IO_TIMEOUT)).map_err(|e| e.to_string())?;
    stream.set_write_timeout(Some(IO_TIMEOUT)).map_err(|e| e.to_string())?;
    let conn = rustls::ServerConnection::new(config).map_err(|e| e.to_string())?;
    let mut tls = rustls::StreamOwned::new(conn, stream);
    let mut line = String::new();
    BufReader::new((&mut tls).take(node_join::CHALLENGE_MAX_LINE as u64)).read_line(&mut line).map_err(|e| e.to_string())?;
    let reply = node_join::answer_challenge(&line, body_sha256).map_err(|e| e.to_string())?;
    tls.write_all(reply.as_bytes()).map_err(|e| e.to_string())?;
    tls.flush().map_err(|e| e.to_string())?;
    tls.conn.send_close_notify();
    let _ = tls.flush();
    Ok(())
}
