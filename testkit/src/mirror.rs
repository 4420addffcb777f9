//! An asset mirror on 127.0.0.1 with fault injection (not found, hang, corrupt, slow), fake assets
//! with the real file names and layouts, and a state-store writer: what nodeup's tests and its
//! benchmark serve nodeup from.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest as _, Sha256};

use crate::httpd::{Body, Request, Response, Server};

/// How the mirror answers a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Behaviour {
    Serve,
    NotFound,
    /// Read the request, never answer (for 60 s, or until the mirror is dropped).
    Hang,
    /// Serve the bytes with one byte flipped.
    Corrupt,
    /// Serve in 64 KiB chunks with this pause between chunks.
    Slow(Duration),
}

#[derive(Default)]
struct State {
    files: BTreeMap<String, Vec<u8>>,
    behaviour: BTreeMap<String, Behaviour>,
    hits: BTreeMap<String, usize>,
    requests: usize,
}

/// A file server on 127.0.0.1 (stopped when dropped).
pub struct Mirror {
    server: Server,
    state: Arc<Mutex<State>>,
}

fn key(path: &str) -> String {
    format!("/{}", path.trim_start_matches('/'))
}

impl Mirror {
    pub fn start() -> Mirror {
        let state = Arc::new(Mutex::new(State::default()));
        let st = state.clone();
        let server = Server::start(Arc::new(move |req: &Request| {
            let mut s = st.lock().unwrap_or_else(|e| e.into_inner());
            s.requests += 1;
            *s.hits.entry(req.path.clone()).or_default() += 1;
            let behaviour = s.behaviour.get(&req.path).cloned().unwrap_or(Behaviour::Serve);
            match (behaviour, s.files.get(&req.path).cloned()) {
                (Behaviour::Hang, _) => Response { status: 200, headers: Vec::new(), body: Body::Hang(Duration::from_secs(60)) },
                (Behaviour::NotFound, _) | (_, None) => Response::text(404, "not found\n"),
                (Behaviour::Corrupt, Some(mut bytes)) => {
                    let mid = bytes.len() / 2;
                    if let Some(b) = bytes.get_mut(mid) {
                        *b ^= 0xff;
                    }
                    Response::bytes(200, bytes)
                }
                (Behaviour::Slow(pause), Some(bytes)) => Response { status: 200, headers: Vec::new(), body: Body::Slow { bytes, pause } },
                (Behaviour::Serve, Some(bytes)) => Response::bytes(200, bytes),
            }
        }));
        Mirror { server, state }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn url(&self, path: &str) -> String {
        self.server.url(path)
    }

    pub fn put(&self, path: &str, bytes: Vec<u8>) {
        self.state().files.insert(key(path), bytes);
    }

    pub fn set(&self, path: &str, b: Behaviour) {
        self.state().behaviour.insert(key(path), b);
    }

    pub fn hits(&self, path: &str) -> usize {
        self.state().hits.get(&key(path)).copied().unwrap_or(0)
    }

    pub fn requests(&self) -> usize {
        self.state().requests
    }
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
/// `role_dir/ig`, the PKI, a bootstrap token valid for a day as the control planes' protokube
/// publishes it, and a BootConfig (returned path) pinning the config's hash.
pub fn write_state(dir: &Path, nodeup_yaml: &str, boot_yaml: &str, assets: Vec<String>, role_dir: &str) -> std::path::PathBuf {
    let mut cfg: keelson_api::nodeup::NodeupConfig = serde_yaml_ng::from_str(nodeup_yaml).expect("nodeup yaml");
    cfg.assets = BTreeMap::from([("amd64".to_string(), assets)]);
    let state = dir.join("state");
    // The PKI first: `keelson apply` pins the cluster CA into every NodeupConfig.
    base::pki::init_pki(&state, &cfg.etcd_cluster_names).expect("pki");
    let token = base::bootstrap_token::Published {
        token: base::bootstrap_token::BootstrapToken::generate().expect("token"),
        expires: std::time::SystemTime::now() + std::time::Duration::from_secs(24 * 3600),
    };
    let token_path = state.join(base::bootstrap_token::state_key());
    std::fs::create_dir_all(token_path.parent().expect("parent")).expect("mkdir secrets");
    std::fs::write(&token_path, token.to_json()).expect("publish the bootstrap token");
    let issued = std::fs::read(state.join("pki/issued/kubernetes-ca/keyset.yaml")).expect("issued CA");
    cfg.cas.insert("kubernetes-ca".into(), base::pki::parse_keyset_cert("kubernetes-ca", &issued).expect("CA certificate"));
    let bytes = serde_yaml_ng::to_string(&cfg).expect("yaml");
    let p = state.join(format!("igconfig/{role_dir}/{}/nodeupconfig.yaml", ig_name(boot_yaml)));
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(&p, &bytes).expect("write nodeupconfig");
    let mut boot: keelson_api::nodeup::BootConfig = serde_yaml_ng::from_str(boot_yaml).expect("boot yaml");
    boot.config_base = keelson_api::ConfigBase::File(state.to_path_buf());
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
