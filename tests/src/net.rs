//! Network namespaces, veth pairs and the machines' bridge. The bridge is an L2 segment with the
//! machines and the harness's gateway address on it; the gateway plays the VPC router: the machines'
//! default route, forwarding only between the bridge's machines (pod routes from the VPC route table),
//! never off the segment. So a machine reaches its peers (and their pods), the gateway and its own IMDS.

use std::net::Ipv4Addr;
use std::process::Command;

use crate::cmd::{self, CmdError};
use crate::paths;

/// Addressing of the local VPC: every machine is on one L2 segment with the VPC's prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Segment {
    pub network: Ipv4Addr,
    pub prefix: u8,
    /// The harness's address on the bridge (moto relay, asset mirror).
    pub gateway: Ipv4Addr,
}

impl Segment {
    /// The VPC CIDR's last usable address is the gateway (moto never hands it out as long as no
    /// subnet ends there; the caller checks).
    pub fn from_cidr(cidr: &str) -> Option<Segment> {
        let (addr, prefix) = cidr.split_once('/')?;
        let addr: Ipv4Addr = addr.parse().ok()?;
        let prefix: u8 = prefix.parse().ok()?;
        if !(8..=30).contains(&prefix) {
            return None;
        }
        let mask = u32::MAX << (32 - prefix);
        let network = u32::from(addr) & mask;
        let gateway = Ipv4Addr::from((network | !mask) - 1);
        Some(Segment { network: Ipv4Addr::from(network), prefix, gateway })
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        let mask = u32::MAX << (32 - self.prefix);
        u32::from(ip) & mask == u32::from(self.network)
    }
}

pub fn ensure_bridge(name: &str, seg: &Segment) -> Result<(), CmdError> {
    let exists = cmd::output(Command::new("ip").args(["link", "show", name]))?.status.success();
    if !exists {
        cmd::sh(&["ip", "link", "add", name, "type", "bridge"])?;
    }
    let addr = format!("{}/{}", seg.gateway, seg.prefix);
    let addrs = cmd::sh(&["ip", "-4", "-o", "addr", "show", "dev", name])?;
    if !addrs.contains(&format!(" {addr} ")) {
        cmd::sh(&["ip", "addr", "add", &addr, "dev", name])?;
    }
    cmd::sh(&["ip", "link", "set", name, "up"])?;
    Ok(())
}

/// Play the VPC router on the bridge: IPv4 forwarding for packets that arrive on the bridge only
/// (the per-interface switch, not the host-wide one), and only back onto the bridge (FORWARD rules
/// in our own chain: bridge → bridge accepted, bridge → anything else dropped).
pub fn ensure_vpc_router(bridge: &str) -> Result<(), CmdError> {
    let sysctl = format!("/proc/sys/net/ipv4/conf/{bridge}/forwarding");
    std::fs::write(&sysctl, "1").map_err(|e| CmdError::Failed { command: format!("write 1 to {sysctl}"), status: "io".into(), stderr: e.to_string() })?;
    let chain = vpc_chain(bridge);
    if cmd::sh(&["iptables", "-w", "-n", "-L", &chain]).is_err() {
        cmd::sh(&["iptables", "-w", "-N", &chain])?;
    }
    cmd::sh(&["iptables", "-w", "-F", &chain])?;
    cmd::sh(&["iptables", "-w", "-A", &chain, "-i", bridge, "-o", bridge, "-j", "ACCEPT"])?;
    cmd::sh(&["iptables", "-w", "-A", &chain, "-i", bridge, "-j", "DROP"])?;
    if cmd::sh(&["iptables", "-w", "-C", "FORWARD", "-i", bridge, "-j", &chain]).is_err() {
        cmd::sh(&["iptables", "-w", "-I", "FORWARD", "1", "-i", bridge, "-j", &chain])?;
    }
    Ok(())
}

fn vpc_chain(bridge: &str) -> String {
    format!("KEELSON-VPC-{bridge}").chars().take(28).collect()
}

/// Undo [`ensure_vpc_router`] (the sysctl goes with the bridge).
pub fn delete_vpc_router(bridge: &str) {
    let chain = vpc_chain(bridge);
    cmd::sh_quiet(&["iptables", "-w", "-D", "FORWARD", "-i", bridge, "-j", &chain]);
    cmd::sh_quiet(&["iptables", "-w", "-F", &chain]);
    cmd::sh_quiet(&["iptables", "-w", "-X", &chain]);
}

/// The host's routes through the bridge (`destination → gateway`): the VPC route table's instance
/// routes as the harness mirrored them.
pub fn bridge_routes(bridge: &str) -> Result<std::collections::BTreeMap<String, String>, CmdError> {
    let out = cmd::sh(&["ip", "-4", "-o", "route", "show", "dev", bridge, "proto", "static"])?;
    Ok(out
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let dest = w.next()?.to_string();
            let via = w.skip_while(|x| *x != "via").nth(1)?.to_string();
            Some((dest, via))
        })
        .collect())
}

/// Route `dest` via `gateway` on the bridge (replacing any route to `dest`).
pub fn set_bridge_route(bridge: &str, dest: &str, gateway: &str) -> Result<(), CmdError> {
    cmd::sh(&["ip", "route", "replace", dest, "via", gateway, "dev", bridge, "proto", "static"]).map(|_| ())
}

pub fn delete_bridge_route(bridge: &str, dest: &str) {
    cmd::sh_quiet(&["ip", "route", "del", dest, "dev", bridge, "proto", "static"]);
}

pub fn delete_bridge(name: &str) {
    cmd::sh_quiet(&["ip", "link", "del", name]);
}

/// A namespace `ns` with `eth0` = `ip/prefix` on the bridge, `lo` up, and the IMDS address on `lo`.
pub fn create_namespace(ns: &str, veth: &str, bridge: &str, ip: Ipv4Addr, seg: &Segment) -> Result<(), CmdError> {
    delete_namespace(ns, veth);
    cmd::sh(&["ip", "netns", "add", ns])?;
    let result = (|| {
        cmd::sh(&["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])?;
        cmd::sh(&["ip", "link", "set", veth, "master", bridge, "up"])?;
        let addr = format!("{ip}/{}", seg.prefix);
        cmd::sh(&["ip", "-n", ns, "addr", "add", &addr, "dev", "eth0"])?;
        cmd::sh(&["ip", "-n", ns, "link", "set", "eth0", "up"])?;
        cmd::sh(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
        let imds = format!("{}/32", paths::IMDS_ADDR);
        cmd::sh(&["ip", "-n", ns, "addr", "add", &imds, "dev", "lo"])?;
        // The VPC router, as EC2's DHCP names it: what is not on the segment goes to the bridge
        // address, which forwards only back onto the bridge ([`ensure_vpc_router`]).
        cmd::sh(&["ip", "-n", ns, "route", "add", "default", "via", &seg.gateway.to_string(), "dev", "eth0"])?;
        Ok(())
    })();
    if result.is_err() {
        delete_namespace(ns, veth);
    }
    result
}

pub fn delete_namespace(ns: &str, veth: &str) {
    cmd::sh_quiet(&["ip", "link", "del", veth]);
    cmd::sh_quiet(&["ip", "netns", "del", ns]);
}

/// Every namespace whose name carries our prefix (for `down`).
pub fn our_namespaces() -> Vec<String> {
    cmd::sh(&["ip", "netns", "list"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(paths::NETNS_PREFIX))
        .map(str::to_string)
        .collect()
}

/// Every veth whose name carries our prefix (for `down`).
pub fn our_links() -> Vec<String> {
    cmd::sh(&["ip", "-o", "link", "show"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n).to_string())
        .filter(|n| n.starts_with(paths::VETH_PREFIX) || n.starts_with("klbr"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_from_vpc_cidr() {
        let s = Segment::from_cidr("172.20.0.0/16").unwrap();
        assert_eq!(s.network, Ipv4Addr::new(172, 20, 0, 0));
        assert_eq!(s.gateway, Ipv4Addr::new(172, 20, 255, 254));
        assert!(s.contains(Ipv4Addr::new(172, 20, 32, 5)));
        assert!(!s.contains(Ipv4Addr::new(172, 21, 0, 1)));
        let s = Segment::from_cidr("10.1.2.3/24").unwrap();
        assert_eq!(s.network, Ipv4Addr::new(10, 1, 2, 0));
        assert_eq!(s.gateway, Ipv4Addr::new(10, 1, 2, 254));
        assert!(Segment::from_cidr("10.0.0.0/31").is_none());
        assert!(Segment::from_cidr("nonsense").is_none());
    }
}
