//! Validated newtypes: values that can only hold what Kubernetes and kOps accept.
//!
//! Each type parses from the spec's text form and prints back its canonical form.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Why a newtype refused a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a valid {what}: expected {expected}")]
pub struct InvalidValue {
    pub what: &'static str,
    pub value: String,
    pub expected: &'static str,
}

fn invalid(what: &'static str, value: &str, expected: &'static str) -> InvalidValue {
    InvalidValue { what, value: value.to_string(), expected }
}

macro_rules! string_serde {
    ($ty:ty) => {
        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = ScalarText::deserialize(d)?;
                text.0.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

/// A YAML scalar (string, integer, float or bool) read as its text, so `cpuRequest: 1`
/// and `cpuRequest: "1"` mean the same, as they do for kOps.
struct ScalarText(String);

impl<'de> Deserialize<'de> for ScalarText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = ScalarText;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or number")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ScalarText, E> {
                Ok(ScalarText(v.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<ScalarText, E> {
                Ok(ScalarText(v.to_string()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<ScalarText, E> {
                Ok(ScalarText(v.to_string()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<ScalarText, E> {
                Ok(ScalarText(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// A Kubernetes resource quantity such as `100m`, `128Mi`, `1.5`, `2e3`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Quantity(String);

impl Quantity {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for Quantity {
    type Err = InvalidValue;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        const EXPECTED: &str = "a number with an optional suffix (m, k, M, G, Ki, Mi, Gi, …), e.g. 100m or 128Mi";
        let body = s.strip_prefix(['+', '-']).unwrap_or(s);
        let suffixes = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E"];
        let mut number = body;
        if let Some(sfx) = suffixes.iter().find(|x| body.ends_with(*x)) {
            number = &body[..body.len() - sfx.len()];
        } else if let Some(pos) = body.find(['e', 'E']) {
            let exp = &body[pos + 1..];
            let exp = exp.strip_prefix(['+', '-']).unwrap_or(exp);
            if exp.is_empty() || !exp.bytes().all(|b| b.is_ascii_digit()) {
                return Err(invalid("quantity", s, EXPECTED));
            }
            number = &body[..pos];
        }
        let mut parts = number.splitn(2, '.');
        let int = parts.next().unwrap_or("");
        let frac = parts.next();
        let digits_ok = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
        let ok = digits_ok(int) && frac.is_none_or(digits_ok) && (!int.is_empty() || frac.is_some_and(|f| !f.is_empty()));
        if !ok || s.len() > 64 {
            return Err(invalid("quantity", s, EXPECTED));
        }
        Ok(Quantity(canonical_quantity(s).unwrap_or_else(|| s.to_string())))
    }
}

/// The canonical form Kubernetes prints for simple decimal quantities (`3.14` → `3140m`,
/// `1000m` → `1`, `2000` → `2k`, `2048Mi` → `2Gi`); `None` leaves the text as written.
fn canonical_quantity(s: &str) -> Option<String> {
    let (neg, body) = match s.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let sign = if neg { "-" } else { "" };
    const BINARY: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if let Some(i) = BINARY.iter().position(|b| body.ends_with(b)) {
        let mut n: u128 = body[..body.len() - 2].parse().ok()?;
        let mut level = i;
        while n != 0 && n.is_multiple_of(1024) && level + 1 < BINARY.len() {
            n /= 1024;
            level += 1;
        }
        return Some(format!("{sign}{n}{}", BINARY[level]));
    }
    const DECIMAL: [(&str, i32); 8] = [("n", -9), ("u", -6), ("m", -3), ("k", 3), ("M", 6), ("G", 9), ("T", 12), ("P", 15)];
    let (number, exp) = match DECIMAL.iter().find(|(sfx, _)| body.ends_with(sfx)) {
        Some((sfx, e)) => (&body[..body.len() - sfx.len()], *e),
        None if body.bytes().all(|b| b.is_ascii_digit() || b == b'.') => (body, 0),
        None => return None,
    };
    // Value in nano-units, exactly.
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if frac.len() > 9 || int.len() > 18 {
        return None;
    }
    let digits = format!("{int}{frac}");
    let mantissa: i128 = if digits.is_empty() { 0 } else { digits.parse().ok()? };
    let scale = exp + 9 - frac.len() as i32;
    if scale < 0 {
        return None;
    }
    let nanos = mantissa.checked_mul(10i128.checked_pow(scale as u32)?)?;
    if nanos == 0 {
        return Some("0".to_string());
    }
    let units = [(-9, "n"), (-6, "u"), (-3, "m"), (0, ""), (3, "k"), (6, "M"), (9, "G"), (12, "T"), (15, "P"), (18, "E")];
    // Largest unit that divides the value exactly, never below milli unless needed.
    let mut best = None;
    for (e, sfx) in units {
        let div = 10i128.pow((e + 9) as u32);
        if nanos % div == 0 {
            best = Some((nanos / div, sfx));
        }
    }
    let (n, sfx) = best?;
    Some(format!("{sign}{n}{sfx}"))
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(&self.0)
    }
}
string_serde!(Quantity);

/// A Go `time.Duration` as kOps writes it (`metav1.Duration`): parsed from `90s`, `1m`,
/// `1h30m`, printed canonically (`1m0s`, `1h30m0s`) exactly as Go prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Duration {
    nanos: i128,
}

impl Duration {
    pub fn from_secs(secs: i64) -> Self {
        Duration { nanos: i128::from(secs) * 1_000_000_000 }
    }
    pub fn from_nanos(nanos: u128) -> Self {
        Duration { nanos: i128::try_from(nanos).unwrap_or(i128::MAX) }
    }
    pub fn as_nanos(&self) -> i128 {
        self.nanos
    }
}

impl FromStr for Duration {
    type Err = InvalidValue;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        const EXPECTED: &str = "a duration such as 30s, 1m0s or 1h30m";
        let bad = || invalid("duration", s, EXPECTED);
        let (neg, mut rest) = match s.strip_prefix('-') {
            Some(r) => (true, r),
            None => (false, s.strip_prefix('+').unwrap_or(s)),
        };
        if rest == "0" {
            return Ok(Duration { nanos: 0 });
        }
        if rest.is_empty() {
            return Err(bad());
        }
        let mut total: f64 = 0.0;
        while !rest.is_empty() {
            let num_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(bad)?;
            let num: f64 = rest[..num_len].parse().map_err(|_| bad())?;
            rest = &rest[num_len..];
            let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
            let unit = match &rest[..unit_len] {
                "ns" => 1.0,
                "us" | "µs" => 1e3,
                "ms" => 1e6,
                "s" => 1e9,
                "m" => 60e9,
                "h" => 3600e9,
                _ => return Err(bad()),
            };
            rest = &rest[unit_len..];
            total += num * unit;
        }
        if !total.is_finite() || total > 9.3e18 {
            return Err(bad());
        }
        let nanos = total.round() as i128;
        Ok(Duration { nanos: if neg { -nanos } else { nanos } })
    }
}

impl fmt::Display for Duration {
    /// Go's `time.Duration.String()`.
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let neg = self.nanos < 0;
        let n = self.nanos.unsigned_abs();
        let sign = if neg { "-" } else { "" };
        if n == 0 {
            return f.write_str("0s");
        }
        if n < 1_000_000_000 {
            let (unit, div) = if n < 1_000 {
                ("ns", 1u128)
            } else if n < 1_000_000 {
                ("µs", 1_000)
            } else {
                ("ms", 1_000_000)
            };
            return write!(f, "{sign}{}{unit}", frac(n, div));
        }
        let secs_total = n / 1_000_000_000;
        let sub = n % 1_000_000_000;
        let h = secs_total / 3600;
        let m = (secs_total % 3600) / 60;
        let s = secs_total % 60;
        let secs = frac(s * 1_000_000_000 + sub, 1_000_000_000);
        if h > 0 {
            write!(f, "{sign}{h}h{m}m{secs}s")
        } else if m > 0 {
            write!(f, "{sign}{m}m{secs}s")
        } else {
            write!(f, "{sign}{secs}s")
        }
    }
}

/// `value / div` printed with the fractional digits Go keeps (no trailing zeros).
fn frac(value: u128, div: u128) -> String {
    let whole = value / div;
    let rem = value % div;
    if rem == 0 {
        return whole.to_string();
    }
    let width = div.ilog10() as usize;
    let digits = format!("{rem:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}
string_serde!(Duration);

/// Kubernetes `IntOrString` (e.g. rolling-update `maxSurge: 1` or `"25%"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum IntOrString {
    Int(i64),
    String(String),
}

/// An IPv4 or IPv6 network in CIDR notation, e.g. `172.20.0.0/16` or `2001:db8::/56`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cidr(ipnet::IpNet);

impl Cidr {
    pub fn net(&self) -> ipnet::IpNet {
        self.0
    }
    pub fn is_ipv6(&self) -> bool {
        matches!(self.0, ipnet::IpNet::V6(_))
    }
    /// True when `other` lies entirely inside `self`.
    pub fn contains(&self, other: &Cidr) -> bool {
        self.0.contains(&other.0)
    }
    /// True when the two ranges share any address.
    pub fn overlaps(&self, other: &Cidr) -> bool {
        self.0.contains(&other.0) || other.0.contains(&self.0)
    }
}

impl From<ipnet::IpNet> for Cidr {
    fn from(n: ipnet::IpNet) -> Self {
        Cidr(n)
    }
}

impl FromStr for Cidr {
    type Err = InvalidValue;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let net: ipnet::IpNet = s.parse().map_err(|_| invalid("CIDR", s, "an address range such as 10.0.0.0/16 or 2001:db8::/56"))?;
        if net.trunc() != net {
            return Err(invalid("CIDR", s, "a network address with no host bits set"));
        }
        Ok(Cidr(net))
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
string_serde!(Cidr);

/// A Kubernetes release, `1.34.0`, `v1.35.0-alpha.1` (the `v` is optional on input and dropped on output).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KubernetesVersion {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
    /// Pre-release part after `-`, e.g. `alpha.1`.
    pub pre: Option<String>,
}

impl KubernetesVersion {
    pub fn new(major: u64, minor: u64, patch: u64) -> Self {
        KubernetesVersion { major, minor, patch, pre: None }
    }
    /// True when this release is `major.minor` or later (pre-releases of a minor count as that minor,
    /// as kOps' version gates do).
    pub fn at_least(&self, major: u64, minor: u64) -> bool {
        (self.major, self.minor) >= (major, minor)
    }
    pub fn minor_string(&self) -> String {
        format!("{}.{}", self.major, self.minor)
    }
}

impl FromStr for KubernetesVersion {
    type Err = InvalidValue;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        const EXPECTED: &str = "a release such as 1.34.2 or v1.35.0-alpha.1";
        let bad = || invalid("Kubernetes version", s, EXPECTED);
        let body = s.strip_prefix('v').unwrap_or(s);
        let (core, pre) = match body.split_once('-') {
            Some((c, p)) => (c, Some(p)),
            None => (body, None),
        };
        let nums: Vec<&str> = core.split('.').collect();
        if nums.len() != 3 {
            return Err(bad());
        }
        let num = |p: &str| -> Result<u64, InvalidValue> {
            if p.is_empty() || p.len() > 9 || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            p.parse().map_err(|_| bad())
        };
        if let Some(p) = pre {
            let ok = !p.is_empty() && p.split('.').all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_alphanumeric()));
            if !ok {
                return Err(bad());
            }
        }
        Ok(KubernetesVersion { major: num(nums[0])?, minor: num(nums[1])?, patch: num(nums[2])?, pre: pre.map(str::to_string) })
    }
}

impl fmt::Display for KubernetesVersion {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)?;
        if let Some(p) = &self.pre {
            write!(f, "-{p}")?;
        }
        Ok(())
    }
}
string_serde!(KubernetesVersion);

/// A DNS name as kOps requires for a cluster name: lower-case RFC 1123 labels joined by dots,
/// at most 253 characters (e.g. `prod.acme.example.com`, `dev.k8s.local`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DnsName(String);

impl DnsName {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for DnsName {
    type Err = InvalidValue;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        const EXPECTED: &str = "a lower-case DNS name: labels of a-z, 0-9 and '-', not starting or ending with '-', joined by '.', at most 253 characters";
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if s.is_empty() || s.len() > 253 || !s.split('.').all(label_ok) {
            return Err(invalid("DNS name", s, EXPECTED));
        }
        Ok(DnsName(s.to_string()))
    }
}

impl fmt::Display for DnsName {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(&self.0)
    }
}
string_serde!(DnsName);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        for good in ["100m", "128Mi", "1", "1.5", "2e3", "0.5Gi", ".5", "+1k", "1E+3"] {
            assert!(good.parse::<Quantity>().is_ok(), "{good}");
        }
        for bad in ["", "Mi", "1.2.3", "abc", "1mi", "10 Mi", "1e", "--1"] {
            assert!(bad.parse::<Quantity>().is_err(), "{bad}");
        }
    }

    #[test]
    fn quantities_are_canonical() {
        for (input, want) in [
            ("3.14", "3140m"),
            ("1000m", "1"),
            ("100m", "100m"),
            ("2000", "2k"),
            ("2048Mi", "2Gi"),
            ("128Mi", "128Mi"),
            ("0.5", "500m"),
            ("1", "1"),
            ("70Mi", "70Mi"),
            ("2e3", "2e3"),
        ] {
            assert_eq!(input.parse::<Quantity>().map(|q| q.to_string()), Ok(want.to_string()), "{input}");
        }
    }

    #[test]
    fn durations_print_like_go() {
        let cases = [
            ("1m", "1m0s"),
            ("30s", "30s"),
            ("1h30m", "1h30m0s"),
            ("0", "0s"),
            ("90s", "1m30s"),
            ("1.5s", "1.5s"),
            ("500ms", "500ms"),
            ("2h", "2h0m0s"),
            ("1m0s", "1m0s"),
        ];
        for (input, want) in cases {
            assert_eq!(input.parse::<Duration>().map(|d| d.to_string()), Ok(want.to_string()), "{input}");
        }
        for bad in ["", "1", "1x", "m", "1.2.3s"] {
            assert!(bad.parse::<Duration>().is_err(), "{bad}");
        }
    }

    #[test]
    fn cidrs() {
        assert!("172.20.0.0/16".parse::<Cidr>().is_ok());
        assert!("2001:db8::/56".parse::<Cidr>().is_ok());
        for bad in ["172.20.0.0", "172.20.0.1/16", "300.0.0.0/8", "10.0.0.0/33", ""] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
        let net: Cidr = "172.20.0.0/16".parse().unwrap();
        let sub: Cidr = "172.20.32.0/19".parse().unwrap();
        assert!(net.contains(&sub) && !sub.contains(&net) && net.overlaps(&sub));
    }

    #[test]
    fn versions() {
        let v: KubernetesVersion = "v1.34.0-alpha.1".parse().unwrap();
        assert_eq!(v.to_string(), "1.34.0-alpha.1");
        assert!(v.at_least(1, 34) && !v.at_least(1, 35));
        for bad in ["1.34", "v1.x.0", "1.34.0-", "latest", "", "1.34.0.1"] {
            assert!(bad.parse::<KubernetesVersion>().is_err(), "{bad}");
        }
    }

    #[test]
    fn dns_names() {
        for good in ["minimal.example.com", "a", "x-1.k8s.local"] {
            assert!(good.parse::<DnsName>().is_ok(), "{good}");
        }
        for bad in ["", "UPPER.com", "-a.com", "a..b", "a_b.com", &"a".repeat(64)] {
            assert!(bad.parse::<DnsName>().is_err(), "{bad}");
        }
    }
}

/// `spec.cloudProvider` (and the BootConfig's `CloudProvider`): every cloud the spec accepts, by
/// kOps' name (completion and apply branch on it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CloudProvider {
    Aws,
    Gce,
    Hetzner,
    OpenStack,
    DigitalOcean,
    Azure,
    Scaleway,
    Metal,
}

/// A cloud provider name the spec does not accept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown cloud provider {value:?}: expected one of {}", CloudProvider::names().join(", "))]
pub struct UnknownCloudProvider {
    pub value: String,
}

impl CloudProvider {
    /// Every provider, in the order messages list them.
    pub const ALL: [CloudProvider; 8] = [
        CloudProvider::Aws,
        CloudProvider::Gce,
        CloudProvider::Hetzner,
        CloudProvider::OpenStack,
        CloudProvider::DigitalOcean,
        CloudProvider::Azure,
        CloudProvider::Scaleway,
        CloudProvider::Metal,
    ];

    /// kOps' spelling (`spec.cloudProvider`).
    pub const fn as_str(self) -> &'static str {
        match self {
            CloudProvider::Aws => "aws",
            CloudProvider::Gce => "gce",
            CloudProvider::Hetzner => "hetzner",
            CloudProvider::OpenStack => "openstack",
            CloudProvider::DigitalOcean => "digitalocean",
            CloudProvider::Azure => "azure",
            CloudProvider::Scaleway => "scaleway",
            CloudProvider::Metal => "metal",
        }
    }

    /// The accepted names, for messages.
    pub fn names() -> Vec<&'static str> {
        CloudProvider::ALL.iter().map(|c| c.as_str()).collect()
    }

    /// Whether Keelson builds clusters on this cloud (`apply`, `rolling-update`, `reconcile` and
    /// `validate` all ask here): the clouds `cloud-resources` has tasks for. The others' specs
    /// still load and compile as kOps' do.
    pub const fn served(self) -> bool {
        matches!(self, CloudProvider::Aws | CloudProvider::Gce)
    }

    /// The clouds Keelson builds clusters on, for messages.
    pub fn served_names() -> Vec<&'static str> {
        CloudProvider::ALL.iter().filter(|c| c.served()).map(|c| c.as_str()).collect()
    }

    /// `None` for a name the spec does not accept.
    pub fn parse(s: &str) -> Option<CloudProvider> {
        CloudProvider::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

impl FromStr for CloudProvider {
    type Err = UnknownCloudProvider;
    fn from_str(s: &str) -> Result<CloudProvider, UnknownCloudProvider> {
        CloudProvider::parse(s).ok_or_else(|| UnknownCloudProvider { value: s.to_string() })
    }
}

impl fmt::Display for CloudProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for CloudProvider {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for CloudProvider {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod cloud_provider_tests {
    use super::*;

    #[test]
    fn every_provider_prints_and_parses_back() {
        for c in CloudProvider::ALL {
            assert_eq!(c.as_str().parse::<CloudProvider>(), Ok(c));
            assert_eq!(c.to_string(), c.as_str());
        }
        let e = "AWS".parse::<CloudProvider>().expect_err("case matters, as in kOps");
        assert_eq!(e.to_string(), "unknown cloud provider \"AWS\": expected one of aws, gce, hetzner, openstack, digitalocean, azure, scaleway, metal");
    }
}
