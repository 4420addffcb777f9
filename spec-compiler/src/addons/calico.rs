//! The Calico networking addon (`networking.projectcalico.org`), rendered from the completed
//! `spec.networking.calico` (defaults filled by `complete::network::calico`, kOps'
//! `CalicoOptionsBuilder`). Facts from kOps' `networking.projectcalico.org/k8s-1.25.yaml.template`
//! (Calico v3.31.6, the Typha flavour of Calico's manifests) and `template_functions.go` at the commit
//! the versions table mirrors: the `calico-config` ConfigMap (Typha service name, backend, veth MTU,
//! the CNI conflist with the `calico` and `portmap` plugins), the ServiceAccounts `calico-node`,
//! `calico-cni-plugin` and `calico-kube-controllers`, their ClusterRoles and bindings (plus
//! `calico-tier-getter` for the kube-controller-manager), the `calico-node` DaemonSet (init containers
//! `upgrade-ipam` — not on IPv6-only clusters —, `install-cni` and `ebpf-bootstrap`), the
//! `calico-kube-controllers` Deployment and its PodDisruptionBudget, and, when `typhaReplicas > 0`,
//! Typha's Deployment, Service and PodDisruptionBudget. With `bpfEnabled` the
//! `kubernetes-services-endpoint` ConfigMap points Calico at the API server directly (it replaces
//! kube-proxy, so `spec.kubeProxy.enabled` must be false, as kOps validates).
//!
//! The spec is validated as kOps' `validateNetworkingCalico` does; every error names its field.
//!
//! Differences from kOps, on purpose:
//! * The CustomResourceDefinitions (the 22 `crd.projectcalico.org/v1` kinds of Calico v3.31 and the
//!   `policy.networking.k8s.io/v1alpha1` AdminNetworkPolicy and BaselineAdminNetworkPolicy Calico
//!   watches) carry a minimal structural schema — `type: object` with `spec` and `status` preserving
//!   unknown fields — instead of kOps' full OpenAPI schemas (about 6,500 lines of the template).
//!   Calico validates its own resources, so the API server accepts what Calico would have rejected
//!   only for objects users write directly, and `kubectl explain` shows nothing for them.
//! * `spec.egressProxy` is not passed to `calico-node` as proxy environment variables (kOps'
//!   `ProxyEnv`): Calico talks only to the API server, inside the cluster.

use serde_json::{json, Value};

use keelson_api::{CalicoNetworkingSpec, Cluster};

use crate::versions::{CalicoImages, Versions};

/// The addon's name (kOps' name for it).
pub const NAME: &str = "networking.projectcalico.org";
const NAMESPACE: &str = "kube-system";
const FIELD: &str = "spec.networking.calico";
/// Typha's port for calico-node's connections.
const TYPHA_PORT: u16 = 5473;
/// Typha's health endpoint.
const TYPHA_HEALTH_PORT: u16 = 9098;
const DEFAULT_FELIX_METRICS_PORT: i64 = 9091;
const DEFAULT_TYPHA_METRICS_PORT: i64 = 9093;

/// A completed `spec.networking.calico` this addon cannot render, naming the field.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CalicoError {
    #[error("{FIELD}.{field}: required (completion fills it)")]
    Missing { field: &'static str },
    #[error("{FIELD}.{field}: {value:?} is not one of {allowed}")]
    Value { field: &'static str, value: String, allowed: &'static str },
    #[error("{FIELD}.{field}: {value:?}: {why}")]
    Invalid { field: &'static str, value: String, why: &'static str },
    #[error("{FIELD}.{field}: {why}")]
    Forbidden { field: &'static str, why: &'static str },
    #[error("spec.kubeProxy.enabled: calico in BPF mode ({FIELD}.bpfEnabled: true) requires kubeProxy to be disabled")]
    KubeProxyWithBpf,
    #[error("spec.kubeControllerManager.clusterCIDR: required for Calico's IPv4 pool (completion fills it from spec.podCIDR)")]
    NoClusterCidr,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encapsulation {
    Ipip,
    Vxlan,
    None,
}

/// An allowed value of an optional string field, or the default.
fn one_of(
    field: &'static str,
    value: Option<&str>,
    allowed: &'static [&'static str],
    text: &'static str,
    default: &'static str,
) -> Result<String, CalicoError> {
    match value {
        None | Some("") => Ok(default.to_string()),
        Some(v) if allowed.contains(&v) => Ok(v.to_string()),
        Some(v) => Err(CalicoError::Value { field, value: v.to_string(), allowed: text }),
    }
}

/// Calico's address autodetection methods, checked as calico/node (and kOps) do: `first-found`,
/// `can-reach=<IP of the family>`, `interface=<list>` or `skip-interface=<list>`.
fn check_autodetection(field: &'static str, value: &str, ipv6: bool) -> Result<(), CalicoError> {
    let invalid = |why| CalicoError::Invalid { field, value: value.to_string(), why };
    let mut parts = value.splitn(3, '=');
    let method = parts.next().unwrap_or("");
    let arg = parts.next();
    if parts.next().is_some() {
        return Err(invalid("malformed autodetection method"));
    }
    match (method, arg) {
        ("first-found", None) => Ok(()),
        ("can-reach", Some(dest)) => match dest.trim().parse::<std::net::IpAddr>() {
            Ok(ip) if ip.is_ipv6() == ipv6 => Ok(()),
            _ => Err(invalid(if ipv6 { "must be a valid IPv6 address" } else { "must be a valid IPv4 address" })),
        },
        ("interface" | "skip-interface", Some(list)) => {
            if list.split(',').map(str::trim).any(str::is_empty) {
                Err(invalid("must be followed by a comma separated list of interface regular expressions"))
            } else {
                Ok(())
            }
        }
        _ => Err(invalid("unsupported autodetection method")),
    }
}

/// A pool mode (`Always`, `CrossSubnet`, `Never`), allowed only with its encapsulation.
fn pool_mode(field: &'static str, value: Option<&str>, needs: Encapsulation, have: Encapsulation, why: &'static str) -> Result<Option<String>, CalicoError> {
    let Some(v) = value.filter(|v| !v.is_empty()) else { return Ok(None) };
    if !["Always", "CrossSubnet", "Never"].contains(&v) {
        return Err(CalicoError::Value { field, value: v.to_string(), allowed: "Always, CrossSubnet, Never" });
    }
    if v != "Never" && have != needs {
        return Err(CalicoError::Forbidden { field, why });
    }
    Ok(Some(v.to_string()))
}

/// The parsed settings the manifest is made from.
struct Settings<'a> {
    c: &'a CalicoNetworkingSpec,
    ipv6: bool,
    encapsulation: Encapsulation,
    ipv4_ipip: String,
    ipv4_vxlan: String,
    ipv6_vxlan: String,
    pool_cidr: Option<String>,
    mtu: i64,
    typha_replicas: i64,
    aws_src_dst_check: String,
    bpf_external_service_mode: String,
    bpf_log_level: String,
    chain_insert_mode: String,
    iptables_backend: String,
    nftables_mode: Option<String>,
    felix_metrics_port: i64,
    typha_metrics_port: i64,
}

impl<'a> Settings<'a> {
    fn new(cluster: &Cluster, c: &'a CalicoNetworkingSpec) -> Result<Settings<'a>, CalicoError> {
        let spec = &cluster.spec;
        let ipv6 = spec.non_masquerade_cidr.is_some_and(|c| c.is_ipv6());
        let cloud = spec.cloud_provider.as_deref().unwrap_or("");
        let encapsulation = match c.encapsulation_mode.as_deref() {
            None | Some("") => return Err(CalicoError::Missing { field: "encapsulationMode" }),
            Some("ipip") => Encapsulation::Ipip,
            Some("vxlan") => Encapsulation::Vxlan,
            Some("none") => Encapsulation::None,
            Some(v) => return Err(CalicoError::Value { field: "encapsulationMode", value: v.to_string(), allowed: "ipip, vxlan, none" }),
        };
        if ipv6 && encapsulation != Encapsulation::None {
            return Err(CalicoError::Forbidden { field: "encapsulationMode", why: "IPv6 requires an encapsulationMode of \"none\"" });
        }
        if !ipv6 && encapsulation == Encapsulation::None {
            return Err(CalicoError::Forbidden { field: "encapsulationMode", why: "encapsulationMode \"none\" is only supported for IPv6 clusters" });
        }
        if cloud == "azure" && encapsulation != Encapsulation::Vxlan {
            return Err(CalicoError::Forbidden { field: "encapsulationMode", why: "Azure requires an encapsulationMode of \"vxlan\"" });
        }
        let ipip = pool_mode(
            "ipipMode",
            c.ipip_mode.as_deref(),
            Encapsulation::Ipip,
            encapsulation,
            "IP-in-IP encapsulation requires use of Calico's \"ipip\" encapsulation mode",
        )?;
        let vxlan = pool_mode(
            "vxlanMode",
            c.vxlan_mode.as_deref(),
            Encapsulation::Vxlan,
            encapsulation,
            "VXLAN encapsulation requires use of Calico's \"vxlan\" encapsulation mode",
        )?;
        // kOps' CalicoIPv4PoolIPIPMode / CalicoIPv4PoolVXLANMode / CalicoIPv6PoolVXLANMode.
        let never = || "Never".to_string();
        let ipv4_ipip = match encapsulation {
            Encapsulation::Ipip => ipip.unwrap_or_else(|| if cloud == "openstack" { "Always" } else { "CrossSubnet" }.to_string()),
            _ => never(),
        };
        let (ipv4_vxlan, ipv6_vxlan) = match encapsulation {
            Encapsulation::Vxlan => (vxlan.clone().unwrap_or_else(|| "CrossSubnet".to_string()), vxlan.unwrap_or_else(never)),
            _ => (never(), never()),
        };
        let aws_src_dst_check = match c.aws_src_dst_check.as_deref().filter(|v| !v.is_empty()) {
            Some(v) if ipv6 && v != "DoNothing" => {
                return Err(CalicoError::Forbidden { field: "awsSrcDstCheck", why: "awsSrcDstCheck may only be \"DoNothing\" for IPv6 clusters" })
            }
            v => one_of("awsSrcDstCheck", v, &["Enable", "Disable", "DoNothing"], "Enable, Disable, DoNothing", "Disable")?,
        };
        // Only AWS IPv4 nodes have a source/destination check to change.
        let aws_src_dst_check = if cloud == "aws" && !ipv6 { aws_src_dst_check } else { "DoNothing".to_string() };
        if c.bpf_enabled == Some(true) && spec.kube_proxy.as_ref().is_some_and(|p| p.enabled != Some(false)) {
            return Err(CalicoError::KubeProxyWithBpf);
        }
        let bpf_external_service_mode = one_of("bpfExternalServiceMode", c.bpf_external_service_mode.as_deref(), &["Tunnel", "DSR"], "Tunnel, DSR", "Tunnel")?;
        let bpf_log_level = one_of("bpfLogLevel", c.bpf_log_level.as_deref(), &["Off", "Info", "Debug"], "Off, Info, Debug", "Off")?;
        let chain_insert_mode = one_of("chainInsertMode", c.chain_insert_mode.as_deref(), &["insert", "append"], "insert, append", "insert")?;
        let iptables_backend = one_of("iptablesBackend", c.iptables_backend.as_deref(), &["Auto", "Legacy", "NFT"], "Auto, Legacy, NFT", "Auto")?;
        let nftables_mode = match c.nftables_mode.as_deref().filter(|v| !v.is_empty()) {
            None => None,
            v => Some(one_of("nftablesMode", v, &["Disabled", "Enabled", "Auto"], "Disabled, Enabled, Auto", "")?),
        };
        if let Some(m) = c.ipv4_auto_detection_method.as_deref().filter(|v| !v.is_empty()) {
            check_autodetection("ipv4AutoDetectionMethod", m, false)?;
        }
        if let Some(m) = c.ipv6_auto_detection_method.as_deref().filter(|v| !v.is_empty()) {
            check_autodetection("ipv6AutoDetectionMethod", m, true)?;
        }
        let typha_replicas = c.typha_replicas.unwrap_or(0);
        if typha_replicas < 0 {
            return Err(CalicoError::Invalid { field: "typhaReplicas", value: typha_replicas.to_string(), why: "must not be negative" });
        }
        let mtu = c.mtu.unwrap_or(0);
        if mtu < 0 {
            return Err(CalicoError::Invalid { field: "mtu", value: mtu.to_string(), why: "must not be negative (0 lets Calico detect it)" });
        }
        let port = |field: &'static str, value: Option<i64>, default: i64| match value.unwrap_or(0) {
            0 => Ok(default),
            p @ 1..=65535 => Ok(p),
            p => Err(CalicoError::Invalid { field, value: p.to_string(), why: "must be a TCP port (1-65535)" }),
        };
        let felix_metrics_port = port("prometheusMetricsPort", c.prometheus_metrics_port, DEFAULT_FELIX_METRICS_PORT)?;
        let typha_metrics_port = port("typhaPrometheusMetricsPort", c.typha_prometheus_metrics_port, DEFAULT_TYPHA_METRICS_PORT)?;
        if c.wireguard_enabled == Some(true) && ipv6 {
            return Err(CalicoError::Forbidden { field: "wireguardEnabled", why: "WireGuard is not supported on IPv6 clusters" });
        }
        // The IPv4 pool is the kube-controller-manager's cluster CIDR (completed from podCIDR,
        // itself the upper half of nonMasqueradeCIDR), as in kOps' template.
        let pool_cidr = if ipv6 {
            None
        } else {
            let kcm = spec.kube_controller_manager.as_ref().and_then(|k| k.cluster_cidr);
            Some(kcm.ok_or(CalicoError::NoClusterCidr)?.to_string())
        };
        Ok(Settings {
            c,
            ipv6,
            encapsulation,
            ipv4_ipip,
            ipv4_vxlan,
            ipv6_vxlan,
            pool_cidr,
            mtu,
            typha_replicas,
            aws_src_dst_check,
            bpf_external_service_mode,
            bpf_log_level,
            chain_insert_mode,
            iptables_backend,
            nftables_mode,
            felix_metrics_port,
            typha_metrics_port,
        })
    }

    fn typha(&self) -> bool {
        self.typha_replicas > 0
    }

    /// The CNI network configuration (`__…__` placeholders are filled by `install-cni`).
    fn cni_network_config(&self) -> String {
        let ipam = if self.ipv6 {
            json!({"assign_ipv4": "false", "assign_ipv6": "true", "type": "host-local", "ranges": [[{"subnet": "usePodCidrIPv6"}]]})
        } else {
            json!({"assign_ipv4": "true", "assign_ipv6": "false", "type": "calico-ipam"})
        };
        let mut calico = json!({
            "type": "calico",
            "log_level": "info",
            "log_file_path": "/var/log/calico/cni/cni.log",
            "datastore_type": "kubernetes",
            "nodename": "__KUBERNETES_NODE_NAME__",
            "mtu": "__CNI_MTU__",
            "ipam": ipam,
            "policy": {"type": "k8s"},
            "kubernetes": {"kubeconfig": "__KUBECONFIG_FILEPATH__"},
        });
        if self.c.allow_ip_forwarding == Some(true) {
            calico["container_settings"] = json!({"allow_ip_forwarding": true});
        }
        let conf = json!({
            "name": "k8s-pod-network",
            "cniVersion": "0.3.1",
            "plugins": [calico, {"type": "portmap", "snat": true, "capabilities": {"portMappings": true}}],
        });
        // `mtu` is a number once install-cni substitutes it: write the placeholder unquoted.
        // A Value cannot fail to serialise; `{:#}` is its pretty form.
        let text = format!("{conf:#}");
        text.replace("\"__CNI_MTU__\"", "__CNI_MTU__")
    }

    fn config_map(&self) -> Value {
        let backend = match self.encapsulation {
            Encapsulation::Ipip => "bird",
            Encapsulation::Vxlan => "vxlan",
            Encapsulation::None => "none",
        };
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "calico-config", "namespace": NAMESPACE},
            "data": {
                "typha_service_name": if self.typha() { "calico-typha" } else { "none" },
                "calico_backend": backend,
                "veth_mtu": self.mtu.to_string(),
                "cni_network_config": self.cni_network_config(),
            },
        })
    }
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> Value {
    json!({"apiGroups": groups, "resources": resources, "verbs": verbs})
}

fn cluster_role(name: &str, rules: Vec<Value>) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name}, "rules": rules})
}

fn binding(name: &str, subject: Value) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [subject],
    })
}

fn service_account(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": NAMESPACE}})
}

fn sa_subject(name: &str) -> Value {
    json!({"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE})
}

const CRD: &str = "crd.projectcalico.org";

fn cluster_roles() -> Vec<Value> {
    let rw = ["get", "list", "create", "update", "delete", "watch"];
    let controllers = vec![
        rule(&[""], &["nodes"], &["watch", "list", "get"]),
        rule(&[""], &["pods"], &["get", "list", "watch"]),
        rule(&[""], &["namespaces"], &["get", "list", "watch"]),
        rule(&[""], &["services", "services/status"], &["get", "list", "update", "watch"]),
        rule(&[CRD], &["ipreservations"], &["list"]),
        rule(&[CRD], &["blockaffinities", "ipamblocks", "ipamhandles", "ipamconfigs", "tiers"], &rw),
        rule(&[CRD], &["ippools"], &["list", "watch"]),
        rule(&[CRD], &["hostendpoints"], &rw),
        rule(&[CRD], &["clusterinformations"], &["get", "list", "create", "update", "watch"]),
        rule(&[CRD], &["kubecontrollersconfigurations"], &["get", "list", "create", "update", "watch"]),
    ];
    let mut token = rule(&[""], &["serviceaccounts/token"], &["create"]);
    token["resourceNames"] = json!(["calico-cni-plugin"]);
    let node = vec![
        token,
        rule(&[""], &["pods", "nodes", "namespaces"], &["get"]),
        rule(&["discovery.k8s.io"], &["endpointslices"], &["watch", "list"]),
        rule(&[""], &["endpoints", "services"], &["watch", "list", "get"]),
        rule(&[""], &["configmaps"], &["get"]),
        rule(&[""], &["nodes/status"], &["patch", "update"]),
        rule(&["networking.k8s.io"], &["networkpolicies"], &["watch", "list"]),
        rule(&["policy.networking.k8s.io"], &["adminnetworkpolicies", "baselineadminnetworkpolicies"], &["watch", "list"]),
        rule(&[""], &["pods", "namespaces", "serviceaccounts"], &["list", "watch"]),
        rule(&[""], &["pods/status"], &["patch"]),
        rule(
            &[CRD],
            &[
                "globalfelixconfigs",
                "felixconfigurations",
                "bgppeers",
                "bgpfilters",
                "globalbgpconfigs",
                "bgpconfigurations",
                "ippools",
                "ipreservations",
                "ipamblocks",
                "globalnetworkpolicies",
                "stagedglobalnetworkpolicies",
                "networkpolicies",
                "stagednetworkpolicies",
                "stagedkubernetesnetworkpolicies",
                "globalnetworksets",
                "networksets",
                "clusterinformations",
                "hostendpoints",
                "blockaffinities",
                "caliconodestatuses",
                "tiers",
            ],
            &["get", "list", "watch"],
        ),
        rule(&[CRD], &["tiers"], &["create"]),
        rule(&[CRD], &["ippools", "felixconfigurations", "clusterinformations"], &["create", "update"]),
        rule(&[CRD], &["caliconodestatuses"], &["update"]),
        rule(&[""], &["nodes"], &["get", "list", "watch"]),
        rule(&[CRD], &["bgpconfigurations", "bgppeers"], &["create", "update"]),
        rule(&[CRD], &["blockaffinities", "ipamblocks", "ipamhandles"], &["get", "list", "create", "update", "delete"]),
        rule(&[CRD], &["ipamconfigs"], &["get", "create"]),
        rule(&[CRD], &["blockaffinities"], &["watch"]),
        rule(&["apps"], &["daemonsets"], &["get"]),
    ];
    let cni = vec![
        rule(&[""], &["pods", "nodes", "namespaces"], &["get"]),
        rule(&[""], &["pods/status"], &["patch"]),
        rule(
            &[CRD],
            &["blockaffinities", "ipamblocks", "ipamhandles", "clusterinformations", "ippools", "ipreservations", "ipamconfigs"],
            &["get", "list", "create", "update", "delete"],
        ),
    ];
    vec![
        cluster_role("calico-kube-controllers", controllers),
        cluster_role("calico-node", node),
        cluster_role("calico-cni-plugin", cni),
        cluster_role("calico-tier-getter", vec![rule(&["projectcalico.org"], &["tiers"], &["get"])]),
        binding("calico-kube-controllers", sa_subject("calico-kube-controllers")),
        binding("calico-node", sa_subject("calico-node")),
        binding("calico-cni-plugin", sa_subject("calico-cni-plugin")),
        binding("calico-tier-getter", json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:kube-controller-manager"})),
    ]
}

/// Calico v3.31's `crd.projectcalico.org/v1` kinds: (kind, plural, namespaced).
const CALICO_CRDS: &[(&str, &str, bool)] = &[
    ("BGPConfiguration", "bgpconfigurations", false),
    ("BGPFilter", "bgpfilters", false),
    ("BGPPeer", "bgppeers", false),
    ("BlockAffinity", "blockaffinities", false),
    ("CalicoNodeStatus", "caliconodestatuses", false),
    ("ClusterInformation", "clusterinformations", false),
    ("FelixConfiguration", "felixconfigurations", false),
    ("GlobalNetworkPolicy", "globalnetworkpolicies", false),
    ("GlobalNetworkSet", "globalnetworksets", false),
    ("HostEndpoint", "hostendpoints", false),
    ("IPAMBlock", "ipamblocks", false),
    ("IPAMConfig", "ipamconfigs", false),
    ("IPAMHandle", "ipamhandles", false),
    ("IPPool", "ippools", false),
    ("IPReservation", "ipreservations", false),
    ("KubeControllersConfiguration", "kubecontrollersconfigurations", false),
    ("NetworkPolicy", "networkpolicies", true),
    ("NetworkSet", "networksets", true),
    ("StagedGlobalNetworkPolicy", "stagedglobalnetworkpolicies", false),
    ("StagedKubernetesNetworkPolicy", "stagedkubernetesnetworkpolicies", true),
    ("StagedNetworkPolicy", "stagednetworkpolicies", true),
    ("Tier", "tiers", false),
];

/// One CustomResourceDefinition to render.
struct CrdDef {
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    namespaced: bool,
    short: Option<&'static str>,
}

/// The Kubernetes network-policy-api CRDs Calico ships (with their approval annotations and a
/// status subresource, as upstream declares them).
const NETWORK_POLICY_API: &str = "policy.networking.k8s.io";

/// A CRD with the minimal structural schema (see the module docs).
fn crd(d: &CrdDef) -> Value {
    let open = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    let mut names = json!({"kind": d.kind, "listKind": format!("{}List", d.kind), "plural": d.plural, "singular": d.kind.to_lowercase()});
    if let Some(s) = d.short {
        names["shortNames"] = json!([s]);
    }
    let mut v = json!({
        "name": d.version,
        "served": true,
        "storage": true,
        "schema": {"openAPIV3Schema": {"type": "object", "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": open,
            "status": open,
        }}},
    });
    let mut metadata = json!({"name": format!("{}.{}", d.plural, d.group)});
    if d.group == NETWORK_POLICY_API {
        v["subresources"] = json!({"status": {}});
        metadata["annotations"] = json!({
            "api-approved.kubernetes.io": "https://github.com/kubernetes-sigs/network-policy-api/pull/30",
            "policy.networking.k8s.io/bundle-version": "v0.1.1",
            "policy.networking.k8s.io/channel": "experimental",
        });
    }
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": metadata,
        "spec": {"group": d.group, "names": names, "scope": if d.namespaced { "Namespaced" } else { "Cluster" }, "versions": [v]},
    })
}

fn crds() -> Vec<Value> {
    let calico = CALICO_CRDS.iter().map(|&(kind, plural, namespaced)| CrdDef { group: CRD, version: "v1", kind, plural, namespaced, short: None });
    let policy = [("AdminNetworkPolicy", "adminnetworkpolicies", "anp"), ("BaselineAdminNetworkPolicy", "baselineadminnetworkpolicies", "banp")]
        .map(|(kind, plural, short)| CrdDef { group: NETWORK_POLICY_API, version: "v1alpha1", kind, plural, namespaced: false, short: Some(short) });
    calico.chain(policy).map(|d| crd(&d)).collect()
}

fn pdb(app: &str) -> Value {
    json!({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": app, "namespace": NAMESPACE, "labels": {"k8s-app": app}},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"k8s-app": app}}},
    })
}

fn value_env(name: &str, value: impl Into<String>) -> Value {
    json!({"name": name, "value": value.into()})
}

fn config_env(name: &str, key: &str) -> Value {
    json!({"name": name, "valueFrom": {"configMapKeyRef": {"name": "calico-config", "key": key}}})
}

fn node_name_env(name: &str) -> Value {
    json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
}

fn endpoint_env_from() -> Value {
    json!([{"configMapRef": {"name": "kubernetes-services-endpoint", "optional": true}}])
}

fn host_path(name: &str, path: &str, type_: Option<&str>) -> Value {
    let mut hp = json!({"path": path});
    if let Some(t) = type_ {
        hp["type"] = json!(t);
    }
    json!({"name": name, "hostPath": hp})
}

fn mount(name: &str, path: &str) -> Value {
    json!({"name": name, "mountPath": path})
}

fn flag(b: Option<bool>) -> String {
    b.unwrap_or(false).to_string()
}

fn node_env(s: &Settings) -> Vec<Value> {
    let c = s.c;
    let mut env = vec![value_env("DATASTORE_TYPE", "kubernetes")];
    if s.ipv6 {
        env.push(value_env("USE_POD_CIDR", "true"));
    }
    if s.typha() {
        env.push(config_env("FELIX_TYPHAK8SSERVICENAME", "typha_service_name"));
    }
    let (v4_method, v6_method) = if s.ipv6 { ("none", "first-found") } else { ("first-found", "none") };
    let or = |v: Option<&str>, d: &str| v.filter(|v| !v.is_empty()).unwrap_or(d).to_string();
    env.extend([
        value_env("WAIT_FOR_DATASTORE", "true"),
        node_name_env("NODENAME"),
        config_env("CALICO_NETWORKING_BACKEND", "calico_backend"),
        value_env("CLUSTER_TYPE", "kops,bgp"),
        value_env("IP", if s.ipv6 { "none" } else { "autodetect" }),
        value_env("IP6", if s.ipv6 { "autodetect" } else { "none" }),
        value_env("IP_AUTODETECTION_METHOD", or(c.ipv4_auto_detection_method.as_deref(), v4_method)),
        value_env("IP6_AUTODETECTION_METHOD", or(c.ipv6_auto_detection_method.as_deref(), v6_method)),
        value_env("CALICO_IPV4POOL_IPIP", s.ipv4_ipip.clone()),
        value_env("CALICO_IPV4POOL_VXLAN", s.ipv4_vxlan.clone()),
        value_env("CALICO_IPV6POOL_VXLAN", s.ipv6_vxlan.clone()),
        config_env("FELIX_IPINIPMTU", "veth_mtu"),
        config_env("FELIX_VXLANMTU", "veth_mtu"),
        config_env("FELIX_WIREGUARDMTU", "veth_mtu"),
    ]);
    match &s.pool_cidr {
        None => env.extend([value_env("CALICO_ROUTER_ID", "hash"), value_env("NO_DEFAULT_POOLS", "true")]),
        Some(cidr) => env.push(value_env("CALICO_IPV4POOL_CIDR", cidr.clone())),
    }
    env.extend([
        value_env("CALICO_DISABLE_FILE_LOGGING", "true"),
        value_env("FELIX_DEFAULTENDPOINTTOHOSTACTION", "ACCEPT"),
        value_env("FELIX_IPV6SUPPORT", s.ipv6.to_string()),
        value_env("FELIX_HEALTHENABLED", "true"),
        value_env("FELIX_AWSSRCDSTCHECK", s.aws_src_dst_check.clone()),
        value_env("FELIX_BPFENABLED", flag(c.bpf_enabled)),
        value_env("FELIX_BPFEXTERNALSERVICEMODE", s.bpf_external_service_mode.clone()),
        value_env("FELIX_BPFKUBEPROXYIPTABLESCLEANUPENABLED", flag(c.bpf_kube_proxy_iptables_cleanup_enabled)),
        value_env("FELIX_BPFLOGLEVEL", s.bpf_log_level.clone()),
        value_env("FELIX_CHAININSERTMODE", s.chain_insert_mode.clone()),
        value_env("FELIX_IPTABLESBACKEND", s.iptables_backend.clone()),
    ]);
    if let Some(m) = &s.nftables_mode {
        env.push(value_env("FELIX_NFTABLESMODE", m.clone()));
    }
    env.extend([
        value_env("FELIX_LOGSEVERITYSCREEN", or(c.log_severity_screen.as_deref(), "info")),
        value_env("FELIX_PROMETHEUSMETRICSENABLED", flag(c.prometheus_metrics_enabled)),
        value_env("FELIX_PROMETHEUSMETRICSPORT", s.felix_metrics_port.to_string()),
        value_env("FELIX_PROMETHEUSGOMETRICSENABLED", flag(c.prometheus_go_metrics_enabled)),
        value_env("FELIX_PROMETHEUSPROCESSMETRICSENABLED", flag(c.prometheus_process_metrics_enabled)),
        value_env("FELIX_WIREGUARDENABLED", flag(c.wireguard_enabled)),
    ]);
    env
}

fn daemonset(s: &Settings, images: &CalicoImages) -> Value {
    let c = s.c;
    let privileged = json!({"privileged": true});
    let mut inits = Vec::new();
    if !s.ipv6 {
        inits.push(json!({
            "name": "upgrade-ipam",
            "image": images.cni,
            "imagePullPolicy": "IfNotPresent",
            "command": ["/opt/cni/bin/calico-ipam", "-upgrade"],
            "envFrom": endpoint_env_from(),
            "env": [node_name_env("KUBERNETES_NODE_NAME"), config_env("CALICO_NETWORKING_BACKEND", "calico_backend")],
            "volumeMounts": [mount("host-local-net-dir", "/var/lib/cni/networks"), mount("cni-bin-dir", "/host/opt/cni/bin")],
            "securityContext": privileged,
        }));
    }
    inits.push(json!({
        "name": "install-cni",
        "image": images.cni,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/opt/cni/bin/install"],
        "envFrom": endpoint_env_from(),
        "env": [
            value_env("CNI_CONF_NAME", "10-calico.conflist"),
            config_env("CNI_NETWORK_CONFIG", "cni_network_config"),
            node_name_env("KUBERNETES_NODE_NAME"),
            config_env("CNI_MTU", "veth_mtu"),
            value_env("SLEEP", "false"),
        ],
        "volumeMounts": [mount("cni-bin-dir", "/host/opt/cni/bin"), mount("cni-net-dir", "/host/etc/cni/net.d")],
        "securityContext": privileged,
    }));
    inits.push(json!({
        "name": "ebpf-bootstrap",
        "image": images.node,
        "imagePullPolicy": "IfNotPresent",
        "command": ["calico-node", "-init", "-best-effort"],
        "volumeMounts": [
            {"name": "sys-fs", "mountPath": "/sys/fs", "mountPropagation": "Bidirectional"},
            {"name": "var-run-calico", "mountPath": "/var/run/calico", "mountPropagation": "Bidirectional"},
            {"name": "nodeproc", "mountPath": "/nodeproc", "readOnly": true},
        ],
        "securityContext": privileged,
    }));
    let bird = match (s.encapsulation, s.ipv6) {
        (Encapsulation::Ipip, false) => Some(("-bird-live", "-bird-ready")),
        (Encapsulation::Ipip, true) => Some(("-bird6-live", "-bird6-ready")),
        _ => None,
    };
    let mut live = vec!["/bin/calico-node", "-felix-live"];
    let mut ready = vec!["/bin/calico-node", "-felix-ready"];
    if let Some((l, r)) = bird {
        live.push(l);
        ready.push(r);
    }
    let cpu = c.cpu_request.as_ref().map_or("250m".to_string(), |q| q.to_string());
    let mut node = json!({
        "name": "calico-node",
        "image": images.node,
        "imagePullPolicy": "IfNotPresent",
        "envFrom": endpoint_env_from(),
        "env": node_env(s),
        "securityContext": privileged,
        "resources": {"requests": {"cpu": cpu}},
        "lifecycle": {"preStop": {"exec": {"command": ["/bin/calico-node", "-shutdown"]}}},
        "livenessProbe": {"exec": {"command": live}, "periodSeconds": 10, "initialDelaySeconds": 10, "failureThreshold": 6, "timeoutSeconds": 10},
        "readinessProbe": {"exec": {"command": ready}, "periodSeconds": 10, "timeoutSeconds": 10},
        "volumeMounts": [
            {"name": "cni-net-dir", "mountPath": "/host/etc/cni/net.d", "readOnly": false},
            {"name": "lib-modules", "mountPath": "/lib/modules", "readOnly": true},
            {"name": "xtables-lock", "mountPath": "/run/xtables.lock", "readOnly": false},
            {"name": "var-run-calico", "mountPath": "/var/run/calico", "readOnly": false},
            {"name": "var-lib-calico", "mountPath": "/var/lib/calico", "readOnly": false},
            mount("policysync", "/var/run/nodeagent"),
            mount("bpffs", "/sys/fs/bpf"),
            {"name": "cni-log-dir", "mountPath": "/var/log/calico/cni", "readOnly": true},
        ],
    });
    if c.prometheus_metrics_enabled == Some(true) {
        node["ports"] = json!([{"containerPort": s.felix_metrics_port, "name": "metrics", "protocol": "TCP"}]);
    }
    let mut volumes = vec![
        host_path("lib-modules", "/lib/modules", None),
        host_path("var-run-calico", "/var/run/calico", Some("DirectoryOrCreate")),
        host_path("var-lib-calico", "/var/lib/calico", Some("DirectoryOrCreate")),
        host_path("xtables-lock", "/run/xtables.lock", Some("FileOrCreate")),
        host_path("sys-fs", "/sys/fs/", Some("DirectoryOrCreate")),
        host_path("bpffs", "/sys/fs/bpf", Some("Directory")),
        host_path("nodeproc", "/proc", None),
        host_path("cni-bin-dir", "/opt/cni/bin", Some("DirectoryOrCreate")),
        host_path("cni-net-dir", "/etc/cni/net.d", None),
        host_path("cni-log-dir", "/var/log/calico/cni", None),
    ];
    if !s.ipv6 {
        volumes.push(host_path("host-local-net-dir", "/var/lib/cni/networks", None));
    }
    volumes.push(host_path("policysync", "/var/run/nodeagent", Some("DirectoryOrCreate")));
    let labels = json!({"k8s-app": "calico-node"});
    json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "calico-node", "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"kubernetes.io/os": "linux"},
                    "hostNetwork": true,
                    "tolerations": [
                        {"effect": "NoSchedule", "operator": "Exists"},
                        {"key": "CriticalAddonsOnly", "operator": "Exists"},
                        {"effect": "NoExecute", "operator": "Exists"},
                    ],
                    "serviceAccountName": "calico-node",
                    "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                    "terminationGracePeriodSeconds": 0,
                    "priorityClassName": "system-node-critical",
                    "initContainers": inits,
                    "containers": [node],
                    "volumes": volumes,
                },
            },
        },
    })
}

fn kube_controllers(image: &str) -> Value {
    let labels = json!({"k8s-app": "calico-kube-controllers"});
    let linux = json!({"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]});
    let term = |role: &str| json!({"matchExpressions": [{"key": role, "operator": "Exists"}, linux]});
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "calico-kube-controllers", "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "strategy": {"type": "Recreate"},
            "template": {
                "metadata": {"name": "calico-kube-controllers", "namespace": NAMESPACE, "labels": labels},
                "spec": {
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                        term("node-role.kubernetes.io/control-plane"),
                        term("node-role.kubernetes.io/master"),
                    ]}}},
                    "tolerations": [
                        {"key": "CriticalAddonsOnly", "operator": "Exists"},
                        {"key": "node-role.kubernetes.io/master", "effect": "NoSchedule"},
                        {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"},
                    ],
                    "serviceAccountName": "calico-kube-controllers",
                    "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                    "priorityClassName": "system-cluster-critical",
                    "containers": [{
                        "name": "calico-kube-controllers",
                        "image": image,
                        "imagePullPolicy": "IfNotPresent",
                        "env": [value_env("ENABLED_CONTROLLERS", "node,loadbalancer"), value_env("DATASTORE_TYPE", "kubernetes")],
                        "livenessProbe": {"exec": {"command": ["/usr/bin/check-status", "-l"]}, "periodSeconds": 10, "initialDelaySeconds": 10, "failureThreshold": 6, "timeoutSeconds": 10},
                        "readinessProbe": {"exec": {"command": ["/usr/bin/check-status", "-r"]}, "periodSeconds": 10},
                        "securityContext": {"runAsNonRoot": true},
                    }],
                },
            },
        },
    })
}

fn typha_service() -> Value {
    let labels = json!({"k8s-app": "calico-typha"});
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "calico-typha", "namespace": NAMESPACE, "labels": labels},
        "spec": {"ports": [{"port": TYPHA_PORT, "protocol": "TCP", "targetPort": "calico-typha", "name": "calico-typha"}], "selector": labels},
    })
}

fn typha(s: &Settings, image: &str) -> Value {
    let metrics = s.c.typha_prometheus_metrics_enabled == Some(true);
    let mut ports = vec![json!({"containerPort": TYPHA_PORT, "name": "calico-typha", "protocol": "TCP"})];
    if metrics {
        ports.push(json!({"containerPort": s.typha_metrics_port, "name": "metrics", "protocol": "TCP"}));
    }
    let probe = |path: &str| json!({"path": path, "port": TYPHA_HEALTH_PORT, "host": "localhost"});
    let labels = json!({"k8s-app": "calico-typha"});
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "calico-typha", "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "replicas": s.typha_replicas,
            "revisionHistoryLimit": 2,
            "selector": {"matchLabels": labels},
            "strategy": {"rollingUpdate": {"maxSurge": "100%", "maxUnavailable": 1}, "type": "RollingUpdate"},
            "template": {
                "metadata": {"labels": labels, "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"}},
                "spec": {
                    "nodeSelector": {"kubernetes.io/os": "linux"},
                    "hostNetwork": true,
                    "terminationGracePeriodSeconds": 300,
                    "tolerations": [
                        {"key": "CriticalAddonsOnly", "operator": "Exists"},
                        {"effect": "NoSchedule", "operator": "Exists"},
                        {"effect": "NoExecute", "operator": "Exists"},
                    ],
                    "serviceAccountName": "calico-node",
                    "priorityClassName": "system-cluster-critical",
                    "securityContext": {"fsGroup": 65534, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "calico-typha",
                        "image": image,
                        "imagePullPolicy": "IfNotPresent",
                        "ports": ports,
                        "envFrom": endpoint_env_from(),
                        "env": [
                            value_env("TYPHA_LOGSEVERITYSCREEN", "info"),
                            value_env("TYPHA_LOGFILEPATH", "none"),
                            value_env("TYPHA_LOGSEVERITYSYS", "none"),
                            value_env("TYPHA_CONNECTIONREBALANCINGMODE", "kubernetes"),
                            value_env("TYPHA_DATASTORETYPE", "kubernetes"),
                            value_env("TYPHA_HEALTHENABLED", "true"),
                            value_env("TYPHA_SHUTDOWNTIMEOUTSECS", "300"),
                            value_env("TYPHA_PROMETHEUSMETRICSENABLED", metrics.to_string()),
                            value_env("TYPHA_PROMETHEUSMETRICSPORT", s.typha_metrics_port.to_string()),
                        ],
                        "livenessProbe": {"httpGet": probe("/liveness"), "periodSeconds": 30, "initialDelaySeconds": 30, "timeoutSeconds": 10},
                        "readinessProbe": {"httpGet": probe("/readiness"), "periodSeconds": 10, "timeoutSeconds": 10},
                        "securityContext": {"runAsNonRoot": true, "allowPrivilegeEscalation": false},
                    }],
                },
            },
        },
    })
}

/// The addon's documents, in kOps' order, or `None` when the completed spec does not name Calico.
pub fn docs(cluster: &Cluster, versions: &Versions) -> Result<Option<Vec<Value>>, CalicoError> {
    let Some(c) = cluster.spec.networking.as_ref().and_then(|n| n.calico.as_ref()) else { return Ok(None) };
    let s = Settings::new(cluster, c)?;
    let images = versions.calico_images(c.registry.as_deref().filter(|r| !r.is_empty()), c.version.as_deref().filter(|v| !v.is_empty()));
    let mut docs = Vec::new();
    if c.bpf_enabled == Some(true) {
        docs.push(json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "kubernetes-services-endpoint", "namespace": NAMESPACE},
            "data": {"KUBERNETES_SERVICE_HOST": format!("api.internal.{}", cluster.name()), "KUBERNETES_SERVICE_PORT": "443"},
        }));
    }
    docs.push(pdb("calico-kube-controllers"));
    if s.typha() {
        docs.push(pdb("calico-typha"));
    }
    docs.extend(["calico-kube-controllers", "calico-node", "calico-cni-plugin"].map(service_account));
    docs.push(s.config_map());
    docs.extend(crds());
    docs.extend(cluster_roles());
    if s.typha() {
        docs.push(typha_service());
    }
    docs.push(daemonset(&s, &images));
    docs.push(kube_controllers(&images.kube_controllers));
    if s.typha() {
        docs.push(typha(&s, &images.typha));
    }
    Ok(Some(docs))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::addons::tests::case;

    fn calico_of(cluster: &mut Cluster) -> &mut CalicoNetworkingSpec {
        cluster.spec.networking.as_mut().and_then(|n| n.calico.as_mut()).expect("calico")
    }

    fn kind<'a>(docs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
        docs.iter().find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
    }

    fn node_env_of(docs: &[Value]) -> std::collections::BTreeMap<String, Value> {
        let ds = kind(docs, "DaemonSet", "calico-node").expect("daemonset");
        ds["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .expect("env")
            .iter()
            .map(|e| (e["name"].as_str().unwrap_or_default().to_string(), e.get("value").cloned().unwrap_or(Value::Null)))
            .collect()
    }

    #[test]
    fn completion_fills_calico_as_kops_does() {
        let (cluster, _) = case("privatecalico");
        let c = cluster.spec.networking.as_ref().and_then(|n| n.calico.as_ref()).expect("calico");
        assert_eq!(c.encapsulation_mode.as_deref(), Some("ipip"));
        assert_eq!(c.version, None, "kOps leaves the version to the template");
        assert_eq!(c.vxlan_mode, None);
    }

    #[test]
    fn config_and_env_follow_the_spec() {
        let (cluster, versions) = case("privatecalico");
        let docs = docs(&cluster, &versions).expect("valid").expect("calico");
        let data = &kind(&docs, "ConfigMap", "calico-config").expect("config")["data"];
        assert_eq!((&data["calico_backend"], &data["typha_service_name"], &data["veth_mtu"]), (&json!("bird"), &json!("none"), &json!("0")));
        let cni: Value =
            serde_json::from_str(&data["cni_network_config"].as_str().expect("conflist").replace("__CNI_MTU__", "1440")).expect("conflist is JSON");
        let types: Vec<&str> = cni["plugins"].as_array().expect("plugins").iter().filter_map(|p| p["type"].as_str()).collect();
        assert_eq!(types, ["calico", "portmap"]);
        assert_eq!(cni["plugins"][0]["ipam"]["type"], "calico-ipam");
        assert_eq!(cni["plugins"][0]["mtu"], 1440);
        let env = node_env_of(&docs);
        assert_eq!(env["CALICO_IPV4POOL_CIDR"], "100.96.0.0/11");
        assert_eq!((&env["CALICO_IPV4POOL_IPIP"], &env["CALICO_IPV4POOL_VXLAN"]), (&json!("CrossSubnet"), &json!("Never")));
        assert_eq!(env["FELIX_AWSSRCDSTCHECK"], "Disable");
        assert_eq!(env["IP_AUTODETECTION_METHOD"], "first-found");
        assert_eq!(env["FELIX_BPFENABLED"], "false");
        assert!(!env.contains_key("FELIX_TYPHAK8SSERVICENAME"));
        let ds = kind(&docs, "DaemonSet", "calico-node").expect("daemonset");
        let inits: Vec<&str> = ds["spec"]["template"]["spec"]["initContainers"].as_array().expect("inits").iter().filter_map(|c| c["name"].as_str()).collect();
        assert_eq!(inits, ["upgrade-ipam", "install-cni", "ebpf-bootstrap"]);
        let live = &ds["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["exec"]["command"];
        assert_eq!(live, &json!(["/bin/calico-node", "-felix-live", "-bird-live"]));

        let mut vx = cluster.clone();
        let c = calico_of(&mut vx);
        c.encapsulation_mode = Some("vxlan".into());
        c.vxlan_mode = Some("Always".into());
        c.mtu = Some(8981);
        c.ipv4_auto_detection_method = Some("can-reach=8.8.8.8".into());
        c.aws_src_dst_check = Some("DoNothing".into());
        c.wireguard_enabled = Some(true);
        c.log_severity_screen = Some("debug".into());
        c.prometheus_metrics_enabled = Some(true);
        c.prometheus_metrics_port = Some(9095);
        c.allow_ip_forwarding = Some(true);
        let docs = super::docs(&vx, &versions).expect("valid").expect("calico");
        let data = &kind(&docs, "ConfigMap", "calico-config").expect("config")["data"];
        assert_eq!((&data["calico_backend"], &data["veth_mtu"]), (&json!("vxlan"), &json!("8981")));
        assert!(data["cni_network_config"].as_str().expect("conflist").contains("\"allow_ip_forwarding\": true"));
        let env = node_env_of(&docs);
        assert_eq!(
            (&env["CALICO_IPV4POOL_IPIP"], &env["CALICO_IPV4POOL_VXLAN"], &env["CALICO_IPV6POOL_VXLAN"]),
            (&json!("Never"), &json!("Always"), &json!("Always"))
        );
        assert_eq!(env["IP_AUTODETECTION_METHOD"], "can-reach=8.8.8.8");
        assert_eq!(env["FELIX_AWSSRCDSTCHECK"], "DoNothing");
        assert_eq!(env["FELIX_WIREGUARDENABLED"], "true");
        assert_eq!(env["FELIX_LOGSEVERITYSCREEN"], "debug");
        assert_eq!(env["FELIX_PROMETHEUSMETRICSPORT"], "9095");
        let ds = kind(&docs, "DaemonSet", "calico-node").expect("daemonset");
        let node = &ds["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(node["ports"][0]["containerPort"], 9095);
        assert_eq!(node["livenessProbe"]["exec"]["command"], json!(["/bin/calico-node", "-felix-live"]));
    }

    #[test]
    fn bpf_mode_talks_to_the_api_server_and_needs_kube_proxy_off() {
        let (cluster, versions) = case("privatecalico");
        let mut bpf = cluster.clone();
        calico_of(&mut bpf).bpf_enabled = Some(true);
        assert_eq!(docs(&bpf, &versions).expect_err("kube-proxy on"), CalicoError::KubeProxyWithBpf);
        bpf.spec.kube_proxy.get_or_insert_with(Default::default).enabled = Some(false);
        let out = docs(&bpf, &versions).expect("valid").expect("calico");
        let endpoint = kind(&out, "ConfigMap", "kubernetes-services-endpoint").expect("endpoint config map");
        assert_eq!(endpoint["data"]["KUBERNETES_SERVICE_HOST"], "api.internal.privatecalico.example.com");
        assert_eq!(node_env_of(&out)["FELIX_BPFENABLED"], "true");
        assert!(kind(&docs(&cluster, &versions).expect("valid").expect("calico"), "ConfigMap", "kubernetes-services-endpoint").is_none());
    }

    #[test]
    fn typha_only_when_asked() {
        let (cluster, versions) = case("privatecalico");
        let plain = docs(&cluster, &versions).expect("valid").expect("calico");
        assert!(!plain.iter().any(|d| d["metadata"]["name"] == "calico-typha"));
        let mut t = cluster.clone();
        calico_of(&mut t).typha_replicas = Some(3);
        calico_of(&mut t).typha_prometheus_metrics_enabled = Some(true);
        let out = docs(&t, &versions).expect("valid").expect("calico");
        for k in ["PodDisruptionBudget", "Service", "Deployment"] {
            assert!(kind(&out, k, "calico-typha").is_some(), "no typha {k}");
        }
        let dep = kind(&out, "Deployment", "calico-typha").expect("typha");
        assert_eq!(dep["spec"]["replicas"], 3);
        assert_eq!(dep["spec"]["template"]["spec"]["containers"][0]["image"], "docker.io/calico/typha:v3.31.6");
        assert_eq!(dep["spec"]["template"]["spec"]["containers"][0]["ports"][1]["containerPort"], 9093);
        assert_eq!(kind(&out, "ConfigMap", "calico-config").expect("config")["data"]["typha_service_name"], "calico-typha");
        assert!(node_env_of(&out).contains_key("FELIX_TYPHAK8SSERVICENAME"));
    }

    #[test]
    fn images_are_versioned_and_remapped() {
        let (cluster, versions) = case("privatecalico");
        let out = docs(&cluster, &versions).expect("valid").expect("calico");
        let ds = &kind(&out, "DaemonSet", "calico-node").expect("daemonset")["spec"]["template"]["spec"];
        assert_eq!(ds["containers"][0]["image"], "docker.io/calico/node:v3.31.6");
        assert_eq!(ds["initContainers"][0]["image"], "docker.io/calico/cni:v3.31.6");
        let kc = kind(&out, "Deployment", "calico-kube-controllers").expect("kube-controllers");
        assert_eq!(kc["spec"]["template"]["spec"]["containers"][0]["image"], "docker.io/calico/kube-controllers:v3.31.6");

        let mut custom = cluster.clone();
        calico_of(&mut custom).registry = Some("quay.io".into());
        calico_of(&mut custom).version = Some("v3.31.2".into());
        let opts = crate::versions::LookupOptions { container_registry: Some("10.0.0.1:5000".into()), ..Default::default() };
        let remapped = Versions::for_kubernetes(&"1.34.4".parse().expect("version"), &opts).expect("versions");
        let out = docs(&custom, &remapped).expect("valid").expect("calico");
        let ds = &kind(&out, "DaemonSet", "calico-node").expect("daemonset")["spec"]["template"]["spec"];
        assert_eq!(ds["containers"][0]["image"], "10.0.0.1:5000/quay.io-calico-node:v3.31.2");
    }

    #[test]
    fn crds_are_structural_and_complete() {
        let (cluster, versions) = case("privatecalico");
        let out = docs(&cluster, &versions).expect("valid").expect("calico");
        let crds: Vec<&Value> = out.iter().filter(|d| d["kind"] == "CustomResourceDefinition").collect();
        assert_eq!(crds.len(), 24);
        let ippools = crds.iter().find(|d| d["metadata"]["name"] == "ippools.crd.projectcalico.org").expect("ippools");
        assert_eq!(ippools["spec"]["names"]["kind"], "IPPool");
        assert_eq!(ippools["spec"]["scope"], "Cluster");
        assert_eq!(ippools["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["x-kubernetes-preserve-unknown-fields"], true);
        let np = crds.iter().find(|d| d["metadata"]["name"] == "networkpolicies.crd.projectcalico.org").expect("networkpolicies");
        assert_eq!(np["spec"]["scope"], "Namespaced");
    }

    #[test]
    fn no_addon_without_calico_and_networking_comes_right_after_rbac() {
        let (cluster, versions) = crate::addons::tests::ha();
        assert!(docs(&cluster, &versions).expect("valid").is_none());
        let (cluster, versions) = case("privatecalico");
        let names: Vec<&str> = crate::addons::addons(&cluster, &versions).expect("addons").iter().map(|a| a.name).collect();
        assert_eq!(names[..2], ["bootstrap-rbac.keelson.io", NAME]);
    }

    #[test]
    fn bad_values_name_their_field() {
        let (cluster, versions) = case("privatecalico");
        let err = |edit: &dyn Fn(&mut CalicoNetworkingSpec)| {
            let mut c = cluster.clone();
            edit(calico_of(&mut c));
            docs(&c, &versions).expect_err("invalid").to_string()
        };
        assert_eq!(err(&|c| c.encapsulation_mode = Some("gre".into())), "spec.networking.calico.encapsulationMode: \"gre\" is not one of ipip, vxlan, none");
        assert!(err(&|c| c.encapsulation_mode = Some("none".into()))
            .starts_with("spec.networking.calico.encapsulationMode: encapsulationMode \"none\" is only supported"));
        assert!(err(&|c| c.vxlan_mode = Some("Always".into())).starts_with("spec.networking.calico.vxlanMode: VXLAN encapsulation requires"));
        assert_eq!(err(&|c| c.ipip_mode = Some("Sometimes".into())), "spec.networking.calico.ipipMode: \"Sometimes\" is not one of Always, CrossSubnet, Never");
        assert_eq!(
            err(&|c| c.aws_src_dst_check = Some("Maybe".into())),
            "spec.networking.calico.awsSrcDstCheck: \"Maybe\" is not one of Enable, Disable, DoNothing"
        );
        assert!(err(&|c| c.ipv4_auto_detection_method = Some("can-reach=::1".into()))
            .starts_with("spec.networking.calico.ipv4AutoDetectionMethod: \"can-reach=::1\": must be a valid IPv4"));
        assert!(err(&|c| c.ipv4_auto_detection_method = Some("guess".into())).ends_with("unsupported autodetection method"));
        assert!(err(&|c| c.typha_replicas = Some(-1)).starts_with("spec.networking.calico.typhaReplicas: \"-1\""));
        assert!(err(&|c| c.mtu = Some(-5)).starts_with("spec.networking.calico.mtu:"));
        assert!(err(&|c| c.encapsulation_mode = None).starts_with("spec.networking.calico.encapsulationMode: required"));
        let mut no_cidr = cluster.clone();
        no_cidr.spec.kube_controller_manager.as_mut().expect("kcm").cluster_cidr = None;
        assert!(docs(&no_cidr, &versions).expect_err("no pool").to_string().starts_with("spec.kubeControllerManager.clusterCIDR:"));
    }

    #[test]
    fn ipv6_only_clusters_use_pod_cidrs_and_no_encapsulation() {
        let (mut cluster, versions) = case("minimal-ipv6");
        let networking = cluster.spec.networking.get_or_insert_with(Default::default);
        networking.cni = None;
        networking.calico = Some(CalicoNetworkingSpec { encapsulation_mode: Some("none".into()), ..Default::default() });
        let out = docs(&cluster, &versions).expect("valid").expect("calico");
        let data = &kind(&out, "ConfigMap", "calico-config").expect("config")["data"];
        assert_eq!(data["calico_backend"], "none");
        assert!(data["cni_network_config"].as_str().expect("conflist").contains("usePodCidrIPv6"));
        let env = node_env_of(&out);
        assert_eq!(
            (&env["IP"], &env["IP6"], &env["USE_POD_CIDR"], &env["NO_DEFAULT_POOLS"]),
            (&json!("none"), &json!("autodetect"), &json!("true"), &json!("true"))
        );
        assert!(!env.contains_key("CALICO_IPV4POOL_CIDR"));
        assert_eq!(env["FELIX_AWSSRCDSTCHECK"], "DoNothing");
        let ds = kind(&out, "DaemonSet", "calico-node").expect("daemonset");
        let inits: Vec<&str> = ds["spec"]["template"]["spec"]["initContainers"].as_array().expect("inits").iter().filter_map(|c| c["name"].as_str()).collect();
        assert_eq!(inits, ["install-cni", "ebpf-bootstrap"]);
        calico_of(&mut cluster).encapsulation_mode = Some("ipip".into());
        assert!(docs(&cluster, &versions).expect_err("ipip on IPv6").to_string().starts_with("spec.networking.calico.encapsulationMode: IPv6 requires"));
    }

    #[test]
    fn autodetection_methods() {
        for ok in ["first-found", "can-reach=10.0.0.1", "interface=eth0", "interface=eth.*, ens.*", "skip-interface=docker0"] {
            assert!(check_autodetection("ipv4AutoDetectionMethod", ok, false).is_ok(), "{ok}");
        }
        assert!(check_autodetection("ipv6AutoDetectionMethod", "can-reach=2001:db8::1", true).is_ok());
        for bad in ["interface=", "can-reach=1.2.3", "first-found=x", "a=b=c", ""] {
            assert!(check_autodetection("ipv4AutoDetectionMethod", bad, false).is_err(), "{bad}");
        }
    }
}
