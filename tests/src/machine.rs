//! A machine: one moto instance as a `systemd-nspawn --boot` container with its own network
//! namespace (the instance's private IP on the bridge) and its own IMDS server in that namespace.
//!
//! The host has no systemd, so nspawn runs with `--register=no --keep-unit`; machines are driven
//! with `nsenter -t <init pid> -a …`.

use std::fs;
use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::cmd::{self, CmdError};
use crate::imds::InstanceData;
use crate::net::{self, Segment};
use crate::paths::{self, MachinePaths};
use crate::rootfs;

#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    #[error("machine {instance}: {path}: {source}")]
    Io {
        instance: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("machine {instance}: {source}")]
    Cmd {
        instance: String,
        #[source]
        source: CmdError,
    },
    #[error("machine {instance}: rootfs: {source}")]
    Rootfs {
        instance: String,
        #[source]
        source: rootfs::RootfsError,
    },
    #[error("machine {instance}: private IP {ip} is not on the local VPC segment {network}/{prefix}")]
    OffSegment { instance: String, ip: String, network: Ipv4Addr, prefix: u8 },
    #[error("machine {instance}: {what} did not happen within {secs} s ({hint})")]
    Timeout { instance: String, what: String, secs: u64, hint: String },
}

/// How to reach the host services from inside a machine.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Environment {
    /// `http://<gateway>:<port>`: moto, relayed from 127.0.0.1.
    pub aws_endpoint: String,
    /// `http://<gateway>:<port>`: moto again, for S3 only (`AWS_ENDPOINT_URL_S3`), through a relay
    /// that can play a state-store outage ([`crate::relay::gated_relay`]).
    #[serde(default)]
    pub s3_endpoint: Option<String>,
    pub region: String,
    /// Extra `/etc/hosts` lines for every machine.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Test only: every service on the machines gets `KEELSON_TEST_CERT_VALIDITY_SECONDS` (nodeup
    /// and protokube then issue certificates this short, and renew them on the running cluster).
    #[serde(default)]
    pub test_cert_validity_seconds: Option<u64>,
}

/// What a machine's metadata service serves, by cloud: EC2's IMDSv2, or the GCE metadata server.
#[derive(Debug, Clone)]
pub enum MachineData {
    Aws(Box<InstanceData>),
    Gce(Box<crate::gce::metadata::GceMachine>),
}

impl MachineData {
    /// What names the machine (its directory, namespace and nspawn name): the EC2 instance id, or
    /// the GCE instance's numeric id (a recreated instance keeps its name, never its id).
    pub fn key(&self) -> &str {
        match self {
            MachineData::Aws(d) => &d.instance_id,
            MachineData::Gce(g) => &g.facts.id,
        }
    }
    pub fn name(&self) -> &str {
        match self {
            MachineData::Aws(d) => &d.instance_id,
            MachineData::Gce(g) => &g.facts.name,
        }
    }
    pub fn private_ip(&self) -> &str {
        match self {
            MachineData::Aws(d) => &d.private_ip,
            MachineData::Gce(g) => &g.facts.internal_ip,
        }
    }
    pub fn zone(&self) -> &str {
        match self {
            MachineData::Aws(d) => &d.zone,
            MachineData::Gce(g) => &g.facts.zone,
        }
    }
    /// The image the instance was launched from (the AMI id on EC2; the local GCE keeps none).
    pub fn image_id(&self) -> Option<&str> {
        match self {
            MachineData::Aws(d) => Some(d.image_id.as_str()),
            MachineData::Gce(_) => None,
        }
    }
    /// The architecture the instance runs: by its instance type on EC2 (the compiler's rule);
    /// the local GCE launches only this host's.
    pub fn arch(&self) -> crate::arch::Arch {
        match self {
            MachineData::Aws(d) => crate::arch::of_instance("aws", &d.instance_type),
            MachineData::Gce(_) => crate::arch::host(),
        }
    }
    /// The `keelson-local` subcommand that serves this data in the machine's namespace.
    fn server_command(&self) -> &'static str {
        match self {
            MachineData::Aws(_) => "imds",
            MachineData::Gce(_) => "gce-metadata",
        }
    }
    fn json(&self) -> String {
        match self {
            MachineData::Aws(d) => serde_json::to_string_pretty(d).unwrap_or_default(),
            MachineData::Gce(g) => serde_json::to_string_pretty(g).unwrap_or_default(),
        }
    }
}

/// What is persisted about a running machine (`machine.json`), enough for `ps` and `down`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct MachineInfo {
    pub instance_id: String,
    pub ip: String,
    pub zone: String,
    pub netns: String,
    pub veth: String,
    pub root: PathBuf,
    pub overlay: bool,
    pub nspawn_pid: i64,
    pub imds_pid: i64,
    #[serde(default)]
    pub init_pid: Option<i64>,
    #[serde(default)]
    pub role: String,
    #[serde(default)]
    pub group: String,
    /// The instance's name (GCE: what a recreated instance keeps; AWS: its id).
    #[serde(default)]
    pub name: String,
    /// Its own cgroup in each cgroup v1 hierarchy ([`crate::cgroups`]), removed at teardown.
    #[serde(default)]
    pub cgroups: Vec<PathBuf>,
}

pub struct Machine {
    pub info: MachineInfo,
    pub paths: MachinePaths,
    nspawn: Option<Child>,
    imds: Option<Child>,
}

fn io_err(instance: &str, path: &Path) -> impl FnOnce(std::io::Error) -> MachineError {
    let instance = instance.to_string();
    let path = path.to_path_buf();
    move |source| MachineError::Io { instance, path, source }
}

fn write_file(instance: &str, path: &Path, text: &str) -> Result<(), MachineError> {
    if let Some(d) = path.parent() {
        fs::create_dir_all(d).map_err(io_err(instance, d))?;
    }
    // Replace, never write through: the lower layer's file must not change.
    let _ = fs::remove_file(path);
    fs::write(path, text).map_err(io_err(instance, path))
}

/// The first child process of `pid` (nspawn's child is the container's init).
pub fn child_of(pid: i64) -> Option<i64> {
    let entries = fs::read_dir("/proc").ok()?;
    for e in entries.flatten() {
        let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<i64>().ok()) else {
            continue;
        };
        if let Ok(stat) = fs::read_to_string(format!("/proc/{p}/stat")) {
            // pid (comm) state ppid …; comm may contain spaces, so split after the last ')'.
            if let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) {
                let ppid = rest.split_whitespace().nth(1).and_then(|x| x.parse::<i64>().ok());
                if ppid == Some(pid) {
                    return Some(p);
                }
            }
        }
    }
    None
}

impl Machine {
    /// Boot a machine for `data` (instance facts from moto). Returns once systemd in the machine
    /// reports the boot finished (`running` or `degraded`), or fails after `boot_timeout`.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        self_exe: &Path,
        lower: &rootfs::Lower,
        dir: PathBuf,
        bridge: &str,
        seg: &Segment,
        env: &Environment,
        data: &MachineData,
        role: &str,
        group: &str,
    ) -> Result<Machine, MachineError> {
        let id = data.key().to_string();
        let ip: Ipv4Addr = data.private_ip().parse().map_err(|_| MachineError::OffSegment {
            instance: id.clone(),
            ip: data.private_ip().to_string(),
            network: seg.network,
            prefix: seg.prefix,
        })?;
        if !seg.contains(ip) || ip == seg.gateway {
            return Err(MachineError::OffSegment { instance: id, ip: data.private_ip().to_string(), network: seg.network, prefix: seg.prefix });
        }
        let mp = MachinePaths { dir };
        fs::create_dir_all(&mp.dir).map_err(io_err(&id, &mp.dir))?;
        let overlay =
            rootfs::instantiate(lower, &mp.upper(), &mp.work(), &mp.root()).map_err(|source| MachineError::Rootfs { instance: id.clone(), source })?;
        if let Some(baked) = &lower.baked {
            // The baked image's containerd store: the machine's own copy (its /var/lib/containerd is a host directory).
            let dir = mp.containerd_dir();
            crate::cluster::bundled::seed_containerd(&crate::cluster::bundled::containerd_store(baked), &dir).map_err(io_err(&id, &dir))?;
        }
        let mut m = Machine {
            info: MachineInfo {
                instance_id: id.clone(),
                ip: data.private_ip().to_string(),
                zone: data.zone().to_string(),
                netns: paths::netns_name(&id),
                veth: paths::veth_name(&id),
                root: mp.root(),
                overlay,
                nspawn_pid: 0,
                imds_pid: 0,
                init_pid: None,
                role: role.to_string(),
                group: group.to_string(),
                name: data.name().to_string(),
                cgroups: Vec::new(),
            },
            paths: mp,
            nspawn: None,
            imds: None,
        };
        // From here on, a failure tears down what was built.
        match m.boot(self_exe, bridge, seg, env, data, ip, lower.native_runc.as_deref()) {
            Ok(()) => Ok(m),
            Err(e) => {
                m.stop();
                Err(e)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn boot(
        &mut self,
        self_exe: &Path,
        bridge: &str,
        seg: &Segment,
        env: &Environment,
        data: &MachineData,
        ip: Ipv4Addr,
        native_runc: Option<&Path>,
    ) -> Result<(), MachineError> {
        let id = self.info.instance_id.clone();
        self.personalise(env, data)?;
        let cmd_err = |source| MachineError::Cmd { instance: id.clone(), source };
        net::create_namespace(&self.info.netns, &self.info.veth, bridge, ip, seg).map_err(cmd_err)?;

        // The metadata service (IMDS, or GCE's metadata server) inside the namespace. Its data
        // file may hold a signing key's path and the user-data: the machine's directory only.
        let imds_file = self.paths.imds_file();
        write_file(&id, &imds_file, &data.json())?;
        let log = fs::File::create(self.paths.imds_log()).map_err(io_err(&id, &self.paths.imds_log()))?;
        let log2 = log.try_clone().map_err(io_err(&id, &self.paths.imds_log()))?;
        let imds = Command::new("ip")
            .args(["netns", "exec", &self.info.netns])
            .arg(self_exe)
            .arg(data.server_command())
            .arg("--data")
            .arg(&imds_file)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|source| MachineError::Cmd {
                instance: id.clone(),
                source: CmdError::Spawn { program: format!("ip netns exec … keelson-local {}", data.server_command()), source },
            })?;
        self.info.imds_pid = imds.id() as i64;
        self.imds = Some(imds);
        wait_for(&id, "IMDS to listen", Duration::from_secs(10), "see imds.log", || {
            fs::read_to_string(self.paths.imds_log()).map(|s| s.contains("listening")).unwrap_or(false)
        })?;

        // The machine.
        let console = fs::File::create(self.paths.console_log()).map_err(io_err(&id, &self.paths.console_log()))?;
        let console2 = console.try_clone().map_err(io_err(&id, &self.paths.console_log()))?;
        let containerd_dir = self.paths.containerd_dir();
        fs::create_dir_all(&containerd_dir).map_err(io_err(&id, &containerd_dir))?;
        // Its own cgroups (crate::cgroups): a cloud instance's kubelet sees its own pods only.
        self.info.cgroups = crate::cgroups::dirs_for(&id).map_err(io_err(&id, Path::new("/proc/self/cgroup")))?;
        self.save()?;
        crate::cgroups::create(&self.info.cgroups).map_err(io_err(&id, Path::new("/sys/fs/cgroup")))?;
        if cmd::which("systemd-nspawn").is_none() {
            return Err(MachineError::Cmd {
                instance: id.clone(),
                source: CmdError::Spawn { program: "systemd-nspawn (apt-get install systemd-container)".into(), source: std::io::ErrorKind::NotFound.into() },
            });
        }
        // What a cloud instance has and a container does not, so that the kubelet and containerd
        // run as on EC2 (nothing of this reaches the product's defaults):
        // * writable cgroup v1 controller hierarchies (nspawn mounts them read-only; the init
        //   wrapper remounts them before systemd starts, so systemd delegates them as on a host);
        // * writable /sys and /proc/sys (SYSTEMD_NSPAWN_API_VFS_WRITABLE) for sysctls;
        // * the keyring system calls (runc gives every container its own session keyring);
        // * /dev/kmsg (the kubelet's OOM watcher reads it);
        // * /var/lib/containerd on the host's file system (see `MachinePaths::containerd_dir`).
        let nspawn = Command::new("sh")
            .args(["-c", crate::cgroups::ENTER_AND_EXEC, "keelson-machine", "systemd-nspawn"])
            .env(crate::cgroups::PROCS_ENV, crate::cgroups::procs_value(&self.info.cgroups))
            .args([
                "--register=no",
                "--keep-unit",
                "--console=read-only",
                "--resolv-conf=off",
                "--timezone=off",
                "--link-journal=no",
                "--capability=all",
                "--system-call-filter=@keyring",
                "--bind=/dev/kmsg",
            ])
            .arg(format!("--bind={}:{}", containerd_dir.display(), keelson_api::host_paths::CONTAINERD_ROOT))
            // A machine of another architecture: the host's runc, its directory bound (crate::arch,
            // rootfs::NATIVE_DIR).
            .args(native_runc.and_then(Path::parent).map(|d| format!("--bind-ro={}:/{}", d.display(), rootfs::NATIVE_DIR)))
            .arg(format!("--network-namespace-path=/run/netns/{}", self.info.netns))
            .arg(format!("--machine={id}"))
            .arg("--directory")
            .arg(self.paths.root())
            .arg(format!("/{}", rootfs::INIT))
            .env("SYSTEMD_NSPAWN_LOCK", "0")
            .env("SYSTEMD_NSPAWN_API_VFS_WRITABLE", "1")
            .stdin(Stdio::null())
            .stdout(console)
            .stderr(console2)
            .process_group(0)
            .spawn()
            .map_err(|source| MachineError::Cmd {
                instance: id.clone(),
                source: CmdError::Spawn { program: "systemd-nspawn (apt-get install systemd-container)".into(), source },
            })?;
        self.info.nspawn_pid = nspawn.id() as i64;
        self.nspawn = Some(nspawn);
        let nspawn_pid = self.info.nspawn_pid;
        let mut init = None;
        wait_for(&id, "the container's init to start", Duration::from_secs(20), "see console.log", || {
            init = child_of(nspawn_pid).filter(|p| fs::read_to_string(format!("/proc/{p}/comm")).map(|c| c.trim() == "systemd").unwrap_or(false));
            init.is_some()
        })?;
        self.info.init_pid = init;
        self.save()?;
        Ok(())
    }

    /// Wait until systemd in the machine says the boot finished.
    pub fn wait_booted(&self, timeout: Duration) -> Result<String, MachineError> {
        let id = &self.info.instance_id;
        let mut state = String::new();
        wait_for(id, "systemd boot to finish", timeout.as_secs().max(1), "see console.log", || {
            state = self.exec(&["systemctl", "is-system-running"]).map(|o| o.trim().to_string()).unwrap_or_else(|e| e.to_string());
            state == "running" || state == "degraded"
        })
        .map(|_| state.clone())
    }

    /// Files that make this rootfs this instance (written into the overlay before boot).
    fn personalise(&self, env: &Environment, data: &MachineData) -> Result<(), MachineError> {
        match data {
            MachineData::Aws(d) => self.personalise_aws(env, d),
            MachineData::Gce(g) => self.personalise_gce(env, g),
        }
    }

    /// On GCE: the hostname is the instance's name (its internal DNS name's first label), the
    /// metadata server answers as `metadata.google.internal`, the user-data runner reads it there,
    /// and every service sees the local cloud's Google endpoints.
    fn personalise_gce(&self, env: &Environment, g: &crate::gce::metadata::GceMachine) -> Result<(), MachineError> {
        let id = &self.info.instance_id;
        let root = self.paths.root();
        let f = &g.facts;
        write_file(id, &root.join("etc/hostname"), &format!("{}\n", f.name))?;
        let mut hosts = format!(
            "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n{} {} {}\n{} metadata.google.internal metadata\n",
            f.internal_ip,
            f.hostname,
            f.name,
            paths::IMDS_ADDR
        );
        for h in &env.hosts {
            hosts.push_str(h);
            hosts.push('\n');
        }
        write_file(id, &crate::paths::in_root(&root, keelson_api::host_paths::HOSTS_FILE), &hosts)?;
        write_file(id, &root.join("etc/resolv.conf"), "# keelson-local: no DNS resolver; names come from /etc/hosts\noptions timeout:1 attempts:1\n")?;
        let mut vars: Vec<String> = g.env.iter().map(|(k, v)| format!("\"{k}={v}\"")).collect();
        if let Some(s) = env.test_cert_validity_seconds {
            vars.push(format!("\"{}={s}\"", base::pki::TEST_VALIDITY_ENV));
        }
        write_file(id, &root.join("etc/systemd/system.conf.d/keelson-local.conf"), &format!("[Manager]\nDefaultEnvironment={}\n", vars.join(" ")))?;
        let profile: String = g.env.iter().map(|(k, v)| format!("export {k}={v}\n")).collect();
        write_file(id, &root.join("etc/profile.d/keelson-local.sh"), &profile)?;
        let runner = root.join(rootfs::USER_DATA_RUNNER);
        write_file(id, &runner, rootfs::RUN_USER_DATA_GCE)?;
        use std::os::unix::fs::PermissionsExt as _;
        fs::set_permissions(&runner, fs::Permissions::from_mode(0o755)).map_err(io_err(id, &runner))?;
        Ok(())
    }

    fn personalise_aws(&self, env: &Environment, data: &InstanceData) -> Result<(), MachineError> {
        let id = &self.info.instance_id;
        let root = self.paths.root();
        let short = format!("ip-{}", data.private_ip.replace('.', "-"));
        write_file(id, &root.join("etc/hostname"), &format!("{short}\n"))?;
        let mut hosts = format!("127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n{} {} {}\n", data.private_ip, data.local_hostname(), short);
        for h in &env.hosts {
            hosts.push_str(h);
            hosts.push('\n');
        }
        write_file(id, &crate::paths::in_root(&root, keelson_api::host_paths::HOSTS_FILE), &hosts)?;
        // No resolver in the local VPC: name lookups fail at once instead of timing out.
        write_file(id, &root.join("etc/resolv.conf"), "# keelson-local: no DNS resolver; names come from /etc/hosts\noptions timeout:1 attempts:1\n")?;
        // Every service sees the local cloud's AWS endpoint, and no credentials: as on EC2, the
        // agents take their instance role's from IMDS, so the IAM oracle checks their calls
        // against that role's policy (static keys here made every call the operator's, unchecked).
        // The local cloud answers plain http:// on the gateway, which the product refuses off
        // loopback unless allowed (`base::plain_http`): allowed for that one host.
        let gateway = env.aws_endpoint.trim_start_matches("http://").split([':', '/']).next().unwrap_or_default();
        let s3 = env.s3_endpoint.as_ref().map(|e| format!(" \"AWS_ENDPOINT_URL_S3={e}\"")).unwrap_or_default();
        let conf = format!(
            "[Manager]\nDefaultEnvironment=\"AWS_ENDPOINT_URL={}\"{s3} \"AWS_REGION={}\" \"AWS_DEFAULT_REGION={}\" \"{}={gateway}\"{}\n",
            env.aws_endpoint,
            env.region,
            env.region,
            base::plain_http::ALLOW_ENV,
            env.test_cert_validity_seconds.map(|s| format!(" \"{}={s}\"", base::pki::TEST_VALIDITY_ENV)).unwrap_or_default()
        );
        write_file(id, &root.join("etc/systemd/system.conf.d/keelson-local.conf"), &conf)?;
        let s3_export = env.s3_endpoint.as_ref().map(|e| format!("export AWS_ENDPOINT_URL_S3={e}\n")).unwrap_or_default();
        let profile = format!(
            "{s3_export}export AWS_ENDPOINT_URL={}\nexport AWS_REGION={}\nexport AWS_ACCESS_KEY_ID=keelson-local\nexport AWS_SECRET_ACCESS_KEY=keelson-local\nexport {}={gateway}\n",
            env.aws_endpoint,
            env.region,
            base::plain_http::ALLOW_ENV
        );
        write_file(id, &root.join("etc/profile.d/keelson-local.sh"), &profile)?;
        Ok(())
    }

    pub fn save(&self) -> Result<(), MachineError> {
        let json = serde_json::to_string_pretty(&self.info).unwrap_or_default();
        write_file(&self.info.instance_id, &self.paths.info_file(), &json)
    }

    pub fn init_pid(&self) -> Option<i64> {
        self.info.init_pid.filter(|p| cmd::alive(*p))
    }

    pub fn running(&self) -> bool {
        self.init_pid().is_some()
    }

    /// Run a command inside the machine (all its namespaces).
    pub fn exec(&self, argv: &[&str]) -> Result<String, CmdError> {
        exec_in(self.info.init_pid.unwrap_or(0), argv)
    }

    /// Shut the machine down as EC2 does when it terminates an instance: an ACPI power-button event
    /// (systemd's SIGRTMIN+4: poweroff, units stop in reverse order), and after at most `grace` it
    /// is gone whatever it was doing. Returns how long the shutdown took and whether it finished
    /// on its own.
    ///
    /// One thing a real machine's kernel does is played here: telling systemd that a container's
    /// scope has no process left. systemd learns it from cgroup2 `cgroup.events` or, on cgroup v1,
    /// from the kernel's release agent — and systemd inside an nspawn container on this cgroup-v1
    /// host gets neither, so its stop job for a container scope whose processes have all exited
    /// waits out the scope's 90-s stop timeout (measured: every poweroff of a control plane took
    /// the whole 30-s grace with 8–12 scope stop jobs pending and no container process left). So
    /// once systemd waits on nothing but such empty scopes (see [`shutdown_waits_only_on_empty_scopes`]),
    /// the machine is done, as it would be a moment later on a real host: it is powered off then
    /// (and counted as a clean poweroff).
    ///
    /// `on_off` runs the moment the machine is off (its init and `systemd-nspawn` gone, so its
    /// mount namespace and every mount in it are gone too), before the rest of the teardown (its
    /// root's unmount, its namespace, removing the overlay's upper directory: seconds for a control
    /// plane on a busy host). A cloud frees a terminated instance's volumes when it is off, not
    /// when its disk has been scrubbed.
    pub fn poweroff(&mut self, grace: Duration, on_off: impl FnOnce()) -> (Duration, bool) {
        let t0 = Instant::now();
        let mut clean = false;
        if let Some(init) = self.init_pid() {
            cmd::kill(init, "RTMIN+4");
            let mut next_check = t0 + EMPTY_SCOPES_CHECK;
            while cmd::alive(init) && t0.elapsed() < grace {
                std::thread::sleep(Duration::from_millis(50));
                if Instant::now() >= next_check {
                    next_check = Instant::now() + EMPTY_SCOPES_CHECK;
                    if shutdown_waits_only_on_empty_scopes(init) {
                        clean = true;
                        break;
                    }
                }
            }
            clean |= !cmd::alive(init);
            keep_journal(init, &self.paths.poweroff_journal());
        }
        halt(&self.info);
        on_off();
        self.stop();
        (t0.elapsed(), clean)
    }

    /// Stop the machine (power off: SIGKILL its init, as a terminated instance loses power), kill
    /// its IMDS, remove its namespace and its root.
    pub fn stop(&mut self) {
        teardown(&self.info, &self.paths);
        if let Some(mut c) = self.nspawn.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(mut c) = self.imds.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `nsenter -t PID -a -- argv…`
pub fn exec_in(init_pid: i64, argv: &[&str]) -> Result<String, CmdError> {
    cmd::run(Command::new("nsenter").args(["-t", &init_pid.to_string(), "-a", "--"]).args(argv))
}

/// [`exec_in`], killed (SIGKILL) if it has not finished within `limit`. For a machine that is
/// shutting down: its final `systemd-shutdown` stops every process of its PID namespace (SIGSTOP,
/// then SIGTERM/SIGKILL), and when that catches the command nsenter started there, nsenter (which
/// forwards a stopped child's stop to itself) stops too and never returns on its own.
pub fn exec_in_within(init_pid: i64, argv: &[&str], limit: Duration) -> Result<String, CmdError> {
    let pid = init_pid.to_string();
    cmd::run_within(&[&["nsenter", "-t", &pid, "-a", "--"], argv].concat(), limit)
}

/// The units of systemd's pending stop jobs, from `systemctl list-jobs --no-legend --plain`
/// (`JOB UNIT TYPE STATE` per line).
pub fn stop_job_units(list_jobs: &str) -> Vec<&str> {
    list_jobs
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 4 && f[2] == "stop").then(|| f[1])
        })
        .collect()
}

/// How often a powering-off machine is asked whether it waits only on empty scopes (each ask is an
/// `nsenter` and a `systemctl list-jobs`).
const EMPTY_SCOPES_CHECK: Duration = Duration::from_millis(250);

/// Whether a shutdown is held up only by the kernel's missing empty-cgroup notification: at least
/// one stop job is pending, none is for a service (systemd tracks its services' processes itself),
/// and every scope it stops has no process left in its cgroup (the container's `name=systemd`
/// hierarchy, read from the host through the machine's root).
pub fn shutdown_waits_only_on_empty_scopes(init: i64) -> bool {
    let Ok(jobs) = exec_in_within(init, &["systemctl", "list-jobs", "--no-legend", "--plain"], Duration::from_secs(3)) else { return false };
    let units = stop_job_units(&jobs);
    if units.is_empty() || units.iter().any(|u| u.ends_with(".service")) {
        return false;
    }
    let scopes: Vec<&str> = units.iter().copied().filter(|u| u.ends_with(".scope")).collect();
    let hierarchy = PathBuf::from(format!("/proc/{init}/root/sys/fs/cgroup/systemd"));
    scopes.iter().all(|scope| match find_dir(&hierarchy, scope, 6) {
        Some(dir) => fs::read_to_string(dir.join("cgroup.procs")).map(|p| p.trim().is_empty()).unwrap_or(false),
        // Gone from the hierarchy: nothing left in it.
        None => true,
    })
}

/// The directory named `name` under `root`, at most `depth` levels down.
fn find_dir(root: &Path, name: &str, depth: usize) -> Option<PathBuf> {
    let entries = fs::read_dir(root).ok()?;
    let mut subdirs = Vec::new();
    for e in entries.flatten() {
        if !e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            continue;
        }
        if e.file_name() == name {
            return Some(e.path());
        }
        subdirs.push(e.path());
    }
    if depth == 0 {
        return None;
    }
    subdirs.iter().find_map(|d| find_dir(d, name, depth - 1))
}

/// Copy the journal of the machine whose init is `init` (in memory: `/run/log/journal`, reached
/// through `/proc/<init>/root`) to `dest`, replacing what is there, for reading after the machine
/// is gone (`journalctl -D dest`). Nothing is copied once init has exited. A copy of at most
/// journald's 16-MB runtime limit, done after the shutdown and before the teardown.
pub fn keep_journal(init: i64, dest: &Path) {
    let src = PathBuf::from(format!("/proc/{init}/root/run/log/journal"));
    if !cmd::alive(init) || !src.is_dir() {
        return;
    }
    let _ = fs::remove_dir_all(dest);
    if let Err(e) = cmd::sh(&["cp", "-r", &src.to_string_lossy(), &dest.to_string_lossy()]) {
        eprintln!("keelson-local: keeping the journal of a machine that powers off: {e}");
    }
}

/// Power the machine off for good: SIGKILL its init (and with it every process of its PID
/// namespace), and wait (at most 10 s) for its `systemd-nspawn` to exit. Its mount namespace, and
/// every volume mounted in it, is gone with them.
pub fn halt(info: &MachineInfo) {
    if let Some(init) = info.init_pid {
        if cmd::alive(init) {
            cmd::kill(init, "KILL");
        }
    }
    if info.nspawn_pid > 0 {
        let deadline = Instant::now() + Duration::from_secs(10);
        while cmd::alive(info.nspawn_pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if cmd::alive(info.nspawn_pid) {
            cmd::kill(info.nspawn_pid, "KILL");
        }
    }
}

/// Tear down from persisted info only (used by `stop` and by `down` after a crash).
pub fn teardown(info: &MachineInfo, mp: &MachinePaths) {
    halt(info);
    if info.imds_pid > 0 && cmd::alive(info.imds_pid) {
        cmd::kill(info.imds_pid, "KILL");
    }
    // The IMDS server itself (ip netns exec execs it, so the pid is the same; be thorough).
    for pid in pids_in_netns(&info.netns) {
        cmd::kill(pid, "KILL");
    }
    let root = mp.root();
    for _ in 0..20 {
        if !is_mountpoint(&root) {
            break;
        }
        if cmd::sh(&["umount", &root.to_string_lossy()]).is_err() {
            cmd::sh_quiet(&["umount", "-l", &root.to_string_lossy()]);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    net::delete_namespace(&info.netns, &info.veth);
    let left = crate::cgroups::remove(&info.cgroups);
    if !left.is_empty() {
        eprintln!("keelson-local: {}: cgroups still busy after 10 s: {left:?}", info.instance_id);
    }
    let _ = fs::remove_dir_all(Path::new(paths::NSPAWN_RUN_DIR).join("propagate").join(&info.instance_id));
    let _ = fs::remove_dir_all(mp.upper());
    let _ = fs::remove_dir_all(mp.work());
    // Its /var/lib/containerd (images, snapshots) is part of its root volume, which EC2 deletes
    // with the instance: kept, a 100-cycle soak filled the host's disk at cycle 60 (~0.85 GB per
    // replaced control plane). Only when nothing is mounted below it (the machine's mounts went
    // with its namespace).
    let containerd = mp.containerd_dir();
    if !mounted_below(&containerd) {
        let _ = fs::remove_dir_all(&containerd);
    }
    if !is_mountpoint(&root) {
        let _ = fs::remove_dir_all(&root);
    }
}

/// Processes whose network namespace is `/run/netns/<ns>` (via `ip netns pids`).
pub fn pids_in_netns(ns: &str) -> Vec<i64> {
    cmd::sh(&["ip", "netns", "pids", ns]).unwrap_or_default().split_whitespace().filter_map(|p| p.parse().ok()).collect()
}

/// Whether anything is mounted at or below `dir` (in this process's mount namespace).
pub fn mounted_below(dir: &Path) -> bool {
    fs::read_to_string("/proc/self/mountinfo").map(|m| mounts_below(&m, dir)).unwrap_or(true)
}

/// Whether `mountinfo` lists a mount point at or below `dir`.
fn mounts_below(mountinfo: &str, dir: &Path) -> bool {
    mountinfo.lines().filter_map(|l| l.split_whitespace().nth(4)).any(|p| Path::new(p).starts_with(dir))
}

pub fn is_mountpoint(path: &Path) -> bool {
    let p = path.to_string_lossy();
    fs::read_to_string("/proc/self/mountinfo").map(|m| m.lines().any(|l| l.split_whitespace().nth(4) == Some(p.as_ref()))).unwrap_or(false)
}

/// Poll `cond` every 100 ms until true or `secs` pass.
pub fn wait_for(instance: &str, what: &str, secs: impl Into<WaitSecs>, hint: &str, mut cond: impl FnMut() -> bool) -> Result<(), MachineError> {
    let secs = secs.into().0;
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if cond() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(MachineError::Timeout { instance: instance.to_string(), what: what.to_string(), secs, hint: hint.to_string() });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub struct WaitSecs(pub u64);
impl From<u64> for WaitSecs {
    fn from(s: u64) -> Self {
        WaitSecs(s)
    }
}
impl From<Duration> for WaitSecs {
    fn from(d: Duration) -> Self {
        WaitSecs(d.as_secs().max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mount_below_a_directory_keeps_it() {
        let info = "36 25 0:31 / /var/lib/keelson-local/machines/i-1/root rw - overlay overlay rw\n40 25 0:36 / /proc rw - proc proc rw\n";
        assert!(mounts_below(info, Path::new("/var/lib/keelson-local/machines/i-1")));
        assert!(!mounts_below(info, Path::new("/var/lib/keelson-local/machines/i-1/containerd")));
        // A sibling whose name starts the same is not below it.
        assert!(!mounts_below(info, Path::new("/var/lib/keelson-local/machines/i-")));
    }

    #[test]
    fn stop_jobs_are_read_from_list_jobs() {
        let out = "1203 cri-containerd-8fa4d1b.scope stop running\n\
                   1190 kubepods-burstable.slice stop waiting\n\
                   1 poweroff.target start waiting\n\
                   1188 containerd.service stop running\n";
        assert_eq!(stop_job_units(out), vec!["cri-containerd-8fa4d1b.scope", "kubepods-burstable.slice", "containerd.service"]);
        assert!(stop_job_units("").is_empty());
        assert!(stop_job_units("garbage\n").is_empty());
    }

    #[test]
    fn scope_directories_are_found_below_their_slices() {
        let d = tempfile::tempdir().expect("tempdir");
        let scope = d.path().join("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-ab.scope");
        fs::create_dir_all(&scope).expect("mkdir");
        fs::create_dir_all(d.path().join("system.slice/containerd.service")).expect("mkdir");
        assert_eq!(find_dir(d.path(), "cri-containerd-ab.scope", 6), Some(scope));
        assert_eq!(find_dir(d.path(), "cri-containerd-ab.scope", 2), None, "deeper than allowed");
        assert_eq!(find_dir(d.path(), "cri-containerd-zz.scope", 6), None);
    }
}
