//! The Keelson spec compiler: validate a kOps-format spec, complete it, and render node
//! configs, boot configs and user-data for every instance group.

pub mod complete;
pub mod load;
pub mod output;
pub mod versions;

use keelson_api::Documents;

pub use complete::{CompileOptions, CompleteError};
pub use output::{OutputError, Tree};

/// Why a compile failed.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error(transparent)]
    Complete(#[from] CompleteError),
    #[error(transparent)]
    Output(#[from] OutputError),
}

/// Compile validated documents into the output tree.
pub fn compile(docs: &Documents, options: &CompileOptions) -> Result<Tree, CompileError> {
    let completed = complete::complete(docs, options)?;
    let mut tree = Tree::default();
    tree.insert("cluster-completed.yaml", output::to_yaml("cluster-completed.yaml", &completed)?);
    Ok(tree)
}
