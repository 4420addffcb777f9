//! The hosts-file DNS provider: a guarded block in `/etc/hosts`, rewritten *in place* under a lock
//! and verified by re-reading. In place matters: the file is bind-mounted into host-network pods and
//! network namespaces, which keep seeing the old inode if the file were replaced by a rename.

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
    }
}
