//! cloud-controller-manager defaults per cloud (kOps `pkg/model/components/*cloudcontrollermanager.go`).

use keelson_api::ClusterSpec;

use super::control_plane::leader_election;
use super::{default, strings, Cloud, Context, Derived, Plugin};

pub fn build(ctx: &Context, d: &Derived, spec: &mut ClusterSpec) {
    let pod_cidr = spec.pod_cidr;
    let external_ipam = d.ipv6;
    match ctx.cloud {
        Cloud::Aws => {
            let c = spec.cloud_controller_manager.get_or_insert_with(Default::default);
            default(&mut c.leader_election, leader_election(true));
            default(&mut c.cluster_name, ctx.name.clone());
            default(&mut c.allocate_node_cidrs, !external_ipam);
            if !external_ipam {
                if let Some(p) = pod_cidr {
                    default(&mut c.cluster_cidr, p);
                }
            }
            default(&mut c.configure_cloud_routes, d.plugin == Plugin::Kubenet);
            default(&mut c.image, ctx.versions.cloud_controller_manager_image_aws());
        }
        Cloud::Gce => {
            let ip_aliases = matches!(d.plugin, Plugin::Gcp | Plugin::Kindnet);
            let c = spec.cloud_controller_manager.get_or_insert_with(Default::default);
            default(&mut c.leader_election, leader_election(true));
            default(&mut c.cluster_name, ctx.name.replace('.', "-"));
            default(&mut c.allocate_node_cidrs, true);
            default(&mut c.cidr_allocator_type, "CloudAllocator".to_string());
            if let Some(p) = pod_cidr {
                default(&mut c.cluster_cidr, p);
            }
            if ip_aliases {
                default(&mut c.configure_cloud_routes, false);
            }
            let controllers = if external_ipam { strings(&["*", "-node-ipam-controller", "-node-route-controller"]) } else { strings(&["*"]) };
            default(&mut c.controllers, controllers);
            default(&mut c.image, ctx.versions.cloud_controller_manager_image_gcp());
            // The GCE provider's cloud config (kOps sets these with the kubelet's GCE defaults): every
            // zone of the region is managed, and nodes carry the node role's network tag.
            let cc = spec.cloud_config.get_or_insert_with(Default::default);
            default(&mut cc.multizone, true);
            default(&mut cc.node_tags, format!("{}-k8s-io-role-node", keelson_api::names::gce_name(&ctx.name)));
        }
        Cloud::Hetzner => {
            let c = spec.cloud_controller_manager.get_or_insert_with(Default::default);
            default(&mut c.cloud_provider, "hcloud".to_string());
            default(&mut c.allow_untagged_cloud, true);
            default(&mut c.leader_election, leader_election(false));
            if let Some(p) = pod_cidr {
                default(&mut c.cluster_cidr, p);
            }
            default(&mut c.allocate_node_cidrs, true);
            default(&mut c.configure_cloud_routes, false);
            default(&mut c.image, ctx.versions.remap_image("hetznercloud/hcloud-cloud-controller-manager:v1.31.0"));
        }
        Cloud::OpenStack | Cloud::DigitalOcean | Cloud::Azure | Cloud::Scaleway | Cloud::Metal => {}
    }
}
