//! `nodeup render --conf BOOTCONFIG --out DIR`: what nodeup would write, and nothing else — no
//! download, no install, no process. And the kubelet's last mile: every field of
//! `KubeletConfigSpec` that Keelson supports (`keelson_api::support::KUBELET`), set to a
//! non-default value in the NodeupConfig, appears in the rendered `kubelet.conf` at its
//! `KubeletConfiguration` key or among the kubelet's flags.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;

use common::*;
use keelson_api::support::{Use, KUBELET};
use serde_yaml_ng::Value;

/// (json key, value in the NodeupConfig, expected rendering: the kubelet.conf value (YAML) or the
/// flag's value). Every supported field is here (checked below), none at its default.
const FIELDS: &[(&str, &str, &str)] = &[
    ("anonymousAuth", "true", "true"),
    ("authorizationMode", "AlwaysAllow", "AlwaysAllow"),
    ("bootstrapKubeconfig", "/var/lib/kubelet/other-bootstrap", "/var/lib/kubelet/other-bootstrap"),
    ("clientCaFile", "/srv/kubernetes/other-ca.crt", "/srv/kubernetes/other-ca.crt"),
    ("tlsCipherSuites", "[TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]", "[TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]"),
    ("tlsMinVersion", "VersionTLS13", "VersionTLS13"),
    ("kubeconfigPath", "/var/lib/kubelet/kubeconfig2", "/var/lib/kubelet/kubeconfig2"),
    ("logFormat", "json", "json"),
    ("logLevel", "4", "4"),
    ("podManifestPath", "/etc/kubernetes/static", "/etc/kubernetes/static"),
    ("hostnameOverride", "node-x.example.com", "node-x.example.com"),
    ("seccompDefault", "true", "true"),
    ("enableDebuggingHandlers", "false", "false"),
    ("registerNode", "false", "false"),
    ("nodeStatusUpdateFrequency", "20s", "20s"),
    ("clusterDomain", "example.local", "example.local"),
    ("clusterDNS", "10.0.0.53", "[10.0.0.53]"),
    ("cloudProvider", "external", "external"),
    ("kubeletCgroups", "/kubelet.slice", "/kubelet.slice"),
    ("runtimeCgroups", "/system.slice/containerd.service", "/system.slice/containerd.service"),
    ("readOnlyPort", "10255", "10255"),
    ("systemCgroups", "/system.slice", "/system.slice"),
    ("cgroupRoot", "/pods", "/pods"),
    ("hairpinMode", "hairpin-veth", "hairpin-veth"),
    ("maxPods", "55", "55"),
    ("podCIDR", "10.200.0.0/24", "10.200.0.0/24"),
    ("resolvConf", "/run/systemd/resolve/resolv.conf", "/run/systemd/resolve/resolv.conf"),
    ("registerSchedulable", "false", "false"),
    ("serializeImagePulls", "false", "false"),
    ("nodeLabels", "{example.com/role: web}", "example.com/role=web"),
    ("imageMinimumGCAge", "3m", "3m0s"),
    ("imageMaximumGCAge", "168h", "168h0m0s"),
    ("maxParallelImagePulls", "3", "3"),
    ("imageGCHighThresholdPercent", "80", "80"),
    ("imageGCLowThresholdPercent", "70", "70"),
    ("evictionHard", "memory.available<200Mi,nodefs.available<5%", "{memory.available: 200Mi, nodefs.available: 5%}"),
    ("evictionSoft", "memory.available<300Mi", "{memory.available: 300Mi}"),
    ("evictionSoftGracePeriod", "memory.available=30s", "{memory.available: 30s}"),
    ("evictionPressureTransitionPeriod", "45s", "45s"),
    ("evictionMaxPodGracePeriod", "60", "60"),
    ("evictionMinimumReclaim", "memory.available=100Mi", "{memory.available: 100Mi}"),
    ("volumePluginDirectory", "/usr/libexec/kubernetes/plugins", "/usr/libexec/kubernetes/plugins"),
    ("taints", "['example.com/t=v:NoSchedule']", "[{key: example.com/t, value: v, effect: NoSchedule}]"),
    ("featureGates", "{ImageVolume: 'false'}", "{ImageVolume: false}"),
    ("kernelMemcgNotification", "true", "true"),
    ("kubeReserved", "{cpu: 100m}", "{cpu: 100m}"),
    ("kubeReservedCgroup", "/kube-reserved", "/kube-reserved"),
    ("systemReserved", "{memory: 100Mi}", "{memory: 100Mi}"),
    ("systemReservedCgroup", "/system-reserved", "/system-reserved"),
    ("enforceNodeAllocatable", "pods,system-reserved", "[pods, system-reserved]"),
    ("runtimeRequestTimeout", "3m", "3m0s"),
    ("volumeStatsAggPeriod", "2m", "2m0s"),
    ("failSwapOn", "false", "false"),
    ("experimentalAllowedUnsafeSysctls", "[net.core.a]", "[net.core.a, net.core.b]"),
    ("allowedUnsafeSysctls", "[net.core.b]", "[net.core.a, net.core.b]"),
    ("streamingConnectionIdleTimeout", "5m", "5m0s"),
    ("rootDir", "/var/lib/kubelet2", "/var/lib/kubelet2"),
    ("authenticationTokenWebhook", "true", "true"),
    ("authenticationTokenWebhookCacheTtl", "30s", "30s"),
    ("cpuCFSQuota", "false", "false"),
    ("cpuCFSQuotaPeriod", "50ms", "50ms"),
    ("cpuManagerPolicy", "static", "static"),
    ("registryPullQPS", "7", "7"),
    ("registryBurst", "20", "20"),
    ("topologyManagerPolicy", "best-effort", "best-effort"),
    ("rotateCertificates", "true", "true"),
    ("protectKernelDefaults", "false", "false"),
    ("cgroupDriver", "cgroupfs", "cgroupfs"),
    ("housekeepingInterval", "20s", "20s"),
    ("eventBurst", "30", "30"),
    ("containerLogMaxSize", "20Mi", "20Mi"),
    ("containerLogMaxFiles", "4", "4"),
    ("podPidsLimit", "1000", "1000"),
    ("experimentalAllocatableIgnoreEviction", "true", "true"),
    ("shutdownGracePeriod", "45s", "45s"),
    ("shutdownGracePeriodCriticalPods", "15s", "15s"),
    ("memorySwapBehavior", "LimitedSwap", "LimitedSwap"),
    ("crashLoopBackOffMaxContainerRestartPeriod", "1m", "1m0s"),
    ("kubeAPIQPS", "60", "60"),
    ("eventRecordQPS", "9", "9"),
    ("nodeLeaseDurationSeconds", "50", "50"),
];

/// Fields that map to the same place as another one and are checked in a second render:
/// kOps' `eventQPS` is the older name of `eventRecordQPS` and wins over it.
const SHADOWING: &[(&str, &str, &str)] = &[("eventQPS", "7", "7")];

/// The fixture NodeupConfig with its `KubeletConfig` section replaced by `fields`.
fn with_kubelet(fixture: String, fields: &[(&str, &str, &str)]) -> String {
    let mut out = String::new();
    let mut replacing = false;
    for line in fixture.lines() {
        if line == "KubeletConfig:" {
            out.push_str("KubeletConfig:\n");
            for (key, value, _) in fields {
                out.push_str(&format!("  {key}: {value}\n"));
            }
            replacing = true;
            continue;
        }
        if replacing && line.starts_with(' ') {
            continue;
        }
        replacing = false;
        out.push_str(line);
        out.push('\n');
    }
    assert!(out.contains(&format!("  {}: ", fields[0].0)), "the fixture has a KubeletConfig section");
    out
}

fn render(fields: &[(&str, &str, &str)]) -> (Scenario, tempfile::TempDir, Output) {
    let owned: Vec<(String, String, String)> = fields.iter().map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string())).collect();
    let s = Scenario::edited(
        Group::ControlPlane,
        64,
        |m, a| vec![m.url(&a.path)],
        move |text| {
            let f: Vec<(&str, &str, &str)> = owned.iter().map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str())).collect();
            with_kubelet(text, &f)
        },
    );
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

fn check(dir: &Path, fields: &[(&str, &str, &str)]) -> Vec<String> {
    let conf: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(dir.join("var/lib/kubelet/kubelet.conf")).expect("kubelet.conf")).expect("yaml");
    let flags = flags(dir);
    let mut bad = Vec::new();
    for (key, _, want) in fields {
        let used = KUBELET.iter().find(|f| f.key == *key).map(|f| f.used);
        match used {
            Some(Use::KubeletConfig(path)) => {
                let want: Value = serde_yaml_ng::from_str(want).expect("expected value");
                match at(&conf, path) {
                    Some(got) if *got == want => {}
                    got => bad.push(format!("{key}: kubelet.conf {path} = {got:?}, want {want:?}")),
                }
            }
            Some(Use::KubeletFlag(flag)) => {
                if flags.get(flag).map(String::as_str) != Some(*want) {
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
    // The list above covers every field the table places in kubelet.conf or on the command line.
    let listed: Vec<&str> = FIELDS.iter().chain(SHADOWING).map(|(k, _, _)| *k).collect();
    for f in KUBELET {
        if matches!(f.used, Use::KubeletConfig(_) | Use::KubeletFlag(_)) {
            assert!(listed.contains(&f.key), "{}: supported, but not set by this test", f.key);
        }
    }
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

    let s = Scenario::edited(Group::ControlPlane, 64, |m, a| vec![m.url(&a.path)], |t| with_kubelet(t, &[("networkPluginName", "cni", "")]));
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
