//! etcd version changes: what the spec asks for against what a member's manifest runs.
//!
//! - a newer patch, or the next minor (3.5 → 3.6): in place, one member at a time in member-name
//!   order, each only while every other member answers and those before it already run the new
//!   version, after a backup ([`Change::Rolling`]);
//! - anything else newer (a new major, a skipped minor): not in place; the operator restores the
//!   latest backup, which starts every member at the spec's version ([`Change::ViaRestore`]);
//! - older: refused, etcd cannot read what a newer version wrote ([`Change::Downgrade`]).

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct EtcdVersion {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
}

impl EtcdVersion {
    /// `3.5.21`, `v3.5.21`, `3.5.21-0` (an image tag).
    pub fn parse(text: &str) -> Option<EtcdVersion> {
        let core = text.trim().trim_start_matches('v');
        let core = core.split(['-', '+']).next()?;
        let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
        let v = EtcdVersion { major: parts.next()??, minor: parts.next()??, patch: parts.next()?? };
        parts.next().is_none().then_some(v)
    }

    /// The version in an image reference's tag (`registry.k8s.io/etcd:v3.5.21`, also pinned:
    /// `registry.k8s.io/etcd:v3.5.21@sha256:…`).
    pub fn of_image(image: &str) -> Option<EtcdVersion> {
        let name = image.split_once('@').map_or(image, |(name, _digest)| name);
        let tag = name.rsplit_once(':')?.1;
        if tag.contains('/') {
            return None; // a registry port, no tag
        }
        EtcdVersion::parse(tag)
    }
}

impl fmt::Display for EtcdVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    None,
    Rolling,
    Downgrade,
    ViaRestore,
}

pub fn classify(running: EtcdVersion, wanted: EtcdVersion) -> Change {
    if wanted == running {
        Change::None
    } else if wanted < running {
        Change::Downgrade
    } else if wanted.major == running.major && (wanted.minor == running.minor || wanted.minor == running.minor + 1) {
        Change::Rolling
    } else {
        Change::ViaRestore
    }
}

/// The backup reason that marks the backup an upgrade to `wanted` waits for.
pub fn backup_reason(wanted: EtcdVersion) -> String {
    format!("before etcd upgrade to {wanted}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> EtcdVersion {
        EtcdVersion::parse(s).expect(s)
    }

    #[test]
    fn versions_parse_from_specs_and_image_tags() {
        assert_eq!(v("3.5.21"), EtcdVersion { major: 3, minor: 5, patch: 21 });
        assert_eq!(v("v3.6.12"), v("3.6.12"));
        assert_eq!(v("3.5.21-0"), v("3.5.21"));
        assert_eq!(EtcdVersion::of_image("registry.k8s.io/etcd:v3.5.21"), Some(v("3.5.21")));
        assert_eq!(EtcdVersion::of_image("10.0.0.1:5000/etcd:3.6.12-0"), Some(v("3.6.12")));
        assert_eq!(EtcdVersion::of_image("10.0.0.1:5000/etcd"), None);
        let pinned = format!("10.0.0.1:5000/etcd:v3.6.12@sha256:{}", "0".repeat(64));
        assert_eq!(EtcdVersion::of_image(&pinned), Some(v("3.6.12")), "a digest is no tag");
        assert_eq!(EtcdVersion::of_image(&format!("10.0.0.1:5000/etcd@sha256:{}", "1".repeat(64))), None);
        for bad in ["", "3.5", "3.x.1", "3.5.1.2", "latest"] {
            assert_eq!(EtcdVersion::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn changes_are_classified() {
        assert_eq!(classify(v("3.5.21"), v("3.5.21")), Change::None);
        assert_eq!(classify(v("3.5.21"), v("3.5.23")), Change::Rolling);
        assert_eq!(classify(v("3.5.21"), v("3.6.12")), Change::Rolling);
        assert_eq!(classify(v("3.4.23"), v("3.6.12")), Change::ViaRestore);
        assert_eq!(classify(v("3.6.12"), v("4.0.0")), Change::ViaRestore);
        assert_eq!(classify(v("3.6.12"), v("3.5.21")), Change::Downgrade);
        assert_eq!(classify(v("3.6.12"), v("3.6.11")), Change::Downgrade);
    }
}
