use std::collections::BTreeSet;

use super::*;
use crate::addons::tests::kind;

/// A spec file (with its extra YAML spliced under `spec:`) completed by our compiler, with its
/// instance groups and versions.
fn load(path: &str, edit: impl Fn(String) -> String) -> (Cluster, Vec<InstanceGroup>, Versions) {
    let text = edit(std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}")));
    let docs = keelson_api::parse_documents(text.as_bytes()).unwrap_or_else(|e| panic!("parse {path}: {e:?}"));
    let options = crate::CompileOptions::default();
    let completed = crate::complete::complete(&docs, &options).expect("complete");
    let versions = crate::complete::versions_for(&completed.spec, &options).expect("versions");
    (completed, docs.instance_groups.clone(), versions)
}

fn ha_with(extra: &str) -> (Cluster, Vec<InstanceGroup>, Versions) {
    let extra = extra.to_string();
    load(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/ha.yaml"), move |t| t.replacen("spec:\n", &format!("spec:\n{extra}"), 1))
}

fn case(name: &str) -> (Cluster, Vec<InstanceGroup>, Versions) {
    load(&format!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/conformance/cases/{}/input.yaml"), name), |t| t)
}

/// The base's provenance (source URL, tag, commit, sha256).
const SOURCE: &str = include_str!("cluster_autoscaler/SOURCE");

const ENABLED: &str = "  clusterAutoscaler:\n    enabled: true\n";

fn container(docs: &[Value]) -> &Value {
    &kind(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
}

fn command(docs: &[Value]) -> Vec<&str> {
    container(docs)["command"].as_array().expect("command").iter().filter_map(Value::as_str).collect()
}

/// (apiGroup, resource, resourceName or "", verb) granted by a role's rules.
fn grants(role: &Value) -> BTreeSet<(String, String, String, String)> {
    let mut out = BTreeSet::new();
    let strs = |v: &Value| v.as_array().map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect::<Vec<_>>()).unwrap_or_default();
    for r in role["rules"].as_array().expect("rules") {
        let names = strs(&r["resourceNames"]);
        let names = if names.is_empty() { vec![String::new()] } else { names };
        for g in strs(&r["apiGroups"]) {
            for res in strs(&r["resources"]) {
                for n in &names {
                    for v in strs(&r["verbs"]) {
                        out.insert((g.clone(), res.clone(), n.clone(), v));
                    }
                }
            }
        }
    }
    out
}

/// A role rule as (apiGroups, resources, resourceNames, verbs).
type Rule<'a> = (&'a [&'a str], &'a [&'a str], &'a [&'a str], &'a [&'a str]);

fn triples(rules: &[Rule]) -> BTreeSet<(String, String, String, String)> {
    let v = json!({"rules": rules.iter().map(|(g, r, n, v)| rule(g, r, n, v)).collect::<Vec<_>>()});
    grants(&v)
}

#[test]
fn the_base_file_is_the_recorded_upstream_file() {
    let sha = base::sha256_hex(BASE.as_bytes());
    assert!(SOURCE.contains(&format!("sha256:  {sha}")), "SOURCE does not record the file's sha256 {sha}:\n{SOURCE}");
    assert!(SOURCE.contains(&format!("tag:     {}", crate::versions::CLUSTER_AUTOSCALER_MANIFEST_RELEASE)), "{SOURCE}");
    let kinds: Vec<String> = base().expect("parse").iter().map(|d| d["kind"].as_str().unwrap_or_default().to_string()).collect();
    assert_eq!(kinds, ["ServiceAccount", "ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding", "Deployment"]);
}

#[test]
fn off_unless_enabled_on_aws_or_gce() {
    let (cluster, groups, versions) = ha_with("");
    assert!(docs(&cluster, &groups, &versions).unwrap().is_none());
    let (cluster, groups, versions) = ha_with("  clusterAutoscaler:\n    enabled: false\n    expander: priority\n");
    assert!(docs(&cluster, &groups, &versions).unwrap().is_none());
    let (mut cluster, groups, versions) = ha_with(ENABLED);
    assert!(docs(&cluster, &groups, &versions).unwrap().is_some());
    cluster.spec.cloud_provider = Some("hetzner".into());
    assert!(docs(&cluster, &groups, &versions).unwrap().is_none());
}

#[test]
fn ha_renders_kops_command_and_placement() {
    let (cluster, groups, versions) = ha_with(ENABLED);
    let d = docs(&cluster, &groups, &versions).unwrap().expect("enabled");
    let kinds: Vec<&str> = d.iter().filter_map(|x| x["kind"].as_str()).collect();
    assert_eq!(kinds, ["PodDisruptionBudget", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Service", "Deployment"]);
    assert_eq!(
        command(&d),
        [
            "./cluster-autoscaler",
            "--balance-similar-node-groups=false",
            "--emit-per-nodegroup-metrics=false",
            "--cloud-provider=aws",
            "--aws-use-static-instance-list=false",
            "--expander=random",
            "--nodes=3:9:nodes.ha.k8s.example.com",
            "--ignore-daemonsets-utilization=false",
            "--scale-down-utilization-threshold=0.5",
            "--skip-nodes-with-custom-controller-pods=true",
            "--skip-nodes-with-local-storage=true",
            "--skip-nodes-with-system-pods=true",
            "--scale-down-delay-after-add=10m0s",
            "--scale-down-unneeded-time=10m0s",
            "--scale-down-unready-time=20m0s",
            "--new-pod-scale-up-delay=0s",
            "--max-node-provision-time=15m0s",
            "--cordon-node-before-terminating=true",
            "--logtostderr=true",
            "--stderrthreshold=info",
            "--v=4",
        ]
    );
    let c = container(&d);
    assert_eq!(c["image"], "registry.k8s.io/autoscaling/cluster-autoscaler:v1.34.4");
    assert_eq!(c["imagePullPolicy"], "IfNotPresent");
    assert_eq!(c["env"], json!([{"name": "AWS_REGION", "value": "eu-west-1"}]));
    assert_eq!(c["resources"], json!({"requests": {"cpu": "100m", "memory": "300Mi"}}));
    assert!(c.get("securityContext").is_none() && c.get("volumeMounts").is_none(), "{c}");
    let dep = kind(&d, "Deployment");
    assert_eq!(dep["spec"]["replicas"], 2, "three control planes: two replicas");
    assert_eq!(dep["spec"]["strategy"]["rollingUpdate"]["maxSurge"], 0);
    let pod = &dep["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert!(pod.get("volumes").is_none() && pod.get("securityContext").is_none(), "{pod}");
    assert_eq!(
        pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"][0]["key"],
        "node-role.kubernetes.io/control-plane"
    );
    assert_eq!(pod["tolerations"].as_array().map(Vec::len), Some(2));
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");
    assert_eq!(dep["spec"]["template"]["metadata"]["annotations"], json!({"prometheus.io/port": "8085", "prometheus.io/scrape": "true"}));
    for x in &d {
        assert_eq!(x["metadata"]["labels"]["k8s-addon"], NAME, "{x}");
    }
    assert_eq!(kind(&d, "ServiceAccount")["automountServiceAccountToken"], true);
}

#[test]
fn rbac_grants_exactly_what_kops_grants() {
    let (cluster, groups, versions) = ha_with(ENABLED);
    let d = docs(&cluster, &groups, &versions).unwrap().expect("enabled");
    // kOps' k8s-1.15 template, rule by rule.
    let kops: &[Rule] = &[
        (&[""], &["events", "endpoints"], &[], &["create", "patch"]),
        (&[""], &["pods/eviction"], &[], &["create"]),
        (&[""], &["pods/status"], &[], &["update"]),
        (&[""], &["endpoints"], &["cluster-autoscaler"], &["get", "update"]),
        (&[""], &["nodes"], &[], &["watch", "list", "get", "update"]),
        (&["resource.k8s.io"], &["resourceslices", "deviceclasses", "resourceclaims"], &[], &["watch", "list", "get"]),
        (&[""], &["namespaces", "pods", "services", "replicationcontrollers", "persistentvolumeclaims", "persistentvolumes"], &[], &["watch", "list", "get"]),
        (&["batch"], &["jobs", "cronjobs"], &[], &["watch", "list", "get"]),
        (&["batch", "extensions"], &["jobs"], &[], &["get", "list", "patch", "watch"]),
        (&["extensions"], &["replicasets", "daemonsets"], &[], &["watch", "list", "get"]),
        (&["policy"], &["poddisruptionbudgets"], &[], &["watch", "list"]),
        (&["apps"], &["daemonsets", "replicasets", "statefulsets"], &[], &["watch", "list", "get"]),
        (&["storage.k8s.io"], &["storageclasses", "csinodes", "csidrivers", "csistoragecapacities", "volumeattachments"], &[], &["watch", "list", "get"]),
        (&[""], &["configmaps"], &[], &["list", "watch", "get"]),
        (&["coordination.k8s.io"], &["leases"], &[], &["create"]),
        (&["coordination.k8s.io"], &["leases"], &["cluster-autoscaler"], &["get", "update"]),
    ];
    assert_eq!(grants(kind(&d, "ClusterRole")), triples(kops));
    let kops_role: &[Rule] =
        &[(&[""], &["configmaps"], &[], &["create"]), (&[""], &["configmaps"], &["cluster-autoscaler-status"], &["delete", "get", "update"])];
    assert_eq!(grants(kind(&d, "Role")), triples(kops_role));
}

#[test]
fn the_spec_sets_flags_image_requests_and_annotations() {
    let extra = "  clusterAutoscaler:\n    enabled: true\n    expander: least-waste\n    balanceSimilarNodeGroups: true\n    scaleDownUnneededTime: 1m0s\n    scaleDownDelayAfterAdd: 1m0s\n    cordonNodeBeforeTerminating: false\n    awsUseStaticInstanceList: true\n    cpuRequest: 50m\n    memoryRequest: 100Mi\n    podAnnotations:\n      team: infra\n  assets:\n    containerRegistry: 172.20.255.254:5000\n";
    let (cluster, groups, versions) = ha_with(extra);
    let d = docs(&cluster, &groups, &versions).unwrap().expect("enabled");
    let cmd = command(&d);
    for want in [
        "--expander=least-waste",
        "--balance-similar-node-groups=true",
        "--scale-down-unneeded-time=1m0s",
        "--scale-down-delay-after-add=1m0s",
        "--cordon-node-before-terminating=false",
        "--aws-use-static-instance-list=true",
    ] {
        assert!(cmd.contains(&want), "{want} not in {cmd:?}");
    }
    let c = container(&d);
    // The completed image goes through the registry remapping, as kOps remaps addon images.
    assert_eq!(c["image"], "172.20.255.254:5000/autoscaling-cluster-autoscaler:v1.34.4");
    assert_eq!(c["resources"]["requests"], json!({"cpu": "50m", "memory": "100Mi"}));
    assert_eq!(kind(&d, "Deployment")["spec"]["template"]["metadata"]["annotations"]["team"], "infra");
}

#[test]
fn groups_not_autoscaled_are_left_out() {
    let (cluster, mut groups, versions) = ha_with(ENABLED);
    let mut extra = groups.iter().find(|g| g.name() == "nodes").cloned().expect("nodes");
    extra.metadata.name = Some("batch".into());
    extra.spec.min_size = Some(0);
    extra.spec.max_size = Some(4);
    groups.push(extra.clone());
    extra.metadata.name = Some("fixed".into());
    extra.spec.autoscale = Some(false);
    groups.push(extra);
    let d = docs(&cluster, &groups, &versions).unwrap().expect("enabled");
    let nodes: Vec<&str> = command(&d).into_iter().filter(|a| a.starts_with("--nodes=")).collect();
    assert_eq!(nodes, ["--nodes=0:4:batch.ha.k8s.example.com", "--nodes=3:9:nodes.ha.k8s.example.com"]);
}

#[test]
fn the_priority_expander_gets_its_config_map() {
    let (cluster, groups, versions) = case("cluster-autoscaler-priority-expander");
    let d = docs(&cluster, &groups, &versions).unwrap().expect("the case enables it");
    let cm = d.iter().find(|x| x["metadata"]["name"] == PRIORITY_CONFIG_MAP).expect("priority ConfigMap");
    // Priorities as strings in order; an autoscaled group without a priority is at 0.
    assert_eq!(
        cm["data"]["priorities"],
        "0:\n- nodes.cas-priority-expander.example.com\n100:\n- nodes-high-priority.cas-priority-expander.example.com\n50:\n- nodes-low-priority.cas-priority-expander.example.com"
    );
    assert!(command(&d).contains(&"--expander=priority"));
    assert_eq!(kind(&d, "Deployment")["spec"]["replicas"], 1);
    let (mut cluster, groups, versions) = case("cluster-autoscaler-priority-expander");
    let cas = cluster.spec.cluster_autoscaler.as_mut().expect("set");
    cas.custom_priority_expander_config = Some([("10".to_string(), vec![".*-spot.*".to_string()])].into());
    let d = docs(&cluster, &groups, &versions).unwrap().expect("enabled");
    let cm = d.iter().find(|x| x["metadata"]["name"] == PRIORITY_CONFIG_MAP).expect("priority ConfigMap");
    assert_eq!(cm["data"]["priorities"], "10:\n- .*-spot.*");
    cluster.spec.cluster_autoscaler.as_mut().expect("set").create_priority_expander_config = Some(false);
    let d = docs(&cluster, &groups, &versions).unwrap().expect("enabled");
    assert!(!d.iter().any(|x| x["metadata"]["name"] == PRIORITY_CONFIG_MAP));
}

#[test]
fn endpoint_overrides_become_a_cloud_config() {
    let (mut cluster, groups, versions) = ha_with(ENABLED);
    cluster.metadata.annotations.get_or_insert_with(Default::default).insert(
        aws_endpoints::ANNOTATION.into(),
        "ec2=http://172.20.255.254:4566,autoscaling=http://172.20.255.254:4566,kms=http://172.20.255.254:4566".into(),
    );
    let d = docs(&cluster, &groups, &versions).unwrap().expect("enabled");
    let cm = d.iter().find(|x| x["metadata"]["name"] == CLOUD_CONFIG_MAP).expect("cloud config");
    assert_eq!(
        cm["data"]["cloud.config"],
        "[ServiceOverride \"1\"]\nService = autoscaling\nRegion = eu-west-1\nURL = http://172.20.255.254:4566\nSigningRegion = eu-west-1\nSigningName = autoscaling\n\n[ServiceOverride \"2\"]\nService = ec2\nRegion = eu-west-1\nURL = http://172.20.255.254:4566\nSigningRegion = eu-west-1\nSigningName = ec2\n"
    );
    assert_eq!(command(&d).last(), Some(&"--cloud-config=/etc/kubernetes/cluster-autoscaler/cloud.config"));
    let c = container(&d);
    assert_eq!(c["volumeMounts"], json!([{"name": "cloud-config", "mountPath": "/etc/kubernetes/cluster-autoscaler", "readOnly": true}]));
    assert_eq!(kind(&d, "Deployment")["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"], CLOUD_CONFIG_MAP);
    assert_eq!(cloud_config("r", &BTreeMap::from([("kms".to_string(), "http://x".to_string())])), None, "only the services it calls");
}

#[test]
fn gce_names_each_zonal_mig() {
    assert_eq!(split(5, 3), [2, 2, 1]);
    assert_eq!(split(1, 3), [1, 0, 0]);
    let (cluster, groups, versions) = case("many-addons-gce");
    let d = docs(&cluster, &groups, &versions).unwrap().expect("the case enables it");
    let cmd = command(&d);
    assert!(cmd.contains(&"--cloud-provider=gce") && !cmd.iter().any(|a| a.starts_with("--aws-")), "{cmd:?}");
    let mig = keelson_api::names::gce_instance_group_manager_name("us-test1-a", "nodes", "minimal.example.com");
    assert!(
        cmd.contains(&format!("--nodes=1:1:https://www.googleapis.com/compute/v1/projects/testproject/zones/us-test1-a/instanceGroups/{mig}").as_str()),
        "{cmd:?}"
    );
    assert!(container(&d).get("env").is_none());
    // Spread over three zones: a zone whose max is 0 is left out.
    let (cluster, mut groups, versions) = case("many-addons-gce");
    let g = groups.iter_mut().find(|g| g.name() == "nodes").expect("nodes");
    g.spec.zones = Some(vec!["us-test1-a".into(), "us-test1-b".into(), "us-test1-c".into()]);
    g.spec.max_size = Some(2);
    let d = docs(&cluster, &groups, &versions).unwrap().expect("enabled");
    let nodes: Vec<String> =
        command(&d).into_iter().filter(|a| a.starts_with("--nodes=")).map(|a| a.split("/zones/").next().unwrap_or_default().to_string()).collect();
    assert_eq!(
        nodes,
        ["--nodes=1:1:https://www.googleapis.com/compute/v1/projects/testproject", "--nodes=0:1:https://www.googleapis.com/compute/v1/projects/testproject"]
    );
}
