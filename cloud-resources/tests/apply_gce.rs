//! Apply and delete on GCE (the direct target on the Compute API) against the harness's Compute
//! emulator and a metadata server handing out the token, both in process on 127.0.0.1:
//! `examples/gce.yaml` with three control planes in europe-west1-b/c/d is created as the model says
//! (network, subnetwork, firewall rules, templates with their metadata, MIGs and their sizes, etcd
//! disks and their labels), a second apply plans nothing, a changed machine type is a new template
//! the MIG moves to (the old one deleted), a changed size a resize, a changed `sshAccess` a firewall
//! patch, and delete removes this cluster's resources and nothing of another cluster's.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use base::StateStore;
use cloud::gce::{GceEndpoints, TokenSource};
use cloud_resources::gce::GceTarget;
use cloud_resources::model::ClusterModel;
use cloud_resources::plan::{Action, Kind};
use serde_json::{json, Value};
use testkit::gce_compute::{Config, GceCompute};
use testkit::httpd::{Body, Request, Response, Server};

const PROJECT: &str = "acme-platform";
const CLUSTER: &str = "gce.k8s.example.com";

fn options() -> spec_compiler::CompileOptions {
    let asset = |a: &str| spec_compiler::userdata::NodeupAsset::parse(a).expect("asset");
    let amd64 = spec_compiler::versions::Arch::parse("amd64").expect("arch");
    spec_compiler::CompileOptions {
        nodeup_assets: [(amd64, asset("8b1a9953c4611296a827abf8c47804d7e6c49c6b8f0b8c1f4ee3a5e6a1b1c2d3@https://nodeup.mirror.test/amd64/nodeup"))].into(),
        protokube_assets: [(amd64, asset("5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8@https://nodeup.mirror.test/amd64/protokube"))]
            .into(),
        ..Default::default()
    }
}

/// `examples/gce.yaml` with three control planes, one in each of europe-west1-b, -c and -d (as
/// it is, when the example already has them).
fn spec_text() -> String {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/gce.yaml")).expect("example");
    if text.contains("control-plane-europe-west1-c") {
        return text;
    }
    let member = "    - name: a\n      instanceGroup: control-plane-europe-west1-b\n";
    assert!(text.contains(member), "examples/gce.yaml changed shape: update this test");
    let members: String = ["b", "c", "d"].iter().map(|z| format!("    - name: {z}\n      instanceGroup: control-plane-europe-west1-{z}\n")).collect();
    let text = text.replace(member, &members);
    let (head, rest) = text
        .split_once("---\napiVersion: kops.k8s.io/v1alpha2\nkind: InstanceGroup\nmetadata:\n  name: control-plane-europe-west1-b")
        .expect("the control plane group");
    let (cp, nodes) = rest.split_once("---").expect("the nodes group");
    let cp = format!("---\napiVersion: kops.k8s.io/v1alpha2\nkind: InstanceGroup\nmetadata:\n  name: control-plane-europe-west1-b{cp}");
    let all: String = ["b", "c", "d"].iter().map(|z| cp.replace("europe-west1-b", &format!("europe-west1-{z}"))).collect();
    format!("{head}{all}---{nodes}")
}

fn model_of(text: &str) -> ClusterModel {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("cluster.yaml");
    std::fs::write(&path, text).expect("write spec");
    let docs = spec_compiler::load::load_spec(&path).unwrap_or_else(|e| panic!("{e}"));
    let compiled = spec_compiler::compile(&docs, &options()).unwrap_or_else(|e| panic!("{e}"));
    cloud_resources::model::build(&docs, &compiled).unwrap_or_else(|e| panic!("{e}"))
}

struct World {
    compute: GceCompute,
    _server: Server,
    _meta: Server,
    target: GceTarget,
    store_dir: tempfile::TempDir,
}

fn world() -> World {
    let compute = GceCompute::new(Config {
        project: PROJECT.into(),
        operation_delay: Duration::from_millis(20),
        boot_delay: Some(Duration::from_millis(10)),
        ..Config::example()
    });
    let server = compute.start();
    let facts = testkit::gce_metadata::InstanceFacts { project: PROJECT.into(), ..testkit::gce_metadata::InstanceFacts::example() };
    let mut values = facts.values();
    values.insert("instance/service-accounts/default/token".into(), json!({"access_token": "tok", "expires_in": 3599, "token_type": "Bearer"}).to_string());
    let meta = Server::start(Arc::new(move |req: &Request| testkit::gce_metadata::answer(&values, req)));
    let md = base::gce_metadata::GceMetadata::new(Some(&meta.url("")), Duration::from_secs(5)).expect("metadata client");
    let mut target =
        GceTarget::new(&GceEndpoints::at(&server.url("")), server.url("").trim_end_matches('/'), PROJECT, TokenSource::new(md), Duration::from_secs(30))
            .expect("target");
    target.dependency_delay = Duration::from_millis(50);
    World { compute, _server: server, _meta: meta, target, store_dir: tempfile::tempdir().expect("tempdir") }
}

impl World {
    fn store(&self, cluster: &str) -> StateStore {
        StateStore::dir(&self.store_dir.path().join(cluster))
    }

    /// One Compute GET, as an operator would make it (straight to the emulator).
    fn get(&self, path: &str) -> Value {
        let req = Request {
            method: "GET".into(),
            path: format!("/compute/v1/projects/{PROJECT}/{path}"),
            query: String::new(),
            headers: vec![("authorization".into(), "Bearer test".into())],
            peer: "127.0.0.1:1".into(),
            body: vec![],
        };
        let r: Response = self.compute.answer(&req);
        let Body::Bytes(b) = r.body else { panic!("not bytes") };
        assert_eq!(r.status, 200, "GET {path}: {}", String::from_utf8_lossy(&b));
        serde_json::from_slice(&b).expect("json")
    }

    fn items(&self, path: &str) -> Vec<Value> {
        self.get(path)["items"].as_array().cloned().unwrap_or_default()
    }

    fn names(&self, path: &str) -> Vec<String> {
        let mut n: Vec<String> = self.items(path).iter().map(|i| i["name"].as_str().unwrap_or_default().to_string()).collect();
        n.sort();
        n
    }

    /// The disks with a cluster label (the instances' boot disks have none).
    fn labelled_disks(&self) -> Vec<testkit::gce_compute::DiskView> {
        self.compute.disks().into_iter().filter(|d| d.labels.contains_key("k8s-io-cluster-name")).collect()
    }

    fn zonal(&self, collection: &str) -> Vec<Value> {
        ["b", "c", "d"].iter().flat_map(|z| self.items(&format!("zones/europe-west1-{z}/{collection}"))).collect()
    }

    async fn apply(&self, model: &ClusterModel) -> cloud_resources::GcePlan {
        let store = self.store(&model.cluster);
        let planned = cloud_resources::plan_apply_gce(&self.target, model, &store).await.expect("plan");
        cloud_resources::execute_gce(&self.target, model, &store, &planned).await.expect("apply");
        planned
    }

    async fn plan(&self, model: &ClusterModel) -> cloud_resources::plan::Plan {
        cloud_resources::plan_apply_gce(&self.target, model, &self.store(&model.cluster)).await.expect("plan").plan
    }

    async fn delete(&self, model: &ClusterModel, volumes: bool) -> cloud_resources::plan::Plan {
        let store = self.store(&model.cluster);
        let planned = cloud_resources::plan_delete_gce(&self.target, model, &store, volumes).await.expect("plan delete");
        cloud_resources::execute_gce(&self.target, model, &store, &planned).await.expect("delete");
        planned.plan
    }
}

fn metadata(t: &Value) -> BTreeMap<String, String> {
    t["properties"]["metadata"]["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| (i["key"].as_str().unwrap_or_default().to_string(), i["value"].as_str().unwrap_or_default().to_string()))
        .collect()
}

fn labels(v: &Value) -> BTreeMap<String, String> {
    v.as_object().map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string())).collect()).unwrap_or_default()
}

fn last(s: &str) -> &str {
    s.rsplit('/').next().unwrap_or(s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_creates_what_the_model_says_and_a_second_apply_plans_nothing() {
    let w = world();
    let model = model_of(&spec_text());
    assert_eq!(model.gce.instance_group_managers.iter().filter(|m| m.name.contains("control-plane")).count(), 3, "three control planes");
    let planned = w.apply(&model).await;
    let created = planned.plan.changes.iter().filter(|c| c.action == Action::Create).count();
    assert_eq!(planned.plan.counts(), (created, 0, 0), "{}", planned.plan.render(false));

    assert_eq!(w.names("global/networks"), ["gce-k8s-example-com"]);
    let subnets = w.items("regions/europe-west1/subnetworks");
    assert_eq!(subnets.len(), model.gce.subnetworks.len());
    assert_eq!(last(subnets[0]["network"].as_str().unwrap_or_default()), "gce-k8s-example-com");
    let mut want_fw: Vec<String> = model.gce.firewalls.iter().map(|f| f.name.clone()).collect();
    want_fw.sort();
    assert!(want_fw.contains(&"node-to-node-gce-k8s-example-com".to_string()), "{want_fw:?}");
    assert_eq!(w.names("global/firewalls"), want_fw);
    let ssh = w.get("global/firewalls/ssh-external-to-master-gce-k8s-example-com");
    assert_eq!(ssh["sourceRanges"], json!(["0.0.0.0/0"]));
    assert_eq!(ssh["targetTags"], json!(["gce-k8s-example-com-k8s-io-role-master"]));

    // Templates: one per instance group, the metadata as kOps writes it, the user-data exactly the model's.
    let templates = w.items("global/instanceTemplates");
    assert_eq!(templates.len(), model.gce.instance_templates.len());
    for t in &model.gce.instance_templates {
        let name = &planned.names.templates[&t.name];
        let found = templates.iter().find(|x| x["name"] == json!(name)).unwrap_or_else(|| panic!("template {name}"));
        let md = metadata(found);
        assert_eq!(md.get("user-data").map(String::as_bytes), Some(t.user_data.as_slice()), "{name}: user-data");
        assert!(!md.contains_key("startup-script"), "{name}: user-data, not startup-script, by default");
        assert_eq!(md["cluster-name"], CLUSTER);
        assert_eq!(md["kops-k8s-io-instance-group-name"], t.group);
        assert_eq!(found["properties"]["machineType"], json!(t.machine_type));
        assert_eq!(labels(&found["properties"]["labels"]), t.labels);
        // Each role its own service account and scopes: nodes never get cloud-platform.
        let account = found["properties"]["serviceAccounts"][0].clone();
        let prefix = if t.group.starts_with("control-plane") { "control-plane-gce-k8s-e-" } else { "node-gce-k8s-example-com@" };
        assert!(account["email"].as_str().is_some_and(|e| e.starts_with(prefix) && e.ends_with("@acme-platform.iam.gserviceaccount.com")), "{name}: {account}");
        let cloud_platform = account["scopes"].as_array().is_some_and(|s| s.contains(&json!("https://www.googleapis.com/auth/cloud-platform")));
        assert_eq!(cloud_platform, t.group.starts_with("control-plane"), "{name}: {account}");
    }

    // The accounts exist; the control plane holds its one project role, the node none; the
    // state store bucket grants each role its prefix under a condition.
    let iam = w.compute.iam();
    let mut accounts = iam.account_emails();
    accounts.sort();
    let node = "node-gce-k8s-example-com@acme-platform.iam.gserviceaccount.com";
    assert_eq!(accounts.len(), 2, "{accounts:?}");
    assert!(accounts.iter().any(|a| a == node), "{accounts:?}");
    let cp = accounts.iter().find(|a| a.starts_with("control-plane-")).cloned().expect("control-plane account");
    let project = iam.project_policy().to_string();
    assert!(project.contains(&format!("serviceAccount:{cp}")) && project.contains("roles/container.serviceAgent"), "{project}");
    assert!(!project.contains(node), "nodes get no project role: {project}");
    let bucket = iam.bucket_policy("acme-keelson-state");
    let caller = |email: &str, scopes: &[&str]| testkit::gce_iam::Caller {
        member: format!("serviceAccount:{email}"),
        scopes: scopes.iter().map(|s| s.to_string()).collect(),
    };
    let node_caller = caller(node, &["https://www.googleapis.com/auth/devstorage.read_only"]);
    let cp_caller = caller(&cp, &["https://www.googleapis.com/auth/cloud-platform"]);
    let object = |k: &str| format!("projects/_/buckets/acme-keelson-state/objects/{CLUSTER}/{k}");
    let decide = |c: &testkit::gce_iam::Caller, perm: &str, k: &str| testkit::gce_iam::authorize(&json!({}), &bucket, c, perm, &object(k)).is_ok();
    assert!(decide(&node_caller, "storage.objects.get", "igconfig/node/nodes-europe-west1-b/nodeupconfig.yaml"), "{bucket}");
    for secret in ["pki/private/kubernetes-ca/keyset.yaml", "secrets/encryptionconfig", "backups/etcd/main/x", "addons/bootstrap-channel.yaml"] {
        assert!(!decide(&node_caller, "storage.objects.get", secret), "a node reads {secret}: {bucket}");
    }
    assert!(!decide(&node_caller, "storage.objects.create", "igconfig/node/_api-servers.yaml"));
    assert!(decide(&cp_caller, "storage.objects.get", "pki/private/kubernetes-ca/keyset.yaml"));
    assert!(decide(&cp_caller, "storage.objects.create", "backups/etcd/main/x"));

    // One MIG per group and zone, at the model's size, on its group's template; the instances run.
    let migs = w.zonal("instanceGroupManagers");
    assert_eq!(migs.len(), model.gce.instance_group_managers.len());
    for m in &model.gce.instance_group_managers {
        let found = migs.iter().find(|x| x["name"] == json!(m.gce_name)).unwrap_or_else(|| panic!("MIG {}", m.gce_name));
        assert_eq!(last(found["zone"].as_str().unwrap_or_default()), m.zone);
        assert_eq!(found["targetSize"], json!(m.target_size), "{}", m.gce_name);
        assert_eq!(last(found["instanceTemplate"].as_str().unwrap_or_default()), planned.names.templates[m.template.name()]);
    }
    let total: i64 = model.gce.instance_group_managers.iter().map(|m| m.target_size).sum();
    assert_eq!(w.compute.instances().len() as i64, total);

    // The etcd disks: one per member and etcd cluster, in the member's zone, with kOps' labels.
    let disks = w.labelled_disks();
    assert_eq!(disks.len(), 6, "{disks:?}");
    for d in &model.gce.disks {
        let found = disks.iter().find(|x| x.name == d.gce_name).unwrap_or_else(|| panic!("disk {}", d.gce_name));
        assert_eq!(found.zone, d.zone);
        assert_eq!(found.labels, d.labels);
        assert_eq!(found.size_gb, d.size_gb as u64);
    }
    assert_eq!(disks.iter().filter(|d| d.labels.get("k8s-io-etcd-main").is_some_and(|v| v.ends_with("-2fb-2cc-2cd"))).count(), 3, "{disks:?}");

    let again = w.plan(&model).await;
    assert!(again.is_empty(), "a second apply plans nothing:\n{}", again.render(false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_are_a_new_template_a_resize_and_a_firewall_patch() {
    let w = world();
    let text = spec_text();
    let model = model_of(&text);
    let first = w.apply(&model).await;
    let nodes_tpl = model.gce.instance_templates.iter().find(|t| t.group == "nodes-europe-west1-b").expect("nodes template");
    let old = first.names.templates[&nodes_tpl.name].clone();

    let changed = text
        .replacen(
            "machineType: e2-standard-4",
            "machineType: e2-standard-8\n  rootVolumeType: hyperdisk-balanced\n  rootVolumeIops: 6000\n  rootVolumeThroughput: 200",
            1,
        )
        .replacen("minSize: 2", "minSize: 3", 1)
        .replace("sshAccess:\n  - 0.0.0.0/0", "sshAccess:\n  - 10.0.0.0/8");
    assert_ne!(changed, text);
    let model2 = model_of(&changed);
    let planned = w.apply(&model2).await;
    let text_plan = planned.plan.render(false);
    let of = |kind: Kind, action: fn(&Action) -> bool| {
        planned.plan.changes.iter().filter(|c| c.kind == kind && action(&c.action)).map(|c| c.name.clone()).collect::<Vec<_>>()
    };
    let new = planned.names.templates[&nodes_tpl.name].clone();
    assert_ne!(new, old, "a changed template is a new name");
    assert_eq!(of(Kind::GceInstanceTemplate, |a| *a == Action::Create), std::slice::from_ref(&new), "{text_plan}");
    assert_eq!(of(Kind::GceInstanceTemplate, |a| *a == Action::Delete), std::slice::from_ref(&old), "{text_plan}");
    assert_eq!(of(Kind::GceInstanceGroupManager, |a| matches!(a, Action::Update(_))), ["b-nodes-europe-west1-b-gce-k8s-example-com"], "{text_plan}");
    assert!(text_plan.contains(&format!("template: {old} → {new}")) && text_plan.contains("target_size: 2 → 3"), "{text_plan}");
    assert_eq!(planned.plan.rolling.len(), 1, "the running nodes are on the old template: {text_plan}");
    assert_eq!(planned.plan.rolling[0].instances.len(), 2, "{text_plan}");
    let mut patched = of(Kind::GceFirewall, |a| matches!(a, Action::Update(_)));
    patched.sort();
    assert_eq!(patched, ["ssh-external-to-master-gce-k8s-example-com", "ssh-external-to-node-gce-k8s-example-com"], "{text_plan}");
    assert!(planned.plan.changes.iter().all(|c| c.kind != Kind::GceDisk), "disks are never touched: {text_plan}");

    let mig = w.get("zones/europe-west1-b/instanceGroupManagers/b-nodes-europe-west1-b-gce-k8s-example-com");
    assert_eq!(last(mig["instanceTemplate"].as_str().unwrap_or_default()), new);
    assert_eq!(mig["targetSize"], json!(3));
    let tpl = w.get(&format!("global/instanceTemplates/{new}"));
    assert_eq!(tpl["properties"]["machineType"], json!("e2-standard-8"));
    // A hyperdisk boot disk with its provisioned IOPS and throughput (the spec's rootVolume* fields),
    // read back as sent: the second plan below is empty.
    let params = &tpl["properties"]["disks"][0]["initializeParams"];
    assert_eq!(
        (&params["diskType"], &params["provisionedIops"], &params["provisionedThroughput"]),
        (&json!("hyperdisk-balanced"), &json!("6000"), &json!("200")),
        "{params}"
    );
    assert!(!w.names("global/instanceTemplates").contains(&old), "the old template is deleted");
    assert_eq!(w.get("global/firewalls/ssh-external-to-node-gce-k8s-example-com")["sourceRanges"], json!(["10.0.0.0/8"]));

    let again = w.plan(&model2).await;
    assert!(again.is_empty(), "{}", again.render(false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_removes_this_cluster_and_nothing_of_another() {
    let w = world();
    let text = spec_text();
    let model = model_of(&text);
    let other = model_of(&text.replace(CLUSTER, "other.k8s.example.com"));
    w.apply(&model).await;
    w.apply(&other).await;
    let before = (w.names("global/networks").len(), w.names("global/firewalls").len(), w.names("global/instanceTemplates").len(), w.labelled_disks().len());
    assert_eq!(before.0, 2);
    assert_eq!(before.3, 12);

    let plan = w.delete(&model, false).await;
    assert!(plan.notes.iter().any(|n| n.contains("etcd disks are kept")), "{}", plan.render(false));
    assert_eq!(w.labelled_disks().len(), 12, "without --delete-volumes the disks stay");
    let plan = w.delete(&model, true).await;
    assert_eq!(plan.changes.iter().filter(|c| c.kind == Kind::GceDisk).count(), 6, "{}", plan.render(false));

    // Everything of this cluster is gone; the other's is all there.
    assert_eq!(w.names("global/networks"), ["other-k8s-example-com"]);
    assert!(w.names("global/firewalls").iter().all(|f| f.ends_with("-other-k8s-example-com")));
    assert_eq!(w.names("global/firewalls").len(), before.1 / 2);
    assert_eq!(w.names("global/instanceTemplates").len(), before.2 / 2);
    assert!(w.items("global/instanceTemplates").iter().all(|t| metadata(t)["cluster-name"] == "other.k8s.example.com"));
    assert!(w.zonal("instanceGroupManagers").iter().all(|m| m["name"].as_str().unwrap_or_default().ends_with("-other-k8s-example-com")));
    assert_eq!(w.zonal("instanceGroupManagers").len(), other.gce.instance_group_managers.len());
    let disks = w.labelled_disks();
    assert_eq!(disks.len(), 6);
    assert!(disks.iter().all(|d| d.labels["k8s-io-cluster-name"] == "other-k8s-example-com"), "{disks:?}");
    assert!(w.compute.instances().iter().all(|i| i.metadata.get("cluster-name").map(String::as_str) == Some("other.k8s.example.com")));
    assert!(w.plan(&other).await.is_empty(), "the other cluster is untouched");
    // Its accounts and grants are gone; the other cluster's are kept.
    let iam = w.compute.iam();
    assert!(iam.account_emails().iter().all(|a| a.contains("-other-k8s-")), "{:?}", iam.account_emails());
    assert_eq!(iam.account_emails().len(), 2);
    let bucket = iam.bucket_policy("acme-keelson-state").to_string();
    assert!(!bucket.contains("gce-k8s-"), "{bucket}");
    assert!(bucket.contains("node-other-k8s-example-com@"), "{bucket}");
    assert!(!iam.project_policy().to_string().contains("gce-k8s-"), "{}", iam.project_policy());
    let empty = cloud_resources::plan_delete_gce(&w.target, &model, &w.store(&model.cluster), true).await.expect("plan");
    assert!(empty.plan.changes.iter().all(|c| c.kind == Kind::StateFile || c.kind == Kind::Keyset), "{}", empty.plan.render(false));
}
