//! The IAM oracle on real calls: what protokube does against moto — find the cluster's hosted zone
//! and keep its records (`cloud::dns::Route53Dns`), upload an etcd backup in parts and abort a
//! failed one (`base::etcd_backup::BackupStore`), list and prune the backups — with every SDK call
//! recorded ([`testkit::aws_calls::CallLog`]) and checked against the control-plane policy the direct
//! target puts for `examples/minimal.yaml` (moto itself enforces no IAM). A call the policy does
//! not allow fails the test, naming the call, the identity and the nearest statement.
//! And the oracle at moto's door on a real run (`recorded_cluster_calls_are_allowed_by_the_rendered_policies`):
//! the requests a keelson-local `examples/ha.yaml` cluster's machines made, checked against the
//! policies this tree renders.
//! Needs moto; fails with a message saying so.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::options;

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;
use base::etcd_backup::{BackupMeta, BackupStore};
use cloud::dns::{Dns, Record, RecordChange, Route53Dns};
use cloud_resources::aws::{AwsTask, Resolved};
use keelson_api::Role;
use serde_json::Value;
use testkit::aws_calls::{assert_allowed, Account, CallLog};

const MIB: u64 = 1 << 20;

/// Fails every `operation` call before it is sent (a multipart upload that cannot complete).
#[derive(Debug, Clone)]
struct FailOperation {
    operation: &'static str,
    armed: Arc<AtomicBool>,
}

impl Intercept for FailOperation {
    fn name(&self) -> &'static str {
        "test.FailOperation"
    }
    fn read_before_transmit(&self, _ctx: &BeforeTransmitInterceptorContextRef<'_>, _rc: &RuntimeComponents, cfg: &mut ConfigBag) -> Result<(), BoxError> {
        if self.armed.load(Ordering::SeqCst) && cfg.load::<Metadata>().is_some_and(|m| m.name() == self.operation) {
            return Err(format!("injected failure of {}", self.operation).into());
        }
        Ok(())
    }
}

/// The cloud model of `examples/minimal.yaml`, as `keelson apply` builds it.
fn minimal() -> cloud_resources::model::ClusterModel {
    model_of("minimal.yaml")
}

/// The cloud model of `examples/<name>`, as `keelson apply` builds it.
fn model_of(name: &str) -> cloud_resources::model::ClusterModel {
    let spec = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples").join(name);
    let docs = spec_compiler::load::load_spec(&spec).expect("spec");
    let compiled = spec_compiler::compile(&docs, &options()).expect("compile");
    cloud_resources::model::build(&docs, &compiled).expect("model")
}

/// The inline policy the direct target puts on `role`'s IAM role once it resolved `zone`.
fn direct_policy(model: &cloud_resources::model::ClusterModel, role: Role, zone: &str) -> (String, Option<Value>) {
    let name = keelson_api::names::iam_role_name(role, &model.cluster);
    let mut task = model.tasks.iam_roles.iter().find(|r| r.name == name).cloned().unwrap_or_else(|| panic!("no IAM role {name}"));
    task.resolve(&Resolved { zone: Some(zone.to_string()), ..Default::default() });
    (name, task.policy.resolved())
}

#[test]
fn protokube_calls_are_allowed_by_the_control_plane_policy() {
    let (_guard, moto) = testkit::moto::shared();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let model = minimal();
    let cluster = model.cluster.clone();
    let (bucket, _) = model.policy_inputs.state_store.clone().expect("minimal.yaml keeps its state on S3");
    let backups = model.policy_inputs.backup_stores.first().cloned().expect("the compiled spec names the backup store");

    let conf = rt.block_on(async {
        let conf = cloud::sdk_config(&cloud::AwsOptions {
            region: Some("us-east-1".into()),
            endpoint_url: Some(moto.endpoint()),
            initial_backoff: Duration::from_millis(50),
            ..Default::default()
        })
        .await
        .into_builder();
        let mut conf = conf;
        conf.set_credentials_provider(Some(aws_sdk_s3::config::SharedCredentialsProvider::new(aws_sdk_s3::config::Credentials::new(
            "test", "test", None, None, "test",
        ))));
        conf.build()
    });
    // Set-up, as `keelson apply` would leave it: not recorded.
    let admin_s3 = aws_sdk_s3::Client::from_conf(aws_sdk_s3::config::Builder::from(&conf).force_path_style(true).build());
    let admin_r53 = aws_sdk_route53::Client::new(&conf);
    let zone = rt.block_on(async {
        for b in [&bucket, &backups.0] {
            let _ = admin_s3.create_bucket().bucket(b).send().await;
        }
        let z = admin_r53
            .create_hosted_zone()
            .name("example.com.")
            .caller_reference(format!("oracle-{}", std::process::id()))
            .send()
            .await
            .expect("CreateHostedZone");
        z.hosted_zone().map(|z| z.id().trim_start_matches("/hostedzone/").to_string()).expect("zone id")
    });

    // protokube's clients, recorded.
    let log = CallLog::default();
    let fail = FailOperation { operation: "CompleteMultipartUpload", armed: Arc::new(AtomicBool::new(false)) };
    let s3 = aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::config::Builder::from(&conf).force_path_style(true).interceptor(log.clone()).interceptor(fail.clone()).build(),
    );
    let dns = Route53Dns::new(aws_sdk_route53::Client::from_conf(aws_sdk_route53::config::Builder::from(&conf).interceptor(log.clone()).build()));

    rt.block_on(async {
        // DNS: the zone as protokube finds it (spec.dnsZone unset: the longest suffix), then its records.
        let found = dns.find_zone(None, &cluster).await.expect("find the zone");
        assert_eq!(found, zone);
        let record = Record { name: format!("api.internal.{cluster}"), rtype: "A".into(), ttl: 60, values: vec!["10.0.0.10".into()] };
        dns.apply_changes(&found, &[RecordChange::Upsert(record)]).await.expect("ChangeResourceRecordSets");
        assert_eq!(dns.list_records(&found, &cluster).await.expect("records").len(), 1);

        // etcd backups: one in parts, one whose upload fails and is aborted, then the listing.
        let url = format!("s3://{}/{}", backups.0, backups.1);
        let store = BackupStore::new(
            base::StateStore::open_with_s3(&url.parse().expect("url"), Some(s3.clone()), Duration::from_secs(10)).expect("store").with_part_size(5 * MIB),
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let snap = dir.path().join("snapshot.db");
        let bytes: Vec<u8> = (0..5 * MIB + 3).map(|i| (i % 251) as u8).collect();
        std::fs::write(&snap, &bytes).expect("snapshot");
        let now = time::OffsetDateTime::now_utc();
        for fails in [false, true] {
            fail.armed.store(fails, Ordering::SeqCst);
            let id = store.next_id(now + time::Duration::seconds(i64::from(fails))).await.expect("id");
            let meta = BackupMeta {
                id: id.to_string(),
                etcd_cluster: "main".into(),
                taken_at: base::etcd_backup::rfc3339(now),
                reason: "requested".into(),
                taken_from: "etcd-a".into(),
                etcd_version: "3.6.12".into(),
                cluster_id: "1".into(),
                members: vec!["etcd-a".into()],
                revision: 1,
                size: bytes.len() as u64,
                sha256: base::sha256_hex(&bytes),
            };
            let result = store.upload(&id, &snap, &meta).await;
            assert_eq!(result.is_err(), fails, "{result:?}");
        }
        fail.armed.store(false, Ordering::SeqCst);
        assert_eq!(store.list().await.expect("list").len(), 1);
    });

    let calls = log.calls();
    let ops: Vec<&str> = calls.iter().map(|c| c.operation.as_str()).collect();
    for op in ["ListHostedZonesByName", "ChangeResourceRecordSets", "ListResourceRecordSets", "UploadPart", "AbortMultipartUpload", "ListObjectsV2"] {
        assert!(ops.contains(&op), "{op} not exercised: {ops:?}");
    }
    let (identity, policy) = direct_policy(&model, Role::ControlPlane, &zone);
    let checked = assert_allowed(&identity, policy.as_ref(), &calls, &Account::default(), &|_| BTreeMap::new());
    assert!(checked >= calls.len(), "{checked} authorisations for {} calls", calls.len());

    // Nor every write to the zone: a record outside the cluster's names, through the same client,
    // is refused (the call log gives the oracle the change batch's names).
    log.clear();
    rt.block_on(async {
        let outside = Record { name: "www.example.com".into(), rtype: "A".into(), ttl: 60, values: vec!["10.0.0.66".into()] };
        dns.apply_changes(&zone, &[RecordChange::Upsert(outside)]).await.expect("moto enforces no IAM");
    });
    let outside = log.calls();
    let denied = testkit::aws_calls::check(&identity, policy.as_ref(), &outside, &Account::default(), &|_| BTreeMap::new())
        .expect_err("a record outside the cluster's names");
    let text: Vec<String> = denied.iter().map(|d| d.to_string()).collect();
    assert!(text.iter().any(|t| t.contains("route53:ChangeResourceRecordSets") && t.contains("www.example.com")), "{text:#?}");

    // The oracle is not a rubber stamp: the same calls are not the workers'.
    let (node, node_policy) = direct_policy(&model, Role::Node, &zone);
    let denied = testkit::aws_calls::check(&node, node_policy.as_ref(), &calls, &Account::default(), &|_| BTreeMap::new()).expect_err("workers may not");
    let text: Vec<String> = denied.iter().map(|d| d.to_string()).collect();
    assert!(text.iter().any(|t| t.contains("route53:ListHostedZonesByName on * to nodes.")), "{text:#?}");
}

/// Every request the machines of a keelson-local `examples/ha.yaml` cluster signed with their
/// instance roles' credentials during a selfheal run (protokube, nodeup, the AWS
/// cloud-controller-manager; recorded at moto's door, `testkit/tests/fixtures/moto_calls/keelson_local/`:
/// the requests, the role each key was issued for, the resources' tags) is allowed by the policies
/// the direct target renders from this tree — so a grant removed from `iam_policy.rs` that an
/// agent needs fails here. And the oracle flags the control plane's zone lookup once
/// `route53:ListHostedZonesByName` is taken out of its policy.
#[test]
fn recorded_cluster_calls_are_allowed_by_the_rendered_policies() {
    use testkit::moto_calls::{check, read, Identities};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testkit/tests/fixtures/moto_calls/keelson_local");
    let records = read(&dir.join("calls.jsonl")).expect("the recorded requests");
    let evidence: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("evidence.json")).expect("evidence.json")).expect("evidence.json is JSON");
    let roles: BTreeMap<String, String> = serde_json::from_value(evidence["roles"].clone()).expect("roles");
    let tags: BTreeMap<String, BTreeMap<String, String>> = serde_json::from_value(evidence["tags"].clone()).expect("tags");
    let lookup = |arn: &str| tags.get(arn).or_else(|| arn.rsplit('/').next().and_then(|id| tags.get(id))).cloned().unwrap_or_default();
    let model = model_of("ha.yaml");
    let mut policies: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for role in [Role::ControlPlane, Role::Node] {
        // spec.dnsZone is unset in ha.yaml: the zone is only known at boot, whatever id it gets.
        let (name, policy) = direct_policy(&model, role, "ZUNKNOWN");
        policies.insert(name, policy.into_iter().collect());
    }
    for role in roles.values() {
        assert!(policies.contains_key(role), "the recorded key's role {role} is none of ha.yaml's roles {:?}", policies.keys());
    }
    let ids = Identities { roles: &roles, policies: &policies, account: "123456789012", tags: &lookup };
    let report = check(&records, &ids);
    assert!(report.clean(), "{report}");
    let masters = keelson_api::names::iam_role_name(Role::ControlPlane, &model.cluster);
    let nodes = keelson_api::names::iam_role_name(Role::Node, &model.cluster);
    assert!(report.per_role.get(&masters).is_some_and(|n| *n > 0) && report.per_role.get(&nodes).is_some_and(|n| *n > 0), "{report}");

    // Without the control plane's ListHostedZonesByName, protokube's zone lookup is a finding.
    let strip = |doc: &Value, action: &str| -> Value {
        let mut doc = doc.clone();
        if let Some(statements) = doc["Statement"].as_array_mut() {
            for s in statements.iter_mut() {
                if let Some(a) = s["Action"].as_array_mut() {
                    a.retain(|x| x.as_str() != Some(action));
                }
            }
            statements.retain(|s| s["Action"].as_array().is_none_or(|a| !a.is_empty()));
        }
        doc
    };
    let mut without = policies.clone();
    for doc in without.get_mut(&masters).expect("the control plane's policy") {
        *doc = strip(doc, "route53:ListHostedZonesByName");
    }
    let report = check(&records, &Identities { policies: &without, ..ids });
    let text = report.to_string();
    assert!(text.contains(&format!("IAM denies route53:ListHostedZonesByName on * to {masters}")), "{text}");
    assert!(text.contains("route53/ListHostedZonesByName (GET "), "the call: {text}");
}
