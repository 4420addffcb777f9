//! Talking to the etcd members inside the machines: `etcdctl` run in the machine (so names resolve
//! through that machine's /etc/hosts and TLS files are where the manifest says), with the
//! endpoint and certificates taken from the etcd manifest protokube wrote.

use std::path::Path;

use crate::machine;

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Endpoint {
    pub cluster: String,
    pub member: String,
    pub client_url: String,
    pub cacert: Option<String>,
    pub cert: Option<String>,
    pub key: Option<String>,
    /// The member's etcd image.
    #[serde(default)]
    pub image: String,
}

/// Read `/etc/kubernetes/manifests/etcd-<cluster>.manifest` from a machine's root.
pub fn endpoint(root: &Path, cluster: &str) -> Option<Endpoint> {
    let text = std::fs::read_to_string(crate::paths::in_root(root, &format!("{}/etcd-{cluster}.manifest", keelson_api::host_paths::STATIC_POD_DIR))).ok()?;
    let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).ok()?;
    let c = v.get("spec")?.get("containers")?.as_sequence()?.first()?;
    let mut args: Vec<String> = Vec::new();
    for k in ["command", "args"] {
        if let Some(seq) = c.get(k).and_then(|x| x.as_sequence()) {
            args.extend(seq.iter().filter_map(|a| a.as_str().map(str::to_string)));
        }
    }
    let flag = |name: &str| args.iter().find_map(|a| a.strip_prefix(&format!("--{name}=")).map(str::to_string));
    Some(Endpoint {
        cluster: cluster.to_string(),
        member: flag("name").unwrap_or_default(),
        client_url: flag("advertise-client-urls")?.split(',').next()?.to_string(),
        cacert: flag("trusted-ca-file"),
        cert: flag("cert-file"),
        key: flag("key-file"),
        image: c.get("image").and_then(|i| i.as_str()).unwrap_or_default().to_string(),
    })
}

/// `etcdctl` (API v3) against `ep` from inside the machine.
pub fn etcdctl(init_pid: i64, ep: &Endpoint, args: &[&str]) -> Result<String, crate::cmd::CmdError> {
    let mut argv: Vec<String> = vec![
        "env".into(),
        "ETCDCTL_API=3".into(),
        "etcdctl".into(),
        format!("--endpoints={}", ep.client_url),
        "--dial-timeout=2s".into(),
        "--command-timeout=4s".into(),
    ];
    if let Some(c) = &ep.cacert {
        argv.push(format!("--cacert={c}"));
    }
    if let (Some(c), Some(k)) = (&ep.cert, &ep.key) {
        argv.push(format!("--cert={c}"));
        argv.push(format!("--key={k}"));
    }
    argv.extend(args.iter().map(|a| a.to_string()));
    let refs: Vec<&str> = argv.iter().map(String::as_str).collect();
    machine::exec_in(init_pid, &refs)
}

/// Members as (name, id) from `member list -w json`.
pub fn members(init_pid: i64, ep: &Endpoint) -> Option<Vec<(String, String)>> {
    let out = etcdctl(init_pid, ep, &["member", "list", "-w", "json"]).ok()?;
    let v: serde_json::Value = serde_json::from_str(&out).ok()?;
    let mut m: Vec<(String, String)> =
        v["members"].as_array()?.iter().map(|x| (x["name"].as_str().unwrap_or("").to_string(), format!("{:x}", x["ID"].as_u64().unwrap_or(0)))).collect();
    m.sort();
    Some(m)
}

/// The etcd cluster's id (hex) from `member list -w json`: a cluster bootstrapped anew gets
/// another one, a member removed and re-added keeps it.
pub fn cluster_id(init_pid: i64, ep: &Endpoint) -> Option<String> {
    let out = etcdctl(init_pid, ep, &["member", "list", "-w", "json"]).ok()?;
    let v: serde_json::Value = serde_json::from_str(&out).ok()?;
    v["header"]["cluster_id"].as_u64().map(|id| format!("{id:x}"))
}

/// This member's id and the leader it knows (hex; `0` when it knows none), from `endpoint status`.
pub fn leader(init_pid: i64, ep: &Endpoint) -> Option<(String, String)> {
    let out = etcdctl(init_pid, ep, &["endpoint", "status", "-w", "json", "--dial-timeout=1s", "--command-timeout=2s"]).ok()?;
    let v: serde_json::Value = serde_json::from_str(&out).ok()?;
    let status = &v.as_array()?.first()?["Status"];
    Some((format!("{:x}", status["header"]["member_id"].as_u64()?), format!("{:x}", status["leader"].as_u64().unwrap_or(0))))
}

pub fn healthy(init_pid: i64, ep: &Endpoint) -> bool {
    etcdctl(init_pid, ep, &["endpoint", "health"]).is_ok()
}

/// [`healthy`], giving up after about a second (a member that is not there yet must not hold a
/// timing poll up for etcdctl's 2-s dial and 4-s command timeouts; the later flags win).
pub fn healthy_quickly(init_pid: i64, ep: &Endpoint) -> bool {
    etcdctl(init_pid, ep, &["endpoint", "health", "--dial-timeout=500ms", "--command-timeout=1s"]).is_ok()
}

/// Number of keys under `prefix`, read from this member alone (serializable).
pub fn count(init_pid: i64, ep: &Endpoint, prefix: &str) -> Option<u64> {
    let out = etcdctl(init_pid, ep, &["get", prefix, "--prefix", "--keys-only", "--limit=1", "--consistency=s", "-w", "json"]).ok()?;
    let v: serde_json::Value = serde_json::from_str(&out).ok()?;
    Some(v["count"].as_u64().unwrap_or(0))
}

/// The keys under `prefix` by a linearizable read (`--consistency=l`): the member must confirm with
/// a quorum that its data is current, so a member cut off from the others fails it rather than
/// answering from its own (stale) copy — unlike [`count`].
pub fn count_linearizable(init_pid: i64, ep: &Endpoint, prefix: &str) -> Result<u64, String> {
    let out = etcdctl(init_pid, ep, &["get", prefix, "--prefix", "--keys-only", "--limit=1", "--consistency=l", "-w", "json"]).map_err(|e| e.to_string())?;
    let v: serde_json::Value = serde_json::from_str(&out).map_err(|e| format!("etcdctl's answer: {e}"))?;
    Ok(v["count"].as_u64().unwrap_or(0))
}

/// Write `n` keys `<prefix><i>` = `v<i>` in transactions of 100 (one etcdctl per transaction).
pub fn write_keys(init_pid: i64, root: &Path, ep: &Endpoint, prefix: &str, n: u64) -> Result<(), String> {
    let mut i = 0;
    let mut batch = 0;
    while i < n {
        let mut txn = String::from("\n");
        let end = (i + 100).min(n);
        for k in i..end {
            txn.push_str(&format!("put {prefix}{k:04} v{k}\n"));
        }
        txn.push_str("\n\n");
        let rel = format!("var/tmp/keelson-local-txn-{batch}");
        std::fs::write(root.join(&rel), txn).map_err(|e| e.to_string())?;
        let mut cmdline = format!("ETCDCTL_API=3 etcdctl --endpoints={} --command-timeout=10s", ep.client_url);
        if let Some(c) = &ep.cacert {
            cmdline.push_str(&format!(" --cacert={c}"));
        }
        if let (Some(c), Some(k)) = (&ep.cert, &ep.key) {
            cmdline.push_str(&format!(" --cert={c} --key={k}"));
        }
        cmdline.push_str(&format!(" txn < /{rel}"));
        let out = machine::exec_in(init_pid, &["sh", "-c", &cmdline]).map_err(|e| e.to_string())?;
        if !out.contains("SUCCESS") {
            return Err(format!("txn {batch} did not succeed: {out}"));
        }
        let _ = std::fs::remove_file(root.join(&rel));
        i = end;
        batch += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn endpoint_from_manifest() {
        let d = tempfile::tempdir().unwrap();
        let m = d.path().join("etc/kubernetes/manifests");
        std::fs::create_dir_all(&m).unwrap();
        std::fs::write(m.join("etcd-main.manifest"), "apiVersion: v1\nkind: Pod\nmetadata: {name: etcd-main}\nspec:\n  containers:\n  - name: etcd\n    command: [/usr/local/bin/etcd]\n    args: [--name=etcd-a, --advertise-client-urls=https://etcd-a.internal.c:4001, --trusted-ca-file=/p/ca.crt, --cert-file=/p/s.crt, --key-file=/p/s.key]\n").unwrap();
        let e = super::endpoint(d.path(), "main").unwrap();
        assert_eq!(e.member, "etcd-a");
        assert_eq!(e.client_url, "https://etcd-a.internal.c:4001");
        assert_eq!(e.cacert.as_deref(), Some("/p/ca.crt"));
        assert!(super::endpoint(d.path(), "events").is_none());
    }
}
