//! Load-balancer target groups: one instance's membership (Elastic Load Balancing v2 implementation
//! on `aws-sdk-elasticloadbalancingv2`).

use aws_sdk_elasticloadbalancingv2::error::ProvideErrorMetadata;
use aws_sdk_elasticloadbalancingv2::types::TargetDescription;

/// One registered target and the state the load balancer reports for it (`initial`, `healthy`,
/// `unhealthy`, `draining`, `unavailable`, …).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetState {
    pub id: String,
    pub state: String,
}

#[derive(Debug, thiserror::Error)]
#[error("{op} {target}: {code}: {message}")]
pub struct TargetsError {
    pub op: &'static str,
    pub target: String,
    pub code: String,
    pub message: String,
}

fn api_err<E: ProvideErrorMetadata + std::fmt::Debug>(op: &'static str, target: &str, e: E) -> TargetsError {
    TargetsError {
        op,
        target: target.to_string(),
        code: e.code().unwrap_or("unknown").to_string(),
        message: e.message().map(str::to_string).unwrap_or_else(|| format!("{e:?}")),
    }
}

/// What protokube needs of a target group.
pub trait TargetGroups {
    /// The ARN of the target group called `name`, or `None` when there is none.
    fn find(&self, name: &str) -> impl std::future::Future<Output = Result<Option<String>, TargetsError>> + Send;
    /// Every target the group reports (registered or draining), with its state.
    fn targets(&self, arn: &str) -> impl std::future::Future<Output = Result<Vec<TargetState>, TargetsError>> + Send;
    fn register(&self, arn: &str, instance: &str) -> impl std::future::Future<Output = Result<(), TargetsError>> + Send;
    /// Deregister; a target that is not registered is not an error.
    fn deregister(&self, arn: &str, instance: &str) -> impl std::future::Future<Output = Result<(), TargetsError>> + Send;
}

/// Elastic Load Balancing v2.
#[derive(Debug, Clone)]
pub struct Elbv2 {
    client: aws_sdk_elasticloadbalancingv2::Client,
}

impl Elbv2 {
    pub fn new(client: aws_sdk_elasticloadbalancingv2::Client) -> Self {
        Elbv2 { client }
    }
}

fn instance(id: &str) -> TargetDescription {
    TargetDescription::builder().id(id).build()
}

impl TargetGroups for Elbv2 {
    async fn find(&self, name: &str) -> Result<Option<String>, TargetsError> {
        match self.client.describe_target_groups().names(name).send().await {
            Ok(out) => Ok(out.target_groups().iter().find_map(|g| g.target_group_arn()).map(str::to_string)),
            Err(e) if e.code() == Some("TargetGroupNotFound") => Ok(None),
            Err(e) => Err(api_err("DescribeTargetGroups", name, e)),
        }
    }

    async fn targets(&self, arn: &str) -> Result<Vec<TargetState>, TargetsError> {
        let out = self.client.describe_target_health().target_group_arn(arn).send().await.map_err(|e| api_err("DescribeTargetHealth", arn, e))?;
        Ok(out
            .target_health_descriptions()
            .iter()
            .filter_map(|d| {
                let id = d.target()?.id()?.to_string();
                let state = d.target_health().and_then(|h| h.state()).map(|s| s.as_str().to_string()).unwrap_or_default();
                Some(TargetState { id, state })
            })
            .collect())
    }

    async fn register(&self, arn: &str, id: &str) -> Result<(), TargetsError> {
        self.client.register_targets().target_group_arn(arn).targets(instance(id)).send().await.map(|_| ()).map_err(|e| api_err("RegisterTargets", id, e))
    }

    async fn deregister(&self, arn: &str, id: &str) -> Result<(), TargetsError> {
        match self.client.deregister_targets().target_group_arn(arn).targets(instance(id)).send().await {
            Ok(_) => Ok(()),
            // Not registered (any more): what was asked for.
            Err(e) if e.code() == Some("InvalidTarget") => Ok(()),
            Err(e) => Err(api_err("DeregisterTargets", id, e)),
        }
    }
}
