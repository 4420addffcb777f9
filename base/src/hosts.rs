//! The hosts-file DNS provider: a guarded block in `/etc/hosts`, rewritten *in place* under a lock
//! and verified by re-reading. In place matters: the file is bind-mounted into network namespaces,
//! which keep seeing the old inode if the file were replaced by a rename.
//!
//! The kubelet gives every host-network pod (etcd, the API server, kube-proxy) its own *copy* of
//! `/etc/hosts`, taken when the pod starts and bind-mounted over the container's: a name kept here
//! would stay frozen in those copies, so [`update_pod_copies`] keeps the same block in them.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

pub const BEGIN: &str = "# Begin host entries managed by keelson protokube - do not edit";
pub const END: &str = "# End host entries managed by keelson protokube";

#[derive(Debug, thiserror::Error)]
pub enum HostsError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}: content read back after writing differs from what was written")]
    Verify { path: String },
    #[error("{path}: unterminated managed block (begin marker without end marker)")]
    Unterminated { path: String },
}

/// name → sorted addresses.
pub type Entries = BTreeMap<String, Vec<String>>;

fn split(text: &str, path: &Path) -> Result<(String, Entries, String), HostsError> {
    let Some(b) = text.find(BEGIN) else {
        return Ok((text.to_string(), Entries::new(), String::new()));
    };
    let rest = &text[b..];
    let Some(e) = rest.find(END) else {
        return Err(HostsError::Unterminated { path: path.display().to_string() });
    };
    let block = &rest[BEGIN.len()..e];
    let mut entries = Entries::new();
    for line in block.lines() {
        let mut it = line.split_whitespace();
        if let Some(ip) = it.next() {
            for name in it {
                entries.entry(name.to_string()).or_default().push(ip.to_string());
            }
        }
    }
    for v in entries.values_mut() {
        v.sort();
    }
    let after = rest[e + END.len()..].strip_prefix('\n').unwrap_or(&rest[e + END.len()..]);
    Ok((text[..b].to_string(), entries, after.to_string()))
}

fn render_block(entries: &Entries) -> String {
    // Group names by address, one line per address, addresses and names sorted.
    let mut by_ip: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (name, ips) in entries {
        for ip in ips {
            by_ip.entry(ip).or_default().push(name);
        }
    }
    let mut s = format!("{BEGIN}\n");
    for (ip, names) in by_ip {
        s.push_str(&format!("{ip}\t{}\n", names.join(" ")));
    }
    s.push_str(END);
    s.push('\n');
    s
}

/// Make the managed block hold exactly `entries`. Returns the names whose addresses changed.
pub fn update(path: &Path, entries: &Entries) -> Result<Vec<String>, HostsError> {
    let err = |source| HostsError::Io { path: path.display().to_string(), source };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    let mut f = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).map_err(err)?;
    f.lock().map_err(err)?;
    let mut text = String::new();
    f.read_to_string(&mut text).map_err(err)?;
    let (before, old, after) = split(&text, path)?;
    let mut changed: Vec<String> = entries
        .iter()
        .filter(|(n, ips)| old.get(*n) != Some(*ips))
        .map(|(n, _)| n.clone())
        .chain(old.keys().filter(|n| !entries.contains_key(*n)).cloned())
        .collect();
    changed.sort();
    changed.dedup();
    if changed.is_empty() && text.contains(BEGIN) {
        return Ok(changed);
    }
    let mut new = before;
    if !new.is_empty() && !new.ends_with('\n') {
        new.push('\n');
    }
    new.push_str(&render_block(entries));
    new.push_str(&after);
    f.seek(SeekFrom::Start(0)).map_err(err)?;
    f.write_all(new.as_bytes()).map_err(err)?;
    f.set_len(new.len() as u64).map_err(err)?;
    f.sync_all().map_err(err)?;
    let mut back = String::new();
    f.seek(SeekFrom::Start(0)).map_err(err)?;
    f.read_to_string(&mut back).map_err(err)?;
    if back != new {
        return Err(HostsError::Verify { path: path.display().to_string() });
    }
    Ok(changed)
}

/// The entries of the managed block of `path` (empty when the file or the block is missing).
pub fn read(path: &Path) -> Result<Entries, HostsError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(split(&text, path)?.1),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Entries::new()),
        Err(source) => Err(HostsError::Io { path: path.display().to_string(), source }),
    }
}

/// The first line of the hosts file the kubelet writes for a host-network pod
/// (`pkg/kubelet/kubelet_pods.go`, `managedHostsHeaderWithHostNetwork`): a copy of the node's.
pub const KUBELET_HOST_NETWORK_HEADER: &str = "# Kubernetes-managed hosts file (host network).";

/// Where the kubelet keeps a pod's hosts file: `<pods dir>/<pod uid>/etc-hosts`.
pub const KUBELET_POD_HOSTS_FILE: &str = "etc-hosts";

/// Make the managed block of every host-network pod's copy of the hosts file under `pods_dir`
/// (the kubelet's `/var/lib/kubelet/pods`) hold exactly `entries`, as a resolver would answer the
/// pod with live records. Other pods' hosts files (their own address, not the node's file) are
/// left alone. Returns the copies changed; one copy that cannot be written does not stop the others.
pub fn update_pod_copies(pods_dir: &Path, entries: &Entries) -> (Vec<std::path::PathBuf>, Vec<HostsError>) {
    let (mut changed, mut errors) = (Vec::new(), Vec::new());
    let Ok(dir) = std::fs::read_dir(pods_dir) else { return (changed, errors) };
    let mut copies: Vec<std::path::PathBuf> = dir.flatten().map(|e| e.path().join(KUBELET_POD_HOSTS_FILE)).collect();
    copies.sort();
    for copy in copies {
        let Ok(text) = std::fs::read_to_string(&copy) else { continue };
        if !text.starts_with(KUBELET_HOST_NETWORK_HEADER) {
            continue;
        }
        match update(&copy, entries) {
            Ok(names) if names.is_empty() => {}
            Ok(_) => changed.push(copy),
            Err(e) => errors.push(e),
        }
    }
    (changed, errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_is_rewritten_in_place_and_other_lines_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("hosts");
        std::fs::write(&p, "127.0.0.1 localhost\n::1 localhost\n").expect("write");
        let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&p).expect("meta"));
        let mut e = Entries::new();
        e.insert("etcd-a.internal.x.k8s.local".into(), vec!["10.0.0.1".into()]);
        e.insert("api.internal.x.k8s.local".into(), vec!["10.0.0.1".into(), "10.0.0.2".into()]);
        assert_eq!(update(&p, &e).expect("update").len(), 2);
        assert!(update(&p, &e).expect("update").is_empty(), "second pass changes nothing");
        let text = std::fs::read_to_string(&p).expect("read");
        assert!(text.starts_with("127.0.0.1 localhost\n::1 localhost\n"));
        assert!(text.contains("10.0.0.1\tapi.internal.x.k8s.local etcd-a.internal.x.k8s.local\n"));
        assert!(text.contains("10.0.0.2\tapi.internal.x.k8s.local\n"));
        e.insert("etcd-a.internal.x.k8s.local".into(), vec!["10.0.0.9".into()]);
        assert_eq!(update(&p, &e).expect("update"), vec!["etcd-a.internal.x.k8s.local".to_string()]);
        assert_eq!(std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&p).expect("meta")), ino, "same inode");
        let text = std::fs::read_to_string(&p).expect("read");
        assert_eq!(text.matches(BEGIN).count(), 1);
        assert!(!text.contains("10.0.0.1\tapi.internal.x.k8s.local etcd-a"));
        assert_eq!(read(&p).expect("read"), e);
        assert!(read(&dir.path().join("missing")).expect("missing file").is_empty());
    }

    #[test]
    fn host_network_pod_copies_follow_and_other_pods_are_left_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pods = dir.path().join("pods");
        let host_net = pods.join("uid-1");
        let own = pods.join("uid-2");
        std::fs::create_dir_all(&host_net).expect("mkdir");
        std::fs::create_dir_all(&own).expect("mkdir");
        std::fs::create_dir_all(pods.join("uid-3")).expect("mkdir (a pod without a hosts file)");
        let copy = host_net.join(KUBELET_POD_HOSTS_FILE);
        std::fs::write(&copy, format!("{KUBELET_HOST_NETWORK_HEADER}\n127.0.0.1 localhost\n{BEGIN}\n10.0.0.1\tapi.internal.c\n{END}\n")).expect("write");
        let pod_own = "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n100.96.1.5\tweb-0\n";
        std::fs::write(own.join(KUBELET_POD_HOSTS_FILE), pod_own).expect("write");
        let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&copy).expect("meta"));
        let mut e = Entries::new();
        e.insert("api.internal.c".into(), vec!["10.0.0.2".into()]);
        let (changed, errors) = update_pod_copies(&pods, &e);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(changed, vec![copy.clone()]);
        let text = std::fs::read_to_string(&copy).expect("read");
        assert!(text.starts_with(KUBELET_HOST_NETWORK_HEADER) && text.contains("10.0.0.2\tapi.internal.c\n") && !text.contains("10.0.0.1"), "{text}");
        assert_eq!(std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&copy).expect("meta")), ino, "same inode: the container's bind mount sees it");
        assert_eq!(std::fs::read_to_string(own.join(KUBELET_POD_HOSTS_FILE)).expect("read"), pod_own, "a pod's own hosts file is not the node's");
        assert!(update_pod_copies(&pods, &e).0.is_empty(), "converged");
        assert!(update_pod_copies(&dir.path().join("none"), &e).0.is_empty(), "no pods directory: nothing to do");
    }
}
