//! TCP relays: a 127.0.0.1 service (moto) exposed on the machines' bridge, and the local cloud's
//! network load balancer in front of the control planes' API servers.

use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

/// Accept on `listener` and pipe each connection to `target` (e.g. moto on 127.0.0.1).
pub async fn relay(listener: TcpListener, target: String) {
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let target = target.clone();
        tokio::spawn(async move {
            if let Ok(mut out) = TcpStream::connect(&target).await {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
            }
        });
    }
}

/// A TCP relay to whichever of `targets` (`host:port`, updated by the caller) accepts first, trying
/// them in turn from a rotating start with a short connect timeout: the local cloud's network load
/// balancer in front of the control planes' API servers.
pub async fn relay_to_any(listener: TcpListener, targets: std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    let mut next = 0usize;
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let list = targets.lock().map(|t| t.clone()).unwrap_or_default();
        next = next.wrapping_add(1);
        let start = next;
        tokio::spawn(async move {
            for i in 0..list.len() {
                let target = &list[(start + i) % list.len()];
                if let Ok(Ok(mut out)) = tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(target)).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                    return;
                }
            }
        });
    }
}
