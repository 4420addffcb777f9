//! The IAM oracle over the local cloud (AWS): moto enforces no IAM, so every request it served —
//! protokube, nodeup, the kubelet's and the cloud-controller-manager's calls from the machines,
//! recorded at moto's door (`testkit::moto_calls`) — is checked against the policies IAM holds for
//! the role whose credentials signed it. The daemon notes each instance-role credential it puts in
//! a machine's IMDS ([`issued`]); requests signed with any other key (the operator's `keelson`,
//! the harness) are not checked.
//!
//! Condition keys `aws:ResourceTag/…` come from the resources' tags when the check runs (moto keeps
//! terminated instances and their tags), not from the time of the call.

use std::collections::BTreeMap;
use std::io::Write;

use anyhow::Context;
use testkit::moto_calls::{self, Identities, Report};

use super::commands::state;
use super::state::ClusterState;
use crate::cloud::Cloud;
use crate::imds::RoleCredentials;
use crate::paths::State;

/// moto's account: the ARNs of every resource it holds.
pub const MOTO_ACCOUNT: &str = "123456789012";

/// One credential handed to a machine (a line of [`State::issued_credentials`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Issued {
    pub access_key_id: String,
    pub role: String,
    pub instance_id: String,
}

/// Note that `credentials` (of the instance `instance_id`) go to a machine, and pass them on.
pub fn issued(st: &State, instance_id: &str, credentials: Option<RoleCredentials>) -> anyhow::Result<Option<RoleCredentials>> {
    if let Some(c) = &credentials {
        let line = serde_json::to_string(&Issued { access_key_id: c.access_key_id.clone(), role: c.role_name.clone(), instance_id: instance_id.to_string() })?;
        let path = st.issued_credentials();
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&path).with_context(|| format!("opening {}", path.display()))?;
        writeln!(f, "{line}").with_context(|| format!("appending to {}", path.display()))?;
    }
    Ok(credentials)
}

/// Access key → role, from the daemon's notes.
pub fn issued_roles(st: &State) -> anyhow::Result<BTreeMap<String, String>> {
    let path = st.issued_credentials();
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let mut out = BTreeMap::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let issued: Issued = serde_json::from_str(line).with_context(|| format!("{} line {}", path.display(), i + 1))?;
        out.insert(issued.access_key_id, issued.role);
    }
    Ok(out)
}

/// What the oracle decides from: every request moto served, the roles the keys were issued for,
/// those roles' policies and the resources' tags, as they are now.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Evidence {
    #[serde(skip)]
    pub records: Vec<moto_calls::Recorded>,
    /// Access key → role.
    pub roles: BTreeMap<String, String>,
    /// Role → its policy documents.
    pub policies: BTreeMap<String, Vec<serde_json::Value>>,
    /// EC2 resource id or ELB ARN → tags.
    pub tags: BTreeMap<String, BTreeMap<String, String>>,
    /// Credentials STS issued for service-account tokens, each judged as STS would
    /// (`testkit::web_identity`): the role and subject, or why STS would have refused it.
    #[serde(default)]
    pub web_identities: Vec<(String, Result<testkit::web_identity::Accepted, String>)>,
}

impl Evidence {
    /// Gather it from the running local cloud (moto must be up: policies and tags are read there).
    pub fn gather() -> anyhow::Result<Evidence> {
        let st = state();
        let cs = ClusterState::load(&st).context("no local cloud is running (no cluster state)")?;
        anyhow::ensure!(!cs.is_gce(), "the IAM oracle checks AWS calls; this local cloud plays GCE (its Cloud Storage gate enforces IAM itself)");
        let records = moto_calls::read(&st.moto_calls())?;
        let mut roles = issued_roles(&st)?;
        let cloud = Cloud::new(&cs.endpoint(), &cs.region);
        // Service accounts' credentials: judged as STS would, then checked like any role's.
        let issued = moto_calls::read_web_identities(&st.moto_calls())?;
        let mut web_identities = Vec::new();
        if !issued.is_empty() {
            let providers = cloud.oidc_providers()?;
            let mut key_sets = BTreeMap::new();
            for p in &providers {
                if let Some(keys) = cloud.issuer_key_set(&p.url)? {
                    key_sets.insert(p.url.clone(), keys);
                }
            }
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
            for i in issued {
                let role = i.role_arn.rsplit('/').next().unwrap_or_default().to_string();
                let judged =
                    cloud.role_trust(&role).map_err(|e| e.to_string()).and_then(|trust| testkit::web_identity::judge(&i, &providers, &key_sets, &trust, now));
                if judged.is_ok() {
                    roles.insert(i.access_key_id.clone(), role);
                }
                web_identities.push((i.access_key_id, judged));
            }
        }
        let mut policies = BTreeMap::new();
        for role in roles.values() {
            if !policies.contains_key(role) {
                policies.insert(role.clone(), cloud.role_policies(role)?);
            }
        }
        Ok(Evidence { records, roles, policies, tags: cloud.resource_tags()?, web_identities })
    }

    /// A resource's tags by ARN: an EC2 ARN's are its id's (`…:volume/vol-1` → `vol-1`).
    pub fn tags_of(&self, arn: &str) -> BTreeMap<String, String> {
        self.tags.get(arn).or_else(|| arn.rsplit('/').next().and_then(|id| self.tags.get(id))).cloned().unwrap_or_default()
    }

    pub fn check(&self) -> Report {
        let lookup = |arn: &str| self.tags_of(arn);
        let mut report = moto_calls::check(&self.records, &Identities { roles: &self.roles, policies: &self.policies, account: MOTO_ACCOUNT, tags: &lookup });
        report.web_identities = self.web_identities.len();
        report.refused_web_identities = self.web_identities.iter().filter_map(|(key, j)| j.as_ref().err().map(|why| (key.clone(), why.clone()))).collect();
        report
    }

    /// Write it to `dir` (`calls.jsonl`, `evidence.json`): to look at, or to keep as a test fixture.
    pub fn save(&self, dir: &std::path::Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut calls = String::new();
        for r in &self.records {
            calls.push_str(&serde_json::to_string(r)?);
            calls.push('\n');
        }
        std::fs::write(dir.join("calls.jsonl"), calls).with_context(|| format!("writing {}", dir.display()))?;
        std::fs::write(dir.join("evidence.json"), serde_json::to_string_pretty(self)?).with_context(|| format!("writing {}", dir.display()))?;
        Ok(())
    }
}

/// Check every request moto has served so far.
pub fn check() -> anyhow::Result<Report> {
    Ok(Evidence::gather()?.check())
}
