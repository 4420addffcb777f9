//! Semantic validation of a parsed spec. Reports every problem found, each naming the
//! document and the field path (`Cluster/x.example.com: spec.subnets[us-east-1a].cidr: …`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::documents::{Documents, InstanceGroup, Role};
use crate::types::{Cidr, CloudProvider, DnsName};

/// One problem in a spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationError {
    /// `Cluster/<name>` or `InstanceGroup/<name>`.
    pub document: String,
    /// Field path inside the document, e.g. `spec.etcdClusters[main].etcdMembers[a].instanceGroup`.
    pub path: String,
    pub message: String,
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}: {}: {}", self.document, self.path, self.message)
    }
}

/// The region of an AWS availability zone, kOps' rule: the zone without its last letter
/// (`us-east-1a` → `us-east-1`, local zone `us-west-2-lax-1a` → `us-west-2-lax-1`). `None` when the
/// name is not a region (ASCII, ending in a digit) followed by one lowercase ASCII letter.
pub fn aws_region_of_zone(zone: &str) -> Option<&str> {
    let region = zone.strip_suffix(|c: char| c.is_ascii_lowercase())?;
    let well_formed = region.ends_with(|c: char| c.is_ascii_digit())
        && region.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && region.contains('-');
    well_formed.then_some(region)
}

/// Cloud providers kOps knows.
pub const CLOUD_PROVIDERS: &[&str] = &[
    CloudProvider::Aws.as_str(),
    CloudProvider::Gce.as_str(),
    CloudProvider::Hetzner.as_str(),
    CloudProvider::OpenStack.as_str(),
    CloudProvider::DigitalOcean.as_str(),
    CloudProvider::Azure.as_str(),
    CloudProvider::Scaleway.as_str(),
    CloudProvider::Metal.as_str(),
];

/// Whether `arn` is a target group's ARN (kOps' check: an ELB ARN whose resource is
/// `targetgroup/NAME/ID`, the name at most 32 characters).
fn is_target_group_arn(arn: &str) -> bool {
    let parts: Vec<&str> = arn.splitn(6, ':').collect();
    let [prefix, partition, service, _region, _account, resource] = parts[..] else { return false };
    let resource: Vec<&str> = resource.split('/').collect();
    prefix == "arn"
        && !partition.is_empty()
        && service == "elasticloadbalancing"
        && matches!(resource[..], ["targetgroup", name, id] if !name.is_empty() && name.len() <= 32 && !id.is_empty())
}

struct Report {
    errors: Vec<ValidationError>,
}

impl Report {
    fn add(&mut self, document: &str, path: impl Into<String>, message: impl Into<String>) {
        self.errors.push(ValidationError { document: document.to_string(), path: path.into(), message: message.into() });
    }
}

/// Check a spec; an empty result means it is valid.
pub fn validate(docs: &Documents) -> Vec<ValidationError> {
    let mut r = Report { errors: Vec::new() };
    let cluster = &docs.cluster;
    let cname = cluster.name();
    let cdoc = format!("Cluster/{cname}");
    let spec = &cluster.spec;
    sysctl_lines(&mut r, &cdoc, spec.sysctl_parameters.as_deref());
    let containerd = std::iter::once((cdoc.clone(), spec.containerd.as_ref()))
        .chain(docs.instance_groups.iter().map(|ig| (format!("InstanceGroup/{}", ig.name()), ig.spec.containerd.as_ref())));
    for (doc, c) in containerd {
        for key in c.and_then(|c| c.config_additions.as_ref()).into_iter().flat_map(|a| a.keys()) {
            if let Err(why) = crate::nodeup::config_addition_path(key) {
                r.add(&doc, format!("spec.containerd.configAdditions[{key}]"), why);
            }
        }
    }

    match cluster.metadata.name.as_deref() {
        None | Some("") => r.add(&cdoc, "metadata.name", "required: the cluster's DNS name"),
        Some(n) => {
            if let Err(e) = n.parse::<DnsName>() {
                r.add(&cdoc, "metadata.name", e.to_string());
            }
        }
    }
    if spec.kubernetes_version.is_none() {
        r.add(&cdoc, "spec.kubernetesVersion", "required: a Kubernetes release such as 1.34.2");
    }
    match spec.cloud_provider.as_deref() {
        None => r.add(&cdoc, "spec.cloudProvider", format!("required: one of {}", CLOUD_PROVIDERS.join(", "))),
        Some(c) if !CLOUD_PROVIDERS.contains(&c) => {
            r.add(&cdoc, "spec.cloudProvider", format!("unknown cloud {c:?}: expected one of {}", CLOUD_PROVIDERS.join(", ")))
        }
        Some(_) => {}
    }
    // How workers join (token mode on AWS and GCE only with its opt-in): one rule, here for
    // validate, compile and apply alike.
    let identity_cloud = crate::nodeup::joins_by_cloud_identity(spec.cloud_provider.as_deref());
    if let Err(e) = crate::nodeup::node_bootstrap_method(cluster.metadata.annotations.as_ref(), identity_cloud) {
        r.add(&cdoc, e.field(), e.to_string());
    }
    // The in-cluster cloud clients' endpoints carry their credentials: plain http:// only to
    // loopback or to hosts the operator allows (`KEELSON_ALLOW_PLAIN_HTTP`, a local cloud).
    let aws_field = format!("metadata.annotations[{}]", crate::aws_endpoints::ANNOTATION);
    match crate::aws_endpoints::service_endpoints(cluster) {
        Err(e) => r.add(&cdoc, aws_field, e),
        Ok(endpoints) => {
            for (service, url) in endpoints {
                if let Err(e) = crate::plain_http::check(&service, &url) {
                    r.add(&cdoc, aws_field.clone(), e.to_string());
                }
            }
        }
    }
    let gce_field = format!("metadata.annotations[{}]", crate::gce_endpoints::ANNOTATION);
    match crate::gce_endpoints::compute_base(cluster) {
        Err(e) => r.add(&cdoc, gce_field, e),
        Ok(Some(base)) => {
            if let Err(e) = crate::plain_http::check("Compute endpoint", &base) {
                r.add(&cdoc, gce_field, e.to_string());
            }
        }
        Ok(None) => {}
    }
    if let Some(zone) = spec.dns_zone.as_deref() {
        let is_id = zone.chars().all(|c| c.is_ascii_alphanumeric()) && zone.chars().any(|c| c.is_ascii_uppercase());
        if !is_id && zone.trim_end_matches('.').parse::<DnsName>().is_err() {
            r.add(&cdoc, "spec.dnsZone", format!("{zone:?} is neither a hosted-zone id nor a DNS name"));
        }
    }
    let sa_perms = spec.iam.as_ref().and_then(|i| i.service_account_external_permissions.as_deref()).unwrap_or_default();
    service_account_permissions(&mut r, &cdoc, sa_perms, crate::addon_roles::on_own_roles(spec));
    if !sa_perms.is_empty() && spec.cloud_provider.as_deref().is_some_and(|c| c != "aws") {
        r.add(&cdoc, "spec.iam.serviceAccountExternalPermissions", "IAM roles for service accounts are made on AWS only (kOps too); remove them on this cloud");
    }
    if spec.iam.as_ref().and_then(|i| i.use_service_account_external_permissions) == Some(true) && spec.cloud_provider.as_deref().is_some_and(|c| c != "aws") {
        r.add(
            &cdoc,
            "spec.iam.useServiceAccountExternalPermissions",
            "Keelson's addons get roles of their own on AWS only (kOps too); remove it on this cloud",
        );
    }
    for (path, value) in [("spec.masterPublicName", &spec.master_public_name), ("spec.masterInternalName", &spec.master_internal_name)] {
        if let Some(v) = value {
            if let Err(e) = v.parse::<DnsName>() {
                r.add(&cdoc, path, e.to_string());
            }
        }
    }

    // Networks.
    let network = spec.network_cidr;
    let mut networks: Vec<Cidr> = network.into_iter().collect();
    for (i, extra) in spec.additional_network_cidrs.iter().flatten().enumerate() {
        match extra.parse::<Cidr>() {
            Ok(c) => networks.push(c),
            Err(e) => r.add(&cdoc, format!("spec.additionalNetworkCIDRs[{i}]"), e.to_string()),
        }
    }
    // AmazonVPC networking gives pods addresses from the VPC itself, so there the ranges coincide.
    let vpc_native = spec.networking.as_ref().is_some_and(|n| n.amazonvpc.is_some());
    if let (Some(nm), Some(net)) = (spec.non_masquerade_cidr, network) {
        if nm.overlaps(&net) && !nm.is_ipv6() && !vpc_native {
            r.add(&cdoc, "spec.nonMasqueradeCIDR", format!("{nm} overlaps networkCIDR {net}: pod and service addresses must not collide with the network"));
        }
    }
    if let Some(svc) = spec.service_cluster_ip_range {
        if let Some(net) = networks.iter().find(|n| n.overlaps(&svc)) {
            r.add(&cdoc, "spec.serviceClusterIPRange", format!("{svc} overlaps the network {net}"));
        }
        if let Some(nm) = spec.non_masquerade_cidr {
            if !nm.is_ipv6() && !svc.is_ipv6() && !nm.contains(&svc) {
                r.add(&cdoc, "spec.serviceClusterIPRange", format!("{svc} must lie inside nonMasqueradeCIDR {nm}"));
            }
        }
    }
    if let Some(pod) = spec.pod_cidr {
        if let Some(net) = networks.iter().find(|n| n.overlaps(&pod)) {
            r.add(&cdoc, "spec.podCIDR", format!("{pod} overlaps the network {net}"));
        }
    }

    // Subnets.
    let mut subnet_zones: BTreeMap<String, Option<String>> = BTreeMap::new();
    for (i, subnet) in spec.subnets.iter().flatten().enumerate() {
        let key = subnet.name.clone().unwrap_or_else(|| i.to_string());
        let path = format!("spec.subnets[{key}]");
        match subnet.name.as_deref() {
            None | Some("") => r.add(&cdoc, format!("{path}.name"), "required"),
            Some(n) => {
                if subnet_zones.insert(n.to_string(), subnet.zone.clone()).is_some() {
                    r.add(&cdoc, format!("{path}.name"), format!("duplicate subnet name {n:?}"));
                }
            }
        }
        if spec.cloud_provider.as_deref() == Some("aws") {
            if let Some(z) = subnet.zone.as_deref() {
                if aws_region_of_zone(z).is_none() {
                    r.add(&cdoc, format!("{path}.zone"), format!("{z:?} is not an AWS availability zone (a region followed by one letter, e.g. us-east-1a)"));
                }
            }
        }
        if let Some(text) = subnet.cidr.as_deref() {
            match text.parse::<Cidr>() {
                Ok(c) => {
                    if !networks.is_empty() && !networks.iter().any(|n| n.contains(&c)) {
                        let nets: Vec<String> = networks.iter().map(|n| n.to_string()).collect();
                        r.add(&cdoc, format!("{path}.cidr"), format!("{c} is not inside networkCIDR {}", nets.join(", ")));
                    }
                }
                Err(e) => r.add(&cdoc, format!("{path}.cidr"), e.to_string()),
            }
        }
        if let Some(t) = subnet.type_.as_deref() {
            if !["Public", "Private", "Utility", "DualStack"].contains(&t) {
                r.add(&cdoc, format!("{path}.type"), format!("unknown subnet type {t:?}: expected Public, Private, Utility or DualStack"));
            }
        }
    }

    // Addons (kOps' rules for their fields).
    for (path, message) in crate::addon_rules::check(spec) {
        r.add(&cdoc, path, message);
    }
    let dns_type = crate::plan::dns_type(spec);
    if let Some(t) = dns_type.filter(|t| !crate::plan::DNS_TYPES.contains(t)) {
        r.add(&cdoc, "spec.topology.dns.type", format!("unknown DNS type {t:?}: expected one of {} (spelt so)", crate::plan::DNS_TYPES.join(", ")));
    }
    if spec.external_dns.as_ref().and_then(|e| e.provider.as_deref()) == Some("external-dns") && crate::nodeup::uses_hosts_dns(docs.cluster.name(), dns_type) {
        r.add(
            &cdoc,
            "spec.externalDns.provider",
            "external-dns writes records into the cluster's hosted zone, and a gossip cluster (a .k8s.local name or topology.dns.type None) has none: use dns-controller (the default) or none",
        );
    }

    // Instance groups.
    let mut groups: BTreeMap<&str, &InstanceGroup> = BTreeMap::new();
    for ig in &docs.instance_groups {
        let name = ig.name();
        let doc = format!("InstanceGroup/{name}");
        if name.is_empty() {
            r.add(&doc, "metadata.name", "required");
        } else if name.parse::<DnsName>().is_err() {
            r.add(&doc, "metadata.name", format!("{name:?} is not a valid instance group name: lower-case letters, digits, '-' and '.'"));
        }
        if groups.insert(name, ig).is_some() {
            r.add(&doc, "metadata.name", format!("duplicate instance group name {name:?}"));
        }
        if let Some(owner) = ig.metadata.labels.as_ref().and_then(|l| l.get("kops.k8s.io/cluster")) {
            if owner != cname {
                r.add(&doc, "metadata.labels[kops.k8s.io/cluster]", format!("labelled for cluster {owner:?}, not {cname:?}"));
            }
        }
        match ig.spec.role.as_deref() {
            None => r.add(&doc, "spec.role", "required: one of Master, ControlPlane, Node, APIServer, Bastion"),
            Some(role) if Role::parse(role).is_none() => {
                r.add(&doc, "spec.role", format!("unknown role {role:?}: expected Master, ControlPlane, Node, APIServer or Bastion"))
            }
            Some(_) => {}
        }
        let (min, max) = (ig.spec.min_size, ig.spec.max_size);
        if let Some(m) = min.filter(|m| *m < 0) {
            r.add(&doc, "spec.minSize", format!("{m} is negative"));
        }
        if let Some(m) = max.filter(|m| *m < 0) {
            r.add(&doc, "spec.maxSize", format!("{m} is negative"));
        }
        if let (Some(a), Some(b)) = (min, max) {
            if a > b {
                r.add(&doc, "spec.minSize", format!("minSize {a} is larger than maxSize {b}"));
            }
        }
        if ig.spec.root_volume_encryption_key.as_deref().is_some_and(|k| !k.is_empty()) && ig.spec.root_volume_encryption == Some(false) {
            r.add(&doc, "spec.rootVolumeEncryptionKey", "a KMS key for a root volume that rootVolumeEncryption: false leaves unencrypted: remove one of them");
        }
        sysctl_lines(&mut r, &doc, ig.spec.sysctl_parameters.as_deref());
        // The root volume's type is the cloud's own word for a disk: on GCE an EBS type would be a
        // disk type GCE refuses, on AWS a GCE type a volume type EC2 refuses.
        if let Some(t) = ig.spec.root_volume_type.as_deref() {
            match spec.cloud_provider.as_deref() {
                Some("gce") if EBS_VOLUME_TYPES.contains(&t) => r.add(
                    &doc,
                    "spec.rootVolumeType",
                    format!("{t:?} is an EBS volume type; on GCE expected a disk type (pd-standard, pd-balanced, pd-ssd, hyperdisk-balanced, …)"),
                ),
                Some("aws") if !EBS_VOLUME_TYPES.contains(&t) => {
                    r.add(&doc, "spec.rootVolumeType", format!("{t:?}: expected an EBS volume type ({})", EBS_VOLUME_TYPES.join(", ")))
                }
                _ => {}
            }
        }
        for (i, lb) in ig.spec.external_load_balancers.iter().flatten().enumerate() {
            let path = format!("spec.externalLoadBalancers[{i}]");
            match (lb.load_balancer_name.as_deref(), lb.target_group_arn.as_deref()) {
                (Some(_), Some(_)) => r.add(&doc, path, "set loadBalancerName (a classic load balancer) or targetGroupArn (a target group), not both"),
                (None, None) => r.add(&doc, path, "expected loadBalancerName (a classic load balancer) or targetGroupArn (a target group)"),
                (Some(n), None) if n.is_empty() || n.len() > 32 => {
                    r.add(&doc, format!("{path}.loadBalancerName"), format!("{n:?}: expected a classic load balancer's name, 1 to 32 characters"))
                }
                (None, Some(arn)) if !is_target_group_arn(arn) => r.add(
                    &doc,
                    format!("{path}.targetGroupArn"),
                    format!("{arn:?}: expected a target group's ARN, arn:PARTITION:elasticloadbalancing:REGION:ACCOUNT:targetgroup/NAME/ID"),
                ),
                _ => {}
            }
        }
        for (i, s) in ig.spec.subnets.iter().flatten().enumerate() {
            if !subnet_zones.contains_key(s) {
                r.add(&doc, format!("spec.subnets[{i}]"), format!("no subnet named {s:?} in Cluster/{cname} spec.subnets"));
            }
        }
    }

    // etcd clusters.
    let mut etcd_names = BTreeSet::new();
    for (i, etcd) in spec.etcd_clusters.iter().flatten().enumerate() {
        let ename = etcd.name.clone().unwrap_or_else(|| i.to_string());
        let path = format!("spec.etcdClusters[{ename}]");
        if etcd.name.as_deref().unwrap_or("").is_empty() {
            r.add(&cdoc, format!("{path}.name"), "required");
        } else if !etcd_names.insert(ename.clone()) {
            r.add(&cdoc, format!("{path}.name"), format!("duplicate etcd cluster name {ename:?}"));
        }
        // kOps' Legacy provider runs etcd over plain HTTP (TLS only with enableEtcdTLS): anyone on
        // the network could read or write the cluster's state. Only the Manager provider (TLS with
        // client-certificate auth) is accepted.
        match etcd.provider.as_deref() {
            None => {}
            Some(p) if p.eq_ignore_ascii_case("Manager") => {}
            Some(p) if p.eq_ignore_ascii_case("Legacy") => r.add(
                &cdoc,
                format!("{path}.provider"),
                format!("{p} (plain-HTTP) etcd is not supported; remove the field or set Manager (etcd with TLS and client-certificate auth)"),
            ),
            Some(p) => r.add(&cdoc, format!("{path}.provider"), format!("unknown etcd provider {p:?}: expected Manager")),
        }
        // etcd-manager's backup-retention variables (the only ones protokube honours).
        if let Some(Err((at, message))) = etcd.manager.as_ref().map(crate::etcd_manager::env_retention) {
            r.add(&cdoc, format!("{path}.manager.{at}"), message);
        }
        let members = etcd.etcd_members.as_deref().unwrap_or_default();
        if members.is_empty() {
            r.add(&cdoc, format!("{path}.etcdMembers"), "at least one member is required");
        } else if members.len() % 2 == 0 {
            r.add(&cdoc, format!("{path}.etcdMembers"), format!("{} members: an etcd cluster needs an odd number of members for quorum", members.len()));
        }
        let mut member_names = BTreeSet::new();
        for (j, m) in members.iter().enumerate() {
            let mname = m.name.clone().unwrap_or_else(|| j.to_string());
            let mpath = format!("{path}.etcdMembers[{mname}]");
            if m.name.as_deref().unwrap_or("").is_empty() {
                r.add(&cdoc, format!("{mpath}.name"), "required");
            } else if !member_names.insert(mname.clone()) {
                r.add(&cdoc, format!("{mpath}.name"), format!("duplicate member name {mname:?}"));
            }
            let Some(igname) = m.instance_group.as_deref() else {
                r.add(&cdoc, format!("{mpath}.instanceGroup"), "required: the control-plane instance group that runs this member");
                continue;
            };
            let Some(ig) = groups.get(igname) else {
                r.add(&cdoc, format!("{mpath}.instanceGroup"), format!("no InstanceGroup named {igname:?}"));
                continue;
            };
            if ig.role() != Some(Role::ControlPlane) {
                r.add(
                    &cdoc,
                    format!("{mpath}.instanceGroup"),
                    format!("InstanceGroup {igname:?} has role {:?}: etcd members run only on control-plane groups", ig.spec.role.as_deref().unwrap_or("")),
                );
            }
            // A group's zones are its own `zones` (regional subnets, as on GCE), else its subnets' zones.
            let zones: BTreeSet<String> = match ig.spec.zones.as_ref().filter(|z| !z.is_empty()) {
                Some(z) => z.iter().cloned().collect(),
                None => ig.spec.subnets.iter().flatten().filter_map(|s| subnet_zones.get(s).cloned().flatten()).collect(),
            };
            if zones.len() > 1 {
                r.add(
                    &cdoc,
                    format!("{mpath}.instanceGroup"),
                    format!(
                        "InstanceGroup {igname:?} spans zones {}: an etcd member's group must be in exactly one zone",
                        zones.into_iter().collect::<Vec<_>>().join(", ")
                    ),
                );
            }
        }
    }
    // Fields no supported component has (kubelet flags removed upstream): refused by every command.
    r.errors.extend(crate::support::refusals(docs).into_iter().filter(|x| !x.not_rendered).map(|x| x.error));
    r.errors
}

/// A document's `spec.sysctlParameters`: each entry one setting ([`crate::nodeup::sysctl_parameter_error`]).
/// `spec.iam.serviceAccountExternalPermissions` (kOps `validateSAExternalPermissions`): each names a
/// service account once (a `*` allowed in the namespace only, as the trust policy's `StringLike`),
/// with either managed policy ARNs or an inline policy (a JSON list of statements).
/// With `useServiceAccountExternalPermissions` (`addons_on_own_roles`) the service accounts of
/// Keelson's addons have their roles already: an entry for one would be a second role of the same name.
fn service_account_permissions(r: &mut Report, doc: &str, perms: &[crate::generated::ServiceAccountExternalPermission], addons_on_own_roles: bool) {
    let mut seen = std::collections::BTreeSet::new();
    for p in perms {
        let (ns, name) = (p.namespace.as_deref().unwrap_or(""), p.name.as_deref().unwrap_or(""));
        let path = format!("spec.iam.serviceAccountExternalPermissions[{ns}/{name}]");
        if addons_on_own_roles {
            if let Some(addon) = crate::addon_roles::AddonPermissions::ALL.iter().find(|a| a.service_account() == (ns, name)) {
                r.add(
                    doc,
                    path.clone(),
                    format!("{ns}/{name} is the service account of Keelson's {addon:?} addon, which useServiceAccountExternalPermissions already puts on a role of its own"),
                );
            }
        }
        if ns.is_empty() {
            r.add(doc, format!("{path}.namespace"), "required: the service account's namespace");
        }
        if name.is_empty() {
            r.add(doc, format!("{path}.name"), "required: the service account's name");
        }
        if name.contains('*') {
            r.add(doc, format!("{path}.name"), "a service account name cannot hold a wildcard (only the namespace can)");
        }
        if !seen.insert((ns, name)) {
            r.add(doc, path.clone(), format!("duplicate service account {ns}/{name}"));
        }
        let Some(aws) = &p.aws else {
            r.add(doc, format!("{path}.aws"), "required: the AWS permissions (policyARNs or inlinePolicy)");
            continue;
        };
        let arns = aws.policy_arns.as_deref().unwrap_or_default();
        match (arns.is_empty(), aws.inline_policy.as_deref()) {
            (true, None) => r.add(doc, format!("{path}.aws"), "either inlinePolicy or policyARNs must be set"),
            (false, Some(_)) => r.add(doc, format!("{path}.aws"), "cannot set both inlinePolicy and policyARNs"),
            (_, Some(text)) => {
                if let Err(e) = serde_json::from_str::<Vec<serde_json::Value>>(text) {
                    r.add(doc, format!("{path}.aws.inlinePolicy"), format!("expected a JSON list of IAM policy statements: {e}"));
                }
            }
            (false, None) => {}
        }
    }
}

fn sysctl_lines(r: &mut Report, doc: &str, lines: Option<&[String]>) {
    for (i, line) in lines.unwrap_or_default().iter().enumerate() {
        if let Some(why) = crate::nodeup::sysctl_parameter_error(line) {
            r.add(doc, format!("spec.sysctlParameters[{i}]"), why);
        }
    }
}

/// EC2's volume types (EBS).
pub const EBS_VOLUME_TYPES: &[&str] = &["standard", "gp2", "gp3", "io1", "io2", "st1", "sc1"];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_documents;

    fn spec(cluster_extra: &str, groups: &str) -> String {
        format!(
            "apiVersion: kops.k8s.io/v1alpha2\nkind: Cluster\nmetadata:\n  name: t.example.com\nspec:\n  cloudProvider: aws\n  kubernetesVersion: 1.32.0\n  networkCIDR: 172.20.0.0/16\n  nonMasqueradeCIDR: 100.64.0.0/10\n  subnets:\n  - name: a\n    zone: us-test-1a\n    cidr: 172.20.32.0/19\n    type: Public\n  etcdClusters:\n  - name: main\n    etcdMembers:\n    - name: a\n      instanceGroup: cp\n{cluster_extra}---\napiVersion: kops.k8s.io/v1alpha2\nkind: InstanceGroup\nmetadata:\n  name: cp\nspec:\n  role: Master\n  subnets: [a]\n  minSize: 1\n  maxSize: 1\n{groups}"
        )
    }

    fn errors(text: &str) -> Vec<String> {
        validate(&parse_documents(text.as_bytes()).unwrap()).iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn aws_zones() {
        assert_eq!(aws_region_of_zone("us-east-1a"), Some("us-east-1"));
        assert_eq!(aws_region_of_zone("us-west-2-lax-1b"), Some("us-west-2-lax-1"));
        for bad in ["", "a", "us-east-1", "us-east-1é", "ü-east-1a", "useast1a", "US-EAST-1A", "us-east-1ab"] {
            assert_eq!(aws_region_of_zone(bad), None, "{bad:?}");
        }
        let text = spec("", "").replace("zone: us-test-1a", "zone: \"us-test-1\u{e9}\"");
        let e = errors(&text);
        assert!(e.iter().any(|e| e.contains("spec.subnets[a].zone") && e.contains("not an AWS availability zone")), "{e:?}");
    }

    #[test]
    fn dns_type_is_one_of_kops_values_spelt_so() {
        let with = |t: &str| spec(&format!("  topology:\n    dns:\n      type: {t}\n"), "");
        for ok in ["Public", "Private", "None"] {
            assert_eq!(errors(&with(ok)), Vec::<String>::new(), "{ok}");
        }
        for bad in ["none", "public", "Gossip"] {
            let e = errors(&with(bad));
            assert!(e.iter().any(|e| e.contains("spec.topology.dns.type") && e.contains("Public, Private, None")), "{bad}: {e:?}");
        }
    }

    #[test]
    fn token_mode_on_aws_is_refused_without_its_opt_in() {
        let annotate = |pairs: &str| spec("", "").replace("  name: t.example.com\n", &format!("  name: t.example.com\n  annotations:\n{pairs}"));
        let token = annotate("    keelson.io/node-bootstrap: token\n");
        let e = errors(&token);
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].contains("metadata.annotations[keelson.io/node-bootstrap]") && e[0].contains("keelson.io/allow-bootstrap-token"), "{e:?}");
        assert!(errors(&annotate("    keelson.io/node-bootstrap: token\n    keelson.io/allow-bootstrap-token: \"true\"\n")).is_empty());
        // Off AWS and GCE the token is the only way and needs no opt-in.
        assert!(errors(&token.replace("cloudProvider: aws", "cloudProvider: openstack")).iter().all(|e| !e.contains("node-bootstrap")));
    }

    #[test]
    fn service_account_permissions_are_kops_rules() {
        let perms = |items: &str| spec(&format!("  iam:\n    serviceAccountExternalPermissions:\n{items}"), "");
        let good = "    - name: a\n      namespace: team-*\n      aws:\n        policyARNs: [arn:aws:iam::1:policy/p]\n    - name: b\n      namespace: default\n      aws:\n        inlinePolicy: '[{\"Effect\": \"Allow\", \"Action\": [\"s3:GetObject\"], \"Resource\": [\"*\"]}]'\n";
        assert_eq!(errors(&perms(good)), Vec::<String>::new());
        let cases = [
            ("    - name: a\n      aws:\n        policyARNs: [x]\n", "[/a].namespace: required"),
            ("    - name: a*\n      namespace: n\n      aws:\n        policyARNs: [x]\n", "[n/a*].name: a service account name cannot hold a wildcard"),
            ("    - name: a\n      namespace: n\n", "[n/a].aws: required"),
            ("    - name: a\n      namespace: n\n      aws: {}\n", "[n/a].aws: either inlinePolicy or policyARNs"),
            ("    - name: a\n      namespace: n\n      aws:\n        policyARNs: [x]\n        inlinePolicy: '[]'\n", "[n/a].aws: cannot set both"),
            ("    - name: a\n      namespace: n\n      aws:\n        inlinePolicy: '{not json'\n", "[n/a].aws.inlinePolicy: expected a JSON list"),
            ("    - name: a\n      namespace: n\n      aws:\n        policyARNs: [x]\n    - name: a\n      namespace: n\n      aws:\n        policyARNs: [y]\n", "[n/a]: duplicate service account n/a"),
        ];
        let addon = "    - name: cluster-autoscaler\n      namespace: kube-system\n      aws:\n        policyARNs: [x]\n";
        assert_eq!(errors(&perms(addon)), Vec::<String>::new(), "the addon runs with the control plane's role: the user may give its account a role");
        let own = perms(addon).replace("  iam:\n", "  iam:\n    useServiceAccountExternalPermissions: true\n");
        assert!(
            errors(&own)
                .iter()
                .any(|e| e
                    .contains("[kube-system/cluster-autoscaler]: kube-system/cluster-autoscaler is the service account of Keelson's ClusterAutoscaler addon")),
            "{:?}",
            errors(&own)
        );
        for (items, want) in cases {
            let e = errors(&perms(items));
            assert!(e.iter().any(|e| e.contains(&format!("spec.iam.serviceAccountExternalPermissions{want}"))), "{want}: {e:?}");
        }
        let gce = perms(good).replace("cloudProvider: aws", "cloudProvider: gce");
        assert!(errors(&gce).iter().any(|e| e.contains("spec.iam.serviceAccountExternalPermissions: IAM roles for service accounts are made on AWS only")));
    }

    #[test]
    fn valid_spec_has_no_errors() {
        assert_eq!(errors(&spec("", "")), Vec::<String>::new());
    }

    #[test]
    fn reports_every_error_with_path() {
        let text = spec("", "---\napiVersion: kops.k8s.io/v1alpha2\nkind: InstanceGroup\nmetadata:\n  name: nodes\n  labels:\n    kops.k8s.io/cluster: other.example.com\nspec:\n  role: Node\n  subnets: [b]\n  minSize: 3\n  maxSize: 1\n")
            .replace("cidr: 172.20.32.0/19", "cidr: 10.0.0.0/19");
        let errs = errors(&text);
        let want = [
            "Cluster/t.example.com: spec.subnets[a].cidr: 10.0.0.0/19 is not inside networkCIDR 172.20.0.0/16",
            "InstanceGroup/nodes: metadata.labels[kops.k8s.io/cluster]",
            "InstanceGroup/nodes: spec.minSize: minSize 3 is larger than maxSize 1",
            "InstanceGroup/nodes: spec.subnets[0]: no subnet named \"b\"",
        ];
        for w in want {
            assert!(errs.iter().any(|e| e.starts_with(w)), "missing {w:?} in {errs:#?}");
        }
        assert_eq!(errs.len(), want.len(), "{errs:#?}");
    }

    #[test]
    fn etcd_rules() {
        let text = spec(
            "    - name: b\n      instanceGroup: nodes\n    - name: b\n      instanceGroup: ghost\n",
            "---\napiVersion: kops.k8s.io/v1alpha2\nkind: InstanceGroup\nmetadata:\n  name: nodes\nspec:\n  role: Node\n",
        );
        let errs = errors(&text);
        for w in [
            "spec.etcdClusters[main].etcdMembers[b].instanceGroup: InstanceGroup \"nodes\" has role \"Node\"",
            "spec.etcdClusters[main].etcdMembers[b].name: duplicate member name",
            "spec.etcdClusters[main].etcdMembers[b].instanceGroup: no InstanceGroup named \"ghost\"",
        ] {
            assert!(errs.iter().any(|e| e.contains(w)), "missing {w:?} in {errs:#?}");
        }
        let even = spec("    - name: b\n      instanceGroup: cp\n", "");
        assert!(errors(&even).iter().any(|e| e.contains("odd number")));
    }

    #[test]
    fn etcd_provider_must_be_manager() {
        let with = |provider: &str| spec("", "").replace("  - name: main\n", &format!("  - name: main\n    provider: {provider}\n"));
        for (provider, want) in [
            ("Manager", None),
            ("manager", None),
            ("Legacy", Some("Cluster/t.example.com: spec.etcdClusters[main].provider: Legacy (plain-HTTP) etcd is not supported; ")),
            ("legacy", Some("Cluster/t.example.com: spec.etcdClusters[main].provider: legacy (plain-HTTP) etcd is not supported; ")),
            ("Etcd", Some("Cluster/t.example.com: spec.etcdClusters[main].provider: unknown etcd provider \"Etcd\"")),
        ] {
            let errs = errors(&with(provider));
            match want {
                None => assert_eq!(errs, Vec::<String>::new(), "{provider}"),
                Some(w) => {
                    assert_eq!(errs.len(), 1, "{provider}: {errs:#?}");
                    assert!(errs[0].starts_with(w), "{provider}: {errs:#?}");
                }
            }
        }
        // Asking for TLS does not rescue Legacy: the provider itself is refused.
        let tls = with("Legacy").replace("    provider: Legacy\n", "    provider: Legacy\n    enableEtcdTLS: true\n    enableTLSAuth: true\n");
        assert!(errors(&tls).iter().any(|e| e.contains("spec.etcdClusters[main].provider: Legacy (plain-HTTP)")), "{:?}", errors(&tls));
    }

    #[test]
    fn overlapping_ranges() {
        let text = spec("  serviceClusterIPRange: 172.20.0.0/24\n", "").replace("100.64.0.0/10", "172.16.0.0/12");
        let errs = errors(&text);
        assert!(errs.iter().any(|e| e.contains("spec.nonMasqueradeCIDR: 172.16.0.0/12 overlaps networkCIDR")), "{errs:#?}");
        assert!(errs.iter().any(|e| e.contains("spec.serviceClusterIPRange: 172.20.0.0/24 overlaps the network")), "{errs:#?}");
    }

    #[test]
    fn external_load_balancers_name_one_balancer_each() {
        let with = |items: &str| errors(&spec("", &format!("  externalLoadBalancers:\n{items}")));
        let good = "  - loadBalancerName: my-elb\n  - targetGroupArn: arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/my-tg/50dc6c495c0c9188\n";
        assert_eq!(with(good), Vec::<String>::new());
        for (items, want) in [
            (
                "  - loadBalancerName: a\n    targetGroupArn: arn:aws:elasticloadbalancing:r:1:targetgroup/t/1\n",
                "spec.externalLoadBalancers[0]: set loadBalancerName",
            ),
            ("  - {}\n", "spec.externalLoadBalancers[0]: expected loadBalancerName"),
            ("  - loadBalancerName: a-name-longer-than-thirty-two-chars\n", "spec.externalLoadBalancers[0].loadBalancerName: \"a-name-longer"),
            ("  - targetGroupArn: arn:aws:elasticloadbalancing:r:1:loadbalancer/app/x/1\n", "spec.externalLoadBalancers[0].targetGroupArn: \"arn:aws:"),
            ("  - targetGroupArn: my-tg\n", "expected a target group's ARN"),
        ] {
            let e = with(items);
            assert!(e.iter().any(|e| e.starts_with("InstanceGroup/cp: ") && e.contains(want)), "{items}: {e:?}");
        }
    }

    #[test]
    fn a_root_volume_key_needs_encryption() {
        let key = "  rootVolumeEncryptionKey: arn:aws:kms:us-test-1:1:key/k\n";
        assert_eq!(errors(&spec("", key)), Vec::<String>::new());
        assert_eq!(errors(&spec("", &format!("{key}  rootVolumeEncryption: true\n"))), Vec::<String>::new());
        let e = errors(&spec("", &format!("{key}  rootVolumeEncryption: false\n")));
        assert!(e.iter().any(|e| e.starts_with("InstanceGroup/cp: spec.rootVolumeEncryptionKey: a KMS key")), "{e:?}");
    }

    #[test]
    fn bad_names() {
        let text = spec("", "").replace("name: t.example.com", "name: Bad_Name");
        assert!(errors(&text).iter().any(|e| e.starts_with("Cluster/Bad_Name: metadata.name:")));
    }
}
