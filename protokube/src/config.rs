//! What protokube must do, derived from the BootConfig and the completed cluster spec.

use std::path::{Path, PathBuf};

use keelson_api::nodeup::BootConfig;
use keelson_api::Cluster;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {message}")]
    Read { path: String, message: String },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("ConfigBase {url}: unsupported scheme (file://, http://, https:// are supported)")]
    Scheme { url: String },
    #[error("{field}: {message}")]
    Spec { field: String, message: String },
}

/// Well-known ports of an etcd cluster (kOps' assignments).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ports {
    pub peer: u16,
    pub client: u16,
}

pub fn ports_for(etcd_cluster: &str) -> Option<Ports> {
    match etcd_cluster {
        "main" => Some(Ports { peer: 2380, client: 4001 }),
        "events" => Some(Ports { peer: 2381, client: 4002 }),
        "cilium" => Some(Ports { peer: 2382, client: 4003 }),
        "leases" => Some(Ports { peer: 2383, client: 4004 }),
        _ => None,
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdMember {
    pub name: String,
    pub instance_group: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdCluster {
    pub name: String,
    pub members: Vec<EtcdMember>,
    pub ports: Ports,
    pub image: String,
    pub tls: bool,
    pub client_cert_auth: bool,
    pub cpu_request: Option<String>,
    pub memory_request: Option<String>,
    pub heartbeat_ms: Option<i64>,
    pub election_ms: Option<i64>,
}

impl EtcdCluster {
    /// DNS label prefix: `etcd` for main, `etcd-<name>` otherwise (kOps names).
    pub fn dns_prefix(&self) -> String {
        if self.name == "main" {
            "etcd".to_string()
        } else {
            format!("etcd-{}", self.name)
        }
    }
    /// etcd member name, also the first label of its DNS name: `etcd-a`, `etcd-events-a`.
    pub fn member_id(&self, member: &str) -> String {
        format!("{}-{member}", self.dns_prefix())
    }
    pub fn member_dns(&self, member: &str, cluster: &str) -> String {
        format!("{}.internal.{cluster}", self.member_id(member))
    }
    pub fn scheme(&self) -> &'static str {
        if self.tls {
            "https"
        } else {
            "http"
        }
    }
    pub fn peer_url(&self, member: &str, cluster: &str) -> String {
        format!("{}://{}:{}", self.scheme(), self.member_dns(member, cluster), self.ports.peer)
    }
    pub fn client_url(&self, member: &str, cluster: &str) -> String {
        format!("{}://{}:{}", self.scheme(), self.member_dns(member, cluster), self.ports.client)
    }
    /// The volume tag key (`k8s.io/etcd/<name>`).
    pub fn tag_key(&self) -> String {
        format!("k8s.io/etcd/{}", self.name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DnsMode {
    /// Route53; `zone` is the spec's `dnsZone` (id or name), or `None` to find it by the cluster name.
    Route53 { zone: Option<String> },
    /// The guarded block in the hosts file.
    Hosts,
}

#[derive(Debug, Clone)]
pub struct Plan {
    pub cluster_name: String,
    pub instance_group: String,
    pub etcd_clusters: Vec<EtcdCluster>,
    pub dns: DnsMode,
    /// `api.<cluster>` is protokube's to keep (no load balancer in front of the API).
    pub manage_public_api: bool,
}

impl Plan {
    pub fn api_internal(&self) -> String {
        format!("api.internal.{}", self.cluster_name)
    }
    pub fn api_public(&self) -> String {
        format!("api.{}", self.cluster_name)
    }
    /// Members of `cluster` bound to this instance's group, in name order.
    pub fn my_members<'a>(&self, cluster: &'a EtcdCluster) -> Vec<&'a EtcdMember> {
        let mut v: Vec<&EtcdMember> =
            cluster.members.iter().filter(|m| m.instance_group == self.instance_group).collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }
}

pub fn read_boot_config(path: &Path) -> Result<BootConfig, ConfigError> {
    let bytes = std::fs::read(path)
        .map_err(|e| ConfigError::Read { path: path.display().to_string(), message: e.to_string() })?;
    serde_yaml_ng::from_slice(&bytes)
        .map_err(|e| ConfigError::Parse { path: path.display().to_string(), message: e.to_string() })
}

/// Read `<ConfigBase>/cluster-completed.spec`.
pub async fn read_completed_spec(config_base: &str) -> Result<Cluster, ConfigError> {
    let base = config_base.trim_end_matches('/');
    let url = format!("{base}/cluster-completed.spec");
    let bytes = if let Some(p) = base.strip_prefix("file://") {
        let path = PathBuf::from(p).join("cluster-completed.spec");
        tokio::fs::read(&path)
            .await
            .map_err(|e| ConfigError::Read { path: path.display().to_string(), message: e.to_string() })?
    } else if base.starts_with("http://") || base.starts_with("https://") {
        let resp = reqwest::get(&url).await.map_err(|e| ConfigError::Read { path: url.clone(), message: e.to_string() })?;
        if !resp.status().is_success() {
            return Err(ConfigError::Read { path: url, message: format!("HTTP {}", resp.status()) });
        }
        resp.bytes().await.map_err(|e| ConfigError::Read { path: url.clone(), message: e.to_string() })?.to_vec()
    } else {
        return Err(ConfigError::Scheme { url: config_base.to_string() });
    };
    let docs = keelson_api::parse_documents(&bytes).map_err(|errs| ConfigError::Parse {
        path: url.clone(),
        message: errs.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "),
    })?;
    Ok(docs.cluster)
}

fn millis(d: &Option<keelson_api::Duration>) -> Option<i64> {
    d.as_ref().map(|d| (d.as_nanos() / 1_000_000) as i64)
}

/// Derive the plan; every problem names its field.
pub fn plan(boot: &BootConfig, cluster: &Cluster) -> Result<Plan, ConfigError> {
    let cluster_name = if cluster.name().is_empty() { boot.cluster_name.clone() } else { cluster.name().to_string() };
    if cluster_name != boot.cluster_name {
        return Err(ConfigError::Spec {
            field: "metadata.name".into(),
            message: format!("completed spec is for {cluster_name:?}, BootConfig for {:?}", boot.cluster_name),
        });
    }
    let spec = &cluster.spec;
    let mut etcd_clusters = Vec::new();
    for (i, ec) in spec.etcd_clusters.iter().flatten().enumerate() {
        let name = ec.name.clone().ok_or_else(|| ConfigError::Spec {
            field: format!("spec.etcdClusters[{i}].name"),
            message: "missing".into(),
        })?;
        let ports = ports_for(&name).ok_or_else(|| ConfigError::Spec {
            field: format!("spec.etcdClusters[{name}].name"),
            message: "unknown etcd cluster (main, events, cilium, leases)".into(),
        })?;
        let mut members = Vec::new();
        for (j, m) in ec.etcd_members.iter().flatten().enumerate() {
            let field = format!("spec.etcdClusters[{name}].etcdMembers[{j}]");
            let mname = m.name.clone().ok_or_else(|| ConfigError::Spec { field: format!("{field}.name"), message: "missing".into() })?;
            let ig = m.instance_group.clone().ok_or_else(|| ConfigError::Spec {
                field: format!("{field}.instanceGroup"),
                message: "missing".into(),
            })?;
            members.push(EtcdMember { name: mname, instance_group: ig });
        }
        let version = ec.version.clone().unwrap_or_else(|| "3.5.21".to_string());
        let image = ec.image.clone().unwrap_or_else(|| format!("registry.k8s.io/etcd:{}-0", version.trim_start_matches('v')));
        etcd_clusters.push(EtcdCluster {
            name,
            members,
            ports,
            image,
            tls: ec.enable_etcd_tls.unwrap_or(false) || ec.enable_tls_auth.unwrap_or(false),
            client_cert_auth: ec.enable_tls_auth.unwrap_or(false),
            cpu_request: ec.cpu_request.as_ref().map(|q| q.as_str().to_string()),
            memory_request: ec.memory_request.as_ref().map(|q| q.as_str().to_string()),
            heartbeat_ms: millis(&ec.heartbeat_interval),
            election_ms: millis(&ec.leader_election_timeout),
        });
    }
    let dns_type = spec.topology.as_ref().and_then(|t| t.dns.as_ref()).and_then(|d| d.type_.clone());
    let dns = if cluster_name.ends_with(".k8s.local") || dns_type.as_deref().is_some_and(|t| t.eq_ignore_ascii_case("none")) {
        DnsMode::Hosts
    } else {
        DnsMode::Route53 { zone: spec.dns_zone.clone() }
    };
    let manage_public_api = spec.api.as_ref().is_none_or(|a| a.load_balancer.is_none());
    Ok(Plan { cluster_name, instance_group: boot.instance_group_name.clone(), etcd_clusters, dns, manage_public_api })
}
