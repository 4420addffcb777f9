//! Launch templates: one per instance group; a change makes a new version (the default), which
//! the group's autoscaling group then pins.

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_ec2::types as ec2_t;
use base64::Engine as _;

use super::task::{actual_id, joined, typed, Fields, Task};
use super::{api, cluster_filter, ec2_tags, required, tag_spec, tags_of, AwsError, AwsTarget, Discovered, Ids, Resolved};
use crate::model::ClusterModel;
use crate::plan::{Action, Change, Resource};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootVolume {
    pub size_gib: i64,
    pub volume_type: String,
    pub encrypted: bool,
    pub iops: Option<i64>,
    pub throughput: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spot {
    /// Empty: up to the on-demand price.
    pub max_price: String,
    pub interruption: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchTemplate {
    pub name: String,
    /// The AMI id.
    pub image: String,
    pub instance_type: String,
    pub http_tokens: String,
    pub hop_limit: i64,
    pub root_volume: RootVolume,
    /// Security group names (or ids the spec gives).
    pub security_groups: BTreeSet<String>,
    pub instance_profile: String,
    /// sha256 of the user-data bytes.
    pub user_data_sha256: String,
    /// Only when the spec sets `associatePublicIp` (else the subnet decides).
    pub associate_public_ip: Option<bool>,
    pub spot: Option<Spot>,
    pub cpu_credits: Option<String>,
    pub tags: BTreeMap<String, String>,
}

impl LaunchTemplate {
    pub fn fields(&self, f: &mut Fields) {
        let rv = &self.root_volume;
        f.set("image", &self.image)
            .set("instance_type", &self.instance_type)
            .set("metadata.http_tokens", &self.http_tokens)
            .set("metadata.hop_limit", self.hop_limit)
            .set("root_volume.size", rv.size_gib)
            .set("root_volume.type", &rv.volume_type)
            .set("root_volume.encrypted", rv.encrypted)
            .opt("root_volume.iops", rv.iops)
            .opt("root_volume.throughput", rv.throughput)
            .set("security_groups", joined(&self.security_groups))
            .set("instance_profile", &self.instance_profile)
            .set("user_data.sha256", &self.user_data_sha256)
            .opt("associate_public_ip", self.associate_public_ip)
            .opt("cpu_credits", self.cpu_credits.as_ref());
        if let Some(spot) = &self.spot {
            f.set("spot.max_price", &spot.max_price).set("spot.interruption", &spot.interruption);
        }
    }
}

pub fn desired(model: &ClusterModel, resolved: &Resolved, out: &mut Vec<Resource>) {
    for lt in &model.launch_templates {
        let image = resolved.images.get(&lt.image).map(|(id, _)| id.clone()).unwrap_or_else(|| lt.image.clone());
        let task = LaunchTemplate {
            name: lt.name.clone(),
            image,
            instance_type: lt.machine_type.clone(),
            http_tokens: lt.http_tokens.clone(),
            hop_limit: lt.hop_limit,
            root_volume: RootVolume {
                size_gib: lt.root_volume_size,
                volume_type: lt.root_volume_type.clone(),
                encrypted: lt.root_volume_encrypted,
                iops: lt.root_volume_iops,
                throughput: lt.root_volume_throughput,
            },
            security_groups: lt.security_groups.iter().chain(lt.additional_security_groups.iter()).cloned().collect(),
            instance_profile: lt.instance_profile.clone(),
            user_data_sha256: base::sha256_hex(&lt.user_data),
            associate_public_ip: lt.associate_public_ip_explicit.then_some(lt.associate_public_ip),
            spot: lt.spot.as_ref().map(|s| Spot { max_price: s.max_price.clone().unwrap_or_default(), interruption: s.interruption_behavior.clone() }),
            cpu_credits: lt.cpu_credits.clone(),
            tags: lt.tags.clone(),
        };
        out.push(Task::LaunchTemplate(task).view(None));
    }
}

pub async fn discover(t: &AwsTarget, model: &ClusterModel, d: &mut Discovered) -> Result<(), AwsError> {
    let cluster = &model.cluster;
    let lts = t.ec2.describe_launch_templates().filters(cluster_filter(cluster)).send().await.map_err(|e| api("DescribeLaunchTemplates", cluster, e))?;
    for lt in lts.launch_templates() {
        let id = required(lt.launch_template_id(), "LaunchTemplate", cluster, "LaunchTemplateId")?.to_string();
        let name = required(lt.launch_template_name(), "LaunchTemplate", &id, "LaunchTemplateName")?.to_string();
        d.ids.launch_templates.insert(name.clone(), id.clone());
        if let Some(v) = lt.latest_version_number() {
            d.ids.lt_versions.insert(name.clone(), v);
        }
        let versions = t
            .ec2
            .describe_launch_template_versions()
            .launch_template_id(&id)
            .versions("$Latest")
            .send()
            .await
            .map_err(|e| api("DescribeLaunchTemplateVersions", &name, e))?;
        let data = versions.launch_template_versions().first().and_then(|v| v.launch_template_data()).ok_or_else(|| AwsError::Missing {
            kind: "LaunchTemplate",
            name: name.clone(),
            message: "its latest version has no launch template data".into(),
        })?;
        let metadata = data.metadata_options();
        let ebs = data.block_device_mappings().first().and_then(|b| b.ebs());
        let user_data = match data.user_data() {
            Some(b) => base64::engine::general_purpose::STANDARD.decode(b).map_err(|e| AwsError::Missing {
                kind: "LaunchTemplate",
                name: name.clone(),
                message: format!("its user-data is not base64: {e}"),
            })?,
            None => Vec::new(),
        };
        let task = LaunchTemplate {
            image: data.image_id().unwrap_or_default().to_string(),
            instance_type: data.instance_type().map(|t| t.as_str().to_string()).unwrap_or_default(),
            http_tokens: metadata.and_then(|m| m.http_tokens()).map(|t| t.as_str().to_string()).unwrap_or_default(),
            hop_limit: metadata.and_then(|m| m.http_put_response_hop_limit()).map(i64::from).unwrap_or(1),
            root_volume: RootVolume {
                size_gib: ebs.and_then(|e| e.volume_size()).map(i64::from).unwrap_or_default(),
                volume_type: ebs.and_then(|e| e.volume_type()).map(|t| t.as_str().to_string()).unwrap_or_default(),
                encrypted: ebs.and_then(|e| e.encrypted()).unwrap_or(false),
                iops: ebs.and_then(|e| e.iops()).map(i64::from),
                throughput: ebs.and_then(|e| e.throughput()).map(i64::from),
            },
            security_groups: data
                .security_group_ids()
                .iter()
                .chain(data.network_interfaces().iter().flat_map(|n| n.groups()))
                .map(|id| d.ids.sg_name(id))
                .collect(),
            instance_profile: data.iam_instance_profile().and_then(|p| p.name()).unwrap_or_default().to_string(),
            user_data_sha256: base::sha256_hex(&user_data),
            associate_public_ip: data.network_interfaces().first().and_then(|n| n.associate_public_ip_address()),
            spot: data.instance_market_options().and_then(|m| m.spot_options()).map(|s| Spot {
                max_price: s.max_price().unwrap_or_default().to_string(),
                interruption: s.instance_interruption_behavior().map(|b| b.as_str()).unwrap_or("terminate").to_string(),
            }),
            cpu_credits: data.credit_specification().and_then(|c| c.cpu_credits()).map(str::to_string),
            tags: tags_of(lt.tags()),
            name,
        };
        d.resources.push(Task::LaunchTemplate(task).view(Some(id)));
    }
    Ok(())
}

impl AwsTarget {
    pub(super) async fn execute_launch_template(&self, model: &ClusterModel, resolved: &Resolved, c: &Change, ids: &mut Ids) -> Result<(), AwsError> {
        let name = c.name.as_str();
        let want = |r| typed(r, c.kind, name, "desired", |t| if let Task::LaunchTemplate(l) = t { Some(l) } else { None });
        match &c.action {
            Action::Create => {
                let want = want(c.desired.as_ref())?;
                let data = launch_template_data(model, resolved, ids, name)?;
                let resp = self
                    .ec2
                    .create_launch_template()
                    .launch_template_name(name)
                    .launch_template_data(data)
                    .tag_specifications(tag_spec(ec2_t::ResourceType::LaunchTemplate, &want.tags))
                    .send()
                    .await
                    .map_err(|e| api("CreateLaunchTemplate", name, e))?;
                let created = resp.launch_template();
                let id = required(created.and_then(|l| l.launch_template_id()), "LaunchTemplate", name, "LaunchTemplateId")?;
                ids.launch_templates.insert(name.to_string(), id.to_string());
                ids.lt_versions.insert(name.to_string(), created.and_then(|l| l.latest_version_number()).unwrap_or(1));
            }
            Action::Update(fields) => {
                let want = want(c.desired.as_ref())?;
                let id = actual_id(c.actual.as_ref(), c.kind, name)?;
                if fields.iter().any(|f| !f.field.starts_with("tags[")) {
                    let data = launch_template_data(model, resolved, ids, name)?;
                    let resp = self
                        .ec2
                        .create_launch_template_version()
                        .launch_template_id(&id)
                        .launch_template_data(data)
                        .send()
                        .await
                        .map_err(|e| api("CreateLaunchTemplateVersion", name, e))?;
                    let version = resp.launch_template_version().and_then(|v| v.version_number()).ok_or_else(|| AwsError::Missing {
                        kind: "LaunchTemplate",
                        name: name.into(),
                        message: "the API returned no VersionNumber for the new version".into(),
                    })?;
                    ids.lt_versions.insert(name.to_string(), version);
                    self.ec2
                        .modify_launch_template()
                        .launch_template_id(&id)
                        .default_version(version.to_string())
                        .send()
                        .await
                        .map_err(|e| api("ModifyLaunchTemplate", name, e))?;
                }
                if fields.iter().any(|f| f.field.starts_with("tags[")) {
                    self.create_tags(&id, &want.tags).await?;
                }
            }
            Action::Delete => {
                let id = actual_id(c.actual.as_ref(), c.kind, name)?;
                self.ec2.delete_launch_template().launch_template_id(id).send().await.map_err(|e| api("DeleteLaunchTemplate", name, e))?;
            }
        }
        Ok(())
    }
}

/// The launch template data of an instance group, with every name resolved to its id.
fn launch_template_data(model: &ClusterModel, resolved: &Resolved, ids: &Ids, name: &str) -> Result<ec2_t::RequestLaunchTemplateData, AwsError> {
    let lt = model.launch_templates.iter().find(|l| l.name == name).ok_or_else(|| AwsError::Missing {
        kind: "LaunchTemplate",
        name: name.into(),
        message: "not in the model".into(),
    })?;
    let (image, root_device) =
        resolved.images.get(&lt.image).cloned().ok_or_else(|| AwsError::Image { image: lt.image.clone(), message: "not resolved".into() })?;
    let mut sg_ids = Vec::new();
    for sg in lt.security_groups.iter().chain(lt.additional_security_groups.iter()) {
        let id = ids.security_groups.get(sg).cloned().ok_or_else(|| AwsError::Missing {
            kind: "SecurityGroup",
            name: sg.clone(),
            message: format!("needed by launch template {name}"),
        })?;
        sg_ids.push(id);
    }
    let mut ebs = ec2_t::LaunchTemplateEbsBlockDeviceRequest::builder()
        .volume_size(super::i32_of(lt.root_volume_size, "LaunchTemplate", name, "root volume size")?)
        .volume_type(ec2_t::VolumeType::from(lt.root_volume_type.as_str()))
        .encrypted(lt.root_volume_encrypted)
        .delete_on_termination(true);
    if let Some(i) = lt.root_volume_iops {
        ebs = ebs.iops(super::i32_of(i, "LaunchTemplate", name, "root volume iops")?);
    }
    if let Some(t) = lt.root_volume_throughput {
        ebs = ebs.throughput(super::i32_of(t, "LaunchTemplate", name, "root volume throughput")?);
    }
    let instance_tags: Vec<ec2_t::Tag> = ec2_tags(&lt.tags);
    // An explicit associatePublicIp needs the interface spelled out (its groups move onto it).
    let (sg_ids, interfaces) = if lt.associate_public_ip_explicit {
        let nic = ec2_t::LaunchTemplateInstanceNetworkInterfaceSpecificationRequest::builder()
            .device_index(0)
            .associate_public_ip_address(lt.associate_public_ip)
            .delete_on_termination(true)
            .set_groups(Some(sg_ids))
            .build();
        (None, Some(vec![nic]))
    } else {
        (Some(sg_ids), None)
    };
    Ok(ec2_t::RequestLaunchTemplateData::builder()
        .image_id(image)
        .instance_type(ec2_t::InstanceType::from(lt.machine_type.as_str()))
        .metadata_options(
            ec2_t::LaunchTemplateInstanceMetadataOptionsRequest::builder()
                .http_tokens(ec2_t::LaunchTemplateHttpTokensState::from(lt.http_tokens.as_str()))
                .http_put_response_hop_limit(super::i32_of(lt.hop_limit, "LaunchTemplate", name, "metadata hop limit")?)
                .http_endpoint(ec2_t::LaunchTemplateInstanceMetadataEndpointState::Enabled)
                .build(),
        )
        .block_device_mappings(ec2_t::LaunchTemplateBlockDeviceMappingRequest::builder().device_name(root_device).ebs(ebs.build()).build())
        .set_security_group_ids(sg_ids)
        .set_network_interfaces(interfaces)
        .set_instance_market_options(lt.spot.as_ref().map(|spot| {
            ec2_t::LaunchTemplateInstanceMarketOptionsRequest::builder()
                .market_type(ec2_t::MarketType::Spot)
                .spot_options(
                    ec2_t::LaunchTemplateSpotMarketOptionsRequest::builder()
                        .set_max_price(spot.max_price.clone())
                        .instance_interruption_behavior(ec2_t::InstanceInterruptionBehavior::from(spot.interruption_behavior.as_str()))
                        .build(),
                )
                .build()
        }))
        .set_credit_specification(lt.cpu_credits.as_ref().map(|c| ec2_t::CreditSpecificationRequest::builder().cpu_credits(c).build()))
        .iam_instance_profile(ec2_t::LaunchTemplateIamInstanceProfileSpecificationRequest::builder().name(&lt.instance_profile).build())
        .user_data(base64::engine::general_purpose::STANDARD.encode(&lt.user_data))
        .tag_specifications(
            ec2_t::LaunchTemplateTagSpecificationRequest::builder().resource_type(ec2_t::ResourceType::Instance).set_tags(Some(instance_tags.clone())).build(),
        )
        .tag_specifications(
            ec2_t::LaunchTemplateTagSpecificationRequest::builder().resource_type(ec2_t::ResourceType::Volume).set_tags(Some(instance_tags)).build(),
        )
        .build())
}
