//! What every local cloud serves its machines before anything boots: the rootfs, the asset mirror
//! (this workspace's nodeup and protokube, Kubernetes and containerd built from source), and the
//! images in the local registry — driven by a first `keelson compile` of the local spec, which
//! names every asset and version the cluster needs.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

use crate::arch::{self, Arch};
use crate::paths::{self, State};
use crate::rootfs::Suite;
use crate::{apt, cmd, kubernetes, mirror, rootfs};

use super::daemon::ClusterVersions;
use super::state::ClusterState;

/// Where `keelson compile` puts the metrics-server addon's manifests (present when the spec enables it).
const METRICS_SERVER_ADDON: &str = "state/addons/metrics-server.addons.k8s.io";
/// Where it puts the flannel addon's manifest (present when the spec sets `networking.flannel`).
const FLANNEL_ADDON: &str = "state/addons/networking.flannel/v1.0.0.yaml";

/// What the daemon keeps of the assets phase.
pub struct Assets {
    /// The rootfs every machine's overlay sits on (with the baked image on top for `--baked`).
    pub lower: rootfs::Lower,
    /// This workspace's `keelson`.
    pub keelson: PathBuf,
    /// The local spec (`spec.yaml` in the state directory): the user's, pointed at the mirror and
    /// the registry.
    pub local_spec: PathBuf,
    /// `keelson compile` of it.
    pub compiled: PathBuf,
    /// The asset hashes of the mirror's files (`--asset-hashes`).
    pub overrides: PathBuf,
    /// `KOPS_BASE_URL`: protokube and the kOps assets in the mirror.
    pub kops_base: String,
    /// `--nodeup-asset`: `amd64=SHA256@URL` of this workspace's nodeup in the mirror.
    pub nodeup_asset: String,
    pub versions: ClusterVersions,
    /// kubectl and the other Kubernetes binaries built for the cluster's version.
    pub kubernetes_bin: PathBuf,
    /// Runs as long as this is kept.
    pub registry: kubernetes::Registry,
    /// What the instances of the spec's groups of other architectures boot from (`crate::arch`).
    pub foreign: BTreeMap<Arch, rootfs::Lower>,
    /// What this architecture's instances of groups asking for another Debian release than 12
    /// boot from ([`Suite::of_image`]).
    pub releases: BTreeMap<Suite, rootfs::Lower>,
    /// `--baked`: the bundle every `keelson` command pins images with (`KEELSON_IMAGE_DIGESTS`).
    pub image_digests: Option<PathBuf>,
}

/// Build the rootfs, the mirror and the registry for the spec `spec_text(mirror URL, registry)`
/// writes, the mirror being served on the bridge address `gw` at `cs.mirror_port`.
pub fn build(
    state: &State,
    cs: &mut ClusterState,
    gw: Ipv4Addr,
    ccm: kubernetes::Ccm,
    suites: &BTreeSet<Suite>,
    spec_text: &dyn Fn(&str, &str) -> String,
) -> anyhow::Result<Assets> {
    // `--air-gapped`: the harness builds into a staging mirror and registry, and the machines reach
    // only what `keelson bundle push` puts into the (empty) served mirror and a fresh registry.
    let mirror_root = if cs.air_gapped { state.root.join("mirror-staging") } else { state.mirror_dir() };
    let mirror_url = format!("http://{gw}:{}/", cs.mirror_port);
    cs.phase = "building the rootfs".into();
    cs.save(state);
    let lower = rootfs::ensure(&paths::cache_dir())?;
    let mut release_roots = BTreeMap::new();
    for suite in suites.iter().filter(|s| **s != Suite::Bookworm) {
        cs.phase = format!("building the {suite} rootfs");
        cs.save(state);
        release_roots.insert(*suite, rootfs::ensure_for(&paths::cache_dir(), arch::host(), *suite)?);
    }

    cs.phase = "building the asset mirror".into();
    cs.save(state);
    let bins = mirror::bin_dir();
    for b in ["keelson", "nodeup", "protokube"] {
        if !bins.join(b).is_file() {
            bail!("{b} binary not found in {} (build the workspace first: cargo build --workspace; or set KEELSON_BIN_DIR)", bins.display());
        }
    }
    let registry_addr = format!("{gw}:{}", kubernetes::REGISTRY_PORT);
    let local_spec = state.root.join("spec.yaml");
    fs::write(&local_spec, spec_text(&mirror_url, &registry_addr))?;
    let kops_base = format!("http://{gw}:{}/kops", cs.mirror_port);
    let nodeup_url = format!("http://{gw}:{}/keelson/nodeup", cs.mirror_port);
    let protokube_urls = ["amd64", "arm64"].map(|a| format!("{kops_base}/linux/{a}/protokube"));
    let cache = paths::cache_dir();
    let mut first = vec![nodeup_url.clone()];
    first.extend(protokube_urls);
    let keelson = bins.join("keelson");
    let compiled = state.compiled_dir();
    let overrides = state.root.join("asset-hashes.tsv");
    // A first compile (nodeup and protokube from this workspace, the rest with the table's
    // hashes) names every asset and version the cluster needs; apply compiles again with them all.
    let mut hashes = mirror::build(&cache, &bins, &mirror::LocalBuildsByArch::new(), &mirror_root, &first)?;
    mirror::write_overrides(&overrides, &hashes)?;
    let _ = fs::remove_dir_all(&compiled);
    cmd::run(
        Command::new(&keelson)
            .args(["compile", "--offline", "-f"])
            .arg(&local_spec)
            .arg("--out")
            .arg(&compiled)
            .arg("--asset-hashes")
            .arg(&overrides)
            .env("KOPS_BASE_URL", &kops_base)
            // The local cloud answers plain http:// on the gateway (the spec's endpoint annotations).
            .env(base::plain_http::ALLOW_ENV, gw.to_string()),
    )
    .context("keelson compile of the local spec (to learn the asset URLs and versions)")?;
    let versions = ClusterVersions::read(&compiled.join("cluster-completed.yaml"))?;
    // The architectures the spec's groups run (by machine type, the compiler's rule): another one
    // than the host's gets its own rootfs, builds and images, its machines run through qemu-user.
    let arches = group_arches(&compiled)?;
    let foreign_arches: Vec<Arch> = arches.iter().copied().filter(|a| *a != arch::host()).collect();
    if !foreign_arches.is_empty() && cs.boot().needs_bundle() {
        bail!("--baked and --air-gapped: keelson-local bundles this host's architecture only, and the spec has {foreign_arches:?} groups");
    }
    for a in &foreign_arches {
        arch::ensure_emulation(*a)?;
    }

    cs.phase = format!("building Kubernetes v{} from source (cached after the first run)", versions.kubernetes);
    cs.save(state);
    let host_builds = mirror::LocalBuilds {
        kubernetes_bin: kubernetes::kubernetes_binaries(&versions.kubernetes)?,
        containerd_archive: kubernetes::containerd_archive(&versions.containerd)?,
    };
    let mut local = mirror::LocalBuildsByArch::from([(arch::host(), host_builds.clone())]);
    for a in &foreign_arches {
        cs.phase = format!("building Kubernetes v{} and containerd for {a} (cross-compiled; cached after the first run)", versions.kubernetes);
        cs.save(state);
        local.insert(
            *a,
            mirror::LocalBuilds {
                kubernetes_bin: kubernetes::kubernetes_binaries_for(&versions.kubernetes, *a)?,
                containerd_archive: kubernetes::containerd_archive_for(&versions.containerd, *a)?,
            },
        );
    }
    cs.phase = "building the images".into();
    cs.save(state);
    let layout = kubernetes::images(&versions.kubernetes, &versions.etcd, &versions.pause)?;
    let ccm_layout = ccm.layout()?;
    let coredns_layout = kubernetes::coredns_image(kubernetes::COREDNS_VERSION)?;
    // metrics-server only when the spec enables it (the first compile rendered its addon).
    let metrics_server_layout =
        if compiled.join(METRICS_SERVER_ADDON).is_dir() { Some(kubernetes::metrics_server_image(kubernetes::METRICS_SERVER_VERSION)?) } else { None };
    // The cluster-autoscaler only when the spec enables it; its image is the caller's (not buildable here).
    let cluster_autoscaler_image = crate::autoscaler::addon_image(&compiled)?;
    // flannel only when the spec sets it; the addon must name the images built here.
    let flannel_layout = match fs::read_to_string(compiled.join(FLANNEL_ADDON)) {
        Ok(manifest) => {
            for image in kubernetes::flannel_refs(&registry_addr) {
                if !manifest.contains(&format!("image: {image}\n")) {
                    bail!(
                        "{}: the flannel addon does not run {image}, the image keelson-local builds (tests/src/kubernetes.rs FLANNEL_*)",
                        compiled.join(FLANNEL_ADDON).display()
                    );
                }
            }
            Some(kubernetes::flannel_images()?)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| compiled.join(FLANNEL_ADDON).display().to_string()),
    };
    cs.phase = format!("pushing the images to the registry at {registry_addr}");
    cs.save(state);
    let staging_log = if cs.air_gapped { state.root.join("registry-staging.log") } else { state.registry_log() };
    let mut registry = kubernetes::Registry::start(&gw.to_string(), kubernetes::REGISTRY_PORT, &cache.join("registry"), &staging_log)?;
    cs.registry = registry_addr.clone();
    cs.registry_pid = registry.pid() as i64;
    kubernetes::push(&layout, &registry_addr)?;
    if !foreign_arches.is_empty() {
        // What the other architectures' workers pull (kube-proxy, pause, the tests' echo), under
        // the same tags as multi-platform indexes.
        let nodes = foreign_arches.iter().map(|a| kubernetes::node_images(&versions.kubernetes, &versions.pause, *a)).collect::<Result<Vec<_>, _>>()?;
        kubernetes::push(&kubernetes::multi_platform(&layout, &nodes)?, &registry_addr)?;
    }
    kubernetes::push(&ccm_layout, &registry_addr)?;
    kubernetes::push(&coredns_layout, &registry_addr)?;
    for layout in metrics_server_layout.iter().chain(&flannel_layout) {
        kubernetes::push(layout, &registry_addr)?;
    }
    if let Some(image) = &cluster_autoscaler_image {
        crate::autoscaler::push_image(image, &registry_addr)?;
    }

    cs.phase = "building the asset mirror".into();
    cs.save(state);
    let mut urls = mirror::compiled_asset_urls(&compiled, &[&mirror_url, &kops_base], &arches.iter().copied().collect::<Vec<_>>())?;
    // nodeup of each architecture (an arm64 one from scripts/build-arm64).
    let nodeup_urls: BTreeMap<Arch, String> = arches
        .iter()
        .map(|a| (*a, if *a == arch::host() { nodeup_url.clone() } else { format!("http://{gw}:{}/keelson/linux/{a}/nodeup", cs.mirror_port) }))
        .collect();
    urls.extend(nodeup_urls.values().filter(|u| **u != nodeup_url).cloned());
    hashes.extend(mirror::build(&cache, &bins, &local, &mirror_root, &urls)?);
    mirror::write_overrides(&overrides, &hashes)?;
    let nodeup_asset = nodeup_urls.iter().map(|(a, u)| format!("{a}={}@{u}", hashes.get(u).cloned().unwrap_or_default())).collect::<Vec<_>>().join(" ");
    // The distribution's packages nodeup installs (iptables and the rest, and the spec's
    // `packages`), from Debian's archive cut down to what these roots lack.
    cs.phase = "cutting the Debian archive subset for the hosts' packages".into();
    cs.save(state);
    let host_packages = apt::packages_of_compiled(&compiled)?;
    let mut roots: Vec<(Arch, Suite, PathBuf)> = vec![(arch::host(), Suite::Bookworm, lower.clone())];
    roots.extend(release_roots.iter().map(|(s, r)| (arch::host(), *s, r.clone())));
    let mut foreign = BTreeMap::new();
    if !foreign_arches.is_empty() {
        let runc_version = runc_version(&urls).context("the compiled NodeupConfigs name no runc asset (its version is the native runc's)")?;
        let native_runc = kubernetes::native_runc(&runc_version)?;
        for a in &foreign_arches {
            cs.phase = format!("building the {a} rootfs (cached after the first run)");
            cs.save(state);
            let rootfs = rootfs::ensure_for(&cache, *a, Suite::Bookworm)?;
            roots.push((*a, Suite::Bookworm, rootfs.clone()));
            foreign.insert(*a, rootfs::Lower { rootfs, baked: None, native_runc: Some(native_runc.clone()) });
        }
    }
    for (a, suite, root) in &roots {
        let n = apt::mirror_subset(&cache, root, *a, *suite, &host_packages, &mirror_root)?;
        eprintln!("keelson-local: the mirror serves {n} Debian packages for {suite} {a} machines ({})", host_packages.join(" "));
    }
    let mut lower = rootfs::Lower::from(lower);
    let mut image_digests = None;
    if cs.boot().needs_bundle() {
        cs.phase = "making the bundle (keelson bundle create of the mirror and the registry)".into();
        cs.save(state);
        let inputs = super::bundled::BakeInputs {
            keelson: &keelson,
            local_spec: &local_spec,
            overrides: &overrides,
            kops_base: &kops_base,
            nodeup_asset: &nodeup_asset,
            mirror_root: &mirror_root,
            registry: &registry_addr,
            gw,
        };
        let bundle = super::bundled::create(&state.root, &inputs)?;
        if cs.air_gapped {
            cs.phase = "keelson bundle push into an empty mirror and a fresh registry (the staging ones stopped)".into();
            cs.save(state);
            drop(registry);
            let fresh = state.root.join("registry");
            if fresh.exists() {
                fs::remove_dir_all(&fresh).with_context(|| fresh.display().to_string())?;
            }
            registry = kubernetes::Registry::start(&gw.to_string(), kubernetes::REGISTRY_PORT, &fresh, &state.registry_log())?;
            cs.registry_pid = registry.pid() as i64;
            let served = state.mirror_dir();
            if served.exists() {
                fs::remove_dir_all(&served).with_context(|| served.display().to_string())?;
            }
            fs::create_dir_all(&served)?;
            super::bundled::push(&keelson, &bundle, &served, &registry_addr, gw)?;
            // A site without Internet access keeps a Debian mirror of its own; the archive subset
            // stands for it (nodeup reads it from the file repository, `keelson_api::host_packages`).
            let apt_dir = keelson_api::host_packages::APT_DIR;
            cmd::run(Command::new("cp").args(["-a", "--reflink=auto"]).arg(mirror_root.join(apt_dir)).arg(served.join(apt_dir)))?;
            // The tests' own workload (not the cluster's, so not in its bundle), as a user pushes an app.
            kubernetes::push_one(&layout, kubernetes::ECHO_IMAGE, &registry_addr)?;
        }
        if cs.baked {
            cs.phase = "baking the machine image (keelson bundle bake)".into();
            cs.save(state);
            lower.baked = Some(super::bundled::bake(&keelson, &bundle, &state.root, &registry_addr)?);
        }
        image_digests = Some(bundle);
    }
    let releases = release_roots.into_iter().map(|(s, rootfs)| (s, rootfs::Lower { rootfs, ..lower.clone() })).collect();
    Ok(Assets {
        lower,
        foreign,
        releases,
        image_digests,
        keelson,
        local_spec,
        compiled,
        overrides,
        kops_base,
        nodeup_asset,
        versions,
        kubernetes_bin: host_builds.kubernetes_bin,
        registry,
    })
}

/// The architectures the compiled instance groups (`state/instancegroup/*`) run, by machine type.
fn group_arches(compiled: &Path) -> anyhow::Result<BTreeSet<Arch>> {
    let completed = compiled.join("cluster-completed.yaml");
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&fs::read_to_string(&completed).with_context(|| completed.display().to_string())?)?;
    let cloud = doc["spec"]["cloudProvider"].as_str().unwrap_or("aws").to_string();
    let dir = compiled.join("state/instancegroup");
    let mut types = Vec::new();
    for e in fs::read_dir(&dir).with_context(|| dir.display().to_string())?.flatten() {
        let ig: serde_yaml_ng::Value = serde_yaml_ng::from_str(&fs::read_to_string(e.path()).with_context(|| e.path().display().to_string())?)?;
        types.push(ig["spec"]["machineType"].as_str().unwrap_or_default().to_string());
    }
    Ok(arches_of(&cloud, &types))
}

/// The architectures of `machine_types` on `cloud` (the host's when there is none).
fn arches_of(cloud: &str, machine_types: &[String]) -> BTreeSet<Arch> {
    let mut arches: BTreeSet<Arch> = machine_types.iter().map(|t| arch::of_instance(cloud, t)).collect();
    if arches.is_empty() {
        arches.insert(arch::host());
    }
    arches
}

/// The runc version the compiled NodeupConfigs install: the release directory of their runc asset
/// (`…/download/v1.4.3/runc.arm64` → `1.4.3`).
fn runc_version(urls: &[String]) -> Option<String> {
    urls.iter().find_map(|u| {
        let mut parts = u.rsplit('/');
        let name = parts.next()?;
        let dir = parts.next()?;
        (name.starts_with("runc.")).then(|| dir.trim_start_matches('v').to_string()).filter(|v| v.starts_with(|c: char| c.is_ascii_digit()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graviton_groups_add_arm64_and_only_it() {
        let t = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(arches_of("aws", &t(&["m6i.large", "m6i.xlarge"])), BTreeSet::from([Arch::Amd64]));
        assert_eq!(arches_of("aws", &t(&["m6i.large", "m7g.large"])), BTreeSet::from([Arch::Amd64, Arch::Arm64]));
        assert_eq!(arches_of("gce", &t(&["e2-medium"])), BTreeSet::from([Arch::Amd64]));
        assert_eq!(arches_of("aws", &[]), BTreeSet::from([arch::host()]));
    }

    #[test]
    fn the_native_runc_is_the_version_the_nodes_install() {
        let urls = ["http://10.0.0.1:8080/x/kubelet".to_string(), "http://10.0.0.1:8080/opencontainers/runc/releases/download/v1.4.3/runc.arm64".to_string()];
        assert_eq!(runc_version(&urls).as_deref(), Some("1.4.3"));
        assert_eq!(runc_version(&urls[..1]), None);
    }
}
