//! One place that turns "which AWS" into an [`SdkConfig`].
//!
//! ```no_run
//! # async fn f() {
//! let opts = cloud::AwsOptions { region: Some("eu-west-1".into()), ..Default::default() };
//! let conf = cloud::sdk_config(&opts).await;
//! let ec2 = aws_sdk_ec2::Client::new(&conf);
//! // per-service extras (interceptors, …) go on the service config:
//! let ec2_conf = aws_sdk_ec2::config::Builder::from(&conf)
//!     .interceptor(cloud::calls::CallCounter::default())
//!     .build();
//! let ec2 = aws_sdk_ec2::Client::from_conf(ec2_conf);
//! # }
//! ```
//!
//! Credentials come from the standard chain (environment, profile files, web identity, container and
//! instance roles). The endpoint is, in order: [`AwsOptions::endpoint_url`], then `AWS_ENDPOINT_URL` /
//! `AWS_ENDPOINT_URL_<SERVICE>` (read by `aws-config`), then the service's regional endpoint.

use std::time::Duration;

use aws_config::retry::RetryConfig;
pub use aws_config::SdkConfig;
use aws_config::{BehaviorVersion, Region};
use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};

/// Options shared by every AWS client of the project.
#[derive(Debug, Clone)]
pub struct AwsOptions {
    /// Region; `None` uses the standard region chain (`AWS_REGION`, profile, IMDS).
    pub region: Option<String>,
    /// Explicit endpoint (e.g. `http://127.0.0.1:5000` for moto); overrides `AWS_ENDPOINT_URL`.
    pub endpoint_url: Option<String>,
    /// Attempts per call including the first (throttling and transient errors are retried).
    pub max_attempts: u32,
    /// First retry backoff; doubles per attempt with full jitter, capped at `max_backoff`.
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    /// Per-attempt timeout for one HTTP exchange.
    pub attempt_timeout: Duration,
    /// Overall timeout of one operation including retries.
    pub operation_timeout: Duration,
}

impl Default for AwsOptions {
    fn default() -> Self {
        AwsOptions {
            region: None,
            endpoint_url: None,
            max_attempts: 8,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(20),
            attempt_timeout: Duration::from_secs(20),
            operation_timeout: Duration::from_secs(120),
        }
    }
}

/// The retry policy: standard mode (exponential backoff with full jitter; throttling codes such as
/// EC2's `RequestLimitExceeded` and Route53's `Throttling`/`PriorRequestNotComplete` are retryable and
/// draw from the client's retry quota).
pub fn retry_config(opts: &AwsOptions) -> RetryConfig {
    RetryConfig::standard()
        .with_max_attempts(opts.max_attempts.max(1))
        .with_initial_backoff(opts.initial_backoff)
        .with_max_backoff(opts.max_backoff)
}

/// Build the shared SDK configuration. HTTPS uses rustls with ring (no aws-lc build).
pub async fn sdk_config(opts: &AwsOptions) -> SdkConfig {
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::Ring))
        .build_https();
    let timeouts = aws_config::timeout::TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(5))
        .operation_attempt_timeout(opts.attempt_timeout)
        .operation_timeout(opts.operation_timeout)
        .build();
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .http_client(http)
        .retry_config(retry_config(opts))
        .timeout_config(timeouts);
    if let Some(region) = &opts.region {
        loader = loader.region(Region::new(region.clone()));
    }
    if let Some(url) = &opts.endpoint_url {
        loader = loader.endpoint_url(url.clone());
    }
    loader.load().await
}
