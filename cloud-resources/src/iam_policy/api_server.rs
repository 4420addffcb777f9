//! API servers (role APIServer): kOps' NodeRoleAPIServer.

use serde_json::{json, Value};

use super::{kms_statements, state_store_statements, statement, PolicyInputs, ECR_READ};

/// kOps' NodeRoleAPIServer: what nodeup needs to boot an API server from the state store.
pub(super) fn api_server(p: &PolicyInputs) -> Vec<Value> {
    let mut out = state_store_statements(p, false);
    out.extend(kms_statements(p));
    if p.allow_container_registry {
        out.push(statement(ECR_READ, json!("*"), None));
    }
    out
}
