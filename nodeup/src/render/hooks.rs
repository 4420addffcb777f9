//! Hook units (`spec.hooks` of the cluster and of the instance group, kOps semantics): a raw unit
//! (`useRawManifest`), a `[Service]` body under a generated `[Unit]`, or a container run once with
//! containerd's `ctr` (`execContainer`).

use keelson_api::HookSpec;

/// One hook as nodeup installs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hook {
    /// The unit name without `.service`.
    pub name: String,
    /// `None`: the hook is disabled (its unit is switched off).
    pub unit: Option<String>,
    /// Runs a container (needs containerd first).
    pub uses_containerd: bool,
}

/// Why a hook cannot be installed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("hook {name}: {message}")]
pub struct HookError {
    pub name: String,
    pub message: String,
}

/// The hooks to install, from the NodeupConfig's lists (instance group first). Unnamed hooks are
/// `kops-hook-<index>` (`-ig` for the group's); a name seen before is skipped, so a group hook
/// overrides the cluster hook of the same name.
pub fn hooks(lists: &[Option<Vec<HookSpec>>]) -> Result<Vec<Hook>, HookError> {
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for (i, list) in lists.iter().enumerate() {
        for (j, h) in list.iter().flatten().enumerate() {
            let name = match h.name.as_deref().map(|n| n.trim_end_matches(".service")) {
                Some(n) if !n.is_empty() => n.to_string(),
                _ if i == 0 => format!("kops-hook-{j}-ig"),
                _ => format!("kops-hook-{j}"),
            };
            if !name.chars().all(|c| c.is_ascii_alphanumeric() || ":-_.@".contains(c)) {
                return Err(HookError { name, message: "not a valid systemd unit name".into() });
            }
            if !seen.insert(name.clone()) {
                continue;
            }
            if h.disabled == Some(true) {
                out.push(Hook { name, unit: None, uses_containerd: false });
                continue;
            }
            let (unit, uses_containerd) = unit(&name, h)?;
            out.push(Hook { name, unit: Some(unit), uses_containerd });
        }
    }
    Ok(out)
}

fn unit(name: &str, h: &HookSpec) -> Result<(String, bool), HookError> {
    let err = |message: &str| HookError { name: name.to_string(), message: message.to_string() };
    let manifest = h.manifest.clone().unwrap_or_default();
    if h.use_raw_manifest == Some(true) {
        if manifest.trim().is_empty() {
            return Err(err("useRawManifest needs a manifest"));
        }
        return Ok((ensure_newline(manifest), false));
    }
    let mut s = format!("[Unit]\nDescription=Kops Hook {name}\n");
    for r in h.requires.iter().flatten() {
        s.push_str(&format!("Requires={r}\n"));
    }
    for b in h.before.iter().flatten() {
        s.push_str(&format!("Before={b}\n"));
    }
    match &h.exec_container {
        None if manifest.trim().is_empty() => Err(err("neither manifest nor execContainer is set")),
        None => {
            s.push_str("\n[Service]\n");
            s.push_str(&ensure_newline(manifest));
            Ok((s, false))
        }
        Some(exec) => {
            let mut image = exec.image.clone().unwrap_or_default().trim().to_string();
            if image.is_empty() {
                return Err(err("execContainer.image is not set"));
            }
            if !image.contains('/') {
                image = format!("docker.io/library/{image}");
            }
            if !image.rsplit('/').next().unwrap_or("").contains(':') && !image.contains('@') {
                image.push_str(":latest");
            }
            let mut run: Vec<String> = [
                "/usr/bin/ctr",
                "--namespace",
                "k8s.io",
                "run",
                "--rm",
                "--mount",
                "type=bind,src=/,dst=/rootfs,options=rbind:rslave",
                "--mount",
                "type=bind,src=/var/run/dbus,dst=/var/run/dbus,options=rbind:rprivate",
                "--mount",
                "type=bind,src=/run/systemd,dst=/run/systemd,options=rbind:rprivate",
                "--net-host",
                "--privileged",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            for (k, v) in exec.environment.iter().flatten() {
                run.push("--env".into());
                run.push(format!("{k}={v}"));
            }
            run.push(image.clone());
            run.push(name.to_string());
            run.extend(exec.command.iter().flatten().cloned());
            let pull = ["/usr/bin/ctr", "--namespace", "k8s.io", "image", "pull", &image].map(str::to_string);
            s.push_str("Requires=containerd.service\n");
            s.push_str(&format!("\n[Service]\nExecStartPre={}\nExecStart={}\nType=oneshot\n", escape(&pull), escape(&run)));
            s.push_str("\n[Install]\nWantedBy=multi-user.target\n");
            Ok((s, true))
        }
    }
}

fn ensure_newline(mut s: String) -> String {
    if !s.ends_with('\n') {
        s.push('\n');
    }
    s
}

/// A command line as systemd parses `ExecStart=`: arguments with spaces or quotes double-quoted
/// (backslash and quote escaped), `%` and `$` doubled so systemd does not expand them.
pub fn escape(args: &[String]) -> String {
    args.iter()
        .map(|a| {
            let a = a.replace('%', "%%").replace('$', "$$");
            if a.is_empty() || a.chars().any(|c| c.is_whitespace() || c == '"' || c == '\'' || c == '\\' || c == ';') {
                format!("\"{}\"", a.replace('\\', "\\\\").replace('"', "\\\""))
            } else {
                a
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook(yaml: &str) -> HookSpec {
        serde_yaml_ng::from_str(yaml).expect("hook yaml")
    }

    #[test]
    fn names_overrides_and_disabled() {
        let ig = vec![hook("name: fix-dns\nmanifest: \"ExecStart=/bin/true\"\n"), hook("manifest: \"ExecStart=/bin/a\"\n")];
        let cluster = vec![
            hook("name: fix-dns.service\nmanifest: \"ExecStart=/bin/false\"\n"),
            hook("manifest: \"ExecStart=/bin/b\"\n"),
            hook("name: old\ndisabled: true\n"),
        ];
        let hs = hooks(&[Some(ig), Some(cluster)]).expect("hooks");
        let names: Vec<&str> = hs.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["fix-dns", "kops-hook-1-ig", "kops-hook-1", "old"]);
        assert!(hs[0].unit.as_deref().unwrap_or("").contains("ExecStart=/bin/true"), "the group's hook wins");
        assert_eq!(hs[3].unit, None);
        assert_eq!(hs[0].unit.as_deref(), Some("[Unit]\nDescription=Kops Hook fix-dns\n\n[Service]\nExecStart=/bin/true\n"));
    }

    #[test]
    fn exec_container_runs_once_with_ctr() {
        let h = hook("name: tune\nrequires: [network-online.target]\nbefore: [kubelet.service]\nexecContainer:\n  image: busybox\n  command: [sh, -c, \"echo 1 > /rootfs/x\"]\n  environment:\n    A: \"1 2\"\n");
        let hs = hooks(&[None, Some(vec![h])]).expect("hooks");
        let unit = hs[0].unit.clone().expect("unit");
        assert!(hs[0].uses_containerd);
        assert!(unit.contains("Requires=network-online.target\nBefore=kubelet.service\nRequires=containerd.service\n"), "{unit}");
        assert!(unit.contains("ExecStartPre=/usr/bin/ctr --namespace k8s.io image pull docker.io/library/busybox:latest\n"), "{unit}");
        assert!(unit.contains("--env \"A=1 2\" docker.io/library/busybox:latest tune sh -c \"echo 1 > /rootfs/x\"\n"), "{unit}");
        assert!(unit.contains("Type=oneshot") && unit.contains("WantedBy=multi-user.target"));
    }

    #[test]
    fn bad_hooks_are_errors_naming_the_hook() {
        assert!(hooks(&[None, Some(vec![hook("name: x\n")])]).unwrap_err().to_string().contains("hook x: neither"));
        let e = hooks(&[None, Some(vec![hook("name: y\nexecContainer:\n  image: \" \"\n")])]).unwrap_err();
        assert!(e.to_string().contains("execContainer.image"), "{e}");
        assert!(hooks(&[None, Some(vec![hook("name: \"a b\"\nmanifest: x\n")])]).is_err());
        assert_eq!(escape(&["50%".into(), "$HOME".into()]), "50%% $$HOME");
    }
}
