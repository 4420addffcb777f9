//! The etcd static pod, rendered from typed structs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::EtcdCluster;
use crate::paths;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pod {
    pub api_version: String,
    pub kind: String,
    pub metadata: Meta,
    pub spec: PodSpec,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    pub name: String,
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    pub host_network: bool,
    pub priority_class_name: String,
    pub tolerations: Vec<BTreeMap<String, String>>,
    pub containers: Vec<Container>,
    pub volumes: Vec<Volume>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Container {
    pub name: String,
    pub image: String,
    pub command: Vec<String>,
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    pub volume_mounts: Vec<VolumeMount>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Resources {
    pub requests: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeMount {
    pub name: String,
    pub mount_path: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Volume {
    pub name: String,
    pub host_path: HostPath,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostPath {
    pub path: String,
    #[serde(rename = "type")]
    pub type_: String,
}

/// Per-volume record of how the member bootstraps (kept on the volume, next to its data).
pub const BOOTSTRAP_FILE: &str = "keelson-etcd-bootstrap.json";

/// etcd's `--initial-cluster-state`: whether the member starts a new cluster or joins one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClusterState {
    New,
    Existing,
}

impl std::fmt::Display for ClusterState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ClusterState::New => "new",
            ClusterState::Existing => "existing",
        })
    }
}

/// How this member starts: the decision is made once per volume and kept on it, so the manifest
/// never flaps between passes (a changed manifest restarts the pod).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bootstrap {
    pub state: ClusterState,
    /// `name=peerURL` pairs, in order.
    pub initial_cluster: Vec<(String, String)>,
}

pub const ETCD_BINARY: &str = "/usr/local/bin/etcd";

/// Render the etcd pod for `member` of `ec` on `volume_id`.
pub fn render(ec: &EtcdCluster, cluster_name: &str, member: &str, volume_id: &str, boot: &Bootstrap) -> Pod {
    let mount = paths::mount_point(volume_id);
    let data_dir = format!("{mount}/data");
    let scheme = ec.scheme();
    let mut args = vec![
        format!("--name={}", ec.member_id(member)),
        format!("--data-dir={data_dir}"),
        format!("--listen-peer-urls={scheme}://0.0.0.0:{}", ec.ports.peer),
        format!("--listen-client-urls={scheme}://0.0.0.0:{}", ec.ports.client),
        format!("--initial-advertise-peer-urls={}", ec.peer_url(member, cluster_name)),
        format!("--advertise-client-urls={}", ec.client_url(member, cluster_name)),
        format!("--initial-cluster={}", boot.initial_cluster.iter().map(|(n, u)| format!("{n}={u}")).collect::<Vec<_>>().join(",")),
        format!("--initial-cluster-state={}", boot.state),
        format!("--initial-cluster-token=keelson-{}-{cluster_name}", ec.name),
    ];
    if let Some(ms) = ec.heartbeat_ms {
        args.push(format!("--heartbeat-interval={ms}"));
    }
    if let Some(ms) = ec.election_ms {
        args.push(format!("--election-timeout={ms}"));
    }
    let mut volume_mounts = vec![VolumeMount { name: "data".into(), mount_path: mount.clone(), read_only: false }];
    let mut volumes = vec![Volume { name: "data".into(), host_path: HostPath { path: mount.clone(), type_: "Directory".into() } }];
    if ec.tls {
        let pki = paths::etcd_pki_dir(&ec.name);
        args.extend([
            format!("--cert-file={pki}/server.crt"),
            format!("--key-file={pki}/server.key"),
            // Clients of this cluster and the API server, never another etcd cluster's.
            format!("--trusted-ca-file={pki}/clients-ca.crt"),
            format!("--client-cert-auth={}", ec.client_cert_auth),
            format!("--peer-cert-file={pki}/peer.crt"),
            format!("--peer-key-file={pki}/peer.key"),
            format!("--peer-trusted-ca-file={pki}/peer-ca.crt"),
            "--peer-client-cert-auth=true".to_string(),
        ]);
        volume_mounts.push(VolumeMount { name: "pki".into(), mount_path: pki.clone(), read_only: true });
        volumes.push(Volume { name: "pki".into(), host_path: HostPath { path: pki, type_: "Directory".into() } });
    }
    let mut requests = BTreeMap::new();
    if let Some(c) = &ec.cpu_request {
        requests.insert("cpu".to_string(), c.clone());
    }
    if let Some(m) = &ec.memory_request {
        requests.insert("memory".to_string(), m.clone());
    }
    let name = format!("etcd-{}", ec.name);
    Pod {
        api_version: "v1".into(),
        kind: "Pod".into(),
        metadata: Meta {
            name: name.clone(),
            namespace: "kube-system".into(),
            labels: BTreeMap::from([("k8s-app".to_string(), name.clone())]),
            annotations: BTreeMap::from([
                ("keelson.io/etcd-member".to_string(), member.to_string()),
                ("keelson.io/etcd-volume".to_string(), volume_id.to_string()),
            ]),
        },
        spec: PodSpec {
            host_network: true,
            priority_class_name: "system-cluster-critical".into(),
            tolerations: vec![BTreeMap::from([("key".to_string(), "CriticalAddonsOnly".to_string()), ("operator".to_string(), "Exists".to_string())])],
            containers: vec![Container {
                name: "etcd".into(),
                image: ec.image.clone(),
                command: vec![ETCD_BINARY.to_string()],
                args,
                resources: if requests.is_empty() { None } else { Some(Resources { requests }) },
                volume_mounts,
            }],
            volumes,
        },
    }
}

pub fn to_yaml(pod: &Pod) -> Result<String, serde_yaml_ng::Error> {
    serde_yaml_ng::to_string(pod)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{EtcdMember, Ports};

    fn ec(tls: bool) -> EtcdCluster {
        EtcdCluster {
            name: "main".into(),
            members: vec![EtcdMember { name: "a".into(), instance_group: "cp-a".into() }],
            ports: Ports { peer: 2380, client: 4001 },
            image: "registry.k8s.io/etcd:3.5.21-0".into(),
            tls,
            client_cert_auth: tls,
            cpu_request: Some("200m".into()),
            memory_request: None,
            heartbeat_ms: None,
            election_ms: None,
            version: "3.5.21".into(),
            backup_store: "file:///b/main".into(),
            backup_interval: std::time::Duration::from_secs(900),
            backup_retention_days: 90,
            backup_hourly_retention: keelson_api::etcd_manager::DEFAULT_HOURLY_RETENTION,
        }
    }

    #[test]
    fn tls_flags_and_mounts() {
        let boot = Bootstrap { state: ClusterState::New, initial_cluster: vec![("etcd-a".into(), "https://etcd-a.internal.c:2380".into())] };
        let pod = render(&ec(true), "c", "a", "vol-1", &boot);
        let c = &pod.spec.containers[0];
        for want in [
            "--listen-client-urls=https://0.0.0.0:4001",
            "--cert-file=/etc/kubernetes/pki/etcd/main/server.crt",
            "--peer-trusted-ca-file=/etc/kubernetes/pki/etcd/main/peer-ca.crt",
            "--trusted-ca-file=/etc/kubernetes/pki/etcd/main/clients-ca.crt",
            "--client-cert-auth=true",
            "--peer-client-cert-auth=true",
            "--data-dir=/mnt/master-vol-1/data",
        ] {
            assert!(c.args.iter().any(|a| a == want), "missing {want}: {:?}", c.args);
        }
        assert_eq!(pod.spec.volumes.len(), 2);
        let yaml = to_yaml(&pod).expect("yaml");
        let back: Pod = serde_yaml_ng::from_str(&yaml).expect("round trip");
        assert_eq!(back, pod);
        let plain = render(&ec(false), "c", "a", "vol-1", &boot);
        assert!(!plain.spec.containers[0].args.iter().any(|a| a.contains("cert")));
    }

    #[test]
    fn bootstrap_file_keeps_its_json() {
        for (state, word) in [(ClusterState::New, "new"), (ClusterState::Existing, "existing")] {
            let boot = Bootstrap { state, initial_cluster: vec![("etcd-a".into(), "https://a:2380".into())] };
            let text = serde_json::to_string(&boot).expect("json");
            assert_eq!(text, format!(r#"{{"state":"{word}","initial_cluster":[["etcd-a","https://a:2380"]]}}"#));
            assert_eq!(serde_json::from_str::<Bootstrap>(&text).expect("back"), boot);
            assert_eq!(state.to_string(), word);
        }
    }
}
