//! The identities `keelson apply` manages on GCE: service accounts (IAM v1), the project's IAM
//! policy (Resource Manager v1) and a bucket's IAM policy (Cloud Storage JSON v1), each policy read,
//! changed and written back with its `etag` (version 3, so conditional bindings survive).

use reqwest::Method;
use serde_json::{json, Value};

use super::api::{enc, GoogleApi, GoogleApiError};

/// The policy version that carries conditions.
pub const POLICY_VERSION: i64 = 3;

#[derive(Debug, Clone)]
pub struct Iam {
    api: GoogleApi,
    iam_base: String,
    resource_manager_base: String,
    storage_base: String,
    project: String,
}

impl Iam {
    /// `storage_base`: `https://storage.googleapis.com` or an emulator's.
    pub fn new(api: GoogleApi, endpoints: &super::GceEndpoints, storage_base: &str, project: &str) -> Iam {
        Iam {
            api,
            iam_base: endpoints.iam.trim_end_matches('/').to_string(),
            resource_manager_base: endpoints.resource_manager.trim_end_matches('/').to_string(),
            storage_base: storage_base.trim_end_matches('/').to_string(),
            project: project.to_string(),
        }
    }

    pub fn project(&self) -> &str {
        &self.project
    }

    /// Every service account of the project.
    pub async fn service_accounts(&self) -> Result<Vec<Value>, GoogleApiError> {
        self.api.list_all(&format!("{}/projects/{}/serviceAccounts", self.iam_base, enc(&self.project)), "accounts", 100).await
    }

    pub async fn create_service_account(&self, account_id: &str, display_name: &str, description: &str) -> Result<Value, GoogleApiError> {
        let body = json!({"accountId": account_id, "serviceAccount": {"displayName": display_name, "description": description}});
        self.api.post(&format!("{}/projects/{}/serviceAccounts", self.iam_base, enc(&self.project)), &body).await
    }

    /// Set an account's display name and description.
    pub async fn patch_service_account(&self, email: &str, display_name: &str, description: &str) -> Result<Value, GoogleApiError> {
        let name = format!("projects/{}/serviceAccounts/{email}", self.project);
        let body = json!({"serviceAccount": {"name": name, "displayName": display_name, "description": description}, "updateMask": "displayName,description"});
        self.api.call(Method::PATCH, &format!("{}/projects/{}/serviceAccounts/{}", self.iam_base, enc(&self.project), enc(email)), Some(&body), None).await
    }

    pub async fn delete_service_account(&self, email: &str) -> Result<(), GoogleApiError> {
        self.api.call(Method::DELETE, &format!("{}/projects/{}/serviceAccounts/{}", self.iam_base, enc(&self.project), enc(email)), None, None).await?;
        Ok(())
    }

    pub async fn project_policy(&self) -> Result<Value, GoogleApiError> {
        let url = format!("{}/projects/{}:getIamPolicy", self.resource_manager_base, enc(&self.project));
        self.api.post(&url, &json!({"options": {"requestedPolicyVersion": POLICY_VERSION}})).await
    }

    pub async fn set_project_policy(&self, policy: &Value) -> Result<Value, GoogleApiError> {
        let url = format!("{}/projects/{}:setIamPolicy", self.resource_manager_base, enc(&self.project));
        self.api.post(&url, &json!({"policy": policy})).await
    }

    pub async fn bucket_policy(&self, bucket: &str) -> Result<Value, GoogleApiError> {
        self.api.get(&format!("{}/storage/v1/b/{}/iam?optionsRequestedPolicyVersion={POLICY_VERSION}", self.storage_base, enc(bucket))).await
    }

    pub async fn set_bucket_policy(&self, bucket: &str, policy: &Value) -> Result<Value, GoogleApiError> {
        self.api.call(Method::PUT, &format!("{}/storage/v1/b/{}/iam", self.storage_base, enc(bucket)), Some(policy), None).await
    }
}

/// One binding of a policy: role, members and the condition's expression (`None`: unconditional).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    pub role: String,
    pub members: Vec<String>,
    pub condition: Option<Value>,
}

/// The bindings of a policy.
pub fn bindings(policy: &Value) -> Vec<Binding> {
    policy["bindings"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|b| Binding {
            role: b["role"].as_str().unwrap_or_default().to_string(),
            members: b["members"].as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_string).collect(),
            condition: Some(b["condition"].clone()).filter(|c| c.is_object()),
        })
        .collect()
}

fn same_condition(a: &Value, b: Option<&Value>) -> bool {
    match (a.is_object(), b) {
        (false, None) => true,
        (true, Some(b)) => a["expression"] == b["expression"] && a["title"] == b["title"],
        _ => false,
    }
}

/// `policy` with `member` granted `role` under `condition` (a binding of that role and condition
/// gets the member; otherwise a new binding). Everything else is kept as it is, `etag` included.
pub fn with_member(policy: &Value, role: &str, member: &str, condition: Option<&Value>) -> Value {
    let mut p = policy.clone();
    if !p.is_object() {
        p = json!({});
    }
    p["version"] = json!(POLICY_VERSION);
    let list = p["bindings"].as_array().cloned().unwrap_or_default();
    let mut out = Vec::new();
    let mut placed = false;
    for mut b in list {
        if !placed && b["role"] == role && same_condition(&b["condition"], condition) {
            let mut members: Vec<Value> = b["members"].as_array().cloned().unwrap_or_default();
            if !members.iter().any(|m| m == member) {
                members.push(json!(member));
            }
            b["members"] = Value::Array(members);
            placed = true;
        }
        out.push(b);
    }
    if !placed {
        let mut b = json!({"role": role, "members": [member]});
        if let Some(c) = condition {
            b["condition"] = c.clone();
        }
        out.push(b);
    }
    p["bindings"] = Value::Array(out);
    p
}

/// `policy` without `member` in `role`'s bindings under `condition` (a binding left with no member
/// is dropped).
pub fn without_member(policy: &Value, role: &str, member: &str, condition: Option<&Value>) -> Value {
    let mut p = policy.clone();
    p["version"] = json!(POLICY_VERSION);
    let list = p["bindings"].as_array().cloned().unwrap_or_default();
    let mut out = Vec::new();
    for mut b in list {
        if b["role"] == role && same_condition(&b["condition"], condition) {
            let members: Vec<Value> = b["members"].as_array().cloned().unwrap_or_default().into_iter().filter(|m| m != member).collect();
            if members.is_empty() {
                continue;
            }
            b["members"] = Value::Array(members);
        }
        out.push(b);
    }
    p["bindings"] = Value::Array(out);
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_added_and_removed_keeping_everything_else() {
        let base = json!({"etag": "BwX", "version": 1, "bindings": [{"role": "roles/owner", "members": ["user:a@example.com"]}]});
        let cond = json!({"title": "t", "expression": "resource.name == \"x\""});
        let added = with_member(&base, "roles/storage.objectViewer", "serviceAccount:n@p.iam.gserviceaccount.com", Some(&cond));
        assert_eq!(added["etag"], "BwX");
        assert_eq!(added["version"], 3);
        assert_eq!(bindings(&added).len(), 2);
        let twice = with_member(&added, "roles/storage.objectViewer", "serviceAccount:n@p.iam.gserviceaccount.com", Some(&cond));
        assert_eq!(twice, added, "granting twice is granting once");
        let other_condition = with_member(&added, "roles/storage.objectViewer", "serviceAccount:n@p.iam.gserviceaccount.com", None);
        assert_eq!(bindings(&other_condition).len(), 3, "an unconditional binding is another binding");
        let removed = without_member(&added, "roles/storage.objectViewer", "serviceAccount:n@p.iam.gserviceaccount.com", Some(&cond));
        assert_eq!(bindings(&removed), bindings(&base), "the emptied binding is dropped, the owner kept");
    }
}
