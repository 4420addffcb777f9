//! Terraform for the same tasks the direct target manages: `kubernetes.tf.json` plus `data/` files,
//! offline and deterministic (images and the DNS zone become data sources). Each cloud's tasks
//! render themselves ([`crate::aws::terraform`], [`crate::gce`]) into the document of
//! [`crate::terraform_json`].

use super::model::{CloudKind, ClusterModel, ModelError};
use base::Tree;

pub use super::terraform_json::{structural_problems, tf_name, Blocks, MAIN_FILE};

/// Render Terraform for the model (AWS or GCE; a model of another cloud is an error naming it).
pub fn render(model: &ClusterModel) -> Result<Tree, ModelError> {
    match model.cloud {
        CloudKind::Aws => Ok(super::aws::terraform::render(model)),
        CloudKind::Gce => Ok(super::gce::render(model)),
        other => Err(ModelError::UnsupportedCloud { cluster: model.cluster.clone(), cloud: format!("{other:?}") }),
    }
}
