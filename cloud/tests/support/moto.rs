//! A real moto server for tests: one per test binary, started on first use on a free 127.0.0.1 port,
//! reset at the start of every test (tests that use it hold `lock()`), and killed when the test
//! process exits (a shell watchdog kills it when our end of its stdin pipe closes).

#![allow(dead_code)]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

pub const REGION: &str = "us-east-1";

pub struct Moto {
    pub url: String,
    _child: Mutex<Child>,
}

static MOTO: OnceLock<Moto> = OnceLock::new();
static LOCK: Mutex<()> = Mutex::new(());

pub fn python() -> String {
    std::env::var("KEELSON_PYTHON")
        .unwrap_or_else(|_| format!("{}/../.venv/bin/python", env!("CARGO_MANIFEST_DIR")))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port on 127.0.0.1")
}

fn http_ok(url: &str) -> bool {
    std::process::Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-m", "2", url])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn start() -> Moto {
    let py = python();
    let ok = Command::new(&py).args(["-c", "import moto.server"]).output().map(|o| o.status.success()).unwrap_or(false);
    assert!(
        ok,
        "this test needs a moto server: `{py} -c 'import moto.server'` failed. Run scripts/test (creates .venv with \
         moto[server]) or set KEELSON_PYTHON to a Python that has moto[server]"
    );
    let port = free_port();
    let script = format!(
        "\"{py}\" -m moto.server -H 127.0.0.1 -p {port} >/dev/null 2>&1 </dev/null & pid=$!; cat >/dev/null; kill $pid; wait $pid"
    );
    let child = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn moto server");
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !http_ok(&format!("{url}/moto-api/")) {
        assert!(Instant::now() < deadline, "moto server did not answer on {url} within 60 s");
        std::thread::sleep(Duration::from_millis(200));
    }
    Moto { url, _child: Mutex::new(child) }
}

/// Serialise the tests of this binary that use moto, loop devices or mounts; reset moto.
pub fn lock() -> (MutexGuard<'static, ()>, &'static Moto) {
    let g = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let m = MOTO.get_or_init(start);
    m.reset();
    (g, m)
}

impl Moto {
    pub fn reset(&self) {
        let out = Command::new("curl")
            .args(["-s", "-f", "-m", "10", "-X", "POST", &format!("{}/moto-api/reset", self.url)])
            .output()
            .expect("curl (needed to reset moto)");
        assert!(out.status.success(), "POST /moto-api/reset failed: {:?}", out);
    }
}

/// SDK config pointing at moto with static test credentials.
pub async fn sdk(url: &str) -> cloud::aws::SdkConfig {
    let mut conf = cloud::sdk_config(&cloud::AwsOptions {
        region: Some(REGION.into()),
        endpoint_url: Some(url.into()),
        initial_backoff: Duration::from_millis(50),
        ..Default::default()
    })
    .await
    .into_builder();
    conf.set_credentials_provider(Some(aws_sdk_ec2::config::SharedCredentialsProvider::new(
        aws_sdk_ec2::config::Credentials::new("test", "test", None, None, "test"),
    )));
    conf.build()
}

