//! Command-line values shared by `keelson compile` and the cloud commands: per-architecture assets
//! (`ARCH=SHA256@URL[,MIRROR…]`) and the `--asset-hashes` file.

use std::collections::BTreeMap;

use anyhow::Context as _;
use spec_compiler::userdata::NodeupAsset;
use spec_compiler::versions::Arch;

#[cfg(feature = "cloud")]
pub fn parse_nodeup_assets(items: &[String]) -> anyhow::Result<BTreeMap<Arch, NodeupAsset>> {
    parse_arch_assets("--nodeup-asset", items)
}

/// Parse repeated `ARCH=SHA256@URL[,MIRROR…]` values of the flag `flag`. Empty values (an empty
/// environment variable) say nothing.
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

/// Where the compile gets hashes the versions table does not know: nowhere with `--offline`, else the
/// published `.sha256` files, cached in `cache_dir` (default `$XDG_CACHE_HOME/keelson/sha256`).
pub fn hash_fetcher(offline: bool, cache_dir: Option<std::path::PathBuf>) -> Option<spec_compiler::versions::Fetcher> {
    use spec_compiler::versions::{default_cache_dir, Fetcher, HttpFetcher};
    (!offline).then(|| Fetcher::new(HttpFetcher { cache_dir: cache_dir.or_else(default_cache_dir) }))
}

/// The certificates of [`base::pki::PINNED_CAS`] in a local state store (`DIR` or `file://DIR`), to
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
        out.insert(name.to_string(), base::pki::parse_keyset_cert(name, &bytes).with_context(|| path.display().to_string())?);
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
