//! protokube on GCE: who this instance is (the metadata server: project, zone, name, internal IP,
//! hostname) and the clients of its cloud — persistent disks and instances on Compute v1, Cloud
//! DNS — with the service account's token. The reconcile loop is the same as on AWS; only the
//! cloud behind its traits differs ([`cloud::provider`]).
//!
//! On GCE an instance is known by its *name* (what Compute addresses it by, and what a disk's
//! `users[]` lists): [`Identity::instance_id`] holds it.

use std::time::Duration;

use base::gce_metadata::GceMetadata;
use base::instance::{InstanceFacts, Overrides};
use cloud::calls::CallCounter;
use cloud::gce::{CloudDns, ComputeReader, GceEndpoints, GceVolumes, GoogleApi, TokenSource};
use cloud::provider::{AnyDns, AnyVolumes};
use cloud::{Ec2, Identity, Route53Dns};

/// How long one metadata read may take.
const METADATA_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one Google API request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum GceSetupError {
    #[error("GCE identity: {0}")]
    Metadata(#[from] base::gce_metadata::GceMetadataError),
    #[error("Google API client: {0}")]
    Api(#[from] cloud::gce::GoogleApiError),
}

/// What protokube's flags say about GCE; every `Some` wins over the metadata server.
#[derive(Debug, Clone, Default)]
pub struct GceFlags {
    /// The metadata server (`host[:port]` or URL; default `$GCE_METADATA_HOST`, else GCE's).
    pub metadata: Option<String>,
    /// One base URL for Compute and Cloud DNS (emulators); default Google's.
    pub endpoint: Option<String>,
    pub instance_name: Option<String>,
    pub zone: Option<String>,
    pub region: Option<String>,
    pub internal_ip: Option<String>,
    pub node_name: Option<String>,
    /// The longest wait for one Compute operation (attach, detach, labels).
    pub operation_bound: Duration,
}

/// This instance and its cloud.
#[derive(Debug)]
pub struct Gce {
    pub identity: Identity,
    pub project: String,
    /// The Kubernetes node name (the first label of the hostname, as kOps names GCE nodes).
    pub node_name: String,
    pub volumes: GceVolumes,
    pub dns: CloudDns,
    /// Reads of instances, templates and MIGs (the node join server's checks).
    pub compute: ComputeReader,
    /// Every Compute and Cloud DNS call, by operation.
    pub calls: CallCounter,
}

/// Resolve this instance from the metadata server and make the Compute and Cloud DNS clients.
pub async fn connect(flags: GceFlags) -> Result<Gce, GceSetupError> {
    let metadata = GceMetadata::new(flags.metadata.as_deref(), METADATA_TIMEOUT)?;
    let me = metadata.instance().await?;
    // On GCE `--instance-id` names the instance (see the module doc).
    let overrides = Overrides {
        zone: flags.zone,
        region: flags.region,
        internal_ip: flags.internal_ip,
        hostname: flags.node_name,
        instance_name: flags.instance_name,
        instance_id: None,
    };
    let mut facts = InstanceFacts::from_flags(&overrides);
    facts.fill_from_gce(&me);
    let identity = Identity {
        instance_id: facts.instance_name.unwrap_or_default(),
        zone: facts.zone.unwrap_or_default(),
        region: facts.region.unwrap_or_default(),
        internal_ip: facts.internal_ip.unwrap_or_default(),
    };
    let node_name = facts.hostname.unwrap_or_default();
    let endpoints = GceEndpoints::resolve(flags.endpoint.as_deref());
    let calls = CallCounter::default();
    let api = GoogleApi::new(TokenSource::new(metadata), REQUEST_TIMEOUT)?.with_counter(calls.clone());
    let volumes = GceVolumes::new(api.clone(), &endpoints.compute, &me.project, &identity.zone, flags.operation_bound);
    let compute = ComputeReader::new(api.clone(), &endpoints.compute, &me.project);
    let dns = CloudDns::new(api, &endpoints.dns, &me.project);
    tracing::info!(project = %me.project, instance = %identity.instance_id, zone = %identity.zone, compute = %endpoints.compute, "GCE");
    Ok(Gce { identity, project: me.project, node_name, volumes, dns, compute, calls })
}

/// The volume and DNS clients of the agent: GCE's when `gce` is given, else AWS's.
pub fn providers(gce: Option<Gce>, ec2: Ec2, route53: Option<Route53Dns>) -> (AnyVolumes, Option<AnyDns>) {
    match gce {
        Some(g) => (AnyVolumes::Gce(Box::new(g.volumes)), Some(AnyDns::Cloud(g.dns))),
        None => (AnyVolumes::Ec2(ec2), route53.map(AnyDns::Route53)),
    }
}
