//! Operations on a running cluster: `keelson rolling-update` ([`rolling`]: one algorithm over the
//! cloud-neutral groups of [`groups`], with one implementation per cloud — AWS's autoscaling groups
//! in [`instances`], GCE's managed instance groups in [`gce_instances`]) and `keelson validate
//! cluster` ([`validate`]); nodes are drained before their instances go ([`drain`]), several of a
//! group at once, each instance's replacement its own task ([`replace`]); groups may surge
//! ([`surge`]); `keelson reconcile cluster` applies and rolls in phases, control planes before
//! workers ([`reconcile`]); `keelson get instances` lists the groups' instances ([`listing`]).
//!
//! Owns: talking to the cluster's Kubernetes API (kube-rs) and driving the cloud's groups through
//! an operation. Must not: build cloud resources (that is `keelson-cloud-resources`), compile
//! specs, or parse command lines.

pub mod drain;
pub mod gce_instances;
pub mod groups;
pub mod instances;
pub mod listing;
pub mod reconcile;
pub mod replace;
pub mod rolling;
pub mod surge;
pub mod validate;
