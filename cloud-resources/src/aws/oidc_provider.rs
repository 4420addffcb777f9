//! The IAM OIDC provider of the cluster's service-account issuer (IRSA,
//! `serviceAccountIssuerDiscovery.enableAWSOIDCProvider`; kOps `awstasks.IAMOIDCProvider`): STS
//! trusts the issuer's tokens through it, for the audiences it lists.
//!
//! IAM names a provider by its URL, not by a name of ours: it is found among the account's
//! providers by the cluster tag, and delete only touches one tagged for the cluster.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::json;

use super::iam::{iam_tags, tags_of};
use super::task::{AwsFuture, AwsTask, Exec, Typed};
use super::terraform::{tags_value, AwsTerraform};
use super::{api, AwsTarget, Discovered, Resolved};
use crate::model::ClusterModel;
use crate::plan::{Action, Change, Kind};
use crate::tasks::{joined, Fields, Linked};

/// The audience kOps' provider always lists (its `defaultAudience`).
pub const DEFAULT_AUDIENCE: &str = "amazonaws.com";

/// SHA-1 fingerprints of the two root CAs S3's certificates chain to (kOps' `getFingerprints`): the
/// thumbprints of a provider whose issuer is an S3 bucket. IAM checks well-known roots by itself
/// and keeps these for the record.
pub const S3_ROOT_THUMBPRINTS: &[&str] = &["9e99a48a9960b14926bb7f3b02e22da2b0ab7280", "a9d53002e97e00e043244f3d170d6f4c414104fd"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OidcProvider {
    /// The cluster's name (the plan's and Terraform's name for it).
    pub name: String,
    /// The issuer URL (`https://…`, kube-apiserver's `--service-account-issuer`).
    pub url: String,
    pub client_ids: BTreeSet<String>,
    pub thumbprints: BTreeSet<String>,
    pub tags: BTreeMap<String, String>,
}

impl OidcProvider {
    /// The provider's host and path: what IAM keys it by, and the prefix of its condition keys
    /// (`<host/path>:sub`).
    pub fn host_path(url: &str) -> &str {
        url.strip_prefix("https://").unwrap_or(url).trim_end_matches('/')
    }
}

impl Linked for OidcProvider {
    const TF_TYPE: &'static str = "aws_iam_openid_connect_provider";
    const TF_ATTR: &'static str = "arn";
}

impl AwsTask for OidcProvider {
    fn kind(&self) -> Kind {
        Kind::IamOidcProvider
    }
    fn name(&self) -> String {
        self.name.clone()
    }
    fn tags(&self) -> BTreeMap<String, String> {
        self.tags.clone()
    }
    fn fields(&self, f: &mut Fields) {
        f.set("url", Self::host_path(&self.url)).set("client_ids", joined(&self.client_ids)).set("thumbprints", joined(&self.thumbprints));
    }
    fn find<'a>(t: &'a AwsTarget, model: &'a ClusterModel, _resolved: &'a Resolved, d: &'a mut Discovered) -> AwsFuture<'a> {
        Box::pin(async move {
            let list = t.iam.list_open_id_connect_providers().send().await.map_err(|e| api("ListOpenIDConnectProviders", &model.cluster, e))?;
            for arn in list.open_id_connect_provider_list().iter().filter_map(|p| p.arn()) {
                let p =
                    t.iam.get_open_id_connect_provider().open_id_connect_provider_arn(arn).send().await.map_err(|e| api("GetOpenIDConnectProvider", arn, e))?;
                let tags = tags_of(p.tags());
                if tags.get("KubernetesCluster") != Some(&model.cluster) {
                    continue;
                }
                let url = p.url().unwrap_or_default();
                let task = OidcProvider {
                    name: tags.get("Name").cloned().unwrap_or_else(|| model.cluster.clone()),
                    url: format!("https://{}", Self::host_path(url)),
                    client_ids: p.client_id_list().iter().cloned().collect(),
                    thumbprints: p.thumbprint_list().iter().cloned().collect(),
                    tags,
                };
                d.found(task, arn.to_string());
            }
            Ok(())
        })
    }
    fn render_terraform(&self, t: &mut AwsTerraform) {
        t.blocks.add(
            Self::TF_TYPE,
            &self.name,
            json!({"url": self.url, "client_id_list": self.client_ids, "thumbprint_list": self.thumbprints, "tags": tags_value(&self.tags)}),
        );
    }
    fn render_aws<'a>(&'a self, cx: Exec<'a>, c: &'a Change) -> AwsFuture<'a> {
        Box::pin(async move {
            let c = Typed::<OidcProvider>::of(c);
            let (t, name) = (cx.target, c.name);
            let create = |want: &'a OidcProvider| async move {
                t.iam
                    .create_open_id_connect_provider()
                    .url(&want.url)
                    .set_client_id_list(Some(want.client_ids.iter().cloned().collect()))
                    .set_thumbprint_list(Some(want.thumbprints.iter().cloned().collect()))
                    .set_tags(Some(iam_tags(&want.tags)))
                    .send()
                    .await
                    .map_err(|e| api("CreateOpenIDConnectProvider", name, e))
            };
            match c.action {
                Action::Create => {
                    create(c.want()?).await?;
                }
                // A provider's URL cannot change: a new issuer is a new provider.
                Action::Update(_) if c.changed("url") => {
                    let arn = c.id()?;
                    t.iam
                        .delete_open_id_connect_provider()
                        .open_id_connect_provider_arn(&arn)
                        .send()
                        .await
                        .map_err(|e| api("DeleteOpenIDConnectProvider", name, e))?;
                    create(c.want()?).await?;
                }
                Action::Update(_) => {
                    let (want, have, arn) = (c.want()?, c.have()?, c.id()?);
                    if c.changed("thumbprints") {
                        t.iam
                            .update_open_id_connect_provider_thumbprint()
                            .open_id_connect_provider_arn(&arn)
                            .set_thumbprint_list(Some(want.thumbprints.iter().cloned().collect()))
                            .send()
                            .await
                            .map_err(|e| api("UpdateOpenIDConnectProviderThumbprint", name, e))?;
                    }
                    for id in want.client_ids.difference(&have.client_ids) {
                        t.iam
                            .add_client_id_to_open_id_connect_provider()
                            .open_id_connect_provider_arn(&arn)
                            .client_id(id)
                            .send()
                            .await
                            .map_err(|e| api("AddClientIDToOpenIDConnectProvider", name, e))?;
                    }
                    for id in have.client_ids.difference(&want.client_ids) {
                        t.iam
                            .remove_client_id_from_open_id_connect_provider()
                            .open_id_connect_provider_arn(&arn)
                            .client_id(id)
                            .send()
                            .await
                            .map_err(|e| api("RemoveClientIDFromOpenIDConnectProvider", name, e))?;
                    }
                    if c.tags_changed() {
                        t.iam
                            .tag_open_id_connect_provider()
                            .open_id_connect_provider_arn(&arn)
                            .set_tags(Some(iam_tags(&want.tags)))
                            .send()
                            .await
                            .map_err(|e| api("TagOpenIDConnectProvider", name, e))?;
                    }
                }
                Action::Delete => {
                    let arn = c.id()?;
                    t.iam
                        .delete_open_id_connect_provider()
                        .open_id_connect_provider_arn(&arn)
                        .send()
                        .await
                        .map_err(|e| api("DeleteOpenIDConnectProvider", name, e))?;
                }
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_provider_is_keyed_by_its_host_and_path() {
        assert_eq!(OidcProvider::host_path("https://d.example.com/c/"), "d.example.com/c");
        assert_eq!(OidcProvider::host_path("https://b.s3.eu-west-1.amazonaws.com/c"), "b.s3.eu-west-1.amazonaws.com/c");
        let p = OidcProvider {
            name: "c".into(),
            url: "https://d.example.com/c".into(),
            client_ids: [DEFAULT_AUDIENCE.to_string()].into(),
            thumbprints: S3_ROOT_THUMBPRINTS.iter().map(|s| s.to_string()).collect(),
            tags: BTreeMap::new(),
        };
        let mut f = Fields::default();
        p.fields(&mut f);
        assert_eq!(f.0.get("url").map(String::as_str), Some("d.example.com/c"));
        assert_eq!(f.0.get("client_ids").map(String::as_str), Some("amazonaws.com"));
    }
}
