//! `fake-gcs-server` (github.com/fsouza/fake-gcs-server, the Cloud Storage emulator Google's own
//! client tests use), started per test on 127.0.0.1 over plain HTTP with an in-memory backend, and
//! stopped with the test (a watchdog shell owns it, as for moto). `scripts/test` installs the pinned
//! version with `go install`; [`binary`] says where it is looked for.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use crate::moto::{free_port, http, kill_group, spawn_watched};

/// The version `scripts/test` installs.
pub const VERSION: &str = "v1.56.1";
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum FakeGcsError {
    #[error("fake-gcs-server not found at {path} (install it: go install github.com/fsouza/fake-gcs-server@{VERSION}, as scripts/test does; or set KEELSON_FAKE_GCS_SERVER)")]
    Missing { path: PathBuf },
    #[error("starting {path}: {source}")]
    Spawn { path: PathBuf, source: std::io::Error },
    #[error("fake-gcs-server on port {port} did not answer within {secs} s (log: {log})")]
    NotReady { port: u16, secs: u64, log: PathBuf },
    #[error("creating bucket {bucket}: {message}")]
    Bucket { bucket: String, message: String },
    #[error(transparent)]
    Moto(#[from] crate::moto::MotoError),
}

/// `$KEELSON_FAKE_GCS_SERVER`, else `$GOBIN`/`$GOPATH/bin`/`~/go/bin` `fake-gcs-server`.
pub fn binary() -> PathBuf {
    if let Some(p) = std::env::var_os("KEELSON_FAKE_GCS_SERVER").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let bin = std::env::var_os("GOBIN")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("GOPATH").filter(|p| !p.is_empty()).map(|p| PathBuf::from(p).join("bin")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join("go/bin")))
        .unwrap_or_else(|| PathBuf::from("/root/go/bin"));
    bin.join("fake-gcs-server")
}

pub struct FakeGcs {
    pub port: u16,
    child: Option<Child>,
}

impl FakeGcs {
    pub fn start(log: &Path) -> Result<FakeGcs, FakeGcsError> {
        FakeGcs::start_with(log, None)
    }

    /// Start with `external_url` as the address its answers name (resumable-upload sessions):
    /// where clients reach it when that is not 127.0.0.1 (the local cloud's relay on its bridge).
    pub fn start_with(log: &Path, external_url: Option<&str>) -> Result<FakeGcs, FakeGcsError> {
        let path = binary();
        if !path.is_file() {
            return Err(FakeGcsError::Missing { path });
        }
        let port = free_port()?;
        let port_arg = port.to_string();
        let url = external_url.map(str::to_string).unwrap_or_else(|| format!("http://127.0.0.1:{port}"));
        let args: [&std::ffi::OsStr; 13] = [
            path.as_os_str(),
            "-scheme".as_ref(),
            "http".as_ref(),
            "-host".as_ref(),
            "127.0.0.1".as_ref(),
            "-port".as_ref(),
            port_arg.as_ref(),
            "-backend".as_ref(),
            "memory".as_ref(),
            "-external-url".as_ref(),
            url.as_ref(),
            "-log-level".as_ref(),
            "warn".as_ref(),
        ];
        let child = spawn_watched(&args, log).map_err(|source| FakeGcsError::Spawn { path: path.clone(), source })?;
        let mut s = FakeGcs { port, child: Some(child) };
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            if let Ok((200, _)) = http(port, "GET", "/storage/v1/b", "") {
                return Ok(s);
            }
            if Instant::now() > deadline {
                s.stop();
                return Err(FakeGcsError::NotReady { port, secs: STARTUP_TIMEOUT.as_secs(), log: log.to_path_buf() });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `http://127.0.0.1:PORT`, what `STORAGE_EMULATOR_HOST` takes.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Create a bucket (`POST /storage/v1/b`).
    pub fn create_bucket(&self, bucket: &str) -> Result<(), FakeGcsError> {
        let body = format!("{{\"name\":\"{bucket}\"}}");
        match http(self.port, "POST", "/storage/v1/b?project=keelson-test", &body) {
            Ok((200, _)) => Ok(()),
            Ok((status, text)) => Err(FakeGcsError::Bucket { bucket: bucket.into(), message: format!("HTTP {status}: {text}") }),
            Err(e) => Err(FakeGcsError::Bucket { bucket: bucket.into(), message: e.to_string() }),
        }
    }

    pub fn stop(&mut self) {
        // The server runs in the watchdog's process group: take both.
        kill_group(self.child.take());
    }
}

impl Drop for FakeGcs {
    fn drop(&mut self) {
        self.stop();
    }
}
