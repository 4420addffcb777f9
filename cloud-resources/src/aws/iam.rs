//! IAM roles (assume-role policy, inline policy, managed policies, permissions boundary) and the
//! instance profiles of the same name that launch templates reference.
//!
//! IAM has no tag filter on listings, so resources are looked up by their (deterministic) names;
//! delete only touches the ones tagged `KubernetesCluster=<cluster>`.

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_iam::types as iam_t;
use serde_json::Value;

use super::task::{joined, typed, Fields, Task};
use super::{api, AwsError, AwsTarget, Discovered, Resolved};
use crate::iam_policy::{assume_role_policy, policy};
use crate::model::ClusterModel;
use crate::plan::{Action, Change, Kind, Resource};
use base::sha256_hex;

/// A policy document in one canonical form (keys sorted, no whitespace), so equal documents compare equal.
fn canonical(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// IAM returns policy documents URL-encoded.
fn decode_document(doc: &str) -> Option<Value> {
    let text = percent_encoding::percent_decode_str(doc).decode_utf8().ok()?;
    serde_json::from_str(&text).ok()
}

fn iam_tags(tags: &BTreeMap<String, String>) -> Vec<iam_t::Tag> {
    tags.iter().filter_map(|(k, v)| iam_t::Tag::builder().key(k).value(v).build().ok()).collect()
}

fn tags_of(tags: &[iam_t::Tag]) -> BTreeMap<String, String> {
    tags.iter().map(|t| (t.key().to_string(), t.value().to_string())).collect()
}

/// The inline policy document of a role, rendered for the resolved hosted zone.
fn policy_document(model: &ClusterModel, resolved: &Resolved, name: &str) -> Option<Value> {
    let role = model.iam_roles.iter().find(|r| r.name == name)?;
    policy(role, &model.policy_inputs, resolved.zone.as_deref())
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IamRole {
    pub name: String,
    /// sha256 of the canonical assume-role policy.
    pub assume_role_sha256: String,
    /// sha256 of the canonical inline policy; empty when the role has none.
    pub policy_sha256: String,
    pub managed_policies: BTreeSet<String>,
    pub permissions_boundary: Option<String>,
    pub tags: BTreeMap<String, String>,
}

impl IamRole {
    pub fn fields(&self, f: &mut Fields) {
        f.set("assume_role.sha256", &self.assume_role_sha256).set("policy.sha256", &self.policy_sha256);
        if !self.managed_policies.is_empty() {
            f.set("managed_policies", joined(&self.managed_policies));
        }
        f.opt("permissions_boundary", self.permissions_boundary.as_ref());
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceProfile {
    pub name: String,
    /// The role in it (`None` when it holds none).
    pub role: Option<String>,
    pub tags: BTreeMap<String, String>,
}

impl InstanceProfile {
    pub fn fields(&self, f: &mut Fields) {
        f.set("role", self.role.clone().unwrap_or_default());
    }
}

super::task::picker!(pick_role, IamRole, IamRole);

super::task::picker!(pick_profile, InstanceProfile, InstanceProfile);

pub(super) fn desired(model: &ClusterModel, resolved: &Resolved, out: &mut Vec<Resource>) {
    for role in &model.iam_roles {
        let doc = policy_document(model, resolved, &role.name);
        let task = IamRole {
            name: role.name.clone(),
            assume_role_sha256: sha256_hex(canonical(&assume_role_policy(&model.policy_inputs.partition)).as_bytes()),
            policy_sha256: doc.map(|d| sha256_hex(canonical(&d).as_bytes())).unwrap_or_default(),
            managed_policies: role.managed_policies.iter().cloned().collect(),
            permissions_boundary: role.permissions_boundary.clone(),
            tags: role.tags.clone(),
        };
        out.push(Task::IamRole(task).view(None));
        let profile = InstanceProfile { name: role.name.clone(), role: Some(role.name.clone()), tags: role.tags.clone() };
        out.push(Task::InstanceProfile(profile).view(None));
    }
}

fn not_found<E: aws_sdk_iam::error::ProvideErrorMetadata>(e: &aws_sdk_iam::error::SdkError<E>) -> bool {
    e.as_service_error().and_then(|s| s.code()) == Some("NoSuchEntity")
}

/// The roles and profiles of the model's names that are tagged for this cluster (apply never
/// adopts, and delete never touches, someone else's role of the same name).
pub(super) async fn discover(t: &AwsTarget, model: &ClusterModel, d: &mut Discovered) -> Result<(), AwsError> {
    for role in &model.iam_roles {
        let name = role.name.as_str();
        let ours = |tags: &BTreeMap<String, String>| tags.get("KubernetesCluster") == Some(&model.cluster);
        match t.iam.get_role().role_name(name).send().await {
            Ok(resp) => {
                let Some(r) = resp.role() else { continue };
                let tags = tags_of(r.tags());
                if ours(&tags) {
                    let assume = r.assume_role_policy_document().and_then(decode_document).map(|v| sha256_hex(canonical(&v).as_bytes()));
                    let inline = match t.iam.get_role_policy().role_name(name).policy_name(name).send().await {
                        Ok(p) => decode_document(p.policy_document()).map(|v| sha256_hex(canonical(&v).as_bytes())).unwrap_or_default(),
                        Err(e) if not_found(&e) => String::new(),
                        Err(e) => return Err(api("GetRolePolicy", name, e)),
                    };
                    let attached = t.iam.list_attached_role_policies().role_name(name).send().await.map_err(|e| api("ListAttachedRolePolicies", name, e))?;
                    let managed: BTreeSet<String> = attached.attached_policies().iter().filter_map(|p| p.policy_arn().map(str::to_string)).collect();
                    let task = IamRole {
                        name: name.to_string(),
                        assume_role_sha256: assume.unwrap_or_default(),
                        policy_sha256: inline,
                        managed_policies: managed,
                        permissions_boundary: r.permissions_boundary().and_then(|b| b.permissions_boundary_arn()).map(str::to_string),
                        tags,
                    };
                    d.resources.push(Task::IamRole(task).view(Some(r.arn().to_string())));
                }
            }
            Err(e) if not_found(&e) => {}
            Err(e) => return Err(api("GetRole", name, e)),
        }
        match t.iam.get_instance_profile().instance_profile_name(name).send().await {
            Ok(resp) => {
                let Some(p) = resp.instance_profile() else { continue };
                let tags = tags_of(p.tags());
                if ours(&tags) {
                    let profile = InstanceProfile { name: name.to_string(), role: p.roles().first().map(|r| r.role_name().to_string()), tags };
                    d.resources.push(Task::InstanceProfile(profile).view(Some(p.arn().to_string())));
                }
            }
            Err(e) if not_found(&e) => {}
            Err(e) => return Err(api("GetInstanceProfile", name, e)),
        }
    }
    Ok(())
}

impl AwsTarget {
    /// Create, update or delete one IAM resource.
    pub(super) async fn execute_iam(&self, model: &ClusterModel, resolved: &Resolved, c: &Change) -> Result<(), AwsError> {
        let name = c.name.as_str();
        let (kind, desired, actual) = (c.kind, c.desired.as_ref(), c.actual.as_ref());
        let changed = |field: &str| match &c.action {
            Action::Create => true,
            Action::Update(f) => f.iter().any(|f| f.field == field),
            Action::Delete => false,
        };
        let tag_change = matches!(&c.action, Action::Update(f) if f.iter().any(|f| f.field.starts_with("tags[")));
        match (c.kind, &c.action) {
            (Kind::IamRole, Action::Create | Action::Update(_)) => {
                let want = typed(desired, kind, name, "desired", pick_role)?;
                let assume = canonical(&assume_role_policy(&model.policy_inputs.partition));
                if c.action == Action::Create {
                    self.iam
                        .create_role()
                        .role_name(name)
                        .assume_role_policy_document(&assume)
                        .description(format!("Keelson instance role of cluster {}", model.cluster))
                        .set_permissions_boundary(want.permissions_boundary.clone())
                        .set_tags(Some(iam_tags(&want.tags)))
                        .send()
                        .await
                        .map_err(|e| api("CreateRole", name, e))?;
                } else {
                    if changed("assume_role.sha256") {
                        self.iam
                            .update_assume_role_policy()
                            .role_name(name)
                            .policy_document(&assume)
                            .send()
                            .await
                            .map_err(|e| api("UpdateAssumeRolePolicy", name, e))?;
                    }
                    if changed("permissions_boundary") {
                        match &want.permissions_boundary {
                            Some(b) => {
                                self.iam
                                    .put_role_permissions_boundary()
                                    .role_name(name)
                                    .permissions_boundary(b)
                                    .send()
                                    .await
                                    .map_err(|e| api("PutRolePermissionsBoundary", name, e))?;
                            }
                            None => {
                                self.iam
                                    .delete_role_permissions_boundary()
                                    .role_name(name)
                                    .send()
                                    .await
                                    .map_err(|e| api("DeleteRolePermissionsBoundary", name, e))?;
                            }
                        }
                    }
                    if tag_change {
                        self.iam.tag_role().role_name(name).set_tags(Some(iam_tags(&want.tags))).send().await.map_err(|e| api("TagRole", name, e))?;
                    }
                }
                if changed("policy.sha256") {
                    match policy_document(model, resolved, name) {
                        Some(doc) => {
                            self.iam
                                .put_role_policy()
                                .role_name(name)
                                .policy_name(name)
                                .policy_document(canonical(&doc))
                                .send()
                                .await
                                .map_err(|e| api("PutRolePolicy", name, e))?;
                        }
                        None if c.action != Action::Create => {
                            self.iam.delete_role_policy().role_name(name).policy_name(name).send().await.map_err(|e| api("DeleteRolePolicy", name, e))?;
                        }
                        None => {}
                    }
                }
                if changed("managed_policies") {
                    let have = match actual {
                        Some(_) => typed(actual, kind, name, "actual", pick_role)?.managed_policies.clone(),
                        None => BTreeSet::new(),
                    };
                    for arn in want.managed_policies.difference(&have) {
                        self.iam.attach_role_policy().role_name(name).policy_arn(arn).send().await.map_err(|e| api("AttachRolePolicy", name, e))?;
                    }
                    for arn in have.difference(&want.managed_policies) {
                        self.iam.detach_role_policy().role_name(name).policy_arn(arn).send().await.map_err(|e| api("DetachRolePolicy", name, e))?;
                    }
                }
            }
            (Kind::IamRole, Action::Delete) => {
                for arn in &typed(actual, kind, name, "actual", pick_role)?.managed_policies {
                    self.iam.detach_role_policy().role_name(name).policy_arn(arn).send().await.map_err(|e| api("DetachRolePolicy", name, e))?;
                }
                let inline = self.iam.list_role_policies().role_name(name).send().await.map_err(|e| api("ListRolePolicies", name, e))?;
                for p in inline.policy_names() {
                    self.iam.delete_role_policy().role_name(name).policy_name(p).send().await.map_err(|e| api("DeleteRolePolicy", name, e))?;
                }
                let profiles =
                    self.iam.list_instance_profiles_for_role().role_name(name).send().await.map_err(|e| api("ListInstanceProfilesForRole", name, e))?;
                for p in profiles.instance_profiles() {
                    self.remove_role_from_profile(p.instance_profile_name(), name).await?;
                }
                self.iam.delete_role().role_name(name).send().await.map_err(|e| api("DeleteRole", name, e))?;
            }
            (Kind::IamInstanceProfile, Action::Create) => {
                let want = typed(desired, kind, name, "desired", pick_profile)?;
                let role = want.role.as_deref().ok_or_else(|| AwsError::Missing {
                    kind: "IAMInstanceProfile",
                    name: name.into(),
                    message: "no role to put in it".into(),
                })?;
                self.iam
                    .create_instance_profile()
                    .instance_profile_name(name)
                    .set_tags(Some(iam_tags(&want.tags)))
                    .send()
                    .await
                    .map_err(|e| api("CreateInstanceProfile", name, e))?;
                self.add_role_to_profile(name, role).await?;
            }
            (Kind::IamInstanceProfile, Action::Update(_)) => {
                let want = typed(desired, kind, name, "desired", pick_profile)?;
                let have = typed(actual, kind, name, "actual", pick_profile)?;
                if changed("role") {
                    if let Some(old) = &have.role {
                        self.remove_role_from_profile(name, old).await?;
                    }
                    if let Some(role) = &want.role {
                        self.add_role_to_profile(name, role).await?;
                    }
                }
                if tag_change {
                    self.iam
                        .tag_instance_profile()
                        .instance_profile_name(name)
                        .set_tags(Some(iam_tags(&want.tags)))
                        .send()
                        .await
                        .map_err(|e| api("TagInstanceProfile", name, e))?;
                }
            }
            (Kind::IamInstanceProfile, Action::Delete) => {
                if let Some(role) = &typed(actual, kind, name, "actual", pick_profile)?.role {
                    self.remove_role_from_profile(name, role).await?;
                }
                self.iam.delete_instance_profile().instance_profile_name(name).send().await.map_err(|e| api("DeleteInstanceProfile", name, e))?;
            }
            (kind, _) => return Err(AwsError::Missing { kind: "IAM", name: name.into(), message: format!("{} is not an IAM resource", kind.as_str()) }),
        }
        Ok(())
    }

    async fn add_role_to_profile(&self, profile: &str, role: &str) -> Result<(), AwsError> {
        self.iam
            .add_role_to_instance_profile()
            .instance_profile_name(profile)
            .role_name(role)
            .send()
            .await
            .map_err(|e| api("AddRoleToInstanceProfile", profile, e))?;
        Ok(())
    }

    async fn remove_role_from_profile(&self, profile: &str, role: &str) -> Result<(), AwsError> {
        self.iam
            .remove_role_from_instance_profile()
            .instance_profile_name(profile)
            .role_name(role)
            .send()
            .await
            .map_err(|e| api("RemoveRoleFromInstanceProfile", profile, e))?;
        Ok(())
    }
}
