//! kube-apiserver, kube-controller-manager, kube-scheduler and kube-proxy defaults
//! (kOps `pkg/model/components/{apiserver,kubecontrollermanager,kubescheduler,kubeproxy,discovery}.go`).

use keelson_api::{ports, ClusterSpec, Duration, LeaderElectionConfiguration, Quantity};

use super::{default, strings, Context, Derived, Plugin};

/// The admission plugins kOps enables for every supported Kubernetes release.
const ADMISSION_PLUGINS: &[&str] = &[
    "DefaultStorageClass",
    "DefaultTolerationSeconds",
    "LimitRanger",
    "MutatingAdmissionWebhook",
    "NamespaceLifecycle",
    "NodeRestriction",
    "ResourceQuota",
    "RuntimeClass",
    "ServiceAccount",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionWebhook",
];

fn leader_elect(on: bool) -> LeaderElectionConfiguration {
    LeaderElectionConfiguration { leader_elect: Some(on), ..Default::default() }
}

fn quantity(s: &str) -> Quantity {
    s.parse().unwrap_or_else(|_| unreachable!("built-in quantity {s} is valid"))
}

/// The issuer of service-account tokens (kOps `discovery.go`).
fn service_account_issuer(ctx: &Context, spec: &ClusterSpec) -> Option<String> {
    let discovery = spec.service_account_issuer_discovery.as_ref();
    if let Some(store) = discovery.and_then(|d| d.discovery_store.as_deref()) {
        if let Some(path) = store.strip_prefix("memfs://") {
            return Some(format!("https://{path}"));
        }
        if let Some(path) = store.strip_prefix("gs://") {
            return Some(format!("https://storage.googleapis.com/{path}"));
        }
        if let Some(rest) = store.strip_prefix("s3://") {
            let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
            let key = if key.is_empty() { String::new() } else { format!("/{key}") };
            // No region known (validation makes AWS specs name zones): S3's global name, never a
            // guessed region.
            return Some(match ctx.region() {
                Some(region) => format!("https://{bucket}.s3.{region}.amazonaws.com{key}"),
                None => format!("https://{bucket}.s3.amazonaws.com{key}"),
            });
        }
        return Some(store.to_string());
    }
    if let Some(url) = discovery.and_then(|d| d.discovery_service.as_ref()).and_then(|s| s.url.clone()) {
        return Some(url);
    }
    Some(format!("https://api.internal.{}", ctx.name))
}

pub fn api_server(ctx: &Context, d: &Derived, spec: &mut ClusterSpec) {
    let Some(service_range) = spec.service_cluster_ip_range else { return };
    let etcd_main_members =
        spec.etcd_clusters.iter().flatten().find(|e| e.name.as_deref() == Some("main")).map(|e| e.etcd_members.as_ref().map_or(0, Vec::len)).unwrap_or(0);
    let etcd_major = spec.etcd_clusters.iter().flatten().next().and_then(|e| e.version.clone()).unwrap_or_else(|| ctx.versions.etcd_version().to_string());
    let etcd_major = etcd_major.trim_start_matches('v').split('.').next().unwrap_or("3").to_string();
    let scheme = if ctx.flag("EtcdEventsHTTP") { "http" } else { "https" };
    let mut servers = Vec::new();
    let mut overrides = Vec::new();
    for etcd in spec.etcd_clusters.iter().flatten() {
        match etcd.name.as_deref() {
            Some("main") => servers.push(format!("https://127.0.0.1:{}", ports::ETCD_MAIN.client)),
            Some("events") => overrides.push(format!("/events#{scheme}://127.0.0.1:{}", ports::ETCD_EVENTS.client)),
            Some("leases") => overrides.push(format!("coordination.k8s.io/leases#{scheme}://127.0.0.1:{}", ports::ETCD_LEASES.client)),
            _ => {}
        }
    }
    let authz = spec.authorization.as_ref();
    let authorization_mode = match authz {
        Some(a) if a.always_allow.is_some() => Some("AlwaysAllow"),
        Some(a) if a.rbac.is_some() => Some("Node,RBAC"),
        None => Some("Node,RBAC"),
        Some(_) => Some("Node,RBAC"),
    };
    let metrics_server = spec.metrics_server.as_ref().and_then(|m| m.enabled).unwrap_or(false);
    let kopeio_auth = spec.authentication.as_ref().is_some_and(|a| a.kopeio.is_some());
    let issuer = service_account_issuer(ctx, spec);
    let encryption = spec.encryption_config == Some(true);

    let a = spec.kube_api_server.get_or_insert_with(Default::default);
    default(&mut a.api_server_count, etcd_main_members as i64);
    default(&mut a.storage_backend, format!("etcd{etcd_major}"));
    default(&mut a.kubelet_preferred_address_types, strings(&["InternalIP", "Hostname", "ExternalIP"]));
    if kopeio_auth {
        default(&mut a.authentication_token_webhook_config_file, "/etc/kubernetes/authn.config".to_string());
    }
    if let Some(mode) = authorization_mode {
        default(&mut a.authorization_mode, mode.to_string());
    }
    default(&mut a.requestheader_allowed_names, strings(&["aggregator"]));
    default(&mut a.requestheader_extra_header_prefixes, strings(&["X-Remote-Extra-"]));
    default(&mut a.requestheader_group_headers, strings(&["X-Remote-Group"]));
    default(&mut a.requestheader_username_headers, strings(&["X-Remote-User"]));
    default(&mut a.image, ctx.versions.component_image("kube-apiserver"));
    if !ctx.at_least(1, 33) {
        default(&mut a.cloud_provider, "external".to_string());
    }
    default(&mut a.log_level, 2);
    default(&mut a.secure_port, 443);
    default(&mut a.bind_address, if d.ipv6 { "::" } else { "0.0.0.0" }.to_string());
    default(&mut a.allow_privileged, true);
    default(&mut a.service_cluster_ip_range, service_range);
    if !servers.is_empty() {
        default(&mut a.etcd_servers, servers);
    }
    if !overrides.is_empty() {
        default(&mut a.etcd_servers_overrides, overrides);
    }
    let mut plugins = strings(ADMISSION_PLUGINS);
    plugins.extend(a.append_admission_plugins.iter().flatten().cloned());
    default(&mut a.enable_admission_plugins, plugins);
    default(&mut a.anonymous_auth, false);
    if metrics_server {
        default(&mut a.enable_aggregator_routing, true);
    }
    default(&mut a.api_audiences, strings(&["kubernetes.svc.default"]));
    if let Some(issuer) = issuer {
        default(&mut a.service_account_issuer, issuer);
    }
    if let Some(issuer) = a.service_account_issuer.clone() {
        default(&mut a.service_account_jwksuri, base::oidc::jwks_uri(&issuer));
    }
    // Encryption at rest: the file nodeup writes from the state store's `encryptionconfig`
    // secret (kOps sets the same path in nodeup).
    if encryption {
        default(&mut a.encryption_provider_config, keelson_api::host_paths::ENCRYPTION_CONFIG_PATH.to_string());
    }
}

/// Whether the node IPAM of kube-controller-manager is off (IPv6 clusters get node CIDRs from the cloud).
fn ipam_external(d: &Derived) -> bool {
    d.ipv6
}

pub fn controller_manager(ctx: &Context, d: &Derived, spec: &mut ClusterSpec) {
    let pod_cidr = spec.pod_cidr;
    let k = spec.kube_controller_manager.get_or_insert_with(Default::default);
    default(&mut k.attach_detach_reconcile_sync_period, Duration::from_secs(60));
    default(&mut k.cluster_name, ctx.name.clone());
    default(&mut k.cloud_provider, "external".to_string());
    default(&mut k.log_level, 2);
    default(&mut k.image, ctx.versions.component_image("kube-controller-manager"));
    default(&mut k.leader_election, leader_elect(true));
    let external_ipam = ipam_external(d);
    let allocate = match d.plugin {
        Plugin::Gcp => false,
        Plugin::Kindnet if ctx.cloud == super::Cloud::Gce => false,
        _ => !external_ipam,
    };
    default(&mut k.allocate_node_cidrs, allocate);
    if !external_ipam {
        if let Some(pod) = pod_cidr {
            default(&mut k.cluster_cidr, pod);
        }
    }
    if let Some(c) = k.cluster_cidr.filter(|c| c.is_ipv6()) {
        let size = c.net().prefix_len() as i64;
        default(&mut k.node_cidr_mask_size, size + ((128 - size) / 2).min(16));
    }
    default(&mut k.configure_cloud_routes, d.plugin == Plugin::Kubenet);
    default(&mut k.use_service_account_credentials, true);
    if external_ipam {
        default(&mut k.controllers, strings(&["*", "-nodeipam"]));
    }
}

pub fn scheduler(ctx: &Context, _d: &Derived, spec: &mut ClusterSpec) {
    let s = spec.kube_scheduler.get_or_insert_with(Default::default);
    default(&mut s.log_level, 2);
    default(&mut s.image, ctx.versions.component_image("kube-scheduler"));
    default(&mut s.leader_election, leader_elect(true));
}

pub fn kube_proxy(ctx: &Context, d: &Derived, spec: &mut ClusterSpec) {
    let kcm_cidr = spec.kube_controller_manager.as_ref().and_then(|k| k.cluster_cidr);
    let p = spec.kube_proxy.get_or_insert_with(Default::default);
    default(&mut p.log_level, 2);
    default(&mut p.cpu_request, quantity("100m"));
    default(&mut p.image, ctx.versions.component_image("kube-proxy"));
    if !ipam_external(d) && d.plugin != Plugin::AmazonVpc {
        if let Some(c) = kcm_cidr {
            default(&mut p.cluster_cidr, c);
        }
    }
}

pub(crate) fn leader_election(on: bool) -> LeaderElectionConfiguration {
    leader_elect(on)
}
