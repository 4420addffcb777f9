//! `keelson validate` on bad input: exit codes and the field path in every message.

mod common;

use common::{example, keelson};
use std::io::Write;

fn run_on(bytes: &[u8]) -> (i32, String) {
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    f.write_all(bytes).expect("write");
    let out = keelson(&["validate", "-f", f.path().to_str().expect("utf-8")]);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!stderr.contains("panicked"), "keelson panicked: {stderr}");
    (out.status.code().expect("exit code"), stderr)
}

fn minimal() -> String {
    std::fs::read_to_string(example("minimal.yaml")).expect("example")
}

/// Assert the exit code and that each expected fragment is on some stderr line.
fn expect(bytes: &[u8], code: i32, fragments: &[&str]) {
    let (got, stderr) = run_on(bytes);
    assert_eq!(got, code, "exit code; stderr:\n{stderr}");
    for f in fragments {
        assert!(stderr.lines().any(|l| l.contains(f)), "no line contains {f:?}; stderr:\n{stderr}");
    }
}

#[test]
fn valid_examples_pass() {
    for name in ["minimal.yaml", "ha.yaml", "gce.yaml", "gossip.yaml", "private.yaml"] {
        let out = keelson(&["validate", "-f", example(name).to_str().expect("utf-8")]);
        assert_eq!(out.status.code(), Some(0), "{name}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

#[test]
fn unreadable_input_exits_2() {
    expect(b"", 2, &["empty"]);
    expect(b"   \n\n", 2, &["empty"]);
    expect(b"\xff\xfe\x00binary", 2, &["not UTF-8"]);
    expect(b"abc\0def", 2, &["binary"]);
    expect(b"apiVersion: kops.k8s.io/v1alpha2\nkind: Cluster\nspec:\n  subnets: [a, b\n", 2, &["line 5:"]);
    expect(b"key: [unclosed\n  other: {\n", 2, &["line"]);
    let out = keelson(&["validate", "-f", "/nonexistent/spec.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/spec.yaml: cannot read"));
}

#[test]
fn hostile_nesting_does_not_overflow() {
    let deep = format!("apiVersion: kops.k8s.io/v1alpha2\nkind: Cluster\nspec:\n  x: {}{}\n", "[".repeat(200_000), "]".repeat(200_000));
    expect(deep.as_bytes(), 2, &["nesting deeper"]);
    let braces = format!("a: {}", "{a: ".repeat(50_000));
    let (code, _) = run_on(braces.as_bytes());
    assert_eq!(code, 2);
}

#[test]
fn unknown_api_version_and_kind() {
    let spec = minimal().replacen("apiVersion: kops.k8s.io/v1alpha2", "apiVersion: kops.k8s.io/v1beta9", 1);
    expect(spec.as_bytes(), 1, &["Cluster/minimal.k8s.example.com: apiVersion: unknown apiVersion \"kops.k8s.io/v1beta9\""]);
    let spec = minimal().replace("kind: InstanceGroup", "kind: NodePool");
    expect(spec.as_bytes(), 1, &["NodePool/control-plane-us-east-1a: kind: unknown kind \"NodePool\""]);
}

#[test]
fn missing_cluster_document() {
    let spec = minimal();
    let groups_only: String = spec.split("\n---\n").skip(1).collect::<Vec<_>>().join("\n---\n");
    expect(groups_only.as_bytes(), 1, &["no Cluster document"]);
}

#[test]
fn unknown_fields_and_type_errors_name_their_path() {
    let spec = minimal().replace("  kubelet:\n    anonymousAuth: false", "  kubelet:\n    anonymousAuth: false\n    maxPodz: 10");
    expect(spec.as_bytes(), 1, &["Cluster/minimal.k8s.example.com: spec.kubelet.maxPodz: unknown field `maxPodz` (did you mean `maxPods`?)"]);
    let spec = minimal().replace("    anonymousAuth: false", "    anonymousAuth: sometimes");
    expect(spec.as_bytes(), 1, &["Cluster/minimal.k8s.example.com: spec.kubelet.anonymousAuth: invalid type"]);
    let spec = minimal().replace("  maxSize: 4", "  maxSize: many");
    expect(spec.as_bytes(), 1, &["InstanceGroup/nodes-us-east-1a: spec.maxSize: invalid type"]);
    let spec = minimal().replace("kubernetesVersion: 1.34.4", "kubernetesVersion: latest");
    expect(spec.as_bytes(), 1, &["spec.kubernetesVersion: \"latest\" is not a valid Kubernetes version"]);
    let spec = minimal().replace("    memoryRequest: 100Mi\n    etcdMembers", "    memoryRequest: lots\n    etcdMembers");
    expect(spec.as_bytes(), 1, &["spec.etcdClusters[0].memoryRequest: \"lots\" is not a valid quantity"]);
}

#[test]
fn invalid_dns_names() {
    let spec = minimal().replace("name: minimal.k8s.example.com", "name: Minimal_Cluster");
    expect(spec.as_bytes(), 1, &["Cluster/Minimal_Cluster: metadata.name: \"Minimal_Cluster\" is not a valid DNS name"]);
    let spec = minimal().replace("name: nodes-us-east-1a", "name: Nodes!");
    expect(spec.as_bytes(), 1, &["InstanceGroup/Nodes!: metadata.name:"]);
}

#[test]
fn cidr_syntax_and_containment() {
    let spec = minimal().replace("networkCIDR: 172.20.0.0/16", "networkCIDR: 172.20.0.0/33");
    expect(spec.as_bytes(), 1, &["spec.networkCIDR: \"172.20.0.0/33\" is not a valid CIDR"]);
    let spec = minimal().replace("cidr: 172.20.32.0/19", "cidr: 10.1.0.0/19");
    expect(spec.as_bytes(), 1, &["Cluster/minimal.k8s.example.com: spec.subnets[us-east-1a].cidr: 10.1.0.0/19 is not inside networkCIDR 172.20.0.0/16"]);
    let spec = minimal().replace("cidr: 172.20.32.0/19", "cidr: 172.20.32.0/nineteen");
    expect(spec.as_bytes(), 1, &["spec.subnets[us-east-1a].cidr: \"172.20.32.0/nineteen\" is not a valid CIDR"]);
    let spec = minimal().replace("nonMasqueradeCIDR: 100.64.0.0/10", "nonMasqueradeCIDR: 172.16.0.0/12");
    expect(spec.as_bytes(), 1, &["spec.nonMasqueradeCIDR: 172.16.0.0/12 overlaps networkCIDR 172.20.0.0/16"]);
    let spec = minimal().replace("nonMasqueradeCIDR: 100.64.0.0/10", "nonMasqueradeCIDR: 100.64.0.0/10\n  serviceClusterIPRange: 172.20.0.0/24");
    expect(
        spec.as_bytes(),
        1,
        &[
            "spec.serviceClusterIPRange: 172.20.0.0/24 overlaps the network 172.20.0.0/16",
            "spec.serviceClusterIPRange: 172.20.0.0/24 must lie inside nonMasqueradeCIDR",
        ],
    );
}

#[test]
fn references_must_exist() {
    let spec = minimal().replace(
        "  subnets:\n  - us-east-1a\n---\napiVersion: kops.k8s.io/v1alpha2\nkind: InstanceGroup\nmetadata:\n  name: nodes",
        "  subnets:\n  - us-east-1z\n---\napiVersion: kops.k8s.io/v1alpha2\nkind: InstanceGroup\nmetadata:\n  name: nodes",
    );
    expect(spec.as_bytes(), 1, &["InstanceGroup/control-plane-us-east-1a: spec.subnets[0]: no subnet named \"us-east-1z\""]);
    let spec = minimal().replacen("      instanceGroup: control-plane-us-east-1a", "      instanceGroup: control-plane-us-east-1q", 1);
    expect(spec.as_bytes(), 1, &["spec.etcdClusters[main].etcdMembers[a].instanceGroup: no InstanceGroup named \"control-plane-us-east-1q\""]);
}

#[test]
fn etcd_membership_rules() {
    // A member on a worker group.
    let spec = minimal().replacen("      instanceGroup: control-plane-us-east-1a", "      instanceGroup: nodes-us-east-1a", 1);
    expect(spec.as_bytes(), 1, &["spec.etcdClusters[main].etcdMembers[a].instanceGroup: InstanceGroup \"nodes-us-east-1a\" has role \"Node\""]);
    // Two members: even, and a duplicate name.
    let spec = minimal().replacen(
        "    - name: a\n      instanceGroup: control-plane-us-east-1a\n      encryptedVolume: true\n",
        "    - name: a\n      instanceGroup: control-plane-us-east-1a\n      encryptedVolume: true\n    - name: a\n      instanceGroup: control-plane-us-east-1a\n",
        1,
    );
    expect(spec.as_bytes(), 1, &["spec.etcdClusters[main].etcdMembers: 2 members", "spec.etcdClusters[main].etcdMembers[a].name: duplicate member name"]);
    // A member whose group spans two zones.
    let two_zones = minimal()
        .replace(
            "    type: Public\n  topology",
            "    type: Public\n  - name: us-east-1b\n    zone: us-east-1b\n    cidr: 172.20.64.0/19\n    type: Public\n  topology",
        )
        .replacen("  subnets:\n  - us-east-1a\n---", "  subnets:\n  - us-east-1a\n  - us-east-1b\n---", 1);
    expect(two_zones.as_bytes(), 1, &["spans zones us-east-1a, us-east-1b"]);
}

#[test]
fn duplicate_names() {
    let spec = minimal().replace(
        "    type: Public\n  topology",
        "    type: Public\n  - name: us-east-1a\n    zone: us-east-1a\n    cidr: 172.20.64.0/19\n    type: Public\n  topology",
    );
    expect(spec.as_bytes(), 1, &["spec.subnets[us-east-1a].name: duplicate subnet name"]);
    let spec = minimal().replace("name: nodes-us-east-1a", "name: control-plane-us-east-1a");
    expect(spec.as_bytes(), 1, &["InstanceGroup/control-plane-us-east-1a: metadata.name: duplicate instance group name"]);
    let spec = minimal().replace("  - name: events", "  - name: main");
    expect(spec.as_bytes(), 1, &["spec.etcdClusters[main].name: duplicate etcd cluster name"]);
}

#[test]
fn group_sizes_and_cluster_labels() {
    let spec = minimal().replace("  minSize: 2\n  maxSize: 4", "  minSize: 5\n  maxSize: 4");
    expect(spec.as_bytes(), 1, &["InstanceGroup/nodes-us-east-1a: spec.minSize: minSize 5 is larger than maxSize 4"]);
    let spec = minimal().replace("  minSize: 2\n", "  minSize: -1\n");
    expect(spec.as_bytes(), 1, &["InstanceGroup/nodes-us-east-1a: spec.minSize: -1 is negative"]);
    let spec = minimal().replacen("    kops.k8s.io/cluster: minimal.k8s.example.com", "    kops.k8s.io/cluster: other.example.com", 1);
    expect(spec.as_bytes(), 1, &["InstanceGroup/control-plane-us-east-1a: metadata.labels[kops.k8s.io/cluster]: labelled for cluster \"other.example.com\""]);
}

#[test]
fn all_errors_are_reported_together() {
    let spec = minimal()
        .replace("  minSize: 2\n  maxSize: 4", "  minSize: 5\n  maxSize: 4")
        .replace("cidr: 172.20.32.0/19", "cidr: 10.1.0.0/19")
        .replace("  - name: events", "  - name: main");
    let (code, stderr) = run_on(spec.as_bytes());
    assert_eq!(code, 1);
    assert_eq!(stderr.lines().count(), 3, "one line per error:\n{stderr}");
}

/// A CNI Keelson does not render: `validate` refuses it with its path, `compile` still writes
/// kOps' output and warns; a kubelet flag no kubelet has is refused by both.
#[test]
fn unrendered_and_refused_fields_are_named_with_their_path() {
    let canal = minimal().replace("  networking:\n    cni: {}\n", "  networking:\n    canal: {}\n");
    assert_ne!(canal, minimal(), "the example uses networking.cni");
    expect(canal.as_bytes(), 1, &["spec.networking.canal: Keelson does not render canal: it is Calico's calico/node", "supported: calico, cilium, flannel"]);
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    f.write_all(canal.as_bytes()).expect("write");
    let out_dir = tempfile::tempdir().expect("out");
    let out = keelson(&["compile", "-f", f.path().to_str().expect("utf-8"), "--out", out_dir.path().to_str().expect("utf-8"), "--offline"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "compile keeps kOps' output: {stderr}");
    assert!(stderr.contains("warning") && stderr.contains("spec.networking.canal"), "{stderr}");

    // flannel renders with vxlan; udp (kOps accepts it) is not rendered, and kOps' own rules hold:
    // a backend must be named, and only udp or vxlan.
    let flannel = |backend: &str| minimal().replace("  networking:\n    cni: {}\n", &format!("  networking:\n    flannel:\n{backend}"));
    assert_eq!(run_on(flannel("      backend: vxlan\n").as_bytes()).0, 0, "flannel vxlan validates");
    expect(flannel("      backend: udp\n").as_bytes(), 1, &["spec.networking.flannel.backend: Keelson runs flannel with the vxlan backend only"]);
    expect(flannel("      iptablesResyncSeconds: 10\n").as_bytes(), 1, &["spec.networking.flannel.backend: Flannel backend must be specified"]);
    expect(flannel("      backend: host-gw\n").as_bytes(), 1, &["spec.networking.flannel.backend: unsupported value \"host-gw\""]);

    let dockershim = minimal().replace("  kubelet:\n    anonymousAuth: false\n", "  kubelet:\n    anonymousAuth: false\n    networkPluginName: cni\n");
    assert_ne!(dockershim, minimal(), "the example sets spec.kubelet");
    expect(dockershim.as_bytes(), 1, &["spec.kubelet.networkPluginName: a dockershim setting"]);
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    f.write_all(dockershim.as_bytes()).expect("write");
    let out = keelson(&["compile", "-f", f.path().to_str().expect("utf-8"), "--out", out_dir.path().to_str().expect("utf-8"), "--offline"]);
    assert_eq!(out.status.code(), Some(1), "compile refuses it too: {}", String::from_utf8_lossy(&out.stderr));
}

/// Keys kOps' v1alpha2 types drop unread (a `rootVolume` block, cluster-level etcd volume
/// settings) are accepted, as kOps accepts them, and named in a warning with what to set instead;
/// etcd-manager's retention variables are read, any other variable is refused by name; the root
/// volume type must be the cloud's own word.
#[test]
fn keys_kops_drops_are_warned_about_and_etcd_manager_retention_is_read() {
    let group = "  role: Master\n";
    let dropped = minimal().replacen(group, &format!("{group}  rootVolume:\n    size: 100\n    type: gp3\n"), 1).replacen(
        "  - name: main\n",
        "  - name: main\n    volumeSize: 120\n",
        1,
    );
    assert_ne!(dropped, minimal());
    expect(
        dropped.as_bytes(),
        0,
        &[
            "warning: ", // every line below is a warning
            "InstanceGroup/control-plane-us-east-1a: spec.rootVolume: kOps v1alpha2 drops the rootVolume block unread",
            "spec.etcdClusters[main].volumeSize: not a field of kOps' etcd clusters",
        ],
    );
    let env = |name: &str, value: &str| {
        minimal().replacen("  - name: main\n", &format!("  - name: main\n    manager:\n      env:\n      - name: {name}\n        value: {value}\n"), 1)
    };
    expect(env("ETCD_MANAGER_HOURLY_BACKUPS_RETENTION", "1d").as_bytes(), 0, &[]);
    expect(env("ETCD_MANAGER_DAILY_BACKUPS_RETENTION", "1y").as_bytes(), 0, &[]);
    expect(
        env("ETCD_LISTEN_METRICS_URLS", "http://0.0.0.0:8081").as_bytes(),
        1,
        &["spec.etcdClusters[main].manager.env[ETCD_LISTEN_METRICS_URLS]: Keelson runs etcd from protokube"],
    );
    expect(
        env("ETCD_MANAGER_DAILY_BACKUPS_RETENTION", "36h").as_bytes(),
        1,
        &["manager.env[ETCD_MANAGER_DAILY_BACKUPS_RETENTION].value: \"36h\": protokube keeps daily backups by the day"],
    );
    let root_type = |t: &str| minimal().replacen(group, &format!("{group}  rootVolumeType: {t}\n"), 1);
    expect(root_type("gp3").as_bytes(), 0, &[]);
    expect(root_type("pd-ssd").as_bytes(), 1, &["spec.rootVolumeType: \"pd-ssd\": expected an EBS volume type"]);
    let gce = std::fs::read_to_string(example("gce.yaml")).expect("example");
    let gce_type = |t: &str| gce.replacen(group, &format!("{group}  rootVolumeType: {t}\n  rootVolumeIops: 6000\n"), 1);
    assert_ne!(gce_type("x"), gce, "the GCE example has a Master group");
    expect(gce_type("hyperdisk-balanced").as_bytes(), 0, &[]);
    expect(gce_type("gp3").as_bytes(), 1, &["spec.rootVolumeType: \"gp3\" is an EBS volume type; on GCE expected a disk type"]);
}

/// `sysctlParameters` of the cluster and of a group reach the group's NodeupConfig the kOps way
/// (the group's lines, then the cluster's, under kOps' headings); a line that is not one setting is
/// refused with its path.
#[test]
fn sysctl_parameters_reach_the_nodeup_config_and_bad_lines_are_refused() {
    let group = "  role: Node\n";
    let spec = minimal().replacen(group, &format!("{group}  sysctlParameters:\n  - net.ipv4.tcp_keepalive_time = 600\n"), 1).replacen(
        "spec:\n",
        "spec:\n  sysctlParameters:\n  - fs.inotify.max_user_watches = 524288\n",
        1,
    );
    expect(spec.as_bytes(), 0, &[]);
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    f.write_all(spec.as_bytes()).expect("write");
    let out_dir = tempfile::tempdir().expect("temp dir");
    let out = keelson(&["compile", "-f", f.path().to_str().expect("utf-8"), "--out", out_dir.path().to_str().expect("utf-8"), "--offline"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let config = std::fs::read_to_string(out_dir.path().join("state/igconfig/node/nodes-us-east-1a/nodeupconfig.yaml")).expect("nodeup config");
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&config).expect("yaml");
    let lines: Vec<&str> = doc["SysctlParameters"].as_sequence().expect("SysctlParameters").iter().filter_map(|v| v.as_str()).collect();
    assert_eq!(
        lines,
        [
            "# Custom sysctl parameters from instance group spec",
            "",
            "net.ipv4.tcp_keepalive_time = 600",
            "# Custom sysctl parameters from cluster spec",
            "",
            "fs.inotify.max_user_watches = 524288"
        ]
    );
    let cp = std::fs::read_to_string(out_dir.path().join("state/igconfig/control-plane/control-plane-us-east-1a/nodeupconfig.yaml")).expect("cp config");
    assert!(cp.contains("fs.inotify.max_user_watches") && !cp.contains("tcp_keepalive_time"), "the cluster's lines only: {cp}");
    let bad = minimal().replacen("spec:\n", "spec:\n  sysctlParameters:\n  - net.ipv4.ip_forward\n", 1);
    expect(bad.as_bytes(), 1, &["spec.sysctlParameters[0]: \"net.ipv4.ip_forward\": expected key = value"]);
    // containerd's configAdditions: kOps' dotted keys, checked here, set over config.toml by nodeup.
    let additions = |key: &str| minimal().replacen(group, &format!("{group}  containerd:\n    configAdditions:\n      '{key}': \"true\"\n"), 1);
    expect(additions("plugins.\"io.containerd.cri.v1.runtime\".enable_cdi").as_bytes(), 0, &[]);
    expect(
        additions("plugins..enable_cdi").as_bytes(),
        1,
        &["InstanceGroup/nodes-us-east-1a: spec.containerd.configAdditions[plugins..enable_cdi]: \"plugins..enable_cdi\": an empty key"],
    );
}

/// How many of the public kOps conformance cases `keelson validate` accepts, at least (issue 44:
/// 24 before, this many after). Every case it refuses names each refused field with its reason
/// (README, "What Keelson refuses"); raise the number when more pass, never lower it without a
/// reason a user can check. 29 since `minimal_gce_longclustername` (its long GCE label cut with a
/// hash) and `minimal_gce_plb` (keys kOps drops, warned about) pass (2026-12-04); 30 since `digit`
/// (IRSA: the issuer's discovery store, its IAM OIDC provider, service accounts' roles) passes; 31
/// since `public-jwks-apiserver` (Keelson's addons on roles of their own) passes.
const PUBLIC_KOPS_CASES_VALID: usize = 31;

#[test]
fn public_kops_cases_pass_validate_no_fewer_than_before() {
    let dir = common::repo_root().join("../shared/conformance");
    let list = std::fs::read_to_string(dir.join("PUBLIC.txt"))
        .unwrap_or_else(|e| panic!("this test needs the shared kOps conformance cases beside the repository, at {}: {e}", dir.join("PUBLIC.txt").display()));
    let (mut valid, mut refused) = (Vec::new(), Vec::new());
    for name in list.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let input = dir.join("cases").join(name).join("input.yaml");
        let out = keelson(&["validate", "-f", input.to_str().expect("utf-8 path")]);
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(!stderr.contains("panicked"), "{name}: keelson panicked: {stderr}");
        match out.status.code() {
            Some(0) => valid.push(name.to_string()),
            Some(1) => {
                // Every refusal names its field's path and why (a `Keelson …`/`nodeup …` reason).
                assert!(stderr.lines().all(|l| l.contains(": spec.") || l.contains(": metadata.")), "{name}: a refusal without a path:\n{stderr}");
                refused.push(format!("{name}:\n{stderr}"));
            }
            other => panic!("{name}: exit {other:?} (unreadable?): {stderr}"),
        }
    }
    assert!(
        valid.len() >= PUBLIC_KOPS_CASES_VALID,
        "{} public kOps cases pass `keelson validate`, fewer than {PUBLIC_KOPS_CASES_VALID}; refused:\n{}",
        valid.len(),
        refused.join("\n")
    );
}
