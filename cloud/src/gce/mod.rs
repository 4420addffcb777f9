//! Google Compute Engine: persistent disks and instances ([`disks::GceVolumes`], behind
//! [`crate::volumes::Volumes`] and [`crate::volumes::Instances`]) and Cloud DNS
//! ([`dns::CloudDns`], behind [`crate::dns::Dns`]), on the REST APIs with reqwest and the
//! service-account token of the metadata server, or Application Default Credentials off GCE
//! ([`auth::TokenSource`], [`adc`]).
//!
//! * `labels` — kOps' GCE label encoding and the tag ↔ label names.
//! * `api` — the HTTP client (tokens, Google's errors, bounded retries of reads, pagination).
//! * `operations` — waiting for zone operations within a bound.
//! * `compute` — the Compute resources `keelson apply` manages (one module per kind).
//! * `instances`, `migs` — reading instances, templates and managed instance groups
//!   ([`ComputeReader`]: what the node join server checks).

pub use base::gce_adc as adc;
pub mod api;
pub mod auth;
pub mod compute;
pub mod disks;
pub mod dns;
pub mod iam;
pub mod instances;
pub mod labels;
pub mod migs;
pub mod operations;

pub use api::{GoogleApi, GoogleApiError};
pub use auth::TokenSource;
pub use compute::{Compute, ComputeError};
pub use disks::GceVolumes;
pub use dns::CloudDns;
pub use instances::ComputeReader;

/// Where Google's APIs are (the real ones, or one emulator serving both).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GceEndpoints {
    /// The Compute v1 base (`https://compute.googleapis.com/compute/v1`).
    pub compute: String,
    /// The Cloud DNS v1 base (`https://dns.googleapis.com/dns/v1`).
    pub dns: String,
    /// The IAM v1 base (`https://iam.googleapis.com/v1`): service accounts.
    pub iam: String,
    /// The Resource Manager v1 base (`https://cloudresourcemanager.googleapis.com/v1`): the
    /// project's IAM policy.
    pub resource_manager: String,
}

/// The variable that points every GCE client of Keelson (the CLI, protokube, the join server) at
/// one other base URL for Compute and Cloud DNS, as [`GceEndpoints::at`] reads it (an emulator).
pub const ENDPOINT_ENV: &str = "KEELSON_GCE_ENDPOINT";

impl GceEndpoints {
    /// `flag` (`--endpoint-url`), else `$KEELSON_GCE_ENDPOINT`, else Google's.
    pub fn resolve(flag: Option<&str>) -> GceEndpoints {
        let env = std::env::var(ENDPOINT_ENV).ok();
        flag.or(env.as_deref()).map(str::trim).filter(|e| !e.is_empty()).map(GceEndpoints::at).unwrap_or_else(GceEndpoints::google)
    }

    pub fn google() -> GceEndpoints {
        GceEndpoints {
            compute: "https://compute.googleapis.com/compute/v1".into(),
            dns: "https://dns.googleapis.com/dns/v1".into(),
            iam: "https://iam.googleapis.com/v1".into(),
            resource_manager: "https://cloudresourcemanager.googleapis.com/v1".into(),
        }
    }

    /// Every API under one base URL, at its usual path (`<base>/compute/v1`, `<base>/dns/v1`,
    /// `<base>/iam/v1`, `<base>/cloudresourcemanager/v1`): what the harness's emulators serve.
    pub fn at(base: &str) -> GceEndpoints {
        let base = base.trim_end_matches('/');
        GceEndpoints {
            compute: format!("{base}/compute/v1"),
            dns: format!("{base}/dns/v1"),
            iam: format!("{base}/iam/v1"),
            resource_manager: format!("{base}/cloudresourcemanager/v1"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_base_serves_both_apis() {
        assert_eq!(
            GceEndpoints::at("http://127.0.0.1:9/"),
            GceEndpoints {
                compute: "http://127.0.0.1:9/compute/v1".into(),
                dns: "http://127.0.0.1:9/dns/v1".into(),
                iam: "http://127.0.0.1:9/iam/v1".into(),
                resource_manager: "http://127.0.0.1:9/cloudresourcemanager/v1".into(),
            }
        );
    }
}
