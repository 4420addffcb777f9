//! The Terraform JSON document (`kubernetes.tf.json` plus `data/` files) every cloud's tasks render
//! into: resource and data blocks keyed by type and name (sorted output), outputs, data files, and
//! the structural check of a rendered tree. Knows no cloud.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use base::Tree;

/// The main file's name inside `--out`.
pub const MAIN_FILE: &str = "kubernetes.tf.json";

/// A Terraform resource name from a cloud name (`nodes.minimal.example.com` → `nodes-minimal-example-com`).
pub fn tf_name(name: &str) -> String {
    let mut s: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '-' }).collect();
    if !s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
        s.insert(0, '_');
    }
    s
}

/// Collects `resource`/`data` blocks keyed by type then name (sorted output).
#[derive(Default)]
pub struct Blocks {
    pub resource: BTreeMap<String, BTreeMap<String, Value>>,
    pub data: BTreeMap<String, BTreeMap<String, Value>>,
    pub output: BTreeMap<String, Value>,
    pub files: Tree,
    /// Data sources added with [`Blocks::data_once`]: `<type>/<key>` → reference.
    once: BTreeMap<String, String>,
}

impl Blocks {
    pub fn add(&mut self, ty: &str, name: &str, body: Value) -> String {
        let n = tf_name(name);
        self.resource.entry(ty.to_string()).or_default().insert(n.clone(), body);
        format!("{ty}.{n}")
    }
    /// A data source, added once per `key`: the first caller names it `<prefix>-<n>` (n counts the
    /// data sources of this type added this way) and gives its body; later callers get the same
    /// reference.
    pub fn data_once(&mut self, ty: &str, prefix: &str, key: &str, body: impl FnOnce() -> Value) -> String {
        let k = format!("{ty}/{key}");
        if let Some(r) = self.once.get(&k) {
            return r.clone();
        }
        let n = self.once.keys().filter(|x| x.starts_with(&format!("{ty}/"))).count();
        let reference = self.add_data(ty, &format!("{prefix}-{n}"), body());
        self.once.insert(k, reference.clone());
        reference
    }
    pub fn add_data(&mut self, ty: &str, name: &str, body: Value) -> String {
        let n = tf_name(name);
        self.data.entry(ty.to_string()).or_default().insert(n.clone(), body);
        format!("data.{ty}.{n}")
    }
    /// Write a data file and return the expression that reads it base64-encoded.
    pub fn data_file_base64(&mut self, file: &str, bytes: &[u8]) -> String {
        self.files.insert(format!("data/{file}"), bytes.to_vec());
        format!("${{filebase64(\"${{path.module}}/data/{file}\")}}")
    }
    pub fn data_file(&mut self, file: &str, bytes: &[u8]) -> String {
        self.files.insert(format!("data/{file}"), bytes.to_vec());
        format!("${{file(\"${{path.module}}/data/{file}\")}}")
    }
    pub fn finish(mut self, header: Value) -> Tree {
        let mut root = match header {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        let to_value =
            |m: BTreeMap<String, BTreeMap<String, Value>>| Value::Object(m.into_iter().map(|(k, v)| (k, Value::Object(v.into_iter().collect()))).collect());
        if !self.data.is_empty() {
            root.insert("data".into(), to_value(std::mem::take(&mut self.data)));
        }
        root.insert("resource".into(), to_value(std::mem::take(&mut self.resource)));
        if !self.output.is_empty() {
            root.insert("output".into(), Value::Object(std::mem::take(&mut self.output).into_iter().collect()));
        }
        // A Value cannot fail to serialise; `{:#}` is its pretty form.
        let mut text = format!("{:#}", Value::Object(root));
        text.push('\n');
        self.files.insert(MAIN_FILE, text);
        self.files
    }
}

/// `${<reference>.<attr>}`.
pub fn r(reference: &str, attr: &str) -> String {
    format!("${{{reference}.{attr}}}")
}

/// Tags as a JSON object.
pub fn tags_value(tags: &BTreeMap<String, String>) -> Value {
    Value::Object(tags.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect())
}

/// Every problem with a rendered Terraform tree: invalid JSON, references to resources, data
/// sources, locals or files that do not exist. Empty means the structure checks pass.
pub fn structural_problems(tree: &Tree) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(bytes) = tree.files.get(MAIN_FILE) else {
        return vec![format!("{MAIN_FILE}: missing")];
    };
    let root: Value = match serde_json::from_slice(bytes) {
        Ok(v) => v,
        Err(e) => return vec![format!("{MAIN_FILE}: invalid JSON: {e}")],
    };
    let mut defined: BTreeSet<String> = BTreeSet::new();
    for (section, prefix) in [("resource", ""), ("data", "data.")] {
        if let Some(types) = root.get(section).and_then(Value::as_object) {
            for (ty, items) in types {
                for name in items.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>()).unwrap_or_default() {
                    let valid = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                    if !valid {
                        problems.push(format!("{prefix}{ty}.{name}: not a valid Terraform name"));
                    }
                    defined.insert(format!("{prefix}{ty}.{name}"));
                }
            }
        }
    }
    let locals: BTreeSet<String> = root.get("locals").and_then(Value::as_object).map(|o| o.keys().cloned().collect()).unwrap_or_default();
    let mut strings = Vec::new();
    let mut stack = vec![&root];
    while let Some(v) = stack.pop() {
        match v {
            Value::String(s) => strings.push(s.clone()),
            Value::Array(a) => stack.extend(a.iter()),
            Value::Object(o) => stack.extend(o.values()),
            _ => {}
        }
    }
    for s in strings {
        let mut rest = s.as_str();
        while let Some(start) = rest.find("${") {
            let after = &rest[start + 2..];
            let Some(end) = matching_brace(after) else {
                problems.push(format!("unterminated interpolation in {s:?}"));
                break;
            };
            let expr = &after[..end];
            check_expression(expr, &defined, &locals, tree, &mut problems);
            rest = &after[end + 1..];
        }
    }
    problems.sort();
    problems.dedup();
    problems
}

fn matching_brace(s: &str) -> Option<usize> {
    let mut depth = 0i32;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => return Some(i),
            '}' => depth -= 1,
            _ => {}
        }
    }
    None
}

fn check_expression(expr: &str, defined: &BTreeSet<String>, locals: &BTreeSet<String>, tree: &Tree, problems: &mut Vec<String>) {
    // File functions: the file must exist in the rendered tree.
    for func in ["filebase64(\"", "file(\""] {
        if let Some(pos) = expr.find(func) {
            let arg = &expr[pos + func.len()..];
            let path = arg.split('"').next().unwrap_or_default().replace("${path.module}/", "");
            if !tree.files.contains_key(&path) {
                problems.push(format!("{expr}: file {path} not rendered"));
            }
            return;
        }
    }
    if expr.starts_with("path.") {
        return;
    }
    let parts: Vec<&str> = expr.split('.').collect();
    let key = match parts.as_slice() {
        ["local", name, ..] => {
            if !locals.contains(*name) {
                problems.push(format!("{expr}: no local {name}"));
            }
            return;
        }
        ["data", ty, name, _attr, ..] => format!("data.{ty}.{name}"),
        [ty, name, _attr, ..] => format!("{ty}.{name}"),
        _ => {
            problems.push(format!("{expr}: not a reference this checker understands"));
            return;
        }
    };
    if !defined.contains(&key) {
        problems.push(format!("{expr}: {key} is not defined"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_terraform_identifiers() {
        assert_eq!(tf_name("nodes.minimal.example.com"), "nodes-minimal-example-com");
        assert_eq!(tf_name("a.etcd-main.c"), "a-etcd-main-c");
        assert_eq!(tf_name("1.x"), "_1-x");
    }

    #[test]
    fn checker_finds_dangling_references_and_files() {
        let mut t = Tree::default();
        t.insert(MAIN_FILE, r#"{"resource":{"aws_vpc":{"v":{"x":"${aws_subnet.s.id}","y":"${filebase64(\"${path.module}/data/nope\")}"}}}}"#);
        let p = structural_problems(&t);
        assert_eq!(p.len(), 2, "{p:?}");
        t.insert(MAIN_FILE, r#"{"resource":{"aws_vpc":{"v":{"x":"${aws_vpc.v.id}"}}}}"#);
        assert!(structural_problems(&t).is_empty());
        t.insert(MAIN_FILE, "{");
        assert!(structural_problems(&t)[0].contains("invalid JSON"));
    }
}
