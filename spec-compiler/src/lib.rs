//! The Keelson spec compiler: validate a kOps-format spec, complete it, and render node
//! configs, boot configs and user-data for every instance group.
//!
//! Owns: completion (every default), the versions table, node configs, user-data and addons, as typed
//! results ([`Compiled`]) plus the file tree they make. Must not: parse command lines (the `keelson`
//! binary is `keelson-cli`), read the environment or write files — the binary turns flags and
//! documented variables into [`CompileOptions`] and writes [`Compiled::tree`]; hashes not in the
//! table or `asset_hashes` are fetched only when not offline.

pub mod addons;
pub mod assets;
pub mod complete;
pub mod digests;
pub mod load;
pub mod new_cluster;
pub mod nodeup_config;
pub mod output;
pub mod protokube_config;
pub mod userdata;
pub mod versions;

use std::collections::BTreeMap;

use keelson_api::nodeup::{BootConfig, NodeupConfig};
use keelson_api::protokube::ProtokubeConfig;
use keelson_api::{Cluster, Documents, Role};

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
    #[error(transparent)]
    Protokube(#[from] protokube_config::ProtokubeConfigError),
    #[error("spec.cloudProvider: {0}")]
    CloudProvider(#[from] keelson_api::UnknownCloudProvider),
    #[error("spec.configBase: required (where the cluster's state lives: s3://, gs://, file://, http(s)://)")]
    MissingConfigBase,
    #[error("spec.configBase: {0}")]
    ConfigBase(#[from] keelson_api::ConfigBaseError),
    #[error(transparent)]
    Digests(#[from] digests::DigestError),
    #[error("InstanceGroup/{group}: a control plane booted by this user-data ({arch}) would have no protokube (etcd volumes, etcd, DNS): give --protokube-asset {arch}=SHA256@URL or --kops-base-url")]
    NoProtokube { group: String, arch: String },
}

/// One instance group, compiled. Bastions run no nodeup: they have neither configs nor user-data.
#[derive(Debug, Clone, PartialEq)]
pub struct CompiledGroup {
    pub role: Role,
    pub nodeup: Option<NodeupConfig>,
    pub boot: Option<BootConfig>,
    /// What the group's protokube does (control planes only).
    pub protokube: Option<ProtokubeConfig>,
    /// The user-data script (possibly gzip-packaged); `None` when no nodeup build was given.
    pub user_data: Option<Vec<u8>>,
}

/// The result of a compile: the completed cluster, each group's configuration, the addons, the files
/// all of it makes, and anything the operator should know.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub completed: Cluster,
    /// By instance-group name (groups without a role are left out; validation refuses them).
    pub groups: BTreeMap<String, CompiledGroup>,
    pub addons: addons::RenderedAddons,
    /// Every output file (what `keelson compile --out` writes); `state/…` is what the state store holds.
    pub tree: Tree,
    pub warnings: Vec<String>,
}

impl Compiled {
    /// The files the state store holds, relative to the store (`state/` stripped).
    pub fn state_files(&self) -> impl Iterator<Item = (&str, &Vec<u8>)> {
        self.tree.files.iter().filter_map(|(k, v)| k.strip_prefix("state/").map(|rel| (rel, v)))
    }
}

pub use base::nodeup_config_hash;

/// Compile validated documents.
pub fn compile(docs: &Documents, options: &CompileOptions) -> Result<Compiled, CompileError> {
    // One line per compile (`KEELSON_LOG=spec_compiler=info`): a command compiles once.
    tracing::info!(cluster = docs.cluster.name(), "compiling");
    let (completed, versions) = complete::complete_with_versions(docs, options)?;
    let spec = &completed.spec;
    let name = completed.name().to_string();
    let mut tree = Tree::default();
    let mut warnings = Vec::new();
    let mut groups = BTreeMap::new();
    let completed_yaml = output::to_yaml("cluster-completed.yaml", &completed)?;
    tree.insert("cluster-completed.yaml", completed_yaml.clone());
    tree.insert("state/cluster-completed.spec", completed_yaml);
    // How workers join, decided once (validation already refused a spec that names no way).
    let bootstrap = nodeup_config::node_bootstrap(&completed)?;
    let addons = addons::render(&completed, &docs.instance_groups, &versions, &docs.additional_objects, options.aws_account.as_deref())?;
    addons.insert_into(&mut tree);
    warnings.extend(addons.warnings.iter().cloned());
    let scheduler_config = nodeup_config::scheduler_config(&docs.additional_objects)?;

    let mut environment = BTreeMap::new();
    if spec.cloud_provider.as_deref() == Some("aws") {
        if let Some(region) = keelson_api::plan::region(spec) {
            environment.insert("AWS_REGION".to_string(), region);
        }
    }
    let kubenet = spec.networking.as_ref().is_some_and(|n| n.kubenet.is_some());
    let private = spec.subnets.iter().flatten().any(|s| s.type_.as_deref() == Some("Private"));
    if kubenet && private && spec.cloud_provider.as_deref() == Some("aws") {
        warnings.push(
            "spec.networking.kubenet with Private subnets: the cloud-controller-manager writes pod routes into one route table per cluster, and private topology has one per zone, so pods on different nodes will not reach each other (kOps: private topology needs a CNI such as Calico or Cilium)".to_string(),
        );
    }
    if bootstrap.method == keelson_api::nodeup::NodeBootstrapMethod::Token && keelson_api::nodeup::joins_by_cloud_identity(spec.cloud_provider.as_deref()) {
        warnings.push(format!(
            "metadata.annotations[{}]: token (opted in with {}): workers join with a bootstrap token from the state store, readable by every node; while it lives (24 h, rotated every 12 h) anyone who reads it can register a new worker under any name that is not a control plane's or an existing Node's. Remove both annotations: workers then join by their instance identity",
            keelson_api::nodeup::NODE_BOOTSTRAP_ANNOTATION,
            keelson_api::nodeup::ALLOW_BOOTSTRAP_TOKEN_ANNOTATION,
        ));
    }
    if spec.cloud_provider.as_deref() == Some("gce") {
        if let Some(account) = spec.cloud_config.as_ref().and_then(|c| c.gce_service_account.as_deref()).filter(|a| !a.is_empty()) {
            warnings.push(format!(
                "spec.cloudConfig.gceServiceAccount: {account:?} is the control planes' (and API servers') account only; nodes and bastions run as their own per-role accounts, which keelson apply creates (kOps shared it with every role: a pod on any node could then act as the control plane). Grant {account:?} what the control planes need yourself; keelson grants it nothing"
            ));
        }
    }
    if options.nodeup_assets.is_empty() {
        warnings.push("no nodeup build given (--nodeup-asset ARCH=SHA256@URL): userdata/ was not written".to_string());
    }

    for ig in &docs.instance_groups {
        let group = ig.name();
        tree.insert(format!("state/instancegroup/{group}"), output::to_yaml(group, ig)?);
        let Some(role) = ig.role() else { continue };
        if role == Role::Bastion {
            // Bastions run no nodeup.
            groups.insert(group.to_string(), CompiledGroup { role, nodeup: None, boot: None, protokube: None, user_data: None });
            continue;
        }
        let nodeup = nodeup_config::build(&completed, ig, &versions, options, &scheduler_config)?;
        let nodeup_yaml = output::to_yaml(&format!("nodeup/{group}.yaml"), &nodeup)?;
        let boot = BootConfig {
            cloud_provider: spec.cloud_provider.as_deref().unwrap_or_default().parse()?,
            config_base: spec.config_base.as_deref().ok_or(CompileError::MissingConfigBase)?.parse()?,
            cluster_name: name.clone(),
            instance_group_name: group.to_string(),
            instance_group_role: role,
            nodeup_config_hash: nodeup_config_hash(nodeup_yaml.as_bytes()),
        };
        let boot_yaml = output::to_yaml(&format!("bootconfig/{group}.yaml"), &boot)?;
        let mut user_data = None;
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
            let packaged = userdata::package(group, script, &additional, compress)?;
            tree.insert(format!("userdata/{group}.sh"), packaged.clone());
            user_data = Some(packaged);
        }
        tree.insert(format!("state/igconfig/{}/{group}/nodeupconfig.yaml", role.state_dir()), nodeup_yaml.clone());
        // protokube runs on control planes only, and reads its own slice of the plan, not the spec.
        let protokube = match role {
            Role::ControlPlane => {
                let config = protokube_config::build(&completed, group, &versions)?;
                let rel = keelson_api::protokube::state_key(group);
                tree.insert(format!("state/{rel}"), output::to_yaml(&rel, &config)?);
                Some(config)
            }
            _ => None,
        };
        tree.insert(format!("nodeup/{group}.yaml"), nodeup_yaml);
        tree.insert(format!("bootconfig/{group}.yaml"), boot_yaml);
        groups.insert(group.to_string(), CompiledGroup { role, nodeup: Some(nodeup), boot: Some(boot), protokube, user_data });
    }
    let compiled = Compiled { completed, groups, addons, tree, warnings };
    if !options.image_digests.is_empty() {
        digests::check(&compiled)?;
    }
    Ok(compiled)
}
