//! The Keelson spec compiler: validate a kOps-format spec, complete it, and render node
//! configs, boot configs and user-data for every instance group.
//!
//! Owns: completion (every default), the versions table, node configs, user-data, and the `keelson`
//! command line ([`cli`] with feature `cloud`, on by default: apply, delete, rolling-update and
//! export, on top of `keelson-cloud-resources`). Must not: read the environment
//! or the network inside [`compile`] — the binary turns flags and documented variables into
//! [`CompileOptions`], and hashes not in the table or `asset_hashes` are fetched only when not offline.

pub mod addons;
#[cfg(feature = "cloud")]
pub mod apply;
pub mod args;
#[cfg(feature = "cloud")]
pub mod cli;
pub mod complete;
pub mod load;
pub mod nodeup_config;
pub mod output;
pub mod userdata;
pub mod versions;

use std::collections::BTreeMap;

use keelson_api::nodeup::BootConfig;
use keelson_api::{Documents, Role};

pub use complete::{CompileOptions, CompleteError};
pub use nodeup_config::NodeupConfigError;
pub use output::{OutputError, Tree};
pub use userdata::UserDataError;

/// Why a compile failed.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error(transparent)]
    Complete(#[from] CompleteError),
    #[error(transparent)]
    Nodeup(#[from] NodeupConfigError),
    #[error(transparent)]
    UserData(#[from] UserDataError),
    #[error(transparent)]
    Output(#[from] OutputError),
    #[error(transparent)]
    Addons(#[from] addons::AddonError),
    #[error("InstanceGroup/{group}: a control plane booted by this user-data ({arch}) would have no protokube (etcd volumes, etcd, DNS): give --protokube-asset {arch}=SHA256@URL or --kops-base-url")]
    NoProtokube { group: String, arch: String },
}

/// The result of a compile: the files, plus anything the operator should know.
#[derive(Debug, Clone, Default)]
pub struct Compiled {
    pub tree: Tree,
    pub warnings: Vec<String>,
}

pub use base::nodeup_config_hash;

/// Compile validated documents into the output tree.
pub fn compile(docs: &Documents, options: &CompileOptions) -> Result<Compiled, CompileError> {
    let completed = complete::complete(docs, options)?;
    let versions = complete::versions_for(&completed.spec, options)?;
    let spec = &completed.spec;
    let name = completed.name().to_string();
    let mut out = Compiled::default();
    let completed_yaml = output::to_yaml("cluster-completed.yaml", &completed)?;
    out.tree.insert("cluster-completed.yaml", completed_yaml.clone());
    out.tree.insert("state/cluster-completed.spec", completed_yaml);
    addons::render(&mut out.tree, &completed, &versions, &docs.additional_objects)?;
    let scheduler_config = nodeup_config::scheduler_config(&docs.additional_objects)?;

    let mut environment = BTreeMap::new();
    if spec.cloud_provider.as_deref() == Some("aws") {
        if let Some(region) = spec.subnets.iter().flatten().find_map(|s| s.zone.as_deref().and_then(keelson_api::aws_region_of_zone)) {
            environment.insert("AWS_REGION".to_string(), region.to_string());
        }
    }
    let kubenet = spec.networking.as_ref().is_some_and(|n| n.kubenet.is_some());
    let private = spec.subnets.iter().flatten().any(|s| s.type_.as_deref() == Some("Private"));
    if kubenet && private && spec.cloud_provider.as_deref() == Some("aws") {
        out.warnings.push(
            "spec.networking.kubenet with Private subnets: the cloud-controller-manager writes pod routes into one route table per cluster, and private topology has one per zone, so pods on different nodes will not reach each other (kOps: private topology needs a CNI such as Calico or Cilium)".to_string(),
        );
    }
    if spec.cloud_provider.as_deref() == Some("aws") {
        let annotations = completed.metadata.annotations.as_ref();
        if keelson_api::nodeup::node_bootstrap_method(annotations, true) == Ok(keelson_api::nodeup::NodeBootstrapMethod::Token) {
            out.warnings.push(format!(
                "metadata.annotations[{}]: token: every worker joins with ONE static bootstrap token kept in the state store and readable by every node; anyone who reads it (any node, any pod that reaches IMDS credentials of a node) can register as a node forever. On AWS, remove the annotation: workers then join by their instance identity",
                keelson_api::nodeup::NODE_BOOTSTRAP_ANNOTATION
            ));
        }
    }
    if options.nodeup_assets.is_empty() {
        out.warnings.push("no nodeup build given (--nodeup-asset ARCH=SHA256@URL): userdata/ was not written".to_string());
    }

    for ig in &docs.instance_groups {
        let group = ig.name();
        out.tree.insert(format!("state/instancegroup/{group}"), output::to_yaml(group, ig)?);
        let Some(role) = ig.role() else { continue };
        if role == Role::Bastion {
            continue; // bastions run no nodeup
        }
        let nodeup = nodeup_config::build(&completed, ig, &versions, options, &scheduler_config)?;
        let nodeup_yaml = output::to_yaml(&format!("nodeup/{group}.yaml"), &nodeup)?;
        let boot = BootConfig {
            cloud_provider: spec.cloud_provider.clone().unwrap_or_default(),
            config_base: spec.config_base.clone().unwrap_or_default(),
            cluster_name: name.clone(),
            instance_group_name: group.to_string(),
            instance_group_role: role.boot_name().to_string(),
            nodeup_config_hash: nodeup_config_hash(nodeup_yaml.as_bytes()),
        };
        let boot_yaml = output::to_yaml(&format!("bootconfig/{group}.yaml"), &boot)?;
        if !options.nodeup_assets.is_empty() {
            if role == Role::ControlPlane {
                // Every architecture this user-data can boot needs its protokube.
                for arch in options.nodeup_assets.keys() {
                    let known = options.protokube_assets.contains_key(arch) || options.kops_base_url.as_deref().is_some_and(|b| !b.is_empty());
                    if !known {
                        return Err(CompileError::NoProtokube { group: group.to_string(), arch: arch.as_str().to_string() });
                    }
                }
            }
            let script = userdata::render(group, &name, &boot_yaml, &options.nodeup_assets, &environment)?;
            let additional = ig.spec.additional_user_data.clone().unwrap_or_default();
            let compress = ig.spec.compress_user_data.unwrap_or(false);
            out.tree.insert(format!("userdata/{group}.sh"), userdata::package(group, script, &additional, compress)?);
        }
        out.tree.insert(format!("state/igconfig/{}/{group}/nodeupconfig.yaml", role.state_dir()), nodeup_yaml.clone());
        out.tree.insert(format!("nodeup/{group}.yaml"), nodeup_yaml);
        out.tree.insert(format!("bootconfig/{group}.yaml"), boot_yaml);
    }
    Ok(out)
}
