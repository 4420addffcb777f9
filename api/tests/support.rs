//! Every field is consumed or refused: the classification table (`keelson_api::support`) against
//! the generated types themselves. The field list is read from `api/src/generated.rs`, which
//! `tools/gen_api_types.py` writes in one regular shape (`#[serde(rename = "key", …)]` over
//! `pub field: Option<Type>,`), so a field the generator adds is seen here without any list to
//! keep by hand.

use std::collections::{BTreeMap, BTreeSet};

use keelson_api::support::{self, Use, COVERED_ROOTS, PLACES};
use keelson_api::{parse_documents, validate};

const GENERATED: &str = include_str!("../src/generated.rs");

/// struct name → [(json key, the generated type named in the field's type, if any)].
fn generated_structs() -> BTreeMap<String, Vec<(String, Option<String>)>> {
    let mut structs: BTreeMap<String, Vec<(String, Option<String>)>> = BTreeMap::new();
    let mut current: Option<String> = None;
    let mut key: Option<String> = None;
    for line in GENERATED.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("pub struct ") {
            let name = rest.trim_end_matches(" {").trim().to_string();
            structs.entry(name.clone()).or_default();
            current = Some(name);
        } else if t == "}" {
            current = None;
        } else if let Some(rest) = t.strip_prefix("#[serde(rename = \"") {
            key = rest.split('"').next().map(str::to_string);
        } else if let (Some(s), Some(k), Some(rest)) = (&current, &key, t.strip_prefix("pub ")) {
            let ty = rest.split_once(':').map(|(_, ty)| ty.trim().trim_end_matches(',')).unwrap_or_default();
            structs.get_mut(s).expect("struct").push((k.clone(), Some(ty.to_string())));
            key = None;
        }
    }
    // Keep only type names that are generated structs (the innermost identifier of the type).
    let names: BTreeSet<String> = structs.keys().cloned().collect();
    for fields in structs.values_mut() {
        for (_, ty) in fields.iter_mut() {
            let inner = ty.as_deref().map(|t| t.split(|c: char| !(c.is_alphanumeric() || c == '_')).rfind(|w| names.contains(*w)).map(str::to_string));
            *ty = inner.flatten();
        }
    }
    structs
}

/// Leaves under `ty` (path from `path`) that the table does not classify. A classified field
/// ends the walk (its use covers its sub-fields); an unclassified struct is walked into.
fn unclassified(structs: &BTreeMap<String, Vec<(String, Option<String>)>>, ty: &str, path: &str, seen: &mut BTreeSet<String>, out: &mut Vec<String>) {
    if !seen.insert(ty.to_string()) {
        return;
    }
    let Some(fields) = structs.get(ty) else {
        out.push(format!("{path}: type {ty} is not in generated.rs"));
        return;
    };
    for (key, inner) in fields {
        let p = format!("{path}.{key}");
        if support::classify(ty, key).is_some() {
            continue;
        }
        match inner {
            Some(inner) => unclassified(structs, inner, &p, seen, out),
            None => out.push(format!("{p} ({ty}.{key})")),
        }
    }
    seen.remove(ty);
}

#[test]
fn every_field_of_the_spec_is_consumed_or_refused() {
    let structs = generated_structs();
    assert!(structs.get("KubeletConfigSpec").is_some_and(|f| f.len() > 90), "the generated.rs reader found KubeletConfigSpec's fields");
    assert_eq!(COVERED_ROOTS, ["ClusterSpec", "InstanceGroupSpec"], "the whole Cluster and InstanceGroup specs");
    let mut missing = Vec::new();
    for root in COVERED_ROOTS {
        unclassified(&structs, root, root, &mut BTreeSet::new(), &mut missing);
    }
    missing.sort();
    missing.dedup();
    assert!(missing.is_empty(), "fields neither consumed nor refused ({}):\n{}", missing.len(), missing.join("\n"));
}

/// Every place the walk reaches a type through unclassified fields: (document kind, json path from
/// the spec, type).
fn places(structs: &BTreeMap<String, Vec<(String, Option<String>)>>, ty: &str, path: &str, seen: &mut BTreeSet<String>, out: &mut Vec<(String, String)>) {
    if !seen.insert(ty.to_string()) {
        return;
    }
    out.push((path.to_string(), ty.to_string()));
    for (key, inner) in &structs[ty] {
        if let (None, Some(inner)) = (support::classify(ty, key), inner) {
            let p = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
            places(structs, inner, &p, seen, out);
        }
    }
    seen.remove(ty);
}

/// `support::refusals` finds a type's fields where `PLACES` says the type sits: every place a type
/// with a refusal can sit is listed.
#[test]
fn every_type_with_a_refusal_is_found_wherever_the_spec_holds_it() {
    let structs = generated_structs();
    let refusing: BTreeSet<&str> = support::all()
        .filter(|f| matches!(f.used, Use::Refused(_) | Use::NotRendered { .. } | Use::DroppedByKops(_)))
        .map(|f| f.ty)
        .chain(support::VERSION_BOUND.iter().map(|(ty, _, _, _)| *ty))
        .collect();
    let mut missing = Vec::new();
    let mut all_found = BTreeSet::new();
    for (kind, root) in [("Cluster", "ClusterSpec"), ("InstanceGroup", "InstanceGroupSpec")] {
        let mut found = Vec::new();
        places(&structs, root, "", &mut BTreeSet::new(), &mut found);
        for (path, ty) in &found {
            if refusing.contains(ty.as_str()) && !PLACES.contains(&(kind, path.as_str(), ty.as_str())) {
                missing.push(format!("(\"{kind}\", \"{path}\", \"{ty}\")"));
            }
            all_found.insert((kind.to_string(), path.clone(), ty.clone()));
        }
    }
    assert!(missing.is_empty(), "places of types with refusals missing from support::PLACES:\n{}", missing.join("\n"));
    for (kind, path, ty) in PLACES {
        assert!(all_found.contains(&(kind.to_string(), path.to_string(), ty.to_string())), "PLACES: {kind} {path:?} {ty}: not a place the walk reaches");
        assert!(refusing.contains(ty), "PLACES: {ty} has no refusal: its place is not needed");
    }
}

/// A classified field is either a table's or a control-plane flag from kOps' tags; none is both
/// unless the table refuses it (a flag the components no longer have).
#[test]
fn table_entries_of_flag_tagged_fields_only_refuse_or_render_elsewhere() {
    for (ty, _, table) in support::FLAG_TABLES {
        for spec in table.iter() {
            let Some(f) = support::all().find(|f| f.ty == *ty && f.key == spec.key) else { continue };
            assert!(matches!(f.used, Use::Refused(_)), "{ty}.{}: a flag (--{}) and a table entry {:?}", spec.key, spec.flag, f.used);
        }
    }
}

#[test]
fn every_table_entry_is_a_generated_field_once() {
    let structs = generated_structs();
    let mut seen = BTreeSet::new();
    for f in support::all() {
        assert!(structs.get(f.ty).is_some_and(|fs| fs.iter().any(|(k, _)| k == f.key)), "{}.{} is not a generated field", f.ty, f.key);
        assert!(seen.insert((f.ty, f.key)), "{}.{} is classified twice", f.ty, f.key);
    }
}

const CLUSTER: &str = "apiVersion: kops.k8s.io/v1alpha2
kind: Cluster
metadata:
  name: t.example.com
spec:
  cloudProvider: aws
  kubernetesVersion: 1.34.2
  networkCIDR: 10.0.0.0/16
  subnets:
  - {name: a, zone: eu-west-1a, cidr: 10.0.1.0/24, type: Public}
";

fn spec_with(extra: &str) -> keelson_api::Documents {
    let text = format!("{CLUSTER}{extra}");
    parse_documents(text.as_bytes()).unwrap_or_else(|e| panic!("parse {extra}: {e:?}"))
}

/// The Rust type of the generated field `ty.key`, as written in generated.rs.
fn field_type(ty: &str, key: &str) -> Option<String> {
    let body = GENERATED.split(&format!("pub struct {ty} {{")).nth(1)?.split("\n}").next()?;
    let after = body.split(&format!("rename = \"{key}\"")).nth(1)?;
    let line = after.lines().find(|l| l.trim().starts_with("pub "))?;
    Some(line.split_once(':')?.1.trim().trim_end_matches(',').to_string())
}

/// A value of the field's type (YAML): enough for the field to be set.
fn sample(ty: &str, key: &str) -> Option<String> {
    Some(match field_type(ty, key)?.as_str() {
        t if t.contains("bool") => "true".into(),
        t if t.contains("i64") => "1".into(),
        t if t.contains("Duration") => "1m0s".into(),
        t if t.contains("Cidr") => "10.9.0.0/16".into(),
        t if t.contains("Vec<") => "[x]".into(),
        _ => "x".into(),
    })
}

#[test]
fn every_refused_kubelet_field_is_refused_by_validation_with_its_path() {
    for f in support::KUBELET {
        let Use::Refused(reason) = f.used else { continue };
        let value = sample(f.ty, f.key).expect("field type");
        let docs = spec_with(&format!("  kubelet:\n    {}: {value}\n", f.key));
        let errors = validate(&docs);
        let path = format!("spec.kubelet.{}", f.key);
        assert!(errors.iter().any(|e| e.path == path && e.message == reason), "{path}: not refused: {errors:?}");
    }
    // The version-bound one: a flag before 1.34, refused from 1.34 on.
    let docs = spec_with("  kubelet:\n    registerSchedulable: false\n");
    assert!(validate(&docs).iter().any(|e| e.path == "spec.kubelet.registerSchedulable"));
    let older = parse_documents(format!("{CLUSTER}  kubelet:\n    registerSchedulable: false\n").replace("1.34.2", "1.33.5").as_bytes()).expect("parse");
    assert!(!validate(&older).iter().any(|e| e.path == "spec.kubelet.registerSchedulable"));
}

#[test]
fn unrendered_networking_and_addons_are_refused_with_their_path_and_only_when_on() {
    let cases = [
        ("  networking:\n    canal: {}\n", "spec.networking.canal", true),
        ("  networking:\n    flannel:\n      backend: vxlan\n", "spec.networking.flannel", false),
        ("  networking:\n    amazonvpc: {}\n", "spec.networking.amazonvpc", true),
        ("  networking:\n    calico: {}\n", "spec.networking.calico", false),
        ("  networking:\n    cni: {}\n", "spec.networking.cni", false),
        // The cluster-autoscaler renders (kOps' addon), every field of it.
        ("  clusterAutoscaler:\n    enabled: true\n", "spec.clusterAutoscaler", false),
        (
            "  clusterAutoscaler:\n    enabled: true\n    expander: priority\n    customPriorityExpanderConfig:\n      \"10\": [\".*\"]\n",
            "spec.clusterAutoscaler.customPriorityExpanderConfig",
            false,
        ),
        ("  clusterAutoscaler:\n    enabled: false\n", "spec.clusterAutoscaler", false),
        ("  nodeTerminationHandler:\n    enableSQSTerminationDraining: false\n", "spec.nodeTerminationHandler", true),
        ("  nodeTerminationHandler:\n    enabled: false\n", "spec.nodeTerminationHandler", false),
        // metrics-server renders (insecure, as kOps' template does unless `insecure: false`) ...
        ("  metricsServer:\n    enabled: true\n    insecure: true\n", "spec.metricsServer", false),
        ("  metricsServer:\n    enabled: true\n    insecure: true\n", "spec.metricsServer.insecure", false),
        // ... but not its secure form, which needs cert-manager (kOps' validation requires it on).
        ("  certManager:\n    enabled: true\n  metricsServer:\n    enabled: true\n    insecure: false\n", "spec.metricsServer.insecure", true),
        ("  certManager:\n    enabled: true\n  metricsServer:\n    enabled: true\n", "spec.metricsServer.insecure", false),
        // node-local-dns renders (spec-compiler/src/addons/node_local_dns.rs).
        ("  kubeDNS:\n    nodeLocalDNS:\n      enabled: true\n", "spec.kubeDNS.nodeLocalDNS", false),
        ("  kubeDNS:\n    provider: CoreDNS\n", "spec.kubeDNS.nodeLocalDNS", false),
        ("  nodeProblemDetector:\n    enabled: true\n", "spec.nodeProblemDetector", false),
        ("  snapshotController:\n    enabled: true\n", "spec.snapshotController", false),
        // external-dns renders; dns-controller's own settings are refused, external-dns takes them.
        ("  externalDns:\n    provider: external-dns\n", "spec.externalDns.provider", false),
        ("  externalDns:\n    provider: dns-controller\n", "spec.externalDns.provider", false),
        ("  externalDns:\n    watchIngress: true\n", "spec.externalDns.watchIngress", true),
        ("  externalDns:\n    provider: dns-controller\n    watchNamespace: web\n", "spec.externalDns.watchNamespace", true),
        ("  externalDns:\n    provider: external-dns\n    watchIngress: true\n    watchNamespace: web\n", "spec.externalDns.watchIngress", false),
        ("  externalDns:\n    provider: external-dns\n    priorityClassName: high\n", "spec.externalDns.priorityClassName", false),
        ("  serviceAccountIssuerDiscovery:\n    enableAWSOIDCProvider: true\n", "spec.serviceAccountIssuerDiscovery.enableAWSOIDCProvider", false),
        ("  karpenter:\n    enabled: true\n", "spec.karpenter", true),
        ("  certManager:\n    enabled: true\n", "spec.certManager", false),
        ("  warmPool:\n    minSize: 1\n", "spec.warmPool", true),
        ("  kubeDNS:\n    provider: KubeDNS\n", "spec.kubeDNS.provider", true),
        ("  kubeDNS:\n    replicas: 3\n", "spec.kubeDNS.replicas", true),
        ("  kubeDNS:\n    serverIP: 100.64.0.10\n", "spec.kubeDNS.serverIP", false),
        ("  serviceAccountIssuerDiscovery:\n    additionalAudiences: [sts.amazonaws.com]\n", "spec.serviceAccountIssuerDiscovery.additionalAudiences", false),
    ];
    for (extra, path, refused) in cases {
        let docs = spec_with(extra);
        assert!(validate(&docs).is_empty(), "{path}: compile accepts it (kOps' output): {:?}", validate(&docs));
        let errors = support::not_rendered(&docs);
        let hit = errors.iter().find(|e| e.path == path);
        assert_eq!(hit.is_some(), refused, "{path}: {errors:?}");
        if let Some(e) = hit {
            assert!(e.message.contains("Keelson") || e.message.contains("unused"), "{e}");
            assert_eq!(e.document, "Cluster/t.example.com");
        }
    }
    let canal = support::not_rendered(&spec_with("  networking:\n    canal: {}\n"));
    assert!(canal[0].to_string().contains("supported: calico, cilium, flannel, kubenet"), "{}", canal[0]);
    // flannel renders with vxlan; udp, which kOps also accepts, is not rendered; the unused
    // disableTxChecksumOffloading is refused; iptablesResyncSeconds is consumed.
    let flannel = |body: &str| support::not_rendered(&spec_with(&format!("  networking:\n    flannel:\n{body}")));
    assert!(flannel("      backend: vxlan\n      iptablesResyncSeconds: 9\n").is_empty());
    let udp = flannel("      backend: udp\n");
    assert_eq!(udp.iter().map(|e| e.path.as_str()).collect::<Vec<_>>(), ["spec.networking.flannel.backend"], "{udp:?}");
    let unused = flannel("      backend: vxlan\n      disableTxChecksumOffloading: true\n");
    assert_eq!(unused.iter().map(|e| e.path.as_str()).collect::<Vec<_>>(), ["spec.networking.flannel.disableTxChecksumOffloading"], "{unused:?}");
}

#[test]
fn refusals_name_nested_paths_and_gone_component_flags() {
    // A refusal deep in a list names the item.
    let docs = spec_with(
        "  etcdClusters:\n  - name: main\n    etcdMembers:\n    - {name: a, instanceGroup: cp}\n    manager:\n      image: x\n      backupRetentionDays: 7\n",
    );
    let nr = support::not_rendered(&docs);
    assert!(nr.iter().any(|e| e.path == "spec.etcdClusters[main].manager.image"), "{nr:?}");
    assert!(!nr.iter().any(|e| e.path.ends_with("backupRetentionDays")), "protokube keeps backups: {nr:?}");
    assert!(!validate(&docs).iter().any(|e| e.path.contains("manager")), "compile accepts it: {:?}", validate(&docs));

    // A flag kube-apiserver no longer has: refused by every command.
    let docs = spec_with("  kubeAPIServer:\n    insecurePort: 8080\n");
    assert!(validate(&docs).iter().any(|e| e.path == "spec.kubeAPIServer.insecurePort"), "{:?}", validate(&docs));
    // A flag it has: consumed.
    let docs = spec_with("  kubeAPIServer:\n    auditWebhookBatchThrottleQps: 5\n");
    assert!(validate(&docs).is_empty() && support::not_rendered(&docs).is_empty());
    assert!(matches!(support::classify("KubeAPIServerConfig", "auditWebhookBatchThrottleQps"), Some(Use::ComponentFlag { component: "kube-apiserver", .. })));

    // --cloud-provider: kube-apiserver's up to 1.32, gone from 1.33.
    let gone = spec_with("  kubeAPIServer:\n    cloudProvider: external\n");
    assert!(validate(&gone).iter().any(|e| e.path == "spec.kubeAPIServer.cloudProvider"));
    let older = parse_documents(format!("{CLUSTER}  kubeAPIServer:\n    cloudProvider: external\n").replace("1.34.2", "1.32.0").as_bytes()).expect("parse");
    assert!(validate(&older).is_empty(), "{:?}", validate(&older));

    // An instance group's field.
    let text = format!(
        "{CLUSTER}---\napiVersion: kops.k8s.io/v1alpha2\nkind: InstanceGroup\nmetadata:\n  name: nodes\nspec:\n  role: Node\n  subnets: [a]\n  rootVolume:\n    size: 30\n  tenancy: default\n"
    );
    let docs = parse_documents(text.as_bytes()).expect("parse");
    let nr = support::not_rendered(&docs);
    // The rootVolume block is a key kOps' v1alpha2 drops: a warning with its path, not a refusal.
    assert!(!nr.iter().any(|e| e.path == "spec.rootVolume"), "{nr:?}");
    let dropped = support::dropped(&docs);
    assert!(dropped.iter().any(|e| e.path == "spec.rootVolume" && e.document == "InstanceGroup/nodes"), "{dropped:?}");
    assert!(!nr.iter().any(|e| e.path == "spec.tenancy"), "default tenancy is what Keelson does: {nr:?}");
    let text = text.replace("  subnets: [a]\n", "  subnets: [a]\n  volumes:\n  - device: /dev/xvdd\n    size: 20\n");
    let nr = support::not_rendered(&parse_documents(text.as_bytes()).expect("parse"));
    assert!(nr.iter().any(|e| e.path == "spec.volumes" && e.document == "InstanceGroup/nodes"), "{nr:?}");
}

#[test]
fn metrics_server_values_are_validated_with_their_paths() {
    // kOps' rule: an enabled metrics-server that is not `insecure: true` needs cert-manager.
    let errors = validate(&spec_with("  metricsServer:\n    enabled: true\n"));
    let e = errors.iter().find(|e| e.path == "spec.metricsServer.insecure").unwrap_or_else(|| panic!("{errors:?}"));
    assert_eq!(e.document, "Cluster/t.example.com");
    assert!(e.message.contains("cert-manager"), "{e}");
    // A bad image is named with its path, on or off.
    let errors = validate(&spec_with("  metricsServer:\n    image: \"ms:v 1\"\n"));
    assert_eq!(errors.iter().map(|e| e.path.as_str()).collect::<Vec<_>>(), ["spec.metricsServer.image"], "{errors:?}");
    // The local cloud's form is valid, consumed and not refused.
    let docs = spec_with("  metricsServer:\n    enabled: true\n    insecure: true\n    image: 172.20.255.254:5000/metrics-server-metrics-server:v0.8.0\n");
    assert!(validate(&docs).is_empty() && support::not_rendered(&docs).is_empty(), "{:?}", validate(&docs));
}

#[test]
fn cluster_autoscaler_values_are_validated_with_their_paths() {
    let errors = validate(&spec_with("  clusterAutoscaler:\n    enabled: true\n    expander: price\n    scaleDownUnneededTime: soon\n"));
    let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["spec.clusterAutoscaler.expander", "spec.clusterAutoscaler.scaleDownUnneededTime"], "{errors:?}");
    assert!(errors.iter().all(|e| e.document == "Cluster/t.example.com"));
    assert!(errors[0].message.contains("only supported on GCE"), "{}", errors[0]);
    // The e2e test's form is valid, consumed and not refused.
    let docs = spec_with("  clusterAutoscaler:\n    enabled: true\n    scaleDownUnneededTime: 1m0s\n    scaleDownDelayAfterAdd: 1m0s\n");
    assert!(validate(&docs).is_empty() && support::not_rendered(&docs).is_empty(), "{:?}", validate(&docs));
}

#[test]
fn external_dns_needs_a_hosted_zone() {
    let extra = "  externalDns:\n    provider: external-dns\n";
    assert!(validate(&spec_with(extra)).is_empty());
    let text = format!("{CLUSTER}{extra}").replace("name: t.example.com", "name: t.k8s.local");
    let docs = parse_documents(text.as_bytes()).expect("parse");
    let errors = validate(&docs);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].path, "spec.externalDns.provider");
    assert!(errors[0].message.contains("gossip"), "{}", errors[0].message);
}

#[test]
fn a_cloud_keelson_does_not_build_on_is_refused_by_the_rule_apply_uses() {
    for cloud in keelson_api::CloudProvider::ALL {
        let docs = parse_documents(CLUSTER.replace("cloudProvider: aws", &format!("cloudProvider: {cloud}")).as_bytes()).expect("parse");
        let errors = support::not_rendered(&docs);
        let hit = errors.iter().find(|e| e.path == "spec.cloudProvider");
        assert_eq!(hit.is_none(), cloud.served(), "{cloud}: {errors:?}");
        if let Some(e) = hit {
            assert!(e.message.contains("aws and gce only"), "{e}");
        }
    }
}

#[test]
fn ssh_key_root_volume_key_and_external_load_balancers_are_consumed() {
    let group = "---\napiVersion: kops.k8s.io/v1alpha2\nkind: InstanceGroup\nmetadata:\n  name: nodes\nspec:\n  role: Node\n  subnets: [a]\n  rootVolumeEncryption: true\n  rootVolumeEncryptionKey: arn:aws:kms:eu-west-1:123456789012:key/1234\n  externalLoadBalancers:\n  - loadBalancerName: my-elb\n  - targetGroupArn: arn:aws:elasticloadbalancing:eu-west-1:123456789012:targetgroup/tg/1\n";
    for key in ["\"\"", "my-key"] {
        let docs = spec_with(&format!("  sshKeyName: {key}\n{group}"));
        assert_eq!(validate(&docs), Vec::new(), "{key}");
        assert_eq!(support::not_rendered(&docs), Vec::new(), "{key}");
    }
}

#[test]
fn master_internal_name_is_accepted_only_as_the_name_keelson_uses() {
    let refused =
        |name: &str| support::not_rendered(&spec_with(&format!("  masterInternalName: {name}\n"))).into_iter().any(|e| e.path == "spec.masterInternalName");
    assert!(!refused("api.internal.t.example.com"));
    assert!(refused("api.inside.t.example.com"));
}

/// A GCE cluster whose name (dots as dashes) is longer than a label value validates: its cluster
/// label is cut with a hash (`names::gce_safe_cluster_name`), so nothing is refused for it.
#[test]
fn a_gce_cluster_name_too_long_for_a_label_validates() {
    let long = "minimal-gce-with-a-very-very-very-very-very-long-name.example.com";
    let text =
        format!("apiVersion: kops.k8s.io/v1alpha2\nkind: Cluster\nmetadata:\n  name: {long}\nspec:\n  cloudProvider: gce\n  kubernetesVersion: 1.34.4\n");
    let gce = parse_documents(text.as_bytes()).expect("parse");
    assert!(support::not_rendered(&gce).is_empty(), "{:?}", support::not_rendered(&gce));
}
