//! The IAM builder: one role (with its inline policy, managed policies and permissions boundary)
//! and the instance profile of the same name per instance-group role whose groups use the managed
//! profile; for IRSA the issuer's IAM OIDC provider (`enableAWSOIDCProvider`) and a role per
//! service account of `iam.serviceAccountExternalPermissions` and of each of Keelson's addons the
//! compiler put on a role of its own (`useServiceAccountExternalPermissions`; kOps `awsmodel/iam.go`,
//! `oidc_provider.go`, the addons' `iam.Subject`s).

use std::collections::BTreeSet;

use keelson_api::{InstanceGroup, Role};

use super::{Context, ModelError};
use crate::aws::{self, IamRole, InlinePolicy, InstanceProfile, OidcProvider, Policy, ServiceAccountTrust};
use crate::iam_policy::{assume_role_policy, policy_of_statements, InstanceRolePolicy, PolicyInputs};
use crate::tasks::Link;

/// The roles whose groups use the managed profile, once each, sorted.
fn roles(cx: &Context<'_>) -> Vec<Role> {
    let mut roles: Vec<Role> =
        cx.instance_groups.iter().filter(|g| g.spec.iam.as_ref().and_then(|i| i.profile.as_ref()).is_none()).filter_map(InstanceGroup::role).collect();
    roles.sort();
    roles.dedup();
    roles
}

/// The instance profiles [`build`] makes (a launch template links to others by name).
pub fn role_names(cx: &Context<'_>) -> BTreeSet<String> {
    roles(cx).into_iter().map(|r| keelson_api::names::iam_role_name(r, cx.cluster)).collect()
}

/// A link to an instance profile: ours, or one the spec names.
pub fn profile_link(ours: &BTreeSet<String>, name: &str) -> Link<InstanceProfile> {
    if ours.contains(name) {
        Link::to(name)
    } else {
        Link::existing(name, name)
    }
}

pub fn build(
    cx: &Context<'_>,
    inputs: &PolicyInputs,
    addon_accounts: &[keelson_api::addon_roles::AddonServiceAccount],
    tasks: &mut aws::Tasks,
) -> Result<(), ModelError> {
    let key = |r: Role| match r {
        Role::ControlPlane => ["control-plane", "master"],
        Role::Node => ["node", "node"],
        Role::ApiServer => ["apiserver", "apiserver"],
        Role::Bastion => ["bastion", "bastion"],
    };
    let spec = cx.spec;
    for role in roles(cx) {
        let name = keelson_api::names::iam_role_name(role, cx.cluster);
        let tags = cx.tags(&name);
        let mut additional_statements = Vec::new();
        for k in key(role) {
            if let Some(text) = spec.additional_policies.as_ref().and_then(|m| m.get(k)) {
                let parsed: Vec<serde_json::Value> = serde_json::from_str(text).map_err(|e| ModelError::Field {
                    cluster: cx.cluster.to_string(),
                    field: format!("spec.additionalPolicies.{k}"),
                    message: format!("expected a JSON list of IAM policy statements: {e}"),
                })?;
                additional_statements.extend(parsed);
            }
        }
        let managed_policies: BTreeSet<String> =
            key(role).iter().filter_map(|k| spec.external_policies.as_ref().and_then(|m| m.get(*k))).flatten().cloned().collect();
        tasks.push(IamRole {
            name: name.clone(),
            assume_role: Policy::Document(assume_role_policy(&inputs.partition)),
            policy: InlinePolicy::Generated { role: InstanceRolePolicy { role, additional_statements }, inputs: Box::new(inputs.clone()), zone: None },
            managed_policies,
            permissions_boundary: spec.iam.as_ref().and_then(|i| i.permissions_boundary.clone()),
            tags: tags.clone(),
        });
        tasks.push(InstanceProfile { name: name.clone(), role: Some(Link::to(name)), tags });
    }
    service_accounts(cx, inputs, addon_accounts, tasks)
}

/// The issuer's OIDC provider and the service accounts' roles.
fn service_accounts(
    cx: &Context<'_>,
    inputs: &PolicyInputs,
    addon_accounts: &[keelson_api::addon_roles::AddonServiceAccount],
    tasks: &mut aws::Tasks,
) -> Result<(), ModelError> {
    let spec = cx.spec;
    let field = |field: String, message: String| ModelError::Field { cluster: cx.cluster.to_string(), field, message };
    let discovery = spec.service_account_issuer_discovery.as_ref();
    let perms = spec.iam.as_ref().and_then(|i| i.service_account_external_permissions.as_deref()).unwrap_or_default();
    let provider_wanted = discovery.and_then(|d| d.enable_awsoidc_provider).unwrap_or(false);
    if perms.is_empty() && !provider_wanted && addon_accounts.is_empty() {
        return Ok(());
    }
    let issuer =
        spec.kube_api_server.as_ref().and_then(|a| a.service_account_issuer.clone()).ok_or_else(|| cx.missing("spec.kubeAPIServer.serviceAccountIssuer"))?;
    if !issuer.starts_with("https://") {
        return Err(field("spec.kubeAPIServer.serviceAccountIssuer".into(), format!("{issuer:?}: IAM trusts an OIDC issuer at an https:// URL only")));
    }
    let provider = OidcProvider::host_path(&issuer).to_string();
    let provider_task = provider_wanted.then(|| cx.cluster.to_string());
    if let Some(name) = &provider_task {
        let mut client_ids: std::collections::BTreeSet<String> = [aws::DEFAULT_AUDIENCE.to_string()].into();
        client_ids.extend(discovery.and_then(|d| d.additional_audiences.clone()).unwrap_or_default());
        tasks.push(OidcProvider {
            name: name.clone(),
            url: issuer.clone(),
            client_ids,
            thumbprints: aws::S3_ROOT_THUMBPRINTS.iter().map(|s| s.to_string()).collect(),
            tags: cx.tags(name),
        });
    }
    let trust = |namespace: &str, name: &str| Policy::ServiceAccount {
        trust: ServiceAccountTrust {
            partition: inputs.partition.clone(),
            provider: provider.clone(),
            provider_task: provider_task.clone(),
            namespace: namespace.to_string(),
            name: name.to_string(),
        },
        account: None,
    };
    let role_tags = |name: &str, namespace: &str, sa: &str| {
        let mut tags = cx.tags(name);
        // kOps' tags of a service account's role.
        tags.insert("service-account.kops.k8s.io/name".into(), sa.to_string());
        tags.insert("service-account.kops.k8s.io/namespace".into(), namespace.replace('*', "wildcard"));
        tags
    };
    for a in addon_accounts {
        let name = keelson_api::names::service_account_role_name(&a.name, &a.namespace, cx.cluster);
        tasks.push(IamRole {
            name: name.clone(),
            assume_role: trust(&a.namespace, &a.name),
            policy: InlinePolicy::Addon { addon: a.permissions, inputs: Box::new(inputs.clone()), zone: None },
            managed_policies: Default::default(),
            permissions_boundary: spec.iam.as_ref().and_then(|i| i.permissions_boundary.clone()),
            tags: role_tags(&name, &a.namespace, &a.name),
        });
    }
    for p in perms {
        let (ns, sa) = (p.namespace.as_deref().unwrap_or(""), p.name.as_deref().unwrap_or(""));
        let path = format!("spec.iam.serviceAccountExternalPermissions[{ns}/{sa}]");
        if ns.is_empty() || sa.is_empty() || sa.contains('*') {
            return Err(field(path, "needs a namespace and a name without a wildcard".into()));
        }
        let aws = p.aws.as_ref().ok_or_else(|| field(format!("{path}.aws"), "required: policyARNs or inlinePolicy".into()))?;
        let policy = match aws.inline_policy.as_deref() {
            Some(text) => {
                let statements: Vec<serde_json::Value> = serde_json::from_str(text)
                    .map_err(|e| field(format!("{path}.aws.inlinePolicy"), format!("expected a JSON list of IAM policy statements: {e}")))?;
                InlinePolicy::Given(policy_of_statements(statements))
            }
            None => InlinePolicy::Found(String::new()),
        };
        let name = keelson_api::names::service_account_role_name(sa, ns, cx.cluster);
        tasks.push(IamRole {
            name: name.clone(),
            assume_role: trust(ns, sa),
            policy,
            managed_policies: aws.policy_arns.iter().flatten().cloned().collect(),
            permissions_boundary: spec.iam.as_ref().and_then(|i| i.permissions_boundary.clone()),
            tags: role_tags(&name, ns, sa),
        });
    }
    Ok(())
}
