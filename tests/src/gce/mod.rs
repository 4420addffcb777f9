//! keelson-local on GCE: the same machines, mirror and registry as on AWS, with Google's side
//! played by what stands in for it here —
//! - [`cloud`]: testkit's Compute v1 and Cloud DNS emulators (in the daemon, on the bridge
//!   address), `fake-gcs-server` for the `gs://` state store (relayed onto the bridge), the JWK set
//!   the identity tokens verify against, and a metadata server on the host for the CLI;
//! - [`metadata`]: each machine's metadata server (`metadata.google.internal` in its namespace);
//! - [`daemon`]: the MIG controller's data-plane half (a machine per instance a MIG made, booted
//!   from the template's `user-data` once per instance id, the instance RUNNING when the machine
//!   is up), the persistent-disk data plane (attached disks as loop devices under GCE's by-id
//!   names) and Cloud DNS in every machine's hosts file.

pub mod cloud;
pub mod daemon;
pub mod metadata;
