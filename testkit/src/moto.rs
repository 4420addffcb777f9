//! The moto server (EC2, Auto Scaling, Route53, S3, IAM, ELBv2, STS) on 127.0.0.1: the one launcher
//! every test and `keelson-local` use. [`Moto::start`] gives a server of one's own; [`shared`] one
//! per test process, reset for each caller and held by one test at a time.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum MotoError {
    #[error("moto needs Python with moto[server]: {python} not found (set KEELSON_PYTHON, or run scripts/test which creates /work/main/.venv)")]
    NoPython { python: PathBuf },
    #[error("cannot start moto ({python} -m moto.server): {source}")]
    Spawn {
        python: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("moto on 127.0.0.1:{port} did not answer within {secs} s (log: {log})")]
    NotReady { port: u16, secs: u64, log: PathBuf },
    #[error("no free port on 127.0.0.1: {0}")]
    Port(#[source] std::io::Error),
}

/// `$KEELSON_PYTHON`, else the repository's `.venv` (created by `scripts/test`).
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("KEELSON_PYTHON").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    repo.join(".venv/bin/python")
}

pub fn free_port() -> Result<u16, MotoError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(MotoError::Port)?;
    Ok(l.local_addr().map_err(MotoError::Port)?.port())
}

/// Start `command` (program and arguments) under a watchdog shell that leads its own process group,
/// output to `log`. When this process ends (even killed), its end of the shell's stdin pipe closes and
/// the shell kills the server, so no server outlives the tests that started it.
pub fn spawn_watched(command: &[&std::ffi::OsStr], log: &Path) -> std::io::Result<Child> {
    spawn_watched_env(command, &[], log)
}

/// [`spawn_watched`] with extra environment variables for the command.
pub fn spawn_watched_env(command: &[&std::ffi::OsStr], env: &[(&str, &std::ffi::OsStr)], log: &Path) -> std::io::Result<Child> {
    let out = std::fs::File::create(log)?;
    let err = out.try_clone()?;
    let script = r#"
"$@" </dev/null & pid=$!
cat >/dev/null
kill "$pid" 2>/dev/null
wait "$pid"
"#;
    Command::new("sh").args(["-c", script, "sh"]).args(command).envs(env.iter().copied()).stdin(Stdio::piped()).stdout(out).stderr(err).process_group(0).spawn()
}

/// Kill a server started as the leader of its own process group (a watchdog shell and what it runs),
/// and reap it.
pub fn kill_group(child: Option<Child>) {
    if let Some(mut c) = child {
        let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", c.id())]).stderr(Stdio::null()).status();
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// A raw HTTP exchange with 127.0.0.1:port (no client library needed for two calls).
pub fn http(port: u16, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(s, "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())?;
    let mut buf = String::new();
    s.read_to_string(&mut buf)?;
    let status = buf.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = buf.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Ok((status, body))
}

/// `moto.server` with the documented fixes where moto differs from AWS (see the file's docstring).
const SERVER_PY: &str = include_str!("moto_server.py");

pub struct Moto {
    pub port: u16,
    child: Option<Child>,
    /// Where every request it serves is recorded, when it records ([`Moto::start_recording`]).
    calls: Option<PathBuf>,
}

impl Moto {
    pub fn start(log: &Path) -> Result<Moto, MotoError> {
        Moto::launch(log, None)
    }

    /// [`Moto::start`], recording every request it serves into `calls` (one JSON object a line,
    /// `moto_server.py` fix 10) for the IAM oracle ([`crate::moto_calls`]).
    pub fn start_recording(log: &Path, calls: &Path) -> Result<Moto, MotoError> {
        Moto::launch(log, Some(calls))
    }

    fn launch(log: &Path, calls: Option<&Path>) -> Result<Moto, MotoError> {
        let py = python();
        if !py.exists() {
            return Err(MotoError::NoPython { python: py });
        }
        let port = free_port()?;
        let env: Vec<(&str, &std::ffi::OsStr)> = calls.map(|c| (crate::moto_calls::CALLS_ENV, c.as_os_str())).into_iter().collect();
        let child = spawn_watched_env(
            &[py.as_os_str(), "-c".as_ref(), SERVER_PY.as_ref(), "-H".as_ref(), "127.0.0.1".as_ref(), "-p".as_ref(), port.to_string().as_ref()],
            &env,
            log,
        )
        .map_err(|source| MotoError::Spawn { python: py.clone(), source })?;
        let mut m = Moto { port, child: Some(child), calls: calls.map(Path::to_path_buf) };
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            if let Ok((200, _)) = http(port, "GET", "/moto-api/data.json", "") {
                break;
            }
            if Instant::now() > deadline {
                m.stop();
                return Err(MotoError::NotReady { port, secs: STARTUP_TIMEOUT.as_secs(), log: log.to_path_buf() });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // Warm-up: moto's first EC2 call is slow.
        let _ = http(port, "POST", "/", "Action=DescribeRegions&Version=2016-11-15");
        Ok(m)
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The file its requests are recorded in (`None` unless started with [`Moto::start_recording`]).
    pub fn calls(&self) -> Option<&Path> {
        self.calls.as_deref()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Forget every resource (`POST /moto-api/reset`).
    pub fn reset(&self) -> std::io::Result<()> {
        match http(self.port, "POST", "/moto-api/reset", "")? {
            (200, _) => Ok(()),
            (status, body) => Err(std::io::Error::other(format!("POST {}/moto-api/reset: HTTP {status}: {body}", self.endpoint()))),
        }
    }

    pub fn stop(&mut self) {
        // moto runs in its own process group: take its workers with it.
        kill_group(self.child.take());
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        self.stop();
    }
}

static SHARED: std::sync::OnceLock<Result<Moto, String>> = std::sync::OnceLock::new();
static SHARED_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The process's moto server (started on first use), reset, and held until the guard drops: tests
/// of one binary that use it run one at a time. Panics with the reason when moto cannot start (a
/// test that needs moto fails, never skips). It records every request it serves ([`Moto::calls`]),
/// so a test can hold what its agents did against their roles' policies ([`crate::moto_calls`]).
pub fn shared() -> (std::sync::MutexGuard<'static, ()>, &'static Moto) {
    let guard = SHARED_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let moto = SHARED.get_or_init(|| {
        let log = std::env::temp_dir().join(format!("keelson-moto-{}.log", std::process::id()));
        let calls = std::env::temp_dir().join(format!("keelson-moto-{}.calls.jsonl", std::process::id()));
        // A file left by an earlier process of the same id is not this server's record.
        let _ = std::fs::remove_file(&calls);
        Moto::start_recording(&log, &calls).map_err(|e| e.to_string())
    });
    match moto {
        Ok(m) => {
            if let Err(e) = m.reset() {
                panic!("this test needs a moto server: {e}");
            }
            (guard, m)
        }
        Err(e) => panic!("this test needs a moto server: {e}"),
    }
}

/// The process's moto server if [`shared`] has started it (no lock taken, nothing reset): for a
/// test that holds [`shared`]'s guard and wants its record ([`Moto::calls`]).
pub fn shared_started() -> Option<&'static Moto> {
    SHARED.get().and_then(|m| m.as_ref().ok())
}
