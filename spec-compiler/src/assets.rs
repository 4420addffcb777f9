//! Every file and container image a compiled cluster uses (`keelson get assets`), read from the
//! compiled output itself, never from a list of its own:
//!
//! * files: each instance group's NodeupConfig `Assets` (kubelet, kubectl, containerd, runc, CNI
//!   plugins, credential providers, protokube on control planes) and the nodeup build its user-data
//!   boots;
//! * images: every image field in every document the state store holds ([`Compiled::state_files`]):
//!   addon manifests, NodeupConfigs (control-plane components, kube-proxy, containerd's sandbox
//!   image, hook containers) and whatever else the compiler renders there, except the two documents
//!   that restate the input: the completed spec (`cluster-completed.spec`, whose images reach a node
//!   only through the documents rendered from it: a feature that is off keeps its default image
//!   there) and the instance groups (`instancegroup/<name>`, whose `spec.image` is a machine image).
//!
//! An image field is a map key `image` or ending in `Image` (`sandboxImage`, `coreDNSImage`) whose
//! value is a string, outside `featureGates` maps (whose keys are gate names). Its value must be an
//! image reference; anything else is an error naming the file and the field.

use std::collections::{BTreeMap, BTreeSet};

use keelson_api::image::{ImageReference, ImageReferenceError};
use serde::Serialize;

use crate::complete::CompileOptions;
use crate::versions::Arch;
use crate::Compiled;

/// Why the asset list could not be read from the compiled output.
#[derive(Debug, thiserror::Error)]
pub enum AssetsError {
    #[error("spec.iam.useServiceAccountExternalPermissions: {} not written without the AWS account id, so their images cannot be listed: give --aws-account-id", addons.join(", "))]
    Withheld { addons: Vec<String> },
    #[error("{file}: not YAML: {message}")]
    Yaml { file: String, message: String },
    #[error("{file}: {field}: {source}")]
    Image {
        file: String,
        field: String,
        #[source]
        source: ImageReferenceError,
    },
    #[error("InstanceGroup/{group}: NodeupConfig Assets[{arch}]: {source}")]
    File {
        group: String,
        arch: String,
        #[source]
        source: base::AssetRefError,
    },
    #[error("InstanceGroup/{group}: NodeupConfig Assets: unknown architecture {arch:?} (amd64 or arm64)")]
    Arch { group: String, arch: String },
}

/// One file a node downloads, per architecture.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FileAsset {
    /// Where nodes download it first (after `assets.fileRepository` rewriting).
    pub url: String,
    /// Further URLs tried in order when the first fails.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mirrors: Vec<String>,
    /// Lower-case hex; nodes refuse any other content.
    pub sha256: String,
    pub arch: &'static str,
    /// The instance groups that install it.
    pub used_by: Vec<String>,
}

/// One container image the cluster runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageAsset {
    /// As nodes pull it (after `assets.containerRegistry` / `containerProxy` rewriting).
    pub reference: String,
    /// The digest the reference pins (`sha256:…`), when it pins one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Always `all`: the compiled output names one reference per image for every architecture
    /// (a multi-architecture index that containerd resolves on each node).
    pub arch: &'static str,
    /// The state-store documents that name it (`addons/coredns.addons.k8s.io/v1.0.0.yaml`,
    /// `igconfig/node/nodes/nodeupconfig.yaml`).
    pub used_by: Vec<String>,
}

/// Every file and image of a compiled cluster, each once, sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct AssetList {
    pub files: Vec<FileAsset>,
    pub images: Vec<ImageAsset>,
}

impl AssetList {
    /// Only the files of `arches` (images are kept: every architecture pulls them).
    pub fn for_arches(mut self, arches: &[Arch]) -> AssetList {
        self.files.retain(|f| arches.iter().any(|a| a.as_str() == f.arch));
        self
    }
}

/// The state-store documents that restate the input rather than tell a node or the cluster what to
/// run (see the module documentation).
pub fn restates_input(state_key: &str) -> bool {
    state_key == "cluster-completed.spec" || state_key.starts_with("instancegroup/")
}

/// The asset list of a compile; `options` are the ones it was compiled with (the nodeup build its
/// user-data boots is not in any document).
pub fn list(compiled: &Compiled, options: &CompileOptions) -> Result<AssetList, AssetsError> {
    // A list without an addon's images would make a bundle that cannot run it.
    if !compiled.addons.withheld.is_empty() {
        return Err(AssetsError::Withheld { addons: compiled.addons.withheld.clone() });
    }
    Ok(AssetList { files: files(compiled, options)?, images: images(compiled)? })
}

fn files(compiled: &Compiled, options: &CompileOptions) -> Result<Vec<FileAsset>, AssetsError> {
    // (arch, urls, sha256) → groups
    let mut found: BTreeMap<(Arch, Vec<String>, String), BTreeSet<String>> = BTreeMap::new();
    for (group, g) in &compiled.groups {
        if g.user_data.is_some() {
            for (arch, a) in &options.nodeup_assets {
                found.entry((*arch, a.urls.clone(), a.sha256.clone())).or_default().insert(group.clone());
            }
        }
        let Some(nodeup) = &g.nodeup else { continue };
        for (arch_name, items) in &nodeup.assets {
            let arch = Arch::parse(arch_name).ok_or_else(|| AssetsError::Arch { group: group.clone(), arch: arch_name.clone() })?;
            for item in items {
                let asset: base::AssetRef = item.parse().map_err(|source| AssetsError::File { group: group.clone(), arch: arch_name.clone(), source })?;
                found.entry((arch, asset.urls, asset.sha256)).or_default().insert(group.clone());
            }
        }
    }
    let mut out: Vec<FileAsset> = found
        .into_iter()
        .map(|((arch, mut urls, sha256), groups)| {
            let url = urls.remove(0);
            FileAsset { url, mirrors: urls, sha256, arch: arch.as_str(), used_by: groups.into_iter().collect() }
        })
        .collect();
    out.sort_by(|a, b| (&a.url, a.arch).cmp(&(&b.url, b.arch)));
    Ok(out)
}

fn images(compiled: &Compiled) -> Result<Vec<ImageAsset>, AssetsError> {
    let mut found: BTreeMap<String, (Option<String>, BTreeSet<String>)> = BTreeMap::new();
    for (key, bytes) in compiled.state_files().filter(|(k, _)| !restates_input(k)) {
        for (field, value) in image_fields(key, bytes)? {
            let reference: ImageReference = value.parse().map_err(|source| AssetsError::Image { file: key.to_string(), field, source })?;
            let entry = found.entry(reference.to_string()).or_insert_with(|| (reference.digest().map(str::to_string), BTreeSet::new()));
            entry.1.insert(key.to_string());
        }
    }
    Ok(found.into_iter().map(|(reference, (digest, files))| ImageAsset { reference, digest, arch: "all", used_by: files.into_iter().collect() }).collect())
}

/// Every image field of a (multi-document) YAML file: its path (`[0].spec.containers[1].image`)
/// and value.
pub fn image_fields(file: &str, bytes: &[u8]) -> Result<Vec<(String, String)>, AssetsError> {
    use serde::Deserialize as _;
    let mut out = Vec::new();
    for (i, doc) in serde_yaml_ng::Deserializer::from_slice(bytes).enumerate() {
        let value = serde_yaml_ng::Value::deserialize(doc).map_err(|e| AssetsError::Yaml { file: file.to_string(), message: e.to_string() })?;
        walk(&value, &mut format!("[{i}]"), &mut out);
    }
    Ok(out)
}

/// Whether a map key names an image field (see the module documentation).
pub(crate) fn is_image_key(key: &str) -> bool {
    key == "image" || key.ends_with("Image")
}

fn walk(value: &serde_yaml_ng::Value, path: &mut String, out: &mut Vec<(String, String)>) {
    use serde_yaml_ng::Value;
    let len = path.len();
    match value {
        Value::Mapping(map) => {
            for (k, v) in map {
                let Some(k) = k.as_str() else { continue };
                path.push('.');
                path.push_str(k);
                match v {
                    Value::String(s) if is_image_key(k) => out.push((path.clone(), s.clone())),
                    _ if k == "featureGates" => {}
                    _ => walk(v, path, out),
                }
                path.truncate(len);
            }
        }
        Value::Sequence(items) => {
            for (i, v) in items.iter().enumerate() {
                path.push_str(&format!("[{i}]"));
                walk(v, path, out);
                path.truncate(len);
            }
        }
        Value::Tagged(t) => walk(&t.value, path, out),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_fields_are_found_at_any_depth_and_feature_gates_are_not_fields() {
        let yaml = "a:\n  image: x/y:1\n  sandboxImage: registry.k8s.io/pause:3.10\n  imagePullPolicy: Always\n  featureGates:\n    ImageVolume: 'true'\n    FooImage: 'true'\n---\nspec:\n  containers:\n  - name: c\n    image: quay.io/c:2\n";
        let got = image_fields("f.yaml", yaml.as_bytes()).expect("yaml");
        assert_eq!(
            got,
            [
                ("[0].a.image".to_string(), "x/y:1".to_string()),
                ("[0].a.sandboxImage".to_string(), "registry.k8s.io/pause:3.10".to_string()),
                ("[1].spec.containers[0].image".to_string(), "quay.io/c:2".to_string()),
            ]
        );
        assert!(matches!(image_fields("bad.yaml", b"a: [b"), Err(AssetsError::Yaml { .. })));
    }

    #[test]
    fn a_bad_image_names_its_file_and_field() {
        let docs = crate::load::load_spec(std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/minimal.yaml"))).expect("load");
        let options = CompileOptions::default();
        let mut compiled = crate::compile(&docs, &options).expect("compile");
        let key = "state/addons/coredns.addons.k8s.io/v1.0.0.yaml";
        let text = String::from_utf8(compiled.tree.files[key].clone()).expect("utf-8").replace("image: registry.k8s.io/coredns", "image: Not An Image");
        compiled.tree.insert(key, text);
        let e = list(&compiled, &options).expect_err("refused").to_string();
        assert!(e.starts_with("addons/coredns.addons.k8s.io/v1.0.0.yaml: [") && e.contains(".image: \"Not An Image"), "{e}");
    }

    #[test]
    fn files_are_listed_once_per_arch_with_the_groups_that_install_them() {
        let docs = crate::load::load_spec(std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/ha.yaml"))).expect("load");
        let options = CompileOptions::default();
        let compiled = crate::compile(&docs, &options).expect("compile");
        let list = list(&compiled, &options).expect("list");
        let kubelets: Vec<_> = list.files.iter().filter(|f| f.url.ends_with("/kubelet")).collect();
        assert_eq!(kubelets.iter().map(|f| f.arch).collect::<Vec<_>>(), ["amd64", "arm64"]);
        let groups: Vec<String> = compiled.groups.iter().filter(|(_, g)| g.nodeup.is_some()).map(|(n, _)| n.clone()).collect();
        assert_eq!(kubelets[0].used_by, groups, "every group installs the kubelet");
        let arm = list.clone().for_arches(&[Arch::Arm64]);
        assert!(arm.files.iter().all(|f| f.arch == "arm64") && !arm.files.is_empty());
        assert_eq!(arm.images, list.images, "images are for every architecture");
    }
}
