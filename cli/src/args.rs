//! Command-line values shared by `keelson compile` and the cloud commands: per-architecture assets
//! (`ARCH=SHA256@URL[,MIRROR…]`), the `--asset-hashes` file and the `--image-digests` bundle.

use std::collections::BTreeMap;

use anyhow::Context as _;
use spec_compiler::complete::CompileOptions;
use spec_compiler::userdata::NodeupAsset;
use spec_compiler::versions::Arch;

/// The flags that decide what a compile makes of a spec (`keelson compile`, `keelson get assets`).
#[derive(Debug, clap::Args)]
pub struct CompileFlags {
    /// Never fetch asset hashes over the network; fail if one is not in the versions table.
    #[arg(long)]
    pub offline: bool,
    /// Where fetched asset hashes are cached.
    #[arg(long = "cache-dir")]
    pub cache_dir: Option<std::path::PathBuf>,
    /// A file of `<url> <sha256>` lines: hashes of assets a mirror serves that win over the
    /// versions table (for assets built locally); defaults to $KEELSON_ASSET_HASHES.
    #[arg(long = "asset-hashes", env = "KEELSON_ASSET_HASHES", value_name = "FILE")]
    pub asset_hashes: Option<std::path::PathBuf>,
    /// The images' digests: a bundle archive (`keelson bundle create`; only its `bundle.json` is
    /// read) or its `bundle.json`. Every image of the output is then pinned (`NAME:TAG@sha256:…`),
    /// and an image it does not name is an error.
    #[arg(long = "image-digests", env = "KEELSON_IMAGE_DIGESTS", value_name = "FILE")]
    pub image_digests: Option<std::path::PathBuf>,
    /// The nodeup binary user-data boots, per architecture: `amd64=SHA256@URL[,MIRROR…]` (repeatable).
    /// Defaults to $KEELSON_NODEUP_ASSET (space-separated).
    #[arg(long = "nodeup-asset", value_name = "ARCH=SHA256@URL", env = "KEELSON_NODEUP_ASSET", value_delimiter = ' ')]
    pub nodeup_asset: Vec<String>,
    /// The protokube binary control planes install, per architecture: `amd64=SHA256@URL[,MIRROR…]`.
    #[arg(long = "protokube-asset", value_name = "ARCH=SHA256@URL")]
    pub protokube_asset: Vec<String>,
    /// kOps-style base URL of the binaries (`<base>/linux/<arch>/protokube`) for an architecture
    /// without --protokube-asset; defaults to $KOPS_BASE_URL.
    #[arg(long = "kops-base-url", env = "KOPS_BASE_URL", value_name = "URL")]
    pub kops_base_url: Option<String>,
    /// kOps-style feature flags (`+APIServerNodes,…`); defaults to $KOPS_FEATURE_FLAGS.
    #[arg(long = "feature-flags", env = "KOPS_FEATURE_FLAGS", default_value = "")]
    pub feature_flags: String,
    /// The AWS account the cluster is in (12 digits): the ARNs of the roles Keelson's addons
    /// assume with `spec.iam.useServiceAccountExternalPermissions`. `apply` and `reconcile` ask STS
    /// when it is not given; `compile` without it leaves those addons out (and says so).
    #[arg(long = "aws-account-id", value_name = "ID", value_parser = parse_account_id)]
    pub aws_account_id: Option<String>,
}

/// An AWS account id: twelve digits.
fn parse_account_id(s: &str) -> Result<String, String> {
    if s.len() == 12 && s.bytes().all(|b| b.is_ascii_digit()) {
        Ok(s.to_string())
    } else {
        Err(format!("{s:?}: an AWS account id is 12 digits"))
    }
}

impl CompileFlags {
    /// The compile options these flags say, with the CAs to pin (`--state`).
    pub fn options(&self, cas: BTreeMap<String, String>) -> anyhow::Result<CompileOptions> {
        Ok(CompileOptions {
            hash_fetcher: hash_fetcher(self.offline, self.cache_dir.clone()),
            protokube_assets: parse_arch_assets("--protokube-asset", &self.protokube_asset)?,
            kops_base_url: self.kops_base_url.clone().filter(|b| !b.is_empty()),
            feature_flags: CompileOptions::parse_feature_flags(&self.feature_flags),
            nodeup_assets: parse_arch_assets("--nodeup-asset", &self.nodeup_asset)?,
            asset_hashes: asset_hashes(self.asset_hashes.as_deref())?,
            image_digests: image_digests(self.image_digests.as_deref())?,
            cas,
            aws_account: self.aws_account_id.clone(),
        })
    }
}

/// Parse repeated `ARCH=SHA256@URL[,MIRROR…]` values of the flag `flag`. Empty values (an empty
/// environment variable) say nothing.
/// `--arch amd64,arm64` (empty items ignored): an unknown name is an error naming it.
pub fn parse_arches(items: &[String]) -> anyhow::Result<Vec<Arch>> {
    items
        .iter()
        .filter(|a| !a.trim().is_empty())
        .map(|a| Arch::parse(a).ok_or_else(|| anyhow::anyhow!("--arch {a:?}: unknown architecture (amd64 or arm64)")))
        .collect()
}

pub fn parse_arch_assets(flag: &str, items: &[String]) -> anyhow::Result<BTreeMap<Arch, NodeupAsset>> {
    let mut out = BTreeMap::new();
    for item in items.iter().filter(|i| !i.trim().is_empty()) {
        let (arch, asset) = item.split_once('=').ok_or_else(|| anyhow::anyhow!("{flag} {item:?}: expected ARCH=SHA256@URL"))?;
        let arch = Arch::parse(arch).ok_or_else(|| anyhow::anyhow!("{flag} {item:?}: unknown architecture {arch:?} (amd64 or arm64)"))?;
        let asset = NodeupAsset::parse(asset).map_err(|e| anyhow::anyhow!("{flag}: {e}"))?;
        out.insert(arch, asset);
    }
    Ok(out)
}

/// The `--asset-hashes` file, read (none → no hashes).
pub fn asset_hashes(path: Option<&std::path::Path>) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    match path {
        Some(p) => Ok(spec_compiler::versions::read_asset_hashes(p)?),
        None => Ok(Default::default()),
    }
}

/// The `--image-digests` file's images, by upstream reference (none → no digests).
pub fn image_digests(path: Option<&std::path::Path>) -> anyhow::Result<BTreeMap<String, String>> {
    let Some(path) = path else { return Ok(BTreeMap::new()) };
    let digests = bundle::BundleManifest::read(path).context("--image-digests")?.image_digests();
    tracing::info!(file = %path.display(), images = digests.len(), "image digests");
    Ok(digests)
}

/// Where the compile gets hashes the versions table does not know: nowhere with `--offline`, else the
/// published `.sha256` files, cached in `cache_dir` (default `$XDG_CACHE_HOME/keelson/sha256`).
pub fn hash_fetcher(offline: bool, cache_dir: Option<std::path::PathBuf>) -> Option<spec_compiler::versions::Fetcher> {
    use spec_compiler::versions::{default_cache_dir, Fetcher, HttpFetcher};
    (!offline).then(|| Fetcher::new(HttpFetcher { cache_dir: cache_dir.or_else(default_cache_dir) }))
}

/// The trusted certificates (bundles, the primary's first) of [`base::pki::PINNED_CAS`] in a local state store (`DIR` or `file://DIR`), to
/// pin into the NodeupConfigs; every one must be there.
pub fn local_pinned_cas(state: &str) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    let dir = match state.split_once("://") {
        None => std::path::PathBuf::from(state),
        Some(("file", path)) => std::path::PathBuf::from(path),
        Some((scheme, _)) => anyhow::bail!(
            "--state {state}: compile reads a local state store only (a directory or file://); `keelson apply` pins the CA of a {scheme}:// store"
        ),
    };
    let mut out = std::collections::BTreeMap::new();
    for name in base::pki::PINNED_CAS {
        let path = dir.join(base::pki::issued_keyset_key(name));
        let bytes = std::fs::read(&path)
            .with_context(|| format!("--state {state}: {} (create the CAs with `keelson pki init --state {}`)", path.display(), dir.display()))?;
        out.insert(name.to_string(), base::pki::parse_keyset_trust(name, &bytes).with_context(|| path.display().to_string())?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_value_says_nothing_and_a_bad_one_is_named() {
        assert!(parse_arch_assets("--nodeup-asset", &["".into(), " ".into()]).unwrap().is_empty());
        let sha = "a".repeat(64);
        let got = parse_arch_assets("--nodeup-asset", &[format!("amd64={sha}@http://m/nodeup")]).unwrap();
        assert!(got.contains_key(&Arch::Amd64));
        let e = parse_arch_assets("--nodeup-asset", &["nonsense".into()]).unwrap_err().to_string();
        assert!(e.contains("--nodeup-asset") && e.contains("nonsense"), "{e}");
    }
}
