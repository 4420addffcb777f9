//! protokube: claims and mounts this control-plane instance's etcd volumes, writes the etcd static-pod
//! manifests, keeps the control plane's DNS names pointing at live members, and applies the
//! cluster's bootstrap addons ([`addons`]) and
//! labels every Node with its instance group's labels ([`node_labels`]); in token mode it keeps
//! workers' bootstrap tokens rotating and approves their first certificates ([`node_bootstrap`]).
//!
//! Owns: this instance's etcd volumes (claim, attach, format only when blank, mount), the etcd
//! manifests and the control plane's DNS records. Must not: format a volume that holds a file system,
//! mount one attached elsewhere, or touch another instance's volume or records.
//!
//! The pass is level-triggered ([`reconcile::Agent::reconcile`]); [`run`] loops it with backoff and
//! serves Prometheus metrics and health on a local port; stopped, it hands etcd leadership over
//! first ([`handover`]).

pub mod addons;
pub mod api_target;
pub mod apiserver_turn;
pub mod backup;
pub mod certs;
pub mod config;
pub mod disk;
pub mod etcd;
pub mod gce;
pub mod handover;
pub mod images;
pub mod leadership;
pub use base::hosts;
pub mod manifest;
pub mod metrics;
pub mod node_bootstrap;
pub mod node_join;
pub mod node_labels;
pub mod paths;
pub mod pki;
pub mod poweroff;
pub mod reconcile;
pub mod restore;
pub mod upgrade;
