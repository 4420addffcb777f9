//! One place that turns "which AWS" into an [`SdkConfig`].
//!
//! ```no_run
//! # async fn f() {
//! let opts = base::aws::AwsOptions { region: Some("eu-west-1".into()), ..Default::default() };
//! let conf = base::aws::sdk_config(&opts).await;
//! // per-service extras (interceptors, …) go on the service config:
//! let s3 = aws_sdk_s3::Client::from_conf(base::aws::s3_config(&conf, opts.endpoint_url.is_some()).build());
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
    /// IMDS base URL the instance-role credentials come from (`None`: the SDK's default,
    /// `AWS_EC2_METADATA_SERVICE_ENDPOINT` or `http://169.254.169.254`).
    pub imds_endpoint: Option<String>,
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
            imds_endpoint: None,
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
    RetryConfig::standard().with_max_attempts(opts.max_attempts.max(1)).with_initial_backoff(opts.initial_backoff).with_max_backoff(opts.max_backoff)
}

/// Build the shared SDK configuration. HTTPS uses rustls with ring (no aws-lc build).
pub async fn sdk_config(opts: &AwsOptions) -> SdkConfig {
    let http = guarded_http_client();
    let timeouts = aws_config::timeout::TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(5))
        .operation_attempt_timeout(opts.attempt_timeout)
        .operation_timeout(opts.operation_timeout)
        .build();
    let mut loader = aws_config::defaults(BehaviorVersion::latest()).http_client(http.clone()).retry_config(retry_config(opts)).timeout_config(timeouts);
    if let Some(region) = &opts.region {
        loader = loader.region(Region::new(region.clone()));
    }
    if let Some(url) = &opts.endpoint_url {
        loader = loader.endpoint_url(url.clone());
    }
    if let Some(imds) = &opts.imds_endpoint {
        // Instance-role credentials from this IMDS, over the same HTTP client.
        let provider = aws_config::provider_config::ProviderConfig::default().with_http_client(http.clone()).with_region(opts.region.clone().map(Region::new));
        match aws_config::imds::Client::builder().configure(&provider).endpoint(imds) {
            Ok(client) => {
                let chain = aws_config::default_provider::credentials::DefaultCredentialsChain::builder().configure(provider).imds_client(client.build());
                loader = loader.credentials_provider(chain.build().await);
            }
            Err(e) => tracing::warn!(endpoint = %imds, error = %e, "invalid IMDS endpoint; using the default for credentials"),
        }
    }
    loader.load().await
}

/// The HTTP client of every AWS call: HTTPS with rustls and ring.
fn http_client() -> aws_smithy_runtime_api::client::http::SharedHttpClient {
    aws_smithy_http_client::Builder::new().tls_provider(Provider::Rustls(CryptoMode::Ring)).build_https()
}

/// [`http_client`] that refuses a request over plain `http://` to a host that is neither loopback
/// nor allowed ([`crate::plain_http`]) before it is sent: a signed AWS call (and, for S3, the
/// state store's secrets) never crosses a network in clear, whichever way its endpoint was set
/// (`endpoint_url`, `AWS_ENDPOINT_URL[_<SERVICE>]`, a profile). The instance metadata and container
/// credential services are link-local and plain HTTP by design; they pass.
fn guarded_http_client() -> aws_smithy_runtime_api::client::http::SharedHttpClient {
    aws_smithy_runtime_api::client::http::SharedHttpClient::new(plain_http_guard::Guard(http_client()))
}

mod plain_http_guard {
    use aws_smithy_runtime_api::client::http::{HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient, SharedHttpConnector};
    use aws_smithy_runtime_api::client::orchestrator::HttpRequest;
    use aws_smithy_runtime_api::client::result::ConnectorError;
    use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;

    #[derive(Debug)]
    pub(super) struct Guard(pub(super) SharedHttpClient);

    impl HttpClient for Guard {
        fn http_connector(&self, settings: &HttpConnectorSettings, components: &RuntimeComponents) -> SharedHttpConnector {
            SharedHttpConnector::new(GuardConnector(self.0.http_connector(settings, components)))
        }
    }

    #[derive(Debug)]
    struct GuardConnector(SharedHttpConnector);

    impl HttpConnector for GuardConnector {
        fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
            match refused(request.uri()) {
                Some(e) => HttpConnectorFuture::ready(Err(ConnectorError::user(Box::new(e)))),
                None => self.0.call(request),
            }
        }
    }

    /// Why `uri` may not be called, if it may not.
    pub(super) fn refused(uri: &str) -> Option<crate::plain_http::PlainHttpRefused> {
        let e = crate::plain_http::check("AWS endpoint", uri).err()?;
        let metadata = match e.host.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V4(ip)) => ip.is_link_local(),
            Ok(std::net::IpAddr::V6(ip)) => ip == std::net::Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254),
            Err(_) => false,
        };
        (!metadata).then_some(e)
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn plain_http_passes_only_to_loopback_and_the_metadata_services() {
            for ok in [
                "https://ec2.eu-west-1.amazonaws.com/",
                "http://127.0.0.1:5000/",
                "http://169.254.169.254/latest/api/token",
                "http://169.254.170.2/v2/credentials",
                "http://[fd00:ec2::254]/",
            ] {
                assert!(super::refused(ok).is_none(), "{ok} refused");
            }
            let e = super::refused("http://10.0.0.5:4566/?Action=DescribeInstances").expect("refused");
            assert!(e.to_string().contains("10.0.0.5") && e.to_string().contains(crate::plain_http::ALLOW_ENV), "{e}");
        }

        /// Through the SDK: a call to a plain-http endpoint off loopback fails before a connection
        /// (`0.0.0.0` is this host to the kernel, so an open hole only meets a refused connection
        /// here, and the test sees the wrong error).
        #[tokio::test]
        async fn every_sdk_call_goes_through_the_guard() {
            let opts = crate::aws::AwsOptions {
                region: Some("eu-west-1".into()),
                endpoint_url: Some("http://0.0.0.0:9/".into()),
                max_attempts: 1,
                ..Default::default()
            };
            let conf = crate::aws::sdk_config(&opts).await;
            let s3 = aws_sdk_s3::Client::from_conf(
                crate::aws::s3_config(&conf, true).credentials_provider(aws_credential_types::Credentials::new("test", "test", None, None, "test")).build(),
            );
            let err = s3.list_buckets().send().await.expect_err("refused");
            let text = format!("{}", aws_smithy_types::error::display::DisplayErrorContext(&err));
            assert!(text.contains(crate::plain_http::ALLOW_ENV) && text.contains("0.0.0.0"), "{text}");
        }
    }
}

/// The S3 client configuration every component uses: path-style addressing when the endpoint is
/// overridden (a local moto, an S3-compatible store), and checksums only where S3 requires them
/// (S3-compatible servers reject the newer default trailers).
pub fn s3_config(conf: &SdkConfig, endpoint_overridden: bool) -> aws_sdk_s3::config::Builder {
    let overridden = endpoint_overridden || std::env::var_os("AWS_ENDPOINT_URL").is_some() || std::env::var_os("AWS_ENDPOINT_URL_S3").is_some();
    let mut builder = aws_sdk_s3::config::Builder::from(conf);
    if conf.region().is_none() {
        // S3 needs a region to sign; a bucket elsewhere answers with a redirect the store follows.
        builder = builder.region(Region::new("us-east-1"));
    }
    builder
        .force_path_style(overridden)
        .request_checksum_calculation(aws_sdk_s3::config::RequestChecksumCalculation::WhenRequired)
        .response_checksum_validation(aws_sdk_s3::config::ResponseChecksumValidation::WhenRequired)
}

/// The instance role's credentials, from IMDS only (`imds_endpoint`, else the SDK's default
/// endpoint): what an instance proves its identity with, whatever else the environment offers.
pub async fn instance_role_credentials(imds_endpoint: Option<&str>) -> Result<aws_credential_types::Credentials, String> {
    use aws_credential_types::provider::ProvideCredentials as _;
    let conf = aws_config::provider_config::ProviderConfig::default().with_http_client(http_client());
    let mut client = aws_config::imds::Client::builder().configure(&conf);
    if let Some(url) = imds_endpoint {
        client = client.endpoint(url).map_err(|e| format!("IMDS endpoint {url}: {e}"))?;
    }
    let provider = aws_config::imds::credentials::ImdsCredentialsProvider::builder().configure(&conf).imds_client(client.build()).build();
    provider
        .provide_credentials()
        .await
        .map_err(|e| format!("instance role credentials from IMDS: {}", aws_smithy_types::error::display::DisplayErrorContext(e)))
}
