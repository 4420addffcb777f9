//! The seam between the compiler and the cloud: compile a spec, then build its cloud model from the
//! typed results
//! ([`cloud_resources::model`]). Everything about cloud resources lives in `keelson-cloud-resources`.

use keelson_api::Documents;

use cloud_resources::model::{self, ClusterModel};
use spec_compiler::{CompileError, CompileOptions, Compiled};

#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error(transparent)]
    Compile(#[from] CompileError),
    #[error(transparent)]
    Model(#[from] model::ModelError),
}

/// Compile the spec and build its cloud model.
pub fn prepare(docs: &Documents, options: &CompileOptions) -> Result<(ClusterModel, Compiled), PrepareError> {
    prepare_with(docs, options, true)
}

/// [`prepare`] for delete: user-data is not needed.
pub fn prepare_with(docs: &Documents, options: &CompileOptions, require_user_data: bool) -> Result<(ClusterModel, Compiled), PrepareError> {
    let compiled = spec_compiler::compile(docs, options)?;
    let m = model::build_with(docs, &compiled, require_user_data)?;
    Ok((m, compiled))
}
