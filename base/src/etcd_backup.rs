//! The etcd backup store: its layout, backup metadata, retention, and the restore protocol that
//! `keelson etcd backup …` and protokube share.
//!
//! One etcd cluster's backups live in [`cluster_dir`]: `etcdClusters[].backups.backupStore`/`<name>`
//! (kOps' default `<ConfigBase>/backups/etcd/<name>` already ends in the name and is used as it is).
//! Under it:
//!
//! - `<RFC3339>-<seq>/snapshot.db`: the snapshot exactly as etcd streams it (the bbolt database and
//!   its sha256 trailer, which `etcdutl snapshot restore` checks);
//! - `<RFC3339>-<seq>/meta.json`: [`BackupMeta`], written last and only after the uploaded snapshot
//!   was read back and its sha256 matched: a backup without it is incomplete and never offered;
//! - `control/restore.json`: the one [`RestoreRequest`] (written by `keelson etcd backup restore`);
//! - `control/restore-status/<member>.json`: each member's [`MemberStatus`] in that restore;
//! - `control/backup-request.json` / `control/backup-request-done.json`: a backup asked for by
//!   `keelson etcd backup create`, and which backup answered it.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::store::{StateStore, StoreError};

pub const SNAPSHOT_FILE: &str = "snapshot.db";
pub const META_FILE: &str = "meta.json";
pub const CONTROL_DIR: &str = "control";
pub const RESTORE_REQUEST: &str = "control/restore.json";
pub const BACKUP_REQUEST: &str = "control/backup-request.json";
pub const BACKUP_REQUEST_DONE: &str = "control/backup-request-done.json";

/// kOps' default interval between scheduled backups.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(15 * 60);
/// kOps' default retention of daily backups (`manager.backupRetentionDays`).
pub const DEFAULT_RETENTION_DAYS: u64 = 90;
/// The fewest complete backups retention leaves, whatever the age policy says: the newest this many
/// are always kept.
pub const MIN_KEPT: usize = 3;
/// How far a backup's name-time and its objects' `LastModified` may disagree before a prune deletes
/// nothing at all: further apart, a clock jumped (the writer's or the reader's), and ages computed
/// from names cannot be trusted.
pub const MAX_NAME_SKEW: Duration = Duration::from_secs(3600);
/// How far ahead of now a backup's name-time may be and still be chosen by `restore --latest`
/// (taken by a control plane whose clock ran ahead).
pub const MAX_FUTURE: Duration = Duration::from_secs(5 * 60);

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{url}: {message}")]
    Invalid { url: String, message: String },
    #[error("backup {id} is not in {store} (`keelson etcd backup list` shows what is)")]
    NotFound { id: String, store: String },
    #[error("{url}: integrity check failed: {message}")]
    Integrity { url: String, message: String },
}

const ID_FORMAT: &[time::format_description::FormatItem<'static>] = time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z");

/// `<RFC3339 UTC, seconds>-<6-digit sequence>`: sorts by time, unique per store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BackupId {
    pub taken_at: OffsetDateTime,
    pub seq: u64,
}

impl BackupId {
    pub fn parse(text: &str) -> Option<BackupId> {
        let (at, seq) = text.rsplit_once('-')?;
        if seq.len() < 6 || !seq.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let taken_at = time::PrimitiveDateTime::parse(at, ID_FORMAT).ok()?.assume_utc();
        Some(BackupId { taken_at, seq: seq.parse().ok()? })
    }
}

impl std::fmt::Display for BackupId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = self.taken_at.to_offset(time::UtcOffset::UTC).format(ID_FORMAT).map_err(|_| std::fmt::Error)?;
        write!(f, "{at}-{:06}", self.seq)
    }
}

/// RFC 3339 (UTC, seconds) of `t`.
pub fn rfc3339(t: OffsetDateTime) -> String {
    t.to_offset(time::UtcOffset::UTC).format(ID_FORMAT).unwrap_or_default()
}

pub fn parse_rfc3339(text: &str) -> Option<OffsetDateTime> {
    time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()
}

/// What one backup holds, written next to its snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupMeta {
    pub id: String,
    pub etcd_cluster: String,
    /// RFC 3339.
    pub taken_at: String,
    /// `scheduled`, `requested`, `before member change`, `before etcd upgrade`.
    pub reason: String,
    /// The member protokube took it from, and the etcd version that member ran.
    pub taken_from: String,
    pub etcd_version: String,
    /// etcd's cluster ID (decimal) and the member names at the time.
    pub cluster_id: String,
    pub members: Vec<String>,
    /// The store revision the snapshot holds.
    pub revision: i64,
    pub size: u64,
    pub sha256: String,
}

/// Which backups to keep (kOps' documented policy): every backup of the last hour, the first
/// backup of every hour for 7 days, the first of every day for `daily` (90 days unless the spec's
/// `manager.backupRetentionDays` says otherwise). The newest [`MIN_KEPT`] backups are always kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub keep_all: Duration,
    pub hourly: Duration,
    pub daily: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Retention::with_daily_days(DEFAULT_RETENTION_DAYS)
    }
}

impl Retention {
    pub fn with_daily_days(days: u64) -> Retention {
        Retention::new(keelson_api::etcd_manager::DEFAULT_HOURLY_RETENTION, days)
    }

    /// Every backup of the last hour, the first of every hour for `hourly`, the first of every day
    /// for `daily_days` (etcd-manager's two retention settings).
    pub fn new(hourly: Duration, daily_days: u64) -> Retention {
        Retention { keep_all: Duration::from_secs(3600), hourly, daily: Duration::from_secs(daily_days.saturating_mul(86400)) }
    }

    /// The backups of `ids` this policy drops at `now`.
    pub fn expired(&self, ids: &[BackupId], now: OffsetDateTime) -> Vec<BackupId> {
        let mut sorted = ids.to_vec();
        sorted.sort();
        sorted.dedup();
        let newest: Vec<BackupId> = sorted.iter().rev().take(MIN_KEPT).copied().collect();
        let mut hours_seen = std::collections::BTreeSet::new();
        let mut days_seen = std::collections::BTreeSet::new();
        let mut out = Vec::new();
        for id in sorted {
            let age = now - id.taken_at;
            let hour = id.taken_at.unix_timestamp().div_euclid(3600);
            let day = id.taken_at.unix_timestamp().div_euclid(86400);
            // (first of its hour / day: ascending order means the first seen)
            let first_of_hour = hours_seen.insert(hour);
            let first_of_day = days_seen.insert(day);
            let keep = newest.contains(&id) || age < self.keep_all || (first_of_hour && age < self.hourly) || (first_of_day && age < self.daily);
            if !keep {
                out.push(id);
            }
        }
        out
    }
}

/// A backup's name-time and the `LastModified` of one of its objects, too far apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockSkew {
    pub id: BackupId,
    pub last_modified: OffsetDateTime,
}

impl std::fmt::Display for ClockSkew {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "backup {} is named {} but was written at {} (store's LastModified): more than {} min apart, a clock jumped",
            self.id,
            rfc3339(self.id.taken_at),
            rfc3339(self.last_modified),
            MAX_NAME_SKEW.as_secs() / 60
        )
    }
}

/// The first backup of `stored` (id, `LastModified` of one of its objects) whose name-time and
/// `LastModified` disagree by more than [`MAX_NAME_SKEW`]; a prune deletes nothing while one does.
pub fn clock_skew(stored: &[(BackupId, OffsetDateTime)]) -> Option<ClockSkew> {
    let limit = time::Duration::try_from(MAX_NAME_SKEW).unwrap_or(time::Duration::HOUR);
    stored.iter().find(|(id, modified)| (*modified - id.taken_at).abs() > limit).map(|(id, modified)| ClockSkew { id: *id, last_modified: *modified })
}

/// The backup `restore --latest` takes from `ids`: the newest whose name-time is not more than
/// [`MAX_FUTURE`] ahead of `now` (one from the future was taken by a control plane whose clock ran
/// ahead, and may hold anything).
pub fn latest_restorable(ids: &[BackupId], now: OffsetDateTime) -> Option<BackupId> {
    let limit = now + time::Duration::try_from(MAX_FUTURE).unwrap_or(time::Duration::minutes(5));
    ids.iter().filter(|id| id.taken_at <= limit).max().copied()
}

/// A restore asked for by `keelson etcd backup restore`; members act on it, the command drives its
/// phase forward once every member reports the step before done.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RestoreRequest {
    pub id: RestoreId,
    pub backup: String,
    pub phase: RestorePhase,
    /// The member names that must take part (the spec's).
    pub members: Vec<String>,
    pub requested_at: String,
    pub requested_by: String,
}

impl RestoreRequest {
    /// The restored cluster's `--initial-cluster-token`: a new cluster identity per restore, so a
    /// member still on the old data can never rejoin it.
    pub fn cluster_token(&self, etcd_cluster: &str, cluster_name: &str) -> String {
        format!("keelson-{etcd_cluster}-{cluster_name}-restore-{}", self.id)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RestorePhase {
    /// Every member stops serving and moves its data directory aside.
    Stop,
    /// Every member restores the snapshot and starts again.
    Restore,
    /// The restored cluster is healthy: the moved-aside data may go.
    Complete,
}

/// Ordered by progress; `Failed` (the last step did not work; the member retries every pass) is
/// below every step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum MemberState {
    Failed,
    Stopped,
    Restored,
    Healthy,
}

/// One member's progress through a restore.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberStatus {
    pub request: String,
    pub member: String,
    pub state: MemberState,
    pub at: String,
    #[serde(default)]
    pub detail: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_id: Option<String>,
    /// Members the local etcd lists as started (Healthy only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_members: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupRequest {
    pub id: String,
    pub requested_at: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupRequestDone {
    pub id: String,
    pub backup: String,
}

/// A fresh request identifier: the time and this process (unique per store in practice, and a
/// rerun of the same command resumes the stored request rather than making a new one).
pub fn request_id(now: OffsetDateTime) -> String {
    format!("{}-{}", now.unix_timestamp(), std::process::id())
}

/// The longest [`RestoreId`] accepted.
pub const RESTORE_ID_MAX_LEN: usize = 64;

/// A restore request's `id`, which every member puts into host paths on its etcd volume
/// (`data-before-restore-<id>`, `keelson-restore-<id>.json`, …) and into a container name, as
/// root. Anyone who can write `control/restore.json` chooses it, so it can only hold what
/// [`request_id`] makes: 1 to [`RESTORE_ID_MAX_LEN`] ASCII letters, digits and `-` — never `/`,
/// `.` or `..`. A request file with any other `id` is refused when it is read.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RestoreId(String);

impl RestoreId {
    pub fn parse(text: &str) -> Result<RestoreId, String> {
        if text.is_empty() || text.len() > RESTORE_ID_MAX_LEN {
            return Err(format!("restore request id {text:?}: must be 1 to {RESTORE_ID_MAX_LEN} characters"));
        }
        if let Some(c) = text.chars().find(|c| !(c.is_ascii_alphanumeric() || *c == '-')) {
            return Err(format!("restore request id {text:?}: {c:?} is not allowed (only ASCII letters, digits and '-')"));
        }
        Ok(RestoreId(text.to_string()))
    }

    /// A fresh id ([`request_id`]).
    pub fn new(now: OffsetDateTime) -> RestoreId {
        RestoreId(request_id(now))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for RestoreId {
    type Error = String;
    fn try_from(text: String) -> Result<RestoreId, String> {
        RestoreId::parse(&text)
    }
}

impl From<RestoreId> for String {
    fn from(id: RestoreId) -> String {
        id.0
    }
}

impl std::fmt::Display for RestoreId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialEq<RestoreId> for String {
    fn eq(&self, other: &RestoreId) -> bool {
        *self == other.0
    }
}

/// One etcd cluster's backup store.
#[derive(Debug, Clone)]
pub struct BackupStore {
    store: StateStore,
}

impl BackupStore {
    pub fn new(store: StateStore) -> BackupStore {
        BackupStore { store }
    }

    pub fn url(&self, rel: &str) -> String {
        self.store.url(rel)
    }

    fn key(id: &BackupId, file: &str) -> String {
        format!("{id}/{file}")
    }

    /// Every complete backup (its metadata written), oldest first.
    pub async fn ids(&self) -> Result<Vec<BackupId>, BackupError> {
        let mut ids: Vec<BackupId> =
            self.store.list("").await?.iter().filter_map(|k| k.strip_suffix(&format!("/{META_FILE}"))).filter_map(BackupId::parse).collect();
        ids.sort();
        Ok(ids)
    }

    /// Every backup directory, complete or not (what the sequence must not reuse).
    async fn all_ids(&self) -> Result<Vec<BackupId>, BackupError> {
        Ok(self.store.list("").await?.iter().filter_map(|k| k.split('/').next()).filter_map(BackupId::parse).collect())
    }

    pub async fn meta(&self, id: &BackupId) -> Result<BackupMeta, BackupError> {
        let key = Self::key(id, META_FILE);
        let bytes = self.store.get(&key).await?.ok_or_else(|| BackupError::NotFound { id: id.to_string(), store: self.url("") })?;
        serde_json::from_slice(&bytes).map_err(|e| BackupError::Invalid { url: self.url(&key), message: e.to_string() })
    }

    /// Every complete backup's metadata, oldest first.
    pub async fn list(&self) -> Result<Vec<BackupMeta>, BackupError> {
        let mut out = Vec::new();
        for id in self.ids().await? {
            out.push(self.meta(&id).await?);
        }
        Ok(out)
    }

    /// The id of a new backup taken at `now`.
    pub async fn next_id(&self, now: OffsetDateTime) -> Result<BackupId, BackupError> {
        let seq = self.all_ids().await?.iter().map(|i| i.seq).max().unwrap_or(0) + 1;
        let taken_at = now.replace_nanosecond(0).unwrap_or(now);
        Ok(BackupId { taken_at, seq })
    }

    /// Upload a snapshot (streamed from `snapshot`), read it back to check size and sha256 against
    /// `meta`, then write the metadata that makes the backup visible.
    pub async fn upload(&self, id: &BackupId, snapshot: &Path, meta: &BackupMeta) -> Result<(), BackupError> {
        let key = Self::key(id, SNAPSHOT_FILE);
        self.store.put_file(&key, snapshot).await?;
        match self.store.digest(&key).await? {
            Some((size, sha)) if size == meta.size && sha == meta.sha256 => {}
            got => {
                let _ = self.store.delete(&key).await;
                return Err(BackupError::Integrity {
                    url: self.url(&key),
                    message: format!("read back {got:?}, uploaded {} bytes with sha256 {}", meta.size, meta.sha256),
                });
            }
        }
        let text = serde_json::to_vec_pretty(meta).map_err(|e| BackupError::Invalid { url: self.url(&key), message: e.to_string() })?;
        self.store.put(&Self::key(id, META_FILE), &text).await?;
        Ok(())
    }

    /// Download backup `id` to `dest` and check it against its metadata.
    pub async fn fetch(&self, id: &BackupId, dest: &Path) -> Result<BackupMeta, BackupError> {
        let meta = self.meta(id).await?;
        let key = Self::key(id, SNAPSHOT_FILE);
        match self.store.download(&key, dest).await? {
            Some((size, sha)) if size == meta.size && sha == meta.sha256 => Ok(meta),
            got => {
                let _ = std::fs::remove_file(dest);
                Err(BackupError::Integrity {
                    url: self.url(&key),
                    message: format!("downloaded {got:?}, metadata says {} bytes, sha256 {}", meta.size, meta.sha256),
                })
            }
        }
    }

    /// Delete one backup (metadata first, so it is never seen half-deleted).
    pub async fn delete(&self, id: &BackupId) -> Result<(), BackupError> {
        self.store.delete(&Self::key(id, META_FILE)).await?;
        self.store.delete(&Self::key(id, SNAPSHOT_FILE)).await?;
        Ok(())
    }

    /// Apply `retention` at `now`: delete what it drops, and incomplete uploads older than a day —
    /// unless a backup's name-time and its objects' `LastModified` disagree ([`clock_skew`]): then
    /// a clock jumped, and this logs a warning and deletes nothing.
    pub async fn prune(&self, now: OffsetDateTime, retention: &Retention) -> Result<Vec<BackupId>, BackupError> {
        let objects = self.store.list_modified("").await?;
        let stored: Vec<(BackupId, OffsetDateTime)> =
            objects.iter().filter_map(|(key, modified)| Some((BackupId::parse(key.split('/').next()?)?, (*modified)?))).collect();
        if let Some(skew) = clock_skew(&stored) {
            tracing::warn!(store = %self.url(""), backup = %skew.id, last_modified = %rfc3339(skew.last_modified), "not pruning etcd backups: {skew}");
            return Ok(Vec::new());
        }
        let mut complete: Vec<BackupId> = objects.iter().filter_map(|(k, _)| k.strip_suffix(&format!("/{META_FILE}"))).filter_map(BackupId::parse).collect();
        complete.sort();
        let mut gone = retention.expired(&complete, now);
        for id in stored.iter().map(|(id, _)| *id) {
            if !complete.contains(&id) && now - id.taken_at > time::Duration::days(1) && !gone.contains(&id) {
                gone.push(id);
            }
        }
        gone.sort();
        gone.dedup();
        for id in &gone {
            self.delete(id).await?;
        }
        Ok(gone)
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, key: &str) -> Result<Option<T>, BackupError> {
        match self.store.get(key).await? {
            None => Ok(None),
            Some(b) => serde_json::from_slice(&b).map(Some).map_err(|e| BackupError::Invalid { url: self.url(key), message: e.to_string() }),
        }
    }

    async fn put_json<T: Serialize>(&self, key: &str, value: &T) -> Result<(), BackupError> {
        let text = serde_json::to_vec_pretty(value).map_err(|e| BackupError::Invalid { url: self.url(key), message: e.to_string() })?;
        Ok(self.store.put(key, &text).await?)
    }

    pub async fn restore_request(&self) -> Result<Option<RestoreRequest>, BackupError> {
        self.get_json(RESTORE_REQUEST).await
    }

    pub async fn put_restore_request(&self, r: &RestoreRequest) -> Result<(), BackupError> {
        self.put_json(RESTORE_REQUEST, r).await
    }

    pub fn member_status_key(member: &str) -> String {
        format!("{CONTROL_DIR}/restore-status/{member}.json")
    }

    pub async fn member_status(&self, member: &str) -> Result<Option<MemberStatus>, BackupError> {
        self.get_json(&Self::member_status_key(member)).await
    }

    pub async fn put_member_status(&self, s: &MemberStatus) -> Result<(), BackupError> {
        self.put_json(&Self::member_status_key(&s.member), s).await
    }

    pub async fn backup_request(&self) -> Result<Option<BackupRequest>, BackupError> {
        self.get_json(BACKUP_REQUEST).await
    }

    pub async fn put_backup_request(&self, r: &BackupRequest) -> Result<(), BackupError> {
        self.put_json(BACKUP_REQUEST, r).await
    }

    pub async fn backup_request_done(&self) -> Result<Option<BackupRequestDone>, BackupError> {
        self.get_json(BACKUP_REQUEST_DONE).await
    }

    pub async fn put_backup_request_done(&self, r: &BackupRequestDone) -> Result<(), BackupError> {
        self.put_json(BACKUP_REQUEST_DONE, r).await
    }
}

/// Where the backups of etcd cluster `name` go: under `etcdClusters[].backups.backupStore`
/// (`spec_store`), else kOps' default `<ConfigBase>/backups/etcd/<name>`, in a directory named after
/// the etcd cluster — which kOps' layout already is (a store ending in `/<name>` is used as it is), so
/// existing stores line up and one store shared by several etcd clusters never mixes them.
pub fn cluster_dir(spec_store: Option<&str>, config_base: &str, name: &str) -> String {
    let store = match spec_store.map(|s| s.trim_end_matches('/')).filter(|s| !s.is_empty()) {
        Some(s) => s.to_string(),
        None => format!("{}/backups/etcd/{name}", config_base.trim_end_matches('/')),
    };
    if store.rsplit('/').next() == Some(name) {
        store
    } else {
        format!("{store}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> OffsetDateTime {
        parse_rfc3339(text).expect(text)
    }

    #[test]
    fn ids_round_trip_and_sort_by_time() {
        let id = BackupId::parse("2026-11-24T10:41:18Z-000042").expect("parses");
        assert_eq!(id.seq, 42);
        assert_eq!(id.to_string(), "2026-11-24T10:41:18Z-000042");
        assert_eq!(id.taken_at, at("2026-11-24T10:41:18Z"));
        for bad in ["2026-11-24T10:41:18Z", "control", "2026-11-24T10:41:18Z-42", "x-000001", "2026-13-24T10:41:18Z-000001"] {
            assert_eq!(BackupId::parse(bad), None, "{bad}");
        }
        let a = BackupId::parse("2026-11-24T09:00:00Z-000009").expect("a");
        assert!(a < id);
    }

    #[test]
    fn restore_ids_are_single_path_components() {
        let fresh = RestoreId::new(at("2026-12-02T05:00:00Z"));
        assert_eq!(RestoreId::parse(fresh.as_str()), Ok(fresh.clone()));
        for good in ["1764651600-4242", "a", "restore-B-7"] {
            assert!(RestoreId::parse(good).is_ok(), "{good}");
        }
        let long = "1".repeat(RESTORE_ID_MAX_LEN + 1);
        for bad in ["", ".", "..", "x/../../etc", "/etc", "a.b", "a b", "a\\b", "a\0b", "é", long.as_str()] {
            let err = RestoreId::parse(bad).expect_err(bad);
            assert!(err.contains("restore request id"), "{err}");
        }
        let text = r#"{"id":"../x","backup":"b","phase":"Stop","members":[],"requestedAt":"","requestedBy":""}"#;
        let err = serde_json::from_str::<RestoreRequest>(text).expect_err("refused when read");
        assert!(err.to_string().contains("\"../x\""), "{err}");
    }

    /// A backup every 15 minutes for 120 days, pruned once at the end: what survives is every
    /// backup of the last hour, one per hour for 7 days, one per day for 90 days.
    #[test]
    fn retention_keeps_recent_hourly_and_daily() {
        let start = at("2026-01-01T00:00:00Z");
        let now = start + time::Duration::days(120);
        let ids: Vec<BackupId> = (0..120 * 96).map(|i| BackupId { taken_at: start + time::Duration::minutes(15 * i + 1), seq: i as u64 }).collect();
        let r = Retention::default();
        let gone: std::collections::HashSet<BackupId> = r.expired(&ids, now).into_iter().collect();
        let kept: Vec<&BackupId> = ids.iter().filter(|i| !gone.contains(i)).collect();
        let age = |i: &BackupId| now - i.taken_at;
        assert_eq!(kept.iter().filter(|i| age(i) < time::Duration::hours(1)).count(), 4, "all of the last hour");
        let hourly = kept.iter().filter(|i| age(i) >= time::Duration::hours(1) && age(i) < time::Duration::days(7)).count();
        assert!((167..=168).contains(&hourly), "one per hour for 7 days: {hourly}");
        let daily = kept.iter().filter(|i| age(i) >= time::Duration::days(7)).count();
        assert!((83..=84).contains(&daily), "one per day from 7 to 90 days: {daily}");
        assert!(kept.iter().all(|i| age(i) < time::Duration::days(90)), "nothing older than 90 days");
        // The spec's retention wins.
        let short = Retention::with_daily_days(10);
        let gone10: std::collections::HashSet<BackupId> = short.expired(&ids, now).into_iter().collect();
        let kept10: Vec<&BackupId> = ids.iter().filter(|i| !gone10.contains(i)).collect();
        assert!(kept10.len() < kept.len() && kept10.iter().all(|i| age(i) < time::Duration::days(10)));
        // The newest backup is kept however old it is.
        let old = [BackupId { taken_at: start, seq: 1 }];
        assert!(r.expired(&old, now).is_empty());
    }

    #[test]
    fn each_etcd_cluster_has_its_own_directory() {
        assert_eq!(cluster_dir(None, "s3://b/c.example.com/", "main"), "s3://b/c.example.com/backups/etcd/main");
        assert_eq!(cluster_dir(Some("s3://b/c/backups/etcd/events"), "s3://b/c", "events"), "s3://b/c/backups/etcd/events");
        assert_eq!(cluster_dir(Some("s3://b/shared/"), "s3://b/c", "main"), "s3://b/shared/main");
        assert_eq!(cluster_dir(Some("s3://b/shared"), "s3://b/c", "events"), "s3://b/shared/events");
        assert_eq!(cluster_dir(Some(""), "file:///srv/state", "main"), "file:///srv/state/backups/etcd/main");
    }

    #[tokio::test]
    async fn upload_checks_and_lists_prunes_and_fetches() {
        let d = tempfile::tempdir().expect("tempdir");
        let store = BackupStore::new(StateStore::dir(&d.path().join("backups")));
        let snap = d.path().join("snap.db");
        std::fs::write(&snap, b"snapshot bytes").expect("write");
        let now = at("2026-11-24T10:00:00Z");
        let id = store.next_id(now).await.expect("id");
        assert_eq!(id.to_string(), "2026-11-24T10:00:00Z-000001");
        let mut meta = BackupMeta {
            id: id.to_string(),
            etcd_cluster: "main".into(),
            taken_at: rfc3339(now),
            reason: "scheduled".into(),
            taken_from: "etcd-a".into(),
            etcd_version: "3.5.21".into(),
            cluster_id: "1".into(),
            members: vec!["etcd-a".into()],
            revision: 7,
            size: 14,
            sha256: crate::sha256_hex(b"snapshot bytes"),
        };
        // A wrong hash is refused and leaves nothing visible.
        let bad = BackupMeta { sha256: "00".into(), ..meta.clone() };
        assert!(matches!(store.upload(&id, &snap, &bad).await, Err(BackupError::Integrity { .. })));
        assert!(store.ids().await.expect("ids").is_empty());
        store.upload(&id, &snap, &meta).await.expect("upload");
        assert_eq!(store.list().await.expect("list"), vec![meta.clone()]);
        let id2 = store.next_id(now + time::Duration::days(2)).await.expect("id2");
        assert_eq!(id2.seq, 2);
        meta.id = id2.to_string();
        store.upload(&id2, &snap, &meta).await.expect("upload 2");
        let got = d.path().join("restore/snap.db");
        assert_eq!(store.fetch(&id2, &got).await.expect("fetch").id, id2.to_string());
        assert_eq!(std::fs::read(&got).expect("read"), b"snapshot bytes");
        store.delete(&id).await.expect("delete");
        assert_eq!(store.ids().await.expect("ids"), vec![id2]);
        assert!(matches!(store.fetch(&id, &got).await, Err(BackupError::NotFound { .. })));
    }

    fn meta_for(id: &BackupId, bytes: &[u8]) -> BackupMeta {
        BackupMeta {
            id: id.to_string(),
            etcd_cluster: "main".into(),
            taken_at: rfc3339(id.taken_at),
            reason: "scheduled".into(),
            taken_from: "etcd-a".into(),
            etcd_version: "3.5.21".into(),
            cluster_id: "1".into(),
            members: vec!["etcd-a".into()],
            revision: 7,
            size: bytes.len() as u64,
            sha256: crate::sha256_hex(bytes),
        }
    }

    /// Put backups taken at `times` into a file store, each object's mtime (its `LastModified`)
    /// `written(name-time)`.
    async fn seed(store: &BackupStore, dir: &Path, times: &[OffsetDateTime], written: impl Fn(OffsetDateTime) -> OffsetDateTime) -> Vec<BackupId> {
        let snap = dir.join("snap.db");
        std::fs::write(&snap, b"snapshot bytes").expect("write");
        let mut ids = Vec::new();
        for t in times {
            let id = store.next_id(*t).await.expect("id");
            store.upload(&id, &snap, &meta_for(&id, b"snapshot bytes")).await.expect("upload");
            for file in [SNAPSHOT_FILE, META_FILE] {
                let path = dir.join("backups").join(format!("{id}/{file}"));
                let f = std::fs::File::options().write(true).open(&path).expect("open");
                f.set_modified(written(*t).into()).expect("mtime");
            }
            ids.push(id);
        }
        ids
    }

    #[test]
    fn retention_always_keeps_the_newest_few() {
        let now = at("2026-11-24T10:00:00Z");
        let ids = |ages_days: &[i64]| -> Vec<BackupId> {
            ages_days.iter().enumerate().map(|(i, d)| BackupId { taken_at: now - time::Duration::days(*d), seq: i as u64 + 1 }).collect()
        };
        let seqs = |v: Vec<BackupId>| -> Vec<u64> { v.iter().map(|i| i.seq).collect() };
        let r = Retention::default();
        // (ages in days, oldest first; the seqs the policy drops)
        let cases: [(&[i64], &[u64]); 6] = [
            (&[], &[]),
            (&[200], &[]),
            (&[300, 200], &[]),
            (&[400, 300, 200], &[]),
            (&[500, 400, 300, 200, 100], &[1, 2]),
            // Old ones go while the newest three are recent; the 95-day one goes, the 30-day one stays.
            (&[95, 30, 0, 0, 0], &[1]),
        ];
        for (ages, dropped) in cases {
            assert_eq!(seqs(r.expired(&ids(ages), now)), dropped.to_vec(), "ages {ages:?}");
        }
        assert_eq!(MIN_KEPT, 3);
        // Even a retention of 0 days keeps the newest three.
        assert_eq!(seqs(Retention::with_daily_days(0).expired(&ids(&[10, 9, 8, 8]), now)), vec![1]);
    }

    #[test]
    fn a_clock_jump_between_name_and_last_modified_is_seen() {
        let t = at("2026-11-24T10:00:00Z");
        let id = |seq: u64| BackupId { taken_at: t, seq };
        let min = time::Duration::minutes;
        type Case<'a> = (&'a str, Vec<(BackupId, OffsetDateTime)>, Option<u64>);
        let cases: [Case; 6] = [
            ("nothing stored", vec![], None),
            ("written as named", vec![(id(1), t)], None),
            ("a slow upload, 59 minutes", vec![(id(1), t + min(59)), (id(2), t - min(59))], None),
            ("named 61 minutes before it was written", vec![(id(1), t), (id(2), t + min(61))], Some(2)),
            ("named 61 minutes after it was written", vec![(id(3), t - min(61))], Some(3)),
            ("named 100 days ahead", vec![(id(1), t), (id(4), t - time::Duration::days(100))], Some(4)),
        ];
        for (what, stored, skewed) in cases {
            assert_eq!(clock_skew(&stored).map(|s| s.id.seq), skewed, "{what}");
        }
        let text = clock_skew(&[(id(9), t + min(90))]).expect("skew").to_string();
        assert!(text.contains("2026-11-24T10:00:00Z-000009") && text.contains("2026-11-24T11:30:00Z") && text.contains("clock jumped"), "{text}");
    }

    #[test]
    fn restore_latest_skips_backups_from_the_future() {
        let now = at("2026-11-24T10:00:00Z");
        let id = |offset: time::Duration, seq: u64| BackupId { taken_at: now + offset, seq };
        let (past, soon, ahead) = (id(-time::Duration::hours(2), 1), id(time::Duration::minutes(4), 2), id(time::Duration::minutes(6), 3));
        let far = id(time::Duration::days(100), 4);
        let cases: [(&str, Vec<BackupId>, Option<BackupId>); 6] = [
            ("no backups", vec![], None),
            ("the newest, in the past", vec![past], Some(past)),
            ("4 minutes ahead is a clock a little fast: taken", vec![past, soon], Some(soon)),
            ("6 minutes ahead is not", vec![past, ahead], Some(past)),
            ("100 days ahead is not, in any order", vec![far, past, ahead], Some(past)),
            ("only future backups: none", vec![far, ahead], None),
        ];
        for (what, ids, want) in cases {
            assert_eq!(latest_restorable(&ids, now), want, "{what}");
        }
    }

    /// Retention on a store whose objects were written when their names say; then one written 100
    /// days after its name (a control plane's clock ran behind, or the pruner's ahead): nothing more
    /// is deleted, whatever the policy says.
    #[tokio::test]
    async fn prune_follows_the_policy_and_stops_at_a_clock_jump() {
        let d = tempfile::tempdir().expect("tempdir");
        let store = BackupStore::new(StateStore::dir(&d.path().join("backups")));
        let now = time::OffsetDateTime::now_utc().replace_nanosecond(0).expect("now");
        let days = |n: i64| now - time::Duration::days(n);
        let ids = seed(&store, d.path(), &[days(200), days(120), days(30), days(2), days(1), now], |t| t).await;
        let gone = store.prune(now, &Retention::default()).await.expect("prune");
        assert_eq!(gone, ids[..2].to_vec(), "older than 90 days");
        assert_eq!(store.ids().await.expect("ids"), ids[2..].to_vec());

        let jumped = seed(&store, d.path(), &[days(150)], |t| t + time::Duration::days(150)).await;
        let gone = store.prune(now + time::Duration::days(100), &Retention::default()).await.expect("prune");
        assert_eq!(gone, vec![], "a clock jumped: nothing deleted");
        let mut all = ids[2..].to_vec();
        all.extend(&jumped);
        all.sort();
        assert_eq!(store.ids().await.expect("ids"), all);
    }

    /// A downloaded snapshot is readable by root only, in a directory only root may enter.
    #[tokio::test]
    async fn downloads_are_private() {
        let d = tempfile::tempdir().expect("tempdir");
        let store = BackupStore::new(StateStore::dir(&d.path().join("backups")));
        let ids = seed(&store, d.path(), &[time::OffsetDateTime::now_utc()], |t| t).await;
        let dest = d.path().join("restore/main/snapshot.db");
        store.fetch(&ids[0], &dest).await.expect("fetch");
        assert_eq!(crate::fs::mode_of(&dest), Some(0o600));
        assert_eq!(crate::fs::mode_of(&d.path().join("restore/main")), Some(0o700));
        assert_eq!(crate::fs::mode_of(&d.path().join("restore")), Some(0o700));
    }
}
