//! protokube's own document: what one control-plane group's protokube must do, derived once by the
//! compiler from the completed spec (`spec_compiler::protokube_config::build`) and written to the
//! state store at [`state_key`] (`igconfig/control-plane/<group>/protokube.yaml`), beside the
//! group's `nodeupconfig.yaml`. protokube reads this and nothing else of the spec: every fact below
//! (etcd clusters, members, versions, images, TLS, ports, DNS, backups, the static-pod directory,
//! the API server's port, how workers join) has one derivation, in the compiler.
//!
//! [`ProtokubeConfig::parse`] is the only way in: a field of the wrong shape, or a value no
//! protokube can act on, is refused with the field's path. Fields this version does not know are
//! ignored, so an older protokube keeps reading the file a newer compiler writes while a rolling
//! update replaces it.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::nodeup::NodeBootstrapMethod;
use crate::ports::EtcdPorts;
use crate::{names, Role};

/// `apiVersion` of the document.
pub const API_VERSION: &str = "keelson.io/v1alpha1";
/// `kind` of the document.
pub const KIND: &str = "ProtokubeConfig";
/// The file's name in the group's state-store directory.
pub const FILE_NAME: &str = "protokube.yaml";

/// Where a control-plane group's protokube config lives in the state store:
/// `igconfig/control-plane/<group>/protokube.yaml`.
pub fn state_key(group: &str) -> String {
    format!("{}{group}/{FILE_NAME}", state_prefix())
}

/// Where every control-plane group's directory is in the state store: `igconfig/control-plane/`.
pub fn state_prefix() -> String {
    format!("igconfig/{}/", Role::ControlPlane.state_dir())
}

/// What the protokube of one control-plane group does (the compiler's plan for it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProtokubeConfig {
    /// [`API_VERSION`].
    pub api_version: String,
    /// [`KIND`].
    pub kind: String,
    pub cluster_name: String,
    /// The control-plane group this file is for (the BootConfig's `InstanceGroupName`).
    pub instance_group: String,
    /// Every etcd cluster with every member (DNS and membership need the peers too).
    pub etcd_clusters: Vec<EtcdCluster>,
    pub dns: DnsMode,
    /// `api.<cluster>` is protokube's to keep (no load balancer in front of the API).
    pub manage_public_api: bool,
    /// `api.internal.<cluster>` is protokube's to keep (not an alias to the load balancer, which
    /// `loadBalancer.useForInternalApi` makes it; the hosts file always carries it).
    pub manage_internal_api: bool,
    /// A load balancer fronts the API servers (protokube keeps this instance in its target group
    /// while the local API server is ready).
    pub api_load_balancer: bool,
    /// Where the kubelet of this control plane reads static pods: etcd's manifests go there.
    pub static_pod_dir: String,
    /// The local API server's secure port.
    pub api_server_port: u16,
    /// How workers join (token mode: protokube rotates bootstrap tokens and approves first CSRs).
    pub node_bootstrap: NodeBootstrapMethod,
    /// Whether the kubelet reloads its serving certificate from disk (else a renewal restarts it).
    pub kubelet_reloads_serving_cert: bool,
    /// The pod network (`podCIDR`, else `nonMasqueradeCIDR`): the join server keeps a share of its
    /// capacity for the instances' own addresses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_network: Option<ipnet::IpNet>,
}

/// An etcd member and the instance group it runs on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdMember {
    pub name: String,
    pub instance_group: String,
}

/// One etcd cluster as protokube runs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdCluster {
    pub name: String,
    pub members: Vec<EtcdMember>,
    /// Its well-known ports ([`crate::ports::etcd_ports`]).
    #[serde(with = "PortsDef")]
    pub ports: EtcdPorts,
    /// The etcd image, rewritten for the spec's registry mirror or proxy.
    pub image: String,
    /// etcd version without the `v` (`3.5.21`).
    pub version: String,
    /// Peers and clients speak TLS.
    pub tls: bool,
    /// Clients must present a certificate.
    pub client_cert_auth: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_request: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_request: Option<String>,
    #[serde(rename = "heartbeatIntervalMs", default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_ms: Option<i64>,
    #[serde(rename = "electionTimeoutMs", default, skip_serializing_if = "Option::is_none")]
    pub election_ms: Option<i64>,
    /// Where this etcd cluster's backups go (a state-store URL).
    pub backup_store: String,
    /// Between two backups (written as a Go duration: `15m0s`).
    #[serde(with = "go_duration")]
    pub backup_interval: Duration,
    /// Days of daily backups kept.
    pub backup_retention_days: u64,
    /// How long every hourly backup is kept (written only when not etcd-manager's default).
    #[serde(with = "go_duration", default = "default_hourly_retention", skip_serializing_if = "is_default_hourly_retention")]
    pub backup_hourly_retention: Duration,
}

fn default_hourly_retention() -> Duration {
    crate::etcd_manager::DEFAULT_HOURLY_RETENTION
}

fn is_default_hourly_retention(d: &Duration) -> bool {
    *d == crate::etcd_manager::DEFAULT_HOURLY_RETENTION
}

/// The wire form of [`EtcdPorts`] (one type, defined with the port table).
#[derive(Serialize, Deserialize)]
#[serde(remote = "EtcdPorts", rename_all = "camelCase")]
struct PortsDef {
    peer: u16,
    client: u16,
}

/// How the cluster's own names (`api.internal`, `kops-controller.internal`, the etcd members) are
/// kept ([`crate::plan::cluster_dns`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum DnsMode {
    /// The guarded block in the hosts file.
    Hosts,
    /// Records in the cluster's hosted zone (Route53 or Cloud DNS): `zone` is the spec's `dnsZone`
    /// (id or name), or `None` to find it by the cluster name; `private` when
    /// `topology.dns.type: Private` (preferred when a name has both kinds of zone).
    #[serde(rename_all = "camelCase")]
    Zone {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        zone: Option<String>,
        private: bool,
    },
}

mod go_duration {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(d: &std::time::Duration, s: S) -> Result<S::Ok, S::Error> {
        crate::Duration::from_nanos(d.as_nanos()).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<std::time::Duration, D::Error> {
        let go = crate::Duration::deserialize(d)?;
        u64::try_from(go.as_nanos()).map(std::time::Duration::from_nanos).map_err(|_| serde::de::Error::custom(format!("{go}: must not be negative")))
    }
}

/// Why a protokube config was refused; `field` is the path inside the document.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ProtokubeConfigError {
    pub field: String,
    pub message: String,
}

fn refuse(field: impl Into<String>, message: impl Into<String>) -> ProtokubeConfigError {
    ProtokubeConfigError { field: field.into(), message: message.into() }
}

impl ProtokubeConfig {
    /// Parse and check a document; errors name the field.
    pub fn parse(bytes: &[u8]) -> Result<ProtokubeConfig, ProtokubeConfigError> {
        let de = serde_yaml_ng::Deserializer::from_slice(bytes);
        let config: ProtokubeConfig = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let message = e.into_inner().to_string();
            // serde_yaml_ng puts its own idea of the path in front; the field is reported once.
            let message = message.strip_prefix(&format!("{path}: ")).map(str::to_string).unwrap_or(message);
            refuse(if path == "." { "(document)".to_string() } else { path }, message)
        })?;
        config.check()?;
        Ok(config)
    }

    /// Refuse what no protokube can act on: another document, a missing name, an etcd cluster
    /// without members, image, version, ports or backup store, a relative static-pod directory.
    pub fn check(&self) -> Result<(), ProtokubeConfigError> {
        if self.api_version != API_VERSION {
            return Err(refuse("apiVersion", format!("{:?}: expected {API_VERSION:?}", self.api_version)));
        }
        if self.kind != KIND {
            return Err(refuse("kind", format!("{:?}: expected {KIND:?}", self.kind)));
        }
        for (field, value) in [("clusterName", &self.cluster_name), ("instanceGroup", &self.instance_group)] {
            if value.is_empty() {
                return Err(refuse(field, "must not be empty"));
            }
        }
        if !self.static_pod_dir.starts_with('/') {
            return Err(refuse("staticPodDir", format!("{:?}: must be an absolute path", self.static_pod_dir)));
        }
        if self.api_server_port == 0 {
            return Err(refuse("apiServerPort", "must not be 0"));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, ec) in self.etcd_clusters.iter().enumerate() {
            let at = format!("etcdClusters[{i}]");
            if ec.name.is_empty() {
                return Err(refuse(format!("{at}.name"), "must not be empty"));
            }
            if !seen.insert(ec.name.as_str()) {
                return Err(refuse(format!("{at}.name"), format!("{:?} twice", ec.name)));
            }
            if ec.members.is_empty() {
                return Err(refuse(format!("{at}.members"), "at least one member is required"));
            }
            for (j, m) in ec.members.iter().enumerate() {
                for (field, value) in [("name", &m.name), ("instanceGroup", &m.instance_group)] {
                    if value.is_empty() {
                        return Err(refuse(format!("{at}.members[{j}].{field}"), "must not be empty"));
                    }
                }
            }
            for (field, value) in [("image", &ec.image), ("version", &ec.version), ("backupStore", &ec.backup_store)] {
                if value.is_empty() {
                    return Err(refuse(format!("{at}.{field}"), "must not be empty"));
                }
            }
            if ec.ports.peer == 0 || ec.ports.client == 0 || ec.ports.peer == ec.ports.client {
                return Err(refuse(format!("{at}.ports"), format!("peer {} and client {}: two different ports, neither 0", ec.ports.peer, ec.ports.client)));
            }
            if ec.backup_interval.is_zero() {
                return Err(refuse(format!("{at}.backupInterval"), "must be positive"));
            }
        }
        Ok(())
    }

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

    /// The local API server (`https://127.0.0.1:<apiServerPort>`).
    pub fn local_api_server(&self) -> String {
        format!("https://127.0.0.1:{}", self.api_server_port)
    }

    /// Members of `cluster` bound to this group, in name order.
    pub fn my_members<'a>(&self, cluster: &'a EtcdCluster) -> Vec<&'a EtcdMember> {
        let mut v: Vec<&EtcdMember> = cluster.members.iter().filter(|m| m.instance_group == self.instance_group).collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "apiVersion: keelson.io/v1alpha1
kind: ProtokubeConfig
clusterName: x.example.com
instanceGroup: cp-a
etcdClusters:
- name: main
  members:
  - name: a
    instanceGroup: cp-a
  - name: b
    instanceGroup: cp-b
  ports:
    peer: 2380
    client: 4001
  image: registry.k8s.io/etcd:v3.6.12
  version: 3.6.12
  tls: true
  clientCertAuth: true
  heartbeatIntervalMs: 250
  backupStore: s3://b/x.example.com/backups/etcd/main
  backupInterval: 15m0s
  backupRetentionDays: 90
dns:
  type: zone
  zone: example.com
  private: false
managePublicApi: false
manageInternalApi: true
apiLoadBalancer: true
staticPodDir: /etc/kubernetes/manifests
apiServerPort: 443
nodeBootstrap: CloudIdentity
kubeletReloadsServingCert: true
podNetwork: 100.96.0.0/11
";

    #[test]
    fn a_config_round_trips_and_answers_for_its_group() {
        let c = ProtokubeConfig::parse(GOOD.as_bytes()).expect("parse");
        assert_eq!(serde_yaml_ng::to_string(&c).expect("yaml"), GOOD, "parse∘print = id");
        let main = &c.etcd_clusters[0];
        assert_eq!(main.backup_interval, Duration::from_secs(900));
        assert_eq!(c.dns, DnsMode::Zone { zone: Some("example.com".into()), private: false });
        assert_eq!(c.my_members(main).iter().map(|m| m.name.as_str()).collect::<Vec<_>>(), ["a"]);
        assert_eq!(main.peer_url("b", &c.cluster_name), "https://etcd-b.internal.x.example.com:2380");
        assert_eq!(c.local_api_server(), "https://127.0.0.1:443");
        assert_eq!(state_key("cp-a"), "igconfig/control-plane/cp-a/protokube.yaml");
        let hosts = GOOD.replace("  type: zone\n  zone: example.com\n  private: false\n", "  type: hosts\n");
        assert_eq!(ProtokubeConfig::parse(hosts.as_bytes()).expect("parse").dns, DnsMode::Hosts);
    }

    #[test]
    fn bad_documents_are_refused_by_field() {
        let cases = [
            ("kind: ProtokubeConfig", "kind: NodeupConfig", "kind"),
            ("apiVersion: keelson.io/v1alpha1", "apiVersion: keelson.io/v9", "apiVersion"),
            ("clusterName: x.example.com", "clusterName: ''", "clusterName"),
            ("  backupInterval: 15m0s", "  backupInterval: 0s", "etcdClusters[0].backupInterval"),
            ("  backupInterval: 15m0s", "  backupInterval: -1m", "etcdClusters[0].backupInterval"),
            ("  backupInterval: 15m0s", "  backupInterval: soon", "etcdClusters[0].backupInterval"),
            ("    client: 4001", "    client: 2380", "etcdClusters[0].ports"),
            ("    client: 4001", "    client: 70000", "etcdClusters[0].ports.client"),
            ("  image: registry.k8s.io/etcd:v3.6.12", "  image: ''", "etcdClusters[0].image"),
            ("  - name: b\n", "  - name: ''\n", "etcdClusters[0].members[1].name"),
            ("staticPodDir: /etc/kubernetes/manifests", "staticPodDir: manifests", "staticPodDir"),
            ("podNetwork: 100.96.0.0/11", "podNetwork: 100.96.0.0/99", "podNetwork"),
            ("nodeBootstrap: CloudIdentity", "nodeBootstrap: Password", "nodeBootstrap"),
            ("  type: zone\n", "  type: carrier-pigeon\n", "dns.type"),
            ("apiServerPort: 443\n", "", "(document)"),
        ];
        for (from, to, field) in cases {
            assert!(GOOD.contains(from), "{from}");
            let e = ProtokubeConfig::parse(GOOD.replacen(from, to, 1).as_bytes()).expect_err(to);
            assert_eq!(e.field, field, "{to}: {e}");
        }
        let e = ProtokubeConfig::parse(GOOD.replace("  type: zone", "  type: carrier-pigeon").as_bytes()).expect_err("dns");
        assert!(e.to_string().starts_with("dns.type: unknown variant `carrier-pigeon`"), "the field once: {e}");
        let e = ProtokubeConfig::parse(b"- a list\n").expect_err("not a map");
        assert_eq!(e.field, "(document)");
        let twice = GOOD.replace("dns:\n", "- name: main\n  members: [{name: a, instanceGroup: cp-a}]\n  ports: {peer: 2380, client: 4001}\n  image: i\n  version: v\n  tls: true\n  clientCertAuth: true\n  backupStore: s\n  backupInterval: 1m\n  backupRetentionDays: 1\ndns:\n");
        assert_eq!(ProtokubeConfig::parse(twice.as_bytes()).expect_err("twice").field, "etcdClusters[1].name");
    }
}
