//! Who may open a connection to the join server, and how many: a global cap on connections in
//! flight, a cap per source address, and a token bucket per source address for new connections.
//! A flood from a few addresses (any pod can reach :3988) is refused at accept time, before TLS,
//! and never holds more than its share of the server. Sources in the pod network (pods with
//! addresses of their own; a node never joins from one) share the server less
//! [`Limits::reserved_for_instances`]: however many pods connect, that many slots stay for the
//! instances' own addresses.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The limits (defaults sized for a few thousand nodes joining at once through a handful of
/// control planes: a node connects once per join).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections in flight, all sources together.
    pub max_connections: usize,
    /// Of [`Self::max_connections`], how many sources in the pod network may never hold.
    pub reserved_for_instances: usize,
    /// Connections in flight from one source address.
    pub per_source_connections: usize,
    /// New connections per second one source address may open, sustained…
    pub per_source_rate: f64,
    /// …and in a burst.
    pub per_source_burst: f64,
    /// TLS handshake, then the whole request, must finish within these.
    pub handshake_timeout: Duration,
    pub request_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 512,
            reserved_for_instances: 128,
            per_source_connections: 8,
            per_source_rate: 2.0,
            per_source_burst: 16.0,
            handshake_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
        }
    }
}

/// Why a connection was turned away before it was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turnaway {
    /// The server holds `max_connections` already.
    Overloaded,
    /// A source in the pod network, and pods hold all the slots not reserved for instances.
    PodNetworkFull,
    /// This source holds `per_source_connections` already.
    SourceBusy,
    /// This source opened connections faster than its bucket refills.
    RateLimited,
}

impl Turnaway {
    /// The `reason` label of the refusal counter.
    pub fn reason(self) -> &'static str {
        match self {
            Turnaway::Overloaded => "overloaded",
            Turnaway::PodNetworkFull => "pod-network-full",
            Turnaway::SourceBusy => "source-busy",
            Turnaway::RateLimited => "rate-limited",
        }
    }
}

#[derive(Debug)]
struct Source {
    tokens: f64,
    refilled: Instant,
    in_flight: usize,
}

#[derive(Debug)]
struct State {
    in_flight: usize,
    /// Of `in_flight`, from sources in the pod network.
    pod_in_flight: usize,
    sources: HashMap<IpAddr, Source>,
}

/// The admission state, shared by the accept loop and the connections' guards.
#[derive(Debug, Clone)]
pub struct Admission {
    limits: Limits,
    pod_networks: Arc<[ipnet::IpNet]>,
    state: Arc<Mutex<State>>,
}

impl Default for Admission {
    fn default() -> Self {
        Admission::new(Limits::default())
    }
}

/// Held for as long as an admitted connection lives; gives its slot back when dropped.
#[derive(Debug)]
pub struct Slot {
    admission: Admission,
    source: IpAddr,
    pod: bool,
}

/// Sources remembered at most (idle ones with a full bucket are forgotten first).
const MAX_SOURCES: usize = 65_536;

impl Admission {
    /// Admission under `limits`, with no pod network known (every source is an instance's).
    pub fn new(limits: Limits) -> Admission {
        Admission::with_pod_networks(limits, Vec::new())
    }

    /// Admission under `limits`, sources in `pod_networks` held to the unreserved slots.
    pub fn with_pod_networks(limits: Limits, pod_networks: Vec<ipnet::IpNet>) -> Admission {
        let state = State { in_flight: 0, pod_in_flight: 0, sources: HashMap::new() };
        Admission { limits, pod_networks: pod_networks.into(), state: Arc::new(Mutex::new(state)) }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Admit a connection from `source` at `now`, or say why not.
    pub fn admit(&self, source: IpAddr, now: Instant) -> Result<Slot, Turnaway> {
        let l = self.limits;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.sources.len() >= MAX_SOURCES && !st.sources.contains_key(&source) {
            st.sources.retain(|_, s| s.in_flight > 0 || s.tokens + now.duration_since(s.refilled).as_secs_f64() * l.per_source_rate < l.per_source_burst);
        }
        if st.in_flight >= l.max_connections {
            return Err(Turnaway::Overloaded);
        }
        let pod = self.pod_networks.iter().any(|n| n.contains(&source));
        if pod && st.pod_in_flight >= l.max_connections.saturating_sub(l.reserved_for_instances) {
            return Err(Turnaway::PodNetworkFull);
        }
        let s = st.sources.entry(source).or_insert(Source { tokens: l.per_source_burst, refilled: now, in_flight: 0 });
        s.tokens = (s.tokens + now.saturating_duration_since(s.refilled).as_secs_f64() * l.per_source_rate).min(l.per_source_burst);
        s.refilled = now;
        if s.in_flight >= l.per_source_connections {
            return Err(Turnaway::SourceBusy);
        }
        if s.tokens < 1.0 {
            return Err(Turnaway::RateLimited);
        }
        s.tokens -= 1.0;
        s.in_flight += 1;
        st.in_flight += 1;
        st.pod_in_flight += usize::from(pod);
        Ok(Slot { admission: self.clone(), source, pod })
    }

    /// Connections in flight now.
    pub fn in_flight(&self) -> usize {
        self.state.lock().map(|s| s.in_flight).unwrap_or(0)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut st = self.admission.state.lock().unwrap_or_else(|p| p.into_inner());
        st.in_flight = st.in_flight.saturating_sub(1);
        if self.pod {
            st.pod_in_flight = st.pod_in_flight.saturating_sub(1);
        }
        if let Some(s) = st.sources.get_mut(&self.source) {
            s.in_flight = s.in_flight.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn one_source_gets_its_burst_then_its_rate_and_never_more_than_its_share() {
        let limits = Limits { max_connections: 100, per_source_connections: 3, per_source_rate: 2.0, per_source_burst: 4.0, ..Limits::default() };
        let a = Admission::new(limits);
        let t0 = Instant::now();
        // Three in flight at once, the fourth is refused as busy while they live.
        let held: Vec<Slot> = (0..3).map(|_| a.admit(ip(1), t0).expect("within the share")).collect();
        assert_eq!(a.admit(ip(1), t0).map(|_| ()), Err(Turnaway::SourceBusy));
        // Another source is unaffected.
        let other = a.admit(ip(2), t0).expect("another source");
        drop(held);
        drop(other);
        // One token left of the burst of 4, then the bucket is empty.
        a.admit(ip(1), t0).expect("last token of the burst");
        assert_eq!(a.admit(ip(1), t0).map(|_| ()), Err(Turnaway::RateLimited));
        // Half a second refills one token at 2/s.
        a.admit(ip(1), t0 + Duration::from_millis(500)).expect("refilled");
        assert_eq!(a.admit(ip(1), t0 + Duration::from_millis(500)).map(|_| ()), Err(Turnaway::RateLimited));
        assert_eq!(a.in_flight(), 0, "every slot was given back");
    }

    #[test]
    fn the_server_as_a_whole_is_capped() {
        let a = Admission::new(Limits { max_connections: 2, per_source_connections: 10, ..Limits::default() });
        let now = Instant::now();
        let _s1 = a.admit(ip(1), now).expect("1");
        let _s2 = a.admit(ip(2), now).expect("2");
        assert_eq!(a.admit(ip(3), now).map(|_| ()), Err(Turnaway::Overloaded));
    }

    #[test]
    fn pods_never_hold_the_slots_reserved_for_instances() {
        let limits = Limits { max_connections: 16, reserved_for_instances: 4, per_source_connections: 8, per_source_burst: 16.0, ..Limits::default() };
        let a = Admission::with_pod_networks(limits, vec!["100.96.0.0/11".parse().expect("cidr")]);
        let now = Instant::now();
        // Two pods, eight connections each as their per-source cap allows: twelve are let in.
        let pod = |last: u8| IpAddr::from([100, 96, 1, last]);
        let mut held: Vec<Slot> = Vec::new();
        for p in [pod(1), pod(2)] {
            held.extend((0..8).filter_map(|_| a.admit(p, now).ok()));
        }
        assert_eq!(held.len(), 12, "the unreserved slots");
        assert_eq!(a.admit(pod(3), now).map(|_| ()), Err(Turnaway::PodNetworkFull));
        // A node still joins: the reserved four are its own.
        let nodes: Vec<Slot> = (1..=4).map(|i| a.admit(ip(i), now).expect("a node's join")).collect();
        assert_eq!(a.admit(ip(9), now).map(|_| ()), Err(Turnaway::Overloaded));
        drop(nodes);
        drop(held);
        assert_eq!(a.in_flight(), 0);
        assert!(a.admit(pod(3), now).is_ok(), "pods are let in again once the slots are free");
    }
}
