//! The kubelet's unit as kubeadm and EKS' nodeadm wire it: `kubelet.service` plus the drop-in
//! `kubelet.service.d/10-keelson.conf` with its command line (nodeup's `$DAEMON_ARGS`, then the
//! site's `$KUBELET_EXTRA_ARGS` from `/etc/default/kubelet`, which nodeup never writes), the
//! drop-in configuration directory the site's fragments go to, valid for systemd itself
//! (`systemd-analyze verify` on the root); and restarts by input hash, so a restart lost to a
//! killed run happens on the next one.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

fn direct(m: &testkit::mirror::Mirror, a: &testkit::mirror::FakeAsset) -> Vec<String> {
    vec![m.url(&a.path)]
}

const DROP_IN: &str = "/etc/systemd/system/kubelet.service.d/10-keelson.conf";
const SITE_ENV: &str = "/etc/default/kubelet";
const CONFIG_DIR: &str = "/etc/kubernetes/kubelet.conf.d";

/// `KEY=value` / `KEY="value"` lines of a systemd environment file.
fn env_file(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().trim_matches('"').to_string()))
        .collect()
}

/// The kubelet's argv as systemd builds it from the unit under `root`: the unit file then its
/// drop-ins in name order, `ExecStart=` emptying the list, environment files read in order (`-`:
/// may be absent), each `$VAR` word replaced by its value split at whitespace.
fn kubelet_argv(root: &Path) -> Vec<String> {
    let unit_dir = root.join("etc/systemd/system");
    let mut files = vec![unit_dir.join("kubelet.service")];
    let mut drop_ins: Vec<_> = std::fs::read_dir(unit_dir.join("kubelet.service.d")).expect("drop-in dir").map(|e| e.expect("entry").path()).collect();
    drop_ins.sort();
    files.extend(drop_ins.into_iter().filter(|p| p.extension().is_some_and(|e| e == "conf")));
    let (mut exec, mut env_files) = (Vec::<String>::new(), Vec::<String>::new());
    for f in files {
        for line in std::fs::read_to_string(&f).expect("unit").lines() {
            if let Some(v) = line.strip_prefix("ExecStart=") {
                if v.is_empty() {
                    exec.clear();
                } else {
                    exec.push(v.to_string());
                }
            } else if let Some(v) = line.strip_prefix("EnvironmentFile=") {
                env_files.push(v.to_string());
            }
        }
    }
    assert_eq!(exec.len(), 1, "one command line: {exec:?}");
    let mut env = std::collections::BTreeMap::new();
    for f in env_files {
        let (optional, path) = f.strip_prefix('-').map(|p| (true, p)).unwrap_or((false, &f));
        match std::fs::read_to_string(root.join(path.trim_start_matches('/'))) {
            Ok(text) => env.extend(env_file(&text)),
            Err(e) => assert!(optional, "{path}: {e}"),
        }
    }
    exec[0]
        .split_whitespace()
        .flat_map(|w| match w.strip_prefix('$') {
            Some(var) => env.get(var).map(|v| v.split_whitespace().map(str::to_string).collect()).unwrap_or_default(),
            None => vec![w.to_string()],
        })
        .collect()
}

/// `systemd-analyze verify --root` of `units` under `root` (the host's targets and slices copied in,
/// which every service's default dependencies name): Ok, or systemd's complaint.
fn verify(root: &Path, units: &[&str]) -> Result<(), String> {
    let lib = root.join("usr/lib/systemd/system");
    std::fs::create_dir_all(&lib).expect("mkdir");
    for e in std::fs::read_dir("/usr/lib/systemd/system").expect("this test needs systemd's units in /usr/lib/systemd/system") {
        let p = e.expect("entry").path();
        if p.extension().is_some_and(|x| x == "target" || x == "slice") && p.is_file() {
            std::fs::copy(&p, lib.join(p.file_name().expect("name"))).expect("copy");
        }
    }
    let paths: Vec<_> = units.iter().map(|u| root.join("etc/systemd/system").join(u)).collect();
    let o = Command::new("systemd-analyze")
        .arg("verify")
        .arg(format!("--root={}", root.display()))
        .args(&paths)
        .output()
        .expect("this test needs systemd-analyze (apt-get install systemd)");
    let stderr = String::from_utf8_lossy(&o.stderr).trim().to_string();
    if o.status.success() && stderr.is_empty() {
        Ok(())
    } else {
        Err(format!("{}: {stderr}", o.status))
    }
}

#[test]
fn the_drop_in_carries_nodeups_flags_then_the_sites_which_survive_reruns() {
    let s = Scenario::new(Group::Worker, 1024, direct);
    assert_ok(&s.run(&[]));
    let drop_in = std::fs::read_to_string(s.path(DROP_IN)).expect("the kubelet's drop-in");
    assert!(
        drop_in.contains("[Service]\nEnvironmentFile=/etc/sysconfig/kubelet\nEnvironmentFile=-/etc/default/kubelet\nExecStart=\nExecStart=/usr/local/bin/kubelet $DAEMON_ARGS $KUBELET_EXTRA_ARGS\n"),
        "{drop_in}"
    );
    assert!(!s.path(SITE_ENV).exists(), "nodeup never writes the site's file");
    let nodeup_flags = kubelet_argv(&s.root);
    assert!(nodeup_flags.contains(&"--config=/var/lib/kubelet/kubelet.conf".to_string()), "{nodeup_flags:?}");
    assert!(nodeup_flags.contains(&format!("--config-dir={CONFIG_DIR}")), "{nodeup_flags:?}");
    assert!(s.path(CONFIG_DIR).is_dir(), "the drop-in configuration directory exists");

    // The site's flags and configuration fragment, then nodeup again.
    let site = "# site\nKUBELET_EXTRA_ARGS=\"--max-pods=42 --v=4\"\n";
    std::fs::create_dir_all(s.path("/etc/default")).expect("mkdir");
    std::fs::write(s.path(SITE_ENV), site).expect("site env");
    let fragment = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 42\n";
    std::fs::write(s.path(&format!("{CONFIG_DIR}/50-site.conf")), fragment).expect("fragment");
    let o = s.run(&[]);
    assert_ok(&o);
    assert!(last_line(&o).ends_with(" 0 changed"), "{}", stdout(&o));
    assert_eq!(std::fs::read_to_string(s.path(SITE_ENV)).expect("site env"), site, "kept");
    assert_eq!(std::fs::read_to_string(s.path(&format!("{CONFIG_DIR}/50-site.conf"))).expect("fragment"), fragment, "kept");

    // On the command line: nodeup's flags, then the site's (the later of two wins: --v=4).
    let argv = kubelet_argv(&s.root);
    assert_eq!(argv[0], "/usr/local/bin/kubelet");
    assert_eq!(argv[..nodeup_flags.len()], nodeup_flags[..]);
    assert_eq!(argv[nodeup_flags.len()..], ["--max-pods=42", "--v=4"]);
}

#[test]
fn systemd_accepts_the_units_and_refuses_a_second_command_line() {
    let s = Scenario::new(Group::Worker, 1024, direct);
    assert_ok(&s.run(&[]));
    verify(&s.root, &["kubelet.service", "containerd.service"]).expect("systemd-analyze verify");
    // The control: without `ExecStart=` first, a drop-in's command line is a second one.
    let bad = s.path("/etc/systemd/system/kubelet.service.d/20-no-reset.conf");
    std::fs::write(&bad, "[Service]\nExecStart=/usr/local/bin/kubelet --v=9\n").expect("write");
    let e = verify(&s.root, &["kubelet.service"]).expect_err("two command lines");
    assert!(e.contains("more than one ExecStart="), "{e}");
}

/// The NodeupConfig in the scenario's state store edited, and the BootConfig's pin updated (as
/// `keelson apply` writes a new one).
fn edit_nodeup_config(s: &Scenario, edit: impl Fn(&str) -> String) {
    let path = s.dir.path().join("state/igconfig/node/nodes/nodeupconfig.yaml");
    let text = std::fs::read_to_string(&path).expect("nodeup config");
    let edited = edit(&text);
    assert_ne!(edited, text, "the edit changed nothing");
    std::fs::write(&path, &edited).expect("write");
    let mut boot: keelson_api::nodeup::BootConfig = serde_yaml_ng::from_str(&std::fs::read_to_string(&s.boot).expect("boot")).expect("boot yaml");
    boot.nodeup_config_hash = base::nodeup_config_hash(edited.as_bytes());
    std::fs::write(&s.boot, serde_yaml_ng::to_string(&boot).expect("yaml")).expect("write boot");
}

#[test]
fn a_restart_lost_to_a_killed_run_happens_on_the_next_run() {
    let s = Scenario::new(Group::Worker, 1024, direct);
    assert_ok(&s.run(&[]));
    let hash = s.path("/var/lib/keelson/nodeup/units/kubelet.service.hash");
    let started_with = std::fs::read_to_string(&hash).expect("the kubelet's input hash, recorded with its restart");
    assert!(last_line(&s.run(&[])).ends_with(" 0 changed"));

    // A new kubelet configuration; the run that applies it is killed after writing kubelet.conf and
    // before restarting the kubelet: the file is what `nodeup render` makes of the new config.
    edit_nodeup_config(&s, |t| t.replacen("KubeletConfig:\n", "KubeletConfig:\n  maxPods: 42\n", 1));
    let render = s.dir.path().join("render");
    let o = Command::new(env!("CARGO_BIN_EXE_nodeup"))
        .args(["render", "--conf"])
        .arg(&s.boot)
        .arg("--out")
        .arg(&render)
        .args(["--hostname", "ip-172-20-33-10.eu-west-1.compute.internal", "--internal-ip", "172.20.33.10", "--arch", "amd64"])
        .env("NODEUP_LOG", "warn")
        .output()
        .expect("nodeup render");
    assert_ok(&o);
    let conf = std::fs::read(render.join("var/lib/kubelet/kubelet.conf")).expect("rendered kubelet.conf");
    assert_ne!(std::fs::read(s.path("/var/lib/kubelet/kubelet.conf")).expect("kubelet.conf"), conf);
    assert!(String::from_utf8_lossy(&conf).contains("maxPods: 42"));
    base::fs::write_atomic(&s.path("/var/lib/kubelet/kubelet.conf"), &conf, 0o644, None).expect("the killed run's write");

    // The next run finds every file right, and still restarts the kubelet: its inputs are not those
    // it last started with.
    let o = s.run(&[]);
    assert_ok(&o);
    let out = stdout(&o);
    assert!(!out.contains("file:/var/lib/kubelet/kubelet.conf"), "the file was already written: {out}");
    assert!(out.contains("service:kubelet.service: restart (its inputs differ from those it last started with"), "{out}");
    assert!(out.contains("systemctl restart kubelet.service"), "{out}");
    assert!(!out.contains("systemctl restart containerd.service"), "containerd's inputs are unchanged: {out}");
    assert_ne!(std::fs::read_to_string(&hash).expect("hash"), started_with, "the new hash is recorded with the restart");
    let o = s.run(&[]);
    assert!(last_line(&o).ends_with(" 0 changed"), "restarted once: {}", stdout(&o));
}
