//! What nodeup knows about the instance it configures (learnt by [`base::instance::resolve`]: flags
//! first, then IMDSv2 on AWS or the metadata server on GCE), and the provider id the kubelet
//! registers with.

use std::net::IpAddr;

use crate::render::kubelet;

/// What nodeup knows about the instance (flags on bare metal and in tests; IMDS on AWS).
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// `amd64` or `arm64`.
    pub arch: String,
    /// The node name the kubelet registers.
    pub hostname: String,
    pub internal_ip: Option<IpAddr>,
    pub instance_id: Option<String>,
    pub zone: Option<String>,
    pub region: Option<String>,
    /// The IMDS base URL (instance-role credentials for the node join); `None` off AWS.
    pub imds_url: Option<String>,
    /// The GCE metadata server asked (identity tokens for the node join); `None` off GCE.
    pub gce_metadata: Option<String>,
    /// GCE: the project and the instance's name (its provider id is `gce://project/zone/name`).
    pub project: Option<String>,
    pub instance_name: Option<String>,
}

/// The Kubernetes provider id the kubelet registers with, from what nodeup learnt of the instance
/// (`None` when the cloud is neither or a fact is missing: the cloud controller sets it then).
pub fn provider_id(cloud: keelson_api::CloudProvider, facts: &Facts) -> Option<String> {
    use keelson_api::CloudProvider;
    match (cloud, &facts.zone) {
        (CloudProvider::Aws, Some(zone)) => facts.instance_id.as_deref().map(|id| kubelet::aws_provider_id(zone, id)),
        (CloudProvider::Gce, Some(zone)) => match (&facts.project, &facts.instance_name) {
            (Some(project), Some(name)) => Some(base::gce_metadata::provider_id(project, zone, name)),
            _ => None,
        },
        _ => None,
    }
}

impl Facts {
    /// nodeup's facts of the instance: what [`base::instance::resolve`] learnt from the flags and the
    /// metadata service (an internal IP that is not an address is unknown).
    pub fn from_instance(arch: String, i: base::instance::InstanceFacts) -> Facts {
        Facts {
            arch,
            hostname: i.hostname.unwrap_or_default(),
            internal_ip: i.internal_ip.and_then(|ip| ip.parse().ok()),
            instance_id: i.instance_id,
            zone: i.zone,
            region: i.region,
            imds_url: None,
            gce_metadata: None,
            project: i.project,
            instance_name: i.instance_name,
        }
    }
}
