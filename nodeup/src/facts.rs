//! What nodeup knows about the instance it configures, and where it learns it: flags first, then
//! IMDSv2 on AWS or the metadata server on GCE; and the provider id the kubelet registers with.

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

/// The facts no flag gave, from the GCE metadata server; the node name is the first label of the
/// instance's hostname (as kOps names GCE nodes).
pub async fn fill_gce_facts(md: &base::gce_metadata::GceMetadata, facts: &mut Facts) -> Result<(), base::gce_metadata::GceMetadataError> {
    let i = md.instance().await?;
    facts.zone.get_or_insert(i.zone.clone());
    facts.region.get_or_insert_with(|| i.zone.rsplit_once('-').map(|(r, _)| r.to_string()).unwrap_or_else(|| i.zone.clone()));
    facts.instance_id.get_or_insert(i.id);
    facts.project.get_or_insert(i.project);
    facts.instance_name.get_or_insert(i.name);
    if facts.internal_ip.is_none() {
        facts.internal_ip = i.internal_ip.parse().ok();
    }
    if facts.hostname.is_empty() {
        facts.hostname = base::gce_metadata::node_name(&i.hostname).to_string();
    }
    Ok(())
}

/// Fill the facts the flags left unset from instance metadata (IMDSv2).
pub async fn fill_facts(imds: &base::imds::Imds, facts: &mut Facts) -> Result<(), base::imds::ImdsError> {
    use base::imds::InstanceMetadata as _;
    let get = |path: &'static str| async move { imds.get(path).await.map(|v| v.map(|s| s.trim().to_string())) };
    if facts.instance_id.is_none() {
        facts.instance_id = get("instance-id").await?;
    }
    if facts.zone.is_none() {
        facts.zone = get("placement/availability-zone").await?;
    }
    if facts.region.is_none() {
        facts.region = get("placement/region").await?;
    }
    if facts.internal_ip.is_none() {
        facts.internal_ip = get("local-ipv4").await?.and_then(|s| s.parse().ok());
    }
    if facts.hostname.is_empty() {
        facts.hostname = get("local-hostname").await?.unwrap_or_default();
    }
    Ok(())
}
