//! Every host path nodeup writes, in one place (kOps conventions; see docs/design.md "Host layout").
//!
//! Paths are absolute host paths; [`crate::host::Host::path`] maps them under `--root`. The paths
//! another part of Keelson also reads or writes are defined in [`keelson_api::host_paths`] and
//! re-exported here; the rest are nodeup's own.

pub use keelson_api::host_paths::{
    CONTAINERD_CERTS_DIR, CONTAINERD_CONFIG, HOSTS_FILE, KCM_KUBECONFIG, KUBELET_CLIENT_PEM, KUBELET_KUBECONFIG, KUBELET_PODS_DIR, KUBELET_SERVER_CERT,
    KUBE_APISERVER_PKI_DIR, KUBE_PROXY_KUBECONFIG, NODEUP_BIN, SCHEDULER_CONFIG, SCHEDULER_KUBECONFIG, SRV_KUBERNETES, STATIC_POD_DIR as MANIFESTS_DIR,
};

pub const BIN_DIR: &str = "/usr/local/bin";
pub const KUBELET_BIN: &str = "/usr/local/bin/kubelet";
pub const KUBECTL_BIN: &str = "/usr/local/bin/kubectl";
pub const CONTAINERD_BIN: &str = "/usr/local/bin/containerd";
pub const PROTOKUBE_BIN: &str = "/usr/local/bin/protokube";
pub const ECR_CREDENTIAL_PROVIDER_BIN: &str = "/usr/local/bin/ecr-credential-provider";
pub const RUNC_BIN: &str = "/usr/local/sbin/runc";
pub const CNI_BIN_DIR: &str = "/opt/cni/bin";
pub const CNI_CONF_DIR: &str = "/etc/cni/net.d";

pub const CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";

pub const KUBELET_CONFIG: &str = "/var/lib/kubelet/kubelet.conf";
/// The kubelet's flags (`DAEMON_ARGS`), written by nodeup (the environment file of [`KUBELET_DROP_IN`]).
pub const KUBELET_SYSCONFIG: &str = "/etc/sysconfig/kubelet";
/// The drop-in with the kubelet's command line (kubeadm's `10-kubeadm.conf`): `$DAEMON_ARGS` from
/// [`KUBELET_SYSCONFIG`], then `$KUBELET_EXTRA_ARGS` from [`KUBELET_SITE_ENV`].
pub const KUBELET_DROP_IN: &str = "/etc/systemd/system/kubelet.service.d/10-keelson.conf";
/// The site's own kubelet flags (`KUBELET_EXTRA_ARGS="…"`), as kubeadm and EKS read them: nodeup
/// never writes it, so they survive every run.
pub const KUBELET_SITE_ENV: &str = "/etc/default/kubelet";
/// The kubelet's drop-in configuration directory (`--config-dir`): `KubeletConfiguration` fragments
/// of the site, merged over `kubelet.conf` in file-name order. nodeup creates it, never writes into it.
pub const KUBELET_CONFIG_DIR: &str = "/etc/kubernetes/kubelet.conf.d";
pub const KUBELET_BOOTSTRAP_KUBECONFIG: &str = "/var/lib/kubelet/bootstrap-kubeconfig";
pub const KUBELET_CREDENTIAL_PROVIDER_CONFIG: &str = "/var/lib/kubelet/credential-provider.conf";

pub const SYSTEMD_DIR: &str = "/etc/systemd/system";
/// The input hash each unit last (re)started with, `<unit>.hash` (`nodetasks::ServiceTask`).
pub const SERVICE_HASH_DIR: &str = "/var/lib/keelson/nodeup/units";
pub const MULTI_USER_WANTS: &str = "/etc/systemd/system/multi-user.target.wants";
/// Control planes: the drop-in every container scope (`cri-containerd-<id>.scope`) reads (systemd
/// applies `<prefix>-.scope.d/` to every scope named `<prefix>-…`, transient ones included):
/// containers stop after protokube ([`crate::render::systemd::containers_after_protokube`]).
pub const CONTAINER_SCOPES_DROP_IN: &str = "/etc/systemd/system/cri-containerd-.scope.d/50-keelson-stop-after-protokube.conf";

pub const SYSCTL_CONF: &str = "/etc/sysctl.d/99-k8s-general.conf";
pub const MODULES_CONF: &str = "/etc/modules-load.d/k8s.conf";
pub const FSTAB: &str = "/etc/fstab";

pub const CA_CRT: &str = "/srv/kubernetes/ca.crt";

/// Default download cache (keyed by sha256), under the root.
pub const CACHE_DIR: &str = "/var/cache/nodeup";

/// A copy of the BootConfig, for services (protokube) that read it after boot.
pub const BOOT_CONFIG_COPY: &str = "/etc/keelson/bootconfig.yaml";
