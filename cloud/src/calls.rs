//! Counting API calls: an SDK interceptor that counts operations (not attempts) and attempts per
//! `service/operation`, read by metrics and by tests that assert how many calls a pass makes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::context::{BeforeTransmitInterceptorContextRef, FinalizerInterceptorContextRef};
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub calls: u64,
    pub attempts: u64,
}

/// Cheap to clone; clones share the counters.
#[derive(Debug, Default, Clone)]
pub struct CallCounter {
    inner: Arc<Mutex<BTreeMap<String, Counts>>>,
}

fn key(cfg: &ConfigBag) -> String {
    match cfg.load::<Metadata>() {
        Some(m) => format!("{}/{}", m.service().to_ascii_lowercase().replace(' ', ""), m.name()),
        None => "unknown/unknown".to_string(),
    }
}

impl CallCounter {
    /// `service/operation` → counts since creation.
    pub fn snapshot(&self) -> BTreeMap<String, Counts> {
        self.inner.lock().map(|m| m.clone()).unwrap_or_default()
    }
    /// Total operations (not attempts) so far.
    pub fn total_calls(&self) -> u64 {
        self.snapshot().values().map(|c| c.calls).sum()
    }
    /// Count one operation `key` (`service/operation`) that took `attempts` attempts (clients
    /// that are not on the AWS SDK: Google's APIs).
    pub fn record(&self, key: &str, attempts: u64) {
        self.bump(key.to_string(), 1, attempts);
    }
    fn bump(&self, k: String, calls: u64, attempts: u64) {
        if let Ok(mut m) = self.inner.lock() {
            let e = m.entry(k).or_default();
            e.calls += calls;
            e.attempts += attempts;
        }
    }
}

impl Intercept for CallCounter {
    fn name(&self) -> &'static str {
        "keelson.CallCounter"
    }
    // Operation metadata is in the config bag only once the operation's plugins ran, so calls are
    // counted when the operation finishes (successfully or not).
    fn read_after_execution(&self, _ctx: &FinalizerInterceptorContextRef<'_>, _rc: &RuntimeComponents, cfg: &mut ConfigBag) -> Result<(), BoxError> {
        self.bump(key(cfg), 1, 0);
        Ok(())
    }
    fn read_before_attempt(&self, _ctx: &BeforeTransmitInterceptorContextRef<'_>, _rc: &RuntimeComponents, cfg: &mut ConfigBag) -> Result<(), BoxError> {
        self.bump(key(cfg), 0, 1);
        Ok(())
    }
}
