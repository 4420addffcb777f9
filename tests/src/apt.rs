//! The asset mirror's Debian archive subset: what nodeup installs the hosts' packages from
//! (`keelson_api::host_packages`) when the cluster mirrors its files, as a site without Internet
//! access keeps a Debian mirror of its own. It is Debian's archive, cut down and not rebuilt: the
//! `InRelease` file as Debian signed it, the `Packages.xz` index it names (also under `by-hash/`,
//! where apt asks for it), and the `.deb` files a machine of this rootfs lacks — each checked
//! against the signed index before it is served, so the machines' apt verifies the same chain it
//! would against deb.debian.org.
//!
//! Which files: apt itself decides, in a throw-away overlay of the machines' own rootfs
//! (`apt-get install --print-uris` of the packages nodeup will ask for), so the subset holds exactly
//! the dependency closure the machines need.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::arch::Arch;
use crate::cmd;
use crate::rootfs::{self, Suite};

#[derive(Debug, thiserror::Error)]
pub enum AptError {
    #[error("Debian archive subset: {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("Debian archive subset for {suite} {arch}: {message}")]
    Subset { suite: String, arch: String, message: String },
    #[error(transparent)]
    Cmd(#[from] cmd::CmdError),
    #[error(transparent)]
    Rootfs(#[from] rootfs::RootfsError),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> AptError + '_ {
    move |source| AptError::Io { path: path.to_path_buf(), source }
}

/// One file apt would download: where from and its size (`--print-uris`; the hash apt prints
/// there is whichever it likes, MD5 on Debian 12's apt, so the SHA-256 comes from the signed
/// index instead, [`packages_sha256`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uri {
    pub url: String,
    pub size: u64,
}

/// Parse `apt-get --print-uris` lines: `'URL' FILE SIZE HASHTYPE:HEX`.
pub fn parse_print_uris(text: &str) -> Result<Vec<Uri>, String> {
    let mut out = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| l.starts_with('\'')) {
        let mut f = line.split_whitespace();
        let (Some(url), Some(_file), Some(size)) = (f.next(), f.next(), f.next()) else {
            return Err(format!("unexpected --print-uris line {line:?}"));
        };
        let url = url.trim_matches('\'').to_string();
        let size = size.parse().map_err(|_| format!("size {size:?} in {line:?}"))?;
        out.push(Uri { url, size });
    }
    Ok(out)
}

/// `Filename` → (SHA-256, size) of every stanza of a `Packages` index.
pub fn packages_sha256(index: &str) -> std::collections::BTreeMap<String, (String, u64)> {
    let mut out = std::collections::BTreeMap::new();
    for stanza in index.split("\n\n") {
        let (mut file, mut sha, mut size) = (None, None, None);
        for line in stanza.lines() {
            if let Some(v) = line.strip_prefix("Filename:") {
                file = Some(v.trim().to_string());
            } else if let Some(v) = line.strip_prefix("SHA256:") {
                sha = Some(v.trim().to_ascii_lowercase());
            } else if let Some(v) = line.strip_prefix("Size:") {
                size = v.trim().parse().ok();
            }
        }
        if let (Some(f), Some(h), Some(n)) = (file, sha, size) {
            out.insert(f, (h, n));
        }
    }
    out
}

/// The `SHA256:` entries of a Release/InRelease file: path → (hash, size).
pub fn release_sha256(release: &str) -> std::collections::BTreeMap<String, (String, u64)> {
    let mut out = std::collections::BTreeMap::new();
    let mut in_sha256 = false;
    for line in release.lines() {
        if !line.starts_with(' ') {
            in_sha256 = line.trim_end() == "SHA256:";
            continue;
        }
        if in_sha256 {
            let f: Vec<&str> = line.split_whitespace().collect();
            if let [hash, size, path] = f[..] {
                if let Ok(size) = size.parse() {
                    out.insert(path.to_string(), (hash.to_ascii_lowercase(), size));
                }
            }
        }
    }
    out
}

/// The archive path of a URL under the Debian mirror `base` (`…/debian/pool/x` → `pool/x`).
fn under(base: &str, url: &str) -> Option<String> {
    url.strip_prefix(&format!("{}/", base.trim_end_matches('/'))).map(str::to_string).filter(|p| !p.split('/').any(|s| s == ".." || s.is_empty()))
}

fn sha256_of(path: &Path) -> Result<String, AptError> {
    let mut f = fs::File::open(path).map_err(io(path))?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).map_err(io(path))?;
    Ok(hex::encode(h.finalize()))
}

/// Download `url` to `dest` and check its SHA-256 (bounded: curl's own retries and timeouts).
fn fetch_checked(url: &str, dest: &Path, sha256: &str) -> Result<(), AptError> {
    if dest.is_file() && sha256_of(dest)? == sha256 {
        return Ok(());
    }
    if let Some(d) = dest.parent() {
        fs::create_dir_all(d).map_err(io(d))?;
    }
    let tmp = dest.with_extension("part");
    cmd::run(Command::new("curl").args(["-fsSL", "--retry", "3", "--connect-timeout", "10", "--max-time", "300", "-o"]).arg(&tmp).arg(url))?;
    let got = sha256_of(&tmp)?;
    if got != sha256 {
        let _ = fs::remove_file(&tmp);
        return Err(AptError::Io { path: dest.to_path_buf(), source: std::io::Error::other(format!("{url}: SHA-256 {got}, the signed index says {sha256}")) });
    }
    fs::rename(&tmp, dest).map_err(io(dest))
}

/// The packages the compiled NodeupConfigs (`compiled/nodeup/*`) have nodeup install on a Debian
/// host: `keelson_api::host_packages::required` of each (kube-proxy's mode, the spec's
/// `packages`), all of them once.
pub fn packages_of_compiled(compiled: &Path) -> Result<Vec<String>, AptError> {
    use keelson_api::host_packages::{required_by, Family};
    let dir = compiled.join("nodeup");
    let mut out: Vec<String> = Vec::new();
    let mut paths: Vec<PathBuf> = fs::read_dir(&dir).map_err(io(&dir))?.flatten().map(|e| e.path()).collect();
    paths.sort();
    for path in paths {
        let text = fs::read_to_string(&path).map_err(io(&path))?;
        let cfg: keelson_api::nodeup::NodeupConfig =
            serde_yaml_ng::from_str(&text).map_err(|e| AptError::Io { path: path.clone(), source: std::io::Error::other(e) })?;
        for p in required_by(Family::Debian, &cfg) {
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    Ok(out)
}

/// The subset's cache directory for `suite`, `arch` and `packages` (its key names them all and
/// the rootfs it was cut for).
fn cache_dir(cache: &Path, arch: Arch, suite: Suite, packages: &[String]) -> PathBuf {
    let mut h = Sha256::new();
    h.update(rootfs::cache_key(suite));
    for p in packages {
        h.update([0]);
        h.update(p);
    }
    cache.join("apt-subset").join(format!("{}-{arch}-{}", suite.codename(), &hex::encode(h.finalize())[..12]))
}

/// Make (once; cached) and copy into `mirror_root/<keelson_api::host_packages::APT_DIR>/debian` the
/// archive subset a machine of `rootfs` (`suite`, `arch`) needs to install `packages`. Returns the
/// number of `.deb` files it holds.
pub fn mirror_subset(cache: &Path, rootfs: &Path, arch: Arch, suite: Suite, packages: &[String], mirror_root: &Path) -> Result<usize, AptError> {
    let dir = cache_dir(cache, arch, suite, packages);
    if !dir.join(".complete").exists() {
        build(&dir, rootfs, arch, suite, packages)?;
    }
    let debs = fs::read_to_string(dir.join(".complete")).map_err(io(&dir))?.trim().parse().unwrap_or(0);
    let dest = mirror_root.join(keelson_api::host_packages::APT_DIR).join("debian");
    fs::create_dir_all(&dest).map_err(io(&dest))?;
    cmd::run(Command::new("cp").args(["-a", "--reflink=auto"]).arg(format!("{}/debian/.", dir.display())).arg(&dest))?;
    Ok(debs)
}

fn build(dir: &Path, rootfs: &Path, arch: Arch, suite: Suite, packages: &[String]) -> Result<(), AptError> {
    let err = |message: String| AptError::Subset { suite: suite.to_string(), arch: arch.to_string(), message };
    let base = rootfs::debian_mirror();
    eprintln!("keelson-local: cutting the Debian archive subset for {suite} {arch} ({}) from {base}", packages.join(" "));
    let _ = fs::remove_dir_all(dir);
    let work = dir.with_extension("work");
    let _ = cmd::run(Command::new("umount").arg(work.join("merged")));
    let _ = fs::remove_dir_all(&work);
    let (upper, wd, merged) = (work.join("upper"), work.join("work"), work.join("merged"));
    let overlay = rootfs::instantiate(&rootfs::Lower::from(rootfs.to_path_buf()), &upper, &wd, &merged)?;
    let result = (|| -> Result<(String, Vec<Uri>), AptError> {
        // apt in the machines' own root: its status database, its sources (debootstrap's: this
        // mirror, the suite, main), its keyring.
        let resolv = merged.join("etc/resolv.conf");
        let _ = fs::remove_file(&resolv);
        fs::copy("/etc/resolv.conf", &resolv).map_err(io(&resolv))?;
        let chroot_apt = |args: &[&str]| {
            let mut c = Command::new("chroot");
            c.arg(&merged).args(["apt-get", "-q"]).args(args).env("DEBIAN_FRONTEND", "noninteractive");
            c
        };
        cmd::run(&mut chroot_apt(&["update"]))?;
        let mut install = vec!["-qq", "--print-uris", "install", "-y", "--no-install-recommends"];
        install.extend(packages.iter().map(String::as_str));
        let out = cmd::run(&mut chroot_apt(&install))?;
        let uris = parse_print_uris(&out).map_err(err)?;
        let lists = merged.join("var/lib/apt/lists");
        let in_release = fs::read_dir(&lists)
            .map_err(io(&lists))?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.ends_with(&format!("_dists_{}_InRelease", suite.codename()))))
            .ok_or_else(|| err(format!("apt-get update left no InRelease of {} in {}", suite.codename(), lists.display())))?;
        Ok((fs::read_to_string(&in_release).map_err(io(&in_release))?, uris))
    })();
    if overlay {
        let _ = cmd::run(Command::new("umount").arg(&merged));
    }
    let _ = fs::remove_dir_all(&work);
    let (in_release, uris) = result?;

    let root = dir.join("debian");
    let dists = root.join("dists").join(suite.codename());
    fs::create_dir_all(&dists).map_err(io(&dists))?;
    fs::write(dists.join("InRelease"), &in_release).map_err(io(&dists))?;
    let index = format!("{}/binary-{arch}/Packages.xz", keelson_api::host_packages::APT_COMPONENT);
    let (hash, _) = release_sha256(&in_release).remove(&index).ok_or_else(|| err(format!("InRelease names no {index}")))?;
    let index_path = dists.join(&index);
    fetch_checked(&format!("{}/dists/{}/{index}", base.trim_end_matches('/'), suite.codename()), &index_path, &hash)?;
    let by_hash = dists.join(format!("{}/binary-{arch}/by-hash/SHA256/{hash}", keelson_api::host_packages::APT_COMPONENT));
    if let Some(d) = by_hash.parent() {
        fs::create_dir_all(d).map_err(io(d))?;
    }
    fs::copy(&index_path, &by_hash).map_err(io(&by_hash))?;
    // Each .deb's SHA-256 from the index the signed InRelease vouches for.
    let index_text = cmd::run(Command::new("xz").arg("-dc").arg(&index_path))?;
    let debs = packages_sha256(&index_text);
    for u in &uris {
        let rel = under(&base, &u.url).ok_or_else(|| err(format!("{} is not under the mirror {base}", u.url)))?;
        let (sha256, size) = debs.get(&rel).ok_or_else(|| err(format!("{rel} is not in {index}")))?;
        if *size != u.size {
            return Err(err(format!("{rel}: apt says {} bytes, the index {size}", u.size)));
        }
        fetch_checked(&u.url, &root.join(&rel), sha256)?;
    }
    fs::write(dir.join(".complete"), uris.len().to_string()).map_err(io(dir))?;
    eprintln!("keelson-local: Debian archive subset for {suite} {arch}: {} packages", uris.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn print_uris_lines() {
        let text = "'http://deb.debian.org/debian/pool/main/i/iptables/iptables_1.8.9-2_amd64.deb' iptables_1.8.9-2_amd64.deb 381908 SHA256:ABCDEF0123\n\
                    'http://deb.debian.org/debian/pool/main/n/netbase/netbase_6.4_all.deb' netbase_6.4_all.deb 12800 MD5Sum:814246d2f01d3238bbd3ef8c15c57076\n";
        let u = parse_print_uris(text).expect("parse");
        assert_eq!(u.len(), 2);
        assert_eq!(u[0], Uri { url: "http://deb.debian.org/debian/pool/main/i/iptables/iptables_1.8.9-2_amd64.deb".into(), size: 381908 });
        assert_eq!(u[1].size, 12800);
        assert!(parse_print_uris("'http://x/y.deb' y.deb\n").is_err());
        assert!(parse_print_uris("Reading package lists...\n").expect("none").is_empty());
    }

    #[test]
    fn index_hashes() {
        let index = "Package: netbase\nVersion: 6.4\nFilename: pool/main/n/netbase/netbase_6.4_all.deb\nSize: 12800\nMD5sum: 8142\nSHA256: ABCD\n\nPackage: broken\nFilename: pool/x.deb\n";
        let h = packages_sha256(index);
        assert_eq!(h.get("pool/main/n/netbase/netbase_6.4_all.deb"), Some(&("abcd".to_string(), 12800)));
        assert_eq!(h.len(), 1, "a stanza without its hash is not taken");
    }

    #[test]
    fn release_hashes() {
        let r = "Origin: Debian\nMD5Sum:\n 0000 10 main/binary-amd64/Packages.xz\nSHA256:\n AAAA 123 main/binary-amd64/Packages.xz\n bbbb 99 main/binary-arm64/Packages.xz\n garbage\n";
        let h = release_sha256(r);
        assert_eq!(h.get("main/binary-amd64/Packages.xz"), Some(&("aaaa".to_string(), 123)));
        assert_eq!(h.len(), 2, "{h:?}");
    }

    #[test]
    fn only_paths_under_the_mirror() {
        assert_eq!(under("http://deb.debian.org/debian/", "http://deb.debian.org/debian/pool/main/x.deb").as_deref(), Some("pool/main/x.deb"));
        assert_eq!(under("http://deb.debian.org/debian", "http://elsewhere/pool/x.deb"), None);
        assert_eq!(under("http://m/debian", "http://m/debian/pool/../../etc/passwd"), None);
    }
}
