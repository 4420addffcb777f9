//! Reading instances and instance templates (Compute v1 `instances.get`,
//! `instanceTemplates.get`) as typed facts: what the node join server asks about a joining instance.
//! [`ComputeReader`] is the client; [`super::migs`] adds the managed instance group calls to it.

use std::collections::BTreeMap;

use serde_json::Value;

use super::api::{enc, GoogleApi, GoogleApiError};

/// Read-only Compute access to one project.
#[derive(Debug, Clone)]
pub struct ComputeReader {
    pub(crate) api: GoogleApi,
    /// `…/compute/v1/projects/<project>`.
    pub(crate) project_url: String,
    project: String,
}

/// An instance as `instances.get` describes it (the fields the join server decides on).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceFacts {
    pub name: String,
    /// The numeric id (uint64 as a decimal string): a recreated instance keeps its name, never its id.
    pub id: String,
    /// The zone's name (from the zone URL).
    pub zone: String,
    /// PROVISIONING, STAGING, RUNNING, STOPPING, STOPPED, SUSPENDED, TERMINATED, …
    pub status: String,
    /// The first network interface's internal address.
    pub network_ip: Option<String>,
    pub self_link: String,
    /// Metadata items (`created-by`, `instance-template`, `user-data`, …): written by whoever may
    /// set the instance's metadata, the instance itself included.
    pub metadata: BTreeMap<String, String>,
}

/// An instance template as `instanceTemplates.get` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateFacts {
    pub name: String,
    /// `properties.metadata.items`.
    pub metadata: BTreeMap<String, String>,
}

/// The last segment of a URL or partial path.
pub(crate) fn last(s: &str) -> &str {
    s.trim_end_matches('/').rsplit('/').next().unwrap_or(s)
}

/// Metadata `items` (`[{"key", "value"}]`) as a map.
pub fn metadata_items(metadata: &Value) -> BTreeMap<String, String> {
    metadata["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| Some((i["key"].as_str()?.to_string(), i["value"].as_str().unwrap_or_default().to_string())))
        .collect()
}

/// An `instances.get` answer as [`InstanceFacts`].
pub fn instance_facts(v: &Value) -> InstanceFacts {
    InstanceFacts {
        name: v["name"].as_str().unwrap_or_default().to_string(),
        // uint64 fields are strings on the wire; accept a number too.
        id: v["id"].as_str().map(str::to_string).or_else(|| v["id"].as_u64().map(|n| n.to_string())).unwrap_or_default(),
        zone: last(v["zone"].as_str().unwrap_or_default()).to_string(),
        status: v["status"].as_str().unwrap_or_default().to_string(),
        network_ip: v["networkInterfaces"][0]["networkIP"].as_str().map(str::to_string),
        self_link: v["selfLink"].as_str().unwrap_or_default().to_string(),
        metadata: metadata_items(&v["metadata"]),
    }
}

/// An `instanceTemplates.get` answer as [`TemplateFacts`].
pub fn template_facts(v: &Value) -> TemplateFacts {
    TemplateFacts { name: v["name"].as_str().unwrap_or_default().to_string(), metadata: metadata_items(&v["properties"]["metadata"]) }
}

impl ComputeReader {
    /// `compute`: the Compute v1 base (`https://compute.googleapis.com/compute/v1`, or an emulator's).
    pub fn new(api: GoogleApi, compute: &str, project: &str) -> ComputeReader {
        ComputeReader { api, project_url: format!("{}/projects/{}", compute.trim_end_matches('/'), enc(project)), project: project.to_string() }
    }

    pub fn project(&self) -> &str {
        &self.project
    }

    /// `instances.get`; `Ok(None)` when there is no such instance.
    pub async fn instance(&self, zone: &str, name: &str) -> Result<Option<InstanceFacts>, GoogleApiError> {
        match self.api.get(&format!("{}/zones/{}/instances/{}", self.project_url, enc(zone), enc(name))).await {
            Ok(v) => Ok(Some(instance_facts(&v))),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `instanceTemplates.get` (global) of a template name or URL; `Ok(None)` when there is none.
    pub async fn template(&self, name_or_url: &str) -> Result<Option<TemplateFacts>, GoogleApiError> {
        match self.api.get(&format!("{}/global/instanceTemplates/{}", self.project_url, enc(last(name_or_url)))).await {
            Ok(v) => Ok(Some(template_facts(&v))),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn instances_and_templates_read_as_google_writes_them() {
        let i = instance_facts(&json!({
            "name": "nodes-b-x7k2", "id": "4471938521837465123", "status": "RUNNING",
            "zone": "https://compute.googleapis.com/compute/v1/projects/p/zones/europe-west1-b",
            "selfLink": "https://compute.googleapis.com/compute/v1/projects/p/zones/europe-west1-b/instances/nodes-b-x7k2",
            "networkInterfaces": [{"networkIP": "10.0.16.7"}],
            "metadata": {"items": [{"key": "created-by", "value": "projects/1/zones/europe-west1-b/instanceGroupManagers/m"}]}
        }));
        assert_eq!((i.zone.as_str(), i.id.as_str(), i.network_ip.as_deref()), ("europe-west1-b", "4471938521837465123", Some("10.0.16.7")));
        assert_eq!(i.metadata["created-by"], "projects/1/zones/europe-west1-b/instanceGroupManagers/m");
        assert_eq!(instance_facts(&json!({"id": 12})).id, "12");
        let t = template_facts(&json!({"name": "t", "properties": {"metadata": {"items": [{"key": "kops-k8s-io-instance-group-name", "value": "nodes"}]}}}));
        assert_eq!(t.metadata["kops-k8s-io-instance-group-name"], "nodes");
    }
}
