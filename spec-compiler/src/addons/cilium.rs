//! The Cilium networking addon (`networking.cilium.io`), rendered from the completed
//! `spec.networking.cilium` (defaults filled by `complete::network::cilium`, kOps'
//! `CiliumOptionsBuilder`). Facts from kOps' `networking.cilium.io/k8s-1.16-v1.15.yaml.template` at the
//! commit the versions table mirrors: the `cilium` and `cilium-operator` ServiceAccounts, their
//! ClusterRoles and bindings, the `cilium-config-agent` Role in kube-system, the `cilium-config`
//! ConfigMap, the agent DaemonSet (host network, init containers `config`, `mount-cgroup`,
//! `apply-sysctl-overwrites`, `mount-bpf-fs`, `clean-cilium-state`, `install-cni-binaries`), the
//! operator Deployment and its PodDisruptionBudget. Cilium creates its CRDs itself when it starts.
//!
//! Not rendered, each refused naming its field rather than silently dropped: Hubble
//! (`hubble.enabled`: kOps needs cert-manager for its TLS), Cilium Ingress and Gateway API
//! (`ingress.enabled`, `gatewayAPI.enabled`) and IPsec encryption (`enableEncryption` with
//! `encryptionType: ipsec`: kOps reads its key from a secret store entry we do not write); WireGuard
//! encryption is rendered. Differences from kOps, on purpose: `enablePolicy`, `bpfPolicyMapMax`,
//! `bpfLBMapMax`, `bpfLBAlgorithm` and `bpfLBMaglevTableSize` reach the ConfigMap (kOps' template
//! hard-codes the first three to their defaults and drops the others); like kOps, the conntrack, NAT
//! and neighbour table sizes stay with Cilium's dynamic sizing (`bpf-map-dynamic-size-ratio`).

use std::collections::BTreeMap;

use serde_json::{json, Value};

use keelson_api::{CiliumNetworkingSpec, Cluster};

use crate::versions::{Versions, CILIUM_MINOR};

/// The addon's name (kOps' name for it).
pub const NAME: &str = "networking.cilium.io";
const NAMESPACE: &str = "kube-system";
const FIELD: &str = "spec.networking.cilium";
/// The agent's health endpoint (Cilium's `agent-health-port` default).
const AGENT_HEALTH_PORT: u16 = 9879;
/// The operator's API / health endpoint.
const OPERATOR_API_PORT: u16 = 9234;

/// A completed `spec.networking.cilium` this addon cannot render, naming the field.
#[derive(Debug, thiserror::Error)]
pub enum CiliumError {
    #[error("{FIELD}.{field}: required (completion fills it)")]
    Missing { field: &'static str },
    #[error("{FIELD}.{field}: {value:?} is not one of {allowed}")]
    Value { field: &'static str, value: String, allowed: &'static str },
    #[error("{FIELD}.version: {value:?} is not a Cilium version v{}.{}.x (the only minor the manifest is written for)", CILIUM_MINOR.0, CILIUM_MINOR.1)]
    Version { value: String },
    #[error("{FIELD}.identityAllocationMode: \"kvstore\" needs etcdManaged: true")]
    KvstoreWithoutEtcd,
    #[error("{FIELD}.{field}: not rendered by Keelson yet ({why})")]
    Unsupported { field: &'static str, why: &'static str },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ipam {
    Kubernetes,
    Eni,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tunnel {
    Vxlan,
    Geneve,
    Disabled,
}

/// One allowed value of a string field, by table.
fn one_of<T: Copy>(field: &'static str, value: Option<&str>, table: &[(&str, T)], allowed: &'static str) -> Result<T, CiliumError> {
    let value = value.ok_or(CiliumError::Missing { field })?;
    table.iter().find(|(k, _)| *k == value).map(|(_, v)| *v).ok_or_else(|| CiliumError::Value { field, value: value.to_string(), allowed })
}

fn string_of(field: &'static str, value: Option<&str>, allowed: &'static [&'static str]) -> Result<String, CiliumError> {
    let value = value.ok_or(CiliumError::Missing { field })?;
    if allowed.contains(&value) {
        Ok(value.to_string())
    } else {
        Err(CiliumError::Value { field, value: value.to_string(), allowed: allowed_text(allowed) })
    }
}

fn allowed_text(allowed: &'static [&'static str]) -> &'static str {
    match allowed {
        ["crd", "kvstore"] => "crd, kvstore",
        ["low", "medium", "maximum"] => "low, medium, maximum",
        ["random", "maglev"] => "random, maglev",
        ["default", "always", "never"] => "default, always, never",
        ["refused", "nameError"] => "refused, nameError",
        _ => "the documented values",
    }
}

/// `vMAJOR.MINOR.PATCH[-pre]` of the supported minor.
fn check_version(value: &str) -> Result<(), CiliumError> {
    let bad = || CiliumError::Version { value: value.to_string() };
    let core = value.strip_prefix('v').ok_or_else(bad)?;
    let core = core.split(['-', '+']).next().unwrap_or("");
    let parts: Vec<u64> = core.split('.').map(|p| p.parse::<u64>().map_err(|_| bad())).collect::<Result<_, _>>()?;
    match parts.as_slice() {
        [major, minor, _] if (*major, *minor) == CILIUM_MINOR => Ok(()),
        _ => Err(bad()),
    }
}

fn flag(b: Option<bool>) -> String {
    b.unwrap_or(false).to_string()
}

/// `KubernetesCluster=<name>` plus `spec.cloudLabels`, sorted (kOps' `CloudLabels`).
fn cloud_labels(cluster: &Cluster) -> String {
    let mut labels = vec![format!("KubernetesCluster={}", cluster.name())];
    labels.extend(cluster.spec.cloud_labels.iter().flatten().map(|(k, v)| format!("{k}={v}")));
    labels.sort();
    labels.join(",")
}

/// The parsed settings the manifest is made from.
struct Settings<'a> {
    c: &'a CiliumNetworkingSpec,
    ipam: Ipam,
    tunnel: Tunnel,
    ipv6: bool,
    identity_allocation_mode: String,
    monitor_aggregation: String,
    bpf_lb_algorithm: String,
    enable_policy: String,
    dns_reject: String,
    wireguard: bool,
}

impl<'a> Settings<'a> {
    fn new(cluster: &Cluster, c: &'a CiliumNetworkingSpec) -> Result<Settings<'a>, CiliumError> {
        check_version(c.version.as_deref().ok_or(CiliumError::Missing { field: "version" })?)?;
        let ipam = one_of("ipam", c.ipam.as_deref(), &[("kubernetes", Ipam::Kubernetes), ("eni", Ipam::Eni)], "kubernetes, eni")?;
        let tunnel = one_of(
            "tunnel",
            c.tunnel.as_deref(),
            &[("vxlan", Tunnel::Vxlan), ("geneve", Tunnel::Geneve), ("disabled", Tunnel::Disabled)],
            "vxlan, geneve, disabled",
        )?;
        let identity_allocation_mode = string_of("identityAllocationMode", c.identity_allocation_mode.as_deref(), &["crd", "kvstore"])?;
        if identity_allocation_mode == "kvstore" && c.etcd_managed != Some(true) {
            return Err(CiliumError::KvstoreWithoutEtcd);
        }
        let monitor_aggregation = string_of("monitorAggregation", c.monitor_aggregation.as_deref(), &["low", "medium", "maximum"])?;
        let bpf_lb_algorithm = string_of("bpfLBAlgorithm", c.bpf_lb_algorithm.as_deref(), &["random", "maglev"])?;
        let enable_policy = string_of("enablePolicy", Some(c.enable_policy.as_deref().unwrap_or("default")), &["default", "always", "never"])?;
        let dns_reject = string_of("toFqdnsDnsRejectResponseCode", c.to_fqdns_dns_reject_response_code.as_deref(), &["refused", "nameError"])?;
        if c.bpf_lb_sock_host_ns_only == Some(true) && c.bpf_lb_sock != Some(true) {
            return Err(CiliumError::Value { field: "bpfLBSockHostNSOnly", value: "true".into(), allowed: "false unless bpfLBSock is true" });
        }
        if c.hubble.as_ref().and_then(|h| h.enabled) == Some(true) {
            return Err(CiliumError::Unsupported {
                field: "hubble.enabled",
                why: "Hubble's relay and TLS certificates need cert-manager, which Keelson does not install",
            });
        }
        if c.ingress.as_ref().and_then(|i| i.enabled) == Some(true) {
            return Err(CiliumError::Unsupported { field: "ingress.enabled", why: "Cilium Ingress" });
        }
        if c.gateway_api.as_ref().and_then(|g| g.enabled) == Some(true) {
            return Err(CiliumError::Unsupported { field: "gatewayAPI.enabled", why: "Cilium Gateway API" });
        }
        let mut wireguard = false;
        if c.enable_encryption == Some(true) {
            match c.encryption_type.as_deref() {
                Some("wireguard") => wireguard = true,
                Some("ipsec") => {
                    return Err(CiliumError::Unsupported {
                        field: "encryptionType",
                        why: "IPsec keys come from a secret Keelson does not write; use wireguard",
                    })
                }
                other => return Err(CiliumError::Value { field: "encryptionType", value: other.unwrap_or("").to_string(), allowed: "ipsec, wireguard" }),
            }
        }
        let ipv6 = cluster.spec.non_masquerade_cidr.is_some_and(|c| c.is_ipv6());
        Ok(Settings { c, ipam, tunnel, ipv6, identity_allocation_mode, monitor_aggregation, bpf_lb_algorithm, enable_policy, dns_reject, wireguard })
    }

    fn loopback(&self) -> &'static str {
        if self.ipv6 {
            "::1"
        } else {
            "127.0.0.1"
        }
    }

    /// The `cilium-config` data: every key kOps' template writes for these settings.
    fn config(&self, cluster: &Cluster) -> BTreeMap<String, String> {
        let c = self.c;
        let mut m: BTreeMap<String, String> = BTreeMap::new();
        let mut set = |k: &str, v: String| {
            m.insert(k.to_string(), v);
        };
        let fixed: &[(&str, &str)] = &[
            ("identity-heartbeat-timeout", "30m0s"),
            ("identity-gc-interval", "15m0s"),
            ("cilium-endpoint-gc-interval", "5m0s"),
            ("nodes-gc-interval", "5m0s"),
            ("debug-verbose", ""),
            ("metrics-sampling-interval", "5m"),
            ("policy-cidr-match-mode", ""),
            ("custom-cni-conf", "false"),
            ("enable-bpf-clock-probe", "false"),
            ("monitor-aggregation-interval", "5s"),
            ("monitor-aggregation-flags", "all"),
            ("bpf-map-dynamic-size-ratio", "0.0025"),
            ("bpf-policy-stats-map-max", "65536"),
            ("bpf-lb-external-clusterip", "false"),
            ("bpf-lb-source-range-all-types", "false"),
            ("bpf-lb-algorithm-annotation", "false"),
            ("bpf-lb-mode-annotation", "false"),
            ("bpf-distributed-lru", "false"),
            ("bpf-events-drop-enabled", "true"),
            ("bpf-events-policy-verdict-enabled", "true"),
            ("bpf-events-trace-enabled", "true"),
            ("enable-ipv4-big-tcp", "false"),
            ("enable-ipv6-big-tcp", "false"),
            ("enable-ipv6-masquerade", "false"),
            ("enable-tcx", "true"),
            ("datapath-mode", "veth"),
            ("enable-masquerade-to-route-source", "false"),
            ("enable-xt-socket-fallback", "true"),
            ("install-no-conntrack-iptables-rules", "false"),
            ("iptables-random-fully", "false"),
            ("direct-routing-skip-unreachable", "false"),
            ("nodeport-addresses", ""),
            ("enable-health-check-nodeport", "true"),
            ("enable-health-check-loadbalancer-ip", "false"),
            ("node-port-bind-protection", "true"),
            ("enable-auto-protect-node-port-range", "true"),
            ("bpf-lb-acceleration", "disabled"),
            ("enable-svc-source-range-check", "true"),
            ("enable-l2-neigh-discovery", "false"),
            ("k8s-require-ipv4-pod-cidr", "false"),
            ("k8s-require-ipv6-pod-cidr", "false"),
            ("enable-k8s-networkpolicy", "true"),
            ("enable-endpoint-lockdown-on-policy-overflow", "false"),
            ("write-cni-conf-when-ready", "/host/etc/cni/net.d/05-cilium.conflist"),
            ("cni-log-file", "/var/run/cilium/cilium-cni.log"),
            ("enable-health-checking", "true"),
            ("health-check-icmp-failure-threshold", "3"),
            ("enable-well-known-identities", "false"),
            ("enable-node-selector-labels", "false"),
            ("synchronize-k8s-nodes", "true"),
            ("default-lb-service-ipam", "lbipam"),
            ("egress-gateway-reconciliation-trigger-interval", "1s"),
            ("enable-vtep", "false"),
            ("vtep-endpoint", ""),
            ("vtep-cidr", ""),
            ("vtep-mask", ""),
            ("vtep-mac", ""),
            ("procfs", "/host/proc"),
            ("bpf-root", "/sys/fs/bpf"),
            ("cgroup-root", "/run/cilium/cgroupv2"),
            ("identity-management-mode", "agent"),
            ("enable-sctp", "false"),
            ("remove-cilium-node-taints", "true"),
            ("set-cilium-node-taints", "true"),
            ("set-cilium-is-up-condition", "true"),
            ("unmanaged-pod-watcher-interval", "15"),
            ("dnsproxy-socket-linger-timeout", "10"),
            ("tofqdns-enable-dns-compression", "true"),
            ("tofqdns-endpoint-max-ip-per-hostname", "1000"),
            ("tofqdns-idle-connection-grace-period", "0s"),
            ("tofqdns-max-deferred-connection-deletes", "10000"),
            ("tofqdns-proxy-response-max-delay", "100ms"),
            ("tofqdns-preallocate-identities", "true"),
            ("agent-not-ready-taint-key", "node.cilium.io/agent-not-ready"),
            ("mesh-auth-enabled", "true"),
            ("mesh-auth-queue-size", "1024"),
            ("mesh-auth-rotated-identities-queue-size", "1024"),
            ("mesh-auth-gc-interval", "5m0s"),
            ("proxy-xff-num-trusted-hops-ingress", "0"),
            ("proxy-xff-num-trusted-hops-egress", "0"),
            ("proxy-connect-timeout", "2"),
            ("proxy-initial-fetch-timeout", "30"),
            ("proxy-max-requests-per-connection", "0"),
            ("proxy-max-connection-duration-seconds", "0"),
            ("proxy-idle-timeout-seconds", "60"),
            ("proxy-max-concurrent-retries", "128"),
            ("http-retry-count", "3"),
            ("http-stream-idle-timeout", "300"),
            ("external-envoy-proxy", "false"),
            ("envoy-base-id", "0"),
            ("envoy-access-log-buffer-size", "4096"),
            ("envoy-keep-cap-netbindservice", "false"),
            ("max-connected-clusters", "255"),
            ("clustermesh-enable-endpoint-sync", "false"),
            ("clustermesh-enable-mcs-api", "false"),
            ("policy-default-local-cluster", "false"),
            ("nat-map-stats-entries", "32"),
            ("nat-map-stats-interval", "30s"),
            ("enable-internal-traffic-policy", "true"),
            ("enable-lb-ipam", "true"),
            ("enable-non-default-deny-policies", "true"),
            ("enable-source-ip-verification", "true"),
        ];
        for (k, v) in fixed {
            set(k, v.to_string());
        }
        if c.etcd_managed == Some(true) {
            set("kvstore", "etcd".into());
            set("kvstore-opt", r#"{"etcd.config": "/var/lib/etcd-config/etcd.config"}"#.into());
            set(
                "etcd-config",
                format!(
                    "---\nendpoints:\n  - https://api.internal.{}:4003\ntrusted-ca-file: '/var/lib/etcd-secrets/etcd-ca.crt'\nkey-file: '/var/lib/etcd-secrets/etcd-client-cilium.key'\ncert-file: '/var/lib/etcd-secrets/etcd-client-cilium.crt'",
                    cluster.name()
                ),
            );
        }
        set("identity-allocation-mode", self.identity_allocation_mode.clone());
        set("disable-endpoint-crd", flag(c.disable_endpoint_crd));
        set("identity-change-grace-period", c.identity_change_grace_period.clone().unwrap_or_default());
        set("debug", flag(c.debug));
        set("enable-policy", self.enable_policy.clone());
        if c.enable_prometheus_metrics == Some(true) {
            set("prometheus-serve-addr", format!(":{}", c.agent_prometheus_port.unwrap_or(9090)));
            if let Some(metrics) = c.metrics.as_ref().filter(|m| !m.is_empty()) {
                set("metrics", metrics.join(" "));
            }
            set("controller-group-metrics", "write-cni-file sync-host-ips sync-lb-maps-with-k8s-services".into());
            set("proxy-prometheus-port", "9964".into());
            set("operator-prometheus-serve-addr", ":9963".into());
            set("enable-metrics", "true".into());
        }
        set("enable-ipv4", (!self.ipv6).to_string());
        set("enable-ipv6", self.ipv6.to_string());
        set("monitor-aggregation", self.monitor_aggregation.clone());
        if let Some(mode) = c.chaining_mode.as_deref().filter(|m| !m.is_empty()) {
            set("enable-host-legacy-routing", "true".into());
            set("cni-chaining-mode", mode.to_string());
            if mode != "portmap" {
                set("enable-local-node-route", "false".into());
            }
        } else {
            set("dnsproxy-enable-transparent-mode", "true".into());
        }
        set("bpf-policy-map-max", c.bpf_policy_map_max.unwrap_or(16_384).to_string());
        set("bpf-lb-map-max", c.bpf_lb_map_max.unwrap_or(65_536).to_string());
        set("bpf-lb-algorithm", self.bpf_lb_algorithm.clone());
        if self.bpf_lb_algorithm == "maglev" {
            set("bpf-lb-maglev-table-size", c.bpf_lb_maglev_table_size.clone().unwrap_or_else(|| "16381".into()));
        }
        set("preallocate-bpf-maps", flag(c.preallocate_bpf_maps));
        set("cluster-name", c.cluster_name.clone().unwrap_or_else(|| "default".into()));
        if let Some(id) = c.cluster_id.filter(|id| *id != 0) {
            set("cluster-id", id.to_string());
        }
        match self.tunnel {
            Tunnel::Disabled => set("routing-mode", "native".into()),
            Tunnel::Vxlan | Tunnel::Geneve => {
                set("routing-mode", "tunnel".into());
                set("tunnel-protocol", if self.tunnel == Tunnel::Vxlan { "vxlan" } else { "geneve" }.into());
                set("tunnel-source-port-range", "0-0".into());
                set("service-no-backend-response", "reject".into());
            }
        }
        set("enable-l7-proxy", flag(c.enable_l7_proxy));
        set("enable-ipv4-masquerade", (c.disable_masquerade != Some(true)).to_string());
        set("enable-bpf-masquerade", (c.enable_bpf_masquerade == Some(true) && !self.ipv6).to_string());
        if self.wireguard {
            set("enable-wireguard", "true".into());
            set("encrypt-node", flag(c.node_encryption));
        }
        set("auto-direct-node-routes", flag(c.auto_direct_node_routes));
        set("enable-local-redirect-policy", flag(c.enable_local_redirect_policy));
        let node_port = c.enable_node_port == Some(true);
        set("kube-proxy-replacement", node_port.to_string());
        set("enable-node-port", node_port.to_string());
        set("bpf-lb-sock", flag(c.bpf_lb_sock));
        set("bpf-lb-sock-hostns-only", flag(c.bpf_lb_sock_host_ns_only));
        set("enable-service-topology", flag(c.enable_service_topology));
        set("cni-exclusive", c.cni_exclusive.unwrap_or(true).to_string());
        set("enable-endpoint-health-checking", c.enable_endpoint_health_checking.unwrap_or(true).to_string());
        set("enable-host-firewall", flag(c.enable_host_firewall));
        set("operator-api-serve-addr", format!("{}:{OPERATOR_API_PORT}", if self.ipv6 { "[::1]" } else { "127.0.0.1" }));
        set("ipam", if self.ipam == Ipam::Eni { "eni" } else { "kubernetes" }.into());
        set("ipam-cilium-node-update-rate", "15s".into());
        set("cluster-pool-ipv4-mask-size", "24".into());
        if self.ipam == Ipam::Eni {
            set("enable-endpoint-routes", "true".into());
            set("auto-create-cilium-node-resource", "true".into());
            set("eni-tags", cloud_labels(cluster));
        }
        set("tofqdns-dns-reject-response-code", self.dns_reject.clone());
        m
    }
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> Value {
    json!({"apiGroups": groups, "resources": resources, "verbs": verbs})
}

fn part_of() -> Value {
    json!({"app.kubernetes.io/part-of": "cilium"})
}

fn cluster_role(name: &str, rules: Vec<Value>) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name, "labels": part_of()}, "rules": rules})
}

fn binding(kind: &str, name: &str, account: &str) -> Value {
    let mut meta = json!({"name": name, "labels": part_of()});
    let role_kind = if kind == "RoleBinding" { "Role" } else { "ClusterRole" };
    if kind == "RoleBinding" {
        meta["namespace"] = json!(NAMESPACE);
    }
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}],
    })
}

/// The CRDs the operator registers (and may update).
const CRDS: &[&str] = &[
    "ciliumloadbalancerippools",
    "ciliumbgppeeringpolicies",
    "ciliumbgpclusterconfigs",
    "ciliumbgppeerconfigs",
    "ciliumbgpadvertisements",
    "ciliumbgpnodeconfigs",
    "ciliumbgpnodeconfigoverrides",
    "ciliumclusterwideenvoyconfigs",
    "ciliumclusterwidenetworkpolicies",
    "ciliumegressgatewaypolicies",
    "ciliumendpoints",
    "ciliumendpointslices",
    "ciliumenvoyconfigs",
    "ciliumidentities",
    "ciliumlocalredirectpolicies",
    "ciliumnetworkpolicies",
    "ciliumnodes",
    "ciliumnodeconfigs",
    "ciliumcidrgroups",
    "ciliuml2announcementpolicies",
    "ciliumpodippools",
    "ciliumgatewayclassconfigs",
];

fn rbac() -> Vec<Value> {
    let agent = vec![
        rule(&["networking.k8s.io"], &["networkpolicies"], &["get", "list", "watch"]),
        rule(&["discovery.k8s.io"], &["endpointslices"], &["get", "list", "watch"]),
        rule(&[""], &["namespaces", "services", "pods", "endpoints", "nodes", "secrets"], &["get", "list", "watch"]),
        rule(&["apiextensions.k8s.io"], &["customresourcedefinitions"], &["list", "watch", "get"]),
        rule(
            &["cilium.io"],
            &[
                "ciliumloadbalancerippools",
                "ciliumbgppeeringpolicies",
                "ciliumbgpnodeconfigs",
                "ciliumbgpadvertisements",
                "ciliumbgppeerconfigs",
                "ciliumclusterwideenvoyconfigs",
                "ciliumclusterwidenetworkpolicies",
                "ciliumegressgatewaypolicies",
                "ciliumendpoints",
                "ciliumendpointslices",
                "ciliumenvoyconfigs",
                "ciliumidentities",
                "ciliumlocalredirectpolicies",
                "ciliumnetworkpolicies",
                "ciliumnodes",
                "ciliumnodeconfigs",
                "ciliumcidrgroups",
                "ciliuml2announcementpolicies",
                "ciliumpodippools",
            ],
            &["list", "watch"],
        ),
        rule(&["cilium.io"], &["ciliumidentities", "ciliumendpoints", "ciliumnodes"], &["create"]),
        rule(&["cilium.io"], &["ciliumidentities"], &["update"]),
        rule(&["cilium.io"], &["ciliumendpoints"], &["delete", "get"]),
        rule(&["cilium.io"], &["ciliumnodes", "ciliumnodes/status"], &["get", "update"]),
        rule(&["cilium.io"], &["ciliumendpoints/status", "ciliumendpoints", "ciliuml2announcementpolicies/status", "ciliumbgpnodeconfigs/status"], &["patch"]),
    ];
    let crd_names: Vec<String> = CRDS.iter().map(|c| format!("{c}.cilium.io")).collect();
    let operator = vec![
        rule(&[""], &["pods"], &["get", "list", "watch", "delete"]),
        json!({"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["cilium-config"], "verbs": ["patch"]}),
        rule(&[""], &["nodes"], &["list", "watch"]),
        rule(&[""], &["nodes", "nodes/status"], &["patch"]),
        rule(&["discovery.k8s.io"], &["endpointslices"], &["get", "list", "watch"]),
        rule(&[""], &["services/status"], &["update", "patch"]),
        rule(&[""], &["namespaces", "secrets"], &["get", "list", "watch"]),
        rule(&[""], &["services", "endpoints"], &["get", "list", "watch", "create", "update", "delete", "patch"]),
        rule(
            &["cilium.io"],
            &["ciliumnetworkpolicies", "ciliumclusterwidenetworkpolicies"],
            &["create", "update", "deletecollection", "patch", "get", "list", "watch"],
        ),
        rule(&["cilium.io"], &["ciliumnetworkpolicies/status", "ciliumclusterwidenetworkpolicies/status"], &["patch", "update"]),
        rule(&["cilium.io"], &["ciliumendpoints", "ciliumidentities"], &["delete", "list", "watch"]),
        rule(&["cilium.io"], &["ciliumidentities"], &["update"]),
        rule(&["cilium.io"], &["ciliumnodes"], &["create", "update", "get", "list", "watch", "delete"]),
        rule(&["cilium.io"], &["ciliumnodes/status"], &["update"]),
        rule(
            &["cilium.io"],
            &["ciliumendpointslices", "ciliumenvoyconfigs", "ciliumbgppeerconfigs", "ciliumbgpadvertisements", "ciliumbgpnodeconfigs"],
            &["create", "update", "get", "list", "watch", "delete", "patch"],
        ),
        rule(&["cilium.io"], &["ciliumbgpclusterconfigs/status", "ciliumbgppeerconfigs/status"], &["update"]),
        rule(&["apiextensions.k8s.io"], &["customresourcedefinitions"], &["create", "get", "list", "watch"]),
        json!({"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["update"], "resourceNames": crd_names}),
        rule(
            &["cilium.io"],
            &[
                "ciliumloadbalancerippools",
                "ciliumpodippools",
                "ciliumbgppeeringpolicies",
                "ciliumbgpclusterconfigs",
                "ciliumbgpnodeconfigoverrides",
                "ciliumbgppeerconfigs",
            ],
            &["get", "list", "watch"],
        ),
        rule(&["cilium.io"], &["ciliumpodippools"], &["create"]),
        rule(&["cilium.io"], &["ciliumloadbalancerippools/status"], &["patch"]),
        rule(&["coordination.k8s.io"], &["leases"], &["create", "get", "update"]),
    ];
    vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "cilium", "namespace": NAMESPACE}}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "cilium-operator", "namespace": NAMESPACE}}),
        cluster_role("cilium", agent),
        cluster_role("cilium-operator", operator),
        binding("ClusterRoleBinding", "cilium", "cilium"),
        binding("ClusterRoleBinding", "cilium-operator", "cilium-operator"),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "cilium-config-agent", "namespace": NAMESPACE, "labels": part_of()},
            "rules": [rule(&[""], &["configmaps"], &["get", "list", "watch"])],
        }),
        binding("RoleBinding", "cilium-config-agent", "cilium"),
    ]
}

fn field_env(name: &str, path: &str) -> Value {
    json!({"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}})
}

fn api_env(cluster: &Cluster) -> [Value; 2] {
    [
        json!({"name": "KUBERNETES_SERVICE_HOST", "value": format!("api.internal.{}", cluster.name())}),
        json!({"name": "KUBERNETES_SERVICE_PORT", "value": "443"}),
    ]
}

fn caps(add: &[&str]) -> Value {
    json!({"seLinuxOptions": {"level": "s0", "type": "spc_t"}, "capabilities": {"add": add, "drop": ["ALL"]}})
}

fn host_path(name: &str, path: &str, type_: Option<&str>) -> Value {
    let mut hp = json!({"path": path});
    if let Some(t) = type_ {
        hp["type"] = json!(t);
    }
    json!({"name": name, "hostPath": hp})
}

fn resources(c: &CiliumNetworkingSpec) -> Value {
    let cpu = c.cpu_request.as_ref().map_or("25m".to_string(), |q| q.to_string());
    let memory = c.memory_request.as_ref().map_or("128Mi".to_string(), |q| q.to_string());
    json!({"requests": {"cpu": cpu, "memory": memory}})
}

fn health_probe(host: &str, port: u16, headers: &[(&str, &str)]) -> Value {
    let headers: Vec<Value> = headers.iter().map(|(n, v)| json!({"name": n, "value": v})).collect();
    let mut get = json!({"host": host, "path": "/healthz", "port": port, "scheme": "HTTP"});
    if !headers.is_empty() {
        get["httpHeaders"] = json!(headers);
    }
    get
}

fn etcd_volumes() -> [Value; 2] {
    [
        json!({"name": "etcd-config-path", "configMap": {"name": "cilium-config", "defaultMode": 0o400, "items": [{"key": "etcd-config", "path": "etcd.config"}]}}),
        host_path("etcd-secrets", "/etc/kubernetes/pki/cilium", Some("Directory")),
    ]
}

fn etcd_mounts() -> [Value; 2] {
    [
        json!({"name": "etcd-config-path", "mountPath": "/var/lib/etcd-config", "readOnly": true}),
        json!({"name": "etcd-secrets", "mountPath": "/var/lib/etcd-secrets", "readOnly": true}),
    ]
}

fn daemonset(cluster: &Cluster, s: &Settings, image: &str) -> Value {
    let c = s.c;
    let host = s.loopback();
    let init = |name: &str| json!({"name": name, "image": image, "imagePullPolicy": "IfNotPresent", "terminationMessagePolicy": "FallbackToLogsOnError"});
    let mut annotations = json!({
        "container.apparmor.security.beta.kubernetes.io/cilium-agent": "unconfined",
        "container.apparmor.security.beta.kubernetes.io/clean-cilium-state": "unconfined",
        "container.apparmor.security.beta.kubernetes.io/mount-cgroup": "unconfined",
        "container.apparmor.security.beta.kubernetes.io/apply-sysctl-overwrites": "unconfined",
        "kubectl.kubernetes.io/default-container": "cilium-agent",
    });
    let port = c.agent_prometheus_port.unwrap_or(9090);
    if c.enable_prometheus_metrics == Some(true) {
        annotations["prometheus.io/port"] = json!(port.to_string());
        annotations["prometheus.io/scrape"] = json!("true");
    }
    for (k, v) in c.agent_pod_annotations.iter().flatten() {
        annotations[k] = json!(v);
    }
    let [host_env, port_env] = api_env(cluster);
    let mut mounts = vec![
        json!({"mountPath": "/host/proc/sys/net", "name": "host-proc-sys-net"}),
        json!({"mountPath": "/host/proc/sys/kernel", "name": "host-proc-sys-kernel"}),
        json!({"name": "bpf-maps", "mountPath": "/sys/fs/bpf", "mountPropagation": "HostToContainer"}),
        json!({"name": "cilium-cgroup", "mountPath": "/run/cilium/cgroupv2"}),
        json!({"name": "cilium-run", "mountPath": "/var/run/cilium"}),
        json!({"name": "cilium-netns", "mountPath": "/var/run/cilium/netns", "mountPropagation": "HostToContainer"}),
        json!({"name": "etc-cni-netd", "mountPath": "/host/etc/cni/net.d"}),
    ];
    let etcd = c.etcd_managed == Some(true);
    if etcd {
        mounts.extend(etcd_mounts());
    }
    mounts.extend([
        json!({"name": "clustermesh-secrets", "mountPath": "/var/lib/cilium/clustermesh", "readOnly": true}),
        json!({"name": "lib-modules", "mountPath": "/lib/modules", "readOnly": true}),
        json!({"name": "xtables-lock", "mountPath": "/run/xtables.lock"}),
        json!({"name": "tmp", "mountPath": "/tmp"}),
    ]);
    let mut agent = json!({
        "name": "cilium-agent",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["cilium-agent"],
        "args": ["--config-dir=/tmp/cilium/config-map"],
        "startupProbe": {"httpGet": health_probe(host, AGENT_HEALTH_PORT, &[("brief", "true")]), "failureThreshold": 300, "periodSeconds": 2, "successThreshold": 1, "initialDelaySeconds": 5},
        "livenessProbe": {"httpGet": health_probe(host, AGENT_HEALTH_PORT, &[("brief", "true"), ("require-k8s-connectivity", "true")]), "periodSeconds": 30, "successThreshold": 1, "failureThreshold": 10, "timeoutSeconds": 5},
        "readinessProbe": {"httpGet": health_probe(host, AGENT_HEALTH_PORT, &[("brief", "true")]), "periodSeconds": 30, "successThreshold": 1, "failureThreshold": 3, "timeoutSeconds": 5},
        "resources": resources(c),
        "env": [
            field_env("K8S_NODE_NAME", "spec.nodeName"),
            field_env("CILIUM_K8S_NAMESPACE", "metadata.namespace"),
            {"name": "CILIUM_CLUSTERMESH_CONFIG", "value": "/var/lib/cilium/clustermesh/"},
            {"name": "GOMEMLIMIT", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1"}}},
            {"name": "KUBE_CLIENT_BACKOFF_BASE", "value": "1"},
            {"name": "KUBE_CLIENT_BACKOFF_DURATION", "value": "120"},
            host_env.clone(),
            port_env.clone(),
        ],
        "lifecycle": {"preStop": {"exec": {"command": ["/cni-uninstall.sh"]}}},
        "securityContext": caps(&["CHOWN", "KILL", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "SYS_MODULE", "SYS_ADMIN", "SYS_RESOURCE", "DAC_OVERRIDE", "FOWNER", "SETGID", "SETUID"]),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": mounts,
    });
    if s.ipam == Ipam::Eni {
        let script = "set -o errexit\nset -o pipefail\nset -o nounset\n\nif [[ \"$(iptables-save | grep -E -c 'AWS-SNAT-CHAIN|AWS-CONNMARK-CHAIN')\" != \"0\" ]];\nthen\n    echo 'Deleting iptables rules created by the AWS CNI VPC plugin'\n    iptables-save | grep -E -v 'AWS-SNAT-CHAIN|AWS-CONNMARK-CHAIN' | iptables-restore\nfi\necho 'Done!'\n";
        agent["lifecycle"]["postStart"] = json!({"exec": {"command": ["bash", "-c", script]}});
    }
    if c.enable_prometheus_metrics == Some(true) {
        agent["ports"] = json!([{"containerPort": port, "name": "prometheus", "protocol": "TCP"}]);
    }
    let mut containers = vec![agent];
    if c.debug == Some(true) {
        let mut monitor = init("cilium-monitor");
        monitor["command"] = json!(["/bin/bash", "-c", "--"]);
        monitor["args"] = json!(["for i in {1..5}; do \\\n  [ -S /var/run/cilium/monitor1_2.sock ] && break || sleep 10;\\\n  done; \\\ncilium-dbg monitor"]);
        monitor["volumeMounts"] = json!([{"name": "cilium-run", "mountPath": "/var/run/cilium"}]);
        containers.push(monitor);
    }
    let mut config = init("config");
    config["command"] = json!(["cilium-dbg", "build-config"]);
    config["env"] = json!([field_env("K8S_NODE_NAME", "spec.nodeName"), field_env("CILIUM_K8S_NAMESPACE", "metadata.namespace"), host_env, port_env]);
    config["volumeMounts"] = json!([{"name": "tmp", "mountPath": "/tmp"}]);
    let host_tool = |name: &str, env: Value, script: &str| {
        let mut c = init(name);
        c["env"] = env;
        c["command"] = json!(["sh", "-ec", script]);
        c["volumeMounts"] = json!([{"name": "hostproc", "mountPath": "/hostproc"}, {"name": "cni-path", "mountPath": "/hostbin"}]);
        c["securityContext"] = caps(&["SYS_ADMIN", "SYS_CHROOT", "SYS_PTRACE"]);
        c
    };
    let mount_cgroup = host_tool(
        "mount-cgroup",
        json!([{"name": "CGROUP_ROOT", "value": "/run/cilium/cgroupv2"}, {"name": "BIN_PATH", "value": "/opt/cni/bin"}]),
        "cp /usr/bin/cilium-mount /hostbin/cilium-mount;\nnsenter --cgroup=/hostproc/1/ns/cgroup --mount=/hostproc/1/ns/mnt \"${BIN_PATH}/cilium-mount\" $CGROUP_ROOT;\nrm /hostbin/cilium-mount\n",
    );
    let sysctl = host_tool(
        "apply-sysctl-overwrites",
        json!([{"name": "BIN_PATH", "value": "/opt/cni/bin"}]),
        "cp /usr/bin/cilium-sysctlfix /hostbin/cilium-sysctlfix;\nnsenter --mount=/hostproc/1/ns/mnt \"${BIN_PATH}/cilium-sysctlfix\";\nrm /hostbin/cilium-sysctlfix\n",
    );
    let mut bpf = init("mount-bpf-fs");
    bpf["command"] = json!(["/bin/bash", "-c", "--"]);
    bpf["args"] = json!(["mount | grep \"/sys/fs/bpf type bpf\" || mount -t bpf bpf /sys/fs/bpf"]);
    bpf["securityContext"] = json!({"privileged": true});
    bpf["volumeMounts"] = json!([{"name": "bpf-maps", "mountPath": "/sys/fs/bpf", "mountPropagation": "Bidirectional"}]);
    let cm_env = |name: &str, key: &str| json!({"name": name, "valueFrom": {"configMapKeyRef": {"name": "cilium-config", "key": key, "optional": true}}});
    let [host_env, port_env] = api_env(cluster);
    let mut clean = init("clean-cilium-state");
    clean["command"] = json!(["/init-container.sh"]);
    clean["env"] = json!([
        cm_env("CILIUM_ALL_STATE", "clean-cilium-state"),
        cm_env("CILIUM_BPF_STATE", "clean-cilium-bpf-state"),
        cm_env("WRITE_CNI_CONF_WHEN_READY", "write-cni-conf-when-ready"),
        host_env,
        port_env
    ]);
    clean["securityContext"] = caps(&["NET_ADMIN", "SYS_MODULE", "SYS_ADMIN", "SYS_RESOURCE"]);
    clean["volumeMounts"] = json!([
        {"name": "bpf-maps", "mountPath": "/sys/fs/bpf"},
        {"name": "cilium-cgroup", "mountPath": "/run/cilium/cgroupv2", "mountPropagation": "HostToContainer"},
        {"name": "cilium-run", "mountPath": "/var/run/cilium"},
    ]);
    let mut cni = init("install-cni-binaries");
    cni["command"] = json!(["/install-plugin.sh"]);
    cni["resources"] = json!({"requests": {"cpu": "100m", "memory": "10Mi"}});
    cni["securityContext"] = json!({"seLinuxOptions": {"level": "s0", "type": "spc_t"}, "capabilities": {"drop": ["ALL"]}});
    cni["volumeMounts"] = json!([{"name": "cni-path", "mountPath": "/host/opt/cni/bin"}]);

    let mut volumes = vec![
        json!({"name": "tmp", "emptyDir": {}}),
        host_path("cilium-run", "/var/run/cilium", Some("DirectoryOrCreate")),
        host_path("cilium-netns", "/var/run/netns", Some("DirectoryOrCreate")),
        host_path("bpf-maps", "/sys/fs/bpf", Some("DirectoryOrCreate")),
        host_path("hostproc", "/proc", Some("Directory")),
        host_path("cilium-cgroup", "/run/cilium/cgroupv2", Some("DirectoryOrCreate")),
        host_path("cni-path", "/opt/cni/bin", Some("DirectoryOrCreate")),
        host_path("etc-cni-netd", "/etc/cni/net.d", Some("DirectoryOrCreate")),
        host_path("lib-modules", "/lib/modules", None),
        host_path("xtables-lock", "/run/xtables.lock", Some("FileOrCreate")),
    ];
    if etcd {
        volumes.extend(etcd_volumes());
    }
    let tls = |name: &str, prefix: &str| {
        json!({"secret": {"name": name, "optional": true, "items": [
            {"key": "tls.key", "path": format!("{prefix}.key")},
            {"key": "tls.crt", "path": format!("{prefix}.crt")},
            {"key": "ca.crt", "path": format!("{prefix}-ca.crt")},
        ]}})
    };
    volumes.push(json!({"name": "clustermesh-secrets", "projected": {"defaultMode": 0o400, "sources": [
        {"secret": {"name": "cilium-clustermesh", "optional": true}},
        tls("clustermesh-apiserver-remote-cert", "common-etcd-client"),
        tls("clustermesh-apiserver-local-cert", "local-etcd-client"),
    ]}}));
    volumes.push(host_path("host-proc-sys-net", "/proc/sys/net", Some("Directory")));
    volumes.push(host_path("host-proc-sys-kernel", "/proc/sys/kernel", Some("Directory")));
    let labels =
        json!({"k8s-app": "cilium", "app.kubernetes.io/name": "cilium-agent", "app.kubernetes.io/part-of": "cilium", "kubernetes.io/cluster-service": "true"});
    json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "cilium", "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "selector": {"matchLabels": {"k8s-app": "cilium", "kubernetes.io/cluster-service": "true"}},
            "updateStrategy": {"type": "OnDelete"},
            "template": {
                "metadata": {"annotations": annotations, "labels": labels},
                "spec": {
                    "securityContext": {"seccompProfile": {"type": "Unconfined"}},
                    "containers": containers,
                    "initContainers": [config, mount_cgroup, sysctl, bpf, clean, cni],
                    "restartPolicy": "Always",
                    "priorityClassName": "system-node-critical",
                    "serviceAccountName": "cilium",
                    "automountServiceAccountToken": true,
                    "terminationGracePeriodSeconds": 1,
                    "hostNetwork": true,
                    "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {"matchLabels": {"k8s-app": "cilium"}}, "topologyKey": "kubernetes.io/hostname"}]}},
                    "nodeSelector": {"kubernetes.io/os": "linux"},
                    "tolerations": [{"operator": "Exists"}],
                    "volumes": volumes,
                },
            },
        },
    })
}

/// Two operators when the control plane is highly available (kOps' `ControlPlaneControllerReplicas`:
/// here, more than one member in the `main` etcd cluster, one per control-plane node).
fn operator_replicas(cluster: &Cluster) -> u32 {
    let members =
        cluster.spec.etcd_clusters.iter().flatten().find(|e| e.name.as_deref() == Some("main")).and_then(|e| e.etcd_members.as_ref()).map_or(0, Vec::len);
    if members > 1 {
        2
    } else {
        1
    }
}

fn operator(cluster: &Cluster, s: &Settings, image: &str) -> Value {
    let c = s.c;
    let host = s.loopback();
    let [host_env, port_env] = api_env(cluster);
    let mut annotations = serde_json::Map::new();
    for (k, v) in c.operator_pod_annotations.iter().flatten() {
        annotations.insert(k.clone(), json!(v));
    }
    let etcd = c.etcd_managed == Some(true);
    let mut mounts = vec![json!({"name": "cilium-config-path", "mountPath": "/tmp/cilium/config-map", "readOnly": true})];
    let mut volumes = vec![json!({"name": "cilium-config-path", "configMap": {"name": "cilium-config"}})];
    if etcd {
        mounts.extend(etcd_mounts());
        volumes.extend(etcd_volumes());
    }
    let mut container = json!({
        "name": "cilium-operator",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["cilium-operator"],
        "args": ["--config-dir=/tmp/cilium/config-map", "--debug=$(CILIUM_DEBUG)", format!("--eni-tags={}", cloud_labels(cluster))],
        "env": [
            field_env("K8S_NODE_NAME", "spec.nodeName"),
            field_env("CILIUM_K8S_NAMESPACE", "metadata.namespace"),
            {"name": "CILIUM_DEBUG", "valueFrom": {"configMapKeyRef": {"key": "debug", "name": "cilium-config", "optional": true}}},
            host_env,
            port_env,
        ],
        "resources": resources(c),
        "livenessProbe": {"httpGet": health_probe(host, OPERATOR_API_PORT, &[]), "initialDelaySeconds": 60, "periodSeconds": 10, "timeoutSeconds": 3},
        "readinessProbe": {"httpGet": health_probe(host, OPERATOR_API_PORT, &[]), "initialDelaySeconds": 0, "periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 5},
        "volumeMounts": mounts,
        "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    });
    if c.enable_prometheus_metrics == Some(true) {
        container["ports"] = json!([{"name": "prometheus", "containerPort": 9963, "hostPort": 9963, "protocol": "TCP"}]);
    }
    let selector = json!({"io.cilium/app": "operator", "name": "cilium-operator"});
    let labels =
        json!({"io.cilium/app": "operator", "name": "cilium-operator", "app.kubernetes.io/part-of": "cilium", "app.kubernetes.io/name": "cilium-operator"});
    let exists = |key: &str| json!({"key": key, "operator": "Exists"});
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "cilium-operator", "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "replicas": operator_replicas(cluster),
            "selector": {"matchLabels": selector},
            "strategy": {"rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "50%"}, "type": "RollingUpdate"},
            "template": {
                "metadata": {"annotations": annotations, "labels": labels},
                "spec": {
                    "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [container],
                    "hostNetwork": true,
                    "restartPolicy": "Always",
                    "priorityClassName": "system-cluster-critical",
                    "serviceAccountName": "cilium-operator",
                    "automountServiceAccountToken": true,
                    "affinity": {
                        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                            {"matchExpressions": [exists("node-role.kubernetes.io/control-plane")]},
                            {"matchExpressions": [exists("node-role.kubernetes.io/master")]},
                        ]}},
                        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {"matchLabels": {"io.cilium/app": "operator"}}, "topologyKey": "kubernetes.io/hostname"}]},
                    },
                    "nodeSelector": {"kubernetes.io/os": "linux"},
                    "tolerations": [
                        exists("node-role.kubernetes.io/control-plane"),
                        exists("node-role.kubernetes.io/master"),
                        exists("node.kubernetes.io/not-ready"),
                        exists("node.cloudprovider.kubernetes.io/uninitialized"),
                        exists("node.cilium.io/agent-not-ready"),
                    ],
                    "volumes": volumes,
                },
            },
        },
    })
}

/// The addon's documents, or `None` when the completed spec does not name Cilium.
pub fn docs(cluster: &Cluster, versions: &Versions) -> Result<Option<Vec<Value>>, CiliumError> {
    let Some(c) = cluster.spec.networking.as_ref().and_then(|n| n.cilium.as_ref()) else { return Ok(None) };
    let s = Settings::new(cluster, c)?;
    let version = c.version.as_deref().ok_or(CiliumError::Missing { field: "version" })?;
    let (agent_image, operator_image) = versions.cilium_images(c.registry.as_deref(), version);
    let mut docs = vec![json!({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "cilium-operator", "namespace": NAMESPACE, "labels": {"io.cilium/app": "operator", "name": "cilium-operator", "app.kubernetes.io/name": "cilium-operator", "app.kubernetes.io/part-of": "cilium"}},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"io.cilium/app": "operator", "name": "cilium-operator"}}},
    })];
    docs.extend(rbac());
    docs.push(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cilium-config", "namespace": NAMESPACE}, "data": s.config(cluster)}));
    docs.push(daemonset(cluster, &s, &agent_image));
    docs.push(operator(cluster, &s, &operator_image));
    Ok(Some(docs))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::addons::tests::case;

    use crate::addons::tests::kind;

    fn render(name: &str) -> Vec<Value> {
        let (cluster, versions) = case(name);
        docs(&cluster, &versions).expect("valid").expect("cilium")
    }

    #[test]
    fn completion_fills_cilium_as_kops_does() {
        let (cluster, _) = case("privateciliumadvanced");
        let c = cluster.spec.networking.as_ref().and_then(|n| n.cilium.as_ref()).expect("cilium");
        assert_eq!(c.version.as_deref(), Some("v1.18.12"));
        assert_eq!(c.tunnel.as_deref(), Some("disabled"));
        assert_eq!(c.enable_bpf_masquerade, Some(true));
        assert_eq!(c.hubble.as_ref().and_then(|h| h.enabled), Some(false));
        let (cluster, _) = case("minimal-ipv6-cilium");
        let c = cluster.spec.networking.as_ref().and_then(|n| n.cilium.as_ref()).expect("cilium");
        assert_eq!((c.ipam.as_deref(), c.tunnel.as_deref(), c.disable_masquerade), (Some("kubernetes"), Some("disabled"), Some(true)));
    }

    #[test]
    fn config_follows_the_spec() {
        let docs = render("privatecilium");
        let data = &kind(&docs, "ConfigMap")["data"];
        assert_eq!(data["ipam"], "kubernetes");
        assert_eq!(data["routing-mode"], "tunnel");
        assert_eq!(data["tunnel-protocol"], "vxlan");
        assert_eq!(data["kube-proxy-replacement"], "false");
        assert_eq!(data["enable-ipv4-masquerade"], "true");
        assert_eq!(data["enable-ipv4"], "true");
        assert_eq!(data["identity-allocation-mode"], "crd");
        assert!(data.get("enable-hubble").is_none());

        let docs = render("privateciliumadvanced");
        let data = &kind(&docs, "ConfigMap")["data"];
        assert_eq!(data["ipam"], "eni");
        assert_eq!(data["routing-mode"], "native");
        assert!(data.get("tunnel-protocol").is_none());
        assert_eq!(data["kube-proxy-replacement"], "true");
        assert_eq!(data["enable-bpf-masquerade"], "true");
        assert_eq!(data["eni-tags"], "KubernetesCluster=privateciliumadvanced.example.com");
        assert_eq!(data["kvstore"], "etcd");
        assert!(data["etcd-config"].as_str().expect("etcd-config").contains("https://api.internal.privateciliumadvanced.example.com:4003"));

        let docs = render("minimal-ipv6-cilium");
        let data = &kind(&docs, "ConfigMap")["data"];
        assert_eq!((&data["enable-ipv6"], &data["enable-ipv4"], &data["routing-mode"]), (&json!("true"), &json!("false"), &json!("native")));
        assert_eq!(data["operator-api-serve-addr"], "[::1]:9234");
    }

    #[test]
    fn workloads_use_the_versioned_images() {
        let docs = render("privatecilium");
        let ds = &kind(&docs, "DaemonSet")["spec"]["template"];
        assert_eq!(ds["spec"]["containers"][0]["image"], "quay.io/cilium/cilium:v1.18.12");
        let inits: Vec<&str> = ds["spec"]["initContainers"].as_array().expect("inits").iter().filter_map(|c| c["name"].as_str()).collect();
        assert_eq!(inits, ["config", "mount-cgroup", "apply-sysctl-overwrites", "mount-bpf-fs", "clean-cilium-state", "install-cni-binaries"]);
        assert_eq!(ds["spec"]["hostNetwork"], true);
        assert_eq!(ds["spec"]["priorityClassName"], "system-node-critical");
        assert_eq!(ds["metadata"]["annotations"]["test3"], "awesome");
        let op = &kind(&docs, "Deployment")["spec"];
        assert_eq!(op["template"]["spec"]["containers"][0]["image"], "quay.io/cilium/operator:v1.18.12");
        assert_eq!(op["replicas"], 1);
        assert_eq!(op["template"]["metadata"]["annotations"]["test3"], "cilium-operator");

        let (cluster, _) = case("privatecilium");
        let opts = crate::versions::LookupOptions { container_registry: Some("10.0.0.1:5000".into()), ..Default::default() };
        let versions = Versions::for_kubernetes(&"1.34.4".parse().expect("version"), &opts).expect("versions");
        let docs = super::docs(&cluster, &versions).expect("valid").expect("cilium");
        assert_eq!(kind(&docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["image"], "10.0.0.1:5000/quay.io-cilium-cilium:v1.18.12");
    }

    #[test]
    fn no_addon_without_cilium_and_networking_comes_right_after_rbac() {
        let (cluster, versions) = crate::addons::tests::ha();
        assert!(docs(&cluster, &versions).expect("valid").is_none());
        let (cluster, versions) = case("privatecilium");
        let names: Vec<&str> = crate::addons::addons(&cluster, &versions).expect("addons").iter().map(|a| a.name).collect();
        assert_eq!(names[..2], ["bootstrap-rbac.keelson.io", NAME]);
    }

    #[test]
    fn bad_values_name_their_field() {
        let (cluster, versions) = case("privatecilium");
        let err = |edit: &dyn Fn(&mut CiliumNetworkingSpec)| {
            let mut c = cluster.clone();
            edit(c.spec.networking.as_mut().and_then(|n| n.cilium.as_mut()).expect("cilium"));
            docs(&c, &versions).expect_err("invalid").to_string()
        };
        assert_eq!(err(&|c| c.ipam = Some("crd".into())), "spec.networking.cilium.ipam: \"crd\" is not one of kubernetes, eni");
        assert_eq!(err(&|c| c.tunnel = Some("gre".into())), "spec.networking.cilium.tunnel: \"gre\" is not one of vxlan, geneve, disabled");
        assert!(err(&|c| c.version = Some("v1.17.0".into())).starts_with("spec.networking.cilium.version: \"v1.17.0\""));
        assert!(err(&|c| c.version = Some("1.18.1".into())).starts_with("spec.networking.cilium.version:"));
        assert!(err(&|c| c.hubble = Some(keelson_api::HubbleSpec { enabled: Some(true), ..Default::default() }))
            .starts_with("spec.networking.cilium.hubble.enabled: not rendered"));
        assert_eq!(
            err(&|c| c.identity_allocation_mode = Some("kvstore".into())),
            "spec.networking.cilium.identityAllocationMode: \"kvstore\" needs etcdManaged: true"
        );
    }
}
