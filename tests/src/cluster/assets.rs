//! What every local cloud serves its machines before anything boots: the rootfs, the asset mirror
//! (this workspace's nodeup and protokube, Kubernetes and containerd built from source), and the
//! images in the local registry — driven by a first `keelson compile` of the local spec, which
//! names every asset and version the cluster needs.

use std::fs;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context};

use crate::paths::{self, State};
use crate::{cmd, kubernetes, mirror, rootfs};

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
    /// `--baked`: the bundle every `keelson` command pins images with (`KEELSON_IMAGE_DIGESTS`).
    pub image_digests: Option<PathBuf>,
}

/// Build the rootfs, the mirror and the registry for the spec `spec_text(mirror URL, registry)`
/// writes, the mirror being served on the bridge address `gw` at `cs.mirror_port`.
pub fn build(state: &State, cs: &mut ClusterState, gw: Ipv4Addr, ccm: kubernetes::Ccm, spec_text: &dyn Fn(&str, &str) -> String) -> anyhow::Result<Assets> {
    // `--air-gapped`: the harness builds into a staging mirror and registry, and the machines reach
    // only what `keelson bundle push` puts into the (empty) served mirror and a fresh registry.
    let mirror_root = if cs.air_gapped { state.root.join("mirror-staging") } else { state.mirror_dir() };
    let mirror_url = format!("http://{gw}:{}/", cs.mirror_port);
    cs.phase = "building the rootfs".into();
    cs.save(state);
    let lower = rootfs::ensure(&paths::cache_dir())?;

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
    let mut hashes = mirror::build(&cache, &bins, None, &mirror_root, &first)?;
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

    cs.phase = format!("building Kubernetes v{} from source (cached after the first run)", versions.kubernetes);
    cs.save(state);
    let local = mirror::LocalBuilds {
        kubernetes_bin: kubernetes::kubernetes_binaries(&versions.kubernetes)?,
        containerd_archive: kubernetes::containerd_archive(&versions.containerd)?,
    };
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
    let urls = mirror::compiled_asset_urls(&compiled, &[&mirror_url, &kops_base])?;
    hashes.extend(mirror::build(&cache, &bins, Some(&local), &mirror_root, &urls)?);
    mirror::write_overrides(&overrides, &hashes)?;
    let nodeup_sha = hashes.get(&nodeup_url).cloned().unwrap_or_default();
    let nodeup_asset = format!("amd64={nodeup_sha}@{nodeup_url}");
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
    Ok(Assets {
        lower,
        image_digests,
        keelson,
        local_spec,
        compiled,
        overrides,
        kops_base,
        nodeup_asset,
        versions,
        kubernetes_bin: local.kubernetes_bin,
        registry,
    })
}
