//! `keelson reconcile cluster` (the command) against a real moto server started by the test
//! (127.0.0.1 only): after an upgrade of the spec, the plan names every phase and writes nothing;
//! `--yes` runs them (here `--cloudonly`: there is no Kubernetes API) and a rerun has nothing to do.
//! The phases themselves are tested in keelson-ops (`reconcile_moto`).

#[path = "../../cloud-resources/tests/moto/mod.rs"]
mod moto;

use moto::{Moto, BUCKET};

fn write_spec(file: &tempfile::NamedTempFile, ami: &str, version: &str) {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/minimal.yaml")).expect("example");
    let text = text
        .replace("s3://acme-keelson-state/", &format!("s3://{BUCKET}/"))
        .replace("099720109477/ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-20250610", ami)
        .replace("  cloudProvider: aws\n", &format!("  cloudProvider: aws\n  dnsZone: {}\n", moto::ZONE))
        .replace("kubernetesVersion: 1.34.4", &format!("kubernetesVersion: {version}"));
    std::fs::write(file.path(), text).expect("write spec");
}

fn keelson(spec: &tempfile::NamedTempFile, moto: &Moto, args: &[&str]) -> std::process::Output {
    let run = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_keelson"))
            .args(args)
            .args(["-f", &spec.path().display().to_string(), "--offline", "--endpoint-url", &moto.url])
            .args(["--nodeup-asset", moto::NODEUP_AMD64, "--protokube-asset", moto::PROTOKUBE_AMD64])
            .env_remove("KOPS_FEATURE_FLAGS")
            .output()
            .expect("run keelson")
    };
    tokio::task::block_in_place(run)
}

const FAST: [&str; 7] = ["--cloudonly", "--control-plane-interval", "0s", "--node-interval", "0s", "--poll-interval", "100ms"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_plans_each_phase_then_runs_them_and_then_has_nothing_to_do() {
    let moto = Moto::start();
    let ami = moto.fixtures().await;
    let spec = tempfile::NamedTempFile::new().expect("tmp");
    write_spec(&spec, &ami, "1.34.4");
    let out = keelson(&spec, &moto, &["apply", "--yes"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    write_spec(&spec, &ami, "1.35.0");
    let t = moto.target(&[]).await;
    let versions = || async {
        let lts = t.ec2.describe_launch_templates().send().await.expect("templates");
        let mut v: Vec<(String, i64)> = lts
            .launch_templates()
            .iter()
            .map(|l| (l.launch_template_name().unwrap_or_default().to_string(), l.latest_version_number().unwrap_or_default()))
            .collect();
        v.sort();
        v
    };

    let out = keelson(&spec, &moto, &[&["reconcile", "cluster"][..], &FAST].concat());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let headers: Vec<&str> = stdout.lines().filter(|l| l.starts_with("== phase")).collect();
    assert_eq!(headers.len(), 6, "{stdout}");
    assert!(headers[0].contains("control plane: apply") && headers[5].contains("addons"), "{stdout}");
    assert!(stdout.contains("~ LaunchTemplate control-plane-us-east-1a") && stdout.contains("Run with --yes"), "{stdout}");
    assert!(versions().await.iter().all(|(_, v)| *v == 1), "the plan changes nothing");

    let out = keelson(&spec, &moto, &[&["reconcile", "cluster", "--yes"][..], &FAST].concat());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("3 instance(s) replaced"), "{stdout}");
    assert!(versions().await.iter().all(|(_, v)| *v == 2), "{:?}", versions().await);
    let cp = stdout.find("control-plane-us-east-1a: replacing").expect("control plane replaced");
    let nodes = stdout.find("~ LaunchTemplate nodes-us-east-1a").expect("workers' template changed");
    assert!(cp < nodes, "the workers' template changes after the control plane is replaced: {stdout}");

    let out = keelson(&spec, &moto, &[&["reconcile", "cluster"][..], &FAST].concat());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(!stdout.contains("Run with --yes") && stdout.matches("No changes.").count() == 4, "{stdout}");
}
