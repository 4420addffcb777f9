//! The AWS tasks in Terraform: the provider, the data sources the direct target resolves through
//! the API instead (images, the hosted zone), every task's blocks, and the outputs.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::model::ClusterModel;
use crate::terraform_json::{r, tf_name, Blocks};
use base::Tree;

/// The Terraform target of the AWS tasks.
pub struct AwsTerraform {
    pub blocks: Blocks,
    /// `data.aws_route53_zone.dns-zone` when the spec names the zone (records are managed only then).
    pub zone: Option<String>,
}

impl AwsTerraform {
    /// The `aws_ami` data source of a spec image (`ami-…` or `OWNER/NAME`), added on first use.
    pub fn image(&mut self, image: &str) -> String {
        self.blocks.data_once("aws_ami", "image", image, || {
            if image.starts_with("ami-") {
                json!({"filter": [{"name": "image-id", "values": [image]}]})
            } else {
                let (owner, name) = image.split_once('/').unwrap_or(("self", image));
                json!({"most_recent": true, "owners": [owner], "filter": [{"name": "name", "values": [name]}]})
            }
        })
    }
    /// The hosted zone's id, when Terraform manages records.
    pub fn zone_id(&self) -> Option<String> {
        self.zone.as_ref().map(|z| r(z, "zone_id"))
    }
}

/// Tags as a JSON object.
pub(crate) fn tags_value(tags: &BTreeMap<String, String>) -> Value {
    crate::terraform_json::tags_value(tags)
}

/// Render the model's AWS tasks.
pub fn render(model: &ClusterModel) -> Tree {
    let mut blocks = Blocks::default();
    let zone = model.dns.as_ref().and_then(|dns| {
        dns.zone.as_ref().map(|zone| {
            let body = if zone.starts_with('Z') && !zone.contains('.') { json!({"zone_id": zone}) } else { json!({"name": zone, "private_zone": dns.private}) };
            blocks.add_data("aws_route53_zone", "dns-zone", body)
        })
    });
    let mut t = AwsTerraform { blocks, zone };
    for task in model.tasks.iter() {
        task.render_terraform(&mut t);
    }
    let mut b = t.blocks;
    b.output.insert("cluster_name".into(), json!({"value": model.cluster}));
    b.output.insert("region".into(), json!({"value": model.region}));
    b.output.insert("vpc_id".into(), json!({"value": model.network.vpc.tf()}));
    b.output.insert(
        "node_autoscaling_group_ids".into(),
        json!({"value": model.tasks.groups.iter().map(|g| r(&format!("aws_autoscaling_group.{}", tf_name(&g.name)), "id")).collect::<Vec<_>>()}),
    );
    b.finish(json!({
        "terraform": {
            "required_version": ">= 1.3.0",
            "required_providers": {"aws": {"source": "hashicorp/aws", "version": ">= 5.0.0"}},
        },
        "provider": {"aws": [{"region": model.region}]},
        "locals": {"cluster_name": model.cluster, "region": model.region},
    }))
}
