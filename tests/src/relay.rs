//! A TCP relay: a 127.0.0.1 service (moto) exposed on the machines' bridge. (The load balancers
//! are [`crate::balancer`].)
//!
//! The machines reach S3 — the state store and the backup stores — through a relay of its own
//! (`AWS_ENDPOINT_URL_S3`), which a [`Gate`] can close to play a store outage (`keelson-local chaos
//! --scenario store-outage`): connections refused (accepted and closed at once) or hanging
//! (accepted, never answered), and the connections already open cut either way.

use std::path::PathBuf;
use std::time::Duration;

use tokio::io::AsyncReadExt as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Accept on `listener` and pipe each connection to `target` (e.g. moto on 127.0.0.1).
pub async fn relay(listener: TcpListener, target: String) {
    let (_open, gate) = watch::channel(Outage::None);
    gated_relay(listener, target, gate).await
}

/// What the gated relay does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outage {
    /// Relay.
    None,
    /// Accept and close at once.
    Refuse,
    /// Accept, read, never answer.
    Hang,
}

impl Outage {
    /// The mode a gate file holds: `refuse`, `hang`; anything else (or no file) is none.
    pub fn parse(text: &str) -> Outage {
        match text.trim() {
            "refuse" => Outage::Refuse,
            "hang" => Outage::Hang,
            _ => Outage::None,
        }
    }
}

/// Follow `file` (polled every 200 ms): its mode, or [`Outage::None`] while it is absent.
pub fn follow_file(file: PathBuf) -> watch::Receiver<Outage> {
    let (tx, rx) = watch::channel(Outage::None);
    tokio::spawn(async move {
        loop {
            let mode = tokio::fs::read_to_string(&file).await.map(|t| Outage::parse(&t)).unwrap_or(Outage::None);
            tx.send_if_modified(|m| std::mem::replace(m, mode) != mode);
            if tx.is_closed() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    rx
}

/// [`relay`], with `gate` deciding what each connection gets; an open connection is cut when the
/// gate closes.
pub async fn gated_relay(listener: TcpListener, target: String, gate: watch::Receiver<Outage>) {
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let target = target.clone();
        let mut gate = gate.clone();
        tokio::spawn(async move {
            let mode = *gate.borrow_and_update();
            match mode {
                Outage::Refuse => drop(inbound),
                Outage::Hang => {
                    // Read and discard until the gate opens (or the client gives up), then close.
                    let mut sink = [0u8; 4096];
                    loop {
                        tokio::select! {
                            r = inbound.read(&mut sink) => if matches!(r, Ok(0) | Err(_)) { return },
                            c = gate.changed() => if c.is_err() || *gate.borrow() == Outage::None { return },
                        }
                    }
                }
                Outage::None => {
                    let Ok(mut out) = TcpStream::connect(&target).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut out) => {}
                        _ = async { while gate.changed().await.is_ok() { if *gate.borrow() != Outage::None { return } } } => {}
                    }
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt as _;

    #[test]
    fn modes() {
        assert_eq!(Outage::parse("refuse\n"), Outage::Refuse);
        assert_eq!(Outage::parse("hang"), Outage::Hang);
        assert_eq!(Outage::parse(""), Outage::None);
    }

    /// An echo server behind the gated relay: relayed while open, closed at once when refusing,
    /// silent when hanging, and an open connection cut when the gate closes.
    #[tokio::test]
    async fn the_gate_refuses_hangs_and_cuts() {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let echo_addr = echo.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        let front = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = front.local_addr().unwrap();
        let (tx, rx) = watch::channel(Outage::None);
        tokio::spawn(gated_relay(front, echo_addr, rx));
        let t = Duration::from_secs(2);
        let mut open = TcpStream::connect(addr).await.unwrap();
        open.write_all(b"hi").await.unwrap();
        let mut buf = [0u8; 2];
        tokio::time::timeout(t, open.read_exact(&mut buf)).await.unwrap().unwrap();
        assert_eq!(&buf, b"hi");
        tx.send(Outage::Refuse).unwrap();
        // The open connection is cut.
        let mut one = [0u8; 1];
        assert!(matches!(tokio::time::timeout(t, open.read(&mut one)).await.unwrap(), Ok(0) | Err(_)));
        let mut refused = TcpStream::connect(addr).await.unwrap();
        let _ = refused.write_all(b"x").await;
        assert!(matches!(tokio::time::timeout(t, refused.read(&mut one)).await.unwrap(), Ok(0) | Err(_)), "refused: closed at once");
        tx.send(Outage::Hang).unwrap();
        let mut hung = TcpStream::connect(addr).await.unwrap();
        hung.write_all(b"x").await.unwrap();
        assert!(tokio::time::timeout(Duration::from_millis(500), hung.read(&mut one)).await.is_err(), "hanging: no answer");
        tx.send(Outage::None).unwrap();
        let mut again = TcpStream::connect(addr).await.unwrap();
        again.write_all(b"ok").await.unwrap();
        tokio::time::timeout(t, again.read_exact(&mut buf)).await.unwrap().unwrap();
        assert_eq!(&buf, b"ok");
    }
}
