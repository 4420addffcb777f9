//! What the harness needs from a kOps-format spec, and the local-cloud edits it makes to it
//! (asset mirror as `assets.fileRepository`, moto's AMI as every group's image).

use std::path::Path;

use serde_yaml_ng::Value;

#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
}

/// Where the local cloud serves what a spec names: the asset mirror, the image registry, the AMI,
/// the AWS cloud-controller-manager and CoreDNS images, the AWS endpoint (the relay to moto), and the
/// name server CoreDNS forwards names outside the cluster to.
#[derive(Debug, Clone)]
pub struct LocalCloud {
    pub file_repository: String,
    pub registry: String,
    /// The AMI of each Debian release machines boot ([`crate::rootfs::Suite::of_image`] of the
    /// group's own image picks one); empty: the groups keep their images (the local GCE).
    pub images: std::collections::BTreeMap<crate::rootfs::Suite, String>,
    pub ccm_image: String,
    pub coredns_image: String,
    pub aws_endpoint: String,
    /// The local Compute API's base (`keelson.io/gce-api-endpoint` on GCE clusters).
    pub gce_endpoint: String,
    /// The machines' resolv.conf names no server, and CoreDNS refuses to start forwarding to a
    /// resolv.conf without one: the spec's `kubeDNS.upstreamNameservers` (unless it sets its own).
    pub dns_upstream: String,
}

/// The cloud a spec's cluster runs on, as the local cloud plays it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Provider {
    /// moto plays EC2, Auto Scaling, ELBv2, Route53 and S3.
    Aws,
    /// testkit's Compute and Cloud DNS emulators and fake-gcs-server play GCE (`spec.project`).
    Gce { project: String },
}

#[derive(Debug, Clone)]
pub struct Spec {
    pub path: String,
    pub provider: Provider,
    pub docs: Vec<Value>,
    pub name: String,
    pub region: String,
    pub network_cidr: String,
    pub config_base: String,
    /// `spec.serviceAccountIssuerDiscovery.discoveryStore` (IRSA's issuer documents), if any.
    pub discovery_store: Option<String>,
    pub dns_zone: Option<String>,
    /// `topology.dns.type: None` or a `.k8s.local` name: no Route53.
    pub gossip: bool,
    pub etcd_clusters: Vec<String>,
    pub subnet_cidrs: Vec<String>,
}

fn s<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    let mut cur = v;
    for p in path {
        cur = cur.get(*p)?;
    }
    cur.as_str()
}

impl Spec {
    pub fn load(path: &Path) -> Result<Spec, SpecError> {
        let p = path.display().to_string();
        let bad = |m: String| SpecError::Invalid { path: p.clone(), message: m };
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let mut docs = Vec::new();
        for d in serde_yaml_ng::Deserializer::from_str(&text) {
            let v = <Value as serde::Deserialize>::deserialize(d).map_err(|e| bad(e.to_string()))?;
            if !v.is_null() {
                docs.push(v);
            }
        }
        let cluster = docs.iter().find(|d| s(d, &["kind"]) == Some("Cluster")).ok_or_else(|| bad("no Cluster document".into()))?;
        let name = s(cluster, &["metadata", "name"]).ok_or_else(|| bad("Cluster metadata.name missing".into()))?.to_string();
        let spec = cluster.get("spec").ok_or_else(|| bad("Cluster spec missing".into()))?;
        let subnets = spec.get("subnets").and_then(|x| x.as_sequence()).cloned().unwrap_or_default();
        let (provider, region) = if s(spec, &["cloudProvider"]) == Some("gce") {
            let project = s(spec, &["project"]).ok_or_else(|| bad("spec.project missing (a GCE cluster names its project)".into()))?.to_string();
            let region = subnets
                .iter()
                .find_map(|sn| s(sn, &["region"]))
                .ok_or_else(|| bad("spec.subnets[].region missing (GCE subnets are regional)".into()))?
                .to_string();
            (Provider::Gce { project }, region)
        } else {
            let zone = subnets.iter().find_map(|sn| s(sn, &["zone"])).ok_or_else(|| bad("spec.subnets[].zone missing".into()))?;
            (Provider::Aws, keelson_api::aws_region_of_zone(zone).ok_or_else(|| bad(format!("spec.subnets[].zone {zone:?}: not an AWS zone")))?.to_string())
        };
        let network_cidr = s(spec, &["networkCIDR"]).unwrap_or("172.20.0.0/16").to_string();
        let config_base = s(spec, &["configBase"]).ok_or_else(|| bad("spec.configBase missing".into()))?.to_string();
        let discovery_store = s(spec, &["serviceAccountIssuerDiscovery", "discoveryStore"]).map(str::to_string);
        let gossip = keelson_api::nodeup::uses_hosts_dns(&name, s(spec, &["topology", "dns", "type"]));
        let etcd_clusters = spec
            .get("etcdClusters")
            .and_then(|x| x.as_sequence())
            .map(|v| v.iter().filter_map(|e| s(e, &["name"]).map(str::to_string)).collect())
            .unwrap_or_default();
        let subnet_cidrs = subnets.iter().filter_map(|sn| s(sn, &["cidr"]).map(str::to_string)).collect();
        Ok(Spec {
            path: p,
            provider,
            dns_zone: s(spec, &["dnsZone"]).map(str::to_string),
            docs,
            name,
            region,
            network_cidr,
            config_base,
            discovery_store,
            gossip,
            etcd_clusters,
            subnet_cidrs,
        })
    }

    /// The Route53 zone the harness creates (as the account's existing zone): `spec.dnsZone`, or
    /// the cluster name's parent domain.
    pub fn zone_name(&self) -> Option<String> {
        if self.gossip {
            return None;
        }
        if let Some(z) = &self.dns_zone {
            return Some(z.clone());
        }
        self.name.split_once('.').map(|(_, parent)| parent.to_string())
    }

    /// `s3://bucket/prefix` or `gs://bucket/prefix` → bucket.
    pub fn bucket(&self) -> Option<String> {
        bucket_of(&self.config_base)
    }

    /// The buckets the account holds before the cluster is applied: the state store's and the
    /// service-account issuer's discovery store's (the operator makes both, as for kOps), each once.
    pub fn buckets(&self) -> Vec<String> {
        let mut out: Vec<String> = self.bucket().into_iter().chain(self.discovery_store.as_deref().and_then(bucket_of)).collect();
        out.dedup();
        out
    }

    /// The zones of the instance groups (`spec.zones`), in order, each once.
    pub fn group_zones(&self) -> Vec<String> {
        let mut zones: Vec<String> = Vec::new();
        for d in self.docs.iter().filter(|d| s(d, &["kind"]) == Some("InstanceGroup")) {
            for z in d.get("spec").and_then(|x| x.get("zones")).and_then(|x| x.as_sequence()).into_iter().flatten().filter_map(|z| z.as_str()) {
                if !zones.iter().any(|have| have == z) {
                    zones.push(z.to_string());
                }
            }
        }
        zones
    }

    /// The Debian releases the instance groups' images ask for ([`crate::rootfs::Suite::of_image`]).
    pub fn suites(&self) -> std::collections::BTreeSet<crate::rootfs::Suite> {
        self.docs
            .iter()
            .filter(|d| s(d, &["kind"]) == Some("InstanceGroup"))
            .map(|d| crate::rootfs::Suite::of_image(s(d, &["spec", "image"]).unwrap_or_default()))
            .collect()
    }

    /// `Master`/`ControlPlane` groups' names (the rest are workers, bastions aside).
    pub fn control_plane_groups(&self) -> Vec<String> {
        self.docs
            .iter()
            .filter(|d| s(d, &["kind"]) == Some("InstanceGroup"))
            .filter(|d| matches!(s(d, &["spec", "role"]), Some("Master") | Some("ControlPlane")))
            .filter_map(|d| s(d, &["metadata", "name"]).map(str::to_string))
            .collect()
    }

    /// The spec as the local cloud applies it: assets from the local mirror and registry (the
    /// air-gapped path of the product: `assets.fileRepository`, `assets.containerRegistry`, and a
    /// `containerd.registryMirrors` entry that tells containerd the registry speaks plain HTTP),
    /// and the local image for every instance group; the cloud-controller-manager built for the
    /// cluster's Kubernetes minor (`cloudControllerManager.image`), and its AWS endpoints pointed at
    /// the local cloud (the `keelson.io/aws-service-endpoints` annotation, the product's way to
    /// name VPC or partition endpoints); on AWS, kOps' metrics-server addon (`metricsServer`, unless
    /// the spec has its own) with the image built from its Go module.
    pub fn local_text(&self, local: &LocalCloud) -> String {
        let (file_repository, registry) = (local.file_repository.as_str(), local.registry.as_str());
        let mut out = String::new();
        for d in &self.docs {
            let mut d = d.clone();
            match s(&d, &["kind"]) {
                Some("Cluster") => {
                    let aws = self.provider == Provider::Aws;
                    if let Some(meta) = d.get_mut("metadata").and_then(|x| x.as_mapping_mut()).filter(|_| aws) {
                        let annotations = meta.entry(Value::from("annotations")).or_insert_with(|| Value::Mapping(Default::default()));
                        if let Some(a) = annotations.as_mapping_mut() {
                            let endpoints = keelson_api::aws_endpoints::SERVICES
                                .iter()
                                .map(|(service, _)| format!("{service}={}", local.aws_endpoint))
                                .collect::<Vec<_>>()
                                .join(",");
                            a.insert(Value::from(keelson_api::aws_endpoints::ANNOTATION), Value::from(endpoints));
                        }
                    }
                    if let Some(meta) = d.get_mut("metadata").and_then(|x| x.as_mapping_mut()).filter(|_| !aws) {
                        let annotations = meta.entry(Value::from("annotations")).or_insert_with(|| Value::Mapping(Default::default()));
                        if let Some(a) = annotations.as_mapping_mut() {
                            a.insert(Value::from(keelson_api::gce_endpoints::ANNOTATION), Value::from(local.gce_endpoint.as_str()));
                        }
                    }
                    if let Some(spec) = d.get_mut("spec").and_then(|x| x.as_mapping_mut()) {
                        {
                            let ccm = spec.entry(Value::from("cloudControllerManager")).or_insert_with(|| Value::Mapping(Default::default()));
                            if let Some(c) = ccm.as_mapping_mut() {
                                c.insert(Value::from("image"), Value::from(local.ccm_image.as_str()));
                            }
                        }
                        // kOps' metrics-server addon (insecure: the API server does not verify its
                        // self-signed certificate, as kOps' default), its image from the local registry;
                        // a spec that sets its own metricsServer keeps its switches.
                        if aws {
                            let ms = spec.entry(Value::from("metricsServer")).or_insert_with(|| {
                                let mut m = serde_yaml_ng::Mapping::new();
                                m.insert(Value::from("enabled"), Value::from(true));
                                m.insert(Value::from("insecure"), Value::from(true));
                                Value::Mapping(m)
                            });
                            if let Some(m) = ms.as_mapping_mut() {
                                m.insert(Value::from("image"), Value::from(crate::kubernetes::metrics_server_ref(registry)));
                            }
                        }
                        let dns = spec.entry(Value::from("kubeDNS")).or_insert_with(|| Value::Mapping(Default::default()));
                        if let Some(d) = dns.as_mapping_mut() {
                            d.insert(Value::from("coreDNSImage"), Value::from(local.coredns_image.as_str()));
                            d.entry(Value::from("upstreamNameservers")).or_insert_with(|| Value::Sequence(vec![Value::from(local.dns_upstream.as_str())]));
                        }
                        let assets = spec.entry(Value::from("assets")).or_insert_with(|| Value::Mapping(Default::default()));
                        if let Some(a) = assets.as_mapping_mut() {
                            a.insert(Value::from("fileRepository"), Value::from(file_repository));
                            a.insert(Value::from("containerRegistry"), Value::from(registry));
                        }
                        // A machine is not the host's network namespace: the global conntrack table
                        // size can only be set from the host, so kube-proxy must leave it alone
                        // (`conntrackMaxPerCore: 0`, as kind does).
                        let proxy = spec.entry(Value::from("kubeProxy")).or_insert_with(|| Value::Mapping(Default::default()));
                        if let Some(p) = proxy.as_mapping_mut() {
                            p.insert(Value::from("conntrackMaxPerCore"), Value::from(0));
                        }
                        // The EBS CSI driver and its six sidecar images are not built here (and moto
                        // attaches no devices of its own): the local cluster runs without the addon.
                        let cloud_config = spec.entry(Value::from("cloudConfig")).or_insert_with(|| Value::Mapping(Default::default()));
                        if let Some(c) = cloud_config.as_mapping_mut().filter(|_| aws) {
                            let ebs = c.entry(Value::from("awsEBSCSIDriver")).or_insert_with(|| Value::Mapping(Default::default()));
                            if let Some(e) = ebs.as_mapping_mut() {
                                e.insert(Value::from("managed"), Value::from(false));
                            }
                        }
                        // Every machine's root lives on the one host disk: absolute free space (crate::disk).
                        let kubelet = spec.entry(Value::from("kubelet")).or_insert_with(|| Value::Mapping(Default::default()));
                        if let Some(k) = kubelet.as_mapping_mut() {
                            k.insert(Value::from("evictionHard"), Value::from(crate::disk::eviction_hard()));
                            k.insert(Value::from("imageGCHighThresholdPercent"), Value::from(crate::disk::IMAGE_GC_HIGH_PERCENT));
                        }
                        let containerd = spec.entry(Value::from("containerd")).or_insert_with(|| Value::Mapping(Default::default()));
                        if let Some(c) = containerd.as_mapping_mut() {
                            let mirrors = c.entry(Value::from("registryMirrors")).or_insert_with(|| Value::Mapping(Default::default()));
                            if let Some(m) = mirrors.as_mapping_mut() {
                                m.insert(Value::from(registry), Value::Sequence(vec![Value::from(format!("http://{registry}"))]));
                            }
                        }
                    }
                }
                Some("InstanceGroup") => {
                    if let Some(spec) = d.get_mut("spec").and_then(|x| x.as_mapping_mut()) {
                        let suite = crate::rootfs::Suite::of_image(spec.get("image").and_then(|i| i.as_str()).unwrap_or_default());
                        if let Some(image) = local.images.get(&suite).or_else(|| local.images.get(&crate::rootfs::Suite::Bookworm)) {
                            spec.insert(Value::from("image"), Value::from(image.as_str()));
                        }
                    }
                }
                _ => {}
            }
            out.push_str("---\n");
            out.push_str(&serde_yaml_ng::to_string(&d).unwrap_or_default());
        }
        out
    }
}

/// `s3://bucket/prefix` or `gs://bucket/prefix` → bucket.
fn bucket_of(url: &str) -> Option<String> {
    let rest = url.strip_prefix("s3://").or_else(|| url.strip_prefix("gs://"))?;
    Some(rest.split('/').next().unwrap_or(rest).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ha_example() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/ha.yaml");
        let s = Spec::load(&p).unwrap();
        assert_eq!(s.name, "ha.k8s.example.com");
        assert_eq!(s.region, "eu-west-1");
        assert_eq!(s.network_cidr, "172.20.0.0/16");
        assert_eq!(s.bucket().as_deref(), Some("acme-keelson-state"));
        assert_eq!(s.zone_name().as_deref(), Some("k8s.example.com"));
        assert_eq!(s.etcd_clusters, ["main", "events"]);
        let t = s.local_text(&LocalCloud {
            file_repository: "http://172.20.255.254:8080/".into(),
            registry: "172.20.255.254:5000".into(),
            images: [(crate::rootfs::Suite::Bookworm, "ami-123".to_string())].into(),
            ccm_image: "172.20.255.254:5000/provider-aws-cloud-controller-manager:v1.34.4".into(),
            coredns_image: "172.20.255.254:5000/coredns-coredns:v1.14.2".into(),
            aws_endpoint: "http://172.20.255.254:4566".into(),
            gce_endpoint: String::new(),
            dns_upstream: "172.20.255.254".into(),
        });
        assert!(t.contains("keelson.io/aws-service-endpoints: autoscaling=http://172.20.255.254:4566,ec2=http://172.20.255.254:4566,elasticloadbalancing=http://172.20.255.254:4566,kms=http://172.20.255.254:4566,sts=http://172.20.255.254:4566"), "{t}");
        assert!(t.contains("image: 172.20.255.254:5000/provider-aws-cloud-controller-manager:v1.34.4"), "{t}");
        assert!(t.contains("coreDNSImage: 172.20.255.254:5000/coredns-coredns:v1.14.2"), "{t}");
        assert!(t.contains("upstreamNameservers:\n    - 172.20.255.254\n"), "{t}");
        assert!(t.contains("fileRepository: http://172.20.255.254:8080/"));
        assert!(t.contains("containerRegistry: 172.20.255.254:5000"));
        assert!(t.contains("conntrackMaxPerCore: 0"));
        assert!(t.contains(&crate::disk::eviction_hard()));
        assert!(t.contains("imageGCHighThresholdPercent: 100"), "{t}");
        assert!(t.contains("managed: false"), "{t}");
        assert!(
            t.contains("metricsServer:\n    enabled: true\n    insecure: true\n    image: 172.20.255.254:5000/metrics-server-metrics-server:v0.8.0\n"),
            "{t}"
        );
        assert!(t.contains("172.20.255.254:5000:\n      - http://172.20.255.254:5000"), "{t}");
        assert_eq!(t.matches("image: ami-123").count(), 4);
        // Cluster, 4 instance groups, 2 additional objects (passed through unchanged).
        assert_eq!(t.matches("---\n").count(), 7);
        assert!(t.contains("percentageOfNodesToScore: 50") && t.contains("name: cluster-owner"), "{t}");
    }

    #[test]
    fn gce_example_points_the_ccm_at_the_local_compute() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/gce.yaml");
        let s = Spec::load(&p).unwrap();
        let t = s.local_text(&LocalCloud {
            file_repository: "http://10.80.0.1:8080/".into(),
            registry: "10.80.0.1:5000".into(),
            images: Default::default(),
            ccm_image: "10.80.0.1:5000/gcp-cloud-controller-manager:v0.28.2".into(),
            coredns_image: "10.80.0.1:5000/coredns-coredns:v1.14.2".into(),
            aws_endpoint: String::new(),
            gce_endpoint: "http://10.80.0.1:4000".into(),
            dns_upstream: "10.80.0.1".into(),
        });
        assert!(t.contains("keelson.io/gce-api-endpoint: http://10.80.0.1:4000"), "{t}");
        assert!(!t.contains("aws-service-endpoints"), "{t}");
        assert!(t.contains("image: 10.80.0.1:5000/gcp-cloud-controller-manager:v0.28.2"), "{t}");
        assert!(!t.contains("awsEBSCSIDriver"), "{t}");
    }
}
