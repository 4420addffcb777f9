//! The direct GCE target: what exists of a cluster on Compute (found by name, network and label,
//! read as typed tasks in their plan views), and a plan executed through the Compute API in the
//! plan's order (creates and updates in dependency order, deletes reversed), every operation
//! waited for within a bound ([`cloud::gce::Compute`]).
//!
//! What is the cluster's: its network (by name) and every subnetwork on it (or, on a network the
//! spec names, the subnetworks the model names); firewall rules on that network named
//! `…-<cluster>`; instance templates whose metadata `cluster-name` is the cluster and whose label
//! `k8s-io-cluster-name` its safe name; MIGs in the region's zones that run one of those templates
//! (or that the model names); disks labelled `k8s-io-cluster-name` = the safe name and
//! `k8s-io-etcd-*` (the etcd members'). Nothing else is read, changed or deleted.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use base::StateStore;
use cloud::calls::CallCounter;
use cloud::gce::compute::name_of_link;
use cloud::gce::iam::{self as gce_iam, Iam};
use cloud::gce::{Compute, ComputeError, GceEndpoints, GoogleApi, GoogleApiError, TokenSource};
use serde_json::Value;

use super::views::{self, Names};
use super::{gce_name, safe_cluster_name, Exec, Task};
use crate::model::ClusterModel;
use crate::plan::{Action, Change, Kind, Plan, Resource, Rolling};
use crate::state::{self, StateError};

#[derive(Debug, thiserror::Error)]
pub enum GceError {
    #[error(transparent)]
    Compute(Box<ComputeError>),
    #[error("the Compute API client: {0}")]
    Client(Box<GoogleApiError>),
    #[error("state store: {0}")]
    Store(#[from] StateError),
    #[error("{kind} {name}: {message}")]
    Resource { kind: &'static str, name: String, message: String },
    #[error("spec.project: required for the direct target on GCE")]
    NoProject,
}

impl From<ComputeError> for GceError {
    fn from(e: ComputeError) -> Self {
        GceError::Compute(Box::new(e))
    }
}

impl From<GoogleApiError> for GceError {
    fn from(e: GoogleApiError) -> Self {
        GceError::Client(Box::new(e))
    }
}

/// The Compute API of the cluster's project.
#[derive(Debug, Clone)]
pub struct GceTarget {
    pub compute: Compute,
    /// Service accounts, the project's and the state store bucket's IAM policies.
    pub iam: Iam,
    pub counter: CallCounter,
    /// Deletes of a resource still used by another (a disk its instance is leaving) are retried
    /// this many times, this far apart.
    pub dependency_retries: u32,
    pub dependency_delay: Duration,
}

/// What exists of the cluster.
#[derive(Debug, Clone, Default)]
pub struct GceDiscovered {
    pub resources: Vec<Resource>,
    /// The region's zones.
    pub zones: Vec<String>,
}

impl GceTarget {
    /// `endpoints`: Google's or an emulator's; `storage`: Cloud Storage's base URL (bucket
    /// policies); tokens from the metadata server `tokens` reads; `op_bound`: the longest one
    /// operation is waited for.
    pub fn new(endpoints: &GceEndpoints, storage: &str, project: &str, tokens: TokenSource, op_bound: Duration) -> Result<GceTarget, GceError> {
        let counter = CallCounter::default();
        let api = GoogleApi::new(tokens, Duration::from_secs(60))?.with_counter(counter.clone());
        Ok(GceTarget {
            iam: Iam::new(api.clone(), endpoints, storage, project),
            compute: Compute::new(api, &endpoints.compute, project, op_bound),
            counter,
            dependency_retries: 60,
            dependency_delay: Duration::from_secs(5),
        })
    }

    /// The GCE names of the model's tasks.
    pub fn names(&self, model: &ClusterModel) -> Names {
        Names::of(&model.gce, self.compute.project(), &model.region)
    }

    /// Everything of the cluster that exists, as typed tasks in their plan views (reads only).
    pub async fn discover(&self, model: &ClusterModel, names: &Names) -> Result<GceDiscovered, GceError> {
        let c = &self.compute;
        let mut d = GceDiscovered { zones: c.zones_of_region(&model.region).await?, ..Default::default() };
        let cluster_suffix = format!("-{}", gce_name(&model.cluster));
        let ours: BTreeSet<String> = model.gce.networks.iter().map(|n| n.gce_name.clone()).collect();
        // The network the cluster's tasks use (ours, or the spec's).
        let used: BTreeSet<String> = model
            .gce
            .subnetworks
            .iter()
            .map(|s| names.network(&s.network))
            .chain(model.gce.firewalls.iter().map(|f| names.network(&f.network)))
            .chain(ours.iter().cloned())
            .collect();
        for n in c.networks().await? {
            if ours.contains(views::from_network(&n).gce_name.as_str()) {
                self.found(&mut d, views::from_network(&n), c.global_link("networks", name_of(&n)), names);
            }
        }
        let wanted_subnets: BTreeSet<String> = model.gce.subnetworks.iter().map(|s| s.gce_name.clone()).collect();
        for s in c.subnetworks(&model.region).await? {
            let on = name_of_link(s["network"].as_str().unwrap_or_default()).to_string();
            if ours.contains(&on) || (used.contains(&on) && wanted_subnets.contains(name_of(&s))) {
                self.found(&mut d, views::from_subnetwork(&s), c.region_link(&model.region, "subnetworks", name_of(&s)), names);
            }
        }
        for f in c.firewalls().await? {
            let on = name_of_link(f["network"].as_str().unwrap_or_default()).to_string();
            if used.contains(&on) && name_of(&f).ends_with(&cluster_suffix) {
                self.found(&mut d, views::from_firewall(&f), c.global_link("firewalls", name_of(&f)), names);
            }
        }
        self.discover_identities(model, &mut d, names).await?;
        let safe = safe_cluster_name(&model.cluster);
        let mut templates = BTreeSet::new();
        for t in c.instance_templates().await? {
            let typed = views::from_template(&t);
            if typed.cluster == model.cluster && typed.labels.get(cloud::gce::labels::CLUSTER_LABEL) == Some(&safe) {
                templates.insert(typed.name.clone());
                self.found(&mut d, typed, c.global_link("instanceTemplates", name_of(&t)), names);
            }
        }
        let wanted_migs: BTreeSet<String> = model.gce.instance_group_managers.iter().map(|m| m.gce_name.clone()).collect();
        let filter = format!("(labels.{} = \"{safe}\")", cloud::gce::labels::CLUSTER_LABEL);
        for zone in d.zones.clone() {
            for m in c.instance_group_managers(&zone).await? {
                let typed = views::from_mig(&m);
                if templates.contains(typed.template.name()) || wanted_migs.contains(&typed.gce_name) {
                    self.found(&mut d, typed, c.zone_link(&zone, "instanceGroupManagers", name_of(&m)), names);
                }
            }
            for disk in c.disks(&zone, &filter).await? {
                let typed = views::from_disk(&disk);
                // The filter, checked again on our side; and only etcd members' disks.
                if typed.labels.get(cloud::gce::labels::CLUSTER_LABEL) == Some(&safe)
                    && typed.labels.keys().any(|k| k.starts_with(cloud::gce::labels::ETCD_LABEL_PREFIX))
                {
                    self.found(&mut d, typed, c.zone_link(&zone, "disks", name_of(&disk)), names);
                }
            }
        }
        Ok(d)
    }

    /// The cluster's service accounts (the model's, and any role's account of this cluster that
    /// exists), and the grants those accounts hold on the project and on the buckets the model
    /// grants on (the state store's).
    async fn discover_identities(&self, model: &ClusterModel, d: &mut GceDiscovered, names: &Names) -> Result<(), GceError> {
        let project = self.compute.project().to_string();
        let role_ids: BTreeSet<String> = [keelson_api::Role::ControlPlane, keelson_api::Role::Node, keelson_api::Role::Bastion]
            .into_iter()
            .map(|r| keelson_api::names::gce_service_account_id(r, &model.cluster))
            .collect();
        let mut ours: BTreeSet<String> = BTreeSet::new();
        for a in self.iam.service_accounts().await? {
            let email = a["email"].as_str().unwrap_or_default().to_string();
            let id = email.split('@').next().unwrap_or_default().to_string();
            let wanted = model.gce.service_accounts.iter().any(|s| s.email == email);
            if wanted || (role_ids.contains(&id) && email == keelson_api::names::gce_service_account_email(&id, &project)) {
                ours.insert(email.clone());
                let typed = views::from_service_account(&a, &project);
                self.found(d, typed, format!("projects/{project}/serviceAccounts/{email}"), names);
            }
        }
        let member_of = |m: &str| m.strip_prefix("serviceAccount:").filter(|e| ours.contains(*e)).map(str::to_string);
        let policy = self.iam.project_policy().await?;
        for b in gce_iam::bindings(&policy) {
            for email in b.members.iter().filter_map(|m| member_of(m)) {
                let typed = views::project_member(&project, &b.role, &email);
                self.found(d, typed, format!("projects/{project}"), names);
            }
        }
        let buckets: BTreeSet<String> = model.gce.bucket_iam_members.iter().map(|m| m.bucket.clone()).chain(state_bucket(model)).collect();
        for bucket in buckets {
            let policy = match self.iam.bucket_policy(&bucket).await {
                Ok(p) => p,
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(e.into()),
            };
            for b in gce_iam::bindings(&policy) {
                for email in b.members.iter().filter_map(|m| member_of(m)) {
                    let typed = views::bucket_member(&bucket, &b.role, &email, b.condition.as_ref());
                    self.found(d, typed, format!("projects/_/buckets/{bucket}"), names);
                }
            }
        }
        Ok(())
    }

    fn found(&self, d: &mut GceDiscovered, task: impl Into<Task>, id: String, names: &Names) {
        d.resources.push(task.into().view(Some(id), names));
    }

    /// The instances a plan's template changes leave on the old template (a rolling update
    /// replaces them).
    pub async fn rolling(&self, plan: &Plan) -> Result<Vec<Rolling>, GceError> {
        let mut out = Vec::new();
        for c in &plan.changes {
            let Action::Update(fields) = &c.action else { continue };
            if c.kind != Kind::GceInstanceGroupManager || !fields.iter().any(|f| f.field == "template") {
                continue;
            }
            let Some(Task::InstanceGroupManager(m)) = c.actual.as_ref().and_then(|a| a.gce.as_deref()) else { continue };
            let managed = self.compute.list_managed_instances(&m.zone, &m.gce_name).await?;
            let instances: Vec<String> = managed.iter().filter_map(|i| i["instance"].as_str()).map(|i| name_of_link(i).to_string()).collect();
            if !instances.is_empty() {
                out.push(Rolling { group: c.name.clone(), instances, reason: "new instance template".into() });
            }
        }
        Ok(out)
    }

    /// Execute a plan's changes in order; returns how many were applied.
    pub async fn execute(&self, model: &ClusterModel, names: &Names, plan: &Plan, store: &StateStore) -> Result<usize, GceError> {
        let mut applied = 0;
        for c in &plan.changes {
            if !state::execute_change(store, &model.state, &model.etcd_clusters, model.encryption_config, c).await? {
                self.execute_one(names, c).await?;
            }
            applied += 1;
        }
        Ok(applied)
    }

    /// One change: its task renders it (the desired side's type, else the actual's).
    async fn execute_one(&self, names: &Names, c: &Change) -> Result<(), GceError> {
        let task = [&c.desired, &c.actual].into_iter().flatten().find_map(|r| r.gce.as_deref()).ok_or_else(|| GceError::Resource {
            kind: c.kind.as_str(),
            name: c.name.clone(),
            message: "the plan holds no typed state for it".into(),
        })?;
        let doing = match c.action {
            Action::Create => "creating",
            Action::Update(_) => "updating",
            Action::Delete => "deleting",
        };
        tracing::info!(kind = c.kind.as_str(), name = %c.name, "{doing}");
        task.task().render_gce(Exec { target: self, names }, c).await
    }

    /// Read the project's policy, change it, write it back with its etag (a concurrent change:
    /// read again, a bounded number of times).
    pub(crate) async fn change_project_policy(&self, f: impl Fn(&Value) -> Value) -> Result<(), GceError> {
        for attempt in 1..=POLICY_ATTEMPTS {
            let policy = self.iam.project_policy().await?;
            match self.iam.set_project_policy(&f(&policy)).await {
                Err(e) if e.status() == Some(409) && attempt < POLICY_ATTEMPTS => tracing::info!(attempt, "project policy changed meanwhile; again"),
                r => return r.map(|_| ()).map_err(Into::into),
            }
        }
        Ok(())
    }

    pub(crate) async fn change_bucket_policy(&self, bucket: &str, f: impl Fn(&Value) -> Value) -> Result<(), GceError> {
        for attempt in 1..=POLICY_ATTEMPTS {
            let policy = self.iam.bucket_policy(bucket).await?;
            match self.iam.set_bucket_policy(bucket, &f(&policy)).await {
                Err(e) if (e.status() == Some(409) || e.status() == Some(412)) && attempt < POLICY_ATTEMPTS => {
                    tracing::info!(attempt, bucket, "bucket policy changed meanwhile; again")
                }
                r => return r.map(|_| ()).map_err(Into::into),
            }
        }
        Ok(())
    }

    /// A delete, retried (bounded) while the resource is still used by another; one already gone
    /// is done.
    pub(crate) async fn delete_with_retry<F, Fut>(&self, what: &str, mut f: F) -> Result<(), GceError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<(), ComputeError>>,
    {
        let tries = self.dependency_retries.max(1);
        let mut attempt = 1;
        loop {
            match f().await {
                Ok(()) => return Ok(()),
                Err(e) if e.is_not_found() => return Ok(()),
                Err(e) if e.is_in_use() && attempt < tries => {
                    tracing::info!(what, attempt, error = %e, "still in use; waiting");
                    tokio::time::sleep(self.dependency_delay).await;
                    attempt += 1;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// Read-modify-write rounds of an IAM policy before a concurrent writer wins.
const POLICY_ATTEMPTS: u32 = 5;

/// The state store's bucket, when it is Cloud Storage.
fn state_bucket(model: &ClusterModel) -> Option<String> {
    match model.config_base.parse::<base::ConfigBase>() {
        Ok(base::ConfigBase::Gcs { bucket, .. }) => Some(bucket),
        _ => None,
    }
}

fn name_of(v: &Value) -> &str {
    v["name"].as_str().unwrap_or_default()
}

pub use super::task::desired;

/// Write calls made so far, per `compute/<collection>.<method>`.
pub fn write_calls(counter: &CallCounter) -> BTreeMap<String, u64> {
    counter
        .snapshot()
        .into_iter()
        .filter(|(k, _)| {
            !(k.ends_with(".list")
                || k.ends_with(".get")
                || k.ends_with("operations.wait")
                || k.ends_with(".listManagedInstances")
                || k.ends_with("getIamPolicy"))
        })
        .map(|(k, c)| (k, c.calls))
        .collect()
}
