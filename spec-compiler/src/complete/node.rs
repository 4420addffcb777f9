//! kubelet, containerd, cluster DNS and add-on defaults (kOps `pkg/model/components/{kubelet,
//! containerd,kubedns}.go`, `etcdmanager/options.go`).

use std::collections::BTreeMap;

use keelson_api::{ClusterSpec, Duration, KubeletConfigSpec, Merge, NodeLocalDNSConfig, Quantity, Runc};

use super::network::nth_address;
use super::{default, Cloud, Context, Derived, Plugin};

/// Hard eviction thresholds kOps sets on every kubelet.
pub const EVICTION_HARD: &str = "memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%,imagefs.available<10%,imagefs.inodesFree<5%";
const NODE_LOCAL_DNS_IMAGE: &str = "registry.k8s.io/dns/k8s-dns-node-cache:1.26.0";
const NODE_PROBLEM_DETECTOR_IMAGE: &str = "registry.k8s.io/node-problem-detector/node-problem-detector:v0.8.18";
const NVIDIA_DRIVER_PACKAGE: &str = "nvidia-driver-535-server";
const NVIDIA_DEVICE_PLUGIN_IMAGE: &str = "nvcr.io/nvidia/k8s-device-plugin:v0.17.3";

fn quantity(s: &str) -> Quantity {
    s.parse().unwrap_or_else(|_| unreachable!("built-in quantity {s} is valid"))
}

fn dns_server_ip(spec: &ClusterSpec) -> Option<String> {
    let local = spec.kube_dns.as_ref().and_then(|k| k.node_local_dns.as_ref());
    if local.and_then(|l| l.enabled) == Some(true) {
        if let Some(ip) = local.and_then(|l| l.local_ip.clone()) {
            return Some(ip);
        }
    }
    spec.kube_dns.as_ref().and_then(|k| k.server_ip.clone())
}

fn configure_kubelet(ctx: &Context, d: &Derived, k: &mut KubeletConfigSpec, domain: &str, dns: Option<&String>) {
    default(&mut k.enable_debugging_handlers, true);
    default(&mut k.pod_manifest_path, keelson_api::host_paths::STATIC_POD_DIR.to_string());
    default(&mut k.log_level, 2);
    default(&mut k.cluster_domain, domain.to_string());
    if let Some(ip) = dns {
        default(&mut k.cluster_dns, ip.clone());
    }
    default(&mut k.eviction_hard, EVICTION_HARD.to_string());
    default(&mut k.kubeconfig_path, keelson_api::host_paths::KUBELET_KUBECONFIG.to_string());
    default(&mut k.cgroup_root, "/".to_string());
    if ctx.user.cloud_provider.as_deref() != Some("metal") {
        default(&mut k.cloud_provider, "external".to_string());
    }
    if ctx.cloud == Cloud::Gce {
        default(&mut k.hairpin_mode, "promiscuous-bridge".to_string());
    }
    default(&mut k.cgroup_driver, "systemd".to_string());
    default(&mut k.protect_kernel_defaults, true);
    let grace = if d.plugin == Plugin::AmazonVpc { (0, 0) } else { (30, 10) };
    default(&mut k.shutdown_grace_period, Duration::from_secs(grace.0));
    default(&mut k.shutdown_grace_period_critical_pods, Duration::from_secs(grace.1));
    if !ctx.at_least(1, 34) {
        default(&mut k.register_schedulable, true);
    }
    let flatcar = ctx.groups.iter().any(|g| g.spec.image.as_deref().is_some_and(|i| i.to_lowercase().contains("flatcar")));
    if flatcar {
        default(&mut k.volume_plugin_directory, "/var/lib/kubelet/volumeplugins/".to_string());
    }
}

pub fn kubelet(ctx: &Context, d: &Derived, spec: &mut ClusterSpec) {
    let domain = spec.cluster_dns_domain.clone().unwrap_or_else(|| "cluster.local".to_string());
    let dns = dns_server_ip(spec);
    let isolate = spec.isolate_masters == Some(true);

    let user_kubelet = ctx.user.kubelet.clone().unwrap_or_default();
    let k = spec.kubelet.get_or_insert_with(Default::default);
    configure_kubelet(ctx, d, k, &domain, dns.as_ref());

    // Control-plane kubelets start from the user's cluster kubelet with their own settings on top.
    let user_master = ctx.user.master_kubelet.clone().unwrap_or_default();
    let seed = KubeletConfigSpec::merged(&user_kubelet, &user_master);
    let m = spec.master_kubelet.get_or_insert_with(Default::default);
    *m = KubeletConfigSpec::merged(&seed, m);
    if isolate {
        default(&mut m.enable_debugging_handlers, false);
        default(&mut m.hairpin_mode, "none".to_string());
    }
    configure_kubelet(ctx, d, m, &domain, dns.as_ref());
    // etcd-manager mounts the etcd binaries as image volumes on 1.32–1.35.
    if ctx.at_least(1, 32) && !ctx.at_least(1, 36) {
        let gates = m.feature_gates.get_or_insert_with(BTreeMap::new);
        gates.entry("ImageVolume".to_string()).or_insert_with(|| "true".to_string());
    }
}

pub fn containerd(ctx: &Context, _d: &Derived, spec: &mut ClusterSpec) {
    let c = spec.containerd.get_or_insert_with(Default::default);
    if c.version.is_none() {
        c.version = Some(ctx.versions.containerd_version().to_string());
        let runc = c.runc.get_or_insert_with(Runc::default);
        default(&mut runc.version, ctx.versions.runc_version().to_string());
    }
    default(&mut c.log_level, "info".to_string());
    default(&mut c.sandbox_image, ctx.versions.pause_image());
    if let Some(gpu) = c.nvidia_gpu.as_mut().filter(|g| g.enabled == Some(true)) {
        default(&mut gpu.package, NVIDIA_DRIVER_PACKAGE.to_string());
        default(&mut gpu.image, ctx.versions.remap_image(NVIDIA_DEVICE_PLUGIN_IMAGE));
    }
    if let Some(gv) = c.gvisor.as_mut().filter(|g| g.enabled == Some(true)) {
        default(&mut gv.platform, "systrap".to_string());
    }
}

pub fn kube_dns(ctx: &Context, d: &Derived, spec: &mut ClusterSpec) {
    let domain = spec.cluster_dns_domain.clone().unwrap_or_else(|| "cluster.local".to_string());
    let server_ip = spec.service_cluster_ip_range.map(|r| nth_address(r, 10).to_string());
    let kd = spec.kube_dns.get_or_insert_with(Default::default);
    default(&mut kd.cache_max_size, 1000);
    default(&mut kd.cache_max_concurrent, 150);
    if let Some(ip) = server_ip {
        default(&mut kd.server_ip, ip);
    }
    default(&mut kd.domain, domain);
    default(&mut kd.memory_request, quantity("70Mi"));
    default(&mut kd.cpu_request, quantity("100m"));
    default(&mut kd.memory_limit, quantity("170Mi"));
    if d.ipv6 && ctx.cloud == Cloud::Aws {
        default(&mut kd.upstream_nameservers, vec!["fd00:ec2::253".to_string()]);
    }
    let nl = kd.node_local_dns.get_or_insert_with(NodeLocalDNSConfig::default);
    default(&mut nl.enabled, false);
    if nl.enabled == Some(true) {
        default(&mut nl.local_ip, if d.ipv6 { "fd00:90de:d95::1" } else { "169.254.20.10" }.to_string());
        default(&mut nl.forward_to_kube_dns, false);
    }
    default(&mut nl.memory_request, quantity("5Mi"));
    default(&mut nl.cpu_request, quantity("25m"));
    default(&mut nl.image, ctx.versions.remap_image(NODE_LOCAL_DNS_IMAGE));
    default(&mut kd.provider, "CoreDNS".to_string());
}

/// Add-ons with defaults that show in the completed spec: node-problem-detector's, once its section
/// is present (kOps' `components/nodeproblemdetector.go`).
pub fn addons(ctx: &Context, _d: &Derived, spec: &mut ClusterSpec) {
    if let Some(npd) = spec.node_problem_detector.as_mut() {
        default(&mut npd.enabled, false);
        default(&mut npd.cpu_request, quantity("20m"));
        default(&mut npd.memory_request, quantity("100Mi"));
        default(&mut npd.memory_limit, quantity("100Mi"));
        default(&mut npd.image, ctx.versions.remap_image(NODE_PROBLEM_DETECTOR_IMAGE));
    }
}
