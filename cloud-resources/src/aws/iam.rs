//! IAM roles (assume-role policy, inline policy, managed policies, permissions boundary) and the
//! instance profiles of the same name that launch templates reference.
//!
//! IAM has no tag filter on listings, so resources are looked up by their (deterministic) names;
//! delete only touches the ones tagged `KubernetesCluster=<cluster>`.

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_iam::types as iam_t;
use serde_json::Value;

use serde_json::json;

use super::task::{AwsFuture, AwsTask, Exec, Typed};
use super::terraform::{tags_value, AwsTerraform};
use super::{api, AwsError, AwsTarget, Discovered, Resolved};
use crate::iam_policy::{policy, InstanceRolePolicy, PolicyInputs};
use crate::model::ClusterModel;
use crate::plan::{Action, Change, Kind};
use crate::tasks::{joined, Fields, Link, Linked};
use base::sha256_hex;

/// A policy document in one canonical form (keys sorted, no whitespace), so equal documents compare equal.
fn canonical(v: &Value) -> String {
    // A Value cannot fail to serialise: its Display is the compact JSON.
    v.to_string()
}

/// IAM returns policy documents URL-encoded.
fn decode_document(doc: &str) -> Option<Value> {
    let text = percent_encoding::percent_decode_str(doc).decode_utf8().ok()?;
    serde_json::from_str(&text).ok()
}

pub(super) fn iam_tags(tags: &BTreeMap<String, String>) -> Vec<iam_t::Tag> {
    tags.iter().filter_map(|(k, v)| iam_t::Tag::builder().key(k).value(v).build().ok()).collect()
}

pub(super) fn tags_of(tags: &[iam_t::Tag]) -> BTreeMap<String, String> {
    tags.iter().map(|t| (t.key().to_string(), t.value().to_string())).collect()
}

/// Who may assume a service account's role (IRSA): the tokens of one service account (a `*` in the
/// namespace matches many), through the issuer's IAM OIDC provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceAccountTrust {
    pub partition: String,
    /// The issuer's host and path (the provider's key, and the condition keys' prefix).
    pub provider: String,
    /// The provider task's name when this cluster manages the provider (Terraform links to it).
    pub provider_task: Option<String>,
    pub namespace: String,
    pub name: String,
}

impl ServiceAccountTrust {
    /// The provider's ARN in `account`.
    pub fn provider_arn(&self, account: &str) -> String {
        format!("arn:{}:iam::{account}:oidc-provider/{}", self.partition, self.provider)
    }
    /// The trust policy naming the provider by `provider_arn`.
    pub fn document(&self, provider_arn: &str) -> Value {
        crate::iam_policy::service_account_trust_policy(provider_arn, &self.provider, &self.namespace, &self.name)
    }
}

/// A policy document as wanted, or as found (its hash).
#[derive(Debug, Clone, PartialEq)]
pub enum Policy {
    Document(Value),
    /// A service account's trust, in the account the target resolves.
    ServiceAccount {
        trust: ServiceAccountTrust,
        account: Option<String>,
    },
    /// sha256 of the canonical document; empty when there is none.
    Sha256(String),
}

impl Policy {
    /// The document, once everything in it is known.
    pub fn document(&self) -> Option<Value> {
        match self {
            Policy::Document(d) => Some(d.clone()),
            Policy::ServiceAccount { trust, account: Some(account) } => Some(trust.document(&trust.provider_arn(account))),
            Policy::ServiceAccount { account: None, .. } | Policy::Sha256(_) => None,
        }
    }
    pub fn sha256(&self) -> String {
        match self {
            Policy::Sha256(s) => s.clone(),
            _ => self.document().map(|d| sha256_hex(canonical(&d).as_bytes())).unwrap_or_default(),
        }
    }
}

/// A role's inline policy: generated (for the hosted zone the target resolves), or found.
#[derive(Debug, Clone, PartialEq)]
pub enum InlinePolicy {
    Generated {
        role: InstanceRolePolicy,
        inputs: Box<PolicyInputs>,
        /// The hosted zone protokube writes to, once the target has resolved it.
        zone: Option<String>,
    },
    /// The statements of one of Keelson's addons on a role of its own
    /// ([`crate::iam_policy::addon_policy`]).
    Addon {
        addon: keelson_api::addon_roles::AddonPermissions,
        inputs: Box<PolicyInputs>,
        /// The cluster's hosted zone, once the target has resolved it (external-dns writes there).
        zone: Option<String>,
    },
    /// A document the spec gives (a service account's `aws.inlinePolicy`).
    Given(Value),
    /// sha256 of the canonical document; empty when the role has none.
    Found(String),
}

impl InlinePolicy {
    /// The document for `zone` (`None` when the role gets no inline policy or it was found).
    fn document(&self, zone: Option<&str>) -> Option<Value> {
        match self {
            InlinePolicy::Generated { role, inputs, .. } => policy(role, inputs, zone),
            InlinePolicy::Addon { addon, inputs, .. } => crate::iam_policy::addon_policy(*addon, inputs, zone),
            InlinePolicy::Given(doc) => Some(doc.clone()),
            InlinePolicy::Found(_) => None,
        }
    }
    /// The document for the resolved zone: what the direct target puts.
    pub fn resolved(&self) -> Option<Value> {
        match self {
            InlinePolicy::Generated { zone, .. } | InlinePolicy::Addon { zone, .. } => self.document(zone.as_deref()),
            InlinePolicy::Given(doc) => Some(doc.clone()),
            InlinePolicy::Found(_) => None,
        }
    }
    fn sha256(&self) -> String {
        match self {
            InlinePolicy::Found(s) => s.clone(),
            InlinePolicy::Generated { .. } | InlinePolicy::Addon { .. } | InlinePolicy::Given(_) => {
                self.resolved().map(|d| sha256_hex(canonical(&d).as_bytes())).unwrap_or_default()
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct IamRole {
    pub name: String,
    pub assume_role: Policy,
    pub policy: InlinePolicy,
    pub managed_policies: BTreeSet<String>,
    pub permissions_boundary: Option<String>,
    pub tags: BTreeMap<String, String>,
}

/// Policy documents hold no floating-point numbers: equality is an equivalence.
impl Eq for IamRole {}

impl Linked for IamRole {
    const TF_TYPE: &'static str = "aws_iam_role";
    const TF_ATTR: &'static str = "name";
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceProfile {
    pub name: String,
    /// The role in it (`None` when it holds none).
    pub role: Option<Link<IamRole>>,
    pub tags: BTreeMap<String, String>,
}

impl Linked for InstanceProfile {
    const TF_TYPE: &'static str = "aws_iam_instance_profile";
    const TF_ATTR: &'static str = "id";
}

impl AwsTask for IamRole {
    fn kind(&self) -> Kind {
        Kind::IamRole
    }
    fn name(&self) -> String {
        self.name.clone()
    }
    fn tags(&self) -> BTreeMap<String, String> {
        self.tags.clone()
    }
    fn fields(&self, f: &mut Fields) {
        f.set("assume_role.sha256", self.assume_role.sha256()).set("policy.sha256", self.policy.sha256());
        if !self.managed_policies.is_empty() {
            f.set("managed_policies", joined(&self.managed_policies));
        }
        f.opt("permissions_boundary", self.permissions_boundary.as_ref());
    }
    fn resolve(&mut self, resolved: &Resolved) -> bool {
        if let InlinePolicy::Generated { zone, .. } | InlinePolicy::Addon { zone, .. } = &mut self.policy {
            zone.clone_from(&resolved.zone);
        }
        if let Policy::ServiceAccount { account, .. } = &mut self.assume_role {
            account.clone_from(&resolved.account);
        }
        true
    }
    fn find<'a>(t: &'a AwsTarget, model: &'a ClusterModel, _resolved: &'a Resolved, d: &'a mut Discovered) -> AwsFuture<'a> {
        Box::pin(discover(t, model, d))
    }
    fn render_terraform(&self, t: &mut AwsTerraform) {
        let assume = match &self.assume_role {
            Policy::Document(d) => canonical(d),
            // The provider by its ARN: a link when this cluster manages it, else in the caller's account.
            Policy::ServiceAccount { trust, .. } => {
                let arn = match &trust.provider_task {
                    Some(task) => crate::tasks::Link::<super::OidcProvider>::to(task.clone()).tf(),
                    None => {
                        let me = t.blocks.data_once("aws_caller_identity", "current", "", || json!({}));
                        trust.provider_arn(&crate::terraform_json::r(&me, "account_id"))
                    }
                };
                canonical(&trust.document(&arn))
            }
            Policy::Sha256(_) => String::new(),
        };
        let mut body = json!({"name": self.name, "assume_role_policy": assume, "tags": tags_value(&self.tags)});
        if let Some(boundary) = &self.permissions_boundary {
            body["permissions_boundary"] = json!(boundary);
        }
        t.blocks.add("aws_iam_role", &self.name, body);
        let role = Link::<IamRole>::to(self.name.clone()).tf();
        if let Some(doc) = self.policy.document(t.zone_id().as_deref()) {
            t.blocks.add("aws_iam_role_policy", &self.name, json!({"name": self.name, "role": role, "policy": canonical(&doc)}));
        }
        for (i, arn) in self.managed_policies.iter().enumerate() {
            t.blocks.add("aws_iam_role_policy_attachment", &format!("{}-{i}", self.name), json!({"role": role, "policy_arn": arn}));
        }
    }
    fn render_aws<'a>(&'a self, cx: Exec<'a>, c: &'a Change) -> AwsFuture<'a> {
        Box::pin(async move {
            let c = Typed::<IamRole>::of(c);
            let (t, name) = (cx.target, c.name);
            match c.action {
                Action::Create | Action::Update(_) => {
                    let create = *c.action == Action::Create;
                    let changed = |field: &str| create || c.changed(field);
                    let want = c.want()?;
                    let assume = want.assume_role.document().map(|d| canonical(&d)).ok_or_else(|| AwsError::Missing {
                        kind: "IAMRole",
                        name: name.into(),
                        message: "no assume-role policy (or its account unresolved)".into(),
                    })?;
                    let description = match &want.assume_role {
                        Policy::ServiceAccount { trust, .. } => {
                            format!("Keelson role of service account {}/{} of cluster {}", trust.namespace, trust.name, cx.model.cluster)
                        }
                        _ => format!("Keelson instance role of cluster {}", cx.model.cluster),
                    };
                    if create {
                        t.iam
                            .create_role()
                            .role_name(name)
                            .assume_role_policy_document(&assume)
                            .description(description)
                            .set_permissions_boundary(want.permissions_boundary.clone())
                            .set_tags(Some(iam_tags(&want.tags)))
                            .send()
                            .await
                            .map_err(|e| api("CreateRole", name, e))?;
                    } else {
                        if changed("assume_role.sha256") {
                            t.iam
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
                                    t.iam
                                        .put_role_permissions_boundary()
                                        .role_name(name)
                                        .permissions_boundary(b)
                                        .send()
                                        .await
                                        .map_err(|e| api("PutRolePermissionsBoundary", name, e))?;
                                }
                                None => {
                                    t.iam
                                        .delete_role_permissions_boundary()
                                        .role_name(name)
                                        .send()
                                        .await
                                        .map_err(|e| api("DeleteRolePermissionsBoundary", name, e))?;
                                }
                            }
                        }
                        if c.tags_changed() {
                            t.iam.tag_role().role_name(name).set_tags(Some(iam_tags(&want.tags))).send().await.map_err(|e| api("TagRole", name, e))?;
                        }
                    }
                    if changed("policy.sha256") {
                        match want.policy.resolved() {
                            Some(doc) => {
                                t.iam
                                    .put_role_policy()
                                    .role_name(name)
                                    .policy_name(name)
                                    .policy_document(canonical(&doc))
                                    .send()
                                    .await
                                    .map_err(|e| api("PutRolePolicy", name, e))?;
                            }
                            None if !create => {
                                t.iam.delete_role_policy().role_name(name).policy_name(name).send().await.map_err(|e| api("DeleteRolePolicy", name, e))?;
                            }
                            None => {}
                        }
                    }
                    if changed("managed_policies") {
                        let have = c.have_opt()?.map(|h| h.managed_policies.clone()).unwrap_or_default();
                        for arn in want.managed_policies.difference(&have) {
                            t.iam.attach_role_policy().role_name(name).policy_arn(arn).send().await.map_err(|e| api("AttachRolePolicy", name, e))?;
                        }
                        for arn in have.difference(&want.managed_policies) {
                            t.iam.detach_role_policy().role_name(name).policy_arn(arn).send().await.map_err(|e| api("DetachRolePolicy", name, e))?;
                        }
                    }
                }
                Action::Delete => {
                    for arn in &c.have()?.managed_policies {
                        t.iam.detach_role_policy().role_name(name).policy_arn(arn).send().await.map_err(|e| api("DetachRolePolicy", name, e))?;
                    }
                    let inline = t.iam.list_role_policies().role_name(name).send().await.map_err(|e| api("ListRolePolicies", name, e))?;
                    for p in inline.policy_names() {
                        t.iam.delete_role_policy().role_name(name).policy_name(p).send().await.map_err(|e| api("DeleteRolePolicy", name, e))?;
                    }
                    let profiles =
                        t.iam.list_instance_profiles_for_role().role_name(name).send().await.map_err(|e| api("ListInstanceProfilesForRole", name, e))?;
                    for p in profiles.instance_profiles() {
                        t.remove_role_from_profile(p.instance_profile_name(), name).await?;
                    }
                    t.iam.delete_role().role_name(name).send().await.map_err(|e| api("DeleteRole", name, e))?;
                }
            }
            Ok(())
        })
    }
}

impl AwsTask for InstanceProfile {
    fn kind(&self) -> Kind {
        Kind::IamInstanceProfile
    }
    fn name(&self) -> String {
        self.name.clone()
    }
    fn tags(&self) -> BTreeMap<String, String> {
        self.tags.clone()
    }
    fn fields(&self, f: &mut Fields) {
        f.set("role", self.role.as_ref().map(|r| r.name()).unwrap_or_default());
    }
    fn find<'a>(_t: &'a AwsTarget, _model: &'a ClusterModel, _resolved: &'a Resolved, _d: &'a mut Discovered) -> AwsFuture<'a> {
        // Found with its role.
        super::task::found_with_another()
    }
    fn render_terraform(&self, t: &mut AwsTerraform) {
        t.blocks.add(
            "aws_iam_instance_profile",
            &self.name,
            json!({"name": self.name, "role": self.role.as_ref().map(|r| r.tf()), "tags": tags_value(&self.tags)}),
        );
    }
    fn render_aws<'a>(&'a self, cx: Exec<'a>, c: &'a Change) -> AwsFuture<'a> {
        Box::pin(async move {
            let c = Typed::<InstanceProfile>::of(c);
            let (t, name) = (cx.target, c.name);
            match c.action {
                Action::Create => {
                    let want = c.want()?;
                    let role = want.role.as_ref().ok_or_else(|| AwsError::Missing {
                        kind: "IAMInstanceProfile",
                        name: name.into(),
                        message: "no role to put in it".into(),
                    })?;
                    t.iam
                        .create_instance_profile()
                        .instance_profile_name(name)
                        .set_tags(Some(iam_tags(&want.tags)))
                        .send()
                        .await
                        .map_err(|e| api("CreateInstanceProfile", name, e))?;
                    t.add_role_to_profile(name, role).await?;
                }
                Action::Update(_) => {
                    let want = c.want()?;
                    let have = c.have()?;
                    if c.changed("role") {
                        if let Some(old) = &have.role {
                            t.remove_role_from_profile(name, old).await?;
                        }
                        if let Some(role) = &want.role {
                            t.add_role_to_profile(name, role).await?;
                        }
                    }
                    if c.tags_changed() {
                        t.iam
                            .tag_instance_profile()
                            .instance_profile_name(name)
                            .set_tags(Some(iam_tags(&want.tags)))
                            .send()
                            .await
                            .map_err(|e| api("TagInstanceProfile", name, e))?;
                    }
                }
                Action::Delete => {
                    if let Some(role) = &c.have()?.role {
                        t.remove_role_from_profile(name, role).await?;
                    }
                    t.iam.delete_instance_profile().instance_profile_name(name).send().await.map_err(|e| api("DeleteInstanceProfile", name, e))?;
                }
            }
            Ok(())
        })
    }
}

fn not_found<E: aws_sdk_iam::error::ProvideErrorMetadata>(e: &aws_sdk_iam::error::SdkError<E>) -> bool {
    e.as_service_error().and_then(|s| s.code()) == Some("NoSuchEntity")
}

/// The roles and profiles of the model's names that are tagged for this cluster (apply never
/// adopts, and delete never touches, someone else's role of the same name).
async fn discover(t: &AwsTarget, model: &ClusterModel, d: &mut Discovered) -> Result<(), AwsError> {
    // The model's roles, and every service-account role of this cluster that exists (one the spec
    // no longer lists is found here, so apply and delete remove it).
    let mut names: BTreeMap<String, bool> =
        model.tasks.iam_roles.iter().map(|r| (r.name.clone(), matches!(r.assume_role, Policy::ServiceAccount { .. }))).collect();
    let roles = t.iam.list_roles().into_paginator().items().send().try_collect().await.map_err(|e| api("ListRoles", &model.cluster, e))?;
    for r in &roles {
        if is_service_account_role_of(r.role_name(), &model.cluster) {
            names.entry(r.role_name().to_string()).or_insert(true);
        }
    }
    for (name, service_account) in &names {
        let (name, service_account) = (name.as_str(), *service_account);
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
                        assume_role: Policy::Sha256(assume.unwrap_or_default()),
                        policy: InlinePolicy::Found(inline),
                        managed_policies: managed,
                        permissions_boundary: r.permissions_boundary().and_then(|b| b.permissions_boundary_arn()).map(str::to_string),
                        tags,
                    };
                    d.found(task, r.arn().to_string());
                }
            }
            Err(e) if not_found(&e) => {}
            Err(e) => return Err(api("GetRole", name, e)),
        }
        if service_account {
            continue;
        }
        match t.iam.get_instance_profile().instance_profile_name(name).send().await {
            Ok(resp) => {
                let Some(p) = resp.instance_profile() else { continue };
                let tags = tags_of(p.tags());
                if ours(&tags) {
                    let profile = InstanceProfile { name: name.to_string(), role: p.roles().first().map(|r| Link::to(r.role_name())), tags };
                    d.found(profile, p.arn().to_string());
                }
            }
            Err(e) if not_found(&e) => {}
            Err(e) => return Err(api("GetInstanceProfile", name, e)),
        }
    }
    Ok(())
}

/// A name [`keelson_api::names::service_account_role_name`] may have given a role of `cluster`:
/// `….sa.<cluster>`, or cut to 64 characters with its hash (the cluster tag decides).
fn is_service_account_role_of(name: &str, cluster: &str) -> bool {
    name.contains(".sa.") && (name.ends_with(&format!(".sa.{cluster}")) || name.len() == 64)
}

impl AwsTarget {
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
