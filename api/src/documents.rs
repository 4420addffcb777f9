//! The top-level documents of a spec file (`Cluster`, `InstanceGroup`) and parsing of a
//! multi-document YAML text into them, with errors that carry document, field path and line:column.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::generated::{ClusterSpec, InstanceGroupSpec};

/// The only API group/version Keelson reads and writes.
pub const API_VERSION: &str = "kops.k8s.io/v1alpha2";
/// Nesting deeper than this is refused before any typed parsing (no stack overflow on hostile input).
pub const MAX_DEPTH: usize = 64;

/// Kubernetes object metadata (the parts a kOps spec uses).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ObjectMeta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_timestamp: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
}

/// `kind: Cluster`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Cluster {
    pub api_version: String,
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ClusterSpec,
}

/// `kind: InstanceGroup`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct InstanceGroup {
    pub api_version: String,
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: InstanceGroupSpec,
}

impl Cluster {
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or("")
    }
}

impl InstanceGroup {
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or("")
    }
    pub fn role(&self) -> Option<Role> {
        self.spec.role.as_deref().and_then(Role::parse)
    }
}

/// Instance group roles (`ControlPlane` is the newer spelling of `Master`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    ControlPlane,
    Node,
    ApiServer,
    Bastion,
}

impl Role {
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "Master" | "ControlPlane" => Some(Role::ControlPlane),
            "Node" => Some(Role::Node),
            "APIServer" => Some(Role::ApiServer),
            "Bastion" => Some(Role::Bastion),
            _ => None,
        }
    }
    /// The lower-case name kOps uses in state-store paths (`igconfig/control-plane/…`).
    pub fn state_dir(&self) -> &'static str {
        match self {
            Role::ControlPlane => "control-plane",
            Role::Node => "node",
            Role::ApiServer => "apiserver",
            Role::Bastion => "bastion",
        }
    }
    /// The name nodeup and BootConfig use.
    pub fn boot_name(&self) -> &'static str {
        match self {
            Role::ControlPlane => "ControlPlane",
            Role::Node => "Node",
            Role::ApiServer => "APIServer",
            Role::Bastion => "Bastion",
        }
    }
}

/// An instance group role kOps does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown instance group role {value:?}: expected one of ControlPlane, Node, APIServer, Bastion (or kOps' legacy Master)")]
pub struct UnknownRole {
    pub value: String,
}

impl std::str::FromStr for Role {
    type Err = UnknownRole;
    fn from_str(s: &str) -> Result<Role, UnknownRole> {
        Role::parse(s).ok_or_else(|| UnknownRole { value: s.to_string() })
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.boot_name())
    }
}

/// As the BootConfig spells it ([`Role::boot_name`]); `Master` is read as [`Role::ControlPlane`].
impl Serialize for Role {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.boot_name())
    }
}

impl<'de> Deserialize<'de> for Role {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// A parsed spec file: one Cluster and its InstanceGroups, in file order.
#[derive(Debug, Clone, PartialEq)]
pub struct Documents {
    pub cluster: Cluster,
    pub instance_groups: Vec<InstanceGroup>,
    /// Other Kubernetes documents of the spec file (kOps' additional objects), in file order: a
    /// `KubeSchedulerConfiguration` is merged into the scheduler's configuration, the rest is applied
    /// to the cluster as an addon.
    pub additional_objects: Vec<serde_json::Value>,
}

/// The API group of kOps documents: any other version of it is a mistake, not an additional object.
const KOPS_GROUP: &str = "kops.k8s.io/";

/// Where in the file a problem is (1-based).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    pub line: usize,
    pub column: usize,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// Why a spec file could not be turned into documents.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParseError {
    /// The bytes are not YAML (syntax error, bad encoding, empty, too deep): the file cannot be read as a spec.
    #[error("{}{message}", location.map(|l| format!("line {l}: ")).unwrap_or_default())]
    Syntax { location: Option<Location>, message: String },
    /// A document is YAML but not a valid Keelson document (unknown field, wrong type, bad value, unknown kind).
    #[error("{document}: {path}: {message}{}", location.map(|l| format!(" (line {l})")).unwrap_or_default())]
    Schema { document: String, path: String, message: String, location: Option<Location> },
}

impl ParseError {
    /// Syntax errors mean "could not parse" (exit 2); schema errors mean "invalid" (exit 1).
    pub fn is_syntax(&self) -> bool {
        matches!(self, ParseError::Syntax { .. })
    }
}

fn location_of(e: &serde_yaml_ng::Error) -> Option<Location> {
    e.location().map(|l| Location { line: l.line(), column: l.column() })
}

/// A cheap scan of the raw text for nesting far beyond any real spec (flow brackets, or
/// `- - - …` chains), so hostile input is refused before the YAML parser spends time on it.
fn too_deep_text(text: &str) -> Option<Location> {
    const LIMIT: usize = 4 * MAX_DEPTH;
    let mut depth = 0usize;
    let (mut single, mut double) = (false, false);
    for (i, line) in text.lines().enumerate() {
        let dashes = line.trim_start().as_bytes().chunks(2).take_while(|c| c == b"- " || *c == b"-").count();
        if dashes > LIMIT {
            return Some(Location { line: i + 1, column: 1 });
        }
        for (col, ch) in line.chars().enumerate() {
            match ch {
                '\'' if !double => single = !single,
                '"' if !single => double = !double,
                '[' | '{' if !single && !double => {
                    depth += 1;
                    if depth > LIMIT {
                        return Some(Location { line: i + 1, column: col + 1 });
                    }
                }
                ']' | '}' if !single && !double => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        // Quotes do not span lines in flow context often enough to matter for a guard.
        single = false;
        double = false;
    }
    None
}

/// Depth of the deepest collection in the text, counted on the YAML value tree iteratively.
/// Whether `c` is a Unicode noncharacter (U+FDD0–U+FDEF, U+nFFFE, U+nFFFF): reserved for a
/// program's internal use, never text (the Terraform renderer marks its expressions with them).
pub fn is_noncharacter(c: char) -> bool {
    let n = u32::from(c);
    (0xFDD0..=0xFDEF).contains(&n) || n & 0xFFFE == 0xFFFE
}

/// The path of the first string (key or value) of `value` holding a noncharacter, and the character.
fn noncharacter_in(value: &serde_yaml_ng::Value) -> Option<(String, char)> {
    let mut stack = vec![(value, String::new())];
    while let Some((v, path)) = stack.pop() {
        match v {
            serde_yaml_ng::Value::String(s) => {
                if let Some(c) = s.chars().find(|c| is_noncharacter(*c)) {
                    return Some((if path.is_empty() { "(document)".into() } else { path }, c));
                }
            }
            serde_yaml_ng::Value::Sequence(items) => stack.extend(items.iter().enumerate().map(|(i, x)| (x, format!("{path}[{i}]")))),
            serde_yaml_ng::Value::Mapping(m) => {
                for (k, x) in m {
                    let key = k.as_str().map_or_else(|| format!("{k:?}"), str::to_string);
                    let here = if path.is_empty() { key } else { format!("{path}.{key}") };
                    stack.push((k, here.clone()));
                    stack.push((x, here));
                }
            }
            serde_yaml_ng::Value::Tagged(t) => stack.push((&t.value, path)),
            _ => {}
        }
    }
    None
}

fn depth(value: &serde_yaml_ng::Value) -> usize {
    let mut max = 0;
    let mut stack = vec![(value, 1usize)];
    while let Some((v, d)) = stack.pop() {
        max = max.max(d);
        match v {
            serde_yaml_ng::Value::Sequence(s) => stack.extend(s.iter().map(|x| (x, d + 1))),
            serde_yaml_ng::Value::Mapping(m) => {
                for (k, x) in m {
                    stack.push((k, d + 1));
                    stack.push((x, d + 1));
                }
            }
            serde_yaml_ng::Value::Tagged(t) => stack.push((&t.value, d + 1)),
            _ => {}
        }
    }
    max
}

/// Turn spec bytes into documents. Every problem found is returned (several documents may
/// each carry one); nothing here panics, whatever the input.
pub fn parse_documents(bytes: &[u8]) -> Result<Documents, Vec<ParseError>> {
    let syntax = |message: String, location: Option<Location>| vec![ParseError::Syntax { location, message }];
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => {
            let before = &bytes[..e.valid_up_to()];
            let line = before.iter().filter(|b| **b == b'\n').count() + 1;
            let column = before.iter().rev().take_while(|b| **b != b'\n').count() + 1;
            return Err(syntax(format!("the file is not UTF-8 text (invalid byte at offset {})", e.valid_up_to()), Some(Location { line, column })));
        }
    };
    if text.contains('\0') {
        return Err(syntax("the file contains NUL bytes: it is binary, not YAML".into(), None));
    }
    if text.trim().is_empty() {
        return Err(syntax("the file is empty: expected a Cluster document".into(), None));
    }

    if let Some(location) = too_deep_text(text) {
        return Err(syntax(format!("nesting deeper than {} levels: refusing to parse", 4 * MAX_DEPTH), Some(location)));
    }

    // Pass 1: plain YAML values, to find syntax errors and each document's kind.
    let mut values = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        match serde_yaml_ng::Value::deserialize(doc) {
            Ok(v) => values.push(v),
            Err(e) => return Err(syntax(e.to_string(), location_of(&e))),
        }
    }

    let mut errors = Vec::new();
    let mut cluster: Option<Cluster> = None;
    let has_cluster_kind = values.iter().any(|v| v.get("kind").and_then(|k| k.as_str()) == Some("Cluster"));
    let mut groups = Vec::new();
    let mut additional = Vec::new();
    // Pass 2: typed documents, each parsed from its own text so errors keep their line numbers.
    for (index, (value, doc)) in values.iter().zip(serde_yaml_ng::Deserializer::from_str(text)).enumerate() {
        if value.is_null() {
            continue;
        }
        let label = document_label(index, value);
        if depth(value) > MAX_DEPTH {
            errors.push(ParseError::Schema {
                document: label,
                path: "(document)".into(),
                message: format!("nested more than {MAX_DEPTH} levels deep"),
                location: None,
            });
            continue;
        }
        if let Some((path, c)) = noncharacter_in(value) {
            let message = format!("holds the Unicode noncharacter U+{:04X}: not text (reserved for programs' internal use)", u32::from(c));
            errors.push(schema(&label, &path, &message));
            continue;
        }
        let Some(map) = value.as_mapping() else {
            errors.push(schema(&label, "(document)", "expected a mapping with apiVersion, kind, metadata and spec"));
            continue;
        };
        let api_version = map.get("apiVersion").and_then(|v| v.as_str());
        let kind = map.get("kind").and_then(|v| v.as_str());
        match api_version {
            Some(API_VERSION) => {}
            Some(other) if !other.starts_with(KOPS_GROUP) && !other.is_empty() => {
                // An additional object: any Kubernetes document with a kind (and a name, unless it
                // is a component configuration such as KubeSchedulerConfiguration).
                let named = value.get("metadata").and_then(|m| m.get("name")).and_then(|n| n.as_str()).is_some_and(|n| !n.is_empty());
                match kind {
                    None | Some("") => errors.push(schema(&label, "kind", "missing: an additional object needs apiVersion and kind")),
                    Some(k) if !named && !k.ends_with("Configuration") => {
                        errors.push(schema(&label, "metadata.name", "missing: an additional object needs a name"))
                    }
                    Some(_) => match serde_json::to_value(value) {
                        Ok(v) => additional.push(v),
                        Err(e) => errors.push(schema(&label, "(document)", &format!("not representable as JSON: {e}"))),
                    },
                }
                continue;
            }
            Some(other) => {
                errors.push(schema(&label, "apiVersion", &format!("unknown apiVersion {other:?}: expected {API_VERSION:?}")));
                continue;
            }
            None => {
                errors.push(schema(&label, "apiVersion", &format!("missing: expected {API_VERSION:?}")));
                continue;
            }
        }
        match kind {
            Some("Cluster") => match typed::<Cluster>(doc, &label) {
                Ok(c) if cluster.is_some() => {
                    let _ = c;
                    errors.push(schema(&label, "kind", "a second Cluster document: a spec file holds exactly one cluster"));
                }
                Ok(c) => cluster = Some(c),
                Err(e) => errors.push(e),
            },
            Some("InstanceGroup") => match typed::<InstanceGroup>(doc, &label) {
                Ok(g) => groups.push(g),
                Err(e) => errors.push(e),
            },
            Some(other) => errors.push(schema(&label, "kind", &format!("unknown kind {other:?}: expected Cluster or InstanceGroup"))),
            None => errors.push(schema(&label, "kind", "missing: expected Cluster or InstanceGroup")),
        }
    }
    match cluster {
        Some(cluster) if errors.is_empty() => Ok(Documents { cluster, instance_groups: groups, additional_objects: additional }),
        Some(_) => Err(errors),
        None => {
            if !has_cluster_kind {
                errors.push(schema("(file)", "kind", "no Cluster document: a spec needs exactly one kind: Cluster"));
            }
            Err(errors)
        }
    }
}

fn schema(document: &str, path: &str, message: &str) -> ParseError {
    ParseError::Schema { document: document.into(), path: path.into(), message: message.into(), location: None }
}

/// `Cluster/<name>` or `InstanceGroup/<name>`, falling back to the document's position.
fn document_label(index: usize, value: &serde_yaml_ng::Value) -> String {
    let kind = value.get("kind").and_then(|v| v.as_str()).unwrap_or("document");
    match value.get("metadata").and_then(|m| m.get("name")).and_then(|n| n.as_str()) {
        Some(name) => format!("{kind}/{name}"),
        None => format!("{kind}#{}", index + 1),
    }
}

fn typed<T: serde::de::DeserializeOwned>(doc: serde_yaml_ng::Deserializer<'_>, label: &str) -> Result<T, ParseError> {
    serde_path_to_error::deserialize(doc).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let location = location_of(&inner);
        // serde_yaml_ng appends " at line L column C" to messages; we carry the location separately.
        let mut message = inner.to_string();
        if let Some(pos) = message.find(" at line ") {
            message.truncate(pos);
        }
        if let Some(short) = shorten_unknown_field(&message) {
            message = short;
        }
        // It also prefixes its own idea of the path ("spec.kubelet: …"); we report the exact one.
        if let Some((head, rest)) = message.split_once(": ") {
            if !head.is_empty() && head.chars().all(|c| c.is_ascii_alphanumeric() || "_.[]-".contains(c)) {
                message = rest.to_string();
            }
        }
        ParseError::Schema { document: label.to_string(), path, message, location }
    })
}

/// "unknown field `maxPodz`, expected one of `a`, `b`, …" → "unknown field `maxPodz` (did you mean `maxPods`?)".
fn shorten_unknown_field(message: &str) -> Option<String> {
    let start = message.find("unknown field `")?;
    let (head, expected) = message[start..].split_once(", expected ")?;
    let field = head.trim_start_matches("unknown field `").trim_end_matches('`');
    let candidates = expected.split('`').skip(1).step_by(2);
    let best = candidates.map(|c| (edit_distance(&field.to_lowercase(), &c.to_lowercase()), c)).min();
    let prefix = &message[..start];
    Some(match best {
        Some((d, c)) if d <= 2.max(field.len() / 4) => format!("{prefix}{head} (did you mean `{c}`?)"),
        _ => format!("{prefix}{head}"),
    })
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = "apiVersion: kops.k8s.io/v1alpha2\nkind: Cluster\nmetadata:\n  name: a.example.com\nspec:\n  kubernetesVersion: v1.32.0\n---\napiVersion: kops.k8s.io/v1alpha2\nkind: InstanceGroup\nmetadata:\n  name: nodes\nspec:\n  role: Node\n";

    #[test]
    fn parses_cluster_and_groups() {
        let docs = parse_documents(MINIMAL.as_bytes()).unwrap();
        assert_eq!(docs.cluster.name(), "a.example.com");
        assert_eq!(docs.instance_groups.len(), 1);
        assert_eq!(docs.instance_groups[0].role(), Some(Role::Node));
    }

    #[test]
    fn unknown_field_names_its_path() {
        let text = MINIMAL.replace("  kubernetesVersion: v1.32.0", "  kubelet:\n    bogusField: 1");
        let errs = parse_documents(text.as_bytes()).unwrap_err();
        let msg = errs[0].to_string();
        assert!(msg.contains("Cluster/a.example.com: spec.kubelet"), "{msg}");
        assert!(msg.contains("bogusField"), "{msg}");
    }

    /// A noncharacter (written raw or as a YAML escape) is refused with its path, in a key or a value.
    #[test]
    fn noncharacters_are_refused_with_their_path() {
        for (text, path) in [
            (MINIMAL.replace("v1.32.0", "\"v1.32.0\\uFDD0\""), "spec.kubernetesVersion"),
            (MINIMAL.replace("role: Node", "role: Node\n  cloudLabels:\n    \u{FDD1}team: a"), "spec.cloudLabels.\u{FDD1}team"),
            (MINIMAL.replace("role: Node", "role: Node\n  cloudLabels:\n    team: [\"\u{10FFFF}\"]"), "spec.cloudLabels.team[0]"),
        ] {
            let errs = parse_documents(text.as_bytes()).unwrap_err();
            let msg = errs[0].to_string();
            assert!(msg.contains(&format!("{path}: holds the Unicode noncharacter U+")), "{msg}");
        }
        assert!(!is_noncharacter('\u{FDCF}') && !is_noncharacter('\u{FFFD}') && is_noncharacter('\u{1FFFE}'));
    }

    #[test]
    fn syntax_error_has_line_and_column() {
        let errs = parse_documents(b"kind: Cluster\n  bad: [").unwrap_err();
        assert!(errs[0].is_syntax());
        assert!(errs[0].to_string().starts_with("line 2:"), "{}", errs[0]);
    }

    #[test]
    fn deep_nesting_is_refused_without_overflow() {
        let deep = format!("apiVersion: kops.k8s.io/v1alpha2\nkind: Cluster\nspec: {}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(parse_documents(deep.as_bytes()).is_err());
        let dashes = format!("apiVersion: kops.k8s.io/v1alpha2\nkind: Cluster\nspec:\n  x: {}1\n", "- ".repeat(100_000));
        assert!(parse_documents(dashes.as_bytes()).is_err());
        // Moderately deep but legal-looking nesting is parsed, then refused by the typed layer, not the guard.
        let moderate = format!("apiVersion: kops.k8s.io/v1alpha2\nkind: Cluster\nspec: {}{}", "[".repeat(100), "]".repeat(100));
        let errs = parse_documents(moderate.as_bytes()).unwrap_err();
        assert!(!errs[0].is_syntax() || errs[0].to_string().contains("recursion"), "{}", errs[0]);
    }

    #[test]
    fn other_kubernetes_documents_are_additional_objects() {
        let text = format!(
            "{MINIMAL}---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: extra\n  namespace: default\ndata:\n  a: \"1\"\n---\napiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\npercentageOfNodesToScore: 50\n"
        );
        let docs = parse_documents(text.as_bytes()).expect("parse");
        assert_eq!(docs.additional_objects.len(), 2);
        assert_eq!(docs.additional_objects[0]["kind"], "ConfigMap");
        assert_eq!(docs.additional_objects[1]["percentageOfNodesToScore"], 50);
        // A kOps document of another version is a mistake, and an object needs a kind and a name.
        for (bad, path) in [
            ("apiVersion: kops.k8s.io/v1alpha3\nkind: InstanceGroup\nmetadata:\n  name: x\n", "apiVersion"),
            ("apiVersion: v1\nmetadata:\n  name: x\n", "kind"),
            ("apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n", "metadata.name"),
        ] {
            let errs = parse_documents(format!("{MINIMAL}---\n{bad}").as_bytes()).expect_err(bad);
            assert!(errs.iter().any(|e| e.to_string().contains(path)), "{bad}: {errs:?}");
        }
    }
}
