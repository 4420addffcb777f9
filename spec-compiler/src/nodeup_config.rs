//! Per-instance-group NodeupConfig: what nodeup on that group's instances installs and writes
//! (kOps `pkg/nodemodel/nodeupconfigbuilder.go`, `fileassets.go`, `populate_instancegroup_spec.go`).

use std::collections::{BTreeMap, BTreeSet};

use keelson_api::nodeup::{
    ApiServerNodeConfig, ConfigStore, ControlPlaneNodeConfig, NodeApi, NodeBootstrap, NodeBootstrapMethod, NodeupConfig, NodeupNetworking, StaticManifest,
};
use keelson_api::{
    CalicoNetworkingSpec, CiliumNetworkingSpec, Cluster, ClusterSpec, FileAssetSpec, HookSpec, InstanceGroup, KubeletConfigSpec, Merge, NetworkingSpec,
    NvidiaGPUConfig, Role,
};

use crate::complete::CompileOptions;
use crate::versions::{Arch, Versions, VersionsError};
use keelson_api::host_paths::SCHEDULER_KUBECONFIG;

/// The kube-scheduler configuration file every API-server host gets.
fn default_scheduler_config() -> String {
    format!("apiVersion: kubescheduler.config.k8s.io/v1\nclientConnection:\n  kubeconfig: {SCHEDULER_KUBECONFIG}\nkind: KubeSchedulerConfiguration\n")
}

/// The kube-scheduler configuration file: the spec's `KubeSchedulerConfiguration` additional object
/// when there is one (as kOps merges it), with the kubeconfig path nodeup writes; else the default.
pub fn scheduler_config(additional: &[serde_json::Value]) -> Result<String, crate::output::OutputError> {
    let is_config = |o: &&serde_json::Value| {
        o.get("kind").and_then(|k| k.as_str()) == Some("KubeSchedulerConfiguration")
            && o.get("apiVersion").and_then(|v| v.as_str()).is_some_and(|v| v.starts_with("kubescheduler.config.k8s.io/"))
    };
    let Some(user) = additional.iter().find(is_config) else { return Ok(default_scheduler_config()) };
    let mut config = user.clone();
    if let Some(map) = config.as_object_mut() {
        let conn = map.entry("clientConnection").or_insert_with(|| serde_json::json!({}));
        if let Some(conn) = conn.as_object_mut() {
            conn.insert("kubeconfig".into(), SCHEDULER_KUBECONFIG.into());
        }
    }
    crate::output::to_yaml("KubeSchedulerConfiguration", &config)
}

/// Why a node config could not be built.
#[derive(Debug, thiserror::Error)]
pub enum NodeupConfigError {
    #[error("InstanceGroup/{group}: assets: {source}")]
    Assets { group: String, source: Box<VersionsError> },
    #[error("InstanceGroup/{group}: spec.role: {role:?} is not a role nodeup serves")]
    Role { group: String, role: String },
    #[error("Cluster: {field}: {source}", field = .0.field(), source = .0)]
    NodeBootstrap(#[from] keelson_api::nodeup::NodeBootstrapError),
}

/// How the cluster's workers join: by cloud identity on AWS and GCE (the join server on the control
/// planes), unless the cluster annotations ask for bootstrap tokens and opt in to them; tokens elsewhere.
pub fn node_bootstrap(cluster: &Cluster) -> Result<NodeBootstrap, NodeupConfigError> {
    let identity = keelson_api::nodeup::joins_by_cloud_identity(cluster.spec.cloud_provider.as_deref());
    let method = keelson_api::nodeup::node_bootstrap_method(cluster.metadata.annotations.as_ref(), identity)?;
    let server = (method == NodeBootstrapMethod::CloudIdentity)
        .then(|| format!("https://kops-controller.internal.{}:{}", cluster.name(), keelson_api::nodeup::NODE_JOIN_PORT));
    Ok(NodeBootstrap { method, server })
}

/// Whether nodeup installs the standard CNI plugins (plugins that ship their own do not need them).
pub fn installs_cni_assets(spec: &ClusterSpec) -> bool {
    let Some(n) = &spec.networking else { return true };
    if let Some(cilium) = &n.cilium {
        return cilium.chaining_mode.as_deref() == Some("portmap");
    }
    n.amazonvpc.is_none() && n.calico.is_none()
}

/// The asset list for one architecture, in kOps' order.
pub fn assets_for(spec: &ClusterSpec, versions: &Versions, arch: Arch) -> Result<Vec<String>, VersionsError> {
    let mut names = vec!["kubelet", "kubectl"];
    match spec.cloud_provider.as_deref() {
        Some("aws") => names.push("ecr-credential-provider"),
        Some("gce") => names.push("auth-provider-gcp"),
        _ => {}
    }
    if installs_cni_assets(spec) {
        names.push("cni-plugins");
    }
    let containerd = spec.containerd.as_ref();
    if containerd.and_then(|c| c.skip_install) != Some(true) {
        names.push("containerd");
        names.push("runc");
        if containerd.and_then(|c| c.install_nerd_ctl) == Some(true) {
            names.push("nerdctl");
        }
        if containerd.and_then(|c| c.install_cri_ctl) == Some(true) {
            names.push("crictl");
        }
    }
    Ok(versions.assets(arch, &names)?.iter().map(|a| a.compact_string()).collect())
}

/// The protokube build for control-plane hosts: the `--protokube-asset` of that architecture, else
/// kOps-style `<kops base URL>/linux/<arch>/protokube` (hash from `--asset-hashes`, the table or the
/// published `.sha256`). `None` when neither is given.
pub fn protokube_asset(versions: &Versions, arch: Arch, options: &CompileOptions) -> Result<Option<String>, VersionsError> {
    if let Some(a) = options.protokube_assets.get(&arch) {
        return Ok(Some(format!("{}@{}", a.sha256, a.urls.join(","))));
    }
    let Some(base) = options.kops_base_url.as_deref().filter(|b| !b.is_empty()) else {
        return Ok(None);
    };
    let url = format!("{}/linux/{}/protokube", base.trim_end_matches('/'), arch.as_str());
    Ok(Some(versions.resolve_asset("protokube", "", &url)?.compact_string()))
}

/// AWS instance families with GPUs (`g4dn`, `g5`, `p4d`, …).
fn has_gpu(machine_type: &str) -> bool {
    let family = machine_type.split('.').next().unwrap_or("");
    let mut chars = family.chars();
    matches!(chars.next(), Some('g' | 'p')) && chars.next().is_some_and(|c| c.is_ascii_digit())
}

fn nvidia_enabled(cfg: Option<&NvidiaGPUConfig>) -> bool {
    cfg.and_then(|g| g.enabled) == Some(true)
}

/// Node labels for a group (kOps `nodelabels.BuildNodeLabels`); the cloud model tags autoscaling
/// groups with them for the cluster-autoscaler.
pub fn node_labels(spec: &ClusterSpec, ig: &InstanceGroup, role: Role, flags: &CompileOptions) -> Option<BTreeMap<String, String>> {
    if role == Role::Bastion {
        return None;
    }
    let base = if role == Role::ControlPlane { spec.master_kubelet.clone() } else { spec.kubelet.clone() };
    let mut merged = base.unwrap_or_default();
    merged.merge_from(&ig.spec.kubelet.clone().unwrap_or_default());
    let mut labels = merged.node_labels.unwrap_or_default();
    let mut set = |k: &str| {
        labels.insert(k.to_string(), String::new());
    };
    match role {
        Role::ControlPlane => {
            if flags.feature_flags.contains("APIServerNodes") {
                set("node-role.kubernetes.io/api-server");
            }
            set("node-role.kubernetes.io/control-plane");
            set("kops.k8s.io/kops-controller-pki");
            set("node.kubernetes.io/exclude-from-external-load-balancers");
        }
        Role::ApiServer => set("node-role.kubernetes.io/api-server"),
        Role::Node => set("node-role.kubernetes.io/node"),
        Role::Bastion => {}
    }
    for (k, v) in ig.spec.node_labels.iter().flatten() {
        labels.insert(k.clone(), v.clone());
    }
    Some(labels)
}

/// The kubelet configuration of one group: the role's cluster kubelet, labels and taints, the group's settings.
pub fn kubelet_for(spec: &ClusterSpec, ig: &InstanceGroup, role: Role, flags: &CompileOptions) -> KubeletConfigSpec {
    let mut ig = ig.clone();
    // GPU machines with the NVIDIA runtime get a label and a taint (AWS instance families).
    let gpu_wanted = nvidia_enabled(spec.containerd.as_ref().and_then(|c| c.nvidia_gpu.as_ref()))
        || nvidia_enabled(ig.spec.containerd.as_ref().and_then(|c| c.nvidia_gpu.as_ref()));
    let machine = ig.spec.machine_type.clone().unwrap_or_default();
    if gpu_wanted && spec.cloud_provider.as_deref() == Some("aws") && machine.split(',').any(has_gpu) {
        ig.spec.node_labels.get_or_insert_with(BTreeMap::new).insert("kops.k8s.io/gpu".into(), "1".into());
        let taints = ig.spec.taints.get_or_insert_with(Vec::new);
        if !taints.iter().any(|t| t.starts_with("nvidia.com/gpu")) {
            taints.push("nvidia.com/gpu:NoSchedule".into());
        }
    }
    if role == Role::Node && ig.spec.containerd.as_ref().and_then(|c| c.gvisor.as_ref()).and_then(|g| g.enabled) == Some(true) {
        ig.spec.node_labels.get_or_insert_with(BTreeMap::new).insert("kops.k8s.io/gvisor".into(), "1".into());
    }

    let mut base = if role == Role::ControlPlane {
        let mut b = spec.master_kubelet.clone().unwrap_or_default();
        if spec.kubelet.as_ref().and_then(|k| k.anonymous_auth) == Some(false) {
            b.anonymous_auth = Some(false);
        }
        b
    } else {
        spec.kubelet.clone().unwrap_or_default()
    };
    base.node_labels = node_labels(spec, &ig, role, flags);
    let secure = base.anonymous_auth == Some(true);
    let mut taints: BTreeSet<String> = base.taints.iter().flatten().cloned().collect();
    taints.extend(ig.spec.taints.iter().flatten().cloned());
    taints.extend(ig.spec.kubelet.as_ref().and_then(|k| k.taints.clone()).into_iter().flatten());
    taints.extend(spec.kubelet.as_ref().and_then(|k| k.taints.clone()).into_iter().flatten());
    if let Some(own) = &ig.spec.kubelet {
        base.merge_from(own);
    }
    match role {
        Role::ControlPlane => {
            taints.insert("node-role.kubernetes.io/control-plane=:NoSchedule".into());
        }
        Role::ApiServer => {
            taints.insert("node-role.kubernetes.io/api-server=:NoSchedule".into());
        }
        _ => {}
    }
    if ig.spec.manager.as_deref() == Some("Karpenter") {
        taints.insert("karpenter.sh/unregistered=:NoExecute".into());
    }
    base.taints = if taints.is_empty() { None } else { Some(taints.into_iter().collect()) };
    if secure {
        base.anonymous_auth = Some(false);
    }
    base
}

/// Filter file assets / hooks by role, clearing the `roles` field.
fn for_role(items: &[FileAssetSpec], role: Role) -> Vec<FileAssetSpec> {
    items
        .iter()
        .filter(|f| f.roles.as_ref().is_none_or(|r| r.is_empty() || r.iter().any(|x| Role::parse(x) == Some(role))))
        .map(|f| FileAssetSpec { roles: None, ..f.clone() })
        .collect()
}

/// Hooks for a role (kOps `filterHooks`): those without roles or naming this one, roles cleared;
/// `None` when nothing is left (kOps writes `null`).
fn hooks_for(items: Option<&Vec<HookSpec>>, role: Role) -> Option<Vec<HookSpec>> {
    let out: Vec<HookSpec> = items
        .into_iter()
        .flatten()
        .filter(|h| h.roles.as_ref().is_none_or(|r| r.is_empty() || r.iter().any(|x| Role::parse(x) == Some(role))))
        .map(|h| HookSpec { roles: None, ..h.clone() })
        .collect();
    (!out.is_empty()).then_some(out)
}

/// The networking section nodeup needs.
fn networking(spec: &ClusterSpec, role: Role) -> NodeupNetworking {
    let n = spec.networking.clone().unwrap_or_default();
    let plugin = NetworkingSpec {
        amazonvpc: n.amazonvpc.as_ref().map(|_| Default::default()),
        calico: n.calico.as_ref().map(|c| CalicoNetworkingSpec { wireguard_enabled: c.wireguard_enabled.filter(|w| *w), ..Default::default() }),
        cilium: n.cilium.as_ref().map(|c| CiliumNetworkingSpec { ipam: c.ipam.clone().filter(|i| i == "eni"), ..Default::default() }),
        cni: n.cni.as_ref().filter(|c| c.uses_secondary_ip == Some(true)).cloned(),
        flannel: n.flannel.as_ref().map(|_| Default::default()),
        kuberouter: n.kuberouter.as_ref().map(|_| Default::default()),
        kindnet: n.kindnet.as_ref().map(|_| Default::default()),
        // nodeup gives containerd the kubenet CNI template.
        kubenet: n.kubenet.as_ref().map(|_| Default::default()),
        ..Default::default()
    };
    let _ = role;
    NodeupNetworking {
        network_cidr: None,
        non_masquerade_cidr: spec.non_masquerade_cidr.map(|c| c.to_string()),
        pod_cidr: None,
        service_cluster_ip_range: spec.service_cluster_ip_range.map(|c| c.to_string()),
        plugin,
    }
}

/// Build the NodeupConfig of one instance group from the completed cluster.
pub fn build(
    cluster: &Cluster,
    ig: &InstanceGroup,
    versions: &Versions,
    options: &CompileOptions,
    scheduler_config: &str,
) -> Result<NodeupConfig, NodeupConfigError> {
    let spec = &cluster.spec;
    let group = ig.name().to_string();
    let role = ig.role().ok_or_else(|| NodeupConfigError::Role { group: group.clone(), role: ig.spec.role.clone().unwrap_or_default() })?;
    let runs_api = matches!(role, Role::ControlPlane | Role::ApiServer);
    let is_cp = role == Role::ControlPlane;
    let config_base = spec.config_base.clone().unwrap_or_default();

    let mut assets = BTreeMap::new();
    for arch in Arch::ALL {
        let mut list = assets_for(spec, versions, arch).map_err(|source| NodeupConfigError::Assets { group: group.clone(), source: Box::new(source) })?;
        if is_cp {
            list.extend(
                protokube_asset(versions, arch, options).map_err(|source| NodeupConfigError::Assets { group: group.clone(), source: Box::new(source) })?,
            );
        }
        assets.insert(arch.as_str().to_string(), list);
    }

    let containerd_config = {
        let mut c = spec.containerd.clone().unwrap_or_default();
        c.merge_from(&ig.spec.containerd.clone().unwrap_or_default());
        let ig_gvisor = ig.spec.containerd.as_ref().and_then(|c| c.gvisor.as_ref()).and_then(|g| g.enabled) == Some(true);
        if !(role == Role::Node && ig_gvisor) {
            c.gvisor = None;
        }
        c
    };
    let nvidia_gpu = {
        let cluster_gpu = spec.containerd.as_ref().and_then(|c| c.nvidia_gpu.clone());
        let ig_gpu = ig.spec.containerd.as_ref().and_then(|c| c.nvidia_gpu.clone());
        if cluster_gpu.is_none() && ig_gpu.is_none() {
            None
        } else {
            let mut g = cluster_gpu.unwrap_or_default();
            g.merge_from(&ig_gpu.unwrap_or_default());
            if g.package.is_none() {
                g.package = Some(crate::versions::NVIDIA_DRIVER_PACKAGE.to_string());
            }
            Some(g)
        }
    };

    let kube_proxy_off = spec.kube_proxy.as_ref().and_then(|p| p.enabled) == Some(false) || (is_cp && spec.isolate_masters == Some(true));

    let mut file_assets = for_role(ig.spec.file_assets.as_deref().unwrap_or_default(), role);
    file_assets.extend(for_role(spec.file_assets.as_deref().unwrap_or_default(), role));
    if runs_api {
        file_assets.push(FileAssetSpec {
            content: Some(scheduler_config.to_string()),
            path: Some(keelson_api::host_paths::SCHEDULER_CONFIG.to_string()),
            ..Default::default()
        });
    }

    let mut etcd_manifests = Vec::new();
    if is_cp {
        for e in spec.etcd_clusters.iter().flatten() {
            let name = e.name.clone().unwrap_or_default();
            for _ in e.etcd_members.iter().flatten().filter(|m| m.instance_group.as_deref() == Some(ig.name())) {
                etcd_manifests.push(format!("{}/manifests/etcd/{}-{}.yaml", config_base.trim_end_matches('/'), name, ig.name()));
            }
        }
    }

    let api_server_config = runs_api.then(|| ApiServerNodeConfig {
        cluster_dns_domain: spec.cluster_dns_domain.clone().unwrap_or_default(),
        kube_api_server: spec.kube_api_server.clone().unwrap_or_default(),
        api: NodeApi {
            public_name: spec.master_public_name.clone(),
            additional_sans: spec.additional_sans.clone().filter(|s| !s.is_empty()),
            spec: keelson_api::APISpec {
                dns: spec.api.as_ref().and_then(|a| a.dns.clone()),
                load_balancer: spec
                    .api
                    .as_ref()
                    .and_then(|a| a.load_balancer.as_ref())
                    .filter(|lb| lb.use_for_internal_api == Some(true))
                    .map(|_| keelson_api::LoadBalancerAccessSpec { use_for_internal_api: Some(true), ..Default::default() }),
            },
        },
        service_account_public_keys: None,
        encryption_config: spec.encryption_config == Some(true),
    });

    let machine_type_matters =
        spec.networking.as_ref().is_some_and(|n| n.amazonvpc.is_some() || n.cilium.as_ref().and_then(|c| c.ipam.as_deref()) == Some("eni"));
    let gce = spec.cloud_config.as_ref();
    let mut packages: Vec<String> = spec.packages.clone().unwrap_or_default();
    packages.extend(ig.spec.packages.clone().unwrap_or_default());

    Ok(NodeupConfig {
        assets,
        cas: options.cas.clone(),
        cluster_name: cluster.name().to_string(),
        kubernetes_version: spec.kubernetes_version.as_ref().map(|v| v.to_string()).unwrap_or_default(),
        keypair_ids: BTreeMap::new(),
        kubelet_config: kubelet_for(spec, ig, role, options),
        kube_proxy: if kube_proxy_off { None } else { spec.kube_proxy.clone() },
        networking: networking(spec, role),
        update_policy: ig.spec.update_policy.clone().or(spec.update_policy.clone()).unwrap_or_else(|| "automatic".into()),
        // Instance-group hooks first: nodeup lets them override cluster hooks of the same name.
        hooks: vec![hooks_for(ig.spec.hooks.as_ref(), role), hooks_for(spec.hooks.as_ref(), role)],
        etcd_cluster_names: if is_cp { spec.etcd_clusters.iter().flatten().filter_map(|e| e.name.clone()).collect() } else { Vec::new() },
        file_assets,
        install_cni_assets: installs_cni_assets(spec),
        use_cilium_etcd: spec.networking.as_ref().is_some_and(|n| n.cilium.is_some())
            && spec.etcd_clusters.iter().flatten().any(|e| e.name.as_deref() == Some("cilium")),
        service_node_port_range: spec.kube_api_server.as_ref().and_then(|a| a.service_node_port_range.clone()),
        sysctl_parameters: keelson_api::nodeup::sysctl_parameters(
            ig.spec.sysctl_parameters.as_deref().unwrap_or_default(),
            spec.sysctl_parameters.as_deref().unwrap_or_default(),
        ),
        dns_zone: if is_cp { spec.dns_zone.clone() } else { None },
        containerd_config,
        api_server_config,
        control_plane_config: is_cp.then(|| ControlPlaneNodeConfig {
            kube_controller_manager: spec.kube_controller_manager.clone().unwrap_or_default(),
            kube_scheduler: spec.kube_scheduler.clone().unwrap_or_default(),
        }),
        static_manifests: if runs_api {
            vec![StaticManifest { key: "kube-apiserver-healthcheck".into(), path: "manifests/static/kube-apiserver-healthcheck.yaml".into() }]
        } else {
            Vec::new()
        },
        node_ip_families: if runs_api { gce.and_then(|c| c.node_ip_families.clone()).unwrap_or_default() } else { Vec::new() },
        multizone: gce.and_then(|c| c.multizone),
        node_tags: gce.and_then(|c| c.node_tags.clone()),
        default_machine_type: machine_type_matters.then(|| ig.spec.machine_type.as_deref().and_then(|m| m.split(',').next()).map(str::to_string)).flatten(),
        nvidia_gpu,
        channels_manifest: is_cp.then(|| format!("{}/manifests/channels/kops-channels.yaml", config_base.trim_end_matches('/'))),
        config_store: runs_api.then(|| ConfigStore { keypairs: spec.key_store.clone(), secrets: spec.secret_store.clone() }),
        etcd_manifests,
        packages,
        apt_repository: spec.assets.as_ref().and_then(|a| a.file_repository.as_deref()).map(keelson_api::host_packages::apt_repository),
        uses_none_dns: keelson_api::plan::uses_none_dns(spec),
        node_bootstrap: Some(node_bootstrap(cluster)?).filter(|b| b.method == NodeBootstrapMethod::CloudIdentity),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_families() {
        for gpu in ["g4dn.xlarge", "g5.2xlarge", "p4d.24xlarge", "g4ad.16xlarge"] {
            assert!(has_gpu(gpu), "{gpu}");
        }
        for cpu in ["m5.large", "t3.medium", "m6g.large", "c7gn.xlarge", "gp3"] {
            assert!(!has_gpu(cpu), "{cpu}");
        }
    }

    #[test]
    fn hooks_are_filtered_by_role_with_roles_cleared() {
        let hook = |name: &str, roles: Option<Vec<&str>>| HookSpec {
            name: Some(name.into()),
            roles: roles.map(|r| r.into_iter().map(str::to_string).collect()),
            manifest: Some("ExecStart=/bin/true".into()),
            ..Default::default()
        };
        let all = vec![hook("everywhere", None), hook("cp-only", Some(vec!["Master"])), hook("nodes-only", Some(vec!["Node"]))];
        let nodes = hooks_for(Some(&all), Role::Node).expect("some");
        assert_eq!(nodes.iter().map(|h| h.name.as_deref().unwrap_or("")).collect::<Vec<_>>(), ["everywhere", "nodes-only"]);
        assert!(nodes.iter().all(|h| h.roles.is_none()));
        let cp = hooks_for(Some(&all), Role::ControlPlane).expect("some");
        assert_eq!(cp.len(), 2);
        assert_eq!(hooks_for(None, Role::Node), None, "kOps writes null for no hooks");
        assert_eq!(hooks_for(Some(&vec![hook("x", Some(vec!["Bastion"]))]), Role::Node), None);
    }

    #[test]
    fn a_kube_scheduler_configuration_object_becomes_the_scheduler_config() {
        assert_eq!(scheduler_config(&[]).expect("default"), "apiVersion: kubescheduler.config.k8s.io/v1\nclientConnection:\n  kubeconfig: /var/lib/kube-scheduler/kubeconfig\nkind: KubeSchedulerConfiguration\n");
        let user = serde_json::json!({
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "percentageOfNodesToScore": 50,
            "clientConnection": {"kubeconfig": "/elsewhere", "qps": 50},
        });
        let text = scheduler_config(&[serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap"}), user]).expect("merged");
        assert!(text.contains("percentageOfNodesToScore: 50") && text.contains("qps: 50"), "{text}");
        assert!(text.contains("kubeconfig: /var/lib/kube-scheduler/kubeconfig") && !text.contains("/elsewhere"), "{text}");
    }
}
