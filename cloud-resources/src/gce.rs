//! GCE in Terraform: network, instance templates, one managed instance group per (instance group ×
//! zone) and a persistent disk per etcd member, with kOps' names and labels. No live GCE calls.

use std::collections::BTreeMap;

use keelson_api::Role;
use serde_json::{json, Value};

use super::model::ClusterModel;
use super::terraform::{tf_name, Blocks};
use base::Tree;

/// Default etcd disk type on GCE (kOps: pd-ssd).
pub const ETCD_DISK_TYPE: &str = "pd-ssd";
pub const BOOT_DISK_TYPE: &str = "pd-balanced";

/// GCE names: lower case, `[a-z0-9-]`, at most 63 characters, starting with a letter.
pub fn gce_name(name: &str) -> String {
    let mut s: String = name.to_ascii_lowercase().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    if !s.starts_with(|c: char| c.is_ascii_lowercase()) {
        s.insert(0, 'k');
    }
    s.truncate(63);
    s.trim_end_matches('-').to_string()
}

/// GCE label values: `[a-z0-9_-]`, at most 63; kOps encodes other characters as `-XX` hex.
pub fn label_value(v: &str) -> String {
    let mut out = String::new();
    for c in v.chars() {
        match c {
            'a'..='z' | '0'..='9' | '_' | '-' => out.push(c),
            'A'..='Z' => out.push(c.to_ascii_lowercase()),
            _ => out.push_str(&format!("-{:02x}", c as u32 & 0xff)),
        }
    }
    out.truncate(63);
    out
}

fn role_label(role: Role) -> &'static str {
    match role {
        Role::ControlPlane => "master",
        Role::Node => "node",
        Role::ApiServer => "apiserver",
        Role::Bastion => "bastion",
    }
}

fn labels(pairs: &[(&str, String)]) -> Value {
    Value::Object(pairs.iter().map(|(k, v)| (k.to_string(), Value::String(v.clone()))).collect())
}

pub fn render(model: &ClusterModel) -> Tree {
    let mut b = Blocks::default();
    let cluster = gce_name(&model.cluster);
    // kOps labels the cluster with its "safe" name (dots → dashes).
    let cluster_label = label_value(&model.cluster.replace('.', "-"));
    let net = &model.network;
    let network = match &net.existing_id {
        Some(id) => id.clone(),
        None => {
            let n = b.add("google_compute_network", &net.name, json!({"name": cluster, "auto_create_subnetworks": false}));
            format!("${{{n}.name}}")
        }
    };
    let mut subnet_refs: BTreeMap<String, String> = BTreeMap::new();
    for s in &net.subnets {
        let reference = match &s.existing_id {
            Some(id) => id.clone(),
            None => {
                let n = b.add(
                    "google_compute_subnetwork",
                    &s.cloud_name,
                    json!({
                        "name": gce_name(&format!("{}-{}", s.spec_name, model.cluster)),
                        "network": network,
                        "region": s.region.clone().unwrap_or_else(|| model.region.clone()),
                        "ip_cidr_range": s.cidr.clone().unwrap_or_default(),
                    }),
                );
                format!("${{{n}.name}}")
            }
        };
        subnet_refs.insert(s.cloud_name.clone(), reference);
    }
    for lt in &model.launch_templates {
        let group = model.groups.iter().find(|g| g.launch_template == lt.name);
        let subnet = group.and_then(|g| g.subnets.first()).and_then(|s| subnet_refs.get(s)).cloned().unwrap_or_default();
        let role = role_label(lt.role);
        let startup = b.data_file(&format!("google_compute_instance_template_{}_metadata_startup-script", tf_name(&lt.name)), &lt.user_data);
        let tmpl = b.add(
            "google_compute_instance_template",
            &lt.name,
            json!({
                "name_prefix": format!("{}-", gce_name(&format!("{}-{}", lt.group, model.cluster)).chars().take(36).collect::<String>()),
                "machine_type": lt.machine_type,
                "can_ip_forward": true,
                "disk": [{
                    "auto_delete": true,
                    "boot": true,
                    "device_name": "persistent-disks-0",
                    "disk_size_gb": lt.root_volume_size,
                    "disk_type": if lt.root_volume_type.starts_with("pd-") { lt.root_volume_type.clone() } else { BOOT_DISK_TYPE.to_string() },
                    "source_image": lt.image,
                    "type": "PERSISTENT",
                    "mode": "READ_WRITE",
                }],
                "network_interface": [{
                    "network": network,
                    "subnetwork": subnet,
                    "access_config": if lt.associate_public_ip { json!([{}]) } else { json!([]) },
                }],
                "metadata": {
                    "startup-script": startup,
                    "cluster-name": model.cluster,
                    "kops-k8s-io-instance-group-name": lt.group,
                },
                "labels": labels(&[
                    ("k8s-io-cluster-name", cluster_label.clone()),
                    ("k8s-io-instance-group", label_value(&lt.group)),
                    (&format!("k8s-io-role-{role}") as &str, role.to_string()),
                ]),
                "tags": [format!("{cluster}-k8s-io-role-{role}")],
                "service_account": [{
                    "email": "default",
                    "scopes": ["https://www.googleapis.com/auth/cloud-platform"],
                }],
                "scheduling": {"automatic_restart": true, "on_host_maintenance": "MIGRATE", "preemptible": false},
                "lifecycle": {"create_before_destroy": true},
            }),
        );
        if let Some(g) = group {
            let zones = if g.zones.is_empty() { vec![format!("{}-b", model.region)] } else { g.zones.clone() };
            // kOps spreads the group's size over its zones (first zones get the remainder).
            let n = zones.len() as i64;
            for (i, zone) in zones.iter().enumerate() {
                let size = g.min_size / n + i64::from((i as i64) < g.min_size % n);
                let letter = zone.rsplit('-').next().unwrap_or(zone);
                b.add(
                    "google_compute_instance_group_manager",
                    &format!("{letter}-{}", g.name),
                    json!({
                        "name": gce_name(&format!("{letter}-{}-{}", g.group, model.cluster)),
                        "zone": zone,
                        "base_instance_name": gce_name(&g.group),
                        "target_size": size,
                        "version": [{"instance_template": format!("${{{tmpl}.self_link}}")}],
                        "update_policy": {"type": "OPPORTUNISTIC", "minimal_action": "REPLACE", "max_surge_fixed": n, "max_unavailable_fixed": 0},
                    }),
                );
            }
        }
    }
    for v in &model.volumes {
        let members = v.tags.get(&format!("k8s.io/etcd/{}", v.etcd_cluster)).cloned().unwrap_or_default();
        let disk_type = if v.volume_type.starts_with("pd-") { v.volume_type.clone() } else { ETCD_DISK_TYPE.to_string() };
        b.add(
            "google_compute_disk",
            &v.name,
            json!({
                "name": gce_name(&format!("{}-etcd-{}-{}", v.member, v.etcd_cluster, model.cluster)),
                "zone": v.zone,
                "size": v.size_gib,
                "type": disk_type,
                "labels": labels(&[
                    ("k8s-io-cluster-name", cluster_label.clone()),
                    (&format!("k8s-io-etcd-{}", v.etcd_cluster) as &str, label_value(&members)),
                    ("k8s-io-role-master", "master".to_string()),
                ]),
            }),
        );
    }
    b.output.insert("cluster_name".into(), json!({"value": model.cluster}));
    b.output.insert("project".into(), json!({"value": model.project.clone().unwrap_or_default()}));
    b.output.insert("region".into(), json!({"value": model.region}));
    b.finish(json!({
        "terraform": {
            "required_version": ">= 1.3.0",
            "required_providers": {"google": {"source": "hashicorp/google", "version": ">= 5.0.0"}},
        },
        "provider": {"google": [{"project": model.project.clone().unwrap_or_default(), "region": model.region}]},
        "locals": {"cluster_name": model.cluster, "project": model.project.clone().unwrap_or_default(), "region": model.region},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_labels_follow_gce_rules() {
        assert_eq!(gce_name("A-nodes.gce.k8s.example.com"), "a-nodes-gce-k8s-example-com");
        assert_eq!(gce_name("1x"), "k1x");
        assert!(gce_name(&"x".repeat(100)).len() <= 63);
        assert_eq!(label_value("a/a,b"), "a-2fa-2cb");
    }
}
