//! `keelson upgrade cluster -f SPEC [--to VERSION] [--yes]`: move the spec's Kubernetes version to
//! the next release the versions table recommends, one minor at a time. The spec lives in the
//! user's repository, so `--yes` rewrites its `kubernetesVersion:` line in place (nothing else in
//! the file changes); `keelson reconcile cluster --yes` then rolls it out, control
//! planes first.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context as _};
use keelson_api::KubernetesVersion;
use spec_compiler::versions::upgrade::{releases, upgrade_target};

#[derive(clap::Args)]
pub struct UpgradeArgs {
    /// The spec file.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// The release to go to (at most the next minor); default: the next step the table recommends.
    #[arg(long = "to")]
    pub to: Option<String>,
    /// Rewrite the spec's version; otherwise only say what would change.
    #[arg(long)]
    pub yes: bool,
}

/// The text with the Cluster's `kubernetesVersion: FROM` line set to `to`; an error unless exactly
/// one such line exists (the spec is the user's file: never guess which line is meant).
pub fn rewrite_version(text: &str, from: &KubernetesVersion, to: &KubernetesVersion) -> Result<String, String> {
    let matches = |line: &str| {
        let t = line.trim_start();
        t.strip_prefix("kubernetesVersion:").map(str::trim).is_some_and(|v| v.trim_matches(['"', '\'']).trim_start_matches('v') == from.to_string())
    };
    let hits = text.lines().filter(|l| matches(l)).count();
    if hits != 1 {
        return Err(format!("found {hits} lines `kubernetesVersion: {from}`, expected exactly one; edit the spec by hand"));
    }
    let mut out: String = text
        .lines()
        .map(|l| if matches(l) { format!("{}kubernetesVersion: {to}", &l[..l.len() - l.trim_start().len()]) } else { l.to_string() })
        .collect::<Vec<_>>()
        .join("\n");
    if text.ends_with('\n') {
        out.push('\n');
    }
    Ok(out)
}

pub fn run(args: UpgradeArgs) -> anyhow::Result<ExitCode> {
    let file = args.file.display().to_string();
    let docs = match spec_compiler::load::load_spec(&args.file) {
        Ok(d) => d,
        Err(e) => {
            for line in e.lines() {
                eprintln!("{line}");
            }
            return Ok(ExitCode::from(if e.is_unreadable() { 2 } else { 1 }));
        }
    };
    let current = docs.cluster.spec.kubernetes_version.clone().with_context(|| format!("{file}: spec.kubernetesVersion is not set"))?;
    let to = args.to.as_deref().map(|t| t.parse::<KubernetesVersion>().map_err(|e| anyhow::anyhow!("--to: {e}"))).transpose()?;
    let Some(target) = upgrade_target(&releases(), &current, to.as_ref()).with_context(|| format!("{file}: upgrade"))? else {
        println!("{file}: Kubernetes {current}: no newer release to go to");
        return Ok(ExitCode::SUCCESS);
    };
    println!("{file}: Kubernetes {current} → {target}");
    if !args.yes {
        println!(
            "Run with --yes to write it into {file}; then keelson reconcile cluster -f {file} --yes (control planes first, then the workers, the addons last)."
        );
        return Ok(ExitCode::SUCCESS);
    }
    let text = std::fs::read_to_string(&args.file).with_context(|| format!("reading {file}"))?;
    let new = match rewrite_version(&text, &current, &target) {
        Ok(t) => t,
        Err(e) => bail!("{file}: {e}"),
    };
    // The new text must still be this cluster at the new version before it replaces the file.
    let reloaded = spec_compiler::load::load_bytes(&args.file, new.as_bytes()).map_err(|e| anyhow::anyhow!("{file}: the rewritten spec does not load: {e}"))?;
    if reloaded.cluster.spec.kubernetes_version.as_ref() != Some(&target) {
        bail!("{file}: the rewritten spec does not say {target}");
    }
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&args.file).with_context(|| format!("reading {file}"))?.permissions()) & 0o7777;
    base::fs::write_atomic(&args.file, new.as_bytes(), mode, None).with_context(|| format!("writing {file}"))?;
    println!("{file}: written; now keelson reconcile cluster -f {file} --yes");
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_clusters_version_line_changes() {
        let from: KubernetesVersion = "1.34.4".parse().expect("v");
        let to: KubernetesVersion = "1.34.10".parse().expect("v");
        let text = "kind: Cluster\nspec:\n  kubernetesVersion: v1.34.4\n  x: 1.34.4\n---\nkind: InstanceGroup\n";
        assert_eq!(
            rewrite_version(text, &from, &to).expect("rewrite"),
            "kind: Cluster\nspec:\n  kubernetesVersion: 1.34.10\n  x: 1.34.4\n---\nkind: InstanceGroup\n"
        );
        assert!(rewrite_version("spec:\n  kubernetesVersion: 1.33.0\n", &from, &to).is_err_and(|e| e.contains("found 0")));
        assert!(rewrite_version("a:\n  kubernetesVersion: 1.34.4\nb:\n  kubernetesVersion: '1.34.4'\n", &from, &to).is_err_and(|e| e.contains("found 2")));
    }
}
