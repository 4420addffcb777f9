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
//! Everything it acts on comes from the compiler's plan for its group ([`config`]: the
//! `ProtokubeConfig` in the state store), never from the cluster spec.
//!
//! The binary only wires the controllers, each a module that owns its loop and metrics: etcd
//! volumes, manifests and DNS ([`reconcile::run`], a level-triggered pass with backoff), backups
//! ([`backup`]), certificates ([`certs::run`]), the API target group ([`api_target`]), addons
//! ([`addons`]), node labels ([`node_labels`]), bootstrap tokens ([`node_bootstrap`]), the join
//! server ([`node_join::start`]) and, when stopped, the hand-over and poweroff ([`shutdown`]).
//! Prometheus metrics and health are served on a local port ([`metrics`]).

pub mod addons;
pub mod api_target;
pub mod apiserver_turn;
pub mod args;
pub mod backup;
pub mod certs;
pub mod clients;
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
pub mod shutdown;
pub mod upgrade;
