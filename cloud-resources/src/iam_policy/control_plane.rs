//! Control planes: etcd volumes, the state store and backup stores, Route53, and what the AWS
//! cloud-controller-manager, the EBS CSI driver, the cluster-autoscaler, external-dns and
//! cert-manager need (kOps' statement lists) — each action marked with whom it is for, so that an
//! addon on a role of its own (`useServiceAccountExternalPermissions`) takes its statements to that
//! role ([`Holder::Addon`]) and the control plane keeps its own agents' (protokube, nodeup, the
//! join server) and those of the addons still running with its role.

use serde_json::{json, Value};

use keelson_api::addon_roles::AddonPermissions;

use super::{kms_statements, state_store_statements, statement, DnsZone, PolicyInputs, ECR_READ, SERVICE_LINKED_ROLE_SERVICES};

/// Whom an action is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum For {
    /// The control plane's own agents: protokube, nodeup, the join server.
    Own,
    Addon(AddonPermissions),
}

const OWN: For = For::Own;
const CCM: For = For::Addon(AddonPermissions::CloudControllerManager);
const EBS: For = For::Addon(AddonPermissions::EbsCsiDriver);
const CA: For = For::Addon(AddonPermissions::ClusterAutoscaler);

/// Whose policy is being written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Holder {
    /// The control planes' instance role: their own agents' statements and those of every addon
    /// not on a role of its own.
    ControlPlane,
    /// An addon's own role: its statements only.
    Addon(AddonPermissions),
}

impl Holder {
    fn wants(self, p: &PolicyInputs, owners: &[For]) -> bool {
        owners.iter().any(|o| match (self, o) {
            (Holder::ControlPlane, For::Own) => true,
            (Holder::ControlPlane, For::Addon(a)) => !p.addon_roles.contains(a),
            (Holder::Addon(h), For::Addon(a)) => h == *a,
            (Holder::Addon(_), For::Own) => false,
        })
    }

    /// The actions of `list` this holder gets.
    fn actions<'a>(self, p: &PolicyInputs, list: &[(&'a str, &[For])]) -> Vec<&'a str> {
        list.iter().filter(|(_, owners)| self.wants(p, owners)).map(|(a, _)| *a).collect()
    }
}

/// Push a statement of `actions` unless none is left.
fn push(out: &mut Vec<Value>, actions: &[&str], resources: Value, condition: Option<Value>) {
    if !actions.is_empty() {
        out.push(statement(actions, resources, condition));
    }
}

pub(super) fn control_plane(p: &PolicyInputs, zone_id: Option<&str>, holder: Holder) -> Vec<Value> {
    let c = &p.cluster;
    let part = &p.partition;
    let cluster_tag = json!({"StringEquals": {"aws:ResourceTag/KubernetesCluster": c}});
    let request_tag = json!({"StringEquals": {"aws:RequestTag/KubernetesCluster": c}});
    let own = holder == Holder::ControlPlane;
    let mut out = Vec::new();
    if own {
        out.push(statement(
            &["ec2:AttachVolume"],
            json!(["*"]),
            Some(json!({"StringEquals": {"aws:ResourceTag/KubernetesCluster": c, "aws:ResourceTag/k8s.io/role/master": "1"}})),
        ));
        out.extend(state_store_statements(p, true));
    }
    if let Some((bucket, key)) = p.state_store.as_ref().filter(|_| own) {
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
    let external_dns = p.external_dns && holder.wants(p, &[For::Addon(AddonPermissions::ExternalDns)]);
    if let Some((zone, find)) = records.filter(|_| own || external_dns) {
        let mut on_zone = vec!["route53:ListResourceRecordSets"];
        if find == "route53:GetHostedZone" && own {
            on_zone.push(find);
        }
        out.push(statement(&on_zone, json!([zone]), None));
        // Writes only to the names protokube keeps; external-dns (with the same role) writes
        // whatever its Services and Ingresses name, in the same zone.
        let names = (!external_dns).then(
            || json!({"ForAllValues:StringLike": {"route53:ChangeResourceRecordSetsNormalizedRecordNames": keelson_api::names::protokube_record_patterns(c)}}),
        );
        out.push(statement(&["route53:ChangeResourceRecordSets"], json!([zone]), names));
        if find == "route53:ListHostedZonesByName" && own {
            // The action supports no resource but `*`.
            out.push(statement(&[find], json!(["*"]), None));
            by_name = true;
        }
        if external_dns {
            // external-dns's AWS provider lists the zones and their tags to pick the ones it owns.
            out.push(statement(&["route53:ListHostedZones", "route53:ListTagsForResource"], json!(["*"]), None));
        }
    }
    if !p.cert_manager_zones.is_empty() && holder.wants(p, &[For::Addon(AddonPermissions::CertManager)]) {
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
    if holder.wants(p, &[EBS]) {
        out.push(statement(&["ec2:CreateTags"], volumes.clone(), Some(tag_on_create(&["CopyVolumes", "CreateVolume"]))));
    }
    // protokube tags its etcd volumes (formatted, started); the EBS CSI driver its volumes.
    if holder.wants(p, &[OWN, EBS]) {
        out.push(statement(&["ec2:CreateTags", "ec2:DeleteTags"], volumes, Some(retag.clone())));
    }
    if holder.wants(p, &[CCM]) {
        out.push(statement(&["ec2:CreateTags"], groups.clone(), Some(tag_on_create(&["CreateSecurityGroup"]))));
        out.push(statement(&["ec2:CreateTags", "ec2:DeleteTags"], groups, Some(retag)));
    }
    // Encrypted volumes: protokube attaches the etcd volumes, the EBS CSI driver its own.
    if holder.wants(p, &[OWN, EBS]) {
        out.extend(kms_statements(p));
    }
    let mut describe = holder.actions(
        p,
        &[
            ("autoscaling:DescribeAutoScalingGroups", &[CCM, CA]),
            ("autoscaling:DescribeAutoScalingInstances", &[CA]),
            ("autoscaling:DescribeLaunchConfigurations", &[CA]),
            ("autoscaling:DescribeScalingActivities", &[CA]),
            ("autoscaling:DescribeTags", &[CCM]),
            ("ec2:DescribeAvailabilityZones", &[CCM, EBS]),
            ("ec2:DescribeImages", &[CA]),
            ("ec2:DescribeInstanceTopology", &[CCM]),
            ("ec2:DescribeInstanceTypes", &[CA, EBS]),
            // protokube's etcd volumes and the join server's check of a joining instance.
            ("ec2:DescribeInstances", &[OWN, CCM, EBS]),
            ("ec2:DescribeLaunchTemplateVersions", &[CA]),
            ("ec2:DescribeRegions", &[CCM]),
            ("ec2:DescribeRouteTables", &[CCM]),
            ("ec2:DescribeSecurityGroups", &[CCM]),
            ("ec2:DescribeSubnets", &[CCM]),
            ("ec2:DescribeTags", &[EBS]),
            ("ec2:DescribeVolumeStatus", &[EBS]),
            ("ec2:DescribeVolumes", &[OWN, EBS]),
            ("ec2:DescribeVolumesModifications", &[EBS]),
            ("ec2:DescribeVpcs", &[CCM]),
            ("ec2:GetInstanceTypesFromInstanceRequirements", &[CA]),
            ("elasticloadbalancing:DescribeListeners", &[CCM]),
            ("elasticloadbalancing:DescribeLoadBalancerAttributes", &[CCM]),
            ("elasticloadbalancing:DescribeLoadBalancerPolicies", &[CCM]),
            ("elasticloadbalancing:DescribeLoadBalancers", &[CCM]),
            ("elasticloadbalancing:DescribeTargetGroupAttributes", &[CCM]),
            // protokube takes its API server out of the load balancer's target group and back.
            ("elasticloadbalancing:DescribeTargetGroups", &[OWN, CCM]),
            ("elasticloadbalancing:DescribeTargetHealth", &[OWN, CCM]),
            ("kms:DescribeKey", &[CCM]),
        ],
    );
    if p.allow_container_registry && own {
        describe.extend_from_slice(ECR_READ);
    }
    push(&mut out, &describe, json!("*"), None);
    if holder.wants(p, &[CCM]) {
        out.push(statement(&["iam:CreateServiceLinkedRole"], json!("*"), Some(json!({"StringEquals": {"iam:AWSServiceName": SERVICE_LINKED_ROLE_SERVICES}}))));
    }
    // The join server reads the instance profile a worker claims (to learn a custom profile's
    // role); workers joining with the static token never ask it.
    if own && !p.bootstrap_token && !p.node_instance_profiles.is_empty() {
        out.push(statement(&["iam:GetInstanceProfile"], json!(p.node_instance_profiles), None));
    }
    let mut tagged: Vec<(&str, &[For])> = vec![
        ("autoscaling:SetDesiredCapacity", &[CA]),
        ("autoscaling:TerminateInstanceInAutoScalingGroup", &[CA]),
        ("ec2:AttachVolume", &[EBS]),
        ("ec2:AuthorizeSecurityGroupIngress", &[CCM]),
        ("ec2:DeleteSecurityGroup", &[CCM]),
        ("ec2:DeleteVolume", &[EBS]),
        // protokube frees an etcd volume still attached to a terminated control plane.
        ("ec2:DetachVolume", &[OWN, EBS]),
        ("ec2:ModifyInstanceAttribute", &[CCM]),
        ("ec2:ModifyVolume", &[EBS]),
        ("ec2:RevokeSecurityGroupIngress", &[CCM]),
        ("elasticloadbalancing:AddTags", &[CCM]),
        ("elasticloadbalancing:ApplySecurityGroupsToLoadBalancer", &[CCM]),
        ("elasticloadbalancing:AttachLoadBalancerToSubnets", &[CCM]),
        ("elasticloadbalancing:ConfigureHealthCheck", &[CCM]),
        ("elasticloadbalancing:CreateLoadBalancerListeners", &[CCM]),
        ("elasticloadbalancing:CreateLoadBalancerPolicy", &[CCM]),
        ("elasticloadbalancing:DeleteListener", &[CCM]),
        ("elasticloadbalancing:DeleteLoadBalancer", &[CCM]),
        ("elasticloadbalancing:DeleteLoadBalancerListeners", &[CCM]),
        ("elasticloadbalancing:DeleteTargetGroup", &[CCM]),
        ("elasticloadbalancing:DeregisterInstancesFromLoadBalancer", &[CCM]),
        // protokube takes its API server out of the target group before a restart.
        ("elasticloadbalancing:DeregisterTargets", &[OWN, CCM]),
        ("elasticloadbalancing:DetachLoadBalancerFromSubnets", &[CCM]),
        ("elasticloadbalancing:ModifyListener", &[CCM]),
        ("elasticloadbalancing:ModifyLoadBalancerAttributes", &[CCM]),
        ("elasticloadbalancing:ModifyTargetGroup", &[CCM]),
        ("elasticloadbalancing:ModifyTargetGroupAttributes", &[CCM]),
        ("elasticloadbalancing:RegisterInstancesWithLoadBalancer", &[CCM]),
        ("elasticloadbalancing:RegisterTargets", &[OWN, CCM]),
        ("elasticloadbalancing:SetLoadBalancerPoliciesForBackendServer", &[CCM]),
        ("elasticloadbalancing:SetLoadBalancerPoliciesOfListener", &[CCM]),
    ];
    if p.kubenet {
        tagged.extend_from_slice(&[("ec2:CreateRoute", &[CCM]), ("ec2:DeleteRoute", &[CCM])]);
    }
    push(&mut out, &holder.actions(p, &tagged), json!("*"), Some(cluster_tag));
    let create: &[(&str, &[For])] = &[
        ("ec2:CopyVolumes", &[EBS]),
        ("ec2:CreateSecurityGroup", &[CCM]),
        ("ec2:CreateVolume", &[EBS]),
        ("elasticloadbalancing:CreateListener", &[CCM]),
        ("elasticloadbalancing:CreateLoadBalancer", &[CCM]),
        ("elasticloadbalancing:CreateTargetGroup", &[CCM]),
    ];
    push(&mut out, &holder.actions(p, create), json!("*"), Some(request_tag));
    if holder.wants(p, &[CCM]) {
        out.push(statement(&["ec2:CreateSecurityGroup"], json!([format!("arn:{part}:ec2:*:*:vpc/*")]), None));
    }
    out
}
