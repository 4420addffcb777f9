//! Well-known ports more than one component must agree on (kOps' `pkg/wellknownports`, whose
//! numbers Keelson keeps): the compiler opens or closes them in the firewalls, the agents listen on
//! them, the addons probe them. Every listener Keelson starts on a host is in [`LISTENERS`], and a
//! test holds that no two of them can collide on a host.

/// kube-apiserver (kOps `KubeAPIServer`).
pub const KUBE_API: u16 = 443;
/// nodeup's answer to the join server's call back, while a join is pending (kOps `NodeupChallenge`).
pub const NODEUP_CHALLENGE: u16 = 3987;
/// The node join server on every control plane (kOps `KopsControllerPort`).
pub const NODE_JOIN: u16 = 3988;
/// node-local-dns' health check, on its link-local address (kOps `NodeLocalDNSHealthCheck`).
pub const NODE_LOCAL_DNS_HEALTH: u16 = 3989;
/// kube-apiserver's plain health check for the load balancer (kOps `KubeAPIServerHealthCheck`).
pub const KUBE_API_HEALTH: u16 = 3990;
/// protokube's metrics and health, on loopback (kOps keeps 3998 for weave-mesh gossip, which
/// Keelson never runs).
pub const PROTOKUBE_METRICS: u16 = 3998;
/// The kubelet's API (kOps `KubeletAPI`).
pub const KUBELET_API: u16 = 10250;
/// kube-controller-manager's secure port (kOps `KubeControllerManagerMetricsPort`).
pub const KUBE_CONTROLLER_MANAGER: u16 = 10257;
/// The cloud-controller-manager's secure port.
pub const CLOUD_CONTROLLER_MANAGER: u16 = 10258;
/// kube-scheduler's secure port (kOps `KubeSchedulerMetricsPort`).
pub const KUBE_SCHEDULER: u16 = 10259;

/// Which hosts a listener runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum On {
    ControlPlanes,
    EveryHost,
}

/// The address a listener binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bind {
    /// Every address of the host (`0.0.0.0`).
    Any,
    /// `127.0.0.1`.
    Loopback,
    /// One address no other listener takes (node-local-dns' `169.254.20.10`).
    Own(&'static str),
}

/// One listener of the host network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listener {
    pub name: &'static str,
    pub port: u16,
    pub on: On,
    pub bind: Bind,
}

/// Every listener Keelson starts in the host network namespace, etcd's included.
pub fn listeners() -> Vec<Listener> {
    let l = |name, port, on, bind| Listener { name, port, on, bind };
    let mut out = vec![
        l("kube-apiserver", KUBE_API, On::ControlPlanes, Bind::Any),
        l("kube-apiserver health check", KUBE_API_HEALTH, On::ControlPlanes, Bind::Any),
        l("nodeup join call-back", NODEUP_CHALLENGE, On::EveryHost, Bind::Any),
        l("node join server (protokube)", NODE_JOIN, On::ControlPlanes, Bind::Any),
        l("node-local-dns health", NODE_LOCAL_DNS_HEALTH, On::EveryHost, Bind::Own("169.254.20.10")),
        l("protokube metrics", PROTOKUBE_METRICS, On::ControlPlanes, Bind::Loopback),
        l("kubelet", KUBELET_API, On::EveryHost, Bind::Any),
        l("kube-controller-manager", KUBE_CONTROLLER_MANAGER, On::ControlPlanes, Bind::Any),
        l("cloud-controller-manager", CLOUD_CONTROLLER_MANAGER, On::ControlPlanes, Bind::Any),
        l("kube-scheduler", KUBE_SCHEDULER, On::ControlPlanes, Bind::Any),
    ];
    for (name, p) in
        [("etcd main", etcd_ports("main")), ("etcd events", etcd_ports("events")), ("etcd cilium", etcd_ports("cilium")), ("etcd leases", etcd_ports("leases"))]
    {
        if let Some(p) = p {
            out.push(l(name, p.peer, On::ControlPlanes, Bind::Any));
            out.push(l(name, p.client, On::ControlPlanes, Bind::Any));
        }
    }
    out
}

/// Whether two listeners could not both bind on one host.
pub fn collide(a: &Listener, b: &Listener) -> bool {
    let overlap = |x: Bind, y: Bind| match (x, y) {
        (Bind::Any, _) | (_, Bind::Any) => true,
        (x, y) => x == y,
    };
    a.port == b.port && overlap(a.bind, b.bind)
}

/// The peer and client ports of one etcd cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EtcdPorts {
    pub peer: u16,
    pub client: u16,
}

/// etcd `main` (kOps' assignment, as every etcd cluster's below).
pub const ETCD_MAIN: EtcdPorts = EtcdPorts { peer: 2380, client: 4001 };
pub const ETCD_EVENTS: EtcdPorts = EtcdPorts { peer: 2381, client: 4002 };
pub const ETCD_CILIUM: EtcdPorts = EtcdPorts { peer: 2382, client: 4003 };
pub const ETCD_LEASES: EtcdPorts = EtcdPorts { peer: 2383, client: 4004 };

/// Ports of what is not Keelson's own listener but its firewalls open: SSH, VXLAN (flannel, Cilium,
/// Calico's VXLAN mode), BGP (Calico, kube-router).
pub const SSH: u16 = 22;
pub const VXLAN: u16 = 4789;
pub const BGP: u16 = 179;

/// kOps' port assignment for an etcd cluster by name; `None` for a name kOps does not know.
pub fn etcd_ports(etcd_cluster: &str) -> Option<EtcdPorts> {
    match etcd_cluster {
        "main" => Some(ETCD_MAIN),
        "events" => Some(ETCD_EVENTS),
        "cilium" => Some(ETCD_CILIUM),
        "leases" => Some(ETCD_LEASES),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_two_listeners_collide_on_a_host() {
        let all = listeners();
        assert!(all.len() >= 18, "every listener is in the table: {}", all.len());
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert!(!collide(a, b), "{} and {} both want port {}", a.name, b.name, a.port);
            }
        }
        // The collision the table exists for: the call-back on every address and node-local-dns'
        // health check on its own both on 3989, as nodeup had it.
        let dns = all.iter().find(|l| l.port == NODE_LOCAL_DNS_HEALTH).expect("node-local-dns");
        assert!(collide(&Listener { name: "old call-back", port: 3989, on: On::EveryHost, bind: Bind::Any }, dns));
        assert!(!collide(&Listener { name: "x", port: 3989, on: On::EveryHost, bind: Bind::Loopback }, dns));
    }

    #[test]
    fn known_clusters_have_kops_ports_and_others_none() {
        assert_eq!(etcd_ports("main"), Some(EtcdPorts { peer: 2380, client: 4001 }));
        assert_eq!(etcd_ports("events"), Some(EtcdPorts { peer: 2381, client: 4002 }));
        assert_eq!(etcd_ports("leases").map(|p| p.client), Some(4004));
        assert_eq!(etcd_ports("bogus"), None);
    }
}
