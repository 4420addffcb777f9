//! The host's own packages: what nodeup makes sure the distribution has installed before the
//! kubelet and containerd start (kOps' nodeup `PackagesBuilder`), and where it installs them from
//! when the cluster mirrors its files (`assets.fileRepository`): a Debian-layout archive subset under
//! [`APT_DIR`] there, signed by the distribution itself. The asset mirror of keelson-local reads the
//! same list to know what to mirror, so it is written once, here.

/// What a host says about itself in `/etc/os-release`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OsRelease {
    /// `ID`: `debian`, `ubuntu`, `amzn`, …
    pub id: String,
    /// `ID_LIKE`, split.
    pub id_like: Vec<String>,
    /// `VERSION_ID`: `12`, `13`, `24.04`.
    pub version_id: String,
    /// `VERSION_CODENAME`: `bookworm`, `trixie`, `noble` (empty on distributions without one).
    pub codename: String,
    /// `PRETTY_NAME`, for messages.
    pub pretty_name: String,
}

impl OsRelease {
    /// Parse os-release(5): `KEY=value` lines, values optionally quoted; comments and blank lines
    /// skipped; unknown keys ignored.
    pub fn parse(text: &str) -> OsRelease {
        let mut r = OsRelease::default();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
            let Some((key, value)) = line.split_once('=') else { continue };
            let value = unquote(value.trim());
            match key.trim() {
                "ID" => r.id = value,
                "ID_LIKE" => r.id_like = value.split_whitespace().map(str::to_string).collect(),
                "VERSION_ID" => r.version_id = value,
                "VERSION_CODENAME" => r.codename = value,
                "PRETTY_NAME" => r.pretty_name = value,
                _ => {}
            }
        }
        r
    }

    /// The distribution family, as kOps' nodeup tells them apart.
    pub fn family(&self) -> Family {
        let is = |name: &str| self.id == name || self.id_like.iter().any(|l| l == name);
        if is("debian") || is("ubuntu") {
            Family::Debian
        } else {
            Family::Other
        }
    }

    /// A name for messages: `PRETTY_NAME`, else `ID VERSION_ID`.
    pub fn describe(&self) -> String {
        if self.pretty_name.is_empty() {
            format!("{} {}", self.id, self.version_id).trim().to_string()
        } else {
            self.pretty_name.clone()
        }
    }
}

fn unquote(v: &str) -> String {
    let inner = ['"', '\''].iter().find_map(|q| v.strip_prefix(*q).and_then(|s| s.strip_suffix(*q))).unwrap_or(v);
    inner.replace("\\\"", "\"").replace("\\\\", "\\")
}

/// Distribution families nodeup installs packages on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Debian and Ubuntu: `dpkg` and `apt-get`.
    Debian,
    /// Anything else: nodeup installs nothing and says so (kOps does the same).
    Other,
}

/// The packages the kubelet, containerd and the CNI plugins need from a Debian-family host (kOps'
/// list): `iptables` for the CNI plugins' and nodeup's rules, `libapparmor1` and `libseccomp2`
/// for runc, `util-linux` for `nsenter`/`mount`; `nftables` when kube-proxy runs in nftables mode.
/// Then the cluster's and the group's `packages`, in order, without repeats.
pub fn required(family: Family, kube_proxy_nftables: bool, extra: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    if family == Family::Debian {
        out.extend(["iptables", "libapparmor1", "libseccomp2"].map(str::to_string));
        if kube_proxy_nftables {
            out.push("nftables".into());
        }
        out.push("util-linux".into());
    }
    for p in extra {
        if !out.contains(p) {
            out.push(p.clone());
        }
    }
    out
}

/// Whether a host's kube-proxy (as its NodeupConfig has it) runs in nftables mode, so the host
/// needs `nftables`: kube-proxy enabled (the default) with `proxyMode: nftables`.
pub fn kube_proxy_nftables(cfg: &crate::nodeup::NodeupConfig) -> bool {
    cfg.kube_proxy.as_ref().is_some_and(|k| k.enabled != Some(false) && k.proxy_mode.as_deref() == Some("nftables"))
}

/// [`required`] for the host a NodeupConfig describes: its kube-proxy mode and its `packages`.
pub fn required_by(family: Family, cfg: &crate::nodeup::NodeupConfig) -> Vec<String> {
    required(family, kube_proxy_nftables(cfg), &cfg.packages)
}

/// The packages a host of `family` needs whatever the cluster: what a mirror must carry for
/// every node to boot offline.
pub fn base(family: Family) -> Vec<String> {
    required(family, false, &[])
}

/// Where, under `assets.fileRepository`, the Debian-layout archives are: `<fileRepository>/apt/<ID>`
/// holds `dists/<codename>/InRelease` as the distribution signed it, the `Packages` indexes it
/// names and the `pool/` files the hosts need.
pub const APT_DIR: &str = "apt";

/// The archive component nodeup installs from.
pub const APT_COMPONENT: &str = "main";

/// The apt archive base under a file repository (`http://mirror/files` → `http://mirror/files/apt`).
pub fn apt_repository(file_repository: &str) -> String {
    format!("{}/{APT_DIR}", file_repository.trim_end_matches('/'))
}

/// The one-line apt source for `os` in the archive base `repository`, trusting only the
/// distribution's own archive key (`/usr/share/keyrings/<ID>-archive-keyring.gpg`, which every
/// Debian and Ubuntu image carries) when `keyring_present`.
pub fn apt_source_line(repository: &str, os: &OsRelease, keyring_present: bool) -> String {
    let options = if keyring_present { format!("[signed-by={}] ", archive_keyring(os)) } else { String::new() };
    format!("deb {options}{}/{} {} {APT_COMPONENT}", repository.trim_end_matches('/'), os.id, os.codename)
}

/// The distribution's archive keyring.
pub fn archive_keyring(os: &OsRelease) -> String {
    format!("/usr/share/keyrings/{}-archive-keyring.gpg", os.id)
}

/// Which of `wanted` the dpkg status database (`/var/lib/dpkg/status`) does not list as
/// installed (`Status: install ok installed`), in `wanted`'s order.
pub fn missing_from_dpkg_status(status: &str, wanted: &[String]) -> Vec<String> {
    let mut installed = std::collections::BTreeSet::new();
    for stanza in status.split("\n\n") {
        let mut name = None;
        let mut ok = false;
        for line in stanza.lines() {
            if let Some(v) = line.strip_prefix("Package:") {
                name = Some(v.trim());
            } else if let Some(v) = line.strip_prefix("Status:") {
                ok = v.split_whitespace().last() == Some("installed") && v.split_whitespace().next() == Some("install");
            }
        }
        if let (Some(n), true) = (name, ok) {
            installed.insert(n.to_string());
        }
    }
    wanted.iter().filter(|p| !installed.contains(p.as_str())).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nodeup_config_asks_for_nftables_only_when_its_kube_proxy_runs_in_that_mode() {
        use crate::generated::KubeProxyConfig;
        let mut cfg = crate::nodeup::NodeupConfig { packages: vec!["jq".into(), "iptables".into()], ..Default::default() };
        assert_eq!(required_by(Family::Debian, &cfg), ["iptables", "libapparmor1", "libseccomp2", "util-linux", "jq"]);
        cfg.kube_proxy = Some(KubeProxyConfig { proxy_mode: Some("nftables".into()), ..Default::default() });
        assert!(kube_proxy_nftables(&cfg));
        assert!(required_by(Family::Debian, &cfg).contains(&"nftables".to_string()));
        cfg.kube_proxy.as_mut().unwrap().enabled = Some(false);
        assert!(!kube_proxy_nftables(&cfg), "kube-proxy disabled needs no nftables");
        cfg.kube_proxy = Some(KubeProxyConfig { proxy_mode: Some("iptables".into()), ..Default::default() });
        assert!(!kube_proxy_nftables(&cfg));
        assert_eq!(required_by(Family::Other, &cfg), ["jq", "iptables"]);
    }

    const BOOKWORM: &str = r#"PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"
NAME="Debian GNU/Linux"
VERSION_ID="12"
VERSION="12 (bookworm)"
VERSION_CODENAME=bookworm
ID=debian
HOME_URL="https://www.debian.org/"
"#;

    #[test]
    fn os_release_of_debian_and_ubuntu() {
        let d = OsRelease::parse(BOOKWORM);
        assert_eq!((d.id.as_str(), d.version_id.as_str(), d.codename.as_str()), ("debian", "12", "bookworm"));
        assert_eq!(d.family(), Family::Debian);
        assert_eq!(d.describe(), "Debian GNU/Linux 12 (bookworm)");
        let u = OsRelease::parse("ID=ubuntu\nID_LIKE=debian\nVERSION_ID=\"24.04\"\nVERSION_CODENAME=noble\n");
        assert_eq!(u.family(), Family::Debian);
        let mint = OsRelease::parse("ID=linuxmint\nID_LIKE='ubuntu debian'\n");
        assert_eq!(mint.id_like, vec!["ubuntu", "debian"]);
        assert_eq!(mint.family(), Family::Debian);
        let al = OsRelease::parse("# comment\nID=\"amzn\"\nID_LIKE=\"centos rhel fedora\"\nVERSION_ID=\"2023\"\n");
        assert_eq!(al.family(), Family::Other);
        assert_eq!(al.describe(), "amzn 2023");
        assert_eq!(OsRelease::parse("garbage\n=\n").family(), Family::Other);
    }

    #[test]
    fn kops_list_then_the_specs_without_repeats() {
        let extra = vec!["jq".to_string(), "iptables".to_string(), "jq".to_string()];
        assert_eq!(required(Family::Debian, false, &extra), ["iptables", "libapparmor1", "libseccomp2", "util-linux", "jq"]);
        assert_eq!(required(Family::Debian, true, &[]), ["iptables", "libapparmor1", "libseccomp2", "nftables", "util-linux"]);
        assert_eq!(required(Family::Other, true, &extra), ["jq", "iptables"]);
        assert_eq!(base(Family::Debian), required(Family::Debian, false, &[]));
    }

    #[test]
    fn apt_source_in_the_file_repository() {
        let os = OsRelease::parse(BOOKWORM);
        let repo = apt_repository("http://10.0.0.1:8080/files/");
        assert_eq!(repo, "http://10.0.0.1:8080/files/apt");
        assert_eq!(
            apt_source_line(&repo, &os, true),
            "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://10.0.0.1:8080/files/apt/debian bookworm main"
        );
        assert_eq!(apt_source_line(&repo, &os, false), "deb http://10.0.0.1:8080/files/apt/debian bookworm main");
    }

    #[test]
    fn dpkg_status_says_what_is_installed() {
        let status = "Package: iptables\nStatus: install ok installed\nVersion: 1.8.9\n\nPackage: libapparmor1\nStatus: deinstall ok config-files\n\nPackage: util-linux\nEssential: yes\nStatus: install ok installed\n\nPackage: half\nStatus: install ok unpacked\n";
        let want: Vec<String> = ["iptables", "libapparmor1", "util-linux", "half", "jq"].map(str::to_string).to_vec();
        assert_eq!(missing_from_dpkg_status(status, &want), ["libapparmor1", "half", "jq"]);
        assert_eq!(missing_from_dpkg_status("", &want), want);
    }
}
