//! Instance templates (global, immutable: a changed template is a new one).

use reqwest::Method;
use serde_json::Value;

use super::{Compute, ComputeError};

impl Compute {
    pub async fn instance_templates(&self) -> Result<Vec<Value>, ComputeError> {
        self.list("instanceTemplates.list", &format!("{}/instanceTemplates", self.global())).await
    }
    pub async fn insert_instance_template(&self, body: &Value) -> Result<(), ComputeError> {
        let name = body["name"].as_str().unwrap_or_default();
        self.change("instanceTemplates.insert", name, Method::POST, &self.global(), &format!("{}/instanceTemplates", self.global()), Some(body)).await
    }
    pub async fn delete_instance_template(&self, name: &str) -> Result<(), ComputeError> {
        self.change("instanceTemplates.delete", name, Method::DELETE, &self.global(), &format!("{}/instanceTemplates/{name}", self.global()), None).await
    }
}
