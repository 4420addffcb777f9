//! Networking, the cluster DNS, external DNS, service-account issuer discovery and the
//! addon-bearing fields.

use super::{f, Field, Use, When};
use Use::{By, NotRendered};

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
    addon_not_rendered!("ClusterSpec", "nodeTerminationHandler", When::NotDisabled, "the aws-node-termination-handler addon"),
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

const METRICS_SERVER_ADDON: &str = "the metrics-server addon (spec-compiler/src/addons/metrics_server.rs)";

/// `MetricsServerConfig` (spec.metricsServer): kOps' metrics-server addon.
pub static METRICS_SERVER: &[Field] = &[
    f("MetricsServerConfig", "enabled", By(METRICS_SERVER_ADDON)),
    f("MetricsServerConfig", "image", By(METRICS_SERVER_ADDON)),
    f(
        "MetricsServerConfig",
        "insecure",
        NotRendered {
            when: When::False,
            reason: "Keelson does not render a secure metrics-server: it needs cert-manager and kOps' addon PKI issuer for its serving certificate (the spec compiles as kOps would); set insecure: true",
        },
    ),
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
