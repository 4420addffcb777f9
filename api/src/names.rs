//! Names of cloud resources that more than one component must agree on (the compiler creates them,
//! protokube checks against them): kOps' naming rules.

use crate::Role;

/// kOps' name truncation: cut to fit `max` and append `-` + 6 characters of the FNV-32a hash
/// (base32hex, lower case) — always when `always_hash`, else only when too long.
pub fn truncate_name(s: &str, max: usize, always_hash: bool) -> String {
    if !always_hash && s.len() <= max {
        return s.to_string();
    }
    let mut h: u32 = 0x811c_9dc5;
    for b in s.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    // Base32hex of the 4 big-endian bytes: 32 bits → the first 6 of 7 five-bit digits.
    const ALPHABET: &[u8; 32] = b"0123456789abcdefghijklmnopqrstuv";
    let bits = u64::from(h) << 3; // 35 bits, padded with zeros
    let hash: String = (0..6).map(|i| ALPHABET[((bits >> (30 - 5 * i)) & 31) as usize] as char).collect();
    let keep = max - hash.len() - 1;
    let base: String = s.chars().take(keep).collect();
    format!("{base}-{hash}")
}

/// `Name`-style plural kOps uses for role-scoped resources (`masters.<cluster>`).
pub fn role_plural(role: Role) -> &'static str {
    match role {
        Role::ControlPlane => "masters",
        Role::Node => "nodes",
        Role::ApiServer => "apiservers",
        Role::Bastion => "bastions",
    }
}

/// The IAM role (and instance profile) of a role's instances: `nodes.<cluster>`, kOps' truncation to 64.
pub fn iam_role_name(role: Role, cluster: &str) -> String {
    truncate_name(&format!("{}.{cluster}", role_plural(role)), 64, false)
}

/// The autoscaling group of an instance group: `<group>.<cluster>`.
pub fn autoscaling_group_name(group: &str, cluster: &str) -> String {
    format!("{group}.{cluster}")
}

/// The API load balancer's target group: `tcp-<cluster with dashes>`, 32 characters with kOps' hash
/// suffix. The compiler creates it; each control plane's protokube registers its own instance in it
/// once the local API server is ready, and the rolling update deregisters it.
pub fn api_target_group_name(cluster: &str) -> String {
    truncate_name(&format!("tcp-{}", cluster.replace('.', "-")), 32, true)
}
