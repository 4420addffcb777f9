//! A member's part in `keelson etcd backup restore` ([`base::etcd_backup::RestoreRequest`]), run
//! inside the reconcile pass (which owns the volume and the manifest), one step per pass:
//!
//! 1. **Stop** — remove the etcd manifest (the kubelet stops the member), wait until nothing
//!    listens on the member's client port, move the data directory aside
//!    (`data-before-restore-<request>`: never deleted before the restored cluster is healthy), and
//!    report `Stopped`.
//! 2. **Restore** (once every member stopped) — download the backup and check its sha256, restore it
//!    with `etcdutl snapshot restore` ([`RestoreTool`]: on the host, or from the member's own etcd
//!    image through containerd, or etcdctl 3.4's) into a fresh directory under a new cluster token,
//!    rename that into place, report `Restored`; the reconcile pass then writes the same manifest as
//!    before and the member starts on the restored data.
//! 3. Report `Healthy` with the revision once the local member serves in a cluster of every member.
//! 4. **Complete** — delete the moved-aside data.
//!
//! Every step checks what is already done (a progress file on the volume, then the directories), so
//! a pass killed at any point is finished by the next.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base::etcd_backup::{BackupId, BackupStore, MemberState, MemberStatus, RestorePhase, RestoreRequest};
use serde::{Deserialize, Serialize};

use crate::config::EtcdCluster;
use crate::manifest::{Bootstrap, ClusterState, BOOTSTRAP_FILE};

#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("restore {request} of etcd {cluster}: {path}: {source}")]
    Io { request: String, cluster: String, path: String, source: std::io::Error },
    #[error("restore {request} of etcd {cluster}: {source}")]
    Store { request: String, cluster: String, source: Box<base::etcd_backup::BackupError> },
    #[error("restore {request} of etcd {cluster}: {message}")]
    Tool { request: String, cluster: String, message: String },
}

/// What the reconcile pass does next with this etcd cluster.
#[derive(Debug, PartialEq, Eq)]
pub enum Gate {
    /// Write the manifest as usual.
    Proceed,
    /// Write the manifest as usual; this member's restore is done but the request is not (the
    /// member reports its health, then cleans up once the request completes).
    ProceedRestoring,
    /// Leave the manifest alone (absent); the reason is reported as waiting.
    Hold(String),
}

impl Gate {
    /// Whether a restore request involving this member is in flight (the agent then passes again
    /// at once rather than after its converged interval: every phase waits on the next pass).
    pub fn restoring(&self) -> bool {
        !matches!(self, Gate::Proceed)
    }
}

/// Progress kept on the volume, one file per request.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Progress {
    moved_aside: bool,
    restored: bool,
    reported: Option<MemberState>,
    cleaned: bool,
}

/// What restores etcd snapshots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestoreTool {
    /// A binary on this host: `etcdutl` (3.5+) or `etcdctl` (3.4, API v3).
    Binary { path: PathBuf, etcdutl: bool },
    /// containerd's `ctr`, running `etcdutl` from the etcd cluster's own image (which the kubelet
    /// pulled to run the member) with the volume mounted: the utility always matches the server.
    Image { ctr: PathBuf },
}

impl RestoreTool {
    /// The tool for restoring a snapshot of an etcd at `version`, looked up when a restore runs
    /// (at protokube's start nodeup may still be installing containerd): `explicit` if given; else
    /// `etcdutl` from the member's own image through `ctr` (always the server's version); else
    /// `etcdutl` on `PATH`; else `etcdctl` (3.4's `snapshot restore`), but only for etcd before
    /// 3.6. etcd 3.6 reads its membership from the v3 store and finds none in what etcdctl 3.4
    /// writes: such a member panics ("failed to update; member unknown") as soon as the others
    /// publish their attributes, and the restore never completes (seen on a member whose protokube
    /// started before containerd was installed and so chose a host `etcdctl`).
    pub fn find(explicit: Option<&Path>, version: &str) -> Result<RestoreTool, String> {
        let on_path = crate::images::on_path;
        pick(explicit, on_path("ctr"), on_path("etcdutl"), on_path("etcdctl"), version)
    }

    pub fn describe(&self) -> String {
        match self {
            RestoreTool::Binary { path, .. } => path.display().to_string(),
            RestoreTool::Image { ctr } => format!("etcdutl in the etcd image (through {})", ctr.display()),
        }
    }
}

/// [`RestoreTool::find`] over what was found on `PATH`.
fn pick(explicit: Option<&Path>, ctr: Option<PathBuf>, etcdutl: Option<PathBuf>, etcdctl: Option<PathBuf>, version: &str) -> Result<RestoreTool, String> {
    if let Some(p) = explicit {
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if name == "ctr" {
            return Ok(RestoreTool::Image { ctr: p.to_path_buf() });
        }
        return Ok(RestoreTool::Binary { path: p.to_path_buf(), etcdutl: name.starts_with("etcdutl") });
    }
    if let Some(ctr) = ctr {
        return Ok(RestoreTool::Image { ctr });
    }
    if let Some(path) = etcdutl {
        return Ok(RestoreTool::Binary { path, etcdutl: true });
    }
    match etcdctl {
        Some(path) if version_before(version, (3, 6, 0)) => Ok(RestoreTool::Binary { path, etcdutl: false }),
        Some(path) => Err(format!(
            "no ctr or etcdutl on PATH, and {} (etcdctl's snapshot restore) writes data etcd {version} cannot start from (--etcd-restore-tool)",
            path.display()
        )),
        None => Err("no ctr, etcdutl or etcdctl on PATH (--etcd-restore-tool)".into()),
    }
}

/// Whether etcd `version` (`3.5.21`, `v3.6.12`) comes before `than`.
fn version_before(version: &str, than: (u64, u64, u64)) -> bool {
    let mut parts = version.trim_start_matches('v').split('.').map(|p| p.parse::<u64>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0), parts.next().unwrap_or(0)) < than
}

/// etcdutl learnt `--bump-revision`/`--mark-compacted` in 3.5.13.
fn version_bumps_revisions(version: &str) -> bool {
    !version_before(version, (3, 5, 13))
}

/// Everything one member's restore needs from the reconcile pass.
pub struct MemberRestore<'a> {
    pub ec: &'a EtcdCluster,
    pub cluster_name: &'a str,
    pub member: &'a str,
    /// The mounted volume (host path, under `--root`).
    pub mount: PathBuf,
    /// The etcd manifest (host path, under `--root`).
    pub manifest: PathBuf,
    pub store: BackupStore,
    /// `--etcd-restore-tool`; without it the tool is looked up when the restore runs
    /// ([`RestoreTool::find`]).
    pub tool: Option<PathBuf>,
    /// The local member, once restored (made only then: it reads the TLS files).
    pub local: Box<dyn Fn() -> Option<crate::etcd::Client> + Send + Sync + 'a>,
    /// Where the member's client port answers (to see it stopped).
    pub client_addr: std::net::SocketAddr,
    /// How long one pass waits for the member to stop.
    pub stop_timeout: Duration,
}

impl MemberRestore<'_> {
    fn io(&self, req: &RestoreRequest, path: &Path) -> impl Fn(std::io::Error) -> RestoreError + '_ {
        let (request, cluster, path) = (req.id.to_string(), self.ec.name.clone(), path.display().to_string());
        move |source| RestoreError::Io { request: request.clone(), cluster: cluster.clone(), path: path.clone(), source }
    }

    fn store_err(&self, req: &RestoreRequest) -> impl Fn(base::etcd_backup::BackupError) -> RestoreError + '_ {
        let (request, cluster) = (req.id.to_string(), self.ec.name.clone());
        move |source| RestoreError::Store { request: request.clone(), cluster: cluster.clone(), source: Box::new(source) }
    }

    fn progress_file(&self, req: &RestoreRequest) -> PathBuf {
        self.mount.join(format!("keelson-restore-{}.json", req.id))
    }

    pub fn aside_dir(&self, req: &RestoreRequest) -> PathBuf {
        self.mount.join(format!("data-before-restore-{}", req.id))
    }

    fn data_dir(&self) -> PathBuf {
        self.mount.join("data")
    }

    fn save(&self, req: &RestoreRequest, p: &Progress) -> Result<(), RestoreError> {
        let file = self.progress_file(req);
        let text = serde_json::to_vec_pretty(p).map_err(|e| self.io(req, &file)(e.into()))?;
        base::fs::write_atomic(&file, &text, 0o600, None).map_err(|e| self.io(req, &file)(e.source))
    }

    async fn report(
        &self,
        req: &RestoreRequest,
        p: &mut Progress,
        state: MemberState,
        detail: String,
        health: Option<(i64, String, usize)>,
    ) -> Result<(), RestoreError> {
        if p.reported == Some(state) {
            return Ok(());
        }
        let status = MemberStatus {
            request: req.id.to_string(),
            member: self.member.to_string(),
            state,
            at: base::etcd_backup::rfc3339(time::OffsetDateTime::now_utc()),
            detail,
            revision: health.as_ref().map(|h| h.0),
            cluster_id: health.as_ref().map(|h| h.1.clone()),
            started_members: health.map(|h| h.2),
        };
        self.store.put_member_status(&status).await.map_err(self.store_err(req))?;
        p.reported = Some(state);
        self.save(req, p)
    }

    /// One step; see the module documentation.
    pub async fn step(&self) -> Result<Gate, RestoreError> {
        let cluster = self.ec.name.clone();
        let Some(req) = self.store.restore_request().await.map_err(|source| RestoreError::Store { request: "-".into(), cluster, source: Box::new(source) })?
        else {
            return Ok(Gate::Proceed);
        };
        if !req.members.iter().any(|m| m == self.member) {
            return Ok(Gate::Proceed);
        }
        let file = self.progress_file(&req);
        let mut p: Progress = match std::fs::read(&file) {
            Ok(b) => serde_json::from_slice(&b).unwrap_or_default(),
            Err(_) => Progress::default(),
        };
        if req.phase == RestorePhase::Complete {
            if p.restored && !p.cleaned {
                let aside = self.aside_dir(&req);
                if aside.exists() {
                    std::fs::remove_dir_all(&aside).map_err(self.io(&req, &aside))?;
                    tracing::info!(etcd = %self.ec.name, request = %req.id, path = %aside.display(), "restore complete: removed the data moved aside");
                }
                p.cleaned = true;
                self.save(&req, &p)?;
            }
            return Ok(Gate::Proceed);
        }
        if p.restored {
            self.report_health(&req, &mut p).await?;
            return Ok(Gate::ProceedRestoring);
        }

        // 1. Stop serving.
        if self.manifest.exists() {
            std::fs::remove_file(&self.manifest).map_err(self.io(&req, &self.manifest))?;
            tracing::warn!(etcd = %self.ec.name, request = %req.id, backup = %req.backup, "restore: etcd manifest removed, member stopping");
        }
        if !self.wait_stopped().await {
            return Ok(Gate::Hold(format!(
                "restore {} of etcd {}: member {} still answers on {} after {:?}",
                req.id, self.ec.name, self.member, self.client_addr, self.stop_timeout
            )));
        }
        if !p.moved_aside {
            let (data, aside) = (self.data_dir(), self.aside_dir(&req));
            if data.exists() && !aside.exists() {
                std::fs::rename(&data, &aside).map_err(self.io(&req, &data))?;
                tracing::warn!(etcd = %self.ec.name, from = %data.display(), to = %aside.display(), "restore: data moved aside");
            }
            p.moved_aside = true;
            self.save(&req, &p)?;
        }
        self.report(&req, &mut p, MemberState::Stopped, "stopped; data moved aside".into(), None).await?;
        if req.phase == RestorePhase::Stop {
            return Ok(Gate::Hold(format!("restore {} of etcd {}: stopped, waiting for every member to stop", req.id, self.ec.name)));
        }

        // 2. Restore.
        let data = self.data_dir();
        if !data.exists() {
            if let Err(e) = self.restore_into(&req, &data).await {
                let _ = self.report(&req, &mut p, MemberState::Failed, e.to_string(), None).await;
                return Err(e);
            }
        }
        // The member's bootstrap record (and so its manifest) stays as it was: with a data directory
        // etcd ignores the initial-cluster flags (the new identity is in the restored data), and a
        // byte-identical manifest is the same static pod to the kubelet, which restarts it at once (a
        // changed pod would first wait for the API server, down with etcd, to delete its mirror pod).
        let bfile = self.mount.join(BOOTSTRAP_FILE);
        if !bfile.exists() {
            let all: Vec<(String, String)> =
                self.ec.members.iter().map(|m| (self.ec.member_id(&m.name), self.ec.peer_url(&m.name, self.cluster_name))).collect();
            let boot = Bootstrap { state: ClusterState::New, initial_cluster: all };
            let text = serde_json::to_string_pretty(&boot).map_err(|e| self.io(&req, &bfile)(e.into()))?;
            base::fs::write_atomic(&bfile, text.as_bytes(), 0o644, None).map_err(|e| self.io(&req, &bfile)(e.source))?;
        }
        p.restored = true;
        self.save(&req, &p)?;
        let _ = std::fs::remove_file(crate::paths::restore_download(&self.mount, &req.id));
        tracing::warn!(etcd = %self.ec.name, request = %req.id, backup = %req.backup, "restore: snapshot restored; member starting");
        self.report(&req, &mut p, MemberState::Restored, format!("restored from {}", req.backup), None).await?;
        Ok(Gate::ProceedRestoring)
    }

    /// Bounded wait until nothing accepts connections on the member's client port.
    async fn wait_stopped(&self) -> bool {
        let deadline = Instant::now() + self.stop_timeout;
        loop {
            let open = tokio::time::timeout(Duration::from_millis(500), tokio::net::TcpStream::connect(self.client_addr)).await;
            if !matches!(open, Ok(Ok(_))) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn restore_into(&self, req: &RestoreRequest, data: &Path) -> Result<(), RestoreError> {
        let tool_err = |message: String| RestoreError::Tool { request: req.id.to_string(), cluster: self.ec.name.clone(), message };
        let tool =
            &RestoreTool::find(self.tool.as_deref(), &self.ec.version).map_err(|why| tool_err(format!("nothing to restore the snapshot with: {why}")))?;
        tracing::info!(etcd = %self.ec.name, request = %req.id, tool = %tool.describe(), "restore: restoring the snapshot");
        let id = BackupId::parse(&req.backup).ok_or_else(|| tool_err(format!("{:?} is not a backup id", req.backup)))?;
        // Downloaded 0600 into a directory only root may enter (a snapshot holds every secret).
        let db = crate::paths::restore_download(&self.mount, &req.id);
        if let Some(dir) = db.parent() {
            base::fs::ensure_private_dir(dir).map_err(|e| self.io(req, &e.path)(e.source))?;
        }
        let meta = self.store.fetch(&id, &db).await.map_err(self.store_err(req))?;
        let partial = self.mount.join(format!("data.restore-{}.partial", req.id));
        if partial.exists() {
            std::fs::remove_dir_all(&partial).map_err(self.io(req, &partial))?;
        }
        let ic = self
            .ec
            .members
            .iter()
            .map(|m| format!("{}={}", self.ec.member_id(&m.name), self.ec.peer_url(&m.name, self.cluster_name)))
            .collect::<Vec<_>>()
            .join(",");
        let restore_args = vec![
            "snapshot".to_string(),
            "restore".to_string(),
            db.display().to_string(),
            format!("--name={}", self.ec.member_id(self.member)),
            format!("--initial-cluster={ic}"),
            format!("--initial-cluster-token={}", req.cluster_token(&self.ec.name, self.cluster_name)),
            format!("--initial-advertise-peer-urls={}", self.ec.peer_url(self.member, self.cluster_name)),
            format!("--data-dir={}", partial.display()),
        ];
        // Revisions jump ahead of anything a watcher has seen and the old ones read as compacted:
        // API servers re-list instead of trusting a cache newer than the data.
        let bump = ["--bump-revision=1000000000".to_string(), "--mark-compacted".to_string()];
        let mut cmd = match tool {
            RestoreTool::Binary { path, etcdutl } => {
                let mut cmd = tokio::process::Command::new(path);
                cmd.args(&restore_args).env("ETCDCTL_API", "3");
                if *etcdutl && supports_bump(path).await {
                    cmd.args(&bump);
                }
                cmd
            }
            RestoreTool::Image { ctr } => {
                let id = format!("keelson-etcd-restore-{}-{}", self.ec.name, req.id);
                // A run killed earlier may have left its container behind.
                for args in [vec!["tasks", "kill", "-s", "SIGKILL", &id], vec!["tasks", "rm", "-f", &id], vec!["containers", "rm", &id]] {
                    let _ = crate::images::ctr_command(ctr).args(&args).output().await;
                }
                crate::images::ensure_image(ctr, &self.ec.image).await.map_err(tool_err)?;
                let mount = self.mount.display().to_string();
                let mut cmd = crate::images::ctr_command(ctr);
                cmd.args(["run", "--rm", "--mount"])
                    .arg(format!("type=bind,src={mount},dst={mount},options=rbind:rw"))
                    .arg(&self.ec.image)
                    .arg(&id)
                    .arg("/usr/local/bin/etcdutl")
                    .args(&restore_args);
                if version_bumps_revisions(&self.ec.version) {
                    cmd.args(&bump);
                }
                cmd
            }
        };
        cmd.kill_on_drop(true);
        let out = cmd.output().await.map_err(|e| tool_err(format!("running {}: {e}", tool.describe())))?;
        if !out.status.success() {
            return Err(tool_err(format!(
                "{} snapshot restore of backup {} ({} bytes, revision {}) failed: {}",
                tool.describe(),
                meta.id,
                meta.size,
                meta.revision,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        std::fs::rename(&partial, data).map_err(self.io(req, &partial))?;
        Ok(())
    }

    async fn report_health(&self, req: &RestoreRequest, p: &mut Progress) -> Result<(), RestoreError> {
        if p.reported == Some(MemberState::Healthy) || req.phase != RestorePhase::Restore {
            return Ok(());
        }
        let Some(client) = (self.local)() else { return Ok(()) };
        let (Ok(status), Ok(members)) = (client.status().await, client.members().await) else { return Ok(()) };
        let started = members.iter().filter(|m| !m.name.is_empty()).count();
        if started < self.ec.members.len() || status.leader.is_empty() || status.leader == "0" {
            return Ok(());
        }
        let detail = format!("serving revision {} in cluster {}", status.revision, status.cluster_id);
        self.report(req, p, MemberState::Healthy, detail, Some((status.revision, status.cluster_id, started))).await
    }
}

async fn supports_bump(tool: &Path) -> bool {
    match tokio::process::Command::new(tool).args(["snapshot", "restore", "--help"]).output().await {
        Ok(out) => String::from_utf8_lossy(&out.stdout).contains("--bump-revision") || String::from_utf8_lossy(&out.stderr).contains("--bump-revision"),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{EtcdMember, Ports};
    use base::store::StateStore;

    fn ec() -> EtcdCluster {
        EtcdCluster {
            name: "main".into(),
            members: vec![EtcdMember { name: "a".into(), instance_group: "cp-a".into() }],
            ports: Ports { peer: 2380, client: 4001 },
            image: "registry.k8s.io/etcd:3.5.21-0".into(),
            tls: true,
            client_cert_auth: true,
            cpu_request: None,
            memory_request: None,
            heartbeat_ms: None,
            election_ms: None,
            version: "3.5.21".into(),
            backup_store: String::new(),
            backup_interval: Duration::from_secs(900),
            backup_retention_days: 90,
            backup_hourly_retention: keelson_api::etcd_manager::DEFAULT_HOURLY_RETENTION,
        }
    }

    /// Whoever can write `control/restore.json` chooses the request id, which the member puts into
    /// host paths as root. An earlier restore `x` left `data-before-restore-x` on the volume; a
    /// request with id `x/../../escape` would move the member's data out of its volume (and in the
    /// Complete phase delete any directory). The request is refused when read, and nothing moves.
    #[tokio::test]
    async fn a_request_id_that_leaves_the_volume_is_refused() {
        let d = tempfile::tempdir().expect("tempdir");
        let mount = d.path().join("vol").join("mnt");
        std::fs::create_dir_all(mount.join("data")).expect("data");
        std::fs::create_dir_all(mount.join("data-before-restore-x")).expect("an earlier restore's");
        let store_dir = d.path().join("backups");
        std::fs::create_dir_all(store_dir.join("control")).expect("control");
        let evil = serde_json::json!({
            "id": "x/../../escape", "backup": "2026-11-24T10:41:18Z-000042", "phase": "Stop", "members": ["a"],
            "requestedAt": "2026-12-02T00:00:00Z", "requestedBy": "mallory",
        });
        std::fs::write(store_dir.join(base::etcd_backup::RESTORE_REQUEST), evil.to_string()).expect("request");
        // A port nothing listens on: the member reads as stopped at once.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr");
        let ec = ec();
        let r = MemberRestore {
            ec: &ec,
            cluster_name: "c.example.com",
            member: "a",
            mount: mount.clone(),
            manifest: d.path().join("etcd-main.manifest"),
            store: BackupStore::new(StateStore::dir(&store_dir)),
            tool: None,
            local: Box::new(|| None),
            client_addr: closed,
            stop_timeout: Duration::from_secs(1),
        };
        let err = r.step().await.expect_err("a request id with '/' is refused");
        let text = err.to_string();
        assert!(text.contains("restore.json") && text.contains("x/../../escape"), "{text}");
        assert!(mount.join("data").is_dir(), "the member's data stays where it is");
        assert!(!d.path().join("vol").join("escape").exists(), "nothing is written outside the volume");
    }

    #[test]
    fn revision_bumps_from_3_5_13() {
        for (v, want) in [("3.4.23", false), ("3.5.12", false), ("3.5.13", true), ("v3.5.21", true), ("3.6.12", true), ("4.0.0", true)] {
            assert_eq!(version_bumps_revisions(v), want, "{v}");
        }
    }

    #[test]
    fn explicit_tools() {
        assert_eq!(RestoreTool::find(Some(Path::new("/usr/bin/ctr")), "3.6.12"), Ok(RestoreTool::Image { ctr: "/usr/bin/ctr".into() }));
        assert_eq!(RestoreTool::find(Some(Path::new("/x/etcdutl")), "3.6.12"), Ok(RestoreTool::Binary { path: "/x/etcdutl".into(), etcdutl: true }));
        assert_eq!(RestoreTool::find(Some(Path::new("/x/etcdctl")), "3.4.30"), Ok(RestoreTool::Binary { path: "/x/etcdctl".into(), etcdutl: false }));
    }

    #[test]
    fn the_members_own_image_first_and_etcdctl_never_for_etcd_3_6() {
        let p = |s: &str| Some(PathBuf::from(s));
        let image = RestoreTool::Image { ctr: "/usr/local/bin/ctr".into() };
        assert_eq!(pick(None, p("/usr/local/bin/ctr"), p("/usr/bin/etcdutl"), p("/usr/bin/etcdctl"), "3.6.12"), Ok(image));
        assert_eq!(
            pick(None, None, p("/usr/bin/etcdutl"), p("/usr/bin/etcdctl"), "3.6.12"),
            Ok(RestoreTool::Binary { path: "/usr/bin/etcdutl".into(), etcdutl: true })
        );
        assert_eq!(pick(None, None, None, p("/usr/bin/etcdctl"), "3.5.21"), Ok(RestoreTool::Binary { path: "/usr/bin/etcdctl".into(), etcdutl: false }));
        // What a control plane whose protokube started before containerd was installed chose, and
        // whose member then panicked after every restore.
        let refused = pick(None, None, None, p("/usr/bin/etcdctl"), "v3.6.12").expect_err("etcdctl 3.4 for etcd 3.6");
        assert!(refused.contains("/usr/bin/etcdctl") && refused.contains("3.6.12"), "{refused}");
        assert!(pick(None, None, None, None, "3.6.12").is_err());
    }
}
