//! Fault injection for tests and drills: an SDK interceptor that replaces the first N responses with a
//! throttling error, so the real retry policy and real service error parsing are exercised (moto has
//! no throttling of its own).
//!
//! The request still reaches the server (only the response is replaced), so inject into idempotent
//! operations (Describe*/List*/UPSERT batches), as a real throttled call would have had no effect.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::context::BeforeDeserializationInterceptorContextMut;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_runtime_api::http::{Response, StatusCode};
use aws_smithy_types::body::SdkBody;
use aws_smithy_types::config_bag::ConfigBag;

/// Which wire format the throttling error is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThrottleKind {
    /// EC2 query protocol: `RequestLimitExceeded`, HTTP 503.
    Ec2RequestLimitExceeded,
    /// Route53 REST-XML: `Throttling`, HTTP 400.
    Route53Throttling,
    /// Any EC2 client error code, HTTP 400 (e.g. `VolumeInUse` for a lost AttachVolume race, which
    /// moto never returns).
    Ec2Error(&'static str),
}

/// Replaces the next `remaining` responses with a throttling error. Clones share the budget.
#[derive(Debug, Clone)]
pub struct Throttle {
    kind: ThrottleKind,
    remaining: Arc<AtomicU32>,
    injected: Arc<AtomicU32>,
}

impl Throttle {
    pub fn new(kind: ThrottleKind, count: u32) -> Self {
        Throttle { kind, remaining: Arc::new(AtomicU32::new(count)), injected: Arc::new(AtomicU32::new(0)) }
    }
    /// How many responses were replaced so far.
    pub fn injected(&self) -> u32 {
        self.injected.load(Ordering::SeqCst)
    }
    fn take(&self) -> bool {
        self.remaining.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
    }
}

impl Intercept for Throttle {
    fn name(&self) -> &'static str {
        "keelson.fault.Throttle"
    }
    fn modify_before_deserialization(
        &self,
        ctx: &mut BeforeDeserializationInterceptorContextMut<'_>,
        _rc: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if !self.take() {
            return Ok(());
        }
        self.injected.fetch_add(1, Ordering::SeqCst);
        let ec2_error;
        let (status, body) = match self.kind {
            ThrottleKind::Ec2Error(code) => {
                ec2_error = format!(
                    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{code}</Code>\
                     <Message>injected {code}</Message></Error></Errors><RequestID>injected</RequestID></Response>"
                );
                (400u16, ec2_error.as_str())
            }
            ThrottleKind::Ec2RequestLimitExceeded => (
                503u16,
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>RequestLimitExceeded</Code>\
                 <Message>Request limit exceeded.</Message></Error></Errors><RequestID>injected</RequestID></Response>",
            ),
            ThrottleKind::Route53Throttling => (
                400u16,
                "<?xml version=\"1.0\"?>\n<ErrorResponse xmlns=\"https://route53.amazonaws.com/doc/2013-04-01/\"><Error>\
                 <Type>Sender</Type><Code>Throttling</Code><Message>Rate exceeded</Message></Error>\
                 <RequestId>injected</RequestId></ErrorResponse>",
            ),
        };
        let mut resp = Response::new(StatusCode::try_from(status)?, SdkBody::from(body.to_string()));
        resp.headers_mut().insert("content-type", "text/xml");
        *ctx.response_mut() = resp;
        Ok(())
    }
}
