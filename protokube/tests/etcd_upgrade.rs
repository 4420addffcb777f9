//! etcd version changes on a real 3-member cluster (members in network namespaces, started from
//! protokube's manifests by a stand-in kubelet that runs the etcd build of the image's version):
//! 3.5.21 → 3.6.12 in the spec upgrades in place one member at a time (a, then b, then c), never
//! more than one member down, after a backup; every key is still there. Going back to 3.5.21 is
//! refused (manifests untouched, a clear message); 3.6 → 3.8 is refused as an in-place change and
//! points at the restore.
//!
//! Needs root, iproute2, etcd-client, moto, and Go with the module proxy: both etcd versions are
//! built from go.etcd.io/etcd/server/v3 by tests/kubernetes/images.sh (cached after the first run).

#[path = "support/etcd_loop.rs"]
mod etcd_loop;
#[path = "support/etcd_net.rs"]
mod etcd_net;
#[path = "support/host.rs"]
mod host;
#[path = "../../cloud/tests/support/moto.rs"]
mod moto;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use etcd_loop::{b64, count_keys, gateway, wait_for, Fixture};
use etcd_net::need_tools;
use host::need_root;

const NAME: &str = "upgrade.k8s.local";
const KEYS: usize = 100;

/// The directory of an etcd build of `version` (built once, then cached).
fn etcd_build(version: &str) -> PathBuf {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/kubernetes/images.sh");
    let out = std::process::Command::new(script).args(["etcd", version]).output().expect("run tests/kubernetes/images.sh");
    assert!(
        out.status.success(),
        "building etcd {version} with {script} failed (it needs Go and the Go module proxy):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// What each member's JSON gateway says its version is (`None`: not answering).
fn versions(ips: &[String]) -> Vec<Option<String>> {
    let http = reqwest::blocking::Client::builder().timeout(Duration::from_millis(800)).no_proxy().build().expect("client");
    ips.iter()
        .map(|ip| {
            let r = http.post(format!("http://{ip}:4001/v3/maintenance/status")).body("{}").send().ok()?;
            let v: serde_json::Value = serde_json::from_str(&r.text().ok()?).ok()?;
            v["version"].as_str().map(str::to_string)
        })
        .collect()
}

fn manifest_images(f: &Fixture) -> Vec<String> {
    f.members
        .iter()
        .map(|m| {
            let text = m.host.manifest("main").unwrap_or_default();
            text.lines().find_map(|l| l.trim().strip_prefix("image: ").map(str::to_string)).unwrap_or_default()
        })
        .collect()
}

#[test]
fn minor_upgrade_rolls_one_member_at_a_time_after_a_backup_and_downgrades_are_refused() {
    need_root();
    need_tools();
    let binaries: BTreeMap<String, PathBuf> = ["3.5.21", "3.6.12"].iter().map(|v| (v.to_string(), etcd_build(v).join("etcd"))).collect();
    let (_g, m) = moto::lock();
    let f = Fixture::start(&m.url, 1, NAME, "", binaries, &[]);
    let ips = f.ips();
    wait_for("every member on 3.5.21", Duration::from_secs(60), || (versions(&ips) == vec![Some("3.5.21".to_string()); 3]).then_some(()), || f.diag());
    for i in 0..KEYS {
        gateway(&ips[i % 3], "/v3/kv/put", serde_json::json!({ "key": b64(&format!("key/{i:04}")), "value": b64("v") }));
    }

    // 3.5.21 → 3.6.12: in place, a then b then c, never two members down.
    f.edit_spec(|t| t.replace("version: 3.5.21", "version: 3.6.12"));
    let t = Instant::now();
    let mut upgraded_at: [Option<Duration>; 3] = [None; 3];
    let mut most_down = 0;
    while upgraded_at.iter().any(Option::is_none) {
        assert!(t.elapsed() < Duration::from_secs(180), "not upgraded within 180 s: {upgraded_at:?}\n{}", f.diag());
        let now = versions(&ips);
        most_down = most_down.max(now.iter().filter(|v| v.is_none()).count());
        for (i, v) in now.iter().enumerate() {
            if v.as_deref() == Some("3.6.12") && upgraded_at[i].is_none() {
                upgraded_at[i] = Some(t.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("upgraded at {upgraded_at:?}; at most {most_down} member(s) down at once");
    assert!(upgraded_at[0] < upgraded_at[1] && upgraded_at[1] < upgraded_at[2], "not one at a time in member order: {upgraded_at:?}");
    assert!(most_down <= 1, "{most_down} members were down at once");
    let backups = f.rt.block_on(f.store.list()).expect("list");
    assert!(
        backups.iter().any(|b| b.reason == "before etcd upgrade to 3.6.12" && b.etcd_version == "3.5.21" && b.revision > KEYS as i64),
        "no backup before the upgrade: {backups:?}"
    );
    for ip in &ips {
        wait_for("every key on every member", Duration::from_secs(30), || (count_keys(ip) == KEYS as i64).then_some(()), || f.diag());
    }

    // Back to 3.5.21: refused, nothing restarts.
    let before = manifest_images(&f);
    assert!(before.iter().all(|i| i.ends_with(":v3.6.12")), "{before:?}");
    f.edit_spec(|t| t.replace("version: 3.6.12", "version: 3.5.21"));
    wait_for("the downgrade refused", Duration::from_secs(30), || f.protokube_logs().contains("downgrades are refused").then_some(()), || f.diag());
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(manifest_images(&f), before);
    assert_eq!(versions(&ips), vec![Some("3.6.12".to_string()); 3]);

    // 3.6 → 3.8 skips a minor: not in place; the message points at the restore.
    f.edit_spec(|t| t.replace("version: 3.5.21", "version: 3.8.0"));
    wait_for("the skipped minor refused", Duration::from_secs(30), || f.protokube_logs().contains("is not an in-place upgrade").then_some(()), || f.diag());
    assert!(f.protokube_logs().contains("keelson etcd backup restore -f SPEC --etcd-cluster main --latest --yes"), "{}", f.diag());
    assert_eq!(manifest_images(&f), before);
}
