//! GCE labels as kOps writes them on etcd disks, and the translation between the tag names the node
//! agents use (EC2's: `KubernetesCluster`, `k8s.io/role/master`, `k8s.io/etcd/<name>`, …) and GCE
//! label keys (`k8s-io-cluster-name`, `k8s-io-role-master`, `k8s-io-etcd-<name>`, …).
//!
//! Label keys and values hold only `[a-z0-9_-]` (keys start with a letter) and at most 63
//! characters. Values that carry arbitrary text (the etcd member tags) use kOps' `EncodeGCELabel`:
//! every byte outside `[a-z0-9]` — `-` and `_` included — becomes `-` and two lower-case hex
//! digits, so kOps' `DecodeGCELabel` (which reads `-` as `%`) gets the text back exactly. A value
//! that would not fit is an error, never cut — except the cluster label, which kOps cuts with a hash
//! ([`safe_cluster_name`]).

/// The longest GCE label key or value; kOps' cluster label (value: the cluster name with its dots
/// as dashes, [`safe_cluster_name`]) — one definition, in `keelson_api::names`, which `validate`
/// reads too.
pub use keelson_api::names::{gce_safe_cluster_name as safe_cluster_name, GCE_CLUSTER_LABEL as CLUSTER_LABEL, GCE_LABEL_MAX as LABEL_MAX};
/// kOps' role label prefix (`k8s-io-role-master=master` on etcd disks).
pub const ROLE_LABEL_PREFIX: &str = "k8s-io-role-";
/// kOps' etcd label prefix (`k8s-io-etcd-<etcd cluster>=<encoded member/members>`).
pub const ETCD_LABEL_PREFIX: &str = "k8s-io-etcd-";

/// The EC2 tag names of the same facts.
pub const CLUSTER_TAG: &str = "KubernetesCluster";
const ROLE_TAG_PREFIX: &str = "k8s.io/role/";
const ETCD_TAG_PREFIX: &str = "k8s.io/etcd/";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    #[error("GCE label value for {text:?} is {len} characters encoded ({encoded:?}); GCE allows {LABEL_MAX}")]
    TooLong { text: String, encoded: String, len: usize },
    #[error("GCE label {value:?}: {why}")]
    Undecodable { value: String, why: String },
    #[error("tag {tag:?} has no GCE label key: {why}")]
    Key { tag: String, why: String },
}

/// kOps' `EncodeGCELabel`, refusing a result over [`LABEL_MAX`] characters.
pub fn encode_label(text: &str) -> Result<String, LabelError> {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        match b {
            b'a'..=b'z' | b'0'..=b'9' => out.push(char::from(b)),
            _ => out.push_str(&format!("-{b:02x}")),
        }
    }
    if out.len() > LABEL_MAX {
        return Err(LabelError::TooLong { text: text.to_string(), len: out.len(), encoded: out });
    }
    Ok(out)
}

/// kOps' `DecodeGCELabel`: `-xx` is the byte `0xxx`; anything else stands for itself.
pub fn decode_label(value: &str) -> Result<String, LabelError> {
    let bad = |why: String| LabelError::Undecodable { value: value.to_string(), why };
    let b = value.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'-' {
            let hex = value.get(i + 1..i + 3).ok_or_else(|| bad(format!("`-` at {i} is not followed by two hex digits")))?;
            let byte = u8::from_str_radix(hex, 16).map_err(|_| bad(format!("`-{hex}` at {i} is not an escape")))?;
            out.push(byte);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|e| bad(e.to_string()))
}

/// A label key from free text: lower case, every character outside `[a-z0-9_-]` as `-`.
fn key_from(tag: &str) -> Result<String, LabelError> {
    let key: String = tag.to_ascii_lowercase().chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '-' }).collect();
    if key.len() > LABEL_MAX {
        return Err(LabelError::Key { tag: tag.to_string(), why: format!("{} characters; GCE allows {LABEL_MAX}", key.len()) });
    }
    if !key.starts_with(|c: char| c.is_ascii_lowercase()) {
        return Err(LabelError::Key { tag: tag.to_string(), why: "a label key starts with a letter".into() });
    }
    Ok(key)
}

/// Tag key prefixes and the label key prefixes that stand for them (both ways). Under the role
/// prefix the value is the role itself (kOps: `k8s-io-role-master=master`); under the others it is
/// the tag's value, encoded.
const PREFIXES: [(&str, &str); 3] = [(ROLE_TAG_PREFIX, ROLE_LABEL_PREFIX), (ETCD_TAG_PREFIX, ETCD_LABEL_PREFIX), ("keelson.io/", "keelson-io-")];

/// The GCE label (key, value) that stands for EC2 tag `key=value` on a disk:
/// `KubernetesCluster` → `k8s-io-cluster-name` with the safe cluster name; `k8s.io/role/<r>` →
/// `k8s-io-role-<r>=<r>`; `k8s.io/etcd/<n>` → `k8s-io-etcd-<n>` with the encoded member tag;
/// `keelson.io/<k>` → `keelson-io-<k>`; any other tag → its key with every character outside
/// `[a-z0-9_-]` as `-`; values encoded.
pub fn tag_to_label(key: &str, value: &str) -> Result<(String, String), LabelError> {
    if key == CLUSTER_TAG {
        return Ok((CLUSTER_LABEL.to_string(), plain_value(&safe_cluster_name(value))?));
    }
    if let Some(role) = key.strip_prefix(ROLE_TAG_PREFIX) {
        return Ok((key_from(&format!("{ROLE_LABEL_PREFIX}{role}"))?, plain_value(role)?));
    }
    Ok((tag_key_to_label_key(key)?, encode_label(value)?))
}

/// The label key a tag key (a `tag-key` filter) becomes.
pub fn tag_key_to_label_key(key: &str) -> Result<String, LabelError> {
    if key == CLUSTER_TAG {
        return Ok(CLUSTER_LABEL.to_string());
    }
    match PREFIXES.iter().find_map(|(t, l)| key.strip_prefix(t).map(|rest| format!("{l}{rest}"))) {
        Some(k) => key_from(&k),
        None => key_from(key),
    }
}

/// A value written as it is (the cluster's safe name, a role): `[a-z0-9_-]`, at most 63.
fn plain_value(v: &str) -> Result<String, LabelError> {
    if v.len() > LABEL_MAX {
        return Err(LabelError::TooLong { text: v.to_string(), encoded: v.to_string(), len: v.len() });
    }
    if let Some(c) = v.chars().find(|c| !matches!(c, 'a'..='z' | '0'..='9' | '_' | '-')) {
        return Err(LabelError::Undecodable { value: v.to_string(), why: format!("{c:?} is not allowed in a GCE label value ([a-z0-9_-])") });
    }
    Ok(v.to_string())
}

/// The EC2-style tag a disk label stands for (the reverse of [`tag_to_label`]); a label outside
/// the known prefixes keeps its key, with its value decoded when it decodes.
pub fn label_to_tag(key: &str, value: &str) -> (String, String) {
    if key == CLUSTER_LABEL {
        return (CLUSTER_TAG.to_string(), value.to_string());
    }
    if let Some(role) = key.strip_prefix(ROLE_LABEL_PREFIX) {
        return (format!("{ROLE_TAG_PREFIX}{role}"), value.to_string());
    }
    let decoded = decode_label(value).unwrap_or_else(|_| value.to_string());
    match PREFIXES.iter().find_map(|(t, l)| key.strip_prefix(l).map(|rest| format!("{t}{rest}"))) {
        Some(tag) => (tag, decoded),
        None => (key.to_string(), decoded),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_escapes_everything_but_lower_alphanumerics_and_round_trips() {
        assert_eq!(encode_label("a/a,b").unwrap(), "a-2fa-2cb");
        // `-` and `_` are escaped too, or kOps' decoder would read them as escapes.
        assert_eq!(encode_label("us-c1-a/us-c1-a").unwrap(), "us-2dc1-2da-2fus-2dc1-2da");
        assert_eq!(encode_label("a_B").unwrap(), "a-5f-42");
        for text in ["a/a,b,c", "europe-west1-b/europe-west1-b,europe-west1-c", "x_y.z/Q", "", "ümlaut/ä"] {
            let e = encode_label(text).unwrap();
            assert!(e.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-'), "{e}");
            assert_eq!(decode_label(&e).unwrap(), text);
        }
    }

    #[test]
    fn an_encoded_value_over_63_characters_is_an_error_not_a_cut() {
        // 21 × "ab/" → 21 × (2 + 3) = 105 characters encoded.
        let text = "ab/".repeat(21);
        match encode_label(&text) {
            Err(LabelError::TooLong { len, .. }) => assert_eq!(len, 105),
            other => panic!("want TooLong, got {other:?}"),
        }
        // Exactly 63 fits; one more character does not.
        assert_eq!(encode_label(&"a".repeat(63)).unwrap().len(), 63);
        assert!(encode_label(&"a".repeat(64)).is_err());
        assert!(encode_label(&format!("{}/", "a".repeat(61))).is_err(), "61 + 3 = 64");
    }

    #[test]
    fn bad_escapes_do_not_decode() {
        assert!(decode_label("a-2").is_err());
        assert!(decode_label("a-zz").is_err());
        assert!(decode_label("-").is_err());
        assert_eq!(decode_label("plain").unwrap(), "plain");
    }

    #[test]
    fn tags_map_to_kops_labels_and_back() {
        assert_eq!(tag_to_label("KubernetesCluster", "gce.k8s.example.com").unwrap(), ("k8s-io-cluster-name".into(), "gce-k8s-example-com".into()));
        assert_eq!(tag_to_label("k8s.io/role/master", "1").unwrap(), ("k8s-io-role-master".into(), "master".into()));
        assert_eq!(tag_to_label("k8s.io/etcd/main", "a/a,b,c").unwrap(), ("k8s-io-etcd-main".into(), "a-2fa-2cb-2cc".into()));
        assert_eq!(tag_to_label("keelson.io/etcd-formatted", "ext4").unwrap(), ("keelson-io-etcd-formatted".into(), "ext4".into()));
        assert_eq!(tag_key_to_label_key("k8s.io/role/master").unwrap(), "k8s-io-role-master");
        assert_eq!(label_to_tag("k8s-io-etcd-main", "a-2fa-2cb-2cc"), ("k8s.io/etcd/main".into(), "a/a,b,c".into()));
        assert_eq!(label_to_tag("k8s-io-role-master", "master"), ("k8s.io/role/master".into(), "master".into()));
        assert_eq!(label_to_tag("keelson-io-etcd-formatted", "ext4"), ("keelson.io/etcd-formatted".into(), "ext4".into()));
        assert_eq!(label_to_tag("goog-dm", "x-2dy"), ("goog-dm".into(), "x-y".into()));
        let (key, cut) = tag_to_label("KubernetesCluster", &"a".repeat(64)).unwrap();
        assert_eq!((key.as_str(), cut.len()), ("k8s-io-cluster-name", LABEL_MAX), "a long cluster name is cut with kOps' hash, not refused");
        assert_eq!(cut, safe_cluster_name(&"a".repeat(64)));
        assert_ne!(cut, "a".repeat(63), "the cut carries a hash, so two long names do not collide");
        assert!(tag_to_label("KubernetesCluster", "UPPER.example").is_err(), "a cluster name GCE cannot label is an error");
        assert!(tag_to_label(&format!("k8s.io/etcd/{}", "e".repeat(60)), "a/a").is_err(), "key over 63");
    }
}
