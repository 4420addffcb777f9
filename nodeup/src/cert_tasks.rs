//! The host's own certificates: a certificate and key issued on the host from a cluster CA
//! ([`CertTask`]), a kubeconfig with an embedded client certificate ([`KubeconfigTask`]), and the
//! kubelet's client certificate and key in one PEM file ([`KubeletClientTask`]); all renewed when
//! less than a third of their life is left, or when unreadable — the kubelet's early enough for it
//! to pick the new one up by itself ([`base::renewal::KUBELET_CLIENT_LEAD`]).

use std::sync::Arc;

use base::pki::{self, CertSpec, Keypair};

use crate::nodetasks::Ctx;
use crate::render::kubelet;
use crate::tasks::{Task, TaskError};

/// A certificate and key (`<base>.crt`, `<base>.key` 0600) issued on the host from a CA.
/// Converged when both exist with the right modes and the CA did not change.
pub struct CertTask {
    pub base: String,
    pub ca_name: String,
    pub ca: Arc<Keypair>,
    pub spec: CertSpec,
    pub deps: Vec<String>,
}

impl CertTask {
    pub fn new(base: &str, ca_name: &str, ca: Arc<Keypair>, spec: CertSpec, ca_dep: &str) -> CertTask {
        CertTask { base: base.into(), ca_name: ca_name.into(), ca, spec, deps: vec![ca_dep.to_string()] }
    }
}

impl Task<Ctx<'_>> for CertTask {
    fn name(&self) -> String {
        format!("cert:{}.crt", self.base)
    }
    fn paths(&self) -> Vec<String> {
        vec![format!("{}.crt", self.base)]
    }
    fn deps(&self) -> Vec<String> {
        self.deps.clone()
    }
    fn check(&self, ctx: &Ctx, deps_changed: bool) -> Result<Vec<String>, TaskError> {
        let crt = ctx.host.path(format!("{}.crt", self.base));
        let key = ctx.host.path(format!("{}.key", self.base));
        if !crt.is_file() || !key.is_file() {
            return Ok(vec![format!("issue certificate CN={} from {}", self.spec.cn, self.ca_name)]);
        }
        if deps_changed {
            return Ok(vec![format!("reissue certificate CN={} (CA changed)", self.spec.cn)]);
        }
        let pem = std::fs::read_to_string(&crt).map_err(base::fs::fs_err(&crt))?;
        if let Some(why) = due(&self.base, &pem) {
            return Ok(vec![format!("reissue certificate CN={} ({why})", self.spec.cn)]);
        }
        if base::fs::mode_of(&key) != Some(0o600) {
            return Ok(vec!["key mode -> 0600".into()]);
        }
        Ok(vec![])
    }
    fn apply(&self, ctx: &Ctx, _: bool) -> Result<(), TaskError> {
        let kp = pki::issue(&self.ca_name, &self.ca, &self.spec)?;
        // Key first: a crash leaves a key without a certificate (reissued next run), never a
        // certificate for a key that is not there.
        base::fs::write_atomic(&ctx.host.path(format!("{}.key", self.base)), kp.key_pem.as_bytes(), 0o600, None)?;
        base::fs::write_atomic(&ctx.host.path(format!("{}.crt", self.base)), kp.cert_pem.as_bytes(), 0o644, None)?;
        Ok(())
    }
}

/// Why a certificate must be reissued now, if it must: unreadable, or due for renewal
/// ([`base::renewal::needs_renewal`], skewed by its path and serial — stable for this
/// certificate, different on every host).
fn due(path: &str, cert_pem: &str) -> Option<String> {
    due_with(cert_pem, Some(path), std::time::Duration::ZERO)
}

/// [`due`]'s rule: skewed when `skew_seed` is given, renewed at least `floor` before expiry.
fn due_with(cert_pem: &str, skew_seed: Option<&str>, floor: std::time::Duration) -> Option<String> {
    let info = match pki::describe_cert(cert_pem) {
        Ok(i) => i,
        Err(e) => return Some(format!("unreadable: {e}")),
    };
    let lifetime = info.not_after.duration_since(info.not_before).unwrap_or_default();
    let skew = skew_seed.map(|seed| base::renewal::skew(&format!("{seed}/{}", info.serial), lifetime)).unwrap_or_default();
    base::renewal::needs_renewal_with_floor(info.not_before, info.not_after, std::time::SystemTime::now(), skew, floor)
        .then(|| format!("renewal due: expires in {} s", left(info.not_after).as_secs()))
}

/// The kubelet's client certificate and key, one PEM file (0600) issued on the host: its
/// kubeconfig names the file, and the kubelet reads it again by itself. Renewed at least
/// [`base::renewal::KUBELET_CLIENT_LEAD`] before it expires; when the old one would expire before
/// the kubelet's next read ([`base::renewal::kubelet_must_restart`]), a running kubelet is
/// restarted.
pub struct KubeletClientTask {
    pub path: String,
    pub ca_name: String,
    pub ca: Arc<Keypair>,
    pub spec: CertSpec,
    pub deps: Vec<String>,
}

impl Task<Ctx<'_>> for KubeletClientTask {
    fn name(&self) -> String {
        format!("pem:{}", self.path)
    }
    fn paths(&self) -> Vec<String> {
        vec![self.path.clone()]
    }
    fn deps(&self) -> Vec<String> {
        self.deps.clone()
    }
    fn check(&self, ctx: &Ctx, deps_changed: bool) -> Result<Vec<String>, TaskError> {
        let p = ctx.host.path(&self.path);
        let Ok(pem) = std::fs::read_to_string(&p) else {
            return Ok(vec![format!("issue client certificate CN={} from {}", self.spec.cn, self.ca_name)]);
        };
        if deps_changed {
            return Ok(vec![format!("reissue client certificate CN={} (CA changed)", self.spec.cn)]);
        }
        if let Some(why) = kubelet_client_due(&pem) {
            return Ok(vec![format!("reissue client certificate CN={} ({why})", self.spec.cn)]);
        }
        if base::fs::mode_of(&p) != Some(0o600) {
            return Ok(vec!["mode -> 0600".into()]);
        }
        Ok(vec![])
    }
    fn apply(&self, ctx: &Ctx, _: bool) -> Result<(), TaskError> {
        let p = ctx.host.path(&self.path);
        let old_left = left_in_file(&p);
        let kp = pki::issue(&self.ca_name, &self.ca, &self.spec)?;
        base::fs::write_atomic(&p, kp.combined_pem().as_bytes(), 0o600, None)?;
        restart_kubelet_if_late(ctx, old_left)
    }
}

fn left(not_after: std::time::SystemTime) -> std::time::Duration {
    not_after.duration_since(std::time::SystemTime::now()).unwrap_or_default()
}

/// What the certificate in the PEM file at `path` has left, if there is a readable one.
pub fn left_in_file(path: &std::path::Path) -> Option<std::time::Duration> {
    std::fs::read_to_string(path).ok().and_then(|pem| pki::describe_cert(&pem).ok()).map(|c| left(c.not_after))
}

/// Why the kubelet's client certificate (the PEM of [`KubeletClientTask`] or the join) must be
/// reissued now, if it must: unreadable, or due ([`base::renewal::KUBELET_CLIENT_LEAD`]).
pub fn kubelet_client_due(pem: &str) -> Option<String> {
    due_with(pem, None, base::renewal::KUBELET_CLIENT_LEAD)
}

/// After the kubelet's client certificate was replaced while the old one had `old_left` to live:
/// restart a running kubelet if it might not read the new one before the old one expires. A
/// kubelet that is not running starts with the new one.
pub fn restart_kubelet_if_late(ctx: &Ctx, old_left: Option<std::time::Duration>) -> Result<(), TaskError> {
    if let Some(left) = old_left.filter(|l| base::renewal::kubelet_must_restart(*l)) {
        tracing::warn!(old_expires_in = ?left, "the kubelet may not read its new client certificate before the old one expires: restarting it");
        ctx.host.run(&["systemctl", "try-restart", "kubelet.service"])?;
    }
    Ok(())
}

/// The client certificate (PEM) embedded in a kubeconfig's first user.
fn kubeconfig_cert(text: &str) -> Option<String> {
    use base64::Engine as _;
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(text).ok()?;
    let data = doc.get("users")?.get(0)?.get("user")?.get("client-certificate-data")?.as_str()?;
    String::from_utf8(base64::engine::general_purpose::STANDARD.decode(data.trim()).ok()?).ok()
}

/// A kubeconfig (0400) with an embedded client certificate issued on the host.
pub struct KubeconfigTask {
    pub path: String,
    pub server: String,
    pub ca_name: String,
    /// The CA that signs the client certificate (the keyset's primary).
    pub ca: Arc<Keypair>,
    /// The certificates the kubeconfig trusts for the server: the keyset's trust bundle (mid-rotation
    /// the local API server may serve from either key).
    pub trust_pem: String,
    pub spec: CertSpec,
    pub deps: Vec<String>,
}

impl KubeconfigTask {
    pub fn local(path: &str, ca: Arc<Keypair>, trust_pem: &str, spec: CertSpec, ca_dep: &str) -> KubeconfigTask {
        KubeconfigTask {
            path: path.into(),
            server: "https://127.0.0.1".into(),
            ca_name: "kubernetes-ca".into(),
            ca,
            trust_pem: trust_pem.into(),
            spec,
            deps: vec![ca_dep.to_string()],
        }
    }
}

impl Task<Ctx<'_>> for KubeconfigTask {
    fn name(&self) -> String {
        format!("kubeconfig:{}", self.path)
    }
    fn paths(&self) -> Vec<String> {
        vec![self.path.clone()]
    }
    fn deps(&self) -> Vec<String> {
        self.deps.clone()
    }
    fn check(&self, ctx: &Ctx, deps_changed: bool) -> Result<Vec<String>, TaskError> {
        let p = ctx.host.path(&self.path);
        if !p.is_file() {
            return Ok(vec![format!("write kubeconfig for {}", self.spec.cn)]);
        }
        if deps_changed {
            return Ok(vec![format!("rewrite kubeconfig for {} (CA changed)", self.spec.cn)]);
        }
        let text = std::fs::read_to_string(&p).map_err(base::fs::fs_err(&p))?;
        match kubeconfig_cert(&text) {
            Some(pem) => {
                if let Some(why) = due(&self.path, &pem) {
                    return Ok(vec![format!("rewrite kubeconfig for {} ({why})", self.spec.cn)]);
                }
            }
            None => return Ok(vec![format!("rewrite kubeconfig for {} (no readable client certificate)", self.spec.cn)]),
        }
        if base::fs::mode_of(&p) != Some(0o400) {
            return Ok(vec!["mode -> 0400".into()]);
        }
        Ok(vec![])
    }
    fn apply(&self, ctx: &Ctx, _: bool) -> Result<(), TaskError> {
        let kp = pki::issue(&self.ca_name, &self.ca, &self.spec)?;
        let user = kubelet::UserEntry { client_certificate_data: Some(kp.cert_pem), client_key_data: Some(kp.key_pem), ..Default::default() };
        let body = kubelet::kubeconfig(&self.server, &self.trust_pem, &self.spec.cn, user).map_err(TaskError::failed)?;
        Ok(base::fs::write_atomic(&ctx.host.path(&self.path), body.as_bytes(), 0o400, None)?)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn certificates_are_due_in_the_last_third_of_their_life_or_when_unreadable() {
        use base::pki::{self, CertSpec};
        let ca = pki::create_ca("kubernetes-ca").expect("ca");
        let spec = CertSpec::client("system:kube-scheduler", &[]);
        let fresh = pki::issue("kubernetes-ca", &ca, &spec).expect("fresh");
        assert_eq!(super::due("/var/lib/kube-scheduler/kubeconfig", &fresh.cert_pem), None);
        // A certificate that has expired is due.
        let short = pki::issue_for("kubernetes-ca", &ca, &spec, std::time::Duration::from_secs(1)).expect("short");
        std::thread::sleep(std::time::Duration::from_millis(1100));
        assert!(super::due("/var/lib/kube-scheduler/kubeconfig", &short.cert_pem).is_some_and(|w| w.contains("renewal due")));
        assert!(super::due("/x", "not a certificate").is_some_and(|w| w.contains("unreadable")));
        let kc = crate::render::kubelet::kubeconfig(
            "https://127.0.0.1",
            &ca.cert_pem,
            "system:kube-scheduler",
            crate::render::kubelet::UserEntry {
                client_certificate_data: Some(fresh.cert_pem.clone()),
                client_key_data: Some(fresh.key_pem),
                ..Default::default()
            },
        )
        .expect("kubeconfig");
        assert_eq!(super::kubeconfig_cert(&kc).as_deref(), Some(fresh.cert_pem.as_str()));
        assert_eq!(super::kubeconfig_cert("users: []"), None);
    }
}
