//! From the NodeupConfig, the instance facts and the state store to the list of tasks that
//! configure this host (kOps `nodeup/pkg/model`: one builder per concern).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

/// How long a boot waits for what the control planes provide (the join server's certificates, the
/// API servers' addresses): a fresh cluster's control planes may take this long to come up.
pub const BOOT_WAIT: Duration = Duration::from_secs(30 * 60);

use keelson_api::nodeup::{BootConfig, NodeBootstrapMethod, NodeupConfig};
use keelson_api::{CloudProvider, Quantity, Role};

pub use crate::cert_tasks::{CertTask, KubeconfigTask, KubeletClientTask};
pub use crate::facts::{provider_id, Facts};

use crate::api_hosts::{self, ApiHostsTask};
use crate::assets::{Asset, AssetError, AssetKind};
use crate::config::{ConfigError, StateStore};
use crate::flag_table;
use crate::join::{self, JoinTask};
use crate::nodetasks::{
    download_task_name, file_task_name, DirTask, DownloadTask, FileTask, InstallArchiveTask, InstallTask, NodeTask, PodManifestTask, ServiceInput,
    ServiceOffTask, ServiceTask, SwapOffTask,
};
use crate::packages::{self, PackagesTask};
use crate::paths;
use crate::render::{self, containerd, kubelet, manifests, systemd};
use crate::tasks::Task;
use base::pki::{self, CertSpec, Keypair, PkiError, Usage};

/// Why the task list could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Asset(#[from] AssetError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Pki(#[from] PkiError),
    #[error("NodeupConfig: Assets: no assets for architecture {arch} (have: {have})")]
    NoAssets { arch: String, have: String },
    #[error("rendering {what}: {message}")]
    Render { what: String, message: String },
    #[error("state store: {path}: missing; {hint}")]
    Missing { path: String, hint: String },
    #[error(transparent)]
    Encryption(#[from] base::encryption::EncryptionError),
    #[error(
        "{path}: no valid bootstrap token after waiting {}s ({why}); the control planes' protokube publishes one once their API servers are up: check it there (`journalctl -u protokube`, `protokube_bootstrap_token_*` metrics)",
        waited.as_secs()
    )]
    NoBootstrapToken { path: String, why: String, waited: Duration },
}

/// A token this close to its expiry is not taken: the kubelet may need a while to use it.
pub const BOOTSTRAP_TOKEN_MIN_LEFT: Duration = Duration::from_secs(10 * 60);

/// Token mode: the bootstrap token the control planes published, once it is valid for at least
/// [`BOOTSTRAP_TOKEN_MIN_LEFT`]; waits for one up to `wait` (none yet: a new cluster whose
/// control planes are still starting; an older release's static token; one about to expire), then
/// fails saying why.
pub fn wait_for_bootstrap_token(store: &StateStore, wait: Duration) -> Result<base::bootstrap_token::BootstrapToken, ModelError> {
    let rel = base::bootstrap_token::state_key();
    let started = std::time::Instant::now();
    loop {
        let why = match store.read(&rel)? {
            None => "none published yet".to_string(),
            Some(bytes) => match base::bootstrap_token::Published::parse(&bytes) {
                Ok(p) if p.valid_for(std::time::SystemTime::now(), BOOTSTRAP_TOKEN_MIN_LEFT) => return Ok(p.token),
                Ok(p) => format!("the published token expires at {}", base::bootstrap_token::rfc3339(p.expires)),
                Err(e) => e.to_string(),
            },
        };
        let waited = started.elapsed();
        if waited >= wait {
            return Err(ModelError::NoBootstrapToken { path: store.url(&rel), why, waited });
        }
        tracing::warn!(path = %store.url(&rel), "waiting for a bootstrap token: {why}");
        std::thread::sleep((wait - waited).min(Duration::from_secs(5)));
    }
}

/// Inputs of the model.
pub struct Inputs<'a> {
    pub boot: &'a BootConfig,
    pub boot_bytes: &'a [u8],
    pub role: Role,
    pub config: &'a NodeupConfig,
    pub facts: &'a Facts,
    /// Shared with the tasks that read it while they run ([`api_hosts::ApiHostsTask`]).
    pub store: &'a Arc<StateStore>,
    /// How often a worker runs nodeup again (`keelson-nodeup.timer`), which joins again for new
    /// certificates once less than a third of their life is left.
    pub renewal_interval: Duration,
    /// Token mode: how long a worker waits for a valid bootstrap token in the state store.
    pub bootstrap_token_wait: Duration,
}

/// The tasks for this host, plus warnings about things skipped.
pub struct Model {
    pub tasks: Vec<Box<NodeTask>>,
    pub warnings: Vec<String>,
}

fn render_err(what: &str) -> impl FnOnce(String) -> ModelError + '_ {
    move |message| ModelError::Render { what: what.to_string(), message }
}

/// First address of a CIDR (the `kubernetes` service IP).
pub fn first_ip(cidr: &str) -> Option<IpAddr> {
    let (addr, _) = cidr.split_once('/')?;
    match addr.parse::<IpAddr>().ok()? {
        IpAddr::V4(v) => Some(IpAddr::V4((u32::from(v).wrapping_add(1)).into())),
        IpAddr::V6(v) => Some(IpAddr::V6((u128::from(v).wrapping_add(1)).into())),
    }
}

/// Whether an asset is on the boot's critical path: what the kubelet and containerd need to start
/// (kubelet, containerd, runc) and protokube, which claims the etcd volumes while the rest installs.
/// kubectl, the CNI plugins and credential providers come after.
pub fn boot_critical(asset: &Asset) -> bool {
    match &asset.kind {
        AssetKind::Binary { dest } => [paths::KUBELET_BIN, paths::RUNC_BIN, paths::PROTOKUBE_BIN].contains(&dest.as_str()),
        AssetKind::Archive { .. } => asset.file_name.starts_with("containerd-"),
        AssetKind::Other => false,
    }
}

/// Build every task.
pub fn build(inp: &Inputs) -> Result<Model, ModelError> {
    let mut tasks: Vec<Box<NodeTask>> = Vec::new();
    let mut warnings = Vec::new();
    let cfg = inp.config;
    let aws = inp.boot.cloud_provider == CloudProvider::Aws;

    // Assets first: the boot-critical downloads start at once, concurrently, and the rest once
    // they are in (on a busy host they would otherwise share the network and the hashing CPU).
    let list = cfg
        .assets
        .get(&inp.facts.arch)
        .ok_or_else(|| ModelError::NoAssets { arch: inp.facts.arch.clone(), have: cfg.assets.keys().cloned().collect::<Vec<_>>().join(", ") })?;
    let assets = list.iter().map(|spec| Asset::parse(spec).map(Arc::new)).collect::<Result<Vec<_>, _>>()?;
    let critical: Vec<String> = assets.iter().filter(|a| boot_critical(a)).map(|a| download_task_name(a)).collect();
    let mut protokube_bin = Vec::new();
    let mut containerd_inputs = Vec::new();
    let mut kubelet_inputs = Vec::new();
    let mut has_ecr = false;
    for asset in assets {
        let after = if boot_critical(&asset) { Vec::new() } else { critical.clone() };
        tasks.push(Box::new(DownloadTask { asset: asset.clone(), after }));
        match &asset.kind {
            AssetKind::Binary { dest } => {
                let t = InstallTask { asset: asset.clone(), member: None, dest: dest.clone(), mode: 0o755 };
                let input = ServiceInput::installed(t.name(), &asset);
                match dest.as_str() {
                    paths::KUBELET_BIN => kubelet_inputs.push(input),
                    paths::RUNC_BIN => containerd_inputs.push(input),
                    paths::PROTOKUBE_BIN => protokube_bin.push(input),
                    paths::ECR_CREDENTIAL_PROVIDER_BIN => has_ecr = true,
                    _ => {}
                }
                tasks.push(Box::new(t));
            }
            AssetKind::Archive { .. } => {
                let t = InstallArchiveTask { asset: asset.clone() };
                if asset.file_name.starts_with("containerd-") {
                    containerd_inputs.push(ServiceInput::installed(t.name(), &asset));
                }
                tasks.push(Box::new(t));
            }
            AssetKind::Other => warnings.push(format!("asset {}: not recognised; downloaded to the cache only", asset.name())),
        }
    }

    // The distribution's packages the services below need (kOps' PackagesBuilder).
    let nftables = keelson_api::host_packages::kube_proxy_nftables(cfg);
    tasks.push(Box::new(PackagesTask { extra: cfg.packages.clone(), kube_proxy_nftables: nftables, apt_repository: cfg.apt_repository.clone() }));
    containerd_inputs.push(ServiceInput::after(packages::TASK_NAME));
    kubelet_inputs.push(ServiceInput::after(packages::TASK_NAME));

    // Kernel settings.
    let cilium = cfg.networking.plugin.cilium.is_some();
    let mut sysctl = FileTask::new(paths::SYSCTL_CONF, render::sysctls(cfg.service_node_port_range.as_deref(), aws, cilium, &cfg.sysctl_parameters), 0o644);
    sysctl.on_change = vec![vec!["sysctl".into(), "--system".into()]];
    tasks.push(Box::new(sysctl));
    let mut modules = FileTask::new(paths::MODULES_CONF, render::modules(), 0o644);
    modules.on_change = vec![vec!["modprobe".into(), "br_netfilter".into()], vec!["modprobe".into(), "overlay".into()]];
    tasks.push(Box::new(modules));
    tasks.push(Box::new(SwapOffTask));
    tasks.push(Box::new(FileTask::new(paths::BOOT_CONFIG_COPY, inp.boot_bytes.to_vec(), 0o644)));

    // containerd.
    let cc = &cfg.containerd_config;
    let kubenet = cfg.networking.plugin.kubenet.is_some();
    let toml = containerd::config_toml(cc, kubenet).map_err(render_err(paths::CONTAINERD_CONFIG))?;
    tasks.push(Box::new(FileTask::new(paths::CONTAINERD_CONFIG, toml, 0o644)));
    containerd_inputs.push(ServiceInput::file(paths::CONTAINERD_CONFIG));
    if kubenet {
        let template = containerd::KUBENET_CNI_TEMPLATE_PATH;
        tasks.push(Box::new(FileTask::new(template, containerd::KUBENET_CNI_TEMPLATE, 0o644)));
        containerd_inputs.push(ServiceInput::file(template));
    }
    for (path, body) in containerd::mirror_files(cc).map_err(render_err("registry mirrors"))? {
        containerd_inputs.push(ServiceInput::file(&path));
        tasks.push(Box::new(FileTask::new(&path, body, 0o644)));
    }
    let unit_path = |u: &str| format!("{}/{u}", paths::SYSTEMD_DIR);
    tasks.push(Box::new(FileTask::new(&unit_path("containerd.service"), systemd::containerd().render(), 0o644)));
    containerd_inputs.push(ServiceInput::file(&unit_path("containerd.service")));
    let containerd_svc = ServiceTask::daemon("containerd.service", containerd_inputs);
    let containerd_input = ServiceInput::service(&containerd_svc);
    tasks.push(Box::new(containerd_svc));
    tasks.push(Box::new(DirTask { path: paths::CNI_CONF_DIR.into(), mode: 0o755 }));

    // PKI material for this host.
    let is_cp = inp.role == Role::ControlPlane;
    let runs_api = matches!(inp.role, Role::ControlPlane | Role::ApiServer);
    // Control planes hold the CA's key (from the state store they may read); every other host
    // trusts only the CA certificate pinned in its NodeupConfig (itself pinned by hash in the
    // BootConfig), never an unpinned state-store read that whoever can write the store could swap.
    let ca_cert_pem = if runs_api {
        // Every trusted key, the primary's first: mid-rotation a client or kubelet certificate
        // of either key is accepted.
        load_ca_trust(inp.store, "kubernetes-ca")?
    } else {
        cfg.cas.get("kubernetes-ca").filter(|pem| !pem.trim().is_empty()).cloned().ok_or_else(|| {
            render_err("NodeupConfig: CAs")("kubernetes-ca is not pinned (run `keelson apply`, which pins the cluster CA into every NodeupConfig)".to_string())
        })?
    };
    tasks.push(Box::new(FileTask::new(paths::CA_CRT, ca_cert_pem.clone(), 0o644)));
    let ca_dep = file_task_name(paths::CA_CRT);

    // kubelet.
    let mut kubelet_spec = cfg.kubelet_config.clone();
    let node_ip = inp.facts.internal_ip.map(|ip| ip.to_string());
    if kubelet_spec.hostname_override.is_none() && !inp.facts.hostname.is_empty() {
        kubelet_spec.hostname_override = Some(inp.facts.hostname.clone());
    }
    let cluster = &cfg.cluster_name;
    // A worker of a cluster without DNS records: api.internal and the join server's name in the
    // hosts file, at the addresses the control planes publish (before the join and the kubelet,
    // which reach them by those names), then kept current by a timer.
    let hosts_dns_worker = !runs_api && keelson_api::nodeup::uses_hosts_dns(cluster, cfg.uses_none_dns.then_some("None"));
    if hosts_dns_worker {
        tasks.push(Box::new(ApiHostsTask { store: inp.store.clone(), cluster: cluster.clone(), wait: BOOT_WAIT }));
        kubelet_inputs.push(ServiceInput::after(api_hosts::TASK_NAME));
        let (service, timer) = (unit_path("keelson-api-hosts.service"), unit_path("keelson-api-hosts.timer"));
        tasks.push(Box::new(FileTask::new(&service, systemd::api_hosts(paths::BOOT_CONFIG_COPY).render(), 0o644)));
        tasks.push(Box::new(FileTask::new(&timer, systemd::api_hosts_timer().render(), 0o644)));
        let inputs = vec![
            ServiceInput::file(&service),
            ServiceInput::file(&timer),
            ServiceInput::file(paths::BOOT_CONFIG_COPY),
            ServiceInput::after(api_hosts::TASK_NAME),
        ];
        tasks.push(Box::new(ServiceTask::daemon("keelson-api-hosts.timer", inputs)));
    }
    // GCE has no hop limit: pods are kept from the metadata server (its tokens are the instance's
    // service account) by a rule on the pod network, installed before the kubelet starts pods.
    if inp.boot.cloud_provider == CloudProvider::Gce {
        let net = &cfg.networking;
        let pod_cidr = keelson_api::nodeup::pod_network(net.pod_cidr.as_deref(), net.non_masquerade_cidr.as_deref()).map(str::to_string).ok_or_else(|| {
            render_err("NodeupConfig: networking")("GCE needs podCIDR or nonMasqueradeCIDR (the pod network kept from the metadata server)".to_string())
        })?;
        let (service, timer) = (unit_path("keelson-metadata-concealment.service"), unit_path("keelson-metadata-concealment.timer"));
        tasks.push(Box::new(FileTask::new(&service, systemd::metadata_concealment(&pod_cidr).render(), 0o644)));
        tasks.push(Box::new(FileTask::new(&timer, systemd::metadata_concealment_timer().render(), 0o644)));
        let inputs = vec![ServiceInput::file(&service), ServiceInput::after(packages::TASK_NAME)];
        let once = ServiceTask { unit: "keelson-metadata-concealment.service".into(), inputs, once: true };
        kubelet_inputs.push(ServiceInput::service(&once));
        tasks.push(Box::new(once));
        tasks.push(Box::new(ServiceTask::daemon("keelson-metadata-concealment.timer", vec![ServiceInput::file(&service), ServiceInput::file(&timer)])));
    }
    let mut joined = false;
    if runs_api {
        let ca = Arc::new(load_ca(inp.store, "kubernetes-ca")?);
        let node = format!("system:node:{}", inp.facts.hostname);
        // The kubelet's client certificate in a file its kubeconfig names: renewing it changes
        // the file, not the kubeconfig, so the kubelet is not restarted (it reads it again).
        let client = KubeletClientTask {
            path: paths::KUBELET_CLIENT_PEM.into(),
            ca_name: "kubernetes-ca".into(),
            ca: ca.clone(),
            spec: CertSpec::client(&node, &["system:nodes"]),
            deps: vec![ca_dep.clone()],
        };
        let client_task = client.name();
        tasks.push(Box::new(client));
        let body = kubelet::kubeconfig("https://127.0.0.1", &ca_cert_pem, &node, kubelet::UserEntry::from_pem_file(paths::KUBELET_CLIENT_PEM))
            .map_err(|e| render_err(paths::KUBELET_KUBECONFIG)(e.to_string()))?;
        tasks.push(Box::new(FileTask { deps: vec![client_task], ..FileTask::new(paths::KUBELET_KUBECONFIG, body, 0o400) }));
        kubelet_inputs.push(ServiceInput::file(paths::KUBELET_KUBECONFIG));
        let mut server = CertSpec { cn: node, orgs: vec![], dns: vec![inp.facts.hostname.clone()], ips: vec![], usage: Usage::Server };
        server.ips.extend(inp.facts.internal_ip);
        tasks.push(Box::new(CertTask::new(paths::KUBELET_SERVER_CERT, "kubernetes-ca", ca, server, &ca_dep)));
        let server_crt = format!("{}.crt", paths::KUBELET_SERVER_CERT);
        kubelet_inputs.push(ServiceInput::file_of(format!("cert:{server_crt}"), &server_crt));
    } else if let Some(server) = cfg.node_bootstrap.as_ref().filter(|b| b.method == NodeBootstrapMethod::CloudIdentity).map(|b| b.server.clone()) {
        // Join by cloud identity: the join server signs this node's kubelet and kube-proxy CSRs.
        let server = server.ok_or_else(|| render_err("NodeupConfig: NodeBootstrap")("method CloudIdentity needs a Server".to_string()))?;
        let need = |what: &str| render_err("node join")(format!("no {what} (from IMDS, or --{what})"));
        let region = inp.facts.region.clone().or_else(|| inp.facts.zone.as_deref().and_then(keelson_api::plan::region_of_zone).map(str::to_string));
        tasks.push(Box::new(JoinTask {
            server,
            api_server: format!("https://api.internal.{cluster}"),
            ca_pem: ca_cert_pem.clone(),
            node_name: Some(inp.facts.hostname.clone()).filter(|h| !h.is_empty()).ok_or_else(|| need("hostname"))?,
            instance_id: inp.facts.instance_id.clone().ok_or_else(|| need("instance-id"))?,
            cloud: match inp.boot.cloud_provider {
                CloudProvider::Gce => join::JoinCloud::Gce { metadata: inp.facts.gce_metadata.clone() },
                _ => join::JoinCloud::Aws,
            },
            sts_url: base::node_join::sts_endpoint(region.as_deref().unwrap_or_default()),
            region: region.ok_or_else(|| need("region"))?,
            imds_url: inp.facts.imds_url.clone(),
            wait: BOOT_WAIT,
            challenge_listen: std::net::SocketAddr::from(([0, 0, 0, 0], base::node_join::CHALLENGE_PORT)),
            deps: std::iter::once(ca_dep.clone()).chain(hosts_dns_worker.then(|| api_hosts::TASK_NAME.to_string())).collect(),
        }));
        // The join writes the kubelet's certificate to the file its kubeconfig names; the
        // kubeconfig (the API server, the CA, that file) is the kubelet's input: a renewal by a
        // later join does not restart the kubelet (it reads the file again).
        let body = kubelet::kubeconfig(
            &format!("https://api.internal.{cluster}"),
            &ca_cert_pem,
            "kubelet",
            kubelet::UserEntry::from_pem_file(paths::KUBELET_CLIENT_PEM),
        )
        .map_err(|e| render_err(paths::KUBELET_KUBECONFIG)(e.to_string()))?;
        tasks.push(Box::new(FileTask { deps: vec![join::TASK_NAME.to_string()], ..FileTask::new(paths::KUBELET_KUBECONFIG, body, 0o600) }));
        kubelet_inputs.push(ServiceInput::file(paths::KUBELET_KUBECONFIG));
        joined = true;
    } else {
        // Token mode: a bootstrap token the control planes minted (it expires; protokube rotates it
        // and approves this node's first certificate only for a name that is no control plane's
        // and no existing Node's).
        let token = wait_for_bootstrap_token(inp.store, inp.bootstrap_token_wait)?;
        let body = kubelet::kubeconfig(
            &format!("https://api.internal.{cluster}"),
            &ca_cert_pem,
            "kubelet-bootstrap",
            kubelet::UserEntry { token: Some(token.to_string()), ..Default::default() },
        )
        .map_err(|e| render_err(paths::KUBELET_BOOTSTRAP_KUBECONFIG)(e.to_string()))?;
        tasks.push(Box::new(FileTask::new(paths::KUBELET_BOOTSTRAP_KUBECONFIG, body, 0o400)));
        kubelet_inputs.push(ServiceInput::file(paths::KUBELET_BOOTSTRAP_KUBECONFIG));
        kubelet_spec.bootstrap_kubeconfig = Some(paths::KUBELET_BOOTSTRAP_KUBECONFIG.into());
    }
    let provider_id = provider_id(inp.boot.cloud_provider, inp.facts);
    let kc =
        kubelet::configuration(&kubelet_spec, cc.address.as_deref(), runs_api, provider_id).map_err(|e| render_err(paths::KUBELET_CONFIG)(e.to_string()))?;
    let kc_yaml = serde_yaml_ng::to_string(&kc).map_err(|e| render_err(paths::KUBELET_CONFIG)(e.to_string()))?;
    tasks.push(Box::new(FileTask::new(paths::KUBELET_CONFIG, kc_yaml, 0o644)));
    // The site's KubeletConfiguration fragments (`--config-dir`), for kubelets that read them: nodeup
    // creates the directory and never writes into it.
    let version = cfg.kubernetes_version.parse::<keelson_api::KubernetesVersion>().map_err(|e| render_err("NodeupConfig: KubernetesVersion")(e.to_string()))?;
    let config_dir = kubelet::has_config_dir(&version).then_some(paths::KUBELET_CONFIG_DIR);
    if let Some(dir) = config_dir {
        tasks.push(Box::new(DirTask { path: dir.into(), mode: 0o755 }));
    }
    tasks.push(Box::new(FileTask::new(
        paths::KUBELET_SYSCONFIG,
        kubelet::sysconfig(&kubelet_spec, node_ip.as_deref(), has_ecr, config_dir).map_err(|e| render_err(paths::KUBELET_SYSCONFIG)(e.to_string()))?,
        0o644,
    )));
    if has_ecr {
        tasks.push(Box::new(FileTask::new(
            paths::KUBELET_CREDENTIAL_PROVIDER_CONFIG,
            kubelet::ecr_credential_provider_config().map_err(|e| render_err(paths::KUBELET_CREDENTIAL_PROVIDER_CONFIG)(e.to_string()))?,
            0o644,
        )));
        kubelet_inputs.push(ServiceInput::file(paths::KUBELET_CREDENTIAL_PROVIDER_CONFIG));
    }
    let manifest_dir = kubelet_spec.pod_manifest_path.clone().unwrap_or_else(|| paths::MANIFESTS_DIR.into());
    tasks.push(Box::new(DirTask { path: manifest_dir.clone(), mode: 0o755 }));
    tasks.push(Box::new(FileTask::new(&unit_path("kubelet.service"), systemd::kubelet().render(), 0o644)));
    tasks.push(Box::new(FileTask::new(paths::KUBELET_DROP_IN, systemd::kubelet_drop_in().render(), 0o644)));
    // The site's environment file is read at each start but is the site's: a change to it takes effect
    // with the kubelet's next restart, which nodeup does not cause.
    kubelet_inputs.extend([
        ServiceInput::file(paths::KUBELET_CONFIG),
        ServiceInput::file(paths::KUBELET_SYSCONFIG),
        ServiceInput::file(&unit_path("kubelet.service")),
        ServiceInput::file(paths::KUBELET_DROP_IN),
        ServiceInput::file(paths::CA_CRT),
        containerd_input.clone(),
    ]);

    // File assets of the group (e.g. the kube-scheduler configuration).
    for fa in &cfg.file_assets {
        let Some(path) = &fa.path else { continue };
        let content = fa.content.clone().unwrap_or_default();
        let bytes = if fa.is_base64 == Some(true) {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD.decode(content.trim()).map_err(|e| render_err("fileAssets")(format!("{path}: {e}")))?
        } else {
            content.into_bytes()
        };
        let mode = fa.mode.as_deref().and_then(|m| u32::from_str_radix(m.trim_start_matches("0o"), 8).ok()).unwrap_or(0o644);
        tasks.push(Box::new(FileTask::new(path, bytes, mode)));
    }

    // Hooks of the group and the cluster: unit files, enabled and run once (when they change).
    for hook in render::hooks::hooks(&cfg.hooks).map_err(|e| render_err("NodeupConfig: Hooks")(e.to_string()))? {
        let unit = format!("{}.service", hook.name);
        match hook.unit {
            Some(text) => {
                tasks.push(Box::new(FileTask::new(&unit_path(&unit), text, 0o644)));
                let mut inputs = vec![ServiceInput::file(&unit_path(&unit))];
                if hook.uses_containerd {
                    inputs.push(containerd_input.clone());
                }
                tasks.push(Box::new(ServiceTask { unit, inputs, once: true }));
            }
            None => tasks.push(Box::new(ServiceOffTask { unit })),
        }
    }

    if runs_api {
        control_plane(inp, is_cp, &mut tasks, &mut warnings, (&ca_dep, &ca_cert_pem), &manifest_dir)?;
    } else if let Some(proxy) = &cfg.kube_proxy {
        if joined {
            // Workers' kube-proxy uses the certificate the join server issued; it reads its
            // kubeconfig only at start, so a renewed certificate restarts the pod.
            let file = kube_proxy(inp, proxy, &manifest_dir, &format!("https://api.internal.{cluster}"), join::TASK_NAME.to_string())?;
            tasks.push(Box::new(PodManifestTask { file, inputs: vec![paths::KUBE_PROXY_KUBECONFIG.into()] }));
        } else {
            warnings.push("kube-proxy: not run on this worker: the static bootstrap token gives it no credentials (join by cloud identity does)".into());
        }
    }
    if is_cp {
        tasks.push(Box::new(FileTask::new(&unit_path("protokube.service"), systemd::protokube(paths::BOOT_CONFIG_COPY).render(), 0o644)));
        // protokube's start reloads systemd, so the scopes of the containers created after it (and
        // those already there) read the drop-in.
        tasks.push(Box::new(FileTask::new(paths::CONTAINER_SCOPES_DROP_IN, systemd::containers_after_protokube(), 0o644)));
        let mut inputs = vec![
            ServiceInput::file(&unit_path("protokube.service")),
            ServiceInput::file(paths::BOOT_CONFIG_COPY),
            ServiceInput::file(paths::CONTAINER_SCOPES_DROP_IN),
        ];
        inputs.extend(protokube_bin);
        tasks.push(Box::new(ServiceTask::daemon("protokube.service", inputs)));
    }
    let kubelet_svc = ServiceTask::daemon("kubelet.service", kubelet_inputs);
    let kubelet_started = ServiceInput::after(kubelet_svc.name());
    tasks.push(Box::new(kubelet_svc));
    if joined {
        // Certificate renewal on workers: nodeup again, periodically; its join task asks for new
        // certificates once less than a third of their life is left (the join protocol is the only
        // way a worker gets a kube-proxy certificate). Started after the kubelet, so the first run
        // never overlaps the boot run.
        let (service, timer) = (unit_path("keelson-nodeup.service"), unit_path("keelson-nodeup.timer"));
        tasks.push(Box::new(FileTask::new(&service, systemd::nodeup_again(paths::BOOT_CONFIG_COPY).render(), 0o644)));
        tasks.push(Box::new(FileTask::new(&timer, systemd::nodeup_again_timer(inp.renewal_interval).render(), 0o644)));
        let inputs = vec![ServiceInput::file(&service), ServiceInput::file(&timer), kubelet_started];
        tasks.push(Box::new(ServiceTask::daemon("keelson-nodeup.timer", inputs)));
    }
    Ok(Model { tasks, warnings })
}

fn missing(rel: &str) -> ModelError {
    ModelError::Missing { path: rel.to_string(), hint: "create the cluster PKI first (`keelson pki init --state DIR`)".into() }
}

/// A CA's certificate only (its public keyset): for what only verifies with it.
fn load_ca_cert(store: &StateStore, name: &str) -> Result<String, ModelError> {
    let rel = pki::issued_keyset_key(name);
    let bytes = store.read(&rel)?.ok_or_else(|| missing(&rel))?;
    Ok(pki::parse_keyset_cert(name, &bytes)?)
}

/// A CA's private keyset in the state store.
fn load_keyset(store: &StateStore, name: &str) -> Result<base::keyset::Keyset, ModelError> {
    let rel = format!("pki/private/{name}/keyset.yaml");
    let bytes = store.read(&rel)?.ok_or_else(|| missing(&rel))?;
    Ok(base::keyset::Keyset::parse(name, &bytes)?)
}

/// The trust bundle of a CA's private keyset (every key not distrusted, the primary's first).
fn load_ca_trust(store: &StateStore, name: &str) -> Result<String, ModelError> {
    Ok(load_keyset(store, name)?.trust_bundle())
}

/// The primary key of a CA's private keyset: what signs.
fn load_ca(store: &StateStore, name: &str) -> Result<Keypair, ModelError> {
    Ok(load_keyset(store, name)?.primary_keypair()?)
}

/// Set `slot` to `value` unless the spec already sets it (the spec wins).
fn default<T>(slot: &mut Option<T>, value: impl Into<T>) {
    if slot.is_none() {
        *slot = Some(value.into());
    }
}

/// A resource request as the manifest writes it.
fn quantity(q: Option<&Quantity>) -> Option<String> {
    q.map(Quantity::to_string)
}

/// Control-plane (and API-server) hosts: certificates, kubeconfigs, static pods.
fn control_plane(
    inp: &Inputs,
    is_cp: bool,
    tasks: &mut Vec<Box<NodeTask>>,
    warnings: &mut Vec<String>,
    (ca_dep, ca_trust): (&str, &str),
    manifest_dir: &str,
) -> Result<(), ModelError> {
    let cfg = inp.config;
    let cluster = &cfg.cluster_name;
    let kapi = paths::KUBE_APISERVER_PKI_DIR;
    let ca = Arc::new(load_ca(inp.store, "kubernetes-ca")?);
    // The root verifies every etcd cluster's server; the API server's client certificate comes from
    // its own intermediate, which every member trusts (and no member's key can sign).
    let etcd_root = load_ca_cert(inp.store, pki::ETCD_CLIENTS_CA)?;
    let etcd_ca = Arc::new(load_ca(inp.store, pki::ETCD_APISERVER_CLIENTS_CA)?);
    let agg_ca = Arc::new(load_ca(inp.store, "apiserver-aggregator-ca")?);
    let sa = load_ca(inp.store, "service-account")?;
    let mut deps = vec![ca_dep.to_string()];

    let mut file = |tasks: &mut Vec<Box<NodeTask>>, path: String, body: String, mode: u32| {
        deps.push(file_task_name(&path));
        tasks.push(Box::new(FileTask::new(&path, body, mode)));
    };
    file(tasks, format!("{kapi}/etcd-ca.crt"), etcd_root, 0o644);
    file(tasks, format!("{kapi}/apiserver-aggregator-ca.crt"), agg_ca.cert_pem.clone(), 0o644);
    file(tasks, format!("{kapi}/service-account.pub"), pki::public_key_pem(&sa.key_pem)?, 0o644);
    file(tasks, format!("{kapi}/service-account.key"), sa.key_pem.clone(), 0o600);
    // Token mode: worker kubelets authenticate with a Kubernetes bootstrap token (Secrets in
    // kube-system that protokube mints and rotates, each with an expiration); no token file.
    // Joining by cloud identity, no token is accepted.
    let by_identity = cfg.node_bootstrap.as_ref().is_some_and(|b| b.method == NodeBootstrapMethod::CloudIdentity);
    if is_cp {
        let kcm = format!("{}/kube-controller-manager", paths::SRV_KUBERNETES);
        file(tasks, format!("{kcm}/ca.crt"), ca.cert_pem.clone(), 0o644);
        file(tasks, format!("{kcm}/ca.key"), ca.key_pem.clone(), 0o600);
        file(tasks, format!("{kcm}/service-account.key"), sa.key_pem.clone(), 0o600);
    }

    let api_cfg = cfg.api_server_config.clone().unwrap_or_default();
    let domain = if api_cfg.cluster_dns_domain.is_empty() { "cluster.local".to_string() } else { api_cfg.cluster_dns_domain.clone() };
    let mut dns = vec![
        "kubernetes".to_string(),
        "kubernetes.default".into(),
        "kubernetes.default.svc".into(),
        format!("kubernetes.default.svc.{domain}"),
        format!("api.internal.{cluster}"),
        "localhost".into(),
    ];
    dns.extend(api_cfg.api.public_name.clone());
    dns.extend(api_cfg.api.additional_sans.clone().unwrap_or_default());
    dns.dedup();
    let mut ips: Vec<IpAddr> = vec![IpAddr::from([127, 0, 0, 1])];
    ips.extend(cfg.networking.service_cluster_ip_range.as_deref().and_then(first_ip));
    ips.extend(inp.facts.internal_ip);
    let certs = [
        ("server", "kubernetes-ca", ca.clone(), CertSpec { cn: "kubernetes-master".into(), orgs: vec![], dns, ips, usage: Usage::Server }),
        ("kubelet-api", "kubernetes-ca", ca.clone(), CertSpec::client("kubelet-api", &[])),
        ("etcd-client", pki::ETCD_APISERVER_CLIENTS_CA, etcd_ca, CertSpec::client("kube-apiserver", &[])),
        ("apiserver-aggregator", "apiserver-aggregator-ca", agg_ca, CertSpec::client("aggregator", &[])),
    ];
    for (base, ca_name, ca_kp, spec) in certs {
        let t = CertTask::new(&format!("{kapi}/{base}"), ca_name, ca_kp, spec, ca_dep);
        deps.push(t.name());
        tasks.push(Box::new(t));
    }

    // kube-apiserver
    let mut api = api_cfg.kube_api_server.clone();
    default(&mut api.client_ca_file, paths::CA_CRT);
    default(&mut api.tls_cert_file, format!("{kapi}/server.crt"));
    default(&mut api.tls_private_key_file, format!("{kapi}/server.key"));
    // Always the CA nodeup writes: the spec's `etcdCaFile` has never reached the flag (the flag
    // table used to look for `etcdCAFile`), and the rendered flags stay as they were.
    api.etcd_ca_file = Some(format!("{kapi}/etcd-ca.crt"));
    default(&mut api.etcd_cert_file, format!("{kapi}/etcd-client.crt"));
    default(&mut api.etcd_key_file, format!("{kapi}/etcd-client.key"));
    default(&mut api.kubelet_client_certificate, format!("{kapi}/kubelet-api.crt"));
    default(&mut api.kubelet_client_key, format!("{kapi}/kubelet-api.key"));
    default(&mut api.requestheader_client_ca_file, format!("{kapi}/apiserver-aggregator-ca.crt"));
    default(&mut api.proxy_client_cert_file, format!("{kapi}/apiserver-aggregator.crt"));
    default(&mut api.proxy_client_key_file, format!("{kapi}/apiserver-aggregator.key"));
    default(&mut api.service_account_key_file, vec![format!("{kapi}/service-account.pub")]);
    default(&mut api.service_account_signing_key_file, format!("{kapi}/service-account.key"));
    // Bootstrap tokens only when workers join with one; by cloud identity none is accepted.
    if !by_identity {
        default(&mut api.enable_bootstrap_token_auth, true);
    }
    if let Some(ip) = inp.facts.internal_ip {
        default(&mut api.advertise_address, ip.to_string());
    }
    // Encryption at rest (spec.encryptionConfig): the state store's secret, 0600, where the
    // flag says. The default path is inside the read-only `srvkapi` mount, a directory mount, so
    // the API server sees the file's atomic replacements (and reloads them: automatic reload).
    let mut host_paths = vec![
        ("etcssl", "/etc/ssl".into(), false),
        ("etcpkitls", "/etc/pki/tls".into(), false),
        ("etcpkica-trust", "/etc/pki/ca-trust".into(), false),
        ("usrsharessl", "/usr/share/ssl".into(), false),
        ("kubernetesca", paths::CA_CRT.into(), false),
        ("srvkapi", kapi.to_string(), false),
    ];
    let mut extra_flags = Vec::new();
    if api_cfg.encryption_config {
        use base::encryption;
        default(&mut api.encryption_provider_config, keelson_api::host_paths::ENCRYPTION_CONFIG_PATH);
        let path = api.encryption_provider_config.clone().unwrap_or_default();
        let bytes = inp.store.read(encryption::SECRET_PATH)?.ok_or_else(|| ModelError::Missing {
            path: inp.store.url(encryption::SECRET_PATH),
            hint: "spec.encryptionConfig is true: `keelson apply` creates it (with the CAs), or put your own EncryptionConfiguration there (README: encryption at rest)".into(),
        })?;
        let yaml = encryption::from_secret(&bytes)?;
        deps.push(file_task_name(&path));
        tasks.push(Box::new(FileTask::new(&path, yaml, 0o600)));
        if !path.starts_with(&format!("{kapi}/")) {
            host_paths.push(("encryptionconfig", path.clone(), false));
        }
        extra_flags.push("--encryption-provider-config-automatic-reload=true".to_string());
    }
    let secure_port = api.secure_port.unwrap_or(443);
    // Static manifests from the state store (e.g. the API-server health-check sidecar).
    let mut statics = Vec::new();
    for m in &cfg.static_manifests {
        match inp.store.read(&m.path)? {
            Some(bytes) => statics.push((m.key.clone(), bytes)),
            None => warnings.push(format!("static manifest {}: {} is not in the state store; skipped", m.key, inp.store.url(&m.path))),
        }
    }
    // kOps probes the API server through its health-check sidecar (port 3990); without the
    // sidecar there is nothing that answers unauthenticated, so no liveness probe.
    let has_healthcheck = statics.iter().any(|(k, _)| k == "kube-apiserver-healthcheck");
    let pod = manifests::Component {
        name: "kube-apiserver",
        image: api.image.clone().unwrap_or_default(),
        binary: "/usr/local/bin/kube-apiserver".into(),
        flags: {
            let mut flags = crate::flags::build(&api, flag_table::KUBE_APISERVER_CONFIG);
            flags.extend(crate::flags::oidc(&api));
            flags.extend(extra_flags);
            flags.sort();
            flags
        },
        env: api.env.clone().unwrap_or_default(),
        cpu_request: quantity(api.cpu_request.as_ref()).or(Some("150m".into())),
        memory_request: quantity(api.memory_request.as_ref()),
        cpu_limit: quantity(api.cpu_limit.as_ref()),
        memory_limit: quantity(api.memory_limit.as_ref()),
        host_paths,
        ports: vec![("https", secure_port)],
        probe: has_healthcheck.then(|| ("/livez".to_string(), i64::from(keelson_api::ports::KUBE_API_HEALTH), "HTTP")),
        privileged: false,
        priority_class: "system-cluster-critical",
    };
    let body = manifests::render(&pod).map_err(render_err("kube-apiserver manifest"))?;
    let mut t = FileTask::new(&format!("{manifest_dir}/kube-apiserver.manifest"), body, 0o644);
    t.deps = deps.clone();
    tasks.push(Box::new(t));

    for (key, bytes) in statics {
        tasks.push(Box::new(FileTask::new(&format!("{manifest_dir}/{key}.manifest"), bytes, 0o644)));
    }

    if !is_cp {
        return Ok(());
    }
    let cp = cfg.control_plane_config.clone().unwrap_or_default();

    // kube-controller-manager
    let kcm_dir = format!("{}/kube-controller-manager", paths::SRV_KUBERNETES);
    tasks.push(Box::new(KubeconfigTask::local(paths::KCM_KUBECONFIG, ca.clone(), ca_trust, CertSpec::client("system:kube-controller-manager", &[]), ca_dep)));
    let mut kcm = cp.kube_controller_manager.clone();
    default(&mut kcm.root_ca_file, paths::CA_CRT);
    default(&mut kcm.service_account_private_key_file, format!("{kcm_dir}/service-account.key"));
    default(&mut kcm.authentication_kubeconfig, paths::KCM_KUBECONFIG);
    default(&mut kcm.authorization_kubeconfig, paths::KCM_KUBECONFIG);
    // Token mode: the default controllers plus `tokencleaner` (off by default upstream), which
    // deletes expired bootstrap token Secrets. The API server refuses an expired token either way.
    let by_identity = cfg.node_bootstrap.as_ref().is_some_and(|b| b.method == NodeBootstrapMethod::CloudIdentity);
    if !by_identity {
        default(&mut kcm.controllers, vec!["*".to_string(), "tokencleaner".to_string()]);
    }
    let mut flags = crate::flags::build(&kcm, flag_table::KUBE_CONTROLLER_MANAGER_CONFIG);
    flags.extend([
        format!("--kubeconfig={}", paths::KCM_KUBECONFIG),
        format!("--cluster-signing-cert-file={kcm_dir}/ca.crt"),
        format!("--cluster-signing-key-file={kcm_dir}/ca.key"),
    ]);
    flags.sort();
    let pod = manifests::Component {
        name: "kube-controller-manager",
        image: kcm.image.clone().unwrap_or_default(),
        binary: "/usr/local/bin/kube-controller-manager".into(),
        flags,
        env: Vec::new(),
        cpu_request: quantity(kcm.cpu_request.as_ref()).or(Some("100m".into())),
        memory_request: quantity(kcm.memory_request.as_ref()),
        cpu_limit: quantity(kcm.cpu_limit.as_ref()),
        memory_limit: quantity(kcm.memory_limit.as_ref()),
        host_paths: vec![
            ("etcssl", "/etc/ssl".into(), false),
            ("etcpkitls", "/etc/pki/tls".into(), false),
            ("srvkcm", kcm_dir.clone(), false),
            ("kubernetesca", paths::CA_CRT.into(), false),
            ("varlibkcm", "/var/lib/kube-controller-manager".into(), false),
            ("volplugins", "/usr/libexec/kubernetes/kubelet-plugins/volume/exec/".into(), true),
        ],
        ports: vec![],
        probe: Some(("/healthz".into(), i64::from(keelson_api::ports::KUBE_CONTROLLER_MANAGER), "HTTPS")),
        privileged: false,
        priority_class: "system-cluster-critical",
    };
    let body = manifests::render(&pod).map_err(render_err("kube-controller-manager manifest"))?;
    let mut t = FileTask::new(&format!("{manifest_dir}/kube-controller-manager.manifest"), body, 0o644);
    t.deps = deps.clone();
    t.deps.push(format!("kubeconfig:{}", paths::KCM_KUBECONFIG));
    tasks.push(Box::new(t));

    // kube-scheduler
    tasks.push(Box::new(KubeconfigTask::local(paths::SCHEDULER_KUBECONFIG, ca.clone(), ca_trust, CertSpec::client("system:kube-scheduler", &[]), ca_dep)));
    let mut sched = cp.kube_scheduler.clone();
    default(&mut sched.authentication_kubeconfig, paths::SCHEDULER_KUBECONFIG);
    default(&mut sched.authorization_kubeconfig, paths::SCHEDULER_KUBECONFIG);
    let mut flags = crate::flags::build(&sched, flag_table::KUBE_SCHEDULER_CONFIG);
    flags.push(format!("--config={}", paths::SCHEDULER_CONFIG));
    flags.sort();
    let pod = manifests::Component {
        name: "kube-scheduler",
        image: sched.image.clone().unwrap_or_default(),
        binary: "/usr/local/bin/kube-scheduler".into(),
        flags,
        env: Vec::new(),
        cpu_request: quantity(sched.cpu_request.as_ref()).or(Some("100m".into())),
        memory_request: quantity(sched.memory_request.as_ref()),
        cpu_limit: quantity(sched.cpu_limit.as_ref()),
        memory_limit: quantity(sched.memory_limit.as_ref()),
        host_paths: vec![("varlibkubescheduler", "/var/lib/kube-scheduler".into(), false)],
        ports: vec![],
        probe: Some(("/healthz".into(), i64::from(keelson_api::ports::KUBE_SCHEDULER), "HTTPS")),
        privileged: false,
        priority_class: "system-cluster-critical",
    };
    let body = manifests::render(&pod).map_err(render_err("kube-scheduler manifest"))?;
    let mut t = FileTask::new(&format!("{manifest_dir}/kube-scheduler.manifest"), body, 0o644);
    t.deps = vec![format!("kubeconfig:{}", paths::SCHEDULER_KUBECONFIG)];
    tasks.push(Box::new(t));

    // kube-proxy, with a certificate issued here.
    if let Some(proxy) = &cfg.kube_proxy {
        tasks.push(Box::new(KubeconfigTask::local(paths::KUBE_PROXY_KUBECONFIG, ca.clone(), ca_trust, CertSpec::client("system:kube-proxy", &[]), ca_dep)));
        tasks.push(Box::new(kube_proxy(inp, proxy, manifest_dir, "https://127.0.0.1", format!("kubeconfig:{}", paths::KUBE_PROXY_KUBECONFIG))?));
    }
    Ok(())
}

/// kube-proxy's static pod, talking to `master` with the kubeconfig the task `kubeconfig_task` writes.
fn kube_proxy(inp: &Inputs, proxy: &keelson_api::KubeProxyConfig, manifest_dir: &str, master: &str, kubeconfig_task: String) -> Result<FileTask, ModelError> {
    let mut p = proxy.clone();
    default(&mut p.master, master);
    if !inp.facts.hostname.is_empty() {
        default(&mut p.hostname_override, inp.facts.hostname.clone());
    }
    let mut flags = crate::flags::build(&p, flag_table::KUBE_PROXY_CONFIG);
    flags.push(format!("--kubeconfig={}", paths::KUBE_PROXY_KUBECONFIG));
    flags.sort();
    let pod = manifests::Component {
        name: "kube-proxy",
        image: p.image.clone().unwrap_or_default(),
        binary: "/usr/local/bin/kube-proxy".into(),
        flags,
        env: Vec::new(),
        cpu_request: quantity(p.cpu_request.as_ref()),
        memory_request: quantity(p.memory_request.as_ref()),
        cpu_limit: quantity(p.cpu_limit.as_ref()),
        memory_limit: quantity(p.memory_limit.as_ref()),
        host_paths: vec![
            ("kubeconfig", paths::KUBE_PROXY_KUBECONFIG.into(), false),
            ("modules", "/lib/modules".into(), false),
            ("ssl-certs-hosts", "/usr/share/ca-certificates".into(), false),
            ("iptableslock", "/run/xtables.lock".into(), true),
        ],
        ports: vec![],
        probe: None,
        privileged: true,
        priority_class: "system-node-critical",
    };
    let body = manifests::render(&pod).map_err(render_err("kube-proxy manifest"))?;
    let mut t = FileTask::new(&format!("{manifest_dir}/kube-proxy.manifest"), body, 0o644);
    t.deps = vec![kubeconfig_task];
    Ok(t)
}

#[cfg(test)]
mod tests {
    #[test]
    fn first_ips() {
        assert_eq!(super::first_ip("100.64.0.0/13").map(|i| i.to_string()).as_deref(), Some("100.64.0.1"));
        assert_eq!(super::first_ip("fd00::/108").map(|i| i.to_string()).as_deref(), Some("fd00::1"));
    }

    #[test]
    fn the_boot_critical_assets_are_the_kubelets_containerds_and_protokube() {
        let h = "a".repeat(64);
        let critical = |url: &str| super::boot_critical(&crate::assets::Asset::parse(&format!("{h}@{url}")).expect("asset"));
        for url in [
            "https://dl.k8s.io/release/v1.34.4/bin/linux/amd64/kubelet",
            "https://github.com/containerd/containerd/releases/download/v2.1.4/containerd-2.1.4-linux-amd64.tar.gz",
            "https://github.com/opencontainers/runc/releases/download/v1.3.0/runc.amd64",
            "https://artifacts.k8s.io/binaries/kops/1.34.0/linux/amd64/protokube",
        ] {
            assert!(critical(url), "{url} is on the boot's critical path");
        }
        for url in [
            "https://dl.k8s.io/release/v1.34.4/bin/linux/amd64/kubectl",
            "https://github.com/containernetworking/plugins/releases/download/v1.7.1/cni-plugins-linux-amd64-v1.7.1.tgz",
            "https://artifacts.k8s.io/binaries/cloud-provider-aws/v1.31.7/linux/amd64/ecr-credential-provider-linux-amd64",
        ] {
            assert!(!critical(url), "{url} waits for the critical downloads");
        }
    }
}
