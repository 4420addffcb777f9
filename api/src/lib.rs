//! Keelson's spec types: the kOps `kops.k8s.io/v1alpha2` `Cluster` and `InstanceGroup`
//! documents, the node-side `NodeupConfig` and `BootConfig`, validation, and (de)serialisation.
//!
//! This crate does no I/O: it turns bytes into typed documents and typed documents into bytes.

pub mod addon_roles;
pub mod addon_rules;
pub mod addons;
pub mod aws_endpoints;
pub mod config_base;
pub mod documents;
pub mod etcd_manager;
pub mod flag_table;
pub mod flags;
pub mod gce_endpoints;
pub mod generated;
pub mod host_packages;
pub mod host_paths;
pub mod image;
pub mod merge;
pub mod names;
pub mod nodeup;
pub mod plain_http;
pub mod plan;
pub mod ports;
pub mod protokube;
pub mod support;
pub mod types;
pub mod validate;
pub use validate::{aws_region_of_zone, validate, ValidationError};

pub use config_base::{ConfigBase, ConfigBaseError};
pub use documents::{parse_documents, Cluster, Documents, InstanceGroup, ObjectMeta, ParseError, Role, UnknownRole};
pub use generated::*;
pub use image::{ImageReference, ImageReferenceError};
pub use merge::Merge;
pub use types::{Cidr, CloudProvider, DnsName, Duration, IntOrString, KubernetesVersion, Quantity, UnknownCloudProvider};
