//! `keelson apply` (the command) against a real moto server started by each test (127.0.0.1 only):
//! plan by default in plain text when not a terminal, `--yes` applies, and the state-store lock
//! keeps concurrent runs apart. The direct target itself is tested in keelson-cloud-resources.

#[path = "../../cloud-resources/tests/moto/mod.rs"]
mod moto;

use aws_sdk_ec2::types::Filter;
use base::StateStore;
use moto::{Moto, BUCKET, CLUSTER};

/// examples/minimal.yaml pointed at the test bucket, zone and image, in a file.
fn spec_file(ami: &str) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().expect("tmp");
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/minimal.yaml")).expect("example");
    let text = text
        .replace("s3://acme-keelson-state/", &format!("s3://{BUCKET}/"))
        .replace("099720109477/ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-20250610", ami)
        .replace("  cloudProvider: aws\n", &format!("  cloudProvider: aws\n  dnsZone: {}\n", moto::ZONE));
    std::fs::write(file.path(), text).expect("write spec");
    file
}

fn apply(spec: &tempfile::NamedTempFile, moto: &Moto, extra: &[&str]) -> std::process::Output {
    let run = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_keelson"))
            .args(["apply", "-f", &spec.path().display().to_string(), "--offline", "--endpoint-url", &moto.url])
            .args(["--nodeup-asset", moto::NODEUP_AMD64, "--protokube-asset", moto::PROTOKUBE_AMD64])
            .args(extra)
            .env_remove("KOPS_FEATURE_FLAGS")
            .env("KEELSON_LOG", "spec_compiler=info")
            .output()
            .expect("run keelson")
    };
    let out = tokio::task::block_in_place(run);
    // Every apply that runs compiles the spec once: where the cluster lives comes from the spec,
    // and the one compile has the state store's CA pinned.
    let compiles = String::from_utf8_lossy(&out.stderr).lines().filter(|l| l.contains("compiling")).count();
    assert!(!out.status.success() || compiles == 1, "apply {extra:?} compiled {compiles} times:\n{}", String::from_utf8_lossy(&out.stderr));
    out
}

async fn vpcs(moto: &Moto) -> usize {
    let t = moto.target(&[]).await;
    let filter = Filter::builder().name("tag:KubernetesCluster").values(CLUSTER).build();
    t.ec2.describe_vpcs().filters(filter).send().await.expect("vpcs").vpcs().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_plans_by_default_applies_with_yes_and_then_has_no_changes() {
    let moto = Moto::start();
    let ami = moto.fixtures().await;
    let spec = spec_file(&ami);
    let out = apply(&spec, &moto, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("+ LaunchTemplate nodes-us-east-1a.minimal.k8s.example.com") && stdout.contains("Run with --yes to apply."), "{stdout}");
    assert_eq!(vpcs(&moto).await, 0, "a plan writes nothing");

    let out = apply(&spec, &moto, &["--yes"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(vpcs(&moto).await, 1);

    // The CLI plan after apply: nothing to do, plain text when not a terminal.
    let out = apply(&spec, &moto, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("No changes."), "{stdout}");
    assert!(!stdout.contains('\x1b'), "no colour when not a terminal");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lock_stops_apply_until_force_unlock_takes_it_over() {
    let moto = Moto::start();
    let ami = moto.fixtures().await;
    let spec = spec_file(&ami);
    let t = moto.target(&[]).await;
    let s = StateStore::open_with_s3(&format!("s3://{BUCKET}/{CLUSTER}").parse().expect("configBase"), Some(t.s3.clone()), std::time::Duration::from_secs(30))
        .expect("store");
    let held = s.lock("apply").await.expect("lock");

    // Refused while held, saying how to take it over; nothing created.
    let out = apply(&spec, &moto, &["--yes"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "applied despite the lock");
    assert!(stderr.contains("locked by another run") && stderr.contains("--force-unlock"), "{stderr}");
    assert_eq!(vpcs(&moto).await, 0, "nothing was created");

    // A dead run's lock is taken over with --force-unlock; the lock is released afterwards.
    let out = apply(&spec, &moto, &["--yes", "--force-unlock"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("removed the lock held by keelson apply"));
    assert_eq!(vpcs(&moto).await, 1);
    assert!(s.get(base::store::LOCK_FILE).await.expect("get").is_none(), "released");
    held.release().await.expect("the old holder's release leaves nothing behind");
    let again = apply(&spec, &moto, &["--yes"]);
    assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
}

/// `keelson get instances -o json` against moto, the Kubernetes API unreachable.
fn get_instances(spec: &tempfile::NamedTempFile, moto: &Moto) -> (Vec<serde_json::Value>, String) {
    let run = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_keelson"))
            .args(["get", "instances", "-f", &spec.path().display().to_string(), "--offline", "--endpoint-url", &moto.url, "-o", "json"])
            .args(["--nodeup-asset", moto::NODEUP_AMD64, "--protokube-asset", moto::PROTOKUBE_AMD64])
            .env("KUBECONFIG", "/nonexistent/kubeconfig")
            .env_remove("KOPS_FEATURE_FLAGS")
            .output()
            .expect("run keelson")
    };
    let out = tokio::task::block_in_place(run);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "get instances: {stderr}");
    (serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("get instances -o json: {e}: {}", String::from_utf8_lossy(&out.stdout))), stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_instances_lists_the_groups_instances_and_which_need_an_update() {
    let moto = Moto::start();
    let ami = moto.fixtures().await;
    let spec = spec_file(&ami);
    assert!(apply(&spec, &moto, &["--yes"]).status.success());

    let (rows, stderr) = get_instances(&spec, &moto);
    assert!(stderr.contains("cannot list node names"), "the unreachable API is a warning, not an error: {stderr}");
    let brief = |rows: &[serde_json::Value]| {
        let mut b: Vec<(String, String, String, String)> = rows
            .iter()
            .map(|r| {
                let s = |k: &str| r[k].as_str().unwrap_or_else(|| panic!("{k} in {r}")).to_string();
                (s("instanceGroup"), r["roles"][0].as_str().unwrap_or_default().to_string(), s("machineType"), s("status"))
            })
            .collect();
        b.sort();
        b
    };
    let node = |status: &str| ("nodes-us-east-1a".to_string(), "node".to_string(), "t3.medium".to_string(), status.to_string());
    let cp = ("control-plane-us-east-1a".to_string(), "control-plane".to_string(), "m6i.large".to_string(), "UpToDate".to_string());
    assert_eq!(brief(&rows), [cp.clone(), node("UpToDate"), node("UpToDate")], "{rows:#?}");
    // What moto launched, by id and address.
    let t = moto.target(&[]).await;
    let filter = Filter::builder().name("tag:KubernetesCluster").values(CLUSTER).build();
    let described = t.ec2.describe_instances().filters(filter).send().await.expect("instances");
    let mut ids: Vec<(String, String)> = described
        .reservations()
        .iter()
        .flat_map(|r| r.instances())
        .filter(|i| i.state().and_then(|s| s.name()).is_some_and(|n| n.as_str() == "running"))
        .map(|i| (i.instance_id().unwrap_or_default().to_string(), i.private_ip_address().unwrap_or_default().to_string()))
        .collect();
    ids.sort();
    let mut listed: Vec<(String, String)> =
        rows.iter().map(|r| (r["id"].as_str().unwrap().to_string(), r["internalIP"].as_str().unwrap().to_string())).collect();
    listed.sort();
    assert_eq!(listed, ids);
    assert!(rows.iter().all(|r| r.get("nodeName").is_none()), "no Node names without the API: {rows:#?}");

    // A new machine type for the nodes: their template changes, their instances need an update.
    let text = std::fs::read_to_string(spec.path()).expect("spec").replace("machineType: t3.medium", "machineType: t3.large");
    std::fs::write(spec.path(), text).expect("write spec");
    assert!(apply(&spec, &moto, &["--yes"]).status.success());
    let (rows, _) = get_instances(&spec, &moto);
    assert_eq!(brief(&rows), [cp, node("NeedsUpdate"), node("NeedsUpdate")], "{rows:#?}");

    // `toolbox dump`: the same instances with zone, configurations and volumes (EC2's own).
    let out = tokio::task::block_in_place(|| {
        std::process::Command::new(env!("CARGO_BIN_EXE_keelson"))
            .args(["toolbox", "dump", "-f", &spec.path().display().to_string(), "--offline", "--endpoint-url", &moto.url, "-o", "json"])
            .args(["--nodeup-asset", moto::NODEUP_AMD64, "--protokube-asset", moto::PROTOKUBE_AMD64])
            .env("KUBECONFIG", "/nonexistent/kubeconfig")
            .env_remove("KOPS_FEATURE_FLAGS")
            .output()
            .expect("run keelson")
    });
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let dump: serde_json::Value = serde_json::from_slice(&out.stdout).expect("toolbox dump -o json");
    let instances = dump["instances"].as_array().expect("instances");
    assert_eq!(instances.len(), 3, "{dump:#}");
    let described =
        t.ec2.describe_instances().filters(Filter::builder().name("tag:KubernetesCluster").values(CLUSTER).build()).send().await.expect("instances");
    for i in instances {
        assert_eq!(i["zone"], "us-east-1a", "{i}");
        let node = i["instanceGroup"] == "nodes-us-east-1a";
        assert_eq!((i["launchedFrom"] == "1", i["groupLaunches"] == if node { "2" } else { "1" }), (true, true), "{i}");
        let ec2 = described.reservations().iter().flat_map(|r| r.instances()).find(|x| x.instance_id() == i["id"].as_str()).expect("in EC2");
        let volumes: Vec<&str> = ec2.block_device_mappings().iter().filter_map(|b| b.ebs().and_then(|e| e.volume_id())).collect();
        assert_eq!(i["volumes"], serde_json::json!(volumes), "{i}");
    }
}

/// `keelson delete instance NAME` with fast pauses, a validation command that passes, and `extra`.
fn delete_instance(spec: &tempfile::NamedTempFile, moto: &Moto, name: &str, extra: &[&str]) -> std::process::Output {
    let run = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_keelson"))
            .args(["delete", "instance", name, "-f", &spec.path().display().to_string(), "--offline", "--endpoint-url", &moto.url])
            .args(["--nodeup-asset", moto::NODEUP_AMD64, "--protokube-asset", moto::PROTOKUBE_AMD64])
            .args(["--validate-command", "true", "--validate-count", "1", "--node-interval", "0s", "--post-drain-delay", "0s"])
            .args(["--poll-interval", "1s", "--validation-timeout", "90s"])
            .args(extra)
            .env_remove("KOPS_FEATURE_FLAGS")
            .output()
            .expect("run keelson")
    };
    tokio::task::block_in_place(run)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_instance_replaces_that_instance_and_no_other() {
    let moto = Moto::start();
    let ami = moto.fixtures().await;
    let spec = spec_file(&ami);
    assert!(apply(&spec, &moto, &["--yes"]).status.success());
    let (rows, _) = get_instances(&spec, &moto);
    let ids_of = |rows: &[serde_json::Value], group: &str| -> Vec<String> {
        let mut v: Vec<String> = rows.iter().filter(|r| r["instanceGroup"] == group).map(|r| r["id"].as_str().unwrap().to_string()).collect();
        v.sort();
        v
    };
    let (nodes, cps) = (ids_of(&rows, "nodes-us-east-1a"), ids_of(&rows, "control-plane-us-east-1a"));
    assert_eq!((nodes.len(), cps.len()), (2, 1), "{rows:#?}");

    // Unknown names are refused with what exists; a plan changes nothing.
    let out = delete_instance(&spec, &moto, "i-00000000000000000", &["--yes"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("no instance or node named \"i-00000000000000000\"") && stderr.contains(&nodes[0]), "{stderr}");
    let out = delete_instance(&spec, &moto, &nodes[0], &[]);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("Run with --yes"), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(ids_of(&get_instances(&spec, &moto).0, "nodes-us-east-1a"), nodes, "a plan replaces nothing");

    // The node group surges (maxSurge 1 on AWS): the replacement starts first, then the instance goes.
    let out = delete_instance(&spec, &moto, &nodes[0], &["--yes"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(&format!("instance {} deleted", nodes[0])), "{stdout}");
    let (after, _) = get_instances(&spec, &moto);
    let now = ids_of(&after, "nodes-us-east-1a");
    assert!(!now.contains(&nodes[0]) && now.contains(&nodes[1]) && now.len() == 2, "{nodes:?} → {now:?}\n{stdout}");
    assert_eq!(ids_of(&after, "control-plane-us-east-1a"), cps, "the control plane is untouched");

    // Without surge the group replaces it after it is gone.
    let out = delete_instance(&spec, &moto, &nodes[1], &["--yes", "--surge=false"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("its replacement is i-"), "{stdout}");
    let last = ids_of(&get_instances(&spec, &moto).0, "nodes-us-east-1a");
    assert!(!last.contains(&nodes[1]) && last.len() == 2 && now.iter().filter(|i| last.contains(i)).count() == 1, "{now:?} → {last:?}\n{stdout}");
}

fn irsa_spec(spec: &tempfile::NamedTempFile, with_writer: bool) {
    let text = std::fs::read_to_string(spec.path()).expect("spec");
    let mut irsa = moto::irsa();
    if !with_writer {
        irsa = irsa[..irsa.find("    - name: writer").expect("writer")].to_string();
    }
    let base = match text.find("  serviceAccountIssuerDiscovery:") {
        Some(at) => {
            let end = text[at..].find("  kubelet:").map(|e| at + e).expect("kubelet follows");
            format!("{}  iam:\n    legacy: false\n{}", &text[..at], &text[end..])
        }
        None => text,
    };
    std::fs::write(spec.path(), base.replace("  iam:\n    legacy: false\n", &irsa)).expect("write spec");
}

async fn sa_roles(t: &cloud_resources::aws::AwsTarget) -> Vec<String> {
    let roles = t.iam.list_roles().send().await.expect("roles");
    let mut names: Vec<String> = roles.roles().iter().map(|r| r.role_name().to_string()).filter(|n| n.contains(".sa.")).collect();
    names.sort();
    names
}

async fn oidc_providers(t: &cloud_resources::aws::AwsTarget) -> Vec<String> {
    let list = t.iam.list_open_id_connect_providers().send().await.expect("providers");
    list.open_id_connect_provider_list().iter().filter_map(|p| p.arn().map(str::to_string)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn irsa_publishes_the_issuer_and_makes_its_provider_and_service_account_roles() {
    let moto = Moto::start();
    let ami = moto.fixtures().await;
    let spec = spec_file(&ami);
    irsa_spec(&spec, true);
    moto::create_team_policy(&moto.target(&[]).await).await;
    let out = apply(&spec, &moto, &["--yes"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("service-account issuer discovery") && stdout.contains("2 documents written"), "{stdout}");

    // The documents, under the issuer the API servers are told (`--service-account-issuer`).
    let issuer = format!("https://{BUCKET}.s3.us-east-1.amazonaws.com/discovery");
    let store = StateStore::open_with_s3(
        &format!("s3://{BUCKET}/discovery").parse().expect("url"),
        Some(moto.target(&[]).await.s3),
        std::time::Duration::from_secs(10),
    )
    .expect("store");
    let config: serde_json::Value =
        serde_json::from_slice(&store.get(".well-known/openid-configuration").await.expect("get").expect("published")).expect("json");
    assert_eq!(config["issuer"], issuer.as_str());
    assert_eq!(config["jwks_uri"], format!("{issuer}/openid/v1/jwks").as_str());
    let jwks: serde_json::Value = serde_json::from_slice(&store.get("openid/v1/jwks").await.expect("get").expect("published")).expect("json");
    assert_eq!(jwks["keys"].as_array().map(Vec::len), Some(1), "{jwks}");

    // The provider, keyed by the issuer's host and path, for both audiences.
    let t = moto.target(&[]).await;
    let providers = oidc_providers(&t).await;
    let host_path = format!("{BUCKET}.s3.us-east-1.amazonaws.com/discovery");
    assert_eq!(providers.len(), 1, "{providers:?}");
    assert!(providers[0].ends_with(&format!(":oidc-provider/{host_path}")), "{providers:?}");
    let p = t.iam.get_open_id_connect_provider().open_id_connect_provider_arn(&providers[0]).send().await.expect("provider");
    let mut audiences = p.client_id_list().to_vec();
    audiences.sort();
    assert_eq!(audiences, ["amazonaws.com", "sts.amazonaws.com"]);

    // A role per service account, trusting that provider for that subject only.
    let cluster = CLUSTER;
    assert_eq!(sa_roles(&t).await, [format!("reader.default.sa.{cluster}"), format!("writer.team-wildcard.sa.{cluster}")]);
    let trust = |doc: &str| -> serde_json::Value { serde_json::from_str(&percent_decode(doc)).expect("trust json") };
    let reader = t.iam.get_role().role_name(format!("reader.default.sa.{cluster}")).send().await.expect("role");
    let doc = trust(reader.role().and_then(|r| r.assume_role_policy_document()).expect("trust"));
    let s = &doc["Statement"][0];
    assert_eq!(s["Principal"]["Federated"], providers[0].as_str());
    assert_eq!(s["Action"], "sts:AssumeRoleWithWebIdentity");
    assert_eq!(s["Condition"]["StringEquals"][format!("{host_path}:sub")], "system:serviceaccount:default:reader");
    let attached = t.iam.list_attached_role_policies().role_name(format!("reader.default.sa.{cluster}")).send().await.expect("attached");
    let arns: Vec<&str> = attached.attached_policies().iter().filter_map(|p| p.policy_arn()).collect();
    assert_eq!(arns, ["arn:aws:iam::123456789012:policy/team-read"]);
    let writer = t.iam.get_role().role_name(format!("writer.team-wildcard.sa.{cluster}")).send().await.expect("role");
    let doc = trust(writer.role().and_then(|r| r.assume_role_policy_document()).expect("trust"));
    assert_eq!(doc["Statement"][0]["Condition"]["StringLike"][format!("{host_path}:sub")], "system:serviceaccount:team-*:writer");
    let inline = t
        .iam
        .get_role_policy()
        .role_name(format!("writer.team-wildcard.sa.{cluster}"))
        .policy_name(format!("writer.team-wildcard.sa.{cluster}"))
        .send()
        .await
        .expect("inline");
    let inline: serde_json::Value = serde_json::from_str(&percent_decode(inline.policy_document())).expect("json");
    assert_eq!(inline["Statement"][0]["Action"], serde_json::json!(["s3:PutObject"]));

    // Converged: the plan is empty.
    let out = apply(&spec, &moto, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains("No changes."), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));

    // A service account the spec drops loses its role.
    irsa_spec(&spec, false);
    let out = apply(&spec, &moto, &["--yes"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(&format!("- IAMRole writer.team-wildcard.sa.{cluster}")),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(sa_roles(&t).await, [format!("reader.default.sa.{cluster}")]);

    // Delete takes the provider and the roles with the cluster.
    let out = tokio::task::block_in_place(|| {
        std::process::Command::new(env!("CARGO_BIN_EXE_keelson"))
            .args(["delete", "cluster", "-f", &spec.path().display().to_string(), "--endpoint-url", &moto.url, "--yes"])
            .env("NO_COLOR", "1")
            .output()
            .expect("run keelson")
    });
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(sa_roles(&t).await.is_empty() && oidc_providers(&t).await.is_empty(), "delete leaves IRSA resources");
}

fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s).decode_utf8().expect("utf-8").into_owned()
}

/// The inline policy of `role` as IAM holds it.
async fn inline_policy(t: &cloud_resources::aws::AwsTarget, role: &str) -> serde_json::Value {
    let got = t.iam.get_role_policy().role_name(role).policy_name(role).send().await.unwrap_or_else(|e| panic!("{role}: {e:?}"));
    serde_json::from_str(&percent_decode(got.policy_document())).expect("policy json")
}

/// Whether any statement of `doc` names `action`.
fn grants(doc: &serde_json::Value, action: &str) -> bool {
    doc["Statement"].as_array().expect("statements").iter().any(|s| match &s["Action"] {
        serde_json::Value::String(a) => a == action,
        v => v.as_array().is_some_and(|a| a.iter().any(|x| x == action)),
    })
}

/// `useServiceAccountExternalPermissions`: apply asks STS for the account, writes the addons with
/// their roles' ARNs, makes a role per addon (trusting the issuer's provider for the addon's service
/// account only, with the addon's statements) and takes those statements off the control plane.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keelsons_addons_run_on_roles_of_their_own() {
    let moto = Moto::start();
    let ami = moto.fixtures().await;
    let spec = spec_file(&ami);
    irsa_spec(&spec, false);
    let text = std::fs::read_to_string(spec.path()).expect("spec");
    std::fs::write(spec.path(), text.replace("    legacy: false\n", "    legacy: false\n    useServiceAccountExternalPermissions: true\n"))
        .expect("write spec");
    moto::create_team_policy(&moto.target(&[]).await).await;
    let out = apply(&spec, &moto, &["--yes"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(!stderr.contains("is not written"), "apply knows the account: {stderr}");

    let t = moto.target(&[]).await;
    let cluster = CLUSTER;
    // kOps' names, cut to IAM's 64 characters with a hash where longer.
    let ccm = keelson_api::names::service_account_role_name("aws-cloud-controller-manager", "kube-system", cluster);
    let ebs = keelson_api::names::service_account_role_name("ebs-csi-controller-sa", "kube-system", cluster);
    assert!(ccm.len() <= 64 && ccm.starts_with("aws-cloud-controller-manager.kube-system.sa."), "{ccm}");
    assert_eq!(sa_roles(&t).await, [ccm.clone(), ebs.clone(), format!("reader.default.sa.{cluster}")]);
    let role = t.iam.get_role().role_name(&ccm).send().await.expect("role");
    let trust: serde_json::Value =
        serde_json::from_str(&percent_decode(role.role().and_then(|r| r.assume_role_policy_document()).expect("trust"))).expect("json");
    let host_path = format!("{BUCKET}.s3.us-east-1.amazonaws.com/discovery");
    assert_eq!(
        trust["Statement"][0]["Condition"]["StringEquals"][format!("{host_path}:sub")],
        "system:serviceaccount:kube-system:aws-cloud-controller-manager"
    );
    let ccm_policy = inline_policy(&t, &ccm).await;
    assert!(grants(&ccm_policy, "ec2:CreateSecurityGroup") && !grants(&ccm_policy, "ec2:AttachVolume"), "{ccm_policy}");
    let ebs_policy = inline_policy(&t, &ebs).await;
    assert!(grants(&ebs_policy, "ec2:CreateVolume") && !grants(&ebs_policy, "ec2:CreateSecurityGroup"), "{ebs_policy}");
    let masters = inline_policy(&t, &keelson_api::names::iam_role_name(keelson_api::Role::ControlPlane, cluster)).await;
    for gone in ["ec2:CreateSecurityGroup", "ec2:CreateVolume", "elasticloadbalancing:CreateLoadBalancer"] {
        assert!(!grants(&masters, gone), "{gone} still on the control plane: {masters}");
    }
    for kept in ["ec2:AttachVolume", "ec2:DescribeVolumes", "elasticloadbalancing:RegisterTargets"] {
        assert!(grants(&masters, kept), "{kept} missing from the control plane: {masters}");
    }

    // The addons in the state store assume those roles, in moto's account (STS's answer).
    let store =
        StateStore::open_with_s3(&format!("s3://{BUCKET}/{CLUSTER}").parse().expect("configBase"), Some(t.s3.clone()), std::time::Duration::from_secs(30))
            .expect("store");
    let manifest = store.get("addons/aws-cloud-controller.addons.k8s.io/v1.0.0.yaml").await.expect("get").expect("written");
    let manifest = String::from_utf8_lossy(&manifest);
    assert!(manifest.contains(&format!("arn:aws:iam::123456789012:role/{ccm}")), "{manifest}");
    assert!(manifest.contains("audience: amazonaws.com"), "{manifest}");

    let out = apply(&spec, &moto, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains("No changes."), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
}
