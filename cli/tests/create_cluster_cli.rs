//! `keelson create cluster` through the binary, as a user runs it: for AWS and GCE, public and
//! private, the spec it writes passes `keelson validate` and `keelson compile`; an existing spec is
//! never overwritten; `--dry-run -o json` prints the documents; flags Keelson cannot honour fail
//! naming the flag or the refused field.

use std::path::Path;
use std::process::{Command, Output};

fn keelson(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_keelson")).args(args).current_dir(dir).env_remove("KOPS_STATE_STORE").env("NO_COLOR", "1").output().expect("run keelson")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn created_specs_validate_and_compile() {
    let dir = tempfile::tempdir().expect("tmp");
    let cases: &[(&str, &[&str])] = &[
        ("aws-public.example.com", &["--zones", "us-east-1a,us-east-1b", "--state", "s3://acme-state"]),
        (
            "aws-private.example.com",
            &[
                "--zones",
                "us-east-1a,us-east-1b,us-east-1c",
                "--state",
                "s3://acme-state",
                "--topology",
                "private",
                "--bastion",
                "--control-plane-count",
                "3",
                "--dns-zone",
                "example.com",
            ],
        ),
        (
            "gce-public.example.com",
            &["--zones", "europe-west1-b", "--state", "gs://acme-state", "--project", "acme", "--networking", "kubenet", "--dns-zone", "example.com"],
        ),
        (
            "gce-private.example.com",
            &[
                "--zones",
                "europe-west1-b,europe-west1-c,europe-west1-d",
                "--cloud",
                "gce",
                "--state",
                "gs://acme-state",
                "--project",
                "acme",
                "-t",
                "private",
                "--node-count",
                "4",
            ],
        ),
    ];
    for (name, flags) in cases {
        let mut args = vec!["create", "cluster", name];
        args.extend_from_slice(flags);
        let out = keelson(dir.path(), &args);
        assert!(out.status.success(), "{name}: create:\n{}", text(&out));
        let file = format!("{name}.yaml");
        let out = keelson(dir.path(), &["validate", "-f", &file]);
        assert!(out.status.success(), "{name}: validate:\n{}", text(&out));
        let out = keelson(dir.path(), &["compile", "-f", &file, "--out", &format!("out-{name}")]);
        assert!(out.status.success(), "{name}: compile:\n{}", text(&out));
        assert!(dir.path().join(format!("out-{name}/cluster-completed.yaml")).is_file(), "{name}: no completed spec");

        // A second create never overwrites the spec a team may have edited.
        let before = std::fs::read(dir.path().join(&file)).expect("spec");
        let out = keelson(dir.path(), &args);
        assert!(!out.status.success() && text(&out).contains("never overwritten"), "{name}: second create:\n{}", text(&out));
        assert_eq!(std::fs::read(dir.path().join(&file)).expect("spec"), before);
    }
}

#[test]
fn dry_run_prints_and_bad_flags_are_named() {
    let dir = tempfile::tempdir().expect("tmp");
    let out = keelson(dir.path(), &["create", "cluster", "--name", "d.example.com", "--zones", "us-east-1a", "--state", "s3://b", "--dry-run", "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(list["items"][0]["kind"], "Cluster");
    assert_eq!(list["items"].as_array().map(Vec::len), Some(3));
    assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 0, "--dry-run writes nothing");

    for (flags, want) in [
        (&["--dry-run"][..], "--dry-run needs -o"),
        (&["--cloud", "azure"][..], "--cloud"),
        (&["--networking", "amazonvpc"][..], "spec.networking.amazonvpc"),
        (&["--topology", "mesh"][..], "--topology"),
    ] {
        let mut args = vec!["create", "cluster", "x.example.com", "--zones", "us-east-1a", "--state", "s3://b"];
        args.extend_from_slice(flags);
        let out = keelson(dir.path(), &args);
        assert!(!out.status.success() && text(&out).contains(want), "{flags:?}: want {want:?}:\n{}", text(&out));
    }
}
