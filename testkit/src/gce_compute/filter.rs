//! The `filter` of Compute list methods, the subset kOps and protokube send: terms joined by `AND`
//! (or juxtaposed), each optionally in parentheses, each `FIELD OP VALUE` where FIELD is a dotted
//! path into the resource (`name`, `status`, `labels.KEY`), OP is `=`, `!=`, `:` (has; `:*`
//! means the field is present), `eq` or `ne` (an RE2 full match; only literals and `.*` here).
//! `=` and `:` take `*` as a wildcard, as Compute does. Anything else is 400 `invalid`.

use serde_json::Value;

use crate::google_api::ApiError;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    Eq,
    Ne,
    Has,
    Re,
    NotRe,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Term {
    path: Vec<String>,
    op: Op,
    value: String,
}

/// A parsed filter: every term must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter(Vec<Term>);

impl Filter {
    pub fn parse(s: &str) -> Result<Filter, ApiError> {
        let bad = |why: &str| ApiError::invalid(format!("Invalid value for field 'filter': '{s}'. {why}"));
        let tokens = tokenize(s).map_err(|e| bad(&e))?;
        let mut terms = Vec::new();
        let mut i = 0;
        while i < tokens.len() {
            if tokens[i] == "AND" {
                i += 1;
                continue;
            }
            if tokens[i] == "OR" || tokens[i] == "NOT" {
                return Err(bad("only AND of terms is supported"));
            }
            // FIELD OP VALUE, or FIELD<op>VALUE in one token.
            let (field, op, value, used) = split_term(&tokens[i..]).ok_or_else(|| bad("expected FIELD OP VALUE"))?;
            if field.is_empty() {
                return Err(bad("a term has no field"));
            }
            if matches!(op, Op::Re | Op::NotRe) && value.chars().any(|c| "[](){}|+?^$\\".contains(c)) {
                return Err(bad("only literal and .* patterns are supported for eq/ne"));
            }
            terms.push(Term { path: field.split('.').map(str::to_string).collect(), op, value });
            i += used;
        }
        Ok(Filter(terms))
    }

    pub fn matches(&self, resource: &Value) -> bool {
        self.0.iter().all(|t| t.matches(resource))
    }
}

impl Term {
    fn matches(&self, r: &Value) -> bool {
        let mut v = r;
        for p in &self.path {
            match v.get(p) {
                Some(x) => v = x,
                None => return matches!(self.op, Op::Ne | Op::NotRe),
            }
        }
        let s = match v {
            Value::String(s) => s.clone(),
            Value::Null => return matches!(self.op, Op::Ne | Op::NotRe),
            other => other.to_string(),
        };
        match self.op {
            Op::Has if self.value == "*" => true,
            Op::Eq | Op::Has => glob(&self.value, &s, '*'),
            Op::Ne => !glob(&self.value, &s, '*'),
            Op::Re => glob(&self.value.replace(".*", "\u{0}"), &s, '\u{0}'),
            Op::NotRe => !glob(&self.value.replace(".*", "\u{0}"), &s, '\u{0}'),
        }
    }
}

/// Whether `s` matches `pattern` in full, `star` standing for any run of characters.
fn glob(pattern: &str, s: &str, star: char) -> bool {
    let parts: Vec<&str> = pattern.split(star).collect();
    if parts.len() == 1 {
        return pattern == s;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !s.starts_with(first) || !s[first.len()..].ends_with(last) || s.len() < first.len() + last.len() {
        return false;
    }
    let mut rest = &s[first.len()..s.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    true
}

fn tokenize(s: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                // A quoted value: up to the closing quote, kept as one token.
                let mut q = String::new();
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => q.extend(chars.next()),
                        Some(x) => q.push(x),
                        None => return Err("unterminated quote".into()),
                    }
                }
                cur.push_str(&q);
                if cur.is_empty() {
                    cur.push('\u{1}'); // an empty quoted value
                }
            }
            '(' | ')' | ' ' | '\t' => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            _ => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    Ok(out.into_iter().map(|t| t.replace('\u{1}', "")).collect())
}

/// A term from the tokens at its start: returns (field, op, value, tokens used).
fn split_term(t: &[String]) -> Option<(String, Op, String, usize)> {
    let word_op = |w: &str| match w {
        "=" => Some(Op::Eq),
        "!=" => Some(Op::Ne),
        ":" => Some(Op::Has),
        "eq" => Some(Op::Re),
        "ne" => Some(Op::NotRe),
        _ => None,
    };
    // FIELD OP VALUE as three tokens.
    if t.len() >= 3 {
        if let Some(op) = word_op(&t[1]) {
            return Some((t[0].clone(), op, t[2].clone(), 3));
        }
    }
    // FIELD!=VALUE, FIELD=VALUE, FIELD:VALUE in one token (or FIELD= VALUE / FIELD =VALUE).
    let first = &t[0];
    for (sym, op) in [("!=", Op::Ne), ("=", Op::Eq), (":", Op::Has)] {
        if let Some((f, v)) = first.split_once(sym) {
            if v.is_empty() && t.len() >= 2 && word_op(&t[1]).is_none() && t[1] != "AND" {
                return Some((f.to_string(), op, t[1].clone(), 2));
            }
            return Some((f.to_string(), op, v.to_string(), 1));
        }
    }
    if t.len() >= 2 {
        for (sym, op) in [("!=", Op::Ne), ("=", Op::Eq), (":", Op::Has)] {
            if let Some(v) = t[1].strip_prefix(sym) {
                return Some((first.clone(), op, v.to_string(), 2));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_filters_as_kops_and_protokube_send_them() {
        let disk = json!({"name": "a-etcd-main-k8s", "labels": {"k8s-io-cluster-name": "k8s-example-com", "k8s-io-role-master": "master"}});
        let yes = [
            "labels.k8s-io-cluster-name=k8s-example-com",
            "labels.k8s-io-cluster-name = k8s-example-com",
            "labels.k8s-io-role-master:*",
            "(labels.k8s-io-cluster-name = \"k8s-example-com\") AND (labels.k8s-io-role-master:*)",
            "labels.k8s-io-cluster-name=k8s-example-com AND labels.k8s-io-role-master:*",
            "labels.k8s-io-cluster-name eq k8s-.*",
            "name = \"a-etcd-*\"",
            "labels.other != x",
            "name ne b.*",
        ];
        for f in yes {
            assert!(Filter::parse(f).unwrap().matches(&disk), "{f}");
        }
        let no = [
            "labels.k8s-io-cluster-name=other",
            "labels.missing:*",
            "labels.k8s-io-cluster-name=k8s-example-com AND labels.missing:*",
            "labels.k8s-io-cluster-name eq k8s",
            "name != a-etcd-main-k8s",
        ];
        for f in no {
            assert!(!Filter::parse(f).unwrap().matches(&disk), "{f}");
        }
        assert!(Filter::parse("").unwrap().matches(&disk));
    }

    #[test]
    fn unsupported_filters_are_refused_not_ignored() {
        for f in ["labels.a=b OR labels.c=d", "name eq (a|b)", "justaword", "\"unterminated"] {
            assert_eq!(Filter::parse(f).unwrap_err().code, 400, "{f}");
        }
    }
}
