//! The GCE identity builder (kOps' `pkg/model/gcemodel/service_accounts.go`): a service account per
//! role whose groups the cluster has, named by [`keelson_api::names::gce_service_account_id`]; the
//! control plane's one project role (kOps reuses GKE's service agent role rather than a custom role,
//! whose deletion takes 7 days); and, with a `gs://` state store, what each role may do there:
//!
//! * control planes (and API servers): `roles/storage.objectAdmin` on the cluster's prefix (and on
//!   each `gs://` etcd backup store's), listing included;
//! * nodes: `roles/storage.objectViewer` on [`keelson_api::nodeup::NODE_READABLE_PREFIXES`] (and
//!   the bootstrap token in token mode), no listing, nothing else;
//! * bastions: nothing.
//!
//! `cloudConfig.gceServiceAccount` (kOps' legacy account shared by every role) is honoured for the
//! role that needs the cloud — the control plane — and nothing is granted to it (its owner gives it
//! its roles); nodes and bastions still run as their own accounts. Pure: no I/O.

use std::collections::BTreeMap;

use keelson_api::names::{gce_service_account_email, gce_service_account_id};
use keelson_api::Role;

use super::{Context, ModelError};
use crate::gce::identity::{condition_expression, member_of};
use crate::gce::{self, BucketIamMember, Condition, ProjectIamMember, ServiceAccount};
use crate::tasks::Link;

/// The project role of the control plane's account.
pub const CONTROL_PLANE_PROJECT_ROLE: &str = "roles/container.serviceAgent";
pub const OBJECT_ADMIN: &str = "roles/storage.objectAdmin";
pub const OBJECT_VIEWER: &str = "roles/storage.objectViewer";

/// The account a role's instances run as: its email, and the cluster's task when the cluster owns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleAccount {
    pub email: String,
    pub task: Option<Link<ServiceAccount>>,
}

/// The accounts of the roles the cluster's groups have.
pub fn accounts(cx: &Context<'_>) -> Result<BTreeMap<Role, RoleAccount>, ModelError> {
    let project = cx.spec.project.as_deref().filter(|p| !p.is_empty()).ok_or_else(|| cx.missing("spec.project"))?;
    let shared = cx.spec.cloud_config.as_ref().and_then(|c| c.gce_service_account.clone()).filter(|s| !s.is_empty());
    let mut out = BTreeMap::new();
    for role in cx.instance_groups.iter().filter_map(keelson_api::InstanceGroup::role) {
        let account = match (&shared, role) {
            (Some(email), Role::ControlPlane | Role::ApiServer) => RoleAccount { email: email.clone(), task: None },
            _ => {
                let id = gce_service_account_id(role, cx.cluster);
                RoleAccount { email: gce_service_account_email(&id, project), task: Some(Link::to(id)) }
            }
        };
        out.insert(role, account);
    }
    Ok(out)
}

fn description(role: Role) -> &'static str {
    match role {
        Role::ControlPlane | Role::ApiServer => "kubernetes control-plane instances",
        Role::Node => "kubernetes worker nodes",
        Role::Bastion => "bastion nodes",
    }
}

/// Build the accounts, the project role and the state store grants.
pub fn build_gce(cx: &Context<'_>, config_base: &str, bootstrap_token: bool, tasks: &mut gce::Tasks) -> Result<(), ModelError> {
    let project = cx.spec.project.clone().unwrap_or_default();
    let store = match config_base.parse::<base::ConfigBase>() {
        Ok(base::ConfigBase::Gcs { bucket, prefix }) => Some((bucket, prefix)),
        _ => None,
    };
    let mut backup_stores: Vec<(String, String)> = Vec::new();
    for s in cx.spec.etcd_clusters.iter().flatten().filter_map(|c| c.backups.as_ref()?.backup_store.clone()) {
        if let Ok(base::ConfigBase::Gcs { bucket, prefix }) = s.parse::<base::ConfigBase>() {
            // A backup store under the state store's prefix (the default) is granted with it.
            let under_state = store.as_ref().is_some_and(|(b, p)| *b == bucket && (p.is_empty() || prefix == *p || prefix.starts_with(&format!("{p}/"))));
            if !under_state && !backup_stores.contains(&(bucket.clone(), prefix.clone())) {
                backup_stores.push((bucket, prefix));
            }
        }
    }
    let mut done = std::collections::BTreeSet::new();
    for (role, account) in accounts(cx)? {
        let Some(link) = account.task.clone() else { continue };
        if !done.insert(link.name().to_string()) {
            continue;
        }
        tasks.push(ServiceAccount {
            name: link.name().to_string(),
            project: project.clone(),
            account_id: link.name().to_string(),
            email: account.email.clone(),
            display_name: link.name().to_string(),
            description: description(role).to_string(),
        });
        let member = member_of(&account.email);
        let mut bucket_grant = |bucket: &str, prefix: &str, role_name: &str, rels: &[&str], listing: bool, title: &str| {
            let expression = condition_expression(bucket, prefix, rels, listing);
            tasks.push(BucketIamMember {
                name: gce::identity::bucket_member_name(bucket, role_name, &member, Some(&expression)),
                bucket: bucket.to_string(),
                role: role_name.to_string(),
                email: account.email.clone(),
                account: link.clone(),
                condition: Some(Condition {
                    title: title.to_string(),
                    description: format!("keelson: {} of {} in gs://{bucket}/{prefix}", description(role), cx.cluster),
                    expression,
                }),
            });
        };
        match role {
            Role::ControlPlane | Role::ApiServer => {
                if let Some((bucket, prefix)) = &store {
                    bucket_grant(bucket, prefix, OBJECT_ADMIN, &[""], true, "keelson-control-plane-state");
                }
                for (bucket, prefix) in &backup_stores {
                    bucket_grant(bucket, prefix, OBJECT_ADMIN, &[""], true, "keelson-control-plane-backups");
                }
                tasks.push(ProjectIamMember {
                    name: format!("{CONTROL_PLANE_PROJECT_ROLE} {member}"),
                    project: project.clone(),
                    role: CONTROL_PLANE_PROJECT_ROLE.to_string(),
                    email: account.email.clone(),
                    account: link.clone(),
                });
            }
            Role::Node => {
                if let Some((bucket, prefix)) = &store {
                    let token = format!("secrets/{}", base::pki::BOOTSTRAP_TOKEN_SECRET);
                    let mut rels: Vec<&str> = keelson_api::nodeup::NODE_READABLE_PREFIXES.to_vec();
                    if bootstrap_token {
                        rels.push(&token);
                    }
                    bucket_grant(bucket, prefix, OBJECT_VIEWER, &rels, false, "keelson-node-config");
                }
            }
            Role::Bastion => {}
        }
    }
    Ok(())
}
