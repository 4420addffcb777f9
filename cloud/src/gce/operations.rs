//! Compute operations: `zoneOperations.wait` until DONE, within a bound the caller sets.
//! `wait` returns when the operation is DONE or after about two minutes at most; each call here is
//! also cut at the time left, so the bound holds whatever the server does.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::Value;

use super::api::{GoogleApi, GoogleApiError};

/// The shortest time between two `wait` calls.
const MIN_POLL: Duration = Duration::from_millis(200);

#[derive(Debug, thiserror::Error)]
pub enum OperationError {
    #[error("operation {name} ({kind} {target}): {code}: {message}")]
    Failed { name: String, kind: String, target: String, code: String, message: String },
    #[error("operation {name} ({kind} {target}) not DONE after {waited:?} (status {status})")]
    Timeout { name: String, kind: String, target: String, status: String, waited: Duration },
    #[error(transparent)]
    Api(#[from] GoogleApiError),
}

impl OperationError {
    /// The operation's error code (`RESOURCE_IN_USE_BY_ANOTHER_RESOURCE`, …) or the API's reason.
    pub fn code(&self) -> String {
        match self {
            OperationError::Failed { code, .. } => code.clone(),
            OperationError::Timeout { .. } => "operationTimeout".into(),
            OperationError::Api(e) => e.code(),
        }
    }
}

/// Where an operation stands, from its resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpState {
    Running(String),
    Done,
    Failed { code: String, message: String },
}

pub fn op_state(op: &Value) -> OpState {
    match op["status"].as_str().unwrap_or_default() {
        "DONE" => match op["error"]["errors"].as_array().and_then(|e| e.first()) {
            Some(e) => {
                OpState::Failed { code: e["code"].as_str().unwrap_or("UNKNOWN").to_string(), message: e["message"].as_str().unwrap_or_default().to_string() }
            }
            None => OpState::Done,
        },
        other => OpState::Running(other.to_string()),
    }
}

/// Wait for `op` (as a method answered it) to be DONE: `Ok` if it succeeded, its error if it
/// failed, [`OperationError::Timeout`] once `bound` has passed. `scope_url`: the zone's URL
/// (`…/projects/P/zones/Z`), under which `operations/NAME/wait` lives.
pub async fn wait(api: &GoogleApi, scope_url: &str, op: Value, bound: Duration) -> Result<(), OperationError> {
    let started = Instant::now();
    let deadline = started + bound;
    let name = op["name"].as_str().unwrap_or_default().to_string();
    let kind = op["operationType"].as_str().unwrap_or_default().to_string();
    let target =
        op["targetLink"].as_str().map(|t| t.rsplit('/').take(2).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("/")).unwrap_or_default();
    let mut op = op;
    loop {
        match op_state(&op) {
            OpState::Done => return Ok(()),
            OpState::Failed { code, message } => return Err(OperationError::Failed { name, kind, target, code, message }),
            OpState::Running(status) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(OperationError::Timeout { name, kind, target, status, waited: started.elapsed() });
                }
                let url = format!("{scope_url}/operations/{name}/wait");
                let asked = Instant::now();
                match api.call(Method::POST, &url, None, Some(left.min(Duration::from_secs(150)))).await {
                    Ok(v) => {
                        op = v;
                        // A server that answers "not yet" at once is not hammered.
                        if !matches!(op_state(&op), OpState::Done | OpState::Failed { .. }) && asked.elapsed() < MIN_POLL {
                            tokio::time::sleep(MIN_POLL.min(deadline.saturating_duration_since(Instant::now()))).await;
                        }
                    }
                    // Cut at the bound: the loop reports the timeout with the last status seen.
                    Err(GoogleApiError::Transport { timed_out: true, .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn operation_states() {
        assert_eq!(op_state(&json!({"status": "PENDING"})), OpState::Running("PENDING".into()));
        assert_eq!(op_state(&json!({"status": "DONE"})), OpState::Done);
        assert_eq!(
            op_state(&json!({"status": "DONE", "error": {"errors": [{"code": "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE", "message": "m"}]}})),
            OpState::Failed { code: "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE".into(), message: "m".into() }
        );
    }
}
