//! Golden files, compared one way everywhere: a directory of expected files against the files a test
//! rendered (same set of paths, same bytes). With `KEELSON_BLESS` set, the directory is replaced by
//! what was rendered instead (review the diff before committing it).

use std::collections::BTreeMap;
use std::path::Path;

/// The one variable that re-blesses every golden file of the workspace.
pub const BLESS_VAR: &str = "KEELSON_BLESS";

/// Whether this run re-blesses golden files.
pub fn blessing() -> bool {
    std::env::var_os(BLESS_VAR).is_some()
}

/// Every file under `dir`, relative path (`/`-separated) → bytes. Panics naming the path it cannot read.
pub fn read_tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("read {}: {e}", d.display())) {
            let p = e.unwrap_or_else(|e| panic!("read {}: {e}", d.display())).path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap_or_else(|_| panic!("{} outside {}", p.display(), dir.display()));
                let rel = rel.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/");
                out.insert(rel, std::fs::read(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display())));
            }
        }
    }
    out
}

/// What differs between `expected` and `actual`, one line per file (empty: the same).
pub fn differences(expected: &BTreeMap<String, Vec<u8>>, actual: &BTreeMap<String, Vec<u8>>) -> Vec<String> {
    let mut out = Vec::new();
    for rel in expected.keys().filter(|k| !actual.contains_key(*k)) {
        out.push(format!("{rel}: golden file exists but was not rendered"));
    }
    for (rel, got) in actual {
        let Some(want) = expected.get(rel) else {
            out.push(format!("{rel}: rendered but has no golden file"));
            continue;
        };
        if got != want {
            let (g, e) = (String::from_utf8_lossy(got), String::from_utf8_lossy(want));
            let line = g.lines().zip(e.lines()).position(|(a, b)| a != b).unwrap_or_else(|| g.lines().count().min(e.lines().count()));
            out.push(format!("{rel}: differs at line {}:\n  got:      {:?}\n  expected: {:?}", line + 1, g.lines().nth(line), e.lines().nth(line)));
        }
    }
    out
}

/// Compare `actual` with the golden directory `dir`, or replace `dir` with it when blessing.
/// Panics, naming `label` and every difference, when they differ.
pub fn check_tree(label: &str, dir: &Path, actual: &BTreeMap<String, Vec<u8>>) {
    if blessing() {
        let _ = std::fs::remove_dir_all(dir);
        for (rel, bytes) in actual {
            let p = dir.join(rel);
            std::fs::create_dir_all(p.parent().unwrap_or(dir)).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
            std::fs::write(&p, bytes).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
        }
        return;
    }
    assert!(dir.is_dir(), "{label}: no golden files at {} (run with {BLESS_VAR}=1 to create them)", dir.display());
    let problems = differences(&read_tree(dir), actual);
    assert!(
        problems.is_empty(),
        "{label}: output differs from the golden files in {}:\n{}\n(re-bless with {BLESS_VAR}=1 if the change is intended)",
        dir.display(),
        problems.join("\n")
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(items: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
        items.iter().map(|(k, v)| (k.to_string(), v.as_bytes().to_vec())).collect()
    }

    #[test]
    fn every_kind_of_difference_is_named() {
        let expected = tree(&[("a", "1\n2\n"), ("b", "x"), ("gone", "")]);
        let actual = tree(&[("a", "1\n3\n"), ("b", "x"), ("new", "")]);
        let d = differences(&expected, &actual);
        assert_eq!(d.len(), 3, "{d:?}");
        assert!(d[0].starts_with("gone: golden file exists"), "{d:?}");
        assert!(d[1].starts_with("a: differs at line 2"), "{d:?}");
        assert!(d[2].starts_with("new: rendered but has no golden file"), "{d:?}");
        assert!(differences(&expected, &expected).is_empty());
    }

    #[test]
    fn a_tree_is_read_with_slash_separated_relative_paths() {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::create_dir_all(dir.path().join("x/y")).expect("mkdir");
        std::fs::write(dir.path().join("x/y/z"), "z").expect("write");
        assert_eq!(read_tree(dir.path()), tree(&[("x/y/z", "z")]));
    }
}
