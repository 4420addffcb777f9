//! Test fixtures every Keelson test shares (a dev-only crate: no product code depends on it).
//!
//! Owns: the one moto launcher ([`moto`]), the one fake IMDSv2 ([`imds`]), the one HTTP test server
//! ([`httpd`]) and the asset mirror with fault injection plus fake assets and state stores
//! ([`mirror`]), and the GCE emulators: metadata ([`gce_metadata`]), Compute ([`gce_compute`]) and
//! Cloud DNS ([`cloud_dns`]), a `docker-registry` with a small multi-architecture image
//! ([`registry`]), and the all-fields kubelet configuration two tests render
//! ([`kubelet_fields`]). Must not: be a dependency of a product crate, or reach anything but 127.0.0.0/8 and
//! the network namespaces the tests create. The fuzz tests share one engine ([`fuzz`]).

pub mod aws_calls;
pub mod cloud_dns;
pub mod fake_gcs;
pub mod fuzz;
pub mod gce_compute;
pub mod gce_iam;
pub mod gce_metadata;
pub mod gcs_gate;
pub mod golden;
pub mod google_api;
pub mod google_oauth;
pub mod httpd;
pub mod iam_oracle;
pub mod imds;
pub mod kubelet_fields;
pub mod mirror;
pub mod moto;
pub mod moto_calls;
pub mod registry;
pub mod web_identity;
