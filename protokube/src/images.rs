//! Images in containerd (`ctr`, namespace `k8s.io`, the kubelet's): making sure one is there, and
//! pulling the etcd images early.
//!
//! A replacement control plane's kubelet pulls its static pods' images one at a time (the
//! kubelet's default `serializeImagePulls`), in the order the manifests appear: kube-proxy, the
//! scheduler, the API server and the controller manager come first, and etcd's manifest (written
//! by protokube once its volume is mounted) last — measured on keelson-local, etcd's pull started
//! 6.8 s after the kubelet's first and its container 9.6 s after its manifest was written. etcd is
//! what everything else waits on, so protokube pulls its members' etcd images itself as soon as it
//! starts, while the volumes are still being claimed: when the manifest lands, the image is there.
//! Then the API server's (from the static pod nodeup wrote), which the kubelet would otherwise pull
//! only after kube-proxy's and the scheduler's (measured: 6.4 s after its first pull began).
//!
//! Before both, the sandbox (pause) image that containerd's configuration pins: no pod starts
//! without it, and the kubelet asks for it only when it creates its first pod sandbox. Measured on
//! keelson-local (release, 2026-11-27): all six static pods' sandboxes waited for that one pull,
//! which finished 2.4 s after the kubelet started, behind protokube's etcd and API-server pulls.

use std::path::{Path, PathBuf};

/// `ctr -n k8s.io`, killed if dropped.
pub fn ctr_command(ctr: &Path) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(ctr);
    cmd.args(["-n", "k8s.io"]).kill_on_drop(true);
    cmd
}

/// The program `name` on `PATH` (`ctr`: containerd's client, which nodeup installs beside containerd).
pub fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// Make sure containerd holds `image`: an instance that never ran etcd (or whose image was garbage
/// collected) has none. It is pulled through the registry hosts nodeup configured for containerd,
/// so mirrors and plain-HTTP registries work as they do for the kubelet.
pub async fn ensure_image(ctr: &Path, image: &str) -> Result<(), String> {
    let listed = ctr_command(ctr)
        .args(["images", "ls", "-q", &format!("name=={image}")])
        .output()
        .await
        .map_err(|e| format!("running {} images ls: {e}", ctr.display()))?;
    if listed.status.success() && String::from_utf8_lossy(&listed.stdout).lines().any(|l| l.trim() == image) {
        return Ok(());
    }
    tracing::info!(%image, "pulling the image into containerd");
    let mut pull = ctr_command(ctr);
    pull.args(["images", "pull"]);
    if Path::new(crate::paths::CONTAINERD_CERTS_DIR).is_dir() {
        pull.args(["--hosts-dir", crate::paths::CONTAINERD_CERTS_DIR]);
    }
    let pulled = pull.arg(image).output().await.map_err(|e| format!("running {} images pull: {e}", ctr.display()))?;
    if !pulled.status.success() {
        return Err(format!("pulling {image} failed: {}", String::from_utf8_lossy(&pulled.stderr).trim()));
    }
    Ok(())
}

/// The distinct, non-empty images of `images`, in their order.
pub fn distinct_images<'a>(images: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for image in images {
        if !image.is_empty() && !out.iter().any(|i| i == image) {
            out.push(image.to_string());
        }
    }
    out
}

/// The image of the static pod manifest `text` (its first container's `image:`), if any.
pub fn manifest_image(text: &str) -> Option<String> {
    let pod: serde_json::Value = serde_yaml_ng::from_str(text).ok()?;
    pod.pointer("/spec/containers/0/image")?.as_str().filter(|s| !s.is_empty()).map(str::to_string)
}

/// The sandbox (pause) image containerd's configuration `text` pins: `pinned_images.sandbox` of
/// `io.containerd.cri.v1.images` (containerd 2, configuration versions 3 and 4), else
/// `sandbox_image` of `io.containerd.grpc.v1.cri` (containerd 1.x, version 2).
pub fn sandbox_image(text: &str) -> Option<String> {
    let config: toml::Table = toml::from_str(text).ok()?;
    let plugins = config.get("plugins")?.as_table()?;
    let pinned = plugins.get("io.containerd.cri.v1.images").and_then(|i| i.get("pinned_images")).and_then(|p| p.get("sandbox"));
    let legacy = || plugins.get("io.containerd.grpc.v1.cri").and_then(|c| c.get("sandbox_image"));
    pinned.or_else(legacy)?.as_str().filter(|s| !s.is_empty()).map(str::to_string)
}

/// The sandbox image of containerd's configuration at `path`, waiting up to `wait` for nodeup to
/// write it.
pub async fn configured_sandbox_image(path: &Path, wait: std::time::Duration) -> Option<String> {
    image_in_file(path, wait, sandbox_image).await
}

/// The image of the kube-apiserver static pod at `path`, waiting up to `wait` for nodeup to write
/// it (protokube and the static pods are written by the same nodeup run).
pub async fn api_server_image(path: &Path, wait: std::time::Duration) -> Option<String> {
    image_in_file(path, wait, manifest_image).await
}

/// The image `read` finds in the file at `path`, read every 200 ms until it finds one or `wait`
/// has passed (nodeup writes the file while protokube starts).
async fn image_in_file(path: &Path, wait: std::time::Duration, read: fn(&str) -> Option<String>) -> Option<String> {
    let deadline = std::time::Instant::now() + wait;
    loop {
        if let Some(image) = tokio::fs::read_to_string(path).await.ok().as_deref().and_then(read) {
            return Some(image);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// Pull `images` (one at a time: the first is needed first), logging what fails; a failure only
/// means the kubelet pulls it later, as it would have anyway. nodeup starts protokube, containerd
/// and the kubelet together, so containerd may not answer yet: each pull is retried (200 ms
/// apart, doubling to 2 s, at most 8 times).
pub async fn prepull(ctr: &Path, images: &[String]) {
    use backon::{ExponentialBuilder, Retryable as _};
    let policy =
        ExponentialBuilder::default().with_min_delay(std::time::Duration::from_millis(200)).with_max_delay(std::time::Duration::from_secs(2)).with_max_times(8);
    for image in images {
        let t = std::time::Instant::now();
        match (|| ensure_image(ctr, image)).retry(policy).await {
            Ok(()) => tracing::info!(%image, elapsed_ms = t.elapsed().as_millis() as u64, "image in containerd"),
            Err(e) => tracing::warn!(%image, error = %e, "pulling the image early failed; the kubelet pulls it when it starts the pod"),
        }
    }
}

/// On a live host, in the background: the sandbox image, then the etcd images of this host's
/// members (`plan`), then the API server's (from its static pod in the plan's static-pod
/// directory). Nothing when `ctr` is not on PATH (the kubelet pulls them itself, later).
pub fn prepull_at_start(plan: &crate::config::Plan) {
    let Some(ctr) = on_path("ctr") else {
        tracing::warn!("no ctr on PATH: the kubelet pulls the etcd images when it starts etcd");
        return;
    };
    let mine = plan.etcd_clusters.iter().filter(|ec| !plan.my_members(ec).is_empty());
    let etcd = distinct_images(mine.map(|ec| ec.image.as_str()));
    let manifest = Path::new(&plan.static_pod_dir).join("kube-apiserver.manifest");
    tokio::spawn(async move {
        let containerd_config = Path::new(crate::paths::CONTAINERD_CONFIG);
        if let Some(sandbox) = configured_sandbox_image(containerd_config, std::time::Duration::from_secs(5)).await {
            prepull(&ctr, &[sandbox]).await;
        }
        prepull(&ctr, &etcd).await;
        if let Some(image) = api_server_image(&manifest, std::time::Duration::from_secs(5)).await {
            prepull(&ctr, &[image]).await;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sandbox_image_is_the_one_containerd_pins() {
        let v4 = "version = 4\n[plugins.\"io.containerd.cri.v1.images\".pinned_images]\nsandbox = \"r:5000/pause:3.10.1\"\n[plugins.\"io.containerd.cri.v1.images\".registry]\nconfig_path = \"/etc/containerd/certs.d\"\n";
        assert_eq!(sandbox_image(v4).as_deref(), Some("r:5000/pause:3.10.1"));
        let v2 = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\nsandbox_image = \"registry.k8s.io/pause:3.9\"\n";
        assert_eq!(sandbox_image(v2).as_deref(), Some("registry.k8s.io/pause:3.9"));
        assert_eq!(sandbox_image("version = 4\n"), None, "none pinned: containerd's own default, which the kubelet pulls");
        assert_eq!(sandbox_image("version = 4\n[plugins.\"io.containerd.cri.v1.images\".pinned_images]\nsandbox = \"\"\n"), None);
        assert_eq!(sandbox_image("not toml ["), None);
    }

    #[test]
    fn each_image_once_in_order() {
        assert_eq!(distinct_images(["r/etcd:v3.6.12", "r/etcd:v3.6.12", "", "r/etcd:v3.5.21"]), vec!["r/etcd:v3.6.12", "r/etcd:v3.5.21"]);
        assert!(distinct_images([]).is_empty());
    }

    #[test]
    fn a_static_pods_image_is_its_first_containers() {
        let pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: kube-apiserver\nspec:\n  containers:\n  - name: kube-apiserver\n    image: r/kube-apiserver:v1.34.4\n  - name: sidecar\n    image: r/other:1\n";
        assert_eq!(manifest_image(pod).as_deref(), Some("r/kube-apiserver:v1.34.4"));
        assert_eq!(manifest_image("spec: {containers: []}"), None);
        assert_eq!(manifest_image("not: [yaml"), None);
    }
}
