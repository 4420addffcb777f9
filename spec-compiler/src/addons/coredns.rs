//! The cluster DNS addon (`coredns.addons.k8s.io`), rendered from the completed `spec.kubeDNS` when
//! its provider is `CoreDNS` (the default). Facts from kOps' `coredns.addons.k8s.io/k8s-1.12.yaml.template`
//! and `pkg/model/components/kubedns.go`: the `coredns` ServiceAccount and its `system:coredns` RBAC,
//! the Corefile, the `coredns` Deployment (labelled `k8s-app: kube-dns`), the `kube-dns` Service on
//! `spec.kubeDNS.serverIP` — the address every kubelet was given as its cluster DNS unless NodeLocal
//! DNS sits in front — and a PodDisruptionBudget.
//!
//! Differences from kOps, on purpose:
//! * no cluster-proportional-autoscaler: the Deployment asks for two replicas, what the autoscaler's
//!   `preventSinglePointFailure` gives a small cluster;
//! * `spec.kubeDNS.stubDomains` (a kube-dns setting kOps' CoreDNS template ignores) become their own
//!   server blocks forwarding to the listed servers, so a spec that sets them keeps resolving them;
//! * no `resourceVersion: "0"` on the Service (a client-side-apply workaround; protokube applies
//!   server-side, where it would be a failing precondition) and no `addonmanager.kubernetes.io/mode:
//!   EnsureExists` on the ConfigMap (protokube re-applies the Corefile whenever its manifest changes).
//!
//! Like kOps, `cacheMaxSize` and `cacheMaxConcurrent` (dnsmasq settings of the kube-dns provider) do not
//! reach the Corefile: CoreDNS caches with `cache 30` and forwards with `max_concurrent 1000`.

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use serde_json::{json, Value};

use keelson_api::{Cluster, KubeDNSConfig};

use crate::versions::Versions;

/// The addon's name (kOps' name for it).
pub const NAME: &str = "coredns.addons.k8s.io";
/// The provider this addon renders (kOps' default); `KubeDNS` gets no addon from us.
pub const PROVIDER: &str = "CoreDNS";
const NAMESPACE: &str = "kube-system";
/// The label every cluster DNS object is selected by, whatever the provider.
const APP: &str = "kube-dns";
const SERVICE_ACCOUNT: &str = "coredns";
const CLUSTER_ROLE: &str = "system:coredns";
/// Replicas in place of kOps' cluster-proportional-autoscaler (see the module documentation).
const REPLICAS: u32 = 2;
/// Where the pods see the node's `/etc/hosts` when the cluster publishes no DNS records.
const HOST_HOSTS: &str = "/rootfs/etc/hosts";

/// A completed `spec.kubeDNS` this addon cannot render, naming the field.
#[derive(Debug, thiserror::Error)]
pub enum CoreDnsError {
    #[error("spec.kubeDNS.serverIP: required (the cluster DNS Service's address; completion derives it from spec.serviceClusterIPRange)")]
    NoServerIp,
    #[error("spec.kubeDNS.serverIP: {value:?} is not an IP address")]
    ServerIp { value: String },
    #[error("spec.kubeDNS.domain: required (completion sets it from spec.clusterDNSDomain)")]
    NoDomain,
    #[error("spec.kubeDNS.domain: {value:?} is not a DNS domain")]
    Domain { value: String },
    #[error("spec.kubeDNS.{field}: {value:?} is not a name server (an IP address, IP:port, [IPv6]:port, or a resolv.conf path)")]
    NameServer { field: String, value: String },
    #[error("spec.kubeDNS.stubDomains: {domain:?} is not a DNS domain")]
    StubDomain { domain: String },
    #[error("spec.kubeDNS.stubDomains[{domain}]: no name servers")]
    EmptyStubDomain { domain: String },
}

/// One upstream of a `forward` line: an address (with or without port) or a resolv.conf-style file.
#[derive(Debug, Clone, PartialEq, Eq)]
enum NameServer {
    Ip(IpAddr),
    Socket(SocketAddr),
    File(String),
}

impl NameServer {
    fn parse(field: &str, value: &str) -> Result<NameServer, CoreDnsError> {
        if let Ok(ip) = value.parse::<IpAddr>() {
            return Ok(NameServer::Ip(ip));
        }
        if let Ok(addr) = value.parse::<SocketAddr>() {
            return Ok(NameServer::Socket(addr));
        }
        if value.starts_with('/') && !value.contains(char::is_whitespace) {
            return Ok(NameServer::File(value.to_string()));
        }
        Err(CoreDnsError::NameServer { field: field.to_string(), value: value.to_string() })
    }
}

impl std::fmt::Display for NameServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NameServer::Ip(ip) => write!(f, "{ip}"),
            NameServer::Socket(addr) => write!(f, "{addr}"),
            NameServer::File(path) => f.write_str(path),
        }
    }
}

fn forward_list(servers: &[NameServer]) -> String {
    servers.iter().map(NameServer::to_string).collect::<Vec<_>>().join(" ")
}

/// A DNS domain as CoreDNS zones name them: lower-case labels of letters, digits, `-` and `_`, no
/// trailing dot.
fn domain(value: &str) -> Option<String> {
    let d = value.strip_suffix('.').unwrap_or(value).to_ascii_lowercase();
    let ok = !d.is_empty()
        && d.len() <= 253
        && d.split('.').all(|l| {
            !l.is_empty() && l.len() <= 63 && !l.starts_with('-') && !l.ends_with('-') && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        });
    ok.then_some(d)
}

/// What the Corefile is made from, parsed from the completed `spec.kubeDNS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorefileInputs {
    /// The cluster domain (`spec.kubeDNS.domain`).
    pub domain: String,
    /// Where names outside the cluster go: the upstream name servers, else the node's resolv.conf.
    upstreams: Vec<NameServer>,
    /// Stub domains and their servers, sorted by domain.
    stub_domains: Vec<(String, Vec<NameServer>)>,
    /// The cluster's name, served from the node's `/etc/hosts` when no DNS records are published.
    pub hosts_domain: Option<String>,
    /// IPv6-only clusters synthesise AAAA records for IPv4-only names.
    pub dns64: bool,
}

impl CorefileInputs {
    fn new(cluster: &Cluster, kd: &KubeDNSConfig) -> Result<CorefileInputs, CoreDnsError> {
        let spec = &cluster.spec;
        let value = kd.domain.as_deref().ok_or(CoreDnsError::NoDomain)?;
        let domain = self::domain(value).ok_or_else(|| CoreDnsError::Domain { value: value.to_string() })?;
        let mut upstreams = Vec::new();
        for (i, s) in kd.upstream_nameservers.iter().flatten().enumerate() {
            upstreams.push(NameServer::parse(&format!("upstreamNameservers[{i}]"), s)?);
        }
        if upstreams.is_empty() {
            upstreams.push(NameServer::File("/etc/resolv.conf".into()));
        }
        let mut stub_domains = Vec::new();
        for (name, servers) in kd.stub_domains.iter().flatten() {
            let d = self::domain(name).ok_or_else(|| CoreDnsError::StubDomain { domain: name.clone() })?;
            if servers.is_empty() {
                return Err(CoreDnsError::EmptyStubDomain { domain: name.clone() });
            }
            let parsed = servers.iter().enumerate().map(|(i, s)| NameServer::parse(&format!("stubDomains[{name}][{i}]"), s)).collect::<Result<Vec<_>, _>>()?;
            stub_domains.push((d, parsed));
        }
        stub_domains.sort_by(|a, b| a.0.cmp(&b.0));
        let none_dns = keelson_api::plan::uses_none_dns(spec);
        Ok(CorefileInputs {
            domain,
            upstreams,
            stub_domains,
            hosts_domain: none_dns.then(|| cluster.name().to_string()),
            dns64: spec.non_masquerade_cidr.is_some_and(|c| c.is_ipv6()),
        })
    }

    /// The Corefile kOps writes (server block `.:53`), then one block per stub domain.
    pub fn corefile(&self) -> String {
        let mut out = String::from(".:53 {\n    errors\n    health {\n      lameduck 10s\n    }\n    ready\n");
        let _ = write!(
            out,
            "    kubernetes {}. in-addr.arpa ip6.arpa {{\n      pods insecure\n      fallthrough in-addr.arpa ip6.arpa\n      ttl 30\n    }}\n",
            self.domain
        );
        if let Some(name) = &self.hosts_domain {
            let _ = write!(out, "    hosts {HOST_HOSTS} {name} {{\n      ttl 30\n      fallthrough\n    }}\n");
        }
        let _ = write!(
            out,
            "    prometheus :9153\n    forward . {} {{\n      max_concurrent 1000\n    }}\n    cache 30\n    loop\n    reload\n    loadbalance\n",
            forward_list(&self.upstreams)
        );
        if self.dns64 {
            out.push_str("    dns64\n");
        }
        out.push_str("}\n");
        for (d, servers) in &self.stub_domains {
            let _ = write!(out, "{d}:53 {{\n    errors\n    cache 30\n    forward . {}\n}}\n", forward_list(servers));
        }
        out
    }
}

/// The completed `spec.kubeDNS` when it asks for CoreDNS.
fn coredns_config(cluster: &Cluster) -> Option<&KubeDNSConfig> {
    cluster.spec.kube_dns.as_ref().filter(|kd| kd.provider.as_deref() == Some(PROVIDER))
}

fn labels() -> Value {
    json!({"k8s-app": APP})
}

fn rbac() -> Vec<Value> {
    let addon_label = json!({"k8s-addon": NAME, "kubernetes.io/bootstrapping": "rbac-defaults"});
    let watch = |group: &str, resources: &[&str]| json!({"apiGroups": [group], "resources": resources, "verbs": ["list", "watch"]});
    vec![
        json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": SERVICE_ACCOUNT, "namespace": NAMESPACE, "labels": {"k8s-addon": NAME, "kubernetes.io/cluster-service": "true"}},
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": CLUSTER_ROLE, "labels": addon_label},
            "rules": [
                watch("", &["endpoints", "services", "pods", "namespaces"]),
                watch("discovery.k8s.io", &["endpointslices"]),
            ],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {
                "name": CLUSTER_ROLE,
                "labels": addon_label,
                "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
            },
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": CLUSTER_ROLE},
            "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}],
        }),
    ]
}

fn tolerations(cluster: &Cluster, kd: &KubeDNSConfig) -> Vec<Value> {
    let mut out = match kd.tolerations.as_ref().filter(|t| !t.is_empty()) {
        Some(t) => t.clone(),
        None => vec![json!({"key": "CriticalAddonsOnly", "operator": "Exists"})],
    };
    // With Karpenter the control planes may be the only nodes there are at first (kOps' control-plane mode).
    if cluster.spec.karpenter.as_ref().and_then(|k| k.enabled) == Some(true) {
        for key in ["node-role.kubernetes.io/master", "node-role.kubernetes.io/control-plane"] {
            out.push(json!({"key": key, "operator": "Exists"}));
        }
    }
    out
}

fn deployment(cluster: &Cluster, kd: &KubeDNSConfig, image: &str, hosts: bool) -> Value {
    let spec = &cluster.spec;
    let mut spread = Vec::new();
    // Metal nodes carry no zone label.
    if spec.cloud_provider.as_deref() != Some("metal") {
        spread.push(json!({"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": labels()}}));
    }
    spread.push(json!({
        "maxSkew": 1,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "DoNotSchedule",
        "nodeTaintsPolicy": "Honor",
        "labelSelector": {"matchLabels": labels()},
    }));
    let mut requests = serde_json::Map::new();
    if let Some(q) = &kd.cpu_request {
        requests.insert("cpu".into(), json!(q.to_string()));
    }
    if let Some(q) = &kd.memory_request {
        requests.insert("memory".into(), json!(q.to_string()));
    }
    let mut resources = json!({"requests": requests});
    if let Some(q) = &kd.memory_limit {
        resources["limits"] = json!({"memory": q.to_string()});
    }
    let mut security = json!({
        "allowPrivilegeEscalation": false,
        "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["all"]},
        "readOnlyRootFilesystem": true,
    });
    if spec.containerd.as_ref().and_then(|c| c.selinux_enabled) == Some(true) {
        security["seLinuxOptions"] = json!({"type": "spc_t", "level": "s0"});
    }
    let mut mounts = vec![json!({"name": "config-volume", "mountPath": "/etc/coredns", "readOnly": true})];
    let mut volumes = vec![json!({"name": "config-volume", "configMap": {"name": "coredns"}})];
    if hosts {
        mounts.push(json!({"name": "etc-hosts", "mountPath": HOST_HOSTS, "readOnly": true}));
        volumes.push(json!({"name": "etc-hosts", "hostPath": {"path": keelson_api::host_paths::HOSTS_FILE, "type": "File"}}));
    }
    let mut pod_meta = json!({"labels": labels()});
    if let Some(a) = kd.pod_annotations.as_ref().filter(|a| !a.is_empty()) {
        pod_meta["annotations"] = json!(a);
    }
    let mut pod = json!({
        "priorityClassName": "system-cluster-critical",
        "serviceAccountName": SERVICE_ACCOUNT,
        "tolerations": tolerations(cluster, kd),
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "topologySpreadConstraints": spread,
        "containers": [{
            "name": "coredns",
            "image": image,
            "imagePullPolicy": "IfNotPresent",
            "resources": resources,
            "args": ["-conf", "/etc/coredns/Corefile"],
            "volumeMounts": mounts,
            "ports": [
                {"containerPort": 53, "name": "dns", "protocol": "UDP"},
                {"containerPort": 53, "name": "dns-tcp", "protocol": "TCP"},
                {"containerPort": 9153, "name": "metrics", "protocol": "TCP"},
            ],
            "securityContext": security,
            "livenessProbe": {
                "httpGet": {"path": "/health", "port": 8080, "scheme": "HTTP"},
                "initialDelaySeconds": 60,
                "timeoutSeconds": 5,
                "successThreshold": 1,
                "failureThreshold": 5,
            },
            "readinessProbe": {
                "httpGet": {"path": "/ready", "port": 8181, "scheme": "HTTP"},
                "periodSeconds": 5,
                "timeoutSeconds": 5,
                "failureThreshold": 1,
            },
        }],
        // The node's resolver: CoreDNS must not ask itself for names outside the cluster.
        "dnsPolicy": "Default",
        "volumes": volumes,
    });
    if let Some(a) = &kd.affinity {
        pod["affinity"] = a.clone();
    }
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "coredns",
            "namespace": NAMESPACE,
            "labels": {"k8s-app": APP, "kubernetes.io/name": "CoreDNS", "k8s-addon": NAME, "kubernetes.io/cluster-service": "true"},
        },
        "spec": {
            "replicas": REPLICAS,
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": "10%"}},
            "selector": {"matchLabels": labels()},
            "template": {"metadata": pod_meta, "spec": pod},
        },
    })
}

/// The addon's documents, or `None` when the completed spec's DNS provider is not CoreDNS.
pub fn docs(cluster: &Cluster, versions: &Versions) -> Result<Option<Vec<Value>>, CoreDnsError> {
    let Some(kd) = coredns_config(cluster) else { return Ok(None) };
    let server_ip = kd.server_ip.as_deref().ok_or(CoreDnsError::NoServerIp)?;
    let server_ip: IpAddr = server_ip.parse().map_err(|_| CoreDnsError::ServerIp { value: server_ip.to_string() })?;
    let inputs = CorefileInputs::new(cluster, kd)?;
    let corefile = match kd.external_core_file.as_deref().filter(|c| !c.trim().is_empty()) {
        Some(text) if text.ends_with('\n') => text.to_string(),
        Some(text) => format!("{text}\n"),
        None => inputs.corefile(),
    };
    // A user's image is used as given (as for the CCM); the table's goes through the registry remapping.
    let image = kd.core_dns_image.clone().unwrap_or_else(|| versions.coredns_image());
    let mut docs = rbac();
    docs.push(json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "coredns", "namespace": NAMESPACE, "labels": {"k8s-addon": NAME}},
        "data": {"Corefile": corefile},
    }));
    docs.push(deployment(cluster, kd, &image, inputs.hosts_domain.is_some()));
    docs.push(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": APP,
            "namespace": NAMESPACE,
            "annotations": {"prometheus.io/port": "9153", "prometheus.io/scrape": "true"},
            "labels": {"k8s-addon": NAME, "k8s-app": APP, "kubernetes.io/cluster-service": "true", "kubernetes.io/name": "CoreDNS"},
        },
        "spec": {
            "selector": labels(),
            "clusterIP": server_ip.to_string(),
            "ports": [
                {"name": "dns", "port": 53, "protocol": "UDP"},
                {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
                {"name": "metrics", "port": 9153, "protocol": "TCP"},
            ],
        },
    }));
    docs.push(json!({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": APP, "namespace": NAMESPACE, "labels": {"k8s-addon": NAME}},
        "spec": {
            "selector": {"matchLabels": labels()},
            "maxUnavailable": "33%",
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }));
    Ok(Some(docs))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::addons::tests::kind;

    fn corefile(docs: &[Value]) -> String {
        kind(docs, "ConfigMap")["data"]["Corefile"].as_str().expect("Corefile").to_string()
    }

    fn ha_docs(edit: impl FnOnce(&mut KubeDNSConfig)) -> Vec<Value> {
        let (mut cluster, versions) = crate::addons::tests::ha();
        edit(cluster.spec.kube_dns.as_mut().expect("completed kubeDNS"));
        docs(&cluster, &versions).expect("valid").expect("CoreDNS is the default provider")
    }

    /// The kubelet cluster DNS the compiler gives the `nodes` group of examples/ha.yaml.
    fn ha_node_cluster_dns() -> String {
        let path = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/ha.yaml"));
        let docs = crate::load::load_spec(path).expect("load examples/ha.yaml");
        let options = crate::CompileOptions::default();
        let completed = crate::complete::complete(&docs, &options).expect("complete");
        let versions = crate::complete::versions_for(&completed.spec, &options).expect("versions");
        let ig = docs.instance_groups.iter().find(|g| g.name() == "nodes").expect("nodes group");
        let scheduler = crate::nodeup_config::scheduler_config(&docs.additional_objects).expect("scheduler config");
        let nodeup = crate::nodeup_config::build(&completed, ig, &versions, &options, &scheduler).expect("nodeup config");
        nodeup.kubelet_config.cluster_dns.expect("kubelet clusterDNS")
    }

    #[test]
    fn ha_serves_the_kubelets_cluster_dns_address() {
        let docs = ha_docs(|_| {});
        let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
        assert_eq!(kinds, ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "Deployment", "Service", "PodDisruptionBudget"]);
        let service = kind(&docs, "Service");
        assert_eq!(service["metadata"]["name"], "kube-dns");
        assert_eq!(service["spec"]["clusterIP"], json!(ha_node_cluster_dns()));
        assert_eq!(service["spec"]["clusterIP"], "100.64.0.10");
        let ports: Vec<String> =
            service["spec"]["ports"].as_array().expect("ports").iter().map(|p| format!("{}/{}", p["port"], p["protocol"].as_str().unwrap_or(""))).collect();
        assert_eq!(ports, ["53/UDP", "53/TCP", "9153/TCP"]);
    }

    #[test]
    fn ha_deployment_follows_the_completed_spec() {
        let docs = ha_docs(|_| {});
        let d = kind(&docs, "Deployment");
        assert_eq!(d["spec"]["replicas"], 2);
        let pod = &d["spec"]["template"]["spec"];
        assert_eq!(pod["priorityClassName"], "system-cluster-critical");
        assert_eq!(pod["tolerations"], json!([{"key": "CriticalAddonsOnly", "operator": "Exists"}]));
        assert_eq!(pod["dnsPolicy"], "Default");
        let keys: Vec<&str> = pod["topologySpreadConstraints"].as_array().expect("spread").iter().filter_map(|c| c["topologyKey"].as_str()).collect();
        assert_eq!(keys, ["topology.kubernetes.io/zone", "kubernetes.io/hostname"]);
        let c = &pod["containers"][0];
        assert_eq!(c["image"], "registry.k8s.io/coredns/coredns:v1.14.2");
        assert_eq!(c["resources"], json!({"requests": {"cpu": "100m", "memory": "70Mi"}, "limits": {"memory": "170Mi"}}));
        assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
        assert_eq!(c["securityContext"]["capabilities"], json!({"add": ["NET_BIND_SERVICE"], "drop": ["all"]}));
        assert_eq!(c["livenessProbe"]["httpGet"], json!({"path": "/health", "port": 8080, "scheme": "HTTP"}));
        assert_eq!(c["readinessProbe"]["httpGet"], json!({"path": "/ready", "port": 8181, "scheme": "HTTP"}));
        assert_eq!(kind(&docs, "PodDisruptionBudget")["spec"]["selector"], json!({"matchLabels": {"k8s-app": "kube-dns"}}));
    }

    #[test]
    fn the_corefile_serves_the_cluster_domain_and_forwards_to_the_node() {
        let text = corefile(&ha_docs(|_| {}));
        assert!(text.starts_with(".:53 {\n    errors\n    health {\n      lameduck 10s\n    }\n    ready\n"), "{text}");
        assert!(
            text.contains(
                "    kubernetes cluster.local. in-addr.arpa ip6.arpa {\n      pods insecure\n      fallthrough in-addr.arpa ip6.arpa\n      ttl 30\n    }\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("    forward . /etc/resolv.conf {\n      max_concurrent 1000\n    }\n    cache 30\n    loop\n    reload\n    loadbalance\n}\n"),
            "{text}"
        );
        assert!(text.contains("prometheus :9153") && !text.contains("hosts ") && !text.contains("dns64"), "{text}");

        let text = corefile(&ha_docs(|kd| kd.domain = Some("corp.example.".into())));
        assert!(text.contains("kubernetes corp.example. in-addr.arpa"), "{text}");
    }

    #[test]
    fn upstream_nameservers_replace_the_nodes_resolver() {
        let text = corefile(&ha_docs(|kd| kd.upstream_nameservers = Some(vec!["10.0.0.2".into(), "[fd00::53]:5353".into()])));
        assert!(text.contains("    forward . 10.0.0.2 [fd00::53]:5353 {\n"), "{text}");
        assert!(!text.contains("/etc/resolv.conf"), "{text}");
    }

    #[test]
    fn stub_domains_get_their_own_server_blocks() {
        let stubs = [("Acme.example.".to_string(), vec!["10.1.0.53".to_string()]), ("b.example".to_string(), vec!["10.2.0.53".into(), "10.2.0.54".into()])];
        let text = corefile(&ha_docs(|kd| kd.stub_domains = Some(stubs.into_iter().collect())));
        assert!(text.ends_with("}\nacme.example:53 {\n    errors\n    cache 30\n    forward . 10.1.0.53\n}\nb.example:53 {\n    errors\n    cache 30\n    forward . 10.2.0.53 10.2.0.54\n}\n"), "{text}");
    }

    #[test]
    fn an_external_corefile_wins() {
        let docs = ha_docs(|kd| {
            kd.external_core_file = Some(".:53 {\n    forward . 8.8.8.8\n}".into());
            kd.upstream_nameservers = Some(vec!["10.0.0.2".into()]);
        });
        assert_eq!(corefile(&docs), ".:53 {\n    forward . 8.8.8.8\n}\n");
    }

    #[test]
    fn user_settings_reach_the_deployment() {
        let docs = ha_docs(|kd| {
            kd.core_dns_image = Some("mirror.example/dns/coredns:v1.15.0".into());
            kd.tolerations = Some(vec![json!({"key": "dns", "operator": "Exists", "effect": "NoSchedule"})]);
            kd.affinity = Some(
                json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "dns", "operator": "Exists"}]}]}}}),
            );
            kd.pod_annotations = Some([("a".to_string(), "b".to_string())].into_iter().collect());
            kd.cpu_request = Some("250m".parse().expect("quantity"));
        });
        let d = kind(&docs, "Deployment");
        let pod = &d["spec"]["template"]["spec"];
        assert_eq!(pod["containers"][0]["image"], "mirror.example/dns/coredns:v1.15.0");
        assert_eq!(pod["containers"][0]["resources"]["requests"]["cpu"], "250m");
        assert_eq!(pod["tolerations"], json!([{"key": "dns", "operator": "Exists", "effect": "NoSchedule"}]));
        assert_eq!(
            pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"][0]["key"],
            "dns"
        );
        assert_eq!(d["spec"]["template"]["metadata"]["annotations"], json!({"a": "b"}));
    }

    #[test]
    fn the_container_registry_remaps_the_table_image() {
        let (cluster, _) = crate::addons::tests::ha();
        let opts = crate::versions::LookupOptions { container_registry: Some("10.0.0.1:5000".into()), ..Default::default() };
        let versions = Versions::for_kubernetes(&"1.34.4".parse().expect("version"), &opts).expect("versions");
        let docs = docs(&cluster, &versions).expect("valid").expect("CoreDNS");
        assert_eq!(kind(&docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"], "10.0.0.1:5000/coredns-coredns:v1.14.2");
    }

    #[test]
    fn none_dns_clusters_resolve_the_cluster_name_from_the_nodes_hosts_file() {
        let (mut cluster, versions) = crate::addons::tests::ha();
        let topology = cluster.spec.topology.get_or_insert_with(Default::default);
        topology.dns.get_or_insert_with(Default::default).type_ = Some("None".into());
        let docs = docs(&cluster, &versions).expect("valid").expect("CoreDNS");
        let text = corefile(&docs);
        assert!(text.contains("    hosts /rootfs/etc/hosts ha.k8s.example.com {\n      ttl 30\n      fallthrough\n    }\n    prometheus :9153\n"), "{text}");
        let pod = &kind(&docs, "Deployment")["spec"]["template"]["spec"];
        assert_eq!(pod["volumes"][1], json!({"name": "etc-hosts", "hostPath": {"path": "/etc/hosts", "type": "File"}}));
    }

    #[test]
    fn the_kube_dns_provider_gets_no_coredns() {
        let (mut cluster, versions) = crate::addons::tests::ha();
        cluster.spec.kube_dns.as_mut().expect("kubeDNS").provider = Some("KubeDNS".into());
        assert!(docs(&cluster, &versions).expect("valid").is_none());
        let names: Vec<&str> = crate::addons::addons(&cluster, &versions).expect("addons").iter().map(|a| a.name).collect();
        assert!(!names.contains(&NAME), "{names:?}");
    }

    #[test]
    fn addons_apply_rbac_then_the_ccm_then_dns() {
        let (cluster, versions) = crate::addons::tests::ha();
        let names: Vec<&str> = crate::addons::addons(&cluster, &versions).expect("addons").iter().map(|a| a.name).collect();
        assert_eq!(names[..3], ["bootstrap-rbac.keelson.io", "aws-cloud-controller.addons.k8s.io", NAME], "{names:?}");
    }

    #[test]
    fn bad_values_name_their_field() {
        let (cluster, versions) = crate::addons::tests::ha();
        let err = |edit: &dyn Fn(&mut KubeDNSConfig)| {
            let mut c = cluster.clone();
            edit(c.spec.kube_dns.as_mut().expect("kubeDNS"));
            docs(&c, &versions).expect_err("invalid").to_string()
        };
        assert_eq!(err(&|kd| kd.server_ip = Some("100.64.0".into())), "spec.kubeDNS.serverIP: \"100.64.0\" is not an IP address");
        assert!(err(&|kd| kd.upstream_nameservers = Some(vec!["8.8.8.8".into(), "dns.google".into()]))
            .starts_with("spec.kubeDNS.upstreamNameservers[1]: \"dns.google\" is not a name server"));
        let stubs = |d: &str, s: Vec<String>| Some([(d.to_string(), s)].into_iter().collect());
        assert_eq!(err(&|kd| kd.stub_domains = stubs("bad domain", vec!["10.0.0.1".into()])), "spec.kubeDNS.stubDomains: \"bad domain\" is not a DNS domain");
        assert_eq!(err(&|kd| kd.stub_domains = stubs("a.example", vec![])), "spec.kubeDNS.stubDomains[a.example]: no name servers");
        assert_eq!(err(&|kd| kd.domain = Some("-x.local".into())), "spec.kubeDNS.domain: \"-x.local\" is not a DNS domain");
    }

    #[test]
    fn name_servers_parse() {
        let ok = |s: &str| NameServer::parse("f", s).expect("valid").to_string();
        assert_eq!(ok("10.0.0.2"), "10.0.0.2");
        assert_eq!(ok("10.0.0.2:5353"), "10.0.0.2:5353");
        assert_eq!(ok("fd00:ec2::253"), "fd00:ec2::253");
        assert_eq!(ok("[fd00::1]:53"), "[fd00::1]:53");
        assert_eq!(ok("/etc/resolv.conf"), "/etc/resolv.conf");
        for bad in ["", "dns.google", "10.0.0.300", "/etc/my resolv.conf", "10.0.0.1:x"] {
            assert!(NameServer::parse("f", bad).is_err(), "{bad:?}");
        }
    }
}
