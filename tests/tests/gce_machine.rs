//! A GCE machine of the local cloud, with real parts: systemd booting in its own namespace, its
//! metadata server answering as `metadata.google.internal` (and refusing a request without
//! `Metadata-Flavor: Google`), the template's `user-data` run at boot as cloud-init runs it, an
//! identity token the join server's verifier accepts against the local cloud's JWK set, the
//! services' environment naming the local Google endpoints, and a persistent disk appearing under
//! GCE's by-id names, formatted and mounted inside, then detached.
//!
//! Needs root, debootstrap and systemd-nspawn (scripts/test installs them).

mod support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use keelson_local::gce::metadata::{GceMachine, KEY_ID};
use keelson_local::machine::{Environment, Machine, MachineData};
use keelson_local::net::{self, Segment};
use keelson_local::volumes::{self, Bus};
use keelson_local::{cmd, paths, rootfs};
use testkit::gce_metadata::{InstanceFacts, Signer};

const BRIDGE: &str = "klbrg0";
const ID: &str = "5213498711093412001";
const NAME: &str = "nodes-europe-west1-b-k3x9";
const DISK: &str = "b-etcd-main-gce-k8s-example-com";

#[test]
fn gce_machine_metadata_user_data_identity_and_persistent_disk() {
    support::require_machine_root();
    let lower = rootfs::Lower::from(rootfs::ensure(&paths::cache_dir()).expect("rootfs"));
    let dir = std::env::temp_dir().join(format!("kl-gce-machine-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let mut g = support::MachineGuard { machine: None, dir: dir.clone(), backing: None, bridge: BRIDGE };
    let seg = Segment::from_cidr("10.214.16.0/20").unwrap();
    net::ensure_bridge(BRIDGE, &seg).expect("bridge");

    let key = dir.join("signing-key.der");
    let signer = Signer::generate_to(&key, KEY_ID).expect("signing key");
    let user_data = "#!/bin/bash\nname=$(curl -fsS -H 'Metadata-Flavor: Google' http://metadata.google.internal/computeMetadata/v1/instance/name)\necho \"user-data ran as $(id -u) on $name\" > /root/user-data-marker\n";
    let facts = InstanceFacts {
        project: "acme-platform".into(),
        numeric_project: "123456789012".into(),
        zone: "europe-west1-b".into(),
        name: NAME.into(),
        id: ID.into(),
        internal_ip: "10.214.16.2".into(),
        network: "gce-k8s-example-com".into(),
        machine_type: "e2-medium".into(),
        hostname: format!("{NAME}.europe-west1-b.c.acme-platform.internal"),
        attributes: BTreeMap::from([
            ("user-data".to_string(), user_data.to_string()),
            ("cluster-name".to_string(), "gce.k8s.example.com".to_string()),
            ("kops-k8s-io-instance-group-name".to_string(), "nodes-europe-west1-b".to_string()),
        ]),
        service_account: Some("123456789012-compute@developer.gserviceaccount.com".into()),
        scopes: vec!["https://www.googleapis.com/auth/cloud-platform".into()],
    };
    let data = GceMachine {
        facts,
        signing_key: key,
        env: vec![("STORAGE_EMULATOR_HOST".into(), format!("http://{}:1", seg.gateway)), ("KEELSON_GCE_ENDPOINT".into(), format!("http://{}:2", seg.gateway))],
    };
    let env = Environment { aws_endpoint: String::new(), s3_endpoint: None, region: "europe-west1".into(), hosts: vec![], test_cert_validity_seconds: None };
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_keelson-local"));
    let m = Machine::start(&exe, &lower, dir.join(ID), BRIDGE, &seg, &env, &MachineData::Gce(Box::new(data)), "node", "nodes").expect("machine starts");
    g.machine = Some(m);
    let m = g.machine.as_ref().unwrap();
    m.wait_booted(Duration::from_secs(60)).expect("systemd boots");

    // The hostname is the instance's name; the metadata server answers under its GCE name, and only
    // to a request that says `Metadata-Flavor: Google`.
    assert_eq!(m.exec(&["hostname"]).unwrap().trim(), NAME);
    let md = "http://metadata.google.internal/computeMetadata/v1";
    let bare = m.exec(&["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", &format!("{md}/instance/id")]).unwrap();
    assert_eq!(bare, "403", "a request without Metadata-Flavor must be refused");
    let get = |p: &str| m.exec(&["curl", "-fsS", "-H", "Metadata-Flavor: Google", &format!("{md}/{p}")]).unwrap();
    assert_eq!(get("instance/id"), ID);
    assert_eq!(get("instance/zone"), "projects/123456789012/zones/europe-west1-b");
    assert_eq!(get("instance/network-interfaces/0/ip"), "10.214.16.2");
    assert!(get("instance/service-accounts/default/token").contains("access_token"));

    // The user-data ran at boot, as root, and could read the metadata server.
    support::wait("user-data to run", 30, || m.exec(&["cat", "/root/user-data-marker"]).is_ok());
    assert_eq!(m.exec(&["cat", "/root/user-data-marker"]).unwrap().trim(), format!("user-data ran as 0 on {NAME}"));

    // An identity token from inside verifies against the local cloud's JWK set for its audience,
    // naming this instance.
    let body = br#"{"node":"join"}"#;
    let aud = base::node_join_gce::audience(body);
    let token = get(&format!("instance/service-accounts/default/identity?audience={aud}&format=full"));
    let keys: base::node_join_gce::JwkSet = serde_json::from_str(&signer.jwks_json()).expect("JWK set");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let id = base::node_join_gce::verify(&token, &keys, body, now, 300).expect("the token verifies");
    assert_eq!((id.instance_id.as_str(), id.instance_name.as_str(), id.project_id.as_str()), (ID, NAME, "acme-platform"));

    // Services see the local Google endpoints.
    let env_out = m.exec(&["systemctl", "show-environment"]).unwrap();
    assert!(env_out.contains(&format!("STORAGE_EMULATOR_HOST=http://{}:1", seg.gateway)), "{env_out}");

    // A persistent disk attached with deviceName = its name: /dev/sdb, GCE's by-id names, usable.
    let b = volumes::ensure_backing(&dir.join("volumes"), DISK, 1).expect("loop device");
    g.backing = Some(b.file.clone());
    let m = g.machine.as_ref().unwrap();
    let init = m.init_pid().unwrap();
    let bus = Bus::GcePd { device_name: DISK.into() };
    volumes::expose_as(init, &b, &bus, 1).expect("expose");
    let link = format!("/dev/disk/by-id/google-{DISK}");
    assert_eq!(m.exec(&["readlink", "-f", &link]).unwrap().trim(), "/dev/sdb");
    assert_eq!(m.exec(&["readlink", "-f", &format!("/dev/disk/by-id/scsi-0Google_PersistentDisk_{DISK}")]).unwrap().trim(), "/dev/sdb");
    m.exec(&[
        "systemd-run",
        "--wait",
        "--quiet",
        "--unit=kl-mkfs",
        "sh",
        "-c",
        &format!("mkfs.ext4 -q {link} && mkdir -p /mnt/pd && mount {link} /mnt/pd && echo data > /mnt/pd/f"),
    ])
    .expect("format and mount inside the machine");
    assert_eq!(m.exec(&["cat", "/mnt/pd/f"]).unwrap().trim(), "data");
    m.exec(&["umount", "/mnt/pd"]).expect("umount");
    volumes::unexpose_as(init, &bus, 1);
    assert!(m.exec(&["test", "-e", &link]).is_err(), "detached: the by-id link is gone");

    // Stop: the metadata server goes with the machine.
    let info = g.machine.as_ref().unwrap().info.clone();
    g.machine.as_mut().unwrap().stop();
    assert!(!cmd::alive(info.imds_pid), "metadata server still running");
    assert!(!net::our_namespaces().contains(&info.netns), "namespace left behind");
}
