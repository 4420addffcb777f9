//! The cluster-autoscaler's image in the local cloud. The Go module proxy does not serve
//! `k8s.io/autoscaler/cluster-autoscaler`, so keelson-local cannot build it as it builds the other
//! images: when the spec enables kOps' addon (the first compile rendered it), the image comes from
//! [`IMAGE_ENV`] — an OCI layout directory (what `tests/kubernetes/images.sh
//! package-cluster-autoscaler BINARY VERSION` prints), an `oci-archive` file, or a registry reference
//! (copied with skopeo; the harness sends traffic only to 127.0.0.0/8, so a registry on this host) —
//! and is pushed to the local registry under the name the addon names (the compiler's registry
//! remapping: `<registry>/autoscaling-cluster-autoscaler:v<version>`).

use std::fs;
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context};

use crate::{cmd, kubernetes};

/// Where the cluster-autoscaler image comes from.
pub const IMAGE_ENV: &str = "KEELSON_CLUSTER_AUTOSCALER_IMAGE";
/// Where `keelson compile` puts the addon's manifests (present when the spec enables it).
pub const ADDON_DIR: &str = "state/addons/cluster-autoscaler.addons.k8s.io";

/// The image the compiled addon's Deployment runs, if the spec enables the addon.
pub fn addon_image(compiled: &Path) -> anyhow::Result<Option<String>> {
    let dir = compiled.join(ADDON_DIR);
    if !dir.is_dir() {
        return Ok(None);
    }
    for entry in fs::read_dir(&dir).with_context(|| dir.display().to_string())? {
        let path = entry?.path();
        let text = fs::read_to_string(&path).with_context(|| path.display().to_string())?;
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let v = <serde_yaml_ng::Value as serde::Deserialize>::deserialize(doc).with_context(|| path.display().to_string())?;
            if v.get("kind").and_then(|k| k.as_str()) != Some("Deployment") {
                continue;
            }
            let image = v["spec"]["template"]["spec"]["containers"][0]["image"].as_str().map(str::to_string);
            return image.map(Some).with_context(|| format!("{}: the Deployment names no image", path.display()));
        }
    }
    bail!("{}: no Deployment", dir.display())
}

/// The `name:tag` refs an OCI layout holds.
fn layout_refs(layout: &Path) -> anyhow::Result<Vec<String>> {
    let index = layout.join("index.json");
    let v: serde_json::Value = serde_json::from_str(&fs::read_to_string(&index).with_context(|| index.display().to_string())?)?;
    Ok(v["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["annotations"]["org.opencontainers.image.ref.name"].as_str().map(str::to_string))
        .collect())
}

/// Put the image [`IMAGE_ENV`] names into `registry` as `image` (`<registry>/<name>:<tag>`).
pub fn push_image(image: &str, registry: &str) -> anyhow::Result<()> {
    let source = std::env::var(IMAGE_ENV).map_err(|_| {
        anyhow::anyhow!(
            "the spec enables the cluster-autoscaler, whose image keelson-local cannot build (the Go module proxy does not serve k8s.io/autoscaler/cluster-autoscaler): set {IMAGE_ENV} to an OCI layout (tests/kubernetes/images.sh package-cluster-autoscaler BINARY VERSION), an oci-archive file or a registry reference holding {image}"
        )
    })?;
    let name = image.strip_prefix(&format!("{registry}/")).with_context(|| format!("the addon's image {image} is not in the local registry {registry}"))?;
    let path = Path::new(&source);
    if path.is_dir() {
        let refs = layout_refs(path)?;
        if !refs.iter().any(|r| r == name) {
            bail!("{IMAGE_ENV}={source}: the layout holds {refs:?}, not {name} (the addon's image)");
        }
        return kubernetes::push(path, registry).map_err(Into::into);
    }
    let src = if path.is_file() { format!("oci-archive:{source}") } else { format!("docker://{source}") };
    cmd::run(Command::new("skopeo").args([
        "--insecure-policy",
        "copy",
        "--quiet",
        "--src-tls-verify=false",
        "--dest-tls-verify=false",
        &src,
        &format!("docker://{image}"),
    ]))
    .with_context(|| format!("copying {src} to {image}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_compiled_addon_names_its_image() {
        let dir = tempfile::tempdir().unwrap();
        assert!(addon_image(dir.path()).unwrap().is_none(), "no addon: nothing to push");
        let addon = dir.path().join(ADDON_DIR);
        fs::create_dir_all(&addon).unwrap();
        fs::write(
            addon.join("v1.0.0.yaml"),
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: x\n---\napiVersion: apps/v1\nkind: Deployment\nspec:\n  template:\n    spec:\n      containers:\n      - image: 172.20.255.254:5000/autoscaling-cluster-autoscaler:v1.34.4\n",
        )
        .unwrap();
        assert_eq!(addon_image(dir.path()).unwrap().as_deref(), Some("172.20.255.254:5000/autoscaling-cluster-autoscaler:v1.34.4"));
    }

    #[test]
    fn the_layout_tags_are_read_from_its_index() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            dir.path().join("index.json"),
            r#"{"manifests":[{"annotations":{"org.opencontainers.image.ref.name":"autoscaling-cluster-autoscaler:v1.33.0"}}]}"#,
        )
        .unwrap();
        assert_eq!(layout_refs(dir.path()).unwrap(), ["autoscaling-cluster-autoscaler:v1.33.0"]);
    }
}
