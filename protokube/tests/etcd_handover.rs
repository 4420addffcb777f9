//! A control plane leaves gracefully: on a real 3-member TLS etcd cluster (members in network
//! namespaces, started from protokube's manifests by a stand-in kubelet, protokube in loop mode for
//! each), the leading member's host hands leadership over before it goes — once through the library
//! call protokube's signal path makes, once by SIGTERM to the real `protokube` process. Each time:
//! another member leads while the old leader's etcd still runs (so it was the hand-over, not etcd's
//! own stop, that moved it); a client writing a key every 50 ms through the other members sees no
//! failed write, neither during the hand-over nor when the old leader's machine then disappears
//! (its etcd killed -9).
//!
//! The writer retries a write once (each attempt bounded by [`WRITE_TIMEOUT`]), as clients do: raft
//! drops a proposal that reaches the leader in the few milliseconds its transfer is under way (etcd
//! answers it only at its request timeout), so about one transfer in ten costs one write a retry.
//! A write that fails twice is a failed write; the retries are printed.
//!
//! Needs root, iproute2, etcd-server/etcd-client (etcd, etcdctl) and moto; fails loudly without them.

#[path = "support/etcd_loop.rs"]
mod etcd_loop;
#[path = "support/etcd_net.rs"]
mod etcd_net;
#[path = "support/host.rs"]
mod host;
#[path = "../../cloud/tests/support/moto.rs"]
mod moto;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_loop::{wait_for, Fixture};
use etcd_net::need_tools;
use host::need_root;
use protokube::etcd::Client;
use protokube::handover::{self, Handover, Outcome, Peer};

/// How long one attempt at a write may take.
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// The member every member agrees leads, and the leader's member id.
fn leader(f: &Fixture) -> (usize, String) {
    wait_for(
        "a leader all three members agree on",
        Duration::from_secs(60),
        || {
            let statuses: Vec<protokube::etcd::Status> =
                (0..3).map(|i| f.rt.block_on(f.client(i, Duration::from_secs(2)).status()).ok()).collect::<Option<Vec<_>>>()?;
            let lead = statuses[0].leader.clone();
            if lead == "0" || statuses.iter().any(|s| s.leader != lead) {
                return None;
            }
            statuses.iter().position(|s| s.member_id == lead).map(|i| (i, lead))
        },
        || f.diag(),
    )
}

/// What member `i`'s etcd says the leader is (it must answer: its etcd still runs).
fn leader_seen_by(f: &Fixture, i: usize) -> String {
    f.rt.block_on(f.client(i, Duration::from_secs(2)).status()).unwrap_or_else(|e| panic!("member {i} answers its status: {e}\n{}", f.diag())).leader
}

/// One write: when it started (since the writer started), through which member, why its first
/// attempt failed (if it did), and how long it took in all or why the retry failed too.
#[derive(Debug)]
struct Write {
    at: Duration,
    through: String,
    first_attempt: Option<String>,
    result: Result<Duration, String>,
}

/// A client writing `handover/<n>` every 50 ms, in turn through each of `targets`, on its own
/// thread (it keeps writing while the test waits), until `stop`.
struct Writer {
    stop: Arc<AtomicBool>,
    started: Instant,
    thread: std::thread::JoinHandle<Vec<Write>>,
}

impl Writer {
    fn start(targets: Vec<(String, Client)>) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let started = Instant::now();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(50));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut writes = Vec::new();
                while !flag.load(Ordering::Relaxed) {
                    tick.tick().await;
                    let (name, client) = &targets[writes.len() % targets.len()];
                    let key = format!("handover/{:05}", writes.len());
                    let t = Instant::now();
                    let mut first_attempt = None;
                    let mut result = client.put(&key, "x").await;
                    if let Err(e) = &result {
                        first_attempt = Some(e.to_string());
                        result = client.put(&key, "x").await;
                    }
                    let result = result.map(|_| t.elapsed()).map_err(|e| e.to_string());
                    writes.push(Write { at: t - started, through: name.clone(), first_attempt, result });
                }
                writes
            })
        });
        Writer { stop, started, thread }
    }

    fn finish(self) -> Vec<Write> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("writer thread")
    }
}

/// Assert no write failed and say what the writer saw; `marks` are named moments (since `started`).
fn assert_no_failed_write(writes: &[Write], started: Instant, marks: &[(&str, Instant)], diag: &str) {
    let failed: Vec<String> = writes.iter().filter_map(|w| w.result.as_ref().err().map(|e| format!("at {:?} through {}: {e}", w.at, w.through))).collect();
    let retried: Vec<String> = writes.iter().filter_map(|w| w.first_attempt.as_ref().map(|e| format!("at {:?} through {}: {e}", w.at, w.through))).collect();
    let slowest = writes.iter().filter_map(|w| w.result.as_ref().ok()).max().copied().unwrap_or_default();
    // The longest time between two writes' successes (the writer's view of an outage).
    let done: Vec<Duration> = writes.iter().filter_map(|w| w.result.as_ref().ok().map(|d| w.at + *d)).collect();
    let gap = done.windows(2).map(|p| p[1].saturating_sub(p[0])).max().unwrap_or_default();
    let marks: Vec<String> = marks.iter().map(|(m, t)| format!("{m} at {:?}", t.duration_since(started))).collect();
    eprintln!(
        "writer: {} writes, {} failed, {} retried, slowest {slowest:?}, longest gap between successes {gap:?}; {}\n{}",
        writes.len(),
        failed.len(),
        retried.len(),
        marks.join(", "),
        retried.join("\n")
    );
    assert!(writes.len() >= 20, "the writer hardly wrote: {writes:?}");
    assert!(failed.is_empty(), "writes failed ({}):\n{}\n{diag}", marks.join(", "), failed.join("\n"));
}

/// The cluster, the leader found, and a writer going through the two other members.
fn start(m: &moto::Local, variant: u8, name: &str) -> (Fixture, usize, String, Vec<usize>) {
    let f = Fixture::start_tls(&m.url, variant, name, &[]);
    let (l, lead_id) = leader(&f);
    let others: Vec<usize> = (0..3).filter(|i| *i != l).collect();
    eprintln!("leader: etcd-{} ({lead_id})", f.members[l].tag);
    (f, l, lead_id, others)
}

fn writer_through(f: &Fixture, others: &[usize]) -> Writer {
    Writer::start(others.iter().map(|i| (format!("etcd-{}", f.members[*i].tag), f.client(*i, WRITE_TIMEOUT))).collect())
}

/// The old leader's machine disappears: its etcd killed -9 (and its protokube), as at the end of a
/// poweroff; the writer goes on for two seconds.
fn machine_gone(f: &mut Fixture, l: usize) -> Instant {
    let gone = Instant::now();
    if let Some(mut p) = f.members[l].protokube.take() {
        let _ = p.kill();
        let _ = p.wait();
    }
    f.members[l].kubelet.take();
    std::thread::sleep(Duration::from_secs(2));
    gone
}

#[test]
fn the_leader_hands_over_through_the_call_the_signal_path_makes() {
    need_root();
    need_tools();
    let (_g, m) = moto::lock();
    let (mut f, l, lead_id, others) = start(&m, 0, "handover.k8s.local");
    let writer = writer_through(&f, &others);
    std::thread::sleep(Duration::from_secs(1));

    let member = format!("etcd-{}", f.members[l].tag);
    let h = Handover {
        etcd: "main".into(),
        member: member.clone(),
        local: f.client(l, Duration::from_secs(2)),
        peers: others.iter().map(|i| Peer { name: format!("etcd-{}", f.members[*i].tag), client: f.client(*i, Duration::from_secs(2)) }).collect(),
    };
    let t = Instant::now();
    let reports = f.rt.block_on(handover::hand_over_all(vec![h.clone()], handover::DEFAULT_BOUND));
    let took = t.elapsed();
    // Before anything else: the old leader still runs and already follows another member.
    let seen = leader_seen_by(&f, l);
    assert_ne!(seen, lead_id, "the old leader still leads after the hand-over returned\n{}", f.diag());
    let new =
        (0..3).find(|i| f.rt.block_on(f.client(*i, Duration::from_secs(2)).status()).is_ok_and(|s| s.member_id == seen)).expect("the new leader is a member");
    assert!(others.contains(&new));
    assert_eq!(leader_seen_by(&f, new), seen, "the new leader knows it leads");
    assert_eq!(reports.len(), 1);
    match &reports[0].result {
        Ok(Outcome::Moved { to, to_id, took }) => {
            assert_eq!(to, &format!("etcd-{}", f.members[new].tag));
            assert_eq!(to_id, &seen);
            eprintln!("leadership moved from {member} to {to} in {took:?}");
        }
        other => panic!("not moved: {other:?}\n{}", f.diag()),
    }
    assert!(took < handover::DEFAULT_BOUND, "{took:?}");
    // A member that no longer leads has nothing to hand over.
    let again = f.rt.block_on(handover::hand_over(&h)).expect("second hand-over");
    assert_eq!(again, Outcome::NotLeader { leader: seen.clone() });

    let gone = machine_gone(&mut f, l);
    let started = writer.started;
    let writes = writer.finish();
    assert_no_failed_write(&writes, started, &[("hand-over", t), ("machine gone", gone)], &f.diag());
}

#[test]
fn sigterm_to_protokube_hands_over_before_it_exits() {
    need_root();
    need_tools();
    let (_g, m) = moto::lock();
    let (mut f, l, lead_id, others) = start(&m, 1, "sigterm.k8s.local");
    let writer = writer_through(&f, &others);
    // Every protokube has run passes (it knows its peers): the cluster is up through them.
    std::thread::sleep(Duration::from_secs(2));

    let mut protokube = f.members[l].protokube.take().expect("protokube runs");
    let pid = protokube.id();
    let t = Instant::now();
    let kill = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().expect("kill");
    assert!(kill.success());
    let status =
        wait_for("protokube to exit after SIGTERM", handover::DEFAULT_BOUND + Duration::from_secs(5), || protokube.try_wait().expect("try_wait"), || f.diag());
    let took = t.elapsed();
    assert!(status.success(), "protokube exited with {status}\n{}", f.diag());
    // The old leader's etcd still runs (protokube stopped nothing) and follows another member.
    let seen = leader_seen_by(&f, l);
    assert_ne!(seen, lead_id, "the old leader still leads after protokube exited\n{}", f.diag());
    assert!(others.iter().any(|i| leader_seen_by(&f, *i) == seen));
    let log = std::fs::read_to_string(f.logdir.path().join(format!("protokube-{}.log", f.members[l].tag))).expect("protokube log");
    for line in ["stopping: handing etcd leadership over first", "etcd member leaving", "etcd leadership handed over before stopping"] {
        assert!(log.contains(line), "protokube did not log {line:?}:\n{log}");
    }
    eprintln!("protokube exited {took:?} after SIGTERM");

    let gone = machine_gone(&mut f, l);
    let started = writer.started;
    let writes = writer.finish();
    assert_no_failed_write(&writes, started, &[("SIGTERM", t), ("machine gone", gone)], &f.diag());
}
