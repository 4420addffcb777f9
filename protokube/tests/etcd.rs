//! A real 3-member etcd cluster started from the manifests protokube writes, each member in its own
//! network namespace (addresses only on a bridge and namespaces this test creates), with hosts-file
//! DNS; then one member's instance is replaced (new namespace, new IP, same volume) and every key is
//! read back from it; then a member whose volume is lost comes back on a blank volume — first while
//! no peer answers (it must wait, never bootstrap a new cluster), then added through the etcd
//! members API.
//! Needs root, iproute2, etcd-server (etcd, etcdctl) and moto; fails loudly without them.

#[path = "support/etcd_net.rs"]
mod etcd_net;
#[path = "support/host.rs"]
mod host;
#[path = "../../cloud/tests/support/moto.rs"]
mod moto;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use etcd_net::{etcdctl, logs, need_tools, Net, TLS_DIR};
use host::{create_volume, etcd_tags, need_root, Cluster, Host, LoopDev};

const NAME: &str = "etcd.k8s.local";

struct Run2 {
    last: String,
    stderr: String,
}

impl Run2 {
    fn last_line(&self) -> &str {
        &self.last
    }
}

struct Member {
    ns: String,
    ip: String,
    host: Host,
}

#[test]
fn three_members_in_namespaces_survive_member_replacement() {
    scenario(false);
}

/// The same with TLS (the default): certificates issued by protokube from the state store's CAs,
/// client-certificate auth, and the members API used over TLS with the member's name pinned to its
/// address.
#[test]
fn three_members_with_tls_survive_member_replacement() {
    scenario(true);
}

fn scenario(tls: bool) {
    need_root();
    need_tools();

    let (_g, m) = moto::lock();
    let logdir = tempfile::tempdir().expect("log dir");
    let mut net = Net::new(u8::from(tls));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let conf = rt.block_on(moto::sdk(&m.url));
    let ec2 = aws_sdk_ec2::Client::new(&conf);
    let c = Cluster::new(&m.url, NAME, &[("main", &[("a", "cp-a"), ("b", "cp-b"), ("c", "cp-c")])], "");
    if !tls {
        // Plain HTTP only with kOps' Legacy provider (the default Manager provider is always TLS).
        c.edit_spec(|text| text.replace("  - name: main\n", "  - name: main\n    provider: Legacy\n"));
    }
    let all = ["a", "b", "c"];
    let subnet_id = rt.block_on(async {
        let vpc = ec2.create_vpc().cidr_block("10.231.0.0/16").send().await.expect("CreateVpc");
        let vpc = vpc.vpc().and_then(|v| v.vpc_id()).expect("vpc id").to_string();
        let sn = ec2.create_subnet().vpc_id(vpc).cidr_block(format!("{}.0/24", net.subnet)).availability_zone("us-east-1a").send().await.expect("CreateSubnet");
        sn.subnet().and_then(|s| s.subnet_id()).expect("subnet id").to_string()
    });
    let devs: Vec<LoopDev> = (0..3).map(|_| LoopDev::new(256)).collect();
    let vols: Vec<String> = all.iter().map(|mbr| rt.block_on(create_volume(&ec2, "us-east-1a", &etcd_tags(NAME, "main", mbr, &all)))).collect();

    let new_member = |net: &mut Net, tag: &str, hostnum: u8, group: &str| -> Member {
        let (ns, ip) = net.namespace(tag, hostnum);
        let (instance_id, got) = rt.block_on(host::run_instance(&ec2, "us-east-1a", Some(&subnet_id), Some(&ip)));
        assert_eq!(got, ip, "moto honours PrivateIpAddress");
        let h = Host {
            root: host::shared_root(),
            by_id: tempfile::tempdir().expect("by-id"),
            instance_id,
            zone: "us-east-1a".into(),
            ip: ip.clone(),
            public_ip: String::new(),
            group: group.into(),
        };
        for (v, d) in vols.iter().zip(&devs) {
            h.link(v, &d.dev);
        }
        Member { ns, ip, host: h }
    };
    let pass = |mb: &Member| {
        // A killed etcd's mount namespace (ip netns exec makes one) lets go of the device a moment
        // after the process is reaped; until then e2fsck says "in use" and the pass refuses, as it
        // must. protokube's loop retries; here, bounded retries of --once do the same.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut seen = String::new();
        loop {
            let r = c.run(&mb.host, &["--once", "--hosts-file", &Net::hosts_file(&mb.ns), "--quorum-loss-wait", "0"]);
            // etcd refuses a member change for a few seconds after the previous one ("unhealthy
            // cluster" until every member has been connected for its health interval); the next pass
            // continues where this one stopped.
            let transient = r.stderr.contains("is in use") || r.stderr.contains("protokube: etcd main:");
            if !r.ok && transient && Instant::now() < deadline {
                seen.push_str(&r.stderr);
                std::thread::sleep(Duration::from_millis(500));
                continue;
            }
            assert!(r.ok, "protokube for {} failed:\n{}", mb.host.group, r.stderr);
            return Run2 { last: r.last_line().to_string(), stderr: format!("{seen}{}", r.stderr) };
        }
    };

    let mut members: Vec<Member> = [("a", 11u8, "cp-a"), ("b", 12, "cp-b"), ("c", 13, "cp-c")].iter().map(|(t, n, g)| new_member(&mut net, t, *n, g)).collect();
    for mb in &members {
        let r = pass(mb);
        assert!(r.last_line().starts_with("protokube: 1 volumes mounted, 1 manifests written"), "{}", r.last_line());
    }
    // Second round: every hosts file now knows every member (peers come from the cloud, not DNS).
    for mb in &members {
        let r = pass(mb);
        assert!(r.last_line().starts_with("protokube: 0 volumes mounted, 0 manifests written"), "{}", r.last_line());
        let hosts = std::fs::read_to_string(Net::hosts_file(&mb.ns)).expect("hosts");
        for o in &members {
            assert!(hosts.contains(&o.ip), "{} lacks {}: {hosts}", mb.ns, o.ip);
        }
    }
    for (mb, t) in members.iter().zip(["a", "b", "c"]) {
        assert!(mb.host.manifest("main").expect("manifest").contains("--initial-cluster-state=new"));
        net.start_etcd(&mb.ns, &mb.host, &logdir.path().join(format!("etcd-{t}.log")));
    }
    let scheme = if tls { "https" } else { "http" };
    let ep = |mb: &Member| format!("{scheme}://{}:4001", mb.ip);
    if tls {
        assert!(members[0].host.manifest("main").expect("manifest").contains("--client-cert-auth=true"));
        // etcdctl authenticates with the client certificate protokube issued on member a.
        let dir = members[0].host.root.path().join("etc/kubernetes/pki/etcd/main");
        *TLS_DIR.lock().unwrap_or_else(|p| p.into_inner()) = Some(dir.display().to_string());
    } else {
        *TLS_DIR.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
    let health = etcdctl(&members[0].ns, &ep(&members[0]), &["endpoint", "health"], Duration::from_secs(60));
    assert!(health.contains("is healthy"), "{health}\n{}", logs(logdir.path()));
    for i in 0..20 {
        etcdctl(&members[i % 3].ns, &ep(&members[i % 3]), &["put", &format!("key{i}"), &format!("value{i}")], Duration::from_secs(20));
    }
    // With quorum, the next pass marks every member's volume as having run in a cluster.
    for (mb, v) in members.iter().zip(&vols) {
        pass(mb);
        let vol = rt.block_on(host::volume(&ec2, v));
        assert!(vol.tags().iter().any(|t| t.key() == Some(protokube::reconcile::STARTED_TAG)), "{}: {:?}", mb.ns, vol.tags());
    }

    // Member c's instance dies; the group launches a replacement in a new namespace with a new IP.
    let old_c = members.remove(2);
    net.delete_namespace(&old_c.ns);
    old_c.host.unmount_all();
    rt.block_on(ec2.terminate_instances().instance_ids(&old_c.host.instance_id).send()).expect("terminate c");
    let c2 = new_member(&mut net, "c2", 14, "cp-c");
    assert_ne!(c2.ip, old_c.ip);
    let r = pass(&c2);
    assert!(r.last_line().starts_with("protokube: 1 volumes mounted, 1 manifests written"), "{}", r.last_line());
    assert!(!r.stderr.contains("formatting"), "the volume keeps its data: {}", r.stderr);
    assert_eq!(c2.host.manifest("main"), old_c.host.manifest("main"), "same member identity");
    for mb in &members {
        let r = pass(mb);
        assert!(r.last_line().ends_with("dns records") && !r.last_line().ends_with(" 0 dns records"), "{}: {}", mb.ns, r.last_line());
        let hosts = std::fs::read_to_string(Net::hosts_file(&mb.ns)).expect("hosts");
        assert!(hosts.contains(&format!("{}\tapi.internal.{NAME} etcd-c.internal.{NAME} kops-controller.internal.{NAME}\n", c2.ip)), "{hosts}");
        assert!(!hosts.contains(&format!("{}\t", old_c.ip)), "{hosts}");
    }
    net.start_etcd(&c2.ns, &c2.host, &logdir.path().join("etcd-c2.log"));
    for i in 0..20 {
        let v = etcdctl(&c2.ns, &ep(&c2), &["get", &format!("key{i}"), "--print-value-only"], Duration::from_secs(60));
        let v = v.lines().next().unwrap_or("");
        assert_eq!(v.trim(), format!("value{i}"), "key{i} from the replaced member\n{}", logs(logdir.path()));
    }
    // Its own data, not just a proxy to the leader: a serializable (local) read.
    let local = etcdctl(&c2.ns, &ep(&c2), &["get", "key19", "--print-value-only", "--consistency=s"], Duration::from_secs(30));
    assert_eq!(local.lines().next().unwrap_or(""), "value19");
    members.push(c2);

    // Member b loses its volume: a blank volume tagged for b replaces it, and a new instance comes up.
    let old_b = members.remove(1);
    net.delete_namespace(&old_b.ns);
    old_b.host.unmount_all();
    rt.block_on(async {
        ec2.terminate_instances().instance_ids(&old_b.host.instance_id).send().await.expect("terminate b");
        ec2.delete_volume().volume_id(&vols[1]).send().await.expect("delete b's volume");
    });
    let blank = LoopDev::new(256);
    let vb2 = rt.block_on(create_volume(&ec2, "us-east-1a", &etcd_tags(NAME, "main", "b", &all)));
    let b2 = new_member(&mut net, "b2", 15, "cp-b");
    b2.host.link(&vb2, &blank.dev);
    // No peer answers (both etcds down): the blank member must not decide to start a new cluster.
    let (a_ns, c_ns) = (members[0].ns.clone(), members[1].ns.clone());
    net.stop_etcd(&a_ns);
    net.stop_etcd(&c_ns);
    let r = pass(&b2);
    assert!(r.last_line().contains(" 0 manifests written"), "{}\n{}", r.last_line(), r.stderr);
    assert!(r.stderr.contains("blank volume: formatting ext4") && r.stderr.contains("mounted"), "{}", r.stderr);
    assert!(r.stderr.contains("no live peer answers; the cluster has run before"), "{}", r.stderr);
    // (--quorum-loss-wait 0 here) It says the cluster lost quorum and names the restore command.
    assert!(r.stderr.contains("QUORUM LOST") && r.stderr.contains("keelson etcd backup restore -f SPEC --etcd-cluster main --latest --yes"), "{}", r.stderr);
    assert!(b2.host.manifest("main").is_none(), "no manifest while undecided");
    let mount = b2.host.root.path().join(format!("mnt/master-{vb2}"));
    assert!(!mount.join(protokube::reconcile::BOOTSTRAP_FILE).exists(), "no bootstrap decision recorded");
    net.start_etcd(&a_ns, &members[0].host, &logdir.path().join("etcd-a-restarted.log"));
    net.start_etcd(&c_ns, &members[1].host, &logdir.path().join("etcd-c2-restarted.log"));
    let health = etcdctl(&a_ns, &ep(&members[0]), &["endpoint", "health"], Duration::from_secs(60));
    assert!(health.contains("is healthy"), "{health}\n{}", logs(logdir.path()));
    // Peers answer again: the member joins the existing cluster.
    let r = pass(&b2);
    // (an earlier pass of the retry loop may have written the manifest before etcd refused the change)
    assert!(r.last_line().contains(" 1 manifests written"), "{}\n{}", r.last_line(), r.stderr);
    assert!(r.stderr.contains("member has no data: removing and re-adding"), "{}", r.stderr);
    // A backup of the cluster as it was, taken from a peer before the membership changed (the
    // default backup store: <ConfigBase>/backups/etcd/main).
    let store = base::etcd_backup::BackupStore::new(base::StateStore::dir(&c.state.path().join("backups/etcd/main")));
    let backups = rt.block_on(store.list()).expect("list backups");
    assert!(
        backups.iter().any(|b| b.reason == "before member change" && b.members.len() == 3 && b.revision > 20),
        "no backup before the membership change: {backups:?}\n{}",
        r.stderr
    );
    let manifest = b2.host.manifest("main").expect("manifest");
    assert!(manifest.contains("--initial-cluster-state=existing"), "{manifest}");
    for mb in &members {
        pass(mb);
    }
    net.start_etcd(&b2.ns, &b2.host, &logdir.path().join("etcd-b2.log"));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = etcdctl(&b2.ns, &ep(&b2), &["get", "key7", "--print-value-only", "--consistency=s"], Duration::from_secs(60));
        if v.lines().next() == Some("value7") {
            break;
        }
        assert!(Instant::now() < deadline, "b2 never caught up\n{}", logs(logdir.path()));
        std::thread::sleep(Duration::from_millis(300));
    }
    let list = etcdctl(&b2.ns, &ep(&b2), &["member", "list"], Duration::from_secs(30));
    assert_eq!(list.lines().count(), 3, "{list}");
    assert!(list.contains("etcd-b") && list.contains("started"), "{list}");
    drop(net);
    let _ = PathBuf::new();
}
