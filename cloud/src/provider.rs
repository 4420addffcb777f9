//! One type per need whichever cloud answers it, so the node agents' loops are written once:
//! [`AnyVolumes`] (EC2 or Compute Engine) and [`AnyDns`] (Route53 or Cloud DNS).

use std::path::{Path, PathBuf};

use crate::dns::{Dns, DnsError, Record, RecordChange, Route53Dns};
use crate::gce::{CloudDns, GceVolumes};
use crate::volumes::{Ec2, Instance, Instances, Volume, VolumeError, VolumeFilter, Volumes};

#[derive(Debug)]
pub enum AnyVolumes {
    Ec2(Ec2),
    Gce(Box<GceVolumes>),
}

impl Volumes for AnyVolumes {
    async fn find_volumes(&self, filter: &VolumeFilter) -> Result<Vec<Volume>, VolumeError> {
        match self {
            AnyVolumes::Ec2(c) => c.find_volumes(filter).await,
            AnyVolumes::Gce(c) => c.find_volumes(filter).await,
        }
    }
    async fn attach_volume(&self, volume: &str, instance: &str, device: &str) -> Result<(), VolumeError> {
        match self {
            AnyVolumes::Ec2(c) => c.attach_volume(volume, instance, device).await,
            AnyVolumes::Gce(c) => c.attach_volume(volume, instance, device).await,
        }
    }
    async fn detach_volume(&self, volume: &str, instance: &str) -> Result<(), VolumeError> {
        match self {
            AnyVolumes::Ec2(c) => c.detach_volume(volume, instance).await,
            AnyVolumes::Gce(c) => c.detach_volume(volume, instance).await,
        }
    }
    async fn tag_volume(&self, volume: &str, tags: &[(String, String)]) -> Result<(), VolumeError> {
        match self {
            AnyVolumes::Ec2(c) => c.tag_volume(volume, tags).await,
            AnyVolumes::Gce(c) => c.tag_volume(volume, tags).await,
        }
    }
    fn device_paths(&self, by_id_dir: &Path, volume: &str, attached_as: &str) -> Vec<PathBuf> {
        match self {
            AnyVolumes::Ec2(c) => c.device_paths(by_id_dir, volume, attached_as),
            AnyVolumes::Gce(c) => c.device_paths(by_id_dir, volume, attached_as),
        }
    }
}

impl Instances for AnyVolumes {
    async fn describe_instances(&self, ids: &[String]) -> Result<Vec<Instance>, VolumeError> {
        match self {
            AnyVolumes::Ec2(c) => c.describe_instances(ids).await,
            AnyVolumes::Gce(c) => c.describe_instances(ids).await,
        }
    }
}

#[derive(Debug, Clone)]
pub enum AnyDns {
    Route53(Route53Dns),
    Cloud(CloudDns),
}

impl Dns for AnyDns {
    async fn find_zone_with(&self, id_or_name: Option<&str>, fqdn: &str, private: Option<bool>) -> Result<String, DnsError> {
        match self {
            AnyDns::Route53(d) => d.find_zone_with(id_or_name, fqdn, private).await,
            AnyDns::Cloud(d) => d.find_zone_with(id_or_name, fqdn, private).await,
        }
    }
    async fn list_records(&self, zone: &str, suffix: &str) -> Result<Vec<Record>, DnsError> {
        match self {
            AnyDns::Route53(d) => d.list_records(zone, suffix).await,
            AnyDns::Cloud(d) => d.list_records(zone, suffix).await,
        }
    }
    async fn apply_changes(&self, zone: &str, changes: &[RecordChange]) -> Result<usize, DnsError> {
        match self {
            AnyDns::Route53(d) => d.apply_changes(zone, changes).await,
            AnyDns::Cloud(d) => d.apply_changes(zone, changes).await,
        }
    }
}
