//! `keelson-local prepare VERSION`: make another Kubernetes version available to the running local
//! cloud, so that the product's own upgrade commands (`keelson upgrade cluster`, `keelson apply`,
//! `keelson reconcile cluster`) work against the local mirror and registry as they would against
//! the internet: its binaries built from source (cached), its images pushed to the registry, its
//! assets in the mirror, and their hashes added to the `--asset-hashes` file `keelson-local env`
//! exports (`KEELSON_ASSET_HASHES`).

use std::fs;
use std::process::Command;

use anyhow::{bail, Context};

use crate::{cmd, kubernetes, mirror, paths};

use super::commands::{running_cluster, state};
use super::daemon::ClusterVersions;

/// What `prepare` made available.
#[derive(Debug)]
pub struct Prepared {
    pub version: String,
    /// Mirror URLs whose hashes are now in the asset-hashes file.
    pub assets: Vec<String>,
}

/// The local spec with `spec.kubernetesVersion` of its Cluster document replaced.
pub fn with_version(spec_text: &str, version: &str) -> anyhow::Result<String> {
    let mut out = Vec::new();
    let mut found = false;
    for doc in serde_yaml_ng::Deserializer::from_str(spec_text) {
        let mut v = serde_yaml_ng::Value::deserialize(doc)?;
        if v.get("kind").and_then(|k| k.as_str()) == Some("Cluster") {
            let Some(spec) = v.get_mut("spec").and_then(|s| s.as_mapping_mut()) else { bail!("the Cluster document has no spec") };
            spec.insert("kubernetesVersion".into(), version.into());
            found = true;
        }
        out.push(serde_yaml_ng::to_string(&v)?);
    }
    if !found {
        bail!("no Cluster document");
    }
    Ok(out.join("---\n"))
}

use serde::Deserialize as _;

/// `keelson-local prepare VERSION`.
pub fn prepare(version: &str) -> anyhow::Result<Prepared> {
    let version = version.trim_start_matches('v').to_string();
    let parts: Vec<&str> = version.split('.').collect();
    if parts.len() != 3 || parts.iter().any(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit())) {
        bail!("VERSION {version:?}: expected a Kubernetes release, MAJOR.MINOR.PATCH (e.g. 1.34.4)");
    }
    let cs = running_cluster()?;
    let st = state();
    let local_spec = st.root.join("spec.yaml");
    let overrides = st.root.join("asset-hashes.tsv");
    let text = fs::read_to_string(&local_spec).with_context(|| format!("{}", local_spec.display()))?;
    let work = st.root.join(format!("prepare-v{version}"));
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work)?;
    let spec = work.join("spec.yaml");
    fs::write(&spec, with_version(&text, &version).with_context(|| format!("{}", local_spec.display()))?)?;
    // The product's compile names every asset and version the new version needs.
    let kops_base = format!("http://{}:{}/kops", cs.gateway, cs.mirror_port);
    let mirror_url = format!("http://{}:{}/", cs.gateway, cs.mirror_port);
    let compiled = work.join("compiled");
    let bins = mirror::bin_dir();
    cmd::run(
        Command::new(bins.join("keelson"))
            .args(["compile", "--offline", "-f"])
            .arg(&spec)
            .arg("--out")
            .arg(&compiled)
            .arg("--asset-hashes")
            .arg(&overrides)
            .env("KOPS_BASE_URL", &kops_base)
            // The local cloud answers plain http:// on the gateway (the spec's endpoint annotations).
            .env(base::plain_http::ALLOW_ENV, &cs.gateway),
    )
    .with_context(|| format!("keelson compile of the local spec at v{version} (does the versions table know it?)"))?;
    let versions = ClusterVersions::read(&compiled.join("cluster-completed.yaml"))?;
    eprintln!("keelson-local: building Kubernetes v{} (cached after the first run)", versions.kubernetes);
    let local = mirror::LocalBuildsByArch::from([(
        crate::arch::host(),
        mirror::LocalBuilds {
            kubernetes_bin: kubernetes::kubernetes_binaries(&versions.kubernetes)?,
            containerd_archive: kubernetes::containerd_archive(&versions.containerd)?,
        },
    )]);
    let layout = kubernetes::images(&versions.kubernetes, &versions.etcd, &versions.pause)?;
    eprintln!("keelson-local: pushing the v{} images to {}", versions.kubernetes, cs.registry);
    kubernetes::push(&layout, &cs.registry)?;
    let urls = mirror::compiled_asset_urls(&compiled, &[&mirror_url, &kops_base], &[crate::arch::host()])?;
    let mut hashes = mirror::read_overrides(&overrides)?;
    let built = mirror::build(&paths::cache_dir(), &bins, &local, &st.mirror_dir(), &urls)?;
    let assets: Vec<String> = built.keys().filter(|u| hashes.get(*u) != built.get(*u)).cloned().collect();
    hashes.extend(built);
    mirror::write_overrides(&overrides, &hashes)?;
    let _ = fs::remove_dir_all(&work);
    Ok(Prepared { version: versions.kubernetes, assets })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_cluster_version_changes() {
        let text = "apiVersion: kops.k8s.io/v1alpha2\nkind: Cluster\nmetadata:\n  name: c.example.com\nspec:\n  kubernetesVersion: 1.34.3\n  etcdClusters: []\n---\napiVersion: kops.k8s.io/v1alpha2\nkind: InstanceGroup\nmetadata:\n  name: nodes\nspec:\n  role: Node\n";
        let out = with_version(text, "1.34.4").unwrap();
        let docs: Vec<serde_yaml_ng::Value> = serde_yaml_ng::Deserializer::from_str(&out).map(|d| serde_yaml_ng::Value::deserialize(d).unwrap()).collect();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0]["spec"]["kubernetesVersion"].as_str(), Some("1.34.4"));
        assert_eq!(docs[1]["spec"]["role"].as_str(), Some("Node"));
        assert!(with_version("kind: InstanceGroup\nspec: {}\n", "1.34.4").is_err());
    }
}
