//! Networks (global).

use reqwest::Method;
use serde_json::Value;

use super::{Compute, ComputeError};

impl Compute {
    pub async fn networks(&self) -> Result<Vec<Value>, ComputeError> {
        self.list("networks.list", &format!("{}/networks", self.global())).await
    }
    pub async fn network(&self, name: &str) -> Result<Option<Value>, ComputeError> {
        self.get_opt("networks.get", &format!("{}/networks/{name}", self.global())).await
    }
    pub async fn insert_network(&self, body: &Value) -> Result<(), ComputeError> {
        let name = body["name"].as_str().unwrap_or_default();
        self.change("networks.insert", name, Method::POST, &self.global(), &format!("{}/networks", self.global()), Some(body)).await
    }
    pub async fn delete_network(&self, name: &str) -> Result<(), ComputeError> {
        self.change("networks.delete", name, Method::DELETE, &self.global(), &format!("{}/networks/{name}", self.global()), None).await
    }
}
