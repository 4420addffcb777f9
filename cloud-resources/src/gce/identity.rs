//! The GCE identities of a cluster, as kOps' `pkg/model/gcemodel/service_accounts.go` makes them:
//! one service account per role (control plane — API servers share it —, node, bastion), the
//! control plane's one project role, and what each role may do in the `gs://` state store, granted
//! on the bucket with an IAM condition on the cluster's object prefix. Nodes get no project role
//! and read only what a worker needs; nothing of a node's identity reaches `pki/private/`,
//! `secrets/`, `backups/` or `addons/`.

use cloud::gce::iam as gce_iam;
use serde_json::{json, Value};

use crate::plan::{Action, Change, Kind};
use crate::tasks::{Fields, Link, Linked};
use crate::terraform_json::Blocks;

use super::views::Names;
use super::{Exec, GceFuture, GceTask, Typed};

/// A service account the cluster owns (`keelson delete` deletes it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceAccount {
    /// The model's name: the account id.
    pub name: String,
    pub project: String,
    pub account_id: String,
    pub email: String,
    pub display_name: String,
    pub description: String,
}

impl Linked for ServiceAccount {
    const TF_TYPE: &'static str = "google_service_account";
    const TF_ATTR: &'static str = "email";
}

impl GceTask for ServiceAccount {
    fn kind(&self) -> Kind {
        Kind::GceServiceAccount
    }
    fn name(&self) -> String {
        self.name.clone()
    }
    fn gce_name(&self, _names: &Names) -> String {
        self.email.clone()
    }
    fn fields(&self, f: &mut Fields, _names: &Names) {
        f.set("project", &self.project).set("display_name", &self.display_name).set("description", &self.description);
    }
    fn body(&self, _names: &Names) -> Value {
        json!({
            "accountId": self.account_id,
            "serviceAccount": {"displayName": self.display_name, "description": self.description},
        })
    }
    /// Its display name and description change in place; one already gone is deleted.
    fn render_gce<'a>(&'a self, cx: Exec<'a>, c: &'a Change) -> GceFuture<'a> {
        Box::pin(async move {
            let iam = &cx.target.iam;
            match &c.action {
                Action::Create => {
                    iam.create_service_account(&self.account_id, &self.display_name, &self.description).await?;
                }
                Action::Update(_) => {
                    iam.patch_service_account(&self.email, &self.display_name, &self.description).await?;
                }
                Action::Delete => match iam.delete_service_account(&self.email).await {
                    Err(e) if !e.is_not_found() => return Err(e.into()),
                    _ => {}
                },
            }
            Ok(())
        })
    }
    fn render_terraform(&self, b: &mut Blocks) {
        b.add(
            "google_service_account",
            &self.name,
            json!({"project": self.project, "account_id": self.account_id, "display_name": self.display_name, "description": self.description}),
        );
    }
}

/// The member string of a service account in an IAM policy.
pub fn member_of(email: &str) -> String {
    format!("serviceAccount:{email}")
}

/// One role granted to one of the cluster's service accounts on the project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectIamMember {
    /// `<role> <member>`.
    pub name: String,
    pub project: String,
    pub role: String,
    /// The account's email.
    pub email: String,
    pub account: Link<ServiceAccount>,
}

impl GceTask for ProjectIamMember {
    fn kind(&self) -> Kind {
        Kind::GceProjectIamMember
    }
    fn name(&self) -> String {
        self.name.clone()
    }
    fn gce_name(&self, _names: &Names) -> String {
        self.name.clone()
    }
    fn fields(&self, f: &mut Fields, _names: &Names) {
        f.set("project", &self.project).set("role", &self.role).set("member", member_of(&self.email));
    }
    fn body(&self, _names: &Names) -> Value {
        json!({"role": self.role, "members": [member_of(&self.email)]})
    }
    /// The project's policy read, the member added to or removed from the role, written back.
    fn render_gce<'a>(&'a self, cx: Exec<'a>, c: &'a Change) -> GceFuture<'a> {
        Box::pin(async move {
            let c = Typed::<ProjectIamMember>::of(c);
            let member = member_of(&self.email);
            match c.action {
                Action::Create => cx.target.change_project_policy(|p| gce_iam::with_member(p, &self.role, &member, None)).await,
                Action::Update(_) => Err(c.refuse("a project grant")),
                Action::Delete => cx.target.change_project_policy(|p| gce_iam::without_member(p, &self.role, &member, None)).await,
            }
        })
    }
    fn render_terraform(&self, b: &mut Blocks) {
        b.add(
            "google_project_iam_member",
            &self.name,
            json!({"project": self.project, "role": self.role, "member": format!("serviceAccount:{}", self.account.tf())}),
        );
    }
}

/// An IAM condition (CEL), as bucket policies of version 3 carry it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    pub title: String,
    pub description: String,
    pub expression: String,
}

/// The plan's name of a bucket grant: `<bucket> <role> <member>`, and the first 8 hex digits of
/// the sha256 of its condition's expression (one member may hold a role under several conditions).
pub fn bucket_member_name(bucket: &str, role: &str, member: &str, expression: Option<&str>) -> String {
    match expression {
        Some(e) => format!("{bucket} {role} {member} {}", &base::sha256_hex(e.as_bytes())[..8]),
        None => format!("{bucket} {role} {member}"),
    }
}

/// One role granted to one of the cluster's service accounts on a bucket, limited by a condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketIamMember {
    /// [`bucket_member_name`].
    pub name: String,
    pub bucket: String,
    pub role: String,
    pub email: String,
    pub account: Link<ServiceAccount>,
    pub condition: Option<Condition>,
}

impl BucketIamMember {
    /// The condition as IAM policies carry it.
    fn condition_value(&self) -> Option<Value> {
        self.condition.as_ref().map(|c| json!({"title": c.title, "description": c.description, "expression": c.expression}))
    }
}

impl GceTask for BucketIamMember {
    fn kind(&self) -> Kind {
        Kind::GceBucketIamMember
    }
    fn name(&self) -> String {
        self.name.clone()
    }
    fn gce_name(&self, _names: &Names) -> String {
        self.name.clone()
    }
    fn fields(&self, f: &mut Fields, _names: &Names) {
        f.set("bucket", &self.bucket)
            .set("role", &self.role)
            .set("member", member_of(&self.email))
            .set("condition", self.condition.as_ref().map(|c| c.expression.as_str()).unwrap_or(""));
    }
    fn body(&self, _names: &Names) -> Value {
        let mut v = json!({"role": self.role, "members": [member_of(&self.email)]});
        if let Some(c) = self.condition_value() {
            v["condition"] = c;
        }
        v
    }
    /// The bucket's policy read, the member added to or removed from the (conditional) binding,
    /// written back.
    fn render_gce<'a>(&'a self, cx: Exec<'a>, c: &'a Change) -> GceFuture<'a> {
        Box::pin(async move {
            let c = Typed::<BucketIamMember>::of(c);
            let (member, condition) = (member_of(&self.email), self.condition_value());
            match c.action {
                Action::Create => cx.target.change_bucket_policy(&self.bucket, |p| gce_iam::with_member(p, &self.role, &member, condition.as_ref())).await,
                Action::Update(_) => Err(c.refuse("a bucket grant")),
                Action::Delete => cx.target.change_bucket_policy(&self.bucket, |p| gce_iam::without_member(p, &self.role, &member, condition.as_ref())).await,
            }
        })
    }
    fn render_terraform(&self, b: &mut Blocks) {
        let mut v = json!({"bucket": self.bucket, "role": self.role, "member": format!("serviceAccount:{}", self.account.tf())});
        if let Some(c) = &self.condition {
            v["condition"] = json!([{"title": c.title, "description": c.description, "expression": c.expression}]);
        }
        b.add("google_storage_bucket_iam_member", &self.name, v);
    }
}

/// The resource name of an object (or, with `rel` empty, of every object under `prefix`) as IAM
/// conditions on Cloud Storage see it.
pub fn object_resource(bucket: &str, prefix: &str, rel: &str) -> String {
    let prefix = prefix.trim_matches('/');
    let key = match (prefix.is_empty(), rel.is_empty()) {
        (true, _) => rel.to_string(),
        (false, true) => format!("{prefix}/"),
        (false, false) => format!("{prefix}/{rel}"),
    };
    format!("projects/_/buckets/{bucket}/objects/{key}")
}

/// The CEL expression that holds for the objects `rels` name under `prefix` (a `rel` ending in `/`
/// is every object under it, any other exactly that object) and, with `bucket_itself`, for the
/// bucket (object listing is checked against the bucket).
pub fn condition_expression(bucket: &str, prefix: &str, rels: &[&str], bucket_itself: bool) -> String {
    let mut terms: Vec<String> = Vec::new();
    if bucket_itself {
        terms.push(format!("resource.name == \"projects/_/buckets/{bucket}\""));
    }
    for rel in rels {
        let name = object_resource(bucket, prefix, rel);
        if rel.is_empty() || rel.ends_with('/') {
            terms.push(format!("resource.name.startsWith(\"{name}\")"));
        } else {
            terms.push(format!("resource.name == \"{name}\""));
        }
    }
    terms.join(" || ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_name_objects_as_cloud_storage_iam_sees_them() {
        assert_eq!(object_resource("b", "c.example.com", "igconfig/node/"), "projects/_/buckets/b/objects/c.example.com/igconfig/node/");
        assert_eq!(object_resource("b", "", "igconfig/node/"), "projects/_/buckets/b/objects/igconfig/node/");
        assert_eq!(object_resource("b", "/x/", ""), "projects/_/buckets/b/objects/x/");
        assert_eq!(
            condition_expression("b", "c", &["igconfig/node/", "secrets/node-bootstrap-token"], false),
            "resource.name.startsWith(\"projects/_/buckets/b/objects/c/igconfig/node/\") || resource.name == \"projects/_/buckets/b/objects/c/secrets/node-bootstrap-token\""
        );
        assert_eq!(
            condition_expression("b", "c", &[""], true),
            "resource.name == \"projects/_/buckets/b\" || resource.name.startsWith(\"projects/_/buckets/b/objects/c/\")"
        );
    }
}
