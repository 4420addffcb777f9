//! A small HTTP/1.1 server (one request per connection, `Connection: close`): what the local cloud
//! and the tests serve — instance metadata and asset mirrors. [`serve`] runs on the caller's runtime;
//! [`Server::start`] runs one on 127.0.0.1 on its own thread for synchronous tests.

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
    /// The request body (up to 1 MiB).
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

#[derive(Debug)]
pub enum Body {
    Bytes(Vec<u8>),
    File(PathBuf),
    /// The bytes in 64 KiB chunks with `pause` between them (a slow mirror).
    Slow {
        bytes: Vec<u8>,
        pause: Duration,
    },
    /// Read the request, then say nothing for this long (a hung server).
    Hang(Duration),
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Body,
}

impl Response {
    pub fn text(status: u16, text: impl Into<String>) -> Response {
        Response { status, headers: vec![("Content-Type".into(), "text/plain".into())], body: Body::Bytes(text.into().into_bytes()) }
    }
    pub fn bytes(status: u16, bytes: Vec<u8>) -> Response {
        Response { status, headers: vec![("Content-Type".into(), "application/octet-stream".into())], body: Body::Bytes(bytes) }
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
        409 => "Conflict",
        412 => "Precondition Failed",
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
            let _ = tokio::time::timeout(IO_TIMEOUT * 20, connection(stream, peer.to_string(), h)).await;
        });
    }
}

async fn connection(mut s: TcpStream, peer: String, h: Handler) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let head_end = loop {
        let mut chunk = [0u8; 2048];
        let n = tokio::time::timeout(IO_TIMEOUT, s.read(&mut chunk)).await.map_err(|_| std::io::Error::other("read timeout"))??;
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
    let headers: Vec<(String, String)> = lines.filter_map(|l| l.split_once(':')).map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string())).collect();
    // The request body (IMDS token PUTs have none; be lenient).
    let len: usize = headers.iter().find(|(n, _)| n == "content-length").and_then(|(_, v)| v.parse().ok()).unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < len.min(MAX_BODY) {
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(IO_TIMEOUT, s.read(&mut chunk)).await.map_err(|_| std::io::Error::other("read timeout"))??;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(len.min(MAX_BODY));
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p.to_string(), q.to_string()),
        None => (target.clone(), String::new()),
    };
    let req = Request { method: method.clone(), path, query, headers, peer, body };
    let resp = h(&req);
    write_response(&mut s, &method, resp).await
}

async fn write_response(s: &mut TcpStream, method: &str, resp: Response) -> std::io::Result<()> {
    let (len, file) = match &resp.body {
        Body::Hang(d) => {
            tokio::time::sleep(*d).await;
            return Ok(());
        }
        Body::Bytes(b) | Body::Slow { bytes: b, .. } => (b.len() as u64, None),
        Body::File(p) => match tokio::fs::File::open(p).await {
            Ok(f) => (f.metadata().await?.len(), Some(f)),
            Err(_) => return Box::pin(write_response(s, method, Response::text(404, "not found\n"))).await,
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
            (Body::Slow { bytes, pause }, _) => {
                for chunk in bytes.chunks(64 * 1024) {
                    s.write_all(chunk).await?;
                    s.flush().await?;
                    tokio::time::sleep(pause).await;
                }
            }
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

/// A server on 127.0.0.1 (a free port) with its own runtime thread, stopped when dropped.
pub struct Server {
    addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Server {
    /// Start serving `handler`. Panics if 127.0.0.1 cannot be bound (a test fixture).
    pub fn start(handler: Handler) -> Server {
        Server::start_on("127.0.0.1:0".parse().expect("loopback address"), handler).expect("bind 127.0.0.1")
    }

    /// Start serving `handler` on `addr` (port 0: a free one), e.g. the local cloud's bridge
    /// address, where its machines reach it.
    pub fn start_on(addr: std::net::SocketAddr, handler: Handler) -> std::io::Result<Server> {
        let std_listener = std::net::TcpListener::bind(addr)?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("test server runtime");
            rt.block_on(async move {
                let listener = TcpListener::from_std(std_listener).expect("tokio listener");
                tokio::select! {
                    _ = serve(listener, handler) => {}
                    _ = stopped => {}
                }
            });
            rt.shutdown_timeout(Duration::from_millis(200));
        });
        Ok(Server { addr, stop: Some(stop) })
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>/<path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}/{}", self.addr, path.trim_start_matches('/'))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
