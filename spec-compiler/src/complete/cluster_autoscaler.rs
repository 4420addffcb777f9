//! `spec.clusterAutoscaler` defaults (kOps `pkg/model/components/clusterautoscaler.go`), filled only
//! when `enabled` is true: the image for the Kubernetes minor (the versions table), the `random`
//! expander and the scale-down settings cluster-autoscaler's addon passes as flags.
//!
//! One difference: kOps sets `createPriorityExpanderConfig: true` whenever the expander is
//! `priority`, over a user's `false`; here the user's value wins (as for every other field), and an
//! unset one becomes `true` with the priority expander.

use keelson_api::ClusterSpec;

use super::{default, Context, Derived};
use crate::versions::cluster_autoscaler_image;

pub fn build(ctx: &Context, _d: &Derived, spec: &mut ClusterSpec) {
    let Some(cas) = spec.cluster_autoscaler.as_mut().filter(|c| c.enabled == Some(true)) else { return };
    default(&mut cas.image, cluster_autoscaler_image(&ctx.version).to_string());
    if cas.expander.as_deref().unwrap_or("").is_empty() {
        cas.expander = Some("random".into());
    }
    default(&mut cas.ignore_daemon_sets_utilization, false);
    default(&mut cas.scale_down_utilization_threshold, "0.5".into());
    default(&mut cas.skip_nodes_with_custom_controller_pods, true);
    default(&mut cas.skip_nodes_with_local_storage, true);
    default(&mut cas.skip_nodes_with_system_pods, true);
    default(&mut cas.balance_similar_node_groups, false);
    default(&mut cas.emit_per_nodegroup_metrics, false);
    default(&mut cas.aws_use_static_instance_list, false);
    default(&mut cas.new_pod_scale_up_delay, "0s".into());
    default(&mut cas.scale_down_delay_after_add, "10m0s".into());
    default(&mut cas.scale_down_unneeded_time, "10m0s".into());
    default(&mut cas.scale_down_unready_time, "20m0s".into());
    if cas.max_node_provision_time.as_deref().unwrap_or("").is_empty() {
        cas.max_node_provision_time = Some("15m0s".into());
    }
    if cas.expander.as_deref() == Some("priority") {
        default(&mut cas.create_priority_expander_config, true);
    }
}

#[cfg(test)]
mod tests {
    use keelson_api::ClusterAutoscalerConfig;

    fn complete(yaml_extra: &str, version: &str) -> Option<ClusterAutoscalerConfig> {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/ha.yaml")).expect("examples/ha.yaml");
        let text =
            text.replacen("kubernetesVersion: 1.34.4", &format!("kubernetesVersion: {version}"), 1).replacen("spec:\n", &format!("spec:\n{yaml_extra}"), 1);
        let docs = keelson_api::parse_documents(text.as_bytes()).expect("parse");
        crate::complete::complete(&docs, &crate::CompileOptions::default()).expect("complete").spec.cluster_autoscaler
    }

    #[test]
    fn enabled_gets_kops_defaults() {
        let c = complete("  clusterAutoscaler:\n    enabled: true\n", "1.34.4").expect("kept");
        assert_eq!(c.image.as_deref(), Some("registry.k8s.io/autoscaling/cluster-autoscaler:v1.34.4"));
        assert_eq!(c.expander.as_deref(), Some("random"));
        assert_eq!(c.scale_down_utilization_threshold.as_deref(), Some("0.5"));
        assert_eq!(
            (c.scale_down_delay_after_add.as_deref(), c.scale_down_unneeded_time.as_deref(), c.scale_down_unready_time.as_deref()),
            (Some("10m0s"), Some("10m0s"), Some("20m0s"))
        );
        assert_eq!((c.new_pod_scale_up_delay.as_deref(), c.max_node_provision_time.as_deref()), (Some("0s"), Some("15m0s")));
        assert_eq!(
            (c.skip_nodes_with_system_pods, c.skip_nodes_with_local_storage, c.skip_nodes_with_custom_controller_pods),
            (Some(true), Some(true), Some(true))
        );
        assert_eq!((c.balance_similar_node_groups, c.emit_per_nodegroup_metrics, c.aws_use_static_instance_list), (Some(false), Some(false), Some(false)));
        assert_eq!(c.create_priority_expander_config, None, "only with the priority expander");
        assert_eq!(c.cordon_node_before_terminating, None, "kOps leaves it unset (the template reads unset as true)");
    }

    #[test]
    fn user_values_win_and_the_image_follows_the_minor() {
        let c = complete("  clusterAutoscaler:\n    enabled: true\n    expander: priority\n    scaleDownUnneededTime: 1m0s\n", "1.35.0").expect("kept");
        assert_eq!(c.image.as_deref(), Some("registry.k8s.io/autoscaling/cluster-autoscaler:v1.35.1"));
        assert_eq!((c.expander.as_deref(), c.scale_down_unneeded_time.as_deref()), (Some("priority"), Some("1m0s")));
        assert_eq!(c.create_priority_expander_config, Some(true));
        let c = complete("  clusterAutoscaler:\n    enabled: true\n    image: r.example/ca:v1\n", "1.36.0").expect("kept");
        assert_eq!(c.image.as_deref(), Some("r.example/ca:v1"));
        assert_eq!(crate::versions::cluster_autoscaler_image(&"1.37.1".parse().unwrap()), crate::versions::CLUSTER_AUTOSCALER_NEWEST_IMAGE);
    }

    #[test]
    fn disabled_is_left_alone() {
        assert_eq!(complete("", "1.34.4"), None);
        let c = complete("  clusterAutoscaler:\n    enabled: false\n", "1.34.4").expect("kept");
        assert_eq!(c, ClusterAutoscalerConfig { enabled: Some(false), ..Default::default() });
    }
}
