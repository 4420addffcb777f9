//! The local asset mirror: the files a NodeupConfig names, under the URL paths the compiler's
//! `assets.fileRepository` rewriting gives them, built from what can be had offline:
//!
//! | asset (upstream name)                      | served content                                              |
//! |--------------------------------------------|-------------------------------------------------------------|
//! | `containerd-<v>-linux-amd64.tar.gz`        | containerd `<v>` built from its Go module (`tests/kubernetes/build-containerd.sh`), upstream layout |
//! | `runc.amd64`                               | [`RUNC_SHIM`]: Debian's runc (in the machines' rootfs) behind a shim for this host's missing `CAP_SYS_RESOURCE` |
//! | `cni-plugins-linux-amd64-v<v>.tgz`         | Debian `containernetworking-plugins`' `/usr/lib/cni/*`, flat as upstream |
//! | `kubelet`, `kubectl`                       | built from the `k8s.io/kubernetes` Go module at the cluster's version (`tests/kubernetes/build.sh`) |
//! | `ecr-credential-provider-*`                | a script that says it is not available offline              |
//! | `protokube`, `nodeup`                      | this workspace's builds                                     |
//!
//! arm64 assets (a Graviton group's) are the same, built for arm64: Kubernetes and containerd
//! cross-compiled from the same modules, Debian's arm64 `containernetworking-plugins`, runc the
//! shim over the arm64 rootfs' runc, and nodeup/protokube from `scripts/build-arm64`
//! ([`arm64_bin_dir`]). Which architecture a URL is for: [`url_arch`].
//!
//! Every file's sha256 goes into a hash-override file (`KEELSON_ASSET_HASHES`, read by the versions
//! table), so nodeup verifies what it downloads exactly as it would from upstream.
//! Debian packages come from `apt-get download` and the repacked archives are cached, keyed by
//! the package versions, so their hashes are stable from run to run.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::arch::Arch;
use crate::cmd::{self, CmdError};

pub const DEBIAN_PACKAGES: &[&str] = &["containernetworking-plugins"];

/// The local cloud's `runc` asset. This host (itself a container) lacks `CAP_SYS_RESOURCE`, so no
/// process on it may lower an `oom_score_adj` below 0 — which the kubelet asks runc to do for every
/// pod sandbox (-998) and critical container (-997), and runc fails the container when the write is
/// refused. The shim raises negative `oomScoreAdj` values in the bundle's `config.json` (or an exec's
/// process file) to 0 and runs Debian's runc (`/usr/sbin/runc`, part of the machines' rootfs) — or,
/// on a machine of another architecture, the host's runc the harness binds at
/// [`crate::rootfs::NATIVE_RUNC`] (qemu-user cannot emulate runc's clone into new namespaces).
/// Nothing of this reaches the product: nodeup installs whatever the `runc` asset is.
pub const RUNC_SHIM: &str = r#"#!/bin/sh
# keelson-local runc shim: this host cannot lower oom_score_adj (no CAP_SYS_RESOURCE); clamp the
# OCI spec's negative oomScoreAdj to 0, then run Debian's runc.
prev=
for a in "$@"; do
  case $prev in
    --bundle|-b) [ -f "$a/config.json" ] && sed -i -E 's/"oomScoreAdj":-[0-9]+/"oomScoreAdj":0/' "$a/config.json" ;;
    --process|-p) [ -f "$a" ] && sed -i -E 's/"oomScoreAdj":-[0-9]+/"oomScoreAdj":0/' "$a" ;;
  esac
  prev=$a
done
# A machine of another architecture (under qemu-user): the host's runc, bound here by keelson-local.
[ -x /usr/local/lib/keelson-local/native/runc ] && exec /usr/local/lib/keelson-local/native/runc "$@"
exec /usr/sbin/runc "$@"
"#;

/// What the mirror serves that was built from source for this cluster, for one architecture.
#[derive(Debug, Clone)]
pub struct LocalBuilds {
    /// Holds `kubelet` and `kubectl` of the cluster's Kubernetes version.
    pub kubernetes_bin: PathBuf,
    /// `containerd-<v>-linux-<arch>.tar.gz` of the cluster's containerd version.
    pub containerd_archive: PathBuf,
}

/// The builds from source, per architecture (empty before they are built).
pub type LocalBuildsByArch = BTreeMap<Arch, LocalBuilds>;

/// The architecture an asset URL is for, by the names upstream gives them (`…/linux/arm64/kubelet`,
/// `containerd-2.3.4-linux-arm64.tar.gz`, `runc.arm64`, `cni-plugins-linux-arm64-v1.9.0.tgz`);
/// amd64 otherwise.
pub fn url_arch(url: &str) -> Arch {
    let path = url_path(url);
    let arm = path.split('/').any(|c| c == "arm64")
        || path.rsplit('/').next().is_some_and(|name| name.contains("-arm64") || name.contains("_arm64") || name.ends_with(".arm64"));
    if arm {
        Arch::Arm64
    } else {
        Arch::Amd64
    }
}

/// Where the arm64 builds of nodeup and protokube are: `$KEELSON_ARM64_BIN_DIR`, else where
/// `scripts/build-arm64` puts them (`<target>/aarch64-unknown-linux-gnu/release`, beside the
/// harness's own target directory).
pub fn arm64_bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("KEELSON_ARM64_BIN_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    let bins = bin_dir();
    bins.parent().unwrap_or(&bins).join("aarch64-unknown-linux-gnu/release")
}

#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    #[error("mirror: {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("mirror: {0}")]
    Cmd(#[from] CmdError),
    #[error("mirror: no way to build asset {url:?} offline (unknown file name {name:?})")]
    UnknownAsset { url: String, name: String },
    #[error("mirror: {what} not found at {path} (build the workspace: cargo build --workspace)")]
    MissingBinary { what: String, path: PathBuf },
    #[error("mirror: Debian package {package}: {detail}")]
    Debian { package: String, detail: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> MirrorError + '_ {
    move |source| MirrorError::Io { path: path.to_path_buf(), source }
}

pub fn sha256_file(path: &Path) -> Result<String, MirrorError> {
    let mut f = fs::File::open(path).map_err(io(path))?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).map_err(io(path))?;
    Ok(hex::encode(h.finalize()))
}

/// Debian packages of this host's architecture unpacked under `cache/debian/<pkg>_<version>_<arch>/`.
pub fn debian_package(cache: &Path, package: &str) -> Result<PathBuf, MirrorError> {
    debian_package_for(cache, package, crate::arch::host())
}

/// `apt-get` options that make it fetch `arch`'s packages with lists of its own under `dir`,
/// leaving the host's apt configuration and lists as they are (its sources are used as they are).
pub fn foreign_apt_options(dir: &Path, arch: Arch) -> Vec<String> {
    let d = dir.display();
    [
        format!("APT::Architecture={arch}"),
        format!("APT::Architectures::={arch}"),
        format!("Dir::State::Lists={d}/lists"),
        format!("Dir::Cache={d}/cache"),
        format!("Dir::State::status={d}/status"),
    ]
    .into_iter()
    .flat_map(|o| ["-o".to_string(), o])
    .collect()
}

/// A Debian package of `arch` unpacked under `cache/debian/<pkg>_<version>_<arch>/`: the host's
/// own with `apt-get download`; another architecture's through lists of its own
/// ([`foreign_apt_options`]), fetched once.
pub fn debian_package_for(cache: &Path, package: &str, arch: Arch) -> Result<PathBuf, MirrorError> {
    let foreign = arch != crate::arch::host();
    let apt_dir = cache.join(format!("apt-{arch}"));
    let apt_opts = if foreign { foreign_apt_options(&apt_dir, arch) } else { Vec::new() };
    if foreign {
        for d in ["lists/partial", "cache/archives/partial"] {
            fs::create_dir_all(apt_dir.join(d)).map_err(io(&apt_dir))?;
        }
        let status = apt_dir.join("status");
        if !status.exists() {
            fs::write(&status, "").map_err(io(&status))?;
        }
    }
    let package = if foreign { format!("{package}:{arch}") } else { package.to_string() };
    let package = package.as_str();
    let name = package.split(':').next().unwrap_or(package);
    let dir = cache.join("debian");
    fs::create_dir_all(&dir).map_err(io(&dir))?;
    let existing = |dir: &Path| -> Option<PathBuf> {
        let mut v: Vec<PathBuf> = fs::read_dir(dir)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.is_dir()
                    && p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&format!("{name}_")) && n.ends_with(&format!("_{arch}")))
                    && p.join(".complete").exists()
            })
            .collect();
        v.sort();
        v.pop()
    };
    if let Some(p) = existing(&dir) {
        return Ok(p);
    }
    let download = |dir: &Path| cmd::run(Command::new("apt-get").args(&apt_opts).args(["download", "-q", package]).current_dir(dir));
    if download(&dir).is_err() {
        eprintln!("keelson-local: apt-get download {package} failed; running apt-get update once");
        cmd::run(Command::new("apt-get").args(&apt_opts).args(["update", "-qq"]))?;
        download(&dir).map_err(|e| MirrorError::Debian { package: package.into(), detail: e.to_string() })?;
    }
    let deb = fs::read_dir(&dir)
        .map_err(io(&dir))?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.extension().is_some_and(|x| x == "deb")
                && p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&format!("{name}_")) && n.ends_with(&format!("_{arch}.deb")))
        })
        .ok_or_else(|| MirrorError::Debian { package: package.into(), detail: "apt-get download left no .deb".into() })?;
    let stem = deb.file_stem().and_then(|s| s.to_str()).unwrap_or(name).to_string();
    let out = dir.join(&stem);
    let _ = fs::remove_dir_all(&out);
    cmd::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&out))?;
    fs::write(out.join(".complete"), "").map_err(io(&out))?;
    let _ = fs::remove_file(&deb);
    Ok(out)
}

/// A deterministic .tar.gz of `(name in archive, file on disk)` entries (mtime 0, root-owned).
fn tar_gz(dest: &Path, entries: &[(String, PathBuf)]) -> Result<(), MirrorError> {
    let tmp = dest.with_extension("tmp");
    let f = fs::File::create(&tmp).map_err(io(&tmp))?;
    let gz = flate2::write::GzEncoder::new(f, flate2::Compression::fast());
    let mut tb = tar::Builder::new(gz);
    for (name, src) in entries {
        let data = fs::read(src).map_err(io(src))?;
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o755);
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        h.set_entry_type(tar::EntryType::Regular);
        tb.append_data(&mut h, name, data.as_slice()).map_err(io(src))?;
    }
    let gz = tb.into_inner().map_err(io(&tmp))?;
    gz.finish().map_err(io(&tmp))?.flush().map_err(io(&tmp))?;
    fs::rename(&tmp, dest).map_err(io(dest))
}

fn script(dest: &Path, text: &str) -> Result<(), MirrorError> {
    fs::write(dest, text).map_err(io(dest))?;
    fs::set_permissions(dest, fs::Permissions::from_mode(0o755)).map_err(io(dest))
}

fn copy(src: &Path, dest: &Path, what: &str) -> Result<(), MirrorError> {
    if !src.is_file() {
        return Err(MirrorError::MissingBinary { what: what.into(), path: src.to_path_buf() });
    }
    fs::copy(src, dest).map_err(io(dest))?;
    Ok(())
}

/// The path part of a URL (`http://h:p/a/b` → `a/b`).
pub fn url_path(url: &str) -> String {
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
    rest.split_once('/').map(|(_, p)| p).unwrap_or("").to_string()
}

/// Where the harness's binaries are: next to this executable (cargo's target dir), or `$KEELSON_BIN_DIR`.
pub fn bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("KEELSON_BIN_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .map(|d| if d.ends_with("deps") { d.parent().map(Path::to_path_buf).unwrap_or(d) } else { d })
        .unwrap_or_else(|| PathBuf::from("."))
}

/// The builds from source for the architecture `url` is for.
fn need_local<'a>(local: &'a LocalBuildsByArch, url: &str) -> Result<&'a LocalBuilds, MirrorError> {
    let arch = url_arch(url);
    local
        .get(&arch)
        .ok_or_else(|| MirrorError::UnknownAsset { url: url.to_string(), name: format!("built from source for {arch}, but those sources were not built yet") })
}

/// Build the file an asset URL names into `dest` (its content depends only on the file name and
/// the architecture [`url_arch`] reads from the URL). `local` holds the assets built from source
/// (kubelet, kubectl, containerd), per architecture.
pub fn build_asset(cache: &Path, bins: &Path, local: &LocalBuildsByArch, url: &str, dest: &Path) -> Result<(), MirrorError> {
    let name = url.rsplit('/').next().unwrap_or("").to_string();
    let arch = url_arch(url);
    if let Some(d) = dest.parent() {
        fs::create_dir_all(d).map_err(io(d))?;
    }
    let not_offline = |what: &str| format!("#!/bin/sh\necho \"{what} is not available in keelson-local (it cannot be downloaded offline)\" >&2\nexit 1\n");
    let own_build = |bin: &str| -> Result<(), MirrorError> {
        if arch == crate::arch::host() {
            return copy(&bins.join(bin), dest, bin);
        }
        let built = arm64_bin_dir().join(bin);
        if arch == Arch::Arm64 && built.is_file() {
            return copy(&built, dest, bin);
        }
        if bin == "protokube" {
            // Control planes run protokube; an arm64 one needs the arm64 build, a worker does not.
            return script(dest, &not_offline(&format!("an {arch} protokube build (scripts/build-arm64)")));
        }
        Err(MirrorError::MissingBinary { what: format!("the {arch} {bin} build (scripts/build-arm64 makes it)"), path: built })
    };
    match name.as_str() {
        "kubelet" | "kubectl" => copy(&need_local(local, url)?.kubernetes_bin.join(&name), dest, &name),
        "protokube" | "nodeup" => own_build(&name),
        n if n.starts_with("ecr-credential-provider") || n.starts_with("auth-provider-gcp") => script(dest, &not_offline(n)),
        // The shim runs the machine's own runc: arm64's in an arm64 rootfs.
        n if n.starts_with("runc.") => script(dest, RUNC_SHIM),
        n if n.starts_with("containerd-") && n.ends_with(".tar.gz") => {
            let local = need_local(local, url)?;
            let built = local.containerd_archive.file_name().and_then(|f| f.to_str()).unwrap_or("");
            if built != n {
                return Err(MirrorError::UnknownAsset { url: url.to_string(), name: format!("{n} (built: {built})") });
            }
            copy(&local.containerd_archive, dest, "containerd archive")
        }
        n if n.starts_with("cni-plugins-") && (n.ends_with(".tgz") || n.ends_with(".tar.gz")) => {
            let pkg = debian_package_for(cache, "containernetworking-plugins", arch)?;
            let cached = cache.join(format!("repacked/{}-{}", pkg.file_name().and_then(|s| s.to_str()).unwrap_or(""), "cni-plugins.tgz"));
            if !cached.exists() {
                fs::create_dir_all(cached.parent().unwrap_or(cache)).map_err(io(cache))?;
                let dir = pkg.join("usr/lib/cni");
                let mut entries: Vec<(String, PathBuf)> = fs::read_dir(&dir)
                    .map_err(io(&dir))?
                    .flatten()
                    .filter(|e| e.path().is_file())
                    .map(|e| (format!("./{}", e.file_name().to_string_lossy()), e.path()))
                    .collect();
                entries.sort();
                tar_gz(&cached, &entries)?;
            }
            fs::copy(&cached, dest).map_err(io(dest))?;
            Ok(())
        }
        _ => Err(MirrorError::UnknownAsset { url: url.to_string(), name }),
    }
}

/// Build every asset in `urls` under `root` (at each URL's path) and return url → sha256.
pub fn build(cache: &Path, bins: &Path, local: &LocalBuildsByArch, root: &Path, urls: &[String]) -> Result<BTreeMap<String, String>, MirrorError> {
    let mut hashes = BTreeMap::new();
    for url in urls {
        let dest = root.join(url_path(url));
        if !dest.exists() {
            build_asset(cache, bins, local, url, &dest)?;
        }
        let h = sha256_file(&dest)?;
        // Also publish `<file>.sha256`, as upstream release sites do.
        let side = PathBuf::from(format!("{}.sha256", dest.display()));
        fs::write(&side, format!("{h}\n")).map_err(io(&side))?;
        hashes.insert(url.clone(), h);
    }
    Ok(hashes)
}

/// The `keelson --asset-hashes` file.
pub fn write_overrides(path: &Path, hashes: &BTreeMap<String, String>) -> Result<(), MirrorError> {
    let mut s = String::from("# keelson-local asset mirror: url <TAB> sha256 (keelson compile/apply --asset-hashes)\n");
    for (u, h) in hashes {
        s.push_str(&format!("{u}\t{h}\n"));
    }
    fs::write(path, s).map_err(io(path))
}

/// Read a `--asset-hashes` file [`write_overrides`] wrote (url → sha256).
pub fn read_overrides(path: &Path) -> Result<BTreeMap<String, String>, MirrorError> {
    let text = fs::read_to_string(path).map_err(io(path))?;
    Ok(text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split_once('\t'))
        .map(|(u, h)| (u.trim().to_string(), h.trim().to_string()))
        .collect())
}

/// The URLs of every asset of `arches` the compiled nodeup configs under `compiled/nodeup` name
/// that start with one of `prefixes` (what the local mirror must serve).
pub fn compiled_asset_urls(compiled: &Path, prefixes: &[&str], arches: &[Arch]) -> Result<Vec<String>, MirrorError> {
    let dir = compiled.join("nodeup");
    let mut urls = std::collections::BTreeSet::new();
    for e in fs::read_dir(&dir).map_err(io(&dir))?.flatten() {
        let path = e.path();
        let text = fs::read_to_string(&path).map_err(io(&path))?;
        let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).map_err(|e| MirrorError::Io { path: path.clone(), source: std::io::Error::other(e) })?;
        let assets = v.get("Assets");
        for a in arches.iter().filter_map(|arch| assets.and_then(|a| a.get(arch.as_str()))).filter_map(|a| a.as_sequence()).flatten() {
            if let Some((_, rest)) = a.as_str().and_then(|s| s.split_once('@')) {
                urls.insert(rest.split(',').next().unwrap_or(rest).to_string());
            }
        }
    }
    Ok(urls.into_iter().filter(|u| prefixes.iter().any(|p| u.starts_with(p))).collect())
}

/// Serve `root` read-only over HTTP on `listener`.
pub async fn serve(listener: tokio::net::TcpListener, root: PathBuf) {
    use crate::httpd::{Body, Request, Response};
    let handler = move |r: &Request| {
        if r.method != "GET" && r.method != "HEAD" {
            return Response::text(405, "");
        }
        let rel = r.path.trim_start_matches('/');
        if rel.split('/').any(|c| c == ".." || c.is_empty()) {
            return Response::text(404, "not found\n");
        }
        let p = root.join(rel);
        if p.is_file() {
            Response { status: 200, headers: vec![("Content-Type".into(), "application/octet-stream".into())], body: Body::File(p) }
        } else {
            Response::text(404, "not found\n")
        }
    };
    crate::httpd::serve(listener, std::sync::Arc::new(handler)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runc_shim_runs_the_native_runc_where_the_harness_binds_it() {
        assert!(RUNC_SHIM.contains(&format!("[ -x /{0} ] && exec /{0} \"$@\"", crate::rootfs::NATIVE_RUNC)), "{RUNC_SHIM}");
    }

    #[test]
    fn asset_urls_name_their_architecture() {
        for url in [
            "http://10.0.0.1:8080/release/v1.34.4/bin/linux/arm64/kubelet",
            "http://m/containerd/containerd/releases/download/v2.3.4/containerd-2.3.4-linux-arm64.tar.gz",
            "http://m/opencontainers/runc/releases/download/v1.4.3/runc.arm64",
            "http://m/containernetworking/plugins/releases/download/v1.9.0/cni-plugins-linux-arm64-v1.9.0.tgz",
            "http://m/kops/linux/arm64/protokube",
        ] {
            assert_eq!(url_arch(url), Arch::Arm64, "{url}");
        }
        for url in [
            "http://10.0.0.1:8080/release/v1.34.4/bin/linux/amd64/kubelet",
            "http://m/containerd-2.3.4-linux-amd64.tar.gz",
            "http://m/runc.amd64",
            "http://m/keelson/nodeup",
            // A directory that merely mentions the architecture is not one.
            "http://m/arm64-mirror/linux/amd64/kubectl",
        ] {
            assert_eq!(url_arch(url), Arch::Amd64, "{url}");
        }
    }

    #[test]
    fn foreign_packages_use_lists_of_their_own() {
        let o = foreign_apt_options(Path::new("/c/apt-arm64"), Arch::Arm64).join(" ");
        assert!(o.contains("-o APT::Architecture=arm64") && o.contains("-o Dir::State::Lists=/c/apt-arm64/lists"), "{o}");
        assert!(o.contains("Dir::State::status=/c/apt-arm64/status"), "the host's dpkg status is left alone: {o}");
    }

    #[test]
    fn url_paths() {
        assert_eq!(url_path("http://10.0.0.1:8080/release/v1/bin/kubelet"), "release/v1/bin/kubelet");
        assert_eq!(url_path("https://h/x"), "x");
    }

    #[test]
    fn tarballs_are_deterministic() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("containerd");
        fs::write(&src, b"binary").unwrap();
        let a = d.path().join("a.tar.gz");
        let b = d.path().join("b.tar.gz");
        tar_gz(&a, &[("bin/containerd".into(), src.clone())]).unwrap();
        tar_gz(&b, &[("bin/containerd".into(), src)]).unwrap();
        assert_eq!(sha256_file(&a).unwrap(), sha256_file(&b).unwrap());
        let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(fs::File::open(&a).unwrap()));
        let names: Vec<String> = ar.entries().unwrap().map(|e| e.unwrap().path().unwrap().display().to_string()).collect();
        assert_eq!(names, ["bin/containerd"]);
    }
}
