//! The GCE metadata server client (`http://metadata.google.internal/computeMetadata/v1/`): what an
//! instance knows about itself — project, zone, name, numeric id, internal IP, hostname and the
//! instance attributes (`cluster-name`, `kops-k8s-io-instance-group-name`, `user-data`).
//!
//! Every request carries `Metadata-Flavor: Google`, and every answer must carry it back (the
//! server's documented behaviour): anything else on that address is not the metadata server and is
//! an error, never a value. `GCE_METADATA_HOST` points the client elsewhere (tests, keelson-local),
//! as it does Google's own client libraries. Reads are retried a bounded number of times.

use std::time::Duration;

/// The metadata server's name on GCE.
pub const DEFAULT_HOST: &str = "metadata.google.internal";
const ATTEMPTS: u32 = 4;

#[derive(Debug, thiserror::Error)]
pub enum GceMetadataError {
    #[error("GCE metadata {url}: {message}")]
    Request { url: String, message: String },
    #[error("GCE metadata {url}: HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("GCE metadata {url}: the answer lacks `Metadata-Flavor: Google`: not the metadata server")]
    NotMetadataServer { url: String },
    #[error("GCE metadata {url}: {what} is missing")]
    Missing { url: String, what: &'static str },
}

/// What nodeup and protokube need to know about the instance they run on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Instance {
    pub project: String,
    /// The zone's name (`europe-west1-b`), not its path.
    pub zone: String,
    pub name: String,
    /// The numeric id (a recreated instance keeps its name, never its id).
    pub id: String,
    pub internal_ip: String,
    pub hostname: String,
}

#[derive(Debug, Clone)]
pub struct GceMetadata {
    client: reqwest::Client,
    base: String,
}

impl GceMetadata {
    /// A client of `host` (`host[:port]` or a URL), else `$GCE_METADATA_HOST`, else [`DEFAULT_HOST`].
    pub fn new(host: Option<&str>, timeout: Duration) -> Result<GceMetadata, GceMetadataError> {
        let env = std::env::var("GCE_METADATA_HOST").ok().filter(|h| !h.trim().is_empty());
        let host = host.map(str::to_string).or(env).unwrap_or_else(|| DEFAULT_HOST.to_string());
        let base = if host.contains("://") { host.trim_end_matches('/').to_string() } else { format!("http://{}", host.trim_end_matches('/')) };
        let client = reqwest::Client::builder()
            .connect_timeout(timeout)
            .timeout(timeout)
            // The metadata server never redirects; a redirect is someone else answering.
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()
            .map_err(|e| GceMetadataError::Request { url: base.clone(), message: e.to_string() })?;
        Ok(GceMetadata { client, base: format!("{base}/computeMetadata/v1") })
    }

    /// One value (`instance/zone`, `project/project-id`, …); `Ok(None)` when the server has none.
    pub async fn get(&self, path: &str) -> Result<Option<String>, GceMetadataError> {
        let url = format!("{}/{}", self.base, path.trim_start_matches('/'));
        let mut attempt = 0;
        loop {
            attempt += 1;
            let err = match self.client.get(&url).header("Metadata-Flavor", "Google").send().await {
                Ok(resp) => {
                    if resp.headers().get("metadata-flavor").and_then(|v| v.to_str().ok()) != Some("Google") {
                        return Err(GceMetadataError::NotMetadataServer { url });
                    }
                    match resp.status().as_u16() {
                        200 => return resp.text().await.map(Some).map_err(|e| GceMetadataError::Request { url: url.clone(), message: e.to_string() }),
                        404 => return Ok(None),
                        status if status < 500 && status != 429 => return Err(GceMetadataError::Status { url, status }),
                        status => GceMetadataError::Status { url: url.clone(), status },
                    }
                }
                Err(e) => GceMetadataError::Request { url: url.clone(), message: e.to_string() },
            };
            if attempt >= ATTEMPTS {
                return Err(err);
            }
            let wait = crate::imds::jittered(Duration::from_millis(200), attempt - 1, Duration::from_secs(2));
            tracing::warn!(%url, attempt, error = %err, ?wait, "GCE metadata read failed; retrying");
            tokio::time::sleep(wait).await;
        }
    }

    async fn required(&self, path: &str, what: &'static str) -> Result<String, GceMetadataError> {
        match self.get(path).await? {
            Some(v) if !v.trim().is_empty() => Ok(v.trim().to_string()),
            _ => Err(GceMetadataError::Missing { url: format!("{}/{path}", self.base), what }),
        }
    }

    /// An instance attribute (`instance/attributes/<key>`); `Ok(None)` when not set.
    pub async fn attribute(&self, key: &str) -> Result<Option<String>, GceMetadataError> {
        self.get(&format!("instance/attributes/{key}")).await
    }

    /// Everything [`Instance`] holds.
    pub async fn instance(&self) -> Result<Instance, GceMetadataError> {
        let zone_path = self.required("instance/zone", "the instance's zone").await?;
        Ok(Instance {
            project: self.required("project/project-id", "the project id").await?,
            zone: zone_name(&zone_path).to_string(),
            name: self.required("instance/name", "the instance name").await?,
            id: self.required("instance/id", "the instance id").await?,
            internal_ip: self.required("instance/network-interfaces/0/ip", "the internal IP").await?,
            hostname: self.required("instance/hostname", "the hostname").await?,
        })
    }
}

/// `projects/123/zones/europe-west1-b` → `europe-west1-b` (the server answers with the path).
pub fn zone_name(zone: &str) -> &str {
    zone.rsplit('/').next().unwrap_or(zone)
}

/// The node name kOps gives a GCE instance: the first label of its hostname.
pub fn node_name(hostname: &str) -> &str {
    hostname.split('.').next().unwrap_or(hostname)
}

/// The Kubernetes provider id of a GCE instance.
pub fn provider_id(project: &str, zone: &str, name: &str) -> String {
    format!("gce://{project}/{zone}/{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zone_node_name_and_provider_id_take_the_shapes_kubernetes_expects() {
        assert_eq!(zone_name("projects/1234/zones/europe-west1-b"), "europe-west1-b");
        assert_eq!(zone_name("europe-west1-b"), "europe-west1-b");
        assert_eq!(node_name("nodes-abcd.europe-west1-b.c.proj.internal"), "nodes-abcd");
        assert_eq!(provider_id("proj", "europe-west1-b", "nodes-abcd"), "gce://proj/europe-west1-b/nodes-abcd");
    }
}
