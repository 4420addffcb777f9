//! Block volumes and the instances they are attached to (EC2 implementation on `aws-sdk-ec2`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::{Filter, Tag};

/// A volume as the node agents see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    pub id: String,
    pub zone: String,
    pub state: VolumeState,
    pub size_gib: i32,
    pub tags: BTreeMap<String, String>,
    pub attachments: Vec<Attachment>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    pub instance_id: String,
    pub device: String,
    pub state: AttachmentState,
}

/// EC2's volume states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumeState {
    Creating,
    Available,
    InUse,
    Deleting,
    Deleted,
    Error,
    /// A state this code does not know (or none was given).
    Unknown,
}

impl VolumeState {
    /// From EC2's name (`available`, `in-use`, …).
    pub fn from_ec2(s: &str) -> Self {
        match s {
            "creating" => VolumeState::Creating,
            "available" => VolumeState::Available,
            "in-use" => VolumeState::InUse,
            "deleting" => VolumeState::Deleting,
            "deleted" => VolumeState::Deleted,
            "error" => VolumeState::Error,
            _ => VolumeState::Unknown,
        }
    }
}

/// EC2's attachment states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachmentState {
    Attaching,
    Attached,
    Detaching,
    Detached,
    Busy,
    /// A state this code does not know (or none was given).
    Unknown,
}

impl AttachmentState {
    /// From EC2's name (`attaching`, `attached`, …).
    pub fn from_ec2(s: &str) -> Self {
        match s {
            "attaching" => AttachmentState::Attaching,
            "attached" => AttachmentState::Attached,
            "detaching" => AttachmentState::Detaching,
            "detached" => AttachmentState::Detached,
            "busy" => AttachmentState::Busy,
            _ => AttachmentState::Unknown,
        }
    }

    /// On its way off (or off) the instance: no longer the instance's volume.
    pub fn is_leaving(self) -> bool {
        matches!(self, AttachmentState::Detaching | AttachmentState::Detached)
    }
}

/// How to narrow DescribeVolumes; every condition must hold.
#[derive(Debug, Clone, Default)]
pub struct VolumeFilter {
    /// `volume-id` filter (empty: any).
    pub ids: Vec<String>,
    pub zone: Option<String>,
    /// `tag-key` filters.
    pub tag_keys: Vec<String>,
    /// `tag:<key>=<value>` filters.
    pub tags: Vec<(String, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceState {
    Pending,
    Running,
    ShuttingDown,
    Terminated,
    Stopping,
    Stopped,
    Unknown,
}

impl InstanceState {
    /// An instance that still owns its volumes (it may come back, or is going down but not gone).
    pub fn is_alive(self) -> bool {
        !matches!(self, InstanceState::Terminated)
    }

    /// An instance on its way down or down (shutting down, terminated, stopping, stopped).
    pub fn is_going_down(self) -> bool {
        matches!(self, InstanceState::ShuttingDown | InstanceState::Terminated | InstanceState::Stopping | InstanceState::Stopped)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    pub id: String,
    pub state: InstanceState,
    pub zone: Option<String>,
    pub private_ip: Option<String>,
    pub public_ip: Option<String>,
    /// Device names in use on the instance (block device mappings).
    pub devices: Vec<String>,
    /// The instance group the cloud made it for: on AWS its autoscaling group (the
    /// `aws:autoscaling:groupName` tag, which only Auto Scaling writes), on GCE its managed
    /// instance group (`created-by` metadata, which a worker's service account cannot set);
    /// `None` for an instance made otherwise.
    pub group: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("{op} {target}: {code}: {message}")]
    Api {
        op: &'static str,
        target: String,
        code: String,
        message: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// AttachVolume refused because another instance holds the volume (a lost race).
    #[error("attach {volume}: volume is in use by another instance")]
    InUse { volume: String },
}

fn api_err<E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static>(op: &'static str, target: &str, e: E) -> VolumeError {
    VolumeError::Api {
        op,
        target: target.to_string(),
        code: e.code().unwrap_or("unknown").to_string(),
        message: e.message().map(str::to_string).unwrap_or_else(|| format!("{e:?}")),
        source: Box::new(e),
    }
}

/// Volume operations.
pub trait Volumes {
    /// All volumes matching `filter` (one filtered DescribeVolumes, paginated).
    fn find_volumes(&self, filter: &VolumeFilter) -> impl std::future::Future<Output = Result<Vec<Volume>, VolumeError>> + Send;
    /// Attach; `Err(VolumeError::InUse)` when another instance holds it.
    fn attach_volume(&self, volume: &str, instance: &str, device: &str) -> impl std::future::Future<Output = Result<(), VolumeError>> + Send;
    /// Detach (force) a volume from an instance that is gone.
    fn detach_volume(&self, volume: &str, instance: &str) -> impl std::future::Future<Output = Result<(), VolumeError>> + Send;
    fn tag_volume(&self, volume: &str, tags: &[(String, String)]) -> impl std::future::Future<Output = Result<(), VolumeError>> + Send;
    /// Where the device of `volume`, attached under the name `attached_as`, shows up on the
    /// instance, in the order to look (default: EBS's, [`ebs_device_paths`]).
    fn device_paths(&self, by_id_dir: &Path, volume: &str, attached_as: &str) -> Vec<PathBuf> {
        ebs_device_paths(by_id_dir, volume, attached_as)
    }
}

/// Where an EBS volume `vid` attached as `attached_as` shows up: its NVMe by-id link, then the
/// name it was attached under (with its `xvd` twin for an `sd` name).
pub fn ebs_device_paths(by_id_dir: &Path, vid: &str, attached_as: &str) -> Vec<PathBuf> {
    let mut out = vec![by_id_dir.join(format!("nvme-Amazon_Elastic_Block_Store_{}", vid.replace('-', ""))), PathBuf::from(attached_as)];
    if let Some(letter) = attached_as.strip_prefix("/dev/sd") {
        out.push(PathBuf::from(format!("/dev/xvd{letter}")));
    }
    out
}

/// Instance lookups.
pub trait Instances {
    /// The given instances (those the cloud no longer knows are simply absent from the result).
    fn describe_instances(&self, ids: &[String]) -> impl std::future::Future<Output = Result<Vec<Instance>, VolumeError>> + Send;
}

/// The tag Auto Scaling puts on the instances it launches (users may not write `aws:` tags).
pub const ASG_TAG: &str = "aws:autoscaling:groupName";

/// EC2 implementation.
#[derive(Debug, Clone)]
pub struct Ec2 {
    client: aws_sdk_ec2::Client,
}

impl Ec2 {
    pub fn new(client: aws_sdk_ec2::Client) -> Self {
        Ec2 { client }
    }
    pub fn client(&self) -> &aws_sdk_ec2::Client {
        &self.client
    }
}

fn filter(name: &str, value: &str) -> Filter {
    Filter::builder().name(name).values(value).build()
}

fn volume_from(v: &aws_sdk_ec2::types::Volume) -> Volume {
    Volume {
        id: v.volume_id().unwrap_or_default().to_string(),
        zone: v.availability_zone().unwrap_or_default().to_string(),
        state: VolumeState::from_ec2(v.state().map(|s| s.as_str()).unwrap_or_default()),
        size_gib: v.size().unwrap_or_default(),
        tags: v.tags().iter().filter_map(|t| Some((t.key()?.to_string(), t.value().unwrap_or_default().to_string()))).collect(),
        attachments: v
            .attachments()
            .iter()
            .map(|a| Attachment {
                instance_id: a.instance_id().unwrap_or_default().to_string(),
                device: a.device().unwrap_or_default().to_string(),
                state: AttachmentState::from_ec2(a.state().map(|s| s.as_str()).unwrap_or_default()),
            })
            .collect(),
    }
}

impl Volumes for Ec2 {
    async fn find_volumes(&self, f: &VolumeFilter) -> Result<Vec<Volume>, VolumeError> {
        let mut filters = Vec::new();
        if !f.ids.is_empty() {
            filters.push(Filter::builder().name("volume-id").set_values(Some(f.ids.clone())).build());
        }
        if let Some(z) = &f.zone {
            filters.push(filter("availability-zone", z));
        }
        for k in &f.tag_keys {
            filters.push(filter("tag-key", k));
        }
        for (k, v) in &f.tags {
            filters.push(filter(&format!("tag:{k}"), v));
        }
        let volumes = self
            .client
            .describe_volumes()
            .set_filters(Some(filters))
            .into_paginator()
            .items()
            .send()
            .try_collect()
            .await
            .map_err(|e| api_err("DescribeVolumes", "", e))?;
        let mut out: Vec<_> = volumes.iter().map(volume_from).collect();
        // Belt and braces: never trust the server-side zone filter alone.
        if let Some(z) = &f.zone {
            out.retain(|v| &v.zone == z);
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    async fn attach_volume(&self, volume: &str, instance: &str, device: &str) -> Result<(), VolumeError> {
        match self.client.attach_volume().volume_id(volume).instance_id(instance).device(device).send().await {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some("VolumeInUse") => Err(VolumeError::InUse { volume: volume.to_string() }),
            Err(e) => Err(api_err("AttachVolume", volume, e)),
        }
    }

    async fn detach_volume(&self, volume: &str, instance: &str) -> Result<(), VolumeError> {
        self.client.detach_volume().volume_id(volume).instance_id(instance).force(true).send().await.map(|_| ()).or_else(|e| match e.code() {
            // Already detached (AWS detaches a terminated instance's volumes by itself).
            Some("InvalidAttachment.NotFound") => Ok(()),
            _ => Err(api_err("DetachVolume", volume, e)),
        })
    }

    async fn tag_volume(&self, volume: &str, tags: &[(String, String)]) -> Result<(), VolumeError> {
        let tags: Vec<Tag> = tags.iter().map(|(k, v)| Tag::builder().key(k).value(v).build()).collect();
        self.client.create_tags().resources(volume).set_tags(Some(tags)).send().await.map(|_| ()).map_err(|e| api_err("CreateTags", volume, e))
    }
}

impl Instances for Ec2 {
    async fn describe_instances(&self, ids: &[String]) -> Result<Vec<Instance>, VolumeError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        // Filter by instance-id rather than InstanceIds so an unknown id is "absent", not an error.
        let reservations = self
            .client
            .describe_instances()
            .filters(Filter::builder().name("instance-id").set_values(Some(ids.to_vec())).build())
            .into_paginator()
            .items()
            .send()
            .try_collect()
            .await
            .map_err(|e| api_err("DescribeInstances", &ids.join(","), e))?;
        let mut out = Vec::new();
        for i in reservations.iter().flat_map(|r| r.instances()) {
            let state = match i.state().and_then(|s| s.name()).map(|n| n.as_str()) {
                Some("pending") => InstanceState::Pending,
                Some("running") => InstanceState::Running,
                Some("shutting-down") => InstanceState::ShuttingDown,
                Some("terminated") => InstanceState::Terminated,
                Some("stopping") => InstanceState::Stopping,
                Some("stopped") => InstanceState::Stopped,
                _ => InstanceState::Unknown,
            };
            out.push(Instance {
                id: i.instance_id().unwrap_or_default().to_string(),
                state,
                zone: i.placement().and_then(|p| p.availability_zone()).map(str::to_string),
                private_ip: i.private_ip_address().map(str::to_string),
                public_ip: i.public_ip_address().map(str::to_string),
                devices: i.block_device_mappings().iter().filter_map(|b| b.device_name().map(str::to_string)).collect(),
                group: i.tags().iter().find(|t| t.key() == Some(ASG_TAG)).and_then(|t| t.value()).map(str::to_string),
            });
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ebs_device_paths_nvme_then_the_attached_names() {
        assert_eq!(
            ebs_device_paths(Path::new("/dev/disk/by-id"), "vol-0abc", "/dev/sdu"),
            vec![PathBuf::from("/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol0abc"), PathBuf::from("/dev/sdu"), PathBuf::from("/dev/xvdu")]
        );
        assert_eq!(ebs_device_paths(Path::new("/d"), "vol-1", "/dev/xvdv")[1..], [PathBuf::from("/dev/xvdv")]);
    }
}
