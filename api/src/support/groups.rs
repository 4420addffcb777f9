//! `InstanceGroupSpec`: the machines (launch template, autoscaling group, GCE instance template)
//! and what nodeup does on them.

use super::{f, nr, nr_if, Field, Use, When};
use Use::By;

const GROUP: &str = "the cloud model: the launch template and autoscaling group (cloud-resources/src/model/groups.rs)";
const MIXED: &str = "the cloud model: the autoscaling group's mixed instances policy";
const ROOT_VOLUME: &str = "kOps v1alpha2 drops the rootVolume block unread (it is v1alpha3's layout), and so does Keelson: the root volume stays as rootVolumeSize, rootVolumeType, rootVolumeIops, rootVolumeThroughput and rootVolumeEncryption say (set those to change it)";

/// `InstanceGroupSpec` and the types under it.
pub static GROUPS: &[Field] = &[
    nr_if("InstanceGroupSpec", "manager", When::Equals("Karpenter"), "Keelson does not render Karpenter: groups are autoscaling groups (manager CloudGroup)"),
    f("InstanceGroupSpec", "role", By("the compiler, nodeup and the cloud model")),
    f("InstanceGroupSpec", "image", By(GROUP)),
    f("InstanceGroupSpec", "minSize", By(GROUP)),
    f("InstanceGroupSpec", "maxSize", By(GROUP)),
    f("InstanceGroupSpec", "machineType", By(GROUP)),
    f("InstanceGroupSpec", "rootVolumeSize", By(GROUP)),
    f("InstanceGroupSpec", "rootVolumeType", By(GROUP)),
    f("InstanceGroupSpec", "rootVolumeIops", By(GROUP)),
    f("InstanceGroupSpec", "rootVolumeThroughput", By(GROUP)),
    nr_if("InstanceGroupSpec", "rootVolumeOptimization", When::True, "Keelson does not request EBS-optimized instances yet"),
    nr_if("InstanceGroupSpec", "rootVolumeDeleteOnTermination", When::False, "Keelson's root volumes are always deleted with their instance"),
    f("InstanceGroupSpec", "rootVolumeEncryption", By(GROUP)),
    f("InstanceGroupSpec", "rootVolumeEncryptionKey", By("the cloud model: the launch template's root volume KMS key (when rootVolumeEncryption is on)")),
    f("InstanceGroupSpec", "rootVolume", Use::DroppedByKops(ROOT_VOLUME)),
    nr("InstanceGroupSpec", "volumes", "Keelson does not attach additional volumes to the group's instances yet"),
    nr("InstanceGroupSpec", "volumeMounts", "nodeup does not format or mount additional volumes yet"),
    f("InstanceGroupSpec", "subnets", By(GROUP)),
    f("InstanceGroupSpec", "zones", By(GROUP)),
    f("InstanceGroupSpec", "hooks", By("nodeup: hook units (nodeup/src/render/hooks.rs)")),
    f("InstanceGroupSpec", "maxPrice", By(GROUP)),
    nr("InstanceGroupSpec", "spotDurationInMinutes", "spot blocks no longer exist on AWS; remove it"),
    f("InstanceGroupSpec", "cpuCredits", By(GROUP)),
    f("InstanceGroupSpec", "associatePublicIp", By(GROUP)),
    f("InstanceGroupSpec", "additionalSecurityGroups", By(GROUP)),
    f("InstanceGroupSpec", "cloudLabels", By("the cloud model: the group's tags")),
    f("InstanceGroupSpec", "nodeLabels", By("the compiler: the kubelet's --node-labels; the cloud model: the group's tags")),
    f("InstanceGroupSpec", "fileAssets", By("nodeup: files written on the group's hosts")),
    nr_if("InstanceGroupSpec", "tenancy", When::NotEquals("default"), "Keelson does not set the launch template's tenancy yet"),
    f("InstanceGroupSpec", "taints", By("the compiler: the kubelet's registerWithTaints; rolling-update's drain")),
    nr_if("InstanceGroupSpec", "capacityRebalance", When::True, "Keelson does not turn on the autoscaling group's capacity rebalancing yet"),
    f("InstanceGroupSpec", "additionalUserData", By("the compiler: parts of the group's user-data (spec-compiler/src/lib.rs)")),
    nr("InstanceGroupSpec", "suspendProcesses", "Keelson does not suspend autoscaling group processes yet"),
    f(
        "InstanceGroupSpec",
        "externalLoadBalancers",
        By("the cloud model: the autoscaling group's classic load balancer names and target group ARNs (checked by keelson_api::validate)"),
    ),
    nr_if("InstanceGroupSpec", "detailedInstanceMonitoring", When::True, "Keelson does not turn on detailed CloudWatch monitoring yet"),
    f("InstanceGroupSpec", "iam", By("the cloud model: the group's instance profile")),
    f("InstanceGroupSpec", "securityGroupOverride", By(GROUP)),
    f("InstanceGroupSpec", "instanceProtection", By("the cloud model: the autoscaling group's scale-in protection of new instances")),
    f(
        "InstanceGroupSpec",
        "sysctlParameters",
        By("nodeup: appended to /etc/sysctl.d/99-k8s-general.conf before the cluster's (api/src/nodeup.rs sysctl_parameters)"),
    ),
    f("InstanceGroupSpec", "rollingUpdate", By("rolling-update (ops/src/rolling.rs, surge.rs): maxSurge, maxUnavailable, drainAndTerminate")),
    f("InstanceGroupSpec", "instanceInterruptionBehavior", By(GROUP)),
    f("InstanceGroupSpec", "compressUserData", By("the compiler: the group's user-data")),
    f("InstanceGroupSpec", "instanceMetadata", By(GROUP)),
    nr_if("InstanceGroupSpec", "updatePolicy", When::NotEquals("external"), "nodeup does not install automatic OS updates (it behaves as `external`)"),
    f("InstanceGroupSpec", "packages", By("nodeup: installed with apt (Debian family) before the kubelet and containerd start")),
    nr("InstanceGroupSpec", "guestAccelerators", "Keelson does not attach GCE accelerators yet"),
    nr("InstanceGroupSpec", "maxInstanceLifetime", "Keelson does not set the autoscaling group's maximum instance lifetime yet"),
    nr("InstanceGroupSpec", "gcpProvisioningModel", "Keelson does not set the GCE provisioning model (Spot) yet"),
    f("MixedInstancesPolicySpec", "instances", By(MIXED)),
    nr("MixedInstancesPolicySpec", "instanceRequirements", "not supported by keelson apply yet; list spec.mixedInstancesPolicy.instances instead"),
    f("MixedInstancesPolicySpec", "onDemandAllocationStrategy", By(MIXED)),
    f("MixedInstancesPolicySpec", "onDemandBase", By(MIXED)),
    f("MixedInstancesPolicySpec", "onDemandAboveBase", By(MIXED)),
    f("MixedInstancesPolicySpec", "spotAllocationStrategy", By(MIXED)),
    f("MixedInstancesPolicySpec", "spotInstancePools", By(MIXED)),
];
