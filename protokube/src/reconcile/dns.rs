//! DNS: the records the control plane's names should have (from which live instance holds each
//! member's volume), diffed against what is there ([`route53_changes`], pure) and applied as one
//! batched change, or written to the hosts file.

use std::collections::{BTreeMap, BTreeSet};

use cloud::dns::{Dns, Record, RecordChange};
use cloud::volumes::{Instance, Instances, Volume, Volumes};

use super::volumes::{etcd_role, live_holder};
use super::{Agent, ReconcileError, Report, PLACEHOLDER, TTL};
use keelson_api::nodeup::{ApiServers, API_SERVERS_KEY};

use crate::config::{DnsMode, Plan};
use crate::hosts;

/// name → addresses (`None`: no live owner known). A member's owner is the live instance holding
/// its volume, and only when the cloud made that instance for the member's own (control-plane)
/// instance group ([`crate::config::made_for_group`]): a volume attached to a worker, or to any instance made
/// otherwise, names nobody, so neither the member's name nor the API's ever points at it.
pub fn desired_records(plan: &Plan, vols: &[Volume], instances: &BTreeMap<String, Instance>) -> BTreeMap<String, Option<Vec<String>>> {
    let cluster = &plan.cluster_name;
    let mut out: BTreeMap<String, Option<Vec<String>>> = BTreeMap::new();
    let mut api_private: BTreeSet<String> = BTreeSet::new();
    let mut api_public: BTreeSet<String> = BTreeSet::new();
    for ec in &plan.etcd_clusters {
        for m in &ec.members {
            let holder = vols.iter().filter(|v| etcd_role(v, ec).as_deref() == Some(m.name.as_str())).find_map(|v| live_holder(v, instances));
            let holder = match holder {
                Some(i) if !crate::config::made_for_group(plan, &m.instance_group, i) => {
                    tracing::warn!(
                        etcd = %ec.name, member = %m.name, instance = %i.id, made_for = ?i.group, group = %m.instance_group,
                        "an etcd volume is held by an instance not of its member's control-plane group: no DNS record names it"
                    );
                    None
                }
                other => other,
            };
            let ip = holder.and_then(|i| i.private_ip.clone());
            if ec.name == "main" {
                if let Some(i) = holder {
                    api_private.extend(i.private_ip.clone());
                    api_public.extend(i.public_ip.clone());
                }
            }
            out.insert(ec.member_dns(&m.name, cluster), ip.map(|ip| vec![ip]));
        }
    }
    let some = |s: BTreeSet<String>| (!s.is_empty()).then(|| s.into_iter().collect::<Vec<_>>());
    // The public name only in a real zone; the hosts file carries the internal names.
    if plan.manage_public_api && plan.dns != DnsMode::Hosts {
        let public = if api_public.is_empty() { api_private.clone() } else { api_public };
        out.insert(plan.api_public(), some(public));
    }
    // Where workers join (the join server runs on every control plane): always the control
    // planes themselves, even when `api.internal` is an alias to the API load balancer (443 only).
    out.insert(plan.kops_controller_internal(), some(api_private.clone()));
    if plan.manage_internal_api {
        out.insert(plan.api_internal(), some(api_private));
    }
    out
}

impl<C: Volumes + Instances + Sync, D: Dns + Sync> Agent<C, D> {
    /// [`desired_records`] of this agent's plan.
    pub fn desired_records(&self, vols: &[Volume], instances: &BTreeMap<String, Instance>) -> BTreeMap<String, Option<Vec<String>>> {
        desired_records(&self.plan, vols, instances)
    }

    pub(super) async fn sync_dns(&mut self, vols: &[Volume], instances: &BTreeMap<String, Instance>, report: &mut Report) -> Result<usize, ReconcileError> {
        let desired = self.desired_records(vols, instances);
        match &self.plan.dns {
            DnsMode::Hosts => {
                let api_servers = desired.get(&self.plan.kops_controller_internal()).cloned().flatten();
                let entries: hosts::Entries = desired.into_iter().filter_map(|(n, ips)| Some((n, ips?))).collect();
                let (path, pods) = (self.opts.hosts_file.clone(), crate::paths::under(&self.opts.root, crate::paths::KUBELET_PODS_DIR));
                let (changed, copies) = tokio::task::spawn_blocking(move || {
                    let changed = hosts::update(&path, &entries)?;
                    Ok::<_, hosts::HostsError>((changed, hosts::update_pod_copies(&pods, &entries)))
                })
                .await
                .map_err(|e| ReconcileError::Io { path: "hosts".into(), source: std::io::Error::other(e) })??;
                let (copies_changed, copy_errors) = copies;
                for c in &copies_changed {
                    tracing::info!(copy = %c.display(), "a host-network pod's hosts file follows the managed block");
                }
                for e in copy_errors {
                    report.waiting.push(format!("a pod's copy of the hosts file: {e}"));
                }
                if let Some(addresses) = api_servers {
                    self.publish_api_servers(addresses, report).await;
                }
                Ok(changed.len())
            }
            DnsMode::Zone { zone, private } => {
                let Some(dns) = &self.dns else {
                    report.waiting.push("Route53 provider not configured".into());
                    return Ok(0);
                };
                let zone_id = match &self.zone_id {
                    Some(z) => z.clone(),
                    None => {
                        let z = dns.find_zone_with(zone.as_deref(), &self.plan.cluster_name, Some(*private)).await?;
                        self.zone_id = Some(z.clone());
                        z
                    }
                };
                let existing: BTreeMap<String, Record> =
                    dns.list_records(&zone_id, &self.plan.cluster_name).await?.into_iter().filter(|r| r.rtype == "A").map(|r| (r.name.clone(), r)).collect();
                let changes = route53_changes(&desired, &existing);
                if changes.is_empty() {
                    return Ok(0);
                }
                match dns.apply_changes(&zone_id, &changes).await {
                    Ok(_) => Ok(changes.len()),
                    Err(e) if changes.len() > 1 => {
                        // One bad record must not block the others: retry one by one, report the bad ones.
                        tracing::warn!(error = %e, "batched DNS change failed; applying records one by one");
                        let mut done = 0;
                        for c in &changes {
                            match dns.apply_changes(&zone_id, std::slice::from_ref(c)).await {
                                Ok(_) => done += 1,
                                Err(e) => report.waiting.push(format!("DNS change {c:?}: {e}")),
                            }
                        }
                        Ok(done)
                    }
                    Err(e) => Err(e.into()),
                }
            }
        }
    }
}

impl<C: Volumes + Instances + Sync, D: Dns + Sync> Agent<C, D> {
    /// Keep [`API_SERVERS_KEY`] at the live API servers' private addresses (hosts DNS only): how
    /// workers, which have no DNS records to ask and may read `igconfig/node/` but not the cloud,
    /// find `api.internal` and the join server after control planes are replaced. Written only
    /// when it differs (every control plane compares what it sees with what is stored, so the
    /// object follows the cloud whichever of them writes); never with no address at all.
    async fn publish_api_servers(&self, addresses: Vec<String>, report: &mut Report) {
        let Some(want) = api_servers_document(&addresses, report) else { return };
        let stored = match self.opts.store.get(API_SERVERS_KEY).await {
            Ok(bytes) => bytes.and_then(|b| serde_yaml_ng::from_slice::<ApiServers>(&b).ok()),
            Err(e) => {
                report.waiting.push(format!("reading {API_SERVERS_KEY}: {e}"));
                return;
            }
        };
        if stored.as_ref() == Some(&want) {
            return;
        }
        let text = match serde_yaml_ng::to_string(&want) {
            Ok(t) => t,
            Err(e) => {
                report.waiting.push(format!("{API_SERVERS_KEY}: {e}"));
                return;
            }
        };
        match self.opts.store.put(API_SERVERS_KEY, text.as_bytes()).await {
            Ok(()) => tracing::info!(key = API_SERVERS_KEY, addresses = ?want.addresses, "published the API servers' addresses for the workers"),
            Err(e) => report.waiting.push(format!("writing {API_SERVERS_KEY}: {e}")),
        }
    }
}

/// The document workers read from what the cloud says the live control planes' private addresses
/// are: IP addresses only, sorted, each once (workers put them into their hosts file). An address
/// that is not an IP is left out and reported; `None` when none is left.
fn api_servers_document(addresses: &[String], report: &mut Report) -> Option<ApiServers> {
    let mut ips = Vec::new();
    for a in addresses {
        match a.parse::<std::net::IpAddr>() {
            Ok(ip) => ips.push(ip),
            Err(_) => report
                .waiting
                .push(format!("{API_SERVERS_KEY}: {a:?}, a control plane's private address as the cloud reports it, is not an IP address: left out")),
        }
    }
    ips.sort();
    ips.dedup();
    (!ips.is_empty()).then_some(ApiServers { addresses: ips })
}

/// The UPSERTs that make Route53 match `desired`: real addresses replace whatever is there (including
/// the placeholder); a name without a known owner gets the placeholder only if it has no record yet.
pub fn route53_changes(desired: &BTreeMap<String, Option<Vec<String>>>, existing: &BTreeMap<String, Record>) -> Vec<RecordChange> {
    let mut out = Vec::new();
    for (name, want) in desired {
        let values = match (want, existing.get(name)) {
            (Some(ips), _) => ips.clone(),
            (None, Some(_)) => continue,
            (None, None) => vec![PLACEHOLDER.to_string()],
        };
        let rec = Record { name: name.clone(), rtype: "A".into(), ttl: TTL, values };
        if existing.get(name) != Some(&rec) {
            out.push(RecordChange::Upsert(rec));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(name: &str, values: &[&str], ttl: i64) -> Record {
        Record { name: name.into(), rtype: "A".into(), ttl, values: values.iter().map(|s| s.to_string()).collect() }
    }

    /// The compiler's plan for cp-a of a three-member cluster with a DNS zone and no API load balancer.
    fn plan() -> Plan {
        let mut spec = String::from(
            "apiVersion: kops.k8s.io/v1alpha2\nkind: Cluster\nmetadata:\n  name: c.example.com\nspec:\n  configBase: s3://b/c.example.com\n  etcdClusters:\n",
        );
        for name in ["main", "events"] {
            spec.push_str(&format!("  - name: {name}\n    version: 3.5.21\n    etcdMembers:\n"));
            for m in ["a", "b", "c"] {
                spec.push_str(&format!("    - name: {m}\n      instanceGroup: cp-{m}\n"));
            }
        }
        let cluster = keelson_api::parse_documents(spec.as_bytes()).expect("spec").cluster;
        let plan = spec_compiler::protokube_config::build(&cluster, "cp-a", &table_versions()).expect("plan");
        assert_eq!((plan.dns.clone(), plan.manage_public_api, plan.manage_internal_api), (DnsMode::Zone { zone: None, private: false }, true, true));
        plan
    }

    fn held(etcd: &str, member: &str, instance: &str) -> Volume {
        use cloud::volumes::{Attachment, AttachmentState, VolumeState};
        Volume {
            id: format!("vol-{etcd}-{member}"),
            zone: "z".into(),
            state: VolumeState::InUse,
            size_gib: 20,
            tags: [(format!("k8s.io/etcd/{etcd}"), format!("{member}/a,b,c"))].into_iter().collect(),
            attachments: vec![Attachment { instance_id: instance.into(), device: "/dev/xvdu".into(), state: AttachmentState::Attached }],
        }
    }

    fn running(id: &str, ip: &str, zone: &str, group: Option<String>) -> (String, Instance) {
        use cloud::volumes::InstanceState;
        let i = Instance {
            id: id.into(),
            state: InstanceState::Running,
            zone: Some(zone.into()),
            private_ip: Some(ip.into()),
            public_ip: None,
            devices: vec![],
            group,
        };
        (id.to_string(), i)
    }

    /// Only an instance the cloud made for the member's own control-plane group gets the member's
    /// and the API's names: a worker (or a hand-made instance) holding an etcd volume gets none.
    #[test]
    fn only_control_plane_instances_get_etcd_and_api_records() {
        let plan = plan();
        let asg = |g: &str| Some(keelson_api::names::autoscaling_group_name(g, "c.example.com"));
        let instances: BTreeMap<String, Instance> = [
            running("i-cp-a", "10.0.0.1", "eu-west-1a", asg("cp-a")),
            running("i-worker", "10.0.0.66", "eu-west-1b", asg("nodes")),
            running("i-handmade", "10.0.0.67", "eu-west-1c", None),
            running(
                "gce-cp-c",
                "10.0.0.3",
                "europe-west1-c",
                Some(keelson_api::names::gce_instance_group_manager_name("europe-west1-c", "cp-c", "c.example.com")),
            ),
            running("i-cp-b", "10.0.0.2", "eu-west-1b", asg("cp-b")),
        ]
        .into_iter()
        .collect();
        let vols = [
            held("main", "a", "i-cp-a"),
            held("main", "b", "i-worker"),
            held("events", "b", "i-cp-b"),
            held("events", "a", "i-handmade"),
            held("main", "c", "gce-cp-c"),
            held("events", "c", "i-cp-b"),
        ];
        let got = desired_records(&plan, &vols, &instances);
        let ip = |s: &str| Some(vec![s.to_string()]);
        assert_eq!(got["etcd-a.internal.c.example.com"], ip("10.0.0.1"));
        assert_eq!(got["etcd-b.internal.c.example.com"], None, "a worker holds it");
        assert_eq!(got["etcd-events-a.internal.c.example.com"], None, "an instance no group made holds it");
        assert_eq!(got["etcd-events-b.internal.c.example.com"], ip("10.0.0.2"));
        assert_eq!(got["etcd-c.internal.c.example.com"], ip("10.0.0.3"), "GCE: the member's MIG made it");
        assert_eq!(got["etcd-events-c.internal.c.example.com"], None, "another control-plane group's instance");
        let api = Some(vec!["10.0.0.1".to_string(), "10.0.0.3".to_string()]);
        for name in ["api.c.example.com", "api.internal.c.example.com", "kops-controller.internal.c.example.com"] {
            assert_eq!(got[name], api, "{name}: never the worker's 10.0.0.66");
        }
        // Every name written is one the control planes' Route53 policy lets them write.
        let patterns = keelson_api::names::protokube_record_patterns("c.example.com");
        for name in got.keys() {
            assert!(patterns.iter().any(|p| testkit::iam_oracle::glob(p, name, false)), "{name} is outside {patterns:?}");
        }
    }

    #[test]
    fn only_ip_addresses_are_published_for_the_workers() {
        let mut report = Report::default();
        let got = api_servers_document(
            &["172.20.64.5".into(), "10.0.0.1\n10.6.6.6 kubernetes.default".into(), "172.20.32.4".into(), "172.20.64.5".into()],
            &mut report,
        );
        let want: Vec<std::net::IpAddr> = ["172.20.32.4", "172.20.64.5"].iter().map(|a| a.parse().expect("ip")).collect();
        assert_eq!(got, Some(ApiServers { addresses: want }));
        assert_eq!(report.waiting.len(), 1, "{:?}", report.waiting);
        assert!(report.waiting[0].contains("kubernetes.default") && report.waiting[0].contains(API_SERVERS_KEY), "{:?}", report.waiting);
        assert_eq!(api_servers_document(&["ip-10-0-0-1.internal".into()], &mut Report::default()), None, "nothing left: nothing published");
    }

    #[test]
    fn route53_changes_fill_placeholders_and_replace_stale() {
        let desired: BTreeMap<String, Option<Vec<String>>> = [
            ("up-to-date".to_string(), Some(vec!["10.0.0.1".to_string()])),
            ("stale".to_string(), Some(vec!["10.0.0.2".to_string()])),
            ("placeholder-now-known".to_string(), Some(vec!["10.0.0.3".to_string()])),
            ("unknown-missing".to_string(), None),
            ("unknown-existing".to_string(), None),
            ("wrong-ttl".to_string(), Some(vec!["10.0.0.4".to_string()])),
        ]
        .into_iter()
        .collect();
        let existing: BTreeMap<String, Record> = [
            rec("up-to-date", &["10.0.0.1"], 60),
            rec("stale", &["10.9.9.9"], 60),
            rec("placeholder-now-known", &[PLACEHOLDER], 60),
            rec("unknown-existing", &["10.0.0.7"], 60),
            rec("wrong-ttl", &["10.0.0.4"], 300),
        ]
        .into_iter()
        .map(|r| (r.name.clone(), r))
        .collect();
        let got = route53_changes(&desired, &existing);
        let want = vec![
            RecordChange::Upsert(rec("placeholder-now-known", &["10.0.0.3"], 60)),
            RecordChange::Upsert(rec("stale", &["10.0.0.2"], 60)),
            RecordChange::Upsert(rec("unknown-missing", &[PLACEHOLDER], 60)),
            RecordChange::Upsert(rec("wrong-ttl", &["10.0.0.4"], 60)),
        ];
        assert_eq!(got, want);
    }

    /// The versions table of a Kubernetes version the specs here do not name (no mirrors).
    fn table_versions() -> spec_compiler::versions::Versions {
        spec_compiler::versions::Versions::for_kubernetes(&"1.34.4".parse().expect("version"), &Default::default()).expect("versions")
    }
}
