//! The rest of `ClusterSpec`: the cluster's identity and network, DNS and the API endpoint, IAM,
//! node files and hooks, and the cloud configuration.

use super::{f, nr, nr_if, Field, Use, When};
use Use::By;

const COMPILER: &str = "the compiler (spec-compiler/src/complete/)";
const NETWORK: &str = "the cloud model: the VPC and subnets (cloud-resources/src/model/network.rs)";
const FIREWALL: &str = "the cloud model: security-group rules (cloud-resources/src/firewall.rs)";
const IAM: &str = "the cloud model: IAM roles and policies (cloud-resources/src/model/iam.rs, iam_policy.rs)";
const LB: &str = "the cloud model: the API load balancer (cloud-resources/src/model/load_balancer.rs)";
const GOSSIP: &str = "Keelson runs no gossip mesh (kOps' gossip DNS): this setting has no effect; remove it";
const NO_CLOUD: &str = "Keelson runs on AWS and GCE only: this cloud's settings have no effect; remove them";
const AWS_CLOUD_CONFIG: &str = "Keelson does not write the AWS cloud provider's cloud.config yet: this setting has no effect";
const GCE_NODE_CONFIG: &str = "nodeup does not write GCE's cloud.config yet: this setting has no effect";
const GCE_CCM_CONFIG: &str = "the GCE cloud-controller-manager's cloud config (spec-compiler/src/addons/gce_ccm.rs)";

/// `ClusterSpec` fields not covered by the other tables, and the types under them.
pub static CLUSTER: &[Field] = &[
    f("ClusterSpec", "channel", By("nothing to render: kOps reads the channel only to recommend versions (`kops upgrade`); Keelson's versions table decides")),
    f("ClusterSpec", "addons", By("the compiler: the addon channels are rendered with the cluster's addons (spec-compiler/src/addons.rs)")),
    f("ClusterSpec", "configBase", By("the compiler, nodeup, protokube and the CLI: the state store")),
    // Consumed by the compiler on every cloud; the clouds without cloud tasks are refused by the
    // rule `apply` uses (CloudProvider::served).
    nr_if(
        "ClusterSpec",
        "cloudProvider",
        When::UnservedCloud,
        "Keelson builds clusters on aws and gce only (cloud-resources has no tasks for this cloud); the spec compiles as kOps would",
    ),
    nr("ClusterSpec", "gossipConfig", GOSSIP),
    nr_if("ClusterSpec", "containerRuntime", When::NotEquals("containerd"), "Keelson runs containerd only; remove it or set containerd"),
    f("ClusterSpec", "kubernetesVersion", By("the compiler: the versions table")),
    f("ClusterSpec", "project", By("the GCE cloud model, nodeup and protokube: the GCP project")),
    f("ClusterSpec", "masterPublicName", By("the API's DNS record and the API server certificate's names")),
    // kOps too leaves it unused (v1alpha2: "MasterInternalName is unused"): its default, the name
    // Keelson uses, is accepted.
    nr_if(
        "ClusterSpec",
        "masterInternalName",
        When::NotApiInternalName,
        "Keelson always uses api.internal.<cluster> (kOps' default): another internal name is not used; remove it",
    ),
    f("ClusterSpec", "networkCIDR", By(NETWORK)),
    nr("ClusterSpec", "additionalNetworkCIDRs", "Keelson does not associate additional CIDR blocks with the VPC yet"),
    f("ClusterSpec", "networkID", By(NETWORK)),
    f("ClusterSpec", "secretStore", By("the compiler: nodeup's config store")),
    f("ClusterSpec", "keyStore", By("the compiler: nodeup's config store")),
    nr("ClusterSpec", "configStore", "Keelson keeps the cluster's configuration at configBase: configStore is not used; remove it"),
    f("ClusterSpec", "dnsZone", By("the cloud model's DNS records and protokube")),
    nr("ClusterSpec", "dnsControllerGossipConfig", GOSSIP),
    f("ClusterSpec", "additionalSans", By("nodeup: the API server certificate's names")),
    f("ClusterSpec", "clusterDNSDomain", By(COMPILER)),
    f("ClusterSpec", "serviceClusterIPRange", By(COMPILER)),
    f("ClusterSpec", "podCIDR", By(COMPILER)),
    f("ClusterSpec", "nonMasqueradeCIDR", By(COMPILER)),
    f("ClusterSpec", "sshAccess", By(FIREWALL)),
    nr("ClusterSpec", "nodePortAccess", "Keelson does not open the NodePort range to these CIDRs yet"),
    nr("ClusterSpec", "egressProxy", "Keelson does not configure nodes for an egress proxy yet"),
    f("ClusterSpec", "sshKeyName", By("the cloud model: the launch templates' EC2 key pair (an existing one; empty: none)")),
    f("ClusterSpec", "kubernetesApiAccess", By(FIREWALL)),
    f("ClusterSpec", "isolateMasters", By("the compiler: no kube-proxy on control planes")),
    nr_if("ClusterSpec", "updatePolicy", When::NotEquals("external"), "nodeup does not install automatic OS updates (it behaves as `external`)"),
    f("ClusterSpec", "externalPolicies", By(IAM)),
    f("ClusterSpec", "additionalPolicies", By(IAM)),
    f("ClusterSpec", "fileAssets", By("nodeup: files written on the hosts of the listed roles")),
    nr_if("NTPConfig", "managed", When::True, "Keelson does not install or configure an NTP daemon (the image's is used)"),
    f("ClusterSpec", "packages", By("nodeup: installed with apt (Debian family) before the kubelet and containerd start")),
    f("ClusterSpec", "authorization", By("the compiler: kube-apiserver's --authorization-mode (RBAC or AlwaysAllow)")),
    nr("ClusterSpec", "nodeAuthorization", "Keelson does not run kOps' node authorizer"),
    f("ClusterSpec", "cloudLabels", By("the cloud model: tags on every resource")),
    f("ClusterSpec", "hooks", By("nodeup: hook units (nodeup/src/render/hooks.rs)")),
    f("ClusterSpec", "assets", By("the compiler and protokube: images and files from the given registry, repository or proxy")),
    f("ClusterSpec", "encryptionConfig", By("nodeup: kube-apiserver's encryption provider config; apply creates the secret")),
    nr_if("ClusterSpec", "DisableSubnetTags", When::True, "Keelson tags the subnets it uses: turning that off is not supported yet"),
    nr_if("ClusterSpec", "useHostCertificates", When::True, "Keelson does not mount the host's CA certificates into the components yet"),
    f("ClusterSpec", "sysctlParameters", By("nodeup: appended to /etc/sysctl.d/99-k8s-general.conf after the group's (api/src/nodeup.rs sysctl_parameters)")),
    f("ClusterSpec", "rollingUpdate", By("rolling-update (ops/src/rolling.rs, surge.rs): maxSurge, maxUnavailable, drainAndTerminate")),
    nr("ClusterSpec", "serviceOIDCProvider", "Keelson does not use an external service-account OIDC provider yet"),
    // subnets
    f("ClusterSubnetSpec", "name", By(NETWORK)),
    f("ClusterSubnetSpec", "zone", By(NETWORK)),
    f("ClusterSubnetSpec", "region", By(NETWORK)),
    f("ClusterSubnetSpec", "cidr", By(NETWORK)),
    nr("ClusterSubnetSpec", "ipv6CIDR", "Keelson does not give subnets IPv6 CIDRs yet"),
    f("ClusterSubnetSpec", "id", By(NETWORK)),
    f("ClusterSubnetSpec", "egress", By(NETWORK)),
    f("ClusterSubnetSpec", "type", By(NETWORK)),
    nr("ClusterSubnetSpec", "publicIP", "Keelson allocates the NAT gateway's Elastic IP itself: a given one is not used yet"),
    nr("ClusterSubnetSpec", "additionalRoutes", "Keelson does not add extra routes to the subnets' route tables yet"),
    // topology
    nr("TopologySpec", "masters", "Keelson takes the topology from the subnets' types: this field is not used; remove it"),
    nr("TopologySpec", "nodes", "Keelson takes the topology from the subnets' types: this field is not used; remove it"),
    nr("TopologySpec", "bastion", "Keelson does not render the bastion's load balancer or DNS name yet (a Bastion instance group still runs)"),
    f("TopologySpec", "dns", By("the cloud model's DNS (Route53 public/private or none) and protokube")),
    // the API endpoint
    f("APISpec", "dns", By("the cloud model: the API's DNS records")),
    f("LoadBalancerAccessSpec", "class", By(LB)),
    f("LoadBalancerAccessSpec", "type", By(LB)),
    nr("LoadBalancerAccessSpec", "idleTimeoutSeconds", "Keelson does not set the API load balancer's idle timeout yet"),
    f("LoadBalancerAccessSpec", "securityGroupOverride", By(LB)),
    f("LoadBalancerAccessSpec", "additionalSecurityGroups", By(LB)),
    f("LoadBalancerAccessSpec", "useForInternalApi", By(LB)),
    f("LoadBalancerAccessSpec", "sslCertificate", By(LB)),
    nr("LoadBalancerAccessSpec", "sslPolicy", "Keelson does not set the API load balancer's TLS policy yet"),
    f("LoadBalancerAccessSpec", "crossZoneLoadBalancing", By(LB)),
    nr("LoadBalancerAccessSpec", "accessLog", "Keelson does not turn on the API load balancer's access logs yet"),
    f("LoadBalancerSubnetSpec", "name", By(LB)),
    nr("LoadBalancerSubnetSpec", "privateIPv4Address", "Keelson does not pin the API load balancer's private address yet"),
    nr("LoadBalancerSubnetSpec", "allocationId", "Keelson does not attach Elastic IPs to the API load balancer yet"),
    // authentication, IAM, targets
    nr("AuthenticationSpec", "kopeio", "Keelson does not render kopeio's authentication webhook"),
    nr("AuthenticationSpec", "aws", "Keelson does not render aws-iam-authenticator yet"),
    nr_if("IAMSpec", "legacy", When::True, "Keelson writes kOps' scoped IAM policies: the legacy (broad) ones are not supported"),
    f("IAMSpec", "allowContainerRegistry", By(IAM)),
    f("IAMSpec", "permissionsBoundary", By(IAM)),
    f(
        "IAMSpec",
        "useServiceAccountExternalPermissions",
        By("the compiler puts Keelson's cloud-calling addons on roles of their own (spec-compiler/src/addons/irsa.rs); apply makes the roles and leaves their statements out of the control plane's (cloud-resources/src/iam_policy)"),
    ),
    f("IAMSpec", "serviceAccountExternalPermissions", By("apply: an IAM role per service account that its tokens assume through the issuer's OIDC provider (cloud-resources/src/model/iam.rs)")),
    nr("TargetSpec", "terraform", "Keelson's Terraform output does not take extra provider configuration yet"),
];

/// `CloudConfiguration` (spec.cloudConfig).
pub static CLOUD: &[Field] = &[
    f("CloudConfiguration", "manageStorageClasses", By("the aws-ebs-csi-driver addon's storage classes (spec-compiler/src/addons/aws_ebs_csi.rs)")),
    f("CloudConfiguration", "multizone", By(GCE_CCM_CONFIG)),
    f("CloudConfiguration", "nodeTags", By(GCE_CCM_CONFIG)),
    f("CloudConfiguration", "nodeInstancePrefix", By(GCE_CCM_CONFIG)),
    nr("CloudConfiguration", "nodeIPFamilies", GCE_NODE_CONFIG),
    nr_if(
        "CloudConfiguration",
        "gceServiceAccount",
        When::NotEquals("default"),
        "Keelson's GCE instances run as the project's default service account: another one is not used yet",
    ),
    f(
        "CloudConfiguration",
        "gceUseStartupScript",
        By("the GCE instance templates: the boot script under `startup-script` instead of `user-data` (cloud-resources/src/gce/)"),
    ),
    nr("CloudConfiguration", "disableSecurityGroupIngress", AWS_CLOUD_CONFIG),
    nr("CloudConfiguration", "elbSecurityGroup", AWS_CLOUD_CONFIG),
    nr("CloudConfiguration", "nlbSecurityGroupMode", AWS_CLOUD_CONFIG),
    nr("CloudConfiguration", "useIPBasedNodeNames", "Keelson does not switch AWS node names to IP-based names yet"),
    nr("CloudConfiguration", "vSphereUsername", NO_CLOUD),
    nr("CloudConfiguration", "vSpherePassword", NO_CLOUD),
    nr("CloudConfiguration", "vSphereServer", NO_CLOUD),
    nr("CloudConfiguration", "vSphereDatacenter", NO_CLOUD),
    nr("CloudConfiguration", "vSphereResourcePool", NO_CLOUD),
    nr("CloudConfiguration", "vSphereDatastore", NO_CLOUD),
    nr("CloudConfiguration", "vSphereCoreDNSServer", NO_CLOUD),
    nr("CloudConfiguration", "spotinstProduct", NO_CLOUD),
    nr("CloudConfiguration", "spotinstOrientation", NO_CLOUD),
    nr("CloudConfiguration", "openstack", NO_CLOUD),
    nr("CloudConfiguration", "azure", NO_CLOUD),
    f("CloudConfiguration", "awsEBSCSIDriver", By("the aws-ebs-csi-driver addon (spec-compiler/src/addons/aws_ebs_csi.rs)")),
    nr_if("CloudConfiguration", "gcpPDCSIDriver", When::Enabled, "Keelson does not render the GCE persistent-disk CSI driver yet"),
];
