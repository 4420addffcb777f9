//! The GCE tasks as the Compute API names them ([`Names`]: links to names and URLs) and the typed
//! task read back from a Compute or IAM resource ([`from_network`], …); what each type sends and
//! how the plan compares it is the type's own ([`super::GceTask`]).
//!
//! An instance template is immutable: its GCE name is its group's prefix and a hash of its body
//! ([`template_name`]), so a changed template is a new name (created, the MIGs moved to it, the old
//! one deleted), and two templates of the same name are the same template.

use std::collections::BTreeMap;

use cloud::gce::compute::name_of_link;
use keelson_api::Role;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::{Allowed, BucketIamMember, Disk, Firewall, InstanceGroupManager, InstanceTemplate, Network, ProjectIamMember, ServiceAccount, Subnetwork};
use crate::tasks::Link;

/// How the links of the model's tasks are named on GCE, and the project they live in.
#[derive(Debug, Clone, Default)]
pub struct Names {
    pub project: String,
    /// The cluster's region (its subnetworks').
    pub region: String,
    /// Model name → GCE name.
    pub networks: BTreeMap<String, String>,
    pub subnetworks: BTreeMap<String, String>,
    /// Template model name → GCE name (prefix and hash).
    pub templates: BTreeMap<String, String>,
}

impl Names {
    /// The names of the model's tasks (template names hashed from their bodies).
    pub fn of(tasks: &super::Tasks, project: &str, region: &str) -> Names {
        let mut n = Names { project: project.to_string(), region: region.to_string(), ..Default::default() };
        n.networks = tasks.networks.iter().map(|t| (t.name.clone(), t.gce_name.clone())).collect();
        n.subnetworks = tasks.subnetworks.iter().map(|t| (t.name.clone(), t.gce_name.clone())).collect();
        let templates: BTreeMap<String, String> = tasks.instance_templates.iter().map(|t| (t.name.clone(), template_name(t, &n))).collect();
        n.templates = templates;
        n
    }

    /// The GCE name a link to a network stands for (the spec's id as it is, ours by the model).
    pub fn network(&self, l: &Link<Network>) -> String {
        l.id().map(|id| name_of_link(id).to_string()).or_else(|| self.networks.get(l.name()).cloned()).unwrap_or_else(|| l.name().to_string())
    }
    pub fn subnetwork(&self, l: &Link<Subnetwork>) -> String {
        l.id().map(|id| name_of_link(id).to_string()).or_else(|| self.subnetworks.get(l.name()).cloned()).unwrap_or_else(|| l.name().to_string())
    }
    pub fn template(&self, l: &Link<InstanceTemplate>) -> String {
        self.templates.get(l.name()).cloned().unwrap_or_else(|| l.name().to_string())
    }
    pub(crate) fn network_link(&self, l: &Link<Network>) -> String {
        match l.id() {
            Some(id) if id.contains('/') => id.to_string(),
            _ => format!("projects/{}/global/networks/{}", self.project, self.network(l)),
        }
    }
    fn subnetwork_link(&self, l: &Link<Subnetwork>, region: &str) -> String {
        match l.id() {
            Some(id) if id.contains('/') => id.to_string(),
            _ => format!("projects/{}/regions/{region}/subnetworks/{}", self.project, self.subnetwork(l)),
        }
    }
    pub fn template_link(&self, l: &Link<InstanceTemplate>) -> String {
        format!("projects/{}/global/instanceTemplates/{}", self.project, self.template(l))
    }
}

/// The image as Compute wants it: `PROJECT/NAME` → `projects/PROJECT/global/images/NAME`; a URL
/// or partial URL as it is.
pub fn image_link(image: &str) -> String {
    match image.split_once('/') {
        Some((project, name)) if !name.contains('/') && project != "global" => format!("projects/{project}/global/images/{name}"),
        _ => image.to_string(),
    }
}

/// [`image_link`] read back: `…/projects/P/global/images/N` → `P/N`.
fn image_of(link: &str) -> String {
    let segs: Vec<&str> = link.split('/').collect();
    match segs.iter().rposition(|s| *s == "projects") {
        Some(i) if segs.len() == i + 5 && segs[i + 2] == "global" && segs[i + 3] == "images" => format!("{}/{}", segs[i + 1], segs[i + 4]),
        _ => link.to_string(),
    }
}

/// The `properties` of a template's body (everything but its name).
pub(crate) fn template_properties(t: &InstanceTemplate, names: &Names) -> Value {
    let mut nic = json!({"network": names.network_link(&t.network)});
    if let Some(s) = &t.subnetwork {
        nic["subnetwork"] = json!(names.subnetwork_link(s, &names.region));
    }
    if t.public_ip {
        nic["accessConfigs"] = json!([{"name": "external-nat", "type": "ONE_TO_ONE_NAT"}]);
    }
    let metadata = [
        (t.user_data_key.as_str(), String::from_utf8_lossy(&t.user_data).into_owned()),
        ("cluster-name", t.cluster.clone()),
        ("kops-k8s-io-instance-group-name", t.group.clone()),
    ];
    json!({
        "machineType": t.machine_type,
        "canIpForward": true,
        "disks": [{
            "boot": true,
            "autoDelete": true,
            "deviceName": "persistent-disks-0",
            "type": "PERSISTENT",
            "mode": "READ_WRITE",
            "initializeParams": initialize_params(t),
        }],
        "networkInterfaces": [nic],
        "metadata": {"items": metadata.iter().map(|(k, v)| json!({"key": k, "value": v})).collect::<Vec<_>>()},
        "labels": t.labels,
        "tags": {"items": t.tags},
        "serviceAccounts": [{"email": t.service_account, "scopes": t.scopes}],
        "scheduling": {"automaticRestart": true, "onHostMaintenance": "MIGRATE", "preemptible": false},
    })
}

/// The boot disk's `initializeParams` (int64 fields as strings, as the Compute API writes them);
/// provisioned IOPS and throughput only when set, so templates without them keep their names.
fn initialize_params(t: &InstanceTemplate) -> Value {
    let mut p = json!({"diskSizeGb": t.disk_size_gb.to_string(), "diskType": t.disk_type, "sourceImage": image_link(&t.image)});
    if let Some(iops) = t.disk_iops {
        p["provisionedIops"] = json!(iops.to_string());
    }
    if let Some(throughput) = t.disk_throughput {
        p["provisionedThroughput"] = json!(throughput.to_string());
    }
    p
}

/// The boot disk in a plan's field list: `64 GB pd-balanced`, `100 GB hyperdisk-balanced, 6000 IOPS, 1000 MB/s`.
pub fn boot_disk_summary(t: &InstanceTemplate) -> String {
    let mut s = format!("{} GB {}", t.disk_size_gb, t.disk_type);
    if let Some(iops) = t.disk_iops {
        s.push_str(&format!(", {iops} IOPS"));
    }
    if let Some(throughput) = t.disk_throughput {
        s.push_str(&format!(", {throughput} MB/s"));
    }
    s
}

/// A template's GCE name: its group's prefix and the first 12 hex digits of the sha256 of its
/// properties (serde_json orders object keys, so the hash is stable).
pub fn template_name(t: &InstanceTemplate, names: &Names) -> String {
    let props = template_properties(t, names);
    let hash = hex::encode(Sha256::digest(props.to_string().as_bytes()));
    format!("{}{}", t.name_prefix, &hash[..12])
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_string).collect()
}

fn string_map(v: &Value) -> BTreeMap<String, String> {
    v.as_object().map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string())).collect()).unwrap_or_default()
}

fn str_of<'a>(v: &'a Value, k: &str) -> &'a str {
    v[k].as_str().unwrap_or_default()
}

fn int_of(v: &Value) -> i64 {
    v.as_i64().or_else(|| v.as_str().and_then(|s| s.parse().ok())).unwrap_or(0)
}

pub fn from_network(v: &Value) -> Network {
    let n = str_of(v, "name").to_string();
    Network { name: n.clone(), gce_name: n }
}

pub fn from_subnetwork(v: &Value) -> Subnetwork {
    let n = str_of(v, "name").to_string();
    Subnetwork {
        name: n.clone(),
        gce_name: n,
        network: Link::to(name_of_link(str_of(v, "network"))),
        region: name_of_link(str_of(v, "region")).to_string(),
        cidr: str_of(v, "ipCidrRange").to_string(),
    }
}

pub fn from_firewall(v: &Value) -> Firewall {
    Firewall {
        name: str_of(v, "name").to_string(),
        network: Link::to(name_of_link(str_of(v, "network"))),
        source_ranges: strings(&v["sourceRanges"]),
        source_tags: strings(&v["sourceTags"]),
        target_tags: strings(&v["targetTags"]),
        allowed: v["allowed"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| Allowed { protocol: str_of(a, "IPProtocol").to_string(), ports: strings(&a["ports"]) })
            .collect(),
    }
}

/// A template read back (its name is its GCE name).
pub fn from_template(v: &Value) -> InstanceTemplate {
    let p = &v["properties"];
    let meta: BTreeMap<String, String> =
        p["metadata"]["items"].as_array().into_iter().flatten().map(|i| (str_of(i, "key").to_string(), str_of(i, "value").to_string())).collect();
    let (user_data_key, user_data) = [super::USER_DATA_KEY, super::STARTUP_SCRIPT_KEY]
        .iter()
        .find_map(|k| meta.get(*k).map(|d| (k.to_string(), d.clone().into_bytes())))
        .unwrap_or_default();
    let labels = string_map(&p["labels"]);
    let role = match labels.iter().find(|(k, _)| k.starts_with("k8s-io-role-")).map(|(_, v)| v.as_str()) {
        Some("master") => Role::ControlPlane,
        Some("apiserver") => Role::ApiServer,
        Some("bastion") => Role::Bastion,
        _ => Role::Node,
    };
    let disk = &p["disks"][0];
    let nic = &p["networkInterfaces"][0];
    let name = str_of(v, "name").to_string();
    InstanceTemplate {
        name_prefix: name.get(..name.len().saturating_sub(12)).unwrap_or_default().to_string(),
        name,
        group: meta.get("kops-k8s-io-instance-group-name").cloned().unwrap_or_default(),
        role,
        cluster: meta.get("cluster-name").cloned().unwrap_or_default(),
        machine_type: name_of_link(str_of(p, "machineType")).to_string(),
        disk_size_gb: int_of(&disk["initializeParams"]["diskSizeGb"]),
        disk_type: name_of_link(str_of(&disk["initializeParams"], "diskType")).to_string(),
        disk_iops: Some(int_of(&disk["initializeParams"]["provisionedIops"])).filter(|n| *n > 0),
        disk_throughput: Some(int_of(&disk["initializeParams"]["provisionedThroughput"])).filter(|n| *n > 0),
        image: image_of(str_of(&disk["initializeParams"], "sourceImage")),
        network: Link::to(name_of_link(str_of(nic, "network"))),
        subnetwork: Some(str_of(nic, "subnetwork")).filter(|s| !s.is_empty()).map(|s| Link::to(name_of_link(s))),
        public_ip: nic["accessConfigs"].as_array().is_some_and(|a| !a.is_empty()),
        user_data,
        user_data_key,
        service_account: str_of(&p["serviceAccounts"][0], "email").to_string(),
        service_account_task: None,
        scopes: strings(&p["serviceAccounts"][0]["scopes"]),
        labels,
        tags: strings(&p["tags"]["items"]),
    }
}

/// A service account read back (IAM's `serviceAccounts` resource).
pub fn from_service_account(v: &Value, project: &str) -> ServiceAccount {
    let email = str_of(v, "email").to_string();
    let id = email.split('@').next().unwrap_or_default().to_string();
    ServiceAccount {
        name: id.clone(),
        project: project.to_string(),
        account_id: id,
        email,
        display_name: str_of(v, "displayName").to_string(),
        description: str_of(v, "description").to_string(),
    }
}

/// One member of one role of the project's policy.
pub fn project_member(project: &str, role: &str, email: &str) -> ProjectIamMember {
    let id = email.split('@').next().unwrap_or_default();
    ProjectIamMember {
        name: format!("{role} {}", super::identity::member_of(email)),
        project: project.to_string(),
        role: role.to_string(),
        email: email.to_string(),
        account: Link::to(id),
    }
}

/// One member of one (conditional) binding of a bucket's policy.
pub fn bucket_member(bucket: &str, role: &str, email: &str, condition: Option<&Value>) -> BucketIamMember {
    let id = email.split('@').next().unwrap_or_default();
    let condition = condition.map(|c| super::Condition {
        title: str_of(c, "title").to_string(),
        description: str_of(c, "description").to_string(),
        expression: str_of(c, "expression").to_string(),
    });
    BucketIamMember {
        name: super::identity::bucket_member_name(bucket, role, &super::identity::member_of(email), condition.as_ref().map(|c| c.expression.as_str())),
        bucket: bucket.to_string(),
        role: role.to_string(),
        email: email.to_string(),
        account: Link::to(id),
        condition,
    }
}

pub fn from_mig(v: &Value) -> InstanceGroupManager {
    let n = str_of(v, "name").to_string();
    InstanceGroupManager {
        name: n.clone(),
        gce_name: n,
        zone: name_of_link(str_of(v, "zone")).to_string(),
        base_instance_name: str_of(v, "baseInstanceName").to_string(),
        target_size: int_of(&v["targetSize"]),
        template: Link::to(name_of_link(str_of(v, "instanceTemplate"))),
        max_surge: int_of(&v["updatePolicy"]["maxSurge"]["fixed"]),
    }
}

pub fn from_disk(v: &Value) -> Disk {
    let n = str_of(v, "name").to_string();
    Disk {
        name: n.clone(),
        gce_name: n,
        zone: name_of_link(str_of(v, "zone")).to_string(),
        size_gb: int_of(&v["sizeGb"]),
        disk_type: name_of_link(str_of(v, "type")).to_string(),
        labels: string_map(&v["labels"]),
    }
}

/// Sorted, deduplicated, comma-joined (how the plan compares a list).
pub(crate) fn sorted_joined(v: &[String]) -> String {
    let mut v = v.to_vec();
    v.sort();
    v.dedup();
    v.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template() -> InstanceTemplate {
        InstanceTemplate {
            name: "nodes.c".into(),
            group: "nodes".into(),
            role: Role::Node,
            cluster: "c".into(),
            name_prefix: "nodes-c-".into(),
            machine_type: "e2-standard-4".into(),
            disk_size_gb: 64,
            disk_type: "pd-balanced".into(),
            disk_iops: None,
            disk_throughput: None,
            image: "ubuntu-os-cloud/ubuntu-2404".into(),
            network: Link::to("c"),
            subnetwork: Some(Link::to("europe-west1.c")),
            public_ip: true,
            user_data: b"#!/bin/bash\n".to_vec(),
            user_data_key: super::super::USER_DATA_KEY.into(),
            service_account: "default".into(),
            service_account_task: None,
            scopes: super::super::scopes(Role::Node),
            labels: BTreeMap::from([("k8s-io-cluster-name".to_string(), "c".to_string())]),
            tags: vec!["c-k8s-io-role-node".into()],
        }
    }

    /// A template is named by its content: the same content the same name, any change a new one;
    /// and it reads back as the same typed template.
    #[test]
    fn templates_are_named_by_their_content_and_read_back() {
        let names = Names { project: "p".into(), region: "europe-west1".into(), ..Default::default() };
        let t = template();
        let name = template_name(&t, &names);
        assert!(name.starts_with("nodes-c-") && name.len() == "nodes-c-".len() + 12, "{name}");
        assert_eq!(template_name(&template(), &names), name, "stable");
        let bigger = InstanceTemplate { machine_type: "e2-standard-8".into(), ..template() };
        assert_ne!(template_name(&bigger, &names), name);
        let other_script = InstanceTemplate { user_data: b"#!/bin/sh\n".to_vec(), ..template() };
        assert_ne!(template_name(&other_script, &names), name);
        let body = super::super::Task::InstanceTemplate(t.clone()).body(&names);
        assert_eq!(body["properties"]["networkInterfaces"][0]["subnetwork"], "projects/p/regions/europe-west1/subnetworks/europe-west1.c");
        let back = from_template(&body);
        assert_eq!(InstanceTemplate { name: t.name.clone(), subnetwork: Some(Link::to("europe-west1.c")), ..back }, t);
        let other_scopes = InstanceTemplate { scopes: super::super::scopes(Role::ControlPlane), ..template() };
        assert_ne!(template_name(&other_scopes, &names), name, "scopes are part of the template");
        // A hyperdisk's provisioned IOPS and throughput: sent, read back, part of the name.
        let hyperdisk = InstanceTemplate { disk_type: "hyperdisk-balanced".into(), disk_iops: Some(6000), disk_throughput: Some(1000), ..template() };
        let body = super::super::Task::InstanceTemplate(hyperdisk.clone()).body(&names);
        assert_eq!(body["properties"]["disks"][0]["initializeParams"]["provisionedIops"], "6000");
        assert_eq!(body["properties"]["disks"][0]["initializeParams"]["provisionedThroughput"], "1000");
        let back = from_template(&body);
        assert_eq!(InstanceTemplate { name: hyperdisk.name.clone(), subnetwork: Some(Link::to("europe-west1.c")), ..back }, hyperdisk);
        assert_ne!(template_name(&hyperdisk, &names), template_name(&InstanceTemplate { disk_type: "hyperdisk-balanced".into(), ..template() }, &names));
        assert_eq!(boot_disk_summary(&hyperdisk), "64 GB hyperdisk-balanced, 6000 IOPS, 1000 MB/s");
    }

    #[test]
    fn firewall_bodies_send_ports_only_where_given_and_both_source_lists() {
        let f = Firewall {
            name: "ssh-c".into(),
            network: Link::to("c"),
            source_ranges: vec!["10.0.0.0/8".into()],
            source_tags: vec![],
            target_tags: vec!["t".into()],
            allowed: vec![Allowed::new("tcp", &["22"]), Allowed::new("icmp", &[])],
        };
        let b = super::super::Task::Firewall(f.clone()).body(&Names { project: "p".into(), ..Default::default() });
        assert_eq!(b["allowed"], json!([{"IPProtocol": "tcp", "ports": ["22"]}, {"IPProtocol": "icmp"}]));
        assert_eq!(b["sourceTags"], json!([]), "a patch clears what the rule no longer has");
        assert_eq!(b["network"], "projects/p/global/networks/c");
        assert_eq!(from_firewall(&b), f);
    }

    #[test]
    fn images_are_compute_links_and_read_back() {
        let l = image_link("ubuntu-os-cloud/ubuntu-2404-noble-amd64-v20250606");
        assert_eq!(l, "projects/ubuntu-os-cloud/global/images/ubuntu-2404-noble-amd64-v20250606");
        assert_eq!(image_of(&format!("https://compute.googleapis.com/compute/v1/{l}")), "ubuntu-os-cloud/ubuntu-2404-noble-amd64-v20250606");
        assert_eq!(image_link("projects/p/global/images/i"), "projects/p/global/images/i");
    }
}
