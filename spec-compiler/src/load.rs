//! Reading a spec file: bytes → parsed documents → validated documents.

use std::path::{Path, PathBuf};

use keelson_api::{parse_documents, validate, Documents, ParseError, ValidationError};

/// Everything wrong with a spec file.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path}: cannot read: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: {} problems", errors.len())]
    Parse { path: PathBuf, errors: Vec<ParseError> },
    #[error("{path}: {} problems", errors.len())]
    Invalid { path: PathBuf, errors: Vec<ValidationError> },
}

impl LoadError {
    /// The file could not be read or is not YAML at all (exit code 2).
    pub fn is_unreadable(&self) -> bool {
        match self {
            LoadError::Read { .. } => true,
            LoadError::Parse { errors, .. } => errors.iter().any(ParseError::is_syntax),
            LoadError::Invalid { .. } => false,
        }
    }
    /// One line per problem, prefixed with the file.
    pub fn lines(&self) -> Vec<String> {
        match self {
            LoadError::Read { .. } => vec![self.to_string()],
            LoadError::Parse { path, errors } => errors.iter().map(|e| format!("{}: {e}", path.display())).collect(),
            LoadError::Invalid { path, errors } => errors.iter().map(|e| format!("{}: {e}", path.display())).collect(),
        }
    }
}

/// Parse and validate spec bytes (the file name only labels errors).
pub fn load_bytes(path: &Path, bytes: &[u8]) -> Result<Documents, LoadError> {
    let docs = parse_documents(bytes).map_err(|errors| LoadError::Parse { path: path.to_path_buf(), errors })?;
    let errors = validate(&docs);
    if errors.is_empty() {
        Ok(docs)
    } else {
        Err(LoadError::Invalid { path: path.to_path_buf(), errors })
    }
}

/// Read, parse and validate a spec file.
pub fn load_spec(path: &Path) -> Result<Documents, LoadError> {
    let bytes = std::fs::read(path).map_err(|source| LoadError::Read { path: path.to_path_buf(), source })?;
    load_bytes(path, &bytes)
}
