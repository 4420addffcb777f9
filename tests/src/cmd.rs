//! Running host tools (`ip`, `losetup`, `mount`, `nsenter`, …) with errors that say what ran.

use std::process::{Command, Output, Stdio};

#[derive(Debug, thiserror::Error)]
pub enum CmdError {
    #[error("cannot run {program}: {source} (is it installed? scripts/test installs what the local cloud needs)")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed { command: String, status: String, stderr: String },
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Run to completion; stdout on success, an error carrying the command line and stderr otherwise.
pub fn run(cmd: &mut Command) -> Result<String, CmdError> {
    let out = output(cmd)?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(CmdError::Failed { command: describe(cmd), status: out.status.to_string(), stderr: String::from_utf8_lossy(&out.stderr).trim().to_string() })
    }
}

/// Run to completion and return the raw output whatever the exit status.
pub fn output(cmd: &mut Command) -> Result<Output, CmdError> {
    cmd.stdin(Stdio::null()).output().map_err(|source| CmdError::Spawn { program: cmd.get_program().to_string_lossy().into_owned(), source })
}

/// Shorthand: `sh(&["ip", "link", "del", "x"])`.
pub fn sh(args: &[&str]) -> Result<String, CmdError> {
    let (prog, rest) = args.split_first().expect("sh() needs a program");
    run(Command::new(prog).args(rest))
}

/// Like [`sh`], but the command is killed (SIGKILL, through coreutils' `timeout`) if it has not
/// finished within `limit`: a failure then.
pub fn run_within(args: &[&str], limit: std::time::Duration) -> Result<String, CmdError> {
    let secs = format!("{:.3}", limit.as_secs_f64());
    run(Command::new("timeout").args(["-s", "KILL", &secs]).args(args))
}

/// Like [`sh`] but ignores failure (cleanup paths, where "already gone" is success).
pub fn sh_quiet(args: &[&str]) {
    let _ = sh(args);
}

/// Send a signal to a process (or a process group with a negative id) through kill(1).
pub fn kill(pid: i64, signal: &str) -> bool {
    let target = pid.to_string();
    Command::new("kill")
        .args([&format!("-{signal}"), "--", &target])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

pub fn alive(pid: i64) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists() && std::fs::read_to_string(format!("/proc/{pid}/stat")).map(|s| !s.contains(") Z ")).unwrap_or(false)
}

/// Is `prog` on PATH?
pub fn which(prog: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(prog)).find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    #[test]
    fn a_command_that_overruns_its_limit_is_killed() {
        assert_eq!(super::run_within(&["echo", "hi"], Duration::from_secs(10)).unwrap(), "hi\n");
        let t = Instant::now();
        // A stopped process (what nsenter becomes when its child is stopped) is killed as well.
        let r = super::run_within(&["sh", "-c", "kill -STOP $$"], Duration::from_millis(300));
        assert!(r.is_err(), "{r:?}");
        assert!(t.elapsed() < Duration::from_secs(20));
    }
}
