//! How the local cloud's machines share the host's cores: the CPU model.
//!
//! On a cloud each instance has cores of its own: a replacement control plane boots on its own
//! vCPUs while its neighbours keep theirs. Here every machine is a cgroup on the same cores, so a
//! booting machine competes with the steady-state work of the rest of the cluster (measured: about
//! 1.5 of 2 cores) and gets about 0.6 of a core. The model says how the harness weighs them:
//!
//! - [`CpuModel::Shared`] (the default): plain sharing, every machine the same CPU weight (cgroup
//!   v1 `cpu.shares` 1024, v2 `cpu.weight` 100): a booting machine gets what the kernel's fair
//!   scheduler gives any one machine.
//! - [`CpuModel::BootPriority`]: a machine launched while the model is on weighs as much as all its
//!   running neighbours together ([`CpuModel::launch_shares`]) from before its `systemd-nspawn`
//!   starts until its Node is Ready (the end of a failover's critical path), at most
//!   [`BOOT_PRIORITY_LIMIT`]; then the default weight again. When every machine wants CPU it gets
//!   half the host (one of this machine's two cores, as an instance has cores of its own) and its
//!   neighbours share the other half — the survivors keep serving. A weight, not a reservation:
//!   idle cycles still go to whoever wants them. (It was a flat 16 × the others' until 2026-12-05:
//!   with five neighbours that left the surviving API servers a tenth of a core each, and in 2 of
//!   48 soak cycles they answered the outage probe too slowly for 3 and 5 s.)
//!
//! The model in force is the state directory's `cpu-model` file (`up --cpu-model`, or `selfheal
//! --cpu-model`, which may change it between cycles); the daemon reads it at each launch.

use std::fmt;
use std::path::Path;
use std::time::Duration;

/// The longest a machine keeps its boot priority (a machine whose Node never becomes Ready must
/// not keep it).
pub const BOOT_PRIORITY_LIMIT: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum CpuModel {
    /// Every machine the same CPU weight.
    #[default]
    Shared,
    /// A booting machine weighs as much as its running neighbours together until its Node is Ready.
    BootPriority,
}

impl CpuModel {
    pub fn name(self) -> &'static str {
        match self {
            CpuModel::Shared => "shared",
            CpuModel::BootPriority => "boot-priority",
        }
    }

    /// The model a `cpu-model` file's text names (absent or empty: [`CpuModel::Shared`]).
    pub fn parse(text: &str) -> Result<CpuModel, String> {
        match text.trim() {
            "" | "shared" => Ok(CpuModel::Shared),
            "boot-priority" => Ok(CpuModel::BootPriority),
            other => Err(format!("unknown CPU model {other:?} (expected \"shared\" or \"boot-priority\")")),
        }
    }

    /// The CPU weight (cgroup v1 `cpu.shares`) a machine launched under this model starts with,
    /// beside `neighbours` running machines of the default weight: under boot priority, theirs
    /// together (at least the default), so it gets half the host when all of them want CPU.
    pub fn launch_shares(self, neighbours: usize) -> u64 {
        match self {
            CpuModel::Shared => crate::cgroups::DEFAULT_CPU_SHARES,
            CpuModel::BootPriority => neighbours.max(1) as u64 * crate::cgroups::DEFAULT_CPU_SHARES,
        }
    }

    /// The model `path` names (a missing file: shared; an unreadable or unknown one: an error).
    pub fn read(path: &Path) -> Result<CpuModel, String> {
        match std::fs::read_to_string(path) {
            Ok(text) => CpuModel::parse(&text).map_err(|e| format!("{}: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(CpuModel::Shared),
            Err(e) => Err(format!("{}: {e}", path.display())),
        }
    }

    pub fn write(self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, format!("{}\n", self.name()))
    }
}

impl fmt::Display for CpuModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a boosted machine's priority ends now, or `None` while it keeps it: its Node is Ready, the
/// limit has passed, or its machine is gone.
pub fn priority_ends(node_ready: bool, age: Duration, machine_alive: bool) -> Option<&'static str> {
    if !machine_alive {
        Some("machine gone")
    } else if node_ready {
        Some("its Node is Ready")
    } else if age >= BOOT_PRIORITY_LIMIT {
        Some("limit reached, Node not Ready")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_names_the_model_and_nothing_else_is_accepted() {
        assert_eq!(CpuModel::parse(""), Ok(CpuModel::Shared));
        assert_eq!(CpuModel::parse("shared\n"), Ok(CpuModel::Shared));
        assert_eq!(CpuModel::parse("boot-priority\n"), Ok(CpuModel::BootPriority));
        assert!(CpuModel::parse("boot_priority").unwrap_err().contains("expected"));
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("cpu-model");
        assert_eq!(CpuModel::read(&f), Ok(CpuModel::Shared));
        CpuModel::BootPriority.write(&f).unwrap();
        assert_eq!(CpuModel::read(&f), Ok(CpuModel::BootPriority));
        std::fs::write(&f, "fast").unwrap();
        assert!(CpuModel::read(&f).unwrap_err().contains("cpu-model"));
    }

    #[test]
    fn a_booting_machine_weighs_as_much_as_its_neighbours_together() {
        assert_eq!(CpuModel::Shared.launch_shares(5), 1024);
        assert_eq!(CpuModel::BootPriority.launch_shares(5), 5 * 1024, "half the host beside five busy neighbours");
        assert_eq!(CpuModel::BootPriority.launch_shares(0), 1024, "the first machine: the default weight");
    }

    #[test]
    fn priority_ends_at_ready_at_the_limit_or_with_the_machine() {
        let s = Duration::from_secs;
        assert_eq!(priority_ends(false, s(10), true), None);
        assert_eq!(priority_ends(true, s(10), true), Some("its Node is Ready"));
        assert_eq!(priority_ends(false, BOOT_PRIORITY_LIMIT, true), Some("limit reached, Node not Ready"));
        assert_eq!(priority_ends(false, s(1), false), Some("machine gone"));
    }
}
