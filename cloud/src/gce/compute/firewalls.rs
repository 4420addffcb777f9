//! Firewall rules (global): insert, patch (the fields sent replace the rule's), delete.

use reqwest::Method;
use serde_json::Value;

use super::{Compute, ComputeError};

impl Compute {
    pub async fn firewalls(&self) -> Result<Vec<Value>, ComputeError> {
        self.list("firewalls.list", &format!("{}/firewalls", self.global())).await
    }
    pub async fn insert_firewall(&self, body: &Value) -> Result<(), ComputeError> {
        let name = body["name"].as_str().unwrap_or_default();
        self.change("firewalls.insert", name, Method::POST, &self.global(), &format!("{}/firewalls", self.global()), Some(body)).await
    }
    pub async fn patch_firewall(&self, name: &str, body: &Value) -> Result<(), ComputeError> {
        self.change("firewalls.patch", name, Method::PATCH, &self.global(), &format!("{}/firewalls/{name}", self.global()), Some(body)).await
    }
    pub async fn delete_firewall(&self, name: &str) -> Result<(), ComputeError> {
        self.change("firewalls.delete", name, Method::DELETE, &self.global(), &format!("{}/firewalls/{name}", self.global()), None).await
    }
}
