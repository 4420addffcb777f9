//! etcd cluster defaults (kOps `pkg/model/components/etcd.go`, `cloudup/defaults.go`).

use keelson_api::{ClusterSpec, EtcdBackupSpec, EtcdManagerSpec};

use super::network::join_path;
use super::{default, Context, Derived};

pub fn build(ctx: &Context, _d: &Derived, spec: &mut ClusterSpec) {
    let config_base = spec.config_base.clone();
    for etcd in spec.etcd_clusters.iter_mut().flatten() {
        // Cluster-level volume fields are not part of kOps' etcd cluster: it drops them.
        etcd.volume_iops = None;
        etcd.volume_size = None;
        etcd.volume_throughput = None;
        etcd.type_ = None;
        default(&mut etcd.version, ctx.versions.etcd_version().to_string());
        let manager = etcd.manager.get_or_insert_with(EtcdManagerSpec::default);
        default(&mut manager.backup_retention_days, base::etcd_backup::DEFAULT_RETENTION_DAYS);
        if let (Some(base), Some(name)) = (config_base.as_deref(), etcd.name.as_deref()) {
            let backups = etcd.backups.get_or_insert_with(EtcdBackupSpec::default);
            default(&mut backups.backup_store, join_path(base, &["backups", "etcd", name]));
        }
    }
}
