//! Zonal managed instance groups: insert, resize, setInstanceTemplate, listManagedInstances,
//! recreateInstances, delete (with their instances).

use reqwest::Method;
use serde_json::{json, Value};

use super::{err, Compute, ComputeError, MAX_PAGES};

impl Compute {
    pub async fn instance_group_managers(&self, zone: &str) -> Result<Vec<Value>, ComputeError> {
        self.list("instanceGroupManagers.list", &format!("{}/instanceGroupManagers", self.zone(zone))).await
    }
    pub async fn insert_instance_group_manager(&self, zone: &str, body: &Value) -> Result<(), ComputeError> {
        let name = body["name"].as_str().unwrap_or_default();
        let scope = self.zone(zone);
        self.change("instanceGroupManagers.insert", name, Method::POST, &scope, &format!("{scope}/instanceGroupManagers"), Some(body)).await
    }
    pub async fn resize_instance_group_manager(&self, zone: &str, name: &str, size: i64) -> Result<(), ComputeError> {
        let scope = self.zone(zone);
        let url = format!("{scope}/instanceGroupManagers/{name}/resize?size={size}");
        self.change("instanceGroupManagers.resize", name, Method::POST, &scope, &url, None).await
    }
    /// New and recreated instances come from `template` (a link); running ones are left alone.
    pub async fn set_instance_template(&self, zone: &str, name: &str, template: &str) -> Result<(), ComputeError> {
        let scope = self.zone(zone);
        let url = format!("{scope}/instanceGroupManagers/{name}/setInstanceTemplate");
        self.change("instanceGroupManagers.setInstanceTemplate", name, Method::POST, &scope, &url, Some(&json!({"instanceTemplate": template}))).await
    }
    /// Recreate the named instances (links) from the group's current template.
    pub async fn recreate_instances(&self, zone: &str, name: &str, instances: &[String]) -> Result<(), ComputeError> {
        let scope = self.zone(zone);
        let url = format!("{scope}/instanceGroupManagers/{name}/recreateInstances");
        self.change("instanceGroupManagers.recreateInstances", name, Method::POST, &scope, &url, Some(&json!({"instances": instances}))).await
    }
    /// Delete the named instances (links) and lower the group's target size by as many.
    pub async fn delete_managed_instances(&self, zone: &str, name: &str, instances: &[String]) -> Result<(), ComputeError> {
        let scope = self.zone(zone);
        let url = format!("{scope}/instanceGroupManagers/{name}/deleteInstances");
        self.change("instanceGroupManagers.deleteInstances", name, Method::POST, &scope, &url, Some(&json!({"instances": instances}))).await
    }
    /// The group's instances (`managedInstances[]`: `instance`, `instanceStatus`, `currentAction`).
    pub async fn list_managed_instances(&self, zone: &str, name: &str) -> Result<Vec<Value>, ComputeError> {
        let url = format!("{}/instanceGroupManagers/{name}/listManagedInstances", self.zone(zone));
        self.api.pages(Method::POST, &url, "managedInstances", MAX_PAGES).await.map_err(|e| err("instanceGroupManagers.listManagedInstances", name, e.into()))
    }
    pub async fn delete_instance_group_manager(&self, zone: &str, name: &str) -> Result<(), ComputeError> {
        let scope = self.zone(zone);
        self.change("instanceGroupManagers.delete", name, Method::DELETE, &scope, &format!("{scope}/instanceGroupManagers/{name}"), None).await
    }
}
