//! The local cloud's network load balancers: each listener of a network load balancer in moto (the
//! API load balancer `keelson apply` creates, and those the cloud-controller-manager creates for
//! Services of `type: LoadBalancer`) becomes a TCP listener on the host that behaves as an NLB does:
//!
//! - new connections go, round robin, only to targets **registered** in the listener's target group
//!   that pass the target group's **TCP health check** (interval and thresholds from the target
//!   group; a new target starts unhealthy, as an NLB's `initial`); when no registered target is
//!   healthy, the NLB fails open and uses them all;
//! - a connection to a target that refuses is not retried elsewhere: the client sees the failure, as
//!   it would on AWS until the health check marks the target unhealthy;
//! - a target that leaves the target group (deregistered, or its instance gone) gets no new
//!   connection at once, and its open connections are cut when the target group's deregistration
//!   delay has passed (`connection_termination.enabled`, which Keelson sets).
//!
//! The membership and health rules are pure functions on [`ListenerState`]; [`Balancers`] owns the
//! sockets and the relay tasks on a tokio runtime.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::cloud::HealthCheck;

/// What one listener should be, as read from moto.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    /// Stable identity: load balancer ARN and listener port.
    pub key: String,
    /// The load balancer's name (for events).
    pub name: String,
    /// `namespace/name` of the Service it was made for, if any.
    pub service: Option<String>,
    /// Whether this is the cluster's API load balancer (served on the daemon's API port).
    pub api: bool,
    pub targets: BTreeSet<SocketAddr>,
    pub health: HealthCheck,
    pub deregistration_delay: Duration,
    /// The target group it forwards to, when it has one (not the stand-in below).
    pub target_group: Option<TargetGroupRef>,
}

/// A listener's target group, as the deregistration follower needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetGroupRef {
    pub arn: String,
    /// The port of a target registered without one.
    pub port: i32,
    /// Each target's address → its instance id.
    pub ids: BTreeMap<SocketAddr, String>,
}

/// The targets of `group` that are no longer among its `members` (instance id, port), as
/// `DescribeTargetHealth` lists them (draining ones left out).
pub fn departed(group: &TargetGroupRef, members: &BTreeSet<(String, i32)>) -> BTreeSet<SocketAddr> {
    group.ids.iter().filter(|(addr, id)| !members.contains(&((*id).clone(), i32::from(addr.port())))).map(|(addr, _)| *addr).collect()
}

/// The API's load balancer when the spec has none (a DNS-only API): every control-plane machine
/// on 443, health-checked like the real one.
pub fn api_stand_in(machines: &[crate::machine::MachineInfo]) -> Desired {
    Desired {
        key: "keelson-local:api".into(),
        name: "api (no load balancer in the spec: every control plane)".into(),
        service: None,
        api: true,
        targets: machines.iter().filter(|m| m.role == "control-plane").filter_map(|m| format!("{}:443", m.ip).parse().ok()).collect(),
        health: HealthCheck { interval: Duration::from_secs(10), healthy_threshold: 2, unhealthy_threshold: 2, port: None },
        deregistration_delay: Duration::from_secs(30),
        target_group: None,
    }
}

/// One target as the load balancer sees it.
#[derive(Debug)]
pub struct Target {
    pub healthy: bool,
    ok: u32,
    failed: u32,
    /// When it left the target group (draining until the deregistration delay has passed).
    pub deregistered_at: Option<Instant>,
    /// Closes the target's open connections when set to true.
    cut: watch::Sender<bool>,
}

impl Target {
    fn new() -> Target {
        Target { healthy: false, ok: 0, failed: 0, deregistered_at: None, cut: watch::channel(false).0 }
    }
    pub fn registered(&self) -> bool {
        self.deregistered_at.is_none()
    }
}

#[derive(Debug)]
pub struct ListenerState {
    pub targets: BTreeMap<SocketAddr, Target>,
    pub health: HealthCheck,
    pub deregistration_delay: Duration,
    next: usize,
}

/// What changed in a listener's membership, for the daemon's events.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub registered: Vec<SocketAddr>,
    pub deregistered: Vec<SocketAddr>,
    /// Targets whose deregistration delay ended: their connections were cut.
    pub drained: Vec<SocketAddr>,
}

impl ListenerState {
    pub fn new(health: HealthCheck, deregistration_delay: Duration) -> ListenerState {
        ListenerState { targets: BTreeMap::new(), health, deregistration_delay, next: 0 }
    }

    /// Follow the target group: new members are added (unhealthy until checked), members that
    /// left start draining, a member that comes back stops draining and is checked again from
    /// the start (`initial`), and drained targets whose
    /// delay has passed are cut and forgotten.
    pub fn set_members(&mut self, members: &BTreeSet<SocketAddr>, now: Instant) -> Changes {
        let mut c = Changes::default();
        for m in members {
            let t = self.targets.entry(*m).or_insert_with(|| {
                c.registered.push(*m);
                Target::new()
            });
            if t.deregistered_at.take().is_some() {
                // Registered again: `initial` again, as on an NLB (checked before it gets clients).
                (t.healthy, t.ok, t.failed) = (false, 0, 0);
                c.registered.push(*m);
            }
        }
        for (addr, t) in self.targets.iter_mut() {
            if !members.contains(addr) && t.deregistered_at.is_none() {
                t.deregistered_at = Some(now);
                c.deregistered.push(*addr);
            }
        }
        let delay = self.deregistration_delay;
        let done: Vec<SocketAddr> =
            self.targets.iter().filter(|(_, t)| t.deregistered_at.is_some_and(|at| now.duration_since(at) >= delay)).map(|(a, _)| *a).collect();
        for a in done {
            if let Some(t) = self.targets.remove(&a) {
                let _ = t.cut.send(true);
                c.drained.push(a);
            }
        }
        c
    }

    /// Record one health check of `addr`; returns the new health when it flipped.
    pub fn record_check(&mut self, addr: SocketAddr, ok: bool) -> Option<bool> {
        let hc = self.health;
        let t = self.targets.get_mut(&addr)?;
        if ok {
            t.ok += 1;
            t.failed = 0;
            if !t.healthy && t.ok >= hc.healthy_threshold {
                t.healthy = true;
                return Some(true);
            }
        } else {
            t.failed += 1;
            t.ok = 0;
            if t.healthy && t.failed >= hc.unhealthy_threshold {
                t.healthy = false;
                return Some(false);
            }
        }
        None
    }

    /// The target for a new connection: round robin over the registered healthy targets, or over
    /// all registered targets when none is healthy (fail open); none when nothing is registered.
    pub fn choose(&mut self) -> Option<(SocketAddr, watch::Receiver<bool>)> {
        let healthy: Vec<(&SocketAddr, &Target)> = self.targets.iter().filter(|(_, t)| t.registered() && t.healthy).collect();
        let pool: Vec<(&SocketAddr, &Target)> = if healthy.is_empty() { self.targets.iter().filter(|(_, t)| t.registered()).collect() } else { healthy };
        if pool.is_empty() {
            return None;
        }
        self.next = self.next.wrapping_add(1);
        let (addr, t) = pool[self.next % pool.len()];
        Some((*addr, t.cut.subscribe()))
    }

    /// The registered targets to health-check.
    pub fn registered(&self) -> Vec<SocketAddr> {
        self.targets.iter().filter(|(_, t)| t.registered()).map(|(a, _)| *a).collect()
    }
}

/// A listener on the host, relaying to its targets.
struct Running {
    desired: Desired,
    addr: SocketAddr,
    state: Arc<Mutex<ListenerState>>,
    stop: watch::Sender<bool>,
}

/// The local cloud's load balancers on the host.
pub struct Balancers {
    rt: tokio::runtime::Handle,
    /// The socket the API load balancer is served on (its port is in the admin kubeconfig).
    api_socket: Mutex<Option<std::net::TcpListener>>,
    api_addr: SocketAddr,
    running: Mutex<BTreeMap<String, Running>>,
    events: Arc<dyn Fn(String) + Send + Sync>,
}

impl Balancers {
    pub fn new(rt: tokio::runtime::Handle, api_socket: std::net::TcpListener, events: Arc<dyn Fn(String) + Send + Sync>) -> std::io::Result<Balancers> {
        let api_addr = api_socket.local_addr()?;
        api_socket.set_nonblocking(true)?;
        Ok(Balancers { rt, api_socket: Mutex::new(Some(api_socket)), api_addr, running: Mutex::new(BTreeMap::new()), events })
    }

    /// Make the host's listeners what `desired` says: start new ones, follow target-group changes,
    /// stop those whose load balancer is gone. Returns Service → URLs of its listeners.
    pub fn sync(&self, desired: Vec<Desired>) -> BTreeMap<String, Vec<String>> {
        let Ok(mut running) = self.running.lock() else { return BTreeMap::new() };
        let now = Instant::now();
        let keys: BTreeSet<String> = desired.iter().map(|d| d.key.clone()).collect();
        let gone: Vec<String> = running.keys().filter(|k| !keys.contains(*k)).cloned().collect();
        for k in gone {
            if let Some(r) = running.remove(&k) {
                let _ = r.stop.send(true);
                if r.desired.api {
                    // The API port is fixed: a later API load balancer takes it over again.
                    (self.events)(format!("load balancer {}: gone", r.desired.name));
                    if let Ok(s) = std::net::TcpListener::bind(r.addr) {
                        let _ = s.set_nonblocking(true);
                        if let Ok(mut a) = self.api_socket.lock() {
                            *a = Some(s);
                        }
                    }
                } else {
                    (self.events)(format!("load balancer {} ({}): gone", r.desired.name, r.addr));
                }
            }
        }
        for d in desired {
            if let Some(r) = running.get_mut(&d.key) {
                if let Ok(mut st) = r.state.lock() {
                    st.health = d.health;
                    st.deregistration_delay = d.deregistration_delay;
                    let c = st.set_members(&d.targets, now);
                    self.report(&d.name, &c);
                }
                r.desired = d;
                continue;
            }
            match self.start(&d, now) {
                Ok(r) => {
                    (self.events)(format!("load balancer {}: listening on {} for {} target(s)", d.name, r.addr, d.targets.len()));
                    running.insert(d.key.clone(), r);
                }
                Err(e) => (self.events)(format!("load balancer {}: {e}", d.name)),
            }
        }
        let mut urls: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for r in running.values() {
            if let Some(s) = &r.desired.service {
                urls.entry(s.clone()).or_default().push(format!("http://{}", r.addr));
            }
        }
        urls
    }

    /// The listeners that forward to a target group: (key, the group).
    pub fn target_groups(&self) -> Vec<(String, TargetGroupRef)> {
        let Ok(running) = self.running.lock() else { return vec![] };
        running.iter().filter_map(|(k, r)| Some((k.clone(), r.desired.target_group.clone()?))).collect()
    }

    /// An NLB stops opening connections to a target as soon as it is deregistered: take the
    /// targets of listener `key` that are no longer `members` (instance id, port) of its target
    /// group out now, without waiting for the next full [`Balancers::sync`] (which lists every
    /// load balancer, listener and attribute, and runs in the daemon's reconcile pass).
    pub fn follow_members(&self, key: &str, members: &BTreeSet<(String, i32)>) {
        let Ok(mut running) = self.running.lock() else { return };
        let Some(r) = running.get_mut(key) else { return };
        let Some(group) = r.desired.target_group.as_mut() else { return };
        let gone = departed(group, members);
        if gone.is_empty() {
            return;
        }
        group.ids.retain(|a, _| !gone.contains(a));
        r.desired.targets.retain(|a| !gone.contains(a));
        let changes = match r.state.lock() {
            Ok(mut st) => {
                let keep: BTreeSet<SocketAddr> = st.registered().into_iter().filter(|a| !gone.contains(a)).collect();
                st.set_members(&keep, Instant::now())
            }
            Err(_) => return,
        };
        let name = r.desired.name.clone();
        self.report(&name, &changes);
    }

    fn report(&self, name: &str, c: &Changes) {
        for a in &c.registered {
            (self.events)(format!("load balancer {name}: target {a} registered"));
        }
        for a in &c.deregistered {
            (self.events)(format!("load balancer {name}: target {a} deregistered (no new connections; draining)"));
        }
        for a in &c.drained {
            (self.events)(format!("load balancer {name}: target {a} drained (deregistration delay over; connections closed)"));
        }
    }

    fn start(&self, d: &Desired, now: Instant) -> std::io::Result<Running> {
        let std_listener = if d.api {
            let taken = self.api_socket.lock().ok().and_then(|mut s| s.take());
            match taken {
                Some(s) => s,
                None => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::AddrInUse,
                        format!("the API port {} is served by another load balancer", self.api_addr),
                    ))
                }
            }
        } else {
            let s = std::net::TcpListener::bind(("127.0.0.1", 0))?;
            s.set_nonblocking(true)?;
            s
        };
        let addr = std_listener.local_addr()?;
        let mut st = ListenerState::new(d.health, d.deregistration_delay);
        st.set_members(&d.targets, now);
        let state = Arc::new(Mutex::new(st));
        let (stop, stop_rx) = watch::channel(false);
        let _guard = self.rt.enter();
        let listener = TcpListener::from_std(std_listener)?;
        self.rt.spawn(accept_loop(d.name.clone(), listener, state.clone(), stop_rx.clone(), self.events.clone()));
        self.rt.spawn(health_loop(d.name.clone(), state.clone(), stop_rx, self.events.clone()));
        Ok(Running { desired: d.clone(), addr, state, stop })
    }
}

/// How often the deregistration follower asks the target groups for their members.
const FOLLOW_EVERY: Duration = Duration::from_millis(250);

/// Follow the target groups' deregistrations as an NLB does, on a thread of its own: every
/// [`FOLLOW_EVERY`], one `DescribeTargetHealth` per listener's target group, and a target no longer
/// in it gets no new connection from then on ([`Balancers::follow_members`]). The reconcile pass
/// syncs everything else (new targets, listeners, health settings) but takes seconds on a busy
/// host: a control plane that deregisters itself at poweroff and then stops its API server 2 s
/// later must be out of the balancer by then. Ends with the balancers.
pub fn follow_deregistrations(balancers: std::sync::Weak<Balancers>, endpoint: String, region: String) {
    std::thread::spawn(move || {
        let cloud = crate::cloud::Cloud::new(&endpoint, &region);
        loop {
            std::thread::sleep(FOLLOW_EVERY);
            let Some(b) = balancers.upgrade() else { return };
            for (key, group) in b.target_groups() {
                // A failed call changes nothing: the reconcile pass still follows moto.
                if let Ok(members) = cloud.target_group_members(&group.arn, group.port) {
                    b.follow_members(&key, &members);
                }
            }
        }
    });
}

/// How long a connection to a target may take to open (as an NLB, the client sees the wait).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

async fn accept_loop(
    name: String,
    listener: TcpListener,
    state: Arc<Mutex<ListenerState>>,
    mut stop: watch::Receiver<bool>,
    events: Arc<dyn Fn(String) + Send + Sync>,
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.changed() => return,
        };
        let Ok((mut inbound, _)) = accepted else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let chosen = state.lock().ok().and_then(|mut s| s.choose());
        // Nothing registered: the connection is refused (dropped here).
        let Some((target, mut cut)) = chosen else { continue };
        let (name, events) = (name.clone(), events.clone());
        tokio::spawn(async move {
            // A failed connection is an event (the client sees it): which target, and why.
            let started = Instant::now();
            let mut out = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target)).await {
                Ok(Ok(out)) => out,
                Ok(Err(e)) => return events(format!("load balancer {name}: connection to target {target} failed after {:?}: {e}", started.elapsed())),
                Err(_) => return events(format!("load balancer {name}: connection to target {target} not open after {CONNECT_TIMEOUT:?}")),
            };
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut inbound, &mut out) => {}
                _ = cut.wait_for(|c| *c) => {}
            }
        });
    }
}

async fn health_loop(name: String, state: Arc<Mutex<ListenerState>>, mut stop: watch::Receiver<bool>, events: Arc<dyn Fn(String) + Send + Sync>) {
    loop {
        let (targets, hc) = match state.lock() {
            Ok(s) => (s.registered(), s.health),
            Err(_) => return,
        };
        let timeout = hc.interval.min(Duration::from_secs(10));
        let mut checks = tokio::task::JoinSet::new();
        for t in targets {
            let probe = match hc.port {
                Some(p) => SocketAddr::new(t.ip(), p as u16),
                None => t,
            };
            checks.spawn(async move { (t, matches!(tokio::time::timeout(timeout, TcpStream::connect(probe)).await, Ok(Ok(_)))) });
        }
        while let Some(Ok((t, ok))) = checks.join_next().await {
            let flipped = state.lock().ok().and_then(|mut s| s.record_check(t, ok));
            if let Some(h) = flipped {
                events(format!("load balancer {name}: target {t} {}", if h { "healthy" } else { "unhealthy" }));
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(hc.interval) => {}
            _ = stop.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hc() -> HealthCheck {
        HealthCheck { interval: Duration::from_secs(10), healthy_threshold: 2, unhealthy_threshold: 2, port: None }
    }
    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn new_targets_start_unhealthy_and_fail_open() {
        let mut st = ListenerState::new(hc(), Duration::from_secs(30));
        let now = Instant::now();
        let c = st.set_members(&BTreeSet::from([a("10.0.0.1:443"), a("10.0.0.2:443")]), now);
        assert_eq!(c.registered.len(), 2);
        // None healthy yet: fail open over both.
        let picks: BTreeSet<SocketAddr> = (0..4).filter_map(|_| st.choose().map(|(t, _)| t)).collect();
        assert_eq!(picks.len(), 2);
        // One passes two checks: only it gets connections.
        assert_eq!(st.record_check(a("10.0.0.1:443"), true), None);
        assert_eq!(st.record_check(a("10.0.0.1:443"), true), Some(true));
        assert!((0..4).all(|_| st.choose().map(|(t, _)| t) == Some(a("10.0.0.1:443"))));
    }

    #[test]
    fn unhealthy_after_threshold_failures_only() {
        let mut st = ListenerState::new(hc(), Duration::from_secs(30));
        let now = Instant::now();
        st.set_members(&BTreeSet::from([a("10.0.0.1:443"), a("10.0.0.2:443")]), now);
        for t in ["10.0.0.1:443", "10.0.0.2:443"] {
            st.record_check(a(t), true);
            st.record_check(a(t), true);
        }
        // One failed check is not enough (the NLB keeps sending: clients see the failures).
        assert_eq!(st.record_check(a("10.0.0.2:443"), false), None);
        assert!((0..4).any(|_| st.choose().map(|(t, _)| t) == Some(a("10.0.0.2:443"))));
        assert_eq!(st.record_check(a("10.0.0.2:443"), false), Some(false));
        assert!((0..4).all(|_| st.choose().map(|(t, _)| t) == Some(a("10.0.0.1:443"))));
    }

    #[test]
    fn deregistered_targets_get_no_new_connections_and_are_cut_after_the_delay() {
        let mut st = ListenerState::new(hc(), Duration::from_secs(30));
        let t0 = Instant::now();
        let (one, two) = (a("10.0.0.1:443"), a("10.0.0.2:443"));
        st.set_members(&BTreeSet::from([one, two]), t0);
        for t in [one, two] {
            st.record_check(t, true);
            st.record_check(t, true);
        }
        // A connection to `two` is open when it is deregistered.
        let mut open = None;
        for _ in 0..4 {
            if let Some((t, rx)) = st.choose() {
                if t == two {
                    open = Some(rx);
                }
            }
        }
        let open = open.expect("round robin reaches both");
        let c = st.set_members(&BTreeSet::from([one]), t0 + Duration::from_secs(1));
        assert_eq!(c.deregistered, vec![two]);
        assert!((0..4).all(|_| st.choose().map(|(t, _)| t) == Some(one)), "no new connection to a draining target");
        assert_eq!(st.registered(), vec![one], "draining targets are not health-checked");
        // Still within the delay: the open connection lives.
        let c = st.set_members(&BTreeSet::from([one]), t0 + Duration::from_secs(30));
        assert!(c.drained.is_empty());
        assert!(!*open.borrow());
        let c = st.set_members(&BTreeSet::from([one]), t0 + Duration::from_secs(31));
        assert_eq!(c.drained, vec![two]);
        assert!(*open.borrow(), "the draining target's connections are closed when the delay is over");
        assert!(!st.targets.contains_key(&two));
    }

    #[test]
    fn a_target_registered_again_is_checked_again_before_it_gets_clients() {
        let mut st = ListenerState::new(hc(), Duration::from_secs(30));
        let t0 = Instant::now();
        let (one, two) = (a("10.0.0.1:443"), a("10.0.0.2:443"));
        st.set_members(&BTreeSet::from([one, two]), t0);
        for t in [one, two] {
            st.record_check(t, true);
            st.record_check(t, true);
        }
        st.set_members(&BTreeSet::from([one]), t0 + Duration::from_secs(1));
        st.set_members(&BTreeSet::from([one, two]), t0 + Duration::from_secs(2));
        assert!((0..4).all(|_| st.choose().map(|(t, _)| t) == Some(one)), "back in, but `initial` until it passes its checks again");
        st.record_check(two, true);
        assert_eq!(st.record_check(two, true), Some(true));
    }

    #[test]
    fn a_target_that_returns_stops_draining_and_nothing_registered_means_no_target() {
        let mut st = ListenerState::new(hc(), Duration::from_secs(30));
        let t0 = Instant::now();
        let one = a("10.0.0.1:443");
        st.set_members(&BTreeSet::from([one]), t0);
        st.set_members(&BTreeSet::new(), t0);
        assert!(st.choose().is_none(), "only draining targets: the connection is refused");
        let c = st.set_members(&BTreeSet::from([one]), t0 + Duration::from_secs(5));
        assert_eq!(c.registered, vec![one]);
        assert!(st.choose().is_some());
        let c = st.set_members(&BTreeSet::from([one]), t0 + Duration::from_secs(60));
        assert!(c.drained.is_empty(), "re-registered, so never drained");
    }

    #[test]
    fn a_target_that_leaves_its_group_is_taken_out_before_the_next_sync() {
        let (x, y) = (a("10.0.0.1:443"), a("10.0.0.2:443"));
        let group = TargetGroupRef { arn: "arn:tg/api".into(), port: 443, ids: BTreeMap::from([(x, "i-x".to_string()), (y, "i-y".to_string())]) };
        let members = |m: &[(&str, i32)]| m.iter().map(|(id, p)| (id.to_string(), *p)).collect::<BTreeSet<_>>();
        assert_eq!(departed(&group, &members(&[("i-x", 443), ("i-y", 443)])), BTreeSet::new());
        // Another port of the same instance is not the same target.
        assert_eq!(departed(&group, &members(&[("i-x", 443), ("i-y", 8443)])), BTreeSet::from([y]));
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let events = Arc::new(Mutex::new(Vec::<String>::new()));
        let seen = events.clone();
        let b =
            Balancers::new(rt.handle().clone(), std::net::TcpListener::bind("127.0.0.1:0").unwrap(), Arc::new(move |m| seen.lock().unwrap().push(m))).unwrap();
        b.sync(vec![Desired {
            key: "arn:lb/api:443".into(),
            name: "api".into(),
            service: None,
            api: true,
            targets: BTreeSet::from([x, y]),
            health: hc(),
            deregistration_delay: Duration::from_secs(30),
            target_group: Some(group),
        }]);
        assert_eq!(b.target_groups().len(), 1);
        b.follow_members("arn:lb/api:443", &members(&[("i-x", 443)]));
        let registered = b.running.lock().unwrap()["arn:lb/api:443"].state.lock().unwrap().registered();
        assert_eq!(registered, vec![x]);
        assert_eq!(b.target_groups()[0].1.ids.keys().copied().collect::<Vec<_>>(), vec![x]);
        assert!(events.lock().unwrap().iter().any(|e| e.contains("10.0.0.2:443 deregistered")), "{:?}", events.lock().unwrap());
        // Followed once: the same membership again changes nothing and says nothing.
        let n = events.lock().unwrap().len();
        b.follow_members("arn:lb/api:443", &members(&[("i-x", 443)]));
        assert_eq!(events.lock().unwrap().len(), n);
    }

    #[test]
    fn relays_to_healthy_targets_and_cuts_after_deregistration() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let backend = rt.block_on(async { TcpListener::bind("127.0.0.1:0").await.unwrap() });
        let backend_addr = backend.local_addr().unwrap();
        rt.spawn(async move {
            loop {
                let Ok((mut s, _)) = backend.accept().await else { return };
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        let api = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let api_addr = api.local_addr().unwrap();
        let b = Balancers::new(rt.handle().clone(), api, Arc::new(|_| {})).unwrap();
        let desired = |targets: BTreeSet<SocketAddr>| Desired {
            key: "arn:lb/api:443".into(),
            name: "api".into(),
            service: None,
            api: true,
            targets,
            health: HealthCheck { interval: Duration::from_millis(100), healthy_threshold: 1, unhealthy_threshold: 1, port: None },
            deregistration_delay: Duration::from_millis(300),
            target_group: None,
        };
        b.sync(vec![desired(BTreeSet::from([backend_addr]))]);
        rt.block_on(async {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut c = TcpStream::connect(api_addr).await.unwrap();
            c.write_all(b"ping").await.unwrap();
            let mut buf = [0u8; 4];
            c.read_exact(&mut buf).await.unwrap();
            assert_eq!(&buf, b"ping");
            // Deregister: the open connection survives the delay's start, then is closed.
            b.sync(vec![desired(BTreeSet::new())]);
            c.write_all(b"pong").await.unwrap();
            c.read_exact(&mut buf).await.unwrap();
            assert_eq!(&buf, b"pong");
            tokio::time::sleep(Duration::from_millis(350)).await;
            b.sync(vec![desired(BTreeSet::new())]);
            let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf)).await.unwrap().unwrap_or(0);
            assert_eq!(n, 0, "closed after the deregistration delay");
            // Nothing registered: a new connection is accepted and closed at once.
            let mut c2 = TcpStream::connect(api_addr).await.unwrap();
            let n = tokio::time::timeout(Duration::from_secs(5), c2.read(&mut buf)).await.unwrap().unwrap_or(0);
            assert_eq!(n, 0);
        });
    }
}
