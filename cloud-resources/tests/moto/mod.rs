//! A moto server per test (started by the test, on 127.0.0.1 only) and the fixtures apply needs:
//! a state-store bucket, a hosted zone, an AMI id, and the test spec built from examples/minimal.yaml.
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use aws_smithy_runtime_api::client::interceptors::SharedInterceptor;
use cloud_resources::aws::AwsTarget;

pub const BUCKET: &str = "keelson-test-state";
pub const ZONE: &str = "example.com";
pub const CLUSTER: &str = "minimal.k8s.example.com";

pub const NODEUP_AMD64: &str = "amd64=8b1a9953c4611296a827abf8c47804d7e6c49c6b8f0b8c1f4ee3a5e6a1b1c2d3@https://nodeup.mirror.test/amd64/nodeup";
/// The protokube build for the control planes.
pub const PROTOKUBE_AMD64: &str = "amd64=5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8@https://nodeup.mirror.test/amd64/protokube";

/// A moto server of this test's own (`keelson-testkit`'s launcher), stopped when dropped.
pub struct Moto {
    server: testkit::moto::Moto,
    pub url: String,
    _log: tempfile::NamedTempFile,
}

/// Run blocking work from sync or multi-threaded async tests.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(_) => tokio::task::block_in_place(f),
        Err(_) => f(),
    }
}

impl Moto {
    /// Start a moto server on a free port and wait (bounded) until it answers; panics saying why
    /// when moto is not installed.
    pub fn start() -> Moto {
        blocking(|| {
            std::env::set_var("AWS_ACCESS_KEY_ID", "testing");
            std::env::set_var("AWS_SECRET_ACCESS_KEY", "testing");
            std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
            std::env::remove_var("AWS_ENDPOINT_URL");
            std::env::remove_var("AWS_PROFILE");
            let log = tempfile::NamedTempFile::new().expect("moto log file");
            let server = testkit::moto::Moto::start(log.path()).unwrap_or_else(|e| panic!("these tests need moto: {e}"));
            Moto { url: server.endpoint(), server, _log: log }
        })
    }

    /// Forget every resource.
    pub fn reset(&self) {
        blocking(|| self.server.reset().expect("moto reset"))
    }

    pub fn options(&self) -> cloud::AwsOptions {
        cloud::AwsOptions {
            region: Some("us-east-1".into()),
            endpoint_url: Some(self.url.clone()),
            max_attempts: 5,
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(100),
            attempt_timeout: Duration::from_secs(30),
            operation_timeout: Duration::from_secs(60),
            ..Default::default()
        }
    }

    pub async fn target(&self, interceptors: &[SharedInterceptor]) -> AwsTarget {
        let mut t = AwsTarget::new(&self.options(), interceptors).await;
        t.dependency_retries = 5;
        t.dependency_delay = Duration::from_millis(100);
        t
    }

    /// Bucket, hosted zone; returns an AMI id moto knows.
    pub async fn fixtures(&self) -> String {
        let t = self.target(&[]).await;
        t.s3.create_bucket().bucket(BUCKET).send().await.expect("create bucket");
        t.dns.client().create_hosted_zone().name(ZONE).caller_reference(format!("keelson-test-{}", std::process::id())).send().await.expect("create zone");
        let images = t.ec2.describe_images().send().await.expect("describe images");
        let mut ids: Vec<String> = images.images().iter().filter_map(|i| i.image_id().map(str::to_string)).collect();
        ids.sort();
        ids.into_iter().next().expect("moto has default AMIs")
    }
}

/// examples/minimal.yaml pointed at the test bucket, zone and image, with `edit` applied to the text.
pub fn spec(ami: &str, edit: impl Fn(String) -> String) -> keelson_api::Documents {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/minimal.yaml")).expect("example");
    let text = text
        .replace("s3://acme-keelson-state/", &format!("s3://{BUCKET}/"))
        .replace("099720109477/ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-20250610", ami)
        .replace("  cloudProvider: aws\n", &format!("  cloudProvider: aws\n  dnsZone: {ZONE}\n"));
    let text = edit(text);
    spec_compiler::load::load_bytes(Path::new("test.yaml"), text.as_bytes()).expect("test spec is valid")
}

pub fn compile_options() -> spec_compiler::CompileOptions {
    let (arch, asset) = NODEUP_AMD64.split_once('=').expect("asset");
    spec_compiler::CompileOptions {
        nodeup_assets: [(spec_compiler::versions::Arch::parse(arch).expect("arch"), spec_compiler::userdata::NodeupAsset::parse(asset).expect("asset"))]
            .into_iter()
            .collect(),
        protokube_assets: [(
            spec_compiler::versions::Arch::parse(arch).expect("arch"),
            spec_compiler::userdata::NodeupAsset::parse(PROTOKUBE_AMD64.split_once('=').expect("asset").1).expect("asset"),
        )]
        .into_iter()
        .collect(),
        ..Default::default()
    }
}

/// Compile and build the cloud model, as `keelson apply` does (`require_user_data`: not for delete).
pub fn prepare(
    docs: &keelson_api::Documents,
    options: &spec_compiler::CompileOptions,
    require_user_data: bool,
) -> (cloud_resources::model::ClusterModel, spec_compiler::Compiled) {
    let compiled = spec_compiler::compile(docs, options).expect("compile");
    let model = cloud_resources::model::build_with(docs, &compiled, require_user_data).expect("cloud model");
    (model, compiled)
}

/// The cluster's state store, through the target's S3 client.
pub fn store(t: &AwsTarget, m: &cloud_resources::model::ClusterModel) -> base::StateStore {
    base::StateStore::open_with_s3(&m.config_base.parse().expect("configBase"), Some(t.s3.clone()), Duration::from_secs(30)).expect("store")
}

/// Plan and apply; returns the plan's (create, change, delete) counts.
pub async fn apply_once(t: &AwsTarget, m: &cloud_resources::model::ClusterModel) -> Result<(usize, usize, usize), cloud_resources::ApplyError> {
    let s = store(t, m);
    let mut p = cloud_resources::plan_apply(t, m, &s).await?;
    let counts = p.plan.counts();
    cloud_resources::execute(t, m, &s, &mut p).await?;
    Ok(counts)
}

/// IRSA for examples/minimal.yaml (it replaces the example's `iam:` block): the issuer's documents in a
/// discovery store on the test bucket, the IAM OIDC provider, and two service accounts' roles — a
/// managed policy ([`create_team_policy`]) and an exact namespace; an inline policy and a wildcard one.
#[allow(dead_code)]
pub fn irsa() -> String {
    IRSA.replace("BUCKET", BUCKET)
}
const IRSA: &str = r#"  serviceAccountIssuerDiscovery:
    discoveryStore: s3://BUCKET/discovery
    enableAWSOIDCProvider: true
    additionalAudiences: [sts.amazonaws.com]
  iam:
    legacy: false
    serviceAccountExternalPermissions:
    - name: reader
      namespace: default
      aws:
        policyARNs: [arn:aws:iam::123456789012:policy/team-read]
    - name: writer
      namespace: team-*
      aws:
        inlinePolicy: '[{"Effect": "Allow", "Action": ["s3:PutObject"], "Resource": ["arn:aws:s3:::team-data/*"]}]'
"#;

/// The customer-managed policy [`irsa`]'s `policyARNs` names, in moto's account (123456789012).
#[allow(dead_code)]
pub async fn create_team_policy(t: &AwsTarget) {
    let doc = r#"{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": ["*"]}]}"#;
    t.iam.create_policy().policy_name("team-read").policy_document(doc).send().await.expect("create policy team-read");
}

pub const HA_CLUSTER: &str = "ha.k8s.example.com";

/// examples/ha.yaml (private topology, three zones, network load balancer) moved to us-east-1 and
/// pointed at the test bucket, zone and image.
pub fn ha_spec(ami: &str, edit: impl Fn(String) -> String) -> keelson_api::Documents {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/ha.yaml")).expect("example");
    let text = text
        .replace("eu-west-1", "us-east-1")
        .replace("s3://acme-keelson-state/", &format!("s3://{BUCKET}/"))
        .replace("099720109477/ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-20250610", ami)
        .replace("  cloudProvider: aws\n", &format!("  cloudProvider: aws\n  dnsZone: {ZONE}\n"));
    let text = edit(text);
    spec_compiler::load::load_bytes(Path::new("ha.yaml"), text.as_bytes()).expect("test spec is valid")
}

/// `examples/ha.yaml` in private topology (as the example was before it moved to public topology for
/// kubenet's routes): its three subnets Private, plus a Utility subnet per zone for the NAT gateways
/// and the load balancer. Apply to [`ha_spec`]'s text (after its region rewrite).
pub fn private_topology(text: String) -> String {
    // Subnet entries only (four spaces of indent; the load balancer's `type` has six).
    let mut t: String = text.lines().map(|l| if l == "    type: Public" { "    type: Private\n".to_string() } else { format!("{l}\n") }).collect();
    let utility: String = ["a", "b", "c"]
        .iter()
        .enumerate()
        .map(|(i, z)| format!("  - name: utility-us-east-1{z}\n    zone: us-east-1{z}\n    cidr: 172.20.{}.0/22\n    type: Utility\n", i * 4))
        .collect();
    t = t.replacen("  topology:\n", &format!("{utility}  topology:\n"), 1);
    t
}

/// Run an async test body on a thread (and runtime workers) with a 16 MiB stack: the largest
/// apply scenarios are futures too deep for the default 2 MiB test-thread stack in debug builds.
pub fn run_with_big_stack<F>(body: impl FnOnce() -> F + Send + 'static)
where
    F: std::future::Future<Output = ()>,
{
    const STACK: usize = 16 * 1024 * 1024;
    let handle = std::thread::Builder::new()
        .stack_size(STACK)
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_stack_size(STACK).enable_all().build().expect("tokio runtime");
            rt.block_on(body());
        })
        .expect("spawn test thread");
    if let Err(panic) = handle.join() {
        std::panic::resume_unwind(panic);
    }
}

// Fault injection and recording for apply tests (SDK interceptors).

/// Fails the n-th write operation (1-based) before it is sent.
#[derive(Debug, Clone)]
pub struct FailNthWrite {
    pub n: u64,
    pub seen: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl FailNthWrite {
    pub fn new(n: u64) -> FailNthWrite {
        FailNthWrite { n, seen: Default::default() }
    }
}

fn operation(cfg: &aws_smithy_types::config_bag::ConfigBag) -> Option<(String, String)> {
    cfg.load::<aws_smithy_runtime_api::client::orchestrator::Metadata>().map(|m| (m.service().to_string(), m.name().to_string()))
}

impl aws_smithy_runtime_api::client::interceptors::Intercept for FailNthWrite {
    fn name(&self) -> &'static str {
        "test.FailNthWrite"
    }
    fn read_before_serialization(
        &self,
        _ctx: &aws_smithy_runtime_api::client::interceptors::context::BeforeSerializationInterceptorContextRef<'_>,
        _rc: &aws_smithy_runtime_api::client::runtime_components::RuntimeComponents,
        cfg: &mut aws_smithy_types::config_bag::ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        let op = operation(cfg).map(|(_, o)| o).unwrap_or_default();
        if cloud_resources::aws::is_write(&op) && self.seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == self.n {
            return Err(format!("injected failure of write #{} ({op})", self.n).into());
        }
        Ok(())
    }
}

/// Every write, in order (`service/operation`).
#[derive(Debug, Clone, Default)]
pub struct RecordWrites(pub std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl aws_smithy_runtime_api::client::interceptors::Intercept for RecordWrites {
    fn name(&self) -> &'static str {
        "test.RecordWrites"
    }
    fn read_before_serialization(
        &self,
        _ctx: &aws_smithy_runtime_api::client::interceptors::context::BeforeSerializationInterceptorContextRef<'_>,
        _rc: &aws_smithy_runtime_api::client::runtime_components::RuntimeComponents,
        cfg: &mut aws_smithy_types::config_bag::ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        if let Some((service, op)) = operation(cfg) {
            if cloud_resources::aws::is_write(&op) {
                self.0.lock().map_err(|e| e.to_string())?.push(format!("{service}/{op}"));
            }
        }
        Ok(())
    }
}
