//! The DNS builder: the control plane's A records (placeholders protokube keeps at the live
//! members' addresses) and, with an API load balancer, the alias records that point at it.

use super::load_balancer::ApiLoadBalancer;
use super::{Context, Dns};
use crate::aws::{self, DnsRecord, RecordTarget};

/// The cluster's DNS (`None` for gossip clusters and `topology.dns.type: None`); its record tasks
/// go to `tasks` (AWS).
pub fn build(cx: &Context<'_>, lb: Option<&ApiLoadBalancer>, tasks: Option<&mut aws::Tasks>) -> Option<Dns> {
    let (cluster, spec) = (cx.cluster, cx.spec);
    let keelson_api::plan::ClusterDns::Zone { private } = keelson_api::plan::cluster_dns(cluster, spec) else {
        return None;
    };
    // kops-controller.internal: where workers join (protokube keeps it at the control planes'
    // addresses, even when api.internal is an alias to the load balancer).
    let mut records = vec![format!("api.{cluster}"), format!("api.internal.{cluster}"), format!("kops-controller.internal.{cluster}")];
    for etcd in spec.etcd_clusters.iter().flatten() {
        let ename = etcd.name.clone().unwrap_or_default();
        let prefix = if ename == "main" { "etcd".to_string() } else { format!("etcd-{ename}") };
        for m in etcd.etcd_members.iter().flatten() {
            records.push(format!("{prefix}-{}.internal.{cluster}", m.name.clone().unwrap_or_default()));
        }
    }
    if let Some(public) = &spec.master_public_name {
        if !records.contains(public) {
            records[0] = public.clone();
        }
    }
    records.sort();
    records.dedup();
    // With a load balancer the public API name is an alias to it (protokube leaves it alone).
    let mut aliases = Vec::new();
    if let Some(lb) = lb {
        let public = spec.master_public_name.clone().unwrap_or_else(|| format!("api.{cluster}"));
        records.retain(|r| r != &public);
        aliases.push(public);
        if lb.use_for_internal_api {
            let internal = format!("api.internal.{cluster}");
            records.retain(|r| r != &internal);
            aliases.push(internal);
        }
    }
    if let Some(tasks) = tasks {
        for name in records {
            tasks.push(DnsRecord::placeholder(name));
        }
        if let Some(lb) = lb {
            for name in aliases {
                tasks.push(DnsRecord { name, target: RecordTarget::Alias(lb.link.clone()) });
            }
        }
    }
    Some(Dns { zone: spec.dns_zone.clone(), private })
}
