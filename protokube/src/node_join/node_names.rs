//! A node name a control plane's Node holds is never given to a worker.
//!
//! The join server signs a kubelet certificate for `system:node:<name>`, `<name>` the instance's
//! private DNS name (AWS, derived from its IP) or its name (GCE). When a control plane is gone but
//! its Node object is not (the node lifecycle controller deletes it only once the cloud says the
//! instance is gone, and a stopped or hand-deleted one can linger), a new instance given the same
//! address or name would get a certificate for that Node: NodeRestriction then lets its kubelet
//! update it, and the Node carries the control-plane labels (`node-role.kubernetes.io/control-plane`,
//! which the cloud-controller-manager and its cloud credentials follow). So before signing, the join
//! server reads the Node of that name: absent, or a worker's, the join goes on; a control plane's is
//! refused (`stale-node`) until someone deletes the stale Node. When the API cannot be asked, the
//! join is refused as unavailable (the node retries), never admitted unchecked.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base::StateStore;
use k8s_openapi::api::core::v1::Node;

use super::{forbidden, upstream, Refusal};
use crate::addons::CONTROL_PLANE_LABEL;

/// kOps' older control-plane label, still on Nodes of clusters made before it was renamed.
pub const LEGACY_CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/master";
/// The client's certificate lives 24 h: a new one well before.
const RENEW_AFTER: Duration = Duration::from_secs(12 * 3600);

/// Whether `node` is a control plane's, by its role labels.
pub fn is_control_plane(node: &Node) -> bool {
    node.metadata.labels.as_ref().is_some_and(|l| l.contains_key(CONTROL_PLANE_LABEL) || l.contains_key(LEGACY_CONTROL_PLANE_LABEL))
}

enum Source {
    /// A client issued from the cluster CA as the node labeller's user (which may get Nodes),
    /// for the local API server.
    Issue { store: StateStore, server: String },
    /// A client given as it is.
    Given(kube::Client),
}

/// Reads the Node of a name before the join server gives the name away. Cheap to clone.
#[derive(Clone)]
pub struct NodeNames {
    source: Arc<Source>,
    client: Arc<tokio::sync::Mutex<Option<(kube::Client, Instant)>>>,
}

impl NodeNames {
    /// The local API server at `server`, as [`crate::node_labels::USER`] (get, list, watch, patch
    /// of Nodes only), with a certificate issued from the CA in `store` and renewed every 12 h.
    pub fn local(store: StateStore, server: String) -> NodeNames {
        NodeNames { source: Arc::new(Source::Issue { store, server }), client: Default::default() }
    }

    /// Through `client` (which must be allowed to get Nodes).
    pub fn with_client(client: kube::Client) -> NodeNames {
        NodeNames { source: Arc::new(Source::Given(client)), client: Default::default() }
    }

    async fn client(&self) -> Result<kube::Client, Refusal> {
        match self.source.as_ref() {
            Source::Given(c) => Ok(c.clone()),
            Source::Issue { store, server } => {
                let mut cached = self.client.lock().await;
                if let Some((c, _)) = cached.as_ref().filter(|(_, issued)| issued.elapsed() < RENEW_AFTER) {
                    return Ok(c.clone());
                }
                let c = crate::node_labels::client(store, server)
                    .await
                    .map_err(|e| upstream(format!("the Kubernetes API, to check the node name is no control plane's: {e}")))?;
                *cached = Some((c.clone(), Instant::now()));
                Ok(c)
            }
        }
    }

    /// `Ok` when no Node is named `node_name` or it is not a control plane's.
    pub async fn check(&self, node_name: &str) -> Result<(), Refusal> {
        let api: kube::Api<Node> = kube::Api::all(self.client().await?);
        match api.get_opt(node_name).await {
            Ok(None) => Ok(()),
            Ok(Some(node)) if is_control_plane(&node) => Err(forbidden(
                "stale-node",
                format!("Node {node_name} is a control plane's (a stale Node of an instance that had this name): delete it before a worker may take the name"),
            )),
            Ok(Some(_)) => Ok(()),
            Err(e) => {
                *self.client.lock().await = None;
                Err(upstream(format!("the Kubernetes API, reading Node {node_name}: {e}")))
            }
        }
    }
}
