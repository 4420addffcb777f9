//! STS's judgement of `AssumeRoleWithWebIdentity`, which moto does not make: a credential moto issued
//! for a service-account token ([`Issued`], recorded by `moto_server.py` fix 11) is judged as AWS
//! would — the token's issuer has an IAM OIDC provider, its audience is one of the provider's client
//! IDs, its signature verifies with a key of the key set the issuer publishes, it has not expired,
//! and the role's trust policy lets that provider assume it for the token's subject
//! (`StringEquals` / `StringLike` on `<provider>:sub` and `:aud`). Pure: the caller fetches the
//! providers, key sets and trust policies.
//!
//! Judged: ES256 (what Keelson's service-account keys sign) and RS256.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde_json::Value;

/// One credential moto issued for a web identity.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Issued {
    pub access_key_id: String,
    pub role_arn: String,
    #[serde(default)]
    pub token: Option<String>,
}

/// An IAM OIDC provider as IAM holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provider {
    pub arn: String,
    /// Host and path, no scheme (IAM's `Url`).
    pub url: String,
    pub client_ids: Vec<String>,
}

/// What STS would have let through: the role and the token's subject.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Accepted {
    pub role_arn: String,
    pub subject: String,
}

fn b64(part: &str, what: &str) -> Result<Vec<u8>, String> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(part.trim_end_matches('=')).map_err(|e| format!("{what}: not base64url: {e}"))
}

fn json(part: &str, what: &str) -> Result<Value, String> {
    serde_json::from_slice(&b64(part, what)?).map_err(|e| format!("{what}: not JSON: {e}"))
}

fn strings(v: &Value) -> Vec<String> {
    match v {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect(),
        _ => Vec::new(),
    }
}

/// Verify the signature of `signed` (`header.payload`) with the key `kid` of the key set.
fn verify_signature(alg: &str, key: &Value, signed: &[u8], signature: &[u8]) -> Result<(), String> {
    let field = |name: &str| key[name].as_str().ok_or_else(|| format!("key {}: no {name}", key["kid"])).and_then(|v| b64(v, name));
    match alg {
        "ES256" => {
            if key["kty"] != "EC" || key["crv"] != "P-256" {
                return Err(format!("key {} is not a P-256 key", key["kid"]));
            }
            let mut point = vec![4u8];
            point.extend(field("x")?);
            point.extend(field("y")?);
            ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P256_SHA256_FIXED, point)
                .verify(signed, signature)
                .map_err(|_| "the signature does not verify with the issuer's key".to_string())
        }
        "RS256" => ring::signature::RsaPublicKeyComponents { n: field("n")?, e: field("e")? }
            .verify(&ring::signature::RSA_PKCS1_2048_8192_SHA256, signed, signature)
            .map_err(|_| "the signature does not verify with the issuer's key".to_string()),
        other => Err(format!("algorithm {other:?} (ES256 or RS256)")),
    }
}

/// Whether the trust policy lets `provider` assume the role for these claims.
fn trusted(trust: &Value, provider: &Provider, claims: &BTreeMap<String, Vec<String>>) -> Result<(), String> {
    for s in crate::iam_oracle::statements(trust) {
        let actions = strings(&s["Action"]);
        let federated = strings(&s["Principal"]["Federated"]);
        if s["Effect"] != "Allow" || !actions.iter().any(|a| a == "sts:AssumeRoleWithWebIdentity") || !federated.contains(&provider.arn) {
            continue;
        }
        let conditions = s["Condition"].as_object().cloned().unwrap_or_default();
        let ok = conditions.iter().all(|(op, keys)| {
            keys.as_object().is_some_and(|keys| {
                keys.iter().all(|(key, want)| {
                    let have = claims.get(key.as_str()).cloned().unwrap_or_default();
                    let want = strings(want);
                    match op.as_str() {
                        "StringEquals" => have.iter().any(|h| want.contains(h)),
                        "StringLike" => have.iter().any(|h| want.iter().any(|w| crate::iam_oracle::glob(w, h, false))),
                        _ => false,
                    }
                })
            })
        });
        if ok {
            return Ok(());
        }
    }
    Err(format!("the role's trust policy does not let {} assume it for {:?}", provider.arn, claims))
}

/// Judge one issued credential: `Ok` with the role and subject when STS would have issued it.
/// `key_sets` maps a provider's URL (host and path) to the key set its issuer publishes; `trust` is
/// the role's trust policy; `now` in seconds since the epoch.
pub fn judge(issued: &Issued, providers: &[Provider], key_sets: &BTreeMap<String, Value>, trust: &Value, now: u64) -> Result<Accepted, String> {
    let token = issued.token.as_deref().ok_or("no WebIdentityToken was sent")?;
    let parts: Vec<&str> = token.split('.').collect();
    let [h, p, s] = parts[..] else { return Err("the token is not a JWS (three parts)".into()) };
    let header = json(h, "token header")?;
    let claims = json(p, "token claims")?;
    let iss = claims["iss"].as_str().ok_or("the token has no iss")?;
    let provider = providers.iter().find(|pr| format!("https://{}", pr.url) == iss).ok_or_else(|| format!("no IAM OIDC provider for the issuer {iss:?}"))?;
    let aud = strings(&claims["aud"]);
    if !aud.iter().any(|a| provider.client_ids.contains(a)) {
        return Err(format!("audience {aud:?} is none of the provider's client IDs {:?}", provider.client_ids));
    }
    let kid = header["kid"].as_str().ok_or("the token header has no kid")?;
    let keys = key_sets.get(&provider.url).ok_or_else(|| format!("the issuer {iss} publishes no key set"))?;
    let key = keys["keys"].as_array().and_then(|k| k.iter().find(|k| k["kid"] == kid)).ok_or_else(|| format!("the issuer's key set has no key {kid:?}"))?;
    verify_signature(header["alg"].as_str().unwrap_or(""), key, format!("{h}.{p}").as_bytes(), &b64(s, "signature")?)?;
    let exp = claims["exp"].as_u64().ok_or("the token has no exp")?;
    if exp <= now {
        return Err(format!("the token expired at {exp} (now {now})"));
    }
    if claims["nbf"].as_u64().is_some_and(|nbf| nbf > now.saturating_add(300)) {
        return Err("the token is not valid yet".into());
    }
    let subject = claims["sub"].as_str().ok_or("the token has no sub")?.to_string();
    let context: BTreeMap<String, Vec<String>> = [(format!("{}:sub", provider.url), vec![subject.clone()]), (format!("{}:aud", provider.url), aud)].into();
    trusted(trust, provider, &context)?;
    Ok(Accepted { role_arn: issued.role_arn.clone(), subject })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::rand::SystemRandom;
    use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};

    const URL: &str = "bucket.s3.us-east-1.amazonaws.com/discovery";
    const ARN: &str = "arn:aws:iam::123456789012:oidc-provider/bucket.s3.us-east-1.amazonaws.com/discovery";
    const ROLE: &str = "arn:aws:iam::123456789012:role/ccm.kube-system.sa.c";

    fn enc(b: &[u8]) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
    }

    struct Signer {
        pair: EcdsaKeyPair,
    }

    impl Signer {
        fn new() -> Signer {
            let rng = SystemRandom::new();
            let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("key");
            Signer { pair: EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).expect("key") }
        }
        fn jwks(&self) -> Value {
            let point = self.pair.public_key().as_ref();
            serde_json::json!({"keys": [{"kty": "EC", "crv": "P-256", "kid": "k1", "alg": "ES256", "use": "sig", "x": enc(&point[1..33]), "y": enc(&point[33..])}]})
        }
        fn token(&self, claims: Value) -> String {
            let h = enc(br#"{"alg":"ES256","kid":"k1"}"#);
            let p = enc(claims.to_string().as_bytes());
            let sig = self.pair.sign(&SystemRandom::new(), format!("{h}.{p}").as_bytes()).expect("sign");
            format!("{h}.{p}.{}", enc(sig.as_ref()))
        }
    }

    fn trust(sub: &str, op: &str) -> Value {
        serde_json::json!({"Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Principal": {"Federated": ARN}, "Action": "sts:AssumeRoleWithWebIdentity",
            "Condition": {op: {format!("{URL}:sub"): sub}},
        }]})
    }

    fn claims(sub: &str, aud: &str, exp: u64) -> Value {
        serde_json::json!({"iss": format!("https://{URL}"), "sub": sub, "aud": [aud], "exp": exp, "iat": 1000, "nbf": 1000})
    }

    #[test]
    fn sts_accepts_only_a_good_token_for_a_trusted_subject() {
        let s = Signer::new();
        let providers = [Provider { arn: ARN.into(), url: URL.into(), client_ids: vec!["amazonaws.com".into()] }];
        let keys: BTreeMap<String, Value> = [(URL.to_string(), s.jwks())].into();
        let sub = "system:serviceaccount:kube-system:ccm";
        let issued = |token: String| Issued { access_key_id: "AKIA".into(), role_arn: ROLE.into(), token: Some(token) };
        let good = issued(s.token(claims(sub, "amazonaws.com", 5000)));
        assert_eq!(judge(&good, &providers, &keys, &trust(sub, "StringEquals"), 2000), Ok(Accepted { role_arn: ROLE.into(), subject: sub.into() }));
        assert!(judge(&good, &providers, &keys, &trust("system:serviceaccount:kube-*:ccm", "StringLike"), 2000).is_ok());
        let refused = |i: &Issued, trust: &Value, now: u64, why: &str| {
            let e = judge(i, &providers, &keys, trust, now).expect_err(why);
            assert!(e.contains(why), "{why}: {e}");
        };
        refused(&good, &trust("system:serviceaccount:kube-system:other", "StringEquals"), 2000, "trust policy does not let");
        refused(&good, &trust(sub, "StringEquals"), 6000, "expired");
        refused(&issued(s.token(claims(sub, "sts.amazonaws.com", 5000))), &trust(sub, "StringEquals"), 2000, "none of the provider's client IDs");
        let other = Signer::new();
        refused(&issued(other.token(claims(sub, "amazonaws.com", 5000))), &trust(sub, "StringEquals"), 2000, "does not verify");
        let mut foreign = claims(sub, "amazonaws.com", 5000);
        foreign["iss"] = serde_json::json!("https://elsewhere.example/x");
        refused(&issued(s.token(foreign)), &trust(sub, "StringEquals"), 2000, "no IAM OIDC provider");
        let mut forged = s.token(claims(sub, "amazonaws.com", 5000));
        let cut = forged.rfind('.').expect("dot");
        forged.replace_range(
            ..cut,
            &format!(
                "{}.{}",
                enc(br#"{"alg":"ES256","kid":"k1"}"#),
                enc(claims("system:serviceaccount:kube-system:admin", "amazonaws.com", 5000).to_string().as_bytes())
            ),
        );
        refused(&issued(forged), &trust("system:serviceaccount:kube-system:*", "StringLike"), 2000, "does not verify");
        refused(&Issued { token: None, ..good.clone() }, &trust(sub, "StringEquals"), 2000, "no WebIdentityToken");
    }
}
