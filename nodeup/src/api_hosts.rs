//! A worker of a cluster without DNS records (`topology.dns.type: None`, `.k8s.local`): the
//! names it reaches the control plane by — `api.internal.<cluster>` (the kubelet, kube-proxy) and
//! `kops-controller.internal.<cluster>` (the join server) — in the managed block of its hosts
//! file, at the addresses the control planes publish in the state store
//! ([`keelson_api::nodeup::API_SERVERS_KEY`], under `igconfig/node/`, which the worker reads
//! already). At boot the task waits (bounded) for them; afterwards `nodeup api-hosts`, on a short
//! timer, follows them as control planes are replaced, and keeps the copies of the hosts file the
//! kubelet gave host-network pods (kube-proxy) the same.

use std::sync::Arc;
use std::time::Duration;

use base::hosts::{self, Entries};
use keelson_api::nodeup::{api_server_names, ApiServers, API_SERVERS_KEY};

use crate::config::{ConfigError, StateStore};
use crate::nodetasks::Ctx;
use crate::paths;
use crate::tasks::{Task, TaskError};

/// The task's name (the join and the kubelet depend on it).
pub const TASK_NAME: &str = "api-hosts";

/// Why the addresses could not be had or written.
#[derive(Debug, thiserror::Error)]
pub enum ApiHostsError {
    #[error(transparent)]
    Store(#[from] ConfigError),
    #[error("{url}: not an API servers document: {source}")]
    Parse {
        url: String,
        #[source]
        source: serde_yaml_ng::Error,
    },
    #[error("{url}: no API server addresses yet (the control planes' protokube publishes them once one holds an etcd volume); waited {waited} s")]
    NotPublished { url: String, waited: u64 },
    #[error(transparent)]
    Hosts(#[from] hosts::HostsError),
}

impl From<ApiHostsError> for TaskError {
    fn from(e: ApiHostsError) -> TaskError {
        TaskError::failed(e)
    }
}

/// The managed block a worker wants: both names at every published address.
pub fn desired(cluster: &str, servers: &ApiServers) -> Entries {
    let mut addresses: Vec<String> = servers.addresses.iter().map(|a| a.to_string()).collect();
    addresses.sort();
    addresses.dedup();
    api_server_names(cluster).into_iter().map(|n| (n, addresses.clone())).collect()
}

/// What differs between the managed block `have` and `want`, one line per name.
pub fn differences(have: &Entries, want: &Entries) -> Vec<String> {
    let mut out = Vec::new();
    for (name, ips) in want {
        match have.get(name) {
            Some(h) if h == ips => {}
            Some(h) => out.push(format!("{name}: {} → {}", h.join(","), ips.join(","))),
            None => out.push(format!("{name}: → {}", ips.join(","))),
        }
    }
    for name in have.keys().filter(|n| !want.contains_key(*n)) {
        out.push(format!("{name}: remove"));
    }
    out
}

pub struct ApiHostsTask {
    pub store: Arc<StateStore>,
    pub cluster: String,
    /// How long to wait for the control planes to publish their addresses (at boot, they may
    /// still be coming up); zero: ask once.
    pub wait: Duration,
}

impl ApiHostsTask {
    /// The published addresses, `None` while there are none.
    fn fetch(&self) -> Result<Option<ApiServers>, ApiHostsError> {
        let Some(bytes) = self.store.read(API_SERVERS_KEY)? else { return Ok(None) };
        let doc: ApiServers = serde_yaml_ng::from_slice(&bytes).map_err(|source| ApiHostsError::Parse { url: self.store.url(API_SERVERS_KEY), source })?;
        Ok(Some(doc).filter(|d| !d.addresses.is_empty()))
    }

    /// Ask until there are addresses, every 5 s, for at most [`Self::wait`].
    fn fetch_waiting(&self) -> Result<ApiServers, ApiHostsError> {
        let start = std::time::Instant::now();
        loop {
            match self.fetch() {
                Ok(Some(doc)) => return Ok(doc),
                Ok(None) => {}
                Err(e) if start.elapsed() >= self.wait => return Err(e),
                Err(e) => tracing::warn!(error = %e, "reading the API servers' addresses; retrying"),
            }
            if start.elapsed() >= self.wait {
                return Err(ApiHostsError::NotPublished { url: self.store.url(API_SERVERS_KEY), waited: start.elapsed().as_secs() });
            }
            std::thread::sleep(Duration::from_secs(5).min(self.wait));
        }
    }
}

impl Task<Ctx<'_>> for ApiHostsTask {
    fn name(&self) -> String {
        TASK_NAME.into()
    }
    /// It reads the state store at run time: a render only reports it.
    fn renders(&self) -> bool {
        false
    }
    fn paths(&self) -> Vec<String> {
        vec![paths::HOSTS_FILE.into()]
    }
    fn check(&self, ctx: &Ctx, _: bool) -> Result<Vec<String>, TaskError> {
        let have = hosts::read(&ctx.host.path(paths::HOSTS_FILE)).map_err(ApiHostsError::from)?;
        match self.fetch()? {
            Some(doc) => Ok(differences(&have, &desired(&self.cluster, &doc))),
            None => Ok(vec![format!("wait for the control planes' addresses at {}", self.store.url(API_SERVERS_KEY))]),
        }
    }
    fn apply(&self, ctx: &Ctx, _: bool) -> Result<(), TaskError> {
        let doc = self.fetch_waiting()?;
        let want = desired(&self.cluster, &doc);
        hosts::update(&ctx.host.path(paths::HOSTS_FILE), &want).map_err(ApiHostsError::from)?;
        let (copies, errors) = hosts::update_pod_copies(&ctx.host.path(paths::KUBELET_PODS_DIR), &want);
        for c in copies {
            tracing::info!(copy = %c.display(), "a host-network pod's hosts file follows the API servers");
        }
        // The copies are the pods' to write: one a pod locks or grows is left for the next run,
        // never a reason to fail this one (the node's own file is written above).
        for e in errors {
            tracing::warn!(error = %e, "a host-network pod's copy of the hosts file was not updated");
        }
        tracing::info!(addresses = ?doc.addresses, "api.internal and the join server's name in the hosts file");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_names_at_every_address_and_the_differences_named() {
        let doc = ApiServers { addresses: ["172.20.64.5", "172.20.32.4", "172.20.64.5"].iter().map(|a| a.parse().expect("ip")).collect() };
        let want = desired("g.k8s.local", &doc);
        let both = vec!["172.20.32.4".to_string(), "172.20.64.5".to_string()];
        assert_eq!(want.get("api.internal.g.k8s.local"), Some(&both));
        assert_eq!(want.get("kops-controller.internal.g.k8s.local"), Some(&both));
        assert_eq!(want.len(), 2);
        assert!(differences(&want, &want).is_empty());
        let mut have = want.clone();
        have.insert("api.internal.g.k8s.local".into(), vec!["172.20.32.4".into(), "172.20.96.9".into()]);
        have.insert("stale.g.k8s.local".into(), vec!["10.0.0.1".into()]);
        have.remove("kops-controller.internal.g.k8s.local");
        assert_eq!(
            differences(&have, &want),
            vec![
                "api.internal.g.k8s.local: 172.20.32.4,172.20.96.9 → 172.20.32.4,172.20.64.5".to_string(),
                "kops-controller.internal.g.k8s.local: → 172.20.32.4,172.20.64.5".to_string(),
                "stale.g.k8s.local: remove".to_string(),
            ]
        );
    }
}
