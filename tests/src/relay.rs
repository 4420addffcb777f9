//! A TCP relay: a 127.0.0.1 service (moto) exposed on the machines' bridge. (The load balancers
//! are [`crate::balancer`].)

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
