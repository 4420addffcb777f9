//! The local cloud's layers, each on its own, with real parts: the cached debootstrap rootfs, a
//! machine booting systemd in its own network namespace, IMDSv2 reached with curl from inside it,
//! user-data run at boot, an EBS volume exposed as a loop device under its NVMe by-id name and
//! formatted/mounted inside the machine, cgroup controllers that systemd (and so the kubelet and
//! containerd) can use, and cleanup leaving nothing behind.
//!
//! Needs root, debootstrap and systemd-nspawn (scripts/test installs them). The first run builds
//! the rootfs (a few minutes); later runs reuse the cache.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use keelson_local::imds::InstanceData;
use keelson_local::machine::{self, Environment, Machine, MachineData};
use keelson_local::net::{self, Segment};
use keelson_local::{cmd, paths, rootfs, volumes};

const BRIDGE: &str = "klbrt0";
const INSTANCE: &str = "i-0000000000test01";

#[test]
fn machine_layers_end_to_end() {
    support::require_machine_root();
    let lower = rootfs::Lower::from(rootfs::ensure(&paths::cache_dir()).expect("rootfs"));
    let dir = std::env::temp_dir().join(format!("kl-machine-test-{}", std::process::id()));
    let mut g = support::MachineGuard { machine: None, dir: dir.clone(), backing: None, bridge: BRIDGE };
    let seg = Segment::from_cidr("10.213.0.0/24").unwrap();
    net::ensure_bridge(BRIDGE, &seg).expect("bridge");

    let data = InstanceData {
        instance_id: INSTANCE.into(),
        region: "eu-west-1".into(),
        zone: "eu-west-1a".into(),
        private_ip: "10.213.0.10".into(),
        mac: "0e:00:00:00:00:0a".into(),
        user_data: Some("#!/bin/bash\necho \"user-data ran as $(id -u)\" > /root/user-data-marker\n".into()),
        ..Default::default()
    };
    let env = Environment {
        aws_endpoint: format!("http://{}:1", seg.gateway),
        s3_endpoint: None,
        region: "eu-west-1".into(),
        hosts: vec![],
        test_cert_validity_seconds: None,
    };
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_keelson-local"));
    let started = Instant::now();
    let m = Machine::start(&exe, &lower, dir.join(INSTANCE), BRIDGE, &seg, &env, &MachineData::Aws(Box::new(data)), "control-plane", "test")
        .expect("machine starts");
    g.machine = Some(m);
    let m = g.machine.as_ref().unwrap();
    let state = m.wait_booted(Duration::from_secs(60)).expect("systemd boots");
    eprintln!("booted ({state}) in {:.1} s", started.elapsed().as_secs_f64());

    // The namespace has the instance's IP; the host reaches it over the bridge only.
    let addrs = m.exec(&["ip", "-4", "-o", "addr"]).unwrap();
    assert!(addrs.contains("10.213.0.10/24"), "{addrs}");
    // The only way off the segment is the VPC router (the host's bridge address), as in a VPC.
    let routes = m.exec(&["ip", "route"]).unwrap();
    assert!(
        routes.lines().any(|l| l.starts_with(&format!("default via {} dev eth0", seg.gateway))),
        "the default route must be the VPC router {}: {routes}",
        seg.gateway
    );

    // IMDSv2 from inside the machine with curl: no token → 401; token → facts.
    let no_token = m.exec(&["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "http://169.254.169.254/latest/meta-data/instance-id"]).unwrap();
    assert_eq!(no_token, "401");
    let token = m.exec(&["curl", "-fsS", "-X", "PUT", "-H", "X-aws-ec2-metadata-token-ttl-seconds: 60", "http://169.254.169.254/latest/api/token"]).unwrap();
    let get = |p: &str| m.exec(&["curl", "-fsS", "-H", &format!("X-aws-ec2-metadata-token: {token}"), &format!("http://169.254.169.254/latest/{p}")]).unwrap();
    assert_eq!(get("meta-data/instance-id"), INSTANCE);
    assert_eq!(get("meta-data/placement/availability-zone"), "eu-west-1a");
    assert_eq!(get("meta-data/placement/region"), "eu-west-1");
    assert_eq!(get("meta-data/local-ipv4"), "10.213.0.10");
    assert!(get("user-data").starts_with("#!/bin/bash"));

    // The user-data unit ran the user-data at boot (as root).
    support::wait("user-data to run", 30, || m.exec(&["cat", "/root/user-data-marker"]).is_ok());
    assert_eq!(m.exec(&["cat", "/root/user-data-marker"]).unwrap().trim(), "user-data ran as 0");
    // Services see the local cloud's AWS endpoint.
    let env_out = m.exec(&["systemctl", "show-environment"]).unwrap();
    assert!(env_out.contains("AWS_ENDPOINT_URL=http://10.213.0.254:1"), "{env_out}");

    // A volume: loop device, exposed under its NVMe by-id name, formatted and mounted inside.
    let b = volumes::ensure_backing(&dir.join("volumes"), "vol-0123abcd", 1).expect("loop device");
    g.backing = Some(b.file.clone());
    let m = g.machine.as_ref().unwrap();
    let init = m.init_pid().unwrap();
    volumes::expose(init, &b, 1).expect("expose");
    let link = format!("/dev/disk/by-id/{}", paths::ebs_by_id_name("vol-0123abcd"));
    assert_eq!(m.exec(&["readlink", "-f", &link]).unwrap().trim(), "/dev/nvme1n1");
    // From a service inside the machine (its cgroup and capabilities), as protokube would.
    m.exec(&[
        "systemd-run",
        "--wait",
        "--quiet",
        "--unit=kl-mkfs",
        "sh",
        "-c",
        &format!("mkfs.ext4 -q {link} && mkdir -p /mnt/master-vol-0123abcd && mount {link} /mnt/master-vol-0123abcd && echo data > /mnt/master-vol-0123abcd/f"),
    ])
    .expect("format and mount inside the machine");
    assert_eq!(m.exec(&["cat", "/mnt/master-vol-0123abcd/f"]).unwrap().trim(), "data");

    // What the kubelet and containerd need from a machine (a container would get none of it by
    // default): writable cgroup v1 controllers that systemd delegates (a unit's memory limit lands
    // in the memory hierarchy), and /dev/kmsg for the kubelet's OOM watcher.
    m.exec(&["systemd-run", "--unit=kl-limited", "-p", "MemoryLimit=100M", "sleep", "300"]).unwrap();
    let limit = m.exec(&["cat", "/sys/fs/cgroup/memory/system.slice/kl-limited.service/memory.limit_in_bytes"]).unwrap_or_default();
    assert_eq!(limit.trim(), "104857600", "systemd did not apply the memory limit in the v1 memory controller");
    assert!(m.exec(&["test", "-c", "/dev/kmsg"]).is_ok(), "no /dev/kmsg in the machine");

    // Detach: the device disappears from the machine.
    volumes::unexpose(init, "vol-0123abcd", 1);
    assert!(m.exec(&["test", "-e", &link]).is_err());

    // Stop: nothing left behind.
    let info = g.machine.as_ref().unwrap().info.clone();
    g.machine.as_mut().unwrap().stop();
    assert!(!cmd::alive(info.nspawn_pid), "nspawn still running");
    assert!(!cmd::alive(info.init_pid.unwrap()), "machine init still running");
    assert!(!cmd::alive(info.imds_pid), "IMDS server still running");
    assert!(!net::our_namespaces().contains(&info.netns), "namespace left behind");
    assert!(!machine::is_mountpoint(&info.root), "overlay left mounted");
    assert!(!Path::new(&format!("{}/propagate/{}", paths::NSPAWN_RUN_DIR, INSTANCE)).exists());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&dir.to_string_lossy().to_string()), "mounts left under {}", dir.display());
}
