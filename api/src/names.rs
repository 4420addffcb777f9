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

/// The IAM role of a service account (IRSA, `iam.serviceAccountExternalPermissions`):
/// `<name>.<namespace>.sa.<cluster>` (a `*` in the namespace spelled `wildcard`), kOps' truncation to 64.
pub fn service_account_role_name(name: &str, namespace: &str, cluster: &str) -> String {
    truncate_name(&format!("{name}.{}.sa.{cluster}", namespace.replace('*', "wildcard")), 64, false)
}

/// The autoscaling group of an instance group: `<group>.<cluster>`.
pub fn autoscaling_group_name(group: &str, cluster: &str) -> String {
    format!("{group}.{cluster}")
}

/// A GCE resource name: lower case `[a-z0-9-]`, starting with a letter, at most 63 characters
/// (every other character becomes `-`; a name that starts otherwise gets a `k` in front).
pub fn gce_name(name: &str) -> String {
    let mut s: String = name.to_ascii_lowercase().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    if !s.starts_with(|c: char| c.is_ascii_lowercase()) {
        s.insert(0, 'k');
    }
    s.truncate(63);
    s.trim_end_matches('-').to_string()
}

/// The longest GCE label key or value.
pub const GCE_LABEL_MAX: usize = 63;
/// kOps' cluster label on GCE resources (value: [`gce_safe_cluster_name`]).
pub const GCE_CLUSTER_LABEL: &str = "k8s-io-cluster-name";

/// The value of the cluster label on every GCE disk and instance template: kOps' `SafeClusterName`
/// (the cluster name with its dots as dashes), and when that is longer than a label value may be,
/// kOps' `SafeTruncatedClusterName` form — cut to [`GCE_LABEL_MAX`] with a hash of the whole name
/// (kOps writes the long value uncut, which its mock cloud takes and real GCE refuses; no kOps
/// cluster with such a name can exist on GCE, so nothing it labelled is lost by the cut).
pub fn gce_safe_cluster_name(cluster: &str) -> String {
    truncate_name(&cluster.replace('.', "-"), GCE_LABEL_MAX, false)
}

/// The GCE service account of a role's instances (kOps' `gce.ServiceAccountName`): `control-plane`,
/// `node` or `bastion`, `-`, then the cluster's name with dots as dashes, cut to 30 characters in
/// all (an account id's limit) with kOps' hash suffix. API servers share the control plane's.
pub fn gce_service_account_id(role: Role, cluster: &str) -> String {
    let prefix = match role {
        Role::ControlPlane | Role::ApiServer => "control-plane",
        Role::Node => "node",
        Role::Bastion => "bastion",
    };
    let suffix = truncate_name(&cluster.replace('.', "-"), 30 - prefix.len() - 1, false);
    format!("{prefix}-{suffix}")
}

/// The email of a project's service account `account_id`.
pub fn gce_service_account_email(account_id: &str, project: &str) -> String {
    format!("{account_id}@{project}.iam.gserviceaccount.com")
}

/// The zonal managed instance group of instance group `group` in `zone`:
/// `<zone letter>-<group>-<cluster>` as a GCE name. The compiler names the MIGs so; the node join
/// server recognises a cluster's MIG (an instance's `created-by`) by it.
pub fn gce_instance_group_manager_name(zone: &str, group: &str, cluster: &str) -> String {
    let letter = zone.rsplit('-').next().unwrap_or(zone);
    gce_name(&format!("{letter}-{group}-{cluster}"))
}

/// The API load balancer's target group: `tcp-<cluster with dashes>`, 32 characters with kOps' hash
/// suffix. The compiler creates it; each control plane's protokube registers its own instance in it
/// once the local API server is ready, and the rolling update deregisters it.
pub fn api_target_group_name(cluster: &str) -> String {
    truncate_name(&format!("tcp-{}", cluster.replace('.', "-")), 32, true)
}

/// The API server's public name, `api.<cluster>` (protokube keeps it without a load balancer).
pub fn api_public_dns(cluster: &str) -> String {
    format!("api.{cluster}")
}

/// The API server's internal name, `api.internal.<cluster>`.
pub fn api_internal_dns(cluster: &str) -> String {
    format!("api.internal.{cluster}")
}

/// The node join server's name, `kops-controller.internal.<cluster>` (kOps' kops-controller's).
pub fn kops_controller_internal_dns(cluster: &str) -> String {
    format!("kops-controller.internal.{cluster}")
}

/// An etcd member's name, also the first label of its DNS name: `etcd-<member>` for etcd cluster
/// `main`, `etcd-<etcd cluster>-<member>` otherwise (`etcd-a`, `etcd-events-a`; kOps' names).
pub fn etcd_member_id(etcd_cluster: &str, member: &str) -> String {
    if etcd_cluster == "main" {
        format!("etcd-{member}")
    } else {
        format!("etcd-{etcd_cluster}-{member}")
    }
}

/// An etcd member's DNS name, `<member id>.internal.<cluster>` ([`etcd_member_id`]).
pub fn etcd_member_dns(etcd_cluster: &str, member: &str, cluster: &str) -> String {
    format!("{}.internal.{cluster}", etcd_member_id(etcd_cluster, member))
}

/// Every DNS record name protokube writes for `cluster`, as IAM `StringLike` patterns of Route53's
/// normalised record names (lower case, no trailing dot): the API names, the join server's, and
/// every etcd member of every etcd cluster (`etcd-*.internal.<cluster>`). The control planes'
/// `route53:ChangeResourceRecordSets` is conditioned on them.
pub fn protokube_record_patterns(cluster: &str) -> Vec<String> {
    let c = cluster.trim_end_matches('.').to_ascii_lowercase();
    vec![api_public_dns(&c), api_internal_dns(&c), kops_controller_internal_dns(&c), etcd_member_dns("main", "*", &c)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_account_roles_are_kops_names_within_64_characters() {
        assert_eq!(service_account_role_name("reader", "default", "c.example.com"), "reader.default.sa.c.example.com");
        assert_eq!(service_account_role_name("w", "team-*", "c.example.com"), "w.team-wildcard.sa.c.example.com");
        let long = service_account_role_name("a-rather-long-service-account-name", "a-long-namespace", "cluster.example.com");
        assert_eq!(long.len(), 64, "{long}");
        assert!(long.starts_with("a-rather-long-service-account-name.a-long-namespace.sa.cl-"), "kOps cuts to 57 and adds a hash: {long}");
    }

    #[test]
    fn gce_service_accounts_are_named_per_role_within_30_characters() {
        assert_eq!(gce_service_account_id(Role::Node, "c.example.com"), "node-c-example-com");
        assert_eq!(gce_service_account_id(Role::ApiServer, "c.example.com"), gce_service_account_id(Role::ControlPlane, "c.example.com"));
        let long = gce_service_account_id(Role::ControlPlane, "gce.k8s.example.com");
        assert_eq!(long.len(), 30, "{long}");
        assert!(long.starts_with("control-plane-gce-k8s-e-"), "{long}");
        assert_ne!(long, gce_service_account_id(Role::ControlPlane, "gce.k8s.example.org"), "the hash tells clusters apart");
        for role in [Role::ControlPlane, Role::Node, Role::Bastion] {
            let id = gce_service_account_id(role, "a-very-long-cluster-name.with.many.labels.example.com");
            assert!((6..=30).contains(&id.len()) && id.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'), "{id}");
        }
        assert_eq!(gce_service_account_email("node-c", "p"), "node-c@p.iam.gserviceaccount.com");
    }

    #[test]
    fn the_gce_cluster_label_is_kops_safe_name_cut_with_a_hash_only_when_too_long() {
        assert_eq!(gce_safe_cluster_name("gce.k8s.example.com"), "gce-k8s-example-com", "kOps' value when it fits");
        let long = "minimal-gce-with-a-very-very-very-very-very-long-name.example.com";
        let label = gce_safe_cluster_name(long);
        assert_eq!(label.len(), GCE_LABEL_MAX, "{label}");
        assert!(label.starts_with("minimal-gce-with-a-very-very-very-very-very-long-name-e"), "{label}");
        assert!(label.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'), "{label}");
        let other = gce_safe_cluster_name(&long.replace("example.com", "example.org"));
        assert_ne!(label, other, "two long names that share their first 56 characters stay apart");
        let exactly = "a".repeat(GCE_LABEL_MAX);
        assert_eq!(gce_safe_cluster_name(&exactly), exactly, "63 characters: uncut");
    }

    #[test]
    fn protokube_records_are_named_once() {
        assert_eq!(etcd_member_dns("main", "a", "c.example.com"), "etcd-a.internal.c.example.com");
        assert_eq!(etcd_member_dns("events", "a", "c.example.com"), "etcd-events-a.internal.c.example.com");
        assert_eq!(
            protokube_record_patterns("C.Example.com."),
            ["api.c.example.com", "api.internal.c.example.com", "kops-controller.internal.c.example.com", "etcd-*.internal.c.example.com"]
        );
    }

    #[test]
    fn gce_migs_are_named_for_zone_group_and_cluster() {
        assert_eq!(
            gce_instance_group_manager_name("europe-west1-b", "nodes-europe-west1-b", "gce.k8s.example.com"),
            "b-nodes-europe-west1-b-gce-k8s-example-com"
        );
        assert_eq!(gce_instance_group_manager_name("europe-west1-c", "control-plane-c", "gce.k8s.example.com"), "c-control-plane-c-gce-k8s-example-com");
        assert_eq!(gce_name("9Lives.example"), "k9lives-example");
        assert_eq!(gce_name(&"a".repeat(80)).len(), 63);
    }
}
