//! Machines of another architecture than the host's: an arm64 worker (a Graviton instance type) on
//! an amd64 host. Its root filesystem is Debian's arm64 build and every program in it runs through
//! qemu-user (Debian's `qemu-user-static`), registered with the kernel's `binfmt_misc` with the `F`
//! flag, so the interpreter is opened once at registration and works inside the machines' mount
//! namespaces too. Which architecture an instance runs is the compiler's rule
//! ([`spec_compiler::new_cluster::machine_arch`], from its instance type), as a cloud
//! decides it from the instance type; keelson-local does not keep a second one.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

pub use spec_compiler::versions::Arch;

use crate::cmd;

/// Where the kernel's binfmt_misc interface lives.
pub const BINFMT_DIR: &str = "/proc/sys/fs/binfmt_misc";

#[derive(Debug, thiserror::Error)]
pub enum ArchError {
    #[error("running {arch} machines on this {host} host needs qemu-user's {interpreter} (apt-get install qemu-user-static)")]
    NoInterpreter { arch: Arch, host: Arch, interpreter: PathBuf },
    #[error("{arch} machines on this {host} host: keelson-local can emulate only arm64 on amd64")]
    Unsupported { arch: Arch, host: Arch },
    #[error("binfmt_misc ({path}): {detail}")]
    Binfmt { path: PathBuf, detail: String },
}

/// The architecture this process runs on.
pub fn host() -> Arch {
    match std::env::consts::ARCH {
        "aarch64" => Arch::Arm64,
        _ => Arch::Amd64,
    }
}

/// The architecture an instance of `instance_type` runs on `cloud` (`aws`, `gce`).
pub fn of_instance(cloud: &str, instance_type: &str) -> Arch {
    spec_compiler::new_cluster::machine_arch(cloud, instance_type)
}

/// A binfmt_misc entry: ELF executables of one machine type handed to a qemu-user interpreter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BinfmtEntry {
    /// The entry's name under [`BINFMT_DIR`] (Debian's `qemu-user-static` uses the same).
    pub name: &'static str,
    /// The ELF header bytes to match (the first 20: class, data, version, type, machine).
    pub magic: [u8; 20],
    pub mask: [u8; 20],
    pub interpreter: &'static str,
}

/// The entry for running `arch` programs on `host` (none when they run natively).
pub fn binfmt_entry(arch: Arch, host: Arch) -> Result<Option<BinfmtEntry>, ArchError> {
    match (arch, host) {
        (a, h) if a == h => Ok(None),
        // ELF64, little-endian, version 1, executable or shared object (the mask clears the low
        // bit of e_type), e_machine 0xb7 (EM_AARCH64): the values of Debian's qemu-aarch64 entry.
        (Arch::Arm64, Arch::Amd64) => Ok(Some(BinfmtEntry {
            name: "qemu-aarch64",
            magic: [0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0xb7, 0],
            mask: [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe, 0xff, 0xff, 0xff],
            interpreter: "/usr/bin/qemu-aarch64-static",
        })),
        (arch, host) => Err(ArchError::Unsupported { arch, host }),
    }
}

/// The line written to `register`: `:name:M::magic:mask:interpreter:flags`, bytes as `\xHH`.
/// Flags: `O` (hand the open file over), `C` (credentials of the file), `F` (open the interpreter
/// now, so machines whose root holds no qemu can still run it).
pub fn registration(e: &BinfmtEntry) -> String {
    let hex = |b: &[u8]| b.iter().map(|x| format!("\\x{x:02x}")).collect::<String>();
    format!(":{}:M::{}:{}:{}:OCF", e.name, hex(&e.magic), hex(&e.mask), e.interpreter)
}

/// Whether an entry's status file (`enabled`, `interpreter …`, `flags: OCF`, …) says it runs
/// `interpreter` with the flags a machine needs.
pub fn entry_is_usable(status: &str, interpreter: &str) -> bool {
    let mut lines = status.lines().map(str::trim);
    lines.clone().any(|l| l == "enabled")
        && lines.clone().any(|l| l.strip_prefix("interpreter ").is_some_and(|i| i.trim() == interpreter))
        && lines.any(|l| l.strip_prefix("flags:").is_some_and(|f| f.contains('F')))
}

/// Make `arch` programs runnable on this host: nothing for the host's own; otherwise mount
/// binfmt_misc if needed and register (or re-register) qemu-user's entry with the `F` flag.
pub fn ensure_emulation(arch: Arch) -> Result<(), ArchError> {
    let host = host();
    let Some(entry) = binfmt_entry(arch, host)? else { return Ok(()) };
    if !Path::new(entry.interpreter).is_file() {
        return Err(ArchError::NoInterpreter { arch, host, interpreter: entry.interpreter.into() });
    }
    let dir = Path::new(BINFMT_DIR);
    let binfmt = |detail: String| ArchError::Binfmt { path: dir.to_path_buf(), detail };
    if !dir.join("register").exists() {
        cmd::run(Command::new("mount").args(["-t", "binfmt_misc", "binfmt_misc", BINFMT_DIR]))
            .map_err(|e| binfmt(format!("not mounted, and mounting it failed: {e}")))?;
    }
    let path = dir.join(entry.name);
    if let Ok(status) = fs::read_to_string(&path) {
        if entry_is_usable(&status, entry.interpreter) {
            return Ok(());
        }
        // Registered without `F` (or disabled, or another interpreter): replace it.
        fs::write(&path, "-1").map_err(|e| binfmt(format!("removing the entry {} ({status:?}): {e}", entry.name)))?;
    }
    fs::write(dir.join("register"), registration(&entry)).map_err(|e| binfmt(format!("registering {}: {e}", entry.name)))?;
    let status = fs::read_to_string(&path).map_err(|e| binfmt(format!("{}: {e}", path.display())))?;
    if !entry_is_usable(&status, entry.interpreter) {
        return Err(binfmt(format!("{} registered but not usable: {status:?}", entry.name)));
    }
    eprintln!("keelson-local: {arch} programs run through {} (binfmt_misc entry {}, flags OCF)", entry.interpreter, entry.name);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graviton_instances_are_arm64_by_the_compilers_rule() {
        assert_eq!(of_instance("aws", "m7g.large"), Arch::Arm64);
        assert_eq!(of_instance("aws", "t4g.medium"), Arch::Arm64);
        assert_eq!(of_instance("aws", "m6i.large"), Arch::Amd64);
    }

    #[test]
    fn the_host_needs_no_entry_for_itself() {
        assert_eq!(binfmt_entry(host(), host()).unwrap(), None);
        assert!(matches!(binfmt_entry(Arch::Amd64, Arch::Arm64), Err(ArchError::Unsupported { .. })));
    }

    #[test]
    fn the_registration_line_is_debians_qemu_aarch64_entry_with_the_f_flag() {
        let e = binfmt_entry(Arch::Arm64, Arch::Amd64).unwrap().unwrap();
        // What Debian's qemu-user-static registers (update-binfmts --display qemu-aarch64), as
        // the kernel's register file takes it.
        assert_eq!(
            registration(&e),
            r":qemu-aarch64:M::\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00:\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff:/usr/bin/qemu-aarch64-static:OCF"
        );
    }

    #[test]
    fn an_entry_without_the_f_flag_or_disabled_is_not_usable() {
        let good = "enabled\ninterpreter /usr/bin/qemu-aarch64-static\nflags: OCF\noffset 0\nmagic 7f454c46\n";
        assert!(entry_is_usable(good, "/usr/bin/qemu-aarch64-static"));
        assert!(!entry_is_usable(&good.replace("OCF", "OC"), "/usr/bin/qemu-aarch64-static"));
        assert!(!entry_is_usable(&good.replace("enabled", "disabled"), "/usr/bin/qemu-aarch64-static"));
        assert!(!entry_is_usable(good, "/usr/bin/qemu-aarch64"));
    }
}
