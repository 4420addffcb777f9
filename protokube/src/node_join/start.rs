//! Starting the join server on a control plane: the cluster CA's key from the state store, the
//! bound listener, the admission held to the plan's pod network, and the authority of this
//! instance's cloud (AWS: STS, EC2 and IAM; GCE: Google's keys and Compute).

use std::time::Duration;

use base::pki::Keypair;
use base::StateStore;

use super::limits::Admission;
use super::server::SpawnError;
use super::{Authority, AuthorityConfig, NodeNames, StartError};
use crate::config::Plan;
use crate::metrics::Metrics;

/// Why the join server did not start.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("node join server: the cluster CA: {0}")]
    Store(#[from] base::StoreError),
    #[error("node join server: the cluster CA: {0}")]
    Ca(#[from] base::pki::PkiError),
    #[error("node join address {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Start(#[from] StartError),
    #[error(transparent)]
    Spawn(#[from] SpawnError),
}

/// The join server's admission: its default limits, the cluster's pod network held to the slots
/// not reserved for instances.
pub fn admission(plan: &Plan) -> Admission {
    Admission::with_pod_networks(Default::default(), plan.pod_network.into_iter().collect())
}

/// The cluster CA (its key) and the bound listener.
async fn ca_and_listener(store: &StateStore, listen: &str) -> Result<(Keypair, std::net::TcpListener), ListenError> {
    let keyset = store.get_required("pki/private/kubernetes-ca/keyset.yaml").await?;
    let ca = base::pki::parse_private_keyset("kubernetes-ca", &keyset)?;
    let listener = std::net::TcpListener::bind(listen).map_err(|source| ListenError::Bind { addr: listen.to_string(), source })?;
    Ok((ca, listener))
}

/// What both clouds' join servers are made of.
pub struct Common<'a> {
    pub plan: &'a Plan,
    pub store: StateStore,
    /// `--join-listen`.
    pub listen: &'a str,
    pub metrics: Metrics,
}

impl Common<'_> {
    fn nodes(&self) -> NodeNames {
        NodeNames::local(self.store.clone(), self.plan.local_api_server())
    }
}

/// AWS: the server learns its own account before it admits anyone; until STS answers, workers wait
/// (they retry) while etcd, backups and DNS go on. Fails only when the CA or the address is not
/// there.
pub async fn start_aws(c: Common<'_>, aws: &base::aws::SdkConfig, ec2: aws_sdk_ec2::Client, region: &str) -> Result<(), ListenError> {
    let (ca, listener) = ca_and_listener(&c.store, c.listen).await?;
    let config = AuthorityConfig {
        cluster: c.plan.cluster_name.clone(),
        ca,
        sts_url: base::node_join::sts_endpoint(region),
        sts: aws_sdk_sts::Client::new(aws),
        ec2,
        iam: aws_sdk_iam::Client::new(aws),
        store: c.store.clone(),
        nodes: c.nodes(),
        challenge_addr: super::challenge_at_instance(),
    };
    let (metrics, admission) = (c.metrics.clone(), admission(c.plan));
    tokio::spawn(async move {
        use backon::{ExponentialBuilder, Retryable as _};
        let policy =
            ExponentialBuilder::default().with_min_delay(Duration::from_secs(1)).with_max_delay(Duration::from_secs(60)).without_max_times().with_jitter();
        let authority = (|| Authority::new(config.clone()))
            .retry(policy)
            .notify(|e, wait| tracing::warn!(error = %e, retry_in = ?wait, "node join server not started yet"))
            .await;
        let Ok(authority) = authority else { return };
        tracing::info!(sts = %authority.sts_url, "serving node joins");
        if let Err(e) = super::spawn(listener, authority, metrics, admission) {
            tracing::error!(error = %e, "node join server did not start");
        }
    });
    Ok(())
}

/// GCE: instance identity tokens checked against Google's keys at `jwks_url`, instances against
/// Compute in `project`.
pub async fn start_gce(c: Common<'_>, compute: cloud::gce::ComputeReader, project: String, region: String, jwks_url: String) -> Result<(), ListenError> {
    let (ca, listener) = ca_and_listener(&c.store, c.listen).await?;
    let authority = super::gce::GceAuthority::new(super::gce::GceAuthorityConfig {
        cluster: c.plan.cluster_name.clone(),
        ca,
        project,
        region,
        compute,
        store: c.store.clone(),
        jwks_url,
        nodes: c.nodes(),
        challenge_addr: super::challenge_at_instance(),
    })?;
    tracing::info!(jwks = %authority.jwks_url(), "serving node joins (GCE identity)");
    super::spawn(listener, authority, c.metrics.clone(), admission(c.plan))?;
    Ok(())
}
