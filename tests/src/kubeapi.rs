//! The local cluster's Kubernetes API, through kube-rs with the admin kubeconfig: readiness of the
//! API servers (each control plane, the internal name, the local load balancer), Nodes, the
//! control-plane static pods, what the addon controller recorded and the objects selfheal counts.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{Api, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

#[derive(Debug, thiserror::Error)]
pub enum KubeApiError {
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        path: String,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("{what}: timed out after {secs} s")]
    Timeout { what: String, secs: u64 },
    #[error("{0}")]
    Manifest(String),
    #[error("async runtime: {0}")]
    Runtime(#[from] std::io::Error),
}

/// Where to reach an API server: the kubeconfig's server, another URL, and the TLS name to verify.
#[derive(Debug, Clone, Default)]
pub struct Target {
    pub server: Option<String>,
    pub tls_server_name: Option<String>,
}

fn rt() -> Result<tokio::runtime::Runtime, KubeApiError> {
    Ok(tokio::runtime::Builder::new_current_thread().enable_all().build()?)
}

async fn client(kubeconfig: &Path, target: &Target) -> Result<Client, KubeApiError> {
    let kerr = |source| KubeApiError::Kubeconfig { path: kubeconfig.display().to_string(), source };
    let kc = Kubeconfig::read_from(kubeconfig).map_err(kerr)?;
    let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await.map_err(kerr)?;
    if let Some(s) = &target.server {
        config.cluster_url = s.parse().map_err(|e| KubeApiError::Manifest(format!("server {s}: {e}")))?;
    }
    if let Some(n) = &target.tls_server_name {
        config.tls_server_name = Some(n.clone());
    }
    config.connect_timeout = Some(Duration::from_secs(3));
    config.read_timeout = Some(Duration::from_secs(15));
    Client::try_from(config).map_err(|source| KubeApiError::Api { what: "building the client".into(), source })
}

fn api_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> KubeApiError {
    let what = what.into();
    move |source| KubeApiError::Api { what, source }
}

/// `GET /readyz` through `target`: the body (`ok`) or the error.
pub fn readyz(kubeconfig: &Path, target: &Target) -> Result<String, KubeApiError> {
    readyz_within(kubeconfig, target, Duration::from_secs(10))
}

/// [`readyz`], answered within `limit` or a timeout error.
pub fn readyz_within(kubeconfig: &Path, target: &Target, limit: Duration) -> Result<String, KubeApiError> {
    rt()?.block_on(async {
        let c = client(kubeconfig, target).await?;
        let req = http::Request::get("/readyz").body(Vec::new()).map_err(|e| KubeApiError::Manifest(e.to_string()))?;
        let fut = c.request_text(req);
        match tokio::time::timeout(limit, fut).await {
            Ok(r) => r.map_err(api_err(format!("GET /readyz via {:?}", target.server))),
            Err(_) => Err(KubeApiError::Timeout { what: format!("GET /readyz via {:?}", target.server), secs: limit.as_secs() }),
        }
    })
}

/// A leader-election Lease: its holder, and its renew and acquire times (unix milliseconds).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseState {
    pub holder: String,
    pub renewed_ms: Option<i64>,
    pub acquired_ms: Option<i64>,
    pub duration_s: Option<i32>,
}

/// The Leases `names` in `namespace` (a missing one is left out).
pub fn leases(kubeconfig: &Path, namespace: &str, names: &[&str]) -> Result<BTreeMap<String, LeaseState>, KubeApiError> {
    rt()?.block_on(async {
        let api: Api<Lease> = Api::namespaced(client(kubeconfig, &Target::default()).await?, namespace);
        let mut out = BTreeMap::new();
        for name in names {
            let Some(l) = api.get_opt(name).await.map_err(api_err(format!("get Lease {namespace}/{name}")))? else { continue };
            let spec = l.spec.unwrap_or_default();
            out.insert(
                name.to_string(),
                LeaseState {
                    holder: spec.holder_identity.unwrap_or_default(),
                    renewed_ms: spec.renew_time.map(|t| t.0.as_millisecond()),
                    acquired_ms: spec.acquire_time.map(|t| t.0.as_millisecond()),
                    duration_s: spec.lease_duration_seconds,
                },
            );
        }
        Ok(out)
    })
}

/// A Node as the local cloud checks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeState {
    pub ready: bool,
    pub internal_ip: Option<String>,
    /// `spec.providerID` (set by the cloud-controller-manager: `aws:///<zone>/<instance-id>`).
    pub provider_id: Option<String>,
    /// `spec.podCIDR`.
    pub pod_cidr: Option<String>,
    /// `key:effect` of every taint.
    pub taints: Vec<String>,
    pub labels: BTreeMap<String, String>,
    /// The field managers that own `spec.providerID` (`kubelet` when the kubelet registered the
    /// Node with it).
    pub provider_id_managers: Vec<String>,
    /// `status.nodeInfo.kubeletVersion`.
    pub kubelet_version: String,
    /// `status.nodeInfo.osImage`: the kubelet's reading of the host's os-release (`PRETTY_NAME`).
    pub os_image: String,
    /// When the Ready condition last changed (unix seconds).
    pub ready_since: Option<i64>,
    /// When the kubelet last posted the Ready condition (its `lastHeartbeatTime`, unix seconds).
    pub ready_heartbeat: Option<i64>,
    /// The Ready condition's `reason: message` (why a Node is not Ready).
    pub ready_reason: String,
}

/// Node name → state.
pub fn nodes(kubeconfig: &Path) -> Result<BTreeMap<String, NodeState>, KubeApiError> {
    rt()?.block_on(async {
        let c = client(kubeconfig, &Target::default()).await?;
        let list = Api::<Node>::all(c).list(&ListParams::default()).await.map_err(api_err("listing nodes"))?;
        Ok(list
            .items
            .into_iter()
            .map(|n| {
                let provider_id_managers = n
                    .metadata
                    .managed_fields
                    .iter()
                    .flatten()
                    .filter(|f| f.fields_v1.as_ref().is_some_and(|v| v.0.get("f:spec").and_then(|s| s.get("f:providerID")).is_some()))
                    .filter_map(|f| f.manager.clone())
                    .collect();
                let status = n.status.unwrap_or_default();
                let kubelet_version = status.node_info.as_ref().map(|i| i.kubelet_version.clone()).unwrap_or_default();
                let os_image = status.node_info.as_ref().map(|i| i.os_image.clone()).unwrap_or_default();
                let conditions = status.conditions.unwrap_or_default();
                let ready_condition = conditions.iter().find(|c| c.type_ == "Ready");
                let ready = ready_condition.is_some_and(|c| c.status == "True");
                let ready_since = ready_condition.and_then(|c| c.last_transition_time.as_ref()).map(|t| t.0.as_second());
                let ready_heartbeat = ready_condition.and_then(|c| c.last_heartbeat_time.as_ref()).map(|t| t.0.as_second());
                let ready_reason = ready_condition
                    .map(|c| format!("{}: {}", c.reason.as_deref().unwrap_or_default(), c.message.as_deref().unwrap_or_default()))
                    .unwrap_or_else(|| "no Ready condition".into());
                let internal_ip = status.addresses.unwrap_or_default().into_iter().find(|a| a.type_ == "InternalIP").map(|a| a.address);
                let spec = n.spec.unwrap_or_default();
                let taints = spec.taints.unwrap_or_default().into_iter().map(|t| format!("{}:{}", t.key, t.effect)).collect();
                let state = NodeState {
                    ready,
                    internal_ip,
                    provider_id: spec.provider_id,
                    pod_cidr: spec.pod_cidr,
                    taints,
                    labels: n.metadata.labels.unwrap_or_default(),
                    provider_id_managers,
                    kubelet_version,
                    os_image,
                    ready_since,
                    ready_heartbeat,
                    ready_reason,
                };
                (n.metadata.name.unwrap_or_default(), state)
            })
            .collect())
    })
}

/// kube-system pods: name → (node, running with every container ready).
pub fn system_pods(kubeconfig: &Path) -> Result<BTreeMap<String, (String, bool)>, KubeApiError> {
    rt()?.block_on(async {
        let c = client(kubeconfig, &Target::default()).await?;
        let list = Api::<Pod>::namespaced(c, "kube-system").list(&ListParams::default()).await.map_err(api_err("listing kube-system pods"))?;
        Ok(list
            .items
            .into_iter()
            .map(|p| {
                let node = p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
                let status = p.status.unwrap_or_default();
                let running = status.phase.as_deref() == Some("Running");
                let ready = status.container_statuses.unwrap_or_default().iter().all(|c| c.ready);
                (p.metadata.name.unwrap_or_default(), (node, running && ready))
            })
            .collect())
    })
}

/// The data of a ConfigMap (`None` when it does not exist).
pub fn configmap_data(kubeconfig: &Path, namespace: &str, name: &str) -> Result<Option<BTreeMap<String, String>>, KubeApiError> {
    rt()?.block_on(async {
        let c = client(kubeconfig, &Target::default()).await?;
        let api = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(c, namespace);
        let cm = api.get_opt(name).await.map_err(api_err(format!("get configmap {namespace}/{name}")))?;
        Ok(cm.map(|c| c.data.unwrap_or_default()))
    })
}

/// [`configmap_data`] from `target` (one API server rather than the load balancer), waiting at
/// most 10 s.
pub fn configmap_data_via(kubeconfig: &Path, target: &Target, namespace: &str, name: &str) -> Result<Option<BTreeMap<String, String>>, KubeApiError> {
    rt()?.block_on(async {
        let c = client(kubeconfig, target).await?;
        let api = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(c, namespace);
        match tokio::time::timeout(Duration::from_secs(10), api.get_opt(name)).await {
            Ok(r) => r.map(|cm| cm.map(|c| c.data.unwrap_or_default())).map_err(api_err(format!("get configmap {namespace}/{name}"))),
            Err(_) => Err(KubeApiError::Timeout { what: format!("get configmap {namespace}/{name}"), secs: 10 }),
        }
    })
}

/// The names of the ClusterRoleBindings.
pub fn cluster_role_bindings(kubeconfig: &Path) -> Result<Vec<String>, KubeApiError> {
    rt()?.block_on(async {
        let c = client(kubeconfig, &Target::default()).await?;
        let list = Api::<ClusterRoleBinding>::all(c).list(&Default::default()).await.map_err(api_err("list ClusterRoleBindings"))?;
        Ok(list.items.into_iter().filter_map(|b| b.metadata.name).collect())
    })
}

/// Create `n` ConfigMaps `<prefix>-<i>` in `namespace` (data `i: <i>`), one after the other.
/// Existing ones are left as they are.
pub fn create_configmaps(kubeconfig: &Path, namespace: &str, prefix: &str, n: u64) -> Result<(), KubeApiError> {
    rt()?.block_on(async {
        let c = client(kubeconfig, &Target::default()).await?;
        let api = Api::<ConfigMap>::namespaced(c, namespace);
        let pp = PostParams::default();
        for i in 0..n {
            let cm = ConfigMap {
                metadata: kube::api::ObjectMeta { name: Some(format!("{prefix}-{i}")), ..Default::default() },
                data: Some(BTreeMap::from([("i".to_string(), i.to_string())])),
                ..Default::default()
            };
            match api.create(&pp, &cm).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(api_err(format!("creating ConfigMap {prefix}-{i}"))(e)),
            }
        }
        Ok(())
    })
}

/// How many ConfigMaps `<prefix>-<i>` (i < n) in `namespace` hold their own index: a consistent
/// (quorum) list, so what is counted is what etcd has.
pub fn count_configmaps(kubeconfig: &Path, namespace: &str, prefix: &str, n: u64) -> Result<u64, KubeApiError> {
    rt()?.block_on(async {
        let c = client(kubeconfig, &Target::default()).await?;
        let api = Api::<ConfigMap>::namespaced(c, namespace);
        let list = api.list(&ListParams::default()).await.map_err(api_err("listing ConfigMaps"))?;
        let want = format!("{prefix}-");
        Ok(list
            .items
            .iter()
            .filter(|cm| {
                let name = cm.metadata.name.as_deref().unwrap_or_default();
                let idx = name.strip_prefix(&want).and_then(|x| x.parse::<u64>().ok());
                idx.is_some_and(|i| i < n && cm.data.as_ref().and_then(|d| d.get("i")) == Some(&i.to_string()))
            })
            .count() as u64)
    })
}

/// Write one ConfigMap (create, or replace its data) through a new connection, as a client
/// that writes once a second would: the probe of writes during a rolling update.
pub fn write_configmap(kubeconfig: &Path, namespace: &str, name: &str, data: BTreeMap<String, String>) -> Result<(), KubeApiError> {
    write_configmap_via(kubeconfig, &Target::default(), namespace, name, data)
}

/// [`write_configmap`] through `target` (one API server rather than the load balancer).
pub fn write_configmap_via(kubeconfig: &Path, target: &Target, namespace: &str, name: &str, data: BTreeMap<String, String>) -> Result<(), KubeApiError> {
    rt()?.block_on(async {
        let c = client(kubeconfig, target).await?;
        let api = Api::<ConfigMap>::namespaced(c, namespace);
        let cm = ConfigMap { metadata: kube::api::ObjectMeta { name: Some(name.to_string()), ..Default::default() }, data: Some(data), ..Default::default() };
        let pp = kube::api::PatchParams::apply("keelson-local-probe").force();
        let patch = kube::api::Patch::Apply(&cm);
        let fut = api.patch(name, &pp, &patch);
        match tokio::time::timeout(Duration::from_secs(10), fut).await {
            Ok(r) => r.map(|_| ()).map_err(api_err(format!("writing ConfigMap {namespace}/{name}"))),
            Err(_) => Err(KubeApiError::Timeout { what: format!("writing ConfigMap {namespace}/{name}"), secs: 10 }),
        }
    })
}

/// `status.readyReplicas` of a Deployment (0 when unset).
pub fn deployment_ready(kubeconfig: &Path, namespace: &str, name: &str) -> Result<i32, KubeApiError> {
    rt()?.block_on(async {
        let c = client(kubeconfig, &Target::default()).await?;
        let api = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(c, namespace);
        let d = api.get(name).await.map_err(api_err(format!("get deployment {namespace}/{name}")))?;
        Ok(d.status.and_then(|s| s.ready_replicas).unwrap_or(0))
    })
}

/// The version an API server reports (`GET /version` `gitVersion`) through `target`.
pub fn server_version(kubeconfig: &Path, target: &Target) -> Result<String, KubeApiError> {
    rt()?.block_on(async {
        let c = client(kubeconfig, target).await?;
        let v = c.apiserver_version().await.map_err(api_err(format!("GET /version via {:?}", target.server)))?;
        Ok(v.git_version)
    })
}

/// An APIService as the local cloud checks it: its `Available` condition and when it was created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiServiceState {
    /// `Available` is `True`.
    pub available: bool,
    /// The `Available` condition as `status reason: message` (for failure messages).
    pub condition: String,
    /// `metadata.creationTimestamp`, Unix seconds.
    pub created_unix: Option<i64>,
    /// When the `Available` condition last changed, Unix seconds.
    pub available_since_unix: Option<i64>,
}

/// The APIService `name`, or `None` when there is none.
pub fn api_service(kubeconfig: &Path, name: &str) -> Result<Option<ApiServiceState>, KubeApiError> {
    use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
    rt()?.block_on(async {
        let c = client(kubeconfig, &Target::default()).await?;
        let Some(s) = Api::<APIService>::all(c).get_opt(name).await.map_err(api_err(format!("get apiservice {name}")))? else { return Ok(None) };
        let cond = s.status.and_then(|st| st.conditions).unwrap_or_default().into_iter().find(|c| c.type_ == "Available");
        Ok(Some(ApiServiceState {
            available: cond.as_ref().is_some_and(|c| c.status == "True"),
            available_since_unix: cond.as_ref().and_then(|c| c.last_transition_time.as_ref()).map(|t| t.0.as_second()),
            condition: cond
                .map(|c| format!("{} {}: {}", c.status, c.reason.unwrap_or_default(), c.message.unwrap_or_default()))
                .unwrap_or_else(|| "no Available condition".into()),
            created_unix: s.metadata.creation_timestamp.map(|t| t.0.as_second()),
        }))
    })
}

/// Node usage from the resource metrics API (`GET /apis/metrics.k8s.io/v1beta1/nodes`): node name →
/// (cpu, memory) as metrics-server reports them.
pub fn node_metrics(kubeconfig: &Path) -> Result<BTreeMap<String, (String, String)>, KubeApiError> {
    const PATH: &str = "/apis/metrics.k8s.io/v1beta1/nodes";
    rt()?.block_on(async {
        let c = client(kubeconfig, &Target::default()).await?;
        let req = http::Request::get(PATH).body(Vec::new()).map_err(|e| KubeApiError::Manifest(e.to_string()))?;
        let text = c.request_text(req).await.map_err(api_err(format!("GET {PATH}")))?;
        let list: serde_json::Value = serde_json::from_str(&text).map_err(|e| KubeApiError::Manifest(format!("GET {PATH}: {e}: {text}")))?;
        let field = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
        Ok(list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|n| (field(&n["metadata"]["name"]), (field(&n["usage"]["cpu"]), field(&n["usage"]["memory"]))))
            .collect())
    })
}
