//! keelson-local: a whole Keelson cluster on one machine.
//!
//! Owns: the local cloud (moto, machines, volumes, DNS, mirror, registry, API load balancer) and the
//! end-to-end tests. Must not: change what the product does — everything harness-only is a spec field
//! it sets, an asset it serves, or a machine setting, each documented in the README.
//!
//! moto plays the cloud (EC2, Auto Scaling, Route53, S3); every running moto instance becomes a
//! real systemd machine (`systemd-nspawn --boot` of a cached Debian rootfs) in its own network
//! namespace with the instance's private IP, an IMDSv2 endpoint serving that instance's facts and
//! user-data, and the instance's attached EBS volumes as loop devices under their NVMe by-id names.
//! The user-data boots nodeup from a local mirror; nodeup installs containerd, runc, the CNI
//! plugins, the kubelet and protokube for real, and the kubelet runs the control plane (etcd,
//! kube-apiserver, controller-manager, scheduler, kube-proxy) from images in a local registry.
//! Kubernetes, containerd, etcd and the images are built from source (`kubernetes`). See
//! `README.md`, "Run a cluster on your machine".

pub mod apt;
pub mod arch;
pub mod autoscaler;
pub mod balancer;
pub mod cgroups;
pub mod cloud;
pub mod cluster;
pub mod cmd;
pub mod conformance;
pub mod cpu_model;
pub mod disk;
pub mod etcd;
pub mod gce;
pub mod kubeapi;
pub mod kubernetes;
pub mod machine;
pub mod mirror;
pub mod net;
pub mod paths;
pub mod relay;
pub mod rootfs;
pub mod spec;
pub mod volumes;
pub mod vpcdns;

// The fixtures every test shares (moto, IMDS, HTTP server) live in `keelson-testkit`.
pub use testkit::{httpd, imds, moto};
