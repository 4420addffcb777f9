//! `ClusterAutoscalerConfig` (spec.clusterAutoscaler) and the instance-group fields only the
//! cluster-autoscaler reads: kOps' cluster-autoscaler addon (`cluster-autoscaler.addons.k8s.io`,
//! spec-compiler/src/addons/cluster_autoscaler.rs), every field a flag, a pod setting or the priority
//! expander's ConfigMap. Their values are checked with their paths by [`crate::addon_rules`].

use super::{f, Field, Use};
use Use::By;

const ADDON: &str = "the cluster-autoscaler addon (spec-compiler/src/addons/cluster_autoscaler.rs)";
const FLAG: &str = "a cluster-autoscaler flag (spec-compiler/src/addons/cluster_autoscaler.rs)";

/// Every field of `ClusterAutoscalerConfig`, and `autoscale`/`autoscalePriority` of the groups.
pub static CLUSTER_AUTOSCALER: &[Field] = &[
    f("ClusterAutoscalerConfig", "enabled", By(ADDON)),
    f("ClusterAutoscalerConfig", "expander", By(FLAG)),
    f("ClusterAutoscalerConfig", "balanceSimilarNodeGroups", By(FLAG)),
    f("ClusterAutoscalerConfig", "emitPerNodegroupMetrics", By(FLAG)),
    f(
        "ClusterAutoscalerConfig",
        "awsUseStaticInstanceList",
        By("a cluster-autoscaler flag on AWS (the IAM policy keeps ec2:DescribeInstanceTypes: nodeup and the CCM call it too)"),
    ),
    f("ClusterAutoscalerConfig", "ignoreDaemonSetsUtilization", By(FLAG)),
    f("ClusterAutoscalerConfig", "scaleDownUtilizationThreshold", By(FLAG)),
    f("ClusterAutoscalerConfig", "skipNodesWithCustomControllerPods", By(FLAG)),
    f("ClusterAutoscalerConfig", "skipNodesWithSystemPods", By(FLAG)),
    f("ClusterAutoscalerConfig", "skipNodesWithLocalStorage", By(FLAG)),
    f("ClusterAutoscalerConfig", "newPodScaleUpDelay", By(FLAG)),
    f("ClusterAutoscalerConfig", "scaleDownDelayAfterAdd", By(FLAG)),
    f("ClusterAutoscalerConfig", "scaleDownUnneededTime", By(FLAG)),
    f("ClusterAutoscalerConfig", "scaleDownUnreadyTime", By(FLAG)),
    f("ClusterAutoscalerConfig", "cordonNodeBeforeTerminating", By(FLAG)),
    f("ClusterAutoscalerConfig", "image", By(ADDON)),
    f("ClusterAutoscalerConfig", "memoryRequest", By(ADDON)),
    f("ClusterAutoscalerConfig", "cpuRequest", By(ADDON)),
    f("ClusterAutoscalerConfig", "maxNodeProvisionTime", By(FLAG)),
    f("ClusterAutoscalerConfig", "podAnnotations", By(ADDON)),
    f("ClusterAutoscalerConfig", "createPriorityExpanderConfig", By("the cluster-autoscaler addon: the priority expander's ConfigMap")),
    f("ClusterAutoscalerConfig", "customPriorityExpanderConfig", By("the cluster-autoscaler addon: the priority expander's ConfigMap")),
    f("InstanceGroupSpec", "autoscale", By("the cluster-autoscaler addon: a Node group is one of its --nodes unless false")),
    f("InstanceGroupSpec", "autoscalePriority", By("the cluster-autoscaler addon: the priority expander's ConfigMap")),
];
