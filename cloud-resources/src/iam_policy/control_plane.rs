//! Control planes: etcd volumes, the state store and backup stores, Route53, and what the AWS
//! cloud-controller-manager and the EBS CSI driver need (kOps' statement list).

use serde_json::{json, Value};

use super::{kms_statements, state_store_statements, statement, DnsZone, PolicyInputs, ECR_READ, SERVICE_LINKED_ROLE_SERVICES};

pub(super) fn control_plane(p: &PolicyInputs, zone_id: Option<&str>) -> Vec<Value> {
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
