//! The hosts-file DNS provider: a guarded block in `/etc/hosts`, rewritten *in place* under a lock
//! and verified by re-reading. In place matters: the file is bind-mounted into network namespaces,
//! which keep seeing the old inode if the file were replaced by a rename.
//!
//! The kubelet gives every host-network pod (etcd, the API server, kube-proxy) its own *copy* of
//! `/etc/hosts`, taken when the pod starts and bind-mounted over the container's: a name kept here
//! would stay frozen in those copies, so [`update_pod_copies`] keeps the same block in them.
//!
//! Those copies are writable by the pods they are mounted in, so nothing here trusts them: the
//! lock is only ever *tried* (a pod holding its own lock makes that one copy wait for the next
//! pass, never the caller), a file over [`MAX_HOSTS_BYTES`] is refused unread, a copy is taken for
//! a host-network pod's only if no process in another network namespace has it as `/etc/hosts`
//! (the kernel's answer, not the file's header), and a pass over the copies ends after
//! [`POD_COPIES_PASS`].

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

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
    #[error("{path}: locked by another process for {waited_ms} ms; left for the next pass")]
    Locked { path: String, waited_ms: u64 },
    #[error("{path}: {size} bytes, over the {max} a hosts file may have; not read")]
    TooLarge { path: String, size: u64, max: u64 },
    #[error("{pods_dir}: the pass over the pods' hosts files reached its bound of {bound_ms} ms; {left} copies left for the next pass")]
    PassBound { pods_dir: String, bound_ms: u64, left: usize },
}

/// The largest hosts file read: a node's is a few KiB; a pod may grow its own copy without end.
pub const MAX_HOSTS_BYTES: u64 = 1 << 20;

/// How long [`update`] tries for the lock on the node's own hosts file (its other writers, protokube
/// and nodeup, hold it for one write).
pub const LOCK_WAIT: Duration = Duration::from_secs(5);

/// How long [`update_pod_copies`] tries for the lock on one pod's copy (the pod itself may hold it).
pub const POD_COPY_LOCK_WAIT: Duration = Duration::from_millis(200);

/// The bound of one pass of [`update_pod_copies`] over every pod's copy.
pub const POD_COPIES_PASS: Duration = Duration::from_secs(10);

/// name → sorted addresses.
pub type Entries = BTreeMap<String, Vec<String>>;

/// The entries of the managed block of a hosts file's `text` (`path` names it in errors): empty
/// when there is no block, an error when the block has no end marker.
pub fn parse(text: &str, path: &Path) -> Result<Entries, HostsError> {
    Ok(split(text, path)?.1)
}

/// The text `update` writes: `text` with its managed block made to hold exactly `entries` (added
/// at the end when there is none), and the names whose addresses changed; `None` when the block
/// already holds them.
pub fn rewrite(text: &str, entries: &Entries, path: &Path) -> Result<Option<(String, Vec<String>)>, HostsError> {
    let (before, old, after) = split(text, path)?;
    let mut changed: Vec<String> = entries
        .iter()
        .filter(|(n, ips)| old.get(*n) != Some(*ips))
        .map(|(n, _)| n.clone())
        .chain(old.keys().filter(|n| !entries.contains_key(*n)).cloned())
        .collect();
    changed.sort();
    changed.dedup();
    if changed.is_empty() && text.contains(BEGIN) {
        return Ok(None);
    }
    let mut new = before;
    if !new.is_empty() && !new.ends_with('\n') {
        new.push('\n');
    }
    new.push_str(&render_block(entries));
    new.push_str(&after);
    Ok(Some((new, changed)))
}

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
/// Tries the lock for [`LOCK_WAIT`] at most.
pub fn update(path: &Path, entries: &Entries) -> Result<Vec<String>, HostsError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| HostsError::Io { path: path.display().to_string(), source })?;
    }
    update_with(path, entries, LOCK_WAIT, true)
}

/// Try the exclusive lock on `f` until `wait` has passed.
fn try_lock_for(f: &File, path: &Path, wait: Duration) -> Result<(), HostsError> {
    let start = Instant::now();
    loop {
        match f.try_lock() {
            Ok(()) => return Ok(()),
            Err(TryLockError::Error(source)) => return Err(HostsError::Io { path: path.display().to_string(), source }),
            Err(TryLockError::WouldBlock) if start.elapsed() >= wait => {
                return Err(HostsError::Locked { path: path.display().to_string(), waited_ms: start.elapsed().as_millis() as u64 })
            }
            Err(TryLockError::WouldBlock) => std::thread::sleep(Duration::from_millis(20).min(wait)),
        }
    }
}

/// Read all of `f` unless it is over [`MAX_HOSTS_BYTES`] (checked before and while reading).
fn read_capped(f: &mut File, path: &Path) -> Result<String, HostsError> {
    let err = |source| HostsError::Io { path: path.display().to_string(), source };
    let too_large = |size| HostsError::TooLarge { path: path.display().to_string(), size, max: MAX_HOSTS_BYTES };
    let size = f.metadata().map_err(err)?.len();
    if size > MAX_HOSTS_BYTES {
        return Err(too_large(size));
    }
    let mut text = String::new();
    Read::take(&mut *f, MAX_HOSTS_BYTES + 1).read_to_string(&mut text).map_err(err)?;
    if text.len() as u64 > MAX_HOSTS_BYTES {
        return Err(too_large(text.len() as u64));
    }
    Ok(text)
}

fn update_with(path: &Path, entries: &Entries, lock_wait: Duration, create: bool) -> Result<Vec<String>, HostsError> {
    let err = |source| HostsError::Io { path: path.display().to_string(), source };
    let mut f = OpenOptions::new().read(true).write(true).create(create).truncate(false).open(path).map_err(err)?;
    try_lock_for(&f, path, lock_wait)?;
    let text = read_capped(&mut f, path)?;
    let Some((new, changed)) = rewrite(&text, entries, path)? else {
        return Ok(Vec::new());
    };
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
    match File::open(path) {
        Ok(mut f) => parse(&read_capped(&mut f, path)?, path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Entries::new()),
        Err(source) => Err(HostsError::Io { path: path.display().to_string(), source }),
    }
}

/// The first line of the hosts file the kubelet writes for a host-network pod
/// (`pkg/kubelet/kubelet_pods.go`, `managedHostsHeaderWithHostNetwork`): a copy of the node's.
pub const KUBELET_HOST_NETWORK_HEADER: &str = "# Kubernetes-managed hosts file (host network).";

/// Where the kubelet keeps a pod's hosts file: `<pods dir>/<pod uid>/etc-hosts`.
pub const KUBELET_POD_HOSTS_FILE: &str = "etc-hosts";

/// Where the kernel shows processes: `/proc`.
pub const PROC: &str = "/proc";

/// The hosts files (device, inode) that processes in a network namespace other than the caller's
/// have as `/etc/hosts`, read from `proc` (`/proc`; injectable for tests): the kubelet's copies
/// mounted in pods with their own network, whatever their first line says. Processes that vanish
/// or cannot be read while the walk runs are passed over.
pub fn foreign_network_hosts_files(proc: &Path) -> BTreeSet<(u64, u64)> {
    let mut out = BTreeSet::new();
    let Ok(own) = std::fs::read_link(proc.join("self/ns/net")) else { return out };
    let Ok(dir) = std::fs::read_dir(proc) else { return out };
    for e in dir.flatten() {
        let name = e.file_name();
        if !name.to_str().is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) {
            continue;
        }
        let pid = e.path();
        match std::fs::read_link(pid.join("ns/net")) {
            Ok(net) if net != own => {}
            _ => continue,
        }
        if let Ok(m) = std::fs::metadata(pid.join("root/etc/hosts")) {
            out.insert((m.dev(), m.ino()));
        }
    }
    out
}

/// Make the managed block of every host-network pod's copy of the hosts file under `pods_dir`
/// (the kubelet's `/var/lib/kubelet/pods`) hold exactly `entries`, as a resolver would answer the
/// pod with live records. A copy is a host-network pod's when the kubelet wrote it so (its
/// header) and no process in another network namespace has it as `/etc/hosts` (the kernel's view,
/// from `proc`: a pod with its own network that rewrote its header is not trusted). Other pods'
/// hosts files are left alone. Returns the copies changed and the errors: a copy that cannot be
/// written, is locked (tried for [`POD_COPY_LOCK_WAIT`]) or too large does not stop the others,
/// and the whole pass ends after [`POD_COPIES_PASS`].
pub fn update_pod_copies(pods_dir: &Path, entries: &Entries) -> (Vec<PathBuf>, Vec<HostsError>) {
    update_pod_copies_with(pods_dir, entries, Path::new(PROC), POD_COPIES_PASS)
}

/// [`update_pod_copies`] with the process directory and the pass's bound given.
pub fn update_pod_copies_with(pods_dir: &Path, entries: &Entries, proc: &Path, bound: Duration) -> (Vec<PathBuf>, Vec<HostsError>) {
    let (mut changed, mut errors) = (Vec::new(), Vec::new());
    let start = Instant::now();
    let Ok(dir) = std::fs::read_dir(pods_dir) else { return (changed, errors) };
    let mut copies: Vec<PathBuf> = dir.flatten().map(|e| e.path().join(KUBELET_POD_HOSTS_FILE)).collect();
    copies.sort();
    let foreign = foreign_network_hosts_files(proc);
    for (i, copy) in copies.iter().enumerate() {
        if start.elapsed() >= bound {
            errors.push(HostsError::PassBound { pods_dir: pods_dir.display().to_string(), bound_ms: bound.as_millis() as u64, left: copies.len() - i });
            break;
        }
        let Ok(mut f) = File::open(copy) else { continue };
        let Ok(meta) = f.metadata() else { continue };
        if !meta.is_file() || foreign.contains(&(meta.dev(), meta.ino())) {
            continue;
        }
        let mut head = vec![0u8; KUBELET_HOST_NETWORK_HEADER.len()];
        if f.read_exact(&mut head).is_err() || head != KUBELET_HOST_NETWORK_HEADER.as_bytes() {
            continue;
        }
        match update_with(copy, entries, POD_COPY_LOCK_WAIT, false) {
            Ok(names) if names.is_empty() => {}
            Ok(_) => changed.push(copy.clone()),
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

    fn host_network_copy(dir: &Path, uid: &str, body: &str) -> PathBuf {
        let d = dir.join(uid);
        std::fs::create_dir_all(&d).expect("mkdir");
        let copy = d.join(KUBELET_POD_HOSTS_FILE);
        std::fs::write(&copy, format!("{KUBELET_HOST_NETWORK_HEADER}\n127.0.0.1 localhost\n{body}")).expect("write");
        copy
    }

    fn one_entry() -> Entries {
        let mut e = Entries::new();
        e.insert("api.internal.c".into(), vec!["10.0.0.2".into()]);
        e
    }

    /// Runs `f` on a thread and waits for it a bounded time: a call that blocks fails the test
    /// instead of hanging it.
    fn returns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(f()));
        rx.recv_timeout(Duration::from_secs(60)).expect("the call blocked: a lock held by a pod must not stop the pass")
    }

    #[test]
    fn a_pod_holding_its_copys_lock_holds_up_only_its_copy() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pods = dir.path().join("pods");
        let held = host_network_copy(&pods, "uid-1", "");
        let free = host_network_copy(&pods, "uid-2", "");
        // The pod's own lock: flock(2) on its open file, as `flock /etc/hosts sleep inf` in the pod.
        let pods_lock = File::open(&held).expect("open");
        pods_lock.lock().expect("the pod's lock");
        let (changed, errors) = returns({
            let pods = pods.clone();
            move || update_pod_copies(&pods, &one_entry())
        });
        assert_eq!(changed, vec![free.clone()], "the other pod's copy is kept current");
        assert!(matches!(errors.as_slice(), [HostsError::Locked { path, .. }] if path == &held.display().to_string()), "{errors:?}");
        assert!(!std::fs::read_to_string(&held).expect("read").contains("10.0.0.2"));
        // The node's own file waits LOCK_WAIT at most, then says so.
        let node = dir.path().join("hosts");
        std::fs::write(&node, "127.0.0.1 localhost\n").expect("write");
        let node_lock = File::open(&node).expect("open");
        node_lock.lock().expect("lock");
        let r = returns(move || update(&node, &one_entry()));
        assert!(matches!(r, Err(HostsError::Locked { .. })), "{r:?}");
        drop(pods_lock);
        assert_eq!(update_pod_copies(&pods, &one_entry()).0, vec![held], "released: the next pass writes it");
    }

    #[test]
    fn an_oversized_copy_is_refused_unread() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pods = dir.path().join("pods");
        let big = host_network_copy(&pods, "uid-1", &"#".repeat(MAX_HOSTS_BYTES as usize + 1));
        let before = std::fs::metadata(&big).expect("meta").len();
        let (changed, errors) = update_pod_copies(&pods, &one_entry());
        assert!(changed.is_empty());
        assert!(matches!(errors.as_slice(), [HostsError::TooLarge { size, .. }] if *size == before), "{errors:?}");
        assert_eq!(std::fs::metadata(&big).expect("meta").len(), before, "left as it was");
        assert!(matches!(read(&big), Err(HostsError::TooLarge { .. })));
    }

    /// A `/proc` of two processes: one in the caller's network namespace with `host_net` as its
    /// `/etc/hosts`, one in a pod's own namespace with `own_net`.
    fn fake_proc(root: &Path, host_net: &Path, own_net: &Path) -> PathBuf {
        let proc = root.join("proc");
        for (pid, net, hosts) in [("self", "net:[4026531840]", None), ("41", "net:[4026531840]", Some(host_net)), ("42", "net:[4026532999]", Some(own_net))] {
            std::fs::create_dir_all(proc.join(pid).join("ns")).expect("mkdir");
            std::os::unix::fs::symlink(net, proc.join(pid).join("ns/net")).expect("symlink");
            if let Some(h) = hosts {
                std::fs::create_dir_all(proc.join(pid).join("root/etc")).expect("mkdir");
                std::fs::hard_link(h, proc.join(pid).join("root/etc/hosts")).expect("link");
            }
        }
        proc
    }

    #[test]
    fn a_pod_with_its_own_network_is_not_taken_for_host_network_by_its_header() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pods = dir.path().join("pods");
        let host_net = host_network_copy(&pods, "uid-1", "");
        // A pod with its own network namespace that rewrote its hosts file's first line.
        let spoofed = host_network_copy(&pods, "uid-2", "");
        let proc = fake_proc(dir.path(), &host_net, &spoofed);
        let foreign = foreign_network_hosts_files(&proc);
        let id = |p: &Path| std::fs::metadata(p).map(|m| (m.dev(), m.ino())).expect("meta");
        assert_eq!(foreign, BTreeSet::from([id(&spoofed)]));
        let (changed, errors) = update_pod_copies_with(&pods, &one_entry(), &proc, POD_COPIES_PASS);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(changed, vec![host_net]);
        assert!(!std::fs::read_to_string(&spoofed).expect("read").contains(BEGIN), "a pod's own file is not the node's");
    }

    #[test]
    fn a_pass_over_the_copies_is_bounded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pods = dir.path().join("pods");
        let copies: Vec<PathBuf> = (0..3).map(|i| host_network_copy(&pods, &format!("uid-{i}"), "")).collect();
        let (changed, errors) = update_pod_copies_with(&pods, &one_entry(), Path::new(PROC), Duration::ZERO);
        assert!(changed.is_empty());
        assert!(matches!(errors.as_slice(), [HostsError::PassBound { left: 3, .. }]), "{errors:?}");
        assert_eq!(update_pod_copies_with(&pods, &one_entry(), Path::new(PROC), POD_COPIES_PASS).0, copies);
    }
}
