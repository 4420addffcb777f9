//! Images by digest. Given the digests of the images (`CompileOptions::image_digests`,
//! `keelson compile --image-digests FILE`: a bundle's `bundle.json`, keyed by each image's upstream
//! reference), every image of the compiled output names its digest, `NAME:TAG@sha256:…`, so a
//! registry that serves other content under the tag (hostile, or stale) is never pulled from:
//!
//! * an image the versions table writes is pinned by [`Versions::remap_image`], after
//!   `assets.containerRegistry` / `containerProxy` rewriting (what a bundle pushes under the
//!   rewritten name has the digest it holds);
//! * an image written as given — set in the spec (`spec.kubeAPIServer.image`,
//!   `spec.kubeDNS.coreDNSImage`, …), in an additional object, or kept from an upstream manifest
//!   (cert-manager's) — is pinned by [`pin_given`], applied where such images enter the compile: the
//!   user's spec before completion, and the addon manifests as rendered;
//! * [`check`] then reads every image field of the output the way `keelson get assets` does
//!   ([`crate::assets`]): an image still without a digest is an error naming its file, field and
//!   reference — never silently a tag.
//!
//! Without digests nothing changes: images are written by tag, as before.

use crate::assets::{image_fields, is_image_key, restates_input, AssetsError};
use crate::versions::Versions;
use crate::Compiled;

/// Why the output does not name every image by digest.
#[derive(Debug, thiserror::Error)]
pub enum DigestError {
    #[error(transparent)]
    Assets(#[from] AssetsError),
    #[error("{}", unpinned_message(.0))]
    Unpinned(Vec<Unpinned>),
    #[error("spec: pinning the images it sets: {0}")]
    Spec(String),
}

/// An image of the output the given digests do not name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unpinned {
    /// The state-store document (`addons/coredns.addons.k8s.io/v1.0.0.yaml`).
    pub file: String,
    /// The field (`[0].spec.template.spec.containers[0].image`).
    pub field: String,
    pub image: String,
}

fn unpinned_message(all: &[Unpinned]) -> String {
    let each: Vec<String> = all.iter().map(|u| format!("{}: {}: image {} has no digest", u.file, u.field, u.image)).collect();
    let images = all.iter().map(|u| u.image.as_str()).collect::<std::collections::BTreeSet<_>>().len();
    format!(
        "{}; the image digests given (--image-digests) do not name {images} image{}, and with digests given no image is written by its tag alone (add {} to the bundle, or set the image by digest in the spec)",
        each.join("; "),
        if images == 1 { "" } else { "s" },
        if images == 1 { "it" } else { "them" },
    )
}

/// Pin every image field of `value` (at any depth, outside `featureGates`) that the given digests
/// name exactly, as it is written ([`Versions::pin_image`]).
pub fn pin_given(value: &mut serde_json::Value, versions: &Versions) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                match v {
                    Value::String(s) if is_image_key(k) => *s = versions.pin_image(s, s.clone()),
                    _ if k == "featureGates" => {}
                    _ => pin_given(v, versions),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| pin_given(v, versions)),
        _ => {}
    }
}

/// [`pin_given`] over a typed document (the user's spec).
pub fn pin_given_in<T: serde::Serialize + serde::de::DeserializeOwned>(doc: &T, versions: &Versions) -> Result<T, DigestError> {
    let mut value = serde_json::to_value(doc).map_err(|e| DigestError::Spec(e.to_string()))?;
    pin_given(&mut value, versions);
    serde_json::from_value(value).map_err(|e| DigestError::Spec(e.to_string()))
}

/// Every image field of the documents the state store holds (those `keelson get assets` reads)
/// pins a digest; else an error naming each that does not.
pub fn check(compiled: &Compiled) -> Result<(), DigestError> {
    let mut unpinned = Vec::new();
    for (file, bytes) in compiled.state_files().filter(|(k, _)| !restates_input(k)) {
        for (field, image) in image_fields(file, bytes)? {
            let reference: keelson_api::image::ImageReference =
                image.parse().map_err(|source| AssetsError::Image { file: file.to_string(), field: field.clone(), source })?;
            if reference.digest().is_none() {
                unpinned.push(Unpinned { file: file.to_string(), field, image });
            }
        }
    }
    if unpinned.is_empty() {
        Ok(())
    } else {
        Err(DigestError::Unpinned(unpinned))
    }
}
