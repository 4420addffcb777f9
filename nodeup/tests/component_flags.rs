//! The control-plane components' last mile, the way `render.rs` checks the kubelet's: every field of
//! kube-apiserver's, kube-controller-manager's, kube-scheduler's and kube-proxy's spec that has a
//! flag in kOps' `flag:` tags (`keelson_api::flag_table`, which `keelson_api::support` counts as
//! consumed), set to a non-default value in the NodeupConfig, appears as that flag in the static
//! pod `nodeup render` writes. So do kube-apiserver's OIDC settings and env, and every resource
//! request and limit.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::*;
use keelson_api::flags::{FlagKind, FlagSpec};
use keelson_api::support::{self, Use, FLAG_TABLES};
use keelson_api::{KubeAPIServerConfig, KubeControllerManagerConfig, KubeProxyConfig, KubeSchedulerConfig};
use serde::de::DeserializeOwned;
use serde_json::{json, Map, Value};

/// (NodeupConfig path of the spec, api type, static pod).
const COMPONENTS: &[(&[&str], &str, &str)] = &[
    (&["APIServerConfig", "KubeAPIServer"], "KubeAPIServerConfig", "kube-apiserver"),
    (&["ControlPlaneConfig", "KubeControllerManager"], "KubeControllerManagerConfig", "kube-controller-manager"),
    (&["ControlPlaneConfig", "KubeScheduler"], "KubeSchedulerConfig", "kube-scheduler"),
    (&["KubeProxy"], "KubeProxyConfig", "kube-proxy"),
];

/// Values to try for a field, first to last, with the flag value each renders to: the first one
/// the api type accepts is used (a `Str` flag may be a CIDR or an address in the type).
fn candidates(spec: &FlagSpec, n: usize) -> Vec<(Value, Vec<String>)> {
    let not_empty = |s: &str| spec.empty != Some(s);
    match spec.kind {
        FlagKind::Str => vec![
            (json!(format!("x{n}-{}", spec.flag)), vec![format!("x{n}-{}", spec.flag)]),
            (json!(format!("10.{n}.0.0/16")), vec![format!("10.{n}.0.0/16")]),
            (json!(format!("10.{n}.0.1")), vec![format!("10.{n}.0.1")]),
        ],
        FlagKind::Bool => {
            let b = if not_empty("true") { "true" } else { "false" };
            vec![(json!(b == "true"), vec![b.to_string()])]
        }
        FlagKind::Int => vec![(json!(n as i64 + 3), vec![(n + 3).to_string()])],
        FlagKind::Float => vec![(json!(2.5), vec!["2.5".into()])],
        FlagKind::Duration => vec![(json!(format!("{}s", n % 50 + 3)), vec![format!("{}s", n % 50 + 3)])],
        FlagKind::Quantity => vec![(json!(format!("{}", n + 3)), vec![format!("{}", n + 3)])],
        FlagKind::StrList => {
            let items = vec![format!("a{n}-{}", spec.flag), format!("b{n}")];
            let rendered = if spec.repeat { items.clone() } else { vec![items.join(",")] };
            vec![
                (json!(items), rendered),
                (json!([format!("10.{n}.0.0/16")]), vec![format!("10.{n}.0.0/16")]),
                (json!([format!("https://x{n}.example.com")]), vec![format!("https://x{n}.example.com")]),
            ]
        }
        FlagKind::StrMap => vec![(json!({format!("k{n}"): "v"}), vec![format!("k{n}=v")])],
        FlagKind::Nested(_) => Vec::new(),
    }
}

/// Whether `T` accepts `{path…: value}`.
fn accepts<T: DeserializeOwned>(path: &[&str], value: &Value) -> bool {
    let doc = path.iter().rev().fold(value.clone(), |inner, key| Value::Object(Map::from_iter([(key.to_string(), inner)])));
    serde_json::from_value::<T>(doc).is_ok()
}

fn accepts_for(ty: &str, path: &[&str], value: &Value) -> bool {
    match ty {
        "KubeAPIServerConfig" => accepts::<KubeAPIServerConfig>(path, value),
        "KubeControllerManagerConfig" => accepts::<KubeControllerManagerConfig>(path, value),
        "KubeSchedulerConfig" => accepts::<KubeSchedulerConfig>(path, value),
        "KubeProxyConfig" => accepts::<KubeProxyConfig>(path, value),
        other => panic!("no api type {other}"),
    }
}

/// One field to set: (api type, json path in the spec, value, the `--flag=value` strings expected).
struct Case {
    ty: &'static str,
    path: Vec<&'static str>,
    value: Value,
    want: Vec<String>,
}

/// Every flag-tagged field of `table` (nested tables inside their field) that the support table
/// does not refuse.
fn cases(ty: &'static str, table: &'static [FlagSpec], outer: &[&'static str], out: &mut Vec<Case>) {
    for spec in table {
        let mut path = outer.to_vec();
        path.push(spec.key);
        if let FlagKind::Nested(inner) = spec.kind {
            cases(ty, inner, &path, out);
            continue;
        }
        let owner = if outer.is_empty() { ty } else { "LeaderElectionConfiguration" };
        match support::classify(owner, spec.key) {
            Some(Use::ComponentFlag { flag, .. }) => assert_eq!(flag, spec.flag),
            Some(Use::Refused(_)) => continue,
            other => panic!("{owner}.{}: classified {other:?}, not as its flag --{}", spec.key, spec.flag),
        }
        let n = out.len();
        let Some((value, rendered)) = candidates(spec, n).into_iter().find(|(v, _)| accepts_for(ty, &path, v)) else {
            panic!("{ty}.{}: no sample value the api type accepts", path.join("."));
        };
        let want = rendered.into_iter().map(|v| format!("--{}={v}", spec.flag)).collect();
        out.push(Case { ty, path, value, want });
    }
}

/// kube-apiserver's fields without a `flag:` tag in v1alpha2 that nodeup renders as flags anyway
/// (kOps moves them to `authentication.oidc`): (json key, value, expected flags).
const OIDC: &[(&str, &str, &[&str])] = &[
    ("oidcUsernameClaim", "\"email\"", &["--oidc-username-claim=email"]),
    ("oidcUsernamePrefix", "\"oidc:\"", &["--oidc-username-prefix=oidc:"]),
    ("oidcGroupsClaim", "\"groups\"", &["--oidc-groups-claim=groups"]),
    ("oidcGroupsPrefix", "\"oidcg:\"", &["--oidc-groups-prefix=oidcg:"]),
    ("oidcIssuerURL", "\"https://issuer.example.com\"", &["--oidc-issuer-url=https://issuer.example.com"]),
    ("oidcClientID", "\"kubernetes\"", &["--oidc-client-id=kubernetes"]),
    ("oidcRequiredClaim", "[\"hd=example.com\", \"org=x\"]", &["--oidc-required-claim=hd=example.com", "--oidc-required-claim=org=x"]),
];

/// Flags nodeup sets itself whatever the spec says (the file it writes is the one the flag must
/// name): (type, json key, why).
const OWNED_BY_NODEUP: &[(&str, &str, &str)] =
    &[("KubeAPIServerConfig", "etcdCaFile", "nodeup writes the etcd CA to /srv/kubernetes/kube-apiserver/etcd-ca.crt")];

fn set(doc: &mut serde_yaml_ng::Value, path: &[&str], value: &Value) {
    let mut here = doc;
    for key in &path[..path.len() - 1] {
        let map = here.as_mapping_mut().expect("mapping");
        here = map.entry(serde_yaml_ng::Value::from(*key)).or_insert_with(|| serde_yaml_ng::Value::Mapping(Default::default()));
    }
    let v: serde_yaml_ng::Value = serde_json::from_value(value.clone()).expect("value");
    here.as_mapping_mut().expect("mapping").insert(serde_yaml_ng::Value::from(path[path.len() - 1]), v);
}

/// The container command, resources and env of a rendered static pod.
fn pod(dir: &Path, name: &str) -> (BTreeSet<String>, serde_yaml_ng::Value, Value) {
    let path = dir.join(format!("etc/kubernetes/manifests/{name}.manifest"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let pod: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("manifest yaml");
    let container = &pod["spec"]["containers"][0];
    let command = container["command"].as_sequence().expect("command").iter().filter_map(|a| a.as_str().map(str::to_string)).collect();
    let env = serde_json::to_value(&container["env"]).expect("env");
    (command, container["resources"].clone(), env)
}

#[test]
fn every_flag_tagged_component_field_reaches_its_static_pod() {
    let mut all = Vec::new();
    for (ty, _, table) in FLAG_TABLES.iter().filter(|(ty, _, _)| *ty != "LeaderElectionConfiguration") {
        cases(ty, table, &[], &mut all);
    }
    assert!(all.len() > 150, "only {} flag-tagged fields found", all.len());
    for (key, value, want) in OIDC {
        assert!(matches!(support::classify("KubeAPIServerConfig", key), Some(Use::By(_))), "{key}");
        let value: Value = serde_json::from_str(value).expect("json");
        all.push(Case { ty: "KubeAPIServerConfig", path: vec![*key], value, want: want.iter().map(|w| w.to_string()).collect() });
    }
    // Every kube-apiserver field consumed as an --oidc-* flag is checked here.
    for f in support::all().filter(|f| f.ty == "KubeAPIServerConfig" && matches!(f.used, Use::By(w) if w.contains("--oidc"))) {
        assert!(OIDC.iter().any(|(k, _, _)| *k == f.key), "{}: not checked", f.key);
    }
    all.push(Case { ty: "KubeAPIServerConfig", path: vec!["env"], value: json!([{"name": "GOMEMLIMIT", "value": "1GiB"}]), want: Vec::new() });
    let resources = ["cpuRequest", "memoryRequest", "cpuLimit", "memoryLimit"];
    let edit = {
        let cases: Vec<(String, Vec<String>, Value)> =
            all.iter().map(|c| (c.ty.to_string(), c.path.iter().map(|s| s.to_string()).collect(), c.value.clone())).collect();
        move |text: String| {
            let mut doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("fixture yaml");
            for (ty, path, value) in &cases {
                let (at, _, _) = COMPONENTS.iter().find(|(_, t, _)| t == ty).expect("component");
                let full: Vec<&str> = at.iter().copied().chain(path.iter().map(String::as_str)).collect();
                set(&mut doc, &full, value);
            }
            for (i, (at, _, _)) in COMPONENTS.iter().enumerate() {
                for (j, key) in resources.iter().enumerate() {
                    let full: Vec<&str> = at.iter().copied().chain([*key]).collect();
                    let q = if key.starts_with("cpu") { format!("{}m", 100 + 10 * i + j) } else { format!("{}Mi", 100 + 10 * i + j) };
                    set(&mut doc, &full, &json!(q));
                }
            }
            serde_yaml_ng::to_string(&doc).expect("yaml")
        }
    };
    let s = Scenario::edited(Group::ControlPlane, 64, |m, a| vec![m.url(&a.path)], edit);
    let out = tempfile::tempdir().expect("out");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_nodeup"))
        .args(["render", "--conf"])
        .arg(&s.boot)
        .arg("--out")
        .arg(out.path())
        .args(["--hostname", "ip-172-20-33-10.eu-west-1.compute.internal", "--internal-ip", "172.20.33.10", "--arch", "amd64"])
        .args(["--instance-id", "i-0a1b2c3d4e5f60718", "--zone", "eu-west-1a"])
        .env("NODEUP_LOG", "warn")
        .output()
        .expect("run nodeup render");
    assert_ok(&o);

    let mut lost = Vec::new();
    for (i, (_, ty, name)) in COMPONENTS.iter().enumerate() {
        let (command, res, env) = pod(out.path(), name);
        if *name == "kube-apiserver" {
            assert_eq!(env, json!([{"name": "GOMEMLIMIT", "value": "1GiB"}]), "kube-apiserver's env");
        }
        for c in all.iter().filter(|c| c.ty == *ty) {
            if OWNED_BY_NODEUP.iter().any(|(t, k, _)| t == ty && c.path == [*k]) {
                continue;
            }
            for want in &c.want {
                if !command.contains(want) {
                    let have: Vec<&String> = command.iter().filter(|a| a.starts_with(&format!("{}=", want.split('=').next().unwrap_or_default()))).collect();
                    lost.push(format!("{name}: {} = {}: {want} missing (has {have:?})", c.path.join("."), c.value));
                }
            }
        }
        for (j, key) in resources.iter().enumerate() {
            let (section, resource) = match *key {
                "cpuRequest" => ("requests", "cpu"),
                "memoryRequest" => ("requests", "memory"),
                "cpuLimit" => ("limits", "cpu"),
                _ => ("limits", "memory"),
            };
            let want = if resource == "cpu" { format!("{}m", 100 + 10 * i + j) } else { format!("{}Mi", 100 + 10 * i + j) };
            if res[section][resource].as_str() != Some(want.as_str()) {
                lost.push(format!("{name}: {key} = {want}: resources.{section}.{resource} is {:?}", res[section][resource]));
            }
        }
    }
    assert!(lost.is_empty(), "{} component settings lost on the way to their static pods:\n{}", lost.len(), lost.join("\n"));
}
