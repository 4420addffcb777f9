//! IAM roles (assume-role policy, inline policy, managed policies, permissions boundary) and the
//! instance profiles of the same name that launch templates reference.
//!
//! IAM has no tag filter on listings, so resources are looked up by their (deterministic) names;
//! delete only touches the ones tagged `KubernetesCluster=<cluster>`.

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_iam::types as iam_t;
use serde_json::Value;

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

pub(super) fn desired(model: &ClusterModel, resolved: &Resolved, out: &mut Vec<Resource>) {
    for role in &model.iam_roles {
        let doc = policy_document(model, resolved, &role.name);
        let mut r = Resource::new(Kind::IamRole, &role.name)
            .attr("assume_role.sha256", sha256_hex(canonical(&assume_role_policy(&model.policy_inputs.partition)).as_bytes()))
            .attr("policy.sha256", doc.map(|d| sha256_hex(canonical(&d).as_bytes())).unwrap_or_default())
            .tags(&role.tags);
        if !role.managed_policies.is_empty() {
            r = r.attr("managed_policies", role.managed_policies.join(","));
        }
        if let Some(b) = &role.permissions_boundary {
            r = r.attr("permissions_boundary", b);
        }
        out.push(r);
        out.push(Resource::new(Kind::IamInstanceProfile, &role.name).attr("role", &role.name).tags(&role.tags));
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
                    let attached = t
                        .iam
                        .list_attached_role_policies()
                        .role_name(name)
                        .send()
                        .await
                        .map_err(|e| api("ListAttachedRolePolicies", name, e))?;
                    let managed: BTreeSet<String> =
                        attached.attached_policies().iter().filter_map(|p| p.policy_arn().map(str::to_string)).collect();
                    let mut res = Resource::new(Kind::IamRole, name)
                        .attr("assume_role.sha256", assume.unwrap_or_default())
                        .attr("policy.sha256", inline)
                        .tags(&tags);
                    if !managed.is_empty() {
                        res = res.attr("managed_policies", managed.into_iter().collect::<Vec<_>>().join(","));
                    }
                    if let Some(b) = r.permissions_boundary().and_then(|b| b.permissions_boundary_arn()) {
                        res = res.attr("permissions_boundary", b);
                    }
                    res.id = Some(r.arn().to_string());
                    d.resources.push(res);
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
                    let role_name = p.roles().first().map(|r| r.role_name().to_string()).unwrap_or_default();
                    let mut res = Resource::new(Kind::IamInstanceProfile, name).attr("role", role_name).tags(&tags);
                    res.id = Some(p.arn().to_string());
                    d.resources.push(res);
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
        let desired = c.desired.as_ref();
        let attr = |k: &str| desired.and_then(|d| d.attrs.get(k)).cloned().unwrap_or_default();
        let actual_attr = |k: &str| c.actual.as_ref().and_then(|a| a.attrs.get(k)).cloned().unwrap_or_default();
        let tags = desired.map(|d| d.tags.clone()).unwrap_or_default();
        let changed = |field: &str| match &c.action {
            Action::Create => true,
            Action::Update(f) => f.iter().any(|f| f.field == field),
            Action::Delete => false,
        };
        let tag_change = matches!(&c.action, Action::Update(f) if f.iter().any(|f| f.field.starts_with("tags[")));
        let split = |v: String| -> BTreeSet<String> { v.split(',').filter(|s| !s.is_empty()).map(str::to_string).collect() };
        match (c.kind, &c.action) {
            (Kind::IamRole, Action::Create | Action::Update(_)) => {
                let assume = canonical(&assume_role_policy(&model.policy_inputs.partition));
                if c.action == Action::Create {
                    self.iam
                        .create_role()
                        .role_name(name)
                        .assume_role_policy_document(&assume)
                        .description(format!("Keelson instance role of cluster {}", model.cluster))
                        .set_permissions_boundary(desired.and_then(|d| d.attrs.get("permissions_boundary")).cloned())
                        .set_tags(Some(iam_tags(&tags)))
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
                        match desired.and_then(|d| d.attrs.get("permissions_boundary")) {
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
                        self.iam.tag_role().role_name(name).set_tags(Some(iam_tags(&tags))).send().await.map_err(|e| api("TagRole", name, e))?;
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
                    let (want, have) = (split(attr("managed_policies")), split(actual_attr("managed_policies")));
                    for arn in want.difference(&have) {
                        self.iam.attach_role_policy().role_name(name).policy_arn(arn).send().await.map_err(|e| api("AttachRolePolicy", name, e))?;
                    }
                    for arn in have.difference(&want) {
                        self.iam.detach_role_policy().role_name(name).policy_arn(arn).send().await.map_err(|e| api("DetachRolePolicy", name, e))?;
                    }
                }
            }
            (Kind::IamRole, Action::Delete) => {
                for arn in split(actual_attr("managed_policies")) {
                    self.iam.detach_role_policy().role_name(name).policy_arn(arn).send().await.map_err(|e| api("DetachRolePolicy", name, e))?;
                }
                let inline = self.iam.list_role_policies().role_name(name).send().await.map_err(|e| api("ListRolePolicies", name, e))?;
                for p in inline.policy_names() {
                    self.iam.delete_role_policy().role_name(name).policy_name(p).send().await.map_err(|e| api("DeleteRolePolicy", name, e))?;
                }
                let profiles =
                    self.iam.list_instance_profiles_for_role().role_name(name).send().await.map_err(|e| api("ListInstanceProfilesForRole", name, e))?;
                for p in profiles.instance_profiles() {
                    self.iam
                        .remove_role_from_instance_profile()
                        .instance_profile_name(p.instance_profile_name())
                        .role_name(name)
                        .send()
                        .await
                        .map_err(|e| api("RemoveRoleFromInstanceProfile", name, e))?;
                }
                self.iam.delete_role().role_name(name).send().await.map_err(|e| api("DeleteRole", name, e))?;
            }
            (Kind::IamInstanceProfile, Action::Create) => {
                self.iam
                    .create_instance_profile()
                    .instance_profile_name(name)
                    .set_tags(Some(iam_tags(&tags)))
                    .send()
                    .await
                    .map_err(|e| api("CreateInstanceProfile", name, e))?;
                self.iam
                    .add_role_to_instance_profile()
                    .instance_profile_name(name)
                    .role_name(attr("role"))
                    .send()
                    .await
                    .map_err(|e| api("AddRoleToInstanceProfile", name, e))?;
            }
            (Kind::IamInstanceProfile, Action::Update(_)) => {
                if changed("role") {
                    let old = actual_attr("role");
                    if !old.is_empty() {
                        self.iam
                            .remove_role_from_instance_profile()
                            .instance_profile_name(name)
                            .role_name(old)
                            .send()
                            .await
                            .map_err(|e| api("RemoveRoleFromInstanceProfile", name, e))?;
                    }
                    self.iam
                        .add_role_to_instance_profile()
                        .instance_profile_name(name)
                        .role_name(attr("role"))
                        .send()
                        .await
                        .map_err(|e| api("AddRoleToInstanceProfile", name, e))?;
                }
                if tag_change {
                    self.iam
                        .tag_instance_profile()
                        .instance_profile_name(name)
                        .set_tags(Some(iam_tags(&tags)))
                        .send()
                        .await
                        .map_err(|e| api("TagInstanceProfile", name, e))?;
                }
            }
            (Kind::IamInstanceProfile, Action::Delete) => {
                let role = actual_attr("role");
                if !role.is_empty() {
                    self.iam
                        .remove_role_from_instance_profile()
                        .instance_profile_name(name)
                        .role_name(role)
                        .send()
                        .await
                        .map_err(|e| api("RemoveRoleFromInstanceProfile", name, e))?;
                }
                self.iam.delete_instance_profile().instance_profile_name(name).send().await.map_err(|e| api("DeleteInstanceProfile", name, e))?;
            }
            (kind, _) => {
                return Err(AwsError::Missing { kind: "IAM", name: name.into(), message: format!("{} is not an IAM resource", kind.as_str()) })
            }
        }
        Ok(())
    }
}
