//! Google's identity side for the local GCE, following the documented REST behaviour:
//! - IAM v1 service accounts (`/iam/v1/projects/{p}/serviceAccounts[/{email}]`: create, get, list,
//!   patch, delete; account ids `[a-z][a-z0-9-]{4,28}[a-z0-9]`);
//! - Resource Manager v1 project policies (`/cloudresourcemanager/v1/projects/{p}:getIamPolicy`,
//!   `:setIamPolicy`), seeded as a new project is: the Compute default account holds `roles/editor`;
//! - Cloud Storage bucket policies (`/storage/v1/b/{bucket}/iam`, GET and PUT), version 3 with
//!   conditions;
//!
//! each policy with an `etag` that a write must match (409 `ABORTED` otherwise). [`authorize`] is
//! how Cloud Storage decides an object call from these policies and the caller's OAuth scopes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{json, Map, Value};

use crate::google_api::{body_object, json_response, require_bearer, ApiError};
use crate::httpd::{Request, Response};

#[derive(Debug, Default)]
struct State {
    project: String,
    project_number: String,
    accounts: BTreeMap<String, Value>,
    project_policy: Value,
    buckets: BTreeMap<String, Value>,
    etags: u64,
}

impl State {
    fn etag(&mut self) -> String {
        self.etags += 1;
        base64::Engine::encode(&base64::engine::general_purpose::STANDARD, format!("keelson-local-{}", self.etags))
    }
}

/// The emulator: cheap to clone (one shared state).
#[derive(Clone)]
pub struct GceIam {
    state: Arc<Mutex<State>>,
}

/// The Compute default account of a project (`<number>-compute@developer.gserviceaccount.com`).
pub fn compute_default_account(project_number: &str) -> String {
    format!("{project_number}-compute@developer.gserviceaccount.com")
}

impl GceIam {
    pub fn new(project: &str, project_number: &str) -> GceIam {
        let mut st = State { project: project.to_string(), project_number: project_number.to_string(), ..Default::default() };
        let etag = st.etag();
        st.project_policy = json!({
            "version": 1,
            "etag": etag,
            "bindings": [{"role": "roles/editor", "members": [format!("serviceAccount:{}", compute_default_account(project_number))]}],
        });
        GceIam { state: Arc::new(Mutex::new(st)) }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether this emulator serves `path`.
    pub fn serves(path: &str) -> bool {
        path.starts_with("/iam/v1/") || path.starts_with("/cloudresourcemanager/v1/") || bucket_iam_path(path).is_some()
    }

    pub fn answer(&self, req: &Request) -> Response {
        match require_bearer(req).and_then(|()| self.route(req)) {
            Ok(v) => json_response(200, &v),
            Err(e) => e.response(),
        }
    }

    /// The project's policy as it is now.
    pub fn project_policy(&self) -> Value {
        self.lock().project_policy.clone()
    }

    /// A bucket's policy (an empty one when never set).
    pub fn bucket_policy(&self, bucket: &str) -> Value {
        self.lock().buckets.get(bucket).cloned().unwrap_or_else(|| json!({"version": 1, "bindings": []}))
    }

    /// The emails of the project's service accounts.
    pub fn account_emails(&self) -> Vec<String> {
        self.lock().accounts.keys().cloned().collect()
    }

    fn route(&self, req: &Request) -> Result<Value, ApiError> {
        let mut st = self.lock();
        if let Some(bucket) = bucket_iam_path(&req.path) {
            return match req.method.as_str() {
                "GET" => Ok(st.buckets.get(&bucket).cloned().unwrap_or_else(
                    || json!({"kind": "storage#policy", "resourceId": format!("projects/_/buckets/{bucket}"), "version": 1, "bindings": [], "etag": "CAE="}),
                )),
                "PUT" => {
                    let body = Value::Object(body_object(req)?);
                    let current_etag = st.buckets.get(&bucket).map(|p| p["etag"].clone()).unwrap_or(json!("CAE="));
                    let policy = set_policy(&mut st, body, &current_etag)?;
                    let mut policy = policy;
                    policy["kind"] = json!("storage#policy");
                    policy["resourceId"] = json!(format!("projects/_/buckets/{bucket}"));
                    st.buckets.insert(bucket, policy.clone());
                    Ok(policy)
                }
                m => Err(ApiError::new(405, "methodNotAllowed", format!("{m} {}", req.path))),
            };
        }
        if let Some(rest) = req.path.strip_prefix("/cloudresourcemanager/v1/projects/") {
            let (project, verb) = rest.split_once(':').ok_or_else(|| ApiError::not_found(&req.path))?;
            check_project(&st, project)?;
            return match (req.method.as_str(), verb) {
                ("POST", "getIamPolicy") => Ok(st.project_policy.clone()),
                ("POST", "setIamPolicy") => {
                    let body = body_object(req)?;
                    let policy = body.get("policy").cloned().ok_or_else(|| ApiError::required("policy"))?;
                    let current = st.project_policy["etag"].clone();
                    let policy = set_policy(&mut st, policy, &current)?;
                    st.project_policy = policy.clone();
                    Ok(policy)
                }
                _ => Err(ApiError::not_found(&req.path)),
            };
        }
        let rest = req.path.strip_prefix("/iam/v1/projects/").ok_or_else(|| ApiError::not_found(&req.path))?;
        let segs: Vec<&str> = rest.split('/').collect();
        match (req.method.as_str(), segs.as_slice()) {
            ("POST", [p, "serviceAccounts"]) => {
                check_project(&st, p)?;
                create_account(&mut st, body_object(req)?)
            }
            ("GET", [p, "serviceAccounts"]) => {
                check_project(&st, p)?;
                Ok(json!({"accounts": st.accounts.values().cloned().collect::<Vec<_>>()}))
            }
            ("GET", [_, "serviceAccounts", email]) => st.accounts.get(&decode(email)).cloned().ok_or_else(|| not_found_account(email)),
            ("PATCH", [_, "serviceAccounts", email]) => {
                let body = body_object(req)?;
                let a = st.accounts.get_mut(&decode(email)).ok_or_else(|| not_found_account(email))?;
                let given = body.get("serviceAccount").cloned().unwrap_or_default();
                for f in ["displayName", "description"] {
                    if let Some(v) = given.get(f) {
                        a[f] = v.clone();
                    }
                }
                Ok(a.clone())
            }
            ("DELETE", [_, "serviceAccounts", email]) => {
                st.accounts.remove(&decode(email)).ok_or_else(|| not_found_account(email))?;
                Ok(json!({}))
            }
            _ => Err(ApiError::not_found(&req.path)),
        }
    }
}

fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned()
}

fn not_found_account(email: &str) -> ApiError {
    ApiError::new(404, "notFound", format!("Unknown service account {}", decode(email)))
}

fn check_project(st: &State, p: &str) -> Result<(), ApiError> {
    if p == st.project || p == st.project_number || p == "-" {
        Ok(())
    } else {
        Err(ApiError::new(403, "forbidden", format!("Permission denied on resource project {p}")))
    }
}

/// `/storage/v1/b/{bucket}/iam` → the bucket.
fn bucket_iam_path(path: &str) -> Option<String> {
    let rest = path.strip_prefix("/storage/v1/b/")?;
    let (bucket, tail) = rest.split_once('/')?;
    (tail == "iam").then(|| decode(bucket))
}

fn valid_account_id(id: &str) -> bool {
    let b = id.as_bytes();
    (6..=30).contains(&b.len())
        && b[0].is_ascii_lowercase()
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && !id.ends_with('-')
}

fn create_account(st: &mut State, body: Map<String, Value>) -> Result<Value, ApiError> {
    let id = body.get("accountId").and_then(Value::as_str).ok_or_else(|| ApiError::required("accountId"))?;
    if !valid_account_id(id) {
        return Err(ApiError::invalid(format!("Invalid account_id {id:?}: [a-z][a-z0-9-]{{4,28}}[a-z0-9]")));
    }
    let email = format!("{id}@{}.iam.gserviceaccount.com", st.project);
    if st.accounts.contains_key(&email) {
        return Err(ApiError::new(409, "alreadyExists", format!("Service account {id} already exists within project projects/{}.", st.project)));
    }
    let given = body.get("serviceAccount").cloned().unwrap_or_default();
    let account = json!({
        "name": format!("projects/{}/serviceAccounts/{email}", st.project),
        "projectId": st.project,
        "uniqueId": crate::google_api::random_id().to_string(),
        "email": email,
        "displayName": given.get("displayName").cloned().unwrap_or(json!("")),
        "description": given.get("description").cloned().unwrap_or(json!("")),
    });
    st.accounts.insert(email, account.clone());
    Ok(account)
}

/// A policy write: the etag must be the current one (or absent), conditions need version 3, every
/// condition must be one [`condition_holds`] understands.
fn set_policy(st: &mut State, mut policy: Value, current_etag: &Value) -> Result<Value, ApiError> {
    if let Some(given) = policy.get("etag") {
        if given != current_etag {
            return Err(ApiError::new(
                409,
                "aborted",
                "There were concurrent policy changes. Please retry the whole read-modify-write with exponential backoff.",
            ));
        }
    }
    for b in policy["bindings"].as_array().into_iter().flatten() {
        if b["condition"].is_object() {
            if policy["version"].as_i64().unwrap_or(1) < 3 {
                return Err(ApiError::invalid("a policy with conditions must be version 3"));
            }
            parse_condition(b["condition"]["expression"].as_str().unwrap_or_default()).map_err(ApiError::invalid)?;
        }
    }
    policy["etag"] = json!(st.etag());
    Ok(policy)
}

/// One term of the CEL subset the emulator evaluates.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Term {
    Is(String),
    StartsWith(String),
}

/// `resource.name == "…"` and `resource.name.startsWith("…")` joined by `||`: anything else is
/// refused (an emulator that ignored a condition would grant what Google denies).
fn parse_condition(expr: &str) -> Result<Vec<Term>, String> {
    let quoted = |s: &str| -> Option<String> { s.strip_prefix('"')?.strip_suffix('"').filter(|q| !q.contains('"')).map(str::to_string) };
    expr.split("||")
        .map(str::trim)
        .map(|t| {
            if let Some(v) = t.strip_prefix("resource.name ==").map(str::trim).and_then(quoted) {
                Ok(Term::Is(v))
            } else if let Some(v) = t.strip_prefix("resource.name.startsWith(").and_then(|r| r.strip_suffix(')')).and_then(quoted) {
                Ok(Term::StartsWith(v))
            } else {
                Err(format!("condition term {t:?}: the local IAM evaluates resource.name == \"…\" and resource.name.startsWith(\"…\") only"))
            }
        })
        .collect()
}

/// Whether a condition holds for `resource` (a malformed one never does).
pub fn condition_holds(condition: &Value, resource: &str) -> bool {
    if !condition.is_object() {
        return true;
    }
    parse_condition(condition["expression"].as_str().unwrap_or_default()).is_ok_and(|terms| {
        terms.iter().any(|t| match t {
            Term::Is(v) => v == resource,
            Term::StartsWith(v) => resource.starts_with(v.as_str()),
        })
    })
}

/// The permissions of the roles that matter to Cloud Storage.
fn role_permissions(role: &str) -> &'static [&'static str] {
    const OBJECT_ALL: &[&str] = &["storage.objects.get", "storage.objects.list", "storage.objects.create", "storage.objects.delete", "storage.objects.update"];
    const ALL: &[&str] = &[
        "storage.objects.get",
        "storage.objects.list",
        "storage.objects.create",
        "storage.objects.delete",
        "storage.objects.update",
        "storage.buckets.get",
        "storage.buckets.getIamPolicy",
        "storage.buckets.setIamPolicy",
        "storage.buckets.create",
    ];
    match role {
        "roles/owner" | "roles/editor" | "roles/storage.admin" => ALL,
        "roles/storage.objectAdmin" => OBJECT_ALL,
        "roles/storage.objectCreator" => &["storage.objects.create"],
        "roles/storage.objectViewer" => &["storage.objects.get", "storage.objects.list"],
        "roles/storage.legacyBucketReader" => &["storage.objects.list", "storage.buckets.get"],
        "roles/storage.legacyObjectReader" => &["storage.objects.get"],
        _ => &[],
    }
}

/// Who calls: a service account's email (or `user:` member) and the token's scopes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The IAM member (`serviceAccount:…`, `user:…`).
    pub member: String,
    pub scopes: Vec<String>,
}

const CLOUD_PLATFORM: &str = "https://www.googleapis.com/auth/cloud-platform";
const FULL_CONTROL: &str = "https://www.googleapis.com/auth/devstorage.full_control";
const READ_WRITE: &str = "https://www.googleapis.com/auth/devstorage.read_write";
const READ_ONLY: &str = "https://www.googleapis.com/auth/devstorage.read_only";

/// Whether `scopes` let a token use `permission` at all (before IAM).
fn scope_allows(scopes: &[String], permission: &str) -> bool {
    let has = |s: &str| scopes.iter().any(|x| x == s);
    if has(CLOUD_PLATFORM) || has(FULL_CONTROL) {
        return true;
    }
    let read = matches!(permission, "storage.objects.get" | "storage.objects.list" | "storage.buckets.get");
    if read && has(READ_ONLY) {
        return true;
    }
    has(READ_WRITE) && !permission.contains("IamPolicy")
}

/// Cloud Storage's decision on `permission` for `resource`
/// (`projects/_/buckets/B` or `projects/_/buckets/B/objects/NAME`): the token's scopes first, then
/// the project's and the bucket's bindings (each binding's condition evaluated on `resource`).
/// `Err` says why not.
pub fn authorize(project_policy: &Value, bucket_policy: &Value, caller: &Caller, permission: &str, resource: &str) -> Result<(), String> {
    if !scope_allows(&caller.scopes, permission) {
        return Err(format!("{} does not have {permission} access to {resource}: insufficient OAuth scopes ({})", caller.member, caller.scopes.join(" ")));
    }
    for policy in [project_policy, bucket_policy] {
        for b in policy["bindings"].as_array().into_iter().flatten() {
            let member = b["members"].as_array().into_iter().flatten().any(|m| m.as_str() == Some(caller.member.as_str()));
            if member && role_permissions(b["role"].as_str().unwrap_or_default()).contains(&permission) && condition_holds(&b["condition"], resource) {
                return Ok(());
            }
        }
    }
    Err(format!("{} does not have {permission} access to {resource}", caller.member))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(email: &str, scopes: &[&str]) -> Caller {
        Caller { member: format!("serviceAccount:{email}"), scopes: scopes.iter().map(|s| s.to_string()).collect() }
    }

    /// A table of Cloud Storage decisions.
    #[test]
    fn storage_calls_are_decided_by_scopes_then_bindings_and_conditions() {
        let project = json!({"bindings": [{"role": "roles/editor", "members": ["serviceAccount:1-compute@developer.gserviceaccount.com"]}]});
        let bucket = json!({"version": 3, "bindings": [
            {"role": "roles/storage.objectViewer", "members": ["serviceAccount:node@p.iam.gserviceaccount.com"],
             "condition": {"title": "n", "expression": "resource.name.startsWith(\"projects/_/buckets/b/objects/c/igconfig/node/\") || resource.name == \"projects/_/buckets/b/objects/c/secrets/node-bootstrap-token\""}},
            {"role": "roles/storage.objectAdmin", "members": ["serviceAccount:cp@p.iam.gserviceaccount.com"],
             "condition": {"title": "cp", "expression": "resource.name == \"projects/_/buckets/b\" || resource.name.startsWith(\"projects/_/buckets/b/objects/c/\")"}},
        ]});
        let obj = |k: &str| format!("projects/_/buckets/b/objects/c/{k}");
        let node = sa("node@p.iam.gserviceaccount.com", &[READ_ONLY]);
        let cp = sa("cp@p.iam.gserviceaccount.com", &[CLOUD_PLATFORM]);
        let default = sa("1-compute@developer.gserviceaccount.com", &[CLOUD_PLATFORM]);
        let cases: Vec<(&Caller, &str, String, bool)> = vec![
            (&node, "storage.objects.get", obj("igconfig/node/nodes/nodeupconfig.yaml"), true),
            (&node, "storage.objects.get", obj("pki/private/kubernetes-ca/keyset.yaml"), false),
            (&node, "storage.objects.get", obj("secrets/encryptionconfig"), false),
            (&node, "storage.objects.get", obj("secrets/node-bootstrap-token"), true),
            (&node, "storage.objects.get", obj("secrets/node-bootstrap-token2"), false),
            (&node, "storage.objects.get", obj("backups/etcd/main/x"), false),
            (&node, "storage.objects.create", obj("addons/bootstrap-channel.yaml"), false),
            (&node, "storage.objects.create", obj("igconfig/node/_api-servers.yaml"), false),
            (&node, "storage.objects.list", "projects/_/buckets/b".into(), false),
            (&node, "storage.objects.get", "projects/_/buckets/b/objects/other/igconfig/node/x".into(), false),
            (&cp, "storage.objects.get", obj("pki/private/kubernetes-ca/keyset.yaml"), true),
            (&cp, "storage.objects.create", obj("backups/etcd/main/x"), true),
            (&cp, "storage.objects.list", "projects/_/buckets/b".into(), true),
            (&cp, "storage.objects.get", "projects/_/buckets/b/objects/other-cluster/pki/private/x".into(), false),
            (&cp, "storage.buckets.setIamPolicy", "projects/_/buckets/b".into(), false),
            (&default, "storage.objects.get", obj("pki/private/kubernetes-ca/keyset.yaml"), true),
        ];
        for (caller, perm, res, want) in cases {
            let got = authorize(&project, &bucket, caller, perm, &res);
            assert_eq!(got.is_ok(), want, "{} {perm} {res}: {got:?}", caller.member);
        }
        // Scopes are checked before IAM: a read-only token cannot write even where IAM would allow it.
        let cp_read_only = sa("cp@p.iam.gserviceaccount.com", &[READ_ONLY]);
        assert!(authorize(&project, &bucket, &cp_read_only, "storage.objects.create", &obj("x")).unwrap_err().contains("scopes"));
        // Logging and monitoring scopes reach no storage.
        let no_storage = sa("node@p.iam.gserviceaccount.com", &["https://www.googleapis.com/auth/logging.write"]);
        assert!(authorize(&project, &bucket, &no_storage, "storage.objects.get", &obj("igconfig/node/x")).is_err());
    }

    #[test]
    fn conditions_the_emulator_cannot_evaluate_are_refused() {
        assert!(parse_condition("resource.name.startsWith(\"a\") || resource.name == \"b\"").is_ok());
        assert!(parse_condition("resource.type == \"storage.googleapis.com/Object\"").is_err());
        assert!(parse_condition("request.time < timestamp(\"2030-01-01T00:00:00Z\")").is_err());
        assert!(!condition_holds(&json!({"expression": "resource.type == \"x\""}), "anything"), "never granted on what it cannot read");
    }

    fn call(iam: &GceIam, method: &str, path: &str, body: Value) -> (u16, Value) {
        let r = iam.answer(&crate::google_api::bearer_request(method, path, &body));
        let crate::httpd::Body::Bytes(b) = r.body else { panic!("bytes") };
        (r.status, serde_json::from_slice(&b).unwrap_or(Value::Null))
    }

    #[test]
    fn accounts_and_policies_follow_the_rest_api() {
        let iam = GceIam::new("p", "1");
        let (s, a) = call(&iam, "POST", "/iam/v1/projects/p/serviceAccounts", json!({"accountId": "node-c", "serviceAccount": {"displayName": "node-c"}}));
        assert_eq!((s, a["email"].as_str()), (200, Some("node-c@p.iam.gserviceaccount.com")));
        assert_eq!(call(&iam, "POST", "/iam/v1/projects/p/serviceAccounts", json!({"accountId": "node-c"})).0, 409);
        assert_eq!(call(&iam, "POST", "/iam/v1/projects/p/serviceAccounts", json!({"accountId": "Bad_Id"})).0, 400);
        let (_, policy) = call(&iam, "POST", "/cloudresourcemanager/v1/projects/p:getIamPolicy", json!({}));
        assert_eq!(policy["bindings"][0]["role"], "roles/editor", "a new project's default Compute account is an editor");
        let stale = json!({"policy": {"etag": "old", "bindings": []}});
        assert_eq!(call(&iam, "POST", "/cloudresourcemanager/v1/projects/p:setIamPolicy", stale).0, 409);
        let (s, b) = call(&iam, "GET", "/storage/v1/b/bkt/iam", Value::Null);
        assert_eq!(s, 200);
        let v1_condition = json!({"etag": b["etag"], "bindings": [{"role": "roles/storage.objectViewer", "members": ["x"], "condition": {"expression": "resource.name == \"a\""}}]});
        assert_eq!(call(&iam, "PUT", "/storage/v1/b/bkt/iam", v1_condition).0, 400, "conditions need version 3");
        let v3 = json!({"version": 3, "etag": b["etag"], "bindings": [{"role": "roles/storage.objectViewer", "members": ["x"], "condition": {"expression": "resource.name == \"a\""}}]});
        assert_eq!(call(&iam, "PUT", "/storage/v1/b/bkt/iam", v3).0, 200);
        assert_eq!(iam.bucket_policy("bkt")["bindings"][0]["members"][0], "x");
        assert_eq!(call(&iam, "DELETE", "/iam/v1/projects/p/serviceAccounts/node-c%40p.iam.gserviceaccount.com", Value::Null).0, 200);
        assert!(iam.account_emails().is_empty());
    }
}
