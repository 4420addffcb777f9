//! kOps' `Keyset` document with every key it holds: the primary (the key that signs) and the
//! others, each trusted until its `distrustTimestamp` is set — what CA rotation needs.
//!
//! A rotation is kOps' (`docs/operations/rotate-secrets.md`): a new key is added beside the primary
//! ([`Keyset::add`], `keelson create keypair`), every host then trusts both ([`Keyset::trust_bundle`]);
//! the new key is made the primary ([`Keyset::promote`], `keelson promote keypair`) and the hosts
//! are rolled so every certificate is signed by it; the old key is distrusted ([`Keyset::distrust`],
//! `keelson distrust keypair`) and the hosts rolled once more. Pure functions: the commands read
//! and write the documents around them.

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::pki::{Keypair, PkiError};

/// One key of a keyset: its certificate, its private key when the document is the private half,
/// and when it was distrusted (RFC 3339), if it was.
#[derive(Clone, PartialEq, Eq)]
pub struct KeysetKey {
    pub id: String,
    pub cert_pem: String,
    pub key_pem: Option<String>,
    pub distrust_timestamp: Option<String>,
}

impl std::fmt::Debug for KeysetKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeysetKey")
            .field("id", &self.id)
            .field("cert_pem", &self.cert_pem.len())
            .field("key_pem", &self.key_pem.as_ref().map(|_| "<redacted>"))
            .field("distrust_timestamp", &self.distrust_timestamp)
            .finish()
    }
}

impl KeysetKey {
    pub fn trusted(&self) -> bool {
        self.distrust_timestamp.is_none()
    }
}

/// A keyset: its name, its primary key's id and every key, in the document's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keyset {
    pub name: String,
    pub primary_id: String,
    pub keys: Vec<KeysetKey>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Doc {
    #[serde(rename = "apiVersion")]
    api_version: String,
    kind: String,
    metadata: Meta,
    spec: Spec,
}

#[derive(Debug, Serialize, Deserialize)]
struct Meta {
    name: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct Spec {
    #[serde(rename = "type")]
    type_: String,
    #[serde(rename = "primaryId", default)]
    primary_id: String,
    #[serde(default)]
    keys: Vec<Item>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Item {
    id: String,
    #[serde(rename = "distrustTimestamp", default, skip_serializing_if = "Option::is_none")]
    distrust_timestamp: Option<String>,
    #[serde(rename = "publicMaterial", default, skip_serializing_if = "Option::is_none")]
    public_material: Option<String>,
    #[serde(rename = "privateMaterial", default, skip_serializing_if = "Option::is_none")]
    private_material: Option<String>,
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s.as_bytes())
}

impl Keyset {
    /// A keyset of one key, the primary.
    pub fn single(name: &str, id: &str, kp: &Keypair) -> Keyset {
        Keyset {
            name: name.into(),
            primary_id: id.into(),
            keys: vec![KeysetKey { id: id.into(), cert_pem: kp.cert_pem.clone(), key_pem: Some(kp.key_pem.clone()), distrust_timestamp: None }],
        }
    }

    fn err(&self, message: impl Into<String>) -> PkiError {
        PkiError::Keyset { name: self.name.clone(), message: message.into() }
    }

    /// Read a keyset document (`kind: Keyset`, kOps v1alpha2). Refused: no keys, two keys with one
    /// id, material that is not base64 of PEM. A document without a usable `primaryId` (older
    /// writers) takes its last trusted key as the primary, as kOps does.
    pub fn parse(name: &str, bytes: &[u8]) -> Result<Keyset, PkiError> {
        let bad = |message: String| PkiError::Keyset { name: name.into(), message };
        let doc: Doc = serde_yaml_ng::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
        if doc.kind != "Keyset" {
            return Err(bad(format!("kind is {:?}, not Keyset", doc.kind)));
        }
        let unb64 = |what: &str, id: &str, s: &str| -> Result<String, PkiError> {
            let bytes = base64::engine::general_purpose::STANDARD.decode(s.trim()).map_err(|e| bad(format!("key {id}: {what} is not base64: {e}")))?;
            String::from_utf8(bytes).map_err(|_| bad(format!("key {id}: {what} is not PEM text")))
        };
        let mut keys: Vec<KeysetKey> = Vec::with_capacity(doc.spec.keys.len());
        for item in doc.spec.keys {
            if keys.iter().any(|k| k.id == item.id) {
                return Err(bad(format!("two keys have the id {:?}", item.id)));
            }
            let cert_pem = unb64("publicMaterial", &item.id, item.public_material.as_deref().unwrap_or_default())?;
            if cert_pem.trim().is_empty() {
                return Err(bad(format!("key {}: no publicMaterial", item.id)));
            }
            let key_pem = item.private_material.as_deref().map(|k| unb64("privateMaterial", &item.id, k)).transpose()?;
            keys.push(KeysetKey { id: item.id, cert_pem, key_pem, distrust_timestamp: item.distrust_timestamp });
        }
        if keys.is_empty() {
            return Err(bad("no keys".into()));
        }
        let primary_id = if keys.iter().any(|k| k.id == doc.spec.primary_id) {
            doc.spec.primary_id
        } else {
            keys.iter().rev().find(|k| k.trusted()).map(|k| k.id.clone()).ok_or_else(|| bad("no trusted key to be the primary".into()))?
        };
        Ok(Keyset { name: name.into(), primary_id, keys })
    }

    /// The document; `private` keeps the private material (the `pki/private` half), otherwise it is
    /// left out (the `pki/issued` half).
    pub fn to_yaml(&self, private: bool) -> Result<String, PkiError> {
        let doc = Doc {
            api_version: "kops.k8s.io/v1alpha2".into(),
            kind: "Keyset".into(),
            metadata: Meta { name: self.name.clone() },
            spec: Spec {
                type_: "Keypair".into(),
                primary_id: self.primary_id.clone(),
                keys: self
                    .keys
                    .iter()
                    .map(|k| Item {
                        id: k.id.clone(),
                        distrust_timestamp: k.distrust_timestamp.clone(),
                        public_material: Some(b64(&k.cert_pem)),
                        private_material: if private { k.key_pem.as_deref().map(b64) } else { None },
                    })
                    .collect(),
            },
        };
        serde_yaml_ng::to_string(&doc).map_err(|e| self.err(e.to_string()))
    }

    pub fn primary(&self) -> &KeysetKey {
        // `parse` and every change keep the primary among the keys.
        self.keys.iter().find(|k| k.id == self.primary_id).unwrap_or(&self.keys[0])
    }

    /// The primary's certificate and key (the private half only).
    pub fn primary_keypair(&self) -> Result<Keypair, PkiError> {
        let p = self.primary();
        let key_pem = p.key_pem.clone().ok_or_else(|| self.err(format!("key {}: no privateMaterial", p.id)))?;
        Ok(Keypair { cert_pem: p.cert_pem.clone(), key_pem })
    }

    /// Every trusted key's certificate, the primary's first, as one PEM bundle: what hosts verify
    /// with while a rotation is under way.
    pub fn trust_bundle(&self) -> String {
        let primary = self.primary();
        std::iter::once(primary).chain(self.keys.iter().filter(|k| k.trusted() && k.id != primary.id)).map(|k| format!("{}\n", k.cert_pem.trim_end())).collect()
    }

    /// Add `key` (a new id); `primary` makes it the primary at once (kOps' `--primary`).
    pub fn add(&mut self, key: KeysetKey, primary: bool) -> Result<(), PkiError> {
        if self.keys.iter().any(|k| k.id == key.id) {
            return Err(self.err(format!("a key with the id {} exists", key.id)));
        }
        if primary {
            self.primary_id = key.id.clone();
        }
        self.keys.push(key);
        Ok(())
    }

    /// kOps' `promote keypair`: make key `id` the primary, or without an id the newest trusted key
    /// ([`newer`]). A distrusted key cannot be the primary. Returns the new primary's id.
    pub fn promote(&mut self, id: Option<&str>) -> Result<String, PkiError> {
        let key = match id {
            Some(id) => self.keys.iter().find(|k| k.id == id).ok_or_else(|| self.err(format!("has no key {id} (keys: {})", self.ids())))?,
            None => self.keys.iter().filter(|k| k.trusted()).max_by(|a, b| newer(&a.id, &b.id)).ok_or_else(|| self.err("has no trusted key"))?,
        };
        if !key.trusted() {
            return Err(self.err(format!("key {} is distrusted; a distrusted key cannot be the primary", key.id)));
        }
        if key.id == self.primary_id {
            return Err(self.err(format!("key {} is the primary already", key.id)));
        }
        self.primary_id = key.id.clone();
        Ok(self.primary_id.clone())
    }

    /// kOps' `distrust keypair`: distrust the keys `ids`, or without ids every trusted key older
    /// than the primary ([`newer`]), stamping `now` (RFC 3339). The primary cannot be distrusted.
    /// Returns the ids distrusted; none is an error (nothing to do is not what the user expected).
    pub fn distrust(&mut self, ids: &[String], now: &str) -> Result<Vec<String>, PkiError> {
        for id in ids {
            if !self.keys.iter().any(|k| &k.id == id) {
                return Err(self.err(format!("has no key {id} (keys: {})", self.ids())));
            }
            if *id == self.primary_id {
                return Err(self.err(format!("key {id} is the primary; promote another key first")));
            }
        }
        let primary = self.primary_id.clone();
        let chosen: Vec<String> = if ids.is_empty() {
            self.keys.iter().filter(|k| k.trusted() && newer(&primary, &k.id).is_gt()).map(|k| k.id.clone()).collect()
        } else {
            ids.iter().filter(|id| self.keys.iter().any(|k| &k.id == *id && k.trusted())).cloned().collect()
        };
        if chosen.is_empty() {
            return Err(self.err(if ids.is_empty() {
                "no trusted key is older than the primary".to_string()
            } else {
                "every key named is distrusted already".to_string()
            }));
        }
        for k in self.keys.iter_mut().filter(|k| chosen.contains(&k.id)) {
            k.distrust_timestamp = Some(now.to_string());
        }
        Ok(chosen)
    }

    fn ids(&self) -> String {
        self.keys.iter().map(|k| k.id.as_str()).collect::<Vec<_>>().join(", ")
    }
}

/// How two key ids order by age: kOps' ids are decimal serials that grow with time (Keelson's are
/// creation times in nanoseconds), so numbers compare as numbers; other ids (imported keys) as text.
pub fn newer(a: &str, b: &str) -> std::cmp::Ordering {
    match (a.parse::<u128>(), b.parse::<u128>()) {
        (Ok(x), Ok(y)) => x.cmp(&y),
        _ => a.len().cmp(&b.len()).then_with(|| a.cmp(b)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> KeysetKey {
        let kp = crate::pki::create_ca("kubernetes-ca").expect("ca");
        KeysetKey { id: id.into(), cert_pem: kp.cert_pem, key_pem: Some(kp.key_pem), distrust_timestamp: None }
    }

    fn two() -> Keyset {
        let mut ks = Keyset { name: "kubernetes-ca".into(), primary_id: "100".into(), keys: vec![key("100")] };
        ks.add(key("200"), false).expect("add");
        ks
    }

    #[test]
    fn a_rotation_adds_promotes_and_distrusts_in_kops_order() {
        let mut ks = two();
        assert_eq!(ks.primary().id, "100", "a key added without --primary is staged");
        let (old, new) = (ks.keys[0].cert_pem.clone(), ks.keys[1].cert_pem.clone());
        assert_eq!(ks.trust_bundle(), format!("{}\n{}\n", old.trim_end(), new.trim_end()), "both trusted, the primary first");
        assert_eq!(ks.promote(None).expect("promote"), "200", "the newest trusted key");
        assert_eq!(ks.trust_bundle(), format!("{}\n{}\n", new.trim_end(), old.trim_end()));
        assert_eq!(ks.distrust(&[], "2026-12-04T06:00:00Z").expect("distrust"), vec!["100".to_string()], "keys older than the primary");
        assert_eq!(ks.trust_bundle(), format!("{}\n", new.trim_end()));
        assert_eq!(ks.primary_keypair().expect("primary").cert_pem, new);
        assert!(ks.distrust(&[], "x").is_err(), "nothing left to distrust is an error");
    }

    #[test]
    fn the_primary_is_never_distrusted_and_a_distrusted_key_never_promoted() {
        let mut ks = two();
        assert!(ks.distrust(&["100".into()], "t").unwrap_err().to_string().contains("is the primary"));
        assert!(ks.distrust(&["300".into()], "t").unwrap_err().to_string().contains("has no key 300"));
        ks.promote(Some("200")).expect("promote");
        ks.distrust(&["100".into()], "t").expect("distrust");
        assert!(ks.promote(Some("100")).unwrap_err().to_string().contains("distrusted"));
        assert!(ks.promote(None).unwrap_err().to_string().contains("primary already"));
        assert!(ks.add(key("200"), false).is_err(), "ids are unique");
    }

    #[test]
    fn documents_round_trip_and_the_issued_half_has_no_private_material() {
        let mut ks = two();
        ks.promote(None).expect("promote");
        ks.distrust(&[], "2026-12-04T06:00:00Z").expect("distrust");
        let private = ks.to_yaml(true).expect("yaml");
        assert_eq!(Keyset::parse("kubernetes-ca", private.as_bytes()).expect("parse"), ks);
        let issued = ks.to_yaml(false).expect("yaml");
        assert!(!issued.contains("privateMaterial") && issued.contains("distrustTimestamp: 2026-12-04T06:00:00Z"), "{issued}");
        let public = Keyset::parse("kubernetes-ca", issued.as_bytes()).expect("parse");
        assert_eq!(public.trust_bundle(), ks.trust_bundle());
        assert!(public.primary_keypair().is_err(), "no private material in the issued half");
    }

    #[test]
    fn bad_documents_are_refused_by_name() {
        let ks = two();
        let dup = ks.to_yaml(false).unwrap().replace("id: '200'", "id: '100'").replace("id: \"200\"", "id: \"100\"");
        assert!(Keyset::parse("kubernetes-ca", dup.as_bytes()).unwrap_err().to_string().contains("two keys have the id"), "{dup}");
        let e = Keyset::parse("kubernetes-ca", b"apiVersion: kops.k8s.io/v1alpha2\nkind: Keyset\nmetadata: {name: x}\nspec: {type: Keypair, keys: []}\n")
            .unwrap_err();
        assert_eq!(e.to_string(), "keyset kubernetes-ca: no keys");
        let e = Keyset::parse("kubernetes-ca", b"kind: Secret\napiVersion: v1\nmetadata: {name: x}\nspec: {type: Keypair}\n").unwrap_err();
        assert!(e.to_string().contains("not Keyset"), "{e}");
        // An unknown primaryId (an older writer): the last trusted key.
        let odd = ks.to_yaml(false).unwrap().replace("primaryId: '100'", "primaryId: '999'").replace("primaryId: \"100\"", "primaryId: \"999\"");
        assert_eq!(Keyset::parse("kubernetes-ca", odd.as_bytes()).expect("parse").primary_id, "200", "{odd}");
    }

    #[test]
    fn ids_order_as_numbers_then_as_text() {
        assert!(newer("1000", "999").is_gt());
        assert!(newer("abc", "abd").is_lt());
        assert!(newer("zz", "aaa").is_lt());
    }
}
