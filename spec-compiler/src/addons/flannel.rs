//! The flannel CNI (`networking.flannel`), rendered when `spec.networking.flannel` is set:
//! upstream's `Documentation/kube-flannel.yml`, kept byte for byte as a data file ([`RELEASE_FILE`];
//! its module, version and sha256 in `addons/flannel/SOURCE`), with kOps' settings laid over it.
//! Facts from kOps' `networking.flannel/k8s-1.25.yaml.template` (upstream's file, edited),
//! `template_functions.go` (`FlannelBackendType`) and `validation.go` (checked in
//! [`keelson_api::addon_rules`]). What kOps changes, and so does this overlay:
//! * `net-conf.json`: `Network` is the cluster's `nonMasqueradeCIDR` (flannel's `--kube-subnet-mgr`
//!   takes each node's pod CIDR, which kube-controller-manager allocates inside it), and
//!   `Backend.Type` is `networking.flannel.backend`;
//! * the DaemonSet selects `tier: node` and `app: flannel`;
//! * flanneld resyncs its iptables rules every `iptablesResyncSeconds` (5 when unset) and serves its
//!   health on port 8081 (`healthz`), which a liveness probe checks. kOps also probes `/readyz`
//!   for readiness, an endpoint flannel gained after this release; v0.28.4 has only `/healthz`, so
//!   no readiness probe is rendered;
//! * the images are the versions table's, under `assets.containerRegistry`.
//!
//! Upstream's tolerations (every `NoSchedule` taint), `system-node-critical` priority, host
//! network and capabilities are kOps' too and stay as they are.

use serde_json::{json, Value};

use super::upstream::Upstream;

use keelson_api::Cluster;

use crate::versions::{Versions, FLANNEL_CNI_PLUGIN_IMAGE, FLANNEL_IMAGE, FLANNEL_VERSION};

/// The addon's name (kOps' key for it).
pub const NAME: &str = "networking.flannel";
/// The base manifest, relative to `spec-compiler/src/`.
pub const RELEASE_FILE: &str = "addons/flannel/kube-flannel-v0.28.4.yml";
const RELEASE: &str = include_str!("flannel/kube-flannel-v0.28.4.yml");
const UPSTREAM: Upstream = Upstream { file: RELEASE_FILE, text: RELEASE };
const DAEMONSET: &str = "kube-flannel-ds";
const CONFIG_MAP: &str = "kube-flannel-cfg";
/// flanneld's health port (kOps' `--healthz-port`).
pub const HEALTHZ_PORT: u16 = 8081;
/// kOps' `--iptables-resync` when `iptablesResyncSeconds` is unset.
const DEFAULT_IPTABLES_RESYNC_SECONDS: i64 = 5;

/// The spec or the base manifest does not have what the overlay needs.
#[derive(Debug, thiserror::Error)]
pub enum FlannelError {
    #[error("{RELEASE_FILE}: {message}")]
    Release { message: String },
    #[error("spec.nonMasqueradeCIDR: flannel's network is the cluster's nonMasqueradeCIDR, which is not set")]
    NoNetwork,
}

fn release_error(message: impl Into<String>) -> FlannelError {
    FlannelError::Release { message: message.into() }
}

/// What the overlay sets, read from the completed spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `net-conf.json`'s `Network`: `spec.nonMasqueradeCIDR`.
    pub network: String,
    /// `Backend.Type` (kOps' template: `udp` when unset; `keelson validate` requires it, as kOps does).
    pub backend: String,
    pub iptables_resync_seconds: i64,
    pub image: String,
    pub cni_plugin_image: String,
}

impl Settings {
    /// `None` unless `spec.networking.flannel` is set.
    pub fn new(cluster: &Cluster, versions: &Versions) -> Result<Option<Settings>, FlannelError> {
        let spec = &cluster.spec;
        let Some(flannel) = spec.networking.as_ref().and_then(|n| n.flannel.as_ref()) else { return Ok(None) };
        let network = spec.non_masquerade_cidr.ok_or(FlannelError::NoNetwork)?;
        Ok(Some(Settings {
            network: network.to_string(),
            backend: flannel.backend.clone().filter(|b| !b.is_empty()).unwrap_or_else(|| "udp".into()),
            iptables_resync_seconds: flannel.iptables_resync_seconds.unwrap_or(DEFAULT_IPTABLES_RESYNC_SECONDS),
            image: versions.flannel_image(),
            cni_plugin_image: versions.flannel_cni_plugin_image(),
        }))
    }
}

/// The release's objects, in its order.
fn release() -> Result<Vec<Value>, FlannelError> {
    UPSTREAM.docs().map_err(|e| release_error(e.message))
}

fn find<'a>(docs: &'a mut [Value], kind: &str, name: &str) -> Result<&'a mut Value, FlannelError> {
    UPSTREAM.find(docs, kind, name).map_err(|e| release_error(e.message))
}

fn container<'a>(list: &'a mut Value, name: &str) -> Result<&'a mut Value, FlannelError> {
    list.as_array_mut()
        .and_then(|l| l.iter_mut().find(|c| c["name"] == name))
        .ok_or_else(|| release_error(format!("the DaemonSet {DAEMONSET} has no container {name}")))
}

/// `net-conf.json` with kOps' network and backend (upstream's other keys kept).
fn net_conf(upstream: &str, s: &Settings) -> Result<String, FlannelError> {
    let mut conf: Value = serde_json::from_str(upstream).map_err(|e| release_error(format!("net-conf.json is not JSON: {e}")))?;
    let obj = conf.as_object_mut().ok_or_else(|| release_error("net-conf.json is not an object"))?;
    if !obj.contains_key("Network") || obj.get("Backend").is_none_or(|b| b.get("Type").is_none()) {
        return Err(release_error("net-conf.json has no Network or no Backend.Type"));
    }
    obj.insert("Network".into(), json!(s.network));
    conf["Backend"]["Type"] = json!(s.backend);
    let text = serde_json::to_string_pretty(&conf).map_err(|e| release_error(format!("net-conf.json: {e}")))?;
    Ok(text + "\n")
}

fn config_map(d: &mut Value, s: &Settings) -> Result<(), FlannelError> {
    let upstream = d["data"]["net-conf.json"].as_str().ok_or_else(|| release_error(format!("the ConfigMap {CONFIG_MAP} has no net-conf.json")))?;
    d["data"]["net-conf.json"] = json!(net_conf(upstream, s)?);
    Ok(())
}

fn daemon_set(d: &mut Value, s: &Settings) -> Result<(), FlannelError> {
    d["spec"]["selector"]["matchLabels"] = json!({"tier": "node", "app": "flannel"});
    let pod = &mut d["spec"]["template"]["spec"];
    let plugin = container(&mut pod["initContainers"], "install-cni-plugin")?;
    check_image(plugin, FLANNEL_CNI_PLUGIN_IMAGE)?;
    plugin["image"] = json!(s.cni_plugin_image);
    let install = container(&mut pod["initContainers"], "install-cni")?;
    check_image(install, FLANNEL_IMAGE)?;
    install["image"] = json!(s.image);
    let c = container(&mut pod["containers"], "kube-flannel")?;
    check_image(c, FLANNEL_IMAGE)?;
    c["image"] = json!(s.image);
    let args = c["args"].as_array_mut().ok_or_else(|| release_error("the kube-flannel container has no args"))?;
    if args.iter().any(|a| a.as_str().is_some_and(|a| a.starts_with("--iptables-resync") || a.starts_with("--healthz-port"))) {
        return Err(release_error("the kube-flannel container already sets --iptables-resync or --healthz-port"));
    }
    args.push(json!(format!("--iptables-resync={}", s.iptables_resync_seconds)));
    args.push(json!(format!("--healthz-port={HEALTHZ_PORT}")));
    let obj = c.as_object_mut().ok_or_else(|| release_error("the kube-flannel container is not a mapping"))?;
    obj.insert("ports".into(), json!([{"name": "healthz", "containerPort": HEALTHZ_PORT, "protocol": "TCP"}]));
    obj.insert("livenessProbe".into(), json!({"httpGet": {"path": "/healthz", "port": "healthz"}, "initialDelaySeconds": 10, "periodSeconds": 30}));
    Ok(())
}

/// The release's image must be the one the versions table names (a new manifest comes with a new
/// table entry).
fn check_image(c: &Value, want: &str) -> Result<(), FlannelError> {
    if c["image"] != want {
        return Err(release_error(format!(
            "the {} container's image {} is not the versions table's {want} (flannel v{FLANNEL_VERSION})",
            c["name"], c["image"]
        )));
    }
    Ok(())
}

/// The addon's objects for `s`: the release's, overlaid.
pub fn render(s: &Settings) -> Result<Vec<Value>, FlannelError> {
    let mut docs = release()?;
    config_map(find(&mut docs, "ConfigMap", CONFIG_MAP)?, s)?;
    daemon_set(find(&mut docs, "DaemonSet", DAEMONSET)?, s)?;
    Ok(docs)
}

/// The addon's objects, or `None` when `spec.networking.flannel` is not set.
pub fn docs(cluster: &Cluster, versions: &Versions) -> Result<Option<Vec<Value>>, FlannelError> {
    Settings::new(cluster, versions)?.map(|s| render(&s)).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addons::tests::{case, kind};

    fn settings() -> Settings {
        Settings {
            network: "100.64.0.0/10".into(),
            backend: "vxlan".into(),
            iptables_resync_seconds: 5,
            image: FLANNEL_IMAGE.into(),
            cni_plugin_image: FLANNEL_CNI_PLUGIN_IMAGE.into(),
        }
    }

    fn pod(docs: &[Value]) -> &Value {
        &kind(docs, "DaemonSet")["spec"]["template"]["spec"]
    }

    fn net(docs: &[Value]) -> Value {
        serde_json::from_str(kind(docs, "ConfigMap")["data"]["net-conf.json"].as_str().expect("net-conf.json")).expect("JSON")
    }

    #[test]
    fn the_release_file_is_upstreams_byte_for_byte() {
        assert_eq!(base::sha256_hex(RELEASE.as_bytes()), "0bd380eb4954227c903bdea96dc9254650badd2d45ebe31978a47c3ffe2e9727");
        let source = include_str!("flannel/SOURCE");
        assert!(source.contains("0bd380eb4954227c903bdea96dc9254650badd2d45ebe31978a47c3ffe2e9727") && source.contains("v0.28.4"), "{source}");
        assert!(RELEASE_FILE.ends_with(&format!("kube-flannel-v{FLANNEL_VERSION}.yml")));
        let docs = release().expect("parse");
        let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
        assert_eq!(kinds, ["Namespace", "ClusterRole", "ClusterRoleBinding", "ServiceAccount", "ConfigMap", "DaemonSet"]);
    }

    #[test]
    fn overlay_matches_kops() {
        let d = render(&Settings { iptables_resync_seconds: 17, ..settings() }).unwrap();
        assert_eq!(d.len(), 6);
        assert_eq!(net(&d), json!({"Network": "100.64.0.0/10", "EnableNFTables": false, "Backend": {"Type": "vxlan"}}));
        let ds = kind(&d, "DaemonSet");
        assert_eq!(ds["spec"]["selector"]["matchLabels"], json!({"tier": "node", "app": "flannel"}));
        let p = pod(&d);
        assert_eq!(p["priorityClassName"], "system-node-critical");
        assert_eq!(p["tolerations"], json!([{"operator": "Exists", "effect": "NoSchedule"}]));
        assert_eq!(p["hostNetwork"], true);
        let c = &p["containers"][0];
        assert_eq!(c["args"], json!(["--ip-masq", "--kube-subnet-mgr", "--iptables-resync=17", "--healthz-port=8081"]));
        assert_eq!(c["ports"], json!([{"name": "healthz", "containerPort": 8081, "protocol": "TCP"}]));
        assert_eq!(c["livenessProbe"]["httpGet"], json!({"path": "/healthz", "port": "healthz"}));
        assert!(c.get("readinessProbe").is_none(), "v0.28.4 serves no /readyz");
        assert_eq!(c["securityContext"]["capabilities"]["add"], json!(["NET_ADMIN", "NET_RAW"]));
        // The CNI plugin binary and the CNI configuration come from the init containers, as upstream.
        assert_eq!(p["initContainers"][0]["args"], json!(["-f", "/flannel", "/opt/cni/bin/flannel"]));
        assert_eq!(p["initContainers"][1]["args"], json!(["-f", "/etc/kube-flannel/cni-conf.json", "/etc/cni/net.d/10-flannel.conflist"]));
    }

    #[test]
    fn images_come_from_the_versions_table_under_the_registry() {
        let (mut cluster, versions) = case("privateflannel");
        let d = docs(&cluster, &versions).unwrap().expect("flannel is set");
        let p = pod(&d);
        assert_eq!(p["initContainers"][0]["image"], FLANNEL_CNI_PLUGIN_IMAGE);
        assert_eq!(p["initContainers"][1]["image"], FLANNEL_IMAGE);
        assert_eq!(p["containers"][0]["image"], FLANNEL_IMAGE);
        // kOps' privateflannel case: backend vxlan, the network is nonMasqueradeCIDR, resync 5.
        assert_eq!(net(&d)["Network"], "100.64.0.0/10");
        assert_eq!(net(&d)["Backend"]["Type"], "vxlan");
        assert!(p["containers"][0]["args"].as_array().unwrap().contains(&json!("--iptables-resync=5")));
        cluster.spec.networking.as_mut().unwrap().flannel = None;
        assert!(docs(&cluster, &versions).unwrap().is_none());
    }

    #[test]
    fn a_release_with_another_image_is_refused() {
        let mut docs = release().unwrap();
        let err = check_image(&find(&mut docs, "DaemonSet", DAEMONSET).unwrap()["spec"]["template"]["spec"]["containers"][0], "ghcr.io/x:v1").unwrap_err();
        assert!(err.to_string().contains("ghcr.io/x:v1"), "{err}");
    }

    #[test]
    fn no_network_is_an_error_naming_the_field() {
        let (mut cluster, versions) = case("privateflannel");
        cluster.spec.non_masquerade_cidr = None;
        let err = docs(&cluster, &versions).unwrap_err();
        assert!(err.to_string().starts_with("spec.nonMasqueradeCIDR:"), "{err}");
    }
}
