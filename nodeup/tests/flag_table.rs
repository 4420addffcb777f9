//! Every key of the generated flag tables (`api/src/flag_table.rs`) is a field of the api type the table
//! is applied to: `flags::build` looks keys up in the serialised config, so a key the type does not
//! have silently drops the setting.
//!
//! The api structs reject unknown fields, so deserialising `{"<key>": null}` (nested tables:
//! `{"<outer>": {"<key>": null}}`) into the type fails with "unknown field" exactly when the key is
//! not a field; any other outcome (success for an optional field, a type error otherwise) means it is.

use keelson_api::{KubeAPIServerConfig, KubeControllerManagerConfig, KubeProxyConfig, KubeSchedulerConfig, KubeletConfigSpec};
use nodeup::flag_table::*;
use nodeup::flags::{FlagKind, FlagSpec};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// `{"a": {"b": {"key": null}}}` for the path `[a, b, key]`.
fn document(path: &[&str]) -> Value {
    path.iter().rev().fold(Value::Null, |inner, key| Value::Object(Map::from_iter([(key.to_string(), inner)])))
}

/// Whether deserialising failed because of a field the type does not have (rather than the
/// value's type, e.g. `null` for a non-optional field).
fn is_unknown_field(e: &serde_json::Error) -> bool {
    e.to_string().starts_with("unknown field")
}

/// Keys of `table` (and of its nested tables, inside their field) that `T` does not have.
fn unknown_keys<T: DeserializeOwned>(table_name: &str, type_name: &str, table: &[FlagSpec], outer: &[&str]) -> Vec<String> {
    let mut bad = Vec::new();
    for spec in table {
        let mut path = outer.to_vec();
        path.push(spec.key);
        let shown = path.join(".");
        if let Err(e) = serde_json::from_value::<T>(document(&path)) {
            if is_unknown_field(&e) {
                bad.push(format!("{table_name}: key {shown:?} (flag --{}) is not a field of {type_name}: {e}", spec.flag));
                continue;
            }
        }
        if let FlagKind::Nested(inner) = spec.kind {
            bad.extend(unknown_keys::<T>(table_name, type_name, inner, &path));
        }
    }
    bad
}

fn check<T: DeserializeOwned>(table_name: &str, type_name: &str, table: &[FlagSpec]) -> Vec<String> {
    assert!(!table.is_empty(), "{table_name} is empty");
    unknown_keys::<T>(table_name, type_name, table, &[])
}

/// The tables and the api types `flags::build` applies them to (render/kubelet.rs `sysconfig`,
/// model.rs component manifests). Nested tables are checked inside the field that holds them.
#[test]
fn every_flag_table_key_is_a_field_of_its_api_type() {
    let mut bad = Vec::new();
    bad.extend(check::<KubeletConfigSpec>("KUBELET_CONFIG_SPEC", "KubeletConfigSpec", KUBELET_CONFIG_SPEC));
    bad.extend(check::<KubeProxyConfig>("KUBE_PROXY_CONFIG", "KubeProxyConfig", KUBE_PROXY_CONFIG));
    bad.extend(check::<KubeAPIServerConfig>("KUBE_APISERVER_CONFIG", "KubeAPIServerConfig", KUBE_APISERVER_CONFIG));
    bad.extend(check::<KubeControllerManagerConfig>("KUBE_CONTROLLER_MANAGER_CONFIG", "KubeControllerManagerConfig", KUBE_CONTROLLER_MANAGER_CONFIG));
    bad.extend(check::<KubeSchedulerConfig>("KUBE_SCHEDULER_CONFIG", "KubeSchedulerConfig", KUBE_SCHEDULER_CONFIG));
    assert!(bad.is_empty(), "flag table keys that are not api fields:\n{}", bad.join("\n"));
}

/// Every table in `flag_table.rs` is checked above, directly or as a nested table.
#[test]
fn every_flag_table_is_paired_with_an_api_type() {
    const CHECKED: &[&str] = &[
        "KUBELET_CONFIG_SPEC",
        "KUBE_PROXY_CONFIG",
        "KUBE_APISERVER_CONFIG",
        "KUBE_CONTROLLER_MANAGER_CONFIG",
        "KUBE_SCHEDULER_CONFIG",
        // Nested: `leaderElection` of the controller-manager and scheduler configs.
        "LEADER_ELECTION_CONFIGURATION",
    ];
    let source = include_str!("../../api/src/flag_table.rs");
    let tables: Vec<&str> = source.lines().filter_map(|l| l.strip_prefix("pub static ")).filter_map(|l| l.split(':').next()).collect();
    assert!(!tables.is_empty(), "no tables found in flag_table.rs");
    for t in &tables {
        assert!(CHECKED.contains(t), "flag table {t} is not paired with an api type in this test");
    }
}

/// The check itself can fail: a misspelt key, top-level or nested, is reported by table and key.
#[test]
fn a_key_that_is_not_a_field_is_reported() {
    let spec = |key: &'static str, kind: FlagKind| FlagSpec { key, flag: "x", repeat: false, empty: None, include_empty: false, pointer: true, kind };
    let nested: &'static [FlagSpec] = Box::leak(Box::new([spec("leaderElect", FlagKind::Bool), spec("leaderElekt", FlagKind::Bool)]));
    let table = [spec("logLevel", FlagKind::Int), spec("securePort", FlagKind::Int), spec("leaderElection", FlagKind::Nested(nested))];
    let bad = check::<KubeSchedulerConfig>("T", "KubeSchedulerConfig", &table);
    assert_eq!(bad.len(), 2, "{bad:#?}");
    assert!(bad[0].starts_with("T: key \"securePort\""), "{}", bad[0]);
    assert!(bad[1].starts_with("T: key \"leaderElection.leaderElekt\""), "{}", bad[1]);
}

/// A type error on a known field is not mistaken for an unknown field.
#[test]
fn type_errors_are_not_unknown_fields() {
    let err = |v: Value| serde_json::from_value::<KubeSchedulerConfig>(v).expect_err("must fail");
    assert!(!is_unknown_field(&err(serde_json::json!({"logLevel": "not a number"}))));
    assert!(!is_unknown_field(&err(serde_json::json!({"leaderElection": {"leaderElect": []}}))));
    assert!(is_unknown_field(&err(serde_json::json!({"logLevl": null}))));
}
