//! An `s3://` ConfigBase against a real moto server on 127.0.0.1 (through aws-sdk-s3), with the
//! IAM oracle over it: nodeup signs with a key standing for the node role, moto records every
//! request, and each of nodeup's is held against the node policy `keelson apply` renders for the
//! cluster the fixtures come from (`examples/ha.yaml`, its state store in this test's bucket).
//! Needs moto (`$KEELSON_PYTHON`, default `.venv/bin/python`, made by `scripts/test`); fails
//! with a message saying so.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use common::*;

/// The key nodeup signs with here: it stands for the Node role's instance credentials.
const NODE_KEY: &str = "AKIAKEELSONNODE";
const BUCKET: &str = "keelson-state";
const REGION: &str = "eu-west-1";

fn start_moto(calls: &Path) -> (testkit::moto::Moto, tempfile::NamedTempFile) {
    let log = tempfile::NamedTempFile::new().expect("moto log");
    let moto = testkit::moto::Moto::start_recording(log.path(), calls).unwrap_or_else(|e| panic!("this test needs moto: {e}"));
    (moto, log)
}

/// Every request of `calls` signed with [`NODE_KEY`], held against the node policy rendered for
/// `examples/ha.yaml` with its state store at `s3://keelson-state/<cluster>`.
fn iam_oracle(calls: &Path) -> testkit::moto_calls::Report {
    use cloud_resources::iam_policy::{policy, InstanceRolePolicy, PolicyInputs};
    use keelson_api::Role;
    let spec = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/ha.yaml")).expect("examples/ha.yaml");
    let docs = keelson_api::parse_documents(&spec).expect("examples/ha.yaml");
    let name = docs.cluster.metadata.name.clone().unwrap_or_default();
    // The fixture's workers join as its NodeupConfig says (with the published bootstrap token
    // unless by cloud identity): the policy is rendered for that.
    let cfg: keelson_api::nodeup::NodeupConfig = serde_yaml_ng::from_str(&fixture("nodes.yaml")).expect("fixture NodeupConfig");
    let token = !cfg.node_bootstrap.is_some_and(|b| b.method == keelson_api::nodeup::NodeBootstrapMethod::CloudIdentity);
    let inputs = PolicyInputs::new(&name, REGION, &format!("s3://{BUCKET}/{name}"), &docs.cluster.spec, &docs.instance_groups, token);
    let doc = policy(&InstanceRolePolicy { role: Role::Node, additional_statements: vec![] }, &inputs, None).expect("the node policy");
    let role = keelson_api::names::iam_role_name(Role::Node, &name);
    let roles = BTreeMap::from([(NODE_KEY.to_string(), role.clone())]);
    let policies = BTreeMap::from([(role, vec![doc])]);
    let no_tags = |_: &str| BTreeMap::new();
    let records = testkit::moto_calls::read(calls).expect("moto's record");
    testkit::moto_calls::check(&records, &testkit::moto_calls::Identities { roles: &roles, policies: &policies, account: "123456789012", tags: &no_tags })
}

fn upload_dir(client: &reqwest::blocking::Client, port: u16, bucket: &str, prefix: &str, dir: &Path) {
    for (rel, bytes) in tree(dir) {
        let r = client.put(format!("http://127.0.0.1:{port}/{bucket}/{prefix}/{rel}")).body(bytes).send().expect("put object");
        assert!(r.status().is_success(), "put {rel}: {}", r.status());
    }
}

#[test]
fn s3_config_base_against_moto() {
    let record = tempfile::tempdir().expect("record dir");
    let calls = record.path().join("calls.jsonl");
    let (moto, _log) = start_moto(&calls);
    let s = Scenario::new(Group::Worker, 4096, |m, a| vec![m.url(&a.path)]);
    let client = reqwest::blocking::Client::new();
    let port = moto.port;
    assert!(client.put(format!("http://127.0.0.1:{port}/{BUCKET}")).send().expect("create bucket").status().is_success());
    upload_dir(&client, port, "keelson-state", "ha.k8s.example.com", &s.dir.path().join("state"));
    // Point the BootConfig at s3:// (the NodeupConfig bytes, and so the hash, are unchanged).
    let mut boot: keelson_api::nodeup::BootConfig = serde_yaml_ng::from_str(&std::fs::read_to_string(&s.boot).expect("boot")).expect("yaml");
    boot.config_base = "s3://keelson-state/ha.k8s.example.com".parse().expect("config base");
    std::fs::write(&s.boot, serde_yaml_ng::to_string(&boot).expect("yaml")).expect("write boot");
    std::fs::remove_dir_all(s.dir.path().join("state")).expect("the file store is gone: only S3 remains");

    let endpoint = format!("http://127.0.0.1:{port}");
    let with_env = |c: &mut Command| {
        c.env("AWS_ENDPOINT_URL", &endpoint)
            .env("AWS_ACCESS_KEY_ID", NODE_KEY)
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("AWS_REGION", REGION)
            .env_remove("AWS_ENDPOINT_URL_S3")
            .env_remove("AWS_SESSION_TOKEN");
    };
    let mut c = s.command(&[]);
    with_env(&mut c);
    let o = c.output().expect("run");
    assert_ok(&o);
    assert!(s.path("/var/lib/kubelet/bootstrap-kubeconfig").is_file());
    assert!(s.path("/usr/local/bin/kubelet").is_file());

    // Without credentials: a clear error, nothing touched.
    let fresh = s.dir.path().join("root2");
    std::fs::create_dir(&fresh).expect("mkdir");
    let o = Command::new(env!("CARGO_BIN_EXE_nodeup"))
        .arg("--conf")
        .arg(&s.boot)
        .arg("--root")
        .arg(&fresh)
        // One run: the failure is what is checked (nodeup reruns forever by default, as kOps').
        .args(["--arch", "amd64", "--retries", "0"])
        .env("AWS_ENDPOINT_URL", &endpoint)
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_PROFILE")
        .env("AWS_CONFIG_FILE", fresh.join("no-aws-config"))
        .env("AWS_SHARED_CREDENTIALS_FILE", fresh.join("no-aws-credentials"))
        // No instance role here: the credential chain must not wait for an IMDS.
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("credentials"), "{}", stderr(&o));
    assert!(std::fs::read_dir(&fresh).expect("ls").next().is_none());

    // A missing NodeupConfig object is reported as such.
    let mut boot2 = boot.clone();
    boot2.instance_group_name = "no-such-group".into();
    let b2 = s.dir.path().join("boot2.yaml");
    std::fs::write(&b2, serde_yaml_ng::to_string(&boot2).expect("yaml")).expect("write");
    let mut c = Command::new(env!("CARGO_BIN_EXE_nodeup"));
    c.arg("--conf").arg(&b2).arg("--root").arg(&fresh).args(["--arch", "amd64", "--retries", "0"]);
    with_env(&mut c);
    let o = c.output().expect("run");
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("igconfig/node/no-such-group/nodeupconfig.yaml") && stderr(&o).contains("not found"), "{}", stderr(&o));

    // Every request nodeup signed, held against the node policy: all allowed, and some were made.
    let report = iam_oracle(&calls);
    eprintln!("{}", report.summary());
    assert!(report.clean(), "{report}");
    assert!(report.by_roles >= 2, "nodeup's S3 reads were not recorded under its role: the oracle checked nothing\n{report}");
}
