//! Subnetworks (regional).

use reqwest::Method;
use serde_json::Value;

use super::{Compute, ComputeError};

impl Compute {
    pub async fn subnetworks(&self, region: &str) -> Result<Vec<Value>, ComputeError> {
        self.list("subnetworks.list", &format!("{}/subnetworks", self.region(region))).await
    }
    pub async fn insert_subnetwork(&self, region: &str, body: &Value) -> Result<(), ComputeError> {
        let name = body["name"].as_str().unwrap_or_default();
        let scope = self.region(region);
        self.change("subnetworks.insert", name, Method::POST, &scope, &format!("{scope}/subnetworks"), Some(body)).await
    }
    pub async fn delete_subnetwork(&self, region: &str, name: &str) -> Result<(), ComputeError> {
        let scope = self.region(region);
        self.change("subnetworks.delete", name, Method::DELETE, &scope, &format!("{scope}/subnetworks/{name}"), None).await
    }
}
