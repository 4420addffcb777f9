//! Typed overlay of one spec on another, as kOps merges a role's or a group's settings over the
//! cluster's (e.g. an instance group's `kubelet` over the cluster `kubelet`).
//!
//! Field by field: an unset (`None`) field of the top keeps the base's value; set structs merge
//! recursively; maps merge key by key (values that are structs or maps recurse, other values are
//! replaced); everything else — scalars, strings, lists, enums and newtypes such as
//! [`Quantity`](crate::Quantity) — is replaced by the top's value. Free-form documents
//! (`serde_json::Value`) merge objects key by key and replace anything else.
//!
//! The impls for the generated API structs live in [`crate::generated`] (emitted by
//! `tools/gen_api_types.py`).

use std::collections::BTreeMap;

/// Overlay a value of the same type on `self`.
pub trait Merge {
    /// Merge `top` into `self`: what `top` sets wins, what it leaves unset keeps `self`'s value.
    fn merge_from(&mut self, top: &Self);

    /// `base` with `top` merged over it.
    fn merged(base: &Self, top: &Self) -> Self
    where
        Self: Clone + Sized,
    {
        let mut out = base.clone();
        out.merge_from(top);
        out
    }
}

impl<T: Merge + Clone> Merge for Option<T> {
    fn merge_from(&mut self, top: &Self) {
        match (self.as_mut(), top) {
            (_, None) => {}
            (Some(base), Some(top)) => base.merge_from(top),
            (None, Some(top)) => *self = Some(top.clone()),
        }
    }
}

impl<V: Merge + Clone> Merge for BTreeMap<String, V> {
    fn merge_from(&mut self, top: &Self) {
        for (k, v) in top {
            match self.get_mut(k) {
                Some(existing) => existing.merge_from(v),
                None => {
                    self.insert(k.clone(), v.clone());
                }
            }
        }
    }
}

/// Lists are replaced as a whole, never merged item by item.
impl<T: Clone> Merge for Vec<T> {
    fn merge_from(&mut self, top: &Self) {
        self.clone_from(top);
    }
}

/// Free-form documents: objects merge key by key, anything else is replaced.
impl Merge for serde_json::Value {
    fn merge_from(&mut self, top: &Self) {
        match (self, top) {
            (serde_json::Value::Object(base), serde_json::Value::Object(top)) => {
                for (k, v) in top {
                    match base.get_mut(k) {
                        Some(existing) => existing.merge_from(v),
                        None => {
                            base.insert(k.clone(), v.clone());
                        }
                    }
                }
            }
            (base, top) => base.clone_from(top),
        }
    }
}

/// Types whose values are replaced whole by the top's value.
macro_rules! replace {
    ($($ty:ty),* $(,)?) => {
        $(impl Merge for $ty {
            fn merge_from(&mut self, top: &Self) {
                self.clone_from(top);
            }
        })*
    };
}

replace!(
    String,
    bool,
    i64,
    u64,
    f64,
    crate::types::Quantity,
    crate::types::Duration,
    crate::types::IntOrString,
    crate::types::Cidr,
    crate::types::KubernetesVersion,
    crate::types::DnsName,
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ContainerdConfig, KubeletConfigSpec, NvidiaGPUConfig, Quantity};

    fn kubelet(yaml: &str) -> KubeletConfigSpec {
        serde_yaml_ng::from_str(yaml).expect("kubelet yaml")
    }

    #[test]
    fn none_keeps_base_and_some_replaces_scalars() {
        let base = kubelet("maxPods: 110\ncgroupDriver: systemd\nanonymousAuth: false\n");
        let top = kubelet("maxPods: 50\nanonymousAuth: true\n");
        let m = KubeletConfigSpec::merged(&base, &top);
        assert_eq!(m.max_pods, Some(50));
        assert_eq!(m.anonymous_auth, Some(true));
        assert_eq!(m.cgroup_driver.as_deref(), Some("systemd"), "unset in top keeps base");
        assert_eq!(KubeletConfigSpec::merged(&base, &KubeletConfigSpec::default()), base);
        assert_eq!(KubeletConfigSpec::merged(&KubeletConfigSpec::default(), &top), top);
    }

    #[test]
    fn maps_merge_key_by_key() {
        let base = kubelet("featureGates:\n  A: 'true'\n  B: 'true'\nnodeLabels:\n  x: '1'\n");
        let top = kubelet("featureGates:\n  B: 'false'\n  C: 'true'\n");
        let m = KubeletConfigSpec::merged(&base, &top);
        let gates: Vec<(&str, &str)> = m.feature_gates.iter().flatten().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(gates, [("A", "true"), ("B", "false"), ("C", "true")]);
        assert_eq!(m.node_labels, base.node_labels, "map unset in top keeps base");
    }

    #[test]
    fn lists_are_replaced_not_appended() {
        let base = kubelet("taints: [a:NoSchedule, b:NoSchedule]\n");
        let top = kubelet("taints: [c:NoExecute]\n");
        assert_eq!(KubeletConfigSpec::merged(&base, &top).taints, Some(vec!["c:NoExecute".to_string()]));
        let empty = kubelet("taints: []\n");
        assert_eq!(KubeletConfigSpec::merged(&base, &empty).taints, Some(vec![]), "an empty list is set");
    }

    #[test]
    fn nested_structs_recurse() {
        let base: ContainerdConfig =
            serde_yaml_ng::from_str("logLevel: info\nnvidiaGPU:\n  enabled: true\n  package: nvidia-driver-535-server\nrunc:\n  version: 1.1.0\n")
                .expect("yaml");
        let top: ContainerdConfig = serde_yaml_ng::from_str("nvidiaGPU:\n  package: custom\nrunc: {}\n").expect("yaml");
        let m = ContainerdConfig::merged(&base, &top);
        assert_eq!(m.log_level.as_deref(), Some("info"));
        assert_eq!(m.nvidia_gpu, Some(NvidiaGPUConfig { enabled: Some(true), package: Some("custom".into()), ..Default::default() }));
        assert_eq!(m.runc, base.runc, "an empty struct in top changes nothing");
    }

    #[test]
    fn newtypes_are_replaced() {
        let base = kubelet("shutdownGracePeriod: 30s\n");
        let top = kubelet("shutdownGracePeriod: 1m\n");
        assert_eq!(KubeletConfigSpec::merged(&base, &top).shutdown_grace_period.map(|d| d.to_string()).as_deref(), Some("1m0s"));
        let mut q: Quantity = "100m".parse().expect("quantity");
        q.merge_from(&"2Gi".parse().expect("quantity"));
        assert_eq!(q.as_str(), "2Gi");
    }

    #[test]
    fn free_form_documents_merge_objects() {
        let mut base = serde_json::json!({"a": {"x": 1, "y": [1, 2]}, "b": 1});
        base.merge_from(&serde_json::json!({"a": {"y": [3]}, "c": "new"}));
        assert_eq!(base, serde_json::json!({"a": {"x": 1, "y": [3]}, "b": 1, "c": "new"}));
    }

    /// The typed merge gives what the JSON round trip it replaced gave.
    #[test]
    fn agrees_with_the_json_deep_merge() {
        fn json_merge<T: serde::Serialize + serde::de::DeserializeOwned>(base: &T, top: &T) -> T {
            let mut b = serde_json::to_value(base).expect("to json");
            b.merge_from(&serde_json::to_value(top).expect("to json"));
            serde_json::from_value(b).expect("from json")
        }
        let base = kubelet("maxPods: 110\nfeatureGates: {A: 'true'}\ntaints: [a:NoSchedule]\nkubeReserved: {cpu: 100m}\nshutdownGracePeriod: 30s\n");
        let top = kubelet("featureGates: {B: 'false'}\ntaints: []\nkubeReserved: {memory: 1Gi}\nlogLevel: 4\n");
        assert_eq!(KubeletConfigSpec::merged(&base, &top), json_merge(&base, &top));
        assert_eq!(KubeletConfigSpec::merged(&top, &base), json_merge(&top, &base));
    }
}
