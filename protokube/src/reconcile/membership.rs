//! Membership: how this member starts (new cluster, or join the one its live peers serve), its part
//! in a requested restore, the manifest that runs it, and the tag that says it has started. The
//! decisions ([`started_elsewhere`], [`join_action`], [`initial_cluster`]) are pure; the methods
//! around them talk to etcd, the cloud and the volume.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Instant;

use cloud::dns::Dns;
use cloud::volumes::{Instance, Instances, Volume, Volumes};

use super::volumes::etcd_role;
use super::{Agent, ReconcileError, Report, BOOTSTRAP_FILE, STARTED_TAG};
use crate::config::EtcdCluster;
use crate::manifest::{self, Bootstrap, ClusterState};
use crate::{backup, etcd, paths, restore};

/// Whether a member of `ec` other than `member` has been seen started (its volume says so): the
/// cluster has run before, so a blank volume must join it, never bootstrap a new one.
pub(super) fn started_elsewhere(vols: &[Volume], ec: &EtcdCluster, member: &str) -> bool {
    vols.iter().any(|v| v.tags.contains_key(STARTED_TAG) && etcd_role(v, ec).is_some_and(|m| m != member))
}

/// What joining a running cluster takes, from its member list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum JoinAction {
    /// Listed and not started yet: join as that member.
    Listed,
    /// A started member with my identity, but my volume is fresh: that member's data is gone.
    /// Remove it (this id) and add me again.
    Replace(String),
    /// Not listed: add me.
    Add,
}

pub(super) fn join_action(members: &[etcd::Member], me_url: &str) -> JoinAction {
    match members.iter().find(|m| m.peer_urls.iter().any(|u| u == me_url)) {
        Some(m) if m.name.is_empty() => JoinAction::Listed,
        Some(m) => JoinAction::Replace(m.id.clone()),
        None => JoinAction::Add,
    }
}

/// `--initial-cluster` for a member joining a running cluster: every listed member by name (an
/// unstarted one by the name its peer URL has in `all`), me included, sorted.
pub(super) fn initial_cluster(members: &[etcd::Member], all: &[(String, String)], me_url: &str, my_id: &str) -> Vec<(String, String)> {
    let mut ic: Vec<(String, String)> = members
        .iter()
        .filter_map(|m| {
            let url = m.peer_urls.first()?.clone();
            let name = if m.name.is_empty() { all.iter().find(|(_, u)| *u == url).map(|(n, _)| n.clone())? } else { m.name.clone() };
            Some((name, url))
        })
        .collect();
    if !ic.iter().any(|(_, u)| u == me_url) {
        ic.push((my_id.to_string(), me_url.to_string()));
    }
    ic.sort();
    ic
}

impl<C: Volumes + Instances + Sync, D: Dns + Sync> Agent<C, D> {
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
            Bootstrap { state: ClusterState::Existing, initial_cluster: all }
        } else {
            match self.existing_members(ec, vols, instances).await {
                // No peer answers. A cluster that has run before (some other member's volume says
                // so) is only unreachable for now: decide nothing, ask again next pass.
                None if started_elsewhere(vols, ec, member) => {
                    return Ok(None);
                }
                None => Bootstrap { state: ClusterState::New, initial_cluster: all },
                Some((client, members)) => {
                    let etcd_err = |source| ReconcileError::Etcd { cluster: ec.name.clone(), source };
                    let members = match join_action(&members, &me_url) {
                        JoinAction::Listed => members,
                        JoinAction::Replace(id) => {
                            tracing::warn!(etcd = %ec.name, %id, "member has no data: removing and re-adding");
                            self.backup_before_change(ec, &client).await;
                            client.remove(&id).await.map_err(etcd_err)?;
                            client.add(&me_url).await.map_err(etcd_err)?
                        }
                        JoinAction::Add => {
                            tracing::info!(etcd = %ec.name, peer = %me_url, "adding member to existing cluster");
                            self.backup_before_change(ec, &client).await;
                            client.add(&me_url).await.map_err(etcd_err)?
                        }
                    };
                    Bootstrap { state: ClusterState::Existing, initial_cluster: initial_cluster(&members, &all, &me_url, &ec.member_id(member)) }
                }
            }
        };
        let text = serde_json::to_string_pretty(&b).map_err(|e| io(e.into()))?;
        base::fs::write_atomic(&file, text.as_bytes(), 0o644, None).map_err(|e| io(e.source))?;
        Ok(Some(b))
    }

    /// This member's part in a requested restore ([`restore`]).
    pub(super) async fn restore_step(&self, ec: &EtcdCluster, member: &str, vol: &Volume) -> Result<restore::Gate, ReconcileError> {
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
            manifest: paths::under(&self.opts.root, &paths::manifest_path(&self.plan.static_pod_dir, &ec.name)),
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
    pub(super) async fn mark_started(&self, ec: &EtcdCluster, member: &str, vol: &Volume) {
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

    /// Write the member's manifest once its bootstrap is decided and any version change may go
    /// ahead; `true` when the file changed.
    pub(super) async fn write_manifest(
        &self,
        ec: &EtcdCluster,
        member: &str,
        vol: &Volume,
        vols: &[Volume],
        instances: &BTreeMap<String, Instance>,
        report: &mut Report,
    ) -> Result<bool, ReconcileError> {
        // The member's certificates were made before its volume was mounted (`Agent::stage`).
        let mount = paths::under(&self.opts.root, &paths::mount_point(&vol.id));
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
        let host_path = paths::manifest_path(&self.plan.static_pod_dir, &ec.name);
        let text = manifest::to_yaml(&pod).map_err(|e| ReconcileError::Io { path: host_path.clone(), source: std::io::Error::other(e) })?;
        let path = paths::under(&self.opts.root, &host_path);
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &str, name: &str, url: &str) -> etcd::Member {
        etcd::Member { id: id.into(), name: name.into(), peer_urls: vec![url.into()], client_urls: vec![], is_learner: false }
    }

    #[test]
    fn join_actions() {
        let me = "https://etcd-b:2380";
        let started = [member("1", "etcd-a", "https://etcd-a:2380"), member("2", "etcd-b", me)];
        let unstarted = [member("1", "etcd-a", "https://etcd-a:2380"), member("2", "", me)];
        let absent = [member("1", "etcd-a", "https://etcd-a:2380")];
        assert_eq!(join_action(&started, me), JoinAction::Replace("2".into()));
        assert_eq!(join_action(&unstarted, me), JoinAction::Listed);
        assert_eq!(join_action(&absent, me), JoinAction::Add);
    }

    #[test]
    fn initial_cluster_names_unstarted_members_and_adds_me() {
        let all: Vec<(String, String)> = ["a", "b", "c"].iter().map(|m| (format!("etcd-{m}"), format!("https://etcd-{m}:2380"))).collect();
        // c is listed but not started (no name): named from `all`; b (me) is not listed yet.
        let members = [member("3", "", "https://etcd-c:2380"), member("1", "etcd-a", "https://etcd-a:2380"), member("9", "", "https://stranger:2380")];
        let got = initial_cluster(&members, &all, "https://etcd-b:2380", "etcd-b");
        let want: Vec<(String, String)> = all.clone();
        assert_eq!(got, want);
        // Already listed: not added twice.
        let members = [member("1", "etcd-a", "https://etcd-a:2380"), member("2", "", "https://etcd-b:2380")];
        assert_eq!(initial_cluster(&members, &all, "https://etcd-b:2380", "etcd-b"), all[..2].to_vec());
    }
}
