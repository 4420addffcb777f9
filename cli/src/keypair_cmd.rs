//! CA rotation, kOps' commands (`docs/operations/rotate-secrets.md` there, `docs/operations.md`
//! here): `keelson create keypair kubernetes-ca -f SPEC [--primary]`, `keelson promote keypair
//! kubernetes-ca -f SPEC [ID]`, `keelson distrust keypair kubernetes-ca -f SPEC [ID…]` and `keelson
//! get keypairs -f SPEC [KEYSET…]`. Each change rewrites the keyset's private half, then its issued
//! half, under the state-store lock; `keelson apply` then pins the new trust into the
//! NodeupConfigs and `keelson rolling-update cluster` rolls it out. The rules are
//! [`base::keyset`]'s; this is the I/O around them.

use std::process::ExitCode;

use anyhow::Context as _;
use base::keyset::{Keyset, KeysetKey};
use base::StateStore;

use crate::commands::{aws_target, load, open_store, runtime, with_lock, Common};
use crate::prepare::prepare_with;
use crate::table::Output;

/// The keysets whose keys can be rotated: the cluster CA. The others are refused by name (the etcd
/// CAs and the aggregator CA are rotated by replacing the control planes' certificates, which
/// Keelson does not do yet; the service-account key needs its own overlap of token issuers).
pub const ROTATABLE: &[&str] = &["kubernetes-ca"];

#[derive(Debug, clap::Args)]
pub struct CreateKeypairArgs {
    #[command(flatten)]
    pub common: Common,
    /// The keyset to add a new key to (`kubernetes-ca`).
    pub keyset: String,
    /// Make the new key the primary at once (kOps' `--primary`): only for a cluster that does not
    /// run yet, since hosts that do not trust the new key yet refuse what it signs.
    #[arg(long)]
    pub primary: bool,
    /// Import this CA certificate (PEM) instead of creating a key (kOps' `--cert`; needs `--key`).
    #[arg(long, requires = "key")]
    pub cert: Option<std::path::PathBuf>,
    /// The imported certificate's private key (PEM; kOps' `--key`).
    #[arg(long, requires = "cert")]
    pub key: Option<std::path::PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct PromoteKeypairArgs {
    #[command(flatten)]
    pub common: Common,
    /// The keyset (`kubernetes-ca`).
    pub keyset: String,
    /// The key to make the primary (default: the newest trusted key).
    pub id: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct DistrustKeypairArgs {
    #[command(flatten)]
    pub common: Common,
    /// The keyset (`kubernetes-ca`).
    pub keyset: String,
    /// The keys to distrust (default: every trusted key older than the primary).
    pub ids: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct GetKeypairsArgs {
    #[command(flatten)]
    pub common: Common,
    /// The keysets to list (default: every keyset in the state store).
    pub keysets: Vec<String>,
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    pub output: Output,
}

/// One change to a keyset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A new key, or the one imported from `import` (certificate, key; PEM files).
    Create {
        primary: bool,
        import: Option<(std::path::PathBuf, std::path::PathBuf)>,
    },
    Promote {
        id: Option<String>,
    },
    Distrust {
        ids: Vec<String>,
    },
}

/// Refuse a keyset that cannot be rotated, naming the ones that can.
pub fn check_rotatable(keyset: &str) -> anyhow::Result<()> {
    if ROTATABLE.contains(&keyset) {
        return Ok(());
    }
    anyhow::bail!("keyset {keyset:?}: Keelson rotates only {} (kOps' `all` and the other keysets are not supported)", ROTATABLE.join(", "))
}

/// Apply `change` to `keyset`; `new_key` makes the key a `Create` adds, `now` is the RFC 3339
/// distrust time. Returns what to tell the user.
pub fn apply_change(keyset: &mut Keyset, change: &Change, new_key: impl FnOnce() -> anyhow::Result<KeysetKey>, now: &str) -> anyhow::Result<String> {
    let name = keyset.name.clone();
    Ok(match change {
        Change::Create { primary, .. } => {
            let key = new_key()?;
            let id = key.id.clone();
            keyset.add(key, *primary)?;
            if *primary {
                format!("{name}: created key {id}, the primary now")
            } else {
                format!("{name}: created key {id} (trusted, not the primary: apply and roll, then `keelson promote keypair {name}`)")
            }
        }
        Change::Promote { id } => {
            let id = keyset.promote(id.as_deref())?;
            format!("{name}: key {id} is the primary (apply and roll, then `keelson distrust keypair {name}`)")
        }
        Change::Distrust { ids } => {
            let done = keyset.distrust(ids, now)?;
            format!("{name}: distrusted key(s) {} (apply and roll to remove them from every host)", done.join(", "))
        }
    })
}

/// A new CA key for `keyset`: created, or imported from a certificate and key checked to be a CA
/// and its key.
fn new_ca_key(keyset: &str, import: Option<&(std::path::PathBuf, std::path::PathBuf)>) -> anyhow::Result<KeysetKey> {
    let kp = match import {
        None => base::pki::create_ca(keyset).with_context(|| format!("creating a key for {keyset}"))?,
        Some((cert, key)) => {
            let read = |p: &std::path::Path| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()));
            let (cert_pem, key_pem) = (read(cert)?, read(key)?);
            base::pki::check_ca_keypair(keyset, &cert_pem, &key_pem).with_context(|| format!("--cert {} --key {}", cert.display(), key.display()))?;
            base::pki::Keypair { cert_pem, key_pem }
        }
    };
    Ok(KeysetKey { id: base::pki::serial_id(), cert_pem: kp.cert_pem, key_pem: Some(kp.key_pem), distrust_timestamp: None })
}

fn now_rfc3339() -> anyhow::Result<String> {
    time::OffsetDateTime::now_utc().format(&time::format_description::well_known::Rfc3339).context("formatting the time")
}

fn private_rel(keyset: &str) -> String {
    format!("pki/private/{keyset}/keyset.yaml")
}

/// The state store of the spec in `common`.
fn store_of(common: &Common) -> anyhow::Result<Result<(StateStore, String), ExitCode>> {
    let (docs, options) = match load(common)? {
        Ok(x) => x,
        Err(code) => return Ok(Err(code)),
    };
    let file = common.file.display().to_string();
    let (model, _) = prepare_with(&docs, &options, false).with_context(|| format!("{file}: completing the spec"))?;
    let rt = runtime()?;
    let store = rt.block_on(async {
        let s3 = if model.config_base.starts_with("s3://") { Some(aws_target(common, &model.region).await.s3) } else { None };
        open_store(&model.config_base, s3)
    })?;
    Ok(Ok((store, model.config_base)))
}

/// `create | promote | distrust keypair`: change the keyset under the lock, private half first
/// (what signs), then the issued half (what `apply` pins).
pub fn run_change(common: &Common, keyset: &str, change: Change, operation: &str) -> anyhow::Result<ExitCode> {
    check_rotatable(keyset)?;
    let (store, config_base) = match store_of(common)? {
        Ok(x) => x,
        Err(code) => return Ok(code),
    };
    let rt = runtime()?;
    let message = rt.block_on(with_lock(&store, operation, common.force_unlock, async {
        let rel = private_rel(keyset);
        let bytes = store.get(&rel).await?.with_context(|| format!("{config_base}: no {rel} (run `keelson apply --yes` first, which creates the CAs)"))?;
        let mut set = Keyset::parse(keyset, &bytes).with_context(|| store.url(&rel))?;
        let import = match &change {
            Change::Create { import, .. } => import.as_ref(),
            _ => None,
        };
        let message = apply_change(&mut set, &change, || new_ca_key(keyset, import), &now_rfc3339()?)?;
        store.put(&rel, set.to_yaml(true)?.as_bytes()).await.with_context(|| store.url(&rel))?;
        let issued = base::pki::issued_keyset_key(keyset);
        store.put(&issued, set.to_yaml(false)?.as_bytes()).await.with_context(|| store.url(&issued))?;
        Ok(message)
    }))?;
    println!("{message}");
    Ok(ExitCode::SUCCESS)
}

/// One key of a keyset as `get keypairs` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KeypairRow {
    pub keyset: String,
    pub id: String,
    pub primary: bool,
    #[serde(rename = "distrustTimestamp", skip_serializing_if = "Option::is_none")]
    pub distrust_timestamp: Option<String>,
    pub subject: String,
    #[serde(rename = "notAfter")]
    pub not_after: String,
    /// The key's certificate (PEM; public material only, as kOps' `get keypairs -o yaml`).
    pub certificate: String,
}

/// The rows of one keyset, in its document's order.
pub fn rows(set: &Keyset) -> anyhow::Result<Vec<KeypairRow>> {
    set.keys
        .iter()
        .map(|k| {
            let info = base::pki::describe_cert(&k.cert_pem).with_context(|| format!("{}: key {}", set.name, k.id))?;
            let not_after = time::OffsetDateTime::from(info.not_after).format(&time::format_description::well_known::Rfc3339).context("formatting a time")?;
            Ok(KeypairRow {
                keyset: set.name.clone(),
                id: k.id.clone(),
                primary: k.id == set.primary_id,
                distrust_timestamp: k.distrust_timestamp.clone(),
                subject: info.cn,
                not_after,
                certificate: k.cert_pem.clone(),
            })
        })
        .collect()
}

/// The table of `get keypairs`.
pub fn table(rows: &[KeypairRow]) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.keyset.clone(),
                r.id.clone(),
                if r.primary { "yes".into() } else { String::new() },
                r.distrust_timestamp.clone().unwrap_or_default(),
                r.subject.clone(),
                r.not_after.clone(),
            ]
        })
        .collect();
    crate::table::columns(&["NAME", "ID", "PRIMARY", "DISTRUSTED", "SUBJECT", "NOT AFTER"], &cells)
}

/// The keyset names under `pki/issued/` of a store listing (`pki/issued/NAME/keyset.yaml`), sorted.
pub fn issued_names(listing: &[String]) -> Vec<String> {
    let mut names: Vec<String> = listing
        .iter()
        .filter_map(|rel| rel.strip_prefix("pki/issued/")?.strip_suffix("/keyset.yaml"))
        .filter(|n| !n.is_empty() && !n.contains('/'))
        .map(str::to_string)
        .collect();
    names.sort();
    names.dedup();
    names
}

/// `keelson get keypairs`: the public half of each keyset (no private material is read); every
/// keyset can be listed, only [`ROTATABLE`] ones changed.
pub fn run_get(args: GetKeypairsArgs) -> anyhow::Result<ExitCode> {
    for n in &args.keysets {
        if n.is_empty() || !n.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            anyhow::bail!("keyset {n:?}: not a keyset name (letters, digits and '-')");
        }
    }
    let (store, config_base) = match store_of(&args.common)? {
        Ok(x) => x,
        Err(code) => return Ok(code),
    };
    let rt = runtime()?;
    let names = if args.keysets.is_empty() { issued_names(&rt.block_on(store.list("pki/issued/"))?) } else { args.keysets.clone() };
    if names.is_empty() {
        anyhow::bail!("{config_base}: no keysets under pki/issued/ (run `keelson apply --yes` first, which creates the CAs)");
    }
    let mut all = Vec::new();
    for name in &names {
        let rel = base::pki::issued_keyset_key(name);
        let bytes = rt.block_on(store.get(&rel))?.with_context(|| format!("{config_base}: no {rel} (run `keelson apply --yes` first)"))?;
        let set = Keyset::parse(name, &bytes).with_context(|| store.url(&rel))?;
        all.extend(rows(&set)?);
    }
    let text = crate::table::render(args.output, all.as_slice(), table)?;
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> KeysetKey {
        let kp = base::pki::create_ca("kubernetes-ca").expect("ca");
        KeysetKey { id: id.into(), cert_pem: kp.cert_pem, key_pem: Some(kp.key_pem), distrust_timestamp: None }
    }

    #[test]
    fn only_the_cluster_ca_rotates() {
        assert!(check_rotatable("kubernetes-ca").is_ok());
        for other in ["all", "etcd-clients-ca", "service-account", "apiserver-aggregator-ca"] {
            let e = check_rotatable(other).expect_err(other).to_string();
            assert!(e.contains(other) && e.contains("kubernetes-ca"), "{e}");
        }
    }

    /// The whole rotation through the command's change function: create (trusted, not primary),
    /// promote (the new key signs, both trusted), distrust (only the new one trusted).
    #[test]
    fn create_promote_distrust_walks_a_rotation() {
        let old = key("100");
        let mut set = Keyset { name: "kubernetes-ca".into(), primary_id: "100".into(), keys: vec![old.clone()] };
        let msg = apply_change(&mut set, &Change::Create { primary: false, import: None }, || Ok(key("200")), "t").expect("create");
        assert!(msg.contains("created key 200"), "{msg}");
        assert_eq!(set.primary_id, "100");
        assert_eq!(set.trust_bundle().matches("BEGIN CERTIFICATE").count(), 2);
        assert!(set.trust_bundle().starts_with(old.cert_pem.trim_end()), "the primary's certificate comes first");

        let err = apply_change(&mut set, &Change::Distrust { ids: vec![] }, || unreachable!(), "t").expect_err("nothing older than the primary");
        assert!(err.to_string().contains("older than the primary"), "{err}");

        apply_change(&mut set, &Change::Promote { id: None }, || unreachable!(), "t").expect("promote");
        assert_eq!(set.primary_id, "200");
        assert_eq!(set.trust_bundle().matches("BEGIN CERTIFICATE").count(), 2);

        let msg = apply_change(&mut set, &Change::Distrust { ids: vec![] }, || unreachable!(), "2026-12-04T12:00:00Z").expect("distrust");
        assert!(msg.contains("100"), "{msg}");
        assert_eq!(set.trust_bundle().matches("BEGIN CERTIFICATE").count(), 1);
        assert!(!set.trust_bundle().contains(old.cert_pem.trim_end()));
        assert_eq!(set.keys[0].distrust_timestamp.as_deref(), Some("2026-12-04T12:00:00Z"));

        // The documents round-trip; the issued half has no private material.
        let private = Keyset::parse("kubernetes-ca", set.to_yaml(true).expect("yaml").as_bytes()).expect("parse");
        assert_eq!(private, set);
        let issued = set.to_yaml(false).expect("yaml");
        assert!(!issued.contains("privateMaterial"), "{issued}");
    }

    #[test]
    fn every_issued_keyset_is_listed_once() {
        let listing: Vec<String> = [
            "pki/issued/kubernetes-ca/keyset.yaml",
            "pki/issued/etcd-clients-ca/keyset.yaml",
            "pki/issued/kubernetes-ca/keyset.yaml",
            "pki/issued/x/other.yaml",
            "pki/private/service-account/keyset.yaml",
            "pki/issued//keyset.yaml",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(issued_names(&listing), ["etcd-clients-ca", "kubernetes-ca"]);
    }

    #[test]
    fn get_keypairs_rows_mark_the_primary_and_the_distrusted() {
        let mut set = Keyset { name: "kubernetes-ca".into(), primary_id: "100".into(), keys: vec![key("100"), key("200")] };
        set.keys[0].distrust_timestamp = Some("2026-12-04T12:00:00Z".into());
        set.primary_id = "200".into();
        let rows = rows(&set).expect("rows");
        assert_eq!(rows.len(), 2);
        assert!(!rows[0].primary && rows[1].primary);
        assert_eq!(rows[0].subject, "kubernetes-ca");
        let t = table(&rows);
        assert!(t.starts_with("NAME"), "{t}");
        assert!(t.lines().nth(1).is_some_and(|l| l.contains("2026-12-04T12:00:00Z")), "{t}");
        assert!(t.lines().nth(2).is_some_and(|l| l.contains("yes")), "{t}");
        assert!(!t.contains("BEGIN CERTIFICATE"), "the table leaves the certificates out: {t}");
        assert_eq!(rows[1].certificate, set.keys[1].cert_pem);
    }
}
