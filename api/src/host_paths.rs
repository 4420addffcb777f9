//! The host paths more than one part of Keelson reads or writes, in one place (bottlerocket's
//! `sources/constants`; kOps' conventions, see docs/design.md "Host layout").
//!
//! Every path is absolute, as the host sees it. nodeup maps them under its `--root` with
//! `Host::path`, protokube with `paths::under`. A path only one crate uses stays in that crate's
//! own `paths` module (`nodeup/src/paths.rs`, `protokube/src/paths.rs`).

/// Where the kubelet reads static pods unless `kubelet.podManifestPath` / `masterKubelet.podManifestPath`
/// says otherwise (the compiler fills that default; nodeup and protokube write there).
pub const STATIC_POD_DIR: &str = "/etc/kubernetes/manifests";

/// The hosts file: a worker of a cluster without DNS records finds the control plane there
/// (nodeup's `api-hosts`); protokube writes the control plane's own names there.
pub const HOSTS_FILE: &str = "/etc/hosts";
/// The kubelet's pod directories: each host-network pod's copy of the hosts file is
/// `<uid>/etc-hosts` there (`base::hosts::update_pod_copies`).
pub const KUBELET_PODS_DIR: &str = "/var/lib/kubelet/pods";

/// containerd's configuration: nodeup writes it (it pins the sandbox image), protokube reads it.
pub const CONTAINERD_CONFIG: &str = "/etc/containerd/config.toml";
/// containerd's per-registry `hosts.toml` files (`<registry>/hosts.toml`): nodeup writes them,
/// containerd's CRI and protokube's `ctr --hosts-dir` read them.
pub const CONTAINERD_CERTS_DIR: &str = "/etc/containerd/certs.d";
/// containerd's store (its own default `root`; nodeup sets `root` only when the spec's
/// `containerd.root` does): `keelson bundle bake` imports images there, keelson-local binds a
/// host directory there.
pub const CONTAINERD_ROOT: &str = "/var/lib/containerd";

/// The cluster's PKI on the host (kOps' `/srv/kubernetes`).
pub const SRV_KUBERNETES: &str = "/srv/kubernetes";
/// The API server's certificates (`<name>.crt|key`): nodeup writes them, protokube renews them.
pub const KUBE_APISERVER_PKI_DIR: &str = "/srv/kubernetes/kube-apiserver";
/// Where the API server's encryption configuration is written on control planes (kOps' path).
pub const ENCRYPTION_CONFIG_PATH: &str = "/srv/kubernetes/kube-apiserver/encryptionconfig.yaml";
/// The kubelet's serving certificate, without the extension: `kubelet-server.crt` and `.key`.
pub const KUBELET_SERVER_CERT: &str = "/srv/kubernetes/kubelet-server";

/// The kubeconfigs with embedded client certificates: nodeup writes them, protokube renews them.
pub const KCM_KUBECONFIG: &str = "/var/lib/kube-controller-manager/kubeconfig";
pub const SCHEDULER_KUBECONFIG: &str = "/var/lib/kube-scheduler/kubeconfig";
/// kube-scheduler's configuration file (the compiler renders it, nodeup writes it and passes `--config`).
pub const SCHEDULER_CONFIG: &str = "/var/lib/kube-scheduler/config.yaml";
pub const KUBE_PROXY_KUBECONFIG: &str = "/var/lib/kube-proxy/kubeconfig";
/// The kubelet's kubeconfig (the compiler's default `kubelet.kubeconfigPath`).
pub const KUBELET_KUBECONFIG: &str = "/var/lib/kubelet/kubeconfig";
/// The kubelet's client certificate and key, one PEM file (0600) its kubeconfig names: the kubelet
/// reads it again by itself, so a renewal needs no restart.
pub const KUBELET_CLIENT_PEM: &str = "/var/lib/kubelet/kubelet-client.pem";

/// Where user-data installs Keelson (`keelson compile`'s `INSTALL_DIR`): `bin/nodeup`, `conf/`.
pub const INSTALL_DIR: &str = "/opt/keelson";
/// The verified nodeup binary user-data installs (`<INSTALL_DIR>/bin/nodeup`).
pub const NODEUP_BIN: &str = "/opt/keelson/bin/nodeup";

/// Every constant of this module, by name (for the uniqueness test and for tools that list them).
pub const ALL: &[(&str, &str)] = &[
    ("STATIC_POD_DIR", STATIC_POD_DIR),
    ("HOSTS_FILE", HOSTS_FILE),
    ("KUBELET_PODS_DIR", KUBELET_PODS_DIR),
    ("CONTAINERD_CONFIG", CONTAINERD_CONFIG),
    ("CONTAINERD_CERTS_DIR", CONTAINERD_CERTS_DIR),
    ("SRV_KUBERNETES", SRV_KUBERNETES),
    ("KUBE_APISERVER_PKI_DIR", KUBE_APISERVER_PKI_DIR),
    ("ENCRYPTION_CONFIG_PATH", ENCRYPTION_CONFIG_PATH),
    ("KUBELET_SERVER_CERT", KUBELET_SERVER_CERT),
    ("KCM_KUBECONFIG", KCM_KUBECONFIG),
    ("SCHEDULER_KUBECONFIG", SCHEDULER_KUBECONFIG),
    ("SCHEDULER_CONFIG", SCHEDULER_CONFIG),
    ("KUBE_PROXY_KUBECONFIG", KUBE_PROXY_KUBECONFIG),
    ("KUBELET_KUBECONFIG", KUBELET_KUBECONFIG),
    ("KUBELET_CLIENT_PEM", KUBELET_CLIENT_PEM),
    ("INSTALL_DIR", INSTALL_DIR),
    ("NODEUP_BIN", NODEUP_BIN),
];

/// Pairs of names documented as the same path (none today): a new alias is added here with its reason.
pub const ALIASES: &[(&str, &str)] = &[];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_two_paths_are_equal_unless_aliases() {
        for (i, (a, pa)) in ALL.iter().enumerate() {
            for (b, pb) in &ALL[i + 1..] {
                let alias = ALIASES.contains(&(a, b)) || ALIASES.contains(&(b, a));
                assert!(pa != pb || alias, "{a} and {b} are both {pa:?}: one fact, one constant (or document the alias)");
            }
        }
    }

    #[test]
    fn every_path_is_absolute_and_clean() {
        for (name, p) in ALL {
            assert!(p.starts_with('/'), "{name} = {p:?} is not absolute");
            assert!(!p.ends_with('/') && !p.contains("//") && !p.contains("/./") && !p.contains("/../"), "{name} = {p:?} is not clean");
        }
    }

    #[test]
    fn files_sit_in_their_directories() {
        assert_eq!(NODEUP_BIN, format!("{INSTALL_DIR}/bin/nodeup"));
        assert!(KUBE_APISERVER_PKI_DIR.starts_with(SRV_KUBERNETES) && KUBELET_SERVER_CERT.starts_with(SRV_KUBERNETES));
        assert!(ENCRYPTION_CONFIG_PATH.starts_with(&format!("{KUBE_APISERVER_PKI_DIR}/")));
        assert!(KUBELET_PODS_DIR.starts_with("/var/lib/kubelet/") && KUBELET_KUBECONFIG.starts_with("/var/lib/kubelet/"));
    }
}
