//! The protokube config of a control-plane group ([`keelson_api::protokube::ProtokubeConfig`]):
//! everything protokube acts on, derived here once from the completed spec, so protokube never reads
//! the spec and keeps no default of its own.

use keelson_api::host_paths::STATIC_POD_DIR;
use keelson_api::plan::ClusterDns;
use keelson_api::protokube::{DnsMode, EtcdCluster, EtcdMember, ProtokubeConfig, API_VERSION, KIND};
use keelson_api::{Cluster, ClusterSpec};

use crate::versions::Versions;

/// Why a protokube config could not be derived; `field` is the spec's field at fault.
#[derive(Debug, thiserror::Error)]
#[error("Cluster: {field}: {message}")]
pub struct ProtokubeConfigError {
    pub field: String,
    pub message: String,
}

fn refuse(field: impl Into<String>, message: impl Into<String>) -> ProtokubeConfigError {
    ProtokubeConfigError { field: field.into(), message: message.into() }
}

/// The protokube config of control-plane group `group` of the completed cluster; `versions` (the
/// compile's versions table) writes the default etcd image.
pub fn build(completed: &Cluster, group: &str, versions: &Versions) -> Result<ProtokubeConfig, ProtokubeConfigError> {
    let cluster_name = completed.name().to_string();
    if cluster_name.is_empty() {
        return Err(refuse("metadata.name", "missing"));
    }
    let spec = &completed.spec;
    let config_base = spec.config_base.as_deref().unwrap_or_default();
    let etcd_clusters = spec.etcd_clusters.iter().flatten().enumerate().map(|(i, ec)| etcd_cluster(versions, config_base, i, ec)).collect::<Result<_, _>>()?;
    let dns = match keelson_api::plan::cluster_dns(&cluster_name, spec) {
        ClusterDns::Hosts => DnsMode::Hosts,
        ClusterDns::Zone { private } => DnsMode::Zone { zone: spec.dns_zone.clone().filter(|z| !z.is_empty()), private },
    };
    let lb = spec.api.as_ref().and_then(|a| a.load_balancer.as_ref());
    let identity = keelson_api::nodeup::joins_by_cloud_identity(spec.cloud_provider.as_deref());
    let node_bootstrap =
        keelson_api::nodeup::node_bootstrap_method(completed.metadata.annotations.as_ref(), identity).map_err(|e| refuse(e.field(), e.to_string()))?;
    let (pod, non_masq) = (spec.pod_cidr.as_ref().map(|c| c.to_string()), spec.non_masquerade_cidr.as_ref().map(|c| c.to_string()));
    let pod_network = match keelson_api::nodeup::pod_network(pod.as_deref(), non_masq.as_deref()) {
        Some(n) => Some(n.parse().map_err(|e| refuse("spec.podCIDR", format!("{n:?}: {e}")))?),
        None => None,
    };
    let api_server_port = match spec.kube_api_server.as_ref().and_then(|a| a.secure_port) {
        Some(p) => u16::try_from(p).ok().filter(|p| *p != 0).ok_or_else(|| refuse("spec.kubeAPIServer.securePort", format!("{p}: not a port")))?,
        None => keelson_api::ports::KUBE_API,
    };
    Ok(ProtokubeConfig {
        api_version: API_VERSION.to_string(),
        kind: KIND.to_string(),
        instance_group: group.to_string(),
        etcd_clusters,
        manage_public_api: lb.is_none(),
        manage_internal_api: dns == DnsMode::Hosts || lb.is_none_or(|l| l.use_for_internal_api != Some(true)),
        api_load_balancer: lb.is_some(),
        dns,
        static_pod_dir: spec
            .master_kubelet
            .as_ref()
            .and_then(|k| k.pod_manifest_path.clone())
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| STATIC_POD_DIR.to_string()),
        api_server_port,
        node_bootstrap,
        kubelet_reloads_serving_cert: kubelet_reloads_serving_cert(spec),
        pod_network,
        cluster_name,
    })
}

fn etcd_cluster(versions: &Versions, config_base: &str, i: usize, ec: &keelson_api::EtcdClusterSpec) -> Result<EtcdCluster, ProtokubeConfigError> {
    let name = ec.name.clone().filter(|n| !n.is_empty()).ok_or_else(|| refuse(format!("spec.etcdClusters[{i}].name"), "missing"))?;
    let at = format!("spec.etcdClusters[{name}]");
    let ports = keelson_api::ports::etcd_ports(&name).ok_or_else(|| refuse(format!("{at}.name"), "unknown etcd cluster (main, events, cilium, leases)"))?;
    let mut members = Vec::new();
    for (j, m) in ec.etcd_members.iter().flatten().enumerate() {
        let field = format!("{at}.etcdMembers[{j}]");
        let mname = m.name.clone().filter(|n| !n.is_empty()).ok_or_else(|| refuse(format!("{field}.name"), "missing"))?;
        let ig = m.instance_group.clone().filter(|n| !n.is_empty()).ok_or_else(|| refuse(format!("{field}.instanceGroup"), "missing"))?;
        members.push(EtcdMember { name: mname, instance_group: ig });
    }
    // kOps semantics: the (default) Manager provider always runs TLS with client-certificate
    // auth (nodeup points the API server at https://127.0.0.1:4001 with an etcd-clients-ca
    // certificate); only the Legacy provider honours enableEtcdTLS / enableTLSAuth.
    let legacy = ec.provider.as_deref().is_some_and(|p| p.eq_ignore_ascii_case("legacy"));
    let tls = !legacy || ec.enable_etcd_tls.unwrap_or(false) || ec.enable_tls_auth.unwrap_or(false);
    let client_cert_auth = !legacy || ec.enable_tls_auth.unwrap_or(false);
    // Completion fills every etcd cluster's version from the versions table.
    let version = ec.version.clone().filter(|v| !v.is_empty()).ok_or_else(|| refuse(format!("{at}.version"), "missing from the completed spec"))?;
    // The image as every other image is written: rewritten for the spec's mirrors and pinned to a
    // known digest by the versions table (one function).
    let image = ec.image.clone().filter(|i| !i.is_empty()).unwrap_or_else(|| versions.etcd_image_of(&version));
    let manager = ec.manager.as_ref();
    let backup_interval = match manager.and_then(|m| m.backup_interval.as_ref()) {
        Some(d) if d.as_nanos() > 0 => std::time::Duration::from_nanos(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        Some(_) => return Err(refuse(format!("{at}.manager.backupInterval"), "must be positive")),
        None => base::etcd_backup::DEFAULT_INTERVAL,
    };
    // kOps puts backupRetentionDays in etcd-manager's environment first and manager.env after it:
    // a daily retention in env wins.
    let env = match manager.map(keelson_api::etcd_manager::env_retention).transpose() {
        Ok(env) => env.unwrap_or_default(),
        Err((field, message)) => return Err(refuse(format!("{at}.manager.{field}"), message)),
    };
    let millis = |d: &Option<keelson_api::Duration>| d.as_ref().map(|d| i64::try_from(d.as_nanos() / 1_000_000).unwrap_or(i64::MAX));
    Ok(EtcdCluster {
        backup_store: base::etcd_backup::cluster_dir(ec.backups.as_ref().and_then(|b| b.backup_store.as_deref()), config_base, &name),
        backup_interval,
        backup_retention_days: env.daily_days.or(manager.and_then(|m| m.backup_retention_days)).unwrap_or(base::etcd_backup::DEFAULT_RETENTION_DAYS),
        backup_hourly_retention: env.hourly.unwrap_or(keelson_api::etcd_manager::DEFAULT_HOURLY_RETENTION),
        members,
        ports,
        image,
        version: version.trim_start_matches('v').to_string(),
        tls,
        client_cert_auth,
        cpu_request: ec.cpu_request.as_ref().map(|q| q.as_str().to_string()),
        memory_request: ec.memory_request.as_ref().map(|q| q.as_str().to_string()),
        heartbeat_ms: millis(&ec.heartbeat_interval),
        election_ms: millis(&ec.leader_election_timeout),
        name,
    })
}

/// Whether this cluster's control-plane kubelets reload their serving certificate file by
/// themselves: Kubernetes 1.31 or later (`ReloadKubeletServerCertificateFile`, beta and on), unless
/// the control planes' kubelet spec turns that gate off (else protokube restarts the kubelet after
/// it renews that certificate).
pub fn kubelet_reloads_serving_cert(spec: &ClusterSpec) -> bool {
    let version_has_it = spec.kubernetes_version.as_ref().is_some_and(|v| v.at_least(1, 31));
    let kubelet = spec.master_kubelet.as_ref().or(spec.kubelet.as_ref());
    let gate_off = kubelet
        .and_then(|k| k.feature_gates.as_ref())
        .and_then(|g| g.get("ReloadKubeletServerCertificateFile"))
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("false"));
    version_has_it && !gate_off
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(yaml: &str) -> Cluster {
        keelson_api::parse_documents(yaml.as_bytes()).expect("parse").cluster
    }

    const HEAD: &str = "apiVersion: kops.k8s.io/v1alpha2\nkind: Cluster\nmetadata:\n  name: NAME\nspec:\n  cloudProvider: aws\n  configBase: s3://b/NAME\n  etcdClusters:\n  - name: main\n    enableEtcdTLS: true\n    version: 3.6.12\n    heartbeatInterval: 250ms\n    leaderElectionTimeout: 2500ms\n    etcdMembers:\n    - name: a\n      instanceGroup: cp-a\n    - name: b\n      instanceGroup: cp-b\n  - name: events\n    version: 3.6.12\n    etcdMembers:\n    - name: a\n      instanceGroup: cp-a\n";

    /// The versions table the compile would give `c` (its mirrors; `HEAD` names no Kubernetes version).
    fn versions(c: &Cluster) -> Versions {
        let assets = c.spec.assets.as_ref();
        let opts = crate::versions::LookupOptions {
            container_registry: assets.and_then(|a| a.container_registry.clone()),
            container_proxy: assets.and_then(|a| a.container_proxy.clone()),
            ..Default::default()
        };
        Versions::for_kubernetes(&"1.34.4".parse().expect("version"), &opts).expect("versions")
    }

    fn build_(c: &Cluster, group: &str) -> Result<ProtokubeConfig, ProtokubeConfigError> {
        build(c, group, &versions(c))
    }

    fn config(name: &str, extra: &str) -> Result<ProtokubeConfig, ProtokubeConfigError> {
        build_(&cluster(&format!("{}{extra}", HEAD.replace("NAME", name))), "cp-a")
    }

    #[test]
    fn etcd_manifests_go_where_the_control_planes_kubelet_reads_static_pods() {
        assert_eq!(config("x.example.com", "").expect("config").static_pod_dir, "/etc/kubernetes/manifests");
        let c = config("x.example.com", "  masterKubelet:\n    podManifestPath: /var/lib/static-pods\n").expect("config");
        assert_eq!(c.static_pod_dir, "/var/lib/static-pods");
    }

    #[test]
    fn config_from_spec() {
        let p = config("x.example.com", "  dnsZone: example.com\n  api:\n    loadBalancer:\n      type: Public\n").expect("config");
        assert_eq!(p.dns, DnsMode::Zone { zone: Some("example.com".into()), private: false });
        assert!(!p.manage_public_api, "a load balancer fronts the API");
        assert!(p.api_load_balancer);
        assert!(p.manage_internal_api, "the internal name stays protokube's");
        let alias = config("x.example.com", "  dnsZone: example.com\n  api:\n    loadBalancer:\n      type: Public\n      useForInternalApi: true\n");
        assert!(!alias.expect("config").manage_internal_api, "an alias to the balancer");
        let main = &p.etcd_clusters[0];
        assert_eq!((main.ports.peer, main.ports.client), (2380, 4001));
        assert_eq!(main.image, "registry.k8s.io/etcd:v3.6.12");
        assert_eq!(main.backup_store, "s3://b/x.example.com/backups/etcd/main");
        assert_eq!((main.backup_interval, main.backup_retention_days), (base::etcd_backup::DEFAULT_INTERVAL, base::etcd_backup::DEFAULT_RETENTION_DAYS));
        let mirrored = config("x.example.com", "  assets:\n    containerRegistry: 10.0.0.1:5000\n").expect("config");
        assert_eq!(mirrored.etcd_clusters[0].image, "10.0.0.1:5000/etcd:v3.6.12");
        assert!(main.tls && main.client_cert_auth, "Manager provider: always TLS");
        assert_eq!((main.heartbeat_ms, main.election_ms), (Some(250), Some(2500)));
        let events = &p.etcd_clusters[1];
        assert_eq!((events.ports.peer, events.ports.client), (2381, 4002));
        assert_eq!(p.my_members(main).len(), 1);
        assert_eq!((p.api_server_port, p.node_bootstrap), (443, keelson_api::nodeup::NodeBootstrapMethod::CloudIdentity));
        let on_8443 = config("x.example.com", "  kubeAPIServer:\n    securePort: 8443\n  podCIDR: 100.96.0.0/11\n").expect("config");
        assert_eq!(on_8443.api_server_port, 8443);
        assert_eq!(on_8443.pod_network, Some("100.96.0.0/11".parse().expect("cidr")));
        p.check().expect("what the compiler derives, protokube accepts");
    }

    #[test]
    fn hosts_dns_for_gossip_and_none() {
        assert_eq!(config("x.k8s.local", "").expect("config").dns, DnsMode::Hosts);
        let p = config("x.example.com", "  topology:\n    dns:\n      type: None\n").expect("config");
        assert_eq!(p.dns, DnsMode::Hosts);
        assert!(p.manage_public_api);
        assert!(!p.api_load_balancer);
    }

    #[test]
    fn legacy_provider_follows_enable_flags() {
        let y = HEAD.replace("NAME", "x.k8s.local").replace("  - name: events\n", "  - name: events\n    provider: Legacy\n");
        let p = build_(&cluster(&y), "cp-a").expect("config");
        assert!(!p.etcd_clusters[1].tls && !p.etcd_clusters[1].client_cert_auth);
        assert_eq!(p.etcd_clusters[1].peer_url("a", "x.k8s.local"), "http://etcd-events-a.internal.x.k8s.local:2381");
    }

    #[test]
    fn etcd_image_is_the_compilers_one_rewrite() {
        // Both a proxy and a registry: the proxy, then the registry (one function).
        let both = config("x.example.com", "  assets:\n    containerProxy: proxy.example.com\n    containerRegistry: 10.0.0.1:5000\n").expect("config");
        let image = both.etcd_clusters[0].image.clone();
        assert_eq!(image, keelson_api::image::remap_image("registry.k8s.io/etcd:v3.6.12", Some("10.0.0.1:5000"), Some("proxy.example.com")));
        assert_eq!(image, "10.0.0.1:5000/proxy.example.com-etcd:v3.6.12");
    }

    #[test]
    fn errors_name_the_field() {
        let no_version = cluster(&HEAD.replace("NAME", "x.k8s.local").replace("    version: 3.6.12\n    etcdMembers", "    etcdMembers"));
        let e = build_(&no_version, "cp-a").expect_err("no version");
        assert_eq!(e.field, "spec.etcdClusters[events].version", "{e}");
        let e = build_(&cluster(&HEAD.replace("NAME", "x.k8s.local").replace("name: events", "name: bogus")), "cp-a").expect_err("unknown etcd cluster");
        assert_eq!(e.field, "spec.etcdClusters[bogus].name", "{e}");
        let e = config("x.example.com", "    manager:\n      backupInterval: 0s\n").expect_err("zero interval");
        assert_eq!(e.field, "spec.etcdClusters[events].manager.backupInterval", "{e}");
        let e =
            build_(&cluster(&HEAD.replace("NAME", "x.k8s.local").replace("    - name: b\n      instanceGroup: cp-b\n", "    - instanceGroup: cp-b\n")), "cp-a")
                .expect_err("no name");
        assert_eq!(e.field, "spec.etcdClusters[main].etcdMembers[1].name", "{e}");
    }

    /// kOps' documented retention variables reach protokube; a daily one in `env` wins over
    /// `backupRetentionDays` (kOps puts env after it in etcd-manager's container).
    #[test]
    fn etcd_manager_retention_variables_set_protokubes_retention() {
        let env = "    manager:\n      backupRetentionDays: 30\n      env:\n      - name: ETCD_MANAGER_HOURLY_BACKUPS_RETENTION\n        value: 1d\n";
        let p = config("x.example.com", env).expect("config");
        let events = &p.etcd_clusters[1];
        assert_eq!((events.backup_hourly_retention, events.backup_retention_days), (std::time::Duration::from_secs(86_400), 30));
        assert_eq!(p.etcd_clusters[0].backup_hourly_retention, keelson_api::etcd_manager::DEFAULT_HOURLY_RETENTION);
        let daily = format!("{env}      - name: ETCD_MANAGER_DAILY_BACKUPS_RETENTION\n        value: 1y\n");
        assert_eq!(config("x.example.com", &daily).expect("config").etcd_clusters[1].backup_retention_days, 365);
        let text = serde_json::to_string(&p).expect("json");
        assert_eq!(text.matches("backupHourlyRetention").count(), 1, "written only where it is not the default: {text}");
        let e = config("x.example.com", "    manager:\n      env:\n      - name: ETCD_METRICS\n        value: basic\n").expect_err("unknown variable");
        assert_eq!(e.field, "spec.etcdClusters[events].manager.env[ETCD_METRICS]", "{e}");
    }

    #[test]
    fn serving_certificates_are_reloaded_from_1_31_unless_the_gate_is_off() {
        let spec = |yaml: &str| -> ClusterSpec { serde_yaml_ng::from_str(yaml).expect("spec") };
        assert!(kubelet_reloads_serving_cert(&spec("kubernetesVersion: 1.34.4\n")));
        assert!(kubelet_reloads_serving_cert(&spec("kubernetesVersion: 1.31.0\n")));
        assert!(!kubelet_reloads_serving_cert(&spec("kubernetesVersion: 1.30.9\n")));
        assert!(!kubelet_reloads_serving_cert(&spec("{}")));
        let off = "kubernetesVersion: 1.34.4\nmasterKubelet:\n  featureGates:\n    ReloadKubeletServerCertificateFile: \"false\"\n";
        assert!(!kubelet_reloads_serving_cert(&spec(off)));
        let on_for_workers_only =
            "kubernetesVersion: 1.34.4\nkubelet:\n  featureGates:\n    ReloadKubeletServerCertificateFile: \"false\"\nmasterKubelet: {}\n";
        assert!(kubelet_reloads_serving_cert(&spec(on_for_workers_only)));
    }
}
