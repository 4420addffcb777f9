//! The instances of a cluster's autoscaling groups as `rolling-update` and `validate cluster` see
//! them: which launch-template version each runs, whether it is in service and healthy, and which
//! are outdated.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use cloud_resources::aws::AwsTarget;
use cloud_resources::model::ClusterModel;
use keelson_api::Role;

#[derive(Debug, thiserror::Error)]
pub enum InstancesError {
    #[error(transparent)]
    Aws(#[from] cloud_resources::aws::AwsError),
    #[error("--instance-group {0:?}: no such instance group in the spec")]
    UnknownGroup(String),
}

fn api<E: std::error::Error + Send + Sync + 'static>(op: &'static str, target: &str, e: E) -> InstancesError {
    cloud_resources::aws::api(op, target, e).into()
}

/// Which groups to look at, and whether every instance counts as outdated.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Only these instance groups (spec names); empty = all.
    pub groups: Vec<String>,
    /// Only groups of these roles; empty = all.
    pub roles: Vec<Role>,
    /// Every instance is outdated (`--force`).
    pub force: bool,
}

/// The lifecycle of an instance a surge detached from its group.
pub const DETACHED: &str = "Detached";

/// One instance of a group as the rolling update sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceStatus {
    pub id: String,
    /// Launch-template version the instance was launched from (`None`: unknown / other template).
    pub version: Option<String>,
    pub lifecycle: String,
    pub healthy: bool,
    /// The private IP (how the instance is matched to its Node, as `validate cluster` does).
    pub private_ip: Option<String>,
    pub outdated: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupStatus {
    pub name: String,
    /// The spec's instance-group name.
    pub group: String,
    pub role: Role,
    /// The launch-template version the group is configured with (resolved; empty when unknown).
    pub target_version: String,
    pub min: i32,
    pub max: i32,
    pub desired: i32,
    pub instances: Vec<InstanceStatus>,
}

impl GroupStatus {
    pub fn outdated(&self) -> Vec<&InstanceStatus> {
        self.instances.iter().filter(|i| i.outdated).collect()
    }
    pub fn ready(&self) -> usize {
        self.instances.iter().filter(|i| i.lifecycle == "InService" && i.healthy).count()
    }
}

/// Replacement order (kOps'): bastions first (if they go down nothing can be seen), then the
/// control planes one at a time, API servers, nodes; by name within a role.
pub fn role_rank(r: Role) -> u8 {
    match r {
        Role::Bastion => 0,
        Role::ControlPlane => 1,
        Role::ApiServer => 2,
        Role::Node => 3,
    }
}

/// The spec's groups a run looks at, in replacement order: `(cloud name, spec name, role)`.
pub fn select<'a>(groups: impl IntoIterator<Item = (&'a str, &'a str, Role)>, opts: &Selection) -> Result<Vec<(&'a str, &'a str, Role)>, InstancesError> {
    let all: Vec<_> = groups.into_iter().collect();
    for g in &opts.groups {
        if !all.iter().any(|(_, name, _)| name == g) {
            return Err(InstancesError::UnknownGroup(g.clone()));
        }
    }
    let mut wanted: Vec<_> = all
        .into_iter()
        .filter(|(_, name, role)| (opts.groups.is_empty() || opts.groups.iter().any(|g| g == name)) && (opts.roles.is_empty() || opts.roles.contains(role)))
        .collect();
    wanted.sort_by_key(|(cloud, _, role)| (role_rank(*role), cloud.to_string()));
    Ok(wanted)
}

/// The cluster's groups (those in the spec, in replacement order) with their instances.
pub async fn status(t: &AwsTarget, model: &ClusterModel, opts: &Selection) -> Result<Vec<GroupStatus>, InstancesError> {
    let wanted = select(model.tasks.groups.iter().map(|g| (g.name.as_str(), g.group.as_str(), g.role)), opts)?;
    let mut out = Vec::new();
    for (name, _, _) in wanted {
        let Some(g) = model.tasks.groups.iter().find(|g| g.name == name) else { continue };
        if let Some(s) = group_status(t, &g.name, &g.group, g.role, &g.launch_template, opts.force).await? {
            out.push(s);
        }
    }
    Ok(out)
}

/// A launch template and one of its version numbers: what an instance was launched from, or what
/// its group launches now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateVersion {
    pub template_id: String,
    pub version: String,
}

/// The version number a group's configured version means. AWS takes a missing version as
/// `$Default`; `$Latest` and `$Default` are resolved with the template's numbers
/// (DescribeLaunchTemplates); `None` when it cannot be resolved.
pub fn resolve_version(configured: Option<&str>, default: Option<i64>, latest: Option<i64>) -> Option<String> {
    match configured.unwrap_or("$Default") {
        "$Default" => default.map(|v| v.to_string()),
        "$Latest" => latest.map(|v| v.to_string()),
        v if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => Some(v.trim_start_matches('0').to_string()).filter(|v| !v.is_empty()),
        _ => None,
    }
}

/// An instance needs replacing when it was launched from another template or another version than
/// the one its group is configured with (not the template's latest: a version made by hand and not
/// pinned changes nothing). An instance whose origin is unknown is outdated; when the group's own
/// version is unknown nothing can be compared and nothing is outdated.
pub fn is_outdated(launched: Option<&TemplateVersion>, configured: Option<&TemplateVersion>) -> bool {
    match (launched, configured) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(l), Some(c)) => l != c,
    }
}

pub async fn group_status(
    t: &AwsTarget,
    name: &str,
    group: &str,
    role: Role,
    launch_template: &str,
    force: bool,
) -> Result<Option<GroupStatus>, InstancesError> {
    let resp = t.asg.describe_auto_scaling_groups().auto_scaling_group_names(name).send().await.map_err(|e| api("DescribeAutoScalingGroups", name, e))?;
    let Some(g) = resp.auto_scaling_groups().first() else { return Ok(None) };
    // What the group launches: its launch template, or its mixed-instances policy's.
    let spec = g
        .launch_template()
        .cloned()
        .or_else(|| g.mixed_instances_policy().and_then(|m| m.launch_template()).and_then(|l| l.launch_template_specification()).cloned());
    let by_id = spec.as_ref().and_then(|s| s.launch_template_id()).map(str::to_string);
    let by_name = spec.as_ref().and_then(|s| s.launch_template_name()).unwrap_or(launch_template).to_string();
    let describe = match &by_id {
        Some(id) => t.ec2.describe_launch_templates().launch_template_ids(id),
        None => t.ec2.describe_launch_templates().launch_template_names(&by_name),
    };
    let lts = describe.send().await.map_err(|e| api("DescribeLaunchTemplates", by_id.as_deref().unwrap_or(&by_name), e))?;
    let lt = lts.launch_templates().first();
    let (default, latest) = (lt.and_then(|l| l.default_version_number()), lt.and_then(|l| l.latest_version_number()));
    let template_id = lt.and_then(|l| l.launch_template_id()).map(str::to_string).or(by_id).unwrap_or_default();
    let configured =
        resolve_version(spec.as_ref().and_then(|s| s.version()), default, latest).map(|version| TemplateVersion { template_id: template_id.clone(), version });
    // EC2 tags every instance with the template id and version it was launched from; the group's
    // own view may only show what the group uses now.
    let ids: Vec<String> = g.instances().iter().filter_map(|i| i.instance_id().map(str::to_string)).collect();
    let mut launched_from: BTreeMap<String, TemplateVersion> = BTreeMap::new();
    let mut private_ip: BTreeMap<String, String> = BTreeMap::new();
    for chunk in ids.chunks(500) {
        let resp = t.ec2.describe_instances().set_instance_ids(Some(chunk.to_vec())).send().await.map_err(|e| api("DescribeInstances", name, e))?;
        for i in resp.reservations().iter().flat_map(|r| r.instances()) {
            let tag = |k: &str| i.tags().iter().find(|t| t.key() == Some(k)).and_then(|t| t.value()).map(str::to_string);
            if let (Some(id), Some(ip)) = (i.instance_id(), i.private_ip_address()) {
                private_ip.insert(id.to_string(), ip.to_string());
            }
            if let (Some(id), Some(template_id), Some(version)) = (i.instance_id(), tag("aws:ec2launchtemplate:id"), tag("aws:ec2launchtemplate:version")) {
                launched_from.insert(id.to_string(), TemplateVersion { template_id, version });
            }
        }
    }
    let mut instances: Vec<InstanceStatus> = g
        .instances()
        .iter()
        .map(|i| {
            let id = i.instance_id().unwrap_or_default().to_string();
            let launched = launched_from.get(&id).cloned().or_else(|| {
                // Without EC2's tags: the group's record of the instance (same template by id or name).
                let lt = i.launch_template()?;
                let same = lt.launch_template_id() == Some(template_id.as_str()) || lt.launch_template_name() == Some(by_name.as_str());
                let version = resolve_version(lt.version(), default, latest)?;
                Some(TemplateVersion { template_id: if same { template_id.clone() } else { lt.launch_template_id().unwrap_or_default().to_string() }, version })
            });
            let lifecycle = i.lifecycle_state().map(|s| s.as_str().to_string()).unwrap_or_default();
            InstanceStatus {
                outdated: (force || is_outdated(launched.as_ref(), configured.as_ref())) && !lifecycle.starts_with("Terminat"),
                private_ip: private_ip.get(&id).cloned(),
                id,
                version: launched.map(|l| l.version),
                healthy: i.health_status().unwrap_or("Healthy") == "Healthy",
                lifecycle,
            }
        })
        .collect();
    // Instances a surge detached from the group (an interrupted run's): found by their tags, always
    // outdated, last.
    let detached = t
        .ec2
        .describe_instances()
        .filters(aws_sdk_ec2::types::Filter::builder().name("tag-key").values(crate::surge::DETACHED_TAG).build())
        .filters(aws_sdk_ec2::types::Filter::builder().name("tag:kops.k8s.io/instancegroup").values(group).build())
        .filters(aws_sdk_ec2::types::Filter::builder().name("tag:Name").values(name).build())
        .filters(aws_sdk_ec2::types::Filter::builder().name("instance-state-name").values("pending").values("running").build())
        .send()
        .await
        .map_err(|e| api("DescribeInstances", name, e))?;
    for i in detached.reservations().iter().flat_map(|r| r.instances()) {
        let Some(id) = i.instance_id() else { continue };
        if instances.iter().any(|x| x.id == id) {
            continue;
        }
        let tag = |k: &str| i.tags().iter().find(|t| t.key() == Some(k)).and_then(|t| t.value()).map(str::to_string);
        instances.push(InstanceStatus {
            id: id.to_string(),
            version: tag("aws:ec2launchtemplate:version"),
            lifecycle: DETACHED.to_string(),
            healthy: true,
            private_ip: i.private_ip_address().map(str::to_string),
            outdated: true,
        });
    }
    Ok(Some(GroupStatus {
        name: name.to_string(),
        group: group.to_string(),
        role,
        target_version: configured.map(|c| c.version).unwrap_or_default(),
        min: g.min_size().unwrap_or_default(),
        max: g.max_size().unwrap_or_default(),
        desired: g.desired_capacity().unwrap_or_default(),
        instances,
    }))
}

/// kOps-style table: NAME STATUS NEEDUPDATE READY MIN TARGET MAX.
pub fn render(groups: &[GroupStatus]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{:<48} {:<12} {:>10} {:>5} {:>3} {:>6} {:>3}", "NAME", "STATUS", "NEEDUPDATE", "READY", "MIN", "TARGET", "MAX");
    for g in groups {
        let need = g.outdated().len();
        let status = if need > 0 { "NeedsUpdate" } else { "Ready" };
        let _ = writeln!(out, "{:<48} {:<12} {:>10} {:>5} {:>3} {:>6} {:>3}", g.group, status, need, g.ready(), g.min, g.desired, g.max);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_roll_bastions_first_then_control_planes_api_servers_nodes() {
        let groups = [
            ("nodes-b.c", "nodes-b", Role::Node),
            ("nodes-a.c", "nodes-a", Role::Node),
            ("apiserver.c", "apiserver", Role::ApiServer),
            ("control-plane-b.c", "control-plane-b", Role::ControlPlane),
            ("bastions.c", "bastions", Role::Bastion),
            ("control-plane-a.c", "control-plane-a", Role::ControlPlane),
        ];
        let names = |opts: &Selection| select(groups, opts).expect("select").into_iter().map(|(_, n, _)| n).collect::<Vec<_>>();
        assert_eq!(names(&Selection::default()), ["bastions", "control-plane-a", "control-plane-b", "apiserver", "nodes-a", "nodes-b"]);
        let only = Selection { groups: vec!["nodes-b".into(), "control-plane-b".into()], ..Default::default() };
        assert_eq!(names(&only), ["control-plane-b", "nodes-b"], "--instance-group keeps the order");
        let roles = Selection { roles: vec![Role::Node, Role::Bastion], ..Default::default() };
        assert_eq!(names(&roles), ["bastions", "nodes-a", "nodes-b"]);
        let both = Selection { groups: vec!["nodes-a".into(), "control-plane-a".into()], roles: vec![Role::Node], ..Default::default() };
        assert_eq!(names(&both), ["nodes-a"]);
        let err = select(groups, &Selection { groups: vec!["nope".into()], ..Default::default() }).expect_err("unknown");
        assert!(err.to_string().contains("\"nope\""), "{err}");
    }

    #[test]
    fn a_groups_configured_version_resolves_latest_and_default() {
        // (configured, default, latest, resolved)
        type Case<'a> = (Option<&'a str>, Option<i64>, Option<i64>, Option<&'a str>);
        let cases: &[Case] = &[
            (Some("2"), Some(1), Some(3), Some("2")),
            (Some("$Latest"), Some(1), Some(3), Some("3")),
            (Some("$Default"), Some(1), Some(3), Some("1")),
            (None, Some(2), Some(3), Some("2")),
            (Some("$Latest"), Some(1), None, None),
            (Some("007"), None, None, Some("7")),
            (Some("latest"), Some(1), Some(3), None),
            (Some(""), Some(1), Some(3), None),
        ];
        for (configured, default, latest, want) in cases {
            assert_eq!(resolve_version(*configured, *default, *latest).as_deref(), *want, "{configured:?} default {default:?} latest {latest:?}");
        }
    }

    #[test]
    fn outdated_means_another_template_or_version_than_the_group_is_configured_with() {
        let tv = |t: &str, v: &str| Some(TemplateVersion { template_id: t.into(), version: v.into() });
        let cases = [
            // (launched, configured, outdated)
            (tv("lt-1", "2"), tv("lt-1", "2"), false),
            (tv("lt-1", "1"), tv("lt-1", "2"), true),
            // Pinned back to an older version (a rollback): the newer instances go.
            (tv("lt-1", "3"), tv("lt-1", "2"), true),
            (tv("lt-2", "2"), tv("lt-1", "2"), true),
            (None, tv("lt-1", "2"), true),
            (tv("lt-1", "1"), None, false),
            (None, None, false),
        ];
        for (launched, configured, want) in cases {
            assert_eq!(is_outdated(launched.as_ref(), configured.as_ref()), want, "{launched:?} vs {configured:?}");
        }
    }
}
