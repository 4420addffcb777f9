//! protokube's command line: every flag, its name and its default. `main` parses it; each
//! controller takes the settings it needs from it.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

#[derive(Debug, Parser)]
#[command(name = "protokube", args_override_self = true, about = "Claim and mount etcd volumes, write etcd manifests, keep control-plane DNS true")]
pub struct Args {
    /// BootConfig written by user-data (names the ConfigBase, cluster and instance group).
    #[arg(long)]
    pub conf: PathBuf,
    /// Every host path is taken relative to this directory.
    #[arg(long, default_value = "/")]
    pub root: PathBuf,
    /// One reconcile pass, then exit.
    #[arg(long)]
    pub once: bool,
    /// Identity overrides (default: IMDSv2).
    #[arg(long)]
    pub instance_id: Option<String>,
    #[arg(long)]
    pub zone: Option<String>,
    #[arg(long)]
    pub region: Option<String>,
    #[arg(long)]
    pub internal_ip: Option<String>,
    /// This control plane's Node name (default: IMDS `local-hostname`, the kubelet's name).
    #[arg(long)]
    pub node_name: Option<String>,
    /// IMDS base URL (default http://169.254.169.254 or AWS_EC2_METADATA_SERVICE_ENDPOINT); on GCE
    /// the metadata server (default GCE_METADATA_HOST, else metadata.google.internal).
    #[arg(long)]
    pub imds_url: Option<String>,
    /// AWS endpoint (e.g. a local moto server); AWS_ENDPOINT_URL is honoured too. On GCE the base
    /// URL of Compute (`<url>/compute/v1`) and Cloud DNS (`<url>/dns/v1`), e.g. the emulators'.
    #[arg(long)]
    pub endpoint_url: Option<String>,
    /// Where volume device links appear (NVMe names).
    #[arg(long, default_value = crate::paths::DEFAULT_BY_ID_DIR)]
    pub by_id_dir: PathBuf,
    /// Hosts file for the hosts-file DNS provider (default: <root>/etc/hosts).
    #[arg(long)]
    pub hosts_file: Option<PathBuf>,
    /// Seconds between passes when converged.
    #[arg(long, default_value_t = 5.0)]
    pub interval: f64,
    /// Longest wait after repeated failures, in seconds.
    #[arg(long, default_value_t = 60.0)]
    pub max_backoff: f64,
    /// Seconds one pass waits for an attachment.
    #[arg(long, default_value_t = 60.0)]
    pub attach_timeout: f64,
    /// Seconds one pass waits for the device node.
    #[arg(long, default_value_t = 30.0)]
    pub device_timeout: f64,
    /// Seconds between re-reads of this group's protokube config (the compiler's plan) in loop mode.
    #[arg(long, default_value_t = 60.0)]
    pub spec_interval: f64,
    /// Metrics and health address (loop mode); `off` disables.
    #[arg(long, default_value_t = format!("127.0.0.1:{}", keelson_api::ports::PROTOKUBE_METRICS))]
    pub metrics_addr: String,
    /// Seconds between addon-controller passes (loop mode).
    #[arg(long, default_value_t = 20.0)]
    pub addons_interval: f64,
    /// Do not run the addon controller.
    #[arg(long)]
    pub no_addons: bool,
    /// Do not label Nodes with their instance group's labels (loop mode; AWS and GCE).
    #[arg(long)]
    pub no_node_labels: bool,
    /// Where the node join server listens (workers prove their instance identity and get their
    /// kubelet and kube-proxy certificates); `off` disables it.
    #[arg(long, default_value_t = format!("0.0.0.0:{}", keelson_api::ports::NODE_JOIN))]
    pub join_listen: String,
    /// GCE: where the join server reads Google's token-signing keys (a JWK set, cached); `$KEELSON_GCE_JWKS_URL`
    /// names another (an emulator's).
    #[arg(long, env = base::node_join_gce::JWKS_URL_ENV, default_value = base::node_join_gce::GOOGLE_JWKS_URL)]
    pub gce_jwks_url: String,
    /// Seconds between checks of the etcd backup schedule and of backup requests (loop mode).
    #[arg(long, default_value_t = 10.0)]
    pub backup_poll: f64,
    /// Take no etcd backups on this instance.
    #[arg(long)]
    pub no_backups: bool,
    /// The tool that restores etcd snapshots: an `etcdutl` or `etcdctl` binary, or `ctr` to run
    /// `etcdutl` from the member's etcd image (default: `etcdutl`, `ctr`, `etcdctl`, on PATH).
    #[arg(long)]
    pub etcd_restore_tool: Option<PathBuf>,
    /// Seconds one pass waits for an etcd member to stop before a restore moves its data aside.
    #[arg(long, default_value_t = 60.0)]
    pub stop_timeout: f64,
    /// Seconds a member on a blank volume waits for a peer before it reports lost quorum (and
    /// points at `keelson etcd backup restore`).
    #[arg(long, default_value_t = 300.0)]
    pub quorum_loss_wait: f64,
    /// Seconds one reconcile pass may take before it is abandoned (it is level-triggered: the next
    /// pass continues from what is there).
    #[arg(long, default_value_t = 600.0)]
    pub pass_timeout: f64,
    /// Longest wait, in seconds, between checks of this host's certificates (loop mode); the next
    /// check comes sooner when a renewal falls due sooner.
    #[arg(long, default_value_t = 300.0)]
    pub cert_check_interval: f64,
    /// Longest time, in seconds, protokube spends handing etcd leadership over when it is stopped
    /// (SIGTERM or SIGINT, loop mode) before it exits; protokube.service's TimeoutStopSec is above
    /// the default.
    #[arg(long, default_value_t = crate::handover::DEFAULT_BOUND.as_secs_f64())]
    pub handover_timeout: f64,
    /// Seconds the API server keeps serving at poweroff after this control plane left the API
    /// target group, for the load balancer to stop sending it new connections (overlaps the etcd
    /// hand-over; see protokube's README).
    #[arg(long, default_value_t = crate::poweroff::API_DRAIN.as_secs_f64())]
    pub api_drain_seconds: f64,
}

/// A flag's seconds as a duration (negative: zero).
pub fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s.max(0.0))
}

impl Args {
    /// The GCE side of the flags: `--imds-url` names the metadata server, `--endpoint-url` the base of
    /// Compute and Cloud DNS.
    pub fn gce_flags(&self) -> crate::gce::GceFlags {
        crate::gce::GceFlags {
            metadata: self.imds_url.clone(),
            endpoint: self.endpoint_url.clone(),
            instance_name: self.instance_id.clone(),
            zone: self.zone.clone(),
            region: self.region.clone(),
            internal_ip: self.internal_ip.clone(),
            node_name: self.node_name.clone(),
            operation_bound: secs(self.attach_timeout),
        }
    }

    /// A live host (root `/`), not a test's directory.
    pub fn live(&self) -> bool {
        self.root == std::path::Path::new("/")
    }

    /// The hosts file for the hosts-file DNS provider: `--hosts-file`, else `<root>/etc/hosts`.
    pub fn hosts_file(&self) -> PathBuf {
        self.hosts_file.clone().unwrap_or_else(|| crate::paths::under(&self.root, crate::paths::HOSTS_FILE))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_keeps_its_name_and_default() {
        let a = Args::try_parse_from(["protokube", "--conf", "/b.yaml"]).expect("parse");
        assert_eq!((a.interval, a.max_backoff, a.spec_interval, a.addons_interval), (5.0, 60.0, 60.0, 20.0));
        assert_eq!(a.metrics_addr, "127.0.0.1:3998");
        assert_eq!(a.join_listen, "0.0.0.0:3988");
        assert_eq!(a.hosts_file(), PathBuf::from("/etc/hosts"));
        assert!(a.live() && !a.once && !a.no_addons && !a.no_node_labels && !a.no_backups);
        let a = Args::try_parse_from([
            "protokube",
            "--conf",
            "c",
            "--root",
            "/r",
            "--once",
            "--instance-id",
            "i",
            "--zone",
            "z",
            "--region",
            "r",
            "--internal-ip",
            "10.0.0.1",
            "--node-name",
            "n",
            "--imds-url",
            "u",
            "--endpoint-url",
            "e",
            "--by-id-dir",
            "/d",
            "--hosts-file",
            "/h",
            "--interval",
            "1",
            "--max-backoff",
            "2",
            "--attach-timeout",
            "3",
            "--device-timeout",
            "4",
            "--spec-interval",
            "5",
            "--metrics-addr",
            "off",
            "--addons-interval",
            "6",
            "--no-addons",
            "--no-node-labels",
            "--join-listen",
            "off",
            "--gce-jwks-url",
            "j",
            "--backup-poll",
            "7",
            "--no-backups",
            "--etcd-restore-tool",
            "/t",
            "--stop-timeout",
            "8",
            "--quorum-loss-wait",
            "9",
            "--pass-timeout",
            "10",
            "--cert-check-interval",
            "11",
            "--handover-timeout",
            "12",
            "--api-drain-seconds",
            "13",
        ])
        .expect("every flag");
        assert!(!a.live());
        assert_eq!(a.gce_flags().operation_bound, Duration::from_secs(3));
        assert_eq!(a.hosts_file(), PathBuf::from("/h"));
        assert_eq!(secs(-1.0), Duration::ZERO);
    }
}
