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
//! `api/tests/support.rs` walks the generated types and fails on any field under the covered roots
//! ([`COVERED_ROOTS`]) that this table does not classify; nodeup's kubelet renderer destructures
//! `KubeletConfigSpec` without `..` and places each field where [`KUBELET`] says.

use serde_json::Value;

use crate::documents::Documents;
use crate::validate::ValidationError;

/// What happens to a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// The kubelet's configuration file (`/var/lib/kubelet/kubelet.conf`), at this key path of
    /// `KubeletConfiguration` (kubelet.config.k8s.io/v1beta1), dots between levels.
    KubeletConfig(&'static str),
    /// The kubelet's command line (`/etc/sysconfig/kubelet`): this flag (kOps' `flag:` tag).
    KubeletFlag(&'static str),
    /// Consumed by the named part of Keelson (the whole field, its sub-fields included).
    By(&'static str),
    /// Completed as kOps does, but not rendered: refused by `keelson validate` and the cluster
    /// commands (compile warns) when the condition holds.
    NotRendered { when: When, reason: &'static str },
    /// Refused by every command when set.
    Refused(&'static str),
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
    /// When it is this string.
    Equals(&'static str),
}

impl When {
    fn holds(self, v: &Value) -> bool {
        match self {
            When::Present => !v.is_null(),
            When::Enabled => v.get("enabled").and_then(Value::as_bool) == Some(true),
            When::NotDisabled => !v.is_null() && v.get("enabled").and_then(Value::as_bool) != Some(false),
            When::True => v.as_bool() == Some(true),
            When::Equals(s) => v.as_str() == Some(s),
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
/// classification test requires to be classified.
pub const COVERED_ROOTS: &[&str] = &["KubeletConfigSpec", "NetworkingSpec", "KubeDNSConfig", "ExternalDNSConfig", "ServiceAccountIssuerDiscoveryConfig"];

/// The addon-bearing fields of `ClusterSpec` (and `InstanceGroupSpec.warmPool`), classified too
/// (`kubeDNS`, `externalDns` and `serviceAccountIssuerDiscovery` field by field: covered roots).
pub const COVERED_FIELDS: &[(&str, &str)] = &[
    ("ClusterSpec", "clusterAutoscaler"),
    ("ClusterSpec", "nodeTerminationHandler"),
    ("ClusterSpec", "metricsServer"),
    ("ClusterSpec", "awsLoadBalancerController"),
    ("ClusterSpec", "certManager"),
    ("ClusterSpec", "snapshotController"),
    ("ClusterSpec", "nodeProblemDetector"),
    ("ClusterSpec", "podIdentityWebhook"),
    ("ClusterSpec", "karpenter"),
    ("ClusterSpec", "warmPool"),
    ("InstanceGroupSpec", "warmPool"),
];

const fn f(ty: &'static str, key: &'static str, used: Use) -> Field {
    Field { ty, key, used }
}

use Use::{By, KubeletConfig as Conf, KubeletFlag as Flag, NotRendered, Refused};

const GONE: &str = "the kubelet of the Kubernetes versions Keelson supports has no such flag (removed upstream); remove it";
const DOCKERSHIM: &str = "a dockershim setting: the kubelet lost it with Docker support (Kubernetes 1.24); remove it";
const SERVING_CERT: &str =
    "nodeup issues the kubelet's serving certificate itself (/srv/kubernetes/kubelet-server.{crt,key}); kOps ignores this field too; remove it";

/// `KubeletConfigSpec` (spec.kubelet, spec.masterKubelet, an InstanceGroup's spec.kubelet): kOps'
/// `flag:` tags say which fields are flags; the rest are `KubeletConfiguration` keys
/// (kOps `nodeup/pkg/model/kubelet.go`), except where the 1.32+ kubelet lacks the flag.
pub static KUBELET: &[Field] = &[
    f("KubeletConfigSpec", "apiServers", Refused(GONE)),
    f("KubeletConfigSpec", "anonymousAuth", Conf("authentication.anonymous.enabled")),
    f("KubeletConfigSpec", "authorizationMode", Conf("authorization.mode")),
    f("KubeletConfigSpec", "bootstrapKubeconfig", Flag("bootstrap-kubeconfig")),
    f("KubeletConfigSpec", "clientCaFile", Conf("authentication.x509.clientCAFile")),
    f("KubeletConfigSpec", "tlsCertFile", Refused(SERVING_CERT)),
    f("KubeletConfigSpec", "tlsPrivateKeyFile", Refused(SERVING_CERT)),
    f("KubeletConfigSpec", "tlsCipherSuites", Conf("tlsCipherSuites")),
    f("KubeletConfigSpec", "tlsMinVersion", Conf("tlsMinVersion")),
    f("KubeletConfigSpec", "kubeconfigPath", Flag("kubeconfig")),
    f("KubeletConfigSpec", "requireKubeconfig", Refused(GONE)),
    f("KubeletConfigSpec", "logFormat", Conf("logging.format")),
    f("KubeletConfigSpec", "logLevel", Flag("v")),
    f("KubeletConfigSpec", "podManifestPath", Conf("staticPodPath")),
    f("KubeletConfigSpec", "hostnameOverride", Flag("hostname-override")),
    f(
        "KubeletConfigSpec",
        "podInfraContainerImage",
        Refused("the sandbox (pause) image is containerd's: set spec.containerd.sandboxImage instead; kOps ignores this field too"),
    ),
    f("KubeletConfigSpec", "seccompDefault", Conf("seccompDefault")),
    f("KubeletConfigSpec", "seccompProfileRoot", Refused(GONE)),
    f("KubeletConfigSpec", "allowPrivileged", Refused(GONE)),
    f("KubeletConfigSpec", "enableDebuggingHandlers", Conf("enableDebuggingHandlers")),
    f("KubeletConfigSpec", "registerNode", Flag("register-node")),
    f("KubeletConfigSpec", "nodeStatusUpdateFrequency", Conf("nodeStatusUpdateFrequency")),
    f("KubeletConfigSpec", "clusterDomain", Conf("clusterDomain")),
    f("KubeletConfigSpec", "clusterDNS", Conf("clusterDNS")),
    f("KubeletConfigSpec", "networkPluginName", Refused(DOCKERSHIM)),
    f("KubeletConfigSpec", "cloudProvider", Flag("cloud-provider")),
    f("KubeletConfigSpec", "kubeletCgroups", Conf("kubeletCgroups")),
    f("KubeletConfigSpec", "runtimeCgroups", Flag("runtime-cgroups")),
    f("KubeletConfigSpec", "readOnlyPort", Conf("readOnlyPort")),
    f("KubeletConfigSpec", "systemCgroups", Conf("systemCgroups")),
    f("KubeletConfigSpec", "cgroupRoot", Conf("cgroupRoot")),
    f("KubeletConfigSpec", "configureCbr0", Refused(GONE)),
    f("KubeletConfigSpec", "hairpinMode", Conf("hairpinMode")),
    f("KubeletConfigSpec", "babysitDaemons", Refused(GONE)),
    f("KubeletConfigSpec", "maxPods", Conf("maxPods")),
    f("KubeletConfigSpec", "nvidiaGPUs", Refused(GONE)),
    f("KubeletConfigSpec", "podCIDR", Conf("podCIDR")),
    f("KubeletConfigSpec", "resolvConf", Conf("resolvConf")),
    f("KubeletConfigSpec", "reconcileCIDR", Refused(GONE)),
    // A flag up to Kubernetes 1.33; refused from 1.34 on ([`REGISTER_SCHEDULABLE_GONE`]).
    f("KubeletConfigSpec", "registerSchedulable", Flag("register-schedulable")),
    f("KubeletConfigSpec", "serializeImagePulls", Conf("serializeImagePulls")),
    f("KubeletConfigSpec", "nodeLabels", Flag("node-labels")),
    f("KubeletConfigSpec", "nonMasqueradeCIDR", Refused(DOCKERSHIM)),
    f("KubeletConfigSpec", "enableCustomMetrics", Refused(GONE)),
    f("KubeletConfigSpec", "networkPluginMTU", Refused(DOCKERSHIM)),
    // kOps passes --image-minimum-gc-age, a flag the 1.34 kubelet no longer has: the config key.
    f("KubeletConfigSpec", "imageMinimumGCAge", Conf("imageMinimumGCAge")),
    f("KubeletConfigSpec", "imageMaximumGCAge", Conf("imageMaximumGCAge")),
    f("KubeletConfigSpec", "maxParallelImagePulls", Conf("maxParallelImagePulls")),
    f("KubeletConfigSpec", "imageGCHighThresholdPercent", Conf("imageGCHighThresholdPercent")),
    f("KubeletConfigSpec", "imageGCLowThresholdPercent", Conf("imageGCLowThresholdPercent")),
    f("KubeletConfigSpec", "imagePullProgressDeadline", Refused(DOCKERSHIM)),
    f("KubeletConfigSpec", "evictionHard", Conf("evictionHard")),
    f("KubeletConfigSpec", "evictionSoft", Conf("evictionSoft")),
    f("KubeletConfigSpec", "evictionSoftGracePeriod", Conf("evictionSoftGracePeriod")),
    f("KubeletConfigSpec", "evictionPressureTransitionPeriod", Conf("evictionPressureTransitionPeriod")),
    f("KubeletConfigSpec", "evictionMaxPodGracePeriod", Conf("evictionMaxPodGracePeriod")),
    f("KubeletConfigSpec", "evictionMinimumReclaim", Conf("evictionMinimumReclaim")),
    f("KubeletConfigSpec", "volumePluginDirectory", Conf("volumePluginDir")),
    f("KubeletConfigSpec", "taints", Conf("registerWithTaints")),
    f("KubeletConfigSpec", "featureGates", Conf("featureGates")),
    f("KubeletConfigSpec", "kernelMemcgNotification", Conf("kernelMemcgNotification")),
    f("KubeletConfigSpec", "kubeReserved", Conf("kubeReserved")),
    f("KubeletConfigSpec", "kubeReservedCgroup", Conf("kubeReservedCgroup")),
    f("KubeletConfigSpec", "systemReserved", Conf("systemReserved")),
    f("KubeletConfigSpec", "systemReservedCgroup", Conf("systemReservedCgroup")),
    f("KubeletConfigSpec", "enforceNodeAllocatable", Conf("enforceNodeAllocatable")),
    f("KubeletConfigSpec", "runtimeRequestTimeout", Flag("runtime-request-timeout")),
    f("KubeletConfigSpec", "volumeStatsAggPeriod", Flag("volume-stats-agg-period")),
    f("KubeletConfigSpec", "failSwapOn", Conf("failSwapOn")),
    // Renamed upstream (beta): merged into allowedUnsafeSysctls.
    f("KubeletConfigSpec", "experimentalAllowedUnsafeSysctls", Conf("allowedUnsafeSysctls")),
    f("KubeletConfigSpec", "allowedUnsafeSysctls", Conf("allowedUnsafeSysctls")),
    f("KubeletConfigSpec", "streamingConnectionIdleTimeout", Flag("streaming-connection-idle-timeout")),
    f("KubeletConfigSpec", "dockerDisableSharedPID", Refused(DOCKERSHIM)),
    f("KubeletConfigSpec", "rootDir", Flag("root-dir")),
    f("KubeletConfigSpec", "authenticationTokenWebhook", Conf("authentication.webhook.enabled")),
    f("KubeletConfigSpec", "authenticationTokenWebhookCacheTtl", Flag("authentication-token-webhook-cache-ttl")),
    f("KubeletConfigSpec", "cpuCFSQuota", Conf("cpuCFSQuota")),
    f("KubeletConfigSpec", "cpuCFSQuotaPeriod", Conf("cpuCFSQuotaPeriod")),
    f("KubeletConfigSpec", "cpuManagerPolicy", Conf("cpuManagerPolicy")),
    f("KubeletConfigSpec", "registryPullQPS", Conf("registryPullQPS")),
    f("KubeletConfigSpec", "registryBurst", Flag("registry-burst")),
    f("KubeletConfigSpec", "topologyManagerPolicy", Conf("topologyManagerPolicy")),
    f("KubeletConfigSpec", "rotateCertificates", Conf("rotateCertificates")),
    f("KubeletConfigSpec", "protectKernelDefaults", Conf("protectKernelDefaults")),
    f("KubeletConfigSpec", "cgroupDriver", Conf("cgroupDriver")),
    f("KubeletConfigSpec", "housekeepingInterval", Flag("housekeeping-interval")),
    // kOps' older name of eventRecordQPS; wins when both are set (as in kOps).
    f("KubeletConfigSpec", "eventQPS", Conf("eventRecordQPS")),
    f("KubeletConfigSpec", "eventBurst", Flag("event-burst")),
    f("KubeletConfigSpec", "containerLogMaxSize", Conf("containerLogMaxSize")),
    f("KubeletConfigSpec", "containerLogMaxFiles", Conf("containerLogMaxFiles")),
    f("KubeletConfigSpec", "enableCadvisorJsonEndpoints", Refused(GONE)),
    f("KubeletConfigSpec", "podPidsLimit", Conf("podPidsLimit")),
    f("KubeletConfigSpec", "experimentalAllocatableIgnoreEviction", Flag("experimental-allocatable-ignore-eviction")),
    f("KubeletConfigSpec", "shutdownGracePeriod", Conf("shutdownGracePeriod")),
    f("KubeletConfigSpec", "shutdownGracePeriodCriticalPods", Conf("shutdownGracePeriodCriticalPods")),
    f("KubeletConfigSpec", "memorySwapBehavior", Conf("memorySwap.swapBehavior")),
    f("KubeletConfigSpec", "crashLoopBackOffMaxContainerRestartPeriod", Conf("crashLoopBackOff.maxContainerRestartPeriod")),
    f("KubeletConfigSpec", "kubeAPIQPS", Flag("kube-api-qps")),
    f("KubeletConfigSpec", "eventRecordQPS", Conf("eventRecordQPS")),
    f("KubeletConfigSpec", "nodeLeaseDurationSeconds", Conf("nodeLeaseDurationSeconds")),
];

macro_rules! cni_not_rendered {
    ($key:literal) => {
        f(
            "NetworkingSpec",
            $key,
            NotRendered {
                when: When::Present,
                reason: concat!(
                    "Keelson does not render ",
                    $key,
                    " yet (the spec compiles as kOps would, but no CNI is installed); supported: calico, cilium, kubenet, gce, cni and external"
                ),
            },
        )
    };
}

macro_rules! addon_not_rendered {
    ($ty:literal, $key:literal, $when:expr, $what:literal) => {
        f(
            $ty,
            $key,
            NotRendered { when: $when, reason: concat!("Keelson does not render ", $what, " yet (the spec compiles as kOps would, but nothing runs it)") },
        )
    };
}

/// `NetworkingSpec` (spec.networking): one key per provider.
pub static NETWORKING: &[Field] = &[
    cni_not_rendered!("classic"),
    f("NetworkingSpec", "kubenet", By("nodeup: containerd's kubenet CNI template; kube-controller-manager allocates the pod CIDRs")),
    f("NetworkingSpec", "external", By("the compiler: nothing to install (the user's networking)")),
    f("NetworkingSpec", "cni", By("the compiler: nothing to install (the user installs the CNI, as with kOps)")),
    cni_not_rendered!("kopeio"),
    cni_not_rendered!("weave"),
    cni_not_rendered!("flannel"),
    f("NetworkingSpec", "calico", By("the calico addon (spec-compiler/src/addons/calico.rs)")),
    cni_not_rendered!("canal"),
    cni_not_rendered!("kuberouter"),
    cni_not_rendered!("romana"),
    cni_not_rendered!("amazonvpc"),
    f("NetworkingSpec", "cilium", By("the cilium addon (spec-compiler/src/addons/cilium.rs) and nodeup's sysctls")),
    cni_not_rendered!("lyftvpc"),
    f("NetworkingSpec", "gce", By("the compiler and cloud model: GCE IP-alias subnets, routes by the cloud-controller-manager")),
    cni_not_rendered!("kindnet"),
];

/// The addon-bearing fields kOps turns into addons or AWS resources.
pub static ADDONS: &[Field] = &[
    addon_not_rendered!("ClusterSpec", "clusterAutoscaler", When::Enabled, "the cluster-autoscaler addon"),
    addon_not_rendered!("ClusterSpec", "nodeTerminationHandler", When::NotDisabled, "the aws-node-termination-handler addon"),
    addon_not_rendered!("ClusterSpec", "metricsServer", When::Enabled, "the metrics-server addon"),
    addon_not_rendered!("KubeDNSConfig", "nodeLocalDNS", When::Enabled, "the node-local-dns addon"),
    addon_not_rendered!("ClusterSpec", "awsLoadBalancerController", When::Enabled, "the aws-load-balancer-controller addon"),
    addon_not_rendered!("ClusterSpec", "certManager", When::Enabled, "the cert-manager addon"),
    addon_not_rendered!("ClusterSpec", "snapshotController", When::Enabled, "the snapshot-controller addon"),
    addon_not_rendered!("ClusterSpec", "nodeProblemDetector", When::Enabled, "the node-problem-detector addon"),
    addon_not_rendered!("ExternalDNSConfig", "provider", When::Equals("external-dns"), "the external-dns addon"),
    addon_not_rendered!("ClusterSpec", "podIdentityWebhook", When::Enabled, "the pod-identity-webhook addon"),
    addon_not_rendered!("ClusterSpec", "karpenter", When::Enabled, "the karpenter addon"),
    addon_not_rendered!("ClusterSpec", "warmPool", When::Present, "Auto Scaling warm pools"),
    addon_not_rendered!("InstanceGroupSpec", "warmPool", When::Present, "Auto Scaling warm pools"),
];

const COREDNS: &str = "the coredns addon (spec-compiler/src/addons/coredns.rs)";

/// `KubeDNSConfig` (spec.kubeDNS): the CoreDNS addon, the kubelet's cluster DNS.
pub static KUBE_DNS: &[Field] = &[
    f(
        "KubeDNSConfig",
        "cacheMaxSize",
        NotRendered {
            when: When::Present,
            reason: "a dnsmasq setting of the kube-dns provider: CoreDNS caches with `cache 30` (kOps ignores it too); remove it",
        },
    ),
    f(
        "KubeDNSConfig",
        "cacheMaxConcurrent",
        NotRendered {
            when: When::Present,
            reason: "a dnsmasq setting of the kube-dns provider: CoreDNS forwards with `max_concurrent 1000` (kOps ignores it too); remove it",
        },
    ),
    f("KubeDNSConfig", "tolerations", By(COREDNS)),
    f("KubeDNSConfig", "affinity", By(COREDNS)),
    f("KubeDNSConfig", "coreDNSImage", By(COREDNS)),
    f(
        "KubeDNSConfig",
        "cpaImage",
        NotRendered { when: When::Present, reason: "Keelson runs no cluster-proportional-autoscaler (CoreDNS runs two replicas); remove it" },
    ),
    f("KubeDNSConfig", "domain", By(COREDNS)),
    f("KubeDNSConfig", "externalCoreFile", By(COREDNS)),
    f("KubeDNSConfig", "image", NotRendered { when: When::Present, reason: "unused (kOps' API says so; the CoreDNS image is coreDNSImage); remove it" }),
    f("KubeDNSConfig", "replicas", NotRendered { when: When::Present, reason: "unused (kOps' API says so; CoreDNS runs two replicas); remove it" }),
    f(
        "KubeDNSConfig",
        "provider",
        NotRendered { when: When::Equals("KubeDNS"), reason: "Keelson does not render kube-dns: use provider CoreDNS (the default)" },
    ),
    f("KubeDNSConfig", "serverIP", By("the coredns addon's Service and the kubelet's clusterDNS (the compiler)")),
    f("KubeDNSConfig", "stubDomains", By(COREDNS)),
    f("KubeDNSConfig", "upstreamNameservers", By(COREDNS)),
    f("KubeDNSConfig", "memoryRequest", By(COREDNS)),
    f("KubeDNSConfig", "cpuRequest", By(COREDNS)),
    f("KubeDNSConfig", "memoryLimit", By(COREDNS)),
    f("KubeDNSConfig", "podAnnotations", By(COREDNS)),
];

const DNS_CONTROLLER: &str = "Keelson has no dns-controller: protokube on the control planes keeps the API's DNS records";

/// `ExternalDNSConfig` (spec.externalDns): kOps' dns-controller or external-dns.
pub static EXTERNAL_DNS: &[Field] = &[
    f("ExternalDNSConfig", "disable", NotRendered { when: When::True, reason: "protokube keeps the API's DNS records and cannot be turned off; remove it" }),
    f("ExternalDNSConfig", "watchIngress", NotRendered { when: When::True, reason: DNS_CONTROLLER }),
    f("ExternalDNSConfig", "watchNamespace", NotRendered { when: When::Present, reason: DNS_CONTROLLER }),
    f("ExternalDNSConfig", "priorityClassName", NotRendered { when: When::Present, reason: DNS_CONTROLLER }),
];

/// `ServiceAccountIssuerDiscoveryConfig` (spec.serviceAccountIssuerDiscovery).
pub static DISCOVERY: &[Field] = &[
    f(
        "ServiceAccountIssuerDiscoveryConfig",
        "discoveryStore",
        NotRendered {
            when: When::Present,
            reason: "Keelson does not publish the discovery documents (OpenID configuration, JWKS) to the store yet (the API server's issuer is set from it)",
        },
    ),
    f("ServiceAccountIssuerDiscoveryConfig", "discoveryService", By("the compiler: kube-apiserver's --service-account-issuer")),
    addon_not_rendered!(
        "ServiceAccountIssuerDiscoveryConfig",
        "enableAWSOIDCProvider",
        When::True,
        "the IAM OIDC provider and the published discovery documents (IRSA)"
    ),
    f(
        "ServiceAccountIssuerDiscoveryConfig",
        "additionalAudiences",
        NotRendered { when: When::Present, reason: "Keelson does not add them to kube-apiserver's --api-audiences yet" },
    ),
];

/// Every classified field.
pub fn all() -> impl Iterator<Item = &'static Field> {
    KUBELET.iter().chain(NETWORKING).chain(ADDONS).chain(KUBE_DNS).chain(EXTERNAL_DNS).chain(DISCOVERY)
}

/// How the field `key` of the generated type `ty` is used, if classified.
pub fn classify(ty: &str, key: &str) -> Option<Use> {
    all().find(|f| f.ty == ty && f.key == key).map(|f| f.used)
}

/// `registerSchedulable` is a kubelet flag up to Kubernetes 1.33 (kOps sets it there); the 1.34
/// kubelet has no such flag.
pub const REGISTER_SCHEDULABLE_GONE: (u64, u64) = (1, 34);

/// A refused field of a spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub error: ValidationError,
    /// `false`: refused by every command; `true`: [`Use::NotRendered`] (compile warns).
    pub not_rendered: bool,
}

/// Where each classified type sits in a document (json paths from the document root).
fn locations(docs: &Documents) -> Vec<(String, &'static str, String, Value)> {
    let mut out = Vec::new();
    let cluster = &docs.cluster;
    let cdoc = format!("Cluster/{}", cluster.name());
    let spec = serde_json::to_value(&cluster.spec).unwrap_or(Value::Null);
    out.push((cdoc.clone(), "ClusterSpec", "spec".to_string(), spec.clone()));
    for (key, ty) in [
        ("kubelet", "KubeletConfigSpec"),
        ("masterKubelet", "KubeletConfigSpec"),
        ("networking", "NetworkingSpec"),
        ("kubeDNS", "KubeDNSConfig"),
        ("externalDns", "ExternalDNSConfig"),
        ("serviceAccountIssuerDiscovery", "ServiceAccountIssuerDiscoveryConfig"),
    ] {
        if let Some(v) = spec.get(key).filter(|v| !v.is_null()) {
            out.push((cdoc.clone(), ty, format!("spec.{key}"), v.clone()));
        }
    }
    for ig in &docs.instance_groups {
        let doc = format!("InstanceGroup/{}", ig.metadata.name.as_deref().unwrap_or_default());
        let spec = serde_json::to_value(&ig.spec).unwrap_or(Value::Null);
        if let Some(v) = spec.get("kubelet").filter(|v| !v.is_null()) {
            out.push((doc.clone(), "KubeletConfigSpec", "spec.kubelet".to_string(), v.clone()));
        }
        out.push((doc, "InstanceGroupSpec", "spec".to_string(), spec));
    }
    out
}

/// Every refused field the spec sets, each naming its document and path.
pub fn refusals(docs: &Documents) -> Vec<Refusal> {
    let (major, minor) = REGISTER_SCHEDULABLE_GONE;
    let no_register_schedulable = docs.cluster.spec.kubernetes_version.as_ref().is_some_and(|v| v.at_least(major, minor));
    let mut out = Vec::new();
    for (doc, ty, base, value) in locations(docs) {
        for field in all().filter(|f| f.ty == ty) {
            let Some(v) = value.get(field.key).filter(|v| !v.is_null()) else { continue };
            let path = format!("{base}.{}", field.key);
            let (message, not_rendered) = match field.used {
                Use::Refused(reason) => (reason.to_string(), false),
                Use::NotRendered { when, reason } if when.holds(v) => (reason.to_string(), true),
                Use::KubeletFlag("register-schedulable") if no_register_schedulable => {
                    ("the kubelet has no --register-schedulable flag from Kubernetes 1.34 on (use taints); remove it".to_string(), false)
                }
                _ => continue,
            };
            out.push(Refusal { error: ValidationError { document: doc.clone(), path, message }, not_rendered });
        }
    }
    out
}

/// The [`Use::NotRendered`] fields the spec turns on: refused by `keelson validate` and the
/// commands that build a cluster, a warning from `keelson compile`.
pub fn not_rendered(docs: &Documents) -> Vec<ValidationError> {
    refusals(docs).into_iter().filter(|x| x.not_rendered).map(|x| x.error).collect()
}
