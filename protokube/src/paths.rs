//! Every host path protokube reads or writes, relative to `--root`.

use std::path::{Path, PathBuf};

pub const HOSTS_FILE: &str = "etc/hosts";
/// The kubelet's pod directories: each host-network pod's copy of the hosts file is
/// `<uid>/etc-hosts` there ([`base::hosts::update_pod_copies`]).
pub const KUBELET_PODS_DIR: &str = "var/lib/kubelet/pods";
pub const DEFAULT_BY_ID_DIR: &str = "/dev/disk/by-id";
/// Where etcd snapshots are staged on their way to the backup store: a directory only root may
/// enter ([`base::fs::PRIVATE_DIR_MODE`]), files only root may read (snapshots hold every secret).
pub const BACKUP_STAGING_DIR: &str = "var/lib/protokube/etcd-backups";
/// Where a member downloads the backup it restores, on its etcd volume (next to the data it
/// replaces): private like [`BACKUP_STAGING_DIR`].
pub const RESTORE_DOWNLOAD_DIR: &str = "keelson-restore";

/// The file a member downloads the backup of restore `request` to, under its volume's `mount`
/// (a [`base::etcd_backup::RestoreId`] holds no `/` or `.`: the file stays in that directory).
pub fn restore_download(mount: &Path, request: &base::etcd_backup::RestoreId) -> PathBuf {
    mount.join(RESTORE_DOWNLOAD_DIR).join(format!("restore-{request}.db"))
}
/// containerd's per-registry `hosts.toml` files (written by nodeup), read by the host's `ctr` when
/// it pulls (an absolute host path, as `ctr` talks to the host's containerd).
pub const CONTAINERD_HOSTS_DIR: &str = "/etc/containerd/certs.d";
/// containerd's configuration (nodeup writes it; it pins the sandbox image).
pub const CONTAINERD_CONFIG: &str = "/etc/containerd/config.toml";
/// The etcd TLS material of etcd cluster `<name>`, issued by protokube from the state store's CAs:
/// `ca.crt` (etcd-clients-ca, the root clients verify servers with), `clients-ca.crt` (the client
/// CAs the member accepts: etcd-clients-ca-<name> and etcd-clients-ca-kube-apiserver),
/// `peer-ca.crt` (etcd-peers-ca-<name>), `server.crt|key` (client port, with its intermediate),
/// `peer.crt|key`, `client.crt|key` (protokube's own client for the members API).
pub const ETCD_PKI_DIR: &str = "etc/kubernetes/pki/etcd";
/// What nodeup writes on a control plane (nodeup/src/paths.rs) and the certificate renewal pass
/// ([`crate::certs`]) reissues: the API server's certificates (`<name>.crt|key`), the
/// kubeconfigs with embedded client certificates, the kubelet's serving certificate.
pub const KUBE_APISERVER_PKI_DIR: &str = "/srv/kubernetes/kube-apiserver";
pub const KCM_KUBECONFIG: &str = "/var/lib/kube-controller-manager/kubeconfig";
pub const SCHEDULER_KUBECONFIG: &str = "/var/lib/kube-scheduler/kubeconfig";
pub const KUBE_PROXY_KUBECONFIG: &str = "/var/lib/kube-proxy/kubeconfig";
pub const KUBELET_KUBECONFIG: &str = "/var/lib/kubelet/kubeconfig";
/// The kubelet's client certificate and key (nodeup's `KUBELET_CLIENT_PEM`), which its kubeconfig names.
pub const KUBELET_CLIENT_PEM: &str = "/var/lib/kubelet/kubelet-client.pem";
/// Without the extension: `kubelet-server.crt` and `.key`.
pub const KUBELET_SERVER_CERT: &str = "/srv/kubernetes/kubelet-server";

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
    format!("/{ETCD_PKI_DIR}/{etcd_cluster}")
}

/// `root` + absolute host path.
pub fn under(root: &Path, host_path: &str) -> PathBuf {
    root.join(host_path.trim_start_matches('/'))
}
