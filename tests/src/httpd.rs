//! A small HTTP/1.1 server (one request per connection, `Connection: close`) for the two things
//! the local cloud serves: instance metadata and the asset mirror. Plus a TCP relay that exposes a
//! 127.0.0.1 service (moto) on the machines' bridge.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const MAX_HEAD: usize = 16 * 1024;
const MAX_BODY: usize = 1024 * 1024;
const IO_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub query: String,
    /// Lower-case names.
    pub headers: Vec<(String, String)>,
    /// The peer's address.
    pub peer: String,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug)]
pub enum Body {
    Bytes(Vec<u8>),
    File(PathBuf),
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Body,
}

impl Response {
    pub fn text(status: u16, text: impl Into<String>) -> Response {
        Response {
            status,
            headers: vec![("Content-Type".into(), "text/plain".into())],
            body: Body::Bytes(text.into().into_bytes()),
        }
    }
    pub fn bytes(status: u16, bytes: Vec<u8>) -> Response {
        Response {
            status,
            headers: vec![("Content-Type".into(), "application/octet-stream".into())],
            body: Body::Bytes(bytes),
        }
    }
    pub fn header(mut self, name: &str, value: impl Into<String>) -> Response {
        self.headers.push((name.to_string(), value.into()));
        self
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        500 => "Internal Server Error",
        _ => "Status",
    }
}

pub type Handler = Arc<dyn Fn(&Request) -> Response + Send + Sync>;

/// Serve until the listener fails; each connection on its own task.
pub async fn serve(listener: TcpListener, handler: Handler) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let h = handler.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(IO_TIMEOUT * 20, connection(stream, peer.to_string(), h))
                .await;
        });
    }
}

async fn connection(mut s: TcpStream, peer: String, h: Handler) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let head_end = loop {
        let mut chunk = [0u8; 2048];
        let n = tokio::time::timeout(IO_TIMEOUT, s.read(&mut chunk))
            .await
            .map_err(|_| std::io::Error::other("read timeout"))??;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        if buf.len() > MAX_HEAD {
            return write_response(&mut s, "GET", Response::text(400, "header too large")).await;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let first = lines.next().unwrap_or("");
    let mut parts = first.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let target = parts.next().unwrap_or("/").to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    // Discard a request body (IMDS token PUTs have none; be lenient).
    let len: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut have = buf.len() - (head_end + 4);
    while have < len.min(MAX_BODY) {
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(IO_TIMEOUT, s.read(&mut chunk))
            .await
            .map_err(|_| std::io::Error::other("read timeout"))??;
        if n == 0 {
            break;
        }
        have += n;
    }
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p.to_string(), q.to_string()),
        None => (target.clone(), String::new()),
    };
    let req = Request {
        method: method.clone(),
        path,
        query,
        headers,
        peer,
    };
    let resp = h(&req);
    write_response(&mut s, &method, resp).await
}

async fn write_response(s: &mut TcpStream, method: &str, resp: Response) -> std::io::Result<()> {
    let (len, file) = match &resp.body {
        Body::Bytes(b) => (b.len() as u64, None),
        Body::File(p) => match tokio::fs::File::open(p).await {
            Ok(f) => (f.metadata().await?.len(), Some(f)),
            Err(_) => {
                return Box::pin(write_response(s, method, Response::text(404, "not found\n")))
                    .await
            }
        },
    };
    let mut head = format!("HTTP/1.1 {} {}\r\n", resp.status, reason(resp.status));
    for (n, v) in &resp.headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str(&format!("Content-Length: {len}\r\nConnection: close\r\n\r\n"));
    s.write_all(head.as_bytes()).await?;
    if method != "HEAD" {
        match (resp.body, file) {
            (Body::Bytes(b), _) => s.write_all(&b).await?,
            (Body::File(_), Some(mut f)) => {
                tokio::io::copy(&mut f, s).await?;
            }
            _ => {}
        }
    }
    s.flush().await?;
    let _ = s.shutdown().await;
    Ok(())
}

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
