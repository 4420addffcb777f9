//! Approving a worker's first client certificate, name by name.
//!
//! Nothing approves a bootstrap token's CSR automatically (the bootstrap RBAC binds
//! `system:bootstrappers` to `system:node-bootstrapper` only). This approver looks at each pending
//! CSR for the kubelet client signer (`kubernetes.io/kube-apiserver-client-kubelet`) from a user in
//! `system:bootstrappers` and
//! - **approves** it when it asks for exactly `CN=system:node:<name>, O=system:nodes`, no
//!   alternative names, client usages only, and `<name>` is neither a control plane's (a Node
//!   labelled as one, this host's own name, or — on AWS and GCE — an instance of a control-plane
//!   group) nor an existing Node's, and on AWS and GCE an instance of one of the cluster's worker
//!   groups has that name;
//! - **denies** it otherwise, with the reason in the condition's message.
//!
//! CSRs from anyone else (a kubelet renewing its own certificate: `selfnodeclient`; an admin) are
//! not this approver's to decide. Every control plane runs it; the decision is written with the
//! CSR's resourceVersion, so when two race the second gets a conflict and drops its write.

use std::collections::BTreeSet;

use base::pki::CsrSubject;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;

/// The signer of kubelet client certificates.
pub const KUBELET_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The group every bootstrap token's user is in.
pub const BOOTSTRAPPERS: &str = "system:bootstrappers";
/// The labels a control plane's Node carries (kOps sets both on older releases).
pub const CONTROL_PLANE_LABELS: &[&str] = &["node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master"];
const NODE_PREFIX: &str = "system:node:";
const NODES_GROUP: &str = "system:nodes";
const CLIENT_USAGES: &[&str] = &["digital signature", "key encipherment", "client auth"];

/// What the approver reads of a CSR.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CsrFacts {
    pub name: String,
    pub resource_version: Option<String>,
    pub signer: String,
    pub username: String,
    pub groups: Vec<String>,
    pub usages: Vec<String>,
    /// The PEM request.
    pub request: String,
    /// Approved, denied or failed already.
    pub decided: bool,
}

impl CsrFacts {
    pub fn of(csr: &CertificateSigningRequest) -> CsrFacts {
        let spec = &csr.spec;
        CsrFacts {
            name: csr.metadata.name.clone().unwrap_or_default(),
            resource_version: csr.metadata.resource_version.clone(),
            signer: spec.signer_name.clone(),
            username: spec.username.clone().unwrap_or_default(),
            groups: spec.groups.clone().unwrap_or_default(),
            usages: spec.usages.clone().unwrap_or_default(),
            request: String::from_utf8_lossy(&spec.request.0).into_owned(),
            decided: csr
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| matches!(c.type_.as_str(), "Approved" | "Denied" | "Failed") && c.status == "True")),
        }
    }

    /// A pending kubelet client CSR from a bootstrap token: this approver's to decide.
    pub fn is_bootstrap_request(&self) -> bool {
        !self.decided && self.signer == KUBELET_CLIENT_SIGNER && self.groups.iter().any(|g| g == BOOTSTRAPPERS)
    }
}

/// Why a CSR is denied: a short `reason` (the metric's label) and the condition's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: &'static str,
    pub message: String,
}

fn refuse(reason: &'static str, message: impl Into<String>) -> Refusal {
    Refusal { reason, message: message.into() }
}

/// The Node name a bootstrap CSR asks for, or why it asks for something no worker gets.
pub fn requested_node(csr: &CsrFacts, subject: Result<&CsrSubject, String>) -> Result<String, Refusal> {
    let subject = subject.map_err(|e| refuse("request", format!("unreadable request: {e}")))?;
    let name = match subject.common_names.as_slice() {
        [cn] => {
            cn.strip_prefix(NODE_PREFIX).filter(|n| !n.is_empty()).ok_or_else(|| refuse("subject", format!("common name {cn:?} is not {NODE_PREFIX}<name>")))?
        }
        other => return Err(refuse("subject", format!("{} common names; expected one, {NODE_PREFIX}<name>", other.len()))),
    };
    if subject.organizations != [NODES_GROUP] {
        return Err(refuse("subject", format!("organizations {:?}; expected [{NODES_GROUP:?}]", subject.organizations)));
    }
    if subject.alt_names {
        return Err(refuse("subject", "subject alternative names: a kubelet client certificate has none"));
    }
    if !csr.usages.iter().any(|u| u == "client auth") || csr.usages.iter().any(|u| !CLIENT_USAGES.contains(&u.as_str())) {
        return Err(refuse("usages", format!("usages {:?}: only {CLIENT_USAGES:?}, with client auth", csr.usages)));
    }
    if !name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.') || name.len() > 253 {
        return Err(refuse("subject", format!("{name:?} is not a Node name (a DNS-1123 subdomain)")));
    }
    Ok(name.to_string())
}

/// What the cloud says of an instance name (AWS and GCE; elsewhere nothing is asked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloudAnswer {
    /// An instance of the cluster's worker group `group`.
    Worker { group: String },
    /// An instance of the control-plane (or API server) group `group`.
    ControlPlane { group: String },
    /// No instance of the cluster's groups has the name, or the cloud could not say.
    Unknown { message: String },
}

/// What the cluster knows of names: existing Nodes and control planes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Known {
    pub nodes: BTreeSet<String>,
    pub control_planes: BTreeSet<String>,
}

/// Whether a worker may have its first certificate for `name`.
pub fn judge_name(name: &str, known: &Known, cloud: Option<&CloudAnswer>) -> Result<(), Refusal> {
    if known.control_planes.contains(name) {
        return Err(refuse("control-plane", format!("{name} is a control plane's name: a bootstrap token gets worker certificates only")));
    }
    match cloud {
        Some(CloudAnswer::ControlPlane { group }) => {
            return Err(refuse(
                "control-plane",
                format!("{name} is an instance of the control-plane group {group}: a bootstrap token gets worker certificates only"),
            ))
        }
        Some(CloudAnswer::Unknown { message }) => {
            return Err(refuse("instance", format!("{name}: no worker instance of the cluster has this name: {message}")))
        }
        Some(CloudAnswer::Worker { .. }) | None => {}
    }
    if known.nodes.contains(name) {
        return Err(refuse("node-exists", format!("Node {name} exists: a bootstrap token may not take over a registered Node")));
    }
    Ok(())
}

/// The approval subresource patch: the decision, guarded by the CSR's resourceVersion (a second
/// approver racing this one gets a conflict).
pub fn decision_patch(resource_version: Option<&str>, approve: bool, message: &str, now: &str) -> serde_json::Value {
    let (type_, reason) = if approve { ("Approved", "KeelsonBootstrapApproved") } else { ("Denied", "KeelsonBootstrapDenied") };
    serde_json::json!({
        "metadata": {"resourceVersion": resource_version},
        "status": {"conditions": [{"type": type_, "status": "True", "reason": reason, "message": message, "lastUpdateTime": now}]},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csr() -> CsrFacts {
        CsrFacts {
            name: "node-csr-1".into(),
            signer: KUBELET_CLIENT_SIGNER.into(),
            username: "system:bootstrap:abcdef".into(),
            groups: vec!["system:bootstrappers".into(), "system:authenticated".into()],
            usages: vec!["digital signature".into(), "client auth".into()],
            ..Default::default()
        }
    }

    fn subject(cn: &str) -> CsrSubject {
        CsrSubject { common_names: vec![cn.into()], organizations: vec!["system:nodes".into()], alt_names: false }
    }

    #[test]
    fn only_pending_kubelet_client_requests_of_bootstrappers_are_this_approvers() {
        assert!(csr().is_bootstrap_request());
        assert!(!CsrFacts { decided: true, ..csr() }.is_bootstrap_request());
        assert!(!CsrFacts { signer: "kubernetes.io/kubelet-serving".into(), ..csr() }.is_bootstrap_request());
        // A kubelet renewing its own certificate (selfnodeclient) is not a bootstrapper.
        assert!(!CsrFacts { username: "system:node:n1".into(), groups: vec!["system:nodes".into()], ..csr() }.is_bootstrap_request());
    }

    #[test]
    fn the_request_must_be_a_plain_kubelet_client_certificate() {
        assert_eq!(requested_node(&csr(), Ok(&subject("system:node:ip-10-0-1-5.ec2.internal"))), Ok("ip-10-0-1-5.ec2.internal".into()));
        let rsa = CsrFacts { usages: vec!["digital signature".into(), "key encipherment".into(), "client auth".into()], ..csr() };
        assert!(requested_node(&rsa, Ok(&subject("system:node:n1"))).is_ok());
        let cases: Vec<(CsrFacts, Result<CsrSubject, String>, &str)> = vec![
            (csr(), Err("not PEM".into()), "request"),
            (csr(), Ok(subject("system:admin")), "subject"),
            (csr(), Ok(subject("system:node:")), "subject"),
            (csr(), Ok(CsrSubject { common_names: vec![], ..subject("x") }), "subject"),
            (csr(), Ok(CsrSubject { organizations: vec!["system:masters".into()], ..subject("system:node:n1") }), "subject"),
            (csr(), Ok(CsrSubject { organizations: vec!["system:nodes".into(), "system:masters".into()], ..subject("system:node:n1") }), "subject"),
            (csr(), Ok(CsrSubject { alt_names: true, ..subject("system:node:n1") }), "subject"),
            (csr(), Ok(subject("system:node:N1/../x")), "subject"),
            (
                CsrFacts { usages: vec!["digital signature".into(), "server auth".into(), "client auth".into()], ..csr() },
                Ok(subject("system:node:n1")),
                "usages",
            ),
            (CsrFacts { usages: vec!["digital signature".into()], ..csr() }, Ok(subject("system:node:n1")), "usages"),
        ];
        for (facts, subject, reason) in cases {
            let got = requested_node(&facts, subject.as_ref().map_err(Clone::clone));
            assert_eq!(got.as_ref().map_err(|r| r.reason), Err(reason), "{subject:?} {:?}: {got:?}", facts.usages);
        }
    }

    #[test]
    fn control_planes_and_existing_nodes_are_refused_workers_approved() {
        let known =
            Known { nodes: ["cp-1", "worker-1"].map(String::from).into(), control_planes: ["cp-1", "cp-2-not-registered-yet"].map(String::from).into() };
        let worker = CloudAnswer::Worker { group: "nodes".into() };
        let reason = |name: &str, cloud: Option<&CloudAnswer>| judge_name(name, &known, cloud).map_err(|r| r.reason);
        assert_eq!(reason("worker-2", None), Ok(()));
        assert_eq!(reason("worker-2", Some(&worker)), Ok(()));
        assert_eq!(reason("cp-1", None), Err("control-plane"));
        assert_eq!(reason("cp-2-not-registered-yet", Some(&worker)), Err("control-plane"));
        assert_eq!(reason("cp-3", Some(&CloudAnswer::ControlPlane { group: "control-plane-a".into() })), Err("control-plane"));
        assert_eq!(reason("worker-1", None), Err("node-exists"));
        assert_eq!(reason("worker-1", Some(&worker)), Err("node-exists"));
        assert_eq!(reason("made-up", Some(&CloudAnswer::Unknown { message: "no instance".into() })), Err("instance"));
        let msg = judge_name("cp-1", &known, None).expect_err("refused").message;
        assert!(msg.contains("cp-1") && msg.contains("control plane"), "{msg}");
    }

    #[test]
    fn the_decision_is_written_against_the_version_read() {
        let p = decision_patch(Some("42"), false, "no", "2026-12-02T05:00:00Z");
        assert_eq!(p["metadata"]["resourceVersion"], "42");
        assert_eq!(p["status"]["conditions"][0]["type"], "Denied");
        assert_eq!(decision_patch(Some("42"), true, "ok", "t")["status"]["conditions"][0]["type"], "Approved");
    }
}
