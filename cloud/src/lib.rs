//! Cloud access shared by Keelson's node agents and `keelson apply`.
//!
//! Owns: how every component reaches the cloud (SDK configuration, retries, IMDSv2, the volume,
//! instance and DNS views). Must not: decide what a cluster should look like — that is the compiler's
//! model and the agents' reconcile loops.
//!
//! * `sdk_config` (from `keelson-base`) builds one `aws_config::SdkConfig` that honours the standard credential chain,
//!   `AWS_ENDPOINT_URL` (or an explicit endpoint, e.g. a local moto server), and a throttling-aware retry
//!   policy. Every AWS client of the project is built from it.
//! * `imds` (from `keelson-base`) is the IMDSv2 client (tokens only; 404 → `None`; 401 → refresh; bounded jittered retries).
//! * Small traits per need — [`volumes::Volumes`], [`volumes::Instances`], [`dns::Dns`],
//!   [`targets::TargetGroups`],
//!   [`imds::InstanceMetadata`] — with AWS implementations on `aws-sdk-ec2` / `aws-sdk-route53`
//!   and GCE ones ([`gce`]: persistent disks on Compute v1, Cloud DNS v1); [`provider`] holds
//!   whichever the node runs on.
//! * [`calls::CallCounter`] counts API calls (for metrics); [`fault::Throttle`] injects throttling
//!   responses (for tests and drills).

pub mod calls;
pub mod dns;
pub mod fault;
pub mod gce;
pub mod provider;
pub mod targets;
pub mod volumes;

pub use base::aws::{sdk_config, AwsOptions};
pub use base::imds::{Identity, Imds, ImdsError, InstanceMetadata};
pub use base::{aws, imds};
pub use dns::{Dns, DnsError, Record, RecordChange, Route53Dns};
pub use targets::{Elbv2, TargetGroups, TargetState, TargetsError};
pub use volumes::{Ec2, Instance, InstanceState, Instances, Volume, VolumeError, VolumeFilter, Volumes};
