//! The container runtime: containerd (nodeup writes its configuration), and what Keelson does not
//! install (Docker, NVIDIA drivers, gVisor, NRI plugins, packages from custom URLs).

use super::{f, nr, nr_if, Field, Use, When};
use Use::By;

const CONFIG: &str = "nodeup: containerd's config.toml (nodeup/src/render/containerd.rs)";
const ASSETS: &str = "the compiler: the node's assets (spec-compiler/src/nodeup_config.rs)";
const VERSION: &str = "the compiler: the versions table (the containerd and runc assets)";
const PACKAGES: &str = "Keelson downloads containerd and runc from the versions table: a custom package URL and hash are not used yet; remove it";

/// `ContainerdConfig` (spec.containerd, an InstanceGroup's spec.containerd) and its parts.
pub static RUNTIME: &[Field] = &[
    f("ContainerdConfig", "address", By("nodeup: containerd's socket in config.toml and the kubelet's container runtime endpoint")),
    f(
        "ContainerdConfig",
        "configAdditions",
        By("nodeup: set over the rendered config.toml, kOps' way (nodeup/src/render/containerd.rs with_additions; keys checked by validate)"),
    ),
    f("ContainerdConfig", "configOverride", By(CONFIG)),
    f("ContainerdConfig", "logLevel", By(CONFIG)),
    nr("ContainerdConfig", "packages", PACKAGES),
    f("ContainerdConfig", "registryMirrors", By("nodeup: containerd's hosts.toml per registry (nodeup/src/render/containerd.rs)")),
    f("ContainerdConfig", "root", By(CONFIG)),
    f("ContainerdConfig", "skipInstall", By(ASSETS)),
    f("ContainerdConfig", "state", By(CONFIG)),
    f("ContainerdConfig", "version", By(VERSION)),
    nr_if(
        "ContainerdConfig",
        "nvidiaGPU",
        When::Enabled,
        "Keelson does not install the NVIDIA driver, container toolkit or device plugin yet (GPU nodes get kOps' label and taint only)",
    ),
    nr_if("ContainerdConfig", "gvisor", When::Enabled, "Keelson does not install gVisor (runsc) yet"),
    f("ContainerdConfig", "selinuxEnabled", By(CONFIG)),
    nr_if("ContainerdConfig", "nri", When::Enabled, "Keelson does not enable containerd's NRI yet"),
    nr_if("ContainerdConfig", "useECRCredentialsForMirrors", When::True, "Keelson does not configure ECR credentials for registry mirrors yet"),
    f("ContainerdConfig", "installCriCtl", By(ASSETS)),
    f("ContainerdConfig", "installNerdCtl", By(ASSETS)),
    f("ContainerdConfig", "sandboxImage", By(CONFIG)),
    f("Runc", "version", By(VERSION)),
    nr("Runc", "packages", PACKAGES),
    nr(
        "ClusterSpec",
        "docker",
        "Docker is not a container runtime of the Kubernetes versions Keelson supports (dockershim was removed in 1.24): Keelson runs containerd; remove it",
    ),
];
