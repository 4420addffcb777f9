//! The compiled tree: every output file as bytes, written atomically to a directory.

/// Why writing failed.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error(transparent)]
    Io(#[from] base::fs::FsError),
    #[error("serialising {what}: {message}")]
    Serialize { what: String, message: String },
}

pub use base::Tree;

/// Serialise as YAML with map keys sorted (the layout kOps writes), no timestamps added.
pub fn to_yaml<T: serde::Serialize>(what: &str, value: &T) -> Result<String, OutputError> {
    let err = |message: String| OutputError::Serialize { what: what.to_string(), message };
    let json = serde_json::to_value(value).map_err(|e| err(e.to_string()))?;
    serde_yaml_ng::to_string(&json).map_err(|e| err(e.to_string()))
}
