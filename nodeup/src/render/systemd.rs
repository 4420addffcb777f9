//! systemd unit files rendered from typed sections (kOps `nodeup/pkg/systemd` conventions).

/// `[Unit]`
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnitSection {
    pub description: String,
    pub documentation: Option<String>,
    pub after: Vec<String>,
    pub wants: Vec<String>,
}

/// `[Service]`
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceSection {
    pub type_: Option<String>,
    pub environment_files: Vec<String>,
    pub exec_start_pre: Vec<String>,
    pub exec_start: String,
    pub restart: Option<String>,
    pub restart_sec: Option<String>,
    pub start_limit_interval: Option<String>,
    pub kill_mode: Option<String>,
    /// How long a start may take (for a oneshot: the whole run) before systemd kills it.
    pub timeout_start_sec: Option<String>,
    /// How long systemd waits for the service to stop before it kills it.
    pub timeout_stop_sec: Option<String>,
    pub delegate: Option<bool>,
    pub user: Option<String>,
    pub limits: Vec<(String, String)>,
    pub oom_score_adjust: Option<i32>,
    pub cpu_accounting: Option<bool>,
    pub memory_accounting: Option<bool>,
}

/// `[Install]`
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstallSection {
    pub wanted_by: Vec<String>,
}

/// A whole unit file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unit {
    pub unit: UnitSection,
    pub service: ServiceSection,
    pub install: InstallSection,
}

struct Ini(String);

impl Ini {
    fn section(&mut self, name: &str) {
        if !self.0.is_empty() {
            self.0.push('\n');
        }
        self.0.push_str(&format!("[{name}]\n"));
    }
    fn kv(&mut self, k: &str, v: impl std::fmt::Display) {
        self.0.push_str(&format!("{k}={v}\n"));
    }
    fn opt(&mut self, k: &str, v: &Option<impl std::fmt::Display>) {
        if let Some(v) = v {
            self.kv(k, v);
        }
    }
    fn list(&mut self, k: &str, v: &[String]) {
        if !v.is_empty() {
            self.kv(k, v.join(" "));
        }
    }
    /// The `[Unit]` section every unit file starts with.
    fn unit(&mut self, u: &UnitSection) {
        self.section("Unit");
        self.kv("Description", &u.description);
        self.opt("Documentation", &u.documentation);
        self.list("After", &u.after);
        self.list("Wants", &u.wants);
    }
}

fn yes_no(b: &Option<bool>) -> Option<&'static str> {
    b.map(|b| if b { "yes" } else { "no" })
}

impl Unit {
    pub fn render(&self) -> String {
        let mut o = Ini(String::new());
        o.unit(&self.unit);
        let s = &self.service;
        o.section("Service");
        o.opt("Type", &s.type_);
        for f in &s.environment_files {
            o.kv("EnvironmentFile", f);
        }
        for p in &s.exec_start_pre {
            o.kv("ExecStartPre", p);
        }
        o.kv("ExecStart", &s.exec_start);
        o.opt("Restart", &s.restart);
        o.opt("RestartSec", &s.restart_sec);
        o.opt("StartLimitInterval", &s.start_limit_interval);
        o.opt("Delegate", &yes_no(&s.delegate));
        o.opt("KillMode", &s.kill_mode);
        o.opt("TimeoutStartSec", &s.timeout_start_sec);
        o.opt("TimeoutStopSec", &s.timeout_stop_sec);
        o.opt("User", &s.user);
        for (k, v) in &s.limits {
            o.kv(k, v);
        }
        o.opt("OOMScoreAdjust", &s.oom_score_adjust);
        o.opt("CPUAccounting", &s.cpu_accounting);
        o.opt("MemoryAccounting", &s.memory_accounting);
        o.section("Install");
        o.list("WantedBy", &self.install.wanted_by);
        o.0
    }
}

/// A `.timer` unit: starts the service of the same name `every` apart (first `every` after the
/// timer starts), each time up to `jitter` later, so a fleet's runs are spread.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Timer {
    pub unit: UnitSection,
    pub every: std::time::Duration,
    pub jitter: std::time::Duration,
    /// `AccuracySec` (systemd's default, a minute, would stretch a short period).
    pub accuracy: Option<std::time::Duration>,
    pub install: InstallSection,
}

impl Timer {
    pub fn render(&self) -> String {
        let mut o = Ini(String::new());
        o.unit(&self.unit);
        o.section("Timer");
        o.kv("OnActiveSec", format!("{}s", self.every.as_secs()));
        o.kv("OnUnitActiveSec", format!("{}s", self.every.as_secs()));
        o.kv("RandomizedDelaySec", format!("{}s", self.jitter.as_secs()));
        if let Some(a) = self.accuracy {
            o.kv("AccuracySec", format!("{}s", a.as_secs().max(1)));
        }
        o.section("Install");
        o.list("WantedBy", &self.install.wanted_by);
        o.0
    }
}

/// `keelson-nodeup.service` (workers): nodeup run again, as at boot, from the BootConfig copy: a
/// rerun changes nothing but what drifted — in particular it joins again for new kubelet and
/// kube-proxy certificates once less than a third of their life is left.
pub fn nodeup_again(boot_config_path: &str) -> Unit {
    Unit {
        unit: UnitSection {
            description: "Keelson nodeup, run again: renews this node's certificates (join) and repairs drift".into(),
            documentation: None,
            after: vec!["network-online.target".into(), "kubelet.service".into()],
            wants: vec!["network-online.target".into()],
        },
        service: ServiceSection {
            type_: Some("oneshot".into()),
            exec_start: format!("{} --conf {boot_config_path}", crate::paths::NODEUP_BIN),
            // A run that hangs would hold the timer's next run off forever: bounded by the
            // longest wait of a boot plus its downloads.
            timeout_start_sec: Some(format!("{}s", (crate::model::BOOT_WAIT + std::time::Duration::from_secs(15 * 60)).as_secs())),
            ..Default::default()
        },
        install: InstallSection::default(),
    }
}

/// `keelson-nodeup.timer`: runs [`nodeup_again`] every `every` (with up to a quarter of it as jitter).
pub fn nodeup_again_timer(every: std::time::Duration) -> Timer {
    Timer {
        unit: UnitSection { description: "Run keelson-nodeup.service periodically (certificate renewal)".into(), ..Default::default() },
        every,
        jitter: every / 4,
        accuracy: None,
        install: multi_user(),
    }
}

/// `keelson-api-hosts.service` (workers of a cluster without DNS records): `nodeup api-hosts`,
/// which sets `api.internal` and the join server's name in the hosts file to the API servers the
/// control planes publish ([`crate::api_hosts`]).
pub fn api_hosts(boot_config_path: &str) -> Unit {
    Unit {
        unit: UnitSection {
            description: "Keelson: api.internal and the join server's name follow the live API servers (hosts file)".into(),
            documentation: None,
            after: vec!["network-online.target".into()],
            wants: vec!["network-online.target".into()],
        },
        service: ServiceSection {
            type_: Some("oneshot".into()),
            exec_start: format!("{} api-hosts --conf {boot_config_path}", crate::paths::NODEUP_BIN),
            // One read of the state store and one write of the hosts files: a few seconds.
            timeout_start_sec: Some(format!("{}s", API_HOSTS_RUN_BOUND.as_secs())),
            ..Default::default()
        },
        install: InstallSection::default(),
    }
}

/// The bound of one `nodeup api-hosts` run (systemd kills a run that takes longer; the timer
/// starts the next).
pub const API_HOSTS_RUN_BOUND: std::time::Duration = std::time::Duration::from_secs(120);

/// How often a worker of a cluster without DNS records reads the API servers' addresses again:
/// a replaced control plane is in its hosts file within this (plus protokube's pass).
pub const API_HOSTS_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);

/// `keelson-api-hosts.timer`: runs [`api_hosts`] every [`API_HOSTS_INTERVAL`] (a few seconds of jitter).
pub fn api_hosts_timer() -> Timer {
    Timer {
        unit: UnitSection { description: "Run keelson-api-hosts.service periodically".into(), ..Default::default() },
        every: API_HOSTS_INTERVAL,
        jitter: API_HOSTS_INTERVAL / 6,
        accuracy: Some(std::time::Duration::from_secs(1)),
        install: multi_user(),
    }
}

/// The metadata server's address on GCE (and AWS): `metadata.google.internal`.
pub const METADATA_ADDRESS: &str = "169.254.169.254/32";

/// The `iptables` arguments of the metadata concealment rule: packets from the pod network
/// (`pod_cidr`) to the metadata server are dropped in `mangle PREROUTING`, before routing, so
/// whether the server is on the host or beyond it, and whatever the CNI accepts later in
/// `filter`, pods never reach it. Host processes (the kubelet, nodeup, protokube, host-network
/// pods) send from the host and never pass PREROUTING: they keep it. GKE's metadata concealment
/// has the same effect.
pub fn metadata_concealment_rule(pod_cidr: &str) -> String {
    format!("-t mangle PREROUTING -s {pod_cidr} -d {METADATA_ADDRESS} -j DROP")
}

/// `keelson-metadata-concealment.service`: puts [`metadata_concealment_rule`] first in its chain
/// unless it is there (a CNI that inserts its own rules later cannot move ahead of a DROP that
/// ends the packet, and the timer checks again).
pub fn metadata_concealment(pod_cidr: &str) -> Unit {
    let rule = metadata_concealment_rule(pod_cidr);
    let (table_chain, matches) = rule.split_at(rule.find(" -s ").unwrap_or(rule.len()));
    Unit {
        unit: UnitSection {
            description: "Keelson: pods may not reach the instance metadata server (metadata concealment)".into(),
            documentation: None,
            after: vec!["network-pre.target".into()],
            wants: vec![],
        },
        service: ServiceSection {
            type_: Some("oneshot".into()),
            exec_start: format!(
                "/bin/sh -c 'iptables -w 5 {table} -C {chain}{matches} 2>/dev/null || iptables -w 5 {table} -I {chain} 1{matches}'",
                table = &table_chain[..table_chain.rfind(' ').unwrap_or(0)],
                chain = table_chain.rsplit(' ').next().unwrap_or("PREROUTING"),
            ),
            // Two iptables calls that wait for the xtables lock 5 s each.
            timeout_start_sec: Some("60s".into()),
            ..Default::default()
        },
        install: InstallSection::default(),
    }
}

/// `keelson-metadata-concealment.timer`: checks the rule again every minute.
pub fn metadata_concealment_timer() -> Timer {
    Timer {
        unit: UnitSection { description: "Check the metadata concealment rule periodically".into(), ..Default::default() },
        every: std::time::Duration::from_secs(60),
        jitter: std::time::Duration::from_secs(5),
        accuracy: Some(std::time::Duration::from_secs(1)),
        install: multi_user(),
    }
}

fn multi_user() -> InstallSection {
    InstallSection { wanted_by: vec!["multi-user.target".into()] }
}

/// containerd.service
pub fn containerd() -> Unit {
    Unit {
        unit: UnitSection {
            description: "containerd container runtime".into(),
            documentation: Some("https://containerd.io".into()),
            after: vec!["network.target".into(), "dbus.service".into()],
            wants: vec![],
        },
        service: ServiceSection {
            type_: Some("notify".into()),
            environment_files: vec!["-/etc/sysconfig/containerd".into(), "-/etc/environment".into()],
            exec_start_pre: vec!["-/sbin/modprobe overlay".into()],
            exec_start: format!("{} -c {}", crate::paths::CONTAINERD_BIN, crate::paths::CONTAINERD_CONFIG),
            restart: Some("always".into()),
            restart_sec: Some("5".into()),
            delegate: Some(true),
            kill_mode: Some("process".into()),
            limits: vec![
                ("LimitNPROC".into(), "infinity".into()),
                ("LimitCORE".into(), "infinity".into()),
                ("LimitNOFILE".into(), "1048576".into()),
                ("TasksMax".into(), "infinity".into()),
            ],
            oom_score_adjust: Some(-999),
            ..Default::default()
        },
        install: multi_user(),
    }
}

/// `kubelet.service`, the base unit (kubeadm's): how the kubelet runs, not with what; its command
/// line is [`kubelet_drop_in`]'s.
pub fn kubelet() -> Unit {
    Unit {
        unit: UnitSection {
            description: "Kubernetes Kubelet Server".into(),
            documentation: Some("https://github.com/kubernetes/kubernetes".into()),
            after: vec!["containerd.service".into()],
            wants: vec![],
        },
        service: ServiceSection {
            exec_start: crate::paths::KUBELET_BIN.into(),
            restart: Some("always".into()),
            restart_sec: Some("2s".into()),
            start_limit_interval: Some("0".into()),
            kill_mode: Some("process".into()),
            user: Some("root".into()),
            cpu_accounting: Some(true),
            memory_accounting: Some(true),
            ..Default::default()
        },
        install: multi_user(),
    }
}

/// A drop-in (`<unit>.d/<name>.conf`) that sets a service's command line: `ExecStart=` empties the
/// list the unit and earlier drop-ins set, the next line is the command. Environment files are
/// read in order, a later one's variable winning; a `-` prefix: the file may be absent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecDropIn {
    /// Comment lines at the top (without `# `).
    pub comment: Vec<String>,
    pub environment_files: Vec<String>,
    pub exec_start: String,
}

impl ExecDropIn {
    pub fn render(&self) -> String {
        let mut o = Ini(self.comment.iter().map(|c| format!("# {c}\n")).collect());
        o.0.push_str("[Service]\n");
        for f in &self.environment_files {
            o.kv("EnvironmentFile", f);
        }
        o.kv("ExecStart", "");
        o.kv("ExecStart", &self.exec_start);
        o.0
    }
}

/// `kubelet.service.d/10-keelson.conf`: the kubelet's command line, as kubeadm's `10-kubeadm.conf` and
/// EKS' nodeadm write it: nodeup's flags (`$DAEMON_ARGS`, [`crate::paths::KUBELET_SYSCONFIG`]) then the
/// site's (`$KUBELET_EXTRA_ARGS`, [`crate::paths::KUBELET_SITE_ENV`], which nodeup never writes:
/// they survive every run, and a later flag of the same name wins).
pub fn kubelet_drop_in() -> ExecDropIn {
    use crate::paths::{KUBELET_BIN, KUBELET_SITE_ENV, KUBELET_SYSCONFIG};
    ExecDropIn {
        comment: vec![
            "Written by nodeup (Keelson), rewritten on every run. Site flags: KUBELET_EXTRA_ARGS=\"...\" in".into(),
            format!("{KUBELET_SITE_ENV}; site KubeletConfiguration fragments: {}/*.conf.", crate::paths::KUBELET_CONFIG_DIR),
        ],
        environment_files: vec![KUBELET_SYSCONFIG.into(), format!("-{KUBELET_SITE_ENV}")],
        exec_start: format!("{KUBELET_BIN} $DAEMON_ARGS $KUBELET_EXTRA_ARGS"),
    }
}

/// protokube.service (control-plane hosts): claims etcd volumes, writes etcd manifests, DNS.
///
/// Stopped before the kubelet, containerd and the network (systemd stops units in the reverse order
/// of `After=`): when it stops, protokube hands etcd leadership over while etcd and its peers still
/// serve (up to 20 s; `TimeoutStopSec` leaves room above that). `KillMode=mixed`: SIGTERM goes to
/// protokube alone, which decides when it is done; whatever it started is killed after it exits.
pub fn protokube(boot_config_path: &str) -> Unit {
    Unit {
        unit: UnitSection {
            description: "Keelson protokube: etcd volumes, etcd manifests and DNS for the control plane".into(),
            documentation: Some("https://github.com/kubernetes/kops".into()),
            // Not after containerd or the kubelet: protokube claims the etcd volumes while they
            // start (its image pulls retry until containerd answers). At shutdown the containers
            // wait for it instead ([`containers_after_protokube`]).
            after: vec!["network-online.target".into()],
            wants: vec!["network-online.target".into()],
        },
        service: ServiceSection {
            exec_start: format!("{} --conf {boot_config_path}", crate::paths::PROTOKUBE_BIN),
            restart: Some("always".into()),
            restart_sec: Some("3s".into()),
            start_limit_interval: Some("0".into()),
            kill_mode: Some("mixed".into()),
            timeout_stop_sec: Some("30s".into()),
            // The node join server holds a connection per joining node (and turns floods away only
            // after accepting them): never run out of descriptors at the default 1024.
            limits: vec![("LimitNOFILE".into(), "65536".into())],
            ..Default::default()
        },
        install: multi_user(),
    }
}

/// A drop-in for every container scope (`cri-containerd-<id>.scope`, the systemd cgroup driver's
/// unit for each container): at shutdown, the containers stop only once protokube has.
///
/// At poweroff systemd stops every unit at once unless they are ordered. Without this, etcd and
/// kube-apiserver got SIGTERM at the same moment as protokube, so the API server refused
/// connections while the load balancer still sent clients to it, and protokube handed etcd
/// leadership over from a member already stopping. With it, protokube leaves the API target
/// group, waits for the load balancer to stop sending new connections, hands leadership over and
/// ends the API server and etcd itself (protokube's `poweroff` module); only then are the scopes
/// stopped. `Before=`, because systemd stops units in the reverse of their start order (a scope
/// `After=` protokube would stop first, and protokube would wait for it). A stopped or restarted
/// protokube alone orders nothing: ordering applies only to jobs present at the same time.
pub fn containers_after_protokube() -> String {
    "# Written by nodeup (Keelson). Containers stop after protokube at shutdown: it takes this control\n\
     # plane out of the API load balancer and hands etcd leadership over first.\n\
     [Unit]\nBefore=protokube.service\n"
        .to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn renders_sections_in_order() {
        let s = super::kubelet().render();
        assert!(s.starts_with("[Unit]\nDescription=Kubernetes Kubelet Server\n"), "{s}");
        assert!(s.contains("\n[Service]\nExecStart=/usr/local/bin/kubelet\nRestart=always\n"), "{s}");
        assert!(s.ends_with("[Install]\nWantedBy=multi-user.target\n"), "{s}");
        let d = super::kubelet_drop_in().render();
        assert!(
            d.ends_with("\n[Service]\nEnvironmentFile=/etc/sysconfig/kubelet\nEnvironmentFile=-/etc/default/kubelet\nExecStart=\nExecStart=/usr/local/bin/kubelet $DAEMON_ARGS $KUBELET_EXTRA_ARGS\n"),
            "{d}"
        );
        assert!(d.lines().take_while(|l| !l.starts_with('[')).all(|l| l.starts_with("# ")), "{d}");
    }

    #[test]
    fn protokube_starts_at_once_and_the_containers_stop_after_it() {
        let s = super::protokube("/etc/keelson/bootconfig.yaml").render();
        // Not held behind containerd's or the kubelet's start, and not killed mid-hand-over.
        assert!(s.contains("\nAfter=network-online.target\n"), "{s}");
        assert!(s.contains("\nKillMode=mixed\nTimeoutStopSec=30s\n"), "{s}");
        // The containers (etcd, kube-apiserver) stop after protokube (stop order is the reverse of Before=).
        let d = super::containers_after_protokube();
        assert!(d.contains("\n[Unit]\nBefore=protokube.service\n"), "{d}");
        // The kubelet and containerd are not ordered after protokube: they stop with it, so the
        // kubelet cannot restart what protokube ends.
        for unit in [super::kubelet().render(), super::containerd().render()] {
            assert!(!unit.contains("protokube"), "{unit}");
        }
    }

    #[test]
    fn protokube_may_hold_many_connections() {
        let s = super::protokube("/etc/keelson/bootconfig.yaml").render();
        assert!(s.contains("\nLimitNOFILE=65536\n"), "{s}");
    }

    #[test]
    fn metadata_concealment_drops_the_pod_network_first_once() {
        let unit = super::metadata_concealment("100.96.0.0/11").render();
        let exec = unit.lines().find(|l| l.starts_with("ExecStart=")).expect("ExecStart");
        assert_eq!(
            exec,
            "ExecStart=/bin/sh -c 'iptables -w 5 -t mangle -C PREROUTING -s 100.96.0.0/11 -d 169.254.169.254/32 -j DROP 2>/dev/null || iptables -w 5 -t mangle -I PREROUTING 1 -s 100.96.0.0/11 -d 169.254.169.254/32 -j DROP'"
        );
        assert!(unit.contains("Type=oneshot"), "{unit}");
        assert!(super::metadata_concealment_timer().render().contains("OnUnitActiveSec=60"), "{}", super::metadata_concealment_timer().render());
    }

    #[test]
    fn renders_the_renewal_timer() {
        let t = super::nodeup_again_timer(std::time::Duration::from_secs(3600)).render();
        assert!(t.contains("\n[Timer]\nOnActiveSec=3600s\nOnUnitActiveSec=3600s\nRandomizedDelaySec=900s\n"), "{t}");
        assert!(t.ends_with("[Install]\nWantedBy=multi-user.target\n"), "{t}");
        let s = super::nodeup_again("/etc/keelson/bootconfig.yaml").render();
        assert!(s.contains("Type=oneshot\nExecStart=/opt/keelson/bin/nodeup --conf /etc/keelson/bootconfig.yaml\n"), "{s}");
    }

    #[test]
    fn every_service_a_timer_starts_has_a_bound() {
        // A oneshot run that never ends holds its timer's next run off for good (a renewal that
        // never comes): each one's whole run is bounded.
        for unit in [super::nodeup_again("/b"), super::api_hosts("/b"), super::metadata_concealment("100.96.0.0/11")] {
            let text = unit.render();
            let bound = text.lines().find_map(|l| l.strip_prefix("TimeoutStartSec=")).unwrap_or_else(|| panic!("no TimeoutStartSec: {text}"));
            let secs: u64 = bound.strip_suffix('s').and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{bound}"));
            assert!(secs > 0 && secs <= 3 * 3600, "{text}");
        }
        let renewal = super::nodeup_again("/b").render();
        assert!(renewal.contains(&format!("TimeoutStartSec={}s", crate::model::BOOT_WAIT.as_secs() + 900)), "longer than the join's own wait: {renewal}");
    }
}
