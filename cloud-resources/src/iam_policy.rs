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

/// The AWS partition of a region.
pub fn partition_of(region: &str) -> &'static str {
    if region.starts_with("cn-") {
        "aws-cn"
    } else if region.starts_with("us-gov-") {
        "aws-us-gov"
    } else {
        "aws"
    }
}

/// Lets EC2 instances assume the role.
pub fn assume_role_policy(partition: &str) -> Value {
    let service = if partition == "aws-cn" { "ec2.amazonaws.com.cn" } else { "ec2.amazonaws.com" };
    json!({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}],
    })
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
        Role::ControlPlane => control_plane(p, zone_id),
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

fn node(p: &PolicyInputs) -> Vec<Value> {
    let mut out = Vec::new();
    if let Some((bucket, key)) = &p.state_store {
        let prefix = key.trim_end_matches('/');
        let object = |rel: &str| {
            if prefix.is_empty() {
                format!("arn:{}:s3:::{bucket}/{rel}", p.partition)
            } else {
                format!("arn:{}:s3:::{bucket}/{prefix}/{rel}", p.partition)
            }
        };
        // What a worker reads on every cloud (GCE grants the same prefixes on its bucket).
        let key = |rel: &str| if prefix.is_empty() { rel.to_string() } else { format!("{prefix}/{rel}") };
        let token = base::bootstrap_token::state_key();
        let mut readable: Vec<String> = keelson_api::nodeup::NODE_READABLE_PREFIXES.iter().map(|p| object(&format!("{p}*"))).collect();
        if p.bootstrap_token {
            readable.push(object(&token));
        }
        out.push(statement(&["s3:GetObject"], json!(readable), None));
        // A worker lists nothing; the listing it may make is of what it may read (the bucket's
        // ListBucket is also what turns a missing object into 404 rather than 403).
        let bucket_arn = json!([format!("arn:{}:s3:::{bucket}", p.partition)]);
        out.push(statement(&["s3:GetBucketLocation", "s3:GetEncryptionConfiguration"], bucket_arn.clone(), None));
        let mut listable: Vec<String> = keelson_api::nodeup::NODE_READABLE_PREFIXES.iter().map(|p| key(&format!("{p}*"))).collect();
        if p.bootstrap_token {
            listable.push(key(&token));
        }
        out.push(statement(&["s3:ListBucket"], bucket_arn, Some(json!({"StringLike": {"s3:prefix": listable}}))));
    }
    if p.allow_container_registry {
        out.push(statement(ECR_READ, json!("*"), None));
    }
    out
}

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

/// kOps' NodeRoleAPIServer: what nodeup needs to boot an API server from the state store.
fn api_server(p: &PolicyInputs) -> Vec<Value> {
    let mut out = state_store_statements(p, false);
    out.extend(kms_statements(p));
    if p.allow_container_registry {
        out.push(statement(ECR_READ, json!("*"), None));
    }
    out
}

fn control_plane(p: &PolicyInputs, zone_id: Option<&str>) -> Vec<Value> {
    let c = &p.cluster;
    let part = &p.partition;
    let cluster_tag = json!({"StringEquals": {"aws:ResourceTag/KubernetesCluster": c}});
    let request_tag = json!({"StringEquals": {"aws:RequestTag/KubernetesCluster": c}});
    let mut out = vec![statement(
        &["ec2:AttachVolume"],
        json!(["*"]),
        Some(json!({"StringEquals": {"aws:ResourceTag/KubernetesCluster": c, "aws:ResourceTag/k8s.io/role/master": "1"}})),
    )];
    out.extend(state_store_statements(p, true));
    if let Some((bucket, key)) = &p.state_store {
        // The objects of the state store a control plane writes: where workers learn the live API
        // servers' addresses (they may read igconfig/node/*, nothing else of the cloud), and in
        // token mode the bootstrap token protokube rotates.
        let prefix = key.trim_end_matches('/');
        let object = |rel: &str| format!("arn:{part}:s3:::{bucket}/{}", if prefix.is_empty() { rel.to_string() } else { format!("{prefix}/{rel}") });
        let mut writes = Vec::new();
        if p.hosts_dns {
            writes.push(object(keelson_api::nodeup::API_SERVERS_KEY));
        }
        if p.bootstrap_token {
            writes.push(object(&base::bootstrap_token::state_key()));
        }
        if !writes.is_empty() {
            out.push(statement(&["s3:PutObject"], json!(writes), None));
        }
    }
    // protokube (cloud::dns::Route53Dns): find the zone, list and change its records. It never
    // waits on a change (no GetChange).
    let zone_arn = |zone: &str| format!("arn:{part}:route53:::hostedzone/{}", zone.trim_start_matches('/').trim_start_matches("hostedzone/"));
    let records = match &p.dns_zone {
        DnsZone::None => None,
        DnsZone::Id(id) => Some((zone_arn(id), "route53:GetHostedZone")),
        DnsZone::Name(_) => Some((zone_arn(zone_id.unwrap_or("*")), "route53:ListHostedZonesByName")),
        DnsZone::Unset => Some((zone_arn("*"), "route53:ListHostedZonesByName")),
    };
    let mut by_name = false;
    if let Some((zone, find)) = records {
        let mut on_zone = vec!["route53:ListResourceRecordSets"];
        if find == "route53:GetHostedZone" {
            on_zone.push(find);
        }
        out.push(statement(&on_zone, json!([zone]), None));
        // Writes only to the names protokube keeps; external-dns (with the same role) writes
        // whatever its Services and Ingresses name, in the same zone.
        let names = (!p.external_dns).then(
            || json!({"ForAllValues:StringLike": {"route53:ChangeResourceRecordSetsNormalizedRecordNames": keelson_api::names::protokube_record_patterns(c)}}),
        );
        out.push(statement(&["route53:ChangeResourceRecordSets"], json!([zone]), names));
        if find == "route53:ListHostedZonesByName" {
            // The action supports no resource but `*`.
            out.push(statement(&[find], json!(["*"]), None));
            by_name = true;
        }
        if p.external_dns {
            // external-dns's AWS provider lists the zones and their tags to pick the ones it owns.
            out.push(statement(&["route53:ListHostedZones", "route53:ListTagsForResource"], json!(["*"]), None));
        }
    }
    if !p.cert_manager_zones.is_empty() {
        // kOps' cert-manager permissions (addonmanifests/certmanager/iam.go), on the control planes.
        let zones: Vec<String> = p
            .cert_manager_zones
            .iter()
            .map(|z| format!("arn:{part}:route53:::hostedzone/{}", z.trim_start_matches('/').trim_start_matches("hostedzone/")))
            .collect();
        out.push(statement(&["route53:ListResourceRecordSets"], json!(zones), None));
        out.push(statement(
            &["route53:ChangeResourceRecordSets"],
            json!(zones),
            Some(json!({
                "ForAllValues:StringLike": {"route53:ChangeResourceRecordSetsNormalizedRecordNames": ["_acme-challenge.*"]},
                "ForAllValues:StringEquals": {"route53:ChangeResourceRecordSetsRecordTypes": ["TXT"]},
            })),
        ));
        out.push(statement(&["route53:GetChange"], json!([format!("arn:{part}:route53:::change/*")]), None));
        if !by_name {
            out.push(statement(&["route53:ListHostedZonesByName"], json!(["*"]), None));
        }
    }
    let volumes = json!([format!("arn:{part}:ec2:*:*:snapshot/*"), format!("arn:{part}:ec2:*:*:volume/*")]);
    let groups = json!([format!("arn:{part}:ec2:*:*:security-group/*")]);
    let tag_on_create = |actions: &[&str]| json!({"StringEquals": {"aws:RequestTag/KubernetesCluster": c, "ec2:CreateAction": actions}});
    let retag = json!({
        "Null": {"aws:RequestTag/KubernetesCluster": "true"},
        "StringEquals": {"aws:ResourceTag/KubernetesCluster": c},
    });
    out.push(statement(&["ec2:CreateTags"], volumes.clone(), Some(tag_on_create(&["CopyVolumes", "CreateVolume"]))));
    out.push(statement(&["ec2:CreateTags", "ec2:DeleteTags"], volumes, Some(retag.clone())));
    out.push(statement(&["ec2:CreateTags"], groups.clone(), Some(tag_on_create(&["CreateSecurityGroup"]))));
    out.push(statement(&["ec2:CreateTags", "ec2:DeleteTags"], groups, Some(retag)));
    out.extend(kms_statements(p));
    let mut describe = vec![
        "autoscaling:DescribeAutoScalingGroups",
        "autoscaling:DescribeAutoScalingInstances",
        "autoscaling:DescribeLaunchConfigurations",
        "autoscaling:DescribeScalingActivities",
        "autoscaling:DescribeTags",
        "ec2:DescribeAvailabilityZones",
        "ec2:DescribeImages",
        "ec2:DescribeInstanceTopology",
        "ec2:DescribeInstanceTypes",
        "ec2:DescribeInstances",
        "ec2:DescribeLaunchTemplateVersions",
        "ec2:DescribeRegions",
        "ec2:DescribeRouteTables",
        "ec2:DescribeSecurityGroups",
        "ec2:DescribeSubnets",
        "ec2:DescribeTags",
        "ec2:DescribeVolumeStatus",
        "ec2:DescribeVolumes",
        "ec2:DescribeVolumesModifications",
        "ec2:DescribeVpcs",
        "ec2:GetInstanceTypesFromInstanceRequirements",
        "elasticloadbalancing:DescribeListeners",
        "elasticloadbalancing:DescribeLoadBalancerAttributes",
        "elasticloadbalancing:DescribeLoadBalancerPolicies",
        "elasticloadbalancing:DescribeLoadBalancers",
        "elasticloadbalancing:DescribeTargetGroupAttributes",
        "elasticloadbalancing:DescribeTargetGroups",
        "elasticloadbalancing:DescribeTargetHealth",
        "kms:DescribeKey",
    ];
    if p.allow_container_registry {
        describe.extend_from_slice(ECR_READ);
    }
    out.push(statement(&describe, json!("*"), None));
    out.push(statement(&["iam:CreateServiceLinkedRole"], json!("*"), Some(json!({"StringEquals": {"iam:AWSServiceName": SERVICE_LINKED_ROLE_SERVICES}}))));
    // The join server reads the instance profile a worker claims (to learn a custom profile's
    // role); workers joining with the static token never ask it.
    if !p.bootstrap_token && !p.node_instance_profiles.is_empty() {
        out.push(statement(&["iam:GetInstanceProfile"], json!(p.node_instance_profiles), None));
    }
    let mut tagged = vec![
        "autoscaling:SetDesiredCapacity",
        "autoscaling:TerminateInstanceInAutoScalingGroup",
        "ec2:AttachVolume",
        "ec2:AuthorizeSecurityGroupIngress",
        "ec2:DeleteSecurityGroup",
        "ec2:DeleteVolume",
        "ec2:DetachVolume",
        "ec2:ModifyInstanceAttribute",
        "ec2:ModifyVolume",
        "ec2:RevokeSecurityGroupIngress",
        "elasticloadbalancing:AddTags",
        "elasticloadbalancing:ApplySecurityGroupsToLoadBalancer",
        "elasticloadbalancing:AttachLoadBalancerToSubnets",
        "elasticloadbalancing:ConfigureHealthCheck",
        "elasticloadbalancing:CreateLoadBalancerListeners",
        "elasticloadbalancing:CreateLoadBalancerPolicy",
        "elasticloadbalancing:DeleteListener",
        "elasticloadbalancing:DeleteLoadBalancer",
        "elasticloadbalancing:DeleteLoadBalancerListeners",
        "elasticloadbalancing:DeleteTargetGroup",
        "elasticloadbalancing:DeregisterInstancesFromLoadBalancer",
        "elasticloadbalancing:DeregisterTargets",
        "elasticloadbalancing:DetachLoadBalancerFromSubnets",
        "elasticloadbalancing:ModifyListener",
        "elasticloadbalancing:ModifyLoadBalancerAttributes",
        "elasticloadbalancing:ModifyTargetGroup",
        "elasticloadbalancing:ModifyTargetGroupAttributes",
        "elasticloadbalancing:RegisterInstancesWithLoadBalancer",
        "elasticloadbalancing:RegisterTargets",
        "elasticloadbalancing:SetLoadBalancerPoliciesForBackendServer",
        "elasticloadbalancing:SetLoadBalancerPoliciesOfListener",
    ];
    if p.kubenet {
        tagged.extend_from_slice(&["ec2:CreateRoute", "ec2:DeleteRoute"]);
    }
    out.push(statement(&tagged, json!("*"), Some(cluster_tag)));
    out.push(statement(
        &[
            "ec2:CopyVolumes",
            "ec2:CreateSecurityGroup",
            "ec2:CreateVolume",
            "elasticloadbalancing:CreateListener",
            "elasticloadbalancing:CreateLoadBalancer",
            "elasticloadbalancing:CreateTargetGroup",
        ],
        json!("*"),
        Some(request_tag),
    ));
    out.push(statement(&["ec2:CreateSecurityGroup"], json!([format!("arn:{part}:ec2:*:*:vpc/*")]), None));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn role(r: Role) -> InstanceRolePolicy {
        InstanceRolePolicy { role: r, additional_statements: vec![] }
    }

    fn inputs() -> PolicyInputs {
        PolicyInputs {
            cluster: "c.example.com".into(),
            partition: "aws".into(),
            region: "eu-west-1".into(),
            state_store: Some(("bucket".into(), "c.example.com".into())),
            kubenet: false,
            allow_container_registry: false,
            bootstrap_token: false,
            backup_stores: vec![("bucket".into(), "c.example.com/backups/etcd/main".into()), ("other".into(), "b/events".into())],
            node_instance_profiles: vec!["arn:aws:iam::*:instance-profile/nodes.c.example.com".into()],
            hosts_dns: false,
            cert_manager_zones: Vec::new(),
            dns_zone: DnsZone::Id("Z123".into()),
            external_dns: false,
        }
    }

    /// cert-manager's DNS-01 solver may write TXT `_acme-challenge.*` records in the zones it is
    /// given, and nothing else in them.
    #[test]
    fn cert_manager_writes_only_acme_challenges_in_its_zones() {
        let p = PolicyInputs { cert_manager_zones: vec!["ZCERT1".into()], dns_zone: DnsZone::None, ..inputs() };
        let doc = policy(&role(Role::ControlPlane), &p, None).expect("policy");
        let change = granting(&doc, "route53:ChangeResourceRecordSets");
        assert_eq!(change.len(), 1, "{change:?}");
        assert_eq!(change[0]["Resource"], json!(["arn:aws:route53:::hostedzone/ZCERT1"]));
        assert_eq!(change[0]["Condition"]["ForAllValues:StringEquals"]["route53:ChangeResourceRecordSetsRecordTypes"], json!(["TXT"]));
        assert_eq!(change[0]["Condition"]["ForAllValues:StringLike"]["route53:ChangeResourceRecordSetsNormalizedRecordNames"], json!(["_acme-challenge.*"]));
        assert_eq!(granting(&doc, "route53:GetChange").len(), 1);
        assert_eq!(granting(&doc, "route53:ListHostedZonesByName").len(), 1, "once, for cert-manager");
        let found_by_name = PolicyInputs { dns_zone: DnsZone::Unset, ..p.clone() };
        assert_eq!(granting(&policy(&role(Role::ControlPlane), &found_by_name, None).expect("policy"), "route53:ListHostedZonesByName").len(), 1, "once");
        let no_cert_manager = policy(&role(Role::ControlPlane), &inputs(), None).expect("policy");
        assert!(granting(&no_cert_manager, "route53:ListHostedZonesByName").is_empty(), "the zone is given by id");
        assert!(granting(&no_cert_manager, "route53:GetChange").is_empty(), "protokube never waits on a change");
        assert!(granting(&policy(&role(Role::Node), &p, None).expect("policy"), "route53:ChangeResourceRecordSets").is_empty());
    }

    /// A hosts-DNS cluster: control planes may write the one object where workers learn the API
    /// servers' addresses, and workers read it with the permission they already have.
    #[test]
    fn hosts_dns_control_planes_publish_the_api_servers_workers_already_read_them() {
        let key = keelson_api::nodeup::API_SERVERS_KEY;
        let object = format!("arn:aws:s3:::bucket/c.example.com/{key}");
        let writes = |doc: &Value| granting(doc, "s3:PutObject").iter().any(|s| s["Resource"] == json!([object.clone()]));
        let gossip = PolicyInputs { hosts_dns: true, dns_zone: DnsZone::None, ..inputs() };
        assert!(writes(&policy(&role(Role::ControlPlane), &gossip, None).expect("policy")));
        assert!(!writes(&policy(&role(Role::ControlPlane), &inputs(), Some("Z1")).expect("policy")), "with DNS records: not needed");
        let node = policy(&role(Role::Node), &gossip, None).expect("policy");
        assert!(granting(&node, "s3:PutObject").is_empty());
        let readable = granting(&node, "s3:GetObject");
        let covers = |pattern: &str| object.starts_with(pattern.trim_end_matches('*')) && pattern.ends_with('*');
        assert!(
            readable.iter().flat_map(|s| s["Resource"].as_array().cloned().unwrap_or_default()).any(|r| r.as_str().is_some_and(covers)),
            "a worker reads {object} with its existing permission: {readable:?}"
        );
        assert_eq!(policy(&role(Role::Node), &gossip, None), policy(&role(Role::Node), &inputs(), None), "hosts DNS gives workers nothing more");
    }

    fn statements(doc: &Value) -> Vec<Value> {
        doc["Statement"].as_array().cloned().unwrap_or_default()
    }

    /// The statements that grant `action`.
    fn granting(doc: &Value, action: &str) -> Vec<Value> {
        statements(doc).into_iter().filter(|s| s["Action"].as_array().is_some_and(|a| a.contains(&json!(action)))).collect()
    }

    fn actions(doc: &Value) -> Vec<String> {
        doc["Statement"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|s| s["Action"].as_array().cloned().unwrap_or_default())
            .filter_map(|a| a.as_str().map(str::to_string))
            .collect()
    }

    #[test]
    fn control_plane_can_do_what_protokube_does_and_only_in_its_zone() {
        let doc = policy(&role(Role::ControlPlane), &inputs(), Some("/hostedzone/Z123")).expect("policy");
        let a = actions(&doc);
        for needed in ["ec2:AttachVolume", "ec2:DescribeVolumes", "ec2:DescribeInstances", "route53:ChangeResourceRecordSets", "s3:Get*"] {
            assert!(a.iter().any(|x| x == needed), "{needed} missing");
        }
        let text = doc.to_string();
        assert!(text.contains("arn:aws:route53:::hostedzone/Z123\""), "{text}");
        assert!(text.contains("arn:aws:s3:::bucket/c.example.com/*"), "{text}");
        assert!(!a.iter().any(|x| x == "ec2:CreateRoute"), "no route management without kubenet");
        let gossip = PolicyInputs { hosts_dns: true, dns_zone: DnsZone::None, ..inputs() };
        assert!(policy(&role(Role::ControlPlane), &gossip, None).expect("p").to_string().find("route53").is_none(), "no records, no Route53");
    }

    /// What `cloud::dns::Route53Dns` calls, on the resources AWS authorises them on: the zone
    /// found by name (`ListHostedZonesByName`, which takes only `*`) or read by id (`GetHostedZone`
    /// on it), then its records.
    #[test]
    fn control_planes_may_find_their_zone_the_way_protokube_does() {
        let on = |doc: &Value, action: &str| -> Vec<Value> { granting(doc, action).into_iter().map(|s| s["Resource"].clone()).collect() };
        let by_id = policy(&role(Role::ControlPlane), &inputs(), Some("ZIGNORED")).expect("policy");
        assert_eq!(on(&by_id, "route53:GetHostedZone"), [json!(["arn:aws:route53:::hostedzone/Z123"])]);
        assert_eq!(on(&by_id, "route53:ChangeResourceRecordSets"), [json!(["arn:aws:route53:::hostedzone/Z123"])]);
        assert!(on(&by_id, "route53:ListHostedZonesByName").is_empty());
        let by_name = PolicyInputs { dns_zone: DnsZone::Name("example.com".into()), ..inputs() };
        let doc = policy(&role(Role::ControlPlane), &by_name, Some("/hostedzone/ZFOUND")).expect("policy");
        assert_eq!(on(&doc, "route53:ListHostedZonesByName"), [json!(["*"])]);
        assert_eq!(on(&doc, "route53:ListResourceRecordSets"), [json!(["arn:aws:route53:::hostedzone/ZFOUND"])]);
        assert!(on(&doc, "route53:GetHostedZone").is_empty(), "not called for a zone found by name");
        let unset = PolicyInputs { dns_zone: DnsZone::Unset, ..inputs() };
        let doc = policy(&role(Role::ControlPlane), &unset, Some("ZFOUND")).expect("policy");
        assert_eq!(on(&doc, "route53:ListHostedZonesByName"), [json!(["*"])]);
        assert_eq!(on(&doc, "route53:ChangeResourceRecordSets"), [json!(["arn:aws:route53:::hostedzone/*"])], "unknown from the spec");
        assert_eq!(doc, policy(&role(Role::ControlPlane), &unset, None).expect("policy"), "the same whatever the target resolved");
        for a in ["route53:ListHostedZones", "route53:ListTagsForResource", "route53:GetChange"] {
            assert!(on(&doc, a).is_empty(), "{a}: nothing of protokube calls it");
        }
        let external = PolicyInputs { external_dns: true, ..unset };
        let doc = policy(&role(Role::ControlPlane), &external, None).expect("policy");
        assert_eq!(on(&doc, "route53:ListHostedZones"), [json!(["*"])], "external-dns lists the zones");
        assert_eq!(DnsZone::of(false, Some("/hostedzone/Z0123456789")), DnsZone::Id("Z0123456789".into()));
        assert_eq!(DnsZone::of(false, Some("example.com")), DnsZone::Name("example.com".into()));
        assert_eq!(DnsZone::of(true, Some("Z0123456789")), DnsZone::None);
    }

    /// Control planes write etcd backups (kOps' statement), API servers and nodes do not.
    /// kOps' `AddClusterAutoscalerPermissions`: the cluster-autoscaler (on the control planes, with
    /// their role) may change only the cluster's groups; it may read every group, template and type.
    #[test]
    fn control_planes_may_scale_only_the_clusters_groups() {
        let doc = policy(&role(Role::ControlPlane), &inputs(), None).expect("policy");
        for write in ["autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup"] {
            let s = granting(&doc, write);
            assert_eq!(s.len(), 1, "{write}: {s:?}");
            assert_eq!(s[0]["Condition"], json!({"StringEquals": {"aws:ResourceTag/KubernetesCluster": "c.example.com"}}), "{write}");
        }
        for read in [
            "autoscaling:DescribeAutoScalingGroups",
            "autoscaling:DescribeAutoScalingInstances",
            "autoscaling:DescribeLaunchConfigurations",
            "autoscaling:DescribeScalingActivities",
            "ec2:DescribeImages",
            "ec2:DescribeInstanceTypes",
            "ec2:DescribeLaunchTemplateVersions",
            "ec2:GetInstanceTypesFromInstanceRequirements",
        ] {
            assert!(granting(&doc, read).iter().any(|s| s.get("Condition").is_none()), "{read} missing");
        }
        let node = policy(&role(Role::Node), &inputs(), None).expect("policy");
        assert!(granting(&node, "autoscaling:SetDesiredCapacity").is_empty(), "workers do not scale groups");
    }

    #[test]
    fn control_planes_write_the_etcd_backup_stores() {
        let doc = policy(&role(Role::ControlPlane), &inputs(), None).expect("policy");
        let statements = doc["Statement"].as_array().expect("statements").clone();
        let write = statements
            .iter()
            .find(|s| s["Resource"] == json!("arn:aws:s3:::bucket/c.example.com/backups/etcd/main/*"))
            .expect("a statement on the main backup store");
        assert_eq!(
            write["Action"],
            json!(["s3:AbortMultipartUpload", "s3:DeleteObject", "s3:GetObject", "s3:PutObject"]),
            "a failed multipart upload is aborted"
        );
        assert!(granting(&doc, "s3:DeleteObjectVersion").is_empty(), "old backup versions stay recoverable: {doc}");
        assert!(doc.to_string().contains("arn:aws:s3:::other/b/events/*"));
        let buckets: Vec<&Value> = statements.iter().filter(|s| s["Action"].as_array().is_some_and(|a| a.contains(&json!("s3:ListBucket")))).collect();
        assert_eq!(buckets.len(), 2, "each bucket once: {buckets:?}");
        for r in [Role::ApiServer, Role::Node] {
            let text = policy(&role(r), &inputs(), None).map(|d| d.to_string()).unwrap_or_default();
            assert!(!text.contains("s3:PutObject"), "{r:?} writes: {text}");
        }
    }

    #[test]
    fn nodes_read_only_their_boot_files() {
        let doc = policy(&role(Role::Node), &inputs(), Some("Z1")).expect("policy");
        let text = doc.to_string();
        assert!(text.contains("bucket/c.example.com/igconfig/node/*"), "{text}");
        assert!(!text.contains("pki/private"), "{text}");
        assert!(!text.contains("route53"), "{text}");
        assert!(!text.contains("node-bootstrap-token"), "joining by cloud identity, nodes may not read the token: {text}");
        let token = PolicyInputs { bootstrap_token: true, ..inputs() };
        let node = policy(&role(Role::Node), &token, Some("Z1")).expect("policy");
        assert!(node.to_string().contains("secrets/node-bootstrap-token"));
        assert!(granting(&node, "s3:PutObject").is_empty(), "nodes only read the token");
        // Token mode: control planes publish the token protokube rotates, and only that object of secrets/.
        let object = json!(["arn:aws:s3:::bucket/c.example.com/secrets/node-bootstrap-token"]);
        let cp = policy(&role(Role::ControlPlane), &token, Some("Z1")).expect("policy");
        assert!(granting(&cp, "s3:PutObject").iter().any(|s| s["Resource"] == object), "{cp}");
        let cp = policy(&role(Role::ControlPlane), &inputs(), Some("Z1")).expect("policy");
        assert!(!cp.to_string().contains("secrets/node-bootstrap-token"), "by cloud identity: no token to publish: {cp}");
        let no_store = PolicyInputs { state_store: None, ..inputs() };
        assert_eq!(policy(&role(Role::Node), &no_store, None), None, "nothing to allow → no policy");
        let ecr = PolicyInputs { allow_container_registry: true, ..no_store };
        assert!(actions(&policy(&role(Role::Node), &ecr, None).expect("p")).contains(&"ecr:BatchGetImage".to_string()));
    }

    /// A worker may list only under what it may read (`NODE_READABLE_PREFIXES`, the token in
    /// token mode): never `secrets/`, `pki/private/` or the whole store.
    #[test]
    fn nodes_list_only_what_they_may_read() {
        use testkit::iam_oracle::{evaluate, Request};
        let list = |prefix: Option<&str>| {
            let r = Request::new("s3:ListBucket", "arn:aws:s3:::bucket");
            match prefix {
                Some(p) => r.with("s3:prefix", &[p]),
                None => r,
            }
        };
        let doc = policy(&role(Role::Node), &inputs(), None).expect("policy");
        for ok in ["c.example.com/igconfig/node/", "c.example.com/igconfig/node/nodes-a/nodeupconfig.yaml", "c.example.com/pki/issued/kubernetes-ca/"] {
            assert!(evaluate("nodes", &doc, &list(Some(ok))).is_ok(), "{ok}");
        }
        for denied in
            [None, Some(""), Some("c.example.com/"), Some("c.example.com/secrets/"), Some("c.example.com/pki/private/"), Some("c.example.com/igconfig/")]
        {
            assert!(evaluate("nodes", &doc, &list(denied)).is_err(), "{denied:?}");
        }
        assert!(evaluate("nodes", &doc, &list(Some("c.example.com/secrets/node-bootstrap-token"))).is_err(), "not the token by cloud identity");
        assert!(granting(&doc, "s3:ListBucketVersions").is_empty(), "no versions");
        let token = policy(&role(Role::Node), &PolicyInputs { bootstrap_token: true, ..inputs() }, None).expect("policy");
        assert!(evaluate("nodes", &token, &list(Some("c.example.com/secrets/node-bootstrap-token"))).is_ok());
        assert!(evaluate("nodes", &token, &list(Some("c.example.com/secrets/"))).is_err());
        let top = policy(&role(Role::Node), &PolicyInputs { state_store: Some(("bucket".into(), String::new())), ..inputs() }, None).expect("policy");
        assert!(evaluate("nodes", &top, &list(Some("igconfig/node/"))).is_ok(), "a store at the bucket's top");
        assert!(evaluate("nodes", &top, &list(Some("secrets/"))).is_err());
    }

    /// protokube's records, and only them: a write of any other name in the zone is denied (with
    /// external-dns, which writes its Services' names with the same role, the zone is open).
    #[test]
    fn control_planes_write_only_the_clusters_record_names() {
        use testkit::iam_oracle::{evaluate, Request};
        let change = |names: &[&str]| {
            Request::new("route53:ChangeResourceRecordSets", "arn:aws:route53:::hostedzone/Z123")
                .with("route53:ChangeResourceRecordSetsNormalizedRecordNames", names)
        };
        let doc = policy(&role(Role::ControlPlane), &inputs(), None).expect("policy");
        let ours = [
            "api.c.example.com",
            "api.internal.c.example.com",
            "kops-controller.internal.c.example.com",
            "etcd-a.internal.c.example.com",
            "etcd-events-b.internal.c.example.com",
        ];
        assert!(evaluate("masters", &doc, &change(&ours)).is_ok());
        for outside in [&["www.example.com"][..], &["api.internal.c.example.com", "www.example.com"], &["c.example.com"], &["api.other.example.com"]] {
            assert!(evaluate("masters", &doc, &change(outside)).is_err(), "{outside:?}");
        }
        let external = policy(&role(Role::ControlPlane), &PolicyInputs { external_dns: true, ..inputs() }, None).expect("policy");
        assert!(evaluate("masters", &external, &change(&["www.example.com"])).is_ok(), "external-dns");
    }

    /// kOps' NodeRoleAPIServer: the state store, KMS and (when allowed) ECR — nothing of the
    /// control plane's etcd volumes, DNS, load balancers, security groups or autoscaling.
    #[test]
    fn api_servers_get_the_api_server_set_not_the_control_planes() {
        let doc = policy(&role(Role::ApiServer), &inputs(), Some("Z123")).expect("policy");
        let mut a = actions(&doc);
        a.sort();
        a.dedup();
        let want: Vec<String> = [
            "kms:CreateGrant",
            "kms:Decrypt",
            "kms:DescribeKey",
            "kms:Encrypt",
            "kms:GenerateDataKey*",
            "kms:ReEncrypt*",
            "s3:Get*",
            "s3:GetBucketLocation",
            "s3:GetEncryptionConfiguration",
            "s3:ListBucket",
            "s3:ListBucketVersions",
        ]
        .map(str::to_string)
        .to_vec();
        assert_eq!(a, want, "{doc:#}");
        assert_eq!(granting(&doc, "s3:Get*")[0]["Resource"], json!("arn:aws:s3:::bucket/c.example.com/*"));
        let buckets: Vec<Value> = granting(&doc, "s3:ListBucket").into_iter().map(|s| s["Resource"].clone()).collect();
        assert_eq!(buckets, [json!(["arn:aws:s3:::bucket"])], "the state store's bucket only, not the backup stores'");
        let ecr = PolicyInputs { allow_container_registry: true, ..inputs() };
        assert!(actions(&policy(&role(Role::ApiServer), &ecr, None).expect("p")).contains(&"ecr:BatchGetImage".to_string()));
    }

    #[test]
    fn service_linked_roles_only_for_elastic_load_balancing() {
        let doc = policy(&role(Role::ControlPlane), &inputs(), None).expect("policy");
        let slr = granting(&doc, "iam:CreateServiceLinkedRole");
        assert_eq!(slr.len(), 1, "{slr:?}");
        assert_eq!(slr[0]["Action"], json!(["iam:CreateServiceLinkedRole"]), "alone in its statement");
        assert_eq!(slr[0]["Condition"], json!({"StringEquals": {"iam:AWSServiceName": ["elasticloadbalancing.amazonaws.com"]}}));
    }

    #[test]
    fn control_planes_read_only_the_node_instance_profiles() {
        let custom = "arn:aws:iam::123456789012:instance-profile/custom-workers";
        let p = PolicyInputs { node_instance_profiles: vec![inputs().node_instance_profiles[0].clone(), custom.into()], ..inputs() };
        let doc = policy(&role(Role::ControlPlane), &p, None).expect("policy");
        let get = granting(&doc, "iam:GetInstanceProfile");
        assert_eq!(get.len(), 1);
        assert_eq!(get[0]["Action"], json!(["iam:GetInstanceProfile"]));
        assert_eq!(get[0]["Resource"], json!(["arn:aws:iam::*:instance-profile/nodes.c.example.com", custom]));
        assert!(get[0].get("Condition").is_none());
        for r in [Role::ApiServer, Role::Node] {
            let text = policy(&role(r), &p, None).map(|d| d.to_string()).unwrap_or_default();
            assert!(!text.contains("iam:"), "{r:?}: {text}");
        }
        let token = PolicyInputs { bootstrap_token: true, ..p };
        assert!(granting(&policy(&role(Role::ControlPlane), &token, None).expect("p"), "iam:GetInstanceProfile").is_empty(), "no join server");
    }

    #[test]
    fn node_instance_profiles_are_the_default_one_and_custom_ones() {
        let text = "apiVersion: kops.k8s.io/v1alpha2\nkind: Cluster\nmetadata:\n  name: c.example.com\nspec: {}\n---\n\
            apiVersion: kops.k8s.io/v1alpha2\nkind: InstanceGroup\nmetadata:\n  name: a\nspec:\n  role: Node\n---\n\
            apiVersion: kops.k8s.io/v1alpha2\nkind: InstanceGroup\nmetadata:\n  name: b\nspec:\n  role: Node\n  iam:\n    profile: arn:aws-cn:iam::1:instance-profile/w\n---\n\
            apiVersion: kops.k8s.io/v1alpha2\nkind: InstanceGroup\nmetadata:\n  name: c\nspec:\n  role: Node\n---\n\
            apiVersion: kops.k8s.io/v1alpha2\nkind: InstanceGroup\nmetadata:\n  name: cp\nspec:\n  role: Master\n  iam:\n    profile: arn:aws-cn:iam::1:instance-profile/cp\n";
        let docs = keelson_api::parse_documents(text.as_bytes()).expect("docs");
        assert_eq!(
            node_instance_profiles("c.example.com", "aws-cn", &docs.instance_groups),
            ["arn:aws-cn:iam::*:instance-profile/nodes.c.example.com", "arn:aws-cn:iam::1:instance-profile/w"]
        );
    }

    #[test]
    fn china_uses_its_partition_and_service() {
        assert_eq!(partition_of("cn-north-1"), "aws-cn");
        assert!(assume_role_policy("aws-cn").to_string().contains("ec2.amazonaws.com.cn"));
        assert_eq!(partition_of("us-gov-west-1"), "aws-us-gov");
    }
}
