//! The registry side of `create` and `push`, on oci-client: one client per run, plain `http://`
//! only to registries on loopback (or allowed by `KEELSON_ALLOW_PLAIN_HTTP`, or `--plain-http`),
//! and the few calls the two commands make, with "not there" told apart from failures.

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::manifest::{IMAGE_MANIFEST_LIST_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE, OCI_IMAGE_INDEX_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

/// The manifest media types a bundle holds: OCI and Docker, single and multi-architecture.
pub(crate) const MANIFEST_TYPES: &[&str] = &[OCI_IMAGE_INDEX_MEDIA_TYPE, IMAGE_MANIFEST_LIST_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE];

/// Whether a media type is a multi-architecture index (OCI index or Docker manifest list).
pub(crate) fn is_index(media_type: &str) -> bool {
    media_type == OCI_IMAGE_INDEX_MEDIA_TYPE || media_type == IMAGE_MANIFEST_LIST_MEDIA_TYPE
}

/// Whether `registry` (`HOST[:PORT]`) may be spoken to over plain http: on loopback, when
/// `KEELSON_ALLOW_PLAIN_HTTP` allows its host ([`keelson_api::plain_http`]), or when the user said
/// so (`--plain-http`).
pub(crate) fn plain_http(registry: &str, flag: bool) -> bool {
    flag || keelson_api::plain_http::check("registry", &format!("http://{registry}/")).is_ok()
}

/// A client speaking plain http to `http_registries`, https to every other.
pub(crate) fn client(http_registries: Vec<String>) -> Client {
    Client::new(ClientConfig {
        protocol: ClientProtocol::HttpsExcept(http_registries),
        platform_resolver: None,
        connect_timeout: Some(std::time::Duration::from_secs(30)),
        read_timeout: Some(std::time::Duration::from_secs(300)),
        ..Default::default()
    })
}

pub(crate) const ANONYMOUS: RegistryAuth = RegistryAuth::Anonymous;

/// Whether an error says the manifest, blob or repository is not there.
pub(crate) fn is_not_found(e: &OciDistributionError) -> bool {
    match e {
        OciDistributionError::ServerError { code: 404, .. } | OciDistributionError::ImageManifestNotFoundError(_) => true,
        OciDistributionError::RegistryError { envelope, .. } => {
            envelope.errors.iter().any(|e| matches!(e.code, OciErrorCode::ManifestUnknown | OciErrorCode::NameUnknown | OciErrorCode::BlobUnknown))
        }
        _ => false,
    }
}

/// The digest `reference` (a tag or a digest) resolves to; `None` when it is not there (HEAD,
/// falling back to GET when the registry sends no digest header).
pub(crate) async fn manifest_digest(client: &Client, reference: &Reference) -> Result<Option<String>, OciDistributionError> {
    match client.fetch_manifest_digest(reference, &ANONYMOUS).await {
        Ok(d) => Ok(Some(d)),
        Err(e) if is_not_found(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether the blob is in the repository of `reference`: a one-byte ranged GET (oci-client 0.15
/// has no blob HEAD), authenticated as every other call.
pub(crate) async fn blob_exists(client: &Client, reference: &Reference, digest: &str) -> Result<bool, OciDistributionError> {
    match client.pull_blob_stream_partial(reference, digest, 0, Some(1)).await {
        Ok(_) => Ok(true),
        Err(e) if is_not_found(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// `registry/repository@digest`.
pub(crate) fn by_digest(reference: &Reference, digest: &str) -> Reference {
    Reference::with_digest(reference.registry().to_string(), reference.repository().to_string(), digest.to_string())
}

/// The `mediaType` field of a manifest, or the one its shape says (a `manifests` list: an OCI
/// index; else an OCI manifest).
pub(crate) fn media_type_of(bytes: &[u8]) -> String {
    let v: serde_json::Value = serde_json::from_slice(bytes).unwrap_or_default();
    match v.get("mediaType").and_then(|m| m.as_str()) {
        Some(m) => m.to_string(),
        None if v.get("manifests").is_some() => OCI_IMAGE_INDEX_MEDIA_TYPE.to_string(),
        None => OCI_IMAGE_MEDIA_TYPE.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_only_on_loopback_or_when_asked() {
        assert!(plain_http("127.0.0.1:5000", false));
        assert!(plain_http("localhost:5000", false));
        assert!(!plain_http("registry.example.com:5000", false));
        assert!(plain_http("registry.example.com:5000", true));
    }

    #[test]
    fn media_types_by_field_or_shape() {
        assert_eq!(media_type_of(br#"{"mediaType":"application/vnd.docker.distribution.manifest.list.v2+json"}"#), IMAGE_MANIFEST_LIST_MEDIA_TYPE);
        assert_eq!(media_type_of(br#"{"schemaVersion":2,"manifests":[]}"#), OCI_IMAGE_INDEX_MEDIA_TYPE);
        assert_eq!(media_type_of(br#"{"schemaVersion":2,"layers":[]}"#), OCI_IMAGE_MEDIA_TYPE);
        assert!(is_index(IMAGE_MANIFEST_LIST_MEDIA_TYPE) && !is_index(OCI_IMAGE_MEDIA_TYPE));
    }
}
