//! IAM policy documents for the instance roles (kOps' strict policies, adjusted to what Keelson's
//! agents read). No I/O: the AWS target and Terraform render the same documents.
//!
//! * Control plane: etcd volume attach/tag (protokube), the state store (nodeup, protokube),
//!   the etcd backup stores (protokube's multipart uploads, aborted on failure), Route53 on the
//!   cluster's zone (protokube: found by name with `ListHostedZonesByName` unless `spec.dnsZone`
//!   is an id; external-dns's zone listing only when it is rendered), and what the AWS
//!   cloud-controller-manager and the EBS CSI driver need — kOps' statement list, tag-conditioned
//!   the same way.
//!
//! The documents depend on the spec alone (and, for a `spec.dnsZone` given by name, on the zone's
//! id as the target knows it: the direct target's lookup, Terraform's `data.aws_route53_zone`), so
//! both targets render the same policy from [`policy`].
//!   `iam:CreateServiceLinkedRole` only for Elastic Load Balancing (the one service-linked role the
//!   cloud-controller-manager can cause to be created); `iam:GetInstanceProfile` only on the Node
//!   groups' instance profiles (the join server learns a custom profile's role from it).
//! * API servers (role APIServer): kOps' NodeRoleAPIServer — read the state store, KMS through
//!   EC2 and S3, ECR pulls when allowed; none of the control plane's etcd, DNS or cloud powers.
//! * Nodes: read their own instance-group config, the cluster CA and the bootstrap token from the
//!   state store (Keelson nodes boot from it; kOps nodes ask kops-controller instead), plus ECR
//!   pulls when `spec.iam.allowContainerRegistry` is set.

use serde_json::{json, Value};

use keelson_api::Role;

mod api_server;
mod control_plane;
mod node;

use self::api_server::api_server;
use self::control_plane::{control_plane, Holder};
use self::node::node;

/// What an instance role's inline policy is generated from.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceRolePolicy {
    pub role: Role,
    /// `spec.additionalPolicies` statements for this role, appended to the generated policy.
    pub additional_statements: Vec<Value>,
}

/// What the documents depend on, taken from the completed spec.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PolicyInputs {
    pub cluster: String,
    /// `aws`, `aws-cn` or `aws-us-gov`.
    pub partition: String,
    pub region: String,
    /// `(bucket, key prefix)` when ConfigBase is on S3.
    pub state_store: Option<(String, String)>,
    /// kubenet: the CCM manages VPC routes.
    pub kubenet: bool,
    pub allow_container_registry: bool,
    /// Workers join with the static bootstrap token (and may read it); otherwise by cloud identity.
    pub bootstrap_token: bool,
    /// `(bucket, key prefix)` of every etcd backup store on S3 (`etcdClusters[].backups.backupStore`),
    /// once each: control planes write backups there.
    pub backup_stores: Vec<(String, String)>,
    /// ARNs of the instance profiles of the Node instance groups (the default
    /// `…:instance-profile/nodes.<cluster>` and every custom `spec.iam.profile`), sorted, once each.
    pub node_instance_profiles: Vec<String>,
    /// No DNS records ([`keelson_api::nodeup::uses_hosts_dns`]): control planes publish the API
    /// servers' addresses for the workers at [`keelson_api::nodeup::API_SERVERS_KEY`].
    pub hosts_dns: bool,
    /// `spec.certManager.hostedZoneIDs` of a cert-manager Keelson renders: control planes (where
    /// it runs) may write its DNS-01 challenge records (TXT `_acme-challenge.*`) there, nothing else.
    pub cert_manager_zones: Vec<String>,
    /// The hosted zone protokube keeps the cluster's records in, as the spec gives it.
    pub dns_zone: DnsZone,
    /// external-dns is rendered (`spec.externalDns.provider: external-dns`): it runs on the control
    /// planes with their role and lists the account's zones and their tags.
    pub external_dns: bool,
    /// The addons on roles of their own (`useServiceAccountExternalPermissions`; the compiler's
    /// [`spec_compiler::addons::RenderedAddons::service_accounts`]): their statements leave the
    /// control plane's policy for [`addon_policy`]'s.
    pub addon_roles: Vec<keelson_api::addon_roles::AddonPermissions>,
}

/// The cluster's hosted zone as the spec gives it: what protokube calls to find it follows.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DnsZone {
    /// No DNS records (`.k8s.local`, `topology.dns.type: None`).
    #[default]
    None,
    /// `spec.dnsZone` unset: protokube finds the zone whose name is the longest suffix of the
    /// cluster name (`ListHostedZonesByName`); which zone that is is not known from the spec.
    Unset,
    /// `spec.dnsZone` is a zone id: protokube reads it (`GetHostedZone`).
    Id(String),
    /// `spec.dnsZone` is a name: protokube finds its id (`ListHostedZonesByName`).
    Name(String),
}

impl DnsZone {
    /// From `spec.dnsZone` of a cluster that has DNS records (kept in step with
    /// `cloud::dns::Route53Dns::find_zone`, which decides id or name the same way).
    pub fn of(hosts_dns: bool, dns_zone: Option<&str>) -> DnsZone {
        match dns_zone {
            _ if hosts_dns => DnsZone::None,
            None => DnsZone::Unset,
            Some(z) if cloud::dns::looks_like_zone_id(z) => DnsZone::Id(z.trim_start_matches('/').trim_start_matches("hostedzone/").to_string()),
            Some(z) => DnsZone::Name(z.to_string()),
        }
    }
}

impl PolicyInputs {
    pub fn new(
        cluster: &str,
        region: &str,
        config_base: &str,
        spec: &keelson_api::ClusterSpec,
        groups: &[keelson_api::InstanceGroup],
        bootstrap_token: bool,
    ) -> PolicyInputs {
        let partition = partition_of(region);
        let hosts_dns = keelson_api::plan::cluster_dns(cluster, spec) == keelson_api::plan::ClusterDns::Hosts;
        PolicyInputs {
            hosts_dns,
            dns_zone: DnsZone::of(hosts_dns, spec.dns_zone.as_deref()),
            external_dns: spec.external_dns.as_ref().and_then(|e| e.provider.as_deref()) == Some("external-dns"),
            node_instance_profiles: node_instance_profiles(cluster, partition, groups),
            cluster: cluster.to_string(),
            partition: partition.to_string(),
            region: region.to_string(),
            state_store: match config_base.parse::<base::ConfigBase>() {
                Ok(base::ConfigBase::S3 { bucket, prefix }) => Some((bucket, prefix)),
                _ => None,
            },
            kubenet: spec.networking.as_ref().is_some_and(|n| n.kubenet.is_some()),
            cert_manager_zones: spec
                .cert_manager
                .as_ref()
                .filter(|c| c.enabled == Some(true) && c.managed != Some(false))
                .and_then(|c| c.hosted_zone_ids.clone())
                .unwrap_or_default(),
            allow_container_registry: spec.iam.as_ref().and_then(|i| i.allow_container_registry).unwrap_or(false),
            bootstrap_token,
            addon_roles: Vec::new(),
            backup_stores: {
                let mut out: Vec<(String, String)> = Vec::new();
                for store in spec.etcd_clusters.iter().flatten().filter_map(|c| c.backups.as_ref()?.backup_store.clone()) {
                    if let Ok(base::ConfigBase::S3 { bucket, prefix }) = store.parse::<base::ConfigBase>() {
                        if !out.contains(&(bucket.clone(), prefix.clone())) {
                            out.push((bucket, prefix));
                        }
                    }
                }
                out
            },
        }
    }
}

/// The instance-profile ARNs of the Node groups: a custom `spec.iam.profile` as given, else the
/// profile apply creates (named like the role, [`keelson_api::names::iam_role_name`]; any account,
/// since the account id is not known here).
pub fn node_instance_profiles(cluster: &str, partition: &str, groups: &[keelson_api::InstanceGroup]) -> Vec<String> {
    let mut out: Vec<String> = groups
        .iter()
        .filter(|g| g.role() == Some(Role::Node))
        .map(|g| match g.spec.iam.as_ref().and_then(|i| i.profile.clone()) {
            Some(custom) => custom,
            None => format!("arn:{partition}:iam::*:instance-profile/{}", keelson_api::names::iam_role_name(Role::Node, cluster)),
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

pub use keelson_api::plan::partition_of;

/// Lets EC2 instances assume the role.
pub fn assume_role_policy(partition: &str) -> Value {
    let service = if partition == "aws-cn" { "ec2.amazonaws.com.cn" } else { "ec2.amazonaws.com" };
    json!({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}],
    })
}

/// The trust policy of a service account's role (IRSA; kOps `formatAWSIAMStatement`): the OIDC
/// provider `provider_arn` of the issuer `provider` (host and path) may assume it with a token whose
/// subject is the service account — `StringLike` when the namespace holds a `*`.
pub fn service_account_trust_policy(provider_arn: &str, provider: &str, namespace: &str, name: &str) -> Value {
    let op = if namespace.contains('*') { "StringLike" } else { "StringEquals" };
    json!({
        "Version": "2012-10-17",
        "Statement": [{
            "Effect": "Allow",
            "Principal": {"Federated": provider_arn},
            "Action": "sts:AssumeRoleWithWebIdentity",
            "Condition": {op: {format!("{provider}:sub"): format!("system:serviceaccount:{namespace}:{name}")}},
        }],
    })
}

/// A policy document of the statements a spec gives as a JSON list (kOps wraps them the same way).
pub fn policy_of_statements(statements: Vec<Value>) -> Value {
    json!({"Version": "2012-10-17", "Statement": statements})
}

fn statement(actions: &[&str], resources: Value, condition: Option<Value>) -> Value {
    let mut actions: Vec<&str> = actions.to_vec();
    actions.sort_unstable();
    let mut s = json!({"Effect": "Allow", "Action": actions, "Resource": resources});
    if let Some(c) = condition {
        s["Condition"] = c;
    }
    s
}

/// The role's inline policy; `None` when it has no statements (then none is attached). The one
/// function both targets render the policy with.
///
/// `zone_id` is the id of a zone the spec names ([`DnsZone::Name`]) as the target knows it (the
/// direct target's lookup, Terraform's data source); it is not used otherwise: a zone the spec
/// gives by id is used as given, and without `spec.dnsZone` the zone is found by protokube at boot
/// and is not known here (`hostedzone/*`: set `spec.dnsZone` to scope it).
pub fn policy(role: &InstanceRolePolicy, p: &PolicyInputs, zone_id: Option<&str>) -> Option<Value> {
    let mut statements = match role.role {
        Role::ControlPlane => control_plane(p, zone_id, Holder::ControlPlane),
        Role::ApiServer => api_server(p),
        Role::Node => node(p),
        Role::Bastion => Vec::new(),
    };
    statements.extend(role.additional_statements.iter().cloned());
    if statements.is_empty() {
        return None;
    }
    Some(json!({"Version": "2012-10-17", "Statement": statements}))
}

/// The inline policy of an addon's own role (`useServiceAccountExternalPermissions`): the
/// statements the control plane's policy holds for it otherwise, kOps' per-addon lists.
pub fn addon_policy(addon: keelson_api::addon_roles::AddonPermissions, p: &PolicyInputs, zone_id: Option<&str>) -> Option<Value> {
    let statements = control_plane(p, zone_id, Holder::Addon(addon));
    (!statements.is_empty()).then(|| json!({"Version": "2012-10-17", "Statement": statements}))
}

fn s3_arn(p: &PolicyInputs, bucket: &str, key: &str) -> String {
    let key = key.trim_end_matches('/');
    if key.is_empty() {
        format!("arn:{}:s3:::{bucket}/*", p.partition)
    } else {
        format!("arn:{}:s3:::{bucket}/{key}/*", p.partition)
    }
}

fn bucket_statement(p: &PolicyInputs, bucket: &str) -> Value {
    statement(
        &["s3:GetBucketLocation", "s3:GetEncryptionConfiguration", "s3:ListBucket", "s3:ListBucketVersions"],
        json!([format!("arn:{}:s3:::{bucket}", p.partition)]),
        None,
    )
}

const ECR_READ: &[&str] = &[
    "ecr:BatchCheckLayerAvailability",
    "ecr:BatchGetImage",
    "ecr:DescribeRepositories",
    "ecr:GetAuthorizationToken",
    "ecr:GetDownloadUrlForLayer",
    "ecr:GetRepositoryPolicy",
    "ecr:ListImages",
];

/// The services whose service-linked role the control plane may cause to be created: the
/// cloud-controller-manager's load balancers need Elastic Load Balancing's. (Auto Scaling's and
/// spot's are created by apply, which makes the groups, not by the instances.)
pub const SERVICE_LINKED_ROLE_SERVICES: &[&str] = &["elasticloadbalancing.amazonaws.com"];

/// Read the whole state store, write the etcd backup stores (`etcd`: control planes only), then
/// the buckets once each — kOps' order. Versions are never deleted: a backup's old versions stay
/// recoverable on a versioned bucket.
fn state_store_statements(p: &PolicyInputs, etcd: bool) -> Vec<Value> {
    let mut out = Vec::new();
    let mut buckets: Vec<&str> = Vec::new();
    if let Some((bucket, key)) = &p.state_store {
        out.push(statement(&["s3:Get*"], json!(s3_arn(p, bucket, key)), None));
        buckets.push(bucket);
    }
    if etcd {
        // PutObject covers a multipart upload's Create/UploadPart/Complete; a failed one is aborted.
        for (bucket, key) in &p.backup_stores {
            out.push(statement(&["s3:AbortMultipartUpload", "s3:GetObject", "s3:DeleteObject", "s3:PutObject"], json!(s3_arn(p, bucket, key)), None));
            buckets.push(bucket);
        }
    }
    buckets.sort_unstable();
    buckets.dedup();
    out.extend(buckets.into_iter().map(|b| bucket_statement(p, b)));
    out
}

/// KMS for encrypted volumes (through EC2) and an SSE-KMS state store (through S3).
fn kms_statements(p: &PolicyInputs) -> Vec<Value> {
    vec![
        statement(&["kms:CreateGrant"], json!("*"), Some(json!({"Bool": {"kms:GrantIsForAWSResource": "true"}}))),
        statement(
            &["kms:Decrypt", "kms:DescribeKey", "kms:Encrypt", "kms:GenerateDataKey*", "kms:ReEncrypt*"],
            json!("*"),
            Some(json!({"StringLike": {"kms:ViaService": [format!("ec2.{}.amazonaws.com", p.region), "s3.*.amazonaws.com"]}})),
        ),
    ]
}

#[cfg(test)]
mod tests;
