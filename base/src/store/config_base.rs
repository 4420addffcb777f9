//! `ConfigBase`: where a cluster's state lives, parsed from `spec.configBase`. The type is
//! [`keelson_api::ConfigBase`] (pure, so the BootConfig can carry it typed); the store's view of
//! it is here.

pub use keelson_api::config_base::{ConfigBase, ConfigBaseError};

use super::StoreError;

impl From<ConfigBaseError> for StoreError {
    fn from(e: ConfigBaseError) -> StoreError {
        StoreError::Scheme { base: e.base }
    }
}

/// The object key of `rel` under a bucket prefix (S3, Cloud Storage).
pub(super) fn s3_key(prefix: &str, rel: &str) -> String {
    let rel = rel.trim_start_matches('/');
    if prefix.is_empty() {
        rel.to_string()
    } else {
        format!("{prefix}/{rel}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_config_base_is_a_store_error_and_keys_join_prefixes() {
        let e: StoreError = "relative/dir".parse::<ConfigBase>().expect_err("no scheme").into();
        assert!(matches!(&e, StoreError::Scheme { base } if base == "relative/dir"), "{e}");
        assert_eq!(s3_key("p", "/a/b"), "p/a/b");
        assert_eq!(s3_key("", "a"), "a");
    }
}
