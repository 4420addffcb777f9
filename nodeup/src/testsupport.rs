//! Test and benchmark support (not part of nodeup's behaviour): a local HTTP asset mirror on
//! 127.0.0.1 with fault injection, fake assets with the real file names and layouts, and a
//! state-store writer. Used by `tests/` and the `nodeup-bench` binary.
#![doc(hidden)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};

/// How the mirror answers a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Behaviour {
    Serve,
    NotFound,
    /// Accept, read the request, never answer (until the connection is dropped, at most 60 s).
    Hang,
    /// Serve the bytes with one byte flipped.
    Corrupt,
    /// Serve in 64 KiB chunks with this pause between chunks.
    Slow(Duration),
}

struct State {
    files: BTreeMap<String, Vec<u8>>,
    behaviour: BTreeMap<String, Behaviour>,
    hits: BTreeMap<String, usize>,
}

/// A tiny HTTP/1.1 file server on 127.0.0.1.
pub struct Mirror {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    requests: Arc<AtomicUsize>,
}

impl Mirror {
    pub fn start() -> Mirror {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(Mutex::new(State { files: BTreeMap::new(), behaviour: BTreeMap::new(), hits: BTreeMap::new() }));
        let stop = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(AtomicUsize::new(0));
        let (st, sp, rq) = (state.clone(), stop.clone(), requests.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if sp.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let (st, sp, rq) = (st.clone(), sp.clone(), rq.clone());
                std::thread::spawn(move || {
                    let _ = serve(conn, &st, &sp, &rq);
                });
            }
        });
        Mirror { addr, state, stop, requests }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}/{}", self.addr, path.trim_start_matches('/'))
    }

    pub fn put(&self, path: &str, bytes: Vec<u8>) {
        self.state.lock().expect("lock").files.insert(format!("/{}", path.trim_start_matches('/')), bytes);
    }

    pub fn set(&self, path: &str, b: Behaviour) {
        self.state.lock().expect("lock").behaviour.insert(format!("/{}", path.trim_start_matches('/')), b);
    }

    pub fn hits(&self, path: &str) -> usize {
        *self.state.lock().expect("lock").hits.get(&format!("/{}", path.trim_start_matches('/'))).unwrap_or(&0)
    }

    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve(conn: TcpStream, state: &Mutex<State>, stop: &AtomicBool, requests: &AtomicUsize) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut conn = conn;
    // Keep-alive: serve requests until the client closes (bounded).
    for _ in 0..1000 {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        for _ in 0..100 {
            let mut h = String::new();
            if reader.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
                break;
            }
        }
        requests.fetch_add(1, Ordering::SeqCst);
        let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
        let (body, behaviour) = {
            let mut s = state.lock().expect("lock");
            *s.hits.entry(path.clone()).or_default() += 1;
            (s.files.get(&path).cloned(), s.behaviour.get(&path).cloned().unwrap_or(Behaviour::Serve))
        };
        match (behaviour, body) {
            (Behaviour::Hang, _) => {
                let t = Instant::now();
                while t.elapsed() < Duration::from_secs(60) && !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(50));
                    // Stop when the client went away.
                    conn.set_nonblocking(true)?;
                    let mut b = [0u8; 1];
                    let gone = matches!(conn.peek(&mut b), Ok(0));
                    conn.set_nonblocking(false)?;
                    if gone {
                        break;
                    }
                }
                return Ok(());
            }
            (Behaviour::NotFound, _) | (_, None) => {
                conn.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot found")?;
            }
            (b, Some(mut body)) => {
                if b == Behaviour::Corrupt && !body.is_empty() {
                    let mid = body.len() / 2;
                    body[mid] ^= 0xff;
                }
                conn.write_all(format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\n\r\n", body.len()).as_bytes())?;
                match b {
                    Behaviour::Slow(pause) => {
                        for chunk in body.chunks(64 * 1024) {
                            conn.write_all(chunk)?;
                            std::thread::sleep(pause);
                        }
                    }
                    _ => conn.write_all(&body)?,
                }
            }
        }
    }
    Ok(())
}

pub fn sha256_hex(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

/// Deterministic pseudo-random bytes (xorshift), incompressible like real binaries.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A fake executable: a shell script header followed by `pad` bytes of noise.
pub fn fake_binary(name: &str, pad: usize) -> Vec<u8> {
    let mut b = format!("#!/bin/sh\n# fake {name}\nexit 0\n").into_bytes();
    b.extend(noise(pad, name.len() as u64 + pad as u64));
    b
}

/// A tar.gz with `(path, bytes, mode)` entries (directories added as needed).
pub fn tar_gz(entries: &[(&str, Vec<u8>, u32)]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    for (path, bytes, mode) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_size(bytes.len() as u64);
        h.set_mode(*mode);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mtime(1_700_000_000);
        tar.append_data(&mut h, path, bytes.as_slice()).expect("tar append");
    }
    tar.into_inner().expect("tar").finish().expect("gzip")
}

/// One asset on the mirror: its URL path and bytes.
pub struct FakeAsset {
    pub path: String,
    pub bytes: Vec<u8>,
}

impl FakeAsset {
    pub fn spec(&self, urls: &[String]) -> String {
        format!("{}@{}", sha256_hex(&self.bytes), urls.join(","))
    }
}

/// The standard amd64 asset set with the real names and layouts; `pad` bytes of noise per binary.
pub fn standard_assets(pad: usize) -> Vec<FakeAsset> {
    let a = |path: &str, bytes: Vec<u8>| FakeAsset { path: path.to_string(), bytes };
    vec![
        a("release/v1.34.4/bin/linux/amd64/kubelet", fake_binary("kubelet", pad)),
        a("release/v1.34.4/bin/linux/amd64/kubectl", fake_binary("kubectl", pad)),
        a("cloud-provider-aws/v1.31.7/linux/amd64/ecr-credential-provider-linux-amd64", fake_binary("ecr-credential-provider", pad / 4)),
        a(
            "plugins/v1.8.0/cni-plugins-linux-amd64-v1.8.0.tgz",
            tar_gz(&[
                ("./bridge", fake_binary("bridge", pad / 4), 0o755),
                ("./host-local", fake_binary("host-local", pad / 4), 0o755),
                ("./loopback", fake_binary("loopback", pad / 4), 0o755),
                ("./portmap", fake_binary("portmap", pad / 4), 0o755),
                ("./LICENSE", b"license".to_vec(), 0o644),
            ]),
        ),
        a(
            "containerd/v2.3.4/containerd-2.3.4-linux-amd64.tar.gz",
            tar_gz(&[
                ("bin/containerd", fake_binary("containerd", pad), 0o755),
                ("bin/containerd-shim-runc-v2", fake_binary("containerd-shim-runc-v2", pad / 2), 0o755),
                ("bin/ctr", fake_binary("ctr", pad / 2), 0o755),
            ]),
        ),
        a("runc/v1.4.3/runc.amd64", fake_binary("runc", pad / 2)),
    ]
}

/// Write a state store at `dir`: the NodeupConfig (with `assets` as its amd64 list) for
/// `role_dir/ig`, the PKI, and a BootConfig (returned path) pinning the config's hash.
pub fn write_state(
    dir: &Path,
    nodeup_yaml: &str,
    boot_yaml: &str,
    assets: Vec<String>,
    role_dir: &str,
) -> std::path::PathBuf {
    let mut cfg: keelson_api::nodeup::NodeupConfig = serde_yaml_ng::from_str(nodeup_yaml).expect("nodeup yaml");
    cfg.assets = BTreeMap::from([("amd64".to_string(), assets)]);
    let state = dir.join("state");
    let bytes = serde_yaml_ng::to_string(&cfg).expect("yaml");
    let p = state.join(format!("igconfig/{role_dir}/{}/nodeupconfig.yaml", ig_name(boot_yaml)));
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(&p, &bytes).expect("write nodeupconfig");
    base::pki::init_pki(&state, &cfg.etcd_cluster_names).expect("pki");
    let mut boot: keelson_api::nodeup::BootConfig = serde_yaml_ng::from_str(boot_yaml).expect("boot yaml");
    boot.config_base = format!("file://{}", state.display());
    boot.nodeup_config_hash = base::nodeup_config_hash(bytes.as_bytes());
    let bp = dir.join("bootconfig.yaml");
    std::fs::write(&bp, serde_yaml_ng::to_string(&boot).expect("yaml")).expect("write boot");
    bp
}

fn ig_name(boot_yaml: &str) -> String {
    let boot: keelson_api::nodeup::BootConfig = serde_yaml_ng::from_str(boot_yaml).expect("boot yaml");
    boot.instance_group_name
}

/// Read a whole stream (helper for tests).
pub fn read_all(mut r: impl Read) -> Vec<u8> {
    let mut v = Vec::new();
    let _ = r.read_to_end(&mut v);
    v
}
