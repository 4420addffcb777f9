//! What protokube must do, derived from the BootConfig and the completed cluster spec.

use std::path::{Path, PathBuf};

use keelson_api::names;
use keelson_api::nodeup::BootConfig;
use keelson_api::Cluster;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error(transparent)]
    Store(#[from] base::StoreError),
    #[error("{field}: {message}")]
    Spec { field: String, message: String },
}

/// Well-known ports of an etcd cluster (kOps' assignments, one table in [`keelson_api::ports`]).
pub type Ports = keelson_api::ports::EtcdPorts;

pub fn ports_for(etcd_cluster: &str) -> Option<Ports> {
    keelson_api::ports::etcd_ports(etcd_cluster)
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
    /// The spec's etcd version (`3.5.21`).
    pub version: String,
    /// Where this etcd cluster's backups go ([`base::etcd_backup::cluster_dir`]).
    pub backup_store: String,
    /// `manager.backupInterval` (15 min unless set).
    pub backup_interval: std::time::Duration,
    /// `manager.backupRetentionDays` (90 unless set).
    pub backup_retention_days: u64,
}

impl EtcdCluster {
    /// etcd member name, also the first label of its DNS name: `etcd-a`, `etcd-events-a`
    /// ([`names::etcd_member_id`]).
    pub fn member_id(&self, member: &str) -> String {
        names::etcd_member_id(&self.name, member)
    }
    pub fn member_dns(&self, member: &str, cluster: &str) -> String {
        names::etcd_member_dns(&self.name, member, cluster)
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
    /// Route53; `zone` is the spec's `dnsZone` (id or name), or `None` to find it by the cluster name;
    /// `private` when `topology.dns.type: Private` (preferred when a name has both kinds of zone).
    Route53 { zone: Option<String>, private: bool },
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
    /// `api.internal.<cluster>` is protokube's to keep (not an alias to the load balancer, which
    /// `loadBalancer.useForInternalApi` makes it; the hosts file always carries it).
    pub manage_internal_api: bool,
    /// Where the kubelet of this control plane reads static pods (`masterKubelet.podManifestPath`,
    /// else [`keelson_api::nodeup::STATIC_POD_DIR`]): etcd's manifests go there.
    pub static_pod_dir: String,
}

impl Plan {
    pub fn api_internal(&self) -> String {
        names::api_internal_dns(&self.cluster_name)
    }
    /// Where workers reach the node join server: the control planes' own addresses, always
    /// protokube's to keep (the name kOps gives kops-controller).
    pub fn kops_controller_internal(&self) -> String {
        names::kops_controller_internal_dns(&self.cluster_name)
    }
    pub fn api_public(&self) -> String {
        names::api_public_dns(&self.cluster_name)
    }
    /// Whether `instance` was made by the cloud for instance group `group` of this cluster (its
    /// autoscaling group `<group>.<cluster>` on AWS, its managed instance group in its zone on GCE;
    /// the two forms cannot be confused: an autoscaling group's name holds the cluster's dots, a
    /// GCE name none). Only such an instance of an etcd member's group is a control plane.
    pub fn made_for_group(&self, group: &str, instance: &cloud::volumes::Instance) -> bool {
        let Some(made_by) = instance.group.as_deref() else { return false };
        made_by == names::autoscaling_group_name(group, &self.cluster_name)
            || instance.zone.as_deref().is_some_and(|zone| made_by == names::gce_instance_group_manager_name(zone, group, &self.cluster_name))
    }

    /// Members of `cluster` bound to this instance's group, in name order.
    pub fn my_members<'a>(&self, cluster: &'a EtcdCluster) -> Vec<&'a EtcdMember> {
        let mut v: Vec<&EtcdMember> = cluster.members.iter().filter(|m| m.instance_group == self.instance_group).collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }
}

pub fn read_boot_config(path: &Path) -> Result<BootConfig, ConfigError> {
    let bytes = std::fs::read(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
    serde_yaml_ng::from_slice(&bytes).map_err(|e| ConfigError::Parse { path: path.display().to_string(), message: e.to_string() })
}

/// Read `<ConfigBase>/cluster-completed.spec`.
pub async fn read_completed_spec(store: &base::StateStore) -> Result<Cluster, ConfigError> {
    let url = store.url("cluster-completed.spec");
    let bytes = store.get_required("cluster-completed.spec").await?;
    let docs = keelson_api::parse_documents(&bytes)
        .map_err(|errs| ConfigError::Parse { path: url.clone(), message: errs.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; ") })?;
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
        let name = ec.name.clone().ok_or_else(|| ConfigError::Spec { field: format!("spec.etcdClusters[{i}].name"), message: "missing".into() })?;
        let ports = ports_for(&name).ok_or_else(|| ConfigError::Spec {
            field: format!("spec.etcdClusters[{name}].name"),
            message: "unknown etcd cluster (main, events, cilium, leases)".into(),
        })?;
        let mut members = Vec::new();
        for (j, m) in ec.etcd_members.iter().flatten().enumerate() {
            let field = format!("spec.etcdClusters[{name}].etcdMembers[{j}]");
            let mname = m.name.clone().ok_or_else(|| ConfigError::Spec { field: format!("{field}.name"), message: "missing".into() })?;
            let ig = m.instance_group.clone().ok_or_else(|| ConfigError::Spec { field: format!("{field}.instanceGroup"), message: "missing".into() })?;
            members.push(EtcdMember { name: mname, instance_group: ig });
        }
        // kOps semantics: the (default) Manager provider always runs TLS with client-certificate
        // auth (nodeup points the API server at https://127.0.0.1:4001 with an etcd-clients-ca
        // certificate); only the Legacy provider honours enableEtcdTLS / enableTLSAuth.
        let legacy = ec.provider.as_deref().is_some_and(|p| p.eq_ignore_ascii_case("legacy"));
        let tls = !legacy || ec.enable_etcd_tls.unwrap_or(false) || ec.enable_tls_auth.unwrap_or(false);
        let client_cert_auth = !legacy || ec.enable_tls_auth.unwrap_or(false);
        // The compiler completes every etcd cluster's version from the versions table; protokube
        // keeps no default of its own (it would drift from the table).
        let version = ec.version.clone().filter(|v| !v.is_empty()).ok_or_else(|| ConfigError::Spec {
            field: format!("spec.etcdClusters[{name}].version"),
            message: "missing from the completed spec (keelson compile fills it from its versions table: run keelson apply again)".into(),
        })?;
        // The image as the compiler rewrites every image for the spec's mirrors (one function).
        let assets = spec.assets.as_ref();
        let image = ec.image.clone().unwrap_or_else(|| {
            keelson_api::image::remap_image(
                &keelson_api::image::etcd_image(&version),
                assets.and_then(|a| a.container_registry.as_deref()),
                assets.and_then(|a| a.container_proxy.as_deref()),
            )
        });
        let backup_store = base::etcd_backup::cluster_dir(ec.backups.as_ref().and_then(|b| b.backup_store.as_deref()), &boot.config_base, &name);
        let manager = ec.manager.as_ref();
        let backup_interval = match manager.and_then(|m| m.backup_interval.as_ref()) {
            Some(d) if d.as_nanos() > 0 => std::time::Duration::from_nanos(d.as_nanos() as u64),
            Some(_) => {
                return Err(ConfigError::Spec { field: format!("spec.etcdClusters[{name}].manager.backupInterval"), message: "must be positive".into() })
            }
            None => base::etcd_backup::DEFAULT_INTERVAL,
        };
        let backup_retention_days = manager.and_then(|m| m.backup_retention_days).unwrap_or(base::etcd_backup::DEFAULT_RETENTION_DAYS);
        etcd_clusters.push(EtcdCluster {
            version: version.trim_start_matches('v').to_string(),
            backup_store,
            backup_interval,
            backup_retention_days,
            name,
            members,
            ports,
            image,
            tls,
            client_cert_auth,
            cpu_request: ec.cpu_request.as_ref().map(|q| q.as_str().to_string()),
            memory_request: ec.memory_request.as_ref().map(|q| q.as_str().to_string()),
            heartbeat_ms: millis(&ec.heartbeat_interval),
            election_ms: millis(&ec.leader_election_timeout),
        });
    }
    let dns = match keelson_api::plan::cluster_dns(&cluster_name, spec) {
        keelson_api::plan::ClusterDns::Hosts => DnsMode::Hosts,
        keelson_api::plan::ClusterDns::Zone { private } => DnsMode::Route53 { zone: spec.dns_zone.clone(), private },
    };
    let lb = spec.api.as_ref().and_then(|a| a.load_balancer.as_ref());
    let manage_public_api = lb.is_none();
    let manage_internal_api = dns == DnsMode::Hosts || lb.is_none_or(|l| l.use_for_internal_api != Some(true));
    let static_pod_dir = spec
        .master_kubelet
        .as_ref()
        .and_then(|k| k.pod_manifest_path.clone())
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| keelson_api::nodeup::STATIC_POD_DIR.to_string());
    Ok(Plan { cluster_name, instance_group: boot.instance_group_name.clone(), etcd_clusters, dns, manage_public_api, manage_internal_api, static_pod_dir })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn boot(name: &str) -> BootConfig {
        BootConfig {
            cloud_provider: "aws".into(),
            config_base: "file:///x".into(),
            cluster_name: name.into(),
            instance_group_name: "cp-a".into(),
            instance_group_role: "ControlPlane".into(),
            nodeup_config_hash: "x".into(),
        }
    }

    fn cluster(yaml: &str) -> Cluster {
        keelson_api::parse_documents(yaml.as_bytes()).expect("parse").cluster
    }

    const HEAD: &str = "apiVersion: kops.k8s.io/v1alpha2\nkind: Cluster\nmetadata:\n  name: NAME\nspec:\n  etcdClusters:\n  - name: main\n    enableEtcdTLS: true\n    version: 3.6.12\n    heartbeatInterval: 250ms\n    leaderElectionTimeout: 2500ms\n    etcdMembers:\n    - name: a\n      instanceGroup: cp-a\n    - name: b\n      instanceGroup: cp-b\n  - name: events\n    version: 3.6.12\n    etcdMembers:\n    - name: a\n      instanceGroup: cp-a\n";

    #[test]
    fn etcd_manifests_go_where_the_control_planes_kubelet_reads_static_pods() {
        let c = cluster(&HEAD.replace("NAME", "x.example.com"));
        assert_eq!(plan(&boot("x.example.com"), &c).expect("plan").static_pod_dir, "/etc/kubernetes/manifests");
        let c = cluster(&format!("{}  masterKubelet:\n    podManifestPath: /var/lib/static-pods\n", HEAD.replace("NAME", "x.example.com")));
        let p = plan(&boot("x.example.com"), &c).expect("plan");
        assert_eq!(p.static_pod_dir, "/var/lib/static-pods");
        assert_eq!(crate::paths::manifest_path(&p.static_pod_dir, "main"), "/var/lib/static-pods/etcd-main.manifest");
    }

    #[test]
    fn plan_from_spec() {
        let c = cluster(&format!("{}  dnsZone: example.com\n  api:\n    loadBalancer:\n      type: Public\n", HEAD.replace("NAME", "x.example.com")));
        let p = plan(&boot("x.example.com"), &c).expect("plan");
        assert_eq!(p.dns, DnsMode::Route53 { zone: Some("example.com".into()), private: false });
        assert!(!p.manage_public_api, "a load balancer fronts the API");
        assert!(p.manage_internal_api, "the internal name stays protokube's");
        let c = cluster(&format!(
            "{}  dnsZone: example.com\n  api:\n    loadBalancer:\n      type: Public\n      useForInternalApi: true\n",
            HEAD.replace("NAME", "x.example.com")
        ));
        assert!(!plan(&boot("x.example.com"), &c).expect("plan").manage_internal_api, "an alias to the balancer");
        let main = &p.etcd_clusters[0];
        assert_eq!((main.ports.peer, main.ports.client), (2380, 4001));
        assert_eq!(main.image, "registry.k8s.io/etcd:v3.6.12");
        let mirrored = cluster(&format!("{}  assets:\n    containerRegistry: 10.0.0.1:5000\n", HEAD.replace("NAME", "x.example.com")));
        assert_eq!(plan(&boot("x.example.com"), &mirrored).expect("plan").etcd_clusters[0].image, "10.0.0.1:5000/etcd:v3.6.12");
        assert!(main.tls && main.client_cert_auth, "Manager provider: always TLS");
        assert_eq!((main.heartbeat_ms, main.election_ms), (Some(250), Some(2500)));
        assert_eq!(main.peer_url("a", "x.example.com"), "https://etcd-a.internal.x.example.com:2380");
        let events = &p.etcd_clusters[1];
        assert_eq!((events.ports.peer, events.ports.client), (2381, 4002));
        assert_eq!(events.member_dns("a", "x.example.com"), "etcd-events-a.internal.x.example.com");
        assert_eq!(p.my_members(main).len(), 1);
        assert_eq!(p.api_internal(), "api.internal.x.example.com");
        assert_eq!(p.kops_controller_internal(), "kops-controller.internal.x.example.com");
    }

    #[test]
    fn hosts_dns_for_gossip_and_none() {
        let c = cluster(&HEAD.replace("NAME", "x.k8s.local"));
        assert_eq!(plan(&boot("x.k8s.local"), &c).expect("plan").dns, DnsMode::Hosts);
        let c = cluster(&format!("{}  topology:\n    dns:\n      type: None\n", HEAD.replace("NAME", "x.example.com")));
        let p = plan(&boot("x.example.com"), &c).expect("plan");
        assert_eq!(p.dns, DnsMode::Hosts);
        assert!(p.manage_public_api);
    }

    #[test]
    fn legacy_provider_follows_enable_flags() {
        let y = HEAD.replace("NAME", "x.k8s.local").replace("  - name: events\n", "  - name: events\n    provider: Legacy\n");
        let p = plan(&boot("x.k8s.local"), &cluster(&y)).expect("plan");
        assert!(!p.etcd_clusters[1].tls && !p.etcd_clusters[1].client_cert_auth);
        assert_eq!(p.etcd_clusters[1].peer_url("a", "x.k8s.local"), "http://etcd-events-a.internal.x.k8s.local:2381");
    }

    #[test]
    fn etcd_version_and_image_come_from_the_completed_spec_and_the_one_rewrite() {
        let c = cluster(&HEAD.replace("NAME", "x.k8s.local").replace("    version: 3.6.12\n    etcdMembers", "    etcdMembers"));
        let e = plan(&boot("x.k8s.local"), &c).expect_err("no version");
        assert!(e.to_string().starts_with("spec.etcdClusters[events].version:"), "{e}");
        // Both a proxy and a registry: the compiler's rewrite (proxy, then registry), not a second one.
        let both = cluster(&format!(
            "{}  assets:\n    containerProxy: proxy.example.com\n    containerRegistry: 10.0.0.1:5000\n",
            HEAD.replace("NAME", "x.example.com")
        ));
        let image = plan(&boot("x.example.com"), &both).expect("plan").etcd_clusters[0].image.clone();
        assert_eq!(image, keelson_api::image::remap_image("registry.k8s.io/etcd:v3.6.12", Some("10.0.0.1:5000"), Some("proxy.example.com")));
        assert_eq!(image, "10.0.0.1:5000/proxy.example.com-etcd:v3.6.12");
    }

    #[test]
    fn plan_errors_name_the_field() {
        let c = cluster(&HEAD.replace("NAME", "x.k8s.local").replace("name: events", "name: bogus"));
        let e = plan(&boot("x.k8s.local"), &c).expect_err("unknown etcd cluster");
        assert!(e.to_string().starts_with("spec.etcdClusters[bogus].name:"), "{e}");
        let e = plan(&boot("other.k8s.local"), &cluster(&HEAD.replace("NAME", "x.k8s.local"))).expect_err("mismatch");
        assert!(e.to_string().contains("metadata.name"), "{e}");
    }
}
