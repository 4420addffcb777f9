//! Crash safety: SIGKILL nodeup at many moments of a run; after every kill each file in the
//! root is either absent or complete (identical to a converged reference), and a rerun converges.

mod common;

use std::time::Duration;

use common::*;
use testkit::mirror::{sha256_hex, Behaviour};

fn check_complete(s: &Scenario, reference: &std::collections::BTreeMap<String, Vec<u8>>, when: &str) {
    for (rel, bytes) in tree(&s.root) {
        let name = rel.rsplit('/').next().unwrap_or("");
        if name.starts_with(".keelson-tmp-") || rel.contains("/.keelson-tmp-") {
            continue; // a temp file (or a file inside a temp dir) is not a file in place
        }
        if let Some(hash) = rel.strip_prefix("var/cache/nodeup/sha256/").filter(|h| !h.contains('/')) {
            assert_eq!(sha256_hex(&bytes), hash, "{when}: cache entry {rel} is incomplete");
            continue;
        }
        let want = reference.get(&rel).unwrap_or_else(|| panic!("{when}: unexpected file {rel}"));
        assert!(&bytes == want, "{when}: {rel} is incomplete or wrong ({} bytes, want {})", bytes.len(), want.len());
    }
}

#[test]
fn sigkill_at_many_moments_leaves_only_complete_files_and_rerun_converges() {
    let pad = 512 * 1024;
    // Reference: the same inputs converged without interruption.
    let reference_run = Scenario::new(Group::Worker, pad, |m, a| vec![m.url(&a.path)]);
    assert_ok(&reference_run.run(&[]));
    let reference = tree(&reference_run.root);
    assert!(reference.len() > 20);

    let s = Scenario::new(Group::Worker, pad, |m, a| vec![m.url(&a.path)]);
    // Serve slowly so kills land during downloads, unpacking and writes.
    for a in &s.assets {
        s.mirror.set(&a.path, Behaviour::Slow(Duration::from_millis(3)));
    }
    // The state store (and so the bootstrap token) differs between the two scenarios: compare
    // files that depend on it by presence only.
    // The kubelet's input hash covers two of them (its bootstrap kubeconfig and the CA).
    let state_dependent =
        ["var/lib/kubelet/bootstrap-kubeconfig", "etc/keelson/bootconfig.yaml", "srv/kubernetes/ca.crt", "var/lib/keelson/nodeup/units/kubelet.service.hash"];
    let mut reference = reference.clone();
    for p in state_dependent {
        reference.remove(p);
    }
    let mut kills = 0;
    for step in 0..40u64 {
        let mut child = s.command(&[]).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().expect("spawn");
        std::thread::sleep(Duration::from_millis(2 + step * 4));
        if child.try_wait().expect("try_wait").is_none() {
            child.kill().expect("SIGKILL");
            kills += 1;
        }
        let _ = child.wait();
        // Files that depend on the state store: complete means parseable, whole documents.
        for p in state_dependent {
            let path = s.root.join(p);
            if path.exists() {
                let text = std::fs::read_to_string(&path).expect("utf8");
                let complete = if p.ends_with(".crt") {
                    text.trim_end().ends_with("-----END CERTIFICATE-----")
                } else {
                    serde_yaml_ng::from_str::<serde_yaml_ng::Value>(&text).is_ok() && text.ends_with('\n')
                };
                assert!(complete, "step {step}: {p} incomplete");
            }
        }
        check_complete_except(&s, &reference, &state_dependent, &format!("after kill at step {step}"));
    }
    assert!(kills >= 10, "only {kills} runs were still going when killed; slow the mirror down");

    let o = s.run(&[]);
    assert_ok(&o);
    let mut after = tree(&s.root);
    for p in state_dependent {
        assert!(after.remove(p).is_some(), "{p} missing after rerun");
    }
    // Identical trees: no temp file left, nothing missing.
    let want = reference.clone();
    assert_eq!(after.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>());
    assert!(after == want, "converged files differ from the reference");
    let o = s.run(&[]);
    assert_ok(&o);
    assert!(last_line(&o).ends_with(" 0 changed"), "{}", stdout(&o));
}

fn check_complete_except(s: &Scenario, reference: &std::collections::BTreeMap<String, Vec<u8>>, skip: &[&str], when: &str) {
    let mut r = reference.clone();
    for p in skip {
        if s.root.join(p).exists() {
            r.insert(p.to_string(), std::fs::read(s.root.join(p)).unwrap_or_default());
        }
    }
    check_complete(s, &r, when);
}
