//! Desired vs actual: a generic resource (kind, name, flat attributes, tags), the diff between two
//! sets of them, and the plan's rendering (coloured on a terminal, plain otherwise).

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Resource kinds, in creation order (deletion runs in reverse).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    StateFile,
    Keyset,
    IamOidcProvider,
    IamRole,
    IamInstanceProfile,
    Vpc,
    InternetGateway,
    Subnet,
    ElasticIp,
    NatGateway,
    RouteTable,
    SecurityGroup,
    SecurityGroupRule,
    TargetGroup,
    LoadBalancer,
    LaunchTemplate,
    AutoscalingGroup,
    Volume,
    DnsRecord,
    // GCE, in creation order.
    GceNetwork,
    GceSubnetwork,
    GceFirewall,
    GceServiceAccount,
    GceProjectIamMember,
    GceBucketIamMember,
    GceInstanceTemplate,
    GceInstanceGroupManager,
    GceDisk,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::StateFile => "StateFile",
            Kind::Keyset => "Keyset",
            Kind::IamOidcProvider => "IAMOIDCProvider",
            Kind::IamRole => "IAMRole",
            Kind::IamInstanceProfile => "IAMInstanceProfile",
            Kind::Vpc => "VPC",
            Kind::InternetGateway => "InternetGateway",
            Kind::Subnet => "Subnet",
            Kind::ElasticIp => "ElasticIP",
            Kind::NatGateway => "NATGateway",
            Kind::RouteTable => "RouteTable",
            Kind::TargetGroup => "TargetGroup",
            Kind::LoadBalancer => "LoadBalancer",
            Kind::SecurityGroup => "SecurityGroup",
            Kind::SecurityGroupRule => "SecurityGroupRule",
            Kind::LaunchTemplate => "LaunchTemplate",
            Kind::AutoscalingGroup => "AutoscalingGroup",
            Kind::Volume => "Volume",
            Kind::DnsRecord => "DNSRecord",
            Kind::GceNetwork => "Network",
            Kind::GceSubnetwork => "Subnetwork",
            Kind::GceFirewall => "Firewall",
            Kind::GceServiceAccount => "ServiceAccount",
            Kind::GceProjectIamMember => "ProjectIAMMember",
            Kind::GceBucketIamMember => "BucketIAMMember",
            Kind::GceInstanceTemplate => "InstanceTemplate",
            Kind::GceInstanceGroupManager => "InstanceGroupManager",
            Kind::GceDisk => "Disk",
        }
    }
}

/// One resource as the plan sees it. Attributes hold comparable values only (names, not cloud ids;
/// a hash, not the user-data itself), so desired and discovered resources compare field by field.
/// A resource of the AWS target is the view of a typed task ([`crate::aws::Task::view`]), which
/// execution reads instead of the attributes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Resource {
    pub kind: Option<Kind>,
    pub name: String,
    pub attrs: BTreeMap<String, String>,
    pub tags: BTreeMap<String, String>,
    /// The cloud id, when discovered.
    pub id: Option<String>,
    /// The typed state this view was made from.
    pub task: Option<Box<crate::aws::Task>>,
    /// The typed state of a GCE resource.
    pub gce: Option<Box<crate::gce::Task>>,
}

impl Resource {
    pub fn new(kind: Kind, name: impl Into<String>) -> Resource {
        Resource { kind: Some(kind), name: name.into(), ..Default::default() }
    }
    pub fn attr(mut self, k: &str, v: impl ToString) -> Resource {
        self.attrs.insert(k.to_string(), v.to_string());
        self
    }
    pub fn tags(mut self, tags: &BTreeMap<String, String>) -> Resource {
        self.tags = tags.clone();
        self
    }
    pub fn kind(&self) -> Kind {
        self.kind.unwrap_or(Kind::StateFile)
    }
    pub fn key(&self) -> (Kind, String) {
        (self.kind(), self.name.clone())
    }
}

/// One attribute difference: name, actual value, desired value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldChange {
    pub field: String,
    pub from: Option<String>,
    pub to: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Create,
    Update(Vec<FieldChange>),
    Delete,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub kind: Kind,
    pub name: String,
    pub action: Action,
    pub desired: Option<Resource>,
    pub actual: Option<Resource>,
}

/// Instances that run an outdated configuration once the plan is applied.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rolling {
    pub group: String,
    pub instances: Vec<String>,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    pub changes: Vec<Change>,
    pub rolling: Vec<Rolling>,
    pub notes: Vec<String>,
}

/// What the diff may do with resources that exist but are not desired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// `apply`: delete only the kinds listed (a removed instance group's ASG and launch template,
    /// rules and groups no longer wanted, the API load balancer once the spec drops it; on GCE a
    /// removed group's MIGs, templates no MIG uses, firewall rules no longer wanted); volumes, disks, DNS records,
    /// keysets and the network are never deleted by apply.
    Apply,
    /// `delete`: delete everything discovered (volumes only when asked).
    Delete { volumes: bool },
}

/// Attributes whose drift is not corrected (set once at creation).
fn immutable_ignored(kind: Kind, field: &str) -> bool {
    match kind {
        // protokube owns a record's value after creation.
        Kind::DnsRecord => field == "value",
        // Volumes keep zone/encryption for life; only size/type/iops are modified.
        Kind::Volume => matches!(field, "zone" | "encrypted" | "kms_key_id"),
        // A GCE etcd disk keeps its zone, size and type (only its labels are set again).
        Kind::GceDisk => matches!(field, "zone" | "size" | "type"),
        _ => false,
    }
}

/// True when `desired` and `actual` differ in anything but tags (and ignored fields).
pub fn attributes_differ(desired: &Resource, actual: &Resource) -> bool {
    field_changes(desired.kind(), desired, actual).iter().any(|f| !f.field.starts_with("tags["))
}

fn field_changes(kind: Kind, desired: &Resource, actual: &Resource) -> Vec<FieldChange> {
    let mut out = Vec::new();
    // A GCE instance template is named by a hash of its content and never changes: the same name
    // is the same template (a changed one is a new name).
    if kind == Kind::GceInstanceTemplate {
        return out;
    }
    let keys: std::collections::BTreeSet<&String> = desired.attrs.keys().chain(actual.attrs.keys()).collect();
    for k in keys {
        let (d, a) = (desired.attrs.get(k), actual.attrs.get(k));
        if d != a && !immutable_ignored(kind, k) {
            out.push(FieldChange { field: k.clone(), from: a.cloned(), to: d.cloned() });
        }
    }
    // Tags: only missing or different desired tags count (others may be added by people or AWS).
    for (k, v) in &desired.tags {
        if actual.tags.get(k) != Some(v) {
            out.push(FieldChange { field: format!("tags[{k}]"), from: actual.tags.get(k).cloned(), to: Some(v.clone()) });
        }
    }
    out
}

/// Compute the changes that turn `actual` into `desired`.
pub fn diff(desired: &[Resource], actual: &[Resource], scope: Scope) -> Plan {
    let actual_by_key: BTreeMap<(Kind, String), &Resource> = actual.iter().map(|r| (r.key(), r)).collect();
    let desired_by_key: BTreeMap<(Kind, String), &Resource> = desired.iter().map(|r| (r.key(), r)).collect();
    let mut changes = Vec::new();
    if let Scope::Apply = scope {
        for d in desired {
            match actual_by_key.get(&d.key()) {
                None => changes.push(Change { kind: d.kind(), name: d.name.clone(), action: Action::Create, desired: Some(d.clone()), actual: None }),
                Some(a) => {
                    let fc = field_changes(d.kind(), d, a);
                    if !fc.is_empty() {
                        changes.push(Change {
                            kind: d.kind(),
                            name: d.name.clone(),
                            action: Action::Update(fc),
                            desired: Some(d.clone()),
                            actual: Some((*a).clone()),
                        });
                    }
                }
            }
        }
    }
    for a in actual {
        let delete = match scope {
            Scope::Apply => {
                !desired_by_key.contains_key(&a.key())
                    && matches!(
                        a.kind(),
                        // IAM: the roles found are the model's and the service accounts' of this
                        // cluster (`aws::iam`), so one gone from the spec is a service account's.
                        Kind::IamOidcProvider
                            | Kind::IamRole
                            | Kind::AutoscalingGroup
                            | Kind::LaunchTemplate
                            | Kind::SecurityGroupRule
                            | Kind::SecurityGroup
                            | Kind::LoadBalancer
                            | Kind::TargetGroup
                            | Kind::GceInstanceGroupManager
                            | Kind::GceInstanceTemplate
                            | Kind::GceFirewall
                            | Kind::GceProjectIamMember
                            | Kind::GceBucketIamMember
                    )
            }
            Scope::Delete { volumes } => match a.kind() {
                Kind::Volume | Kind::GceDisk => volumes,
                Kind::Keyset => false,
                _ => true,
            },
        };
        if delete {
            changes.push(Change { kind: a.kind(), name: a.name.clone(), action: Action::Delete, desired: None, actual: Some(a.clone()) });
        }
    }
    // Creates/updates in dependency order, then deletes in reverse dependency order.
    changes.sort_by(|x, y| {
        let rank = |c: &Change| match c.action {
            Action::Delete => (1, std::cmp::Reverse(c.kind)),
            _ => (0, std::cmp::Reverse(Kind::DnsRecord)),
        };
        let (rx, ry) = (rank(x), rank(y));
        rx.0.cmp(&ry.0).then_with(|| if rx.0 == 0 { x.kind.cmp(&y.kind) } else { rx.1.cmp(&ry.1) }).then_with(|| x.name.cmp(&y.name))
    });
    Plan { changes, rolling: Vec::new(), notes: Vec::new() }
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }
    pub fn counts(&self) -> (usize, usize, usize) {
        let mut c = (0, 0, 0);
        for ch in &self.changes {
            match ch.action {
                Action::Create => c.0 += 1,
                Action::Update(_) => c.1 += 1,
                Action::Delete => c.2 += 1,
            }
        }
        c
    }

    /// Render the plan; `color` adds ANSI colours (green create, yellow change, red delete).
    pub fn render(&self, color: bool) -> String {
        let paint = |code: &str, s: String| if color { format!("\x1b[{code}m{s}\x1b[0m") } else { s };
        let mut out = String::new();
        for c in &self.changes {
            let title = format!("{} {}", c.kind.as_str(), c.name);
            match &c.action {
                Action::Create => {
                    let _ = writeln!(out, "{}", paint("32", format!("+ {title}")));
                    if let Some(d) = &c.desired {
                        for (k, v) in &d.attrs {
                            let _ = writeln!(out, "{}", paint("32", format!("    {k}: {v}")));
                        }
                    }
                }
                Action::Update(fields) => {
                    let _ = writeln!(out, "{}", paint("33", format!("~ {title}")));
                    for f in fields {
                        let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "(none)".into());
                        let _ = writeln!(out, "{}", paint("33", format!("    {}: {} → {}", f.field, show(&f.from), show(&f.to))));
                    }
                }
                Action::Delete => {
                    let id = c.actual.as_ref().and_then(|a| a.id.clone()).map(|i| format!(" ({i})")).unwrap_or_default();
                    let _ = writeln!(out, "{}", paint("31", format!("- {title}{id}")));
                }
            }
        }
        for r in &self.rolling {
            let _ = writeln!(
                out,
                "rolling replacement needed: {} ({} instance{}: {}) — {}",
                r.group,
                r.instances.len(),
                if r.instances.len() == 1 { "" } else { "s" },
                r.instances.join(", "),
                r.reason
            );
        }
        for n in &self.notes {
            let _ = writeln!(out, "note: {n}");
        }
        let (a, b, d) = self.counts();
        if self.is_empty() {
            let _ = writeln!(out, "No changes.");
        } else {
            let _ = writeln!(out, "Plan: {a} to create, {b} to change, {d} to delete.");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lt(machine: &str) -> Resource {
        Resource::new(Kind::LaunchTemplate, "nodes.c").attr("instance_type", machine)
    }

    #[test]
    fn equal_sets_have_no_changes() {
        let p = diff(&[lt("t3.medium")], &[lt("t3.medium")], Scope::Apply);
        assert!(p.is_empty());
        assert!(p.render(false).contains("No changes."));
    }

    #[test]
    fn changed_attribute_is_an_update_naming_the_field() {
        let p = diff(&[lt("t3.large")], &[lt("t3.medium")], Scope::Apply);
        assert_eq!(p.counts(), (0, 1, 0));
        let text = p.render(false);
        assert!(text.contains("~ LaunchTemplate nodes.c"), "{text}");
        assert!(text.contains("instance_type: t3.medium → t3.large"), "{text}");
        assert!(!text.contains('\x1b'));
        assert!(p.render(true).contains("\x1b[33m"));
    }

    #[test]
    fn apply_never_deletes_volumes_or_records_but_delete_does() {
        let vol = Resource::new(Kind::Volume, "a.etcd-main.c");
        let rec = Resource::new(Kind::DnsRecord, "api.c");
        let asg = Resource::new(Kind::AutoscalingGroup, "old.c");
        let actual = vec![vol, rec, asg];
        assert_eq!(diff(&[], &actual, Scope::Apply).counts(), (0, 0, 1));
        assert_eq!(diff(&[], &actual, Scope::Delete { volumes: false }).counts(), (0, 0, 2));
        assert_eq!(diff(&[], &actual, Scope::Delete { volumes: true }).counts(), (0, 0, 3));
    }

    #[test]
    fn order_is_dependencies_first_deletes_reversed() {
        let d = vec![Resource::new(Kind::AutoscalingGroup, "a"), Resource::new(Kind::Vpc, "v")];
        let p = diff(&d, &[], Scope::Apply);
        assert_eq!(p.changes[0].kind, Kind::Vpc);
        let a = vec![Resource::new(Kind::Vpc, "v"), Resource::new(Kind::AutoscalingGroup, "a")];
        let p = diff(&[], &a, Scope::Delete { volumes: true });
        assert_eq!(p.changes[0].kind, Kind::AutoscalingGroup);
        assert_eq!(p.changes[1].kind, Kind::Vpc);
    }

    #[test]
    fn dns_value_drift_is_left_to_protokube() {
        let d = Resource::new(Kind::DnsRecord, "api.c").attr("value", "203.0.113.123");
        let a = Resource::new(Kind::DnsRecord, "api.c").attr("value", "10.0.0.5");
        assert!(diff(&[d], &[a], Scope::Apply).is_empty());
    }
}
