//! Zonal managed instance groups (Compute v1 `instanceGroupManagers.get` and
//! `instanceGroupManagers.listManagedInstances`), read through [`ComputeReader`].

use serde_json::Value;

use super::api::{enc, GoogleApiError};
use super::instances::{last, ComputeReader};

/// At most this many pages of managed instances (500 each) are read.
const MAX_PAGES: usize = 20;

/// One instance a MIG manages, as `listManagedInstances` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagedInstance {
    /// The instance's URL (absent while it is being created).
    pub instance: String,
    /// Its numeric id, when it exists.
    pub id: String,
    pub status: String,
    /// The template it was made from (`version.instanceTemplate`).
    pub template: Option<String>,
}

impl ManagedInstance {
    /// The instance's name (the URL's last segment).
    pub fn name(&self) -> &str {
        last(&self.instance)
    }
}

/// An instance's `created-by` metadata (set by the MIG that made it),
/// `projects/<number>/zones/<zone>/instanceGroupManagers/<name>` → (number, zone, name).
pub fn parse_created_by(value: &str) -> Option<(&str, &str, &str)> {
    let p: Vec<&str> = value.trim().split('/').collect();
    match p.as_slice() {
        ["projects", number, "zones", zone, "instanceGroupManagers", name] if !number.is_empty() && !zone.is_empty() && !name.is_empty() => {
            Some((number, zone, name))
        }
        _ => None,
    }
}

/// One `managedInstances[]` entry.
pub fn managed_instance(v: &Value) -> ManagedInstance {
    ManagedInstance {
        instance: v["instance"].as_str().unwrap_or_default().to_string(),
        id: v["id"].as_str().map(str::to_string).or_else(|| v["id"].as_u64().map(|n| n.to_string())).unwrap_or_default(),
        status: v["instanceStatus"].as_str().unwrap_or_default().to_string(),
        template: v["version"]["instanceTemplate"].as_str().filter(|t| !t.is_empty()).map(str::to_string),
    }
}

impl ComputeReader {
    fn mig_url(&self, zone: &str, name: &str) -> String {
        format!("{}/zones/{}/instanceGroupManagers/{}", self.project_url, enc(zone), enc(name))
    }

    /// The MIG's current instance template (URL); `Ok(None)` when there is no such MIG.
    pub async fn mig_template(&self, zone: &str, name: &str) -> Result<Option<String>, GoogleApiError> {
        match self.api.get(&self.mig_url(zone, name)).await {
            Ok(v) => Ok(Some(v["instanceTemplate"].as_str().unwrap_or_default().to_string())),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every instance the MIG manages (`listManagedInstances`, a POST, every page); `Ok(None)` when
    /// there is no such MIG.
    pub async fn managed_instances(&self, zone: &str, name: &str) -> Result<Option<Vec<ManagedInstance>>, GoogleApiError> {
        let url = format!("{}/listManagedInstances", self.mig_url(zone, name));
        match self.api.pages(reqwest::Method::POST, &url, "managedInstances", MAX_PAGES).await {
            Ok(items) => Ok(Some(items.iter().map(managed_instance).collect())),
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
    fn managed_instances_read_as_google_lists_them() {
        let m = managed_instance(&json!({
            "instance": "https://compute.googleapis.com/compute/v1/projects/p/zones/z/instances/nodes-x7k2",
            "id": "99", "instanceStatus": "RUNNING", "currentAction": "NONE",
            "version": {"instanceTemplate": "https://compute.googleapis.com/compute/v1/projects/p/global/instanceTemplates/nodes-t"}
        }));
        assert_eq!((m.name(), m.id.as_str(), m.status.as_str()), ("nodes-x7k2", "99", "RUNNING"));
        assert_eq!(m.template.as_deref().map(last), Some("nodes-t"));
        let creating = managed_instance(&json!({"name": "nodes-abcd", "currentAction": "CREATING"}));
        assert_eq!((creating.name(), creating.template.as_deref()), ("", None));
    }
}
