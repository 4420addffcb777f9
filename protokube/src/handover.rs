//! Leaving gracefully: when protokube is stopped (SIGTERM from systemd at poweroff or `systemctl
//! stop`), each etcd member on this host that leads its cluster hands leadership to the best
//! healthy peer (etcd's MoveLeader, `POST /v3/maintenance/transfer-leadership`, sent to the leader)
//! and waits until a status shows the new leader — while etcd, its peers and the network are all
//! still up. The cluster then never waits an election timeout for a leader that vanished with its
//! machine.
//!
//! etcd itself also moves leadership when it gets SIGTERM, but at poweroff it gets that signal only
//! in systemd's final kill, after the network is gone (or SIGKILL from a runtime's grace period):
//! too late to reach a peer. Every container scope is ordered before protokube.service (nodeup's
//! drop-in), so systemd stops protokube first, and this runs while etcd still serves.
//!
//! Nothing else is stopped or changed here: no member is removed (the replacement instance takes
//! the same member and volume), no manifest, record or volume is touched. The whole hand-over is
//! bounded ([`DEFAULT_BOUND`]); without a healthy peer (a single member) it says so and returns.
//!
//! [`choose_target`] is pure; [`hand_over`] and [`hand_over_all`] talk to etcd.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::etcd;

/// Longest time the whole hand-over may take before protokube exits anyway (systemd's
/// `TimeoutStopSec` for protokube.service is above it).
pub const DEFAULT_BOUND: Duration = Duration::from_secs(20);
/// How long after the transfer a status must show the new leader.
const CONFIRM_WITHIN: Duration = Duration::from_secs(5);
/// Time between status checks while confirming.
const POLL: Duration = Duration::from_millis(100);

/// A peer this host can reach: its etcd member name (`etcd-b`) and a client for it.
#[derive(Clone)]
pub struct Peer {
    pub name: String,
    pub client: etcd::Client,
}

/// What one etcd cluster's hand-over needs: the local member and the peers it may hand over to.
#[derive(Clone)]
pub struct Handover {
    /// The etcd cluster (`main`, `events`).
    pub etcd: String,
    /// The local member's etcd name (`etcd-a`).
    pub member: String,
    pub local: etcd::Client,
    pub peers: Vec<Peer>,
}

/// What a peer said when asked for its status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerAnswer {
    Status(etcd::Status),
    /// No client for it, or the request failed (the reason).
    Failed(String),
}

/// The member chosen to lead next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub id: String,
    pub name: String,
    pub raft_index: u64,
}

/// Why no member can take leadership over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoTarget {
    /// The local member is the only voting member.
    Alone,
    /// Other members exist, none of them fit (member name, why not).
    NoneHealthy(Vec<(String, String)>),
}

impl std::fmt::Display for NoTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoTarget::Alone => write!(f, "no other voting member (single member)"),
            NoTarget::NoneHealthy(why) => {
                let list: Vec<String> = why.iter().map(|(m, w)| format!("{m}: {w}")).collect();
                write!(f, "no healthy peer ({})", list.join("; "))
            }
        }
    }
}

/// The member to hand leadership to: a started, voting member other than `me` that answered its
/// status as itself, in my cluster, follows me, reports no alarm — the one furthest along its raft
/// log (ties: by name, so the choice is stable). `answers` is by member name.
pub fn choose_target(me: &etcd::Status, members: &[etcd::Member], answers: &BTreeMap<String, PeerAnswer>) -> Result<Target, NoTarget> {
    let others: Vec<&etcd::Member> = members.iter().filter(|m| m.id != me.member_id).collect();
    if others.iter().all(|m| m.is_learner) {
        return Err(NoTarget::Alone);
    }
    let mut fit: Vec<Target> = Vec::new();
    let mut unfit: Vec<(String, String)> = Vec::new();
    for m in others {
        let label = if m.name.is_empty() { format!("member {}", m.id) } else { m.name.clone() };
        let verdict: Result<u64, String> = if m.is_learner {
            Err("a learner".into())
        } else if m.name.is_empty() {
            Err("not started".into())
        } else {
            match answers.get(&m.name) {
                None => Err("no address known".into()),
                Some(PeerAnswer::Failed(e)) => Err(format!("did not answer: {e}")),
                Some(PeerAnswer::Status(s)) => unfit_status(me, m, s).map_or(Ok(s.raft_index), Err),
            }
        };
        match verdict {
            Ok(raft_index) => fit.push(Target { id: m.id.clone(), name: m.name.clone(), raft_index }),
            Err(why) => unfit.push((label, why)),
        }
    }
    fit.sort_by(|a, b| b.raft_index.cmp(&a.raft_index).then_with(|| a.name.cmp(&b.name)));
    fit.into_iter().next().ok_or(NoTarget::NoneHealthy(unfit))
}

/// Why a peer that answered `s` cannot lead next (`None`: it can).
fn unfit_status(me: &etcd::Status, m: &etcd::Member, s: &etcd::Status) -> Option<String> {
    if s.member_id != m.id {
        Some(format!("answers as member {}", s.member_id))
    } else if s.cluster_id != me.cluster_id {
        Some(format!("in cluster {}, not {}", s.cluster_id, me.cluster_id))
    } else if s.is_learner {
        Some("a learner".into())
    } else if !s.errors.is_empty() {
        Some(format!("reports {}", s.errors.join(", ")))
    } else if s.leader != me.member_id {
        Some(format!("follows leader {}, not this member", s.leader))
    } else {
        None
    }
}

/// What the hand-over of one etcd cluster did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The local member did not lead: nothing to do.
    NotLeader { leader: String },
    /// Leadership moved to `to`; a status showed it `took` after the request went out.
    Moved { to: String, to_id: String, took: Duration },
    /// Nobody could take leadership over: the member stops as the leader.
    Stays(NoTarget),
}

#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    #[error("etcd {etcd}: the local member {member} did not answer its status: {source}")]
    Local { etcd: String, member: String, source: etcd::EtcdError },
    #[error("etcd {etcd}: member list from the local member {member}: {source}")]
    Members { etcd: String, member: String, source: etcd::EtcdError },
    #[error("etcd {etcd}: leadership transfer from {member} to {to}: {source}")]
    Transfer { etcd: String, member: String, to: String, source: etcd::EtcdError },
    #[error("etcd {etcd}: after the transfer from {member} to {to}, no status showed another leader within {waited:?}")]
    NotConfirmed { etcd: String, member: String, to: String, waited: Duration },
    #[error("etcd {etcd}: the hand-over from {member} did not finish within {bound:?}")]
    Timeout { etcd: String, member: String, bound: Duration },
}

/// Hand leadership of one etcd cluster over, if the local member leads it. Each request is bounded
/// by its client's timeout; the caller bounds the whole ([`hand_over_all`]).
pub async fn hand_over(h: &Handover) -> Result<Outcome, HandoverError> {
    let (etcd_name, member) = (h.etcd.clone(), h.member.clone());
    let me = h.local.status().await.map_err(|source| HandoverError::Local { etcd: etcd_name.clone(), member: member.clone(), source })?;
    if !me.is_leader() {
        return Ok(Outcome::NotLeader { leader: me.leader });
    }
    let members = h.local.members().await.map_err(|source| HandoverError::Members { etcd: etcd_name.clone(), member: member.clone(), source })?;
    let answers = peer_statuses(&h.peers, &members, &me.member_id).await;
    let target = match choose_target(&me, &members, &answers) {
        Ok(t) => t,
        Err(why) => return Ok(Outcome::Stays(why)),
    };
    tracing::info!(etcd = %etcd_name, %member, to = %target.name, raft_index = target.raft_index, "handing etcd leadership over");
    let t = Instant::now();
    let transfer_err = |source| HandoverError::Transfer { etcd: etcd_name.clone(), member: member.clone(), to: target.name.clone(), source };
    h.local.move_leader(&target.id, CONFIRM_WITHIN).await.map_err(transfer_err)?;
    // etcd answers once it sees the new leader; confirm from the statuses (the new leader's own,
    // else the old leader's view), bounded.
    let target_client = h.peers.iter().find(|p| p.name == target.name).map(|p| &p.client);
    let deadline = Instant::now() + CONFIRM_WITHIN;
    loop {
        let mut seen = None;
        if let Some(c) = target_client {
            seen = c.status().await.ok().map(|s| s.leader);
        }
        if seen.as_deref().is_none_or(|l| l != target.id) {
            seen = h.local.status().await.ok().map(|s| s.leader);
        }
        if let Some(leader) = seen.filter(|l| !l.is_empty() && l != "0" && *l != me.member_id) {
            let to = if leader == target.id { target.name.clone() } else { format!("member {leader}") };
            return Ok(Outcome::Moved { to, to_id: leader, took: t.elapsed() });
        }
        if Instant::now() >= deadline {
            return Err(HandoverError::NotConfirmed { etcd: etcd_name, member, to: target.name, waited: CONFIRM_WITHIN });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Every candidate's status, asked concurrently (each bounded by its client's timeout).
async fn peer_statuses(peers: &[Peer], members: &[etcd::Member], my_id: &str) -> BTreeMap<String, PeerAnswer> {
    let mut asks = tokio::task::JoinSet::new();
    for m in members.iter().filter(|m| m.id != my_id && !m.name.is_empty() && !m.is_learner) {
        if let Some(p) = peers.iter().find(|p| p.name == m.name).cloned() {
            asks.spawn(async move {
                let answer = match p.client.status().await {
                    Ok(s) => PeerAnswer::Status(s),
                    Err(e) => PeerAnswer::Failed(e.to_string()),
                };
                (p.name, answer)
            });
        }
    }
    let mut out = BTreeMap::new();
    while let Some(r) = asks.join_next().await {
        if let Ok((name, answer)) = r {
            out.insert(name, answer);
        }
    }
    out
}

/// One etcd cluster's hand-over result.
#[derive(Debug)]
pub struct Report {
    pub etcd: String,
    pub member: String,
    pub result: Result<Outcome, HandoverError>,
}

/// Hand every cluster over concurrently, all within `bound`, and log what happened to each. Never
/// fails: a hand-over that could not be done is logged, and the caller stops anyway.
pub async fn hand_over_all(handovers: Vec<Handover>, bound: Duration) -> Vec<Report> {
    let mut tasks = tokio::task::JoinSet::new();
    for h in handovers {
        tracing::info!(etcd = %h.etcd, member = %h.member, "etcd member leaving: protokube stops (etcd keeps running: at poweroff its container stops after protokube)");
        tasks.spawn(async move {
            let result = match tokio::time::timeout(bound, hand_over(&h)).await {
                Ok(r) => r,
                Err(_) => Err(HandoverError::Timeout { etcd: h.etcd.clone(), member: h.member.clone(), bound }),
            };
            Report { etcd: h.etcd, member: h.member, result }
        });
    }
    let mut reports = Vec::new();
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok(r) => reports.push(r),
            Err(e) => tracing::error!(error = %e, "etcd hand-over task failed"),
        }
    }
    reports.sort_by(|a, b| a.etcd.cmp(&b.etcd));
    for r in &reports {
        log(r);
    }
    reports
}

fn log(r: &Report) {
    let (etcd, member) = (&r.etcd, &r.member);
    match &r.result {
        Ok(Outcome::NotLeader { leader }) => tracing::info!(%etcd, %member, %leader, "not the etcd leader: nothing to hand over"),
        Ok(Outcome::Moved { to, to_id, took }) => {
            tracing::info!(%etcd, %member, %to, %to_id, took_ms = took.as_millis() as u64, "etcd leadership handed over before stopping")
        }
        Ok(Outcome::Stays(why)) => tracing::warn!(%etcd, %member, "etcd leadership not handed over: {why}; stopping as the leader"),
        Err(e) => tracing::error!(%etcd, %member, error = %e, "etcd leadership not handed over; stopping anyway"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(member: &str, leader: &str, raft_index: u64) -> etcd::Status {
        etcd::Status {
            version: "3.5.21".into(),
            cluster_id: "77".into(),
            member_id: member.into(),
            leader: leader.into(),
            revision: 1,
            db_size: 1,
            raft_index,
            raft_term: 2,
            errors: vec![],
            is_learner: false,
        }
    }

    fn member(id: &str, name: &str) -> etcd::Member {
        etcd::Member { id: id.into(), name: name.into(), peer_urls: vec![format!("https://{name}:2380")], client_urls: vec![], is_learner: false }
    }

    fn three() -> Vec<etcd::Member> {
        vec![member("1", "etcd-a"), member("2", "etcd-b"), member("3", "etcd-c")]
    }

    fn answers(list: &[(&str, PeerAnswer)]) -> BTreeMap<String, PeerAnswer> {
        list.iter().map(|(n, a)| (n.to_string(), a.clone())).collect()
    }

    #[test]
    fn the_peer_furthest_along_its_log_leads_next() {
        let me = status("1", "1", 100);
        let a = answers(&[("etcd-b", PeerAnswer::Status(status("2", "1", 98))), ("etcd-c", PeerAnswer::Status(status("3", "1", 100)))]);
        assert_eq!(choose_target(&me, &three(), &a), Ok(Target { id: "3".into(), name: "etcd-c".into(), raft_index: 100 }));
        // A tie goes by name: the same answers always pick the same member.
        let a = answers(&[("etcd-c", PeerAnswer::Status(status("3", "1", 100))), ("etcd-b", PeerAnswer::Status(status("2", "1", 100)))]);
        assert_eq!(choose_target(&me, &three(), &a).map(|t| t.name), Ok("etcd-b".to_string()));
    }

    #[test]
    fn unhealthy_peers_are_passed_over() {
        let me = status("1", "1", 100);
        let mut alarmed = status("2", "1", 200);
        alarmed.errors = vec!["memberID:2 alarm:NOSPACE".into()];
        let a = answers(&[("etcd-b", PeerAnswer::Status(alarmed)), ("etcd-c", PeerAnswer::Status(status("3", "1", 90)))]);
        assert_eq!(choose_target(&me, &three(), &a).map(|t| t.name), Ok("etcd-c".to_string()));
        // Not answering, answering as someone else, another cluster, following no one / another leader.
        let mut foreign = status("3", "1", 500);
        foreign.cluster_id = "88".into();
        for (b, c) in [
            (PeerAnswer::Failed("connection refused".into()), PeerAnswer::Status(status("9", "1", 500))),
            (PeerAnswer::Status(status("2", "0", 500)), PeerAnswer::Status(foreign)),
            (PeerAnswer::Status(status("2", "3", 500)), PeerAnswer::Failed("timed out".into())),
        ] {
            let got = choose_target(&me, &three(), &answers(&[("etcd-b", b), ("etcd-c", c)]));
            let Err(NoTarget::NoneHealthy(why)) = got else { panic!("{got:?}") };
            assert_eq!(why.iter().map(|(m, _)| m.as_str()).collect::<Vec<_>>(), ["etcd-b", "etcd-c"], "{why:?}");
        }
        // A peer with no known address cannot be asked, so it is not chosen.
        let got = choose_target(&me, &three(), &answers(&[("etcd-c", PeerAnswer::Status(status("3", "1", 90)))]));
        assert_eq!(got.map(|t| t.name), Ok("etcd-c".to_string()));
    }

    #[test]
    fn learners_and_unstarted_members_never_lead() {
        let me = status("1", "1", 100);
        let mut learner = member("2", "etcd-b");
        learner.is_learner = true;
        let members = vec![member("1", "etcd-a"), learner, member("3", "")];
        // (even if a learner answers, and it is furthest along)
        let a = answers(&[("etcd-b", PeerAnswer::Status(status("2", "1", 900)))]);
        let got = choose_target(&me, &members, &a);
        assert_eq!(got, Err(NoTarget::NoneHealthy(vec![("etcd-b".into(), "a learner".into()), ("member 3".into(), "not started".into())])));
        let mut says_learner = status("2", "1", 900);
        says_learner.is_learner = true;
        let got = choose_target(&me, &three(), &answers(&[("etcd-b", PeerAnswer::Status(says_learner))]));
        assert!(matches!(got, Err(NoTarget::NoneHealthy(_))), "{got:?}");
    }

    #[test]
    fn a_single_member_has_no_one_to_hand_over_to() {
        let me = status("1", "1", 100);
        assert_eq!(choose_target(&me, &[member("1", "etcd-a")], &BTreeMap::new()), Err(NoTarget::Alone));
        let mut learner = member("2", "etcd-b");
        learner.is_learner = true;
        assert_eq!(choose_target(&me, &[member("1", "etcd-a"), learner], &BTreeMap::new()), Err(NoTarget::Alone));
        assert_eq!(NoTarget::Alone.to_string(), "no other voting member (single member)");
    }

    #[test]
    fn systemd_waits_longer_than_the_hand_over() {
        let unit = nodeup::render::systemd::protokube("/etc/keelson/bootconfig.yaml").render();
        let stop: u64 = unit
            .lines()
            .find_map(|l| l.strip_prefix("TimeoutStopSec="))
            .and_then(|v| v.trim_end_matches('s').parse().ok())
            .unwrap_or_else(|| panic!("protokube.service sets no TimeoutStopSec:\n{unit}"));
        // (with room for the process to exit after the bound runs out)
        assert!(
            Duration::from_secs(stop) >= DEFAULT_BOUND + Duration::from_secs(5),
            "TimeoutStopSec={stop} is not above the hand-over bound {DEFAULT_BOUND:?}"
        );
    }
}
