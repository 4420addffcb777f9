//! The etcd volume builder: one data volume per etcd cluster × member, in the zone of the member's
//! instance group, tagged so protokube finds and claims it (AWS EBS; GCE persistent disks).

use super::{Context, ModelError, DEFAULT_ETCD_VOLUME_SIZE_GIB, DEFAULT_ETCD_VOLUME_TYPE};
use crate::aws::{self, Volume};
use crate::gce::{self, encode_label, gce_name, plain_label, safe_cluster_name, ETCD_DISK_TYPE};

/// One etcd member's volume, as the spec asks for it.
struct Member {
    name: String,
    etcd_cluster: String,
    member: String,
    /// `<member>/<all members>` (the `k8s.io/etcd/<cluster>` tag protokube reads).
    members_tag: String,
    zone: String,
    spec: keelson_api::generated::EtcdMemberSpec,
}

/// The etcd cluster names and their members' volumes.
fn members(cx: &Context<'_>) -> Result<(Vec<String>, Vec<Member>), ModelError> {
    let mut clusters = Vec::new();
    let mut out = Vec::new();
    for etcd in cx.spec.etcd_clusters.iter().flatten() {
        let ename = etcd.name.clone().unwrap_or_default();
        clusters.push(ename.clone());
        let members: Vec<String> = etcd.etcd_members.iter().flatten().filter_map(|m| m.name.clone()).collect();
        for m in etcd.etcd_members.iter().flatten() {
            let member = m.name.clone().unwrap_or_default();
            let ig_name = m.instance_group.clone().unwrap_or_default();
            let ig = cx
                .instance_groups
                .iter()
                .find(|g| g.name() == ig_name)
                .ok_or_else(|| cx.missing(&format!("spec.etcdClusters[{ename}].etcdMembers[{member}].instanceGroup")))?;
            let zone =
                ig.spec.zones.iter().flatten().next().cloned().or_else(|| cx.subnet(ig.spec.subnets.iter().flatten().next()?)?.zone.clone()).ok_or_else(
                    || ModelError::Group {
                        group: ig_name.clone(),
                        field: "spec.subnets".into(),
                        message: format!("no zone for etcd member {member} of {ename}"),
                    },
                )?;
            out.push(Member {
                name: format!("{member}.etcd-{ename}.{}", cx.cluster),
                members_tag: format!("{member}/{}", members.join(",")),
                etcd_cluster: ename.clone(),
                member,
                zone,
                spec: m.clone(),
            });
        }
    }
    Ok((clusters, out))
}

/// EBS volumes; returns the etcd cluster names.
pub fn build(cx: &Context<'_>, tasks: &mut aws::Tasks) -> Result<Vec<String>, ModelError> {
    let (clusters, members) = members(cx)?;
    for m in members {
        let mut tags = cx.tags(&m.name);
        tags.insert("k8s.io/role/master".into(), "1".into());
        tags.insert("k8s.io/role/control-plane".into(), "1".into());
        tags.insert(format!("k8s.io/etcd/{}", m.etcd_cluster), m.members_tag);
        let s = &m.spec;
        tasks.push(Volume {
            name: m.name,
            zone: m.zone,
            size_gib: s.volume_size.unwrap_or(DEFAULT_ETCD_VOLUME_SIZE_GIB),
            volume_type: s.volume_type.clone().unwrap_or_else(|| DEFAULT_ETCD_VOLUME_TYPE.into()),
            encrypted: s.encrypted_volume.unwrap_or(false) || s.kms_key_id.is_some(),
            iops: s.volume_iops,
            throughput: s.volume_throughput,
            kms_key_id: s.kms_key_id.clone(),
            tags,
        });
    }
    Ok(clusters)
}

/// GCE persistent disks (kOps: pd-ssd unless a `pd-` type is given); returns the etcd cluster names.
pub fn build_gce(cx: &Context<'_>, tasks: &mut gce::Tasks) -> Result<Vec<String>, ModelError> {
    let (clusters, members) = members(cx)?;
    let label_err = |field: &str, message: String| ModelError::Field { cluster: cx.cluster.to_string(), field: field.to_string(), message };
    let cluster_label = plain_label(&safe_cluster_name(cx.cluster)).map_err(|m| label_err("metadata.name", format!("the label k8s-io-cluster-name: {m}")))?;
    for m in members {
        let etcd_label = encode_label(&m.members_tag).map_err(|e| {
            label_err(
                &format!("spec.etcdClusters[{}].etcdMembers", m.etcd_cluster),
                format!("the disk label k8s-io-etcd-{}: {e}: use shorter member names", m.etcd_cluster),
            )
        })?;
        let volume_type = m.spec.volume_type.clone().unwrap_or_else(|| DEFAULT_ETCD_VOLUME_TYPE.into());
        tasks.push(gce::Disk {
            gce_name: gce_name(&format!("{}-etcd-{}-{}", m.member, m.etcd_cluster, cx.cluster)),
            zone: m.zone,
            size_gb: m.spec.volume_size.unwrap_or(DEFAULT_ETCD_VOLUME_SIZE_GIB),
            disk_type: if volume_type.starts_with("pd-") { volume_type } else { ETCD_DISK_TYPE.to_string() },
            labels: [
                ("k8s-io-cluster-name".to_string(), cluster_label.clone()),
                (format!("k8s-io-etcd-{}", m.etcd_cluster), etcd_label),
                ("k8s-io-role-master".to_string(), "master".to_string()),
            ]
            .into(),
            name: m.name,
        });
    }
    Ok(clusters)
}
