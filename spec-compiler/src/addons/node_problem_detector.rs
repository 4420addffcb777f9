//! The node-problem-detector addon (`node-problem-detector.addons.k8s.io`), rendered when
//! `spec.nodeProblemDetector.enabled` is true: upstream's addon manifest, kept verbatim as a data
//! file ([`UPSTREAM_FILE`], see `node_problem_detector/SOURCE.md`), with kOps' settings laid over it.
//! Facts from kOps' `node-problem-detector.addons.k8s.io/k8s-1.17.yaml.template` (sourced from the
//! same upstream file) and `components/nodeproblemdetector.go` (defaults, which
//! [`crate::complete`] applies). What the overlay changes:
//! * as kOps: the detector logs to stderr (`kubectl logs`) instead of appending to a file on the
//!   host through `sh -c`, so the host's `/var/log` is mounted read-only; it runs at
//!   `system-node-critical` priority; the image and the requests and memory limit come from the
//!   spec (no CPU limit, as kOps); the host's `/etc/machine-id` is mounted (the journal is found by
//!   it);
//! * upstream's misspelt `nodeSelectors` (an unknown field the API server refuses under strict
//!   validation) becomes the `nodeSelector` it means;
//! * the selector keeps only the name label: upstream's also names the version, and a selector is
//!   immutable, so the next release's manifest could not be applied over this one.
//!
//! Unlike kOps, the host's D-Bus socket and `/run/systemd/system` are not mounted: none of the
//! monitors the detector runs use them, and a privileged pod needs no more of the host than that.

use serde_json::{json, Value};

use keelson_api::{Cluster, NodeProblemDetectorConfig};

use super::upstream::{Upstream, UpstreamError};

/// The addon's name (kOps' name for it).
pub const NAME: &str = "node-problem-detector.addons.k8s.io";
/// The upstream manifest, relative to `spec-compiler/src/`.
pub const UPSTREAM_FILE: &str = "addons/node_problem_detector/npd-kubernetes-v1.34.4.yaml";
const UPSTREAM: Upstream = Upstream { file: UPSTREAM_FILE, text: include_str!("node_problem_detector/npd-kubernetes-v1.34.4.yaml") };
const APP: &str = "node-problem-detector";
const NAME_LABEL: &str = "app.kubernetes.io/name";
const VERSION_LABEL: &str = "app.kubernetes.io/version";
const BINARY: &str = "/node-problem-detector";

/// Why the addon cannot be rendered.
#[derive(Debug, thiserror::Error)]
pub enum NodeProblemDetectorError {
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    /// A completed setting the overlay needs is missing.
    #[error("{0}: not set in the completed spec")]
    Unset(&'static str),
}

/// What the overlay sets, read from the completed spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub image: String,
    pub cpu_request: String,
    pub memory_request: String,
    pub memory_limit: String,
    /// No CPU limit unless the spec sets one (kOps).
    pub cpu_limit: Option<String>,
}

impl Settings {
    /// `None` unless `spec.nodeProblemDetector.enabled` is true.
    pub fn new(cluster: &Cluster) -> Result<Option<Settings>, NodeProblemDetectorError> {
        let Some(npd) = cluster.spec.node_problem_detector.as_ref().filter(|n| n.enabled == Some(true)) else { return Ok(None) };
        let NodeProblemDetectorConfig { enabled: _, image, memory_request, cpu_request, memory_limit, cpu_limit } = npd;
        let q = |v: &Option<keelson_api::Quantity>, path| v.as_ref().map(ToString::to_string).ok_or(NodeProblemDetectorError::Unset(path));
        Ok(Some(Settings {
            image: image.clone().ok_or(NodeProblemDetectorError::Unset("spec.nodeProblemDetector.image"))?,
            cpu_request: q(cpu_request, "spec.nodeProblemDetector.cpuRequest")?,
            memory_request: q(memory_request, "spec.nodeProblemDetector.memoryRequest")?,
            memory_limit: q(memory_limit, "spec.nodeProblemDetector.memoryLimit")?,
            cpu_limit: cpu_limit.as_ref().map(ToString::to_string),
        }))
    }

    /// The image's tag (the version label), or `latest`.
    fn version(&self) -> &str {
        let name = self.image.split('@').next().unwrap_or(&self.image);
        name.rsplit_once(':').map(|(_, t)| t).filter(|t| !t.contains('/')).unwrap_or("latest")
    }
}

/// The detector's command: its binary and the flags upstream's `sh -c` line passes it (the
/// monitors' configuration files), logging to stderr.
fn command(upstream: &Value) -> Result<Vec<String>, UpstreamError> {
    let line = upstream.as_array().and_then(|c| c.last()).and_then(Value::as_str).unwrap_or_default();
    let mut words = line.split_whitespace().skip_while(|w| !w.ends_with(BINARY));
    if words.next().is_none() {
        return Err(UPSTREAM.error(format!("the {APP} container's command does not run {BINARY}")));
    }
    let flags: Vec<String> = words.take_while(|w| w.starts_with("--")).map(str::to_string).collect();
    if !flags.iter().any(|f| f.starts_with("--config.")) {
        return Err(UPSTREAM.error(format!("the {APP} container's command passes no --config.* monitor")));
    }
    let mut out = vec![BINARY.to_string()];
    if !flags.iter().any(|f| f == "--logtostderr") {
        out.push("--logtostderr".into());
    }
    out.extend(flags);
    Ok(out)
}

fn daemonset(d: &mut Value, s: &Settings) -> Result<(), UpstreamError> {
    d["spec"]["selector"] = json!({"matchLabels": {NAME_LABEL: APP}});
    d["metadata"]["labels"][VERSION_LABEL] = json!(s.version());
    d["spec"]["template"]["metadata"]["labels"][VERSION_LABEL] = json!(s.version());
    let pod = d["spec"]["template"]["spec"].as_object_mut().ok_or_else(|| UPSTREAM.error("the DaemonSet has no pod spec"))?;
    let selector = pod.remove("nodeSelectors").or_else(|| pod.remove("nodeSelector")).unwrap_or_else(|| json!({"kubernetes.io/os": "linux"}));
    pod.insert("nodeSelector".into(), selector);
    pod.insert("priorityClassName".into(), json!("system-node-critical"));
    let volumes = pod.get_mut("volumes").and_then(Value::as_array_mut).ok_or_else(|| UPSTREAM.error("the DaemonSet's pod has no volumes"))?;
    volumes.push(json!({"name": "machine-id", "hostPath": {"path": "/etc/machine-id", "type": "File"}}));
    let c = UPSTREAM.container(d, APP)?;
    c["command"] = json!(command(&c["command"])?);
    c["image"] = json!(s.image);
    c["resources"] = json!({"limits": {"memory": s.memory_limit}, "requests": {"cpu": s.cpu_request, "memory": s.memory_request}});
    if let Some(cpu) = &s.cpu_limit {
        c["resources"]["limits"]["cpu"] = json!(cpu);
    }
    let mounts = c["volumeMounts"].as_array_mut().ok_or_else(|| UPSTREAM.error(format!("the {APP} container has no volumeMounts")))?;
    let log = mounts.iter_mut().find(|m| m["mountPath"] == "/var/log").ok_or_else(|| UPSTREAM.error(format!("the {APP} container does not mount /var/log")))?;
    log["readOnly"] = json!(true);
    mounts.push(json!({"name": "machine-id", "mountPath": "/etc/machine-id", "readOnly": true}));
    Ok(())
}

/// The addon's objects for `s`: upstream's, overlaid.
pub fn render(s: &Settings) -> Result<Vec<Value>, UpstreamError> {
    let mut docs = UPSTREAM.docs()?;
    daemonset(UPSTREAM.find(&mut docs, "DaemonSet", APP)?, s)?;
    Ok(docs)
}

/// The addon's objects, or `None` when `spec.nodeProblemDetector.enabled` is not true.
pub fn docs(cluster: &Cluster) -> Result<Option<Vec<Value>>, NodeProblemDetectorError> {
    Ok(Settings::new(cluster)?.map(|s| render(&s)).transpose()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addons::tests::{case, ha, kind};

    fn settings() -> Settings {
        Settings {
            image: "registry.k8s.io/node-problem-detector/node-problem-detector:v0.8.18".into(),
            cpu_request: "20m".into(),
            memory_request: "100Mi".into(),
            memory_limit: "100Mi".into(),
            cpu_limit: None,
        }
    }

    /// The sha256 of the upstream file, as its `SOURCE.md` records it.
    const UPSTREAM_SHA256: &str = "131b2223e98c24c4f72eb26005c31deaf1e6bc0765cef7fecf00cfb28c98561a";

    #[test]
    fn the_upstream_file_is_the_recorded_one() {
        assert_eq!(base::sha256_hex(UPSTREAM.text.as_bytes()), UPSTREAM_SHA256, "{UPSTREAM_FILE} changed: update node_problem_detector/SOURCE.md");
        let source = include_str!("node_problem_detector/SOURCE.md");
        assert!(source.contains(UPSTREAM_SHA256) && UPSTREAM_FILE.ends_with(source.lines().next().unwrap().trim_start_matches("# ")), "{source}");
        let kinds: Vec<String> = UPSTREAM.docs().unwrap().iter().map(|d| d["kind"].as_str().unwrap().to_string()).collect();
        assert_eq!(kinds, ["ServiceAccount", "ClusterRoleBinding", "DaemonSet"]);
    }

    #[test]
    fn the_overlay_is_kops_edits_of_upstream() {
        let d = render(&settings()).unwrap();
        let ds = kind(&d, "DaemonSet");
        assert_eq!(ds["spec"]["selector"], json!({"matchLabels": {"app.kubernetes.io/name": "node-problem-detector"}}));
        assert_eq!(ds["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/version"], "v0.8.18");
        let pod = &ds["spec"]["template"]["spec"];
        assert!(pod.get("nodeSelectors").is_none(), "{pod}");
        assert_eq!(pod["nodeSelector"], json!({"kubernetes.io/os": "linux"}));
        assert_eq!(pod["priorityClassName"], "system-node-critical");
        let c = &pod["containers"][0];
        assert_eq!(
            c["command"],
            json!([
                "/node-problem-detector",
                "--logtostderr",
                "--config.system-log-monitor=/config/kernel-monitor.json,/config/systemd-monitor.json",
                "--config.custom-plugin-monitor=/config/kernel-monitor-counter.json,/config/systemd-monitor-counter.json",
                "--config.system-stats-monitor=/config/system-stats-monitor.json"
            ])
        );
        assert_eq!(c["image"], "registry.k8s.io/node-problem-detector/node-problem-detector:v0.8.18");
        assert_eq!(c["resources"], json!({"limits": {"memory": "100Mi"}, "requests": {"cpu": "20m", "memory": "100Mi"}}));
        let mounts = c["volumeMounts"].as_array().unwrap();
        assert!(mounts.iter().any(|m| m["mountPath"] == "/var/log" && m["readOnly"] == true), "{mounts:?}");
        assert!(mounts.iter().any(|m| m["mountPath"] == "/etc/machine-id"), "{mounts:?}");
        assert!(!serde_json::to_string(pod).unwrap().contains("dbus"), "{pod}");
        let limited = render(&Settings { cpu_limit: Some("200m".into()), ..settings() }).unwrap();
        assert_eq!(kind(&limited, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"], json!({"cpu": "200m", "memory": "100Mi"}));
        // Upstream's privileges, kmsg and tolerations stay.
        assert_eq!(c["securityContext"]["privileged"], true);
        assert!(mounts.iter().any(|m| m["mountPath"] == "/dev/kmsg"), "{mounts:?}");
        assert_eq!(pod["tolerations"].as_array().unwrap().len(), 3);
        assert_eq!(kind(&d, "ClusterRoleBinding")["roleRef"]["name"], "system:node-problem-detector");
    }

    #[test]
    fn a_command_without_the_detector_is_an_upstream_error() {
        let e = command(&json!(["/bin/sh", "-c", "exec /other --config.x=1"])).unwrap_err().to_string();
        assert!(e.contains(UPSTREAM_FILE) && e.contains("does not run /node-problem-detector"), "{e}");
        let e = command(&json!(["/bin/sh", "-c", "exec /node-problem-detector --logtostderr"])).unwrap_err().to_string();
        assert!(e.contains("no --config"), "{e}");
    }

    #[test]
    fn off_unless_enabled_and_kops_defaults_when_on() {
        let (cluster, _) = ha();
        assert!(docs(&cluster).unwrap().is_none());
        // kOps' many-addons case turns it on with no other setting: kOps' defaults apply.
        let (cluster, _) = case("many-addons");
        let s = Settings::new(&cluster).unwrap().expect("many-addons enables node-problem-detector");
        assert_eq!(s, settings());
        assert_eq!(s.version(), "v0.8.18");
        assert!(docs(&cluster).unwrap().is_some());
    }
}
