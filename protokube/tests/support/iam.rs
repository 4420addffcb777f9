//! The IAM oracle over these tests (moto enforces no IAM): protokube signs every AWS call with a
//! key of its own ([`CONTROL_PLANE_KEY`]), the test's moto records each request it serves
//! (`testkit::moto::shared`), and when the test's [`crate::host::Cluster`] goes away every request
//! signed with that key is checked against the control-plane policy `keelson apply` renders for the
//! test's spec (`cloud_resources::iam_policy::policy`, the one function both targets render with),
//! with AWS' evaluation rules (`testkit::moto_calls::check`). A call the policy does not allow
//! fails the test, naming the call, the role and the nearest statement. Set-up calls of the test
//! itself sign with other keys and are not checked.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use cloud_resources::iam_policy::{policy, InstanceRolePolicy, PolicyInputs};
use keelson_api::Role;
use testkit::moto_calls::{self, Identities, Report};

/// The access key protokube runs with in these tests: it stands for the control plane's instance
/// role (on a real instance the key comes from IMDS).
pub const CONTROL_PLANE_KEY: &str = "AKIAKEELSONCONTROLPLANE";
/// moto's account.
const ACCOUNT: &str = "123456789012";

/// Where the test's moto record stood when a cluster was made.
#[derive(Debug, Clone)]
pub struct Mark {
    record: PathBuf,
    from: u64,
}

impl Mark {
    /// Now, on the shared moto's record. Panics when the shared moto does not record (every moto
    /// these tests use does: `testkit::moto::shared`).
    pub fn now() -> Mark {
        let moto = testkit::moto::shared_started().expect("the test holds the shared moto (moto::lock) before it makes a cluster");
        let record = moto.calls().expect("the shared moto records every request (testkit::moto::shared)").to_path_buf();
        Mark { from: moto_calls::mark(&record), record }
    }

    /// Check every request made since the mark with [`CONTROL_PLANE_KEY`] against the control-plane
    /// policy rendered for `spec` (a Cluster document, and its InstanceGroups if any) in `region`;
    /// `moto_url` serves the resources' tags. Runs on a thread of its own (callers may be inside a
    /// runtime).
    pub fn check(&self, moto_url: &str, spec: &str, region: &str) -> Report {
        self.check_stored_in(moto_url, spec, region, None)
    }

    /// [`Mark::check`] for a cluster whose state store is `config_base` rather than the spec's
    /// (a test that moved it).
    pub fn check_stored_in(&self, moto_url: &str, spec: &str, region: &str, config_base: Option<&str>) -> Report {
        let mut docs = keelson_api::parse_documents(spec.as_bytes()).unwrap_or_else(|e| panic!("the IAM oracle: the test spec: {e:?}\n{spec}"));
        if let Some(c) = config_base {
            docs.cluster.spec.config_base = Some(c.to_string());
        }
        let records = moto_calls::read_since(&self.record, self.from).unwrap_or_else(|e| panic!("the IAM oracle: {e}"));
        let name = docs.cluster.metadata.name.clone().unwrap_or_default();
        let config_base = docs.cluster.spec.config_base.clone().unwrap_or_default();
        let inputs = PolicyInputs::new(&name, region, &config_base, &docs.cluster.spec, &docs.instance_groups, false);
        let role = keelson_api::names::iam_role_name(Role::ControlPlane, &name);
        let doc = policy(&InstanceRolePolicy { role: Role::ControlPlane, additional_statements: vec![] }, &inputs, None)
            .expect("the control plane's policy has statements");
        let roles = BTreeMap::from([(CONTROL_PLANE_KEY.to_string(), role.clone())]);
        let policies = BTreeMap::from([(role, vec![doc])]);
        let tags = resource_tags(moto_url);
        let lookup = |arn: &str| tags.get(arn).or_else(|| arn.rsplit('/').next().and_then(|id| tags.get(id))).cloned().unwrap_or_default();
        moto_calls::check(&records, &Identities { roles: &roles, policies: &policies, account: ACCOUNT, tags: &lookup })
    }

    /// [`Mark::check`], failing the test on a denied or unmapped call, or when no call of the role
    /// was seen at all (an oracle that checked nothing).
    pub fn assert_allowed(&self, moto_url: &str, spec: &str, region: &str) {
        let report = self.check(moto_url, spec, region);
        eprintln!("{}", report.summary());
        assert!(report.clean(), "{report}");
        assert!(report.by_roles > 0, "moto recorded no request signed by the control plane's key: the IAM oracle checked nothing\n{report}");
    }
}

/// `conf` signing as the control plane ([`CONTROL_PLANE_KEY`]): for protokube's clients in tests
/// that run its parts in-process.
pub fn as_control_plane(conf: &cloud::aws::SdkConfig) -> cloud::aws::SdkConfig {
    let mut b = conf.clone().into_builder();
    b.set_credentials_provider(Some(aws_sdk_ec2::config::SharedCredentialsProvider::new(aws_credential_types::Credentials::new(
        CONTROL_PLANE_KEY,
        "test",
        None,
        None,
        "control-plane",
    ))));
    b.build()
}

/// Every EC2 resource's tags by id and every ELBv2 target group's and load balancer's by ARN, as
/// moto has them now (the `aws:ResourceTag/…` condition keys).
fn resource_tags(moto_url: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let url = moto_url.to_string();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            let ec2 = aws_sdk_ec2::Client::new(&crate::moto::sdk(&url).await);
            let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
            let tags = ec2.describe_tags().max_results(1000).into_paginator().items().send().try_collect().await.expect("DescribeTags");
            for t in &tags {
                if let (Some(id), Some(k)) = (t.resource_id(), t.key()) {
                    out.entry(id.to_string()).or_default().insert(k.to_string(), t.value().unwrap_or_default().to_string());
                }
            }
            let elb = aws_sdk_elasticloadbalancingv2::Client::new(&crate::moto::sdk(&url).await);
            let tgs = elb.describe_target_groups().send().await.expect("DescribeTargetGroups");
            let lbs = elb.describe_load_balancers().send().await.expect("DescribeLoadBalancers");
            let arns: Vec<String> = tgs
                .target_groups()
                .iter()
                .filter_map(|t| t.target_group_arn())
                .chain(lbs.load_balancers().iter().filter_map(|l| l.load_balancer_arn()))
                .map(str::to_string)
                .collect();
            for chunk in arns.chunks(20) {
                let d = elb.describe_tags().set_resource_arns(Some(chunk.to_vec())).send().await.expect("DescribeTags");
                for desc in d.tag_descriptions() {
                    let Some(arn) = desc.resource_arn() else { continue };
                    let tags = out.entry(arn.to_string()).or_default();
                    for t in desc.tags() {
                        tags.insert(t.key().unwrap_or_default().to_string(), t.value().unwrap_or_default().to_string());
                    }
                }
            }
            out
        })
    })
    .join()
    .unwrap_or_else(|_| panic!("the IAM oracle could not read the resources' tags from moto"))
}
