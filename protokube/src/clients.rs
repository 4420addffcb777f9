//! Who this instance is and the clients of its cloud, made once at start and shared by the
//! controllers: the identity (IMDSv2 on AWS, the metadata server on GCE, each fact overridable by a
//! flag), the AWS SDK configuration with one call counter behind every client, S3 and EC2, GCE's
//! Compute and Cloud DNS, and the state store the BootConfig names.

use std::time::Duration;

use base::instance::{Overrides, Source};
use base::StateStore;
use cloud::calls::CallCounter;
use cloud::{AwsOptions, Identity, Imds};
use keelson_api::nodeup::BootConfig;

use crate::args::Args;
use crate::gce::Gce;

/// How long one state-store request may take.
const STORE_TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("instance metadata: {0}")]
    Imds(#[from] cloud::ImdsError),
    #[error("instance identity (pass --instance-id --zone --region --internal-ip off AWS): {0}")]
    Identity(#[source] base::instance::InstanceError),
    #[error(transparent)]
    Gce(#[from] crate::gce::GceSetupError),
    #[error("state store {url}: {source}")]
    Store {
        url: String,
        #[source]
        source: base::StoreError,
    },
}

/// This instance and its cloud's clients.
pub struct Clients {
    pub me: Identity,
    /// This instance's Node name (the kubelet's): `--node-name`, else GCE's hostname label, else
    /// IMDS `local-hostname`; `None` when none answered.
    pub node_name: Option<String>,
    pub imds: Imds,
    /// GCE's clients when the BootConfig's cloud is `gce`.
    pub gce: Option<Gce>,
    pub aws: base::aws::SdkConfig,
    /// Counts every cloud call (AWS and GCE) for the pass logs and metrics.
    pub calls: CallCounter,
    /// For the state store on S3 and for backup stores on S3 (whatever the state store is).
    pub s3: aws_sdk_s3::Client,
    pub ec2: aws_sdk_ec2::Client,
    /// The state store (`ConfigBase`).
    pub store: StateStore,
}

/// Resolve this instance and make its cloud's clients and the state store.
pub async fn connect(args: &Args, boot: &BootConfig) -> Result<Clients, ConnectError> {
    let imds = Imds::new(args.imds_url.as_deref())?;
    // GCE: identity from its metadata server (--imds-url points at it), disks and Cloud DNS.
    let gce = match boot.cloud_provider {
        keelson_api::CloudProvider::Gce => Some(crate::gce::connect(args.gce_flags()).await?),
        _ => None,
    };
    let (me, node_name) = match &gce {
        Some(g) => (g.identity.clone(), Some(g.node_name.clone())),
        None => {
            let flags = Overrides {
                instance_id: args.instance_id.clone(),
                zone: args.zone.clone(),
                region: args.region.clone(),
                internal_ip: args.internal_ip.clone(),
                hostname: args.node_name.clone(),
                instance_name: None,
            };
            // Every identity fact given (off AWS, tests): IMDS is not asked; the node name, if not
            // given either, is looked up later and only warned about (`own_node_name`).
            let given = flags.instance_id.is_some() && flags.zone.is_some() && flags.region.is_some() && flags.internal_ip.is_some();
            let source = if given { Source::<Imds>::Flags } else { Source::Aws(&imds) };
            let facts = base::instance::resolve(&flags, source).await.map_err(ConnectError::Identity)?;
            (facts.identity().map_err(ConnectError::Identity)?, facts.hostname)
        }
    };
    let aws = cloud::sdk_config(&AwsOptions {
        region: Some(me.region.clone()),
        endpoint_url: args.endpoint_url.clone(),
        imds_endpoint: args.imds_url.clone(),
        ..Default::default()
    })
    .await;
    let calls = gce.as_ref().map(|g| g.calls.clone()).unwrap_or_default();
    let store_err = |source| ConnectError::Store { url: boot.config_base.to_string(), source };
    let config_base = &boot.config_base;
    let s3 = aws_sdk_s3::Client::from_conf(base::aws::s3_config(&aws, args.endpoint_url.is_some()).interceptor(calls.clone()).build());
    let store_s3 = matches!(config_base, base::ConfigBase::S3 { .. }).then(|| s3.clone());
    let store = StateStore::open_with_s3(config_base, store_s3, STORE_TIMEOUT).map_err(store_err)?;
    let ec2 = ec2_client(&aws, &calls);
    Ok(Clients { me, node_name, imds, gce, aws, calls, s3, ec2, store })
}

fn ec2_client(aws: &base::aws::SdkConfig, calls: &CallCounter) -> aws_sdk_ec2::Client {
    let conf = aws_sdk_ec2::config::Builder::from(aws).interceptor(calls.clone());
    // Test hook (feature `test-hooks` only): answer the first N EC2 calls with RequestLimitExceeded
    // (the real retry policy must absorb them).
    #[cfg(feature = "test-hooks")]
    let conf = match std::env::var("PROTOKUBE_INJECT_EC2_THROTTLES").ok().and_then(|v| v.parse::<u32>().ok()) {
        Some(n) => {
            tracing::warn!(count = n, "injecting EC2 throttling responses");
            conf.interceptor(cloud::fault::Throttle::new(cloud::fault::ThrottleKind::Ec2RequestLimitExceeded, n))
        }
        None => conf,
    };
    aws_sdk_ec2::Client::from_conf(conf.build())
}

impl Clients {
    /// Route53, counted.
    pub fn route53(&self) -> cloud::Route53Dns {
        cloud::Route53Dns::new(aws_sdk_route53::Client::from_conf(aws_sdk_route53::config::Builder::from(&self.aws).interceptor(self.calls.clone()).build()))
    }

    /// The load balancers' API (the API target group), counted.
    pub fn elbv2(&self) -> cloud::Elbv2 {
        let conf = aws_sdk_elasticloadbalancingv2::config::Builder::from(&self.aws).interceptor(self.calls.clone()).build();
        cloud::Elbv2::new(aws_sdk_elasticloadbalancingv2::Client::from_conf(conf))
    }

    /// GCE's Compute reader and project, for the node join server and the node lookups.
    pub fn gce_compute(&self) -> Option<(cloud::gce::ComputeReader, String)> {
        self.gce.as_ref().map(|g| (g.compute.clone(), g.project.clone()))
    }

    /// This control plane's Node name (the kubelet's), known before its Node registers: `flag`, else
    /// what [`connect`] learnt ([`Clients::node_name`]); `None` (logged) when none answered.
    pub async fn own_node_name(&self, flag: Option<String>) -> Option<String> {
        let name = flag.or_else(|| self.node_name.clone()).filter(|n| !n.is_empty());
        if name.is_none() {
            tracing::warn!("no node name (--node-name, the metadata service's hostname): this node will not be labelled as a control plane");
        }
        name
    }
}
