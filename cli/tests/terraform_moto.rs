//! Real Terraform against moto: `keelson apply --target terraform --yes` renders an example (and writes
//! its state store), then `terraform init` (the AWS provider from the machine's filesystem mirror, never
//! the network), `validate`, `plan` and `apply` create it in a moto server of the test's own; Terraform's
//! own second plan must be empty, and so must `keelson apply`'s plan (the direct target, read only) of
//! the same cluster: both targets must agree on every attribute of every resource.
//!
//! Needs the `terraform` binary (`$KEELSON_TERRAFORM`, else `terraform` on `PATH`) and a provider
//! mirror holding `registry.terraform.io/hashicorp/aws` (`$KEELSON_TF_PLUGIN_MIRROR`, else the places
//! [`MIRRORS`] lists); without them the test fails saying where it looked. The provider override that
//! points Terraform at moto (`zz_moto_override.tf.json`) is written here, next to the rendered tree:
//! the product's Terraform stays what a user runs against AWS.

#[path = "../../cloud-resources/tests/moto/mod.rs"]
mod moto;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use moto::{Moto, BUCKET, ZONE};

/// Where a provider mirror is looked for (a directory holding `registry.terraform.io/hashicorp/aws`),
/// after `$KEELSON_TF_PLUGIN_MIRROR`: this machine image's mirror first, then Terraform's own implied
/// local mirror directories.
const MIRRORS: &[&str] =
    &["/opt/tf-plugins", "~/.terraform.d/plugins", "~/.local/share/terraform/plugins", "/usr/local/share/terraform/plugins", "/usr/share/terraform/plugins"];
const PROVIDER: &str = "registry.terraform.io/hashicorp/aws";
/// Every service the rendered Terraform uses, pointed at moto.
const ENDPOINTS: &[&str] = &["autoscaling", "ec2", "elbv2", "iam", "route53", "s3", "sts"];
/// Bound on each Terraform command (a hung provider must not hang CI).
const TERRAFORM_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// The terraform binary: `$KEELSON_TERRAFORM`, else `terraform` found on `PATH`.
fn terraform_binary() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("KEELSON_TERRAFORM").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() { Ok(p) } else { Err(format!("$KEELSON_TERRAFORM={} is not a file", p.display())) };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    dirs.iter().map(|d| d.join("terraform")).find(|p| p.is_file()).ok_or_else(|| {
        format!(
            "this test needs Terraform (1.11 was tested): no `terraform` in $PATH ({}) and $KEELSON_TERRAFORM unset",
            dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(":")
        )
    })
}

fn expand_home(p: &str) -> PathBuf {
    match (p.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => Path::new(&home).join(rest),
        _ => PathBuf::from(p),
    }
}

/// The provider mirror: the first of `$KEELSON_TF_PLUGIN_MIRROR` and [`MIRRORS`] with a
/// `registry.terraform.io/hashicorp/aws/<version>/linux_amd64` directory in it.
fn provider_mirror() -> Result<PathBuf, String> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    let from_env = std::env::var_os("KEELSON_TF_PLUGIN_MIRROR").filter(|p| !p.is_empty()).map(PathBuf::from);
    candidates.extend(from_env.clone());
    if from_env.is_none() {
        candidates.extend(MIRRORS.iter().map(|m| expand_home(m)));
    }
    let has_provider =
        |dir: &Path| std::fs::read_dir(dir.join(PROVIDER)).map(|versions| versions.flatten().any(|v| v.path().join("linux_amd64").is_dir())).unwrap_or(false);
    candidates.iter().find(|c| has_provider(c)).cloned().ok_or_else(|| {
        format!(
            "this test needs the Terraform AWS provider in a local filesystem mirror (no download is tried): no {PROVIDER}/<version>/linux_amd64 in {} \
             (set KEELSON_TF_PLUGIN_MIRROR to the directory that holds registry.terraform.io/)",
            candidates.iter().map(|c| c.display().to_string()).collect::<Vec<_>>().join(", ")
        )
    })
}

/// A Terraform CLI configuration that installs the AWS provider from `mirror` only.
fn cli_config(mirror: &Path) -> String {
    format!(
        "provider_installation {{\n  filesystem_mirror {{\n    path    = \"{}\"\n    include = [\"{PROVIDER}\"]\n  }}\n  direct {{\n    exclude = [\"{PROVIDER}\"]\n  }}\n}}\n",
        mirror.display()
    )
}

/// The provider override pointing every service at moto (merged into the rendered `provider "aws"`).
fn moto_override(url: &str) -> serde_json::Value {
    let endpoints: serde_json::Map<String, serde_json::Value> = ENDPOINTS.iter().map(|s| (s.to_string(), url.into())).collect();
    serde_json::json!({"provider": {"aws": [{
        "access_key": "test",
        "secret_key": "test",
        "skip_credentials_validation": true,
        "skip_requesting_account_id": true,
        "skip_metadata_api_check": true,
        "skip_region_validation": true,
        "s3_use_path_style": true,
        "endpoints": [endpoints],
    }]}})
}

/// Terraform in one working directory, with its CLI configuration.
struct Terraform {
    binary: PathBuf,
    dir: PathBuf,
    config: PathBuf,
    example: &'static str,
}

impl Terraform {
    /// Run `terraform ARGS` (bounded by [`TERRAFORM_TIMEOUT`]); returns its exit code and output, and
    /// prints how long it took.
    fn run(&self, args: &[&str]) -> (i32, String) {
        let log = self.dir.join(format!(".terraform-{}.log", args[0]));
        let out = std::fs::File::create(&log).expect("terraform log");
        let started = Instant::now();
        let mut child = Command::new(&self.binary)
            .args(args)
            .current_dir(&self.dir)
            .env("TF_CLI_CONFIG_FILE", &self.config)
            .env("TF_IN_AUTOMATION", "1")
            .env("TF_INPUT", "0")
            .env("CHECKPOINT_DISABLE", "1")
            .env_remove("TF_PLUGIN_CACHE_DIR")
            .env_remove("TF_DATA_DIR")
            .env_remove("AWS_PROFILE")
            .env_remove("AWS_ENDPOINT_URL")
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("running {} {}: {e}", self.binary.display(), args.join(" ")));
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait terraform") {
                break status;
            }
            if started.elapsed() > TERRAFORM_TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{}: terraform {} did not finish in {:?}:\n{}", self.example, args.join(" "), TERRAFORM_TIMEOUT, tail(&log));
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        eprintln!("{}: terraform {}: {:.1} s", self.example, args[0], started.elapsed().as_secs_f64());
        (status.code().unwrap_or(-1), std::fs::read_to_string(&log).unwrap_or_default())
    }

    /// Run `terraform ARGS`, which must succeed.
    fn ok(&self, args: &[&str]) -> String {
        let (code, output) = self.run(args);
        assert_eq!(code, 0, "{}: terraform {} failed (exit {code}):\n{output}", self.example, args.join(" "));
        output
    }
}

/// The last 200 lines of a log.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(200)..].join("\n")
}

/// Text from the spec that Terraform would read as a template if it were not escaped: a cloud label
/// that calls a function, holds an escape and a directive, and an IAM policy variable (AWS's own
/// `${aws:username}`). Terraform must store them as written, so its tags and policy equal what
/// the direct target plans (`keelson apply` sees no change).
const TEMPLATE_TEXT: &str = r#"  cloudLabels:
    team: '${file("/etc/hostname")} $${x} %{ if true }y%{ endif }'
  additionalPolicies:
    node: '[{"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": ["arn:aws:s3:::keelson-user-data/${aws:username}/*"]}]'
"#;

/// An example pointed at the test bucket, zone and image (and, for ha.yaml and private.yaml, moved to
/// us-east-1 as the other moto tests do), in `dir/cluster.yaml`; minimal.yaml also carries
/// [`TEMPLATE_TEXT`].
fn spec_file(dir: &Path, example: &str, ami: &str, iam: Option<&str>) -> PathBuf {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples").join(example)).expect("example");
    let extra = if example == "minimal.yaml" { TEMPLATE_TEXT } else { "" };
    let text = match iam {
        Some(block) => text.replace("  iam:\n    legacy: false\n", block),
        None => text,
    };
    let text = text
        .replace("eu-west-1", "us-east-1")
        .replace("s3://acme-keelson-state/", &format!("s3://{BUCKET}/"))
        .replace("099720109477/ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-20250610", ami)
        .replace("  cloudProvider: aws\n", &format!("  cloudProvider: aws\n  dnsZone: {ZONE}\n{extra}"));
    let path = dir.join("cluster.yaml");
    std::fs::write(&path, text).expect("write spec");
    path
}

fn keelson(spec: &Path, moto: &Moto, extra: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_keelson"))
        .args(["apply", "-f", &spec.display().to_string(), "--offline", "--endpoint-url", &moto.url])
        .args(["--nodeup-asset", moto::NODEUP_AMD64, "--protokube-asset", moto::PROTOKUBE_AMD64])
        .args(extra)
        .env_remove("KOPS_FEATURE_FLAGS")
        .env("NO_COLOR", "1")
        .output()
        .expect("run keelson");
    (out.status.success(), format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// Render `example` to Terraform, apply it to a fresh moto with Terraform, and require that neither
/// Terraform nor `keelson apply` then plans any change.
fn terraform_then_keelson_plans_nothing(example: &'static str) {
    terraform_then_keelson_plans_nothing_with(example, None);
}

fn terraform_then_keelson_plans_nothing_with(example: &'static str, iam: Option<&str>) {
    let (binary, mirror) = match (terraform_binary(), provider_mirror()) {
        (Ok(b), Ok(m)) => (b, m),
        (b, m) => panic!("{}", [b.err(), m.err()].into_iter().flatten().collect::<Vec<_>>().join("\n")),
    };
    let started = Instant::now();
    let moto = Moto::start();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let ami = rt.block_on(moto.fixtures());
    if iam.is_some_and(|b| b.contains("policy/team-read")) {
        rt.block_on(async { moto::create_team_policy(&moto.target(&[]).await).await });
    }
    let work = tempfile::tempdir().expect("tmp");
    let spec = spec_file(work.path(), example, &ami, iam);
    let dir = work.path().join("tf");

    // Render, and write the state store (the CAs pinned into the user-data), as a user does.
    let (ok, output) = keelson(&spec, &moto, &["--target", "terraform", "--out", &dir.display().to_string(), "--yes"]);
    assert!(ok, "{example}: keelson apply --target terraform --yes:\n{output}");
    std::fs::write(dir.join("zz_moto_override.tf.json"), serde_json::to_string_pretty(&moto_override(&moto.url)).expect("json")).expect("override");
    let config = work.path().join("terraformrc");
    std::fs::write(&config, cli_config(&mirror)).expect("cli config");
    let tf = Terraform { binary, dir, config, example };

    tf.ok(&["init", "-input=false", "-no-color"]);
    tf.ok(&["validate", "-no-color"]);
    let plan = tf.ok(&["plan", "-input=false", "-no-color", "-out=tfplan"]);
    assert!(plan.contains("to add, 0 to change, 0 to destroy"), "{example}: the first plan creates only:\n{plan}");
    tf.ok(&["apply", "-input=false", "-no-color", "-auto-approve", "tfplan"]);

    // Terraform's own view: what it created reads back as it was written (a difference here is a
    // rendering that AWS normalises, or a moto gap).
    let (code, again) = tf.run(&["plan", "-input=false", "-no-color", "-detailed-exitcode"]);
    assert_eq!(code, 0, "{example}: terraform plans changes right after its own apply (exit {code}):\n{again}");

    // The direct target's view of the same cluster: nothing to do.
    let (ok, output) = keelson(&spec, &moto, &[]);
    assert!(ok, "{example}: keelson apply (plan):\n{output}");
    assert!(output.contains("No changes."), "{example}: keelson apply plans changes to what terraform created (the targets disagree):\n{output}");
    eprintln!("{example}: render, terraform init/validate/plan/apply/plan, keelson plan: {:.1} s in all", started.elapsed().as_secs_f64());
}

#[test]
fn terraform_on_moto_then_keelson_plans_no_change_minimal() {
    terraform_then_keelson_plans_nothing("minimal.yaml");
}

#[test]
fn terraform_on_moto_then_keelson_plans_no_change_ha() {
    terraform_then_keelson_plans_nothing("ha.yaml");
}

#[test]
fn terraform_on_moto_then_keelson_plans_no_change_irsa() {
    terraform_then_keelson_plans_nothing_with("minimal.yaml", Some(&moto::irsa()));
}

/// Private topology: NAT gateways and their elastic IPs, a private route table per zone, an internal
/// API load balancer.
#[test]
fn terraform_on_moto_then_keelson_plans_no_change_private() {
    terraform_then_keelson_plans_nothing("private.yaml");
}

/// Fix 8 of `testkit/src/moto_server.py`: CreateLaunchTemplate's top-level tags (the template's own)
/// are not part of the version's launch-template data, as on AWS.
#[test]
fn moto_keeps_a_launch_templates_own_tags_out_of_its_data() {
    use aws_sdk_ec2::types::{LaunchTemplateTagSpecificationRequest, RequestLaunchTemplateData, ResourceType, Tag, TagSpecification};
    let moto = Moto::start();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let ec2 = moto.target(&[]).await.ec2;
        let tag = |k: &str| Tag::builder().key(k).value("v").build();
        let data = RequestLaunchTemplateData::builder()
            .instance_type(aws_sdk_ec2::types::InstanceType::T3Medium)
            .tag_specifications(LaunchTemplateTagSpecificationRequest::builder().resource_type(ResourceType::Instance).tags(tag("instance-tag")).build())
            .build();
        ec2.create_launch_template()
            .launch_template_name("tags.example.com")
            .launch_template_data(data)
            .tag_specifications(TagSpecification::builder().resource_type(ResourceType::LaunchTemplate).tags(tag("template-tag")).build())
            .send()
            .await
            .expect("create launch template");
        let versions = ec2.describe_launch_template_versions().launch_template_name("tags.example.com").send().await.expect("versions");
        let specs = versions.launch_template_versions()[0].launch_template_data().expect("data").tag_specifications();
        let types: Vec<_> = specs.iter().filter_map(|s| s.resource_type().map(|t| t.as_str().to_string())).collect();
        assert_eq!(types, ["instance"], "the version's data holds only the specifications it was given: {specs:?}");
        let templates = ec2.describe_launch_templates().launch_template_names("tags.example.com").send().await.expect("templates");
        let tags: Vec<_> = templates.launch_templates()[0].tags().iter().filter_map(|t| t.key()).collect();
        assert_eq!(tags, ["template-tag"], "the template itself carries its own tags");
    });
}

/// Fix 9 of `testkit/src/moto_server.py`: a load balancer created without a scheme (as Terraform
/// creates an internet-facing one) is internet-facing, as on AWS.
#[test]
fn moto_makes_a_load_balancer_without_a_scheme_internet_facing() {
    let moto = Moto::start();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let t = moto.target(&[]).await;
        let vpc = t.ec2.create_vpc().cidr_block("10.0.0.0/16").send().await.expect("vpc").vpc.and_then(|v| v.vpc_id).expect("vpc id");
        let subnet =
            t.ec2.create_subnet().vpc_id(&vpc).cidr_block("10.0.1.0/24").send().await.expect("subnet").subnet.and_then(|s| s.subnet_id).expect("subnet id");
        let created = t.elb.create_load_balancer().name("no-scheme").subnets(&subnet).send().await.expect("create load balancer");
        let arn = created.load_balancers()[0].load_balancer_arn().expect("arn").to_string();
        let found = t.elb.describe_load_balancers().load_balancer_arns(&arn).send().await.expect("describe");
        let scheme = found.load_balancers()[0].scheme().map(|s| s.as_str().to_string());
        assert_eq!(scheme.as_deref(), Some("internet-facing"));
    });
}
