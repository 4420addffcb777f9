//! What an agent knows about the instance it runs on — instance id, zone, region, internal IP,
//! host (node) name, and on GCE its project and name — learnt once, the same way by nodeup and
//! protokube: each fact from its flag when given, else from the cloud's metadata service (IMDSv2 on
//! AWS, the metadata server on GCE), else unknown.
//!
//! The merging rules are pure functions ([`InstanceFacts::fill_from_gce`],
//! [`InstanceFacts::fill_from_aws`], [`region_of_zone`]); [`resolve`] is the thin I/O part that asks
//! the metadata service for what the flags left unset.

use crate::gce_metadata::{self, GceMetadata, GceMetadataError, Instance};
use crate::imds::{Identity, ImdsError, InstanceMetadata};

/// The facts given on the command line (`--instance-id`, `--zone`, `--region`, `--internal-ip`,
/// `--hostname`/`--node-name`): each one set wins and is never asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    pub instance_id: Option<String>,
    pub zone: Option<String>,
    pub region: Option<String>,
    pub internal_ip: Option<String>,
    pub hostname: Option<String>,
    /// GCE: the instance's name (protokube's `--instance-id` there).
    pub instance_name: Option<String>,
}

/// What is known about the instance; `None` where neither a flag nor the metadata service said.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstanceFacts {
    /// AWS: `i-…`; GCE: the numeric id (a recreated instance keeps its name, never its id).
    pub instance_id: Option<String>,
    pub zone: Option<String>,
    pub region: Option<String>,
    pub internal_ip: Option<String>,
    /// The Kubernetes node name: AWS `local-hostname`; GCE the hostname's first label.
    pub hostname: Option<String>,
    /// GCE: the project and the instance's name (its provider id is `gce://project/zone/name`).
    pub project: Option<String>,
    pub instance_name: Option<String>,
}

/// Where the facts the flags left unset come from.
pub enum Source<'a, M> {
    /// Nowhere: the flags are all there is (bare metal, tests).
    Flags,
    /// IMDSv2 (AWS).
    Aws(&'a M),
    /// The GCE metadata server.
    Gce(&'a GceMetadata),
}

#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    #[error(transparent)]
    Imds(#[from] ImdsError),
    #[error(transparent)]
    Gce(#[from] GceMetadataError),
    #[error("instance {fact}: neither its flag nor the metadata service gave it")]
    Missing { fact: &'static str },
}

/// The region of a zone: AWS `eu-west-1b` → `eu-west-1` (kOps' rule, [`keelson_api::plan::region_of_zone`]);
/// GCE `europe-west1-b` → `europe-west1`. A zone of neither shape is its own region.
pub fn region_of_zone(zone: &str) -> String {
    if let Some(r) = keelson_api::plan::region_of_zone(zone) {
        return r.to_string();
    }
    zone.rsplit_once('-').map(|(r, _)| r.to_string()).unwrap_or_else(|| zone.to_string())
}

fn trimmed(v: Option<String>) -> Option<String> {
    v.map(|s| s.trim().to_string())
}

impl InstanceFacts {
    /// The flags' facts, nothing asked yet.
    pub fn from_flags(flags: &Overrides) -> InstanceFacts {
        InstanceFacts {
            instance_id: flags.instance_id.clone(),
            zone: flags.zone.clone(),
            region: flags.region.clone(),
            internal_ip: flags.internal_ip.clone(),
            hostname: flags.hostname.clone(),
            project: None,
            instance_name: flags.instance_name.clone(),
        }
    }

    /// Fill what is unset from the GCE metadata server's answer; the region from the zone.
    pub fn fill_from_gce(&mut self, i: &Instance) {
        self.zone.get_or_insert_with(|| i.zone.clone());
        if self.region.is_none() {
            self.region = self.zone.as_deref().map(region_of_zone);
        }
        self.instance_id.get_or_insert_with(|| i.id.clone());
        self.project.get_or_insert_with(|| i.project.clone());
        self.instance_name.get_or_insert_with(|| i.name.clone());
        self.internal_ip.get_or_insert_with(|| i.internal_ip.clone());
        self.hostname.get_or_insert_with(|| gce_metadata::node_name(&i.hostname).to_string());
    }

    /// Fill what is unset from IMDS answers (`answer(path)` for each IMDS path still needed, already
    /// fetched); a missing `placement/region` (older IMDS) is the zone's region.
    pub fn fill_from_aws(&mut self, answer: impl Fn(&str) -> Option<String>) {
        for (fact, path) in AWS_PATHS {
            let slot = self.slot(fact);
            if slot.is_none() {
                *slot = trimmed(answer(path)).filter(|v| !v.is_empty());
            }
        }
        if self.region.is_none() {
            self.region = self.zone.as_deref().map(region_of_zone);
        }
    }

    /// The IMDS paths of the facts still unset.
    pub fn aws_paths_needed(&self) -> Vec<&'static str> {
        let mut me = self.clone();
        AWS_PATHS.iter().filter(|(fact, _)| me.slot(fact).is_none()).map(|(_, path)| *path).collect()
    }

    fn slot(&mut self, fact: &str) -> &mut Option<String> {
        match fact {
            "instance-id" => &mut self.instance_id,
            "zone" => &mut self.zone,
            "region" => &mut self.region,
            "internal-ip" => &mut self.internal_ip,
            _ => &mut self.hostname,
        }
    }

    /// One fact that must be known (`fact` names it in the error).
    pub fn require(value: &Option<String>, fact: &'static str) -> Result<String, InstanceError> {
        value.clone().ok_or(InstanceError::Missing { fact })
    }

    /// The identity protokube needs: instance id, zone, region and internal IP, all known.
    pub fn identity(&self) -> Result<Identity, InstanceError> {
        Ok(Identity {
            instance_id: Self::require(&self.instance_id, "instance-id")?,
            zone: Self::require(&self.zone, "zone")?,
            region: Self::require(&self.region, "region")?,
            internal_ip: Self::require(&self.internal_ip, "internal-ip")?,
        })
    }
}

/// The facts IMDS gives, by name, and the path of each (under `/latest/meta-data/`).
const AWS_PATHS: [(&str, &str); 5] = [
    ("instance-id", "instance-id"),
    ("zone", "placement/availability-zone"),
    ("region", "placement/region"),
    ("internal-ip", "local-ipv4"),
    ("hostname", "local-hostname"),
];

/// The facts: the flags', then what `source` says of the rest.
pub async fn resolve<M: InstanceMetadata>(flags: &Overrides, source: Source<'_, M>) -> Result<InstanceFacts, InstanceError> {
    let mut facts = InstanceFacts::from_flags(flags);
    match source {
        Source::Flags => {}
        Source::Gce(md) => facts.fill_from_gce(&md.instance().await?),
        Source::Aws(imds) => {
            let mut answers = Vec::new();
            for path in facts.aws_paths_needed() {
                answers.push((path, imds.get(path).await?));
            }
            facts.fill_from_aws(|p| answers.iter().find(|(path, _)| *path == p).and_then(|(_, v)| v.clone()));
        }
    }
    Ok(facts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gce() -> Instance {
        Instance {
            project: "acme".into(),
            zone: "europe-west1-b".into(),
            name: "nodes-x".into(),
            id: "4471".into(),
            internal_ip: "10.0.16.7".into(),
            hostname: "nodes-x.europe-west1-b.c.acme.internal".into(),
        }
    }

    #[test]
    fn regions_of_zones_on_both_clouds() {
        for (zone, region) in [("eu-west-1b", "eu-west-1"), ("us-east-1a", "us-east-1"), ("europe-west1-b", "europe-west1"), ("local", "local")] {
            assert_eq!(region_of_zone(zone), region, "{zone}");
        }
    }

    #[test]
    fn gce_answers_fill_only_what_the_flags_left_unset() {
        let mut f = InstanceFacts::from_flags(&Overrides::default());
        f.fill_from_gce(&gce());
        let want = InstanceFacts {
            instance_id: Some("4471".into()),
            zone: Some("europe-west1-b".into()),
            region: Some("europe-west1".into()),
            internal_ip: Some("10.0.16.7".into()),
            hostname: Some("nodes-x".into()),
            project: Some("acme".into()),
            instance_name: Some("nodes-x".into()),
        };
        assert_eq!(f, want);
        let flags = Overrides { zone: Some("europe-west1-c".into()), hostname: Some("given".into()), ..Default::default() };
        let mut f = InstanceFacts::from_flags(&flags);
        f.fill_from_gce(&gce());
        assert_eq!((f.zone.as_deref(), f.region.as_deref(), f.hostname.as_deref()), (Some("europe-west1-c"), Some("europe-west1"), Some("given")));
    }

    #[test]
    fn imds_answers_fill_only_what_the_flags_left_unset() {
        let imds = |p: &str| {
            let v = match p {
                "instance-id" => "i-0abc\n",
                "placement/availability-zone" => "eu-west-1b",
                "local-ipv4" => "172.20.64.10",
                "local-hostname" => "ip-172-20-64-10.eu-west-1.compute.internal",
                _ => return None,
            };
            Some(v.to_string())
        };
        let mut f = InstanceFacts::from_flags(&Overrides::default());
        assert_eq!(f.aws_paths_needed(), ["instance-id", "placement/availability-zone", "placement/region", "local-ipv4", "local-hostname"]);
        f.fill_from_aws(imds);
        assert_eq!(f.instance_id.as_deref(), Some("i-0abc"), "trimmed");
        assert_eq!(f.region.as_deref(), Some("eu-west-1"), "older IMDS has no placement/region: the zone's region");
        assert_eq!(
            f.identity().expect("identity"),
            Identity { instance_id: "i-0abc".into(), zone: "eu-west-1b".into(), region: "eu-west-1".into(), internal_ip: "172.20.64.10".into() }
        );
        let flags = Overrides { instance_id: Some("i-x".into()), internal_ip: Some("10.0.0.1".into()), ..Default::default() };
        let mut f = InstanceFacts::from_flags(&flags);
        assert_eq!(f.aws_paths_needed(), ["placement/availability-zone", "placement/region", "local-hostname"], "flags are not asked for");
        f.fill_from_aws(imds);
        assert_eq!((f.instance_id.as_deref(), f.internal_ip.as_deref()), (Some("i-x"), Some("10.0.0.1")));
    }

    #[test]
    fn a_missing_fact_is_named() {
        let f = InstanceFacts { instance_id: Some("i-1".into()), zone: Some("eu-west-1a".into()), region: Some("eu-west-1".into()), ..Default::default() };
        let e = f.identity().expect_err("no internal ip");
        assert_eq!(e.to_string(), "instance internal-ip: neither its flag nor the metadata service gave it");
    }
}
