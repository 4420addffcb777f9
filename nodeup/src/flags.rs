//! Component command-line flags from the completed spec, the way kOps' flag builder renders
//! them: every field that has a flag name (table generated from kOps' struct tags in
//! [`keelson_api::flag_table`]) becomes `--name=value`; lists join with commas (or repeat), maps
//! become sorted `k=v` lists, quantities are plain decimals, and the result is sorted.

use serde_json::Value;

pub use keelson_api::flags::{FlagKind, FlagSpec};

/// Build the sorted flag list of a serialisable component config.
pub fn build<T: serde::Serialize>(config: &T, table: &[FlagSpec]) -> Vec<String> {
    let value = serde_json::to_value(config).unwrap_or(Value::Null);
    let mut flags = Vec::new();
    collect(&value, table, &mut flags);
    flags.sort();
    flags
}

fn collect(value: &Value, table: &[FlagSpec], out: &mut Vec<String>) {
    for spec in table {
        let v = value.get(spec.key);
        if let FlagKind::Nested(inner) = spec.kind {
            if let Some(v) = v {
                collect(v, inner, out);
            }
            continue;
        }
        let v = match v {
            Some(Value::Null) | None if spec.pointer => continue,
            Some(Value::Null) | None => zero(spec.kind),
            Some(v) => v.clone(),
        };
        let name = spec.flag;
        let not_empty = |s: &str| spec.empty != Some(s);
        match spec.kind {
            FlagKind::Str => {
                let s = scalar(&v);
                if (spec.include_empty && spec.pointer) || (!s.is_empty() && not_empty(&s)) {
                    out.push(format!("--{name}={s}"));
                }
            }
            FlagKind::Bool | FlagKind::Int | FlagKind::Float | FlagKind::Duration => {
                let mut s = scalar(&v);
                if matches!(spec.kind, FlagKind::Duration) && s == "0" {
                    s = "0s".into();
                }
                if not_empty(&s) {
                    out.push(format!("--{name}={s}"));
                }
            }
            FlagKind::Quantity => {
                let s = quantity_decimal(&scalar(&v));
                if not_empty(&s) {
                    out.push(format!("--{name}={s}"));
                }
            }
            FlagKind::StrList => {
                let items: Vec<String> = v.as_array().map(|a| a.iter().map(scalar).collect()).unwrap_or_default();
                if items.is_empty() {
                    continue;
                }
                if spec.repeat {
                    out.extend(items.iter().map(|i| format!("--{name}={i}")));
                } else {
                    out.push(format!("--{name}={}", items.join(",")));
                }
            }
            FlagKind::StrMap => {
                let mut items: Vec<String> = v.as_object().map(|m| m.iter().map(|(k, v)| format!("{k}={}", scalar(v))).collect()).unwrap_or_default();
                items.sort();
                if !items.is_empty() {
                    out.push(format!("--{name}={}", items.join(",")));
                }
            }
            FlagKind::Nested(_) => {}
        }
    }
}

/// kube-apiserver's OIDC flags from the v1alpha2 `oidc*` fields (kOps moves them to
/// `authentication.oidc` and renders the same flags; they carry no `flag:` tag in v1alpha2).
pub fn oidc(api: &keelson_api::KubeAPIServerConfig) -> Vec<String> {
    let mut flags: Vec<String> = [
        ("oidc-client-id", &api.oidc_client_id),
        ("oidc-groups-claim", &api.oidc_groups_claim),
        ("oidc-groups-prefix", &api.oidc_groups_prefix),
        ("oidc-issuer-url", &api.oidc_issuer_url),
        ("oidc-username-claim", &api.oidc_username_claim),
        ("oidc-username-prefix", &api.oidc_username_prefix),
    ]
    .into_iter()
    .filter_map(|(flag, v)| v.as_ref().map(|v| format!("--{flag}={v}")))
    .collect();
    // A `key=value` pair per claim: the flag repeats.
    flags.extend(api.oidc_required_claim.iter().flatten().map(|c| format!("--oidc-required-claim={c}")));
    flags
}

fn zero(kind: FlagKind) -> Value {
    match kind {
        FlagKind::Bool => Value::Bool(false),
        FlagKind::Int | FlagKind::Float => Value::from(0),
        FlagKind::Duration => Value::String("0s".into()),
        FlagKind::Quantity => Value::String("0".into()),
        _ => Value::String(String::new()),
    }
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// A Kubernetes quantity as a plain decimal (`100Mi` → `104857600`, `500m` → `0.5`).
pub fn quantity_decimal(q: &str) -> String {
    let q = q.trim();
    let split = q.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let mult: Option<(u128, u32)> = match suffix {
        "" => Some((1, 0)),
        "Ki" => Some((1 << 10, 0)),
        "Mi" => Some((1 << 20, 0)),
        "Gi" => Some((1 << 30, 0)),
        "Ti" => Some((1 << 40, 0)),
        "Pi" => Some((1 << 50, 0)),
        "Ei" => Some((1 << 60, 0)),
        "k" => Some((1_000, 0)),
        "M" => Some((1_000_000, 0)),
        "G" => Some((1_000_000_000, 0)),
        "T" => Some((1_000_000_000_000, 0)),
        "P" => Some((1_000_000_000_000_000, 0)),
        "E" => Some((1_000_000_000_000_000_000, 0)),
        "m" => Some((1, 3)),
        _ => None,
    };
    let Some((mult, scale)) = mult else { return q.to_string() };
    // Fixed-point: integer part and fraction digits of `num`.
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    let (Ok(int_v), true) = (int.parse::<u128>(), frac.chars().all(|c| c.is_ascii_digit())) else { return q.to_string() };
    let frac_digits = frac.len() as u32;
    let frac_v: u128 = if frac.is_empty() { 0 } else { frac.parse().unwrap_or(0) };
    let total_scale = scale + frac_digits;
    let value = (int_v * 10u128.pow(frac_digits) + frac_v) * mult; // scaled by 10^total_scale
    let div = 10u128.pow(total_scale);
    let (whole, rem) = (value / div, value % div);
    if rem == 0 {
        whole.to_string()
    } else {
        let digits = format!("{:0width$}", rem, width = total_scale as usize);
        format!("{whole}.{}", digits.trim_end_matches('0'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flag_table::*;
    use keelson_api::{KubeAPIServerConfig, KubeControllerManagerConfig};

    #[test]
    fn quantities() {
        for (q, d) in [("100Mi", "104857600"), ("500m", "0.5"), ("2", "2"), ("1.5k", "1500"), ("1Ki", "1024"), ("0.25", "0.25")] {
            assert_eq!(quantity_decimal(q), d, "{q}");
        }
    }

    #[test]
    fn apiserver_flags_like_kops() {
        let cfg: KubeAPIServerConfig = serde_yaml_ng::from_str(
            "allowPrivileged: true\nsecurePort: 443\nlogLevel: 2\nenableAdmissionPlugins: [NodeRestriction, ServiceAccount]\n\
             etcdServers: [https://127.0.0.1:4001]\nrequestheaderAllowedNames: [aggregator]\nanonymousAuth: false\n",
        )
        .expect("yaml");
        let flags = build(&cfg, KUBE_APISERVER_CONFIG);
        for want in [
            "--allow-privileged=true",
            "--secure-port=443",
            "--v=2",
            "--enable-admission-plugins=NodeRestriction,ServiceAccount",
            "--etcd-servers=https://127.0.0.1:4001",
            "--requestheader-allowed-names=aggregator",
            "--anonymous-auth=false",
        ] {
            assert!(flags.contains(&want.to_string()), "{want} missing from {flags:?}");
        }
        let mut sorted = flags.clone();
        sorted.sort();
        assert_eq!(flags, sorted);
    }

    #[test]
    fn nested_leader_election() {
        let cfg: KubeControllerManagerConfig =
            serde_yaml_ng::from_str("leaderElection:\n  leaderElect: true\nlogLevel: 2\nattachDetachReconcileSyncPeriod: 1m0s\n").expect("yaml");
        let flags = build(&cfg, KUBE_CONTROLLER_MANAGER_CONFIG);
        assert!(flags.contains(&"--leader-elect=true".to_string()), "{flags:?}");
        assert!(flags.contains(&"--attach-detach-reconcile-sync-period=1m0s".to_string()), "{flags:?}");
    }
}
