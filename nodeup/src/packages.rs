//! The host's own packages (kOps' nodeup `PackagesBuilder`): what the kubelet, containerd and the
//! CNI plugins need from the distribution (`keelson_api::host_packages::required`), installed
//! before they start. Which are missing is read from the dpkg database; they come from the
//! cluster's file repository when it has an apt archive ([`keelson_api::host_packages::apt_repository`]:
//! Debian's own signed archive, a subset, so apt verifies every file against the distribution's
//! key as it would online), else from the image's own apt sources.

use keelson_api::host_packages::{self, Family, OsRelease};

use crate::host::{CommandError, Host};
use crate::nodetasks::Ctx;
use crate::tasks::{Task, TaskError};

/// The task's name: the services that need the packages start after it.
pub const TASK_NAME: &str = "packages";

/// Where nodeup writes the apt source of the file repository (not in `/etc/apt`: the image's own
/// apt configuration stays as it was).
pub const MIRROR_SOURCES: &str = "/etc/keelson/apt/sources.list";
/// An empty parts directory, so only [`MIRROR_SOURCES`] is read when installing from the mirror.
pub const MIRROR_SOURCE_PARTS: &str = "/etc/keelson/apt/sources.list.d";

const OS_RELEASE: [&str; 2] = ["/etc/os-release", "/usr/lib/os-release"];
const DPKG_STATUS: &str = "/var/lib/dpkg/status";

/// Errors of the packages task.
#[derive(Debug, thiserror::Error)]
pub enum PackagesError {
    #[error("cannot tell the distribution: neither /etc/os-release nor /usr/lib/os-release is readable")]
    NoOsRelease,
    #[error("packages {packages:?}: nodeup installs packages only on Debian-family hosts (dpkg/apt), this host is {os}; install them in the image")]
    Unsupported { packages: Vec<String>, os: String },
    #[error("reading the dpkg database {path}: {source}")]
    Dpkg {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: base::fs::FsError,
    },
    #[error("installing {packages:?} on {os}: {tried}")]
    Install { packages: Vec<String>, os: String, tried: String },
    #[error("after apt-get, {packages:?} are still not installed on {os}")]
    StillMissing { packages: Vec<String>, os: String },
}

impl From<PackagesError> for TaskError {
    fn from(e: PackagesError) -> TaskError {
        TaskError::failed(e)
    }
}

/// Make sure the host has the packages the node needs (and the spec's `packages`).
pub struct PackagesTask {
    /// The cluster's and the group's `packages`.
    pub extra: Vec<String>,
    pub kube_proxy_nftables: bool,
    /// The file repository's apt archive base, when the cluster mirrors its files.
    pub apt_repository: Option<String>,
}

/// What the host is and which of the packages it lacks.
struct Wanted {
    os: OsRelease,
    missing: Vec<String>,
}

impl PackagesTask {
    fn wanted(&self, host: &Host) -> Result<Option<Wanted>, PackagesError> {
        let Some(text) = OS_RELEASE.iter().find_map(|p| std::fs::read_to_string(host.path(p)).ok()) else {
            if host.is_live() {
                return Err(PackagesError::NoOsRelease);
            }
            // A directory being prepared (`--root`), not a distribution: nothing to install into.
            tracing::warn!("{}: no os-release under this root; no packages installed", host.root().display());
            return Ok(None);
        };
        let os = OsRelease::parse(&text);
        let family = os.family();
        let wanted = host_packages::required(family, self.kube_proxy_nftables, &self.extra);
        if family == Family::Other {
            if !self.extra.is_empty() {
                return Err(PackagesError::Unsupported { packages: self.extra.clone(), os: os.describe() });
            }
            tracing::warn!("{}: not a Debian-family host; nodeup installs no packages there (iptables and friends must be in the image)", os.describe());
            return Ok(None);
        }
        let path = host.path(DPKG_STATUS);
        let status = match std::fs::read_to_string(&path) {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(source) => return Err(PackagesError::Dpkg { path: path.display().to_string(), source }),
        };
        let missing = host_packages::missing_from_dpkg_status(&status, &wanted);
        Ok(Some(Wanted { os, missing }))
    }
}

/// `apt-get` with the options every call of nodeup's uses, then `args`.
fn apt_get(sources: Option<(&str, &str)>, args: &[&str]) -> Vec<String> {
    // No translated descriptions: nodeup reads none, and an archive subset need not carry them.
    let mut argv: Vec<String> = ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-q", "-o", "DPkg::Lock::Timeout=300", "-o", "Acquire::Languages=none"]
        .map(str::to_string)
        .to_vec();
    if let Some((list, parts)) = sources {
        argv.extend(["-o".to_string(), format!("Dir::Etc::SourceList={list}"), "-o".to_string(), format!("Dir::Etc::SourceParts={parts}")]);
    }
    argv.extend(args.iter().map(|a| a.to_string()));
    argv
}

/// The commands that install `missing`: `apt-get update` then `apt-get install`, with only the
/// mirror's source when `sources` is given.
pub fn install_commands(sources: Option<(&str, &str)>, missing: &[String]) -> Vec<Vec<String>> {
    let mut install = vec!["install", "-y", "--no-install-recommends"];
    install.extend(missing.iter().map(String::as_str));
    vec![apt_get(sources, &["update"]), apt_get(sources, &install)]
}

fn run_all(host: &Host, commands: &[Vec<String>]) -> Result<(), CommandError> {
    use backon::BlockingRetryable as _;
    for argv in commands {
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let policy = backon::ExponentialBuilder::default()
            .with_min_delay(std::time::Duration::from_secs(2))
            .with_max_delay(std::time::Duration::from_secs(10))
            .with_max_times(3);
        (|| host.run(&argv)).retry(policy).notify(|e, after| tracing::warn!("{e}; again in {after:?}")).call()?;
    }
    Ok(())
}

impl Task<Ctx<'_>> for PackagesTask {
    fn name(&self) -> String {
        TASK_NAME.to_string()
    }
    fn paths(&self) -> Vec<String> {
        vec![MIRROR_SOURCES.to_string()]
    }
    fn check(&self, ctx: &Ctx, _: bool) -> Result<Vec<String>, TaskError> {
        Ok(match self.wanted(ctx.host)? {
            Some(w) if !w.missing.is_empty() => vec![format!("install {} ({})", w.missing.join(" "), w.os.describe())],
            _ => Vec::new(),
        })
    }
    fn apply(&self, ctx: &Ctx, _: bool) -> Result<(), TaskError> {
        let host = ctx.host;
        let Some(Wanted { os, missing }) = self.wanted(host)? else { return Ok(()) };
        let mut tried = Vec::new();
        let mut installed = false;
        if let Some(repo) = &self.apt_repository {
            let keyring = host.path(host_packages::archive_keyring(&os)).exists();
            let line = format!("{}\n", host_packages::apt_source_line(repo, &os, keyring));
            let list = host.path(MIRROR_SOURCES);
            base::fs::write_atomic(&list, line.as_bytes(), 0o644, None).map_err(|source| PackagesError::Write { path: MIRROR_SOURCES.into(), source })?;
            let parts = host.path(MIRROR_SOURCE_PARTS);
            std::fs::create_dir_all(&parts).map_err(|e| PackagesError::Write { path: MIRROR_SOURCE_PARTS.into(), source: base::fs::fs_err(&parts)(e) })?;
            tracing::info!("installing {} from the file repository's archive ({})", missing.join(" "), line.trim());
            match run_all(host, &install_commands(Some((MIRROR_SOURCES, MIRROR_SOURCE_PARTS)), &missing)) {
                Ok(()) => installed = true,
                Err(e) => {
                    tracing::warn!("the file repository's archive {repo} did not serve {}: {e}; trying the image's own apt sources", missing.join(" "));
                    tried.push(format!("from {repo}: {e}"));
                }
            }
        }
        if !installed {
            tracing::info!("installing {} from the image's apt sources", missing.join(" "));
            if let Err(e) = run_all(host, &install_commands(None, &missing)) {
                tried.push(format!("from the image's apt sources: {e}"));
                return Err(PackagesError::Install { packages: missing, os: os.describe(), tried: tried.join("; ") }.into());
            }
        }
        if host.is_live() {
            if let Some(w) = self.wanted(host)? {
                if !w.missing.is_empty() {
                    return Err(PackagesError::StillMissing { packages: w.missing, os: os.describe() }.into());
                }
            }
        }
        Ok(())
    }
    fn renders(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirror_commands_read_only_the_mirrors_source() {
        let cmds = install_commands(Some((MIRROR_SOURCES, MIRROR_SOURCE_PARTS)), &["iptables".into(), "jq".into()]);
        assert_eq!(cmds.len(), 2);
        let update = cmds[0].join(" ");
        assert!(update.starts_with("env DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=300 -o Acquire::Languages=none "), "{update}");
        assert!(update.contains("-o Dir::Etc::SourceList=/etc/keelson/apt/sources.list -o Dir::Etc::SourceParts=/etc/keelson/apt/sources.list.d"), "{update}");
        assert!(update.ends_with(" update"), "{update}");
        assert!(cmds[1].join(" ").ends_with("install -y --no-install-recommends iptables jq"), "{:?}", cmds[1]);
        let own = install_commands(None, &["iptables".into()]);
        assert!(!own[0].join(" ").contains("SourceList"), "{:?}", own[0]);
    }

    fn root_with(os_release: &str, status: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("etc")).expect("etc");
        std::fs::write(dir.path().join("etc/os-release"), os_release).expect("os-release");
        std::fs::create_dir_all(dir.path().join("var/lib/dpkg")).expect("dpkg");
        std::fs::write(dir.path().join("var/lib/dpkg/status"), status).expect("status");
        dir
    }

    #[test]
    fn missing_packages_are_read_from_dpkg_and_installed_from_the_mirror_first() {
        let dir = root_with(
            "ID=debian\nVERSION_ID=\"13\"\nVERSION_CODENAME=trixie\n",
            "Package: libseccomp2\nStatus: install ok installed\n\nPackage: util-linux\nStatus: install ok installed\n",
        );
        let host = Host::new(dir.path());
        let task = PackagesTask { extra: vec!["jq".into()], kube_proxy_nftables: false, apt_repository: Some("http://10.0.0.1/files/apt".into()) };
        let w = task.wanted(&host).expect("wanted").expect("debian");
        assert_eq!(w.missing, ["iptables", "libapparmor1", "jq"]);
        // Off a live host the commands are recorded, not run.
        let fetcher = crate::assets::Fetcher::new(Default::default(), dir.path().join("cache")).expect("fetcher");
        task.apply(&Ctx { host: &host, assets: &fetcher }, false).expect("apply");
        let recorded = host.recorded();
        assert_eq!(recorded.len(), 2, "{recorded:?}");
        assert!(recorded[0].contains("SourceList=/etc/keelson/apt/sources.list") && recorded[0].ends_with("update"), "{recorded:?}");
        assert!(recorded[1].ends_with("install -y --no-install-recommends iptables libapparmor1 jq"), "{recorded:?}");
        let line = std::fs::read_to_string(dir.path().join("etc/keelson/apt/sources.list")).expect("sources");
        assert_eq!(line, "deb http://10.0.0.1/files/apt/debian trixie main\n");
    }

    #[test]
    fn nothing_to_do_when_installed_and_a_clear_error_off_debian() {
        let all = ["iptables", "libapparmor1", "libseccomp2", "util-linux"].map(|p| format!("Package: {p}\nStatus: install ok installed\n")).join("\n");
        let dir = root_with("ID=debian\nVERSION_CODENAME=bookworm\n", &all);
        let host = Host::new(dir.path());
        let task = PackagesTask { extra: vec![], kube_proxy_nftables: false, apt_repository: None };
        assert!(task.wanted(&host).expect("wanted").expect("debian").missing.is_empty());
        let al = root_with("ID=amzn\nVERSION_ID=2023\n", "");
        let host = Host::new(al.path());
        assert!(task.wanted(&host).expect("other").is_none(), "nothing installed off Debian");
        let with_extra = PackagesTask { extra: vec!["jq".into()], ..task };
        let e = with_extra.wanted(&host).err().expect("refused").to_string();
        assert!(e.contains("\"jq\"") && e.contains("amzn 2023"), "{e}");
        let none = tempfile::tempdir().expect("tempdir");
        assert!(with_extra.wanted(&Host::new(none.path())).expect("a bare root").is_none(), "a root being prepared is no distribution");
    }
}
