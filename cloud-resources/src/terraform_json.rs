//! The Terraform JSON document (`kubernetes.tf.json` plus `data/` files) every cloud's tasks render
//! into: resource and data blocks keyed by type and name (sorted output), outputs, data files, and
//! the structural check of a rendered tree. Knows no cloud.
//!
//! Terraform reads every string of a `.tf.json` file (object keys included) as a template: `${…}`
//! interpolates and `%{…}` is a directive. Text that comes from the spec — a tag, an IAM policy's
//! `${aws:username}`, an image name — must stay text, so the tasks build Terraform's own
//! expressions only with [`expr`] (directly or through [`r`], a link's `tf()`, the data-file
//! helpers), which marks them, and [`Blocks::finish`] escapes everything else (`$${`, `%%{`) before
//! it turns the marks into `${…}`. The marks are Unicode noncharacters (reserved for a program's
//! internal use); a spec string holding one is refused by the loader.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use base::Tree;

/// The main file's name inside `--out`.
pub const MAIN_FILE: &str = "kubernetes.tf.json";

/// Opens an expression built by [`expr`] (becomes `${`).
const EXPR_OPEN: char = '\u{FDD0}';
/// Closes an expression built by [`expr`] (becomes `}`).
const EXPR_CLOSE: char = '\u{FDD1}';

/// A Terraform expression (`aws_vpc.x.id`, `file("…")`) to interpolate into a string: the one way
/// the tasks write `${…}` (see the module's doc).
pub fn expr(inner: &str) -> String {
    format!("{EXPR_OPEN}{inner}{EXPR_CLOSE}")
}

/// A string as Terraform will read it: its text escaped (`${` → `$${`, `%{` → `%%{`), then the
/// expressions [`expr`] marked turned into interpolations.
pub fn terraform_string(s: &str) -> String {
    s.replace("${", "$${").replace("%{", "%%{").replace(EXPR_OPEN, "${").replace(EXPR_CLOSE, "}")
}

/// Whether a string holds one of the marks [`expr`] uses (text that could pose as an expression).
pub fn has_expression_mark(s: &str) -> bool {
    s.contains([EXPR_OPEN, EXPR_CLOSE])
}

fn to_terraform(v: Value) -> Value {
    match v {
        Value::String(s) => Value::String(terraform_string(&s)),
        Value::Array(a) => Value::Array(a.into_iter().map(to_terraform).collect()),
        Value::Object(o) => Value::Object(o.into_iter().map(|(k, v)| (terraform_string(&k), to_terraform(v))).collect()),
        other => other,
    }
}

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
        expr(&format!("filebase64(\"{}/data/{file}\")", expr("path.module")))
    }
    pub fn data_file(&mut self, file: &str, bytes: &[u8]) -> String {
        self.files.insert(format!("data/{file}"), bytes.to_vec());
        expr(&format!("file(\"{}/data/{file}\")", expr("path.module")))
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
        let mut text = format!("{:#}", to_terraform(Value::Object(root)));
        text.push('\n');
        self.files.insert(MAIN_FILE, text);
        self.files
    }
}

/// `${<reference>.<attr>}` (an [`expr`]).
pub fn r(reference: &str, attr: &str) -> String {
    expr(&format!("{reference}.{attr}"))
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
            Value::Object(o) => {
                // Terraform reads an object's keys as templates too.
                strings.extend(o.keys().cloned());
                stack.extend(o.values());
            }
            _ => {}
        }
    }
    for s in strings {
        if has_expression_mark(&s) {
            problems.push(format!("an expression mark left in {s:?}"));
        }
        let mut rest = s.as_str();
        // Terraform's template lexer: `$${` and `%%{` are text; `${` interpolates, `%{` is a directive.
        while let Some(i) = rest.find(['$', '%']) {
            let tail = &rest[i..];
            let sigil = &tail[..1];
            if tail[1..].starts_with(sigil) && tail[2..].starts_with('{') {
                rest = &tail[3..];
                continue;
            }
            if !tail[1..].starts_with('{') {
                rest = &tail[1..];
                continue;
            }
            if sigil == "%" {
                problems.push(format!("a template directive in {s:?} (text left unescaped)"));
                rest = &tail[2..];
                continue;
            }
            let after = &tail[2..];
            let Some(end) = matching_brace(after) else {
                problems.push(format!("unterminated interpolation in {s:?}"));
                break;
            };
            check_expression(&after[..end], &defined, &locals, tree, &mut problems);
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

    /// Text from the spec stays text whatever it holds (an IAM policy variable, a would-be function
    /// call, an escape, a directive), and the expressions the tasks built still interpolate.
    #[test]
    fn spec_text_is_escaped_and_expressions_are_not() {
        let mut b = Blocks::default();
        let vpc = b.add("aws_vpc", "v", serde_json::json!({"cidr_block": "10.0.0.0/16"}));
        let tags = BTreeMap::from([
            ("team${x}".to_string(), "${file(\"/etc/passwd\")}".to_string()),
            ("policy".to_string(), "arn:aws:s3:::b/${aws:username}/*".to_string()),
            ("escaped".to_string(), "$${a} %{ if b }%%{c}".to_string()),
        ]);
        let data = b.data_file("d", b"x");
        b.add(
            "aws_subnet",
            "s",
            serde_json::json!({"vpc_id": r(&vpc, "id"), "tags": tags_value(&tags), "user_data": data, "mixed": format!("x-{}-${{y}}", r(&vpc, "arn"))}),
        );
        let tree = b.finish(serde_json::json!({}));
        let root: Value = serde_json::from_slice(&tree.files[MAIN_FILE]).expect("json");
        let s = &root["resource"]["aws_subnet"]["s"];
        assert_eq!(s["vpc_id"], "${aws_vpc.v.id}");
        assert_eq!(s["user_data"], "${file(\"${path.module}/data/d\")}");
        assert_eq!(s["mixed"], "x-${aws_vpc.v.arn}-$${y}");
        assert_eq!(s["tags"]["team$${x}"], "$${file(\"/etc/passwd\")}");
        assert_eq!(s["tags"]["policy"], "arn:aws:s3:::b/$${aws:username}/*");
        assert_eq!(s["tags"]["escaped"], "$$${a} %%{ if b }%%%{c}");
        assert_eq!(structural_problems(&tree), Vec::<String>::new());
    }

    /// The checker lexes as Terraform does: escapes are text, a directive or an unterminated
    /// interpolation (in a value or a key) is a problem.
    #[test]
    fn checker_reads_escapes_as_text() {
        let mut t = Tree::default();
        t.insert(MAIN_FILE, r#"{"resource":{"aws_vpc":{"v":{"x":"$${aws:username} $$$${x} %%{y}","$${k}":"a"}}}}"#);
        assert_eq!(structural_problems(&t), Vec::<String>::new());
        for bad in [r#""x":"%{ if a }""#, r#""x":"${aws"#, r#""${x":"a""#, r#""x":"$${a} ${nope.x.y}""#] {
            t.insert(MAIN_FILE, format!(r#"{{"resource":{{"aws_vpc":{{"v":{{{bad}}}}}}}}}"#));
            assert_eq!(structural_problems(&t).len(), 1, "{bad}: {:?}", structural_problems(&t));
        }
    }
}
