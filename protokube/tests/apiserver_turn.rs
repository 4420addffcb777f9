//! API server restarts take turns in a real etcd (Debian's etcd-server, one member on 127.0.0.1):
//! three control planes whose certificates fall due at the same moment restart their API servers
//! one after the other, never two at once; a turn left by a dead holder is taken over once stale; a
//! turn that stays taken delays a restart only as long as the certificate allows; an API server that
//! is not serving restarts at once. The API servers are stand-ins (`/readyz` fails for a while after
//! each restart); the turn is the product's, in etcd, through the product's client.
//! Needs `etcd` (Debian package etcd-server; scripts/test installs it); fails loudly without it.

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use protokube::api_target::Readiness;
use protokube::apiserver_turn::{take_turn_and_restart, turn_value, EtcdTurn, Outcome, LINGER, TURN_KEY, TURN_TTL};
use protokube::etcd;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

/// One etcd member on loopback; killed on drop.
struct Etcd {
    child: Child,
    addr: std::net::SocketAddr,
    _dir: tempfile::TempDir,
}

impl Etcd {
    fn start() -> Etcd {
        let ok = Command::new("sh").args(["-c", "command -v etcd"]).output().map(|o| o.status.success()).unwrap_or(false);
        assert!(ok, "this test needs `etcd` (Debian package etcd-server; scripts/test installs it)");
        let dir = tempfile::tempdir().expect("tempdir");
        let (client, peer) = (free_port(), free_port());
        let c = format!("http://127.0.0.1:{client}");
        let p = format!("http://127.0.0.1:{peer}");
        let child = Command::new("etcd")
            .args(["--name", "turns", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &c, "--advertise-client-urls", &c, "--listen-peer-urls", &p, "--initial-advertise-peer-urls", &p])
            .args(["--initial-cluster", &format!("turns={p}")])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("etcd.log")).expect("log"))
            .spawn()
            .expect("start etcd");
        Etcd { child, addr: ([127, 0, 0, 1], client).into(), _dir: dir }
    }

    fn client(&self) -> etcd::Client {
        etcd::Client::new("http", "127.0.0.1", self.addr, None, Duration::from_secs(5)).expect("client")
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.client().status().await.is_err() {
            assert!(Instant::now() < deadline, "etcd did not answer within 30 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A stand-in API server: `/readyz` fails until `down_until`.
#[derive(Clone, Default)]
struct FakeApiServer {
    down_until: Arc<Mutex<Option<Instant>>>,
}

impl FakeApiServer {
    fn restart_for(&self, d: Duration) {
        *self.down_until.lock().expect("lock") = Some(Instant::now() + d);
    }
}

impl Readiness for FakeApiServer {
    async fn ready(&mut self) -> bool {
        self.down_until.lock().expect("lock").is_none_or(|t| Instant::now() >= t)
    }
}

const DOWN: Duration = Duration::from_millis(1500);

/// Restart `host`'s stand-in in turn; the restart's window (restart call → back in turn).
async fn restart(turn: &EtcdTurn, host: &str, max_wait: Duration, log: Arc<Mutex<Vec<(String, Instant, Instant)>>>) -> Outcome {
    let mut api = FakeApiServer::default();
    let no_proc = tempfile::tempdir().expect("proc");
    let mut began = None;
    let outcome = take_turn_and_restart(
        Some(turn),
        &mut api.clone(),
        no_proc.path(),
        host,
        max_wait,
        || {
            began = Some(Instant::now());
            api.restart_for(DOWN);
            Ok::<(), ()>(())
        },
        |_| {},
    )
    .await
    .expect("restart");
    // In turn, the stand-in answers again by now (the holder waited for it before giving the turn back).
    if matches!(outcome, Outcome::InTurn { .. }) {
        assert!(api.ready().await, "{host}: gave the turn back before its API server was ready again");
    }
    log.lock().expect("lock").push((host.to_string(), began.expect("restarted"), Instant::now()));
    outcome
}

#[test]
fn api_server_restarts_take_turns_in_etcd() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async {
        let etcd = Etcd::start();
        etcd.wait_ready().await;
        let turns: Vec<EtcdTurn> = (0..3).map(|_| EtcdTurn { client: etcd.client() }).collect();

        // 1. Three control planes due at the same moment: one restart at a time.
        let log = Arc::new(Mutex::new(Vec::new()));
        let start = Instant::now();
        let outcomes = futures_util::future::join_all(
            ["i-a", "i-b", "i-c"].iter().zip(&turns).map(|(host, turn)| restart(turn, host, Duration::from_secs(60), log.clone())),
        )
        .await;
        for o in &outcomes {
            assert!(matches!(o, Outcome::InTurn { .. }), "every restart in turn: {outcomes:?}");
        }
        let mut windows = log.lock().expect("lock").clone();
        windows.sort_by_key(|w| w.1);
        for pair in windows.windows(2) {
            let ((a, _, a_end), (b, b_start, _)) = (&pair[0], &pair[1]);
            assert!(b_start >= a_end, "{b} restarted before {a}'s API server was back: {windows:?}");
        }
        assert!(start.elapsed() >= DOWN * 3, "three restarts one after the other take at least three outages");
        let (value, _) = etcd.client().get(TURN_KEY).await.expect("get").expect("the key stays");
        assert_eq!(value, "", "the last holder gave the turn back");

        // 2. A holder that died: its turn is taken over once stale, not before.
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs() as i64;
        let c = etcd.client();
        c.put(TURN_KEY, &turn_value("i-dead", now - TURN_TTL.as_secs() as i64 - 1)).await.expect("put");
        let o = restart(&turns[0], "i-a", Duration::from_secs(5), log.clone()).await;
        assert!(matches!(o, Outcome::InTurn { waited, .. } if waited < Duration::from_secs(2)), "a stale turn is free: {o:?}");

        // 3. A live holder that does not give the turn back: the restart waits only as long as
        //    allowed, then goes ahead without the turn (the certificate must not expire in use).
        c.put(TURN_KEY, &turn_value("i-busy", now)).await.expect("put");
        let t = Instant::now();
        let o = restart(&turns[1], "i-b", Duration::from_secs(2), log.clone()).await;
        assert_eq!(o, Outcome::WithoutTurn("the turn was not free in time"));
        assert!(t.elapsed() >= Duration::from_secs(2), "it waited for the turn first");
        assert_eq!(c.get(TURN_KEY).await.expect("get").map(|(v, _)| v), Some(turn_value("i-busy", now)), "someone else's turn is never given back");

        // 4. An API server that is not serving restarts at once, turn or no turn.
        let mut down = FakeApiServer::default();
        down.restart_for(Duration::from_secs(60));
        let no_proc = tempfile::tempdir().expect("proc");
        let t = Instant::now();
        let o = take_turn_and_restart(Some(&turns[2]), &mut down, no_proc.path(), "i-c", Duration::from_secs(30), || Ok::<(), ()>(()), |_| {})
            .await
            .expect("restart");
        assert!(matches!(o, Outcome::WithoutTurn(_)), "{o:?}");
        assert!(t.elapsed() < Duration::from_secs(5), "no wait for a turn");

        // 5. An old API server that stopped answering but lingers (kubernetes#131052) is ended
        //    after LINGER, not left to the kubelet's 30-s grace; the new one then comes up.
        c.put(TURN_KEY, "").await.expect("put");
        let proc = tempfile::tempdir().expect("proc");
        std::fs::create_dir(proc.path().join("4242")).expect("pid dir");
        std::fs::write(proc.path().join("4242/comm"), "kube-apiserver\n").expect("comm");
        let api = FakeApiServer::default();
        let ended = Arc::new(Mutex::new(Vec::<Vec<u32>>::new()));
        let end = {
            let (api, ended, pid_dir) = (api.clone(), ended.clone(), proc.path().join("4242"));
            move |pids: &[u32]| {
                ended.lock().expect("lock").push(pids.to_vec());
                let _ = std::fs::remove_dir_all(&pid_dir);
                api.restart_for(Duration::from_millis(500));
            }
        };
        let o = take_turn_and_restart(
            Some(&turns[0]),
            &mut api.clone(),
            proc.path(),
            "i-a",
            Duration::from_secs(5),
            || {
                api.restart_for(Duration::from_secs(600));
                Ok::<(), ()>(())
            },
            end,
        )
        .await
        .expect("restart");
        assert_eq!(*ended.lock().expect("lock"), vec![vec![4242u32]], "the lingering old process was ended, once");
        match o {
            Outcome::InTurn { ready_after, .. } => {
                assert!(ready_after >= LINGER && ready_after < LINGER + Duration::from_secs(6), "ended after LINGER, then ready: {ready_after:?}")
            }
            other => panic!("{other:?}"),
        }
    });
}
