//! Publishing the service-account issuer's discovery documents (IRSA): when the spec sets
//! `serviceAccountIssuerDiscovery.discoveryStore`, apply writes `.well-known/openid-configuration`
//! and `openid/v1/jwks` there (kOps `IssuerDiscoveryModelBuilder`), from the `service-account`
//! keyset of the state store — after the keyset exists, and again whenever its trusted keys change.
//! The documents themselves are [`base::oidc::discovery_documents`]; this is the I/O around it.
//!
//! The store must be readable by whoever checks the tokens (AWS STS fetches it over https): Keelson
//! writes the objects and sets no ACL (a bucket policy grants the read, as on buckets with ACLs
//! disabled).

use anyhow::Context as _;
use base::StateStore;
use keelson_api::Cluster;

/// Where the documents go and the issuer they describe, when the cluster publishes them.
pub fn target(cluster: &Cluster) -> Option<(String, String)> {
    let spec = &cluster.spec;
    let store = spec.service_account_issuer_discovery.as_ref()?.discovery_store.clone()?;
    let issuer = spec.kube_api_server.as_ref()?.service_account_issuer.clone()?;
    Some((store, issuer))
}

/// Write the documents of `issuer` into `discovery` (the keys from `state`), each only when it
/// differs from what is there; returns how many were written.
pub async fn publish(state: &StateStore, discovery: &StateStore, issuer: &str) -> anyhow::Result<usize> {
    let rel = base::pki::issued_keyset_key("service-account");
    let bytes = state.get_required(&rel).await.with_context(|| format!("reading the service-account keyset {}", state.url(&rel)))?;
    let keyset = base::keyset::Keyset::parse("service-account", &bytes).with_context(|| state.url(&rel))?;
    let docs = base::oidc::discovery_documents(issuer, &keyset)?;
    let mut written = 0;
    for (path, bytes) in docs.files() {
        if discovery.get(path).await.with_context(|| discovery.url(path))?.as_deref() != Some(bytes) {
            discovery.put(path, bytes).await.with_context(|| format!("publishing {}", discovery.url(path)))?;
            written += 1;
        }
    }
    Ok(written)
}
