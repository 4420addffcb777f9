//! What Keelson does with each field of the spec: one table. A field is either *consumed* — by a
//! kubelet configuration key, a component flag, or a named part of the compiler, nodeup or the cloud
//! model — or *refused* with a validation error that names its path. Nothing is silently dropped.
//!
//! Two kinds of refusal:
//! - [`Use::Refused`]: the component has no such setting any more (a kubelet flag removed years
//!   ago): nothing Keelson could write would honour it, and the kubelet would exit on it. Every
//!   command refuses it, `keelson compile` included.
//! - [`Use::NotRendered`]: a kOps feature whose configuration the compiler completes exactly as kOps
//!   does (so `keelson compile` output stays kOps', and compiling warns), but whose running part —
//!   an addon, a CNI, an AWS resource — Keelson does not render yet. `keelson validate` and the
//!   commands that build a cluster (`apply`, `rolling-update`, `reconcile`) refuse it.
//!
//! And one kind of warning, [`Use::DroppedByKops`]: a key kOps' v1alpha2 types do not read (kOps
//! drops it on load without a word, so a kOps cluster never had what it says). Keelson does the
//! same — a spec that runs under kOps moves over unchanged — but every command names it and says
//! what to set instead ([`dropped`]).
//!
//! A field of kube-apiserver's, kube-controller-manager's, kube-scheduler's or kube-proxy's spec with
//! a flag in kOps' `flag:` tags ([`crate::flag_table`]) is consumed by that flag: nodeup renders it
//! into the component's static pod (`nodeup/tests/render.rs` checks every one). The rest of each
//! spec is in the tables of this module, one file per part of the spec.
//!
//! `api/tests/support.rs` walks the generated types from [`COVERED_ROOTS`] (the whole `Cluster` and
//! `InstanceGroup` specs) and fails on any field this module does not classify; nodeup's kubelet renderer destructures
//! `KubeletConfigSpec` without `..` and places each field where [`KUBELET`] says.

use serde_json::Value;

use crate::documents::Documents;
use crate::validate::ValidationError;

use crate::flag_table;
use crate::flags::{FlagKind, FlagSpec};

mod addons;
mod cluster;
mod cluster_autoscaler;
mod components;
mod groups;
mod kubelet;
mod runtime;

pub use addons::{ADDONS, DISCOVERY, EXTERNAL_DNS, FLANNEL, KUBE_DNS, METRICS_SERVER, NETWORKING};
pub use cluster::{CLOUD, CLUSTER};
pub use cluster_autoscaler::CLUSTER_AUTOSCALER;
pub use components::COMPONENTS;
pub use groups::GROUPS;
pub use kubelet::KUBELET;
pub use runtime::RUNTIME;

/// What happens to a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// The kubelet's configuration file (`/var/lib/kubelet/kubelet.conf`), at this key path of
    /// `KubeletConfiguration` (kubelet.config.k8s.io/v1beta1), dots between levels.
    KubeletConfig(&'static str),
    /// The kubelet's command line (`/etc/sysconfig/kubelet`): this flag (kOps' `flag:` tag).
    KubeletFlag(&'static str),
    /// A control-plane component's command line (its static pod, rendered by nodeup): this flag,
    /// from kOps' `flag:` tags ([`crate::flag_table`]).
    ComponentFlag { component: &'static str, flag: &'static str },
    /// Consumed by the named part of Keelson (the whole field, its sub-fields included).
    By(&'static str),
    /// Completed as kOps does, but not rendered: refused by `keelson validate` and the cluster
    /// commands (compile warns) when the condition holds.
    NotRendered { when: When, reason: &'static str },
    /// Refused by every command when set.
    Refused(&'static str),
    /// Not a field kOps reads — its v1alpha2 types drop it on load — and so with no effect in
    /// Keelson either, as in kOps: every command that reads the spec warns with the reason (what
    /// to set instead); never refused, never applied ([`dropped`]).
    DroppedByKops(&'static str),
}

/// When a [`Use::NotRendered`] field asks for something Keelson does not render.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// Whenever the field is present.
    Present,
    /// When its `enabled` is `true` (kOps: absent means off).
    Enabled,
    /// Unless its `enabled` is `false` (kOps: the section alone turns it on).
    NotDisabled,
    /// When it is the boolean `true`.
    True,
    /// When it is the boolean `false`.
    False,
    /// When it is this string.
    Equals(&'static str),
    /// When it is a string other than this one.
    NotEquals(&'static str),
    /// When `then` holds and the sibling field `key` is not the string `value` (a setting only
    /// one of several providers renders).
    UnlessSibling { key: &'static str, value: &'static str, then: &'static When },
    /// When it names a cloud provider Keelson does not build clusters on
    /// ([`crate::CloudProvider::served`], the rule `apply` uses too).
    UnservedCloud,
    /// When it is a name other than the API server's internal name, `api.internal.<cluster>`
    /// ([`crate::names::api_internal_dns`]), the one Keelson uses.
    NotApiInternalName,
}

impl When {
    /// Whether it holds for the value `v` of a field of `parent`, in the cluster named `cluster`.
    fn holds(self, v: &Value, parent: &serde_json::Map<String, Value>, cluster: &str) -> bool {
        match self {
            When::UnlessSibling { key, value, then } => parent.get(key).and_then(Value::as_str) != Some(value) && then.holds(v, parent, cluster),
            When::NotApiInternalName => v.as_str().is_some_and(|v| v != crate::names::api_internal_dns(cluster)),
            When::Present => !v.is_null(),
            When::Enabled => v.get("enabled").and_then(Value::as_bool) == Some(true),
            When::NotDisabled => !v.is_null() && v.get("enabled").and_then(Value::as_bool) != Some(false),
            When::True => v.as_bool() == Some(true),
            When::False => v.as_bool() == Some(false),
            When::Equals(s) => v.as_str() == Some(s),
            When::NotEquals(s) => v.as_str().is_some_and(|v| v != s),
            When::UnservedCloud => v.as_str().and_then(crate::CloudProvider::parse).is_some_and(|c| !c.served()),
        }
    }
}

/// One field of one generated type (`ty` is the Rust type name in `api/src/generated.rs`, `key`
/// the json key).
#[derive(Debug, Clone, Copy)]
pub struct Field {
    pub ty: &'static str,
    pub key: &'static str,
    pub used: Use,
}

/// The types whose every field (walked recursively into generated types not consumed whole) the
/// classification test requires to be classified: the whole spec.
pub const COVERED_ROOTS: &[&str] = &["ClusterSpec", "InstanceGroupSpec"];

const fn f(ty: &'static str, key: &'static str, used: Use) -> Field {
    Field { ty, key, used }
}

/// A field not rendered whenever it is set.
const fn nr(ty: &'static str, key: &'static str, reason: &'static str) -> Field {
    Field { ty, key, used: Use::NotRendered { when: When::Present, reason } }
}

/// A field not rendered when `when` holds.
const fn nr_if(ty: &'static str, key: &'static str, when: When, reason: &'static str) -> Field {
    Field { ty, key, used: Use::NotRendered { when, reason } }
}

/// Every field classified by a table (the flag-tagged fields of the control-plane components are
/// classified by [`flag_table`] instead: [`classify`]).
pub fn all() -> impl Iterator<Item = &'static Field> {
    KUBELET
        .iter()
        .chain(NETWORKING)
        .chain(FLANNEL)
        .chain(ADDONS)
        .chain(METRICS_SERVER)
        .chain(CLUSTER_AUTOSCALER)
        .chain(KUBE_DNS)
        .chain(EXTERNAL_DNS)
        .chain(DISCOVERY)
        .chain(COMPONENTS)
        .chain(RUNTIME)
        .chain(CLUSTER)
        .chain(CLOUD)
        .chain(GROUPS)
}

/// The control-plane component specs nodeup renders flags for: (type, component, flag table).
pub const FLAG_TABLES: &[(&str, &str, &[FlagSpec])] = &[
    ("KubeAPIServerConfig", "kube-apiserver", flag_table::KUBE_APISERVER_CONFIG),
    ("KubeControllerManagerConfig", "kube-controller-manager", flag_table::KUBE_CONTROLLER_MANAGER_CONFIG),
    ("KubeSchedulerConfig", "kube-scheduler", flag_table::KUBE_SCHEDULER_CONFIG),
    ("KubeProxyConfig", "kube-proxy", flag_table::KUBE_PROXY_CONFIG),
    // `leaderElection` of the controller-manager and the scheduler (a nested table).
    ("LeaderElectionConfiguration", "kube-controller-manager, kube-scheduler", flag_table::LEADER_ELECTION_CONFIGURATION),
];

/// How the field `key` of the generated type `ty` is used, if classified: the tables first, then
/// the component's flag.
pub fn classify(ty: &str, key: &str) -> Option<Use> {
    if let Some(f) = all().find(|f| f.ty == ty && f.key == key) {
        return Some(f.used);
    }
    let (_, component, table) = FLAG_TABLES.iter().find(|(t, _, _)| *t == ty)?;
    table.iter().find(|s| s.key == key && !matches!(s.kind, FlagKind::Nested(_))).map(|s| Use::ComponentFlag { component, flag: s.flag })
}

/// `registerSchedulable` is a kubelet flag up to Kubernetes 1.33 (kOps sets it there); the 1.34
/// kubelet has no such flag.
pub const REGISTER_SCHEDULABLE_GONE: (u64, u64) = (1, 34);

/// Fields a component accepts up to a Kubernetes version and refuses from it on:
/// (type, key, first version without it, message).
pub const VERSION_BOUND: &[(&str, &str, (u64, u64), &str)] = &[
    (
        "KubeletConfigSpec",
        "registerSchedulable",
        REGISTER_SCHEDULABLE_GONE,
        "the kubelet has no --register-schedulable flag from Kubernetes 1.34 on (use taints); remove it",
    ),
    (
        "KubeAPIServerConfig",
        "cloudProvider",
        (1, 33),
        "kube-apiserver has no --cloud-provider flag from Kubernetes 1.33 on (kOps sets it only before); remove it",
    ),
];

/// Where the types with refusals sit in the documents: (document kind, json path from the spec,
/// type). A list on the way is walked item by item. `api/tests/support.rs` checks that every place
/// the spec can hold such a type is here.
pub const PLACES: &[(&str, &str, &str)] = &[
    ("Cluster", "", "ClusterSpec"),
    ("Cluster", "kubelet", "KubeletConfigSpec"),
    ("Cluster", "masterKubelet", "KubeletConfigSpec"),
    ("Cluster", "networking", "NetworkingSpec"),
    ("Cluster", "networking.flannel", "FlannelNetworkingSpec"),
    ("Cluster", "kubeDNS", "KubeDNSConfig"),
    ("Cluster", "metricsServer", "MetricsServerConfig"),
    ("Cluster", "externalDns", "ExternalDNSConfig"),
    ("Cluster", "kubeAPIServer", "KubeAPIServerConfig"),
    ("Cluster", "kubeControllerManager", "KubeControllerManagerConfig"),
    ("Cluster", "kubeScheduler", "KubeSchedulerConfig"),
    ("Cluster", "cloudControllerManager", "CloudControllerManagerConfig"),
    ("Cluster", "etcdClusters", "EtcdClusterSpec"),
    ("Cluster", "etcdClusters.backups", "EtcdBackupSpec"),
    ("Cluster", "etcdClusters.manager", "EtcdManagerSpec"),
    ("Cluster", "containerd", "ContainerdConfig"),
    ("Cluster", "containerd.runc", "Runc"),
    ("Cluster", "cloudConfig", "CloudConfiguration"),
    ("Cluster", "ntp", "NTPConfig"),
    ("Cluster", "topology", "TopologySpec"),
    ("Cluster", "api.loadBalancer", "LoadBalancerAccessSpec"),
    ("Cluster", "api.loadBalancer.subnets", "LoadBalancerSubnetSpec"),
    ("Cluster", "subnets", "ClusterSubnetSpec"),
    ("Cluster", "authentication", "AuthenticationSpec"),
    ("Cluster", "iam", "IAMSpec"),
    ("Cluster", "target", "TargetSpec"),
    ("InstanceGroup", "", "InstanceGroupSpec"),
    ("InstanceGroup", "kubelet", "KubeletConfigSpec"),
    ("InstanceGroup", "containerd", "ContainerdConfig"),
    ("InstanceGroup", "containerd.runc", "Runc"),
    ("InstanceGroup", "mixedInstancesPolicy", "MixedInstancesPolicySpec"),
];

/// A refused field of a spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub error: ValidationError,
    /// `false`: refused by every command; `true`: [`Use::NotRendered`] (compile warns).
    pub not_rendered: bool,
}

/// The values at `path` (dotted json keys) under `value`, each with its path from `base`; a list
/// on the way is walked item by item (`[name]` when the item has a name, else `[index]`).
fn resolve(value: &Value, base: &str, path: &str) -> Vec<(String, Value)> {
    let mut here = vec![(base.to_string(), value.clone())];
    for key in path.split('.').filter(|k| !k.is_empty()) {
        let mut next = Vec::new();
        for (p, v) in here {
            match v.get(key) {
                Some(Value::Array(items)) => {
                    for (i, item) in items.iter().enumerate() {
                        let label = item.get("name").and_then(Value::as_str).map(str::to_string).unwrap_or_else(|| i.to_string());
                        next.push((format!("{p}.{key}[{label}]"), item.clone()));
                    }
                }
                Some(v) if !v.is_null() => next.push((format!("{p}.{key}"), v.clone())),
                _ => {}
            }
        }
        here = next;
    }
    here
}

/// Where each type with refusals sits in a document: (document, type, json path, value).
fn locations(docs: &Documents) -> Vec<(String, &'static str, String, Value)> {
    let mut out = Vec::new();
    let cluster_doc = format!("Cluster/{}", docs.cluster.name());
    let cluster = serde_json::to_value(&docs.cluster.spec).unwrap_or(Value::Null);
    let groups: Vec<(String, Value)> = docs
        .instance_groups
        .iter()
        .map(|ig| (format!("InstanceGroup/{}", ig.metadata.name.as_deref().unwrap_or_default()), serde_json::to_value(&ig.spec).unwrap_or(Value::Null)))
        .collect();
    for (kind, path, ty) in PLACES {
        let docs: Vec<(&String, &Value)> = if *kind == "Cluster" { vec![(&cluster_doc, &cluster)] } else { groups.iter().map(|(d, v)| (d, v)).collect() };
        for (doc, spec) in docs {
            for (p, v) in resolve(spec, "spec", path) {
                out.push((doc.clone(), *ty, p, v));
            }
        }
    }
    out
}

/// Call `f` for every field the spec sets (not null) in a type this module classifies: its
/// document, type, path, key, value and the object holding it.
fn each_set_field(docs: &Documents, mut f: impl FnMut(&str, &'static str, String, &str, &Value, &serde_json::Map<String, Value>)) {
    for (doc, ty, base, value) in locations(docs) {
        let Some(object) = value.as_object() else { continue };
        for (key, v) in object.iter().filter(|(_, v)| !v.is_null()) {
            f(&doc, ty, format!("{base}.{key}"), key, v, object);
        }
    }
}

/// Every refused field the spec sets, each naming its document and path.
pub fn refusals(docs: &Documents) -> Vec<Refusal> {
    let version = docs.cluster.spec.kubernetes_version.as_ref();
    let mut out = Vec::new();
    each_set_field(docs, |doc, ty, path, key, v, object| {
        let gone = VERSION_BOUND.iter().find(|(t, k, (major, minor), _)| *t == ty && *k == key && version.is_some_and(|v| v.at_least(*major, *minor)));
        let (message, not_rendered) = match (gone, classify(ty, key)) {
            (Some((_, _, _, message)), _) => (message.to_string(), false),
            (None, Some(Use::Refused(reason))) => (reason.to_string(), false),
            (None, Some(Use::NotRendered { when, reason })) if when.holds(v, object, docs.cluster.name()) => (reason.to_string(), true),
            _ => return,
        };
        out.push(Refusal { error: ValidationError { document: doc.to_string(), path, message }, not_rendered });
    });
    out
}

/// The [`Use::DroppedByKops`] fields the spec sets, each with its reason: warnings of every
/// command that reads the spec (kOps drops them without a word).
pub fn dropped(docs: &Documents) -> Vec<ValidationError> {
    let mut out = Vec::new();
    each_set_field(docs, |doc, ty, path, key, _, _| {
        if let Some(Use::DroppedByKops(reason)) = classify(ty, key) {
            out.push(ValidationError { document: doc.to_string(), path, message: reason.to_string() });
        }
    });
    out
}

/// The [`Use::NotRendered`] fields the spec turns on: refused by `keelson validate` and the
/// commands that build a cluster, a warning from `keelson compile`.
pub fn not_rendered(docs: &Documents) -> Vec<ValidationError> {
    refusals(docs).into_iter().filter(|x| x.not_rendered).map(|x| x.error).collect()
}
