//! Every host path protokube reads or writes: absolute host paths, which [`under`] joins under
//! `--root`. The paths another part of Keelson also reads or writes are defined in
//! [`keelson_api::host_paths`] and re-exported here; the rest are protokube's own.

use std::path::{Path, PathBuf};

pub use keelson_api::host_paths::{
    CONTAINERD_CERTS_DIR, CONTAINERD_CONFIG, HOSTS_FILE, KCM_KUBECONFIG, KUBELET_CLIENT_PEM, KUBELET_KUBECONFIG, KUBELET_PODS_DIR, KUBELET_SERVER_CERT,
    KUBE_APISERVER_PKI_DIR, KUBE_PROXY_KUBECONFIG, SCHEDULER_KUBECONFIG,
};
pub const DEFAULT_BY_ID_DIR: &str = "/dev/disk/by-id";
/// Where etcd snapshots are staged on their way to the backup store: a directory only root may
/// enter ([`base::fs::PRIVATE_DIR_MODE`]), files only root may read (snapshots hold every secret).
pub const BACKUP_STAGING_DIR: &str = "/var/lib/protokube/etcd-backups";
/// Where a member downloads the backup it restores, on its etcd volume (next to the data it
/// replaces): private like [`BACKUP_STAGING_DIR`].
pub const RESTORE_DOWNLOAD_DIR: &str = "keelson-restore";

/// The file a member downloads the backup of restore `request` to, under its volume's `mount`
/// (a [`base::etcd_backup::RestoreId`] holds no `/` or `.`: the file stays in that directory).
pub fn restore_download(mount: &Path, request: &base::etcd_backup::RestoreId) -> PathBuf {
    mount.join(RESTORE_DOWNLOAD_DIR).join(format!("restore-{request}.db"))
}
/// The etcd TLS material of etcd cluster `<name>`, issued by protokube from the state store's CAs:
/// `ca.crt` (etcd-clients-ca, the root clients verify servers with), `clients-ca.crt` (the client
/// CAs the member accepts: etcd-clients-ca-<name> and etcd-clients-ca-kube-apiserver),
/// `peer-ca.crt` (etcd-peers-ca-<name>), `server.crt|key` (client port, with its intermediate),
/// `peer.crt|key`, `client.crt|key` (protokube's own client for the members API).
pub const ETCD_PKI_DIR: &str = "/etc/kubernetes/pki/etcd";

/// Host path (as seen by pods, i.e. without `--root`) of a volume's mount point.
pub fn mount_point(volume_id: &str) -> String {
    format!("/mnt/master-{volume_id}")
}

/// Host path of one etcd cluster's manifest (without `--root`) in the static-pod directory
/// `static_pod_dir` ([`crate::config::Plan::static_pod_dir`]).
pub fn manifest_path(static_pod_dir: &str, etcd_cluster: &str) -> String {
    format!("{}/etcd-{etcd_cluster}.manifest", static_pod_dir.trim_end_matches('/'))
}

pub fn etcd_pki_dir(etcd_cluster: &str) -> String {
    format!("{ETCD_PKI_DIR}/{etcd_cluster}")
}

/// `root` + absolute host path (`under("/r", "/etc/hosts")` is `/r/etc/hosts`).
pub fn under(root: &Path, host_path: &str) -> PathBuf {
    root.join(host_path.trim_start_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn under_joins_absolute_paths_below_the_root() {
        assert_eq!(under(Path::new("/r"), HOSTS_FILE), PathBuf::from("/r/etc/hosts"));
        assert_eq!(under(Path::new("/"), KUBELET_PODS_DIR), PathBuf::from("/var/lib/kubelet/pods"));
        assert_eq!(under(Path::new("/r"), &etcd_pki_dir("main")), PathBuf::from("/r/etc/kubernetes/pki/etcd/main"));
        assert_eq!(under(Path::new("/r"), BACKUP_STAGING_DIR), PathBuf::from("/r/var/lib/protokube/etcd-backups"));
    }
}
