//! The GCE tasks: network, subnetworks, firewall rules, instance templates, one managed instance
//! group per (instance group × zone) and a persistent disk per etcd member, with kOps' names and
//! labels. Each task renders itself to Terraform ([`GceTask::render_terraform`]) and, through
//! [`direct`], to the Compute API (`keelson apply --target direct`); [`crate::tasks!`] below is the
//! one list of the types.

pub mod direct;
mod firewall;
pub mod identity;
pub mod task;
pub mod views;

pub use cloud::gce::compute::{name_of_link, ComputeError};
pub use direct::{GceDiscovered, GceError, GceTarget};
pub use firewall::{Allowed, Firewall};
pub use identity::{BucketIamMember, Condition, ProjectIamMember, ServiceAccount};
pub use task::{Exec, GceFuture, GceTask, Task, Tasks, Typed};

use std::collections::BTreeMap;

use keelson_api::Role;
use serde_json::{json, Value};

use crate::model::ClusterModel;
use crate::plan::{Action, Change, Kind};
use crate::tasks::{Fields, Link, Linked};
use crate::terraform_json::{tf_name, Blocks};
use base::Tree;
use views::Names;

/// Default etcd disk type on GCE (kOps: pd-ssd).
pub const ETCD_DISK_TYPE: &str = "pd-ssd";
pub const BOOT_DISK_TYPE: &str = "pd-balanced";

/// GCE names: lower case, `[a-z0-9-]`, at most 63 characters, starting with a letter (one rule,
/// in `keelson_api::names`, which the join server reads MIG names by too).
pub use keelson_api::names::gce_name;

/// The longest GCE label value; kOps' label encoding and the safe cluster name live with the
/// node agents' GCE code (one encoder for the disks written here and the labels protokube reads).
pub use cloud::gce::labels::{encode_label, safe_cluster_name, LABEL_MAX as LABEL_VALUE_MAX};

/// A label value used as it is (kOps writes the cluster's safe name and the group's name plainly):
/// `[a-z0-9_-]`, at most 63 characters, or an error saying which — never cut or rewritten.
pub fn plain_label(v: &str) -> Result<String, String> {
    if v.len() > LABEL_VALUE_MAX {
        return Err(format!("{v:?} is {} characters; a GCE label value holds at most {LABEL_VALUE_MAX}", v.len()));
    }
    if let Some(c) = v.chars().find(|c| !matches!(c, 'a'..='z' | '0'..='9' | '_' | '-')) {
        return Err(format!("{v:?}: {c:?} is not allowed in a GCE label value ([a-z0-9_-])"));
    }
    Ok(v.to_string())
}

/// The network tag of a role's instances (`<cluster>-k8s-io-role-master`): what firewall rules
/// target.
pub fn role_tag(cluster: &str, role: Role) -> String {
    format!("{}-k8s-io-role-{}", gce_name(cluster), role_label(role))
}

/// The metadata key of the boot script: kOps' `user-data`, or `startup-script` with
/// `cloudConfig.gceUseStartupScript`.
pub const USER_DATA_KEY: &str = "user-data";
pub const STARTUP_SCRIPT_KEY: &str = "startup-script";

/// OAuth scopes of the instances' service accounts. Control planes keep `cloud-platform` (their
/// account's roles limit them); every other role gets only what it uses: nodes read the state
/// store and write logs and metrics, bastions write logs and metrics.
pub const SCOPE_CLOUD_PLATFORM: &str = "https://www.googleapis.com/auth/cloud-platform";
pub const SCOPE_STORAGE_READ_ONLY: &str = "https://www.googleapis.com/auth/devstorage.read_only";
pub const SCOPE_LOGGING_WRITE: &str = "https://www.googleapis.com/auth/logging.write";
pub const SCOPE_MONITORING: &str = "https://www.googleapis.com/auth/monitoring";

/// The scopes a role's instances get.
pub fn scopes(role: Role) -> Vec<String> {
    let s: &[&str] = match role {
        Role::ControlPlane | Role::ApiServer => &[SCOPE_CLOUD_PLATFORM],
        Role::Node => &[SCOPE_STORAGE_READ_ONLY, SCOPE_LOGGING_WRITE, SCOPE_MONITORING],
        Role::Bastion => &[SCOPE_LOGGING_WRITE, SCOPE_MONITORING],
    };
    s.iter().map(|s| s.to_string()).collect()
}

pub fn role_label(role: Role) -> &'static str {
    match role {
        Role::ControlPlane => "master",
        Role::Node => "node",
        Role::ApiServer => "apiserver",
        Role::Bastion => "bastion",
    }
}

/// The cluster's VPC network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Network {
    /// The model's name (the cluster).
    pub name: String,
    /// The GCE name.
    pub gce_name: String,
}

impl Linked for Network {
    const TF_TYPE: &'static str = "google_compute_network";
    const TF_ATTR: &'static str = "name";
}

impl GceTask for Network {
    fn kind(&self) -> Kind {
        Kind::GceNetwork
    }
    fn name(&self) -> String {
        self.name.clone()
    }
    fn gce_name(&self, _names: &Names) -> String {
        self.gce_name.clone()
    }
    fn fields(&self, f: &mut Fields, _names: &Names) {
        f.set("auto_create_subnetworks", false);
    }
    fn body(&self, _names: &Names) -> Value {
        json!({"name": self.gce_name, "autoCreateSubnetworks": false, "routingConfig": {"routingMode": "REGIONAL"}})
    }
    fn render_gce<'a>(&'a self, cx: Exec<'a>, c: &'a Change) -> GceFuture<'a> {
        Box::pin(async move {
            let c = Typed::<Network>::of(c);
            let compute = &cx.target.compute;
            match c.action {
                Action::Create => compute.insert_network(&self.body(cx.names)).await?,
                Action::Update(_) => return Err(c.refuse("a network")),
                Action::Delete => cx.target.delete_with_retry(c.name, || compute.delete_network(&self.gce_name)).await?,
            }
            Ok(())
        })
    }
    fn render_terraform(&self, b: &mut Blocks) {
        b.add("google_compute_network", &self.name, json!({"name": self.gce_name, "auto_create_subnetworks": false}));
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subnetwork {
    /// The cloud name (`<subnet>.<cluster>`).
    pub name: String,
    pub gce_name: String,
    pub network: Link<Network>,
    pub region: String,
    pub cidr: String,
}

impl Linked for Subnetwork {
    const TF_TYPE: &'static str = "google_compute_subnetwork";
    const TF_ATTR: &'static str = "name";
}

impl GceTask for Subnetwork {
    fn kind(&self) -> Kind {
        Kind::GceSubnetwork
    }
    fn name(&self) -> String {
        self.name.clone()
    }
    fn gce_name(&self, _names: &Names) -> String {
        self.gce_name.clone()
    }
    fn fields(&self, f: &mut Fields, names: &Names) {
        f.set("network", names.network(&self.network)).set("region", &self.region).set("cidr", &self.cidr);
    }
    /// The region is the request's path (the body's `region` is a URL GCE fills in).
    fn body(&self, names: &Names) -> Value {
        json!({"name": self.gce_name, "network": names.network_link(&self.network), "ipCidrRange": self.cidr})
    }
    fn render_gce<'a>(&'a self, cx: Exec<'a>, c: &'a Change) -> GceFuture<'a> {
        Box::pin(async move {
            let c = Typed::<Subnetwork>::of(c);
            let compute = &cx.target.compute;
            match c.action {
                Action::Create => compute.insert_subnetwork(&self.region, &self.body(cx.names)).await?,
                Action::Update(_) => return Err(c.refuse("a subnetwork's network, region or range")),
                Action::Delete => cx.target.delete_with_retry(c.name, || compute.delete_subnetwork(&self.region, &self.gce_name)).await?,
            }
            Ok(())
        })
    }
    fn render_terraform(&self, b: &mut Blocks) {
        b.add(
            "google_compute_subnetwork",
            &self.name,
            json!({"name": self.gce_name, "network": self.network.tf(), "region": self.region, "ip_cidr_range": self.cidr}),
        );
    }
}

/// The instance template of an instance group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceTemplate {
    pub name: String,
    /// The instance group.
    pub group: String,
    pub role: Role,
    pub cluster: String,
    pub name_prefix: String,
    pub machine_type: String,
    pub disk_size_gb: i64,
    pub disk_type: String,
    /// The boot disk's provisioned IOPS and throughput (MB/s), for the types that take them.
    pub disk_iops: Option<i64>,
    pub disk_throughput: Option<i64>,
    pub image: String,
    pub network: Link<Network>,
    /// The first subnet of its group (none when no group uses it).
    pub subnetwork: Option<Link<Subnetwork>>,
    pub public_ip: bool,
    /// The boot script (exactly the bytes the instance gets).
    pub user_data: Vec<u8>,
    /// Its metadata key ([`USER_DATA_KEY`] or [`STARTUP_SCRIPT_KEY`]).
    pub user_data_key: String,
    /// The service account's email (`default`: the project's default compute account).
    pub service_account: String,
    /// The cluster's own account for the role (Terraform references it, so it exists first);
    /// `None` for an account the spec names.
    pub service_account_task: Option<Link<ServiceAccount>>,
    /// The account's OAuth scopes ([`scopes`]).
    pub scopes: Vec<String>,
    pub labels: BTreeMap<String, String>,
    pub tags: Vec<String>,
}

impl Linked for InstanceTemplate {
    const TF_TYPE: &'static str = "google_compute_instance_template";
    const TF_ATTR: &'static str = "self_link";
}

impl GceTask for InstanceTemplate {
    fn kind(&self) -> Kind {
        Kind::GceInstanceTemplate
    }
    fn name(&self) -> String {
        self.name.clone()
    }
    /// Its prefix and a hash of its body ([`views::template_name`]).
    fn gce_name(&self, names: &Names) -> String {
        names.templates.get(&self.name).cloned().unwrap_or_else(|| self.name.clone())
    }
    fn fields(&self, f: &mut Fields, _names: &Names) {
        f.set("group", &self.group)
            .set("machine_type", &self.machine_type)
            .set("image", &self.image)
            .set("disk", views::boot_disk_summary(self))
            .set("metadata", format!("{} (sha256 {}), cluster-name, kops-k8s-io-instance-group-name", self.user_data_key, base::sha256_hex(&self.user_data)))
            .set("service_account", &self.service_account)
            .set("scopes", views::sorted_joined(&self.scopes))
            .set("tags", views::sorted_joined(&self.tags));
    }
    fn labels(&self) -> BTreeMap<String, String> {
        self.labels.clone()
    }
    fn body(&self, names: &Names) -> Value {
        json!({
            "name": views::template_name(self, names),
            "description": format!("keelson: instance group {} of {}", self.group, self.cluster),
            "properties": views::template_properties(self, names),
        })
    }
    /// Created once, never changed: templates are named by their content, so a changed one is a
    /// new name.
    fn render_gce<'a>(&'a self, cx: Exec<'a>, c: &'a Change) -> GceFuture<'a> {
        Box::pin(async move {
            let c = Typed::<InstanceTemplate>::of(c);
            let compute = &cx.target.compute;
            match c.action {
                Action::Create => {
                    // GCE metadata holds text: a compressed boot script would arrive corrupted.
                    std::str::from_utf8(&self.user_data).map_err(|_| {
                        c.error(format!("the {} of instance group {} is not text (compressUserData?); GCE metadata holds text", self.user_data_key, self.group))
                    })?;
                    compute.insert_instance_template(&self.body(cx.names)).await?
                }
                Action::Update(_) => return Err(c.refuse("an instance template")),
                Action::Delete => cx.target.delete_with_retry(c.name, || compute.delete_instance_template(&self.name)).await?,
            }
            Ok(())
        })
    }
    fn render_terraform(&self, b: &mut Blocks) {
        let startup = b.data_file(&format!("google_compute_instance_template_{}_metadata_{}", tf_name(&self.name), self.user_data_key), &self.user_data);
        let mut disk = json!({
            "auto_delete": true,
            "boot": true,
            "device_name": "persistent-disks-0",
            "disk_size_gb": self.disk_size_gb,
            "disk_type": self.disk_type,
            "source_image": self.image,
            "type": "PERSISTENT",
            "mode": "READ_WRITE",
        });
        if let Some(iops) = self.disk_iops {
            disk["provisioned_iops"] = json!(iops);
        }
        if let Some(throughput) = self.disk_throughput {
            disk["provisioned_throughput"] = json!(throughput);
        }
        b.add(
            "google_compute_instance_template",
            &self.name,
            json!({
                "name_prefix": self.name_prefix,
                "machine_type": self.machine_type,
                "can_ip_forward": true,
                "disk": [disk],
                "network_interface": [{
                    "network": self.network.tf(),
                    "subnetwork": self.subnetwork.as_ref().map(|s| s.tf()).unwrap_or_default(),
                    "access_config": if self.public_ip { json!([{}]) } else { json!([]) },
                }],
                "metadata": {
                    self.user_data_key.as_str(): startup,
                    "cluster-name": self.cluster,
                    "kops-k8s-io-instance-group-name": self.group,
                },
                "labels": labels_value(&self.labels),
                "tags": self.tags,
                "service_account": [{
                    "email": self.service_account_task.as_ref().map(|l| l.tf()).unwrap_or_else(|| self.service_account.clone()),
                    "scopes": self.scopes,
                }],
                "scheduling": {"automatic_restart": true, "on_host_maintenance": "MIGRATE", "preemptible": false},
                "lifecycle": {"create_before_destroy": true},
            }),
        );
    }
}

/// A managed instance group: one zone's share of an instance group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceGroupManager {
    /// `<zone letter>-<group>.<cluster>`.
    pub name: String,
    pub gce_name: String,
    pub zone: String,
    pub base_instance_name: String,
    pub target_size: i64,
    pub template: Link<InstanceTemplate>,
    /// Surge: the number of zones of the instance group.
    pub max_surge: i64,
}

impl GceTask for InstanceGroupManager {
    fn kind(&self) -> Kind {
        Kind::GceInstanceGroupManager
    }
    fn name(&self) -> String {
        self.name.clone()
    }
    fn gce_name(&self, _names: &Names) -> String {
        self.gce_name.clone()
    }
    fn fields(&self, f: &mut Fields, names: &Names) {
        f.set("zone", &self.zone)
            .set("base_instance_name", &self.base_instance_name)
            .set("target_size", self.target_size)
            .set("template", names.template(&self.template));
    }
    fn body(&self, names: &Names) -> Value {
        json!({
            "name": self.gce_name,
            "baseInstanceName": self.base_instance_name,
            "instanceTemplate": names.template_link(&self.template),
            "targetSize": self.target_size,
            "updatePolicy": {"type": "OPPORTUNISTIC", "minimalAction": "REPLACE", "maxSurge": {"fixed": self.max_surge}, "maxUnavailable": {"fixed": 0}},
        })
    }
    /// An update moves the group to another template (its instances are left to a rolling update)
    /// or resizes it; its zone and base instance name are for life.
    fn render_gce<'a>(&'a self, cx: Exec<'a>, c: &'a Change) -> GceFuture<'a> {
        Box::pin(async move {
            let c = Typed::<InstanceGroupManager>::of(c);
            let compute = &cx.target.compute;
            match c.action {
                Action::Create => compute.insert_instance_group_manager(&self.zone, &self.body(cx.names)).await?,
                Action::Update(_) => {
                    let have = c.have()?;
                    if c.changed("zone") || c.changed("base_instance_name") {
                        return Err(c.refuse("its zone or base instance name"));
                    }
                    if c.changed("template") {
                        compute.set_instance_template(&have.zone, &have.gce_name, &cx.names.template_link(&self.template)).await?;
                    }
                    if c.changed("target_size") {
                        compute.resize_instance_group_manager(&have.zone, &have.gce_name, self.target_size).await?;
                    }
                }
                Action::Delete => cx.target.delete_with_retry(c.name, || compute.delete_instance_group_manager(&self.zone, &self.gce_name)).await?,
            }
            Ok(())
        })
    }
    fn render_terraform(&self, b: &mut Blocks) {
        b.add(
            "google_compute_instance_group_manager",
            &self.name,
            json!({
                "name": self.gce_name,
                "zone": self.zone,
                "base_instance_name": self.base_instance_name,
                "target_size": self.target_size,
                "version": [{"instance_template": self.template.tf()}],
                "update_policy": {"type": "OPPORTUNISTIC", "minimal_action": "REPLACE", "max_surge_fixed": self.max_surge, "max_unavailable_fixed": 0},
            }),
        );
    }
}

/// An etcd member's persistent disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disk {
    pub name: String,
    pub gce_name: String,
    pub zone: String,
    pub size_gb: i64,
    pub disk_type: String,
    pub labels: BTreeMap<String, String>,
}

impl GceTask for Disk {
    fn kind(&self) -> Kind {
        Kind::GceDisk
    }
    fn name(&self) -> String {
        self.name.clone()
    }
    fn gce_name(&self, _names: &Names) -> String {
        self.gce_name.clone()
    }
    fn fields(&self, f: &mut Fields, _names: &Names) {
        f.set("zone", &self.zone).set("size", self.size_gb).set("type", &self.disk_type);
    }
    fn labels(&self) -> BTreeMap<String, String> {
        self.labels.clone()
    }
    fn body(&self, names: &Names) -> Value {
        json!({
            "name": self.gce_name,
            "sizeGb": self.size_gb.to_string(),
            "type": format!("projects/{}/zones/{}/diskTypes/{}", names.project, self.zone, self.disk_type),
            "labels": self.labels,
        })
    }
    /// An update sets labels only (zone, size and type are kept for life): ours set, others' kept.
    fn render_gce<'a>(&'a self, cx: Exec<'a>, c: &'a Change) -> GceFuture<'a> {
        Box::pin(async move {
            let c = Typed::<Disk>::of(c);
            let compute = &cx.target.compute;
            match c.action {
                Action::Create => compute.insert_disk(&self.zone, &self.body(cx.names)).await?,
                Action::Update(_) => {
                    let have = c.have()?;
                    let now = compute.disk(&have.zone, &have.gce_name).await?.ok_or_else(|| c.error("gone since it was planned"))?;
                    let mut labels = have.labels.clone();
                    labels.extend(self.labels.clone());
                    let fingerprint = now["labelFingerprint"].as_str().unwrap_or_default();
                    compute.set_disk_labels(&have.zone, &have.gce_name, &serde_json::to_value(&labels).unwrap_or_default(), fingerprint).await?;
                }
                Action::Delete => cx.target.delete_with_retry(c.name, || compute.delete_disk(&self.zone, &self.gce_name)).await?,
            }
            Ok(())
        })
    }
    fn render_terraform(&self, b: &mut Blocks) {
        b.add(
            "google_compute_disk",
            &self.name,
            json!({"name": self.gce_name, "zone": self.zone, "size": self.size_gb, "type": self.disk_type, "labels": labels_value(&self.labels)}),
        );
    }
}

pub(crate) fn labels_value(labels: &BTreeMap<String, String>) -> Value {
    Value::Object(labels.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect())
}

/// Render the model's GCE tasks.
pub fn render(model: &ClusterModel) -> Tree {
    let mut b = Blocks::default();
    for task in model.gce.iter() {
        task.render_terraform(&mut b);
    }
    b.output.insert("cluster_name".into(), json!({"value": model.cluster}));
    b.output.insert("project".into(), json!({"value": model.project.clone().unwrap_or_default()}));
    b.output.insert("region".into(), json!({"value": model.region}));
    b.finish(json!({
        "terraform": {
            "required_version": ">= 1.3.0",
            "required_providers": {"google": {"source": "hashicorp/google", "version": ">= 5.0.0"}},
        },
        "provider": {"google": [{"project": model.project.clone().unwrap_or_default(), "region": model.region}]},
        "locals": {"cluster_name": model.cluster, "project": model.project.clone().unwrap_or_default(), "region": model.region},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_labels_follow_gce_rules() {
        assert_eq!(gce_name("A-nodes.gce.k8s.example.com"), "a-nodes-gce-k8s-example-com");
        assert_eq!(gce_name("1x"), "k1x");
        assert!(gce_name(&"x".repeat(100)).len() <= 63);
        assert_eq!(encode_label("a/a,b").as_deref(), Ok("a-2fa-2cb"));
        // `-` and `_` are escaped too, or kOps would decode them as escapes.
        assert_eq!(encode_label("us-c1-a/us-c1-a").as_deref(), Ok("us-2dc1-2da-2fus-2dc1-2da"));
        assert!(encode_label(&"a/".repeat(30)).is_err(), "over 63 characters encoded: an error, never cut");
        assert_eq!(plain_label("ha-k8s-example-com"), Ok("ha-k8s-example-com".into()));
        assert!(plain_label(&"x".repeat(64)).is_err_and(|e| e.contains("at most 63")));
        assert!(plain_label("a.b").is_err());
    }
}
