//! Node join by GCE identity, the server's side: the node sends a metadata identity token
//! (`Authorization: x-gce-identity <JWT>`, [`base::node_join_gce`]) whose audience binds the
//! request body. The checks, in order, each refusal a 403 with its own `reason`:
//!
//! 1. the token: RS256 signature against Google's keys ([`GoogleKeys`]), issuer, audience = this
//!    body, at most [`MAX_AGE_SECS`] old (`token`, `issuer`, `audience`, `freshness`);
//! 2. its project is the cluster's (`project`), its zone in the cluster's region (`zone`);
//! 3. `instances.get`: the instance exists and is RUNNING (`instance`), and its numeric id is the
//!    token's (`instance-id`: a MIG recreates an instance under its name with a new id);
//! 4. its `created-by` names a zonal MIG of one of the cluster's instance groups (`mig`), of a
//!    `Node` group (`control-plane`, `group`);
//! 5. that MIG's `listManagedInstances` lists this instance, same id (`managed`): `created-by` is
//!    instance metadata, which the instance may rewrite;
//! 6. the instance group is the one the MIG's instance template (`instanceTemplates.get`) names in
//!    `kops-k8s-io-instance-group-name`, never the instance's own metadata (`template`);
//! 7. the node answers the call back on the instance's internal IP ([`super::challenge`]);
//! 8. the certificates are for node name = the instance's name, whatever the request asks.
//!
//! The decisions are pure functions of what the token and Compute said ([`check_place`],
//! [`check_instance`], [`cluster_mig`], [`check_listed`], [`template_group`]); [`GceAuthority`]
//! makes the calls around them.

use std::net::IpAddr;
use std::time::SystemTime;

use base::node_join::JoinResponse;
use base::node_join_gce::{self, IdentityError, InstanceIdentity};
use base::pki::Keypair;
use base::StateStore;
use cloud::gce::instances::{InstanceFacts, TemplateFacts};
use cloud::gce::migs::ManagedInstance;
use cloud::gce::ComputeReader;
use hyper::StatusCode;
use keelson_api::names;
use keelson_api::{InstanceGroup, Role};

use super::google_keys::{token_kid, GoogleKeys};
use super::node_names::NodeNames;
use super::{challenge, forbidden, parse_request, refuse, sign_node_certs, upstream, ChallengeAddr, Refusal};

pub use base::node_join_gce::MAX_AGE_SECS;

/// The template metadata key naming the instance group (kOps').
pub const GROUP_KEY: &str = "kops-k8s-io-instance-group-name";
/// The instance metadata key GCE sets to the MIG that made the instance.
pub const CREATED_BY_KEY: &str = "created-by";

/// What [`GceAuthority::new`] needs.
pub struct GceAuthorityConfig {
    pub cluster: String,
    pub ca: Keypair,
    /// The cluster's project (the server's own, from its metadata server).
    pub project: String,
    /// The cluster's region (the server's own).
    pub region: String,
    pub compute: ComputeReader,
    /// Where the instance groups are (`instancegroup/<name>`).
    pub store: StateStore,
    /// Google's key set ([`base::node_join_gce::GOOGLE_JWKS_URL`] in production).
    pub jwks_url: String,
    /// Node names a control plane's Node holds are refused ([`NodeNames::local`] in production).
    pub nodes: NodeNames,
    /// [`super::challenge_at_instance`] in production.
    pub challenge_addr: ChallengeAddr,
}

/// The GCE join authority.
pub struct GceAuthority {
    pub cluster: String,
    pub ca: Keypair,
    pub project: String,
    pub region: String,
    compute: ComputeReader,
    store: StateStore,
    keys: GoogleKeys,
    nodes: NodeNames,
    challenge_addr: ChallengeAddr,
    /// The oldest token accepted, in seconds.
    pub max_age: u64,
}

/// An admitted join: the answer and what it was decided on.
#[derive(Debug, Clone)]
pub struct Admitted {
    pub response: JoinResponse,
    /// The instance group, from the MIG's template.
    pub group: String,
    /// The MIG (zone, name).
    pub mig: (String, String),
}

/// The refusal of a token that does not verify, by what failed.
pub fn token_refusal(e: IdentityError) -> Refusal {
    let reason = match &e {
        IdentityError::Issuer(_) => "issuer",
        IdentityError::Audience { .. } => "audience",
        IdentityError::Time(_) => "freshness",
        IdentityError::Malformed(_) | IdentityError::Algorithm(_) | IdentityError::UnknownKey(_) | IdentityError::Signature | IdentityError::NotAnInstance => {
            "token"
        }
    };
    forbidden(reason, e.to_string())
}

/// The token's project must be the cluster's, and its zone in the cluster's region.
pub fn check_place(id: &InstanceIdentity, project: &str, region: &str) -> Result<(), Refusal> {
    if id.project_id != project {
        return Err(forbidden("project", format!("instance {} is in project {:?}, not this cluster's {project}", id.instance_name, id.project_id)));
    }
    if cloud::gce::disks::region_of(&id.zone) != region || id.zone.len() <= region.len() {
        return Err(forbidden("zone", format!("instance {} is in zone {:?}, not in this cluster's region {region}", id.instance_name, id.zone)));
    }
    Ok(())
}

/// What Compute says of the token's instance (`None`: no such instance): it runs, and it is the
/// very instance the token was issued to (same numeric id). Returns its internal IP.
pub fn check_instance(id: &InstanceIdentity, instance: Option<&InstanceFacts>) -> Result<IpAddr, Refusal> {
    let name = &id.instance_name;
    let i = instance.ok_or_else(|| forbidden("instance", format!("instance {name} does not exist in zone {}", id.zone)))?;
    if i.status != "RUNNING" {
        return Err(forbidden("instance", format!("instance {name} is {}, not RUNNING", i.status)));
    }
    if i.id != id.instance_id {
        return Err(forbidden(
            "instance-id",
            format!("instance {name} is now id {}, not the token's {} (recreated since the token was issued)", i.id, id.instance_id),
        ));
    }
    i.network_ip.as_deref().and_then(|ip| ip.parse().ok()).ok_or_else(|| forbidden("instance", format!("instance {name} has no internal IP to call back")))
}

pub use cloud::gce::migs::parse_created_by;

/// The instance group whose MIG made the instance, from its `created-by` metadata and the names of
/// the cluster's instance groups (the MIG names are [`names::gce_instance_group_manager_name`]):
/// (zone, MIG, group). Role checks come when the group is read ([`node_group`]).
pub fn cluster_mig<'g>(id: &InstanceIdentity, instance: &InstanceFacts, cluster: &str, groups: &'g [String]) -> Result<(String, String, &'g str), Refusal> {
    let name = &instance.name;
    let created_by =
        instance.metadata.get(CREATED_BY_KEY).ok_or_else(|| forbidden("mig", format!("instance {name} was not created by a managed instance group")))?;
    let (number, zone, mig) = parse_created_by(created_by)
        .ok_or_else(|| forbidden("mig", format!("instance {name}: created-by {created_by:?} is not a zonal managed instance group")))?;
    if (!id.project_number.is_empty() && number != id.project_number) || zone != id.zone {
        return Err(forbidden("mig", format!("instance {name}: created-by {created_by:?} is not of its own project and zone")));
    }
    let group = groups
        .iter()
        .find(|g| names::gce_instance_group_manager_name(zone, g, cluster) == mig)
        .ok_or_else(|| forbidden("mig", format!("instance {name} was created by {mig}, not by a managed instance group of cluster {cluster}")))?;
    Ok((zone.to_string(), mig.to_string(), group.as_str()))
}

/// The group must be a `Node` group: a control plane does not join this way.
pub fn node_group(ig: &InstanceGroup, mig: &str) -> Result<(), Refusal> {
    match ig.role() {
        Some(Role::Node) => Ok(()),
        Some(Role::ControlPlane) => {
            Err(forbidden("control-plane", format!("{mig} is a control-plane instance group's managed instance group; only workers join this way")))
        }
        other => Err(forbidden(
            "group",
            format!("{mig} is of instance group {} (role {other:?}), not a Node group", ig.metadata.name.as_deref().unwrap_or_default()),
        )),
    }
}

/// The MIG must list the instance, same id (not only claim it in its metadata). Returns the
/// template it was made from, when the list says.
/// Why [`listed_template`] found no template.
pub enum MigLookup {
    /// A Compute call failed (the call's name, its error).
    Compute(&'static str, cloud::gce::GoogleApiError),
    /// The managed instance group does not exist (the message says which, where).
    NoMig(String),
    /// The group does not vouch for the instance ([`check_listed`]).
    Refused(Refusal),
}

/// The instance template the managed instance group `mig` (in `zone`) made `instance` from: the
/// one its managed-instance listing names for it, or the group's own while it is still creating it
/// ([`check_listed`]). Shared by the join server and the node labeller: both trust a node's group
/// only as far as its MIG vouches for it.
pub async fn listed_template(compute: &ComputeReader, zone: &str, mig: &str, instance: &InstanceFacts) -> Result<String, MigLookup> {
    let no_mig = || MigLookup::NoMig(format!("managed instance group {mig} does not exist in zone {zone}"));
    let managed =
        compute.managed_instances(zone, mig).await.map_err(|e| MigLookup::Compute("instanceGroupManagers.listManagedInstances", e))?.ok_or_else(no_mig)?;
    match check_listed(&managed, instance, mig).map_err(MigLookup::Refused)? {
        Some(t) => Ok(t),
        None => compute.mig_template(zone, mig).await.map_err(|e| MigLookup::Compute("instanceGroupManagers.get", e))?.ok_or_else(no_mig),
    }
}

pub fn check_listed(managed: &[ManagedInstance], instance: &InstanceFacts, mig: &str) -> Result<Option<String>, Refusal> {
    let entry = managed
        .iter()
        .find(|m| m.name() == instance.name && (m.instance == instance.self_link || m.id == instance.id))
        .ok_or_else(|| forbidden("managed", format!("managed instance group {mig} does not list instance {}", instance.name)))?;
    if !entry.id.is_empty() && entry.id != instance.id {
        return Err(forbidden("managed", format!("managed instance group {mig} lists {} as id {}, not {}", instance.name, entry.id, instance.id)));
    }
    Ok(entry.template.clone())
}

/// The instance group the template names must be the MIG's group.
pub fn template_group(template: &TemplateFacts, group: &str) -> Result<(), Refusal> {
    match template.metadata.get(GROUP_KEY) {
        Some(g) if g == group => Ok(()),
        Some(g) => Err(forbidden("template", format!("instance template {} is of instance group {g:?}, not {group}", template.name))),
        None => Err(forbidden("template", format!("instance template {} names no instance group ({GROUP_KEY})", template.name))),
    }
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

impl GceAuthority {
    pub fn new(c: GceAuthorityConfig) -> Result<GceAuthority, super::StartError> {
        let keys = GoogleKeys::new(&c.jwks_url).map_err(|e| super::StartError::Http(e.to_string()))?;
        Ok(GceAuthority {
            cluster: c.cluster,
            ca: c.ca,
            project: c.project,
            region: c.region,
            compute: c.compute,
            store: c.store,
            keys,
            nodes: c.nodes,
            challenge_addr: c.challenge_addr,
            max_age: MAX_AGE_SECS,
        })
    }

    pub fn jwks_url(&self) -> &str {
        self.keys.url()
    }

    /// Decide one join: `authorization` is the request's `Authorization` header, `body` its bytes.
    pub async fn admit(&self, authorization: &str, body: &[u8]) -> Result<Admitted, Refusal> {
        let token = node_join_gce::parse_authorization(authorization)
            .ok_or_else(|| refuse(StatusCode::UNAUTHORIZED, "unauthenticated", format!("expected scheme {}", node_join_gce::AUTH_SCHEME)))?;
        let keys = self.keys.keys(token_kid(token).as_deref()).await.map_err(|e| upstream(e.to_string()))?;
        let id = node_join_gce::verify(token, &keys, body, unix_now(), self.max_age).map_err(token_refusal)?;
        let (request, kubelet_key) = parse_request(body)?;
        check_place(&id, &self.project, &self.region)?;

        let compute = |call: &str, e: cloud::gce::GoogleApiError| upstream(format!("compute {call}: {e}"));
        let instance = self.compute.instance(&id.zone, &id.instance_name).await.map_err(|e| compute("instances.get", e))?;
        let ip = check_instance(&id, instance.as_ref())?;
        let Some(instance) = instance else { return Err(forbidden("instance", format!("instance {} does not exist", id.instance_name))) };

        let groups = self.group_names().await?;
        let (zone, mig, group) = cluster_mig(&id, &instance, &self.cluster, &groups)?;
        let ig = self.read_group(group).await?;
        node_group(&ig, &mig)?;
        let template = listed_template(&self.compute, &zone, &mig, &instance).await.map_err(|e| match e {
            MigLookup::Compute(call, e) => compute(call, e),
            MigLookup::NoMig(message) => forbidden("managed", message),
            MigLookup::Refused(r) => r,
        })?;
        let template = self
            .compute
            .template(&template)
            .await
            .map_err(|e| compute("instanceTemplates.get", e))?
            .ok_or_else(|| forbidden("template", format!("the instance template {template} of {mig} does not exist")))?;
        template_group(&template, group)?;

        // The node itself, on the instance's address, holds the key it asks a certificate for.
        challenge::call_back((self.challenge_addr)(ip), kubelet_key, &base::sha256_hex(body)).await.map_err(|e| forbidden("challenge", e.to_string()))?;

        let node_name = instance.name.clone();
        if request.node_name != node_name {
            tracing::info!(asked = %request.node_name, node = %node_name, "node join: certificates are for the instance's name, not the name asked");
        }
        self.nodes.check(&node_name).await?;
        let certs = sign_node_certs(&self.ca, &request, &node_name)?;
        tracing::info!(instance = %node_name, id = %instance.id, %zone, %mig, group, "node join admitted (GCE identity)");
        Ok(Admitted { response: JoinResponse { node_name, certs }, group: group.to_string(), mig: (zone, mig) })
    }

    /// The names of the cluster's instance groups (`instancegroup/<name>` in the state store).
    async fn group_names(&self) -> Result<Vec<String>, Refusal> {
        let keys = self.store.list("instancegroup/").await.map_err(|e| upstream(e.to_string()))?;
        Ok(keys.iter().filter_map(|k| k.strip_prefix("instancegroup/")).filter(|n| !n.is_empty() && !n.contains('/')).map(str::to_string).collect())
    }

    async fn read_group(&self, group: &str) -> Result<InstanceGroup, Refusal> {
        let rel = format!("instancegroup/{group}");
        let bytes = self
            .store
            .get(&rel)
            .await
            .map_err(|e| upstream(e.to_string()))?
            .ok_or_else(|| forbidden("group", format!("instance group {group} is not in this cluster's state store")))?;
        serde_yaml_ng::from_slice(&bytes).map_err(|e| upstream(format!("{}: {e}", self.store.url(&rel))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    const CLUSTER: &str = "gce.k8s.example.com";

    fn id() -> InstanceIdentity {
        InstanceIdentity {
            project_id: "acme-prod".into(),
            project_number: "123456789012".into(),
            zone: "europe-west1-b".into(),
            instance_id: "42".into(),
            instance_name: "nodes-x7k2".into(),
            issued_at: 0,
        }
    }

    fn instance(created_by: &str) -> InstanceFacts {
        InstanceFacts {
            name: "nodes-x7k2".into(),
            id: "42".into(),
            zone: "europe-west1-b".into(),
            status: "RUNNING".into(),
            network_ip: Some("10.0.16.7".into()),
            self_link: "http://x/compute/v1/projects/acme-prod/zones/europe-west1-b/instances/nodes-x7k2".into(),
            metadata: BTreeMap::from([(CREATED_BY_KEY.to_string(), created_by.to_string())]),
        }
    }

    #[test]
    fn the_place_is_the_clusters_project_and_region() {
        check_place(&id(), "acme-prod", "europe-west1").expect("same project and region");
        assert_eq!(check_place(&id(), "other", "europe-west1").map_err(|r| r.reason), Err("project"));
        assert_eq!(check_place(&id(), "acme-prod", "europe-west4").map_err(|r| r.reason), Err("zone"));
        assert_eq!(check_place(&InstanceIdentity { zone: "europe-west1".into(), ..id() }, "acme-prod", "europe-west1").map_err(|r| r.reason), Err("zone"));
    }

    #[test]
    fn only_the_running_instance_of_the_tokens_id_passes() {
        let i = instance("");
        assert_eq!(check_instance(&id(), Some(&i)).expect("running"), "10.0.16.7".parse::<IpAddr>().expect("ip"));
        assert_eq!(check_instance(&id(), None).map_err(|r| r.reason), Err("instance"));
        assert_eq!(check_instance(&id(), Some(&InstanceFacts { status: "TERMINATED".into(), ..i.clone() })).map_err(|r| r.reason), Err("instance"));
        assert_eq!(check_instance(&id(), Some(&InstanceFacts { id: "43".into(), ..i })).map_err(|r| r.reason), Err("instance-id"));
    }

    #[test]
    fn created_by_must_name_a_mig_of_this_clusters_groups_in_the_instances_zone() {
        let groups = vec!["control-plane-b".to_string(), "nodes".to_string()];
        let mig = names::gce_instance_group_manager_name("europe-west1-b", "nodes", CLUSTER);
        let ok = instance(&format!("projects/123456789012/zones/europe-west1-b/instanceGroupManagers/{mig}"));
        assert_eq!(cluster_mig(&id(), &ok, CLUSTER, &groups).expect("a cluster MIG"), ("europe-west1-b".into(), mig.clone(), "nodes"));
        let refused = |created_by: &str| cluster_mig(&id(), &instance(created_by), CLUSTER, &groups).map(|_| ()).map_err(|r| r.reason);
        let other = names::gce_instance_group_manager_name("europe-west1-b", "nodes", "other.example.com");
        assert_eq!(refused(&format!("projects/123456789012/zones/europe-west1-b/instanceGroupManagers/{other}")), Err("mig"), "another cluster's");
        assert_eq!(refused(&format!("projects/123456789012/zones/europe-west1-c/instanceGroupManagers/{mig}")), Err("mig"), "another zone");
        assert_eq!(refused(&format!("projects/999/zones/europe-west1-b/instanceGroupManagers/{mig}")), Err("mig"), "another project");
        assert_eq!(refused(&format!("projects/123456789012/regions/europe-west1/instanceGroupManagers/{mig}")), Err("mig"), "regional");
        let mut bare = instance("");
        bare.metadata.clear();
        assert_eq!(cluster_mig(&id(), &bare, CLUSTER, &groups).map(|_| ()).map_err(|r| r.reason), Err("mig"));
    }

    #[test]
    fn the_mig_must_list_the_instance_and_the_template_must_name_the_group() {
        let i = instance("");
        let listed = ManagedInstance { instance: i.self_link.clone(), id: "42".into(), status: "RUNNING".into(), template: Some("t".into()) };
        assert_eq!(check_listed(std::slice::from_ref(&listed), &i, "m").expect("listed"), Some("t".to_string()));
        assert_eq!(check_listed(&[], &i, "m").map_err(|r| r.reason), Err("managed"));
        let old = ManagedInstance { id: "41".into(), ..listed };
        assert_eq!(check_listed(&[old], &i, "m").map_err(|r| r.reason), Err("managed"));
        let t = |g: &str| TemplateFacts { name: "t".into(), metadata: BTreeMap::from([(GROUP_KEY.to_string(), g.to_string())]) };
        template_group(&t("nodes"), "nodes").expect("the template's group");
        assert_eq!(template_group(&t("control-plane-b"), "nodes").map_err(|r| r.reason), Err("template"));
        assert_eq!(template_group(&TemplateFacts { name: "t".into(), metadata: BTreeMap::new() }, "nodes").map_err(|r| r.reason), Err("template"));
    }

    #[test]
    fn token_failures_have_their_own_reasons() {
        assert_eq!(token_refusal(IdentityError::Audience { got: "a".into(), want: "b".into() }).reason, "audience");
        assert_eq!(token_refusal(IdentityError::Time("old".into())).reason, "freshness");
        assert_eq!(token_refusal(IdentityError::Signature).reason, "token");
        assert_eq!(token_refusal(IdentityError::Issuer("x".into())).reason, "issuer");
    }
}
