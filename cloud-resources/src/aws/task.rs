//! The typed tasks of the AWS target: one type per resource kind, used for both the desired state
//! (built from the model) and the actual state (read from the SDK). The plan compares their
//! [`Task::view`]s field by field; execution reads the typed values, never strings.

use std::collections::{BTreeMap, BTreeSet};

use crate::plan::{Kind, Resource};

use super::autoscaling::AutoscalingGroup;
use super::dns_record::DnsRecord;
use super::iam::{IamRole, InstanceProfile};
use super::launch_template::LaunchTemplate;
use super::load_balancer::{AliasRecord, LoadBalancer, TargetGroup};
use super::network::{Subnet, Vpc};
use super::routing::{ElasticIp, InternetGateway, NatGateway, RouteTable};
use super::security_group::{SecurityGroup, SecurityGroupRule};
use super::volume::Volume;

/// A typed resource of the AWS target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Task {
    IamRole(IamRole),
    InstanceProfile(InstanceProfile),
    Vpc(Vpc),
    Subnet(Subnet),
    InternetGateway(InternetGateway),
    ElasticIp(ElasticIp),
    NatGateway(NatGateway),
    RouteTable(RouteTable),
    SecurityGroup(SecurityGroup),
    SecurityGroupRule(SecurityGroupRule),
    TargetGroup(TargetGroup),
    LoadBalancer(LoadBalancer),
    LaunchTemplate(LaunchTemplate),
    AutoscalingGroup(AutoscalingGroup),
    Volume(Volume),
    DnsRecord(DnsRecord),
    AliasRecord(AliasRecord),
}

/// The comparable attributes of a task, in the plan's vocabulary (names, not ids; hashes, not
/// user-data).
#[derive(Debug, Default)]
pub struct Fields(BTreeMap<String, String>);

impl Fields {
    pub fn set(&mut self, k: &str, v: impl ToString) -> &mut Fields {
        self.0.insert(k.to_string(), v.to_string());
        self
    }
    pub fn opt(&mut self, k: &str, v: Option<impl ToString>) -> &mut Fields {
        if let Some(v) = v {
            self.set(k, v);
        }
        self
    }
}

/// Sorted, comma-joined.
pub fn joined(items: &BTreeSet<String>) -> String {
    items.iter().cloned().collect::<Vec<_>>().join(",")
}

impl Task {
    pub fn kind(&self) -> Kind {
        match self {
            Task::IamRole(_) => Kind::IamRole,
            Task::InstanceProfile(_) => Kind::IamInstanceProfile,
            Task::Vpc(_) => Kind::Vpc,
            Task::Subnet(_) => Kind::Subnet,
            Task::InternetGateway(_) => Kind::InternetGateway,
            Task::ElasticIp(_) => Kind::ElasticIp,
            Task::NatGateway(_) => Kind::NatGateway,
            Task::RouteTable(_) => Kind::RouteTable,
            Task::SecurityGroup(_) => Kind::SecurityGroup,
            Task::SecurityGroupRule(_) => Kind::SecurityGroupRule,
            Task::TargetGroup(_) => Kind::TargetGroup,
            Task::LoadBalancer(_) => Kind::LoadBalancer,
            Task::LaunchTemplate(_) => Kind::LaunchTemplate,
            Task::AutoscalingGroup(_) => Kind::AutoscalingGroup,
            Task::Volume(_) => Kind::Volume,
            Task::DnsRecord(_) | Task::AliasRecord(_) => Kind::DnsRecord,
        }
    }

    fn name_and_fields(&self) -> (String, Fields, BTreeMap<String, String>) {
        let mut f = Fields::default();
        let (name, tags) = match self {
            Task::IamRole(t) => {
                t.fields(&mut f);
                (t.name.clone(), t.tags.clone())
            }
            Task::InstanceProfile(t) => {
                t.fields(&mut f);
                (t.name.clone(), t.tags.clone())
            }
            Task::Vpc(t) => {
                t.fields(&mut f);
                (t.name.clone(), t.tags.clone())
            }
            Task::Subnet(t) => {
                t.fields(&mut f);
                (t.name.clone(), t.tags.clone())
            }
            Task::InternetGateway(t) => {
                t.fields(&mut f);
                (t.name.clone(), t.tags.clone())
            }
            Task::ElasticIp(t) => {
                t.fields(&mut f);
                (t.name.clone(), t.tags.clone())
            }
            Task::NatGateway(t) => {
                t.fields(&mut f);
                (t.name.clone(), t.tags.clone())
            }
            Task::RouteTable(t) => {
                t.fields(&mut f);
                (t.name.clone(), t.tags.clone())
            }
            Task::SecurityGroup(t) => {
                t.fields(&mut f);
                (t.name.clone(), t.tags.clone())
            }
            Task::SecurityGroupRule(t) => {
                t.fields(&mut f);
                (t.rule.name(), BTreeMap::new())
            }
            Task::LaunchTemplate(t) => {
                t.fields(&mut f);
                (t.name.clone(), t.tags.clone())
            }
            Task::AutoscalingGroup(t) => {
                t.fields(&mut f);
                (t.name.clone(), t.tags.clone())
            }
            Task::Volume(t) => {
                t.fields(&mut f);
                (t.name.clone(), t.tags.clone())
            }
            Task::DnsRecord(t) => {
                t.fields(&mut f);
                (t.name.clone(), BTreeMap::new())
            }
            Task::AliasRecord(t) => {
                t.fields(&mut f);
                (t.name.clone(), BTreeMap::new())
            }
            Task::TargetGroup(t) => {
                t.fields(&mut f);
                (t.name.clone(), t.tags.clone())
            }
            Task::LoadBalancer(t) => {
                t.fields(&mut f);
                (t.name.clone(), t.tags.clone())
            }
        };
        (name, f, tags)
    }

    /// The plan's view of this task; `id` is the cloud id of an actual resource.
    pub fn view(self, id: Option<String>) -> Resource {
        let (name, fields, tags) = self.name_and_fields();
        Resource { kind: Some(self.kind()), name, attrs: fields.0, tags, id, task: Some(Box::new(self)) }
    }
}

/// `fn $name(t: &Task) -> Option<&$ty>`: the typed state of one variant (for [`typed`]).
macro_rules! picker {
    ($name:ident, $variant:ident, $ty:ty) => {
        fn $name(t: &$crate::aws::task::Task) -> Option<&$ty> {
            if let $crate::aws::task::Task::$variant(x) = t {
                Some(x)
            } else {
                None
            }
        }
    };
}
pub(crate) use picker;

/// The typed desired/actual state of a change, or an error naming what is missing.
pub fn typed<'a, T>(r: Option<&'a Resource>, kind: Kind, name: &str, side: &str, pick: impl Fn(&'a Task) -> Option<&'a T>) -> Result<&'a T, super::AwsError> {
    r.and_then(|r| r.task.as_deref()).and_then(pick).ok_or_else(|| super::AwsError::Missing {
        kind: kind.as_str(),
        name: name.to_string(),
        message: format!("the plan holds no typed {side} state for it"),
    })
}

/// The cloud id of the actual side of a change.
pub fn actual_id(r: Option<&Resource>, kind: Kind, name: &str) -> Result<String, super::AwsError> {
    r.and_then(|r| r.id.clone()).ok_or_else(|| super::AwsError::Missing {
        kind: kind.as_str(),
        name: name.to_string(),
        message: "no cloud id was discovered for it".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws::Volume;

    fn volume() -> Volume {
        Volume {
            name: "a.etcd-main.c".into(),
            zone: "eu-west-1a".into(),
            size_gib: 20,
            volume_type: "gp3".into(),
            encrypted: true,
            iops: None,
            throughput: Some(125),
            kms_key_id: None,
            tags: BTreeMap::from([("Name".to_string(), "a.etcd-main.c".to_string())]),
        }
    }

    #[test]
    fn a_view_shows_the_typed_fields_and_keeps_the_task() {
        let r = Task::Volume(volume()).view(Some("vol-1".into()));
        assert_eq!(r.kind(), Kind::Volume);
        assert_eq!(r.name, "a.etcd-main.c");
        let attrs: Vec<(&str, &str)> = r.attrs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(attrs, [("encrypted", "true"), ("size", "20"), ("throughput", "125"), ("type", "gp3"), ("zone", "eu-west-1a")]);
        assert_eq!(r.tags.get("Name").map(String::as_str), Some("a.etcd-main.c"));
        assert!(matches!(r.task.as_deref(), Some(Task::Volume(v)) if *v == volume()));
    }

    #[test]
    fn missing_typed_state_or_id_is_an_error_naming_the_resource() {
        let untyped = Resource::new(Kind::Volume, "a.etcd-main.c");
        fn pick(t: &Task) -> Option<&Volume> {
            if let Task::Volume(v) = t {
                Some(v)
            } else {
                None
            }
        }
        let e = typed(Some(&untyped), Kind::Volume, "a.etcd-main.c", "desired", pick).expect_err("no task");
        assert!(e.to_string().contains("Volume a.etcd-main.c"), "{e}");
        let e = actual_id(Some(&Task::Volume(volume()).view(None)), Kind::Volume, "a.etcd-main.c").expect_err("no id");
        assert!(e.to_string().contains("Volume a.etcd-main.c") && e.to_string().contains("no cloud id"), "{e}");
    }
}
