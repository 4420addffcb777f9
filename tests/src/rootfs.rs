//! The machines' root filesystem: Debian bookworm with systemd, built once with `debootstrap` and
//! cached under a key derived from everything that goes into it; each machine boots an overlay
//! (copy-on-write) of it, or a copy when overlayfs is unavailable.

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

use crate::arch::Arch;
use crate::cmd;

pub const DEFAULT_DEBIAN_MIRROR: &str = "http://deb.debian.org/debian";

/// The Debian releases machines boot: Debian 12 by default, Debian 13 for a group whose image
/// names it ([`Suite::of_image`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub enum Suite {
    Bookworm,
    Trixie,
}

impl Suite {
    pub const ALL: [Suite; 2] = [Suite::Bookworm, Suite::Trixie];

    pub fn codename(self) -> &'static str {
        match self {
            Suite::Bookworm => "bookworm",
            Suite::Trixie => "trixie",
        }
    }

    pub fn version(self) -> u32 {
        match self {
            Suite::Bookworm => 12,
            Suite::Trixie => 13,
        }
    }

    /// The release an instance group's `image` asks for: Debian 13 when it names it (Debian's
    /// own AMI names, `debian-13-amd64-…`, or its codename), else Debian 12 — what every other
    /// image (Ubuntu's among them) boots here.
    pub fn of_image(image: &str) -> Suite {
        let i = image.to_ascii_lowercase();
        if i.contains("debian-13") || i.contains("trixie") {
            Suite::Trixie
        } else {
            Suite::Bookworm
        }
    }
}

impl std::fmt::Display for Suite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Debian {} ({})", self.version(), self.codename())
    }
}

/// What the machines have besides a minimal Debian: what a stock Debian cloud image has, and
/// two tools of the harness's own. Not here, because nodeup installs them as on a real instance:
/// containerd, runc and the CNI plugins (from the asset mirror) and the distribution's packages
/// the kubelet and containerd need, `iptables` among them (`keelson_api::host_packages`; from
/// the mirror's Debian archive subset, [`crate::apt`]).
pub const PACKAGES: &[&str] = &[
    "systemd",
    "systemd-sysv",
    "dbus",
    "curl",
    "ca-certificates",
    "iproute2",
    "kmod",
    "procps",
    "util-linux",
    "mount",
    "e2fsprogs",
    // The harness's own: `etcdctl` for its checks of the members (`crate::etcd`) ...
    "etcd-client",
    // ... and the runc the mirror's `runc` runs (see `mirror::RUNC_SHIM`); nodeup installs that one.
    "runc",
];

/// Units of the Debian packages that must not start in a machine: etcd is started from the static
/// pod manifest only; the timers would wake up at random and cost CPU.
const MASKED_UNITS: &[&str] = &[
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "dpkg-db-backup.timer",
    "e2scrub_all.timer",
    "e2scrub_reap.service",
    "fstrim.timer",
    "console-getty.service",
    "getty@.service",
    "systemd-timesyncd.service",
];

/// Bump when the customisation below changes (it is part of the cache key).
const SETUP_VERSION: &str = "5";

/// The machine's PID 1: makes the cgroup v1 controller hierarchies writable, then becomes systemd.
pub const INIT: &str = "usr/local/lib/keelson-local/init";
const INIT_TEXT: &str = r#"#!/bin/sh
# keelson-local: systemd-nspawn mounts the cgroup v1 controller hierarchies read-only; a cloud
# instance's systemd owns them. Remount them writable before systemd starts, so that systemd, the
# kubelet and containerd (systemd cgroup driver) manage cgroups as they do on EC2.
mount -o remount,rw /sys/fs/cgroup 2>/dev/null
for d in /sys/fs/cgroup/*/; do
  mount -o remount,bind,rw "$d" 2>/dev/null || echo "keelson-local init: cannot make $d writable" >&2
done
exec /lib/systemd/systemd "$@"
"#;

pub const USER_DATA_UNIT: &str = "keelson-user-data.service";
pub const USER_DATA_RUNNER: &str = "usr/local/lib/keelson-local/run-user-data";

/// What both runners do once the user-data is in `$dir/user-data.txt`: run it (a script with `#!`
/// as itself, anything else with sh), as cloud-init does. A macro, so each runner is one literal.
macro_rules! run_fetched_user_data {
    () => {
        r#"chmod 0700 "$dir/user-data.txt"
echo "run-user-data: running user-data ($(wc -c < "$dir/user-data.txt") bytes)"
if head -c 2 "$dir/user-data.txt" | grep -q '#!'; then
  exec "$dir/user-data.txt"
fi
exec /bin/sh "$dir/user-data.txt"
"#
    };
}

/// Fetches this instance's user-data over IMDSv2 and runs it, as cloud-init does.
const RUN_USER_DATA: &str = concat!(
    r#"#!/bin/sh
# keelson-local: fetch this instance's user-data from IMDSv2 and run it (what cloud-init does on EC2).
set -u
imds=http://169.254.169.254
dir=/var/lib/cloud/instance
i=0
while ! token=$(curl -fsS -m 2 -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 300' "$imds/latest/api/token"); do
  i=$((i + 1))
  if [ "$i" -ge 100 ]; then echo "run-user-data: IMDS at $imds unreachable" >&2; exit 1; fi
  sleep 0.1
done
mkdir -p "$dir"
code=$(curl -sS -m 10 -o "$dir/user-data.txt" -w '%{http_code}' -H "X-aws-ec2-metadata-token: $token" "$imds/latest/user-data")
if [ "$code" = 404 ]; then echo "run-user-data: no user-data"; exit 0; fi
if [ "$code" != 200 ]; then echo "run-user-data: IMDS user-data: HTTP $code" >&2; exit 1; fi
"#,
    run_fetched_user_data!()
);

/// The same on GCE: the user-data is the instance attribute `user-data` on the metadata server
/// (`Metadata-Flavor: Google`), as Google's guest agent and cloud-init read it. A GCE machine gets
/// this runner in its own layer, in place of the IMDS one.
pub const RUN_USER_DATA_GCE: &str = concat!(
    r#"#!/bin/sh
# keelson-local: fetch this instance's user-data from the GCE metadata server and run it (what cloud-init does on GCE).
set -u
md=http://metadata.google.internal/computeMetadata/v1
dir=/var/lib/cloud/instance
i=0
while ! curl -fsS -m 2 -H 'Metadata-Flavor: Google' -o /dev/null "$md/instance/id"; do
  i=$((i + 1))
  if [ "$i" -ge 100 ]; then echo "run-user-data: the metadata server at $md is unreachable" >&2; exit 1; fi
  sleep 0.1
done
mkdir -p "$dir"
code=$(curl -sS -m 10 -o "$dir/user-data.txt" -w '%{http_code}' -H 'Metadata-Flavor: Google' "$md/instance/attributes/user-data")
if [ "$code" = 404 ]; then echo "run-user-data: no user-data"; exit 0; fi
if [ "$code" != 200 ]; then echo "run-user-data: metadata user-data: HTTP $code" >&2; exit 1; fi
"#,
    run_fetched_user_data!()
);

const USER_DATA_UNIT_TEXT: &str = "[Unit]
Description=Run the instance user-data (keelson-local stand-in for cloud-init)
After=local-fs.target network.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/lib/keelson-local/run-user-data
StandardOutput=journal+console
StandardError=journal+console
TimeoutStartSec=20min

[Install]
WantedBy=multi-user.target
";

#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    #[error("rootfs {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("debootstrap is not installed (apt-get install debootstrap; scripts/test installs it)")]
    NoDebootstrap,
    #[error("debootstrap of {suite} into {path} failed ({status}); last output:\n{tail}")]
    Debootstrap { suite: String, path: PathBuf, status: String, tail: String },
    #[error(transparent)]
    Cmd(#[from] cmd::CmdError),
    #[error(transparent)]
    Arch(#[from] crate::arch::ArchError),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RootfsError + '_ {
    move |source| RootfsError::Io { path: path.to_path_buf(), source }
}

/// Cache key: suite, packages and setup version.
pub fn cache_key(suite: Suite) -> String {
    let mut h = Sha256::new();
    h.update(suite.codename());
    for p in PACKAGES {
        h.update([0]);
        h.update(p);
    }
    h.update([1]);
    h.update(SETUP_VERSION);
    h.update(RUN_USER_DATA);
    h.update(INIT_TEXT);
    h.update(USER_DATA_UNIT_TEXT);
    for u in MASKED_UNITS {
        h.update(u);
    }
    hex::encode(h.finalize())[..12].to_string()
}

pub fn cached_path(cache_dir: &Path) -> PathBuf {
    cached_path_for(cache_dir, crate::arch::host(), Suite::Bookworm)
}

/// The cached rootfs of `arch` and `suite`: the host's as it always was, another architecture's beside it.
pub fn cached_path_for(cache_dir: &Path, arch: Arch, suite: Suite) -> PathBuf {
    let codename = suite.codename();
    if arch == crate::arch::host() {
        cache_dir.join(format!("rootfs-{codename}-{}", cache_key(suite)))
    } else {
        cache_dir.join(format!("rootfs-{codename}-{arch}-{}", cache_key(suite)))
    }
}

/// The cached Debian 12 rootfs of this host's architecture, building it first when missing.
pub fn ensure(cache_dir: &Path) -> Result<PathBuf, RootfsError> {
    ensure_for(cache_dir, crate::arch::host(), Suite::Bookworm)
}

/// The cached rootfs of `arch` and `suite`, building it first when missing (under a lock, so
/// concurrent tests build once). Another architecture's is Debian's build of it, debootstrapped
/// through qemu-user ([`crate::arch::ensure_emulation`]).
pub fn ensure_for(cache_dir: &Path, arch: Arch, suite: Suite) -> Result<PathBuf, RootfsError> {
    let dest = cached_path_for(cache_dir, arch, suite);
    let marker = dest.join(".keelson-complete");
    if marker.exists() {
        return Ok(dest);
    }
    fs::create_dir_all(cache_dir).map_err(io(cache_dir))?;
    let _lock = BuildLock::acquire(&cache_dir.join("rootfs.lock"))?;
    if marker.exists() {
        return Ok(dest);
    }
    if cmd::which("debootstrap").is_none() && !Path::new("/usr/sbin/debootstrap").exists() {
        return Err(RootfsError::NoDebootstrap);
    }
    crate::arch::ensure_emulation(arch)?;
    let tmp = cache_dir.join(format!(".rootfs-build-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    let mirror = debian_mirror();
    let how = if arch == crate::arch::host() { "1-5 minutes" } else { "its packages configured under qemu-user: 10-20 minutes" };
    eprintln!("keelson-local: building the {suite} {arch} rootfs with debootstrap from {mirror} into {} (once; {how})", dest.display());
    let started = std::time::Instant::now();
    debootstrap(&tmp, &mirror, arch, suite)?;
    customise(&tmp)?;
    fs::write(tmp.join(".keelson-complete"), cache_key(suite)).map_err(io(&tmp))?;
    let _ = fs::remove_dir_all(&dest);
    fs::rename(&tmp, &dest).map_err(io(&dest))?;
    eprintln!("keelson-local: rootfs ready in {:.0} s", started.elapsed().as_secs_f64());
    Ok(dest)
}

/// The Debian mirror the roots (and the asset mirror's archive subset) come from:
/// `KEELSON_DEBIAN_MIRROR`, else [`DEFAULT_DEBIAN_MIRROR`].
pub fn debian_mirror() -> String {
    std::env::var("KEELSON_DEBIAN_MIRROR").ok().filter(|m| !m.is_empty()).unwrap_or_else(|| DEFAULT_DEBIAN_MIRROR.to_string())
}

/// A lock directory holding the builder's pid (stale when that process is gone), so concurrent
/// test binaries build the rootfs once. Bounded wait.
struct BuildLock {
    dir: PathBuf,
}

impl BuildLock {
    fn acquire(dir: &Path) -> Result<BuildLock, RootfsError> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30 * 60);
        loop {
            match fs::create_dir(dir) {
                Ok(()) => {
                    let _ = fs::write(dir.join("pid"), std::process::id().to_string());
                    return Ok(BuildLock { dir: dir.to_path_buf() });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let holder = fs::read_to_string(dir.join("pid")).ok().and_then(|p| p.trim().parse::<i64>().ok());
                    if holder.is_some_and(|p| !cmd::alive(p)) {
                        let _ = fs::remove_dir_all(dir);
                        continue;
                    }
                    if std::time::Instant::now() > deadline {
                        return Err(RootfsError::Io {
                            path: dir.to_path_buf(),
                            source: std::io::Error::other("another build holds the rootfs lock for 30 minutes"),
                        });
                    }
                    std::thread::sleep(std::time::Duration::from_millis(500));
                }
                Err(e) => return Err(RootfsError::Io { path: dir.to_path_buf(), source: e }),
            }
        }
    }
}

impl Drop for BuildLock {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn debootstrap(target: &Path, mirror: &str, arch: Arch, suite: Suite) -> Result<(), RootfsError> {
    let include = PACKAGES.join(",");
    let mut child = Command::new("debootstrap")
        .args(["--variant=minbase", &format!("--arch={arch}"), &format!("--include={include}"), suite.codename()])
        .arg(target)
        .arg(mirror)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|_| RootfsError::NoDebootstrap)?;
    let mut tail: Vec<String> = Vec::new();
    let mut last_phase = String::new();
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            // Progress: one line per phase change ("Retrieving", "Extracting", "Configuring", ...).
            let phase = line.strip_prefix("I: ").and_then(|l| l.split_whitespace().next()).unwrap_or("").to_string();
            if !phase.is_empty() && phase != last_phase {
                eprintln!("keelson-local: debootstrap: {line}");
                last_phase = phase;
            }
            tail.push(line);
            if tail.len() > 30 {
                tail.remove(0);
            }
        }
    }
    let status = child.wait().map_err(io(target))?;
    if !status.success() {
        return Err(RootfsError::Debootstrap {
            suite: suite.codename().to_string(),
            path: target.to_path_buf(),
            status: status.to_string(),
            tail: tail.join("\n"),
        });
    }
    Ok(())
}

fn write(path: &Path, text: &str, mode: u32) -> Result<(), RootfsError> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(io(dir))?;
    }
    fs::write(path, text).map_err(io(path))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(io(path))
}

fn symlink(target: &str, link: &Path) -> Result<(), RootfsError> {
    if let Some(dir) = link.parent() {
        fs::create_dir_all(dir).map_err(io(dir))?;
    }
    let _ = fs::remove_file(link);
    std::os::unix::fs::symlink(target, link).map_err(io(link))
}

/// Machine-independent setup: the user-data unit, masked units, an empty machine-id (each boot
/// gets a fresh one), no apt caches.
fn customise(root: &Path) -> Result<(), RootfsError> {
    write(&root.join(USER_DATA_RUNNER), RUN_USER_DATA, 0o755)?;
    write(&root.join(INIT), INIT_TEXT, 0o755)?;
    let unit = root.join("etc/systemd/system").join(USER_DATA_UNIT);
    write(&unit, USER_DATA_UNIT_TEXT, 0o644)?;
    symlink(&format!("/etc/systemd/system/{USER_DATA_UNIT}"), &root.join("etc/systemd/system/multi-user.target.wants").join(USER_DATA_UNIT))?;
    for u in MASKED_UNITS {
        symlink("/dev/null", &root.join("etc/systemd/system").join(u))?;
    }
    write(&root.join("etc/machine-id"), "", 0o444)?;
    let _ = fs::remove_file(root.join("var/lib/dbus/machine-id"));
    // journald: keep the journal in memory, small.
    write(&root.join("etc/systemd/journald.conf.d/keelson-local.conf"), "[Journal]\nStorage=volatile\nRuntimeMaxUse=16M\n", 0o644)?;
    let apt_cache = root.join("var/cache/apt/archives");
    if let Ok(entries) = fs::read_dir(&apt_cache) {
        for e in entries.flatten() {
            if e.path().extension().is_some_and(|x| x == "deb") {
                let _ = fs::remove_file(e.path());
            }
        }
    }
    Ok(())
}

/// A machine's root: an overlay of the cached rootfs (upper/work dirs under `machine_dir`), or a
/// full copy when overlayfs cannot be mounted. Returns true when an overlay was mounted.
pub fn instantiate(lower: &Lower, upper: &Path, work: &Path, merged: &Path) -> Result<bool, RootfsError> {
    for d in [upper, work, merged] {
        fs::create_dir_all(d).map_err(io(d))?;
    }
    let opts = format!("lowerdir={},upperdir={},workdir={}", lower.lowerdir(), upper.display(), work.display());
    let overlay = cmd::run(Command::new("mount").args(["-t", "overlay", "overlay", "-o", &opts]).arg(merged));
    if overlay.is_ok() {
        return Ok(true);
    }
    for layer in lower.layers().iter().rev() {
        cmd::run(Command::new("cp").args(["-a", "--reflink=auto"]).arg(format!("{}/.", layer.display())).arg(merged))?;
    }
    Ok(false)
}

/// Where a machine of another architecture finds the host's runc ([`crate::arch`]; the local
/// mirror's runc shim runs it when it is there): in [`NATIVE_DIR`], the runc build's directory
/// bound read-only.
pub const NATIVE_RUNC: &str = "usr/local/lib/keelson-local/native/runc";
/// The directory [`NATIVE_RUNC`] is in. A directory, not the file alone: runc seals itself before
/// it starts a container with an overlayfs over its own directory, and over a single-file bind
/// mount that overlay shows the empty mount point under it ("fork/exec /proc/self/fd/6:
/// permission denied").
pub const NATIVE_DIR: &str = "usr/local/lib/keelson-local/native";

/// What a machine boots from: the rootfs and, for `--baked`, a baked image on top of it
/// (`keelson bundle bake`'s root: nodeup's cache, the nodeup build, containerd's store).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lower {
    pub rootfs: PathBuf,
    pub baked: Option<PathBuf>,
    /// A machine of another architecture (run through qemu-user): the host's runc, bound
    /// read-only at [`NATIVE_RUNC`].
    pub native_runc: Option<PathBuf>,
}

impl From<PathBuf> for Lower {
    fn from(rootfs: PathBuf) -> Lower {
        Lower { rootfs, baked: None, native_runc: None }
    }
}

impl Lower {
    /// The layers, top first.
    pub fn layers(&self) -> Vec<&Path> {
        self.baked.iter().map(PathBuf::as_path).chain([self.rootfs.as_path()]).collect()
    }

    /// overlayfs' `lowerdir=` value (top first, `:`-separated).
    pub fn lowerdir(&self) -> String {
        self.layers().iter().map(|l| l.display().to_string()).collect::<Vec<_>>().join(":")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_baked_image_is_the_top_layer() {
        assert_eq!(Lower::from(PathBuf::from("/c/rootfs")).lowerdir(), "/c/rootfs");
        let baked = Lower { rootfs: "/c/rootfs".into(), baked: Some("/s/baked".into()), native_runc: None };
        assert_eq!(baked.lowerdir(), "/s/baked:/c/rootfs");
    }

    #[test]
    fn key_is_stable_and_short() {
        let b = Suite::Bookworm;
        assert_eq!(cache_key(b), cache_key(b));
        assert_eq!(cache_key(b).len(), 12);
        assert_ne!(cache_key(b), cache_key(Suite::Trixie));
        assert!(cached_path(Path::new("/c")).display().to_string().starts_with("/c/rootfs-bookworm-"));
        // Another architecture's rootfs sits beside the host's, never in its place; so does another release's.
        let other = if crate::arch::host() == Arch::Amd64 { Arch::Arm64 } else { Arch::Amd64 };
        assert_eq!(cached_path_for(Path::new("/c"), other, b), Path::new("/c").join(format!("rootfs-bookworm-{other}-{}", cache_key(b))));
        assert_eq!(cached_path_for(Path::new("/c"), crate::arch::host(), b), cached_path(Path::new("/c")));
        let t = cached_path_for(Path::new("/c"), crate::arch::host(), Suite::Trixie);
        assert!(t.display().to_string().starts_with("/c/rootfs-trixie-"), "{}", t.display());
    }

    #[test]
    fn the_release_is_the_images() {
        assert_eq!(Suite::of_image("136693071363/debian-13-amd64-20250814-2204"), Suite::Trixie);
        assert_eq!(Suite::of_image("my-trixie-base"), Suite::Trixie);
        assert_eq!(Suite::of_image("136693071363/debian-12-amd64-20250814-2204"), Suite::Bookworm);
        assert_eq!(Suite::of_image("099720109477/ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-20250610"), Suite::Bookworm);
        assert_eq!(Suite::Trixie.to_string(), "Debian 13 (trixie)");
    }

    #[test]
    fn no_host_package_nodeup_installs_is_preinstalled() {
        for p in keelson_api::host_packages::base(keelson_api::host_packages::Family::Debian) {
            // util-linux is Essential in Debian (every image has it); the others nodeup installs.
            if p != "util-linux" {
                assert!(!PACKAGES.contains(&p.as_str()), "{p} is nodeup's to install, not the rootfs's");
            }
        }
        assert!(!PACKAGES.contains(&"iptables") && !PACKAGES.contains(&"conntrack"));
    }

    #[test]
    fn runner_is_valid_sh() {
        let dir = std::env::temp_dir().join(format!("kl-runner-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        for (name, text) in [("r.sh", RUN_USER_DATA), ("r-gce.sh", RUN_USER_DATA_GCE), ("init.sh", INIT_TEXT)] {
            let f = dir.join(name);
            fs::write(&f, text).unwrap();
            let st = Command::new("sh").arg("-n").arg(&f).status().unwrap();
            assert!(st.success(), "{name} is not valid sh");
        }
        let _ = fs::remove_dir_all(&dir);
    }
}
