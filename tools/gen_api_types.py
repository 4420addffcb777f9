#!/usr/bin/env python3
"""Generate api/src/generated.rs: serde structs for the kOps v1alpha2 wire format.

The kOps v1alpha2 API is the file format Keelson reads (so existing kOps specs load).
This tool reads the *field names and types* (the format) from the Go type
declarations of a kOps checkout and writes Rust structs where every field is
optional, unknown fields are rejected, and a handful of fields use Keelson's
validated newtypes (CIDRs, versions, quantities, durations).

Every struct also gets an impl of `crate::merge::Merge` (field-by-field overlay: each field
merges with the Option/map/replace rules of api/src/merge.rs).

usage: gen_api_types.py KOPS_GIT_DIR > api/src/generated.rs
       gen_api_types.py --merge-impls api/src/generated.rs
         Re-emit only the Merge impls of an existing generated.rs (no kOps checkout needed): the
         structs are read back from the file and the impl section is rewritten with the same
         code main() uses, so the output equals a full run's.
"""
import re
import subprocess
import sys

FILES = ["cluster", "componentconfig", "containerdconfig", "networking", "topology",
         "instancegroup", "bastion", "dockerconfig", "ntpconfig"]
SKIP_TYPES = {"Cluster", "ClusterList", "InstanceGroup", "InstanceGroupList"}
RUST_KEYWORDS = {"type", "enum", "match", "mod", "ref", "self", "static", "struct", "trait",
                 "use", "where", "loop", "move", "box", "in", "fn", "impl", "let", "mut", "pub",
                 "crate", "super", "const", "dyn", "else", "extern", "false", "true", "for",
                 "if", "return", "unsafe", "while", "as", "break", "continue", "async", "await",
                 "abstract", "become", "do", "final", "macro", "override", "priv", "typeof",
                 "unsized", "virtual", "yield", "try"}
# Fields (json key) whose string value has a validated Keelson newtype.
CIDR_KEYS = {"networkCIDR", "nonMasqueradeCIDR", "serviceClusterIPRange", "podCIDR",
             "clusterCIDR", "serviceNodePortRange__no"}
SCALARS = {
    "string": "String", "bool": "bool",
    "int": "i64", "int16": "i64", "int32": "i64", "int64": "i64",
    "uint8": "u64", "uint32": "u64", "uint64": "u64", "float64": "f64", "float32": "f64",
    "resource.Quantity": "crate::types::Quantity",
    "metav1.Duration": "crate::types::Duration",
    "intstr.IntOrString": "crate::types::IntOrString",
    "metav1.Time": "String",
}


# Fields kOps' own v1alpha2 decoder accepts and drops (it is not strict), seen in real kOps
# specs. Keelson is strict, so it names them here: accepted, carried, and not acted on.
EXTRA_STRUCTS = {
    "ServiceOIDCProviderSpec": [("IssuerURL", "string", "issuerURL", ["Legacy OIDC issuer (removed from kOps; accepted and ignored)."]),
                                ("IssuerCAThumbprints", "[]string", "issuerCAThumbprints", [])],
    "InstanceRootVolumeSpec": [("Size", "*int32", "size", ["Root volume size in GiB (v1alpha3 layout; accepted and ignored in v1alpha2)."]),
                               ("Type", "*string", "type", []),
                               ("IOPS", "*int32", "iops", []),
                               ("VolumeIOPS", "*int32", "volumeIops", []),
                               ("Throughput", "*int32", "throughput", []),
                               ("VolumeThroughput", "*int32", "volumeThroughput", []),
                               ("Optimization", "*bool", "optimization", []),
                               ("Encryption", "*bool", "encryption", []),
                               ("EncryptionKey", "*string", "encryptionKey", [])],
}
EXTRA_FIELDS = {
    "ClusterSpec": [("ServiceOIDCProvider", "*ServiceOIDCProviderSpec", "serviceOIDCProvider", ["Legacy field kOps ignores; accepted so old specs load."])],
    "EtcdClusterSpec": [("VolumeIOPS", "*int32", "volumeIops", ["Cluster-level volume settings kOps ignores (they belong on etcdMembers); accepted so such specs load."]),
                        ("VolumeSize", "*int32", "volumeSize", []),
                        ("VolumeThroughput", "*int32", "volumeThroughput", []),
                        ("Type", "*string", "type", [])],
    "InstanceGroupSpec": [("RootVolume", "*InstanceRootVolumeSpec", "rootVolume", ["v1alpha3-style root volume block; accepted and ignored in v1alpha2 as kOps does."])],
}


def go_source(gitdir, name):
    return subprocess.check_output(
        ["git", "-C", gitdir, "show", "HEAD:pkg/apis/kops/v1alpha2/%s.go" % name], text=True)


def parse(src, structs, aliases):
    lines = src.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"^type (\w+) struct \{\s*$", line)
        a = re.match(r"^type (\w+) (string|int32|int|bool)\s*$", line)
        if a:
            aliases[a.group(1)] = SCALARS[a.group(2)]
        e = re.match(r"^type (\w+) struct\{\}\s*$", line)
        if e:
            structs[e.group(1)] = []
        if not m:
            i += 1
            continue
        name = m.group(1)
        fields, doc = [], []
        i += 1
        while not lines[i].startswith("}"):
            l = lines[i].strip()
            i += 1
            if l.startswith("//"):
                doc.append(l[2:].strip())
                continue
            f = re.match(r'^(\w+)\s+([\w\.\*\[\]]+)\s+`json:"([^"]*)"', l)
            if not f:
                doc = []
                continue
            key = f.group(3).split(",")[0]
            if key in ("", "-"):
                doc = []
                continue
            fields.append((f.group(1), f.group(2), key, doc))
            doc = []
        structs[name] = fields
        i += 1


def rust_type(t, structs, aliases):
    t = t.lstrip("*")
    if t.startswith("[]"):
        return "Vec<%s>" % rust_type(t[2:], structs, aliases)
    m = re.match(r"map\[string\](.+)", t)
    if m:
        return "BTreeMap<String, %s>" % rust_type(m.group(1), structs, aliases)
    if t in SCALARS:
        return SCALARS[t]
    if t in aliases:
        return aliases[t]
    if t in structs:
        return t
    # Kubernetes core types (tolerations, affinity, env vars): kept as free-form documents.
    return "serde_json::Value"


def snake(key):
    key = re.sub(r"([A-Z]{2,})s(?=[A-Z]|$)", lambda m: m.group(1).capitalize() + "s", key)
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", key)
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", s).lower()
    s = re.sub(r"[^a-z0-9_]", "_", s)
    if s in RUST_KEYWORDS:
        s += "_"
    return s


HEADER = ["// @generated by tools/gen_api_types.py from the kOps v1alpha2 wire format.",
          "// Every field is optional so a document round-trips exactly as written;",
          "// unknown fields are rejected. Do not edit by hand: change the generator.",
          "#![allow(clippy::all, missing_docs)]",
          "use std::collections::BTreeMap;",
          "use serde::{Deserialize, Serialize};",
          "use crate::merge::Merge;", ""]
MERGE_MARKER = "// ---- Merge: field-by-field overlay (crate::merge) ----"


def merge_impls(structs):
    """The Merge impls of `structs`, a list of (rust struct name, [rust field name]) in file order."""
    out = [MERGE_MARKER, ""]
    for name, fields in structs:
        out.append("impl Merge for %s {" % name)
        if not fields:
            out.append("    fn merge_from(&mut self, _top: &Self) {}")
        else:
            out.append("    fn merge_from(&mut self, top: &Self) {")
            for f in fields:
                out.append("        self.%s.merge_from(&top.%s);" % (f, f))
            out.append("    }")
        out.append("}")
        out.append("")
    return out


def regen_merge_impls(path):
    """Rewrite the Merge section of an existing generated.rs from the structs it declares."""
    text = open(path).read()
    body = text.split("\n" + MERGE_MARKER + "\n")[0].rstrip("\n") + "\n"
    lines = body.split("\n")
    if "use crate::merge::Merge;" not in lines:
        at = lines.index("use serde::{Deserialize, Serialize};") + 1
        lines.insert(at, "use crate::merge::Merge;")
    structs = []
    for i, line in enumerate(lines):
        m = re.match(r"^pub struct (\w+) \{$", line)
        if not m:
            continue
        fields = []
        for l in lines[i + 1:]:
            if l == "}":
                break
            f = re.match(r"^    pub (\w+): ", l)
            if f:
                fields.append(f.group(1))
        structs.append((m.group(1), fields))
    out = lines + merge_impls(structs)
    with open(path, "w") as fh:
        fh.write("\n".join(out) + "\n")


def main():
    if sys.argv[1] == "--merge-impls":
        regen_merge_impls(sys.argv[2])
        return
    gitdir = sys.argv[1]
    structs, aliases = {}, {}
    for f in FILES:
        parse(go_source(gitdir, f), structs, aliases)
    structs.update(EXTRA_STRUCTS)
    for name, fields in EXTRA_FIELDS.items():
        structs[name] = structs[name] + fields
    out = list(HEADER)
    emitted = []
    for name in sorted(structs):
        if name in SKIP_TYPES:
            continue
        out.append("#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]")
        out.append("#[serde(deny_unknown_fields)]")
        out.append("pub struct %s {" % name)
        seen = set()
        fnames = []
        for gname, gtype, key, doc in structs[name]:
            fname = snake(key)
            if fname in seen:
                fname = snake(gname)
            seen.add(fname)
            rt = rust_type(gtype, structs, aliases)
            if key in CIDR_KEYS and rt == "String":
                rt = "crate::types::Cidr"
            if key == "kubernetesVersion" and rt == "String":
                rt = "crate::types::KubernetesVersion"
            for d in doc[:3]:
                out.append("    /// %s" % d.replace("*/", "* /"))
            out.append('    #[serde(rename = "%s", default, skip_serializing_if = "Option::is_none")]' % key)
            out.append("    pub %s: Option<%s>," % (fname, rt))
            fnames.append(fname)
        out.append("}")
        out.append("")
        emitted.append((name, fnames))
    out.extend(merge_impls(emitted))
    print("\n".join(out))


if __name__ == "__main__":
    main()
