//! `/etc/containerd/config.toml` and registry-mirror `hosts.toml` files, from typed structs.

use std::collections::BTreeMap;

use keelson_api::ContainerdConfig;
use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

use crate::paths;

#[derive(Debug, Serialize)]
struct Config {
    version: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    root: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    state: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    grpc: Option<Grpc>,
    debug: Debug,
    plugins: Plugins,
}

#[derive(Debug, Serialize)]
struct Grpc {
    address: String,
}

#[derive(Debug, Serialize)]
struct Debug {
    level: String,
}

#[derive(Debug)]
struct Plugins {
    images: Images,
    runtime: Runtime,
}

// Serialised as a map, not a struct: the toml serialiser quotes map keys in table headers
// (`[plugins."io.containerd.cri.v1.images"]`) but not struct field names.
impl Serialize for Plugins {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry("io.containerd.cri.v1.images", &self.images)?;
        m.serialize_entry("io.containerd.cri.v1.runtime", &self.runtime)?;
        m.end()
    }
}

#[derive(Debug, Serialize)]
struct Images {
    pinned_images: PinnedImages,
    registry: Registry,
}

#[derive(Debug, Serialize)]
struct PinnedImages {
    sandbox: String,
}

#[derive(Debug, Serialize)]
struct Registry {
    config_path: String,
}

#[derive(Debug, Serialize)]
struct Runtime {
    #[serde(skip_serializing_if = "Option::is_none")]
    enable_selinux: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cni: Option<Cni>,
    containerd: RuntimeContainerd,
}

#[derive(Debug, Serialize)]
struct Cni {
    conf_template: String,
}

/// Where the kubenet CNI template lives; containerd renders it into `/etc/cni/net.d` once the
/// kubelet tells it the node's pod CIDR (kOps' kubenet on containerd).
pub const KUBENET_CNI_TEMPLATE_PATH: &str = "/etc/containerd/config-cni.template";

/// The kubenet network as a containerd CNI template: a `cbr0` bridge that is the pods' gateway,
/// addresses from the node's pod CIDR(s) (`host-local`), and host ports (`portmap`). Traffic to other
/// nodes' pod CIDRs leaves through the node's routes (set by the cloud's route controller).
pub const KUBENET_CNI_TEMPLATE: &str = r#"{
  "cniVersion": "0.4.0",
  "name": "kubenet",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cbr0",
      "mtu": 1500,
      "isGateway": true,
      "ipMasq": false,
      "promiscMode": true,
      "hairpinMode": false,
      "ipam": {
        "type": "host-local",
        "ranges": [{{range $i, $range := .PodCIDRRanges}}{{if $i}}, {{end}}[{"subnet": "{{$range}}"}]{{end}}],
        "routes": [{{range $i, $route := .Routes}}{{if $i}}, {{end}}{"dst": "{{$route}}"}{{end}}]
      }
    },
    {
      "type": "portmap",
      "capabilities": {"portMappings": true},
      "externalSetMarkChain": "KUBE-MARK-MASQ"
    }
  ]
}
"#;

#[derive(Debug, Serialize)]
struct RuntimeContainerd {
    default_runtime_name: String,
    runtimes: BTreeMap<String, RuntimeEntry>,
}

#[derive(Debug, Serialize)]
struct RuntimeEntry {
    runtime_type: String,
    options: RuncOptions,
}

#[derive(Debug, Serialize)]
struct RuncOptions {
    #[serde(rename = "BinaryName")]
    binary_name: String,
    #[serde(rename = "SystemdCgroup")]
    systemd_cgroup: bool,
}

/// Config version for a containerd version: 4 from 2.3, otherwise 3 (kOps' rule). The version is
/// the NodeupConfig's (the compiler's versions table fills it); nodeup guesses none.
fn config_version(version: Option<&str>) -> Result<i64, String> {
    let v = version.ok_or("containerdConfig.version is not set (the NodeupConfig names the containerd version; recompile with keelson)")?;
    let mut parts = v.trim_start_matches('v').split(['.', '-']).map(str::parse::<u64>);
    match (parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => Ok(if (major, minor) >= (2, 3) { 4 } else { 3 }),
        _ => Err(format!("containerdConfig.version {v:?}: expected MAJOR.MINOR.PATCH")),
    }
}

/// Render `config.toml` (or the user's `configOverride` verbatim). With `kubenet`, containerd writes
/// the pod network's CNI config from [`KUBENET_CNI_TEMPLATE`].
pub fn config_toml(c: &ContainerdConfig, kubenet: bool) -> Result<String, String> {
    if let Some(o) = &c.config_override {
        return Ok(o.clone());
    }
    // The compiler pins it from its versions table; nodeup chooses no version of its own.
    let sandbox = c.sandbox_image.clone().ok_or("containerdConfig.sandboxImage is not set (the NodeupConfig names the pause image; recompile with keelson)")?;
    let mut runtimes = BTreeMap::new();
    runtimes.insert(
        "runc".to_string(),
        RuntimeEntry { runtime_type: "io.containerd.runc.v2".into(), options: RuncOptions { binary_name: paths::RUNC_BIN.into(), systemd_cgroup: true } },
    );
    let cfg = Config {
        version: config_version(c.version.as_deref())?,
        root: c.root.clone(),
        state: c.state.clone(),
        grpc: c.address.clone().map(|address| Grpc { address }),
        debug: Debug { level: c.log_level.clone().unwrap_or_else(|| "info".into()) },
        plugins: Plugins {
            images: Images { pinned_images: PinnedImages { sandbox }, registry: Registry { config_path: paths::CONTAINERD_CERTS_DIR.into() } },
            runtime: Runtime {
                enable_selinux: c.selinux_enabled.filter(|s| *s),
                cni: kubenet.then(|| Cni { conf_template: KUBENET_CNI_TEMPLATE_PATH.into() }),
                containerd: RuntimeContainerd { default_runtime_name: "runc".into(), runtimes },
            },
        },
    };
    let text = toml::to_string(&cfg).map_err(|e| e.to_string())?;
    match c.config_additions.as_ref().filter(|a| !a.is_empty()) {
        None => Ok(text),
        Some(additions) => with_additions(&text, additions),
    }
}

/// kOps' `configAdditions` over the rendered file, in key order: each key a dotted path
/// ([`keelson_api::nodeup::config_addition_path`]), each value an integer, `true`/`false`, or a
/// string, tables made on the way. A path through a value that is not a table is an error naming it.
fn with_additions(text: &str, additions: &BTreeMap<String, keelson_api::IntOrString>) -> Result<String, String> {
    let mut doc: toml::Table = text.parse().map_err(|e| format!("containerd config.toml: {e}"))?;
    for (key, value) in additions {
        let path = keelson_api::nodeup::config_addition_path(key).map_err(|e| format!("containerdConfig.configAdditions: {e}"))?;
        let value = match value {
            keelson_api::IntOrString::Int(n) => toml::Value::Integer(*n),
            keelson_api::IntOrString::String(s) if s == "true" => toml::Value::Boolean(true),
            keelson_api::IntOrString::String(s) if s == "false" => toml::Value::Boolean(false),
            keelson_api::IntOrString::String(s) => toml::Value::String(s.clone()),
        };
        let (last, tables) = path.split_last().ok_or_else(|| format!("containerdConfig.configAdditions[{key}]: an empty path"))?;
        let mut at = &mut doc;
        for seg in tables {
            let next = at.entry(seg.clone()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
            at = next.as_table_mut().ok_or_else(|| format!("containerdConfig.configAdditions[{key}]: {seg:?} is a value in config.toml, not a table"))?;
        }
        at.insert(last.clone(), value);
    }
    toml::to_string(&doc).map_err(|e| e.to_string())
}

/// `hosts.toml` for one registry: mirrors tried in the order given, then the registry itself.
#[derive(Debug)]
struct HostsToml {
    server: Option<String>,
    mirrors: Vec<String>,
}

#[derive(Debug, Serialize)]
struct HostEntry {
    capabilities: Vec<&'static str>,
}

struct OrderedHosts<'a>(&'a [String]);

impl Serialize for OrderedHosts<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for url in self.0 {
            m.serialize_entry(url, &HostEntry { capabilities: vec!["pull", "resolve"] })?;
        }
        m.end()
    }
}

impl Serialize for HostsToml {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        if let Some(server) = &self.server {
            m.serialize_entry("server", server)?;
        }
        m.serialize_entry("host", &OrderedHosts(&self.mirrors))?;
        m.end()
    }
}

/// `(path, contents)` of the `hosts.toml` of every mirrored registry (`*` → `_default`).
pub fn mirror_files(c: &ContainerdConfig) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for (registry, mirrors) in c.registry_mirrors.iter().flatten() {
        let (dir, server) = if registry == "*" {
            ("_default".to_string(), None)
        } else {
            let server = if registry == "docker.io" { "https://registry-1.docker.io".to_string() } else { format!("https://{registry}") };
            (registry.clone(), Some(server))
        };
        let doc = HostsToml { server, mirrors: mirrors.clone() };
        out.push((format!("{}/{dir}/hosts.toml", paths::CONTAINERD_CERTS_DIR), toml::to_string(&doc).map_err(|e| e.to_string())?));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn systemd_cgroups_and_pinned_pause() {
        let c: ContainerdConfig = serde_yaml_ng::from_str("version: 2.3.4\nsandboxImage: registry.k8s.io/pause:3.10.1\nlogLevel: info\n").expect("yaml");
        let t = config_toml(&c, false).expect("toml");
        let v: toml::Value = toml::from_str(&t).expect("parses back");
        assert_eq!(v["version"].as_integer(), Some(4));
        assert!(v["plugins"]["io.containerd.cri.v1.runtime"].get("cni").is_none());
        let k: toml::Value = toml::from_str(&config_toml(&c, true).expect("toml")).expect("parses back");
        assert_eq!(k["plugins"]["io.containerd.cri.v1.runtime"]["cni"]["conf_template"].as_str(), Some(KUBENET_CNI_TEMPLATE_PATH));
        let rt = &v["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["runc"];
        assert_eq!(rt["options"]["SystemdCgroup"].as_bool(), Some(true));
        assert_eq!(v["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"].as_str(), Some("registry.k8s.io/pause:3.10.1"));
        assert_eq!(config_version(Some("2.2.1")), Ok(3));
        assert!(config_version(None).is_err() && config_version(Some("two")).is_err());
    }

    /// kOps' configAdditions: typed values on dotted paths (quoted segments keep their dots), tables
    /// made on the way, what the file already had kept; a path through a plain value is an error.
    #[test]
    fn config_additions_are_set_over_the_rendered_file() {
        let yaml = "version: 2.3.4\nsandboxImage: registry.k8s.io/pause:3.10.1\nconfigAdditions:\n  plugins.\"io.containerd.cri.v1.runtime\".enable_cdi: \"true\"\n  plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.runc.options.BinaryName: /opt/runc\n  plugins.\"io.containerd.cri.v1.images\".max_concurrent_downloads: 7\n  debug.level: debug\n";
        let c: ContainerdConfig = serde_yaml_ng::from_str(yaml).expect("yaml");
        let v: toml::Value = toml::from_str(&config_toml(&c, false).expect("toml")).expect("parses back");
        let rt = &v["plugins"]["io.containerd.cri.v1.runtime"];
        assert_eq!(rt["enable_cdi"].as_bool(), Some(true));
        assert_eq!(rt["containerd"]["runtimes"]["runc"]["options"]["BinaryName"].as_str(), Some("/opt/runc"));
        assert_eq!(rt["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"].as_bool(), Some(true), "what was there stays");
        assert_eq!(v["plugins"]["io.containerd.cri.v1.images"]["max_concurrent_downloads"].as_integer(), Some(7));
        assert_eq!(v["debug"]["level"].as_str(), Some("debug"));
        assert_eq!(v["version"].as_integer(), Some(4));
        let through_a_value: ContainerdConfig = serde_yaml_ng::from_str("version: 2.3.4\nsandboxImage: p:1\nconfigAdditions:\n  version.x: 1\n").expect("yaml");
        let e = config_toml(&through_a_value, false).expect_err("version is a value");
        assert!(e.contains("configAdditions[version.x]") && e.contains("not a table"), "{e}");
        let plain: ContainerdConfig = serde_yaml_ng::from_str("version: 2.3.4\nsandboxImage: p:1\n").expect("yaml");
        let with_empty = ContainerdConfig { config_additions: Some(Default::default()), ..plain.clone() };
        assert_eq!(config_toml(&with_empty, false), config_toml(&plain, false), "no additions: the file as before, byte for byte");
    }

    #[test]
    fn no_pause_image_is_an_error_not_a_default() {
        let c: ContainerdConfig = serde_yaml_ng::from_str("version: 2.3.4\n").expect("yaml");
        let e = config_toml(&c, false).expect_err("nodeup pins no image of its own");
        assert!(e.contains("containerdConfig.sandboxImage"), "{e}");
    }

    #[test]
    fn mirrors_keep_order() {
        let c: ContainerdConfig =
            serde_yaml_ng::from_str("registryMirrors:\n  docker.io: [https://z.example, https://a.example]\n  '*': [https://all.example]\n").expect("yaml");
        let files = mirror_files(&c).expect("mirrors");
        let (p, t) = files.iter().find(|(p, _)| p.contains("docker.io")).expect("docker.io");
        assert_eq!(p, "/etc/containerd/certs.d/docker.io/hosts.toml");
        assert!(t.find("z.example").expect("z") < t.find("a.example").expect("a"), "{t}");
        assert!(files.iter().any(|(p, _)| p.ends_with("_default/hosts.toml")));
    }
}
