//! Completion: expand a minimal Cluster spec into the complete configuration, the way kOps'
//! `populate_cluster_spec` does. Each builder fills only fields the user (or an earlier
//! builder) left unset, so user values always win; the builders run until nothing changes.

mod cloud_config;
mod cloud_controller;
mod cluster_autoscaler;
mod control_plane;
mod etcd;
pub mod network;
pub mod node;

use std::collections::BTreeSet;

use keelson_api::{Cluster, ClusterSpec, Documents, InstanceGroup, KubernetesVersion, Role};

use crate::versions::{LookupOptions, Versions, VersionsError};

/// How many passes the builders get to reach a fixed point before we call it a bug.
const MAX_PASSES: usize = 10;

/// Why completion failed.
#[derive(Debug, thiserror::Error)]
pub enum CompleteError {
    #[error("spec.kubernetesVersion: required")]
    MissingVersion,
    #[error("spec.cloudProvider: required")]
    MissingCloud,
    #[error("spec.cloudProvider: {0}")]
    UnknownCloud(#[from] keelson_api::UnknownCloudProvider),
    #[error("versions table: {0}")]
    Versions(#[from] VersionsError),
    #[error(transparent)]
    Digests(#[from] crate::digests::DigestError),
    #[error("completion did not converge after {MAX_PASSES} passes (builders disagree on {0})")]
    NoFixedPoint(String),
}

/// The clouds Keelson knows how to complete for (one enum, in the api crate).
pub use keelson_api::CloudProvider as Cloud;

/// The networking plugin chosen in `spec.networking`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plugin {
    Kubenet,
    Gcp,
    Kindnet,
    External,
    Cni,
    Kopeio,
    AmazonVpc,
    Cilium,
    Calico,
    Flannel,
    Canal,
    KubeRouter,
    Weave,
    Romana,
    LyftVpc,
    Classic,
    None,
}

impl Plugin {
    fn of(spec: &ClusterSpec) -> Plugin {
        let Some(n) = &spec.networking else { return Plugin::None };
        let table = [
            (n.kubenet.is_some(), Plugin::Kubenet),
            (n.gce.is_some(), Plugin::Gcp),
            (n.kindnet.is_some(), Plugin::Kindnet),
            (n.external.is_some(), Plugin::External),
            (n.cni.is_some(), Plugin::Cni),
            (n.kopeio.is_some(), Plugin::Kopeio),
            (n.amazonvpc.is_some(), Plugin::AmazonVpc),
            (n.cilium.is_some(), Plugin::Cilium),
            (n.calico.is_some(), Plugin::Calico),
            (n.flannel.is_some(), Plugin::Flannel),
            (n.canal.is_some(), Plugin::Canal),
            (n.kuberouter.is_some(), Plugin::KubeRouter),
            (n.weave.is_some(), Plugin::Weave),
            (n.romana.is_some(), Plugin::Romana),
            (n.lyftvpc.is_some(), Plugin::LyftVpc),
            (n.classic.is_some(), Plugin::Classic),
        ];
        table.iter().find(|(set, _)| *set).map(|(_, p)| *p).unwrap_or(Plugin::None)
    }
}

/// Options of one compile run that do not live in the spec.
#[derive(Debug, Clone, Default)]
pub struct CompileOptions {
    /// Where hashes the versions table does not know come from (the `keelson` binary gives an
    /// [`HttpFetcher`](crate::versions::HttpFetcher) unless `--offline`); `None`: such a hash is an
    /// error, and compile touches no network.
    pub hash_fetcher: Option<crate::versions::Fetcher>,
    /// kOps-style feature flags (`+APIServerNodes`, `EtcdEventsHTTP`).
    pub feature_flags: BTreeSet<String>,
    /// The nodeup binary per architecture that user-data downloads; without it no user-data is written.
    pub nodeup_assets: std::collections::BTreeMap<crate::versions::Arch, crate::userdata::NodeupAsset>,
    /// Known asset hashes by URL (`--asset-hashes FILE`), winning over the versions table.
    pub asset_hashes: std::collections::BTreeMap<String, String>,
    /// The protokube build control planes install, per architecture (`--protokube-asset`).
    pub protokube_assets: std::collections::BTreeMap<crate::versions::Arch, crate::userdata::NodeupAsset>,
    /// kOps-style base URL of the Keelson binaries (`<base>/linux/<arch>/protokube`), used for an
    /// architecture without a `protokube_assets` entry (`--kops-base-url`, `$KOPS_BASE_URL`).
    pub kops_base_url: Option<String>,
    /// The cluster CAs' certificates (name → PEM) from the state store, written into every
    /// NodeupConfig (kOps' `CAs`): the BootConfig pins the NodeupConfig by hash, so workers trust
    /// only these, never an unpinned state-store read. `keelson apply` fills it; `compile` (offline)
    /// leaves it empty.
    pub cas: std::collections::BTreeMap<String, String>,
    /// Known image digests by upstream reference (`--image-digests FILE`, a bundle's images): every
    /// image of the output is pinned to its digest, and an image left without one is an error
    /// ([`crate::digests`]). Empty: images are written by tag, as before.
    pub image_digests: std::collections::BTreeMap<String, String>,
    /// The AWS account the cluster runs in (`keelson apply` and the other commands that change the
    /// cloud ask STS; `keelson compile --aws-account-id`): the ARNs of the roles Keelson's addons
    /// assume when `spec.iam.useServiceAccountExternalPermissions` puts them on roles of their own.
    /// Without it those addons' manifests are not written (a warning says so).
    pub aws_account: Option<String>,
}

impl CompileOptions {
    /// Parse a kOps `KOPS_FEATURE_FLAGS` value (`+A,-B,C`).
    pub fn parse_feature_flags(text: &str) -> BTreeSet<String> {
        text.split(',').map(str::trim).filter(|f| !f.is_empty() && !f.starts_with('-')).map(|f| f.trim_start_matches('+').to_string()).collect()
    }
}

/// Facts every builder may read; fixed for one compile.
pub struct Context<'a> {
    pub name: String,
    pub cloud: Cloud,
    pub version: KubernetesVersion,
    pub versions: Versions,
    pub groups: &'a [InstanceGroup],
    pub user: &'a ClusterSpec,
    pub options: &'a CompileOptions,
}

impl Context<'_> {
    pub fn control_plane_groups(&self) -> impl Iterator<Item = &InstanceGroup> {
        self.groups.iter().filter(|g| g.role() == Some(Role::ControlPlane))
    }
    pub fn flag(&self, name: &str) -> bool {
        self.options.feature_flags.contains(name)
    }
    /// The cloud region ([`keelson_api::plan::region`], the one rule).
    pub fn region(&self) -> Option<String> {
        keelson_api::plan::region(self.user)
    }
    /// kOps version gates ignore pre-release suffixes.
    pub fn at_least(&self, major: u64, minor: u64) -> bool {
        self.version.at_least(major, minor)
    }
}

/// Facts derived from the spec as it stands in a pass (they change as builders fill it).
pub struct Derived {
    pub plugin: Plugin,
    pub ipv6: bool,
}

impl Derived {
    fn of(spec: &ClusterSpec) -> Derived {
        Derived { plugin: Plugin::of(spec), ipv6: spec.non_masquerade_cidr.is_some_and(|c| c.is_ipv6()) }
    }
}

type Builder = fn(&Context, &Derived, &mut ClusterSpec);

/// The builders, in the order kOps runs them (dependencies first).
const BUILDERS: &[Builder] = &[
    network::build,
    network::cilium,
    network::calico,
    etcd::build,
    control_plane::api_server,
    control_plane::controller_manager,
    control_plane::scheduler,
    control_plane::kube_proxy,
    cloud_config::build,
    cloud_controller::build,
    node::kubelet,
    node::containerd,
    node::kube_dns,
    node::addons,
    cluster_autoscaler::build,
];

/// Look up the versions table for a spec.
pub fn versions_for(spec: &ClusterSpec, options: &CompileOptions) -> Result<Versions, CompleteError> {
    let version = spec.kubernetes_version.as_ref().ok_or(CompleteError::MissingVersion)?;
    let assets = spec.assets.as_ref();
    let containerd = spec.containerd.as_ref();
    let lookup = LookupOptions {
        fetcher: options.hash_fetcher.clone(),
        file_repository: assets.and_then(|a| a.file_repository.clone()),
        container_registry: assets.and_then(|a| a.container_registry.clone()),
        container_proxy: assets.and_then(|a| a.container_proxy.clone()),
        containerd_version_override: containerd.and_then(|c| c.version.clone()),
        runc_version_override: containerd.and_then(|c| c.runc.as_ref()).and_then(|r| r.version.clone()),
        asset_hashes: options.asset_hashes.clone(),
        image_digests: options.image_digests.clone(),
    };
    Ok(Versions::for_kubernetes(version, &lookup)?)
}

/// Complete a parsed (and validated) spec.
pub fn complete(docs: &Documents, options: &CompileOptions) -> Result<Cluster, CompleteError> {
    complete_with_versions(docs, options).map(|(cluster, _)| cluster)
}

/// [`complete`], and the versions table it completed the spec with (looked up once: the lookup
/// may fetch asset hashes).
pub fn complete_with_versions(docs: &Documents, options: &CompileOptions) -> Result<(Cluster, Versions), CompleteError> {
    let user = &docs.cluster.spec;
    let version = user.kubernetes_version.clone().ok_or(CompleteError::MissingVersion)?;
    let cloud: Cloud = user.cloud_provider.as_deref().ok_or(CompleteError::MissingCloud)?.parse()?;
    let ctx =
        Context { name: docs.cluster.name().to_string(), cloud, version, versions: versions_for(user, options)?, groups: &docs.instance_groups, user, options };
    // The images the user sets are written as given: pinned here, once, when their digests are known.
    let mut spec = if options.image_digests.is_empty() { user.clone() } else { crate::digests::pin_given_in(user, &ctx.versions)? };
    for _ in 0..MAX_PASSES {
        let before = spec.clone();
        for builder in BUILDERS {
            let derived = Derived::of(&spec);
            builder(&ctx, &derived, &mut spec);
        }
        if spec == before {
            let mut cluster = docs.cluster.clone();
            cluster.spec = spec;
            return Ok((cluster, ctx.versions));
        }
    }
    Err(CompleteError::NoFixedPoint(format!("Cluster/{}", ctx.name)))
}

/// `field.get_or_insert_with(..)` for the common case of a default value.
pub(crate) fn default<T>(field: &mut Option<T>, value: T) {
    if field.is_none() {
        *field = Some(value);
    }
}

pub(crate) fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}
