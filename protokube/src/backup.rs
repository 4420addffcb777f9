//! etcd backups: a snapshot streamed from a member to the cluster's backup store
//! ([`base::etcd_backup`]), scheduled every `backupInterval` on the member that leads, and on request
//! (`keelson etcd backup create`); each scheduled backup is followed by pruning per retention.
//!
//! One writer per etcd cluster: only the leader tries, and before it takes a backup it claims the
//! backup's slot with a compare-and-swap on one etcd key (through raft). Two members that both
//! think they lead — an old leader cut off, a control plane being replaced — cannot both win the
//! same slot.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base::etcd_backup::{BackupError, BackupId, BackupMeta, BackupRequestDone, BackupStore, RestorePhase, Retention};
use time::OffsetDateTime;

use crate::config::{EtcdCluster, Plan};
use crate::etcd::{self, EtcdError};
use crate::metrics::Metrics;
use crate::paths;

#[derive(Debug, thiserror::Error)]
pub enum BackupRunError {
    #[error("etcd {cluster}: {source}")]
    Etcd { cluster: String, source: EtcdError },
    #[error("etcd {cluster} backup store: {source}")]
    Store { cluster: String, source: Box<BackupError> },
    #[error("etcd {cluster} backup store {url}: {source}")]
    Open { cluster: String, url: String, source: Box<base::StoreError> },
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
}

/// The etcd key whose compare-and-swap decides who takes a backup.
pub fn claim_key(etcd_cluster: &str, what: &str) -> String {
    format!("/keelson.io/etcd-backups/{etcd_cluster}/{what}")
}

/// How long a claim on a requested backup holds. A claimer that crashed, or whose backup failed,
/// leaves the request to be taken over (by whichever member leads then) after this.
pub const REQUEST_CLAIM_TTL: Duration = Duration::from_secs(120);

/// The claim on request `id` made at `at` (unix seconds): `<id>@<at>`.
fn request_claim(id: &str, at: i64) -> String {
    format!("{id}@{at}")
}

/// Whether request `id` may be claimed at `now` over the current claim `current`: nobody claimed
/// it, the claim is on another request, or it is older than [`REQUEST_CLAIM_TTL`] (a value that
/// is not a claim holds nothing).
fn request_claimable(current: Option<&str>, id: &str, now: i64) -> bool {
    let Some((claimed, at)) = current.and_then(|c| c.rsplit_once('@')) else { return true };
    claimed != id || at.parse::<i64>().map_or(true, |at| now.saturating_sub(at) >= REQUEST_CLAIM_TTL.as_secs() as i64)
}

/// Time as protokube sees it; tests move it (feature `test-hooks`: `PROTOKUBE_TEST_NOW`).
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    offset: time::Duration,
}

impl Clock {
    pub fn real() -> Clock {
        Clock { offset: time::Duration::ZERO }
    }
    /// A clock that reads `start` now and runs at real speed from there.
    pub fn starting_at(start: OffsetDateTime) -> Clock {
        Clock { offset: start - OffsetDateTime::now_utc() }
    }
    pub fn now(&self) -> OffsetDateTime {
        OffsetDateTime::now_utc() + self.offset
    }
    /// The clock for backup ids: real, or (feature `test-hooks`) starting at `PROTOKUBE_TEST_NOW`
    /// (RFC 3339), so tests see schedules and retention without waiting for them.
    pub fn from_env() -> Clock {
        #[cfg(feature = "test-hooks")]
        if let Some(start) = std::env::var("PROTOKUBE_TEST_NOW").ok().and_then(|v| base::etcd_backup::parse_rfc3339(&v)) {
            tracing::warn!(now = %base::etcd_backup::rfc3339(start), "test clock");
            return Clock::starting_at(start);
        }
        Clock::real()
    }
}

/// Open the backup store at `url` (`s3://` with `s3`, else `file://`).
pub fn open_store(ec: &EtcdCluster, s3: Option<&aws_sdk_s3::Client>) -> Result<BackupStore, BackupRunError> {
    let open = |source| BackupRunError::Open { cluster: ec.name.clone(), url: ec.backup_store.clone(), source: Box::new(source) };
    let base: base::ConfigBase = ec.backup_store.parse().map_err(|e: base::store::ConfigBaseError| open(e.into()))?;
    let store = base::StateStore::open_with_s3(&base, s3.cloned(), Duration::from_secs(30)).map_err(open)?;
    Ok(BackupStore::new(store))
}

/// Take one backup of `ec` through `client` now: stream the snapshot to a staging file under
/// `staging`, upload it, check what landed, and write its metadata.
pub async fn take(
    client: &etcd::Client,
    ec: &EtcdCluster,
    store: &BackupStore,
    reason: &str,
    now: OffsetDateTime,
    staging: &Path,
) -> Result<BackupMeta, BackupRunError> {
    let etcd_err = |source| BackupRunError::Etcd { cluster: ec.name.clone(), source };
    let store_err = |source| BackupRunError::Store { cluster: ec.name.clone(), source: Box::new(source) };
    let status = client.status().await.map_err(etcd_err)?;
    let members = client.members().await.map_err(etcd_err)?;
    let id = allocate_id(client, ec, store, now).await?;
    let file = staging_file(staging, &ec.name, &id)?;
    let result = async {
        let (size, sha256) = client.snapshot_to(&file).await.map_err(etcd_err)?;
        let mut names: Vec<String> = members.iter().map(|m| m.name.clone()).filter(|n| !n.is_empty()).collect();
        names.sort();
        let taken_from = members.iter().find(|m| m.id == status.member_id).map(|m| m.name.clone()).unwrap_or_default();
        let meta = BackupMeta {
            id: id.to_string(),
            etcd_cluster: ec.name.clone(),
            taken_at: base::etcd_backup::rfc3339(now),
            reason: reason.to_string(),
            taken_from,
            etcd_version: status.version.clone(),
            cluster_id: status.cluster_id.clone(),
            members: names,
            revision: status.revision,
            size,
            sha256,
        };
        store.upload(&id, &file, &meta).await.map_err(store_err)?;
        Ok(meta)
    }
    .await;
    let _ = std::fs::remove_file(&file);
    result
}

/// Where backup `id` of etcd cluster `cluster` is staged: in `staging`, made (or closed to) 0700
/// first; the snapshot is written there 0600 ([`etcd::Client::snapshot_to`]).
fn staging_file(staging: &Path, cluster: &str, id: &BackupId) -> Result<PathBuf, BackupRunError> {
    base::fs::ensure_private_dir(staging).map_err(|e| BackupRunError::Io { path: e.path.display().to_string(), source: e.source })?;
    Ok(staging.join(format!("{cluster}-{id}.db")))
}

/// A backup id whose sequence number no other writer gets: the next number after both the store's
/// and the one etcd key every writer of this cluster counts with (a compare-and-swap), so a
/// scheduled backup and one before a membership change never share an id.
async fn allocate_id(client: &etcd::Client, ec: &EtcdCluster, store: &BackupStore, now: OffsetDateTime) -> Result<BackupId, BackupRunError> {
    let etcd_err = |source| BackupRunError::Etcd { cluster: ec.name.clone(), source };
    let key = claim_key(&ec.name, "sequence");
    for _ in 0..10 {
        let mut id = store.next_id(now).await.map_err(|source| BackupRunError::Store { cluster: ec.name.clone(), source: Box::new(source) })?;
        let current = client.get(&key).await.map_err(etcd_err)?.map(|(v, _)| v);
        id.seq = id.seq.max(current.as_deref().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) + 1);
        if client.claim(&key, &format!("{:020}", id.seq), |now_value| now_value.map(str::to_string) == current).await.map_err(etcd_err)? {
            return Ok(id);
        }
    }
    Err(BackupRunError::Etcd {
        cluster: ec.name.clone(),
        source: EtcdError::Http { url: key, message: "the backup sequence kept changing under 10 attempts".into() },
    })
}

/// What the backup loop needs besides the plan.
pub struct BackupLoop {
    pub root: PathBuf,
    pub internal_ip: String,
    pub cluster_name: String,
    pub s3: Option<aws_sdk_s3::Client>,
    pub etcd_timeout: Duration,
    pub metrics: Metrics,
    pub clock: Clock,
    /// The last slot this process handled, per etcd cluster.
    last_slot: std::collections::BTreeMap<String, i64>,
}

impl BackupLoop {
    pub fn new(root: PathBuf, internal_ip: String, cluster_name: String, s3: Option<aws_sdk_s3::Client>, metrics: Metrics, clock: Clock) -> Self {
        BackupLoop { root, internal_ip, cluster_name, s3, etcd_timeout: Duration::from_secs(5), metrics, clock, last_slot: Default::default() }
    }

    /// The local member of `ec` (this instance's), reached at its address with its name pinned.
    pub fn local_client(&self, ec: &EtcdCluster, member: &str) -> Option<etcd::Client> {
        local_client(&self.root, &self.cluster_name, &self.internal_ip, ec, member, self.etcd_timeout)
    }

    /// Check the schedule and the backup requests every `poll`, with the latest plan, for ever.
    pub async fn run(mut self, plans: tokio::sync::watch::Receiver<Plan>, poll: Duration) {
        loop {
            let plan = plans.borrow().clone();
            self.tick(&plan).await;
            tokio::time::sleep(poll).await;
        }
    }

    /// One pass over every etcd cluster with a member here.
    pub async fn tick(&mut self, plan: &Plan) {
        for ec in &plan.etcd_clusters {
            let Some(member) = plan.my_members(ec).first().map(|m| m.name.clone()) else { continue };
            if let Err(e) = self.tick_cluster(ec, &member).await {
                tracing::error!(error = %e, etcd = %ec.name, "etcd backup failed");
                self.metrics.update(|s| s.backups.entry(ec.name.clone()).or_default().failures += 1);
            }
        }
    }

    async fn tick_cluster(&mut self, ec: &EtcdCluster, member: &str) -> Result<(), BackupRunError> {
        let Some(client) = self.local_client(ec, member) else { return Ok(()) };
        // Only a serving leader takes backups.
        let status = match client.status().await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(etcd = %ec.name, error = %e, "local member not answering: no backup from here");
                return Ok(());
            }
        };
        if !status.is_leader() && !every_member_backs_up() {
            return Ok(());
        }
        let store = open_store(ec, self.s3.as_ref())?;
        let store_err = |source| BackupRunError::Store { cluster: ec.name.clone(), source: Box::new(source) };
        // Never while a restore replaces the data.
        if store.restore_request().await.map_err(store_err)?.is_some_and(|r| r.phase != RestorePhase::Complete) {
            return Ok(());
        }
        let now = self.clock.now();
        let staging = paths::under(&self.root, paths::BACKUP_STAGING_DIR);
        let etcd_err = |source| BackupRunError::Etcd { cluster: ec.name.clone(), source };

        if let Some(req) = store.backup_request().await.map_err(store_err)? {
            let done = store.backup_request_done().await.map_err(store_err)?;
            let at = now.unix_timestamp();
            if done.as_ref().map(|d| &d.id) != Some(&req.id)
                && client
                    .claim(&claim_key(&ec.name, "request"), &request_claim(&req.id, at), |cur| request_claimable(cur, &req.id, at))
                    .await
                    .map_err(etcd_err)?
            {
                let meta = self.timed(ec, take(&client, ec, &store, "requested", now, &staging)).await?;
                store.put_backup_request_done(&BackupRequestDone { id: req.id.clone(), backup: meta.id.clone() }).await.map_err(store_err)?;
            }
        }

        let interval = ec.backup_interval.as_secs().max(1) as i64;
        let slot = now.unix_timestamp().div_euclid(interval);
        if self.last_slot.get(&ec.name).is_some_and(|s| *s >= slot) {
            return Ok(());
        }
        let value = format!("{slot:020}");
        if client.claim(&claim_key(&ec.name, "scheduled"), &value, |cur| cur.is_none_or(|c| c < value.as_str())).await.map_err(etcd_err)? {
            self.timed(ec, take(&client, ec, &store, "scheduled", now, &staging)).await?;
            let gone = store.prune(now, &Retention::new(ec.backup_hourly_retention, ec.backup_retention_days)).await.map_err(store_err)?;
            if !gone.is_empty() {
                tracing::info!(etcd = %ec.name, pruned = gone.len(), "old backups removed per retention");
            }
        }
        self.last_slot.insert(ec.name.clone(), slot);
        Ok(())
    }

    async fn timed(&self, ec: &EtcdCluster, work: impl std::future::Future<Output = Result<BackupMeta, BackupRunError>>) -> Result<BackupMeta, BackupRunError> {
        let t = Instant::now();
        let meta = work.await?;
        let took = t.elapsed();
        tracing::info!(etcd = %ec.name, backup = %meta.id, reason = %meta.reason, revision = meta.revision, size = meta.size, took_ms = took.as_millis() as u64, "etcd backup written");
        self.metrics.update(|s| {
            let b = s.backups.entry(ec.name.clone()).or_default();
            b.total += 1;
            b.last_success_unix = crate::metrics::now_unix();
            b.last_size = meta.size;
            b.last_duration = took;
        });
        Ok(meta)
    }
}

/// Test hook (feature `test-hooks`, `PROTOKUBE_TEST_EVERY_MEMBER_BACKS_UP`): every member acts as
/// if it led, so tests can prove the slot claim alone keeps backups to one writer.
fn every_member_backs_up() -> bool {
    #[cfg(feature = "test-hooks")]
    if std::env::var_os("PROTOKUBE_TEST_EVERY_MEMBER_BACKS_UP").is_some() {
        return true;
    }
    false
}

/// A client for the member of `ec` on this instance.
pub fn local_client(root: &Path, cluster_name: &str, internal_ip: &str, ec: &EtcdCluster, member: &str, timeout: Duration) -> Option<etcd::Client> {
    let ip = internal_ip.parse::<IpAddr>().ok()?;
    match etcd::Client::for_member(root, cluster_name, ec, member, ip, timeout) {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::debug!(etcd = %ec.name, error = %e, "no etcd client yet");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_are_staged_where_only_root_may_look() {
        use std::os::unix::fs::PermissionsExt as _;
        let d = tempfile::tempdir().expect("tempdir");
        let staging = paths::under(d.path(), paths::BACKUP_STAGING_DIR);
        let id = BackupId::parse("2026-11-24T10:41:18Z-000042").expect("id");
        let file = staging_file(&staging, "main", &id).expect("staging");
        assert_eq!(file, staging.join("main-2026-11-24T10:41:18Z-000042.db"));
        assert_eq!(base::fs::mode_of(&staging), Some(0o700));
        assert_eq!(base::fs::mode_of(&d.path().join("var/lib/protokube")), Some(0o700));
        // A staging directory an older protokube left open is closed.
        std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        staging_file(&staging, "main", &id).expect("again");
        assert_eq!(base::fs::mode_of(&staging), Some(0o700));
        // The snapshot file itself: what snapshot_to creates.
        drop(base::fs::create_private(&file).expect("create"));
        assert_eq!(base::fs::mode_of(&file), Some(0o600));
    }

    #[test]
    fn a_requested_backup_is_claimed_once_until_the_claim_expires() {
        let ttl = REQUEST_CLAIM_TTL.as_secs() as i64;
        assert!(request_claimable(None, "r1", 1000));
        // Claimed by a member a moment ago: nobody else takes it.
        let held = request_claim("r1", 1000);
        assert!(!request_claimable(Some(&held), "r1", 1000));
        assert!(!request_claimable(Some(&held), "r1", 1000 + ttl - 1));
        // The claimer crashed or failed: taken over once the claim is old.
        assert!(request_claimable(Some(&held), "r1", 1000 + ttl));
        // A claim on an earlier request does not hold a new one.
        assert!(request_claimable(Some(&held), "r2", 1001));
        // A value that is not a claim holds nothing.
        assert!(request_claimable(Some("r1"), "r1", 5000));
        assert!(request_claimable(Some("r1@soon"), "r1", 5000));
    }
}
