//! Launch templates: one per instance group; a change makes a new version (the default), which
//! the group's autoscaling group then pins.

use std::collections::BTreeMap;

use aws_sdk_ec2::types as ec2_t;
use base64::Engine as _;
use serde_json::json;

use super::iam::InstanceProfile;
use super::security_group::SecurityGroup;
use super::task::{AwsFuture, AwsTask, Exec, Typed};
use super::terraform::{tags_value, AwsTerraform};
use super::{api, cluster_filter, ec2_tags, required, tag_spec, tags_of, AwsError, AwsTarget, Discovered, Ids, Resolved};
use crate::model::ClusterModel;
use crate::plan::{Action, Change, Kind};
use crate::tasks::{joined_links, Fields, Link, Linked};
use crate::terraform_json::{r, tf_name};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootVolume {
    pub size_gib: i64,
    pub volume_type: String,
    pub encrypted: bool,
    pub iops: Option<i64>,
    pub throughput: Option<i64>,
    /// The KMS key that encrypts it (`rootVolumeEncryptionKey`); `None`: the account's default EBS key.
    pub kms_key_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spot {
    /// Empty: up to the on-demand price.
    pub max_price: String,
    /// `terminate` (AWS default), `stop` or `hibernate`.
    pub interruption: String,
}

/// The image: as the spec names it (`ami-…` or `OWNER/NAME`), and the AMI id and root device
/// name the direct target resolved it to (Terraform resolves it with a data source).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    pub spec: String,
    pub resolved: Option<(String, String)>,
}

impl Image {
    /// The AMI id, once resolved (else as the spec names it).
    pub fn id(&self) -> &str {
        self.resolved.as_ref().map(|(id, _)| id.as_str()).unwrap_or(&self.spec)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchTemplate {
    pub name: String,
    /// The instance group (not compared; empty when found).
    pub group: String,
    pub image: Image,
    pub instance_type: String,
    pub http_tokens: String,
    pub hop_limit: i64,
    pub root_volume: RootVolume,
    /// The role's group, then additional ones (ours, or ids the spec gives).
    pub security_groups: Vec<Link<SecurityGroup>>,
    pub instance_profile: Link<InstanceProfile>,
    /// Exactly the bytes the instance gets (script, MIME message, or gzip of either); compared by sha256.
    pub user_data: Vec<u8>,
    /// Only when the spec sets `associatePublicIp` (else the subnet decides).
    pub associate_public_ip: Option<bool>,
    pub spot: Option<Spot>,
    /// `cpuCredits` for burstable types (`standard` / `unlimited`).
    pub cpu_credits: Option<String>,
    /// The EC2 key pair the instances get (`sshKeyName`, an existing pair); `None`: no key pair.
    pub key_name: Option<String>,
    pub tags: BTreeMap<String, String>,
}

impl Linked for LaunchTemplate {
    const TF_TYPE: &'static str = "aws_launch_template";
    const TF_ATTR: &'static str = "id";
}

impl AwsTask for LaunchTemplate {
    fn kind(&self) -> Kind {
        Kind::LaunchTemplate
    }
    fn name(&self) -> String {
        self.name.clone()
    }
    fn tags(&self) -> BTreeMap<String, String> {
        self.tags.clone()
    }
    fn fields(&self, f: &mut Fields) {
        let rv = &self.root_volume;
        f.set("image", self.image.id())
            .set("instance_type", &self.instance_type)
            .set("metadata.http_tokens", &self.http_tokens)
            .set("metadata.hop_limit", self.hop_limit)
            .set("root_volume.size", rv.size_gib)
            .set("root_volume.type", &rv.volume_type)
            .set("root_volume.encrypted", rv.encrypted)
            .opt("root_volume.iops", rv.iops)
            .opt("root_volume.throughput", rv.throughput)
            .opt("root_volume.kms_key_id", rv.kms_key_id.as_ref())
            .set("security_groups", joined_links(&self.security_groups))
            .set("instance_profile", &self.instance_profile)
            .set("user_data.sha256", base::sha256_hex(&self.user_data))
            .opt("associate_public_ip", self.associate_public_ip)
            .opt("cpu_credits", self.cpu_credits.as_ref())
            .opt("key_name", self.key_name.as_ref());
        if let Some(spot) = &self.spot {
            f.set("spot.max_price", &spot.max_price).set("spot.interruption", &spot.interruption);
        }
    }
    fn resolve(&mut self, resolved: &Resolved) -> bool {
        self.image.resolved = resolved.images.get(&self.image.spec).cloned();
        true
    }
    fn find<'a>(t: &'a AwsTarget, model: &'a ClusterModel, _resolved: &'a Resolved, d: &'a mut Discovered) -> AwsFuture<'a> {
        Box::pin(discover(t, model, d))
    }
    fn render_terraform(&self, t: &mut AwsTerraform) {
        let ami = t.image(&self.image.spec);
        let rv = &self.root_volume;
        let mut ebs = json!({
            "volume_size": rv.size_gib,
            "volume_type": rv.volume_type,
            "encrypted": rv.encrypted,
            "delete_on_termination": true,
        });
        if let Some(i) = rv.iops {
            ebs["iops"] = json!(i);
        }
        if let Some(t) = rv.throughput {
            ebs["throughput"] = json!(t);
        }
        if let Some(k) = &rv.kms_key_id {
            ebs["kms_key_id"] = json!(k);
        }
        let sgs: Vec<String> = self.security_groups.iter().map(|s| s.tf()).collect();
        let user_data = t.blocks.data_file_base64(&format!("aws_launch_template_{}_user_data", tf_name(&self.name)), &self.user_data);
        let mut body = json!({
            "name": self.name,
            "image_id": r(&ami, "id"),
            "instance_type": self.instance_type,
            "metadata_options": {
                "http_endpoint": "enabled",
                "http_tokens": self.http_tokens,
                "http_put_response_hop_limit": self.hop_limit,
            },
            "block_device_mappings": [{"device_name": r(&ami, "root_device_name"), "ebs": ebs}],
            "vpc_security_group_ids": sgs,
            "iam_instance_profile": {"name": self.instance_profile.tf()},
            "user_data": user_data,
            "tag_specifications": [
                {"resource_type": "instance", "tags": tags_value(&self.tags)},
                {"resource_type": "volume", "tags": tags_value(&self.tags)},
            ],
            "tags": tags_value(&self.tags),
            "lifecycle": {"create_before_destroy": true},
        });
        if let Some(spot) = &self.spot {
            let mut options = json!({"instance_interruption_behavior": spot.interruption});
            if !spot.max_price.is_empty() {
                options["max_price"] = json!(spot.max_price);
            }
            body["instance_market_options"] = json!({"market_type": "spot", "spot_options": options});
        }
        if let Some(c) = &self.cpu_credits {
            body["credit_specification"] = json!({"cpu_credits": c});
        }
        if let Some(k) = &self.key_name {
            body["key_name"] = json!(k);
        }
        if let Some(public) = self.associate_public_ip {
            // An explicit associatePublicIp needs the interface spelled out (its groups move onto it).
            if let Some(obj) = body.as_object_mut() {
                obj.remove("vpc_security_group_ids");
            }
            body["network_interfaces"] = json!([{
                "device_index": 0,
                "associate_public_ip_address": public,
                "delete_on_termination": true,
                "security_groups": sgs,
            }]);
        }
        t.blocks.add("aws_launch_template", &self.name, body);
    }
    fn render_aws<'a>(&'a self, cx: Exec<'a>, c: &'a Change) -> AwsFuture<'a> {
        Box::pin(async move {
            let c = Typed::<LaunchTemplate>::of(c);
            let (t, name) = (cx.target, c.name);
            match c.action {
                Action::Create => {
                    let want = c.want()?;
                    let data = launch_template_data(want, cx.ids, name)?;
                    let resp = t
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
                    cx.ids.launch_templates.insert(name.to_string(), id.to_string());
                    cx.ids.lt_versions.insert(name.to_string(), created.and_then(|l| l.latest_version_number()).unwrap_or(1));
                }
                Action::Update(_) => {
                    let want = c.want()?;
                    let id = c.id()?;
                    if c.attributes_changed() {
                        let data = launch_template_data(want, cx.ids, name)?;
                        let resp = t
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
                        cx.ids.lt_versions.insert(name.to_string(), version);
                        t.ec2
                            .modify_launch_template()
                            .launch_template_id(&id)
                            .default_version(version.to_string())
                            .send()
                            .await
                            .map_err(|e| api("ModifyLaunchTemplate", name, e))?;
                    }
                    if c.tags_changed() {
                        t.create_tags(&id, &want.tags).await?;
                    }
                }
                Action::Delete => {
                    let id = c.id()?;
                    t.ec2.delete_launch_template().launch_template_id(id).send().await.map_err(|e| api("DeleteLaunchTemplate", name, e))?;
                }
            }
            Ok(())
        })
    }
}

async fn discover(t: &AwsTarget, model: &ClusterModel, d: &mut Discovered) -> Result<(), AwsError> {
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
            group: String::new(),
            image: Image { spec: data.image_id().unwrap_or_default().to_string(), resolved: None },
            instance_type: data.instance_type().map(|t| t.as_str().to_string()).unwrap_or_default(),
            http_tokens: metadata.and_then(|m| m.http_tokens()).map(|t| t.as_str().to_string()).unwrap_or_default(),
            hop_limit: metadata.and_then(|m| m.http_put_response_hop_limit()).map(i64::from).unwrap_or(1),
            root_volume: RootVolume {
                size_gib: ebs.and_then(|e| e.volume_size()).map(i64::from).unwrap_or_default(),
                volume_type: ebs.and_then(|e| e.volume_type()).map(|t| t.as_str().to_string()).unwrap_or_default(),
                encrypted: ebs.and_then(|e| e.encrypted()).unwrap_or(false),
                iops: ebs.and_then(|e| e.iops()).map(i64::from),
                throughput: ebs.and_then(|e| e.throughput()).map(i64::from),
                kms_key_id: ebs.and_then(|e| e.kms_key_id()).map(str::to_string),
            },
            security_groups: data
                .security_group_ids()
                .iter()
                .chain(data.network_interfaces().iter().flat_map(|n| n.groups()))
                .map(|id| Link::to(d.ids.sg_name(id)))
                .collect(),
            instance_profile: Link::to(data.iam_instance_profile().and_then(|p| p.name()).unwrap_or_default()),
            user_data,
            associate_public_ip: data.network_interfaces().first().and_then(|n| n.associate_public_ip_address()),
            spot: data.instance_market_options().and_then(|m| m.spot_options()).map(|s| Spot {
                max_price: s.max_price().unwrap_or_default().to_string(),
                interruption: s.instance_interruption_behavior().map(|b| b.as_str()).unwrap_or("terminate").to_string(),
            }),
            cpu_credits: data.credit_specification().and_then(|c| c.cpu_credits()).map(str::to_string),
            key_name: data.key_name().map(str::to_string),
            tags: tags_of(lt.tags()),
            name,
        };
        d.found(task, id);
    }
    Ok(())
}

/// The launch template data of an instance group, with every name resolved to its id.
fn launch_template_data(lt: &LaunchTemplate, ids: &Ids, name: &str) -> Result<ec2_t::RequestLaunchTemplateData, AwsError> {
    let (image, root_device) = lt.image.resolved.clone().ok_or_else(|| AwsError::Image { image: lt.image.spec.clone(), message: "not resolved".into() })?;
    let mut sg_ids = Vec::new();
    for sg in &lt.security_groups {
        sg_ids.push(sg.resolve(ids, &format!("launch template {name}"))?);
    }
    let rv = &lt.root_volume;
    let mut ebs = ec2_t::LaunchTemplateEbsBlockDeviceRequest::builder()
        .volume_size(super::i32_of(rv.size_gib, "LaunchTemplate", name, "root volume size")?)
        .volume_type(ec2_t::VolumeType::from(rv.volume_type.as_str()))
        .encrypted(rv.encrypted)
        .set_kms_key_id(rv.kms_key_id.clone())
        .delete_on_termination(true);
    if let Some(i) = rv.iops {
        ebs = ebs.iops(super::i32_of(i, "LaunchTemplate", name, "root volume iops")?);
    }
    if let Some(t) = rv.throughput {
        ebs = ebs.throughput(super::i32_of(t, "LaunchTemplate", name, "root volume throughput")?);
    }
    let instance_tags: Vec<ec2_t::Tag> = ec2_tags(&lt.tags);
    // An explicit associatePublicIp needs the interface spelled out (its groups move onto it).
    let (sg_ids, interfaces) = if let Some(public) = lt.associate_public_ip {
        let nic = ec2_t::LaunchTemplateInstanceNetworkInterfaceSpecificationRequest::builder()
            .device_index(0)
            .associate_public_ip_address(public)
            .delete_on_termination(true)
            .set_groups(Some(sg_ids))
            .build();
        (None, Some(vec![nic]))
    } else {
        (Some(sg_ids), None)
    };
    Ok(ec2_t::RequestLaunchTemplateData::builder()
        .image_id(image)
        .instance_type(ec2_t::InstanceType::from(lt.instance_type.as_str()))
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
                        .set_max_price(Some(spot.max_price.clone()).filter(|p| !p.is_empty()))
                        .instance_interruption_behavior(ec2_t::InstanceInterruptionBehavior::from(spot.interruption.as_str()))
                        .build(),
                )
                .build()
        }))
        .set_key_name(lt.key_name.clone())
        .set_credit_specification(lt.cpu_credits.as_ref().map(|c| ec2_t::CreditSpecificationRequest::builder().cpu_credits(c).build()))
        .iam_instance_profile(ec2_t::LaunchTemplateIamInstanceProfileSpecificationRequest::builder().name(lt.instance_profile.name()).build())
        .user_data(base64::engine::general_purpose::STANDARD.encode(&lt.user_data))
        .tag_specifications(
            ec2_t::LaunchTemplateTagSpecificationRequest::builder().resource_type(ec2_t::ResourceType::Instance).set_tags(Some(instance_tags.clone())).build(),
        )
        .tag_specifications(
            ec2_t::LaunchTemplateTagSpecificationRequest::builder().resource_type(ec2_t::ResourceType::Volume).set_tags(Some(instance_tags)).build(),
        )
        .build())
}
