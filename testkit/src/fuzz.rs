//! The one fuzz engine of the workspace's fuzz tests (docs/fuzzing.md): seed inputs, mutated by
//! structure-aware edits (on the parsed YAML/JSON tree: replace a node, drop or rename a key, graft
//! a value taken from another seed) and byte edits (flips, inserted syntax tokens, deleted,
//! duplicated or spliced ranges, line shuffles), plus plain arbitrary bytes. proptest drives it:
//! every case is an [`Input`] drawn from one seeded RNG, a panic in the checked code fails the run,
//! and the failing input is shrunk to a small one and saved so it can become a regression test.
//!
//! The count comes from `KEELSON_FUZZ_CASES` (per target; the tests give their own small default
//! so `cargo test` stays fast), the RNG seed from `KEELSON_FUZZ_SEED` (printed by every run, so a
//! run is repeated by giving the same seed; [`DEFAULT_SEED`] without it), and crashing inputs are written under
//! `KEELSON_FUZZ_CRASHES` (default: the system temp directory's `keelson-fuzz-crashes/`).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};
use serde_yaml_ng::Value;

/// The environment variable that sets how many inputs each target runs.
pub const CASES_ENV: &str = "KEELSON_FUZZ_CASES";
/// The environment variable that sets the RNG seed (a `u64`).
pub const SEED_ENV: &str = "KEELSON_FUZZ_SEED";
/// The environment variable naming where crashing inputs are written.
pub const CRASHES_ENV: &str = "KEELSON_FUZZ_CRASHES";

/// Inputs per target: `KEELSON_FUZZ_CASES`, else `default`. A value that is not a number is a
/// mistake in the campaign's command line, so it stops the test rather than running the default.
pub fn cases(default: u32) -> u32 {
    match std::env::var(CASES_ENV) {
        Ok(v) => v.replace(['_', ','], "").parse().unwrap_or_else(|_| panic!("{CASES_ENV}={v:?}: expected a number of inputs")),
        Err(_) => default,
    }
}

/// Syntax that parsers trip on: YAML and JSON structure, anchors and tags, numbers at the edges,
/// multi-byte and control characters, and the separators our own formats use.
const TOKENS: &[&str] = &[
    "\n",
    "\n  ",
    "\n- ",
    ": ",
    ":",
    "- ",
    "---\n",
    "...\n",
    "{",
    "}",
    "[",
    "]",
    ",",
    "\"",
    "'",
    "#",
    "&a ",
    "*a",
    "<<: *a\n",
    "!!str ",
    "!!binary ",
    "!!int ",
    "!!float ",
    "!!map ",
    "!!seq ",
    "!Tag ",
    "? ",
    "|\n",
    ">-\n",
    "~",
    "null",
    "true",
    "no",
    "0",
    "-1",
    "-0",
    "0x1F",
    "0o777",
    "1e400",
    "-1e400",
    ".nan",
    ".inf",
    "18446744073709551616",
    "-9223372036854775809",
    "4294967296",
    "65536",
    "\0",
    "\t",
    "\r\n",
    "\u{feff}",
    "é",
    "\u{1F600}",
    "\u{202e}",
    "\\",
    "/",
    "../",
    "..",
    ".",
    "=",
    "@",
    "%",
    "${",
    "}}",
    "{{",
    "\u{7f}",
    " ",
    "\"\"",
    "''",
    "[]",
    "{}",
    "::",
    "0.0.0.0/0",
    "::/0",
    "10.0.0.0/33",
    "256.1.1.1",
    "fe80::1%eth0",
    "s3://",
    "gs://",
    "file://",
    "http://",
    "https://",
    "sha256:",
    "AWS4-HMAC-SHA256 ",
    "Credential=",
    "SignedHeaders=",
    "Signature=",
    "x-gce-identity ",
    "Bearer ",
    "-----BEGIN ",
    "-----END ",
];

/// Values a tree edit puts in place of a node.
fn interesting_value(i: usize, text: &str) -> Value {
    let n = Value::Number;
    match i % 22 {
        0 => Value::Null,
        1 => Value::Bool(true),
        2 => Value::Bool(false),
        3 => n(0.into()),
        4 => n((-1).into()),
        5 => n(i64::MAX.into()),
        6 => n(i64::MIN.into()),
        7 => n(u64::MAX.into()),
        8 => n(f64::NAN.into()),
        9 => n(f64::INFINITY.into()),
        10 => n(1.5e300.into()),
        11 => Value::String(String::new()),
        12 => Value::String(text.to_string()),
        13 => Value::String(text.repeat(64)),
        14 => Value::String(format!("{text}\u{0}\u{202e}é\u{1F600}")),
        15 => Value::Sequence(Vec::new()),
        16 => Value::Mapping(Default::default()),
        17 => Value::Sequence(vec![Value::String(text.to_string()), Value::Null]),
        18 => {
            let mut m = serde_yaml_ng::Mapping::new();
            m.insert(Value::String(text.to_string()), Value::String(text.to_string()));
            Value::Mapping(m)
        }
        19 => n(65536.into()),
        20 => n(4294967296u64.into()),
        // Nesting deep enough to reach any recursion in the consumers, short of the parser's own limit.
        _ => (0..100).fold(Value::String(text.to_string()), |v, _| Value::Sequence(vec![v])),
    }
}

/// One edit of the parsed tree of a seed.
#[derive(Debug, Clone)]
pub enum TreeEdit {
    /// Put an [`interesting_value`] in place of a node.
    Replace { node: Index, value: usize, text: String },
    /// Put a node of (possibly) another seed in place of a node.
    Graft { node: Index, seed: Index, from: Index },
    /// Remove a mapping entry or sequence element.
    Remove { node: Index },
    /// Rename a mapping key (another key of the seeds, a changed case, or a text).
    RenameKey { node: Index, key: Index, text: String },
    /// Insert a copy of a node into a sequence or mapping.
    Duplicate { node: Index },
}

/// One edit of the bytes.
#[derive(Debug, Clone)]
pub enum ByteEdit {
    FlipBit {
        at: Index,
        bit: u8,
    },
    SetByte {
        at: Index,
        byte: u8,
    },
    Insert {
        at: Index,
        bytes: Vec<u8>,
    },
    Token {
        at: Index,
        token: Index,
    },
    /// A harvested word of the seeds (a key or a value) inserted.
    Word {
        at: Index,
        word: Index,
    },
    Delete {
        at: Index,
        len: u8,
    },
    Duplicate {
        from: Index,
        len: u16,
        to: Index,
    },
    Splice {
        seed: Index,
        from: Index,
        len: u16,
        at: Index,
    },
    Truncate {
        at: Index,
    },
    DeleteLine {
        line: Index,
    },
    DuplicateLine {
        line: Index,
        to: Index,
    },
    SwapLines {
        a: Index,
        b: Index,
    },
    Indent {
        line: Index,
        by: i8,
    },
}

/// One fuzz case: arbitrary bytes, or a seed with tree and byte edits.
#[derive(Debug, Clone)]
pub enum Input {
    Bytes(Vec<u8>),
    Mutated { seed: Index, tree: Vec<TreeEdit>, bytes: Vec<ByteEdit> },
}

fn tree_edit() -> impl Strategy<Value = TreeEdit> {
    let text = "\\PC{0,12}";
    prop_oneof![
        3 => (any::<Index>(), any::<usize>(), text).prop_map(|(node, value, text)| TreeEdit::Replace { node, value, text }),
        3 => (any::<Index>(), any::<Index>(), any::<Index>()).prop_map(|(node, seed, from)| TreeEdit::Graft { node, seed, from }),
        2 => any::<Index>().prop_map(|node| TreeEdit::Remove { node }),
        1 => (any::<Index>(), any::<Index>(), text).prop_map(|(node, key, text)| TreeEdit::RenameKey { node, key, text }),
        1 => any::<Index>().prop_map(|node| TreeEdit::Duplicate { node }),
    ]
}

fn byte_edit() -> impl Strategy<Value = ByteEdit> {
    let i = any::<Index>;
    prop_oneof![
        2 => (i(), 0u8..8).prop_map(|(at, bit)| ByteEdit::FlipBit { at, bit }),
        2 => (i(), any::<u8>()).prop_map(|(at, byte)| ByteEdit::SetByte { at, byte }),
        1 => (i(), proptest::collection::vec(any::<u8>(), 1..8)).prop_map(|(at, bytes)| ByteEdit::Insert { at, bytes }),
        3 => (i(), i()).prop_map(|(at, token)| ByteEdit::Token { at, token }),
        2 => (i(), i()).prop_map(|(at, word)| ByteEdit::Word { at, word }),
        2 => (i(), 1u8..64).prop_map(|(at, len)| ByteEdit::Delete { at, len }),
        1 => (i(), 1u16..512, i()).prop_map(|(from, len, to)| ByteEdit::Duplicate { from, len, to }),
        1 => (i(), i(), 1u16..512, i()).prop_map(|(seed, from, len, at)| ByteEdit::Splice { seed, from, len, at }),
        1 => i().prop_map(|at| ByteEdit::Truncate { at }),
        2 => i().prop_map(|line| ByteEdit::DeleteLine { line }),
        1 => (i(), i()).prop_map(|(line, to)| ByteEdit::DuplicateLine { line, to }),
        1 => (i(), i()).prop_map(|(a, b)| ByteEdit::SwapLines { a, b }),
        1 => (i(), -4i8..5).prop_map(|(line, by)| ByteEdit::Indent { line, by }),
    ]
}

fn input() -> impl Strategy<Value = Input> {
    prop_oneof![
        1 => proptest::collection::vec(any::<u8>(), 0..512).prop_map(Input::Bytes),
        9 => (any::<Index>(), proptest::collection::vec(tree_edit(), 0..5), proptest::collection::vec(byte_edit(), 0..3))
            .prop_map(|(seed, tree, bytes)| Input::Mutated { seed, tree, bytes }),
    ]
}

/// A seed as the engine keeps it: its bytes and, when they are YAML or JSON, its documents.
struct Seed {
    bytes: Vec<u8>,
    docs: Option<Vec<Value>>,
    json: bool,
}

/// The seeds of one target, their documents and the words harvested from them.
pub struct Corpus {
    seeds: Vec<Seed>,
    words: Vec<Vec<u8>>,
}

fn parse_docs(bytes: &[u8]) -> Option<Vec<Value>> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut docs = Vec::new();
    for d in serde_yaml_ng::Deserializer::from_str(text) {
        docs.push(serde::Deserialize::deserialize(d).ok()?);
    }
    // A scalar document is text, not a tree worth editing (a hosts file, an Authorization header).
    docs.iter().any(|d| matches!(d, Value::Mapping(_) | Value::Sequence(_))).then_some(docs)
}

fn harvest(v: &Value, out: &mut Vec<Vec<u8>>) {
    match v {
        Value::String(s) => out.push(s.as_bytes().to_vec()),
        Value::Sequence(x) => x.iter().for_each(|e| harvest(e, out)),
        Value::Mapping(m) => m.iter().for_each(|(k, e)| {
            harvest(k, out);
            harvest(e, out);
        }),
        Value::Tagged(t) => harvest(&t.value, out),
        _ => {}
    }
}

impl Corpus {
    /// The corpus of `seeds` (at least one).
    pub fn new(seeds: Vec<Vec<u8>>) -> Corpus {
        assert!(!seeds.is_empty(), "a fuzz target needs at least one seed");
        let seeds: Vec<Seed> = seeds
            .into_iter()
            .map(|bytes| {
                let json = bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
                Seed { docs: parse_docs(&bytes), bytes, json }
            })
            .collect();
        let mut words = Vec::new();
        for s in &seeds {
            for d in s.docs.iter().flatten() {
                harvest(d, &mut words);
            }
            // Text seeds: their whitespace-separated words.
            if s.docs.is_none() {
                words.extend(s.bytes.split(|b| b.is_ascii_whitespace()).filter(|w| !w.is_empty() && w.len() < 128).map(<[u8]>::to_vec));
            }
        }
        words.retain(|w| w.len() < 256);
        words.sort();
        words.dedup();
        if words.is_empty() {
            words.push(b"x".to_vec());
        }
        Corpus { seeds, words }
    }

    /// The bytes of `input`.
    pub fn materialize(&self, input: &Input) -> Vec<u8> {
        let (seed, tree, edits) = match input {
            Input::Bytes(b) => return b.clone(),
            Input::Mutated { seed, tree, bytes } => (&self.seeds[seed.index(self.seeds.len())], tree, bytes),
        };
        let mut out = match (&seed.docs, tree.is_empty()) {
            (Some(docs), false) => {
                let mut docs = docs.clone();
                for e in tree {
                    self.apply_tree(&mut docs, e);
                }
                render(&docs, seed.json).unwrap_or_else(|| seed.bytes.clone())
            }
            _ => seed.bytes.clone(),
        };
        // A text seed has no tree: its tree edits become the byte edits nearest to them, so no
        // input of a text target is its seed unchanged for want of a tree.
        if seed.docs.is_none() {
            for e in tree {
                self.apply_bytes(&mut out, &text_edit(e));
            }
        }
        for e in edits {
            self.apply_bytes(&mut out, e);
        }
        out
    }

    fn apply_tree(&self, docs: &mut [Value], edit: &TreeEdit) {
        match edit {
            TreeEdit::Replace { node, value, text } => {
                if let Some(v) = nth_node(docs, *node) {
                    *v = interesting_value(*value, text);
                }
            }
            TreeEdit::Graft { node, seed, from } => {
                let donor = &self.seeds[seed.index(self.seeds.len())];
                let Some(mut donor_docs) = donor.docs.clone() else { return };
                let Some(graft) = nth_node(&mut donor_docs, *from).cloned() else { return };
                if let Some(v) = nth_node(docs, *node) {
                    *v = graft;
                }
            }
            TreeEdit::Remove { node } => {
                if let Some(v) = nth_container(docs, *node) {
                    match v {
                        Value::Mapping(m) if !m.is_empty() => {
                            let k = m.keys().nth(node.index(m.len())).cloned();
                            if let Some(k) = k {
                                m.remove(&k);
                            }
                        }
                        Value::Sequence(s) if !s.is_empty() => {
                            s.remove(node.index(s.len()));
                        }
                        _ => {}
                    }
                }
            }
            TreeEdit::RenameKey { node, key, text } => {
                let Some(Value::Mapping(m)) = nth_container(docs, *node) else { return };
                if m.is_empty() {
                    return;
                }
                let Some(old) = m.keys().nth(node.index(m.len())).cloned() else { return };
                let new = match key.index(3) {
                    0 => Value::String(String::from_utf8_lossy(&self.words[key.index(self.words.len())]).into_owned()),
                    1 => Value::String(old.as_str().map(|s| s.to_ascii_uppercase()).unwrap_or_default()),
                    _ => Value::String(text.clone()),
                };
                if let Some(v) = m.remove(&old) {
                    m.insert(new, v);
                }
            }
            TreeEdit::Duplicate { node } => {
                if let Some(v) = nth_container(docs, *node) {
                    match v {
                        Value::Sequence(s) if !s.is_empty() => {
                            let e = s[node.index(s.len())].clone();
                            s.push(e);
                        }
                        Value::Mapping(m) if !m.is_empty() => {
                            if let Some((k, e)) = m.iter().nth(node.index(m.len())).map(|(k, e)| (k.clone(), e.clone())) {
                                let key = Value::String(format!("{}2", k.as_str().unwrap_or("k")));
                                m.insert(key, e);
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
    }

    fn apply_bytes(&self, b: &mut Vec<u8>, edit: &ByteEdit) {
        let at = |i: &Index, len: usize| i.index(len + 1);
        match edit {
            ByteEdit::FlipBit { at: i, bit } => {
                if !b.is_empty() {
                    let j = i.index(b.len());
                    b[j] ^= 1 << bit;
                }
            }
            ByteEdit::SetByte { at: i, byte } => {
                if !b.is_empty() {
                    let j = i.index(b.len());
                    b[j] = *byte;
                }
            }
            ByteEdit::Insert { at: i, bytes } => {
                let j = at(i, b.len());
                b.splice(j..j, bytes.iter().copied());
            }
            ByteEdit::Token { at: i, token } => {
                let j = at(i, b.len());
                b.splice(j..j, TOKENS[token.index(TOKENS.len())].bytes());
            }
            ByteEdit::Word { at: i, word } => {
                let j = at(i, b.len());
                b.splice(j..j, self.words[word.index(self.words.len())].iter().copied());
            }
            ByteEdit::Delete { at: i, len } => {
                if !b.is_empty() {
                    let j = i.index(b.len());
                    let end = (j + *len as usize).min(b.len());
                    b.drain(j..end);
                }
            }
            ByteEdit::Duplicate { from, len, to } => {
                if !b.is_empty() {
                    let j = from.index(b.len());
                    let piece: Vec<u8> = b[j..(j + *len as usize).min(b.len())].to_vec();
                    let k = at(to, b.len());
                    b.splice(k..k, piece);
                }
            }
            ByteEdit::Splice { seed, from, len, at: i } => {
                let donor = &self.seeds[seed.index(self.seeds.len())].bytes;
                if !donor.is_empty() {
                    let j = from.index(donor.len());
                    let piece = &donor[j..(j + *len as usize).min(donor.len())];
                    let k = at(i, b.len());
                    b.splice(k..k, piece.iter().copied());
                }
            }
            ByteEdit::Truncate { at: i } => {
                let j = at(i, b.len());
                b.truncate(j);
            }
            ByteEdit::DeleteLine { line } => edit_lines(b, |lines| {
                let i = line.index(lines.len());
                lines.remove(i);
            }),
            ByteEdit::DuplicateLine { line, to } => edit_lines(b, |lines| {
                let l = lines[line.index(lines.len())].clone();
                let k = to.index(lines.len() + 1);
                lines.insert(k, l);
            }),
            ByteEdit::SwapLines { a, b: other } => edit_lines(b, |lines| {
                let (i, j) = (a.index(lines.len()), other.index(lines.len()));
                lines.swap(i, j);
            }),
            ByteEdit::Indent { line, by } => edit_lines(b, |lines| {
                let i = line.index(lines.len());
                let l = &mut lines[i];
                if *by >= 0 {
                    l.splice(0..0, std::iter::repeat_n(b' ', *by as usize));
                } else {
                    let strip = l.iter().take((-*by) as usize).take_while(|c| **c == b' ').count();
                    l.drain(..strip);
                }
            }),
        }
    }
}

/// The byte edit standing in for a tree edit on a seed without a tree.
fn text_edit(e: &TreeEdit) -> ByteEdit {
    match e {
        TreeEdit::Replace { node, text, .. } => ByteEdit::Insert { at: *node, bytes: text.as_bytes().to_vec() },
        TreeEdit::Graft { node, seed, from } => ByteEdit::Splice { seed: *seed, from: *from, len: 64, at: *node },
        TreeEdit::Remove { node } => ByteEdit::Delete { at: *node, len: 16 },
        TreeEdit::RenameKey { node, key, .. } => ByteEdit::Word { at: *node, word: *key },
        TreeEdit::Duplicate { node } => ByteEdit::DuplicateLine { line: *node, to: *node },
    }
}

/// Apply `f` to the lines of `b` (not called when there are none).
fn edit_lines(b: &mut Vec<u8>, f: impl FnOnce(&mut Vec<Vec<u8>>)) {
    let mut lines: Vec<Vec<u8>> = b.split(|c| *c == b'\n').map(<[u8]>::to_vec).collect();
    if lines.is_empty() {
        return;
    }
    f(&mut lines);
    *b = lines.join(&b'\n');
}

fn render(docs: &[Value], json: bool) -> Option<Vec<u8>> {
    if json && docs.len() == 1 {
        // A YAML value with a non-string key or a NaN is not JSON: render it as YAML then (the
        // parsers under test take YAML's JSON subset, and the bytes are mutated anyway).
        if let Ok(j) = serde_json::to_vec(&docs[0]) {
            return Some(j);
        }
    }
    let mut out = String::new();
    for d in docs {
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(d).ok()?);
    }
    Some(out.into_bytes())
}

/// The path (child positions, a mapping's in iteration order) of the `n`-th node of `v` that `want`
/// accepts, pre-order; `n` counts down the accepted nodes passed.
fn path_in(v: &Value, n: &mut usize, want: &dyn Fn(&Value) -> bool, path: &mut Vec<usize>) -> bool {
    if want(v) {
        if *n == 0 {
            return true;
        }
        *n -= 1;
    }
    let children: Vec<&Value> = match v {
        Value::Sequence(s) => s.iter().collect(),
        Value::Mapping(m) => m.values().collect(),
        Value::Tagged(t) => vec![&t.value],
        _ => Vec::new(),
    };
    for (i, c) in children.into_iter().enumerate() {
        path.push(i);
        if path_in(c, n, want, path) {
            return true;
        }
        path.pop();
    }
    false
}

fn count(v: &Value, want: &dyn Fn(&Value) -> bool) -> usize {
    usize::from(want(v))
        + match v {
            Value::Sequence(s) => s.iter().map(|e| count(e, want)).sum(),
            Value::Mapping(m) => m.values().map(|e| count(e, want)).sum(),
            Value::Tagged(t) => count(&t.value, want),
            _ => 0,
        }
}

fn follow<'a>(v: &'a mut Value, path: &[usize]) -> Option<&'a mut Value> {
    let Some((first, rest)) = path.split_first() else { return Some(v) };
    let child = match v {
        Value::Sequence(s) => s.get_mut(*first)?,
        Value::Mapping(m) => m.values_mut().nth(*first)?,
        Value::Tagged(t) => &mut t.value,
        _ => return None,
    };
    follow(child, rest)
}

/// The node `i` picks among the nodes of `docs` that `want` accepts (pre-order).
fn pick<'a>(docs: &'a mut [Value], i: Index, want: &dyn Fn(&Value) -> bool) -> Option<&'a mut Value> {
    let total: usize = docs.iter().map(|d| count(d, want)).sum();
    if total == 0 {
        return None;
    }
    let mut n = i.index(total);
    for d in docs.iter_mut() {
        let mut path = Vec::new();
        if path_in(d, &mut n, want, &mut path) {
            return follow(d, &path);
        }
    }
    None
}

fn nth_node(docs: &mut [Value], i: Index) -> Option<&mut Value> {
    pick(docs, i, &|_| true)
}

fn nth_container(docs: &mut [Value], i: Index) -> Option<&mut Value> {
    pick(docs, i, &|v| matches!(v, Value::Mapping(_) | Value::Sequence(_)))
}

/// What one run did: inputs, time, and how many inputs ended in each outcome the target reported.
#[derive(Debug, Clone)]
pub struct Report {
    pub target: String,
    pub inputs: u64,
    pub seconds: f64,
    pub outcomes: BTreeMap<&'static str, u64>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rate = self.inputs as f64 / self.seconds.max(1e-9);
        write!(f, "fuzz {}: {} inputs in {:.1} s ({:.0}/s), 0 panics;", self.target, self.inputs, self.seconds, rate)?;
        for (k, v) in &self.outcomes {
            write!(f, " {k} {v}")?;
        }
        Ok(())
    }
}

/// The seed of a run without `KEELSON_FUZZ_SEED`: fixed, so `cargo test` and CI draw the same
/// inputs every time (a red run is the change's doing and repeats as it is); the campaign
/// (`scripts/fuzz`) draws a new seed per run and prints it.
pub const DEFAULT_SEED: u64 = 20_261_203;

fn seed_from_env() -> u64 {
    match std::env::var(SEED_ENV) {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("{SEED_ENV}={v:?}: expected a u64")),
        Err(_) => DEFAULT_SEED,
    }
}

fn crash_dir() -> PathBuf {
    std::env::var_os(CRASHES_ENV).map(PathBuf::from).unwrap_or_else(|| std::env::temp_dir().join("keelson-fuzz-crashes"))
}

/// Run `check` on `cases` inputs made from `seeds`. `check` returns the outcome of one input (a
/// short label such as `"parsed"` or `"refused"`, tallied in the [`Report`]); a panic in it fails
/// the run: the input is shrunk, written to the crash directory, and the test panics naming the
/// file and showing the input. Prints and returns the report.
pub fn run(target: &str, seeds: Vec<Vec<u8>>, cases: u32, check: impl Fn(&[u8]) -> &'static str) -> Report {
    let corpus = Corpus::new(seeds);
    let seed = seed_from_env();
    let mut rng_seed = [0u8; 16];
    rng_seed[..8].copy_from_slice(&seed.to_le_bytes());
    rng_seed[8..].copy_from_slice(&(!seed).to_le_bytes());
    let config = Config { cases, failure_persistence: None, max_shrink_iters: 4096, ..Config::default() };
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::XorShift, &rng_seed));
    let outcomes: RefCell<BTreeMap<&'static str, u64>> = RefCell::new(BTreeMap::new());
    let inputs = RefCell::new(0u64);
    eprintln!("fuzz {target}: {cases} inputs, {SEED_ENV}={seed}");
    let start = Instant::now();
    let result = runner.run(&input(), |i| {
        let bytes = corpus.materialize(&i);
        let outcome = check(&bytes);
        *inputs.borrow_mut() += 1;
        *outcomes.borrow_mut().entry(outcome).or_default() += 1;
        Ok::<(), TestCaseError>(())
    });
    let seconds = start.elapsed().as_secs_f64();
    match result {
        Ok(()) => {
            let report = Report { target: target.to_string(), inputs: inputs.into_inner(), seconds, outcomes: outcomes.into_inner() };
            println!("{report}");
            report
        }
        Err(TestError::Fail(reason, minimal)) => {
            let bytes = corpus.materialize(&minimal);
            let dir = crash_dir();
            let file = dir.join(format!("{target}-{seed}.bin"));
            let saved = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&file, &bytes));
            let saved = match saved {
                Ok(()) => format!("saved to {}", file.display()),
                Err(e) => format!("not saved ({}: {e})", file.display()),
            };
            panic!(
                "fuzz {target}: a panic ({reason}) after {} inputs ({SEED_ENV}={seed}); the shrunk input, {saved}:\n{:?}",
                inputs.into_inner(),
                String::from_utf8_lossy(&bytes)
            );
        }
        Err(TestError::Abort(reason)) => panic!("fuzz {target}: aborted: {reason}"),
    }
}

/// The files of `dir` whose name ends in `suffix` (sorted; none when the directory is missing).
pub fn files(dir: &std::path::Path, suffix: &str) -> Vec<Vec<u8>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.to_str().is_some_and(|s| s.ends_with(suffix)))
        .collect();
    paths.sort();
    paths.iter().filter_map(|p| std::fs::read(p).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::ValueTree as _;

    #[test]
    fn edits_keep_to_the_input_and_change_it() {
        let corpus = Corpus::new(vec![b"a: 1\nb: [x, y]\nc: {d: e}\n".to_vec(), b"plain text\nline two\n".to_vec()]);
        let mut runner = TestRunner::deterministic();
        let mut changed = 0;
        for _ in 0..2000 {
            let i = input().new_tree(&mut runner).expect("input").current();
            let b = corpus.materialize(&i);
            if b != corpus.seeds[0].bytes && b != corpus.seeds[1].bytes {
                changed += 1;
            }
        }
        assert!(changed > 1500, "only {changed} of 2000 inputs differ from their seed");
    }

    #[test]
    fn a_panic_is_reported_with_the_shrunk_input() {
        let r = std::panic::catch_unwind(|| run("selftest", vec![b"key: value\n".to_vec()], 2000, |b| if b.contains(&b'{') { panic!("brace") } else { "ok" }));
        let message = r.expect_err("a brace comes up in 2000 inputs");
        let text = message.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(text.contains("fuzz selftest: a panic"), "{text}");
    }
}
