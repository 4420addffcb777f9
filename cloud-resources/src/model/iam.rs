//! The IAM builder: one role (with its inline policy, managed policies and permissions boundary)
//! and the instance profile of the same name per instance-group role whose groups use the managed
//! profile.

use std::collections::BTreeSet;

use keelson_api::{InstanceGroup, Role};

use super::{Context, ModelError};
use crate::aws::{self, IamRole, InlinePolicy, InstanceProfile, Policy};
use crate::iam_policy::{assume_role_policy, InstanceRolePolicy, PolicyInputs};
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

pub fn build(cx: &Context<'_>, inputs: &PolicyInputs, tasks: &mut aws::Tasks) -> Result<(), ModelError> {
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
    Ok(())
}
