//! Air-gapped bundles: every file and container image a compiled spec uses, in one archive that a
//! machine without Internet access can push into its own file repository and registry.
//!
//! * [`manifest`]: the archive's `bundle.json` — Keelson and Kubernetes versions, the versions
//!   table's pins, the architectures, every file (URL, sha256, arch, path in the bundle) and every
//!   image (original reference, digest, per-architecture manifest digests);
//! * [`paths`]: where a file is inside the bundle, where `create` reads it from and where `push`
//!   writes it — the last two through the compiler's own `assets.fileRepository` rewrite;
//! * [`layout`]: the OCI image layout (`images/`) holding every image's blobs;
//! * [`create`]: the spec compiled without its mirrors, each file downloaded and verified by
//!   sha256 while streaming, each image copied with oci-client; resumable (a re-run reuses the
//!   verified files and blobs of its work directory);
//! * [`push`]: files into a `file://`, `s3://` or `gs://` repository, images into a registry through the
//!   OCI distribution API, skipping what is already there by digest;
//! * [`bake`]: files into nodeup's hash-keyed cache and images into containerd's store of a machine
//!   image's root filesystem (pinned), so a machine booted from it downloads nothing.
//!
//! Progress goes to `tracing` at info level, target `bundle` (the `keelson` CLI shows it by default).

pub mod bake;
pub mod create;
pub mod layout;
pub mod manifest;
pub mod paths;
pub mod push;
mod registry;

pub use bake::{bake, BakeError, BakeOptions, BakeReport};
pub use create::{create, plan, CreateError, CreateOptions, CreateReport, Plan};
pub use manifest::{BundleFile, BundleImage, BundleManifest, ManifestError, ReadError};
pub use push::{open_repository, push, PushError, PushOptions, PushReport};
