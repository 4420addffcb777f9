//! The VPC's DNS resolver (Amazon-provided DNS) for what pods ask it: the EC2 private DNS names
//! (`ip-A-B-C-D.ec2.internal`, `ip-A-B-C-D.<region>.compute.internal`) answer with the address they
//! spell, as in a VPC, and the A records of the account's Route53 hosted zones (moto's) answer as
//! they do in a VPC — a private zone is associated with the one VPC here, a public zone is what
//! the internet's DNS would answer — so a pod resolves `api.internal.<cluster>` as on AWS (the
//! service-account issuer's discovery, upstream's `ServiceAccountIssuerDiscovery` conformance
//! test). Every other name is NXDOMAIN at once (nothing outside exists here). Served over UDP on
//! the segment gateway, where the cluster's CoreDNS forwards (`kubeDNS.upstreamNameservers`), so
//! pods reach a kubelet by its node's `Hostname` address, as kOps' metrics-server does on AWS.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

/// The hosted zones' A records: lower-case name without the final dot → addresses.
pub type ZoneRecords = BTreeMap<String, Vec<Ipv4Addr>>;

/// How often the zones' records are read again from the cloud (Route53 answers change as
/// protokube and the DNS controller update them; a real resolver's view lags by the TTL too).
pub const ZONE_REFRESH: Duration = Duration::from_secs(2);

/// Time to live of the answers, seconds.
const TTL: u32 = 60;
const TYPE_A: u16 = 1;
const CLASS_IN: u16 = 1;
const RCODE_NXDOMAIN: u16 = 3;
const RCODE_FORMERR: u16 = 1;

/// The address an EC2 private DNS name spells, if `name` is one (case-insensitive, trailing dot allowed).
pub fn ec2_name_address(name: &str) -> Option<Ipv4Addr> {
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    let (host, domain) = name.split_once('.')?;
    let in_vpc = domain == "ec2.internal" || domain.strip_suffix(".compute.internal").is_some_and(|region| !region.is_empty() && !region.contains('.'));
    if !in_vpc {
        return None;
    }
    let octets: Vec<u8> = host.strip_prefix("ip-")?.split('-').map(|o| o.parse::<u8>().ok().filter(|_| !o.starts_with('+'))).collect::<Option<_>>()?;
    let [a, b, c, d] = octets[..] else { return None };
    Some(Ipv4Addr::new(a, b, c, d))
}

fn u16_at(b: &[u8], i: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(i)?, *b.get(i + 1)?]))
}

/// The question of a query: its name, type and class, and where it ends.
fn question(query: &[u8]) -> Option<(String, u16, u16, usize)> {
    let mut i = 12;
    let mut labels = Vec::new();
    loop {
        let len = *query.get(i)? as usize;
        i += 1;
        if len == 0 {
            break;
        }
        if len > 63 {
            return None; // compression or an extended label: not in a question we answer
        }
        labels.push(String::from_utf8_lossy(query.get(i..i + len)?).to_string());
        i += len;
    }
    Some((labels.join("."), u16_at(query, i)?, u16_at(query, i + 2)?, i + 4))
}

/// The addresses of `name`: the EC2 name's, else the hosted zones' record's.
fn lookup(name: &str, zones: &ZoneRecords) -> Option<Vec<Ipv4Addr>> {
    if let Some(ip) = ec2_name_address(name) {
        return Some(vec![ip]);
    }
    let key = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    zones.get(&key).filter(|ips| !ips.is_empty()).cloned()
}

/// The response to one DNS query message, or `None` when it is not a query worth answering (too
/// short, or itself a response).
pub fn answer(query: &[u8], zones: &ZoneRecords) -> Option<Vec<u8>> {
    if query.len() < 12 || query[2] & 0x80 != 0 {
        return None;
    }
    let opcode_rd = u16_at(query, 2)? & 0x7900; // opcode and RD, copied
    let reply = |rcode: u16, question: &[u8], answers: u16| {
        let mut out = Vec::with_capacity(question.len() + 28);
        out.extend_from_slice(&query[..2]);
        out.extend_from_slice(&(0x8000 | opcode_rd | 0x0400 | 0x0080 | rcode).to_be_bytes()); // QR AA RA
        out.extend_from_slice(&(u16::from(!question.is_empty())).to_be_bytes());
        out.extend_from_slice(&answers.to_be_bytes());
        out.extend_from_slice(&[0, 0, 0, 0]);
        out.extend_from_slice(question);
        out
    };
    let opcode = (opcode_rd >> 11) & 0xf;
    let parsed = question(query).filter(|_| opcode == 0 && u16_at(query, 4) == Some(1));
    let Some((name, qtype, qclass, end)) = parsed else { return Some(reply(RCODE_FORMERR, &[], 0)) };
    let q = &query[12..end];
    let Some(ips) = lookup(&name, zones) else { return Some(reply(RCODE_NXDOMAIN, q, 0)) };
    if qtype != TYPE_A || qclass != CLASS_IN {
        return Some(reply(0, q, 0)); // the name exists, without records of that type
    }
    // At most 32 answers: 16 bytes each keeps the message within 512 bytes with any question.
    let ips = &ips[..ips.len().min(32)];
    let mut out = reply(0, q, u16::try_from(ips.len()).unwrap_or(0));
    for ip in ips {
        out.extend_from_slice(&[0xc0, 0x0c]); // the question's name
        out.extend_from_slice(&TYPE_A.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        out.extend_from_slice(&TTL.to_be_bytes());
        out.extend_from_slice(&4u16.to_be_bytes());
        out.extend_from_slice(&ip.octets());
    }
    Some(out)
}

/// The records of `records` (the cloud's A records) by name; values that are not IPv4 addresses
/// are left out.
pub fn zone_records(records: &[crate::cloud::ARecord]) -> ZoneRecords {
    let mut out = ZoneRecords::new();
    for r in records {
        let ips = r.ips.iter().filter_map(|ip| ip.parse::<Ipv4Addr>().ok());
        out.entry(r.name.trim_end_matches('.').to_ascii_lowercase()).or_default().extend(ips);
    }
    out
}

/// Keep `zones` filled with the hosted zones' A records of the cloud at `endpoint`, every
/// [`ZONE_REFRESH`], on a thread of its own (the reads block). The thread ends once `zones` is
/// dropped (the resolver with the daemon's runtime); a failed read keeps the last records.
pub fn follow_zones(endpoint: String, region: String, zones: Weak<RwLock<ZoneRecords>>) -> std::io::Result<()> {
    std::thread::Builder::new().name("vpc-dns-zones".into()).spawn(move || {
        let cloud = crate::cloud::Cloud::new(&endpoint, &region);
        let mut failing = false;
        while let Some(z) = zones.upgrade() {
            match cloud.a_records() {
                Ok(records) => {
                    let fresh = zone_records(&records);
                    if let Ok(mut w) = z.write() {
                        *w = fresh;
                    }
                    failing = false;
                }
                // Said once per outage, not every refresh.
                Err(e) if !failing => {
                    eprintln!("keelson-local: VPC resolver: reading the hosted zones failed (keeping the last records): {e}");
                    failing = true;
                }
                Err(_) => {}
            }
            drop(z);
            std::thread::sleep(ZONE_REFRESH);
        }
    })?;
    Ok(())
}

/// Answer queries on `socket` until the runtime stops, from the EC2 names and `zones`.
pub async fn serve(socket: tokio::net::UdpSocket, zones: Arc<RwLock<ZoneRecords>>) {
    let mut buf = [0u8; 1500];
    loop {
        let Ok((n, from)) = socket.recv_from(&mut buf).await else {
            // (a client gone before its answer: an ICMP error surfaces here once) — never spin
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        let reply = match zones.read() {
            Ok(z) => answer(&buf[..n], &z),
            Err(_) => answer(&buf[..n], &ZoneRecords::new()),
        };
        if let Some(reply) = reply {
            let _ = socket.send_to(&reply, from).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(name: &str, qtype: u16) -> Vec<u8> {
        let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for l in name.split('.').filter(|l| !l.is_empty()) {
            q.push(l.len() as u8);
            q.extend_from_slice(l.as_bytes());
        }
        q.push(0);
        q.extend_from_slice(&qtype.to_be_bytes());
        q.extend_from_slice(&CLASS_IN.to_be_bytes());
        q
    }

    #[test]
    fn ec2_names() {
        assert_eq!(ec2_name_address("ip-172-20-32-10.ec2.internal"), Some(Ipv4Addr::new(172, 20, 32, 10)));
        assert_eq!(ec2_name_address("IP-10-0-0-1.eu-west-1.compute.internal."), Some(Ipv4Addr::new(10, 0, 0, 1)));
        for bad in [
            "ip-10-0-0-1.example.com",
            "ip-10-0-0.ec2.internal",
            "ip-10-0-0-1-2.ec2.internal",
            "ip-10-0-0-256.ec2.internal",
            "ip-10-0-0-+1.ec2.internal",
            "host-10-0-0-1.ec2.internal",
            "ip-10-0-0-1.compute.internal",
            "ip-10-0-0-1.a.b.compute.internal",
            "ec2.internal",
        ] {
            assert_eq!(ec2_name_address(bad), None, "{bad}");
        }
    }

    #[test]
    fn answers_a_records_of_ec2_names() {
        let q = query("ip-172-20-32-10.ec2.internal", TYPE_A);
        let r = answer(&q, &ZoneRecords::new()).unwrap();
        assert_eq!(&r[..2], &[0x12, 0x34], "same id");
        assert_eq!(u16_at(&r, 2), Some(0x8580), "QR AA RD RA, NOERROR");
        assert_eq!((u16_at(&r, 4), u16_at(&r, 6)), (Some(1), Some(1)));
        assert_eq!(&r[12..q.len()], &q[12..], "the question echoed");
        assert_eq!(&r[r.len() - 4..], &[172, 20, 32, 10]);
        assert_eq!(u16_at(&r, r.len() - 6), Some(4));
        // AAAA of an existing name: no records, no error.
        let r = answer(&query("ip-172-20-32-10.ec2.internal", 28), &ZoneRecords::new()).unwrap();
        assert_eq!((u16_at(&r, 2).map(|f| f & 0xf), u16_at(&r, 6)), (Some(0), Some(0)));
    }

    #[test]
    fn other_names_do_not_exist_and_junk_is_refused() {
        let r = answer(&query("registry.k8s.io", TYPE_A), &ZoneRecords::new()).unwrap();
        assert_eq!(u16_at(&r, 2).map(|f| f & 0xf), Some(RCODE_NXDOMAIN));
        assert_eq!(u16_at(&r, 6), Some(0));
        assert_eq!(answer(&[0u8; 5], &ZoneRecords::new()), None);
        let mut response = query("x.ec2.internal", TYPE_A);
        response[2] |= 0x80;
        assert_eq!(answer(&response, &ZoneRecords::new()), None, "a response is not answered");
        let mut truncated = query("ip-1-2-3-4.ec2.internal", TYPE_A);
        truncated.truncate(20);
        assert_eq!(answer(&truncated, &ZoneRecords::new()).map(|r| u16_at(&r, 2).unwrap() & 0xf), Some(RCODE_FORMERR));
    }

    #[test]
    fn hosted_zone_records_answer_with_every_address() {
        let records = vec![
            crate::cloud::ARecord {
                zone: "k8s.example.com.".into(),
                name: "API.internal.ha.k8s.example.com.".into(),
                ips: vec!["172.20.32.4".into(), "172.20.64.4".into()],
            },
            crate::cloud::ARecord { zone: "k8s.example.com.".into(), name: "odd.k8s.example.com".into(), ips: vec!["not-an-ip".into()] },
        ];
        let zones = zone_records(&records);
        let r = answer(&query("api.internal.ha.k8s.example.com", TYPE_A), &zones).unwrap();
        assert_eq!((u16_at(&r, 2).map(|f| f & 0xf), u16_at(&r, 6)), (Some(0), Some(2)), "two answers");
        assert_eq!(&r[r.len() - 4..], &[172, 20, 64, 4]);
        assert_eq!(&r[r.len() - 20..r.len() - 16], &[172, 20, 32, 4]);
        // A record without an address does not exist for a resolver.
        let r = answer(&query("odd.k8s.example.com", TYPE_A), &zones).unwrap();
        assert_eq!(u16_at(&r, 2).map(|f| f & 0xf), Some(RCODE_NXDOMAIN));
        // Without the zones (the hole this closes), the issuer's name does not resolve.
        let r = answer(&query("api.internal.ha.k8s.example.com", TYPE_A), &ZoneRecords::new()).unwrap();
        assert_eq!(u16_at(&r, 2).map(|f| f & 0xf), Some(RCODE_NXDOMAIN));
    }
}
