//! Version change: whether the etcd version change from the running manifest to the spec's may
//! happen now ([`upgrade`]). The refusals ([`refusal`]) are pure; a rolling step asks every other
//! member and takes a backup first.

use std::collections::BTreeMap;

use cloud::dns::Dns;
use cloud::volumes::{Instance, Instances, Volume, Volumes};

use super::Agent;
use crate::config::EtcdCluster;
use crate::manifest;
use crate::upgrade::{self, Change, EtcdVersion};
use crate::{backup, paths};

/// The etcd version the manifest text `current` runs (its first container's image tag).
pub(super) fn running_version(current: Option<&str>) -> Option<EtcdVersion> {
    current.and_then(|t| serde_yaml_ng::from_str::<manifest::Pod>(t).ok()).and_then(|p| p.spec.containers.first().and_then(|c| EtcdVersion::of_image(&c.image)))
}

/// Why `change` (of etcd `name`, seen from `member`) is refused outright; `None` for the changes
/// that need no refusal (none, or rolling).
pub(super) fn refusal(name: &str, member: &str, running: EtcdVersion, wanted: EtcdVersion, change: Change) -> Option<String> {
    match change {
        Change::None | Change::Rolling => None,
        Change::Downgrade => Some(format!(
            "etcd {name}: the spec asks for etcd {wanted}, member {member} runs {running}: downgrades are refused (etcd cannot \
             read what a newer version wrote); set etcdClusters[{name}].version back to {running}, or restore a backup \
             taken before the upgrade with `keelson etcd backup restore`"
        )),
        Change::ViaRestore => Some(format!(
            "etcd {name}: {running} → {wanted} is not an in-place upgrade (only a newer patch or the next minor is; etcd \
             itself upgrades one minor at a time): the members keep running {running}. Step through the minors \
             ({running} → {}.{}.x → …), or take a backup and restore it at the new version: keelson etcd backup create \
             -f SPEC --etcd-cluster {name}, then keelson etcd backup restore -f SPEC --etcd-cluster {name} --latest --yes \
             (every member starts at {wanted} on the restored data, if {wanted} reads it)",
            running.major,
            running.minor + 1
        )),
    }
}

impl<C: Volumes + Instances + Sync, D: Dns + Sync> Agent<C, D> {
    /// Whether the etcd version change from the `current` manifest to the spec's must wait (why),
    /// or may happen now ([`upgrade`]): a rolling step waits for its turn and a backup.
    pub(super) async fn version_change_blocked(
        &self,
        ec: &EtcdCluster,
        member: &str,
        current: Option<&str>,
        vols: &[Volume],
        instances: &BTreeMap<String, Instance>,
    ) -> Option<String> {
        let running = running_version(current)?;
        let wanted = EtcdVersion::parse(&ec.version)?;
        let name = &ec.name;
        let change = upgrade::classify(running, wanted);
        if let Some(why) = refusal(name, member, running, wanted, change) {
            tracing::error!("{why}");
            return Some(why);
        }
        if change != Change::Rolling {
            return None;
        }
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> EtcdVersion {
        EtcdVersion::parse(s).expect(s)
    }

    #[test]
    fn refusals() {
        let (a, b) = (v("3.5.21"), v("3.6.12"));
        assert_eq!(refusal("main", "a", a, a, Change::None), None);
        assert_eq!(refusal("main", "a", a, b, Change::Rolling), None);
        let down = refusal("main", "a", b, a, Change::Downgrade).expect("refused");
        assert!(down.starts_with("etcd main: the spec asks for etcd 3.5.21, member a runs 3.6.12: downgrades are refused"), "{down}");
        let jump = refusal("main", "a", v("3.4.23"), b, Change::ViaRestore).expect("refused");
        assert!(jump.contains("3.4.23 → 3.6.12 is not an in-place upgrade") && jump.contains("(3.4.23 → 3.5.x → …)"), "{jump}");
    }

    #[test]
    fn running_version_from_the_manifest() {
        assert_eq!(running_version(None), None);
        assert_eq!(running_version(Some("not: [a pod")), None);
    }
}
