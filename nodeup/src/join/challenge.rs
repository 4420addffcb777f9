//! The node's answer to the join server's call back ([`base::node_join`], step 5): while a join
//! request is pending, listen on the challenge port with a certificate for the kubelet CSR's own
//! key, and answer each challenge line with its nonce and the pending body's sha256.
//!
//! Anything on the node's network can connect (pods included): each challenger gets
//! [`CONN_DEADLINE`] for the whole exchange however slowly it sends (a per-read timeout alone lets
//! a client that drips a byte at a time hold its thread for ever), at most [`MAX_PER_SOURCE`] at
//! once from one address, [`MAX_CONCURRENT`] in all.

use std::collections::HashMap;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::IpAddr;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base::node_join;

use super::JoinError;

/// How long one read or write of a challenger may wait.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one challenger's whole exchange may take (handshake, challenge, answer).
pub const CONN_DEADLINE: Duration = Duration::from_secs(10);
/// Challengers answered at once.
pub const MAX_CONCURRENT: usize = 16;
/// Challengers answered at once from one address.
pub const MAX_PER_SOURCE: usize = 4;
/// How often the accept loop looks whether it should stop.
const POLL: Duration = Duration::from_millis(50);

/// The listening responder; stops (and frees the port) when dropped.
pub struct Responder {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    local: SocketAddr,
}

/// Connections in flight per source address.
#[derive(Default)]
struct PerSource(Mutex<HashMap<IpAddr, usize>>);

impl PerSource {
    fn enter(&self, ip: IpAddr) -> bool {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(ip).or_default();
        if *n >= MAX_PER_SOURCE {
            return false;
        }
        *n += 1;
        true
    }
    fn leave(&self, ip: IpAddr) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                m.remove(&ip);
            }
        }
    }
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
        let local = listener.local_addr().map_err(|e| fail(e.to_string()))?;
        let sources = Arc::new(PerSource::default());
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
                            if !sources.enter(peer.ip()) {
                                continue;
                            }
                            if busy.fetch_add(1, Ordering::SeqCst) >= MAX_CONCURRENT {
                                busy.fetch_sub(1, Ordering::SeqCst);
                                sources.leave(peer.ip());
                                continue;
                            }
                            let (config, body_sha256, done, left) = (config.clone(), body_sha256.clone(), busy.clone(), sources.clone());
                            let spawned = std::thread::Builder::new().name("join-challenge-conn".into()).spawn(move || {
                                match answer(stream, config, &body_sha256, Instant::now() + CONN_DEADLINE) {
                                    Ok(()) => tracing::info!(%peer, "join challenge answered"),
                                    Err(e) => tracing::debug!(%peer, error = %e, "join challenge: not answered"),
                                }
                                done.fetch_sub(1, Ordering::SeqCst);
                                left.leave(peer.ip());
                            });
                            if spawned.is_err() {
                                busy.fetch_sub(1, Ordering::SeqCst);
                                sources.leave(peer.ip());
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
        Ok(Responder { stop, thread: Some(thread), local })
    }

    /// Where it listens (the port chosen when started on port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }
}

/// A stream whose every read and write waits at most until `deadline` (and [`IO_TIMEOUT`]).
struct Deadline {
    stream: TcpStream,
    deadline: Instant,
}

impl Deadline {
    fn left(&self) -> std::io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, format!("the exchange's deadline of {} s passed", CONN_DEADLINE.as_secs())));
        }
        Ok(left.min(IO_TIMEOUT))
    }
}

impl std::io::Read for Deadline {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.left()?;
        self.stream.set_read_timeout(Some(left))?;
        self.stream.read(buf)
    }
}

impl std::io::Write for Deadline {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let left = self.left()?;
        self.stream.set_write_timeout(Some(left))?;
        self.stream.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.stream.flush()
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
fn answer(stream: TcpStream, config: Arc<rustls::ServerConfig>, body_sha256: &str, deadline: Instant) -> Result<(), String> {
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    let conn = rustls::ServerConnection::new(config).map_err(|e| e.to_string())?;
    let mut tls = rustls::StreamOwned::new(conn, Deadline { stream, deadline });
    let mut line = String::new();
    BufReader::new((&mut tls).take(node_join::CHALLENGE_MAX_LINE as u64)).read_line(&mut line).map_err(|e| e.to_string())?;
    let reply = node_join::answer_challenge(&line, body_sha256).map_err(|e| e.to_string())?;
    tls.write_all(reply.as_bytes()).map_err(|e| e.to_string())?;
    tls.flush().map_err(|e| e.to_string())?;
    tls.conn.send_close_notify();
    let _ = tls.flush();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn responder() -> Responder {
        let (key, _csr) = base::pki::csr("system:node:n").expect("key");
        Responder::start(SocketAddr::from(([127, 0, 0, 1], 0)), &key, "system:node:n", "00".repeat(32)).expect("start")
    }

    #[test]
    fn a_challenger_that_drips_bytes_is_cut_off_at_the_deadline() {
        let r = responder();
        let mut c = TcpStream::connect(r.local_addr()).expect("connect");
        c.set_read_timeout(Some(Duration::from_millis(300))).expect("timeout");
        // One byte of a TLS ClientHello every 300 ms: each read of the responder is answered well
        // within its per-read timeout, so only a deadline for the whole exchange ends it.
        let hello = [0x16u8, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03];
        let polls = (CONN_DEADLINE.as_millis() / 300) as usize * 3;
        let mut closed = false;
        for i in 0..polls {
            if c.write_all(&hello[i % hello.len()..][..1]).is_err() {
                closed = true;
                break;
            }
            let mut b = [0u8; 64];
            match c.read(&mut b) {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                _ => {
                    closed = true;
                    break;
                }
            }
        }
        assert!(closed, "the responder still held a dripping connection after {polls} drips of 300 ms (deadline {CONN_DEADLINE:?})");
    }

    #[test]
    fn one_address_holds_a_few_challengers_at_most() {
        let r = responder();
        let held: Vec<TcpStream> = (0..MAX_PER_SOURCE).map(|_| TcpStream::connect(r.local_addr()).expect("connect")).collect();
        std::thread::sleep(POLL * 6);
        // The next one from the same address is closed unanswered.
        let mut extra = TcpStream::connect(r.local_addr()).expect("connect");
        extra.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        let mut b = [0u8; 8];
        assert!(matches!(extra.read(&mut b), Ok(0) | Err(_)), "refused: closed at once");
        drop(held);
    }
}
