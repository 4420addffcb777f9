//! Leaving: what the hand-over at shutdown ([`crate::handover`]) needs from this host — the local
//! member of each etcd cluster and clients for its live peers, as the last pass saw them (no cloud
//! call at shutdown unless no pass has seen them yet).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cloud::dns::Dns;
use cloud::volumes::{Instance, Instances, Volume, Volumes};

use super::{Agent, Seen};
use crate::handover::{self, Handover, Peer};

impl<C: Volumes + Instances + Sync, D: Dns + Sync> Agent<C, D> {
    /// The hand-over of every etcd cluster with a member here.
    pub async fn handovers(&self) -> Vec<Handover> {
        let mut fresh: Option<(Vec<Volume>, BTreeMap<String, Instance>)> = None;
        let mut out = Vec::new();
        for ec in &self.plan.etcd_clusters {
            let seen = match self.seen.get(&ec.name) {
                Some(s) => s.clone(),
                None => {
                    // No pass got as far as a claim: the member this group runs, peers from the cloud.
                    let Some(member) = self.plan.my_members(ec).first().map(|m| m.name.clone()) else { continue };
                    if fresh.is_none() {
                        match self.observe().await {
                            Ok(o) => fresh = Some(o),
                            Err(e) => tracing::warn!(etcd = %ec.name, error = %e, "no peers known for the hand-over"),
                        }
                    }
                    let peers = fresh.as_ref().map(|(v, i)| self.peers(ec, v, i)).unwrap_or_default();
                    Seen { member, peers }
                }
            };
            let Some(local) = self.member_client(ec, &seen.member, &self.me.internal_ip) else { continue };
            let peers = seen.peers.iter().filter_map(|(m, ip)| Some(Peer { name: ec.member_id(m), client: self.member_client(ec, m, ip)? })).collect();
            out.push(Handover { etcd: ec.name.clone(), member: ec.member_id(&seen.member), local, peers });
        }
        out
    }

    /// Hand etcd leadership over before protokube stops (see [`crate::handover`]), all within
    /// `bound`; what happened is logged and returned.
    pub async fn leave(&self, bound: Duration) -> Vec<handover::Report> {
        let start = Instant::now();
        let Ok(handovers) = tokio::time::timeout(bound, self.handovers()).await else {
            tracing::error!(bound_s = bound.as_secs_f64(), "etcd leadership not handed over: finding the peers took too long");
            return Vec::new();
        };
        if handovers.is_empty() {
            tracing::info!("no etcd member on this host: no leadership to hand over");
        }
        handover::hand_over_all(handovers, bound.saturating_sub(start.elapsed())).await
    }
}
