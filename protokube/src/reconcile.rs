//! One level-triggered pass: find volumes → claim → attach → device → format/mount → manifest → DNS.
//! Every step checks the actual state first and acts only on the difference, so a second pass over a
//! converged host makes no change (and only read calls).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cloud::dns::{Dns, Record, RecordChange};
use cloud::volumes::{Attachment, Instance, Instances, Volume, VolumeFilter, Volumes};
use cloud::{Identity, VolumeError};

use crate::config::{DnsMode, EtcdCluster, Plan};
use crate::disk::{self, DiskError, Probe};
use crate::manifest::{self, Bootstrap};
use crate::upgrade::{self, Change, EtcdVersion};
use crate::{backup, etcd, hosts, paths, restore};

/// Route53 TTL for every record protokube writes.
pub const TTL: i64 = 60;
/// Placeholder address for a record whose owner is not known yet (kOps' value).
pub const PLACEHOLDER: &str = "203.0.113.123";
/// Tag that marks a volume holding a filesystem protokube (or kOps) initialised.
pub const FORMATTED_TAG: &str = "keelson.io/etcd-formatted";
/// Set on a member's volume once that member has been seen started in a cluster with quorum: from
/// then on the cluster exists, and a blank volume must join it, never bootstrap a new one.
pub const STARTED_TAG: &str = "keelson.io/etcd-started";
/// Per-volume record of how the member bootstraps (kept on the volume).
pub const BOOTSTRAP_FILE: &str = "keelson-etcd-bootstrap.json";

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
    /// What restores etcd snapshots (`etcdutl`, or etcdctl 3.4).
    pub restore_tool: Option<crate::restore::RestoreTool>,
    /// How long one pass waits for a member to stop before a restore.
    pub stop_timeout: Duration,
    /// Time for backup ids (tests move it).
    pub clock: crate::backup::Clock,
    /// How long a member on a blank volume waits for a peer before it says the cluster lost quorum.
    pub quorum_loss_wait: Duration,
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
}

/// The etcd role of a volume, from its `k8s.io/etcd/<cluster>=<member>/<all>` tag.
fn etcd_role(v: &Volume, ec: &EtcdCluster) -> Option<String> {
    v.tags.get(&ec.tag_key()).and_then(|t| t.split('/').next()).map(str::to_string)
}

fn live_holder<'a>(v: &Volume, instances: &'a BTreeMap<String, Instance>) -> Option<(&'a Instance, ())> {
    v.attachments.iter().find_map(|a| {
        let i = instances.get(&a.instance_id)?;
        i.state.is_alive().then_some((i, ()))
    })
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
}

impl<C: Volumes + Instances + Sync, D: Dns + Sync> Agent<C, D> {
    pub fn new(plan: Plan, me: Identity, opts: Options, cloud: C, dns: Option<D>) -> Self {
        Agent { plan, me, opts, cloud, dns, zone_id: None, blank_since: Default::default() }
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

    /// One full pass.
    pub async fn reconcile(&mut self) -> Result<Report, ReconcileError> {
        let mut report = Report::default();
        // 1. One DescribeVolumes for every etcd volume of the cluster (all zones: peers are needed for DNS).
        let mut vols = self.cloud.find_volumes(&self.filter()).await?;
        // 2. One DescribeInstances for every holder, and this instance (its devices).
        let mut ids: BTreeSet<String> = vols.iter().flat_map(|v| v.attachments.iter().map(|a| a.instance_id.clone())).collect();
        ids.insert(self.me.instance_id.clone());
        let instances: BTreeMap<String, Instance> =
            self.cloud.describe_instances(&ids.into_iter().collect::<Vec<_>>()).await?.into_iter().map(|i| (i.id.clone(), i)).collect();

        // 3. Per etcd cluster: keep or claim a volume, then mount it and write the manifest.
        let clusters = self.plan.etcd_clusters.clone();
        let mut preferred: Option<String> = None;
        for ec in &clusters {
            if self.plan.my_members(ec).is_empty() {
                continue;
            }
            let claimed = match self.claim(ec, &mut vols, &instances, preferred.as_deref(), &mut report).await? {
                Some(c) => c,
                None => continue,
            };
            preferred.get_or_insert(claimed.1.clone());
            let (vol_id, member) = claimed;
            let Some(device) = self.wait_attached_device(&vol_id, &mut vols, &mut report).await? else { continue };
            let vol = vols.iter().find(|v| v.id == vol_id).cloned();
            let Some(vol) = vol else { continue };
            match self.mount(&vol, &device, &mut report).await {
                Ok(()) => {}
                Err(e @ ReconcileError::Disk { .. }) => {
                    // A refused device blocks only this volume; say so loudly and go on.
                    tracing::error!(error = %e, "not mounting");
                    report.refused.push(e.to_string());
                    continue;
                }
                Err(e) => return Err(e),
            }
            report.mounted.insert(ec.name.clone(), vol.id.clone());
            match self.restore_step(ec, &member, &vol).await {
                Ok(restore::Gate::Proceed) => {}
                Ok(restore::Gate::Hold(why)) => {
                    report.waiting.push(why);
                    continue;
                }
                Err(e) => {
                    tracing::error!(error = %e, "etcd restore step failed");
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

        // 4. DNS from what the cloud says now.
        report.dns_records = self.sync_dns(&vols, &instances, &mut report).await?;
        Ok(report)
    }

    /// Keep the volume already attached here, or claim one of this group's members' volumes.
    async fn claim(
        &self,
        ec: &EtcdCluster,
        vols: &mut [Volume],
        instances: &BTreeMap<String, Instance>,
        preferred: Option<&str>,
        report: &mut Report,
    ) -> Result<Option<(String, String)>, ReconcileError> {
        let me = &self.me.instance_id;
        if let Some(v) = vols
            .iter()
            .find(|v| etcd_role(v, ec).is_some() && v.attachments.iter().any(|a| &a.instance_id == me && a.state != "detaching" && a.state != "detached"))
        {
            return Ok(etcd_role(v, ec).map(|m| (v.id.clone(), m)));
        }
        let mine: Vec<String> = self.plan.my_members(ec).iter().map(|m| m.name.clone()).collect();
        // Deterministic order: the member already chosen for another etcd cluster first, then by name.
        let mut cands: Vec<(bool, String, String)> = vols
            .iter()
            .filter(|v| v.zone == self.me.zone)
            .filter_map(|v| etcd_role(v, ec).filter(|m| mine.contains(m)).map(|m| (Some(m.as_str()) != preferred, m, v.id.clone())))
            .collect();
        cands.sort();
        if cands.is_empty() {
            report
                .waiting
                .push(format!("etcd {}: no volume in zone {} tagged for members {:?} of group {}", ec.name, self.me.zone, mine, self.plan.instance_group));
            return Ok(None);
        }
        let used: BTreeSet<String> = instances
            .get(me)
            .map(|i| i.devices.clone())
            .unwrap_or_default()
            .into_iter()
            .chain(vols.iter().flat_map(|v| v.attachments.iter()).filter(|a| &a.instance_id == me).map(|a| a.device.clone()))
            .collect();
        for (_, member, vid) in cands {
            let Some(v) = vols.iter().find(|v| v.id == vid).cloned() else { continue };
            if let Some((holder, _)) = live_holder(&v, instances) {
                report.waiting.push(format!(
                    "etcd {} member {member}: volume {vid} is attached to live instance {} ({:?}); not touching it",
                    ec.name, holder.id, holder.state
                ));
                continue;
            }
            // Attached to an instance that is gone: detach it first (AWS does this itself after termination).
            for a in &v.attachments {
                tracing::info!(volume = %vid, instance = %a.instance_id, "detaching from terminated instance");
                self.cloud.detach_volume(&vid, &a.instance_id).await?;
            }
            if !v.attachments.is_empty() && !self.wait_available(&vid).await? {
                report.waiting.push(format!("etcd {} member {member}: volume {vid} still detaching", ec.name));
                continue;
            }
            let Some(device) =
                (b'u'..=b'z').map(|c| format!("/dev/xvd{}", c as char)).find(|d| !used.contains(d) && !used.contains(&d.replace("/dev/xvd", "/dev/sd")))
            else {
                report.waiting.push(format!("no free device name on {me}"));
                return Ok(None);
            };
            tracing::info!(volume = %vid, %device, etcd = %ec.name, %member, "attaching");
            match self.cloud.attach_volume(&vid, me, &device).await {
                Ok(()) => {}
                Err(VolumeError::InUse { .. }) => {
                    report.waiting.push(format!("etcd {} member {member}: lost the race for {vid}", ec.name));
                    continue;
                }
                Err(e) => return Err(e.into()),
            }
            if let Some(vm) = vols.iter_mut().find(|x| x.id == vid) {
                vm.attachments = vec![Attachment { instance_id: me.clone(), device, state: "attaching".into() }];
            }
            return Ok(Some((vid, member)));
        }
        Ok(None)
    }

    async fn wait_available(&self, vid: &str) -> Result<bool, ReconcileError> {
        let deadline = Instant::now() + self.opts.attach_timeout;
        let mut delay = Duration::from_millis(100);
        loop {
            let f = VolumeFilter { ids: vec![vid.to_string()], ..Default::default() };
            let v = self.cloud.find_volumes(&f).await?;
            if v.first().is_some_and(|v| v.attachments.is_empty() || v.state == "available") {
                return Ok(true);
            }
            if Instant::now() + delay > deadline {
                return Ok(false);
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(2));
        }
    }

    /// Wait (bounded) for the attachment to complete and the device node to appear.
    async fn wait_attached_device(&self, vid: &str, vols: &mut [Volume], report: &mut Report) -> Result<Option<PathBuf>, ReconcileError> {
        let me = &self.me.instance_id;
        let deadline = Instant::now() + self.opts.attach_timeout;
        let mut delay = Duration::from_millis(50);
        let attachment = loop {
            let current = vols.iter().find(|v| v.id == vid).and_then(|v| v.attachments.iter().find(|a| &a.instance_id == me)).cloned();
            if let Some(a) = current.filter(|a| a.state == "attached") {
                break a;
            }
            if Instant::now() + delay > deadline {
                report.waiting.push(format!("volume {vid}: attachment to {me} not complete after {:?}", self.opts.attach_timeout));
                return Ok(None);
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(2));
            let f = VolumeFilter { ids: vec![vid.to_string()], ..Default::default() };
            if let Some(fresh) = self.cloud.find_volumes(&f).await?.into_iter().next() {
                if let Some(slot) = vols.iter_mut().find(|v| v.id == vid) {
                    *slot = fresh;
                }
            }
        };
        let nvme = self.opts.by_id_dir.join(format!("nvme-Amazon_Elastic_Block_Store_{}", vid.replace('-', "")));
        let mut xvd = vec![PathBuf::from(&attachment.device)];
        if let Some(letter) = attachment.device.strip_prefix("/dev/sd") {
            xvd.push(PathBuf::from(format!("/dev/xvd{letter}")));
        }
        let deadline = Instant::now() + self.opts.device_timeout;
        let mut delay = Duration::from_millis(20);
        loop {
            if nvme.exists() {
                return Ok(Some(nvme));
            }
            if let Some(p) = xvd.iter().find(|p| p.exists()) {
                return Ok(Some(p.clone()));
            }
            if Instant::now() + delay > deadline {
                report.waiting.push(format!(
                    "volume {vid}: attached as {} but no device at {} or {:?} after {:?}",
                    attachment.device,
                    nvme.display(),
                    xvd,
                    self.opts.device_timeout
                ));
                return Ok(None);
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_millis(500));
        }
    }

    async fn mount(&self, vol: &Volume, device: &Path, report: &mut Report) -> Result<(), ReconcileError> {
        let dz = |source| ReconcileError::Disk { volume: vol.id.clone(), source };
        let target = paths::under(&self.opts.root, &paths::mount_point(&vol.id));
        let want = disk::dev_numbers(device).map_err(dz)?;
        if let Some(found) = disk::mounted_at(&target).map_err(dz)? {
            if found != want {
                return Err(dz(DiskError::WrongMount {
                    path: target.display().to_string(),
                    found: format!("{}:{}", found.0, found.1),
                    device: disk::canonical(device).display().to_string(),
                    expected: format!("{}:{}", want.0, want.1),
                }));
            }
            return Ok(());
        }
        let dev = device.to_path_buf();
        let probed = tokio::task::spawn_blocking(move || disk::probe(&dev))
            .await
            .map_err(|e| ReconcileError::Io { path: device.display().to_string(), source: std::io::Error::other(e) })?;
        let fstype = match probed.map_err(dz)? {
            Probe::Blank => {
                if vol.tags.contains_key(FORMATTED_TAG) {
                    return Err(dz(DiskError::BlankButFormatted { device: device.display().to_string(), volume: vol.id.clone() }));
                }
                tracing::info!(volume = %vol.id, device = %device.display(), "blank volume: formatting ext4");
                disk::mkfs_ext4(device).map_err(dz)?;
                report.volumes_formatted += 1;
                "ext4".to_string()
            }
            Probe::Filesystem(t) if t == "ext4" || t == "ext3" || t == "xfs" => t,
            Probe::Filesystem(t) => return Err(dz(DiskError::Foreign { device: device.display().to_string(), what: format!("a {t} filesystem") })),
            Probe::PartitionTable(t) => return Err(dz(DiskError::Foreign { device: device.display().to_string(), what: format!("a {t} partition table") })),
        };
        if !vol.tags.contains_key(FORMATTED_TAG) {
            self.cloud.tag_volume(&vol.id, &[(FORMATTED_TAG.to_string(), fstype.clone())]).await?;
        }
        disk::fsck(device, &fstype).map_err(dz)?;
        disk::mount(device, &target, &fstype).map_err(dz)?;
        match disk::mounted_at(&target).map_err(dz)? {
            Some(found) if found == want => {}
            other => {
                return Err(dz(DiskError::WrongMount {
                    path: target.display().to_string(),
                    found: format!("{other:?}"),
                    device: device.display().to_string(),
                    expected: format!("{}:{}", want.0, want.1),
                }))
            }
        }
        tracing::info!(volume = %vol.id, target = %target.display(), "mounted");
        report.volumes_mounted += 1;
        Ok(())
    }

    /// Live peers of `ec` other than me: (member, private IP).
    fn peers(&self, ec: &EtcdCluster, vols: &[Volume], instances: &BTreeMap<String, Instance>) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for v in vols {
            let Some(m) = etcd_role(v, ec) else { continue };
            if let Some((i, _)) = live_holder(v, instances) {
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

    async fn bootstrap(
        &self,
        ec: &EtcdCluster,
        member: &str,
        mount: &Path,
        vols: &[Volume],
        instances: &BTreeMap<String, Instance>,
    ) -> Result<Option<Bootstrap>, ReconcileError> {
        let file = mount.join(BOOTSTRAP_FILE);
        let io = |source| ReconcileError::Io { path: file.display().to_string(), source };
        if let Ok(text) = std::fs::read_to_string(&file) {
            if let Ok(b) = serde_json::from_str::<Bootstrap>(&text) {
                return Ok(Some(b));
            }
        }
        let cluster = &self.plan.cluster_name;
        let me_url = ec.peer_url(member, cluster);
        let all: Vec<(String, String)> = ec.members.iter().map(|m| (ec.member_id(&m.name), ec.peer_url(&m.name, cluster))).collect();
        let has_data = mount.join("data").join("member").exists();
        let b = if has_data {
            // Data from an earlier life (e.g. kOps): etcd ignores the initial-* flags; keep them valid.
            Bootstrap { state: "existing".into(), initial_cluster: all }
        } else {
            match self.existing_members(ec, vols, instances).await {
                // No peer answers. A cluster that has run before (some other member's volume says
                // so) is only unreachable for now: decide nothing, ask again next pass.
                None if vols.iter().any(|v| v.tags.contains_key(STARTED_TAG) && etcd_role(v, ec).is_some_and(|m| m != member)) => {
                    return Ok(None);
                }
                None => Bootstrap { state: "new".into(), initial_cluster: all },
                Some((client, members)) => {
                    let mine = members.iter().find(|m| m.peer_urls.iter().any(|u| u == &me_url));
                    let mut members = members.clone();
                    match mine {
                        Some(m) if m.name.is_empty() => {}
                        Some(m) => {
                            // The cluster remembers a started member with my identity, but my volume is
                            // fresh: that member's data is gone. Replace it.
                            tracing::warn!(etcd = %ec.name, id = %m.id, "member has no data: removing and re-adding");
                            self.backup_before_change(ec, &client).await;
                            client.remove(&m.id).await.map_err(|source| ReconcileError::Etcd { cluster: ec.name.clone(), source })?;
                            members = client.add(&me_url).await.map_err(|source| ReconcileError::Etcd { cluster: ec.name.clone(), source })?;
                        }
                        None => {
                            tracing::info!(etcd = %ec.name, peer = %me_url, "adding member to existing cluster");
                            self.backup_before_change(ec, &client).await;
                            members = client.add(&me_url).await.map_err(|source| ReconcileError::Etcd { cluster: ec.name.clone(), source })?;
                        }
                    }
                    let mut ic: Vec<(String, String)> = members
                        .iter()
                        .filter_map(|m| {
                            let url = m.peer_urls.first()?.clone();
                            let name = if m.name.is_empty() { all.iter().find(|(_, u)| *u == url).map(|(n, _)| n.clone())? } else { m.name.clone() };
                            Some((name, url))
                        })
                        .collect();
                    if !ic.iter().any(|(_, u)| *u == me_url) {
                        ic.push((ec.member_id(member), me_url.clone()));
                    }
                    ic.sort();
                    Bootstrap { state: "existing".into(), initial_cluster: ic }
                }
            }
        };
        let text = serde_json::to_string_pretty(&b).unwrap_or_default();
        base::fs::write_atomic(&file, text.as_bytes(), 0o644, None).map_err(|e| io(e.source))?;
        Ok(Some(b))
    }

    /// This member's part in a requested restore ([`restore`]).
    async fn restore_step(&self, ec: &EtcdCluster, member: &str, vol: &Volume) -> Result<restore::Gate, ReconcileError> {
        let store = match backup::open_store(ec, self.opts.s3.as_ref()) {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "no backup store: no restores");
                return Ok(restore::Gate::Proceed);
            }
        };
        let Ok(ip) = self.me.internal_ip.parse::<IpAddr>() else { return Ok(restore::Gate::Proceed) };
        let step = restore::MemberRestore {
            ec,
            cluster_name: &self.plan.cluster_name,
            member,
            mount: paths::under(&self.opts.root, &paths::mount_point(&vol.id)),
            manifest: paths::under(&self.opts.root, &paths::manifest_path(&ec.name)),
            store,
            tool: self.opts.restore_tool.clone(),
            local: Box::new(move || backup::local_client(&self.opts.root, &self.plan.cluster_name, &self.me.internal_ip, ec, member, self.opts.etcd_timeout)),
            client_addr: SocketAddr::new(ip, ec.ports.client),
            stop_timeout: self.opts.stop_timeout,
        };
        step.step().await.map_err(|e| ReconcileError::Restore(Box::new(e)))
    }

    /// A backup before a membership change, from the peer that answered. A failure is loud but
    /// does not block the change: replacing a lost member matters more than one more backup.
    async fn backup_before_change(&self, ec: &EtcdCluster, client: &etcd::Client) {
        let staging = paths::under(&self.opts.root, paths::BACKUP_STAGING_DIR);
        let result = async {
            let store = backup::open_store(ec, self.opts.s3.as_ref())?;
            backup::take(client, ec, &store, "before member change", self.opts.clock.now(), &staging).await
        }
        .await;
        match result {
            Ok(meta) => tracing::info!(etcd = %ec.name, backup = %meta.id, revision = meta.revision, "backup before the membership change"),
            Err(e) => tracing::error!(etcd = %ec.name, error = %e, "no backup before the membership change (going ahead with it)"),
        }
    }

    /// Tag the volume [`STARTED_TAG`] once the local member answers as a started member of a
    /// cluster with quorum. Best effort: retried every pass until it succeeds.
    async fn mark_started(&self, ec: &EtcdCluster, member: &str, vol: &Volume) {
        let Some(client) = self.member_client(ec, member, &self.me.internal_ip) else { return };
        let me_url = ec.peer_url(member, &self.plan.cluster_name);
        match client.members().await {
            Ok(list) if list.iter().any(|m| !m.name.is_empty() && m.peer_urls.iter().any(|u| u == &me_url)) => {
                match self.cloud.tag_volume(&vol.id, &[(STARTED_TAG.to_string(), "true".to_string())]).await {
                    Ok(()) => tracing::info!(etcd = %ec.name, %member, volume = %vol.id, "member started: volume tagged"),
                    Err(e) => tracing::warn!(error = %e, volume = %vol.id, "tagging the started member's volume"),
                }
            }
            Ok(_) => tracing::debug!(etcd = %ec.name, %member, "member not started yet"),
            Err(e) => tracing::debug!(etcd = %ec.name, %member, error = %e, "local member not answering yet"),
        }
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

    /// Ask live peers for the member list; the first that answers wins.
    async fn existing_members(&self, ec: &EtcdCluster, vols: &[Volume], instances: &BTreeMap<String, Instance>) -> Option<(etcd::Client, Vec<etcd::Member>)> {
        for (member, ip) in self.peers(ec, vols, instances) {
            let Some(client) = self.member_client(ec, &member, &ip) else { continue };
            match client.members().await {
                Ok(m) => return Some((client, m)),
                Err(e) => tracing::info!(etcd = %ec.name, %member, error = %e, "peer did not answer"),
            }
        }
        None
    }

    async fn write_manifest(
        &self,
        ec: &EtcdCluster,
        member: &str,
        vol: &Volume,
        vols: &[Volume],
        instances: &BTreeMap<String, Instance>,
        report: &mut Report,
    ) -> Result<bool, ReconcileError> {
        let mount = paths::under(&self.opts.root, &paths::mount_point(&vol.id));
        if ec.tls {
            crate::pki::ensure(
                &self.opts.root,
                &self.opts.store,
                ec,
                &ec.member_id(member),
                &ec.member_dns(member, &self.plan.cluster_name),
                &self.me.internal_ip,
            )
            .await?;
        }
        let Some(boot) = self.bootstrap(ec, member, &mount, vols, instances).await? else {
            let waited = {
                let mut since = self.blank_since.lock().unwrap_or_else(|p| p.into_inner());
                since.entry(ec.name.clone()).or_insert_with(Instant::now).elapsed()
            };
            let mut why = format!(
                "etcd {} member {member}: blank volume and no live peer answers; the cluster has run before, so this member \
                 joins it once a peer answers (it never bootstraps a new cluster over it)",
                ec.name
            );
            if waited >= self.opts.quorum_loss_wait {
                why = format!(
                    "{why}. No member of etcd {0} has answered for {1:?}: the cluster has lost quorum. If the other members \
                     cannot come back, restore it from its latest backup: keelson etcd backup restore -f SPEC --etcd-cluster {0} \
                     --latest --yes",
                    ec.name, waited
                );
                tracing::error!(etcd = %ec.name, %member, waited_s = waited.as_secs(), "QUORUM LOST: {why}");
            }
            report.waiting.push(why);
            return Ok(false);
        };
        self.blank_since.lock().unwrap_or_else(|p| p.into_inner()).remove(&ec.name);
        let pod = manifest::render(ec, &self.plan.cluster_name, member, &vol.id, &boot);
        let text = manifest::to_yaml(&pod);
        let path = paths::under(&self.opts.root, &paths::manifest_path(&ec.name));
        let current = std::fs::read_to_string(&path).ok();
        if current.as_deref() == Some(text.as_str()) {
            return Ok(false);
        }
        if let Some(why) = self.version_change_blocked(ec, member, current.as_deref(), vols, instances).await {
            report.waiting.push(why);
            return Ok(false);
        }
        base::fs::write_atomic(&path, text.as_bytes(), 0o644, None).map_err(|e| ReconcileError::Io { path: path.display().to_string(), source: e.source })?;
        tracing::info!(path = %path.display(), "wrote etcd manifest");
        Ok(true)
    }

    /// Whether the etcd version change from the `current` manifest to the spec's must wait (why),
    /// or may happen now ([`upgrade`]): a rolling step waits for its turn and a backup.
    async fn version_change_blocked(
        &self,
        ec: &EtcdCluster,
        member: &str,
        current: Option<&str>,
        vols: &[Volume],
        instances: &BTreeMap<String, Instance>,
    ) -> Option<String> {
        let running = current
            .and_then(|t| serde_yaml_ng::from_str::<manifest::Pod>(t).ok())
            .and_then(|p| p.spec.containers.first().and_then(|c| EtcdVersion::of_image(&c.image)))?;
        let wanted = EtcdVersion::parse(&ec.version)?;
        let name = &ec.name;
        match upgrade::classify(running, wanted) {
            Change::None => None,
            Change::Downgrade => {
                let why = format!(
                    "etcd {name}: the spec asks for etcd {wanted}, member {member} runs {running}: downgrades are refused (etcd cannot \
                     read what a newer version wrote); set etcdClusters[{name}].version back to {running}, or restore a backup \
                     taken before the upgrade with `keelson etcd backup restore`"
                );
                tracing::error!("{why}");
                Some(why)
            }
            Change::ViaRestore => {
                let why = format!(
                    "etcd {name}: {running} → {wanted} is not an in-place upgrade (only a newer patch or the next minor is; etcd \
                     itself upgrades one minor at a time): the members keep running {running}. Step through the minors \
                     ({running} → {}.{}.x → …), or take a backup and restore it at the new version: keelson etcd backup create \
                     -f SPEC --etcd-cluster {name}, then keelson etcd backup restore -f SPEC --etcd-cluster {name} --latest --yes \
                     (every member starts at {wanted} on the restored data, if {wanted} reads it)",
                    running.major,
                    running.minor + 1
                );
                tracing::error!("{why}");
                Some(why)
            }
            Change::Rolling => {
                // One member at a time, in name order, while every other member answers.
                let peers: BTreeMap<String, String> = self.peers(ec, vols, instances).into_iter().collect();
                for m in ec.members.iter().map(|m| m.name.as_str()).filter(|m| *m != member) {
                    let wait = |what: String| Some(format!("etcd {name} upgrade {running} → {wanted} of member {member}: {what}"));
                    let Some(ip) = peers.get(m) else {
                        return wait(format!("member {m} has no live instance"));
                    };
                    let Some(client) = self.member_client(ec, m, ip) else {
                        return wait(format!("no client for member {m}"));
                    };
                    let status = match client.status().await {
                        Ok(s) => s,
                        Err(e) => return wait(format!("member {m} does not answer ({e})")),
                    };
                    if m < member && EtcdVersion::parse(&status.version) != Some(wanted) {
                        return wait(format!("member {m} upgrades first (it runs {})", status.version));
                    }
                }
                if let Err(e) = self.backup_before_upgrade(ec, member, wanted).await {
                    return Some(format!("etcd {name} upgrade to {wanted}: no backup before it, so not yet: {e}"));
                }
                tracing::warn!(etcd = %name, %member, from = %running, to = %wanted, "upgrading this member");
                None
            }
        }
    }

    /// The backup an upgrade to `wanted` starts from (taken once, by the first member to upgrade).
    async fn backup_before_upgrade(&self, ec: &EtcdCluster, member: &str, wanted: EtcdVersion) -> Result<(), backup::BackupRunError> {
        let store = backup::open_store(ec, self.opts.s3.as_ref())?;
        let reason = upgrade::backup_reason(wanted);
        let store_err = |source| backup::BackupRunError::Store { cluster: ec.name.clone(), source: Box::new(source) };
        if store.list().await.map_err(store_err)?.iter().any(|b| b.reason == reason) {
            return Ok(());
        }
        let client = backup::local_client(&self.opts.root, &self.plan.cluster_name, &self.me.internal_ip, ec, member, self.opts.etcd_timeout)
            .ok_or_else(|| backup::BackupRunError::Io { path: "etcd client".into(), source: std::io::Error::other("no client for the local member") })?;
        let staging = paths::under(&self.opts.root, paths::BACKUP_STAGING_DIR);
        let meta = backup::take(&client, ec, &store, &reason, self.opts.clock.now(), &staging).await?;
        tracing::info!(etcd = %ec.name, backup = %meta.id, revision = meta.revision, "{reason}: backup written");
        Ok(())
    }

    /// name → addresses (`None`: no live owner known).
    pub fn desired_records(&self, vols: &[Volume], instances: &BTreeMap<String, Instance>) -> BTreeMap<String, Option<Vec<String>>> {
        let cluster = &self.plan.cluster_name;
        let mut out: BTreeMap<String, Option<Vec<String>>> = BTreeMap::new();
        let mut api_private: BTreeSet<String> = BTreeSet::new();
        let mut api_public: BTreeSet<String> = BTreeSet::new();
        for ec in &self.plan.etcd_clusters {
            for m in &ec.members {
                let holder = vols.iter().filter(|v| etcd_role(v, ec).as_deref() == Some(m.name.as_str())).find_map(|v| live_holder(v, instances));
                let ip = holder.and_then(|(i, _)| i.private_ip.clone());
                if ec.name == "main" {
                    if let Some((i, _)) = holder {
                        api_private.extend(i.private_ip.clone());
                        api_public.extend(i.public_ip.clone());
                    }
                }
                out.insert(ec.member_dns(&m.name, cluster), ip.map(|ip| vec![ip]));
            }
        }
        let some = |s: BTreeSet<String>| (!s.is_empty()).then(|| s.into_iter().collect::<Vec<_>>());
        // The public name only in a real zone; the hosts file carries the internal names.
        if self.plan.manage_public_api && self.plan.dns != DnsMode::Hosts {
            let public = if api_public.is_empty() { api_private.clone() } else { api_public };
            out.insert(self.plan.api_public(), some(public));
        }
        // Where workers join (the join server runs on every control plane): always the control
        // planes themselves, even when `api.internal` is an alias to the API load balancer (443 only).
        out.insert(self.plan.kops_controller_internal(), some(api_private.clone()));
        if self.plan.manage_internal_api {
            out.insert(self.plan.api_internal(), some(api_private));
        }
        out
    }

    async fn sync_dns(&mut self, vols: &[Volume], instances: &BTreeMap<String, Instance>, report: &mut Report) -> Result<usize, ReconcileError> {
        let desired = self.desired_records(vols, instances);
        match &self.plan.dns {
            DnsMode::Hosts => {
                let entries: hosts::Entries = desired.into_iter().filter_map(|(n, ips)| Some((n, ips?))).collect();
                let path = self.opts.hosts_file.clone();
                let changed = tokio::task::spawn_blocking(move || hosts::update(&path, &entries))
                    .await
                    .map_err(|e| ReconcileError::Io { path: "hosts".into(), source: std::io::Error::other(e) })??;
                Ok(changed.len())
            }
            DnsMode::Route53 { zone, private } => {
                let Some(dns) = &self.dns else {
                    report.waiting.push("Route53 provider not configured".into());
                    return Ok(0);
                };
                let zone_id = match &self.zone_id {
                    Some(z) => z.clone(),
                    None => {
                        let z = dns.find_zone_with(zone.as_deref(), &self.plan.cluster_name, Some(*private)).await?;
                        self.zone_id = Some(z.clone());
                        z
                    }
                };
                let existing: BTreeMap<String, Record> =
                    dns.list_records(&zone_id, &self.plan.cluster_name).await?.into_iter().filter(|r| r.rtype == "A").map(|r| (r.name.clone(), r)).collect();
                let changes = route53_changes(&desired, &existing);
                if changes.is_empty() {
                    return Ok(0);
                }
                match dns.apply_changes(&zone_id, &changes).await {
                    Ok(_) => Ok(changes.len()),
                    Err(e) if changes.len() > 1 => {
                        // One bad record must not block the others: retry one by one, report the bad ones.
                        tracing::warn!(error = %e, "batched DNS change failed; applying records one by one");
                        let mut done = 0;
                        for c in &changes {
                            match dns.apply_changes(&zone_id, std::slice::from_ref(c)).await {
                                Ok(_) => done += 1,
                                Err(e) => report.waiting.push(format!("DNS change {c:?}: {e}")),
                            }
                        }
                        Ok(done)
                    }
                    Err(e) => Err(e.into()),
                }
            }
        }
    }
}

/// The UPSERTs that make Route53 match `desired`: real addresses replace whatever is there (including
/// the placeholder); a name without a known owner gets the placeholder only if it has no record yet.
pub fn route53_changes(desired: &BTreeMap<String, Option<Vec<String>>>, existing: &BTreeMap<String, Record>) -> Vec<RecordChange> {
    let mut out = Vec::new();
    for (name, want) in desired {
        let values = match (want, existing.get(name)) {
            (Some(ips), _) => ips.clone(),
            (None, Some(_)) => continue,
            (None, None) => vec![PLACEHOLDER.to_string()],
        };
        let rec = Record { name: name.clone(), rtype: "A".into(), ttl: TTL, values };
        if existing.get(name) != Some(&rec) {
            out.push(RecordChange::Upsert(rec));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(name: &str, values: &[&str], ttl: i64) -> Record {
        Record { name: name.into(), rtype: "A".into(), ttl, values: values.iter().map(|s| s.to_string()).collect() }
    }

    #[test]
    fn route53_changes_fill_placeholders_and_replace_stale() {
        let desired: BTreeMap<String, Option<Vec<String>>> = [
            ("up-to-date".to_string(), Some(vec!["10.0.0.1".to_string()])),
            ("stale".to_string(), Some(vec!["10.0.0.2".to_string()])),
            ("placeholder-now-known".to_string(), Some(vec!["10.0.0.3".to_string()])),
            ("unknown-missing".to_string(), None),
            ("unknown-existing".to_string(), None),
            ("wrong-ttl".to_string(), Some(vec!["10.0.0.4".to_string()])),
        ]
        .into_iter()
        .collect();
        let existing: BTreeMap<String, Record> = [
            rec("up-to-date", &["10.0.0.1"], 60),
            rec("stale", &["10.9.9.9"], 60),
            rec("placeholder-now-known", &[PLACEHOLDER], 60),
            rec("unknown-existing", &["10.0.0.7"], 60),
            rec("wrong-ttl", &["10.0.0.4"], 300),
        ]
        .into_iter()
        .map(|r| (r.name.clone(), r))
        .collect();
        let got = route53_changes(&desired, &existing);
        let want = vec![
            RecordChange::Upsert(rec("placeholder-now-known", &["10.0.0.3"], 60)),
            RecordChange::Upsert(rec("stale", &["10.0.0.2"], 60)),
            RecordChange::Upsert(rec("unknown-missing", &[PLACEHOLDER], 60)),
            RecordChange::Upsert(rec("wrong-ttl", &["10.0.0.4"], 60)),
        ];
        assert_eq!(got, want);
    }
}
