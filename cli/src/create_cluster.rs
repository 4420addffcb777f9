//! `keelson create cluster`: kOps' `create cluster` flags → a spec file a team keeps in git
//! (`spec_compiler::new_cluster` makes the documents). kOps writes the new cluster to its state
//! store; Keelson's spec lives in the user's repository, so without `--dry-run` the spec is written
//! to `--spec-file` (default `<name>.yaml`), never over an existing file. `--dry-run -o yaml|json`
//! prints it instead, as kOps does. Either way the documents are first loaded and checked by the
//! same rules as `keelson validate`: what `create` writes, `validate` and `apply` accept.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context as _};
use spec_compiler::new_cluster::{new_cluster, to_yaml, NewClusterOptions};

use crate::table::Output;

#[derive(clap::Args)]
pub struct CreateClusterArgs {
    /// The cluster's name (DNS-style: mycluster.example.com); or `--name`.
    #[arg(value_name = "NAME")]
    pub cluster: Option<String>,
    /// The cluster's name.
    #[arg(long)]
    pub name: Option<String>,
    /// Zones in which to run the cluster (comma-separated or repeated).
    #[arg(long, value_delimiter = ',', required = true)]
    pub zones: Vec<String>,
    /// Zones in which to run control-plane nodes (default: --zones).
    #[arg(long = "control-plane-zones", value_delimiter = ',')]
    pub control_plane_zones: Vec<String>,
    /// The state store (s3://BUCKET[/PREFIX], gs://BUCKET, file://DIR): configBase is STATE/NAME.
    /// Default: $KOPS_STATE_STORE.
    #[arg(long, env = "KOPS_STATE_STORE")]
    pub state: Option<String>,
    /// Cloud provider: aws or gce (default: from the state store's scheme).
    #[arg(long)]
    pub cloud: Option<String>,
    /// GCE project.
    #[arg(long)]
    pub project: Option<String>,
    /// Service account the GCE VMs run as.
    #[arg(long = "gce-service-account")]
    pub gce_service_account: Option<String>,
    /// Kubernetes version (default: the release Keelson recommends).
    #[arg(long = "kubernetes-version")]
    pub kubernetes_version: Option<String>,
    /// Kubernetes feature gates: Name, -Name (disabled) or Name=true|false.
    #[arg(long = "kubernetes-feature-gates", value_delimiter = ',')]
    pub feature_gates: Vec<String>,
    /// Number of control-plane nodes (default: one per --control-plane-zones, else 1).
    #[arg(long = "control-plane-count")]
    pub control_plane_count: Option<u32>,
    /// Total number of worker nodes (default: one per zone).
    #[arg(long = "node-count")]
    pub node_count: Option<u32>,
    /// Machine type(s) for control-plane nodes (several: a mixed-instances policy on AWS).
    #[arg(long = "control-plane-size", value_delimiter = ',')]
    pub control_plane_size: Vec<String>,
    /// Machine type(s) for worker nodes.
    #[arg(long = "node-size", value_delimiter = ',')]
    pub node_size: Vec<String>,
    /// Machine image for all instances (default: the channel's image for the cloud and the
    /// machine type's architecture).
    #[arg(long)]
    pub image: Option<String>,
    /// Machine image for worker nodes (over --image).
    #[arg(long = "node-image")]
    pub node_image: Option<String>,
    /// Machine image for control-plane nodes (over --image).
    #[arg(long = "control-plane-image")]
    pub control_plane_image: Option<String>,
    /// Machine image for bastions (over --image).
    #[arg(long = "bastion-image")]
    pub bastion_image: Option<String>,
    /// Networking: cilium (default), calico, flannel, kubenet, gcp, kindnet, cni, … (kOps' names;
    /// what Keelson does not run is refused, naming the field).
    #[arg(long)]
    pub networking: Option<String>,
    /// Network topology: public or private.
    #[arg(short = 't', long)]
    pub topology: Option<String>,
    /// A bastion instance group (private topology only).
    #[arg(long)]
    pub bastion: bool,
    /// DNS type: public, private or none (default: public with --dns-zone, else none).
    #[arg(long)]
    pub dns: Option<String>,
    /// DNS hosted zone.
    #[arg(long = "dns-zone")]
    pub dns_zone: Option<String>,
    /// Type of the API's load balancer: public or internal.
    #[arg(long = "api-loadbalancer-type")]
    pub api_loadbalancer_type: Option<String>,
    /// ARN of the API load balancer's TLS certificate (AWS).
    #[arg(long = "api-ssl-certificate")]
    pub api_ssl_certificate: Option<String>,
    /// Domain name of the public Kubernetes API.
    #[arg(long = "api-public-name")]
    pub api_public_name: Option<String>,
    /// CIDRs allowed to reach the API (default 0.0.0.0/0 and ::/0).
    #[arg(long = "admin-access", value_delimiter = ',')]
    pub admin_access: Vec<String>,
    /// CIDRs allowed to reach SSH (default: --admin-access).
    #[arg(long = "ssh-access", value_delimiter = ',')]
    pub ssh_access: Vec<String>,
    /// Network CIDR(s): the first is the network's, more are additional CIDRs with a subnet each.
    #[arg(long = "network-cidr", value_delimiter = ',')]
    pub network_cidr: Vec<String>,
    /// Names of the etcd clusters (default main,events).
    #[arg(long = "etcd-clusters", value_delimiter = ',')]
    pub etcd_clusters: Vec<String>,
    /// Encrypt the etcd volumes (default: true on AWS).
    #[arg(long = "encrypt-etcd-storage", num_args = 0..=1, default_missing_value = "true")]
    pub encrypt_etcd_storage: Option<bool>,
    /// Volume type of the etcd members.
    #[arg(long = "etcd-storage-type")]
    pub etcd_storage_type: Option<String>,
    /// Tags for every cloud resource: "Owner=John Doe,Team=Some Team".
    #[arg(long = "cloud-labels")]
    pub cloud_labels: Option<String>,
    /// Give the instances public addresses (true|false).
    #[arg(long = "associate-public-ip", num_args = 0..=1, default_missing_value = "true")]
    pub associate_public_ip: Option<bool>,
    /// Root volume size (GB) of control-plane nodes.
    #[arg(long = "control-plane-volume-size")]
    pub control_plane_volume_size: Option<u32>,
    /// Root volume size (GB) of worker nodes.
    #[arg(long = "node-volume-size")]
    pub node_volume_size: Option<u32>,
    /// Root volume type of control-plane nodes.
    #[arg(long = "control-plane-volume-type")]
    pub control_plane_volume_type: Option<String>,
    /// Root volume type of worker nodes.
    #[arg(long = "node-volume-type")]
    pub node_volume_type: Option<String>,
    /// Authorization mode: RBAC or AlwaysAllow.
    #[arg(long)]
    pub authorization: Option<String>,
    /// Print the spec instead of writing it (needs -o).
    #[arg(long = "dry-run")]
    pub dry_run: bool,
    /// Output format of --dry-run: yaml or json.
    #[arg(short = 'o', long = "output", value_enum)]
    pub output: Option<Output>,
    /// Where to write the spec (default: NAME.yaml in the current directory); never overwritten.
    #[arg(long = "spec-file")]
    pub spec_file: Option<PathBuf>,
}

impl CreateClusterArgs {
    fn options(&self) -> anyhow::Result<NewClusterOptions> {
        let name = match (&self.cluster, &self.name) {
            (Some(a), Some(b)) if a != b => bail!("the cluster is named twice: {a:?} and --name {b:?}"),
            (Some(n), _) | (None, Some(n)) => n.clone(),
            (None, None) => bail!("--name is required (or give the name as the argument)"),
        };
        Ok(NewClusterOptions {
            name,
            zones: self.zones.clone(),
            control_plane_zones: self.control_plane_zones.clone(),
            state: self.state.clone().filter(|s| !s.is_empty()),
            cloud: self.cloud.clone(),
            project: self.project.clone(),
            gce_service_account: self.gce_service_account.clone(),
            kubernetes_version: self.kubernetes_version.clone(),
            control_plane_count: self.control_plane_count,
            node_count: self.node_count,
            control_plane_sizes: self.control_plane_size.clone(),
            node_sizes: self.node_size.clone(),
            image: self.image.clone(),
            node_image: self.node_image.clone(),
            control_plane_image: self.control_plane_image.clone(),
            bastion_image: self.bastion_image.clone(),
            networking: self.networking.clone(),
            topology: self.topology.clone(),
            bastion: self.bastion,
            dns: self.dns.clone(),
            dns_zone: self.dns_zone.clone(),
            api_load_balancer_type: self.api_loadbalancer_type.clone(),
            api_ssl_certificate: self.api_ssl_certificate.clone(),
            api_public_name: self.api_public_name.clone(),
            admin_access: self.admin_access.clone(),
            ssh_access: self.ssh_access.clone(),
            network_cidrs: self.network_cidr.clone(),
            etcd_clusters: self.etcd_clusters.clone(),
            encrypt_etcd_storage: self.encrypt_etcd_storage,
            etcd_storage_type: self.etcd_storage_type.clone(),
            cloud_labels: self.cloud_labels.clone(),
            associate_public_ip: self.associate_public_ip,
            control_plane_volume_size: self.control_plane_volume_size,
            node_volume_size: self.node_volume_size,
            control_plane_volume_type: self.control_plane_volume_type.clone(),
            node_volume_type: self.node_volume_type.clone(),
            authorization: self.authorization.clone(),
            feature_gates: self.feature_gates.clone(),
        })
    }
}

pub fn run(args: CreateClusterArgs) -> anyhow::Result<ExitCode> {
    if args.dry_run && args.output.is_none() {
        bail!("--dry-run needs -o yaml or -o json (kOps' rule)");
    }
    if args.output == Some(Output::Table) {
        bail!("-o table: a spec is printed as yaml or json");
    }
    if args.output.is_some() && !args.dry_run {
        bail!("-o is the format of --dry-run; without --dry-run the spec is written as YAML to --spec-file");
    }
    let options = args.options()?;
    let docs = new_cluster(&options)?;
    let yaml = to_yaml(&docs);

    // What `validate` would say, before anything is printed or written.
    let shown = args.spec_file.clone().unwrap_or_else(|| PathBuf::from(format!("{}.yaml", options.name)));
    let loaded = match spec_compiler::load::load_bytes(&shown, yaml.as_bytes()) {
        Ok(d) => d,
        Err(e) => bail!("the spec these flags make does not load:\n{}", e.lines().join("\n")),
    };
    let refused = keelson_api::support::not_rendered(&loaded);
    if !refused.is_empty() {
        let lines: Vec<String> = refused.iter().map(ToString::to_string).collect();
        bail!("Keelson would refuse the spec these flags make (README, \"What Keelson refuses\"):\n{}", lines.join("\n"));
    }

    if args.dry_run {
        let text = match args.output {
            Some(Output::Json) => {
                serde_json::to_string_pretty(&if docs.len() == 1 { docs[0].clone() } else { serde_json::json!({"kind": "List", "items": docs}) })? + "\n"
            }
            _ => yaml,
        };
        std::io::stdout().write_all(text.as_bytes())?;
        return Ok(ExitCode::SUCCESS);
    }
    write_new(&shown, &yaml)?;
    eprintln!(
        "wrote {} ({} instance groups). Keep it in git; then `keelson apply -f {0}` plans the cloud resources and `--yes` creates them.",
        shown.display(),
        docs.len() - 1
    );
    Ok(ExitCode::SUCCESS)
}

/// Write `text` to a new file at `path` (never over an existing one).
fn write_new(path: &Path, text: &str) -> anyhow::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("{}: cannot create it (an existing spec is never overwritten; give --spec-file)", path.display()))?;
    f.write_all(text.as_bytes()).with_context(|| format!("writing {}", path.display()))
}
