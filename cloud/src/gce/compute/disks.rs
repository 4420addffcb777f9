//! Persistent disks (zonal): list by filter, insert, setLabels, delete.

use reqwest::Method;
use serde_json::{json, Value};

use super::{Compute, ComputeError};
use crate::gce::api::enc;

impl Compute {
    /// The disks of `zone` that match `filter` (Compute's list filter; empty: all).
    pub async fn disks(&self, zone: &str, filter: &str) -> Result<Vec<Value>, ComputeError> {
        let mut url = format!("{}/disks", self.zone(zone));
        if !filter.is_empty() {
            url = format!("{url}?filter={}", enc(filter));
        }
        self.list("disks.list", &url).await
    }
    pub async fn disk(&self, zone: &str, name: &str) -> Result<Option<Value>, ComputeError> {
        self.get_opt("disks.get", &format!("{}/disks/{name}", self.zone(zone))).await
    }
    pub async fn insert_disk(&self, zone: &str, body: &Value) -> Result<(), ComputeError> {
        let name = body["name"].as_str().unwrap_or_default();
        let scope = self.zone(zone);
        self.change("disks.insert", name, Method::POST, &scope, &format!("{scope}/disks"), Some(body)).await
    }
    /// Replace the disk's labels (`fingerprint`: the disk's current `labelFingerprint`).
    pub async fn set_disk_labels(&self, zone: &str, name: &str, labels: &Value, fingerprint: &str) -> Result<(), ComputeError> {
        let scope = self.zone(zone);
        let body = json!({"labels": labels, "labelFingerprint": fingerprint});
        self.change("disks.setLabels", name, Method::POST, &scope, &format!("{scope}/disks/{name}/setLabels"), Some(&body)).await
    }
    pub async fn delete_disk(&self, zone: &str, name: &str) -> Result<(), ComputeError> {
        let scope = self.zone(zone);
        self.change("disks.delete", name, Method::DELETE, &scope, &format!("{scope}/disks/{name}"), None).await
    }
}
