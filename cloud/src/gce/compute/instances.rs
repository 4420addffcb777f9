//! Instances (zonal): listed to learn their addresses (a MIG's `listManagedInstances` names them).

use serde_json::Value;

use super::{Compute, ComputeError};

impl Compute {
    pub async fn instances(&self, zone: &str) -> Result<Vec<Value>, ComputeError> {
        self.list("instances.list", &format!("{}/instances", self.zone(zone))).await
    }
}
