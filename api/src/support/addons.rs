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
                    " yet (the spec compiles as kOps would, but no CNI is installed); supported: calico, cilium, flannel, kubenet, gce, cni and external"
                ),
            },
        )
    };
    ($key:literal, $why:literal) => {
        f(
            "NetworkingSpec",
            $key,
            NotRendered {
                when: When::Present,
                reason: concat!(
                    "Keelson does not render ",
                    $key,
                    ": ",
                    $why,
                    " (the spec compiles as kOps would, but no CNI is installed); supported: calico, cilium, flannel, kubenet, gce, cni and external"
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
    f("NetworkingSpec", "calico", By("the calico addon (spec-compiler/src/addons/calico.rs)")),
    cni_not_rendered!(
        "canal",
        "it is Calico's calico/node for policy with flannel for the overlay, and Keelson neither renders Calico's policy-only mode nor has run calico/node (no version of github.com/projectcalico/calico is served by the Go module proxy to build it from); use flannel, or calico"
    ),
    cni_not_rendered!("kuberouter"),
    cni_not_rendered!("romana"),
    cni_not_rendered!(
        "amazonvpc",
        "the amazon-vpc-cni gives each pod a secondary address of an ENI attached to its instance, which Keelson has never run (keelson-local's EC2 plays no ENI secondary addresses); use flannel, calico or cilium"
    ),
    f("NetworkingSpec", "cilium", By("the cilium addon (spec-compiler/src/addons/cilium.rs) and nodeup's sysctls")),
    cni_not_rendered!("lyftvpc"),
    f("NetworkingSpec", "gce", By("the compiler and cloud model: GCE IP-alias subnets, routes by the cloud-controller-manager")),
    cni_not_rendered!("kindnet"),
];

/// The addon-bearing fields kOps turns into addons or AWS resources.
pub static ADDONS: &[Field] = &[
    addon_not_rendered!("ClusterSpec", "nodeTerminationHandler", When::NotDisabled, "the aws-node-termination-handler addon"),
    addon_not_rendered!("ClusterSpec", "awsLoadBalancerController", When::Enabled, "the aws-load-balancer-controller addon"),
    f(
        "ClusterSpec",
        "certManager",
        By("the cert-manager addon (spec-compiler/src/addons/cert_manager.rs; managed: false renders nothing); hostedZoneIDs: the control planes' IAM policy (cloud-resources/src/iam_policy.rs)"),
    ),
    f(
        "ClusterSpec",
        "snapshotController",
        By("the snapshot-controller addon (spec-compiler/src/addons/snapshot_controller.rs), checked by keelson_api::addon_rules"),
    ),
    f(
        "ClusterSpec",
        "nodeProblemDetector",
        By("the node-problem-detector addon (spec-compiler/src/addons/node_problem_detector.rs); its defaults by the compiler as kOps'"),
    ),
    f(
        "ClusterSpec",
        "podIdentityWebhook",
        NotRendered {
            when: When::Enabled,
            reason: "Keelson does not render the pod-identity-webhook addon: kOps serves the webhook with a certificate cert-manager issues and injects, and cert-manager's commands (the modules github.com/cert-manager/cert-manager/cmd/controller, cmd/webhook and cmd/cainjector) are not served by the Go module proxy here, so neither could run; put your pods on roles with serviceAccountExternalPermissions and set AWS_ROLE_ARN and a projected token yourself, as Keelson does for its own addons",
        },
    ),
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
            reason: "Keelson does not render a secure metrics-server: its serving certificate comes from kOps' per-addon PKI issuer, which Keelson does not create yet (cert-manager itself renders) (the spec compiles as kOps would); set insecure: true",
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
    f(
        "KubeDNSConfig",
        "nodeLocalDNS",
        By("the node-local-dns addon (spec-compiler/src/addons/node_local_dns.rs), checked by keelson_api::addon_rules, and the kubelets' clusterDNS (the compiler)"),
    ),
];

const DNS_CONTROLLER: &str =
    "Keelson has no dns-controller: protokube on the control planes keeps the API's DNS records (with provider: external-dns the external-dns addon takes this setting)";

/// Set only for dns-controller (the default provider), which Keelson does not run.
const fn dns_controller_only(key: &'static str, then: &'static When) -> Field {
    f("ExternalDNSConfig", key, NotRendered { when: When::UnlessSibling { key: "provider", value: "external-dns", then }, reason: DNS_CONTROLLER })
}

/// `ExternalDNSConfig` (spec.externalDns): kOps' dns-controller or external-dns.
pub static EXTERNAL_DNS: &[Field] = &[
    f("ExternalDNSConfig", "disable", NotRendered { when: When::True, reason: "protokube keeps the API's DNS records and cannot be turned off; remove it" }),
    f(
        "ExternalDNSConfig",
        "provider",
        By("external-dns: the external-dns addon (spec-compiler/src/addons/external_dns.rs); dns-controller and none: nothing, protokube keeps the API's records"),
    ),
    dns_controller_only("watchIngress", &When::True),
    dns_controller_only("watchNamespace", &When::Present),
    dns_controller_only("priorityClassName", &When::Present),
];

/// `ServiceAccountIssuerDiscoveryConfig` (spec.serviceAccountIssuerDiscovery).
pub static DISCOVERY: &[Field] = &[
    f(
        "ServiceAccountIssuerDiscoveryConfig",
        "discoveryStore",
        By("the compiler: kube-apiserver's --service-account-issuer and --service-account-jwks-uri; apply publishes the discovery documents there (cli/src/discovery.rs)"),
    ),
    f("ServiceAccountIssuerDiscoveryConfig", "discoveryService", By("the compiler: kube-apiserver's --service-account-issuer")),
    f("ServiceAccountIssuerDiscoveryConfig", "enableAWSOIDCProvider", By("apply: the IAM OIDC provider of the issuer (cloud-resources/src/aws/oidc_provider.rs)")),
    f("ServiceAccountIssuerDiscoveryConfig", "additionalAudiences", By("apply: the IAM OIDC provider's client IDs, beside amazonaws.com (kOps)")),
];

const FLANNEL_ADDON: &str = "the flannel addon (spec-compiler/src/addons/flannel.rs)";

/// `FlannelNetworkingSpec` (spec.networking.flannel): upstream's kube-flannel manifest with kOps'
/// settings (`networking.flannel`).
pub static FLANNEL: &[Field] = &[
    f(
        "FlannelNetworkingSpec",
        "backend",
        NotRendered {
            when: When::NotEquals("vxlan"),
            reason: "Keelson runs flannel with the vxlan backend only (kOps also accepts udp, which flannel itself deprecates and Keelson has never run); set backend: vxlan",
        },
    ),
    f("FlannelNetworkingSpec", "iptablesResyncSeconds", By(FLANNEL_ADDON)),
    f(
        "FlannelNetworkingSpec",
        "disableTxChecksumOffloading",
        NotRendered { when: When::Present, reason: "unused (kOps' API says so; kOps renders nothing for it); remove it" },
    ),
];
