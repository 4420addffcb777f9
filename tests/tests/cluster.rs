//! End to end: `keelson-local up -f examples/ha.yaml` (3 control planes in 3 zones + 3 nodes,
//! `keelson apply --yes` against moto, nodeup and protokube for real in systemd machines) and
//! then check, from moto and from inside the machines: each control plane mounted its own
//! member's etcd volumes; etcd main and events are healthy 3-member clusters; the DNS records in
//! Route53 and the names the machines resolve point at the live IPs; containerd runs everywhere;
//! real Kubernetes (built from source, images from the local registry): `/readyz` is ok through
//! each control plane's address, through every address of `api.internal.<cluster>` (verified
//! against that name) and through the local API load balancer, every machine is a Ready Node and
//! every control-plane static pod runs; every Node carries its instance group's labels (protokube's
//! node labeller), a replacement's within seconds; `keelson-local kubectl` and `env` work, and with that
//! environment `keelson validate cluster --wait` reports the cluster ready; kOps' metrics-server addon
//! serves node metrics (`kubectl top nodes`).
//! `kill` of a node gets it replaced and Ready again; `keelson delete instance NODE --yes` (kOps'
//! command: cordon, drain, terminate) replaces a worker with the cluster valid again; `down` then
//! leaves nothing behind.
//! Certificates live 13 minutes here (test-only `KEELSON_TEST_CERT_VALIDITY_SECONDS`): they roll
//! over on the running cluster — etcd's and the API server's on every control plane (protokube),
//! the kubelet's and kube-proxy's on every worker (nodeup's timer, joining again) — while the API
//! answers through the load balancer, no Node goes NotReady and no kubelet is restarted (each
//! reads its renewed client certificate by itself).
//! While they roll over, the upstream conformance suite's focused set runs against the cluster
//! (`keelson-local conformance`, docs/conformance.md) and every test of it must pass.
//! Last, the IAM oracle (`keelson-local iam-check`): every request the machines signed with their
//! instance roles' credentials is allowed by the policy IAM holds for that role.

#[path = "cluster/metrics.rs"]
mod metrics;
mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use keelson_local::cloud::Cloud;
use keelson_local::cluster::ClusterState;
use keelson_local::kubeapi::{self, Target};
use keelson_local::paths::{self, State};
use keelson_local::spec::Spec;
use keelson_local::{etcd, machine};

#[test]
fn ha_cluster_up_volumes_etcd_dns_containerd() {
    support::require_root();
    let down = support::Down;
    let spec_path = support::repo().join("examples/ha.yaml");
    let out = support::run_with_env(
        &[(base::pki::TEST_VALIDITY_ENV, &CERT_LIFETIME.as_secs().to_string())],
        &["up", "-f", &spec_path.to_string_lossy(), "--timeout", "600"],
    );
    assert!(out.status.success(), "keelson-local up failed (output above)");
    // Printed, not bounded: how long each worker takes from its user-data starting to a Ready Node.
    let boots = String::from_utf8_lossy(&out.stdout).lines().find(|l| l.starts_with("keelson-local: worker boot")).map(str::to_string);
    assert!(boots.as_deref().is_some_and(|l| !l.contains("not measured") && l.matches(" s,").count() == 2), "one boot time per worker: {boots:?}");

    let spec = Spec::load(&spec_path).unwrap();
    let cs = ClusterState::load(&State::new(paths::state_dir())).expect("cluster.json");
    let cloud = Cloud::new(&cs.endpoint(), &cs.region);
    let cps: Vec<_> = cs.machines.iter().filter(|m| m.role == "control-plane").collect();
    let nodes: Vec<_> = cs.machines.iter().filter(|m| m.role == "node").collect();
    assert_eq!(cps.len(), 3, "control planes: {:?}", cs.machines);
    assert_eq!(nodes.len(), 3, "nodes: {:?}", cs.machines);

    // The certificates as the cluster came up; from now until the restore (step 8) the API must
    // answer and every Node stay Ready while they roll over (checked in step 7d).
    let certs_at_start: BTreeMap<(String, &str), String> = watched_certs(&cs.machines);
    let kubelet_starts_at_start = kubelet_journal_count(&cs.machines, "Started kubelet");
    let watch = Watch::start(std::path::PathBuf::from(&cs.kubeconfig));

    // Member → instance group, from the spec.
    let cluster_doc = spec.docs.iter().find(|d| d.get("kind").and_then(|k| k.as_str()) == Some("Cluster")).unwrap();
    let mut member_group: BTreeMap<(String, String), String> = BTreeMap::new();
    for ec in cluster_doc["spec"]["etcdClusters"].as_sequence().unwrap() {
        let c = ec["name"].as_str().unwrap().to_string();
        for m in ec["etcdMembers"].as_sequence().unwrap() {
            member_group.insert((c.clone(), m["name"].as_str().unwrap().to_string()), m["instanceGroup"].as_str().unwrap().to_string());
        }
    }
    let machine_of_group = |ig: &str| cps.iter().find(|m| m.group == ig || m.group == format!("{ig}.{}", spec.name)).copied();

    // 1. Each control plane mounted exactly its own member's volume of each etcd cluster.
    let vols = cloud.volumes().unwrap();
    for ((c, member), ig) in &member_group {
        let name = format!("{member}.etcd-{c}.{}", spec.name);
        let v = vols.iter().find(|v| v.name() == name).unwrap_or_else(|| panic!("no volume named {name}"));
        let m = machine_of_group(ig).unwrap_or_else(|| panic!("no machine for group {ig}"));
        let att = v.attached_to().unwrap_or_else(|| panic!("{name} is not attached"));
        assert_eq!(att.instance_id, m.instance_id, "{name} attached to the wrong instance");
        let mnt = machine::exec_in(m.init_pid.unwrap(), &["findmnt", "-n", "-o", "SOURCE", &format!("/mnt/master-{}", v.id)])
            .unwrap_or_else(|e| panic!("{name} not mounted in {}: {e}", m.instance_id));
        assert!(mnt.contains("nvme"), "{name} mounted from {mnt}");
    }

    // 2. etcd main and events: healthy, 3 members each, seen from every control plane.
    for m in &cps {
        let pid = m.init_pid.unwrap();
        for c in &spec.etcd_clusters {
            let ep = etcd::endpoint(&m.root, c).unwrap_or_else(|| panic!("{}: no etcd-{c} manifest", m.instance_id));
            assert!(etcd::healthy(pid, &ep), "{}: etcd {c} unhealthy", m.instance_id);
            let members = etcd::members(pid, &ep).unwrap();
            assert_eq!(members.len(), 3, "{}: etcd {c} members {members:?}", m.instance_id);
        }
    }

    // 3. DNS: Route53 records of the etcd members and the internal API point at live IPs, and
    //    every machine resolves the member names to them. protokube updates records within seconds.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let records = cloud.a_records().unwrap();
        let mut wrong = Vec::new();
        for ((c, member), ig) in &member_group {
            let host = if c == "main" { format!("etcd-{member}.internal.{}", spec.name) } else { format!("etcd-{c}-{member}.internal.{}", spec.name) };
            let want = machine_of_group(ig).unwrap().ip.clone();
            let got: Vec<String> = records.iter().filter(|r| r.name == host).flat_map(|r| r.ips.clone()).collect();
            if got != vec![want.clone()] {
                wrong.push(format!("Route53 {host} = {got:?}, want [{want}]"));
            }
            for m in cs.machines.iter() {
                let r = machine::exec_in(m.init_pid.unwrap(), &["getent", "hosts", &host]).unwrap_or_default();
                if r.split_whitespace().next() != Some(want.as_str()) {
                    wrong.push(format!("{} resolves {host} to {:?}, want {want}", m.instance_id, r.trim()));
                }
            }
        }
        let api = format!("api.internal.{}", spec.name);
        let live: Vec<&str> = cps.iter().map(|m| m.ip.as_str()).collect();
        let api_ips: Vec<String> = records.iter().filter(|r| r.name == api).flat_map(|r| r.ips.clone()).collect();
        if api_ips.is_empty() || api_ips.iter().any(|ip| !live.contains(&ip.as_str())) {
            wrong.push(format!("Route53 {api} = {api_ips:?}, want live control-plane IPs {live:?}"));
        }
        // Where workers join: the control planes themselves (never the API load balancer).
        let join = format!("kops-controller.internal.{}", spec.name);
        let mut join_ips: Vec<String> = records.iter().filter(|r| r.name == join).flat_map(|r| r.ips.clone()).collect();
        join_ips.sort();
        let mut want_join: Vec<String> = live.iter().map(|s| s.to_string()).collect();
        want_join.sort();
        if join_ips != want_join {
            wrong.push(format!("Route53 {join} = {join_ips:?}, want the control planes {want_join:?}"));
        }
        if wrong.is_empty() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "DNS does not match the live machines:\n{}", wrong.join("\n"));
        std::thread::sleep(Duration::from_secs(1));
    }

    // 4. containerd runs on every machine (client and server answer).
    for m in &cs.machines {
        let v = machine::exec_in(m.init_pid.unwrap(), &["ctr", "version"]).unwrap_or_else(|e| panic!("{}: containerd: {e}", m.instance_id));
        assert!(v.contains("Server:"), "{}: {v}", m.instance_id);
    }

    // 5. Kubernetes: the API through every path, every Node Ready, every static pod running.
    let kc = std::path::PathBuf::from(&cs.kubeconfig);
    for m in &cps {
        let r = kubeapi::readyz(&kc, &Target { server: Some(format!("https://{}", m.ip)), tls_server_name: None });
        assert_eq!(r.as_deref().map(str::trim).ok(), Some("ok"), "/readyz through {} ({}): {r:?}", m.instance_id, m.ip);
    }
    let api = format!("api.internal.{}", spec.name);
    let api_ips: Vec<String> = cloud.a_records().unwrap().iter().filter(|r| r.name == api).flat_map(|r| r.ips.clone()).collect();
    assert_eq!(api_ips.len(), 3, "{api}: {api_ips:?}");
    for ip in &api_ips {
        let r = kubeapi::readyz(&kc, &Target { server: Some(format!("https://{ip}")), tls_server_name: Some(api.clone()) });
        assert_eq!(r.as_deref().map(str::trim).ok(), Some("ok"), "/readyz through {api} ({ip}): {r:?}");
    }
    assert_eq!(kubeapi::readyz(&kc, &Target::default()).unwrap().trim(), "ok", "through the local load balancer");
    let k8s_nodes = kubeapi::nodes(&kc).unwrap();
    assert_eq!(k8s_nodes.len(), 6, "{k8s_nodes:?}");
    assert!(k8s_nodes.values().all(|n| n.ready), "not every Node is Ready: {k8s_nodes:?}");
    let pods = kubeapi::system_pods(&kc).unwrap();
    for m in &cps {
        let (node, _) = k8s_nodes.iter().find(|(_, n)| n.internal_ip.as_deref() == Some(m.ip.as_str())).expect("node of a control plane");
        for p in keelson_local::cluster::control_plane_pods(&cs) {
            let st = pods.get(&format!("{p}-{node}"));
            assert!(matches!(st, Some((_, true))), "{p} on {node}: {st:?}");
        }
    }
    let kubectl = support::run(&["kubectl", "get", "nodes", "-o", "name"]);
    assert!(kubectl.status.success());
    assert_eq!(String::from_utf8_lossy(&kubectl.stdout).lines().count(), 6);
    let env = support::run(&["env"]);
    let env = String::from_utf8_lossy(&env.stdout).to_string();
    for k in ["AWS_ENDPOINT_URL", "KUBECONFIG", "KEELSON_LOCAL_REGISTRY", "AWS_REGION"] {
        assert!(env.contains(&format!("export {k}=")), "env lacks {k}:\n{env}");
    }
    // The bootstrap addon was applied by protokube's addon controller (recorded with its hash), and
    // its ClusterRoleBindings exist; workers joined by cloud identity, so nothing is bound to
    // system:bootstrappers (no bootstrap token could create or auto-approve a node's CSR).
    let record = kubeapi::configmap_data(&kc, "kube-system", "keelson-addons").unwrap().expect("kube-system/keelson-addons");
    assert!(record.contains_key("bootstrap-rbac.keelson.io.hash"), "{record:?}");
    let crbs = kubeapi::cluster_role_bindings(&kc).unwrap();
    for b in ["keelson:kubelet-api-admin", "keelson:node-autoapprove-certificate-rotation"] {
        assert!(crbs.iter().any(|c| c == b), "{b} missing: {crbs:?}");
    }
    for b in ["keelson:node-bootstrapper", "keelson:node-autoapprove-bootstrap"] {
        assert!(!crbs.iter().any(|c| c == b), "{b} exists with cloud-identity joins: {crbs:?}");
    }
    // The example's additional objects took effect: its ConfigMap through the addon controller,
    // its KubeSchedulerConfiguration in every control plane's scheduler configuration.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let owner = loop {
        match kubeapi::configmap_data(&kc, "kube-system", "cluster-owner").unwrap() {
            Some(d) => break d,
            None if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_secs(2)),
            None => panic!("kube-system/cluster-owner (an additional object of the spec) was never applied"),
        }
    };
    assert_eq!(owner.get("team").map(String::as_str), Some("platform"));
    for m in &cps {
        let conf = machine::exec_in(m.init_pid.unwrap(), &["cat", "/var/lib/kube-scheduler/config.yaml"]).unwrap();
        assert!(conf.contains("percentageOfNodesToScore: 50"), "{}: {conf}", m.instance_id);
    }
    // `keelson validate cluster` (the product's, against moto and the real API) says the cluster is
    // ready: every group's instances joined as Ready nodes, every kube-system pod is Ready.
    let local_spec = State::new(paths::state_dir()).root.join("spec.yaml");
    let v = support::keelson_in_local_env(&["validate", "cluster", "-f", &local_spec.to_string_lossy(), "--wait", "5m", "-o", "json"]);
    assert!(v.status.success(), "keelson validate cluster failed (output above)");
    let report: serde_json::Value = serde_json::from_slice(&v.stdout).expect("validate -o json prints JSON");
    assert_eq!(report["failures"].as_array().map(Vec::len), Some(0), "{report}");
    assert_eq!(report["nodes"].as_array().map(Vec::len), Some(6), "{report}");

    // 5b. Encryption at rest (`encryptionConfig: true` in the example): every API server runs with
    //     the configuration nodeup wrote (0600) from the state store, and a new Secret's raw value
    //     in etcd, read on a control plane with etcdctl, is ciphertext — `k8s:enc:secretbox:v1:` —
    //     without its clear value, while the API serves it decrypted.
    for m in &cps {
        let file = m.root.join("srv/kubernetes/kube-apiserver/encryptionconfig.yaml");
        let meta = std::fs::metadata(&file).unwrap_or_else(|e| panic!("{}: {}: {e}", m.instance_id, file.display()));
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777, 0o600, "{}: {}", m.instance_id, file.display());
        let manifest = std::fs::read_to_string(m.root.join("etc/kubernetes/manifests/kube-apiserver.manifest")).unwrap();
        assert!(manifest.contains("--encryption-provider-config=/srv/kubernetes/kube-apiserver/encryptionconfig.yaml"), "{}: {manifest}", m.instance_id);
    }
    let clear = format!("clear-{}", std::process::id());
    assert!(support::run(&["kubectl", "create", "secret", "generic", "enc-at-rest", "-n", "default", &format!("--from-literal=token={clear}")])
        .status
        .success());
    assert_eq!(secret_token(&["-n", "default", "enc-at-rest"]).as_deref(), Some(clear.as_str()), "the API serves the Secret decrypted");
    for m in &cps {
        let raw = raw_secret(m, "default", "enc-at-rest");
        assert!(
            raw.starts_with("k8s:enc:secretbox:v1:key1:"),
            "{}: raw etcd value of default/enc-at-rest is not encrypted: {:?}",
            m.instance_id,
            &raw[..raw.len().min(64)]
        );
        assert!(!raw.contains(&clear), "{}: the clear value is in etcd", m.instance_id);
    }
    let _ = support::run(&["kubectl", "delete", "secret", "enc-at-rest", "-n", "default"]);

    // 6. The AWS cloud-controller-manager (the product's addon, built from k8s.io/cloud-provider-aws,
    //    talking to moto through the endpoint annotation with the instance role's credentials from
    //    IMDS) runs on the control planes and initialised every node: no `uninitialized` taint, the
    //    providerID and zone of its instance (node name = the instance's PrivateDnsName). The
    //    kubelet registered the Node with that providerID already (nodeup writes it, as kOps does):
    //    a Node whose instance is terminated before the CCM initialised it must still be found
    //    gone and deleted, and the CCM cannot look a terminated instance up by name.
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    loop {
        let nodes_now = kubeapi::nodes(&kc).unwrap_or_default();
        let pods = kubeapi::system_pods(&kc).unwrap_or_default();
        let mut wrong = Vec::new();
        let ccm: Vec<&(String, bool)> = pods.iter().filter(|(n, _)| n.starts_with("aws-cloud-controller-manager-")).map(|(_, v)| v).collect();
        let cp_nodes: Vec<&String> =
            nodes_now.iter().filter(|(_, n)| cps.iter().any(|m| n.internal_ip.as_deref() == Some(m.ip.as_str()))).map(|(k, _)| k).collect();
        if ccm.len() != 3 || !ccm.iter().all(|(node, ok)| *ok && cp_nodes.contains(&node)) {
            wrong.push(format!("CCM pods (want 3 running on {cp_nodes:?}): {ccm:?}"));
        }
        for m in &cs.machines {
            let Some((name, n)) = nodes_now.iter().find(|(_, n)| n.internal_ip.as_deref() == Some(m.ip.as_str())) else {
                wrong.push(format!("{}: no Node", m.instance_id));
                continue;
            };
            let want = format!("aws:///{}/{}", m.zone, m.instance_id);
            if n.provider_id.as_deref() != Some(want.as_str()) {
                wrong.push(format!("{name}: providerID {:?}, want {want}", n.provider_id));
            }
            if !n.provider_id_managers.iter().any(|m| m == "kubelet") {
                wrong.push(format!("{name}: providerID not set by the kubelet at registration (set by {:?})", n.provider_id_managers));
            }
            if n.taints.iter().any(|t| t.starts_with("node.cloudprovider.kubernetes.io/uninitialized")) {
                wrong.push(format!("{name}: still tainted uninitialized: {:?}", n.taints));
            }
            if n.labels.get("topology.kubernetes.io/zone") != Some(&m.zone) {
                wrong.push(format!("{name}: zone label {:?}, want {}", n.labels.get("topology.kubernetes.io/zone"), m.zone));
            }
        }
        if wrong.is_empty() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "nodes not initialised by the CCM within 300 s:\n{}", wrong.join("\n"));
        std::thread::sleep(Duration::from_secs(2));
    }
    // 6b. Every Node carries its instance group's labels (protokube's node labeller on the control
    //     planes; the kubelet may not set them): workers `node-role.kubernetes.io/node`, control
    //     planes their three labels, every Node `kops.k8s.io/instancegroup=<its group>`; only
    //     control planes carry the control-plane role label.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let problems = keelson_local::cluster::group_label_problems(&cs.name, &cs.machines, &kubeapi::nodes(&kc).unwrap_or_default());
        if problems.is_empty() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "Nodes without their groups' labels within 60 s:\n{}", problems.join("\n"));
        std::thread::sleep(Duration::from_secs(1));
    }
    let nodes_now = kubeapi::nodes(&kc).unwrap();
    for (name, n) in &nodes_now {
        let is_cp = cps.iter().any(|m| n.internal_ip.as_deref() == Some(m.ip.as_str()));
        assert_eq!(n.labels.contains_key("node-role.kubernetes.io/control-plane"), is_cp, "{name}: {:?}", n.labels);
    }

    // 7. Routes: the CCM's route controller wrote each node's pod CIDR → its instance into the
    //    cluster's route table in moto, and a pod on one worker reaches a pod on another through
    //    them (the harness plays the VPC router from that table).
    let vpc = cloud.instances().unwrap().into_iter().find(|i| i.state == "running").map(|i| i.vpc_id).expect("a running instance");
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    loop {
        let routes = cloud.instance_routes(&vpc, &spec.name).unwrap();
        let nodes_now = kubeapi::nodes(&kc).unwrap();
        let missing: Vec<String> = cs
            .machines
            .iter()
            .filter_map(|m| {
                let n = nodes_now.values().find(|n| n.internal_ip.as_deref() == Some(m.ip.as_str()))?;
                let cidr = n.pod_cidr.clone().unwrap_or_default();
                (!routes.iter().any(|r| r.destination == cidr && r.instance_id == m.instance_id)).then(|| format!("{cidr} → {}", m.instance_id))
            })
            .collect();
        if missing.is_empty() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "routes missing from the VPC route table within 180 s: {missing:?}\nroutes: {routes:?}");
        std::thread::sleep(Duration::from_secs(2));
    }
    let worker_nodes: Vec<String> =
        nodes_now.iter().filter(|(_, n)| nodes.iter().any(|m| n.internal_ip.as_deref() == Some(m.ip.as_str()))).map(|(k, _)| k.clone()).collect();
    assert!(worker_nodes.len() >= 2, "{worker_nodes:?}");
    support::pod_to_pod(&cs.registry, &worker_nodes[0], &worker_nodes[1]);
    let echo = format!("{}/keelson-test/echo:1", cs.registry);
    let on = |node: &str| format!("--overrides={{\"apiVersion\":\"v1\",\"spec\":{{\"nodeName\":\"{node}\"}}}}");

    // 7b. Workers joined by cloud identity: no bootstrap token on them or accepted by the API
    //     servers; the kubelet and kube-proxy hold certificates the join server issued for their own
    //     node names; kube-proxy runs on every node; the join servers counted the admissions.
    let nodes_now = kubeapi::nodes(&kc).unwrap();
    for m in &nodes {
        let pid = m.init_pid.expect("worker running");
        let name = nodes_now.iter().find(|(_, n)| n.internal_ip.as_deref() == Some(m.ip.as_str())).map(|(k, _)| k.clone()).expect("worker Node");
        let absent = machine::exec_in(pid, &["sh", "-c", "test ! -e /var/lib/kubelet/bootstrap-kubeconfig && ! grep -rqs -e 'token:' /var/lib/kubelet/kubeconfig /var/lib/kube-proxy/kubeconfig && echo none"]).unwrap_or_default();
        // The kubelet's kubeconfig names its certificate file (the kubelet reads a renewed one
        // by itself, 7d), which holds the certificate the join server issued.
        assert_eq!(absent.trim(), "none", "{}: a bootstrap kubeconfig or token is on the worker", m.instance_id);
        let user_data = std::fs::read_to_string(std::path::Path::new(&m.root).join("var/lib/cloud/instance/user-data.txt")).expect("the worker's user-data");
        assert!(user_data.contains("nodeup") && !user_data.to_lowercase().contains("token"), "{}: user-data mentions a token", m.instance_id);
        let kubelet_kc = std::fs::read_to_string(std::path::Path::new(&m.root).join("var/lib/kubelet/kubeconfig")).expect("the kubelet's kubeconfig");
        assert!(kubelet_kc.contains("client-certificate: /var/lib/kubelet/kubelet-client.pem"), "{}: {kubelet_kc}", m.instance_id);
        for (file, cn) in
            [("var/lib/kubelet/kubelet-client.pem", format!("system:node:{name}")), ("var/lib/kube-proxy/kubeconfig", "system:kube-proxy".to_string())]
        {
            let path = std::path::Path::new(&m.root).join(file);
            let cmd = if file.ends_with(".pem") {
                format!("openssl x509 -noout -subject -issuer -in '{}'", path.display())
            } else {
                format!("sed -n 's/^ *client-certificate-data: //p' '{}' | base64 -d | openssl x509 -noout -subject -issuer", path.display())
            };
            let out = std::process::Command::new("sh").args(["-c", &cmd]).output().expect("openssl");
            let subject = String::from_utf8_lossy(&out.stdout).to_string();
            assert!(subject.contains(&format!("CN = {cn}")) && subject.contains("CN = kubernetes-ca"), "{}: /{file}: {subject}", m.instance_id);
            let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).expect("kubeconfig").permissions()) & 0o777;
            assert_eq!(mode, 0o600, "{}: /{file}", m.instance_id);
        }
    }
    for m in &cps {
        let pid = m.init_pid.expect("control plane running");
        let tokens = machine::exec_in(pid, &["sh", "-c", "ls /srv/kubernetes/kube-apiserver/known_tokens.csv 2>/dev/null; grep -o -- '--token-auth-file[^ ]*' /etc/kubernetes/manifests/kube-apiserver.manifest || true"]).unwrap_or_default();
        assert!(tokens.trim().is_empty(), "{}: the API server accepts a static token: {tokens}", m.instance_id);
    }
    // (a worker's kube-proxy static pod may still be starting: wait, bounded)
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let proxies = kubeapi::system_pods(&kc).unwrap_or_default();
        let missing: Vec<&String> =
            nodes_now.keys().filter(|name| !proxies.iter().any(|(p, (node, ok))| p.starts_with("kube-proxy-") && node == *name && *ok)).collect();
        if missing.is_empty() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no running kube-proxy on {missing:?} within 120 s: {proxies:?}");
        std::thread::sleep(Duration::from_secs(2));
    }
    let admitted: u64 = cps
        .iter()
        .filter_map(|m| machine::exec_in(m.init_pid?, &["curl", "-fsS", "http://127.0.0.1:3998/metrics"]).ok())
        .flat_map(|t| t.lines().filter_map(|l| l.strip_prefix("protokube_node_joins_admitted_total ")?.trim().parse::<u64>().ok()).collect::<Vec<_>>())
        .sum();
    assert!(admitted >= nodes.len() as u64, "join servers admitted {admitted} workers, want at least {}", nodes.len());

    // 7c. Cluster DNS and services across machines: CoreDNS (the product's addon) runs, and a
    //     2-replica Deployment on the workers answers through its Service name from a pod on
    //     another node (CoreDNS → kube-proxy's service rules → the pod routes).
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    loop {
        let pods = kubeapi::system_pods(&kc).unwrap_or_default();
        let dns: Vec<&(String, bool)> = pods.iter().filter(|(n, _)| n.starts_with("coredns-")).map(|(_, v)| v).collect();
        if dns.len() == 2 && dns.iter().all(|(_, ok)| *ok) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "CoreDNS not running within 180 s: {dns:?}");
        std::thread::sleep(Duration::from_secs(2));
    }
    assert!(support::run(&[
        "kubectl",
        "create",
        "deployment",
        "echo",
        &format!("--image={echo}"),
        "--replicas=2",
        "--port=8080",
        "--",
        "/echo",
        "serve",
        ":8080"
    ])
    .status
    .success());
    assert!(support::run(&["kubectl", "expose", "deployment", "echo", "--port=80", "--target-port=8080"]).status.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    let replica_nodes = loop {
        let o = support::run(&["kubectl", "get", "pods", "-l", "app=echo", "-o", "jsonpath={range .items[*]}{.status.phase} {.spec.nodeName}{\"\\n\"}{end}"]);
        let text = String::from_utf8_lossy(&o.stdout).to_string();
        let running: Vec<String> = text.lines().filter_map(|l| l.strip_prefix("Running ")).map(str::to_string).collect();
        if running.len() == 2 {
            break running;
        }
        assert!(std::time::Instant::now() < deadline, "echo Deployment not running within 180 s: {text}");
        std::thread::sleep(Duration::from_secs(2));
    };
    for n in &replica_nodes {
        assert!(worker_nodes.contains(n), "echo replica on {n}, not a worker ({worker_nodes:?})");
    }
    // The client runs on a worker without a replica when there is one, else on another replica's node.
    let client_node = worker_nodes.iter().find(|n| !replica_nodes.contains(n)).unwrap_or(&replica_nodes[1]).clone();
    let client = support::run(&[
        "kubectl",
        "run",
        "echo-dns-client",
        &format!("--image={echo}"),
        "--restart=Never",
        &on(&client_node),
        "--",
        "get",
        "http://echo.default.svc.cluster.local/",
    ]);
    assert!(client.status.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let o = support::run(&["kubectl", "get", "pod", "echo-dns-client", "-o", "jsonpath={.status.phase}"]);
        let phase = String::from_utf8_lossy(&o.stdout).trim().to_string();
        if phase == "Succeeded" || phase == "Failed" {
            let logs = support::run(&["kubectl", "logs", "echo-dns-client"]);
            let text = String::from_utf8_lossy(&logs.stdout).to_string();
            assert!(phase == "Succeeded" && text.trim().starts_with("echo-"), "a pod on {client_node} could not reach Service echo by name: {phase}: {text}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "echo-dns-client did not finish within 120 s: {phase}");
        std::thread::sleep(Duration::from_secs(2));
    }
    for args in [&["delete", "pod", "echo-dns-client", "--wait=false"][..], &["delete", "service", "echo"], &["delete", "deployment", "echo"]] {
        let mut a = vec!["kubectl"];
        a.extend_from_slice(args);
        let _ = support::run(&a);
    }

    // 7c'. metrics-server (kOps' addon, enabled by the local spec): `kubectl top nodes` answers.
    let node_names: Vec<String> = kubeapi::nodes(&kc).unwrap().into_keys().collect();
    metrics::check(&kc, &node_names);

    // 7c''. The upstream conformance suite (docs/conformance.md): its focused set of [Conformance]
    //     tests — API machinery, DNS, Services, pod networking, volumes, kubelet, RBAC, DaemonSets,
    //     Deployments — runs while the certificates roll over (7d waits that long anyway), and
    //     every one of them must pass: the cluster conforms through its own certificate renewal.
    let conformance_log = std::env::temp_dir().join(format!("keelson-conformance-{}.log", std::process::id()));
    let mut conformance = support::Background::start(&["conformance", "--timeout", "1800"], conformance_log.clone());
    let conformance_started = std::time::Instant::now();

    // 7d. Certificates roll over on the running cluster: on every control plane etcd's peer and
    //     serving certificates and the API server's (protokube's renewal pass), on every worker the
    //     kubelet's and kube-proxy's (nodeup's timer joins again), each with a new serial and a
    //     later notAfter; protokube's expiry gauges show them fresh. All the while (since `up`) the
    //     API answered through the load balancer and no Node was NotReady.
    let deadline = std::time::Instant::now() + CERT_LIFETIME + Duration::from_secs(180);
    loop {
        let now = watched_certs(&cs.machines);
        let stale: Vec<String> =
            certs_at_start.iter().filter(|(k, serial)| now.get(*k).is_none_or(|s| s == *serial)).map(|((id, file), _)| format!("{id}:/{file}")).collect();
        if stale.is_empty() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "certificates with a lifetime of {CERT_LIFETIME:?} not renewed: {stale:?}");
        std::thread::sleep(Duration::from_secs(5));
    }
    for m in &cps {
        let metrics = machine::exec_in(m.init_pid.unwrap(), &["curl", "-fsS", "http://127.0.0.1:3998/metrics"]).unwrap_or_default();
        let gauge = |cert: &str| -> Option<f64> {
            let prefix = format!("keelson_certificate_expiry_seconds{{cert=\"{cert}\"}} ");
            metrics.lines().find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
        };
        for cert in ["etcd-main/peer", "etcd-main/server", "kube-apiserver/server", "kube-controller-manager/kubeconfig", "kubelet/client"] {
            let left = gauge(cert).unwrap_or_else(|| panic!("{}: no expiry gauge for {cert}:\n{metrics}", m.instance_id));
            assert!(left > 0.0 && left <= CERT_LIFETIME.as_secs_f64(), "{}: {cert} expires in {left} s", m.instance_id);
        }
        let renewals = metrics.lines().find_map(|l| l.strip_prefix("protokube_certificate_renewals_total ")?.trim().parse::<u64>().ok()).unwrap_or(0);
        assert!(renewals >= 1, "{}: protokube renewed nothing", m.instance_id);
        // Its API server restarted in turn (or at once, not serving anyway) — never because the
        // turn could not be had. The API servers take turns (each waits for the one before it to
        // be ready again), so the last may restart a while after its certificates were renewed:
        // bounded by API_SERVER_TURNS.
        let turns_deadline = std::time::Instant::now() + API_SERVER_TURNS;
        let journal = loop {
            let journal = machine::exec_in(m.init_pid.unwrap(), &["journalctl", "-u", "protokube.service", "-o", "cat", "--no-pager"]).unwrap_or_default();
            if journal.contains("API server restarted for its new certificates") || std::time::Instant::now() > turns_deadline {
                break journal;
            }
            std::thread::sleep(Duration::from_secs(5));
        };
        let restarts: Vec<&str> = journal.lines().filter(|l| l.contains("API server restarted for its new certificates")).collect();
        assert!(
            !restarts.is_empty(),
            "{}: protokube never restarted its API server for new certificates (waited {API_SERVER_TURNS:?} for its turn)",
            m.instance_id
        );
        for r in &restarts {
            assert!(r.contains("InTurn") || r.contains("was not ready"), "{}: an API server restart out of turn: {r}", m.instance_id);
        }
        eprintln!("{}: {}", m.instance_id, restarts.join(" | "));
    }
    // The kubelets were not restarted for their certificates (a restart can post a Node NotReady):
    // each read its renewed client certificate by itself — client-go logs the rotation — within
    // its 5-minute reload period (bounded wait).
    assert_eq!(kubelet_journal_count(&cs.machines, "Started kubelet"), kubelet_starts_at_start, "a kubelet was restarted while certificates rolled over");
    let deadline = std::time::Instant::now() + Duration::from_secs(330);
    loop {
        let picked_up = kubelet_journal_count(&cs.machines, "Certificate rotation detected");
        let missing: Vec<&String> = picked_up.iter().filter(|(_, n)| **n == 0).map(|(id, _)| id).collect();
        if missing.is_empty() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "kubelets that never read their renewed client certificate: {missing:?}");
        std::thread::sleep(Duration::from_secs(5));
    }
    let seen = watch.stop();
    eprintln!(
        "CERTIFICATES: rolled over; {} API probes, longest gap between answers {:.1}s, NotReady seen: {:?}",
        seen.probes,
        seen.longest_gap.as_secs_f64(),
        seen.not_ready
    );
    if !seen.not_ready.is_empty() {
        // What the kubelets of those Nodes said meanwhile (lease, status and certificate lines).
        let now_nodes = kubeapi::nodes(&kc).unwrap_or_default();
        for name in seen.not_ready.keys() {
            let Some(m) = now_nodes.get(name).and_then(|n| cs.machines.iter().find(|m| n.internal_ip.as_deref() == Some(m.ip.as_str()))) else { continue };
            let journal = m
                .init_pid
                .and_then(|pid| machine::exec_in(pid, &["journalctl", "-u", "kubelet.service", "--no-pager", "-o", "short-precise"]).ok())
                .unwrap_or_default();
            let lines: Vec<&str> =
                journal.lines().filter(|l| ["lease", "status", "Certificate", "Starting", "Stopped", "rror"].iter().any(|k| l.contains(k))).collect();
            eprintln!("{name} ({}): kubelet journal, last lines of interest:\n{}", m.instance_id, lines[lines.len().saturating_sub(40)..].join("\n"));
        }
    }
    assert!(seen.not_ready.is_empty(), "Nodes went NotReady while certificates rolled over: {:?}", seen.not_ready);
    // The API servers restart for their new certificates, each when its own renewal falls due; with
    // the test's 13-minute certificates the per-host skew spreads them over at most 80 s, so
    // they would overlap, but they take turns (protokube's `apiserver_turn`: one at a time, the next
    // only once the last is ready again), so the load balancer always has a ready API server.
    // Measured on keelson-local (2 cores): a 30-s bound failed in CI with overlapping restarts;
    // with turns, 1.2 s at a load average of 40.
    assert!(
        seen.longest_gap <= Duration::from_secs(10),
        "the API did not answer for {:?} while certificates rolled over (failures: {:?})",
        seen.longest_gap,
        seen.failures
    );
    let (ok, out) = conformance.finish(Duration::from_secs(2100));
    let _ = std::fs::remove_file(&conformance_log);
    let (passed, failed, _) = support::conformance_counts(&out);
    assert_eq!(failed, 0, "conformance tests failed while certificates rolled over (names and first error lines above)");
    assert!(passed > 0 && ok, "keelson-local conformance: {passed} passed, exit ok: {ok} (output above)");
    assert!(!out.contains("is not in this suite"), "a focused test name is not in the suite (output above)");
    eprintln!("CONFORMANCE: {passed} focused [Conformance] tests passed while certificates rolled over ({:.0} s)", conformance_started.elapsed().as_secs_f64());

    // 8. etcd backup and restore, one command: a namespace full of objects and 10k more keys, a
    //    backup asked for with `keelson etcd backup create`, the namespace deleted and the keys
    //    gone, then `keelson etcd backup restore --latest --yes`: everything is back (the API
    //    servers re-list: the restore bumps revisions and marks the old ones compacted) and
    //    `keelson validate cluster` is green. The restore time is printed.
    const OBJECTS: usize = 200;
    const KEYS: u64 = 10_000;
    let objects = State::new(paths::state_dir()).root.join("restore-objects.yaml");
    let mut list = String::from("apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Namespace\n  metadata:\n    name: restore-test\n");
    for i in 0..OBJECTS {
        list.push_str(&format!(
            "- apiVersion: v1\n  kind: ConfigMap\n  metadata:\n    name: cm-{i:04}\n    namespace: restore-test\n  data:\n    i: \"{i}\"\n"
        ));
    }
    // A Secret, encrypted at rest: the backup holds its ciphertext, and after the restore the API
    // servers still decrypt it (the key is the state store's, not the backup's).
    let backed_up = format!("backed-up-{}", std::process::id());
    list.push_str(&format!(
        "- apiVersion: v1\n  kind: Secret\n  metadata:\n    name: restore-secret\n    namespace: restore-test\n  stringData:\n    token: {backed_up}\n"
    ));
    std::fs::write(&objects, list).unwrap();
    assert!(support::run(&["kubectl", "apply", "-f", &objects.to_string_lossy()]).status.success());
    let configmaps = || -> usize {
        let o = support::run(&["kubectl", "get", "configmaps", "-n", "restore-test", "-o", "name"]);
        String::from_utf8_lossy(&o.stdout).lines().filter(|l| l.starts_with("configmap/cm-")).count()
    };
    assert_eq!(configmaps(), OBJECTS);
    assert!(raw_secret(cps[0], "restore-test", "restore-secret").starts_with("k8s:enc:secretbox:v1:"), "restore-test/restore-secret is not encrypted in etcd");
    let first = cps[0];
    let pid = first.init_pid.unwrap();
    let ep = etcd::endpoint(&first.root, "main").unwrap();
    etcd::write_keys(pid, &first.root, &ep, "/keelson-test/restore/", KEYS).unwrap();
    assert_eq!(etcd::count(pid, &ep, "/keelson-test/restore/"), Some(KEYS));
    let spec_arg = local_spec.to_string_lossy().to_string();
    let created = support::keelson_in_local_env(&["etcd", "backup", "create", "-f", &spec_arg, "--etcd-cluster", "main"]);
    assert!(created.status.success(), "keelson etcd backup create failed (output above)");
    assert!(String::from_utf8_lossy(&created.stdout).starts_with("created backup "));
    assert!(support::run(&["kubectl", "delete", "namespace", "restore-test", "--wait=true", "--timeout=120s"]).status.success());
    etcd::etcdctl(pid, &ep, &["del", "/keelson-test/restore/", "--prefix"]).unwrap();
    assert_eq!(etcd::count(pid, &ep, "/keelson-test/restore/"), Some(0));
    assert_eq!(configmaps(), 0);
    // One member's containerd loses the etcd image (as on an instance that never ran etcd): its
    // protokube must pull the image before it can run etcdutl from it.
    let last = cps[cps.len() - 1];
    let last_ep = etcd::endpoint(&last.root, "main").unwrap();
    let images = |m: &keelson_local::machine::MachineInfo| machine::exec_in(m.init_pid.unwrap(), &["ctr", "-n", "k8s.io", "images", "ls", "-q"]).unwrap();
    machine::exec_in(last.init_pid.unwrap(), &["ctr", "-n", "k8s.io", "images", "rm", &last_ep.image]).unwrap();
    assert!(!images(last).lines().any(|l| l == last_ep.image), "{} still holds {}", last.instance_id, last_ep.image);
    let t = std::time::Instant::now();
    let restored = support::keelson_in_local_env(&["etcd", "backup", "restore", "-f", &spec_arg, "--etcd-cluster", "main", "--latest", "--yes"]);
    let took = t.elapsed();
    assert!(restored.status.success(), "keelson etcd backup restore failed (output above)");
    assert!(images(last).lines().any(|l| l == last_ep.image), "{} did not pull {} back", last.instance_id, last_ep.image);
    eprintln!("RESTORE: etcd main, 3 members, {KEYS} keys + {OBJECTS} objects: {:.1}s (one member pulled the etcd image first)", took.as_secs_f64());
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    while configmaps() != OBJECTS {
        assert!(std::time::Instant::now() < deadline, "the restored ConfigMaps are not served within 180 s");
        std::thread::sleep(Duration::from_secs(2));
    }
    // The first reads after a restore may time out while an API server catches up with the
    // restored revision (its watch cache starts again); the Secret must come back, and decrypt.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let token = loop {
        let t = secret_token(&["-n", "restore-test", "restore-secret"]);
        if t.is_some() || std::time::Instant::now() > deadline {
            break t;
        }
        std::thread::sleep(Duration::from_secs(3));
    };
    assert_eq!(token.as_deref(), Some(backed_up.as_str()), "the Secret of the backup does not decrypt after the restore");
    for m in &cps {
        let raw = raw_secret(m, "restore-test", "restore-secret");
        assert!(
            raw.starts_with("k8s:enc:secretbox:v1:") && !raw.contains(&backed_up),
            "{}: restored restore-test/restore-secret is not ciphertext",
            m.instance_id
        );
    }
    for m in &cps {
        let ep = etcd::endpoint(&m.root, "main").unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let (keys, members) = (etcd::count(m.init_pid.unwrap(), &ep, "/keelson-test/restore/"), etcd::members(m.init_pid.unwrap(), &ep).map(|v| v.len()));
            if keys == Some(KEYS) && members == Some(3) {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{}: after the restore {keys:?} keys, {members:?} members", m.instance_id);
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    let v = support::keelson_in_local_env(&["validate", "cluster", "-f", &spec_arg, "--wait", "5m", "-o", "json"]);
    assert!(v.status.success(), "keelson validate cluster failed after the restore (output above)");
    eprintln!("RESTORE: cluster valid again {:.1}s after the restore began", t.elapsed().as_secs_f64());

    // 9. ps shows every machine.
    let ps = support::run(&["ps"]);
    assert!(ps.status.success());
    let text = String::from_utf8_lossy(&ps.stdout);
    for m in &cs.machines {
        assert!(text.contains(&m.instance_id), "ps does not list {}", m.instance_id);
    }

    // 10. kill: a terminated node's machine and namespace go away; its group's replacement boots,
    //    runs containerd and joins as a Ready Node; the CCM deletes the dead instance's Node. The
    //    first replacement is terminated too, as soon as its Node registers (before the CCM has
    //    initialised it, when it can): its Node must be deleted as well, and the next replacement
    //    joins.
    let victim = nodes[0].clone();
    let originals: Vec<String> = cs.machines.iter().map(|m| m.instance_id.clone()).collect();
    // Nodes are found by name (the instance's private DNS name, from its IP): a Node registered
    // without a providerID must be found too. A Node counts as the dead instance's while it
    // carries no providerID or that instance's.
    let name_of = |ip: &str| format!("ip-{}.", ip.replace('.', "-"));
    let node_named = |nodes: &BTreeMap<String, kubeapi::NodeState>, ip: &str| {
        nodes.iter().find(|(name, _)| name.starts_with(&name_of(ip))).map(|(k, v)| (k.clone(), v.clone()))
    };
    let still_there = |nodes: &BTreeMap<String, kubeapi::NodeState>, name: &str, id: &str| {
        nodes.get(name).is_some_and(|n| n.provider_id.as_deref().is_none_or(|p| p.ends_with(&format!("/{id}"))))
    };
    let victim_node = node_named(&kubeapi::nodes(&kc).unwrap(), &victim.ip).expect("the victim's Node").0;
    let out = support::run(&["kill", &victim.instance_id]);
    assert!(out.status.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    let (early, early_node) = loop {
        let cs = ClusterState::load(&State::new(paths::state_dir())).expect("cluster.json");
        let nodes_now = kubeapi::nodes(&kc).unwrap_or_default();
        let registered =
            cs.machines.iter().filter(|m| !originals.contains(&m.instance_id)).find_map(|m| node_named(&nodes_now, &m.ip).map(|n| (m.instance_id.clone(), n)));
        if let Some((id, (name, n))) = registered {
            let out = support::run(&["kill", &id]);
            assert!(out.status.success());
            let uninitialised = n.taints.iter().any(|t| t.starts_with("node.cloudprovider.kubernetes.io/uninitialized"));
            eprintln!(
                "step 10: killed the replacement {id} as its Node {name} registered (providerID {:?}; uninitialised by the CCM: {uninitialised})",
                n.provider_id
            );
            break (id, name);
        }
        assert!(std::time::Instant::now() < deadline, "no replacement of {} registered a Node within 240 s", victim.instance_id);
        std::thread::sleep(Duration::from_millis(200));
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    // The next replacement's Node: when it was first seen, and when it carried its group's labels.
    let mut replacement_seen: Option<(String, std::time::Instant)> = None;
    let mut labelled_after: Option<Duration> = None;
    loop {
        let cs = ClusterState::load(&State::new(paths::state_dir())).expect("cluster.json");
        let gone = [&victim.instance_id, &early].iter().all(|id| !cs.machines.iter().any(|m| &&m.instance_id == id))
            && !keelson_local::net::our_namespaces().contains(&victim.netns);
        let nodes_now = kubeapi::nodes(&kc).unwrap_or_default();
        let ready: Vec<String> = nodes_now.values().filter(|n| n.ready).filter_map(|n| n.internal_ip.clone()).collect();
        let replaced = cs
            .machines
            .iter()
            .filter(|m| m.role == "node")
            .filter(|m| m.init_pid.is_some_and(|p| machine::exec_in(p, &["ctr", "version"]).is_ok()) && ready.contains(&m.ip))
            .count()
            == 3;
        let nodes_deleted = !still_there(&nodes_now, &victim_node, &victim.instance_id) && !still_there(&nodes_now, &early_node, &early);
        let next = cs.machines.iter().find(|m| !originals.contains(&m.instance_id) && m.instance_id != early);
        if let (None, Some(m)) = (&replacement_seen, next) {
            if let Some((name, _)) = node_named(&nodes_now, &m.ip) {
                replacement_seen = Some((name, std::time::Instant::now()));
            }
        }
        if let (Some((name, seen)), None, Some(m)) = (&replacement_seen, labelled_after, next) {
            if keelson_local::cluster::group_label_problems(&cs.name, std::slice::from_ref(m), &nodes_now).is_empty() {
                labelled_after = Some(seen.elapsed());
                eprintln!(
                    "step 10: the replacement's Node {name} carried its group's labels {:.1} s after it was first seen (0.0: already when first seen; the harness polls every 0.5 s)",
                    seen.elapsed().as_secs_f64()
                );
            }
        }
        if gone && replaced && nodes_deleted && labelled_after.is_some() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "nodes {} and {early} not replaced within 300 s (machines gone={gone}, replaced={replaced}, their Nodes deleted={nodes_deleted}, \
             the replacement's Node {replacement_seen:?} labelled after {labelled_after:?})",
            victim.instance_id
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // A worker booting into a running cluster (what an autoscaled group's new instance does): its
    // user-data start to its Ready Node, the join by cloud identity included.
    let cs = ClusterState::load(&State::new(paths::state_dir())).expect("cluster.json");
    let fresh: Vec<_> = cs.machines.iter().filter(|m| !originals.contains(&m.instance_id) && m.instance_id != early).cloned().collect();
    let (boots, unmeasured) = keelson_local::cluster::boot_times::worker_boots(&fresh, &kubeapi::nodes(&kc).unwrap_or_default());
    eprintln!("step 10: {} {}", keelson_local::cluster::boot_times::summary(&boots).unwrap_or_else(|| "no worker boot time".into()), unmeasured.join("; "));

    // Step 10b: kOps' `delete instance`, the product's command run as an operator would: a worker,
    // named by its Node, is cordoned and drained, terminated and replaced by its group, and the
    // cluster is valid again with as many Nodes (the command validates before and after).
    let before = kubeapi::nodes(&kc).unwrap();
    let doomed = fresh.first().expect("a worker started in step 10");
    let (doomed_node, _) = node_named(&before, &doomed.ip).expect("the worker's Node");
    let t = std::time::Instant::now();
    let out = support::keelson_ok(&["delete", "instance", &doomed_node, "-f", &spec_arg, "--yes"]);
    let line = out.lines().find(|l| l.starts_with(&format!("instance {} deleted; its replacement ", doomed.instance_id)));
    assert!(line.is_some(), "keelson delete instance did not report {}'s replacement (output above)", doomed.instance_id);
    let secs = t.elapsed().as_secs_f64();
    // On AWS the cloud-controller-manager deletes the terminated instance's Node (kOps' rolling
    // update deletes Nodes itself only on GCE, where names come back): bounded wait for it.
    support::wait("the deleted instance's Node to be removed by the CCM", 180, || {
        kubeapi::nodes(&kc).is_ok_and(|n| !still_there(&n, &doomed_node, &doomed.instance_id))
    });
    let after = kubeapi::nodes(&kc).unwrap();
    assert_eq!(after.values().filter(|n| n.ready).count(), before.len(), "as many Ready Nodes as before: {after:?}");
    support::validate_green("5m", before.len());
    let cs = ClusterState::load(&State::new(paths::state_dir())).expect("cluster.json");
    assert!(!cs.machines.iter().any(|m| m.instance_id == doomed.instance_id), "{}'s machine is still running", doomed.instance_id);
    eprintln!("step 10b: keelson delete instance {doomed_node} -f SPEC --yes: drained, replaced and valid in {secs:.0} s ({})", line.unwrap_or_default());

    // Step 11: the IAM oracle over every call the machines made to moto in all of the above.
    let iam = support::run(&["iam-check"]);
    support::assert_iam_clean(&String::from_utf8_lossy(&iam.stdout));
    assert!(iam.status.success(), "keelson-local iam-check exited {:?}", iam.status);

    drop(down);
    support::assert_nothing_left();
}

/// What the certificates are short-lived to (test only): long enough for the cluster to come up,
/// short enough that every one of them is renewed during the test — and long enough that the
/// kubelet's is renewed with more than its 5-minute reload period left (it is renewed at
/// `KUBELET_CLIENT_LEAD`, at most half its life), so the kubelet reads the new one without a
/// restart, as it does with real lifetimes.
const CERT_LIFETIME: Duration = Duration::from_secs(780);

/// How long a control plane's API server may wait for its restart after its certificates were
/// renewed: protokube's longest wait for the turn (`apiserver_turn::MAX_WAIT`, 300 s) and for the
/// restarted server to be ready (`RESTART_TIMEOUT`, 150 s).
const API_SERVER_TURNS: Duration = Duration::from_secs(300 + 150);

/// instance → how many lines of its kubelet's journal contain `needle`.
fn kubelet_journal_count(machines: &[machine::MachineInfo], needle: &str) -> BTreeMap<String, usize> {
    machines
        .iter()
        .filter_map(|m| {
            let journal = machine::exec_in(m.init_pid?, &["journalctl", "-u", "kubelet.service", "-o", "cat", "--no-pager"]).ok()?;
            Some((m.instance_id.clone(), journal.lines().filter(|l| l.contains(needle)).count()))
        })
        .collect()
}

/// `(instance, file)` → serial of the certificates the test watches roll over.
fn watched_certs(machines: &[machine::MachineInfo]) -> BTreeMap<(String, &'static str), String> {
    let mut out = BTreeMap::new();
    for m in machines {
        let files: &[&'static str] = match m.role.as_str() {
            "control-plane" => &[
                "etc/kubernetes/pki/etcd/main/peer.crt",
                "etc/kubernetes/pki/etcd/main/server.crt",
                "srv/kubernetes/kube-apiserver/server.crt",
                "var/lib/kube-controller-manager/kubeconfig",
            ],
            _ => &["var/lib/kubelet/kubelet-client.pem", "var/lib/kube-proxy/kubeconfig"],
        };
        for f in files {
            let Ok(text) = std::fs::read_to_string(m.root.join(f)) else { continue };
            let pem = if f.ends_with("kubeconfig") {
                use base64::Engine as _;
                let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap_or_default();
                let data = doc["users"][0]["user"]["client-certificate-data"].as_str().unwrap_or_default().to_string();
                String::from_utf8(base64::engine::general_purpose::STANDARD.decode(data).unwrap_or_default()).unwrap_or_default()
            } else {
                text
            };
            if let Ok(info) = base::pki::describe_cert(&pem) {
                out.insert((m.instance_id.clone(), *f), info.serial);
            }
        }
    }
    out
}

/// A bounded watch on the running cluster: `/readyz` through the local load balancer every
/// half second, the Nodes every 3 s.
struct Watch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: std::thread::JoinHandle<Seen>,
}

#[derive(Debug, Default)]
struct Seen {
    probes: u64,
    longest_gap: Duration,
    failures: Vec<String>,
    /// Node → when (since the watch began) and why it was first seen NotReady.
    not_ready: BTreeMap<String, String>,
}

impl Watch {
    fn start(kubeconfig: std::path::PathBuf) -> Watch {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut seen = Seen::default();
            let mut last_ok = std::time::Instant::now();
            let mut nodes_at = std::time::Instant::now();
            let began = std::time::Instant::now();
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                seen.probes += 1;
                match kubeapi::readyz(&kubeconfig, &Target::default()) {
                    Ok(t) if t.trim() == "ok" => last_ok = std::time::Instant::now(),
                    r => {
                        if seen.failures.len() < 20 {
                            seen.failures.push(format!("{r:?}"));
                        }
                    }
                }
                seen.longest_gap = seen.longest_gap.max(last_ok.elapsed());
                if nodes_at.elapsed() >= Duration::from_secs(3) {
                    nodes_at = std::time::Instant::now();
                    if let Ok(nodes) = kubeapi::nodes(&kubeconfig) {
                        for (name, n) in nodes.iter().filter(|(_, n)| !n.ready) {
                            seen.not_ready.entry(name.clone()).or_insert_with(|| format!("at +{} s: {}", began.elapsed().as_secs(), n.ready_reason));
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            seen
        });
        Watch { stop, handle }
    }

    fn stop(self) -> Seen {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.handle.join().expect("watch thread")
    }
}

/// The raw value of a Secret in etcd main, read with etcdctl on control plane `m` (its member's
/// endpoint and certificates, from the etcd manifest).
fn raw_secret(m: &machine::MachineInfo, namespace: &str, name: &str) -> String {
    let ep = etcd::endpoint(&m.root, "main").unwrap_or_else(|| panic!("{}: no etcd-main manifest", m.instance_id));
    etcd::etcdctl(
        m.init_pid.unwrap_or_else(|| panic!("{}: not running", m.instance_id)),
        &ep,
        &["get", &format!("/registry/secrets/{namespace}/{name}"), "--print-value-only"],
    )
    .unwrap_or_else(|e| panic!("{}: etcdctl get /registry/secrets/{namespace}/{name}: {e}", m.instance_id))
}

/// The `token` of a Secret through the API (`kubectl get secret ARGS`), decoded.
fn secret_token(args: &[&str]) -> Option<String> {
    use base64::Engine as _;
    let mut a = vec!["kubectl", "get", "secret"];
    a.extend_from_slice(args);
    a.extend_from_slice(&["-o", "jsonpath={.data.token}"]);
    let out = support::run(&a);
    if !out.status.success() {
        return None;
    }
    let bytes = base64::engine::general_purpose::STANDARD.decode(String::from_utf8_lossy(&out.stdout).trim()).ok()?;
    String::from_utf8(bytes).ok()
}
