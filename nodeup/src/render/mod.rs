//! Rendered files: every one from typed structs serialised by serde (or a typed renderer).

pub mod containerd;
pub mod hooks;
pub mod kubelet;
pub mod kubelet_config;
pub mod manifests;
pub mod systemd;

/// `/etc/sysctl.d/99-k8s-general.conf` (kOps' settings), then the spec's own lines (the
/// NodeupConfig's `SysctlParameters`: the group's, then the cluster's, so they win).
pub fn sysctls(service_node_port_range: Option<&str>, aws: bool, cilium: bool, extra: &[String]) -> String {
    let mut l: Vec<String> = vec![
        "# Kubernetes Settings".into(),
        String::new(),
        "vm.max_map_count = 1048576".into(),
        String::new(),
        "kernel.softlockup_panic = 1".into(),
        "kernel.softlockup_all_cpu_backtrace = 1".into(),
        String::new(),
        format!("net.ipv4.ip_local_reserved_ports = {}", service_node_port_range.unwrap_or("30000-32767")),
        String::new(),
    ];
    for s in [
        "# Increase the number of connections",
        "net.core.somaxconn = 32768",
        "",
        "# Maximum Socket Receive Buffer",
        "net.core.rmem_max = 16777216",
        "",
        "# Maximum Socket Send Buffer",
        "net.core.wmem_max = 16777216",
        "",
        "# Increase the maximum total buffer-space allocatable",
        "net.ipv4.tcp_wmem = 4096 87380 16777216",
        "net.ipv4.tcp_rmem = 4096 87380 16777216",
        "",
        "# Increase the number of outstanding syn requests allowed",
        "net.ipv4.tcp_max_syn_backlog = 8096",
        "",
        "# For persistent HTTP connections",
        "net.ipv4.tcp_slow_start_after_idle = 0",
        "",
        "# Allow to reuse TIME_WAIT sockets for new connections when it is safe from protocol viewpoint",
        "net.ipv4.tcp_tw_reuse = 1",
        "",
        "# Max number of packets that can be queued on interface input",
        "net.core.netdev_max_backlog = 16384",
        "",
        "# Increase size of file handles and inode cache",
        "fs.file-max = 2097152",
        "",
        "# Max number of inotify instances for a user",
        "fs.inotify.max_user_instances = 8192",
        "",
        "# Additional sysctl flags that kubelet expects",
        "vm.overcommit_memory = 1",
        "kernel.panic = 10",
        "kernel.panic_on_oops = 1",
        "",
    ] {
        l.push(s.into());
    }
    if aws {
        l.extend(["# AWS settings", "# Issue #23395", "net.ipv4.neigh.default.gc_thresh1=0", ""].map(String::from));
    }
    l.extend(["# Pod networking needs forwarding", "net.ipv4.ip_forward=1", ""].map(String::from));
    if cilium {
        l.extend(["# Cilium requires rp_filter off", "net.ipv4.conf.all.rp_filter=0", ""].map(String::from));
    }
    l.extend(extra.iter().cloned());
    l.join("\n") + "\n"
}

/// `/etc/modules-load.d/k8s.conf`
pub fn modules() -> String {
    "br_netfilter\noverlay\n".to_string()
}

#[cfg(test)]
mod tests {
    /// The spec's sysctl lines come last, after kOps' settings, so they win in sysctl(8).
    #[test]
    fn the_specs_sysctl_lines_come_after_kops_settings() {
        let extra = keelson_api::nodeup::sysctl_parameters(&[], &["vm.max_map_count = 262144".to_string()]);
        let text = super::sysctls(None, true, false, &extra);
        let at = text.find("# Custom sysctl parameters from cluster spec").expect("the spec's lines");
        assert!(at > text.find("net.ipv4.ip_forward=1").expect("kOps' settings"), "{text}");
        assert!(text.ends_with("vm.max_map_count = 262144\n"), "{text}");
        assert_eq!(super::sysctls(None, true, false, &[]).matches("Custom sysctl").count(), 0);
    }
}
