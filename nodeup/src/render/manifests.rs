//! Static pod manifests for the control plane (`/etc/kubernetes/manifests/*.manifest`), from a
//! typed subset of the Kubernetes Pod API.

use std::collections::BTreeMap;

use serde::Serialize;

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Pod {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub metadata: Metadata,
    pub spec: PodSpec,
}

#[derive(Debug, Serialize)]
pub struct Metadata {
    pub name: String,
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    pub containers: Vec<Container>,
    pub host_network: bool,
    pub priority_class_name: String,
    pub tolerations: Vec<Toleration>,
    pub volumes: Vec<Volume>,
}

#[derive(Debug, Serialize)]
pub struct Toleration {
    pub key: String,
    pub operator: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Container {
    pub name: String,
    pub image: String,
    pub command: Vec<String>,
    /// `EnvVar`s as the spec gives them (kube-apiserver's `env`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub liveness_probe: Option<Probe>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<Port>,
    pub resources: Resources,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub security_context: Option<SecurityContext>,
    pub volume_mounts: Vec<VolumeMount>,
}

#[derive(Debug, Serialize)]
pub struct SecurityContext {
    pub privileged: bool,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Probe {
    pub http_get: HttpGet,
    pub initial_delay_seconds: i64,
    pub timeout_seconds: i64,
}

#[derive(Debug, Serialize)]
pub struct HttpGet {
    pub host: String,
    pub path: String,
    pub port: i64,
    pub scheme: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Port {
    pub container_port: i64,
    pub host_port: i64,
    pub name: String,
}

#[derive(Debug, Default, Serialize)]
pub struct Resources {
    pub requests: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: BTreeMap<String, String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeMount {
    pub mount_path: String,
    pub name: String,
    pub read_only: bool,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Volume {
    pub host_path: HostPath,
    pub name: String,
}

#[derive(Debug, Serialize)]
pub struct HostPath {
    pub path: String,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
}

/// One control-plane component to run as a static pod.
#[derive(Debug)]
pub struct Component<'a> {
    pub name: &'a str,
    pub image: String,
    /// The binary in the image (`/usr/local/bin/kube-apiserver`).
    pub binary: String,
    pub flags: Vec<String>,
    pub env: Vec<serde_json::Value>,
    pub cpu_request: Option<String>,
    pub memory_request: Option<String>,
    pub cpu_limit: Option<String>,
    pub memory_limit: Option<String>,
    /// `(name, host path, read-write)`
    pub host_paths: Vec<(&'a str, String, bool)>,
    pub ports: Vec<(&'a str, i64)>,
    pub probe: Option<(String, i64, &'a str)>,
    pub privileged: bool,
    pub priority_class: &'a str,
}

/// Host paths that are files shared with other pods, mounted `FileOrCreate` as kOps mounts them:
/// without a type the container runtime creates a missing source as a directory, and every later
/// `FileOrCreate` mount of it (flannel's, Calico's, Cilium's `xtables-lock`) then fails.
const FILE_OR_CREATE: &[&str] = &["/run/xtables.lock"];

/// Render a component as a Pod manifest (YAML), logging to `/var/log/<name>.log` like kOps.
pub fn render(c: &Component) -> Result<String, String> {
    let log = format!("/var/log/{}.log", c.name);
    let mut command = vec!["/go-runner".to_string(), format!("--log-file={log}"), "--also-stdout".into(), c.binary.clone()];
    command.extend(c.flags.iter().cloned());
    let mut volumes = vec![Volume { host_path: HostPath { path: log.clone(), type_: Some("FileOrCreate".into()) }, name: "logfile".into() }];
    let mut mounts = vec![VolumeMount { mount_path: log, name: "logfile".into(), read_only: false }];
    for (name, path, rw) in &c.host_paths {
        let type_ = FILE_OR_CREATE.contains(&path.as_str()).then(|| "FileOrCreate".to_string());
        volumes.push(Volume { host_path: HostPath { path: path.clone(), type_ }, name: name.to_string() });
        mounts.push(VolumeMount { mount_path: path.clone(), name: name.to_string(), read_only: !rw });
    }
    let mut requests = BTreeMap::new();
    if let Some(cpu) = &c.cpu_request {
        requests.insert("cpu".to_string(), cpu.clone());
    }
    if let Some(m) = &c.memory_request {
        requests.insert("memory".to_string(), m.clone());
    }
    let mut limits = BTreeMap::new();
    if let Some(cpu) = &c.cpu_limit {
        limits.insert("cpu".to_string(), cpu.clone());
    }
    if let Some(m) = &c.memory_limit {
        limits.insert("memory".to_string(), m.clone());
    }
    let pod = Pod {
        api_version: "v1",
        kind: "Pod",
        metadata: Metadata {
            name: c.name.into(),
            namespace: "kube-system".into(),
            labels: [("k8s-app".to_string(), c.name.to_string())].into_iter().collect(),
        },
        spec: PodSpec {
            containers: vec![Container {
                name: c.name.into(),
                image: c.image.clone(),
                command,
                env: c.env.clone(),
                liveness_probe: c.probe.as_ref().map(|(path, port, scheme)| Probe {
                    http_get: HttpGet { host: "127.0.0.1".into(), path: path.clone(), port: *port, scheme: scheme.to_string() },
                    initial_delay_seconds: 15,
                    timeout_seconds: 15,
                }),
                ports: c.ports.iter().map(|(n, p)| Port { container_port: *p, host_port: *p, name: n.to_string() }).collect(),
                resources: Resources { requests, limits },
                security_context: c.privileged.then_some(SecurityContext { privileged: true }),
                volume_mounts: mounts,
            }],
            host_network: true,
            priority_class_name: c.priority_class.into(),
            tolerations: vec![Toleration { key: "CriticalAddonsOnly".into(), operator: "Exists".into() }],
            volumes,
        },
    };
    serde_yaml_ng::to_string(&pod).map_err(|e| e.to_string())
}
