//! Persistent disks and instances (Compute v1) behind [`Volumes`] and [`Instances`]:
//! `disks.list` per zone of the region with a label filter, `instances.attachDisk` READ_WRITE with
//! the disk's name as device name (so the device is `/dev/disk/by-id/google-<name>`),
//! `instances.detachDisk`, `instances.get`, `disks.setLabels` with the label fingerprint (retried
//! on 412), every change waited for ([`super::operations::wait`]) within a bound.
//!
//! Ids: a volume is its disk's name, an instance its name (what Compute addresses them by; a MIG
//! remakes an instance under the same name). An instance holds a disk while the disk's `users[]`
//! lists it. Zones are learnt from the answers (disk → zone, instance → zone from `users[]`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use super::api::{enc, GoogleApi, GoogleApiError};
use super::labels::{label_to_tag, tag_key_to_label_key, tag_to_label, LabelError};
use super::operations::{self, OperationError};
use crate::volumes::{Attachment, AttachmentState, Instance, InstanceState, Instances, Volume, VolumeError, VolumeFilter, VolumeState, Volumes};

/// GCE's reason (and operation error code) for a second writer.
pub const IN_USE_REASON: &str = "resourceInUseByAnotherResource";
const IN_USE_CODE: &str = "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE";
/// Tries of `disks.setLabels` when the fingerprint went stale in between (412).
const LABEL_TRIES: u32 = 5;
const MAX_PAGES: usize = 100;

/// The device link of a disk attached with device name `device_name`.
pub fn device_link(by_id_dir: &Path, device_name: &str) -> PathBuf {
    by_id_dir.join(format!("google-{device_name}"))
}

/// The last path segment of a URL or partial path.
fn last(s: &str) -> &str {
    s.rsplit('/').next().unwrap_or(s)
}

/// The segment after `key` (`zones` in `…/zones/Z/instances/N`).
fn after<'a>(s: &'a str, key: &str) -> Option<&'a str> {
    let mut it = s.split('/');
    it.by_ref().find(|p| *p == key)?;
    it.next()
}

/// The `filter` of `disks.list` that selects what `f` asks (labels; one name).
pub fn disk_filter(f: &VolumeFilter) -> Result<String, LabelError> {
    let mut terms = Vec::new();
    for (k, v) in &f.tags {
        let (lk, lv) = tag_to_label(k, v)?;
        terms.push(format!("(labels.{lk} = \"{lv}\")"));
    }
    for k in &f.tag_keys {
        terms.push(format!("(labels.{}:*)", tag_key_to_label_key(k)?));
    }
    if let [one] = f.ids.as_slice() {
        terms.push(format!("(name = \"{one}\")"));
    }
    Ok(terms.join(" AND "))
}

/// A disk resource as a [`Volume`] (its labels as the tags they stand for).
pub fn volume_from(d: &Value) -> Volume {
    let labels = d["labels"].as_object().cloned().unwrap_or_default();
    let tags = labels.iter().map(|(k, v)| label_to_tag(k, v.as_str().unwrap_or_default())).collect();
    let users: Vec<&str> = d["users"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    let name = d["name"].as_str().unwrap_or_default().to_string();
    let state = match d["status"].as_str().unwrap_or_default() {
        "CREATING" | "RESTORING" => VolumeState::Creating,
        "READY" if users.is_empty() => VolumeState::Available,
        "READY" => VolumeState::InUse,
        "DELETING" => VolumeState::Deleting,
        "FAILED" => VolumeState::Error,
        _ => VolumeState::Unknown,
    };
    Volume {
        zone: last(d["zone"].as_str().unwrap_or_default()).to_string(),
        state,
        size_gib: d["sizeGb"].as_str().and_then(|s| s.parse().ok()).or_else(|| d["sizeGb"].as_i64().map(|n| n as i32)).unwrap_or(0),
        tags,
        // GCE reports a disk in `users[]` once it is attached (the attach operation is done).
        attachments: users.iter().map(|u| Attachment { instance_id: last(u).to_string(), device: name.clone(), state: AttachmentState::Attached }).collect(),
        id: name,
    }
}

/// An instance resource as an [`Instance`]. GCE's TERMINATED is a stopped VM (it keeps its disks
/// and may start again); a deleted instance is simply not found.
pub fn instance_from(i: &Value) -> Instance {
    let state = match i["status"].as_str().unwrap_or_default() {
        "PROVISIONING" | "STAGING" => InstanceState::Pending,
        "RUNNING" => InstanceState::Running,
        "STOPPING" | "SUSPENDING" => InstanceState::Stopping,
        "STOPPED" | "SUSPENDED" | "TERMINATED" => InstanceState::Stopped,
        _ => InstanceState::Unknown,
    };
    let nic = &i["networkInterfaces"][0];
    Instance {
        id: i["name"].as_str().unwrap_or_default().to_string(),
        state,
        zone: i["zone"].as_str().map(|z| last(z).to_string()),
        private_ip: nic["networkIP"].as_str().map(str::to_string),
        public_ip: nic["accessConfigs"].as_array().into_iter().flatten().find_map(|a| a["natIP"].as_str()).map(str::to_string),
        devices: i["disks"].as_array().into_iter().flatten().filter_map(|d| d["deviceName"].as_str()).map(str::to_string).collect(),
        group: super::instances::metadata_items(&i["metadata"])
            .get("created-by")
            .and_then(|c| super::migs::parse_created_by(c))
            .map(|(_, _, mig)| mig.to_string()),
    }
}

fn api_err(op: &'static str, target: &str, e: GoogleApiError) -> VolumeError {
    VolumeError::Api { op, target: target.to_string(), code: e.code(), message: e.to_string(), source: Box::new(e) }
}

fn op_err(op: &'static str, target: &str, e: OperationError) -> VolumeError {
    VolumeError::Api { op, target: target.to_string(), code: e.code(), message: e.to_string(), source: Box::new(e) }
}

fn label_err(target: &str, e: LabelError) -> VolumeError {
    VolumeError::Api { op: "labels", target: target.to_string(), code: "invalidLabel".into(), message: e.to_string(), source: Box::new(e) }
}

/// Compute access for one project and region.
#[derive(Debug)]
pub struct GceVolumes {
    api: GoogleApi,
    /// `…/compute/v1/projects/<project>`.
    project_url: String,
    project: String,
    region: String,
    /// The zone to assume for a disk or instance not seen yet (this instance's).
    home_zone: String,
    op_bound: Duration,
    zones: Mutex<Option<Vec<String>>>,
    disk_zones: Mutex<BTreeMap<String, String>>,
    instance_zones: Mutex<BTreeMap<String, String>>,
}

impl GceVolumes {
    /// `compute`: the Compute v1 base (`https://compute.googleapis.com/compute/v1`, or an
    /// emulator's); `op_bound`: the longest wait for one operation.
    pub fn new(api: GoogleApi, compute: &str, project: &str, home_zone: &str, op_bound: Duration) -> GceVolumes {
        GceVolumes {
            api,
            project_url: format!("{}/projects/{project}", compute.trim_end_matches('/')),
            project: project.to_string(),
            region: region_of(home_zone).to_string(),
            home_zone: home_zone.to_string(),
            op_bound,
            zones: Mutex::new(None),
            disk_zones: Mutex::default(),
            instance_zones: Mutex::default(),
        }
    }

    fn remember(map: &Mutex<BTreeMap<String, String>>, name: &str, zone: &str) {
        if let Ok(mut m) = map.lock() {
            m.insert(name.to_string(), zone.to_string());
        }
    }

    fn known(map: &Mutex<BTreeMap<String, String>>, name: &str) -> Option<String> {
        map.lock().ok().and_then(|m| m.get(name).cloned())
    }

    fn zone_url(&self, zone: &str) -> String {
        format!("{}/zones/{zone}", self.project_url)
    }

    /// The zones of the region (asked once).
    async fn region_zones(&self) -> Result<Vec<String>, VolumeError> {
        if let Some(z) = self.zones.lock().ok().and_then(|z| z.clone()) {
            return Ok(z);
        }
        let url = format!("{}/regions/{}", self.project_url, self.region);
        let r = self.api.get(&url).await.map_err(|e| api_err("regions.get", &self.region, e))?;
        let mut zones: Vec<String> = r["zones"].as_array().into_iter().flatten().filter_map(Value::as_str).map(|z| last(z).to_string()).collect();
        zones.sort();
        if zones.is_empty() {
            zones.push(self.home_zone.clone());
        }
        if let Ok(mut c) = self.zones.lock() {
            *c = Some(zones.clone());
        }
        Ok(zones)
    }

    async fn get_disk(&self, name: &str) -> Result<Option<Value>, VolumeError> {
        let mut zones = vec![Self::known(&self.disk_zones, name).unwrap_or_else(|| self.home_zone.clone())];
        for z in self.region_zones().await? {
            if !zones.contains(&z) {
                zones.push(z);
            }
        }
        for z in zones {
            match self.api.get(&format!("{}/disks/{}", self.zone_url(&z), enc(name))).await {
                Ok(d) => {
                    Self::remember(&self.disk_zones, name, &z);
                    return Ok(Some(d));
                }
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(api_err("disks.get", name, e)),
            }
        }
        Ok(None)
    }

    fn disk_zone(&self, name: &str) -> String {
        Self::known(&self.disk_zones, name).unwrap_or_else(|| self.home_zone.clone())
    }
}

/// `europe-west1-b` → `europe-west1`.
pub fn region_of(zone: &str) -> &str {
    zone.rsplit_once('-').map(|(r, _)| r).unwrap_or(zone)
}

impl Volumes for GceVolumes {
    async fn find_volumes(&self, f: &VolumeFilter) -> Result<Vec<Volume>, VolumeError> {
        let filter = disk_filter(f).map_err(|e| label_err("VolumeFilter", e))?;
        let zones = match &f.zone {
            Some(z) => vec![z.clone()],
            None => self.region_zones().await?,
        };
        let wanted: Vec<(String, String)> =
            f.tags.iter().map(|(k, v)| tag_to_label(k, v)).collect::<Result<_, _>>().map_err(|e| label_err("VolumeFilter", e))?;
        let wanted_keys: Vec<String> =
            f.tag_keys.iter().map(|k| tag_key_to_label_key(k)).collect::<Result<_, _>>().map_err(|e| label_err("VolumeFilter", e))?;
        let mut out = Vec::new();
        for z in zones {
            let mut url = format!("{}/disks", self.zone_url(&z));
            if !filter.is_empty() {
                url.push_str(&format!("?filter={}", enc(&filter)));
            }
            let disks = self.api.list_all(&url, "items", MAX_PAGES).await.map_err(|e| api_err("disks.list", &z, e))?;
            for d in disks {
                // Belt and braces: never trust the server-side filter alone.
                let labels = &d["labels"];
                if !wanted.iter().all(|(k, v)| labels[k].as_str() == Some(v)) || !wanted_keys.iter().all(|k| labels.get(k).is_some()) {
                    continue;
                }
                let v = volume_from(&d);
                if !f.ids.is_empty() && !f.ids.contains(&v.id) {
                    continue;
                }
                Self::remember(&self.disk_zones, &v.id, &v.zone);
                for u in d["users"].as_array().into_iter().flatten().filter_map(Value::as_str) {
                    if let Some(uz) = after(u, "zones") {
                        Self::remember(&self.instance_zones, last(u), uz);
                    }
                }
                out.push(v);
            }
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    /// GCE names the device by the disk (`deviceName` = disk name); `_device` is not used.
    async fn attach_volume(&self, volume: &str, instance: &str, _device: &str) -> Result<(), VolumeError> {
        let zone = self.disk_zone(volume);
        let url = format!("{}/instances/{}/attachDisk", self.zone_url(&zone), enc(instance));
        let body = json!({
            "source": format!("projects/{}/zones/{zone}/disks/{volume}", self.project),
            "deviceName": volume,
            "mode": "READ_WRITE",
            "type": "PERSISTENT",
            "autoDelete": false,
        });
        let op = match self.api.post(&url, &body).await {
            Ok(op) => op,
            Err(e) if e.reason() == Some(IN_USE_REASON) => return Err(VolumeError::InUse { volume: volume.to_string() }),
            Err(e) => return Err(api_err("instances.attachDisk", volume, e)),
        };
        match operations::wait(&self.api, &self.zone_url(&zone), op, self.op_bound).await {
            Ok(()) => Ok(()),
            Err(OperationError::Failed { code, .. }) if code == IN_USE_CODE => Err(VolumeError::InUse { volume: volume.to_string() }),
            Err(e) => Err(op_err("instances.attachDisk", volume, e)),
        }
    }

    /// Detach from `instance` whatever device it has the disk under; an instance that is gone, or
    /// that no longer has the disk, is already detached.
    async fn detach_volume(&self, volume: &str, instance: &str) -> Result<(), VolumeError> {
        let zone = Self::known(&self.instance_zones, instance).unwrap_or_else(|| self.disk_zone(volume));
        let inst = match self.api.get(&format!("{}/instances/{}", self.zone_url(&zone), enc(instance))).await {
            Ok(i) => i,
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(api_err("instances.get", instance, e)),
        };
        let device = inst["disks"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|d| d["source"].as_str().is_some_and(|s| last(s) == volume && after(s, "zones").is_none_or(|z| z == zone)))
            .and_then(|d| d["deviceName"].as_str())
            .map(str::to_string);
        let Some(device) = device else { return Ok(()) };
        let url = format!("{}/instances/{}/detachDisk?deviceName={}", self.zone_url(&zone), enc(instance), enc(&device));
        let op = self.api.call(Method::POST, &url, None, None).await.map_err(|e| api_err("instances.detachDisk", volume, e))?;
        operations::wait(&self.api, &self.zone_url(&zone), op, self.op_bound).await.map_err(|e| op_err("instances.detachDisk", volume, e))
    }

    /// Merge `tags` (as labels) into the disk's labels with its fingerprint; a stale fingerprint
    /// (412, someone else labelled it meanwhile) is read again, at most [`LABEL_TRIES`] times.
    async fn tag_volume(&self, volume: &str, tags: &[(String, String)]) -> Result<(), VolumeError> {
        let add: Vec<(String, String)> = tags.iter().map(|(k, v)| tag_to_label(k, v)).collect::<Result<_, _>>().map_err(|e| label_err(volume, e))?;
        let mut tries = 0;
        loop {
            tries += 1;
            let Some(d) = self.get_disk(volume).await? else {
                return Err(VolumeError::Api {
                    op: "disks.setLabels",
                    target: volume.to_string(),
                    code: "notFound".into(),
                    message: format!("disk {volume} not found in region {}", self.region),
                    source: format!("disk {volume} not found").into(),
                });
            };
            let zone = last(d["zone"].as_str().unwrap_or(&self.home_zone)).to_string();
            let mut labels = d["labels"].as_object().cloned().unwrap_or_default();
            if add.iter().all(|(k, v)| labels.get(k).and_then(Value::as_str) == Some(v.as_str())) {
                return Ok(());
            }
            for (k, v) in &add {
                labels.insert(k.clone(), json!(v));
            }
            let body = json!({"labels": labels, "labelFingerprint": d["labelFingerprint"].as_str().unwrap_or_default()});
            let url = format!("{}/disks/{}/setLabels", self.zone_url(&zone), enc(volume));
            match self.api.post(&url, &body).await {
                Ok(op) => return operations::wait(&self.api, &self.zone_url(&zone), op, self.op_bound).await.map_err(|e| op_err("disks.setLabels", volume, e)),
                Err(e) if e.status() == Some(412) && tries < LABEL_TRIES => {
                    tracing::info!(disk = %volume, "label fingerprint changed meanwhile; reading the disk again");
                }
                Err(e) => return Err(api_err("disks.setLabels", volume, e)),
            }
        }
    }

    fn device_paths(&self, by_id_dir: &Path, volume: &str, attached_as: &str) -> Vec<PathBuf> {
        let mut out = vec![device_link(by_id_dir, attached_as)];
        if attached_as != volume {
            out.push(device_link(by_id_dir, volume));
        }
        out
    }
}

impl Instances for GceVolumes {
    async fn describe_instances(&self, ids: &[String]) -> Result<Vec<Instance>, VolumeError> {
        let mut out = Vec::new();
        for name in ids {
            let mut zones = vec![Self::known(&self.instance_zones, name).unwrap_or_else(|| self.home_zone.clone())];
            if Self::known(&self.instance_zones, name).is_none() {
                for z in self.region_zones().await? {
                    if !zones.contains(&z) {
                        zones.push(z);
                    }
                }
            }
            for z in zones {
                match self.api.get(&format!("{}/instances/{}", self.zone_url(&z), enc(name))).await {
                    Ok(i) => {
                        Self::remember(&self.instance_zones, name, &z);
                        out.push(instance_from(&i));
                        break;
                    }
                    Err(e) if e.is_not_found() => continue,
                    Err(e) => return Err(api_err("instances.get", name, e)),
                }
            }
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_name_kops_labels() {
        let f = VolumeFilter {
            tags: vec![("KubernetesCluster".into(), "gce.k8s.example.com".into())],
            tag_keys: vec!["k8s.io/role/master".into()],
            ..Default::default()
        };
        assert_eq!(disk_filter(&f).unwrap(), "(labels.k8s-io-cluster-name = \"gce-k8s-example-com\") AND (labels.k8s-io-role-master:*)");
        let one = VolumeFilter { ids: vec!["b-etcd-main".into()], ..Default::default() };
        assert_eq!(disk_filter(&one).unwrap(), "(name = \"b-etcd-main\")");
    }

    #[test]
    fn disks_and_instances_read_as_volumes_and_instances() {
        let d = json!({
            "name": "b-etcd-main-x", "zone": "https://c/compute/v1/projects/p/zones/europe-west1-b", "status": "READY", "sizeGb": "20",
            "labels": {"k8s-io-cluster-name": "x", "k8s-io-etcd-main": "b-2fb-2cc-2cd", "keelson-io-etcd-formatted": "ext4"},
            "users": ["https://c/compute/v1/projects/p/zones/europe-west1-b/instances/cp-b-1"],
        });
        let v = volume_from(&d);
        assert_eq!((v.id.as_str(), v.zone.as_str(), v.state, v.size_gib), ("b-etcd-main-x", "europe-west1-b", VolumeState::InUse, 20));
        assert_eq!(v.tags.get("k8s.io/etcd/main").map(String::as_str), Some("b/b,c,d"));
        assert_eq!(v.tags.get("keelson.io/etcd-formatted").map(String::as_str), Some("ext4"));
        assert_eq!(v.attachments, vec![Attachment { instance_id: "cp-b-1".into(), device: "b-etcd-main-x".into(), state: AttachmentState::Attached }]);
        let i = instance_from(&json!({"name": "cp-b-1", "status": "TERMINATED", "zone": "zones/europe-west1-b",
            "networkInterfaces": [{"networkIP": "10.0.16.3", "accessConfigs": [{"natIP": "34.1.2.3"}]}], "disks": [{"deviceName": "persistent-disk-0"}]}));
        assert_eq!(i.state, InstanceState::Stopped, "TERMINATED is a stopped VM that keeps its disks");
        assert!(i.state.is_alive());
        assert_eq!((i.private_ip.as_deref(), i.public_ip.as_deref()), (Some("10.0.16.3"), Some("34.1.2.3")));
        assert_eq!(i.group, None, "made by no MIG");
        let made = instance_from(&json!({"name": "cp-b-1", "status": "RUNNING", "zone": "zones/europe-west1-b",
            "metadata": {"items": [{"key": "created-by", "value": "projects/1/zones/europe-west1-b/instanceGroupManagers/b-cp-b-c"}]}}));
        assert_eq!(made.group.as_deref(), Some("b-cp-b-c"));
        assert_eq!(region_of("europe-west1-b"), "europe-west1");
        assert_eq!(after("projects/p/zones/z1/instances/n", "zones"), Some("z1"));
    }
}
