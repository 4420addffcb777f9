//! The NodeLocal DNSCache addon (`nodelocaldns.addons.k8s.io`), rendered when
//! `spec.kubeDNS.nodeLocalDNS.enabled` is true: upstream's addon manifest, kept verbatim as a data
//! file ([`UPSTREAM_FILE`], see `node_local_dns/SOURCE.md`), with kOps' settings laid over it. Facts
//! from kOps' `nodelocaldns.addons.k8s.io/k8s-1.12.yaml.template` (upstream's file, edited),
//! `template_functions.go` (`NodeLocalDNSClusterIP`, `NodeLocalDNSHealthCheck`),
//! `components/kubedns.go` (defaults, which [`crate::complete`] applies) and `components/kubelet.go`
//! (the kubelets' `clusterDNS` is the local IP). What kOps changes, and so does this overlay:
//! * node-cache listens on the local IP only and sets up no iptables rules (`-setupiptables=false`):
//!   pods reach it because their kubelet names the local IP as the cluster DNS server;
//! * its health check moves from upstream's 8080 to kOps' well-known port [`HEALTH_PORT`];
//! * the Corefile: upstream's server blocks with the cluster domain filled in, bound to the local
//!   IP; under IPVS kube-proxy the cluster zone is forwarded to the kube-dns Service IP itself;
//!   `forwardToKubeDNS` sends every name to the cluster DNS instead of the node's resolvers;
//!   IPv6-only clusters get `dns64`; `additionalConfig` is appended; `externalCoreFile` replaces
//!   it all;
//! * the image, CPU and memory requests and extra pod annotations come from the spec.
//!
//! One difference from kOps: the DaemonSet keeps upstream's rolling update (10 % of nodes at a
//! time) instead of kOps' `OnDelete`, which leaves old pods running until each node is replaced.

use std::net::IpAddr;

use serde_json::{json, Value};

use keelson_api::Cluster;

use super::upstream::{Upstream, UpstreamError};

/// The addon's name (kOps' name for it).
pub const NAME: &str = "nodelocaldns.addons.k8s.io";
/// The upstream manifest, relative to `spec-compiler/src/`.
pub const UPSTREAM_FILE: &str = "addons/node_local_dns/nodelocaldns-kubernetes-v1.34.4.yaml";
const UPSTREAM: Upstream = Upstream { file: UPSTREAM_FILE, text: include_str!("node_local_dns/nodelocaldns-kubernetes-v1.34.4.yaml") };
/// kOps' well-known port of node-local-dns' health check (`wellknownports.NodeLocalDNSHealthCheck`).
pub const HEALTH_PORT: u16 = keelson_api::ports::NODE_LOCAL_DNS_HEALTH;
const APP: &str = "node-local-dns";
const CONTAINER: &str = "node-cache";
/// The upstream placeholders the overlay must fill; node-cache fills the others
/// (`__PILLAR__CLUSTER__DNS__`, `__PILLAR__UPSTREAM__SERVERS__`) from the `kube-dns-upstream` Service
/// and the node's resolvers when it starts.
const FILLED: [&str; 3] = ["__PILLAR__LOCAL__DNS__", "__PILLAR__DNS__SERVER__", "__PILLAR__DNS__DOMAIN__"];
const CLUSTER_DNS: &str = "__PILLAR__CLUSTER__DNS__";
const UPSTREAM_SERVERS: &str = "__PILLAR__UPSTREAM__SERVERS__";

/// Why the addon cannot be rendered.
#[derive(Debug, thiserror::Error)]
pub enum NodeLocalDnsError {
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    /// A completed setting the overlay needs is missing or malformed.
    #[error("{path}: {message}")]
    Spec { path: &'static str, message: String },
}

fn upstream_error(message: impl Into<String>) -> NodeLocalDnsError {
    UPSTREAM.error(message).into()
}

/// What the Corefile is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Corefile {
    /// `externalCoreFile`: the user's, as is.
    External(String),
    /// Upstream's server blocks, edited; `additional` appended.
    Upstream { forward_to_kube_dns: bool, additional: Option<String> },
}

/// What the overlay sets, read from the completed spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub image: String,
    pub local_ip: IpAddr,
    /// The cluster domain (`spec.kubeDNS.domain`).
    pub domain: String,
    /// Where the cluster zone is forwarded: node-cache's placeholder for the `kube-dns-upstream`
    /// Service, or (IPVS kube-proxy) the kube-dns Service IP.
    pub cluster_dns: String,
    pub ipv6_only: bool,
    pub corefile: Corefile,
    pub cpu_request: String,
    pub memory_request: String,
    pub pod_annotations: Vec<(String, String)>,
}

fn required<T>(v: Option<T>, path: &'static str) -> Result<T, NodeLocalDnsError> {
    v.ok_or(NodeLocalDnsError::Spec { path, message: "not set in the completed spec".into() })
}

impl Settings {
    /// `None` unless `spec.kubeDNS.nodeLocalDNS.enabled` is true.
    pub fn new(cluster: &Cluster) -> Result<Option<Settings>, NodeLocalDnsError> {
        let spec = &cluster.spec;
        let Some(kube_dns) = spec.kube_dns.as_ref() else { return Ok(None) };
        let Some(nl) = kube_dns.node_local_dns.as_ref().filter(|n| n.enabled == Some(true)) else { return Ok(None) };
        let local = required(nl.local_ip.as_deref(), "spec.kubeDNS.nodeLocalDNS.localIP")?;
        let local_ip = local
            .parse::<IpAddr>()
            .map_err(|_| NodeLocalDnsError::Spec { path: "spec.kubeDNS.nodeLocalDNS.localIP", message: format!("{local:?} is not an IP address") })?;
        let ipvs = spec.kube_proxy.as_ref().and_then(|k| k.proxy_mode.as_deref()) == Some("ipvs");
        let cluster_dns = if ipvs { required(kube_dns.server_ip.clone(), "spec.kubeDNS.serverIP")? } else { CLUSTER_DNS.to_string() };
        let corefile = match nl.external_core_file.clone().filter(|c| !c.trim().is_empty()) {
            Some(c) => Corefile::External(c),
            None => Corefile::Upstream {
                forward_to_kube_dns: nl.forward_to_kube_dns == Some(true),
                additional: nl.additional_config.clone().filter(|c| !c.trim().is_empty()),
            },
        };
        Ok(Some(Settings {
            image: required(nl.image.clone(), "spec.kubeDNS.nodeLocalDNS.image")?,
            local_ip,
            domain: required(kube_dns.domain.clone(), "spec.kubeDNS.domain")?,
            cluster_dns,
            ipv6_only: spec.non_masquerade_cidr.is_some_and(|c| c.is_ipv6()),
            corefile,
            cpu_request: required(nl.cpu_request.as_ref(), "spec.kubeDNS.nodeLocalDNS.cpuRequest")?.to_string(),
            memory_request: required(nl.memory_request.as_ref(), "spec.kubeDNS.nodeLocalDNS.memoryRequest")?.to_string(),
            pod_annotations: nl.pod_annotations.clone().unwrap_or_default().into_iter().collect(),
        }))
    }

    /// `ip:port`, bracketed for IPv6 (Go's `net.JoinHostPort`).
    fn health(&self) -> String {
        match self.local_ip {
            IpAddr::V4(ip) => format!("{ip}:{HEALTH_PORT}"),
            IpAddr::V6(ip) => format!("[{ip}]:{HEALTH_PORT}"),
        }
    }
}

/// One server block of a Corefile: its zone line (`cluster.local:53`) and its directives, one
/// per line, nested blocks as written.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Server {
    zone: String,
    lines: Vec<String>,
}

/// The server blocks of a Corefile: a zone line ending in `{`, directives, and the `}` that
/// closes it (by brace depth, so nested blocks such as `cache { … }` stay inside).
fn servers(corefile: &str) -> Result<Vec<Server>, NodeLocalDnsError> {
    let mut out: Vec<Server> = Vec::new();
    let mut depth = 0usize;
    for raw in corefile.lines() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        if depth == 0 {
            let zone = line.strip_suffix('{').map(str::trim).filter(|z| !z.is_empty());
            let zone = zone.ok_or_else(|| upstream_error(format!("the Corefile's line {line:?} does not open a server block")))?;
            out.push(Server { zone: zone.to_string(), lines: Vec::new() });
            depth = 1;
            continue;
        }
        depth += line.matches('{').count();
        depth = depth.checked_sub(line.matches('}').count()).ok_or_else(|| upstream_error("the Corefile closes more blocks than it opens"))?;
        if depth > 0 {
            out.last_mut().expect("a server block is open").lines.push(line.to_string());
        }
    }
    if depth != 0 {
        return Err(upstream_error("the Corefile leaves a block open"));
    }
    Ok(out)
}

/// `servers` written back, four spaces per level as kOps writes them.
fn write_servers(servers: &[Server]) -> String {
    let mut out = String::new();
    for s in servers {
        out.push_str(&format!("{} {{\n", s.zone));
        let mut depth = 1usize;
        for l in &s.lines {
            if l.starts_with('}') {
                depth = depth.saturating_sub(1);
            }
            out.push_str(&format!("{}{l}\n", "    ".repeat(depth)));
            if l.ends_with('{') {
                depth += 1;
            }
        }
        out.push_str("}\n");
    }
    out
}

/// Upstream's Corefile with kOps' edits for `s`.
fn corefile(upstream: &str, s: &Settings) -> Result<String, NodeLocalDnsError> {
    let (forward_to_kube_dns, additional) = match &s.corefile {
        Corefile::External(c) => return Ok(c.clone()),
        Corefile::Upstream { forward_to_kube_dns, additional } => (*forward_to_kube_dns, additional),
    };
    let mut blocks = servers(upstream)?;
    let cluster_zone = "__PILLAR__DNS__DOMAIN__:53";
    if !blocks.iter().any(|b| b.zone == cluster_zone) || !blocks.iter().any(|b| b.zone == ".:53") {
        return Err(upstream_error(format!("the Corefile has no {cluster_zone} or .:53 server block")));
    }
    if forward_to_kube_dns {
        blocks.retain(|b| b.zone == cluster_zone || b.zone == ".:53");
    }
    for b in &mut blocks {
        let mut lines = Vec::new();
        for l in &b.lines {
            if l.starts_with("bind ") {
                lines.push(format!("bind {}", s.local_ip));
            } else if l.starts_with("health ") {
                lines.push(format!("health {}", s.health()));
            } else if l.contains(UPSTREAM_SERVERS) && forward_to_kube_dns {
                lines.extend([format!("forward . {} {{", s.cluster_dns), "force_tcp".into(), "}".into()]);
            } else {
                lines.push(l.replace(CLUSTER_DNS, &s.cluster_dns));
            }
        }
        if b.zone == ".:53" && s.ipv6_only && !forward_to_kube_dns {
            lines.push("dns64".into());
        }
        b.lines = lines;
        b.zone = b.zone.replace("__PILLAR__DNS__DOMAIN__", &s.domain);
    }
    let mut out = write_servers(&blocks);
    if let Some(extra) = additional {
        out.push_str(extra.trim_end());
        out.push('\n');
    }
    Ok(out)
}

fn daemonset(d: &mut Value, s: &Settings) -> Result<(), NodeLocalDnsError> {
    let annotations =
        d["spec"]["template"]["metadata"]["annotations"].as_object_mut().ok_or_else(|| upstream_error("the DaemonSet's pod has no annotations"))?;
    for (k, v) in &s.pod_annotations {
        annotations.insert(k.clone(), json!(v));
    }
    let c = UPSTREAM.container(d, CONTAINER)?;
    let args: Vec<&str> = c["args"].as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    let conf = args.windows(2).find(|w| w[0] == "-conf").map(|w| w[1].to_string());
    let service = args.windows(2).find(|w| w[0] == "-upstreamsvc").map(|w| w[1].to_string());
    let (Some(conf), Some(service)) = (conf, service) else {
        return Err(upstream_error(format!("the {CONTAINER} container has no -conf or -upstreamsvc argument")));
    };
    c["args"] = json!([format!("-localip={}", s.local_ip), format!("-conf={conf}"), format!("-upstreamsvc={service}"), "-setupiptables=false"]);
    c["image"] = json!(s.image);
    c["resources"]["requests"] = json!({"cpu": s.cpu_request, "memory": s.memory_request});
    let probe = &mut c["livenessProbe"]["httpGet"];
    if probe.is_null() {
        return Err(upstream_error(format!("the {CONTAINER} container has no HTTP liveness probe")));
    }
    probe["host"] = json!(s.local_ip.to_string());
    probe["port"] = json!(HEALTH_PORT);
    Ok(())
}

/// The addon's objects for `s`: upstream's, overlaid.
pub fn render(s: &Settings) -> Result<Vec<Value>, NodeLocalDnsError> {
    let mut docs = UPSTREAM.docs()?;
    let cm = UPSTREAM.find(&mut docs, "ConfigMap", APP)?;
    let base = cm["data"]["Corefile"].as_str().ok_or_else(|| upstream_error("the ConfigMap has no Corefile"))?.to_string();
    cm["data"]["Corefile"] = json!(corefile(&base, s)?);
    daemonset(UPSTREAM.find(&mut docs, "DaemonSet", APP)?, s)?;
    let text = serde_json::to_string(&docs).map_err(|e| upstream_error(e.to_string()))?;
    if let Some(p) = FILLED.iter().find(|p| text.contains(*p)) {
        return Err(upstream_error(format!("{p} is left in the rendered objects (the upstream file has it somewhere the overlay does not fill)")));
    }
    Ok(docs)
}

/// The addon's objects, or `None` when `spec.kubeDNS.nodeLocalDNS.enabled` is not true.
pub fn docs(cluster: &Cluster) -> Result<Option<Vec<Value>>, NodeLocalDnsError> {
    Settings::new(cluster)?.map(|s| render(&s)).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addons::tests::{ha, kind};
    use keelson_api::NodeLocalDNSConfig;

    fn settings(corefile: Corefile) -> Settings {
        Settings {
            image: "registry.k8s.io/dns/k8s-dns-node-cache:1.26.0".into(),
            local_ip: "169.254.20.10".parse().unwrap(),
            domain: "cluster.local".into(),
            cluster_dns: CLUSTER_DNS.into(),
            ipv6_only: false,
            corefile,
            cpu_request: "25m".into(),
            memory_request: "5Mi".into(),
            pod_annotations: vec![("example.com/team".into(), "dns".into())],
        }
    }

    fn plain() -> Corefile {
        Corefile::Upstream { forward_to_kube_dns: false, additional: None }
    }

    fn core(docs: &[Value]) -> String {
        kind(docs, "ConfigMap")["data"]["Corefile"].as_str().unwrap().to_string()
    }

    fn zones(corefile: &str) -> Vec<String> {
        servers(corefile).unwrap().into_iter().map(|s| s.zone).collect()
    }

    /// The sha256 of the upstream file, as its `SOURCE.md` records it.
    const UPSTREAM_SHA256: &str = "65674bc450e3a4d5348b09e7f3af91c5f0d826b8d2a90ed17d04f8ed5f56312e";

    #[test]
    fn the_upstream_file_is_the_recorded_one() {
        assert_eq!(base::sha256_hex(UPSTREAM.text.as_bytes()), UPSTREAM_SHA256, "{UPSTREAM_FILE} changed: update node_local_dns/SOURCE.md");
        let source = include_str!("node_local_dns/SOURCE.md");
        assert!(source.contains(UPSTREAM_SHA256) && UPSTREAM_FILE.ends_with(source.lines().next().unwrap().trim_start_matches("# ")), "{source}");
        let kinds: Vec<String> = UPSTREAM.docs().unwrap().iter().map(|d| d["kind"].as_str().unwrap().to_string()).collect();
        assert_eq!(kinds, ["ServiceAccount", "Service", "ConfigMap", "DaemonSet", "Service"]);
    }

    #[test]
    fn off_unless_enabled() {
        let (mut cluster, _) = ha();
        assert!(docs(&cluster).unwrap().is_none());
        let kd = cluster.spec.kube_dns.as_mut().unwrap();
        kd.node_local_dns = Some(NodeLocalDNSConfig { enabled: Some(false), ..Default::default() });
        assert!(docs(&cluster).unwrap().is_none());
    }

    #[test]
    fn the_overlay_is_kops_edits_of_upstream() {
        let d = render(&settings(plain())).unwrap();
        assert_eq!(d.len(), 5);
        let corefile = core(&d);
        assert_eq!(zones(&corefile), ["cluster.local:53", "in-addr.arpa:53", "ip6.arpa:53", ".:53"]);
        assert_eq!(corefile.matches("bind 169.254.20.10\n").count(), 4, "{corefile}");
        assert!(corefile.contains("health 169.254.20.10:3989\n") && !corefile.contains("8080"), "{corefile}");
        // Upstream's cache sizes and node-cache's own placeholders stay.
        assert!(corefile.contains("success 9984 30") && corefile.contains("denial 9984 5"), "{corefile}");
        assert_eq!(corefile.matches("forward . __PILLAR__CLUSTER__DNS__ {").count(), 3, "{corefile}");
        assert!(corefile.contains("forward . __PILLAR__UPSTREAM__SERVERS__\n") && !corefile.contains("dns64"), "{corefile}");
        let ds = kind(&d, "DaemonSet");
        let pod = &ds["spec"]["template"];
        let c = &pod["spec"]["containers"][0];
        assert_eq!(c["args"], json!(["-localip=169.254.20.10", "-conf=/etc/Corefile", "-upstreamsvc=kube-dns-upstream", "-setupiptables=false"]));
        assert_eq!(c["image"], "registry.k8s.io/dns/k8s-dns-node-cache:1.26.0");
        assert_eq!(c["resources"]["requests"], json!({"cpu": "25m", "memory": "5Mi"}));
        assert_eq!(c["livenessProbe"]["httpGet"], json!({"host": "169.254.20.10", "path": "/health", "port": 3989}));
        assert_eq!(pod["metadata"]["annotations"]["example.com/team"], "dns");
        assert_eq!(pod["metadata"]["annotations"]["prometheus.io/port"], "9253");
        // Upstream's rolling update, host network and privileges stay.
        assert_eq!(ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"], "10%");
        assert_eq!(pod["spec"]["hostNetwork"], true);
        assert_eq!(c["securityContext"]["capabilities"]["add"], json!(["NET_ADMIN"]));
        assert_eq!(kind(&d, "Service")["metadata"]["name"], "kube-dns-upstream");
        assert_eq!(kind(&d, "Service")["spec"]["selector"], json!({"k8s-app": "kube-dns"}));
    }

    #[test]
    fn forward_to_kube_dns_sends_every_name_to_the_cluster_dns() {
        let mut s = settings(Corefile::Upstream { forward_to_kube_dns: true, additional: Some("example.org:53 {\n    forward . 10.9.9.9\n}\n".into()) });
        s.cluster_dns = "100.64.0.10".into();
        let corefile = core(&render(&s).unwrap());
        assert_eq!(zones(&corefile), ["cluster.local:53", ".:53", "example.org:53"]);
        assert_eq!(corefile.matches("forward . 100.64.0.10 {").count(), 2, "{corefile}");
        assert!(!corefile.contains("__PILLAR__"), "{corefile}");
    }

    #[test]
    fn ipv6_and_external_corefiles() {
        let mut s = settings(plain());
        s.local_ip = "fd00:90de:d95::1".parse().unwrap();
        s.ipv6_only = true;
        let d = render(&s).unwrap();
        let corefile = core(&d);
        assert!(corefile.contains("health [fd00:90de:d95::1]:3989") && corefile.contains("bind fd00:90de:d95::1\n"), "{corefile}");
        let dot = servers(&corefile).unwrap().into_iter().find(|b| b.zone == ".:53").unwrap();
        assert_eq!(dot.lines.last().map(String::as_str), Some("dns64"));
        let own = ".:53 {\n    forward . 1.1.1.1\n}\n";
        assert_eq!(core(&render(&settings(Corefile::External(own.into()))).unwrap()), own);
    }

    /// `examples/ha.yaml` with `kubeDNS.nodeLocalDNS.enabled`, completed by the compiler.
    fn ha_with_node_local_dns() -> Cluster {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/ha.yaml")).unwrap();
        let text = text.replacen("\nspec:\n", "\nspec:\n  kubeDNS:\n    nodeLocalDNS:\n      enabled: true\n", 1);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ha.yaml");
        std::fs::write(&path, text).unwrap();
        let docs = crate::load::load_spec(&path).unwrap();
        crate::complete::complete(&docs, &crate::CompileOptions::default()).expect("complete")
    }

    #[test]
    fn the_completed_spec_turns_it_on_and_points_the_kubelets_at_it() {
        let mut cluster = ha_with_node_local_dns();
        // kOps' completion: the local IP, and every kubelet's cluster DNS server is it.
        assert_eq!(cluster.spec.kubelet.as_ref().unwrap().cluster_dns.as_deref(), Some("169.254.20.10"));
        assert_eq!(cluster.spec.master_kubelet.as_ref().unwrap().cluster_dns.as_deref(), Some("169.254.20.10"));
        let s = Settings::new(&cluster).unwrap().expect("enabled");
        assert_eq!(s.image, "registry.k8s.io/dns/k8s-dns-node-cache:1.26.0");
        assert_eq!((s.domain.as_str(), s.cluster_dns.as_str(), s.cpu_request.as_str()), ("cluster.local", CLUSTER_DNS, "25m"));
        cluster.spec.kube_proxy.get_or_insert_with(Default::default).proxy_mode = Some("ipvs".into());
        let server_ip = cluster.spec.kube_dns.as_ref().unwrap().server_ip.clone().unwrap();
        assert_eq!(Settings::new(&cluster).unwrap().unwrap().cluster_dns, server_ip);
        cluster.spec.kube_dns.as_mut().unwrap().node_local_dns.as_mut().unwrap().local_ip = Some("not-an-ip".into());
        let e = Settings::new(&cluster).unwrap_err().to_string();
        assert!(e.contains("spec.kubeDNS.nodeLocalDNS.localIP") && e.contains("not-an-ip"), "{e}");
    }

    #[test]
    fn a_changed_upstream_layout_is_an_error_not_a_silent_drop() {
        let e = corefile("cluster.local:53 {\n errors\n}\n", &settings(plain())).unwrap_err().to_string();
        assert!(e.contains(UPSTREAM_FILE) && e.contains(".:53"), "{e}");
        assert!(servers("x {\n a {\n}\n").unwrap_err().to_string().contains("open"));
    }
}
