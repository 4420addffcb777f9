//! `keelson create cluster`: a new cluster's spec from kOps' `create cluster` flags — the Cluster
//! and its InstanceGroups as kOps' `NewCluster` and `PerformAssignments` write them
//! (`upup/pkg/fi/cloudup/new_cluster.go`, `subnets.go`): one subnet per zone (one regional subnet
//! on GCE), Utility subnets and a load-balanced API for a private topology, control planes
//! round-robin over their zones with one etcd member each, the nodes spread over the zones, the
//! subnet CIDRs assigned, default machine types and the channel's image per cloud and
//! architecture. Pure: the options in, the documents out; the caller validates them with the same
//! loader every command uses, so what `create` writes is what `validate` accepts.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::complete::network::{assign_aws_subnets, DEFAULT_AWS_NETWORK, DEFAULT_NON_MASQUERADE};
use keelson_api::CloudProvider;

use crate::versions::{default_image, Arch, RECOMMENDED_KUBERNETES_VERSION};

/// kOps' `create cluster` options Keelson takes (kOps' flag in each field's doc).
#[derive(Debug, Clone, Default)]
pub struct NewClusterOptions {
    /// `--name`: the cluster's DNS-style name.
    pub name: String,
    /// `--zones`.
    pub zones: Vec<String>,
    /// `--control-plane-zones` (default: `--zones`).
    pub control_plane_zones: Vec<String>,
    /// `--state`: the state store; the spec's configBase is `<state>/<name>`.
    pub state: Option<String>,
    /// `--cloud` (`aws`, `gce`); guessed from the state store's scheme when absent.
    pub cloud: Option<String>,
    /// `--project` (GCE).
    pub project: Option<String>,
    /// `--gce-service-account`.
    pub gce_service_account: Option<String>,
    /// `--kubernetes-version`.
    pub kubernetes_version: Option<String>,
    /// `--control-plane-count` (default: the number of control-plane zones given, else 1).
    pub control_plane_count: Option<u32>,
    /// `--node-count` (default: one per zone).
    pub node_count: Option<u32>,
    /// `--control-plane-size`, `--node-size` (several make a mixed-instances policy on AWS).
    pub control_plane_sizes: Vec<String>,
    pub node_sizes: Vec<String>,
    /// `--image`, `--node-image`, `--control-plane-image`, `--bastion-image`.
    pub image: Option<String>,
    pub node_image: Option<String>,
    pub control_plane_image: Option<String>,
    pub bastion_image: Option<String>,
    /// `--networking` (default `cilium`).
    pub networking: Option<String>,
    /// `--topology` (`public`, `private`; default public).
    pub topology: Option<String>,
    /// `--bastion` (private topology only).
    pub bastion: bool,
    /// `--dns` (`public`, `private`, `none`; default public with `--dns-zone`, else none).
    pub dns: Option<String>,
    /// `--dns-zone`.
    pub dns_zone: Option<String>,
    /// `--api-loadbalancer-type` (`public`, `internal`), `--api-ssl-certificate`, `--api-public-name`.
    pub api_load_balancer_type: Option<String>,
    pub api_ssl_certificate: Option<String>,
    pub api_public_name: Option<String>,
    /// `--admin-access` (default `0.0.0.0/0` and `::/0`), `--ssh-access` (default: admin access).
    pub admin_access: Vec<String>,
    pub ssh_access: Vec<String>,
    /// `--network-cidr` (the first is the VPC's; more are additional CIDRs with a subnet each).
    pub network_cidrs: Vec<String>,
    /// `--etcd-clusters` (default `main`, `events`).
    pub etcd_clusters: Vec<String>,
    /// `--encrypt-etcd-storage` (default: true on AWS), `--etcd-storage-type`.
    pub encrypt_etcd_storage: Option<bool>,
    pub etcd_storage_type: Option<String>,
    /// `--cloud-labels` (`Owner=John Doe,Team=Some Team`).
    pub cloud_labels: Option<String>,
    /// `--associate-public-ip`.
    pub associate_public_ip: Option<bool>,
    /// `--control-plane-volume-size`, `--node-volume-size` (GB), `--control-plane-volume-type`,
    /// `--node-volume-type`.
    pub control_plane_volume_size: Option<u32>,
    pub node_volume_size: Option<u32>,
    pub control_plane_volume_type: Option<String>,
    pub node_volume_type: Option<String>,
    /// `--authorization` (`RBAC`, `AlwaysAllow`).
    pub authorization: Option<String>,
    /// `--kubernetes-feature-gates` (`Name`, `-Name` to disable, or `Name=bool`).
    pub feature_gates: Vec<String>,
}

/// What `create cluster` cannot make of its flags (each names the flag).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NewClusterError {
    #[error("--{flag}: {message}")]
    Flag { flag: &'static str, message: String },
}

fn flag(flag: &'static str, message: impl Into<String>) -> NewClusterError {
    NewClusterError::Flag { flag, message: message.into() }
}

/// The clouds `create cluster` lays out: those Keelson builds on ([`CloudProvider::served`], the
/// rule `validate` and `apply` use).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum CloudKind {
    Aws,
    Gce,
}

impl CloudKind {
    fn as_str(self) -> &'static str {
        match self {
            CloudKind::Aws => CloudProvider::Aws.as_str(),
            CloudKind::Gce => CloudProvider::Gce.as_str(),
        }
    }
}

/// The cloud of `--cloud`, else of the state store's scheme (kOps' `GuessCloudForPath`).
fn cloud_of(o: &NewClusterOptions) -> Result<CloudKind, NewClusterError> {
    let unserved = |c: &str| flag("cloud", format!("{c:?}: Keelson builds clusters on {}", CloudProvider::served_names().join(" and ")));
    match o.cloud.as_deref() {
        Some(c) => match CloudProvider::parse(&c.to_ascii_lowercase()) {
            Some(CloudProvider::Aws) => Ok(CloudKind::Aws),
            Some(CloudProvider::Gce) => Ok(CloudKind::Gce),
            _ => Err(unserved(c)),
        },
        None => match o.state.as_deref() {
            Some(s) if s.starts_with("s3://") => Ok(CloudKind::Aws),
            Some(s) if s.starts_with("gs://") => Ok(CloudKind::Gce),
            _ => Err(flag("cloud", "not given, and the state store (--state s3://… or gs://…) does not tell: pass --cloud aws or --cloud gce")),
        },
    }
}

/// A GCE zone's region (`europe-west1-b` → `europe-west1`; the rule every part uses,
/// [`keelson_api::plan::region_of_zone`]).
fn gce_region(zone: &str) -> Result<&str, NewClusterError> {
    keelson_api::plan::region_of_zone(zone).ok_or_else(|| flag("zones", format!("{zone:?} is not a GCE zone (expected REGION-X, such as europe-west1-b)")))
}

/// The architecture a machine type runs (AWS Graviton families have a `g` after the generation:
/// `t4g`, `m7gd`, `c7gn`; GCE's Arm series are `t2a`, `c4a`, `n4a`); what kOps asks the EC2 API.
pub fn machine_arch(cloud: &str, machine_type: &str) -> Arch {
    let family = machine_type.split(['.', '-']).next().unwrap_or_default();
    let arm = match cloud {
        "aws" => {
            family == "a1" || {
                let rest = family.trim_start_matches(|c: char| c.is_ascii_lowercase());
                let after = rest.trim_start_matches(|c: char| c.is_ascii_digit());
                rest.len() != after.len() && after.starts_with('g') && !family.is_empty() && !family.starts_with(|c: char| c.is_ascii_digit())
            }
        }
        "gce" => matches!(family, "t2a" | "c4a" | "n4a" | "c3a" | "a4x"),
        _ => false,
    };
    if arm {
        Arch::Arm64
    } else {
        Arch::Amd64
    }
}

/// kOps' default machine types (`DefaultInstanceType` on AWS takes the first offered of t3.medium,
/// c5.large…; Keelson cannot ask the cloud offline and takes the first).
fn default_machine_type(cloud: CloudKind, role: &str) -> &'static str {
    match (cloud, role) {
        (CloudKind::Aws, "Bastion") => "t3.micro",
        (CloudKind::Aws, _) => "t3.medium",
        (CloudKind::Gce, "Bastion") => "e2-micro",
        (CloudKind::Gce, _) => "e2-medium",
    }
}

fn parse_labels(text: &str) -> Result<BTreeMap<String, String>, NewClusterError> {
    let mut labels = BTreeMap::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').ok_or_else(|| flag("cloud-labels", format!("{pair:?}: expected KEY=VALUE")))?;
        labels.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(labels)
}

fn parse_feature_gate(gate: &str) -> Result<(String, bool), NewClusterError> {
    let bad = || flag("kubernetes-feature-gates", format!("{gate:?}: expected Name, -Name or Name=true|false"));
    if let Some(name) = gate.strip_prefix('-') {
        return if name.is_empty() { Err(bad()) } else { Ok((name.to_string(), false)) };
    }
    match gate.split_once('=') {
        Some((name, v)) if !name.is_empty() => v.parse().map(|b| (name.to_string(), b)).map_err(|_| bad()),
        Some(_) => Err(bad()),
        None if gate.is_empty() => Err(bad()),
        None => Ok((gate.to_string(), true)),
    }
}

/// An instance group being made (written out by [`group_document`]).
struct Group {
    name: String,
    role: &'static str,
    sizes: Vec<String>,
    count: u32,
    subnets: Vec<String>,
    zones: Vec<String>,
    image: Option<String>,
    volume_size: Option<u32>,
    volume_type: Option<String>,
}

/// The Cluster and InstanceGroup documents of a new cluster, in kOps' order (control planes, nodes,
/// bastions), as JSON values of the kOps v1alpha2 format.
pub fn new_cluster(o: &NewClusterOptions) -> Result<Vec<Value>, NewClusterError> {
    let name = o.name.trim();
    if name.is_empty() {
        return Err(flag("name", "required (the cluster's DNS-style name, such as mycluster.example.com)"));
    }
    if o.zones.is_empty() {
        return Err(flag("zones", "must specify at least one zone for the cluster"));
    }
    let cloud = cloud_of(o)?;
    let version = o.kubernetes_version.clone().unwrap_or_else(|| RECOMMENDED_KUBERNETES_VERSION.to_string());
    if version.trim_start_matches('v').parse::<keelson_api::KubernetesVersion>().is_err() {
        return Err(flag("kubernetes-version", format!("{version:?} is not a Kubernetes version")));
    }
    let networking = o.networking.clone().unwrap_or_else(|| "cilium".into());
    let topology = o.topology.clone().unwrap_or_else(|| "public".into()).to_ascii_lowercase();
    if topology != "public" && topology != "private" {
        return Err(flag("topology", format!("{topology:?}: expected public or private")));
    }
    let private = topology == "private";
    if o.bastion && !private {
        return Err(flag("bastion", "a bastion needs --topology private"));
    }
    let dns = match (o.dns.as_deref().map(str::to_ascii_lowercase).as_deref(), &o.dns_zone) {
        (None | Some(""), Some(_)) => "Public",
        (None | Some(""), None) => "None",
        (Some("public"), _) => "Public",
        (Some("private"), _) => "Private",
        (Some("none"), _) => "None",
        (Some(other), _) => return Err(flag("dns", format!("{other:?}: expected public, private or none"))),
    };

    let mut all_zones: Vec<String> = o.zones.iter().chain(&o.control_plane_zones).cloned().collect();
    all_zones.sort();
    all_zones.dedup();

    // Subnets: one per zone on AWS (its name is the zone), one per region on GCE.
    let mut subnets: Vec<keelson_api::ClusterSubnetSpec> = Vec::new();
    let mut zone_subnets: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let subnet_type = if private { "Private" } else { "Public" };
    for zone in &all_zones {
        let (subnet_name, subnet) = match cloud {
            CloudKind::Aws => (
                zone.clone(),
                keelson_api::ClusterSubnetSpec { name: Some(zone.clone()), zone: Some(zone.clone()), type_: Some(subnet_type.into()), ..Default::default() },
            ),
            CloudKind::Gce => {
                let region = gce_region(zone)?.to_string();
                (
                    region.clone(),
                    keelson_api::ClusterSubnetSpec { name: Some(region.clone()), region: Some(region), type_: Some(subnet_type.into()), ..Default::default() },
                )
            }
        };
        if !subnets.iter().any(|s| s.name.as_deref() == Some(subnet_name.as_str())) {
            subnets.push(subnet);
        }
        zone_subnets.entry(zone.clone()).or_default().push(subnet_name);
    }
    if cloud == CloudKind::Gce && subnets.len() > 1 {
        return Err(flag("zones", "all zones of a GCE cluster must be in one region"));
    }
    for (i, cidr) in o.network_cidrs.iter().skip(1).enumerate() {
        let zone = &o.zones[i % o.zones.len()];
        let subnet_name = format!("{zone}-{}", i + 1);
        subnets.push(keelson_api::ClusterSubnetSpec {
            name: Some(subnet_name.clone()),
            zone: Some(zone.clone()),
            cidr: Some(cidr.clone()),
            type_: Some(subnet_type.into()),
            ..Default::default()
        });
        zone_subnets.entry(zone.clone()).or_default().push(subnet_name);
    }
    if private && cloud == CloudKind::Aws {
        let utility: Vec<_> = subnets
            .iter()
            .filter(|s| s.type_.as_deref() == Some("Private"))
            .map(|s| keelson_api::ClusterSubnetSpec {
                name: Some(format!("utility-{}", s.name.as_deref().unwrap_or_default())),
                zone: s.zone.clone(),
                type_: Some("Utility".into()),
                ..Default::default()
            })
            .collect();
        subnets.extend(utility);
    }
    let network_cidr = match cloud {
        CloudKind::Aws => Some(o.network_cidrs.first().cloned().unwrap_or_else(|| DEFAULT_AWS_NETWORK.to_string())),
        CloudKind::Gce => o.network_cidrs.first().cloned(),
    };
    if cloud == CloudKind::Aws {
        let parsed = network_cidr.as_deref().unwrap_or(DEFAULT_AWS_NETWORK).parse::<keelson_api::Cidr>().map_err(|e| flag("network-cidr", e.to_string()))?;
        assign_aws_subnets(parsed, &mut subnets);
    }

    // Control planes, round-robin over their zones (kOps' setupControlPlane).
    let cp_zones = if o.control_plane_zones.is_empty() { o.zones.clone() } else { o.control_plane_zones.clone() };
    let cp_count = match o.control_plane_count {
        Some(0) => return Err(flag("control-plane-count", "at least one control plane")),
        Some(n) if !o.control_plane_zones.is_empty() && (n as usize) < cp_zones.len() => {
            return Err(flag(
                "control-plane-count",
                format!("{n} control planes for {} control-plane zones: if both are given, the count must cover every zone", cp_zones.len()),
            ))
        }
        Some(n) => n as usize,
        None if o.control_plane_zones.is_empty() => 1,
        None => cp_zones.len(),
    };
    let mut groups = Vec::new();
    for i in 0..cp_count {
        let zone = &cp_zones[i % cp_zones.len()];
        let suffix = if cp_count > cp_zones.len() { format!("-{}", 1 + i / cp_zones.len()) } else { String::new() };
        groups.push(Group {
            name: format!("control-plane-{zone}{suffix}"),
            role: "Master",
            sizes: o.control_plane_sizes.clone(),
            count: 1,
            subnets: zone_subnets.get(zone).and_then(|s| s.first()).cloned().into_iter().collect(),
            zones: if cloud == CloudKind::Gce { vec![zone.clone()] } else { Vec::new() },
            image: o.control_plane_image.clone().or_else(|| o.image.clone()),
            volume_size: o.control_plane_volume_size,
            volume_type: o.control_plane_volume_type.clone(),
        });
    }
    let etcd_members = etcd_member_names(&groups.iter().map(|g| g.name.clone()).collect::<Vec<_>>());

    // Nodes: the count spread over the zones, the remainder to the first ones (kOps' setupNodes).
    let node_count = o.node_count.unwrap_or(o.zones.len() as u32);
    let (per_zone, remainder) = (node_count / o.zones.len() as u32, node_count as usize % o.zones.len());
    for (i, zone) in o.zones.iter().enumerate() {
        let zs = zone_subnets.get(zone).cloned().unwrap_or_default();
        groups.push(Group {
            name: format!("nodes-{zone}"),
            role: "Node",
            sizes: o.node_sizes.clone(),
            count: per_zone + u32::from(i < remainder),
            subnets: if zs.len() > 1 { zs[1..].to_vec() } else { zs },
            zones: if cloud == CloudKind::Gce { vec![zone.clone()] } else { Vec::new() },
            image: o.node_image.clone().or_else(|| o.image.clone()),
            volume_size: o.node_volume_size,
            volume_type: o.node_volume_type.clone(),
        });
    }
    if o.bastion {
        groups.push(Group {
            name: "bastions".into(),
            role: "Bastion",
            sizes: Vec::new(),
            count: 1,
            subnets: match cloud {
                CloudKind::Aws => subnets.iter().filter(|s| s.type_.as_deref() == Some("Utility")).filter_map(|s| s.name.clone()).collect(),
                CloudKind::Gce => subnets.iter().filter_map(|s| s.name.clone()).collect(),
            },
            zones: if cloud == CloudKind::Gce { all_zones.clone() } else { Vec::new() },
            image: o.bastion_image.clone().or_else(|| o.image.clone()),
            volume_size: None,
            volume_type: None,
        });
    }

    // The Cluster.
    let mut spec = serde_json::Map::new();
    let authorization = match o.authorization.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None | Some("") | Some("rbac") => json!({"rbac": {}}),
        Some("alwaysallow") => json!({"alwaysAllow": {}}),
        Some(other) => return Err(flag("authorization", format!("{other:?}: expected RBAC or AlwaysAllow"))),
    };
    spec.insert("authorization".into(), authorization);
    spec.insert("channel".into(), json!("stable"));
    spec.insert("cloudProvider".into(), json!(cloud.as_str()));
    if let Some(state) = &o.state {
        spec.insert("configBase".into(), json!(format!("{}/{name}", state.trim_end_matches('/'))));
    }
    let encrypt = o.encrypt_etcd_storage.unwrap_or(cloud == CloudKind::Aws);
    let mut etcd_names = if o.etcd_clusters.is_empty() { vec!["main".to_string(), "events".to_string()] } else { o.etcd_clusters.clone() };
    if networking == "cilium-etcd" {
        etcd_names.push("cilium".into());
    }
    let etcd: Vec<Value> = etcd_names
        .iter()
        .map(|etcd_name| {
            let members: Vec<Value> = groups
                .iter()
                .filter(|g| g.role == "Master")
                .zip(&etcd_members)
                .map(|(g, member)| {
                    let mut m = json!({"name": member, "instanceGroup": g.name});
                    if encrypt {
                        m["encryptedVolume"] = json!(true);
                    }
                    if let Some(t) = &o.etcd_storage_type {
                        m["volumeType"] = json!(t);
                    }
                    m
                })
                .collect();
            let mut c = json!({
                "name": etcd_name,
                "cpuRequest": if etcd_name == "main" { "200m" } else { "100m" },
                "memoryRequest": "100Mi",
                "etcdMembers": members,
                "manager": {"backupRetentionDays": 90},
            });
            if etcd_name == "cilium" {
                c["manager"]["env"] =
                    json!([{"name": "ETCD_AUTO_COMPACTION_MODE", "value": "revision"}, {"name": "ETCD_AUTO_COMPACTION_RETENTION", "value": "2500"}]);
            }
            c
        })
        .collect();
    spec.insert("etcdClusters".into(), json!(etcd));
    let mut iam = json!({"allowContainerRegistry": true, "legacy": false});
    if cloud != CloudKind::Aws {
        iam = json!({"legacy": false});
    }
    spec.insert("iam".into(), iam);
    let mut kubelet = json!({"anonymousAuth": false});
    if !o.feature_gates.is_empty() {
        let mut gates = serde_json::Map::new();
        for g in &o.feature_gates {
            let (n, enabled) = parse_feature_gate(g)?;
            gates.insert(n, json!(enabled.to_string()));
        }
        let gates = Value::Object(gates);
        kubelet["featureGates"] = gates.clone();
        for component in ["kubeAPIServer", "kubeControllerManager", "kubeProxy", "kubeScheduler"] {
            spec.insert(component.into(), json!({"featureGates": gates}));
        }
    }
    spec.insert("kubelet".into(), kubelet);
    let admin = if o.admin_access.is_empty() { vec!["0.0.0.0/0".to_string(), "::/0".to_string()] } else { o.admin_access.clone() };
    spec.insert("kubernetesApiAccess".into(), json!(admin));
    spec.insert("sshAccess".into(), json!(if o.ssh_access.is_empty() { admin.clone() } else { o.ssh_access.clone() }));
    spec.insert("kubernetesVersion".into(), json!(version));
    if let Some(n) = &network_cidr {
        spec.insert("networkCIDR".into(), json!(n));
    }
    if o.network_cidrs.len() > 1 {
        spec.insert("additionalNetworkCIDRs".into(), json!(o.network_cidrs[1..]));
    }
    spec.insert("nonMasqueradeCIDR".into(), json!(DEFAULT_NON_MASQUERADE));
    let (net, disables_kube_proxy) = networking_spec(&networking)?;
    if private && net.get("kubenet").is_some() {
        return Err(flag("networking", "kubenet does not support --topology private"));
    }
    spec.insert("networking".into(), net);
    if disables_kube_proxy {
        let proxy = spec.entry("kubeProxy").or_insert_with(|| json!({}));
        proxy["enabled"] = json!(false);
    }
    if cloud == CloudKind::Gce {
        if let Some(p) = &o.project {
            spec.insert("project".into(), json!(p));
        }
        if let Some(sa) = &o.gce_service_account {
            spec.insert("cloudConfig".into(), json!({"gceServiceAccount": sa}));
        }
    } else if o.project.is_some() || o.gce_service_account.is_some() {
        return Err(flag(if o.project.is_some() { "project" } else { "gce-service-account" }, "only for --cloud gce"));
    }
    spec.insert("subnets".into(), serde_json::to_value(&subnets).unwrap_or_default());
    // kOps also writes `topology.bastion.bastionPublicName: bastion.<name>` when DNS records are
    // published; Keelson renders no bastion load balancer or name yet and refuses that field
    // (README, "What Keelson refuses"), so the bastion group is written without it.
    spec.insert("topology".into(), json!({"dns": {"type": dns}}));
    if let Some(zone) = &o.dns_zone {
        spec.insert("dnsZone".into(), json!(zone));
    }
    if let Some(n) = &o.api_public_name {
        spec.insert("masterPublicName".into(), json!(n));
    }
    if let Some(labels) = &o.cloud_labels {
        let labels = parse_labels(labels)?;
        if !labels.is_empty() {
            spec.insert("cloudLabels".into(), json!(labels));
        }
    }
    // The API: DNS for a public cluster with DNS records, else a load balancer (kOps' setupAPI).
    let wants_lb = o.api_load_balancer_type.is_some() || o.api_ssl_certificate.is_some() || private || dns == "None";
    let api = if wants_lb {
        let ty = match o.api_load_balancer_type.as_deref().map(str::to_ascii_lowercase).as_deref() {
            None | Some("") | Some("public") => "Public",
            Some("internal") => "Internal",
            Some(other) => return Err(flag("api-loadbalancer-type", format!("{other:?}: expected public or internal"))),
        };
        let mut lb = json!({"type": ty});
        if cloud == CloudKind::Aws {
            lb["class"] = json!("Network");
        }
        if let Some(cert) = &o.api_ssl_certificate {
            lb["sslCertificate"] = json!(cert);
        }
        json!({"loadBalancer": lb})
    } else {
        json!({"dns": {}})
    };
    spec.insert("api".into(), api);

    let cluster = json!({"apiVersion": "kops.k8s.io/v1alpha2", "kind": "Cluster", "metadata": {"name": name}, "spec": spec});
    let mut docs = vec![cluster];
    for g in &groups {
        docs.push(group_document(name, cloud, g, o.associate_public_ip));
    }
    Ok(docs)
}

/// kOps' networking flag values, as the spec's `networking` (and whether kube-proxy is off).
fn networking_spec(networking: &str) -> Result<(Value, bool), NewClusterError> {
    Ok(match networking {
        "kubenet" => (json!({"kubenet": {}}), false),
        "external" => (json!({"external": {}}), false),
        "cni" => (json!({"cni": {}}), false),
        "kopeio-vxlan" | "kopeio" => (json!({"kopeio": {}}), false),
        "flannel" | "flannel-vxlan" => (json!({"flannel": {"backend": "vxlan"}}), false),
        "flannel-udp" => (json!({"flannel": {"backend": "udp"}}), false),
        "calico" => (json!({"calico": {}}), false),
        "kube-router" => (json!({"kuberouter": {}}), true),
        "amazonvpc" | "amazon-vpc-routed-eni" => (json!({"amazonvpc": {}}), false),
        "cilium" | "" => (json!({"cilium": {"enableNodePort": true}}), true),
        "cilium-etcd" => (json!({"cilium": {"enableNodePort": true, "etcdManaged": true}}), true),
        "cilium-eni" => (json!({"cilium": {"enableNodePort": true, "ipam": "eni"}}), true),
        "gcp" | "gce" => (json!({"gcp": {}}), false),
        "kindnet" => (json!({"kindnet": {}}), false),
        other => return Err(flag("networking", format!("unknown networking mode {other:?}"))),
    })
}

/// etcd member names from the control-plane group names: `control-plane-` dropped, then the
/// prefix all share trimmed, and a name starting with a digit prefixed `etcd-` (kOps'
/// `createEtcdCluster` and `trimCommonPrefix`).
fn etcd_member_names(groups: &[String]) -> Vec<String> {
    let mut names: Vec<String> = groups.iter().map(|g| g.trim_start_matches("control-plane-").to_string()).collect();
    while names.first().is_some_and(|n| n.len() > 1) {
        let prefix = names[0][..1].to_string();
        if !names.iter().all(|n| n.starts_with(&prefix)) {
            break;
        }
        for n in names.iter_mut() {
            n.drain(..1);
        }
    }
    names.into_iter().map(|n| if n.starts_with(|c: char| c.is_ascii_digit()) { format!("etcd-{n}") } else { n }).collect()
}

fn group_document(cluster: &str, cloud: CloudKind, g: &Group, associate_public_ip: Option<bool>) -> Value {
    let machine = g.sizes.first().cloned().unwrap_or_else(|| default_machine_type(cloud, g.role).to_string());
    let image = g.image.clone().unwrap_or_else(|| default_image(cloud.as_str(), machine_arch(cloud.as_str(), &machine)).to_string());
    let mut spec = json!({
        "role": g.role,
        "image": image,
        "machineType": machine,
        "minSize": g.count,
        "maxSize": g.count,
        "subnets": g.subnets,
        "nodeLabels": {"kops.k8s.io/instancegroup": g.name},
    });
    if !g.zones.is_empty() {
        spec["zones"] = json!(g.zones);
    }
    if cloud == CloudKind::Aws && g.sizes.len() > 1 {
        spec["mixedInstancesPolicy"] = json!({"instances": g.sizes});
    }
    if let Some(size) = g.volume_size {
        spec["rootVolumeSize"] = json!(size);
    }
    if let Some(ty) = &g.volume_type {
        spec["rootVolumeType"] = json!(ty);
    }
    if let Some(public) = associate_public_ip {
        spec["associatePublicIp"] = json!(public);
    }
    json!({
        "apiVersion": "kops.k8s.io/v1alpha2",
        "kind": "InstanceGroup",
        "metadata": {"name": g.name, "labels": {"kops.k8s.io/cluster": cluster}},
        "spec": spec,
    })
}

/// The documents as one YAML stream (`---` between documents).
pub fn to_yaml(docs: &[Value]) -> String {
    docs.iter().map(|d| serde_yaml_ng::to_string(d).unwrap_or_default()).collect::<Vec<_>>().join("---\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(zones: &[&str], state: &str) -> NewClusterOptions {
        NewClusterOptions {
            name: "c.example.com".into(),
            zones: zones.iter().map(|z| z.to_string()).collect(),
            state: Some(state.into()),
            ..Default::default()
        }
    }

    fn group<'a>(docs: &'a [Value], name: &str) -> &'a Value {
        docs.iter().find(|d| d["metadata"]["name"] == name).unwrap_or_else(|| panic!("no group {name}"))
    }

    #[test]
    fn a_public_aws_cluster_as_kops_makes_it() {
        let docs = new_cluster(&opts(&["us-east-1a", "us-east-1b"], "s3://bucket")).expect("cluster");
        let spec = &docs[0]["spec"];
        assert_eq!(spec["cloudProvider"], "aws");
        assert_eq!(spec["configBase"], "s3://bucket/c.example.com");
        assert_eq!(spec["api"], json!({"loadBalancer": {"type": "Public", "class": "Network"}}), "no DNS zone: dns none, so a load balancer");
        assert_eq!(spec["topology"]["dns"]["type"], "None");
        assert_eq!(spec["subnets"][0]["cidr"], "172.20.0.0/17");
        assert_eq!(spec["subnets"][1]["cidr"], "172.20.128.0/17");
        assert_eq!(spec["networking"], json!({"cilium": {"enableNodePort": true}}));
        assert_eq!(spec["kubeProxy"]["enabled"], false);
        assert_eq!(spec["etcdClusters"][0]["etcdMembers"], json!([{"name": "a", "instanceGroup": "control-plane-us-east-1a", "encryptedVolume": true}]));
        assert_eq!(docs.len(), 4, "one control plane, a node group per zone");
        assert_eq!(group(&docs, "nodes-us-east-1b")["spec"]["minSize"], 1);
        assert_eq!(group(&docs, "control-plane-us-east-1a")["spec"]["machineType"], "t3.medium");
    }

    #[test]
    fn three_control_planes_in_private_subnets_with_a_bastion() {
        let mut o = opts(&["eu-west-1a", "eu-west-1b", "eu-west-1c"], "s3://b");
        o.control_plane_count = Some(3);
        o.topology = Some("private".into());
        o.bastion = true;
        o.dns_zone = Some("example.com".into());
        o.node_count = Some(4);
        o.node_sizes = vec!["m7g.large".into(), "m6g.large".into()];
        let docs = new_cluster(&o).expect("cluster");
        let spec = &docs[0]["spec"];
        let members: Vec<_> = spec["etcdClusters"][1]["etcdMembers"].as_array().expect("members").iter().map(|m| m["name"].clone()).collect();
        assert_eq!(members, ["a", "b", "c"], "the shared `eu-west-1` is trimmed");
        assert_eq!(spec["api"]["loadBalancer"]["type"], "Public");
        assert!(spec["topology"].get("bastion").is_none(), "Keelson refuses the bastion's public name");
        let types: Vec<_> = spec["subnets"].as_array().expect("subnets").iter().map(|s| (s["name"].clone(), s["type"].clone(), s["cidr"].clone())).collect();
        assert_eq!(types[0], (json!("eu-west-1a"), json!("Private"), json!("172.20.64.0/18")));
        assert_eq!(types[3], (json!("utility-eu-west-1a"), json!("Utility"), json!("172.20.0.0/21")));
        let counts: Vec<_> = ["a", "b", "c"].iter().map(|z| group(&docs, &format!("nodes-eu-west-1{z}"))["spec"]["minSize"].clone()).collect();
        assert_eq!(counts, [2, 1, 1], "the remainder to the first zones");
        let nodes = &group(&docs, "nodes-eu-west-1a")["spec"];
        assert_eq!(nodes["mixedInstancesPolicy"]["instances"], json!(["m7g.large", "m6g.large"]));
        assert!(nodes["image"].as_str().is_some_and(|i| i.contains("arm64")), "Graviton nodes get the arm64 image: {}", nodes["image"]);
        assert_eq!(group(&docs, "bastions")["spec"]["subnets"], json!(["utility-eu-west-1a", "utility-eu-west-1b", "utility-eu-west-1c"]));
    }

    #[test]
    fn a_gce_cluster_has_one_regional_subnet_and_zonal_groups() {
        let mut o = opts(&["europe-west1-b", "europe-west1-c"], "gs://b");
        o.project = Some("p".into());
        o.networking = Some("kubenet".into());
        let docs = new_cluster(&o).expect("cluster");
        let spec = &docs[0]["spec"];
        assert_eq!(spec["cloudProvider"], "gce");
        assert_eq!(spec["subnets"], json!([{"name": "europe-west1", "region": "europe-west1", "type": "Public"}]));
        assert_eq!(group(&docs, "nodes-europe-west1-c")["spec"]["zones"], json!(["europe-west1-c"]));
        assert_eq!(group(&docs, "control-plane-europe-west1-b")["spec"]["machineType"], "e2-medium");
        assert!(spec.get("networkCIDR").is_none());
    }

    #[test]
    fn bad_flags_are_named() {
        type Change = Box<dyn Fn(&mut NewClusterOptions)>;
        let cases: Vec<(Change, &str)> = vec![
            (Box::new(|o| o.name.clear()), "--name"),
            (Box::new(|o| o.zones.clear()), "--zones"),
            (Box::new(|o| o.state = Some("/tmp/x".into())), "--cloud"),
            (Box::new(|o| o.cloud = Some("hetzner".into())), "--cloud"),
            (Box::new(|o| o.networking = Some("weave".into())), "--networking"),
            (Box::new(|o| o.bastion = true), "--bastion"),
            (Box::new(|o| o.dns = Some("gossip".into())), "--dns"),
            (Box::new(|o| o.cloud_labels = Some("a".into())), "--cloud-labels"),
            (Box::new(|o| o.kubernetes_version = Some("latest".into())), "--kubernetes-version"),
            (Box::new(|o| o.project = Some("p".into())), "--project"),
            (
                Box::new(|o| {
                    o.control_plane_zones = vec!["us-east-1a".into(), "us-east-1b".into()];
                    o.control_plane_count = Some(1);
                }),
                "--control-plane-count",
            ),
        ];
        for (change, want) in cases {
            let mut o = opts(&["us-east-1a"], "s3://b");
            change(&mut o);
            let err = new_cluster(&o).expect_err(want).to_string();
            assert!(err.starts_with(want), "{want}: {err}");
        }
    }

    #[test]
    fn member_names_and_architectures() {
        assert_eq!(etcd_member_names(&["control-plane-us-east-1a".into(), "control-plane-us-east-1b".into()]), ["a", "b"]);
        assert_eq!(etcd_member_names(&["control-plane-us-east-1a-1".into(), "control-plane-us-east-1a-2".into()]), ["etcd-1", "etcd-2"]);
        for (m, arch) in
            [("t4g.medium", Arch::Arm64), ("c7gn.xlarge", Arch::Arm64), ("a1.large", Arch::Arm64), ("g4dn.xlarge", Arch::Amd64), ("t3.medium", Arch::Amd64)]
        {
            assert_eq!(machine_arch("aws", m), arch, "{m}");
        }
        assert_eq!(machine_arch("gce", "t2a-standard-2"), Arch::Arm64);
        assert_eq!(machine_arch("gce", "e2-medium"), Arch::Amd64);
    }
}
