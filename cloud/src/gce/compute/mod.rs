//! The Compute v1 resources `keelson apply` manages on GCE, on the one [`GoogleApi`] client: one
//! module per resource kind (`networks`, `subnetworks`, `firewalls`, `templates`, `migs`, `disks`,
//! `instances`),
//! each a few methods of [`Compute`]. Every change is an operation waited for
//! ([`super::operations::wait`]) within the bound the caller gives; reads are the API's own
//! (bounded retries, pagination with a page limit). Resources are named, and linked, by their
//! partial URLs (`projects/P/global/networks/N`), which GCE accepts wherever a URL is asked.

mod disks;
mod firewalls;
mod instances;
mod migs;
mod networks;
mod subnetworks;
mod templates;

use std::time::Duration;

use reqwest::Method;
use serde_json::Value;

use super::api::GoogleApi;
use super::operations::{self, OperationError};

/// At most this many pages are read from any list (500 items a page at most).
const MAX_PAGES: usize = 100;

/// A Compute call that failed: the method, what it was about, and why.
#[derive(Debug, thiserror::Error)]
#[error("{op} {target}: {source}")]
pub struct ComputeError {
    pub op: &'static str,
    pub target: String,
    #[source]
    pub source: OperationError,
}

impl ComputeError {
    /// The API's reason or the operation's error code (`notFound`, `RESOURCE_IN_USE_BY_ANOTHER_RESOURCE`, …).
    pub fn code(&self) -> String {
        self.source.code()
    }
    pub fn is_not_found(&self) -> bool {
        matches!(&self.source, OperationError::Api(e) if e.is_not_found())
    }
    /// The resource is still used by another (a template by a MIG, a network by its subnetworks).
    pub fn is_in_use(&self) -> bool {
        let c = self.code();
        c == "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE" || c == "resourceInUseByAnotherResource" || c == "resourceNotReady"
    }
}

/// The Compute API of one project.
#[derive(Debug, Clone)]
pub struct Compute {
    api: GoogleApi,
    /// `…/compute/v1/projects/P`.
    project_url: String,
    project: String,
    /// The longest one operation is waited for.
    bound: Duration,
}

/// The last segment of a URL or partial path (a resource's name).
pub fn name_of_link(s: &str) -> &str {
    s.rsplit('/').next().unwrap_or(s)
}

impl Compute {
    /// `compute_base`: the Compute v1 base (`https://compute.googleapis.com/compute/v1`);
    /// `bound`: the longest one operation is waited for.
    pub fn new(api: GoogleApi, compute_base: &str, project: &str, bound: Duration) -> Compute {
        let project_url = format!("{}/projects/{}", compute_base.trim_end_matches('/'), super::api::enc(project));
        Compute { api, project_url, project: project.to_string(), bound }
    }

    pub fn project(&self) -> &str {
        &self.project
    }

    /// The partial URL of a global resource (`projects/P/global/networks/N`).
    pub fn global_link(&self, collection: &str, name: &str) -> String {
        format!("projects/{}/global/{collection}/{name}", self.project)
    }
    pub fn region_link(&self, region: &str, collection: &str, name: &str) -> String {
        format!("projects/{}/regions/{region}/{collection}/{name}", self.project)
    }
    pub fn zone_link(&self, zone: &str, collection: &str, name: &str) -> String {
        format!("projects/{}/zones/{zone}/{collection}/{name}", self.project)
    }

    fn global(&self) -> String {
        format!("{}/global", self.project_url)
    }
    fn region(&self, region: &str) -> String {
        format!("{}/regions/{region}", self.project_url)
    }
    fn zone(&self, zone: &str) -> String {
        format!("{}/zones/{zone}", self.project_url)
    }

    async fn list(&self, op: &'static str, url: &str) -> Result<Vec<Value>, ComputeError> {
        self.api.list_all(url, "items", MAX_PAGES).await.map_err(|e| err(op, url, e.into()))
    }

    async fn get_opt(&self, op: &'static str, url: &str) -> Result<Option<Value>, ComputeError> {
        match self.api.get(url).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(err(op, url, e.into())),
        }
    }

    /// The zones of a region (`regions.get`).
    pub async fn zones_of_region(&self, region: &str) -> Result<Vec<String>, ComputeError> {
        let url = self.region(region);
        let v = self.api.get(&url).await.map_err(|e| err("regions.get", region, e.into()))?;
        Ok(v["zones"].as_array().into_iter().flatten().filter_map(Value::as_str).map(|z| name_of_link(z).to_string()).collect())
    }

    /// One change: the call, then its operation waited for (under `scope_url`) within the bound.
    async fn change(&self, op: &'static str, target: &str, method: Method, scope_url: &str, url: &str, body: Option<&Value>) -> Result<(), ComputeError> {
        let answer = self.api.call(method, url, body, None).await.map_err(|e| err(op, target, e.into()))?;
        operations::wait(&self.api, scope_url, answer, self.bound).await.map_err(|e| err(op, target, e))
    }
}

fn err(op: &'static str, target: &str, source: OperationError) -> ComputeError {
    ComputeError { op, target: target.to_string(), source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_partial_urls_gce_accepts() {
        let md = base::gce_metadata::GceMetadata::new(Some("127.0.0.1:9"), Duration::from_secs(1)).expect("client");
        let api = GoogleApi::new(super::super::TokenSource::new(md), Duration::from_secs(1)).expect("api");
        let c = Compute::new(api, "http://127.0.0.1:9/compute/v1/", "p", Duration::from_secs(1));
        assert_eq!(c.global_link("networks", "n"), "projects/p/global/networks/n");
        assert_eq!(c.zone_link("z", "disks", "d"), "projects/p/zones/z/disks/d");
        assert_eq!(c.zone("z"), "http://127.0.0.1:9/compute/v1/projects/p/zones/z");
        assert_eq!(name_of_link("https://x/compute/v1/projects/p/global/networks/n"), "n");
    }
}
