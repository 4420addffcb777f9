//! Prometheus metrics (text format 0.0.4) and a health endpoint on a local port.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

#[derive(Debug, Default, Clone)]
pub struct State {
    pub passes_ok: u64,
    pub passes_failed: u64,
    pub last_duration: Duration,
    pub last_success_unix: f64,
    pub last_error: Option<String>,
    pub waiting: Vec<String>,
    /// The last pass found an etcd member here without its volume mounted.
    pub unmounted: bool,
    pub volumes_mounted: u64,
    pub volumes_formatted: u64,
    pub manifests_written: u64,
    pub dns_changes: u64,
    pub mounted_now: u64,
    /// Addons applied (a hash changed), objects applied and pruned, failed addon passes.
    pub addon_applies: u64,
    pub addon_objects_applied: u64,
    pub addon_objects_pruned: u64,
    pub addon_failures: u64,
    /// Addon passes that completed (whether or not anything changed).
    pub addon_passes: u64,
    /// Node joins admitted and refused by the join server.
    pub node_joins_admitted: u64,
    pub node_joins_refused: u64,
    /// Refused joins and turned-away connections, by reason (`account`, `role`, `challenge`,
    /// `rate-limited`, …).
    pub node_join_refusals: std::collections::BTreeMap<String, u64>,
    /// `service/operation` → (calls, attempts).
    pub cloud_calls: Vec<(String, u64, u64)>,
    /// etcd backups written by this instance, per etcd cluster.
    pub backups: std::collections::BTreeMap<String, BackupStats>,
    /// The certificates on this host (`<bundle>/<cert>`) → their `notAfter`, as the last renewal
    /// pass left them.
    pub certificates: std::collections::BTreeMap<String, SystemTime>,
    /// Certificate bundles renewed, and renewal attempts that failed.
    pub certificate_renewals: u64,
    pub certificate_renewal_failures: u64,
    /// Nodes patched with their instance group's labels, and Nodes not labelled, by reason
    /// (`no-instance`, `group`, `provider-id`, `cloud`, `patch`, …).
    pub nodes_labelled: u64,
    pub node_label_failures: std::collections::BTreeMap<String, u64>,
    /// Token mode: bootstrap tokens minted here, token passes that failed, and the current token's
    /// expiry (Unix seconds; 0 before the first pass).
    pub bootstrap_token_rotations: u64,
    pub bootstrap_token_failures: u64,
    pub bootstrap_token_expiry_unix: f64,
    /// Token mode: bootstrap CSRs approved here, and denied, by reason (`control-plane`,
    /// `node-exists`, `instance`, `subject`, `usages`, `request`).
    pub bootstrap_csrs_approved: u64,
    pub bootstrap_csrs_denied: std::collections::BTreeMap<String, u64>,
}

#[derive(Debug, Default, Clone)]
pub struct BackupStats {
    pub total: u64,
    pub failures: u64,
    pub last_success_unix: f64,
    pub last_size: u64,
    pub last_duration: Duration,
}

#[derive(Debug, Default, Clone)]
pub struct Metrics {
    inner: Arc<Mutex<State>>,
}

/// Peak resident set size of this process (VmHWM), in KiB; 0 when unknown.
pub fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}

pub fn now_unix() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

impl Metrics {
    pub fn update(&self, f: impl FnOnce(&mut State)) {
        if let Ok(mut s) = self.inner.lock() {
            f(&mut s);
        }
    }
    pub fn snapshot(&self) -> State {
        self.inner.lock().map(|s| s.clone()).unwrap_or_default()
    }

    pub fn render(&self) -> String {
        let s = self.snapshot();
        let mut o = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, lines: Vec<(String, String)>| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, v) in lines {
                let _ = writeln!(o, "{name}{labels} {v}");
            }
        };
        metric(
            "protokube_reconcile_total",
            "counter",
            "Reconcile passes by result.",
            vec![("{result=\"ok\"}".into(), s.passes_ok.to_string()), ("{result=\"error\"}".into(), s.passes_failed.to_string())],
        );
        metric(
            "protokube_reconcile_duration_seconds",
            "gauge",
            "Duration of the last pass.",
            vec![(String::new(), format!("{:.6}", s.last_duration.as_secs_f64()))],
        );
        metric(
            "protokube_last_success_timestamp_seconds",
            "gauge",
            "Unix time of the last successful pass.",
            vec![(String::new(), format!("{:.3}", s.last_success_unix))],
        );
        metric("protokube_waiting", "gauge", "Things the last pass is waiting for.", vec![(String::new(), s.waiting.len().to_string())]);
        metric(
            "protokube_members_unmounted",
            "gauge",
            "1 while an etcd member on this host has no volume mounted (passes come every second then).",
            vec![(String::new(), u8::from(s.unmounted).to_string())],
        );
        metric("protokube_volumes_mounted", "gauge", "etcd volumes held and mounted now.", vec![(String::new(), s.mounted_now.to_string())]);
        metric("protokube_volume_mounts_total", "counter", "Mounts performed.", vec![(String::new(), s.volumes_mounted.to_string())]);
        metric("protokube_volume_formats_total", "counter", "Blank volumes formatted.", vec![(String::new(), s.volumes_formatted.to_string())]);
        metric("protokube_manifests_written_total", "counter", "etcd manifests written.", vec![(String::new(), s.manifests_written.to_string())]);
        metric("protokube_dns_changes_total", "counter", "DNS records changed.", vec![(String::new(), s.dns_changes.to_string())]);
        metric(
            "protokube_addon_applies_total",
            "counter",
            "Addons applied because their manifest hash changed.",
            vec![(String::new(), s.addon_applies.to_string())],
        );
        metric(
            "protokube_addon_objects_applied_total",
            "counter",
            "Addon objects server-side applied.",
            vec![(String::new(), s.addon_objects_applied.to_string())],
        );
        metric(
            "protokube_addon_objects_pruned_total",
            "counter",
            "Addon objects a newer version dropped, deleted.",
            vec![(String::new(), s.addon_objects_pruned.to_string())],
        );
        metric(
            "protokube_addon_passes_total",
            "counter",
            "Addon passes completed (all addons checked against their recorded hashes).",
            vec![(String::new(), s.addon_passes.to_string())],
        );
        metric("protokube_addon_failures_total", "counter", "Failed addon passes.", vec![(String::new(), s.addon_failures.to_string())]);
        metric(
            "protokube_node_joins_admitted_total",
            "counter",
            "Workers admitted by the node join server (certificates issued).",
            vec![(String::new(), s.node_joins_admitted.to_string())],
        );
        metric("protokube_node_joins_refused_total", "counter", "Node join requests refused.", vec![(String::new(), s.node_joins_refused.to_string())]);
        metric(
            "protokube_node_join_refusals_total",
            "counter",
            "Node join requests refused and connections turned away, by reason.",
            s.node_join_refusals.iter().map(|(r, n)| (format!("{{reason=\"{r}\"}}"), n.to_string())).collect(),
        );
        metric(
            "protokube_nodes_labelled_total",
            "counter",
            "Nodes patched with their instance group's labels.",
            vec![(String::new(), s.nodes_labelled.to_string())],
        );
        metric(
            "protokube_node_label_failures_total",
            "counter",
            "Nodes not labelled (the cloud did not vouch for their group, or the patch failed), by reason.",
            s.node_label_failures.iter().map(|(r, n)| (format!("{{reason=\"{r}\"}}"), n.to_string())).collect(),
        );
        metric(
            "protokube_bootstrap_token_rotations_total",
            "counter",
            "Bootstrap tokens minted and published by this instance (token mode).",
            vec![(String::new(), s.bootstrap_token_rotations.to_string())],
        );
        metric(
            "protokube_bootstrap_token_failures_total",
            "counter",
            "Bootstrap token passes that failed (token mode).",
            vec![(String::new(), s.bootstrap_token_failures.to_string())],
        );
        metric(
            "protokube_bootstrap_token_expiry_timestamp_seconds",
            "gauge",
            "When the published bootstrap token expires (token mode).",
            vec![(String::new(), s.bootstrap_token_expiry_unix.to_string())],
        );
        metric(
            "protokube_bootstrap_csrs_approved_total",
            "counter",
            "Workers' first client certificates approved (token mode).",
            vec![(String::new(), s.bootstrap_csrs_approved.to_string())],
        );
        metric(
            "protokube_bootstrap_csrs_denied_total",
            "counter",
            "Bootstrap CSRs denied, by reason (token mode).",
            s.bootstrap_csrs_denied.iter().map(|(r, n)| (format!("{{reason=\"{r}\"}}"), n.to_string())).collect(),
        );
        let per_cluster = |f: &dyn Fn(&BackupStats) -> String| -> Vec<(String, String)> {
            s.backups.iter().map(|(c, b)| (format!("{{etcd_cluster=\"{c}\"}}"), f(b))).collect()
        };
        metric("protokube_etcd_backups_total", "counter", "etcd backups written by this instance.", per_cluster(&|b| b.total.to_string()));
        metric("protokube_etcd_backup_failures_total", "counter", "etcd backups that failed here.", per_cluster(&|b| b.failures.to_string()));
        metric(
            "protokube_etcd_backup_last_success_timestamp_seconds",
            "gauge",
            "Unix time of the last backup written by this instance.",
            per_cluster(&|b| format!("{:.3}", b.last_success_unix)),
        );
        metric("protokube_etcd_backup_last_size_bytes", "gauge", "Size of the last backup written here.", per_cluster(&|b| b.last_size.to_string()));
        metric(
            "protokube_etcd_backup_last_duration_seconds",
            "gauge",
            "How long the last backup took (snapshot, upload, read-back check).",
            per_cluster(&|b| format!("{:.3}", b.last_duration.as_secs_f64())),
        );
        let now = SystemTime::now();
        metric(
            "keelson_certificate_expiry_seconds",
            "gauge",
            "Seconds until the certificate expires (negative once expired), per certificate on this host.",
            s.certificates
                .iter()
                .map(|(c, not_after)| {
                    let left = match not_after.duration_since(now) {
                        Ok(d) => d.as_secs_f64(),
                        Err(e) => -e.duration().as_secs_f64(),
                    };
                    (format!("{{cert=\"{c}\"}}"), format!("{left:.0}"))
                })
                .collect(),
        );
        metric(
            "protokube_certificate_renewals_total",
            "counter",
            "Certificate bundles reissued by the renewal pass.",
            vec![(String::new(), s.certificate_renewals.to_string())],
        );
        metric(
            "protokube_certificate_renewal_failures_total",
            "counter",
            "Certificate bundles the renewal pass failed to reissue.",
            vec![(String::new(), s.certificate_renewal_failures.to_string())],
        );
        metric(
            "protokube_cloud_api_calls_total",
            "counter",
            "Cloud API operations by service/operation.",
            s.cloud_calls.iter().map(|(k, c, _)| (format!("{{operation=\"{k}\"}}"), c.to_string())).collect(),
        );
        metric(
            "protokube_cloud_api_attempts_total",
            "counter",
            "Cloud API attempts (retries included) by service/operation.",
            s.cloud_calls.iter().map(|(k, _, a)| (format!("{{operation=\"{k}\"}}"), a.to_string())).collect(),
        );
        o
    }

    /// Healthy while the last pass succeeded recently.
    pub fn health(&self, max_age: Duration) -> (bool, String) {
        let s = self.snapshot();
        let age = now_unix() - s.last_success_unix;
        if s.passes_ok > 0 && age <= max_age.as_secs_f64() {
            (true, format!("ok: last successful pass {age:.1}s ago\n"))
        } else {
            (false, format!("unhealthy: last error: {}\n", s.last_error.unwrap_or_else(|| "no successful pass yet".into())))
        }
    }
}

/// Serve `/metrics` and `/healthz` until the process ends.
pub async fn serve(listener: TcpListener, metrics: Metrics, max_age: Duration) {
    loop {
        let Ok((mut sock, _)) = listener.accept().await else { continue };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 2048];
            let n = match tokio::time::timeout(Duration::from_secs(5), sock.read(&mut buf)).await {
                Ok(Ok(n)) => n,
                _ => return,
            };
            let req = String::from_utf8_lossy(&buf[..n]);
            let path = req.split_whitespace().nth(1).unwrap_or("/");
            let (status, ctype, body) = match path {
                "/metrics" => ("200 OK", "text/plain; version=0.0.4", metrics.render()),
                "/healthz" | "/health" => {
                    let (ok, msg) = metrics.health(max_age);
                    (if ok { "200 OK" } else { "503 Service Unavailable" }, "text/plain", msg)
                }
                _ => ("404 Not Found", "text/plain", "not found\n".to_string()),
            };
            let resp = format!("HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
            let _ = sock.write_all(resp.as_bytes()).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificate_expiry_per_certificate() {
        let m = Metrics::default();
        m.update(|s| {
            s.certificates.insert("etcd-main/peer".into(), SystemTime::now() + Duration::from_secs(86400));
            s.certificates.insert("kubelet/kubeconfig".into(), SystemTime::now() - Duration::from_secs(100));
            s.certificate_renewals = 2;
        });
        let text = m.render();
        let value = |cert: &str| -> f64 {
            let prefix = format!("keelson_certificate_expiry_seconds{{cert=\"{cert}\"}} ");
            let line = text.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("no {prefix}:\n{text}"));
            line[prefix.len()..].parse().expect("number")
        };
        assert!((86390.0..=86400.0).contains(&value("etcd-main/peer")));
        assert!((-110.0..=-100.0).contains(&value("kubelet/kubeconfig")), "expired: negative");
        assert!(text.contains("# TYPE keelson_certificate_expiry_seconds gauge"));
        assert!(text.contains("protokube_certificate_renewals_total 2"));
    }

    #[test]
    fn backup_metrics_per_etcd_cluster() {
        let m = Metrics::default();
        m.update(|s| {
            let b = s.backups.entry("main".into()).or_default();
            b.total = 3;
            b.failures = 1;
            b.last_size = 2048;
            b.last_success_unix = 1795516871.5;
            b.last_duration = Duration::from_millis(1250);
        });
        let text = m.render();
        for want in [
            "protokube_etcd_backups_total{etcd_cluster=\"main\"} 3",
            "protokube_etcd_backup_failures_total{etcd_cluster=\"main\"} 1",
            "protokube_etcd_backup_last_size_bytes{etcd_cluster=\"main\"} 2048",
            "protokube_etcd_backup_last_success_timestamp_seconds{etcd_cluster=\"main\"} 1795516871.500",
            "protokube_etcd_backup_last_duration_seconds{etcd_cluster=\"main\"} 1.250",
        ] {
            assert!(text.contains(want), "missing {want}:\n{text}");
        }
    }
}
