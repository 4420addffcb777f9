//! Certificate renewal on this control plane: a periodic pass over the certificates nodeup and
//! protokube wrote on this host (etcd's, the API server's and its clients', the controller
//! manager's, the scheduler's, kube-proxy's, the kubelet's), reissuing each from its CA in the
//! state store once [`base::renewal::needs_renewal`] says so — same subject, names and usage (read
//! from the certificate itself), a new key, written atomically with the file's mode kept — and
//! making the component that uses it pick it up.
//!
//! Certificates are renewed by *bundle*: all the certificates one component holds, together, so
//! the component restarts at most once per renewal. How a component picks up new files:
//! - etcd reads its serving, peer and client certificates on every TLS handshake: nothing to do.
//! - kube-apiserver, kube-controller-manager, kube-scheduler and kube-proxy hold theirs in memory
//!   (kubeconfigs with embedded certificates; client certificates the API server does not reload):
//!   the static pod manifest gets a new `keelson.io/certificates-renewed` annotation, so the kubelet
//!   restarts that pod. Each protokube does only its own host, so API servers restart one host at a
//!   time, at different moments (the skew is per host).
//! - the kubelet reads its client certificate (one PEM file with the key, which its kubeconfig
//!   names) again by itself, on every new connection and at least every 5 minutes, and its serving
//!   certificate (Kubernetes 1.31+, `ReloadKubeletServerCertificateFile`): nothing to do. Its
//!   certificates are renewed early enough for that ([`base::renewal::KUBELET_CLIENT_LEAD`]). It
//!   is restarted (`systemctl restart kubelet`) only when it could not pick them up in time: a
//!   kubeconfig that embeds the certificate (written by an older nodeup), a kubelet that does not
//!   reload its serving certificate, an old certificate about to expire. A restarted kubelet can
//!   report its Node NotReady on a loaded host until it has checked its runtime, which takes the
//!   node's pods out of their Services.
//!
//! The join server's certificate and the addon controller's client certificate are not files: they
//! are reissued in memory by their owners ([`crate::node_join`], [`crate::addons`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use base::pki::{self, Keypair};
use base::renewal;

use crate::paths;

/// Why renewing one bundle failed.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{path}: {source}")]
    Pki {
        path: PathBuf,
        #[source]
        source: pki::PkiError,
    },
    #[error("CA {name} (issuer of {path}): {message}")]
    Ca { name: String, path: PathBuf, message: String },
    #[error(transparent)]
    Store(#[from] base::StoreError),
    #[error(transparent)]
    Write(#[from] base::fs::FsError),
    #[error("restarting {what}: {message}")]
    Restart { what: String, message: String },
}

/// Where a certificate lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Material {
    /// `<base>.crt` and `<base>.key` (host path without the extension).
    Pair(String),
    /// A kubeconfig whose first user has `client-certificate-data` and `client-key-data` (one that
    /// names files instead holds none: the files are their own material).
    Kubeconfig(String),
    /// One PEM file with a certificate and then its key (the kubelet's client certificate).
    Pem(String),
}

/// How the component holding a bundle picks up new certificates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reload {
    /// It reads the files again by itself (etcd: on every TLS handshake).
    Itself,
    /// Restart its static pod (manifest `<name>.manifest` in the kubelet's manifest directory).
    StaticPod(&'static str),
    /// The kubelet: it reads them again by itself, unless [`kubelet_restart_reason`] says it must
    /// be restarted (systemd). `reloads_serving_cert`: the kubelet reloads `tlsCertFile` (1.31+,
    /// the `ReloadKubeletServerCertificateFile` gate not turned off).
    Kubelet { reloads_serving_cert: bool },
}

impl Reload {
    /// What a renewal leaves the holder at least, to pick up the new certificates by itself.
    fn floor(&self) -> Duration {
        match self {
            Reload::Kubelet { .. } => renewal::KUBELET_CLIENT_LEAD,
            _ => Duration::ZERO,
        }
    }
}

/// Why the kubelet must be restarted to use the certificates just renewed, if it must: `renewed`
/// holds each replaced certificate's material and what the old one had left.
pub fn kubelet_restart_reason(renewed: &[(&Material, Duration)], reloads_serving_cert: bool) -> Option<String> {
    renewed.iter().find_map(|(material, left)| match material {
        Material::Kubeconfig(p) => Some(format!("{p} embeds the client certificate")),
        Material::Pair(p) if !reloads_serving_cert => {
            Some(format!("it does not reload {p}.crt (Kubernetes before 1.31, or ReloadKubeletServerCertificateFile off)"))
        }
        Material::Pem(p) if renewal::kubelet_must_restart(*left) => {
            Some(format!("the certificate it holds from {p} expires in {} s, before it reads the file again", left.as_secs()))
        }
        _ => None,
    })
}

/// The certificates one component holds.
#[derive(Debug, Clone)]
pub struct Bundle {
    pub name: String,
    /// `(name within the bundle, where)`.
    pub certs: Vec<(&'static str, Material)>,
    pub reload: Reload,
}

/// Every certificate a control plane holds (host paths as nodeup and [`crate::pki`] write them);
/// files that are not there (e.g. no kube-proxy) are skipped by the pass.
pub fn control_plane_bundles(etcd_clusters: &[String], kubelet_reloads_serving_cert: bool) -> Vec<Bundle> {
    let pair = |p: String| Material::Pair(p);
    let mut out: Vec<Bundle> = etcd_clusters
        .iter()
        .map(|c| {
            let dir = paths::etcd_pki_dir(c);
            Bundle {
                name: format!("etcd-{c}"),
                certs: vec![("server", pair(format!("{dir}/server"))), ("peer", pair(format!("{dir}/peer"))), ("client", pair(format!("{dir}/client")))],
                reload: Reload::Itself,
            }
        })
        .collect();
    let kapi = paths::KUBE_APISERVER_PKI_DIR;
    out.push(Bundle {
        name: "kube-apiserver".into(),
        certs: vec![
            ("server", pair(format!("{kapi}/server"))),
            ("kubelet-api", pair(format!("{kapi}/kubelet-api"))),
            ("etcd-client", pair(format!("{kapi}/etcd-client"))),
            ("apiserver-aggregator", pair(format!("{kapi}/apiserver-aggregator"))),
        ],
        reload: Reload::StaticPod("kube-apiserver"),
    });
    for (name, kubeconfig) in
        [("kube-controller-manager", paths::KCM_KUBECONFIG), ("kube-scheduler", paths::SCHEDULER_KUBECONFIG), ("kube-proxy", paths::KUBE_PROXY_KUBECONFIG)]
    {
        out.push(Bundle { name: name.into(), certs: vec![("kubeconfig", Material::Kubeconfig(kubeconfig.into()))], reload: Reload::StaticPod(name) });
    }
    out.push(Bundle {
        name: "kubelet".into(),
        certs: vec![
            ("client", Material::Pem(paths::KUBELET_CLIENT_PEM.into())),
            ("kubeconfig", Material::Kubeconfig(paths::KUBELET_KUBECONFIG.into())),
            ("server", pair(paths::KUBELET_SERVER_CERT.into())),
        ],
        reload: Reload::Kubelet { reloads_serving_cert: kubelet_reloads_serving_cert },
    });
    out
}

/// One certificate as the last pass saw it (after any renewal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertStatus {
    pub not_after: SystemTime,
    /// When the pass will renew it.
    pub due_at: SystemTime,
    pub serial: String,
}

/// What one pass found and did.
#[derive(Debug, Default)]
pub struct PassReport {
    /// `<bundle>/<cert>` → status, for every certificate present on the host.
    pub certs: BTreeMap<String, CertStatus>,
    /// Bundles renewed.
    pub renewed: Vec<String>,
    /// Reload steps that were only recorded (not a live root), e.g. `systemctl restart kubelet`.
    pub recorded: Vec<String>,
    /// Bundles that failed, with why.
    pub failed: Vec<(String, CertError)>,
}

impl PassReport {
    /// When the next pass should run at the latest: the earliest renewal due.
    pub fn next_due(&self) -> Option<SystemTime> {
        self.certs.values().map(|c| c.due_at).min()
    }
}

/// The renewal pass of one host.
pub struct Renewer {
    pub root: PathBuf,
    pub store: base::StateStore,
    /// Seeds the skew (with the certificate's name): the instance id or node name.
    pub host: String,
    pub bundles: Vec<Bundle>,
    /// The kubelet's static pod manifest directory (host path).
    pub manifests_dir: String,
    /// Restarts of the API server take the cluster's turn ([`crate::apiserver_turn`]); `None`
    /// restarts at once (a root that is not live, a control plane without etcd main).
    pub api_server_restart: Option<crate::apiserver_turn::Coordinator>,
}

impl Renewer {
    /// The renewer of a control plane: its etcd clusters' certificates, the API server's and the
    /// kubelet's, in the static-pod directory of `plan`; the API server restarts in turn with the
    /// other control planes' ([`crate::apiserver_turn::Coordinator::for_plan`]).
    pub fn for_control_plane(plan: &crate::config::Plan, root: PathBuf, store: base::StateStore, me: &cloud::Identity) -> Renewer {
        let etcd: Vec<String> = plan.etcd_clusters.iter().map(|c| c.name.clone()).collect();
        Renewer {
            api_server_restart: crate::apiserver_turn::Coordinator::for_plan(plan, root.clone(), store.clone(), me),
            root,
            store,
            host: me.instance_id.clone(),
            bundles: control_plane_bundles(&etcd, plan.kubelet_reloads_serving_cert),
            manifests_dir: plan.static_pod_dir.clone(),
        }
    }
}

/// The certificate renewal pass, at start and then whenever a renewal falls due (at most `max_wait`
/// apart; a minute after a failure).
pub async fn run(renewer: Renewer, metrics: crate::metrics::Metrics, max_wait: Duration) {
    loop {
        let report = renewer.pass(std::time::SystemTime::now()).await;
        for r in &report.recorded {
            tracing::info!(command = %r, "not run (not a live root)");
        }
        let failed = report.failed.len() as u64;
        metrics.update(|s| {
            s.certificates = report.certs.iter().map(|(k, c)| (k.clone(), c.not_after)).collect();
            s.certificate_renewals += report.renewed.len() as u64;
            s.certificate_renewal_failures += failed;
        });
        let until_due = report.next_due().and_then(|t| t.duration_since(std::time::SystemTime::now()).ok()).unwrap_or_default();
        let wait =
            if failed > 0 { max_wait.min(Duration::from_secs(60)) } else { until_due.clamp(Duration::from_secs(5), max_wait.max(Duration::from_secs(5))) };
        tokio::time::sleep(wait).await;
    }
}

/// A certificate read from its file.
struct Found {
    name: &'static str,
    material: Material,
    cert_pem: String,
    info: pki::CertInfo,
}

impl Renewer {
    fn path(&self, host_path: &str) -> PathBuf {
        paths::under(&self.root, host_path)
    }

    /// Check every bundle; renew the ones with a certificate due. One bundle failing does not stop
    /// the others.
    pub async fn pass(&self, now: SystemTime) -> PassReport {
        let mut report = PassReport::default();
        let mut cas: BTreeMap<String, Keypair> = BTreeMap::new();
        for bundle in &self.bundles {
            match self.bundle(bundle, now, &mut cas, &mut report).await {
                Ok(()) => {}
                Err(e) => {
                    tracing::error!(bundle = %bundle.name, error = %e, "certificate renewal failed");
                    report.failed.push((bundle.name.clone(), e));
                }
            }
        }
        report
    }

    fn read(&self, material: &Material) -> Result<Option<String>, CertError> {
        let host_path = match material {
            Material::Pair(base) => format!("{base}.crt"),
            Material::Kubeconfig(p) | Material::Pem(p) => p.clone(),
        };
        let path = self.path(&host_path);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(CertError::Read { path, source }),
        };
        match material {
            Material::Pair(_) | Material::Pem(_) => Ok(Some(text)),
            Material::Kubeconfig(_) if names_cert_file(&text) => Ok(None),
            Material::Kubeconfig(_) => kubeconfig_cert(&text).map(Some).map_err(|message| CertError::Parse { path, message }),
        }
    }

    fn status(&self, bundle: &Bundle, f: &Found) -> CertStatus {
        let skew = self.skew(&bundle.name, f.name, &f.info);
        let due_at = renewal::renewal_due_at_with_floor(f.info.not_before, f.info.not_after, skew, bundle.reload.floor());
        CertStatus { not_after: f.info.not_after, due_at, serial: f.info.serial.clone() }
    }

    fn skew(&self, bundle: &str, name: &str, info: &pki::CertInfo) -> Duration {
        let lifetime = info.not_after.duration_since(info.not_before).unwrap_or_default();
        renewal::skew(&format!("{}/{bundle}/{name}", self.host), lifetime)
    }

    async fn bundle(&self, bundle: &Bundle, now: SystemTime, cas: &mut BTreeMap<String, Keypair>, report: &mut PassReport) -> Result<(), CertError> {
        let mut found = Vec::new();
        for (name, material) in &bundle.certs {
            let Some(cert_pem) = self.read(material)? else { continue };
            let info = pki::describe_cert(&cert_pem).map_err(|source| CertError::Pki { path: self.material_path(material), source })?;
            found.push(Found { name, material: material.clone(), cert_pem, info });
        }
        let floor = bundle.reload.floor();
        let due: Vec<&Found> = found
            .iter()
            .filter(|f| renewal::needs_renewal_with_floor(f.info.not_before, f.info.not_after, now, self.skew(&bundle.name, f.name, &f.info), floor))
            .collect();
        if due.is_empty() {
            for f in &found {
                report.certs.insert(format!("{}/{}", bundle.name, f.name), self.status(bundle, f));
            }
            return Ok(());
        }
        let why: Vec<String> = due.iter().map(|f| format!("{} (expires {})", f.name, when(f.info.not_after))).collect();
        tracing::info!(bundle = %bundle.name, due = %why.join(", "), "renewing certificates");
        // Issue everything first, then write: a CA missing from the store changes nothing.
        let mut issued = Vec::new();
        for f in &found {
            let path = self.material_path(&f.material);
            let spec = pki::spec_of(&f.cert_pem).map_err(|source| CertError::Pki { path: path.clone(), source })?;
            let ca = self.ca(&f.info.issuer_cn, &path, cas).await?;
            let kp = pki::issue(&f.info.issuer_cn, &ca, &spec).map_err(|source| CertError::Pki { path: path.clone(), source })?;
            issued.push((f, kp));
        }
        let mut first_serial = String::new();
        for (f, kp) in &issued {
            self.write(&f.material, kp)?;
            let info = pki::describe_cert(&kp.cert_pem).map_err(|source| CertError::Pki { path: self.material_path(&f.material), source })?;
            if first_serial.is_empty() {
                first_serial = info.serial.clone();
            }
            tracing::info!(bundle = %bundle.name, cert = f.name, serial = %info.serial, not_after = %when(info.not_after), "certificate renewed");
            let renewed = Found { name: f.name, material: f.material.clone(), cert_pem: kp.cert_pem.clone(), info };
            report.certs.insert(format!("{}/{}", bundle.name, f.name), self.status(bundle, &renewed));
        }
        report.renewed.push(bundle.name.clone());
        // What the component still serves until it reloads: the earliest of the replaced certificates.
        let left = due.iter().map(|f| f.info.not_after.duration_since(now).unwrap_or_default()).min().unwrap_or_default();
        if let Reload::Kubelet { reloads_serving_cert } = bundle.reload {
            let replaced: Vec<(&Material, Duration)> = found.iter().map(|f| (&f.material, f.info.not_after.duration_since(now).unwrap_or_default())).collect();
            return match kubelet_restart_reason(&replaced, reloads_serving_cert) {
                Some(why) => self.restart_kubelet(&why, report).await,
                None => {
                    tracing::info!("the kubelet reads its renewed certificates by itself: not restarted");
                    Ok(())
                }
            };
        }
        self.reload(&bundle.reload, &first_serial, left, report).await
    }

    fn material_path(&self, m: &Material) -> PathBuf {
        match m {
            Material::Pair(base) => self.path(&format!("{base}.crt")),
            Material::Kubeconfig(p) | Material::Pem(p) => self.path(p),
        }
    }

    async fn ca(&self, name: &str, path: &Path, cas: &mut BTreeMap<String, Keypair>) -> Result<Keypair, CertError> {
        if let Some(ca) = cas.get(name) {
            return Ok(ca.clone());
        }
        let ca_err = |message: String| CertError::Ca { name: name.to_string(), path: path.to_path_buf(), message };
        // The issuer name comes from a file: only a plain keyset name may pick a store path.
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(ca_err("not a keyset name".into()));
        }
        let rel = format!("pki/private/{name}/keyset.yaml");
        let bytes = self.store.get(&rel).await?.ok_or_else(|| ca_err(format!("{} is missing", self.store.url(&rel))))?;
        let ca = pki::parse_private_keyset(name, &bytes).map_err(|e| ca_err(e.to_string()))?;
        cas.insert(name.to_string(), ca.clone());
        Ok(ca)
    }

    /// Write the new material over the old, atomically, keeping each file's mode (a key is never
    /// wider than 0600). The key goes first: a crash between leaves a pair the next pass reissues.
    fn write(&self, material: &Material, kp: &Keypair) -> Result<(), CertError> {
        match material {
            Material::Pair(base) => {
                let (key, crt) = (self.path(&format!("{base}.key")), self.path(&format!("{base}.crt")));
                let key_mode = base::fs::mode_of(&key).map(|m| m & 0o600).unwrap_or(0o600);
                base::fs::write_atomic(&key, kp.key_pem.as_bytes(), key_mode, None)?;
                base::fs::write_atomic(&crt, kp.cert_pem.as_bytes(), base::fs::mode_of(&crt).unwrap_or(0o644), None)?;
            }
            Material::Pem(p) => {
                // Certificate and key in one file: one rename replaces both.
                let path = self.path(p);
                let mode = base::fs::mode_of(&path).map(|m| m & 0o600).unwrap_or(0o600);
                base::fs::write_atomic(&path, kp.combined_pem().as_bytes(), mode, None)?;
            }
            Material::Kubeconfig(p) => {
                let path = self.path(p);
                let text = std::fs::read_to_string(&path).map_err(|source| CertError::Read { path: path.clone(), source })?;
                let body = with_client_cert(&text, kp).map_err(|message| CertError::Parse { path: path.clone(), message })?;
                let mode = base::fs::mode_of(&path).map(|m| m & 0o600).unwrap_or(0o600);
                base::fs::write_atomic(&path, body.as_bytes(), mode, None)?;
            }
        }
        Ok(())
    }

    /// Static pod `name`'s manifest (under the root).
    fn manifest_path(&self, name: &str) -> PathBuf {
        self.path(&format!("{}/{name}.manifest", self.manifests_dir.trim_end_matches('/')))
    }

    /// Annotate static pod `name`'s manifest with `serial`, so the kubelet restarts it. No manifest
    /// (the component does not run here): nothing to restart.
    fn annotate_static_pod(&self, name: &str, serial: &str) -> Result<(), CertError> {
        let path = self.manifest_path(name);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => return Err(CertError::Read { path, source }),
        };
        let body = annotate(&text, RENEWED_ANNOTATION, serial).map_err(|message| CertError::Parse { path: path.clone(), message })?;
        base::fs::write_atomic(&path, body.as_bytes(), base::fs::mode_of(&path).unwrap_or(0o644), None)?;
        tracing::info!(pod = name, "static pod manifest annotated: the kubelet restarts it with the new certificates");
        Ok(())
    }

    async fn reload(&self, reload: &Reload, serial: &str, left: Duration, report: &mut PassReport) -> Result<(), CertError> {
        match reload {
            Reload::Itself => Ok(()),
            Reload::StaticPod(name) => {
                match &self.api_server_restart {
                    Some(turns) if *name == crate::poweroff::API_SERVER && self.manifest_path(name).exists() => {
                        turns.restart(left, || self.annotate_static_pod(name, serial)).await?;
                    }
                    _ => self.annotate_static_pod(name, serial)?,
                }
                Ok(())
            }
            Reload::Kubelet { .. } => self.restart_kubelet("asked", report).await,
        }
    }

    /// `systemctl restart kubelet` (recorded off a live root), saying why.
    async fn restart_kubelet(&self, why: &str, report: &mut PassReport) -> Result<(), CertError> {
        let cmd = ["systemctl", "restart", "kubelet.service"];
        if self.root != Path::new("/") {
            report.recorded.push(cmd.join(" "));
            return Ok(());
        }
        tracing::warn!(why, "restarting the kubelet for its new certificates");
        let restart = |message: String| CertError::Restart { what: "kubelet.service".into(), message };
        let out = tokio::time::timeout(Duration::from_secs(60), tokio::process::Command::new(cmd[0]).args(&cmd[1..]).output())
            .await
            .map_err(|_| restart("systemctl did not answer in 60 s".into()))?
            .map_err(|e| restart(e.to_string()))?;
        if !out.status.success() {
            return Err(restart(format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim())));
        }
        tracing::info!("kubelet restarted with its new certificates");
        Ok(())
    }
}

fn when(t: SystemTime) -> String {
    base::etcd_backup::rfc3339(time::OffsetDateTime::from(t))
}

/// The annotation a renewal sets on a static pod (the serial of the first new certificate), so the
/// kubelet sees a changed pod and restarts it.
pub const RENEWED_ANNOTATION: &str = "keelson.io/certificates-renewed";

fn b64_decode(s: &str) -> Result<String, String> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD.decode(s.trim()).map_err(|e| format!("not base64: {e}"))?;
    String::from_utf8(bytes).map_err(|_| "not PEM text".to_string())
}

fn first_user(doc: &mut serde_yaml_ng::Value) -> Option<&mut serde_yaml_ng::Mapping> {
    doc.get_mut("users")?.get_mut(0)?.get_mut("user")?.as_mapping_mut()
}

/// Whether a kubeconfig's first user names a certificate file (`client-certificate`) instead of
/// embedding one.
pub fn names_cert_file(text: &str) -> bool {
    let Ok(mut doc) = serde_yaml_ng::from_str::<serde_yaml_ng::Value>(text) else { return false };
    first_user(&mut doc).is_some_and(|u| u.contains_key("client-certificate") && !u.contains_key("client-certificate-data"))
}

/// The client certificate (PEM) of a kubeconfig's first user.
pub fn kubeconfig_cert(text: &str) -> Result<String, String> {
    let mut doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
    let user = first_user(&mut doc).ok_or("no users[0].user")?;
    let data = user.get("client-certificate-data").and_then(|v| v.as_str()).ok_or("no users[0].user.client-certificate-data")?;
    b64_decode(data)
}

/// The kubeconfig with its first user's certificate and key replaced; everything else kept.
pub fn with_client_cert(text: &str, kp: &Keypair) -> Result<String, String> {
    use base64::Engine as _;
    let b64 = |s: &str| serde_yaml_ng::Value::String(base64::engine::general_purpose::STANDARD.encode(s.as_bytes()));
    let mut doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
    let user = first_user(&mut doc).ok_or("no users[0].user")?;
    user.insert("client-certificate-data".into(), b64(&kp.cert_pem));
    user.insert("client-key-data".into(), b64(&kp.key_pem));
    serde_yaml_ng::to_string(&doc).map_err(|e| e.to_string())
}

/// A Pod manifest with `metadata.annotations[key] = value`; everything else kept.
pub fn annotate(text: &str, key: &str, value: &str) -> Result<String, String> {
    let mut doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
    let meta = doc.get_mut("metadata").and_then(|m| m.as_mapping_mut()).ok_or("no metadata")?;
    let annotations = meta.entry("annotations".into()).or_insert_with(|| serde_yaml_ng::Value::Mapping(Default::default()));
    let annotations = annotations.as_mapping_mut().ok_or("metadata.annotations is not a map")?;
    annotations.insert(key.into(), value.into());
    serde_yaml_ng::to_string(&doc).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubelet_is_restarted_only_for_what_it_cannot_read_again_in_time() {
        let pem = Material::Pem("/var/lib/kubelet/kubelet-client.pem".into());
        let server = Material::Pair("/srv/kubernetes/kubelet-server".into());
        let legacy = Material::Kubeconfig("/var/lib/kubelet/kubeconfig".into());
        let (plenty, short) = (Duration::from_secs(100 * 86400), Duration::from_secs(200));
        assert_eq!(kubelet_restart_reason(&[(&pem, plenty), (&server, plenty)], true), None);
        assert!(kubelet_restart_reason(&[(&pem, plenty), (&server, plenty)], false).is_some_and(|w| w.contains("kubelet-server.crt")));
        assert!(kubelet_restart_reason(&[(&pem, short)], true).is_some_and(|w| w.contains("expires in 200 s")));
        assert!(kubelet_restart_reason(&[(&legacy, plenty)], true).is_some_and(|w| w.contains("embeds")));
    }

    #[test]
    fn annotate_keeps_the_pod_and_replaces_the_value() {
        let pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: kube-apiserver\n  namespace: kube-system\nspec:\n  hostNetwork: true\n";
        let once = annotate(pod, RENEWED_ANNOTATION, "0a").expect("annotate");
        let twice = annotate(&once, RENEWED_ANNOTATION, "0b").expect("again");
        let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&twice).expect("yaml");
        assert_eq!(v["metadata"]["annotations"][RENEWED_ANNOTATION].as_str(), Some("0b"));
        assert_eq!(v["metadata"]["name"].as_str(), Some("kube-apiserver"));
        assert_eq!(v["spec"]["hostNetwork"].as_bool(), Some(true));
        assert!(annotate("- a list", RENEWED_ANNOTATION, "x").is_err());
    }
}
