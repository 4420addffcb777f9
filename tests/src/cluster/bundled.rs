//! Clusters from a bundle: machines booted from a baked image (`--baked`), the way a cloud boots
//! them from an AMI built with `keelson bundle bake`: the harness makes a bundle of its own mirror
//! and registry with `keelson bundle create` (the product's code, not the harness's), bakes it with
//! `keelson bundle bake` into a directory that becomes the top layer of every machine's root, and
//! seeds each machine's `/var/lib/containerd` (a host directory bound into the machine, see
//! [`crate::machine`]) from the baked store. What a cloud's disk restore does, the seeding does with
//! hard links (the bolt databases, which containerd writes in place, are copied): it costs the host
//! milliseconds, not the machine's CPU. The cluster is then applied with `--image-digests` of the
//! bundle: every image the machines run is named by the digest the baked store holds.
//! `--air-gapped` uses the same bundle the other way: [`push`] fills an empty mirror and a fresh
//! registry with `keelson bundle push`, and the machines reach nothing else.

use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::Context as _;

use crate::cmd;

/// The architecture of the local machines (the mirror builds amd64 assets).
const BAKED_ARCH: &str = "amd64";

/// How the machines get what they run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Boot {
    /// From the rootfs with a baked image on top (`--baked`); else nodeup downloads every asset
    /// and the kubelet pulls every image.
    pub baked: bool,
    /// The mirror and the registry the machines reach hold only what `keelson bundle push` of the
    /// bundle put there (`--air-gapped`): an empty directory and a fresh registry, the harness's
    /// own builds (a staging mirror and registry) stopped and out of reach.
    pub air_gapped: bool,
}

impl Boot {
    pub const PLAIN: Boot = Boot { baked: false, air_gapped: false };

    /// Whether a bundle is made of the staging mirror and registry.
    pub fn needs_bundle(&self) -> bool {
        self.baked || self.air_gapped
    }

    /// The daemon's flags for this.
    pub fn flags(&self) -> Vec<&'static str> {
        [(self.baked, "--baked"), (self.air_gapped, "--air-gapped")].into_iter().filter_map(|(on, f)| on.then_some(f)).collect()
    }
}

/// What `keelson bundle create` needs to compile the local spec as `keelson apply` does.
pub struct BakeInputs<'a> {
    pub keelson: &'a Path,
    pub local_spec: &'a Path,
    pub overrides: &'a Path,
    pub kops_base: &'a str,
    pub nodeup_asset: &'a str,
    pub mirror_root: &'a Path,
    pub registry: &'a str,
    pub gw: Ipv4Addr,
}

/// Where [`create`] writes the bundle in the state directory `dir`.
pub fn bundle_path(dir: &Path) -> PathBuf {
    dir.join("bundle.tar")
}

/// Make the bundle of the staging mirror and registry ([`bundle_path`]).
pub fn create(dir: &Path, i: &BakeInputs) -> anyhow::Result<PathBuf> {
    let bundle = bundle_path(dir);
    let _ = fs::remove_file(&bundle);
    let t0 = Instant::now();
    let out = cmd::run(
        Command::new(i.keelson)
            .args(["bundle", "create", "--offline", "--arch", BAKED_ARCH, "-f"])
            .arg(i.local_spec)
            .arg("-o")
            .arg(&bundle)
            .arg("--from-mirror")
            .arg(format!("file://{}/", i.mirror_root.display()))
            .args(["--from-registry", i.registry])
            .arg("--asset-hashes")
            .arg(i.overrides)
            .args(["--nodeup-asset", i.nodeup_asset])
            .env("KOPS_BASE_URL", i.kops_base)
            .env(base::plain_http::ALLOW_ENV, i.gw.to_string())
            .env("KEELSON_LOG", "warn"),
    )
    .context("keelson bundle create of the local mirror and registry")?;
    eprintln!("keelson-local: {} ({:.1} s)", out.lines().last().unwrap_or_default(), t0.elapsed().as_secs_f64());
    Ok(bundle)
}

/// `keelson bundle push` of `bundle` into the (empty) directory the mirror serves and the (fresh)
/// registry the machines pull from.
pub fn push(keelson: &Path, bundle: &Path, mirror_root: &Path, registry: &str, gw: Ipv4Addr) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let out = cmd::run(
        Command::new(keelson)
            .args(["bundle", "push"])
            .arg(bundle)
            .arg("--file-repository")
            .arg(format!("file://{}", mirror_root.display()))
            .args(["--registry", registry])
            .env(base::plain_http::ALLOW_ENV, gw.to_string())
            .env("KEELSON_LOG", "warn"),
    )
    .context("keelson bundle push into the empty mirror and the fresh registry")?;
    eprintln!("keelson-local: bundle push: {} ({:.1} s)", out.lines().last().unwrap_or_default(), t0.elapsed().as_secs_f64());
    Ok(())
}

/// Bake `bundle` into `dir/baked` (images named for `registry`); returns the baked root.
pub fn bake(keelson: &Path, bundle: &Path, dir: &Path, registry: &str) -> anyhow::Result<PathBuf> {
    let root = dir.join("baked");
    if root.exists() {
        fs::remove_dir_all(&root).with_context(|| root.display().to_string())?;
    }
    fs::create_dir_all(&root)?;
    let t0 = Instant::now();
    let out =
        cmd::run(Command::new(keelson).args(["bundle", "bake"]).arg(bundle).arg("--root").arg(&root).args(["--registry", registry]).env("KEELSON_LOG", "warn"))
            .context("keelson bundle bake")?;
    eprintln!("keelson-local: {} ({:.1} s)", out.lines().last().unwrap_or_default(), t0.elapsed().as_secs_f64());
    Ok(root)
}

/// The baked containerd store under a baked root.
pub fn containerd_store(root: &Path) -> PathBuf {
    root.join(keelson_api::host_paths::CONTAINERD_ROOT.trim_start_matches('/'))
}

/// Seed a machine's containerd directory from the baked store: hard links, except the bolt
/// databases (`*.db`), which containerd rewrites in place and each machine must own.
pub fn seed_containerd(store: &Path, machine_dir: &Path) -> std::io::Result<()> {
    fs::create_dir_all(machine_dir)?;
    let status = Command::new("cp").arg("-al").arg(format!("{}/.", store.display())).arg(machine_dir).status()?;
    if !status.success() {
        return Err(std::io::Error::other(format!("cp -al {} {}: {status}", store.display(), machine_dir.display())));
    }
    copy_databases(store, machine_dir)
}

fn copy_databases(from: &Path, to: &Path) -> std::io::Result<()> {
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        if kind.is_dir() {
            // Snapshots' file trees hold no databases; skip their (many) files.
            if entry.file_name() != "snapshots" && entry.file_name() != "blobs" {
                copy_databases(&src, &dst)?;
            }
        } else if kind.is_file() && src.extension().is_some_and(|e| e == "db") {
            let tmp = dst.with_extension("db.seed");
            fs::copy(&src, &tmp)?;
            fs::rename(&tmp, &dst)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt as _;

    #[test]
    fn seeding_links_the_content_and_copies_the_databases() {
        let d = tempfile::tempdir().expect("tempdir");
        let store = d.path().join("store");
        fs::create_dir_all(store.join("io.containerd.metadata.v1.bolt")).expect("mkdir");
        fs::create_dir_all(store.join("io.containerd.content.v1.content/blobs/sha256")).expect("mkdir");
        fs::write(store.join("io.containerd.metadata.v1.bolt/meta.db"), "bolt").expect("write");
        fs::write(store.join("io.containerd.content.v1.content/blobs/sha256/ab"), "blob").expect("write");
        let m = d.path().join("machine");
        seed_containerd(&store, &m).expect("seed");
        let ino = |p: &Path| fs::metadata(p).expect("stat").ino();
        let blob = "io.containerd.content.v1.content/blobs/sha256/ab";
        assert_eq!(ino(&store.join(blob)), ino(&m.join(blob)), "content is linked");
        let db = "io.containerd.metadata.v1.bolt/meta.db";
        assert_ne!(ino(&store.join(db)), ino(&m.join(db)), "a database is the machine's own");
        assert_eq!(fs::read_to_string(m.join(db)).expect("read"), "bolt");
        assert_eq!(Boot { baked: true, air_gapped: true }.flags(), ["--baked", "--air-gapped"]);
        assert!(Boot::PLAIN.flags().is_empty() && !Boot::PLAIN.needs_bundle());
    }
}
