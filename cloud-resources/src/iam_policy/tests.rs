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
        addon_roles: Vec::new(),
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
    assert_eq!(write["Action"], json!(["s3:AbortMultipartUpload", "s3:DeleteObject", "s3:GetObject", "s3:PutObject"]), "a failed multipart upload is aborted");
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
    for denied in [None, Some(""), Some("c.example.com/"), Some("c.example.com/secrets/"), Some("c.example.com/pki/private/"), Some("c.example.com/igconfig/")]
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

/// Every (action, resource, condition) a statement grants.
fn grants(doc: &Value) -> std::collections::BTreeSet<(String, String, String)> {
    let mut out = std::collections::BTreeSet::new();
    for s in statements(doc) {
        let actions: Vec<String> = match &s["Action"] {
            Value::String(a) => vec![a.clone()],
            v => v.as_array().expect("actions").iter().map(|a| a.as_str().expect("action").to_string()).collect(),
        };
        for a in actions {
            out.insert((a, s["Resource"].to_string(), s.get("Condition").map(Value::to_string).unwrap_or_default()));
        }
    }
    out
}

/// `useServiceAccountExternalPermissions`: each addon's statements move to its own role; together
/// the control plane's and the addons' policies grant exactly what the control plane alone granted
/// before (nothing lost, nothing new), except that protokube's record writes stay scoped to its
/// names once external-dns has a role of its own; the control plane keeps only its own agents'.
#[test]
fn addons_on_their_own_roles_take_exactly_their_statements() {
    use keelson_api::addon_roles::AddonPermissions;
    let mut p = inputs();
    p.cert_manager_zones = vec!["Z9".into()];
    p.kubenet = true;
    let alone = grants(&policy(&role(Role::ControlPlane), &p, None).expect("policy"));
    p.addon_roles = AddonPermissions::ALL.to_vec();
    let cp = policy(&role(Role::ControlPlane), &p, None).expect("policy");
    let mut split = grants(&cp);
    for a in AddonPermissions::ALL {
        let Some(doc) = addon_policy(a, &p, None) else {
            assert_eq!(a, AddonPermissions::ExternalDns, "only external-dns, not rendered here, has no statements");
            continue;
        };
        split.extend(grants(&doc));
        assert!(granting(&doc, "s3:Get*").is_empty(), "{a:?} reads no state store");
        assert!(granting(&doc, "iam:GetInstanceProfile").is_empty(), "{a:?} is no join server");
    }
    assert_eq!(split, alone, "the split grants what the control plane granted alone");
    // What moved: none of the addons' own actions are left to the control plane.
    for gone in [
        "ec2:CreateSecurityGroup",
        "elasticloadbalancing:CreateLoadBalancer",
        "ec2:CreateRoute",
        "ec2:CreateVolume",
        "ec2:DeleteVolume",
        "autoscaling:SetDesiredCapacity",
        "ec2:DescribeSubnets",
        "iam:CreateServiceLinkedRole",
    ] {
        assert!(granting(&cp, gone).is_empty(), "{gone} left on the control plane");
    }
    // What stays: protokube's volumes, records and target group; the join server's reads.
    for kept in [
        "ec2:AttachVolume",
        "ec2:DetachVolume",
        "ec2:DescribeVolumes",
        "ec2:DescribeInstances",
        "ec2:CreateTags",
        "route53:ChangeResourceRecordSets",
        "elasticloadbalancing:RegisterTargets",
        "elasticloadbalancing:DeregisterTargets",
        "elasticloadbalancing:DescribeTargetHealth",
        "iam:GetInstanceProfile",
        "kms:CreateGrant",
    ] {
        assert!(!granting(&cp, kept).is_empty(), "{kept} missing from the control plane");
    }
    let ccm = addon_policy(AddonPermissions::CloudControllerManager, &p, None).expect("ccm");
    assert!(granting(&ccm, "ec2:AttachVolume").is_empty(), "the CCM attaches no volumes");
    assert!(!granting(&ccm, "ec2:CreateRoute").is_empty(), "kubenet's routes are the CCM's");
    let ca = addon_policy(AddonPermissions::ClusterAutoscaler, &p, None).expect("ca");
    assert_eq!(
        granting(&ca, "autoscaling:SetDesiredCapacity")[0]["Condition"],
        json!({"StringEquals": {"aws:ResourceTag/KubernetesCluster": "c.example.com"}}),
        "the cluster-autoscaler scales only the cluster's groups"
    );
    let cert = addon_policy(AddonPermissions::CertManager, &p, None).expect("cert-manager");
    assert!(granting(&cert, "ec2:DescribeInstances").is_empty());
    assert_eq!(granting(&cert, "route53:ChangeResourceRecordSets").len(), 1);
}

/// external-dns on its own role writes any record of the zone; protokube's writes on the control
/// plane are scoped to its names again.
#[test]
fn external_dns_on_its_own_role_takes_the_zone_and_protokube_keeps_its_names() {
    use keelson_api::addon_roles::AddonPermissions;
    let mut p = inputs();
    p.external_dns = true;
    let shared = policy(&role(Role::ControlPlane), &p, None).expect("policy");
    assert!(granting(&shared, "route53:ChangeResourceRecordSets")[0].get("Condition").is_none(), "external-dns shares the role: any name");
    p.addon_roles = vec![AddonPermissions::ExternalDns];
    let cp = policy(&role(Role::ControlPlane), &p, None).expect("policy");
    assert!(granting(&cp, "route53:ChangeResourceRecordSets")[0].get("Condition").is_some(), "protokube's names only");
    assert!(granting(&cp, "route53:ListHostedZones").is_empty());
    let dns = addon_policy(AddonPermissions::ExternalDns, &p, None).expect("external-dns");
    assert!(granting(&dns, "route53:ChangeResourceRecordSets")[0].get("Condition").is_none());
    assert!(!granting(&dns, "route53:ListTagsForResource").is_empty());
    assert!(granting(&dns, "route53:GetHostedZone").is_empty() && granting(&dns, "ec2:DescribeInstances").is_empty());
    p.external_dns = false;
    assert!(addon_policy(AddonPermissions::ExternalDns, &p, None).is_none(), "no external-dns, no statements");
}
