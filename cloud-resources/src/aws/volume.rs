//! The etcd data volumes (one per etcd cluster × member), tagged so protokube finds and claims them.
//! Apply creates them and grows size/type/iops; only `delete --delete-volumes` removes them.

use std::collections::BTreeMap;

use aws_sdk_ec2::types as ec2_t;

use serde_json::json;

use super::task::{AwsFuture, AwsTask, Exec, Typed};
use super::terraform::{tags_value, AwsTerraform};
use super::{api, cluster_filter, required, tag_spec, tags_of, AwsError, AwsTarget, Discovered, Resolved};
use crate::model::ClusterModel;
use crate::plan::{Action, Change, Kind};
use crate::tasks::Fields;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    pub name: String,
    pub zone: String,
    pub size_gib: i64,
    pub volume_type: String,
    pub encrypted: bool,
    pub iops: Option<i64>,
    pub throughput: Option<i64>,
    /// Set at creation (not compared).
    pub kms_key_id: Option<String>,
    pub tags: BTreeMap<String, String>,
}

impl AwsTask for Volume {
    fn kind(&self) -> Kind {
        Kind::Volume
    }
    fn name(&self) -> String {
        self.name.clone()
    }
    fn tags(&self) -> BTreeMap<String, String> {
        self.tags.clone()
    }
    fn fields(&self, f: &mut Fields) {
        f.set("zone", &self.zone)
            .set("size", self.size_gib)
            .set("type", &self.volume_type)
            .set("encrypted", self.encrypted)
            .opt("iops", self.iops)
            .opt("throughput", self.throughput);
    }
    fn find<'a>(t: &'a AwsTarget, model: &'a ClusterModel, _resolved: &'a Resolved, d: &'a mut Discovered) -> AwsFuture<'a> {
        Box::pin(discover(t, model, d))
    }
    fn render_terraform(&self, t: &mut AwsTerraform) {
        let mut body = json!({
            "availability_zone": self.zone,
            "size": self.size_gib,
            "type": self.volume_type,
            "encrypted": self.encrypted,
            "tags": tags_value(&self.tags),
        });
        if let Some(i) = self.iops {
            body["iops"] = json!(i);
        }
        if let Some(t) = self.throughput {
            body["throughput"] = json!(t);
        }
        if let Some(k) = &self.kms_key_id {
            body["kms_key_id"] = json!(k);
        }
        t.blocks.add("aws_ebs_volume", &self.name, body);
    }
    fn render_aws<'a>(&'a self, cx: Exec<'a>, c: &'a Change) -> AwsFuture<'a> {
        Box::pin(async move {
            let c = Typed::<Volume>::of(c);
            let (t, name) = (cx.target, c.name);
            match c.action {
                Action::Create => {
                    let want = c.want()?;
                    let resp = t
                        .ec2
                        .create_volume()
                        .availability_zone(&want.zone)
                        .size(super::i32_of(want.size_gib, "Volume", name, "size")?)
                        .volume_type(ec2_t::VolumeType::from(want.volume_type.as_str()))
                        .set_iops(want.iops.map(|i| super::i32_of(i, "Volume", name, "iops")).transpose()?)
                        .set_throughput(want.throughput.map(|t| super::i32_of(t, "Volume", name, "throughput")).transpose()?)
                        .encrypted(want.encrypted)
                        .set_kms_key_id(want.kms_key_id.clone())
                        .tag_specifications(tag_spec(ec2_t::ResourceType::Volume, &want.tags))
                        .send()
                        .await
                        .map_err(|e| api("CreateVolume", name, e))?;
                    cx.ids.volumes.insert(name.to_string(), required(resp.volume_id(), "Volume", name, "VolumeId")?.to_string());
                }
                Action::Update(_) => {
                    let want = c.want()?;
                    let id = c.id()?;
                    if c.attributes_changed() {
                        t.ec2
                            .modify_volume()
                            .volume_id(&id)
                            .size(super::i32_of(want.size_gib, "Volume", name, "size")?)
                            .volume_type(ec2_t::VolumeType::from(want.volume_type.as_str()))
                            .set_iops(want.iops.map(|i| super::i32_of(i, "Volume", name, "iops")).transpose()?)
                            .set_throughput(want.throughput.map(|t| super::i32_of(t, "Volume", name, "throughput")).transpose()?)
                            .send()
                            .await
                            .map_err(|e| api("ModifyVolume", name, e))?;
                    }
                    if c.tags_changed() {
                        t.create_tags(&id, &want.tags).await?;
                    }
                }
                Action::Delete => {
                    let id = c.id()?;
                    t.delete_with_retry(name, || async {
                        t.ec2.delete_volume().volume_id(&id).send().await.map(|_| ()).map_err(|e| api("DeleteVolume", name, e))
                    })
                    .await?;
                }
            }
            Ok(())
        })
    }
}

async fn discover(t: &AwsTarget, model: &ClusterModel, d: &mut Discovered) -> Result<(), AwsError> {
    let cluster = &model.cluster;
    let volumes = t
        .ec2
        .describe_volumes()
        .filters(cluster_filter(cluster))
        .into_paginator()
        .items()
        .send()
        .try_collect()
        .await
        .map_err(|e| api("DescribeVolumes", cluster, e))?;
    for v in &volumes {
        let tags = tags_of(v.tags());
        // Only etcd volumes are ours (root volumes of instances carry the cluster tag too).
        if !tags.keys().any(|k| k.starts_with("k8s.io/etcd/")) {
            continue;
        }
        let id = required(v.volume_id(), "Volume", cluster, "VolumeId")?.to_string();
        let name = tags.get("Name").cloned().unwrap_or_else(|| id.clone());
        d.ids.volumes.insert(name.clone(), id.clone());
        // iops/throughput are compared only where the spec sets them (gp3 always reports some).
        let want = model.tasks.volumes.iter().find(|w| w.name == name);
        let task = Volume {
            zone: required(v.availability_zone(), "Volume", &name, "AvailabilityZone")?.to_string(),
            size_gib: v.size().map(i64::from).ok_or_else(|| AwsError::Missing {
                kind: "Volume",
                name: name.clone(),
                message: "the API returned no Size".into(),
            })?,
            volume_type: v.volume_type().map(|t| t.as_str().to_string()).unwrap_or_default(),
            encrypted: v.encrypted().unwrap_or(false),
            iops: v.iops().filter(|_| want.is_some_and(|w| w.iops.is_some())).map(i64::from),
            throughput: v.throughput().filter(|_| want.is_some_and(|w| w.throughput.is_some())).map(i64::from),
            kms_key_id: v.kms_key_id().map(str::to_string),
            tags,
            name,
        };
        d.found(task, id);
    }
    Ok(())
}
