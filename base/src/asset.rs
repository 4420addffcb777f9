//! An asset reference: `<sha256-hex>@<url>[,<mirror-url>…]`, the syntax of NodeupConfig assets,
//! `--nodeup-asset` and `--protokube-asset`. The hash is what makes the asset trusted; the URLs
//! are only where to find it, first preferred.

use std::fmt;
use std::str::FromStr;

/// Why a `sha256@url` text is not an asset reference.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("asset {text:?}: {reason}")]
pub struct AssetRefError {
    pub text: String,
    pub reason: String,
}

/// A hash-pinned asset and its mirrors.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AssetRef {
    /// 64 lower-case hex digits.
    pub sha256: String,
    /// At least one; `http://`, `https://` or `file://`.
    pub urls: Vec<String>,
}

/// Whether `s` is a sha256 in hex (64 hex digits, any case).
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

impl AssetRef {
    /// The file name of the first URL (`kubelet`, `containerd-2.3.4-linux-amd64.tar.gz`), without
    /// query or fragment.
    pub fn file_name(&self) -> &str {
        let first = self.urls.first().map(String::as_str).unwrap_or("");
        let path = first.split(['?', '#']).next().unwrap_or(first);
        path.rsplit('/').next().unwrap_or("")
    }
}

impl FromStr for AssetRef {
    type Err = AssetRefError;

    fn from_str(text: &str) -> Result<AssetRef, AssetRefError> {
        let err = |reason: String| AssetRefError { text: text.to_string(), reason };
        let (hash, urls) = text.split_once('@').ok_or_else(|| err("expected <sha256-hex>@<url>[,<mirror>…]".into()))?;
        if !is_sha256_hex(hash) {
            return Err(err("the hash must be 64 hex digits (sha256)".into()));
        }
        let urls: Vec<String> = urls.split(',').map(str::trim).filter(|u| !u.is_empty()).map(str::to_string).collect();
        if urls.is_empty() {
            return Err(err("no URL after '@'".into()));
        }
        if let Some(bad) = urls.iter().find(|u| !(u.starts_with("http://") || u.starts_with("https://") || u.starts_with("file://"))) {
            return Err(err(format!("unsupported URL scheme in {bad:?} (http://, https://, file://)")));
        }
        let asset = AssetRef { sha256: hash.to_ascii_lowercase(), urls };
        if asset.file_name().is_empty() {
            return Err(err("the URL does not end in a file name".into()));
        }
        Ok(asset)
    }
}

impl fmt::Display for AssetRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.sha256, self.urls.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: &str = "8b5b3d2b1a0e0f38a63c8e6c31f8e4a7b2d94e0e4d8d6d6c0b7fbbf9e3d2c1a0";

    #[test]
    fn parses_and_prints_back() {
        let a: AssetRef = format!("{}@https://a/x/kubelet, http://m/kubelet?x=1", H.to_uppercase()).parse().expect("parse");
        assert_eq!(a.sha256, H);
        assert_eq!(a.urls, ["https://a/x/kubelet", "http://m/kubelet?x=1"]);
        assert_eq!(a.file_name(), "kubelet");
        assert_eq!(a.to_string(), format!("{H}@https://a/x/kubelet,http://m/kubelet?x=1"));
        assert_eq!(a.to_string().parse::<AssetRef>().expect("reparse"), a);
    }

    #[test]
    fn refuses_what_is_not_an_asset() {
        for (text, why) in [
            ("https://a/kubelet".to_string(), "expected <sha256-hex>@"),
            (format!("{}@https://a/k", &H[..63]), "64 hex digits"),
            (format!("{H}@"), "no URL"),
            (format!("{H}@ftp://a/k"), "unsupported URL scheme"),
            (format!("{H}@https://a/dir/"), "file name"),
        ] {
            let e = text.parse::<AssetRef>().expect_err(&text);
            assert!(e.to_string().contains(why), "{text}: {e}");
        }
    }
}
