//! Keelson's own addons that call the cloud, each on a role of its own
//! (`spec.iam.useServiceAccountExternalPermissions`, AWS): the addon's pods assume the role through
//! their service account's projected token (`sts:AssumeRoleWithWebIdentity`, the cluster's
//! service-account issuer trusted by an IAM OIDC provider) instead of using the control plane's
//! instance role, and the control plane's role no longer holds what the addon needs.
//!
//! The compiler decides which addons are rendered and records each one's service account
//! ([`AddonServiceAccount`]); the cloud model makes a role per record with the addon's statements
//! (`cloud_resources::iam_policy::addon_policy`) and leaves those statements out of the control
//! plane's policy. kOps' per-addon `iam.Subject`s, for the addons Keelson renders.

use serde::{Deserialize, Serialize};

use crate::ClusterSpec;

/// Whose statements a policy holds: the addons that call the cloud.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum AddonPermissions {
    /// The AWS cloud-controller-manager (kOps `AddCCMPermissions`).
    CloudControllerManager,
    /// The EBS CSI driver's controller (`AddAWSEBSCSIDriverPermissions`).
    EbsCsiDriver,
    /// The cluster-autoscaler (`AddClusterAutoscalerPermissions`).
    ClusterAutoscaler,
    /// external-dns (kOps gives it dns-controller's Route53 permissions).
    ExternalDns,
    /// cert-manager's DNS-01 solver in `spec.certManager.hostedZoneIDs`.
    CertManager,
}

impl AddonPermissions {
    /// Every one, in the order the control plane's policy lists their statements.
    pub const ALL: [AddonPermissions; 5] = [
        AddonPermissions::CloudControllerManager,
        AddonPermissions::EbsCsiDriver,
        AddonPermissions::ClusterAutoscaler,
        AddonPermissions::ExternalDns,
        AddonPermissions::CertManager,
    ];

    /// The service account the addon's cloud-calling pods run as: `(namespace, name)` — kOps'.
    pub const fn service_account(self) -> (&'static str, &'static str) {
        match self {
            AddonPermissions::CloudControllerManager => ("kube-system", "aws-cloud-controller-manager"),
            AddonPermissions::EbsCsiDriver => ("kube-system", "ebs-csi-controller-sa"),
            AddonPermissions::ClusterAutoscaler => ("kube-system", "cluster-autoscaler"),
            AddonPermissions::ExternalDns => ("kube-system", "external-dns"),
            AddonPermissions::CertManager => ("cert-manager", "cert-manager"),
        }
    }
}

/// One rendered addon on a role of its own.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AddonServiceAccount {
    pub permissions: AddonPermissions,
    pub namespace: String,
    pub name: String,
}

impl From<AddonPermissions> for AddonServiceAccount {
    fn from(permissions: AddonPermissions) -> AddonServiceAccount {
        let (namespace, name) = permissions.service_account();
        AddonServiceAccount { permissions, namespace: namespace.to_string(), name: name.to_string() }
    }
}

/// Whether the spec puts Keelson's addons on roles of their own: `useServiceAccountExternalPermissions`
/// on AWS (validate refuses it elsewhere).
pub fn on_own_roles(spec: &ClusterSpec) -> bool {
    spec.cloud_provider.as_deref() == Some("aws") && spec.iam.as_ref().and_then(|i| i.use_service_account_external_permissions) == Some(true)
}

/// The projected service-account token's audience, directory and file name (kOps'), and the
/// volume holding it.
pub const TOKEN_AUDIENCE: &str = "amazonaws.com";
pub const TOKEN_DIR: &str = "/var/run/secrets/amazonaws.com/";
pub const TOKEN_FILE: &str = "token";
pub const TOKEN_VOLUME: &str = "token-amazonaws-com";
/// kOps' lifetime of the projected token (a day; the kubelet renews it at 80 %).
pub const TOKEN_EXPIRATION_SECONDS: i64 = 86_400;
/// The pod's `fsGroup` when it sets none, so a non-root container can read the token (kOps'
/// `wellknownusers.Generic`).
pub const TOKEN_FS_GROUP: i64 = 10_001;

/// The ARN of a service account's role.
pub fn role_arn(partition: &str, account: &str, role_name: &str) -> String {
    format!("arn:{partition}:iam::{account}:role/{role_name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_aws_with_the_flag_puts_addons_on_their_own_roles() {
        let mut spec = ClusterSpec { cloud_provider: Some("aws".into()), ..Default::default() };
        assert!(!on_own_roles(&spec));
        spec.iam = Some(crate::generated::IAMSpec { use_service_account_external_permissions: Some(true), ..Default::default() });
        assert!(on_own_roles(&spec));
        spec.cloud_provider = Some("gce".into());
        assert!(!on_own_roles(&spec));
    }

    #[test]
    fn each_addon_has_its_own_service_account() {
        let mut seen: Vec<_> = AddonPermissions::ALL.iter().map(|p| p.service_account()).collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), AddonPermissions::ALL.len());
        assert_eq!(role_arn("aws", "123456789012", "x.kube-system.sa.c"), "arn:aws:iam::123456789012:role/x.kube-system.sa.c");
    }
}
