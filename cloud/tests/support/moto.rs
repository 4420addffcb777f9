//! The shared moto server of `keelson-testkit` (one per test binary, reset for each test that holds
//! [`lock`]) and the SDK configuration these tests use against it.

#![allow(dead_code)]

use std::sync::MutexGuard;
use std::time::Duration;

pub const REGION: &str = "us-east-1";

/// Where the moto of this test binary listens.
pub struct Local {
    pub url: String,
    moto: &'static testkit::moto::Moto,
}

impl Local {
    /// Forget every resource (between phases of one test).
    pub fn reset(&self) {
        self.moto.reset().expect("reset moto");
    }
}

/// Serialise the tests of this binary that use moto, loop devices or mounts; reset moto.
pub fn lock() -> (MutexGuard<'static, ()>, Local) {
    let (guard, moto) = testkit::moto::shared();
    (guard, Local { url: moto.endpoint(), moto })
}

/// SDK config pointing at moto with static test credentials.
pub async fn sdk(url: &str) -> cloud::aws::SdkConfig {
    let mut conf = cloud::sdk_config(&cloud::AwsOptions {
        region: Some(REGION.into()),
        endpoint_url: Some(url.into()),
        initial_backoff: Duration::from_millis(50),
        ..Default::default()
    })
    .await
    .into_builder();
    conf.set_credentials_provider(Some(aws_sdk_ec2::config::SharedCredentialsProvider::new(aws_sdk_ec2::config::Credentials::new(
        "test", "test", None, None, "test",
    ))));
    conf.build()
}
