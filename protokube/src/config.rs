//! What protokube must do: the BootConfig (which cluster, state store and group this instance is)
//! and the group's protokube config, the compiler's plan for it
//! ([`keelson_api::protokube::ProtokubeConfig`], at [`keelson_api::protokube::state_key`]).
//! protokube derives nothing from the cluster spec itself.

use std::path::{Path, PathBuf};

use keelson_api::names;
use keelson_api::nodeup::BootConfig;

pub use keelson_api::protokube::{DnsMode, EtcdCluster, EtcdMember};

/// The plan protokube follows: the compiler's [`keelson_api::protokube::ProtokubeConfig`] for this
/// instance's group.
pub type Plan = keelson_api::protokube::ProtokubeConfig;

/// Well-known ports of an etcd cluster (kOps' assignments, one table in [`keelson_api::ports`]).
pub type Ports = keelson_api::ports::EtcdPorts;

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
    /// A state store written by a keelson from before protokube had its own config.
    #[error("{url} does not exist: this state store was written by an older keelson, which gave protokube no config of its own. Run `keelson apply -f SPEC --yes` (or `keelson reconcile cluster -f SPEC --yes`) with this keelson to write it; protokube starts once it is there (systemd restarts it)")]
    Missing { url: String },
    #[error("{url}: {source}")]
    Invalid {
        url: String,
        #[source]
        source: keelson_api::protokube::ProtokubeConfigError,
    },
    #[error("{url}: {field}: {message}")]
    Mismatch { url: String, field: &'static str, message: String },
}

pub fn read_boot_config(path: &Path) -> Result<BootConfig, ConfigError> {
    let bytes = std::fs::read(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
    serde_yaml_ng::from_slice(&bytes).map_err(|e| ConfigError::Parse { path: path.display().to_string(), message: e.to_string() })
}

/// Read and check this group's protokube config: it must parse, pass
/// [`keelson_api::protokube::ProtokubeConfig::check`], and be for the BootConfig's cluster and group.
pub async fn read_plan(store: &base::StateStore, boot: &BootConfig) -> Result<Plan, ConfigError> {
    let rel = keelson_api::protokube::state_key(&boot.instance_group_name);
    let url = store.url(&rel);
    let bytes = store.get(&rel).await?.ok_or_else(|| ConfigError::Missing { url: url.clone() })?;
    parse_plan(&url, &bytes, boot)
}

/// [`read_plan`] without the store: `url` names the file in errors.
pub fn parse_plan(url: &str, bytes: &[u8], boot: &BootConfig) -> Result<Plan, ConfigError> {
    let plan = Plan::parse(bytes).map_err(|source| ConfigError::Invalid { url: url.to_string(), source })?;
    let mismatch = |field, ours: &str, boot_field: &str, theirs: &str| ConfigError::Mismatch {
        url: url.to_string(),
        field,
        message: format!("{ours:?}, but the BootConfig's {boot_field} is {theirs:?}"),
    };
    if plan.cluster_name != boot.cluster_name {
        return Err(mismatch("clusterName", &plan.cluster_name, "ClusterName", &boot.cluster_name));
    }
    if plan.instance_group != boot.instance_group_name {
        return Err(mismatch("instanceGroup", &plan.instance_group, "InstanceGroupName", &boot.instance_group_name));
    }
    Ok(plan)
}

/// Re-read this group's plan every `interval` (level-triggered: a membership or DNS change applies
/// without a restart) and publish it when it changed; a read that fails keeps the previous plan.
/// The first value is `plan`, already read.
pub fn watch(store: base::StateStore, boot: BootConfig, plan: Plan, interval: std::time::Duration) -> tokio::sync::watch::Receiver<Plan> {
    let (tx, rx) = tokio::sync::watch::channel(plan);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(interval).await;
            match read_plan(&store, &boot).await {
                Ok(p) => {
                    tx.send_if_modified(|current| {
                        let changed = *current != p;
                        if changed {
                            tracing::info!("the protokube config changed; the next passes follow it");
                            *current = p;
                        }
                        changed
                    });
                }
                Err(e) => tracing::warn!(error = %e, "re-reading the protokube config failed; keeping the previous one"),
            }
            if tx.is_closed() {
                return;
            }
        }
    });
    rx
}

/// Whether `instance` was made by the cloud for instance group `group` of this cluster (its
/// autoscaling group `<group>.<cluster>` on AWS, its managed instance group in its zone on GCE;
/// the two forms cannot be confused: an autoscaling group's name holds the cluster's dots, a
/// GCE name none). Only such an instance of an etcd member's group is a control plane.
pub fn made_for_group(plan: &Plan, group: &str, instance: &cloud::volumes::Instance) -> bool {
    let Some(made_by) = instance.group.as_deref() else { return false };
    made_by == names::autoscaling_group_name(group, &plan.cluster_name)
        || instance.zone.as_deref().is_some_and(|zone| made_by == names::gce_instance_group_manager_name(zone, group, &plan.cluster_name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn boot(name: &str, group: &str) -> BootConfig {
        BootConfig {
            cloud_provider: keelson_api::CloudProvider::Aws,
            config_base: "file:///x".parse().expect("config base"),
            cluster_name: name.into(),
            instance_group_name: group.into(),
            instance_group_role: keelson_api::Role::ControlPlane,
            nodeup_config_hash: "x".into(),
        }
    }

    /// What the compiler writes for group cp-a of a small cluster.
    fn compiled() -> String {
        let spec = "apiVersion: kops.k8s.io/v1alpha2\nkind: Cluster\nmetadata:\n  name: x.example.com\nspec:\n  configBase: file:///x\n  etcdClusters:\n  - name: main\n    version: 3.6.12\n    etcdMembers:\n    - name: a\n      instanceGroup: cp-a\n";
        let cluster = keelson_api::parse_documents(spec.as_bytes()).expect("spec").cluster;
        serde_yaml_ng::to_string(&spec_compiler::protokube_config::build(&cluster, "cp-a", &table_versions()).expect("config")).expect("yaml")
    }

    #[tokio::test]
    async fn the_plan_is_read_from_the_groups_file_and_checked_against_the_boot_config() {
        let dir = tempfile::tempdir().expect("dir");
        let store = base::StateStore::dir(dir.path());
        let e = read_plan(&store, &boot("x.example.com", "cp-a")).await.expect_err("an older keelson's store");
        assert!(matches!(e, ConfigError::Missing { .. }), "{e}");
        assert!(e.to_string().contains("igconfig/control-plane/cp-a/protokube.yaml") && e.to_string().contains("keelson apply -f SPEC --yes"), "{e}");
        store.put(&keelson_api::protokube::state_key("cp-a"), compiled().as_bytes()).await.expect("put");
        let plan = read_plan(&store, &boot("x.example.com", "cp-a")).await.expect("plan");
        assert_eq!(plan.etcd_clusters[0].image, "registry.k8s.io/etcd:v3.6.12");
        assert_eq!(plan.my_members(&plan.etcd_clusters[0]).len(), 1);
    }

    #[test]
    fn a_plan_for_another_cluster_or_group_or_a_bad_field_is_refused_by_name() {
        let text = compiled();
        let e = parse_plan("s3://b/c/p.yaml", text.as_bytes(), &boot("other.example.com", "cp-a")).expect_err("cluster");
        assert!(e.to_string().starts_with("s3://b/c/p.yaml: clusterName: \"x.example.com\""), "{e}");
        let e = parse_plan("s3://b/c/p.yaml", text.as_bytes(), &boot("x.example.com", "cp-b")).expect_err("group");
        assert!(e.to_string().starts_with("s3://b/c/p.yaml: instanceGroup:"), "{e}");
        let bad = text.replace("tls: true", "tls: maybe");
        let e = parse_plan("s3://b/c/p.yaml", bad.as_bytes(), &boot("x.example.com", "cp-a")).expect_err("tls");
        assert!(e.to_string().starts_with("s3://b/c/p.yaml: etcdClusters[0].tls:"), "{e}");
    }

    #[test]
    fn only_an_instance_its_groups_cloud_made_counts() {
        let plan = parse_plan("p", compiled().as_bytes(), &boot("x.example.com", "cp-a")).expect("plan");
        let instance = |group: Option<&str>, zone: Option<&str>| cloud::volumes::Instance {
            id: "i-1".into(),
            state: cloud::volumes::InstanceState::Running,
            zone: zone.map(str::to_string),
            private_ip: None,
            public_ip: None,
            devices: Vec::new(),
            group: group.map(str::to_string),
        };
        assert!(made_for_group(&plan, "cp-a", &instance(Some("cp-a.x.example.com"), None)));
        assert!(!made_for_group(&plan, "cp-a", &instance(Some("nodes.x.example.com"), None)));
        assert!(!made_for_group(&plan, "cp-a", &instance(None, None)));
        let mig = names::gce_instance_group_manager_name("us-central1-a", "cp-a", "x.example.com");
        assert!(made_for_group(&plan, "cp-a", &instance(Some(&mig), Some("us-central1-a"))));
    }

    /// The versions table of a Kubernetes version the specs here do not name (no mirrors).
    fn table_versions() -> spec_compiler::versions::Versions {
        spec_compiler::versions::Versions::for_kubernetes(&"1.34.4".parse().expect("version"), &Default::default()).expect("versions")
    }
}
