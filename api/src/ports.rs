//! Well-known ports more than one component must agree on (kOps' `wellknownports`): the compiler
//! opens or closes them in the security groups, protokube listens on them.

/// The peer and client ports of one etcd cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EtcdPorts {
    pub peer: u16,
    pub client: u16,
}

/// kOps' port assignment for an etcd cluster by name; `None` for a name kOps does not know.
pub fn etcd_ports(etcd_cluster: &str) -> Option<EtcdPorts> {
    match etcd_cluster {
        "main" => Some(EtcdPorts { peer: 2380, client: 4001 }),
        "events" => Some(EtcdPorts { peer: 2381, client: 4002 }),
        "cilium" => Some(EtcdPorts { peer: 2382, client: 4003 }),
        "leases" => Some(EtcdPorts { peer: 2383, client: 4004 }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_clusters_have_kops_ports_and_others_none() {
        assert_eq!(etcd_ports("main"), Some(EtcdPorts { peer: 2380, client: 4001 }));
        assert_eq!(etcd_ports("events"), Some(EtcdPorts { peer: 2381, client: 4002 }));
        assert_eq!(etcd_ports("leases").map(|p| p.client), Some(4004));
        assert_eq!(etcd_ports("bogus"), None);
    }
}
