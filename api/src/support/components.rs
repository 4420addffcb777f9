//! The control-plane components beyond their flags (those are [`crate::flag_table`]'s): images,
//! resources, the flags no supported component has any more, and what kOps renders elsewhere
//! (kube-apiserver's OIDC flags and env); the cloud controller
//! manager; the etcd clusters.

use super::{f, nr, Field, Use};
use Use::{By, Refused};

const APISERVER_GONE: &str = "kube-apiserver has no such flag in the Kubernetes versions Keelson supports (removed upstream); remove it";
const KCM_GONE: &str = "kube-controller-manager has no such flag in the Kubernetes versions Keelson supports (removed upstream); remove it";
const IMAGE: &str = "nodeup: the component's static pod image";
const REQUEST: &str = "nodeup: the component's static pod resources.requests";
const LIMIT: &str = "nodeup: the component's static pod resources.limits";
const OIDC: &str = "nodeup: kube-apiserver's --oidc-* flags (kOps moves these v1alpha2 fields to authentication.oidc and renders the same flags)";
const CCM: &str = "the cloud-controller-manager addon (spec-compiler/src/addons/aws_ccm.rs; the GCE one from the same spec)";
const ETCD: &str = "protokube: it runs the etcd members (version, image, TLS, timing) and their backups";
const ETCD_VOLUME: &str = "the cloud model: the etcd member's volume (cloud-resources/src/model/volumes.rs)";
const ETCD_CLUSTER_VOLUME: &str = "not a field of kOps' etcd clusters: kOps drops it unread, and so does Keelson (the members' volumes keep their own settings); set it on each etcdMembers[] entry";
const NO_ETCD_MANAGER: &str = "Keelson runs etcd from protokube, not etcd-manager: this etcd-manager setting has no effect; remove it";

/// kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, the cloud controller
/// manager and the etcd clusters.
pub static COMPONENTS: &[Field] = &[
    // kube-apiserver: flags gone from every supported version (`--version` of the 1.34 binary
    // refuses them; all were removed before 1.32). `cloudProvider` is version-bound (VERSION_BOUND).
    f("KubeAPIServerConfig", "insecurePort", Refused(APISERVER_GONE)),
    f("KubeAPIServerConfig", "address", Refused(APISERVER_GONE)),
    f("KubeAPIServerConfig", "insecureBindAddress", Refused(APISERVER_GONE)),
    f("KubeAPIServerConfig", "basicAuthFile", Refused(APISERVER_GONE)),
    f("KubeAPIServerConfig", "authorizationRbacSuperUser", Refused(APISERVER_GONE)),
    f("KubeAPIServerConfig", "experimentalEncryptionProviderConfig", Refused(APISERVER_GONE)),
    f("KubeAPIServerConfig", "etcdQuorumRead", Refused(APISERVER_GONE)),
    f("KubeAPIServerConfig", "auditDynamicConfiguration", Refused(APISERVER_GONE)),
    f(
        "KubeAPIServerConfig",
        "disableBasicAuth",
        Refused("basic authentication was removed from kube-apiserver (Kubernetes 1.19); kOps ignores this field too; remove it"),
    ),
    f("KubeAPIServerConfig", "image", By(IMAGE)),
    f("KubeAPIServerConfig", "cpuRequest", By(REQUEST)),
    f("KubeAPIServerConfig", "memoryRequest", By(REQUEST)),
    f("KubeAPIServerConfig", "cpuLimit", By(LIMIT)),
    f("KubeAPIServerConfig", "memoryLimit", By(LIMIT)),
    f("KubeAPIServerConfig", "env", By("nodeup: the kube-apiserver container's env")),
    f("KubeAPIServerConfig", "appendAdmissionPlugins", By("the compiler: appended to enableAdmissionPlugins (--enable-admission-plugins)")),
    f("KubeAPIServerConfig", "oidcUsernameClaim", By(OIDC)),
    f("KubeAPIServerConfig", "oidcUsernamePrefix", By(OIDC)),
    f("KubeAPIServerConfig", "oidcGroupsClaim", By(OIDC)),
    f("KubeAPIServerConfig", "oidcGroupsPrefix", By(OIDC)),
    f("KubeAPIServerConfig", "oidcIssuerURL", By(OIDC)),
    f("KubeAPIServerConfig", "oidcClientID", By(OIDC)),
    f("KubeAPIServerConfig", "oidcRequiredClaim", By(OIDC)),
    nr("KubeAPIServerConfig", "additionalServiceAccountIssuers", "Keelson does not pass additional --service-account-issuer flags to kube-apiserver yet"),
    // kube-controller-manager
    f("KubeControllerManagerConfig", "podEvictionTimeout", Refused(KCM_GONE)),
    f("KubeControllerManagerConfig", "horizontalPodAutoscalerDownscaleDelay", Refused(KCM_GONE)),
    f("KubeControllerManagerConfig", "horizontalPodAutoscalerUpscaleDelay", Refused(KCM_GONE)),
    f("KubeControllerManagerConfig", "horizontalPodAutoscalerUseRestClients", Refused(KCM_GONE)),
    f("KubeControllerManagerConfig", "experimentalClusterSigningDuration", Refused(KCM_GONE)),
    f("KubeControllerManagerConfig", "image", By(IMAGE)),
    f("KubeControllerManagerConfig", "cpuRequest", By(REQUEST)),
    f("KubeControllerManagerConfig", "memoryRequest", By(REQUEST)),
    f("KubeControllerManagerConfig", "cpuLimit", By(LIMIT)),
    f("KubeControllerManagerConfig", "memoryLimit", By(LIMIT)),
    // kube-scheduler
    f("KubeSchedulerConfig", "image", By(IMAGE)),
    f("KubeSchedulerConfig", "cpuRequest", By(REQUEST)),
    f("KubeSchedulerConfig", "memoryRequest", By(REQUEST)),
    f("KubeSchedulerConfig", "cpuLimit", By(LIMIT)),
    f("KubeSchedulerConfig", "memoryLimit", By(LIMIT)),
    f(
        "KubeSchedulerConfig",
        "usePolicyConfigMap",
        Refused("kube-scheduler lost scheduling policies (Kubernetes 1.23); use a KubeSchedulerConfiguration in the spec's additional objects; remove it"),
    ),
    nr("KubeSchedulerConfig", "maxPersistentVolumes", "Keelson does not set kube-scheduler's KUBE_MAX_PD_VOLS yet"),
    nr("KubeSchedulerConfig", "qps", "Keelson does not write clientConnection.qps into kube-scheduler's configuration file yet"),
    nr("KubeSchedulerConfig", "burst", "Keelson does not write clientConnection.burst into kube-scheduler's configuration file yet"),
    // kube-proxy
    f("KubeProxyConfig", "image", By(IMAGE)),
    f("KubeProxyConfig", "cpuRequest", By(REQUEST)),
    f("KubeProxyConfig", "memoryRequest", By(REQUEST)),
    f("KubeProxyConfig", "cpuLimit", By(LIMIT)),
    f("KubeProxyConfig", "memoryLimit", By(LIMIT)),
    f("KubeProxyConfig", "enabled", By("the compiler: no kube-proxy static pod when false (spec-compiler/src/nodeup_config.rs)")),
    // The cloud controller manager: an addon the compiler renders from the whole spec.
    f("CloudControllerManagerConfig", "master", By(CCM)),
    f("CloudControllerManagerConfig", "logLevel", By(CCM)),
    f("CloudControllerManagerConfig", "image", By(CCM)),
    f("CloudControllerManagerConfig", "cloudProvider", By(CCM)),
    f("CloudControllerManagerConfig", "clusterName", By(CCM)),
    f("CloudControllerManagerConfig", "allowUntaggedCloud", By(CCM)),
    f("CloudControllerManagerConfig", "clusterCIDR", By(CCM)),
    f("CloudControllerManagerConfig", "allocateNodeCIDRs", By(CCM)),
    f("CloudControllerManagerConfig", "configureCloudRoutes", By(CCM)),
    f("CloudControllerManagerConfig", "controllers", By(CCM)),
    f("CloudControllerManagerConfig", "cidrAllocatorType", By(CCM)),
    f("CloudControllerManagerConfig", "leaderElection", By(CCM)),
    f("CloudControllerManagerConfig", "useServiceAccountCredentials", By(CCM)),
    f("CloudControllerManagerConfig", "enableLeaderMigration", By(CCM)),
    f("CloudControllerManagerConfig", "cpuRequest", By(CCM)),
    f("CloudControllerManagerConfig", "nodeStatusUpdateFrequency", By(CCM)),
    f("CloudControllerManagerConfig", "concurrentNodeSyncs", By(CCM)),
    nr("CloudControllerManagerConfig", "azureNodeManagerImage", "Keelson does not run on Azure; remove it"),
    // etcd
    f("EtcdClusterSpec", "name", By(ETCD)),
    f("EtcdClusterSpec", "provider", By(ETCD)),
    f("EtcdClusterSpec", "enableEtcdTLS", By(ETCD)),
    f("EtcdClusterSpec", "enableTLSAuth", By(ETCD)),
    f("EtcdClusterSpec", "version", By(ETCD)),
    f("EtcdClusterSpec", "leaderElectionTimeout", By(ETCD)),
    f("EtcdClusterSpec", "heartbeatInterval", By(ETCD)),
    f("EtcdClusterSpec", "image", By(ETCD)),
    f("EtcdClusterSpec", "memoryRequest", By(ETCD)),
    f("EtcdClusterSpec", "cpuRequest", By(ETCD)),
    f("EtcdClusterSpec", "volumeIops", Use::DroppedByKops(ETCD_CLUSTER_VOLUME)),
    f("EtcdClusterSpec", "volumeSize", Use::DroppedByKops(ETCD_CLUSTER_VOLUME)),
    f("EtcdClusterSpec", "volumeThroughput", Use::DroppedByKops(ETCD_CLUSTER_VOLUME)),
    f("EtcdClusterSpec", "type", By("the compiler: cleared, as kOps does")),
    f("EtcdMemberSpec", "name", By(ETCD)),
    f("EtcdMemberSpec", "instanceGroup", By(ETCD)),
    f("EtcdMemberSpec", "volumeType", By(ETCD_VOLUME)),
    f("EtcdMemberSpec", "volumeIops", By(ETCD_VOLUME)),
    f("EtcdMemberSpec", "volumeThroughput", By(ETCD_VOLUME)),
    f("EtcdMemberSpec", "volumeSize", By(ETCD_VOLUME)),
    f("EtcdMemberSpec", "kmsKeyId", By(ETCD_VOLUME)),
    f("EtcdMemberSpec", "encryptedVolume", By(ETCD_VOLUME)),
    f("EtcdBackupSpec", "backupStore", By("protokube's backups, `keelson etcd backup` and the IAM policy of the control planes")),
    nr("EtcdBackupSpec", "image", NO_ETCD_MANAGER),
    f("EtcdManagerSpec", "backupInterval", By(ETCD)),
    f("EtcdManagerSpec", "backupRetentionDays", By(ETCD)),
    nr("EtcdManagerSpec", "image", NO_ETCD_MANAGER),
    f(
        "EtcdManagerSpec",
        "env",
        By("protokube's backup retention: ETCD_MANAGER_HOURLY_/DAILY_BACKUPS_RETENTION (api/src/etcd_manager.rs); any other variable is refused by validate"),
    ),
    nr("EtcdManagerSpec", "discoveryPollInterval", NO_ETCD_MANAGER),
    nr("EtcdManagerSpec", "listenMetricsURLs", NO_ETCD_MANAGER),
    nr("EtcdManagerSpec", "listenClientHTTPURLs", NO_ETCD_MANAGER),
    nr("EtcdManagerSpec", "logLevel", NO_ETCD_MANAGER),
];
