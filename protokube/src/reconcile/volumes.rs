//! Volumes: keep or claim this member's volume, attach it, wait for its device, format only a blank
//! one and mount it. The decisions ([`held_here`], [`candidates`], [`free_device`], [`prepare`]) are
//! pure; the methods around them do the cloud and disk I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cloud::dns::Dns;
use cloud::volumes::{Attachment, AttachmentState, Instance, InstanceState, Instances, Volume, VolumeFilter, VolumeState, Volumes};
use cloud::VolumeError;

use super::{Agent, ReconcileError, Report, FORMATTED_TAG};
use crate::config::EtcdCluster;
use crate::disk::{self, DiskError, Probe};
use crate::paths;

/// The longest wait between two looks at a volume's detach or attach (`DescribeVolumes`). The old
/// instance's shutdown decides when its volumes are free; every second between that moment and our
/// next look is a second of failover, so the back-off stops at half a second (a few calls a second
/// from one instance for the few seconds it takes, far below EC2's request limits).
const ATTACH_POLL_MAX: Duration = Duration::from_millis(500);
/// The longest wait between two looks for the attached volume's device node (a `stat`).
const DEVICE_POLL_MAX: Duration = Duration::from_millis(100);

/// The volume this instance holds (or has just claimed) for one of its etcd members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Claim {
    pub volume: String,
    pub member: String,
}

/// The etcd role of a volume, from its `k8s.io/etcd/<cluster>=<member>/<all>` tag.
pub(super) fn etcd_role(v: &Volume, ec: &EtcdCluster) -> Option<String> {
    v.tags.get(&ec.tag_key()).and_then(|t| t.split('/').next()).map(str::to_string)
}

/// The live instance `v` is attached to, if any.
pub(super) fn live_holder<'a>(v: &Volume, instances: &'a BTreeMap<String, Instance>) -> Option<&'a Instance> {
    v.attachments.iter().find_map(|a| {
        let i = instances.get(&a.instance_id)?;
        i.state.is_alive().then_some(i)
    })
}

/// The state of instance `me` when it is on its way down (shutting down, terminated, stopping or
/// stopped): it must not claim a volume then. The cloud detaches a terminated instance's volumes
/// (EC2 once its operating system is down; moto at once), and an attach to it fails on AWS
/// (`IncorrectInstanceState`) or, where a cloud accepts it, leaves the replacement a detach to do.
pub(super) fn going_down(instances: &BTreeMap<String, Instance>, me: &str) -> Option<InstanceState> {
    instances.get(me).map(|i| i.state).filter(|s| s.is_going_down())
}

/// The volume of `ec` already attached to instance `me` (and not on its way off).
pub(super) fn held_here(vols: &[Volume], ec: &EtcdCluster, me: &str) -> Option<Claim> {
    let v = vols.iter().find(|v| etcd_role(v, ec).is_some() && v.attachments.iter().any(|a| a.instance_id == me && !a.state.is_leaving()))?;
    etcd_role(v, ec).map(|member| Claim { volume: v.id.clone(), member })
}

/// Volumes in `zone` tagged for one of `mine`, in the order to try them: the member already chosen
/// for another etcd cluster (`preferred`) first, then by member name.
pub(super) fn candidates(vols: &[Volume], ec: &EtcdCluster, zone: &str, mine: &[String], preferred: Option<&str>) -> Vec<Claim> {
    let mut cands: Vec<(bool, String, String)> = vols
        .iter()
        .filter(|v| v.zone == zone)
        .filter_map(|v| etcd_role(v, ec).filter(|m| mine.contains(m)).map(|m| (Some(m.as_str()) != preferred, m, v.id.clone())))
        .collect();
    cands.sort();
    cands.into_iter().map(|(_, member, volume)| Claim { volume, member }).collect()
}

/// Device names in use on instance `me`: its block device mappings and its volumes' attachments.
pub(super) fn used_devices(instances: &BTreeMap<String, Instance>, vols: &[Volume], me: &str) -> BTreeSet<String> {
    instances
        .get(me)
        .map(|i| i.devices.clone())
        .unwrap_or_default()
        .into_iter()
        .chain(vols.iter().flat_map(|v| v.attachments.iter()).filter(|a| a.instance_id == me).map(|a| a.device.clone()))
        .collect()
}

/// The first of `/dev/xvdu`…`/dev/xvdz` used under neither its `xvd` nor its `sd` name.
pub(super) fn free_device(used: &BTreeSet<String>) -> Option<String> {
    (b'u'..=b'z').map(|c| format!("/dev/xvd{}", c as char)).find(|d| !used.contains(d) && !used.contains(&d.replace("/dev/xvd", "/dev/sd")))
}

/// What to do with a probed device before mounting it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Prepare {
    /// Blank and never formatted: make an ext4 file system.
    Format,
    /// Holds a file system of this type: mount it as it is.
    Use(String),
}

/// Format only a blank device that was never formatted; mount only the file systems etcd data
/// lives on; refuse anything else.
pub(super) fn prepare(probe: Probe, formatted: bool, device: &Path, volume: &str) -> Result<Prepare, DiskError> {
    match probe {
        Probe::Blank if formatted => Err(DiskError::BlankButFormatted { device: device.display().to_string(), volume: volume.to_string() }),
        Probe::Blank => Ok(Prepare::Format),
        Probe::Filesystem(t) if t == "ext4" || t == "ext3" || t == "xfs" => Ok(Prepare::Use(t)),
        Probe::Filesystem(t) => Err(DiskError::Foreign { device: device.display().to_string(), what: format!("a {t} filesystem") }),
        Probe::PartitionTable(t) => Err(DiskError::Foreign { device: device.display().to_string(), what: format!("a {t} partition table") }),
    }
}

impl<C: Volumes + Instances + Sync, D: Dns + Sync> Agent<C, D> {
    /// Keep the volume already attached here, or claim one of this group's members' volumes.
    pub(super) async fn claim(
        &self,
        ec: &EtcdCluster,
        vols: &mut [Volume],
        instances: &BTreeMap<String, Instance>,
        preferred: Option<&str>,
        report: &mut Report,
    ) -> Result<Option<Claim>, ReconcileError> {
        let me = &self.me.instance_id;
        if let Some(held) = held_here(vols, ec, me) {
            return Ok(Some(held));
        }
        if let Some(state) = going_down(instances, me) {
            report.waiting.push(format!("etcd {}: this instance is {state:?}: not claiming a volume", ec.name));
            return Ok(None);
        }
        let mine: Vec<String> = self.plan.my_members(ec).iter().map(|m| m.name.clone()).collect();
        let cands = candidates(vols, ec, &self.me.zone, &mine, preferred);
        if cands.is_empty() {
            report
                .waiting
                .push(format!("etcd {}: no volume in zone {} tagged for members {:?} of group {}", ec.name, self.me.zone, mine, self.plan.instance_group));
            return Ok(None);
        }
        let used = used_devices(instances, vols, me);
        for Claim { volume: vid, member } in cands {
            let Some(v) = vols.iter().find(|v| v.id == vid).cloned() else { continue };
            if let Some(holder) = live_holder(&v, instances) {
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
            let Some(device) = free_device(&used) else {
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
                vm.attachments = vec![Attachment { instance_id: me.clone(), device, state: AttachmentState::Attaching }];
            }
            return Ok(Some(Claim { volume: vid, member }));
        }
        Ok(None)
    }

    async fn wait_available(&self, vid: &str) -> Result<bool, ReconcileError> {
        let deadline = Instant::now() + self.opts.attach_timeout;
        let mut delay = Duration::from_millis(100);
        loop {
            let f = VolumeFilter { ids: vec![vid.to_string()], ..Default::default() };
            let v = self.cloud.find_volumes(&f).await?;
            if v.first().is_some_and(|v| v.attachments.is_empty() || v.state == VolumeState::Available) {
                return Ok(true);
            }
            if Instant::now() + delay > deadline {
                return Ok(false);
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(ATTACH_POLL_MAX);
        }
    }

    /// Wait (bounded) for the attachment to complete and the device node to appear.
    pub(super) async fn wait_attached_device(&self, vid: &str, vols: &mut [Volume], report: &mut Report) -> Result<Option<PathBuf>, ReconcileError> {
        let me = &self.me.instance_id;
        let deadline = Instant::now() + self.opts.attach_timeout;
        let mut delay = Duration::from_millis(50);
        let attachment = loop {
            let current = vols.iter().find(|v| v.id == vid).and_then(|v| v.attachments.iter().find(|a| &a.instance_id == me)).cloned();
            if let Some(a) = current.filter(|a| a.state == AttachmentState::Attached) {
                break a;
            }
            if Instant::now() + delay > deadline {
                report.waiting.push(format!("volume {vid}: attachment to {me} not complete after {:?}", self.opts.attach_timeout));
                return Ok(None);
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(ATTACH_POLL_MAX);
            let f = VolumeFilter { ids: vec![vid.to_string()], ..Default::default() };
            if let Some(fresh) = self.cloud.find_volumes(&f).await?.into_iter().next() {
                if let Some(slot) = vols.iter_mut().find(|v| v.id == vid) {
                    *slot = fresh;
                }
            }
        };
        let paths = self.cloud.device_paths(&self.opts.by_id_dir, vid, &attachment.device);
        let deadline = Instant::now() + self.opts.device_timeout;
        let mut delay = Duration::from_millis(20);
        loop {
            if let Some(p) = paths.iter().find(|p| p.exists()) {
                return Ok(Some(p.clone()));
            }
            if Instant::now() + delay > deadline {
                report.waiting.push(format!(
                    "volume {vid}: attached as {} but no device at {} after {:?}",
                    attachment.device,
                    paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" or "),
                    self.opts.device_timeout
                ));
                return Ok(None);
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(DEVICE_POLL_MAX);
        }
    }

    pub(super) async fn mount(&self, vol: &Volume, device: &Path, report: &mut Report) -> Result<(), ReconcileError> {
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
        let fstype = match prepare(probed.map_err(dz)?, vol.tags.contains_key(FORMATTED_TAG), device, &vol.id).map_err(dz)? {
            Prepare::Format => {
                tracing::info!(volume = %vol.id, device = %device.display(), "blank volume: formatting ext4");
                disk::mkfs_ext4(device).map_err(dz)?;
                report.volumes_formatted += 1;
                "ext4".to_string()
            }
            Prepare::Use(t) => t,
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{EtcdMember, Ports};

    fn ec() -> EtcdCluster {
        EtcdCluster {
            name: "main".into(),
            members: ["a", "b", "c"].iter().map(|m| EtcdMember { name: m.to_string(), instance_group: format!("cp-{m}") }).collect(),
            ports: Ports { peer: 2380, client: 4001 },
            image: "registry.k8s.io/etcd:3.5.21-0".into(),
            tls: true,
            client_cert_auth: true,
            cpu_request: None,
            memory_request: None,
            heartbeat_ms: None,
            election_ms: None,
            version: "3.5.21".into(),
            backup_store: "file:///b/main".into(),
            backup_interval: Duration::from_secs(900),
            backup_retention_days: 90,
            backup_hourly_retention: keelson_api::etcd_manager::DEFAULT_HOURLY_RETENTION,
        }
    }

    fn vol(id: &str, zone: &str, member: Option<&str>, attached: &[(&str, &str, AttachmentState)]) -> Volume {
        Volume {
            id: id.into(),
            zone: zone.into(),
            state: if attached.is_empty() { VolumeState::Available } else { VolumeState::InUse },
            size_gib: 20,
            tags: member.map(|m| ("k8s.io/etcd/main".to_string(), format!("{m}/a,b,c"))).into_iter().collect(),
            attachments: attached.iter().map(|(i, d, s)| Attachment { instance_id: i.to_string(), device: d.to_string(), state: *s }).collect(),
        }
    }

    fn instance(id: &str, state: InstanceState, devices: &[&str]) -> (String, Instance) {
        let i = Instance {
            id: id.into(),
            state,
            zone: None,
            private_ip: Some("10.0.0.1".into()),
            public_ip: None,
            devices: devices.iter().map(|d| d.to_string()).collect(),
            group: None,
        };
        (id.to_string(), i)
    }

    fn claim(volume: &str, member: &str) -> Claim {
        Claim { volume: volume.into(), member: member.into() }
    }

    #[test]
    fn the_volume_held_here_unless_it_is_leaving() {
        let ec = ec();
        let vols = [
            vol("vol-other", "z1", Some("c"), &[("i-other", "/dev/xvdu", AttachmentState::Attached)]),
            vol("vol-untagged", "z1", None, &[("i-me", "/dev/xvdv", AttachmentState::Attached)]),
            vol("vol-a", "z1", Some("a"), &[("i-me", "/dev/xvdu", AttachmentState::Attaching)]),
        ];
        assert_eq!(held_here(&vols, &ec, "i-me"), Some(claim("vol-a", "a")));
        for leaving in [AttachmentState::Detaching, AttachmentState::Detached] {
            let vols = [vol("vol-a", "z1", Some("a"), &[("i-me", "/dev/xvdu", leaving)])];
            assert_eq!(held_here(&vols, &ec, "i-me"), None, "{leaving:?}");
        }
    }

    #[test]
    fn candidates_in_zone_for_my_members_preferred_first() {
        let ec = ec();
        let vols = [
            vol("vol-c", "z1", Some("c"), &[]),
            vol("vol-b", "z1", Some("b"), &[]),
            vol("vol-a-elsewhere", "z2", Some("a"), &[]),
            vol("vol-a", "z1", Some("a"), &[]),
            vol("vol-none", "z1", None, &[]),
        ];
        let mine = ["a".to_string(), "b".to_string()];
        assert_eq!(candidates(&vols, &ec, "z1", &mine, None), vec![claim("vol-a", "a"), claim("vol-b", "b")]);
        assert_eq!(candidates(&vols, &ec, "z1", &mine, Some("b")), vec![claim("vol-b", "b"), claim("vol-a", "a")]);
        assert!(candidates(&vols, &ec, "z3", &mine, None).is_empty());
    }

    #[test]
    fn live_holders_only() {
        let vols = [vol("vol-a", "z1", Some("a"), &[("i-old", "/dev/xvdu", AttachmentState::Attached)])];
        let gone: BTreeMap<String, Instance> = [instance("i-old", InstanceState::Terminated, &[])].into_iter().collect();
        assert!(live_holder(&vols[0], &gone).is_none());
        let stopped: BTreeMap<String, Instance> = [instance("i-old", InstanceState::Stopped, &[])].into_iter().collect();
        assert_eq!(live_holder(&vols[0], &stopped).map(|i| i.id.as_str()), Some("i-old"));
        assert!(live_holder(&vols[0], &BTreeMap::new()).is_none(), "an instance the cloud no longer knows");
    }

    #[test]
    fn an_instance_going_down_claims_nothing() {
        let with = |state| -> BTreeMap<String, Instance> { [instance("i-me", state, &[])].into_iter().collect() };
        for state in [InstanceState::ShuttingDown, InstanceState::Terminated, InstanceState::Stopping, InstanceState::Stopped] {
            assert_eq!(going_down(&with(state), "i-me"), Some(state));
        }
        for state in [InstanceState::Pending, InstanceState::Running, InstanceState::Unknown] {
            assert_eq!(going_down(&with(state), "i-me"), None, "{state:?}");
        }
        assert_eq!(going_down(&BTreeMap::new(), "i-me"), None, "not listed (yet): claims as before");
    }

    #[test]
    fn device_names_skip_what_is_used_under_either_name() {
        let instances: BTreeMap<String, Instance> = [instance("i-me", InstanceState::Running, &["/dev/xvda", "/dev/sdu"])].into_iter().collect();
        let vols = [
            vol("vol-x", "z1", None, &[("i-me", "/dev/xvdv", AttachmentState::Attached)]),
            vol("vol-y", "z1", None, &[("i-other", "/dev/xvdw", AttachmentState::Attached)]),
        ];
        let used = used_devices(&instances, &vols, "i-me");
        assert_eq!(used, ["/dev/sdu", "/dev/xvda", "/dev/xvdv"].iter().map(|s| s.to_string()).collect());
        assert_eq!(free_device(&used).as_deref(), Some("/dev/xvdw"));
        let all: BTreeSet<String> = (b'u'..=b'z').map(|c| format!("/dev/sd{}", c as char)).collect();
        assert_eq!(free_device(&all), None);
    }

    #[test]
    fn format_only_a_blank_device_never_formatted() {
        let dev = Path::new("/dev/xvdu");
        let fs = |t: &str| Probe::Filesystem(t.into());
        assert_eq!(prepare(Probe::Blank, false, dev, "vol-1").ok(), Some(Prepare::Format));
        assert!(matches!(prepare(Probe::Blank, true, dev, "vol-1"), Err(DiskError::BlankButFormatted { .. })));
        for t in ["ext4", "ext3", "xfs"] {
            assert_eq!(prepare(fs(t), true, dev, "vol-1").ok(), Some(Prepare::Use(t.into())));
            assert_eq!(prepare(fs(t), false, dev, "vol-1").ok(), Some(Prepare::Use(t.into())));
        }
        assert!(matches!(prepare(fs("btrfs"), false, dev, "vol-1"), Err(DiskError::Foreign { .. })));
        assert!(matches!(prepare(Probe::PartitionTable("gpt".into()), false, dev, "vol-1"), Err(DiskError::Foreign { .. })));
    }
}
