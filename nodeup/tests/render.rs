//! `nodeup render --conf BOOTCONFIG --out DIR`: what nodeup would write, and nothing else — no
//! download, no install, no process. And the kubelet's last mile: every field of
//! `KubeletConfigSpec` that Keelson supports (`keelson_api::support::KUBELET`), set to a
//! non-default value in the NodeupConfig (`testkit::kubelet_fields`), appears in the rendered
//! `kubelet.conf` at its `KubeletConfiguration` key or among the kubelet's flags. That the key names
//! and value shapes are the kubelet's own is keelson-local's `tests/tests/kubelet.rs`: the real
//! kubelet, run on the same render.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;

use common::*;
use keelson_api::support::{Use, KUBELET};
use serde_yaml_ng::Value;
use testkit::kubelet_fields::{unlisted, with_kubelet, KubeletField, FIELDS, SHADOWING};

fn render(fields: &'static [KubeletField]) -> (Scenario, tempfile::TempDir, Output) {
    let s = Scenario::edited(Group::ControlPlane, 64, |m, a| vec![m.url(&a.path)], |text| with_kubelet(&text, fields));
    let out = tempfile::tempdir().expect("out");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_nodeup"))
        .args(["render", "--conf"])
        .arg(&s.boot)
        .arg("--out")
        .arg(out.path())
        .args(["--hostname", "ip-172-20-33-10.eu-west-1.compute.internal", "--internal-ip", "172.20.33.10", "--arch", "amd64"])
        .args(["--instance-id", "i-0a1b2c3d4e5f60718", "--zone", "eu-west-1a"])
        .env("NODEUP_LOG", "warn")
        .output()
        .expect("run nodeup render");
    assert_ok(&o);
    (s, out, o)
}

/// The value at a dotted key path of a YAML document.
fn at<'a>(doc: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(doc, |v, k| v.get(k))
}

/// `--name=value` of the kubelet's flags file.
fn flags(dir: &Path) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(dir.join("etc/sysconfig/kubelet")).expect("sysconfig");
    let args = text.lines().find_map(|l| l.strip_prefix("DAEMON_ARGS=\"")).expect("DAEMON_ARGS").trim_end_matches('"');
    args.split(' ').filter_map(|a| a.strip_prefix("--")?.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn check(dir: &Path, fields: &[KubeletField]) -> Vec<String> {
    let conf: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(dir.join("var/lib/kubelet/kubelet.conf")).expect("kubelet.conf")).expect("yaml");
    let flags = flags(dir);
    let mut bad = Vec::new();
    for &KubeletField { key, rendered: want, .. } in fields {
        let used = KUBELET.iter().find(|f| f.key == key).map(|f| f.used);
        match used {
            Some(Use::KubeletConfig(path)) => {
                let want: Value = serde_yaml_ng::from_str(want).expect("expected value");
                match at(&conf, path) {
                    Some(got) if *got == want => {}
                    got => bad.push(format!("{key}: kubelet.conf {path} = {got:?}, want {want:?}")),
                }
            }
            Some(Use::KubeletFlag(flag)) => {
                if flags.get(flag).map(String::as_str) != Some(want) {
                    bad.push(format!("{key}: --{flag}={:?}, want {want:?}", flags.get(flag)));
                }
            }
            other => bad.push(format!("{key}: classified {other:?}, not a kubelet config key or flag")),
        }
    }
    bad
}

#[test]
fn every_supported_kubelet_field_reaches_kubelet_conf_or_a_flag() {
    // The shared list covers every field the table places in kubelet.conf or on the command line.
    assert!(unlisted().is_empty(), "supported, but not set by this test: {:?}", unlisted());
    let (s, out, o) = render(FIELDS);
    let bad = check(out.path(), FIELDS);
    assert!(bad.is_empty(), "{} fields lost on the way to the kubelet:\n{}", bad.len(), bad.join("\n"));

    // A render writes the host's files and nothing else: no download, no binary, no process.
    assert_eq!(s.mirror.requests(), 0, "render downloaded something");
    assert!(!out.path().join("usr/local/bin/kubelet").exists(), "render installed the kubelet");
    assert!(out.path().join("etc/systemd/system/kubelet.service").is_file());
    assert!(out.path().join("etc/kubernetes/static/kube-apiserver.manifest").is_file(), "static pods go to podManifestPath");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("not rendered: download:"), "downloads are listed: {stdout}");
    assert!(stdout.contains("not run: systemctl"), "commands are listed: {stdout}");
    assert!(stdout.lines().last().is_some_and(|l| l.contains("rendered into")), "{stdout}");

    let (_, out, _) = render(SHADOWING);
    let bad = check(out.path(), SHADOWING);
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn render_refuses_a_non_empty_directory_and_a_refused_field() {
    let s = Scenario::new(Group::Worker, 64, |m, a| vec![m.url(&a.path)]);
    let out = tempfile::tempdir().expect("out");
    std::fs::write(out.path().join("x"), "").expect("write");
    let o =
        std::process::Command::new(env!("CARGO_BIN_EXE_nodeup")).args(["render", "--conf"]).arg(&s.boot).arg("--out").arg(out.path()).output().expect("run");
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("not empty"), "{}", String::from_utf8_lossy(&o.stderr));

    let s = Scenario::edited(
        Group::ControlPlane,
        64,
        |m, a| vec![m.url(&a.path)],
        |t| with_kubelet(&t, &[KubeletField { key: "networkPluginName", value: "cni", rendered: "" }]),
    );
    let out = tempfile::tempdir().expect("out");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_nodeup"))
        .args(["render", "--conf"])
        .arg(&s.boot)
        .arg("--out")
        .arg(out.path())
        .args(["--hostname", "cp", "--internal-ip", "172.20.33.10", "--arch", "amd64"])
        .output()
        .expect("run");
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("KubeletConfig.networkPluginName") && err.contains("dockershim"), "{err}");
    assert!(std::fs::read_dir(out.path()).expect("out").next().is_none(), "nothing is written when the model cannot be built");
}
