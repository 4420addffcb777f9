//! One level-triggered pass: find volumes → claim → attach → device → format/mount → manifest → DNS.
//! Every step checks the actual state first and acts only on the difference, so a second pass over a
//! converged host makes no change (and only read calls).
//!
//! The steps live in their own modules, each a pure decision with thin I/O around it:
//! `volumes` (claim, attach, device, format/mount), `membership` (bootstrap, join, restore,
//! the manifest), `version` (etcd version changes) and `dns` (records). What more than one
//! step asks (the live peers, a client for one) is here, with the pass.

mod dns;
mod leave;
mod membership;
pub mod run;
mod version;
mod volumes;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cloud::dns::Dns;
use cloud::volumes::{Instance, Instances, Volume, VolumeFilter, Volumes};
use cloud::{Identity, VolumeError};

use crate::config::{EtcdCluster, Plan};
use crate::disk::DiskError;
use crate::{etcd, hosts, restore};

pub use crate::manifest::BOOTSTRAP_FILE;
pub use dns::route53_changes;
use volumes::{etcd_role, live_holder};

/// Route53 TTL for every record protokube writes.
pub const TTL: i64 = 60;
/// Placeholder address for a record whose owner is not known yet (kOps' value).
pub const PLACEHOLDER: &str = "203.0.113.123";
/// Tag that marks a volume holding a filesystem protokube (or kOps) initialised.
pub const FORMATTED_TAG: &str = "keelson.io/etcd-formatted";
/// Set on a member's volume once that member has been seen started in a cluster with quorum: from
/// then on the cluster exists, and a blank volume must join it, never bootstrap a new one.
pub const STARTED_TAG: &str = "keelson.io/etcd-started";

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Cloud(#[from] VolumeError),
    #[error(transparent)]
    Dns(#[from] cloud::DnsError),
    #[error("volume {volume}: {source}")]
    Disk { volume: String, source: DiskError },
    #[error(transparent)]
    Hosts(#[from] hosts::HostsError),
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("etcd {cluster}: {source}")]
    Etcd { cluster: String, source: etcd::EtcdError },
    #[error(transparent)]
    Pki(#[from] crate::pki::PkiError),
    #[error(transparent)]
    Restore(Box<restore::RestoreError>),
    #[error("the pass did not finish within its bound of {} s (--pass-timeout); the next pass continues from what is there", bound.as_secs())]
    PassBound { bound: Duration },
}

/// `pass` within `bound`: a pass that hangs (a cloud call, a file a pod keeps locked) ends with
/// [`ReconcileError::PassBound`] and the loop goes on; every step is level-triggered, so the next
/// pass starts from what is there.
pub async fn bounded<T>(bound: Duration, pass: impl std::future::Future<Output = Result<T, ReconcileError>>) -> Result<T, ReconcileError> {
    tokio::time::timeout(bound, pass).await.unwrap_or(Err(ReconcileError::PassBound { bound }))
}

#[derive(Debug, Clone)]
pub struct Options {
    pub root: PathBuf,
    /// The state store (`ConfigBase`), for the etcd CAs.
    pub store: base::StateStore,
    pub by_id_dir: PathBuf,
    /// Absolute path of the hosts file to manage (already under `root`).
    pub hosts_file: PathBuf,
    /// How long one pass waits for an attachment to complete.
    pub attach_timeout: Duration,
    /// How long one pass waits for the device node to appear.
    pub device_timeout: Duration,
    /// Timeout of one etcd members-API request.
    pub etcd_timeout: Duration,
    /// The S3 client for `s3://` backup stores.
    pub s3: Option<aws_sdk_s3::Client>,
    /// What restores etcd snapshots: `--etcd-restore-tool` (else chosen when a restore runs: [`crate::restore::RestoreTool::find`]).
    pub restore_tool: Option<std::path::PathBuf>,
    /// How long one pass waits for a member to stop before a restore.
    pub stop_timeout: Duration,
    /// Time for backup ids (tests move it).
    pub clock: crate::backup::Clock,
    /// How long a member on a blank volume waits for a peer before it says the cluster lost quorum.
    pub quorum_loss_wait: Duration,
    /// How long one whole pass may take ([`bounded`]).
    pub pass_timeout: Duration,
}

/// What one pass did; `waiting` says what it could not finish and why.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    pub volumes_mounted: usize,
    pub volumes_formatted: usize,
    pub manifests_written: usize,
    pub dns_records: usize,
    /// Volumes this instance holds and has mounted, by etcd cluster.
    pub mounted: BTreeMap<String, String>,
    pub waiting: Vec<String>,
    /// Devices refused (foreign data, failed probe, wrong mount): never formatted, never mounted.
    pub refused: Vec<String>,
    /// A restore request involving a member here is in flight ([`restore::Gate::restoring`]).
    pub restoring: bool,
    /// An etcd cluster with a member on this host has no volume mounted here yet (claimed but
    /// still held by a terminating instance, attaching, or refused): the pass should come again soon.
    pub unmounted: bool,
}

impl Report {
    /// Take in what one claim's staging reported (its counts and what it waits on).
    fn merge(&mut self, other: Report) {
        self.volumes_mounted += other.volumes_mounted;
        self.volumes_formatted += other.volumes_formatted;
        self.manifests_written += other.manifests_written;
        self.dns_records += other.dns_records;
        self.mounted.extend(other.mounted);
        self.waiting.extend(other.waiting);
        self.refused.extend(other.refused);
        self.restoring |= other.restoring;
        self.unmounted |= other.unmounted;
    }
}

/// One claim staged by [`Agent::stage`].
struct Staged {
    report: Report,
    fresh: Option<Volume>,
    mounted: Result<Option<Volume>, ReconcileError>,
}

pub struct Agent<C, D> {
    pub plan: Plan,
    pub me: Identity,
    pub opts: Options,
    pub cloud: C,
    /// Route53 (when the plan says so).
    pub dns: Option<D>,
    zone_id: Option<String>,
    /// Since when each etcd cluster's member here has waited on a blank volume for a peer.
    blank_since: std::sync::Mutex<BTreeMap<String, Instant>>,
    /// Per etcd cluster, what the last pass saw: the member this host holds and its live peers
    /// (member, private IP) — what a hand-over at shutdown needs without asking the cloud again.
    seen: BTreeMap<String, Seen>,
}

/// The local member of one etcd cluster and its live peers (member, private IP), as a pass saw them.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    member: String,
    peers: Vec<(String, String)>,
}

impl<C: Volumes + Instances + Sync, D: Dns + Sync> Agent<C, D> {
    pub fn new(plan: Plan, me: Identity, opts: Options, cloud: C, dns: Option<D>) -> Self {
        Agent { plan, me, opts, cloud, dns, zone_id: None, blank_since: Default::default(), seen: BTreeMap::new() }
    }

    /// Take a re-read plan (the spec changed); the zone is looked up again if the DNS settings changed.
    pub fn set_plan(&mut self, plan: Plan) {
        if plan.dns != self.plan.dns {
            self.zone_id = None;
        }
        self.plan = plan;
    }

    fn filter(&self) -> VolumeFilter {
        VolumeFilter {
            tags: vec![("KubernetesCluster".to_string(), self.plan.cluster_name.clone())],
            tag_keys: vec!["k8s.io/role/master".to_string()],
            ..Default::default()
        }
    }

    /// One full pass, within [`Options::pass_timeout`].
    pub async fn reconcile(&mut self) -> Result<Report, ReconcileError> {
        let bound = self.opts.pass_timeout;
        bounded(bound, self.pass()).await
    }

    async fn pass(&mut self) -> Result<Report, ReconcileError> {
        let mut report = Report::default();
        let (mut vols, instances) = self.observe().await?;

        // 3. Per etcd cluster: keep or claim a volume, then mount it and write the manifest.
        // Every cluster's volume is claimed (attached) before any is waited for, so the attachments
        // (and, on a replacement, the old instance's release of them) overlap instead of queueing
        // one cluster behind the other's mount and manifest.
        let clusters = self.plan.etcd_clusters.clone();
        let mut preferred: Option<String> = None;
        let mut claims = Vec::new();
        for ec in &clusters {
            if self.plan.my_members(ec).is_empty() {
                continue;
            }
            let Some(claim) = self.claim(ec, &mut vols, &instances, preferred.as_deref(), &mut report).await? else { continue };
            preferred.get_or_insert(claim.member.clone());
            let peers = self.peers(ec, &vols, &instances);
            self.seen.insert(ec.name.clone(), Seen { member: claim.member.clone(), peers });
            claims.push((ec, claim));
        }
        // Each claim's member certificates, device and mount at once: on a replacement the volumes
        // come free together when the old instance is off, and the certificates (a state-store
        // read and a key per member) are issued while the old instance still holds them.
        let staged = futures_util::future::join_all(claims.iter().map(|(ec, claim)| self.stage(ec, claim, vols.clone()))).await;
        for ((ec, claim), staged) in claims.into_iter().zip(staged) {
            let volumes::Claim { member, .. } = claim;
            report.merge(staged.report);
            if let Some(fresh) = staged.fresh {
                if let Some(slot) = vols.iter_mut().find(|v| v.id == fresh.id) {
                    *slot = fresh;
                }
            }
            let vol = match staged.mounted {
                Ok(Some(vol)) => vol,
                Ok(None) => continue,
                Err(e @ ReconcileError::Disk { .. }) => {
                    // A refused device blocks only this volume; say so loudly and go on.
                    tracing::error!(error = %e, "not mounting");
                    report.refused.push(e.to_string());
                    continue;
                }
                Err(e) => return Err(e),
            };
            report.mounted.insert(ec.name.clone(), vol.id.clone());
            match self.restore_step(ec, &member, &vol).await {
                Ok(gate @ (restore::Gate::Proceed | restore::Gate::ProceedRestoring)) => report.restoring |= gate.restoring(),
                Ok(restore::Gate::Hold(why)) => {
                    report.restoring = true;
                    report.waiting.push(why);
                    continue;
                }
                Err(e) => {
                    tracing::error!(error = %e, "etcd restore step failed");
                    report.restoring = true;
                    report.waiting.push(e.to_string());
                    continue;
                }
            }
            if self.write_manifest(ec, &member, &vol, &vols, &instances, &mut report).await? {
                report.manifests_written += 1;
            }
            if !vol.tags.contains_key(STARTED_TAG) {
                self.mark_started(ec, &member, &vol).await;
            }
        }
        report.unmounted = clusters.iter().any(|ec| !self.plan.my_members(ec).is_empty() && !report.mounted.contains_key(&ec.name));

        // 4. DNS from what the cloud says now.
        report.dns_records = self.sync_dns(&vols, &instances, &mut report).await?;
        Ok(report)
    }

    /// One claimed volume made ready for its member's manifest: the member's certificates, the
    /// attachment and its device, then the mount. `vols` is this claim's own copy of the pass's
    /// view; the claim's volume, as last read from the cloud, comes back in [`Staged::fresh`].
    async fn stage(&self, ec: &EtcdCluster, claim: &volumes::Claim, mut vols: Vec<Volume>) -> Staged {
        let mut report = Report::default();
        let mounted = self.stage_into(ec, claim, &mut vols, &mut report).await;
        let fresh = vols.into_iter().find(|v| v.id == claim.volume);
        Staged { report, fresh, mounted }
    }

    async fn stage_into(&self, ec: &EtcdCluster, claim: &volumes::Claim, vols: &mut [Volume], report: &mut Report) -> Result<Option<Volume>, ReconcileError> {
        if ec.tls {
            crate::pki::ensure(
                &self.opts.root,
                &self.opts.store,
                ec,
                &ec.member_id(&claim.member),
                &ec.member_dns(&claim.member, &self.plan.cluster_name),
                &self.me.internal_ip,
            )
            .await?;
        }
        let Some(device) = self.wait_attached_device(&claim.volume, vols, report).await? else { return Ok(None) };
        let Some(vol) = vols.iter().find(|v| v.id == claim.volume).cloned() else { return Ok(None) };
        self.mount(&vol, &device, report).await?;
        Ok(Some(vol))
    }

    /// What the cloud says now: one DescribeVolumes for every etcd volume of the cluster (all zones:
    /// peers are needed for DNS), then one DescribeInstances for every holder and this instance (its
    /// devices).
    async fn observe(&self) -> Result<(Vec<Volume>, BTreeMap<String, Instance>), ReconcileError> {
        let vols = self.cloud.find_volumes(&self.filter()).await?;
        let mut ids: BTreeSet<String> = vols.iter().flat_map(|v| v.attachments.iter().map(|a| a.instance_id.clone())).collect();
        ids.insert(self.me.instance_id.clone());
        let instances: BTreeMap<String, Instance> =
            self.cloud.describe_instances(&ids.into_iter().collect::<Vec<_>>()).await?.into_iter().map(|i| (i.id.clone(), i)).collect();
        Ok((vols, instances))
    }

    /// Live peers of `ec` other than me: (member, private IP).
    fn peers(&self, ec: &EtcdCluster, vols: &[Volume], instances: &BTreeMap<String, Instance>) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for v in vols {
            let Some(m) = etcd_role(v, ec) else { continue };
            if let Some(i) = live_holder(v, instances) {
                if i.id != self.me.instance_id {
                    if let Some(ip) = &i.private_ip {
                        out.push((m, ip.clone()));
                    }
                }
            }
        }
        out.sort();
        out
    }

    /// A client for `member` of `ec` at `ip` (`None`, logged, when its TLS material is not there).
    fn member_client(&self, ec: &EtcdCluster, member: &str, ip: &str) -> Option<etcd::Client> {
        let ip = ip.parse::<IpAddr>().ok()?;
        match etcd::Client::for_member(&self.opts.root, &self.plan.cluster_name, ec, member, ip, self.opts.etcd_timeout) {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(etcd = %ec.name, %member, error = %e, "etcd client");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_pass_that_hangs_ends_at_its_bound() {
        let hung = bounded(Duration::from_millis(50), std::future::pending::<Result<(), ReconcileError>>()).await;
        assert!(matches!(hung, Err(ReconcileError::PassBound { bound }) if bound == Duration::from_millis(50)), "{hung:?}");
        assert!(bounded(Duration::from_secs(1), async { Ok::<_, ReconcileError>(7) }).await.is_ok_and(|v| v == 7));
    }
}
