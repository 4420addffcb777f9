//! `ConfigBase`: where a cluster's state lives, parsed from `spec.configBase` (and the
//! BootConfig's `ConfigBase`). The state store that reads it is `base::StateStore`.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Where a cluster's state lives (`spec.configBase`), parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigBase {
    File(PathBuf),
    /// `http://…` or `https://…`, without a trailing slash.
    Http(String),
    S3 {
        bucket: String,
        prefix: String,
    },
    /// `gs://bucket/prefix`: Cloud Storage.
    Gcs {
        bucket: String,
        prefix: String,
    },
    /// Another of kOps' VFS schemes ([`KOPS_VFS_SCHEMES`]: `memfs://` in kOps' own tests, Swift,
    /// Azure Blob, DigitalOcean Spaces, Scaleway): carried as written, never opened by Keelson.
    Vfs {
        scheme: String,
        path: String,
    },
}

/// kOps' VFS schemes a `ConfigBase` may name that Keelson carries but does not read.
pub const KOPS_VFS_SCHEMES: &[&str] = &["memfs", "swift", "azureblob", "do", "scw"];

/// The schemes a [`ConfigBase`] may have, for messages.
pub const CONFIG_BASE_SCHEMES: &str = "file://, http://, https://, s3://, gs://";

/// A `ConfigBase` of no scheme Keelson reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ConfigBase {base:?}: unsupported scheme ({CONFIG_BASE_SCHEMES})")]
pub struct ConfigBaseError {
    pub base: String,
}

impl FromStr for ConfigBase {
    type Err = ConfigBaseError;

    fn from_str(text: &str) -> Result<ConfigBase, ConfigBaseError> {
        let base = text.trim_end_matches('/');
        if let Some(p) = base.strip_prefix("file://") {
            return Ok(ConfigBase::File(PathBuf::from(if p.is_empty() { "/" } else { p })));
        }
        if base.starts_with('/') {
            return Ok(ConfigBase::File(PathBuf::from(base)));
        }
        if base.starts_with("http://") || base.starts_with("https://") {
            return Ok(ConfigBase::Http(base.to_string()));
        }
        if let Some(rest) = base.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if !bucket.is_empty() {
                return Ok(ConfigBase::S3 { bucket: bucket.to_string(), prefix: prefix.trim_matches('/').to_string() });
            }
        }
        if let Some(rest) = base.strip_prefix("gs://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if !bucket.is_empty() {
                return Ok(ConfigBase::Gcs { bucket: bucket.to_string(), prefix: prefix.trim_matches('/').to_string() });
            }
        }
        for scheme in KOPS_VFS_SCHEMES {
            if let Some(path) = base.strip_prefix(scheme).and_then(|r| r.strip_prefix("://")).filter(|p| !p.is_empty()) {
                return Ok(ConfigBase::Vfs { scheme: scheme.to_string(), path: path.to_string() });
            }
        }
        Err(ConfigBaseError { base: text.to_string() })
    }
}

impl fmt::Display for ConfigBase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigBase::File(p) => write!(f, "file://{}", p.display()),
            ConfigBase::Http(u) => f.write_str(u),
            ConfigBase::S3 { bucket, prefix } if prefix.is_empty() => write!(f, "s3://{bucket}"),
            ConfigBase::S3 { bucket, prefix } => write!(f, "s3://{bucket}/{prefix}"),
            ConfigBase::Gcs { bucket, prefix } if prefix.is_empty() => write!(f, "gs://{bucket}"),
            ConfigBase::Gcs { bucket, prefix } => write!(f, "gs://{bucket}/{prefix}"),
            ConfigBase::Vfs { scheme, path } => write!(f, "{scheme}://{path}"),
        }
    }
}

/// As its canonical text ([`fmt::Display`]).
impl Serialize for ConfigBase {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ConfigBase {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

impl ConfigBase {
    /// The URL of one key (for messages).
    pub fn url(&self, rel: &str) -> String {
        format!("{self}/{}", rel.trim_start_matches('/'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_bases_parse_and_print() {
        let cases = [
            ("s3://b/x/y/", ConfigBase::S3 { bucket: "b".into(), prefix: "x/y".into() }, "s3://b/x/y"),
            ("s3://b", ConfigBase::S3 { bucket: "b".into(), prefix: String::new() }, "s3://b"),
            ("file:///srv/state/", ConfigBase::File("/srv/state".into()), "file:///srv/state"),
            ("/srv/state", ConfigBase::File("/srv/state".into()), "file:///srv/state"),
            ("https://h/c/", ConfigBase::Http("https://h/c".into()), "https://h/c"),
            (
                "memfs://clusters.example.com/c",
                ConfigBase::Vfs { scheme: "memfs".into(), path: "clusters.example.com/c".into() },
                "memfs://clusters.example.com/c",
            ),
        ];
        for (text, want, shown) in cases {
            let got: ConfigBase = text.parse().expect(text);
            assert_eq!(got, want, "{text}");
            assert_eq!(got.to_string(), shown);
        }
        assert_eq!("gs://b/c/x/".parse::<ConfigBase>().expect("gs"), ConfigBase::Gcs { bucket: "b".into(), prefix: "c/x".into() });
        assert_eq!("gs://b/c".parse::<ConfigBase>().expect("gs").to_string(), "gs://b/c");
        for bad in ["gs://", "gs:///x", "s3://", "relative/dir", "", "ftp://h/c", "memfs://"] {
            assert_eq!(bad.parse::<ConfigBase>(), Err(ConfigBaseError { base: bad.into() }), "{bad}");
        }
        assert_eq!(ConfigBase::S3 { bucket: "b".into(), prefix: "p".into() }.url("/x"), "s3://b/p/x");
    }
}
